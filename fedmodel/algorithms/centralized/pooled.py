"""centralized: the pooled problem solved exactly, certified like every other method.

This is the reference a federated answer is compared with, so it is not trusted blindly:
its KKT residuals are recomputed from the returned primal and dual values.

Two engines (``CentralizedOptions.engine``):

* cvxpy: one solve of the pooled problem. When cvxpy's status or the residuals fall short
  of ``eps``, the result says so, and (``refine=True``, the default) cprox-al refines the
  point starting from cvxpy's primal and dual values.
* the smooth exact path: cprox-al on the pooled problem with a large penalty and Newton
  subproblems. ``engine="auto"`` takes it for smooth GLM models with a non-quadratic term
  (logistic Neyman-Pearson on UCI Adult: Clarabel fails there, ECOS stops inexact, SCS
  takes minutes) and for QPs, both up to :data:`SMOOTH_MAX_SIZE` variables (the
  augmented-Lagrangian Hessian of a QP changes only with the active set, so two or three
  cached Cholesky factorisations certify it, about 10x faster than building and solving the
  cvxpy problem on seed 000 Table 1), and falls back to cvxpy if it does not certify.
  Models with epigraph auxiliaries (non-smooth terms rewritten by ``dsl/epigraph.py``) and
  conic models go to the conic solver directly, and so do QPs with affine inequalities
  (:attr:`Route.constrained_qp`) when their data has a direct form.

Clarabel is called on data built from the package's own forms of the terms
(:mod:`fedmodel.algorithms.centralized.direct`: affine maps, GLM terms, cone blocks, ``h``)
wherever every piece has one, with no cvxpy compile (``direct=True``, the default); cvxpy
compiles the pooled problem otherwise (a parameter, huber, a PSD cone, another solver).
"""

from __future__ import annotations

import time
import warnings
from dataclasses import replace

import cvxpy as cp
import numpy as np
from cvxpy.reductions.solvers.defines import INSTALLED_SOLVERS

from fedmodel.algorithms.centralized.cprox_al import (
    evaluation_seconds,
    model_objective_scale,
    pooled_evaluation,
    run_cprox_al,
)
from fedmodel.algorithms.centralized.direct import NotDirect, build_conic_data, solve_direct
from fedmodel.algorithms.centralized.options import ENGINES, CentralizedOptions  # noqa: F401
from fedmodel.algorithms.common import conic_note, make_result, split_multipliers
from fedmodel.algorithms.options import SOLVE_STARTED
from fedmodel.algorithms.proxal.options import CProxALOptions
from fedmodel.cached import cached_property
from fedmodel.certificate.auxiliary import (
    auxiliary_rows,
    balance_piece_multipliers,
    minimize_auxiliaries,
)
from fedmodel.compiler.glm import NotRecognised
from fedmodel.compiler.partition import CompiledModel
from fedmodel.errors import UnsupportedError
from fedmodel.subproblems.cvxpy_backend import SOLVER_TIME_LIMIT
from fedmodel.subproblems.merit import MeritProblem
from fedmodel.subproblems.newton import DENSE_NEWTON_MAX_SIZE, NewtonSolver

# Below this (relative to the largest multiplier) a conic solver's dual value is read as
# an inactive constraint's zero: interior-point duals of inactive constraints are ~1e-10,
# not 0, and Definition 1 would otherwise charge the full slack |c_j| to them.
DUAL_ZERO = 1e-8


def pooled_problem(compiled: CompiledModel, objective_scale: float = 1.0):
    """The pooled cvxpy problem, its objective divided by ``objective_scale`` (the
    certificate's ``S``, :mod:`fedmodel.certificate.scale`: the solver's tolerances then
    apply on the scale the certificate judges; its duals are ``1/S`` times the model's),
    and, per party, its inequality and equality constraints and cone constraints (terms
    with no smooth form, :mod:`fedmodel.dsl.conic`)."""
    layout = compiled.layout
    reg = compiled.regularizer
    obj = sum((p.objective_expr() for p in compiled.parties), start=0)
    if not reg.is_zero:
        by_slice = {(s.start, s.stop): v for v in layout.variables for s in [layout.slice_of(v)]}
        var_exprs = [cp.vec(by_slice[(s.start, s.stop)], order="F") for s in reg.slices]
        h, box = reg.cvxpy_parts(var_exprs)
        obj = obj + h
    else:
        box = []
    per_party = []
    cons = list(box)
    for p in compiled.parties:
        ineq = [cp.vec(c.expr, order="F") <= 0 for c in p.ineq]
        eq = [cp.vec(c.expr, order="F") == 0 for c in p.eq]
        cones = [c.source for c in p.cones]  # terms with no smooth form, in cone form
        per_party.append((ineq, eq, cones))
        cons += ineq + eq + cones
    if isinstance(obj, cp.Expression):
        objective = cp.Minimize(obj / objective_scale if objective_scale != 1.0 else obj)
    else:
        objective = cp.Minimize(0)
    return cp.Problem(objective, cons), per_party


