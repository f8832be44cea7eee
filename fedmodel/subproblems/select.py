"""Choose a backend for a merit problem.

``"auto"`` picks, in order: the closed form when the problem has no party terms (the
server's averaging + prox step); L-BFGS-B on values and gradients otherwise, unless ``h``
contains a group norm, in which case cvxpy. ``solver=`` overrides the choice.
"""

from __future__ import annotations

from fedmodel.errors import UnsupportedError
from fedmodel.subproblems.closed_form import ProxSolver
from fedmodel.subproblems.cvxpy_backend import CvxpySolver
from fedmodel.subproblems.merit import MeritProblem
from fedmodel.subproblems.quasi_newton import QuasiNewtonSolver

BACKENDS = ("auto", "lbfgs", "cvxpy")


def make_solver(problem: MeritProblem, solver: str = "auto"):
    """Return a backend object with ``solve(x0, tol, max_iter) -> SolveReport``."""
    if solver not in BACKENDS:
        raise UnsupportedError(f"unknown subproblem solver {solver!r}; choose one of {BACKENDS}")
    if not problem.has_smooth_terms:
        return ProxSolver(problem)
    has_group_norm = any(p.l2 for p in problem.regularizer.pieces)
    if solver == "cvxpy" or (solver == "auto" and has_group_norm):
        return CvxpySolver(problem)
    return QuasiNewtonSolver(problem)
