"""Exact steps of a party whose constraints are smooth: the method of multipliers on its
Newton backend.

exact-admm (:mod:`fedmodel.algorithms.proxal.exact_admm`) asks every party for

    argmin_x  P(x) + (sigma/2)||x - c||^2   s.t.  g(x) <= 0,  a(x) = 0

with the party's constraints *hard*: their multipliers are the step's duals
(:data:`fedmodel.subproblems.conic_prox.HARD_CONSTRAINTS`). When every term and
constraint has the Newton backend's GLM form, an interior-point solve through cvxpy is not
needed, and with exponential-cone terms over many rows it is slow (a Neyman-Pearson client
with a logistic constraint over ~1,600 rows: one cone per row). :class:`MultiplierSolver`
runs the method of multipliers (Hestenes 1969, Powell 1969, Rockafellar 1973) on the
party's own data instead: a Newton solve of the augmented Lagrangian at ``(mu, nu)``, then
``mu <- max(0, mu + beta g)``, ``nu <- nu + beta a``, until the multipliers' change over
``beta`` -- which bounds both the violation and the complementarity -- is at most the
step's tolerance. ``beta`` grows tenfold whenever the violation has not fallen fourfold.
The gradient of the augmented Lagrangian at the old multipliers is the Lagrangian's at the
new ones, so the Newton solve's measured residual is the step's stationarity. Every
iteration is local: a step's answer is its ``x`` and its multipliers, as from the cvxpy
backend, and nothing of the loop crosses the network.

Examples
--------
>>> import cvxpy as cp, numpy as np
>>> import fedmodel as fm
>>> from fedmodel.subproblems.merit import MeritProblem
>>> m = fm.Model("example")
>>> w = m.variable(2, name="w")
>>> c = m.client("c")
>>> c.minimize(cp.sum_squares(w - np.array([2.0, 0.0])))
>>> budget = c.subject_to(cp.sum(w) <= 1)
>>> problem = MeritProblem([m.compile().clients[0]], beta=100.0)
>>> problem.set(sigma=1e-9, center=np.zeros(2))
>>> report = MultiplierSolver(problem).solve(np.zeros(2), 1e-9)
>>> np.round(report.x, 6), np.round(problem.mu[0], 6)
(array([ 1.5, -0.5]), array([1.]))
"""

from __future__ import annotations

import time

import numpy as np

from fedmodel.subproblems.merit import MeritProblem, SolveReport
from fedmodel.subproblems.newton import NewtonSolver

#: the local penalty's start, relative to the constraints' scale (see :meth:`solve`)
START_BETA = 1e3
#: at most this many multiplier updates per step
MAX_UPDATES = 60
#: the penalty grows tenfold when the violation did not fall by this factor
VIOLATION_DECREASE = 0.25
#: the penalty stays below this (Newton's systems stay well conditioned)
MAX_BETA = 1e10


class MultiplierSolver:
    """The method of multipliers around a party's :class:`NewtonSolver` (module docstring).

    Parameters
    ----------
    problem : MeritProblem
        The party's merit problem; its ``mu``/``nu`` are the warm start and receive the
        step's multipliers, its ``beta`` is restored after each solve.
    """

    name = "newton-multipliers"

    def __init__(self, problem: MeritProblem):
        self.problem = problem
        self.newton = NewtonSolver(problem)  # (raises NotRecognised outside the GLM form)
        self.beta = START_BETA
        self.updates = 0

    def __getattr__(self, name):  # (the Newton backend's other services: derivatives ...)
        if name == "newton":
            raise AttributeError(name)
        return getattr(self.newton, name)

    @property
    def deadline(self) -> float | None:
        """The step's deadline (:func:`~fedmodel.subproblems.merit.set_deadline`): the Newton
        solves stop at it, and no multiplier update starts after it."""
        return self.newton.deadline

    @deadline.setter
    def deadline(self, value: float | None) -> None:
        self.newton.deadline = value

    def solve(self, x0: np.ndarray, tol: float, max_iter: int = 200) -> SolveReport:
        p = self.problem
        tol = min(tol, 1e-9)
        outer_beta = p.beta
        mu = [np.maximum(np.asarray(m, dtype=float), 0.0) for m in p.mu]
        nu = [np.asarray(v, dtype=float) for v in p.nu]
        x, iterations, residual, violation = np.asarray(x0, dtype=float), 0, np.inf, np.inf
        try:
            for _ in range(MAX_UPDATES):
                p.beta = self.beta
                p.mu, p.nu = mu, nu
                report = self.newton.solve(x, tol, max_iter)
                x, residual = report.x, float(report.residual)
                iterations += report.iterations
                new_mu, new_nu, change = [], [], 0.0
                for fn, m, v in zip(p.functions, mu, nu):
                    ci, ce = fn.constraint_values(x)
                    m2 = np.maximum(m + self.beta * ci, 0.0) if ci.size else m
                    v2 = v + self.beta * ce if ce.size else v
                    change = max(
                        change,
                        float(np.abs(m2 - m).max(initial=0.0)),
                        float(np.abs(v2 - v).max(initial=0.0)),
                    )
                    new_mu.append(m2)
                    new_nu.append(v2)
                mu, nu = new_mu, new_nu
                self.updates += 1
                last, violation = violation, change / self.beta
                if violation <= tol or not np.isfinite(violation):
                    break
                if self.deadline is not None and time.perf_counter() > self.deadline:
                    break  # (the residual reports the violation reached)
                if violation > VIOLATION_DECREASE * last:
                    self.beta = min(10.0 * self.beta, MAX_BETA)
        finally:
            p.beta = outer_beta
        p.mu, p.nu = mu, nu
        return SolveReport(
            x=x,
            residual=max(residual, violation),
            tolerance=tol,
            iterations=iterations,
            backend=self.name,
        )
