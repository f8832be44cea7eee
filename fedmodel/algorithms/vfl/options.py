"""Options of fair-vfl and fedbcd, and the step-size schedules (constant; Theorem 2).

Examples
--------
>>> opts = FairVFLOptions(eps=0.01, Q=4)
>>> sched = Schedule(opts)
>>> sched.eta(0), sched.c(5), sched.dual_step
(100.0, 0.001, 0.1)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from fedmodel.algorithms.options import RUNTIME_OPTIONS_DOC, RuntimeOptions, stop_only
from fedmodel.algorithms.vfl.problem import CONSTRAINTS
from fedmodel.errors import ModelError

LOCAL_UPDATES = ("exact", "random", "speeds")
SCHEDULES = ("constant", "theorem2")
BETA_CONVENTIONS = ("step", "inverse")


@dataclass
class FairVFLOptions(RuntimeOptions):
    """Options of ``fair-vfl`` (seed 002, Algorithms 1-2) and ``fedbcd``.

    The runtime options (from ``time_limit`` on) are those of every method on the driver
    (:func:`fedmodel.algorithms.driver.run_federated`); ``history`` rows are written at the
    monitored rounds.

    Parameters
    ----------
    eps : float
        Tolerance in ``|D(theta)| <= eps`` (ignored by fedbcd).
    constraint : {"loss", "tpr"}
        What ``D`` is (:class:`~fedmodel.algorithms.vfl.problem.ScoreFunctions`):
        ``"loss"``, seed 002's loss-based DEO ``lhat^a - lhat^b`` (Definition 1; the
        default); ``"tpr"``, the rate-based equal opportunity ``r^a - r^b`` with ``r^s`` the
        mean of ``sigmoid(z / tpr_temperature)`` over the positives of group ``s``, a smooth
        surrogate of ``TPR_a - TPR_b``. Either is a smooth function of the scores, so the
        messages and the algorithm are unchanged; ``res.extra["constraint"]`` reports the
        true TPR gap and the bound on its distance to the surrogate.
    tpr_temperature : float
        ``T > 0`` of the ``"tpr"`` surrogate.
    c, eta, beta : float
        Constant schedule (the paper's experiments: ``c_t = 1e-3``, ``eta_t = 100``, i.e. a
        primal step ``1/eta = 0.01``, ``beta = 0.1``).
    beta_convention : {"step", "inverse"}
        Dual step of (9): ``"step"`` is ``lambda += beta grad`` (eq. 9 literally);
        ``"inverse"`` is ``lambda += grad / beta`` (the proof's (25); notes section 3.6).
    schedule : {"constant", "theorem2"}
        ``"theorem2"``: ``c_t = beta t^{-1/4} / 2`` and ``eta_t`` the bound of Theorem 2,
        from ``lipschitz = (L, L12)`` (estimated by :func:`lipschitz_bounds` when None) and
        ``tau > 8``.
    Q : int
        Most local updates per party and round (Assumption 1).
    local_updates : {"exact", "random", "speeds"}
        ``"exact"``: every party makes exactly ``Q`` updates per round (the experiments);
        ``"random"``: party ``k`` draws its count uniformly from ``1..Q`` with its own
        generator seeded by ``(seed, k)``; ``"speeds"``: party ``k`` runs at relative speed
        ``speeds[k]`` in ``(0, 1]`` on a deterministic clock, completing
        ``floor((t+1) Q s_k) - floor(t Q s_k)`` updates in round ``t`` (at least one).
    speeds : sequence of float, optional
        Per-party speeds for ``local_updates="speeds"``.
    delays : sequence of int, optional
        Asynchrony (deterministic, on every backend): party ``k``'s update arrives
        ``delays[k]`` rounds late. A party is sent the scores and ``lambda`` only when it is
        idle; its reply reaches the server's sum ``delays[k]`` rounds later (until then the
        server uses its previous partial scores, and the other parties compute on those
        stale scores), and it gets its next job the round after. ``None`` or all zeros:
        the synchronous rounds of eq. (9)-(11).
    asynchronous : bool
        Real asynchrony on the runtime: each round the server posts its job to every idle
        party and uses the replies that are ready (at least ``min_replies``); a party still
        computing keeps its last block in the sum (used stale by the others and
        ``lambda``), its reply counts in the round it arrives. On the processes and Ray
        runtimes the parties compute while the server goes on (give each party its own
        worker); on the serial runtime every reply is ready at once (the synchronous
        iterates). The server drains the work in flight at monitored rounds
        (``monitor_every``), checkpoints and the certificate: raise ``monitor_every`` to
        let parties run ahead. Not with ``delays`` (their deterministic simulation).
    min_replies : int
        Replies the server waits for in an asynchronous round (``1..K``; ``K``: the
        synchronous rounds).
    seed : int
        Seed of the parties' generators (``"random"``).
    max_rounds : int
        Communication rounds at most.
    tol : float
        Stop when the stationarity gap (12) is ``<= tol`` (0: run ``max_rounds``).
    kkt_tol : float
        Tolerance of the final local KKT certificate (status ``"optimal"``).
    monitor_every : int
        Rounds between monitoring exchanges (diagnostic channel: the gap (12), the
        regulariser); the history has one row per monitored round. With ``tol > 0`` the
        gap is checked at those rounds.
    reveal_parameters : bool
        At the end, parties reveal ``theta_k`` on the diagnostic channel so that ``res.x``
        holds the model (a simulation convenience; False keeps ``theta_k`` with its party
        and ``res.x`` empty).
    lambda0 : sequence of 2 floats
        Initial multipliers (the paper: 0).
    """

    eps: float = 0.01
    constraint: str = "loss"
    tpr_temperature: float = 0.25
    c: float = 1e-3
    eta: float = 100.0
    beta: float = 0.1
    beta_convention: str = "step"
    schedule: str = "constant"
    lipschitz: tuple[float, float] | None = None
    tau: float = 9.0
    Q: int = 1
    local_updates: str = "exact"
    speeds: tuple[float, ...] | None = None
    delays: tuple[int, ...] | None = None
    asynchronous: bool = False
    min_replies: int = 1
    seed: int = 0
    max_rounds: int = stop_only(1000)
    tol: float = stop_only(0.0)
    kkt_tol: float = stop_only(1e-4)
    monitor_every: int = 1
    reveal_parameters: bool = True
    lambda0: tuple[float, float] = (0.0, 0.0)

    @property
    def eps1(self) -> float:
        """The driver's stationarity tolerance: ``kkt_tol``."""
        return float(self.kkt_tol)

    @property
    def eps2(self) -> float:
        """The driver's feasibility tolerance: ``kkt_tol``."""
        return float(self.kkt_tol)

    def validate(self, problem, method: str) -> None:
        K = problem.K
        if self.eps < 0:
            raise ModelError(f"eps must be >= 0, got {self.eps}")
        if self.constraint not in CONSTRAINTS:
            raise ModelError(f"constraint must be one of {CONSTRAINTS}, got {self.constraint!r}")
        if not self.tpr_temperature > 0:
            raise ModelError(f"tpr_temperature must be > 0, got {self.tpr_temperature}")
        if self.c < 0 or self.eta <= 0 or self.beta <= 0:
            raise ModelError(
                f"need c >= 0, eta > 0, beta > 0 (got {self.c}, {self.eta}, {self.beta})"
            )
        if self.beta_convention not in BETA_CONVENTIONS:
            raise ModelError(f"beta_convention must be one of {BETA_CONVENTIONS}")
        if self.schedule not in SCHEDULES:
            raise ModelError(f"schedule must be one of {SCHEDULES}")
        if self.schedule == "theorem2" and self.tau <= 8:
            raise ModelError(f"Theorem 2 needs tau > 8, got {self.tau}")
        if int(self.Q) != self.Q or self.Q < 1:
            raise ModelError(f"Q must be a positive integer, got {self.Q}")
        if self.local_updates not in LOCAL_UPDATES:
            raise ModelError(f"local_updates must be one of {LOCAL_UPDATES}")
        if self.local_updates == "speeds":
            if self.speeds is None or len(self.speeds) != K:
                raise ModelError(f"local_updates='speeds' needs one speed per party ({K})")
            if not all(0 < s <= 1 for s in self.speeds):
                raise ModelError(f"speeds must lie in (0, 1], got {list(self.speeds)}")
        if self.max_rounds < 1 or self.monitor_every < 1:
            raise ModelError("max_rounds and monitor_every must be >= 1")
        if self.delays is not None:
            d = list(self.delays)
            if len(d) != K or any(int(x) != x or x < 0 for x in d):
                raise ModelError(
                    f"delays must be {K} non-negative integers (one per party), got {d}"
                )
        if self.asynchronous and self.delays is not None and any(self.delays):
            raise ModelError(
                "asynchronous=True runs the parties really asynchronously; delays simulate "
                "that deterministically: give one or the other"
            )
        if int(self.min_replies) != self.min_replies or not 1 <= self.min_replies <= K:
            raise ModelError(f"min_replies must be an integer in 1..{K}, got {self.min_replies}")
        if len(self.lambda0) != 2 or min(self.lambda0) < 0:
            raise ModelError(f"lambda0 must be two non-negative numbers, got {self.lambda0}")

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if k != "callback"}