#: cprox-al settings of the smooth exact path: a large beta makes the proximal point outer
#: loop contract fast (about 15 outer iterations on UCI Adult); Newton copes with the
#: conditioning it brings.
SMOOTH_BETA = 1e5

#: the share of ``time_limit`` (at most :data:`POST_RESERVE_MAX` seconds) a direct
#: Clarabel solve leaves to what follows it (the multiplier polish, the certificate, the
#: result), besides twice the data's build time
POST_RESERVE = 0.1
POST_RESERVE_MAX = 1.0
#: ... and this many evaluations of every party (the polish and the certificate's two)
POST_EVALUATIONS = 3


#: Clarabel's static regularisation of a second direct solve when the first's point does
#: not certify (its default is 1e-8)
DIRECT_RETRY_REGULARIZATION = 1e-10

#: Clarabel's gap and feasibility tolerances on epigraph and conic models, relative to
#: ``eps`` (:func:`conic_solver_settings`)
CONIC_TOLERANCE_FACTOR = 1e-6

#: Models up to this many variables take the smooth exact path with dense Newton steps (a
#: dense Hessian, O(size^3) per factorisation: at d = 10,000 one takes tens of seconds and
#: 800 MB); larger GLM models with a non-quadratic term take it with Newton-CG steps
#: (:mod:`fedmodel.subproblems.newton_cg`: Hessian-vector products, sparse data kept sparse)
SMOOTH_MAX_SIZE = DENSE_NEWTON_MAX_SIZE

#: above :data:`SMOOTH_MAX_SIZE`, the Newton backends stack the linear constraints densely:
#: the Newton-CG path is taken only while that stack has at most this many entries
LARGE_LINEAR_ENTRIES = 2e7


class Route:
    """What decides how ``centralized`` solves a model, each part computed once and only
    when asked (the GLM recognition behind :attr:`backend` takes 1.5 s on an epigraph
    model with 1,000 rows, which Clarabel solves first in 0.1 s).

    Attributes
    ----------
    smooth : bool
        Every term is continuously differentiable (the certificate applies).
    backend : str or None
        The subproblem backend of the smooth exact path: ``"newton"`` (dense Newton, at
        most :data:`SMOOTH_MAX_SIZE` variables), ``"newton-cg"`` (models whose nonlinear
        constraints are all quadratic, a ball or an ellipsoid: its second-order correction
        keeps Newton steps along the curved active constraint, logistic regression in a
        ball at d = 50 took 103 dense Newton steps and 3.9 s against 18 and 0.7 s; not
        with other nonlinear constraints, where CG pays for ill-conditioning: logistic
        Neyman-Pearson on Adult took 3x dense Newton's time; and larger models with a
        non-quadratic GLM term, e.g. sparse logistic regression at d = 10,000), or None
        when the path does not apply (a term without GLM form, a non-smooth ``h``, cone
        terms, a large QP: a sparse conic solver takes those).
    qcqp : bool
        A linear or quadratic objective with nonlinear constraints, all quadratic
        (Markowitz with per-client risk budgets): Clarabel takes it as an SOCP in a few
        dozen iterations (0.04 s on the Markowitz model), while the augmented Lagrangian's
        Newton steps stiffen on its bounds (0.17 s).
    """

    def __init__(self, compiled: CompiledModel):
        self.compiled = compiled

    @cached_property
    def smooth(self) -> bool:
        return _smooth(self.compiled)

    @property
    def backend(self) -> str | None:
        return self._glm[0]

    @property
    def qcqp(self) -> bool:
        return self._glm[1]

    @property
    def constrained_qp(self) -> bool:
        """A quadratic (or linear) objective with affine constraints, at least one of
        them an inequality: an LCQP, which Clarabel solves directly on its data in fewer
        milliseconds than the augmented Lagrangian's active-set changes need (LCQP, one
        client: 4.7 ms against 15.9 ms; five: 11 against 15; a plain Clarabel solve
        through cvxpy 7 and 20 ms)."""
        return self._glm[2]

    @cached_property
    def _glm(self) -> tuple[str | None, bool, bool]:
        compiled = self.compiled
        if not self.smooth or compiled.has_cones:
            return None, False, False
        size = compiled.layout.size
        if size > SMOOTH_MAX_SIZE:
            rows = sum(p.m_ineq + p.m_eq for p in compiled.parties)
            if rows * size > LARGE_LINEAR_ENTRIES:
                return None, False, False
        try:
            solver = NewtonSolver(MeritProblem(compiled.parties, 1.0, compiled.regularizer))
        except NotRecognised:
            return None, False, False
        nonlinear = solver.nonlin_in + solver.nonlin_eq
        quadratic = solver.obj.quadratic
        qcqp = quadratic and bool(nonlinear) and all(c.quadratic for *_, c in nonlinear)
        lcqp = quadratic and not nonlinear and any(p.m_ineq for p in compiled.parties)
        balls = bool(nonlinear) and all(c.quadratic for *_, c in nonlinear)
        if size <= SMOOTH_MAX_SIZE and not balls:
            return "newton", qcqp, lcqp
        if size <= SMOOTH_MAX_SIZE:  # quadratic constraints: Newton-CG's correction
            return "newton-cg", qcqp, lcqp
        return (None if quadratic else "newton-cg"), qcqp, lcqp


