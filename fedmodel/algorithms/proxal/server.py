"""prox-al: seed 000 Algorithm 1 (proximal augmented Lagrangian, the outer loop) around one
inner solver from the table of :mod:`~fedmodel.algorithms.proxal.routes`; also ``admm``
(Algorithm 2 alone, one inner solve).

The server half below holds only the server's program (``c_0``, server data, ``h``) and
``mu_0``; it reaches clients only through the runtime's messages
(:mod:`~fedmodel.algorithms.proxal.messages`). Per outer iteration k:

1. tau_k = sbar / (k + 1)^2 (paper), or ``max(sbar tau_rate^k, floor)`` (adaptive);
2. the inner solver (:class:`~fedmodel.algorithms.proxal.inner.InnerSolver`) from w^k to a
   point w^{k+1} with dist(0, d l_k(w^{k+1})) <= tau_k (Algorithm 2: its bound (19));
3. mu_0 update on the server; w^{k+1} broadcast (``outer``); clients update mu_i and return
   ||mu_i^{k+1} - mu_i^k||_inf with the start of the next inner solve;
4. stop on (8): ||w^{k+1} - w^k||_inf + beta tau_k <= beta eps1 and
   max_i ||mu_i^{k+1} - mu_i^k||_inf <= beta eps2 (with an inner solver that measures the
   Lagrangian gradient, the first half on that measurement, which it bounds; see ``test8``),
   then the optional outer Anderson step (``outer_aa``).
"""

from __future__ import annotations

import numpy as np

from fedmodel.algorithms.common import multiplier_plateau, starting_point
from fedmodel.algorithms.dp import SUMMED, BudgetSpent
from fedmodel.algorithms.driver import run_federated
from fedmodel.algorithms.protocol import ServerHalf, StepReport
from fedmodel.algorithms.proxal.admm_inner import penalty_metric
from fedmodel.algorithms.proxal.anderson import AndersonState
from fedmodel.algorithms.proxal.client import ProxALClient, kkt_feasibility
from fedmodel.algorithms.proxal.inner import InnerOutcome, InnerSolver
from fedmodel.algorithms.proxal.messages import route_table
from fedmodel.algorithms.proxal.options import ProxALOptions, parameter_unit
from fedmodel.algorithms.proxal.routes import (
    LAYOUT_REFUSED,
    apply_defaults,
    choose,
    fallback,
    route_named,
    route_option_values,
)
from fedmodel.certificate.infeasibility import (
    farkas_point,
    farkas_report,
    farkas_verdict,
    ray_certificate,
    ray_points,
    ray_report,
    steady,
)
from fedmodel.certificate.kkt import KKTResiduals, party_evaluation, party_reports
from fedmodel.certificate.scale import (
    objective_reference,
    reference_scale,
    regularizer_reference,
)
from fedmodel.compiler.glm import NotRecognised
from fedmodel.compiler.partition import CompiledModel, PartyProgram
from fedmodel.compiler.regularizer import Regularizer
from fedmodel.errors import UnsupportedError
from fedmodel.runtime.base import Runtime
from fedmodel.runtime.endpoints import EndpointFactory
from fedmodel.runtime.outcomes import ClientFailure, InvalidReply, StepOutcome
from fedmodel.subproblems import conic_prox
from fedmodel.subproblems.merit import MeritProblem
from fedmodel.subproblems.select import make_solver

#: "unbounded" needs the objective at the blown-up point this many times max(1, |f|)
#: below the last iterate's (see ProxALServer.blow_up)
UNBOUNDED_DROP = 10.0
#: where the multipliers crawl, the adaptive variant raises a defaulted beta by
#: PENALTY_RAISE, at most PENALTY_RAISES times (:meth:`ProxALServer.raise_penalty`): at a
#: plateau the monitor would call diverging, or where the multiplier step has not halved
#: over PENALTY_WINDOW outer iterations (:meth:`ProxALServer.multipliers_slow`; Birgin and
#: Martinez's rule, over a window). Maros-Meszaros CVXQP3_S with its objective times 30
#: takes 177 rounds with one raise (763 at beta = 1e5); no model of benchmarks/models.py
#: --quick reaches it
PENALTY_RAISE, PENALTY_RAISES = 10.0, 3
PENALTY_WINDOW = 5
#: tau_k is at least this fraction of the last outer step's proximal part
#: ||w^k - w^{k-1}||_inf / prox_beta of the measured stationarity (inner solvers that measure
#: the gradient: the Newton-type routes) -- an inner solve more accurate than the outer step
#: moves is spent on a point the next step leaves (a relative error criterion of inexact
#: proximal point methods, Solodov and Svaiter 1999); test (8) reads the measured
#: stationarity, so the stop is unchanged. Adult NP, 20 sites, rounds at 0 / 0.25 / 0.5 /
#: 1: 218 / 206 / 198 / 206; without outer Anderson (the quasi-Newton default): 198 / 181
#: / 168 / 168
PROX_RELATIVE_TAU = 0.5
#: the layout version of the server's checkpointed state (a state of another layout is
#: refused with a message, see ProxALServer.set_state)
STATE_LAYOUT = 5


def _largest(replies, field: str, start: float) -> float:
    """``start`` or the largest of the replies' scalar ``field`` (0 where a reply has none),
    read as one column when the round answered stacked."""
    stacked = getattr(replies, "stacked", None)
    if stacked is None:
        return max([start] + [float(r.payload.get(field, 0.0)) for r in replies.values()])
    column = stacked.get(field)
    values = [0.0] * len(replies) if column is None else np.asarray(column, dtype=float).tolist()
    return max([start, *values])


