"""Recognise generalised-linear structure in cvxpy expressions, for exact Newton solves.

Many federated losses and constraints are sums of scalar functions of affine maps plus a
quadratic:

    s(x) = sum_k  w_k * phi_k(a_k^T x + b_k)  +  x^T Q x / 2  +  q^T x  +  r

with phi in {logistic, exp, square, huber}. For those, value, gradient and Hessian
(``A^T diag(w phi''(Ax + b)) A + Q``) are a few matrix products, which makes Newton's method
cheap and exact. :func:`recognise_scalar` returns such a :class:`GLMFunction` for a scalar
cvxpy expression, or None when the expression has another shape (callers then fall back
to quasi-Newton). :func:`affine_map` extracts ``(A, b)`` of an affine expression.

Recognition reads an expression through its :class:`Node` s with a :class:`Reading` of its
leaves; every operation on the leaves' values goes through :meth:`Reading.op` and every
decision taken from them through :meth:`Reading.decide`, so that a reading can be recorded
(:class:`Tape`) and replayed on another party's leaves (:class:`Recipe`).
"""

from __future__ import annotations

import functools
import math
import operator
import weakref
from dataclasses import dataclass, field
from typing import Any

import cvxpy as cp
import numpy as np
import scipy.sparse as sp
from scipy.linalg import blas

from fedmodel.cached import cached_property
from fedmodel.compiler.atom_rules import is_symmetric
from fedmodel.compiler.smooth import VariableLayout
from fedmodel.expressions import AtomTable


class NotRecognised(Exception):
    """The expression is not of the supported shape (internal; callers fall back)."""


# -- what recognition reads of an expression ------------------------------------------------
class Node:
    """One node of a cvxpy expression as recognition reads it, apart from its leaves'
    values: its atom's class name, shape, curvature flags, children and, for a leaf, its
    place among the expression's leaves (left to right, :func:`expression_leaves`).

    Made from an expression by :func:`node_of`; an expression with the same structure (the
    same atoms, shapes and constants, over other data of the same shapes: equal
    :func:`~fedmodel.compiler.fingerprint.structure_fingerprint`) is read through the same
    nodes with its own leaves (:func:`recognise_program`)."""

    __slots__ = ("name", "shape", "size", "ndim", "affine", "constant", "params", "args")
    __slots__ += ("leaf", "variable", "atom", "fixed", "private", "scalar", "var_map")

    def attr(self, name: str, default=None):
        """The atom's own datum ``name`` (an axis, an index key, an exponent)."""
        return getattr(self.atom, name, default)


def _has_private_data(expr) -> bool:
    from fedmodel.dsl.data import PrivateData

    if isinstance(expr, PrivateData):
        return True
    return any(_has_private_data(a) for a in getattr(expr, "args", ()))


#: affine atoms monotone in each argument whatever the values (their curvature follows
#: their arguments' alone)
_MONOTONE_AFFINE = frozenset(
    ("AddExpression", "NegExpression", "Sum", "index", "reshape", "transpose", "Hstack")
    + ("Promote", "broadcast_to")
)
#: atoms of one curvature whatever their data (convex, never concave)
_FIXED_CURVATURE = frozenset(("logistic", "exp", "power", "PowerApprox", "huber", "quad_over_lin"))
#: products and quotients by a constant: monotone as the constant's sign says
_SCALINGS = frozenset(("MulExpression", "multiply", "DivExpression"))


def node_of(expr: cp.Expression, leaves: list) -> Node:
    """The :class:`Node` of ``expr``, its leaves appended to ``leaves`` in the order of
    :func:`expression_leaves`. ``fixed`` says whether the node's flags are the same for
    every expression of its structure: no private data below it, or an atom whose
    curvature follows its arguments' whatever the data's values; ``private`` whether
    private data is below it (else its value, made of constants that the structure
    fixes, is the same for every expression of its structure)."""
    n = Node()
    n.name = type(expr).__name__
    n.shape = tuple(expr.shape)
    n.size = expr.size
    n.ndim = expr.ndim
    n.atom = expr
    n.scalar = n.var_map = None
    args = expr.args
    if not args:
        from fedmodel.dsl.data import PrivateData

        n.args = ()
        n.leaf = len(leaves)
        leaves.append(expr)
        n.private = isinstance(expr, PrivateData)
        n.variable = isinstance(expr, cp.Variable)
        n.constant = expr.is_constant()
        n.params = bool(expr.parameters())
        n.affine = True
        n.fixed = True
        return n
    n.args = tuple(node_of(a, leaves) for a in args)
    n.private = any(a.private for a in n.args)
    n.leaf, n.variable = None, False
    n.constant = expr.is_constant()
    n.params = bool(expr.parameters())
    n.affine = expr.is_affine()
    fixed = all(a.fixed for a in n.args)
    if fixed and n.name not in _MONOTONE_AFFINE:
        if n.name in _FIXED_CURVATURE:
            fixed = not any(_has_private_data(d) for d in expr.get_data() or ())
        elif n.name in _SCALINGS:
            fixed = all(a.affine for a in n.args) or not any(
                m.private for m in n.args if m.constant
            )
        else:
            fixed = not n.private
    n.fixed = fixed
    return n


def node_like(template: Node, expr: cp.Expression) -> Node | None:
    """The :class:`Node` of ``expr``, whose terms have the skeleton of those ``template``
    was made from (:func:`~fedmodel.compiler.fingerprint.structure_skeleton`: the same
    atoms, atoms' data, variables and constants, nodes of other shapes perhaps), as
    :func:`node_of` makes it: ``expr``'s own atoms and shapes, ``template``'s flags and
    leaf numbers, which follow from the skeleton when ``template``'s flags are
    :attr:`~Node.fixed` and no node of either has a zero-size shape (an empty node is
    constant whatever its atom); None otherwise."""
    shape = tuple(expr.shape)
    if not template.fixed or 0 in shape or 0 in template.shape:
        return None
    n = Node()
    n.name, n.shape, n.ndim, n.atom = template.name, shape, len(shape), expr
    n.size = math.prod(shape)  # (cvxpy's size and ndim of a shape)
    n.scalar = n.var_map = None
    n.leaf, n.variable, n.constant = template.leaf, template.variable, template.constant
    n.params, n.affine, n.private = template.params, template.affine, template.private
    n.fixed = True
    n.args = ()
    if template.args:
        args = []
        for t, a in zip(template.args, expr.args, strict=True):
            found = node_like(t, a)
            if found is None:
                return None
            args.append(found)
        n.args = tuple(args)
    return n


