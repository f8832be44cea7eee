"""Parties of a federated model: clients (data owners) and the server."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

import cvxpy as cp
import numpy as np
from cvxpy.constraints import Equality, Inequality, NonNeg, NonPos, Zero

from fedmodel.dsl import conic
from fedmodel.dsl.data import PrivateData, as_numeric_array, without_infinite_bounds
from fedmodel.dsl.epigraph import epigraph_form, norm_ball_as_smooth
from fedmodel.errors import (
    DataError,
    ModelError,
    NonConvexError,
    OwnershipError,
    UnsupportedError,
)
from fedmodel.expressions import AtomTable, leaves, nodes, summands


@dataclass(frozen=True)
class ObjectiveTerm:
    """One call of ``minimize``: a scalar expression added to the party's objective."""

    expr: cp.Expression
    label: str
    allow_nonconvex: bool
    #: the expression the user wrote when ``expr`` is its epigraph/cone form (the objective
    #: is reported on it: :func:`fedmodel.certificate.kkt.user_model_values`)
    source: Any = None


@dataclass(frozen=True)
class ConstraintTerm:
    """One constraint, normalised to ``g(w) <= 0`` (``kind="ineq"``) or ``g(w) == 0``
    (``kind="eq"``), with ``g`` flattened in cvxpy's column-major order."""

    expr: cp.Expression
    kind: str
    label: str
    allow_nonconvex: bool
    source: Any  # the cvxpy constraint the user wrote
    #: the user's constraint when this term is part of its epigraph/cone form (its violation
    #: is reported on that constraint); None for a constraint kept as written
    origin: Any = None
    #: part of the epigraph/cone form of an objective term (no constraint of the user's:
    #: left out of the reported violation, kept in the certificate)
    internal: bool = False
    #: how this term's multiplier gives the dual value of the user's constraint (None: it
    #: gives none, e.g. an epigraph piece): ``("as-is",)``, ``("pieces", sizes)`` for the
    #: split rows of a max-type constraint, ``("ball", r)`` for ``norm(x, 2) <= r``
    #: written ``sum_squares(x) - r^2 <= 0``
    dual_map: tuple | None = None

    @property
    def size(self) -> int:
        return int(self.expr.size)

    @property
    def user_constraint(self) -> Any:
        """The constraint the user passed to ``subject_to`` that this term comes from."""
        return self.origin if self.origin is not None else self.source

    @property
    def user_label(self) -> str:
        """The label of :attr:`user_constraint` (this term's, less a cone-form suffix)."""
        return self.label.split(":cone[")[0]

    def user_dual(self, multiplier: np.ndarray) -> np.ndarray | None:
        """The dual value of :attr:`user_constraint` in cvxpy's convention (its shape;
        ``>= 0`` for an inequality, the multiplier of ``lhs - rhs`` for an equality) from
        this term's multiplier (flattened column-major); None when this term is not the
        one that carries it.

        The dual of ``lhs <= rhs`` is the rate at which the optimum falls as ``rhs``
        grows: ``-(d g / d rhs)^T mu`` for the normalised ``g(x) <= 0``.

        Examples
        --------
        >>> import cvxpy as cp, numpy as np
        >>> x = cp.Variable(2)
        >>> term = ConstraintTerm(cp.sum_squares(x) - 4, "ineq", "c", False,
        ...                       cp.norm(x, 2) <= 2, dual_map=("ball", 2.0))
        >>> float(term.user_dual(np.array([0.25])))
        1.0
        """
        if self.dual_map is None:
            return None
        con = self.user_constraint
        shape = tuple(con.shape)
        mu = np.asarray(multiplier, dtype=float).reshape(-1)
        rule = self.dual_map[0]
        if rule == "ball":  # d(-r^2)/dr = -2 r
            mu = 2.0 * self.dual_map[1] * mu
        elif rule == "pieces":  # each split row carries the element of c it bounds
            size = int(np.prod(shape, dtype=int))
            total, offset = np.zeros(size), 0
            for n in self.dual_map[1]:
                piece = mu[offset : offset + n]
                offset += n
                total += piece if n == size else piece.sum()
            mu = total
        return mu.reshape(shape, order="F") if shape else mu.reshape(())


