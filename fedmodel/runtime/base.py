"""The runtime interface shared by every backend, and the party host that runs endpoints.

An algorithm reaches its parties only through a :class:`Runtime`: it sends a message to a
client (:meth:`Runtime.send`) or to every client (:meth:`Runtime.broadcast`) and receives
the replies. Where the parties run is the backend's business:

* ``"serial"`` (:class:`~fedmodel.runtime.serial.SerialRuntime`): in this process, one
  after the other;
* ``"processes"`` (:class:`~fedmodel.runtime.processes.ProcessRuntime`): persistent worker
  processes, parties sharded over them;
* ``"ray"`` (:class:`~fedmodel.runtime.ray_runtime.RayRuntime`): Ray actors, on this
  machine or on a cluster.

With ``server_hosts_clients=True`` the processes and Ray backends also run one shard of
the clients in the server's own process (host :data:`SERVER_HOST`), which otherwise sits
idle while the clients compute: each round, the server sends the workers their messages,
handles its own shard's, then collects the workers' replies. On a machine with few cores
that is much faster (no process more than cores; half the pickling and wake-ups); the
clients in the server's process lose the isolation of a separate process (see
:func:`placement`).

Endpoints are created *where they run*: the runtime is given, for each client, an
:class:`EndpointFactory` (a picklable callable and its arguments, typically the endpoint
class and the client's :class:`~fedmodel.compiler.partition.PartyProgram`), never a live
object. Each worker holds its parties in a :class:`PartyHost`, which keeps their state
across rounds; only messages (and, for checkpoints, nothing but file names and hashes)
travel between the server and the workers.

Every message is recorded in the runtime's :class:`~fedmodel.runtime.messages.Ledger` in
the same order on every backend (client order, each request followed by its reply), so
the ledger of a run does not depend on where it ran.
"""

from __future__ import annotations

import copy
import hashlib
import os
import pickle
import signal
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fedmodel.errors import FedModelError, ModelError
from fedmodel.runtime.messages import SERVER, Ledger, Message

BACKENDS = ("serial", "processes", "ray")
ON_FAILURE = ("stop", "retry")

# The host key of the clients that run in the server's own process (see the module docstring).
SERVER_HOST = "server"

# Seconds a worker may take beyond ``client_timeout`` (per step it runs) to answer before it
# is considered hung and is stopped; its parties then count as failed.
GRACE_SECONDS = 5.0


# -- endpoint factories ------------------------------------------------------------------------
class _RuntimeProxy:
    """Placeholder for "the runtime" in an :class:`EndpointFactory`'s arguments.

    Endpoints that send peer-to-peer messages receive, in its place, an object with
    ``send_peer(sender, receiver, kind, payload, channel)`` (the runtime itself in the
    serial backend, an outbox that the worker returns with the reply elsewhere).
    """

    def __repr__(self) -> str:
        return "RUNTIME_PROXY"

    def __reduce__(self):
        return (_runtime_proxy, ())


def _runtime_proxy() -> _RuntimeProxy:
    return RUNTIME_PROXY


RUNTIME_PROXY = _RuntimeProxy()


def _strip_caches(obj: Any) -> Any:
    """A copy of ``obj`` safe to pickle: a ``PartyProgram`` whose ``functions`` cache (numpy
    closures compiled from cvxpy, not picklable) has been filled is shallow-copied
    without it; the worker compiles its own."""
    from fedmodel.compiler.partition import PartyProgram

    if isinstance(obj, PartyProgram) and "functions" in obj.__dict__:
        clone = copy.copy(obj)
        clone.__dict__.pop("functions", None)
        return clone
    if isinstance(obj, tuple):
        return tuple(_strip_caches(v) for v in obj)
    if isinstance(obj, list):
        return [_strip_caches(v) for v in obj]
    if isinstance(obj, dict):
        return {k: _strip_caches(v) for k, v in obj.items()}
    return obj


@dataclass(frozen=True)
class EndpointFactory:
    """How to build one party's endpoint where it runs: ``target(*args, **kwargs)``.

    ``target`` must be importable (a module-level class or function) so that the factory
    pickles; arguments are pickled too (a ``PartyProgram`` travels without its compiled
    cache). :data:`RUNTIME_PROXY` among the arguments is replaced by the worker's peer
    outbox.
    """

    target: Callable[..., Any]
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)

    def build(self, outbox: Any = None) -> Any:
        def sub(v):
            return outbox if v is RUNTIME_PROXY else v

        return self.target(
            *[sub(a) for a in self.args], **{k: sub(v) for k, v in self.kwargs.items()}
        )

    def __reduce__(self):
        return (
            EndpointFactory,
            (self.target, _strip_caches(self.args), _strip_caches(self.kwargs)),
        )


