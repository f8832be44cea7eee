"""``dgd`` (seed 004 eq. 55; Nedic and Ozdaglar 2009): decentralized gradient descent over a
peer-to-peer topology. Each node sends ``x_i`` to its neighbours and updates ``x_i <- prox_{alpha_i h/n}(sum_j p_ij x_j -
alpha_i grad f_i(x_i))`` with Metropolis mixing weights (or a given matrix); the returned
point is the average of the nodes' iterates (gathered on the diagnostic channel).
Constraints enter through the quadratic penalty ``penalty=beta`` (see
:mod:`fedmodel.algorithms.baselines.fedavg`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from fedmodel.algorithms.baselines.common import (
    _local,
    _status,
)
from fedmodel.algorithms.baselines.messages import BASELINES
from fedmodel.algorithms.common import (
    PenaltyClient,
    PenaltyServer,
    starting_point,
)
from fedmodel.algorithms.driver import run_federated
from fedmodel.algorithms.local import check_constraints, scaled_regularizer
from fedmodel.algorithms.options import RuntimeOptions, positive, stop_only, whole_number
from fedmodel.algorithms.protocol import StepReport
from fedmodel.algorithms.topology import SERVER, metropolis_weights, topology_graph
from fedmodel.compiler.partition import CompiledModel
from fedmodel.compiler.regularizer import Regularizer
from fedmodel.errors import ModelError, UnsupportedError
from fedmodel.runtime.endpoints import RUNTIME_PROXY, EndpointFactory
from fedmodel.runtime.wire import register_wire_type


@register_wire_type("dgd.options")
@dataclass
class DGDOptions(RuntimeOptions):
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
    penalty, eps, w0 : as for fedavg.
    (and the runtime options below)
    """

    topology: Any = None
    mixing: Any = "metropolis"
    step: float | None = None
    step_decay: float = 0.0
    max_rounds: int = stop_only(1000)
    tol: float | None = None
    penalty: float | None = None
    eps: float = stop_only(1e-3)
    w0: Any = None
    snapshot_iterations: Any = ()

    def validate(self, compiled: CompiledModel, method: str) -> None:
        whole_number("max_rounds", self.max_rounds, method=method)
        for name in ("step", "tol", "penalty"):
            if getattr(self, name) is not None:
                positive(name, getattr(self, name), method=method)
        positive("eps", self.eps, method=method)
        if not (np.isfinite(self.step_decay) and self.step_decay >= 0):
            raise ModelError(f"{method}: step_decay must be >= 0, got {self.step_decay!r}")
        check_constraints(compiled, method, self.penalty)


class DGDUpdate(PenaltyClient):
    """A node's DGD state and update (55): ``x_i``, its copies of the neighbours' last
    iterates and its step count; the message handlers are its subclasses' (``dgd``'s
    :class:`DGDNode`, ``dagd``'s :class:`~fedmodel.algorithms.dald.dagd.DAGDNode`)."""

    state_fields = ("x", "nbr", "alpha", "k", "last_move", "last_w")
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
        self.last_w: np.ndarray | None = None

    def update(self) -> None:
        """One update (55) with the neighbours' iterates held: ``x_i <- prox_{alpha_k
        h/n}(sum_j p_ij x_j - alpha_k grad f_i(x_i))``, ``alpha_k = alpha / k^decay``."""
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

    def _on_report(self):
        return {
            **super()._on_report(),
            "local_iterations": self.local.stats.iterations,
            "x": self.x.copy(),
            "alpha": self.alpha,
        }


@register_wire_type("dgd.node")
class DGDNode(DGDUpdate):
    """Node of dgd: keeps ``x_i`` and its neighbours' last iterates, which reach it peer to
    peer (``dgd_x``) before every synchronous step."""

    messages = BASELINES

    def _on_dgd_x(self, x, sender):
        """A neighbour's iterate."""
        self.nbr[sender] = np.asarray(x, dtype=float)

    def _on_dgd_send(self):
        for j in self.neighbours:
            self.runtime.send_peer(self.name, j, "dgd_x", {"x": self.x})

    def _on_dgd_step(self):
        self.update()

    def _on_state(self):
        return {"x": self.x.copy(), "move": self.last_move}


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


