"""Linear models as per-sample losses: least squares and logistic regression, with the
feature-split structure of seed 003's (2) (convex: small problems with a centralized
reference, and second losses for constraints).

``w = [b, v]`` (an intercept ``b`` and one weight per input column), ``u_n = x_n' v + b``:

* ``kind="squared"``: ``f = (u_n - y_n)^2``;
* ``kind="logistic"``: ``f = log(1 + exp(u_n)) - y_n u_n`` with ``y_n`` in ``{0, 1}``.

Feature-split: ``w_0 = b``, ``h_i(w_i, z_{n,i}) = z_{n,i}' v_i`` (one number per row) and
``g(b, H, y) = f(H + b, y)``.

Examples
--------
>>> import numpy as np
>>> loss = LinearLoss(2, kind="squared")
>>> value, grad = loss.value_and_grad(np.array([0.0, 1.0, 1.0]), np.eye(2), np.zeros(2))
>>> float(value), grad.tolist()
(2.0, [4.0, 2.0, 2.0])
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy.special import expit

from fedmodel.losses.base import FeatureSplitLoss

KINDS = ("squared", "logistic")


class LinearLoss(FeatureSplitLoss):
    """``f(w; x, y)`` of a linear model with an intercept (module docstring).

    Parameters
    ----------
    P : int
        Input columns.
    kind : {"squared", "logistic"}
    """

    def __init__(self, P: int, kind: str = "squared"):
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        self.P, self.kind = int(P), kind
        if self.P < 1:
            raise ValueError(f"P must be positive, got {P!r}")
        self.dim = self.P + 1
        self.n_inputs = self.P

    def _per_sample(self, u: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Values and derivatives in ``u``."""
        y = np.asarray(y, dtype=float).reshape(-1)
        if self.kind == "squared":
            r = u - y
            return r**2, 2 * r
        return np.logaddexp(0.0, u) - y * u, expit(u) - y

    def values(self, w, X, Y):
        w = np.asarray(w, dtype=float)
        return self._per_sample(np.asarray(X, dtype=float) @ w[1:] + w[0], Y)[0]

    def value_and_grad(self, w, X, Y):
        w, X = np.asarray(w, dtype=float), np.asarray(X, dtype=float)
        f, df = self._per_sample(X @ w[1:] + w[0], Y)
        return float(f.sum()), np.concatenate([[df.sum()], X.T @ df])

    def predict(self, w, X):
        if self.kind == "squared":
            return super().predict(w, X)  # a regression: no class predictions
        w = np.asarray(w, dtype=float)
        return (np.asarray(X, dtype=float) @ w[1:] + w[0] > 0).astype(int)

    # -- the feature-based structure -----------------------------------------------------------
    def split(self, blocks: Sequence[np.ndarray]) -> list[np.ndarray]:
        """``[[0], 1 + P_1, ..., 1 + P_I]`` for column blocks ``P_i`` (a partition)."""
        cols = np.concatenate([np.asarray(b, dtype=np.int64) for b in blocks])
        if sorted(cols.tolist()) != list(range(self.P)):
            raise ValueError(f"the feature blocks must partition the {self.P} input columns")
        return [np.array([0])] + [1 + np.asarray(b, dtype=np.int64) for b in blocks]

    def h(self, w_i, Z_i):
        return (np.asarray(Z_i, dtype=float) @ np.asarray(w_i, dtype=float))[:, None]

    def top(self, w_0, H, Y):
        f, df = self._per_sample(np.asarray(H, dtype=float)[:, 0] + float(w_0[0]), Y)
        return float(f.sum()), np.array([df.sum()]), df[:, None]

    def block_grad(self, w_i, Z_i, dH):
        return np.asarray(Z_i, dtype=float).T @ np.asarray(dH, dtype=float)[:, 0]

    def h_jacobian(self, w_i, Z_i):
        return np.asarray(Z_i, dtype=float)

    def top_correct(self, w_0, H, labels):
        if self.kind == "squared":
            return super().top_correct(w_0, H, labels)
        u = np.asarray(H, dtype=float)[:, 0] + float(w_0[0])
        return int(np.sum((u > 0).astype(int) == np.asarray(labels)))
