"""``dgd`` (seed 004 eq. 55; Nedic and Ozdaglar 2009): decentralized gradient descent over a
peer-to-peer topology. Each node sends ``x_i`` to its neighbours and updates ``x_i <- prox_{alpha_i h/n}(sum_j p_ij x_j -
alpha_i grad f_i(x_i))`` with Metropolis mixing weights (or a given matrix); the returned
point is the average of the nodes' iterates (gathered on the diagnostic channel).
Constraints enter through the quadratic penalty ``penalty=beta`` (see
:mod:`fedmodel.algorithms.baselines.fedavg`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedmodel.algorithms.baselines.common import (
    _evaluate,
    _int_at_least_1,
    _local,
    _positive,
    _result,
    _status,
)
from fedmodel.algorithms.common import (
    evaluation_payload,
    starting_point,
)
from fedmodel.algorithms.dald.local import scaled_regularizer
from fedmodel.algorithms.dald.options import check_constraints
from fedmodel.algorithms.dald.topology import SERVER, metropolis_weights, topology_graph
from fedmodel.algorithms.protocol import ClientHalf
from fedmodel.compiler.partition import CompiledModel
from fedmodel.compiler.regularizer import Regularizer
from fedmodel.errors import ModelError, UnsupportedError
from fedmodel.runtime.messages import CountingLedger
from fedmodel.runtime.serial import SerialRuntime


@dataclass
class DGDOptions:
    """Options of ``dgd`` (seed 004 eq. 55).

    Attributes
    ----------
    topology : networkx graph, hierarchical matrix, str or None
        The communication graph (default ``"chain"``); ``"server"`` may be a node.
    mixing : "metropolis" or array
        Mixing weights ``p_ij``: Metropolis-Hastings weights on the graph (default), or an
        ``n x n`` row-stochastic matrix over the nodes (clients in model order, then
        ``"server"`` if it is a node) with ``p_ij = 0`` off the graph's edges.
    step : float or None
        ``alpha``; ``None``: each node uses ``1 / (2 L_i)``, with ``L_i`` its own gradient's
        Lipschitz estimate at ``x^0`` (power iteration on Hessian-vector products); the
        factor 1/2 keeps the iteration stable for mixing matrices with eigenvalues down to
        -1/2.
    step_decay : float
        ``alpha_k = alpha / k^step_decay`` (0: constant step, which converges to an
        O(alpha) neighbourhood of the optimum; seed 004 expects ``alpha_k -> 0``).
    max_rounds : int
    tol : float or None
        Stop when every node moved less than ``tol`` (gathered on the diagnostic channel).
    penalty, eps, w0, history, callback, time_limit, keep_ledger, blas_threads : as for
        fedavg.
    """

    topology: Any = None
    mixing: Any = "metropolis"
    step: float | None = None
    step_decay: float = 0.0
    max_rounds: int = 1000
    tol: float | None = None
    penalty: float | None = None
    eps: float = 1e-3
    w0: Any = None
    history: bool = True
    callback: Any = None
    time_limit: float | None = None
    keep_ledger: bool = True
    snapshot_iterations: Any = ()
    blas_threads: int | None = 1

    def validate(self, compiled: CompiledModel, method: str) -> None:
        _int_at_least_1(method, "max_rounds", self.max_rounds)
        for name in ("step", "tol", "penalty"):
            if getattr(self, name) is not None:
                _positive(method, name, getattr(self, name))
        _positive(method, "eps", self.eps)
        if not (np.isfinite(self.step_decay) and self.step_decay >= 0):
            raise ModelError(f"{method}: step_decay must be >= 0, got {self.step_decay!r}")
        check_constraints(compiled, method, self.penalty)


class DGDNode(ClientHalf):
    """Node of dgd: keeps ``x_i`` and its neighbours' last iterates."""

    state_fields = ("x", "nbr", "alpha", "k", "last_move")
    component_fields = ("local",)

    def __init__(self, program, reg_share, neighbours, weights, x0, opts: DGDOptions, runtime):
        super().__init__(program)
        self.penalty = opts.penalty
        self.local = _local(program, reg_share, opts.penalty, opts, kind="prox-grad", steps=1)
        self.neighbours = list(neighbours)
        self.weights = dict(weights)
        self.runtime = runtime
        self.x = np.array(x0, dtype=float)
        self.nbr = {j: self.x.copy() for j in self.neighbours}
        self.alpha = float(opts.step) if opts.step is not None else None
        self.decay = float(opts.step_decay)
        self.k = 0
        self.last_move = np.inf

    def handle(self, msg):
        if msg.kind == "dgd_x":
            self.nbr[msg.sender] = np.asarray(msg.payload["x"], dtype=float)
            return None
        return super().handle(msg)

    def _on_dgd_send(self):
        for j in self.neighbours:
            self.runtime.send_peer(self.name, j, "dgd_x", {"x": self.x})

    def _on_dgd_step(self):
        if self.alpha is None:
            L = self.local.lipschitz_estimate(self.x)
            self.alpha = 0.5 / L if L > 0 else 1.0
        self.k += 1
        alpha = self.alpha / self.k**self.decay
        mixed = self.weights[self.name] * self.x
        for j in self.neighbours:
            mixed = mixed + self.weights[j] * self.nbr[j]
        z = mixed - alpha * self.local.gradient_f(self.x)
        new = self.local.reg.prox(z, alpha) if not self.local.reg.is_zero else z
        self.last_move = float(np.abs(new - self.x).max(initial=0.0))
        self.x = new
        self.local.stats.iterations += 1

    def _on_state(self):
        return {"x": self.x.copy(), "move": self.last_move}

    def _on_evaluate(self, w):
        return evaluation_payload(self.program, np.asarray(w, dtype=float), self.penalty)

    def _on_snapshot(self):
        return {"x": self.x.copy()}

    def _on_report(self):
        return {
            "seconds": self.stats["seconds"],
            "local_iterations": self.local.stats.iterations,
            "x": self.x.copy(),
            "alpha": self.alpha,
        }


