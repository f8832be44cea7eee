"""Private data handles: cvxpy constants tagged with the party that owns them."""

from __future__ import annotations

import hashlib
import warnings
from typing import Any

import cvxpy as cp
import numpy as np
import scipy.sparse as sp
from cvxpy.constraints.nonpos import Inequality

from fedmodel.errors import DataError, ModelError


class PrivateData(cp.Constant):
    """A party's private data, usable anywhere a cvxpy constant is.

    Created by :meth:`fedmodel.Client.data` or :meth:`fedmodel.Server.data`; not meant to
    be instantiated directly. The compiler uses :attr:`owner` to check that no party's
    expression touches another party's data.

    Examples
    --------
    >>> import numpy as np, cvxpy as cp, fedmodel as fm
    >>> model = fm.Model("demo")
    >>> w = model.variable(3, name="w")
    >>> A = model.client("site0").data(np.eye(3), name="A")
    >>> (A @ w).shape
    (3,)
    """

    def __init__(self, value: Any, owner: str, name: str):
        self.owner = owner
        self.data_name = name
        super().__init__(value, name=f"{owner}.{name}")

    # Shape errors raised by cvxpy name neither the party nor the data; re-raise them so
    # that they do.
    #
    # Reflected operators (``2 * X``, ``1 + X``...) are computed as the forward operator of
    # the other operand called on ``cp.Expression`` directly: cvxpy's own ``__rmul__`` is
    # ``other * self``, and because PrivateData subclasses Constant, Python would hand
    # ``Constant(2) * X`` straight back to ``X.__rmul__`` (a reflected method of a subclass
    # takes precedence), recursing until RecursionError.
    def _shape_checked(self, op: str, other: Any, forward: bool):
        if forward:
            method = getattr(super(), op)
        else:
            forward_op = getattr(cp.Expression, op.replace("__r", "__", 1))

            def method(value):
                return forward_op(cp.Expression.cast_to_const(value), self)

        try:
            return method(other)
        except ValueError as exc:
            other_shape = getattr(other, "shape", np.shape(other))
            left, right = (self.shape, other_shape) if forward else (other_shape, self.shape)
            raise DataError(
                f"shape mismatch using data '{self.data_name}' ({left} vs {right}): {exc}",
                party=self.owner,
            ) from exc

    def __matmul__(self, other):
        return self._shape_checked("__matmul__", other, True)

    def __rmatmul__(self, other):
        return self._shape_checked("__rmatmul__", other, False)

    def __mul__(self, other):
        return self._shape_checked("__mul__", other, True)

    def __rmul__(self, other):
        return self._shape_checked("__rmul__", other, False)

    def __add__(self, other):
        return self._shape_checked("__add__", other, True)

    def __radd__(self, other):
        return self._shape_checked("__radd__", other, False)

    def __sub__(self, other):
        return self._shape_checked("__sub__", other, True)

    def __rsub__(self, other):
        return self._shape_checked("__rsub__", other, False)

    def __truediv__(self, other):
        return self._shape_checked("__truediv__", other, True)

    def __rtruediv__(self, other):
        return self._shape_checked("__rtruediv__", other, False)

    def __repr__(self) -> str:
        return f"PrivateData(owner={self.owner!r}, name={self.data_name!r}, shape={self.shape})"

    __hash__ = cp.Constant.__hash__


