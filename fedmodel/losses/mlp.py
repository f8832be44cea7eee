"""The paper's Section V network: a 2-layer MLP without biases, a swish hidden layer and a
softmax cross-entropy output, with the analytic per-sample gradients of seed 003.

``w = (W0, W1)`` stacked as ``[W0.ravel(), W1.ravel()]`` with ``W0`` of shape ``(L, J)``
(the output layer, the paper's ``omega_{0,l,j}``) and ``W1`` of shape ``(J, P)`` (the hidden
layer, ``omega_{1,j,p}``); ``d = J (P + L)``. For a sample ``(z, y)``:

    a = W1 z,  s = S(a),  o = W0 s,  Q = softmax(o),  f = -sum_l y_l log Q_l,
    a_bar[l, j] = (Q_l - y_l) S(a_j)                          (d f / d W0)
    b_bar[j, p] = sum_l (Q_l - y_l) S'(a_j) W0[l, j] z_p      (d f / d W1)

with ``S(z) = z / (1 + e^-z)`` (swish) and ``S'(z) = sigma(z) (1 + z (1 - sigma(z)))``.

Examples
--------
>>> import numpy as np
>>> net = SwishMLP(P=4, J=3, L=2)
>>> w = net.init(seed=0)
>>> X = np.random.default_rng(1).normal(size=(5, 4)); Y = np.array([0, 1, 1, 0, 1])
>>> value, grad = net.value_and_grad(w, X, Y)
>>> grad.shape == (net.dim,), bool(value > 0)
(True, True)
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy.special import expit

from fedmodel.losses.base import FeatureSplitLoss


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return expit(z)


def swish(z: np.ndarray) -> np.ndarray:
    """``S(z) = z / (1 + exp(-z))``."""
    return z * _sigmoid(z)


def swish_prime(z: np.ndarray) -> np.ndarray:
    """``S'(z) = sigma(z) (1 + z (1 - sigma(z)))`` (the paper's ``S'``)."""
    s = _sigmoid(z)
    return s * (1.0 + z * (1.0 - s))


def one_hot(Y: np.ndarray, L: int) -> np.ndarray:
    """Integer labels ``0..L-1`` to one-hot rows; one-hot rows pass through."""
    Y = np.asarray(Y)
    if Y.ndim == 2:
        if Y.shape[1] != L:
            raise ValueError(f"one-hot labels must have {L} columns, got {Y.shape[1]}")
        return Y.astype(float)
    labels = Y.astype(np.int64)
    if labels.size and (labels.min() < 0 or labels.max() >= L):
        raise ValueError(f"labels must be in 0..{L - 1}, got {labels.min()}..{labels.max()}")
    out = np.zeros((labels.size, L))
    out[np.arange(labels.size), labels] = 1.0
    return out


