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
(:mod:`fedmodel.algorithms.dald.topology`); nodes solve (20) level by level (root last) with
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
    evaluation_payload,
    make_result,
    pooled_certificate,
    split_multipliers,
    starting_point,
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
from fedmodel.algorithms.dald.local import scaled_regularizer
from fedmodel.algorithms.dald.options import (
    DALDOptions,
    InnerRule,
    PenaltySchedule,
    rho_for_clients,
    rho_for_edges,
)
from fedmodel.algorithms.dald.topology import SERVER, Coordination, build_hierarchy
from fedmodel.compiler.partition import CompiledModel
from fedmodel.compiler.regularizer import Regularizer
from fedmodel.errors import ModelError, UnsupportedError
from fedmodel.runtime.messages import CountingLedger, communication_totals
from fedmodel.runtime.serial import SerialRuntime


def _grouped(seq: list[str]) -> list[tuple[str, int]]:
    out: dict[str, int] = {}
    for s in seq:
        out[s] = out.get(s, 0) + 1
    return list(out.items())


class DALDCCServer:
    """Server half of dald-cc: the consensus step (14)/(29), the residuals, the rules."""

    def __init__(self, program, rhos: dict[str, np.ndarray], opts: DALDOptions, x0: np.ndarray):
        self.program = program
        self.rhos = rhos
        self.names = list(rhos)
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

    def step(self) -> tuple[float, float]:
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


def _setup(compiled: CompiledModel, opts: DALDOptions, method: str):
    opts.validate(compiled, method)
    names = [c.name for c in compiled.clients]
    x0 = starting_point(compiled, opts.w0)
    reg_share = scaled_regularizer(compiled.regularizer, 1.0 / len(names))
    return names, x0, reg_share


def _runtime(endpoints, keep_ledger: bool) -> SerialRuntime:
    runtime = SerialRuntime(endpoints)
    if not keep_ledger:
        runtime.ledger = CountingLedger()
    return runtime


def _history_row(k, total, kkt, summary, D, C, consensus, extra) -> dict:
    return {
        "iteration": k,
        "inner_total": total,
        "objective": summary["objective"],
        "max_violation": summary["max_violation"],
        "stationarity": kkt.stationarity,
        "feasibility": kkt.feasibility,
        "D": D,
        "C": C,
        **consensus,
        **extra,
    }


def _finish(
    compiled,
    opts,
    method,
    *,
    status,
    reason,
    x,
    kkt,
    summary,
    reports,
    runtime,
    k,
    total,
    t_setup,
    t_solve,
    history,
    extra,
    final_reports,
    D,
    C,
):
    """Status, message and :class:`~fedmodel.result.Result` (shared by dald-cc/dc)."""
    certified = kkt.satisfied(opts.eps, opts.eps)
    if status == "stopped":
        if certified:
            status = "optimal"
            message = (
                f"outer rule ||C|| <= {opts.eps_pri:g}, ||D|| <= {opts.eps_dual:g} met; KKT "
                f"certificate within eps = {opts.eps:g}"
            )
            if compiled.nonconvex:
                message += " (a local certificate: the model has non-convex terms)"
        else:
            status = "inaccurate"
            message = (
                f"outer rule met (||C|| = {C:.2e}, ||D|| = {D:.2e}) but the KKT certificate "
                f"reads stationarity {kkt.stationarity:.2e}, feasibility {kkt.feasibility:.2e} "
                f"(eps = {opts.eps:g}); tighten eps_pri/eps_dual"
            )
            if compiled.has_constraints:
                message += (
                    "; the constraints are only penalised (penalty="
                    f"{opts.penalty:g}), so their violation is O(1/penalty): raise penalty or "
                    "use method='prox-al'"
                )
    elif status == "max_iterations":
        what = {
            "max_iter": f"max_iter = {opts.max_iter}",
            "max_outer": f"max_outer = {opts.max_outer}",
        }
        message = (
            f"{what.get(reason, reason)} reached with ||C|| = {C:.2e}, ||D|| = {D:.2e}; KKT "
            f"stationarity {kkt.stationarity:.2e}, feasibility {kkt.feasibility:.2e}"
        )
    elif status == "time_limit":
        message = f"time limit of {opts.time_limit:g} s reached after {total} inner iterations"
    else:
        message = reason
    multipliers = {}
    for p in compiled.parties:
        r = reports.get(p.name)
        if r is not None:
            multipliers[p.name] = split_multipliers(p, r["mu_c"], r["nu_c"])
    per_party = {n: float(r.get("seconds", 0.0)) for n, r in final_reports.items()}
    local_iters = {n: int(r.get("local_iterations", 0)) for n, r in final_reports.items()}
    return make_result(
        compiled,
        method=method,
        status=status,
        x=x,
        kkt=kkt,
        summary=summary,
        multipliers=multipliers,
        message=message,
        rounds={"outer": k, "inner": total, "communication": runtime.round},
        communication=communication_totals(runtime.ledger),
        timing={
            "compile": t_setup,
            "solve": time.perf_counter() - t_solve,
            "per_party": per_party,
            "local_iterations": local_iters,
        },
        history=history,
        options={
            k_: v for k_, v in opts.__dict__.items() if k_ not in ("w0", "callback", "topology")
        },
        ledger=runtime.ledger.rows,
        extra=extra,
    )


