"""Federated semismooth Newton for Algorithm 1's subproblem (prox-al's ``inner_solver="newton"``).

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
federated Newton, e.g. Safaryan et al., "FedNL", ICML 2022).

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
    """

    w: np.ndarray
    rounds: int
    residual: float
    satisfied: bool
    stalled: bool = False
    timed_out: bool = False
    backtracks: int = 0
    gradient: np.ndarray | None = None


def newton_direction(H: np.ndarray, g: np.ndarray, factor=None) -> np.ndarray:
    """``-H^(-1) g``, with ``H`` shifted to positive definite when it is not (the Newton
    backend's :func:`~fedmodel.subproblems.newton.shifted_cholesky`; ``factor`` is that
    factor when already computed); the steepest-descent direction ``-g`` when no shift
    gives a factor.

    Examples
    --------
    >>> newton_direction(np.diag([2.0, 4.0]), np.array([2.0, 4.0])).tolist()
    [-1.0, -1.0]
    """
    factor = shifted_cholesky(H, **SHIFT) if factor is None else factor
    if factor is None:
        return -np.asarray(g, dtype=float)
    return -cholesky_solve(factor, g)


def federated_newton(
    evaluate: Callable[[np.ndarray], tuple[float, np.ndarray, np.ndarray]],
    start: tuple[np.ndarray, float, np.ndarray, np.ndarray],
    tau: float,
    max_rounds: int,
    deadline: float | None = None,
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

    Returns
    -------
    NewtonOutcome
        The last accepted point (never a rejected trial point) and how the loop ended.
    """
    w, val, g, H = start
    rounds = backtracks = 0
    factored = None  # (H, its factor): evaluate returns the same H while it is unchanged
    while True:
        residual = float(np.abs(g).max(initial=0.0))
        if residual <= tau:
            return NewtonOutcome(w, rounds, residual, True, backtracks=backtracks, gradient=g)
        if rounds >= max_rounds or (deadline is not None and time.perf_counter() > deadline):
            timed_out = rounds < max_rounds
            return NewtonOutcome(w, rounds, residual, False, False, timed_out, backtracks, g)
        if factored is None or factored[0] is not H:
            factored = (H, shifted_cholesky(H, **SHIFT))
        d = newton_direction(H, g, factored[1])
        slope = float(g @ d)
        if not slope < 0:  # (numerical trouble): the steepest-descent direction
            d, slope = -g, -float(g @ g)
        t = 1.0
        while True:
            trial = w + t * d
            val_t, g_t, H_t = evaluate(trial)
            rounds += 1
            if val_t <= val + ARMIJO * t * slope:
                break
            # at machine precision the value cannot resolve the decrease: accept a full
            # step that still reduces the gradient (as the local Newton backend does)
            if (
                t == 1.0
                and val_t - val <= 1e-13 * max(1.0, abs(val))
                and float(np.abs(g_t).max(initial=0.0)) < residual
            ):
                break
            backtracks += 1
            if rounds >= max_rounds:
                return NewtonOutcome(w, rounds, residual, False, backtracks=backtracks, gradient=g)
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