def route(compiled: CompiledModel) -> Route:
    """The :class:`Route` of a model."""
    return Route(compiled)


def smooth_backend(compiled: CompiledModel) -> str | None:
    """The subproblem backend of the smooth exact path on this model (:class:`Route`)."""
    return route(compiled).backend


def prefers_smooth_path(compiled: CompiledModel, plan: Route | None = None) -> bool:
    """True when ``engine="auto"`` takes the smooth exact path first: every term of GLM
    form with a smooth ``h`` (:attr:`Route.backend`), no epigraph auxiliaries, and not a
    QCQP (:attr:`Route.qcqp`).

    A model with epigraph auxiliaries (hinge, abs, pinball, l1, ... rewritten by
    :mod:`fedmodel.dsl.epigraph`) is an LP or QP in disguise with one auxiliary per row:
    an interior-point conic solver takes it in a few dozen iterations, while the augmented
    Lagrangian's Newton steps stall on its degenerate active set (hinge SVM on German
    credit: 76 s uncertified against 0.06 s for Clarabel); it goes to Clarabel first and
    takes the smooth path only when Clarabel's point does not certify. Smooth
    non-quadratic terms (logistic, exp, huber) stay on the smooth path: Clarabel needs the
    exponential cone there, fails on UCI Adult and did not finish at d = 10,000."""
    if compiled.layout.hidden:
        return False
    plan = plan or route(compiled)
    return plan.backend is not None and not plan.qcqp


def smooth_path_applies(compiled: CompiledModel) -> bool:
    """True when the smooth exact path has a backend for this model (:class:`Route`)."""
    return smooth_backend(compiled) is not None


def _direct_allowed(options: CentralizedOptions) -> bool:
    """The direct route may run: Clarabel (the default solver) and ``direct=True``."""
    return (
        options.direct
        and options.solver in (None, "CLARABEL")
        and ("CLARABEL" in INSTALLED_SOLVERS)
    )


def _remaining(options: CentralizedOptions, deadline: float | None):
    """``options`` with ``time_limit`` set to what is left before ``deadline`` (at least a
    millisecond: a passed deadline still ends the next solve at once)."""
    if deadline is None:
        return options
    return replace(options, time_limit=max(deadline - time.perf_counter(), 1e-3))


def _expired(deadline: float | None) -> bool:
    return deadline is not None and time.perf_counter() >= deadline


def run_centralized(compiled: CompiledModel, options: CentralizedOptions):
    """Solve the pooled problem (module docstring); the result's ``options`` are the
    caller's (a refinement's or the smooth path's cprox-al settings when one ran)."""
    result = _run(compiled, options)
    if not result.options:
        result.options = dict(options.__dict__)
    return result


