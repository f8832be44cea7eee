"""Seed 002's family (fair-vfl, fedbcd): gradients, the round against centralized GDA, the
unconstrained limit, KKT at convergence, the ledger, fairness against FedBCD, errors."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from fedmodel.algorithms.vfl.client import VFLParty
from fedmodel.algorithms.vfl.data import vertical_dataset
from fedmodel.algorithms.vfl.options import FairVFLOptions
from fedmodel.algorithms.vfl.problem import VerticalProblem
from fedmodel.algorithms.vfl.reference import (
    PooledVerticalModel,
    solve_constrained,
    solve_unconstrained,
)
from fedmodel.algorithms.vfl.run import solve_vertical
from fedmodel.errors import ModelError


def small_problem(n=240, sizes=(3, 4, 3), seed=0, test=False) -> VerticalProblem:
    rng = np.random.default_rng(seed)
    m = sum(sizes)
    a = rng.random(n + 100) < 0.45
    X = rng.normal(size=(n + 100, m))
    X[:, -1] = 1.0
    logits = X[:, 0] - 0.7 * X[:, 1] + 1.2 * a - 0.3
    y = np.where(logits + 0.6 * rng.normal(size=n + 100) > 0, 1.0, -1.0)
    kw = {}
    if test:
        kw = dict(X_test=X[n:], y_test=y[n:], group_a_test=a[n:])
    return VerticalProblem.from_columns(X[:n], y[:n], a[:n], list(sizes), **kw)


# -- (7) and (8) against finite differences ------------------------------------------------
def test_gradients_7_8_match_finite_differences():
    prob = small_problem()
    pm = PooledVerticalModel(prob)
    rng = np.random.default_rng(1)
    theta = 0.3 * rng.normal(size=sum(prob.sizes))
    lam, eps, c = np.array([0.7, 0.2]), 0.05, 0.01
    # (8) assembled from the parties' block gradients, each from the full scores only
    z = pm.X @ theta
    opts = FairVFLOptions()
    blocks = prob.split_theta(theta)
    grad8 = np.concatenate(
        [
            VFLParty(n_, Xk, prob.y, prob.group_a, k, opts, l2=prob.l2).block_gradient(
                z, blocks[k], lam[0] - lam[1]
            )
            for k, (n_, Xk) in enumerate(zip(prob.party_names, prob.blocks))
        ]
    )
    h = 1e-6
    fd = np.array(
        [
            (pm.lagrangian(theta + h * e, lam, eps, c) - pm.lagrangian(theta - h * e, lam, eps, c))
            / (2 * h)
            for e in np.eye(theta.size)
        ]
    )
    # central differences of a smooth function: error O(h^2 f''') + rounding O(eps_mach/h)
    np.testing.assert_allclose(grad8, fd, atol=1e-8)
    grad7 = pm.grad_lambda(theta, lam, eps, c)
    fd7 = np.array(
        [
            (pm.lagrangian(theta, lam + h * e, eps, c) - pm.lagrangian(theta, lam - h * e, eps, c))
            / (2 * h)
            for e in np.eye(2)
        ]
    )
    np.testing.assert_allclose(grad7, fd7, atol=1e-8)


# -- one round against centralized projected GDA ---------------------------------------------
@pytest.mark.parametrize("convention", ["step", "inverse"])
def test_q1_rounds_equal_centralized_projected_gda(convention):
    prob = small_problem()
    pm = PooledVerticalModel(prob)
    eta, beta, c, eps = 5.0, 0.5, 0.01, 0.02
    lam0 = np.array([0.3, 0.1])
    alpha = beta if convention == "step" else 1 / beta
    theta = np.zeros(sum(prob.sizes))
    lam = lam0.copy()
    for t in range(3):
        if t >= 1:  # (9) with c_{t-1} at theta^(t)
            lam = np.maximum(lam + alpha * pm.grad_lambda(theta, lam, eps, c), 0.0)
        theta = theta - pm.grad_theta(theta, lam) / eta  # (10)
    res = solve_vertical(
        prob,
        "fair-vfl",
        eps=eps,
        eta=eta,
        beta=beta,
        c=c,
        beta_convention=convention,
        lambda0=tuple(lam0),
        Q=1,
        max_rounds=3,
    )
    np.testing.assert_allclose(res.x, theta, rtol=0, atol=1e-13)
    np.testing.assert_allclose(res.extra["lambda"], lam, rtol=0, atol=1e-13)


def test_q_local_updates_equal_centralized_stale_read_simulation():
    """Eq. (11) with Q = 3: every party's steps read the others' blocks at theta^(t)."""
    prob = small_problem()
    pm = PooledVerticalModel(prob)
    eta, beta, c, eps, Q = 5.0, 0.5, 0.01, 0.02, 3
    theta, lam = np.zeros(sum(prob.sizes)), np.zeros(2)
    edges = np.cumsum([0] + prob.sizes)
    for t in range(4):
        if t >= 1:
            lam = np.maximum(lam + beta * pm.grad_lambda(theta, lam, eps, c), 0.0)
        new = theta.copy()
        for k in range(prob.K):
            sl = slice(edges[k], edges[k + 1])
            read = theta.copy()
            for _ in range(Q):
                read[sl] = new[sl]
                new[sl] -= pm.grad_theta(read, lam)[sl] / eta
        theta = new
    res = solve_vertical(prob, "fair-vfl", eps=eps, eta=eta, beta=beta, c=c, Q=Q, max_rounds=4)
    np.testing.assert_allclose(res.x, theta, rtol=0, atol=1e-12)


# -- the unconstrained limit -------------------------------------------------------------------
def test_unconstrained_limit_equals_lbfgs_fit():
    prob = small_problem()
    ref = solve_unconstrained(prob)
    assert ref.status == "optimal" and ref.kkt.stationarity <= 1e-9
    bcd = solve_vertical(
        prob, "fedbcd", eta=0.6, Q=2, max_rounds=1500, monitor_every=500, kkt_tol=1e-9
    )
    # eps far above the unconstrained DEO: lambda stays 0 and the runs coincide
    fair = solve_vertical(
        prob, "fair-vfl", eps=10.0, eta=0.6, Q=2, max_rounds=1500, monitor_every=500, kkt_tol=1e-9
    )
    assert bcd.status == "optimal" and fair.status == "optimal", (bcd.message, fair.message)
    np.testing.assert_array_equal(fair.extra["lambda"], [0.0, 0.0])
    np.testing.assert_allclose(fair.x, bcd.x, rtol=0, atol=1e-14)
    # L is (2 l2)-strongly convex: ||theta - theta*||_2 <= ||grad L||_2 / (2 l2)
    bound = np.sqrt(bcd.x.size) * bcd.kkt.stationarity / (2 * prob.l2)
    assert np.linalg.norm(bcd.x - ref.x) <= bound + 1e-12
    assert np.linalg.norm(bcd.x - ref.x) <= 1e-6
    assert abs(bcd.objective - ref.objective) <= 1e-10


# -- KKT at convergence (notes 6.2) and the certified reference ---------------------------------
def test_fair_vfl_converges_to_a_kkt_point_matching_the_reference():
    prob = small_problem()
    eps = 0.05
    ref = solve_constrained(prob, eps)
    assert ref.status == "optimal"
    lam_ref = ref.extra["lambda"]
    assert (lam_ref > 0).sum() == 1  # the constraint binds on one side
    res = solve_vertical(
        prob,
        "fair-vfl",
        eps=eps,
        eta=0.6,
        beta=1.0,
        beta_convention="inverse",
        c=1e-7,
        Q=2,
        max_rounds=1500,
        monitor_every=500,
        kkt_tol=1e-5,
    )
    lam = res.extra["lambda"]
    assert res.status == "optimal", res.message
    assert np.all(lam >= 0) and (lam > 0).sum() <= 1
    d = res.extra["train"]["deo_gap"]
    assert abs(lam[0] * (d - eps)) <= 1e-5 and abs(lam[1] * (-d - eps)) <= 1e-5
    assert res.kkt.stationarity <= 1e-5 and res.kkt.feasibility <= 1e-5
    # with c_t = c the fixed point violates the constraint by c * lambda (notes 3.6)
    assert res.max_violation <= 1e-7 * lam.max() + 1e-9
    np.testing.assert_allclose(lam, lam_ref, atol=1e-3)
    assert abs(res.objective - ref.objective) <= 1e-5
    assert np.abs(res.x - ref.x).max() <= 1e-3


def test_constant_c_leaves_the_predicted_violation():
    """With c_t = c > 0 the multiplier's fixed point is lambda = (|D| - eps)/c."""
    prob = small_problem()
    res = solve_vertical(
        prob,
        "fair-vfl",
        eps=0.05,
        eta=0.6,
        beta=1.0,
        beta_convention="inverse",
        c=0.05,
        Q=2,
        max_rounds=800,
        monitor_every=800,
    )
    lam = res.extra["lambda"].max()
    assert lam > 0
    assert res.max_violation == pytest.approx(0.05 * lam, rel=1e-4)
    assert res.status != "optimal"
    assert "c * lambda" in res.message


