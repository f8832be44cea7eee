"""Certificates of primal infeasibility and of unboundedness, each party on its own data.

**Infeasibility: an affine-minorant Farkas certificate.** Each party ``i`` takes a point
``p_i = (x_i, theta_i)`` of its view (shared variables, its own block) and multipliers
``mu_i >= 0`` (inequalities ``g_i <= 0``), ``nu_i`` (equalities ``a_i = 0``), ``lambda_i``
in the dual cone (cone constraints ``E_i in K``), and forms the convex function
``phi_i = mu_i^T g_i + nu_i^T a_i - lambda_i^T E_i``, which is ``<= 0`` at every point
meeting its constraints. Its tangent plane at ``p_i`` is an affine minorant
``phi_i(p) >= b_i + y_i^T x + o_i^T theta`` (``y_i``, ``o_i``: the gradient's shared and
own parts; ``b_i = phi_i(p_i) - grad phi_i(p_i)^T p_i``), so a point ``(x, theta)``
feasible for every party gives

    0 >= sum_i phi_i >= B + Y^T x - ||theta||_inf sum_i ||o_i||_1,
    B = sum_i b_i,  Y = sum_i y_i.

With ``B > 0`` no feasible point lies in ``dom h`` within ``||(x, theta)||_inf <= R``, the
largest ``R`` for which ``B + min{Y^T x : x in dom h, ||x||_inf <= R} - R sum_i ||o_i||_1``
stays positive (:func:`farkas_radius`; ``R = inf`` proves infeasibility outright). The
party sends ``y_i`` (``d`` floats, a sum over parties) and three scalars; the server never
reads its data. The multipliers of a proximal augmented-Lagrangian method on an infeasible
convex model grow without bound while their steps ``mu^{k+1} - mu^k`` converge to ``beta``
times the smallest shift that makes the constraints feasible (Chiche and Gilbert, "How
the augmented Lagrangian algorithm can deal with an infeasible convex quadratic
optimization problem", J. Convex Anal. 23, 2016; the proximal point algorithm's
differences converge to the minimal-norm element of the closure of the operator's range,
Pazy 1970, the route OSQP takes for ADMM, Banjac, Goulart, Stellato and Boyd, "Infeasibility
detection in the alternating direction method of multipliers for convex optimization",
JOTA 183, 2019): the steps, and the multipliers themselves, are the candidates checked.

**Unboundedness: a feasible ray along which f + h keeps falling.** The differences of
the iterates ``x^{k+1} - x^k`` of the same methods converge to a recession direction
``d`` of descent (the same results). Each party evaluates its objective and its largest
violation (the terms as written) at ``x + t d`` for a few ``t`` (:func:`ray_report`);
with every point feasible within the tolerance the whole segment is (convexity), and
``f + h`` falling by far more than its size, at a rate that does not slow over the last
stretch, is the certificate (:func:`ray_verdict`): the optimum is below ``f(x + t d)``,
and a convex function whose secant slope along ``d`` stays negative that far out falls
without bound along it within the tolerance (the approximate recession test, as OSQP's
``||P d|| <= eps``, ``q^T d < -eps``).

Examples
--------
>>> import numpy as np
>>> from fedmodel.compiler.regularizer import Regularizer
>>> # w >= 1 (party a) and w <= -1 (party b) with multipliers 1 and 1 at w = 0:
>>> # phi_a = 1 - w, phi_b = w + 1, B = 2, Y = 0: infeasible outright
>>> reports = [{"y": np.array([-1.0]), "b": 1.0, "rho": 0.0, "size": 1.0},
...            {"y": np.array([1.0]), "b": 1.0, "rho": 0.0, "size": 1.0}]
>>> farkas_radius(reports, Regularizer())[0]
inf
"""

from __future__ import annotations

import numpy as np

from fedmodel.certificate.kkt import max_violation, user_model_values
from fedmodel.compiler.partition import PartyProgram
from fedmodel.compiler.regularizer import Regularizer

