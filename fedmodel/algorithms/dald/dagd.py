"""``dagd``: DGD (seed 004 eq. 55) with partial-cycle, non-blocking coordination, the paper's
Distributed Asynchronous Gradient Descent (Section V-B2, after eq. 55; Tsitsiklis, Bertsekas
and Athans 1986, the paper's [5]).

The paper: "If implemented with partial-cycle coordination, where each client can start
training as soon as it receives updates from at least one other client, we refer to the
method as DAGD [...] non-blocking updates, where clients can proceed with training as soon
as they receive partial information from other clients, without waiting for global
synchronization." Node ``i`` keeps its iterate ``x_i`` and the last iterate it received
from each neighbour ``j``, ``x_j^{(tau_ij)}`` (possibly stale), and each of its updates is
(55) with those copies (App. VIII-D, eq. 81 with one solver step)::

    x_i <- prox_{alpha_i^k h/n}( sum_j p_ij x_j^{(tau_ij)} - alpha_i^k grad f_i(x_i) )

which is Tsitsiklis et al.'s asynchronous model ``x_i(t+1) = sum_j a_ij x_j(tau_ij(t)) -
alpha_i g_i(x_i(t))``. A node starts its next update as soon as it is idle and at least
``min_neighbours`` (default 1: the paper's rule) of its neighbours have delivered a new
iterate since its last start; nobody waits for a global round.

**Where the iterates travel.** The node's update is the same code as ``dgd``'s
(:class:`~fedmodel.algorithms.baselines.dgd.DGDUpdate`). Neighbour iterates are carried by
the coordinator, which here plays the network: it holds no variable and computes nothing;
it keeps, per node, the neighbours' latest delivered iterates that node has not received
yet (a mailbox: a newer iterate replaces an undelivered older one), and hands them over with
the node's next job (``dagd_step``). A node that is computing cannot take messages (the
runtime forbids a blocking call to a busy party), so its mailbox fills meanwhile, as a real
network's would.

**Three ways to run** (one step of the server half = ``n`` delivered local updates, the
work of one synchronous ``dgd`` round, so ``max_rounds`` means the same for both):

* ``asynchronous=False`` and no ``delays`` (default): a virtual clock in which every update
  takes one tick: every node updates with every neighbour's previous iterate: ``dgd``'s
  iterates, bit for bit (tested);
* ``delays=(d_1, ..., d_n)``: deterministic asynchrony on every backend: node ``i``'s update
  started at tick ``t`` reaches its neighbours at the end of tick ``t + d_i`` (it is busy
  until then); the staleness of what a node uses is bounded by ``max_i d_i + 1`` ticks,
  Tsitsiklis et al.'s *partial asynchronism* (bounded delays). For tests and for
  reproducible experiments with stragglers;
* ``asynchronous=True``: real asynchrony on the processes and Ray backends: jobs are posted
  (:meth:`~fedmodel.runtime.base.Runtime.post`) and the coordinator takes each reply when it
  arrives (:meth:`~fedmodel.runtime.base.Runtime.poll`), hands its iterate to the
  neighbours' mailboxes and starts every node that became ready. Iterates depend on timing
  (not repeatable). On the serial runtime every posted job is answered at once: the
  synchronous iterates. Before a history row, a checkpoint and the certificate the
  coordinator drains the jobs in flight (consistent points); ``monitor_every`` thins them.

**What converges to what.** Every fixed point of the asynchronous iteration has all copies
equal to the current iterates, so it is the fixed point of synchronous DGD (55): with a
constant step, an ``O(alpha)`` neighbourhood of the optimum (tested: the asynchronous runs
land on the synchronous fixed point); ``step_decay > 0`` (``alpha_k -> 0``, which the paper
expects) removes the bias more slowly. Tsitsiklis et al. prove convergence under bounded
delays for a step small enough for the delay bound; the default ``1/(2 L_i)`` is the
synchronous one and is not guaranteed for large delays (lower ``step`` if the iterates
diverge: status ``"unbounded"``).

Every delivered update is logged per node (``res.extra["asynchrony"]``: updates, the
staleness of the neighbour copies it used: how many newer versions of a neighbour were
delivered between the start of the update and its delivery).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedmodel.algorithms.baselines.dgd import (
    DGDOptions,
    DGDServer,
    DGDUpdate,
    graph_nodes,
    node_factories,
)
from fedmodel.algorithms.dald.messages import DALD
from fedmodel.algorithms.driver import run_federated
from fedmodel.algorithms.protocol import StepReport
from fedmodel.compiler.partition import CompiledModel
from fedmodel.errors import ModelError
from fedmodel.runtime.wire import register_wire_type


@register_wire_type("dagd.options")
@dataclass
class DAGDOptions(DGDOptions):
    """Options of ``dagd`` (seed 004's DAGD: eq. 55 with non-blocking coordination).

    Attributes
    ----------
    topology, mixing, step, step_decay, tol, penalty, eps, w0 :
        As for ``dgd`` (:class:`~fedmodel.algorithms.baselines.dgd.DGDOptions`); the step
        index ``k`` of ``alpha_k = alpha / k^step_decay`` is the node's own update count.
    max_rounds : int
        Cap on the work: ``max_rounds x n`` delivered local updates in all (``n`` nodes),
        the work of ``max_rounds`` rounds of ``dgd``.
    min_neighbours : int
        A node starts an update when at least this many neighbours (at most its degree)
        have delivered a new iterate since its last start. 1: the paper's rule ("as soon as
        it receives updates from at least one other client").
    delays : sequence or dict of int, optional
        Deterministic asynchrony: node ``i``'s update reaches its neighbours ``d_i`` ticks
        after it started (one per node: clients in model order, then ``"server"`` if it is
        a node; or a dict by node name, missing nodes 0).
    asynchronous : bool
        Real asynchrony on the processes / Ray runtimes (post/poll); not with ``delays``.
    monitor_every : int
        With ``history=True``, a history row (a consistent point: with ``asynchronous``
        the jobs in flight are drained first) every ``monitor_every`` rounds.

    Examples
    --------
    >>> import cvxpy as cp, numpy as np, fedmodel as fm
    >>> rng = np.random.default_rng(0)
    >>> model = fm.Model("lsq")
    >>> w = model.variable(3, name="w")
    >>> for k in range(3):
    ...     A, b = rng.normal(size=(20, 3)), rng.normal(size=20)
    ...     model.client(f"c{k}").minimize(cp.sum_squares(A @ w - b) / 60)
    >>> res = model.solve("dagd", topology="ring", delays=(0, 2, 1), max_rounds=400,
    ...                   history=False)
    >>> res.extra["asynchrony"]["parties"]["c1"]["max_staleness"] <= 3
    True
    """

    min_neighbours: int = 1
    delays: Any = None
    asynchronous: bool = False
    monitor_every: int = 1

    def validate(self, compiled: CompiledModel, method: str) -> None:
        super().validate(compiled, method)
        for name in ("min_neighbours", "monitor_every"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise ModelError(f"{method}: {name} must be an integer >= 1, got {v!r}")
        if not isinstance(self.asynchronous, (bool, np.bool_)):
            raise ModelError(f"{method}: asynchronous must be True or False")


def node_delays(delays: Any, nodes: list[str], method: str) -> dict[str, int]:
    """``delays`` as a dict node -> ticks (checked: one non-negative integer per node)."""
    if delays is None:
        return {s: 0 for s in nodes}
    if isinstance(delays, Mapping):
        unknown = sorted(map(str, set(delays) - set(nodes)))
        if unknown:
            raise ModelError(f"{method}: delays name unknown nodes {unknown} (nodes {nodes})")
        raw = {s: delays.get(s, 0) for s in nodes}
    elif isinstance(delays, Sequence) and not isinstance(delays, str):
        if len(delays) != len(nodes):
            raise ModelError(
                f"{method}: delays must have one entry per node ({len(nodes)}: {nodes}), "
                f"got {len(delays)}"
            )
        raw = dict(zip(nodes, delays))
    else:
        raise ModelError(f"{method}: delays must be a sequence or a dict of integers")
    out = {}
    for s, d in raw.items():
        if isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 0:
            raise ModelError(
                f"{method}: the delay of node {s!r} must be an integer >= 0, got {d!r}"
            )
        out[s] = int(d)
    return out


@register_wire_type("dagd.node")
class DAGDNode(DGDUpdate):
    """Node of dagd: dgd's node state and update (its iterate, its copies of the
    neighbours' iterates, its step count), updated on a ``dagd_step`` job that brings the
    neighbours' iterates delivered since its last job."""

    messages = DALD

    def _on_dagd_step(self, nbr):
        """Take the new neighbour iterates, make one update (55), return the iterate."""
        for j, x in nbr.items():
            self.nbr[j] = np.asarray(x, dtype=float)
        self.update()
        return {"x": self.x.copy(), "move": self.last_move}

    def _on_report(self):
        return {**super()._on_report(), "updates": self.k}


class DAGDServer(DGDServer):
    """The coordinator of dagd: the nodes' mailboxes, the (virtual or real) clock, and the
    per-node log of updates and staleness. One :meth:`step` = ``n`` delivered updates."""

    messages = DALD
    state_fields = (
        *DGDServer.state_fields,
        "x", "moves", "version", "inbox", "used", "busy", "pending", "tick", "total", "log",
    )  # fmt: skip

    def __init__(self, program, nodes, weights, opts: DAGDOptions, x0, delays: dict[str, int]):
        super().__init__(program, nodes, weights, opts, x0)
        self.delays = delays
        self.nbrs = {s: [j for j in weights[s] if j != s] for s in nodes}
        # who receives node i's iterate: the nodes that mix it in
        self.readers = {s: [j for j in nodes if s in self.nbrs[j]] for s in nodes}
        self.need = {s: min(int(opts.min_neighbours), len(self.nbrs[s])) for s in nodes}
        self.x = {s: np.array(x0, dtype=float) for s in nodes}  # latest delivered iterates
        self.moves = {s: np.inf for s in nodes}  # each node's last move ||dx||_inf
        self.version = {s: 0 for s in nodes}  # updates delivered per node
        self.inbox: dict[str, list[str]] = {s: [] for s in nodes}  # new neighbour iterates
        self.used: dict[str, dict[str, int]] = {s: {} for s in nodes}  # versions sent
        self.busy = {s: False for s in nodes}
        self.pending: dict[str, list] = {}  # delays: node -> [arrival tick, x, move]
        self.tick = 0
        self.total = 0
        # per node: [updates, max staleness, summed staleness, updates with staleness > 0]
        self.log = {s: [0, 0, 0, 0] for s in nodes}
        self._tickets: dict[str, Any] = {}  # asynchronous: node -> posted job
        self._backend = (None, True)

    # -- readiness, jobs and deliveries -----------------------------------------------------
    def _ready(self, s: str) -> bool:
        if self.busy[s]:
            return False
        return self.version[s] == 0 or len(self.inbox[s]) >= self.need[s]

    def _job(self, s: str) -> dict:
        payload = {"nbr": {j: self.x[j] for j in self.inbox[s]}}
        self.used[s] = {j: self.version[j] for j in self.nbrs[s]}
        self.inbox[s] = []
        self.busy[s] = True
        return payload

    def _deliver(self, arrived: list[tuple[str, Any, float]]) -> None:
        """Hand the updates that arrived together (node order) to the neighbours' mailboxes.
        The staleness of an update: how many newer versions of a neighbour were delivered
        between its start and its delivery (updates delivered together do not count
        against each other: a synchronous round has staleness 0)."""
        stale = {
            s: max((self.version[j] - v for j, v in self.used[s].items()), default=0)
            for s, _, _ in arrived
        }
        for s, x, move in arrived:
            log = self.log[s]
            log[0] += 1
            log[1] = max(log[1], stale[s])
            log[2] += stale[s]
            log[3] += stale[s] > 0
            self.x[s] = np.asarray(x, dtype=float)
            self.moves[s] = float(move)
            self.version[s] += 1
            self.busy[s] = False
            self.total += 1
            for j in self.readers[s]:
                if s not in self.inbox[j]:
                    self.inbox[j].append(s)

    def _stuck(self) -> RuntimeError:
        return RuntimeError(
            "dagd: no node is computing and none is ready (a node waits for "
            f"min_neighbours = {self.options.min_neighbours} new neighbour iterates)"
        )

    def _tick(self, runtime) -> None:
        """One tick of the virtual clock: start every ready node (its reply is computed now
        and held until its delay has passed), then deliver what arrives this tick."""
        t = self.tick
        ready = [s for s in self.nodes if self._ready(s)]
        if ready:  # one exchange: the nodes compute in parallel on a parallel backend
            jobs = {s: self._job(s) for s in ready}
            replies = runtime.broadcast("dagd_step", jobs.__getitem__, to=ready)
            for s in ready:
                reply = replies[s].payload
                self.pending[s] = [t + self.delays[s], reply["x"], float(reply["move"])]
        started = bool(ready)
        due = [s for s in self.nodes if s in self.pending and self.pending[s][0] <= t]
        if not started and not self.pending:
            raise self._stuck()
        self._deliver([(s, *self.pending.pop(s)[1:]) for s in due])
        self.tick = t + 1

    def _async_tick(self, runtime) -> None:
        """Post a job to every ready node, wait for at least one reply, deliver the replies
        that arrived (in node order)."""
        self._backend = (runtime.backend, runtime.supports_async)
        for s in self.nodes:
            if s not in self._tickets and self._ready(s):
                self._tickets[s] = runtime.post(s, "dagd_step", self._job(s))
        if not self._tickets:
            raise self._stuck()
        got = runtime.poll(list(self._tickets.values()), min_count=1)
        self._take(got)
        self.tick += 1

    def _take(self, got: dict) -> None:
        arrived = []
        for s in self.nodes:
            ticket = self._tickets.get(s)
            if ticket is not None and ticket in got:
                reply = got[ticket].payload
                del self._tickets[s]
                arrived.append((s, reply["x"], float(reply["move"])))
        self._deliver(arrived)

    def state_restored(self) -> None:
        self._tickets = {}  # work posted after that point is gone (the runtime dropped it)

    def quiesce(self, runtime) -> None:
        """Take every job in flight (a consistent point)."""
        if self._tickets:
            tickets = list(self._tickets.values())
            self._take(runtime.poll(tickets, min_count=len(tickets)))

    # -- the protocol -------------------------------------------------------------------------
    def start(self, runtime) -> None:
        pass

    def step(self, runtime, deadline) -> StepReport:
        self.r = r = self.r + 1
        runtime.next_round()
        goal = self.total + len(self.nodes)
        while self.total < goal:
            if self.options.asynchronous:
                self._async_tick(runtime)
            else:
                self._tick(runtime)
        self.x_avg = sum(self.x[s] for s in self.nodes) / len(self.nodes)
        self.move = max(self.moves.values())
        report = StepReport(info={"iteration": r, "updates": self.total, "ticks": self.tick})
        report.info["move_inf"] = self.move
        report.record = r % int(self.options.monitor_every) == 0 or r >= self.max_steps
        if r in self.snap_at:
            self.snapshots[r] = {"x_avg": self.x_avg, "local": dict(self.x)}
        self.judge(report)
        return report

    def sync(self, runtime) -> None:
        pass  # the coordinator holds the latest delivered iterates

    def round_counts(self) -> dict[str, int]:
        return {"inner": self.r, "updates": self.total, "ticks": self.tick}

    def asynchrony(self) -> dict:
        """Per node: updates delivered, the largest and mean staleness of the neighbour
        copies they used, and how many used a stale copy."""
        if self.options.asynchronous:
            mode = "asynchronous"
        else:
            mode = "delays" if any(self.delays.values()) else "synchronous"
        parties = {}
        for s in self.nodes:
            n, smax, ssum, nstale = self.log[s]
            parties[s] = {
                "updates": n,
                "max_staleness": smax,
                "mean_staleness": ssum / n if n else 0.0,
                "stale_updates": nstale,
                "delay": self.delays[s],
            }
        return {"mode": mode, "ticks": self.tick, "updates": self.total, "parties": parties}

    def conclude(self, status, message, kkt, summary, history):
        status, message = super().conclude(status, message, kkt, summary, history)
        backend, real = self._backend
        if self.options.asynchronous and not real:
            message += (
                f"; asynchronous=True on the {backend} runtime, which has no non-blocking "
                "exchange: every posted job was answered at once (synchronous iterates)"
            )
        return status, message

    def extra(self, reports: dict[str, dict]) -> dict:
        return {**super().extra(reports), "asynchrony": self.asynchrony()}


def run_dagd(compiled: CompiledModel, opts: DAGDOptions, method: str = "dagd", *, faults=None):
    """Run dagd through the driver on any backend (real asynchrony with
    ``asynchronous=True`` on the processes and Ray backends)."""
    g, nodes = graph_nodes(compiled, opts.topology, method)
    delays = node_delays(opts.delays, nodes, method)
    if opts.asynchronous and any(delays.values()):
        raise ModelError(
            f"{method}: asynchronous=True runs the nodes really asynchronously; delays simulate "
            "asynchrony deterministically: use one or the other"
        )
    node_opts = opts.for_clients(topology=None, mixing="metropolis", delays=None)
    weights, x0, factories = node_factories(compiled, opts, g, nodes, DAGDNode, node_opts, method)
    server = DAGDServer(compiled.server, nodes, weights, opts, x0, delays)
    return run_federated(compiled, opts, method, server, factories, faults=faults)