def as_numeric_array(array: Any, owner: str, name: str) -> np.ndarray | sp.spmatrix:
    """Validate and convert user data (numpy, scipy.sparse, pandas) to a float array.

    Raises :class:`~fedmodel.errors.DataError` naming the party and the data on
    non-numeric columns, NaN or inf values and empty arrays.
    """
    if isinstance(array, PrivateData):
        raise DataError(
            f"data '{name}' is already a data handle of party '{array.owner}'", party=owner
        )
    if hasattr(array, "to_numpy") and hasattr(array, "dtypes"):  # pandas DataFrame / Series
        dtypes = array.dtypes
        pairs = list(dtypes.items()) if hasattr(dtypes, "items") else [(name, dtypes)]
        complex_columns = [str(c) for c, t in pairs if _is_complex_dtype(t)]
        if complex_columns:
            raise DataError(
                f"data '{name}' has complex columns {complex_columns}; fedmodel's terms take "
                "real numbers (split them into real and imaginary parts)",
                party=owner,
            )
        if hasattr(dtypes, "items"):
            bad = [str(c) for c, t in dtypes.items() if not _is_numeric_dtype(t)]
            if bad:
                raise DataError(
                    f"data '{name}' has non-numeric columns {bad}; encode them first "
                    "(e.g. one-hot) before handing the frame to fedmodel",
                    party=owner,
                )
        array = array.to_numpy(dtype=float)
    kind = getattr(getattr(array, "dtype", None), "kind", None)
    if kind is None and not sp.issparse(array):
        kind = np.asarray(array).dtype.kind
    if kind == "c" or (kind == "O" and any(isinstance(x, complex) for x in _flat(array))):
        raise DataError(
            f"data '{name}' is complex; fedmodel's terms take real numbers (split it into "
            "its real and imaginary parts, np.real(X) and np.imag(X), as two data arrays)",
            party=owner,
        )
    if kind in ("U", "S", "V", "M", "m"):
        raise DataError(
            f"data '{name}' holds {np.dtype(kind).name if kind != 'V' else 'records'}, not "
            "real numbers; encode it as numbers first",
            party=owner,
        )
    if sp.issparse(array):
        out = sp.csc_matrix(array, dtype=float)
        values = out.data
    else:
        try:
            with warnings.catch_warnings():  # (a complex entry: refused, never truncated)
                warnings.simplefilter("error", np.exceptions.ComplexWarning)
                out = np.asarray(array, dtype=float)
        except (TypeError, ValueError, np.exceptions.ComplexWarning) as exc:
            raise DataError(f"data '{name}' is not real numbers: {exc}", party=owner) from exc
        values = out
    if out.ndim > 2:
        raise DataError(
            f"data '{name}' has {out.ndim} dimensions; at most 2 are supported", party=owner
        )
    if np.prod(out.shape) == 0:
        raise DataError(f"data '{name}' is empty (shape {out.shape})", party=owner)
    finite = np.isfinite(values)
    if not finite.all():
        bad = np.argwhere(~np.isfinite(out.toarray() if sp.issparse(out) else out))
        kind = "NaN" if np.isnan(values).any() else "inf"
        raise DataError(
            f"data '{name}' contains {kind} values ({int((~finite).sum())} entries, first at "
            f"index {tuple(int(i) for i in bad[0])}); clean or impute them first",
            party=owner,
        )
    return out


def _flat(array: Any):
    """The entries of an object array (nested lists too), for the complex check."""
    return np.asarray(array, dtype=object).ravel()


def without_infinite_bounds(c: Any, party: str, label: str) -> Any:
    """An inequality ``lhs <= rhs`` without its entries whose constant bound is ``+inf`` on
    the right or ``-inf`` on the left (as plain cvxpy: "no bound"): the constraint itself
    when it has none, the finite entries only when some are infinite, None when every
    entry is unbounded. A bound of ``-inf`` on the right (``+inf`` on the left) can hold
    for no point: refused naming the party and the constraint. Anything else is returned
    unchanged.

    Examples
    --------
    >>> import numpy as np, cvxpy as cp
    >>> w = cp.Variable(3)
    >>> without_infinite_bounds(w <= np.inf, "a", "c") is None
    True
    >>> without_infinite_bounds(w <= np.array([1.0, np.inf, 2.0]), "a", "c").shape
    (2,)
    """
    if not isinstance(c, Inequality):
        return c
    lhs, rhs = c.args
    sides = []
    for side, unbounded, sign in ((rhs, np.inf, "+"), (lhs, -np.inf, "-")):
        constant = not side.variables() and not side.parameters()
        value = np.asarray(side.value, dtype=float) if constant and side.value is not None else None
        if value is not None and np.isinf(value).any():
            bad = np.isinf(value) & (value != unbounded)
            if bad.any():
                where = "right" if sign == "+" else "left"
                raise ModelError(
                    f"constraint '{label}' has a bound of {-unbounded} on its {where} side: "
                    "no point satisfies it (a bound of " + f"{sign}inf there means no bound)",
                    party,
                    str(c),
                )
            sides.append(np.broadcast_to(np.isinf(value), c.shape))
    if not sides:
        return c
    free = np.logical_or.reduce(sides) if len(sides) > 1 else sides[0]
    if free.all():
        return None
    keep = np.flatnonzero(~free.ravel(order="F"))

    def part(side):
        full = side if side.shape == c.shape else side + np.zeros(c.shape)
        if not side.variables() and not side.parameters():  # a constant bound
            return np.ravel(np.broadcast_to(np.asarray(side.value, float), c.shape), "F")[keep]
        return cp.vec(full, order="F")[keep]

    return part(lhs) <= part(rhs)


