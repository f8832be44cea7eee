"""Structure-aware Newton backend: exact (generalised) Hessians of GLM-form merit functions.

When every term of the parties in a merit problem has the GLM form of
:mod:`fedmodel.compiler.glm` (sums of logistic/exp/square/huber of affine maps, quadratic
forms, affine terms) and ``h`` is smooth, the merit function

    phi(x) = sum_p f_p(x) + (||[mu + beta c(x)]_+||^2 - ||mu||^2) / (2 beta)
                          + (||nu + beta a(x)||^2 - ||nu||^2) / (2 beta) + (sigma/2)||x - z||^2

has the generalised Hessian ``H = grad^2 f + sum_j (p_j grad^2 c_j + beta [p_j > 0] grad c_j
grad c_j^T) + (equalities likewise) + sigma I`` (``p = [mu + beta c]_+``): the AL term is
C^1 with a piecewise Hessian, which semismooth Newton treats exactly. Steps are damped by
an Armijo line search; an indefinite ``H`` (non-convex terms) is shifted until its
Cholesky factorisation exists. Stops at ``||grad phi||_inf <= tol`` (down to ~1e-12).
"""

from __future__ import annotations

import numpy as np
import scipy.linalg as la

from fedmodel.compiler.glm import GLMFunction, NotRecognised, recognise_components, recognise_scalar
from fedmodel.compiler.partition import PartyProgram
from fedmodel.subproblems.merit import MeritProblem, SolveReport


class _PartyGLM:
    """One party's objective and constraints in GLM form (linear constraints stacked)."""

    def __init__(self, program: PartyProgram):
        layout = program.layout
        n = layout.size
        f = None
        for t in program.objective:
            g = recognise_scalar(t.expr, layout)
            f = g if f is None else f.plus(g)
        self.f = f
        self.ineq = self._components(program.ineq, layout)
        self.eq = self._components(program.eq, layout)
        self.n = n

    @staticmethod
    def _components(constraints, layout) -> list[GLMFunction]:
        out: list[GLMFunction] = []
        for c in constraints:
            if c.expr.size == 1 and c.expr.ndim == 0:
                out.append(recognise_scalar(c.expr, layout))
            else:
                out.extend(recognise_components(c.expr, layout))
        return out


def _stack_linear(comps: list[GLMFunction], n: int):
    """Split components into a stacked linear block (G, g0) and the nonlinear rest."""
    lin = [j for j, c in enumerate(comps) if c.is_linear]
    G = np.array([comps[j].q if comps[j].q is not None else np.zeros(n) for j in lin]).reshape(
        len(lin), n
    )
    g0 = np.array([comps[j].r for j in lin])
    nonlin = [(j, comps[j]) for j in range(len(comps)) if j not in set(lin)]
    return np.array(lin, dtype=int), G, g0, nonlin


