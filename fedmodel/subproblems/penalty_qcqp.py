"""The exact-penalty slack problem of mini-batch SSCA (seed 003, Problems 5 and 10): a convex
QCQP whose quadratic parts are all multiples of ``||w||^2``,

    min_{w, s}  k0 ||w||^2 + a0' w + c sum_m s_m
    s.t.        e_m + a_m' w + tau ||w||^2 <= s_m,   s_m >= 0,   m = 1..M,

(``e_m`` = the constraint surrogate's constant minus its bound ``U_m``). For multipliers
``0 <= nu <= c`` the Lagrangian's minimiser is ``w(nu) = -(a0 + sum_m nu_m a_m) / (2 K(nu))``
with ``K(nu) = k0 + tau sum_m nu_m``, so the dual is an ``M``-dimensional concave problem on
the box ``[0, c]^M`` that only needs the Gram matrix of ``(a0, a_1, ..., a_M)``: its cost
is ``O(M^2 d)`` once, then ``O(M^3)`` per dual iteration, whatever ``d``.

* :func:`lemma1`: the paper's Lemma 1 closed form (``k0 = 1``, ``a0 = 0``, ``M = 1``: the
  NN formulation (40)-(41));
* :func:`solve_penalty_qcqp`: any ``M`` (exact 1-D root for ``M = 1``; projected Newton
  on the box otherwise), with the KKT residuals it reached;
* :class:`CvxpyPenaltyQCQP`: the same problem as a cvxpy DPP problem compiled once (a
  reference and a cross-check).

Examples
--------
>>> import numpy as np
>>> a = np.array([3.0, -4.0])                 # b = ||a||^2 = 25
>>> sol = lemma1(a, C=1.0, U=0.5, tau=0.1, c=1e5)
>>> round(float(sol.nu[0]), 6), bool(abs(sol.constraint) < 1e-9)
(0.040242, True)
>>> ref = solve_penalty_qcqp(np.zeros(2), 1.0, a[None, :], np.array([0.5]), 0.1, 1e5)
>>> bool(np.allclose(ref.w, sol.w))
True
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class PenaltySolution:
    """Solution of the slack problem: primal ``w``, slacks ``s``, multipliers ``nu`` (of the
    constraints ``<= s_m``), the constraint values ``e + A w + tau ||w||^2`` at ``w`` and the
    dual's projected-gradient residual."""

    w: np.ndarray
    s: np.ndarray
    nu: np.ndarray
    values: np.ndarray
    residual: float
    iterations: int = 0

    @property
    def constraint(self) -> float:
        """The first constraint's value (``M = 1``)."""
        return float(self.values[0])


def _w_of(a0, A, k0, tau, nu):
    K = k0 + tau * float(np.sum(nu))
    return -(a0 + A.T @ nu) / (2.0 * K)


def _finish(a0, A, e, k0, tau, c, nu, it, residual=None) -> PenaltySolution:
    nu = np.clip(np.asarray(nu, dtype=float), 0.0, c)
    w = _w_of(a0, A, k0, tau, nu)
    vals = e + A @ w + tau * float(w @ w)
    if residual is None:
        residual = _box_residual(vals, nu, c)
    return PenaltySolution(w, np.maximum(vals, 0.0), nu, vals, residual, it)


def _box_residual(grad, nu, c) -> float:
    """Distance of ``nu`` to ``proj_[0,c](nu + grad)``: zero exactly at the dual optimum."""
    return float(np.max(np.abs(np.clip(nu + grad, 0.0, c) - nu), initial=0.0))


def lemma1(a: np.ndarray, C: float, U: float, tau: float, c: float) -> PenaltySolution:
    """Lemma 1 of seed 003: ``min ||w||^2 + c s  s.t.  a' w + tau ||w||^2 + C - U <= s, s >= 0``.

    ``nu = [(sqrt(b / (b + 4 tau (U - C))) - 1) / tau]_0^c`` when ``b + 4 tau (U - C) > 0``
    and ``nu = c`` otherwise (``b = ||a||^2``); ``w = -nu a / (2 (1 + nu tau))`` (43)-(44)."""
    a = np.asarray(a, dtype=float)
    b = float(a @ a)
    den = b + 4.0 * tau * (U - C)
    if den > 0:
        nu = float(np.clip((np.sqrt(b / den) - 1.0) / tau, 0.0, c))
    else:
        nu = float(c)
    w = -nu * a / (2.0 * (1.0 + nu * tau))
    val = C - U + float(a @ w) + tau * float(w @ w)
    h_prime = (b - den * (1 + nu * tau) ** 2) / (4 * tau * (1 + nu * tau) ** 2)
    res = _box_residual(np.array([h_prime]), np.array([nu]), c)
    return PenaltySolution(w, np.array([max(val, 0.0)]), np.array([nu]), np.array([val]), res, 0)