# -- failures ------------------------------------------------------------------------------------
class ClientTimeout(BaseException):
    """Raised inside a party's step when it exceeds ``client_timeout`` (a BaseException so
    that a client's own ``except Exception`` does not swallow it)."""


class StepInterrupted(BaseException):
    """Raised inside a worker's step when the server was interrupted (Ctrl-C)."""


@dataclass
class StepOutcome:
    """What happened when a party handled one message."""

    name: str
    reply: Any = None  # the reply Message (or an activation's return value)
    error: BaseException | None = None
    kind: str = "ok"  # "ok", "raised", "timeout", "interrupted", "dead"
    seconds: float = 0.0
    detail: str = ""  # traceback text of the error
    sent: list[Message] = field(default_factory=list)  # peer messages sent while handling

    @property
    def ok(self) -> bool:
        return self.kind == "ok"

    @property
    def retryable(self) -> bool:
        return self.kind in ("raised", "timeout")

    def describe(self) -> str:
        if self.kind == "dead":
            return str(self.error)
        if self.kind == "timeout":
            return str(self.error)
        return f"{type(self.error).__name__}: {self.error}"


class ClientFailure(FedModelError):
    """One or more clients failed a step (raised, timed out, or their worker died) and the
    failure policy did not recover it.

    Attributes
    ----------
    failures : dict
        Client name -> :class:`StepOutcome` of the failed step.
    round : int
        Communication round of the step.
    kind : str
        Message kind of the step.
    """

    def __init__(self, failures: dict[str, StepOutcome], round_: int, kind: str):
        self.failures = dict(failures)
        self.round = int(round_)
        self.kind = kind
        parts = [f"client '{n}' ({o.kind}): {o.describe()}" for n, o in self.failures.items()]
        super().__init__(f"round {round_}, message '{kind}': " + "; ".join(parts))

    def __reduce__(self):
        return (ClientFailure, (self.failures, self.round, self.kind))

    @property
    def clients(self) -> list[str]:
        return list(self.failures)


class CheckpointError(ModelError):
    """A checkpoint cannot be used: missing, corrupted, or written for another run."""


def portable_exception(exc: BaseException) -> BaseException:
    """``exc`` if it survives pickling, else a RuntimeError carrying its text."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc}")


def file_sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def write_atomic(path: str, blob: bytes) -> str:
    """Write ``blob`` to ``path`` atomically; returns its sha256."""
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "wb") as fh:
        fh.write(blob)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    return hashlib.sha256(blob).hexdigest()


def safe_filename(name: str) -> str:
    keep = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name)
    return f"{keep}-{hashlib.sha1(name.encode()).hexdigest()[:8]}"


# -- the worker side -------------------------------------------------------------------------------
class Outbox:
    """Collects the peer messages an endpoint sends while handling a message (remote
    backends); the worker returns them with the step's outcome."""

    def __init__(self):
        self.round = 0
        self.messages: list[Message] = []

    def send_peer(self, sender, receiver, kind, payload, channel="algorithm") -> Message:
        msg = Message(kind, sender, receiver, payload, self.round, channel)
        self.messages.append(msg)
        return msg

    def take(self) -> list[Message]:
        out, self.messages = self.messages, []
        return out


def copy_state(obj: Any) -> Any:
    """A deep copy of a party's state: dicts, lists and tuples of numpy arrays and scalars
    are copied directly (a step snapshots its party's state, so this is on the hot path);
    read-only arrays are shared (nobody can change them in place: the Newton backend's
    carried factor); anything else goes through ``copy.deepcopy``."""
    if isinstance(obj, np.ndarray):
        return obj.copy() if obj.flags.writeable else obj
    if obj is None or isinstance(obj, (float, int, str, bool, np.generic)):
        return obj
    if type(obj) is dict:
        return {k: copy_state(v) for k, v in obj.items()}
    if type(obj) in (list, tuple):
        return type(obj)(copy_state(v) for v in obj)
    return copy.deepcopy(obj)


def _get_state(ep: Any) -> Any:
    getter = getattr(ep, "get_state", None)
    return copy_state(getter()) if getter is not None else None