def _run(compiled: CompiledModel, options: CentralizedOptions):
    if options.engine == "smooth":
        compiled.require_smooth("centralized with engine='smooth'")
        for p in compiled.parties:
            if p.cones:
                raise UnsupportedError(
                    f"term '{p.cones[0].label}' has no smooth form (it is solved in cone form "
                    "by cvxpy); engine='smooth' needs C^1 terms: use engine='cvxpy' or 'auto'",
                    p.name,
                )
    # time_limit covers the whole solve (from model.solve's start: its compile counts too):
    # each stage gets what the earlier ones left
    started = SOLVE_STARTED.get()
    started = time.perf_counter() if started is None else started
    deadline = None if options.time_limit is None else started + options.time_limit
    plan = route(compiled)
    direct = None
    if (
        options.engine == "auto"
        and _direct_allowed(options)
        and not compiled.layout.hidden  # (epigraph and cone models go to Clarabel anyway;
        and not compiled.has_cones  # their GLM recognition is what Route.backend costs)
        and plan.constrained_qp
    ):
        try:  # an LCQP: Clarabel on its data first (Route.constrained_qp)
            direct = build_conic_data(compiled)
        except NotDirect:
            direct = None
    if options.engine == "smooth" or (
        options.engine == "auto" and direct is None and prefers_smooth_path(compiled, plan)
    ):
        smooth = _smooth_solve(compiled, _remaining(options, deadline), plan)
        if smooth.status in VERDICTS or options.engine == "smooth":
            return smooth
        # not certified: cvxpy, then a refinement from its point
        result = _cvxpy_solve(compiled, _remaining(options, deadline), plan)
        result.message = f"smooth exact path not certified ({smooth.message}); {result.message}"
        result.timing["smooth_path"] = smooth.timing.get("solve", 0.0)
        return result
    # Clarabel at tight tolerances (conic_solver_settings); if its point does not certify,
    # the smooth path from w = 0 (where it applies), then cvxpy's choice at its tolerances
    # refined by cprox-al; where the smooth path does not apply, cprox-al refines the tight
    # point at once (one conic solve, not two: sparse logistic + l1 at d = 3000 spent 14 s
    # in each)
    tight = conic_solver_settings(compiled, options)
    plain = tight == (options.solver, options.solver_options)
    # (each stage gets what is left of the limit counted from model.solve's start: the
    # model's compile, the route and the LCQP's data build count too)
    if not options.refine or plain or options.engine != "auto":
        return _cvxpy_solve(compiled, _remaining(options, deadline), plan)
    first = _cvxpy_solve(
        compiled, _remaining(options, deadline), plan, smooth_next=True, direct_data=direct
    )
    if first.status in ("optimal", "infeasible", "unbounded", "time_limit"):
        return first
    if "refined_with" in first.extra or plan.backend is None:
        return first
    spent = first.timing.get("solve", 0.0)
    if _expired(deadline):
        first.status = "time_limit"
        first.message += f"; time limit of {options.time_limit:g} s reached"
        return first
    smooth = _smooth_solve(compiled, _remaining(options, deadline), plan)
    if smooth.status in VERDICTS or _expired(deadline):
        smooth.message = f"{first.message}; {smooth.message}"
        smooth.timing["cvxpy"] = spent
        return smooth
    result = _cvxpy_solve(compiled, _remaining(options, deadline), plan, tight=False)
    result.message = f"{first.message}; {result.message}"
    result.timing["cvxpy_tight"] = spent
    return result


#: the statuses of the smooth path that stand (cprox-al's certificates of infeasibility and
#: unboundedness among them); on others cvxpy solves the model
VERDICTS = ("optimal", "infeasible", "unbounded", "time_limit")


def _smooth_solve(compiled: CompiledModel, options: CentralizedOptions, plan: Route):
    """The smooth exact path: cprox-al on the pooled problem from ``w = 0``, its subproblems
    solved by dense Newton or, on large models, Newton-CG (:attr:`Route.backend`)."""
    backend = plan.backend or "auto"
    result = _refine(compiled, options, np.zeros(compiled.layout.size), None, None, backend)
    result.extra = {
        **(result.extra or {}),
        "solved_with": "cprox-al (smooth exact)",
        "subproblem_solver": backend,
    }
    if result.status == "optimal":
        steps = "Newton-CG" if backend == "newton-cg" else "Newton"
        result.message = f"smooth exact path (cprox-al, {steps} subproblems): {result.message}"
    return result


