"""Recognise generalised-linear structure in cvxpy expressions, for exact Newton solves.

Many federated losses and constraints are sums of scalar functions of affine maps plus a
quadratic:

    s(x) = sum_k  w_k * phi_k(a_k^T x + b_k)  +  x^T Q x / 2  +  q^T x  +  r

with phi in {logistic, exp, square, huber}. For those, value, gradient and Hessian
(``A^T diag(w phi''(Ax + b)) A + Q``) are a few matrix products, which makes Newton's method
cheap and exact. :func:`recognise_scalar` returns such a :class:`GLMFunction` for a scalar
cvxpy expression, or None when the expression has another shape (callers then fall back
to quasi-Newton). :func:`affine_map` extracts ``(A, b)`` of an affine expression.
"""

from __future__ import annotations

import functools
import math
import weakref
from dataclasses import dataclass, field

import cvxpy as cp
import numpy as np
import scipy.sparse as sp
from scipy.linalg import blas

from fedmodel.compiler.atom_rules import is_symmetric
from fedmodel.compiler.smooth import VariableLayout
from fedmodel.expressions import AtomTable


class NotRecognised(Exception):
    """The expression is not of the supported shape (internal; callers fall back)."""


# -- affine maps ---------------------------------------------------------------------------
@dataclass
class Affine:
    """``vec(expr) = A x + b`` (column-major vec), ``A`` dense or sparse (m x N)."""

    A: np.ndarray | sp.spmatrix
    b: np.ndarray
    shape: tuple[int, ...]
    #: whether ``A`` is the N x N identity, when known (:func:`_is_identity`)
    identity: bool | None = None

    @property
    def m(self) -> int:
        return self.b.size


def _dense_or_sparse(M):
    """Keep sparse matrices sparse unless dense-ish; never let np.matrix through."""
    if sp.issparse(M):
        if M.nnz > 0.25 * M.shape[0] * M.shape[1]:
            return M.toarray()
        return sp.csr_matrix(M)
    return np.asarray(M)


def _is_identity(p: Affine) -> bool:
    """True when ``p.A`` is the N x N identity (a variable that is the whole of x)."""
    if p.identity is not None:
        return p.identity
    A = p.A
    if not sp.issparse(A) or A.shape[0] != A.shape[1] or A.nnz != A.shape[0]:
        return False
    A = sp.csr_matrix(A)
    return bool(
        np.array_equal(A.indices, np.arange(A.shape[0]))
        and np.array_equal(A.indptr, np.arange(A.shape[0] + 1))
        and np.all(A.data == 1.0)
    )


def _const_value(expr) -> np.ndarray | sp.spmatrix:
    v = expr.value
    return v if sp.issparse(v) else np.asarray(v, dtype=float)


# The affine atoms: atom -> ``(expr, layout, shape) -> Affine`` (None where the atom is not
# recognised in that form, e.g. a sum over an axis).
AFFINE_MAPS = AtomTable("affine map of an affine atom")


@AFFINE_MAPS.register("AddExpression")
def _affine_addexpression(expr, layout: VariableLayout, shape: tuple) -> Affine | None:
    parts = [affine_map(a, layout) for a in expr.args]
    m = max(p.m for p in parts)
    A, b = None, np.zeros(m)
    for p in parts:
        if p.m == m and A is not None and sp.issparse(p.A) and p.A.nnz == 0:
            b = b + p.b  # (a constant: nothing to add to A)
            continue
        if p.m != m:
            if p.m != 1:
                raise NotRecognised("broadcast add")
            pa = sp.csr_matrix(p.A) if sp.issparse(p.A) else p.A
            pa = sp.vstack([pa] * m) if sp.issparse(pa) else np.repeat(pa, m, axis=0)
            pb = np.repeat(p.b, m)
        else:
            pa, pb = p.A, p.b
        A = pa if A is None else A + pa
        b = b + pb
    return Affine(_dense_or_sparse(A), b, shape)


@AFFINE_MAPS.register("NegExpression")
def _affine_negexpression(expr, layout: VariableLayout, shape: tuple) -> Affine | None:
    p = affine_map(expr.args[0], layout)
    return Affine(_dense_or_sparse(-p.A), -p.b, shape)


