"""Safeguarded type-II Anderson acceleration of the inner ADMM (Algorithm 2), federated.

Algorithm 2 is a fixed-point iteration ``x^{t+1} = T(x^t)`` on ``x = (u~_i, lambda_i)_i``:
the server's step (14) reads only the ``u~_i``, each client's step (15)-(17) reads ``w``
and its own ``lambda_i``. Type-II Anderson acceleration (Walker, Ni 2011; as in SCS 3 and
a2dr: Fu, Zhang, Boyd 2020) replaces the next input by the combination
``sum_j alpha_j T(x^j)`` of the last ``m + 1`` outputs whose residuals
``g^j = T(x^j) - x^j`` combine to the smallest norm (``sum_j alpha_j = 1``).

Federated, nobody holds ``x``: each client keeps its own outputs and residual blocks and
sends, with its reply, the inner products of its newest residual block with its stored
ones (``m + 1`` numbers, scaled ``lambda_i / rho_i`` so both halves are in the units of
``w``). The server sums them into the Gram matrix of the global residuals, solves for
``alpha`` (:func:`anderson_weights`), combines the ``u~_i`` it received the same way for
its step (14), and sends ``alpha`` with ``w``; each client combines its own
``(u~_i, lambda_i)`` with the same weights before its step.

Safeguard (:class:`AndersonState`): an accelerated input is kept only if the residual
``||T(x) - x||`` it produces is smaller (by 0.1%) than the residual of the last accepted input;
otherwise the iteration falls back to the plain output ``T`` of that input (the step
Algorithm 2 would have taken) and the memory is cleared. Plain ADMM steps of a convex
problem never increase this residual (``T`` is firmly nonexpansive in the scaled norm), so
the residual at accepted inputs is non-increasing.

Examples
--------
>>> import numpy as np
>>> G = np.array([[4.0, 1.0], [1.0, 1.0]])  # Gram matrix of two residuals
>>> alpha = anderson_weights(G)
>>> bool(np.isclose(alpha.sum(), 1.0)), bool(alpha @ G @ alpha <= 1.0)
(True, True)
"""

from __future__ import annotations

import numpy as np

#: relative Tikhonov regularisation of the Gram matrix (as in a2dr)
REGULARIZATION = 1e-10
#: an accelerated input must reduce the residual by this fraction to be kept (a constant
#: residual, as when the iterates run off to infinity, is no reason to extrapolate)
SUFFICIENT_DECREASE = 1e-3
#: weights larger than this in magnitude mean a degenerate least-squares problem: step plainly
MAX_WEIGHT = 1e4


def anderson_weights(gram: np.ndarray) -> np.ndarray | None:
    """The ``alpha`` minimising ``||sum_j alpha_j g^j||^2 = alpha^T G alpha`` subject to
    ``sum_j alpha_j = 1`` (``G`` the Gram matrix of the residuals), or None when the
    problem is degenerate (then a plain step is taken)."""
    k = gram.shape[0]
    if k < 2:
        return None
    scale = max(float(np.trace(gram)) / k, 1e-300)
    try:
        z = np.linalg.solve(gram + REGULARIZATION * scale * np.eye(k), np.ones(k))
    except np.linalg.LinAlgError:
        return None
    total = float(z.sum())
    if not np.isfinite(total) or abs(total) < 1e-300:
        return None
    alpha = z / total
    if not np.all(np.isfinite(alpha)) or np.abs(alpha).max() > MAX_WEIGHT:
        return None
    return alpha


class AndersonState:
    """The server's side of the acceleration for one run of Algorithm 2.

    Call :meth:`observe` with the summed Gram row of each round's replies (the inner
    products of the newest global residual with the stored ones); it returns what the
    next round's input is: ``(alpha, reset)`` where ``alpha`` weights the last
    ``len(alpha)`` outputs (empty: the last output as it is, a plain step) and ``reset``
    clears the memory after the input is formed.

    Attributes
    ----------
    residuals : list of float
        ``||T(x) - x||`` at every input, in order.
    accepted : list of bool
        Whether each input was accepted (plain inputs always are).
    """

    def __init__(self, memory: int):
        self.memory = int(memory)
        self.gram = np.zeros((0, 0))
        self.ref = np.inf  # residual norm of the last accepted input
        self.pending = False  # the current input is an accelerated one, not yet checked
        self.residuals: list[float] = []
        self.accepted: list[bool] = []
        self.rejections = 0

    def get_state(self) -> dict:
        """The memory's state, as plain values and arrays."""
        return dict(vars(self))

    def set_state(self, state: dict) -> None:
        vars(self).update(state)

    def observe(self, row: np.ndarray, changed: bool = False) -> tuple[np.ndarray, bool]:
        """Take this round's Gram row; return ``(alpha, reset)`` for the next input.

        ``changed``: the map ``T`` changed (a client changed its rho): restart from the
        last output with an empty memory.
        """
        row = np.asarray(row, dtype=float)
        k = row.size
        old = self.gram[-(k - 1) :, -(k - 1) :] if k > 1 else np.zeros((0, 0))
        gram = np.zeros((k, k))
        gram[: k - 1, : k - 1] = old
        gram[-1, :] = row
        gram[:, -1] = row
        self.gram = gram
        norm = float(np.sqrt(max(row[-1], 0.0)))
        self.residuals.append(norm)
        if changed:
            self.accepted.append(not self.pending)
            self._clear()
            return np.zeros(0), True
        if self.pending and norm > (1.0 - SUFFICIENT_DECREASE) * self.ref:
            # safeguard: the accelerated input made the residual grow; take the plain
            # step from the last accepted input instead (its output is the one before)
            self.accepted.append(False)
            self.rejections += 1
            self._clear()
            return np.array([1.0, 0.0]), True
        self.accepted.append(True)
        self.ref = norm
        alpha = anderson_weights(self.gram)
        self.pending = alpha is not None
        return (np.zeros(0), False) if alpha is None else (alpha, False)

    def _clear(self) -> None:
        self.gram = np.zeros((0, 0))
        self.pending = False