#: "infeasible" needs the proven radius at least this many times ``max(1, ||x||_inf)`` of the
#: iterate, over sqrt(eps): no feasible point within 1/sqrt(eps) of the iterates' scale
#: (31.6 times at eps = 1e-3). On curved constraints the multipliers' weighted gradient
#: falls like 1/k (the iterate reaches the least-violation point at that rate), so the
#: radius grows like k: 1/eps took over 500 outer iterations on two balls 0.5 apart
RADIUS_FACTOR = 1.0
#: ``B`` must exceed this fraction of the sizes of the terms it sums (rounding)
ROUNDING = 1e-9
#: "unbounded" needs f + h to fall along the ray by more than this many times
#: ``max(1, |f + h|)`` at its start (the monitor's rule for a blown-up iterate)
UNBOUNDED_DROP = 10.0
#: ... and over the ray's last stretch at least this fraction of its rate over the first
SLOPE_KEPT = 0.5


def farkas_report(
    program: PartyProgram,
    x: np.ndarray,
    mu: np.ndarray,
    nu: np.ndarray,
    cone: np.ndarray | None = None,
    n_shared: int | None = None,
) -> dict:
    """One party's share of the Farkas certificate at its point ``x`` (its view: shared
    variables first) with multipliers ``(mu, nu, cone)`` (those of the pieces of objective
    terms' epigraph or cone forms left out): ``y`` (the gradient of
    ``phi_i`` on the first ``n_shared`` coordinates), ``b`` (the intercept of its tangent
    plane), ``rho`` (the 1-norm of the gradient on the rest, the party's own block) and
    ``size`` (the magnitudes ``b`` sums, for rounding).

    Examples
    --------
    >>> import cvxpy as cp, fedmodel as fm
    >>> m = fm.Model("doc")
    >>> w = m.variable(1, name="w")
    >>> _ = m.client("a").subject_to(w >= 1)
    >>> prog = m.compile().clients[0]
    >>> r = farkas_report(prog, np.zeros(1), np.ones(1), np.zeros(0))
    >>> float(r["b"]), r["y"].tolist()
    (1.0, [-1.0])
    """
    fn = program.functions
    x = np.asarray(x, dtype=float)
    ns = x.size if n_shared is None else int(n_shared)
    # (the pieces of objective terms' epigraph or cone forms restrict nothing: their
    # auxiliaries are free, so they take no part in the certificate)
    internal_i, internal_e, internal_k = fn.internal_masks
    mu = np.where(internal_i, 0.0, np.maximum(np.asarray(mu, dtype=float), 0.0))
    nu = np.where(internal_e, 0.0, np.asarray(nu, dtype=float))
    if cone is not None:
        cone = np.where(internal_k, 0.0, np.asarray(cone, dtype=float))
    ci, ce = fn.constraint_values(x)
    phi = float(mu @ ci) + float(nu @ ce)
    grad = fn.constraint_vjp(x, mu, nu)
    if fn.k is not None and cone is not None and np.any(cone):
        lam = np.asarray(cone, dtype=float)
        phi -= float(lam @ fn.cone_values(x))
        grad = grad + fn.cone_grad(x, lam)
    slope = float(grad @ x)
    return {
        "y": grad[:ns].copy(),
        "b": phi - slope,
        "rho": float(np.abs(grad[ns:]).sum()),
        "size": abs(phi) + float(np.abs(grad * x).sum()),
    }


def _domain_minimum(Y: np.ndarray, regularizer: Regularizer, radius: float) -> float:
    """``min {Y^T x : x in dom h, ||x||_inf <= radius}`` (a lower bound where a ball meets
    the cube; ``+inf`` when the two do not meet)."""
    free = np.ones(Y.size, dtype=bool)
    total = 0.0
    for s, p in zip(regularizer.slices, regularizer.pieces):
        if not (p.has_box or p.has_ball) or s.start >= Y.size:
            continue
        v = Y[s]
        free[s] = False
        lo = np.maximum(np.broadcast_to(p.lower, v.shape), -radius)
        hi = np.minimum(np.broadcast_to(p.upper, v.shape), radius)
        if np.any(lo > hi):
            return np.inf
        with np.errstate(invalid="ignore"):
            cube = float(np.where(v == 0, 0.0, np.minimum(v * lo, v * hi)).sum())
        if p.has_ball:
            if p.radius < 0:
                return np.inf
            cube = max(cube, -p.radius * float(np.linalg.norm(v)))
        total += cube
    spread = float(np.abs(Y[free]).sum())
    return total - radius * spread if spread > 0 else total


