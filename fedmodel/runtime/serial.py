"""The serial runtime: every party runs in this process, one after the other.

Algorithms reach clients only through a runtime: they send a message and receive the
reply. Each client endpoint owns its own state (data, compiled subproblem, multipliers)
and never sees another's. Other runtimes (processes, Ray) implement the same interface.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from fedmodel.runtime.messages import SERVER, Ledger, Message


class Endpoint(Protocol):
    """A party's message handler: takes a message, returns the reply."""

    name: str

    def handle(self, msg: Message) -> Message: ...


class SerialRuntime:
    """Deliver messages to in-process client endpoints and record them in a ledger.

    Parameters
    ----------
    endpoints : mapping of client name to endpoint
        Objects with ``name`` and ``handle(message) -> reply``.
    """

    def __init__(self, endpoints: Mapping[str, Endpoint]):
        self.endpoints = dict(endpoints)
        self.ledger = Ledger()
        self.round = 0
        self.client_seconds: dict[str, float] = {n: 0.0 for n in self.endpoints}

    @property
    def client_names(self) -> list[str]:
        return list(self.endpoints)

    def next_round(self) -> int:
        self.round += 1
        return self.round

    def send(self, receiver: str, kind: str, payload: dict[str, Any], channel: str = "algorithm") -> Message:
        """Send one message to ``receiver`` and return its reply."""
        msg = Message(kind, SERVER, receiver, payload, self.round, channel)
        self.ledger.record(msg)
        t0 = time.perf_counter()
        reply = self.endpoints[receiver].handle(msg)
        self.client_seconds[receiver] += time.perf_counter() - t0
        if reply.sender != receiver or reply.receiver != SERVER:
            raise RuntimeError(f"endpoint {receiver!r} replied as {reply.sender!r}")
        self.ledger.record(reply)
        return reply

    def broadcast(
        self,
        kind: str,
        payload: dict[str, Any] | Callable[[str], dict[str, Any]],
        channel: str = "algorithm",
    ) -> dict[str, Message]:
        """Send a message to every client (the same payload, or one built per client by
        a callable) and collect the replies, keyed by client name."""
        replies = {}
        for name in self.endpoints:
            body = payload(name) if callable(payload) else payload
            replies[name] = self.send(name, kind, body, channel)
        return replies
