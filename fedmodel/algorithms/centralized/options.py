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
        How the pooled problem is solved. ``"cvxpy"``: one Clarabel solve at tight
        tolerances (cvxpy's choice when ``solver`` names another), refined by cprox-al when
        not certified. ``"smooth"``: the smooth exact path, cprox-al on the pooled problem
        with Newton subproblems (Newton-CG on Hessian-vector products above 3000 variables)
        and a large penalty (beta = 1e5), started from ``w = 0``; needs every term to have a
        gradient. ``"auto"`` (default): ``"smooth"`` when every term is of GLM form
        (logistic, exp, huber, squares, quadratic forms, affine), ``h`` is smooth, the model
        has no epigraph auxiliaries (hinge, abs, pinball, l1: an LP/QP in disguise, which
        Clarabel takes in a few dozen iterations), is not a QP with affine inequalities
        whose data has a direct form (``direct``: Clarabel is faster there) and is not a
        QCQP (a linear or quadratic
        objective with quadratic constraints: an SOCP for Clarabel) -- smooth
        non-quadratic terms would need the exponential cone, where Clarabel fails on UCI
        Adult and did not finish at d = 10,000 -- falling back to Clarabel if the smooth
        path does not certify; otherwise Clarabel at tolerances ``1e-6 * eps`` (within
        [1e-12, 1e-8]), its point certified, then (not certified) the smooth path where it
        applies or a cprox-al refinement.
    solver : str or None
        cvxpy solver (default: Clarabel at the tolerances of ``engine``; another name
        is used at its own defaults).
    refine : bool
        When cvxpy's answer is not certified to ``eps``, refine it with cprox-al started
        from cvxpy's primal and dual values.
    solver_options : dict
        Passed to ``cvxpy.Problem.solve``.
    time_limit : float or None
        Wall-clock seconds for the whole solve: the smooth exact path (checked inside every
        Newton and CG iteration), the conic solve and the refinement, each stage getting
        what the earlier ones left. On the direct route (``direct``) the data is built in
        milliseconds and Clarabel is stopped between iterations when its last one says
        the next would end after the deadline. Through cvxpy, building the pooled problem
        and cvxpy's compile of it cannot be interrupted: the remaining time is checked
        after them, and a compile that outlasted the limit ends the solve with status
        ``"time_limit"`` and no point; Clarabel, OSQP and SCS get what is left as their
        own limit. The smallest limit a solve holds is its compile, the solver's first
        iteration and the certificate (``extra["time_limit_floor"]``, seconds from
        ``model.solve``'s start): a smaller limit ends there, with status ``"time_limit"``
        and a message saying so.
    blas_threads : int or None
        OpenBLAS threads during the solve (default 1; ``None`` leaves the setting alone).
    direct : bool
        Clarabel is called on data built from the package's own forms of the terms
        (:mod:`fedmodel.algorithms.centralized.direct`: affine, GLM and cone pieces), with
        no cvxpy compile, where every piece has such a form (default); ``False``, or a
        model with another piece (a quadratic constraint, ``kl_div``, a PSD cone): the
        pooled problem is compiled by cvxpy.
    """

    eps: float = 1e-6
    engine: str = "auto"
    solver: str | None = None
    refine: bool = True
    solver_options: dict = field(default_factory=dict)
    time_limit: float | None = None
    blas_threads: int | None = 1
    direct: bool = True

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