# -- the ledger --------------------------------------------------------------------------------
def test_only_score_vectors_and_lambda_cross_the_network():
    prob = small_problem(test=True)
    n, m = prob.n, sorted(set(prob.sizes))
    res = solve_vertical(
        prob, "fair-vfl", eps=0.05, eta=2.0, Q=2, max_rounds=5, reveal_parameters=False
    )
    algo = [r for r in res.ledger if r["channel"] == "algorithm"]
    assert {r["kind"] for r in algo} == {
        "vfl_start",
        "vfl_start_reply",
        "vfl_round",
        "vfl_round_reply",
    }
    for r in algo:
        for key, shape in r["shapes"].items():
            if key in ("partial_scores", "scores"):
                assert shape == (n,)
            else:
                assert key == "lambda" and shape == (2,), r
    up = [r for r in algo if r["receiver"] == "server"]
    assert all(set(r["shapes"]) == {"partial_scores"} for r in up)
    # diagnostic traffic: scalars and the test scores; never a parameter-sized vector
    for r in res.ledger:
        for shape in r["shapes"].values():
            assert shape in ((), (n,), (2,), (prob.y_test.size,)), r
            assert not (len(shape) == 1 and shape[0] in m), r
    assert res.x.size == 0 and res.solution == {}
    # per round: every party sends n floats up and receives n + 2 down
    per = res.communication["per_party"]["party0"]
    assert per["floats_sent"] == 6 * n and per["floats_received"] == 5 * (n + 2)
    # fedbcd sends no lambda
    bcd = solve_vertical(prob, "fedbcd", eta=2.0, max_rounds=2, reveal_parameters=False)
    assert all("lambda" not in r["shapes"] for r in bcd.ledger)


