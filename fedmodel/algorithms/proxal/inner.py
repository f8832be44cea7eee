"""What one inner solve of prox-al returns to the outer loop (Algorithm 2, the federated
(quasi-)Newton loop of :mod:`~fedmodel.algorithms.proxal.newton_inner` or exact-admm of
:mod:`~fedmodel.algorithms.proxal.exact_admm`): its own module, so the inner solvers and the
server half that calls them import it without importing each other."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class InnerOutcome:
    """Result of one inner solve (Algorithm 2, or Newton with its measured gradient).

    Examples
    --------
    >>> import numpy as np
    >>> out = InnerOutcome(np.zeros(2), iterations=3, bound=1e-4, satisfied=True,
    ...                    server_residual=0.0)
    >>> out.satisfied, out.timed_out
    (True, False)
    """

    w: np.ndarray
    iterations: int
    bound: float  # eps_{t+1} + sum_i eps~_i: bounds dist_inf(0, d l_k(w)) (Theorem 4.1)
    satisfied: bool
    server_residual: float
    timed_out: bool = False
    stalled: bool = False
    gradient: np.ndarray | None = None  # grad l_k(w), measured (Newton)
