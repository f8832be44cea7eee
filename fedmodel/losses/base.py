"""Per-sample losses: value and gradient on a batch of rows.

Examples
--------
>>> import numpy as np
>>> def value_grad(w, X, Y):
...     r = X @ w - Y
...     return r**2, X * (2 * r)[:, None]  # per-sample values, per-sample gradients
>>> loss = CallableLoss(2, value_grad)
>>> X, Y = np.eye(2), np.ones(2)
>>> total, grad = loss.value_and_grad(np.zeros(2), X, Y)
>>> float(total), grad.tolist()
(2.0, [-2.0, -2.0])
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence

import numpy as np


class SampleLoss(ABC):
    """A smooth per-sample loss ``f(w; x_n)`` with ``w`` in ``R^dim``.

    Subclasses implement :meth:`value_and_grad` (sum over the batch of the values and of
    the gradients: what a client uploads in Algorithm 1, the ``q`` vector) and may
    refine :meth:`values` (per-sample values only, for evaluation) and :meth:`predict`.

    Attributes
    ----------
    dim : int
        Number of parameters ``d``.
    n_inputs : int or None
        Number of columns a row ``x_n`` must have (None: any, the loss does not say).
    """

    dim: int = 0
    n_inputs: int | None = None

    @abstractmethod
    def value_and_grad(
        self, w: np.ndarray, X: np.ndarray, Y: np.ndarray
    ) -> tuple[float, np.ndarray]:
        """``(sum_n f(w; x_n), sum_n grad f(w; x_n))`` over the rows of ``(X, Y)``."""

    def values(self, w: np.ndarray, X: np.ndarray, Y: np.ndarray) -> np.ndarray:
        """Per-sample values ``f(w; x_n)`` (default: one :meth:`value_and_grad` per row)."""
        return np.array(
            [self.value_and_grad(w, X[n : n + 1], Y[n : n + 1])[0] for n in range(len(X))]
        )

    def total(self, w: np.ndarray, X: np.ndarray, Y: np.ndarray) -> float:
        """``sum_n f(w; x_n)`` over the rows."""
        return float(np.sum(self.values(w, X, Y)))

    def predict(self, w: np.ndarray, X: np.ndarray) -> np.ndarray:
        """Class predictions (classification losses); not every loss has them."""
        raise NotImplementedError(f"{type(self).__name__} makes no predictions")

    def init(self, seed: int = 0) -> np.ndarray:
        """A starting point (default zeros)."""
        return np.zeros(self.dim)


class FeatureSplitLoss(SampleLoss):
    """A per-sample loss with the feature-based structure of the paper's (2), where the
    blocks' contributions add up:

        f(w; x_n) = g(w_0, sum_i h_i(w_i, z_{n,i}), y_n),
        h_i(w_i, z_{n,i}) = "client i's partial of the hidden input" (H values per sample).

    Client ``i`` holds the columns ``z_{n,i}`` (its block of features) and the labels
    ``y_n``; it computes ``h_i`` and, once it has every ``h_j`` of the batch, the gradient
    of its own block ``w_i`` (and, for the designated client, ``w_0``'s).
    """

    @abstractmethod
    def split(self, blocks: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Index arrays into ``w`` of ``[w_0, w_1, ..., w_I]`` for the column blocks."""

    @abstractmethod
    def h(self, w_i: np.ndarray, Z_i: np.ndarray) -> np.ndarray:
        """``h_i`` for the rows of ``Z_i``: an array of shape ``(B, H)``."""

    @abstractmethod
    def top(
        self, w_0: np.ndarray, H: np.ndarray, Y: np.ndarray
    ) -> tuple[float, np.ndarray, np.ndarray]:
        """At ``H = sum_i h_i``: ``(sum_n f, sum_n grad_{w_0} f, dF/dH)`` with ``dF/dH`` of
        shape ``(B, H)`` (per-sample derivatives with respect to the summed ``h``)."""

    @abstractmethod
    def block_grad(self, w_i: np.ndarray, Z_i: np.ndarray, dH: np.ndarray) -> np.ndarray:
        """``sum_n grad_{w_i} f`` from ``dF/dH`` and the block's own columns (or, in Remark
        4's one-step collection, from :meth:`h_jacobian`'s output in place of ``Z_i``)."""

    def h_jacobian(self, w_i: np.ndarray, Z_i: np.ndarray) -> np.ndarray:
        """What Remark 4's one-step collection sends for ``dh_i/dw_i`` (:meth:`block_grad`
        takes it in place of ``Z_i``)."""
        raise NotImplementedError(f"{type(self).__name__} has no one-step collection")

    def top_correct(self, w_0: np.ndarray, H: np.ndarray, labels: np.ndarray) -> int:
        """Correct class predictions at the summed ``H`` (classification losses)."""
        raise NotImplementedError(f"{type(self).__name__} makes no predictions")


class CallableLoss(SampleLoss):
    """A user's own differentiable model from a function of a batch.

    Parameters
    ----------
    dim : int
        Number of parameters.
    value_grad : callable
        ``value_grad(w, X, Y) -> (values (B,), gradients (B, dim))``: per-sample values and
        gradients on a batch of rows.
    predict : callable, optional
        ``predict(w, X) -> labels``.
    init : callable, optional
        ``init(seed) -> w``.
    """

    def __init__(
        self,
        dim: int,
        value_grad: Callable[[np.ndarray, np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]],
        predict: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None,
        init: Callable[[int], np.ndarray] | None = None,
    ):
        self.dim = int(dim)
        self._value_grad = value_grad
        self._predict = predict
        self._init = init

    def _call(self, w, X, Y):
        vals, grads = self._value_grad(w, X, Y)
        vals = np.asarray(vals, dtype=float).reshape(-1)
        grads = np.asarray(grads, dtype=float).reshape(len(vals), -1)
        if grads.shape[1] != self.dim:
            raise ValueError(
                f"the model's gradient has {grads.shape[1]} entries per sample, expected "
                f"dim = {self.dim}"
            )
        return vals, grads

    def value_and_grad(self, w, X, Y):
        vals, grads = self._call(w, X, Y)
        return float(vals.sum()), grads.sum(axis=0)

    def values(self, w, X, Y):
        return self._call(w, X, Y)[0]

    def predict(self, w, X):
        if self._predict is None:
            return super().predict(w, X)
        return np.asarray(self._predict(w, X))

    def init(self, seed: int = 0):
        return super().init(seed) if self._init is None else np.asarray(self._init(seed), float)