def farkas_radius(reports, regularizer: Regularizer) -> tuple[float, float]:
    """``(R, B)``: the radius within which the parties' reports (:func:`farkas_report`)
    prove that no point meets every constraint and ``dom h`` (0 when they prove nothing),
    and their intercept ``B``."""
    reports = list(reports)
    if not reports:
        return 0.0, 0.0
    Y = sum(np.asarray(r["y"], dtype=float) for r in reports)
    B = float(sum(float(r["b"]) for r in reports))
    rho = float(sum(float(r["rho"]) for r in reports))
    size = float(sum(float(r["size"]) for r in reports))
    if not np.all(np.isfinite(Y)) or not np.isfinite(B) or B <= ROUNDING * size:
        return 0.0, B

    def holds(radius: float) -> bool:
        own = radius * rho if rho > 0 else 0.0
        return B + _domain_minimum(Y, regularizer, radius) - own > ROUNDING * size

    if holds(np.inf):
        return np.inf, B
    if not holds(0.0):
        return 0.0, B
    lo, hi = 0.0, 1.0
    while holds(hi) and hi < 1e300:
        lo, hi = hi, hi * 16.0
    if hi >= 1e300:
        return np.inf, B
    for _ in range(60):  # (bisection: the bound falls with the radius)
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if holds(mid) else (lo, mid)
    return lo, B


def radius_needed(x: np.ndarray, eps: float) -> float:
    """The radius an "infeasible" verdict proves at least: ``RADIUS_FACTOR max(1,
    ||x||_inf) / sqrt(eps)`` for the iterate ``x``."""
    return RADIUS_FACTOR * max(1.0, float(np.abs(x).max(initial=0.0))) / np.sqrt(eps)


def farkas_point(x: np.ndarray, step: np.ndarray | None, dmu_steps) -> np.ndarray:
    """The point to evaluate the Farkas certificate at after the outer step ``step =
    x^{k+1} - x^k`` of a proximal augmented-Lagrangian method whose multiplier steps were
    ``dmu_steps`` (the last one this step's). On an infeasible model the iterate
    approaches the least-violation point ``x*`` like ``x^k = x* + a / M_k``, ``M_k`` the
    multipliers' size (the objective's gradient against multipliers that grow by about
    the same step each outer iteration), so tangent planes at ``x^k`` miss by ``O(1/k)``
    and the proven radius grows only like ``k``; Richardson's extrapolation
    ``x^{k+1} + (M_k / (M_{k+1} - M_k)) step``, ``M_k`` the sum of the multiplier steps
    before the last, removes that term. ``x`` itself without a step, or without two
    multiplier steps. Any point gives a sound certificate: the parties check it on their
    terms.

    Examples
    --------
    >>> farkas_point(np.array([1.0]), np.array([0.5]), [2.0, 2.0, 2.0]).tolist()
    [2.0]
    """
    steps = [float(v) for v in dmu_steps]
    if step is None or len(steps) < 2 or not steps[-1] > 0:
        return x
    point = x + (sum(steps[:-1]) / steps[-1]) * np.asarray(step, dtype=float)
    return point if np.all(np.isfinite(point)) else x


def ray_report(program: PartyProgram, x: np.ndarray, d: np.ndarray, ts) -> dict:
    """One party's objective and largest violation (its terms as written) at ``x + t d``
    for each ``t`` in ``ts`` (its view: ``x`` and ``d`` over shared variables and its own
    block).

    Examples
    --------
    >>> import cvxpy as cp, fedmodel as fm
    >>> m = fm.Model("doc")
    >>> w = m.variable(1, name="w")
    >>> m.client("a").minimize(-cp.sum(w))
    >>> prog = m.compile().clients[0]
    >>> ray_report(prog, np.zeros(1), np.ones(1), [1.0, 10.0])["objective"].tolist()
    [-1.0, -10.0]
    """
    fn = program.functions
    x, d = np.asarray(x, dtype=float), np.asarray(d, dtype=float)
    objective, violation = [], []
    for t in ts:
        p = x + float(t) * d
        with np.errstate(all="ignore"):
            user = user_model_values(program, p)
            if user is None:
                ci, ce = fn.constraint_values(p)
                cone = fn.cone_residuals(p, None)[1]
                user = fn.objective(p), max(max_violation(ci, ce), cone)
        objective.append(float(user[0]))
        violation.append(float(user[1]))
    return {"objective": np.array(objective), "violation": np.array(violation)}