@AFFINE_MAPS.register("Promote", "broadcast_to")
def _affine_promote(expr, layout: VariableLayout, shape: tuple) -> Affine | None:
    p = affine_map(expr.args[0], layout)
    m = int(np.prod(shape)) if shape else 1
    if p.m != 1:
        raise NotRecognised("promote of non-scalar")
    A = sp.vstack([sp.csr_matrix(p.A)] * m) if sp.issparse(p.A) else np.repeat(p.A, m, axis=0)
    return Affine(A, np.repeat(p.b, m), shape)


@AFFINE_MAPS.register("MulExpression")
def _affine_mulexpression(expr, layout: VariableLayout, shape: tuple) -> Affine | None:
    left, right = expr.args
    if left.is_constant() and not left.parameters() and right.ndim <= 1:
        C = _const_value(left)
        C = C if C.ndim == 2 or sp.issparse(C) else np.atleast_2d(C)
        p = affine_map(right, layout)
        if _is_identity(p) and not sp.issparse(C):
            # data @ w with w the whole stacked vector: the data matrix itself (no copy)
            return Affine(C, np.asarray(C @ p.b).ravel(), shape)
        A = C @ p.A
        b = np.asarray(C @ p.b).ravel()
        return Affine(_dense_or_sparse(A), b, shape)
    if right.is_constant() and not right.parameters() and left.ndim <= 1:
        C = _const_value(right)
        C = C if C.ndim == 2 or sp.issparse(C) else C.reshape(-1, 1)
        p = affine_map(left, layout)
        A = C.T @ p.A
        b = np.asarray(C.T @ p.b).ravel()
        return Affine(_dense_or_sparse(A), b, shape)
    raise NotRecognised("matmul shape")


@AFFINE_MAPS.register("multiply")
def _affine_multiply(expr, layout: VariableLayout, shape: tuple) -> Affine | None:
    left, right = expr.args
    const, other = (left, right) if left.is_constant() else (right, left)
    if not const.is_constant() or const.parameters():
        raise NotRecognised("product of variables")
    c = np.asarray(
        const.value if not sp.issparse(const.value) else const.value.toarray(), dtype=float
    ).ravel(order="F")
    p = affine_map(other, layout)
    m = max(c.size, p.m)
    if p.m != m:
        raise NotRecognised("broadcast multiply")
    if c.size == 1:
        return Affine(_dense_or_sparse(c[0] * p.A), c[0] * p.b, shape)
    if sp.issparse(p.A):
        return Affine(_dense_or_sparse(sp.diags(c) @ p.A), c * p.b, shape)
    return Affine(c[:, None] * p.A, c * p.b, shape)  # (row i scaled by c_i, as diag(c) A)


@AFFINE_MAPS.register("DivExpression")
def _affine_divexpression(expr, layout: VariableLayout, shape: tuple) -> Affine | None:
    num, den = expr.args
    if not den.is_constant() or den.size != 1 or den.parameters():
        raise NotRecognised("division")
    c = 1.0 / float(np.asarray(den.value))
    p = affine_map(num, layout)
    return Affine(_dense_or_sparse(c * p.A), c * p.b, shape)


@AFFINE_MAPS.register("Sum")
def _affine_sum(expr, layout: VariableLayout, shape: tuple) -> Affine | None:
    if getattr(expr, "axis", None) is not None:
        return None
    p = affine_map(expr.args[0], layout)
    A = np.asarray(p.A.sum(axis=0)).reshape(1, -1)
    return Affine(A, np.array([p.b.sum()]), shape)


@AFFINE_MAPS.register("index")
def _affine_index(expr, layout: VariableLayout, shape: tuple) -> Affine | None:
    child = expr.args[0]
    p = affine_map(child, layout)
    rows = np.arange(p.m).reshape(child.shape, order="F") if child.shape else np.arange(1)
    sel = np.asarray(rows[expr.key]).ravel(order="F")
    A = p.A[sel] if not sp.issparse(p.A) else sp.csr_matrix(p.A)[sel]
    return Affine(_dense_or_sparse(A), p.b[sel], shape)


@AFFINE_MAPS.register("reshape")
def _affine_reshape(expr, layout: VariableLayout, shape: tuple) -> Affine | None:
    if getattr(expr, "order", "F") != "F":
        return None
    p = affine_map(expr.args[0], layout)
    return Affine(p.A, p.b, shape)


