"""The solver layer of seed 004 (Section V-B3): one party's block subproblem

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
  vector weight, handled by :class:`DiagonalMerit` and the L-BFGS backend.
* ``"prox-grad"``: ``W`` steps of proximal gradient (BCPG, eqs. 63-64) from the warm start
  ``x^{k,v-1}``: ``x <- prox_{alpha h/n}(x - alpha grad psi(x))``; for an l1 term the prox is
  soft-thresholding (64). ``step=None`` uses ``alpha = 1 / (L_f + max_r w_r)`` with the
  party's own curvature estimate ``L_f`` (power iteration at its first warm start);
  ``step="backtracking"`` searches ``alpha`` at every step (Beck-Teboulle).
* ``"bfgs"``: :func:`scipy.optimize.minimize` with ``method="BFGS"`` (seed 004 Section VI-A),
  for smooth subproblems only.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
from scipy.optimize import minimize

from fedmodel.compiler.partition import PartyProgram
from fedmodel.compiler.regularizer import Regularizer, VariablePiece
from fedmodel.errors import UnsupportedError
from fedmodel.subproblems.merit import MeritProblem
from fedmodel.subproblems.quasi_newton import QuasiNewtonSolver
from fedmodel.subproblems.select import make_solver

LOCAL_SOLVERS = ("exact", "prox-grad", "bfgs")


def scaled_regularizer(reg: Regularizer, factor: float) -> Regularizer:
    """``factor * h`` (the box and ball parts, indicators, are unchanged)."""
    pieces = []
    for p in reg.pieces:
        pieces.append(
            VariablePiece(
                l1=p.l1 * factor,
                sumsq=p.sumsq * factor,
                l2=p.l2 * factor,
                lower=p.lower,
                upper=p.upper,
                has_box=p.has_box,
                radius=p.radius,
            )
        )
    return Regularizer.from_pieces(reg.slices, pieces, reg.terms)


class DiagonalMerit(MeritProblem):
    """:class:`~fedmodel.subproblems.merit.MeritProblem` whose proximal weight ``sigma`` may
    be a vector: ``(1/2) sum_r sigma_r (x_r - center_r)^2`` (vector penalties ``rho``)."""

    def set(self, *, sigma, center, mu=None, nu=None) -> None:
        self.sigma = np.asarray(sigma, dtype=float) if np.ndim(sigma) else float(sigma)
        self.center = np.asarray(center, dtype=float)
        if mu is not None:
            self.mu = [np.asarray(m, dtype=float) for m in mu]
        if nu is not None:
            self.nu = [np.asarray(v, dtype=float) for v in nu]

    def smooth_value_grad(self, x: np.ndarray) -> tuple[float, np.ndarray]:
        self.evaluations += 1
        d = x - self.center
        grad = self.sigma * d
        val = 0.5 * float(np.dot(grad, d))
        for fn, mu, nu in zip(self.functions, self.mu, self.nu):
            v, g = fn.merit(x, mu, nu, self.beta)
            val += v
            grad = grad + g
        if not self.regularizer.is_zero:
            sq = self.regularizer.smooth_grad(x)
            val += 0.5 * sq.dot(x)
            grad = grad + sq
        return float(val), grad


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
    ):
        self.program = program
        self.kind = local_solver
        self.reg = regularizer
        self.penalty = float(penalty) if penalty else 1.0
        self.problem = DiagonalMerit([program], self.penalty, regularizer)
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
        if local_solver == "bfgs" and not (regularizer.is_smooth or regularizer.is_zero):
            raise UnsupportedError(
                "local_solver='bfgs' needs a smooth subproblem, but h has an l1, norm2 or box "
                "term; use local_solver='exact' or 'prox-grad'"
            )

    # -- the quadratic -------------------------------------------------------------------
    def get_state(self) -> dict:
        """What changes the next solves beyond the vectors set each round: the step-size
        caches and the exact engine's own state (checkpoints, retries)."""
        engine = self._engine
        return {
            "alpha": self._alpha,
            "lf": self._lf,
            "engine": engine.get_state() if hasattr(engine, "get_state") else None,
            "stats": dataclasses.asdict(self.stats),
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
        for _ in range(max(1, int(repeat))):
            if self.kind == "exact":
                x = self._exact(x)
            elif self.kind == "prox-grad":
                x = self._prox_grad(x)
            else:
                x = self._bfgs(x)
        self.stats.solves += 1
        return x

    def _exact_engine(self) -> None:
        if self.uniform:
            self._engine = make_solver(self.problem, self._solver_name)
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
        report = self._engine.solve(x0, self.tol, self.max_iter)
        self.stats.iterations += report.iterations
        self.stats.max_residual = max(self.stats.max_residual, float(report.residual))
        return report.x

    def _prox_grad(self, x: np.ndarray) -> np.ndarray:
        reg = self.reg
        backtrack = isinstance(self.step, str)
        if not backtrack:
            alpha = self._fixed_alpha(x)
        for _ in range(self.W):
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
        self.stats.iterations += self.W
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
        res = minimize(
            self.problem.smooth_value_grad,
            x0,
            jac=True,
            method="BFGS",
            options={"gtol": self.tol, "maxiter": self.max_iter},
        )
        self.stats.iterations += int(res.nit)
        self.stats.evaluations += int(res.nfev)
        return np.asarray(res.x, dtype=float)

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


def consensus_quadratic(terms: list[tuple[np.ndarray, np.ndarray, np.ndarray, float]], m: int):
    """Weights and centre of ``sum_t [sign_t mu_t^T (x - y_t) + ||rho_t o (x - y_t)||^2]``.

    Each term is ``(y, mu, rho, sign)``; returns ``(w, z)`` with the sum equal to
    ``(1/2) sum_r w_r (x_r - z_r)^2`` plus a constant.
    """
    w = np.zeros(m)
    wz = np.zeros(m)
    for y, mu, rho, sign in terms:
        r2 = 2.0 * rho * rho
        w = w + r2
        wz = wz + r2 * y - sign * mu
    return w, wz / w
