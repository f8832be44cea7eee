"""The Ray runtime: parties in Ray actors, on this machine or across a cluster.

Each actor holds a :class:`~fedmodel.runtime.host.PartyHost` with its share of the
parties (sharded as in the processes backend), builds their endpoints from their factories
where it runs, and keeps them across rounds. ``address=None`` starts a local Ray (with
``num_cpus`` = ``workers`` or the number of cores) unless this process already joined one;
``address="auto"`` or ``"ray://host:port"`` joins a cluster. Ray is the optional extra
``fedmodel[ray]``; the Ray instance is left running after the solve for the next one
(``ray.shutdown()`` stops it), and so are idle actors, which the next solve in this
process reuses.

With ``server_hosts_clients=True`` one shard of the parties runs in the driver (the
server's process) instead; each round the driver submits the actors' calls, handles its
own shard's messages, then collects the actors' replies.

Posted messages (:meth:`~fedmodel.runtime.base.Runtime.post`) are submitted as actor
tasks at once and the driver goes on; :meth:`~fedmodel.runtime.base.Runtime.poll` takes
the replies that are ready (``ray.wait``). An actor runs its parties' steps one after the
other: for asynchrony between parties, give each its own actor (``workers`` = parties).

An actor that dies (``RayActorError``) or does not answer within ``client_timeout`` per
step plus a grace period (it is then killed) is a failure of the party whose step it was
running, which the actor names in a step record
(:class:`~fedmodel.runtime.host.StepRecord`, as the processes backend's workers do); its
other parties, idle, waiting behind it, or whose finished step's reply was lost with the
actor, are lost with it but not blamed (kind ``"lost"``). A round's messages to one actor
go as one task each, in order, so the steps that ended before keep the replies that
arrived. An actor on another machine than the driver keeps no record: its failure is
the party of the first task of the call whose reply is missing.
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
from collections.abc import Mapping
from typing import Any

from fedmodel.errors import ModelError
from fedmodel.runtime.base import GRACE_SECONDS, Runtime, raise_build_errors
from fedmodel.runtime.endpoints import EndpointFactory
from fedmodel.runtime.host import HostDead, PartyHost, StepRecord, step_writer
from fedmodel.runtime.placement import SERVER_HOST, default_workers, placement


class _ActorHost:
    """The body of a Ray actor: a PartyHost with signal handlers (actor methods of a
    synchronous actor run on the worker's main thread)."""

    def __init__(self):
        self.host = PartyHost(settles=True)
        self.host.install_signal_handlers(interrupts=True)
        self.record: int | None = None

    def where(
        self, path: list[str] | None = None, record: str | None = None
    ) -> tuple[int, str, bool]:
        """(pid, node id, whether it keeps the step record); also extends the import path
        with the driver's (so that modules the driver imports from local directories
        resolve on this machine) and opens the driver's step record (a
        :class:`~fedmodel.runtime.host.StepRecord` at ``record``, when on this machine)."""
        import sys

        import ray

        for p in path or []:
            if p not in sys.path and os.path.isdir(p):
                sys.path.append(p)
        if self.record is not None:  # (a pooled actor: the last solve's record)
            os.close(self.record)
            self.record = None
        try:
            self.record = os.open(record, os.O_RDWR) if record else None
        except OSError:  # another machine's file
            self.record = None
        self.host.on_step = None if self.record is None else step_writer(self.record)
        return os.getpid(), ray.get_runtime_context().get_node_id(), self.record is not None

    def call(self, method: str, *args):
        return getattr(self.host, method)(*args)

    def call_pickled(self, blob: bytes) -> bytes:
        """``call`` on a pickled ``(method, args)``, returning a pickle: plain pickle is
        several times faster than Ray's generic serialisation of small messages."""
        method, args = pickle.loads(blob)
        return pickle.dumps(getattr(self.host, method)(*args), protocol=5)

    def reset(self) -> bool:
        """Drop every party (the actor goes back to the pool for the next solve)."""
        return self.host.reset()


# Idle actors kept between solves of this process (starting an actor costs seconds: a new
# interpreter importing numpy, scipy and cvxpy). Keyed by the Ray job and the actor size.
_POOL: dict[tuple, list] = {}


def release_idle_actors() -> None:
    """Stop the idle actors kept for the next solve (they hold Ray's CPUs; Flower's
    simulation engine needs them for its own actors)."""
    if not _POOL:
        return
    ray = _import_ray()
    for key in list(_POOL):
        for actor in _POOL.pop(key):
            try:
                ray.kill(actor, no_restart=True)
            except Exception:
                pass


def _take_actors(ray, key: tuple, count: int, make) -> list:
    for other in [k for k in _POOL if k != key]:  # free the CPUs other sizes reserve
        for actor in _POOL.pop(other):
            try:
                ray.kill(actor, no_restart=True)
            except Exception:
                pass
    idle = _POOL.get(key, [])
    taken = [idle.pop() for _ in range(min(count, len(idle)))]
    return taken + [make() for _ in range(count - len(taken))]


def _import_ray():
    try:
        import ray
    except ImportError as exc:  # pragma: no cover - depends on the installation
        raise ModelError(
            "backend='ray' needs Ray: pip install 'fedmodel[ray]' (or pip install ray)"
        ) from exc
    return ray


class RayRuntime(Runtime):
    """Parties in Ray actors (see the module docstring).

    Parameters
    ----------
    factories : mapping of client name to :class:`EndpointFactory`
    workers : int, optional
        Number of actors (default: the cluster's CPUs, at most one per client; one fewer
        with ``server_hosts_clients``).
    address : str, optional
        Ray cluster to join; default starts a local Ray unless one is running here.
    weights : mapping, optional
        Relative cost of each client, used to balance the shards.
    server_hosts_clients : bool
        Also run one shard of the clients in this (the driver's) process.
    client_timeout, on_failure, retries :
        Failure policy (see :class:`~fedmodel.runtime.base.Runtime`).
    """

    backend = "ray"
    supports_async = True

    def __init__(
        self,
        factories: Mapping[str, EndpointFactory],
        *,
        workers: int | None = None,
        address: str | None = None,
        weights: Mapping[str, float] | None = None,
        server_hosts_clients: bool = False,
        client_timeout: float | None = None,
        on_failure: str = "stop",
        retries: int = 0,
        labels: Mapping[str, str] | None = None,
    ):
        super().__init__(client_timeout=client_timeout, on_failure=on_failure, retries=retries)
        if labels is not None and server_hosts_clients:
            raise ModelError(
                "ray_placement and server_hosts_clients cannot be combined (placed clients "
                "run on the nodes that carry their resource label)"
            )
        ray = _import_ray()
        self._ray = ray
        if not ray.is_initialized():
            if address is None:
                ray.init(
                    num_cpus=int(workers or os.cpu_count() or 1),
                    include_dashboard=False,
                    configure_logging=False,
                )
            else:
                ray.init(address=address, configure_logging=False)
        resources = ray.cluster_resources()
        cpus = float(resources.get("CPU", 1.0))
        names = list(factories)
        if labels is not None:
            self._host_of = labelled_placement(names, labels, resources)
        else:
            n_actors = int(workers or default_workers(cpus, server_hosts_clients))
            self._host_of = placement(names, n_actors, weights, server_hosts_clients)
        if server_hosts_clients:
            self._local = PartyHost()
        self.client_seconds = {n: 0.0 for n in names}
        hosts = sorted({h for h in self._host_of.values() if h != SERVER_HOST})
        per_actor = min(1.0, cpus / max(1, len(hosts)))
        actor_cls = ray.remote(_ActorHost).options(
            num_cpus=per_actor, max_restarts=0, max_task_retries=0
        )
        self._pool_key = (ray.get_runtime_context().get_job_id(), per_actor)
        self._labels = labels
        self._pending: dict[int, Any] = {}
        self._posted: dict[Any, Any] = {}  # object ref -> posted ticket
        self._actors = {}
        # actor -> the file naming the party in its step (read when it dies or hangs); kept
        # for the actors on this machine
        self._records: dict[int, StepRecord] = {}
        try:
            if labels is not None:  # one actor per label, on a node that carries it
                self._label_of_host = {h: _label(labels, n) for n, h in self._host_of.items()}
                actors = [
                    ray.remote(_ActorHost)
                    .options(
                        num_cpus=0,
                        resources={self._label_of_host[h]: LABEL_UNITS},
                        max_restarts=0,
                        max_task_retries=0,
                    )
                    .remote()
                    for h in hosts
                ]
            else:
                actors = _take_actors(ray, self._pool_key, len(hosts), actor_cls.remote)
            checked = []
            path = [os.path.abspath(p) if p else os.getcwd() for p in sys.path]
            self._records = {h: StepRecord() for h in hosts}
            for h, actor in zip(hosts, actors):  # a pooled actor may have died (or hung)
                record = self._records[h].path
                try:
                    checked.append((actor, ray.get(actor.where.remote(path, record), timeout=60)))
                except Exception:
                    # (stopped first: a hung actor still holds the CPU a fresh one needs,
                    # and the fresh one would wait for it forever)
                    try:
                        ray.kill(actor, no_restart=True)
                    except Exception:
                        pass
                    fresh = actor_cls.remote()
                    where = ray.get(fresh.where.remote(path, record), timeout=300)
                    checked.append((fresh, where))
            self._actors = {h: a for h, (a, _) in zip(hosts, checked)}
            self.workers = len(self._actors)
            where = [w[:2] for _, w in checked]
            for h, (_, w) in zip(hosts, checked):
                if w[2]:
                    self._records[h].opened()
                else:  # an actor on another machine
                    self._records.pop(h).close()
            self._where = dict(zip(hosts, where))
            self._node = ray.get_runtime_context().get_node_id()
            if self._local is not None:
                self._where[SERVER_HOST] = (os.getpid(), self._node)
            groups = self._hosts_for(names)
            results = self._map(
                {h: ("build", ({n: factories[n] for n in ns},)) for h, ns in groups.items()},
                {h: 0 for h in groups},
                build=True,
            )
        except BaseException:
            self.close()
            raise
        errors: dict[str, Any] = {}
        for h, res in results.items():
            if isinstance(res, HostDead):
                self.close()
                raise RuntimeError(f"Ray actor {h} failed to start: {res.reason}")
            errors.update(res)
        raise_build_errors(self, errors, names)

    @property
    def pids(self) -> dict[Any, int]:
        """Host -> process id on its node (actor index, and ``"server"`` for the clients
        that run in this process)."""
        return {h: w[0] for h, w in self._where.items()}

    @property
    def nodes(self) -> dict[Any, str]:
        """Host -> id of the Ray node it runs on (see ``ray.nodes()``)."""
        return {h: w[1] for h, w in self._where.items()}

    def _in_step(self, h: int, who: str | None = None) -> str | None:
        """The party in actor ``h``'s step when it died or hung: what its step record says
        (None: no step was running); for an actor on another machine, which has no
        record, ``who``: the first step of the call whose reply is missing."""
        record = self._records.get(h)
        return who if record is None else record.in_step()

    def _kill(self, h: int) -> None:
        try:
            self._ray.kill(self._actors[h], no_restart=True)
        except Exception:
            pass
        self._pending.pop(h, None)

    def _map(self, calls, steps, build: bool = False):
        ray = self._ray
        from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

        out: dict[Any, Any] = {}
        remote = [h for h in calls if h != SERVER_HOST]
        # host -> its tasks, in order. With a client_timeout, a round's messages to an actor
        # go one task each (each step on its own clock), so that when the actor dies in one
        # party's step the steps before it keep their replies and that party alone is
        # blamed (the ones after it are lost, not failed). Without one, they go in one task,
        # so that the actor's host answers the steps that stack in one batch (a death then
        # blames the party in its step and loses the others, as a worker process does)
        tasks: dict[Any, list] = {}
        with self.critical():
            for h in remote:
                method, args = calls[h]
                if build:  # large data: let Ray's object store carry it
                    tasks[h] = [(None, self._actors[h].call.remote(method, *args))]
                    continue
                parts = [(None, (method, args))]
                if method == "run" and len(args[0]) > 1 and self.client_timeout:
                    parts = [(m.receiver, ("run", ([m], *args[1:]))) for m in args[0]]
                tasks[h] = [
                    (who, self._actors[h].call_pickled.remote(pickle.dumps(call, protocol=5)))
                    for who, call in parts
                ]
                self._pending[h] = tasks[h][-1][1]
        failed_here = self._run_local_shard(calls, out)  # while the actors compute
        deadline_s = None
        if self.client_timeout and not build:
            longest = max((steps.get(h, 0) for h in remote), default=0)
            deadline_s = longest * float(self.client_timeout) + GRACE_SECONDS
        refs = [ref for h in remote for _, ref in tasks[h]]
        ready = set()
        if refs:
            done, _ = ray.wait(refs, num_returns=len(refs), timeout=deadline_s)
            ready = set(done)
        for h in remote:
            self._pending.pop(h, None)
            values = []
            for who, ref in tasks[h]:
                if ref not in ready:  # hung past its timeout: stop it
                    culprit = self._in_step(h, who)
                    self._kill(h)
                    out[h] = HostDead(
                        f"Ray actor did not answer within client_timeout = "
                        f"{self.client_timeout:g} s per step (+{GRACE_SECONDS:g} s) and was "
                        "killed" + (f" in client '{culprit}''s step" if culprit else ""),
                        culprit,
                        values,
                    )
                    break
                try:
                    with self.critical():
                        value = ray.get(ref)
                    value = pickle.loads(value) if isinstance(value, bytes) else value
                except RayActorError as exc:
                    # (a step that ended just before can have lost its reply with the
                    # actor: it is lost, not blamed)
                    out[h] = self._died(h, exc, self._in_step(h, who), values)
                    break
                except GetTimeoutError as exc:  # pragma: no cover
                    out[h] = HostDead(f"Ray actor did not answer ({exc})")
                    break
                except RayTaskError as exc:
                    cause = getattr(exc, "cause", None)
                    raise (cause if isinstance(cause, BaseException) else exc) from None
                if who is None:
                    out[h] = value
                elif isinstance(value, (list, tuple)) and len(value) == 1:
                    values.extend(value)
                else:  # (not one step's outcome: refused as the party's invalid reply)
                    values.append(value)
            else:
                if tasks[h][0][0] is not None:
                    out[h] = values
        if failed_here is not None:
            raise failed_here
        return out

    def _died(self, h: int, exc: BaseException, culprit: str | None, partial=()) -> HostDead:
        return HostDead(
            f"Ray actor {h} died ({type(exc).__name__}: {_first_line(exc)})"
            + (f" in client '{culprit}''s step" if culprit else ""),
            culprit,
            list(partial),
        )

    # -- posted work (post/poll) ------------------------------------------------------------
    def _submit(self, ticket) -> None:
        blob = pickle.dumps(("run", ([ticket.message], self.client_timeout)), protocol=5)
        with self.critical():
            ref = self._actors[ticket.host].call_pickled.remote(blob)
        self._posted[ref] = ticket

    def _collect(self, pending, timeout):
        from ray.exceptions import RayActorError, RayTaskError

        ray = self._ray
        refs = [r for r, t in self._posted.items() if t in pending]
        if not refs:
            return []
        ready, _ = ray.wait(refs, num_returns=1, timeout=timeout)
        if ready:  # everything else that is ready too
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        out = []
        for ref in ready:
            ticket = self._posted.pop(ref)
            try:
                with self.critical():
                    value = pickle.loads(ray.get(ref))
                out.append((ticket, value[0]))
            except RayActorError as exc:
                out.append((ticket, self._died(ticket.host, exc, self._in_step(ticket.host))))
            except RayTaskError as exc:
                cause = getattr(exc, "cause", None)
                raise (cause if isinstance(cause, BaseException) else exc) from None
        return out

    def _abandon(self, host):
        tickets = [t for t in self._posted.values() if t.host == host]
        self._posted = {r: t for r, t in self._posted.items() if t.host != host}
        self._kill(host)
        return tickets

    def _on_interrupt(self) -> None:
        for h in list(self._pending) + [
            t.host for t in self._posted.values()
        ]:  # actors only: a local step is interrupted directly
            pid, node = self._where.get(h, (None, None))
            if pid and node == self._node:
                try:
                    os.kill(pid, signal.SIGINT)
                except OSError:
                    pass

    def recover(self) -> None:
        self._on_interrupt()
        if self._tickets_out:
            self._drop_posted()
        self._posted.clear()
        if not self._pending:
            return
        refs = {ref: h for h, ref in self._pending.items()}
        timeout = GRACE_SECONDS + float(self.client_timeout or 0.0)
        ready, not_ready = self._ray.wait(list(refs), num_returns=len(refs), timeout=timeout)
        for ref in ready:
            try:
                self._ray.get(ref)
            except Exception:
                pass
        for ref in not_ready:
            h = refs[ref]
            self._kill(h)
            names = [n for n, hh in self._host_of.items() if hh == h]
            self._mark_dead(names, "Ray actor killed after an interruption")
        self._pending.clear()

    def close(self) -> None:
        """Return healthy idle actors to the pool (killing busy or failed ones)."""
        if self.closed:
            return
        self.closed = True
        for record in getattr(self, "_records", {}).values():
            record.close()
        actors = getattr(self, "_actors", {})
        lost = {self._host_of[n] for n in self.dead}
        keep = []
        for h, actor in actors.items():
            posted = {t.host for t in getattr(self, "_posted", {}).values()}
            if (
                h in self._pending
                or h in posted
                or h in lost
                or getattr(self, "_labels", None) is not None
            ):
                self._kill(h)
                continue
            keep.append(actor)
        try:
            ok = self._ray.get([a.reset.remote() for a in keep], timeout=30)
            _POOL.setdefault(self._pool_key, []).extend(a for a, good in zip(keep, ok) if good)
        except Exception:
            for a in keep:
                try:
                    self._ray.kill(a, no_restart=True)
                except Exception:
                    pass


# The share of a node's label resource one placed actor takes (so that several actors of one
# label fit on its node).
LABEL_UNITS = 0.001


def _label(labels: Mapping[str, str], name: str) -> str:
    label = labels.get(name)
    if not isinstance(label, str) or not label:
        raise ModelError(
            f"ray_placement gives no resource label for client '{name}' (every client needs "
            "one: a custom resource of the Ray node it must run on)"
        )
    return label


def labelled_placement(
    names: list[str], labels: Mapping[str, str], resources: Mapping[str, float]
) -> dict[str, int]:
    """Client -> actor index when clients are placed by resource label: one actor per
    label (in order of first appearance), each on a node that carries the label.

    Raises :class:`~fedmodel.errors.ModelError` naming the client when it has no label or
    when no node of the cluster offers its label (the actor would wait forever).

    Examples
    --------
    >>> labelled_placement(["a", "b", "c"], {"a": "x", "b": "y", "c": "x"}, {"x": 1, "y": 1})
    {'a': 0, 'b': 1, 'c': 0}
    """
    unknown = sorted(set(labels) - set(names))
    if unknown:
        raise ModelError(f"ray_placement names unknown clients {unknown}; clients: {names}")
    index: dict[str, int] = {}
    out = {}
    for n in names:
        label = _label(labels, n)
        if float(resources.get(label, 0.0)) <= 0:
            raise ModelError(
                f"ray_placement puts client '{n}' on resource label {label!r}, which no node "
                f"of the Ray cluster offers (start that node with "
                f"ray start ... --resources='{{\"{label}\": 1}}')"
            )
        out[n] = index.setdefault(label, len(index))
    return out


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
