"""The Flower runtime (``backend="flower"``): parties behind Flower SuperNodes.

The server half runs where the Flower ``Grid`` is (a ServerApp); every call the runtime
makes to a party host (``run`` a round's messages, ``mark``, ``write_checkpoint`` ...)
travels as a Flower ``Message`` (type ``query.fedmodel``, content in the codec form of
:mod:`fedmodel.runtime.flower_codec`) to the party's SuperNode, whose ClientApp
(:mod:`fedmodel.runtime.flower_relay_app`) hands it to the party's own process
(:mod:`fedmodel.runtime.flower_party`), where the party's data and state live. The
ledger, failure policies, checkpoints and Ctrl-C handling are the base runtime's, so the
iterates and the ledger are those of every other backend.

Two ways to run:

* **deployment** (``flower_grid=`` a Grid, inside a ServerApp, e.g. ``fedmodel serve``):
  each organisation runs ``fedmodel join`` (its party server and a SuperNode) and holds
  its own data; the nodes are mapped to parties by asking each (``hello``);
* **simulation** (no grid): this process starts one party server per client (like the
  processes backend) and Flower's simulation engine (``flwr.simulation.run_simulation``,
  which needs Ray) with one virtual SuperNode per client, in a background thread; the
  solve runs here and talks to the nodes through the simulation's Grid.

A node that does not answer within ``client_timeout`` per step plus a grace period, or
that Flower reports unavailable, is a failure of its party (kind ``"dead"``).
"""

from __future__ import annotations

import collections
import os
import pickle
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedmodel.errors import ModelError
from fedmodel.runtime.base import GRACE_SECONDS, Runtime, raise_build_errors
from fedmodel.runtime.checkpoint import run_token
from fedmodel.runtime.endpoints import EndpointFactory
from fedmodel.runtime.flower_codec import (
    LOCAL_PROGRAM,
    LOCAL_REGULARIZER,
    MESSAGE_TYPE,
    CodecError,
    decode,
    from_records,
    record_parts,
    to_records,
)
from fedmodel.runtime.host import HostDead
from fedmodel.runtime.messages import SERVER, Message

# seconds between two polls of the Grid for replies: from POLL_SECONDS, doubling up to
# POLL_MAX (a deployment's Grid is an HTTP API of the SuperLink: polling it every
# millisecond for seconds would keep a core busy). Once calls have been timed, the first
# poll comes at POLL_LEAD times the shortest of the last POLL_HISTORY calls' durations
# (rounds take about as long as the last ones: each early poll is a request the
# SuperLink serves for nothing) and the next ones POLL_STEP times it apart, each gap
# POLL_GROWTH times the last (at most POLL_STEP_MAX seconds): a round that runs late under
# load costs a few polls, not one every tenth of a round)
POLL_SECONDS = 0.002
POLL_MAX = 0.05
POLL_LEAD = 0.7
POLL_STEP = 0.1
POLL_STEP_MAX = 0.25
POLL_GROWTH = 1.5
POLL_HISTORY = 3
# how long the runtime waits for a node that has not answered when no client_timeout is set
DEFAULT_WAIT = 3600.0
# how long the simulation waits for its engine and for every node's first answer (Flower's
# ClientApp actors start then: a Ray worker importing Flower, minutes on a busy machine)
START_SECONDS = 300.0


def import_flwr():
    try:
        import flwr  # noqa: F401
    except ImportError as exc:  # pragma: no cover - depends on the installation
        raise ModelError(
            "backend='flower' needs Flower: pip install 'fedmodel[flower]' (or pip install flwr)"
        ) from exc


# option fields that only the coordinator uses (and that cannot cross a link)
_COORDINATOR_ONLY = ("flower_grid", "callback", "ray_placement")


