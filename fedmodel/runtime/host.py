"""The party host: holds some parties' endpoints where they run and executes their steps
(state snapshots before each step, timeouts, interrupts, marks and party checkpoints).
"""

from __future__ import annotations

import copy
import os
import signal
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fedmodel.runtime.checkpoint import CheckpointError
from fedmodel.runtime.endpoints import (
    EndpointFactory,
    Outbox,
    StateColumns,
    StatesCopy,
    _get_state,
    copy_state,
    party_states,
)
from fedmodel.runtime.heap import freeze_built, resettle, settle, unsettle
from fedmodel.runtime.messages import Message
from fedmodel.runtime.outcomes import (
    ClientTimeout,
    RequestRefused,
    StepInterrupted,
    StepOutcome,
    portable_exception,
)


class PartyHost:
    """Holds some parties' endpoints where they run and executes steps on them.

    A step is one message handled by one party. Before a step the party's state is
    copied (when the endpoint has ``get_state``/``set_state``); if the step raises, times
    out or is interrupted, the state is put back, so a retry repeats exactly that step.
    ``mark()`` keeps a copy of every party's state at a consistent point (the end of an
    outer iteration); ``restore_marks()`` and checkpoints use those copies.

    ``settles``: a host that owns its process (a worker) moves the parties' objects out of
    the collector's full scans once they are built, and back when they go
    (:mod:`fedmodel.runtime.heap`); in the server's process the solve does it.
    """

    def __init__(
        self,
        outbox: Any = None,
        endpoints: dict[str, Any] | None = None,
        settles: bool = False,
    ):
        self.settles = settles
        self.endpoints: dict[str, Any] = {} if endpoints is None else endpoints
        self.outbox = outbox if outbox is not None else Outbox()
        self.marks = Marks()
        # the model as this party compiled it (a deployed party): builds validate the
        # coordinator's options against it
        self.compiled: Any = None
        self._in_step = False
        self._alarm_ok = False
        #: called with a party's name when its step begins and with None when it ends (a
        #: worker records who is in a step, so that its death is blamed on that party)
        self.on_step: Callable[[str | None], None] | None = None

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
        if self.settles:
            settle()
        for i, (name, factory) in enumerate(factories.items(), 1):
            try:
                self.endpoints[name] = factory.build(self.outbox, compiled=self.compiled)
                errors[name] = None
            except BaseException as exc:  # noqa: BLE001 - reported to the server
                errors[name] = (portable_exception(exc), traceback.format_exc())
            if i % 64 == 0:  # (built parties leave the collector's full scans: heap.py)
                freeze_built()
        resettle()
        return errors

    def names(self) -> list[str]:
        return list(self.endpoints)

    def reset(self) -> bool:
        """Drop every party (the worker goes back to its pool for the next solve)."""
        if self.settles:
            unsettle()
        self.endpoints.clear()
        self.marks.clear()
        return True

    def pid(self) -> int:
        return os.getpid()

    # steps
    def _call(
        self,
        name: str,
        fn: Callable[[], Any],
        timeout: float | None,
        rnd: int,
        rollback: bool = True,
    ):
        ep = self.endpoints[name]
        snapshot = _get_state(ep) if rollback else None
        if isinstance(self.outbox, Outbox):
            self.outbox.round = rnd
            self.outbox.take()
        alarm = bool(timeout) and self._alarm_ok
        t0 = time.perf_counter()
        out = StepOutcome(name)
        try:
            self._in_step = True
            if self.on_step is not None:
                self.on_step(name)
            # the client_timeout: SIGALRM on a main thread with the handler installed, a
            # watchdog thread elsewhere (both interrupt Python code between bytecodes; a
            # long call into C code is reported as timed out once it returns)
            with _Watchdog(None if alarm or not timeout else float(timeout)):
                if alarm:
                    signal.setitimer(signal.ITIMER_REAL, float(timeout))
                try:
                    out.reply = fn()
                finally:
                    if alarm:
                        signal.setitimer(signal.ITIMER_REAL, 0.0)
                    self._in_step = False
            out.seconds = time.perf_counter() - t0
            if timeout and out.seconds > timeout:  # could not be interrupted in time
                raise ClientTimeout()
        except ClientTimeout:
            out.reply = None
            out.kind = "timeout"
            out.error = TimeoutError(f"did not answer within client_timeout = {timeout:g} s")
        except (StepInterrupted, KeyboardInterrupt):
            out.reply = None
            out.kind = "interrupted"
            out.error = KeyboardInterrupt("interrupted")
        except RequestRefused as exc:  # refused before it ran: nothing to retry
            out.reply = None
            out.kind = "refused"
            out.error = exc
        except BaseException as exc:  # noqa: BLE001 - reported to the server
            out.reply = None
            out.kind = "raised"
            out.error = portable_exception(exc)
            out.detail = traceback.format_exc()
        self._in_step = False
        if self.on_step is not None:
            self.on_step(None)
        out.seconds = time.perf_counter() - t0
        if not out.ok and snapshot is not None:
            ep.set_state(copy_state(snapshot))
        if isinstance(self.outbox, Outbox):
            sent = self.outbox.take()
            out.sent = sent if out.ok else []
        return out

    def run(
        self, messages: list[Message], timeout: float | None = None, rollback: bool = True
    ) -> list[StepOutcome]:
        """Each message to its receiver, in order; returns one outcome per message.
        ``rollback``: a party whose step fails is put back to its state before the step
        (a snapshot per step; what a retry needs, nothing else does: a stopped run puts
        every party back to its mark).

        Messages whose parties form a cohort (:meth:`_cohorts`) are handled in one
        batched step (:meth:`_call_batch`); a batch that fails is handled again one
        message at a time, so every failure is its own party's, as without batches. The
        outcomes are in the order of ``messages``.
        """
        outcomes: list[StepOutcome | None] = [None] * len(messages)
        for key, group in self._cohorts(messages, timeout):
            steps = [messages[i] for i in group]
            batch = self._call_batch(steps) if key is not None else None
            if batch is None:
                batch = [
                    self._call(
                        m.receiver,
                        lambda m=m: self.endpoints[m.receiver].handle(m),
                        timeout,
                        m.round,
                        rollback,
                    )
                    for m in steps
                ]
            for i, out in zip(group, batch):
                outcomes[i] = out
        return outcomes  # type: ignore[return-value]

    def _cohorts(
        self, messages: list[Message], timeout: float | None
    ) -> list[tuple[Any, list[int]]]:
        """The positions of ``messages`` grouped by batch key, in the order each key first
        appears: the messages to endpoints of one class whose ``batch_key(message)`` is the
        same and not None (the class says which steps stack) are answered in one batch, a
        party alone too (a step that stacks always takes the batched path, so its numbers
        do not depend on how the parties are spread over hosts); key None: one message at
        a time, in order. With a ``client_timeout`` every message is its own step (each
        keeps its own clock)."""
        groups: dict[Any, list[int]] = {}
        order: list[tuple[Any, list[int]]] = []
        for i, m in enumerate(messages):
            ep = self.endpoints.get(m.receiver)
            key = None
            if not timeout and ep is not None and hasattr(type(ep), "handle_batch"):
                found = ep.batch_key(m)
                key = None if found is None else (type(ep), found)
            if key is None:
                order.append((None, [i]))
            elif key in groups:
                groups[key].append(i)
            else:
                groups[key] = [i]
                order.append((key, groups[key]))
        return order

    def _together(self, rnd: int, step: Callable[[], Any]) -> tuple[Any, bool]:
        """Run ``step()``, one step of many parties, as the host runs a party's step: its
        outbox on round ``rnd``, the host in a step. Returns its value (None when it raised:
        it changed no party's state) and whether it sent peer messages; Ctrl-C in it
        raises KeyboardInterrupt."""
        if isinstance(self.outbox, Outbox):
            self.outbox.round = rnd
            self.outbox.take()
        try:
            self._in_step = True
            value = step()
        except StepInterrupted:
            raise KeyboardInterrupt from None
        except Exception:  # noqa: BLE001 - the caller goes message by message
            return None, False
        finally:
            self._in_step = False
        sent = self.outbox.take() if isinstance(self.outbox, Outbox) else []
        return value, bool(sent)

    def _call_batch(self, messages: list[Message]) -> list[StepOutcome] | None:
        """One batched step for ``messages`` (``type(endpoint).handle_batch``): one
        outcome per message, or None when the batch raised or sent peer messages (the
        caller then handles each message on its own). ``handle_batch`` changes no
        party's state unless it returns, so nothing is put back. A worker that dies in a
        batch names no single party (every party of the batch was in the step)."""
        endpoints = [self.endpoints[m.receiver] for m in messages]
        t0 = time.perf_counter()
        try:
            replies, sent = self._together(
                messages[0].round, lambda: type(endpoints[0]).handle_batch(endpoints, messages)
            )
        except KeyboardInterrupt:
            seconds = (time.perf_counter() - t0) / len(messages)
            return [
                StepOutcome(
                    m.receiver,
                    kind="interrupted",
                    error=KeyboardInterrupt("interrupted"),
                    seconds=seconds,
                )
                for m in messages
            ]
        if replies is None or sent or len(replies) != len(messages):
            return None
        seconds = (time.perf_counter() - t0) / len(messages)
        return [
            StepOutcome(m.receiver, reply=r, seconds=seconds) for m, r in zip(messages, replies)
        ]

    def run_rows(
        self, kind: str, names: list[str], fields: Mapping[str, Any], rnd: int
    ) -> tuple[dict[str, np.ndarray], float] | None:
        """The request ``kind`` with ``fields`` (:class:`~fedmodel.runtime.rows.Rows` or one
        value for all) to the parties ``names`` in one stacked step, the first party's
        class's ``handle_rows(endpoints, kind, fields)`` (which declines parties not all of
        its class): the replies' fields as arrays with a row per party and the seconds of
        each party's share; None when the class has no such step, or when it declines or
        raises (it then changed no party's state) or sent peer messages. Ctrl-C in the
        step raises KeyboardInterrupt.
        """
        endpoints = list(map(self.endpoints.__getitem__, names))
        cls = type(endpoints[0])
        if not hasattr(cls, "handle_rows"):  # (it declines parties of other classes)
            return None
        t0 = time.perf_counter()
        replies, sent = self._together(rnd, lambda: cls.handle_rows(endpoints, kind, fields))
        if replies is None or sent:
            return None
        m = len(names)
        for field_name, value in replies.items():
            if not (isinstance(value, np.ndarray) and value.ndim >= 1 and len(value) == m):
                raise TypeError(
                    f"{cls.__name__}.handle_rows answered field {field_name!r} without a row "
                    f"per party ({m})"
                )
        return dict(replies), (time.perf_counter() - t0) / m

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
        """Each party of ``names`` (default: every one here) keeps a copy of its current
        state, all copied together (:class:`Marks`)."""
        eps = self.endpoints
        names = list(eps if names is None else names)
        parties = [eps[n] for n in names]
        kinds = list(map(type, parties))
        if len(set(kinds)) == 1:
            self.marks.take(names, party_states(parties))
            return
        groups: dict[type, list[str]] = {}
        for name, kind in zip(names, kinds):
            groups.setdefault(kind, []).append(name)
        for group in groups.values():
            self.marks.take(group, party_states([eps[n] for n in group]))

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
        ``directory``, in a file it names itself (``party-<name>-<tag>.npz``, see
        :mod:`fedmodel.runtime.checkpoint`); returns name -> (file name, sha256). Nothing
        but these travels."""
        from fedmodel.runtime.checkpoint import state_file_name, write_state_file

        out = {}
        for name, ep in self.endpoints.items():
            state = self.marks.get(name) if marked else _get_state(ep)
            if state is None:
                raise CheckpointError(f"party '{name}' has no state to checkpoint")
            record = {
                "format": "fedmodel-party-state",
                "party": name,
                "fingerprint": _fingerprint(ep),
                "state": state,
            }
            fname = state_file_name("party", tag, name)
            try:
                sha = write_state_file(os.path.join(directory, fname), record)
            except CheckpointError as exc:
                raise CheckpointError(f"party '{name}': {exc}") from None
            out[name] = (fname, sha)
        return out

    def load_checkpoint(self, directory: str, files: Mapping[str, tuple[str, str]]) -> dict:
        """Each party reads and checks its own file (a bare name of its own form inside
        ``directory``, its checksum, its fingerprint), then takes that state; returns
        name -> None or an error message."""
        from fedmodel.runtime.checkpoint import (
            fingerprint_mismatch,
            read_state_file,
            state_misfit,
        )

        errors: dict[str, str | None] = {}
        for name, entry in files.items():
            try:
                if name not in self.endpoints:
                    raise CheckpointError(f"no party '{name}' here")
                if not (isinstance(entry, (list, tuple)) and len(entry) == 2):
                    raise CheckpointError(f"malformed checkpoint entry {entry!r:.80}")
                fname, sha = entry
                record = read_state_file(directory, fname, sha, "party", name)
                if not isinstance(record, dict) or record.get("format") != "fedmodel-party-state":
                    raise CheckpointError(f"file {fname} is not a fedmodel party state")
                if record.get("party") != name:
                    raise CheckpointError(f"file {fname} holds party '{record.get('party')}'")
                ep = self.endpoints[name]
                why = fingerprint_mismatch(record.get("fingerprint"), _fingerprint(ep), name)
                if why is not None:
                    raise CheckpointError(why)
                why = state_misfit(_get_state(ep), record.get("state"))
                if why is not None:
                    raise CheckpointError(f"file {fname} does not fit this run: {why}")
                snapshot = _get_state(ep)
                try:
                    ep.set_state(record["state"])
                except Exception as exc:  # a state of the right form that the half refuses
                    ep.set_state(snapshot)
                    raise CheckpointError(
                        f"file {fname} does not fit this run: {type(exc).__name__}: {exc}"
                    ) from None
                self.marks[name] = _get_state(ep)
                errors[name] = None
            except Exception as exc:  # noqa: BLE001 - reported to the server
                errors[name] = f"{exc}"
        return errors


class Marks:
    """The parties' states at their last mark, by name: the states a mark takes are
    copied together (:class:`~fedmodel.runtime.endpoints.StatesCopy`, a few passes over
    the parties per place of their layout) and each is assembled when it is read (a
    restore, a checkpoint), in containers of its own; a state set by name (one read from
    a checkpoint) is kept as given."""

    def __init__(self) -> None:
        # (a name's mark: the copies taken together it is one of, or a 1-tuple of the
        # state set by name)
        self._at: dict[str, _Taken | tuple[Any]] = {}

    def take(self, names: list[str], states: list[Any] | StateColumns) -> None:
        """The marks of ``names`` become copies of ``states`` (in that order: a list, or
        their :class:`~fedmodel.runtime.endpoints.StateColumns`)."""
        self._at.update(dict.fromkeys(names, _Taken(StatesCopy(states), names)))

    def __setitem__(self, name: str, state: Any) -> None:
        self._at[name] = (state,)

    def get(self, name: str, default: Any = None) -> Any:
        where = self._at.get(name)
        if where is None:
            return default
        return where.state(name) if type(where) is _Taken else where[0]

    def items(self) -> Iterator[tuple[str, Any]]:
        for name in list(self._at):
            yield name, self.get(name)

    def clear(self) -> None:
        self._at.clear()

    def __contains__(self, name: object) -> bool:
        return name in self._at

    def __len__(self) -> int:
        return len(self._at)


class _Taken:
    """The states of ``names`` copied together (:class:`Marks`): each read by its name's
    place among them (the places found at the first read)."""

    __slots__ = ("copies", "names", "places")

    def __init__(self, copies: StatesCopy, names: list[str]):
        self.copies, self.names = copies, names
        self.places: dict[str, int] | None = None

    def state(self, name: str) -> Any:
        if self.places is None:
            self.places = dict(zip(self.names, range(len(self.names))))
        return self.copies.state(self.places[name])


class _Watchdog:
    """Raise :class:`ClientTimeout` in this thread when the block runs longer than
    ``seconds`` (None: never), from a timer thread (``PyThreadState_SetAsyncExc``): the
    ``client_timeout`` of a step run off the main thread, where SIGALRM cannot reach.
    An exception still pending when the block ends is withdrawn."""

    def __init__(self, seconds: float | None):
        self.seconds = seconds
        self._lock = threading.Lock()
        self._live = False
        self._fired = False
        self._timer: threading.Timer | None = None

    def _fire(self) -> None:
        with self._lock:
            if self._live:
                self._fired = True
                _async_raise(self._thread, ClientTimeout)

    def __enter__(self):
        if self.seconds is not None:
            self._thread = threading.get_ident()
            self._live = True
            self._timer = threading.Timer(self.seconds, self._fire)
            self._timer.daemon = True
            self._timer.start()
        return self

    def __exit__(self, *exc):
        if self._timer is not None:
            self._timer.cancel()
            with self._lock:
                self._live = False
                if self._fired:  # (delivered already, or withdrawn here)
                    _async_raise(self._thread, None)
        return False


def _async_raise(thread_id: int, exc_type: type | None) -> None:
    """Set (or, with None, clear) the exception pending in thread ``thread_id``."""
    import ctypes

    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread_id), None if exc_type is None else ctypes.py_object(exc_type)
    )


def _fingerprint(endpoint: Any) -> Any:
    """The fingerprint of the party's own program (``program.fingerprint()``, computed
    here, where its data is); None for an endpoint without a program."""
    program = getattr(endpoint, "program", None)
    return program.fingerprint() if program is not None else None


class StepRecord:
    """A small file naming the party whose step a host (worker process, actor) is
    running: the host writes it when a step begins and ends (:func:`record_steps`), the
    server reads it (:meth:`in_step`) when the host died or hung, so that the failure is
    that party's, whatever became of the replies of the steps before it.

    The host opens the file by descriptor (a worker process inherits it) or by
    :attr:`path` (an actor on the server's machine); once it has, :meth:`opened` removes
    the name. A host on another machine cannot reach the file: the record stays empty.

    Examples
    --------
    >>> record = StepRecord()
    >>> record.in_step() is None
    True
    >>> write = step_writer(record.fd)
    >>> write("site1")
    >>> record.in_step()
    'site1'
    >>> write(None)
    >>> record.in_step() is None
    True
    >>> record.close()
    """

    def __init__(self):
        self.fd, self.path = tempfile.mkstemp(prefix="fedmodel-step-")
        self.clear()

    def in_step(self) -> str | None:
        """The party the host named last (None: no step was running, or no record)."""
        try:
            name = os.pread(self.fd, 4096, 0).split(b"\0", 1)[0]
        except (OSError, ValueError):
            return None
        return name.decode(errors="replace") or None

    def clear(self) -> None:
        os.pwrite(self.fd, b"\0", 0)

    def opened(self) -> None:
        """The host holds the file open: its name is no longer needed."""
        try:
            os.unlink(self.path)
        except OSError:
            pass

    def close(self) -> None:
        self.opened()
        try:
            os.close(self.fd)
        except OSError:
            pass


def step_writer(fd: int) -> Callable[[str | None], None]:
    """What a host calls when a step begins (the party's name) and ends (None): it
    writes the name into the :class:`StepRecord` open as ``fd``."""

    def write(name: str | None) -> None:
        os.pwrite(fd, (name or "").encode() + b"\0", 0)

    return write


@dataclass
class HostDead:
    """A host (worker process or actor) that died or hung.

    Attributes
    ----------
    reason : str
        What happened, as the failure's message says it.
    culprit : str or None
        The party whose step was running when the host died or hung (None: no step was
        running, or the backend cannot tell): the failure is that party's; the host's other
        parties are lost with it (kind ``"lost"``) but not blamed.
    partial : list
        Outcomes of the steps of the call that ended before the host died (in the order
        of the call's messages; the steps after them never ran).
    """

    reason: str
    culprit: str | None = None
    partial: list = field(default_factory=list)
