"""prox-al's inner solver ``"admm"``: seed 000 Algorithm 2 (inexact ADMM), also the whole
of method ``admm``.

From ``w~^0 = w^k``, for ``t = 0, 1, ...`` the server solves (14) to ``eps_{t+1} = q^t``
and broadcasts ``w^{t+1}`` (``admm_w``); each client solves (15) and returns ``(u~_i,
eps~_i)`` (eqs. 16-18); the solve stops on (19): ``eps_{t+1} + sum_i eps~_i <= tau_k``
(the server's measured residual replaces ``eps_{t+1}`` when it is larger, or in the
adaptive variant). A start reply is the client's ADMM initialisation ``u~_i^0``.

The server's own block ``theta_0`` (party-owned variables) is kept with its share ``p`` of
Algorithm 1's proximal term and a proximal-ADMM term of weight ``sum_i rho_i``; only the
shared part is broadcast. The adaptive variant adds residual balancing of each client's
``rho_i`` (:meth:`ADMMClient.balance`; the new ``rho_i`` travels with ``u~_i``), Anderson
acceleration of the ADMM map (``anderson``: the clients' Gram rows up, the weights down)
and over-relaxation; ``penalty_metric="hessian"`` (an opt-in) replaces the identity in the
penalty by each client's Hessian ``M_i`` (:mod:`~fedmodel.algorithms.proxal.metric`),
sent as a ``d x d`` matrix whenever it changes.

Examples
--------
>>> ADMMInner.name, sorted(ADMMInner.start_reply)
('admm', ['metric', 'u_tilde'])
"""

from __future__ import annotations

import time

import numpy as np
from scipy.linalg import cho_factor

from fedmodel.algorithms.common import step_budgets
from fedmodel.algorithms.messages import W
from fedmodel.algorithms.proxal.anderson import AndersonState
from fedmodel.algorithms.proxal.inner import InnerClient, InnerOutcome, InnerSolver
from fedmodel.algorithms.proxal.metric import PenaltyMetric, hessian_metric, shifted_solver
from fedmodel.algorithms.proxal.obstacles import newton_obstacle
from fedmodel.algorithms.proxal.options import EXACT_TOL
from fedmodel.runtime.rows import Rows
from fedmodel.runtime.schema import Field, MessageSpec
from fedmodel.subproblems.merit import set_deadline, step_deadline
from fedmodel.subproblems.newton import solve_upper

#: ADMM rounds of one run of Algorithm 2 after which a client re-evaluates its Hessian
#: metric (penalty_metric="hessian"): the Hessian at the start of the run can be far from
#: the one at its end (logistic losses on separable data flatten as the margins grow)
METRIC_REFRESH_ROUNDS = frozenset({4, 8, 16, 32, 64, 128})
#: residual balancing keeps rho_i within [rho_start / RHO_SHRINK, rho_start * RHO_GROWTH]
#: (as OSQP bounds its rho): a server point that stops moving makes the dual residual
#: vanish, and unbounded doubling took a client's rho to 2^17 (pinball loss, one client:
#: Algorithm 2 stuck at max_inner; optimal in 1,373 rounds with the bound, 2,513 and
#: "inaccurate" at 1e3). Shrinking stays wide: NP on Adult wants rho ~ 0.01
RHO_GROWTH, RHO_SHRINK = 10.0, 1e3

HESSIAN_METRIC = "penalty_metric='hessian'"
_METRIC = Field(
    ("d", "d"),
    required=False,
    opt_in=HESSIAN_METRIC,
    reveals="the Hessian of P_{i,k} (d x d curvature: with fewer rows than d it can reveal "
    "the rows)",
)
_U_TILDE = Field(("d",), reveals="u~_i = u_i + lambda_i / rho_i (eq. 17)")

ADMM_W = MessageSpec(
    "admm_w",
    request={
        "w": W,
        "tol": Field(()),
        "alpha": Field(("<=aa",), required=False),
        "reset": Field((), dtype="bool", required=False),
        # seconds the step may take by the receiver's own clock (the run's time_limit;
        # absent without one)
        "budget": Field((), required=False),
    },
    reply={
        "u_tilde": _U_TILDE,
        "eps_tilde": Field((), reveals="its local accuracy (eq. 18)", sum_only=True),
        "rho": Field((), required=False, reveals="its residual-balanced rho_i"),
        "metric": _METRIC,
        "gram": Field(
            ("<=aa",),
            required=False,
            reveals="inner products of its ADMM residuals",
            sum_only=True,
        ),
    },
    reveals="one ADMM round of Algorithm 2",
)