def test_each_party_is_built_with_its_own_block_only():
    from fedmodel.algorithms.vfl.run import party_factories

    prob = small_problem(test=True)
    facs = party_factories(prob, FairVFLOptions(), (1.0, 1.0))
    for k, (_name, fac) in enumerate(facs.items()):
        arrays = [a for a in (*fac.args, *fac.kwargs.values()) if isinstance(a, np.ndarray)]
        widths = {a.shape[1] for a in arrays if a.ndim == 2}
        assert widths == {prob.sizes[k]}
        for a in arrays:
            if a.ndim == 2 and a.shape[0] == prob.n:
                assert a is prob.blocks[k] or np.shares_memory(a, prob.blocks[k])
        ep = fac.build()
        assert ep.X.shape == prob.blocks[k].shape and ep.get_state()["state"]["theta"].shape == (
            prob.sizes[k],
        )


# -- fairness against FedBCD on a real split ----------------------------------------------------
def test_fair_vfl_meets_eps_and_is_fairer_than_fedbcd_on_compas():
    prob = vertical_dataset("compas", seed=0)
    common = dict(Q=4, max_rounds=300, monitor_every=300, keep_ledger=False, eta=20.0)
    fair = solve_vertical(
        prob, "fair-vfl", eps=0.01, c=1e-4, beta=0.1, beta_convention="inverse", **common
    )
    bcd = solve_vertical(prob, "fedbcd", **common)
    assert fair.extra["train"]["deo_loss"] <= 0.01 + 1e-3
    assert fair.extra["train"]["fairness_loss"] > bcd.extra["train"]["fairness_loss"]
    assert fair.extra["test"]["fairness_loss"] > bcd.extra["test"]["fairness_loss"]
    assert fair.extra["test"]["accuracy"] >= bcd.extra["test"]["accuracy"] - 0.03