def expression_leaves(expr: cp.Expression, out: list) -> list:
    """``expr``'s leaves (variables, constants, data) appended to ``out``, left to right:
    the order :func:`node_of` numbers them in."""
    stack = [expr]
    pop, push, append = stack.pop, stack.extend, out.append
    while stack:
        e = pop()
        args = e.args
        if args:
            push(args[::-1])
        else:
            append(e)
    return out


class Reading:
    """Expressions' leaves (``leaves``, numbered as their :class:`Node` s number them) read
    over ``layout``; ``path``: the outcomes of the decisions recognition took from the
    data's values, in order (two readings through the same nodes with equal paths applied
    the same operations, on their own values). With a :class:`Tape` (``tape``), the
    operations on the leaves' values and the decisions taken from them are recorded."""

    __slots__ = ("leaves", "layout", "N", "path", "tape")

    def __init__(self, leaves: list, layout: VariableLayout, tape: Tape | None = None):
        self.leaves = leaves
        self.layout = layout
        self.N = layout.size
        self.path: list = []
        self.tape = tape
        if tape is not None:
            tape.start(leaves)

    def noted(self, outcome):
        """``outcome``, kept in :attr:`path` (a decision taken from the data's values)
        by a rule that does not say how it was taken: a reading recorded on a tape is
        then not replayed (:meth:`decide` says how)."""
        if self.tape is not None:
            self.tape.valid = False
        self.path.append(outcome)
        return outcome

    def decide(self, fn, *args):
        """``fn(*args)``, a decision taken from values, kept in :attr:`path` (and on the
        tape, to be taken again from another reading's values)."""
        outcome = fn(*args)
        self.path.append(outcome)
        if self.tape is not None:
            self.tape.record(fn, args, outcome, True)
        return outcome

    def op(self, fn, *args):
        """``fn(*args)``: an operation on values (recorded on the tape, if any)."""
        out = fn(*args)
        if self.tape is not None:
            self.tape.record(fn, args, out, False)
        return out

    def value(self, e: Node):
        """The value of a constant node, by cvxpy's own arithmetic (each atom's
        ``numeric`` on its arguments' values, as ``expr.value`` computes it)."""
        if e.leaf is not None:
            if self.tape is None:
                return self.leaves[e.leaf].value
            return self.op(_leaf_value, self.leaves[e.leaf])
        if 0 in e.shape:
            return np.array([])
        values = [self.value(a) for a in e.args]
        if self.tape is None:
            return e.atom.numeric(values)
        return self.op(functools.partial(_numeric, e.atom), *values)

    def variable(self, e: Node) -> cp.Variable:
        return self.leaves[e.leaf]


def _leaf_value(leaf):
    return leaf.value


def _numeric(atom, *values):
    return atom.numeric(list(values))


# -- the tape of a reading, replayed on another party's leaves ------------------------------
#: the float dtype (a float array's own descriptor: compared by identity)
_FLOAT = np.dtype(float)

#: results that are never slots of a tape (small ints and booleans are shared objects)
_UNTRACKED = (bool, int, str, type(None), np.bool_)
#: the types of most of a tape's values, none of them of :data:`_UNTRACKED` (whose
#: ``isinstance`` test, false, reads the value's ``__class__``)
_TRACKED = frozenset({np.ndarray, float})


def _untracked(x) -> bool:
    """Whether ``x`` is of :data:`_UNTRACKED` (a value of :data:`_TRACKED` type is not)."""
    return type(x) not in _TRACKED and isinstance(x, _UNTRACKED)


class Tape:
    """The operations a :class:`Reading` applied to its leaves' values and the
    decisions it took from them, in order: ``ops``, each ``(fn, refs, decision,
    outcome)`` with ``refs`` naming each argument as a slot (a leaf, by its number, or an
    earlier operation's result) or a constant (what the structure fixes). A reading
    recorded with ``valid`` still True (each decision told by :meth:`Reading.decide`)
    replays on another reading's leaves (:class:`Recipe`): the same operations on its
    own values, hence the same numbers as its own reading took along the same path; a
    decision that comes out otherwise, or an operation that fails (a leaf of another
    shape or storage), stops the replay, and that reading is made in full."""

    __slots__ = ("ops", "slots", "keep", "valid", "n_leaves", "n_values")

    def __init__(self):
        self.ops: list = []
        self.slots: dict[int, int] = {}
        self.keep: list = []
        self.valid = True
        self.n_leaves = self.n_values = 0

    def start(self, leaves: list) -> None:
        """Number ``leaves``: their private data are the reading's slots (every other
        leaf, a constant or a variable, is the structure's own)."""
        from fedmodel.dsl.data import PrivateData

        self.n_leaves = self.n_values = len(leaves)
        for i, leaf in enumerate(leaves):
            if isinstance(leaf, PrivateData):
                self.slots[id(leaf)] = i
        self.keep.extend(leaves)

    def slot(self, obj) -> int | None:
        """The slot holding ``obj`` (None for a constant)."""
        if _untracked(obj):
            return None
        return self.slots.get(id(obj))

    def record(self, fn, args: tuple, out, decision: bool) -> None:
        refs = tuple((True, s) if (s := self.slot(a)) is not None else (False, a) for a in args)
        if not any(r[0] for r in refs):  # (constants only: the same for every reading)
            return
        if decision:
            self.ops.append((fn, refs, True, out))
            return
        self.ops.append((fn, refs, False, None))
        if not _untracked(out):
            self.slots[id(out)] = self.n_values
            self.keep.append(out)
        self.n_values += 1

    def close(self) -> None:
        """Forget the recorded reading's objects (its slots are numbers from now on)."""
        self.keep = []


