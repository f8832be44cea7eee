"""Client half of prox-al (seed 000 Algorithm 1) around one inner solver's client part.

The client keeps its own state: its multipliers ``mu_i`` (and ``nu_i`` for equalities),
the proximal centre ``w^k`` of its ``P_{i,k}`` (eq. 11), its own block ``theta_i`` and
the running inner solver's client part
(:class:`~fedmodel.algorithms.proxal.inner.InnerClient`), which answers that route's
round kinds. The kinds it answers and what each reveals are declared in
:mod:`~fedmodel.algorithms.proxal.messages` (``model.summary()`` prints them for a model):
the replies to ``start`` and ``outer``/``outer_aa`` (Algorithm 1: the multiplier update,
the outer Anderson step) start the route's next inner solve; a route that ``probes`` may
be refused at ``start`` (the server then falls back to another route and names it,
``inner``, in the next ``start``, and the client builds that route's part).

Party-owned variables (``client.variable``, epigraph auxiliaries) never travel: ``w``,
``u~_i`` and the Lagrangian gradient are the shared variables only. The client solves its
subproblem over (shared, own) and keeps its block ``theta_i`` locally. Its ``P_{i,k}``
carries Algorithm 1's proximal term on that block with the same weight as each party's
share on the shared block, ``p = 1/((n+1) beta)`` (the proximal point method in a block
metric; ``p = 0`` in admm), and its local step adds a proximal-ADMM term
``(rho_i / 2)||theta_i - theta_i^t||^2`` (zero at the inner fixed point), so one scalar
``sigma = p + rho_i`` serves the whole local subproblem. ``eps~_i`` also bounds the
gradient of ``P_{i,k}`` in its block, the ``outer`` reply carries
``dtheta_scaled = beta p ||theta_i^{k+1} - theta_i^k||_inf`` (a scalar, for test (8)),
``evaluate`` reports the block's stationarity as one number, and only the final ``report``
(diagnostic) hands the block to the caller for ``.value``.
"""

from __future__ import annotations

import functools
import itertools
from operator import attrgetter, itemgetter

import numpy as np

from fedmodel.algorithms.messages import EVALUATE
from fedmodel.algorithms.protocol import (
    ClientHalf,
    Tally,
    _consume,
    _handler,
    kept_alike,
    plans_changed,
)
from fedmodel.algorithms.proxal.cohorts import (
    batched_steps,
    check_forms,
    cohort_of,
    glm_structure,
    stack_row,
)
from fedmodel.algorithms.proxal.messages import route_table
from fedmodel.algorithms.proxal.options import ProxALOptions
from fedmodel.algorithms.proxal.routes import LAYOUT_REFUSED, PROXAL, route_named
from fedmodel.cached import cached_property
from fedmodel.certificate.infeasibility import farkas_report, ray_report
from fedmodel.certificate.kkt import (
    party_evaluation,
    plain_objective_evaluations,
    plain_objective_party,
    plain_objective_rows,
)
from fedmodel.certificate.scale import objective_reference, plain_objective_references
from fedmodel.compiler.glm import NotRecognised
from fedmodel.compiler.partition import PartyProgram
from fedmodel.compiler.regularizer import Regularizer
from fedmodel.runtime.rows import Rows
from fedmodel.runtime.secure_aggregation import SECAGG
from fedmodel.runtime.wire import register_wire_type
from fedmodel.subproblems.merit import MeritProblem
from fedmodel.subproblems.newton import NewtonSolver
from fedmodel.subproblems.select import LazySolver, make_solver


def _carry_factor(solver) -> None:
    """Rounds solve the same subproblem with moving vectors: a Newton backend starts each
    solve from the last factor (carried in the client's state, see its get_state)."""
    if hasattr(solver, "carry_factor"):
        solver.carry_factor = True


#: a Newton backend's state before its first use, shared by the clients' lazy backends
_NEWTON_INITIAL = NewtonSolver.initial_state()

#: the writes of a client's centre (:attr:`ProxALClient.w_center`) in this process
_CENTRE_WRITES = [0]


def _centre_write() -> int:
    """The time of one write of a centre (one client's, or a cohort's :class:`CentreRows`)."""
    _CENTRE_WRITES[0] += 1
    return _CENTRE_WRITES[0]


class CentreRows:
    """The centres of clients ``hosts`` written together (:meth:`write`): client ``i``'s
    :attr:`ProxALClient.w_center` is row ``i`` of the last write while it wrote none of its
    own since. A client belongs to one at a time (joining takes it out of its last one, its
    centre as it reads then its own)."""

    __slots__ = ("centres", "time")

    def __init__(self, hosts: list[ProxALClient]):
        self.centres: np.ndarray | None = None
        self.time = 0
        for i, h in enumerate(hosts):
            h._w_center, h._centre_time = h.w_center, 0
            h._centre_rows, h._centre_slot = self, i

    def write(self, centres: np.ndarray) -> None:
        """Its clients' centres are the rows of ``centres`` (one write of a centre)."""
        self.centres, self.time = centres, _centre_write()