class NewtonSolver:
    """Semismooth Newton with line search for GLM-form merit problems.

    Raises :class:`~fedmodel.compiler.glm.NotRecognised` at construction when the problem
    has another shape (the backend selection then falls back to L-BFGS).
    """

    name = "newton"

    def __init__(self, problem: MeritProblem):
        reg = problem.regularizer
        if not reg.is_smooth:
            raise NotRecognised("h is not smooth")
        self.problem = problem
        self.n = problem.n
        self.parties = []
        for prog in problem.programs:
            pg = _PartyGLM(prog)
            self.parties.append(
                (pg.f, _stack_linear(pg.ineq, self.n), _stack_linear(pg.eq, self.n))
            )
        # a merit function with only quadratic/affine terms has a Hessian that changes only
        # with sigma and the active set: its Cholesky factor is cached and reused
        self.quadratic = all(
            (f is None or not f.terms) and not ineq[3] and not eq[3] for f, ineq, eq in self.parties
        )
        self._factor_key = None
        self._factor = None
        self.factorizations = 0
        self.h_sumsq = np.zeros(self.n)
        for s, p in zip(reg.slices, reg.pieces):
            self.h_sumsq[s] = p.sumsq

    def _merit(self, x: np.ndarray, hessian: bool = True):
        p = self.problem
        self._active = []
        beta = p.beta
        d = x - p.center
        val = 0.5 * p.sigma * d.dot(d) + float(self.h_sumsq @ (x * x))
        grad = p.sigma * d + 2 * self.h_sumsq * x
        H = np.diag(np.full(self.n, p.sigma) + 2 * self.h_sumsq) if hessian else None
        for (f, ineq, eq), mu, nu in zip(self.parties, p.mu, p.nu):
            if f is not None:
                v, g, Hf = f.evaluate(x, hessian)
                val += v
                grad += g
                if hessian:
                    H += Hf
            for (idx, G, g0, nonlin), mult, projected in ((ineq, mu, True), (eq, nu, False)):
                if len(idx):
                    c = G @ x + g0
                    m = mult[idx]
                    y = m + beta * c
                    act = y > 0 if projected else np.ones(y.size, dtype=bool)
                    self._active.append(act)
                    y = np.where(act, y, 0.0)
                    val += (y @ y - m @ m) / (2 * beta)
                    grad += G.T @ y
                    if hessian and act.any():
                        Ga = G[act]
                        H += beta * Ga.T @ Ga
                for j, comp in nonlin:
                    cv, cg, cH = comp.evaluate(x, hessian)
                    y = mult[j] + beta * cv
                    if projected and y <= 0:
                        val -= mult[j] ** 2 / (2 * beta)
                        continue
                    val += (y * y - mult[j] ** 2) / (2 * beta)
                    grad += y * cg
                    if hessian:
                        H += y * cH + beta * np.outer(cg, cg)
        return float(val), grad, H

    def solve(self, x0: np.ndarray, tol: float, max_iter: int = 200) -> SolveReport:
        x = np.asarray(x0, dtype=float).copy()
        val, g, H = self._merit(x)
        it, message = 0, "converged"
        newton_cap = min(max_iter, 50)
        while np.abs(g).max(initial=0.0) > tol:
            if it >= newton_cap:  # slow progress (non-convex terms): hand over to L-BFGS
                return self._fallback(x, tol, max_iter, it)
            it += 1
            step = self._cached_step(H, g) if self.quadratic else self._newton_step(H, g)
            slope = g @ step
            if slope >= 0:  # not a descent direction (numerical trouble): use the gradient
                step, slope = -g, -(g @ g)
            t = 1.0
            while True:
                x_new = x + t * step
                val_new, g_new, _ = self._merit(x_new, hessian=False)
                if val_new <= val + 1e-4 * t * slope or t < 1e-10:
                    break
                t *= 0.5
            if t < 1e-10 and val_new > val:
                message = "line search failed (at machine precision?)"
                break
            x = x_new
            val, g, H = self._merit(x)
        residual = self.problem.residual(x)
        return SolveReport(x, residual, tol, it, self.name, message)

    def _fallback(self, x, tol, max_iter, it) -> SolveReport:
        from fedmodel.subproblems.quasi_newton import QuasiNewtonSolver

        if not hasattr(self, "_quasi"):
            self._quasi = QuasiNewtonSolver(self.problem)
        report = self._quasi.solve(x, tol, max(1, max_iter - it))
        report.iterations += it
        report.backend = "newton+lbfgs"
        return report

    def _cached_step(self, H: np.ndarray, g: np.ndarray) -> np.ndarray:
        """Newton step reusing the Cholesky factor while (sigma, beta, active set) repeat."""
        key = (self.problem.sigma, self.problem.beta, tuple(a.tobytes() for a in self._active))
        if key != self._factor_key:
            self._factor = la.cho_factor(H, check_finite=False)
            self._factor_key = key
            self.factorizations += 1
        return -la.cho_solve(self._factor, g, check_finite=False)

    @staticmethod
    def _newton_step(H: np.ndarray, g: np.ndarray) -> np.ndarray:
        shift = 0.0
        scale = max(1.0, float(np.abs(np.diag(H)).max(initial=1.0)))
        for _ in range(30):
            try:
                c = la.cho_factor(
                    H + shift * np.eye(H.shape[0]) if shift else H, check_finite=False
                )
                return -la.cho_solve(c, g, check_finite=False)
            except la.LinAlgError:
                shift = max(2 * shift, 1e-10 * scale) if shift else 1e-10 * scale
                shift *= 10
        return -g