FairVFLOptions.__doc__ += RUNTIME_OPTIONS_DOC


class Schedule:
    """``c_t``, ``eta_t`` and the dual step of round ``t`` (shared by server and parties:
    both know the options, nothing about it travels)."""

    def __init__(self, opts: FairVFLOptions, K: int = 1, lipschitz: tuple[float, float] = (1, 1)):
        self.opts = opts
        self.K = K
        self.L, self.L12 = tuple(opts.lipschitz) if opts.lipschitz is not None else tuple(lipschitz)
        self.dual_step = opts.beta if opts.beta_convention == "step" else 1.0 / opts.beta

    def c(self, t: int) -> float:
        if self.opts.schedule == "constant":
            return float(self.opts.c)
        return float(self.opts.beta * max(t, 1) ** -0.25 / 2.0)

    def eta(self, t: int) -> float:
        if self.opts.schedule == "constant":
            return float(self.opts.eta)
        L, L12, KQ, tau = self.L, self.L12, self.K * self.opts.Q, self.opts.tau
        beta = self.opts.beta
        return float(
            (L**2 * (KQ + 2) * (KQ - 1) + 2 * (L + 1)) / 4
            + L12**2 * KQ * (1 + 32 * tau * np.sqrt(t)) / (2 * beta)
        )