def _cvxpy_solve(
    compiled: CompiledModel,
    options: CentralizedOptions,
    plan: Route,
    tight: bool = True,
    smooth_next: bool = False,
    retry: bool = True,
    direct_data=None,
):
    """One cvxpy solve of the pooled problem (then certified, and refined when asked;
    with ``smooth_next``, an uncertified point is returned unrefined when the smooth exact
    path applies: the caller tries that first).

    Clarabel runs on the direct data (:func:`~fedmodel.algorithms.centralized.direct.build_conic_data`,
    or ``direct_data`` when the caller built it) where it applies, else on cvxpy's compile.
    When a direct solve's point does not certify, a second direct solve with Clarabel's
    static regularisation at :data:`DIRECT_RETRY_REGULARIZATION` comes first (its data at
    hand: milliseconds), before any refinement.

    With a time limit, the remaining time is checked before each stage that cannot be
    interrupted: building the pooled problem's data (directly: milliseconds; cvxpy's
    compile, ``get_problem_data``: seconds on large exponential-cone models); the solver
    gets what that left as its own limit (:data:`SOLVER_TIME_LIMIT`; the direct solve also
    stops when its last iteration says the next would end after the deadline) and the
    refinement the rest."""
    t0 = time.perf_counter()
    limit = options.time_limit
    deadline = None if limit is None else t0 + limit
    # (what model.solve spent before this call: the floor a result states counts it)
    before = t0 - min(t0, SOLVE_STARTED.get() or t0)
    layout = compiled.layout
    objective_scale = model_objective_scale(compiled)
    if tight:
        solver_name, kwargs = conic_solver_settings(compiled, options)
    else:
        solver_name, kwargs = options.solver, dict(options.solver_options)
    direct = direct_data
    if direct is None and solver_name == "CLARABEL" and options.direct and plan.smooth:
        try:  # Clarabel's data built from the package's own forms: no cvxpy compile
            direct = build_conic_data(compiled)
        except NotDirect:
            direct = None
    if direct is not None:
        prob = per_party = chain = None
        chosen, error = "CLARABEL", ""
    else:
        prob, per_party = pooled_problem(compiled, objective_scale)
        try:
            data, chain, inverse_data = prob.get_problem_data(solver_name, solver_opts=kwargs)
            chosen = chain.solver.name()
            error = ""
        except cp.error.SolverError as exc:
            chain, chosen, error = None, solver_name or "?", str(exc)
    # the certificate's evaluators, compiled before the solver starts so that the solver's
    # deadline counts them (in a fresh process 60 ms on the 11 parties of quantile
    # regression on Communities; compiled inside the certificate, after Clarabel had
    # stopped at the deadline, they took a run 20% past a 0.3 s limit)
    if plan.smooth:
        for p in compiled.parties:
            p.functions  # noqa: B018
    compile_seconds = time.perf_counter() - t0
    t_solve = time.perf_counter()
    timing = {"compile": compile_seconds, "solve": 0.0, "per_party": {}}
    if _expired(deadline):  # the compile took the whole time limit: no solve started
        floor = (
            f"; the limit is below the smallest this solve holds, {compile_seconds + before:.3g} "
            "s: the compile cannot be interrupted, so it ended there"
        )
        return _no_point(
            compiled,
            "time_limit",
            f"time limit of {limit + before:.3g} s reached while cvxpy compiled the pooled "
            f"problem ({compile_seconds:.2f} s){floor}"
            if direct is None
            else f"time limit of {limit + before:.3g} s reached while building the pooled problem's "
            f"data ({compile_seconds:.2f} s){floor}",
            timing,
            {
                "cvxpy_solver": chosen,
                "time_limit_floor": compile_seconds + before,
                **({"direct": True} if direct is not None else {}),
            },
        )
    key = SOLVER_TIME_LIMIT.get(str(chosen).upper())
    if deadline is not None and key is not None:  # the solver's own limit: what is left
        kwargs.setdefault(key, max(deadline - time.perf_counter(), 1e-3))
    options = _remaining(options, deadline)  # (the refinement gets the rest)
    solved = None
    if direct is not None:
        try:
            # the solver stops early enough to leave the certificate its time: a share
            # of the limit, twice the data's build and three times one evaluation of
            # every party, timed here on this machine as loaded as it is now (quantile
            # regression on Communities, limit 0.3 s: Clarabel ended at 0.28 s, the
            # polish and the certificate took the run to 0.36 s; at 1 s beside two busy
            # processes, 1.27 s without the timed evaluation)
            stop_at = None
            if deadline is not None:
                reserve = min(POST_RESERVE * limit, POST_RESERVE_MAX)
                reserve += POST_EVALUATIONS * evaluation_seconds(compiled)
                stop_at = deadline - reserve - 2.0 * direct.build_seconds
            solved = solve_direct(direct, kwargs, stop_at, objective_scale)
            cvx_status = solved.status
        except TypeError:  # a setting Clarabel does not know: the caller's error, as in cvxpy
            raise
        except Exception as exc:  # noqa: BLE001 - Clarabel's own errors (a panic, bad data)
            cvx_status, error = "solver_error", f"{type(exc).__name__}: {exc}"
    elif chain is not None:
        try:
            solution = chain.solve_via_data(prob, data, False, False, kwargs)
            with warnings.catch_warnings():  # (the recomputed certificate judges the point)
                warnings.filterwarnings("ignore", "Solution may be inaccurate")
                prob.unpack_results(solution, chain, inverse_data)
            cvx_status = prob.status
        except cp.error.SolverError as exc:
            cvx_status, error = "solver_error", str(exc)
    else:
        cvx_status = "solver_error"
    if direct is not None:
        used = "CLARABEL"
    else:
        used = prob.solver_stats.solver_name if prob.solver_stats is not None else chosen
    seconds = time.perf_counter() - t_solve
    timing["solve"] = seconds
    base = {"cvxpy_status": cvx_status, "cvxpy_solver": used, "objective_scale": objective_scale}
    if direct is not None:
        base["direct"] = True  # (Clarabel on the package's data, not cvxpy's)
    no_point = (
        solved is None or solved.x is None
        if direct is not None
        else any(v.value is None for v in layout.variables)
    )

    # the solver stopped at its own time limit (what was left of ours, give or take its
    # own clock): "time_limit", and no refinement
    timed_out = (
        cvx_status == "user_limit"
        and deadline is not None
        and (
            deadline - time.perf_counter() <= 0.02 * limit + 0.05
            or (solved is not None and solved.deadline_stop)
        )
    )
    if timed_out and no_point:
        message = f"{used} stopped at the time limit of {limit + before:.3g} s without a point"
        return _no_point(compiled, "time_limit", message, timing, base)
    if cvx_status == "solver_error" or cvx_status.startswith(("infeasible", "unbounded")):
        status = "solver_error" if cvx_status == "solver_error" else cvx_status.split("_")[0]
        message = {
            "infeasible": f"{used} reports the pooled problem infeasible ({cvx_status})",
            "unbounded": f"{used} reports the pooled problem unbounded ({cvx_status})",
            "solver_error": f"{used} failed: {error}",
        }[status]
        if status == "solver_error" and options.refine and plan.smooth:
            # the conic path failed (as Clarabel does on UCI Adult): solve the smooth pooled
            # problem exactly instead, by cprox-al with Newton subproblem solves
            result = _refine(compiled, options, None, None, None, plan.backend or "auto")
            result.timing["cvxpy"] = seconds
            result.timing["solve"] += seconds
            result.extra = {**result.extra, **base, "solved_with": "cprox-al (smooth exact)"}
            result.message = f"{message}; solved with cprox-al instead: {result.message}"
            return result
        if status == "solver_error":
            message += ". Try another solver (solver='SCS', 'ECOS') or method='cprox-al'."
        return _no_point(compiled, status, message, timing, base)

    if direct is not None and no_point:  # (stopped at a limit of its own, no point)
        status = "time_limit" if timed_out else "inaccurate"
        return _no_point(compiled, status, f"{used} returned no point ({cvx_status})", timing, base)
    mus, nus, lams = [], [], []
    if direct is not None:
        x = solved.x
        for p, mu, nu, lam in zip(compiled.parties, solved.mus, solved.nus, solved.lams):
            nus.append(nu)
            mus.append(np.maximum(mu, 0.0))
            blocks = p.functions.blocks if p.cones else []
            offs = np.cumsum([0] + [b.size for b in blocks])
            duals = [b.project_dual(lam[i:j]) for b, i, j in zip(blocks, offs[:-1], offs[1:])]
            lams.append(np.concatenate(duals) if duals else np.zeros(0))
    else:
        x = layout.stack({v: v.value for v in layout.variables})
        for p, (ineq, eq, cones) in zip(compiled.parties, per_party):
            # (the solver's duals are those of the objective divided by S)
            mu = objective_scale * _duals(ineq)
            nus.append(objective_scale * _duals(eq))
            mus.append(np.maximum(mu, 0.0))
            blocks = p.functions.blocks if cones else []
            duals = [
                b.project_dual(objective_scale * b.dual_from(c)) for b, c in zip(blocks, cones)
            ]
            lams.append(np.concatenate(duals) if duals else np.zeros(0))
    scale = max([1.0] + [float(m.max()) for m in mus if m.size])
    smooth = plan.smooth
    for j, p in enumerate(compiled.parties):
        ci = p.functions.constraint_values(x)[0] if (p.m_ineq and smooth) else np.zeros(p.m_ineq)
        # zero the duals of inactive constraints: tiny interior-point duals, and duals of
        # constraints with slack beyond the tolerance (Definition 1 would charge |c_j|)
        inactive = (mus[j] <= DUAL_ZERO * scale) | (ci < -options.eps)
        mus[j] = np.where(inactive, 0.0, mus[j])
    multipliers = {
        p.name: split_multipliers(p, m, v, lam)
        for p, m, v, lam in zip(compiled.parties, mus, nus, lams)
    }
    if compiled.has_cones:
        base.update(conic_note(compiled))
    if not smooth:  # a term without a gradient: no certificate
        status = "optimal" if cvx_status == "optimal" else "inaccurate"
        value = solved.objective if direct is not None else objective_scale * prob.value
        summary = {"objective": float(value), "max_violation": np.nan}
        try:
            compiled.require_smooth("centralized")
        except UnsupportedError as exc:
            why = str(exc)
        return make_result(
            compiled,
            method="centralized",
            status=status,
            x=x,
            kkt=None,
            summary=summary,
            multipliers=multipliers,
            message=f"no KKT certificate: {why}",
            timing=timing,
            extra=base,
        )
    # epigraph models: the polished multipliers are judged first (the certificate is the
    # costly part on many rows: LAD over 20 clients, 4,000 rows, spent 0.1 s in each of
    # two evaluations), the unpolished ones only when the polished do not certify
    polished = polish_auxiliary_duals(compiled, x, mus) if compiled.layout.hidden else None
    kkt_p = summary_p = None
    scale = objective_scale
    if polished is not None:
        kkt_p, summary_p = pooled_evaluation(compiled, x, polished, nus, lams, scale)
    if kkt_p is not None and kkt_p.satisfied(options.eps, options.eps):
        kkt, summary = kkt_p, summary_p
    else:
        kkt, summary = pooled_evaluation(compiled, x, mus, nus, lams, scale)
        if kkt_p is not None and kkt_p.verdict_residuals[0] >= kkt.verdict_residuals[0]:
            polished = None  # (the polish did not lower the stationarity: not taken)
        elif kkt_p is not None:
            kkt, summary = kkt_p, summary_p
    if polished is not None:
        mus = polished
        base["auxiliary_duals_polished"] = True
        multipliers = {
            p.name: split_multipliers(p, m, v, lam)
            for p, m, v, lam in zip(compiled.parties, mus, nus, lams)
        }
    # the residuals are recomputed here, so Clarabel's "optimal_inaccurate" (it stopped at
    # its reduced tolerances, short of the tight ones asked for) is certified when they hold
    certified = cvx_status in ("optimal", "optimal_inaccurate") and kkt.satisfied(
        options.eps, options.eps
    )
    message = (
        f"{used}: {cvx_status}; KKT residuals certified to {options.eps:g}"
        if certified
        else f"{used} returned '{cvx_status}' with {kkt.describe()}, short of eps = {options.eps:g}"
    )
    if timed_out:
        message += f"; time limit of {limit + before:.3g} s reached"
        if solved is not None and solved.first is not None:
            # the smallest limit this solve holds: its compile, Clarabel's start-up and
            # first iteration, and what follows the solve (the polish, the certificate)
            floor = solved.first - t0 + (time.perf_counter() - t_solve - seconds)
            base["time_limit_floor"] = floor + before
            if limit < floor:
                message += (
                    f"; the limit is below the smallest this solve holds, {floor + before:.3g} "
                    "s: the compile, the solver's first iteration and the certificate, so it ended "
                    "there"
                )
    result = make_result(
        compiled,
        method="centralized",
        status="optimal" if certified else ("time_limit" if timed_out else "inaccurate"),
        x=x,
        kkt=kkt,
        summary=summary,
        multipliers=multipliers,
        message=message,
        timing=timing,
        extra=base,
    )
    if certified or timed_out:
        return result
    if (
        direct is not None
        and retry
        and "static_regularization_constant" not in options.solver_options
        and not _expired(deadline)
    ):
        # a second direct solve with Clarabel's static regularisation at 1e-10 instead of
        # 1e-8 (its data is at hand: a few milliseconds): basis pursuit at the quick size,
        # before its quadratic inequalities' multipliers were fitted (direct.PartyRows.mu),
        # stopped at a scaled stationarity of 1.2e-6 and took the smooth path (0.6 s);
        # with it, certified at once (0.02 s). (1e-10 from the start was slower on the
        # SVM on German credit, 0.04 s against 0.02 s.)
        again = _cvxpy_solve(
            compiled,
            replace(
                options,
                refine=False,
                solver_options={
                    **options.solver_options,
                    "static_regularization_constant": DIRECT_RETRY_REGULARIZATION,
                },
            ),
            plan,
            tight,
            smooth_next,
            retry=False,
            direct_data=direct,
        )
        if again.status == "optimal":
            again.timing["first_solve"] = seconds
            again.message += f" (second solve; the first: {message})"
            return again
    if smooth_next and plan.backend is not None:
        return result
    if not options.refine:
        result.message += (
            ". Remedies: solve(method='centralized', refine=True) refines the point with "
            "cprox-al; or try another solver (solver='SCS', 'ECOS')."
        )
        return result
    refined = _refine(compiled, options, x, mus, nus, plan.backend or "auto")
    refined.timing["cvxpy"] = seconds
    refined.timing["solve"] += seconds
    refined.extra = {
        **refined.extra,
        **base,
        "refined_with": "cprox-al",
        "unrefined_kkt": kkt.to_dict(),
    }
    refined.message = f"{message}; refined with cprox-al: {refined.message}"
    return refined


