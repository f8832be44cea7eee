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
>>> _ = m.client("a", data={"X": X, "y": y}).minimize(cp.sum(cp.abs(X @ w - y)))
>>> data = build_conic_data(m.compile())
>>> data.P.shape, len(data.parties)
((7, 7), 2)
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp

from fedmodel.compiler.glm import NotRecognised, affine_map, recognise_scalar
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

#: a dense quadratic part (``quad_form``) is taken up to this many variables
DENSE_Q_MAX = 3000


class NotDirect(Exception):
    """The model has a piece the direct data cannot take (the caller uses cvxpy)."""


@dataclass
class PartyRows:
    """Where one party's multipliers sit in Clarabel's dual ``z``: ``ineq`` and ``eq`` are
    row indices (in the party's stacking order), ``cone`` the rows of its stacked cone
    vector ``E`` (entry ``k`` of ``E`` is row ``cone[k]``)."""

    ineq: np.ndarray
    eq: np.ndarray
    cone: np.ndarray


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
        A = sp.coo_array(A)
        self.segments.append((kind, A, np.asarray(b, dtype=float), dims, tag))

    def finish(self) -> tuple:
        import clarabel

        N = self.size
        order = {"zero": 0, "nonneg": 1, "soc": 2, "exp": 3, "pow": 4}
        segs = sorted(enumerate(self.segments), key=lambda s: (order[s[1][0]], s[0]))
        rows, cols, vals, bs, cones, where = [], [], [], [], [], {}
        off = 0
        for _, (kind, A, b, dims, tag) in segs:
            rows.append(A.row + off)
            cols.append(A.col)
            vals.append(A.data)
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


def _csr(A) -> sp.csr_array:
    return sp.csr_array(A) if sp.issparse(A) else sp.csr_array(np.atleast_2d(np.asarray(A)))


def _affine(expr, layout):
    """``(G, g)`` with ``vec(expr) = G x + g`` (column-major), ``G`` sparse."""
    if not expr.is_affine():
        raise NotDirect("a nonlinear constraint")
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
    try:
        f = recognise_scalar(expr, layout)
    except NotRecognised as exc:
        raise NotDirect(f"objective: {exc}") from exc
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
    for j, p in enumerate(compiled.parties):
        if p.objective:
            _objective(builder, p.objective_expr(), layout)
        for kind, terms in (("nonneg", p.ineq), ("zero", p.eq)):
            if not terms:
                continue
            parts = [_affine(c.expr, layout) for c in terms]
            G = sp.vstack([g for g, _ in parts]) if len(parts) > 1 else parts[0][0]
            g = np.concatenate([v for _, v in parts])
            # c(x) = G x + g <= 0: s = -g - G x >= 0;  a(x) = G x + g = 0 likewise
            builder.add_rows(kind, sp.coo_array(G), -g, tag=(j, kind))
        blocks = p.functions.blocks if p.cones else []
        for k, (c, block) in enumerate(zip(p.cones, blocks)):
            G, g = _affine(c.expr, layout)
            kind, perm, dims = _cone_order(block)
            # E = G x + g in K: s = E, A = -G, b = g (rows in Clarabel's order)
            builder.add_rows(kind, sp.coo_array(-G[perm]), g[perm], dims, tag=(j, "cone", k))
    reg = compiled.regularizer
    if not reg.is_zero:
        for s, piece in zip(reg.slices, reg.pieces):
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
        parties.append(
            PartyRows(
                ineq=where.get((j, "nonneg"), np.zeros(0, int)),
                eq=where.get((j, "zero"), np.zeros(0, int)),
                cone=np.concatenate(inv) if inv else np.zeros(0, int),
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


def solve_direct(data: ConicData, settings: dict) -> DirectSolution:
    """One Clarabel solve of ``data`` with cvxpy-style ``settings`` (``tol_gap_abs``,
    ``time_limit``, ..., and ``accept_unknown``: a point Clarabel stopped on for lack of
    progress is returned as ``"optimal_inaccurate"``, as cvxpy does)."""
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
    solver = clarabel.DefaultSolver(data.P, data.q, data.A, data.b, data.cones, s)
    sol = solver.solve()
    raw = str(sol.status)
    status = STATUS.get(raw, "solver_error")
    has_point = sol.x is not None and len(sol.x) == data.P.shape[0]
    if raw == "InsufficientProgress" and accept and has_point and sol.z is not None:
        status = "optimal_inaccurate"
    if status not in ("optimal", "optimal_inaccurate", "user_limit") or not has_point:
        return DirectSolution(status, None, [], [], [], np.nan, raw)
    x = np.asarray(sol.x, dtype=float)
    z = np.asarray(sol.z, dtype=float)
    if status == "user_limit" and not np.all(np.isfinite(x)):
        return DirectSolution(status, None, [], [], [], np.nan, raw)
    mus = [z[r.ineq] for r in data.parties]
    nus = [z[r.eq] for r in data.parties]
    lams = [z[r.cone] for r in data.parties]
    return DirectSolution(
        status, x[: data.n].copy(), mus, nus, lams, float(sol.obj_val) + data.r, raw
    )
