"""EO (Hardt et al.) and calibrated EO (Pleiss et al.) post-processing, and the metrics."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.optimize import linprog

from fedmodel.algorithms.vfl.metrics import probability_metrics, score_metrics
from fedmodel.algorithms.vfl.postprocessing import (
    calibrated_equal_opportunity,
    equal_opportunity,
)


def scores_data(n=600, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.random(n) < 0.4
    y = np.where(rng.random(n) < 0.35 + 0.1 * a, 1.0, -1.0)
    z = np.round(1.2 * y + 0.9 * a + rng.normal(size=n), 1)  # ties in the scores
    return z, y, a


def hardt_lp_error(z, y, a) -> float:
    """Hardt et al.'s LP over every threshold rule of each group (randomised mixtures),
    equal TPRs, minimum expected error: solved by scipy's HiGHS."""
    pos = y > 0
    cols, groups = [], []
    for g in (True, False):
        m = a == g
        taus = np.concatenate([[np.inf], np.unique(z[m])[::-1], [-np.inf]])
        for t in taus:
            pred = z[m] >= t
            cols.append(
                (
                    (pred & pos[m]).sum() / (pos & m).sum(),  # TPR
                    ((pred & ~pos[m]).sum() + (~pred & pos[m]).sum()) / z.size,  # errors / n
                )
            )
            groups.append(g)
    tpr = np.array([c[0] for c in cols])
    err = np.array([c[1] for c in cols])
    ga = np.array(groups)
    A_eq = np.vstack([ga.astype(float), (~ga).astype(float), np.where(ga, tpr, -tpr)])
    out = linprog(err, A_eq=A_eq, b_eq=[1, 1, 0], bounds=(0, None), method="highs")
    assert out.status == 0
    return float(out.fun)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_exact_equal_opportunity_solves_hardts_lp(seed):
    z, y, a = scores_data(seed=seed)
    eo = equal_opportunity(z, y, a, backend="exact")
    m = eo.metrics(z, y, a)
    assert m["deo_tpr"] <= 1e-12
    # the LP optimum (HiGHS, feasibility/optimality tolerances 1e-7)
    assert 1 - m["accuracy"] == pytest.approx(hardt_lp_error(z, y, a), abs=1e-7)


def test_fairlearn_equal_opportunity_agrees_with_the_exact_rule():
    pytest.importorskip("fairlearn")
    z, y, a = scores_data(n=2000)
    exact = equal_opportunity(z, y, a, backend="exact").metrics(z, y, a)
    fl = equal_opportunity(z, y, a, backend="fairlearn")
    assert fl.backend == "fairlearn"
    m = fl.metrics(z, y, a)
    # fairlearn searches a grid of 1000 points on the ROC hulls: equal TPRs up to its grid
    assert m["deo_tpr"] <= 2e-3
    assert m["accuracy"] <= exact["accuracy"] + 1e-9
    assert m["accuracy"] >= exact["accuracy"] - 2e-3


def test_calibrated_eo_equalises_the_generalised_fnr():
    z, y, a = scores_data(n=3000)
    rule = calibrated_equal_opportunity(z, y, a)
    assert 0 < rule.alpha < 1
    p = 1 / (1 + np.exp(-z))
    pos = y > 0
    gfnr = {}
    for g in (True, False):
        m = (a == g) & pos
        mu = (y[a == g] > 0).mean()
        mix = rule.alpha if g == rule.mixed_group else 0.0
        gfnr[g] = (1 - mix) * (1 - p[m]).mean() + mix * (1 - mu)
    assert gfnr[True] == pytest.approx(gfnr[False], abs=1e-12)


def test_metrics_of_scores_and_probabilities_agree():
    z, y, a = scores_data()
    s = score_metrics(z, y, a)
    p = probability_metrics(1 / (1 + np.exp(-z)), y, a)
    assert s["deo_loss"] == pytest.approx(p["deo_loss"], rel=1e-12)
    hard = probability_metrics((z >= 0).astype(float), y, a)
    assert s["accuracy"] == pytest.approx(hard["accuracy"]) and s["deo_tpr"] == pytest.approx(
        hard["deo_tpr"]
    )
    assert s["hm_loss"] == pytest.approx(
        2 * s["accuracy"] * s["fairness_loss"] / (s["accuracy"] + s["fairness_loss"])
    )
