"""The GLM form of quadratic forms: the numbers of applying each constant factor in turn, no
N x N copy of the user's matrix where none is needed, and the user's matrix never written."""

import cvxpy as cp
import numpy as np
import pytest

from fedmodel.compiler.glm import recognise_scalar
from fedmodel.compiler.smooth import VariableLayout

N = 6
RNG = np.random.default_rng(0)
_A = RNG.normal(size=(N, N))
P = _A @ _A.T + np.eye(N)  # symmetric


def _layout():
    x = cp.Variable(N, name="x")
    return x, VariableLayout([x])


# expression -> the factors applied to 2 P, in order (the reference applies each in turn)
CASES = {
    "0.5 * quad_form": (lambda x: 0.5 * cp.quad_form(x, P), (0.5,)),
    "quad_form": (lambda x: cp.quad_form(x, P), ()),
    "-quad_form": (lambda x: -cp.quad_form(x, P), (-1.0,)),
    "3 * quad_form / 7": (lambda x: 3 * cp.quad_form(x, P) / 7, (3.0, 1.0 / 7.0)),
    "-(0.5 * -quad_form)": (lambda x: -(0.5 * (-cp.quad_form(x, P))), (-1.0, 0.5, -1.0)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_quadratic_part_is_twice_p_scaled_in_turn(name):
    x, layout = _layout()
    build, factors = CASES[name]
    before = P.copy()
    f = recognise_scalar(build(x), layout)
    expected = 2.0 * P
    for c in factors:
        expected = c * expected
    assert np.array_equal(f.Q, expected)  # bit for bit
    assert np.array_equal(P, before)  # the user's matrix is never written


def test_half_quad_form_reads_the_matrix_in_place():
    x, layout = _layout()
    form = cp.quad_form(x, P)
    f = recognise_scalar(0.5 * form + cp.sum(x), layout)
    assert np.shares_memory(f.Q, form.args[1].value)  # (cvxpy's constant) no N x N array made
    assert np.array_equal(f.q, np.ones(N))


def test_a_sum_of_quadratic_forms_adds_their_parts():
    x, layout = _layout()
    f = recognise_scalar(cp.quad_form(x, P) + 0.25 * cp.quad_form(x, P), layout)
    assert np.array_equal(f.Q, 2.0 * P + 0.25 * (2.0 * P))
    assert not np.shares_memory(f.Q, P)


def test_value_and_gradient_match_the_expression():
    x, layout = _layout()
    expr = 3 * cp.quad_form(x + 1, P) / 7 - 0.5 * cp.quad_form(x, P)
    f = recognise_scalar(expr, layout)
    z = RNG.normal(size=N)
    x.value = z
    value, grad, _ = f.evaluate(z, hessian=False)
    assert value == pytest.approx(float(expr.value), rel=1e-12)
    expected = (6.0 / 7.0) * P @ (z + 1) - P @ z
    np.testing.assert_allclose(grad, expected, rtol=1e-12, atol=1e-12)


def test_symmetric_by_construction_is_said_only_when_exact():
    x, layout = _layout()
    M = RNG.normal(size=(N, N))  # not symmetric: its symmetric part is used
    f = recognise_scalar(0.5 * cp.quad_form(x, M @ M.T + np.eye(N)) + cp.quad_form(x, P), layout)
    assert f.Q_symmetric and np.array_equal(f.Q, f.Q.T)
    B = RNG.normal(size=(N, N))  # the form of an affine image B x: A^T Ps A as products
    g = recognise_scalar(cp.quad_form(B @ x, P), layout)
    assert not g.Q_symmetric
