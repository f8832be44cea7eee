"""Structure-aware Newton backend: exact (generalised) Hessians of GLM-form merit functions.

When every term of the parties in a merit problem has the GLM form of
:mod:`fedmodel.compiler.glm` (sums of logistic/exp/square/huber of affine maps, quadratic
forms, affine terms) and ``h`` is smooth, the merit function

    phi(x) = sum_p f_p(x) + (||[mu + beta c(x)]_+||^2 - ||mu||^2) / (2 beta)
                          + (||nu + beta a(x)||^2 - ||nu||^2) / (2 beta) + (sigma/2)||x - z||^2

has the generalised Hessian ``H = grad^2 f + sum_j (p_j grad^2 c_j + beta [p_j > 0] grad c_j
grad c_j^T) + (equalities likewise) + sigma I`` (``p = [mu + beta c]_+``): the AL term is
C^1 with a piecewise Hessian, which semismooth Newton treats exactly. Steps are damped by
an Armijo line search; an indefinite ``H`` (non-convex terms) is shifted until its
Cholesky factorisation exists. Stops at ``||grad phi||_inf <= tol`` (down to ~1e-12).

Cost structure (what makes thousands of small solves cheap):

* all parties' objective terms are merged: one quadratic ``Q``, and GLM terms of the same
  kind stacked into one data matrix (one matrix product per evaluation, not one per term);
  affine constraints of all parties are stacked into one matrix;
* the Hessian is built only when a Newton step needs it (never at the accepted point that
  ends the solve), from the affine images computed for the gradient;
* when the merit function is quadratic (quadratic/affine terms, affine constraints) its
  Hessian changes only with ``sigma``, ``beta`` and the active set of the inequalities:
  the Cholesky factor is cached under that key and reused across ADMM rounds and outer
  iterations; with the factor reused the Hessian is not even assembled
  (``factorizations`` counts the factorisations);
* in that quadratic case, a block of unknowns with a diagonal Hessian block whatever the
  active set (the epigraph variables of hinge, pinball and l1 terms: one per data row,
  each in its own constraint rows) is eliminated by a Schur complement: only the small
  block of the other unknowns is factored (``SCHUR_MIN_BLOCK``), instead of a dense
  matrix with one row per epigraph variable; the mostly-zero constraint matrices of such
  rows are multiplied in sparse form (``SPARSE_MATVEC_DENSITY``);
* otherwise (logistic and other GLM terms) a factor computed in a solve is reused for the
  next steps of that solve (chord steps: two matrix-vector products instead of a Hessian)
  while full steps keep contracting ``||grad||_inf`` tenfold; never across solves, so the
  answer depends only on ``x0`` and the parameters (resumed and retried runs repeat the
  iterates bit for bit); the data part of the Hessian is one BLAS ``syrk``;
* square terms ``sum w (a^T x + b)^2`` are folded into the quadratic form, data matrices
  are used in place (``X @ w`` and ``-(X @ w)`` keep ``X``; no copies);
* the affine images at the last point are kept, so a solve started where the previous one
  ended (the ADMM pattern) does not recompute them;
* the residual reported is ``||grad phi(x)||_inf`` at the returned ``x`` from this
  backend's exact gradient; on the first solve it is cross-checked against the model's
  independent smooth evaluator (:meth:`MeritProblem.smooth_value_grad`), and the backend
  hands over to L-BFGS for good if the two disagree.
"""

from __future__ import annotations

import statistics
import time
import warnings
import weakref
from collections import OrderedDict, deque

import numpy as np
import scipy.linalg as la
import scipy.sparse as sp
from scipy.linalg import blas

from fedmodel.compiler.atom_rules import is_symmetric
from fedmodel.compiler.fingerprint import structure_skeleton
from fedmodel.compiler.glm import (
    GLMFunction,
    GLMTerm,
    Node,
    NotRecognised,
    Reading,
    Recipe,
    Tape,
    expression_leaves,
    node_like,
    node_of,
    phi_d2,
    phi_value_d1,
    recognise_node,
    recognise_node_components,
)
from fedmodel.compiler.partition import PartyProgram
from fedmodel.subproblems.merit import MeritProblem, SolveReport


def evaluations_agree(reference, value_grad, rtol: float = 1e-8) -> bool:
    """Whether ``value_grad = (value, gradient)`` of a GLM form equals ``reference`` (the
    model's own evaluator's) to ``rtol`` relative to the reference's largest magnitude (at
    least 1): the check before a GLM form is trusted in place of the evaluator.

    Examples
    --------
    >>> import numpy as np
    >>> evaluations_agree((2.0, np.ones(2)), (2.0 + 1e-12, np.ones(2))), evaluations_agree(
    ...     (2.0, np.ones(2)), (2.1, np.ones(2)))
    (True, False)
    """
    val, g = reference[0], np.asarray(reference[1], dtype=float)
    scale = max(1.0, abs(val), float(np.abs(g).max(initial=0.0)))
    return bool(
        abs(val - value_grad[0]) <= rtol * scale
        and np.abs(g - value_grad[1]).max(initial=0.0) <= rtol * scale
    )


def residuals_agree(check: float, gnorm: float, value: float, rtol: float = 1e-8) -> bool:
    """Whether the model's evaluator's residual ``check`` equals a GLM form's ``gnorm`` at
    a point where the merit is ``value``, to ``rtol`` relative to the largest of 1,
    ``|value|`` and ``gnorm`` (the scale of :func:`evaluations_agree`): the gradient is a
    sum of terms of the merit's size, so rounding alone separates the two evaluations by
    about ``rtol`` times the merit, however small the gradient is.

    Examples
    --------
    >>> residuals_agree(1.3e-4, 0.0, 6e9), residuals_agree(1.3e-4, 0.0, 1.0)
    (True, False)
    """
    return abs(check - gnorm) <= rtol * max(1.0, abs(value), gnorm)


