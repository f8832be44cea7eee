"""prox-al's inner solver on non-smooth and conic models: consensus ADMM with exact steps.

``inner_solver="exact-admm"`` (the adaptive default on every convex model that the
quasi-Newton inner solver cannot take: epigraph or cone terms, party-owned variables, a
non-smooth ``h``, cone constraints, terms with a restricted domain) minimises
Algorithm 1's subproblem

    l_k(w) = P_{0,k}(w) + h(w) + sum_i P_{i,k}(w)

(seed 000 eqs. 10-11: each party's terms, the augmented-Lagrangian terms of the
constraints the user wrote with ``mu^k``, each party's share of the proximal term) by
consensus ADMM in scaled form (Boyd et al. 2011, Sec. 7.1), one round per iteration:

1. the server sends client ``i`` its centre ``c_i = z - u_i`` and the penalty ``sigma``;
2. client ``i`` returns ``x_i = argmin P_{i,k}(x) + (sigma/2)||x - c_i||^2`` over its whole
   view (its own variables and epigraph/cone auxiliaries stay on the client), solved
   **exactly** (:mod:`fedmodel.subproblems.conic_prox`: its non-smooth terms as written,
   with their epigraph pieces as hard constraints, in a cvxpy problem compiled once);
3. the server takes ``z+ = argmin P_{0,k}(z) + h(z) + (n sigma/2)||z - mean_i(x_i + u_i)||^2``
   (its own exact step), then ``u_i += x_i - z+``.

Only ``w``-sized vectors cross (``c_i`` down, ``x_i`` up: ``O(d)`` floats per client and
round). The server keeps the scaled duals ``u_i`` itself, so the whole iteration state
``(z, u_1, ..., u_n)`` is the server's, and it accelerates the ADMM map with safeguarded
type-II Anderson acceleration (:mod:`fedmodel.algorithms.proxal.anderson`; memory
``anderson``; its residual in ADMM's contraction norm, :meth:`ExactADMM.fixed_point_residual`)
and adapts ``sigma`` to the primal and dual residuals relative to the sizes
of their terms (OSQP's rule, Stellato et al. 2020; with a ``rb_ratio`` of the user's, Boyd
et al. 2011, Sec. 3.4.1's balancing at that ratio; ``adaptive_rho``, ``rb_rounds``, within
``[rho / 1000, 1000 rho]``; ``rho`` is the starting ``sigma``; the relative rule in every
round, Boyd's in the first ``rb_rounds``). A consensus gap that settles while ``sigma`` is
below the top of that range raises ``sigma`` tenfold and the range's bottom with it
(:data:`STALL_RAISE`): only at the top is it read as a sign of infeasibility. The penalty
and the duals are carried over to the next outer iteration (warm start), ``z`` restarts at
``w^k``.

Stopping (the analogue of Algorithm 2's bound (19)): the clients' optimality conditions
give ``-sigma (x_i - c_i) in d P_{i,k}(x_i)``, the server's ``sigma sum_i u_i+ in
d(P_{0,k} + h)(z+)``; their sum is ``-n sigma (z+ - z)``. The inner solve stops when the dual
residual ``n sigma ||z+ - z||_inf`` and the primal residual ``max_i ||x_i - z+||_inf`` are
both at most ``tau_k``. In the last stage of the outer loop it also stops where the
certificate holds at its iterate, checked on the way in the requests and replies of the
next round (``xadmm_check``: a check that fails costs no round; :meth:`ExactADMM.solve`).

Partial participation (option ``participation``): each round goes to a random sample of
the clients (:class:`~fedmodel.algorithms.topology.Coordination`, dald's random
coordination, with ``random_state``) and the server's step uses every client's latest
reply: the randomized block-coordinate form of the same iteration
(:meth:`ExactADMM.solve_sampled`; Iutzeler et al. 2013, Combettes and Pesquet 2015), with
its penalty changed once per epoch and no Anderson acceleration. The requests that start
an inner solve and the certificate still reach every client.

Stragglers (option ``quorum``, on a runtime with a non-blocking exchange): the same
block-coordinate iteration with each client's step posted, the server's step taken once a
quorum of replies arrived, a late reply applied against the point it was computed from, and
a step ``max_delay`` rounds old waited for: ARock's asynchronous iteration with a bounded
delay (Peng, Xu, Yan and Yin 2016; :meth:`ExactADMM.solve_sampled`).

Examples
--------
>>> import numpy as np
>>> state = ExactADMM(sigma=1.0, anderson=5, balancing=None, max_inner=10)
>>> state.get_state()["sigma"]
1.0
"""

from __future__ import annotations

import dataclasses
import itertools
import operator
import time
from typing import Any

import numpy as np

from fedmodel.algorithms.common import budget_field, step_budgets
from fedmodel.algorithms.messages import EVALUATION_FIELDS, OBJECTIVE_SCALE, W
from fedmodel.algorithms.protocol import StepReport, _consume, plans_generation
from fedmodel.algorithms.proxal.anderson import AndersonState
from fedmodel.algorithms.proxal.cohorts import check_forms, cohort_of, glm_structure, stack_row
from fedmodel.algorithms.proxal.inner import InnerClient, InnerOutcome, InnerSolver
from fedmodel.algorithms.proxal.obstacles import (
    exact_eps_ok,
    inequality_walls,
    newton_obstacle,
    restricted_domain_party,
)
from fedmodel.algorithms.topology import Coordination
from fedmodel.certificate.infeasibility import farkas_point
from fedmodel.runtime.rows import RoundReplies, Rows, payloads_of
from fedmodel.runtime.schema import Field, MessageSpec
from fedmodel.subproblems.conic_prox import exact_prox_solver, internal_rows
from fedmodel.subproblems.merit import set_deadline, step_deadline

#: residual balancing keeps sigma within [start / SIGMA_RANGE, start * SIGMA_RANGE]
SIGMA_RANGE = 1e3
#: local (party) solves are asked for this fraction of tau_k, at least LOCAL_FLOOR
LOCAL_FRACTION, LOCAL_FLOOR = 1e-2, 1e-9
#: the primal residual's target, as a fraction of tau_k. 1 is safe because the certificate
#: puts the clients' epigraph pieces at their partial minimiser at z
#: (certificate/auxiliary.py) rather than at (z, their own block), which would be off by
#: about ||a_j||_1 times the primal residual; a smaller fraction costs rounds on the full
#: sizes (svm-20, lad-20, quantile-5) without changing the verdict
PRIMAL_FRACTION = 1.0


#: an infeasible model: ADMM's consensus gap ``x_i - z`` converges to a nonzero constant
#: (its limit certifies infeasibility, Banjac et al. 2019) while ``z`` stops moving; the
#: inner solve reports it when, after INFEASIBLE_WINDOW rounds at a fixed sigma, the
#: primal residual changed by at most INFEASIBLE_CHANGE (relative) over that many rounds,
#: stays above tau_k, and the dual residual is below INFEASIBLE_CHANGE times it
INFEASIBLE_WINDOW, INFEASIBLE_CHANGE = 50, 1e-3
#: the same signature at a penalty below the top of its range is also that of a penalty
#: too small for the consensus (the primal residual a thousand times the dual one): before
#: it is read as infeasibility, sigma is raised by this factor and kept at least there
#: (the relative rule measures the consensus gap against ||x_i||, which one large
#: coordinate can dominate: Maros-Meszaros PRIMALC1, a free variable at 2e4, drove sigma
#: to its floor and the gap of the other coordinates settled at 0.16 on a feasible model)
STALL_RAISE = 10.0
#: the Farkas certificate is tried within an inner solve once the primal residual has
#: settled over this many rounds at a fixed sigma (relative change at most
#: INFEASIBLE_CHANGE) above its target, then again after 1, 2, 4, ... more rounds: the
#: dual residual of an infeasible model falls only like 1/t, and the clients' points,
#: which Anderson's steps extrapolate every few rounds, reach a certificate long before
#: it meets INFEASIBLE_WINDOW's test. A failed try costs one round and proves nothing
#: wrong: the parties check the certificate on their terms
FARKAS_WINDOW = 10
#: in an inner solve whose target has reached eps (the last stage of the outer loop), the
#: certificate is evaluated at the inner iterate from round 4 on, when the dual residual
#: is at most eps (in the targets' unit), then again from twice that round on, and the
#: run stops where it holds: the consensus residuals that stop the inner solve stall
#: above their target of a fraction of eps for tens of rounds while the certificate at the
#: iterate already holds (LAD and quantile regression, whose objectives are below 1: the
#: scale-free certificate held within 5 rounds of the last inner solve's 60)
CERTIFY_FIRST = 4

#: exact-admm's penalty: Boyd's residual balancing at ``rb_ratio`` when the user sets it;
#: left at its default (10, Algorithm 2's), OSQP's relative rule (ExactADMM.penalty),
#: changing sigma when it moves by more than RELATIVE_CHANGE (below OSQP's 5, which takes
#: more rounds on lad-20, svm-german and quantile-5). The relative rule takes fewer rounds
#: than Boyd's balancing on most quick sizes (svm-german, kl-simplex, svm-20) and more on
#: a few (lad-20, quantile-5, bpdn); docs/performance.md: a spectral penalty and a bounded
#: range take more rounds
RELATIVE_CHANGE = 3.0
#: under partial participation the relative rule is read once an epoch (``ceil(m / k)``
#: rounds) and takes a change of more than this factor: its residuals mix fresh and stale
#: replies, and at RELATIVE_CHANGE the penalty stayed at its start while the relative dual
#: residual read 5-8 times the primal one (least squares and logistic loss over 100
#: clients, 10 a round: 671 and 506 rounds at 3, 382 and 274 at 1.5)
SAMPLED_CHANGE = 1.5


def exact_balancing(options) -> tuple[float | None, float, int] | None:
    """Penalty adaptation ``(ratio, factor, rounds)`` of exact-admm: the options'
    (``adaptive_rho``, ``rb_ratio``, ``rb_factor``, ``rb_rounds``), with ratio None (OSQP's
    relative rule, :meth:`ExactADMM.penalty`) in place of ``rb_ratio``'s default in the
    adaptive variant."""
    balancing = options.balancing
    if balancing is None or not options.adaptive:
        return balancing
    default = type(options).__dataclass_fields__["rb_ratio"].default
    ratio = None if options.rb_ratio == default else float(options.rb_ratio)
    return (ratio, balancing[1], balancing[2])


