"""Unit checks of seed 000's building blocks: the split identity (9)-(11), Algorithm 2's
output guarantee (Theorem 4.1), multiplier updates and messages."""

import cvxpy as cp
import numpy as np
import pytest
from problems import lcqp_test_model, np_model

import fedmodel as fm
from fedmodel.subproblems.merit import MeritProblem


@pytest.mark.parametrize("builder", [lambda: np_model(3), lambda: lcqp_test_model(3, d=20, m=1)])
def test_split_identity(builder):
    """sum_i P_{i,k}(w) + h(w) = l_k(w) at random points and multipliers."""
    model = builder()
    model.regularize(0.01 * cp.norm1(model.variables[0]))
    compiled = model.compile()
    rng = np.random.default_rng(0)
    beta = 7.0
    n = compiled.n_clients
    N = compiled.layout.size
    for _ in range(5):
        w, wk = rng.normal(size=N), rng.normal(size=N)
        mus = [np.abs(rng.normal(size=p.m_ineq)) for p in compiled.parties]
        nus = [rng.normal(size=p.m_eq) for p in compiled.parties]
        pooled = MeritProblem(compiled.parties, beta, compiled.regularizer)
        pooled.set(sigma=1 / beta, center=wk, mu=mus, nu=nus)
        lk = pooled.value(w)
        total = compiled.regularizer.value(w)
        for p, mu, nu in zip(compiled.parties, mus, nus):
            piece = MeritProblem([p], beta)
            piece.set(sigma=1 / ((n + 1) * beta), center=wk, mu=[mu], nu=[nu])
            total += piece.value(w)
        assert abs(total - lk) <= 1e-10 * max(1.0, abs(lk))


def _strongly_convex_model(n=4, seed=0, l1=0.0):
    rng = np.random.default_rng(seed)
    model = fm.Model("ridge")
    w = model.variable(6, name="w")
    for k in range(n):
        site = model.client(f"c{k}")
        A = site.data(rng.normal(size=(30, 6)), name="A")
        b = site.data(rng.normal(size=30), name="b")
        site.minimize(cp.sum_squares(A @ w - b) / 60 + 0.05 * cp.sum_squares(w))
    if l1:
        model.regularize(l1 * cp.norm1(w))
    return model


@pytest.mark.parametrize("l1", [0.0, 0.05])
@pytest.mark.parametrize("tau", [1e-3, 1e-6])
def test_admm_output_satisfies_theorem_4_1(tau, l1):
    """Algorithm 2 stops with dist_inf(0, dF_h(w)) <= tau (recomputed, not reused)."""
    model = _strongly_convex_model(l1=l1)
    res = model.solve(method="admm", eps=tau)
    assert res.status == "optimal"
    assert res.kkt.stationarity <= tau
    ref = model.solve(method="centralized", eps=1e-8)
    assert res.compare(ref).solution_distance <= 10 * tau


def test_inner_bound_is_a_valid_certificate_every_outer_iteration():
    """At each outer iteration the recomputed dist(0, d l_k(w^{k+1})) <= eps_{t+1} + sum eps~."""
    model = np_model(3, seed=2)
    compiled = model.compile()
    opts = fm.algorithms.proxal.options.ProxALOptions(eps=1e-4)
    res = model.solve(method="prox-al", eps=1e-4)
    for row in res.history:
        assert row["inner_bound"] <= row["tau"] or row["inner_iterations"] == opts.max_inner
    assert compiled.n_clients == 3


@pytest.mark.parametrize("variant", ["paper", "adaptive"])
def test_messages_are_what_the_paper_says(variant):
    model = np_model(3, seed=3)
    # (Algorithm 2's messages: the adaptive variant with inner_solver="admm" and the opt-in
    # Hessian metric; the (quasi-)Newton inner solvers' messages are checked in
    # test_proxal_newton.py)
    extra_opts = {"inner_solver": "admm", "penalty_metric": "hessian"}
    extra_opts = extra_opts if variant == "adaptive" else {}
    res = model.solve(method="prox-al", eps=1e-3, variant=variant, **extra_opts)
    d = res.x.size
    algo = [r for r in res.ledger if r["channel"] == "algorithm"]
    kinds = {r["kind"] for r in algo}
    paper_kinds = {"start", "start_reply", "admm_w", "admm_w_reply", "outer", "outer_reply"}
    # the adaptive variant adds the outer Anderson round, and small vectors: the client's
    # rho (residual balancing), Anderson weights (down) and Gram rows (up), <= 6 numbers
    assert kinds == paper_kinds if variant == "paper" else paper_kinds <= kinds
    extra = 0 if variant == "paper" else 8
    metric_floats = 0
    for r in algo:
        shapes = dict(r["shapes"])
        if "metric" in shapes:  # the Hessian metric M_i, when it changed
            assert variant == "adaptive"
            assert r["kind"] in ("start_reply", "outer_reply", "outer_aa_reply", "admm_w_reply")
            assert tuple(shapes.pop("metric")) == (d, d)
            metric_floats = d * d
        if variant == "adaptive":
            for key in ("alpha", "gram", "rho", "reset"):
                if key in shapes:
                    assert len(shapes.pop(key)) <= 1
                    assert r["floats"] <= d + extra + (d * d if "metric" in r["shapes"] else 0)
        if r["kind"] in ("start", "outer", "outer_aa"):
            assert shapes == {"w": (d,)}
        elif r["kind"] == "admm_w":
            assert shapes == {"w": (d,), "tol": ()}
        elif r["kind"] == "admm_w_reply":
            assert shapes == {"u_tilde": (d,), "eps_tilde": ()}
        elif r["kind"] == "outer_reply":
            assert shapes == {"dmu_inf": (), "u_tilde": (d,)}
    # no message carries anything with a client's sample dimension
    assert max(r["floats"] for r in algo) <= d + 1 + extra + metric_floats
    assert (metric_floats > 0) == (variant == "adaptive")
    comm = res.communication
    assert comm["messages_up"] == comm["messages_down"]
    assert set(comm["per_party"]) == {"server", "site0", "site1", "site2"}


def test_rho_per_client_and_options_validation():
    model = np_model(2, seed=1)
    res = model.solve(method="prox-al", eps=1e-3, rho={"site0": 0.5, "site1": 2.0})
    assert res.status == "optimal"
    with pytest.raises(fm.ModelError, match="missing"):
        model.solve(method="prox-al", rho={"site0": 1.0})
    with pytest.raises(fm.ModelError, match="q must lie"):
        model.solve(method="prox-al", q=1.5)
    with pytest.raises(fm.ModelError, match="beta must be a positive"):
        model.solve(method="prox-al", beta=-1)
    with pytest.raises(fm.ModelError, match="unknown option"):
        model.solve(method="prox-al", betta=3)
    with pytest.raises(fm.ModelError, match="unknown method"):
        model.solve(method="sgd")