class DGDServer(PenaltyServer):
    """The coordinator of dgd's rounds (no server variable): each :meth:`step` lets every
    node send ``x_i`` to its neighbours, then take its step; the returned point is the
    average of the nodes' iterates, gathered on the diagnostic channel when the stopping
    test or an evaluation needs it (:meth:`sync`)."""

    messages = BASELINES

    state_fields = ("x_avg", "move", "r", "snapshots")
    step_name = "round"

    def __init__(self, program, nodes: list[str], weights, opts: DGDOptions, x0):
        super().__init__(program, opts)
        self.nodes = nodes
        self.weights = weights
        self.max_steps = int(opts.max_rounds)
        self.snap_at = {int(s) for s in opts.snapshot_iterations}
        self.x_avg = np.array(x0, dtype=float)
        self.move = np.inf
        self.r = 0
        self.snapshots: dict[int, dict] = {}

    def start(self, runtime) -> None:
        pass

    def gather(self, runtime) -> dict:
        replies = runtime.broadcast("state", {}, channel="diagnostic")
        states = {k: v.payload for k, v in replies.items()}
        self.x_avg = sum(s["x"] for s in states.values()) / len(states)
        self.move = max(s["move"] for s in states.values())
        return states

    def step(self, runtime, deadline) -> StepReport:
        self.r = r = self.r + 1
        runtime.next_round()
        for s in self.nodes:
            runtime.activate(s, "dgd_send", {})
        runtime.deliver_peer_messages()
        for s in self.nodes:
            runtime.activate(s, "dgd_step", {})
        report = StepReport(info={"iteration": r})
        if self.options.tol is not None or r in self.snap_at:
            states = self.gather(runtime)
            report.info["move_inf"] = self.move
            if r in self.snap_at:
                self.snapshots[r] = {
                    "x_avg": self.x_avg,
                    "local": {k: v["x"] for k, v in states.items()},
                }
            self.judge(report)
        return report

    def judge(self, report: StepReport) -> None:
        """The stopping rule of dgd and dagd: non-finite iterates are "unbounded"; a largest
        move at most ``tol`` stops the run (the certificate then decides the status)."""
        if not np.all(np.isfinite(self.x_avg)):
            report.stop = "unbounded"
            report.message = "the iterates diverge (non-finite values); lower step"
        elif self.options.tol is not None and self.move <= self.options.tol:
            report.stop = "stopped"

    def sync(self, runtime) -> None:
        self.gather(runtime)

    def diagnostics(self, reports: dict[str, dict]) -> dict:
        return {"move_inf": self.move}

    def point(self) -> np.ndarray:
        return self.x_avg

    def round_counts(self) -> dict[str, int]:
        return {"inner": self.r}

    def conclude(self, status, message, kkt, summary, history):
        if status == "unbounded" or not np.all(np.isfinite(self.x_avg)):
            return "unbounded", "the iterates diverge (non-finite values); lower step"
        if status in ("optimal", "inaccurate", "max_iterations"):
            opts = self.options if self.options.tol is not None else replace(self.options, tol=0.0)
            status, message = _status(
                opts, status != "max_iterations", kkt, self.r, self.move,
                "largest node move",
            )  # fmt: skip
        return status, message

    def extra(self, reports: dict[str, dict]) -> dict:
        return {
            "local_x": {k: v["x"] for k, v in reports.items()},
            "mixing": self.weights,
            "steps": {k: v["alpha"] for k, v in reports.items()},
            "snapshots": self.snapshots,
        }


def graph_nodes(compiled: CompiledModel, topology, method: str) -> tuple[dict, list[str]]:
    """The topology's graph over the clients (and the server, when a node) and its nodes in
    order; a server holding terms must be a node."""
    names = [c.name for c in compiled.clients]
    g = topology_graph(topology, names)
    if SERVER not in g and not compiled.server.is_empty:
        raise UnsupportedError(
            f"{method} has no server, but the server holds terms or constraints; make 'server' "
            "a node of the topology"
        )
    return g, names + ([SERVER] if SERVER in g else [])


def node_factories(
    compiled: CompiledModel, opts, g: dict, nodes: list[str], node_cls, node_opts, method: str
) -> tuple[dict, np.ndarray, dict]:
    """The mixing weights, the starting point and one :class:`EndpointFactory` of
    ``node_cls`` per node (its own program, its share of ``h``, its neighbours and weights):
    shared by dgd and dagd, whose nodes run the same update (55)."""
    weights = _mixing(opts, g, nodes, method)
    n_clients = sum(1 for s in nodes if s != SERVER)
    reg_share = scaled_regularizer(compiled.regularizer, 1.0 / n_clients)
    x0 = starting_point(compiled, opts.w0)
    factories = {}
    for s in nodes:
        prog = compiled.server if s == SERVER else compiled.program(s)
        nbrs = [j for j in weights[s] if j != s]
        factories[s] = EndpointFactory(
            node_cls,
            (
                prog,
                Regularizer() if s == SERVER else reg_share,
                nbrs,
                weights[s],
                x0,
                node_opts,
                RUNTIME_PROXY,
            ),
        )
    return weights, x0, factories


def run_dgd(compiled: CompiledModel, opts: DGDOptions, method: str = "dgd", *, faults=None):
    """Run dgd through the driver: the nodes run on any backend, their iterates travel peer
    to peer."""
    g, nodes = graph_nodes(compiled, opts.topology, method)
    node_opts = opts.for_clients(topology=None, mixing="metropolis")
    weights, x0, factories = node_factories(compiled, opts, g, nodes, DGDNode, node_opts, method)
    server = DGDServer(compiled.server, nodes, weights, opts, x0)
    return run_federated(compiled, opts, method, server, factories, faults=faults)