class Recipe:
    """The forms a recorded reading made (a list of :class:`GLMFunction` s or None), as
    what each of their arrays and numbers is: a slot of its :class:`Tape` (made from the
    leaves) or a constant of the structure; :meth:`replay` makes the same forms from
    another reading's leaves through the same nodes, with the recorded reading's
    ``path``. ``verified``: whether a replay of its operations (of any structure whose
    recipe has the same operations, on values of other sizes) has been compared with a
    reading's own forms (:func:`same_forms`) and found equal.

    The tape and the forms' makeup are written once as one Python function (its
    operations in order, each decision compared with its recorded outcome, then the
    forms built), so that a replay costs the operations themselves."""

    __slots__ = ("replay", "path")

    def __init__(self, tape: Tape, forms: list, path: list):
        self.path = tuple(path)
        _defer_rows(tape, forms)
        self.replay = _replay_function(tape, forms)
        tape.close()

    @property
    def verified(self) -> bool:
        return self.replay.text in _VERIFIED

    def verify(self, leaves: list, forms: list) -> bool:
        """Whether the replay on ``leaves`` gives ``forms`` (their reading's own), bit
        for bit; kept for every recipe of the same operations."""
        replayed = self.replay(leaves)
        if replayed is None or not same_forms(replayed, forms):
            return False
        _VERIFIED.add(self.replay.text)
        return True


#: the replay functions' texts (:func:`_replay_function`) whose replays have given a
#: reading's own forms
_VERIFIED: set[str] = set()


def _replay_function(tape: Tape, forms: list):
    """The function ``leaves -> forms or None`` of :class:`Recipe` (see there)."""
    names: dict[str, Any] = {"GLMFunction": GLMFunction, "_new_term": _new_term}
    body = []

    def constant(x) -> str:
        name = f"k{len(names)}"
        names[name] = x
        return name

    used = {a for _, refs, _, _ in tape.ops for is_slot, a in refs if is_slot}
    for is_slot, i in _output_refs(tape, forms):
        if is_slot:
            used.add(i)
    body += [f"v{i} = leaves[{i}]" for i in range(tape.n_leaves) if i in used]
    slot = tape.n_leaves
    for fn, refs, decision, outcome in tape.ops:
        args = ", ".join([f"v{a}" if is_slot else constant(a) for is_slot, a in refs])
        # (a leaf's value, :func:`_leaf_value`, is read as the attribute it is)
        call = f"{args}.value" if fn is _leaf_value else f"{constant(fn)}({args})"
        if decision:
            body.append(f"if {call} != {constant(outcome)}: return None")
        else:
            body.append(f"v{slot} = {call}")
            slot += 1

    def ref(x) -> str:
        found = None if x is None else tape.slot(x)
        if found is not None:
            return f"v{found}"
        if type(x) is np.ndarray or _sparse(x):
            return f"{constant(x)}.copy()"  # (a constant of the structure: each form its own)
        return constant(x)

    made = []
    for f in forms:
        if f is None:
            made.append("None")
            continue
        terms = ", ".join(
            [
                f"_new_term({constant(t.kind)}, {ref(t.A)}, {ref(t.b)}, {ref(t.weights)}, "
                f"{ref(t.M)}, {ref(t.s)})"
                for t in f.terms
            ]
        )
        call = f"GLMFunction({int(f.n)}, [{terms}], {ref(f.Q)}, {ref(f.q)}, {ref(f.r)}, {bool(f.Q_symmetric)})"
        scalings = f.__dict__.get("_q_scalings")
        if scalings is not None:
            factors = "".join(f"{ref(c)}, " for c in scalings)
            call = f"_with_factors({call}, ({factors}))"
            names["_with_factors"] = _with_factors
        made.append(call)
    lines = ["def replay(leaves):", "    try:"]
    lines += [f"        {line}" for line in body or ["pass"]]
    lines += ["    except Exception:", "        return None", f"    return [{', '.join(made)}]"]
    text = "\n".join(lines)
    code = _REPLAY_CODE.get(text)
    if code is None:  # (structures whose readings differ in their values' sizes alone)
        code = _REPLAY_CODE[text] = compile(text, "<glm replay>", "exec")
    # (the text holds generated identifiers and integers only; every operation, constant
    # and decision outcome it refers to is in ``names``: nothing of a value is code)
    exec(code, names)  # (names: the operations and constants it refers to)
    replay = names["replay"]
    replay.text = text
    return replay


#: the text of a replay function (:func:`_replay_function`) -> its compiled code
_REPLAY_CODE: dict[str, Any] = {}


def _output_refs(tape: Tape, forms: list):
    for f in forms:
        if f is None:
            continue
        values = [f.Q, f.q, f.r, *f.__dict__.get("_q_scalings", ())]
        for t in f.terms:
            values += [t.A, t.b, t.weights, t.M, t.s]
        for x in values:
            found = None if x is None else tape.slot(x)
            yield (found is not None, found)


def _new_term(kind: str, A, b, weights, M, s) -> GLMTerm:
    if type(A) is DeferredRows:  # (its A made at its first use: :class:`RowsTerm`)
        t = object.__new__(RowsTerm)
        t.__dict__ = {"kind": kind, "rows": A, "b": b, "weights": weights, "M": M, "s": s}
        return t
    t = object.__new__(GLMTerm)  # (its A as the recorded reading's __post_init__ left it)
    t.__dict__ = {"kind": kind, "A": A, "b": b, "weights": weights, "M": M, "s": s}
    return t


def _with_factors(f: GLMFunction, factors: tuple) -> GLMFunction:
    f._q_scalings = factors
    return f


def _sparse(M) -> bool:
    """``scipy.sparse.issparse(M)``, with a dense array answered at once."""
    return type(M) is not np.ndarray and sp.issparse(M)


def _same_value(x, y) -> bool:
    if x is None or y is None:
        return x is None and y is None
    if type(x) is not type(y):
        return False
    if type(x) is np.ndarray:
        return x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()
    if _sparse(x):
        x, y = x.tocsr(), y.tocsr()
        return x.shape == y.shape and all(
            _same_value(a, b)
            for a, b in zip((x.data, x.indices, x.indptr), (y.data, y.indices, y.indptr))
        )
    if isinstance(x, float | np.floating):
        return np.float64(x).tobytes() == np.float64(y).tobytes()
    return x == y


def same_forms(a: list, b: list) -> bool:
    """Whether two lists of forms (:class:`GLMFunction` s or None) are equal array for
    array, bit for bit (the sign of a zero included)."""
    if len(a) != len(b):
        return False
    for f, g in zip(a, b):
        if f is None or g is None:
            if f is not g:
                return False
            continue
        if f.n != g.n or len(f.terms) != len(g.terms) or f.Q_symmetric != g.Q_symmetric:
            return False
        fs, gs = f.__dict__.get("_q_scalings"), g.__dict__.get("_q_scalings")
        if (fs is None) != (gs is None) or (fs is not None and len(fs) != len(gs)):
            return False
        pairs = [(f.Q, g.Q), (f.q, g.q), (f.r, g.r)] + list(zip(fs or (), gs or ()))
        for t, u in zip(f.terms, g.terms):
            if t.kind != u.kind:
                return False
            pairs += [(t.A, u.A), (t.b, u.b), (t.weights, u.weights), (t.M, u.M), (t.s, u.s)]
        if not all(_same_value(x, y) for x, y in pairs):
            return False
    return True


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


