"""Failure injection, to test the failure policies on every backend.

:func:`inject_faults` wraps some clients' endpoint factories so that, where the client
runs, it raises, sleeps, kills its own worker process or corrupts its reply (a malicious
or broken client: the server's reply validation must refuse it) on chosen rounds::

    from fedmodel.algorithms.proxal.server import run_prox_al
    from fedmodel.runtime.faults import Fault
    res = run_prox_al(model.compile(), opts, faults={"site1": Fault("raise", round=3)})

The policies themselves live in :class:`~fedmodel.runtime.base.Runtime`
(``client_timeout``, ``on_failure``, ``retries``) and in the algorithms' outer loops
(status ``"client_failure"``, the last consistent iterate, checkpoints).
"""

from __future__ import annotations

import dataclasses
import os
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from fedmodel.runtime.endpoints import RUNTIME_PROXY, EndpointFactory
from fedmodel.runtime.messages import Message
from fedmodel.runtime.outcomes import ClientFailure

__all__ = ["ClientFailure", "Fault", "FaultyEndpoint", "InjectedFault", "inject_faults"]


class InjectedFault(RuntimeError):
    """The error raised by a ``Fault("raise")``."""


@dataclass(frozen=True)
class Fault:
    """What goes wrong with a client, and when.

    Parameters
    ----------
    action : {"raise", "sleep", "exit", "corrupt"}
        Raise :class:`InjectedFault`; sleep ``seconds`` before answering; kill the
        process the client runs in (a worker crash; refused in the server's own process);
        or answer, then corrupt the reply's field ``target`` (see ``corruption``).
    round : int
        First communication round on which it happens.
    times : int or None
        How many times it happens (None: on every message from ``round`` on).
    seconds : float
        For ``"sleep"``.
    kinds : tuple of str
        Message kinds it applies to (empty: all).
    target : str
        For ``"corrupt"``: the reply field to corrupt.
    corruption : {"nan", "inf", "shape", "huge", "large", "extra", "missing", "text", "bias"}
        NaN entries; +inf entries; one entry more; a million entries; entries of 1e300;
        an undeclared field ``target`` added; the field removed; a string in its place; +1
        added to every entry (a consistent lie of the right shape: not detectable).
    """

    action: str
    round: int = 1
    times: int | None = 1
    seconds: float = 0.0
    kinds: tuple = ()
    target: str = ""
    corruption: str = ""
    server_pid: int = field(default_factory=os.getpid)

    def __post_init__(self):
        if self.action not in ("raise", "sleep", "exit", "corrupt"):
            raise ValueError(f"unknown fault action {self.action!r}")
        if self.action == "corrupt" and self.corruption not in CORRUPTIONS:
            raise ValueError(f"unknown corruption {self.corruption!r}; one of {CORRUPTIONS}")


CORRUPTIONS = ("nan", "inf", "shape", "huge", "large", "extra", "missing", "text", "bias")


def corrupt(payload: dict, name: str, how: str) -> dict:
    """A copy of ``payload`` with field ``name`` corrupted ``how`` (see :class:`Fault`).

    Examples
    --------
    >>> corrupt({"x": np.zeros(2)}, "x", "shape")["x"].shape
    (3,)
    """
    out = dict(payload)
    if how == "missing":
        out.pop(name, None)
        return out
    if how == "extra":
        out[name] = np.zeros(3)
        return out
    if how == "text":
        out[name] = "not a number"
        return out
    value = np.array(out[name], dtype=float)
    if how == "nan":
        value = np.full(value.shape, np.nan)
    elif how == "inf":
        value = np.full(value.shape, np.inf)
    elif how == "shape":
        value = np.append(value, 0.0)
    elif how == "huge":
        value = np.zeros(10**6)
    elif how == "large":
        value = np.full(value.shape, 1e300)
    elif how == "bias":
        value = value + 1.0
    out[name] = value
    return out