# -- local-update policies, schedules, the gap -------------------------------------------------
def test_random_and_speed_local_updates():
    prob = small_problem()
    kw = dict(eps=0.05, eta=2.0, Q=4, max_rounds=20)
    r1 = solve_vertical(prob, "fair-vfl", local_updates="random", seed=3, **kw)
    r2 = solve_vertical(prob, "fair-vfl", local_updates="random", seed=3, **kw)
    r3 = solve_vertical(prob, "fair-vfl", local_updates="random", seed=4, **kw)
    np.testing.assert_array_equal(r1.x, r2.x)
    assert np.abs(r1.x - r3.x).max() > 0
    counts = [h["local_updates"] for h in r1.history]
    assert all(prob.K <= c <= prob.K * 4 for c in counts) and len(set(counts)) > 1
    sp = solve_vertical(prob, "fair-vfl", local_updates="speeds", speeds=(1.0, 0.5, 0.3), **kw)
    # per round: 4 + 2 + (1 or 2) updates, i.e. 4 rounds of 0.3 * 4 = 1.2 -> 1, 1, 1, 2 (clock)
    got = [h["local_updates"] for h in sp.history]
    assert set(got) <= {7.0, 8.0} and 8.0 in got and 7.0 in got
    with pytest.raises(ModelError, match="one speed per party"):
        solve_vertical(prob, "fair-vfl", local_updates="speeds", speeds=(1.0,), **kw)


def test_theorem2_schedule_and_gap_stop():
    prob = small_problem()
    res = solve_vertical(
        prob,
        "fair-vfl",
        eps=0.05,
        schedule="theorem2",
        beta=1.0,
        beta_convention="inverse",
        Q=1,
        max_rounds=200,
        monitor_every=10,
    )
    gaps = [h["gap"] for h in res.history]
    assert gaps[-1] < gaps[0] and all(np.isfinite(gaps))
    from fedmodel.algorithms.vfl.options import Schedule, lipschitz_bounds

    L, L12 = lipschitz_bounds(prob)
    sched = Schedule(FairVFLOptions(schedule="theorem2", beta=1.0), prob.K, (L, L12))
    KQ = prob.K
    assert sched.eta(100) == pytest.approx(
        (L**2 * (KQ + 2) * (KQ - 1) + 2 * (L + 1)) / 4 + L12**2 * KQ * (1 + 32 * 9 * 10) / 2
    )
    assert sched.c(16) == pytest.approx(0.5 * 16**-0.25)
    stop = solve_vertical(prob, "fedbcd", eta=0.6, Q=2, max_rounds=5000, tol=1e-6)
    assert stop.extra["reason"] == "gap" and stop.history[-1]["gap"] <= 1e-6
    assert stop.rounds["outer"] < 5000