#: the largest relative change :func:`polish_auxiliary_duals` makes to a multiplier
POLISH_MAX_CHANGE = 1e-3


def polish_auxiliary_duals(compiled: CompiledModel, x: np.ndarray, mus) -> list | None:
    """The inequality multipliers with each epigraph auxiliary's stationarity made exact.

    An epigraph variable ``t_i`` (one per row of a hinge, abs or pinball loss) enters only
    its own affine rows ``piece_k(w) - t_i <= 0``, so its stationarity reads ``c_i - sum_k
    lambda_k``, ``c_i`` its objective coefficient (``1/N``). An interior-point point
    leaves this at a relative ``1e-6``-``1e-5`` even at Clarabel's tightest tolerances
    (LAD on wine quality: 1.4e-6 on one row of 4,898), which the certificate measures
    relative to ``c_i``. Scaling the row's multipliers by ``c_i / sum_k lambda_k`` removes
    it and moves the shared variables' stationarity by the same relative amount; the
    certificate is recomputed on the result, so this only ever adds a certificate that
    holds. Rows are matched to their auxiliary by
    :func:`fedmodel.certificate.auxiliary.auxiliary_rows` (the matching the certificate
    uses to put the auxiliaries at their partial minimiser); a change larger than
    :data:`POLISH_MAX_CHANGE` is not made. None when nothing changed."""
    out, changed = [], False
    for p, mu in zip(compiled.parties, mus):
        match = auxiliary_rows(p, x)
        at = minimize_auxiliaries(p, x, match)  # (where the certificate evaluates)
        new = balance_piece_multipliers(p, at, mu, match, POLISH_MAX_CHANGE)
        changed |= new is not None
        out.append(mu if new is None else new)
    return out if changed else None


