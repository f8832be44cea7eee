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
round, Boyd's in the first ``rb_rounds``). The penalty and the duals are carried over to
the next outer iteration (warm start), ``z`` restarts at ``w^k``.

Stopping (the analogue of Algorithm 2's bound (19)): the clients' optimality conditions
give ``-sigma (x_i - c_i) in d P_{i,k}(x_i)``, the server's ``sigma sum_i u_i+ in
d(P_{0,k} + h)(z+)``; their sum is ``-n sigma (z+ - z)``. The inner solve stops when the dual
residual ``n sigma ||z+ - z||_inf`` and the primal residual ``max_i ||x_i - z+||_inf`` are
both at most ``tau_k``.

Examples
--------
>>> import numpy as np
>>> state = ExactADMM(sigma=1.0, anderson=5, balancing=None, max_inner=10)
>>> state.get_state()["sigma"]
1.0
"""

from __future__ import annotations

import time

import numpy as np

from fedmodel.algorithms.common import step_budgets
from fedmodel.algorithms.proxal.anderson import AndersonState
from fedmodel.algorithms.proxal.inner import InnerOutcome

#: residual balancing keeps sigma within [start / SIGMA_RANGE, start * SIGMA_RANGE]
SIGMA_RANGE = 1e3
#: local (party) solves are asked for this fraction of tau_k, at least LOCAL_FLOOR
LOCAL_FRACTION, LOCAL_FLOOR = 1e-2, 1e-9
#: the primal residual's target, as a fraction of tau_k. 0.3 while the certificate measured
#: the clients' epigraph pieces at (z, their own block), off by about ||a_j||_1 times the
#: primal residual (at 1: LAD and quantile read scaled feasibility 1.4e-3 at eps = 1e-3);
#: it now puts them at their partial minimiser at z (certificate/auxiliary.py), and at 1
#: the full sizes took svm-20 71 -> 60 rounds, lad-20 124 -> 56, quantile-5 128 -> 81
PRIMAL_FRACTION = 1.0


#: an infeasible model: ADMM's consensus gap ``x_i - z`` converges to a nonzero constant
#: (its limit certifies infeasibility, Banjac et al. 2019) while ``z`` stops moving; the
#: inner solve reports it when, after INFEASIBLE_WINDOW rounds at a fixed sigma, the
#: primal residual changed by at most INFEASIBLE_CHANGE (relative) over that many rounds,
#: stays above tau_k, and the dual residual is below INFEASIBLE_CHANGE times it
INFEASIBLE_WINDOW, INFEASIBLE_CHANGE = 50, 1e-3

#: exact-admm's penalty: Boyd's residual balancing at ``rb_ratio`` when the user sets it;
#: left at its default (10, Algorithm 2's), OSQP's relative rule (ExactADMM.penalty),
#: changing sigma when it moves by more than RELATIVE_CHANGE (OSQP's 5: 5 -> 3, lad-20 218
#: -> 203, svm-german 84 -> 73, quantile-5 112 -> 107). Quick sizes, rounds, Boyd's
#: balancing at ratio 3 -> the relative rule at 3: svm-german 118 -> 73, kl-simplex 72 ->
#: 51, svm-20 251 -> 72, lad-20 135 -> 203, quantile-5 75 -> 107, bpdn 60 -> 85
#: (docs/performance.md: a spectral penalty and a bounded range were worse)
RELATIVE_CHANGE = 3.0


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
    """

    def __init__(
        self, sigma: float, anderson: int, balancing, max_inner: int, relaxation: float = 1.0
    ):
        self.sigma = self.sigma_start = float(sigma)
        self.relaxation = float(relaxation)
        self.anderson = int(anderson)
        self.balancing = balancing
        self.max_inner = int(max_inner)
        self.duals: dict[str, np.ndarray] = {}  # scaled duals u_i (warm start)
        self.rejections = 0

    # -- state (plain values: checkpoints) -----------------------------------------------------
    def get_state(self) -> dict:
        return {
            "sigma": self.sigma,
            "duals": {k: v.copy() for k, v in self.duals.items()},
            "rejections": self.rejections,
        }

    def set_state(self, state: dict) -> None:
        self.sigma = float(state["sigma"])
        self.duals = {k: np.array(v, dtype=float) for k, v in state["duals"].items()}
        self.rejections = int(state["rejections"])

    # -- one inner solve ----------------------------------------------------------------------
    def solve(self, server, runtime, tau: float, deadline: float | None):
        """Minimise ``l_k`` from ``w^k = server.x`` to ``tau``; returns the server's
        :class:`~fedmodel.algorithms.proxal.inner.InnerOutcome`."""

        ns = server.ns
        w_center = server.x
        z = w_center[:ns].copy()
        names = list(runtime.alive)
        U = {n: self.duals.get(n, np.zeros(ns)) for n in names}
        tol = max(LOCAL_FRACTION * tau, LOCAL_FLOOR)
        aa = AndersonState(self.anderson) if self.anderson else None
        outputs: list[tuple[np.ndarray, dict]] = []
        residuals: list[np.ndarray] = []
        rejected = 0
        bound, residual, w = np.inf, np.inf, w_center
        primals: list[float] = []  # (the infeasibility monitor)
        fixed_since = 0  # the round since which sigma has not changed
        last_round = 0.0  # seconds of the last round: one more is not begun if it would end
        for t in range(self.max_inner):  # after the deadline (the rounds are the time unit)
            t_round = time.perf_counter()
            sigma = self.sigma
            runtime.next_round()
            payloads = {n: {"c": z - U[n], "sigma": sigma, "tol": tol} for n in U}
            for n, budget in step_budgets(runtime, list(U), deadline).items():
                payloads[n]["budget"] = budget
            replies = runtime.broadcast("xadmm_w", payloads.__getitem__)
            X = {n: np.asarray(r.payload["x"], dtype=float) for n, r in replies.items()}
            U = {n: U[n] for n in X}  # (clients dropped by the failure policy leave)
            m = len(X)
            if self.relaxation != 1.0:  # over-relaxation (Boyd et al. 2011, Sec. 3.4.3)
                a = self.relaxation
                X_hat = {n: a * X[n] + (1.0 - a) * z for n in X}
            else:
                X_hat = X
            avg = sum(X_hat[n] + U[n] for n in X) / m
            w, residual = server.exact_step(avg, m * sigma, tol, deadline)
            z_new = w[:ns]
            U_new = {n: U[n] + X_hat[n] - z_new for n in X}
            primal = max(float(np.abs(X[n] - z_new).max(initial=0.0)) for n in X)
            dual = m * sigma * float(np.abs(z_new - z).max(initial=0.0))
            bound = max(primal / PRIMAL_FRACTION, dual)
            if bound <= tau:
                self.duals = U_new
                return InnerOutcome(w, t + 1, bound, True, residual)
            primals.append(primal)
            if (
                server.options.monitor
                and server.may_be_infeasible  # (no constraint, no box: always feasible)
                and t - fixed_since >= INFEASIBLE_WINDOW
                and self.infeasible(primals, dual, tau)
            ):
                self.duals = U_new
                return InnerOutcome(w, t + 1, bound, False, residual, stalled=True)
            last_round = time.perf_counter() - t_round
            if deadline is not None and time.perf_counter() + last_round > deadline:
                self.duals = U_new
                return InnerOutcome(w, t + 1, bound, False, residual, timed_out=True)
            changed = False
            # (Boyd's balancing in the first rb_rounds rounds; the relative rule in every
            # round, as OSQP: with it in the first 50 only, lad-20's consensus crawled at a
            # fixed sigma until the infeasibility check read it as infeasible, 407 rounds)
            if self.balancing is not None and (t < self.balancing[2] or self.balancing[0] is None):
                new = self.penalty(sigma, z, z_new, X, U_new)
                if new != sigma:  # scaled duals u = y / sigma
                    U_new = {n: u * (sigma / new) for n, u in U_new.items()}
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
                U = {n: sum(a * o[1][n] for a, o in zip(alpha, picked)) for n in X}
            else:
                z, U = z_new, U_new
            if reset:
                outputs.clear()
                residuals.clear()
        self.duals = U
        return InnerOutcome(w, self.max_inner, bound, False, residual)

    @staticmethod
    def fixed_point_residual(z, z_new, U: dict, U_new: dict) -> np.ndarray:
        """The residual ``(sqrt(m) (z+ - z), (u_i+ - u_i)_i)`` of the ADMM map ``(z, u) ->
        (z+, u+)`` that Anderson acceleration minimises and its safeguard compares (over the
        clients of ``U_new``, ``m`` of them).

        ``z`` enters the consensus constraints ``x_i = z`` once per client, so ADMM's
        contraction measure -- ``m ||z+ - z||^2 + sum_i ||u_i+ - u_i||^2``, non-increasing
        along plain steps at a fixed ``sigma`` (He and Yuan, Numer. Math. 130, 2015, in the
        scaled form) -- weights its block by ``sqrt(m)``. Unweighted (as before), plain
        steps raised that residual in up to a third of the rounds of a small l1 consensus,
        so Anderson's weights minimised the wrong norm and its safeguard (which assumes
        the plain steps' residual does not grow) rejected accelerated inputs on noise:
        quantile-communities (quick) 1,355 -> 892 rounds.

        Examples
        --------
        >>> import numpy as np
        >>> g = ExactADMM.fixed_point_residual(
        ...     np.zeros(2), np.ones(2), {"a": np.zeros(2)}, {"a": np.full(2, 2.0)})
        >>> g.tolist()
        [1.0, 1.0, 2.0, 2.0]
        """
        names = list(U_new)
        weight = np.sqrt(len(names))
        return np.concatenate([weight * (np.asarray(z_new) - z)] + [U_new[n] - U[n] for n in names])

    def penalty(self, sigma: float, z, z_new, X: dict, U_new: dict) -> float:
        """The next ``sigma`` from one round's residuals, within ``SIGMA_RANGE`` of the start:
        Boyd et al.'s balancing of ``r = ||(x_i - z+)_i||`` against ``s = sigma sqrt(m)
        ||z+ - z||`` at the balancing's ratio, or (ratio None, :func:`exact_balancing`)
        OSQP's rule on the residuals relative to their terms (Stellato et al. 2020, Sec.
        5.2): ``sigma sqrt((r / max(||x||, sqrt(m) ||z+||)) / (s / ||sigma u+||))``, taken
        when it moves ``sigma`` by more than a factor :data:`RELATIVE_CHANGE`."""
        ratio, factor, _ = self.balancing
        m = len(X)
        lo, hi = self.sigma_start / SIGMA_RANGE, self.sigma_start * SIGMA_RANGE
        r = float(np.sqrt(sum(np.sum((X[n] - z_new) ** 2) for n in X)))
        s = sigma * np.sqrt(m) * float(np.linalg.norm(z_new - z))
        if ratio is not None:
            if r > ratio * s:
                return min(sigma * factor, hi)
            if s > ratio * r:
                return max(sigma / factor, lo)
            return sigma
        scale_x = max(
            float(np.sqrt(sum(np.sum(X[n] ** 2) for n in X))),
            np.sqrt(m) * float(np.linalg.norm(z_new)),
        )
        scale_y = sigma * float(np.sqrt(sum(np.sum(U_new[n] ** 2) for n in X)))
        if min(r, s, scale_x, scale_y) <= 0:
            return sigma
        new = sigma * float(np.sqrt((r / scale_x) / (s / scale_y)))
        if max(new / sigma, sigma / new) <= RELATIVE_CHANGE:
            return sigma
        return min(max(new, lo), hi)

    @staticmethod
    def infeasible(primals: list[float], dual: float, tau: float) -> bool:
        """The signature of an infeasible model (:data:`INFEASIBLE_WINDOW`): a primal
        residual above its target ``PRIMAL_FRACTION * tau`` that has settled (relative change at most
        :data:`INFEASIBLE_CHANGE` over the window) while the dual residual vanished."""
        now, then = primals[-1], primals[-1 - INFEASIBLE_WINDOW]
        return bool(
            now > PRIMAL_FRACTION * tau  # (the primal residual's target)
            and abs(now - then) <= INFEASIBLE_CHANGE * now
            and dual <= INFEASIBLE_CHANGE * now
        )