# -- errors --------------------------------------------------------------------------------------
def test_overlapping_blocks_are_a_clear_error():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(30, 6))
    y = np.where(rng.random(30) < 0.5, 1.0, -1.0)
    y[:4] = 1.0
    a = np.arange(30) % 2 == 0
    with pytest.raises(ModelError, match=r"\[party1\] column\(s\) \[2\] already belong to party0"):
        VerticalProblem.from_columns(X, y, a, [[0, 1, 2], [2, 3, 4, 5]])
    with pytest.raises(ModelError, match="party names"):
        VerticalProblem.from_columns(X, y, a, [3, 3], party_names=["server", "bank"])
    with pytest.raises(ModelError, match=r"\[bank\].*rows"):
        VerticalProblem([X[:, :3], X[:10, 3:]], y, a, party_names=["insurer", "bank"])
    with pytest.raises(ModelError, match="N\\^a and N\\^b"):
        VerticalProblem.from_columns(X, np.where(a, 1.0, -1.0), a, [3, 3])


def test_a_party_publishing_the_wrong_vector_is_named():
    from fedmodel.algorithms.vfl.run import party_factories
    from fedmodel.algorithms.vfl.server import VFLServer
    from fedmodel.runtime.serial import SerialRuntime

    prob = small_problem()
    opts = FairVFLOptions()
    facs = party_factories(prob, opts, (1.0, 1.0))
    rt = SerialRuntime(facs)
    rt.endpoints["party1"].X = rt.endpoints["party1"].X[:-1]  # a party answering for other rows
    server = VFLServer(prob.y, prob.group_a, opts, prob.party_names)
    with pytest.raises(Exception, match="party1"):
        server.start(rt)


def test_small_blocks_warn_about_theorem1():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(30, 4))
    y = np.where(np.arange(30) % 3 == 0, 1.0, -1.0)
    a = np.arange(30) % 2 == 0
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        VerticalProblem.from_columns(X, y, a, [2, 2])
    assert any("m_k > 2" in str(x.message) for x in w)


# -- fm.models.fair_vfl and the registry ------------------------------------------------------
def test_fair_vfl_model_dispatches_through_the_registry():
    import cvxpy as cp

    import fedmodel as fm
    from fedmodel.algorithms.registry import method_spec

    prob = small_problem()
    X = np.hstack(prob.blocks)
    y01 = (prob.y > 0).astype(int)
    model = fm.models.fair_vfl(
        X,
        y01,
        prob.group_a,
        blocks=prob.sizes,
        eps=0.05,
        party_names=["bank", "insurer", "retailer"],
    )
    assert model.parties == ["bank", "insurer", "retailer"]
    assert method_spec("fair-vfl").vertical and method_spec("fedbcd").vertical
    res = model.solve(method="fair-vfl", Q=2, eta=2.0, max_rounds=30)
    direct = solve_vertical(prob, "fair-vfl", eps=0.05, Q=2, eta=2.0, max_rounds=30)
    np.testing.assert_array_equal(res.x, direct.x)
    assert set(res.solution) == {"theta_bank", "theta_insurer", "theta_retailer"}
    bcd = model.solve(method="fedbcd", Q=2, eta=2.0, max_rounds=30)
    assert bcd.method == "fedbcd" and bcd.multipliers == {}
    ref = model.solve(method="centralized")
    assert ref.status == "optimal" and ref.max_violation <= 1e-7
    with pytest.raises(ModelError, match="unknown option"):
        model.solve(method="fair-vfl", rho=1.0)
    with pytest.raises(ModelError, match="horizontal DSL models"):
        model.solve(method="prox-al")
    # a horizontal DSL model cannot be solved by a vertical method
    dsl = fm.Model("h")
    w = dsl.variable(2, name="w")
    site = dsl.client("site")
    A = site.data(np.ones((3, 2)), name="A")
    site.minimize(cp.sum_squares(A @ w))
    with pytest.raises(fm.UnsupportedError, match="fair_vfl"):
        dsl.solve(method="fair-vfl")
