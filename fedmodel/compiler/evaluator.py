"""The smooth evaluator: a cvxpy expression compiled once into a numpy tape.

See :mod:`fedmodel.compiler.smooth` for the overview; the per-atom rules are in
:mod:`fedmodel.compiler.atom_rules`, the smoothness checks in
:mod:`fedmodel.compiler.smoothness`.
"""

from __future__ import annotations

from typing import Any

import cvxpy as cp
import numpy as np
import scipy.sparse as sp
from cvxpy.atoms.affine.wraps import Wrap
from cvxpy.atoms.atom import Atom
from cvxpy.expressions.constants.constant import Constant
from cvxpy.expressions.constants.parameter import Parameter
from cvxpy.expressions.leaf import Leaf
from cvxpy.expressions.variable import Variable
from numpy.typing import ArrayLike

from fedmodel.compiler.atom_rules import (
    _CONST,
    _DIFF,
    _PARAM,
    _SPARSE_OK,
    Bwd,
    Fwd,
    NotSmoothError,
    _Arg,
    _classify,
    _dense,
)
from fedmodel.compiler.layout import VariableLayout, _var_name
from fedmodel.compiler.smoothness import check_smooth
from fedmodel.errors import ModelError

# Set to True (e.g. in tests) to assert that every reverse-mode rule returns gradients of
# exactly the shape of its inputs.
_DEBUG_SHAPES = False


class _Builder:
    def __init__(self, layout: VariableLayout):
        self.layout = layout
        self.kinds: list[int] = []
        self.shapes: list[tuple[int, ...]] = []
        self.consts: list[Any] = []
        self.fwd_tape: list[tuple[int, Fwd, tuple[int, ...]]] = []
        self.bwd_tape: list[tuple[int, Bwd, tuple[int, ...]]] = []
        self.var_leaves: list[tuple[int, slice, tuple[int, ...]]] = []
        self.memo: dict[Any, int] = {}
        self.keep: list[Any] = []  # keep expressions alive so that id() stays unique
        self.atoms: set[str] = set()
        self.dense_twin: dict[int, int] = {}

    def _new(self, kind: int, shape: tuple[int, ...], const: Any = None) -> int:
        self.kinds.append(kind)
        self.shapes.append(tuple(shape))
        self.consts.append(const)
        return len(self.kinds) - 1

    def arg(self, idx: int) -> _Arg:
        return _Arg(idx, self.kinds[idx], self.shapes[idx], self.consts[idx])

    def dense_arg(self, a: _Arg) -> _Arg:
        if a.kind != _CONST or not sp.issparse(a.value):
            return a
        if a.idx not in self.dense_twin:
            self.dense_twin[a.idx] = self._new(_CONST, a.shape, _dense(a.value))
        return self.arg(self.dense_twin[a.idx])

    def build(self, expr: Any) -> int:
        key = ("var", expr.id) if isinstance(expr, Variable) else id(expr)
        if key in self.memo:
            return self.memo[key]
        self.keep.append(expr)
        idx = self._build(expr)
        self.memo[key] = idx
        return idx

    def _build(self, expr: Any) -> int:
        shape = tuple(expr.shape)
        if isinstance(expr, Variable):
            if expr not in self.layout:
                raise ModelError(
                    f"the expression uses variable {_var_name(expr)}, which is not in the "
                    f"layout {self.layout!r}"
                )
            idx = self._new(_DIFF, shape)
            self.var_leaves.append((idx, self.layout.slice_of(expr), shape))
            return idx
        if isinstance(expr, Parameter):
            idx = self._new(_PARAM, shape)
            self.fwd_tape.append((idx, _param_reader(expr, shape), ()))
            return idx
        if isinstance(expr, Constant):
            return self._new(_CONST, shape, _const_value(expr))
        if isinstance(expr, Leaf) or not isinstance(expr, Atom):
            name = type(expr).__name__
            raise NotSmoothError(name, str(expr), f"unsupported leaf type {name}")
        name, rule, reason = _classify(expr)
        if rule is None:
            raise NotSmoothError(name, str(expr), reason or "unsupported")
        self.atoms.add(name)
        in_idx = [self.build(a) for a in expr.args]
        args = [self.arg(i) for i in in_idx]
        kind = max((a.kind for a in args), default=_CONST)
        if kind == _CONST:
            folded = _fold_sparse(expr, args)
            if folded is not None:
                return self._new(_CONST, shape, folded)
        if name not in _SPARSE_OK:
            args = [self.dense_arg(a) for a in args]
        fwd, bwd = rule(self, expr, args)
        ins = tuple(a.idx for a in args)
        if kind == _CONST:
            value = fwd([a.value for a in args])
            if not sp.issparse(value):
                value = np.asarray(value, dtype=float)
                if value.shape != shape:
                    value = np.broadcast_to(value, shape)
            return self._new(_CONST, shape, value)
        idx = self._new(kind, shape)
        self.fwd_tape.append((idx, fwd, ins))
        if kind == _DIFF and bwd is not None:
            self.bwd_tape.append((idx, bwd, ins))
        return idx