def strip_programs(factories: Mapping[str, EndpointFactory]) -> dict[str, EndpointFactory]:
    """What a deployed party receives to build its client half: each factory with the
    party's own program replaced by :data:`~fedmodel.runtime.flower_codec.LOCAL_PROGRAM`
    and the model's regularizer by :data:`~fedmodel.runtime.flower_codec.LOCAL_REGULARIZER`
    (the party compiles both from the model file and its own data), and the options'
    coordinator-only fields (the Grid, a callback) cleared."""
    import dataclasses

    out = {}
    for name, f in factories.items():

        def sub(v, name=name):
            kind = type(v).__name__
            if kind == "PartyProgram" and hasattr(v, "layout"):
                if v.name != name:
                    raise ModelError(
                        f"the factory of client '{name}' holds the program of '{v.name}': "
                        "a party may only receive its own"
                    )
                return LOCAL_PROGRAM
            if kind == "Regularizer" and hasattr(v, "prox"):
                return LOCAL_REGULARIZER
            if dataclasses.is_dataclass(v) and not isinstance(v, type):
                clear = {
                    k: None
                    for k in _COORDINATOR_ONLY
                    if k in {fl.name for fl in dataclasses.fields(v)} and getattr(v, k) is not None
                }
                return dataclasses.replace(v, **clear) if clear else v
            return v

        out[name] = f.mapped(sub)
    return out


def _message(node: int, method: str, args: tuple, route: str | None = None):
    from flwr.app import ConfigRecord, Message

    content = to_records((method, tuple(args)))
    if route is not None:
        content["fedmodel.route"] = ConfigRecord({"socket": route})
    return Message(content=content, dst_node_id=node, message_type=MESSAGE_TYPE)


@dataclass
class JoinedGrid:
    """A ServerApp's Grid and the parties that joined it (what :func:`discover` found):
    party -> (node id, its ``hello``). Passed as ``flower_grid``, the runtime uses these
    nodes instead of asking every node again (``fedmodel serve`` discovers the parties
    once, to learn the shapes it builds the model with).

    ``stop_file``: before each exchange and while waiting for its replies the runtime
    stops as if interrupted (Ctrl-C) when this file appears (``fedmodel serve``'s Ctrl-C),
    and likewise past ``deadline`` (``time.time()`` seconds; ``fedmodel serve
    --timeout``). ``progress`` is called after every communication round with
    ``{"event": "round", "round", "answered", "failed", "seconds"}``."""

    grid: Any
    parties: dict[str, tuple[int, dict]]
    stop_file: str | None = None
    progress: Callable[[dict], None] | None = None
    deadline: float | None = None


def _hello_answer(reply) -> dict:
    """What a node's ``hello`` answered (``{}`` for an error or a non-fedmodel reply)."""
    if reply.has_error():
        return {}
    try:
        status = record_parts(reply.content)[0]
    except CodecError:
        return {}
    return from_records(reply.content) if status == "ok" else {}


def discover(
    grid,
    parties: list[str],
    timeout: float = 120.0,
    nodes: Mapping[str, int] | None = None,
    stats: dict | None = None,
) -> dict[str, tuple[int, dict]]:
    """Wait until every party in ``parties`` has joined (a node whose party server says it
    serves it); returns party -> (node id, what its ``hello`` said: parties, shapes).

    ``nodes`` (SuperNode authentication, ``fedmodel serve --authorized-keys``): party ->
    the node id the SuperLink registered for that party's public key. Only those nodes
    are asked, and each must serve exactly its own party: a node cannot claim another
    party's name.

    ``stats``, if given, receives ``"hello_seconds"``: the longest time a node took to
    answer its ``hello`` (a first estimate of a round trip).

    Raises :class:`~fedmodel.errors.ModelError` naming the parties still missing after
    ``timeout`` seconds, a party that joined twice, or a node that claims a party other
    than the one its key was registered for.
    """
    deadline = time.monotonic() + timeout
    asked: dict[int, dict] = {}
    party_of_node = {int(n): p for p, n in (nodes or {}).items()}
    while True:
        new = [
            n
            for n in grid.get_node_ids()
            if n not in asked and (nodes is None or n in party_of_node)
        ]
        if new:
            sent = time.monotonic()
            ids = list(grid.push_messages([_message(n, "hello", ()) for n in new]))
            pending = dict(zip(ids, new))
            until = time.monotonic() + 60.0
            while pending and time.monotonic() < until:
                for reply in grid.pull_messages(list(pending)):
                    node = pending.pop(reply.metadata.reply_to_message_id, None)
                    if node is not None:
                        asked[node] = _hello_answer(reply)
                        if stats is not None:
                            took = time.monotonic() - sent
                            stats["hello_seconds"] = max(stats.get("hello_seconds", 0.0), took)
                time.sleep(0.05)
        owner: dict[str, tuple[int, dict]] = {}
        for node, info in asked.items():
            claimed = info.get("parties", []) if isinstance(info, dict) else []
            if node in party_of_node and claimed and list(claimed) != [party_of_node[node]]:
                raise ModelError(
                    f"node {node}, registered for party '{party_of_node[node]}', says it "
                    f"serves {list(claimed)}: a node may serve only the party whose key "
                    "it holds"
                )
            for p in claimed:
                if p in owner:
                    raise ModelError(f"party '{p}' joined twice (nodes {owner[p][0]}, {node})")
                owner[p] = (node, info)
        missing = [p for p in parties if p not in owner]
        if not missing:
            return {p: owner[p] for p in parties}
        if time.monotonic() > deadline:
            raise ModelError(
                f"parties {missing} have not joined within {timeout:g} s (joined: {sorted(owner)})"
            )
        time.sleep(0.5)


