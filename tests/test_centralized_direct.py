"""centralized's direct route: Clarabel on data built from the package's own forms
(``fedmodel/algorithms/centralized/direct.py``), against plain cvxpy on tiny instances,
the certificate it reports, the fallback to cvxpy, and the time limit inside the solve."""

from __future__ import annotations

import time

import cvxpy as cp
import numpy as np
import pytest

import fedmodel as fm
from fedmodel.algorithms.centralized.direct import (
    NotDirect,
    build_conic_data,
    solve_direct,
)


def _rows(seed, n=30, d=4):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, d)), rng.normal(size=n)


def _hinge():
    """Hinge loss over two clients + a server ridge: an epigraph QP."""
    m = fm.Model()
    w = m.variable(4, name="w")
    parts = []
    for k in range(2):
        X, y = _rows(k)
        y = np.sign(y)
        c = m.client(f"c{k}")
        c.minimize(cp.sum(cp.pos(1 - cp.multiply(c.data(y), c.data(X) @ w))) / 60)
        parts.append((X, y))
    m.server.minimize(0.1 * cp.sum_squares(w))
    wp = cp.Variable(4)
    f = sum(cp.sum(cp.pos(1 - cp.multiply(y, X @ wp))) / 60 for X, y in parts)
    return m, cp.Problem(cp.Minimize(f + 0.1 * cp.sum_squares(wp))), wp


def _sqrt_lasso_in_ball():
    """A 2-norm objective (a cone term), an l1 h and a norm ball on the server (a
    quadratic constraint after the DSL's rewrite)."""
    m = fm.Model()
    w = m.variable(4, name="w")
    X, y = _rows(3)
    c = m.client("c")
    c.minimize(cp.norm(c.data(X) @ w - c.data(y), 2))
    m.server.subject_to(cp.norm(w, 2) <= 0.3)
    m.regularize(0.05 * cp.norm1(w))
    wp = cp.Variable(4)
    prob = cp.Problem(
        cp.Minimize(cp.norm(X @ wp - y, 2) + 0.05 * cp.norm1(wp)), [cp.norm(wp, 2) <= 0.3]
    )
    return m, prob, wp


def _logistic_l1():
    """Logistic loss (exponential cones) + l1 in h + bounds in h."""
    m = fm.Model()
    w = m.variable(4, name="w")
    parts = []
    for k in range(2):
        X, y = _rows(10 + k)
        y = np.sign(y)
        c = m.client(f"c{k}")
        c.minimize(cp.sum(cp.logistic(-cp.multiply(c.data(y), c.data(X) @ w))) / 60)
        parts.append((X, y))
    m.regularize(0.02 * cp.norm1(w))
    m.server.subject_to(w <= 0.2)
    wp = cp.Variable(4)
    f = sum(cp.sum(cp.logistic(-cp.multiply(y, X @ wp))) / 60 for X, y in parts)
    return m, cp.Problem(cp.Minimize(f + 0.02 * cp.norm1(wp)), [wp <= 0.2]), wp


def _entropy():
    """Maximum entropy on the simplex with moment constraints (entr, kl_div)."""
    m = fm.Model()
    w = m.variable(5, name="w")
    rng = np.random.default_rng(4)
    prior = rng.uniform(0.1, 1.0, 5)
    prior /= prior.sum()
    a = rng.uniform(size=5)
    m.server.minimize(-cp.sum(cp.entr(w)))
    m.server.subject_to(cp.sum(w) == 1)
    c = m.client("c")
    c.minimize(cp.sum(cp.kl_div(w, c.data(prior))))
    c.subject_to(c.data(a) @ w <= 0.4)
    wp = cp.Variable(5)
    prob = cp.Problem(
        cp.Minimize(-cp.sum(cp.entr(wp)) + cp.sum(cp.kl_div(wp, prior))),
        [cp.sum(wp) == 1, a @ wp <= 0.4],
    )
    return m, prob, wp


def _log_sum_exp():
    m = fm.Model()
    w = m.variable(3, name="w")
    X, y = _rows(5, n=8, d=3)
    c = m.client("c")
    c.minimize(cp.log_sum_exp(c.data(X) @ w - c.data(y)))
    m.server.minimize(0.1 * cp.sum_squares(w))
    wp = cp.Variable(3)
    return m, cp.Problem(cp.Minimize(cp.log_sum_exp(X @ wp - y) + 0.1 * cp.sum_squares(wp))), wp