def _dense_enough(M) -> bool:
    return M.nnz > 0.25 * M.shape[0] * M.shape[1]


def _to_dense(M) -> np.ndarray:
    return M.toarray()


def _dense_or_sparse(M, ctx: Reading | None = None):
    """Keep sparse matrices sparse unless dense-ish; never let np.matrix through (the
    choice, taken from the values, noted in ``ctx``)."""
    if _sparse(M):
        if ctx is None:
            return M.toarray() if _dense_enough(M) else sp.csr_matrix(M)
        dense = ctx.decide(_dense_enough, M)
        return ctx.op(_to_dense if dense else sp.csr_matrix, M)
    return np.asarray(M) if ctx is None else ctx.op(np.asarray, M)


def _identity_matrix(A) -> bool:
    """Whether ``A`` is the identity, as a sparse matrix of ones on its diagonal."""
    if not _sparse(A) or A.shape[0] != A.shape[1] or A.nnz != A.shape[0]:
        return False
    A = sp.csr_matrix(A)
    return bool(
        np.array_equal(A.indices, np.arange(A.shape[0]))
        and np.array_equal(A.indptr, np.arange(A.shape[0] + 1))
        and np.all(A.data == 1.0)
    )


def _is_identity(p: Affine, ctx: Reading | None = None) -> bool:
    """True when ``p.A`` is the N x N identity (a variable that is the whole of x)."""
    if p.identity is not None:
        return p.identity
    if ctx is None:
        return _identity_matrix(p.A)
    return ctx.decide(_identity_matrix, p.A)


def _as_float(v) -> np.ndarray:
    """``np.asarray(v, dtype=float)`` (a float array is itself, answered at once)."""
    if type(v) is np.ndarray and v.dtype is _FLOAT:
        return v
    return np.asarray(v, dtype=float)


def _const_value(e: Node, ctx: Reading) -> np.ndarray | sp.spmatrix:
    v = ctx.value(e)
    return v if _sparse(v) else ctx.op(_as_float, v)


# (the arithmetic of the rules below, as functions a tape records and replays)
def _no_entries(A) -> bool:
    return A.nnz == 0


def _csr(A):
    return sp.csr_matrix(A) if _sparse(A) else A


def _repeat_rows(A, m: int):
    return sp.vstack([A] * m) if _sparse(A) else np.repeat(A, m, axis=0)


def _stack_rows(A, m: int):
    return sp.vstack([sp.csr_matrix(A)] * m) if _sparse(A) else np.repeat(A, m, axis=0)


def _matvec(C, b) -> np.ndarray:
    """``C @ b`` as a flat array (a product that is a flat array is itself)."""
    out = C @ b
    return out if type(out) is np.ndarray and out.ndim == 1 else np.asarray(out).ravel()


def _tmatmul(C, A):
    return C.T @ A


def _tmatvec(C, b) -> np.ndarray:
    return np.asarray(C.T @ b).ravel()


def _column(C):
    return C.reshape(-1, 1)


def _flat(v) -> np.ndarray:
    """A constant's value as a flat float array, column-major (of a flat float array, a
    view of it, at once)."""
    if type(v) is np.ndarray and v.ndim == 1 and v.dtype is _FLOAT:
        return v.ravel()
    return np.asarray(v if not _sparse(v) else v.toarray(), dtype=float).ravel(order="F")


def _first_times(c: np.ndarray, M):
    return c[0] * M


def _diag_times(c: np.ndarray, A):
    return sp.diags(c) @ A


def _rows_times(c: np.ndarray, A: np.ndarray) -> np.ndarray:
    return c[:, None] * A  # (row i scaled by c_i, as diag(c) A)


class DeferredRows:
    """The product ``c[:, None] * A`` of a replay (:func:`_rows_times`, a term's data
    matrix), made at its first use (:attr:`RowsTerm.A`) or written straight to where it
    is used (:meth:`write`): ``c`` (m,) and ``A`` (m, n) are float arrays of matching
    rows, so that the product cannot fail and its bits do not depend on where it is
    written."""

    __slots__ = ("c", "A")

    def __init__(self, c: np.ndarray, A: np.ndarray):
        self.c, self.A = c, A

    @property
    def shape(self) -> tuple[int, int]:
        return self.A.shape

    def made(self) -> np.ndarray:
        """The product as the replay's operations make it (C-contiguous)."""
        return _contiguous(_rows_times(self.c, self.A))

    def write(self, out: np.ndarray, negated: bool = False) -> None:
        """Write the product (``-`` it with ``negated``) to ``out``, of its shape."""
        np.multiply(self.c[:, None], self.A, out=out)
        if negated:
            np.negative(out, out=out)


def _deferred_rows_times(c, A):
    """:func:`_rows_times` as a :class:`DeferredRows` when its arguments are float arrays
    (of the float descriptor itself) of matching rows; else the product itself (failing as
    it fails)."""
    if (
        type(c) is np.ndarray
        and type(A) is np.ndarray
        and c.ndim == 1
        and A.ndim == 2
        and c.shape[0] == A.shape[0]
        and c.dtype is _FLOAT
        and A.dtype is _FLOAT
    ):
        return DeferredRows(c, A)
    return _rows_times(c, A)


def _deferred_asarray(v):
    """``np.asarray`` of a value on the way to a :class:`DeferredRows`' term."""
    return v if type(v) is DeferredRows else np.asarray(v)


def _deferred_contiguous(v):
    """:func:`_contiguous` of a value on the way to a :class:`DeferredRows`' term."""
    return v if type(v) is DeferredRows else _contiguous(v)


#: the operations a product of :func:`_rows_times` may go through on its way to a term's
#: data matrix, and what each becomes when the product is deferred
_ON_THE_WAY = {np.asarray: _deferred_asarray}