def step_tolerances(tau: float, sigma: float, m: int, prox: float) -> tuple[float, float]:
    """The tolerances ``(clients', server's)`` of the exact steps of a round that targets
    ``tau`` with penalty ``sigma``, ``m`` clients and proximal share ``prox``.

    A step's tolerance bounds the residual of its optimality condition, and the inner
    solve's measures add those residuals up in two ways. The consensus residuals measure
    points: a step's point is off by its residual over the step's strong convexity,
    ``prox + sigma`` on a client and ``prox + m sigma`` on the server. The subproblem's
    stationarity at the consensus is the sum of the parties' conditions, so it carries the
    sum of the ``m`` clients' residuals. Each party's tolerance is the budget
    ``LOCAL_FRACTION * tau`` times the smaller of its share of that sum (``1 / m`` on a
    client, 1 on the server) and its strong convexity (at least ``LOCAL_FLOOR``): its point
    stays within the budget and the clients' residuals together do too.

    With many clients whose terms are shares of one objective (a loss over the pooled
    rows, the proximal term's ``1/(n+1)`` shares) each client's gradient is about ``1/m``
    of the objective's. A tolerance of the budget itself would then be above a client's
    gradient: its step may return its centre or a point off by the whole move, the
    consensus residual is that noise, and the relative penalty rule, which reads the
    residuals against the points' sizes, keeps a penalty far above the shares' curvature
    while the dual residual stays above ``tau``. With the ``1 / m`` share the steps follow
    the shares' gradients, and when the residual balancing drives ``sigma`` to the order
    of ``1/m`` the strong convexity keeps each point within the budget.

    Examples
    --------
    >>> step_tolerances(0.1, 1.0, 1, 0.0)
    (0.001, 0.001)
    >>> [float(f"{t:.3g}") for t in step_tolerances(0.1, 0.001, 1000, 0.0)]
    [1e-06, 0.001]
    >>> [float(f"{t:.3g}") for t in step_tolerances(0.1, 1.0, 1000, 0.0)]
    [1e-06, 0.001]
    """
    budget = LOCAL_FRACTION * tau
    client = budget * min(1.0 / max(m, 1), prox + sigma)
    server = budget * min(1.0, prox + m * sigma)
    return max(client, LOCAL_FLOOR), max(server, LOCAL_FLOOR)