def _param_reader(param: Parameter, shape: tuple[int, ...]) -> Fwd:
    def fwd(_vals: list) -> np.ndarray:
        v = param.value
        if v is None:
            raise ValueError(f"parameter '{param.name()}' has no value")
        return np.reshape(_dense(v), shape)

    return fwd


def _const_value(c: Constant) -> Any:
    v = c.value
    if sp.issparse(v):
        if np.iscomplexobj(v.data):
            raise NotSmoothError(type(c).__name__, str(c), "complex constants are not supported")
        return sp.csr_array(v, dtype=float)
    arr = np.asarray(v)
    if np.iscomplexobj(arr):
        raise NotSmoothError(type(c).__name__, str(c), "complex constants are not supported")
    return np.asarray(arr, dtype=float).reshape(tuple(c.shape))


def _uniform_scalar(value: Any) -> float | None:
    """The scalar ``c`` if ``value`` is a dense array with all entries equal to ``c``.

    Only cheap cases are recognised: size-1 arrays and broadcast views (all strides 0),
    which is what a folded ``Promote`` of a scalar constant is.
    """
    if sp.issparse(value):
        return None
    arr = np.asarray(value)
    if arr.size == 1 or (arr.size > 0 and all(st == 0 for st in arr.strides)):
        return float(arr.flat[0])
    return None


def _fold_sparse(expr: Any, args: list[_Arg]) -> Any:
    """Constant-fold a few operations on sparse constants without densifying them."""
    name = type(expr).__name__
    sparse = [sp.issparse(a.value) for a in args]
    if not any(sparse):
        return None
    shape = tuple(expr.shape)
    v = args[0].value
    if name == "transpose" and sparse[0] and len(args[0].shape) == 2:
        axes = expr.axes
        if axes is None or tuple(axes) == (1, 0):
            return sp.csr_array(v.T)
    elif name == "NegExpression" and sparse[0]:
        return -v
    elif (name in ("conj", "real") or isinstance(expr, Wrap)) and sparse[0]:
        return v
    elif name in ("MulExpression", "multiply", "DivExpression") and len(args) == 2:
        a, b = args
        if sparse[0] and not sparse[1]:
            c = _uniform_scalar(b.value)
            if c is not None:
                out = sp.csr_array(v / c if name == "DivExpression" else v * c)
                return out if out.shape == shape else None
        elif sparse[1] and not sparse[0] and name != "DivExpression":
            c = _uniform_scalar(a.value)
            if c is not None:
                out = sp.csr_array(b.value * c)
                return out if out.shape == shape else None
    return None


