"""One party's local problem and its solver layer, shared by the dald methods and the
baselines (``fedavg``, ``fedprox``, ``dgd``): seed 004's block subproblem (Section V-B3)

    phi(x) = f_p(x) [+ (beta/2)(||[c_p(x)]_+||^2 + ||a_p(x)||^2)] + h(x)/n
             + (1/2) sum_r w_r (x_r - z_r)^2

where ``f_p``, ``c_p``, ``a_p`` are the party's own terms (the bracket is the optional
quadratic penalty of its constraints, ``penalty=beta``), ``h/n`` its share of the model's
regulariser, and the diagonal quadratic collects the augmented-Lagrangian terms
``mu^T C + ||rho o C||^2`` of its consensus constraints (eqs. 13, 19, 20): every term
``mu^T (x - y) + ||rho o (x - y)||^2`` equals ``(1/2) sum_r 2 rho_r^2 (x_r - y_r + mu_r /
(2 rho_r^2))^2`` up to a constant, so the weights and centre of several such terms add up.

Three solvers (``local_solver=``):

* ``"exact"``: the subproblem engine (:mod:`fedmodel.subproblems`) to a measured residual
  ``dist_inf(0, d phi(x)) <= local_tol``. With non-uniform ``rho`` the quadratic has a
  vector weight (a diagonal metric of the :class:`~fedmodel.subproblems.merit.MeritProblem`),
  handled by the L-BFGS backend.
* ``"prox-grad"``: ``W`` steps of proximal gradient (BCPG, eqs. 63-64) from the warm start
  ``x^{k,v-1}``: ``x <- prox_{alpha h/n}(x - alpha grad psi(x))``; for an l1 term the prox is
  soft-thresholding (64). ``step=None`` uses ``alpha = 1 / (L_f + max_r w_r)`` with the
  party's own curvature estimate ``L_f`` (power iteration at its first warm start);
  ``step="backtracking"`` searches ``alpha`` at every step (Beck-Teboulle).
* ``"bfgs"``: :func:`scipy.optimize.minimize` with ``method="BFGS"`` (seed 004 Section VI-A),
  for smooth subproblems only.

The surrogate reductions of seed 004 Section V-B (smooth subproblems only; a clear error
otherwise), each replacing the exact block minimisation by ``W`` steps from the warm start:

* ``"gd"``: gradient descent on ``phi``, ``x <- x - alpha grad phi(x)`` (the linearised
  surrogate (34)/(45): with ``n = 1`` and ``mu = 0`` one DALD iteration is the GD step (38)
  on the proximal subproblem; ``step=None`` gives ``alpha = 1 / (L_f + max_r w_r)``).
* ``"newton"``: damped Newton steps ``x <- x - t [hess phi(x)]^-1 grad phi(x)`` with the
  exact Hessian of the party's terms (GLM form: sums of logistic/exp/square/huber of affine
  maps and quadratics) and Armijo backtracking from ``t = 1`` (the step-size choice (39),
  ``alpha^k I = hess f(x^k)^-1``, which gives Newton's method (40)).
* ``"sgd"``: mini-batch stochastic gradient steps: the gradient of ``f_p`` on
  ``batch_size`` rows drawn uniformly without replacement from the party's rows (scaled to
  be unbiased), the quadratic and ``h/n`` exactly (MBGD/SGD, (49) with one batch per step;
  ``batch_size = 1`` is SGD). The draws depend on ``random_state``, the party's name and the
  number of solves so far, so a run is repeatable and resumable.
"""

from __future__ import annotations

import time
import zlib
from dataclasses import dataclass, replace

import numpy as np
from scipy.optimize import minimize

from fedmodel.compiler.partition import CompiledModel, PartyProgram
from fedmodel.compiler.regularizer import Regularizer
from fedmodel.errors import UnsupportedError
from fedmodel.subproblems.merit import MeritProblem, set_deadline
from fedmodel.subproblems.quasi_newton import QuasiNewtonSolver
from fedmodel.subproblems.select import make_solver

LOCAL_SOLVERS = ("exact", "prox-grad", "bfgs", "gd", "newton", "sgd")
#: the surrogate reductions of Section V-B: need a smooth subproblem
SMOOTH_ONLY = ("bfgs", "gd", "newton", "sgd")