class ProxALServer(ServerHalf):
    """Server half of prox-al / admm: Algorithm 1 (``c_0`` with ``mu_0``, ``h``, tau_k,
    test (8), the monitors, the outer Anderson step) around one inner solver.

    Its state (``get_state``) is the iterate ``w^k``, ``mu_0``/``nu_0``, counters, the
    outer Anderson memory and the running inner solver's own state (``inner``); one
    :meth:`step` is one outer iteration (an inner solve to tau_k, then the multiplier
    round), or the single inner solve of ``admm``.

    Parameters
    ----------
    program : PartyProgram
        The server's own terms (``c_0``, optional ``f_0``) and data.
    regularizer : Regularizer
        ``h``.
    rhos : dict
        ``rho_i`` of every client (public algorithm parameters).
    n_clients : int
    options : ProxALOptions
    proximal : bool
        False for plain ADMM (method ``"admm"``).
    x0 : array
        The starting point w^0 (stacked variables).
    route : type or str
        The inner solver (:data:`~fedmodel.algorithms.proxal.routes.ROUTES`), and
        ``inner_note`` why ``"auto"`` took it.
    fallback : type or str
        The route taken when ``route`` is refused at the start.
    tables : dict, optional
        Route name -> the run's message table of that route
        (:func:`~fedmodel.algorithms.proxal.messages.route_table` with the model and the
        options); without one, the route's table with every optional field.
    """

    step_name = "outer iteration"
    # (secure aggregation and dp on the routes whose messages are sums:
    # routes.secure_obstacle)
    private_aggregation = ("secure_aggregation", "dp")
    state_fields = (
        "layout", "x", "k", "mu", "nu", "local_iterations", "inner_total", "mu_norms",
        "w_norms", "cone", "rhos", "dmu_history", "outer_mem", "route", "inner_note",
        "tau_floor_scale", "prox_residual", "fell_back", "mu_mark", "nu_mark", "w_steps",
        "recession_next", "certificate", "objective_scale", "objective_units", "handed_over",
        "kkt_factors", "penalty_raises", "plateau_from", "near_next",
    )  # fmt: skip
    component_fields = ("outer_aa", "inner")

    def __init__(
        self,
        program: PartyProgram,
        regularizer: Regularizer,
        rhos: dict[str, float],
        n_clients: int,
        options: ProxALOptions,
        proximal: bool = True,
        x0: np.ndarray | None = None,
        conic: bool = False,
        metric: str = "scalar",
        route: type[InnerSolver] | str = "admm",
        inner_note: str = "",
        fallback: type[InnerSolver] | str = "admm",
        user_constraints: bool = True,
        may_be_infeasible: bool = True,
        consensus_may_fail: bool = True,
        tables: dict | None = None,
        convex: bool = True,
    ):
        layout = program.layout
        owned_anywhere = layout.has_owned  # (the model's layout: any party's own variables)
        self.owned_anywhere = owned_anywhere
        # where the server's view (shared variables, then its own) sits in the model's x
        self.view_index = layout.indices(layout.local(program.name).variables)
        program = program.local()
        super().__init__(program, options)
        self.layout = STATE_LAYOUT
        self.ns = program.layout.n_shared
        self.owned = program.layout.size > self.ns
        # the objective's units of the algorithm's parameters (:meth:`take_objective_units`)
        self.objective_units = (1.0, 1.0, 1.0, 1.0)
        self.objective_scale = 1.0
        self.n_clients = int(n_clients)
        # test (8)'s internal targets, kkt_factor * (eps1, eps2); eps itself when any party has cone
        # constraints (``conic``): their interior-point subproblems are accurate to ~1e-9, so a
        # target below eps only exhausts max_inner; the certificate checks eps in any case
        self.kkt_factors = (1.0, 1.0) if conic else options.kkt_factors
        self.plain_kkt_factors = self.kkt_factors  # (before a route's configure changes them)
        # facts of the model the inner solvers read: whether a party has constraints of the
        # user's, and whether the model can be infeasible at all (only constraints and h's
        # box or ball restrict the consensus x_i = z)
        self.user_constraints = bool(user_constraints)
        self.may_be_infeasible = bool(may_be_infeasible)
        # (and whether exact steps that impose each party's constraints can miss a common
        # point: two parties or more restrict their points)
        self.consensus_may_fail = bool(consensus_may_fail)
        # the certificates of infeasibility and unboundedness (convex models): the server's
        # multipliers before the last outer update, the outer steps ||w^{k+1} - w^k||_inf,
        # the outer iteration from which each certificate is tried again and after how
        # many more (a failed try doubles the wait), and the certificate that ended the run
        self.convex = bool(convex)
        self.mu_mark = self.nu_mark = None
        self.w_steps: list[float] = []
        self.recession_next = {"infeasible": [0, 1], "unbounded": [0, 1]}
        # the outer iteration from which a measured near stop may evaluate the certificate
        # again, and the wait after it (:meth:`measured_near_stop`: a failed try doubles it)
        self.near_next = [0, 1]
        self.certificate: dict = {}
        self.tau_floor_scale = 1.0  # (lowered by an inner solver the certificate contradicts)
        # ||w^k - w^{k-1}||_inf / prox_beta of the last outer step (an inner solver that
        # measures the gradient: the proximal part of the measured stationarity, which sets
        # the next tau_k's floor)
        self.prox_residual = 0.0
        self.rhos = dict(rhos)
        self.metric = metric  # (the ADMM penalty's metric, res.extra["penalty_metric"])
        self.proximal = proximal
        self.max_steps = options.max_outer if proximal else 1
        self.n_own = program.layout.size - self.ns
        self.problem = MeritProblem([program], float(options.beta), regularizer)
        self.derive_parameters()
        self.solver = make_solver(self.problem, options.solver)
        self.mu = np.full(program.m_ineq, float(options.mu0))
        self.nu = np.zeros(program.m_eq)
        self.x = None if x0 is None else np.asarray(x0, dtype=float)[self.view_index]
        self.k = -1
        self.inner_total = 0
        self.mu_norms: list[float] = []
        self.w_norms: list[float] = []
        self.dmu_history: list[float] = []
        # the outer iterations after which beta was raised (:meth:`raise_penalty`), and
        # where the monitors' history of multiplier steps starts (at the last raise)
        self.penalty_raises: list[int] = []
        self.plateau_from = 0
        # Anderson acceleration memory of Algorithm 2 (0: off); not with party-owned
        # variables, whose own blocks are part of the iteration's state but never travel
        self.anderson = 0 if owned_anywhere else int(options.anderson)
        # outer Anderson acceleration (None: off) and its memory (residual, w, mu_0, nu_0)
        m_out = 0 if (owned_anywhere or not proximal) else int(options.outer_anderson)
        self.outer_aa = AndersonState(m_out) if m_out else None
        self.outer_mem: list[tuple] = []
        self.fallback_route = route_named(fallback) if isinstance(fallback, str) else fallback
        self.fell_back = ""  # (the route refused at the start, res.extra)
        self.handed_over = ""  # (the route that handed the run over, and why: res.extra)
        self.inner_note = inner_note  # (res.extra["inner_solver_note"])
        self.tables = dict(tables or {})
        self.use_route(route_named(route) if isinstance(route, str) else route)

    def use_route(self, route: type[InnerSolver]) -> None:
        """Build ``route``'s server part (its state only) and declare its messages."""
        self.route = route.name
        self.inner = route(self)
        self.messages = self.tables.get(route.name) or route_table(route)
        self.inner.configure()

    # -- the protocol ------------------------------------------------------------------------
    def start(self, runtime: Runtime) -> None:
        """The first round: the inner solver's start at w^0; a route refused by the
        server's own check or by a client gives way to the fallback route (one more round).
        When the objective's scale puts the parameters in other units
        (:meth:`take_objective_units`), one ``units`` round sends them and restarts the
        inner solver in them."""
        if self.inner.probes:
            why = ""
            try:  # (the first call cross-checks the server's GLM form)
                self.inner.check()
            except NotRecognised as exc:
                why = f"the server: {exc}"
            if not why:
                runtime.next_round()
                replies = self.collect(runtime, "start", self.start_request())
                why = _refusals(replies)
                if not why:
                    self.started(runtime, replies)
                    return
            if self.privacy is not None and self.privacy.active:
                what = "secure_aggregation" if self.privacy.secure is not None else "dp"
                raise UnsupportedError(
                    f"prox-al with {what}: the {self.route} inner solver is "
                    f"refused at its start ({why}), and the {self.fallback_route.name} inner "
                    "solver it would fall back to reads messages client by client"
                )
            self.fell_back, self.inner_note = self.route, why
            self.use_route(self.fallback_route)
            runtime.declare(self.messages, runtime.declared_dims)
        runtime.next_round()
        self.started(runtime, self.collect(runtime, "start", self.start_request()))

    def hand_over(self, runtime: Runtime, why: str) -> None:
        """Go on with the fallback route (Algorithm 2) from the current iterate: one
        ``start`` round names it to the clients, which build its part and keep their
        multipliers and own blocks; test (8)'s targets and the inner tolerance's floor
        return to the options' (those the handing route had set are its own)."""
        self.handed_over = f"{self.route} (outer iteration {self.k}: {why})"
        self.kkt_factors, self.tau_floor_scale = self.plain_kkt_factors, 1.0
        self.use_route(self.fallback_route)
        runtime.declare(self.messages, runtime.declared_dims)
        runtime.next_round()
        request = {"w": self.x[: self.ns], "inner": self.route, **self.inner_request()}
        self.inner.take_start(self.collect(runtime, "start", request))

    def started(self, runtime: Runtime, replies) -> None:
        """The clients' accepted ``start`` replies: the objective's scale, and the inner
        solver's start (again in the objective's units when they change the parameters)."""
        self.take_objective_scale(replies)
        if self.take_objective_units():
            replies = self.units_round(runtime)
        self.inner.take_start(replies)

    def units_round(self, runtime: Runtime):
        """One ``units`` round: the clients take the parameters in ``objective_units`` and
        start the inner solver again at the iterate; their replies."""
        runtime.next_round()
        units = {"objective_units": np.array(self.objective_units)}
        return self.collect(runtime, "units", {**self.start_request(), **units})

    def collect(self, runtime: Runtime, kind: str, payload: dict) -> dict:
        """The clients' replies to ``kind`` as the server knows them, through the run's
        privacy plan (:meth:`~fedmodel.algorithms.dp.PrivacyPlan.collect`): every
        client's, or under secure aggregation the sums of the sum-only fields and each
        client's unmasked scalars. The readers take sums over the replies that carry a
        field and maxima of the scalars, so a route whose messages are all sum-only runs
        the same either way."""
        if self.privacy is None:  # (a server half driven outside run_federated)
            return runtime.broadcast(kind, payload)
        return self.privacy.collect(runtime, kind, payload)

    def take_objective_scale(self, replies) -> None:
        """The certificate's objective scale ``S`` (:mod:`fedmodel.certificate.scale`),
        once, at w^0: the sum of the clients' references (one scalar each in their
        ``start`` replies; under secure aggregation the server reads only their sum), the
        server's own and ``h``'s."""
        ns = self.ns
        stacked = getattr(replies, "stacked", None)
        if stacked is not None and "objective_reference" in stacked:  # (one column)
            refs = np.asarray(stacked["objective_reference"], dtype=float).tolist()
        else:
            refs = [float(r.payload.get("objective_reference", 0.0)) for r in replies.values()]
        refs.append(objective_reference(self.program, self.x))
        refs.append(regularizer_reference(self.problem.regularizer, self.x[:ns]))
        self.objective_scale = reference_scale(refs)

    def take_objective_units(self) -> bool:
        """Put the algorithm's parameters in the objective's units (the adaptive variant of
        prox-al; True when that changes them): the iteration runs as on ``f / u``, ``u =``
        :func:`~fedmodel.algorithms.proxal.options.parameter_unit` ``(S)``, ``S`` the
        objective's scale (:mod:`fedmodel.certificate.scale`): 1 while ``S`` lies in the
        band the defaults are measured in (the parameters are then the options' as given),
        else the power of ``10^3`` that brings ``S`` into it, so that the model times any
        ``t = 10^(3 j)`` takes the same iterates. ``u l_k`` of ``f / u`` with penalty
        ``beta``, proximal step ``prox_beta`` and ADMM penalties ``rho_i`` is ``l_k`` of
        ``f`` with ``u beta``, ``prox_beta / u`` and ``u rho_i``, multipliers ``u mu`` and
        gradient tolerances ``u tau_k``: each default is scaled so; a value the user set is
        kept in the user's units (its factor is 1), as is ``rho_i`` under the Hessian
        metric (whose ``M_i`` is in the objective's units already). The clients receive
        ``objective_units = (u, beta's factor, 1/prox_beta's factor, rho's factor)`` in a
        ``units`` round, which starts the inner solver again. Routes whose
        ``objective_units`` is False (admm, exact-admm) keep the user's units."""
        opts = self.options
        unit = parameter_unit(float(self.objective_scale))
        if not (opts.adaptive and self.proximal and self.inner.objective_units) or unit == 1.0:
            return False
        defaulted = getattr(opts, "_defaulted", ())
        factors = [unit if name in defaulted else 1.0 for name in ("beta", "prox_beta", "rho")]
        if self.metric == "hessian":  # (rho_i M_i: the Hessian M_i carries the units)
            factors[2] = 1.0
        self.objective_units = (unit, *factors)
        self.rhos = {name: rho * factors[2] for name, rho in self.rhos.items()}
        self.derive_parameters()
        self.use_route(type(self.inner))  # (its parameters and a fresh state)
        return True

    def derive_parameters(self) -> None:
        """``beta``, the proximal step ``gamma`` and weight ``p`` from the options in the
        objective's units (:meth:`take_objective_units`)."""
        self.beta, self.gamma, self.prox_weight = self.options.penalties(
            self.objective_units, self.n_clients, self.proximal
        )
        self.problem.beta = self.beta

    @property
    def objective_unit(self) -> float:
        """The parameters' unit ``u`` (:meth:`take_objective_units`), 1 in the user's."""
        return self.objective_units[0]

    def evaluation_extras(self) -> dict:
        """The objective's scale, and what the inner solver adds to an ``evaluate``
        request (:meth:`~fedmodel.algorithms.proxal.inner.InnerSolver.evaluate_request`)."""
        return {"objective_scale": self.objective_scale, **self.inner.evaluate_request()}

    def start_request(self) -> dict:
        """The first start of the inner solver at w^0 (after a fallback, with the name of
        the route the clients are to take)."""
        named = {"inner": self.route} if self.fell_back else {}
        return {"w": self.x[: self.ns], **named, **self.inner_request()}

    def inner_request(self, move: np.ndarray | None = None) -> dict:
        """What a request that starts an inner solve adds: the route's fields."""
        return self.inner.request(move)

    @property
    def target_unit(self) -> float:
        """The unit of the gradient-sized targets of test (8) and of the inner tolerances:
        ``min(1, S)``, ``S`` the certificate's objective scale
        (:mod:`fedmodel.certificate.scale`). The certificate divides the objective by
        ``S``; its stationarity floor is ``min(S, 10 max(S, F) / ||x||_1)``, which is
        never below the absolute one when ``S >= 1``, so test (8) at the absolute ``eps1``
        implies what it implies at ``S = 1``. A smaller objective shrinks the targets
        with ``S`` (a minimum-variance portfolio of size ``1e-5`` is then solved as
        strictly as itself times ``1e5``). The targets never grow with ``S``: the inner
        bounds add consensus and cone feasibility, which are in the constraints' units,
        to the gradient residuals. With the parameters in the objective's units ``u``
        (:meth:`take_objective_units`) the unit is ``u min(1, S / u)``: the run is that
        of ``f / u``."""
        unit = self.objective_unit
        return unit * min(1.0, self.objective_scale / unit)

    @property
    def eps1_units(self) -> float:
        """``eps1`` in the targets' unit (:attr:`target_unit`)."""
        return self.options.eps1 * self.target_unit

    def tau(self, k: int) -> float:
        """Inner tolerance of outer iteration ``k``: ``u sbar/(k+1)^2`` (paper), or
        ``u max(sbar tau_rate^k, kkt_factor eps1 / 2)`` (adaptive), ``u`` the targets' unit
        (:attr:`target_unit`); Algorithm 2 (method ``admm``): ``u eps1``. Under dp never below
        the noise's bound on the gradient's largest entry (:attr:`noise`): a smaller measured
        gradient is indistinguishable from the noise."""
        opts, unit = self.options, self.target_unit
        if not self.proximal:
            return max(self.eps1_units, self.noise[1])
        if opts.adaptive:
            floor = 0.5 * self.kkt_factors[0] * self.eps1_units * self.tau_floor_scale
            relative = PROX_RELATIVE_TAU * self.prox_residual  # (0 unless (quasi-)Newton)
            tau = max(unit * opts.sbar * opts.tau_rate**k, floor, relative)
        else:
            tau = unit * opts.sbar / (k + 1) ** 2
        return max(tau, self.noise[1])

    @property
    def noise(self) -> tuple[float, float]:
        """Under dp, the confidence bounds of the noise on one noised sum's scalar (a
        value) and on the largest entry of its ``d``-vector (a gradient)
        (:meth:`~fedmodel.algorithms.dp.PrivacyPlan.noise_bound`); ``(0, 0)`` otherwise."""
        plan = self.privacy
        if plan is None or plan.dp is None:
            return 0.0, 0.0
        return plan.noise_bound(1), plan.noise_bound(self.ns)

    def step(self, runtime: Runtime, deadline: float | None) -> StepReport:
        """One outer iteration (:meth:`outer_iteration`); under dp, the status
        ``"budget_spent"`` when a noised sum it needs would exceed the privacy budget (the
        iterate is the last one the server holds: ``w^k``, or ``w^{k+1}`` once the outer
        round has begun)."""
        try:
            return self.outer_iteration(runtime, deadline)
        except BudgetSpent as spent:
            return StepReport(stop="budget_spent", message=f"{spent} at outer iteration {self.k}")

    def outer_iteration(self, runtime: Runtime, deadline: float | None) -> StepReport:
        """Algorithm 1's outer iteration ``k``: the inner solve, the multiplier round
        (``outer``), test (8) and the monitors."""
        opts = self.options
        self.k = k = self.k + 1
        tau = self.tau(k)
        outcome = self.inner.solve(runtime, tau, deadline)
        self.inner_total += outcome.iterations
        w_new = outcome.w
        if not np.all(np.isfinite(w_new)) or np.abs(w_new).max() > opts.divergence_limit:
            return self.blow_up(runtime, k, w_new)
        # (under dp a line search stalls on the noise or the clipping's bias: the outer
        # iteration goes on from w^k, and the budget ends the run)
        if outcome.certified:  # (the certificate held at the inner iterate: it decides)
            self.x = w_new
            info = {"inner_iterations": outcome.iterations, "inner_bound": outcome.bound}
            return StepReport(info=info, stop="stopped")
        if outcome.certificate is not None:  # (the inner solve found it)
            self.x = w_new
            self.certificate = outcome.certificate[1]
            info = {"inner_iterations": outcome.iterations, "inner_bound": outcome.bound}
            message = f"at outer iteration {k} {outcome.certificate[0]}"
            return StepReport(info=info, stop="infeasible", message=message)
        if outcome.stalled and getattr(self.privacy, "dp", None) is None:
            self.x = w_new
            # (exact-admm's consensus gap settled: the Farkas certificate may confirm it)
            proven = self.recession(runtime, k, ("infeasible",) if self.may_try_farkas() else ())
            return proven or self.inner.stalled(k, outcome, tau)
        dw = self.outer_change(w_new, self.x)
        # Newton measured grad l_k(w^{k+1}) = grad_w L(w^{k+1}, mu^{k+1}) + (w^{k+1} - w^k) /
        # prox_beta (the multiplier update is the AL terms' gradient weight): the Lagrangian's
        # stationarity itself, which (8) bounds by tau_k + ||w^{k+1} - w^k|| / prox_beta
        stationarity = None
        if outcome.gradient is not None and self.proximal and not self.owned:
            stationarity = float(np.abs(outcome.gradient - (w_new - self.x) / self.gamma).max())
            self.prox_residual = float(np.abs(w_new - self.x).max()) / self.gamma
        w_old, self.x = self.x, w_new
        outer_step = w_new - w_old  # (before an outer Anderson step moves the iterate)
        step_inf = float(np.abs(outer_step).max(initial=0.0))
        dmu = 0.0
        stop8 = False
        feas = None
        if self.proximal:
            mu_in, nu_in = self.mu.copy(), self.nu.copy()
            self.mu_mark, self.nu_mark = mu_in, nu_in
            dmu = self.update_multipliers(self.x)
            runtime.next_round()
            payload = {"w": self.x[: self.ns], **self.inner_request(self.x - w_old)}
            replies = self.collect(runtime, "outer", payload)
            dmu = _largest(replies, "dmu_inf", dmu)
            feas = self.feasibility_measured(replies)
            # test (8) on the clients' own blocks (one scalar each, see the client module)
            dw = _largest(replies, "dtheta_scaled", dw)
            if self.owned_anywhere:  # (the clients' own blocks move too: unboundedness)
                theirs = max(float(r.payload.get("dtheta_scaled", 0.0)) for r in replies.values())
                step_inf = max(step_inf, theirs / (self.beta * self.prox_weight))
            self.inner.take_start(replies)
            # test (8) (an inner solver may check the certificate at the iterate first, or
            # ask for it near the end although (8) failed)
            # ((8) reads tau_k as the bound on the inner solution's error (19): an inner
            # solve cut short -- max_inner, its deadline -- has only its own measured bound)
            accuracy = tau
            if self.inner.cut_short_bound and not outcome.satisfied:
                accuracy = max(tau, float(outcome.bound))
            if self.test8(dw, dmu, accuracy, stationarity, feas):
                stop8 = self.inner.verify_stop(runtime)
            elif (
                self.inner.near_stop(outcome, dw)
                or self.floor_near_stop(outcome, feas)
                or self.measured_near_stop(stationarity, feas)
            ):
                stop8 = self.certified(runtime)[0]
            if self.outer_aa is not None and not stop8:
                self.accelerate_outer(runtime, w_old, mu_in, nu_in, replies)
        self.mu_norms.append(float(np.abs(self.mu).max(initial=0.0)))
        self.w_norms.append(float(np.abs(self.x).max(initial=0.0)))
        self.dmu_history.append(dmu)
        self.w_steps.append(step_inf)
        report = StepReport(
            info={
                "inner_iterations": outcome.iterations,
                "inner_bound": outcome.bound,
                # False: the inner solver stopped at max_inner (or its deadline) without
                # (19) / its measured test, and Algorithm 1 went on with that w^{k+1}
                "inner_satisfied": bool(outcome.satisfied),
                "tau": tau,
                "dw_inf": dw,
                "dmu_inf": dmu,
            }
        )
        diverging = self.diverging() if (opts.monitor and self.proximal) else ""
        proven = None
        if self.proximal and opts.monitor and not stop8:
            checks = self.recession_checks(k, bool(diverging))
            proven = self.recession(runtime, k, checks, outer_step, step_inf)
        slow = diverging or self.multipliers_slow()
        if proven is None and slow and not stop8 and self.may_raise_penalty():
            self.raise_penalty(runtime)
            diverging = ""
        if proven is not None:
            report.stop, report.message = proven.stop, proven.message
        elif diverging:
            report.stop, report.message = "diverging", diverging
        elif not self.proximal:  # admm: one run of Algorithm 2 to tau = eps1
            if outcome.satisfied:
                report.stop = "stopped"
            elif not outcome.timed_out:  # (cut by the deadline: the driver says time_limit)
                report.stop = "max_iterations"
        elif stop8:
            report.stop = "stopped"  # (8) holds; the certificate decides "optimal"
        if stationarity is not None:
            report.info["stationarity_measured"] = stationarity
        if feas is not None:
            report.info["violation_measured"], report.info["complementarity_measured"] = feas
        return report

    def recession_checks(self, k: int, diverging: bool) -> tuple[str, ...]:
        """The certificates to try after outer iteration ``k``: ``"infeasible"`` when the
        multiplier steps have settled above ``beta eps2`` (or the plateau monitor fired),
        ``"unbounded"`` when the outer steps have settled; each again only after a wait
        that doubles with every failed try (a slowly converging feasible model costs a few
        rounds at most). None on a non-convex model."""
        if not self.convex:
            return ()
        opts, out = self.options, ()
        infeasible = self.dmu_history[-1] > self.beta * opts.eps2 and (
            steady(self.dmu_history) or diverging
        )
        if infeasible and self.may_be_infeasible:
            out += ("infeasible",)
        if self.w_steps[-1] > opts.eps1 and steady(self.w_steps, spread=0.01):
            out += ("unbounded",)
        return tuple(c for c in out if k >= self.recession_next[c][0] or diverging)

    def recession(
        self, runtime: Runtime, k: int, checks, step=None, scale=0.0
    ) -> StepReport | None:
        """Try the certificates ``checks`` (:mod:`~fedmodel.certificate.infeasibility`) at the
        iterate, one round each, every party on its own data: ``"infeasible"`` with the
        parties' multipliers and their last change (``farkas``), ``"unbounded"`` along the
        last outer step ``step = w^{k+1} - w^k`` (``ray``; ``scale``: the largest change of
        a coordinate, the clients' own blocks included). A StepReport ending the run when one
        holds (its numbers in ``res.extra["certificate"]``), else None."""
        if not self.may_certify() or not checks:
            return None
        for check in checks:
            if check == "infeasible":
                found = self.farkas(runtime, farkas_point(self.x, step, self.dmu_history))
            else:
                found = self.ray(runtime, step, scale)
            if found is not None:
                self.certificate = found[1]
                return StepReport(stop=check, message=f"at outer iteration {k} {found[0]}")
            wait = self.recession_next[check][1]
            self.recession_next[check] = [k + wait, 2 * wait]
        return None

    def may_certify(self) -> bool:
        """Whether the certificates of infeasibility and unboundedness may run: not under
        dp, where a round spends privacy, nor under secure aggregation, whose fixed-point
        range the far points' objectives and growing multipliers can exceed (the monitors
        then speak as without the certificates)."""
        plan = self.privacy
        return plan is None or (plan.dp is None and plan.secure is None)

    def may_try_farkas(self) -> bool:
        """Whether an inner solver may try the Farkas certificate on its way (a convex
        model that can be infeasible, the proximal method with its monitors on)."""
        opts = self.options
        convex = self.convex and self.proximal and self.may_be_infeasible
        return convex and opts.monitor and self.may_certify()

    def farkas(self, runtime: Runtime, point: np.ndarray | None = None) -> tuple[str, dict] | None:
        """The Farkas certificate at ``point`` (the iterate by default; one ``farkas``
        round): its message and numbers when the proven radius reaches
        :func:`~fedmodel.certificate.infeasibility.radius_needed`, else None."""
        ns = self.ns
        point = self.x if point is None else point
        runtime.next_round()
        replies = self.collect(runtime, "farkas", {"w": point[:ns]})
        mu_mark = self.mu if self.mu_mark is None else self.mu_mark
        nu_mark = self.nu if self.nu_mark is None else self.nu_mark
        cone = self.cone_duals()
        cone = np.zeros(0) if cone is None else cone
        candidates = []
        for suffix, (mu, nu, lam) in (
            ("", (self.mu, self.nu, cone)),
            ("_step", (self.mu - mu_mark, self.nu - nu_mark, np.zeros_like(cone))),
        ):
            mine = farkas_report(self.program, point, mu, nu, lam, ns)
            theirs = [
                {key: r.payload[key + suffix] for key in ("y", "b", "rho", "size")}
                for r in replies.values()
                if "b" + suffix in r.payload
            ]
            candidates.append([mine, *theirs])
        return farkas_verdict(candidates, self.problem.regularizer, point, self.options.eps1)

    def ray(self, runtime: Runtime, step: np.ndarray, scale: float) -> tuple[str, dict] | None:
        """The unboundedness certificate along the last outer step over ``scale`` (one
        ``ray`` round): its message and numbers when it holds, else None."""
        ns = self.ns
        if not scale > 0:
            return None
        d = step / scale
        # (the clients' own blocks have moved by about the outer steps so far)
        t = ray_points(self.x, self.options.eps1, float(np.sum(self.w_steps)))
        runtime.next_round()
        payload = {"w": self.x[:ns], "d": d[:ns], "scale": scale, "t": t}
        replies = self.collect(runtime, "ray", payload)
        mine = ray_report(self.program, self.x, d, t)
        theirs = [r.payload for r in replies.values()]
        return ray_certificate(
            [mine["objective"]] + [r["objective"] for r in theirs if "objective" in r],
            [mine["violation"]] + [r["violation"] for r in theirs if "violation" in r],
            self.problem.regularizer,
            self.x[:ns],
            d[:ns],
            t,
            self.options.eps2,
        )

    def certified(self, runtime: Runtime) -> tuple[bool, KKTResiduals]:
        """One diagnostic round (counted as a communication round): the certificate at the
        iterate, each party on its own data, and whether it holds at ``(eps1, eps2)``."""
        runtime.next_round()
        return self.judge(self.x, self.evaluations(runtime, self.x[: self.ns]))

    def judge(self, x: np.ndarray, theirs: dict[str, dict]) -> tuple[bool, KKTResiduals]:
        """The certificate at ``x`` from the clients' evaluations there (``theirs``: client
        -> its ``evaluate`` reply, or what the privacy plan's round gives) and the server's
        own, with its multipliers as they are; whether it holds at ``(eps1, eps2)``."""
        from fedmodel.certificate.kkt import assemble

        opts, ns = self.options, self.ns
        mine = party_evaluation(
            self.program,
            x,
            self.mu,
            self.nu,
            self.owned,
            self.cone_duals(),
            objective_scale=self.objective_scale,
        )
        reports = party_reports({self.program.name: mine}, theirs)
        kkt, _ = assemble(reports, self.problem.regularizer, x[:ns], False, self.objective_scale)
        return kkt.satisfied(opts.eps1, opts.eps2), kkt

    def carries_evaluation(self) -> bool:
        """Whether the clients' evaluations may travel in another round's messages (an
        inner solver's next round) instead of a round of their own: not under secure
        aggregation or dp, whose certificate round collects them as sums
        (:meth:`evaluations`)."""
        return self.privacy is None or not self.privacy.active

    def evaluations(self, runtime: Runtime, w: np.ndarray) -> dict[str, dict]:
        """The clients' ``evaluate`` reports at ``w`` (one diagnostic round): each
        client's, or under secure aggregation what the privacy plan's certificate round
        gives (:meth:`~fedmodel.algorithms.dp.PrivacyPlan.evaluate`: the sums, and each
        client's unmasked violation)."""
        payload = {"w": w, **self.evaluation_extras()}
        if self.privacy is not None and self.privacy.active:
            if self.privacy.dp is not None:  # (the final certificate keeps its share)
                self.privacy.reserve()
            names = runtime.client_names
            return self.privacy.evaluate(runtime, payload, names, self.ns)
        replies = runtime.broadcast("evaluate", payload, channel="diagnostic")
        return party_reports({}, replies)

    def feasibility_measured(self, replies) -> tuple[float, float] | None:
        """Test (8)'s feasibility half as measured by the inner solvers that declare it
        (``measures_feasibility``: the Newton-type routes):
        ``(violation, complementarity)`` at ``w^{k+1}`` with the updated multipliers, the
        largest over the parties (:func:`~fedmodel.algorithms.proxal.client.kkt_feasibility`;
        the clients' ``outer`` replies carry theirs; under dp their noised sums, an upper
        bound of the largest up to the noise); None with the other inner solvers (test (8)
        then reads ``max ||Delta mu|| / beta``)."""
        if not self.inner.measures_feasibility or self.owned:
            return None
        clients = [r.payload for n, r in replies.items() if n != SUMMED]
        if SUMMED in replies and "violation" in replies[SUMMED].payload:
            clients = [replies[SUMMED].payload]
        if not all("violation" in r for r in clients):
            return None
        ci, ce = self.problem.functions[0].constraint_values(self.x)
        reports = [kkt_feasibility(ci, ce, self.mu)] + clients
        violation = max(float(r["violation"]) for r in reports)
        complementarity = max(float(r["complementarity"]) for r in reports)
        return violation, complementarity

    def test8(
        self,
        dw: float,
        dmu: float,
        tau: float,
        stationarity: float | None = None,
        feasibility: tuple[float, float] | None = None,
    ) -> bool:
        """Stopping test (8), at ``kkt_factor * (eps1, eps2)`` (1 in the paper variant); its
        stationarity half ``dw / beta + tau_k`` (a bound) replaced by the Lagrangian's
        stationarity itself when the inner solver measured it (``stationarity``), and its
        feasibility half ``max ||Delta mu|| / beta`` (a bound on the violation that also
        reads a slack constraint with a positive multiplier as a violation) by the measured
        ``feasibility = (violation, complementarity)`` when given: violation at
        ``kkt_factor[1] eps2``, complementarity ``max mu_j max(-c_j, 0)`` at ``kkt_factor[0]
        eps1`` (the stationarity target: it is the Lagrangian's error from a multiplier on
        a slack row). Adult NP, 20 sites, quasi-Newton: 218 rounds against 226 with the
        bound alone."""
        opts, eps1 = self.options, self.eps1_units
        f1, f2 = self.kkt_factors
        if stationarity is None:
            stationary = dw + self.beta * tau <= self.beta * f1 * eps1
        else:
            stationary = stationarity <= f1 * eps1
        if feasibility is not None:
            return stationary and feasibility_met(feasibility, self.kkt_factors, eps1, opts.eps2)
        return stationary and dmu <= self.beta * f2 * opts.eps2

    def floor_near_stop(self, outcome: InnerOutcome, feasibility) -> bool:
        """Whether to evaluate the certificate although test (8) failed, because the inner
        solve ended at its rounding floor (``outcome.floor``) with the measured
        ``feasibility = (violation, complementarity)`` within (8)'s targets. (8) reads
        the Lagrangian's stationarity in absolute units, which the rounding of terms much
        larger than it keeps above ``eps1`` (Maros-Meszaros QBANDM at eps 1e-6: absolute
        1.1e-5 at a scaled stationarity of 3.2e-8), while the certificate scales it by
        the terms' size. One diagnostic round evaluates the certificate at the iterate and
        the run stops when it holds: "optimal" is that certificate."""
        if not outcome.floor or feasibility is None:
            return False
        return feasibility_met(feasibility, self.kkt_factors, self.eps1_units, self.options.eps2)

    def measured_near_stop(self, stationarity: float | None, feasibility) -> bool:
        """Whether to evaluate the certificate although test (8) failed, because the
        measured Lagrangian stationarity is within ``eps1`` (in the targets' unit,
        :attr:`eps1_units`) and the measured ``feasibility = (violation,
        complementarity)`` within (8)'s targets. (8) asks ``kkt_factor * eps1`` of the
        measured stationarity, a margin for the certificate's own scaling of it, which
        the certificate itself replaces: one diagnostic round evaluates it at the iterate
        and the run stops when it holds ("optimal" is that certificate). A try that fails
        doubles the outer iterations until the next (the first waits one), so the tries
        cost at most ``1 + log2`` of the outer iterations they span (under differential
        privacy each is one noised sum, as any round)."""
        if stationarity is None or feasibility is None or stationarity > self.eps1_units:
            return False
        if not feasibility_met(feasibility, self.kkt_factors, self.eps1_units, self.options.eps2):
            return False
        due, wait = self.near_next
        if self.k < due:
            return False
        self.near_next = [self.k + wait, 2 * wait]
        return True

    def accelerate_outer(self, runtime, w_old, mu_in, nu_in, replies) -> None:
        """Anderson acceleration of Algorithm 1's outer iteration ``(w^k, mu^k) ->
        (w^{k+1}, mu^{k+1})`` (the proximal method of multipliers, a fixed-point iteration
        of a firmly nonexpansive map), safeguarded as the inner one
        (:mod:`~fedmodel.algorithms.proxal.anderson`). The server adds its own block
        (``w`` and ``mu_0``) to the clients' Gram rows of their multiplier blocks; when the
        next input is a combination, one more round (``outer_aa``) sends it with ``alpha``
        and collects the clients' ADMM initialisations."""
        r = np.concatenate([self.x - w_old, self.mu - mu_in, self.nu - nu_in])
        mem = self.outer_mem
        mem.append((r, self.x.copy(), self.mu.copy(), self.nu.copy()))
        del mem[: -(self.outer_aa.memory + 1)]
        row = np.array([float(r @ q[0]) for q in mem])
        stacked = getattr(replies, "stacked", None)
        stacked = None if stacked is None else stacked.get("gram")
        if stacked is not None and stacked.shape[1:] == row.shape:  # (the rows as one array)
            alpha, reset = self.outer_aa.observe(row + np.add.reduce(stacked, axis=0))
            self.take_outer_step(runtime, w_old, alpha, reset)
            return
        grams = {
            name: np.asarray(rep.payload["gram"], dtype=float)
            for name, rep in replies.items()
            if "gram" in rep.payload
        }
        wrong = {  # (a row whose length is not the memory's: a failure of its party)
            name: StepOutcome(
                name,
                kind="invalid_reply",
                error=InvalidReply(
                    name,
                    "outer",
                    "gram",
                    f"client {name!r}, reply to 'outer': field 'gram' has {gram.size} entries "
                    f"where the outer Anderson memory holds {row.size} iterates",
                ),
            )  # fmt: skip
            for name, gram in grams.items()
            if gram.shape != row.shape
        }
        if wrong:
            raise ClientFailure(wrong, runtime.round, "outer")
        row = row + sum(grams.values())
        alpha, reset = self.outer_aa.observe(row)
        self.take_outer_step(runtime, w_old, alpha, reset)

    def take_outer_step(self, runtime, w_old, alpha: np.ndarray, reset: bool) -> None:
        """The outer Anderson step the safeguard chose (``alpha``, ``reset``): the
        combined iterate and multipliers, and the ``outer_aa`` round that sends them."""
        mem = self.outer_mem
        if alpha.size:
            picked = mem[-alpha.size :]
            self.x = sum(a * q[1] for a, q in zip(alpha, picked))
            self.mu = np.maximum(sum(a * q[2] for a, q in zip(alpha, picked)), 0.0)
            self.nu = sum(a * q[3] for a, q in zip(alpha, picked))
        if reset:
            mem.clear()
        if alpha.size or reset:
            runtime.next_round()
            out = self.collect(
                runtime,
                "outer_aa",
                {
                    "w": self.x[: self.ns],
                    "alpha": alpha,
                    "reset": reset,
                    **self.inner_request(self.x - w_old),
                },
            )
            self.inner.take_start(out)

    def point(self) -> np.ndarray:
        """The server's view of the iterate: shared variables, then its own block."""
        return self.x

    def outer_change(self, w_new: np.ndarray, w_old: np.ndarray) -> float:
        """``||w^{k+1} - w^k||_inf`` of test (8) on the shared variables, and on the
        server's own block in Algorithm 1's block metric (``beta p ||.||_inf``)."""
        ns = self.ns
        dw = float(np.abs(w_new[:ns] - w_old[:ns]).max(initial=0.0))
        if self.proximal:  # (8) bounds stationarity by tau + dw / prox_beta
            dw *= self.beta / self.gamma
        if self.owned and self.proximal:
            change = float(np.abs(w_new[ns:] - w_old[ns:]).max())
            dw = max(dw, self.beta * self.prox_weight * change)
        return dw

    def multipliers(self) -> tuple[np.ndarray, np.ndarray]:
        return self.mu, self.nu

    def cone_duals(self) -> np.ndarray | None:
        return self.problem.cone[0] if self.problem.has_cones else None

    @property
    def cone(self) -> np.ndarray:
        """The server's cone multipliers (held by its merit problem)."""
        return self.problem.cone[0]

    @cone.setter
    def cone(self, value) -> None:
        self.problem.cone[0] = np.array(value, dtype=float)

    def set_state(self, state: dict) -> None:
        """Put the server back to a :meth:`get_state` result: the running route's part is
        built first (its own state follows); a state of another layout is refused."""
        if state.get("layout") != STATE_LAYOUT:
            raise ValueError(LAYOUT_REFUSED)
        if state["route"] != self.route:
            self.use_route(route_named(state["route"]))
        super().set_state(state)

    def state_restored(self) -> None:
        """What the parameters and the running route derive from the restored state."""
        self.derive_parameters()
        self.inner.configure()
        self.inner.state_restored()

    def extra(self, reports: dict[str, dict]) -> dict:
        """The adaptive variant's final state: each client's rho_i, the route that ran (and
        why, and the one refused at the start), the options its defaults set, what the
        inner solver reports, the certificate's objective scale and the parameters' units
        (:meth:`take_objective_units`), and beta's raises (:meth:`raise_penalty`)."""
        out = {
            "objective_scale": self.objective_scale,
            "objective_units": list(self.objective_units),
            "variant": self.options.variant,
            "rho": dict(self.rhos),
            "penalty_metric": self.metric,
            "inner_solver": self.route,
            "inner_solver_options": route_option_values(self.options),
        }
        if self.penalty_raises:
            out["penalty_raised"] = {"after_outer": list(self.penalty_raises), "beta": self.beta}
        if self.inner_note:
            out["inner_solver_note"] = self.inner_note
        if self.fell_back:
            out["inner_solver_refused"] = self.fell_back
        if self.handed_over:
            out["inner_solver_handed_over"] = self.handed_over
        out.update(self.inner.extra())
        if self.certificate:
            out["certificate"] = dict(self.certificate)
        if self.outer_aa is not None:
            out["outer_anderson_rejections"] = self.outer_aa.rejections
        return out

    def round_counts(self) -> dict[str, int]:
        return {"inner": self.inner_total}

    def conclude(self, status, message, kkt, summary, history):
        opts = self.options
        if status in ("diverging", "stalled") and kkt.satisfied(opts.eps1, opts.eps2):
            # the monitor stopped the iteration, but the point it returns is certified (a
            # non-convex outer loop can oscillate around a KKT point): the certificate decides
            return "optimal", (
                f"(eps1, eps2) = ({opts.eps1:g}, {opts.eps2:g})-KKT point certified; the "
                f"monitor had stopped the iteration ({status}: {message})"
            )
        if status == "inaccurate":
            message = (
                "the stopping test (8) held but the recomputed KKT residuals "
                f"({kkt.describe()}) exceed the tolerance: test (8) bounds the absolute "
                "residuals, the certificate scales them (a loss averaged over many rows needs "
                "a smaller eps in (8)), or the inner ADMM hit max_inner. Lower eps, raise "
                "max_inner or lower sbar."
            )
        elif status == "max_iterations" and not self.proximal:
            message = f"Algorithm 2 reached max_inner = {opts.max_inner} before (19) held"
        elif status == "max_iterations":
            message = f"max_outer = {opts.max_outer} outer iterations reached without meeting (8)"
            if kkt.satisfied(opts.eps1, opts.eps2):
                message += ", although the KKT certificate already holds"
            message += _growth_note(self.w_norms, history)
            if summary["max_violation"] > opts.eps2 and len(self.mu_norms) >= 2:
                message += (
                    f"; the max violation is still {summary['max_violation']:.3g} while the "
                    "multipliers keep growing, so the model may be infeasible"
                )
        return status, message

    def objective_at(self, runtime: Runtime, x: np.ndarray) -> tuple[float, float]:
        """``(f + h, max violation)`` at the server's view ``x``: one diagnostic round, each
        party on its own data (the unbounded monitor's evidence)."""
        ns = self.ns
        mine = party_evaluation(self.program, x, self.mu, self.nu, self.owned, self.cone_duals())
        reports = [mine, *self.evaluations(runtime, x[:ns]).values()]
        objective = sum(float(r["objective"]) for r in reports)
        objective += self.problem.regularizer.value(x[:ns])
        violation = max(float(r["violation"]) for r in reports)
        violation = max(violation, self.problem.regularizer.box_violation(x[:ns]))
        return objective, violation

    def blow_up(self, runtime: Runtime, k: int, w_new: np.ndarray) -> StepReport:
        """Monitor: the inner solve returned a non-finite point or one beyond
        ``divergence_limit``. "unbounded" only with evidence: the point is finite, its
        objective ``f + h`` lies more than :data:`UNBOUNDED_DROP` ``* max(u, |f(w^k)|)``
        (``u`` the objective's unit, :attr:`objective_unit`)
        below the last iterate's, and its violation is no larger than the last iterate's
        (or ``eps2``) -- the model then has feasible points far below the last iterate, as
        an unbounded model does. Otherwise (an inner solver that blew up on a model whose
        objective would grow, such as a KL divergence or a 1-norm) status "stalled" with
        the measured numbers; the last finite iterate is returned either way."""
        size = float(np.abs(w_new).max()) if np.all(np.isfinite(w_new)) else float("inf")
        f_new = v_new = float("nan")
        if np.isfinite(size):
            f_old, v_old = self.objective_at(runtime, self.x)
            f_new, v_new = self.objective_at(runtime, w_new)
            dropped = f_old - f_new > UNBOUNDED_DROP * max(self.objective_unit, abs(f_old))
            feasible = v_new <= max(v_old, self.options.eps2)
            if np.isfinite(f_new) and dropped and feasible:
                return StepReport(
                    stop="unbounded",
                    message=(
                        f"the iterates diverge (||w||_inf = {size:.3g} at outer iteration {k}) "
                        f"along a direction where f + h falls from {f_old:.6g} to {f_new:.3g} "
                        f"with violation {v_new:.2e} (last iterate: {v_old:.2e}); the model is "
                        "likely unbounded below. The last finite iterate is returned."
                    ),
                )
        if np.isfinite(size):
            measured = (
                f"objective there {f_new:.3g}, violation {v_new:.3g}: the objective does not "
                "fall along it as it would on an unbounded model"
            )
        else:
            measured = "a non-finite point says nothing about the model"
        return StepReport(
            stop="stalled",
            message=(
                f"the inner solve at outer iteration {k} returned ||w||_inf = {size:.3g} "
                f"(the last iterate had ||w||_inf = {np.abs(self.x).max(initial=0.0):.3g}; "
                f"{measured}): a numerical failure of the inner solver, not evidence that "
                "the model is unbounded. The last finite iterate is returned; try "
                "inner_solver='admm'/'newton', a starting point w0 inside the domain of the "
                "terms (log, kl_div, entr), a smaller beta, or method='centralized'."
            ),
        )

    def diverging(self) -> str:
        """Monitor (adaptive variant): a message when the constraints cannot be met
        (:func:`fedmodel.algorithms.common.multiplier_plateau` of the multiplier steps since
        beta last changed)."""
        message = multiplier_plateau(
            self.dmu_history[self.plateau_from :], self.beta, self.options.eps2
        )
        if message and self.penalty_raises:
            message += (
                f" (beta was raised {len(self.penalty_raises)} times at earlier plateaus, "
                f"after outer iterations {', '.join(map(str, self.penalty_raises))})"
            )
        return message

    def multipliers_slow(self) -> bool:
        """Whether the multiplier steps (beta times the violation) have not halved over the
        last :data:`PENALTY_WINDOW` outer iterations since beta last changed, above
        ``beta eps2``."""
        h, n = self.dmu_history[self.plateau_from :], PENALTY_WINDOW
        if len(h) <= n:
            return False
        return h[-1] > self.beta * self.options.eps2 and h[-1] > 0.5 * h[-1 - n]

    def may_raise_penalty(self) -> bool:
        """Whether crawling multipliers raise beta (:meth:`raise_penalty`), and a plateau
        does not end the run: the adaptive variant with beta at its default (a beta the user set
        is kept), on a convex model, with an inner solver that runs in the objective's
        units (its ``units`` round restarts it in the new beta; Algorithm 2 and exact-admm
        keep the user's units), fewer than :data:`PENALTY_RAISES` raises so far."""
        opts = self.options
        return (
            opts.adaptive
            and self.convex
            and self.inner.objective_units
            and "beta" in getattr(opts, "_defaulted", ())
            and len(self.penalty_raises) < PENALTY_RAISES
        )

    def raise_penalty(self, runtime: Runtime) -> None:
        """Raise beta tenfold (:data:`PENALTY_RAISE`) where the multipliers crawl (a plateau,
        or :meth:`multipliers_slow`) and restart the inner solver at the iterate in one
        ``units`` round: the multipliers move by ``beta`` times the violation each outer
        iteration, so where they have far to go (an objective large next to its
        constraints' rows) the violation falls slowly or seems to settle. Raising the
        penalty of a feasible convex model keeps Algorithm 1 the proximal method of
        multipliers, whose penalties may grow (Rockafellar 1976); an infeasible model
        reaches the plateau again, and the monitor's verdict then comes after
        :data:`PENALTY_RAISES` raises. The outer Anderson memory restarts (the map
        changed)."""
        units = list(self.objective_units)
        units[1] *= PENALTY_RAISE
        self.objective_units = tuple(units)
        self.penalty_raises.append(self.k)
        self.plateau_from = len(self.dmu_history)
        self.derive_parameters()
        self.use_route(type(self.inner))
        if self.outer_aa is not None:
            self.outer_aa = AndersonState(self.outer_aa.memory)
            self.outer_mem.clear()
        self.inner.take_start(self.units_round(runtime))

    def update_multipliers(self, w: np.ndarray) -> float:
        """mu_0^{k+1} = [mu_0^k + beta c_0(w^{k+1})]_+ (and nu_0 += beta a_0); returns the
        infinity-norm change."""
        ci, ce = self.problem.functions[0].constraint_values(w)
        # exact-admm: the epigraph pieces' multipliers are the exact steps' duals (kept)
        hard_i, hard_e = self.inner.hard_rows()
        change = 0.0
        if ci.size:
            new = np.where(hard_i, self.mu, np.maximum(self.mu + self.beta * ci, 0.0))
            change = float(np.abs(new - self.mu).max())
            self.mu = new
        if ce.size:
            step = np.where(hard_e, 0.0, self.beta * ce)
            change = max(change, float(np.abs(step).max()))
            self.nu = self.nu + step
        return change


