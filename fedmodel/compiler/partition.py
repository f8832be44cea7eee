"""Partition a :class:`~fedmodel.Model` into one program per party, and check it.

A :class:`PartyProgram` is everything one party knows: its own objective terms, its own
constraints and its own data. Algorithms hand each party only its program, so no code
path can read another party's data.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import cvxpy as cp
import numpy as np

from fedmodel.cached import cached_property
from fedmodel.compiler.cones import ConeBlock, cone_residuals
from fedmodel.compiler.fingerprint import party_fingerprint, structure_reading
from fedmodel.compiler.regularizer import Regularizer
from fedmodel.compiler.smooth import (
    NotSmoothError,
    SmoothFunction,
    VariableLayout,
    check_smooth,
    compile_smooth,
)
from fedmodel.compiler.smoothness import restricted_domain
from fedmodel.dsl.data import PrivateData, check_finite_constants, fingerprint
from fedmodel.dsl.party import ConstraintTerm, ObjectiveTerm, Party
from fedmodel.errors import ModelError, OwnershipError, UnsupportedError
from fedmodel.expressions import leaves

#: ``(structure, fact name) -> value``: :meth:`PartyProgram.structure_fact`
_STRUCTURE_FACTS: dict[tuple[str, str], Any] = {}


@dataclass
class PartyProgram:
    """One party's part of the model: ``f_i``, ``c_i`` (``<= 0``) and ``a_i`` (``== 0``).

    Attributes
    ----------
    name : str
        The party (``"server"`` for the server).
    layout : VariableLayout
        How the model variables are stacked into one vector ``x``.
    objective, constraints : lists of terms as declared.
    """

    name: str
    is_server: bool
    layout: VariableLayout
    objective: list[ObjectiveTerm]
    constraints: list[ConstraintTerm]
    data: tuple[PrivateData, ...] = ()
    #: its GLM form (:func:`fedmodel.subproblems.newton.party_glm`) once recognised, kept
    #: with it (not pickled); None before
    kept_glm_form: Any = field(default=None, init=False, repr=False, compare=False)

    def __getstate__(self) -> dict:
        """Pickled (to a worker process, a Ray actor, a checkpoint) without the compiled
        evaluators (numpy closures built from cvxpy, not picklable): the receiving process
        compiles its own on first use."""
        state = dict(self.__dict__)
        state.pop("functions", None)
        state.pop("structure", None)  # (found again where it is received)
        state.pop("_structure_leaves", None)
        state.pop("kept_glm_form", None)  # (recognised again where it is received)
        state.pop("_local_view", None)  # (a view of this program: made again on first use)
        return state

    @property
    def ineq(self) -> list[ConstraintTerm]:
        return [c for c in self.constraints if c.kind == "ineq"]

    @property
    def eq(self) -> list[ConstraintTerm]:
        return [c for c in self.constraints if c.kind == "eq"]

    # (a program's terms do not change once compiled: its cones and row counts are found
    # once)
    @cached_property
    def cones(self) -> list[ConstraintTerm]:
        """Hard cone constraints ``E(x) in K`` of terms with no smooth form
        (:mod:`fedmodel.dsl.conic`); solved exactly by the cvxpy backend."""
        return [c for c in self.constraints if c.kind == "cone"]

    @cached_property
    def m_cone(self) -> int:
        return sum(c.size for c in self.cones) if self.constraints else 0

    @cached_property
    def m_ineq(self) -> int:
        return sum(c.size for c in self.ineq) if self.constraints else 0

    @cached_property
    def m_eq(self) -> int:
        return sum(c.size for c in self.eq) if self.constraints else 0

    @property
    def nonconvex(self) -> bool:
        return any(t.allow_nonconvex for t in self.objective) or any(
            c.allow_nonconvex for c in self.constraints
        )

    @property
    def is_empty(self) -> bool:
        return not self.objective and not self.constraints

    @property
    def has_walls(self) -> bool:
        """Whether this party has inequality constraints of the user's (not the compiler's
        internal rows, such as epigraph pieces)."""
        return any(c.kind == "ineq" and not c.internal for c in self.constraints)

    def objective_expr(self) -> cp.Expression | int:
        return sum((t.expr for t in self.objective), start=0) if self.objective else 0

    def constraint_labels(self, kind: str) -> list[tuple[str, int]]:
        """``(label, size)`` of each constraint block of the given kind, in stacking order."""
        return [(c.label, c.size) for c in self.constraints if c.kind == kind]

    @cached_property
    def restricted_domain(self) -> bool:
        """Whether a term of this party is defined on part of the space only
        (:func:`~fedmodel.compiler.smoothness.restricted_domain`: ``kl_div``, ``entr``,
        ``log`` ...), so that its gradient may be infinite at a finite point (structure,
        not data: found once per :attr:`structure`)."""

        def find() -> bool:
            terms = [t.expr for t in self.objective] + [c.expr for c in self.constraints]
            return any(restricted_domain(e) for e in terms)

        return self.structure_fact("restricted_domain", find)

    @cached_property
    def structure(self) -> str:
        """This party's terms up to its data's values
        (:func:`~fedmodel.compiler.fingerprint.structure_fingerprint`), found once where
        the party runs (not pickled with the program)."""
        digest, leaves = structure_reading(self)
        self.__dict__["_structure_leaves"] = leaves
        return digest

    def term_leaves(self, expr: Any) -> list | None:
        """The leaves of the term ``expr`` (one of this program's objective terms and
        constraints), left to right, as the walk of :attr:`structure` found them (the list
        of :func:`~fedmodel.compiler.glm.expression_leaves`; read only); None when that
        walk has not run or ``expr`` is not one of its terms."""
        entry = self.__dict__.get("_structure_leaves", {}).get(id(expr))
        return entry[1] if entry is not None and entry[0] is expr else None

    def structure_fact(self, name: str, find: Callable[[], Any]) -> Any:
        """The fact ``name`` of this party's :attr:`structure`, ``find()`` (which reads
        its terms' structure only, never its data's values): found by the first party of
        each structure and shared by the others of this process, which have the same
        terms up to their data's values. A ``find`` that raises is not kept."""
        key = (self.structure, name)
        if key not in _STRUCTURE_FACTS:
            _STRUCTURE_FACTS[key] = find()
        return _STRUCTURE_FACTS[key]

    @cached_property
    def functions(self) -> PartyFunctions:
        """Value/gradient evaluators of ``f``, ``c`` and ``a`` (compiled once).

        Raises :class:`~fedmodel.errors.UnsupportedError` naming the term when a term is
        not differentiable (gradient-based methods and certificates need ``C^1`` terms).
        """
        return PartyFunctions(self)

    def local(self) -> PartyProgram:
        """This program over the party's own view ``x = (shared, own variables)`` (what a
        federated method's party works on); itself when the model has no owned variables.
        """
        if not self.layout.has_owned:
            return self
        view = self.__dict__.get("_local_view")  # made once: its evaluators are kept too
        if view is None:
            view = self.__dict__["_local_view"] = PartyProgram(
                name=self.name,
                is_server=self.is_server,
                layout=self.layout.local(self.name),
                objective=self.objective,
                constraints=self.constraints,
                data=self.data,
            )
        return view

    def fingerprint(self) -> dict[str, str]:
        """This party's checkpoint fingerprint (its terms with every constant in them, and
        its data), computed where it runs: :func:`fedmodel.compiler.fingerprint.party_fingerprint`."""
        return party_fingerprint(self)

    def data_bytes(self) -> int:
        total = 0
        for d in self.data:
            v = d.value
            total += v.data.nbytes if hasattr(v, "nnz") else np.asarray(v).nbytes
        return total


