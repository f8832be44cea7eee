"""dald-cc and dald-dc: seed 004's distributed augmented Lagrangian decomposition.

``dald-cc`` (Algorithm 2, Fed-DALD-CC): a server variable ``x_hat`` and the consensus
constraints ``x_hat - x_i = 0``. Per inner iteration ``v`` the clients solve (13) from
``x_hat^{k,v-1}`` in parallel and send ``x_i``; the server solves (14), in closed form (29)
when it holds no terms, and measures ``D = x_hat^{k,v} - x_hat^{k,v-1}`` and ``C_i = x_hat -
x_i``. When the inner rule (B1)-(B4) holds, the outer rule ``||C|| <= eps_pri and ||D|| <=
eps_dual`` either stops or triggers the multiplier step (15) ``mu_i += 2 rho_i o rho_i o
C_i``, which each client performs on receiving the next ``x_hat`` (the server mirrors
``sum_i mu_i`` from what it receives, for (29)).

``dald-dc`` (Algorithm 3, Fed-DALD-DC): no server. One constraint ``x_i - x_j = 0`` per edge
of the topology, oriented from the lower to the higher level of the hierarchy
(:mod:`fedmodel.algorithms.topology`); nodes solve (20) level by level (root last) with
their neighbours' latest iterates, which they receive peer to peer; both ends of an edge
hold ``mu_ij`` and update it by (21). The stopping residuals are gathered by a
convergecast along the hierarchy: every node sends to its higher neighbours, with its
iterate, the maximum of its own ``||x_i^{k,v} - x_i^{k,v-1}||`` (not for level 1, eq. 80),
of ``||x_e - x_i||`` over its lower edges, and of what it received from below. The root,
solved last, thus holds ``||D||_inf`` and ``||C||_inf`` (two floats per message), applies
(B1)-(B4) and the outer rule, and floods its decision (continue / multiplier step / stop)
down the hierarchy (two floats per edge). In partial-cycle sweeps the report travels in a
separate pass over all nodes.

Both methods treat ``h`` as the paper's ``Omega``: each client holds ``h/n`` (eq. 8), so the
server (or the server node of a dald-dc graph) holds only its own terms. Models with
constraints need ``penalty=`` (see :class:`~fedmodel.algorithms.dald.options.DALDOptions`).
Importing this module also registers the baselines ``fedavg``, ``fedprox`` and ``dgd``.
"""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np

from fedmodel.algorithms.common import (
    JUDGED,
    PenaltyServer,
    starting_point,
    status_message,
)
from fedmodel.algorithms.dald.client import (
    CONTINUE,
    FULL_NEXT,
    OUTER,
    STOP,
    DALDCCClient,
    DALDDCNode,
    is_uniform,
    make_local,
)
from fedmodel.algorithms.dald.messages import DALD
from fedmodel.algorithms.dald.options import (
    DALDOptions,
    InnerRule,
    PenaltySchedule,
    rho_for_clients,
    rho_for_edges,
)
from fedmodel.algorithms.driver import run_federated
from fedmodel.algorithms.local import scaled_regularizer
from fedmodel.algorithms.protocol import StepReport
from fedmodel.algorithms.topology import SERVER, Coordination, build_hierarchy
from fedmodel.compiler.partition import CompiledModel
from fedmodel.compiler.regularizer import Regularizer
from fedmodel.errors import ModelError, UnsupportedError
from fedmodel.runtime.endpoints import RUNTIME_PROXY, EndpointFactory


def _grouped(seq: list[str]) -> list[tuple[str, int]]:
    out: dict[str, int] = {}
    for s in seq:
        out[s] = out.get(s, 0) + 1
    return list(out.items())