def _defer_rows(tape: Tape, forms: list) -> None:
    """Defer, on ``tape``, each product of :func:`_rows_times` that is a term's data
    matrix of ``forms`` and nothing else (through ``np.asarray``, then
    :func:`_contiguous`): a replay makes it as a :class:`DeferredRows`, its term a
    :class:`RowsTerm`. The tape's slots are unchanged."""
    producer: dict[int, int] = {}
    uses: dict[int, int] = {}
    slot = tape.n_leaves
    for j, (_, refs, decision, _) in enumerate(tape.ops):
        for is_slot, a in refs:
            if is_slot:
                uses[a] = uses.get(a, 0) + 1
        if not decision:
            producer[slot] = j
            slot += 1
    for is_slot, a in _output_refs(tape, forms):
        if is_slot:
            uses[a] = uses.get(a, 0) + 1
    for f in forms:
        for t in [] if f is None else f.terms:
            end = None if type(t.A) is not np.ndarray else tape.slot(t.A)
            j = producer.get(end) if end is not None and uses.get(end) == 1 else None
            if j is None or tape.ops[j][0] is not _contiguous:
                continue
            chain = [j]
            while True:
                fn, refs, _, _ = tape.ops[chain[-1]]
                if len(refs) != 1 or not refs[0][0] or uses.get(refs[0][1]) != 1:
                    break
                k = producer.get(refs[0][1])
                if k is None:
                    break
                chain.append(k)
                if tape.ops[k][0] is _rows_times or tape.ops[k][0] not in _ON_THE_WAY:
                    break
            if tape.ops[chain[-1]][0] is not _rows_times:
                continue
            for k in chain:
                fn, refs, decision, outcome = tape.ops[k]
                tape.ops[k] = (_DEFERRED[fn], refs, decision, outcome)


def _reciprocal(v) -> float:
    return 1.0 / float(np.asarray(v))


def _column_sums(A) -> np.ndarray:
    return np.asarray(A.sum(axis=0)).reshape(1, -1)


def _total(b: np.ndarray) -> np.ndarray:
    return np.array([b.sum()])


def _rows_of(A, sel: np.ndarray):
    return A[sel] if not _sparse(A) else sp.csr_matrix(A)[sel]


def _vstack_csr(*As):
    return sp.vstack([sp.csr_matrix(A) for A in As])


def _concatenate(*bs) -> np.ndarray:
    return np.concatenate(bs)


# The affine atoms: atom -> ``(node, reading, shape) -> Affine`` (None where the atom is
# not recognised in that form, e.g. a sum over an axis). Every operation on values goes
# through ``ctx.op`` and every decision taken from values through ``ctx.decide``, so that
# a recorded reading replays (:class:`Tape`).
AFFINE_MAPS = AtomTable("affine map of an affine atom")


@AFFINE_MAPS.register("AddExpression")
def _affine_addexpression(e: Node, ctx: Reading, shape: tuple) -> Affine | None:
    parts = [_affine_map(a, ctx) for a in e.args]
    m = max(p.m for p in parts)
    A, b = None, np.zeros(m)
    add = operator.add
    for p in parts:
        if p.m == m and A is not None and _sparse(p.A) and ctx.decide(_no_entries, p.A):
            b = ctx.op(add, b, p.b)  # (a constant: nothing to add to A)
            continue
        if p.m != m:
            if p.m != 1:
                raise NotRecognised("broadcast add")
            pa = ctx.op(_repeat_rows, ctx.op(_csr, p.A), m)
            pb = ctx.op(np.repeat, p.b, m)
        else:
            pa, pb = p.A, p.b
        A = pa if A is None else ctx.op(add, A, pa)
        b = ctx.op(add, b, pb)
    return Affine(_dense_or_sparse(A, ctx), b, shape)


@AFFINE_MAPS.register("NegExpression")
def _affine_negexpression(e: Node, ctx: Reading, shape: tuple) -> Affine | None:
    p = _affine_map(e.args[0], ctx)
    neg = operator.neg
    return Affine(_dense_or_sparse(ctx.op(neg, p.A), ctx), ctx.op(neg, p.b), shape)


@AFFINE_MAPS.register("Promote", "broadcast_to")
def _affine_promote(e: Node, ctx: Reading, shape: tuple) -> Affine | None:
    p = _affine_map(e.args[0], ctx)
    m = int(np.prod(shape)) if shape else 1
    if p.m != 1:
        raise NotRecognised("promote of non-scalar")
    return Affine(ctx.op(_stack_rows, p.A, m), ctx.op(np.repeat, p.b, m), shape)


@AFFINE_MAPS.register("MulExpression")
def _affine_mulexpression(e: Node, ctx: Reading, shape: tuple) -> Affine | None:
    left, right = e.args
    if left.constant and not left.params and right.ndim <= 1:
        C = _const_value(left, ctx)
        C = C if C.ndim == 2 or _sparse(C) else ctx.op(np.atleast_2d, C)
        p = _affine_map(right, ctx)
        if _is_identity(p, ctx) and not _sparse(C):
            # data @ w with w the whole stacked vector: the data matrix itself (no copy)
            return Affine(C, ctx.op(_matvec, C, p.b), shape)
        A = ctx.op(operator.matmul, C, p.A)
        return Affine(_dense_or_sparse(A, ctx), ctx.op(_matvec, C, p.b), shape)
    if right.constant and not right.params and left.ndim <= 1:
        C = _const_value(right, ctx)
        C = C if C.ndim == 2 or _sparse(C) else ctx.op(_column, C)
        p = _affine_map(left, ctx)
        A = ctx.op(_tmatmul, C, p.A)
        return Affine(_dense_or_sparse(A, ctx), ctx.op(_tmatvec, C, p.b), shape)
    raise NotRecognised("matmul shape")


@AFFINE_MAPS.register("multiply")
def _affine_multiply(e: Node, ctx: Reading, shape: tuple) -> Affine | None:
    left, right = e.args
    const, other = (left, right) if left.constant else (right, left)
    if not const.constant or const.params:
        raise NotRecognised("product of variables")
    c = ctx.op(_flat, ctx.value(const))
    p = _affine_map(other, ctx)
    m = max(c.size, p.m)
    if p.m != m:
        raise NotRecognised("broadcast multiply")
    if c.size == 1:
        A = _dense_or_sparse(ctx.op(_first_times, c, p.A), ctx)
        return Affine(A, ctx.op(_first_times, c, p.b), shape)
    if _sparse(p.A):
        A = _dense_or_sparse(ctx.op(_diag_times, c, p.A), ctx)
        return Affine(A, ctx.op(operator.mul, c, p.b), shape)
    return Affine(ctx.op(_rows_times, c, p.A), ctx.op(operator.mul, c, p.b), shape)