class PartyHost:
    """Holds some parties' endpoints where they run and executes steps on them.

    A step is one message handled by one party. Before a step the party's state is
    copied (when the endpoint has ``get_state``/``set_state``); if the step raises, times
    out or is interrupted, the state is put back, so a retry repeats exactly that step.
    ``mark()`` keeps a copy of every party's state at a consistent point (the end of an
    outer iteration); ``restore_marks()`` and checkpoints use those copies.
    """

    def __init__(self, outbox: Any = None, endpoints: dict[str, Any] | None = None):
        self.endpoints: dict[str, Any] = {} if endpoints is None else endpoints
        self.outbox = outbox if outbox is not None else Outbox()
        self.marks: dict[str, Any] = {}
        self._in_step = False
        self._alarm_ok = False

    # signals (only on the main thread of the process)
    def install_signal_handlers(self, interrupts: bool = True) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        self._alarm_ok = True

        def on_alarm(signum, frame):
            if self._in_step:
                raise ClientTimeout()

        signal.signal(signal.SIGALRM, on_alarm)
        if interrupts:

            def on_int(signum, frame):
                if self._in_step:
                    raise StepInterrupted()

            signal.signal(signal.SIGINT, on_int)

    @contextmanager
    def alarms(self):
        """Arm the ``client_timeout`` alarm for steps run in this block (main thread only;
        the previous SIGALRM handler is put back afterwards)."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def on_alarm(signum, frame):
            if self._in_step:
                raise ClientTimeout()

        previous = signal.signal(signal.SIGALRM, on_alarm)
        self._alarm_ok = True
        try:
            yield
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0.0)
            signal.signal(signal.SIGALRM, previous)
            self._alarm_ok = False

    # building
    def build(self, factories: Mapping[str, EndpointFactory]) -> dict[str, Any]:
        """Build endpoints; returns name -> None, or the (portable) exception raised."""
        errors: dict[str, Any] = {}
        for name, factory in factories.items():
            try:
                self.endpoints[name] = factory.build(self.outbox)
                errors[name] = None
            except BaseException as exc:  # noqa: BLE001 - reported to the server
                errors[name] = (portable_exception(exc), traceback.format_exc())
        return errors

    def names(self) -> list[str]:
        return list(self.endpoints)

    def reset(self) -> bool:
        """Drop every party (the worker goes back to its pool for the next solve)."""
        self.endpoints.clear()
        self.marks.clear()
        return True

    def pid(self) -> int:
        return os.getpid()

    # steps
    def _call(self, name: str, fn: Callable[[], Any], timeout: float | None, rnd: int):
        ep = self.endpoints[name]
        snapshot = _get_state(ep)
        if isinstance(self.outbox, Outbox):
            self.outbox.round = rnd
            self.outbox.take()
        alarm = bool(timeout) and self._alarm_ok
        t0 = time.perf_counter()
        out = StepOutcome(name)
        try:
            self._in_step = True
            if alarm:
                signal.setitimer(signal.ITIMER_REAL, float(timeout))
            try:
                out.reply = fn()
            finally:
                if alarm:
                    signal.setitimer(signal.ITIMER_REAL, 0.0)
                self._in_step = False
            out.seconds = time.perf_counter() - t0
            if timeout and out.seconds > timeout:  # could not be interrupted (or no alarm)
                raise ClientTimeout()
        except ClientTimeout:
            out.reply = None
            out.kind = "timeout"
            out.error = TimeoutError(f"did not answer within client_timeout = {timeout:g} s")
        except (StepInterrupted, KeyboardInterrupt):
            out.reply = None
            out.kind = "interrupted"
            out.error = KeyboardInterrupt("interrupted")
        except BaseException as exc:  # noqa: BLE001 - reported to the server
            out.reply = None
            out.kind = "raised"
            out.error = portable_exception(exc)
            out.detail = traceback.format_exc()
        out.seconds = time.perf_counter() - t0
        if not out.ok and snapshot is not None:
            ep.set_state(copy_state(snapshot))
        if isinstance(self.outbox, Outbox):
            sent = self.outbox.take()
            out.sent = sent if out.ok else []
        return out

    def run(self, messages: list[Message], timeout: float | None = None) -> list[StepOutcome]:
        """Each message to its receiver, in order; returns one outcome per message."""
        return [
            self._call(
                m.receiver, lambda m=m: self.endpoints[m.receiver].handle(m), timeout, m.round
            )
            for m in messages
        ]

    def peer(self, message: Message, timeout: float | None = None) -> StepOutcome:
        return self._call(
            message.receiver,
            lambda: self.endpoints[message.receiver].handle(message),
            timeout,
            message.round,
        )

    activate = peer  # a local step: the message goes from the party to itself

    # state
    def mark(self, names: Iterable[str] | None = None) -> None:
        for name in self.endpoints if names is None else names:
            self.marks[name] = _get_state(self.endpoints[name])

    def restore_marks(self) -> list[str]:
        restored = []
        for name, state in self.marks.items():
            if state is not None:
                self.endpoints[name].set_state(copy.deepcopy(state))
                restored.append(name)
        return restored

    def get_states(self, names: Iterable[str] | None = None) -> dict[str, Any]:
        return {n: _get_state(self.endpoints[n]) for n in (names or self.endpoints)}

    def set_states(self, states: Mapping[str, Any]) -> None:
        for n, s in states.items():
            self.endpoints[n].set_state(copy.deepcopy(s))

    def write_checkpoint(self, directory: str, tag: str, marked: bool = True) -> dict:
        """Each party writes its own state (its mark, or its current state) to
        ``directory``; returns name -> (file name, sha256). Nothing but these travels."""
        from fedmodel.runtime.checkpoint import party_fingerprint

        out = {}
        for name, ep in self.endpoints.items():
            state = self.marks.get(name) if marked else _get_state(ep)
            if state is None:
                raise CheckpointError(f"party '{name}' has no state to checkpoint")
            record = {
                "format": "fedmodel-party-state",
                "party": name,
                "fingerprint": party_fingerprint(getattr(ep, "program", None)),
                "state": state,
            }
            fname = f"party-{safe_filename(name)}-{tag}.pkl"
            sha = write_atomic(os.path.join(directory, fname), pickle.dumps(record, protocol=4))
            out[name] = (fname, sha)
        return out

    def load_checkpoint(self, directory: str, files: Mapping[str, tuple[str, str]]) -> dict:
        """Each party reads and checks its own file, then takes that state; returns
        name -> None or an error message."""
        from fedmodel.runtime.checkpoint import party_fingerprint

        errors: dict[str, str | None] = {}
        for name, (fname, sha) in files.items():
            path = os.path.join(directory, fname)
            try:
                if not os.path.exists(path):
                    raise CheckpointError(f"file {fname} is missing")
                if file_sha256(path) != sha:
                    raise CheckpointError(f"file {fname} is corrupted (checksum mismatch)")
                with open(path, "rb") as fh:
                    record = pickle.load(fh)
                if not isinstance(record, dict) or record.get("format") != "fedmodel-party-state":
                    raise CheckpointError(f"file {fname} is not a fedmodel party state")
                if record.get("party") != name:
                    raise CheckpointError(f"file {fname} holds party '{record.get('party')}'")
                ep = self.endpoints[name]
                if record.get("fingerprint") != party_fingerprint(getattr(ep, "program", None)):
                    raise CheckpointError(
                        "the checkpoint was written for different terms or data of this party"
                    )
                ep.set_state(record["state"])
                self.marks[name] = _get_state(ep)
                errors[name] = None
            except Exception as exc:  # noqa: BLE001 - reported to the server
                errors[name] = f"{exc}"
        return errors


# -- the server side -----------------------------------------------------------------------------
class Runtime:
    """Base of the runtimes: the ledger, rounds, failure policy and message exchange.

    Subclasses place the parties on hosts (``self._host_of``) and implement
    :meth:`_map` (call methods of several hosts and gather what they return).

    Parameters
    ----------
    client_timeout : float, optional
        Seconds a client may take to handle one message.
    on_failure : {"stop", "retry"}
        ``"retry"`` re-sends a failed step (the client's state is restored first) up to
        ``retries`` times; otherwise, and when retries are exhausted,
        :class:`ClientFailure` is raised.
    retries : int
    propagate_errors : bool
        Re-raise a client's own exception unchanged (the historical behaviour of the
        serial runtime) instead of :class:`ClientFailure`.
    """

    backend = "base"

    def __init__(
        self,
        *,
        client_timeout: float | None = None,
        on_failure: str = "stop",
        retries: int = 0,
        propagate_errors: bool = False,
    ):
        self.ledger = Ledger()
        self.round = 0
        self.client_seconds: dict[str, float] = {}
        self.client_timeout = client_timeout
        self.on_failure = on_failure
        self.retries = int(retries)
        self.propagate_errors = propagate_errors
        self.dead: dict[str, StepOutcome] = {}
        self.retried: list[dict[str, Any]] = []
        self._peer_queue: list[Message] = []
        self._host_of: dict[str, Any] = {}
        self._critical_depth = 0
        self._pending_interrupt = False
        self.closed = False
        self.wait_seconds = 0.0  # time the server spent waiting for parties' replies
        # the parties that run in this (the server's) process, if any (host SERVER_HOST)
        self._local: PartyHost | None = None

    # -- interface ----------------------------------------------------------------------
    @property
    def client_names(self) -> list[str]:
        return list(self._host_of)

    @property
    def alive(self) -> list[str]:
        return [n for n in self.client_names if n not in self.dead]

    def next_round(self) -> int:
        self.round += 1
        return self.round

    def send(
        self, receiver: str, kind: str, payload: dict[str, Any], channel: str = "algorithm"
    ) -> Message:
        """Send one message to ``receiver`` and return its reply."""
        if receiver not in self._host_of:
            raise KeyError(f"unknown receiver {receiver!r}")
        msg = Message(kind, SERVER, receiver, payload, self.round, channel)
        return self._exchange([msg])[receiver]

    def broadcast(
        self,
        kind: str,
        payload: dict[str, Any] | Callable[[str], dict[str, Any]],
        channel: str = "algorithm",
        to: Iterable[str] | None = None,
    ) -> dict[str, Message]:
        """Send a message to every client (or to those in ``to``), the same payload or one
        built per client by a callable, and collect the replies, keyed by client name in
        client order."""
        names = self.client_names if to is None else [n for n in self.client_names if n in set(to)]
        msgs = [
            Message(
                kind, SERVER, n, payload(n) if callable(payload) else payload, self.round, channel
            )
            for n in names
        ]
        return self._exchange(msgs)

    # -- peer-to-peer messages (decentralized methods) ---------------------------------------
    def send_peer(
        self,
        sender: str,
        receiver: str,
        kind: str,
        payload: dict[str, Any],
        channel: str = "algorithm",
    ) -> Message:
        """Queue a one-way message from one party to another (no server involved).

        Recorded in the same ledger as server traffic and delivered, in the order sent,
        by :meth:`deliver_peer_messages`. Endpoints handling peer messages return ``None``.
        """
        if receiver not in self._host_of:
            raise KeyError(f"unknown receiver {receiver!r}")
        msg = Message(kind, sender, receiver, payload, self.round, channel)
        self.ledger.record(msg)
        self._peer_queue.append(msg)
        return msg

    def deliver_peer_messages(self) -> int:
        """Deliver queued peer messages (including those sent while delivering) until the
        queue is empty; returns how many were delivered."""
        delivered = 0
        while self._peer_queue:
            msg = self._peer_queue.pop(0)
            out = self._single("peer", msg)
            self._take_sent(out)
            delivered += 1
        return delivered

    def activate(self, name: str, kind: str, payload: dict[str, Any] | None = None) -> Any:
        """Run a local step of party ``name`` (its turn in a coordination sequence).

        Nothing crosses the network; the call is not counted as traffic (``"local"``
        channel, not recorded) but is timed for the party. Returns the endpoint's return
        value.
        """
        msg = Message(kind, name, name, dict(payload or {}), self.round, "local")
        out = self._single("activate", msg)
        self._take_sent(out)
        return out.reply

    # -- consistent points, checkpoints ------------------------------------------------------
    def mark(self) -> None:
        """Every party keeps a copy of its current state (a consistent point)."""
        self._map_hosts("mark", lambda names: (names,))

    def restore_marks(self) -> None:
        """Every live party goes back to its marked state."""
        self._map_hosts("restore_marks", lambda names: ())

    def get_states(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for res in self._map_hosts("get_states", lambda names: (names,)).values():
            out.update(res)
        return out

    def write_party_checkpoint(self, directory: str, tag: str, marked: bool = True) -> dict:
        """Each party writes its own (marked) state; returns name -> (file, sha256)."""
        if self.dead:
            raise CheckpointError(
                f"parties {sorted(self.dead)} are lost (their worker died); their state "
                "cannot be written"
            )
        out: dict[str, Any] = {}
        for res in self._map_hosts(
            "write_checkpoint", lambda names: (directory, tag, marked)
        ).values():
            out.update(res)
        return {n: out[n] for n in self.client_names}

    def load_party_checkpoint(self, directory: str, files: Mapping[str, Any]) -> None:
        missing = [n for n in self.client_names if n not in files]
        unknown = [n for n in files if n not in self._host_of]
        if missing or unknown:
            raise CheckpointError(
                f"the checkpoint's clients do not match the model's: missing {missing}, "
                f"unknown {unknown}"
            )
        errors: dict[str, Any] = {}
        for res in self._map_hosts(
            "load_checkpoint",
            lambda names: (directory, {n: tuple(files[n]) for n in names}),
        ).values():
            errors.update(res)
        bad = {n: e for n, e in errors.items() if e}
        if bad:
            raise CheckpointError(
                "cannot resume from checkpoint "
                + repr(directory)
                + ": "
                + "; ".join(f"client '{n}': {e}" for n, e in sorted(bad.items()))
            )

    def recover(self) -> None:
        """After an interruption: wait for (or stop) work still in flight."""

    def close(self) -> None:
        self.closed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- Ctrl-C: never in the middle of talking to a worker ------------------------------------
    @contextmanager
    def critical(self):
        self._critical_depth += 1
        try:
            yield
        finally:
            self._critical_depth -= 1
            if self._critical_depth == 0 and self._pending_interrupt:
                self._pending_interrupt = False
                raise KeyboardInterrupt

    @contextmanager
    def deferred_interrupts(self):
        """While solving: Ctrl-C raises KeyboardInterrupt at once, unless the runtime is
        exchanging data with a worker, in which case it is raised right after."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = signal.getsignal(signal.SIGINT)
        if previous is not signal.default_int_handler:
            yield  # someone else handles Ctrl-C; leave it alone
            return

        def handler(signum, frame):
            if self._critical_depth:
                self._pending_interrupt = True
                return
            self._on_interrupt()
            raise KeyboardInterrupt

        signal.signal(signal.SIGINT, handler)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, previous)
            self._pending_interrupt = False

    def _on_interrupt(self) -> None:
        """Hook: tell busy workers to abandon their step (processes backend)."""

    def _run_local(self, method: str, args: tuple) -> Any:
        """Call ``method`` of the parties hosted in this process, with the
        ``client_timeout`` alarm armed (main thread only; elsewhere a step that overran is
        still reported as timed out once it returns). Not inside :meth:`critical`: Ctrl-C
        interrupts a local step at once (it is reported as interrupted)."""
        assert self._local is not None
        if not self.client_timeout:
            return getattr(self._local, method)(*args)
        with self._local.alarms():
            return getattr(self._local, method)(*args)

    def _run_local_shard(self, calls: Mapping[Any, tuple[str, tuple]], out: dict) -> Any:
        """Run the call for :data:`SERVER_HOST` in ``calls`` (if any) into ``out``, after the
        remote calls were sent and before their replies are collected; returns the
        exception it raised (to re-raise once the remote replies are in), or None."""
        if SERVER_HOST not in calls:
            return None
        try:
            out[SERVER_HOST] = self._run_local(*calls[SERVER_HOST])
        except BaseException as exc:  # noqa: BLE001 - re-raised by the caller
            return exc
        return None

    @property
    def placement(self) -> dict[str, Any]:
        """Client -> where it runs: a worker index, or ``"server"`` for the server's own
        process (every client on the serial backend)."""
        return dict(self._host_of)

    # -- exchange ---------------------------------------------------------------------------
    def _hosts_for(self, names: Iterable[str]) -> dict[Any, list[str]]:
        groups: dict[Any, list[str]] = {}
        for n in names:
            groups.setdefault(self._host_of[n], []).append(n)
        return groups

    def _map(self, calls: dict[Any, tuple[str, tuple]], steps: dict[Any, int]) -> dict[Any, Any]:
        """Call ``getattr(host, method)(*args)`` on each host; returns host -> result, or
        host -> :class:`HostDead` when the host died or hung (``steps`` = how many client
        steps each call runs, to bound the wait)."""
        raise NotImplementedError

    def _map_hosts(self, method: str, args_for: Callable[[list[str]], tuple]) -> dict[Any, Any]:
        groups = self._hosts_for(self.alive)
        calls = {h: (method, args_for(names)) for h, names in groups.items()}
        results = self._map(calls, {h: 0 for h in calls})
        out = {}
        for h, res in results.items():
            if isinstance(res, HostDead):
                self._mark_dead(groups[h], res.reason)
                continue
            out[h] = res
        return out

    def _mark_dead(self, names: Iterable[str], reason: str) -> None:
        for n in names:
            if n not in self.dead:
                self.dead[n] = StepOutcome(n, error=RuntimeError(reason), kind="dead")

    def _run_messages(self, msgs: list[Message]) -> dict[str, StepOutcome]:
        outcomes: dict[str, StepOutcome] = {}
        live = []
        for m in msgs:
            if m.receiver in self.dead:
                outcomes[m.receiver] = self.dead[m.receiver]
            else:
                live.append(m)
        groups: dict[Any, list[Message]] = {}
        for m in live:
            groups.setdefault(self._host_of[m.receiver], []).append(m)
        calls = {h: ("run", (ms, self.client_timeout)) for h, ms in groups.items()}
        t0 = time.perf_counter()
        try:
            results = self._map(calls, {h: len(ms) for h, ms in groups.items()})
        finally:
            self.wait_seconds += time.perf_counter() - t0
        for h, res in results.items():
            if isinstance(res, HostDead):
                self._mark_dead([m.receiver for m in groups[h]], res.reason)
                for m in groups[h]:
                    outcomes[m.receiver] = self.dead[m.receiver]
            else:
                for m, out in zip(groups[h], res):
                    outcomes[m.receiver] = out
        return outcomes

    def _exchange(self, msgs: list[Message]) -> dict[str, Message]:
        attempts: list[tuple[Message, StepOutcome]] = []
        outcomes = self._run_messages(msgs)
        attempts.extend((m, outcomes[m.receiver]) for m in msgs)
        tries = {m.receiver: 0 for m in msgs}
        while True:
            failed = [m for m in msgs if not outcomes[m.receiver].ok]
            again = [
                m
                for m in failed
                if self.on_failure == "retry"
                and outcomes[m.receiver].retryable
                and tries[m.receiver] < self.retries
            ]
            if not again:
                break
            for m in again:
                tries[m.receiver] += 1
                self.retried.append(
                    {
                        "client": m.receiver,
                        "round": m.round,
                        "kind": m.kind,
                        "attempt": tries[m.receiver],
                        "error": outcomes[m.receiver].describe(),
                    }
                )
            new = self._run_messages(again)
            outcomes.update(new)
            attempts.extend((m, new[m.receiver]) for m in again)
        for m, out in attempts:  # the same order on every backend
            self.ledger.record(m)
            self.client_seconds[m.receiver] = self.client_seconds.get(m.receiver, 0.0) + out.seconds
            if out.ok:
                reply = out.reply
                if reply.sender != m.receiver or reply.receiver != SERVER:
                    raise RuntimeError(f"endpoint {m.receiver!r} replied as {reply.sender!r}")
                self.ledger.record(reply)
        failures = {m.receiver: outcomes[m.receiver] for m in msgs if not outcomes[m.receiver].ok}
        if failures:
            self._fail(failures, msgs[0])
        return {m.receiver: outcomes[m.receiver].reply for m in msgs}

    def _fail(self, failures: dict[str, StepOutcome], msg: Message):
        interrupted = [o for o in failures.values() if o.kind == "interrupted"]
        if interrupted:
            raise KeyboardInterrupt
        if self.propagate_errors:
            first = next(iter(failures.values()))
            if first.kind == "raised" and first.error is not None:
                raise first.error
        raise ClientFailure(failures, msg.round, msg.kind)

    def _single(self, method: str, msg: Message) -> StepOutcome:
        name = msg.receiver
        if name in self.dead:
            out = self.dead[name]
        else:
            h = self._host_of[name]
            t0 = time.perf_counter()
            try:
                res = self._map({h: (method, (msg, self.client_timeout))}, {h: 1})[h]
            finally:
                self.wait_seconds += time.perf_counter() - t0
            if isinstance(res, HostDead):
                self._mark_dead(self._hosts_for(self.alive).get(h, [name]), res.reason)
                out = self.dead[name]
            else:
                out = res
        self.client_seconds[name] = self.client_seconds.get(name, 0.0) + out.seconds
        if not out.ok:
            self._fail({name: out}, msg)
        return out

    def _take_sent(self, out: StepOutcome) -> None:
        for m in out.sent:
            self.send_peer(m.sender, m.receiver, m.kind, m.payload, m.channel)


