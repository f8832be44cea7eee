"""Differential privacy on prox-al (docs/privacy.md): every aggregation of a run is one
clipped, noised sum spent on the accountant, the run stops before the budget is
exceeded, the clients' clear scalars travel in the noised sums, and without noise the
iterates are the plain run's on the same route."""

from __future__ import annotations

import math

import numpy as np
import pytest
from test_privacy_options import epsilon_by_hand, rel
from test_privacy_options import model as least_squares
from test_privacy_proxal import SAME, constrained_lasso

import fedmodel as fm
from fedmodel.algorithms.dp import spent
from fedmodel.errors import UnsupportedError
from fedmodel.runtime import secure_aggregation as sa

pytest.importorskip("dp_accounting")


@pytest.mark.parametrize(
    ("make", "route"), [(least_squares, "quasi-newton"), (constrained_lasso, "prox-quasi-newton")]
)
def test_without_noise_the_iterates_are_the_plain_ones(make, route):
    """epsilon = inf: clipping only; a clip above every message leaves the sums exact, and
    the run is the plain run on the same route (the clear scalars of test (8), summed
    rather than maxed, are an upper bound that agrees here)."""
    m = make()
    plain = m.solve("prox-al", inner_solver=route, **SAME)
    clipped = m.solve("prox-al", dp=fm.DP(epsilon=math.inf, delta=1e-5, clip=1e6))
    assert clipped.extra["inner_solver"] == route
    assert clipped.status == plain.status == "optimal"
    assert rel(clipped.x, plain.x) <= 1e-9
    assert clipped.rounds == plain.rounds
    assert clipped.privacy["epsilon"] == math.inf and clipped.privacy["mechanisms"] > 0


def test_the_accountant_spends_at_most_the_target():
    """A given noise multiplier: each round of the run is one noised sum (the certificate's
    included), composed by hand to at most the target; the run stops with
    ``budget_spent`` when one more sum and the certificate would exceed it."""
    z, delta, target = 3.0, 1e-5, 4.0
    res = least_squares().solve(
        "prox-al",
        dp=fm.DP(epsilon=target, delta=delta, clip=1.0, noise_multiplier=z),
        history=False,
    )
    p = res.privacy
    T = p["mechanisms"]
    assert res.status == "budget_spent"
    assert T == res.rounds["communication"]  # every round a noised sum, the certificate too
    assert p["epsilon"] == pytest.approx(epsilon_by_hand(z, T, delta), rel=1e-9)
    assert p["epsilon"] <= target < epsilon_by_hand(z, T + 1, delta)
    assert p["noise"] == "central (server)" and p["noise_multiplier"] == z
    # the default noise multiplier: calibrated for max_outer sums and the certificate
    res = least_squares().solve(
        "prox-al", dp=fm.DP(epsilon=target, delta=delta, clip=1.0), max_outer=12, history=False
    )
    z = res.privacy["noise_multiplier"]
    assert spent(z, 13, delta) <= target < spent(z / 1.01, 13, delta)
    assert res.privacy["epsilon"] <= target


def test_a_clients_contribution_is_clipped(monkeypatch):
    """What enters a sum from one client -- its sum-only fields and, under dp, its clear
    scalars -- has norm at most ``clip``; the clear scalars do not reach the server."""
    seen = []
    clip_and_noise = sa.clip_and_noise

    def spy(vec, clip, noise, rng):
        out = clip_and_noise(vec, clip, noise, rng)
        if clip is not None:
            seen.append((float(np.linalg.norm(vec)), float(np.linalg.norm(out)), clip))
        return out

    collected = []
    aggregate = sa.aggregate

    def spy_aggregate(runtime, kind, payload, **kw):
        out = aggregate(runtime, kind, payload, **kw)
        collected.append((kind, out))
        return out

    from fedmodel.algorithms import dp as dp_module

    monkeypatch.setattr(sa, "clip_and_noise", spy)
    monkeypatch.setattr(dp_module, "aggregate", spy_aggregate)
    dp = fm.DP(epsilon=8.0, delta=1e-5, clip=0.5)
    res = constrained_lasso().solve("prox-al", dp=dp, max_outer=6, history=False)
    assert res.privacy["mechanisms"] == len(collected)
    assert seen and all(after <= clip * (1 + 1e-12) for _, after, clip in seen)
    assert any(before > 0.5 for before, _, _ in seen)  # (the clip binds on this model)
    for kind, out in collected:
        for clear in out.clear.values():  # (a route's accepted flag only)
            assert set(clear) <= {"accepted"}, kind
        if kind == "outer":
            assert {"dmu_inf", "violation", "complementarity"} <= set(out.sums)


