"""Many parties' proximal subproblems of GLM form, solved together.

A cohort is a group of parties whose objectives have the same structure (the same GLM
terms, kind by kind, over the same variables; dense data) and no constraints: client
``i`` of a cohort minimises

    F_i(x) = f_i(x) + (s_i / 2) ||x - c_i||^2,
    f_i(x) = sum_t sum_k w_itk phi_t(s_t (A_it x + b_it)_k) + x^T Q_i x / 2 + q_i^T x + r_i

(:class:`~fedmodel.compiler.glm.GLMFunction`). :class:`GLMCohort` stacks the parties'
data once (each party's ``A_it`` padded with zero-weight rows to its own
:func:`block_rows`, the parties of one padded row count in one block, the blocks one
after another in the cohort's own order of its clients; what it takes and returns is
client by client) and runs one
Newton iteration for every client of the cohort at a time: the images, the gradients and
the Hessians are batched products (each term's ``phi`` evaluated once per point, its
second derivatives kept for the Hessian there), the Newton systems one batched Cholesky
solve (:func:`spd_factor`, :func:`spd_substitute`), and each client keeps its own Armijo
step and stops on its own residual ``||grad F_i(x_i)||_inf <= tol``. A client whose last
step was a full step after which one more step with the same Cholesky factor is expected
to reach its tolerance (:data:`CHORD_MARGIN`) takes that step (a chord step: no new
Hessian), any other client a new Hessian and factor; the stopping test is the same. When every
term has a constant second derivative (least squares) the Hessians do not depend on the
point: a cohort of few variables (:data:`SUBSTITUTION_SIZE`) keeps the inverses of
``hess f_i + s_i I`` (:func:`spd_inverse`, from Cholesky factors) for the last vectors
of proximal weights it was given, and a Newton step is one batched matrix-vector product
(an exact-admm run changes ``s_i`` only when its penalty changes); such a cohort's ``f_i``
is quadratic, its value and gradient one more product with the Hessian (from ``f_i(0)``
and its gradient there). The arithmetic is the per-client Newton method's but for the
chord steps and the order of summation (the results agree to the tolerance, not bit for
bit). A cohort keeps the points its last
solve returned (or those :meth:`GLMCohort.keep_point` evaluated at: a prox-al client's
start point, its first exact-admm step's) with ``f_i``, its gradient and second
derivatives there: the next solve that starts from exactly those points (an exact-admm
client starts from its last step's point) takes them instead of evaluating ``f_i`` again,
the same numbers, and so does :meth:`GLMCohort.value_grad` there.

Examples
--------
>>> import numpy as np
>>> from fedmodel.compiler.glm import GLMFunction, GLMTerm
>>> rng = np.random.default_rng(0)
>>> forms = [GLMFunction(3, [GLMTerm("logistic", rng.normal(size=(m, 3)), np.zeros(m),
...                                  np.full(m, 1.0 / m))]) for m in (4, 6)]
>>> cohort = GLMCohort(forms)
>>> out = cohort.prox(np.zeros((2, 3)), np.array([1.0, 2.0]), np.zeros((2, 3)), tol=1e-10)
>>> bool((out.residual <= 1e-10).all())
True
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from operator import attrgetter

import numpy as np

from fedmodel.compiler.glm import GLMFunction, dense_data, phi, phi_d2, row_count

#: the GLM kinds whose second derivative is a constant (``phi_d2``): a cohort of only
#: these has Hessians that do not depend on the point
CONSTANT_CURVATURE = frozenset({"square"})

#: inverses of a constant-curvature cohort kept, one per vector of proximal weights
#: (least recently used dropped first)
KEPT_INVERSES = 2

#: a client whose last Newton step was a full step that cut its residual from ``r_0`` to
#: ``r_1`` takes its next step with the same Cholesky factor (a chord step: near the
#: minimiser the Hessian changes little between two steps, and a new one with its factor
#: costs more than the substitutions) when ``r_1 (r_1 / r_0)`` times this margin is at most
#: its tolerance: one chord step, contracting up to this many times less than the last
#: step did, is expected to end its solve; any other step (a backtracked one included) is
#: followed by a new Hessian
CHORD_MARGIN = 4.0

#: the share of a cohort's clients still iterating from which a Newton iteration computes
#: on the whole cohort's data and picks their rows (each row's numbers are the same): below
#: it their data is copied out first
WIDE_SHARE = 0.5

#: the most variables :func:`spd_solve` and :func:`spd_inverse` handle by Cholesky factors
#: and batched substitution (one numpy call per variable for all the matrices); above it
#: one LAPACK LU call per matrix costs less, and a constant-curvature cohort keeps no
#: inverses (inverting costs several solves)
SUBSTITUTION_SIZE = 24


def spd_inverse(H: np.ndarray, shift: np.ndarray) -> np.ndarray:
    """``(H_i + shift_i I)^{-1}`` for every ``i`` (``H``: (k, n, n) symmetric positive
    semidefinite, ``shift``: (k,) positive), from the Cholesky factor ``L_i`` as
    ``L_i^{-T} L_i^{-1}`` (``L_i^{-1}`` by forward substitution, one row at a time for all
    ``i``); by LU (``numpy.linalg.inv``) for more than :data:`SUBSTITUTION_SIZE` variables
    (one LAPACK call per matrix then costs less than ``n`` batched steps) and when a
    factorisation fails to rounding.

    Examples
    --------
    >>> H = np.array([[[2.0, 1.0], [1.0, 2.0]]])
    >>> bool(np.allclose(spd_inverse(H, np.array([1.0]))[0] @ (H[0] + np.eye(2)), np.eye(2)))
    True
    """
    k, n, _ = H.shape
    M = np.array(H, dtype=float)
    M.reshape(k, n * n)[:, :: n + 1] += shift[:, None]
    if n > SUBSTITUTION_SIZE:
        return np.linalg.inv(M)
    try:
        L = np.linalg.cholesky(M)
    except np.linalg.LinAlgError:
        return np.linalg.inv(M)
    # row j of L^{-1}: (e_j - L[j, :j] L^{-1}[:j, :j+1]) / L[j, j], written over row j of
    # L (which no later row reads): no second array
    for j in range(n):
        row = -np.matmul(L[:, j : j + 1, :j], L[:, :j, : j + 1])[:, 0, :]
        row[:, j] += 1.0
        L[:, j, : j + 1] = row / L[:, j, j : j + 1]
    return np.matmul(L.transpose(0, 2, 1), L, out=M)


def spd_factor(M: np.ndarray) -> np.ndarray | None:
    """The Cholesky factors ``L_i`` of ``M_i`` (``M``: (k, n, n) symmetric positive
    definite) for :func:`spd_substitute`; None for more than :data:`SUBSTITUTION_SIZE`
    variables and when a factorisation fails to rounding (:func:`spd_solve` then solves by
    LU)."""
    if M.shape[-1] > SUBSTITUTION_SIZE:
        return None
    try:
        return np.linalg.cholesky(M)
    except np.linalg.LinAlgError:
        return None


def spd_substitute(L: np.ndarray, G: np.ndarray) -> np.ndarray:
    """``(L_i L_i^T)^{-1} g_i`` for every ``i`` (``L``: (k, n, n) lower triangular from
    :func:`spd_factor`, ``G``: (k, n)): forward and back substitution one unknown at a time
    for all ``i``."""
    n = G.shape[1]
    Y = np.empty_like(G)
    for j in range(n):  # L y = g (each step's sum written over, then divided into Y)
        s = np.einsum("ij,ij->i", L[:, j, :j], Y[:, :j])
        np.divide(np.subtract(G[:, j], s, out=s), L[:, j, j], out=Y[:, j])
    for j in range(n - 1, -1, -1):  # L^T x = y (x in place of y)
        s = np.einsum("ij,ij->i", L[:, j + 1 :, j], Y[:, j + 1 :])
        np.divide(np.subtract(Y[:, j], s, out=s), L[:, j, j], out=Y[:, j])
    return Y


def spd_solve(M: np.ndarray, G: np.ndarray) -> np.ndarray:
    """``M_i^{-1} g_i`` for every ``i`` (``M``: (k, n, n) symmetric positive definite,
    ``G``: (k, n)): the Cholesky factors (:func:`spd_factor`), then forward and back
    substitution (:func:`spd_substitute`); by LU (``numpy.linalg.solve``) for more than
    :data:`SUBSTITUTION_SIZE` variables and when a factorisation fails to rounding.

    Examples
    --------
    >>> M = np.array([[[2.0, 1.0], [1.0, 2.0]]])
    >>> spd_solve(M, np.array([[3.0, 3.0]]))
    array([[1., 1.]])
    """
    L = spd_factor(M)
    return spd_substitute(L, G) if L is not None else _lu_solve(M, G)


def _lu_solve(M: np.ndarray, G: np.ndarray) -> np.ndarray:
    """``M_i^{-1} g_i`` for every ``i`` by LU (one LAPACK call per matrix)."""
    return np.linalg.solve(M, G[:, :, None])[:, :, 0]


#: every row of an array
_ALL = slice(None)


def _rows(a: np.ndarray | None, idx: np.ndarray) -> np.ndarray | None:
    """The rows ``idx`` of ``a`` (None stays None)."""
    return None if a is None else a[idx]


class NotStackable(ValueError):
    """The parties' objectives cannot be stacked into one cohort (the message says why)."""