def _is_complex_dtype(dtype: Any) -> bool:
    try:
        return bool(np.issubdtype(dtype, np.complexfloating))
    except TypeError:
        return False


def _is_numeric_dtype(dtype: Any) -> bool:
    try:
        return bool(np.issubdtype(dtype, np.number) or np.issubdtype(dtype, np.bool_))
    except TypeError:  # pandas extension dtypes (string, category, ...)
        return False


def fingerprint(value: Any) -> tuple | None:
    """Content fingerprint of an array, used to recognise another party's data written
    into an expression as a plain constant. Returns None for arrays too trivial to own
    (fewer than two entries, or all entries equal)."""
    if sp.issparse(value):
        m = sp.csc_matrix(value)
        if m.nnz < 2:
            return None
        h = hashlib.blake2b(digest_size=16)
        for part in (m.data, m.indices, m.indptr):
            h.update(np.ascontiguousarray(part).tobytes())
        return ("sparse", m.shape, h.hexdigest())
    arr = np.asarray(value, dtype=float)
    if arr.size < 2 or np.all(arr == arr.flat[0]):
        return None
    h = hashlib.blake2b(np.ascontiguousarray(arr), digest_size=16)  # (its buffer, no copy)
    return ("dense", arr.shape, h.hexdigest())


def check_finite_constants(expr: Any, party: str, label: str, require_values: bool = False) -> None:
    """Refuse a term, constraint or regulariser whose constants are not all finite.

    NaN or inf in a coefficient, a bound or any other constant of ``expr`` (a cvxpy
    expression or constraint) would otherwise reach the solvers and come back as a NaN
    objective certified "optimal". Private data is checked when it is registered
    (:meth:`fedmodel.Client.data`); this checks the constants written in the expression
    itself, and the values of its parameters. With ``require_values`` (at compile time,
    i.e. before every solve) a :class:`cvxpy.Parameter` without a value is refused too.

    Raises
    ------
    DataError
        Naming the party, the term and what is not finite.

    Examples
    --------
    >>> import numpy as np, cvxpy as cp
    >>> w = cp.Variable(2)
    >>> check_finite_constants(2.0 * cp.sum_squares(w), "server", "objective[0]")
    >>> try:
    ...     check_finite_constants(np.nan * cp.sum_squares(w), "server", "objective[0]")
    ... except DataError as exc:
    ...     print(exc.party)
    server
    """
    if isinstance(expr, (list, tuple)):  # e.g. regularize([lo <= w, w <= hi])
        for item in expr:
            check_finite_constants(item, party, label, require_values)
        return
    if not hasattr(expr, "constants"):  # not a cvxpy object: refused elsewhere
        return
    leaves = [(c, "constant") for c in expr.constants() if not isinstance(c, PrivateData)]
    leaves += [(p, f"parameter '{p.name()}'") for p in expr.parameters()]
    for leaf, what in leaves:
        value = leaf.value
        if value is None:
            if require_values and isinstance(leaf, cp.Parameter):
                raise DataError(
                    f"'{label}' has {what} without a value; set it (param.value = ...) "
                    "before the solve",
                    party=party,
                    term=str(expr),
                )
            continue
        if np.iscomplexobj(value):
            raise DataError(
                f"'{label}' has a complex {what}; fedmodel's terms take real numbers",
                party=party,
                term=str(expr),
            )
        values = value.data if sp.issparse(value) else np.asarray(value, dtype=float)
        if np.all(np.isfinite(values)):
            continue
        kind = "a NaN" if np.isnan(values).any() else "an inf"
        raise DataError(
            f"'{label}' has {kind} {what}; every coefficient, bound and constant of a term "
            "must be finite",
            party=party,
            term=str(expr),
        )