def solve_penalty_qcqp(
    a0: np.ndarray,
    k0: float,
    A: np.ndarray,
    e: np.ndarray,
    tau: float,
    c: float,
    *,
    tol: float = 1e-12,
    max_iter: int = 200,
) -> PenaltySolution:
    """Solve the slack problem exactly through its dual on ``[0, c]^M`` (module docstring).

    ``M = 1``: the dual derivative is decreasing in ``nu``; its root is found by
    safeguarded bisection/secant to machine precision. ``M > 1``: projected Newton on the
    box (the dual Hessian from the Gram matrix), with an Armijo search.
    """
    a0 = np.asarray(a0, dtype=float)
    A = np.atleast_2d(np.asarray(A, dtype=float))
    e = np.atleast_1d(np.asarray(e, dtype=float))
    M = A.shape[0]
    if k0 <= 0 or tau < 0 or c <= 0:
        raise ValueError(f"need k0 > 0, tau >= 0, c > 0; got {(k0, tau, c)}")
    V = np.vstack([a0[None, :], A])
    G = V @ V.T  # Gram matrix of (a0, a_1..a_M)
    g0, gA, GA = G[0, 0], G[1:, 0], G[1:, 1:]

    def dual(nu):
        K = k0 + tau * nu.sum()
        gg = g0 + 2 * nu @ gA + nu @ GA @ nu  # ||g||^2
        ag = gA + GA @ nu  # a_m' g
        h = -gg / (4 * K) + nu @ e
        grad = -ag / (2 * K) + tau * gg / (4 * K**2) + e  # constraint values at w(nu)
        return h, grad, K, gg, ag

    if M == 1:
        lo, hi = 0.0, float(c)
        if dual(np.array([lo]))[1][0] <= 0:
            return _finish(a0, A, e, k0, tau, c, [lo], 0)
        if dual(np.array([hi]))[1][0] >= 0:
            return _finish(a0, A, e, k0, tau, c, [hi], 0)
        it = 0
        while it < 400 and hi - lo > 1e-15 * max(1.0, hi):
            mid = 0.5 * (lo + hi) if it % 2 == 0 or hi / max(lo, 1e-300) > 4 else np.sqrt(lo * hi)
            if dual(np.array([mid]))[1][0] > 0:
                lo = mid
            else:
                hi = mid
            it += 1
        nu = np.array([0.5 * (lo + hi)])
        return _finish(a0, A, e, k0, tau, c, nu, it)

    nu = np.zeros(M)
    it = 0
    for it in range(1, max_iter + 1):  # noqa: B007
        h, grad, K, gg, ag = dual(nu)
        if _box_residual(grad, nu, c) <= tol * max(1.0, np.abs(e).max()):
            break
        # Hessian of h: d grad_m / d nu_k
        Hs = -GA / (2 * K) + tau * (np.add.outer(ag, ag)) / (2 * K**2) - tau**2 * gg / (2 * K**3)
        free = ~(((nu <= 0) & (grad < 0)) | ((nu >= c) & (grad > 0)))
        step = np.zeros(M)
        if free.any():
            Hf = Hs[np.ix_(free, free)] - 1e-14 * np.eye(free.sum())
            try:
                step[free] = -np.linalg.solve(Hf, grad[free])
            except np.linalg.LinAlgError:
                step[free] = grad[free]
        if grad @ step <= 0:  # not an ascent direction: projected gradient
            step = grad
        t = 1.0
        res = _box_residual(grad, nu, c)
        while t > 1e-20:
            trial = np.clip(nu + t * step, 0.0, c)
            h_trial, grad_trial = dual(trial)[:2]
            if h_trial >= h + 1e-4 * grad @ (trial - nu):
                break
            # near the optimum the dual value cannot resolve the increase (rounding): a
            # full step that still reduces the box residual is taken (as the Newton backend)
            if t == 1.0 and abs(h_trial - h) <= 1e-13 * max(1.0, abs(h)):
                if _box_residual(grad_trial, trial, c) < res:
                    break
            t *= 0.5
        if np.array_equal(trial, nu):
            break
        nu = trial
    return _finish(a0, A, e, k0, tau, c, nu, it)


class CvxpyPenaltyQCQP:
    """The slack problem as a cvxpy DPP problem, compiled once for ``(d, M)`` and re-solved
    with new ``a0, A, e`` (Clarabel); a cross-check of :func:`solve_penalty_qcqp`."""

    def __init__(self, d: int, M: int, k0: float, tau: float, c: float):
        import cvxpy as cp

        self.tau = float(tau)
        self.w = cp.Variable(d)
        self.s = cp.Variable(M)
        self.a0 = cp.Parameter(d)
        self.A = cp.Parameter((M, d))
        self.e = cp.Parameter(M)
        quad = cp.sum_squares(self.w)
        self.cons = [self.e + self.A @ self.w + tau * quad <= self.s, self.s >= 0]
        obj = k0 * quad + self.a0 @ self.w + c * cp.sum(self.s)
        self.problem = cp.Problem(cp.Minimize(obj), self.cons)

    def solve(self, a0, A, e) -> PenaltySolution:
        self.a0.value = np.asarray(a0, dtype=float)
        self.A.value = np.atleast_2d(np.asarray(A, dtype=float))
        self.e.value = np.atleast_1d(np.asarray(e, dtype=float))
        self.problem.solve(solver="CLARABEL")
        w = np.asarray(self.w.value)
        vals = self.e.value + self.A.value @ w + self.tau * float(w @ w)
        nu = np.asarray(self.cons[0].dual_value, dtype=float)
        return PenaltySolution(w, np.asarray(self.s.value), nu, vals, float("nan"))