class EchoEndpoint:
    """A trivial party that answers every message with its payload (measures a runtime's
    own cost per round: ``benchmarks/backends.py``)."""

    def __init__(self, name: str):
        self.name = name
        self.count = 0

    def get_state(self) -> dict:
        return {"count": self.count}

    def set_state(self, state: dict) -> None:
        self.count = int(state["count"])

    def handle(self, msg: Message) -> Message:
        self.count += 1
        return Message(msg.kind + "_reply", self.name, SERVER, dict(msg.payload), msg.round)


@dataclass
class HostDead:
    """A host (worker process or actor) that died or hung."""

    reason: str


def shard(names: list[str], n_hosts: int, weights: Mapping[str, float] | None = None) -> dict:
    """Assign parties to ``n_hosts`` hosts: heaviest first onto the least loaded host
    (ties broken by client order), so the result is deterministic."""
    n_hosts = max(1, min(int(n_hosts), len(names)))
    w = {n: float((weights or {}).get(n, 1.0)) for n in names}
    order = sorted(range(len(names)), key=lambda i: (-w[names[i]], i))
    load = [0.0] * n_hosts
    out = {}
    for i in order:
        h = min(range(n_hosts), key=lambda j: (load[j], j))
        out[names[i]] = h
        load[h] += max(w[names[i]], 1e-9)
    return {n: out[n] for n in names}


