"""A strictly convex quadratic over a box, solved exactly by the primal-dual active-set
method (Hintermueller, Ito and Kunisch, "The primal-dual active set strategy as a
semismooth Newton method", SIAM J. Optim. 13, 2002).

``min_x 1/2 x^T Q x + c^T x  s.t.  lo <= x <= hi`` with ``Q`` symmetric positive definite
(infinite sides allowed). Each iteration guesses the coordinates at their bounds from the
current point and multipliers, solves the equality-constrained problem on the others by
one Cholesky factorisation of their block of ``Q``, and stops when the guess repeats: the
point then satisfies the KKT conditions to rounding. Unlike a first-order method its
iterations do not depend on ``Q``'s conditioning (a proximal-gradient method on a model
with an augmented-Lagrangian penalty of 1e5 took ~1,500 iterations per step; this takes a
handful). It may cycle on a ``Q`` that is not an M-matrix (a secant model of
Maros-Meszaros QSCSD1: no guess repeated in 50 iterations, the point's KKT residual
~1e3): a loop that ends without a repeated guess hands the problem to Clarabel's
interior-point method (:func:`box_qp_interior`, iterations independent of the guesses),
and the loop from the interior point (a polish, as OSQP polishes its ADMM point) returns
its point when its guess repeats; otherwise whichever of the two points has the smaller
KKT residual is returned, and the caller checks it.

Examples
--------
>>> import numpy as np
>>> Q = np.array([[2.0, 0.5], [0.5, 1.0]]); c = np.array([-4.0, 1.0])
>>> x, it, exact = box_qp(Q, c, np.array([0.0, 0.0]), np.array([1.0, np.inf]))
>>> x.tolist()
[1.0, 0.0]
"""

from __future__ import annotations

import time

import numpy as np
import scipy.linalg as sla

#: iteration cap of the active-set loop (it repeats its guess within a few on the
#: benchmark problems; a cycle ends here and the caller checks the point)
BOX_QP_MAX_ITER = 50
#: iteration cap of the interior-point finish (Clarabel takes 15-25 on the cycling model
#: steps of Maros-Meszaros QSCSD1 at its tolerances of 1e-12)
INTERIOR_MAX_ITER = 60
#: iteration cap of the polish after the interior-point finish: the active-set loop from
#: the interior point, whose guess is the active set up to the coordinates ~1e-8 inside a
#: bound (their gradient, which the interior point leaves, read as a subgradient residual
#: of ~10 by prox-quasi-newton's model step on Maros-Meszaros HS118)
POLISH_MAX_ITER = 5


def box_qp(
    Q: np.ndarray,
    c: np.ndarray,
    lo: np.ndarray,
    hi: np.ndarray,
    x0: np.ndarray | None = None,
    max_iter: int = BOX_QP_MAX_ITER,
    deadline: float | None = None,
) -> tuple[np.ndarray, int, bool]:
    """``argmin 1/2 x^T Q x + c^T x`` over ``lo <= x <= hi`` by the primal-dual active-set
    method (module docstring); returns the last point (inside the box), the iterations
    used and whether the point is exact: a loop (or the polish after an interior-point
    finish) whose guess repeated, so that the point solves the KKT conditions up to
    rounding and no iterative method started from it makes its measured residual smaller
    than rounding does (a residual above a caller's tolerance is the rounding of an
    ill-conditioned ``Q``).

    Parameters
    ----------
    Q : ndarray
        Symmetric positive definite ``n x n`` matrix.
    c : ndarray
        Linear term.
    lo, hi : ndarray
        Bounds (``-inf`` / ``inf`` where there is none), ``lo <= hi``.
    x0 : ndarray, optional
        Starting point (its coordinates at a bound start the guess); default the
        projection of 0.
    max_iter : int
        Iteration cap.
    deadline : float, optional
        ``time.perf_counter()`` value the interior-point finish ends by (its time limit).

    Examples
    --------
    >>> import numpy as np
    >>> x, _, exact = box_qp(np.eye(3), np.array([-2.0, 0.5, -0.2]), np.zeros(3), np.ones(3))
    >>> x.tolist(), exact
    ([1.0, 0.0, 0.2], True)
    """
    Q = np.asarray(Q, dtype=float)
    c = np.asarray(c, dtype=float)
    n = c.size
    lo = np.broadcast_to(np.asarray(lo, dtype=float), (n,))
    hi = np.broadcast_to(np.asarray(hi, dtype=float), (n,))
    x = np.clip(np.zeros(n) if x0 is None else np.asarray(x0, dtype=float), lo, hi)
    x, iterations, repeated = _active_set_loop(Q, c, lo, hi, x, max_iter)
    if not repeated:  # (the guesses cycle: the interior-point solve, where it does better)
        interior = box_qp_interior(Q, c, lo, hi, deadline)
        if interior is not None:
            # (the polish: the interior point's guess, made exact by the loop from it)
            polished, polish, repeated = _active_set_loop(Q, c, lo, hi, interior, POLISH_MAX_ITER)
            if repeated:
                return polished, iterations + polish, True
            if kkt_residual(Q, c, lo, hi, interior) < kkt_residual(Q, c, lo, hi, x):
                x = interior
    return x, iterations, repeated


