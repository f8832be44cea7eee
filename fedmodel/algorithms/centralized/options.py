"""Options of ``centralized``: the pooled problem solved exactly and certified."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fedmodel.errors import ModelError, UnsupportedError

#: how the pooled problem is solved (``CentralizedOptions.engine``)
ENGINES = ("auto", "cvxpy", "smooth")


@dataclass
class CentralizedOptions:
    """Options of ``centralized``: the pooled problem solved exactly and certified.

    Attributes
    ----------
    eps : float
        KKT tolerance the certificate must meet for status ``"optimal"``.
    engine : {"auto", "cvxpy", "smooth"}
        How the pooled problem is solved. ``"cvxpy"``: one cvxpy solve (then refined when
        not certified). ``"smooth"``: the smooth exact path, cprox-al on the pooled problem
        with Newton (or L-BFGS) subproblems and a large penalty (beta = 1e5), started from
        ``w = 0``; needs every term to have a gradient. ``"auto"`` (default): ``"smooth"``
        when every term is of GLM form (the Newton backend applies), the model has at most
        3000 variables (Newton factors a dense Hessian) and no epigraph auxiliaries (hinge,
        abs, pinball, l1: those go to Clarabel directly) -- smooth non-quadratic terms
        (logistic, exp, huber, ...) would need the exponential cone, where Clarabel fails
        and ECOS/SCS are slow and inexact on UCI Adult, and a QP takes a few cached
        Cholesky factorisations, faster than building the cvxpy problem -- falling back to
        cvxpy if the smooth path does not certify; ``"cvxpy"`` otherwise (Clarabel at
        tolerances ``1e-6 * eps`` on epigraph and conic models; cvxpy's choice, sparse, on
        large smooth models).
    solver : str or None
        cvxpy solver (default: cvxpy's choice, OSQP for QPs, Clarabel for conic models).
    refine : bool
        When cvxpy's answer is not certified to ``eps``, refine it with cprox-al started
        from cvxpy's primal and dual values.
    solver_options : dict
        Passed to ``cvxpy.Problem.solve``.
    time_limit : float or None
        Wall-clock seconds for the whole solve: the smooth exact path, the cvxpy solve
        (Clarabel, OSQP and SCS get the remaining time as their own limit; cvxpy's compile
        of the pooled problem is not interrupted) and the refinement.
    blas_threads : int or None
        OpenBLAS threads during the solve (default 1; ``None`` leaves the setting alone).
    """

    eps: float = 1e-6
    engine: str = "auto"
    solver: str | None = None
    refine: bool = True
    solver_options: dict = field(default_factory=dict)
    time_limit: float | None = None
    blas_threads: int | None = 1

    def validate(self, compiled: Any, method: str) -> None:
        """The engine, and a convex model (cvxpy needs DCP)."""
        if compiled.nonconvex:
            raise UnsupportedError(
                "method='centralized' solves the pooled problem with cvxpy, which needs a "
                "convex (DCP) model; this model has terms declared with allow_nonconvex=True. "
                "Use method='cprox-al' as the centralized reference (as seed 000 does)."
            )
        if self.engine not in ENGINES:
            raise ModelError(
                f"unknown engine {self.engine!r} for method 'centralized'; choose one of {ENGINES}"
            )