class Party:
    """Common part of clients and the server: private data, objective terms, constraints."""

    is_server = False

    def __init__(self, model, name: str):  # model: the fedmodel.Model that declares it
        self._model = model
        self.name = name
        self._data: list[PrivateData] = []
        self._objective: list[ObjectiveTerm] = []
        self._constraints: list[ConstraintTerm] = []
        self._variables: list[cp.Variable] = []

    # -- data ------------------------------------------------------------------------------
    def data(self, array: Any, name: str | None = None) -> PrivateData:
        """Register private data of this party and return a handle for cvxpy expressions.

        Parameters
        ----------
        array : numpy array, scipy.sparse matrix or pandas DataFrame/Series
            The data. Converted to float; NaN, inf and non-numeric columns are refused.
        name : str, optional
            A name used in error messages and summaries (default ``data0``, ``data1``...).

        Returns
        -------
        PrivateData
            A cvxpy constant tagged with this party as owner.

        Examples
        --------
        >>> import numpy as np, cvxpy as cp, fedmodel as fm
        >>> model = fm.Model()
        >>> w = model.variable(2)
        >>> site = model.client("site0")
        >>> X = site.data(np.array([[1.0, 2.0], [3.0, 4.0]]), name="X")
        >>> site.minimize(cp.sum_squares(X @ w - 1))
        """
        if name is not None and not isinstance(name, str):
            raise DataError(
                f"a data name is a string, got {type(name).__name__} (the call is "
                "data(array, name='...'))",
                party=self.name,
            )
        name = name or f"data{len(self._data)}"
        if any(d.data_name == name for d in self._data):
            raise DataError(f"data name '{name}' is used twice", party=self.name)
        value = as_numeric_array(array, owner=self.name, name=name)
        handle = PrivateData(value, owner=self.name, name=name)
        self._data.append(handle)
        self._model._register_data(handle)
        return handle

    # -- variables -------------------------------------------------------------------------
    def variable(
        self, shape: int | tuple[int, ...] = (), name: str | None = None, **attributes: Any
    ) -> cp.Variable:
        """Declare a variable owned by this party and return it (a plain ``cvxpy.Variable``).

        An owned variable may appear only in this party's objective terms and constraints
        (checked at compile time, like data ownership); it never crosses the network: the
        party keeps its block locally and only the shared variables (``model.variable``)
        are exchanged. Its value is written to ``.value`` after every solve.

        Parameters
        ----------
        shape : int or tuple of int
            Shape of the variable (``()`` for a scalar).
        name : str, optional
            Name shown in summaries and in ``res.solution`` (unique in the model).
        **attributes
            ``symmetric=True``, ``PSD=True``, ``NSD=True`` as in cvxpy: the equivalent
            constraints held by this party (see :meth:`fedmodel.Model.variable`); other
            attributes are refused.

        Examples
        --------
        >>> import numpy as np, cvxpy as cp, fedmodel as fm
        >>> model = fm.Model()
        >>> w = model.variable(2, name="w")
        >>> site = model.client("site0")
        >>> b = site.variable(name="site0_bias")
        >>> X = site.data(np.array([[1.0, 2.0], [3.0, 4.0]]), name="X")
        >>> site.minimize(cp.sum_squares(X @ w + b - 1) + cp.square(b))
        """
        where = f"{'model.server' if self.is_server else 'client'}.variable()"
        structure = structure_flags(attributes, where, self.name, shape)
        name = name or f"{self.name}.v{len(self._variables)}"
        var = self._model._new_variable(shape, name, self.name)
        self._variables.append(var)
        self._structure(var, structure)
        return var

    def _structure(self, var: cp.Variable, flags: list[str]) -> None:
        """The constraints of the attributes ``flags`` (``structure_flags``) on ``var``,
        held by this party, labelled by the attribute the user wrote; their multipliers are
        internal (no dual value: they are no constraint of the user's)."""
        if not flags:
            return
        cons = [cp.upper_tri(var) == cp.upper_tri(var.T)] if var.shape[0] > 1 else []
        if "PSD" in flags:
            cons.append(cp.lambda_min(var) >= 0)
        if "NSD" in flags:
            cons.append(cp.lambda_max(var) <= 0)
        first = len(self._constraints)
        label = f"{var.name()} ({', '.join(f + '=True' for f in flags)})"
        self.subject_to(cons, name=label)
        self._constraints[first:] = [replace(t, dual_map=None) for t in self._constraints[first:]]

    def _epigraph(self, expr: cp.Expression, label: str) -> tuple[cp.Expression, list]:
        """``expr`` in epigraph form (see :mod:`fedmodel.dsl.epigraph`) when that makes it
        smooth: the smooth expression and the constraint terms on the new auxiliaries
        (owned by this party, hidden from ``res.solution``). Otherwise ``expr`` unchanged
        (the compiler or the method then says what it cannot take)."""
        from fedmodel.compiler.smooth import NotSmoothError, check_smooth

        try:
            check_smooth(expr)
            return expr, []
        except NotSmoothError:
            pass
        made: list[tuple[cp.Variable, str]] = []

        def make_aux(shape, stem):
            var = cp.Variable(shape)
            made.append((var, stem))
            return var

        smooth, pieces = epigraph_form(expr, make_aux)
        try:
            check_smooth(smooth)
            for p in pieces:
                check_smooth(p)
        except NotSmoothError:
            return expr, []
        for var, stem in made:  # name and register the auxiliaries now that they are used
            var._name = f"{self.name}.{stem}{len(self._variables)}"
            self._model._adopt_variable(var, self.name, hidden=True)
            self._variables.append(var)
        terms = [
            ConstraintTerm(p, "ineq", f"{label}:epigraph[{j}]", False, None)
            for j, p in enumerate(pieces)
        ]
        return smooth, terms

    def _register_aux(self, var: cp.Variable, stem: str) -> None:
        var._name = f"{self.name}.{stem}{len(self._variables)}"
        self._model._adopt_variable(var, self.name, hidden=True)
        self._variables.append(var)

    def _cone_terms(self, con: Any, label: str, first: int = 0) -> list[ConstraintTerm]:
        """``con`` (a DCP constraint with no smooth form) as hard cone constraints (see
        :mod:`fedmodel.dsl.conic`); its auxiliaries become this party's hidden variables."""
        try:
            cones, new_vars = conic.lift(con)
        except TypeError as exc:
            raise UnsupportedError(
                f"term '{label}' has no smooth form and its cone form is not supported: {exc}",
                self.name,
                str(con),
            ) from exc
        for var in new_vars:
            self._register_aux(var, "cone")
        return [
            ConstraintTerm(conic.cone_vector(c), "cone", f"{label}:cone[{j}]", False, c)
            for j, c in enumerate(cones, start=first)
        ]

    def _conic_objective(self, expr: cp.Expression, label: str) -> tuple[cp.Expression, list]:
        """A convex objective term with summands that have no smooth/epigraph form: each
        such summand ``s`` becomes an auxiliary ``t`` with the cone form of ``s <= t``; the
        other summands stay (in epigraph form where that makes them smooth)."""
        parts, extra = [], []
        for s in summands(expr):
            s2, pieces = self._epigraph(s, label)
            if _smooth(s2) and all(_smooth(p.expr) for p in pieces):
                parts.append(s2)
                extra.extend(pieces)
                continue
            t = cp.Variable()
            self._register_aux(t, "epi")
            parts.append(t)
            first = sum(1 for c in extra if c.kind == "cone")  # labels unique in the term
            extra.extend(self._cone_terms(s <= t, label, first))
        return sum(parts[1:], start=parts[0]), extra

    @property
    def owned_variables(self) -> tuple[cp.Variable, ...]:
        """Variables owned by this party (declared ones and epigraph auxiliaries)."""
        return tuple(self._variables)

    # -- terms -----------------------------------------------------------------------------
    def minimize(
        self, expr: Any, *, allow_nonconvex: bool = False, name: str | None = None
    ) -> None:
        """Add ``expr`` to this party's objective (several calls add up).

        Parameters
        ----------
        expr : cvxpy scalar expression
            Must be DCP-convex, unless ``allow_nonconvex=True``, in which case it must be
            built from smooth atoms (it is then solved by a smooth local solver and the
            certificate is a local KKT one).
            Non-smooth convex terms are rewritten exactly: piecewise-linear atoms into
            epigraph form (:mod:`fedmodel.dsl.epigraph`, smooth), other atoms (a 2-norm,
            ``lambda_max``, ``geo_mean``, ...) into cone constraints solved by the cvxpy
            backend in this party's subproblem (:mod:`fedmodel.dsl.conic`). On the server,
            a nonnegative combination of nuclear and spectral norms (``cp.normNuc``,
            ``cp.sigma_max``) of whole shared variables goes to the regulariser ``h``
            (:meth:`fedmodel.Model.regularize`), whose prox is closed form.
        allow_nonconvex : bool
            Opt in to a smooth non-DCP term (seed 000 Section 5.3 style).
        name : str, optional
            Label used in summaries and error messages.
        """
        label = name or f"objective[{len(self._objective)}]"
        if isinstance(expr, cp.constraints.constraint.Constraint):
            raise ModelError(
                "minimize() takes an expression, not a constraint", self.name, str(expr)
            )
        expr = cp.Expression.cast_to_const(expr) if not isinstance(expr, cp.Expression) else expr
        written = expr
        if not expr.is_scalar():
            raise DataError(
                f"objective term '{label}' must be scalar, got shape {expr.shape} "
                "(wrap it in cp.sum(...)?)",
                self.name,
                str(expr),
            )
        self._model._check_variables(expr, self.name, label)
        self._check_curvature(
            expr, label, allow_nonconvex, convex=expr.is_convex(), kind="objective term"
        )
        if self.is_server and not allow_nonconvex and self._model._matrix_norms_only(expr):
            self._model.regularize(expr)  # (the server holds h: its prox is one SVD)
            return
        extra: list[ConstraintTerm] = []
        if not allow_nonconvex:
            expr, extra = self._epigraph(expr, label)
            if not extra and not _smooth(expr):  # no smooth form: cone constraints
                expr, extra = self._conic_objective(expr, label)
        source = written if expr is not written else None
        self._objective.append(ObjectiveTerm(expr, label, allow_nonconvex, source))
        self._constraints.extend(replace(t, internal=True) for t in extra)
        self._model._declared()

    def maximize(
        self, expr: Any, *, allow_nonconvex: bool = False, name: str | None = None
    ) -> None:
        """Add ``-expr`` to this party's objective: maximize a concave ``expr``.

        The model minimizes the sum of every party's objective, so ``maximize(u)`` is
        ``minimize(-u)`` (``res.objective`` is the value of that minimized sum, as in a
        cvxpy ``Minimize`` of the negated utility).

        Parameters
        ----------
        expr : cvxpy scalar expression
            Must be DCP-concave, unless ``allow_nonconvex=True`` (smooth terms only, see
            :meth:`minimize`).
        allow_nonconvex : bool
            Opt in to a smooth non-concave term (local certificate).
        name : str, optional
            Label used in summaries and error messages.

        Examples
        --------
        >>> import cvxpy as cp, numpy as np, fedmodel as fm
        >>> model = fm.Model()
        >>> w = model.variable(2)
        >>> site = model.client("site0")
        >>> A = site.data(np.eye(2), name="A")
        >>> site.maximize(-cp.sum_squares(A @ w - 1))
        >>> round(float(model.solve(method="centralized").x @ np.ones(2)), 6)
        2.0
        """
        label = name or f"objective[{len(self._objective)}]"
        if isinstance(expr, cp.constraints.constraint.Constraint):
            raise ModelError(
                "maximize() takes an expression, not a constraint", self.name, str(expr)
            )
        expr = cp.Expression.cast_to_const(expr) if not isinstance(expr, cp.Expression) else expr
        if not allow_nonconvex and not expr.is_concave():
            raise NonConvexError(
                f"objective term '{label}' passed to maximize() is not DCP-concave. "
                f"{_dcp_reason(-expr)}\nIf it is smooth and you accept a local (KKT) "
                "certificate, pass allow_nonconvex=True to this call.",
                self.name,
                str(expr),
            )
        self.minimize(-expr, allow_nonconvex=allow_nonconvex, name=label)

    def subject_to(
        self,
        constraints: Any,
        *,
        allow_nonconvex: bool = False,
        name: str | None = None,
    ) -> Any:
        """Add constraints held by this party and return them.

        Parameters
        ----------
        constraints : cvxpy constraint or iterable of constraints
            ``expr <= expr`` / ``expr >= expr`` (convex side smaller) and affine
            ``expr == expr``. Vector constraints count one component each.
        allow_nonconvex : bool
            Opt in to smooth non-convex constraints (for example a difference of two
            convex losses, seed 000 eq. 28).
        name : str, optional
            Label (suffixed with an index when a list is given).

        Returns
        -------
        cvxpy constraint or list of constraints
            What was passed (the same objects). After a solve with multipliers each one's
            ``dual_value`` holds its dual value in cvxpy's shape and sign convention (as
            ``res.multipliers[party][label]``); None after a method without multipliers.

        Examples
        --------
        >>> import cvxpy as cp, fedmodel as fm
        >>> model = fm.Model()
        >>> w = model.variable(2)
        >>> site = model.client("site0")
        >>> site.minimize(cp.sum_squares(w - 2))
        >>> budget = site.subject_to(cp.sum(w) <= 2)
        >>> res = model.solve(method="centralized")
        >>> round(float(budget.dual_value), 4)  # the optimum falls by 2 per unit of budget
        2.0
        """
        items = list(constraints) if isinstance(constraints, Iterable) else [constraints]
        if not items:
            raise ModelError("subject_to() got an empty list of constraints", self.name)
        try:
            self._add_constraints(items, name, allow_nonconvex)
        finally:  # (also when a later item is refused: the earlier ones were added)
            self._model._declared()
        return items if isinstance(constraints, Iterable) else constraints

    def _add_constraints(self, items: list, name: str | None, allow_nonconvex: bool) -> None:
        for j, c in enumerate(items):
            label = name if (name and len(items) == 1) else (f"{name}[{j}]" if name else None)
            label = label or f"constraint[{len(self._constraints)}]"
            c = without_infinite_bounds(c, self.name, label)  # (+inf: no bound, as cvxpy)
            if c is None:  # every entry unbounded: nothing to hold
                continue
            term = self._normalise(c, label, allow_nonconvex)
            extra: list[ConstraintTerm] = []
            if term.kind == "ineq" and not allow_nonconvex:
                g, extra = self._epigraph(term.expr, label)
                if not extra and not _smooth(g):  # no smooth form: hard cone constraints
                    cones = [replace(t, origin=c) for t in self._cone_terms(g <= 0, label)]
                    # the last cone is g <= 0 itself (conic.lift): its multiplier is g's
                    cones[-1] = replace(cones[-1], dual_map=term.dual_map)
                    self._constraints.extend(cones)
                    continue
                term = replace(term, expr=g)
            if extra:  # epigraph form: the violation is reported on c
                term = replace(term, origin=c)
                extra = [replace(t, origin=c) for t in extra]
            self._constraints.append(term)
            self._constraints.extend(extra)

    def _normalise(self, c: Any, label: str, allow_nonconvex: bool) -> ConstraintTerm:
        if isinstance(c, (bool, np.bool_)):
            raise ModelError(
                f"constraint '{label}' is a plain boolean ({c}); it compares numbers, not "
                "cvxpy expressions",
                self.name,
            )
        rewritten = False  # g is not the user's lhs - rhs: the violation is reported on c
        dual_map: tuple = ("as-is",)
        if isinstance(c, Inequality):
            g, kind = c.args[0] - c.args[1], "ineq"
            split = split_max_constraint(c.args[0], c.args[1])
            if split is not None:  # exact smooth rewrite of max-type atoms (norm_inf, abs...)
                g = split
                dual_map = ("pieces", tuple(int(a.size) for a in split.args))
            ball = norm_ball_as_smooth(c.args[0], c.args[1])
            if ball is not None:  # norm(x, 2) <= r as sum_squares(x) <= r^2
                g = ball
                dual_map = ("ball", float(np.asarray(c.args[1].value).reshape(-1)[0]))
            rewritten = split is not None or ball is not None
        elif isinstance(c, NonPos):
            g, kind = c.args[0], "ineq"
        elif isinstance(c, NonNeg):
            g, kind = -c.args[0], "ineq"
        elif isinstance(c, (Equality, Zero)):
            g = c.args[0] - c.args[1] if isinstance(c, Equality) else c.args[0]
            kind = "eq"
        elif isinstance(c, cp.constraints.constraint.Constraint):
            raise UnsupportedError(
                f"constraint '{label}' is a {type(c).__name__} constraint; fedmodel takes "
                "scalar/elementwise <=, >= and == constraints (write cone constraints with "
                "atoms, e.g. cp.norm(x, 2) <= t)",
                self.name,
                str(c),
            )
        else:
            raise ModelError(
                f"subject_to() expects cvxpy constraints, got {type(c).__name__}", self.name
            )
        self._model._check_variables(g, self.name, label)
        if kind == "ineq":
            convex = g.is_convex()
            what = "inequality constraint"
        else:
            convex = g.is_affine()
            what = "equality constraint"
        self._check_curvature(g, label, allow_nonconvex, convex=convex, kind=what, source=c)
        origin = c if rewritten else None
        return ConstraintTerm(g, kind, label, allow_nonconvex, c, origin, dual_map=dual_map)

    def _check_curvature(self, expr, label, allow_nonconvex, convex, kind, source=None) -> None:
        from fedmodel.compiler.smooth import NotSmoothError, check_smooth

        if convex and not allow_nonconvex:
            return
        if not allow_nonconvex:
            reason = _dcp_reason(source if source is not None else expr)
            raise NonConvexError(
                f"{kind} '{label}' is not DCP-convex{_NEEDS.get(kind, '')}. {reason}\n"
                "If it is smooth and you accept a local (KKT) certificate, pass "
                "allow_nonconvex=True to this call.",
                self.name,
                str(source if source is not None else expr),
            )
        try:
            check_smooth(expr)
        except NotSmoothError as exc:
            raise NonConvexError(
                f"{kind} '{label}' was opted in with allow_nonconvex=True but is not smooth: {exc}",
                self.name,
                str(expr),
            ) from exc

    # -- introspection ---------------------------------------------------------------------
    @property
    def objective_terms(self) -> tuple[ObjectiveTerm, ...]:
        return tuple(self._objective)

    @property
    def constraints(self) -> tuple[ConstraintTerm, ...]:
        return tuple(self._constraints)

    @property
    def data_handles(self) -> tuple[PrivateData, ...]:
        return tuple(self._data)

    def __repr__(self) -> str:
        kind = "Server" if self.is_server else "Client"
        return (
            f"{kind}({self.name!r}, data={len(self._data)}, terms={len(self._objective)}, "
            f"constraints={len(self._constraints)})"
        )