def test_the_constraint_violation_is_reported():
    """Under noise the certificate is an estimate: its feasibility residual is reported
    with its confidence margin, and "optimal" stands only with the margins."""
    res = constrained_lasso().solve(
        "prox-al", dp=fm.DP(epsilon=3.0, delta=1e-5, clip=1.0), max_outer=10, history=False
    )
    cert = res.privacy["certificate"]
    assert math.isfinite(res.kkt.feasibility) and res.kkt.feasibility >= 0
    assert cert["feasibility_margin"] > 0 and cert["stationarity_margin"] > 0
    assert cert["noise_std"] == pytest.approx(res.privacy["noise_multiplier"] * 1.0)
    assert res.status in ("budget_spent", "inaccurate", "optimal", "diverging")
    if res.status == "optimal":
        assert res.kkt.feasibility + cert["feasibility_margin"] <= 1e-6


@pytest.mark.parametrize("method", ["prox-al", "fedavg"])
def test_a_model_without_client_constraints_reports_feasibility_zero(method):
    """On a model whose clients have no constraint (and no term with a domain) their
    feasibility and violation are 0 by structure: the certificate reports 0 with no
    margin, not a noised sum, and spends the same budget (one mechanism, for the
    objective and the gradient); a model with a client's constraint keeps the noised sum
    and its margin."""
    dp = fm.DP(epsilon=3.0, delta=1e-5, clip=1.0)
    opts = {"prox-al": {"max_outer": 6}, "fedavg": {"max_rounds": 5, "weights": "uniform"}}
    for make, structural in ((least_squares, True), (constrained_lasso, False)):
        m = make()
        if method == "fedavg" and not structural:
            opts[method]["penalty"] = 10.0
        res = m.solve(method, dp=dp, history=False, **opts[method])
        cert, p = res.privacy["certificate"], res.privacy
        assert p["epsilon"] <= 3.0
        assert p["epsilon"] == pytest.approx(spent(p["noise_multiplier"], p["mechanisms"], 1e-5))
        assert cert["stationarity_margin"] > 0
        if structural:
            assert res.kkt.feasibility == 0.0 and cert["feasibility_margin"] == 0.0
        else:  # (the noised sum of the violations: below 0 it reads as 0)
            assert cert["feasibility_margin"] > 0


def test_with_secure_aggregation_the_clients_add_the_noise():
    res = least_squares().solve(
        "prox-al",
        dp=fm.DP(epsilon=4.0, delta=1e-5, clip=1.0),
        secure_aggregation=True,
        max_outer=4,
        history=False,
    )
    p = res.privacy
    assert p["noise"] == "distributed (client shares)" and p["epsilon"] <= 4.0
    assert p["secure_aggregation"]["on"] and "outer" in p["secure_aggregation"]["messages"]


def test_routes_that_read_a_client_are_refused_under_dp():
    m = least_squares()
    dp = fm.DP(epsilon=3.0, delta=1e-5, clip=1.0)
    with pytest.raises(UnsupportedError, match=r"'admm'.*under dp.*admm_w \(u_tilde"):
        m.solve("prox-al", dp=dp, inner_solver="admm")
    with pytest.raises(UnsupportedError, match=r"under dp.*curvature_w \(local_direction\)"):
        m.solve("prox-al", dp=dp, local_directions=True)
