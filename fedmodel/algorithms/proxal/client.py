"""Client half of prox-al (seed 000 Algorithm 1) and of its inner inexact ADMM (Algorithm 2).

The client keeps its own state: its multipliers ``mu_i`` (and ``nu_i`` for equalities),
the proximal centre ``w^k``, and the ADMM variables ``u_i``, ``lambda_i``, ``u~_i``. It
answers these messages (everything else stays on the client):

=============  =================================  =====================================
kind           payload in                         reply payload
=============  =================================  =====================================
``start``      ``w`` (= w^0)                      ``u_tilde`` (ADMM initialisation)
``outer``      ``w`` (= w^{k+1})                  ``dmu_inf`` = ||mu_i^{k+1}-mu_i^k||_inf,
                                                  ``u_tilde`` (next ADMM initialisation)
``admm_w``     ``w`` (= w^{t+1}), ``tol``         ``u_tilde``, ``eps_tilde`` (eqs. 16-18),
                                                  ``rho`` (its current rho_i, when
                                                  residual balancing is on)
``gradient_w`` ``w`` (a trial point)              ``value``, ``grad`` of P_{i,k} at ``w``
                                                  (quasi-Newton: ``()``, ``(d,)``)
``curvature_  ``w``, ``directions`` ``(k, d)``     ``value``, ``grad``, ``hvp`` ``(k, d)``:
w``                                               its Hessian times the directions
``newton_w``   ``w`` (a trial point)              ``value``, ``grad`` of P_{i,k} at ``w``,
                                                  ``hessian`` ``(d, d)`` (when it changed;
                                                  opt-in ``inner_solver="newton"`` only)
``evaluate``   ``w``                              diagnostic: f_i, Lagrangian gradient,
                                                  feasibility, constraint values
``report``     (nothing)                          diagnostic: multipliers, local stats
=============  =================================  =====================================

With ``inner_solver="quasi-newton"`` (the adaptive default on smooth models) or
``"newton"`` (:mod:`fedmodel.algorithms.proxal.newton_inner`) the server adds
``inner="quasi-newton"`` / ``"newton"`` to ``start``, ``outer`` and ``outer_aa``: the
client then sets ``w`` as the centre of its ``P_{i,k}`` and replies with the
``gradient_w`` payload (value, gradient at ``w``) or the ``newton_w`` payload (value,
gradient, Hessian) in place of the ADMM initialisation; a client that cannot (own
variables; for Newton, no exact Hessians) replies ``newton = False`` with the reason to
``start`` and the server runs Algorithm 2 instead. Only the opt-ins ``inner_solver="newton"``
and ``penalty_metric="hessian"`` (``metric``, ``(d, d)``, in ``start``/``outer``/``admm_w``
replies) send ``d x d`` matrices: they reveal the client's Hessian of its subproblem (for
a client with fewer rows than ``d``, its rows).

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

import numpy as np

from fedmodel.algorithms.protocol import ClientHalf
from fedmodel.algorithms.proxal.messages import PROXAL
from fedmodel.algorithms.proxal.metric import PenaltyMetric, hessian_metric, shifted_solver
from fedmodel.algorithms.proxal.newton_inner import SHIFT
from fedmodel.algorithms.proxal.options import ProxALOptions
from fedmodel.certificate.kkt import party_evaluation
from fedmodel.compiler.glm import NotRecognised
from fedmodel.compiler.partition import PartyProgram
from fedmodel.runtime.wire import register_wire_type
from fedmodel.subproblems.conic_prox import exact_prox_solver, internal_rows
from fedmodel.subproblems.merit import MeritProblem, set_deadline, step_deadline
from fedmodel.subproblems.newton import cholesky_solve, shifted_cholesky
from fedmodel.subproblems.select import make_solver

#: ADMM rounds of one run of Algorithm 2 after which a client re-evaluates its Hessian
#: metric (penalty_metric="hessian"): the Hessian at the start of the run can be far from
#: the one at its end (logistic losses on separable data flatten as the margins grow)
METRIC_REFRESH_ROUNDS = frozenset({4, 8, 16, 32, 64, 128})
#: residual balancing keeps rho_i within [rho_start / RHO_SHRINK, rho_start * RHO_GROWTH]
#: (as OSQP bounds its rho): a server point that stops moving makes the dual residual
#: vanish, and unbounded doubling took a client's rho to 2^17 (pinball loss, one client,
#: now that the scalar penalty is the default: Algorithm 2 stuck at max_inner; optimal in
#: 1,373 rounds with the bound, 2,513 and "inaccurate" at 1e3). Shrinking stays wide: NP on
#: Adult wants rho ~ 0.01
RHO_GROWTH, RHO_SHRINK = 10.0, 1e3
#: the inner solvers whose rounds evaluate P_{i,k}'s derivatives (newton_inner)
INNER_NEWTON = ("newton", "quasi-newton")
#: the inner solver whose rounds are exact proximal steps (exact_admm)
EXACT = "exact-admm"


@register_wire_type("proxal.client")
class ProxALClient(ClientHalf):
    """Client ``i`` of seed 000: owns ``f_i``, ``c_i``, ``mu_i`` and its ADMM state.

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
        The penalty metric in effect (:func:`~fedmodel.algorithms.proxal.server.penalty_metric`).
    """

    def __init__(
        self,
        program: PartyProgram,
        options: ProxALOptions,
        rho: float,
        n_clients: int,
        proximal: bool = True,
        theta0: np.ndarray | None = None,
        metric: str = "scalar",
    ):
        # Anderson acceleration is off when any party owns variables (their blocks are
        # part of the iteration's state but never travel); the program's layout is the model's
        owned_anywhere = program.layout.has_owned
        super().__init__(program.local())  # (shared variables, this client's own)
        program = self.program
        beta, mu0, prox_beta = options.beta, options.mu0, options.prox_beta
        max_local_iter, balancing = options.max_local_iter, options.balancing
        relaxation = options.relaxation
        anderson = 0 if owned_anywhere else int(options.anderson)
        outer_anderson = 0 if (owned_anywhere or not proximal) else int(options.outer_anderson)
        metric_floor, metric_refresh = options.metric_floor, options.metric_refresh
        self.beta = float(beta)
        self.rho = self.rho_start = float(rho)
        # Algorithm 1's proximal step size (beta, or prox_beta when decoupled)
        gamma = float(beta if prox_beta is None else prox_beta)
        self.prox_weight = 1.0 / ((n_clients + 1) * gamma) if proximal else 0.0
        self.n_clients = int(n_clients)
        self.ns = program.layout.n_shared
        self.owned = program.layout.size > self.ns
        # weight of Algorithm 1's proximal term on the own block (see module doc)
        self.theta_prox = self.prox_weight
        n_own = program.layout.size - self.ns
        theta0 = np.zeros(n_own) if theta0 is None else np.asarray(theta0, dtype=float)
        self.theta_center = theta0.copy()  # theta_i^k (admm: the last theta_i)
        self.theta_at_w = theta0.copy()  # own block of the iterate matching the last w
        self.mu = np.full(program.m_ineq, float(mu0))
        self.nu = np.zeros(program.m_eq)
        self.cone = np.zeros(program.m_cone)  # conic duals of its cone constraints
        self.cone_at_w = self.cone.copy()  # those matching theta_at_w (the certificate's)
        self.problem = MeritProblem([program], beta)
        self.solver = make_solver(self.problem, options.solver)
        # exact-admm: the backend of the exact step (built at its first round), the
        # epigraph pieces' rows (their multipliers are its duals) and whether it runs
        self.solver_option = options.solver
        self._exact_solver = None
        self.hard_rows = internal_rows(self.problem)
        self.exact_mode = False
        if hasattr(self.solver, "carry_factor"):
            # ADMM rounds solve the same subproblem with moving vectors: start each Newton
            # solve from the last factor (carried in this client's state, see get_state)
            self.solver.carry_factor = True
        self.max_local_iter = max_local_iter
        # the ADMM penalty is rho_i M_i with a metric M_i on the shared variables: the
        # identity ("scalar", Algorithm 2) or the Hessian of P_{i,k} ("hessian"), set at
        # every (re)start of Algorithm 2 and sent to the server with u~_i (metric module)
        self.metric = metric
        self.metric_floor = float(metric_floor)
        self.metric_refresh = float(metric_refresh)
        self.metric_changed = False
        self.M = PenaltyMetric(self.ns)
        self._center_solve = None  # (rho, M, p I + rho M, v -> (p I + rho M)^(-1) v)
        # residual balancing (ratio, factor, rounds per outer iteration) or None
        self.balancing = balancing
        self.relaxation = float(relaxation)  # over-relaxation alpha (1 = Algorithm 2)
        self.u_hat: np.ndarray | None = None  # u_i (shared part) behind u~_i
        # Anderson acceleration memory: this client's block of the ADMM fixed-point
        # iteration's outputs (u~_i, lambda_i) and residuals (see the server module)
        self.anderson = int(anderson)
        self.aa_out: list[tuple[np.ndarray, np.ndarray]] = []
        self.aa_res: list[np.ndarray] = []
        # outer Anderson acceleration: memory of (residual, mu_i, nu_i) of Algorithm 1
        self.outer_anderson = int(outer_anderson)
        self.outer_mem: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self.w_last: np.ndarray | None = None  # w^t, for the dual residual
        self.admm_round = 0  # ADMM rounds since the last (re)start of Algorithm 2
        self.w_center: np.ndarray | None = None
        self.u = self.lam = self.u_tilde = None
        # inner_solver="newton": (the backend's Hessian, the one last sent) -- read-only
        self.newton_H: tuple[np.ndarray, np.ndarray] | None = None
        # quasi-Newton with local directions: (the backend's Hessian, the Cholesky factor of
        # n (H_i + p I)) -- reused while a quadratic client's Hessian is the same array
        self.local_factor: tuple[np.ndarray, np.ndarray | None] | None = None
        # quasi-Newton with constraint_curvature: the rows of its active AL terms' curvature
        self.send_stiff = options.constraint_curvature_on(self.ns) and hasattr(
            self.solver, "stiff_rows"
        )
        self.stiff_sent: np.ndarray | None = None  # (the rows last sent: resent on change)
        self.stats["max_residual_gap"] = 0.0

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
        if self.metric != "hessian" or not hasattr(self.solver, "hessian"):
            return False
        if self.M.source is not None and self.solver.constant_hessian:
            return False  # (quadratic terms and equalities only: nothing to re-evaluate)
        ns = self.ns
        H = self.solver.hessian(x, [self.mu], [self.nu])[:ns, :ns]
        H[np.diag_indices(ns)] += self.prox_weight
        old = self.M.source
        if old is not None and np.linalg.norm(H - old) <= self.metric_refresh * np.linalg.norm(old):
            return False
        self.M = hessian_metric(H, self.metric_floor)
        return True

    def _start_admm(self, w: np.ndarray) -> np.ndarray:
        """Algorithm 2 initialisation with w~^0 = w: u^0 = w, lambda^0 = -grad P(w)."""
        self.w_center = w.copy()
        self.theta_center = self.theta_at_w.copy()
        x = self._local(w, self.theta_at_w)
        self.metric_changed = self._set_metric(x)
        g = self._grad_P(x)[: self.ns]
        self.u = x.copy()
        self.u_hat = w.copy()
        self.lam = -g
        self.u_tilde = w - self._R_inv(g)
        self.w_last = w.copy()
        self.admm_round = 0
        self.aa_out, self.aa_res = [], []
        return self.u_tilde

    # -- state (checkpoints, retries) --------------------------------------------------------
    state_fields = (
        "mu", "nu", "w_center", "u", "lam", "u_tilde", "theta_center", "theta_at_w", "cone",
        "cone_at_w", "rho", "M", "metric_changed", "w_last", "admm_round", "u_hat", "aa_out", "aa_res", "outer_mem",
        "newton_H", "exact_mode", "stiff_sent",
    )  # fmt: skip
    component_fields = ("solver",)  # the Newton backend's carried factor
    messages = PROXAL

    def get_state(self) -> dict:
        state = super().get_state()
        state["M"] = self.M.to_state()  # (plain values: checkpoints hold no objects)
        return state

    def set_state(self, state: dict) -> None:
        super().set_state(state)
        self.M = PenaltyMetric.from_state(state["M"])

    def multipliers(self) -> tuple[np.ndarray, np.ndarray]:
        return self.mu, self.nu

    def cone_duals(self) -> np.ndarray | None:
        return self.cone_at_w if self.cone.size else None

    # -- message handlers --------------------------------------------------------------------
    def _admm_start_reply(self, w) -> dict:
        """(Re)start Algorithm 2 at ``w``: ``u~_i^0``, and the metric ``m_i`` when it is
        not the scalar one."""
        reply = {"u_tilde": self._start_admm(np.asarray(w, dtype=float))}
        if self.metric_changed:
            reply["metric"] = self.M.matrix
        return reply

    def _inner_start_reply(self, w, inner: str, directions=None) -> dict:
        """The reply that starts the next inner solve at ``w``: the ADMM initialisation, or
        ``P_{i,k}``'s derivatives at its new centre ``w`` (``inner="newton"``: with the
        Hessian; ``"quasi-newton"``: value and gradient, and the Hessian-vector products
        along ``directions`` when the server sent some; ``"exact-admm"``: only a flag)."""
        self.exact_mode = inner == EXACT
        if self.exact_mode:  # exact-admm: the new centres of P_{i,k}, nothing to send
            self.w_center = np.asarray(w, dtype=float).copy()
            self.theta_center = self.theta_at_w.copy()
            return {"exact": True}
        if inner not in INNER_NEWTON:
            return self._admm_start_reply(w)
        self.w_center = np.asarray(w, dtype=float).copy()
        if inner == "newton":
            return self._on_newton_w(w)
        if directions is not None:
            return self._on_curvature_w(w, directions)
        return self._on_gradient_w(w)

    def newton_unsupported(self, inner: str = "newton") -> str:
        """Why this client cannot take part in the federated (quasi-)Newton inner solver
        ("" when it can): its own variables never travel, and ``inner="newton"`` needs
        exact (generalised) Hessians of its terms."""
        if self.owned:
            return "it has its own variables"
        if inner == "newton" and not hasattr(self.solver, "derivatives"):
            return f"its subproblem backend ({self.solver.name}) has no exact Hessians"
        return ""

    def _on_start(self, w, inner: str = "admm", directions=None):
        if inner in INNER_NEWTON:
            why = self.newton_unsupported(inner)
            if why:
                return {"newton": False, "why": why}
            try:
                return {"newton": True, **self._inner_start_reply(w, inner, directions)}
            except NotRecognised as exc:  # (the backend's GLM form failed its cross-check)
                return {"newton": False, "why": str(exc)}
        return self._inner_start_reply(w, inner)

    def _on_gradient_w(self, w):
        """Value and gradient of ``P_{i,k}`` at ``w`` (the quasi-Newton inner solver: ``d +
        1`` floats, no second-order information)."""
        val, g = self._value_grad_P(np.asarray(w, dtype=float))
        self.stats["derivative_evaluations"] = self.stats.get("derivative_evaluations", 0) + 1
        return self._with_stiff(w, {"value": val, "grad": g})

    def _with_stiff(self, w, reply: dict) -> dict:
        """``reply`` with ``stiff``, the rows ``J_i`` of its augmented-Lagrangian terms'
        curvature ``J_i^T J_i`` at ``w`` (``constraint_curvature``), when they differ from
        the rows it sent last (the server keeps those: affine equalities' rows go once)."""
        if self.send_stiff:
            J = self.solver.stiff_rows(np.asarray(w, dtype=float), [self.mu], [self.nu])
            last = self.stiff_sent
            if last is None or last.shape != J.shape or not np.array_equal(last, J):
                J.setflags(write=False)  # (shared, not copied, by state snapshots)
                reply["stiff"] = self.stiff_sent = J
        return reply

    def _on_curvature_w(self, w, directions, precondition=None):
        """Value, gradient and Hessian-vector products of ``P_{i,k}`` at ``w`` along the
        rows of ``directions`` (the quasi-Newton inner solver with ``curvature_directions
        > 0``: ``(k + 1) d + 1`` floats). Exact from the Newton backend's GLM form (no
        ``d x d`` matrix, sparse data stays sparse); from a forward difference of the
        gradient for other backends.

        With ``precondition`` (a vector ``r``: ``local_directions``) also its local Newton
        direction ``z_i = (n (H_i + p I))^(-1) r`` (``d`` floats more), with ``H_i`` the
        Hessian of ``P_{i,k}``'s terms at ``w``, which never leaves the client (GIANT:
        Wang et al., NeurIPS 2018); a client whose backend has no exact Hessian, or whose
        shifted Hessian has no Cholesky factor, or whose data are scipy.sparse, sends
        none."""
        w = np.asarray(w, dtype=float)
        V = np.asarray(directions, dtype=float).reshape(-1, w.size)
        p = self.prox_weight
        local = None
        if precondition is not None and self._local_hessian_ok():
            val, g, H_raw = self.solver.derivatives(w, [self.mu], [self.nu])
            d = w - self.w_center
            val, g = float(val) + 0.5 * p * float(d @ d), g + p * d
            HV = V @ H_raw + p * V
            local = self._local_direction(H_raw, np.asarray(precondition, dtype=float))
        elif hasattr(self.solver, "products"):
            val, g, HV = self.solver.products(w, [self.mu], [self.nu], V.T)
            d = w - self.w_center
            val, g = float(val) + 0.5 * p * float(d @ d), g + p * d
            HV = HV.T + p * V
        else:
            val, g = self._value_grad_P(w)
            h = 1e-7 * max(1.0, float(np.abs(w).max(initial=0.0)))
            HV = np.array([(self._value_grad_P(w + h * v)[1] - g) / h for v in V])
            HV = HV.reshape(V.shape)
        self.stats["derivative_evaluations"] = self.stats.get("derivative_evaluations", 0) + 1
        reply = {"value": val, "grad": g, "hvp": HV}
        if local is not None:
            reply["local_direction"] = local
        return self._with_stiff(w, reply)

    def _local_hessian_ok(self) -> bool:
        """Whether this client can form its local Hessian for a local direction: exact
        Hessians (the Newton backend) and dense data (scipy.sparse data stays sparse: no
        ``d x d`` product of it is formed)."""
        if not hasattr(self.solver, "derivatives"):
            return False
        terms = getattr(getattr(self.solver, "obj", None), "terms", ())
        return not any(hasattr(t.A, "toarray") for t in terms)

    def _local_direction(self, H_raw: np.ndarray, r: np.ndarray) -> np.ndarray | None:
        """``(n (H_i + p I))^(-1) r`` with ``H_i`` = ``H_raw`` (shifted to positive definite
        on a non-convex model); None when no shift gives a factor."""
        cached = self.local_factor
        if cached is None or cached[0] is not H_raw:
            M = H_raw * float(self.n_clients)
            M[np.diag_indices_from(M)] += self.n_clients * self.prox_weight
            cached = self.local_factor = (H_raw, shifted_cholesky(M, **SHIFT))
        if cached[1] is None or not np.all(np.isfinite(r)):
            return None
        return cholesky_solve(cached[1], r)

    def _on_newton_w(self, w):
        """Value, gradient and Hessian of ``P_{i,k}`` (eq. 11: the merit terms plus this
        party's share ``p ||w - w^k||^2 / 2`` of the proximal term) at ``w``; the Hessian
        only when it differs from the one last sent (the server keeps that one)."""
        w = np.asarray(w, dtype=float)
        val, g, H_raw = self.solver.derivatives(w, [self.mu], [self.nu])
        p = self.prox_weight
        d = w - self.w_center
        val += 0.5 * p * float(d @ d)
        g += p * d
        self.stats["derivative_evaluations"] = self.stats.get("derivative_evaluations", 0) + 1
        reply = {"value": float(val), "grad": g}
        last = self.newton_H
        if last is not None and H_raw is last[0]:  # (a quadratic client's, unchanged)
            return reply
        H = H_raw.copy()
        H[np.diag_indices_from(H)] += p
        H.setflags(write=False)  # (shared, not copied, by state snapshots)
        if last is None or not np.array_equal(H, last[1]):
            reply["hessian"] = H
            last = (H_raw, H)
        self.newton_H = (H_raw, last[1])
        return reply

    def _on_outer(self, w, inner: str = "admm", directions=None):
        w = np.asarray(w, dtype=float)
        # the outer iterate w^{k+1} is (w, theta at w): what eps~ was measured at
        dtheta = float(np.abs(self.theta_at_w - self.theta_center).max(initial=0.0))
        ci, ce = self.problem.functions[0].constraint_values(self._local(w, self.theta_at_w))
        mu_in, nu_in = self.mu.copy(), self.nu.copy()
        # exact-admm: the epigraph pieces' multipliers are its exact steps' duals (kept)
        hard_i, hard_e = self.hard_rows if self.exact_mode else (False, False)
        dmu = 0.0
        if ci.size:
            new = np.where(hard_i, self.mu, np.maximum(self.mu + self.beta * ci, 0.0))
            dmu = float(np.abs(new - self.mu).max())
            self.mu = new
        if ce.size:  # equalities: unprojected update
            step = np.where(hard_e, 0.0, self.beta * ce)
            dmu = max(dmu, float(np.abs(step).max()))
            self.nu = self.nu + step
        reply = {"dmu_inf": dmu, **self._inner_start_reply(w, inner, directions)}
        if inner in INNER_NEWTON:  # (test (8)'s feasibility half, measured)
            reply.update(kkt_feasibility(ci, ce, self.mu, hard_i, hard_e))
        if self.owned:  # test (8) on the own block, in the block metric (a scalar)
            reply["dtheta_scaled"] = self.beta * self.theta_prox * dtheta
        if self.outer_anderson:  # this client's block of the outer residual
            r = np.concatenate([self.mu - mu_in, self.nu - nu_in])
            self.outer_mem.append((r, self.mu.copy(), self.nu.copy()))
            del self.outer_mem[: -(self.outer_anderson + 1)]
            reply["gram"] = np.array([float(r @ q[0]) for q in self.outer_mem])
        return reply

    def _on_outer_aa(self, w, alpha, reset, inner: str = "admm", directions=None):
        """Outer Anderson step: the multipliers become ``sum_j alpha_j`` of the last
        outputs (projected on mu >= 0), and Algorithm 2 restarts at the combined ``w``."""
        alpha = np.asarray(alpha, dtype=float)
        if alpha.size:
            picked = self.outer_mem[-alpha.size :]
            self.mu = np.maximum(sum(a * q[1] for a, q in zip(alpha, picked)), 0.0)
            self.nu = sum(a * q[2] for a, q in zip(alpha, picked))
        if reset:
            self.outer_mem = []
        return self._inner_start_reply(w, inner, directions)

    def _on_xadmm_w(self, c, sigma, tol, budget=None):
        """One round of exact-admm (:mod:`~fedmodel.algorithms.proxal.exact_admm`): the
        exact minimiser of ``P_{i,k}(x) + (sigma/2)||x_shared - c||^2`` over this client's
        view (:mod:`~fedmodel.subproblems.conic_prox`); replies its shared part ``x_i``.
        Its own block, the epigraph pieces' multipliers (the solve's duals) and the cone
        multipliers stay here, with the point they belong to. ``budget``: the seconds the
        step may take, counted on this client's own clock from the message's arrival (the
        run's time limit); a step cut short replies the point it reached."""
        c = np.asarray(c, dtype=float)
        ns, p, s = self.ns, self.prox_weight, float(sigma)
        if self._exact_solver is None:
            self._exact_solver = exact_prox_solver(self.problem, self.solver_option)
        set_deadline(self._exact_solver, step_deadline(budget, f"party {self.name!r}"))
        center = (p * self.w_center + s * c) / (p + s)
        weight = p + s
        if self.owned:  # Algorithm 1's proximal share on its own block (weight p)
            n_own = self.program.layout.size - ns
            weight = np.r_[np.full(ns, p + s), np.full(n_own, self.theta_prox)]
            center = np.concatenate([center, self.theta_center])
        self.problem.set(sigma=weight, center=center, mu=[self.mu], nu=[self.nu])
        self.problem.cone[0] = self.cone
        start = self.u if self.u is not None else self._local(c, self.theta_at_w)
        report = self._exact_solver.solve(start, float(tol), self.max_local_iter)
        self.stats["local_solves"] += 1
        self.stats["local_iterations"] += report.iterations
        self._note_residual_gap(report.residual, tol)
        self.mu = np.array(self.problem.mu[0], dtype=float)
        self.nu = np.array(self.problem.nu[0], dtype=float)
        self.cone = np.array(self.problem.cone[0], dtype=float)
        self.cone_at_w = self.cone.copy()
        self.u = np.array(report.x, dtype=float)
        self.theta_at_w = self.u[ns:].copy()
        return {"x": self.u[:ns].copy()}

    def _note_residual_gap(self, residual: float, tol: float) -> None:
        """Keep the largest ratio of a local solve's residual to its tolerance. A solve
        that returned no point (an infeasible local subproblem: a party's own hard
        constraints with its terms' domains admit none) is counted in
        ``local_solves_without_point`` instead, so the diagnostic 'report' stays finite and
        the run ends on the server's verdict rather than on a refused reply."""
        gap = float(residual) / max(float(tol), 1e-300)
        if not np.isfinite(gap):
            self.stats["local_solves_without_point"] = (
                self.stats.get("local_solves_without_point", 0) + 1
            )
            return
        self.stats["max_residual_gap"] = max(self.stats["max_residual_gap"], gap)

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
        keep = self.anderson + 1
        self.aa_out, self.aa_res = self.aa_out[-keep:], self.aa_res[-keep:]
        return np.array([float(r @ q) for q in self.aa_res])

    def _on_admm_w(self, w, tol, alpha=None, reset=False):
        w = np.asarray(w, dtype=float)
        ns = self.ns
        if self.anderson:
            self._aa_input(alpha if alpha is not None else [], reset)
            u_in, lam_in = self.u_tilde.copy(), self.lam.copy()
        theta = self.u[ns:]
        self.theta_at_w = theta.copy()
        self.cone_at_w = self.cone.copy()  # the multipliers of the solve that gave theta
        # eps~ (eq. 18): grad phi_{i,t}(w^{t+1}) = grad P_i(w^{t+1}) + lambda^t, with the
        # own block at its current value (its part of the gradient bounded too)
        g = self._grad_P(self._local(w, theta))
        # (u^_i: the u_i with u~_i = u^_i + lambda_i / rho_i, also after Anderson steps)
        eps_tilde = float(np.abs(g[:ns] + self.lam - self._R(w - self.u_hat)).max())
        if self.owned:
            eps_tilde = max(eps_tilde, float(np.abs(g[ns:]).max()))
        if self.cone.size:  # hard cone constraints: their feasibility and complementarity
            # at (w^{t+1}, theta) too (the subdifferential is empty where they fail)
            x = self._local(w, theta)
            eps_tilde = max(eps_tilde, self.problem.functions[0].cone_residuals(x, self.cone)[0])
        # client step (15): phi = P_i(u) + <lambda, u - w> + rho/2 ||u - w||^2, written as the
        # merit function plus (sigma/2)||u - center||^2 with the prox share folded in.
        # over-relaxation (Eckstein, Bertsekas 1992; Boyd et al. 2011, 3.4.3) of the first
        # ADMM block (the server's w): the step and (16) use w^ = alpha w + (1 - alpha) u_i^t;
        # alpha = 1 is Algorithm 2
        a = self.relaxation
        w_step = w if a == 1.0 else a * w + (1.0 - a) * self.u_hat
        p = self.prox_weight
        sigma, center = self._local_quadratic(p * self.w_center + self._R(w_step) - self.lam)
        if self.owned:  # P_{i,k}'s prox term on theta (weight p) + proximal-ADMM term (rho)
            sigma_theta = self.theta_prox + self.rho
            theta_c = (self.theta_prox * self.theta_center + self.rho * theta) / sigma_theta
            center = np.concatenate([center, theta_c])
        self.problem.set(sigma=sigma, center=center, mu=[self.mu], nu=[self.nu])
        self.problem.cone[0] = self.cone
        report = self.solver.solve(self.u, float(tol), self.max_local_iter)
        self.cone = np.array(self.problem.cone[0], dtype=float)
        self.stats["local_solves"] += 1
        self.stats["local_iterations"] += report.iterations
        self._note_residual_gap(report.residual, tol)
        self.u = report.x
        u = self.u[:ns]
        self.u_hat = u.copy()  # the u_i behind u~_i (Anderson combines u~_i and lambda_i)
        self.lam = self.lam + self._R(u - w_step)  # (16)
        if self.balancing is not None and (self.M.is_identity or self.owned):
            self.balance(u, w)  # (counts admm_round)
        else:  # (a Hessian metric of the whole subproblem: rho_i = 1 is its natural scale)
            self.admm_round += 1
        # the metric follows the Hessian a few times per run of Algorithm 2 (rounds 4, 8,
        # 16, ...: finitely many changes, like rho's), at this client's own iterate u_i
        refreshed = (
            self.metric == "hessian"
            and self.admm_round in METRIC_REFRESH_ROUNDS
            and self._set_metric(self.u)
        )
        self.u_tilde = self.u_hat + self._R_inv(self.lam)  # (17)
        reply = {"u_tilde": self.u_tilde, "eps_tilde": eps_tilde}
        if refreshed:
            reply["metric"] = self.M.matrix
        if self.balancing is not None:
            reply["rho"] = self.rho
        if self.anderson:
            reply["gram"] = self._aa_record(u_in, lam_in)
        return reply

    def _local_quadratic(self, b: np.ndarray):
        """``(sigma, center)`` of the client step's quadratic ``(p/2)||u - w^k||^2 +
        <lambda, u> + (rho/2)||u - w||_M^2 = (1/2) u^T sigma u - b^T u + const`` on the shared
        variables: ``sigma = p I + rho M`` (a scalar with the identity metric; with an own
        block, block-diagonal with ``p + rho`` there) and ``center = sigma^(-1) b`` on the
        shared block. One factorisation per metric and rho, and the same ``sigma`` object
        meanwhile (the Newton backend keys its factors on it)."""
        p = self.prox_weight
        if self.M.is_identity:
            return p + self.rho, b / (p + self.rho)
        cached = self._center_solve
        if cached is None or cached[0] != self.rho or cached[1] is not self.M:
            n, n_own = self.ns, self.program.layout.size - self.ns
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
        ratio, factor, rounds = self.balancing
        self.admm_round += 1
        w_last, self.w_last = self.w_last, w.copy()
        if self.admm_round > rounds or w_last is None:
            return
        primal = float(np.linalg.norm(self.M.root(u - w)))  # (both in the metric M_i)
        dual = self.rho * float(np.linalg.norm(self.M.root(w - w_last)))
        if primal > ratio * dual:
            self.rho = min(self.rho * factor, self.rho_start * RHO_GROWTH)
        elif dual > ratio * primal:
            self.rho = max(self.rho / factor, self.rho_start / RHO_SHRINK)

    def _on_evaluate(self, w, mu=None, nu=None):
        if not self.owned:
            return super()._on_evaluate(w, mu, nu)
        mu = self.mu if mu is None else np.asarray(mu, dtype=float)
        nu = self.nu if nu is None else np.asarray(nu, dtype=float)
        x = self._local(np.asarray(w, dtype=float), self.theta_at_w)
        return party_evaluation(self.program, x, mu, nu, shared_only=True, cone=self.cone_duals())

    def _on_report(self):
        out = super()._on_report()
        if self.owned:  # the final write-back of the own block to the caller's variables
            out["owned"] = self.theta_at_w.copy()
        return out


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
