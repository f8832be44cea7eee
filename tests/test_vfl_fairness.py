"""The rate-based equal-opportunity constraint of the vfl family (issue 24) and the
fairness metrics through fairlearn."""

from __future__ import annotations

import numpy as np
import pytest
from test_vfl import small_problem

import fedmodel as fm
from fedmodel.algorithms.vfl.client import VFLParty
from fedmodel.algorithms.vfl.metrics import score_metrics, true_positive_rates
from fedmodel.algorithms.vfl.options import FairVFLOptions
from fedmodel.algorithms.vfl.problem import ScoreFunctions
from fedmodel.algorithms.vfl.reference import (
    PooledVerticalModel,
    solve_constrained,
    solve_unconstrained,
)
from fedmodel.algorithms.vfl.run import solve_vertical
from fedmodel.errors import ModelError, UnsupportedError
from fedmodel.runtime.checkpoint import CheckpointError

T = 0.5  # the surrogate's temperature in these tests


def test_tpr_constraint_gradients_match_finite_differences():
    prob = small_problem()
    pm = PooledVerticalModel(prob, "tpr", T)
    rng = np.random.default_rng(3)
    theta = 0.3 * rng.normal(size=sum(prob.sizes))
    lam, eps = np.array([0.0, 0.9]), 0.05
    z = pm.X @ theta
    opts = FairVFLOptions(constraint="tpr", tpr_temperature=T)
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
            (pm.lagrangian(theta + h * e, lam, eps) - pm.lagrangian(theta - h * e, lam, eps))
            / (2 * h)
            for e in np.eye(theta.size)
        ]
    )
    np.testing.assert_allclose(grad8, fd, atol=1e-8)
    # the curvature used by the reference's Newton polish, against differences of dD/dz
    f = ScoreFunctions(prob.y, prob.group_a, "tpr", T)
    fd2 = (f.constraint_derivative(z + h) - f.constraint_derivative(z - h)) / (2 * h)
    np.testing.assert_allclose(f.constraint_curvature(z), fd2, atol=1e-8)


def test_surrogate_error_bound_holds_and_the_surrogate_tends_to_the_tpr_gap():
    rng = np.random.default_rng(0)
    y = np.where(rng.random(500) < 0.6, 1.0, -1.0)
    a = rng.random(500) < 0.5
    z = rng.normal(size=500) * 2
    for temp in (1.0, 0.3, 0.1, 0.01):
        f = ScoreFunctions(y, a, "tpr", temp)
        err = abs(f.tpr_gap(z) - f.constraint_gap(z))
        assert err <= f.surrogate_error_bound(z) + 1e-15
    # at T -> 0 the surrogate is the true TPR gap (no score exactly 0 here)
    f = ScoreFunctions(y, a, "tpr", 1e-6)
    assert f.constraint_gap(z) == pytest.approx(f.tpr_gap(z), abs=1e-9)
    assert f.tpr_gap(z) == pytest.approx(
        score_metrics(z, y, a, backend="own")["tpr_a"] - score_metrics(z, y, a)["tpr_b"],
        abs=1e-15,
    )


def test_rate_constraint_holds_on_training_data_and_matches_the_reference():
    """fair-vfl with constraint='tpr': the surrogate gap within eps up to the certified
    feasibility (exactly, at a KKT point), the true TPR gap within eps plus the
    surrogate's error bound (computed from the scores), the same KKT point as the pooled
    reference."""
    prob = small_problem()
    eps = 0.05
    free = solve_unconstrained(prob)
    f = ScoreFunctions(prob.y, prob.group_a, "tpr", T)
    assert abs(f.constraint_gap(free.extra["scores"])) > 2 * eps  # the constraint binds
    ref = solve_constrained(prob, eps, constraint="tpr", tpr_temperature=T)
    assert ref.status == "optimal", ref.message
    res = solve_vertical(
        prob,
        "fair-vfl",
        eps=eps,
        constraint="tpr",
        tpr_temperature=T,
        eta=0.6,
        beta=1.0,
        beta_convention="inverse",
        c=1e-7,
        Q=2,
        max_rounds=1500,
        monitor_every=50,
        tol=1e-7,  # the gap (12): stops after a few hundred rounds
        kkt_tol=1e-5,
    )
    assert res.status == "optimal", res.message
    report = res.extra["constraint"]
    assert report["kind"] == "tpr" and report["temperature"] == T and report["eps"] == eps
    assert abs(report["gap"]) <= eps + res.kkt.feasibility
    assert abs(report["gap"]) == pytest.approx(eps, abs=1e-5)  # active at the optimum
    true_gap = res.extra["train"]["tpr_a"] - res.extra["train"]["tpr_b"]
    assert report["tpr_gap"] == pytest.approx(true_gap, abs=1e-15)
    assert abs(true_gap) <= eps + report["surrogate_error_bound"]
    # the true gap went down from the unconstrained fit's
    assert abs(true_gap) < free.extra["train"]["deo_tpr"]
    # the history reports the true gap and the constrained surrogate
    row = res.history[-1]
    assert row["tpr_gap"] == pytest.approx(true_gap, abs=1e-15)
    assert row["constraint_gap"] == pytest.approx(report["gap"], abs=1e-15)
    np.testing.assert_allclose(res.extra["lambda"], ref.extra["lambda"], atol=1e-3)
    assert abs(res.objective - ref.objective) <= 1e-5
    assert ref.extra["constraint"]["kind"] == "tpr"
    assert abs(ref.extra["constraint"]["gap"]) <= eps + ref.kkt.feasibility


