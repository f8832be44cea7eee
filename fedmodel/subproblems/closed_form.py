"""Closed-form backend: ``phi(x) = (sigma/2)||x - center||^2 + h(x)``, solved by h's prox.

This is the server step (14) of seed 000 when the server holds no constraint and no
objective term: an average of the clients' ``u~_i`` (and the proximal centre) followed by
the prox of ``h``.
"""

from __future__ import annotations

import numpy as np

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
        x = (
            p.regularizer.prox(p.center, 1.0 / p.sigma)
            if not p.regularizer.is_zero
            else p.center.copy()
        )
        return SolveReport(x, p.residual(x), tol, 1, self.name)