@dataclass(frozen=True)
class Publication:
    """An expression a client sends to the server (:meth:`Client.publish`)."""

    expr: cp.Expression
    owner: str
    name: str


class Client(Party):
    """A data owner: private data, local objective f_i and local constraints c_i."""

    def publish(self, expr: Any, name: str | None = None) -> cp.Expression:
        """Declare ``expr`` as what this client sends to the server, and return it.

        The server's terms may use another party's owned variables and data only inside a
        published expression (checked at compile time: anything else is an error naming
        the party and the term); the published expression itself may use only this
        client's own variables and data and the shared variables. This is how a vertical
        model (seed 002) is written: party ``k`` owns ``theta_k`` and publishes only its
        partial scores ``X_k theta_k``.

        Parameters
        ----------
        expr : cvxpy expression
            Built from this client's data and its own variables (``client.variable``).
        name : str, optional
            A label for summaries and error messages (default ``published[j]``).

        Returns
        -------
        cvxpy.Expression
            ``expr`` itself (the same object), now registered as published.

        Examples
        --------
        >>> import numpy as np, cvxpy as cp, fedmodel as fm
        >>> model = fm.Model()
        >>> bank = model.client("bank")
        >>> theta = bank.variable(2, name="theta")
        >>> z = bank.publish(bank.data(np.ones((5, 2)), name="X") @ theta, name="scores")
        >>> z.shape
        (5,)
        """
        if isinstance(expr, cp.constraints.constraint.Constraint) or not isinstance(
            expr, cp.Expression
        ):
            raise ModelError(
                f"publish() takes a cvxpy expression, got {type(expr).__name__}", self.name
            )
        label = name or f"published[{len(self._model._published)}]"
        self._model._check_variables(expr, self.name, label)
        if not expr.variables():
            raise ModelError(
                f"published expression '{label}' has no variables: data that does not depend "
                "on the model need not be published (it would only reveal the data)",
                self.name,
                str(expr),
            )
        for var in expr.variables():
            owner = self._model.owner_of(var)
            if owner is not None and owner != self.name:
                raise OwnershipError(
                    f"published expression '{label}' uses variable '{var.name()}' owned by "
                    f"'{owner}': a party may publish only expressions of its own variables",
                    self.name,
                    str(expr),
                )
        for leaf in leaves(expr):
            if isinstance(leaf, PrivateData) and leaf.owner != self.name:
                raise OwnershipError(
                    f"published expression '{label}' uses data '{leaf.data_name}' owned by "
                    f"'{leaf.owner}': a party may publish only expressions of its own data",
                    self.name,
                    str(expr),
                )
        self._model._publish(Publication(expr, self.name, label))
        return expr


