"""Cone constraints ``E(x) in K`` of the conic path: multipliers and residuals.

A term with no smooth form reaches the compiler as cone constraints on affine vectors
``E(x)`` (:mod:`fedmodel.dsl.conic`), with the Lagrangian ``f(x) - <lambda, E(x)>`` and
``lambda`` in the dual cone ``K^*``. For one block the certificate measures

* stationarity: its share ``-J_E^T lambda`` of the Lagrangian gradient (``E`` is affine,
  so ``J_E`` is exact and constant);
* primal feasibility: ``dist_inf(E(x), K)`` (exact for ``R_+``, ``{0}``, second-order and
  PSD cones, an upper bound for the exponential and 3-d power cones);
* dual feasibility: ``dist_inf(lambda, K^*)`` (multipliers taken from a conic solver are
  first projected onto ``K^*`` where that projection has a closed form);
* complementarity: ``|<lambda, E(x)>|``.

Example
-------
>>> import numpy as np, cvxpy as cp
>>> x = cp.Variable(2)
>>> block = ConeBlock(cp.SOC(cp.Constant([1.0]), x))
>>> block.dist_primal(np.array([1.0, 3.0, 4.0]))  # ||(3, 4)|| = 5 > 1
2.0
"""

from __future__ import annotations

import numpy as np

from fedmodel.dsl.conic import cone_kind, cone_vector


def _soc_project(t: float, v: np.ndarray) -> tuple[float, np.ndarray]:
    nv = float(np.linalg.norm(v))
    if nv <= t:
        return t, v
    if nv <= -t:
        return 0.0, np.zeros_like(v)
    a = 0.5 * (t + nv)
    return a, a * v / nv