def scaled_regularizer(reg: Regularizer, factor: float) -> Regularizer:
    """``factor * h`` (the box and ball parts, indicators, are unchanged)."""
    pieces = []
    for p in reg.pieces:
        pieces.append(
            replace(
                p,
                l1=p.l1 * factor,
                sumsq=p.sumsq * factor,
                l2=p.l2 * factor,
                nuclear=p.nuclear * factor,
                spectral=p.spectral * factor,
            )
        )
    return Regularizer.from_pieces(reg.slices, pieces, reg.terms)


def check_constraints(compiled: CompiledModel, method: str, penalty: float | None) -> None:
    """Refuse constrained models unless a quadratic penalty is requested."""
    if not compiled.has_constraints or penalty is not None:
        return
    where = [f"{p.name}: {c.label}" for p in compiled.parties for c in p.constraints]
    shown = ", ".join(where[:4]) + (" ..." if len(where) > 4 else "")
    raise UnsupportedError(
        f"method '{method}' solves consensus problems without constraints beyond h (seed 004); "
        f"this model has constraints ({shown}). Pass penalty=beta to add the quadratic "
        "penalty (beta/2)(||[c]_+||^2 + ||a||^2) of each party's constraints to its "
        "objective (an approximation whose violation is O(1/beta)), or use "
        "method='prox-al', which handles them exactly"
    )


@dataclass
class LocalStats:
    solves: int = 0
    iterations: int = 0
    evaluations: int = 0
    max_residual: float = 0.0