def feasibility_met(
    feasibility: tuple[float, float], kkt_factors: tuple[float, float], eps1: float, eps2: float
) -> bool:
    """Test (8)'s feasibility half on the measured ``feasibility = (violation,
    complementarity)``: the violation within ``kkt_factors[1] * eps2``, the complementarity
    within ``kkt_factors[0] * eps1`` (``eps1`` in the targets' unit).

    Examples
    --------
    >>> feasibility_met((4e-7, 0.0), (0.5, 0.5), 1e-6, 1e-6)
    True
    >>> feasibility_met((4e-7, 6e-7), (0.5, 0.5), 1e-6, 1e-6)
    False
    """
    violation, complementarity = feasibility
    f1, f2 = kkt_factors
    return violation <= f2 * eps2 and complementarity <= f1 * eps1


def _growth_note(w_norms: list[float], history: list[dict]) -> str:
    """Say so when the iterates grow steadily while the objective falls (unboundedness)."""
    half = w_norms[len(w_norms) // 2 :]
    if len(half) < 3 or half[0] <= 0:
        return ""
    # (mostly growing: accelerated iterations need not grow at every step)
    ups = sum(b > a for a, b in zip(half, half[1:]))
    growing = ups >= 0.6 * (len(half) - 1) and half[-1] >= 1.5 * half[0]
    # (falling over the second half: accelerated iterations need not fall at every step)
    falling = len(history) >= 3 and history[-1]["objective"] < min(
        row["objective"] for row in history[len(history) // 2 : -1]
    )
    if growing and (falling or not history):
        return (
            f"; ||w||_inf grew steadily from {half[0]:.3g} to {half[-1]:.3g} while the "
            "objective kept falling, so the model may be unbounded below"
        )
    return ""


def _client_factories(
    compiled: CompiledModel, options: ProxALOptions, rhos, proximal, route, x0: np.ndarray
):
    """Each client half, built where it runs from its own program and the options (those
    that travel: no callback); ``x0`` is the starting point (a client takes its own block)."""
    layout, metric = compiled.layout, penalty_metric(compiled, options)
    client_options = options.for_clients(w0=None, random_state=None)  # (theta0 below)
    n, owned, name = compiled.n_clients, layout.has_owned, route.name
    return {
        c.name: EndpointFactory(
            ProxALClient,
            (c, client_options, rhos[c.name], n, proximal),
            {
                # the client's own block of the starting point (its own variables)
                "theta0": x0[layout.indices(layout.owned_by(c.name))] if owned else None,
                "metric": metric,
                "route": name,
            },
        )
        for c in compiled.clients
    }


def run_prox_al(
    compiled: CompiledModel,
    options: ProxALOptions,
    method: str = "prox-al",
    *,
    faults: dict | None = None,
):
    """Run prox-al (``method="prox-al"``) or plain Algorithm 2 (``method="admm"``) through
    the driver (:func:`~fedmodel.algorithms.driver.run_federated`).

    The route comes from :func:`~fedmodel.algorithms.proxal.routes.choose` and its defaults
    are applied before the halves are built. The clients run on ``options.backend``;
    ``faults`` (client name -> :class:`~fedmodel.runtime.faults.Fault`) injects failures,
    for tests.
    """
    proximal = method == "prox-al"
    names = [c.name for c in compiled.clients]
    route, note = choose(compiled, options, proximal)
    apply_defaults(route, options)
    other = fallback(route, compiled, options, proximal)
    tables = {r.name: route_table(r, compiled, options, proximal) for r in (route, other)}
    rhos = options.rho_per_client(names)
    x0 = starting_point(compiled, options.w0, options.random_state)
    # the parties whose constraints (or, the server's, h's box or ball) restrict their points
    domain = any(piece.has_box or piece.has_ball for piece in compiled.regularizer.pieces)
    restricting = sum(
        any(not c.internal for c in p.constraints) or (domain and p is compiled.server)
        for p in compiled.parties
    )
    server = ProxALServer(
        compiled.server,
        compiled.regularizer,
        rhos,
        compiled.n_clients,
        options,
        proximal,
        x0,
        conic=bool(compiled.conic_parties()),
        metric=penalty_metric(compiled, options),
        route=route,
        inner_note=note,
        fallback=other,
        user_constraints=not conic_prox.HARD_CONSTRAINTS
        and any(
            c.kind != "cone" and not c.internal for p in compiled.parties for c in p.constraints
        ),
        may_be_infeasible=restricting > 0,
        consensus_may_fail=restricting > 1,
        tables=tables,
        convex=not compiled.nonconvex,
    )
    factories = _client_factories(compiled, options, rhos, proximal, route, x0)
    return run_federated(compiled, options, method, server, factories, faults=faults)


def _refusals(replies) -> str:
    """Why clients refused a ``start`` (their ``why``, named), "" when none did: read from
    the stacked ``accepted`` column when the round was one stacked step."""
    stacked = getattr(replies, "stacked", None)
    if stacked is not None and ("accepted" not in stacked or np.all(stacked["accepted"])):
        return ""
    return "; ".join(
        f"client '{n}': {r.payload['why']}"
        for n, r in replies.items()
        if not r.payload.get("accepted", True)
    )