class DALDCCServer(PenaltyServer):
    """Server half of dald-cc: the consensus step (14)/(29), the residuals, the rules.

    One :meth:`step` is one inner iteration ``v`` (the clients of the coordination sequence
    solve (13), the server solves (14)); the history records the outer iterations. State:
    ``x_hat``, the clients' last ``x_i``, the mirror of ``sum_i mu_i``, the pending dual
    steps, the penalty schedule, the coordination sequence's generator and the counters.
    """

    messages = DALD
    state_fields = (
        "x_hat", "cache", "mu_sum", "pending", "k", "v", "total", "pending_full", "D", "C",
        "snapshots", "reason",
    )  # fmt: skip
    #: the coordination sequence, the penalty schedule and the server's local solver
    component_fields = ("schedule", "coord", "local")
    step_name = "inner iteration"

    def __init__(
        self,
        program,
        rhos: dict[str, np.ndarray],
        opts: DALDOptions,
        x0: np.ndarray,
        has_constraints: bool = False,
        nonconvex: bool = False,
    ):
        super().__init__(program, opts)
        self.has_constraints = has_constraints
        self.nonconvex = nonconvex
        self.rhos = rhos
        self.names = list(rhos)
        self.max_steps = int(opts.max_iter)
        self.local = make_local(
            program, Regularizer(), replace(opts, local_solver="exact"), is_uniform(rhos.values())
        )
        self.x_hat = np.array(x0, dtype=float)
        self.cache = {n: self.x_hat.copy() for n in self.names}  # x_i^{1,0} = x^0
        self.mu_sum = np.zeros_like(self.x_hat)  # mirror of sum_i mu_i (from received x_i)
        self.schedule = PenaltySchedule(opts.rho_growth, opts.rho_growth_max)
        self.pending: dict[str, float] = {}  # dual step (15) not yet delivered: its rho scale
        self.pending_x: dict[str, np.ndarray] = {}
        self.growth = opts.rho_growth != 1.0
        self.coord = Coordination(
            opts.coordination, self.names, opts.fraction, opts.dropout, opts.random_state
        )
        self.rule = InnerRule(opts)
        self.snap_at = {int(s) for s in opts.snapshot_iterations}
        self.k, self.v, self.total = 1, 0, 0
        self.pending_full = False
        self.D = self.C = np.inf
        self.snapshots: dict[int, dict] = {}
        self.reason = "max_iter"
        self.consensus_kkt: dict[str, float] = {}

    # -- the protocol ------------------------------------------------------------------------
    def start(self, runtime) -> None:
        pass  # the first cc_solve carries x^0

    def step(self, runtime, deadline) -> StepReport:
        opts, rule, names = self.options, self.rule, self.names
        self.v += 1
        self.total += 1
        k, v = self.k, self.v
        full = self.pending_full or self.coord.is_full or rule.is_last(k, v)
        scores = self.scores() if self.coord.spec == "greedy" else None
        seq = self.coord.sequence(k, v, full=full, scores=scores)
        full = full or sorted(seq) == sorted(names)
        runtime.next_round()
        groups = list(_grouped(seq))
        for i, (name, count) in enumerate(groups):
            payload = self.payload(name, count)
            if deadline is not None:  # (sent one after another: what is left, shared)
                payload["budget"] = max(deadline - time.perf_counter(), 0.0) / (len(groups) - i)
            reply = runtime.send(name, "cc_solve", payload)
            self.cache[name] = np.asarray(reply.payload["x"], dtype=float)
        self.D, self.C = self.consensus_step()
        if not np.all(np.isfinite(self.x_hat)) or np.abs(self.x_hat).max() > opts.divergence_limit:
            return StepReport(
                stop="unbounded",
                message=(
                    f"the iterates diverge (||x_hat||_inf = {np.abs(self.x_hat).max():.3g}); the "
                    "model may be unbounded below, or a fixed step is too long"
                ),
            )
        decision = CONTINUE
        if self.pending_full:
            self.pending_full = False
            decision = OUTER
        elif rule.inner_done(k, v, self.D) or v >= rule.max_inner:
            if full:
                decision = OUTER
            else:
                self.pending_full = True
                decision = FULL_NEXT
        if decision == OUTER and rule.outer_done(self.C, self.D):
            decision = STOP
        report = StepReport(
            info={
                "iteration": k,
                "inner_total": self.total,
                "D": self.D,
                "C": self.C,
                "rho_scale": self.schedule.scale,
            },
            record=decision in (OUTER, STOP),
        )
        if self.total in self.snap_at:
            replies = runtime.broadcast("snapshot", {}, channel="diagnostic")
            self.snapshots[self.total] = {
                "x_hat": self.x_hat.copy(),
                "local": {n: r.payload["x"] for n, r in replies.items()},
            }
        if decision == STOP:
            report.stop, self.reason = "stopped", "converged"
        elif decision == OUTER:
            self.dual(opts.update_multipliers)
            self.k += 1
            self.v = 0
            if self.k > opts.max_outer:
                report.stop, self.reason = "max_iterations", "max_outer"
        return report

    def point(self) -> np.ndarray:
        return self.x_hat

    def get_state(self) -> dict:
        """The declared state; a pending dual step on the ``x_hat`` sent with it (the same
        array) is recorded as ``None``."""
        state = super().get_state()
        state["pending_x"] = {
            n: None if xd is self.x_hat else xd for n, xd in self.pending_x.items()
        }
        return state

    def set_state(self, state: dict) -> None:
        super().set_state(state)
        self.pending_x = {
            n: self.x_hat if xd is None else np.array(xd) for n, xd in state["pending_x"].items()
        }

    def evaluation_extras(self) -> dict:
        return {"x_hat": self.x_hat, "rho_scale": self.schedule.scale}

    def report_payload(self) -> dict:
        return self.evaluation_extras()

    def diagnostics(self, reports: dict[str, dict]) -> dict:
        """The consensus problem's own KKT residuals (65)-(67) from the clients' reports."""
        names = self.names
        mu_sum = sum(reports[n]["mu_plus"] for n in names)
        self.consensus_kkt = {
            "primal_65": max(reports[n]["r_primal"] for n in names),
            "dual_66": max(reports[n]["r_dual"] for n in names),
            "sum_mu_67": float(np.abs(mu_sum).max(initial=0.0)),
        }
        return dict(self.consensus_kkt)

    def round_counts(self) -> dict[str, int]:
        return {"outer": self.k - 1 if self.v == 0 else self.k, "inner": self.total}

    def conclude(self, status, message, kkt, summary, history):
        return _conclude(self, status, message, kkt)

    def extra(self, reports: dict[str, dict]) -> dict:
        return {
            "x_hat": self.x_hat.copy(),
            "local_x": {n: r["x"] for n, r in reports.items()},
            "consensus_multipliers": {n: r["mu_plus"] for n, r in reports.items()},
            "consensus_kkt": dict(self.consensus_kkt),
            "residuals": {"C": self.C, "D": self.D},
            "snapshots": self.snapshots,
            "visits": dict(self.coord.visits),
            "reason": self.reason,
        }

    # -- the consensus step and the multipliers ----------------------------------------------
    def payload(self, name: str, repeat: int) -> dict:
        p: dict = {"x_hat": self.x_hat}
        if repeat != 1:
            p["repeat"] = float(repeat)
        if self.schedule.scale != 1.0:
            p["rho_scale"] = self.schedule.scale
        if name in self.pending:
            scale = self.pending.pop(name)
            xd = self.pending_x.pop(name)
            if xd is self.x_hat:
                p["dual"] = 1.0  # the dual step uses the x_hat sent in this message
            else:
                p["x_hat_dual"] = xd
            if self.growth:
                p["dual_rho_scale"] = scale
        return p

    def consensus_step(self) -> tuple[float, float]:
        """(14): ``argmin f_0 + sum_i mu_i^T (x - x_i) + ||rho_i o (x - x_i)||^2``; closed form
        (29) when the server holds no terms. Returns ``(||D||_inf, ||C||_inf)``."""
        s = self.schedule.scale
        w = np.zeros_like(self.x_hat)
        wz = np.zeros_like(self.x_hat)
        for n in self.names:
            r2 = 2.0 * (s * self.rhos[n]) ** 2
            w += r2
            wz += r2 * self.cache[n]
        self.local.set_quadratic(w, (wz - self.mu_sum) / w)
        x_new = self.local.solve(self.x_hat)
        D = float(np.abs(x_new - self.x_hat).max(initial=0.0))
        self.x_hat = x_new
        return D, self.primal()

    def primal(self) -> float:
        return max(float(np.abs(self.x_hat - self.cache[n]).max(initial=0.0)) for n in self.names)

    def scores(self) -> dict[str, float]:
        return {n: float(np.abs(self.x_hat - self.cache[n]).max(initial=0.0)) for n in self.names}

    def dual(self, update: bool) -> None:
        """Schedule (15) for every client (delivered with its next ``x_hat``)."""
        if update:
            s = self.schedule.scale
            for n in self.names:
                self.mu_sum += 2.0 * (s * self.rhos[n]) ** 2 * (self.x_hat - self.cache[n])
                self.pending[n] = s
                self.pending_x[n] = self.x_hat
        self.schedule.advance()