class _PartyGLM:
    """One party's objective and constraints in GLM form (linear constraints stacked).

    The party's terms are read through the nodes of its structure
    (:attr:`~fedmodel.compiler.partition.PartyProgram.structure`, :func:`_structure_nodes`):
    made from the first party of each structure whose nodes' flags do not depend on its
    data's values, and read with each party's own leaves, so that a party's cvxpy trees
    are walked once for their leaves only. The form is the same, bit for bit, as reading
    the party's own nodes: every decision taken from values is taken from its own.
    ``path_key``: the structure and the outcomes of those decisions (None when the party
    reads its own nodes): forms with equal ones are the same operations on their own data.
    ``same_path``: whether the decisions all came out as for the structure's first party.

    The structure's first reading is recorded (:class:`~fedmodel.compiler.glm.Tape`: the
    operations on the leaves' values and the decisions taken from them); once a replay of
    that recipe on the next party's leaves has given that party's own forms bit for bit,
    the structure's other parties are replayed (the same operations on their own values,
    each decision taken again from them) instead of read, and read in full when a
    decision comes out otherwise. ``replayed``: whether its form was replayed."""

    def __init__(self, program: PartyProgram):
        layout = program.layout
        terms = [t.expr for t in program.objective]
        if program.constraints:
            ineq, eq = [c.expr for c in program.ineq], [c.expr for c in program.eq]
            exprs = terms + ineq + eq
        else:  # (an objective only)
            ineq, eq, exprs = [], [], terms
        shared = _structure_nodes(program, exprs)
        leaves: list = []
        self.n = layout.size
        self.replayed = False
        if shared is None:
            nodes = [node_of(e, leaves) for e in exprs]
            path = None
        else:
            nodes, path = shared
            for e in exprs:  # (as the walk of its structure found them, when it did)
                found = program.term_leaves(e)
                if found is None:
                    expression_leaves(e, leaves)
                else:
                    leaves.extend(found)
            if self._replayed(program.structure, nodes, leaves, path):
                return
        tape = Tape() if shared is not None and program.structure not in _RECIPES else None
        reading = Reading(leaves, layout, tape)
        f = None
        try:
            for node in nodes[: len(terms)]:
                g = recognise_node(node, reading)
                f = g if f is None else f.plus(g, reading)
            self.f = f
            self.ineq = self._components(nodes[len(terms) : len(terms) + len(ineq)], reading)
            self.eq = self._components(nodes[len(terms) + len(ineq) :], reading)
        except NotRecognised:
            if tape is not None:
                _RECIPES[program.structure] = None
            raise
        read = tuple(reading.path)
        if shared is not None and path is None:  # (the structure's first form: its path)
            _STRUCTURE_NODES[program.structure] = (nodes, read)
            path = read
        self.same_path = path is not None and read == path
        self.path_key = None if shared is None else (program.structure, read)
        made = [self.f, *self.ineq, *self.eq]
        if tape is not None:  # (its recipe, replayed by the structure's next parties)
            recipe = Recipe(tape, made, reading.path) if tape.valid else None
            _RECIPES[program.structure] = None if recipe is None else (recipe, len(self.ineq))
        elif shared is not None:  # (a recipe not yet compared with a reading: now)
            entry = _RECIPES.get(program.structure)
            if entry is not None and not entry[0].verified and not entry[0].verify(leaves, made):
                _RECIPES[program.structure] = None

    def _replayed(self, structure: str, nodes: list, leaves: list, path: tuple | None) -> bool:
        """Whether the form was made by replaying ``structure``'s verified recipe on
        ``leaves`` (:class:`~fedmodel.compiler.glm.Recipe`): every decision came out as
        recorded, so the operations are those of a reading of its own, on its values."""
        entry = _RECIPES.get(structure)
        if entry is None or not entry[0].verified:
            return False
        recipe, n_ineq = entry
        forms = recipe.replay(leaves)
        if forms is None:
            return False
        self.f = forms[0]
        self.ineq = forms[1 : 1 + n_ineq]
        self.eq = forms[1 + n_ineq :]
        if path is None:  # (the structure's first form since its nodes were made)
            _STRUCTURE_NODES[structure] = (nodes, recipe.path)
            path = recipe.path
        self.same_path = recipe.path == path
        self.path_key = (structure, recipe.path)
        self.replayed = True
        return True

    @staticmethod
    def _components(nodes: list[Node], reading: Reading) -> list[GLMFunction]:
        out: list[GLMFunction] = []
        for node in nodes:
            if node.size == 1 and node.ndim == 0:
                out.append(recognise_node(node, reading))
            else:
                out.extend(recognise_node_components(node, reading))
        return out


#: structure -> (the :class:`~fedmodel.compiler.glm.Recipe` of its first reading, the
#: number of inequality components of its forms), or None when its readings are made in
#: full (a rule that does not record its decisions, a replay that did not give the
#: reading's own forms); it leaves with the structure's nodes
_RECIPES: dict[str, tuple[Recipe, int] | None] = {}

#: structure (:attr:`~fedmodel.compiler.partition.PartyProgram.structure`) -> (the nodes
#: of its terms, the path of its first party's form, None until that form is made), or
#: None when the flags of its nodes depend on the data's values; nodes leave with the
#: program they were made from (they hold its expressions)
_STRUCTURE_NODES: dict[str, tuple[list[Node], tuple | None] | None] = {}


def _structure_nodes(program: PartyProgram, exprs: list) -> tuple[list[Node], tuple | None] | None:
    """The nodes ``program``'s terms ``exprs`` are read through, shared by its structure,
    and its first party's path; None when the structure's flags depend on its data. A
    structure whose skeleton (:func:`~fedmodel.compiler.fingerprint.structure_skeleton`)
    has nodes already takes their flags (:func:`~fedmodel.compiler.glm.node_like`)."""
    key = program.structure
    if key in _STRUCTURE_NODES:
        return _STRUCTURE_NODES[key]
    skeleton = structure_skeleton(key)
    template = _SKELETON_NODES.get(skeleton) if skeleton is not None else None
    nodes = None
    if template is not None and len(template[1]) == len(exprs):
        nodes = [node_like(t, e) for t, e in zip(template[1], exprs)]
    if nodes is None or None in nodes:
        leaves: list = []  # (numbered across the terms, as a party's are read)
        nodes = [node_of(e, leaves) for e in exprs]
    entry = (nodes, None) if all(_fixed(n) for n in nodes) else None
    _STRUCTURE_NODES[key] = entry
    if entry is not None:
        if skeleton is not None and template is None:
            _SKELETON_NODES[skeleton] = (key, nodes)
        weakref.finalize(program, _forget_structure, key, skeleton)
    return entry


#: a skeleton (:func:`~fedmodel.compiler.fingerprint.structure_skeleton`) -> (the
#: structure whose nodes of fixed flags were made first, those nodes); it leaves with them
_SKELETON_NODES: dict = {}


def _forget_structure(key: str, skeleton) -> None:
    _STRUCTURE_NODES.pop(key, None)
    _RECIPES.pop(key, None)
    if skeleton is not None and _SKELETON_NODES.get(skeleton, (None,))[0] == key:
        del _SKELETON_NODES[skeleton]


def _fixed(node: Node) -> bool:
    return node.fixed


def party_glm(program: PartyProgram) -> _PartyGLM:
    """The GLM form of ``program`` (recognised at its first use, then shared: nothing of
    it is changed in place by its users). It is kept by the program
    (:attr:`~fedmodel.compiler.partition.PartyProgram.kept_glm_form`, whichever of its
    solvers is built first: the Newton backend of its inexact steps, the exact-prox backend
    of exact-admm), and leaves with it. A form with a dense quadratic part (a ``d x d``
    matrix of its own, not the party's data) is not kept: it is recognised again rather
    than held for the run."""
    form = program.kept_glm_form
    if form is not None:
        return form
    form = _PartyGLM(program)
    if form.f is None or form.f.Q is None:
        program.kept_glm_form = form
    return form


def _merge_terms(terms: list[GLMTerm]) -> list[GLMTerm]:
    """Stack the data matrices of dense terms of the same kind (one product instead of
    one per term); sparse terms are kept apart."""
    groups: dict = {}
    out: list[GLMTerm] = []
    for t in terms:
        if sp.issparse(t.A):
            out.append(t)
        else:
            groups.setdefault((t.kind, t.M), []).append(t)
    for (kind, M), ts in groups.items():
        if len(ts) == 1:
            out.append(ts[0])
        else:
            out.append(
                GLMTerm(
                    kind,
                    np.vstack([t.dense_A() for t in ts]),
                    np.concatenate([t.b for t in ts]),
                    np.concatenate([t.weights for t in ts]),
                    M,
                )
            )
    return out


_TRACE = False

#: square terms are folded into a dense quadratic form up to this many unknowns
MAX_DENSE_FOLD = 2000

#: Largest number of variables a pooled solve factors densely in a Newton step (O(size^3):
#: ~10 s at 4,000 variables, over 100 s at 10,000); ``centralized`` and cprox-al switch to
#: other backends above it
DENSE_NEWTON_MAX_SIZE = 3000

