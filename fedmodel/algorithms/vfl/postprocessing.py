"""Post-processing baselines of seed 002's Table I, on pooled predictions: NOT federated.

Both need the scores, labels and groups of every sample in one place ("a unified
dataset", the paper's words); they post-process a trained model (FedBCD's, in Table I).

* :func:`equal_opportunity` (Hardt, Price, Srebro 2016): a group-dependent, randomised
  threshold rule on the scores with equal true-positive rates that minimises the expected
  error. Exact: on each group's ROC convex hull the smallest FPR reaching TPR ``gamma`` is
  convex piecewise linear in ``gamma``, so the LP's optimum sits at a hull vertex's TPR
  of one of the groups; every such ``gamma`` is evaluated. With ``backend="fairlearn"``
  (optional extra ``fedmodel[fairness]``) fairlearn's ThresholdOptimizer
  (``true_positive_rate_parity``) is used instead.
* :func:`calibrated_equal_opportunity` (Pleiss et al. 2017, the authors' code with the
  ``fnr`` constraint): with calibrated probabilities ``p = sigmoid(z)`` and the
  generalised false-negative rate ``gFNR = mean_{y = 1} (1 - p)`` as each group's cost,
  the group with the lower cost has its predictions replaced by its base rate with
  probability ``alpha`` so that the costs become equal.

Metrics are expectations over the randomisation (:func:`fedmodel.algorithms.vfl.metrics.
probability_metrics`); fit on the training part, evaluate on the test part.

Examples
--------
>>> import numpy as np
>>> rng = np.random.default_rng(0)
>>> a = rng.random(2000) < 0.5
>>> y = np.where(rng.random(2000) < 0.4, 1.0, -1.0)
>>> z = y * 1.0 + a * 0.8 + rng.normal(size=2000)
>>> eo = equal_opportunity(z, y, a)
>>> m = eo.metrics(z, y, a)
>>> round(m["deo_tpr"], 12)
0.0
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.special import expit

from fedmodel.algorithms.vfl.metrics import _assemble

# ---------------------------------------------------------------------------------------
# equal opportunity (Hardt et al. 2016)


def _roc_hull(scores: np.ndarray, pos: np.ndarray):
    """Upper convex hull of the ROC points of the rules ``predict 1 iff s >= tau``.

    Returns ``(fpr, tpr, tau)`` of the hull vertices, FPR increasing (``tau = +inf`` at
    (0, 0), ``-inf`` at (1, 1))."""
    P, N = pos.sum(), (~pos).sum()
    taus = np.unique(scores)[::-1]
    order = np.argsort(-scores, kind="stable")
    s_sorted, p_sorted = scores[order], pos[order]
    tp = np.cumsum(p_sorted)
    fp = np.cumsum(~p_sorted)
    # the last index of each distinct score (descending)
    last = np.searchsorted(-s_sorted, -taus, side="right") - 1
    fpr = np.concatenate([[0.0], fp[last] / max(N, 1)])
    tpr = np.concatenate([[0.0], tp[last] / max(P, 1)])
    tau = np.concatenate([[np.inf], taus])
    tau[-1] = -np.inf
    hull: list[int] = []
    for i in range(len(fpr)):
        while len(hull) >= 2:
            i1, i2 = hull[-2], hull[-1]
            cross = (fpr[i2] - fpr[i1]) * (tpr[i] - tpr[i1]) - (tpr[i2] - tpr[i1]) * (
                fpr[i] - fpr[i1]
            )
            if cross >= 0:  # i2 lies on or below the chord i1 -> i: not on the upper hull
                hull.pop()
            else:
                break
        hull.append(i)
    h = np.array(hull)
    return fpr[h], tpr[h], tau[h]


def _point_for_tpr(fpr, tpr, tau, gamma):
    """The smallest-FPR hull point with TPR ``gamma``: ``(fpr, tau_hi, tau_lo, w)`` with
    ``P(predict 1 | s) = (1 - w) [s >= tau_hi] + w [s >= tau_lo]``."""
    j = int(np.searchsorted(tpr, gamma - 1e-15, side="left"))
    if j == 0 or tpr[j] == tpr[j - 1]:
        return fpr[j], tau[j], tau[j], 0.0
    w = (gamma - tpr[j - 1]) / (tpr[j] - tpr[j - 1])
    return fpr[j - 1] + w * (fpr[j] - fpr[j - 1]), tau[j - 1], tau[j], float(w)


@dataclass
class ThresholdRule:
    """Per group: ``P(predict 1 | s) = (1 - w) [s >= tau_hi] + w [s >= tau_lo]``."""

    rules: dict[bool, tuple[float, float, float]]
    gamma: float
    backend: str = "exact"
    fitted: object = None

    def p_positive(self, scores: np.ndarray, group_a: np.ndarray) -> np.ndarray:
        scores = np.asarray(scores, dtype=float)
        group_a = np.asarray(group_a, dtype=bool)
        if self.fitted is not None:
            return _fairlearn_pmf(self.fitted, scores, group_a)
        p = np.zeros(scores.size)
        for g, (hi, lo, w) in self.rules.items():
            m = group_a == g
            p[m] = (1 - w) * (scores[m] >= hi) + w * (scores[m] >= lo)
        return p

    def metrics(self, scores, y, group_a) -> dict[str, float]:
        p = self.p_positive(scores, group_a)
        return _metrics_of(p, None, y, group_a)


def equal_opportunity(
    scores: np.ndarray, y: np.ndarray, group_a: np.ndarray, backend: str = "auto"
) -> ThresholdRule:
    """Fit Hardt et al.'s equal-opportunity rule on (training) scores.

    ``backend``: ``"exact"`` (the hull/LP solution above), ``"fairlearn"``, or ``"auto"``
    (fairlearn when installed, else exact).
    """
    scores = np.asarray(scores, dtype=float)
    pos = np.asarray(y) > 0
    group_a = np.asarray(group_a, dtype=bool)
    if backend in ("auto", "fairlearn"):
        try:
            import fairlearn  # noqa: F401
        except ImportError:
            if backend == "fairlearn":
                raise ImportError(
                    "backend='fairlearn' needs fairlearn: pip install 'fedmodel[fairness]'"
                ) from None
            backend = "exact"
        else:
            return ThresholdRule({}, float("nan"), "fairlearn", _fairlearn_fit(scores, y, group_a))
    hulls = {g: _roc_hull(scores[group_a == g], pos[group_a == g]) for g in (True, False)}
    n = scores.size
    candidates = np.unique(np.concatenate([h[1] for h in hulls.values()]))
    best, best_err = None, np.inf
    for gamma in candidates:
        err = 0.0
        for g, (fpr, tpr, tau) in hulls.items():
            m = group_a == g
            n_pos, n_neg = (pos & m).sum(), (~pos & m).sum()
            f, *_ = _point_for_tpr(fpr, tpr, tau, gamma)
            err += n_pos * (1 - gamma) + n_neg * f
        if err / n < best_err - 1e-15:
            best, best_err = gamma, err / n
    rules = {g: _point_for_tpr(*hulls[g], best)[1:] for g in (True, False)}
    return ThresholdRule(rules, float(best), "exact")


def _fairlearn_fit(scores, y, group_a):
    from fairlearn.postprocessing import ThresholdOptimizer
    from sklearn.base import BaseEstimator

    class ScoreEstimator(BaseEstimator):
        """A "prefit" estimator whose prediction is its single input column (the scores)."""

        def fit(self, X, y=None):
            self.fitted_ = True
            return self

        def predict(self, X):
            return np.asarray(X)[:, 0]

    est = ScoreEstimator().fit(scores[:, None])
    opt = ThresholdOptimizer(
        estimator=est,
        constraints="true_positive_rate_parity",
        objective="accuracy_score",
        prefit=True,
        predict_method="predict",
    )
    opt.fit(
        scores[:, None], (np.asarray(y) > 0).astype(int), sensitive_features=group_a.astype(int)
    )
    return opt


def _fairlearn_pmf(opt, scores, group_a):
    return opt._pmf_predict(scores[:, None], sensitive_features=group_a.astype(int))[:, 1]


# ---------------------------------------------------------------------------------------
# calibrated equal opportunity (Pleiss et al. 2017)


@dataclass
class CalibratedRule:
    """Group ``mixed_group``'s probabilities are replaced by its base rate with
    probability ``alpha``."""

    base_rates: dict[bool, float]
    mixed_group: bool
    alpha: float

    def probabilities(self, scores, group_a):
        """``(P(predict 1), E[-log p])`` per sample: hard predictions round the (mixed)
        probability; the loss is the expected log-loss of the mixed probability."""
        p = expit(np.asarray(scores, dtype=float))
        group_a = np.asarray(group_a, dtype=bool)
        hard = (p >= 0.5).astype(float)
        with np.errstate(divide="ignore"):
            nll = -np.log(p)
        m = group_a == self.mixed_group
        mu = self.base_rates[self.mixed_group]
        hard[m] = (1 - self.alpha) * hard[m] + self.alpha * float(mu >= 0.5)
        nll[m] = (1 - self.alpha) * nll[m] + self.alpha * (-np.log(mu))
        return hard, nll

    def metrics(self, scores, y, group_a) -> dict[str, float]:
        hard, nll = self.probabilities(scores, group_a)
        return _metrics_of(hard, nll, y, group_a)


def calibrated_equal_opportunity(scores, y, group_a) -> CalibratedRule:
    """Fit Pleiss et al.'s calibrated equal opportunity (false-negative cost) on (training)
    scores, following the authors' ``calib_eq_odds`` with ``fn_rate=1, fp_rate=0``: the
    group with the lower gFNR is mixed with its trivial classifier (cost ``1 - mu``) at
    rate ``alpha = (gFNR_high - gFNR_low) / (1 - mu_low - gFNR_low)``."""
    p = expit(np.asarray(scores, dtype=float))
    pos = np.asarray(y) > 0
    group_a = np.asarray(group_a, dtype=bool)
    base, cost, trivial = {}, {}, {}
    for g in (True, False):
        m = group_a == g
        mu = float(pos[m].mean())
        base[g] = mu
        cost[g] = float((1 - p[m & pos]).mean())  # generalised false-negative rate
        trivial[g] = 1 - mu  # the constant-mu classifier's
    high = cost[True] > cost[False]
    low = not high
    denom = trivial[low] - cost[low]
    alpha = float(np.clip((cost[high] - cost[low]) / denom, 0.0, 1.0)) if denom > 0 else 0.0
    return CalibratedRule(base, low, alpha)


def _metrics_of(p_pos, nll, y, group_a) -> dict[str, float]:
    y = np.asarray(y, dtype=float)
    g = np.asarray(group_a, dtype=bool)
    in_a, in_b = (y > 0) & g, (y > 0) & ~g
    acc = float(np.where(y > 0, p_pos, 1.0 - p_pos).mean())
    d = float(nll[in_a].mean() - nll[in_b].mean()) if nll is not None else float("nan")
    return _assemble(acc, d, p_pos[in_a].mean(), p_pos[in_b].mean())
