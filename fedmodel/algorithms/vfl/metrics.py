"""Accuracy and fairness of scores or of (randomised) predictions (seed 002, Sec. V).

* loss-based DEO: ``|lhat^a - lhat^b|`` with the logistic loss (Definition 1 literally);
  for probabilistic predictions ``p = P(y = +1)`` the same loss is ``-log p`` on the
  positive samples (``p = sigmoid(z)`` gives back the logistic loss);
* TPR-based DEO: ``|TPR_a - TPR_b|`` on the positive samples (Donini et al.'s hard-loss
  version; the paper does not say which it reports);
* fairness ``FR = 1 - DEO``, harmonic mean ``HM = 2 AC FR / (AC + FR)``.

Prediction rule: ``+1`` when ``z >= 0`` (``p >= 1/2``).

The group TPRs of hard predictions (:func:`true_positive_rates`, used by
:func:`score_metrics`) are computed by ``fairlearn.metrics`` (``MetricFrame`` of
``true_positive_rate`` by group) when fairlearn is installed (the optional extra
``fedmodel[fairness]``), else by the package's own count; both give the same numbers
(``tests/test_vfl_fairness.py``). Randomised predictions (:func:`probability_metrics`) use
expectations, which fairlearn's metrics of hard labels do not take: always the own path.

Examples
--------
>>> import numpy as np
>>> y = np.array([1., 1., -1., 1.]); a = np.array([True, False, True, True])
>>> m = score_metrics(np.array([2., -1., -3., 0.5]), y, a)
>>> m["accuracy"], m["deo_tpr"]
(0.75, 1.0)
"""

from __future__ import annotations

import numpy as np
from scipy.special import expit

from fedmodel.algorithms.vfl.problem import logistic_loss


def harmonic_mean(accuracy: float, fairness: float) -> float:
    s = accuracy + fairness
    if not np.isfinite(s):
        return float("nan")
    return float(2 * accuracy * fairness / s) if s > 0 else 0.0


METRICS_BACKENDS = ("auto", "fairlearn", "own")


def fairlearn_available() -> bool:
    """True when ``fairlearn.metrics`` can be imported."""
    try:
        import fairlearn.metrics  # noqa: F401
    except ImportError:
        return False
    return True


def true_positive_rates(
    pred_positive: np.ndarray, y: np.ndarray, group_a: np.ndarray, backend: str = "auto"
) -> tuple[float, float]:
    """``(TPR_a, TPR_b)`` of hard predictions: the share predicted positive among the
    positive-label samples of each group.

    Parameters
    ----------
    pred_positive : bool array (n,)
        True where the prediction is the positive class.
    y : array (n,)
        Labels; ``> 0`` is the positive class.
    group_a : bool array (n,)
    backend : {"auto", "fairlearn", "own"}
        ``"fairlearn"``: ``fairlearn.metrics.MetricFrame(metrics=true_positive_rate, ...)
        .by_group``; ``"own"``: the mean of the predictions over each group's positives;
        ``"auto"``: fairlearn when installed, else own.

    Examples
    --------
    >>> import numpy as np
    >>> y = np.array([1, 1, 0, 1, 1]); a = np.array([True, True, False, False, False])
    >>> true_positive_rates(np.array([1, 0, 0, 1, 1]) > 0, y, a, backend="own")
    (0.5, 1.0)
    """
    if backend not in METRICS_BACKENDS:
        raise ValueError(f"backend must be one of {METRICS_BACKENDS}, got {backend!r}")
    pred = np.asarray(pred_positive, dtype=bool)
    pos = np.asarray(y) > 0
    g = np.asarray(group_a, dtype=bool)
    if backend == "auto":
        backend = "fairlearn" if fairlearn_available() else "own"
    if backend == "own" or not (pos & g).any() or not (pos & ~g).any():
        return _rate(pred, pos & g), _rate(pred, pos & ~g)
    try:
        from fairlearn.metrics import MetricFrame, true_positive_rate
    except ImportError:
        raise ImportError(
            "backend='fairlearn' needs fairlearn: pip install 'fedmodel[fairness]'"
        ) from None
    frame = MetricFrame(
        metrics=true_positive_rate,
        y_true=pos.astype(int),
        y_pred=pred.astype(int),
        sensitive_features=g,
    )
    by_group = frame.by_group
    return float(by_group[True]), float(by_group[False])


def _rate(pred: np.ndarray, mask: np.ndarray) -> float:
    return float(pred[mask].mean()) if mask.any() else float("nan")


def _masks(y: np.ndarray, group_a: np.ndarray):
    pos = np.asarray(y) > 0
    g = np.asarray(group_a, dtype=bool)
    return pos & g, pos & ~g


def score_metrics(
    z: np.ndarray, y: np.ndarray, group_a: np.ndarray, backend: str = "auto"
) -> dict[str, float]:
    """Metrics of a linear model's scores ``z`` (prediction ``+1`` where ``z >= 0``); the
    group TPRs through :func:`true_positive_rates` with ``backend``."""
    z, y = np.asarray(z, dtype=float), np.asarray(y, dtype=float)
    in_a, in_b = _masks(y, group_a)
    losses = logistic_loss(z, y)
    d = float(losses[in_a].mean() - losses[in_b].mean())
    pred = np.where(z >= 0, 1.0, -1.0)
    tpr_a, tpr_b = true_positive_rates(pred > 0, y, group_a, backend)
    return _assemble(float((pred == y).mean()), d, tpr_a, tpr_b)


def probability_metrics(
    p_positive: np.ndarray, y: np.ndarray, group_a: np.ndarray
) -> dict[str, float]:
    """Metrics of randomised predictions: ``p_positive[i] = P(predict +1 | sample i)``.

    Accuracy and TPRs are expectations over the randomisation (no sampling noise); the
    loss-based DEO uses ``-log p`` on the positives (``inf`` when some ``p`` is 0).
    """
    p = np.clip(np.asarray(p_positive, dtype=float), 0.0, 1.0)
    y = np.asarray(y, dtype=float)
    in_a, in_b = _masks(y, group_a)
    acc = float(np.where(y > 0, p, 1.0 - p).mean())
    with np.errstate(divide="ignore"):
        nll = -np.log(p)
    d = float(nll[in_a].mean() - nll[in_b].mean()) if np.all(p[in_a | in_b] > 0) else np.inf
    return _assemble(acc, d, p[in_a].mean(), p[in_b].mean())


def _assemble(acc: float, d: float, tpr_a: float, tpr_b: float) -> dict[str, float]:
    deo_loss = abs(d)
    deo_tpr = float(abs(tpr_a - tpr_b))
    fr_loss = 1.0 - deo_loss
    fr_tpr = 1.0 - deo_tpr
    return {
        "accuracy": acc,
        "deo_gap": d,
        "deo_loss": deo_loss,
        "deo_tpr": deo_tpr,
        "tpr_a": float(tpr_a),
        "tpr_b": float(tpr_b),
        "fairness_loss": fr_loss,
        "fairness_tpr": fr_tpr,
        "hm_loss": harmonic_mean(acc, fr_loss),
        "hm_tpr": harmonic_mean(acc, fr_tpr),
    }


def sigmoid(z: np.ndarray) -> np.ndarray:
    return expit(z)