def hello_messages(found: Mapping[str, tuple[int, dict]]) -> list[Message]:
    """The ``hello`` exchange with each party as ledger messages (channel ``"join"``,
    round 0): the coordinator's question, and the party's answer, whose payload holds,
    per array the model reads, its shape (a vector of integers: ``floats`` counts them)."""
    out = []
    for party, (_node, info) in found.items():
        shapes = (info.get("shapes") or {}).get(party, {}) if isinstance(info, dict) else {}
        out.append(Message("hello", SERVER, party, {}, 0, "join"))
        payload = {str(k): np.asarray(v, dtype=np.int64) for k, v in shapes.items()}
        out.append(Message("hello", party, SERVER, payload, 0, "join"))
    return out


class _Simulation:
    """Flower's simulation engine in a background thread, and one party server process
    per client: the grid is handed to the caller, and the ServerApp returns when
    :meth:`stop` is called."""

    def __init__(self, names: list[str], factories: Mapping[str, EndpointFactory]):
        from flwr.serverapp import ServerApp
        from flwr.simulation import run_simulation

        from fedmodel.runtime.flower_relay_app import app as client_app

        self.dir = tempfile.mkdtemp(prefix="fedmodel-flower-")
        os.chmod(self.dir, 0o700)
        self.sockets = {n: os.path.join(self.dir, f"party{i}.sock") for i, n in enumerate(names)}
        self.procs: dict[str, subprocess.Popen] = {}
        env = dict(os.environ)
        for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            env.setdefault(k, "1")
        pkg_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        path = [os.path.abspath(p) if p else os.getcwd() for p in sys.path]
        env["PYTHONPATH"] = os.pathsep.join([pkg_root] + [p for p in path if p])
        for n in names:
            self.procs[n] = subprocess.Popen(
                [sys.executable, "-m", "fedmodel.runtime.flower_party", self.sockets[n]],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
            )
        for n, p in self.procs.items():  # wait for "ready"
            line = p.stdout.readline()
            if not line.startswith(b"ready"):
                self.stop()
                raise RuntimeError(f"the party server of client '{n}' failed to start")
        # fedmodel's idle Ray actors would hold the CPUs Flower's ClientApp actors need
        from fedmodel.runtime.ray_runtime import release_idle_actors

        release_idle_actors()
        self.grid_q: queue.Queue = queue.Queue()
        self.done = threading.Event()
        server_app = ServerApp()

        @server_app.main()
        def main(grid, context):  # runs in the simulation's ServerApp thread
            self.grid_q.put(grid)
            self.done.wait()

        self.errors: list[BaseException] = []

        def run():
            try:
                run_simulation(
                    server_app=server_app,
                    client_app=client_app,
                    num_supernodes=len(names),
                    backend_config={
                        "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                        "init_args": {"num_cpus": 1, "include_dashboard": False},
                    },
                )
            except BaseException as exc:  # noqa: BLE001
                self.errors.append(exc)
                self.grid_q.put(None)

        self.thread = threading.Thread(target=run, name="flower-simulation", daemon=True)
        self.thread.start()
        grid = self.grid_q.get(timeout=START_SECONDS)
        if grid is None:
            self.stop()
            raise RuntimeError(f"Flower's simulation engine failed: {self.errors[0]!r}")
        self.grid = grid

    def build(self, factories: Mapping[str, EndpointFactory]) -> dict:
        """Hand each party server its client's factory (this process started them)."""
        from fedmodel.runtime.flower_party import request

        errors: dict[str, Any] = {}
        for n, f in factories.items():
            status, blob = request(
                self.sockets[n], ("local", pickle.dumps(("build_local", ({n: f},))))
            )[:2]
            if status != "pickled":
                raise RuntimeError(f"the party server of client '{n}' could not build it")
            errors.update(pickle.loads(blob))  # its own party server (accept_local), not a link
        return errors

    def kill(self, name: str) -> None:
        p = self.procs.get(name)
        if p is not None and p.poll() is None:
            p.kill()

    def stop(self) -> None:
        from fedmodel.runtime.flower_party import request

        if hasattr(self, "done"):
            self.done.set()  # the ServerApp returns; the simulation engine stops
        for n, p in self.procs.items():
            if p.poll() is None:
                try:
                    request(self.sockets[n], ("local", pickle.dumps(("stop", ()))))
                except Exception:
                    pass
        for p in self.procs.values():
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
            if p.stdout is not None:
                p.stdout.close()
        if hasattr(self, "thread"):
            self.thread.join(60)
        shutil.rmtree(self.dir, ignore_errors=True)
        # Flower's simulation engine shuts Ray down when it ends: actors the Ray backend
        # kept for the next solve are gone with it
        from fedmodel.runtime import ray_runtime

        try:
            import ray

            if not ray.is_initialized():
                ray_runtime._POOL.clear()
        except ImportError:  # pragma: no cover
            pass


