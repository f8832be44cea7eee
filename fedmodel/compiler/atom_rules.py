"""Atom rules of the smooth evaluator: forward values and vector-Jacobian products.

Each smooth cvxpy atom has a *rule* ``(builder, expr, args) -> (fwd, bwd)`` registered in
:data:`_RULES` (an :class:`~fedmodel.expressions.AtomTable`) by class name; atoms that are not
continuously differentiable are listed in :data:`_NOT_SMOOTH` with the reason shown to users. :func:`_classify` decides which
applies to an expression node. The tape that runs the rules is in
:mod:`fedmodel.compiler.evaluator`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import cvxpy as cp
import numpy as np
import scipy.sparse as sp
import scipy.special as sps
from cvxpy.atoms.affine.affine_atom import AffAtom
from cvxpy.expressions.constants.parameter import Parameter

from fedmodel.errors import UnsupportedError
from fedmodel.expressions import AtomTable


# ----------------------------------------------------------------------------------------
# Errors and atom tables
# ----------------------------------------------------------------------------------------
class NotSmoothError(UnsupportedError):
    """An expression contains an atom that is not differentiable or not supported.

    It is a :class:`ValueError` (via :class:`fedmodel.errors.UnsupportedError`).

    Attributes
    ----------
    atom : str
        cvxpy class name of the offending atom, e.g. ``'abs'``, ``'norm1'``,
        ``'maximum'``, ``'PnormApprox'``.
    expression : str
        The offending subexpression, as cvxpy prints it.
    reason : str
        Why it is refused, e.g. ``'abs is not differentiable at 0'``.

    Examples
    --------
    >>> import cvxpy as cp
    >>> from fedmodel.compiler.smoothness import check_smooth
    >>> try:
    ...     check_smooth(cp.sum(cp.abs(cp.Variable(2))))
    ... except NotSmoothError as err:
    ...     print(err.atom)
    abs
    """

    def __init__(self, atom: str, expression: str, reason: str):
        self.atom = atom
        self.expression = expression
        self.reason = reason
        expr_text = " ".join(str(expression).split())
        if len(expr_text) > 200:
            expr_text = expr_text[:197] + "..."
        super().__init__(
            f"atom '{atom}' in '{expr_text}' cannot be used in a smooth (differentiable) "
            f"expression: {reason}"
        )

    def __reduce__(self):  # keep picklable despite the custom signature
        return (type(self), (self.atom, self.expression, self.reason))


_KINK = "it has kinks where the gradient jumps; reformulate with a smooth surrogate"
_NOT_SMOOTH: dict[str, str] = {
    "abs": "abs is not differentiable at 0",
    "maximum": "maximum (also cp.pos, cp.scalene, cp.loggamma) is not differentiable "
    "where two of its arguments are equal (e.g. pos(x) at x = 0)",
    "minimum": "minimum (also cp.neg) is not differentiable where two of its arguments are "
    "equal (e.g. neg(x) at x = 0)",
    "max": "max is not differentiable where the largest entry is attained by several entries",
    "min": "min is not differentiable where the smallest entry is attained by several entries",
    "norm1": "norm1 is not differentiable where an entry is 0",
    "norm_inf": "norm_inf is not differentiable at 0 and where the largest absolute entry "
    "is attained by several entries",
    "sum_largest": "sum_largest (also sum_smallest, cvar) is not differentiable where the "
    "k-th and (k+1)-th largest entries are equal",
    "dotsort": f"dotsort is piecewise linear; {_KINK}",
    "cummax": f"cummax is piecewise linear; {_KINK}",
    "lambda_max": "lambda_max (also lambda_min, lambda_sum_largest/smallest) is not "
    "differentiable where eigenvalues coincide",
    "sigma_max": "sigma_max is not differentiable where singular values coincide",
    "normNuc": "the nuclear norm is not differentiable at rank-deficient matrices",
    "ceil": "ceil is piecewise constant and discontinuous",
    "floor": "floor is piecewise constant and discontinuous",
    "sign": "sign is piecewise constant and discontinuous",
    "length": "length is piecewise constant and discontinuous",
    "LogicExpression": "boolean logic atoms are not differentiable",
    "GeoMean": "geo_mean is not differentiable at 0 (boundary of its domain) and is not "
    "supported by the smooth compiler",
    "cumprod": "cumprod is not supported by the smooth compiler",
    "tr_inv": "tr_inv is not supported by the smooth compiler",
    "SymbolicQuadForm": "SymbolicQuadForm is an internal cvxpy atom and is not supported",
}


def _pnorm_reason(expr: Any) -> str:
    p = getattr(expr, "original_p", getattr(expr, "p", "?"))
    try:
        p_float = float(p)
    except (TypeError, ValueError):  # pragma: no cover - defensive
        p_float = 2.0
    if p_float > 1:
        which = "norm2 / norm" if p_float == 2 else "pnorm"
        return (
            f"pnorm with p={p} ({which}) is not differentiable at 0; use "
            "cp.sum_squares (smooth) or a smoothed norm such as sqrt(sum_squares(x) + eps)"
        )
    return f"pnorm with p={p} is not differentiable on the boundary of its domain (x = 0)"


# ----------------------------------------------------------------------------------------
# Small numpy helpers
# ----------------------------------------------------------------------------------------
def _unbroadcast(g: Any, shape: tuple[int, ...]) -> np.ndarray:
    """Sum ``g`` over the axes that numpy broadcasting added to reach ``g.shape``."""
    g = np.asarray(g)
    if g.shape == shape:
        return g
    extra = g.ndim - len(shape)
    if extra > 0:
        g = g.sum(axis=tuple(range(extra)))
    axes = tuple(i for i, s in enumerate(shape) if s == 1 and g.shape[i] != 1)
    if axes:
        g = g.sum(axis=axes, keepdims=True)
    return g.reshape(shape)


def _norm_axes(axis: Any, ndim: int) -> tuple[int, ...]:
    if axis is None:
        return tuple(range(ndim))
    if isinstance(axis, (int, np.integer)):
        axis = (axis,)
    return tuple(sorted(int(a) % ndim for a in axis)) if ndim else ()


def _expand_reduced(g: Any, in_shape: tuple[int, ...], axis: Any, keepdims: bool) -> np.ndarray:
    """Broadcast the cotangent of a reduction over ``axis`` back to ``in_shape``."""
    g = np.asarray(g)
    if len(in_shape) == 0:
        return g.reshape(())
    if axis is None:
        return np.broadcast_to(g.reshape(()), in_shape)
    if not keepdims:
        g = np.expand_dims(g, _norm_axes(axis, len(in_shape)))
    return np.broadcast_to(g, in_shape)


def _dense(value: Any) -> np.ndarray:
    if sp.issparse(value):
        return np.asarray(value.toarray(), dtype=float)
    return np.asarray(value, dtype=float)


def _flat(v: Any) -> np.ndarray:
    return np.reshape(v, -1, order="F")


def _scalar(v: Any) -> float:
    return float(np.reshape(v, -1)[0])


# ----------------------------------------------------------------------------------------
# Compiler internals
# ----------------------------------------------------------------------------------------
_CONST, _PARAM, _DIFF = 0, 1, 2

Fwd = Callable[[list], Any]
Bwd = Callable[[Any, Any, list], list]


class _Arg:
    """Compile-time view of an argument node."""

    __slots__ = ("idx", "kind", "shape", "value")

    def __init__(self, idx: int, kind: int, shape: tuple[int, ...], value: Any):
        self.idx, self.kind, self.shape, self.value = idx, kind, shape, value

    @property
    def diff(self) -> bool:
        return self.kind == _DIFF

    @property
    def const(self) -> bool:
        return self.kind == _CONST


# Every rule maps (expr, args) to (fwd, bwd); bwd returns one entry per argument (None
# for arguments that do not depend on x).
class Tape(Protocol):
    """What a rule needs of the tape being built (:class:`~fedmodel.compiler.evaluator._Builder`):
    a dense copy of a sparse constant argument."""

    def dense_arg(self, a: _Arg) -> _Arg: ...


Rule = Callable[[Tape, Any, list[_Arg]], tuple[Fwd, Bwd | None]]
_RULES = AtomTable("value and derivative of a smooth atom")
# Rules that accept scipy.sparse constant arguments; all other rules get dense copies.
_SPARSE_OK = {"MulExpression", "QuadForm"}
_rule = _RULES.register


def _classify(expr: Any) -> tuple[str, Rule | None, str | None]:
    """Return ``(name, rule, reason)`` for an atom: a rule if smooth, else a reason."""
    name = type(expr).__name__
    for cls in type(expr).__mro__:
        if not cls.__module__.startswith("cvxpy"):
            continue
        cname = cls.__name__
        if cname == "Pnorm":
            return name, None, _pnorm_reason(expr)
        if cname in _NOT_SMOOTH:
            return name, None, _NOT_SMOOTH[cname]
        if cname in _RULES:
            return name, _RULES[cname], None
    if isinstance(expr, AffAtom):
        try:
            affine = expr.is_atom_convex() and expr.is_atom_concave()
        except Exception:  # pragma: no cover - defensive
            affine = False
        if affine:
            return name, _rule_generic_affine, None
    return (
        name,
        None,
        f"{name} is not a supported smooth atom (see fedmodel.compiler.smooth.smooth_atoms())",
    )


# ----------------------------------------------------------------------------------------
# Rules: affine atoms
# ----------------------------------------------------------------------------------------
@_rule("AddExpression")
def _rule_add(b: Tape, expr: Any, args: list[_Arg]):
    shape = tuple(expr.shape)

    def fwd(vals: list) -> Any:
        out = vals[0]
        for v in vals[1:]:
            out = out + v
        if np.shape(out) != shape:
            out = np.broadcast_to(out, shape)
        return out

    shapes = [a.shape if a.diff else None for a in args]

    def bwd(g: Any, out: Any, vals: list) -> list:
        return [None if s is None else _unbroadcast(g, s) for s in shapes]

    return fwd, bwd


@_rule("NegExpression")
def _rule_neg(b, expr, args):
    return (lambda vals: -vals[0]), (lambda g, out, vals: [-g])


@_rule("conj", "real", "Wrap")
def _rule_identity(b, expr, args):
    return (lambda vals: vals[0]), (lambda g, out, vals: [g])


@_rule("imag")
def _rule_imag(b, expr, args):
    shape = tuple(expr.shape)
    return (lambda vals: np.zeros(shape)), (lambda g, out, vals: [None])


@_rule("Promote")
def _rule_promote(b, expr, args):
    shape, in_shape = tuple(expr.shape), args[0].shape

    def fwd(vals):
        return np.broadcast_to(np.reshape(vals[0], ()), shape)

    def bwd(g, out, vals):
        return [np.reshape(np.sum(g), in_shape)]

    return fwd, bwd


@_rule("broadcast_to")
def _rule_broadcast_to(b, expr, args):
    shape, in_shape = tuple(expr.shape), args[0].shape
    return (
        lambda vals: np.broadcast_to(vals[0], shape),
        lambda g, out, vals: [_unbroadcast(g, in_shape)],
    )


@_rule("reshape")
def _rule_reshape(b, expr, args):
    shape, in_shape = tuple(expr.shape), args[0].shape
    order = getattr(expr, "order", "F") or "F"
    return (
        lambda vals: np.reshape(vals[0], shape, order=order),
        lambda g, out, vals: [np.reshape(g, in_shape, order=order)],
    )


@_rule("transpose")
def _rule_transpose(b, expr, args):
    axes = getattr(expr, "axes", None)
    inv = None if axes is None else tuple(int(i) for i in np.argsort(axes))
    return (
        lambda vals: np.transpose(vals[0], axes),
        lambda g, out, vals: [np.transpose(g, inv)],
    )


@_rule("index")
def _rule_index(b, expr, args):
    key = expr._orig_key if hasattr(expr, "_orig_key") else expr.key
    shape, in_shape = tuple(expr.shape), args[0].shape
    sub_shape = np.shape(np.zeros(in_shape)[key])

    def fwd(vals):
        return np.reshape(np.asarray(vals[0])[key], shape)

    def bwd(g, out, vals):
        z = np.zeros(in_shape)
        z[key] = np.reshape(g, sub_shape)
        return [z]

    return fwd, bwd


@_rule("special_index")
def _rule_special_index(b, expr, args):
    in_shape = args[0].shape
    in_size = int(np.prod(in_shape, dtype=int))
    select = getattr(expr, "_select_mat", None)
    if select is None:  # pragma: no cover - older cvxpy
        select = np.reshape(np.arange(in_size), in_shape, order="F")[expr.key]
    select = np.asarray(select, dtype=np.intp)
    shape = tuple(expr.shape)
    flat_select = select.ravel()

    def fwd(vals):
        return np.reshape(_flat(vals[0])[select], shape)

    def bwd(g, out, vals):
        gi = np.bincount(
            flat_select, weights=np.ravel(np.reshape(g, select.shape)), minlength=in_size
        )
        return [np.reshape(gi, in_shape, order="F")]

    return fwd, bwd


@_rule("Sum")
def _rule_sum(b, expr, args):
    axis, keepdims, in_shape = expr.axis, bool(expr.keepdims), args[0].shape
    if len(in_shape) == 0:
        axis = None
    return (
        lambda vals: np.sum(vals[0], axis=axis, keepdims=keepdims),
        lambda g, out, vals: [_expand_reduced(g, in_shape, axis, keepdims)],
    )


def _stack_rule(args: list[_Arg], expr: Any, kind: str):
    """Shared implementation of Hstack / Vstack / Concatenate."""
    shapes = [a.shape for a in args]
    if kind == "hstack":
        promoted = [s if len(s) >= 1 else (1,) for s in shapes]
        axis = 0 if len(promoted[0]) == 1 else 1
    elif kind == "vstack":
        promoted = [s if len(s) >= 2 else ((1, s[0]) if len(s) == 1 else (1, 1)) for s in shapes]
        axis = 0
    else:
        axis = expr.axis
        if axis is None:
            promoted = [(int(np.prod(s, dtype=int)),) for s in shapes]
        else:
            promoted = list(shapes)
            axis = int(axis) % len(promoted[0])
    if axis is None:
        axis_c = 0
    else:
        axis_c = axis
    bounds = np.cumsum([0] + [p[axis_c] for p in promoted])
    diff = [a.diff for a in args]

    def fwd(vals):
        return np.concatenate(
            [np.reshape(v, p) for v, p in zip(vals, promoted, strict=True)], axis=axis_c
        )

    def bwd(g, out, vals):
        res = []
        nd = np.ndim(g)
        for i, s in enumerate(shapes):
            if not diff[i]:
                res.append(None)
                continue
            sl = [slice(None)] * nd
            sl[axis_c] = slice(int(bounds[i]), int(bounds[i + 1]))
            res.append(np.reshape(g[tuple(sl)], s))
        return res

    return fwd, bwd


@_rule("Hstack")
def _rule_hstack(b, expr, args):
    return _stack_rule(args, expr, "hstack")


@_rule("Vstack")
def _rule_vstack(b, expr, args):
    return _stack_rule(args, expr, "vstack")


@_rule("Concatenate")
def _rule_concatenate(b, expr, args):
    return _stack_rule(args, expr, "concatenate")


@_rule("cumsum")
def _rule_cumsum(b, expr, args):
    axis, in_shape = expr.axis, args[0].shape
    if len(in_shape) == 0:
        return (lambda vals: np.asarray(vals[0])), (lambda g, out, vals: [g])
    shape = tuple(expr.shape)

    def fwd(vals):
        return np.reshape(np.cumsum(vals[0], axis=axis), shape)

    def bwd(g, out, vals):
        if axis is None:
            r = np.cumsum(np.ravel(g)[::-1])[::-1]
            return [np.reshape(r, in_shape)]
        return [np.flip(np.cumsum(np.flip(g, axis), axis), axis)]

    return fwd, bwd


@_rule("diag_vec")
def _rule_diag_vec(b, expr, args):
    k, in_shape = int(expr.k), args[0].shape
    return (
        lambda vals: np.diag(np.reshape(vals[0], -1), k),
        lambda g, out, vals: [np.reshape(np.diag(g, k), in_shape)],
    )


@_rule("diag_mat")
def _rule_diag_mat(b, expr, args):
    k = int(expr.k)
    return (
        lambda vals: np.diag(vals[0], k),
        lambda g, out, vals: [np.diag(np.reshape(g, -1), k)],
    )


@_rule("Trace")
def _rule_trace(b, expr, args):
    in_shape = args[0].shape
    eye = np.eye(in_shape[-1])
    return (
        lambda vals: np.trace(vals[0], axis1=-2, axis2=-1),
        lambda g, out, vals: [np.asarray(g)[..., None, None] * eye],
    )


def _matmul_dense_bwd(a: np.ndarray, bm: np.ndarray, g: Any, need_a: bool, need_b: bool):
    """VJP of ``a @ bm`` (numpy matmul semantics incl. 1-D promotion and batching)."""
    g = np.asarray(g)
    an, bn = a.ndim, bm.ndim
    ga = gb = None
    if an == 1 and bn == 1:
        if need_a:
            ga = g * bm
        if need_b:
            gb = g * a
    elif an == 1:  # (k,) @ (..., k, n) -> (..., n)
        if need_a:
            ga = _unbroadcast(bm @ g if bn == 2 else (bm @ g[..., None])[..., 0], a.shape)
        if need_b:
            gb = _unbroadcast(a[:, None] * g[..., None, :], bm.shape)
    elif bn == 1:  # (..., m, k) @ (k,) -> (..., m)
        if need_a:
            ga = _unbroadcast(g[..., :, None] * bm, a.shape)
        if need_b:
            if an == 2:
                gb = a.T @ g
            else:
                gb = _unbroadcast((np.swapaxes(a, -1, -2) @ g[..., None])[..., 0], bm.shape)
    else:
        if need_a:
            ga = _unbroadcast(g @ np.swapaxes(bm, -1, -2), a.shape)
        if need_b:
            gb = _unbroadcast(np.swapaxes(a, -1, -2) @ g, bm.shape)
    return [ga, gb]


def _elementwise_product(b: Tape, args: list[_Arg], shape: tuple[int, ...]):
    a0, a1 = (b.dense_arg(a) for a in args)
    s0, s1 = a0.shape, a1.shape
    d0, d1 = a0.diff, a1.diff
    c0, c1 = a0.value, a1.value

    def fwd(vals):
        x = c0 if c0 is not None else vals[0]
        y = c1 if c1 is not None else vals[1]
        out = x * y
        return out if np.shape(out) == shape else np.broadcast_to(out, shape)

    def bwd(g, out, vals):
        x = c0 if c0 is not None else vals[0]
        y = c1 if c1 is not None else vals[1]
        return [
            _unbroadcast(g * y, s0) if d0 else None,
            _unbroadcast(g * x, s1) if d1 else None,
        ]

    return fwd, bwd


@_rule("MulExpression")
def _rule_matmul(b, expr, args):
    shape = tuple(expr.shape)
    a0, a1 = args
    if a0.shape == () or a1.shape == ():
        return _elementwise_product(b, args, shape)
    # Sparse constant on the left: A @ v.
    if a0.const and sp.issparse(a0.value) and len(a1.shape) <= 2:
        A = sp.csr_array(a0.value)
        AT = sp.csr_array(A.T)

        def fwd_l(vals):
            return A @ vals[1]

        def bwd_l(g, out, vals):
            return [None, AT @ np.asarray(g)]

        return fwd_l, bwd_l
    # Sparse constant on the right: v @ B.
    if a1.const and sp.issparse(a1.value) and len(a0.shape) <= 2:
        B = sp.csr_array(a1.value)
        BT = sp.csr_array(B.T)
        one_d = len(a0.shape) == 1

        def fwd_r(vals):
            v = vals[0]
            return BT @ v if one_d else (BT @ v.T).T

        def bwd_r(g, out, vals):
            g = np.asarray(g)
            return [B @ g if one_d else (B @ g.T).T, None]

        return fwd_r, bwd_r
    a0, a1 = b.dense_arg(a0), b.dense_arg(a1)
    c0, c1 = a0.value, a1.value
    d0, d1 = a0.diff, a1.diff

    def fwd(vals):
        x = c0 if c0 is not None else vals[0]
        y = c1 if c1 is not None else vals[1]
        return x @ y

    def bwd(g, out, vals):
        x = c0 if c0 is not None else vals[0]
        y = c1 if c1 is not None else vals[1]
        return _matmul_dense_bwd(np.asarray(x), np.asarray(y), g, d0, d1)

    return fwd, bwd


@_rule("multiply")
def _rule_multiply(b, expr, args):
    return _elementwise_product(b, args, tuple(expr.shape))


@_rule("DivExpression")
def _rule_div(b, expr, args):
    shape = tuple(expr.shape)
    s0, s1 = args[0].shape, args[1].shape
    d0, d1 = args[0].diff, args[1].diff

    def fwd(vals):
        out = np.divide(vals[0], vals[1])
        return out if np.shape(out) == shape else np.broadcast_to(out, shape)

    def bwd(g, out, vals):
        den = vals[1]
        return [
            _unbroadcast(g / den, s0) if d0 else None,
            _unbroadcast(-g * out / den, s1) if d1 else None,
        ]

    return fwd, bwd


def _rule_generic_affine(b: Tape, expr: Any, args: list[_Arg]):
    """Any other affine cvxpy atom, through its coefficient matrix (built once)."""
    name = type(expr).__name__
    if any(a.kind == _PARAM for a in args):
        raise NotSmoothError(
            name,
            str(expr),
            f"{name} is handled through its constant coefficient matrix, which does not "
            "allow Parameter-dependent operands; use a Constant or another formulation",
        )
    shape = tuple(expr.shape)
    if all(a.const for a in args):
        value = np.asarray(_dense(expr.value), dtype=float).reshape(shape)
        return (lambda vals: value), None
    grads = expr._grad([None] * len(args))
    zero_vals = [np.zeros(a.shape) if a.diff else a.value for a in args]
    offset = _flat(np.asarray(_dense(expr.numeric(zero_vals)), dtype=float).reshape(shape))
    jac = [sp.csr_array(gr) if a.diff else None for a, gr in zip(args, grads, strict=True)]
    jac_t = [None if j is None else sp.csr_array(j.T) for j in jac]
    shapes = [a.shape for a in args]

    def fwd(vals):
        out = offset
        for jt, v in zip(jac_t, vals, strict=True):
            if jt is not None:
                out = out + jt @ _flat(v)
        return np.reshape(out, shape, order="F")

    def bwd(g, out, vals):
        gf = _flat(g)
        return [
            None if j is None else np.reshape(j @ gf, s, order="F")
            for j, s in zip(jac, shapes, strict=True)
        ]

    return fwd, bwd


# ----------------------------------------------------------------------------------------
# Rules: smooth nonlinear atoms
# ----------------------------------------------------------------------------------------
def _logistic(x):
    # log(1 + exp(x)), stable; ~8x faster than np.logaddexp(0, x).
    return np.maximum(x, 0.0) + np.log1p(np.exp(-np.abs(x)))


def _entr(x):
    out = -sps.xlogy(x, x)
    return np.where(np.isnan(out), -np.inf, out)


_UNARY: dict[str, tuple[Callable, Callable]] = {
    # name: (f(x), f'(x, f(x)))
    "exp": (np.exp, lambda x, y: y),
    "log": (np.log, lambda x, y: 1.0 / x),
    "log1p": (np.log1p, lambda x, y: 1.0 / (1.0 + x)),
    "logistic": (_logistic, lambda x, y: sps.expit(x)),
    "entr": (_entr, lambda x, y: -(np.log(x) + 1.0)),
    "xexp": (lambda x: x * np.exp(x), lambda x, y: (1.0 + x) * np.exp(x)),
    "sin": (np.sin, lambda x, y: np.cos(x)),
    "cos": (np.cos, lambda x, y: -np.sin(x)),
    "tan": (np.tan, lambda x, y: 1.0 + y * y),
    "sinh": (np.sinh, lambda x, y: np.cosh(x)),
    "tanh": (np.tanh, lambda x, y: 1.0 - y * y),
    "asinh": (np.arcsinh, lambda x, y: 1.0 / np.sqrt(1.0 + x * x)),
    "atanh": (np.arctanh, lambda x, y: 1.0 / (1.0 - x * x)),
    "normcdf": (sps.ndtr, lambda x, y: np.exp(-0.5 * x * x) / np.sqrt(2.0 * np.pi)),
    "one_minus_pos": (lambda x: 1.0 - x, lambda x, y: -np.ones_like(x)),
}


def _make_unary(name: str) -> Rule:
    f, df = _UNARY[name]

    def rule(b, expr, args):
        shape = tuple(expr.shape)

        def fwd(vals):
            out = f(vals[0])
            return out if np.shape(out) == shape else np.broadcast_to(out, shape)

        def bwd(g, out, vals):
            return [_unbroadcast(g * df(vals[0], out), args[0].shape)]

        return fwd, bwd

    return rule


for _name in _UNARY:
    _RULES[_name] = _make_unary(_name)


def _attr_value(attr: Any) -> Callable[[], float]:
    """Scalar attribute of an atom (Constant: read now; Parameter: read at each call)."""
    if isinstance(attr, Parameter):

        def read() -> float:
            if attr.value is None:
                raise ValueError(f"parameter '{attr.name()}' has no value")
            return _scalar(attr.value)

        return read
    if isinstance(attr, cp.Expression):
        value = _scalar(attr.value)
    else:
        value = _scalar(attr)
    return lambda: value


def _pow_grad(x, y, p: float):
    if p == 2.0:
        return 2.0 * x
    if p == 1.0:
        return np.ones_like(x)
    if p == 0.0:
        return np.zeros_like(x)
    if p == 0.5:
        return 0.5 / y
    if p == -1.0:
        return -(y * y)
    return p * np.power(x, p - 1.0)


@_rule("Power")
def _rule_power(b, expr, args):
    p_of = _attr_value(expr.p)
    shape = tuple(expr.shape)

    def fwd(vals):
        out = np.power(vals[0], p_of())
        return out if np.shape(out) == shape else np.broadcast_to(out, shape)

    def bwd(g, out, vals):
        return [g * _pow_grad(vals[0], out, p_of())]

    return fwd, bwd


@_rule("huber")
def _rule_huber(b, expr, args):
    m_of = _attr_value(expr.M)

    def fwd(vals):
        return 2.0 * sps.huber(m_of(), vals[0])

    def bwd(g, out, vals):
        m = m_of()
        return [g * (2.0 * np.clip(vals[0], -m, m))]

    return fwd, bwd


def _binary_elementwise(f: Callable, dfx: Callable, dfy: Callable) -> Rule:
    def rule(b, expr, args):
        shape = tuple(expr.shape)
        s0, s1 = args[0].shape, args[1].shape
        d0, d1 = args[0].diff, args[1].diff

        def fwd(vals):
            out = f(vals[0], vals[1])
            return out if np.shape(out) == shape else np.broadcast_to(out, shape)

        def bwd(g, out, vals):
            x, y = vals
            return [
                _unbroadcast(g * dfx(x, y), s0) if d0 else None,
                _unbroadcast(g * dfy(x, y), s1) if d1 else None,
            ]

        return fwd, bwd

    return rule


_RULES["kl_div"] = _binary_elementwise(
    sps.kl_div, lambda x, y: np.log(x / y), lambda x, y: 1.0 - x / y
)
_RULES["rel_entr"] = _binary_elementwise(
    sps.rel_entr, lambda x, y: np.log(x / y) + 1.0, lambda x, y: -x / y
)


@_rule("log_sum_exp")
def _rule_log_sum_exp(b, expr, args):
    axis, keepdims, in_shape = expr.axis, bool(expr.keepdims), args[0].shape
    if len(in_shape) == 0:
        axis = None

    def fwd(vals):
        return sps.logsumexp(vals[0], axis=axis, keepdims=keepdims)

    def bwd(g, out, vals):
        ge = _expand_reduced(g, in_shape, axis, keepdims)
        oe = _expand_reduced(out, in_shape, axis, keepdims)
        return [ge * np.exp(vals[0] - oe)]

    return fwd, bwd


@_rule("quad_over_lin")
def _rule_quad_over_lin(b, expr, args):
    axis, keepdims = expr.axis, bool(expr.keepdims)
    x_shape, y_shape = args[0].shape, args[1].shape
    if len(x_shape) == 0:
        axis = None
    dx, dy = args[0].diff, args[1].diff

    def fwd(vals):
        return np.sum(np.square(vals[0]), axis=axis, keepdims=keepdims) / _scalar(vals[1])

    def bwd(g, out, vals):
        y = _scalar(vals[1])
        gx = gy = None
        if dx:
            gx = (2.0 / y) * vals[0] * _expand_reduced(g, x_shape, axis, keepdims)
        if dy:
            gy = np.reshape(-np.sum(np.asarray(g) * out) / y, y_shape)
        return [gx, gy]

    return fwd, bwd


def is_symmetric(P: np.ndarray, block: int = 64) -> bool:
    """Whether a dense square ``P`` equals its transpose exactly, compared a band of
    ``block`` rows at a time (a cache-friendly pass over the upper triangle)."""
    n = P.shape[0]
    if P.ndim != 2 or P.shape[1] != n:
        return False
    for i in range(0, n, block):
        if not np.array_equal(P[i : i + block, i:], P[i:, i : i + block].T):
            return False
    return True


@_rule("QuadForm")
def _rule_quad_form(b, expr, args):
    ax, ap = args
    x_shape, p_shape = ax.shape, ap.shape
    dx, dp = ax.diff, ap.diff
    # the gradient in x is (P + P^T) x: for a dense symmetric P, 2 (P x), the same numbers
    # as (2 P) x (a power of two) without a second N x N array
    doubled = False
    if ap.const:
        P = ap.value if sp.issparse(ap.value) else np.asarray(ap.value)
        doubled = not sp.issparse(P) and is_symmetric(P)
        P_sym = None if doubled else P + P.T  # (checked once: not symmetric, or sparse)
        if sp.issparse(P_sym):
            P_sym = sp.csr_array(P_sym)
            P = sp.csr_array(P)
    else:
        P = P_sym = None

    def fwd(vals):
        x = np.reshape(vals[0], -1)
        Pv = P if P is not None else vals[1]
        return np.asarray(float(x @ (Pv @ x)))

    def bwd(g, out, vals):
        x = np.reshape(vals[0], -1)
        gs = float(g)
        gx = gp = None
        if dx:
            if doubled:
                Px = 2.0 * (P @ x)
            else:
                Ps = P_sym if P_sym is not None else vals[1] + vals[1].T
                Px = Ps @ x
            gx = np.reshape(gs * Px, x_shape)
        if dp:
            gp = np.reshape(gs * np.outer(x, x), p_shape)
        return [gx, gp]

    return fwd, bwd


@_rule("Prod")
def _rule_prod(b, expr, args):
    axis, keepdims, in_shape = expr.axis, bool(expr.keepdims), args[0].shape
    nd = len(in_shape)
    if nd == 0:
        return (lambda vals: np.asarray(vals[0])), (lambda g, out, vals: [g])
    axes = _norm_axes(axis, nd)
    dest = list(range(nd - len(axes), nd))

    def fwd(vals):
        return np.prod(vals[0], axis=axis, keepdims=keepdims)

    def bwd(g, out, vals):
        moved = np.moveaxis(vals[0], axes, dest)
        lead = moved.shape[: nd - len(axes)]
        flat = moved.reshape(lead + (-1,))
        ones = np.ones(lead + (1,))
        left = np.cumprod(np.concatenate([ones, flat[..., :-1]], axis=-1), axis=-1)
        right = np.cumprod(np.concatenate([ones, flat[..., :0:-1]], axis=-1), axis=-1)[..., ::-1]
        excl = np.moveaxis((left * right).reshape(moved.shape), dest, axes)
        return [excl * _expand_reduced(g, in_shape, axis, keepdims)]

    return fwd, bwd


def _cholesky(x: np.ndarray) -> np.ndarray | None:
    """The Cholesky factor of the symmetric part of ``x``, None when it is not positive
    definite (outside ``log_det``'s domain, where a positive determinant of an even number
    of negative eigenvalues would read as a finite value)."""
    try:
        return np.linalg.cholesky((x + x.T) / 2.0)
    except np.linalg.LinAlgError:
        return None


@_rule("log_det")
def _rule_log_det(b, expr, args):
    def fwd(vals):
        chol = _cholesky(vals[0])
        return np.asarray(-np.inf if chol is None else 2.0 * np.log(np.diag(chol)).sum())

    def bwd(g, out, vals):
        chol = _cholesky(vals[0])
        if chol is None:
            raise ValueError(
                "log_det(X) has no gradient at this point: X is not positive definite "
                "(outside the term's domain); start inside it (w0=) or let the exact steps "
                "start the solve (inner_solver='exact-admm')"
            )
        inv_chol = np.linalg.inv(chol)
        return [float(g) * (inv_chol.T @ inv_chol)]

    return fwd, bwd
