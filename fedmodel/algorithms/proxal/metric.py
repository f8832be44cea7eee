"""The metric of a client's ADMM penalty in prox-al's Algorithm 2.

Algorithm 2 couples client ``i`` to the server with ``<lambda_i, u_i - w> + (rho_i/2)
||u_i - w||^2``. Any fixed symmetric positive definite ``M_i`` may replace the identity in
that norm, ``(rho_i/2) (u_i - w)^T M_i (u_i - w)``: it is Algorithm 2 applied to the
equivalent coupling ``M_i^(1/2) u_i = M_i^(1/2) w`` (scaled consensus constraints; Giselsson
and Boyd, "Metric selection in fast dual forward-backward splitting", Automatica 2015;
"Diagonal scaling in Douglas-Rachford splitting and ADMM", CDC 2014), so its convergence
theory and the bound (19) hold unchanged. With ``M_i`` the Hessian of the client's own
``P_{i,k}`` at the start of the run (``penalty_metric="hessian"``), the consensus is as well
conditioned as the subproblem allows: on a quadratic ``P_{i,k}`` the server's step is then
an exact Newton step on the sum, and Algorithm 2 ends in a few rounds however flat or stiff
(augmented-Lagrangian terms) the parties' functions are.

:class:`PenaltyMetric` is that ``M_i`` with the operations the two halves need.
"""

from __future__ import annotations

import numpy as np
from scipy.linalg import blas, cho_factor

from fedmodel.subproblems.newton import solve_upper


class PenaltyMetric:
    """A symmetric positive definite ``M`` on the shared variables (the identity when
    ``matrix`` is None), factored once.

    Parameters
    ----------
    n : int
        Dimension.
    matrix : ndarray, optional
        ``M`` (n x n). Must be positive definite (its Cholesky factor is computed here).
    source : ndarray, optional
        What ``M`` was built from (a Hessian), to decide later whether to rebuild it.

    Examples
    --------
    >>> m = PenaltyMetric(2, np.array([[4.0, 0.0], [0.0, 1.0]]))
    >>> m.times(np.ones(2)), m.solve(np.ones(2))
    (array([4., 1.]), array([0.25, 1.  ]))
    """

    def __init__(self, n: int, matrix: np.ndarray | None = None, source=None):
        self.n = int(n)
        self.source = source
        self.matrix = None
        self.upper = None  # M = U^T U, U in the upper triangle (LAPACK potrf)
        if matrix is not None:
            M = np.asarray(matrix, dtype=float)
            self.matrix = 0.5 * (M + M.T)
            self.upper = cho_factor(self.matrix, lower=False, check_finite=False)[0]
        self._freeze()

    def _freeze(self) -> None:
        # read-only after construction: state snapshots (retried steps) share the arrays
        for a in (self.matrix, self.upper, self.source):
            if isinstance(a, np.ndarray):
                a.setflags(write=False)

    def __deepcopy__(self, memo) -> PenaltyMetric:
        return self

    def to_state(self) -> dict:
        """The metric as plain values and arrays (a client's state, checkpoints).

        >>> m = PenaltyMetric(2, np.array([[4.0, 0.0], [0.0, 1.0]]))
        >>> PenaltyMetric.from_state(m.to_state()).solve(np.ones(2))
        array([0.25, 1.  ])
        """
        return {"n": self.n, "matrix": self.matrix, "upper": self.upper, "source": self.source}

    @classmethod
    def from_state(cls, state: dict) -> PenaltyMetric:
        """The metric of a :meth:`to_state` result (its factor taken as it is, so a
        restored run repeats the same iterates bit for bit)."""
        m = cls(int(state["n"]))

        def arr(key: str) -> np.ndarray | None:
            v = state.get(key)
            return None if v is None else np.array(v, dtype=float)

        m.matrix, m.upper, m.source = arr("matrix"), arr("upper"), arr("source")
        if (m.matrix is None) != (m.upper is None):
            raise ValueError("a penalty metric state needs both its matrix and its factor")
        m._freeze()
        return m

    @property
    def is_identity(self) -> bool:
        return self.matrix is None

    def times(self, v: np.ndarray) -> np.ndarray:
        """``M v``."""
        return v if self.matrix is None else self.matrix @ v

    def solve(self, v: np.ndarray) -> np.ndarray:
        """``M^(-1) v``."""
        return v if self.matrix is None else solve_upper(self.upper, v)

    def root(self, v: np.ndarray) -> np.ndarray:
        """``U v`` with ``M = U^T U``: ``||root(v)|| = (v^T M v)^(1/2)``."""
        return v if self.matrix is None else blas.dtrmv(self.upper, v)

    def inverse_root(self, v: np.ndarray) -> np.ndarray:
        """``U^(-T) v``: ``||inverse_root(v)|| = (v^T M^(-1) v)^(1/2)``."""
        return v if self.matrix is None else blas.dtrsv(self.upper, v, trans=1)


def shifted_solver(metric: PenaltyMetric, shift: float, rho: float):
    """``v -> (shift I + rho M)^(-1) v`` (one Cholesky factorisation)."""
    if metric.is_identity:
        return lambda v: v / (shift + rho)
    S = rho * metric.matrix
    S[np.diag_indices_from(S)] += shift
    upper = cho_factor(S, lower=False, check_finite=False)[0]
    return lambda v: solve_upper(upper, v)


def hessian_metric(H: np.ndarray, floor: float) -> PenaltyMetric:
    """:class:`PenaltyMetric` of a (generalised) Hessian ``H`` (only its upper triangle is
    read), made positive definite by adding ``floor * max(diag H)`` (more if Cholesky still
    fails); the identity when ``H`` has no positive diagonal."""
    n = H.shape[0]
    U = np.triu(H)
    M = U + np.triu(U, 1).T
    top = float(np.max(np.diag(M), initial=0.0))
    if not np.isfinite(top) or top <= 0:
        return PenaltyMetric(n)
    shift = floor * top
    for _ in range(8):
        try:
            return PenaltyMetric(n, M + shift * np.eye(n), source=H)
        except np.linalg.LinAlgError:  # (scipy's LinAlgError is numpy's)
            shift *= 100.0
    return PenaltyMetric(n)