def ray_points(x: np.ndarray, eps: float, reach: float = 0.0) -> np.ndarray:
    """The steps ``t`` the ray test evaluates along a direction of unit infinity norm from
    ``x``: 0, ``T`` and ``2 T`` with ``T = max(1, ||x||_inf, reach) / eps`` (``reach``: how
    far iterates the caller cannot see may be, e.g. the outer steps so far times their
    size when clients' own blocks move)."""
    T = max(1.0, float(np.abs(x).max(initial=0.0)), float(reach)) / eps
    return np.array([0.0, T, 2.0 * T])


def ray_verdict(objective, violation, tolerance: float) -> str:
    """The unboundedness certificate read from ``f + h`` and the largest violation at the
    points of :func:`ray_points`: a message when it holds, else ""."""
    F, V = np.asarray(objective, dtype=float), np.asarray(violation, dtype=float)
    if not (np.all(np.isfinite(F)) and np.all(np.isfinite(V))):
        return ""
    first, last = F[0] - F[1], F[1] - F[2]
    if V.max() > tolerance or first <= UNBOUNDED_DROP * max(1.0, abs(F[0])):
        return ""
    if last < SLOPE_KEPT * first:
        return ""
    return (
        f"f + h falls from {F[0]:.6g} to {F[1]:.4g} and {F[2]:.4g} along a ray of "
        f"feasible points (largest violation {V.max():.2e})"
    )


def farkas_verdict(candidates, regularizer: Regularizer, x, eps: float):
    """The infeasibility verdict from the parties' reports (:func:`farkas_report`), one list
    per multiplier candidate, at the iterate ``x``: ``(message, certificate)`` when the
    best candidate's radius reaches :func:`radius_needed`, else None."""
    best = max((farkas_radius(reports, regularizer) for reports in candidates), default=(0, 0))
    needed = radius_needed(x, eps)
    if best[0] < needed:
        return None
    return (
        "the model is infeasible: the parties' multipliers give a Farkas certificate, "
        f"checked on each party's terms, that no point with ||x||_inf <= {best[0]:.3g} meets "
        f"the constraints (needed: {needed:.3g})",
        {"kind": "farkas", "radius": best[0], "intercept": best[1], "needed": needed},
    )


def ray_certificate(objectives, violations, regularizer: Regularizer, x, d, ts, tolerance):
    """The unboundedness verdict from the parties' objectives at the ray's points (arrays,
    summed) and their largest violations (scalars or arrays), with ``h`` along the
    ray ``x + t d`` over the coordinates ``x`` and ``d`` cover (shared variables first):
    ``(message, certificate)`` when :func:`ray_verdict` holds, else None."""
    x, d = np.asarray(x, dtype=float), np.asarray(d, dtype=float)
    points = [x + t * d for t in ts]
    F = sum(np.asarray(o, dtype=float) for o in objectives) + [regularizer.value(p) for p in points]
    V = max([float(np.max(v)) for v in violations] + [regularizer.box_violation(p) for p in points])
    why = ray_verdict(F, [V] * len(ts), tolerance)
    if not why:
        return None
    return (
        f"the objective is unbounded below: {why}, in the direction of the last outer step, "
        "checked on each party's terms",
        {"kind": "ray", "t": np.asarray(ts), "objective": F, "violation": V},
    )


def steady(values, window: int = 3, spread: float = 0.1) -> bool:
    """Whether the last ``window`` values are positive and within a factor ``1 + spread``
    of each other: the steps of a method whose differences have converged (the trigger of
    a certificate round).

    Examples
    --------
    >>> steady([5.0, 1.0, 1.02, 0.99]), steady([4.0, 2.0, 1.0])
    (True, False)
    """
    last = [float(v) for v in list(values)[-window:]]
    if len(last) < window or min(last) <= 0 or not np.all(np.isfinite(last)):
        return False
    return max(last) <= (1.0 + spread) * min(last)