class Server(Party):
    """The server: global constraints c_0 on public or server-held data.

    The server may also hold objective terms (``f_0``, on public data); the regulariser
    ``h`` is declared with :meth:`fedmodel.Model.regularize`.
    """

    is_server = True


#: cvxpy variable attributes taken as the equivalent constraints (``Party._structure``)
STRUCTURE = ("symmetric", "PSD", "NSD")


def structure_flags(attributes: dict, where: str, party: str | None, shape: Any) -> list[str]:
    """The structure attributes set to True among a variable's cvxpy ``attributes`` (for a
    square ``shape``); any other attribute is refused, naming it."""
    other = sorted(k for k in attributes if k not in STRUCTURE)
    if other:
        raise ModelError(
            f"{where} does not take the cvxpy attribute(s) {other}: fedmodel solves "
            "continuous real models; declare sign and bounds with nonneg=, nonpos=, bounds= "
            "(model variables) or constraints, and symmetric=/PSD=/NSD= for a square matrix",
            party,
        )
    flags = [k for k in STRUCTURE if attributes.get(k)]
    if "PSD" in flags and "NSD" in flags:
        raise ModelError(f"{where}: PSD=True and NSD=True together fix the matrix to 0", party)
    dims = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    if flags and (len(dims) != 2 or dims[0] != dims[1]):
        raise ModelError(f"{where}: {flags[0]}=True needs a square matrix, got shape {dims}", party)
    return flags