def _mixing(opts: DGDOptions, g, nodes: list[str], method: str) -> dict[str, dict[str, float]]:
    if isinstance(opts.mixing, str):
        if opts.mixing != "metropolis":
            raise ModelError(
                f"{method}: mixing must be 'metropolis' or a matrix, got {opts.mixing!r}"
            )
        return metropolis_weights(g, nodes)
    P = np.asarray(opts.mixing, dtype=float)
    if P.shape != (len(nodes), len(nodes)):
        raise ModelError(
            f"{method}: the mixing matrix must be {len(nodes)} x {len(nodes)} (nodes {nodes}), "
            f"got shape {P.shape}"
        )
    if np.any(P < 0) or not np.allclose(P.sum(axis=1), 1.0):
        raise ModelError(f"{method}: the mixing matrix must be nonnegative with rows summing to 1")
    out = {}
    for i, a in enumerate(nodes):
        row = {}
        for j, b in enumerate(nodes):
            if P[i, j] == 0:
                continue
            if a != b and not g.has_edge(a, b):
                raise ModelError(
                    f"{method}: mixing weight p[{a!r}, {b!r}] > 0 but they are not neighbours"
                )
            row[b] = float(P[i, j])
        row.setdefault(a, 0.0)
        out[a] = row
    return out