def _no_point(compiled: CompiledModel, status: str, message: str, timing: dict, extra: dict):
    """A result without a point (the solver gave none): NaN values, no certificate."""
    return make_result(
        compiled,
        method="centralized",
        status=status,
        x=np.full(compiled.layout.size, np.nan),
        kkt=None,
        summary={"objective": np.nan, "max_violation": np.nan},
        multipliers={},
        message=message,
        timing=timing,
        extra=extra,
    )


def conic_solver_settings(compiled: CompiledModel, options: CentralizedOptions):
    """The cvxpy solver and its options for the pooled solve.

    Every model solved by cvxpy here goes to Clarabel (unless the caller chose a solver)
    with its gap and feasibility tolerances at ``eps`` x :data:`CONIC_TOLERANCE_FACTOR` within
    [1e-12, 1e-8] (the caller's ``solver_options`` win): an interior-point point at
    Clarabel's default 1e-8 leaves each degenerate epigraph row a multiplier and a slack
    of ~1e-6 at once, which the certificate must charge to either the stationarity or the
    feasibility (LAD on wine quality, 4,898 rows: stationarity 1.7e-2 at 1e-8, 9e-8 at
    1e-10, in the same solve time; 20 clients' LAD and basis pursuit needed 1e-12); the
    cprox-al refinement it then needed took 86 s. Smooth models that reach cvxpy (terms
    without GLM form such as ``kl_div`` and ``entr``, QCQPs, large QPs) need it too: at
    Clarabel's defaults the KL model on the simplex read a stationarity of 7.5e-5, then a
    12 s refinement did not certify; at 1e-12 it certifies at once. Clarabel may stop short
    of 1e-12 with "optimal_inaccurate" or insufficient progress (``accept_unknown``: its
    point is kept); the recomputed certificate decides.
    """
    solver_name, kwargs = options.solver, dict(options.solver_options)
    if solver_name not in (None, "CLARABEL") or "CLARABEL" not in INSTALLED_SOLVERS:
        return solver_name, kwargs
    tol = float(np.clip(options.eps * CONIC_TOLERANCE_FACTOR, 1e-12, 1e-8))
    for key in ("tol_gap_abs", "tol_gap_rel", "tol_feas"):
        kwargs.setdefault(key, tol)
    kwargs.setdefault("accept_unknown", True)
    return "CLARABEL", kwargs


