"""prox-al: seed 000 Algorithm 1 (proximal AL, outer loop) with Algorithm 2 (inexact ADMM)
as the federated subproblem solver; also ``admm`` (Algorithm 2 alone).

The server half below holds only the server's program (``c_0``, server data, ``h``) and
``mu_0``; it reaches clients only through the runtime's messages (see
:mod:`fedmodel.algorithms.proxal.client` for the message table). Per outer iteration k:

1. tau_k = sbar / (k + 1)^2;
2. Algorithm 2 from w~^0 = w^k: for t = 0, 1, ... the server solves (14) to eps_{t+1} =
   q^t, broadcasts w^{t+1}; clients solve (15) and return (u~_i, eps~_i); stop on (19):
   eps_{t+1} + sum_i eps~_i <= tau_k (the server's measured residual replaces eps_{t+1}
   if it is larger);
3. mu_0 update on the server; w^{k+1} broadcast; clients update mu_i and return
   ||mu_i^{k+1} - mu_i^k||_inf (with the next ADMM initialisation u~_i^0);
4. stop on (8): ||w^{k+1} - w^k||_inf + beta tau_k <= beta eps1 and
   max_i ||mu_i^{k+1} - mu_i^k||_inf <= beta eps2 (with the Newton inner solver, the
   first half on the measured Lagrangian gradient, which it bounds; see ``test8``).

With ``inner_solver="quasi-newton"`` (the adaptive default on smooth models) or the
opt-in ``"newton"`` step 2 is a federated (quasi-)Newton method on l_k
(:mod:`fedmodel.algorithms.proxal.newton_inner`) in place of Algorithm 2: each round the
clients return P_{i,k}'s value and gradient (Newton: and Hessian) at the broadcast point,
and the inner loop stops when the measured ||grad l_k||_inf <= tau_k.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from scipy.linalg import cho_factor

from fedmodel.algorithms.common import starting_point
from fedmodel.algorithms.driver import run_federated
from fedmodel.algorithms.protocol import ServerHalf, StepReport
from fedmodel.algorithms.proxal.anderson import AndersonState
from fedmodel.algorithms.proxal.client import ProxALClient
from fedmodel.algorithms.proxal.messages import PROXAL
from fedmodel.algorithms.proxal.newton_inner import SecantModel, federated_newton
from fedmodel.algorithms.proxal.options import EXACT_TOL, ProxALOptions
from fedmodel.certificate.kkt import party_evaluation
from fedmodel.compiler.glm import NotRecognised
from fedmodel.compiler.partition import CompiledModel, PartyProgram
from fedmodel.compiler.regularizer import Regularizer
from fedmodel.errors import ModelError
from fedmodel.runtime.base import Runtime
from fedmodel.runtime.endpoints import EndpointFactory
from fedmodel.subproblems.merit import MeritProblem
from fedmodel.subproblems.newton import solve_upper
from fedmodel.subproblems.select import make_solver

#: outer iterations of a plateau of max ||mu^(k+1) - mu^k|| before "diverging"
DIVERGENCE_WINDOW = 10
#: "unbounded" needs the objective at the blown-up point this many times max(1, |f|)
#: below the last iterate's (see ProxALServer.blow_up)
UNBOUNDED_DROP = 10.0
#: inner_solver="auto" picks the quasi-Newton inner solver up to this many shared
#: variables (the server keeps and factors a d x d model: 32 MB at d = 2000)
NEWTON_MAX_SHARED = 2000
#: the inner solvers that run the Newton loop (newton_inner.federated_newton)
NEWTON_MODES = ("newton", "quasi-newton")
#: quasi-Newton: rejected trial points at one iterate that give a new direction from the
#: updated secant model before the line search backtracks along the last one
QN_REMODEL = 2


@dataclass
class InnerOutcome:
    """Result of one inner solve (Algorithm 2, or Newton with its measured gradient)."""

    w: np.ndarray
    iterations: int
    bound: float  # eps_{t+1} + sum_i eps~_i: bounds dist_inf(0, d l_k(w)) (Theorem 4.1)
    satisfied: bool
    server_residual: float
    timed_out: bool = False
    stalled: bool = False
    gradient: np.ndarray | None = None  # grad l_k(w), measured (Newton)


class ProxALServer(ServerHalf):
    """Server half of prox-al / admm: aggregation, ``c_0`` with ``mu_0``, ``h``, stopping.

    Its state (``get_state``) is the iterate ``w^k``, the clients' last ADMM messages
    ``u~_i``, ``mu_0``/``nu_0`` and counters; one :meth:`step` is one outer iteration
    (Algorithm 2 to tau_k, then the multiplier round), or the single run of Algorithm 2
    for ``admm``.

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
    inner_solver : {"admm", "quasi-newton", "newton"}
        The inner solver chosen by :func:`inner_solver` (Algorithm 2 when a party turns
        out not to support it), and ``inner_note`` why not (quasi-)Newton.
    """

    messages = PROXAL
    # options whose change alters the iterates: a checkpoint resumes only with the same values
    resume_options = (
        "eps", "beta", "sbar", "rho", "q", "mu0", "max_inner", "max_local_iter",
        "local_floor", "solver", "divergence_limit", "variant", "tau_rate", "kkt_factor",
        "adaptive_rho", "rb_ratio", "rb_factor", "rb_rounds", "relaxation", "monitor", "anderson",
        "outer_anderson", "prox_beta", "penalty_metric", "metric_floor", "metric_refresh",
        "local_cap", "inner_solver",
        "stall_rounds", "exact_subproblems",
    )  # fmt: skip
    step_name = "outer iteration"

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
        inner_solver: str = "admm",
        inner_note: str = "",
    ):
        layout = program.layout
        owned_anywhere = layout.has_owned  # (the model's layout: any party's own variables)
        # where the server's view (shared variables, then its own) sits in the model's x
        self.view_index = layout.indices(layout.local(program.name).variables)
        program = program.local()
        super().__init__(program, options)
        self.ns = program.layout.n_shared
        self.owned = program.layout.size > self.ns
        self.beta = float(options.beta)
        # test (8)'s internal targets, kkt_factor * (eps1, eps2); eps itself when any party has cone
        # constraints (``conic``): their interior-point subproblems are accurate to ~1e-9, so a
        # target below eps only exhausts max_inner; the certificate checks eps in any case
        self.kkt_factors = (1.0, 1.0) if conic else options.kkt_factors
        self.initial_rhos = dict(rhos)
        # the clients' metrics M_i of their ADMM penalties rho_i M_i (the identity unless
        # penalty_metric="hessian"; sent with every (re)start of Algorithm 2)
        self.metric = metric
        self.metrics: dict[str, np.ndarray] = {}
        self.proximal = proximal
        self.max_steps = options.max_outer if proximal else 1
        self.gamma = float(options.prox_beta) if options.prox_beta is not None else self.beta
        self.prox_weight = 1.0 / ((n_clients + 1) * self.gamma) if proximal else 0.0
        self.n_own = program.layout.size - self.ns
        self.set_rhos(rhos)
        self.problem = MeritProblem([program], self.beta, regularizer)
        self.solver = make_solver(self.problem, options.solver)
        self.mu = np.full(program.m_ineq, float(options.mu0))
        self.nu = np.zeros(program.m_eq)
        self.x = None if x0 is None else np.asarray(x0, dtype=float)[self.view_index]
        self.u_tildes: dict[str, np.ndarray] = {}
        self.k = -1
        self.inner_total = 0
        self.mu_norms: list[float] = []
        self.w_norms: list[float] = []
        self.dmu_history: list[float] = []
        # Anderson acceleration memory (0: off); not with party-owned variables, whose
        # own blocks are part of the iteration's state but never travel
        self.anderson = 0 if owned_anywhere else int(options.anderson)
        self.aa_rejections = 0
        # outer Anderson acceleration (None: off) and its memory (residual, w, mu_0, nu_0)
        m_out = 0 if (owned_anywhere or not proximal) else int(options.outer_anderson)
        self.outer_aa = AndersonState(m_out) if m_out else None
        self.outer_mem: list[tuple] = []
        # the inner solver: Algorithm 2 ("admm") or federated Newton ("newton"; the
        # clients' Hessians as last sent, their sum, and the sums of their values and
        # gradients at w^k from the round that starts the next inner solve)
        self.inner_mode = inner_solver
        self.inner_note = inner_note  # why not Newton (res.extra["inner_solver_note"])
        if inner_solver in NEWTON_MODES and not (
            hasattr(self.solver, "derivatives") or not self.problem.has_smooth_terms
        ):
            self.inner_mode = "admm"
            self.inner_note = (
                f"the server's subproblem backend ({self.solver.name}) has no Hessians"
            )
        # quasi-Newton: the server's secant model of the clients' summed Hessian
        self.secant = SecantModel(self.ns) if inner_solver == "quasi-newton" else None
        self.client_hessians: dict[str, np.ndarray] = {}
        self.hessian_sum: np.ndarray | None = None
        self.start_derivatives: tuple[float, np.ndarray] | None = None
        self._no_terms_hessian: np.ndarray | None = None  # (a server without terms)
        self._total_hessian = None  # (hessian_sum, server part, l_k's Hessian)

    # -- the protocol ------------------------------------------------------------------------
    def start(self, runtime: Runtime) -> None:
        if self.inner_mode in NEWTON_MODES:
            try:  # (the first call cross-checks the server's GLM form)
                self.own_derivatives(self.x, self.x)
            except NotRecognised as exc:
                self.inner_mode, self.inner_note = "admm", f"the server: {exc}"
        if self.inner_mode in NEWTON_MODES:
            runtime.next_round()
            replies = runtime.broadcast("start", {"w": self.x[: self.ns], **self.inner_payload()})
            why = [
                f"client '{n}': {r.payload['why']}"
                for n, r in replies.items()
                if not r.payload["newton"]
            ]
            if not why:
                self.take_starts(replies)
                return
            # a client cannot: Algorithm 2 for the whole run (one more round)
            self.inner_mode, self.inner_note = "admm", "; ".join(why)
        runtime.next_round()
        replies = runtime.broadcast("start", {"w": self.x[: self.ns]})
        self.take_starts(replies)

    def inner_payload(self) -> dict:
        """What the messages that start an inner solve add for the inner solver."""
        return {"inner": self.inner_mode} if self.inner_mode in NEWTON_MODES else {}

    def take_starts(self, replies) -> None:
        """The clients' replies to a (re)start of the inner solver: with Algorithm 2,
        ``u~_i^0`` and, with the Hessian metric, their ``M_i`` (a client without exact
        Hessians keeps the identity); with (quasi-)Newton, their derivatives at ``w^k``."""
        if self.inner_mode in NEWTON_MODES:
            self.start_derivatives = self.take_derivatives(replies)
            return
        self.u_tildes = {name: r.payload["u_tilde"] for name, r in replies.items()}
        self.take_metrics(replies)

    def take_metrics(self, replies) -> bool:
        """Take the metrics ``M_i`` some replies carry (a client sends its metric only when
        it changed); True when one did (the server step's quadratic changes)."""
        new = {
            name: np.asarray(r.payload["metric"], dtype=float)
            for name, r in replies.items()
            if r.payload.get("metric") is not None
        }
        if new:
            self.metrics = {**self.metrics, **new}
            self.set_rhos(self.rhos)
        return bool(new)

    def tau(self, k: int) -> float:
        """Inner tolerance of outer iteration ``k``: ``sbar/(k+1)^2`` (paper), or
        ``max(sbar tau_rate^k, kkt_factor eps1 / 2)`` (adaptive)."""
        opts = self.options
        if not self.proximal:
            return opts.eps1
        if opts.adaptive:
            return max(opts.sbar * opts.tau_rate**k, 0.5 * self.kkt_factors[0] * opts.eps1)
        return opts.sbar / (k + 1) ** 2

    def step(self, runtime: Runtime, deadline: float | None) -> StepReport:
        opts = self.options
        self.k = k = self.k + 1
        tau = self.tau(k)
        if self.inner_mode in NEWTON_MODES:
            outcome = self.inner_newton(runtime, tau, deadline)
        else:
            outcome = self.inner(runtime, self.x, self.u_tildes, tau, deadline)
        self.inner_total += outcome.iterations
        w_new = outcome.w
        if not np.all(np.isfinite(w_new)) or np.abs(w_new).max() > opts.divergence_limit:
            return self.blow_up(runtime, k, w_new)
        if outcome.stalled:
            self.x = w_new
            if self.inner_mode in NEWTON_MODES:
                why = (
                    f"the federated {self.inner_mode} inner solver stalled at outer iteration {k}: its "
                    f"line search found no decrease of l_k (||grad l_k||_inf = "
                    f"{outcome.bound:.3g}, target tau_k = {tau:.3g}); the values are probably "
                    "at rounding level. Try inner_solver='admm' or a larger eps."
                )
            else:
                why = (
                    f"the inner ADMM (Algorithm 2) stalled at outer iteration {k}: its bound "
                    f"(19) improved by less than 10% over the last {opts.stall_rounds} rounds "
                    f"(now {outcome.bound:.3g}, target tau_k = {tau:.3g}). The subproblem's "
                    "consensus does not converge at this penalty: try a smaller beta, another "
                    "rho, or monitor=False to keep going."
                )
            return StepReport(
                info={"inner_iterations": outcome.iterations, "inner_bound": outcome.bound},
                stop="stalled",
                message=why,
            )
        dw = self.outer_change(w_new, self.x)
        # Newton measured grad l_k(w^{k+1}) = grad_w L(w^{k+1}, mu^{k+1}) + (w^{k+1} - w^k) /
        # prox_beta (the multiplier update is the AL terms' gradient weight): the Lagrangian's
        # stationarity itself, which (8) bounds by tau_k + ||w^{k+1} - w^k|| / prox_beta
        stationarity = None
        if outcome.gradient is not None and self.proximal and not self.owned:
            stationarity = float(np.abs(outcome.gradient - (w_new - self.x) / self.gamma).max())
        w_old, self.x = self.x, w_new
        dmu = 0.0
        if self.proximal:
            mu_in, nu_in = self.mu.copy(), self.nu.copy()
            dmu = self.update_multipliers(self.x)
            runtime.next_round()
            replies = runtime.broadcast("outer", {"w": self.x[: self.ns], **self.inner_payload()})
            dmu = max([dmu] + [float(r.payload["dmu_inf"]) for r in replies.values()])
            # test (8) on the clients' own blocks (one scalar each, see the client module)
            dw = max([dw] + [float(r.payload.get("dtheta_scaled", 0.0)) for r in replies.values()])
            self.take_starts(replies)
            if self.outer_aa is not None and not self.test8(dw, dmu, tau, stationarity):
                self.accelerate_outer(runtime, w_old, mu_in, nu_in, replies)
        self.mu_norms.append(float(np.abs(self.mu).max(initial=0.0)))
        self.w_norms.append(float(np.abs(self.x).max(initial=0.0)))
        self.dmu_history.append(dmu)
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
        if diverging:
            report.stop, report.message = "diverging", diverging
        elif not self.proximal:  # admm: one run of Algorithm 2 to tau = eps1
            report.stop = "stopped" if outcome.satisfied else "max_iterations"
        elif self.test8(dw, dmu, tau, stationarity):
            report.stop = "stopped"  # (8) holds; the certificate decides "optimal"
        if stationarity is not None:
            report.info["stationarity_measured"] = stationarity
        return report

    def test8(self, dw: float, dmu: float, tau: float, stationarity: float | None = None) -> bool:
        """Stopping test (8), at ``kkt_factor * (eps1, eps2)`` (1 in the paper variant); its
        stationarity half ``dw / beta + tau_k`` (a bound) replaced by the Lagrangian's
        stationarity itself when the inner solver measured it (``stationarity``)."""
        opts = self.options
        f1, f2 = self.kkt_factors
        if stationarity is None:
            stationary = dw + opts.beta * tau <= opts.beta * f1 * opts.eps1
        else:
            stationary = stationarity <= f1 * opts.eps1
        return stationary and dmu <= opts.beta * f2 * opts.eps2

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
        row = row + sum(np.asarray(rep.payload["gram"], dtype=float) for rep in replies.values())
        alpha, reset = self.outer_aa.observe(row)
        if alpha.size:
            picked = mem[-alpha.size :]
            self.x = sum(a * q[1] for a, q in zip(alpha, picked))
            self.mu = np.maximum(sum(a * q[2] for a, q in zip(alpha, picked)), 0.0)
            self.nu = sum(a * q[3] for a, q in zip(alpha, picked))
        if reset:
            mem.clear()
        if alpha.size or reset:
            runtime.next_round()
            out = runtime.broadcast(
                "outer_aa",
                {"w": self.x[: self.ns], "alpha": alpha, "reset": reset, **self.inner_payload()},
            )
            self.take_starts(out)

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

    def get_state(self) -> dict:
        """The server half's own state: iterate, the clients' last ``u~_i``, ``mu_0``,
        ``nu_0`` and counters."""
        return {
            "x": self.x.copy(),
            "u_tildes": dict(self.u_tildes),
            "k": self.k,
            "mu": self.mu.copy(),
            "nu": self.nu.copy(),
            "local_iterations": self.local_iterations,
            "inner_total": self.inner_total,
            "mu_norms": list(self.mu_norms),
            "w_norms": list(self.w_norms),
            "cone": self.problem.cone[0].copy(),
            "rhos": dict(self.rhos),
            "metrics": dict(self.metrics),
            "dmu_history": list(self.dmu_history),
            "aa_rejections": self.aa_rejections,
            "outer_aa": None if self.outer_aa is None else dict(vars(self.outer_aa)),
            "outer_mem": list(self.outer_mem),
            "inner_mode": self.inner_mode,
            "inner_note": self.inner_note,
            "client_hessians": dict(self.client_hessians),
            "start_derivatives": self.start_derivatives,
            "secant": None if self.secant is None else self.secant.get_state(),
        }

    def set_state(self, state: dict) -> None:
        self.x = np.array(state["x"], dtype=float)
        self.u_tildes = dict(state["u_tildes"])
        self.k = int(state["k"])
        self.mu = np.array(state["mu"], dtype=float)
        self.nu = np.array(state["nu"], dtype=float)
        self.local_iterations = int(state["local_iterations"])
        self.inner_total = int(state["inner_total"])
        self.mu_norms = list(state["mu_norms"])
        self.w_norms = list(state["w_norms"])
        if "cone" in state:
            self.problem.cone[0] = np.array(state["cone"], dtype=float)
        self.metrics = dict(state.get("metrics", {}))
        self.set_rhos(state["rhos"])
        self.dmu_history = list(state["dmu_history"])
        self.aa_rejections = int(state["aa_rejections"])
        if self.outer_aa is not None:
            vars(self.outer_aa).update(state["outer_aa"])
        self.outer_mem = list(state["outer_mem"])
        self.inner_mode = state.get("inner_mode", self.inner_mode)
        self.inner_note = state.get("inner_note", "")
        self.client_hessians = dict(state.get("client_hessians", {}))
        self.hessian_sum = sum(self.client_hessians.values()) if self.client_hessians else None
        self.start_derivatives = state.get("start_derivatives")
        if self.secant is not None and state.get("secant") is not None:
            self.secant.set_state(state["secant"])

    def resume_key(self) -> dict:
        key = super().resume_key()
        key["rho"] = dict(self.initial_rhos)
        return key

    def extra(self, reports: dict[str, dict]) -> dict:
        """The adaptive variant's final state: each client's rho_i (residual balancing)
        and how many accelerated inputs the safeguards rejected."""
        out = {
            "variant": self.options.variant,
            "rho": dict(self.rhos),
            "penalty_metric": self.metric,
            "inner_solver": self.inner_mode,
        }
        if self.inner_note:
            out["inner_solver_note"] = self.inner_note
        if self.anderson:
            out["anderson_rejections"] = self.aa_rejections
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

    # -- Algorithm 2 and the multiplier update -----------------------------------------------
    def inner(
        self,
        runtime: Runtime,
        w_center: np.ndarray,
        u_tildes: dict[str, np.ndarray],
        tau: float,
        deadline: float | None = None,
    ) -> InnerOutcome:
        """Algorithm 2 on P_{0,k} + h + sum_i P_{i,k}, started from w~^0 = ``w_center``.

        ``w_center`` and the returned ``w`` are the server's view: the shared variables,
        then its own block ``theta_0`` (kept here with its share ``p`` of Algorithm 1's
        proximal term and a proximal-ADMM term of weight ``sum_i rho_i``; see the client
        module); only the shared part is broadcast.
        """
        opts = self.options
        ns = self.ns
        w = w_center
        bound = np.inf
        residual = np.inf
        floor = opts.local_floor * tau
        window = int(opts.stall_rounds) if opts.monitor else 0
        best, best_at_window = np.inf, np.inf
        aa = AndersonState(self.anderson) if self.anderson else None
        alpha, reset = np.zeros(0), False
        outputs: dict[str, list[np.ndarray]] = {name: [] for name in u_tildes}
        rejected = 0
        for t in range(opts.max_inner):
            eps = opts.q**t
            # local solves stop at tol; (19) stays a valid bound. local_cap (adaptive): never
            # looser than local_cap * tau_k (a local solve's error enters eps~_i, so the
            # paper's q^t alone holds (19) back for log(tau_k)/log(q) rounds)
            cap = opts.local_cap if opts.adaptive else 0.0
            tol = max(min(eps, cap * tau) if cap > 0 else eps, floor)
            if opts.exact_subproblems:  # (14)-(15) solved exactly (seed 000 Section 5.1)
                tol = EXACT_TOL
            agg = sum(self.penalty(name, u) for name, u in u_tildes.items())
            center = self.center_of(self.prox_weight * w_center[:ns] + agg)
            if self.owned:
                sigma_theta = self.prox_weight + self.rho_sum
                theta_c = (self.prox_weight * w_center[ns:] + self.rho_sum * w[ns:]) / sigma_theta
                center = np.concatenate([center, theta_c])
            self.problem.set(sigma=self.sigma, center=center, mu=[self.mu], nu=[self.nu])
            report = self.solver.solve(w, tol, opts.max_local_iter)  # server step (14)
            self.local_iterations += report.iterations
            residual = report.residual
            if self.owned:  # the proximal-ADMM term on theta_0 is not part of l_k
                residual += self.rho_sum * float(np.abs(report.x[ns:] - w[ns:]).max())
            w = report.x
            runtime.next_round()
            payload = {"w": w[:ns], "tol": tol}
            if aa is not None:  # this round's input: alpha over the last outputs
                payload.update(alpha=alpha, reset=reset)
            replies = runtime.broadcast("admm_w", payload)
            u_tildes = {name: r.payload["u_tilde"] for name, r in replies.items()}
            changed = False
            if opts.adaptive_rho:  # residual balancing: the clients' new rho_i (public)
                new = {name: float(r.payload["rho"]) for name, r in replies.items()}
                changed = new != self.rhos
                if changed:
                    self.set_rhos(new)
            if self.take_metrics(replies):  # refreshed Hessian metrics (penalty_metric)
                changed = True
            if aa is not None:
                row = sum(np.asarray(r.payload["gram"], dtype=float) for r in replies.values())
                alpha, reset = aa.observe(row, changed)
                u_tildes = _combine(outputs, u_tildes, alpha, reset, self.anderson + 1)
                self.aa_rejections += aa.rejections - rejected
                rejected = aa.rejections
            # (19) with the server's measured residual (adaptive) or its tolerance eps_{t+1}
            # when that is larger (the paper); both bound dist(0, d l_k) (Theorem 4.1's proof)
            # (and the measured residual when the subproblems are solved exactly)
            exact = opts.adaptive or opts.exact_subproblems
            server_part = residual if exact else max(eps, residual)
            bound = server_part + sum(float(r.payload["eps_tilde"]) for r in replies.values())
            if bound <= tau:  # (19)
                return InnerOutcome(w, t + 1, bound, True, residual)
            best = min(best, bound)
            if window and (t + 1) % window == 0:  # monitor: progress over the last window
                if not np.isfinite(best) or best > 0.9 * best_at_window:
                    return InnerOutcome(w, t + 1, bound, False, residual, stalled=True)
                best_at_window = best
            if deadline is not None and time.perf_counter() > deadline:
                return InnerOutcome(w, t + 1, bound, False, residual, timed_out=True)
        return InnerOutcome(w, opts.max_inner, bound, False, residual)

    def take_derivatives(self, replies) -> tuple[float, np.ndarray]:
        """The clients' ``P_{i,k}`` derivatives: keep the Hessians they sent (a client
        sends one only when it changed) and return the sums of their values and
        gradients."""
        new = {n: r.payload["hessian"] for n, r in replies.items() if "hessian" in r.payload}
        if new:
            self.client_hessians = {**self.client_hessians, **new}
            self.hessian_sum = sum(
                np.asarray(H, dtype=float) for H in self.client_hessians.values()
            )
        val = sum(float(r.payload["value"]) for r in replies.values())
        grad = sum(np.asarray(r.payload["grad"], dtype=float) for r in replies.values())
        return val, grad

    def own_derivatives(self, w: np.ndarray, w_center: np.ndarray):
        """Value, gradient and Hessian at ``w`` of ``l_k``'s server share: ``P_{0,k}`` (its
        terms with ``mu_0``, its share of the proximal term about ``w_center``) plus ``h``
        (smooth here); the Hessian returned is ``l_k``'s (the clients' last ones added),
        the same array while no part of it changed (the Newton loop reuses its factor)."""
        n = w.size
        if self.problem.has_smooth_terms:
            val, g, H0 = self.solver.derivatives(w, [self.mu], [self.nu])
        else:  # no server terms: h and the proximal share only
            val, g = 0.0, np.zeros(n)
            if self._no_terms_hessian is None:
                self._no_terms_hessian = np.zeros((n, n))
            H0 = self._no_terms_hessian
        reg = self.problem.regularizer
        if not reg.is_zero:  # (a sum of squares: smooth)
            val += reg.value(w)
            g = g + reg.smooth_grad(w)
        p = self.prox_weight
        d = w - w_center
        cached = self._total_hessian
        if cached is None or cached[0] is not self.hessian_sum or cached[1] is not H0:
            H = H0 + (0.0 if self.hessian_sum is None else self.hessian_sum)
            H[np.diag_indices(n)] += p + reg.smooth_grad(np.ones(n))
            cached = self._total_hessian = (self.hessian_sum, H0, H)
        return val + 0.5 * p * float(d @ d), g + p * d, cached[2]

    def inner_newton(self, runtime: Runtime, tau: float, deadline: float | None) -> InnerOutcome:
        """Step 2 with ``inner_solver="newton"`` or ``"quasi-newton"``: federated
        (semismooth, or quasi-) Newton on ``l_k`` from ``w^k``, whose client derivatives
        came with the round that set up ``l_k`` (``start``, ``outer`` or ``outer_aa``); one
        round per trial point. Quasi-Newton: the curvature is the server's
        :class:`~fedmodel.algorithms.proxal.newton_inner.SecantModel` of ``l_k`` less its
        constant diagonal (the proximal term and ``h``), updated from the gradients of
        consecutive rounds (clients send value and gradient only). The model covers the
        server's own terms too: their exact Hessian at an iterate where an
        augmented-Lagrangian term is inactive says nothing of the wall it meets along the
        step, which a secant pair across it does."""
        w_center = self.x
        if self.inner_mode == "quasi-newton":
            return self.inner_quasi_newton(runtime, tau, deadline)

        def evaluate(w):
            runtime.next_round()
            replies = runtime.broadcast("newton_w", {"w": w})
            val, grad = self.take_derivatives(replies)
            v0, g0, H = self.own_derivatives(w, w_center)
            return val + v0, grad + g0, H

        val, grad = self.start_derivatives
        v0, g0, H = self.own_derivatives(w_center, w_center)
        start = (w_center, val + v0, grad + g0, H)
        out = federated_newton(evaluate, start, tau, int(self.options.max_inner), deadline)
        return _inner_outcome(out)

    def inner_quasi_newton(self, runtime, tau: float, deadline: float | None) -> InnerOutcome:
        """:meth:`inner_newton` with the secant model (``inner_solver="quasi-newton"``)."""
        w_center, secant = self.x, self.secant
        n = w_center.size
        reg = self.problem.regularizer
        known = self.prox_weight + (0.0 if reg.is_zero else reg.smooth_grad(np.ones(n)))
        known = np.broadcast_to(np.asarray(known, dtype=float), (n,))
        model_of = {}  # B -> B + diag(known) (one matrix per model update)

        def curvature():
            B = secant.matrix
            if B is None:
                B = secant.initial(grad0)
            if model_of.get("B") is not B:
                H = np.array(B)
                H[np.diag_indices(n)] += known
                model_of.update(B=B, H=H)
            return model_of["H"]

        def derivatives(w, replies_sum):
            v0, g0, _ = self.own_derivatives(w, w_center)
            return replies_sum[0] + v0, replies_sum[1] + g0

        def evaluate(w):
            runtime.next_round()
            replies = runtime.broadcast("gradient_w", {"w": w})
            val, grad = derivatives(w, self.take_derivatives(replies))
            secant.observe(w, grad - known * w)  # (the pair of l_k less its known part)
            return val, grad, curvature()

        val0, grad0 = derivatives(w_center, self.start_derivatives)
        secant.restart(w_center, grad0 - known * w_center)  # (pairs only within one l_k)
        start = (w_center, val0, grad0, curvature())
        out = federated_newton(
            evaluate, start, tau, int(self.options.max_inner), deadline, remodel=QN_REMODEL
        )
        return _inner_outcome(out)

    def objective_at(self, runtime: Runtime, x: np.ndarray) -> tuple[float, float]:
        """``(f + h, max violation)`` at the server's view ``x``: one diagnostic round, each
        party on its own data (the unbounded monitor's evidence)."""
        ns = self.ns
        mine = party_evaluation(self.program, x, self.mu, self.nu, self.owned, self.cone_duals())
        replies = runtime.broadcast("evaluate", {"w": x[:ns]}, channel="diagnostic")
        reports = [mine] + [r.payload for r in replies.values()]
        objective = sum(float(r["objective"]) for r in reports)
        objective += self.problem.regularizer.value(x[:ns])
        violation = max(float(r["violation"]) for r in reports)
        violation = max(violation, self.problem.regularizer.box_violation(x[:ns]))
        return objective, violation

    def blow_up(self, runtime: Runtime, k: int, w_new: np.ndarray) -> StepReport:
        """Monitor: the inner solve returned a non-finite point or one beyond
        ``divergence_limit``. "unbounded" only with evidence: the point is finite, its
        objective ``f + h`` lies more than :data:`UNBOUNDED_DROP` ``* max(1, |f(w^k)|)``
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
            dropped = f_old - f_new > UNBOUNDED_DROP * max(1.0, abs(f_old))
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
        """Monitor (adaptive variant): a message when the constraints cannot be met.

        ``max_i ||mu_i^{k+1} - mu_i^k||_inf = beta * (violation of the active constraints)``.
        On an infeasible model the violation settles at a positive level and the
        multipliers grow by about that much every outer iteration; on a feasible one it
        keeps falling, if slowly. The verdict needs :data:`DIVERGENCE_WINDOW` outer
        iterations in which it neither halved nor varied by more than a factor 2 (a
        plateau, not the oscillation of a slowly converging run), above ``beta eps2``."""
        h, n = self.dmu_history, DIVERGENCE_WINDOW
        if len(h) < n + 1 or h[-1] <= self.beta * self.options.eps2:
            return ""
        window = h[-n:]
        if min(window) < 0.5 * h[-n - 1] or max(window) > 2.0 * min(window):
            return ""
        # a plateau still falling steadily (a slow but converging run) is no verdict
        if window[-1] < 0.8 * window[0]:
            return ""
        return (
            f"the multipliers diverge: ||mu^(k+1) - mu^k||_inf stayed above {min(h[-n:]):.3g} "
            f"over the last {n} outer iterations (a constraint violation of about "
            f"{h[-1] / self.beta:.3g} that the penalty beta = {self.beta:g} does not reduce); "
            "the model is likely infeasible"
        )

    def set_rhos(self, rhos: dict[str, float]) -> None:
        """The clients' current ADMM penalties (changed by residual balancing)."""
        self.rhos = dict(rhos)
        self.rho_sum = float(sum(self.rhos.values()))
        self._center_factor = None
        p = self.prox_weight
        if not self.metrics:  # the scalar penalty: sigma = p + sum_i rho_i
            self.sigma_shared = self.sigma = p + self.rho_sum
            return
        # the server step's quadratic: p I + sum_i rho_i M_i on the shared variables (the
        # identity for clients without a metric) and p + sum_i rho_i on its own block; new
        # objects only here, so the backends' factorisations keyed on them are reused
        S = np.zeros((self.ns, self.ns))
        for name, rho in self.rhos.items():
            M = self.metrics.get(name)
            if M is None:
                S[np.diag_indices(self.ns)] += rho
            else:
                S += rho * M
        S[np.diag_indices(self.ns)] += p
        self.sigma_shared = S
        self.sigma = S
        if self.owned:
            n = self.ns + self.n_own
            self.sigma = np.zeros((n, n))
            self.sigma[: self.ns, : self.ns] = S
            own = np.arange(self.ns, n)
            self.sigma[own, own] = p + self.rho_sum

    def penalty(self, name: str, v: np.ndarray) -> np.ndarray:
        """Client ``name``'s ADMM penalty applied to ``v``: ``rho_i M_i v``."""
        M = self.metrics.get(name)
        return self.rhos[name] * (v if M is None else M @ v)

    def center_of(self, b: np.ndarray) -> np.ndarray:
        """``(p I + sum_i rho_i M_i)^(-1) b``: the centre of the server step's quadratic
        (one factorisation per metric and penalties)."""
        S = self.sigma_shared
        if np.ndim(S) == 0:
            return b / S
        if self._center_factor is None:
            self._center_factor = cho_factor(S, lower=False, check_finite=False)[0]
        return solve_upper(self._center_factor, b)

    def update_multipliers(self, w: np.ndarray) -> float:
        """mu_0^{k+1} = [mu_0^k + beta c_0(w^{k+1})]_+ (and nu_0 += beta a_0); returns the
        infinity-norm change."""
        ci, ce = self.problem.functions[0].constraint_values(w)
        change = 0.0
        if ci.size:
            new = np.maximum(self.mu + self.beta * ci, 0.0)
            change = float(np.abs(new - self.mu).max())
            self.mu = new
        if ce.size:
            step = self.beta * ce
            change = max(change, float(np.abs(step).max()))
            self.nu = self.nu + step
        return change


def _inner_outcome(out) -> InnerOutcome:
    """An :class:`InnerOutcome` of the (quasi-)Newton loop's outcome (its bound is the
    measured ``||grad l_k||_inf``)."""
    return InnerOutcome(
        out.w, out.rounds, out.residual, out.satisfied, out.residual,
        timed_out=out.timed_out, stalled=out.stalled, gradient=out.gradient,
    )  # fmt: skip


def _combine(outputs, latest, alpha, reset, keep):
    """The server's half of Anderson acceleration: store each client's newest ``u~_i``
    and return the next input ``sum_j alpha_j u~_i^j`` (the newest when ``alpha`` is
    empty); ``reset`` clears the memory."""
    nxt = {}
    for name, u in latest.items():
        mem = outputs[name]
        mem.append(u)
        del mem[:-keep]
        nxt[name] = sum(a * v for a, v in zip(alpha, mem[-alpha.size :])) if alpha.size else u
        if reset:
            mem.clear()
    return nxt


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


def _balancing(options: ProxALOptions) -> tuple[float, float, int] | None:
    """Residual-balancing settings handed to the clients, or None (fixed rho)."""
    if not options.adaptive_rho:
        return None
    return (float(options.rb_ratio), float(options.rb_factor), int(options.rb_rounds))


def penalty_metric(compiled: CompiledModel, options: ProxALOptions) -> str:
    """The ADMM penalty metric in effect: ``options.penalty_metric``, or ``"scalar"`` when
    ``h`` is not smooth (its prox has no closed form under a full metric), the server's
    subproblem takes the cvxpy backend (cone constraints), or the model has non-convex terms
    (ADMM on a non-convex problem needs a penalty that dominates the negative curvature,
    which residual balancing of a scalar rho provides; with the Hessian metric Algorithm 2
    did not converge on seed 000 Table 3 with n = 10)."""
    if options.penalty_metric == "scalar" or not compiled.regularizer.is_smooth:
        return "scalar"
    if compiled.nonconvex:
        return "scalar"
    if compiled.server.cones or options.solver == "cvxpy":
        return "scalar"
    return str(options.penalty_metric)


def inner_solver(
    compiled: CompiledModel, options: ProxALOptions, proximal: bool
) -> tuple[str, str]:
    """The inner solver of each outer iteration and, when ``"auto"`` does not pick
    quasi-Newton, why: ``("quasi-newton", "")`` (``"auto"``) or the forced
    ``("newton", "")`` when the model allows a federated (quasi-)Newton method on ``l_k``
    (:mod:`~fedmodel.algorithms.proxal.newton_inner`: ``C^1`` terms), else ``("admm",
    reason)`` (Algorithm 2). A forced ``"newton"``/``"quasi-newton"`` on a model that does
    not allow it is a :class:`ModelError`; a client that turns out unable switches the run
    to Algorithm 2 at its start (``res.extra``)."""
    choice = options.inner_solver
    if choice not in ("auto", *NEWTON_MODES):  # ("admm"; options.validate names the others)
        return "admm", ""
    why = _newton_obstacle(compiled, options, proximal)
    if why and choice != "auto":
        raise ModelError(
            f"inner_solver={choice!r} is not available: {why}; use inner_solver='admm'"
        )
    mode = "quasi-newton" if choice == "auto" else choice
    return ("admm", why) if why else (mode, "")


def _newton_obstacle(compiled: CompiledModel, options: ProxALOptions, proximal: bool) -> str:
    """Why ``inner_solver`` cannot (or ``"auto"`` should not) be (quasi-)Newton; "" if it
    can."""
    if not proximal:
        return "method 'admm' is Algorithm 2 itself"
    why = compiled.shared_hessian_obstacle()
    if why:
        return why
    if options.solver not in ("auto", "newton"):
        return f"solver={options.solver!r} (Newton derivatives need the Newton backend)"
    d = compiled.layout.n_shared
    if options.inner_solver == "auto" and d > NEWTON_MAX_SHARED:
        return (
            f"{d} shared variables: the server's quasi-Newton model would be a {d} x {d} "
            f"matrix ({8 * d * d / 1e6:.0f} MB, factored every round; auto picks "
            f"quasi-Newton up to {NEWTON_MAX_SHARED}; inner_solver='quasi-newton' forces it)"
        )
    return ""


def _client_factories(compiled: CompiledModel, options: ProxALOptions, rhos, proximal):
    n = compiled.n_clients
    x0 = starting_point(compiled, options.w0, options.random_state)
    layout = compiled.layout
    return {
        c.name: EndpointFactory(
            ProxALClient,
            (
                c,
                options.beta,
                rhos[c.name],
                n,
                proximal,
                options.mu0,
                options.solver,
                options.max_local_iter,
                # the client's own block of the starting point (its own variables)
                x0[layout.indices(layout.owned_by(c.name))] if layout.has_owned else None,
                _balancing(options),
                float(options.relaxation),
                0 if layout.has_owned else int(options.anderson),
                0 if (layout.has_owned or not proximal) else int(options.outer_anderson),
                options.prox_beta,
                penalty_metric(compiled, options),
                float(options.metric_floor),
                float(options.metric_refresh),
            ),
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

    The clients run on ``options.backend``; ``faults`` (client name ->
    :class:`~fedmodel.runtime.faults.Fault`) injects failures, for tests.
    """
    proximal = method == "prox-al"
    names = [c.name for c in compiled.clients]
    mode, note = inner_solver(compiled, options, proximal)
    options.resolve_inner(mode)
    options.validate(names)
    rhos = options.rho_per_client(names)
    x0 = starting_point(compiled, options.w0, options.random_state)
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
        inner_solver=mode,
        inner_note=note,
    )
    factories = _client_factories(compiled, options, rhos, proximal)
    return run_federated(compiled, options, method, server, factories, faults=faults)