CASES = {
    "hinge": _hinge,
    "sqrt-lasso-ball": _sqrt_lasso_in_ball,
    "logistic-l1": _logistic_l1,
    "entropy": _entropy,
    "log-sum-exp": _log_sum_exp,
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_direct_route_agrees_with_plain_cvxpy_and_is_certified(name):
    model, prob, wp = CASES[name]()
    prob.solve(solver="CLARABEL", tol_gap_abs=1e-10, tol_gap_rel=1e-10, tol_feas=1e-10)
    res = model.solve(method="centralized")
    assert res.extra.get("direct") is True, res.message
    assert res.status == "optimal", res.message
    assert abs(res.objective - prob.value) <= 1e-7 * max(1.0, abs(prob.value))
    np.testing.assert_allclose(res.solution["w"], wp.value, atol=1e-5)
    # the certificate is the user's model's: at most eps, recomputed on the returned point
    assert res.kkt.satisfied(1e-6, 1e-6)


@pytest.mark.parametrize("name", ["hinge", "entropy"])
def test_the_certificate_is_the_same_on_either_route(name):
    """The direct route and cvxpy's compile give the same point to solver accuracy; the
    certificate evaluated at each is the user's model's and tells the same."""
    model, _, _ = CASES[name]()
    direct = model.solve(method="centralized")
    model, _, _ = CASES[name]()
    compiled = model.solve(method="centralized", direct=False)
    assert direct.extra.get("direct") is True and "direct" not in compiled.extra
    assert direct.status == compiled.status == "optimal"
    assert abs(direct.objective - compiled.objective) <= 1e-9 * max(1.0, abs(direct.objective))
    for res in (direct, compiled):
        assert res.kkt.scaled_stationarity <= 1e-6 and res.kkt.scaled_feasibility <= 1e-6
    np.testing.assert_allclose(direct.solution["w"], compiled.solution["w"], atol=1e-6)


@pytest.mark.parametrize(
    "linear, w_star, mu_star",
    [
        # ||w||^2 <= 1 (the DSL's form of norm(w) <= 1: the plain cone (1, w)):
        # w = (1/sqrt 2)(1, 1), grad f + mu 2 w = 0: mu = 1/sqrt 2
        (False, [2**-0.5, 2**-0.5], 2**-0.5),
        # ||w||^2 + w_1 <= 1 (a linear part: the rotated cone), set in the test
        (True, None, None),
    ],
)
def test_a_quadratic_constraint_gets_its_multiplier_from_its_cone(linear, w_star, mu_star):
    m = fm.Model()
    w = m.variable(2, name="w")
    c = m.client("c")
    if linear:
        # min -w_0 s.t. w_0^2 + w_1^2 + w_1 <= 1: w_1 = -1/2, w_0 = sqrt(5)/2, mu = 1/sqrt(5)
        c.minimize(-w[0])
        c.subject_to(cp.sum_squares(w) + w[1] <= 1)
        w_star, mu_star = [5**0.5 / 2, -0.5], 5**-0.5
    else:
        c.minimize(-cp.sum(w))
        c.subject_to(cp.sum_squares(w) <= 1)
    res = m.solve(method="centralized")
    assert res.extra.get("direct") is True and res.status == "optimal"
    np.testing.assert_allclose(res.solution["w"], w_star, atol=1e-5)
    (mu,) = [np.ravel(v) for v in res.multipliers["c"].values()]
    np.testing.assert_allclose(mu, [mu_star], rtol=1e-5)


def test_pieces_without_a_direct_form_go_through_cvxpy():
    """huber has no direct form here: the model is compiled by cvxpy (or the smooth path)
    and still certified."""
    m = fm.Model()
    w = m.variable(3, name="w")
    X, y = _rows(7, d=3)
    c = m.client("c")
    c.minimize(cp.sum(cp.huber(c.data(X) @ w - c.data(y), 1.0)) + cp.norm1(w))
    with pytest.raises(NotDirect):
        build_conic_data(m.compile())
    res = m.solve(method="centralized")
    assert res.status == "optimal" and "direct" not in res.extra


def test_a_parameter_keeps_the_model_on_cvxpy():
    m = fm.Model()
    w = m.variable(2, name="w")
    p = cp.Parameter(2, value=np.ones(2))
    m.client("c").minimize(cp.sum(cp.abs(w - p)))
    with pytest.raises(NotDirect):
        build_conic_data(m.compile())
    res = m.solve(method="centralized")
    assert res.status == "optimal" and "direct" not in res.extra
    np.testing.assert_allclose(res.solution["w"], np.ones(2), atol=1e-7)


def _large_logistic_l1(n_rows=3000, d=300):
    rng = np.random.default_rng(0)
    m = fm.Model()
    w = m.variable(d, name="w")
    for k in range(3):
        X = rng.normal(size=(n_rows // 3, d))
        y = np.sign(X[:, 0] + rng.normal(size=n_rows // 3))
        c = m.client(f"c{k}")
        c.minimize(cp.sum(cp.logistic(-cp.multiply(c.data(y), c.data(X) @ w))) / n_rows)
    m.regularize(1e-3 * cp.norm1(w))
    return m


@pytest.mark.timing
def test_a_tiny_time_limit_ends_the_direct_solve_with_status_time_limit():
    """Logistic + l1 at d = 300 (exponential cones, seconds for Clarabel): a limit of
    0.2 s ends the direct route with status time_limit, whether Clarabel was stopped
    between its iterations or (on a busy machine) building the data took the whole limit,
    and then the message says that the limit is below what the solve can hold."""
    model = _large_logistic_l1()
    res = model.solve(method="centralized", time_limit=0.2)
    assert res.status == "time_limit", res.message
    assert res.extra.get("direct") is True
    if "time_limit_floor" in res.extra:
        assert res.extra["time_limit_floor"] > 0.2 - 1e-9
        assert "below the smallest this solve holds" in res.message


def test_the_termination_callback_stops_clarabel_at_a_passed_deadline():
    data = build_conic_data(_large_logistic_l1(600, 40).compile())
    sol = solve_direct(data, {}, deadline=time.perf_counter() - 1.0)
    assert sol.status == "user_limit" and sol.deadline_stop
    full = solve_direct(data, {})
    assert full.status == "optimal" and not full.deadline_stop


def test_the_fast_affine_map_matches_the_compiler_s():
    """The direct route's block map of affine expressions (dense data blocks, variables as
    triplets) gives the same ``(A, b)`` as :func:`fedmodel.compiler.glm.affine_map`."""
    import scipy.sparse as sp

    from fedmodel.algorithms.centralized.direct import _fast_affine
    from fedmodel.compiler.glm import affine_map
    from fedmodel.compiler.layout import VariableLayout

    x, y = cp.Variable((3, 4)), cp.Variable(5)
    layout = VariableLayout([y, x])
    C = np.random.default_rng(0).normal(size=(2, 5))
    exprs = [
        x[1, :],
        cp.hstack([y[1:4], C @ y - 1]),
        cp.multiply(np.arange(4.0), x[0]) + 2 * x[2, :],
        cp.sum(x) + y[0],
        (C @ y)[0:2] - 0.25 * y[:2],
        cp.reshape(x, (12,), order="F")[3:7],
        1 - cp.multiply(np.array([1.0, -1.0]), C @ y + 3) - y[2],
    ]
    for e in exprs:
        d = _fast_affine(e, layout)
        r, c, v = d.triplets()
        G = sp.coo_array((v, (r, c)), shape=(d.m, layout.size)).toarray()
        ref = affine_map(e, layout)
        A = ref.A.toarray() if sp.issparse(ref.A) else np.asarray(ref.A)
        np.testing.assert_allclose(G, A, atol=1e-14)
        np.testing.assert_allclose(d.b, ref.b, atol=1e-14)


def test_an_unknown_clarabel_setting_is_the_caller_s_error_on_either_route():
    for direct in (True, False):
        model, _, _ = _hinge()
        with pytest.raises(TypeError, match="no_such_setting"):
            model.solve(method="centralized", direct=direct, solver_options={"no_such_setting": 1})


def test_the_fast_affine_map_stacks_rows_like_cvxpy():
    """``vstack`` (the cone form of a p-norm or geo_mean): checked against cvxpy's own
    value of the expression at a random point."""
    import scipy.sparse as sp

    from fedmodel.algorithms.centralized.direct import _fast_affine
    from fedmodel.compiler.layout import VariableLayout

    x, y = cp.Variable((2, 3)), cp.Variable(3)
    layout = VariableLayout([x, y])
    rng = np.random.default_rng(1)
    x.value, y.value = rng.normal(size=(2, 3)), rng.normal(size=3)
    point = np.concatenate([x.value.ravel(order="F"), y.value])
    for e in [cp.vstack([y, 2 * y + 1]), cp.vstack([x, cp.reshape(y, (1, 3), order="F")])]:
        d = _fast_affine(e, layout)
        r, c, v = d.triplets()
        G = sp.coo_array((v, (r, c)), shape=(d.m, layout.size))
        np.testing.assert_allclose(G @ point + d.b, np.ravel(e.value, order="F"), atol=1e-12)