@AFFINE_MAPS.register("DivExpression")
def _affine_divexpression(e: Node, ctx: Reading, shape: tuple) -> Affine | None:
    num, den = e.args
    if not den.constant or den.size != 1 or den.params:
        raise NotRecognised("division")
    c = ctx.op(_reciprocal, ctx.value(den))
    p = _affine_map(num, ctx)
    mul = operator.mul
    return Affine(_dense_or_sparse(ctx.op(mul, c, p.A), ctx), ctx.op(mul, c, p.b), shape)


@AFFINE_MAPS.register("Sum")
def _affine_sum(e: Node, ctx: Reading, shape: tuple) -> Affine | None:
    if e.attr("axis") is not None:
        return None
    p = _affine_map(e.args[0], ctx)
    return Affine(ctx.op(_column_sums, p.A), ctx.op(_total, p.b), shape)


@AFFINE_MAPS.register("index")
def _affine_index(e: Node, ctx: Reading, shape: tuple) -> Affine | None:
    child = e.args[0]
    p = _affine_map(child, ctx)
    rows = np.arange(p.m).reshape(child.shape, order="F") if child.shape else np.arange(1)
    sel = np.asarray(rows[e.attr("key")]).ravel(order="F")
    A = _dense_or_sparse(ctx.op(_rows_of, p.A, sel), ctx)
    return Affine(A, ctx.op(operator.getitem, p.b, sel), shape)


@AFFINE_MAPS.register("reshape")
def _affine_reshape(e: Node, ctx: Reading, shape: tuple) -> Affine | None:
    if e.attr("order", "F") != "F":
        return None
    p = _affine_map(e.args[0], ctx)
    return Affine(p.A, p.b, shape)


@AFFINE_MAPS.register("transpose")
def _affine_transpose(e: Node, ctx: Reading, shape: tuple) -> Affine | None:
    if e.args[0].ndim > 1:
        return None
    p = _affine_map(e.args[0], ctx)
    return Affine(p.A, p.b, shape)


@AFFINE_MAPS.register("Hstack")
def _affine_hstack(e: Node, ctx: Reading, shape: tuple) -> Affine | None:
    if not all(a.ndim <= 1 for a in e.args):
        return None
    parts = [_affine_map(a, ctx) for a in e.args]
    A = _dense_or_sparse(ctx.op(_vstack_csr, *[q.A for q in parts]), ctx)
    return Affine(A, ctx.op(_concatenate, *[q.b for q in parts]), shape)


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
    leaves: list = []
    return _affine_map(node_of(expr, leaves), Reading(leaves, layout))


def _affine_map(e: Node, ctx: Reading) -> Affine:
    if e.variable:  # (the last map found through this node, if of this variable and layout)
        var, known = ctx.leaves[e.leaf], e.var_map
        if known is not None and known[0] is var and known[1] is ctx.layout:
            return known[2]
        found = _variable_map(var, ctx.layout)
        e.var_map = (var, ctx.layout, found)
        return found
    shape = e.shape
    if e.constant:
        if e.params:
            raise NotRecognised("parameters")
        b = ctx.op(_flat, _const_value(e, ctx))
        return Affine(_zero_map(b.size, ctx.N), b, shape)
    if not e.affine:
        raise NotRecognised(f"{e.name} is not affine")
    rule = AFFINE_MAPS.get(e.name)
    mapped = rule(e, ctx, shape) if rule is not None else None
    if mapped is not None:
        return mapped
    raise NotRecognised(f"affine atom {e.name}")


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
        if not _sparse(self.A):  # row-major rows make A^T diag(.) A several times faster
            self.A = np.ascontiguousarray(self.A, dtype=float)

    def scaled(self, c: float) -> GLMTerm:
        out = object.__new__(type(self))  # (its A is in the layout __post_init__ gives it)
        out.__dict__.update(self.__dict__)
        out.weights = c * self.weights
        return out

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
        if _sparse(self.A):
            G = (self.A.T @ sp.diags(d) @ self.A).toarray()
        else:
            G = self.A.T @ (self.A * d[:, None])
        return G if self.s == 1.0 else (self.s * self.s) * G

    def gram_upper(self, d: np.ndarray) -> np.ndarray:
        """Like :meth:`gram`, but only the upper triangle is guaranteed (BLAS syrk on
        ``sqrt(d) A`` when ``d >= 0``: half the flops of the full product); for Cholesky."""
        if _sparse(self.A) or d.size == 0:
            return self.gram(d)
        if d.min() < 0:  # (a difference of convex terms): A+^T D+ A+ - A-^T D- A-
            neg = d < 0
            G = _syrk_upper(self.A[~neg], d[~neg]) - _syrk_upper(self.A[neg], -d[neg])
        else:
            G = _syrk_upper(self.A, d)
        return G if self.s == 1.0 else (self.s * self.s) * G

    def dense_A(self) -> np.ndarray:
        """``s A`` as a dense array (a copy unless s = 1 and A is dense)."""
        A = self.A.toarray() if _sparse(self.A) else self.A
        return A if self.s == 1.0 else self.s * A


class RowsTerm(GLMTerm):
    """A :class:`GLMTerm` of a replay whose data matrix is a deferred product
    (:class:`DeferredRows`, ``rows``): ``A`` is made at its first use, the same bits as
    the replay's own operations make, and kept. A cohort writes the product straight to
    its blocks (:func:`row_count` and :func:`dense_data` read no ``A``)."""

    @cached_property
    def A(self) -> np.ndarray:
        return self.rows.made()


def row_count(t: GLMTerm) -> int:
    """The number of rows of the term ``t``'s data matrix (a :class:`RowsTerm`'s without
    making it)."""
    found = t.__dict__.get("A")
    return (found if found is not None else t.rows).shape[0]


def dense_data(t: GLMTerm) -> bool:
    """Whether the term ``t``'s data matrix is not a sparse matrix (a :class:`RowsTerm`'s
    is a dense array, made or not)."""
    return type(t) is RowsTerm or not _sparse(t.A)


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

    def plus(self, other: GLMFunction, ctx: Reading | None = None) -> GLMFunction:
        """The sum of the two forms (its arithmetic recorded on ``ctx``'s tape, if any)."""
        add = operator.add if ctx is None else functools.partial(ctx.op, operator.add)
        Q = self.Q if other.Q is None else (other.Q if self.Q is None else add(self.Q, other.Q))
        q = self.q if other.q is None else (other.q if self.q is None else add(self.q, other.q))
        symmetric = (self.Q is None or self.Q_symmetric) and (other.Q is None or other.Q_symmetric)
        return GLMFunction(self.n, self.terms + other.terms, Q, q, add(self.r, other.r), symmetric)

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