# ---------------------------------------------------------------------------------------
# dald-cc


def run_dald_cc(compiled: CompiledModel, opts: DALDOptions, method: str = "dald-cc"):
    """Run Fed-DALD-CC (seed 004 Algorithm 2)."""
    t0 = time.perf_counter()
    if opts.topology is not None or opts.root is not None or opts.order is not None:
        raise ModelError(
            f"{method}: topology, root and order are options of dald-dc; dald-cc always uses "
            "the star around the server"
        )
    names, x0, reg_share = _setup(compiled, opts, method)
    m = compiled.layout.size
    rhos = rho_for_clients(opts, names, m, method)
    opts.coordination_check(names)
    clients = {c.name: DALDCCClient(c, rhos[c.name], reg_share, opts) for c in compiled.clients}
    runtime = _runtime(clients, opts.keep_ledger)
    server = DALDCCServer(compiled.server, rhos, opts, x0)
    coord = Coordination(opts.coordination, names, opts.fraction, opts.dropout, opts.random_state)
    rule = InnerRule(opts)
    t_setup = time.perf_counter() - t0

    t_solve = time.perf_counter()
    deadline = t_solve + opts.time_limit if opts.time_limit else None
    snaps = {int(s) for s in opts.snapshot_iterations}
    snapshots: dict[int, dict] = {}
    history: list[dict] = []
    k, v, total = 1, 0, 0
    pending_full = False
    status, reason = "max_iterations", "max_iter"
    D = C = np.inf

    def evaluate(x_hat, scale):
        replies = runtime.broadcast(
            "evaluate", {"w": x_hat, "x_hat": x_hat, "rho_scale": scale}, channel="diagnostic"
        )
        reports = {n: r.payload for n, r in replies.items()}
        reports[compiled.server.name] = evaluation_payload(compiled.server, x_hat, opts.penalty)
        kkt, summary = pooled_certificate(compiled, reports, x_hat)
        mu_sum = sum(reports[n]["mu_plus"] for n in names)
        consensus = {
            "primal_65": max(reports[n]["r_primal"] for n in names),
            "dual_66": max(reports[n]["r_dual"] for n in names),
            "sum_mu_67": float(np.abs(mu_sum).max(initial=0.0)),
        }
        return kkt, summary, reports, consensus

    while True:
        v += 1
        total += 1
        full = pending_full or coord.is_full or rule.is_last(k, v)
        scores = server.scores() if coord.spec == "greedy" else None
        seq = coord.sequence(k, v, full=full, scores=scores)
        full = full or sorted(seq) == sorted(names)
        runtime.next_round()
        for name, count in _grouped(seq):
            reply = runtime.send(name, "cc_solve", server.payload(name, count))
            server.cache[name] = np.asarray(reply.payload["x"], dtype=float)
        D, C = server.step()
        if (
            not np.all(np.isfinite(server.x_hat))
            or np.abs(server.x_hat).max() > opts.divergence_limit
        ):
            status, reason = (
                "unbounded",
                (
                    f"the iterates diverge (||x_hat||_inf = {np.abs(server.x_hat).max():.3g}); the "
                    "model may be unbounded below, or a fixed step is too long"
                ),
            )
            break
        decision = CONTINUE
        if pending_full:
            pending_full = False
            decision = OUTER
        elif rule.inner_done(k, v, D) or v >= rule.max_inner:
            if full:
                decision = OUTER
            else:
                pending_full = True
                decision = FULL_NEXT
        if decision == OUTER and rule.outer_done(C, D):
            decision = STOP
        if decision in (OUTER, STOP) and opts.history:
            kkt, summary, _, consensus = evaluate(server.x_hat, server.schedule.scale)
            row = _history_row(
                k,
                total,
                kkt,
                summary,
                D,
                C,
                consensus,
                {"rho_scale": server.schedule.scale, "rounds": runtime.round},
            )
            history.append(row)
        if decision in (OUTER, STOP) and opts.callback is not None:
            opts.callback(
                history[-1] if history else {"iteration": k, "inner_total": total, "D": D, "C": C}
            )
        if total in snaps:
            replies = runtime.broadcast("snapshot", {}, channel="diagnostic")
            snapshots[total] = {
                "x_hat": server.x_hat.copy(),
                "local": {n: r.payload["x"] for n, r in replies.items()},
            }
        if decision == STOP:
            status, reason = "stopped", "converged"
            break
        if decision == OUTER:
            server.dual(opts.update_multipliers)
            k += 1
            v = 0
            if k > opts.max_outer:
                status, reason = "max_iterations", "max_outer"
                break
        if total >= opts.max_iter:
            status, reason = "max_iterations", "max_iter"
            break
        if deadline is not None and time.perf_counter() > deadline:
            status, reason = "time_limit", "time_limit"
            break

    x = server.x_hat
    kkt, summary, reports, consensus = evaluate(x, server.schedule.scale)
    finals = runtime.broadcast(
        "report", {"x_hat": x, "rho_scale": server.schedule.scale}, channel="diagnostic"
    )
    final_reports = {n: r.payload for n, r in finals.items()}
    extra = {
        "x_hat": x.copy(),
        "local_x": {n: r["x"] for n, r in final_reports.items()},
        "consensus_multipliers": {n: r["mu_plus"] for n, r in final_reports.items()},
        "consensus_kkt": consensus,
        "residuals": {"C": C, "D": D},
        "snapshots": snapshots,
        "visits": dict(coord.visits),
        "reason": reason,
    }
    return _finish(
        compiled,
        opts,
        method,
        status=status,
        reason=reason,
        x=x,
        kkt=kkt,
        summary=summary,
        reports=reports,
        runtime=runtime,
        k=k - 1 if v == 0 else k,
        total=total,
        t_setup=t_setup,
        t_solve=t_solve,
        history=history,
        extra=extra,
        final_reports=final_reports,
        D=D,
        C=C,
    )