_MAX_TYPE = ("norm_inf", "abs", "max", "maximum")


def _smooth(expr: cp.Expression) -> bool:
    """Smooth wherever the iterates may go: the smooth layer can evaluate it, and it has no
    ``quad_over_lin`` with a variable denominator (smooth only where the denominator is
    positive, which penalised constraints do not keep the iterates in; it takes the conic
    path instead)."""
    from fedmodel.compiler.smooth import NotSmoothError, check_smooth

    try:
        check_smooth(expr)
    except NotSmoothError:
        return False
    return not _variable_denominator(expr)


def _variable_denominator(expr: cp.Expression) -> bool:
    return any(
        type(e).__name__ == "quad_over_lin" and not e.args[1].is_constant() for e in nodes(expr)
    )


def split_max_constraint(lhs: cp.Expression, rhs: cp.Expression) -> cp.Expression | None:
    """Rewrite ``M(x) <= rhs`` exactly as smooth components when ``M`` is a max-type atom.

    ``norm_inf(x) <= t``, ``abs(x) <= t``, ``max(x) <= t`` and ``maximum(a, b) <= t`` are
    the same sets as ``+-x <= t``, ``x <= t`` and ``a <= t, b <= t`` componentwise, which
    are smooth when ``x``, ``a``, ``b`` are; so gradient methods and the KKT certificate can
    treat them (seed 000 needs C^1 constraints). Nested max-type atoms are split
    recursively. Returns the stacked ``g`` with ``g <= 0``, or None when ``lhs`` is not of
    this kind (or ``rhs`` is not affine).
    """
    if not rhs.is_affine():
        return None
    pieces = _max_pieces(lhs)
    if pieces is None:
        return None
    return cp.hstack(
        [
            cp.vec(p - rhs, order="F") if (p - rhs).ndim else cp.reshape(p - rhs, (1,), order="F")
            for p in pieces
        ]
    )