@register_wire_type("proxal.client")
class ProxALClient(ClientHalf):
    """Client ``i`` of seed 000: owns ``f_i``, ``c_i``, ``mu_i`` and its inner solver's state.

    Parameters
    ----------
    program : PartyProgram
        This client's own terms and data (nothing else).
    options : ProxALOptions
        The method's options (``beta``, ``mu0``, ``solver``, ``max_local_iter``, residual
        balancing, ``relaxation``, Anderson memories, ``prox_beta``, the metric's floor and
        refresh), as the server was built with.
    rho : float
        This client's ADMM penalty ``rho_i``.
    n_clients : int
        ``n``; the proximal term ``||w - w^k||^2 / (2 beta)`` is split evenly over the
        ``n + 1`` parties (eq. 11).
    proximal : bool
        False for plain ADMM on ``f_i`` (method ``"admm"``).
    theta0 : array, optional
        The starting point of this client's own variables.
    metric : {"scalar", "hessian"}
        The penalty metric in effect (:func:`~fedmodel.algorithms.proxal.admm_inner.penalty_metric`).
    route : str
        The inner solver the run starts with (the server's ``inner`` field may name another).
    """

    #: the family's table (every route); a built half checks against its route's table
    messages = PROXAL
    state_fields = (
        "mu", "nu", "w_center", "theta_center", "theta_at_w", "cone", "cone_at_w", "outer_mem",
        "route_name", "mu_mark", "nu_mark", "cone_mark", "theta_step", "objective_units",
    )  # fmt: skip
    component_fields = ("solver", "inner")  # (the Newton backend's carried factor; the route)

    # (u, the factors of beta, 1/prox_beta and rho_i): the objective's units of the
    # parameters, sent by the server in a units round (ProxALServer.take_objective_units)
    objective_units = (1.0, 1.0, 1.0, 1.0)
    # its dense GLM form when it has no constraints (cohorts.glm_objective), looked up
    # once; whether that form agreed with its evaluator, or disagreed (then it leaves
    # every batch); the cohort it was last batched in (kept by a cohort's first client).
    # Each starts as this class's value and is the client's own once written
    glm_form = None
    glm_looked_up = False
    glm_signature: tuple | None = None
    glm_plain: bool | None = None  # (kkt.plain_objective_party, found once)
    glm_verified = False
    _glm_disagrees = False
    glm_structure: str | None = None  # (its structure_fingerprint, found once)
    glm_path: tuple | None = None  # (its form's path, party_glm's path_key)
    glm_cohort = None
    _centre_rows: CentreRows | None = None
    _centre_slot = 0
    _w_center: np.ndarray | None = None  # (w_center's own value and the time of its write)
    _centre_time = 0
    #: the ``h`` of its subproblem (:attr:`problem`): none, ``h`` is the server's
    regularizer = Regularizer()

    def __init__(
        self,
        program: PartyProgram,
        options: ProxALOptions,
        rho: float,
        n_clients: int,
        proximal: bool = True,
        theta0: np.ndarray | None = None,
        metric: str = "scalar",
        route: str = "admm",
    ):
        # Anderson acceleration is off when any party owns variables (their blocks are
        # part of the iteration's state but never travel); the program's layout is the model's
        owned_anywhere = program.layout.has_owned
        super().__init__(program.local())  # (shared variables, this client's own)
        program = self.program
        self.options = options
        self.rho_option = float(rho)
        self.proximal = bool(proximal)
        self.n_clients = int(n_clients)
        layout = program.layout
        self.ns = ns = layout.n_shared
        n_own = layout.size - ns
        self.owned = n_own > 0
        self.derive_parameters()
        if theta0 is not None:
            theta0 = np.asarray(theta0, dtype=float)
        elif n_own:
            theta0 = np.zeros(n_own)
        m_ineq, m_eq, m_cone = program.m_ineq, program.m_eq, program.m_cone
        if theta0 is None and not (m_ineq or m_eq or m_cone):
            # (no own block, no constraints: each of these is the one empty array)
            self.theta_center = self.theta_at_w = self.theta_step = _EMPTY
            self.mu = self.nu = self.cone = self.cone_at_w = _EMPTY
            self.mu_mark = self.nu_mark = self.cone_mark = _EMPTY
        else:
            theta0 = _EMPTY if theta0 is None else theta0
            self.theta_center = _own(theta0)  # theta_i^k (admm: the last theta_i)
            self.theta_at_w = _own(theta0)  # own block of the iterate matching the last w
            self.mu = np.full(m_ineq, float(options.mu0)) if m_ineq else _EMPTY
            self.nu = np.zeros(m_eq) if m_eq else _EMPTY
            self.cone = np.zeros(m_cone) if m_cone else _EMPTY  # (conic duals)
            self.cone_at_w = _own(self.cone)  # those matching theta_at_w (the certificate's)
            # the multipliers before the last outer update and the last outer step of the
            # own block: the candidates of the infeasibility and unboundedness certificates
            self.mu_mark, self.nu_mark = _own(self.mu), _own(self.nu)
            self.cone_mark = _own(self.cone)
            self.theta_step = np.zeros(n_own) if n_own else _EMPTY
        self.solver_option = options.solver
        if batched_steps(self):  # (its own backend: only if it leaves the batches)
            self.solver = LazySolver(self._newton_backend, _NEWTON_INITIAL, _carry_factor)
        else:
            self.solver = make_solver(self.problem, options.solver)
            _carry_factor(self.solver)
        self.max_local_iter = options.max_local_iter
        # Algorithm 2's settings its client part reads
        self.metric = metric
        self.metric_floor = float(options.metric_floor)
        self.metric_refresh = float(options.metric_refresh)
        self.balancing = options.balancing  # (ratio, factor, rounds) or None
        self.relaxation = float(options.relaxation)  # over-relaxation alpha (1: Algorithm 2)
        self.anderson = 0 if owned_anywhere else int(options.anderson)
        # outer Anderson acceleration: memory of (residual, mu_i, nu_i) of Algorithm 1
        self.outer_anderson = 0 if (owned_anywhere or not proximal) else int(options.outer_anderson)
        self.outer_mem: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        # (its centre w_center: None, this class's, until the first start round writes it)
        self.stats["max_residual_gap"] = 0.0
        self.use_route(route)

    w_center = stack_row(
        "_w_center",
        "_centre_time",
        "_centre_rows",
        "_centre_slot",
        "centres",
        _centre_write,
        """The centre ``w^k`` of its ``P_{i,k}`` on the shared variables: its own last
        write, or its row of its cohort's :class:`CentreRows` when that was written since.""",
    )

    @staticmethod
    def centre_rows(hosts: list[ProxALClient]) -> CentreRows:
        """The centres of ``hosts`` written together from now on (:class:`CentreRows`)."""
        return CentreRows(hosts)

    @staticmethod
    def centre_writes() -> int:
        """How many times a client's :attr:`w_center` has been written in this process (a
        stack of clients' centres holds while this stays the same)."""
        return _CENTRE_WRITES[0]

    #: its ``start``, ``evaluate``, ``outer`` and ``outer_aa`` keys change only with its
    #: route or its form's verdict
    stable_batch_keys = frozenset({"start", "evaluate", "outer", "outer_aa"})

    @property
    def glm_disagrees(self) -> bool:
        """Whether its GLM form disagreed with its evaluator (it then leaves every batch
        for good: the stacked rounds group their halves again)."""
        return self._glm_disagrees

    @glm_disagrees.setter
    def glm_disagrees(self, value: bool) -> None:
        if bool(value) != self._glm_disagrees:
            plans_changed()
        self._glm_disagrees = bool(value)

    def use_route(self, name: str) -> None:
        """Build the client part of route ``name`` (its state only) and take its table."""
        self.route_name = name
        self.route = route_named(name)
        self.inner = self.route.client_part(self)
        self.messages = _client_table(name)
        plans_changed()  # (its handlers' owner and table: a stacked round looks again)

    def derive_parameters(self) -> None:
        """``beta``, Algorithm 1's proximal weight ``p`` (on the shared block and its own,
        see the module doc) and the starting ``rho_i`` from the options, in the objective's
        units (``objective_units``)."""
        self.beta, _, self.prox_weight = self.options.penalties(
            self.objective_units, self.n_clients, self.proximal
        )
        self.theta_prox = self.prox_weight
        self.rho_start = self.rho_option * self.objective_units[3]
        problem = self.__dict__.get("problem")
        if problem is not None:  # (made: it takes the new beta; else it is made with it)
            problem.beta = self.beta

    @cached_property
    def problem(self) -> MeritProblem:
        """Its subproblem's merit function (:class:`~fedmodel.subproblems.merit.MeritProblem`,
        with :attr:`regularizer`), made at its first use: a client whose steps run in
        cohorts may never use it."""
        return MeritProblem([self.program], self.beta, self.regularizer)

    def _newton_backend(self) -> NewtonSolver:
        """Its own Newton backend (built by its lazy solver at the first use)."""
        return NewtonSolver(self.problem)

    def handler_owner(self, kind: str):
        """The route's client part answers its own round kinds."""
        found = _handler(type(self.inner), kind)
        if found[0] is not None:
            return self.inner, found
        return super().handler_owner(kind)

    @classmethod
    def handler_owners(cls, halves: list[ProxALClient], kind: str) -> list:
        """:meth:`handler_owner`'s owner of ``kind`` at each of ``halves``: in one pass
        when their route parts are of one class (its handler decides for all)."""
        parts, classes = kept_alike(halves, "_route_parts", _route_parts)
        if len(classes) != 1 or cls.handler_owner is not ProxALClient.handler_owner:
            return super().handler_owners(halves, kind)
        (part_class,) = classes
        return list(parts if _handler(part_class, kind)[0] is not None else halves)

    # -- P_{i,k} and its gradient -----------------------------------------------------------
    def _grad_P(self, w: np.ndarray) -> np.ndarray:
        """Gradient of P_{i,k} (eq. 11) at ``w``: merit gradient plus the prox share."""
        return self._value_grad_P(w)[1]

    def _value_grad_P(self, w: np.ndarray) -> tuple[float, np.ndarray]:
        """Value and gradient of P_{i,k} (eq. 11) at ``w``: the merit terms plus the prox
        share (the value without cone terms: it serves the quasi-Newton inner solver,
        which runs on models without cones only).

        From the Newton backend's GLM form when it has been cross-checked against the
        model's evaluator (one pass over each data matrix, affine images shared with the
        next solve), else from the model's expression-tree evaluator: the same quantity.
        """
        solver = self.solver
        if getattr(solver, "verified", False):
            val, g = solver.merit_value_grad(w, [self.mu], [self.nu])
        else:
            val, g = self.problem.functions[0].merit(w, self.mu, self.nu, self.beta)
        g = np.array(g, dtype=float)  # a copy: the backends may hand out their buffers
        if self.cone.size:  # cone constraints: the Lagrangian gradient at their duals
            g += self.problem.functions[0].cone_grad(w, self.cone)
        ns = self.ns
        d = w[:ns] - self.w_center
        g[:ns] += self.prox_weight * d
        val = float(val) + 0.5 * self.prox_weight * float(d @ d)
        if self.owned:
            d_own = w[ns:] - self.theta_center
            g[ns:] += self.theta_prox * d_own
            val += 0.5 * self.theta_prox * float(d_own @ d_own)
        return val, g

    def _local(self, w: np.ndarray, theta: np.ndarray) -> np.ndarray:
        return np.concatenate([w, theta]) if self.owned else w

    # -- state (checkpoints, retries) --------------------------------------------------------
    def set_state(self, state: dict) -> None:
        if "route_name" not in state:
            raise ValueError(LAYOUT_REFUSED)
        if state["route_name"] != self.route_name:  # (the part of the saved route)
            self.use_route(state["route_name"])
        super().set_state(state)
        self.derive_parameters()

    def multipliers(self) -> tuple[np.ndarray, np.ndarray]:
        return self.mu, self.nu

    def cone_duals(self) -> np.ndarray | None:
        return self.cone_at_w if self.cone.size else None

    # -- Algorithm 1's messages ----------------------------------------------------------------
    def _on_start(self, w, inner: str | None = None, **request):
        self._take_route(inner)
        # its share of the certificate's objective scale, at the starting point
        reference = objective_reference(
            self.program, self._local(np.asarray(w, dtype=float), self.theta_center)
        )
        return self._begin(w, request, {"objective_reference": reference})

    def _on_units(self, w, objective_units, **request):
        """The parameters in the objective's units (:meth:`~fedmodel.algorithms.proxal.
        server.ProxALServer.take_objective_units`, and each raise of ``beta``): the
        route's part again, with a fresh state, started at ``w`` in them. The outer
        Anderson memory restarts, as the server's does (the outer map changed)."""
        self.objective_units = tuple(float(u) for u in objective_units)
        self.derive_parameters()
        self.use_route(self.route_name)
        self.outer_mem = []
        return self._begin(w, request, {})

    def _begin(self, w, request: dict, extra: dict) -> dict:
        """The route's start at ``w`` and ``extra``; a route that probes may refuse."""
        if not self.route.probes:
            return {**self.inner.start(w, **request), **extra}
        why = self.inner.refuses()
        if why:
            return {"accepted": False, "why": why}
        try:
            start = self.inner.start(w, **request)
        except NotRecognised as exc:  # (the backend's GLM form failed its cross-check)
            return {"accepted": False, "why": str(exc)}
        return {"accepted": True, **start, **extra}

    def _take_route(self, inner: str | None) -> None:
        """Build route ``inner``'s part when the server names another route (it fell back)."""
        if inner is not None and inner != self.route_name:
            self.use_route(inner)

    def _started(self, w, request: dict, reference: float) -> dict:
        """The reply to ``start`` on a route that does not probe: the route's start and this
        client's share of the objective's scale."""
        return {**self.inner.start(w, **request), "objective_reference": float(reference)}

    def _on_outer(self, w, **request):
        w = np.asarray(w, dtype=float)
        # the outer iterate w^{k+1} is (w, theta at w): what eps~ was measured at
        dtheta = float(np.abs(self.theta_at_w - self.theta_center).max(initial=0.0))
        if self.program.m_ineq or self.program.m_eq:
            ci, ce = self.problem.functions[0].constraint_values(self._local(w, self.theta_at_w))
        else:  # (none: no evaluator is built for them)
            ci = ce = np.zeros(0)
        mu_in, nu_in = self.mu.copy(), self.nu.copy()
        self.mu_mark, self.nu_mark, self.cone_mark = mu_in, nu_in, self.cone_at_w.copy()
        self.theta_step = self.theta_at_w - self.theta_center
        # (rows whose multipliers the route's steps set, e.g. exact-admm's epigraph pieces)
        hard_i, hard_e = self.inner.hard_rows()
        dmu = 0.0
        if ci.size:
            new = np.where(hard_i, self.mu, np.maximum(self.mu + self.beta * ci, 0.0))
            dmu = float(np.abs(new - self.mu).max())
            self.mu = new
        if ce.size:  # equalities: unprojected update
            step = np.where(hard_e, 0.0, self.beta * ce)
            dmu = max(dmu, float(np.abs(step).max()))
            self.nu = self.nu + step
        reply = {"dmu_inf": dmu, **self.inner.start(w, **request)}
        if self.route.measures_feasibility:  # (test (8)'s feasibility half, measured)
            reply.update(kkt_feasibility(ci, ce, self.mu, hard_i, hard_e))
        if self.owned:  # test (8) on the own block, in the block metric (a scalar)
            reply["dtheta_scaled"] = self.beta * self.theta_prox * dtheta
        if self.outer_anderson:  # this client's block of the outer residual
            r = np.concatenate([self.mu - mu_in, self.nu - nu_in])
            self.outer_mem.append((r, self.mu.copy(), self.nu.copy()))
            del self.outer_mem[: -(self.outer_anderson + 1)]
            reply["gram"] = np.array([float(r @ q[0]) for q in self.outer_mem])
        return reply

    @staticmethod
    def _on_outer_aa_rows(halves: list[ProxALClient], fields: dict) -> dict[str, np.ndarray]:
        """:meth:`_on_outer_aa` of every client of ``halves`` (clients of one
        :meth:`step_batch_key`, without multipliers to combine): the memory reset when
        asked, then each route part's start at the combined ``w``."""
        mems = list(map(_OUTER_MEM, halves))
        _one_memory_length(mems)
        W, request = _stacked_start_fields(halves, fields)
        alpha, reset = request.pop("alpha"), request.pop("reset")
        if np.size(alpha) > len(mems[0]):  # (one length for all)
            raise ValueError("outer_aa combines more outputs than the clients keep")
        replies = _start_rows(halves, W, request)
        if reset:
            for h in halves:
                h.outer_mem = []
        return replies

    @staticmethod
    def _on_outer_rows(halves: list[ProxALClient], fields: dict) -> dict[str, np.ndarray]:
        """:meth:`_on_outer` of every client of ``halves`` (clients of one
        :meth:`step_batch_key`: no constraints, no own block, so no multiplier update and
        test (8) has nothing of theirs to measure) in one pass: each takes ``w`` as the
        centre of its next ``P_{i,k}`` (its route part's ``start``) and, with outer
        Anderson, the zero block of the outer residual its multipliers add. ``fields``: the
        request's fields, one value for all or rows. Every input is read before any
        client's state changes."""
        m = len(halves)
        memory = halves[0].outer_anderson
        mems = list(map(_OUTER_MEM, halves)) if memory else []
        if memory:
            _one_memory_length(mems)
        W, request = _stacked_start_fields(halves, fields)
        # (what _on_outer keeps of a client without constraints or own block: its
        # multipliers, their marks, its own block and its step there are empty arrays,
        # which nothing changes; the marks of its cone duals, copies, in a cohort with them)
        if halves[0].program.m_cone:
            for h in halves:
                h.cone_mark = _own(h.cone_at_w)
        out = {"dmu_inf": np.zeros(m), **_start_rows(halves, W, request)}
        if memory:
            # (the zero block of the outer residual its multipliers add, and its empty
            # multipliers: one entry for all, nothing can change it)
            _consume(map(list.append, mems, itertools.repeat(_EMPTY_OUTER_ENTRY)))
            excess = len(mems[0]) - (memory + 1)  # (one length for all: the oldest go)
            if excess > 0:
                for mem in mems:
                    del mem[:excess]
            out["gram"] = np.zeros((m, len(mems[0])))
        return out

    def _on_outer_aa(self, w, alpha, reset, **request):
        """Outer Anderson step: the multipliers become ``sum_j alpha_j`` of the last
        outputs (projected on mu >= 0), and Algorithm 2 restarts at the combined ``w``."""
        alpha = np.asarray(alpha, dtype=float)
        if alpha.size:
            picked = self.outer_mem[-alpha.size :]
            self.mu = np.maximum(sum(a * q[1] for a, q in zip(alpha, picked)), 0.0)
            self.nu = sum(a * q[2] for a, q in zip(alpha, picked))
        if reset:
            self.outer_mem = []
        return self.inner.start(w, **request)

    def note_residual_gap(self, residual: float, tol: float) -> None:
        """Keep the largest ratio of a local solve's residual to its tolerance. A solve
        that returned no point (an infeasible local subproblem: a party's own hard
        constraints with its terms' domains admit none) is counted in
        ``local_solves_without_point`` instead, so the diagnostic 'report' stays finite and
        the run ends on the server's verdict rather than on a refused reply."""
        ProxALClient.note_steps([self], np.array([residual]), np.array([tol]))

    @staticmethod
    def note_steps(
        halves: list[ProxALClient],
        residuals: np.ndarray,
        tols: np.ndarray,
        iterations: np.ndarray | None = None,
    ) -> None:
        """:meth:`note_residual_gap` of each client of ``halves`` with its local solve's
        residual and tolerance (arrays, a value per client: the ratios in one pass); with
        ``iterations``, each also counts the solve and its iterations in its statistics."""
        gaps = np.asarray(residuals, dtype=float) / np.maximum(
            np.asarray(tols, dtype=float), 1e-300
        )
        finite = np.isfinite(gaps)
        tally = Tally.of(halves)  # (counted for all in one pass)
        if iterations is not None:
            its = np.asarray(iterations)
            tally.add("local_solves", 1, dtype=int)
            tally.add("local_iterations", its, dtype=its.dtype)
        if not finite.all():
            tally.add("local_solves_without_point", ~finite, dtype=int)
        tally.maximum("max_residual_gap", np.where(finite, gaps, -np.inf))

    def _on_evaluate(self, w, mu=None, nu=None, objective_scale=1.0, **route):
        """Its share of the certificate at ``w`` (``route``: the fields its route adds to
        the request, taken by its client part first)."""
        if route:
            self.inner.before_evaluation(**route)
        if not self.owned:
            return super()._on_evaluate(w, mu, nu, objective_scale)
        mu = self.mu if mu is None else np.asarray(mu, dtype=float)
        nu = self.nu if nu is None else np.asarray(nu, dtype=float)
        x = self._local(np.asarray(w, dtype=float), self.theta_at_w)
        return party_evaluation(
            self.program,
            x,
            mu,
            nu,
            shared_only=True,
            cone=self.cone_duals(),
            objective_scale=float(objective_scale),
        )

    def step_batch_key(self, kind: str):
        """The structure this client's ``start`` or certificate evaluation shares with the
        clients it is batched with (:meth:`_on_start_batch`, :meth:`_on_evaluate_batch`),
        or None: the client has a dense GLM form
        (:func:`~fedmodel.algorithms.proxal.cohorts.glm_objective`), its evaluation is that
        objective's value and gradient alone
        (:func:`~fedmodel.certificate.kkt.plain_objective_party`), and for ``start`` its
        route does not probe. For ``report`` (:meth:`_on_report_rows`): a client without
        multipliers, cone duals or an own block, by its statistics' names. For ``outer`` and ``outer_aa`` (:meth:`_on_outer_rows`,
        :meth:`_on_outer_aa_rows`): a client with neither constraints nor an own block
        whose route's part starts an inner solve from ``w`` alone (``stacked_start``)."""
        if kind == "report":  # (its reply's fields: the statistics' names)
            plain = not (self.mu.size or self.nu.size or self.owned or self.cone.size)
            return ("report-plain", tuple(self.stats)) if plain else None
        if kind in ("outer", "outer_aa"):
            plain = not (self.owned or self.program.m_ineq or self.program.m_eq)
            plain = plain and not self.route.measures_feasibility  # (no (8) half to send)
            if plain and getattr(type(self.inner), "stacked_start", False):
                cones = bool(self.program.m_cone)  # (a cohort has cone duals or none)
                return ("outer-plain", type(self.inner), self.outer_anderson, cones)
            return None
        if kind not in ("start", "evaluate") or (kind == "start" and self.route.probes):
            return None
        if self.glm_plain is None:
            self.glm_plain = plain_objective_party(self.program)
        structure = glm_structure(self)
        if structure is None or not self.glm_plain:
            return None
        return ("glm-plain", structure)

    @classmethod
    def step_batch_keys(cls, halves: list[ProxALClient], kind: str) -> list:
        """:meth:`step_batch_key` of each of ``halves``, found once for all the clients
        alike in what decides it (for ``outer`` and ``outer_aa``: :data:`_OUTER_FACTS`;
        for ``start`` and ``evaluate``, once their forms are looked up and their
        evaluations judged, each client its own: :data:`_GLM_FACTS`, then once per form's
        signature), else each its own."""
        if cls.step_batch_key is ProxALClient.step_batch_key:
            if kind in ("outer", "outer_aa"):
                if len(set(map(_OUTER_FACTS, halves))) == 1:
                    return [halves[0].step_batch_key(kind)] * len(halves)
            elif kind in ("start", "evaluate"):
                signatures = kept_alike(halves, "_glm_signatures", _glm_signatures)
                if signatures is not None:
                    return _glm_keys(*signatures, kind)
            elif kind == "report":
                Tally.settle_all()  # (its statistics' names: every count added first)
                if len(set(map(_REPORT_FACTS, halves))) == 1:
                    if len(set(map(tuple, map(_STATS, halves)))) == 1:
                        return [halves[0].step_batch_key(kind)] * len(halves)
        return [h.step_batch_key(kind) for h in halves]

    @staticmethod
    def _on_start_batch(halves: list[ProxALClient], payloads: list[dict]) -> list[dict]:
        """:meth:`_on_start` of every client of ``halves`` (clients of one
        :meth:`step_batch_key`), their shares of the objective's scale from one batched
        computation (:func:`~fedmodel.certificate.scale.plain_objective_references`).
        Every input is checked before any client's state changes."""
        routes = [pl.get("inner") or h.route_name for h, pl in zip(halves, payloads)]
        if any(route_named(r).probes for r in routes):
            raise ValueError("a route that probes starts one client at a time")
        X = np.stack([np.asarray(pl["w"], dtype=float) for pl in payloads])
        cohort = cohort_of(halves)
        check_forms(halves, cohort, X)
        cohort.keep_point(X)  # (f at X: the references' and the first exact-admm step's)
        references = plain_objective_references(cohort.value_grad, X)
        replies = []
        for h, pl, reference in zip(halves, payloads, references):
            h._take_route(pl.get("inner"))
            request = {k: v for k, v in pl.items() if k not in ("w", "inner")}
            replies.append(h._started(pl["w"], request, reference))
        return replies

    @staticmethod
    def _on_start_rows(halves: list[ProxALClient], fields: dict) -> dict[str, np.ndarray]:
        """:meth:`_on_start_batch` of every client of ``halves`` (clients of one
        :meth:`step_batch_key`) in one stacked step: the request's fields are one value for
        all (each client's route starts at the ``w`` its message would carry). Every
        input is checked before any client's state changes."""
        W, request = _stacked_start_fields(halves, fields)
        inner = request.pop("inner", None)
        # (the routes they start: the one named for all, else each its own)
        own = set(map(_ROUTE_NAME, halves))
        if any(route_named(r).probes for r in ({inner} if inner else own)):
            raise ValueError("a route that probes starts one client at a time")
        X = np.array(W, order="C")  # (contiguous rows, as the batched step stacks them)
        cohort = cohort_of(halves)
        check_forms(halves, cohort, X)
        cohort.keep_point(X)  # (f at X: the references' and the first exact-admm step's)
        references = plain_objective_references(cohort.value_grad, X)
        if inner is not None and own != {inner}:  # (those on another route build it)
            for h in halves:
                h._take_route(inner)
        replies = _start_rows(halves, W, request)
        replies["objective_reference"] = np.array(references, dtype=float)
        return replies

    @staticmethod
    def _on_evaluate_batch(halves: list[ProxALClient], payloads: list[dict]) -> list[dict]:
        """:meth:`_on_evaluate` of every client of ``halves`` (clients of one
        :meth:`step_batch_key`) from one batched value and gradient of their objectives
        (:func:`~fedmodel.certificate.kkt.plain_objective_evaluations`, which read
        neither multipliers nor an own block); changes no client's state but the one-time
        check of its GLM form until they are made, then takes the fields its route adds to
        the request (:meth:`_on_evaluate`)."""
        X = np.stack([np.asarray(pl["w"], dtype=float) for pl in payloads])
        cohort = cohort_of(halves)
        check_forms(halves, cohort, X)
        reports = plain_objective_evaluations(cohort.value_grad, X)
        for h, pl in zip(halves, payloads):
            route = {k: v for k, v in pl.items() if k not in EVALUATE.request}
            if route:
                h.inner.before_evaluation(**route)
        return reports

    @staticmethod
    def _on_evaluate_rows(halves: list[ProxALClient], fields: dict) -> dict[str, np.ndarray]:
        """:meth:`_on_evaluate_batch` of every client of ``halves`` (clients of one
        :meth:`step_batch_key`) in one stacked step: their reports as stacked fields
        (:func:`~fedmodel.certificate.kkt.plain_objective_rows`). Raises ValueError, having
        changed no client's state but the one-time check of its GLM form, when only some of
        them carry the boundary relief's fields (their replies then differ in fields: the
        round goes message by message)."""
        W, request = _stacked_start_fields(halves, fields)
        X = np.array(W)  # (contiguous rows, as the batched step stacks them)
        cohort = cohort_of(halves)
        check_forms(halves, cohort, X)
        reports, relief = plain_objective_rows(cohort.value_grad, X)
        if relief.any() and not relief.all():
            raise ValueError("the boundary relief's fields are some clients' only")
        route = {k: v for k, v in request.items() if k not in EVALUATE.request}
        if route:
            for h in halves:
                h.inner.before_evaluation(**route)
        return reports

    def _on_farkas(self, w):
        """This client's share of the Farkas certificate
        (:func:`~fedmodel.certificate.infeasibility.farkas_report`) at its point, for its
        multipliers and for their change since the last outer update (``_step``)."""
        x = self.inner.farkas_point(w)
        mu, nu, cone = self.mu, self.nu, self.cone_at_w
        out = {}
        for suffix, (m, v, lam) in (
            ("", (mu, nu, cone)),
            ("_step", (mu - self.mu_mark, nu - self.nu_mark, cone - self.cone_mark)),
        ):
            report = farkas_report(self.program, x, m, v, lam, self.ns)
            out.update({f"{k}{suffix}": report[k] for k in ("y", "b", "rho", "size")})
        return out

    def _on_ray(self, w, d, scale, t):
        """Its objective at ``x + t_j d`` (three points; its own block moves by its last
        outer step over ``scale``) and its largest violation over them
        (:func:`~fedmodel.certificate.infeasibility.ray_report`)."""
        x = self._local(np.asarray(w, dtype=float), self.theta_at_w)
        d = self._local(np.asarray(d, dtype=float), self.theta_step / float(scale))
        report = ray_report(self.program, x, d, t)
        return {"objective": report["objective"], "violation": float(report["violation"].max())}

    def _on_report(self):
        out = super()._on_report()
        if self.owned:  # the final write-back of the own block to the caller's variables
            out["owned"] = self.theta_at_w.copy()
        return out

    @staticmethod
    def _on_report_rows(halves: list[ProxALClient], fields: dict) -> dict[str, np.ndarray]:
        """:meth:`_on_report` of every client of ``halves`` (clients of one
        :meth:`step_batch_key`: no multipliers, cone duals or own block, statistics of the
        same names) in one pass: empty multipliers and each statistic as a column."""
        m = len(halves)
        Tally.settle_all()  # (every count added first: each one's statistics)
        stats = list(map(_STATS, halves))
        out = {"mu": np.zeros((m, 0)), "nu": np.zeros((m, 0))}
        for key in stats[0]:
            out[key] = np.fromiter(map(itemgetter(key), stats), dtype=float, count=m)
        return out