def placement(
    names: list[str],
    workers: int,
    weights: Mapping[str, float] | None = None,
    server_hosts_clients: bool = False,
) -> dict[str, Any]:
    """Client -> host: worker indices ``0 .. workers - 1`` (see :func:`shard`) and, with
    ``server_hosts_clients``, :data:`SERVER_HOST` for one more shard that runs in the
    server's own process (the shard the greedy fills last, the lightest: the server also
    does its own work each round).

    Examples
    --------
    >>> placement(["a", "b", "c", "d"], 1, server_hosts_clients=True)
    {'a': 0, 'b': 'server', 'c': 0, 'd': 'server'}
    """
    if not server_hosts_clients:
        return shard(names, workers, weights)
    place = shard(names, int(workers) + 1, weights)
    last = max(place.values(), default=0)
    return {n: (SERVER_HOST if h == last else h) for n, h in place.items()}


def default_workers(available: float | int | None, server_hosts_clients: bool) -> int:
    """Worker processes / actors when the user gives none: one per core, less the one the
    server's process takes when it hosts clients (at least one)."""
    cores = int(available or 1)
    return max(1, cores - 1) if server_hosts_clients else max(1, cores)


def make_runtime(
    backend: str,
    factories: Mapping[str, EndpointFactory],
    *,
    workers: int | None = None,
    ray_address: str | None = None,
    client_timeout: float | None = None,
    on_failure: str = "stop",
    retries: int = 0,
    weights: Mapping[str, float] | None = None,
    server_hosts_clients: bool = False,
) -> Runtime:
    """Start the runtime of ``backend`` and build every client's endpoint where it runs.

    ``server_hosts_clients`` (processes and Ray): one shard of the clients runs in the
    server's own process too (see :func:`placement`); ignored by ``"serial"``, where
    every client does.

    Errors raised while building an endpoint (e.g. an unsupported term) are re-raised
    here unchanged.
    """
    policy = dict(client_timeout=client_timeout, on_failure=on_failure, retries=retries)
    where = dict(weights=weights, server_hosts_clients=bool(server_hosts_clients))
    if backend == "serial":
        from fedmodel.runtime.serial import SerialRuntime

        rt = SerialRuntime(dict(factories), **policy)
    elif backend == "processes":
        from fedmodel.runtime.processes import ProcessRuntime

        rt = ProcessRuntime(factories, workers=workers, **where, **policy)
    elif backend == "ray":
        from fedmodel.runtime.ray_runtime import RayRuntime

        rt = RayRuntime(factories, workers=workers, address=ray_address, **where, **policy)
    else:
        raise ModelError(f"unknown backend {backend!r}; choose one of {BACKENDS}")
    return rt


def raise_build_errors(runtime: Runtime, errors: Mapping[str, Any], order: list[str]) -> None:
    """Close ``runtime`` and re-raise the first endpoint construction error (client order)."""
    for name in order:
        err = errors.get(name)
        if err:
            runtime.close()
            exc, _tb = err
            raise exc
