"""Choose a backend for a merit problem.

``"auto"`` picks, in order:

1. the closed form when the problem has no party terms (the server's averaging + prox);
2. Newton with exact (generalised) Hessians when every term is of GLM form (sums of
   logistic/exp/square/huber of affine maps, quadratic forms, affine terms) and ``h`` is
   smooth -- the usual case for client subproblems;
3. an exact box-constrained QP when the terms are quadratic with equality constraints only
   and ``h`` is bounds and sums of squares (:mod:`fedmodel.subproblems.box_qp`);
4. L-BFGS-B on values and gradients (any smooth term; box and l1 parts of ``h`` exactly);
5. cvxpy (convex) or accelerated proximal gradient (non-convex) when ``h`` has a group norm.

A program with cone constraints (a term with no smooth form, :mod:`fedmodel.dsl.conic`)
always takes cvxpy: the conic path.

``solver=`` overrides the choice; ``"newton-cg"`` (never picked by ``"auto"``) is Newton
with conjugate-gradient steps on Hessian-vector products, for GLM-form problems with too
many variables for a dense Hessian (:mod:`fedmodel.subproblems.newton_cg`).
"""

from __future__ import annotations

from fedmodel.compiler.glm import NotRecognised
from fedmodel.errors import UnsupportedError
from fedmodel.subproblems.box_qp import BoxQuadraticSolver
from fedmodel.subproblems.closed_form import ProxSolver
from fedmodel.subproblems.cvxpy_backend import CvxpySolver
from fedmodel.subproblems.merit import MeritProblem
from fedmodel.subproblems.newton import NewtonSolver
from fedmodel.subproblems.proximal_gradient import ProximalGradientSolver
from fedmodel.subproblems.quasi_newton import QuasiNewtonSolver

BACKENDS = ("auto", "newton", "newton-cg", "lbfgs", "cvxpy")


def make_solver(problem: MeritProblem, solver: str = "auto", direct: bool = False):
    """Return a backend object with ``solve(x0, tol, max_iter) -> SolveReport``; ``direct``:
    a cvxpy backend calls Clarabel on the compiled data (``CvxpySolver(direct=True)``)."""
    if solver not in BACKENDS:
        raise UnsupportedError(f"unknown subproblem solver {solver!r}; choose one of {BACKENDS}")
    if problem.has_cones:
        if solver not in ("auto", "cvxpy"):
            where = [f"{p.name}: {p.cones[0].label}" for p in problem.programs if p.cones]
            raise UnsupportedError(
                f"subproblem solver {solver!r} cannot take cone constraints ({', '.join(where)}: "
                "terms with no smooth form); they are solved exactly by solver='cvxpy' "
                "(the default 'auto' picks it)"
            )
        return CvxpySolver(problem, direct=direct)
    if not problem.has_smooth_terms:
        return ProxSolver(problem)
    # a group norm, a norm ball or a matrix norm in h: no bounds/splitting form for L-BFGS-B
    has_group_norm = any(p.couples for p in problem.regularizer.pieces)
    if solver == "cvxpy":
        return CvxpySolver(problem, direct=direct)
    if solver == "newton-cg":  # (never chosen by "auto": the large pooled problems' backend)
        from fedmodel.subproblems.newton_cg import NewtonCGSolver

        try:
            return NewtonCGSolver(problem)
        except NotRecognised as exc:
            raise UnsupportedError(
                f"the Newton-CG backend needs GLM-form terms and a smooth h ({exc}); use "
                "solver='lbfgs' or 'cvxpy'"
            ) from exc
    if solver in ("auto", "newton"):
        try:
            return NewtonSolver(problem)
        except NotRecognised as exc:
            try:  # (quadratic terms over a box: one exact box-constrained QP)
                return BoxQuadraticSolver(problem)
            except NotRecognised:
                pass
            if solver == "newton":
                raise UnsupportedError(
                    f"the Newton backend needs GLM-form terms and a smooth h ({exc}); use "
                    "solver='lbfgs' or 'cvxpy'"
                ) from exc
    if has_group_norm:
        if any(p.nonconvex for p in problem.programs):
            return ProximalGradientSolver(problem)
        return CvxpySolver(problem, direct=direct)
    return QuasiNewtonSolver(problem)