_INNER = attrgetter("inner")
_ROUTE_NAME = attrgetter("route_name")
_OUTER_MEM = attrgetter("outer_mem")

#: what decides a client's step_batch_key of ``outer`` and ``outer_aa``: its own block,
#: its constraints and cones, its route and its route part's class, its outer Anderson
#: memory
_OUTER_FACTS = attrgetter(
    "owned",
    "program.m_ineq",
    "program.m_eq",
    "program.m_cone",
    "route_name",
    "inner.__class__",
    "outer_anderson",
)

#: what decides it for ``start`` and ``evaluate``, once its form has been looked up
#: (``glm_looked_up``), besides the form's signature: the batches' option, its form's
#: verdict, whether its evaluation is its objective's alone (None until judged) and its route
_GLM_FACTS = attrgetter("options.batch_clients", "_glm_disagrees", "glm_plain", "route_name")
_LOOKED_UP = attrgetter("glm_looked_up")

#: what decides it for ``report``, besides its statistics' names: its multipliers', cone
#: duals' and own block's sizes
_REPORT_FACTS = attrgetter("mu.size", "nu.size", "owned", "cone.size")
_STATS = attrgetter("_stats")
_SIGNATURE = attrgetter("glm_signature")


def _route_parts(halves: list[ProxALClient]) -> tuple[list, set]:
    """Each half's route part and the parts' classes (:meth:`ProxALClient.handler_owners`;
    kept by :func:`~fedmodel.algorithms.protocol.kept_alike`: a part changes only with
    its route, an event that calls ``plans_changed``)."""
    parts = list(map(_INNER, halves))
    return parts, set(map(type, parts))


