"""Federated proximal quasi-Newton for Algorithm 1's subproblem when ``h`` is not smooth
(prox-al's ``inner_solver="prox-quasi-newton"``).

Algorithm 1 of seed 000 needs, at outer iteration ``k``, a point ``w`` with
``dist(0, d l_k(w)) <= tau_k``, ``l_k = S_k + h`` where ``S_k = P_{0,k} + sum_i P_{i,k}``
(eqs. 10-11) is smooth -- the clients' and the server's terms with their
augmented-Lagrangian terms and shares of the proximal term -- and ``h`` is the
regulariser with a closed-form prox (:class:`~fedmodel.compiler.regularizer.Regularizer`:
l1, group norms, sums of squares, boxes, a norm ball). The federated quasi-Newton loop of
:mod:`~fedmodel.algorithms.proxal.newton_inner` needs a smooth ``h``; this module is its
proximal form (a proximal Newton-type method: Lee, Sun and Saunders, "Proximal Newton-type
methods for minimizing composite functions", SIAM J. Optim. 2014, PNOPT; Scheinberg and
Tang, Math. Programming 2016):

1. each round the server broadcasts a point; every client returns ``P_{i,k}``'s value and
   gradient (and, with ``curvature_directions``, its Hessian-vector products), exactly the
   messages of ``inner_solver="quasi-newton"`` (the client cannot tell the two apart: ``h``
   lives on the server only);
2. the server keeps the same secant model ``B`` of ``S_k``'s Hessian
   (:class:`~fedmodel.algorithms.proxal.newton_inner.SecantModel`, or the limited-memory
   :class:`~fedmodel.algorithms.proxal.newton_inner.LimitedSecantModel` above 2000 shared
   variables, with its known diagonal: the server's share of the proximal term) and solves
   the **model subproblem** ``min_s g^T s + s^T B s / 2 + h(w + s)`` on its own, with no
   communication (:func:`model_step`: with ``h`` of bounds and sums of squares and a dense
   model, the exact box-constrained QP (:func:`bounded_model_step`); else accelerated
   proximal gradient with adaptive restart on the quadratic model, ``B`` applied as a dense matrix or in the compact form
   ``D + U diag(c) U^T`` of the limited-memory model, to a relative accuracy of the
   current residual: an inexact proximal Newton step, PNOPT's adaptive stopping);
3. a backtracking (Armijo) line search on ``F = S_k + h`` along ``d = x_hat - w`` with
   the decrease ``Delta = g^T d + h(w + d) - h(w) < 0`` (Lee, Sun and Saunders, eq. 2.9),
   values from the clients; a rejected trial point updates the model and gives a new
   model step first (as the smooth loop's ``remodel``);
4. the stopping test is ``dist_inf(0, grad S_k(w) + dh(w)) <= tau_k``, measured at the
   accepted point with the regulariser's exact subdifferential distance
   (:meth:`~fedmodel.compiler.regularizer.Regularizer.dist_subdiff`) on the clients'
   summed gradient: exactly the requirement of Theorem 4.2 (the inner test), as the smooth
   loop's ``||grad l_k||_inf <= tau_k``.

Messages are those of the quasi-Newton inner solver: ``d + 1`` floats per client and round
(value and gradient of its ``P_{i,k}`` at the server's point), plus ``k d`` for ``k``
curvature directions where they are on (at most 500 shared variables). Nothing of ``h``
or of the model subproblem leaves the server.

Examples
--------
>>> from fedmodel.compiler.regularizer import Regularizer, VariablePiece
>>> reg = Regularizer.from_pieces([slice(0, 2)], [VariablePiece(l1=1.0)])
>>> A = np.diag([2.0, 1.0]); b = np.array([3.0, 0.5])
>>> evaluate = lambda w: (0.5 * w @ A @ w - b @ w, A @ w - b, A)
>>> w0 = np.zeros(2)
>>> out = federated_prox_newton(evaluate, (w0, *evaluate(w0)), reg, tau=1e-9, max_rounds=10)
>>> out.w.round(6).tolist(), out.satisfied
([1.0, 0.0], True)
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from fedmodel.algorithms.proxal.inner import InnerOutcome
from fedmodel.algorithms.proxal.newton_inner import (
    MIN_STEP,
    ROUNDING_RELATIVE,
    LimitedInverse,
    NewtonOutcome,
    armijo_holds,
    rounding_step_accepted,
)
from fedmodel.algorithms.proxal.newton_route import NewtonClient, NewtonInner, QuasiNewtonInner
from fedmodel.algorithms.proxal.obstacles import (
    inequality_walls,
    prox_qn_obstacle,
    restricted_domain_party,
)
from fedmodel.algorithms.proxal.secant_rounds import SecantRounds
from fedmodel.compiler.regularizer import Regularizer
from fedmodel.subproblems.box_qp import box_qp
from fedmodel.subproblems.merit import MeritProblem
from fedmodel.subproblems.select import make_solver

#: the model subproblem is solved to this fraction of the residual at the current point
#: (an inexact proximal Newton step; PNOPT's adaptive stopping with a fixed forcing term),
#: and never below SUBPROBLEM_FLOOR * tau (more accuracy cannot move the stopping test)
SUBPROBLEM_FORCING = 1e-4
SUBPROBLEM_FLOOR = 0.1
#: accelerated proximal-gradient iterations per model subproblem (server-side, no rounds)
SUBPROBLEM_MAX_ITER = 2000
#: rejected trial points at one iterate that give a new model step before backtracking
REMODEL = 2
#: the loop ends short of ``tau`` at its rounding floor: this many rounds without the
#: measured residual falling below FLOOR_PROGRESS of its best, while the model step
#: predicts a decrease below the values' rounding (Maros-Meszaros CVXQP3_M at eps 1e-6,
#: beta 1e8: the residual wandered 1e-5 - 2e-5 for 500 rounds an outer iteration, against
#: a tau_k of 7.6e-6)
FLOOR_ROUNDS = 20
FLOOR_PROGRESS = 0.5
#: the damping of an exact model (:func:`next_damping`) grows by this factor after a step
#: the line search shortened and shrinks by it after a full step, and is 0 below
#: DAMPING_FLOOR times the gradient's largest entry
DAMPING_GROWTH = 4.0
DAMPING_FLOOR = 1e-12


class ModelOperator:
    """``B v`` for the quadratic model of the smooth part: a dense symmetric matrix, or the
    limited-memory model (:class:`LimitedInverse`) in the compact form ``diag(D) + U
    diag(c) U^T`` (two matrix products per application instead of the ``O(m)`` Python
    loop of its BFGS recursion), plus ``damping`` times the identity, and an upper bound
    ``L`` of its largest eigenvalue.

    Examples
    --------
    >>> op = ModelOperator(np.array([[2.0, 1.0], [1.0, 2.0]]))
    >>> op.times(np.array([1.0, 0.0])).tolist(), round(op.lipschitz(), 6) >= 3.0
    ([2.0, 1.0], True)
    """

    def __init__(self, model, damping: float = 0.0):
        self.model = model
        self.damping = float(damping)
        self._L: float | None = None
        if isinstance(model, LimitedInverse):
            model.times(np.zeros(model.diag.size))  # (builds its direct recursion)
            cols, coef = [], []
            for (a, c), (_, y, rho) in zip(model._direct, model.pairs):
                cols += [a, y]
                coef += [-c, rho]
            self.diag = np.asarray(model.diag, dtype=float) + self.damping
            self.U = np.array(cols).T if cols else np.zeros((self.diag.size, 0))
            self.coef = np.array(coef, dtype=float)
            self.H = None
        else:
            self.H = np.asarray(model, dtype=float)
            if self.damping:
                self.H = self.H + self.damping * np.eye(self.H.shape[0])

    def times(self, v: np.ndarray) -> np.ndarray:
        if self.H is not None:
            return self.H @ v
        return self.diag * v + self.U @ (self.coef * (self.U.T @ v))

    def lipschitz(self) -> float:
        """An estimate of the largest eigenvalue (power iteration; :func:`model_step`
        doubles it when a step shows it too small)."""
        if self._L is None:
            n = self.diag.size if self.H is None else self.H.shape[0]
            v = np.random.default_rng(0).standard_normal(n)
            lam = 0.0
            for _ in range(30):
                nv = float(np.linalg.norm(v))
                if not nv > 0:
                    break
                v = v / nv
                u = self.times(v)
                lam_new = float(v @ u)
                v = u
                if lam and abs(lam_new - lam) <= 1e-3 * abs(lam_new):
                    lam = lam_new
                    break
                lam = lam_new
            self._L = max(1.05 * lam, 1e-12)
        return self._L


def model_step(
    g: np.ndarray,
    op: ModelOperator,
    reg: Regularizer,
    w: np.ndarray,
    tol: float,
    max_iter: int = SUBPROBLEM_MAX_ITER,
    deadline: float | None = None,
) -> tuple[np.ndarray, float, int]:
    """Approximately ``argmin_x g^T (x - w) + (x - w)^T B (x - w) / 2 + h(x)``, by
    accelerated proximal gradient (FISTA) with adaptive (function-value and gradient)
    restart, from ``x = w``, until ``dist_inf(0, g + B(x - w) + dh(x)) <= tol``. Where
    ``h`` is bounds and sums of squares and ``B`` dense, the box QP is solved exactly first
    (:func:`bounded_model_step`); its point is returned when it meets ``tol`` or when it is
    exact (the residual is then rounding, which no FISTA iteration lowers), and starts
    FISTA's comparison otherwise.

    Parameters
    ----------
    g : ndarray
        Gradient of the smooth part at ``w``.
    op : ModelOperator
        The model ``B`` (positive definite).
    reg : Regularizer
        ``h`` (its exact prox with a scalar step).
    w : ndarray
        The current point (in ``dom h``).
    tol : float
        Target of the subproblem's measured residual.
    max_iter : int
        Iteration cap (the best point so far is returned).
    deadline : float, optional
        ``time.perf_counter()`` value after which it returns its best point.

    Returns
    -------
    x, residual, iterations
        The point ``x_hat`` (``x_hat - w`` is the step), its measured residual and the
        iterations used.

    Examples
    --------
    >>> from fedmodel.compiler.regularizer import Regularizer, VariablePiece
    >>> reg = Regularizer.from_pieces([slice(0, 2)], [VariablePiece(l1=1.0)])
    >>> op = ModelOperator(np.diag([1.0, 4.0]))
    >>> x, res, _ = model_step(np.array([-3.0, 0.5]), op, reg, np.zeros(2), 1e-10)
    >>> x.round(8).tolist(), res <= 1e-10
    ([2.0, 0.0], True)
    """
    x = np.array(w, dtype=float)
    gx = np.array(g, dtype=float)  # grad q(x)
    best = (x, reg.dist_subdiff(x, gx), 0)
    if best[1] <= tol:
        return best
    bounded = bounded_model_step(g, op, reg, w, deadline)
    if bounded is not None:
        *step, exact = bounded
        if step[1] <= tol or exact:  # (exact: its residual is rounding)
            return tuple(step)
        best = min(best, tuple(step), key=lambda b: b[1])
    L = op.lipschitz()
    y, gy, t = x, gx, 1.0
    phi_x = reg.value(x)  # q(x) - q(w) + h(x), q the quadratic model
    for it in range(1, int(max_iter) + 1):
        while True:
            x_new = reg.prox(y - gy / L, 1.0 / L)
            delta = x_new - y
            Bd = op.times(delta)
            curv = float(delta @ Bd)
            if curv <= L * float(delta @ delta) * (1 + 1e-12) or not np.isfinite(curv):
                break
            L *= 2.0  # (the estimate was too small: a majorisation must hold)
        gx_new = gy + Bd
        res = reg.dist_subdiff(x_new, gx_new)
        # q(x_new) - q(w) = (g + grad q(x_new))^T (x_new - w) / 2 for the quadratic q
        q_new = 0.5 * float((g + gx_new) @ (x_new - w))
        phi_new = q_new + reg.value(x_new)
        if res < best[1]:
            best = (x_new, res, it)
        if res <= tol:
            return x_new, res, it
        if deadline is not None and time.perf_counter() > deadline:
            break
        # adaptive restart (O'Donoghue and Candes 2015): the objective went up, or the
        # momentum points against the proximal-gradient step
        restart = phi_new > phi_x or float((y - x_new) @ (x_new - x)) > 0
        if restart:
            t_new, mom = 1.0, 0.0
        else:
            t_new = 0.5 * (1.0 + np.sqrt(1.0 + 4.0 * t * t))
            mom = (t - 1.0) / t_new
        gx_old, x_old = gx, x
        x, gx, phi_x, t = x_new, gx_new, phi_new, t_new
        if mom:
            y = x + mom * (x - x_old)
            gy = gx + mom * (gx - gx_old)
        else:
            y, gy = x, gx
    return best


def bounded_model_step(
    g: np.ndarray,
    op: ModelOperator,
    reg: Regularizer,
    w: np.ndarray,
    deadline: float | None = None,
):
    """:func:`model_step`'s subproblem solved exactly when ``h`` is bounds and sums of
    squares only and the model is a dense matrix: a box-constrained QP
    (:func:`~fedmodel.subproblems.box_qp.box_qp`, whose iterations do not depend on the
    model's conditioning); ``(x, residual, iterations, exact)`` (``exact``: the box QP's
    point solves its KKT conditions up to rounding) or None when ``h`` has another piece or
    the model is limited-memory.

    Examples
    --------
    >>> from fedmodel.compiler.regularizer import Regularizer, VariablePiece
    >>> reg = Regularizer.from_pieces(
    ...     [slice(0, 2)], [VariablePiece(lower=0.0, upper=1.0, has_box=True)])
    >>> x, res, _, exact = bounded_model_step(
    ...     np.array([-3.0, 0.5]), ModelOperator(np.diag([1.0, 4.0])), reg, np.zeros(2))
    >>> x.tolist(), res, exact
    ([1.0, 0.0], 0.0, True)
    """
    if op.H is None:
        return None
    form = reg.bound_form(w.size)
    if form is None:
        return None
    q, lo, hi = form
    # q_model(x) = g^T (x - w) + (x - w)^T B (x - w) / 2, plus h's squares: Q = B + diag(q)
    Q = op.H + np.diag(q)
    x, iterations, exact = box_qp(Q, g - op.H @ w, lo, hi, x0=w, deadline=deadline)
    if not np.all(np.isfinite(x)):
        return None
    return x, reg.dist_subdiff(x, g + op.times(x - w)), iterations, exact


def next_damping(lam: float, g: np.ndarray, step: np.ndarray, full: bool) -> float:
    """The damping ``lam`` of the next model ``B + lam I`` after an accepted ``step`` from a
    point with gradient ``g`` (a regularised Newton method: Li, Fukushima, Qi and
    Yamashita, "Regularized Newton methods for convex minimization problems with singular
    solutions", Comput. Optim. Appl. 28, 2004, take ``lam`` of the order of ``||g||``).

    An exact generalised Hessian of a piecewise-quadratic ``S`` (the augmented-Lagrangian
    terms of rows the parties hold) has no curvature along the pieces inactive at the
    point: on an LP the model's minimiser runs to the bounds of ``h`` and the line search
    spends rounds halving it. A step the line search shortened (or that needed a new
    model) sets ``lam >= ||g|| / ||step||``, which makes the next model step about as long
    as the one accepted; a full step (``full``) divides ``lam`` by
    :data:`DAMPING_GROWTH`, down to 0 once it is at rounding level of ``||g||``.

    Examples
    --------
    >>> g = np.array([3.0, 4.0])
    >>> next_damping(0.0, g, np.array([0.5, 0.0]), full=False)
    10.0
    >>> next_damping(10.0, g, np.array([0.1, 0.0]), full=True)
    2.5
    """
    if full:
        scale = float(np.abs(g).max(initial=0.0))
        return lam / DAMPING_GROWTH if lam > DAMPING_FLOOR * max(1.0, scale) else 0.0
    length = float(np.linalg.norm(step))
    return max(DAMPING_GROWTH * lam, float(np.linalg.norm(g)) / length if length > 0 else 0.0)


def federated_prox_newton(
    evaluate: Callable[[np.ndarray], tuple[float, np.ndarray, object]],
    start: tuple[np.ndarray, float, np.ndarray, object],
    reg: Regularizer,
    tau: float,
    max_rounds: int,
    deadline: float | None = None,
    remodel: int = REMODEL,
    on_accept: Callable[[np.ndarray], None] | None = None,
    noise: float = 0.0,
    damping: bool = False,
) -> NewtonOutcome:
    """Minimise ``S + h`` to ``dist_inf(0, grad S(w) + dh(w)) <= tau`` by proximal
    (quasi-)Newton steps with a backtracking line search on ``S + h``. At its rounding
    floor (:data:`FLOOR_ROUNDS`: the residual no longer halves and the model step predicts
    a decrease the values cannot resolve), or where the model's step is ``0``, it returns
    unsatisfied with ``floor`` set.

    Parameters
    ----------
    evaluate : callable
        ``w -> (S(w), grad S(w), model)``: one round (broadcast ``w``, collect the
        parties' shares, add them up); ``model`` is the curvature the next step uses (a
        dense matrix or :class:`LimitedInverse`), a new object when it changed.
    start : (w, value, gradient, model)
        The starting point (in ``dom h``) and its evaluation.
    reg : Regularizer
        ``h``, with its exact prox and subdifferential distance.
    tau : float
        Target of the measured ``dist_inf(0, grad S(w) + dh(w))``.
    max_rounds : int
        Evaluation rounds allowed.
    deadline : float, optional
        ``time.perf_counter()`` value after which the loop returns (``timed_out``).
    remodel : int
        Rejected trial points at one iterate that give a new model step (from the model
        their evaluation updated) before the line search backtracks.
    on_accept : callable, optional
        Called with each point the loop moves to (the start included).
    noise : float, optional
        A bound of the noise on each value of ``S`` (dp's noised sums): the relaxed
        Armijo test (:func:`~fedmodel.algorithms.proxal.newton_inner.armijo_holds`); the
        loop takes one step at least.
    damping : bool, optional
        Damp the model, ``B + lam I``, with ``lam`` from :func:`next_damping` after each
        accepted step (for exact generalised Hessians: prox-newton).

    Returns
    -------
    NewtonOutcome
        The last accepted point, ``residual`` its measured subdifferential distance and
        ``gradient`` ``grad S`` there.
    """
    w, val, g, model = start
    rounds = backtracks = 0
    ops: dict[int, ModelOperator] = {}
    lam = 0.0  # (the damping of the model: B + lam I)

    def operator(m):
        op = ops.get(id(m))
        if op is None or op.model is not m or op.damping != lam:
            ops.clear()
            op = ops[id(m)] = ModelOperator(m, lam)
        return op

    def direction(m, residual):
        tol = max(SUBPROBLEM_FORCING * residual, SUBPROBLEM_FLOOR * tau)
        op = operator(m)
        x_hat, _, _ = model_step(g, op, reg, w, tol, deadline=deadline)
        d = x_hat - w
        delta = float(g @ d) + reg.value(x_hat) - reg.value(w)
        if not (delta < 0 and np.all(np.isfinite(d))):
            # (an inaccurate model step): the proximal-gradient step of the model, whose
            # decrease is at most -L ||d||^2 < 0
            L = op.lipschitz()
            x_hat = reg.prox(w - g / L, 1.0 / L)
            d = x_hat - w
            delta = float(g @ d) + reg.value(x_hat) - reg.value(w)
        return d, delta

    F = val + reg.value(w)
    best, best_round = np.inf, 0  # (the residual's last halving: the floor's clock)
    while True:
        if on_accept is not None:
            on_accept(w)
        remodels = 0
        residual = reg.dist_subdiff(w, g)
        if residual <= tau and (rounds or not noise):  # (noisy: one step at least)
            return NewtonOutcome(w, rounds, residual, True, backtracks=backtracks, gradient=g)
        if rounds >= max_rounds or (deadline is not None and time.perf_counter() > deadline):
            timed_out = rounds < max_rounds
            return NewtonOutcome(w, rounds, residual, False, False, timed_out, backtracks, g)
        if residual < FLOOR_PROGRESS * best:
            best, best_round = residual, rounds
        current = model
        d, delta = direction(current, residual)
        floor = rounds - best_round >= FLOOR_ROUNDS and -delta <= ROUNDING_RELATIVE * max(
            1.0, abs(F)
        )
        if floor or not np.any(d):
            # (the rounding floor, or no step: the model's minimiser is w at rounding
            # level; as at max_rounds, the outer loop goes on from w)
            return NewtonOutcome(
                w, rounds, residual, False, backtracks=backtracks, gradient=g, floor=True
            )
        delta = min(delta, 0.0)  # (>= 0 at rounding level: only the test below accepts)
        t = 1.0
        while True:
            trial = w + t * d
            val_t, g_t, model_t = evaluate(trial)
            rounds += 1
            F_t = val_t + reg.value(trial)
            if armijo_holds(F_t, F, t * delta, noise):
                break
            if rounding_step_accepted(F_t, F, reg.dist_subdiff(trial, g_t), residual):
                break
            backtracks += 1
            if rounds >= max_rounds or (deadline is not None and time.perf_counter() > deadline):
                timed_out = rounds < max_rounds
                return NewtonOutcome(w, rounds, residual, False, False, timed_out, backtracks, g)
            if remodels < remodel and model_t is not current and np.isfinite(val_t):
                remodels += 1
                current = model_t
                d, delta = direction(current, residual)
                if not np.any(d):  # (no step: as above)
                    return NewtonOutcome(
                        w, rounds, residual, False, backtracks=backtracks, gradient=g, floor=True
                    )
                delta = min(delta, 0.0)
                t = 1.0
                continue
            # minimiser of the quadratic through (0, F), slope delta, (t, F_t), kept in
            # [0.1 t, 0.5 t] (delta bounds the directional derivative of F from above)
            curvature = F_t - F - delta * t
            t_new = -delta * t * t / (2.0 * curvature) if curvature > 0 else 0.5 * t
            t = min(max(t_new, 0.1 * t), 0.5 * t) if np.isfinite(F_t) else 0.1 * t
            if t < MIN_STEP or not np.isfinite(t):
                return NewtonOutcome(
                    w, rounds, residual, False, True, backtracks=backtracks, gradient=g
                )
        if damping:
            lam = next_damping(lam, g, t * d, t == 1.0 and not remodels)
        w, val, g, model, F = trial, val_t, g_t, model_t, F_t


def prox_outcome(host, out: NewtonOutcome) -> InnerOutcome:
    """The :class:`InnerOutcome` of an inner solve about ``w^k`` (the host's ``x``) by
    :func:`federated_prox_newton`: its ``gradient`` is the element of ``d l_k(w)``
    closest to the Lagrangian's stationarity (``grad S_k + v``, ``v`` in ``dh(w)`` chosen
    against ``grad S_k - (w - w^k) / prox_beta``), so that the outer loop's measured
    stationarity is the Lagrangian's ``dist(0, grad L + dh)``."""
    gradient = None
    if out.gradient is not None:
        reg = host.problem.regularizer
        shift = (out.w - host.x) / host.gamma if host.proximal else 0.0
        gradient = reg.closest_subgradient(out.w, out.gradient - shift) + shift
    return InnerOutcome(
        out.w, out.rounds, out.residual, out.satisfied, out.residual,
        timed_out=out.timed_out, stalled=out.stalled, gradient=gradient, floor=out.floor,
    )  # fmt: skip


#: res.extra["inner_solver_note"] when "auto" picks the proximal quasi-Newton loop
PROX_QN_NOTE = "h is not smooth: its prox in the server's model step (prox-quasi-newton)"


class ProxQNInner(QuasiNewtonInner):
    """``inner_solver="prox-quasi-newton"``: the quasi-Newton rounds and secant model
    (:class:`~fedmodel.algorithms.proxal.newton_route.QuasiNewtonInner`, the same client
    messages: a client reveals exactly what it reveals to the quasi-Newton inner solver),
    with ``h`` kept out of the smooth part: the server's own smooth terms are evaluated
    without ``h`` (a backend of its program with ``h = 0``: Newton's GLM form, whose
    Hessian-vector products need no ``d x d`` matrix, or the model's evaluator) and ``h``
    enters through its prox in the model step (:func:`federated_prox_newton`).

    ``"auto"`` takes it on a convex model with a non-smooth ``h`` and smooth parties, at
    any ``eps`` (its steps are no interior-point solves), unless a party has a term with a
    restricted domain or inequality walls exact-admm imposes. Measured
    (``benchmarks/models.py``, prox-al rounds of prox-quasi-newton against exact-admm,
    docs/performance.md): sparse-logistic-d3000 31 against 621, elastic-net-20 10 against
    18; at eps = 1e-6 (quick sizes) against Algorithm 2: 76 against 600 and 16 against 45.
    """

    name = "prox-quasi-newton"

    @classmethod
    def accepts(cls, compiled, options, proximal):
        return prox_qn_obstacle(compiled, options, proximal) or None

    @classmethod
    def suits(cls, compiled, options, proximal):
        if compiled.nonconvex:
            return "the model is not convex"
        return restricted_domain_party(compiled) or inequality_walls(compiled) or None

    @classmethod
    def note(cls, compiled, options, proximal):
        return PROX_QN_NOTE

    def __init__(self, host):
        super().__init__(host)
        self.own_problem = None  # (the server's program without h, built at its first use)

    def _own_backend(self):
        if self.own_problem is None:
            host = self.host
            self.own_problem = MeritProblem([host.program], host.beta)
            self.has_terms = self.own_problem.has_smooth_terms
            self.own_solver = (
                make_solver(self.own_problem, host.options.solver) if self.has_terms else None
            )
        return self.own_solver

    def check(self) -> None:
        """Cross-check the server's smooth terms once (raises :class:`NotRecognised` when
        they cannot be evaluated: the run falls back)."""
        x = self.host.x
        self.own(x, x, np.zeros((0, x.size)))

    def own(self, w: np.ndarray, w_center: np.ndarray, V: np.ndarray | None):
        """Value and gradient at ``w`` of ``S_k``'s server share -- ``P_{0,k}`` without
        ``h``: its terms with ``mu_0``, ``nu_0`` and its share of the proximal term about
        ``w_center`` -- and ``V H_0`` (rows) with ``H_0`` the Hessian of its terms."""
        host = self.host
        n = w.size
        V = np.zeros((0, n)) if V is None else V
        self._own_backend()
        if not self.has_terms:
            val, g, HV = 0.0, np.zeros(n), np.zeros_like(V)
        elif hasattr(self.own_solver, "products"):
            val, g, HV = self.own_solver.products(w, [host.mu], [host.nu], V.T)
            HV = HV.T
        else:  # (the model's evaluator; products by a forward difference of the gradient)
            fn = self.own_problem.functions[0]
            val, g = fn.merit(w, host.mu, host.nu, host.beta)
            g = np.array(g, dtype=float)
            h = 1e-7 * max(1.0, float(np.abs(w).max(initial=0.0)))
            HV = np.array(
                [(fn.merit(w + h * v, host.mu, host.nu, host.beta)[1] - g) / h for v in V]
            ).reshape(V.shape)
        p = host.prox_weight
        d = w - w_center
        return float(val) + 0.5 * p * float(d @ d), np.asarray(g, dtype=float) + p * d, HV

    def solve(self, runtime, tau: float, deadline: float | None) -> InnerOutcome:
        """One inner solve from ``w^k`` (the host's ``x``) to ``dist(0, d l_k) <= tau``
        (its outcome: :func:`prox_outcome`)."""
        host = self.host
        w_center = host.x
        reg = host.problem.regularizer
        known = np.full(w_center.size, float(host.prox_weight))
        rounds = SecantRounds(self, runtime, known, self.own)
        out = federated_prox_newton(
            rounds.evaluate, rounds.start(), reg, tau, int(host.options.max_inner), deadline,
            on_accept=rounds.on_accept, noise=host.noise[0],
        )  # fmt: skip
        rounds.finish(out.satisfied, out.timed_out)
        return prox_outcome(host, out)


class ProxNewtonInner(NewtonInner):
    """``inner_solver="prox-newton"`` (an opt-in: clients send ``d x d`` Hessians): the
    Newton inner solver's rounds and messages
    (:class:`~fedmodel.algorithms.proxal.newton_route.NewtonInner`: each client sends the
    value, gradient and Hessian of its ``P_{i,k}``, the Hessian only when it changed) with
    ``h`` kept out of the smooth part, as prox-quasi-newton keeps it: the server's model of
    ``S_k`` is the sum of the parties' Hessians, damped (:func:`next_damping`), and ``h``
    enters through its prox in the model step (:func:`federated_prox_newton`; with
    bounds, the exact box QP of :func:`bounded_model_step`). On a QP split as its rows the
    model is exact on each active set (a regularised semismooth Newton method), so an
    inner solve takes a few rounds where prox-quasi-newton's secant model learns the
    curvature over many. Measured (``benchmarks/maros_meszaros.py --reveal-hessian``):
    QRECIPE 9 rounds against 3,524, CVXQP1_M 109 against 705.
    """

    name = "prox-newton"
    h_in_model = False

    @classmethod
    def accepts(cls, compiled, options, proximal):
        if proximal and compiled.regularizer.is_smooth:
            return "h is smooth (inner_solver='newton' takes it)"
        why = prox_qn_obstacle(compiled, options, proximal)
        if not why and options.solver == "lbfgs":
            why = "solver='lbfgs' (Newton derivatives need the Newton backend)"
        return why or None

    def __init__(self, host):
        super().__init__(host)
        self.own_problem = None  # (the server's program without h, built at its first use)

    #: the server's program without ``h`` (one implementation with prox-quasi-newton's)
    _own_backend = ProxQNInner._own_backend

    def terms_backend(self):
        """The backend of the server's terms without ``h`` (None: it has none)."""
        return self._own_backend()

    def solve(self, runtime, tau: float, deadline: float | None) -> InnerOutcome:
        """One inner solve from ``w^k`` (the host's ``x``) to ``dist(0, d l_k) <= tau``;
        one round per trial point."""
        host = self.host
        evaluate, start = self.rounds(runtime, host.x)
        out = federated_prox_newton(
            evaluate, start, host.problem.regularizer, tau, int(host.options.max_inner),
            deadline, noise=host.noise[0], damping=True,
        )  # fmt: skip
        return prox_outcome(host, out)


ProxNewtonInner.client_part = NewtonClient
