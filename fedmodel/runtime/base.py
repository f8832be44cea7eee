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

**Non-blocking exchange** (:meth:`Runtime.post`, :meth:`Runtime.poll`): ``post`` hands one
message to a party and returns a :class:`Ticket` at once; ``poll`` returns the replies
that are ready. On the processes and Ray backends (``supports_async = True``) the party
computes while the server goes on; the serial backend (and a party hosted in the server's
process) handles the message when it is posted, so its reply is ready at once and a run
is deterministic; a backend without a non-blocking exchange does the same (a blocking
exchange at ``post``). A posted message and its reply are recorded in the ledger when
the reply is received (so on the asynchronous backends the ledger's order is the order
of arrival); a failure or timeout of a posted step follows the same policy as a blocking
one (``"retry"`` re-posts it, otherwise :class:`ClientFailure` at ``poll``). While a host
has posted work in flight it cannot take a blocking call (marks, broadcasts to it):
poll its tickets first (:attr:`Runtime.in_flight`).
"""

from __future__ import annotations

import abc
import signal
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from fedmodel.runtime.checkpoint import CheckpointError
from fedmodel.runtime.heap import resettle
from fedmodel.runtime.host import HostDead, PartyHost
from fedmodel.runtime.messages import SERVER, Ledger, Message, measure
from fedmodel.runtime.outcomes import (
    ClientFailure,
    InvalidReply,
    StepOutcome,
)
from fedmodel.runtime.placement import SERVER_HOST
from fedmodel.runtime.rows import (
    RoundReplies,
    check_rows,
    exchange_rows,
    payload_at,
    payloads_of,
)
from fedmodel.runtime.schema import MessageTable

BACKENDS = ("serial", "processes", "ray", "flower")


ON_FAILURE = ("stop", "retry")


# Seconds a worker may take beyond ``client_timeout`` (per step it runs) to answer before it
# is considered hung and is stopped; its parties then count as failed.
GRACE_SECONDS = 5.0


@dataclass(eq=False)
class Ticket:
    """A message posted with :meth:`Runtime.post`, waiting for its reply.

    Attributes
    ----------
    message : Message
        What was sent (its ``round`` is the round it was posted in).
    reply : Message or None
        The reply, once received.
    posted : float
        ``time.perf_counter()`` when it was (last) posted.
    tries : int
        Re-posts after a failed attempt (``on_failure="retry"``).
    """

    message: Message
    reply: Message | None = None
    posted: float = 0.0
    tries: int = 0
    host: Any = None
    deadline: float | None = None
    outcome: StepOutcome | None = field(default=None, repr=False)
    running: bool = False  # submitted to its host, result not collected yet

    @property
    def receiver(self) -> str:
        return self.message.receiver

    @property
    def done(self) -> bool:
        """The reply is in."""
        return self.reply is not None


# -- the server side -----------------------------------------------------------------------------
class Runtime(abc.ABC):
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

    Attributes
    ----------
    messages : MessageTable or None
        The method's declared message table (:meth:`declare`): every request the server
        sends (``send``, ``broadcast``, ``post``) is checked against it before it leaves
        (an undeclared kind, a missing or undeclared field: a ``ValueError`` naming the
        kind and the field) and travels, and is recorded in the ledger, on its declared
        channel.
    reply_check : callable or None
        ``check(party, kind, direction, payload)`` (a
        :data:`~fedmodel.runtime.schema.ReplyCheck`, e.g. from the method's declared
        message table) called on every reply, peer message and activation return before
        anyone uses it; an :class:`~fedmodel.runtime.outcomes.InvalidReply` it raises is a
        failure of that party (kind ``"invalid_reply"``, not retried: the party's step
        ran, so a retry would not repeat it). Every reply must also come from the party
        asked, be addressed to the server and be of kind ``<kind>_reply``.
    """

    backend = "base"
    #: ``post`` returns before the party has computed (processes, Ray); otherwise it
    #: exchanges the message at once (serial: deterministically)
    supports_async = False

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
        self.client_seconds = {}
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
        # posted messages whose reply the server has not taken yet (post/poll)
        self._tickets_out: list[Ticket] = []
        self.reply_check: Callable[[str, str, str, Any], None] | None = None
        self.messages: MessageTable | None = None
        # the parties' dimensions of the last declare (none before one)
        self.declared_dims: Callable[[str], Mapping[str, int]] = _no_dims

    def declare(self, table: MessageTable | None, dims: Callable[[str], Mapping[str, int]]) -> None:
        """Declare the method's message table: outgoing requests are checked against it
        and take its channels; replies, peer messages and activation returns are checked
        by its :meth:`~fedmodel.runtime.schema.MessageTable.checker` with ``dims(party)``
        the symbolic dimensions of a party (None: no table, nothing checked); ``dims`` is
        kept (:attr:`declared_dims`) for a table declared later in the run."""
        self.messages = table
        self.declared_dims = dims
        self.reply_check = None if table is None else table.checker(dims)

    def _outgoing(self, kind: str, payload: Any, channel: str | None) -> str:
        """The channel of a request of ``kind`` after checking it against the declared
        table (without one: ``channel`` or ``"algorithm"``)."""
        if self.messages is None:
            return channel or "algorithm"
        why = self.messages.request_problem(kind, payload)
        if why:
            raise ValueError(f"the server sends {why}")
        declared = self.messages.channel(kind)
        if channel is not None and channel != declared:
            raise ValueError(
                f"the server sends message {kind!r} on channel {channel!r}; its declaration "
                f"in table {self.messages.family!r} says {declared!r}"
            )
        return declared

    # -- interface ----------------------------------------------------------------------
    @property
    def client_seconds(self) -> dict[str, float]:
        """Seconds each client has spent in its steps, by name (a stacked round's share of
        each of its clients, :meth:`add_seconds`, added in when this is read)."""
        found = self.__dict__
        pending = found.get("_pending_seconds")
        if pending:
            spent = found["_client_seconds"]
            for names, seconds in pending:
                for n in names:
                    spent[n] = spent.get(n, 0.0) + seconds
            pending.clear()
        return found["_client_seconds"]

    @client_seconds.setter
    def client_seconds(self, value: dict[str, float]) -> None:
        self.__dict__["_client_seconds"] = value
        self.__dict__["_pending_seconds"] = []

    def add_seconds(self, names: list[str], seconds: float) -> None:
        """Count ``seconds`` for each client of ``names`` (one round's share): kept per
        list of clients and added to :attr:`client_seconds` when it is read."""
        pending = self.__dict__.setdefault("_pending_seconds", [])
        if pending and pending[-1][0] == names:
            pending[-1][1] += seconds
            return
        if len(pending) >= 8:  # (kept short: added in now)
            self.client_seconds  # noqa: B018 - reading adds them
        pending.append([list(names), seconds])

    @property
    def client_names(self) -> list[str]:
        return list(self._host_of)

    @property
    def alive(self) -> list[str]:
        return [n for n in self.client_names if n not in self.dead]

    def next_round(self) -> int:
        resettle()  # (what the last round kept stays out of full collections: heap.py)
        self.round += 1
        return self.round

    def send(
        self, receiver: str, kind: str, payload: dict[str, Any], channel: str | None = None
    ) -> Message:
        """Send one message to ``receiver`` and return its reply."""
        if receiver not in self._host_of:
            raise KeyError(f"unknown receiver {receiver!r}")
        channel = self._outgoing(kind, payload, channel)
        msg = Message(kind, SERVER, receiver, payload, self.round, channel)
        return self._exchange([msg])[receiver]

    def broadcast(
        self,
        kind: str,
        payload: dict[str, Any] | Callable[[str], dict[str, Any]],
        channel: str | None = None,
        to: Iterable[str] | None = None,
    ) -> Mapping[str, Message]:
        """Send a message to every client (or to those in ``to``), the same payload or one
        built per client by a callable, and collect the replies, keyed by client name in
        client order. One payload for all, to parties in this process whose class answers
        the kind in one stacked step, takes the stacked path of :meth:`broadcast_rows`
        (the replies then a :class:`~fedmodel.runtime.rows.RoundReplies`)."""
        wanted = None if to is None else set(to)
        names = (
            self.client_names if wanted is None else [n for n in self.client_names if n in wanted]
        )
        if callable(payload):
            payloads = {n: payload(n) for n in names}
            # (the check reads the field names only: once per set of names)
            checked: dict[tuple, str] = {}
            channels = {}
            for n in names:
                if not isinstance(payloads[n], Mapping):
                    channels[n] = self._outgoing(kind, payloads[n], channel)
                    continue
                fields = tuple(payloads[n])
                if fields not in checked:
                    checked[fields] = self._outgoing(kind, payloads[n], channel)
                channels[n] = checked[fields]
        else:  # (one payload: checked once; a stacked step where the parties have one)
            one_channel = self._outgoing(kind, payload, channel)
            done = exchange_rows(self, kind, names, payload, one_channel) if names else None
            if done is not None:
                return done
            payloads = dict.fromkeys(names, payload)
            channels = dict.fromkeys(names, one_channel)
        msgs = [Message(kind, SERVER, n, payloads[n], self.round, channels[n]) for n in names]
        return self._exchange(msgs)

    def broadcast_rows(
        self,
        kind: str,
        fields: Mapping[str, Any],
        channel: str | None = None,
        to: Iterable[str] | None = None,
    ) -> RoundReplies:
        """Send the round's clients (every client in client order, or ``to`` in its order)
        a message of ``kind`` whose fields are ``fields``, each one value for every client or
        :class:`~fedmodel.runtime.rows.Rows` (the round's client ``i`` gets row ``i``), and
        collect the replies: a :class:`~fedmodel.runtime.rows.RoundReplies` keyed by client
        name in the round's order, whose fields can be read stacked. Each client gets its
        own message and its own ledger rows, as with :meth:`broadcast`; a round of parties
        in this process that answer ``kind`` in one stacked step takes the stacked path
        (:func:`~fedmodel.runtime.rows.exchange_rows`)."""
        names = self.client_names if to is None else list(to)
        host_of = self._host_of
        told = getattr(host_of, "all_in_server", None)  # (every one known, here)
        if not (told is not None and told(names)) and not all(
            map(host_of.keys().__contains__, names)
        ):
            raise KeyError(f"unknown receivers {[n for n in names if n not in host_of]}")
        check_rows(fields, len(names))
        if not names:
            return RoundReplies(names, messages={})
        channel = self._outgoing(kind, payload_at(fields, 0), channel)
        done = exchange_rows(self, kind, names, fields, channel)
        if done is not None:
            return done
        payloads = payloads_of(fields, len(names))
        msgs = [Message(kind, SERVER, n, p, self.round, channel) for n, p in zip(names, payloads)]
        return RoundReplies(names, messages=self._exchange(msgs))

    # -- non-blocking exchange ------------------------------------------------------------
    @property
    def in_flight(self) -> int:
        """Posted messages whose reply has not been taken by :meth:`poll` yet."""
        return len(self._tickets_out)

    def post(
        self, receiver: str, kind: str, payload: dict[str, Any], channel: str | None = None
    ) -> Ticket:
        """Send one message to ``receiver`` without waiting for its reply.

        Returns a :class:`Ticket`; :meth:`poll` returns the reply when it is ready. A party
        gets its posted messages in the order they were posted. On a backend without
        ``supports_async`` (and for a party in the server's process) the message is
        exchanged at once (a failure raises :class:`ClientFailure` here).

        Examples
        --------
        >>> from fedmodel.runtime.serial import SerialRuntime
        >>> class Echo:
        ...     name = "a"
        ...     def handle(self, m):
        ...         return Message("echo", "a", SERVER, dict(m.payload), m.round)
        >>> rt = SerialRuntime({"a": Echo()})
        >>> t = rt.post("a", "ping", {"x": 1.0})
        >>> rt.poll([t])[t].payload, rt.in_flight
        ({'x': 1.0}, 0)
        """
        if receiver not in self._host_of:
            raise KeyError(f"unknown receiver {receiver!r}")
        channel = self._outgoing(kind, payload, channel)
        msg = Message(kind, SERVER, receiver, payload, self.round, channel)
        ticket = Ticket(msg, host=self._host_of[receiver], posted=time.perf_counter())
        if not self.supports_async or ticket.host == SERVER_HOST or receiver in self.dead:
            ticket.reply = self._exchange([msg])[receiver]  # at once (deterministic)
            self._tickets_out.append(ticket)
            return ticket
        self._tickets_out.append(ticket)
        self._launch(ticket)
        return ticket

    def poll(
        self,
        tickets: Iterable[Ticket],
        timeout: float | None = None,
        min_count: int = 1,
    ) -> dict[Ticket, Message]:
        """The replies of ``tickets`` that are ready, waiting until at least
        ``min_count`` of them are (or ``timeout`` seconds passed; ``None``: no limit);
        ``min_count=0`` takes what has arrived without waiting.

        Returned tickets leave :attr:`in_flight`; the others may be polled again. Replies
        are recorded in the ledger when they arrive. A step that failed is re-posted
        (``on_failure="retry"``, retryable failures, up to ``retries`` times) or raises
        :class:`ClientFailure` (the runtime still holds the other posted work:
        :meth:`recover` discards it). ``poll(tickets, min_count=len(tickets))`` waits for
        all of them.
        """
        tickets = list(tickets)
        unknown = [t for t in tickets if t not in self._tickets_out]
        if unknown:
            raise ValueError(
                f"poll got tickets that are not in flight (already polled?): "
                f"{[(t.receiver, t.message.kind) for t in unknown]}"
            )
        want = min(int(min_count), len(tickets))
        end = None if timeout is None else time.perf_counter() + float(timeout)
        t0 = time.perf_counter()
        try:
            if any(t.running for t in tickets):  # take what has arrived, without waiting
                self._receive_some(0.0)
            while sum(t.done for t in tickets) < want:
                remaining = None if end is None else end - time.perf_counter()
                if remaining is not None and remaining <= 0:
                    break
                self._receive_some(remaining)
        finally:
            self.wait_seconds += time.perf_counter() - t0
        out = {t: t.reply for t in tickets if t.done}
        self._tickets_out = [t for t in self._tickets_out if t not in out]
        return out

    def _receive_some(self, timeout: float | None) -> None:
        """Wait (at most ``timeout`` s and until the earliest step deadline) for posted
        work to finish; record what arrived, re-post or raise failed steps."""
        pending = [t for t in self._tickets_out if t.running]
        if not pending:
            raise RuntimeError("poll: nothing is in flight")
        now = time.perf_counter()
        deadlines = [t.deadline + GRACE_SECONDS for t in pending if t.deadline is not None]
        wait_for = timeout
        if deadlines:
            until = max(0.0, min(deadlines) - now)
            wait_for = until if wait_for is None else min(wait_for, until)
        arrived = self._collect(pending, wait_for)
        now = time.perf_counter()
        if not arrived:  # a host that overran its deadline is stopped
            overran = {
                t.host
                for t in pending
                if t.deadline is not None and now > t.deadline + GRACE_SECONDS
            }
            for host in overran:
                dropped = self._abandon(host)  # (in the order posted: the first was running)
                culprit = dropped[0].receiver if dropped else None
                why = HostDead(
                    f"{self.backend} worker did not answer within client_timeout = "
                    f"{self.client_timeout:g} s per step (+{GRACE_SECONDS:g} s) and was "
                    f"stopped in client '{culprit}''s step",
                    culprit,
                )
                arrived.extend((d, why) for d in dropped)
        failed: dict[str, tuple[Ticket, StepOutcome]] = {}
        for ticket, res in arrived:
            ticket.running = False
            if isinstance(res, HostDead):
                names = [n for n, h in self._host_of.items() if h == ticket.host]
                self._mark_dead(names, res.reason, res.culprit)
                res = self.dead[ticket.receiver]
            msg = ticket.message
            res = _as_outcome(msg, res)
            self.ledger.record(msg)
            self.client_seconds[msg.receiver] = (
                self.client_seconds.get(msg.receiver, 0.0) + res.seconds
            )
            res = self._vet(msg, res)
            if res.ok:
                reply = res.reply
                self.ledger.record(reply)
                ticket.reply = reply
                continue
            if (
                self.on_failure == "retry"
                and res.retryable
                and ticket.tries < self.retries
                and msg.receiver not in self.dead
            ):
                ticket.tries += 1
                self.retried.append(
                    {
                        "client": msg.receiver,
                        "round": msg.round,
                        "kind": msg.kind,
                        "attempt": ticket.tries,
                        "error": res.describe(),
                    }
                )
                ticket.posted = time.perf_counter()
                self._launch(ticket)
                continue
            failed[msg.receiver] = (ticket, res)
            ticket.outcome = res
            self._tickets_out.remove(ticket)  # given up: reported now, not polled again
        if failed:
            first = next(iter(failed.values()))[0]
            self._fail({n: o for n, (_, o) in failed.items()}, first.message)

    def _launch(self, ticket: Ticket) -> None:
        """Start the step of a posted ticket on its host (its deadline from
        ``client_timeout``, after the host's earlier posted steps)."""
        if self.client_timeout:
            before = [
                t.deadline
                for t in self._tickets_out
                if t.host == ticket.host and t is not ticket and t.running and t.deadline
            ]
            start = max([time.perf_counter(), *before])
            ticket.deadline = start + float(self.client_timeout)
        ticket.running = True
        self._submit(ticket)

    def _submit(self, ticket: Ticket) -> None:
        """Backend: start ``ticket.message`` on ``ticket.host`` without waiting."""
        raise NotImplementedError(
            f"{type(self).__name__}._submit: a backend with supports_async = True must define it"
        )

    def _collect(self, pending: list[Ticket], timeout: float | None) -> list[tuple[Ticket, Any]]:
        """Backend: wait up to ``timeout`` s for at least one posted step to finish;
        returns ``(ticket, StepOutcome or HostDead)`` for each that did."""
        raise NotImplementedError(
            f"{type(self).__name__}._collect: a backend with supports_async = True must define it"
        )

    def _abandon(self, host: Any) -> list[Ticket]:
        """Backend: stop a host that overran; returns its posted tickets."""
        raise NotImplementedError(
            f"{type(self).__name__}._abandon: a backend with supports_async = True must define it"
        )

    def _drop_posted(self) -> None:
        """After a failure or an interruption: let posted work finish (within the grace
        period) and discard it; a host that does not finish is stopped."""
        deadline = time.perf_counter() + GRACE_SECONDS + float(self.client_timeout or 0.0)
        pending = [t for t in self._tickets_out if t.running]
        while pending and time.perf_counter() < deadline:
            for ticket, _res in self._collect(pending, deadline - time.perf_counter()):
                ticket.running = False  # its result is discarded
            pending = [t for t in pending if t.running]
        for host in {t.host for t in pending}:
            self._abandon(host)
            names = [n for n, h in self._host_of.items() if h == host]
            self._mark_dead(names, "worker stopped: its posted work did not finish in time")
        self._tickets_out.clear()

    def _check_quiet(self, hosts: Iterable[Any]) -> None:
        """A blocking call must not reach a host that still computes posted work."""
        if not self._tickets_out:
            return
        hosts = set(hosts)
        busy = sorted({t.receiver for t in self._tickets_out if t.running and t.host in hosts})
        if busy:
            raise RuntimeError(
                f"parties {busy} still compute posted work: poll their tickets before a "
                "blocking exchange with them (e.g. drain before a mark or an evaluation)"
            )

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
        if self.reply_check is not None:  # raises InvalidReply, a failure of the sender
            self.reply_check(sender, kind, "peer", payload)
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
        groups = self._hosts_for(self.alive)
        for h, res in self._map_hosts(
            "write_checkpoint", lambda names: (directory, tag, marked)
        ).items():
            for n in groups[h]:  # (name, sha256) per party, as the host's answer must be
                entry = res.get(n) if isinstance(res, Mapping) else None
                if not (
                    isinstance(entry, (list, tuple))
                    and len(entry) == 2
                    and all(isinstance(v, str) for v in entry)
                ):
                    raise CheckpointError(
                        f"party '{n}' did not answer the file it wrote (its host answered "
                        f"{type(res).__name__})"
                    )
                out[n] = entry
        lost = [n for n in self.client_names if n not in out]
        if lost:
            raise CheckpointError(f"parties {lost} were lost while writing their state")
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
        if self._tickets_out:
            self._drop_posted()

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
        """Hook: tell busy workers to abandon their step (processes backend); the other
        backends have nothing to tell."""
        return None

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

    def one_host(self, names: list[str]) -> bool:
        """Whether every client of ``names`` runs on one host (one after another)."""
        host_of = self._host_of
        told = getattr(host_of, "all_in_server", None)
        if told is not None and told(names):
            return True
        return len(set(map(host_of.get, names))) <= 1

    # -- exchange ---------------------------------------------------------------------------
    def _hosts_for(self, names: Iterable[str]) -> dict[Any, list[str]]:
        names = list(names)
        told = getattr(self._host_of, "all_in_server", None)
        if told is not None and names and told(names):  # (one host: no lookup per name)
            return {SERVER_HOST: names}
        groups: dict[Any, list[str]] = {}
        for n in names:
            groups.setdefault(self._host_of[n], []).append(n)
        return groups

    @abc.abstractmethod
    def _map(self, calls: dict[Any, tuple[str, tuple]], steps: dict[Any, int]) -> dict[Any, Any]:
        """Call ``getattr(host, method)(*args)`` on each host; returns host -> result, or
        host -> :class:`HostDead` when the host died or hung (``steps`` = how many client
        steps each call runs, to bound the wait). Every backend defines it."""

    def _map_hosts(self, method: str, args_for: Callable[[list[str]], tuple]) -> dict[Any, Any]:
        groups = self._hosts_for(self.alive)
        self._check_quiet(groups)
        calls = {h: (method, args_for(names)) for h, names in groups.items()}
        results = self._map(calls, {h: 0 for h in calls})
        out = {}
        for h, res in results.items():
            if isinstance(res, HostDead):
                self._mark_dead(groups[h], res.reason, res.culprit)
                continue
            out[h] = res
        return out

    def _mark_dead(self, names: Iterable[str], reason: str, culprit: str | None = None) -> None:
        """The parties ``names`` of a host that died or hung are gone for the rest of the
        run: ``culprit`` (the party in a step then) failed, kind ``"dead"``; the others,
        which were idle or waiting behind it, are ``"lost"`` and not blamed (without a
        culprit every one is ``"dead"``)."""
        names = list(names)
        for n in names:
            if n in self.dead:
                continue
            if culprit is None or n == culprit:
                self.dead[n] = StepOutcome(n, error=RuntimeError(reason), kind="dead")
            else:
                why = f"lost with its worker, which failed in client '{culprit}''s step: {reason}"
                self.dead[n] = StepOutcome(n, error=RuntimeError(why), kind="lost")

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
        self._check_quiet(groups)
        rollback = self.on_failure == "retry"  # (a snapshot per step only for a retry)
        calls = {h: ("run", (ms, self.client_timeout, rollback)) for h, ms in groups.items()}
        t0 = time.perf_counter()
        try:
            results = self._map(calls, {h: len(ms) for h, ms in groups.items()})
        finally:
            self.wait_seconds += time.perf_counter() - t0
        for h, res in results.items():
            if isinstance(res, HostDead):
                done = res.partial[: len(groups[h])]  # (steps that ended before it died)
                for m, out in zip(groups[h], done):
                    outcomes[m.receiver] = _as_outcome(m, out)
                self._mark_dead(
                    [n for n, hh in self._host_of.items() if hh == h], res.reason, res.culprit
                )
                for m in groups[h][len(done) :]:
                    outcomes[m.receiver] = self.dead[m.receiver]
            else:
                if not (isinstance(res, (list, tuple)) and len(res) == len(groups[h])):
                    res = [res] * len(groups[h])  # no outcome per message: refused below
                for m, out in zip(groups[h], res):
                    outcomes[m.receiver] = _as_outcome(m, out)
        return outcomes

    def _exchange(
        self, msgs: list[Message], first: dict[str, StepOutcome] | None = None
    ) -> dict[str, Message]:
        """Run ``msgs`` (or take ``first``, the outcomes of their steps when they have
        run), check the replies, retry what the failure policy retries, record every
        message in the ledger and return the replies (a failure raises)."""
        attempts: list[tuple[Message, StepOutcome]] = []
        outcomes = self._vet_all(msgs, first if first is not None else self._run_messages(msgs))
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
            new = self._vet_all(again, self._run_messages(again))
            outcomes.update(new)
            attempts.extend((m, new[m.receiver]) for m in again)
        sent: dict[int, tuple[dict, int]] = {}  # (one request payload, measured once)
        for m, out in attempts:  # the same order on every backend
            known = sent.get(id(m.payload))
            if known is None:
                known = sent[id(m.payload)] = measure(m.payload)
            self.ledger.record(m, known)
            self.client_seconds[m.receiver] = self.client_seconds.get(m.receiver, 0.0) + out.seconds
            if out.ok:
                self.ledger.record(out.reply)
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
            self._check_quiet([h])
            t0 = time.perf_counter()
            try:
                res = self._map({h: (method, (msg, self.client_timeout))}, {h: 1})[h]
            finally:
                self.wait_seconds += time.perf_counter() - t0
            if isinstance(res, HostDead):
                self._mark_dead(self._hosts_for(self.alive).get(h, [name]), res.reason, name)
                out = self.dead[name]
            else:  # (a peer delivery returns nothing; what it sends is checked)
                out = _as_outcome(msg, res)
                out = self._vet(msg, out) if method == "activate" else _as_invalid(out)
        self.client_seconds[name] = self.client_seconds.get(name, 0.0) + out.seconds
        if not out.ok:
            self._fail({name: out}, msg)
        return out

    def _take_sent(self, out: StepOutcome) -> None:
        for m in out.sent:
            try:
                if m.sender != out.name:
                    raise InvalidReply(
                        out.name, m.kind, None,
                        f"client {out.name!r}, peer message {m.kind!r}: sent as {m.sender!r}",
                    )  # fmt: skip
                self.send_peer(m.sender, m.receiver, m.kind, m.payload, m.channel)
            except InvalidReply as exc:
                bad = StepOutcome(out.name, error=exc, kind="invalid_reply")
                self._fail({out.name: bad}, m)

    # -- what parties send is checked before use ---------------------------------------------
    def _vet(self, msg: Message, out: StepOutcome) -> StepOutcome:
        """``out`` if what the party returned for ``msg`` is well formed (see
        :attr:`reply_check`), else a failure of kind ``"invalid_reply"`` naming the party,
        the kind and the field (also when the party's step raised it: a peer message it
        sent on the serial backend, checked by :meth:`send_peer` inside the step)."""
        out = _as_invalid(out)
        if not out.ok:
            return out
        name = msg.receiver
        try:
            if msg.channel == "local":  # an activation: the step's return value
                if self.reply_check is not None:
                    self.reply_check(name, msg.kind, "local", out.reply)
                return out
            self._check_envelope(msg, out.reply)
            if self.reply_check is not None:
                self.reply_check(name, msg.kind, "server", out.reply.payload)
        except InvalidReply as exc:
            return _refused(out, exc)
        return out

    def _check_envelope(self, msg: Message, reply: Any) -> None:
        """Raise :class:`InvalidReply` unless ``reply`` is a message from ``msg``'s
        receiver to the server (of kind ``<kind>_reply`` when replies are checked)."""
        name = msg.receiver
        if not isinstance(reply, Message):
            raise InvalidReply(
                name, msg.kind, None,
                f"client {name!r}, reply to {msg.kind!r}: not a message "
                f"({type(reply).__name__})",
            )  # fmt: skip
        if reply.sender != name or reply.receiver != SERVER:
            raise InvalidReply(
                name, msg.kind, None,
                f"client {name!r}, reply to {msg.kind!r}: sent as {reply.sender!r} to "
                f"{reply.receiver!r}",
            )  # fmt: skip
        if self.reply_check is not None and reply.kind != msg.kind + "_reply":
            raise InvalidReply(
                name, msg.kind, None,
                f"client {name!r}, reply to {msg.kind!r}: of kind {reply.kind!r}",
            )  # fmt: skip

    def _vet_all(
        self, msgs: list[Message], outcomes: dict[str, StepOutcome]
    ) -> dict[str, StepOutcome]:
        """:meth:`_vet` of every message's outcome, the payloads of the replies to one kind
        checked together (:meth:`~fedmodel.runtime.schema.ReplyChecker.many`: the same
        verdicts and errors, stacked where the replies have one shape)."""
        many = getattr(self.reply_check, "many", None)
        if many is None:
            return {m.receiver: self._vet(m, outcomes[m.receiver]) for m in msgs}
        vetted: dict[str, StepOutcome] = {}  # (the outcomes that are not as they came)
        replies: dict[str, tuple[list[str], list[Any]]] = {}
        for m in msgs:
            name = m.receiver
            out = outcomes[name]
            reply = out.reply
            if (  # (the envelope of a well-formed reply: what _check_envelope accepts)
                out.kind == "ok"
                and m.channel != "local"
                and type(reply) is Message
                and reply.sender == name
                and reply.receiver == SERVER
                and reply.kind == m.kind + "_reply"
            ):
                names, payloads = replies.setdefault(m.kind, ([], []))
                names.append(name)
                payloads.append(reply.payload)
            else:  # (a failure, an activation or an odd envelope: checked on its own)
                vetted[name] = self._vet(m, out)
        for kind, (names, payloads) in replies.items():
            bad = many(names, kind, "server", payloads)
            for name in bad:
                vetted[name] = _refused(outcomes[name], bad[name])
        return {m.receiver: vetted.get(m.receiver) or outcomes[m.receiver] for m in msgs}


