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

    def send(
        self, receiver: str, kind: str, payload: dict[str, Any], channel: str = "algorithm"
    ) -> Message:
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

    # -- peer-to-peer messages (decentralized methods: dald-dc, dgd) -------------------------
    def send_peer(
        self,
        sender: str,
        receiver: str,
        kind: str,
        payload: dict[str, Any],
        channel: str = "algorithm",
    ) -> Message:
        """Queue a one-way message from one party to another (no server involved).

        The message is recorded in the same ledger as server traffic and delivered, in the
        order sent, by :meth:`deliver_peer_messages`. Endpoints handling peer messages
        return ``None`` (there is no reply).
        """
        if receiver not in self.endpoints:
            raise KeyError(f"unknown receiver {receiver!r}")
        msg = Message(kind, sender, receiver, payload, self.round, channel)
        self.ledger.record(msg)
        queue = self.__dict__.setdefault("_peer_queue", [])
        queue.append(msg)
        return msg

    def deliver_peer_messages(self) -> int:
        """Deliver queued peer messages (including those sent while delivering) until the
        queue is empty; returns how many were delivered."""
        queue = self.__dict__.setdefault("_peer_queue", [])
        delivered = 0
        while queue:
            msg = queue.pop(0)
            t0 = time.perf_counter()
            self.endpoints[msg.receiver].handle(msg)
            self.client_seconds[msg.receiver] = (
                self.client_seconds.get(msg.receiver, 0.0) + time.perf_counter() - t0
            )
            delivered += 1
        return delivered

    def activate(self, name: str, kind: str, payload: dict[str, Any] | None = None) -> Any:
        """Run a local step of party ``name`` (its turn in a coordination sequence).

        Nothing crosses the network: in a deployment the step is triggered by the arrival
        of the neighbours' messages. The call is recorded in the ledger on the ``"local"``
        channel (zero floats are attributed to the network) and timed for the party.
        Returns the endpoint's return value (e.g. a decision of the root).
        """
        msg = Message(kind, name, name, dict(payload or {}), self.round, "local")
        t0 = time.perf_counter()
        out = self.endpoints[name].handle(msg)
        self.client_seconds[name] = self.client_seconds.get(name, 0.0) + time.perf_counter() - t0
        return out