def _conclude(server, status, message, kkt):
    """dald-cc's and dald-dc's status messages (the driver has decided ``optimal`` /
    ``inaccurate``) with the outer rule's residuals ``||C||``, ``||D||``."""
    if status not in JUDGED:
        return status, message
    opts = server.options
    C, D = server.C, server.D
    hint = ""
    if status == "inaccurate":
        hint = "tighten eps_pri/eps_dual"
        if server.has_constraints:
            hint += (
                "; the constraints are only penalised (penalty="
                f"{opts.penalty:g}), so their violation is O(1/penalty): raise penalty or "
                "use method='prox-al'"
            )
    caps = {"max_iter": f"max_iter = {opts.max_iter}", "max_outer": f"max_outer = {opts.max_outer}"}
    return status, status_message(
        status,
        kkt,
        f"eps = {opts.eps:g}",
        rule=f"outer rule ||C|| <= {opts.eps_pri:g}, ||D|| <= {opts.eps_dual:g} met "
        f"(||C|| = {C:.2e}, ||D|| = {D:.2e})",
        budget=f"{caps.get(server.reason, server.reason)} (||C|| = {C:.2e}, ||D|| = {D:.2e})",
        hint=hint,
        local=server.nonconvex,
    )


def _setup(compiled: CompiledModel, opts: DALDOptions, method: str):
    names = [c.name for c in compiled.clients]
    x0 = starting_point(compiled, opts.w0)
    reg_share = scaled_regularizer(compiled.regularizer, 1.0 / len(names))
    return names, x0, reg_share


