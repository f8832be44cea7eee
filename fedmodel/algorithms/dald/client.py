"""Party halves of dald-cc (seed 004 Algorithm 2) and dald-dc (Algorithm 3).

Each party keeps its own state: its local iterate ``x_i``, its multipliers (``mu_i`` for
dald-cc; one ``mu_ij`` per incident edge for dald-dc, held by both ends of the edge and
updated by each end with the same formula) and its solver layer on its own program.

dald-cc client messages (server <-> client):

=============  ============================================  ========================
kind           payload in                                    reply payload
=============  ============================================  ========================
``cc_solve``   ``x_hat``; ``repeat``, ``rho_scale``;         ``x`` (= x_i^{k,v})
               ``x_hat_dual``, ``dual_rho_scale`` when a
               multiplier update (15) is due first
``evaluate``   ``w``, ``x_hat`` (diagnostic)                 f_i, Lagrangian gradient,
                                                             consensus KKT residuals
``report``     ``x_hat`` (diagnostic)                        x_i, mu_i, local statistics
=============  ============================================  ========================

dald-dc node messages (peer to peer; ``local`` = the node's own turn, nothing sent):

===============  ======================================  ===================================
kind             payload                                 effect
===============  ======================================  ===================================
``dc_solve``     local: ``repeat``, ``report``           solve (20) with the neighbours'
                                                         latest iterates, send ``dc_x``
``dc_x``         peer: ``x`` (+ ``res`` = [D, C] to      store the neighbour's iterate (and
                 higher neighbours in full sweeps)       fold the residual report in)
``dc_relay``     local                                   send ``dc_report`` (partial sweeps)
``dc_report``    peer: ``res`` = [D, C]                  fold the residual report in
``dc_decide``    local, root only: ``full``              apply (B1)-(B4) and the outer
                                                         rule; send ``dc_control`` down
``dc_control``   peer: ``d`` (decision), ``t`` (sweep)   (21) if ``d`` is an outer step;
                                                         forward to lower neighbours
===============  ======================================  ===================================
"""

from __future__ import annotations

import numpy as np

from fedmodel.algorithms.common import PenaltyClient
from fedmodel.algorithms.dald.messages import DALD
from fedmodel.algorithms.dald.options import DALDOptions, InnerRule, PenaltySchedule
from fedmodel.algorithms.local import LocalProblem
from fedmodel.compiler.partition import PartyProgram
from fedmodel.compiler.regularizer import Regularizer
from fedmodel.runtime.wire import register_wire_type
from fedmodel.subproblems.merit import step_deadline

# decisions of the dald-dc root (and of the dald-cc server)
CONTINUE, FULL_NEXT, OUTER, STOP = 0, 1, 2, 3


def make_local(
    program: PartyProgram, reg: Regularizer, opts: DALDOptions, uniform: bool
) -> LocalProblem:
    return LocalProblem(
        program,
        reg,
        opts.penalty,
        local_solver=opts.local_solver,
        local_steps=opts.local_steps,
        step=opts.step,
        local_tol=opts.local_tol,
        local_max_iter=opts.local_max_iter,
        solver=opts.solver,
        uniform=uniform,
        batch_size=opts.batch_size,
        random_state=opts.random_state if isinstance(opts.random_state, int) else None,
    )


def block_residual(local: LocalProblem, x: np.ndarray, g: np.ndarray) -> float:
    """``dist_inf(0, g + d(h/n)(x))`` for the gradient ``g`` of the smooth part."""
    if local.reg.is_zero:
        return float(np.abs(g).max(initial=0.0))
    return float(local.reg.dist_subdiff(x, g))


def is_uniform(vectors) -> bool:
    vals = [np.asarray(v) for v in vectors]
    return all(np.all(v == vals[0].flat[0]) for v in vals) if vals else True