#: a Newton step of a non-quadratic merit function is solved by the Woodbury identity
#: (:class:`_WoodburyFactor`, an ``m x m`` factor) instead of a dense ``n x n`` Cholesky
#: factor when its Hessian is a positive diagonal plus ``m`` weighted rows (data rows of
#: GLM terms, active augmented-Lagrangian rows) with ``m <= LOW_RANK_RATIO * n``: a
#: client with 100 rows at n = 3,000 factors a 100 x 100 matrix instead of 3,000 x 3,000
LOW_RANK_RATIO = 0.25

#: a block of at least this many unknowns whose Hessian block is diagonal (epigraph
#: variables of hinge-type terms) is eliminated by a Schur complement
SCHUR_MIN_BLOCK = 32

#: constraint matrices with at most this fraction of nonzeros (epigraph rows) are
#: multiplied in sparse (CSR) form
SPARSE_MATVEC_DENSITY = 0.1


class _Smooth:
    """``sum_terms w . phi(A x + b) + x^T Q x / 2 + q^T x + r`` with explicit affine images."""

    def __init__(self, fn: GLMFunction | None, n: int):
        self.n = n
        if fn is None:
            fn = GLMFunction(n)
        # (a GLM form's Q, its own array or the model's constant matrix, is read and never
        # changed here: not copied, a d x d matrix)
        Q = None if fn.Q is None else np.asarray(fn.Q, dtype=float)
        symmetric = fn.Q_symmetric
        q = None if fn.q is None else np.array(fn.q, dtype=float)
        r = float(fn.r)
        terms = []
        for t in fn.terms:
            if t.kind == "square" and n <= MAX_DENSE_FOLD:
                # sum w (a^T x + b)^2 is a quadratic form: folded into (Q, q, r), so the
                # merit function can be recognised as quadratic and its factor cached
                A = t.dense_A()
                WA = A * t.weights[:, None]
                Q = 2.0 * (A.T @ WA) if Q is None else Q + 2.0 * (A.T @ WA)
                symmetric = False  # (A^T W A as products: not exactly symmetric)
                q = 2.0 * (WA.T @ t.b) if q is None else q + 2.0 * (WA.T @ t.b)
                r += float(t.weights @ (t.b * t.b))
            else:
                terms.append(t)
        self.terms = _merge_terms(terms)
        if Q is not None and not symmetric and not is_symmetric(Q):  # (else: itself)
            Q = 0.5 * (Q + Q.T)
        self.Q = None if Q is None else np.ascontiguousarray(Q)
        self.q = q
        self.r = r

    @property
    def quadratic(self) -> bool:
        return not self.terms

    def images(self, x: np.ndarray):
        """The affine images the value, gradient and Hessian need: ``(A_k x + b_k)_k, Qx``."""
        zs = [t.image(x) for t in self.terms]
        Qx = self.Q @ x if self.Q is not None else None
        return zs, Qx

    def value_grad(self, x: np.ndarray, images) -> tuple[float, np.ndarray]:
        zs, Qx = images
        val = self.r
        g = np.zeros(self.n)
        for t, z in zip(self.terms, zs):
            v, d1 = phi_value_d1(t.kind, z, t.M)
            val += float(t.weights @ v)
            g += t.rmatvec(t.weights * d1)
        if Qx is not None:
            val += 0.5 * float(x @ Qx)
            g += Qx
        if self.q is not None:
            val += float(self.q @ x)
            g += self.q
        return float(val), g

    def hessian_products(self, images, V: np.ndarray) -> np.ndarray:
        """``Hessian @ V`` for ``V`` of shape ``(n, k)``, without forming the Hessian: per
        term ``A^T diag(w phi'') A V`` (sparse data stays sparse), plus ``Q V``."""
        zs, _ = images
        out = np.zeros((self.n, V.shape[1]))
        for t, z in zip(self.terms, zs):
            d2 = t.weights * phi_d2(t.kind, z, t.M) * (t.s * t.s)
            out += t.A.T @ (d2[:, None] * (t.A @ V))
        if self.Q is not None:
            out += self.Q @ V
        return out

    def add_hessian(self, H: np.ndarray, images, scale: float = 1.0) -> None:
        """Add ``scale`` times the Hessian to ``H``; only the upper triangle of the
        result is meaningful (what the Cholesky factorisation reads)."""
        zs, _ = images
        for t, z in zip(self.terms, zs):
            H += t.gram_upper(scale * t.weights * phi_d2(t.kind, z, t.M))
        if self.Q is not None:
            H += self.Q if scale == 1.0 else scale * self.Q


def _stack_linear(parts: list[tuple[int, list[GLMFunction]]], n: int):
    """Stack the affine components of all parties: ``G x + g0`` with, per party, where its
    rows sit in the party's multiplier vector; the nonlinear components are returned apart
    as ``(party, index, _Smooth)``."""
    rows, g0, gather, nonlin = [], [], [], []
    for j, comps in parts:
        lin = [k for k, c in enumerate(comps) if c.is_linear]
        for k in lin:
            c = comps[k]
            rows.append(c.q if c.q is not None else np.zeros(n))
            g0.append(c.r)
        if lin:  # all components affine: a slice, so gathering is a view
            full = len(lin) == len(comps)
            gather.append((j, slice(None) if full else np.array(lin, dtype=int)))
        nonlin += [(j, k, _Smooth(c, n)) for k, c in enumerate(comps) if not c.is_linear]
    G = np.array(rows, dtype=float).reshape(len(rows), n)
    return G, np.array(g0, dtype=float), gather, nonlin


def _dense(G) -> np.ndarray:
    """``G`` (an array or a scipy.sparse matrix) as a dense float array."""
    return G.toarray() if hasattr(G, "toarray") else np.asarray(G, dtype=float)


class _State:
    """Everything computed at one point: value, gradient and what the Hessian needs."""

    __slots__ = ("x", "val", "g", "images", "act", "comps")

    def __init__(self, x, val, g, images, act, comps):
        self.x, self.val, self.g, self.images, self.act, self.comps = (
            x,
            val,
            g,
            images,
            act,
            comps,
        )


def cholesky_solve(factor, g: np.ndarray) -> np.ndarray:
    """``H^{-1} g`` from a ``cho_factor`` factor (see :func:`solve_upper`)."""
    U, lower = factor
    if lower:
        return la.cho_solve(factor, g, check_finite=False)
    return solve_upper(U, g)


def solve_upper(U: np.ndarray, g: np.ndarray) -> np.ndarray:
    """``(U^T U)^{-1} g`` for ``cho_factor``'s upper factor ``U``, by two BLAS triangular
    solves (several times faster than LAPACK's potrs for one right-hand side)."""
    y = blas.dtrsv(U, g, trans=1)
    return blas.dtrsv(U, y, trans=0, overwrite_x=1)


def shifted_cholesky(H: np.ndarray, first: float = 1e-9, growth: float = 10.0, tries: int = 30):
    """Cholesky factor of ``H``, shifted by a multiple of I until it exists (indefinite H
    from non-convex terms): ``first * max(1, max |diag H|)``, times ``growth`` per failed
    try; None when even large shifts fail. The factor is read-only: it is only ever
    replaced, never changed in place (so state snapshots can share it)."""
    try:
        return _frozen(la.cho_factor(H, lower=False, check_finite=False))
    except la.LinAlgError:
        pass
    scale = max(1.0, float(np.abs(np.diag(H)).max(initial=1.0)))
    shift = first * scale
    eye = np.eye(H.shape[0])
    for _ in range(tries):
        try:
            return _frozen(la.cho_factor(H + shift * eye, lower=False, check_finite=False))
        except la.LinAlgError:
            shift *= growth
    return None


