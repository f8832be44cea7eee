"""The regulariser h(w): parsed into per-variable simple pieces with an exact prox.

h is a sum over model variables v of

    a_v ||v||_1 + b_v ||v||_2^2 + c_v ||v||_2 + indicator(lo_v <= v <= hi_v)
                                              + indicator(||v||_2 <= r_v)
                                              + n_v ||V||_* + s_v ||V||_2

(any piece may be absent), where ``||V||_*`` (``cp.normNuc``) and ``||V||_2``
(``cp.sigma_max``, ``cp.norm(V, 2)``) are the nuclear and spectral norms of a matrix
variable ``V``. Its proximal operator is closed form (seed 000 Assumption 2a): the matrix
norms' by one SVD, soft-thresholding the singular values (nuclear) or subtracting their
projection on an l1 ball (spectral). The combination of a group norm with a box, of a
norm ball with anything but a sum of squares, and of a matrix norm with anything but a sum
of squares has no closed form and is refused.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import cvxpy as cp
import numpy as np
from cvxpy.constraints import Inequality

from fedmodel.errors import ModelError, UnsupportedError
from fedmodel.expressions import AtomTable


@dataclass
class VariablePiece:
    """The part of h that acts on one variable (flattened, column-major)."""

    l1: float = 0.0
    sumsq: float = 0.0
    l2: float = 0.0
    lower: np.ndarray | float = -np.inf
    upper: np.ndarray | float = np.inf
    has_box: bool = False
    radius: float = np.inf  # norm ball ||v||_2 <= radius (inf: none)
    nuclear: float = 0.0  # weight of the nuclear norm of the matrix variable
    spectral: float = 0.0  # weight of its spectral norm (largest singular value)
    shape: tuple[int, ...] = ()  # the matrix shape the matrix norms read (column-major)

    @property
    def has_ball(self) -> bool:
        return bool(np.isfinite(self.radius))

    @property
    def has_matrix_norm(self) -> bool:
        return bool(self.nuclear or self.spectral)

    @property
    def couples(self) -> bool:
        """Whether the prox couples the coordinates (a group norm, a norm ball, a matrix
        norm): no per-coordinate step, no bound-constrained form."""
        return bool(self.l2 or self.has_ball or self.has_matrix_norm)


def _whole_variable(expr: Any, variables: list[cp.Variable], what: str) -> cp.Variable:
    if isinstance(expr, cp.Variable) and any(expr is v for v in variables):
        return expr
    raise UnsupportedError(
        f"regularize(): {what} must act on a whole model variable, got '{expr}'. "
        "Put other terms in a party's objective or constraints."
    )


def _constant_value(expr: Any) -> np.ndarray | None:
    """The value of a constant operand (a weight, a bound), None for a non-constant one.

    A :class:`cvxpy.Parameter` (or an expression of parameters) counts as a constant with
    its current value: ``h`` is parsed again at every compile, i.e. at every solve, so a
    new ``param.value`` is used by the next solve.
    """
    if isinstance(expr, (int, float, np.ndarray, np.number)):
        return np.asarray(expr, dtype=float)
    if isinstance(expr, cp.Expression) and expr.is_constant():
        for param in expr.parameters():
            if param.value is None:
                raise ModelError(
                    f"regularize(): parameter '{param.name()}' in '{expr}' has no value; "
                    "set it (param.value = ...) before the solve"
                )
        return np.asarray(expr.value, dtype=float)
    return None


def parse_regularizer_term(term: Any, variables: list[cp.Variable]) -> list[tuple]:
    """Parse one ``regularize`` argument into ``(kind, variable, value)`` items.

    Raises :class:`~fedmodel.errors.UnsupportedError` for anything without a simple prox.
    """
    if isinstance(term, (list, tuple)):
        return [item for t in term for item in parse_regularizer_term(t, variables)]
    if isinstance(term, Inequality):
        lhs, rhs = term.args
        lo_val, hi_val = _constant_value(lhs), _constant_value(rhs)
        lhs_name = type(lhs).__name__
        is_inf = lhs_name == "norm_inf" or (
            lhs_name in ("Pnorm", "PnormApprox") and getattr(lhs, "p", None) == np.inf
        )
        if (is_inf or lhs_name == "abs") and hi_val is not None and lhs.args:
            # norm_inf(v) <= r and abs(v) <= r are the box -r <= v <= r
            v = _whole_variable(lhs.args[0], variables, "a bound")
            if is_inf and hi_val.size != 1:
                raise UnsupportedError(f"regularize(): the bound of '{term}' must be a scalar")
            hi = _bound_array(hi_val, v)
            return [("lower", v, -hi), ("upper", v, hi)]
        is_norm2 = lhs_name in ("Pnorm", "PnormApprox", "Norm2", "norm2")
        if is_norm2 and float(getattr(lhs, "p", 2)) == 2.0 and hi_val is not None:
            if hi_val.size != 1 or not float(hi_val) > 0:
                raise UnsupportedError(f"regularize(): the radius of '{term}' must be positive")
            v = _whole_variable(lhs.args[0], variables, "a norm ball")
            return [("ball", v, float(hi_val))]
        if lo_val is not None:  # const <= v  -> lower bound
            v = _whole_variable(rhs, variables, "a bound")
            return [("lower", v, _bound_array(lo_val, v))]
        if hi_val is not None:  # v <= const -> upper bound
            v = _whole_variable(lhs, variables, "a bound")
            return [("upper", v, _bound_array(hi_val, v))]
        raise UnsupportedError(
            f"regularize(): '{term}' is not a box constraint v <= const / v >= const"
        )
    if isinstance(term, cp.constraints.constraint.Constraint):
        raise UnsupportedError(
            f"regularize(): only box constraints are accepted, got {type(term).__name__} '{term}'"
        )
    if not isinstance(term, cp.Expression):
        raise ModelError(f"regularize() expects a cvxpy expression or box constraint, got {term!r}")
    return _parse_expr(term, 1.0, variables)


def _bound_array(value: np.ndarray, v: cp.Variable) -> np.ndarray:
    try:
        arr = np.broadcast_to(value, v.shape)
    except ValueError as exc:
        raise ModelError(
            f"regularize(): bound of shape {value.shape} does not fit variable "
            f"'{v.name()}' of shape {v.shape}"
        ) from exc
    if np.isnan(arr).any():
        raise ModelError(f"regularize(): bound for '{v.name()}' contains NaN")
    return np.asarray(arr, dtype=float).flatten(order="F")


# What regularize() reads of a term: the atoms that carry a weight into their argument (a
# sum, a product or quotient by a scalar), and the atoms with a closed-form prox. Each entry
# returns the term's ``(kind, variable, weight)`` items, or None where the atom is not in a
# form it knows (a non-scalar factor, a p it has no prox for).
REGULARIZER_WEIGHTS = AtomTable("regularizer: weight into the argument")
REGULARIZER_PROXES = AtomTable("regularizer: closed-form prox")


@REGULARIZER_WEIGHTS.register("AddExpression")
def _weights_add(expr, scale: float, variables) -> list[tuple]:
    return [item for a in expr.args for item in _parse_expr(a, scale, variables)]


@REGULARIZER_WEIGHTS.register("MulExpression", "multiply")
def _weights_product(expr, scale: float, variables) -> list[tuple] | None:
    left, right = expr.args
    lv, rv = _constant_value(left), _constant_value(right)
    if lv is not None and lv.size == 1:
        return _parse_expr(right, scale * float(lv), variables)
    if rv is not None and rv.size == 1:
        return _parse_expr(left, scale * float(rv), variables)
    return None


@REGULARIZER_WEIGHTS.register("DivExpression")
def _weights_quotient(expr, scale: float, variables) -> list[tuple] | None:
    rv = _constant_value(expr.args[1])
    if rv is not None and rv.size == 1 and float(rv) != 0:
        return _parse_expr(expr.args[0], scale / float(rv), variables)
    return None


@REGULARIZER_PROXES.register("norm1")
def _prox_norm1(expr, scale: float, variables) -> list[tuple]:
    return [("l1", _whole_variable(expr.args[0], variables, "norm1"), scale)]


def _entries(expr: Any) -> Any:
    """The argument of an entrywise norm with a reshape of a whole variable taken off (the
    Frobenius norm ``cp.norm(V, "fro")`` is the 2-norm of ``V``'s entries in any order)."""
    if type(expr).__name__ == "reshape" and isinstance(expr.args[0], cp.Variable):
        return expr.args[0]
    return expr


@REGULARIZER_PROXES.register("Pnorm", "PnormApprox", "Norm2", "norm2")
def _prox_pnorm(expr, scale: float, variables) -> list[tuple] | None:
    arg = _entries(expr.args[0])
    if type(expr).__name__ in ("Pnorm", "PnormApprox") and float(expr.p) == 1.0:
        return [("l1", _whole_variable(arg, variables, "norm(., 1)"), scale)]
    if float(getattr(expr, "p", 2)) == 2.0:
        return [("l2", _whole_variable(arg, variables, "norm(., 2)"), scale)]
    return None


@REGULARIZER_PROXES.register("normNuc")
def _prox_nuclear(expr, scale: float, variables) -> list[tuple]:
    return [("nuclear", _whole_variable(expr.args[0], variables, "normNuc"), scale)]


@REGULARIZER_PROXES.register("sigma_max")
def _prox_spectral(expr, scale: float, variables) -> list[tuple]:
    return [("spectral", _whole_variable(expr.args[0], variables, "sigma_max"), scale)]


@REGULARIZER_PROXES.register("quad_over_lin")
def _prox_quad_over_lin(expr, scale: float, variables) -> list[tuple] | None:
    y = _constant_value(expr.args[1])
    if y is not None and y.size == 1 and float(y) > 0:
        v = _whole_variable(expr.args[0], variables, "sum_squares")
        return [("sumsq", v, scale / float(y))]
    return None


@REGULARIZER_PROXES.register("Sum")
def _prox_sum(expr, scale: float, variables) -> list[tuple] | None:
    inner = expr.args[0]
    if type(inner).__name__ == "power":
        p = float(inner.p.value if hasattr(inner.p, "value") else inner.p)
        if p == 2.0:
            return [("sumsq", _whole_variable(inner.args[0], variables, "sum(square)"), scale)]
    if type(inner).__name__ == "abs":
        return [("l1", _whole_variable(inner.args[0], variables, "sum(abs)"), scale)]
    return None


def _parse_expr(expr: cp.Expression, scale: float, variables) -> list[tuple]:
    rule = REGULARIZER_WEIGHTS.rule_for(expr)
    items = rule(expr, scale, variables) if rule is not None else None
    if items is not None:
        return items
    if scale < 0:
        raise UnsupportedError(
            f"regularize(): '{expr}' enters h with a negative weight ({scale:g})"
        )
    rule = REGULARIZER_PROXES.rule_for(expr)
    items = rule(expr, scale, variables) if rule is not None else None
    if items is not None:
        return items
    raise UnsupportedError(
        f"regularize(): '{expr}' has no simple prox. h takes norm1, sum_squares, norm2, "
        "normNuc, sigma_max and box constraints of whole variables; put other terms in a "
        "party's objective."
    )


@dataclass
class Regularizer:
    """h(w) over the stacked variable vector, with value, prox and subdifferential distance.

    Examples
    --------
    >>> import numpy as np
    >>> reg = Regularizer.from_pieces([slice(0, 3)], [VariablePiece(l1=1.0)])
    >>> reg.prox(np.array([2.0, -0.5, 0.0]), 1.0)
    array([1., 0., 0.])
    """

    slices: list[slice] = field(default_factory=list)
    pieces: list[VariablePiece] = field(default_factory=list)
    terms: list[Any] = field(default_factory=list)  # the user's cvxpy terms, for cvxpy solves

    @classmethod
    def from_pieces(cls, slices, pieces, terms=()):
        return cls(list(slices), list(pieces), list(terms))

    @classmethod
    def from_model_terms(cls, terms: list[Any], layout) -> Regularizer:
        pieces = {id(v): VariablePiece() for v in layout.variables}
        for term in terms:
            for kind, v, val in parse_regularizer_term(term, list(layout.variables)):
                p = pieces[id(v)]
                if kind in ("l1", "sumsq", "l2", "nuclear", "spectral"):
                    setattr(p, kind, getattr(p, kind) + float(val))
                    if kind in ("nuclear", "spectral"):
                        p.shape = v.shape if len(v.shape) == 2 else (v.size, 1)
                elif kind == "ball":
                    p.radius = min(p.radius, float(val))
                elif kind == "lower":
                    p.lower = np.maximum(np.broadcast_to(p.lower, val.shape), val)
                    p.has_box = True
                else:
                    p.upper = np.minimum(np.broadcast_to(p.upper, val.shape), val)
                    p.has_box = True
        slices, kept = [], []
        for v in layout.variables:
            p = pieces[id(v)]
            if p.has_box and np.any(np.asarray(p.lower) > np.asarray(p.upper)):
                raise ModelError(
                    f"regularize(): the bounds on '{v.name()}' are empty (lower > upper); "
                    "the model is infeasible"
                )
            if p.l2 > 0 and p.has_box:
                raise UnsupportedError(
                    f"regularize(): norm2 together with bounds on '{v.name()}' has no closed-"
                    "form prox; move the bounds into model.server.subject_to(...)"
                )
            if p.has_ball and (p.l1 or p.l2 or p.has_box):
                raise UnsupportedError(
                    f"regularize(): a norm ball on '{v.name()}' together with norm1, norm2 or "
                    "bounds has no closed-form prox; keep the ball with at most a sum of squares"
                )
            if p.has_matrix_norm and (
                p.l1 or p.l2 or p.has_box or p.has_ball or (p.nuclear and p.spectral)
            ):
                raise UnsupportedError(
                    f"regularize(): a nuclear or spectral norm of '{v.name()}' together with "
                    "another norm or bounds has no closed-form prox; keep it with at most a "
                    "sum of squares"
                )
            if p.l1 or p.sumsq or p.l2 or p.has_box or p.has_ball or p.has_matrix_norm:
                slices.append(layout.slice_of(v))
                kept.append(p)
        return cls(slices, kept, list(terms))

    @property
    def is_zero(self) -> bool:
        return not self.pieces

    @property
    def is_smooth(self) -> bool:
        """True when h is only sum-of-squares terms (differentiable everywhere)."""
        return all(
            p.l1 == 0 and p.l2 == 0 and not p.has_box and not p.has_ball and not p.has_matrix_norm
            for p in self.pieces
        )

    def value(self, x: np.ndarray) -> float:
        """h(x) without the box indicator (see :meth:`box_violation` for the box)."""
        total = 0.0
        for s, p in zip(self.slices, self.pieces):
            v = x[s]
            total += p.l1 * np.abs(v).sum() + p.sumsq * v.dot(v) + p.l2 * np.linalg.norm(v)
            if p.has_matrix_norm:
                sv = np.linalg.svd(_matrix(v, p), compute_uv=False)
                total += p.nuclear * sv.sum() + p.spectral * sv.max(initial=0.0)
        return float(total)

    def box_violation(self, x: np.ndarray) -> float:
        """Largest distance of a coordinate outside its bounds (0 inside the box)."""
        worst = 0.0
        for s, p in zip(self.slices, self.pieces):
            if p.has_box:
                v = x[s]
                worst = max(worst, float(np.maximum(p.lower - v, 0).max(initial=0.0)))
                worst = max(worst, float(np.maximum(v - p.upper, 0).max(initial=0.0)))
            if p.has_ball:
                worst = max(worst, float(np.linalg.norm(x[s])) - p.radius)
        return worst

    def subgradient_scale(self, x: np.ndarray) -> float:
        """Largest magnitude of an element of ``dh(x)`` without the box's normal cone
        (``2 sumsq |v|``, the l1 weight, the group norm's weight): h's share of the scale
        of the stationarity residual (:mod:`fedmodel.certificate.kkt`)."""
        worst = 0.0
        for s, p in zip(self.slices, self.pieces):
            v = x[s]
            worst = max(
                worst,
                2 * p.sumsq * float(np.abs(v).max(initial=0.0))
                + p.l1
                + p.l2
                + p.nuclear
                + p.spectral,
            )
        return worst

    def bound_form(self, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """``h`` over a vector of ``n`` entries as ``sum_j q_j x_j^2 / 2`` plus bounds ``lo <=
        x <= hi``, as ``(q, lo, hi)`` (0 and infinite sides where it has none), when it has
        only boxes and sums of squares; None with any other piece.

        Examples
        --------
        >>> reg = Regularizer.from_pieces(
        ...     [slice(0, 2)], [VariablePiece(sumsq=0.5, lower=0.0, upper=1.0, has_box=True)])
        >>> [a.tolist() for a in reg.bound_form(3)]
        [[1.0, 1.0, 0.0], [0.0, 0.0, -inf], [1.0, 1.0, inf]]
        """
        q, lo, hi = np.zeros(n), np.full(n, -np.inf), np.full(n, np.inf)
        for s, p in zip(self.slices, self.pieces):
            if p.l1 or p.couples:
                return None
            q[s] = 2.0 * p.sumsq
            if p.has_box:
                lo[s], hi[s] = p.lower, p.upper
        return q, lo, hi

    def smooth_grad(self, x: np.ndarray) -> np.ndarray:
        """Gradient of the sum-of-squares part of h."""
        g = np.zeros_like(x)
        for s, p in zip(self.slices, self.pieces):
            if p.sumsq:
                g[s] = 2 * p.sumsq * x[s]
        return g

    def prox(self, z: np.ndarray, t) -> np.ndarray:
        """``argmin_x  h(x) + ||x - z||^2 / (2 t)`` (exact); ``t`` a scalar, or a vector
        (a diagonal metric ``sum_j (x_j - z_j)^2 / (2 t_j)``: closed form for the separable
        pieces -- l1, sum of squares, box -- and refused for a group norm or a norm ball
        whose coordinates have different steps)."""
        x = np.array(z, dtype=float, copy=True)
        for s, p in zip(self.slices, self.pieces):
            ts = np.asarray(t, dtype=float)[s] if np.ndim(t) else t
            if p.couples and np.ndim(ts) and np.ptp(ts) > 0:
                what = "group norm" if p.l2 else "norm ball" if p.has_ball else "matrix norm"
                raise UnsupportedError(
                    f"the prox of a {what} under a per-coordinate step has no closed form; "
                    "use a scalar step (penalty_metric='scalar')"
                )
            scale = 1.0 + 2.0 * ts * p.sumsq
            v, tt = z[s] / scale, ts / scale
            if p.l1:
                # soft-thresholding; "+ 0.0" turns the -0.0 of negative entries set to zero
                # into 0.0 (same value, printed without a sign)
                v = np.sign(v) * np.maximum(np.abs(v) - tt * p.l1, 0.0) + 0.0
            if p.l2:
                tt = float(np.max(tt)) if np.ndim(tt) else tt  # (all equal, checked above)
                nrm = np.linalg.norm(v)
                v = v * max(0.0, 1.0 - tt * p.l2 / nrm) if nrm > 0 else v
            if p.has_box:
                v = np.clip(v, p.lower, p.upper)
            if p.has_ball:  # radial: scale by the sum of squares, then project
                v = _project_ball(v, p.radius)
            if p.has_matrix_norm:  # on the singular values, after the sum of squares' scaling
                tt = float(np.max(tt)) if np.ndim(tt) else tt  # (all equal, checked above)
                v = _prox_singular_values(v, p, tt)
            x[s] = v
        return x

    def project_domain(self, x: np.ndarray) -> np.ndarray:
        """Closest point of dom(h) (the box), used to make a starting point admissible."""
        y = np.array(x, dtype=float, copy=True)
        for s, p in zip(self.slices, self.pieces):
            if p.has_box:
                y[s] = np.clip(y[s], p.lower, p.upper)
            if p.has_ball:
                y[s] = _project_ball(y[s], p.radius)
        return y

    def dist_subdiff(self, x: np.ndarray, g: np.ndarray, active_tol: float = 1e-9) -> float:
        """``dist_inf(0, g + dh(x))`` for a gradient ``g`` of the smooth part.

        A coordinate within ``active_tol * (1 + |bound|)`` of a bound, or of zero for the
        l1 term, is treated as lying on it. With a group norm at ``v = 0`` the value is an
        upper bound of the distance (a valid certificate).
        """
        closest = self.closest_subgradient(x, g, active_tol)
        return float(np.abs(closest).max(initial=0.0))

    def closest_subgradient(
        self, x: np.ndarray, g: np.ndarray, active_tol: float = 1e-9
    ) -> np.ndarray:
        """The element ``g + v`` of ``g + dh(x)`` whose infinity norm is
        :meth:`dist_subdiff` ``(x, g)`` (the same choice of ``v``: per coordinate the point
        of ``l1 d|v| + N_box`` closest to ``-g``; for a group norm at ``v = 0`` and a norm
        ball, the element whose norm :meth:`dist_subdiff` reports, an upper bound).

        Examples
        --------
        >>> reg = Regularizer.from_pieces([slice(0, 2)], [VariablePiece(l1=1.0)])
        >>> reg.closest_subgradient(np.array([0.0, 2.0]), np.array([0.5, -3.0])).tolist()
        [0.0, -2.0]
        """
        g = np.asarray(g, dtype=float)
        out = np.array(g, dtype=float, copy=True)
        for s, p in zip(self.slices, self.pieces):
            v = x[s]
            gs = g[s] + 2 * p.sumsq * v
            if p.has_matrix_norm:
                out[s] = _matrix_closest(v, gs, p, active_tol)
            elif p.has_ball:
                nrm2 = float(v.dot(v))
                if nrm2 > 0 and np.sqrt(nrm2) >= p.radius * (1 - active_tol):
                    gs = gs + max(0.0, -float(gs.dot(v)) / nrm2) * v
                out[s] = gs
            elif p.l2:
                nrm = np.linalg.norm(v)
                if nrm > active_tol:
                    gs = gs + p.l2 * v / nrm
                    out[s] = _l1_box_closest(v, gs, p, active_tol) if p.l1 else gs
                else:
                    rr = np.sign(gs) * np.maximum(np.abs(gs) - p.l1, 0.0) if p.l1 else gs
                    n2 = np.linalg.norm(rr)
                    out[s] = rr * (max(0.0, 1.0 - p.l2 / n2) if n2 > 0 else 0.0)
            else:
                out[s] = _l1_box_closest(v, gs, p, active_tol)
        return out

    def cvxpy_parts(self, var_exprs: list[cp.Expression]) -> tuple[cp.Expression | int, list]:
        """h's terms and box constraints for a cvxpy problem over ``var_exprs``, one
        flattened expression per entry of :attr:`slices`."""
        obj: cp.Expression | int = 0
        cons = []
        for v, p in zip(var_exprs, self.pieces):
            if p.l1:
                obj = obj + p.l1 * cp.norm1(v)
            if p.sumsq:
                obj = obj + p.sumsq * cp.sum_squares(v)
            if p.l2:
                obj = obj + p.l2 * cp.norm(v, 2)
            if p.nuclear:
                obj = obj + p.nuclear * cp.normNuc(cp.reshape(v, p.shape, order="F"))
            if p.spectral:
                obj = obj + p.spectral * cp.sigma_max(cp.reshape(v, p.shape, order="F"))
            if p.has_ball:
                cons.append(cp.norm(v, 2) <= p.radius)
            if p.has_box:
                lo = np.broadcast_to(p.lower, v.shape)
                hi = np.broadcast_to(p.upper, v.shape)
                if np.isfinite(lo).any():
                    idx = np.flatnonzero(np.isfinite(lo))
                    cons.append(v[idx] >= lo[idx])
                if np.isfinite(hi).any():
                    idx = np.flatnonzero(np.isfinite(hi))
                    cons.append(v[idx] <= hi[idx])
        return obj, cons

    def describe(self, layout) -> list[str]:
        """One line per regularised variable, e.g. ``w: 0.001*norm1 + box``."""
        lines = []
        for s, p in zip(self.slices, self.pieces):
            name = next((v.name() for v in layout.variables if layout.slice_of(v) == s), "?")
            parts = [
                f"{val:g}*{label}"
                for label, val in (
                    ("norm1", p.l1),
                    ("sum_squares", p.sumsq),
                    ("norm2", p.l2),
                    ("normNuc", p.nuclear),
                    ("sigma_max", p.spectral),
                )
                if val
            ]
            if p.has_box:
                parts.append("box")
            if p.has_ball:
                parts.append(f"norm2 <= {p.radius:g}")
            lines.append(f"{name}: " + " + ".join(parts))
        return lines


def _matrix(v: np.ndarray, p: VariablePiece) -> np.ndarray:
    """The flattened (column-major) entries ``v`` as the piece's matrix."""
    return np.reshape(v, p.shape, order="F")


def _project_l1_ball(values: np.ndarray, radius: float) -> np.ndarray:
    """Projection of nonnegative ``values`` on ``{y >= 0: sum(y) <= radius}`` (sorting)."""
    if values.sum() <= radius:
        return values
    srt = np.sort(values)[::-1]
    cums = np.cumsum(srt) - radius
    k = np.flatnonzero(srt > cums / np.arange(1, srt.size + 1))[-1]
    return np.maximum(values - cums[k] / (k + 1), 0.0)


def _prox_singular_values(v: np.ndarray, p: VariablePiece, t: float) -> np.ndarray:
    """The prox of ``t (nuclear ||V||_* + spectral ||V||_2)`` (one of the two nonzero) at
    the flattened ``v``: the singular values soft-thresholded at ``t nuclear``, or less
    their projection on the l1 ball of radius ``t spectral`` (Moreau's identity)."""
    U, sv, Vt = np.linalg.svd(_matrix(v, p), full_matrices=False)
    if p.nuclear:
        sv = np.maximum(sv - t * p.nuclear, 0.0)
    else:
        sv = sv - _project_l1_ball(sv, t * p.spectral)
    return ((U * sv) @ Vt).flatten(order="F")


def _matrix_closest(v: np.ndarray, g: np.ndarray, p: VariablePiece, tol: float) -> np.ndarray:
    """The element of ``g + d(nuclear ||V||_* + spectral ||V||_2)`` closest to 0 in the
    Frobenius norm (flattened), singular values within ``tol * max(1, sigma_1)`` of 0 (of
    ``sigma_1`` for the spectral norm) read as 0 (as ``sigma_1``).

    With ``U, V`` the singular vectors of the singular values that count and ``P_U``,
    ``P_V`` the projections on the others' complement, the nuclear norm's subdifferential is
    ``UV' + W`` with ``W = P_U W P_V``, ``||W||_2 <= 1``: the best ``W`` clips the singular
    values of ``-P_U G P_V / nuclear`` at 1. The spectral norm's is ``U T V'`` with ``T``
    positive semidefinite of trace 1 over the top singular vectors (the nuclear unit ball
    at 0): the best ``T`` projects the symmetric part of ``-U'GV / spectral`` on that set.
    """
    X, G = _matrix(v, p), _matrix(g, p)
    U, sv, Vt = np.linalg.svd(X, full_matrices=False)
    top = float(sv.max(initial=0.0))
    if p.nuclear:
        rank = int(np.sum(sv > tol * max(1.0, top)))
        Ur, Vr = U[:, :rank], Vt[:rank].T
        rest = G - Ur @ (Ur.T @ G) - (G @ Vr) @ Vr.T + Ur @ (Ur.T @ G @ Vr) @ Vr.T
        Uw, sw, Vwt = np.linalg.svd(rest / p.nuclear, full_matrices=False)
        W = -(Uw * np.minimum(sw, 1.0)) @ Vwt
        closest = G + p.nuclear * (Ur @ Vr.T + W)
    elif top <= tol:  # at 0: the nuclear-norm ball of radius spectral
        Ug, sg, Vgt = np.linalg.svd(G, full_matrices=False)
        closest = (Ug * (sg - _project_l1_ball(sg, p.spectral))) @ Vgt
    else:
        k = int(np.sum(sv >= top * (1 - tol)))
        Uk, Vk = U[:, :k], Vt[:k].T
        M = -(Uk.T @ G @ Vk) / p.spectral
        lam, Q = np.linalg.eigh(0.5 * (M + M.T))
        T = (Q * _project_simplex(lam)) @ Q.T
        closest = G + p.spectral * (Uk @ T @ Vk.T)
    return closest.flatten(order="F")


def _project_simplex(values: np.ndarray) -> np.ndarray:
    """Projection of ``values`` on the unit simplex ``{y >= 0: sum(y) = 1}``."""
    shifted = values - values.min() + 1.0  # (positive, sum > 1: the l1 sphere's face)
    return _project_l1_ball(shifted, 1.0)


def _project_ball(v: np.ndarray, radius: float) -> np.ndarray:
    nrm = float(np.linalg.norm(v))
    return v * (radius / nrm) if nrm > radius else v


def _l1_box_interval(v, p: VariablePiece, tol: float) -> tuple[np.ndarray, np.ndarray]:
    """Per coordinate, the interval ``[lo, hi]`` of ``l1 * d|v| + N_box(v)`` (a kink of
    ``|v|`` within ``tol`` of 0, a bound within ``tol`` of ``v``)."""
    lo_int = np.zeros_like(v)
    hi_int = np.zeros_like(v)
    if p.l1:
        zero = np.abs(v) <= tol
        sgn = np.sign(v)
        lo_int = np.where(zero, -p.l1, p.l1 * sgn)
        hi_int = np.where(zero, p.l1, p.l1 * sgn)
    if p.has_box:
        lower = np.broadcast_to(p.lower, v.shape)
        upper = np.broadcast_to(p.upper, v.shape)
        at_lo = np.isfinite(lower) & (
            v <= lower + tol * (1 + np.abs(np.where(np.isfinite(lower), lower, 0)))
        )
        at_hi = np.isfinite(upper) & (
            v >= upper - tol * (1 + np.abs(np.where(np.isfinite(upper), upper, 0)))
        )
        lo_int = np.where(at_lo, -np.inf, lo_int)
        hi_int = np.where(at_hi, np.inf, hi_int)
    return lo_int, hi_int


def _l1_box_closest(v, g, p: VariablePiece, tol: float) -> np.ndarray:
    """Per coordinate, the point of ``g + [lo, hi]`` (the interval of
    :func:`_l1_box_interval`) closest to 0: ``g + clip(-g, lo, hi)`` (its absolute value is
    the distance from ``-g`` to the interval)."""
    lo_int, hi_int = _l1_box_interval(v, p, tol)
    return g + np.clip(-g, lo_int, hi_int)