def test_rate_constraint_through_the_builder_and_refused_on_a_dsl_deo_model():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(300, 6))
    group = rng.random(300) < 0.5
    y = (X[:, 0] + group + 0.5 * rng.normal(size=300) > 0.5).astype(int)
    vm = fm.models.fair_vfl(X, y, group, blocks=[3, 3], eps=0.05)
    ref = vm.solve(method="centralized", constraint="tpr", tpr_temperature=T)
    assert ref.status == "optimal" and ref.extra["constraint"]["kind"] == "tpr"
    assert abs(ref.extra["constraint"]["gap"]) <= 0.05 + ref.kkt.feasibility
    with pytest.raises(UnsupportedError, match="constraint='tpr'"):
        vm.dsl.solve(method="fair-vfl", constraint="tpr")


def test_a_checkpoint_resumes_only_with_the_same_constraint(tmp_path):
    prob = small_problem()
    kw = dict(eps=0.05, eta=2.0, Q=2, constraint="tpr", tpr_temperature=T)
    full = solve_vertical(prob, "fair-vfl", max_rounds=10, **kw)
    ck = tmp_path / "ck"
    solve_vertical(prob, "fair-vfl", max_rounds=6, checkpoint=str(ck), checkpoint_every=6, **kw)
    rest = solve_vertical(prob, "fair-vfl", max_rounds=10, resume=str(ck), **kw)
    np.testing.assert_array_equal(rest.x, full.x)
    for other in ({"constraint": "loss"}, {"tpr_temperature": 0.2}):  # other iterates
        with pytest.raises(CheckpointError):
            solve_vertical(prob, "fair-vfl", max_rounds=10, resume=str(ck), **{**kw, **other})


def test_bad_constraint_options_are_named():
    prob = small_problem()
    with pytest.raises(ModelError, match="constraint must be one of"):
        solve_vertical(prob, "fair-vfl", constraint="dp", max_rounds=2)
    with pytest.raises(ModelError, match="tpr_temperature must be > 0"):
        solve_vertical(prob, "fair-vfl", constraint="tpr", tpr_temperature=0.0, max_rounds=2)


def test_fairlearn_metrics_agree_with_the_own_computation():
    pytest.importorskip("fairlearn")
    rng = np.random.default_rng(5)
    for n in (7, 50, 1000):
        y = np.where(rng.random(n) < 0.5, 1.0, -1.0)
        y[:2] = 1.0
        a = rng.random(n) < 0.4
        a[0], a[1] = True, False  # positives in both groups
        pred = rng.random(n) < 0.5
        own = true_positive_rates(pred, y, a, backend="own")
        lib = true_positive_rates(pred, y, a, backend="fairlearn")
        assert lib == pytest.approx(own, abs=1e-15)
        z = rng.normal(size=n)
        m_own = score_metrics(z, y, a, backend="own")
        m_lib = score_metrics(z, y, a, backend="fairlearn")
        assert m_lib == pytest.approx(m_own, abs=1e-15)
    from fairlearn.metrics import equal_opportunity_difference

    assert m_lib["deo_tpr"] == pytest.approx(
        equal_opportunity_difference(
            (y > 0).astype(int), (z >= 0).astype(int), sensitive_features=a
        ),
        abs=1e-15,
    )


def test_compas_race_columns_are_features_unless_dropped():
    from fedmodel.algorithms.vfl.data import vertical_dataset

    kept = vertical_dataset("compas", seed=0)
    dropped = vertical_dataset("compas", seed=0, drop_sensitive=True)
    assert sum(kept.sizes) == 15 and sum(dropped.sizes) == 13
    assert dropped.sizes == [3, 2, 2, 2, 2, 2]

    # the group indicator is one of the kept features (standardised: two values), and no
    # feature of the dropped version separates the groups exactly
    def separates(prob):
        X = np.hstack(prob.blocks)
        return any(
            len(np.unique(X[:, j])) == 2
            and abs(np.corrcoef(X[:, j], prob.group_a)[0, 1]) > 1 - 1e-12
            for j in range(X.shape[1])
        )

    assert separates(kept) and not separates(dropped)
    np.testing.assert_array_equal(kept.group_a, dropped.group_a)