# ----------------------------------------------------------------------------------------
# Public API
# ----------------------------------------------------------------------------------------
class SmoothFunction:
    """A compiled smooth expression: value, gradient, VJP and Jacobian in ``x``.

    Created by :func:`compile_smooth`; ``x`` is the flat vector of a
    :class:`VariableLayout`.  Intermediates of the forward pass are kept only for the
    duration of one call, so an instance can be shared between callers (not threads).

    Attributes
    ----------
    shape : tuple of int
        Shape of the expression.
    size : int
        Number of output entries (1 for scalars).
    layout : VariableLayout
        The layout that defines ``x``.

    Examples
    --------
    >>> import cvxpy as cp, numpy as np
    >>> x = cp.Variable(2)
    >>> f = compile_smooth(cp.exp(x), VariableLayout([x]))
    >>> value, grad = f.vjp(np.zeros(2), np.array([1.0, 2.0]))
    >>> value.tolist(), grad.tolist()
    ([1.0, 1.0], [1.0, 2.0])
    """

    def __init__(self, expr: cp.Expression, layout: VariableLayout, builder: _Builder, out: int):
        self.expression = expr
        self.layout = layout
        self.shape: tuple[int, ...] = tuple(expr.shape)
        self.size: int = int(np.prod(self.shape, dtype=int))
        self._out = out
        self._base = list(builder.consts)
        self._fwd = list(builder.fwd_tape)
        self._bwd = list(reversed(builder.bwd_tape))
        self._leaves = list(builder.var_leaves)
        self._shapes = list(builder.shapes)
        self._atoms = frozenset(builder.atoms)

    def __repr__(self) -> str:
        return f"SmoothFunction(shape={self.shape}, n={self.layout.size}, nodes={len(self._base)})"

    # -- core passes ----------------------------------------------------------------------
    def _forward(self, x: np.ndarray) -> list:
        vals = self._base.copy()
        for idx, sl, shape in self._leaves:
            vals[idx] = np.reshape(x[sl], shape, order="F")
        for idx, fwd, ins in self._fwd:
            vals[idx] = fwd([vals[i] for i in ins])
        return vals

    def _backward(self, vals: list, adjoint: np.ndarray) -> np.ndarray:
        grads: list[Any] = [None] * len(vals)
        grads[self._out] = np.reshape(adjoint, self.shape, order="F")
        for idx, bwd, ins in self._bwd:
            g = grads[idx]
            if g is None:
                continue
            res = bwd(g, vals[idx], [vals[i] for i in ins])
            for i, r in zip(ins, res, strict=True):
                if r is None:
                    continue
                if _DEBUG_SHAPES:
                    assert np.shape(r) == self._shapes[i], (idx, i, np.shape(r), self._shapes[i])
                grads[i] = r if grads[i] is None else grads[i] + r
        gx = np.zeros(self.layout.size)
        for idx, sl, _shape in self._leaves:
            g = grads[idx]
            if g is not None:
                gx[sl] += np.reshape(g, -1, order="F")
        return gx

    def _x(self, x: ArrayLike) -> np.ndarray:
        x = np.asarray(x, dtype=float)
        if x.shape != (self.layout.size,):
            x = x.reshape(-1)
            if x.shape[0] != self.layout.size:
                raise ValueError(f"x has length {x.shape[0]}, expected {self.layout.size}")
        return x

    def _out_flat(self, vals: list) -> np.ndarray:
        v = vals[self._out]
        if sp.issparse(v):
            v = v.toarray()
        return np.array(np.reshape(np.broadcast_to(v, self.shape), -1, order="F"), dtype=float)

    # -- public ---------------------------------------------------------------------------
    def value(self, x: ArrayLike) -> np.ndarray:
        """Evaluate the expression.

        Parameters
        ----------
        x : array_like
            Stacked variable vector of length ``layout.size``.

        Returns
        -------
        numpy.ndarray
            Flat array of length :attr:`size`, entries in ``'F'`` order.
        """
        return self._out_flat(self._forward(self._x(x)))

    def value_and_grad(self, x: ArrayLike) -> tuple[float, np.ndarray]:
        """Value and gradient of a scalar expression.

        Returns
        -------
        (float, numpy.ndarray)
            The value and the gradient with respect to ``x`` (length ``layout.size``).

        Raises
        ------
        ValueError
            If the expression is not scalar.
        """
        if self.size != 1:
            raise ValueError(
                f"value_and_grad needs a scalar expression, this one has shape {self.shape}; "
                "use vjp() or jacobian()"
            )
        vals = self._forward(self._x(x))
        return float(self._out_flat(vals)[0]), self._backward(vals, np.ones(1))

    def vjp(self, x: ArrayLike, adjoint: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
        """Value and vector-Jacobian product ``J(x)^T @ adjoint``.

        Parameters
        ----------
        x : array_like
            Stacked variable vector.
        adjoint : array_like
            Length-:attr:`size` vector (or an array of the expression's shape), indexed
            like :meth:`value` (``'F'`` order).

        Returns
        -------
        (numpy.ndarray, numpy.ndarray)
            The flat value and the gradient of ``adjoint @ value(x)`` (length
            ``layout.size``).
        """
        adj = np.asarray(adjoint, dtype=float)
        if adj.size != self.size:
            raise ValueError(f"adjoint has {adj.size} entries, the expression has {self.size}")
        if adj.shape != self.shape:
            adj = np.reshape(adj.reshape(-1), self.shape, order="F")
        vals = self._forward(self._x(x))
        return self._out_flat(vals), self._backward(vals, adj)

    def jacobian(self, x: ArrayLike) -> np.ndarray:
        """Dense Jacobian of shape ``(size, layout.size)`` (rows in ``'F'`` order)."""
        vals = self._forward(self._x(x))
        jac = np.zeros((self.size, self.layout.size))
        e = np.zeros(self.size)
        for i in range(self.size):
            e[i] = 1.0
            jac[i] = self._backward(vals, np.reshape(e, self.shape, order="F"))
            e[i] = 0.0
        return jac

    def atoms(self) -> set[str]:
        """Names (cvxpy class names) of the atoms used by the expression."""
        return set(self._atoms)


def compile_smooth(expr: cp.Expression, layout: VariableLayout) -> SmoothFunction:
    """Compile a smooth cvxpy expression into a :class:`SmoothFunction`.

    Parameters
    ----------
    expr : cvxpy.Expression
        Any expression made of smooth atoms (see :func:`smooth_atoms`), whatever its
        curvature.  Constants (including subclasses of ``cp.Constant``) are converted
        once; Parameters are read at every evaluation.
    layout : VariableLayout
        Defines the flat vector ``x``; must contain every variable of ``expr``.

    Returns
    -------
    SmoothFunction

    Raises
    ------
    NotSmoothError
        If ``expr`` contains a non-differentiable or unsupported atom.
    ValueError
        If ``expr`` uses a variable that is not in ``layout``.

    Examples
    --------
    >>> import cvxpy as cp, numpy as np
    >>> w = cp.Variable(2)
    >>> f = compile_smooth(cp.sum_squares(w - 1) - cp.sum(cp.log(w)), VariableLayout([w]))
    >>> f.value_and_grad(np.ones(2))[1].tolist()
    [-1.0, -1.0]
    """
    expr = cp.Expression.cast_to_const(expr) if not isinstance(expr, cp.Expression) else expr
    if not isinstance(layout, VariableLayout):
        raise TypeError(f"layout must be a VariableLayout, got {type(layout).__name__}")
    check_smooth(expr)
    builder = _Builder(layout)
    out = builder.build(expr)
    return SmoothFunction(expr, layout, builder, out)