class ADMMInner(InnerSolver):
    """The server's side of Algorithm 2: step (14), the aggregation, the bound (19).

    Its state is the clients' last ``u~_i``, their penalty metrics ``M_i`` (the Hessian
    metric) and the count of Anderson inputs its safeguard rejected; the penalties
    ``rho_i`` are the host's (reported in ``res.extra["rho"]``)."""

    name = "admm"
    # (in the objective's units its outer loop cycled on a least-squares model with seven
    # constraint forms at eps 1e-6: 5,500 inner rounds, "diverging" at beta = 418, S = 4.2;
    # its parameters stay in the user's units)
    objective_units = False
    start_reply = {"u_tilde": _U_TILDE, "metric": _METRIC}
    messages = (ADMM_W,)
    state_fields = ("u_tildes", "metrics", "aa_rejections")

    @classmethod
    def unused(cls, compiled, options) -> set[str]:
        off = set()
        if penalty_metric(compiled, options) == "scalar":
            off.add("metric")
        if compiled.layout.has_owned or not int(options.anderson):
            off |= {"admm_w.alpha", "admm_w.reset", "admm_w.gram"}
        if not options.adaptive_rho:
            off.add("rho")
        if getattr(options, "time_limit", None) is None:
            off.add("admm_w.budget")
        return off

    @classmethod
    def note(cls, compiled, options, proximal: bool) -> str:
        return newton_obstacle(compiled, options, proximal)

    def __init__(self, host):
        super().__init__(host)
        self.u_tildes: dict[str, np.ndarray] = {}
        # the clients' metrics M_i of their ADMM penalties rho_i M_i (the identity unless
        # penalty_metric="hessian"; sent with every (re)start of Algorithm 2)
        self.metrics: dict[str, np.ndarray] = {}
        self.aa_rejections = 0
        self.set_rhos(host.rhos)

    def configure(self) -> None:
        self.set_rhos(self.host.rhos)

    state_restored = configure

    def take_start(self, replies) -> None:
        """``u~_i^0`` and, with the Hessian metric, the clients' ``M_i`` (a client without
        exact Hessians keeps the identity)."""
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
            self.set_rhos(self.host.rhos)
        return bool(new)

    def extra(self) -> dict:
        return {"anderson_rejections": self.aa_rejections} if self.host.anderson else {}

    def stall_message(self, k, outcome, tau):
        return (
            f"the inner ADMM (Algorithm 2) stalled at outer iteration {k}: its bound "
            f"(19) improved by less than 10% over the last {self.host.options.stall_rounds} "
            f"rounds (now {outcome.bound:.3g}, target tau_k = {tau:.3g}). The subproblem's "
            "consensus does not converge at this penalty: try a smaller beta, another "
            "rho, or monitor=False to keep going."
        )

    # -- the penalties ----------------------------------------------------------------------
    def set_rhos(self, rhos: dict[str, float]) -> None:
        """The clients' current ADMM penalties (changed by residual balancing)."""
        host = self.host
        host.rhos = dict(rhos)
        self.rho_sum = float(sum(host.rhos.values()))
        self._center_factor = None
        p, ns = host.prox_weight, host.ns
        if not self.metrics:  # the scalar penalty: sigma = p + sum_i rho_i
            self.sigma_shared = self.sigma = p + self.rho_sum
            return
        # the server step's quadratic: p I + sum_i rho_i M_i on the shared variables (the
        # identity for clients without a metric) and p + sum_i rho_i on its own block; new
        # objects only here, so the backends' factorisations keyed on them are reused
        S = np.zeros((ns, ns))
        for name, rho in host.rhos.items():
            M = self.metrics.get(name)
            if M is None:
                S[np.diag_indices(ns)] += rho
            else:
                S += rho * M
        S[np.diag_indices(ns)] += p
        self.sigma_shared = S
        self.sigma = S
        if host.owned:
            n = ns + host.n_own
            self.sigma = np.zeros((n, n))
            self.sigma[:ns, :ns] = S
            own = np.arange(ns, n)
            self.sigma[own, own] = p + self.rho_sum

    def penalty(self, name: str, v: np.ndarray) -> np.ndarray:
        """Client ``name``'s ADMM penalty applied to ``v``: ``rho_i M_i v``."""
        M = self.metrics.get(name)
        return self.host.rhos[name] * (v if M is None else M @ v)

    def center_of(self, b: np.ndarray) -> np.ndarray:
        """``(p I + sum_i rho_i M_i)^(-1) b``: the centre of the server step's quadratic
        (one factorisation per metric and penalties)."""
        S = self.sigma_shared
        if np.ndim(S) == 0:
            return b / S
        if self._center_factor is None:
            self._center_factor = cho_factor(S, lower=False, check_finite=False)[0]
        return solve_upper(self._center_factor, b)

    # -- one run of Algorithm 2 ---------------------------------------------------------------
    def solve(self, runtime, tau: float, deadline: float | None = None) -> InnerOutcome:
        """Algorithm 2 on ``P_{0,k} + h + sum_i P_{i,k}``, started from ``w~^0 = w^k``.

        ``w`` is the server's view: the shared variables, then its own block ``theta_0``
        (kept here with its share ``p`` of Algorithm 1's proximal term and a proximal-ADMM
        term of weight ``sum_i rho_i``); only the shared part is broadcast.
        """
        host = self.host
        opts = host.options
        ns = host.ns
        w_center = w = host.x
        u_tildes = self.u_tildes
        bound = np.inf
        residual = np.inf
        floor = opts.local_floor * tau
        window = int(opts.stall_rounds) if opts.monitor else 0
        best, best_at_window = np.inf, np.inf
        aa = AndersonState(host.anderson) if host.anderson else None
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
            center = self.center_of(host.prox_weight * w_center[:ns] + agg)
            if host.owned:
                sigma_theta = host.prox_weight + self.rho_sum
                theta_c = (host.prox_weight * w_center[ns:] + self.rho_sum * w[ns:]) / sigma_theta
                center = np.concatenate([center, theta_c])
            host.problem.set(sigma=self.sigma, center=center, mu=[host.mu], nu=[host.nu])
            set_deadline(host.solver, deadline)
            report = host.solver.solve(w, tol, opts.max_local_iter)  # server step (14)
            host.local_iterations += report.iterations
            residual = report.residual
            if host.owned:  # the proximal-ADMM term on theta_0 is not part of l_k
                residual += self.rho_sum * float(np.abs(report.x[ns:] - w[ns:]).max())
            w = report.x
            runtime.next_round()
            payload = {"w": w[:ns], "tol": tol}
            if aa is not None:  # this round's input: alpha over the last outputs
                payload.update(alpha=alpha, reset=reset)
            names = runtime.client_names
            budgets = step_budgets(runtime, names, deadline)
            if budgets:  # (each client's step ends by the deadline: its share of what is left)
                payload["budget"] = Rows([budgets[n] for n in names])
            replies = runtime.broadcast_rows("admm_w", payload, to=names)
            u_tildes = {name: r.payload["u_tilde"] for name, r in replies.items()}
            changed = False
            if opts.adaptive_rho:  # residual balancing: the clients' new rho_i (public)
                new = {name: float(r.payload["rho"]) for name, r in replies.items()}
                changed = new != host.rhos
                if changed:
                    self.set_rhos(new)
            if self.take_metrics(replies):  # refreshed Hessian metrics (penalty_metric)
                changed = True
            if aa is not None:
                row = sum(np.asarray(r.payload["gram"], dtype=float) for r in replies.values())
                alpha, reset = aa.observe(row, changed)
                u_tildes = _combine(outputs, u_tildes, alpha, reset, host.anderson + 1)
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


