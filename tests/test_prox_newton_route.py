"""prox-al's ``inner_solver="prox-newton"``: the Newton route's opt-in Hessians with a
non-smooth ``h`` through its prox in the server's model step, the model damped after a
shortened step (prox_newton.py: ``ProxNewtonInner``, ``next_damping``)."""

from __future__ import annotations

import numpy as np
import pytest
from test_penalty_raise import _cvxqp3_s

import fedmodel as fm
from fedmodel.algorithms.proxal.messages import HESSIAN, HESSIAN_ROUTES
from fedmodel.algorithms.proxal.prox_newton import federated_prox_newton
from fedmodel.algorithms.proxal.routes import ROUTES
from fedmodel.compiler.regularizer import Regularizer, VariablePiece
from fedmodel.errors import ModelError


@pytest.fixture(scope="module")
def cvxqp3_s():
    return _cvxqp3_s(1.0)


def test_prox_newton_solves_a_qp_split_as_its_rows_in_fewer_rounds(cvxqp3_s):
    # Maros-Meszaros CVXQP3_S: the rows over four clients, bounds and objective at the
    # server; every client opts in to reveal its Hessian
    model, f_star, A, b = cvxqp3_s
    res = model.solve(method="prox-al", inner_solver="prox-newton", reveal=["hessian"])
    assert res.status == "optimal", res.message
    assert res.extra["inner_solver"] == "prox-newton"
    assert abs(res.objective - f_star) <= 1e-3 * max(1.0, abs(f_star))
    assert np.abs(A @ np.asarray(res.x) - b).max() <= 1e-3 * max(1.0, np.abs(b).max())
    default = model.solve(method="prox-al")
    assert default.extra["inner_solver"] == "prox-quasi-newton"
    # exact Hessians: each active set's model is exact (15 rounds against 43)
    assert res.rounds["communication"] < default.rounds["communication"] / 2


def test_a_client_that_did_not_opt_in_refuses_to_be_built_on_it(cvxqp3_s):
    model = cvxqp3_s[0]
    with pytest.raises(fm.RequestRefused, match="'client1' refuses its build"):
        model.solve(method="prox-al", inner_solver="prox-newton", reveal={"client0": ["hessian"]})


def test_every_route_that_sends_hessians_is_the_partys_opt_in():
    sends = {
        route.name
        for route in ROUTES
        if any(spec.party_opt_in == HESSIAN for spec in route.messages)
    }
    assert sends == set(HESSIAN_ROUTES)


def test_prox_newton_needs_a_non_smooth_h():
    import cvxpy as cp

    model = fm.Model("smooth")
    w = model.variable(2, name="w")
    site = model.client("site")
    site.minimize(cp.sum_squares(w - site.data(np.ones(2), name="b")))
    with pytest.raises(ModelError, match="inner_solver='newton' takes it"):
        model.solve(method="prox-al", inner_solver="prox-newton", reveal=["hessian"])


def test_the_damping_carries_newton_across_the_pieces_of_a_penalty():
    # S = c'w + (beta/2) ||max(0, A w - b)||^2 + (p/2) ||w||^2 with a box h: a generalised
    # Hessian sees only the rows active at w, so the undamped model step overshoots into
    # other pieces and the line search halves it round after round
    rng = np.random.default_rng(0)
    n, m, beta, p = 20, 40, 100.0, 1e-2
    A, b, c = rng.standard_normal((m, n)), rng.random(m), rng.standard_normal(n)

    def evaluate(w):
        r = np.maximum(A @ w - b, 0.0)
        active = r > 0
        value = c @ w + 0.5 * beta * r @ r + 0.5 * p * w @ w
        hessian = beta * A[active].T @ A[active] + p * np.eye(n)
        return value, c + beta * A.T @ r + p * w, hessian

    reg = Regularizer.from_pieces(
        [slice(0, n)], [VariablePiece(lower=-1e3, upper=1e3, has_box=True)]
    )
    w0 = np.zeros(n)
    damped = federated_prox_newton(evaluate, (w0, *evaluate(w0)), reg, 1e-8, 200, damping=True)
    plain = federated_prox_newton(evaluate, (w0, *evaluate(w0)), reg, 1e-8, 200)
    assert damped.satisfied and damped.residual <= 1e-8  # (110 rounds)
    assert not plain.satisfied  # (0.16 after 200 rounds)