# ---------------------------------------------------------------------------------------
# dald-dc


def run_dald_dc(compiled: CompiledModel, opts: DALDOptions, method: str = "dald-dc"):
    """Run Fed-DALD-DC (seed 004 Algorithm 3)."""
    t0 = time.perf_counter()
    names, x0, reg_share = _setup(compiled, opts, method)
    hier = build_hierarchy(opts.topology, names, root=opts.root, order=opts.order)
    server_node = SERVER in hier.level
    if not server_node and not compiled.server.is_empty:
        raise UnsupportedError(
            f"{method} has no server, but the server holds terms or constraints; make "
            "'server' a node of the topology (e.g. topology='star' or a graph with a 'server' "
            "node) so that it takes part as a peer, or use dald-cc"
        )
    m = compiled.layout.size
    rhos = rho_for_edges(opts, hier.edges, m, method)
    opts.coordination_check(hier.order)
    runtime = _runtime({}, opts.keep_ledger)
    nodes = {}
    for s in hier.order:
        program = compiled.server if s == SERVER else compiled.program(s)
        incident = {e: rhos[e] for e in hier.edges if s in e}
        nodes[s] = DALDDCNode(
            program,
            Regularizer() if s == SERVER else reg_share,
            hier.lower[s],
            hier.higher[s],
            incident,
            hier.level[s],
            x0,
            opts,
            runtime,
            is_root=(s == hier.root),
        )
    runtime.endpoints.update(nodes)
    runtime.client_seconds.update({s: 0.0 for s in nodes})
    coord = Coordination(
        opts.coordination, hier.order, opts.fraction, opts.dropout, opts.random_state
    )
    rule = InnerRule(opts)  # public parameters: the driver uses them to know the last sweep
    root = hier.root
    t_setup = time.perf_counter() - t0

    t_solve = time.perf_counter()
    deadline = t_solve + opts.time_limit if opts.time_limit else None
    snaps = {int(s) for s in opts.snapshot_iterations}
    snapshots: dict[int, dict] = {}
    history: list[dict] = []
    k, v, total = 1, 0, 0
    forced_full = False
    status, reason = "max_iterations", "max_iter"
    D = C = np.inf

    def evaluate():
        x_out = runtime.send(root, "output", {}, channel="diagnostic").payload["x"]
        replies = runtime.broadcast("evaluate", {"w": x_out}, channel="diagnostic")
        reports = {n: r.payload for n, r in replies.items()}
        if not server_node:
            reports[SERVER] = evaluation_payload(compiled.server, x_out, opts.penalty)
        kkt, summary = pooled_certificate(compiled, reports, x_out)
        consensus = {
            "primal_73": max(reports[n]["r_primal"] for n in replies),
            "dual_74": max(reports[n]["r_dual"] for n in replies),
        }
        return x_out, kkt, summary, reports, consensus

    while True:
        total += 1
        full = forced_full or coord.is_full or rule.is_last(k, v + 1)
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
        out = runtime.activate(root, "dc_decide", {"full": full_sweep})  # the root's own step
        runtime.deliver_peer_messages()
        decision, D, C = out["d"], out["D"], out["C"]
        forced_full = decision == FULL_NEXT
        if decision in (OUTER, STOP) and opts.history:
            _, kkt, summary, _, consensus = evaluate()
            history.append(
                _history_row(
                    k,
                    total,
                    kkt,
                    summary,
                    D,
                    C,
                    consensus,
                    {"rho_scale": out["rho_scale"], "rounds": runtime.round},
                )
            )
        if decision in (OUTER, STOP) and opts.callback is not None:
            opts.callback(
                history[-1] if history else {"iteration": k, "inner_total": total, "D": D, "C": C}
            )
        if total in snaps:
            replies = runtime.broadcast("snapshot", {}, channel="diagnostic")
            snapshots[total] = {"local": {n: r.payload["x"] for n, r in replies.items()}}
            snapshots[total]["root"] = snapshots[total]["local"][root]
        if decision == OUTER:
            k += 1
            v = 0
        else:
            v += 1
        if decision == STOP:
            reason = out["reason"]
            status = "stopped" if reason == "converged" else "max_iterations"
            break
        if deadline is not None and time.perf_counter() > deadline:
            status, reason = "time_limit", "time_limit"
            break
        if not (np.isfinite(D) and np.isfinite(C)) or max(D, C) > opts.divergence_limit:
            status, reason = (
                "unbounded",
                (
                    "the iterates diverge; the model may be unbounded below, or a fixed step is too "
                    "long"
                ),
            )
            break

    x, kkt, summary, reports, consensus = evaluate()
    finals = runtime.broadcast("report", {}, channel="diagnostic")
    final_reports = {n: r.payload for n, r in finals.items()}
    extra = {
        "root": root,
        "hierarchy": {
            "order": hier.order,
            "levels": hier.levels,
            "edges": hier.edges,
            "matrix": hier.matrix(hier.order),
        },
        "local_x": {n: r["x"] for n, r in final_reports.items()},
        "edge_multipliers": {
            key: val for r in final_reports.values() for key, val in r["mu"].items()
        },
        "consensus_kkt": consensus,
        "residuals": {"C": C, "D": D},
        "snapshots": snapshots,
        "visits": dict(coord.visits),
        "reason": reason,
    }
    return _finish(
        compiled,
        opts,
        method,
        status=status,
        reason=reason,
        x=x,
        kkt=kkt,
        summary=summary,
        reports=reports,
        runtime=runtime,
        k=min(k - 1 if v == 0 else k, opts.max_outer),
        total=total,
        t_setup=t_setup,
        t_solve=t_solve,
        history=history,
        extra=extra,
        final_reports=final_reports,
        D=D,
        C=C,
    )
