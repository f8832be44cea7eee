"""The pooled problem as Clarabel's data, built from the package's own forms (no cvxpy).

``centralized`` sends epigraph, conic and other non-smooth models to Clarabel. Through
cvxpy that meant canonicalising the pooled problem (``get_problem_data``: on a model of a
few hundred rows about as long as the whole plain Clarabel solve it is compared with, and
on sparse logistic regression at d = 3000 seconds that no time limit could interrupt).
Here the data is read off what the compiler already holds, every piece affine or of
generalised-linear form (:mod:`fedmodel.compiler.glm`):

* objective: each party's terms recognised by :func:`~fedmodel.compiler.glm.recognise_scalar`
  -- linear and quadratic parts into ``q`` and ``P``; ``square`` terms as ``A^T W A`` (or,
  when that Gram matrix would be denser than the data, lifted: ``r = A x + b`` with ``W``
  on ``r``'s diagonal); ``logistic`` and ``exp`` terms in exponential cones, three
  auxiliaries per row (``t >= log(1 + e^z)`` as ``u + v <= 1``, ``(z - t, 1, u)`` and
  ``(-t, 1, v)`` in ``K_exp``);
* the parties' inequality and equality constraints, all affine (epigraph pieces and the
  user's affine constraints), as ``R_+`` and ``{0}`` rows;
* their cone constraints ``E(x) in K`` (:mod:`fedmodel.dsl.conic`: ``R_+``, ``{0}``,
  second-order, exponential and 3-d power cones) with ``E``'s affine map;
* ``h``: ``norm1`` (auxiliaries ``u >= |x|``), ``sum_squares`` (``P``'s diagonal),
  ``norm2`` and a ball (second-order cones), bounds (``R_+`` rows).

Anything else (a quadratic or other nonlinear constraint, a smooth term without GLM form
such as ``kl_div``, a PSD cone, huber) raises :class:`NotDirect` and the caller compiles
with cvxpy as before. Clarabel's dual ``z`` of a block is its multiplier in the package's
sign convention (``grad f + J_c^T mu + J_a^T nu - J_E^T lambda = 0``), so the certificate
(:func:`fedmodel.algorithms.centralized.cprox_al.pooled_evaluation`) is computed from the
point and multipliers exactly as for a cvxpy solve; the auxiliaries added here are not
the model's and are dropped.

Example
-------
>>> import cvxpy as cp, numpy as np, fedmodel as fm
>>> m = fm.Model()
>>> w = m.variable(3, name="w")
>>> X, y = np.eye(4, 3), np.arange(4.0)
>>> c = m.client("a")
>>> c.minimize(cp.sum(cp.abs(c.data(X) @ w - c.data(y))))
>>> data = build_conic_data(m.compile())
>>> data.A.shape[1], len(data.parties)  # (w and the 4 epigraph auxiliaries; server, a)
(7, 2)
>>> solve_direct(data, {}).status
'optimal'
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp

from fedmodel.compiler.glm import (
    NotRecognised,
    affine_map,
    recognise_components,
    recognise_scalar,
)
from fedmodel.compiler.partition import CompiledModel

#: Clarabel's status -> cvxpy's status string (as cvxpy's own Clarabel interface maps it)
STATUS = {
    "Solved": "optimal",
    "AlmostSolved": "optimal_inaccurate",
    "PrimalInfeasible": "infeasible",
    "AlmostPrimalInfeasible": "infeasible_inaccurate",
    "DualInfeasible": "unbounded",
    "AlmostDualInfeasible": "unbounded_inaccurate",
    "MaxIterations": "user_limit",
    "MaxTime": "user_limit",
}

#: Clarabel's statuses of a solve stopped by the time limit (its own, or the callback's)
STOPPED = ("MaxTime", "CallbackTerminated")

#: a dense quadratic part (``quad_form``) is taken up to this many variables
DENSE_Q_MAX = 3000


class NotDirect(Exception):
    """The model has a piece the direct data cannot take (the caller uses cvxpy)."""


@dataclass
class PartyRows:
    """Where one party's multipliers sit in Clarabel's dual ``z``: ``eq`` are row indices
    (in the party's stacking order), ``cone`` the rows of its stacked cone vector ``E``
    (entry ``k`` of ``E`` is row ``cone[k]``); inequality ``k``'s multiplier is
    ``ineq_weight[k] @ z[ineq[k]]`` (its row, or the two first rows of the rotated cone
    of a quadratic inequality)."""

    ineq: np.ndarray
    ineq_weight: np.ndarray
    eq: np.ndarray
    cone: np.ndarray
    #: per quadratic inequality component: (its position, its rotated cone's rows, where
    #: ``u`` starts in them, ``||q||^2``)
    quadratic: list = field(default_factory=list)

    def mu(self, z: np.ndarray, s: np.ndarray | None = None) -> np.ndarray:
        """The party's inequality multipliers from Clarabel's ``z`` (and slacks ``s``).

        A quadratic inequality ``||u||^2 + q^T x + r <= 0`` (``u = F x + f``) enters the
        Lagrangian gradient as ``mu (2 F^T u + q)``, its rotated cone as
        ``(z_0 + z_1) q / 2 - F^T z_u``: ``mu`` is their least-squares match,
        ``min (||2 mu u + z_u||^2 + ||q||^2 (mu - (z_0 + z_1)/2)^2)`` at the returned
        ``u`` (``(z_0 + z_1)/2`` alone, exact only at exact complementarity, left basis
        pursuit at the quick size a relative 1e-6 short of the certificate and cost a
        second solve)."""
        if not self.ineq.size:
            return np.zeros(0)
        mu = (z[self.ineq] * self.ineq_weight).sum(axis=1)
        if s is None:
            return mu
        for pos, rows, start, q2 in self.quadratic:
            u, zu = s[rows[start:]], z[rows[start:]]
            uu = float(u @ u)
            c = float(mu[pos])
            denom = 4.0 * uu + q2
            if denom > 0:
                mu[pos] = max((q2 * c - 2.0 * float(zu @ u)) / denom, 0.0)
        return mu


@dataclass
class ConicData:
    """``min x^T P x / 2 + q^T x + r  s.t.  A x + s = b, s in cones`` over the model's
    vector ``x`` (its first ``n`` entries) and the auxiliaries added here."""

    P: sp.csc_array
    q: np.ndarray
    r: float
    A: sp.csc_array
    b: np.ndarray
    cones: list
    n: int
    parties: list[PartyRows] = field(default_factory=list)
    build_seconds: float = 0.0


class _Trip:
    """Sparse rows as plain triplets (``rows``, ``cols``, ``vals``): the many small blocks
    of a federated model cost more in scipy's constructors than in arithmetic."""

    __slots__ = ("rows", "cols", "vals")

    def __init__(self, rows, cols, vals):
        self.rows, self.cols, self.vals = rows, cols, vals

    def permuted(self, perm: np.ndarray, sign: float = 1.0) -> _Trip:
        """Row ``i`` of the result is row ``perm[i]`` of this one, times ``sign``."""
        at = np.empty(perm.size, dtype=int)
        at[perm] = np.arange(perm.size)
        return _Trip(at[self.rows], self.cols, sign * self.vals)


def _affine_rows(expr, layout) -> tuple[_Trip, np.ndarray]:
    """:func:`_affine` as triplets (no scipy matrix on the fast path)."""
    try:
        d = _fast_affine(expr, layout)
    except NotRecognised:
        d = None
    if d is None:
        G, g = _affine(expr, layout)
        G = sp.coo_array(G)
        return _Trip(G.row, G.col, G.data), g
    return _Trip(*d.triplets()), d.b


class _Builder:
    """Rows and auxiliaries, collected per cone kind and ordered at the end."""

    def __init__(self, n: int):
        self.n = n
        self.size = n  # columns so far (model variables, then auxiliaries)
        self.q: list[tuple[np.ndarray, np.ndarray]] = []  # (columns, values)
        self.P: list[sp.coo_array] = []  # each over columns [0, shape)
        self.r = 0.0
        # segments: (kind, A rows as coo with columns < self.size at creation, b, dim, tag)
        self.segments: list[tuple] = []

    def aux(self, k: int) -> np.ndarray:
        cols = np.arange(self.size, self.size + k)
        self.size += k
        return cols

    def add_q(self, cols, vals) -> None:
        self.q.append((np.asarray(cols), np.asarray(vals, dtype=float)))

    def add_rows(self, kind: str, A, b, dims=None, tag=None) -> None:
        """Rows ``A x + s = b`` with ``s`` in ``kind`` (``"zero"``, ``"nonneg"``, ``"soc"``
        with ``dims`` the size of each cone, ``"exp"``, ``"pow"`` with ``dims`` the
        exponents); ``tag`` names the rows' owner (the caller reads its dual)."""
        if not isinstance(A, _Trip):  # (scipy matrices: to triplets once)
            A = sp.coo_array(A)
            A = _Trip(A.row, A.col, A.data)
        self.segments.append((kind, A, np.asarray(b, dtype=float), dims, tag))

    def finish(self) -> tuple:
        import clarabel

        N = self.size
        order = {"zero": 0, "nonneg": 1, "soc": 2, "exp": 3, "pow": 4}
        segs = sorted(enumerate(self.segments), key=lambda s: (order[s[1][0]], s[0]))
        rows, cols, vals, bs, cones, where = [], [], [], [], [], {}
        off = 0
        for _, (kind, A, b, dims, tag) in segs:
            rows.append(A.rows + off)
            cols.append(A.cols)
            vals.append(A.vals)
            bs.append(b)
            m = b.size
            if tag is not None:
                where[tag] = np.arange(off, off + m)
            if kind == "zero":
                cones.append(clarabel.ZeroConeT(m))
            elif kind == "nonneg":
                cones.append(clarabel.NonnegativeConeT(m))
            elif kind == "soc":
                cones.extend(clarabel.SecondOrderConeT(int(d)) for d in dims)
            elif kind == "exp":
                cones.extend(clarabel.ExponentialConeT() for _ in range(m // 3))
            else:
                cones.extend(clarabel.PowerConeT(float(a)) for a in dims)
            off += m
        A = sp.csc_array(
            (
                np.concatenate(vals or [[]]),
                (np.concatenate(rows or [[]]), np.concatenate(cols or [[]])),
            ),
            shape=(off, N),
        )
        q = np.zeros(N)
        for c, v in self.q:
            np.add.at(q, c, v)
        if self.P:
            P = sum(
                (sp.coo_array((p.data, (p.row, p.col)), shape=(N, N)) for p in self.P),
                start=sp.csc_array((N, N)),
            )
            P = sp.csc_array(sp.triu(P))
        else:
            P = sp.csc_array((N, N))
        P.sum_duplicates()
        P.sort_indices()
        A.sum_duplicates()
        A.sort_indices()
        return P, q, A, np.concatenate(bs or [np.zeros(0)]), cones, where


#: the fast affine map keeps a dense block up to this many entries
FAST_DENSE_MAX = 2_000_000


class _Map:
    """``vec(expr) = sum_blocks B x + b`` over ``m`` rows, each block dense over the few
    columns it touches (``("dense", cols, M)``: a data matrix times ``w``) or as triplets
    (``("coo", rows, cols, vals)``: a variable, e.g. an epigraph auxiliary ``t``, whose
    identity would be a large dense block). Built bottom-up by :func:`_fast_affine`;
    cheaper than scipy matrices over all of ``x`` on the many small blocks of a federated
    model. Columns may repeat across blocks (summed when the matrix is built)."""

    __slots__ = ("m", "blocks", "b")

    def __init__(self, m: int, blocks: list, b: np.ndarray):
        self.m, self.blocks, self.b = m, blocks, b

    def scaled(self, c) -> _Map:
        """Each row ``i`` times ``c[i]`` (``c`` a scalar or an ``m``-vector)."""
        c = np.asarray(c, dtype=float)
        out = []
        for blk in self.blocks:
            if blk[0] == "dense":
                M = blk[2] * (c[:, None] if c.ndim else c)
                out.append(("dense", blk[1], M))
            else:
                r = blk[1]
                out.append(("coo", r, blk[2], blk[3] * (c[r] if c.ndim else c)))
        return _Map(self.m, out, self.b * c)

    def rows(self, m: int) -> _Map:
        """Broadcast a one-row map to ``m`` rows."""
        if self.m == m:
            return self
        if self.m != 1:
            raise NotRecognised("broadcast")
        return self.select(np.zeros(m, dtype=int))

    def select(self, sel: np.ndarray) -> _Map:
        """Rows ``sel`` (in that order, repeats allowed)."""
        out = []
        for blk in self.blocks:
            if blk[0] == "dense":
                out.append(("dense", blk[1], blk[2][sel]))
                continue
            _, r, c, v = blk
            # entries of row sel[i], for every i: sort the entries by row, then gather
            order = np.argsort(r, kind="stable")
            r, c, v = r[order], c[order], v[order]
            lo = np.searchsorted(r, sel, side="left")
            hi = np.searchsorted(r, sel, side="right")
            counts = hi - lo
            if not counts.sum():
                continue
            new_rows = np.repeat(np.arange(sel.size), counts)
            starts = np.cumsum(counts) - counts
            take = np.repeat(lo, counts) + np.arange(counts.sum()) - np.repeat(starts, counts)
            out.append(("coo", new_rows, c[take], v[take]))
        return _Map(sel.size, out, self.b[sel])

    def triplets(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        rows, cols, vals = [], [], []
        for blk in self.blocks:
            if blk[0] == "dense":
                r, k = np.nonzero(blk[2])
                rows.append(r)
                cols.append(blk[1][k])
                vals.append(blk[2][r, k])
            else:
                rows.append(blk[1])
                cols.append(blk[2])
                vals.append(blk[3])
        if not rows:
            z = np.zeros(0, dtype=int)
            return z, z, np.zeros(0)
        return np.concatenate(rows), np.concatenate(cols), np.concatenate(vals)


def _constant(expr) -> np.ndarray | None:
    """The value of a constant expression without parameters (dense), else None."""
    import cvxpy as cp

    if not isinstance(expr, cp.Constant):
        if not expr.is_constant() or expr.parameters():
            return None
    v = expr.value
    if v is None or sp.issparse(v):
        return None
    return np.asarray(v, dtype=float)


def _fast_affine(expr, layout) -> _Map:
    """:class:`_Map` of an affine expression of the common atoms; raises
    :class:`NotRecognised` for others (the caller then uses
    :func:`fedmodel.compiler.glm.affine_map`)."""
    import cvxpy as cp

    if isinstance(expr, cp.Variable):
        s = layout.slice_of(expr)
        k = s.stop - s.start
        return _Map(k, [("coo", np.arange(k), np.arange(s.start, s.stop), np.ones(k))], np.zeros(k))
    if isinstance(expr, cp.Constant):
        v = expr.value
        v = v.toarray() if sp.issparse(v) else np.asarray(v, dtype=float)
        b = np.asarray(v, dtype=float).ravel(order="F")
        return _Map(b.size, [], b)
    name = type(expr).__name__
    args = expr.args
    if name == "AddExpression":
        parts = [_fast_affine(a, layout) for a in args]
        m = max(p.m for p in parts)
        parts = [p.rows(m) for p in parts]
        b = np.zeros(m)
        for p in parts:
            b = b + p.b
        return _Map(m, [blk for p in parts for blk in p.blocks], b)
    if name == "NegExpression":
        return _fast_affine(args[0], layout).scaled(-1.0)
    if name == "Promote":
        return _fast_affine(args[0], layout).rows(int(np.prod(expr.shape)))
    if name == "reshape" and getattr(expr, "order", "F") == "F":
        return _fast_affine(args[0], layout)
    if name == "Sum" and getattr(expr, "axis", None) is None:
        p = _fast_affine(args[0], layout)
        blocks = []
        for blk in p.blocks:
            if blk[0] == "dense":
                blocks.append(("dense", blk[1], blk[2].sum(axis=0, keepdims=True)))
            else:
                blocks.append(("coo", np.zeros(blk[1].size, dtype=int), blk[2], blk[3]))
        return _Map(1, blocks, np.array([p.b.sum()]))
    if name == "index":
        child = args[0]
        p = _fast_affine(child, layout)
        at = np.arange(p.m).reshape(child.shape, order="F") if child.shape else np.arange(1)
        return p.select(np.asarray(at[expr.key]).ravel(order="F"))
    if name == "multiply":
        left, right = args
        const, other = (left, right) if left.is_constant() else (right, left)
        c = _constant(const)
        if c is None:
            raise NotRecognised("product")
        c = c.ravel(order="F")
        p = _fast_affine(other, layout)
        m = max(p.m, c.size, int(np.prod(expr.shape)))
        return p.rows(m).scaled(np.broadcast_to(c, (m,)))
    if name == "MulExpression":
        left, right = args
        C = _constant(left)
        if C is None or right.ndim > 1:
            raise NotRecognised("product")
        p = _fast_affine(right, layout)
        if C.ndim < 2:
            if C.size == 1:
                return p.scaled(float(C.ravel()[0]))
            C = C.reshape(1, -1)  # (a row vector times a vector)
        blocks = []
        for blk in p.blocks:
            if blk[0] == "dense":
                blocks.append(("dense", blk[1], C @ blk[2]))
            else:  # C @ (entries v at (r, c)): column j of the result is C[:, r_j] v_j
                _, r, c, v = blk
                if C.shape[0] * r.size > FAST_DENSE_MAX:
                    raise NotRecognised("large")
                blocks.append(("dense", c, C[:, r] * v))
        return _Map(C.shape[0], blocks, C @ p.b)
    if name == "DivExpression":
        den = _constant(args[1])
        if den is None or den.size == 0 or np.any(den != den.ravel()[0]):
            raise NotRecognised("division")
        return _fast_affine(args[0], layout).scaled(1.0 / float(den.ravel()[0]))
    if name == "Vstack" and all(a.ndim <= 2 for a in args):
        # rows of (r_i, k) blocks stacked into (R, k), vec'd column-major: entry (r, j)
        # of block i (its index r + r_i j) goes to (off_i + r) + R j
        shapes = [a.shape if a.ndim == 2 else (1, a.size) for a in args]
        R, k = sum(sh[0] for sh in shapes), shapes[0][1]
        parts = [_fast_affine(a, layout) for a in args]
        blocks, b, off = [], np.zeros(R * k), 0
        for p, (ri, _) in zip(parts, shapes):
            t = np.arange(p.m)
            out = off + t % ri + R * (t // ri)
            b[out] = p.b
            for blk in p.blocks:
                if blk[0] == "dense":
                    r, c = np.nonzero(blk[2])
                    blocks.append(("coo", out[r], blk[1][c], blk[2][r, c]))
                else:
                    blocks.append(("coo", out[blk[1]], blk[2], blk[3]))
            off += ri
        return _Map(R * k, blocks, b)
    if name == "Hstack" and all(a.ndim <= 1 for a in args):
        parts = [_fast_affine(a, layout) for a in args]
        blocks, off = [], 0
        for p in parts:
            for blk in p.blocks:
                if blk[0] == "dense":
                    r, k = np.nonzero(blk[2])
                    blocks.append(("coo", r + off, blk[1][k], blk[2][r, k]))
                else:
                    blocks.append(("coo", blk[1] + off, blk[2], blk[3]))
            off += p.m
        return _Map(off, blocks, np.concatenate([p.b for p in parts]))
    raise NotRecognised(name)


def _csr(A) -> sp.csr_array:
    return sp.csr_array(A) if sp.issparse(A) else sp.csr_array(np.atleast_2d(np.asarray(A)))


class NonAffine(NotDirect):
    """The expression is not affine (a quadratic constraint may still have a form)."""


def _affine(expr, layout):
    """``(G, g)`` with ``vec(expr) = G x + g`` (column-major), ``G`` sparse;
    :class:`NonAffine` when ``expr`` is not affine."""
    try:  # (the fast map takes affine atoms only; a cvxpy Parameter is refused by both
        d = _fast_affine(expr, layout)  # maps: its value may change)
    except NotRecognised:
        d = None
    if d is not None:
        r, c, v = d.triplets()
        G = sp.csr_array((v, (r, c)), shape=(d.m, layout.size))
        return G, d.b
    if not expr.is_affine():
        raise NonAffine("a nonlinear constraint")
    try:
        p = affine_map(expr, layout)
    except NotRecognised as exc:
        raise NotDirect(str(exc)) from exc
    return _csr(p.A), np.asarray(p.b, dtype=float).ravel()


def _lift_columns(G: sp.csr_array, extra: int, cols: np.ndarray, coef: float) -> sp.coo_array:
    """``[G, coef * I on cols]`` as one coo (``cols`` the auxiliaries, one per row)."""
    G = sp.coo_array(G)
    m = G.shape[0]
    return sp.coo_array(
        (
            np.concatenate([G.data, np.full(m, coef)]),
            (np.concatenate([G.row, np.arange(m)]), np.concatenate([G.col, cols])),
        ),
        shape=(m, extra),
    )


def _objective(builder: _Builder, expr, layout) -> None:
    if expr.is_affine():
        G, g = _affine_rows(expr, layout)
        builder.add_q(G.cols, G.vals)
        builder.r += float(g[0])
        return
    try:
        f = recognise_scalar(expr, layout)
    except NotRecognised:
        _exp_objective(builder, expr, layout, 1.0)  # (kl_div, entr, log_sum_exp, ...)
        return
    _glm_into(builder, f)


#: elementwise atoms of the exponential cone taken by :func:`_exp_objective`
EXP_ATOMS = ("kl_div", "rel_entr", "entr")


def _exp_objective(builder: _Builder, expr, layout, c: float) -> None:
    """``c * expr`` into the objective, for sums of affine parts, GLM terms and the
    exponential-cone atoms ``kl_div(x, y)``, ``rel_entr(x, y)`` (``t >= x log(x / y)`` as
    ``(-t, x, y) in K_exp``), ``-entr(x)`` (``(-t, x, 1)``) and ``log_sum_exp(z)``
    (``sum_i u_i <= 1``, ``(z_i - t, 1, u_i) in K_exp``), each with a nonnegative weight
    (convex); :class:`NotDirect` for anything else."""
    import cvxpy as cp

    name = type(expr).__name__
    if expr.is_affine():
        G, g = _affine(expr, layout)
        builder.add_q(np.arange(builder.n), c * G.toarray().ravel())
        builder.r += c * float(g[0])
        return
    const = None
    if name in ("MulExpression", "multiply") and len(expr.args) == 2:
        left, right = expr.args
        const, other = (left, right) if isinstance(left, cp.Constant) else (right, left)
    elif name == "DivExpression" and isinstance(expr.args[1], cp.Constant):
        const, other = expr.args[1], expr.args[0]
    if const is not None and isinstance(const, cp.Constant) and const.size == 1:
        v = float(np.asarray(const.value).ravel()[0])
        _exp_objective(builder, other, layout, c * v if name != "DivExpression" else c / v)
        return
    if name == "AddExpression" and all(a.size == 1 for a in expr.args):
        for a in expr.args:
            _exp_objective(builder, a, layout, c)
        return
    if name == "NegExpression":
        _exp_objective(builder, expr.args[0], layout, -c)
        return
    if name == "Sum" and getattr(expr, "axis", None) is None:
        inner = expr.args[0]
        if type(inner).__name__ in EXP_ATOMS:
            _exp_atom(builder, inner, layout, c)
            return
    if name in EXP_ATOMS and expr.size == 1:
        _exp_atom(builder, expr, layout, c)
        return
    if name == "log_sum_exp" and getattr(expr, "axis", None) is None:
        if c < 0:
            raise NotDirect("a concave log_sum_exp term")
        Z, z0 = _affine(expr.args[0], layout)
        m = z0.size
        t, u = builder.aux(1), builder.aux(m)
        builder.add_q(t, [c])
        # sum u <= 1: s = 1 - sum u
        builder.add_rows(
            "nonneg",
            sp.coo_array((np.ones(m), (np.zeros(m, int), u)), shape=(1, builder.size)),
            [1.0],
        )
        ones = np.ones(m)
        _exp_cone(
            builder,
            (_with_columns(Z, np.repeat(t, m), -ones, builder.size), z0),  # z_i - t
            (sp.coo_array((m, builder.size)), ones),  # 1
            (_with_columns(None, u, ones, builder.size, m), np.zeros(m)),  # u_i
        )
        return
    try:
        f = recognise_scalar(expr, layout)
    except NotRecognised as exc:
        raise NotDirect(f"objective: {exc}") from exc
    _glm_into(builder, f.scaled(c))


def _with_columns(G, cols, vals, size: int, m: int | None = None) -> sp.coo_array:
    """``G`` (None: zeros with ``m`` rows) with ``vals[i]`` added at ``(i, cols[i])``, as a
    coo over ``size`` columns."""
    if G is None:
        G = sp.coo_array((m, size))
    G = sp.coo_array(G)
    k = np.asarray(cols).size
    return sp.coo_array(
        (
            np.concatenate([G.data, vals]),
            (np.concatenate([G.row, np.arange(k)]), np.concatenate([G.col, cols])),
        ),
        shape=(G.shape[0], size),
    )


def _exp_cone(builder: _Builder, first, second, third) -> None:
    """Rows ``(e_1(x)_i, e_2(x)_i, e_3(x)_i) in K_exp`` per ``i``, each entry ``(G, g)``
    meaning ``G x + g``."""
    m = first[1].size
    rows, cols, vals, b = [], [], [], np.zeros(3 * m)
    for j, (G, g) in enumerate((first, second, third)):
        G = sp.coo_array(G)
        rows.append(3 * G.row + j)
        cols.append(G.col)
        vals.append(-G.data)  # s = b - A x = G x + g
        b[j::3] = np.broadcast_to(g, (m,))
    builder.add_rows(
        "exp",
        sp.coo_array(
            (np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
            shape=(3 * m, builder.size),
        ),
        b,
    )


def _exp_atom(builder: _Builder, atom, layout, c) -> None:
    """``sum(c * atom)`` for ``kl_div``, ``rel_entr`` and ``entr`` (see
    :func:`_exp_objective`); ``c`` a scalar."""
    name = type(atom).__name__
    m = int(atom.size)
    w = float(c)
    if name == "entr":
        if w > 0:
            raise NotDirect("a concave entr term")
        w = -w  # minimise w * x log x
        X, x0 = _affine(atom.args[0], layout)
        Y, y0 = sp.csr_array((m, layout.size)), np.ones(m)
    else:
        if w < 0:
            raise NotDirect(f"a concave {name} term")
        X, x0 = _affine(atom.args[0], layout)
        Y, y0 = _affine(atom.args[1], layout)
    X, x0 = _broadcast_rows(X, x0, m)
    Y, y0 = _broadcast_rows(Y, y0, m)
    t = builder.aux(m)
    builder.add_q(t, np.full(m, w))
    if name == "kl_div":  # x log(x / y) - x + y
        builder.add_q(np.arange(builder.n), w * np.asarray(Y.sum(axis=0) - X.sum(axis=0)).ravel())
        builder.r += w * float(y0.sum() - x0.sum())
    _exp_cone(
        builder,
        (_with_columns(None, t, -np.ones(m), builder.size, m), np.zeros(m)),  # -t
        (X, x0),
        (Y, y0),
    )


def _broadcast_rows(G, g, m: int):
    if g.size == m:
        return G, g
    if g.size != 1:
        raise NotDirect("broadcast")
    return sp.csr_array(sp.vstack([G] * m)), np.repeat(g, m)


def _glm_into(builder: _Builder, f) -> None:
    """A :class:`~fedmodel.compiler.glm.GLMFunction` into the objective."""
    n = builder.n
    builder.r += float(f.r)
    if f.q is not None:
        builder.add_q(np.arange(n), f.q)
    if f.Q is not None:
        if n > DENSE_Q_MAX:
            raise NotDirect("a dense quadratic form over many variables")
        builder.P.append(sp.coo_array(np.asarray(f.Q)))
    for t in f.terms:
        A = _csr(t.A) * t.s if t.s != 1.0 else _csr(t.A)
        w, b = np.asarray(t.weights, dtype=float), np.asarray(t.b, dtype=float)
        if t.kind == "square":
            if np.any(w < 0):
                raise NotDirect("a concave square term")
            # sum w (A x + b)^2 = x^T A^T W A x + 2 b^T W A x + b^T W b
            used = np.unique(sp.coo_array(A).col)
            if used.size**2 <= 2 * A.nnz + 10_000:
                builder.P.append(sp.coo_array(2.0 * (A.T @ sp.diags_array(w) @ A)))
            else:  # lifted: r = A x + b, 2 W on r's diagonal
                r = builder.aux(A.shape[0])
                builder.add_rows("zero", _lift_columns(A, builder.size, r, -1.0), -b)
                builder.P.append(sp.coo_array((2.0 * w, (r, r))))
                continue
            builder.add_q(np.arange(A.shape[1]), 2.0 * (A.T @ (w * b)))
            builder.r += float(w @ (b * b))
        elif t.kind in ("logistic", "exp"):
            if np.any(w < 0):
                raise NotDirect(f"a concave {t.kind} term")
            m = A.shape[0]
            tt = builder.aux(m)
            builder.add_q(tt, w)
            if t.kind == "exp":  # e^z <= t: (z, 1, t) in K_exp
                _exp_rows(builder, A, b, -1, tt)
                continue
            u, v = builder.aux(m), builder.aux(m)
            # u + v <= 1
            eye = np.arange(m)
            builder.add_rows(
                "nonneg",
                sp.coo_array(
                    (np.ones(2 * m), (np.concatenate([eye, eye]), np.concatenate([u, v]))),
                    shape=(m, builder.size),
                ),
                np.ones(m),
            )
            _exp_rows(builder, A, b, tt, u)  # (z - t, 1, u)
            _exp_rows(builder, None, np.zeros(m), tt, v)  # (-t, 1, v)
        else:
            raise NotDirect(f"a {t.kind} term")


def _exp_rows(builder: _Builder, A, b, t_cols, z_cols) -> None:
    """Per row ``k``: ``(a_k^T x + b_k - t_k, 1, s_k) in K_exp`` where ``t_cols`` are the
    ``t`` columns (``-1``: no ``t``; then ``z_cols`` holds the cone's last entry and the
    first is ``a_k^T x + b_k``). ``A`` None: the first entry is ``b_k - t_k``."""
    m = b.size
    rows, cols, vals = [], [], []
    if A is not None:
        Ac = sp.coo_array(A)
        rows.append(3 * Ac.row)
        cols.append(Ac.col)
        vals.append(-Ac.data)  # s = b_row - A_row x: first entry = a^T x + b
    if not (isinstance(t_cols, int) and t_cols == -1):
        rows.append(3 * np.arange(m))
        cols.append(np.asarray(t_cols))
        vals.append(np.ones(m))  # ... - t
    rows.append(3 * np.arange(m) + 2)
    cols.append(np.asarray(z_cols))
    vals.append(-np.ones(m))  # third entry = s_k
    bb = np.zeros(3 * m)
    bb[0::3] = b
    bb[1::3] = 1.0
    builder.add_rows(
        "exp",
        sp.coo_array(
            (np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
            shape=(3 * m, builder.size),
        ),
        bb,
    )


def _quadratic_components(expr, layout) -> list:
    """The GLM form of each component of a convex quadratic constraint (``square`` terms
    with nonnegative weights, a quadratic form, a linear part); :class:`NotDirect` else."""
    try:
        comps = recognise_components(expr, layout)
    except NotRecognised as exc:
        raise NotDirect(f"a nonlinear constraint: {exc}") from exc
    for f in comps:
        if any(t.kind != "square" or np.any(np.asarray(t.weights) < 0) for t in f.terms):
            raise NotDirect("a nonlinear constraint that is not a convex quadratic")
        if f.Q is not None and layout.size > DENSE_Q_MAX:
            raise NotDirect("a dense quadratic form over many variables")
    return comps


def _quadratic_cone(builder: _Builder, f, tag) -> tuple[float, float]:
    """``||F x + f||^2 + q^T x + r <= 0`` (``f``'s square terms and quadratic form as
    ``||F x + f||^2``) as the rotated cone ``((tau + 1)/2, (tau - 1)/2, F x + f)`` in the
    second-order cone, ``tau = -(q^T x + r)``; its multiplier is ``(z_0 + z_1) / 2`` at
    exact complementarity, fitted at the returned point by :meth:`PartyRows.mu`. (The
    plain cone ``(rho, F x + f)`` of a ball ``||F x + f|| <= rho`` was tried: basis
    pursuit's point then missed the certificate by a relative 5% twice.) Returns the
    weights of ``(z_0, z_1)``."""
    n = builder.n
    blocks, offsets = [], []
    for t in f.terms:
        A = _csr(t.A) * t.s if t.s != 1.0 else _csr(t.A)
        sw = np.sqrt(np.asarray(t.weights, dtype=float))
        blocks.append(sp.csr_array(sp.diags_array(sw) @ A))
        offsets.append(sw * np.asarray(t.b, dtype=float))
    if f.Q is not None:  # x^T Q x / 2 = ||L^T x||^2 with Q / 2 = L L^T (Q PSD)
        vals, vecs = np.linalg.eigh(0.5 * (np.asarray(f.Q) + np.asarray(f.Q).T) / 2.0)
        if vals.min(initial=0.0) < -1e-10 * max(1.0, vals.max(initial=0.0)):
            raise NotDirect("an indefinite quadratic form")
        keep = vals > 1e-14 * max(1.0, vals.max(initial=0.0))
        blocks.append(sp.csr_array((vecs[:, keep] * np.sqrt(vals[keep])).T))
        offsets.append(np.zeros(int(keep.sum())))
    F = sp.vstack(blocks) if blocks else sp.csr_array((0, n))
    fv = np.concatenate(offsets) if offsets else np.zeros(0)
    q = np.zeros(n) if f.q is None else np.asarray(f.q, dtype=float)
    r = float(f.r)
    qrow = sp.csr_array(q.reshape(1, -1) / 2.0)
    A = sp.vstack([qrow, qrow, -sp.csr_array(F)])
    b = np.concatenate([[(1.0 - r) / 2.0, (-1.0 - r) / 2.0], fv])
    builder.add_rows("soc", sp.coo_array(A), b, [b.size], tag=tag)
    return 0.5, 0.5


def _cone_order(block) -> tuple[str, np.ndarray, list | None]:
    """The permutation of a cone block's ``E`` entries into Clarabel's row order, its
    kind and the cones' dimensions (SOC) or exponents (power cone)."""
    idx = np.arange(block.size)
    if block.kind in ("nonneg", "zero"):
        return block.kind, idx, None
    if block.kind == "soc":
        t, rows = block._soc_parts(idx)
        perm = np.concatenate([np.concatenate([[t[i]], rows[i]]) for i in range(t.size)])
        return "soc", perm.astype(int), [1 + rows.shape[1]] * t.size
    if block.kind in ("exp", "pow"):
        a, b_, c = np.split(idx, 3)
        perm = np.stack([a, b_, c], axis=1).ravel()
        return block.kind, perm, (list(block.alpha) if block.kind == "pow" else None)
    raise NotDirect(f"a {block.kind} cone")


def build_conic_data(compiled: CompiledModel) -> ConicData:
    """Clarabel's data of the pooled problem (module docstring); raises :class:`NotDirect`
    when a piece has no direct form."""
    t0 = time.perf_counter()
    layout = compiled.layout
    n = layout.size
    builder = _Builder(n)
    if compiled.nonconvex:
        raise NotDirect("nonconvex terms")
    ineq_parts = []
    for j, p in enumerate(compiled.parties):
        if p.objective:
            _objective(builder, p.objective_expr(), layout)
        # inequalities: affine rows, and convex quadratic ones as rotated second-order
        # cones; ineq_parts[j]: (tag, first position in the party's mu, size, kind)
        parts, pos = [], 0
        for k, c in enumerate(p.ineq):
            try:
                G, g = _affine_rows(c.expr, layout)
            except NonAffine:
                G = None
            if G is not None:
                # c(x) = G x + g <= 0: s = -g - G x >= 0
                builder.add_rows("nonneg", G, -g, tag=(j, "ineq", k))
                parts.append(((j, "ineq", k), pos, c.size, "rows"))
            else:
                for i, comp in enumerate(_quadratic_components(c.expr, layout)):
                    tag = (j, "ineq", k, i)
                    weights = _quadratic_cone(builder, comp, tag)
                    q2 = 0.0 if comp.q is None else float(np.dot(comp.q, comp.q))
                    parts.append((tag, pos + i, 1, (weights, q2)))
            pos += c.size
        ineq_parts.append(parts)
        if p.eq:
            eqs = [_affine_rows(c.expr, layout) for c in p.eq]
            offs = np.cumsum([0] + [v.size for _, v in eqs])
            G = _Trip(
                np.concatenate([t.rows + o for (t, _), o in zip(eqs, offs)]),
                np.concatenate([t.cols for t, _ in eqs]),
                np.concatenate([t.vals for t, _ in eqs]),
            )
            g = np.concatenate([v for _, v in eqs])
            # a(x) = G x + g = 0: s = -g - G x = 0
            builder.add_rows("zero", G, -g, tag=(j, "eq"))
        blocks = p.functions.blocks if p.cones else []
        for k, (c, block) in enumerate(zip(p.cones, blocks)):
            G, g = _affine_rows(c.expr, layout)
            kind, perm, dims = _cone_order(block)
            # E = G x + g in K: s = E, A = -G, b = g (rows in Clarabel's order)
            builder.add_rows(kind, G.permuted(perm, -1.0), g[perm], dims, tag=(j, "cone", k))
    reg = compiled.regularizer
    if not reg.is_zero:
        for s, piece in zip(reg.slices, reg.pieces):
            if piece.has_matrix_norm:  # (a semidefinite cone: cvxpy's compile builds it)
                raise NotDirect("a nuclear or spectral norm in h")
            cols = np.arange(s.start, s.stop)
            k = cols.size
            eye = np.arange(k)
            if piece.l1:
                u = builder.aux(k)
                for sign in (1.0, -1.0):  # sign x - u <= 0: s = u - sign x
                    builder.add_rows(
                        "nonneg",
                        sp.coo_array(
                            (
                                np.concatenate([np.full(k, sign), -np.ones(k)]),
                                (np.concatenate([eye, eye]), np.concatenate([cols, u])),
                            ),
                            shape=(k, builder.size),
                        ),
                        np.zeros(k),
                    )
                builder.add_q(u, np.full(k, float(piece.l1)))
            if piece.sumsq:
                builder.P.append(sp.coo_array((np.full(k, 2.0 * piece.sumsq), (cols, cols))))
            if piece.l2:
                r = builder.aux(1)
                A = sp.coo_array(
                    (-np.ones(k + 1), (np.arange(k + 1), np.concatenate([r, cols]))),
                    shape=(k + 1, builder.size),
                )
                builder.add_rows("soc", A, np.zeros(k + 1), [k + 1])
                builder.add_q(r, [float(piece.l2)])
            if piece.has_ball:
                A = sp.coo_array((-np.ones(k), (eye + 1, cols)), shape=(k + 1, builder.size))
                b = np.zeros(k + 1)
                b[0] = float(piece.radius)
                builder.add_rows("soc", A, b, [k + 1])
            if piece.has_box:
                lo = np.broadcast_to(np.asarray(piece.lower, dtype=float), (k,))
                hi = np.broadcast_to(np.asarray(piece.upper, dtype=float), (k,))
                for bound, sign in ((lo, -1.0), (hi, 1.0)):
                    idx = np.flatnonzero(np.isfinite(bound))
                    if idx.size:  # sign x <= sign bound
                        A = sp.coo_array(
                            (np.full(idx.size, sign), (np.arange(idx.size), cols[idx])),
                            shape=(idx.size, builder.size),
                        )
                        builder.add_rows("nonneg", A, sign * bound[idx])
    P, q, A, b, cones, where = builder.finish()
    parties = []
    for j, p in enumerate(compiled.parties):
        cone_rows = [where[(j, "cone", k)] for k in range(len(p.cones))]
        perms = [_cone_order(bl)[1] for bl in (p.functions.blocks if p.cones else [])]
        # entry perm[i] of the block's E sits at row rows[i]
        inv = []
        for rows_k, perm in zip(cone_rows, perms):
            at = np.empty_like(rows_k)
            at[perm] = rows_k
            inv.append(at)
        rows = np.zeros((p.m_ineq, 2), dtype=int)
        weight = np.zeros((p.m_ineq, 2))
        quadratic = []
        for tag, start, size, kind in ineq_parts[j]:
            at = where[tag]
            if kind == "rows":
                rows[start : start + size] = at[:, None]
                weight[start : start + size, 0] = 1.0
            else:  # mu = kind @ (z_0, z_1) of its cone (_quadratic_cone), then fitted
                weights, q2 = kind
                rows[start] = at[:2]
                weight[start] = weights
                quadratic.append((start, at, 2, q2))
        parties.append(
            PartyRows(
                ineq=rows,
                ineq_weight=weight,
                eq=where.get((j, "eq"), np.zeros(0, int)),
                cone=np.concatenate(inv) if inv else np.zeros(0, int),
                quadratic=quadratic,
            )
        )
    return ConicData(
        P, q, builder.r, A, b, cones, n, parties, build_seconds=time.perf_counter() - t0
    )


@dataclass
class DirectSolution:
    """What one direct Clarabel solve returned: cvxpy's status string, the model's point
    (None without one), per party the raw multipliers (``mu``, ``nu``, cone ``lambda``
    flattened like ``E``, before any projection), the objective value and the solver's
    own status."""

    status: str
    x: np.ndarray | None
    mus: list
    nus: list
    lams: list
    objective: float
    solver_status: str
    deadline_stop: bool = False
    #: ``time.perf_counter()`` at the end of Clarabel's start-up and first iteration (None:
    #: not timed, without a deadline)
    first: float | None = None


def solve_direct(
    data: ConicData,
    settings: dict,
    deadline: float | None = None,
    objective_scale: float = 1.0,
) -> DirectSolution:
    """One Clarabel solve of ``data`` with cvxpy-style ``settings`` (``tol_gap_abs``,
    ``time_limit``, ..., and ``accept_unknown``: a point Clarabel stopped on for lack of
    progress is returned as ``"optimal_inaccurate"``, as cvxpy does).

    Clarabel solves the objective divided by ``objective_scale`` (the certificate's
    reference scale ``S``, :mod:`fedmodel.certificate.scale`), so that its absolute gap
    tolerances are on the scale the certificate judges; the multipliers and the objective
    are returned in the model's units (times ``S``).

    ``deadline`` (a ``time.perf_counter()`` value): Clarabel checks its own
    ``time_limit`` only between iterations, so it overran by up to one iteration (0.2-0.4
    s on sparse logistic regression at d = 3000); here a termination callback also stops
    it when the last iteration's wall says the next one would end after the deadline
    (as the Newton backends do), with status ``"user_limit"`` and ``deadline_stop``."""
    import clarabel

    opts = dict(settings)
    accept = bool(opts.pop("accept_unknown", False))
    opts.pop("use_quad_obj", None)
    s = clarabel.DefaultSettings()
    s.verbose = False
    for key, value in opts.items():
        try:
            setattr(s, key, value)
        except AttributeError as exc:
            raise TypeError(f"Clarabel: unrecognized solver setting '{key}'.") from exc
    c = 1.0 / float(objective_scale)
    solver = clarabel.DefaultSolver(c * data.P, c * data.q, data.A, data.b, data.cones, s)
    stop = {"last": time.perf_counter(), "step": 0.0, "hit": False, "first": None}
    if deadline is not None:

        def callback(_info) -> bool:
            now = time.perf_counter()
            stop["first"] = stop["first"] or now
            # (the first call's "step" is the solve's start-up and first iteration: longer
            # than an iteration, so a start-up that ate the time stops the solve at once)
            stop["step"] = max(stop["step"], now - stop["last"])
            stop["last"] = now
            stop["hit"] = now + stop["step"] >= deadline
            return stop["hit"]

        solver.set_termination_callback(callback)
    sol = solver.solve()
    raw = str(sol.status)
    status = STATUS.get(raw, "solver_error")
    if raw == "CallbackTerminated":
        status = "user_limit"
    has_point = sol.x is not None and len(sol.x) == data.P.shape[0]
    if raw == "InsufficientProgress" and accept and has_point and sol.z is not None:
        status = "optimal_inaccurate"
    if status not in ("optimal", "optimal_inaccurate", "user_limit") or not has_point:
        return DirectSolution(
            status, None, [], [], [], np.nan, raw, raw in STOPPED, first=stop["first"]
        )
    x = np.asarray(sol.x, dtype=float)
    z = np.asarray(sol.z, dtype=float) / c
    if status == "user_limit" and not np.all(np.isfinite(x)):
        return DirectSolution(status, None, [], [], [], np.nan, raw, raw in STOPPED)
    slack = None if sol.s is None else np.asarray(sol.s, dtype=float)
    mus = [r.mu(z, slack) for r in data.parties]
    nus = [z[r.eq] for r in data.parties]
    lams = [z[r.cone] for r in data.parties]
    return DirectSolution(
        status,
        x[: data.n].copy(),
        mus,
        nus,
        lams,
        float(sol.obj_val) / c + data.r,
        raw,
        deadline_stop=raw == "CallbackTerminated" or raw == "MaxTime",
        first=stop["first"],
    )