# The atoms a constraint ``max(...) <= rhs`` is split at: atom -> the expressions whose
# elementwise maximum it is, or None where it is not one (an axis, a finite p).
MAX_PIECES = AtomTable("max pieces of a constraint")


@MAX_PIECES.register("norm_inf", "Pnorm", "PnormApprox")
def _max_pieces_inf_norm(expr: cp.Expression) -> list[cp.Expression] | None:
    is_inf_norm = type(expr).__name__ == "norm_inf" or getattr(expr, "p", None) == np.inf
    if is_inf_norm and getattr(expr, "axis", None) is None:
        x = expr.args[0]
        return [x, -x]
    return None


@MAX_PIECES.register("abs")
def _max_pieces_abs(expr: cp.Expression) -> list[cp.Expression]:
    return [expr.args[0], -expr.args[0]]


@MAX_PIECES.register("max")
def _max_pieces_max(expr: cp.Expression) -> list[cp.Expression] | None:
    return [expr.args[0]] if getattr(expr, "axis", None) is None else None


@MAX_PIECES.register("maximum")
def _max_pieces_maximum(expr: cp.Expression) -> list[cp.Expression]:
    return list(expr.args)


def _max_pieces(expr: cp.Expression) -> list[cp.Expression] | None:
    rule = MAX_PIECES.rule_for(expr)
    inner = rule(expr) if rule is not None else None
    if inner is None:
        return None
    out: list[cp.Expression] = []
    for piece in inner:
        sub = _max_pieces(piece) if type(piece).__name__ in _MAX_TYPE else None
        out.extend(sub if sub is not None else [piece])
    return out


_NEEDS = {
    "inequality constraint": " (it needs convex <= concave)",
    "equality constraint": " (it needs affine == affine)",
}


def _dcp_reason(obj: Any) -> str:
    """cvxpy's own explanation of why an expression or constraint is not DCP."""
    try:
        from cvxpy.error import DCPError

        prob = (
            cp.Problem(cp.Minimize(0), [obj])
            if isinstance(obj, cp.constraints.constraint.Constraint)
            else cp.Problem(cp.Minimize(obj))
        )
        try:
            prob._construct_chain()  # raises DCPError with cvxpy's explanation
        except DCPError as err:
            text = str(err).strip().splitlines()
            return "cvxpy says: " + " ".join(t.strip() for t in text[:6])
    except Exception:  # pragma: no cover - best effort only
        pass
    curv = getattr(obj, "curvature", None)
    return f"Its curvature is {curv}." if curv else ""