@AFFINE_MAPS.register("transpose")
def _affine_transpose(expr, layout: VariableLayout, shape: tuple) -> Affine | None:
    if expr.args[0].ndim > 1:
        return None
    p = affine_map(expr.args[0], layout)
    return Affine(p.A, p.b, shape)


@AFFINE_MAPS.register("Hstack")
def _affine_hstack(expr, layout: VariableLayout, shape: tuple) -> Affine | None:
    if not all(a.ndim <= 1 for a in expr.args):
        return None
    parts = [affine_map(a, layout) for a in expr.args]
    A = sp.vstack([sp.csr_matrix(q.A) for q in parts])
    return Affine(_dense_or_sparse(A), np.concatenate([q.b for q in parts]), shape)


#: layout -> {variable id: its affine map}: a variable's map is a function of the layout
#: alone, made once and shared by every expression over that layout (its ``b`` read-only;
#: nothing of a map is changed in place by its users, see :func:`affine_map`)
_VARIABLE_MAPS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _variable_map(var: cp.Variable, layout: VariableLayout) -> Affine:
    maps = _VARIABLE_MAPS.get(layout)
    if maps is None:
        maps = _VARIABLE_MAPS[layout] = {}
    found = maps.get(var.id)
    if found is not None:
        return found
    s = layout.slice_of(var)
    m = s.stop - s.start
    # (CSR arrays written directly: row i holds a 1 in column s.start + i)
    cols = np.arange(s.start, s.stop, dtype=np.int32)
    A = sp.csr_matrix((np.ones(m), cols, np.arange(m + 1, dtype=np.int32)), shape=(m, layout.size))
    b = np.zeros(m)
    b.flags.writeable = False
    found = maps[var.id] = Affine(A, b, tuple(var.shape))
    found.identity = _is_identity(found)
    return found


@functools.lru_cache(maxsize=256)
def _zero_map(m: int, n: int) -> sp.csr_matrix:
    """The ``m x n`` zero matrix (the ``A`` of a constant's map), made once per shape and
    shared like a variable's map (see :func:`affine_map`)."""
    return sp.csr_matrix((m, n))


def affine_map(expr: cp.Expression, layout: VariableLayout) -> Affine:
    """``(A, b)`` with ``vec(expr) = A x + b``; raises :class:`NotRecognised`.

    The maps returned are never changed in place (a variable's map is shared by every
    expression over ``layout``, a constant's zero ``A`` by every constant of its shape):
    their users build new arrays from them."""
    N = layout.size
    name = type(expr).__name__
    shape = tuple(expr.shape)
    if isinstance(expr, cp.Variable):
        return _variable_map(expr, layout)
    if expr.is_constant():
        if expr.parameters():
            raise NotRecognised("parameters")
        v = _const_value(expr)
        v = v.toarray() if sp.issparse(v) else v
        b = np.asarray(v, dtype=float).ravel(order="F")
        return Affine(_zero_map(b.size, N), b, shape)
    if not expr.is_affine():
        raise NotRecognised(f"{name} is not affine")
    rule = AFFINE_MAPS.rule_for(expr)
    mapped = rule(expr, layout, shape) if rule is not None else None
    if mapped is not None:
        return mapped
    raise NotRecognised(f"affine atom {name}")


# -- scalar functions ----------------------------------------------------------------------
_PHI = ("logistic", "exp", "square", "huber")


def _logistic(z: np.ndarray, order: int):
    """``log(1 + e^z)``, its first and (``order`` 2) second derivative from one
    exponential ``e = exp(-|z|)`` (never overflows): ``max(z, 0) + log1p(e)``, the sigmoid
    ``1 / (1 + e)`` or ``e / (1 + e)`` by the sign of ``z``, and ``e / (1 + e)^2``."""
    e = np.exp(-np.abs(z))
    r = 1.0 / (1.0 + e)
    er = e * r
    val = np.maximum(z, 0.0) + np.log1p(e)
    d1 = np.where(z >= 0, r, er)
    return (val, d1) if order == 1 else (val, d1, er * r)