# ---------------------------------------------------------------------------------------
# dald-cc


def run_dald_cc(
    compiled: CompiledModel, opts: DALDOptions, method: str = "dald-cc", *, faults=None
):
    """Run Fed-DALD-CC (seed 004 Algorithm 2) through the driver (any backend, checkpoints,
    failure policies)."""
    if opts.topology is not None or opts.root is not None or opts.order is not None:
        raise ModelError(
            f"{method}: topology, root and order are options of dald-dc; dald-cc always uses "
            "the star around the server"
        )
    names, x0, reg_share = _setup(compiled, opts, method)
    rhos = rho_for_clients(opts, names, compiled.layout.size, method)
    opts.coordination_check(names)
    client_opts = opts.for_clients()  # what travels to where the clients run
    factories = {
        c.name: EndpointFactory(DALDCCClient, (c, rhos[c.name], reg_share, client_opts))
        for c in compiled.clients
    }
    server = DALDCCServer(
        compiled.server, rhos, opts, x0, compiled.has_constraints, compiled.nonconvex
    )
    return run_federated(compiled, opts, method, server, factories, faults=faults)


# ---------------------------------------------------------------------------------------
# dald-dc


class DALDDCServer(PenaltyServer):
    """The coordinator of dald-dc's sweeps: there is no server variable. Each :meth:`step`
    activates the nodes of one inner iteration level by level (root last; their iterates
    travel peer to peer), then lets the root decide (continue / multiplier step / stop) from
    the residuals gathered by the convergecast. The returned point is the root's iterate,
    gathered before each evaluation (:meth:`sync`). State: the coordination sequence's
    generator, the counters and the root's last decision.
    """

    messages = DALD
    state_fields = (
        "x", "k", "v", "total", "forced_full", "D", "C", "rho_scale", "snapshots", "reason",
    )  # fmt: skip
    component_fields = ("coord",)
    step_name = "inner iteration"

    def __init__(self, program, hier, opts: DALDOptions, x0, has_constraints, nonconvex):
        super().__init__(program, opts)
        self.hier = hier
        self.root = hier.root
        self.has_constraints = has_constraints
        self.nonconvex = nonconvex
        self.max_steps = int(opts.max_iter)
        self.coord = Coordination(
            opts.coordination, hier.order, opts.fraction, opts.dropout, opts.random_state
        )
        self.rule = InnerRule(opts)  # public parameters: to know the last sweep
        self.snap_at = {int(s) for s in opts.snapshot_iterations}
        self.x = np.array(x0, dtype=float)
        self.k, self.v, self.total = 1, 0, 0
        self.forced_full = False
        self.D = self.C = np.inf
        self.rho_scale = 1.0
        self.snapshots: dict[int, dict] = {}
        self.reason = "max_iter"
        self.consensus_kkt: dict[str, float] = {}

    def start(self, runtime) -> None:
        pass

    def step(self, runtime, deadline) -> StepReport:
        hier, coord, opts = self.hier, self.coord, self.options
        self.total += 1
        k, v = self.k, self.v
        full = self.forced_full or coord.is_full or self.rule.is_last(k, v + 1)
        scores = (
            {s: runtime.activate(s, "dc_score") for s in hier.order}
            if coord.spec == "greedy" and not full
            else None
        )
        seq = coord.sequence(k, v + 1, full=full, scores=scores)
        full_sweep = seq == hier.order
        runtime.next_round()
        if full_sweep:
            for s in hier.order:
                runtime.activate(s, "dc_solve", {})
                runtime.deliver_peer_messages()
        else:
            for s in seq:
                runtime.activate(s, "dc_solve", {"report": False})
                runtime.deliver_peer_messages()
            for s in hier.order:  # residual convergecast of a partial sweep
                runtime.activate(s, "dc_relay", {})
                runtime.deliver_peer_messages()
        out = runtime.activate(self.root, "dc_decide", {"full": full_sweep})  # root's own step
        runtime.deliver_peer_messages()
        decision, self.D, self.C = out["d"], out["D"], out["C"]
        self.rho_scale = out["rho_scale"]
        self.forced_full = decision == FULL_NEXT
        report = StepReport(
            info={
                "iteration": k,
                "inner_total": self.total,
                "D": self.D,
                "C": self.C,
                "rho_scale": self.rho_scale,
            },
            record=decision in (OUTER, STOP),
        )
        if self.total in self.snap_at:
            replies = runtime.broadcast("snapshot", {}, channel="diagnostic")
            local = {n: r.payload["x"] for n, r in replies.items()}
            self.snapshots[self.total] = {"local": local, "root": local[self.root]}
        if decision == OUTER:
            self.k += 1
            self.v = 0
        else:
            self.v += 1
        if decision == STOP:
            self.reason = out["reason"]
            report.stop = "stopped" if self.reason == "converged" else "max_iterations"
        elif (
            not (np.isfinite(self.D) and np.isfinite(self.C))
            or max(self.D, self.C) > opts.divergence_limit
        ):
            report.stop = "unbounded"
            report.message = (
                "the iterates diverge; the model may be unbounded below, or a fixed step is too "
                "long"
            )
        return report

    def sync(self, runtime) -> None:
        self.x = np.asarray(
            runtime.send(self.root, "output", {}, channel="diagnostic").payload["x"], dtype=float
        )

    def point(self) -> np.ndarray:
        return self.x

    def diagnostics(self, reports: dict[str, dict]) -> dict:
        nodes = self.hier.order
        self.consensus_kkt = {
            "primal_73": max(reports[n]["r_primal"] for n in nodes),
            "dual_74": max(reports[n]["r_dual"] for n in nodes),
        }
        return dict(self.consensus_kkt)

    def round_counts(self) -> dict[str, int]:
        outer = self.k - 1 if self.v == 0 else self.k
        return {"outer": min(outer, self.options.max_outer), "inner": self.total}

    def conclude(self, status, message, kkt, summary, history):
        return _conclude(self, status, message, kkt)

    def extra(self, reports: dict[str, dict]) -> dict:
        hier = self.hier
        return {
            "root": self.root,
            "hierarchy": {
                "order": hier.order,
                "levels": hier.levels,
                "edges": hier.edges,
                "matrix": hier.matrix(hier.order),
            },
            "local_x": {n: r["x"] for n, r in reports.items()},
            "edge_multipliers": {
                key: val for r in reports.values() for key, val in r["mu_edges"].items()
            },
            "consensus_kkt": dict(self.consensus_kkt),
            "residuals": {"C": self.C, "D": self.D},
            "snapshots": self.snapshots,
            "visits": dict(self.coord.visits),
            "reason": self.reason,
        }