def _no_dims(party: str) -> dict[str, int]:
    """No dimensions for any party (:attr:`Runtime.declared_dims` before a declare)."""
    return {}


def _refused(out: StepOutcome, exc: InvalidReply) -> StepOutcome:
    """The failure of a step whose reply was refused."""
    return StepOutcome(
        out.name, error=exc, kind="invalid_reply", seconds=out.seconds, sent=out.sent
    )


def _as_outcome(msg: Message, value: Any) -> StepOutcome:
    """``value`` if it is the outcome of ``msg``'s step at its receiver, else a failure of
    kind ``"invalid_reply"`` naming that party: what a host answered for a step is
    checked like what the step returned (a worker, actor or Flower node answering
    something else, e.g. a string, fails its party; it never reaches the server's code)."""
    if isinstance(value, StepOutcome) and value.name == msg.receiver:
        return value
    what = (
        f"the outcome of party {value.name!r}"
        if isinstance(value, StepOutcome)
        else f"a {type(value).__name__}"
    )
    error = InvalidReply(
        msg.receiver, msg.kind, None,
        f"client {msg.receiver!r}, reply to {msg.kind!r}: its host answered {what}, not the "
        "outcome of the step",
    )  # fmt: skip
    return StepOutcome(msg.receiver, error=error, kind="invalid_reply")


def _as_invalid(out: StepOutcome) -> StepOutcome:
    """A step that raised :class:`InvalidReply` (a peer message it sent, checked inside
    the step on the serial backend) is an invalid reply, not a retryable error."""
    if out.kind == "raised" and isinstance(out.error, InvalidReply):
        return StepOutcome(out.name, error=out.error, kind="invalid_reply", seconds=out.seconds)
    return out


def raise_build_errors(runtime: Runtime, errors: Mapping[str, Any], order: list[str]) -> None:
    """Close ``runtime`` and re-raise the first endpoint construction error (client order)."""
    for name in order:
        err = errors.get(name)
        if err:
            runtime.close()
            exc, _tb = err
            raise exc