class ADMMClient(InnerClient):
    """Client ``i``'s side of Algorithm 2: its ADMM variables ``u_i``, ``lambda_i``,
    ``u~_i``, its penalty ``rho_i M_i``, the residual-balancing and Anderson memories."""

    state_fields = (
        "u", "lam", "u_tilde", "u_hat", "rho", "M", "metric_changed", "w_last", "admm_round",
        "aa_out", "aa_res",
    )  # fmt: skip

    def __init__(self, host):
        super().__init__(host)
        self.rho = host.rho_start
        # the ADMM penalty is rho_i M_i with a metric M_i on the shared variables: the
        # identity ("scalar", Algorithm 2) or the Hessian of P_{i,k} ("hessian"), set at
        # every (re)start of Algorithm 2 and sent to the server with u~_i (metric module)
        self.M = PenaltyMetric(host.ns)
        self.metric_changed = False
        self._center_solve = None  # (rho, M, p I + rho M, v -> (p I + rho M)^(-1) v)
        self.u_hat: np.ndarray | None = None  # u_i (shared part) behind u~_i
        # Anderson acceleration memory: this client's block of the ADMM fixed-point
        # iteration's outputs (u~_i, lambda_i) and residuals
        self.aa_out: list[tuple[np.ndarray, np.ndarray]] = []
        self.aa_res: list[np.ndarray] = []
        self.w_last: np.ndarray | None = None  # w^t, for the dual residual
        self.admm_round = 0  # ADMM rounds since the last (re)start of Algorithm 2
        self.u = self.lam = self.u_tilde = None

    def get_state(self) -> dict:
        state = super().get_state()
        state["M"] = self.M.to_state()  # (plain values: checkpoints hold no objects)
        return state

    def set_state(self, state: dict) -> None:
        super().set_state(state)
        self.M = PenaltyMetric.from_state(state["M"])

    def _R(self, v: np.ndarray) -> np.ndarray:
        """This client's ADMM penalty applied to ``v``: ``rho_i M_i v``."""
        return self.rho * self.M.times(v)

    def _R_inv(self, v: np.ndarray) -> np.ndarray:
        """``(rho_i M_i)^(-1) v``."""
        return self.M.solve(v) / self.rho

    def _set_metric(self, x: np.ndarray) -> bool:
        """``penalty_metric="hessian"``: ``M_i`` = the Hessian of ``P_{i,k}`` at ``x`` on
        the shared variables (its party terms plus this party's share of the proximal
        term, made positive definite by ``metric_floor``), when the backend has exact
        Hessians (Newton); the identity otherwise. The metric is kept (and not sent again)
        while the Hessian differs from the one it was built from by at most
        ``metric_refresh`` in relative Frobenius norm. Returns True when ``M_i`` changed."""
        h = self.host
        if h.metric != "hessian" or not hasattr(h.solver, "hessian"):
            return False
        if self.M.source is not None and h.solver.constant_hessian:
            return False  # (quadratic terms and equalities only: nothing to re-evaluate)
        ns = h.ns
        H = h.solver.hessian(x, [h.mu], [h.nu])[:ns, :ns]
        H[np.diag_indices(ns)] += h.prox_weight
        old = self.M.source
        if old is not None and np.linalg.norm(H - old) <= h.metric_refresh * np.linalg.norm(old):
            return False
        self.M = hessian_metric(H, h.metric_floor)
        return True

    def start(self, w, **request) -> dict:
        """(Re)start Algorithm 2 at ``w`` (``w~^0 = w``: ``u^0 = w``, ``lambda^0 = -grad
        P(w)``): ``u~_i^0``, and the metric ``M_i`` when it changed."""
        h = self.host
        w = np.asarray(w, dtype=float)
        h.w_center = w.copy()
        h.theta_center = h.theta_at_w.copy()
        x = h._local(w, h.theta_at_w)
        self.metric_changed = self._set_metric(x)
        g = h._grad_P(x)[: h.ns]
        self.u = x.copy()
        self.u_hat = w.copy()
        self.lam = -g
        self.u_tilde = w - self._R_inv(g)
        self.w_last = w.copy()
        self.admm_round = 0
        self.aa_out, self.aa_res = [], []
        reply = {"u_tilde": self.u_tilde}
        if self.metric_changed:
            reply["metric"] = self.M.matrix
        return reply

    def _aa_input(self, alpha, reset) -> None:
        """Anderson acceleration: this round's input (u~_i, lambda_i) is the combination
        ``sum_j alpha_j`` of the last ``len(alpha)`` outputs (the server combined the u~_i
        the same way for its step (14)); an empty ``alpha`` keeps the last output (a plain
        ADMM step). ``reset`` clears the memory afterwards."""
        alpha = np.asarray(alpha, dtype=float)
        if alpha.size:
            outs = self.aa_out[-alpha.size :]
            u_in = sum(a * o[0] for a, o in zip(alpha, outs))
            self.lam = sum(a * o[1] for a, o in zip(alpha, outs))
            self.u_tilde = u_in
            self.u_hat = u_in - self._R_inv(self.lam)
        if reset:
            self.aa_out, self.aa_res = [], []

    def _aa_record(self, u_in: np.ndarray, lam_in: np.ndarray) -> np.ndarray:
        """Store this round's output and residual ``(u~' - u~, (lambda' - lambda)/rho)``;
        return its inner products with the stored residuals (oldest first, itself last)."""
        # (in the metric m_i: the fixed-point iteration of ADMM on m_i^(1/2) u = m_i^(1/2) w)
        r = np.concatenate(
            [self.M.root(self.u_tilde - u_in), self.M.inverse_root(self.lam - lam_in) / self.rho]
        )
        self.aa_out.append((self.u_tilde.copy(), self.lam.copy()))
        self.aa_res.append(r)
        keep = self.host.anderson + 1
        self.aa_out, self.aa_res = self.aa_out[-keep:], self.aa_res[-keep:]
        return np.array([float(r @ q) for q in self.aa_res])

    def _on_admm_w(self, w, tol, alpha=None, reset=False, budget=None):
        h = self.host
        deadline = step_deadline(budget, f"party {h.name!r}")
        w = np.asarray(w, dtype=float)
        ns = h.ns
        if h.anderson:
            self._aa_input(alpha if alpha is not None else [], reset)
            u_in, lam_in = self.u_tilde.copy(), self.lam.copy()
        theta = self.u[ns:]
        h.theta_at_w = theta.copy()
        h.cone_at_w = h.cone.copy()  # the multipliers of the solve that gave theta
        # eps~ (eq. 18): grad phi_{i,t}(w^{t+1}) = grad P_i(w^{t+1}) + lambda^t, with the
        # own block at its current value (its part of the gradient bounded too)
        g = h._grad_P(h._local(w, theta))
        # (u^_i: the u_i with u~_i = u^_i + lambda_i / rho_i, also after Anderson steps)
        eps_tilde = float(np.abs(g[:ns] + self.lam - self._R(w - self.u_hat)).max())
        if h.owned:
            eps_tilde = max(eps_tilde, float(np.abs(g[ns:]).max()))
        if h.cone.size:  # hard cone constraints: their feasibility and complementarity
            # at (w^{t+1}, theta) too (the subdifferential is empty where they fail)
            x = h._local(w, theta)
            eps_tilde = max(eps_tilde, h.problem.functions[0].cone_residuals(x, h.cone)[0])
        # client step (15): phi = P_i(u) + <lambda, u - w> + rho/2 ||u - w||^2, written as the
        # merit function plus (sigma/2)||u - center||^2 with the prox share folded in.
        # over-relaxation (Eckstein, Bertsekas 1992; Boyd et al. 2011, 3.4.3) of the first
        # ADMM block (the server's w): the step and (16) use w^ = alpha w + (1 - alpha) u_i^t;
        # alpha = 1 is Algorithm 2
        a = h.relaxation
        w_step = w if a == 1.0 else a * w + (1.0 - a) * self.u_hat
        p = h.prox_weight
        sigma, center = self._local_quadratic(p * h.w_center + self._R(w_step) - self.lam)
        if h.owned:  # P_{i,k}'s prox term on theta (weight p) + proximal-ADMM term (rho)
            sigma_theta = h.theta_prox + self.rho
            theta_c = (h.theta_prox * h.theta_center + self.rho * theta) / sigma_theta
            center = np.concatenate([center, theta_c])
        h.problem.set(sigma=sigma, center=center, mu=[h.mu], nu=[h.nu])
        h.problem.cone[0] = h.cone
        set_deadline(h.solver, deadline)
        report = h.solver.solve(self.u, float(tol), h.max_local_iter)
        h.cone = np.array(h.problem.cone[0], dtype=float)
        h.stats["local_solves"] += 1
        h.stats["local_iterations"] += report.iterations
        h.note_residual_gap(report.residual, tol)
        self.u = report.x
        u = self.u[:ns]
        self.u_hat = u.copy()  # the u_i behind u~_i (Anderson combines u~_i and lambda_i)
        self.lam = self.lam + self._R(u - w_step)  # (16)
        if h.balancing is not None and (self.M.is_identity or h.owned):
            self.balance(u, w)  # (counts admm_round)
        else:  # (a Hessian metric of the whole subproblem: rho_i = 1 is its natural scale)
            self.admm_round += 1
        # the metric follows the Hessian a few times per run of Algorithm 2 (rounds 4, 8,
        # 16, ...: finitely many changes, like rho's), at this client's own iterate u_i
        refreshed = (
            h.metric == "hessian"
            and self.admm_round in METRIC_REFRESH_ROUNDS
            and self._set_metric(self.u)
        )
        self.u_tilde = self.u_hat + self._R_inv(self.lam)  # (17)
        reply = {"u_tilde": self.u_tilde, "eps_tilde": eps_tilde}
        if refreshed:
            reply["metric"] = self.M.matrix
        if h.balancing is not None:
            reply["rho"] = self.rho
        if h.anderson:
            reply["gram"] = self._aa_record(u_in, lam_in)
        return reply

    def _local_quadratic(self, b: np.ndarray):
        """``(sigma, center)`` of the client step's quadratic ``(p/2)||u - w^k||^2 +
        <lambda, u> + (rho/2)||u - w||_M^2 = (1/2) u^T sigma u - b^T u + const`` on the shared
        variables: ``sigma = p I + rho M`` (a scalar with the identity metric; with an own
        block, block-diagonal with ``p + rho`` there) and ``center = sigma^(-1) b`` on the
        shared block. One factorisation per metric and rho, and the same ``sigma`` object
        meanwhile (the Newton backend keys its factors on it)."""
        h = self.host
        p = h.prox_weight
        if self.M.is_identity:
            return p + self.rho, b / (p + self.rho)
        cached = self._center_solve
        if cached is None or cached[0] != self.rho or cached[1] is not self.M:
            n, n_own = h.ns, h.program.layout.size - h.ns
            S = np.zeros((n + n_own, n + n_own))
            S[:n, :n] = self.rho * self.M.matrix
            S[np.diag_indices(n + n_own)] += p + np.r_[np.zeros(n), np.full(n_own, self.rho)]
            cached = (self.rho, self.M, S, shifted_solver(self.M, p, self.rho))
            self._center_solve = cached
        return cached[2], cached[3](b)

    def balance(self, u: np.ndarray, w: np.ndarray) -> None:
        """Residual balancing of ``rho_i`` (He, Yang, Wang 2000; Boyd et al. 2011, 3.4.1)
        on this client's own residuals: primal ``||u_i - w^{t+1}||`` against dual
        ``rho_i ||w^{t+1} - w^t||``. ``lambda_i`` is unscaled, so only ``u~_i`` changes
        with ``rho_i``; no change after ``rounds`` rounds of one run of Algorithm 2."""
        ratio, factor, rounds = self.host.balancing
        self.admm_round += 1
        w_last, self.w_last = self.w_last, w.copy()
        if self.admm_round > rounds or w_last is None:
            return
        primal = float(np.linalg.norm(self.M.root(u - w)))  # (both in the metric M_i)
        dual = self.rho * float(np.linalg.norm(self.M.root(w - w_last)))
        rho_start = self.host.rho_start
        if primal > ratio * dual:
            self.rho = min(self.rho * factor, rho_start * RHO_GROWTH)
        elif dual > ratio * primal:
            self.rho = max(self.rho / factor, rho_start / RHO_SHRINK)


ADMMInner.client_part = ADMMClient


def penalty_metric(compiled, options) -> str:
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