def _glm_signatures(halves: list[ProxALClient]) -> tuple[list, dict] | None:
    """What decides the ``start`` and ``evaluate`` keys of ``halves`` once each client has
    judged its own evaluation (at its first round) and they are alike in all but their
    forms' signatures (:data:`_GLM_FACTS`, forms looked up): each one's signature object
    (one per form's path, :func:`glm_structure`) and a client of each; None when they are
    not alike so (each then finds its own key). Kept by
    :func:`~fedmodel.algorithms.protocol.kept_alike`: besides a form looked up later,
    which changes no key, these facts change only at an event that calls
    ``plans_changed``."""
    unjudged = [h for h in halves if h.glm_plain is None]
    for h in unjudged:
        h.glm_plain = plain_objective_party(h.program)
    facts = set(map(_GLM_FACTS, halves))
    if len(facts) != 1 or None in facts.pop() or not all(map(_LOOKED_UP, halves)):
        return None
    ids = list(map(id, map(_SIGNATURE, halves)))
    return ids, dict(zip(ids, halves))


def _glm_keys(ids: list, one: dict, kind: str) -> list:
    """The ``start`` or ``evaluate`` key of each client of signature ``ids[i]``
    (:func:`_glm_signatures`): the key of one client per signature object (``one``),
    given to each client of that object."""
    keys = {i: h.step_batch_key(kind) for i, h in one.items()}
    return [keys[i] for i in ids]