class FaultyEndpoint:
    """An endpoint wrapped with a :class:`Fault` (built where the client runs)."""

    def __init__(self, factory: EndpointFactory, fault: Fault, outbox=None):
        if fault.action == "corrupt" and outbox is not None:  # its peer messages too
            outbox = _CorruptingOutbox(outbox, fault)
        self.inner = factory.build(outbox)
        self.fault = fault
        self.fired = 0  # not part of the state: a restored state does not re-arm the fault

    def __getattr__(self, item):
        return getattr(self.__dict__["inner"], item)

    def get_state(self):
        return self.inner.get_state()

    def set_state(self, state):
        self.inner.set_state(state)

    def _due(self, msg) -> bool:
        """Whether the fault happens on ``msg``."""
        f = self.fault
        due = msg.round >= f.round and (not f.kinds or msg.kind in f.kinds)
        if f.action == "corrupt" and msg.channel != "local" and msg.sender != "server":
            due = False  # (a peer message delivered to it: it corrupts what it sends)
        return due and (f.times is None or self.fired < f.times)

    def batch_key(self, msg):
        """The wrapped endpoint's batch key while the fault is not due (its steps, and so
        its numbers, are then those of the run without the fault); a due step runs alone."""
        if self._due(msg) or not hasattr(type(self.inner), "handle_batch"):
            return None
        key = self.inner.batch_key(msg)
        return None if key is None else (type(self.inner), key)

    @staticmethod
    def handle_batch(endpoints, msgs):
        """The wrapped endpoints' batched step (no fault is due in a batch)."""
        inner = [e.inner for e in endpoints]
        return type(inner[0]).handle_batch(inner, msgs)

    def handle(self, msg):
        f = self.fault
        if self._due(msg):
            self.fired += 1
            if f.action == "raise":
                raise InjectedFault(f"injected failure of {self.inner.name!r} in round {msg.round}")
            if f.action == "sleep":  # (in short naps: a slow computation, which a
                # client_timeout interrupts between two of them on any thread)
                end = time.monotonic() + f.seconds
                while (left := end - time.monotonic()) > 0:
                    time.sleep(min(left, 0.05))
            elif f.action == "exit":
                if os.getpid() == f.server_pid:
                    raise InjectedFault("a worker-crash fault cannot run in the server's process")
                os.kill(os.getpid(), signal.SIGKILL)
            elif f.action == "corrupt":
                out = self.inner.handle(msg)
                if isinstance(out, Message):
                    return dataclasses.replace(
                        out, payload=corrupt(out.payload, f.target, f.corruption)
                    )
                return corrupt(out, f.target, f.corruption) if isinstance(out, dict) else out
        return self.inner.handle(msg)


class _CorruptingOutbox:
    """The outbox of a client with a ``"corrupt"`` fault: it corrupts the peer messages of
    the fault's kinds that the client sends (from the fault's round on)."""

    def __init__(self, outbox, fault: Fault):
        self.outbox, self.fault, self.fired = outbox, fault, 0

    def send_peer(self, sender, receiver, kind, payload, channel="algorithm"):
        f = self.fault
        rnd = int(getattr(self.outbox, "round", f.round))
        due = kind in f.kinds and rnd >= f.round and (f.times is None or self.fired < f.times)
        if due:
            self.fired += 1
            payload = corrupt(payload, f.target, f.corruption)
        return self.outbox.send_peer(sender, receiver, kind, payload, channel)

    def __getattr__(self, item):
        return getattr(self.__dict__["outbox"], item)


def inject_faults(
    factories: Mapping[str, EndpointFactory], faults: Mapping[str, Fault] | None
) -> dict[str, EndpointFactory]:
    """Wrap the factories of the clients named in ``faults``."""
    faults = dict(faults or {})
    unknown = sorted(set(faults) - set(factories))
    if unknown:
        raise ValueError(f"faults name unknown clients {unknown}")
    return {
        n: EndpointFactory(FaultyEndpoint, (f, faults[n], RUNTIME_PROXY)) if n in faults else f
        for n, f in factories.items()
    }