class SwishMLP(FeatureSplitLoss):
    """``P``-``J``-``L`` MLP without biases, swish hidden layer, softmax cross-entropy.

    Parameters
    ----------
    P : int
        Input features.
    J : int
        Hidden units (the paper: 128).
    L : int
        Classes (labels ``0..L-1`` or one-hot rows).
    init_scale : float
        Standard deviation of the initial weights times ``1/sqrt(fan-in)``.
    """

    def __init__(self, P: int, J: int = 128, L: int = 10, init_scale: float = 1.0):
        self.P, self.J, self.L = int(P), int(J), int(L)
        if min(self.P, self.J, self.L) < 1:
            raise ValueError(f"P, J, L must be positive, got {(P, J, L)}")
        self.dim = self.J * (self.P + self.L)
        self.n_inputs = self.P
        self.init_scale = float(init_scale)

    # -- layout ------------------------------------------------------------------------------
    def unpack(self, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(W0 (L, J), W1 (J, P))`` views of ``w``."""
        w = np.asarray(w, dtype=float)
        if w.shape != (self.dim,):
            raise ValueError(f"w must have shape ({self.dim},), got {w.shape}")
        k = self.L * self.J
        return w[:k].reshape(self.L, self.J), w[k:].reshape(self.J, self.P)

    def pack(self, W0: np.ndarray, W1: np.ndarray) -> np.ndarray:
        return np.concatenate([np.ravel(W0), np.ravel(W1)])

    def init(self, seed: int = 0) -> np.ndarray:
        rng = np.random.default_rng(seed)
        W0 = rng.normal(scale=self.init_scale / np.sqrt(self.J), size=(self.L, self.J))
        W1 = rng.normal(scale=self.init_scale / np.sqrt(self.P), size=(self.J, self.P))
        return self.pack(W0, W1)

    # -- forward / backward ------------------------------------------------------------------
    def _forward(self, W0, W1, X):
        A = np.asarray(X, dtype=float) @ W1.T  # (B, J)
        S = swish(A)
        Z = S @ W0.T  # (B, L)
        Z = Z - Z.max(axis=1, keepdims=True)
        logQ = Z - np.log(np.exp(Z).sum(axis=1, keepdims=True))
        return A, S, logQ

    def values(self, w, X, Y):
        W0, W1 = self.unpack(w)
        _, _, logQ = self._forward(W0, W1, X)
        return -(one_hot(Y, self.L) * logQ).sum(axis=1)

    def value_and_grad(self, w, X, Y):
        W0, W1 = self.unpack(w)
        return self._value_grad(W0, W1, np.asarray(X, dtype=float), one_hot(Y, self.L))

    def _value_grad(self, W0, W1, X, Yh):
        A, S, logQ = self._forward(W0, W1, X)
        G = np.exp(logQ) - Yh  # Q - y, (B, L)
        a_bar = G.T @ S  # sum_n a_bar_n, (L, J)
        dA = (G @ W0) * swish_prime(A)  # (B, J)
        b_bar = dA.T @ X  # sum_n b_bar_n, (J, P)
        return float(-(Yh * logQ).sum()), self.pack(a_bar, b_bar)

    def per_sample(self, w, X, Y) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per-sample ``(c, a_bar, b_bar)``: loss ``-sum_l y log Q`` (the paper's ``c_bar`` up
        to its sign, notes 3.6), ``(B, L, J)`` and ``(B, J, P)`` gradients."""
        W0, W1 = self.unpack(w)
        X = np.asarray(X, dtype=float)
        Yh = one_hot(Y, self.L)
        A, S, logQ = self._forward(W0, W1, X)
        G = np.exp(logQ) - Yh
        a_bar = G[:, :, None] * S[:, None, :]
        dA = (G @ W0) * swish_prime(A)
        b_bar = dA[:, :, None] * X[:, None, :]
        return -(Yh * logQ).sum(axis=1), a_bar, b_bar

    def predict(self, w, X):
        W0, W1 = self.unpack(w)
        return np.argmax(self._forward(W0, W1, X)[2], axis=1)

    # -- the feature-based structure -----------------------------------------------------------
    def split(self, blocks: Sequence[np.ndarray]) -> list[np.ndarray]:
        """``[idx(W0), idx(W1[:, P_1]), ..., idx(W1[:, P_I])]`` for column blocks ``P_i``
        (a partition of ``0..P-1``)."""
        cols = np.concatenate([np.asarray(b, dtype=np.int64) for b in blocks])
        if sorted(cols.tolist()) != list(range(self.P)):
            raise ValueError(f"the feature blocks must partition the {self.P} input columns")
        k = self.L * self.J
        out = [np.arange(k)]
        rows = np.arange(self.J)[:, None] * self.P
        for b in blocks:
            out.append((k + rows + np.asarray(b, dtype=np.int64)[None, :]).ravel())
        return out

    def h(self, w_i, Z_i):
        W1_i = np.asarray(w_i, dtype=float).reshape(self.J, -1)
        return np.asarray(Z_i, dtype=float) @ W1_i.T

    def top(self, w_0, H, Y):
        W0 = np.asarray(w_0, dtype=float).reshape(self.L, self.J)
        Yh = one_hot(Y, self.L)
        S = swish(H)
        Z = S @ W0.T
        Z = Z - Z.max(axis=1, keepdims=True)
        logQ = Z - np.log(np.exp(Z).sum(axis=1, keepdims=True))
        G = np.exp(logQ) - Yh
        dH = (G @ W0) * swish_prime(H)
        return float(-(Yh * logQ).sum()), (G.T @ S).ravel(), dH

    def block_grad(self, w_i, Z_i, dH):
        return (dH.T @ np.asarray(Z_i, dtype=float)).ravel()

    def h_jacobian(self, w_i, Z_i):
        """``dh_i / dW1_i = z_{n,i}``: the raw features (footnote 16 of the paper)."""
        return np.asarray(Z_i, dtype=float)

    def top_correct(self, w_0, H, labels):
        W0 = np.asarray(w_0, dtype=float).reshape(self.L, self.J)
        return int(np.sum(np.argmax(swish(H) @ W0.T, axis=1) == np.asarray(labels)))