def _own(a: np.ndarray) -> np.ndarray:
    """A copy of ``a`` to keep, or ``a`` itself when it is empty (nothing can change it)."""
    return a.copy() if a.size else a


#: the empty block of a client without constraints, cones or own variables (one array for
#: all: nothing can change an array without elements)
_EMPTY = np.zeros(0)

#: the outer Anderson memory's entry of a client without constraints (residual, mu, nu:
#: empty), one for all
_EMPTY_OUTER_ENTRY = (_EMPTY, _EMPTY, _EMPTY)


def _start_rows(halves: list[ProxALClient], W: np.ndarray, request: dict) -> dict[str, np.ndarray]:
    """Each client's route part's ``start`` at its row of ``W`` (the parts of one class), the
    replies stacked: in one step when the class has one (``start_rows``)."""
    parts = kept_alike(halves, "_route_parts", _route_parts)[0]  # (read once, kept)
    rows = getattr(type(parts[0]), "start_rows", None)
    if rows is not None:
        return rows(parts, W, request)
    return _stacked_replies([part.start(W[i], **request) for i, part in enumerate(parts)])


def _stacked_replies(replies: list[dict]) -> dict[str, np.ndarray]:
    """The replies of a stacked step's clients (dicts of the same fields) as one array per
    field, a row per client."""
    return {name: np.array([r[name] for r in replies]) for name in replies[0]}