def _duals(constraints) -> np.ndarray:
    if not constraints:
        return np.zeros(0)
    return np.concatenate([np.atleast_1d(c.dual_value).ravel(order="F") for c in constraints])


def _smooth(compiled: CompiledModel) -> bool:
    try:
        compiled.require_smooth("centralized")
    except UnsupportedError:
        return False
    return True


def _refine(compiled, options, x0, mus, nus, solver: str = "auto"):
    """cprox-al on the pooled problem, from cvxpy's point and duals when given.

    A large penalty (:data:`SMOOTH_BETA`) makes the proximal AL outer loop (a proximal
    point method on the KKT operator) converge in few iterations; the Newton subproblem
    backend copes with the conditioning it brings. ``solver``: the subproblem backend
    (:attr:`Route.backend`, else ``"auto"``: the subproblem selection's choice).
    """
    opts = CProxALOptions(
        eps=options.eps,
        beta=SMOOTH_BETA,
        sbar=0.5 * options.eps,
        w0=x0,
        max_outer=300,
        history=False,
        time_limit=options.time_limit,
        solver=solver,
    )
    result = run_cprox_al(
        compiled, opts, method="centralized", mu_init=mus, nu_init=nus, stop_on_plateau=True
    )
    if result.status != "optimal":
        if result.status not in VERDICTS:
            result.status = "inaccurate"
        result.message += f". Not certified to eps = {options.eps:g}"
    return result