def _active_set_loop(Q, c, lo, hi, x, max_iter: int) -> tuple[np.ndarray, int, bool]:
    """The primal-dual active-set iterations of :func:`box_qp` from ``x`` (inside the box):
    the last point (clipped to the box), the iterations and whether the guess repeated."""
    x = np.array(x, dtype=float)
    lam = Q @ x + c  # (the gradient: the multiplier, >= 0 at a lower bound, <= 0 at an upper)
    unit = np.maximum(np.abs(np.diag(Q)), np.finfo(float).tiny)  # (lam / Q_jj: x's units)
    guess = None
    iterations = 0
    repeated = False
    while iterations < max_iter:
        iterations += 1
        at_lo = (lo - x) + lam / unit > 0
        at_hi = ~at_lo & ((hi - x) + lam / unit < 0)
        key = np.where(at_lo, 1, np.where(at_hi, 2, 0))
        if guess is not None and np.array_equal(key, guess):
            repeated = True
            break
        guess = key
        free = key == 0
        x = np.where(at_lo, lo, np.where(at_hi, hi, x))
        if free.any():
            fixed = ~free
            rhs = -c[free] - Q[np.ix_(free, fixed)] @ x[fixed]
            try:
                x[free] = sla.cho_solve(sla.cho_factor(Q[np.ix_(free, free)]), rhs)
            except (np.linalg.LinAlgError, ValueError):
                x[free] = np.linalg.lstsq(Q[np.ix_(free, free)], rhs, rcond=None)[0]
        lam = np.where(free, 0.0, Q @ x + c)
    return np.clip(x, lo, hi), iterations, repeated


def kkt_residual(Q, c, lo, hi, x) -> float:
    """``||x - clip(x - (Q x + c), lo, hi)||_inf``: 0 exactly at the box QP's minimiser.

    Examples
    --------
    >>> kkt_residual(np.eye(2), np.array([-1.0, 1.0]), np.zeros(2), np.ones(2), np.array([1.0, 0.0]))
    0.0
    """
    x = np.asarray(x, dtype=float)
    return float(np.abs(x - np.clip(x - (Q @ x + c), lo, hi)).max(initial=0.0))


def box_qp_interior(Q, c, lo, hi, deadline: float | None = None) -> np.ndarray | None:
    """``argmin 1/2 x^T Q x + c^T x`` over ``lo <= x <= hi`` by Clarabel's interior-point
    method at tight tolerances (1e-12; a box QP's iterations do not depend on an active-set
    guess; at most :data:`INTERIOR_MAX_ITER` iterations, and with ``deadline`` a
    ``time.perf_counter()`` value, Clarabel's time limit up to it), clipped to the box;
    None when Clarabel returns no finite point or the deadline has passed.

    Clarabel runs on one thread: its parallel factorisation starts a process-wide thread
    pool, which a process forked afterwards inherits without its threads, so that a
    parallel factorisation there waits forever (also past the time limit). One thread
    neither starts that pool nor waits on one inherited.

    Examples
    --------
    >>> x = box_qp_interior(np.eye(2), np.array([-2.0, 0.5]), np.zeros(2), np.ones(2))
    >>> np.round(x, 6).tolist()
    [1.0, 0.0]
    """
    import clarabel
    import scipy.sparse as sp

    c = np.asarray(c, dtype=float)
    n = c.size
    lo = np.broadcast_to(np.asarray(lo, dtype=float), (n,))
    hi = np.broadcast_to(np.asarray(hi, dtype=float), (n,))
    below, above = np.isfinite(lo), np.isfinite(hi)
    eye = sp.eye(n, format="csr")
    A = sp.vstack([-eye[below], eye[above]]).tocsc()
    b = np.concatenate([-lo[below], hi[above]])
    settings = clarabel.DefaultSettings()
    settings.verbose = False
    settings.tol_gap_abs = settings.tol_gap_rel = settings.tol_feas = 1e-12
    settings.tol_ktratio = 1e-10
    settings.max_iter = INTERIOR_MAX_ITER
    settings.max_threads = 1
    if deadline is not None:
        left = deadline - time.perf_counter()
        if left <= 0.0:
            return None
        settings.time_limit = left
    P = sp.csc_matrix(np.triu(np.asarray(Q, dtype=float)))
    cones = [clarabel.NonnegativeConeT(int(b.size))] if b.size else []
    solution = clarabel.DefaultSolver(P, c, A, b, cones, settings).solve()
    x = np.asarray(solution.x, dtype=float)
    if x.size != n or not np.all(np.isfinite(x)):
        return None
    return np.clip(x, lo, hi)