def _frozen(factor):
    c, lower = factor
    c.flags.writeable = False
    return c, lower


class _SchurFactor:
    """``H^{-1}`` for ``H = [[H_ww, H_wt], [H_tw, diag(d)]]`` through the Schur complement
    ``S = H_ww - H_wt diag(d)^{-1} H_tw`` (one small Cholesky factor of ``S``)."""

    def __init__(self, W, T, d, Hwt, S_factor):
        self.W, self.T, self.d, self.Hwt, self.S_factor = W, T, d, Hwt, S_factor

    def solve(self, g: np.ndarray) -> np.ndarray:
        gw, gt = g[self.W], g[self.T]
        if not self.W.size:  # (every unknown in the diagonal block: a box, no coupling)
            out = np.empty_like(g)
            out[self.T] = gt / self.d
            return out
        dw = cholesky_solve(self.S_factor, gw - self.Hwt @ (gt / self.d))
        out = np.empty_like(g)
        out[self.W] = dw
        out[self.T] = (gt - self.Hwt.T @ dw) / self.d
        return out


class _WoodburyFactor:
    """``H^{-1}`` for ``H = diag(D) + B^T diag(s^2) B`` with few rows in ``B`` (``m`` of
    them, ``m << n``: a client's data rows, its active augmented-Lagrangian rows, with
    weights ``s^2``) by the Woodbury identity ``H^{-1} = D^{-1} - D^{-1} R^T (I + R D^{-1}
    R^T)^{-1} R D^{-1}``, ``R = diag(s) B``: one Cholesky factor of an ``m x m`` matrix;
    ``B`` stays sparse when the data is. ``gram``: ``B B^T`` when ``D`` is a constant
    (computed once by the owner for rows that do not change)."""

    def __init__(self, D: np.ndarray, B, s: np.ndarray, gram: np.ndarray | None = None):
        self.D, self.B, self.s = D, B, s
        if gram is not None:
            K = gram * np.outer(s / np.sqrt(D[0]), s / np.sqrt(D[0]))
        else:
            K = _scaled_gram(B, 1.0 / np.sqrt(D)) * np.outer(s, s)
        K[np.diag_indices_from(K)] += 1.0
        self.L = la.cho_factor(K, lower=True, check_finite=False)

    def solve(self, g: np.ndarray) -> np.ndarray:
        Dg = g / self.D
        if not self.B.shape[0]:
            return Dg
        y = la.cho_solve(self.L, self.s * (self.B @ Dg), check_finite=False)
        return Dg - np.asarray(self.B.T @ (self.s * y)).ravel() / self.D


def _scaled_gram(B, c: np.ndarray) -> np.ndarray:
    """``B diag(c)^2 B^T`` (dense ``m x m``; ``B`` an array or a CSR matrix)."""
    if sp.issparse(B):
        Bc = B.copy()
        Bc.data = Bc.data * c[Bc.indices]
        return (Bc @ Bc.T).toarray()
    Bc = B * c
    return Bc @ Bc.T


def _diagonal_of(Q: np.ndarray | None, n: int) -> np.ndarray | None:
    """The diagonal of ``Q`` (zeros for None) when ``Q`` is diagonal, else None."""
    if Q is None:
        return np.zeros(n)
    d = np.diag(Q).copy()
    return d if np.count_nonzero(Q) == np.count_nonzero(d) else None


def _matvec_form(G: np.ndarray):
    """``(G, G^T)`` for matrix-vector products: CSR matrices when at most a fraction
    :data:`SPARSE_MATVEC_DENSITY` of ``G`` is nonzero, else ``G`` and its transpose view."""
    if G.size and np.count_nonzero(G) <= SPARSE_MATVEC_DENSITY * G.size:
        return sp.csr_matrix(G), sp.csr_matrix(G.T)
    return G, G.T


def _diagonal_block(n: int, obj: _Smooth, G_list: list[np.ndarray]) -> np.ndarray | None:
    """Unknowns whose block of a quadratic merit function's Hessian is diagonal whatever
    the active set: untouched by non-quadratic terms, no off-diagonal entry in ``Q``, and
    at most one of them in each constraint row (epigraph variables of hinge-type terms).
    None when there are fewer than :data:`SCHUR_MIN_BLOCK` of them or they are not most
    of the unknowns."""
    cand = np.ones(n, dtype=bool)
    for t in obj.terms:
        A = t.A
        cols = (A != 0).sum(axis=0) if not sp.issparse(A) else A.getnnz(axis=0)
        cand &= np.asarray(cols).ravel() == 0
    if obj.Q is not None:
        off = obj.Q != 0  # (a mask: no copy of Q)
        off[np.diag_indices(n)] = False
        cand &= ~off.any(axis=0)
    nz = [G != 0 for G in G_list if G.shape[0]]
    count = sum((Z.sum(axis=0) for Z in nz), start=np.zeros(n))
    changed = True
    while changed:  # a row holding two candidates keeps the sparsest column only
        changed = False
        for Z in nz:
            M = Z[(Z & cand).sum(axis=1) > 1] & cand
            if not M.shape[0]:
                continue
            keep = np.where(M, count, np.inf).argmin(axis=1)
            M[np.arange(M.shape[0]), keep] = False
            cand &= ~M.any(axis=0)
            changed = True
    T = np.flatnonzero(cand)
    if T.size < SCHUR_MIN_BLOCK or 2 * T.size < n:
        return None
    return T


def _add_sigma(H: np.ndarray, sigma) -> None:
    """``H += sigma`` for a scalar, diagonal (vector) or full (matrix) ``sigma``."""
    if np.ndim(sigma) == 2:
        H += sigma
    else:
        H[np.diag_indices_from(H)] += sigma