def _selected_columns(A, ctx: Reading) -> np.ndarray | None:
    """The columns ``c`` with ``A = I[:, c]^T`` (row ``r`` of ``A`` the unit vector of
    column ``c[r]``, the columns distinct), or None when ``A`` is not such a selection
    (the answer, taken from the values, noted in ``ctx``)."""
    cols = None
    if _sparse(A):
        A = sp.csr_array(A)
        m = A.shape[0]
        if A.nnz == m and np.array_equal(A.indptr, np.arange(m + 1)) and np.all(A.data == 1.0):
            cols = A.indices if np.unique(A.indices).size == m else None
    ctx.noted(cols is None or cols.tobytes())  # (not replayed: quadratic forms are not kept)
    return cols


def _first_float(v) -> float:
    return float(np.asarray(v).ravel()[0])


def _const_scalar(e: Node, ctx: Reading) -> float | None:
    """The value of a scalar constant node without parameters, else None; kept on a node
    without private data (its value is its structure's)."""
    if e.constant and e.size == 1 and not e.params:
        if e.scalar is not None:
            return e.scalar
        c = ctx.op(_first_float, ctx.value(e))
        if not e.private:
            e.scalar = c
        return c
    return None


def _is_zero(c: float) -> bool:
    return c == 0


def _not_positive(c: float) -> bool:
    return c <= 0


def _inverse(c: float) -> float:
    return 1.0 / c


def _full_inverse(m: int, y: float) -> np.ndarray:
    return np.full(m, 1.0 / y)


def _dense(A) -> np.ndarray:
    return A.toarray() if _sparse(A) else np.asarray(A)


def _dense_flat(A) -> np.ndarray:
    return np.asarray(A.toarray() if _sparse(A) else A).ravel()


def _flat_dense(v) -> np.ndarray:
    return np.asarray(v, dtype=float).ravel(order="F")


def _item(b: np.ndarray, j: int) -> float:
    return float(b[j])


def _row_copy(A: np.ndarray, j: int) -> np.ndarray:
    return A[j].copy()


def _dot(w: np.ndarray, b: np.ndarray) -> float:
    return float(w @ b)


def _broadcast_copy(m: int, weights: np.ndarray) -> np.ndarray:
    w = np.empty(m)  # (its own copy, ``weights`` broadcast)
    w[...] = weights
    return w


def _contiguous(A):
    """``A`` as a term keeps it (:class:`GLMTerm`: dense data row-major)."""
    return A if _sparse(A) else np.ascontiguousarray(A, dtype=float)


#: each operation of a deferred chain (:func:`_defer_rows`) -> what it becomes
_DEFERRED = {_rows_times: _deferred_rows_times, _contiguous: _deferred_contiguous, **_ON_THE_WAY}


def _term(ctx: Reading, kind: str, A, b, weights, M: float = 1.0, s: float = 1.0) -> GLMTerm:
    return GLMTerm(kind, ctx.op(_contiguous, A), b, weights, M, s)


def recognise_scalar(expr: cp.Expression, layout: VariableLayout) -> GLMFunction:
    """GLM form of a scalar expression; raises :class:`NotRecognised`."""
    leaves: list = []
    return recognise_node(node_of(expr, leaves), Reading(leaves, layout))


def recognise_node(e: Node, ctx: Reading) -> GLMFunction:
    """GLM form of the scalar expression read as ``e`` with ``ctx``'s leaves; raises
    :class:`NotRecognised`."""
    return _with_scalings_applied(_recognise_scalar(e, ctx), ctx)


# While an expression is recognised, the constant factors of a quadratic form are recorded
# rather than applied to its N x N matrix (``_q_scalings``, in the order they apply), and
# applied once at the end, in that order: the same numbers as applying each in turn. When
# they are powers of two whose product is 1 (``0.5 * quad_form(x, P)``: P's symmetric part
# times 2, then 0.5), Q is the symmetric part itself, with no N x N array made.


def _q_scalings(f: GLMFunction) -> tuple[float, ...]:
    return getattr(f, "_q_scalings", ())


def _scaled_term(t: GLMTerm, c: float, ctx: Reading) -> GLMTerm:
    out = object.__new__(type(t))  # (as t.scaled(c))
    out.__dict__.update(t.__dict__)
    out.weights = ctx.op(operator.mul, c, t.weights)
    return out