@register_wire_type("dald.cc_client")
class DALDCCClient(PenaltyClient):
    """Client ``i`` of Fed-DALD-CC: solves (13), updates ``mu_i`` by (15)."""

    messages = DALD

    state_fields = ("x", "mu", "dual_updates", "last_w")
    component_fields = ("local",)

    def __init__(
        self, program: PartyProgram, rho: np.ndarray, reg_share: Regularizer, opts: DALDOptions
    ):
        super().__init__(program)
        self.rho = np.asarray(rho, dtype=float)
        self.penalty = opts.penalty
        self.local = make_local(program, reg_share, opts, is_uniform([self.rho]))
        self.m = self.local.n
        self.x: np.ndarray | None = None
        self.mu = np.zeros(self.m)
        self.dual_updates = 0
        self.last_w: np.ndarray | None = None

    def _on_cc_solve(
        self,
        x_hat,
        repeat=1,
        rho_scale=1.0,
        dual=0.0,
        x_hat_dual=None,
        dual_rho_scale=None,
        budget=None,
    ):
        x_hat = np.asarray(x_hat, dtype=float)
        self.local.deadline = step_deadline(budget, f"party {self.name!r}")
        if self.x is None:
            self.x = x_hat.copy()  # x_i^{1,0} = x_hat^{1,0} (the common starting point)
        if dual or x_hat_dual is not None:  # (15), due from the previous outer iteration
            xd = x_hat if x_hat_dual is None else np.asarray(x_hat_dual, dtype=float)
            scale = rho_scale if dual_rho_scale is None else dual_rho_scale
            r = float(scale) * self.rho
            self.mu = self.mu + 2.0 * r * r * (xd - self.x)
            self.dual_updates += 1
        r = float(rho_scale) * self.rho
        w, z = consensus_quadratic([(x_hat, self.mu, r, -1.0)], self.m)
        self.local.set_quadratic(w, z)
        self.x = self.local.solve(self.x, int(repeat))
        return {"x": self.x}

    def _consensus(self, x_hat, rho_scale):
        r = float(rho_scale) * self.rho
        mu_plus = self.mu + 2.0 * r * r * (x_hat - self.x)
        g = self.local.gradient_f(self.x) - mu_plus  # (66): 0 in d f_i(x_i) - mu_i
        return mu_plus, block_residual(self.local, self.x, g)

    def _on_evaluate(self, w, x_hat=None, rho_scale=1.0):
        out = super()._on_evaluate(w)
        if x_hat is not None and self.x is not None:
            x_hat = np.asarray(x_hat, dtype=float)
            mu_plus, r66 = self._consensus(x_hat, rho_scale)
            out.update(
                mu_plus=mu_plus,
                r_dual=r66,
                r_primal=float(np.abs(x_hat - self.x).max(initial=0.0)),
            )
        return out

    def _on_report(self, x_hat=None, rho_scale=1.0):
        out = {
            **super()._on_report(),
            "x": self.x.copy() if self.x is not None else None,
            "mu_consensus": self.mu.copy(),
            "local_solves": self.local.stats.solves,
            "local_iterations": self.local.stats.iterations,
            "dual_updates": self.dual_updates,
        }
        if x_hat is not None and self.x is not None:
            out["mu_plus"], out["r_dual"] = self._consensus(
                np.asarray(x_hat, dtype=float), rho_scale
            )
        return out


