"""Federated (quasi-)Newton for Algorithm 1's subproblem (prox-al's ``inner_solver=
"quasi-newton"``, the adaptive default on smooth models, and the opt-in ``"newton"``).

Algorithm 1 of seed 000 needs, at outer iteration ``k``, a point ``w`` with
``dist(0, d l_k(w)) <= tau_k``, where ``l_k = P_{0,k} + h + sum_i P_{i,k}`` (eqs. 10-11).
Algorithm 2 (ADMM) is one way to get it. When every part of ``l_k`` is ``C^1`` with a
(generalised) Hessian -- smooth ``h``, GLM-form client terms, no party-owned variables or
cone constraints -- a Newton method on ``l_k`` itself is another, and it needs far fewer
rounds: the augmented-Lagrangian terms make ``l_k`` only piecewise ``C^2``, and semismooth
Newton with a line search converges on such functions superlinearly (Qi and Sun, Math.
Programming 1993), which is how the semismooth Newton augmented Lagrangian methods solve
their subproblems (Zhao, Sun and Toh, SIAM J. Optim. 2010; Li, Sun and Toh, SIAM J. Optim.
2018). On a non-convex model the Hessian is shifted until it is positive definite (a
modified Newton method, Nocedal and Wright, Numerical Optimization, Sec. 3.4), so every
step is a descent direction and the loop ends at an approximately stationary point of
``l_k``: what Algorithm 1 asks of its inner solver there too (Algorithm 2 gives no more).

Federated, one round is one evaluation: the server broadcasts a point ``w``; every client
returns ``P_{i,k}(w)``, its gradient and its Hessian (the Hessian only when it changed
since its last reply; a quadratic client's changes only with its active set); the server
adds its own ``P_{0,k} + h``, takes a Newton step ``d = -H^(-1) g`` on the sums and
backtracks along it (Armijo) when the value does not decrease enough. The stopping test is
the gradient's infinity norm measured at the returned point: exactly ``dist(0, d l_k)``, so
the outer loop's guarantee (Theorem 4.2) holds as with (19). Clients send the same kind of
second-order information as with ``penalty_metric="hessian"`` (the pattern of exact-Hessian
federated Newton, e.g. Safaryan et al., "FedNL", ICML 2022): a ``d x d`` matrix that, for a
client with fewer rows than ``d``, reveals its rows (a 1-row client's row comes back
exactly). That is why exact Newton is an opt-in.

The default, ``inner_solver="quasi-newton"``, runs the same loop with the Hessian replaced
by a BFGS model the server builds from ``l_k``'s gradients (the clients' summed gradients
plus its own) at consecutive rounds (:class:`SecantModel`; Nocedal and Wright, Ch. 6 and
Sec. 18.3): each client sends its
value and gradient (``d + 1`` floats) and nothing of second order. The model is carried
across outer iterations (``l_k`` changes only through the multipliers and the proximal
centre), and a rejected trial point, which taught the model the curvature along the step,
gives a new direction before the line search backtracks (``remodel``). Measured against
exact Newton on the seed 000 problems (benchmarks/RESULTS_od_default.md): about 5-30x the
rounds (most on one-hot data with ~100 variables, where the model must learn many flat
directions) at ``d + 1`` instead of ``d^2 + d + 1`` floats per client and round.

Each quasi-Newton round -- and the round that starts an inner solve, whose multiplier
update changed the augmented-Lagrangian terms' curvature -- also carries ``k`` directions
(``curvature_directions``: the trial step and random ones), and
the clients return their Hessian-vector products along them (``(k + 1) d + 1`` floats):
exact curvature pairs, made ``H``-conjugate (:func:`conjugate_pairs`) so that successive
BFGS updates keep all of them (block BFGS; Gower, Goldfarb and Richtarik, "Stochastic
block BFGS", ICML 2016). Above :data:`DENSE_MODEL_MAX` shared variables the server keeps
the last pairs and steps by the two-loop recursion (:class:`LimitedSecantModel`; Nocedal
and Wright, Algorithm 7.4) instead of a ``d x d`` matrix.

:func:`federated_newton` is the loop; the server half supplies ``evaluate``, the round
trip.

Examples
--------
>>> A = np.array([[2.0, 0.0], [0.0, 1.0]])
>>> evaluate = lambda w: (0.5 * w @ A @ w - w.sum(), A @ w - 1.0, A)
>>> w0 = np.zeros(2)
>>> out = federated_newton(evaluate, (w0, *evaluate(w0)), tau=1e-10, max_rounds=10)
>>> out.w.round(6).tolist(), out.rounds, out.satisfied
([0.5, 1.0], 1, True)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from fedmodel.subproblems.newton import cholesky_solve, shifted_cholesky

#: the server's quasi-Newton model is a dense d x d matrix up to this many shared variables
#: (32 MB at 2000, factored once per model update), the limited-memory form above
DENSE_MODEL_MAX = 2000
#: Armijo constant of the backtracking line search
ARMIJO = 1e-4
#: backtracking stops (a failed line search) below this step length
MIN_STEP = 1e-10
#: the shift of an indefinite Hessian (non-convex models): 1e-10 max(1, max |diag H|),
#: times 100 per failed Cholesky, 8 tries (coarser than the local Newton backend's x10:
#: Table 3 took 618 rounds over n = 1, 5, 10, 20 with this, 763 with x10 from 1e-9)
SHIFT = {"first": 1e-10, "growth": 100.0, "tries": 8}


@dataclass
class NewtonOutcome:
    """Where the federated Newton loop stopped.

    Attributes
    ----------
    w : ndarray
        The last accepted point.
    rounds : int
        Evaluation rounds used (each a broadcast and the clients' replies).
    residual : float
        ``||grad l_k(w)||_inf`` at ``w`` (measured).
    satisfied : bool
        ``residual <= tau``.
    stalled : bool
        The line search could not decrease ``l_k`` along the Newton direction.
    timed_out : bool
        The deadline passed.
    backtracks : int
        Rejected trial points (rounds that did not advance).
    gradient : ndarray
        ``grad l_k(w)`` at ``w``.
    floor : bool
        The loop ended short of ``tau`` at its rounding floor (the outer loop goes on).
    """

    w: np.ndarray
    rounds: int
    residual: float
    satisfied: bool
    stalled: bool = False
    timed_out: bool = False
    backtracks: int = 0
    gradient: np.ndarray | None = None
    floor: bool = False


def newton_direction(H: np.ndarray, g: np.ndarray, factor=None) -> np.ndarray:
    """``-H^(-1) g``, with ``H`` shifted to positive definite when it is not (the Newton
    backend's :func:`~fedmodel.subproblems.newton.shifted_cholesky`; ``factor`` is that
    factor when already computed); the steepest-descent direction ``-g`` when no shift
    gives a factor.

    Examples
    --------
    >>> np.round(newton_direction(np.diag([2.0, 4.0]), np.array([2.0, 4.0])), 12).tolist()
    [-1.0, -1.0]
    """
    if isinstance(H, LimitedInverse):  # (an implicit model: its own inverse)
        return -H.solve(g)
    factor = shifted_cholesky(H, **SHIFT) if factor is None else factor
    if factor is None:
        return -np.asarray(g, dtype=float)
    return -cholesky_solve(factor, g)


def _factor(model):
    """The shifted Cholesky factor of a dense model (None for an implicit one)."""
    return None if isinstance(model, LimitedInverse) else shifted_cholesky(model, **SHIFT)


def armijo_holds(value: float, value0: float, decrease: float, noise: float = 0.0) -> bool:
    """The line searches' sufficient decrease: ``value <= value0 + ARMIJO * decrease``,
    relaxed by twice the bound ``noise`` of the noise on each value (Berahas, Byrd and
    Nocedal, "Derivative-free optimization of noisy functions via quasi-Newton methods",
    SIAM J. Optim. 2019: a step is not refused for a rise the noise can make).

    Examples
    --------
    >>> armijo_holds(1.05, 1.0, -0.1), armijo_holds(1.05, 1.0, -0.1, noise=0.1)
    (False, True)
    """
    return value <= value0 + ARMIJO * decrease + 2.0 * noise


#: the values' rounding relative to their size that a line search allows for when the
#: Armijo test fails: ``l_k`` is a sum of terms much larger than itself near an optimum
#: (Maros-Meszaros GOULDQP3: l_k ~ 2 of quadratic terms ~1e5, values 5e-11 apart at
#: points the gradients tell apart), so its differences below this are rounding
ROUNDING_RELATIVE = 1e-10


def rounding_step_accepted(value: float, value0: float, residual: float, residual0: float) -> bool:
    """A trial step the Armijo test refused is taken when its value rose by no more than
    the values' rounding (:data:`ROUNDING_RELATIVE` of their size) and it reduces the
    measured optimality residual (the gradient, or the distance of ``0`` to the
    subdifferential): at machine precision the values cannot resolve the decrease, the
    residual still can (as Hager and Zhang's approximate Wolfe conditions read the slope
    where the values stop resolving it, "A new conjugate gradient method with guaranteed
    descent and an efficient line search", SIAM J. Optim. 16, 2005).

    Examples
    --------
    >>> rounding_step_accepted(2.0 + 5e-11, 2.0, 1e-8, 2e-8)
    True
    >>> rounding_step_accepted(2.0 + 1e-6, 2.0, 1e-8, 2e-8)
    False
    """
    return value - value0 <= ROUNDING_RELATIVE * max(1.0, abs(value0)) and residual < residual0


def federated_newton(
    evaluate: Callable[[np.ndarray], tuple[float, np.ndarray, np.ndarray]],
    start: tuple[np.ndarray, float, np.ndarray, np.ndarray],
    tau: float,
    max_rounds: int,
    deadline: float | None = None,
    remodel: int = 0,
    on_accept: Callable[[np.ndarray], None] | None = None,
    noise: float = 0.0,
) -> NewtonOutcome:
    """Minimise ``l_k`` to ``||grad l_k||_inf <= tau`` by Newton steps with backtracking.

    Parameters
    ----------
    evaluate : callable
        ``w -> (l_k(w), grad l_k(w), Hessian)``: one round (broadcast ``w``, collect the
        parties' shares, add them up).
    start : (w, value, gradient, Hessian)
        The starting point and its evaluation (from the round that set up ``l_k``).
    tau : float
        Target of ``||grad l_k(w)||_inf``.
    max_rounds : int
        Evaluation rounds allowed.
    deadline : float, optional
        ``time.perf_counter()`` value after which the loop returns (``timed_out``).
    remodel : int, optional
        With a secant model (:class:`SecantModel`; ``evaluate`` returns a new matrix
        after every evaluation that taught it something), a rejected trial point's
        evaluation has updated the model along the step: the first ``remodel`` rejections
        at a point take a new direction from that model (a step of length 1 again) in place
        of backtracking along the old one. 0 (exact Hessians): always backtrack.
    on_accept : callable, optional
        Called with each point the loop moves to (the start included), before the next
        trial point is evaluated (the quasi-Newton server picks its curvature directions
        relative to it).
    noise : float, optional
        A bound of the noise on each value ``evaluate`` returns (dp's noised sums): the
        line search takes the relaxed Armijo test ``l(w + t d) <= l(w) + c t g^T d + 2
        noise`` (:func:`armijo_holds`), and the loop takes one step at least (a start
        gradient below ``tau`` may be the noise's).

    Returns
    -------
    NewtonOutcome
        The last accepted point (never a rejected trial point) and how the loop ended.
    """
    w, val, g, H = start
    rounds = backtracks = 0
    factored = None  # (H, its factor): evaluate returns the same H while it is unchanged
    while True:
        if on_accept is not None:
            on_accept(w)
        remodels = 0
        residual = float(np.abs(g).max(initial=0.0))
        if residual <= tau and (rounds or not noise):  # (noisy: one step at least)
            return NewtonOutcome(w, rounds, residual, True, backtracks=backtracks, gradient=g)
        if rounds >= max_rounds or (deadline is not None and time.perf_counter() > deadline):
            timed_out = rounds < max_rounds
            return NewtonOutcome(w, rounds, residual, False, False, timed_out, backtracks, g)
        model = H  # the curvature the direction comes from
        if factored is None or factored[0] is not model:
            factored = (model, _factor(model))
        d = newton_direction(model, g, factored[1])
        slope = float(g @ d)
        if not slope < 0:  # (numerical trouble): the steepest-descent direction
            d, slope = -g, -float(g @ g)
        t = 1.0
        while True:
            trial = w + t * d
            val_t, g_t, H_t = evaluate(trial)
            rounds += 1
            if armijo_holds(val_t, val, t * slope, noise):
                break
            if rounding_step_accepted(val_t, val, float(np.abs(g_t).max(initial=0.0)), residual):
                break
            backtracks += 1
            if rounds >= max_rounds or (deadline is not None and time.perf_counter() > deadline):
                timed_out = rounds < max_rounds
                return NewtonOutcome(w, rounds, residual, False, False, timed_out, backtracks, g)
            if remodels < remodel and H_t is not model and np.isfinite(val_t):
                # the secant model learnt the curvature along the rejected step: a new
                # direction from it (for a quadratic along d, the exact minimiser on that line)
                remodels += 1
                model = H_t
                factored = (model, _factor(model))
                d = newton_direction(model, g, factored[1])
                slope = float(g @ d)
                if not slope < 0:
                    d, slope = -g, -float(g @ g)
                t = 1.0
                continue
            # minimiser of the quadratic through (0, val), slope, (t, val_t), kept in
            # [0.1 t, 0.5 t]
            curvature = val_t - val - slope * t
            t_new = -slope * t * t / (2.0 * curvature) if curvature > 0 else 0.5 * t
            t = min(max(t_new, 0.1 * t), 0.5 * t)
            if t < MIN_STEP or not np.isfinite(t):
                return NewtonOutcome(
                    w, rounds, residual, False, True, backtracks=backtracks, gradient=g
                )
        w, val, g, H = trial, val_t, g_t, H_t


class SecantModel:
    """A server-side BFGS model of ``l_k``'s Hessian (less its known constant diagonal: the
    proximal term and ``h``), built from the gradients the clients send
    (``inner_solver="quasi-newton"``): no client sends second-order information.

    Every evaluation round gives the server ``l_k``'s gradient ``G(w)`` at the broadcast
    point (the clients' summed gradients plus its own); two consecutive rounds on the same
    ``l_k`` give a secant pair ``s = w' - w``, ``y = G(w') - G(w)``, and the model ``B``
    takes the BFGS update with Powell's
    damping (Nocedal and Wright, Numerical Optimization, Sec. 18.3: ``y`` is blended with
    ``B s`` until ``s^T y >= 0.2 s^T B s``, so ``B`` stays positive definite on non-convex
    models). The first pair scales the starting ``B = (y^T y / s^T y) I`` (ibid., eq.
    6.20). ``B`` is kept across Algorithm 1's outer iterations: ``l_k`` changes from one to
    the next only through the multipliers and the proximal centre, so the curvature learnt
    stays a good start (pairs never mix two different ``l_k``: :meth:`restart`).

    Parameters
    ----------
    n : int
        Dimension (the shared variables).

    Examples
    --------
    >>> A = np.diag([4.0, 1.0])
    >>> model = SecantModel(2)
    >>> model.restart(np.zeros(2), -np.ones(2))
    >>> for w in (np.array([1.0, 0.0]), np.array([1.0, 1.0])):
    ...     _ = model.observe(w, A @ w - 1.0)
    >>> bool(np.allclose(model.matrix @ np.array([0.0, 1.0]), A @ np.array([0.0, 1.0])))
    True
    """

    #: Powell's damping threshold
    DAMPING = 0.2

    def __init__(self, n: int):
        self.n = int(n)
        self.matrix: np.ndarray | None = None  # B (None: no pair yet)
        self.last: tuple[np.ndarray, np.ndarray] | None = None  # (w, G(w)) of the last round
        self.updates = 0

    def restart(self, w: np.ndarray, gradient: np.ndarray) -> None:
        """A new ``l_k`` (or a new point of the same one to pair with): the next secant
        pair starts at ``(w, gradient)``; the model itself is kept."""
        self.last = (_frozen(w), _frozen(gradient))

    def observe(self, w: np.ndarray, gradient: np.ndarray, known=None) -> bool:
        """Take the clients' summed gradient at ``w`` (the next round's): update ``B`` with
        the pair from the last round. True when ``B`` changed (a new matrix object).
        ``known`` (a ``d x d`` matrix): a part of the Hessian at ``w`` the model leaves out
        (structured quasi-Newton, Dennis, Martinez and Tapia 1989: ``y - known s``)."""
        w, gradient = _frozen(w), _frozen(gradient)
        last, self.last = self.last, (w, gradient)
        if last is None:
            return False
        s = w - last[0]
        y = gradient - last[1]
        return self.update(s, y if known is None else y - known @ s)

    def observe_products(self, V: np.ndarray, Y: np.ndarray) -> bool:
        """Take exact curvature: ``Y = H V`` for directions ``V`` (rows, orthonormal), with
        ``H`` the Hessian of ``l_k`` less its known diagonal at one point (the clients'
        Hessian-vector products summed, plus the server's own). The pairs are made
        ``H``-conjugate first (:func:`conjugate_pairs`), so that the successive BFGS updates
        keep every one of them: ``B V = Y`` afterwards (block BFGS; Gower, Goldfarb and
        Richtarik, ICML 2016). True when ``B`` changed."""
        changed = False
        for s, y in conjugate_pairs(V, Y):
            changed = self.update(s, y, damped=False) or changed
        return changed

    def update(self, s: np.ndarray, y: np.ndarray, damped: bool = True) -> bool:
        """The BFGS update with the pair ``(s, y)``, Powell-damped when ``damped`` (secant
        pairs; exact pairs of positive curvature are taken as they are: damping would
        keep the curvature of an augmented-Lagrangian wall the step has left); True when
        ``B`` changed (a new matrix object)."""
        if not (np.all(np.isfinite(y)) and float(s @ s) > 0):
            return False
        B = self.matrix
        sy = float(s @ y)
        if B is None:
            if not sy > 0:
                return False
            B = np.eye(self.n) * (float(y @ y) / sy)
        Bs = B @ s
        sBs = float(s @ Bs)
        if not sBs > 0:
            return False
        if damped and sy < self.DAMPING * sBs:  # Powell's damping
            theta = (1.0 - self.DAMPING) * sBs / (sBs - sy)
            y = theta * y + (1.0 - theta) * Bs
            sy = float(s @ y)
        B = B - np.outer(Bs, Bs / sBs) + np.outer(y, y / sy)
        self.matrix = _frozen(0.5 * (B + B.T))
        self.updates += 1
        return True

    def initial(self, gradient: np.ndarray) -> np.ndarray:
        """The model before any secant pair: ``||G||_inf I``, so that the first step
        moves each variable by at most about 1 (the line search and the first pair then
        set the scale)."""
        scale = float(np.abs(gradient).max(initial=0.0))
        return np.eye(self.n) * (scale if np.isfinite(scale) and scale > 0 else 1.0)

    def get_state(self) -> dict:
        """The model as plain arrays (read-only: snapshots share them)."""
        last = self.last if self.last is not None else (None, None)
        return {"matrix": self.matrix, "w": last[0], "gradient": last[1], "updates": self.updates}

    def set_state(self, state: dict) -> None:
        self.matrix = _frozen(state["matrix"])
        w, g = state["w"], state["gradient"]
        self.last = None if w is None else (_frozen(w), _frozen(g))
        self.updates = int(state["updates"])


def conjugate_pairs(V: np.ndarray, Y: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """Curvature pairs ``(v_j, y_j)`` spanning the same space as the rows of ``V`` and
    ``Y = V H`` (``H`` symmetric) with ``v_i^T y_j = 0`` for ``i != j``: the eigenvectors of
    ``V Y^T``. Directions of (numerically) zero or negative curvature are left out.

    Examples
    --------
    >>> H = np.array([[2.0, 1.0], [1.0, 2.0]])
    >>> pairs = conjugate_pairs(np.eye(2), H)
    >>> [round(float(v @ y), 6) for v, y in pairs]
    [1.0, 3.0]
    """
    V = np.asarray(V, dtype=float).reshape(-1, np.shape(V)[-1])
    Y = np.asarray(Y, dtype=float).reshape(V.shape)
    if not V.shape[0] or not np.all(np.isfinite(Y)):
        return []
    C = V @ Y.T
    lam, Q = np.linalg.eigh(0.5 * (C + C.T))
    top = float(np.abs(lam).max(initial=0.0))
    keep = lam > 1e-12 * top
    return list(zip(Q[:, keep].T @ V, Q[:, keep].T @ Y))


class LimitedSecantModel:
    """The limited-memory form of :class:`SecantModel` for many shared variables (more
    than :data:`DENSE_MODEL_MAX`): the last :attr:`MEMORY` curvature pairs and the
    two-loop recursion (Nocedal and Wright, Algorithm 7.4) instead of a dense ``d x d``
    matrix, so the server holds ``O(MEMORY d)`` numbers. Same interface (``restart``,
    ``observe``, ``observe_products``, ``get_state``/``set_state``); :meth:`view` is the
    model of ``l_k`` (with its known diagonal) the Newton loop steps with.

    Examples
    --------
    >>> A = np.diag([4.0, 1.0])
    >>> model = LimitedSecantModel(2)
    >>> _ = model.observe_products(np.eye(2), A)
    >>> model.view(np.zeros(2), np.ones(2)).solve(np.array([4.0, 1.0])).round(6).tolist()
    [1.0, 1.0]
    """

    #: curvature pairs kept
    MEMORY = 40

    def __init__(self, n: int):
        self.n = int(n)
        self.pairs: list[tuple[np.ndarray, np.ndarray]] = []  # (s, y) less the known part
        self.last: tuple[np.ndarray, np.ndarray] | None = None
        self.updates = 0
        self.scale: float | None = None  # y^T y / s^T y of the newest pair
        self._view = None
        #: the known diagonal of l_k's Hessian (set by the owner: damping needs B s)
        self.known: np.ndarray | None = None

    restart = SecantModel.restart

    def observe(self, w: np.ndarray, gradient: np.ndarray, known=None) -> bool:
        w, gradient = _frozen(w), _frozen(gradient)
        last, self.last = self.last, (w, gradient)
        if last is None:
            return False
        s, y = w - last[0], gradient - last[1]
        return self.update(s, y if known is None else y - known @ s)

    def observe_products(self, V: np.ndarray, Y: np.ndarray) -> bool:
        changed = False
        for s, y in conjugate_pairs(V, Y):
            changed = self.update(s, y, damped=False) or changed
        return changed

    def update(self, s: np.ndarray, y: np.ndarray, damped: bool = True) -> bool:
        """As :meth:`SecantModel.update`: Powell's damping of a secant pair against the
        model's own ``B s`` (the compact product, :meth:`LimitedInverse.times`; measured
        on a sparse logistic + l2-ball model at d = 500: 190 rounds with the dense damped
        model, 8,471 with it undamped -- the curvature of an augmented-Lagrangian wall
        the step has left must not vanish from the model at once)."""
        if not (np.all(np.isfinite(y)) and float(s @ s) > 0):
            return False
        sy = float(s @ y)
        if damped and self.pairs and self.known is not None:
            Bs = self.view(self.known, None).times(s) - self.known * s  # (less known)
            sBs = float(s @ Bs)
            if sBs > 0 and sy < SecantModel.DAMPING * sBs:
                theta = (1.0 - SecantModel.DAMPING) * sBs / (sBs - sy)
                y = theta * y + (1.0 - theta) * Bs
                sy = float(s @ y)
        if not sy > 0:  # (the pair is left out)
            return False
        self.scale = float(y @ y) / sy
        self.pairs.append((_frozen(s), _frozen(y)))
        del self.pairs[: -self.MEMORY]
        self.updates += 1
        self._view = None
        return True

    def view(self, known: np.ndarray, gradient: np.ndarray) -> LimitedInverse:
        """The model of ``l_k``'s Hessian: the pairs plus the ``known`` diagonal, on
        ``(scale + known) I`` (``scale`` = ``||gradient||_inf`` before any pair, as
        :meth:`SecantModel.initial`); the same object while nothing changed."""
        if self._view is None or self._view.known is not known:
            scale = self.scale
            if scale is None:
                scale = 1.0 if gradient is None else float(np.abs(gradient).max(initial=0.0))
                scale = scale if np.isfinite(scale) and scale > 0 else 1.0
            self._view = LimitedInverse(self.pairs, scale, known)
        return self._view

    def get_state(self) -> dict:
        last = self.last if self.last is not None else (None, None)
        return {
            "pairs_s": [p[0] for p in self.pairs],
            "pairs_y": [p[1] for p in self.pairs],
            "scale": self.scale,
            "w": last[0],
            "gradient": last[1],
            "updates": self.updates,
        }

    def set_state(self, state: dict) -> None:
        self.pairs = [(_frozen(s), _frozen(y)) for s, y in zip(state["pairs_s"], state["pairs_y"])]
        self.scale = None if state["scale"] is None else float(state["scale"])
        w, g = state["w"], state["gradient"]
        self.last = None if w is None else (_frozen(w), _frozen(g))
        self.updates = int(state["updates"])
        self._view = None


class LimitedInverse:
    """``B^(-1) g`` by the two-loop recursion over pairs ``(s, y + known * s)`` from
    ``B_0 = diag(scale + known)``."""

    def __init__(self, pairs, scale: float, known: np.ndarray):
        self.known = known
        self.diag = scale + known
        self.pairs = []
        for s, y in pairs:
            y = y + known * s
            sy = float(s @ y)
            if sy > 0:
                self.pairs.append((s, y, 1.0 / sy))
        self._direct = None  # (B_j s_j, 1 / s_j^T B_j s_j) per pair, for times()

    def times(self, v: np.ndarray) -> np.ndarray:
        """``B v`` by the direct BFGS recursion from ``B_0`` (``O(m^2 d)`` once per model,
        then ``O(m d)``)."""
        if self._direct is None:
            direct = []
            for s, _, _ in self.pairs:
                a = self.diag * s
                for (a_i, c_i), (_, y_i, rho_i) in zip(direct, self.pairs):
                    a = a - (c_i * float(a_i @ s)) * a_i + (rho_i * float(y_i @ s)) * y_i
                direct.append((a, 1.0 / float(s @ a)))
            self._direct = direct
        out = self.diag * v
        for (a, c), (_, y, rho) in zip(self._direct, self.pairs):
            out = out - (c * float(a @ v)) * a + (rho * float(y @ v)) * y
        return out

    def solve(self, g: np.ndarray) -> np.ndarray:
        q = np.array(g, dtype=float)
        alphas = []
        for s, y, rho in reversed(self.pairs):
            a = rho * float(s @ q)
            q -= a * y
            alphas.append(a)
        r = q / self.diag
        for (s, y, rho), a in zip(self.pairs, reversed(alphas)):
            b = rho * float(y @ r)
            r += (a - b) * s
        return r


def _frozen(a):
    """``a`` as a read-only float array (None stays None)."""
    if a is None:
        return None
    a = np.array(a, dtype=float)
    a.setflags(write=False)
    return a