@dataclass
class _Block:
    """The clients of one term whose rows are padded to the same :func:`block_rows`:
    ``at`` their positions in the cohort (a slice when they are consecutive, ``slice(None)``
    when they are all of it: ``whole``), ``A`` (clients, rows, n), ``b`` and ``w``
    (clients, rows); padding rows have weight 0."""

    at: np.ndarray | slice
    A: np.ndarray
    b: np.ndarray
    w: np.ndarray
    whole: bool = field(init=False)

    def __post_init__(self) -> None:
        self.whole = isinstance(self.at, slice) and self.at == _ALL

    def of(self, X: np.ndarray) -> np.ndarray:
        """The rows of ``X`` of its clients: ``X`` itself for a whole block, else
        C-contiguous (a view when ``X`` is): the products take the same kernels whether
        the clients' rows are consecutive or not."""
        return X if self.whole else np.ascontiguousarray(X[self.at])


@dataclass
class _StackedTerm:
    """One GLM term of every client, in blocks of one row count (a sign ``s = -1`` kept in
    ``A``, then ``s = 1``: negating is exact); its weighted second
    derivatives are the columns ``offset:offset + rows`` of a cohort's curvature array
    (``rows`` the block's). ``block_of`` and ``within``: each client's block and its
    position there."""

    kind: str
    blocks: list[_Block]
    M: float
    s: float
    offset: int
    block_of: np.ndarray
    within: np.ndarray

    def images(self, blk: _Block, X: np.ndarray) -> np.ndarray:
        """``s A_i x_i + b_i`` for every client of ``blk`` (clients, rows)."""
        Z = np.matmul(blk.A, X[:, :, None])[:, :, 0]
        return (Z if self.s == 1.0 else self.s * Z) + blk.b

    def rmatvec(self, blk: _Block, V: np.ndarray) -> np.ndarray:
        """``s A_i^T v_i`` for every client of ``blk`` (clients, n)."""
        out = np.matmul(V[:, None, :], blk.A)[:, 0, :]
        return out if self.s == 1.0 else self.s * out

    def gram(self, blk: _Block, D: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """``s^2 A_i^T diag(d_i) A_i`` for every client of ``blk`` (clients, n, n), written
        to ``out`` when given."""
        G = np.matmul(blk.A.transpose(0, 2, 1), blk.A * D[:, :, None], out=out)
        return G if self.s == 1.0 else np.multiply(self.s * self.s, G, out=out)

    def subset(self, idx: np.ndarray) -> _StackedTerm:
        """The term of the clients ``idx`` (copies of their blocks' data)."""
        blocks = []
        block_of = np.empty(len(idx), dtype=int)
        within = np.empty(len(idx), dtype=int)
        owner = self.block_of[idx]
        for k, blk in enumerate(self.blocks):
            sel = np.flatnonzero(owner == k)
            if not sel.size:
                continue
            rows = self.within[idx[sel]]
            block_of[sel] = len(blocks)
            within[sel] = np.arange(sel.size)
            at = slice(None) if sel.size == len(idx) else sel
            blocks.append(_Block(at, blk.A[rows], blk.b[rows], blk.w[rows]))
        return _StackedTerm(self.kind, blocks, self.M, self.s, self.offset, block_of, within)


@dataclass
class BatchReport:
    """What a cohort's solve reached, client by client.

    Attributes
    ----------
    x : ndarray, shape (clients, n)
        The approximate minimisers.
    residual : ndarray, shape (clients,)
        ``||grad F_i(x_i)||_inf``, measured at ``x_i`` (never assumed).
    iterations : ndarray of int, shape (clients,)
        Newton iterations each client took.
    message : list of str
        ``"converged"``, ``"max_iter"`` or why the line search stopped, per client.
    """

    x: np.ndarray
    residual: np.ndarray
    iterations: np.ndarray
    message: list[str]


def padded_rows(rows: int) -> int:
    """The row count a term of ``rows`` rows is padded to in a cohort: the next power of
    two (a party's padding depends on its own data only).

    Examples
    --------
    >>> [padded_rows(m) for m in (1, 3, 20, 32, 33)]
    [1, 4, 32, 32, 64]
    """
    return 1 << max(int(rows) - 1, 0).bit_length()


def block_rows(rows: int) -> int:
    """The row count a term of ``rows`` rows is padded to in a cohort's arithmetic: the
    next multiple of an eighth of :func:`padded_rows` (at least one row), at most about a
    fourth more rows (a tenth on average) and a few blocks per cohort. It depends on the
    party's own data only.

    Examples
    --------
    >>> [block_rows(m) for m in (1, 3, 20, 25, 33, 41, 50)]
    [1, 3, 20, 28, 40, 48, 56]
    """
    return -(-int(rows) // max(padded_rows(rows) // 8, 1)) * max(padded_rows(rows) // 8, 1)


def glm_signature(f: GLMFunction, rows: bool = False) -> tuple:
    """The structure of ``f`` a cohort's parties share: variables, terms (kind, ``M``,
    sign; with ``rows``, also their :func:`padded_rows`) in order, and whether it has a
    quadratic part. Parties of one signature with ``rows`` share a cohort (their row
    counts differ a little); in it each term's rows are padded to the party's own
    :func:`block_rows`, so each party's numbers are the same in any cohort (every batched
    product and solve is done slice by slice on arrays of one shape per block)."""
    return (
        f.n,
        tuple(
            (t.kind, float(t.M), float(t.s)) + ((padded_rows(t.A.shape[0]),) if rows else ())
            for t in f.terms
        ),
        f.Q is not None,
    )


def _check_stackable(forms: list[GLMFunction]) -> tuple:
    """The :func:`glm_signature` ``forms`` share; NotStackable unless they share one and
    every term's data is dense: a few set comprehensions over the forms' attributes, and
    one :func:`glm_signature` per form only to name the first that differs."""
    first = glm_signature(forms[0])
    same = {f.n for f in forms} == {first[0]} and {f.Q is None for f in forms} == {
        forms[0].Q is None
    }
    same = same and {len(f.terms) for f in forms} == {len(first[1])}
    sparse = False
    for j, (kind, M, s) in enumerate(first[1] if same else ()):
        terms = [f.terms[j] for f in forms]
        same = (
            set(map(_KIND, terms)) == {kind}
            and {float(v) for v in set(map(_M, terms))} == {M}
            and {float(v) for v in set(map(_S, terms))} == {s}
        )
        if not same:
            break
        sparse = sparse or not all(map(dense_data, terms))
    if same and not sparse:
        return first
    for i, f in enumerate(forms):
        if glm_signature(f) != first:
            raise NotStackable(
                f"party {i} of the cohort has objective structure {glm_signature(f)}, the "
                f"first {first}"
            )
        if not all(map(dense_data, f.terms)):
            raise NotStackable(f"party {i} of the cohort has a term with sparse data")
    return first


_KIND, _M, _S = (attrgetter(name) for name in ("kind", "M", "s"))


def _row_counts(terms: list) -> np.ndarray:
    """The row count of each of ``terms`` (one term of every client)."""
    return np.fromiter(map(row_count, terms), dtype=int, count=len(terms))


def _block_widths(counts: np.ndarray) -> np.ndarray:
    """The :func:`block_rows` of each of the row counts ``counts`` (one call per distinct
    count)."""
    sizes, group = np.unique(counts, return_inverse=True)
    return np.array([block_rows(m) for m in sizes.tolist()], dtype=int)[group.reshape(-1)]


def _stack_term(
    terms: list, counts: np.ndarray, padded: np.ndarray, n: int, offset: int
) -> tuple[_StackedTerm, int]:
    """One term of every client (``terms``, dense, of one kind, ``M`` and sign; their row
    ``counts`` and :func:`_block_widths` ``padded``) stacked in blocks of one
    :func:`block_rows` (the columns ``offset:`` of a cohort's curvature array), with its
    width there: the clients' blocks and places are found by numpy, and each client's rows
    are copied straight to its place (negated there for ``s = -1``), each array read once
    and written once; a :class:`~fedmodel.compiler.glm.RowsTerm`'s product not yet made is
    written there instead (:meth:`~fedmodel.compiler.glm.DeferredRows.write`)."""
    size = len(terms)
    t0 = terms[0]
    widths, block_of = np.unique(padded, return_inverse=True)
    block_of = block_of.reshape(-1)
    members = np.bincount(block_of, minlength=widths.size)
    order = np.argsort(block_of, kind="stable")  # (the clients block by block)
    at_start = np.cumsum(members) - members
    within = np.empty(size, dtype=int)
    within[order] = np.arange(size) - np.repeat(at_start, members)
    shapes = [
        ((c, rows, n), (c, rows), (c, rows)) for c, rows in zip(members.tolist(), widths.tolist())
    ]
    arrays = iter(_zeros([shape for three in shapes for shape in three]))
    blocks = []
    for k, count in enumerate(members.tolist()):
        at = _positions(order[at_start[k] : at_start[k] + count], size)
        blocks.append(_Block(at, next(arrays), next(arrays), next(arrays)))
    negated = float(t0.s) == -1.0  # (the sign kept in A: the same numbers, exactly)
    for src, m, k, at in zip(terms, counts.tolist(), block_of.tolist(), within.tolist()):
        blk = blocks[k]
        A = src.__dict__.get("A")
        if A is None:  # (a RowsTerm's product not made: written here)
            src.rows.write(blk.A[at, :m], negated)
        elif negated:
            np.negative(A, out=blk.A[at, :m])
        else:
            blk.A[at, :m] = A
        blk.b[at, :m] = src.b
        blk.w[at, :m] = src.weights
    s = 1.0 if negated else float(t0.s)
    term = _StackedTerm(t0.kind, blocks, float(t0.M), s, offset, block_of, within)
    return term, int(widths[-1]) if widths.size else 0


def _zeros(shapes: list[tuple]) -> list[np.ndarray]:
    """Arrays of zeros of ``shapes``, views of one allocation, each starting a whole
    number of pages into it (a large allocation's pages come in fewer, larger pieces:
    it starts at a huge page's boundary)."""
    page = 512  # (float64s in 4 KiB)
    sizes = [-(-int(np.prod(shape)) // page) * page for shape in shapes]
    total = sum(sizes)
    huge = _HUGE_PAGE // 8 if total * 8 >= _HUGE_PAGE else 0
    arena = np.zeros(total + huge)
    at = (-arena.ctypes.data % _HUGE_PAGE) // 8 if huge else 0
    out = []
    for shape, size in zip(shapes, sizes):
        out.append(arena[at : at + int(np.prod(shape))].reshape(shape))
        at += size
    return out


#: the size of a huge page (bytes)
_HUGE_PAGE = 1 << 21


def _positions(at: np.ndarray, size: int) -> np.ndarray | slice:
    """The increasing positions ``at`` of a cohort of ``size`` clients as a slice when they
    are consecutive (``slice(None)``: all of them), else as they are."""
    if at.size and int(at[-1]) - int(at[0]) == at.size - 1:
        return _ALL if at.size == size else slice(int(at[0]), int(at[-1]) + 1)
    return at


def _block_order(padded: list[np.ndarray]) -> np.ndarray | None:
    """The clients block by block (``padded``: each term's :func:`_block_widths`, the first
    term's first; stable): None when they already are."""
    if not padded:
        return None
    order = np.lexsort(padded[::-1])
    return None if (order == np.arange(order.size)).all() else order


class GLMCohort:
    """The stacked objectives ``f_i`` of a cohort of parties (module docstring).

    Parameters
    ----------
    forms : sequence of GLMFunction
        One per client, all of the same structure: the same number of variables, the
        same terms in the same order (kind, ``M``, sign ``s``), each with dense data, and
        a quadratic part for all or for none.

    Raises
    ------
    NotStackable
        When the forms differ in structure or a term's data is sparse.
    """

    def __init__(self, forms: Sequence[GLMFunction]):
        forms = list(forms)
        if not forms:
            raise NotStackable("a cohort needs at least one party")
        #: the :func:`glm_signature` (without rows) of its clients' forms
        self.signature = _check_stackable(forms)
        self.size = len(forms)
        #: the cohort's own order of its clients, block by block (:func:`_block_order`: a
        #: block's data and results are then consecutive rows, no copies): its row ``r`` is
        #: client ``_order[r]``, client ``i`` its row ``_place[i]`` (None: the clients' order)
        terms = [[f.terms[j] for f in forms] for j in range(len(forms[0].terms))]
        counts = [_row_counts(ts) for ts in terms]
        padded = [_block_widths(c) for c in counts]
        self._order = order = _block_order(padded)
        self._place = None if order is None else np.argsort(order)
        if order is not None:
            rows = order.tolist()
            forms = [forms[i] for i in rows]
            terms = [[ts[i] for i in rows] for ts in terms]
            counts, padded = [c[order] for c in counts], [p[order] for p in padded]
        self.n = forms[0].n
        self.terms: list[_StackedTerm] = []
        #: the columns of the weighted second derivatives of all terms side by side
        self.width = 0
        for ts, c, p in zip(terms, counts, padded):
            term, width = _stack_term(ts, c, p, self.n, self.width)
            self.terms.append(term)
            self.width += width
        self.Q = None if forms[0].Q is None else np.stack([np.asarray(f.Q) for f in forms])
        qs = [f.q for f in forms]
        if all(q is None for q in qs):
            self.q = np.zeros((self.size, self.n))
        else:
            self.q = np.stack(
                [np.zeros(self.n) if q is None else np.asarray(q, dtype=float) for q in qs]
            )
        self.r = np.array([float(f.r) for f in forms])
        self._fixed_hessian: np.ndarray | None = None
        #: ``f_i(0)`` and its gradient, of a cohort that keeps inverses (:meth:`_evaluate`)
        self._at_zero: tuple[np.ndarray, np.ndarray] | None = None
        #: every term has a constant second derivative: the Hessians do not depend on the
        #: point, and (with at most :data:`SUBSTITUTION_SIZE` variables, where a batched
        #: solve costs far more than its arithmetic) the inverse of a vector of proximal
        #: weights is kept for later solves
        self.constant_curvature = all(t.kind in CONSTANT_CURVATURE for t in self.terms)
        self.keeps_inverses = self.constant_curvature and self.n <= SUBSTITUTION_SIZE
        self._inverses: OrderedDict[bytes, np.ndarray] = OrderedDict()
        #: the points the last :meth:`prox` returned (or :meth:`keep_point` was given), with
        #: ``f_i``, its gradient and weighted second derivatives there (a next solve that
        #: starts from them takes those instead of evaluating again)
        self._last_point: tuple | None = None

    # -- f_i ---------------------------------------------------------------------------------
    def value_grad(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``f_i(x_i)`` (clients,) and ``grad f_i(x_i)`` (clients, n) for the rows of ``X``:
        copies of the values :meth:`keep_point` keeps when ``X`` is exactly its points."""
        X = self._own(X)
        last = self._at_last_point(X)
        if last is not None:
            vals, G = last[0].copy(), last[1].copy()
        else:
            vals, G, _ = self._evaluate(X, curvature=False)
        return self._theirs(vals), self._theirs(G)

    def keep_point(self, X: np.ndarray) -> None:
        """Evaluate ``f_i``, its gradient and its weighted second derivatives at the rows of
        ``X`` and keep them as the last points (:meth:`prox` then takes them when it starts
        there, :meth:`value_grad` returns them there): the same numbers as evaluating
        again."""
        X = np.array(X, dtype=float) if self._order is None else self._own(X)
        vals, G, K = self._evaluate(X, curvature=True)
        self._last_point = (X, vals, G, K)

    def _at_last_point(self, X: np.ndarray) -> tuple | None:
        """``f_i``, its gradient and weighted second derivatives kept at the last points
        when ``X`` (in the cohort's own order) is exactly those points; None otherwise."""
        last = self._last_point
        if last is None:
            return None
        kept = last[0]
        same_layout = (kept.shape, kept.strides, kept.dtype) == (X.shape, X.strides, X.dtype)
        return last[1:] if same_layout and kept.tobytes() == X.tobytes() else None

    def _own(self, a: np.ndarray) -> np.ndarray:
        """The rows of ``a`` (one per client) in the cohort's own order (the methods whose
        names start with an underscore take and return rows in that order), a new array
        of ``a``'s memory layout (the same arithmetic kernels as on ``a``)."""
        if self._order is None:
            return a
        a = np.asarray(a)
        return np.take(a, self._order, axis=0, out=np.empty_like(a), mode="clip")

    def _theirs(self, a: np.ndarray) -> np.ndarray:
        """The rows of ``a`` (in the cohort's own order) client by client."""
        return a if self._place is None else a[self._place]

    def _evaluate(
        self, X: np.ndarray, curvature: bool
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """:meth:`value_grad` and, with ``curvature`` (and a Hessian that depends on the
        point), the weighted second derivatives ``w_itk phi_t''`` of every term's rows,
        the terms side by side (clients, rows of all terms), from the same evaluation of
        each ``phi_t`` (:meth:`hessian` takes them). A cohort that keeps inverses
        (``f_i`` quadratic, few variables) takes ``f_i(x) = f_i(0) + x^T (g_i + H_i x / 2)``,
        ``grad f_i(x) = g_i + H_i x`` from ``f_i(0)``, its gradient ``g_i`` there (each
        evaluated once from the terms) and its Hessian ``H_i``: one batched
        matrix-vector product instead of two passes over the data."""
        if self.keeps_inverses:
            if self._at_zero is None:
                self._at_zero = self._evaluate_terms(np.zeros((self.size, self.n)), False)[:2]
            if self._fixed_hessian is None:
                self._hessian(X)
            f0, g0 = self._at_zero
            HX = np.matmul(self._fixed_hessian, X[:, :, None])[:, :, 0]
            return f0 + np.einsum("in,in->i", X, g0 + 0.5 * HX), g0 + HX, None
        return self._evaluate_terms(X, curvature)

    def _evaluate_terms(
        self, X: np.ndarray, curvature: bool
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """:meth:`_evaluate` from the terms: each ``phi_t`` at every row's image."""
        vals = self.r.copy()
        G = self.q.copy()
        vals += np.einsum("in,in->i", self.q, X)
        curvature = curvature and not self.constant_curvature
        K = np.empty((len(X), self.width)) if curvature else None
        for t in self.terms:
            for blk in t.blocks:
                out = phi(t.kind, t.images(blk, blk.of(X)), t.M, order=2 if curvature else 1)
                v = np.einsum("im,im->i", blk.w, out[0])
                g = t.rmatvec(blk, blk.w * out[1])
                if blk.whole:
                    vals += v
                    G += g
                else:
                    vals[blk.at] += v
                    G[blk.at] += g
                if curvature:
                    K[blk.at, t.offset : t.offset + blk.w.shape[1]] = blk.w * out[2]
        if self.Q is not None:
            QX = np.einsum("inp,ip->in", self.Q, X)
            vals += 0.5 * np.einsum("in,in->i", X, QX)
            G += QX
        return vals, G, K

    def hessian(self, X: np.ndarray) -> np.ndarray:
        """``hess f_i(x_i)`` (clients, n, n) for the rows of ``X``."""
        return self._theirs(self._hessian(self._own(X)))

    def _hessian(self, X: np.ndarray, curvature: np.ndarray | None = None) -> np.ndarray:
        """:meth:`hessian`, from the weighted second derivatives at ``X`` when given
        (``curvature``, as :meth:`_evaluate` returns them). When every term is a square (a
        constant second derivative), the Hessians do not depend on ``X``: they are computed
        once and copied after."""
        if self._fixed_hessian is not None:
            return self._fixed_hessian.copy()
        H = np.empty((len(X), self.n, self.n)) if self.Q is None else self.Q.copy()
        empty = self.Q is None  # (the first term's blocks are assigned, later ones added)
        if empty and not self.terms:
            H[:] = 0.0
        for t in self.terms:
            for blk in t.blocks:
                if curvature is None:  # (a constant second derivative needs no images)
                    z = blk.b if t.kind in CONSTANT_CURVATURE else t.images(blk, blk.of(X))
                    d = blk.w * phi_d2(t.kind, z, t.M)
                else:
                    d = curvature[blk.at, t.offset : t.offset + blk.w.shape[1]]
                if empty and isinstance(blk.at, slice):  # (consecutive rows: written there)
                    t.gram(blk, d, out=H[blk.at])
                elif empty:
                    H[blk.at] = t.gram(blk, d)
                elif blk.whole:
                    H += t.gram(blk, d)
                else:
                    H[blk.at] += t.gram(blk, d)
            empty = False
        if self.constant_curvature:
            self._fixed_hessian = H.copy()
        return H

    def _fixed_inverse(self, weights: np.ndarray) -> np.ndarray:
        """``(hess f_i + weights_i I)^{-1}`` of a constant-curvature cohort, for all its
        clients: a function of the weights alone, computed once per vector of weights."""
        key = weights.tobytes()
        M = self._inverses.get(key)
        if M is None:
            if self._fixed_hessian is None:
                self._hessian(np.zeros((self.size, self.n)))
            M = spd_inverse(self._fixed_hessian, weights)
            self._inverses[key] = M
            while len(self._inverses) > KEPT_INVERSES:
                self._inverses.popitem(last=False)
        else:
            self._inverses.move_to_end(key)
        return M

    def subset(self, idx: np.ndarray) -> GLMCohort:
        """The cohort of the clients ``idx`` (copies of their stacked data), in that order."""
        idx = np.asarray(idx, dtype=int)
        return self._subset(idx if self._place is None else self._place[idx])

    def _subset(self, idx: np.ndarray) -> GLMCohort:
        """The cohort of the rows ``idx`` (of its own order), in that order."""
        sub = object.__new__(GLMCohort)
        sub.size, sub.n, sub.signature = len(idx), self.n, self.signature
        sub._order = sub._place = None
        sub.terms = [t.subset(idx) for t in self.terms]
        sub.width = self.width
        sub.Q = None if self.Q is None else self.Q[idx]
        sub.q, sub.r = self.q[idx], self.r[idx]
        fixed = self._fixed_hessian
        sub._fixed_hessian = None if fixed is None else fixed[idx]
        sub._at_zero = None if self._at_zero is None else tuple(a[idx] for a in self._at_zero)
        sub.constant_curvature = self.constant_curvature
        sub.keeps_inverses = self.keeps_inverses
        sub._inverses = OrderedDict()
        sub._last_point = None
        return sub

    # -- the proximal subproblems --------------------------------------------------------------
    def prox(
        self,
        centers: np.ndarray,
        weights: np.ndarray,
        x0: np.ndarray,
        tol: float | np.ndarray,
        max_iter: int = 50,
        deadline: float | None = None,
    ) -> BatchReport:
        """Minimise ``F_i(x) = f_i(x) + (weights_i / 2) ||x - centers_i||^2`` for every
        client ``i`` by Newton's method with an Armijo line search, from ``x0``.

        Parameters
        ----------
        centers, x0 : ndarray, shape (clients, n)
        weights : ndarray, shape (clients,)
            The proximal weights ``s_i > 0`` (each ``F_i`` is then strongly convex).
        tol : float or ndarray, shape (clients,)
            Each client stops once ``||grad F_i(x_i)||_inf <= tol_i``.
        max_iter : int
            Newton iterations at most, per client.
        deadline : float, optional
            A ``time.perf_counter()`` value after which no Newton iteration starts (the
            clients still iterating return the points they reached, message
            ``"time limit"``).
        """
        C = np.asarray(centers, dtype=float)
        S = np.asarray(weights, dtype=float)
        X = np.asarray(x0, dtype=float)
        tol = np.broadcast_to(np.asarray(tol, dtype=float), (self.size,))
        if C.shape != (self.size, self.n) or X.shape != (self.size, self.n):
            raise ValueError(f"centers and x0 must have shape {(self.size, self.n)}")
        if S.shape != (self.size,) or not np.all(S > 0):
            raise ValueError("weights must hold one positive proximal weight per client")
        # (the rows in the cohort's own order; X its own copy, of x0's memory layout)
        C, S, tol = self._own(C), self._own(S), self._own(tol)
        X = np.array(X) if self._order is None else self._own(X)

        def objective(cohort: GLMCohort, Xs, Cs, Ss, f=None):
            v, G, K = cohort._evaluate(Xs, curvature=True) if f is None else f
            D = Xs - Cs
            return v + 0.5 * Ss * np.einsum("in,in->i", D, D), G + Ss[:, None] * D, v, G, K

        # (f, its gradient and curvature at the last points, the last solve's or those
        # keep_point evaluated at, when it starts there: their arrays, this solve's from now on)
        known = self._at_last_point(X)
        self._last_point = None
        vals, G, F, GF, K = objective(self, X, C, S, known)
        gnorm = np.abs(G).max(axis=1, initial=0.0)
        iters = np.zeros(self.size, dtype=int)
        notes: dict[int, str] = {}  # (the rows that did not converge: why)
        searched_out = np.zeros(self.size, dtype=bool)  # (its line search failed)
        active = np.flatnonzero(gnorm > tol)
        # each client's Cholesky factor of its last new Hessian (``factored``: it has one)
        # and whether its next step takes it again (``chord``)
        factors: np.ndarray | None = None
        factored = np.zeros(self.size, dtype=bool)
        chord = np.zeros(self.size, dtype=bool)
        while active.size:
            if deadline is not None and time.perf_counter() > deadline:
                for i in active:
                    notes[i] = "time limit"
                break
            stalled = active[iters[active] >= max_iter]
            for i in stalled:
                notes[i] = "max_iter"
            active = active[iters[active] < max_iter]
            if not active.size:
                break
            every = active.size == self.size  # (then the whole arrays, no copies)
            # most of them (WIDE_SHARE): the whole cohort's data, their rows picked from
            # its results (no copy of their data; each row's numbers are the same)
            wide = not every and active.size >= WIDE_SHARE * self.size
            sub = self if every or wide else self._subset(active)
            if every:
                Xa, Ca, Sa, Ga, va, Ka = X, C, S, G, vals, K
                gna = gnorm.copy()  # (gnorm's rows are updated in place below)
            else:
                Xa, Ca, Sa, Ga = X[active], C[active], S[active], G[active]
                va, gna = vals[active], gnorm[active]
                Ka = None if K is None else K[active]
            if self.keeps_inverses:  # (the Hessians' inverses kept for these weights)
                inverse = self._fixed_inverse(S)
                inverse = inverse if every else inverse[active]
                step = -np.matmul(inverse, Ga[:, :, None])[:, :, 0]
            else:
                reuse = chord[active]
                step = np.empty_like(Ga)
                fresh = np.flatnonzero(~reuse)
                if fresh.size:  # (a new Hessian and its factor)
                    whole = fresh.size == active.size
                    if wide and 2 * fresh.size >= active.size:  # (every Hessian, rows picked)
                        H = self._hessian(X, K)[active[fresh]]
                    elif whole or 2 * fresh.size < active.size:
                        if wide:  # (a few of them: their data copied out)
                            part = self._subset(active[fresh])
                        else:
                            part = sub if whole else sub._subset(fresh)
                        H = part._hessian(
                            Xa if whole else Xa[fresh], Ka if whole else _rows(Ka, fresh)
                        )
                    else:  # (most of them: every Hessian, no copy of their data)
                        H = sub._hessian(Xa, Ka)[fresh]
                    H.reshape(len(H), -1)[:, :: self.n + 1] += (Sa if whole else Sa[fresh])[:, None]
                    L = spd_factor(H)
                    Gf = Ga if whole else Ga[fresh]
                    if L is None:
                        step[fresh] = -_lu_solve(H, Gf)
                    else:
                        step[fresh] = -spd_substitute(L, Gf)
                        if L.shape[0] == self.size:
                            factors = L
                        else:
                            if factors is None:
                                factors = np.empty((self.size, self.n, self.n))
                            factors[active[fresh]] = L
                    factored[active[fresh]] = L is not None
                if fresh.size < active.size:  # (the factor of an earlier step, kept)
                    old = np.flatnonzero(reuse)
                    at = active[old]
                    Lk = factors if at.size == self.size else factors[at]
                    step[old] = -spd_substitute(Lk, Ga[old])
            slope = np.einsum("in,in->i", Ga, step)
            t = np.ones(active.size)
            new_X = Xa + step
            if wide:  # (every client's point, the others' unmoved; their rows picked)
                moved = X.copy()
                moved[active] = new_X
                out = objective(self, moved, C, S)
                new_v, new_G, new_F, new_GF, new_K = (_rows(a, active) for a in out)
            else:
                new_v, new_G, new_F, new_GF, new_K = objective(sub, new_X, Ca, Sa)
            todo = new_v > va + 1e-4 * t * slope
            # at machine precision the value cannot resolve the decrease: a full step that
            # still reduces the gradient is taken (as the per-client method does)
            flat = new_v - va <= 1e-13 * np.maximum(1.0, np.abs(va))
            todo &= ~(flat & (np.abs(new_G).max(axis=1) < gna))
            while todo.any():
                t[todo] *= 0.5
                idx = np.flatnonzero(todo)
                trial = Xa[idx] + t[idx, None] * step[idx]
                part = self._subset(active[idx]) if wide else sub._subset(idx)
                v2, g2, f2, gf2, k2 = objective(part, trial, Ca[idx], Sa[idx])
                new_X[idx], new_v[idx], new_G[idx] = trial, v2, g2
                new_F[idx], new_GF[idx] = f2, gf2
                if k2 is not None:
                    new_K[idx] = k2
                ok = v2 <= va[idx] + 1e-4 * t[idx] * slope[idx]
                todo[idx[ok]] = False
                tiny = t[idx] < 1e-10
                for k in idx[~ok & tiny]:
                    notes[active[k]] = "line search failed (at machine precision?)"
                    searched_out[active[k]] = True
                todo[idx[~ok & tiny]] = False
            failed = searched_out[active]
            keep = ~failed | (new_v <= va)
            iters[active] += 1
            if every and keep.all():  # (every client moves: the new arrays replace the old)
                X, vals, G, F, GF, K = new_X, new_v, new_G, new_F, new_GF, new_K
                gnorm = np.abs(G).max(axis=1, initial=0.0)
            else:
                upd = active[keep]
                X[upd], vals[upd], G[upd] = new_X[keep], new_v[keep], new_G[keep]
                F[upd], GF[upd] = new_F[keep], new_GF[keep]
                if K is not None:
                    K[upd] = new_K[keep]
                gnorm[upd] = np.abs(G[upd]).max(axis=1, initial=0.0)
            if not self.keeps_inverses:  # (a full step that cut the residual enough)
                r = gnorm[active]
                ends = (t == 1.0) & (r * (r / gna) * CHORD_MARGIN <= tol[active])
                chord[active] = factored[active] & ends
            active = active[~failed & (gnorm[active] > tol[active])]
        message = ["converged"] * self.size
        for i, note in notes.items():
            message[int(i) if self._order is None else int(self._order[i])] = note
        # (F, GF, K: this solve's own arrays, the next solve's when it starts at X)
        if self._place is None:
            self._last_point = (X.copy(), F, GF, K)
            return BatchReport(X, gnorm, iters, message)
        self._last_point = (X, F, GF, K)
        place = self._place
        return BatchReport(X[place], gnorm[place], iters[place], message)