def phi(kind: str, z: np.ndarray, M: float = 1.0, order: int = 2):
    """Values and derivatives up to ``order`` (1 or 2) of the scalar function ``kind`` at
    ``z``, from one evaluation (the logistic function's from one exponential): the tuple
    ``(value, d1)`` or ``(value, d1, d2)`` (``d2`` generalised for huber)."""
    if kind == "logistic":
        return _logistic(z, order)
    if kind == "exp":
        e = np.exp(z)
        return (e, e) if order == 1 else (e, e, e)
    if kind == "square":
        return (z * z, 2.0 * z) if order == 1 else (z * z, 2.0 * z, np.full_like(z, 2.0))
    if kind == "huber":
        a = np.abs(z)
        inside = a <= M
        val = np.where(inside, z * z, 2 * M * a - M * M)
        d1 = np.where(inside, 2 * z, 2 * M * np.sign(z))
        return (val, d1) if order == 1 else (val, d1, np.where(inside, 2.0, 0.0))
    raise ValueError(kind)


def phi_value_d1(kind: str, z: np.ndarray, M: float = 1.0):
    """Values and first derivatives of the scalar function ``kind`` at ``z`` (:func:`phi`)."""
    return phi(kind, z, M, order=1)


def phi_d2(kind: str, z: np.ndarray, M: float = 1.0) -> np.ndarray:
    """Second derivatives of the scalar function ``kind`` at ``z`` (:func:`phi`; generalised
    for huber)."""
    if kind == "logistic":
        e = np.exp(-np.abs(z))
        r = 1.0 / (1.0 + e)
        return e * r * r
    if kind == "exp":
        return np.exp(z)
    if kind == "square":
        return np.full_like(z, 2.0)
    return phi(kind, z, M)[2]


def _syrk_upper(A: np.ndarray, d: np.ndarray) -> np.ndarray:
    """Upper triangle of ``A^T diag(d) A`` for ``d >= 0`` (BLAS syrk on ``sqrt(d) A``)."""
    B = A * np.sqrt(d)[:, None]
    return blas.dsyrk(1.0, B.T, trans=0, lower=0)  # B.T is Fortran-ordered: no copy


@dataclass
class GLMTerm:
    """``sum_k weights_k * phi(s A x + b)_k`` (``s`` = -1 keeps ``-(X @ w)`` without a
    negated copy of the data matrix ``X``)."""

    kind: str
    A: np.ndarray | sp.spmatrix
    b: np.ndarray
    weights: np.ndarray
    M: float = 1.0
    s: float = 1.0

    def __post_init__(self) -> None:
        if not sp.issparse(self.A):  # row-major rows make A^T diag(.) A several times faster
            self.A = np.ascontiguousarray(self.A, dtype=float)

    def scaled(self, c: float) -> GLMTerm:
        return GLMTerm(self.kind, self.A, self.b, c * self.weights, self.M, self.s)

    def image(self, x: np.ndarray) -> np.ndarray:
        """``s A x + b``."""
        Ax = self.A @ x
        return (Ax if self.s == 1.0 else self.s * Ax) + self.b

    def rmatvec(self, v: np.ndarray) -> np.ndarray:
        """``s A^T v``."""
        out = self.A.T @ v
        return out if self.s == 1.0 else self.s * out

    def gram(self, d: np.ndarray) -> np.ndarray:
        """``s^2 A^T diag(d) A`` (dense)."""
        if sp.issparse(self.A):
            G = (self.A.T @ sp.diags(d) @ self.A).toarray()
        else:
            G = self.A.T @ (self.A * d[:, None])
        return G if self.s == 1.0 else (self.s * self.s) * G

    def gram_upper(self, d: np.ndarray) -> np.ndarray:
        """Like :meth:`gram`, but only the upper triangle is guaranteed (BLAS syrk on
        ``sqrt(d) A`` when ``d >= 0``: half the flops of the full product); for Cholesky."""
        if sp.issparse(self.A) or d.size == 0:
            return self.gram(d)
        if d.min() < 0:  # (a difference of convex terms): A+^T D+ A+ - A-^T D- A-
            neg = d < 0
            G = _syrk_upper(self.A[~neg], d[~neg]) - _syrk_upper(self.A[neg], -d[neg])
        else:
            G = _syrk_upper(self.A, d)
        return G if self.s == 1.0 else (self.s * self.s) * G

    def dense_A(self) -> np.ndarray:
        """``s A`` as a dense array (a copy unless s = 1 and A is dense)."""
        A = self.A.toarray() if sp.issparse(self.A) else self.A
        return A if self.s == 1.0 else self.s * A


