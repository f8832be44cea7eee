"""Closed-form backend: ``phi(x) = (sigma/2)||x - center||^2 + h(x)``, solved by h's prox.

This is the server step (14) of seed 000 when the server holds no constraint and no
objective term: an average of the clients' ``u~_i`` (and the proximal centre) followed by
the prox of ``h``.
"""

from __future__ import annotations

import numpy as np

from fedmodel.errors import UnsupportedError
from fedmodel.subproblems.merit import MeritProblem, SolveReport


class ProxSolver:
    """Exact solve of a merit problem that has no smooth party terms."""

    name = "closed-form"

    def __init__(self, problem: MeritProblem):
        if problem.has_smooth_terms:
            raise ValueError("ProxSolver needs a problem without party terms")
        self.problem = problem

    def solve(self, x0: np.ndarray, tol: float, max_iter: int = 1) -> SolveReport:
        p = self.problem
        reg = p.regularizer
        if reg.is_zero:
            x = p.center.copy()
        elif np.ndim(p.sigma) == 2:  # a full metric: closed form for a sum of squares only
            if not reg.is_smooth:
                raise UnsupportedError(
                    "the prox of a nonsmooth h under a full (non-diagonal) metric has no "
                    "closed form; use a scalar ADMM penalty (penalty_metric='scalar')"
                )
            S = p.sigma + np.diag(reg.smooth_grad(np.ones(p.n)))  # + Hessian of h
            x = np.linalg.solve(S, p.sigma @ p.center)
        else:
            x = reg.prox(p.center, 1.0 / p.sigma)
        return SolveReport(x, p.residual(x), tol, 1, self.name)