@register_wire_type("dald.dc_node")
class DALDDCNode(PenaltyClient):
    """Node ``s`` of Fed-DALD-DC: solves (20), holds ``mu_e`` of its incident edges (21).

    Parameters
    ----------
    program : PartyProgram
        The node's own terms (a client, or the server when it is a node of the graph).
    lower, higher : list of str
        Neighbours below (already solved in a sweep) and above.
    rho : dict edge -> vector
        Penalties of the incident edges ``(lower, higher)``.
    level : int
        1 for the bottom level (excluded from the dual residual, eq. 80).
    runtime
        Used to send peer messages.
    """

    messages = DALD

    state_fields = (
        "x", "nbr", "mu", "gathered", "last_control", "sweep", "dual_updates", "fresh_dual",
        "last_w",
    )  # fmt: skip
    component_fields = ("local", "schedule")
    # (the root's InnerRule is a function of the options, which a resume checks: not state)
    root_state_fields = ("k", "v", "total", "pending_full", "last_residuals", "reason")

    def __init__(
        self,
        program: PartyProgram,
        reg_share: Regularizer,
        lower: list[str],
        higher: list[str],
        rho: dict[tuple[str, str], np.ndarray],
        level: int,
        x0: np.ndarray,
        opts: DALDOptions,
        runtime,
        is_root: bool = False,
    ):
        super().__init__(program)
        self.penalty = opts.penalty
        self.lower = list(lower)
        self.higher = list(higher)
        self.edges = [(e, self.name) for e in self.lower] + [(self.name, j) for j in self.higher]
        self.rho = {e: np.asarray(rho[e], dtype=float) for e in self.edges}
        self.level = int(level)
        self.runtime = runtime
        self.local = make_local(program, reg_share, opts, is_uniform(list(self.rho.values())))
        self.m = self.local.n
        self.x = np.array(x0, dtype=float)
        self.x_start = self.x.copy()
        self.nbr = {j: self.x.copy() for j in self.lower + self.higher}
        self.mu = {e: np.zeros(self.m) for e in self.edges}
        self.schedule = PenaltySchedule(opts.rho_growth, opts.rho_growth_max)
        self.update_multipliers = bool(opts.update_multipliers)
        self.gathered = np.zeros(2)  # [max D, max C] over this node and what reached it
        self.last_control = 0
        self.sweep = 0
        self.dual_updates = 0
        self.fresh_dual = False
        self.last_w: np.ndarray | None = None
        self.is_root = is_root
        if is_root:
            self.state_fields = type(self).state_fields + self.root_state_fields
            self.rule = InnerRule(opts)
            self.k, self.v, self.total = 1, 0, 0
            self.max_iter = int(opts.max_iter)
            self.max_outer = int(opts.max_outer)
            self.pending_full = False
            self.last_residuals = (np.inf, np.inf)
            self.reason = ""

    # -- the local subproblem (20) -------------------------------------------------------------
    def _quadratic_terms(self, scale: float):
        terms = []
        for j in self.higher:  # mu_sj^T (x_s - x_j) + ||rho o (x_s - x_j)||^2, x_j^{k,v-1}
            e = (self.name, j)
            terms.append((self.nbr[j], self.mu[e], scale * self.rho[e], 1.0))
        for lo in self.lower:  # mu_es^T (x_e - x_s) + ||rho o (x_e - x_s)||^2, x_e^{k,v}
            e = (lo, self.name)
            terms.append((self.nbr[lo], self.mu[e], scale * self.rho[e], -1.0))
        return terms

    def _own_residuals(self) -> np.ndarray:
        D = float(np.abs(self.x - self.x_start).max(initial=0.0)) if self.level > 1 else 0.0
        C = max(
            (float(np.abs(self.nbr[e] - self.x).max(initial=0.0)) for e in self.lower), default=0.0
        )
        return np.array([D, C])

    def _on_dc_solve(self, repeat=1, report=True):
        self.fresh_dual = False
        terms = self._quadratic_terms(self.schedule.scale)
        if terms:
            w, z = consensus_quadratic(terms, self.m)
            self.local.set_quadratic(w, z)
        else:  # a single node: no consensus term
            self.local.set_quadratic(0.0, self.x)
        self.x = self.local.solve(self.x, int(repeat))
        if report:
            self.gathered = np.maximum(self.gathered, self._own_residuals())
        for j in self.lower:
            self.runtime.send_peer(self.name, j, "dc_x", {"x": self.x})
        for j in self.higher:
            payload = {"x": self.x, "res": self.gathered.copy()} if report else {"x": self.x}
            self.runtime.send_peer(self.name, j, "dc_x", payload)
        return None

    def _on_dc_x(self, x, sender, res=None):
        """A neighbour's iterate (and, on the way up, its gathered residuals)."""
        self.nbr[sender] = np.asarray(x, dtype=float)
        if res is not None:
            self.gathered = np.maximum(self.gathered, res)
        return None

    def _on_dc_relay(self):
        self.gathered = np.maximum(self.gathered, self._own_residuals())
        for j in self.higher:
            self.runtime.send_peer(self.name, j, "dc_report", {"res": self.gathered.copy()})
        return None

    def _on_dc_report(self, res):
        self.gathered = np.maximum(self.gathered, res)
        return None

    def _on_dc_score(self):
        """Local disagreement ``max_j ||x_s - x_j||_inf`` (greedy coordination)."""
        return max((float(np.abs(self.nbr[j] - self.x).max()) for j in self.nbr), default=0.0)

    # -- decisions (root) and the multiplier step (21) -------------------------------------------
    def _on_dc_decide(self, full=True):
        D, C = (float(v) for v in self.gathered)
        self.v += 1
        self.total += 1
        rule = self.rule
        decision = CONTINUE
        if self.pending_full:
            self.pending_full = False
            decision = OUTER
        elif rule.inner_done(self.k, self.v, D) or self.v >= rule.max_inner:
            if full:
                decision = OUTER
            else:
                self.pending_full = True
                decision = FULL_NEXT
        if decision == OUTER and rule.outer_done(C, D):
            decision = STOP
            self.reason = "converged"
        elif decision == OUTER:
            self.k += 1
            self.v = 0
            if self.k > self.max_outer:
                decision, self.reason = STOP, "max_outer"
        if decision != STOP and self.total >= self.max_iter:
            decision, self.reason = STOP, "max_iter"
        self.last_residuals = (D, C)
        self._on_dc_control(decision, self.last_control + 1)
        return {
            "d": decision,
            "D": D,
            "C": C,
            "reason": self.reason,
            "rho_scale": self.schedule.scale,
        }

    def _on_dc_control(self, d, t):
        t = int(t)
        if t <= self.last_control:
            return None  # already received from another higher neighbour
        self.last_control = t
        for j in self.lower:
            self.runtime.send_peer(self.name, j, "dc_control", {"d": float(d), "t": float(t)})
        if int(d) == OUTER and self.update_multipliers:
            r_scale = self.schedule.scale
            for e in self.edges:  # C_ij = x_i - x_j with (i, j) = (lower, higher)
                lo, hi = e
                x_lo = self.x if lo == self.name else self.nbr[lo]
                x_hi = self.x if hi == self.name else self.nbr[hi]
                r = r_scale * self.rho[e]
                self.mu[e] = self.mu[e] + 2.0 * r * r * (x_lo - x_hi)
            self.dual_updates += 1
            self.fresh_dual = True
        if int(d) == OUTER:
            self.schedule.advance()
        self.gathered = np.zeros(2)
        self.x_start = self.x.copy()
        return None

    # -- diagnostics ---------------------------------------------------------------------------
    def _consensus(self):
        """(73)-(74) at the current point, with the multipliers of the step (21) (just made,
        or the one the current point would give)."""
        r_scale = 0.0 if self.fresh_dual else self.schedule.scale
        g = self.local.gradient_f(self.x)
        primal = 0.0
        for e in self.edges:
            lo, hi = e
            x_lo = self.x if lo == self.name else self.nbr[lo]
            x_hi = self.x if hi == self.name else self.nbr[hi]
            r = r_scale * self.rho[e]
            mu_plus = self.mu[e] + 2.0 * r * r * (x_lo - x_hi)
            g = g + mu_plus if lo == self.name else g - mu_plus
            if hi == self.name:
                primal = max(primal, float(np.abs(x_lo - x_hi).max(initial=0.0)))
        return block_residual(self.local, self.x, g), primal

    def _on_output(self):
        return {"x": self.x.copy()}

    def _on_evaluate(self, w):
        out = super()._on_evaluate(w)
        out["r_dual"], out["r_primal"] = self._consensus()
        return out

    def _on_report(self):
        r_dual, primal = self._consensus()
        return {
            **super()._on_report(),
            "x": self.x.copy(),
            "mu_edges": {f"{a}->{b}": v.copy() for (a, b), v in self.mu.items() if b == self.name},
            "r_dual": r_dual,
            "r_primal": primal,
            "local_solves": self.local.stats.solves,
            "local_iterations": self.local.stats.iterations,
            "dual_updates": self.dual_updates,
        }


def consensus_quadratic(terms: list[tuple[np.ndarray, np.ndarray, np.ndarray, float]], m: int):
    """Weights and centre of ``sum_t [sign_t mu_t^T (x - y_t) + ||rho_t o (x - y_t)||^2]``.

    Each term is ``(y, mu, rho, sign)``; returns ``(w, z)`` with the sum equal to
    ``(1/2) sum_r w_r (x_r - z_r)^2`` plus a constant.
    """
    w = np.zeros(m)
    wz = np.zeros(m)
    for y, mu, rho, sign in terms:
        r2 = 2.0 * rho * rho
        w = w + r2
        wz = wz + r2 * y - sign * mu
    return w, wz / w