@dataclass
class GLMFunction:
    """A scalar function of GLM form (see module docstring)."""

    n: int
    terms: list[GLMTerm] = field(default_factory=list)
    Q: np.ndarray | None = None  # value has x^T Q x / 2
    q: np.ndarray | None = None
    r: float = 0.0
    #: Q equals its transpose exactly by construction (a quadratic form's symmetric part,
    #: scaled and summed), so that no user of the form needs to compare it with Q^T
    Q_symmetric: bool = False

    def scaled(self, c: float) -> GLMFunction:
        return GLMFunction(
            self.n,
            [t.scaled(c) for t in self.terms],
            None if self.Q is None else c * self.Q,
            None if self.q is None else c * self.q,
            c * self.r,
            self.Q_symmetric,
        )

    def plus(self, other: GLMFunction) -> GLMFunction:
        Q = self.Q if other.Q is None else (other.Q if self.Q is None else self.Q + other.Q)
        q = self.q if other.q is None else (other.q if self.q is None else self.q + other.q)
        symmetric = (self.Q is None or self.Q_symmetric) and (other.Q is None or other.Q_symmetric)
        return GLMFunction(self.n, self.terms + other.terms, Q, q, self.r + other.r, symmetric)

    @property
    def is_linear(self) -> bool:
        return not self.terms and self.Q is None

    def evaluate(self, x: np.ndarray, hessian: bool = True):
        """``(value, gradient, Hessian or None)``."""
        val = self.r
        g = np.zeros(self.n)
        H = np.zeros((self.n, self.n)) if hessian else None
        for t in self.terms:
            z = t.image(x)
            v, d1, d2 = phi(t.kind, z, t.M)
            val += float(t.weights @ v)
            g += t.rmatvec(t.weights * d1)
            if hessian:
                H += t.gram(t.weights * d2)
        if self.Q is not None:
            Qx = self.Q @ x
            val += 0.5 * float(x @ Qx)
            g += Qx
            if hessian:
                H += self.Q
        if self.q is not None:
            val += float(self.q @ x)
            g += self.q
        return float(val), g, H


def _selected_columns(A) -> np.ndarray | None:
    """The columns ``c`` with ``A = I[:, c]^T`` (row ``r`` of ``A`` the unit vector of
    column ``c[r]``, the columns distinct), or None when ``A`` is not such a selection."""
    if not sp.issparse(A):
        return None
    A = sp.csr_array(A)
    m = A.shape[0]
    if A.nnz != m or not np.array_equal(A.indptr, np.arange(m + 1)) or np.any(A.data != 1.0):
        return None
    cols = A.indices
    return cols if np.unique(cols).size == m else None


def _const_scalar(expr) -> float | None:
    if expr.is_constant() and expr.size == 1 and not expr.parameters():
        return float(np.asarray(expr.value).ravel()[0])
    return None


def recognise_scalar(expr: cp.Expression, layout: VariableLayout) -> GLMFunction:
    """GLM form of a scalar expression; raises :class:`NotRecognised`."""
    return _with_scalings_applied(_recognise_scalar(expr, layout))


# While an expression is recognised, the constant factors of a quadratic form are recorded
# rather than applied to its N x N matrix (``_q_scalings``, in the order they apply), and
# applied once at the end, in that order: the same numbers as applying each in turn. When
# they are powers of two whose product is 1 (``0.5 * quad_form(x, P)``: P's symmetric part
# times 2, then 0.5), Q is the symmetric part itself, with no N x N array made.


def _q_scalings(f: GLMFunction) -> tuple[float, ...]:
    return getattr(f, "_q_scalings", ())


def _scaled_lazily(f: GLMFunction, c: float) -> GLMFunction:
    """``f.scaled(c)`` with the factor of Q recorded (see above), not applied."""
    out = GLMFunction(
        f.n,
        [t.scaled(c) for t in f.terms],
        f.Q,
        None if f.q is None else c * f.q,
        c * f.r,
        f.Q_symmetric,
    )
    if f.Q is not None:
        out._q_scalings = (*_q_scalings(f), c)
    return out