class NewtonSolver:
    """Semismooth Newton with line search for GLM-form merit problems.

    Raises :class:`~fedmodel.compiler.glm.NotRecognised` at construction when the problem
    has another shape (the backend selection then falls back to L-BFGS).

    Attributes
    ----------
    quadratic : bool
        True when the merit function is (piecewise) quadratic; its Cholesky factor is then
        cached and reused while ``(sigma, beta, active set)`` repeat.
    factorizations : int
        Cholesky factorisations computed so far (all cases).
    """

    name = "newton"

    def __init__(self, problem: MeritProblem):
        reg = problem.regularizer
        if not reg.is_smooth:
            raise NotRecognised("h is not smooth")
        if problem.has_cones:
            raise NotRecognised("cone constraints (terms with no smooth form)")
        self.problem = problem
        n = self.n = problem.n
        f_total = None
        ineq, eq = [], []
        for j, prog in enumerate(problem.programs):
            pg = party_glm(prog)
            if pg.f is not None:
                f_total = pg.f if f_total is None else f_total.plus(pg.f)
            ineq.append((j, pg.ineq))
            eq.append((j, pg.eq))
        self.obj = _Smooth(f_total, n)
        self.G_in, self.g0_in, self.gather_in, self.nonlin_in = _stack_linear(ineq, n)
        self.G_eq, self.g0_eq, self.gather_eq, self.nonlin_eq = _stack_linear(eq, n)
        # matrix-vector products with mostly-zero constraint matrices (epigraph rows: one
        # epigraph variable each) in sparse form; the dense ones stay for the Hessians
        self._mv_in, self._mvT_in = _matvec_form(self.G_in)
        self._mv_eq, self._mvT_eq = _matvec_form(self.G_eq)
        self.h_sumsq = np.zeros(n)
        for s, p in zip(reg.slices, reg.pieces):
            self.h_sumsq[s] = p.sumsq
        self.has_h = bool(self.h_sumsq.any())
        # a merit function with only quadratic/affine terms has a Hessian that changes only
        # with sigma, beta and the active set: its Cholesky factor is cached and reused
        self.quadratic = self.obj.quadratic and not self.nonlin_in and not self.nonlin_eq
        self._base = None  # constant part of the quadratic Hessian (per beta)
        # a large diagonal block (epigraph variables) is eliminated by a Schur complement
        self._schur = None
        if self.quadratic:
            T = _diagonal_block(n, self.obj, [self.G_in, self.G_eq])
            if T is not None:
                self._schur = self._schur_data(T)
        # quadratic case: factors by (sigma, beta, active set), least recently used dropped
        # first; a few are kept (active sets can alternate), at most ~64 MB of them
        self._factors: OrderedDict = OrderedDict()
        self._capacity = int(max(1, min(8, 2**23 // max(1, n * n))))
        self._factor = None
        self.factorizations = 0
        self._cache: list = []  # (x, affine images) of the last two points evaluated
        self._verified = False
        self._delegate = None
        self._derivative_hessian = None  # (active-set key, Hessian) of derivatives()
        #: non-quadratic problems: within a solve, reuse the last Hessian's factor (chord
        #: steps) while full steps reduce ||grad||_inf by at least the factor ``chord_rate``
        self.reuse_factor = True
        self.chord_rate = 0.1
        #: non-quadratic problems: start each solve with the factor the previous solve
        #: ended with (chord steps across solves; refreshed by the same rule). The answer
        #: then depends on that factor too, so an owner that turns this on must carry
        #: :meth:`get_state` in its own state (checkpoints, retried steps): prox-al's
        #: clients do, for their ADMM rounds (the same subproblem with moving vectors)
        self.carry_factor = False
        #: Newton iterations before handing over to L-BFGS (slow progress, non-convex terms)
        self.max_newton = 200
        #: ``time.perf_counter()`` value after which a solve returns its current point
        #: (its residual says how far it got): an owner's time limit (cprox-al)
        self.deadline: float | None = None
        #: walls of the last three Newton steps: their median predicts the next one (one
        #: step pre-empted by the operating system on a busy machine does not make the
        #: next look too long to begin)
        self._step_walls: deque[float] = deque(maxlen=3)
        #: Newton steps by the Woodbury identity (:data:`LOW_RANK_RATIO`): None picks them
        #: when the Hessian has few enough rows, True whenever its form allows, False never
        self.low_rank: bool | None = None
        # the diagonals of the quadratic forms (None: one is not diagonal, no Woodbury steps)
        self._low_rank_diag = _diagonal_of(self.obj.Q, n)
        self._comp_diag = {
            id(c): _diagonal_of(c.Q, n) for _, _, c in self.nonlin_in + self.nonlin_eq
        }
        #: Newton steps taken through the Woodbury identity (all solves)
        self.low_rank_steps = 0
        self._low_rank_rows: OrderedDict = OrderedDict()  # rows' key -> [B, B B^T or None]

    # -- evaluation ---------------------------------------------------------------------------
    def _multipliers(self, gather, mults) -> np.ndarray:
        if not gather:
            return np.zeros(0)
        if len(gather) == 1:
            j, idx = gather[0]
            return np.asarray(mults[j], dtype=float)[idx]
        return np.concatenate([np.asarray(mults[j], dtype=float)[idx] for j, idx in gather])

    def _images(self, x: np.ndarray):
        """Affine images at ``x`` (reused when ``x`` is one of the last two points
        evaluated: a solve starts where the previous one ended, and a gradient at another
        point may be asked for in between, see :meth:`merit_value_grad`)."""
        for cx, images in self._cache:
            if np.array_equal(x, cx):
                return images
        images = (
            self.obj.images(x),
            self._mv_in @ x + self.g0_in if self.G_in.shape[0] else None,
            self._mv_eq @ x + self.g0_eq if self.G_eq.shape[0] else None,
            [c.images(x) for _, _, c in self.nonlin_in],
            [c.images(x) for _, _, c in self.nonlin_eq],
        )
        self._cache = [(x.copy(), images)] + self._cache[:1]
        return images

    @staticmethod
    def initial_state() -> dict:
        """:meth:`get_state` of a backend not used yet."""
        return {"factor": None, "verified": False}

    def get_state(self) -> dict:
        """What a solve's answer depends on beyond its arguments: the carried factor
        (``carry_factor``; quadratic problems' factors are functions of their key)."""
        carried = (
            self.carry_factor
            and not self.quadratic
            and not isinstance(self._factor, _WoodburyFactor)
        )
        # whether the cross-check passed: it decides where an owner's gradients come from
        # (this backend's GLM form or the model's evaluator, equal up to rounding), so a
        # resumed run repeats the uninterrupted one bit for bit
        return {"factor": self._factor if carried else None, "verified": self._verified}

    def set_state(self, state: dict) -> None:
        if state.get("verified") and self._delegate is None:
            self._verified = True
        if self.carry_factor and not self.quadratic:
            f = state.get("factor")
            self._factor = None if f is None else _frozen((np.array(f[0], dtype=float), f[1]))

    @property
    def verified(self) -> bool:
        """True once a solve has cross-checked this backend's GLM form against the model's
        own evaluator (and it agreed): :meth:`merit_value_grad` is then trustworthy."""
        return self._verified and self._delegate is None

    def merit_value_grad(self, x, mu, nu) -> tuple[float, np.ndarray]:
        """Value and gradient at ``x`` of the party terms with multipliers ``mu``, ``nu``
        (lists, one array per program): ``sum_p f_p + AL terms``, without the proximal
        term and ``h`` -- what :meth:`PartyFunctions.merit` computes, from this backend's
        GLM form (one pass over each data matrix, images cached)."""
        x = np.asarray(x, dtype=float)
        m_in = self._multipliers(self.gather_in, mu)
        m_eq = self._multipliers(self.gather_eq, nu)
        st = self._evaluate(x, 0.0, x, m_in, m_eq, mu, nu, h=False)
        return st.val, st.g

    def _evaluate(
        self, x: np.ndarray, sigma=None, center=None, m_in=None, m_eq=None, mu=None, nu=None,
        h: bool = True,
    ) -> _State:  # fmt: skip
        p = self.problem
        sigma = p.sigma if sigma is None else sigma
        center = p.center if center is None else center
        mu = p.mu if mu is None else mu
        nu = p.nu if nu is None else nu
        beta = p.beta
        obj_img, c_in, c_eq, img_in, img_eq = self._images(x)
        # (sigma a scalar, a diagonal or a full metric)
        sd = sigma @ (x - center) if np.ndim(sigma) == 2 else sigma * (x - center)
        val_f, g = self.obj.value_grad(x, obj_img)
        val = 0.5 * sd.dot(x - center) + val_f
        g += sd
        if h and self.has_h:
            hx = self.h_sumsq * x
            val += float(hx @ x)
            g += 2 * hx
        act = None
        if c_in is not None:
            m = self._m_in if m_in is None else m_in
            y = m + beta * c_in
            act = y > 0
            y = np.where(act, y, 0.0)
            val += (y @ y - m @ m) / (2 * beta)
            g += self._mvT_in @ y
        if c_eq is not None:
            m = self._m_eq if m_eq is None else m_eq
            y = m + beta * c_eq
            val += (y @ y - m @ m) / (2 * beta)
            g += self._mvT_eq @ y
        comps = []
        for comp_list, imgs, mults, projected in (
            (self.nonlin_in, img_in, mu, True),
            (self.nonlin_eq, img_eq, nu, False),
        ):
            for (j, k, comp), img in zip(comp_list, imgs):
                cv, cg = comp.value_grad(x, img)
                mk = float(mults[j][k])
                y = mk + beta * cv
                if projected and y <= 0:
                    val -= mk * mk / (2 * beta)
                    continue
                val += (y * y - mk * mk) / (2 * beta)
                g += y * cg
                comps.append((comp, img, y, cg))
        return _State(x, float(val), g, obj_img, act, comps)

    @property
    def constant_hessian(self) -> bool:
        """True when the Hessian of the party terms is the same at every point (quadratic
        terms and equalities only: no active set to change)."""
        return self.quadratic and not self.G_in.shape[0]

    def hessian(self, x, mu, nu) -> np.ndarray:
        """The (generalised) Hessian at ``x`` of the party terms with multipliers ``mu``,
        ``nu`` (lists, one array per program): ``sum_p f_p`` + AL terms, without the
        proximal term and ``h``; only its upper triangle is meaningful. prox-al's clients
        use it as the metric of their ADMM penalty (``penalty_metric="hessian"``)."""
        x = np.asarray(x, dtype=float)
        m_in = self._multipliers(self.gather_in, mu)
        m_eq = self._multipliers(self.gather_eq, nu)
        st = self._evaluate(x, 0.0, x, m_in, m_eq, mu, nu, h=False)
        return self._hessian(st, sigma=0.0, h=False)

    def derivatives(self, x, mu, nu) -> tuple[float, np.ndarray, np.ndarray]:
        """Value, gradient and (generalised) Hessian at ``x`` of the party terms with
        multipliers ``mu``, ``nu`` (lists, one array per program): ``sum_p f_p`` + AL terms,
        without the proximal term and ``h``; the Hessian is full (both triangles) and
        read-only: on a (piecewise) quadratic problem the same array is returned while the
        active set repeats. prox-al's federated Newton inner solver
        (``inner_solver="newton"``) asks each client for these.

        The first call cross-checks value and gradient against the model's own evaluator,
        as the first :meth:`solve` does; raises :class:`NotRecognised` when they disagree
        (the caller then uses another method: this backend would hand over to L-BFGS).
        """
        if self._delegate is not None:
            raise NotRecognised("the GLM form disagreed with the model's evaluator")
        x = np.asarray(x, dtype=float)
        st = self._checked_state(x, mu, nu)
        g = np.array(st.g, dtype=float)
        key = None
        if self.quadratic:  # the Hessian is a function of the active set (and beta)
            key = (self.problem.beta, None if st.act is None else st.act.tobytes())
            cached = self._derivative_hessian
            if cached is not None and cached[0] == key:
                return st.val, g, cached[1]
        H = self._hessian(st, sigma=0.0, h=False)  # (a new array; its upper triangle)
        lower = np.tril_indices(self.n, -1)
        H[lower] = H.T[lower]
        H.setflags(write=False)
        if key is not None:
            self._derivative_hessian = (key, H)
        return st.val, g, H

    def products(self, x, mu, nu, V) -> tuple[float, np.ndarray, np.ndarray]:
        """Value, gradient and Hessian-vector products ``H V`` (``V`` of shape ``(n, k)``)
        at ``x`` of the party terms with multipliers ``mu``, ``nu``: what
        :meth:`derivatives` gives, with ``H V`` in place of ``H`` (``O(k n)`` numbers and
        never a dense ``n x n`` matrix: prox-al's quasi-Newton inner solver asks the
        clients for these along a few directions). The first call cross-checks value and
        gradient against the model's own evaluator, as :meth:`derivatives` does.

        Examples
        --------
        >>> import cvxpy as cp, fedmodel as fm
        >>> m = fm.Model("hvp"); w = m.variable(2, name="w"); c = m.client("c")
        >>> c.minimize(cp.sum_squares(w - c.data(np.ones(2), name="b")))
        >>> p = MeritProblem([m.compile().clients[0]], 1.0)
        >>> NewtonSolver(p).products(np.zeros(2), [[]], [[]], np.eye(2))[2].tolist()
        [[2.0, 0.0], [0.0, 2.0]]
        """
        if self._delegate is not None:
            raise NotRecognised("the GLM form disagreed with the model's evaluator")
        x = np.asarray(x, dtype=float)
        V = np.asarray(V, dtype=float).reshape(self.n, -1)
        st = self._checked_state(x, mu, nu)
        beta = self.problem.beta
        HV = self.obj.hessian_products(st.images, V)
        if st.act is not None and st.act.any():
            Ga = self.G_in[st.act]
            HV += beta * (Ga.T @ (Ga @ V))
        if self.G_eq.shape[0]:
            HV += beta * (self.G_eq.T @ (self.G_eq @ V))
        for comp, img, y, cg in st.comps:
            HV += y * comp.hessian_products(img, V) + beta * np.outer(cg, cg @ V)
        return st.val, np.array(st.g, dtype=float), HV

    def stiff_rows(self, x, mu, nu, affine: bool = False, nonaffine: bool = True) -> np.ndarray:
        """The rows ``J`` (``(r, n)``) of the augmented-Lagrangian terms' Gauss-Newton
        curvature at ``x``: ``sqrt(beta)`` times the gradient of every equality, of every
        active non-affine inequality (``nonaffine``) and of every active affine inequality
        (``affine``), so that their part of :meth:`hessian` is ``J^T J`` (the second-order
        part ``y grad^2 c`` is not in it). prox-al's quasi-Newton inner solver with
        ``constraint_curvature`` adds them to its model exactly: the clients' rows without
        their affine inequalities, the server's without its non-affine ones (measured, see
        ``ProxALOptions.constraint_curvature``).

        Examples
        --------
        >>> import cvxpy as cp, fedmodel as fm
        >>> m = fm.Model("rows"); w = m.variable(2, name="w"); c = m.client("c")
        >>> c.minimize(cp.sum_squares(w)); _ = c.subject_to([w[0] + w[1] == 1])
        >>> p = MeritProblem([m.compile().clients[0]], 4.0)
        >>> NewtonSolver(p).stiff_rows(np.zeros(2), [[]], [np.zeros(1)]).tolist()
        [[2.0, 2.0]]
        """
        x = np.asarray(x, dtype=float)
        st = self._checked_state(x, mu, nu, reuse=True)
        rows = []
        if affine and st.act is not None and st.act.any():
            rows.append(_dense(self.G_in[st.act]))
        if self.G_eq.shape[0]:
            rows.append(_dense(self.G_eq))
        equalities = {id(comp) for _, _, comp in self.nonlin_eq}
        rows += [
            np.asarray(cg, dtype=float).reshape(1, -1)
            for comp, _, _, cg in st.comps
            if nonaffine or id(comp) in equalities
        ]
        if not rows:
            return np.zeros((0, self.n))
        return np.sqrt(self.problem.beta) * np.vstack(rows)

    def _checked_state(self, x, mu, nu, reuse: bool = False) -> _State:
        """The evaluation at ``x`` with multipliers ``mu``, ``nu`` (no proximal term, no
        ``h``), cross-checked against the model's evaluator the first time. The last one is
        kept; ``reuse``: return it when it was at the same ``x``, ``mu``, ``nu`` and
        ``beta`` (:meth:`stiff_rows` after :meth:`products` at the same point)."""
        key = (
            np.asarray(x, dtype=float).tobytes(),
            tuple(np.asarray(m, dtype=float).tobytes() for m in (*mu, *nu)),
            self.problem.beta,
        )
        last = getattr(self, "_last_checked", None)
        if reuse and last is not None and last[0] == key:
            return last[1]
        st = self._checked_state_new(x, mu, nu)
        self._last_checked = (key, st)
        return st

    def _checked_state_new(self, x, mu, nu) -> _State:
        m_in = self._multipliers(self.gather_in, mu)
        m_eq = self._multipliers(self.gather_eq, nu)
        st = self._evaluate(x, 0.0, x, m_in, m_eq, mu, nu, h=False)
        if not self._verified:  # the party terms from the model's evaluator
            val, g = 0.0, np.zeros(self.n)
            for fn, m, v in zip(self.problem.functions, mu, nu):
                fv, fg = fn.merit(x, m, v, self.problem.beta)
                val, g = val + fv, g + fg
            if not self._cross_check(st, (val, g)):
                raise NotRecognised("the GLM form disagreed with the model's evaluator")
            self._verified = True
        return st

    def _hessian(self, st: _State, sigma=None, h: bool = True) -> np.ndarray:
        p = self.problem
        beta = p.beta
        sigma = p.sigma if sigma is None else sigma
        H = np.diag(2 * self.h_sumsq if h else np.zeros(self.n))
        _add_sigma(H, sigma)
        self.obj.add_hessian(H, st.images)
        if st.act is not None and st.act.any():
            Ga = self.G_in[st.act]
            H += beta * (Ga.T @ Ga)
        if self.G_eq.shape[0]:
            H += beta * (self.G_eq.T @ self.G_eq)
        for comp, img, y, cg in st.comps:
            comp.add_hessian(H, img, scale=y)
            H += beta * np.outer(cg, cg)
        return H

    def _quadratic_hessian(self, st: _State) -> np.ndarray:
        p = self.problem
        if self._base is None or self._base[0] != p.beta:
            B = np.diag(2 * self.h_sumsq)
            if self.obj.Q is not None:
                B += self.obj.Q
            if self.G_eq.shape[0]:
                B += p.beta * (self.G_eq.T @ self.G_eq)
            self._base = (p.beta, B)
        H = self._base[1].copy()
        _add_sigma(H, p.sigma)
        if st.act is not None and st.act.any():
            Ga = self.G_in[st.act]
            H += p.beta * (Ga.T @ Ga)
        return H

    def _schur_data(self, T: np.ndarray) -> dict:
        """What the Schur complement needs, computed once: the kept unknowns ``W``, the
        constraint rows split into their ``W`` part and their single ``T`` entry."""
        n = self.n
        W = np.setdiff1d(np.arange(n), T)
        where = np.full(n, -1)
        where[T] = np.arange(T.size)

        def split(G):
            GT = G[:, T]
            has = GT != 0
            col = np.where(has.any(axis=1), has.argmax(axis=1), -1)
            val = np.where(col >= 0, GT[np.arange(G.shape[0]), np.maximum(col, 0)], 0.0)
            return np.ascontiguousarray(G[:, W]), col, val

        Qd = np.diag(self.obj.Q) if self.obj.Q is not None else np.zeros(n)
        return {
            "W": W,
            "T": T,
            "in": split(self.G_in),
            "eq": split(self.G_eq),
            "Qww": self.obj.Q[np.ix_(W, W)] if self.obj.Q is not None else None,
            "diag": 2 * self.h_sumsq + Qd,  # used on T (Q is diagonal there)
        }

    def _schur_factor(self, act) -> _SchurFactor | None:
        """The Newton matrix of the quadratic case at the active set ``act``, factored
        through its diagonal block; None when that block is not positive."""
        sd, p = self._schur, self.problem
        W, T = sd["W"], sd["T"]
        nw, nt = W.size, T.size
        beta = p.beta
        sig = np.broadcast_to(p.sigma, (self.n,))
        d = sig[T] + sd["diag"][T]
        Hww = np.diag(sig[W] + 2 * self.h_sumsq[W])
        if sd["Qww"] is not None:
            Hww += sd["Qww"]
        Hwt = np.zeros((nt, nw))  # H_tw, accumulated row by row
        parts = [sd["eq"]]
        if act is not None and act.any():
            GW, col, val = sd["in"]
            parts.append((GW[act], col[act], val[act]))
        for GW, col, val in parts:
            if not GW.shape[0]:
                continue
            Hww += beta * (GW.T @ GW)
            on = col >= 0
            d += beta * np.bincount(col[on], weights=val[on] ** 2, minlength=nt)
            np.add.at(Hwt, col[on], beta * val[on, None] * GW[on])
        if not np.all(d > 0) or not np.all(np.isfinite(d)):
            return None
        Hwt = np.ascontiguousarray(Hwt.T)
        S = Hww - Hwt @ (Hwt.T / d[:, None])
        S_factor = shifted_cholesky(0.5 * (S + S.T))
        if S_factor is None:
            return None
        return _SchurFactor(W, T, d, Hwt, S_factor)

    def _low_rank_factor(self, st: _State) -> _WoodburyFactor | None:
        """The Newton matrix at ``st`` as a positive diagonal plus weighted rows, factored
        by the Woodbury identity (:class:`_WoodburyFactor`); None when it has no such form
        (a full metric ``sigma``, a non-diagonal quadratic form, a negative curvature
        weight) or, with ``low_rank`` None, more than ``LOW_RANK_RATIO * n`` rows."""
        if self.low_rank is False or self._low_rank_diag is None:
            return None
        p, n = self.problem, self.n
        if np.ndim(p.sigma) == 2:
            return None
        D = np.broadcast_to(np.asarray(p.sigma, dtype=float), (n,)) + 2 * self.h_sumsq
        D = D + self._low_rank_diag
        blocks: list = []  # (rows, weights >= 0)
        keys: list = []  # (what the rows are, for the cache of stacked rows)

        def add(key, A, w) -> None:
            keys.append(key)
            blocks.append((A, w))

        def add_terms(smooth: _Smooth, images, scale: float) -> bool:
            for j, (t, z) in enumerate(zip(smooth.terms, images[0])):
                w = scale * t.weights * phi_d2(t.kind, z, t.M) * (t.s * t.s)
                if w.size and w.min() < 0:
                    return False
                add((id(smooth), j), t.A, w)
            return True

        if not add_terms(self.obj, st.images, 1.0):
            return None
        beta = p.beta
        if st.act is not None and st.act.any():
            add(("in", st.act.tobytes()), self.G_in[st.act], np.full(int(st.act.sum()), beta))
        if self.G_eq.shape[0]:
            add("eq", self.G_eq, np.full(self.G_eq.shape[0], beta))
        for comp, img, y, cg in st.comps:
            diag = self._comp_diag[id(comp)]
            if diag is None or y < 0 or not add_terms(comp, img, y):
                return None
            D = D + y * diag
            add(None, cg.reshape(1, -1), np.array([beta]))
        rows = sum(A.shape[0] for A, _ in blocks)
        if self.low_rank is None and rows > LOW_RANK_RATIO * n:
            return None
        if not np.all(D > 0) or not np.all(np.isfinite(D)):
            return None
        # the stacked rows, and their Gram matrix when D is a constant, are kept while the
        # same rows come back (no nonlinear constraint rows: the data rows and a given
        # active set), so a factorisation is O(m^2) + an m x m Cholesky factor
        key = None if st.comps else tuple(keys)
        uniform = bool(np.all(D == D[0]))
        cached = self._low_rank_rows.get(key) if key is not None else None
        if cached is None:
            mats = [A for A, _ in blocks]
            if not mats:
                B = np.zeros((0, n))
            elif any(sp.issparse(A) for A in mats):
                B = sp.vstack([sp.csr_matrix(A) for A in mats]).tocsr()
            else:
                B = np.vstack(mats)
            cached = [B, None]
            if key is not None:
                self._low_rank_rows[key] = cached
                while len(self._low_rank_rows) > 4:
                    self._low_rank_rows.popitem(last=False)
        elif key is not None:
            self._low_rank_rows.move_to_end(key)
        B = cached[0]
        gram = None
        if uniform and key is not None:
            if cached[1] is None:
                cached[1] = _scaled_gram(B, np.ones(n))
            gram = cached[1]
        weights = np.concatenate([w for _, w in blocks]) if blocks else np.zeros(0)
        try:
            factor = _WoodburyFactor(D, B, np.sqrt(weights), gram)
        except la.LinAlgError:  # (rounding: the m x m matrix is I + PSD)
            return None
        self.low_rank_steps += 1
        return factor

    def _step(self, st: _State, refresh: bool) -> tuple[np.ndarray, bool]:
        """Newton step at ``st``; returns ``(step, fresh)``, ``fresh`` False when a factor
        of an earlier Hessian was reused (chord step; see :meth:`solve`)."""
        fresh = True
        if self.quadratic:
            act = st.act.tobytes() if st.act is not None else b""
            key = (self.problem.sigma_key, self.problem.beta, act)
            factor = self._factors.get(key)
            if factor is None:
                schur = self._schur is not None and np.ndim(self.problem.sigma) < 2
                factor = self._schur_factor(st.act) if schur else None
                if factor is None:
                    factor = shifted_cholesky(self._quadratic_hessian(st))
                self.factorizations += 1
                self._factors[key] = factor
                while len(self._factors) > self._capacity:
                    self._factors.popitem(last=False)
            else:
                self._factors.move_to_end(key)
            self._factor = factor
        elif refresh or self._factor is None or not self.reuse_factor:
            factor = self._low_rank_factor(st)
            self._factor = shifted_cholesky(self._hessian(st)) if factor is None else factor
            self.factorizations += 1
        else:
            fresh = False
        if self._factor is None:
            return -st.g, fresh
        if isinstance(self._factor, (_SchurFactor, _WoodburyFactor)):
            return -self._factor.solve(st.g), fresh
        return -cholesky_solve(self._factor, st.g), fresh

    # -- solve ------------------------------------------------------------------------------
    def solve(self, x0: np.ndarray, tol: float, max_iter: int = 200) -> SolveReport:
        if self._delegate is not None:
            self._delegate.deadline = self.deadline
            report = self._delegate.solve(x0, tol, max_iter)
            report.backend = "newton->lbfgs"
            return report
        x = np.array(x0, dtype=float)
        woodbury = isinstance(self._factor, _WoodburyFactor)  # (cheap: never carried)
        if not self.quadratic and (not self.carry_factor or woodbury):
            # chord steps reuse only a factor computed in this solve: the answer is then a
            # function of (x0, parameters) alone, not of earlier solves (so a run resumed
            # from a checkpoint, or a retried step, repeats the uninterrupted iterates)
            self._factor = None
        p = self.problem  # multipliers of the stacked affine constraints, fixed in a solve
        self._m_in = self._multipliers(self.gather_in, p.mu)
        self._m_eq = self._multipliers(self.gather_eq, p.nu)
        st = self._evaluate(x)
        if not self._verified and not self._cross_check(st):
            return self.solve(x0, tol, max_iter)  # now with the L-BFGS delegate
        it, message = 0, "converged"
        newton_cap = min(max_iter, self.max_newton)
        gnorm = float(np.abs(st.g).max(initial=0.0))
        refresh = False
        while gnorm > tol:
            started = time.perf_counter()
            # a step that would end after the deadline is not started (the last step's wall
            # predicts the next one: a dense Newton step on ~4000 variables takes ~10 s)
            predicted = statistics.median(self._step_walls) if self._step_walls else 0.0
            if self.deadline is not None and started + predicted > self.deadline:
                # a prediction that stops a step is forgotten (its largest wall first): one
                # slow outlier cannot skip every later step of the party, since a skipped
                # step measures nothing that would correct it
                if started < self.deadline and self._step_walls:
                    self._step_walls.remove(max(self._step_walls))
                message = "time limit"
                break
            if it >= newton_cap:  # slow progress (non-convex terms): hand over to L-BFGS
                return self._fallback(st.x, tol, max_iter, it)
            it += 1
            step, fresh = self._step(st, refresh)
            slope = float(st.g @ step)
            if not slope < 0:  # not a descent direction (numerical trouble): use the gradient
                step, slope = -st.g, -float(st.g @ st.g)
            t = 1.0
            while True:
                new = self._evaluate(st.x + t * step)
                if new.val <= st.val + 1e-4 * t * slope:
                    break
                new_gnorm = float(np.abs(new.g).max(initial=0.0))
                # at machine precision the value cannot resolve the decrease: accept a full
                # step that still reduces the gradient
                if (
                    t == 1.0
                    and new.val - st.val <= 1e-13 * max(1.0, abs(st.val))
                    and new_gnorm < gnorm
                ):
                    break
                if t < 1e-10:
                    break
                t *= 0.5
            if t < 1e-10 and new.val > st.val:
                message = "line search failed (at machine precision?)"
                self._images(st.x)  # keep the cache at the returned point
                break
            st = new
            new_gnorm = float(np.abs(st.g).max(initial=0.0))
            if _TRACE:
                print(f"it {it} fresh {fresh} t {t:.3g} val {st.val:.12g} g {new_gnorm:.3e}")
            # the factor is reused for the next step (a chord step: two matrix-vector
            # products instead of a Hessian) only while full steps contract the gradient fast
            refresh = t < 1.0 or new_gnorm > self.chord_rate * gnorm
            gnorm = new_gnorm
            self._step_walls.append(time.perf_counter() - started)
        if not self._verified:  # first solve: the residual also from the model's evaluator
            check = self.problem.residual(st.x)
            if not residuals_agree(check, gnorm, st.val):
                self._disagree()
                return self.solve(x0, tol, max_iter)
            self._verified = True
        return SolveReport(st.x, gnorm, tol, it, self.name, message)

    def _cross_check(self, st: _State, reference=None) -> bool:
        """Compare value and gradient with the model's own smooth evaluator (first solve),
        or with ``reference = (value, gradient)`` from it; hand over to L-BFGS if they
        disagree."""
        val, g = self.problem.smooth_value_grad(st.x) if reference is None else reference
        ok = evaluations_agree((val, g), (st.val, st.g))
        if not ok:
            self._disagree()
        return ok

    def _disagree(self) -> None:
        from fedmodel.subproblems.quasi_newton import QuasiNewtonSolver

        warnings.warn(
            "Newton backend: the GLM form of the merit function disagrees with the "
            "model's evaluator; using L-BFGS for this subproblem",
            RuntimeWarning,
            stacklevel=3,
        )
        self._delegate = QuasiNewtonSolver(self.problem)

    def _fallback(self, x, tol, max_iter, it) -> SolveReport:
        from fedmodel.subproblems.quasi_newton import QuasiNewtonSolver

        if not hasattr(self, "_quasi"):
            self._quasi = QuasiNewtonSolver(self.problem)
        self._quasi.deadline = self.deadline
        report = self._quasi.solve(x, tol, max(1, max_iter - it))
        report.iterations += it
        report.backend = "newton+lbfgs"
        return report
