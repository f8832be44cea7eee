"""cvxpy backend: the merit problem compiled once as a DPP-compliant cvxpy problem.

Iterates, multipliers and the proximal/ADMM centre are cvxpy Parameters; every solve only
updates their values, so cvxpy reuses its canonicalisation (no problem is rebuilt inside
an iteration loop). The residual is measured with the smooth evaluators afterwards and,
if the conic solver stopped short of the requested tolerance, polished with L-BFGS.

Cone constraints of terms with no smooth form (:mod:`fedmodel.dsl.conic`) are hard
constraints here; after each solve their conic duals, projected onto the dual cones, are
written to the merit problem (``problem.cone``) and the residual is the subproblem's KKT
residual in cone form (no polishing: the smooth backends cannot take cones).
"""

from __future__ import annotations

import time
import warnings

import cvxpy as cp
import numpy as np

from fedmodel.errors import UnsupportedError
from fedmodel.expressions import substitute, substitute_constraint
from fedmodel.subproblems.merit import MeritProblem, SolveReport

#: duals of hard pieces below this fraction of the largest are rounding (set to 0)
ROUNDING_DUAL = 1e-9


def stacked_variable_map(layout, x: cp.Variable) -> dict[int, cp.Expression]:
    """Map each model variable to the matching slice of one stacked cvxpy variable."""
    out = {}
    for v in layout.variables:
        piece = x[layout.slice_of(v)]
        out[v.id] = piece if v.shape == (piece.size,) else cp.reshape(piece, v.shape, order="F")
    return out


#: the smallest gap and feasibility tolerance passed to Clarabel (a subproblem may ask for
#: less: :class:`CvxpySolver`'s ``floor``)
CLARABEL_FLOOR = 1e-10


def clarabel_tolerances(tol: float, floor: float = CLARABEL_FLOOR) -> dict:
    """Clarabel settings for a subproblem asked to residual ``tol``: gap and feasibility
    tolerances a hundredth of it, within ``[floor, 1e-8]`` (Clarabel's reliable range
    from :data:`CLARABEL_FLOOR` up).

    Examples
    --------
    >>> clarabel_tolerances(1e-12)["tol_gap_abs"], clarabel_tolerances(1e-12, 1e-11)["tol_feas"]
    (1e-10, 1e-11)
    """
    t = float(min(1e-8, max(floor, 0.01 * tol)))
    return {"tol_gap_abs": t, "tol_gap_rel": t, "tol_feas": t, "tol_ktratio": min(1e-6, t)}


#: each cvxpy solver's option for a wall-clock limit in seconds (the remaining part of
#: ``time_limit`` is passed on; a solver not listed here is not limited)
SOLVER_TIME_LIMIT = {"CLARABEL": "time_limit", "OSQP": "time_limit", "SCS": "time_limit_secs"}


def polisher_for(problem: MeritProblem):
    """L-BFGS-B when h allows it, otherwise accelerated proximal gradient."""
    if any(p.couples for p in problem.regularizer.pieces):
        from fedmodel.subproblems.proximal_gradient import ProximalGradientSolver

        return ProximalGradientSolver(problem)
    from fedmodel.subproblems.quasi_newton import QuasiNewtonSolver

    return QuasiNewtonSolver(problem)