def _scaled_lazily(f: GLMFunction, c: float, ctx: Reading) -> GLMFunction:
    """``f.scaled(c)`` with the factor of Q recorded (see above), not applied."""
    mul = operator.mul
    out = GLMFunction(
        f.n,
        [_scaled_term(t, c, ctx) for t in f.terms],
        f.Q,
        None if f.q is None else ctx.op(mul, c, f.q),
        ctx.op(mul, c, f.r),
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


def _with_scalings_applied(f: GLMFunction, ctx: Reading) -> GLMFunction:
    factors = _q_scalings(f)
    if f.Q is None or not factors:
        return f
    if ctx.noted(_exact_identity(factors)):
        Q = f.Q
    else:
        Q = factors[0] * f.Q
        for c in factors[1:]:
            Q *= c
    return GLMFunction(f.n, f.terms, Q, f.q, f.r, f.Q_symmetric)


def _recognise_scalar(e: Node, ctx: Reading) -> GLMFunction:
    N = ctx.N
    name = e.name
    if e.affine:
        p = _affine_map(e, ctx)
        if p.m != 1:
            raise NotRecognised("vector")
        return GLMFunction(N, q=ctx.op(_dense_flat, p.A), r=ctx.op(_item, p.b, 0))
    if name == "AddExpression":
        out = GLMFunction(N)
        for a in e.args:
            if a.size != 1:
                raise NotRecognised("broadcast")
            out = out.plus(recognise_node(a, ctx), ctx)  # (its scalings applied)
        return out
    if name == "NegExpression":
        return _scaled_lazily(_recognise_scalar(e.args[0], ctx), -1.0, ctx)
    if name in ("MulExpression", "multiply"):
        left, right = e.args
        c = _const_scalar(left, ctx)
        if c is not None:
            return _scaled_lazily(_recognise_scalar(right, ctx), c, ctx)
        c = _const_scalar(right, ctx)
        if c is not None:
            return _scaled_lazily(_recognise_scalar(left, ctx), c, ctx)
        raise NotRecognised("product")
    if name == "DivExpression":
        c = _const_scalar(e.args[1], ctx)
        if c is None or ctx.decide(_is_zero, c):
            raise NotRecognised("division")
        return _scaled_lazily(_recognise_scalar(e.args[0], ctx), ctx.op(_inverse, c), ctx)
    if name == "Sum" and e.attr("axis") is None:
        return _recognise_sum(e.args[0], ctx, np.ones(e.args[0].size))
    if name in ("logistic", "exp", "power", "PowerApprox", "huber") and e.size == 1:
        return _recognise_sum(e, ctx, np.ones(1))
    if name == "quad_over_lin":
        y = _const_scalar(e.args[1], ctx)
        if y is None or ctx.decide(_not_positive, y):
            raise NotRecognised("quad_over_lin")
        p = _affine_map(e.args[0], ctx)
        A = _dense_or_sparse(p.A, ctx)
        return GLMFunction(N, [_term(ctx, "square", A, p.b, ctx.op(_full_inverse, p.m, y))])
    if name in ("quad_form", "QuadForm"):
        x, P = e.args
        if not P.constant or P.params:
            raise NotRecognised("quad_form")
        Pv = _const_value(P, ctx)
        Pv = Pv.toarray() if _sparse(Pv) else Pv
        p = _affine_map(x, ctx)
        # the symmetric part (P itself when symmetric: 0.5 (2 P) is P to the bit)
        Ps = Pv if ctx.noted(is_symmetric(Pv)) else 0.5 * (Pv + Pv.T)
        cols = _selected_columns(p.A, ctx)
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
            Q = Q.toarray() if _sparse(Q) else Q
        q = 2.0 * (APs @ p.b)  # (the same numbers as (2 APs) b: a power of two)
        # (a placed Ps is symmetric; A^T Ps A computed as products may not be, to the bit)
        return GLMFunction(N, Q=Q, q=q, r=float(p.b @ Ps @ p.b), Q_symmetric=cols is not None)
    raise NotRecognised(f"scalar atom {name}")


def _recognise_sum(e: Node, ctx: Reading, weights: np.ndarray) -> GLMFunction:
    """GLM form of ``sum(weights * expr)`` for an elementwise ``expr``."""
    N = ctx.N
    name = e.name
    if e.affine:
        p = _affine_map(e, ctx)
        w = ctx.op(np.broadcast_to, weights, (p.m,))
        return GLMFunction(N, q=ctx.op(_tmatvec, p.A, w), r=ctx.op(_dot, w, p.b))
    if name == "AddExpression":
        out = GLMFunction(N)
        for a in e.args:
            if a.size != e.size:
                raise NotRecognised("broadcast in sum")
            out = out.plus(_recognise_sum(a, ctx, weights), ctx)
        return out
    if name == "NegExpression":
        return _recognise_sum(e.args[0], ctx, ctx.op(operator.neg, weights))
    if name == "multiply":
        left, right = e.args
        const, other = (left, right) if left.constant else (right, left)
        if not const.constant or const.params:
            raise NotRecognised("product")
        c = ctx.op(_flat_dense, ctx.value(const))
        if c.size not in (1, other.size) or other.size != e.size:
            raise NotRecognised("broadcast multiply")
        return _recognise_sum(other, ctx, ctx.op(operator.mul, weights, c))
    if name in ("MulExpression",) and e.args[0].size == 1:
        c = _const_scalar(e.args[0], ctx)
        if c is not None:
            return _recognise_sum(e.args[1], ctx, ctx.op(operator.mul, weights, c))
    if name == "DivExpression":
        c = _const_scalar(e.args[1], ctx)
        if c is None or ctx.decide(_is_zero, c):
            raise NotRecognised("division")
        return _recognise_sum(e.args[0], ctx, ctx.op(operator.truediv, weights, c))
    kind, M = None, 1.0
    if name == "logistic":
        kind = "logistic"
    elif name == "exp":
        kind = "exp"
    elif name in ("power", "PowerApprox"):  # cp.square builds PowerApprox in cvxpy >= 1.6
        p = e.attr("p")
        if float(np.asarray(getattr(p, "value", p))) == 2.0:
            kind = "square"
    elif name == "huber":
        kind = "huber"
        M = e.attr("M")
        M = float(np.asarray(getattr(M, "value", M)))
    if kind is None:
        raise NotRecognised(f"elementwise atom {name}")
    arg, sign = e.args[0], 1.0
    if arg.name == "NegExpression":  # phi(-(X w)): keep X, not a negated copy
        arg, sign = arg.args[0], -1.0
    p = _affine_map(arg, ctx)
    w = ctx.op(_broadcast_copy, p.m, weights)
    A = _dense_or_sparse(p.A, ctx)
    return GLMFunction(N, [_term(ctx, kind, A, ctx.op(operator.mul, sign, p.b), w, M, sign)])


def recognise_components(expr: cp.Expression, layout: VariableLayout) -> list[GLMFunction]:
    """GLM form of each component of a (stacked) constraint vector, in 'F' order."""
    leaves: list = []
    return recognise_node_components(node_of(expr, leaves), Reading(leaves, layout))


def recognise_node_components(e: Node, ctx: Reading) -> list[GLMFunction]:
    """:func:`recognise_components` of the expression read as ``e`` with ``ctx``'s leaves."""
    if e.affine:
        p = _affine_map(e, ctx)
        A = ctx.op(_dense, p.A)
        return [
            GLMFunction(ctx.N, q=ctx.op(_row_copy, A, j), r=ctx.op(_item, p.b, j))
            for j in range(p.m)
        ]
    name = e.name
    if e.size == 1:
        inner = e.args[0] if name == "reshape" else e
        return [recognise_node(inner, ctx)]
    if name == "Hstack":
        out = []
        for a in e.args:
            a = a.args[0] if a.name == "reshape" and a.args[0].ndim <= 1 else a
            out.extend(recognise_node_components(a, ctx))
        return out
    if name == "reshape" and e.args[0].ndim <= 1:
        return recognise_node_components(e.args[0], ctx)
    raise NotRecognised(f"vector constraint {name}")