def run_dald_dc(
    compiled: CompiledModel, opts: DALDOptions, method: str = "dald-dc", *, faults=None
):
    """Run Fed-DALD-DC (seed 004 Algorithm 3) through the driver: the nodes (the clients, and
    the server when it is a node of the topology) run on any backend, their iterates travel
    peer to peer."""
    names, x0, reg_share = _setup(compiled, opts, method)
    hier = build_hierarchy(opts.topology, names, root=opts.root, order=opts.order)
    server_node = SERVER in hier.level
    if not server_node and not compiled.server.is_empty:
        raise UnsupportedError(
            f"{method} has no server, but the server holds terms or constraints; make "
            "'server' a node of the topology (e.g. topology='star' or a graph with a 'server' "
            "node) so that it takes part as a peer, or use dald-cc"
        )
    rhos = rho_for_edges(opts, hier.edges, compiled.layout.size, method)
    opts.coordination_check(hier.order)
    node_opts = opts.for_clients(topology=None)  # what travels to the nodes
    factories = {}
    for s in hier.order:
        program = compiled.server if s == SERVER else compiled.program(s)
        incident = {e: rhos[e] for e in hier.edges if s in e}
        factories[s] = EndpointFactory(
            DALDDCNode,
            (
                program,
                Regularizer() if s == SERVER else reg_share,
                hier.lower[s],
                hier.higher[s],
                incident,
                hier.level[s],
                x0,
                node_opts,
                RUNTIME_PROXY,
            ),
            {"is_root": s == hier.root},
        )
    server = DALDDCServer(
        compiled.server, hier, opts, x0, compiled.has_constraints, compiled.nonconvex
    )
    return run_federated(compiled, opts, method, server, factories, faults=faults)
