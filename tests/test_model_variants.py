"""Model shapes the DSL must handle, each checked against the centralized optimum."""

import json

import cvxpy as cp
import numpy as np
import pytest

import fedmodel as fm


def _check(model, eps=1e-5, tol=1e-4, **kw):
    ref = model.solve(method="centralized")
    assert ref.status == "optimal", ref.message
    res = model.solve(method="prox-al", eps=eps, **kw)
    assert res.status == "optimal", res.message
    cmp = res.compare(ref)
    assert cmp.relative_objective_difference <= tol
    assert res.kkt.stationarity <= eps and res.kkt.feasibility <= eps
    return res, ref


def test_several_variables_ge_and_eq_constraints_l1():
    rng = np.random.default_rng(0)
    model = fm.Model("multi")
    w = model.variable(4, name="w")
    b = model.variable((), name="b")
    M = model.variable((2, 2), name="M")
    for k in range(3):
        site = model.client(f"s{k}")
        X = site.data(rng.normal(size=(25, 4)), name="X")
        y = site.data(rng.normal(size=25), name="y")
        site.minimize(cp.sum_squares(X @ w + b - y) / 75 + cp.sum_squares(M - k) / 3)
        if k == 0:
            site.subject_to(cp.sum(w) >= 0.5, name="sum w >= 0.5")  # a '>=' constraint
        if k == 1:
            site.subject_to(M[0, 1] == M[1, 0] + 0.25, name="M coupling")  # equality
    model.server.subject_to(b <= -0.1, name="intercept cap")
    model.regularize(0.02 * cp.norm1(w))
    res, ref = _check(model)
    assert set(res.solution) == {"w", "b", "M"}
    assert res.solution["M"].shape == (2, 2) and np.shape(res.solution["b"]) == ()
    np.testing.assert_allclose(M.value, res.solution["M"])  # written back, cvxpy style
    assert set(res.multipliers["s0"]) == {"sum w >= 0.5"}
    assert set(res.multipliers["server"]) == {"intercept cap"}
    assert res.multipliers["server"]["intercept cap"] > 0  # active: b would rather be ~0


def test_clients_without_constraints_and_server_without_constraints():
    rng = np.random.default_rng(1)
    model = fm.Model("plain")
    w = model.variable(3, name="w")
    for k in range(3):
        site = model.client(f"s{k}")
        A = site.data(rng.normal(size=(20, 3)), name="A")
        site.minimize(cp.sum(cp.logistic(A @ w)) / 60 + 0.01 * cp.sum_squares(w))
        if k == 2:
            site.subject_to(w[0] <= -0.2)
    res, ref = _check(model)
    assert res.multipliers["s0"] == {} and res.multipliers["server"] == {}


@pytest.mark.parametrize("reg", ["sumsq", "norm2", "box"])
def test_regularizers(reg):
    rng = np.random.default_rng(2)
    model = fm.Model("reg")
    w = model.variable(4, name="w")
    for k in range(2):
        site = model.client(f"s{k}")
        A = site.data(rng.normal(size=(20, 4)), name="A")
        y = site.data(rng.normal(size=20) + 2, name="y")
        site.minimize(cp.sum_squares(A @ w - y) / 40)
    if reg == "sumsq":
        model.regularize(0.5 * cp.sum_squares(w))
    elif reg == "norm2":
        model.regularize(0.3 * cp.norm(w, 2))
    else:
        model.regularize([w >= -0.1, w <= 0.3])
    res, ref = _check(model)
    if reg == "box":
        assert res.solution["w"].min() >= -0.1 - 1e-12 and res.solution["w"].max() <= 0.3 + 1e-12


@pytest.mark.parametrize("inner", ["auto", "quasi-newton"])
def test_infeasible_model_ends_with_a_status_and_growing_multipliers(inner):
    """At "auto" (exact-admm for the inequality walls) the consensus gap settles at a
    nonzero constant and the run ends "diverging", likely infeasible; with the augmented-
    Lagrangian multipliers of quasi-Newton the multiplier changes stay large; either way the
    parties' Farkas certificate ends the run "infeasible"."""
    model = fm.Model("infeasible")
    w = model.variable(2, name="w")
    a, b = model.client("a"), model.client("b")
    a.minimize(cp.sum_squares(w))
    a.subject_to(w[0] >= 1, name="w0 >= 1")
    b.minimize(cp.sum_squares(w))
    b.subject_to(w[0] <= -1, name="w0 <= -1")
    ref = model.solve(method="centralized")
    assert ref.status == "infeasible"
    res = model.solve(method="prox-al", max_outer=30, time_limit=60, inner_solver=inner)
    assert res.status == "infeasible" and "Farkas" in res.message, res.message
    assert res.max_violation > 0.5
    assert res.extra["inner_solver"] == ("exact-admm" if inner == "auto" else inner)
    if inner == "quasi-newton":
        mus = [row["dmu_inf"] for row in res.history]
        assert mus[-1] > 0.5


def test_unbounded_model_ends_with_a_status():
    model = fm.Model("unbounded")
    w = model.variable(2, name="w")
    model.client("a").minimize(-cp.sum(w))
    ref = model.solve(method="centralized")
    assert ref.status == "unbounded"
    res = model.solve(method="prox-al", max_outer=30)
    assert res.status in ("unbounded", "max_iterations") and "unbounded" in res.message
    res = model.solve(method="prox-al", max_outer=100, divergence_limit=50)
    assert res.status == "unbounded" and "unbounded" in res.message


def test_result_record_is_json_and_complete():
    rng = np.random.default_rng(3)
    model = fm.Model("json")
    w = model.variable(2, name="w")
    site = model.client("s")
    site.minimize(cp.sum_squares(site.data(rng.normal(size=(5, 2)), name="A") @ w - 1))
    site.subject_to(cp.sum(w) <= 0.1)
    res = model.solve(method="prox-al", eps=1e-4)
    rec = json.loads(res.to_json())
    for key in (
        "status",
        "objective",
        "max_violation",
        "multipliers",
        "kkt",
        "rounds",
        "communication",
        "timing",
        "history",
    ):
        assert key in rec
    assert rec["history"][0]["constraints"]["s"]["ineq"]
    assert res.timing["solve"] > 0 and res.timing["compile"] >= 0
    # (an outer iteration may need no inner round: its start already meets tau_k)
    assert res.rounds["communication"] >= res.rounds["inner"] + res.rounds["outer"]
    assert res.rounds["outer"] >= 1
    text = str(res.compare(model.solve(method="centralized")))
    assert "relative objective difference" in text
    model.summary(print_=False)


@pytest.mark.parametrize("solver", ["newton", "lbfgs", "cvxpy"])
def test_every_subproblem_backend_reaches_the_same_answer(solver):
    rng = np.random.default_rng(4)
    model = fm.Model("backends")
    w = model.variable(3, name="w")
    b = model.variable((), name="b")
    for k in range(2):
        site = model.client(f"s{k}")
        X = site.data(rng.normal(size=(15, 3)), name="X")
        y = site.data(rng.integers(0, 2, size=15).astype(float), name="y")
        z = X @ w + b
        site.minimize((cp.sum(cp.logistic(z)) - y @ z) / 30 + 0.1 * cp.sum_squares(w))
        site.subject_to(cp.sum(w) >= 0.3)
    ref = model.solve(method="centralized")
    res = model.solve(method="prox-al", eps=1e-6, solver=solver)
    assert res.status == "optimal"
    assert res.compare(ref).relative_objective_difference <= 1e-5
