"""Quasi-Newton backend: scipy's L-BFGS-B on values and gradients of the merit function.

Handles any smooth (possibly nonconvex) merit function, plus the simple nonsmooth parts of
``h``: a box becomes bounds, and an l1 term is split as ``x = p - q`` with ``p, q >= 0``
(exact). A group norm (``norm2``) is not handled here.

A term defined on part of the space only (``kl_div``, ``entr``, ``log``) makes the merit
``+inf`` outside its domain, where L-BFGS-B's line search cannot interpolate: its first
step from an interior point has unit length, and where that step leaves the domain the run
ends at its start. A run that met a non-finite value is followed by one whose first step is
:data:`DOMAIN_SHRINK` times shorter (the variables scaled, which leaves the later
quasi-Newton steps as they are), at most :data:`DOMAIN_RETRIES` times per solve.
"""

from __future__ import annotations

import time

import numpy as np
from scipy.optimize import minimize

from fedmodel.errors import UnsupportedError
from fedmodel.subproblems.merit import MeritProblem, SolveReport

#: the factor of the first step's length after a run that met a non-finite merit value
DOMAIN_SHRINK = 0.1
#: at most this many such shorter runs per solve (a first step down to 1e-8)
DOMAIN_RETRIES = 8


class QuasiNewtonSolver:
    """Solve a :class:`MeritProblem` to ``dist_inf(0, d phi) <= tol`` with L-BFGS-B.

    Parameters
    ----------
    problem : MeritProblem
    memory : int
        Number of correction pairs kept by L-BFGS.
    restarts : int
        Extra runs with a tenfold tighter ``gtol`` when the measured residual is above
        the tolerance after a run.
    """

    name = "lbfgs"

    def __init__(self, problem: MeritProblem, memory: int = 20, restarts: int = 3):
        self.problem = problem
        self.memory = memory
        self.restarts = restarts
        #: ``time.perf_counter()`` value after which a solve returns its current point (an
        #: owner's time limit, e.g. cprox-al's)
        self.deadline: float | None = None
        self._outside = False  # (a run met a non-finite merit value: outside a domain)
        n = problem.n
        lower = np.full(n, -np.inf)
        upper = np.full(n, np.inf)
        l1 = np.zeros(n)
        for s, p in zip(problem.regularizer.slices, problem.regularizer.pieces):
            if p.couples:
                raise UnsupportedError(
                    "the L-BFGS backend cannot handle a norm2 term, a norm ball or a matrix "
                    "norm in h; use solver='cvxpy'"
                )
            if p.has_box:
                lower[s] = np.broadcast_to(p.lower, lower[s].shape)
                upper[s] = np.broadcast_to(p.upper, upper[s].shape)
            l1[s] = p.l1
        self.l1 = l1
        self.split = np.flatnonzero((l1 > 0) & (lower < 0) & (upper > 0))
        self.linear = np.where((l1 > 0) & (lower >= 0), l1, 0.0) - np.where(
            (l1 > 0) & (upper <= 0), l1, 0.0
        )
        m = len(self.split)
        zl = np.concatenate([lower, np.zeros(m)])
        zu = np.concatenate([upper, -lower[self.split]])
        zl[self.split] = 0.0  # p >= 0 on split coordinates
        self.bounded = bool(np.isfinite(zl).any() or np.isfinite(zu).any())
        self.bounds = (
            list(zip(np.where(np.isfinite(zl), zl, None), np.where(np.isfinite(zu), zu, None)))
            if self.bounded
            else None
        )

    def _to_x(self, z: np.ndarray) -> np.ndarray:
        n = self.problem.n
        x = z[:n].copy()
        if len(self.split):
            x[self.split] -= z[n:]
        return x

    def _to_z(self, x: np.ndarray) -> np.ndarray:
        z = np.concatenate([x, np.zeros(len(self.split))])
        if len(self.split):
            xs = x[self.split]
            z[self.split] = np.maximum(xs, 0.0)
            z[self.problem.n :] = np.maximum(-xs, 0.0)
        if self.bounds is not None:
            lo = np.array([-np.inf if b[0] is None else b[0] for b in self.bounds])
            hi = np.array([np.inf if b[1] is None else b[1] for b in self.bounds])
            z = np.clip(z, lo, hi)
        return z

    def _fun(self, z: np.ndarray) -> tuple[float, np.ndarray]:
        val, g = self._merit(z)
        if not np.isfinite(val):
            self._outside = True
        return val, g

    def _merit(self, z: np.ndarray) -> tuple[float, np.ndarray]:
        n = self.problem.n
        x = self._to_x(z)
        val, g = self.problem.smooth_value_grad(x)
        val += self.linear.dot(x)
        g = g + self.linear
        if len(self.split):
            l1s = self.l1[self.split]
            val += l1s.dot(z[self.split] + z[n:])
            gz = np.concatenate([g, -g[self.split] + l1s])
            gz[self.split] += l1s
            return val, gz
        return val, g

    def _past_deadline(self) -> bool:
        return self.deadline is not None and time.perf_counter() > self.deadline

    def _stop_at_deadline(self, intermediate_result) -> None:
        if self._past_deadline():
            raise StopIteration  # scipy ends the run at this iterate

    def solve(self, x0: np.ndarray, tol: float, max_iter: int = 10_000) -> SolveReport:
        z = self._to_z(np.asarray(x0, dtype=float))
        gtol = 0.5 * tol
        iters = 0
        message = ""
        x = self._to_x(z)
        residual = self.problem.residual(x)
        step, runs, shrinks = 1.0, 0, 0  # (step: the first step's length)
        while runs <= self.restarts:
            if residual <= tol or self._past_deadline():
                break
            self._outside = False
            res = self._run(z, step, gtol, max(1, max_iter - iters))
            iters += int(res.nit)
            message = str(res.message)
            if np.all(np.isfinite(res.x)):
                z = res.x * step
            x = self._to_x(z)
            residual = self.problem.residual(x)
            if self._outside and shrinks < DOMAIN_RETRIES:
                step, shrinks = step * DOMAIN_SHRINK, shrinks + 1
            else:
                runs, gtol = runs + 1, gtol * 0.1
            if iters >= max_iter:
                break
        return SolveReport(x, residual, tol, iters, self.name, message)

    def _run(self, z: np.ndarray, step: float, gtol: float, max_iter: int):
        """One L-BFGS-B run from ``z`` whose first step has length ``step``: on the
        variables ``u = z / step`` (its result's ``x`` is ``u``)."""
        fun, bounds = self._fun, self.bounds
        if step != 1.0:

            def fun(u):
                val, g = self._fun(step * u)
                return val, step * g

            if bounds is not None:
                bounds = [tuple(None if b is None else b / step for b in pair) for pair in bounds]
        return minimize(
            fun,
            z / step,
            jac=True,
            method="L-BFGS-B",
            bounds=bounds,
            options={
                "maxiter": max_iter,
                "gtol": gtol * step,
                "ftol": 0.0,
                "maxcor": self.memory,
                "maxls": 50,
            },
            callback=self._stop_at_deadline if self.deadline is not None else None,
        )