class LocalProblem:
    """One party's block subproblem and its solver layer (see the module docstring).

    Parameters
    ----------
    program : PartyProgram
        The party's own terms and data (nothing else).
    regularizer : Regularizer
        The party's share of ``h`` (``h/n`` for a client, zero for the server).
    penalty : float or None
        Quadratic-penalty parameter of the party's constraints (``None``: no constraints).
    local_solver, local_steps, step, local_tol, local_max_iter, solver, uniform :
        The solver layer; ``uniform`` says that the quadratic weight is a scalar, which
        lets ``"exact"`` use every backend of the subproblem engine (cvxpy included).
    """

    def __init__(
        self,
        program: PartyProgram,
        regularizer: Regularizer,
        penalty: float | None,
        *,
        local_solver: str = "exact",
        local_steps: int = 1,
        step: float | None = None,
        local_tol: float | None = None,
        local_max_iter: int = 1000,
        solver: str = "auto",
        uniform: bool = True,
        batch_size: int = 1,
        random_state: int | None = None,
    ):
        self.program = program
        self.kind = local_solver
        self.reg = regularizer
        self.penalty = float(penalty) if penalty else 1.0
        self.problem = MeritProblem([program], self.penalty, regularizer)  # sigma: a vector
        self.n = self.problem.n
        self.empty = program.is_empty and regularizer.is_zero
        self.W = int(local_steps)
        self.step = step
        self._alpha = None
        self._lf: float | None = None
        self.max_iter = int(local_max_iter)
        self.tol = (
            float(local_tol)
            if local_tol is not None
            else (1e-5 if local_solver == "bfgs" else 1e-10)
        )
        self.uniform = uniform
        self.stats = LocalStats()
        self._engine = None
        self._solver_name = solver
        if local_solver in SMOOTH_ONLY and not (regularizer.is_smooth or regularizer.is_zero):
            raise UnsupportedError(
                f"local_solver={local_solver!r} needs a smooth subproblem, but h has an l1, "
                "norm2 or box term; use local_solver='exact' or 'prox-grad'"
            )
        self.batch_size = int(batch_size)
        self.seed = (
            0 if random_state is None else int(random_state),
            zlib.crc32(program.name.encode()),
        )
        #: ``time.perf_counter()`` value after which a solve returns the point it reached
        #: (the exact engine's own deadline; no further ``repeat``): an owner's time budget
        self.deadline: float | None = None
        self._glm = None  # the party's objective in GLM form ("sgd")
        self._hessians = None  # the Newton backend's derivatives of its terms ("newton")

    # -- the quadratic -------------------------------------------------------------------
    def get_state(self) -> dict:
        """What changes the next solves beyond the vectors set each round: the step-size
        caches and the exact engine's own state (checkpoints, retries)."""
        engine = self._engine
        return {
            "alpha": self._alpha,
            "lf": self._lf,
            "engine": engine.get_state() if hasattr(engine, "get_state") else None,
            "stats": dict(vars(self.stats)),  # flat: cheaper than asdict per step
        }

    def set_state(self, state: dict) -> None:
        self._alpha, self._lf = state["alpha"], state["lf"]
        self.stats = LocalStats(**state["stats"])
        if state["engine"] is not None:
            if self._engine is None:
                self._exact_engine()
            self._engine.set_state(state["engine"])

    def set_quadratic(self, weights: np.ndarray | float, center: np.ndarray) -> None:
        """Set ``(1/2) sum_r w_r (x_r - z_r)^2``."""
        if self.uniform and np.ndim(weights):
            weights = float(np.asarray(weights).flat[0])
        self.problem.set(sigma=weights, center=center)

    def smooth(self, x: np.ndarray) -> tuple[float, np.ndarray]:
        """Value and gradient of the smooth part psi (everything but the non-smooth h)."""
        val, g = self.problem.smooth_value_grad(x)
        if not self.reg.is_zero:
            sq = self.reg.smooth_grad(x)
            val -= 0.5 * sq.dot(x)
            g = g - sq
        return val, g

    def residual(self, x: np.ndarray) -> float:
        return self.problem.residual(x)

    def gradient_f(self, x: np.ndarray) -> np.ndarray:
        """Gradient of the party's smooth terms (with the penalty), without h and quadratic."""
        _, g = self.program.functions.merit(
            x, np.zeros(self.program.m_ineq), np.zeros(self.program.m_eq), self.penalty
        )
        return g

    # -- solve ---------------------------------------------------------------------------
    def solve(self, x0: np.ndarray, repeat: int = 1) -> np.ndarray:
        """Run the solver layer from the warm start ``x0`` (``repeat`` times)."""
        x = np.asarray(x0, dtype=float)
        if self.empty:  # no terms: the exact argmin is the centre of the quadratic
            return self.problem.center.copy()
        for i in range(max(1, int(repeat))):
            if i and self._out_of_time():
                break
            if self.kind == "exact":
                x = self._exact(x)
            elif self.kind == "prox-grad":
                x = self._prox_grad(x)
            elif self.kind == "gd":
                x = self._gd(x)
            elif self.kind == "newton":
                x = self._newton(x)
            elif self.kind == "sgd":
                x = self._sgd(x)
            else:
                x = self._bfgs(x)
        self.stats.solves += 1
        return x

    def _steps(self):
        """The ``W`` steps of one solve of the iterative solvers, each counted as an
        iteration: a step that would end after the owner's deadline (the shortest step so
        far says how long one takes) is not begun, but the first always is (every solve
        moves)."""
        shortest = started = float("inf")
        for k in range(self.W):
            now = time.perf_counter()
            if k:
                shortest = min(shortest, now - started)
                if self.deadline is not None and now + shortest > self.deadline:
                    return
            started = now
            self.stats.iterations += 1
            yield k

    def _out_of_time(self) -> bool:
        return self.deadline is not None and time.perf_counter() > self.deadline

    def _exact_engine(self) -> None:
        if self.uniform:
            # (a cvxpy engine calls Clarabel on the compiled data, the proximal weight and
            # centre added to P and q: no DPP compile of the data, 6-18 s and ~1.5 GB for a
            # ball at d = 10,000, which overran dald-cc's time limit eightfold)
            self._engine = make_solver(self.problem, self._solver_name, direct=True)
        else:
            if self._solver_name == "cvxpy" or any(p.l2 or p.has_ball for p in self.reg.pieces):
                raise UnsupportedError(
                    "exact local solves with vector (per-coordinate) rho use the L-BFGS "
                    "backend, which does not handle a norm2 term or a norm ball in h; use a "
                    "scalar rho"
                )
            self._engine = QuasiNewtonSolver(self.problem)

    def _exact(self, x0: np.ndarray) -> np.ndarray:
        if self._engine is None:
            self._exact_engine()
        set_deadline(self._engine, self.deadline)
        report = self._engine.solve(x0, self.tol, self.max_iter)
        self.stats.iterations += report.iterations
        self.stats.max_residual = max(self.stats.max_residual, float(report.residual))
        return report.x

    def _prox_grad(self, x: np.ndarray) -> np.ndarray:
        reg = self.reg
        backtrack = isinstance(self.step, str)
        if not backtrack:
            alpha = self._fixed_alpha(x)
        for _ in self._steps():
            val, g = self.smooth(x)
            self.stats.evaluations += 1
            if not backtrack:
                z = x - alpha * g
                x = reg.prox(z, alpha) if not reg.is_zero else z
                continue
            alpha = 2.0 * self._alpha if self._alpha else self._initial_alpha(x, g)
            while True:
                z = x - alpha * g
                xn = reg.prox(z, alpha) if not reg.is_zero else z
                d = xn - x
                vn, _ = self.smooth(xn)
                self.stats.evaluations += 1
                if (
                    vn <= val + g.dot(d) + d.dot(d) / (2 * alpha) + 1e-12 * abs(val)
                    or alpha < 1e-16
                ):
                    break
                alpha *= 0.5
            self._alpha = alpha
            x = xn
        return x

    def _fixed_alpha(self, x: np.ndarray) -> float:
        """The given step, or ``1 / (L_f + max_r w_r)`` with ``L_f`` estimated once (at the
        first warm start) by :meth:`lipschitz_estimate`."""
        if self.step is not None:
            return float(self.step)
        if self._lf is None:
            self._lf = self.lipschitz_estimate(x)
        L = self._lf + float(np.max(self.problem.sigma))
        return 1.0 / L if L > 0 else 1.0

    def _initial_alpha(self, x: np.ndarray, g: np.ndarray) -> float:
        """1 / (curvature along the gradient), by a finite difference."""
        nrm = float(np.linalg.norm(g))
        if nrm == 0:
            return 1.0
        h = 1e-6 * (1 + float(np.linalg.norm(x))) / nrm
        _, g2 = self.smooth(x - h * g)
        curv = float(np.dot(g - g2, g)) / (h * nrm**2)
        return 1.0 / curv if curv > 0 else 1.0

    def _bfgs(self, x0: np.ndarray) -> np.ndarray:
        def stop_at_deadline(intermediate_result) -> None:  # (scipy >= 1.11 stops on this)
            if self._out_of_time():
                raise StopIteration

        res = minimize(
            self.problem.smooth_value_grad,
            x0,
            jac=True,
            method="BFGS",
            options={"gtol": self.tol, "maxiter": self.max_iter},
            callback=stop_at_deadline,
        )
        self.stats.iterations += int(res.nit)
        self.stats.evaluations += int(res.nfev)
        return np.asarray(res.x, dtype=float)

    # -- the surrogate reductions (Section V-B) ------------------------------------------
    def _gd(self, x: np.ndarray) -> np.ndarray:
        """``W`` gradient steps on the whole (smooth) subproblem ``phi``."""
        alpha = self._fixed_alpha(x)
        for _ in self._steps():
            _, g = self.problem.smooth_value_grad(x)
            self.stats.evaluations += 1
            x = x - alpha * g
        return x

    def glm(self):
        """The party's terms in GLM form (objective; constraints under ``penalty``), or an
        :class:`UnsupportedError` naming the party when they are not of that form."""
        if self._hessians is None:
            from fedmodel.compiler.glm import NotRecognised
            from fedmodel.subproblems.newton import NewtonSolver

            try:
                self._hessians = NewtonSolver(self.problem)
            except NotRecognised as exc:
                raise UnsupportedError(
                    f"local_solver={self.kind!r} for party '{self.program.name}': its terms "
                    f"are not of GLM form ({exc}); use local_solver='exact', 'gd' or 'prox-grad'"
                ) from exc
        return self._hessians

    def _objective_glm(self):
        """The party's objective in GLM form (``sgd``; its constraints refused)."""
        if self._glm is None:
            from fedmodel.compiler.glm import NotRecognised, recognise_scalar

            if self.program.m_ineq or self.program.m_eq:
                raise UnsupportedError(
                    f"local_solver='sgd' for party '{self.program.name}': a mini-batch "
                    "gradient of penalised constraints is not defined; use local_solver='gd' "
                    "or 'exact'"
                )
            layout = self.program.layout
            f = None
            try:
                for t in self.program.objective:
                    g = recognise_scalar(t.expr, layout)
                    f = g if f is None else f.plus(g)
            except NotRecognised as exc:
                raise UnsupportedError(
                    f"local_solver='sgd' for party '{self.program.name}': its objective is not "
                    f"a sum of per-row terms of GLM form ({exc}); use local_solver='gd'"
                ) from exc
            self._glm = f
        return self._glm

    def _phi_derivatives(self, x: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
        """Value, gradient and Hessian of ``phi`` (party terms + quadratic + smooth h/n)."""
        p = self.problem
        m_in = [np.zeros(self.program.m_ineq)]
        m_eq = [np.zeros(self.program.m_eq)]
        val, g, H = self.glm().derivatives(x, m_in, m_eq)
        d = x - p.center
        w = p.sigma * np.ones(self.n)
        val, g = val + 0.5 * float(d @ (w * d)), g + w * d
        H = H + np.diag(w)
        if not self.reg.is_zero:
            sq = self.reg.smooth_grad(x)  # (a diagonal quadratic: its gradient is D x)
            val += 0.5 * float(sq @ x)
            g = g + sq
            H = H + np.diag(self.reg.smooth_grad(np.ones(self.n)))
        return float(val), g, H

    def _newton(self, x: np.ndarray) -> np.ndarray:
        """``W`` damped Newton steps (exact Hessian, Armijo backtracking)."""
        for _ in self._steps():
            val, g, H = self._phi_derivatives(x)
            self.stats.evaluations += 1
            if not np.any(g):
                break
            step = -np.linalg.solve(H, g)
            slope = float(g @ step)
            if not slope < 0:  # (a non-convex term: fall back to the gradient)
                step, slope = -g, -float(g @ g)
            t = 1.0
            while t > 1e-12:
                new, _ = self.problem.smooth_value_grad(x + t * step)
                self.stats.evaluations += 1
                if new <= val + 1e-4 * t * slope:
                    break
                t *= 0.5
            x = x + t * step
        return x

    def _sgd(self, x: np.ndarray) -> np.ndarray:
        """``W`` mini-batch gradient steps: ``f_p``'s gradient on ``batch_size`` random rows."""
        f = self._objective_glm()
        if f is None or not f.terms:
            raise UnsupportedError(
                f"local_solver='sgd' for party '{self.program.name}': it has no per-row terms "
                "(sums of logistic/exp/square/huber of affine maps) to sample"
            )
        sizes = [t.b.size for t in f.terms]
        rows = int(sum(sizes))
        batch = min(self.batch_size, rows)
        rng = np.random.default_rng([*self.seed, self.stats.solves])
        alpha = self._fixed_alpha(x)
        offsets = np.cumsum([0] + sizes)
        for _ in self._steps():
            pick = np.sort(rng.choice(rows, size=batch, replace=False))
            g = np.zeros(self.n)
            for t, lo, hi in zip(f.terms, offsets[:-1], offsets[1:]):
                idx = pick[(pick >= lo) & (pick < hi)] - lo
                if idx.size:
                    z = t.s * (t.A[idx] @ x) + t.b[idx]
                    d1 = _phi_d1(t.kind, z, t.M)
                    g += t.s * (t.A[idx].T @ (t.weights[idx] * d1))
            g *= rows / batch
            if f.Q is not None:
                g += f.Q @ x
            if f.q is not None:
                g += f.q
            g += self.problem.sigma * (x - self.problem.center)
            if not self.reg.is_zero:
                g += self.reg.smooth_grad(x)
            x = x - alpha * g
            self.stats.evaluations += 1
        return x

    def lipschitz_estimate(self, x: np.ndarray, iters: int = 20) -> float:
        """Largest curvature of the party's smooth terms near ``x`` (power iteration on
        finite-difference Hessian-vector products; exact for quadratics)."""
        rng = np.random.default_rng(0)
        v = rng.normal(size=self.n)
        v /= np.linalg.norm(v)
        g0 = self.gradient_f(x)
        lam = 0.0
        eps = 1e-6 * (1 + float(np.linalg.norm(x)))
        for _ in range(iters):
            hv = (self.gradient_f(x + eps * v) - g0) / eps
            lam_new = float(np.linalg.norm(hv))
            if lam_new == 0:
                break
            v = hv / lam_new
            if abs(lam_new - lam) <= 1e-6 * lam_new:
                lam = lam_new
                break
            lam = lam_new
        return lam + 2 * sum(p.sumsq for p in self.reg.pieces)


def _phi_d1(kind: str, z: np.ndarray, M: float) -> np.ndarray:
    from fedmodel.compiler.glm import phi_value_d1

    return phi_value_d1(kind, z, M)[1]