def _exact_identity(factors: tuple[float, ...]) -> bool:
    """Whether multiplying by each factor in turn leaves every number as it is (below the
    overflow threshold): powers of two (exact scalings) whose product is 1."""
    if any(abs(math.frexp(c)[0]) != 0.5 for c in factors):
        return False
    return math.prod(factors) == 1.0


def _with_scalings_applied(f: GLMFunction) -> GLMFunction:
    factors = _q_scalings(f)
    if f.Q is None or not factors:
        return f
    if _exact_identity(factors):
        Q = f.Q
    else:
        Q = factors[0] * f.Q
        for c in factors[1:]:
            Q *= c
    return GLMFunction(f.n, f.terms, Q, f.q, f.r, f.Q_symmetric)


def _recognise_scalar(expr: cp.Expression, layout: VariableLayout) -> GLMFunction:
    N = layout.size
    name = type(expr).__name__
    if expr.is_affine():
        p = affine_map(expr, layout)
        if p.m != 1:
            raise NotRecognised("vector")
        q = np.asarray(p.A.toarray() if sp.issparse(p.A) else p.A).ravel()
        return GLMFunction(N, q=q, r=float(p.b[0]))
    if name == "AddExpression":
        out = GLMFunction(N)
        for a in expr.args:
            if a.size != 1:
                raise NotRecognised("broadcast")
            out = out.plus(recognise_scalar(a, layout))  # (its scalings applied)
        return out
    if name == "NegExpression":
        return _scaled_lazily(_recognise_scalar(expr.args[0], layout), -1.0)
    if name in ("MulExpression", "multiply"):
        left, right = expr.args
        c = _const_scalar(left)
        if c is not None:
            return _scaled_lazily(_recognise_scalar(right, layout), c)
        c = _const_scalar(right)
        if c is not None:
            return _scaled_lazily(_recognise_scalar(left, layout), c)
        raise NotRecognised("product")
    if name == "DivExpression":
        c = _const_scalar(expr.args[1])
        if c is None or c == 0:
            raise NotRecognised("division")
        return _scaled_lazily(_recognise_scalar(expr.args[0], layout), 1.0 / c)
    if name == "Sum" and getattr(expr, "axis", None) is None:
        return _recognise_sum(expr.args[0], layout, np.ones(expr.args[0].size))
    if name in ("logistic", "exp", "power", "PowerApprox", "huber") and expr.size == 1:
        return _recognise_sum(expr, layout, np.ones(1))
    if name == "quad_over_lin":
        y = _const_scalar(expr.args[1])
        if y is None or y <= 0:
            raise NotRecognised("quad_over_lin")
        p = affine_map(expr.args[0], layout)
        A = _dense_or_sparse(p.A)
        return GLMFunction(N, [GLMTerm("square", A, p.b, np.full(p.m, 1.0 / y))])
    if name in ("quad_form", "QuadForm"):
        x, P = expr.args
        if not P.is_constant() or P.parameters():
            raise NotRecognised("quad_form")
        Pv = _const_value(P)
        Pv = Pv.toarray() if sp.issparse(Pv) else Pv
        p = affine_map(x, layout)
        # the symmetric part (P itself when symmetric: 0.5 (2 P) is P to the bit)
        Ps = Pv if is_symmetric(Pv) else 0.5 * (Pv + Pv.T)
        cols = _selected_columns(p.A)
        if cols is not None and p.m == N and np.array_equal(cols, np.arange(N)):
            # x is the whole variable vector: Q = 2 Ps, the factor 2 recorded (see above)
            # (Ps is symmetric exactly: P itself when so, else (P + P^T) / 2)
            out = GLMFunction(
                N, Q=Ps, q=2.0 * (Ps @ p.b), r=float(p.b @ Ps @ p.b), Q_symmetric=True
            )
            out._q_scalings = (2.0,)
            return out
        if cols is not None:  # x is a selection of the variables' coordinates: placed
            Q = np.zeros((N, N))
            Q[np.ix_(cols, cols)] = 2.0 * Ps
            APs = np.zeros((N, p.m))
            APs[cols] = Ps
        else:  # two sparse-dense products instead of dense m x N x N ones
            APs = np.asarray(p.A.T @ Ps)  # N x m
            Q = 2.0 * np.asarray(p.A.T @ APs.T)
            Q = Q.toarray() if sp.issparse(Q) else Q
        q = 2.0 * (APs @ p.b)  # (the same numbers as (2 APs) b: a power of two)
        # (a placed Ps is symmetric; A^T Ps A computed as products may not be, to the bit)
        return GLMFunction(N, Q=Q, q=q, r=float(p.b @ Ps @ p.b), Q_symmetric=cols is not None)
    raise NotRecognised(f"scalar atom {name}")