#: at most this many vector-Jacobian products per constraint kind when the certificate
#: measures the scale of the Lagrangian's terms (blocks beyond it are grouped)
SCALE_BLOCKS = 16


class PartyFunctions:
    """Compiled numpy evaluators for one party: ``f(x)``, ``c(x)`` stacked, ``a(x)`` stacked."""

    def __init__(self, program: PartyProgram):
        self.program = program
        layout = program.layout
        self.f = self._compile(
            [t.expr for t in program.objective], [t.label for t in program.objective], scalar=True
        )
        self.c = self._compile(
            [cp.vec(c.expr, order="F") for c in program.ineq], [c.label for c in program.ineq]
        )
        self.a = self._compile(
            [cp.vec(c.expr, order="F") for c in program.eq], [c.label for c in program.eq]
        )
        self.k = self._compile(
            [cp.vec(c.expr, order="F") for c in program.cones], [c.label for c in program.cones]
        )
        self.blocks = [ConeBlock(c.source) for c in program.cones]
        self.n = layout.size
        self.m_ineq = program.m_ineq
        self.m_eq = program.m_eq
        self.m_cone = program.m_cone

    def forget_parameter_values(self) -> None:
        """Drop what was computed from parameter values (the constant parts the certificate
        scales by, the cone blocks): recomputed on next use. The evaluators stay: they read
        ``param.value`` at every evaluation."""
        for name in ("constant_parts", "cone_constant_part", "_auxiliary_rows"):
            self.__dict__.pop(name, None)
        self.blocks = [ConeBlock(c.source) for c in self.program.cones]

    def _compile(self, exprs, labels, scalar=False) -> SmoothFunction | None:
        if not exprs:
            return None
        for e, lab in zip(exprs, labels):  # attribute a failure to the term at fault
            try:
                check_smooth(e)
            except NotSmoothError as exc:
                raise UnsupportedError(
                    f"term '{lab}' is not continuously differentiable ({exc}); gradient-based "
                    "methods (prox-al, admm, cprox-al) and the KKT certificate need C^1 terms. "
                    "Move nonsmooth regularisers into model.regularize(...) or use "
                    "method='centralized'.",
                    self.program.name,
                    str(e),
                ) from exc
        if scalar:
            total = sum(exprs[1:], start=exprs[0])
        else:
            total = cp.hstack(exprs) if len(exprs) > 1 else exprs[0]
        return compile_smooth(total, self.program.layout)

    def objective(self, x: np.ndarray) -> float:
        return float(self.f.value(x)[0]) if self.f is not None else 0.0

    def objective_and_grad(self, x: np.ndarray) -> tuple[float, np.ndarray]:
        if self.f is None:
            return 0.0, np.zeros(self.n)
        return self.f.value_and_grad(x)

    def constraint_values(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        ci = self.c.value(x) if self.c is not None else np.zeros(0)
        ce = self.a.value(x) if self.a is not None else np.zeros(0)
        return ci, ce

    def constraint_vjp(self, x: np.ndarray, yi: np.ndarray, ye: np.ndarray) -> np.ndarray:
        """``J_c(x)^T yi + J_a(x)^T ye``."""
        g = np.zeros(self.n)
        if self.c is not None and yi.size and np.any(yi):
            g += self.c.vjp(x, yi)[1]
        if self.a is not None and ye.size and np.any(ye):
            g += self.a.vjp(x, ye)[1]
        return g

    def lagrangian_grad(
        self, x: np.ndarray, mu: np.ndarray, nu: np.ndarray, cone: np.ndarray | None = None
    ) -> np.ndarray:
        """``grad f(x) + J_c(x)^T mu + J_a(x)^T nu - J_E^T lambda`` (this party's share of
        stationarity; ``cone`` is ``lambda``, the multipliers of its cone constraints)."""
        g = self.objective_and_grad(x)[1] + self.constraint_vjp(x, mu, nu)
        if self.k is not None:
            g = g + self.cone_grad(x, cone)
        return g

    def lagrangian_terms(
        self,
        x: np.ndarray,
        mu: np.ndarray,
        nu: np.ndarray,
        cone: np.ndarray | None = None,
        grad_f: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`lagrangian_grad` and, per coordinate, the largest magnitude of the terms it
        sums: ``|grad f|`` and each constraint block's ``|J_j^T mu_j|`` (inequality, equality
        and cone blocks separately, at most :data:`SCALE_BLOCKS` products per kind). The
        certificate divides stationarity by these (:mod:`fedmodel.certificate.kkt`).
        ``grad_f``: the objective's gradient at ``x`` when the caller has it (not copied)."""
        gf = self.objective_and_grad(x)[1] if grad_f is None else grad_f
        grad, scale = np.array(gf, dtype=float), np.abs(gf)
        program = self.program
        kinds = (
            (self.c, program.ineq, mu, 1.0),
            (self.a, program.eq, nu, 1.0),
            (self.k, program.cones, cone, -1.0),
        )
        for fun, terms, y, sign in kinds:
            if fun is None or y is None or not np.any(y):
                continue
            y = np.asarray(y, dtype=float)
            bounds = np.cumsum([0] + [t.size for t in terms])
            groups = np.array_split(np.arange(len(terms)), min(len(terms), SCALE_BLOCKS))
            for group in groups:
                adj = np.zeros_like(y)
                lo, hi = bounds[group[0]], bounds[group[-1] + 1]
                adj[lo:hi] = y[lo:hi]
                if not np.any(adj):
                    continue
                term = sign * fun.vjp(x, adj)[1]
                grad += term
                np.maximum(scale, np.abs(term), out=scale)
        return grad, scale

    @cached_property
    def constant_parts(self) -> tuple[np.ndarray, np.ndarray]:
        """``(b_ineq, b_eq)``: the constant sides of the constraints, stacked, for the scale
        of their feasibility residuals (:func:`fedmodel.certificate.kkt.constraint_scale`).

        For an affine ``c(x) = A x - b`` this is ``c(0) = -b``; for a nonlinear one the
        constant addends of its top-level sum (``norm(X w - y) - eps``: ``-eps``, not
        ``c(0) = ||y|| - eps``; ``quad_form(w, S) - 0.002``: ``-0.002``), 0 when it has none.
        Non-finite entries read 0."""
        zero = np.zeros(self.n)
        with np.errstate(all="ignore"):
            try:
                ci, ce = self.constraint_values(zero)
            except (ValueError, FloatingPointError, ZeroDivisionError):
                ci, ce = np.zeros(self.m_ineq), np.zeros(self.m_eq)
        parts = []
        for at_zero, terms in ((ci, self.program.ineq), (ce, self.program.eq)):
            out, off = np.array(at_zero, dtype=float), 0
            for t in terms:
                if not t.expr.is_affine():
                    const = np.broadcast_to(_constant_addend(t.expr), t.expr.shape)
                    out[off : off + t.size] = np.asarray(const, dtype=float).ravel(order="F")
                off += t.size
            parts.append(np.nan_to_num(out, nan=0.0, posinf=0.0, neginf=0.0))
        return parts[0], parts[1]

    def cone_values(self, x: np.ndarray) -> np.ndarray:
        """``E(x)`` of the cone constraints, stacked (empty without any)."""
        return self.k.value(x) if self.k is not None else np.zeros(0)

    def cone_grad(self, x: np.ndarray, cone: np.ndarray | None) -> np.ndarray:
        """``-J_E^T lambda``: the cone constraints' share of the Lagrangian gradient."""
        if self.k is None or cone is None or not np.any(cone):
            return np.zeros(self.n)
        return -self.k.vjp(x, np.asarray(cone, dtype=float))[1]

    def cone_residuals(
        self,
        x: np.ndarray,
        cone: np.ndarray | None,
        scaled: bool = False,
        reference: float = 1.0,
    ) -> tuple[float, ...]:
        """``(feasibility, violation)`` of the cone constraints at ``x`` with multipliers
        ``cone`` (zeros when None), and with ``scaled`` the scaled feasibility third
        (``reference``: the objective's reference scale), see
        :func:`fedmodel.compiler.cones.cone_residuals`."""
        if self.k is None:
            return (0.0, 0.0, 0.0) if scaled else (0.0, 0.0)
        lam = np.zeros(self.m_cone) if cone is None else np.asarray(cone, dtype=float)
        e0 = self.cone_constant_part if scaled else None
        absolute = self.internal_masks[2] if scaled else None
        return cone_residuals(
            self.blocks,
            self.cone_values(x),
            lam,
            scaled=scaled,
            e0=e0,
            absolute=absolute,
            reference=reference,
        )

    @cached_property
    def internal_masks(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per stacked entry of the inequalities, equalities and cone constraints: True for
        the pieces of an objective term's epigraph or cone form (``internal``), whose
        feasibility is measured with an absolute floor
        (:func:`fedmodel.compiler.cones.constraint_scale`)."""
        program = self.program
        return tuple(
            np.concatenate([np.full(t.size, t.internal) for t in terms])
            if terms
            else np.zeros(0, dtype=bool)
            for terms in (program.ineq, program.eq, program.cones)
        )

    @cached_property
    def cone_constant_part(self) -> np.ndarray:
        """``E(0)`` of the cone constraints (their affine arguments' constant parts, e.g. the
        ``eps`` and ``-y`` of ``norm(X w - y) <= eps``), non-finite entries as 0: a block
        with a nonzero one is scaled by its own terms (:func:`cone_residuals`)."""
        with np.errstate(all="ignore"):
            try:
                e0 = self.cone_values(np.zeros(self.n))
            except (ValueError, FloatingPointError, ZeroDivisionError):
                e0 = np.zeros(self.m_cone)
        return np.nan_to_num(e0, nan=0.0, posinf=0.0, neginf=0.0)

    def merit(
        self, x: np.ndarray, mu: np.ndarray, nu: np.ndarray, beta: float
    ) -> tuple[float, np.ndarray]:
        """Value and gradient of ``f + (||[mu + beta c]_+||^2 - ||mu||^2)/(2 beta)
        + (||nu + beta a||^2 - ||nu||^2)/(2 beta)`` (seed 000 eqs. 10-11 without the prox term).
        """
        val, grad = self.objective_and_grad(x)
        grad = grad.copy()
        ci, ce = self.constraint_values(x)
        yi = np.maximum(mu + beta * ci, 0.0) if ci.size else ci
        ye = nu + beta * ce if ce.size else ce
        val += (yi.dot(yi) - mu.dot(mu)) / (2 * beta) if ci.size else 0.0
        val += (ye.dot(ye) - nu.dot(nu)) / (2 * beta) if ce.size else 0.0
        grad += self.constraint_vjp(x, yi, ye)
        return float(val), grad


def _constant_addend(expr) -> np.ndarray | float:
    """The sum of the constant addends of ``expr``'s top-level sum (through negations), 0
    when there is none: the constant side of a constraint ``g(x) - b`` with ``g``
    nonlinear."""
    if expr.is_constant():
        value = expr.value
        return 0.0 if value is None else np.asarray(value, dtype=float)
    if isinstance(expr, cp.atoms.affine.add_expr.AddExpression):
        return sum((_constant_addend(a) for a in expr.args), start=0.0)
    if isinstance(expr, cp.atoms.affine.unary_operators.NegExpression):
        return -_constant_addend(expr.args[0])
    return 0.0


@dataclass
class CompiledModel:
    """The partitioned model: one program per party, the regulariser and the layout."""

    name: str
    layout: VariableLayout
    server: PartyProgram
    clients: list[PartyProgram]
    regularizer: Regularizer
    notes: list[str] = field(default_factory=list)
    #: what the clients publish (``client.publish``): a vertical model when non-empty
    publications: tuple = ()
    #: ``(party name, term)`` of each term holding a :class:`cvxpy.Parameter`, found at
    #: the compile (:func:`parameter_terms`): the values checked before each solve
    parametrized: tuple = ()

    @property
    def parties(self) -> list[PartyProgram]:
        return [self.server, *self.clients]

    @cached_property
    def nonconvex(self) -> bool:
        """Whether a party has terms declared nonconvex (found once: the programs do not
        change once compiled)."""
        return any(p.nonconvex for p in self.parties)

    @property
    def n_clients(self) -> int:
        return len(self.clients)

    @property
    def has_constraints(self) -> bool:
        """True when a party has constraints the algorithm must handle (cone constraints
        are solved exactly inside their party's own subproblem and do not count)."""
        return any(c.kind != "cone" for p in self.parties for c in p.constraints)

    @cached_property
    def has_cones(self) -> bool:
        """Whether a party has cone constraints (found once: the programs do not change
        once compiled)."""
        return any(p.cones for p in self.parties)

    @cached_property
    def walled(self) -> tuple[PartyProgram, ...]:
        """The parties with inequality constraints of the user's
        (:attr:`PartyProgram.has_walls`), in order (found once: the programs do not change
        once compiled)."""
        return tuple(p for p in self.parties if p.has_walls)

    def conic_parties(self) -> list[str]:
        """Parties whose subproblems take the conic path (cvxpy backend)."""
        return [p.name for p in self.parties if p.cones]

    def shared_hessian_obstacle(self) -> str:
        """Why the parties cannot exchange Hessians of their subproblems on the shared
        variables ("" when they can, as prox-al's Newton inner solver needs): party-owned
        variables (their blocks never travel), a non-smooth ``h``, cone constraints."""
        if self.layout.has_owned:
            return "parties own variables (their blocks never travel)"
        if not self.regularizer.is_smooth:
            return "h is not smooth"
        if self.has_cones:
            return "parties have cone constraints (no Hessians)"
        return ""

    def require_smooth(self, method: str) -> None:
        """Raise :class:`UnsupportedError` naming the party and term when a term is not
        continuously differentiable (gradient-based methods need C^1 terms)."""
        for p in self.parties:
            p.structure_fact("smooth", lambda p=p: _require_smooth(p, method))

    def with_simple_sets_in_h(self, method: str) -> CompiledModel:
        """This model with the server's simple-set constraints moved into ``h``.

        Bounds ``v >= lo``, ``v <= hi`` (nonnegativity included) and norm balls
        ``norm(v, 2) <= r`` on a whole shared variable ``v`` are the indicator of a set
        with an exact projection, which methods without constraint handling (admm, the
        dald family) apply in their prox of ``h``. Other constraints stay (and the method
        says it cannot take them).
        """
        from fedmodel.compiler.regularizer import parse_regularizer_term

        shared = list(self.layout.shared_variables)
        moved, kept = [], []
        for c in self.server.constraints:
            try:
                cone = c.kind == "cone"  # cone constraints stay in their party's subproblem
                items = [] if cone or c.source is None else parse_regularizer_term(c.source, shared)
            except (UnsupportedError, ModelError):
                items = []
            simple = items and all(kind in ("lower", "upper", "ball") for kind, _, _ in items)
            (moved if simple else kept).append(c)
        if not moved:
            return self
        terms = list(self.regularizer.terms) + [c.source for c in moved]
        try:
            reg = Regularizer.from_model_terms(terms, self.layout)
        except UnsupportedError as exc:
            raise UnsupportedError(
                f"method '{method}' takes the server's simple-set constraints "
                f"{[c.label for c in moved]} as part of h, but together with h they have no "
                f"closed-form prox: {exc}",
                self.server.name,
            ) from exc
        server = PartyProgram(
            name=self.server.name,
            is_server=True,
            layout=self.server.layout,
            objective=self.server.objective,
            constraints=kept,
            data=self.server.data,
        )
        note = f"server constraints {[c.label for c in moved]} taken as part of h (projection)"
        return CompiledModel(self.name, self.layout, server, self.clients, reg, [*self.notes, note])

    def with_current_parameters(self, model) -> CompiledModel:
        """This compiled model for another solve of ``model`` (a :class:`fedmodel.Model`
        whose declaration has not changed since it was compiled): each party's parameters
        checked again (a value may have been unset), ``h`` parsed again (its weights and
        bounds may be parameters), and the values the evaluators computed from parameters
        dropped. The programs and their compiled evaluators are reused (``Model.compile``).
        """
        for name, term in self.parametrized:  # (the terms are those of the compile)
            check_finite_constants(term.expr, name, term.label, require_values=True)
        for party in self.parties:
            for program in (party, party.__dict__.get("_local_view")):
                functions = program.__dict__.get("functions") if program is not None else None
                if functions is not None:  # (compiled on first use)
                    functions.forget_parameter_values()
        return replace(
            self, regularizer=Regularizer.from_model_terms(model._regularizers, self.layout)
        )

    def program(self, name: str) -> PartyProgram:
        for p in self.parties:
            if p.name == name:
                return p
        raise KeyError(name)


def _require_smooth(p: PartyProgram, method: str) -> bool:
    """True when every term of ``p`` is continuously differentiable; otherwise raise
    :class:`UnsupportedError` naming the party and term (structure only)."""
    for label, expr in [(t.label, t.expr) for t in p.objective] + [
        (c.label, c.expr) for c in p.constraints
    ]:
        try:
            check_smooth(expr)
        except NotSmoothError as exc:
            raise UnsupportedError(
                f"term '{label}' is not continuously differentiable ({exc}); "
                f"method '{method}' and the KKT certificate need C^1 terms. Move "
                "nonsmooth regularisers into model.regularize(...) or use "
                "method='centralized'.",
                p.name,
                str(expr),
            ) from exc
    return True


def check_ownership(model, party: Party) -> None:
    """Raise :class:`OwnershipError` if a term of ``party`` touches another party's data
    or a variable owned by another party (``party.variable(...)``) of ``model`` (a
    :class:`fedmodel.Model`: read, not imported, since ``Model.compile`` calls down here).

    The server may use what the clients publish (``client.publish(expr)``): inside a
    published expression the publishing client's variables and data are allowed; anywhere
    else they are not. A client may not use another client's published expression (it is
    sent to the server only)."""
    published = getattr(model, "_published", {})

    def published_whole(e):  # a published expression (Client.publish) is taken whole
        pub = published.get(id(e))
        return pub if pub is not None and pub.expr is e else None

    terms = [(t.label, t.expr) for t in party.objective_terms] + [
        (c.label, c.expr) for c in party.constraints
    ]
    for label, expr in terms:
        for leaf in leaves(expr, whole=published_whole):
            if not isinstance(leaf, cp.Expression):  # a Publication
                if leaf.owner != party.name and not party.is_server:
                    raise OwnershipError(
                        f"'{label}' uses the expression '{leaf.name}' published by "
                        f"'{leaf.owner}'; published expressions are sent to the server, and "
                        "only the server's terms may use them.",
                        party.name,
                        str(expr),
                    )
                continue
            if isinstance(leaf, cp.Variable):
                owner = model.owner_of(leaf)
                if owner is not None and owner != party.name:
                    hint = (
                        f" The server sees only what '{owner}' publishes: write the term "
                        f"with an expression '{owner}' publishes ({owner}.publish(...))."
                        if party.is_server and published
                        else " Share what other parties need through a model.variable(...) instead."
                    )
                    raise OwnershipError(
                        f"'{label}' uses variable '{leaf.name()}' owned by '{owner}'. A "
                        "party-owned variable may only appear in its owner's terms and "
                        "constraints, or inside an expression its owner publishes." + hint,
                        party.name,
                        str(expr),
                    )
            elif isinstance(leaf, PrivateData):
                if leaf.owner != party.name:
                    raise OwnershipError(
                        f"'{label}' uses data '{leaf.data_name}' owned by '{leaf.owner}'. A "
                        "party's terms may only use its own data; share derived quantities "
                        "through the algorithm instead.",
                        party.name,
                        str(expr),
                    )
            elif isinstance(leaf, cp.Constant) and model._fingerprints:
                fp = fingerprint(leaf.value)
                owner = model._fingerprints.get(fp) if fp is not None else None
                if owner is not None and owner != party.name:
                    raise OwnershipError(
                        f"'{label}' contains a constant {leaf.shape} equal to data registered "
                        f"by '{owner}'. A party's terms may only use its own data.",
                        party.name,
                        str(expr),
                    )


def parameter_terms(party: Party) -> list:
    """The terms of ``party`` holding a :class:`cvxpy.Parameter`, after refusing one whose
    parameter has no value or a non-finite one (set after the declaration's own check),
    naming party and term.

    Parameters are read where the party runs, at every evaluation: a new ``param.value``
    is used by the next solve without declaring the model again (its value is checked
    again then: :meth:`CompiledModel.with_current_parameters`).
    """
    terms = [t for t in [*party.objective_terms, *party.constraints] if t.expr.parameters()]
    for term in terms:
        check_finite_constants(term.expr, party.name, term.label, require_values=True)
    return terms


def compile_model(model) -> CompiledModel:
    """Partition ``model`` (a :class:`fedmodel.Model`, read through its public attributes:
    this layer does not import the DSL's model, whose ``compile`` calls down here) and run
    the compile-time checks."""
    if not model.all_variables:
        raise ModelError("the model has no variables; declare one with model.variable(shape)")
    if not model.clients:
        raise ModelError("the model has no clients; add one with model.client(name)")
    # shared variables first, then each party's own block (server, then clients)
    owned = [v for p in [model.server, *model.clients] for v in p.owned_variables]
    layout = VariableLayout(
        list(model.variables) + owned,
        {v.id: model.owner_of(v) for v in owned},
        model._hidden,
    )
    programs, parametrized = [], []
    for party in [model.server, *model.clients]:
        publishes = any(pub.owner == party.name for pub in getattr(model, "publications", ()))
        if (
            not party.is_server
            and not party.objective_terms
            and not party.constraints
            and not publishes
        ):
            what = (
                "data but no objective terms or constraints"
                if party.data_handles
                else "no data and no terms"
            )
            raise ModelError(
                f"client '{party.name}' has {what}; give it an objective (site.minimize) or "
                "constraints (site.subject_to), or remove it",
                party.name,
            )
        check_ownership(model, party)
        parametrized += [(party.name, t) for t in parameter_terms(party)]
        programs.append(
            PartyProgram(
                name=party.name,
                is_server=party.is_server,
                layout=layout,
                objective=list(party.objective_terms),
                constraints=list(party.constraints),
                data=party.data_handles,
            )
        )
    reg = Regularizer.from_model_terms(model._regularizers, layout)
    return CompiledModel(
        model.name,
        layout,
        programs[0],
        programs[1:],
        reg,
        publications=tuple(getattr(model, "publications", ())),
        parametrized=tuple(parametrized),
    )
