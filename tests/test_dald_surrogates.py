"""The surrogate reductions of seed 004 Section V-B as dald solver layers:
``local_solver="gd"`` (GD (38)), ``"newton"`` (Newton (40)) and ``"sgd"`` (MBGD/SGD (49))."""

from __future__ import annotations

import cvxpy as cp
import numpy as np
import pytest

import fedmodel as fm
from fedmodel.errors import UnsupportedError

# no residual test may end a run early: every run below is exactly max_iter iterations
FIXED = dict(update_multipliers=False, eps_dual=1e-300, eps_pri=1e-300, max_iter=7, eps=1e3)


def one_client(rows=40, d=4, seed=0, l1=0.0, logistic=False):
    rng = np.random.default_rng(seed)
    A = rng.normal(size=(rows, d))
    b = A @ rng.normal(size=d) + 0.1 * rng.normal(size=rows)
    m = fm.Model("one")
    w = m.variable(d, name="w")
    c = m.client("c0")
    if logistic:
        y = np.sign(b + 2.0 * rng.normal(size=rows))  # noisy labels: not separable
        M = c.data(A * y[:, None], name="M")
        c.minimize(cp.sum(cp.logistic(-(M @ w))) / rows)
    else:
        c.minimize(cp.sum_squares(c.data(A, name="A") @ w - c.data(b, name="b")) / rows)
    if l1:
        m.regularize(l1 * cp.norm1(w))
    return m, A, b


def test_gd_layer_with_one_client_and_no_multipliers_is_gradient_descent():
    """n = 1, mu = 0, one step from the warm start x^{k-1} = x_hat^{k-1}: eq. (38)."""
    m, A, b = one_client()
    alpha = 0.05
    res = m.solve("dald-cc", local_solver="gd", local_steps=1, step=alpha, **FIXED)
    x = np.zeros(A.shape[1])
    for _ in range(FIXED["max_iter"]):
        x = x - alpha * 2 * A.T @ (A @ x - b) / A.shape[0]
    assert np.allclose(res.x, x, rtol=0, atol=1e-12)


def test_newton_layer_is_newtons_method_at_a_small_penalty():
    """With rho -> 0 the block subproblem is f itself and one damped Newton step from
    x_hat is (40): on a quadratic it lands on the minimiser in one iteration."""
    m, A, b = one_client()
    res = m.solve("dald-cc", local_solver="newton", rho=1e-6, **{**FIXED, "max_iter": 1})
    x_star = np.linalg.lstsq(A, b, rcond=None)[0]
    assert np.allclose(res.x, x_star, atol=1e-8)
    # and on a logistic loss a few steps reach the centralized optimum
    m, _, _ = one_client(logistic=True, rows=60)
    ref = m.solve("centralized")
    res = m.solve("dald-cc", local_solver="newton", rho=1e-3, **{**FIXED, "max_iter": 12})
    assert abs(res.objective - ref.objective) <= 1e-8 * max(1.0, abs(ref.objective))


def test_newton_layer_matches_the_hand_written_proximal_newton_step():
    m, A, b = one_client()
    rho = 0.7
    res = m.solve("dald-cc", local_solver="newton", rho=rho, **{**FIXED, "max_iter": 3})
    x = np.zeros(A.shape[1])
    H = 2 * A.T @ A / A.shape[0] + 2 * rho**2 * np.eye(A.shape[1])
    for _ in range(3):  # phi = f + rho^2 ||x - x_hat||^2 at x = x_hat: gradient = grad f
        x = x - np.linalg.solve(H, 2 * A.T @ (A @ x - b) / A.shape[0])
    assert np.allclose(res.x, x, atol=1e-10)


def test_sgd_layer_with_the_full_batch_is_the_gd_layer_and_is_repeatable():
    m, A, b = one_client()
    common = dict(local_steps=2, step=0.05, **FIXED)
    gd = m.solve("dald-cc", local_solver="gd", **common)
    full = m.solve("dald-cc", local_solver="sgd", batch_size=A.shape[0], **common)
    assert np.allclose(full.x, gd.x, atol=1e-12)
    one = m.solve("dald-cc", local_solver="sgd", batch_size=1, random_state=3, **common)
    again = m.solve("dald-cc", local_solver="sgd", batch_size=1, random_state=3, **common)
    other = m.solve("dald-cc", local_solver="sgd", batch_size=1, random_state=4, **common)
    assert np.array_equal(one.x, again.x) and not np.allclose(one.x, other.x)


def test_sgd_gradient_is_unbiased():
    """The mean of many mini-batch steps from one point is the full-gradient step."""
    from fedmodel.algorithms.local import LocalProblem

    m, A, b = one_client(rows=12)
    program = m.compile().parties[1]
    assert program.name == "c0"
    reg = m.compile().regularizer
    x0 = np.ones(A.shape[1])
    steps = []
    for seed in range(400):
        lp = LocalProblem(
            program, reg, None, local_solver="sgd", step=0.01, batch_size=3, random_state=seed
        )
        lp.set_quadratic(1.0, np.zeros(A.shape[1]))
        steps.append(lp.solve(x0))
    full = x0 - 0.01 * (2 * A.T @ (A @ x0 - b) / A.shape[0] + x0)
    spread = np.std(steps, axis=0).max() / np.sqrt(len(steps))
    assert np.abs(np.mean(steps, axis=0) - full).max() < 5 * spread


@pytest.mark.parametrize("kind", ["gd", "newton", "sgd"])
def test_the_reductions_need_a_smooth_subproblem(kind):
    m, _, _ = one_client(l1=0.1)
    with pytest.raises(UnsupportedError, match=kind):
        m.solve("dald-cc", local_solver=kind)


def test_dald_cc_with_the_newton_layer_reaches_the_centralized_optimum():
    rng = np.random.default_rng(2)
    m = fm.Model("ls3")
    w = m.variable(3, name="w")
    for i in range(3):
        A = rng.normal(size=(20, 3)) + i
        b = rng.normal(size=20) + i
        c = m.client(f"c{i}")
        c.minimize(cp.sum_squares(c.data(A, name="A") @ w - c.data(b, name="b")) / 60)
    ref = m.solve("centralized")
    res = m.solve("dald-cc", local_solver="newton", rho=0.5, max_iter=2000)
    assert res.status == "optimal"
    assert abs(res.objective - ref.objective) <= 1e-6 * abs(ref.objective)
