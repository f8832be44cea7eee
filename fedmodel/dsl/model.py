"""The user-facing model: variables, parties, the regulariser h, and ``solve``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import cvxpy as cp
import numpy as np

from fedmodel.dsl.data import (
    PrivateData,
    check_finite_constants,
    fingerprint,
    without_infinite_bounds,
)
from fedmodel.dsl.party import Client, Server, structure_flags
from fedmodel.errors import ModelError, UnsupportedError

if TYPE_CHECKING:
    from fedmodel.compiler.partition import CompiledModel
    from fedmodel.result import Result


class Model:
    """A federated constrained model.

    ``minimize  sum_i f_i(w) + h(w)  s.t.  c_0(w) <= 0 (server),  c_i(w) <= 0 (client i)``

    Parameters
    ----------
    name : str
        A name for summaries and results.

    Examples
    --------
    >>> import numpy as np, cvxpy as cp, fedmodel as fm
    >>> rng = np.random.default_rng(0)
    >>> model = fm.Model("least-squares")
    >>> w = model.variable(3, name="w")
    >>> for k in range(2):
    ...     site = model.client(f"site{k}")
    ...     A = site.data(rng.normal(size=(20, 3)), name="A")
    ...     site.minimize(cp.sum_squares(A @ w - 1) / 40)
    >>> total = model.server.subject_to(cp.sum(w) == 1)  # returned: its dual_value after
    >>> res = model.solve(method="prox-al", eps=1e-6)
    >>> res.status
    'optimal'
    """

    def __init__(self, name: str = "model"):
        self.name = name
        self._variables: list[cp.Variable] = []
        self._clients: dict[str, Client] = {}
        self._server = Server(self, "server")
        self._regularizers: list[Any] = []
        self._data_by_id: dict[int, PrivateData] = {}
        self._owned: list[cp.Variable] = []  # party-owned variables, in declaration order
        self._owner_of: dict[int, str] = {}  # variable id -> owning party
        self._hidden: set[int] = set()  # epigraph auxiliaries (not in res.solution)
        self._fingerprints: dict[tuple, str] = {}
        # id(expr) -> Publication: what clients send to the server (Client.publish)
        self._published: dict[int, Any] = {}
        # bumped by every declaring call (variables, clients, data, terms, constraints, h,
        # publications): the compiled model is reused across solves while it is unchanged
        self._declaration_version = 0
        self._compiled: tuple[int, CompiledModel] | None = None

    def _declared(self) -> None:
        """Record that the declaration changed (the next compile partitions it anew)."""
        self._declaration_version += 1

    # -- declaration -----------------------------------------------------------------------
    def variable(
        self,
        shape: int | tuple[int, ...] = (),
        name: str | None = None,
        *,
        nonneg: bool = False,
        nonpos: bool = False,
        bounds: tuple[Any, Any] | None = None,
        **attributes: Any,
    ) -> cp.Variable:
        """Declare a shared model variable and return it (a plain ``cvxpy.Variable``).

        Parameters
        ----------
        shape : int or tuple of int
            Shape of the variable (``()`` for a scalar).
        name : str, optional
            Name shown in summaries.
        nonneg, nonpos : bool
            As in cvxpy: the sign constraint, added to ``h`` as the box ``w >= 0`` /
            ``w <= 0`` (handled exactly by the server's prox, see :meth:`regularize`).
        bounds : (lower, upper), optional
            As in cvxpy: constant bounds (scalars or arrays of the variable's shape, ``None``
            for no bound; an entry ``-inf`` in the lower or ``inf`` in the upper bound
            leaves that coordinate free on that side), added to ``h`` as a box.
        **attributes
            ``symmetric=True``, ``PSD=True``, ``NSD=True`` (a square matrix): as in cvxpy,
            declared as the equivalent constraints held by the server,
            ``upper_tri(V) == upper_tri(V.T)`` and ``lambda_min(V) >= 0`` /
            ``lambda_max(V) <= 0`` (their multipliers are internal: they are not
            constraints of the user's). Other cvxpy attributes (``integer``, ``boolean``,
            ``complex``, ...) are refused with a :class:`~fedmodel.errors.ModelError`:
            fedmodel solves continuous real models.

        Examples
        --------
        >>> import fedmodel as fm
        >>> model = fm.Model()
        >>> w = model.variable(3, name="w", nonneg=True)
        >>> w.shape
        (3,)
        """
        structure = structure_flags(attributes, "model.variable()", None, shape)
        if nonneg and nonpos:
            raise ModelError("model.variable(): nonneg=True and nonpos=True together fix w = 0")
        var = self._new_variable(shape, name or f"w{len(self._variables)}", None)
        self._variables.append(var)
        self._server._structure(var, structure)
        lower, upper = bounds if bounds is not None else (None, None)
        if nonneg:
            lower = 0.0 if lower is None else np.maximum(lower, 0.0)
        if nonpos:
            upper = 0.0 if upper is None else np.minimum(upper, 0.0)
        for side, bound, free in (("lower", lower, -np.inf), ("upper", upper, np.inf)):
            self._bound(var, side, bound, free)
        return var

    def _bound(self, var: cp.Variable, side: str, bound: Any, free: float) -> None:
        """Add a ``bounds=`` side of :meth:`variable` to ``h`` as a box; as in cvxpy, an
        entry equal to ``free`` (``-inf`` for a lower bound, ``inf`` for an upper one)
        leaves its coordinate unbounded on that side."""
        if bound is None:
            return
        values = np.asarray(bound, dtype=float)
        if np.isnan(values).any() or np.any(np.isinf(values) & (values != free)):
            raise ModelError(
                f"model.variable('{var.name()}'): the {side} bound must be finite or "
                f"{free:g} (no bound), got {bound!r}"
            )
        if np.all(values == free):
            return
        term = var >= values if side == "lower" else var <= values
        if np.isinf(values).any():  # (the box takes infinite sides: only these skip the check)
            from fedmodel.compiler.regularizer import parse_regularizer_term

            parse_regularizer_term(term, self._variables)
            self._regularizers.append(term)
            self._declared()
        else:
            self.regularize(term)

    def _new_variable(
        self, shape: int | tuple[int, ...], name: str, owner: str | None, hidden: bool = False
    ) -> cp.Variable:
        """A new variable, shared (``owner=None``) or owned by the party named ``owner``."""
        if isinstance(shape, (int, np.integer)):
            shape = (int(shape),)
        shape = tuple(int(s) for s in shape)
        if any(s <= 0 for s in shape):
            raise ModelError(f"variable shape must be positive, got {shape}", owner)
        if len(shape) > 2:
            raise ModelError(f"variables have at most 2 dimensions, got shape {shape}", owner)
        if any(v.name() == name for v in self.all_variables):
            raise ModelError(f"a variable named '{name}' already exists", owner)
        var = cp.Variable(shape, name=name)
        self._declared()
        if owner is not None:
            self._adopt_variable(var, owner, hidden)
        return var

    def _adopt_variable(self, var: cp.Variable, owner: str, hidden: bool = False) -> None:
        """Register ``var`` as owned by the party ``owner``."""
        self._owned.append(var)
        self._owner_of[var.id] = owner
        if hidden:
            self._hidden.add(var.id)
        self._declared()

    def client(self, name: str) -> Client:
        """Add a client (data owner) named ``name`` and return it."""
        if not isinstance(name, str) or not name:
            raise ModelError(f"client names must be non-empty strings, got {name!r}")
        if name == "server":
            raise ModelError("'server' is reserved for the server (use model.server)")
        if name in self._clients:
            raise ModelError(f"a client named '{name}' already exists")
        c = Client(self, name)
        self._clients[name] = c
        self._declared()
        return c

    @property
    def server(self) -> Server:
        """The server: global constraints ``c_0`` and server-held data."""
        return self._server

    @property
    def clients(self) -> tuple[Client, ...]:
        return tuple(self._clients.values())

    @property
    def variables(self) -> tuple[cp.Variable, ...]:
        """The shared model variables (declared with :meth:`variable`)."""
        return tuple(self._variables)

    @property
    def all_variables(self) -> tuple[cp.Variable, ...]:
        """Shared variables, then party-owned ones (including epigraph auxiliaries)."""
        return tuple(self._variables) + tuple(self._owned)

    def owner_of(self, var: cp.Variable) -> str | None:
        """The party owning ``var`` (``None`` for a shared model variable)."""
        return self._owner_of.get(var.id)

    def regularize(self, term: Any) -> None:
        """Add a simple term to the regulariser ``h(w)``, handled by the server's prox.

        Accepted: nonnegative multiples of ``cp.norm1(v)``, ``cp.norm(v, 1)``,
        ``cp.sum_squares(v)``, ``cp.norm(v, 2)`` (``cp.norm(V, "fro")``), the nuclear norm
        ``cp.normNuc(V)`` and the spectral norm ``cp.sigma_max(V)`` of a matrix variable
        (with at most a sum of squares on the same variable; their prox is one SVD) and
        sums of these, and box constraints ``v >= lo``, ``v <= hi`` (constants), where
        ``v`` is a whole model variable. A bound of ``+inf`` (``-inf`` below) on every
        entry is no bound and adds nothing; a box with some infinite entries is written
        with ``subject_to`` instead.
        A weight or bound may be a :class:`cvxpy.Parameter`: ``h`` is read again at every
        solve, so a new ``param.value`` takes effect at the next ``solve`` (a negative
        weight is refused then).

        Examples
        --------
        >>> import cvxpy as cp, fedmodel as fm
        >>> model = fm.Model()
        >>> w = model.variable(4)
        >>> model.regularize(1e-3 * cp.norm1(w))
        >>> model.regularize(w >= -1)
        >>> lam = cp.Parameter(nonneg=True, value=0.1)
        >>> model.regularize(lam * cp.sum_squares(w))  # lam.value = ... before a new solve
        """
        from fedmodel.compiler.regularizer import parse_regularizer_term

        label = f"regularize[{len(self._regularizers)}]"
        if isinstance(term, (list, tuple)):  # a bound of +inf (-inf below) is no bound
            term = [t for t in term if without_infinite_bounds(t, "server", label) is not None]
            if not term:
                return
        elif without_infinite_bounds(term, "server", label) is None:
            return
        check_finite_constants(term, "server", label)
        parse_regularizer_term(term, self._variables)  # validate now, with a clear error
        self._regularizers.append(term)
        self._declared()

    def _matrix_norms_only(self, expr: Any) -> bool:
        """Whether ``expr`` is a nonnegative combination of nuclear and spectral norms of
        whole shared variables: a server objective term :meth:`Server.minimize` adds to
        ``h``, whose prox is closed form, instead of a semidefinite cone form."""
        from fedmodel.compiler.regularizer import parse_regularizer_term

        try:
            items = parse_regularizer_term(expr, self._variables)
        except (UnsupportedError, ModelError):
            return False
        return bool(items) and all(kind in ("nuclear", "spectral") for kind, _, _ in items)

    # -- bookkeeping used by parties -------------------------------------------------------
    def _register_data(self, handle: PrivateData) -> None:
        self._data_by_id[id(handle)] = handle
        fp = fingerprint(handle.value)
        if fp is not None:
            self._fingerprints.setdefault(fp, handle.owner)
        self._declared()

    def _publish(self, publication: Any) -> None:
        self._published[id(publication.expr)] = publication  # keeps the expression alive
        self._declared()

    @property
    def publications(self) -> tuple:
        """What the clients publish (:meth:`fedmodel.Client.publish`), in declaration order."""
        return tuple(self._published.values())

    def _check_variables(self, expr: cp.Expression, party: str, label: str) -> None:
        known = {v.id for v in self.all_variables}
        for v in expr.variables():
            if v.id not in known:
                raise ModelError(
                    f"'{label}' uses variable '{v.name()}', which was not declared with "
                    "model.variable() or party.variable()",
                    party,
                    str(expr),
                )
        check_finite_constants(expr, party, label)

    # -- compile and solve -----------------------------------------------------------------
    def compile(self) -> CompiledModel:
        """Partition the model into per-party programs and run every check.

        The partition (each party's program with its compiled evaluators) is kept and
        reused by the next ``compile`` and ``solve`` while the declaration is unchanged:
        every declaring call (``variable``, ``client``, ``data``, ``minimize``,
        ``subject_to``, ``regularize``, ``publish``, ...) invalidates it, a new
        ``param.value`` does not. What a parameter's value enters is redone at every call:
        the parameter checks, the parse of ``h`` and the constant parts the certificate
        scales by (:meth:`~fedmodel.compiler.partition.CompiledModel.with_current_parameters`).

        Examples
        --------
        >>> import cvxpy as cp, fedmodel as fm
        >>> model = fm.Model()
        >>> w = model.variable(2)
        >>> lam = cp.Parameter(nonneg=True, value=1.0)
        >>> model.client("site0").minimize(cp.sum_squares(w - 1))
        >>> model.regularize(lam * cp.norm1(w))
        >>> first = model.compile()
        >>> lam.value = 0.5                       # no recompiling: the programs are reused
        >>> model.compile().clients[0] is first.clients[0]
        True
        >>> model.client("site1").minimize(cp.sum_squares(w))  # a new declaration: compiled anew
        >>> model.compile().clients[0] is first.clients[0]
        False
        """
        from fedmodel.compiler.partition import compile_model

        cached = self._compiled
        if cached is not None and cached[0] == self._declaration_version:
            return cached[1].with_current_parameters(self)
        version = self._declaration_version
        compiled = compile_model(self)
        self._compiled = (version, compiled)
        return compiled

    def summary(self, print_: bool = True, method: str = "prox-al", **options: Any) -> str:
        """Describe each party, its terms and constraint dimensions, and the messages of
        ``method`` at its default options (or ``options``, e.g.
        ``secure_aggregation=True``) on this model: for prox-al the inner solver such a
        run takes, then each message kind of the run, its direction, its size in floats
        for this model (the most one message carries), what it reveals, which kinds are
        opt-in and which fields are masked under secure aggregation (generated from the
        declared tables, :mod:`fedmodel.algorithms.privacy`)."""
        from fedmodel.algorithms.privacy import privacy_text
        from fedmodel.compiler.summary import model_summary

        compiled = self.compile()
        text = model_summary(compiled)
        if not compiled.publications:  # (vertical models: see docs/runtime.md's tables)
            text += "\n" + privacy_text(compiled, method, **options)
        if print_:
            print(text)
        return text

    def solve(self, method: str = "prox-al", **options: Any) -> Result:
        """Solve the model.

        Parameters
        ----------
        method : str
            A method of the registry (:func:`fedmodel.algorithms.registry.available_methods`).
            ``prox-al`` (default): seed 000 Algorithm 1 with an inner solver picked from the
            model (federated). ``cprox-al``: seed 000 Algorithm 3 (centralized proximal AL).
            ``admm``: Algorithm 2 alone (models with no constraints beyond ``h``).
            ``centralized``: the pooled problem solved exactly (the reference). The
            vertical and learning-model methods (``fair-vfl``, ``fedbcd``, ``ssca``, ...)
            and the baselines (``dald-cc``, ``fedavg``, ...) are listed in the user guide's
            "Choosing a method".
        **options
            Method options; see :func:`fedmodel.algorithms.registry.describe_options`.

        Returns
        -------
        Result
            Status, objective, certificate (KKT residuals), multipliers per party,
            communication and timing. The solution is also written into every
            variable's ``.value``, and each constraint's dual value into its
            ``dual_value`` (None after a method that has none for it).
        """
        from fedmodel.algorithms.registry import solve_model

        for party in (self._server, *self._clients.values()):  # no dual of an earlier solve
            for term in party.constraints:
                if term.dual_map is not None:
                    term.user_constraint.save_dual_value(None)
        return solve_model(self, method, options)

    def __repr__(self) -> str:
        return (
            f"Model({self.name!r}, variables={[v.name() for v in self._variables]}, "
            f"clients={len(self._clients)})"
        )