class CvxpySolver:
    """Solve a :class:`MeritProblem` with cvxpy (compiled once, parameters updated).

    Parameters
    ----------
    problem : MeritProblem
    solver : str, optional
        cvxpy solver name (default: Clarabel).
    polish : bool
        Refine with L-BFGS when the measured residual is above the tolerance.
    floor : float
        The smallest gap and feasibility tolerance passed to Clarabel
        (:func:`clarabel_tolerances`).
    """

    name = "cvxpy"

    def __init__(
        self,
        problem: MeritProblem,
        solver: str | None = None,
        polish: bool = True,
        hard_internal: bool = False,
        hard_constraints: bool = False,
        direct: bool = False,
        floor: float = CLARABEL_FLOOR,
    ):
        if any(p.nonconvex for p in problem.programs):
            raise UnsupportedError(
                "the cvxpy backend needs DCP-convex terms; terms declared with "
                "allow_nonconvex=True use the smooth backend (solver='lbfgs')"
            )
        self.problem = problem
        self.solver = solver or "CLARABEL"
        # Clarabel (interior point) takes no starting point; with warm_start cvxpy would
        # update the previous solver object in place, keeping its equilibration, so a
        # solve would depend on the earlier ones and a resumed or retried run would not
        # repeat its iterates bit for bit. Other solvers (OSQP, SCS) start from x0.
        self.warm = self.solver != "CLARABEL"
        self.polish = polish
        self._polisher = None
        #: the smallest tolerance passed to Clarabel (:func:`clarabel_tolerances`)
        self.floor = float(floor)
        #: ``time.perf_counter()`` value after which no new solve starts and a running one
        #: gets the remaining time as the solver's own limit (an owner's time limit)
        self.deadline: float | None = None
        # direct: Clarabel is called on cvxpy's compiled problem data, rebuilt only when a
        # parameter other than the linear term changes (see _direct_attempt)
        self.direct = bool(direct) and self.solver == "CLARABEL"
        self._direct = None
        n = problem.n
        layout = problem.programs[0].layout
        x = cp.Variable(n, name="x")
        mapping = stacked_variable_map(layout, x)
        beta = problem.beta
        # sqrt of sigma per coordinate (sigma a scalar or a diagonal metric)
        self.sqrt_sigma = cp.Parameter(n, nonneg=True, name="sqrt_sigma")
        self.linear = cp.Parameter(n, name="linear")
        self.mu = []
        self.nu = []
        # hard_internal: the pieces of an objective term's epigraph form (``internal``
        # constraints) are hard constraints of the subproblem, as the terms' own conic
        # form is, instead of augmented-Lagrangian terms; their duals are written to the
        # merit problem's multipliers after each solve (subproblems/conic_prox.py)
        self.hard_internal = bool(hard_internal or hard_constraints)
        # hard_constraints: every constraint of the parties is hard (exact-admm: the user's
        # constraints too, so that no outer multiplier update is needed for them)

        def hard(c) -> bool:
            return self.hard_internal and (c.internal or bool(hard_constraints))

        self.penalised: list[tuple[np.ndarray, np.ndarray]] = []  # rows with AL terms
        self.internal_cons: list[tuple[list, list]] = []  # hard (ineq, eq) constraints
        self.user_rows: list[np.ndarray] = []  # which hard inequality rows are the user's
        # (the proximal term is added last: the direct path compiles the rest without it and
        # puts sigma on the x-block's diagonal of P itself)
        obj = cp.Constant(0.0)
        hard_rows = []
        for prog in problem.programs:
            if prog.objective:
                obj = obj + substitute(prog.objective_expr(), mapping)
            keep_i = [c for c in prog.ineq if not hard(c)]
            keep_e = [c for c in prog.eq if not hard(c)]
            soft = [not hard(c) for c in prog.ineq]
            rows_i = np.concatenate([np.full(c.size, k) for c, k in zip(prog.ineq, soft)] or [[]])
            soft_e = [not hard(c) for c in prog.eq]
            rows_e = np.concatenate([np.full(c.size, k) for c, k in zip(prog.eq, soft_e)] or [[]])
            self.penalised.append((rows_i.astype(bool), rows_e.astype(bool)))
            hard_i = [c for c in prog.ineq if hard(c)]
            user = [np.full(c.size, not c.internal) for c in hard_i]
            self.user_rows.append(np.concatenate(user).astype(bool) if user else np.zeros(0, bool))
            m_i, m_e = sum(c.size for c in keep_i), sum(c.size for c in keep_e)
            mu = cp.Parameter(m_i, nonneg=True) if m_i else None
            nu = cp.Parameter(m_e) if m_e else None
            self.mu.append(mu)
            self.nu.append(nu)
            if mu is not None:
                g = cp.hstack([cp.vec(substitute(c.expr, mapping), order="F") for c in keep_i])
                obj = obj + cp.sum_squares(cp.pos(mu + beta * g)) / (2 * beta)
            if nu is not None:
                a = cp.hstack([cp.vec(substitute(c.expr, mapping), order="F") for c in keep_e])
                obj = obj + cp.sum_squares(nu + beta * a) / (2 * beta)
            ineq = [
                cp.vec(substitute(c.expr, mapping), order="F") <= 0
                for c, k in zip(prog.ineq, soft)
                if not k
            ]
            eq = [
                cp.vec(substitute(c.expr, mapping), order="F") == 0
                for c, k in zip(prog.eq, soft_e)
                if not k
            ]
            self.internal_cons.append((ineq, eq))
            hard_rows = hard_rows + ineq + eq
        reg = problem.regularizer
        cons = list(hard_rows)
        if not reg.is_zero:
            h, reg_cons = reg.cvxpy_parts([x[s] for s in reg.slices])
            cons = cons + list(reg_cons)  # (the hard rows above stay)
            obj = obj + h
        # hard cone constraints (terms with no smooth form) and their blocks, per program
        self.cones = []
        for prog in problem.programs:
            mine = [substitute_constraint(c.source, mapping) for c in prog.cones]
            self.cones.append(mine)
            cons = cons + mine
        self.x = x
        prox = 0.5 * cp.sum_squares(cp.multiply(self.sqrt_sigma, x))
        rest = obj  # (the objective without its linear term)
        obj = -self.linear @ x + rest
        self.cvx_problem = cp.Problem(cp.Minimize(prox + obj), cons)
        # direct: the subproblem without its proximal term, compiled once (see _refresh_direct);
        # without its linear term too when the rest has no parameter (exact-admm's hard rows):
        # cvxpy's compile then takes no parameter (DPP) path, whose tensors for a
        # quad_over_lin row next to a Parameter of size n took 1.5 GB and 6-18 s at n = 10,000;
        # the linear term is added to q by _direct_solve
        self._linear_apart = False
        if self.direct:
            apart = not rest.parameters() and x in cp.Problem(cp.Minimize(rest), cons).variables()
            self._linear_apart = apart
            self._direct_problem = cp.Problem(cp.Minimize(rest if apart else obj), cons)
        else:
            self._direct_problem = None
        if not self.cvx_problem.is_dcp(dpp=True):
            raise UnsupportedError("the party subproblem is not DPP-compliant for cvxpy")

    def _past_deadline(self) -> bool:
        return self.deadline is not None and time.perf_counter() > self.deadline

    def solve(self, x0: np.ndarray, tol: float, max_iter: int = 10_000) -> SolveReport:
        p = self.problem
        if np.ndim(p.sigma) == 2:
            raise UnsupportedError(
                "the cvxpy backend takes a scalar or diagonal proximal metric, not a full "
                "matrix; use a scalar ADMM penalty (penalty_metric='scalar')"
            )
        # (cvxpy validates every value it is given; the direct path reads neither sqrt_sigma,
        # whose sigma it puts on P's diagonal itself, nor, with the linear term apart, that
        # parameter: it takes the plain vector, _linear)
        self._linear = p.sigma * p.center
        if not self.direct:
            self.sqrt_sigma.value = np.sqrt(np.broadcast_to(p.sigma, (p.n,)))
        if not self._linear_apart:
            self.linear.value = self._linear
        for par, val, (rows, _) in zip(self.mu, p.mu, self.penalised):
            if par is not None:
                par.value = np.maximum(val[rows], 0.0)
        for par, val, (_, rows) in zip(self.nu, p.nu, self.penalised):
            if par is not None:
                par.value = val[rows]
        x0 = np.asarray(x0, dtype=float)
        tight = clarabel_tolerances(tol, self.floor) if self.solver == "CLARABEL" else {}
        x, residual, status, cone = self._attempt(x0, tight)
        attempts = 1
        if self._past_deadline():
            tight = {}  # no second attempt after the deadline
        if residual > tol and tight and not (self.hard_internal and np.isfinite(residual)):
            # interior-point methods may lose accuracy at tight tolerances on degenerate
            # problems (e.g. a PSD cone with a multiple eigenvalue): try the defaults and
            # keep whichever point has the smaller measured residual
            x2, residual2, status2, cone2 = self._attempt(x0, {})
            attempts = 2
            if residual2 < residual:
                x, residual, status, cone = x2, residual2, status2, cone2
        for loose in (1e-7, 1e-6) if tight and not np.isfinite(residual) else ():
            # both solves ended in a solver error (Clarabel's NumericalError after reaching
            # ~1e-8 on degenerate pooled SOC models, e.g. under cprox-al): looser
            # tolerances, stopping at the first solve that returns a point; its residual is
            # measured as always
            settings = {"tol_gap_abs": loose, "tol_gap_rel": loose, "tol_feas": loose}
            x2, residual2, status2, cone2 = self._attempt(x0, settings)
            attempts += 1
            if np.isfinite(residual2):
                x, residual, status, cone = x2, residual2, status2, cone2
                break
        if p.has_cones:
            p.cone = cone
        report = SolveReport(x, residual, tol, attempts, self.name, str(status))
        if residual > tol and self.polish and not p.has_cones and not self.hard_internal:
            if self._polisher is None:
                self._polisher = polisher_for(p)
            self._polisher.deadline = self.deadline
            polished = self._polisher.solve(x, tol, max_iter)
            polished.backend = f"cvxpy+{self._polisher.name}"
            polished.message = f"{status}; polished: {polished.message}"
            return polished
        return report

    def _structure_key(self) -> tuple:
        """The values of the parameters that enter the compiled ``P``, ``A`` and ``b`` of
        the direct path's problem (the augmented-Lagrangian multipliers of soft rows; sigma
        is added to ``P`` by :meth:`_direct_solve` and the linear term enters ``q`` only)."""
        pars = [m for m in self.mu + self.nu if m is not None]
        return tuple(np.asarray(par.value, dtype=float).tobytes() for par in pars)

    def _direct_solve(self, settings: dict) -> str:
        """``direct``: solve with Clarabel on the compiled data of the subproblem without
        its proximal term (:meth:`_refresh_direct`), with sigma added on the x-block's
        diagonal of ``P`` and ``q`` recomputed from the linear term: no cvxpy compilation
        per step, also when sigma changes (cvxpy's parameter application and solver
        interface took about 25 of the 32 ms of a solve on an SVM client, and a change of
        sigma, which enters cvxpy's compiled ``A`` through an auxiliary variable, a full
        recompilation). The result is unpacked by cvxpy's chain as in a full solve; returns
        cvxpy's status."""
        import clarabel
        import scipy.sparse as sp

        if self._direct is None or self._direct["key"] != self._structure_key():
            self._refresh_direct()
        cache = self._direct
        prog = cache["param_prog"]
        if self._linear_apart:  # (no parameter: q is constant but for the linear term)
            q = cache["q"].copy()
            q[cache["start"] : cache["start"] + self.problem.n] -= self._linear
        else:
            q = self._parametric_q(prog, cache["Q"])
        data = cache["P_data"].copy()  # (sigma on the x-block's diagonal entries)
        data[cache["diagonal"]] += np.broadcast_to(self.problem.sigma, (self.problem.n,))
        P = sp.csc_array((data, cache["P_indices"], cache["P_indptr"]), shape=cache["P_shape"])
        chain = cache["chain"]
        opts = chain.solver.parse_solver_opts(False, settings)
        solver = clarabel.DefaultSolver(P, q, cache["A"], cache["b"], cache["cones"], opts)
        self._direct_problem.unpack_results(solver.solve(), chain, cache["inverse"])
        return self._direct_problem.status

    @staticmethod
    def _parametric_q(prog, Q) -> np.ndarray:
        """The compiled problem's linear term at the parameters' current values."""
        from cvxpy.cvxcore.python import canonInterface

        vec = canonInterface.get_parameter_vector(
            prog.total_param_size,
            prog.param_id_to_col,
            prog.param_id_to_size,
            lambda idx: np.array(prog.id_to_param[idx].value),
        )
        if vec is None:  # (no parameter: the constant column alone)
            vec = np.ones(1)
        return np.asarray(Q @ vec, dtype=float).ravel()[: prog.x.size]

    def _refresh_direct(self) -> None:
        """Compile the subproblem without its proximal term (for :meth:`_direct_solve`)."""
        import scipy.sparse as sp
        from cvxpy.reductions.solvers.conic_solvers.clarabel_conif import dims_to_solver_cones

        problem = self._direct_problem
        data, chain, inverse = problem.get_problem_data(solver=self.solver)
        for inv in inverse:  # (get_problem_data leaves the solver's options None)
            if getattr(inv, "solver_options", {}) is None:
                inv.solver_options = {}
        n = data["c"].size
        P = sp.csc_array(sp.triu(data["P"])) if "P" in data else sp.csc_array((n, n))
        start = data["param_prob"].var_id_to_col[self.x.id]
        mask = np.zeros(n)
        mask[start : start + self.problem.n] = 1.0
        # P's pattern with the x-block's diagonal, and where those entries sit in its data
        one = sp.csc_array(P + sp.diags_array(mask))
        two = sp.csc_array(P + sp.diags_array(2 * mask))
        one.sort_indices()
        two.sort_indices()
        diagonal = np.flatnonzero(one.data != two.data)
        base = one.data.copy()
        base[diagonal] -= 1.0
        self._direct = {
            "key": self._structure_key(),
            "param_prog": data["param_prob"],
            "chain": chain,
            "inverse": inverse,
            "Q": sp.csr_array(data["param_prob"].q),
            "q": self._parametric_q(data["param_prob"], sp.csr_array(data["param_prob"].q))
            if self._linear_apart
            else None,
            "P_data": base,
            "P_indices": one.indices,
            "P_indptr": one.indptr,
            "P_shape": one.shape,
            "diagonal": diagonal,
            "start": start,
            "A": data["A"],
            "b": data["b"],
            "cones": dims_to_solver_cones(data["dims"]),
        }

    def _attempt(self, x0: np.ndarray, settings: dict):
        """One cvxpy solve: the point, its measured residual, cvxpy's status and the cone
        multipliers (projected onto the dual cones), also left in ``problem.cone``."""
        p = self.problem
        self.x.value = x0
        if self.deadline is not None:
            if self.solver in SOLVER_TIME_LIMIT:
                left = max(self.deadline - time.perf_counter(), 1e-3)
                settings = {**settings, SOLVER_TIME_LIMIT[self.solver]: left}
        try:
            with warnings.catch_warnings():  # accuracy is measured (and polished) by the caller
                warnings.filterwarnings("ignore", message="Solution may be inaccurate")
                if self.direct:
                    status = self._direct_solve(settings)
                else:
                    self.cvx_problem.solve(solver=self.solver, warm_start=self.warm, **settings)
                    status = self.cvx_problem.status
        except cp.error.SolverError as exc:
            status = f"solver_error: {exc}"
        failed = isinstance(status, str) and status.startswith("solver_error")
        if failed or self.x.value is None:
            # no point and no duals from this solve (cvxpy leaves the previous solve's values,
            # or None, in place): x0 and infinite residual, so that the caller tries the
            # solver's defaults next and never reads multipliers of another solve
            return np.array(x0, dtype=float), np.inf, status, [np.array(c) for c in p.cone]
        x = np.array(self.x.value, dtype=float)
        if self.hard_internal:  # the hard pieces' duals are their multipliers
            for j, ((ineq, eq), (rows_i, rows_e)) in enumerate(
                zip(self.internal_cons, self.penalised)
            ):
                if ineq:
                    mu = np.array(p.mu[j], dtype=float)
                    dual = np.maximum(np.concatenate([np.ravel(c.dual_value) for c in ineq]), 0.0)
                    # an interior-point dual is never exactly 0 and the certificate reads
                    # mu_j > 0 as an active piece: a piece with slack s_j = -c_j > 0 keeps its
                    # dual only when that costs less (s_j over its scale, as the certificate
                    # measures it) than setting it to 0 (mu_j over the largest dual, the
                    # relative stationarity of its auxiliary); rounding-level duals go too
                    c = p.functions[j].constraint_values(x)[0][~rows_i]
                    c0 = np.abs(p.functions[j].constant_parts[0][~rows_i])
                    top = dual.max(initial=0.0)
                    slack = -c / np.maximum(1.0, c0)
                    # (a user's constraint, hard with hard_constraints, is often a piece of
                    # its own: against the largest dual alone, its own, it never went; its
                    # dual is measured against the stationarity scale 1 as well)
                    ref = np.where(self.user_rows[j], max(top, 1.0), top)
                    dual[(slack > 0) & (dual < slack * ref)] = 0.0
                    dual[dual <= ROUNDING_DUAL * top] = 0.0
                    mu[~rows_i] = dual
                    p.mu[j] = mu
                if eq:
                    nu = np.array(p.nu[j], dtype=float)
                    nu[~rows_e] = np.concatenate([np.ravel(c.dual_value) for c in eq])
                    p.nu[j] = nu
        if p.has_cones:  # the conic duals are the cone constraints' multipliers
            for j, (prog, mine) in enumerate(zip(p.programs, self.cones)):
                blocks = prog.functions.blocks
                lams = [b.project_dual(b.dual_from(c)) for b, c in zip(blocks, mine)]
                p.cone[j] = np.concatenate(lams) if lams else np.zeros(0)
        return x, p.residual(x), status, [np.array(c) for c in p.cone]
