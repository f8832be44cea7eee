"""Failure injection, to test the failure policies on every backend.

:func:`inject_faults` wraps some clients' endpoint factories so that, where the client
runs, it raises, sleeps or kills its own worker process on chosen rounds::

    from fedmodel.algorithms.proxal.server import run_prox_al
    from fedmodel.runtime.faults import Fault
    res = run_prox_al(model.compile(), opts, faults={"site1": Fault("raise", round=3)})

The policies themselves live in :class:`~fedmodel.runtime.base.Runtime`
(``client_timeout``, ``on_failure``, ``retries``) and in the algorithms' outer loops
(status ``"client_failure"``, the last consistent iterate, checkpoints).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from fedmodel.runtime.endpoints import RUNTIME_PROXY, EndpointFactory
from fedmodel.runtime.outcomes import ClientFailure

__all__ = ["ClientFailure", "Fault", "FaultyEndpoint", "InjectedFault", "inject_faults"]


class InjectedFault(RuntimeError):
    """The error raised by a ``Fault("raise")``."""


@dataclass(frozen=True)
class Fault:
    """What goes wrong with a client, and when.

    Parameters
    ----------
    action : {"raise", "sleep", "exit"}
        Raise :class:`InjectedFault`; sleep ``seconds`` before answering; or kill the
        process the client runs in (a worker crash; refused in the server's own process).
    round : int
        First communication round on which it happens.
    times : int or None
        How many times it happens (None: on every message from ``round`` on).
    seconds : float
        For ``"sleep"``.
    kinds : tuple of str
        Message kinds it applies to (empty: all).
    """

    action: str
    round: int = 1
    times: int | None = 1
    seconds: float = 0.0
    kinds: tuple = ()
    server_pid: int = field(default_factory=os.getpid)

    def __post_init__(self):
        if self.action not in ("raise", "sleep", "exit"):
            raise ValueError(f"unknown fault action {self.action!r}")


class FaultyEndpoint:
    """An endpoint wrapped with a :class:`Fault` (built where the client runs)."""

    def __init__(self, factory: EndpointFactory, fault: Fault, outbox=None):
        self.inner = factory.build(outbox)
        self.fault = fault
        self.fired = 0  # not part of the state: a restored state does not re-arm the fault

    def __getattr__(self, item):
        return getattr(self.__dict__["inner"], item)

    def get_state(self):
        return self.inner.get_state()

    def set_state(self, state):
        self.inner.set_state(state)

    def handle(self, msg):
        f = self.fault
        due = msg.round >= f.round and (not f.kinds or msg.kind in f.kinds)
        if due and (f.times is None or self.fired < f.times):
            self.fired += 1
            if f.action == "raise":
                raise InjectedFault(f"injected failure of {self.inner.name!r} in round {msg.round}")
            if f.action == "sleep":
                time.sleep(f.seconds)
            elif f.action == "exit":
                if os.getpid() == f.server_pid:
                    raise InjectedFault("a worker-crash fault cannot run in the server's process")
                os.kill(os.getpid(), signal.SIGKILL)
        return self.inner.handle(msg)


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