def lipschitz_bounds(
    problem, lambda_bound: float = 1.0, constraint: str = "loss", tpr_temperature: float = 0.25
) -> tuple[float, float]:
    """Bounds on Assumption 2's ``L`` and ``L12`` for the logistic model.

    ``L <= ||X||^2 / (4 n) + 2 l2 + lambda_bound kappa (||X_{N^a}||^2 / |N^a| +
    ||X_{N^b}||^2 / |N^b|)`` and ``L12 <= sqrt(2) g (mean_{N^a} ||X_i|| + mean_{N^b}
    ||X_i||)`` (``|lam_1 - lam_2| <= lambda_bound``), with ``kappa`` and ``g`` bounds on
    the second and first derivatives of the constrained per-sample function: the logistic
    loss (``constraint="loss"``: ``kappa = 1/4``, ``g = 1``) or ``sigmoid(z / T)``
    (``"tpr"``: ``kappa = 1 / (6 sqrt(3) T^2)``, ``g = 1 / (4 T)``). Centralized by design:
    it reads every block (a set-up computation for the theoretical schedule only).
    """
    X = np.hstack(problem.blocks)
    f = problem.score_functions()
    if constraint == "tpr":
        kappa, g = 1.0 / (6.0 * np.sqrt(3.0) * tpr_temperature**2), 1.0 / (4.0 * tpr_temperature)
    else:
        kappa, g = 0.25, 1.0
    norm2 = np.linalg.norm(X, 2) ** 2
    na = np.linalg.norm(X[f.in_a], 2) ** 2 / f.size_a
    nb = np.linalg.norm(X[f.in_b], 2) ** 2 / f.size_b
    L = norm2 / (4 * problem.n) + 2 * problem.l2 + lambda_bound * kappa * (na + nb)
    rows = np.linalg.norm(X, axis=1)
    L12 = np.sqrt(2.0) * g * (rows[f.in_a].mean() + rows[f.in_b].mean())
    return float(L), float(L12)