def _one_memory_length(memories: list[list]) -> None:
    """Refuse (a ValueError, before any state changes: the round then goes message by
    message) clients of one stacked outer step whose outer Anderson memories
    (``memories``, a client's each) differ in length: their ``gram`` replies would differ
    in shape."""
    if len(set(map(len, memories))) > 1:
        raise ValueError("the clients' outer Anderson memories differ in length")


def _stacked_start_fields(halves: list[ProxALClient], fields: dict) -> tuple[np.ndarray, dict]:
    """The stacked ``w`` (a row per client) of a request that starts the clients' inner
    solves or evaluates their certificate there, and its other fields (one value for all);
    ValueError before any state changes when ``w`` is not a finite point of the shared
    variables."""
    m, ns = len(halves), halves[0].ns
    W = fields["w"]
    W = np.asarray(W.values if isinstance(W, Rows) else np.broadcast_to(W, (m, ns)), dtype=float)
    if W.shape != (m, ns) or not np.all(np.isfinite(W)):
        raise ValueError("the round's w is not a finite point of the shared variables")
    request = {k: v for k, v in fields.items() if k != "w"}
    if any(isinstance(v, Rows) for v in request.values()):
        raise ValueError("the round's start fields are one value for all")
    return W, request


@functools.cache
def _client_table(route_name: str):
    """What a client of route ``route_name`` answers: the route's table and secure
    aggregation's (one table per route, shared by the clients)."""
    return route_table(route_named(route_name)).merged(SECAGG)