def run_dgd(compiled: CompiledModel, opts: DGDOptions, method: str = "dgd"):
    t0 = time.perf_counter()
    opts.validate(compiled, method)
    names = [c.name for c in compiled.clients]
    g = topology_graph(opts.topology, names)
    if SERVER not in g and not compiled.server.is_empty:
        raise UnsupportedError(
            f"{method} has no server, but the server holds terms or constraints; make 'server' "
            "a node of the topology"
        )
    nodes = names + ([SERVER] if SERVER in g else [])
    weights = _mixing(opts, g, nodes, method)
    reg_share = scaled_regularizer(compiled.regularizer, 1.0 / len(names))
    x0 = starting_point(compiled, opts.w0)
    runtime = SerialRuntime({})
    if not opts.keep_ledger:
        runtime.ledger = CountingLedger()
    endpoints = {}
    for s in nodes:
        prog = compiled.server if s == SERVER else compiled.program(s)
        nbrs = [j for j in weights[s] if j != s]
        endpoints[s] = DGDNode(
            prog, Regularizer() if s == SERVER else reg_share, nbrs, weights[s], x0, opts, runtime
        )
    runtime.endpoints.update(endpoints)
    runtime.client_seconds.update({s: 0.0 for s in endpoints})
    t_setup = time.perf_counter() - t0
    t_solve = time.perf_counter()
    deadline = t_solve + opts.time_limit if opts.time_limit else None
    history: list[dict] = []
    snapshots: dict[int, dict] = {}
    snaps = {int(s) for s in opts.snapshot_iterations}
    stopped, status_override = False, None
    move = np.inf

    def gather():
        states = {
            k: v.payload for k, v in runtime.broadcast("state", {}, channel="diagnostic").items()
        }
        x_avg = sum(s["x"] for s in states.values()) / len(states)
        return x_avg, max(s["move"] for s in states.values()), states

    r = 0
    for r in range(1, opts.max_rounds + 1):
        runtime.next_round()
        for s in nodes:
            runtime.activate(s, "dgd_send", {})
        runtime.deliver_peer_messages()
        for s in nodes:
            runtime.activate(s, "dgd_step", {})
        need = opts.history or opts.tol is not None or r in snaps
        if need:
            x_avg, move, states = gather()
            if not np.all(np.isfinite(x_avg)):
                status_override = "unbounded"
                break
            if opts.history:
                kkt, summary, _ = _evaluate(runtime, compiled, x_avg, opts.penalty)
                history.append(
                    {
                        "iteration": r,
                        "objective": summary["objective"],
                        "max_violation": summary["max_violation"],
                        "stationarity": kkt.stationarity,
                        "feasibility": kkt.feasibility,
                        "move_inf": move,
                        "rounds": runtime.round,
                    }
                )
            if r in snaps:
                snapshots[r] = {"x_avg": x_avg, "local": {k: v["x"] for k, v in states.items()}}
        if opts.callback is not None:
            opts.callback(history[-1] if history else {"iteration": r})
        if opts.tol is not None and move <= opts.tol:
            stopped = True
            break
        if deadline is not None and time.perf_counter() > deadline:
            status_override = "time_limit"
            break

    x_avg, move, states = gather()
    kkt, summary, reports = _evaluate(runtime, compiled, x_avg, opts.penalty)
    tol_opts = opts if opts.tol is not None else _WithTol(opts)
    status, message = _status(compiled, tol_opts, stopped, kkt, r, move, "largest node move")
    if status_override == "unbounded" or not np.all(np.isfinite(x_avg)):
        status, message = "unbounded", "the iterates diverge (non-finite values); lower step"
    elif status_override == "time_limit":
        status, message = (
            "time_limit",
            f"time limit of {opts.time_limit:g} s reached after {r} rounds",
        )
    finals = {
        k: v.payload for k, v in runtime.broadcast("report", {}, channel="diagnostic").items()
    }
    return _result(
        compiled,
        opts,
        method,
        status,
        message,
        x_avg,
        kkt,
        summary,
        reports,
        runtime,
        r,
        t_setup,
        t_solve,
        history,
        {
            "local_x": {k: v["x"] for k, v in finals.items()},
            "mixing": weights,
            "steps": {k: v["alpha"] for k, v in finals.items()},
            "snapshots": snapshots,
        },
        finals,
    )


class _WithTol:
    def __init__(self, opts):
        self.__dict__.update(opts.__dict__)
        self.tol = 0.0