class _WithoutH:
    """A merit problem seen without ``h`` (its other attributes live): the Newton backend's
    derivatives of the party terms, which leave ``h`` out, built on a problem whose ``h``
    is not smooth."""

    def __init__(self, problem):
        from fedmodel.compiler.regularizer import Regularizer

        self._problem = problem
        self.regularizer = Regularizer.from_pieces([], [])

    def __getattr__(self, name):
        return getattr(self._problem, name)


class BoxQuadraticSolver:
    """The exact step of a merit problem that is a quadratic over a box: quadratic party
    terms and equality constraints (a constant Hessian, :attr:`NewtonSolver.constant_hessian
    <fedmodel.subproblems.newton.NewtonSolver.constant_hessian>`), the proximal term, and an
    ``h`` of bounds and sums of squares (:meth:`Regularizer.bound_form
    <fedmodel.compiler.regularizer.Regularizer.bound_form>`). One :func:`box_qp` solve on
    the Newton backend's Hessian; a point whose measured residual misses the tolerance (a
    cycle of the active-set loop) is finished by L-BFGS-B. Raises
    :class:`~fedmodel.compiler.glm.NotRecognised` for another problem.

    Examples
    --------
    >>> import cvxpy as cp
    >>> import fedmodel as fm
    >>> from fedmodel.subproblems.merit import MeritProblem
    >>> m = fm.Model("box")
    >>> x = m.variable(2, name="x", bounds=(0.0, 1.0))
    >>> m.server.minimize(cp.sum_squares(x - np.array([2.0, -1.0])))
    >>> m.client("c").minimize(cp.sum_squares(x))
    >>> c = m.compile()
    >>> problem = MeritProblem([c.server], 1.0, c.regularizer)
    >>> problem.set(sigma=0.0, center=np.zeros(2))
    >>> BoxQuadraticSolver(problem).solve(np.zeros(2), 1e-10).x.tolist()
    [1.0, 0.0]
    """

    name = "box-qp"

    def __init__(self, problem):
        from fedmodel.compiler.glm import NotRecognised
        from fedmodel.subproblems.newton import NewtonSolver

        reg = problem.regularizer
        form = None if reg.is_smooth else reg.bound_form(problem.n)
        if form is None:
            raise NotRecognised("h is not bounds and sums of squares")
        self.problem = problem
        self.newton = NewtonSolver(_WithoutH(problem))
        if not self.newton.constant_hessian:
            raise NotRecognised("the terms are not quadratic (or have inequality rows)")
        self.q, self.lo, self.hi = form
        self.deadline: float | None = None
        self._fallback = None

    def solve(self, x0: np.ndarray, tol: float, max_iter: int = 200):
        from fedmodel.compiler.glm import NotRecognised
        from fedmodel.subproblems.merit import SolveReport
        from fedmodel.subproblems.quasi_newton import QuasiNewtonSolver

        p = self.problem
        x0 = np.clip(np.asarray(x0, dtype=float), self.lo, self.hi)
        try:
            _, g, H = self.newton.derivatives(x0, p.mu, p.nu)
        except NotRecognised:
            H = None
        if H is not None:
            sigma = p.sigma
            if np.ndim(sigma) == 2:
                Q = H + sigma + np.diag(self.q)
                shift = sigma @ p.center
            else:  # (a diagonal metric: added on Q's diagonal, no n x n products)
                Q = np.array(H, dtype=float)
                diagonal = np.diag_indices(p.n)
                Q[diagonal] += np.broadcast_to(sigma, (p.n,))
                Q[diagonal] += self.q
                shift = sigma * p.center
            x, iterations, _ = box_qp(Q, g - H @ x0 - shift, self.lo, self.hi, x0=x0)
            residual = p.residual(x)
            if residual <= tol:
                return SolveReport(x, residual, tol, iterations, self.name)
            x0 = x
        if self._fallback is None:
            self._fallback = QuasiNewtonSolver(p)
        self._fallback.deadline = self.deadline
        report = self._fallback.solve(x0, tol, max_iter)
        report.backend = f"{self.name}->lbfgs"
        return report