class ExactADMM:
    """The server's side of ``inner_solver="exact-admm"`` (see the module docstring).

    Parameters
    ----------
    sigma : float
        Starting ADMM penalty.
    anderson : int
        Anderson memory (0: off).
    balancing : (ratio, factor, rounds) or None
        Adaptation of ``sigma`` (:meth:`penalty`) in the first ``rounds`` rounds of each
        inner solve, or with ratio None (OSQP's relative rule) in every round; None: fixed
        ``sigma``.
    max_inner : int
        Rounds per inner solve.
    relaxation : float
        Over-relaxation of the consensus step (1: none).
    sampler : Coordination, optional
        Partial participation: each round's clients are ``sampler``'s random draw
        (:meth:`solve_sampled`); None: every client in every round.
    quorum : int, optional
        Stragglers: on a runtime with a non-blocking exchange, a round's server step waits
        for this many replies only (:meth:`solve_sampled`); None: for every client of
        the round.
    max_delay : int
        Under ``quorum``, the rounds a posted step may stay out before the server waits
        for it.
    """

    #: the certificate's check at an inner iterate rides on the next round's requests
    #: (False: a diagnostic round of its own, as under a privacy plan)
    carry = True

    def __init__(
        self,
        sigma: float,
        anderson: int,
        balancing,
        max_inner: int,
        relaxation: float = 1.0,
        sampler: Coordination | None = None,
        quorum: int | None = None,
        max_delay: int = 1,
    ):
        self.sigma = self.sigma_start = float(sigma)
        # the least sigma since a settled consensus gap raised it (:data:`STALL_RAISE`)
        self.sigma_least = self.sigma_start / SIGMA_RANGE
        self.sampler = sampler
        self.sampled_rounds = self.client_steps = 0
        self.quorum, self.max_delay = quorum, int(max_delay)
        # under quorum: replies applied after their round, their largest delay, rounds in
        # which the server waited for a step older than max_delay
        self.late = [0, 0, 0]
        self.relaxation = float(relaxation)
        self.anderson = int(anderson)
        self.balancing = balancing
        self.max_inner = int(max_inner)
        self.duals = {}
        self.rejections = 0
        # the certificate held at the point that the last inner solve's last round carried
        # (:meth:`solve`): the clients take that round's step back at the next evaluation
        self.held = False

    # -- the scaled duals u_i (the next inner solve's warm start) ----------------------------
    @property
    def duals(self) -> dict[str, np.ndarray]:
        """The clients' scaled duals ``u_i`` by name (made from the rows they are kept as,
        :meth:`keep_duals`, when first read)."""
        if self._duals is None:
            names, U = self._duals_rows
            self._duals = dict(zip(names, U))
        return self._duals

    @duals.setter
    def duals(self, value: dict[str, np.ndarray]) -> None:
        self._duals, self._duals_rows = value, None

    def keep_duals(self, names: list[str], U: np.ndarray) -> None:
        """The duals are the rows of ``U``, client ``names[i]``'s row ``i``."""
        self._duals, self._duals_rows = None, (names, U)

    def duals_of(self, names: list[str], ns: int) -> np.ndarray:
        """The duals of ``names`` as rows (zeros for a client without), a new array."""
        kept = self._duals_rows
        if kept is not None and kept[0] == names:
            U = np.array(kept[1], dtype=float)
        elif not self.duals:
            U = np.zeros((len(names), ns))
        else:
            U = np.array([self.duals.get(n, np.zeros(ns)) for n in names], dtype=float)
        return U.reshape(len(names), ns)

    # -- state (plain values: checkpoints) -----------------------------------------------------
    def get_state(self) -> dict:
        """Its state as plain values; duals kept as rows (:meth:`keep_duals`) as the
        clients' names and the rows (``dual_rows``), else by name (``duals``)."""
        kept = self._duals_rows
        state = {
            "sigma": self.sigma,
            # (the driver copies a mark)
            "duals": {} if kept is not None else dict(self.duals),
            "rejections": self.rejections,
            "held": self.held,
            "sigma_least": self.sigma_least,
        }
        if self.sampler is not None:  # (its generator: a resumed run draws the same clients)
            state["sampler"] = self.sampler.get_state()
            state["counts"] = [self.sampled_rounds, self.client_steps]
        if self.quorum is not None:
            state["late"] = list(self.late)
        if kept is not None:
            state["dual_rows"] = [list(kept[0]), kept[1]]
        return state

    def set_state(self, state: dict) -> None:
        self.sigma = float(state["sigma"])
        self.duals = {k: np.array(v, dtype=float) for k, v in state["duals"].items()}
        if "dual_rows" in state:
            names, U = state["dual_rows"]
            self.keep_duals([str(n) for n in names], np.array(U, dtype=float))
        self.rejections = int(state["rejections"])
        self.held = bool(state.get("held", False))
        self.sigma_least = float(state.get("sigma_least", self.sigma_start / SIGMA_RANGE))
        if self.sampler is not None and "sampler" in state:
            self.sampler.set_state(state["sampler"])
            self.sampled_rounds, self.client_steps = (int(c) for c in state["counts"])
        if self.quorum is not None and "late" in state:
            self.late = [int(c) for c in state["late"]]

    # -- one inner solve ----------------------------------------------------------------------
    def solve(self, server, runtime, tau: float, deadline: float | None):
        """Minimise ``l_k`` from ``w^k = server.x`` to ``tau``; returns the server's
        :class:`~fedmodel.algorithms.proxal.inner.InnerOutcome`.

        In its last stage (:meth:`ExactInner.certifies_inner`) the certificate is checked at
        the inner iterate on the way (:data:`CERTIFY_FIRST`). A check decided at the end of
        round ``t`` rides on round ``t + 1`` (``xadmm_check`` instead of ``xadmm_w``): each
        client evaluates at round ``t``'s point with the multipliers of its last step, then
        takes its step, and replies both; the server judges the certificate before its own step. Where it
        holds, the inner solve returns round ``t``'s point, duals and penalty (as after a
        diagnostic round of its own; :attr:`held` has the clients take the step back at
        the next evaluation); where it fails, round ``t + 1`` goes on as if there had been
        no check. A check takes a diagnostic round of its own under a privacy plan (its
        certificate round collects sums), when the inner solve ends after round ``t`` (its
        deadline, ``max_inner``) and with :attr:`carry` off."""
        self.held = False
        if self.sampler is not None or (self.quorum is not None and runtime.supports_async):
            return self.solve_sampled(server, runtime, tau, deadline)

        ns = server.ns
        w_center = server.x
        z = w_center[:ns].copy()
        names = list(runtime.alive)
        U = self.duals_of(names, ns)  # (the scaled duals, a row per client of ``names``)
        aa = AndersonState(self.anderson) if self.anderson else None
        outputs: list[tuple[np.ndarray, np.ndarray]] = []
        residuals: list[np.ndarray] = []
        rejected = 0
        bound, residual, w = np.inf, np.inf, w_center
        primals: list[float] = []  # (the infeasibility monitor)
        farkas = [0, 1]  # (the round of the next Farkas try, the wait after it)
        certify_next = CERTIFY_FIRST if server.certifies_inner(tau) else None
        carry = certify_next is not None and self.carry and server.carries_evaluation()
        # a certificate check decided at the end of the last round, carried by this one's
        # requests: what the inner solve returns and keeps when it holds
        check: tuple[InnerOutcome, tuple[list[str], np.ndarray], float, int] | None = None
        fixed_since = 0  # the round since which sigma has not changed
        last_round = 0.0  # seconds of the last round: one more is not begun if it would end
        for t in range(self.max_inner):  # after the deadline (the rounds are the time unit)
            t_round = time.perf_counter()
            sigma = self.sigma
            runtime.next_round()
            tol, tol_server = step_tolerances(tau, sigma, len(names), server.prox_weight)
            C = z - U
            fields = {"c": Rows(C), "sigma": sigma, "tol": tol}
            budget = budget_field(runtime, names, deadline)
            if budget is not None:
                fields["budget"] = budget
            if check is None:
                replies = runtime.broadcast_rows("xadmm_w", fields, to=names)
            else:  # (message by message: the evaluations' fields differ between clients)
                fields.update(server.evaluation_request(check[0].w))
                requests = dict(zip(names, payloads_of(fields, len(names))))
                sent = runtime.broadcast("xadmm_check", requests.__getitem__, to=names)
                replies = RoundReplies(names, messages=sent)
            if list(replies) != names:  # (a failed client stops the run: never here)
                raise RuntimeError("exact-admm: the replies are not the round's clients'")
            if check is not None:
                # the certificate at the last round's point, the clients' evaluations made
                # before this round's step; where it holds the inner solve ends there, as
                # after a round of its own, and the clients take this step back
                outcome, duals, sigma_then, rejections = check
                check = None
                if server.certified_by(outcome.w, replies):
                    self.keep_duals(*duals)
                    self.sigma, self.rejections = sigma_then, rejections
                    self.held = True
                    return outcome
            X = replies.stack("x").reshape(len(names), ns)
            m = len(names)
            if self.relaxation != 1.0:  # over-relaxation (Boyd et al. 2011, Sec. 3.4.3)
                a = self.relaxation
                X_hat = a * X + (1.0 - a) * z
            else:
                X_hat = X
            avg = np.add.reduce(X_hat + U, axis=0) / m  # (row by row, in client order)
            w, residual = server.exact_step(avg, m * sigma, tol_server, deadline)
            z_new = w[:ns]
            U_new = U + X_hat - z_new
            primal = float(np.abs(X - z_new).max(initial=0.0))
            dual = m * sigma * float(np.abs(z_new - z).max(initial=0.0))
            bound = max(primal / PRIMAL_FRACTION, dual)
            if bound <= tau:
                self.keep_duals(names, U_new)
                return InnerOutcome(w, t + 1, bound, True, residual)
            primals.append(primal)
            raised = False
            if (
                server.options.monitor
                and server.may_be_infeasible  # (no constraint, no box: always feasible)
                and t - fixed_since >= INFEASIBLE_WINDOW
                and self.infeasible(primals, dual, tau)
            ):
                top = self.sigma_start * SIGMA_RANGE
                if self.balancing is None or self.sigma >= top:
                    self.keep_duals(names, U_new)
                    return InnerOutcome(w, t + 1, bound, False, residual, stalled=True)
                new = self.sigma_least = min(self.sigma * STALL_RAISE, top)
                U_new = U_new * (self.sigma / new)  # (scaled duals u = y / sigma)
                self.sigma, fixed_since, raised = new, t + 1, True
            settled = t - fixed_since
            proven = self.farkas_when_due(server, runtime, w, primals, tau, settled, farkas, t)
            if proven is not None:
                self.keep_duals(names, U_new)
                return InnerOutcome(w, t + 1, bound, False, residual, certificate=proven)
            certify = (
                certify_next is not None
                and t + 1 >= certify_next
                and dual <= server.host.eps1_units  # (the Lagrangian's gradient, about)
            )
            last_round = time.perf_counter() - t_round
            ends = deadline is not None and time.perf_counter() + last_round > deadline
            if certify:
                certify_next = 2 * (t + 1)
                if carry and not ends and t + 1 < self.max_inner:  # (the next round takes it)
                    outcome = InnerOutcome(w, t + 1, bound, True, residual, certified=True)
                    check = (outcome, (names, U_new), self.sigma, self.rejections)
                elif server.certified_at(runtime, w):  # (a diagnostic round of its own)
                    self.keep_duals(names, U_new)
                    return InnerOutcome(w, t + 1, bound, True, residual, certified=True)
                else:
                    last_round = time.perf_counter() - t_round
                    ends = deadline is not None and time.perf_counter() + last_round > deadline
            if ends:
                self.keep_duals(names, U_new)
                return InnerOutcome(w, t + 1, bound, False, residual, timed_out=True)
            changed = False
            # (Boyd's balancing in the first rb_rounds rounds; the relative rule in every
            # round, as OSQP: with it in the first 50 only, lad-20's consensus crawled at a
            # fixed sigma until the infeasibility check read it as infeasible, 407 rounds)
            if raised:
                changed = True
            elif self.balancing is not None and (
                t < self.balancing[2] or self.balancing[0] is None
            ):
                new = self.penalty(sigma, z, z_new, X, U_new)
                if new != sigma:  # scaled duals u = y / sigma
                    U_new = U_new * (sigma / new)
                    self.sigma = new
                    changed = True
                    fixed_since = t + 1
            if aa is None:
                z, U = z_new, U_new
                continue
            # Anderson on the map (z, u) -> (z+, u+): the newest residual's Gram row
            g = self.fixed_point_residual(z, z_new, U, U_new)
            outputs.append((z_new, U_new))
            residuals.append(g)
            keep = self.anderson + 1
            del outputs[:-keep], residuals[:-keep]
            row = np.array([float(g @ q) for q in residuals])
            alpha, reset = aa.observe(row, changed)
            self.rejections += aa.rejections - rejected
            rejected = aa.rejections
            if alpha.size:
                picked = outputs[-alpha.size :]
                z = sum(a * o[0] for a, o in zip(alpha, picked))
                U = sum(a * o[1] for a, o in zip(alpha, picked))
            else:
                z, U = z_new, U_new
            if reset:
                outputs.clear()
                residuals.clear()
        self.keep_duals(names, U)
        return InnerOutcome(w, self.max_inner, bound, False, residual)

    def solve_sampled(self, server, runtime, tau: float, deadline: float | None):
        """:meth:`solve` with partial participation or stragglers: each round only the
        sampler's clients (every client without one) take their exact step; the server's
        step uses every client's latest reply.

        The iteration is consensus ADMM written as Douglas-Rachford splitting on the state
        ``zeta_i = z + u_i`` of each client (the full rounds of :meth:`solve` are this
        iteration with every block moving); a round moves the sampled blocks only:
        client ``i`` gets the centre ``2 z - zeta_i`` (``= z - u_i``), replies ``x_i``, and
        ``zeta_i += alpha (x_i - z)``; the server then takes ``z+`` at the mean of all
        ``zeta_i``. This randomized block-coordinate iteration of a fixed averaged
        operator converges almost surely when every client is drawn with a positive
        probability (Iutzeler et al., IEEE CDC 2013; Combettes and Pesquet, SIAM J.
        Optim. 2015): the penalty changes only at the end of an epoch of ``ceil(m / k)``
        rounds within the first ``rb_rounds`` epochs, Anderson acceleration is off.

        Stragglers (``quorum``, on a runtime with a non-blocking exchange): the round's
        clients that are not still computing an earlier step are posted
        (:meth:`~fedmodel.runtime.base.Runtime.post`), and the server's step waits for
        ``quorum`` replies and for every step posted ``max_delay`` or more rounds ago
        (:meth:`gather`). A late reply moves its block by the increment of the point it was
        computed from, ``zeta_i += alpha (x_i - z_then) sigma_then / sigma``: the
        asynchronous block-coordinate iteration of ARock (Peng, Xu, Yan and Yin, SIAM J.
        Sci. Comput. 38(5), 2016) on the same operator, with the delay bound ``max_delay``
        and the step :meth:`block_step`. The steps still out when the inner solve ends are
        waited for and applied, so that every client's state matches the server's at the
        next outer iteration.

        Stopping: each client's step certifies ``sigma (c_i - x_i) in d P_{i,k}(x_i)`` and
        the server's ``m sigma (mean zeta - z+) in d(P_{0,k} + h)(z+)``; the dual residual
        is the infinity norm of their sum (``m sigma (z - z+)`` when every client moved),
        the primal residual ``max_i ||x_i - z+||_inf`` over every client's latest point,
        which exists once every client has replied in this inner solve."""
        ns = server.ns
        z = server.x[:ns].copy()
        names = list(runtime.alive)
        row = {n: i for i, n in enumerate(names)}
        m = len(names)
        zeta = z + np.array([self.duals.get(n, np.zeros(ns)) for n in names]).reshape(m, ns)
        X, G = np.zeros((m, ns)), np.zeros((m, ns))  # latest points, their subgradients
        seen = np.zeros(m, dtype=bool)  # (replied in this inner solve)
        per_round = m if self.sampler is None else self.sampler.size
        epoch = -(-m // per_round)
        posting = self.quorum is not None and runtime.supports_async
        alpha = self.block_step(m) if posting else self.relaxation
        # under quorum, the steps out: client -> (ticket, round, z, centre, sigma) of its post
        out: dict[str, tuple] = {}
        bound, residual, w = np.inf, np.inf, server.x
        primals: list[float] = []
        fixed_since = 0
        last_round = 0.0
        farkas = [0, 1]  # (the round of the next Farkas try, the wait after it in epochs)

        def apply(arrived: dict[str, tuple], t: int) -> None:
            """Move the blocks of the replies ``arrived`` (client order)."""
            for n in sorted(arrived, key=row.__getitem__):
                reply, posted, z_then, centre, sigma_then = arrived[n]
                i, x = row[n], np.asarray(reply.payload["x"], dtype=float)
                X[i], G[i], seen[i] = x, sigma_then * (centre - x), True
                step = alpha * (x - z_then)
                if sigma_then != self.sigma:  # (the scaled dual's units changed since)
                    step *= sigma_then / self.sigma
                zeta[i] += step
                if posted < t:
                    self.late[0] += 1
                    self.late[1] = max(self.late[1], t - posted)
            self.client_steps += len(arrived)

        def finish(z_now: np.ndarray, t: int) -> None:
            """Wait for the steps still out, apply them, keep the duals (warm start)."""
            if out:
                tickets = [v[0] for v in out.values()]
                apply(self.taken(out, runtime.poll(tickets, min_count=len(tickets))), t)
            self.duals = {n: zeta[i] - z_now for n, i in row.items()}

        for t in range(self.max_inner):
            t_round = time.perf_counter()
            sigma = self.sigma
            runtime.next_round()
            tol, tol_server = step_tolerances(tau, sigma, m, server.prox_weight)
            if self.sampler is None:
                pick = [n for n in names if n not in out]
            else:
                drawn = self.sampler.sequence(self.sampled_rounds, t)
                pick = [n for n in drawn if n in row and n not in out]
            centres = {n: 2.0 * z - zeta[row[n]] for n in pick}
            payloads = {n: {"c": centres[n], "sigma": sigma, "tol": tol} for n in pick}
            for n, budget in step_budgets(runtime, pick, deadline).items():
                payloads[n]["budget"] = budget
            if posting:
                for n in pick:
                    ticket = runtime.post(n, "xadmm_w", payloads[n])
                    out[n] = (ticket, t, z, centres[n], sigma)
                arrived = self.gather(runtime, out, t, self.quorum)
            else:
                replies = runtime.broadcast("xadmm_w", payloads.__getitem__, to=pick)
                arrived = {n: (r, t, z, centres[n], sigma) for n, r in replies.items()}
            apply(arrived, t)
            self.sampled_rounds += 1
            avg = zeta.mean(axis=0)
            w, residual = server.exact_step(avg, m * sigma, tol_server, deadline)
            z_new = w[:ns]
            gap = m * sigma * (avg - z_new) + G.sum(axis=0)  # (a subgradient of l_k's pieces)
            dual = float(np.abs(gap).max(initial=0.0))
            everyone = bool(seen.all())
            primal = float(np.abs(X - z_new).max(initial=0.0)) if everyone else np.inf
            bound = max(primal / PRIMAL_FRACTION, dual)
            if bound <= tau:
                finish(z_new, t)
                return InnerOutcome(w, t + 1, bound, True, residual)
            primals.append(primal)
            window = INFEASIBLE_WINDOW * epoch
            if (
                server.options.monitor
                and server.may_be_infeasible
                and everyone
                and t - fixed_since >= window
                and self.infeasible(primals, dual, tau, window)
            ):
                finish(z_new, t)
                return InnerOutcome(w, t + 1, bound, False, residual, stalled=True)
            # (windows in epochs; not while steps are out under a quorum: the Farkas round
            # goes to every client)
            if everyone and not out:
                settled = t - fixed_since
                proven = self.farkas_when_due(
                    server, runtime, w, primals, tau, settled, farkas, t, epoch
                )
                if proven is not None:
                    finish(z_new, t)
                    return InnerOutcome(w, t + 1, bound, False, residual, certificate=proven)
            last_round = time.perf_counter() - t_round
            if deadline is not None and time.perf_counter() + last_round > deadline:
                finish(z_new, t)
                return InnerOutcome(w, t + 1, bound, False, residual, timed_out=True)
            if (
                self.balancing is not None
                and (t + 1) % epoch == 0
                and t < epoch * self.balancing[2]
            ):
                U, Xs = zeta - z_new, X[seen]  # (the clients that replied in this inner solve)
                new = self.next_sigma(
                    sigma,
                    float(np.linalg.norm(Xs - z_new)) * np.sqrt(m / len(Xs)),
                    float(np.linalg.norm(gap)) / np.sqrt(m),
                    max(
                        float(np.linalg.norm(Xs)) * np.sqrt(m / len(Xs)),
                        np.sqrt(m) * float(np.linalg.norm(z_new)),
                    ),
                    sigma * float(np.linalg.norm(U)),
                    SAMPLED_CHANGE,
                )
                if new != sigma:  # (the scaled duals u = y / sigma)
                    zeta = z_new + U * (sigma / new)
                    self.sigma = new
                    fixed_since = t + 1
            z = z_new
        finish(z, self.max_inner)
        return InnerOutcome(w, self.max_inner, bound, False, residual)

    def farkas_when_due(
        self, server, runtime, w, primals, tau, settled, schedule, t, unit: int = 1
    ):
        """The Farkas certificate at the inner iterate ``w`` when a try is due
        (:data:`FARKAS_WINDOW`): the monitors on, a model that may be infeasible, round
        ``t`` at or past ``schedule[0]``, sigma fixed for ``settled`` rounds and the primal
        residuals settled over the window, both counted in ``unit`` rounds (an epoch under
        sampling). A failed try sets the next after ``schedule[1]`` more units and doubles
        that wait (``schedule`` is changed in place). Its message and numbers when it
        holds, else None."""
        window = FARKAS_WINDOW * unit
        if not (
            server.options.monitor
            and server.may_be_infeasible  # (no constraint, no box: always feasible)
            and t >= schedule[0]
            and settled >= window
            and self.infeasible(primals, 0.0, tau, window)
        ):
            return None
        proven = server.try_farkas(runtime, w)
        if proven is None:
            schedule[:] = [t + schedule[1] * unit, 2 * schedule[1]]
        return proven

    def gather(self, runtime, out: dict[str, tuple], t: int, quorum: int) -> dict[str, tuple]:
        """The replies of round ``t`` under ``quorum`` (:meth:`solve_sampled`): every step
        of ``out`` posted ``max_delay`` or more rounds ago, and at least ``quorum`` replies
        in all (every step out when fewer are); with the others that have arrived. Returns
        ``client -> (reply, round, z, centre, sigma)`` and takes them out of ``out``."""
        overdue = [v[0] for v in out.values() if t - v[1] >= self.max_delay]
        got: dict = {}
        if overdue:
            if not all(ticket.done for ticket in overdue):
                self.late[2] += 1  # (the bounded delay holds the round)
            got.update(runtime.poll(overdue, min_count=len(overdue)))
        rest = [v[0] for v in out.values() if v[0] not in got]
        if rest:
            got.update(runtime.poll(rest, min_count=max(0, quorum - len(got))))
        return self.taken(out, got)

    @staticmethod
    def taken(out: dict[str, tuple], got: dict) -> dict[str, tuple]:
        """The steps of ``out`` whose replies are in ``got`` (polled tickets), as ``client
        -> (reply, round, z, centre, sigma)``, taken out of ``out``."""
        arrived = {}
        for n in [n for n, v in out.items() if v[0] in got]:
            ticket, posted, z_then, centre, sigma_then = out.pop(n)
            arrived[n] = (got[ticket], posted, z_then, centre, sigma_then)
        return arrived

    def block_step(self, m: int) -> float:
        """The step ``alpha`` of a block under ``quorum`` with ``m`` clients: the
        relaxation, lowered to 0.99 of ARock's bound ``2 / (1 + 2 tau / sqrt(m))`` (its
        ``1 / (1 + 2 tau / sqrt(m))`` for a nonexpansive operator, doubled for
        Douglas-Rachford's firmly nonexpansive one; ``tau = max_delay``) when it is not
        below it.

        Examples
        --------
        >>> ExactADMM(1.0, 0, None, 10, quorum=3, max_delay=1).block_step(100)
        1.0
        >>> round(ExactADMM(1.0, 0, None, 10, quorum=3, max_delay=1).block_step(4), 3)
        0.99
        """
        bound = 2.0 / (1.0 + 2.0 * self.max_delay / float(np.sqrt(m)))
        return self.relaxation if self.relaxation < bound else 0.99 * bound

    @staticmethod
    def fixed_point_residual(z, z_new, U: np.ndarray, U_new: np.ndarray) -> np.ndarray:
        """The residual ``(sqrt(m) (z+ - z), (u_i+ - u_i)_i)`` of the ADMM map ``(z, u) ->
        (z+, u+)`` that Anderson acceleration minimises and its safeguard compares (``U``
        and ``U_new``: the ``m`` clients' scaled duals, a row each).

        ``z`` enters the consensus constraints ``x_i = z`` once per client, so ADMM's
        contraction measure -- ``m ||z+ - z||^2 + sum_i ||u_i+ - u_i||^2``, non-increasing
        along plain steps at a fixed ``sigma`` (He and Yuan, Numer. Math. 130, 2015, in the
        scaled form) -- weights its block by ``sqrt(m)``. Unweighted, plain steps can
        raise that residual (in up to a third of the rounds of a small l1 consensus), so
        Anderson's weights would minimise the wrong norm and its safeguard (which assumes
        the plain steps' residual does not grow) would reject accelerated inputs on noise,
        costing rounds (quantile-communities, quick).

        Examples
        --------
        >>> import numpy as np
        >>> g = ExactADMM.fixed_point_residual(
        ...     np.zeros(2), np.ones(2), np.zeros((1, 2)), np.full((1, 2), 2.0))
        >>> g.tolist()
        [1.0, 1.0, 2.0, 2.0]
        """
        weight = np.sqrt(len(U_new))
        return np.concatenate([weight * (np.asarray(z_new) - z), (U_new - U).ravel()])

    def penalty(self, sigma: float, z, z_new, X: np.ndarray, U_new: np.ndarray) -> float:
        """The next ``sigma`` from one round's residuals, within ``SIGMA_RANGE`` of the start:
        Boyd et al.'s balancing of ``r = ||(x_i - z+)_i||`` against ``s = sigma sqrt(m)
        ||z+ - z||`` at the balancing's ratio, or (ratio None, :func:`exact_balancing`)
        OSQP's rule on the residuals relative to their terms (Stellato et al. 2020, Sec.
        5.2): ``sigma sqrt((r / max(||x||, sqrt(m) ||z+||)) / (s / ||sigma u+||))``, taken
        when it moves ``sigma`` by more than a factor :data:`RELATIVE_CHANGE`."""
        m = len(X)

        def norm(rows: np.ndarray) -> float:  # (each row's squares summed, then the rows)
            sums = np.cumsum(np.sum(rows**2, axis=1))  # (in row order, one after another)
            return float(np.sqrt(sums[-1])) if sums.size else 0.0

        r = norm(X - z_new)
        s = sigma * np.sqrt(m) * float(np.linalg.norm(z_new - z))
        scale_x = max(norm(X), np.sqrt(m) * float(np.linalg.norm(z_new)))
        scale_y = sigma * norm(U_new)
        return self.next_sigma(sigma, r, s, scale_x, scale_y)

    def next_sigma(
        self,
        sigma: float,
        r: float,
        s: float,
        scale_x: float,
        scale_y: float,
        change: float = RELATIVE_CHANGE,
    ) -> float:
        """:meth:`penalty`'s rule on the primal residual ``r``, the dual residual ``s`` and
        the sizes of their terms (``scale_x``: the points', ``scale_y``: the duals')."""
        ratio, factor, _ = self.balancing
        lo, hi = self.sigma_least, self.sigma_start * SIGMA_RANGE
        if ratio is not None:
            if r > ratio * s:
                return min(sigma * factor, hi)
            if s > ratio * r:
                return max(sigma / factor, lo)
            return sigma
        if min(r, s, scale_x, scale_y) <= 0:
            return sigma
        new = sigma * float(np.sqrt((r / scale_x) / (s / scale_y)))
        if max(new / sigma, sigma / new) <= change:
            return sigma
        return min(max(new, lo), hi)

    @staticmethod
    def infeasible(
        primals: list[float], dual: float, tau: float, window: int = INFEASIBLE_WINDOW
    ) -> bool:
        """The signature of an infeasible model (:data:`INFEASIBLE_WINDOW`): a primal
        residual above its target ``PRIMAL_FRACTION * tau`` that has settled (relative change at most
        :data:`INFEASIBLE_CHANGE` over the last ``window`` rounds) while the dual residual
        vanished."""
        now, then = primals[-1], primals[-1 - window]
        return bool(
            now > PRIMAL_FRACTION * tau  # (the primal residual's target)
            and abs(now - then) <= INFEASIBLE_CHANGE * now
            and dual <= INFEASIBLE_CHANGE * now
        )


#: test (8)'s targets with exact-admm, as fractions of eps: the stationarity half at eps
#: itself (the exact steps leave no local error, and a KKT residual of eps came with
#: relative gaps of 1e-5 or less on the benchmark suite), a tenth of it when a party has
#: constraints of the user's (their multiplier updates read c(w) at an inexact inner
#: solution: at tau_k's floor of eps/2 the multipliers of max-entropy and bpdn stalled at a
#: violation of ~1e-3 and "diverging"); the feasibility half at a hundredth of eps
EXACT_KKT_FACTORS = {False: (1.0, 0.01), True: (0.1, 0.01)}
#: exact-admm lowers the inner tolerance's floor at most this far (three decades) when the
#: certificate disagrees with test (8); then it stops and the certificate gives the verdict
#: (max-entropy: w_j near 0, where entr's gradient blows up, reads "inaccurate" at a correct
#: point also with centralized)
EXACT_MIN_FLOOR_SCALE = 1e-3
#: exact-admm's over-relaxation when ``relaxation`` is left to its default (1.6 took more
#: rounds than 1 on LAD, SVM and quantile models)
EXACT_RELAXATION = 1.0

XADMM_W = MessageSpec(
    "xadmm_w",
    request={
        "c": Field(("d",)),
        "sigma": Field(()),
        "tol": Field(()),
        # seconds the step may take by the receiver's own clock (the run's time_limit;
        # absent without one)
        "budget": Field((), required=False),
    },
    reply={
        "x": Field(
            ("d",),
            reveals="x_i = argmin P_{i,k}(x) + (sigma/2)||x - c_i||^2, the prox of "
            "its subproblem at the centre c_i",
        ),
    },
    reveals="one round of exact-admm (prox-al's inner solver on non-smooth and conic "
    "models: d floats)",
    methods=("prox-al",),
)
#: a round of exact-admm that carries the certificate's check at the last round's point
#: ``w`` (:meth:`ExactADMM.solve`): the client evaluates there with the multipliers of its
#: last step, then steps, and replies both. On the diagnostic channel, as the certificate's
#: ``evaluate`` it replaces (its constraint values and scales are not the O(d) traffic of
#: the algorithm's rounds), the round's step with it. Never sent under a privacy plan
#: (:meth:`ExactInner.unused`), so none of its fields is masked
XADMM_CHECK = MessageSpec(
    "xadmm_check",
    request={**XADMM_W.request, "w": W, "objective_scale": OBJECTIVE_SCALE},
    reply={
        **XADMM_W.reply,
        **{
            name: dataclasses.replace(f, sum_only=False, unmasked=False)
            for name, f in EVALUATION_FIELDS.items()
        },
    },
    channel="diagnostic",
    reveals="one round of exact-admm (its x_i, as xadmm_w) and the certificate's evaluation "
    "at the last round's point w (f_i, its Lagrangian gradient and constraint values there, "
    "as evaluate's reply); the whole message is counted on the diagnostic channel",
    methods=("prox-al",),
)
#: an ``evaluate`` after an inner solve that ended where the certificate carried by its
#: last round held: the client takes that round's step back (its multipliers and own
#: block are again those the check read)
HELD = Field((), dtype="bool", required=False)


class ExactInner(InnerSolver):
    """The route ``"exact-admm"``: :class:`ExactADMM` on the server half, the clients'
    exact steps (:class:`ExactClient`), the server's own exact step (:meth:`exact_step`)
    and what it changes in Algorithm 1: test (8)'s targets (:data:`EXACT_KKT_FACTORS`),
    the certificate's check when (8) holds (:meth:`verify_stop`) or nearly does
    (:meth:`near_stop`), the multipliers of the epigraph pieces (its steps' duals) and
    the infeasibility verdict of a consensus gap that settles."""

    name = "exact-admm"
    samples = True
    # (its exact steps' interior-point and multiplier solvers keep absolute tolerances, and
    # the ray certificate along its shorter outer steps in the objective's units missed an
    # unbounded QP: its parameters stay in the user's units)
    objective_units = False
    # ((8) holding asks for the certificate at the iterate, verify_stop, which decides)
    cut_short_bound = False
    start_reply = {
        "exact": Field((), dtype="bool", reveals="nothing (exact-admm started)", unmasked=True)
    }
    messages = (XADMM_W, XADMM_CHECK)
    evaluate_fields = {"held": HELD}
    component_fields = ("admm",)

    @classmethod
    def accepts(cls, compiled, options, proximal):
        if not proximal or compiled.nonconvex:
            return (
                f"inner_solver={cls.name!r} needs method 'prox-al' on a convex model (its "
                "exact party steps minimise convex subproblems); use inner_solver='admm'"
            )
        return None

    @classmethod
    def unused(cls, compiled, options):
        off = {"budget"} if getattr(options, "time_limit", None) is None else set()
        if getattr(options, "sums_only", False) or not getattr(options, "adaptive", True):
            # (no check of the certificate on the way, or one in rounds of its own:
            # ExactADMM.solve)
            off |= {"xadmm_check", "evaluate.held"}
        return off

    @classmethod
    def suits(cls, compiled, options, proximal):
        if compiled.shared_hessian_obstacle() or restricted_domain_party(compiled):
            return None
        if not newton_obstacle(compiled, options, proximal) and inequality_walls(compiled):
            return None
        return "its terms are smooth (a Newton-type route takes them)"

    @classmethod
    def note(cls, compiled, options, proximal):
        why = newton_obstacle(compiled, options, proximal)
        obstacle = compiled.shared_hessian_obstacle() or restricted_domain_party(compiled)
        return why or obstacle or inequality_walls(compiled)

    def __init__(self, host):
        super().__init__(host)
        options = host.options
        rhos = host.rhos
        names = list(rhos)
        per_round = options.clients_per_round(len(names))
        sampler = None
        if per_round is not None:  # (partial participation: dald's random coordination)
            sampler = Coordination(
                "random", names, random_state=options.random_state, size=per_round
            )
        relaxation = (
            float(options.relaxation)
            if "relaxation" not in getattr(options, "_defaulted", ()) or not options.adaptive
            else EXACT_RELAXATION
        )
        quorum = options.quorum_size(per_round or len(names))
        self.admm = ExactADMM(
            float(np.mean(list(rhos.values()))) if rhos else 1.0,
            int(options.anderson),
            exact_balancing(options),
            int(options.max_inner),
            relaxation,
            sampler,
            quorum,
            options.delay_bound(len(names), relaxation) if quorum is not None else 1,
        )
        self._exact_solver = None
        self._hard_rows = internal_rows(host.problem)

    # (what ExactADMM.solve reads of "the server")
    @property
    def ns(self) -> int:
        return self.host.ns

    @property
    def x(self) -> np.ndarray:
        return self.host.x

    @property
    def options(self):
        return self.host.options

    @property
    def prox_weight(self) -> float:
        return self.host.prox_weight

    @property
    def may_be_infeasible(self) -> bool:
        return self.host.may_be_infeasible

    def solve(self, runtime, tau, deadline):
        return self.admm.solve(self, runtime, tau, deadline)

    def certifies_inner(self, tau: float) -> bool:
        """Whether the inner solve to ``tau`` evaluates the certificate on its way
        (:data:`CERTIFY_FIRST`): adaptive, ``tau`` at most ``eps1`` in the targets' unit
        (up to rounding: the last stage of the outer loop)."""
        host = self.host
        return bool(host.options.adaptive and tau <= (1.0 + 1e-9) * host.eps1_units)

    def certified_at(self, runtime, w: np.ndarray) -> bool:
        """The certificate at the inner iterate ``w`` (one diagnostic round, as
        :meth:`~fedmodel.algorithms.proxal.server.ProxALServer.certified`; the clients
        with their last exact steps' multipliers): whether it holds at ``(eps1, eps2)``.
        The iterate stays ``w^k`` unless it holds."""
        host = self.host
        center, host.x = host.x, w
        holds = host.certified(runtime)[0]
        if not holds:
            host.x = center
        return holds

    def carries_evaluation(self) -> bool:
        """Whether the certificate's check at an inner iterate rides on the next round's
        requests (:meth:`ExactADMM.solve`;
        :meth:`~fedmodel.algorithms.proxal.server.ProxALServer.carries_evaluation`)."""
        return self.host.carries_evaluation()

    def evaluation_request(self, w: np.ndarray) -> dict:
        """The fields an ``xadmm_check`` request adds to ``xadmm_w``'s to carry the
        certificate's evaluation at the inner iterate ``w``: the point and what an
        ``evaluate`` request adds."""
        return {"w": w[: self.host.ns], **self.host.evaluation_extras()}

    def certified_by(self, w: np.ndarray, replies) -> bool:
        """Whether the certificate holds at the inner iterate ``w`` by the clients'
        evaluations in ``replies`` (an ``xadmm_check`` round: each reply holds an
        ``evaluate`` reply's fields besides ``x``) and the server's own, with its
        multipliers of the step that gave ``w``."""
        theirs = {
            n: {k: v for k, v in r.payload.items() if k in EVALUATION_FIELDS}
            for n, r in replies.items()
        }
        return self.host.judge(w, theirs)[0]

    def evaluate_request(self) -> dict:
        """``held`` while the clients are to take back the step of a round whose
        certificate held (:attr:`ExactADMM.held`)."""
        return {"held": True} if self.admm.held else {}

    def try_farkas(self, runtime, w: np.ndarray):
        """The Farkas certificate at the inner iterate ``w`` (one ``farkas`` round; the
        clients at their last exact steps' points), when the run may try it
        (:meth:`~fedmodel.algorithms.proxal.server.ProxALServer.may_try_farkas`) and two
        parties or more restrict their points (one party's constraints, imposed exactly by
        its steps, leave the consensus feasible): its message and numbers when it holds,
        else None."""
        host = self.host
        if not (host.consensus_may_fail and host.may_try_farkas()):
            return None
        return host.farkas(runtime, w)

    def configure(self) -> None:
        """Test (8)'s targets of exact-admm (:data:`EXACT_KKT_FACTORS`; adaptive variant)."""
        host = self.host
        if host.options.adaptive:
            host.kkt_factors = EXACT_KKT_FACTORS[host.user_constraints]

    state_restored = configure

    def hard_rows(self):
        return self._hard_rows

    def extra(self) -> dict:
        out = {"exact_admm_sigma": self.admm.sigma, "anderson_rejections": self.admm.rejections}
        admm = self.admm
        if admm.sampler is not None:
            out["participation"] = {
                "clients_per_round": admm.sampler.size,
                "clients": len(admm.sampler.default),
                "sampled_rounds": admm.sampled_rounds,
                "client_steps": admm.client_steps,
            }
        if admm.quorum is not None:
            out["quorum"] = {
                "replies_per_round": admm.quorum,
                "max_delay": admm.max_delay,
                "late_replies": admm.late[0],
                "max_staleness": admm.late[1],
                "delay_waits": admm.late[2],
            }
        return out

    def stalled(self, k, outcome, tau):
        """(:meth:`ExactADMM.infeasible`: the consensus gap settled)"""
        return StepReport(
            info={"inner_iterations": outcome.iterations, "inner_bound": outcome.bound},
            stop="diverging",
            message=(
                f"at outer iteration {k} the consensus gap of exact-admm settled at "
                f"{outcome.bound:.3g} (target tau_k = {tau:.3g}) with the penalty at "
                f"sigma = {self.admm.sigma:.3g} while the server's point stopped moving "
                "and the duals grow, and the parties' Farkas certificate did not confirm "
                "it: the model is likely infeasible, which the method has not proved "
                "(method='centralized' gives the pooled solver's verdict)"
            ),
        )

    def verify_stop(self, runtime) -> bool:
        """Test (8) bounds ``dist(0, d l_k)`` by the consensus residuals, which miss how
        fast a client's terms change between its ``x_i`` and ``z`` (stiff
        augmented-Lagrangian terms, kinks): when (8) holds, one diagnostic round evaluates
        the certificate at the iterate; if it fails, the inner tolerance's floor drops
        tenfold (at most :data:`EXACT_MIN_FLOOR_SCALE`) and the outer loop goes on (True:
        stop). Once the floor is at its lowest, a run that may hand over
        (:meth:`may_hand_over`) and whose certificate still fails goes on with Algorithm 2
        from the iterate (:meth:`~fedmodel.algorithms.proxal.server.ProxALServer.hand_over`);
        otherwise it stops and the certificate gives the verdict."""
        host = self.host
        if not host.options.adaptive:
            return True  # (the certificate decides)
        at_floor = host.tau_floor_scale <= EXACT_MIN_FLOOR_SCALE
        if at_floor and not self.may_hand_over():
            return True
        opts = host.options
        holds, kkt = host.certified(runtime)
        if holds:
            return True
        if at_floor:
            host.hand_over(runtime, f"the certificate failed at {kkt.describe()}")
            return False
        # the floor drops by the measured shortfall (half of what the scaled residuals miss
        # eps by), at least tenfold: the inner residuals are absolute while the verdict is
        # on the user's scale (sparse-logistic-d3000: scaled stationarity 9.5e-3 at an
        # absolute 2.5e-4, terms of size ~0.03, needs two tenfold drops)
        stat, feas = kkt.verdict_residuals
        short = max(stat / opts.eps1, feas / opts.eps2)
        host.tau_floor_scale *= min(0.1, 0.5 / short) if np.isfinite(short) else 0.1
        return False

    def may_hand_over(self) -> bool:
        """Whether the run goes on with Algorithm 2 when the certificate fails at the
        lowest floor: ``inner_solver="auto"`` at an ``eps`` below
        :data:`~fedmodel.algorithms.proxal.obstacles.EXACT_MIN_EPS`
        (an exact step is an interior-point solution; its duals of a piece at a kink or
        of a degenerate vertex are accurate to about the square root of the solver's gap,
        ~1e-5 relative, so the certificate can stay above a tighter ``eps`` at a correct
        point, where Algorithm 2's multiplier updates reach it), without secure
        aggregation or differential privacy (Algorithm 2 reads messages client by
        client)."""
        host = self.host
        private = host.privacy is not None and host.privacy.active
        return (
            host.options.inner_solver == "auto"
            and not exact_eps_ok(host.options)
            and not private
            and host.fallback_route is not ExactInner
        )

    def near_stop(self, outcome, dw) -> bool:
        """Whether to evaluate the certificate although test (8) failed (adaptive). Its
        targets are fractions of ``eps`` (:data:`EXACT_KKT_FACTORS`) and its stationarity
        half adds ``tau_k``, so (8) can miss for several outer iterations a point whose
        certificate already holds at ``eps`` (LAD on wine quality, quick size: certified
        at 1.1e-4 after round 181, (8) held after round 392). Near the end -- the inner
        solve met a bound at most ``eps1`` and the outer step ``dw / beta`` is at most
        ``eps1`` -- one diagnostic round evaluates the certificate at the iterate, and the
        run stops when it holds: "optimal" is that certificate, so the verdict is
        unchanged."""
        opts, eps1 = self.host.options, self.host.eps1_units
        if not opts.adaptive or not outcome.satisfied:
            return False
        return outcome.bound <= eps1 and dw <= opts.beta * eps1

    def exact_step(self, avg: np.ndarray, weight: float, tol: float, deadline=None):
        """The server's step: ``argmin P_{0,k}(z, theta_0) + h(z) + (weight/2)||z - avg||^2``
        over its view, exactly (its epigraph pieces as hard constraints, their duals kept in
        ``mu_0``); returns the point and the measured residual. Past ``deadline`` (the run's,
        a ``time.perf_counter()`` value) the solve returns the point it reached."""
        host = self.host
        ns, p = host.ns, host.prox_weight
        if self._exact_solver is None:
            self._exact_solver = exact_prox_solver(host.problem, host.options.solver)
        set_deadline(self._exact_solver, deadline)
        center = (p * host.x[:ns] + weight * avg) / (p + weight)
        sigma = p + weight
        if host.owned:
            sigma = np.r_[np.full(ns, p + weight), np.full(host.n_own, p)]
            center = np.concatenate([center, host.x[ns:]])
        host.problem.set(sigma=sigma, center=center, mu=[host.mu], nu=[host.nu])
        start = np.concatenate([avg, host.x[ns:]]) if host.owned else avg
        report = self._exact_solver.solve(start, tol, host.options.max_local_iter)
        host.local_iterations += report.iterations
        host.mu = np.array(host.problem.mu[0], dtype=float)
        host.nu = np.array(host.problem.nu[0], dtype=float)
        return report.x, report.residual


def _point_write() -> int:
    """The time of one client's write of its point (:attr:`ExactClient.u`)."""
    _CLOCK[0] += 1
    _WRITES[0] += 1
    return _CLOCK[0]


class ExactClient(InnerClient):
    """Client ``i``'s side of exact-admm: its exact step (``xadmm_w``) and its last point
    ``x_i`` (with its own block), the warm start of the next."""

    state_fields = ("u", "u_before", "mu_sizes", "checked")

    def __init__(self, host):
        super().__init__(host)
        # its last point and its check's state, its own (``_u``, ``_checked``, each with the
        # time of its last write) or a row of its cohort's last stacked step when that is
        # newer (``_stack``, its slot there): :attr:`u`, :attr:`checked`
        self._u: np.ndarray | None = None
        self._checked: dict | None = None
        self._u_time = self._checked_time = 0
        # (no write yet: a new client is in no stack, so it takes no time of the clock)
        self._stack: _Stacked | None = None
        self._slot = 0
        # the point before the last step and the multipliers' sizes before and after it
        # (the Farkas point's extrapolation, :meth:`farkas_point`)
        self.u_before: np.ndarray | None = None
        self.mu_sizes = (0.0, 0.0)
        self._exact_solver = None
        self._hard_rows = None  # (found at the first use: hard_rows)
        # its step_batch_key, found at the first call (its options, its program's h and
        # GLM form decide it; a form found to disagree later takes it out)
        self._step_key: tuple | None = None
        self._step_key_found = False

    u = stack_row(
        "_u",
        "_u_time",
        "_stack",
        "_slot",
        "points",
        _point_write,
        "Its point after its last exact step (own block included), None before one.",
    )

    @property
    def checked(self) -> dict | None:
        """When its last step followed the certificate's evaluation (its round carried
        the check): the state that evaluation read (:meth:`step_state`), else None."""
        stack = self._stack
        if stack is not None and stack.time > self._checked_time:
            return None
        return self._checked

    @checked.setter
    def checked(self, value: dict | None) -> None:
        _CLOCK[0] += 1
        self._checked, self._checked_time = value, _CLOCK[0]

    def hard_rows(self):
        if self._hard_rows is None:
            self._hard_rows = internal_rows(self.host.problem)
        return self._hard_rows

    def user_multipliers(self) -> float:
        """The size (1-norm) of its multipliers of the user's constraints (the epigraph
        pieces' left out)."""
        h = self.host
        internal_i, internal_e, _ = h.program.functions.internal_masks
        return float(np.abs(h.mu[~internal_i]).sum() + np.abs(h.nu[~internal_e]).sum())

    def farkas_point(self, w):
        """Its last exact step's point, whose duals its multipliers are, extrapolated
        along its last change as the multipliers' size grew
        (:func:`~fedmodel.certificate.infeasibility.farkas_point`: across an infeasible
        consensus the point approaches its least-violation point like ``1 / M``)."""
        if self.u is None:
            return super().farkas_point(w)
        if self.u_before is None:
            return self.u
        before, after = self.mu_sizes
        return farkas_point(self.u, self.u - self.u_before, [before, after - before])

    #: its start reads ``w`` alone, so a cohort's ``outer`` round is one stacked step
    #: (:meth:`~fedmodel.algorithms.proxal.client.ProxALClient._on_outer_rows`)
    stacked_start = True

    def start(self, w, **request) -> dict:
        """The new centres of ``P_{i,k}``; nothing to send but the flag."""
        ExactClient.start_rows([self], np.asarray(w, dtype=float)[None, :], request)
        return {"exact": True}

    @staticmethod
    def start_rows(parts: list[ExactClient], W: np.ndarray, request: dict) -> dict:
        """:meth:`start` of every client of ``parts`` at its row of ``W`` in one step (each
        client's centre a row of one copy of ``W``, its own block's centre a copy of its
        own block: nothing to copy for a client without one); the flags as a row per
        client. The clients whose stack of steps (:class:`_Stacked`) is all in ``parts``
        (:class:`_Split`, kept by the first) have their rows of ``W``'s copy written once
        per stack as their centres (:class:`~fedmodel.algorithms.proxal.client.CentreRows`),
        which are the stack of their centres: no pass over those clients."""
        centres = np.array(W, dtype=float)
        split = parts[0].__dict__.get("_split")
        if split is None or not split.holds(parts):
            split = parts[0].__dict__["_split"] = _Split(parts)
        hosts = list(map(_HOST, map(parts.__getitem__, split.rest)))
        centre = getattr(type(hosts[0]), "w_center", None) if hosts else None
        if hasattr(centre, "write") and len(set(map(type, hosts))) == 1:
            centre.write(hosts, list(map(centres.__getitem__, split.rest)))  # (one write)
        else:
            for i, h in zip(split.rest, hosts):
                h.w_center = centres[i]
        owned = list(itertools.compress(hosts, map(_OWN_SIZE, hosts)))
        rows = [centres[order] for _, order in split.stacks]
        for (stack, _), block in zip(split.stacks, rows):
            stack.centre_rows.write(block)
            owned += stack.owned
        for h in owned:
            h.theta_center = h.theta_at_w.copy()
        if split.stacks:
            writes = type(parts[0].host).centre_writes()
            for (stack, _), block in zip(split.stacks, rows):
                stack.centred, stack.centers = writes, block
        return {"exact": np.ones(len(parts), dtype=bool)}

    def step_state(self) -> dict:
        """What a step changes and an evaluation reads: the multipliers, the cone duals,
        the own block and the last points (copies)."""
        h = self.host
        state = {"mu": h.mu, "nu": h.nu, "cone": h.cone, "cone_at_w": h.cone_at_w}
        state.update(theta_at_w=h.theta_at_w, u=self.u, u_before=self.u_before)
        state = {k: None if v is None else np.array(v, dtype=float) for k, v in state.items()}
        return {**state, "mu_sizes": tuple(self.mu_sizes)}

    def before_evaluation(self, held: bool = False) -> None:
        """``held``: the certificate held at the point that its last round carried; the
        step of that round is taken back (:attr:`checked`), so that the certificate's
        round and the final report read the multipliers and the own block the check read."""
        if not (held and self.checked is not None):
            return
        state, h = self.checked, self.host
        h.mu, h.nu, h.cone, h.cone_at_w = (
            state["mu"],
            state["nu"],
            state["cone"],
            state["cone_at_w"],
        )
        h.theta_at_w = state["theta_at_w"]
        self.u, self.u_before, self.mu_sizes = state["u"], state["u_before"], state["mu_sizes"]
        self.checked = None

    def _on_xadmm_check(self, c, sigma, tol, w, objective_scale=1.0, budget=None):
        """Its ``evaluate`` reply at ``w`` with the multipliers of its last step, then the
        step of :meth:`_on_xadmm_w`, in one reply; the state the evaluation read is kept
        (:attr:`checked`: taken back when the certificate held, :meth:`before_evaluation`)."""
        evaluation = self.host._on_evaluate(w, objective_scale=objective_scale)
        before = self.step_state()
        reply = self._on_xadmm_w(c, sigma, tol, budget)
        self.checked = before
        return {**reply, **evaluation}

    def _on_xadmm_w(self, c, sigma, tol, budget=None):
        """The exact minimiser of ``P_{i,k}(x) + (sigma/2)||x_shared - c||^2`` over this
        client's view (:mod:`~fedmodel.subproblems.conic_prox`); replies its shared part
        ``x_i``. Its own block, the epigraph pieces' multipliers (the solve's duals) and the
        cone multipliers stay here, with the point they belong to. ``budget``: the seconds
        the step may take, counted on this client's own clock from the message's arrival
        (the run's time limit); a step cut short replies the point it reached."""
        h = self.host
        c = np.asarray(c, dtype=float)
        ns, p, s = h.ns, h.prox_weight, float(sigma)
        if self._exact_solver is None:
            self._exact_solver = exact_prox_solver(h.problem, h.solver_option)
        set_deadline(self._exact_solver, step_deadline(budget, f"party {h.name!r}"))
        center = (p * h.w_center + s * c) / (p + s)
        weight = p + s
        if h.owned:  # Algorithm 1's proximal share on its own block (weight p)
            n_own = h.program.layout.size - ns
            weight = np.r_[np.full(ns, p + s), np.full(n_own, h.theta_prox)]
            center = np.concatenate([center, h.theta_center])
        h.problem.set(sigma=weight, center=center, mu=[h.mu], nu=[h.nu])
        h.problem.cone[0] = h.cone
        start = self.u if self.u is not None else h._local(c, h.theta_at_w)
        report = self._exact_solver.solve(start, float(tol), h.max_local_iter)
        h.stats["local_solves"] += 1
        h.stats["local_iterations"] += report.iterations
        h.note_residual_gap(report.residual, tol)
        before = self.user_multipliers()
        h.mu = np.array(h.problem.mu[0], dtype=float)
        h.nu = np.array(h.problem.nu[0], dtype=float)
        h.cone = np.array(h.problem.cone[0], dtype=float)
        h.cone_at_w = h.cone.copy()
        self.mu_sizes = (before, self.user_multipliers())
        self.u_before = self.u
        self.u = np.array(report.x, dtype=float)
        h.theta_at_w = self.u[ns:].copy()
        self.checked = None
        return {"x": self.u[:ns].copy()}

    # -- many clients' steps at once ------------------------------------------------------
    #: its step's key changes only with its form's verdict (``glm_disagrees``)
    stable_batch_keys = frozenset({"xadmm_w", "xadmm_check"})

    def step_batch_key(self, kind: str) -> Any:
        """The structure this client's ``xadmm_w`` step shares with the clients it is
        batched with (:meth:`_on_xadmm_w_batch`), or None: the client has a dense GLM form
        and no constraints (:func:`~fedmodel.algorithms.proxal.cohorts.glm_objective`) and
        its steps use the library's own backend (``solver`` "auto" or "newton")."""
        if kind != "xadmm_w" and kind != "xadmm_check":
            return None
        h = self.host
        if not self._step_key_found:  # (what decides it is fixed but the form's verdict)
            self._step_key_found = True
            if h.solver_option in _OWN_BACKENDS and h.regularizer.is_zero:
                self._step_key = _glm_step_key(glm_structure(h))
        return None if h.glm_disagrees else self._step_key

    @classmethod
    def step_batch_keys(cls, parts: list[ExactClient], kind: str) -> list:
        """:meth:`step_batch_key` of each of ``parts``. When their clients are alike in
        what decides it but their forms (:data:`_KEY_FACTS`: batches on, the library's
        own backend, no regulariser, forms looked up and none found to disagree), each
        client's key follows from its form's signature (one object per form's path): it
        is found once per signature and noted in each client as its own, in C passes;
        else each finds its own."""
        if (
            (kind != "xadmm_w" and kind != "xadmm_check")
            or cls.step_batch_key is not ExactClient.step_batch_key
            or set(map(type, parts)) != {cls}
        ):
            return [part.step_batch_key(kind) for part in parts]
        hosts = list(map(_HOST, parts))
        facts = set(map(_KEY_FACTS, hosts))
        if len(facts) != 1 or facts.pop() not in _ALIKE_FACTS:
            return [part.step_batch_key(kind) for part in parts]
        signatures = list(map(_SIGNATURE, hosts))  # (None: no form)
        found = {i: _glm_step_key(s) for i, s in {id(s): s for s in signatures}.items()}
        keys = [found[i] for i in map(id, signatures)]
        _consume(map(setattr, parts, itertools.repeat("_step_key"), keys))
        _consume(map(setattr, parts, itertools.repeat("_step_key_found"), itertools.repeat(True)))
        return keys

    @staticmethod
    def _on_xadmm_w_batch(parts: list[ExactClient], payloads: list[dict]) -> list[dict]:
        """:meth:`_on_xadmm_w` of every client of ``parts`` (clients of one
        :meth:`step_batch_key`) in one batched Newton solve (:meth:`_on_xadmm_w_rows` on
        the payloads' values)."""
        C = np.stack([np.asarray(pl["c"], dtype=float) for pl in payloads])
        fields = {
            "c": Rows(C),
            "sigma": Rows([float(pl["sigma"]) for pl in payloads]),
            "tol": Rows([float(pl["tol"]) for pl in payloads]),
            "budget": Rows([pl.get("budget") for pl in payloads]),
        }
        return [{"x": x} for x in ExactClient._on_xadmm_w_rows(parts, fields)["x"]]

    @staticmethod
    def _on_xadmm_check_batch(parts: list[ExactClient], payloads: list[dict]) -> list[dict]:
        """:meth:`_on_xadmm_check` of every client of ``parts`` (clients of one
        :meth:`step_batch_key`): their evaluations batched as their client halves batch
        ``evaluate`` (one by one when those do not), then :meth:`_on_xadmm_w_batch`. Every
        evaluation is made before any client's state changes."""
        hosts = [part.host for part in parts]
        asked = [
            {"w": pl["w"], "objective_scale": pl.get("objective_scale", 1.0)} for pl in payloads
        ]
        keys = {h.step_batch_key("evaluate") for h in hosts}
        evaluations = None
        if len(keys) == 1 and None not in keys:
            try:
                evaluations = type(hosts[0])._on_evaluate_batch(hosts, asked)
            except Exception:  # noqa: BLE001 - one by one, as the host would
                evaluations = None
        if evaluations is None:
            evaluations = [h._on_evaluate(**a) for h, a in zip(hosts, asked)]
        before = [part.step_state() for part in parts]
        replies = ExactClient._on_xadmm_w_batch(parts, payloads)
        for part, state in zip(parts, before):
            part.checked = state
        return [{**reply, **e} for reply, e in zip(replies, evaluations)]

    @staticmethod
    def _on_xadmm_w_rows(parts: list[ExactClient], fields: dict) -> dict[str, np.ndarray]:
        """:meth:`_on_xadmm_w` of every client of ``parts`` (clients of one
        :meth:`step_batch_key`) in one batched Newton solve: each client's
        ``f_i(x) + ((p + sigma_i) / 2) ||x - center_i||^2`` (no constraints: ``P_{i,k}`` plus
        the ADMM penalty), each to its own ``tol``, from its own last point. ``fields``: the
        requests' fields, each :class:`~fedmodel.runtime.rows.Rows` (client ``i``'s value
        in row ``i``) or one value for all; returns the replies' ``x`` as rows. Every input
        is checked and the solve made before any client's state changes."""
        m = len(parts)
        # (what stays the same between rounds while no event changes the clients: their
        # hosts, proximal weights, cap; the stacks of the centres and of the last step's
        # points while no client's was written since: no pass over the clients)
        kept = parts[0].__dict__.get("_stacked")
        if kept is None or not kept.holds(parts):
            kept = parts[0].__dict__["_stacked"] = _Stacked(parts)
        hosts, p = kept.hosts, kept.weights

        def column(name: str) -> np.ndarray:
            value = fields[name]
            if isinstance(value, Rows):
                return np.fromiter(map(float, value.values), dtype=float, count=m)
            return np.full(m, float(value))

        C = np.array(fields["c"].values, dtype=float).reshape(m, -1)
        sigma, tol = column("sigma"), column("tol")
        deadline = _cohort_deadline(fields.get("budget"), hosts)
        centers = kept.centres()
        if kept.points is not None and kept.written == _WRITES[0]:
            X0 = kept.points
        else:
            # (a stack not written yet: each client's point is its own)
            points = list(map(_OWN_U if kept.time == 0 else _U, parts))
            if not kept.owned and all(map(operator.is_, points, itertools.repeat(None))):
                X0 = np.array(C)  # (no point yet: each starts at its centre)
            else:
                X0 = np.array([
                    u if u is not None else h._local(c, h.theta_at_w)
                    for u, h, c in zip(points, hosts, C)
                ], dtype=float)  # fmt: skip
        moved = (p[:, None] * centers + sigma[:, None] * C) / (p + sigma)[:, None]
        cohort = kept.cohort
        if cohort is None:
            cohort = kept.cohort = cohort_of(hosts)
        check_forms(hosts, cohort, X0)
        report = cohort.prox(moved, p + sigma, X0, tol, max_iter=kept.max_iter, deadline=deadline)
        # (nothing above changed a client; from here on nothing raises. A client of a
        # cohort has no constraints, cones or own block: its step leaves its multipliers,
        # cone duals and own block as they are, and the single step's parameters are set
        # by that step itself)
        points = np.array(report.x, dtype=float)
        shared = points[:, : hosts[0].ns].copy()
        type(hosts[0]).note_steps(hosts, report.residual, tol, report.iterations)
        kept.step_to(points)  # (each client's point its row, its check None)
        return {"x": shared}


ExactInner.client_part = ExactClient

#: the clients' step keys (:meth:`ExactClient.step_batch_key`), one object per key
_STEP_KEYS: dict[tuple, tuple] = {}

#: the order of the writes of exact-admm clients' points and check states, one client's or a
#: stacked step's (the last one's value is a client's :attr:`ExactClient.u`)
_CLOCK = [0]
#: the writes of one client's point (a stacked step's stack of its clients' points holds
#: while there is none)
_WRITES = [0]


_U = operator.attrgetter("u")
_OWN_U = operator.attrgetter("_u")
_HOST = operator.attrgetter("host")
_STACK = operator.attrgetter("_stack")
_PROX_WEIGHT = operator.attrgetter("prox_weight")
_MAX_LOCAL_ITER = operator.attrgetter("max_local_iter")
_OWN_SIZE = operator.attrgetter("theta_at_w.size")
_SIGNATURE = operator.attrgetter("glm_signature")

#: what decides a client's step key besides its form (:meth:`ExactClient.step_batch_key`):
#: batches on, its backend option, whether it has a regulariser, whether its form was
#: looked up and whether that form disagreed with its evaluator
_KEY_FACTS = operator.attrgetter(
    "options.batch_clients",
    "solver_option",
    "regularizer.is_zero",
    "glm_looked_up",
    "_glm_disagrees",
)

#: the ``solver`` options whose steps use the library's own backend (those batched)
_OWN_BACKENDS = ("auto", "newton")

#: those facts when a client's key is its form's signature's (None without a form)
_ALIKE_FACTS = frozenset((True, solver, True, True, False) for solver in _OWN_BACKENDS)


def _glm_step_key(structure: tuple | None) -> tuple | None:
    """The step key of a client whose form has ``structure`` (its signature; None: no
    form, no key): one object per key, since ``handle_rows`` groups clients by it."""
    if structure is None:
        return None
    key = ("glm-prox", structure)
    return _STEP_KEYS.setdefault(key, key)


#: the stacks of exact-admm clients' steps made in this process (:class:`_Split`)
_STACKS_MADE = [0]


class _Stacked:
    """What a cohort's stacked step (:meth:`ExactClient._on_xadmm_w_rows`) keeps of its
    clients ``parts`` between rounds, kept by the first: their hosts, proximal weights and
    Newton cap and cohort, while no event changes a client (the ``generation`` of
    :func:`~fedmodel.algorithms.protocol.plans_generation`: a route or its parameters, a
    state put back) and no client joined another stack; the stack of their centres while
    no client's centre was written (:meth:`~fedmodel.algorithms.proxal.client.ProxALClient.
    centre_writes`);
    and its last step's points (``points``, a row per client, written at ``time``), each
    client's point and check state while it wrote none of its own since, and the stack
    of its clients' points while no client wrote one (``written``)."""

    __slots__ = ("parts", "generation", "hosts", "weights", "max_iter", "cohort", "joined")
    __slots__ += ("centred", "centers", "points", "time", "written", "centre_rows", "owned")

    def __init__(self, parts: list[ExactClient]):
        _STACKS_MADE[0] += 1
        self.parts = list(parts)
        self.generation = plans_generation()
        self.hosts = hosts = list(map(_HOST, parts))
        self.centre_rows = type(hosts[0]).centre_rows(hosts)
        self.owned = list(itertools.compress(hosts, map(_OWN_SIZE, hosts)))  # (own blocks)
        self.weights = np.fromiter(map(_PROX_WEIGHT, hosts), dtype=float, count=len(hosts))
        self.max_iter = min(map(_MAX_LOCAL_ITER, hosts))
        self.cohort = None  # (their GLMCohort, found at the first step)
        self.centred, self.centers = -1, None
        self.points = None
        self.time, self.written = 0, -1
        # (a client leaving a stack keeps the state it reads now as its own; a client in
        # none reads its own already. The stack is written later than any own write, so
        # until then each reads its own)
        for part, old in zip(parts, list(map(_STACK, parts))):
            if old is not None:
                old.joined = False
                part._u, part._checked = part.u, part.checked
                part._u_time = part._checked_time = 0
        _consume(map(setattr, parts, itertools.repeat("_stack"), itertools.repeat(self)))
        _consume(map(setattr, parts, itertools.repeat("_slot"), range(len(parts))))
        self.joined = True

    def holds(self, parts: list[ExactClient]) -> bool:
        """Whether it is still that of ``parts``."""
        return self.joined and self.generation == plans_generation() and self.parts == parts

    def centres(self) -> np.ndarray:
        """Its clients' centres (``w_center``) as rows."""
        writes = type(self.hosts[0]).centre_writes()
        if self.centred != writes:
            self.centred = writes
            self.centers = np.array([h.w_center for h in self.hosts], dtype=float)
        return self.centers.reshape(len(self.hosts), -1)

    def step_to(self, points: np.ndarray) -> None:
        """Its clients' points are the rows of ``points`` and their checks None, as if each
        had written them."""
        _CLOCK[0] += 1
        self.points, self.time, self.written = points, _CLOCK[0], _WRITES[0]


class _Split:
    """How the clients ``parts`` of a stacked start (:meth:`ExactClient.start_rows`) fall
    into the stacks of their steps, kept while no event changes a client (the
    ``generation`` of :func:`~fedmodel.algorithms.protocol.plans_generation`) and no stack
    was made or left: ``stacks``, each stack (its clients all in ``parts``) with the
    positions in ``parts`` of its clients in its order; ``rest``, the positions of the
    others (no stack, or one only partly in ``parts``)."""

    __slots__ = ("parts", "generation", "made", "stacks", "rest")

    def __init__(self, parts: list[ExactClient]):
        self.parts = list(parts)
        self.generation, self.made = plans_generation(), _STACKS_MADE[0]
        found: dict[_Stacked | None, list[int]] = {}
        stacks = list(map(_STACK, parts))
        if stacks.count(None) == len(stacks):  # (none in a stack: no pass per client)
            found[None] = list(range(len(stacks)))
        else:
            for i, stack in enumerate(stacks):
                found.setdefault(stack, []).append(i)
        rest = found.pop(None, [])
        self.stacks = []
        for stack, places in found.items():
            if len(places) != len(stack.parts) or not stack.holds(stack.parts):
                rest += places
                continue
            order = np.empty(len(places), dtype=np.intp)
            order[[parts[i]._slot for i in places]] = places
            self.stacks.append((stack, order))
        self.rest = sorted(rest)

    def holds(self, parts: list[ExactClient]) -> bool:
        """Whether it is still that of ``parts``."""
        return (
            self.generation == plans_generation()
            and self.made == _STACKS_MADE[0]
            and self.parts == parts
        )


def _cohort_deadline(budget: Any, hosts: list) -> float | None:
    """The deadline of a cohort's one batched step (:func:`~fedmodel.subproblems.merit.
    step_deadline`): the seconds its clients were granted, added up (one after another
    they would have had each its own share; together they have the sum). ``budget``: one
    value for all, or :class:`~fedmodel.runtime.rows.Rows` of seconds or None; a negative
    or non-finite budget raises naming its party (the merit's own check)."""
    if budget is None:
        return None
    if type(budget) is float and 0.0 <= budget < np.inf:
        # (one good value for all: no pass per client)
        return time.perf_counter() + float(np.full(len(hosts), budget).sum())
    values = budget.values if isinstance(budget, Rows) else [budget] * len(hosts)
    try:  # (floats alone: one C pass; None, a missing budget, reads as nan)
        seconds = np.array(values, dtype=float)
        kept = None if np.isnan(seconds).any() or seconds.ndim != 1 else range(len(values))
    except (TypeError, ValueError):
        kept = None
    if kept is None:
        kept = [i for i, b in enumerate(values) if b is not None]
        if not kept:
            return None
        seconds = np.array([float(values[i]) for i in kept])  # (one check for the cohort)
    bad = ~(np.isfinite(seconds) & (seconds >= 0.0))
    if bad.any():
        i = kept[int(np.argmax(bad))]
        step_deadline(values[i], f"party {hosts[i].name!r}")  # (raises, naming the party)
    return time.perf_counter() + float(seconds.sum())