class FlowerRuntime(Runtime):
    """Parties behind Flower SuperNodes (see the module docstring).

    Parameters
    ----------
    factories : mapping of client name to :class:`EndpointFactory`
    grid : flwr Grid, optional
        The Grid of the ServerApp this runs in (deployment); default: start Flower's
        simulation engine with one party server per client.
    join_timeout : float
        Deployment: seconds to wait for every client's node to join.
    client_timeout, on_failure, retries :
        Failure policy (see :class:`~fedmodel.runtime.base.Runtime`).
    """

    backend = "flower"

    def __init__(
        self,
        factories: Mapping[str, EndpointFactory],
        *,
        grid: Any = None,
        join_timeout: float = 120.0,
        client_timeout: float | None = None,
        on_failure: str = "stop",
        retries: int = 0,
    ):
        super().__init__(client_timeout=client_timeout, on_failure=on_failure, retries=retries)
        import_flwr()
        names = list(factories)
        self.client_seconds = {n: 0.0 for n in names}
        self._sim: _Simulation | None = None
        self._route: dict[Any, str] = {}
        self._durations: collections.deque[float] = collections.deque(maxlen=POLL_HISTORY)
        self.engine = "deployment" if grid is not None else "simulation"
        # deployment (`fedmodel serve`): an interruption (Ctrl-C) is asked for with this
        # file; past the deadline the runtime stops likewise; progress after each round
        self._stop_file = getattr(grid, "stop_file", None)
        self._deadline = getattr(grid, "deadline", None)
        self._progress = getattr(grid, "progress", None)
        try:
            if grid is None:
                self._sim = _Simulation(names, factories)
                self.grid = self._sim.grid
                nodes = self._hello(self._wait_nodes(len(names)), wait=START_SECONDS)
                by_partition = {
                    int(info["node_config"]["partition-id"]): node for node, info in nodes.items()
                }
                self._host_of = {n: by_partition[i] for i, n in enumerate(names)}
                self._route = {self._host_of[n]: self._sim.sockets[n] for n in names}
                errors = self._sim.build(factories)
            else:
                if isinstance(grid, JoinedGrid):
                    found = grid.parties
                    grid = grid.grid
                    missing = [n for n in names if n not in found]
                    if missing:
                        raise ModelError(f"parties {missing} have not joined the Grid")
                else:
                    found = discover(grid, names, timeout=join_timeout)
                self.grid = grid
                for msg in hello_messages({n: found[n] for n in names}):
                    self.ledger.record(msg)
                self._host_of = {n: found[n][0] for n in names}
                groups = self._hosts_for(names)
                stripped = strip_programs(factories)
                results = self._map(
                    {h: ("build", ({n: stripped[n] for n in ns},)) for h, ns in groups.items()},
                    {h: 0 for h in groups},
                )
                errors = {}
                for h, res in results.items():
                    if isinstance(res, HostDead):
                        raise RuntimeError(f"Flower node {h} did not answer: {res.reason}")
                    errors.update(res)
        except BaseException:
            self.close()
            raise
        raise_build_errors(self, errors, names)

    # -- checkpoints -------------------------------------------------------------------------
    def _party_directory(self, directory: str) -> str:
        """Where the parties write their checkpoint files: in simulation the directory
        itself (party servers this process started, on this machine); deployed, each party
        writes in its own checkpoint directory (``fedmodel join --checkpoint-dir``) and the
        coordinator names only a run token (:func:`~fedmodel.runtime.checkpoint.run_token`)."""
        return os.fspath(directory) if self._sim is not None else run_token(directory)

    def write_party_checkpoint(self, directory: str, tag: str, marked: bool = True) -> dict:
        return super().write_party_checkpoint(self._party_directory(directory), tag, marked)

    def load_party_checkpoint(self, directory: str, files: Mapping[str, Any]) -> None:
        super().load_party_checkpoint(self._party_directory(directory), files)

    # -- nodes -------------------------------------------------------------------------------
    def _wait_nodes(self, n: int, timeout: float = 120.0) -> list[int]:
        deadline = time.monotonic() + timeout
        while True:
            nodes = list(self.grid.get_node_ids())
            if len(nodes) >= n or time.monotonic() > deadline:
                return nodes
            time.sleep(0.1)

    def _hello(self, nodes: list[int], wait: float) -> dict[int, dict]:
        replies = self._map({node: ("hello", ()) for node in nodes}, {}, wait=wait)
        dead = {n: r.reason for n, r in replies.items() if isinstance(r, HostDead)}
        if dead:
            raise RuntimeError(
                f"Flower nodes did not answer: {dead} (on the simulation engine: Flower's "
                "ClientApp actors need a free CPU of Ray each; is Ray busy elsewhere in "
                "this process?)"
            )
        return replies

    @property
    def nodes(self) -> dict[str, int]:
        """Client -> the Flower node id it runs behind."""
        return dict(self._host_of)

    # -- calls ---------------------------------------------------------------------------------
    def _message(self, node: int, method: str, args: tuple):
        return _message(node, method, args, self._route.get(node))

    def _map(self, calls, steps, build: bool = False, wait: float | None = None):
        grid = self.grid
        out: dict[Any, Any] = {}
        # a stop asked for since the last exchange, checked before anything is sent: the
        # wait below may never look (its first, predicted pull often brings every reply)
        self._interrupt_if_asked()
        with self.critical():
            msgs = {h: self._message(h, *calls[h]) for h in calls}
            ids = list(grid.push_messages(list(msgs.values())))
        waiting = dict(zip(ids, msgs))
        self._inflight = waiting  # what recover() waits for after an interruption
        per_step = wait is None and bool(self.client_timeout)
        if wait is not None:
            pass
        elif self.client_timeout:
            wait = self._steps_in_turn(calls, steps) * float(self.client_timeout) + GRACE_SECONDS
        else:
            wait = DEFAULT_WAIT
        start = time.monotonic()
        deadline = start + wait
        recent = self._durations
        next_pull = start + (POLL_LEAD * min(recent) if recent else 0.0)
        step = min(POLL_STEP_MAX, POLL_STEP * min(recent)) if recent else None
        poll = POLL_SECONDS
        culprit = None  # a party that failed during this call (its server exited, its relay
        # failed): the nodes still waiting at the deadline waited behind it
        while waiting:
            if time.monotonic() >= next_pull:
                with self.critical():
                    replies = list(grid.pull_messages(list(waiting)))
                for reply in replies:
                    h = waiting.pop(reply.metadata.reply_to_message_id, None)
                    if h is None:
                        continue
                    out[h] = self._decode(h, reply)
                    if isinstance(out[h], HostDead):  # its relay failed: the node's own party
                        party = self._party_of(h)
                        out[h] = HostDead(self._party_exited(h) or out[h].reason, party)
                        culprit = culprit or party
                if not waiting:
                    recent.append(time.monotonic() - start)
                    break
                next_pull = time.monotonic() + (poll if step is None else max(poll, step))
                poll = min(2 * poll, POLL_MAX)
                if step is not None:
                    step = min(POLL_STEP_MAX, POLL_GROWTH * step)
            self._interrupt_if_asked()
            for mid, h in list(waiting.items()):  # a party server that exited: at once
                gone = self._party_exited(h)
                if gone is not None:
                    del waiting[mid]
                    out[h] = HostDead(gone, self._party_of(h))
                    culprit = culprit or self._party_of(h)
            if not waiting:
                break
            if time.monotonic() > deadline:
                for h in waiting.values():
                    # (behind a party that failed, a node that waited is lost, not blamed)
                    out[h] = HostDead(
                        f"Flower node {h} did not answer within "
                        + (
                            f"client_timeout = {self.client_timeout:g} s per step (+{GRACE_SECONDS:g} s)"
                            if per_step
                            else f"{wait:g} s"
                        ),
                        culprit or self._party_of(h),
                    )
                break
            time.sleep(max(0.0, min(next_pull - time.monotonic(), POLL_STEP_MAX)))
        errors = [r for r in out.values() if isinstance(r, BaseException)]
        if errors:
            raise errors[0]
        return out

    def _steps_in_turn(self, calls: Mapping[Any, Any], steps: Mapping[Any, int]) -> int:
        """How many client steps' time a call may take: deployed, the nodes compute in
        parallel (the most steps of one node); in simulation, Flower's ClientApp actors
        (fewer than the nodes: one per CPU Ray has) relay the nodes' messages one after the
        other, so a node's reply may come after every other node's steps."""
        per_node = [max(1, int(steps.get(h, 0))) for h in calls] or [1]
        return sum(per_node) if self._sim is not None else max(per_node)

    def _party_of(self, node: Any) -> str | None:
        """The party behind ``node`` (one party per node), if known."""
        return next((n for n, h in self._host_of.items() if h == node), None)

    def _party_exited(self, node: Any) -> str | None:
        """Simulation: why the party server behind ``node`` is gone (its process exited),
        or None (running, or a deployment: a SuperNode's party is not a child here)."""
        name = self._party_of(node) if self._sim is not None else None
        proc = self._sim.procs.get(name) if name is not None else None
        code = proc.poll() if proc is not None else None
        if code is None:
            return None
        how = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
        return f"the party server of client '{name}' exited ({how})"

    def _interrupt_if_asked(self) -> None:
        """Raise KeyboardInterrupt (as Ctrl-C in this process would) when a stop was asked
        for (:meth:`_stop_asked`); inside a critical part (e.g. every party taking its
        mark) once that part ends."""
        if self._stop_asked():
            if self._critical_depth:
                self._pending_interrupt = True  # raised when the critical part ends
            else:
                raise KeyboardInterrupt

    def _stop_asked(self) -> bool:
        """``fedmodel serve`` asked to stop (its stop file), or the deadline passed; once:
        the recovery after the interruption still talks to the parties."""
        if self._stop_file and os.path.exists(self._stop_file):
            os.unlink(self._stop_file)
            return True
        if self._deadline is not None and time.time() > self._deadline:
            self._deadline = None
            return True
        return False

    def _run_messages(self, msgs: list[Message]) -> dict:
        t0 = time.perf_counter()
        outcomes = super()._run_messages(msgs)
        if self._progress is not None:
            self._progress(
                {
                    "event": "round",
                    "round": self.round,
                    "kind": msgs[0].kind if msgs else "",
                    "channel": msgs[0].channel if msgs else "",
                    "answered": [n for n, o in outcomes.items() if o.ok],
                    "failed": [n for n, o in outcomes.items() if not o.ok],
                    "seconds": time.perf_counter() - t0,
                }
            )
        return outcomes

    def _decode(self, node: int, reply) -> Any:
        if reply.has_error():
            err = reply.error
            return HostDead(f"Flower node {node} failed: {err.reason} (error code {err.code})")
        try:
            status = record_parts(reply.content)[0]
        except CodecError as exc:
            return HostDead(f"Flower node {node} answered a non-fedmodel reply ({exc})")
        value = from_records(reply.content)
        if status == "error":
            return value if isinstance(value, BaseException) else RuntimeError(str(value))
        return value

    def recover(self) -> None:
        """After an interruption: wait (bounded) for the replies still in flight, so that
        the parties have finished the abandoned step before they are put back to their
        marks (Flower does not promise to deliver a node's messages in order)."""
        waiting = dict(getattr(self, "_inflight", {}))
        self._inflight = {}
        deadline = time.monotonic() + GRACE_SECONDS + float(self.client_timeout or 60.0)
        while waiting and time.monotonic() < deadline:
            for reply in self.grid.pull_messages(list(waiting)):
                waiting.pop(reply.metadata.reply_to_message_id, None)
            time.sleep(POLL_MAX)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self._sim is not None:
            self._sim.stop()


__all__ = ["FlowerRuntime", "JoinedGrid", "decode", "discover", "hello_messages", "strip_programs"]