def kkt_feasibility(ci, ce, mu, hard_i=False, hard_e=False) -> dict[str, float]:
    """A party's feasibility and complementarity at ``w^{k+1}`` with its updated multipliers
    (test (8)'s feasibility half, measured): ``violation = max(max_j c_j^+, max |a|)`` over
    its inequalities ``c`` and equalities ``a`` and ``complementarity = max_j mu_j max(-c_j,
    0)``; rows imposed exactly (exact-admm's hard rows) are left out.

    Examples
    --------
    >>> kkt_feasibility(np.array([-0.5, 1e-3]), np.zeros(0), np.array([0.2, 1.0]))
    {'violation': 0.001, 'complementarity': 0.1}
    """
    ci, ce = np.asarray(ci, dtype=float), np.asarray(ce, dtype=float)
    soft_i = ~np.broadcast_to(np.asarray(hard_i, dtype=bool), ci.shape)
    soft_e = ~np.broadcast_to(np.asarray(hard_e, dtype=bool), ce.shape)
    ci, mu, ce = ci[soft_i], np.asarray(mu, dtype=float)[soft_i], ce[soft_e]
    violation = max(float(np.maximum(ci, 0.0).max(initial=0.0)), float(np.abs(ce).max(initial=0.0)))
    complementarity = float((mu * np.maximum(-ci, 0.0)).max(initial=0.0))
    return {"violation": violation, "complementarity": complementarity}