def _recognise_sum(expr, layout, weights: np.ndarray) -> GLMFunction:
    """GLM form of ``sum(weights * expr)`` for an elementwise ``expr``."""
    N = layout.size
    name = type(expr).__name__
    if expr.is_affine():
        p = affine_map(expr, layout)
        w = np.broadcast_to(weights, (p.m,))
        q = np.asarray(p.A.T @ w).ravel()
        return GLMFunction(N, q=q, r=float(w @ p.b))
    if name == "AddExpression":
        out = GLMFunction(N)
        for a in expr.args:
            if a.size != expr.size:
                raise NotRecognised("broadcast in sum")
            out = out.plus(_recognise_sum(a, layout, weights))
        return out
    if name == "NegExpression":
        return _recognise_sum(expr.args[0], layout, -weights)
    if name == "multiply":
        left, right = expr.args
        const, other = (left, right) if left.is_constant() else (right, left)
        if not const.is_constant() or const.parameters():
            raise NotRecognised("product")
        c = np.asarray(const.value, dtype=float).ravel(order="F")
        if c.size not in (1, other.size) or other.size != expr.size:
            raise NotRecognised("broadcast multiply")
        return _recognise_sum(other, layout, weights * c)
    if (
        name in ("MulExpression",)
        and expr.args[0].size == 1
        and _const_scalar(expr.args[0]) is not None
    ):
        return _recognise_sum(expr.args[1], layout, weights * _const_scalar(expr.args[0]))
    if name == "DivExpression":
        c = _const_scalar(expr.args[1])
        if c is None or c == 0:
            raise NotRecognised("division")
        return _recognise_sum(expr.args[0], layout, weights / c)
    kind, M = None, 1.0
    if name == "logistic":
        kind = "logistic"
    elif name == "exp":
        kind = "exp"
    elif (
        name in ("power", "PowerApprox")  # cp.square builds PowerApprox in cvxpy >= 1.6
        and float(np.asarray(getattr(expr.p, "value", expr.p))) == 2.0
    ):
        kind = "square"
    elif name == "huber":
        kind = "huber"
        M = float(np.asarray(getattr(expr.M, "value", expr.M)))
    if kind is None:
        raise NotRecognised(f"elementwise atom {name}")
    arg, sign = expr.args[0], 1.0
    if type(arg).__name__ == "NegExpression":  # phi(-(X w)): keep X, not a negated copy
        arg, sign = arg.args[0], -1.0
    p = affine_map(arg, layout)
    w = np.broadcast_to(weights, (p.m,)).astype(float)
    return GLMFunction(N, [GLMTerm(kind, _dense_or_sparse(p.A), sign * p.b, w.copy(), M, sign)])


def recognise_components(expr: cp.Expression, layout: VariableLayout) -> list[GLMFunction]:
    """GLM form of each component of a (stacked) constraint vector, in 'F' order."""
    if expr.is_affine():
        p = affine_map(expr, layout)
        A = p.A.toarray() if sp.issparse(p.A) else np.asarray(p.A)
        return [GLMFunction(layout.size, q=A[j].copy(), r=float(p.b[j])) for j in range(p.m)]
    name = type(expr).__name__
    if expr.size == 1:
        inner = expr.args[0] if name == "reshape" else expr
        return [recognise_scalar(inner, layout)]
    if name == "Hstack":
        out = []
        for a in expr.args:
            a = a.args[0] if type(a).__name__ == "reshape" and a.args[0].ndim <= 1 else a
            out.extend(recognise_components(a, layout))
        return out
    if name == "reshape" and expr.args[0].ndim <= 1:
        return recognise_components(expr.args[0], layout)
    raise NotRecognised(f"vector constraint {name}")