class ConeBlock:
    """One cone constraint (a cvxpy constraint on affine arguments) as numbers.

    Parameters
    ----------
    con : cvxpy Constraint
        ``Inequality``/``NonNeg``/``NonPos`` (``R_+``), ``Equality``/``Zero`` (``{0}``),
        ``SOC``, ``PSD`` or ``ExpCone``.
    """

    def __init__(self, con):
        self.kind = cone_kind(con)
        self.con_type = type(con).__name__
        self.shapes = [a.shape for a in con.args]
        self.size = int(cone_vector(con).size)
        self.axis = int(getattr(con, "axis", 0) or 0)
        self.alpha = None
        if self.kind == "pow":  # x^alpha y^(1-alpha) >= |z|, per entry
            alpha = np.asarray(con.alpha.value, dtype=float).ravel()
            self.alpha = np.broadcast_to(alpha, (self.size // 3,)).copy()

    # -- multipliers from a cvxpy solve ----------------------------------------------------
    def dual_from(self, con) -> np.ndarray:
        """``lambda`` (flattened like ``E``) from cvxpy's ``con.dual_value``; zeros when the
        solver returned none."""
        dv = con.dual_value
        if dv is None or (isinstance(dv, (list, tuple)) and any(d is None for d in dv)):
            # no duals: the solver failed (an SOC's dual_value is then [None, None])
            return np.zeros(self.size)
        if isinstance(dv, (list, tuple)):
            lam = np.concatenate([np.atleast_1d(np.asarray(d)).ravel(order="F") for d in dv])
        else:
            lam = np.atleast_1d(np.asarray(dv, dtype=float)).ravel(order="F")
        if self.con_type in ("Equality", "Zero"):
            lam = -lam  # cvxpy: f + nu (lhs - rhs); here f - <lambda, E>
        if lam.size != self.size:  # pragma: no cover - cvxpy's contract
            raise ValueError(f"dual of size {lam.size} for a {self.con_type} of size {self.size}")
        return np.asarray(lam, dtype=float)

    # -- cone structure --------------------------------------------------------------------
    def _soc_parts(self, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        k = int(np.prod(self.shapes[0])) if self.shapes[0] else 1
        t = v[:k]
        xs = self.shapes[1]
        X = v[k:].reshape(xs, order="F") if xs else v[k:]
        if X.ndim <= 1:
            rows = X.reshape(1, -1)
        else:
            rows = X.T if self.axis == 0 else X
        return t, rows

    def _soc_join(self, t: np.ndarray, rows: np.ndarray) -> np.ndarray:
        xs = self.shapes[1]
        if len(xs) <= 1:
            X = rows.reshape(-1)
        else:
            X = rows.T if self.axis == 0 else rows
        return np.concatenate([t, np.asarray(X).ravel(order="F")])

    def project(self, v: np.ndarray) -> np.ndarray | None:
        """Euclidean projection onto ``K`` (None for the exponential and power cones)."""
        if self.kind == "nonneg":
            return np.maximum(v, 0.0)
        if self.kind == "zero":
            return np.zeros_like(v)
        if self.kind == "soc":
            t, rows = self._soc_parts(v)
            pt, prow = np.empty_like(t), np.empty_like(rows)
            for i in range(t.size):
                pt[i], prow[i] = _soc_project(float(t[i]), rows[i])
            return self._soc_join(pt, prow)
        if self.kind == "psd":
            n = self.shapes[0][0]
            A = v.reshape((n, n), order="F")
            S = 0.5 * (A + A.T)
            vals, vecs = np.linalg.eigh(S)
            P = (vecs * np.maximum(vals, 0.0)) @ vecs.T
            return P.ravel(order="F")
        return None

    def project_dual(self, lam: np.ndarray) -> np.ndarray:
        """``lambda`` projected onto ``K^*`` (``R_+``, SOC and PSD are self-dual, ``{0}^*``
        is everything); the exponential and power cones' multipliers are returned as they
        are (their distance to ``K^*`` is measured by :meth:`dist_dual`)."""
        if self.kind == "zero":
            return lam
        p = self.project(lam)
        return lam if p is None else p

    def dist_primal(self, e: np.ndarray) -> float:
        """``dist_inf(E, K)`` (an upper bound for the exponential and power cones)."""
        if e.size == 0:
            return 0.0
        p = self.project(e)
        if p is not None:
            if self.kind == "psd":  # the constraint is on the symmetric part
                n = self.shapes[0][0]
                A = e.reshape((n, n), order="F")
                e = (0.5 * (A + A.T)).ravel(order="F")
            return float(np.abs(e - p).max())
        if self.kind == "pow":
            return float(_pow_bound(*np.split(e, 3), self.alpha, dual=False).max(initial=0.0))
        return float(_exp_primal_bound(*np.split(e, 3)).max(initial=0.0))

    def dist_dual(self, lam: np.ndarray) -> float:
        """``dist_inf(lambda, K^*)`` (an upper bound for the exponential and power cones)."""
        if lam.size == 0 or self.kind == "zero":
            return 0.0
        if self.kind == "pow":
            return float(_pow_bound(*np.split(lam, 3), self.alpha, dual=True).max(initial=0.0))
        if self.kind == "exp":
            return float(_exp_dual_bound(*np.split(lam, 3)).max(initial=0.0))
        p = self.project(lam)
        if self.kind == "psd":
            n = self.shapes[0][0]
            A = lam.reshape((n, n), order="F")
            lam = (0.5 * (A + A.T)).ravel(order="F")
        return float(np.abs(lam - p).max())


def _exp_primal_bound(x, y, z) -> np.ndarray:
    """Upper bound on ``dist_inf((x, y, z), K_exp)``, ``K_exp = cl{y > 0, y e^{x/y} <= z}``:
    the distance to a feasible point (raise ``z``, or move to ``(min(x,0), 0, max(z,0))``)."""
    to_face = np.maximum.reduce([np.maximum(x, 0.0), np.abs(y), np.maximum(-z, 0.0)])
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        raise_z = np.where(
            y > 0, np.maximum(y * np.exp(x / np.where(y > 0, y, 1.0)) - z, 0.0), np.inf
        )
    return np.minimum(to_face, np.nan_to_num(raise_z, nan=np.inf))


def _exp_dual_bound(u, v, w) -> np.ndarray:
    """Upper bound on ``dist_inf((u, v, w), K_exp^*)``, ``K_exp^* = cl{u < 0, -u e^{v/u} <= e w}``."""
    to_face = np.maximum.reduce([np.maximum(u, 0.0), np.maximum(-v, 0.0), np.maximum(-w, 0.0)])
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        uu = np.where(u < 0, u, -1.0)
        raise_w = np.where(u < 0, np.maximum(-uu * np.exp(v / uu - 1.0) - w, 0.0), np.inf)
    return np.minimum(to_face, np.nan_to_num(raise_w, nan=np.inf))


def _pow_bound(x, y, z, alpha, dual: bool) -> np.ndarray:
    """Upper bound on ``dist_inf((x, y, z), K)`` for the 3-d power cone
    ``K = {x^a y^(1-a) >= |z|, x, y >= 0}`` (``dual``: ``K^* = {(x/a)^a (y/(1-a))^(1-a) >=
    |z|, x, y >= 0}``): the distance to the feasible point with ``x, y`` clipped at 0 and
    ``|z|`` cut down to what they allow."""
    xp, yp = np.maximum(x, 0.0), np.maximum(y, 0.0)
    if dual:
        cap = (xp / alpha) ** alpha * (yp / (1.0 - alpha)) ** (1.0 - alpha)
    else:
        cap = xp**alpha * yp ** (1.0 - alpha)
    return np.maximum.reduce([xp - x, yp - y, np.maximum(np.abs(z) - cap, 0.0)])


#: the floor of a constraint's scale when it has a constant side: only there to avoid 0 / 0;
#: a constant side no larger than it is a zero written in floating point (``1 - 0.9 - 0.1``,
#: ``-2.2e-16`` in a data file), and the constraint is measured as a homogeneous one
SCALE_FLOOR = 1e-12


def constraint_scale(
    c: np.ndarray, c0: np.ndarray, absolute: np.ndarray | None = None
) -> np.ndarray:
    """Per component, the scale of a constraint's feasibility residual: its own terms.

    With a constant side (``c0 = b != 0``: a budget such as ``quad_form(w, S) <= 0.002``,
    or the ``b`` of ``a^T x - b``) the scale is ``max(|b|, |c(x) - b|)``, the larger side
    at ``x``, with no absolute floor: 16% over a budget of 0.002 reads 0.14, not 3e-4. A
    homogeneous constraint (``b = 0``, e.g. ``sum(w) == 0``) has no side of its own other
    than its value, which is the residual itself, so its scale is ``max(1, |c(x)|)``: an
    absolute test, as OSQP's ``eps_abs``; so is a side of at most :data:`SCALE_FLOOR`, a
    zero up to rounding (otherwise a row ``a^T x == -2.2e-16`` would be measured relative
    to ``2.2e-16``), and :data:`SCALE_FLOOR` guards 0 / 0. Where
    ``absolute`` is True (a piece of an objective term's epigraph or cone form: no side of
    the user's, and its value tends to 0 at an exact fit) the scale is ``max(1, |c0|,
    |c(x) - c0|)``.

    Examples
    --------
    >>> constraint_scale(np.array([0.0003, 0.5]), np.array([-0.002, 0.0]))
    array([0.0023, 1.    ])
    >>> constraint_scale(np.array([1e-6]), np.array([2.2e-16]))
    array([1.])
    """
    c, c0 = np.asarray(c, dtype=float), np.asarray(c0, dtype=float)
    own = np.maximum(np.abs(c0), np.abs(c - c0))
    floor = np.where(np.abs(c0) > SCALE_FLOOR, SCALE_FLOOR, 1.0)
    if absolute is not None:
        floor = np.where(absolute, 1.0, floor)
    return np.maximum(own, floor)


def cone_residuals(
    blocks: list[ConeBlock],
    e: np.ndarray,
    lam: np.ndarray,
    scaled: bool = False,
    e0: np.ndarray | None = None,
    absolute: np.ndarray | None = None,
    reference: float = 1.0,
) -> tuple[float, ...]:
    """``(feasibility, violation)`` of stacked cone blocks at ``E = e`` with multipliers
    ``lam``: feasibility is the max over blocks of the primal and dual distances and the
    complementarity ``|<lambda_j, E_j>|``; violation is the primal distance alone.

    With ``scaled`` a third number: the same feasibility with each part relative to its
    block's scale. The primal distance of a componentwise block (``nonneg``, ``zero``:
    ``E`` is the constraint's value) is measured per component as a smooth constraint's
    (:func:`constraint_scale` with ``E(0) = e0``); of another cone over ``||E||_inf``
    (its sides, e.g. ``(eps, X w - y)`` of ``norm(X w - y) <= eps``), with no absolute
    floor when ``E(0) != 0`` and ``max(1, ||E||_inf)`` when ``E(0) = 0``, ``e0`` is not
    given or the block is ``absolute`` (per entry; the cone form of an objective term,
    whose ``E`` tends to 0 at an exact fit: ``norm(w - 1)`` at ``w = 1``). ``dist(lambda, K^*)`` is over ``max(1, ||lambda||_inf)`` and ``|<lambda, E>|``
    over ``max(1, ||lambda||_2 ||E||_2)``, the ``1`` of those two floors (the multipliers'
    unit, the objective's) being ``reference``, the objective's reference scale
    (:mod:`fedmodel.certificate.scale`)."""
    feas = viol = rel = 0.0
    off = 0
    for b in blocks:
        ej, lj = e[off : off + b.size], lam[off : off + b.size]
        off += b.size
        primal, dual, comp = b.dist_primal(ej), b.dist_dual(lj), abs(float(lj.dot(ej)))
        viol = max(viol, primal)
        feas = max(feas, primal, dual, comp)
        if scaled:
            e_inf = float(np.abs(ej).max(initial=0.0))
            l_inf = float(np.abs(lj).max(initial=0.0))
            e0j = np.zeros(b.size) if e0 is None else e0[off - b.size : off]
            absj = None if absolute is None else absolute[off - b.size : off]
            if b.kind in ("nonneg", "zero"):
                gap = -np.minimum(ej, 0.0) if b.kind == "nonneg" else np.abs(ej)
                scale = constraint_scale(ej, e0j, absj)
                primal_rel = float((gap / scale).max(initial=0.0))
            else:
                own = bool(np.any(np.abs(e0j) > SCALE_FLOOR)) and not (
                    absj is not None and np.any(absj)
                )
                floor = SCALE_FLOOR if own else 1.0
                primal_rel = primal / max(floor, e_inf)
            rel = max(
                rel,
                primal_rel,
                dual / max(reference, l_inf),
                comp / max(reference, float(np.linalg.norm(lj) * np.linalg.norm(ej))),
            )
    return (feas, viol, rel) if scaled else (feas, viol)
