"""Projection backend: an exact step whose program is only simple sets on whole variables.

A party's exact step (:mod:`fedmodel.subproblems.conic_prox`) with no objective term, a
zero ``h``, no cone or equality constraint, and inequality constraints that are each one
simple set on one whole shared variable -- a lower bound ``v >= lo``, an upper bound
``v <= hi`` (nonnegativity included), a norm ball ``norm(v, 2) <= r`` -- is

    argmin_x (1/2) ||x - c||_sigma^2   s.t.  x in  S_1 x ... x S_k,

the projection of the centre ``c`` on a product of sets, each with a closed form: a clip
per coordinate, a radial scaling per ball. The sets are read by the parser of ``h``
(:func:`~fedmodel.compiler.regularizer.parse_regularizer_term` and
:meth:`~fedmodel.compiler.regularizer.Regularizer.from_model_terms`, whose prox is the
projection); a program with any other term or constraint is not taken (:meth:`recognise`
returns None) and goes to the cvxpy backend.

The multipliers of the constraint rows are the step's KKT multipliers in closed form,
per row of the compiled constraint ``g_j(x) <= 0`` (the form the hard-constraint cvxpy
backend hands Clarabel, so the same order, sign and scale as its duals): a bound's row is
affine in its coordinate, ``g_j = a_j (x_i - b_j)``, with multiplier ``sigma_i (c_i -
x_i) / a_j`` on the side where the clip is active and 0 elsewhere; a ball's row is a
function of ``||v||`` alone, whose derivative ``g'`` at the radius is read once from the
compiled row, with multiplier ``sigma (||c_v|| - r)_+ / g'``. A full metric, or a
diagonal one whose entries differ across a ball's variable, has no closed form here: such a
step goes to the cvxpy backend, built at that step.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from fedmodel.compiler.regularizer import Regularizer, parse_regularizer_term
from fedmodel.errors import ModelError, UnsupportedError
from fedmodel.subproblems.merit import MeritProblem, SolveReport, set_deadline

#: relative agreement asked of the compiled rows with the sets the parser read (a row that
#: is not affine in its coordinate, a ball's row whose zero level set is not the sphere)
ROW_CHECK = 1e-10


def _simple_sets(problem: MeritProblem) -> list[tuple[str, slice, int, int]] | None:
    """``(kind, slice, first row, rows)`` of each inequality constraint of the problem's one
    program, when each is one simple set on one whole shared variable, no variable has two
    sets of one kind nor a ball with a bound, and the program has nothing else; else None."""
    if len(problem.programs) != 1 or not problem.regularizer.is_zero:
        return None
    prog = problem.programs[0]
    if prog.objective or prog.cones or prog.eq or not prog.ineq:
        return None
    layout = prog.layout
    shared = list(layout.shared_variables)
    sets, seen, row = [], set(), 0
    for c in prog.ineq:
        if c.internal or c.source is None:
            return None
        try:
            items = parse_regularizer_term(c.source, shared)
        except (UnsupportedError, ModelError):
            return None
        if len(items) != 1 or items[0][0] not in ("lower", "upper", "ball"):
            return None
        kind, v, _ = items[0]
        if c.size != (1 if kind == "ball" else v.size) or (v.id, kind) in seen:
            return None
        seen.add((v.id, kind))
        sets.append((kind, layout.slice_of(v), row, c.size))
        row += c.size
    balls = {v_id for v_id, kind in seen if kind == "ball"}
    if any(v_id in balls for v_id, kind in seen if kind != "ball"):
        return None
    return sets


class ProjectionSolver:
    """Exact step of a party whose program is only simple sets (see the module docstring):
    the projection of the centre and its multipliers in closed form. Build it with
    :meth:`recognise`.

    Parameters
    ----------
    problem : MeritProblem
        The party's merit problem (one program).
    sets : list of tuple
        ``(kind, slice, first row, rows)`` per inequality constraint (:meth:`recognise`).
    fallback : callable
        Builds the backend of a step with no closed form here (a full metric, or one that
        differs across a ball's variable), at the first such step.
    """

    name = "projection"

    def __init__(
        self, problem: MeritProblem, sets: list[tuple[str, slice, int, int]], fallback: Callable
    ):
        self.problem = problem
        prog = problem.programs[0]
        #: the sets as ``h`` (its prox with step ``1 / sigma`` is the projection)
        self.sets = Regularizer.from_model_terms([c.source for c in prog.ineq], prog.layout)
        fn = problem.functions[0]
        n, m = problem.n, prog.m_ineq
        zero = fn.constraint_values(np.zeros(n))[0]
        ones = fn.constraint_values(np.ones(n))[0]
        probe = np.random.default_rng(0).uniform(-2.0, 2.0, n)
        at_probe = fn.constraint_values(probe)[0]
        #: per bound: ``(slice, rows, a)`` of the upper and of the lower bounds
        self.upper, self.lower = [], []
        #: per ball: ``(slice, row, radius, g')``
        self.balls = []
        for kind, s, row, size in sets:
            rows = slice(row, row + size)
            if kind == "ball":
                self.balls.append((s, row, *self._ball_row(fn, s, row, zero[row])))
                continue
            a = ones[rows] - zero[rows]
            affine = np.abs(at_probe[rows] - zero[rows] - a * probe[s])
            sign = 1.0 if kind == "upper" else -1.0
            size_of = 1.0 + np.abs(zero[rows]) + np.abs(a)
            if not np.all(sign * a > 0) or np.any(affine > ROW_CHECK * size_of):
                raise UnsupportedError(f"constraint rows {row}..{row + size} are not a bound")
            (self.upper if kind == "upper" else self.lower).append((s, rows, a))
        for p in self.sets.pieces:  # (a coordinate with equal bounds has no unique multiplier)
            if p.has_box and np.any(np.asarray(p.lower) >= np.asarray(p.upper)):
                raise UnsupportedError("a bound pair without interior")
        self._m = m
        self._make_fallback = fallback
        self._fallback = None
        #: the run's deadline (:func:`~fedmodel.subproblems.merit.set_deadline`), handed to
        #: the fallback's iterative solve; the closed form needs none
        self.deadline: float | None = None

    @classmethod
    def recognise(cls, problem: MeritProblem, fallback: Callable) -> ProjectionSolver | None:
        """This backend for ``problem`` when its program is only simple sets and its compiled
        rows are theirs; None otherwise. ``fallback()`` builds the backend of a step with no
        closed form."""
        sets = _simple_sets(problem)
        if sets is None:
            return None
        try:
            return cls(problem, sets, fallback)
        except (UnsupportedError, ModelError):
            return None

    def _ball_row(self, fn, s: slice, row: int, at_zero: float) -> tuple[float, float]:
        """The radius of the ball of compiled row ``row`` on slice ``s`` and the derivative
        ``g'`` of the row along the radius there, checked on two directions."""
        radius = next(p.radius for q, p in zip(self.sets.slices, self.sets.pieces) if q == s)
        n = self.problem.n
        adjoint = np.zeros(fn.m_ineq)
        adjoint[row] = 1.0
        slopes = []
        for seed in (1, 2):
            u = np.zeros(n)
            u[s] = np.random.default_rng(seed).normal(size=s.stop - s.start)
            u /= np.linalg.norm(u)
            value, grad = fn.c.vjp(radius * u, adjoint)
            outward = float(grad.dot(u))
            collinear = np.linalg.norm(grad - outward * u)
            if not (
                at_zero < 0
                and abs(value[row]) <= ROW_CHECK * max(1.0, abs(at_zero))
                and outward > 0
                and collinear <= ROW_CHECK * outward
            ):
                raise UnsupportedError(f"constraint row {row} is not a norm ball")
            slopes.append(outward)
        if abs(slopes[0] - slopes[1]) > ROW_CHECK * slopes[0]:
            raise UnsupportedError(f"constraint row {row} is not a norm ball")
        return radius, slopes[0]

    def solve(self, x0: np.ndarray, tol: float, max_iter: int = 1) -> SolveReport:
        p = self.problem
        if np.ndim(p.sigma) == 2:  # (a full metric: the cvxpy backend says what it takes)
            return self._fallback_solve(x0, tol, max_iter)
        sigma = np.broadcast_to(np.asarray(p.sigma, dtype=float), (p.n,))
        if any(np.ptp(sigma[s]) > 0 for s, *_ in self.balls):
            return self._fallback_solve(x0, tol, max_iter)
        c = p.center
        x = self.sets.prox(c, 1.0 / sigma)
        pull = sigma * (c - x)  # (sigma (c - x): the sets' share of stationarity)
        mu = np.zeros(self._m)
        for s, rows, a in self.upper:
            mu[rows] = np.maximum(pull[s], 0.0) / a
        for s, rows, a in self.lower:
            mu[rows] = np.minimum(pull[s], 0.0) / a
        for s, row, radius, slope in self.balls:
            mu[row] = sigma[s.start] * max(float(np.linalg.norm(c[s])) - radius, 0.0) / slope
        p.mu[0] = mu
        return SolveReport(x, p.residual(x), tol, 1, self.name, "closed form")

    def _fallback_solve(self, x0: np.ndarray, tol: float, max_iter: int) -> SolveReport:
        """The cvxpy backend's step (a full metric, or one that differs across a ball's
        variable)."""
        if self._fallback is None:
            self._fallback = self._make_fallback()
        set_deadline(self._fallback, self.deadline)
        return self._fallback.solve(x0, tol, max_iter)
