"""A round whose requests differ only in rows of stacked arrays, and its replies.

Many clients of one model get requests of one kind that differ only in a few values: the
consensus point each exact-admm client is to step from is one row of the server's
``(clients, d)`` array. :meth:`Runtime.broadcast_rows
<fedmodel.runtime.base.Runtime.broadcast_rows>` takes such a round as its fields, each
either one value for every client or :class:`Rows` (client ``i``'s value is row ``i``),
and returns a :class:`RoundReplies`: the replies keyed by client, whose fields can also be
read stacked (:meth:`RoundReplies.stack`).

Every client still gets its own request, answers it with its own state and is recorded
in the ledger with a request row and a reply row, as after :meth:`~fedmodel.runtime.base.
Runtime.broadcast`. Where every party of the round runs in the server's process and their
class answers the round's kind in one stacked step (``handle_rows``), the round takes a
stacked path (:func:`exchange_rows`): the requests are checked once per table and opt-ins
(their field names and the values that can need an opt-in are the same for every client),
the step reads the rows as they are, the replies are checked as stacked arrays, and the
ledger's rows are written in one pass. Any other round, and a stacked round that cannot be
taken or whose replies are refused, takes the message-by-message path, with the same
iterates, verdicts and ledger.

Examples
--------
>>> import numpy as np
>>> fields = {"c": Rows(np.arange(6.0).reshape(3, 2)), "sigma": 1.0}
>>> payloads_of(fields, 3)[1]
{'c': array([2., 3.]), 'sigma': 1.0}
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from types import MappingProxyType
from typing import Any

import numpy as np

from fedmodel.runtime.messages import SERVER, Ledger, Message, RoundBlock, measure
from fedmodel.runtime.outcomes import StepOutcome
from fedmodel.runtime.placement import SERVER_HOST


class Rows:
    """A field whose value differs per client: client ``i``'s value is ``values[i]`` (the
    rows of an array, or the items of a list), in the order of the round's clients."""

    __slots__ = ("values",)

    def __init__(self, values: np.ndarray | Sequence[Any]):
        self.values = values

    def __len__(self) -> int:
        return len(self.values)


def check_rows(fields: Mapping[str, Any], m: int) -> None:
    """Raise ValueError naming the field when a :class:`Rows` field of ``fields`` has not
    one row for each of the ``m`` clients."""
    for name, value in fields.items():
        if isinstance(value, Rows) and len(value) != m:
            raise ValueError(f"field {name!r} has {len(value)} rows for {m} clients")


def payloads_of(fields: Mapping[str, Any], m: int) -> list[dict]:
    """The payloads of the ``m`` clients of ``fields`` (each :class:`Rows` field taken row
    by row, the others as they are), with the fields in their given order."""
    check_rows(fields, m)
    return [payload_at(fields, i) for i in range(m)]


def payload_at(fields: Mapping[str, Any], i: int) -> dict[str, Any]:
    """Client ``i``'s payload of ``fields``: row ``i`` of each :class:`Rows` field, the
    others as they are, in their given order."""
    return {k: (v.values[i] if isinstance(v, Rows) else v) for k, v in fields.items()}


def rows_subset(fields: Mapping[str, Any], idx: Sequence[int]) -> dict[str, Any]:
    """``fields`` for the round's clients ``idx`` only (in that order)."""
    out: dict[str, Any] = {}
    for k, v in fields.items():
        if not isinstance(v, Rows):
            out[k] = v
        elif isinstance(v.values, np.ndarray):
            out[k] = Rows(v.values[np.asarray(idx)])
        else:
            out[k] = Rows([v.values[i] for i in idx])
    return out


class RoundReplies(Mapping):
    """The replies of a round, keyed by client in the round's order: a mapping of client
    name -> reply :class:`~fedmodel.runtime.messages.Message`, whose fields can also be
    read as one stacked array (:meth:`stack`).

    Built from the replies of the message-by-message path (``messages``) or from the
    stacked fields of a stacked step (``stacked``: field -> array with a row per client),
    whose messages are made when they are first read (and kept: a reader of the round sees
    one message per client, as on the message path), a scalar field's value as a Python
    scalar, as a handler answers it.
    """

    def __init__(
        self,
        names: list[str],
        messages: Mapping[str, Message] | None = None,
        stacked: Mapping[str, np.ndarray] | None = None,
        kind: str = "",
        round: int = 0,
        channel: str = "algorithm",
    ):
        self.names = list(names)
        self._messages = dict(messages) if messages is not None else None
        self._stacked = dict(stacked) if stacked is not None else None
        self._index: dict[str, int] | None = None  # (made at the first reply read by name)
        self._made: dict[str, Message] = {}  # (the stacked replies' messages made so far)
        self.kind, self.round, self.channel = kind, round, channel

    def __getitem__(self, name: str) -> Message:
        if self._messages is not None:
            return self._messages[name]
        made = self._made.get(name)
        if made is None:
            if self._index is None:
                self._index = {n: i for i, n in enumerate(self.names)}
            i = self._index[name]
            payload = {k: (v[i].item() if v.ndim == 1 else v[i]) for k, v in self._stacked.items()}
            made = self._made[name] = Message(
                self.kind, name, SERVER, payload, self.round, self.channel
            )
        return made

    def values(self):
        self._make_all()
        return super().values()

    def items(self):
        self._make_all()
        return super().items()

    def _make_all(self) -> None:
        """Make every reply's message not made yet, in one pass (the rows of each field
        split in one call): what reading every reply costs."""
        if self._messages is not None:
            return
        made = self._made
        if len(made) == len(self.names):
            return
        columns = [(k, v.tolist() if v.ndim == 1 else list(v)) for k, v in self._stacked.items()]
        for i, n in enumerate(self.names):
            if n not in made:
                payload = {k: column[i] for k, column in columns}
                made[n] = Message(self.kind, n, SERVER, payload, self.round, self.channel)

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)

    @property
    def stacked(self) -> Mapping[str, np.ndarray] | None:
        """The replies' fields as the stacked step answered them (field -> array with a
        row per client, read-only view), or None when the round went message by message."""
        return None if self._stacked is None else MappingProxyType(self._stacked)

    def stack(self, field: str) -> np.ndarray:
        """Field ``field`` of every reply as one float array, a row per client in the
        round's order (what ``np.array([r.payload[field] for r in replies.values()],
        dtype=float)`` gives)."""
        if self._stacked is not None:
            return np.array(self._stacked[field], dtype=float)
        return np.array([self._messages[n].payload[field] for n in self.names], dtype=float)


def exchange_rows(runtime, kind: str, names: list[str], fields: Mapping[str, Any], channel: str):
    """The stacked path of :meth:`~fedmodel.runtime.base.Runtime.broadcast_rows`: the
    :class:`RoundReplies` of the round, or None when it cannot take it (the caller then
    sends the round message by message; nothing has run).

    The round takes it when every client runs in the server's process without a
    ``client_timeout``, no client is dead, and the clients' class answers ``kind`` in one
    stacked step (its ``handle_rows`` returns None when they cannot). A stacked step that
    raises changes no party's state and the round goes message by message. Replies that
    the stacked check refuses are checked one by one, the run failing as it would have
    (the step is not run again).
    """
    host = runtime._local
    if host is None or runtime.client_timeout or not names:
        return None
    dead = runtime.dead
    if dead and not dead.keys().isdisjoint(names):
        return None
    if not _in_server_process(runtime._host_of, names):
        return None
    if not all(_uniform(v) for v in fields.values()):
        return None
    rnd = runtime.round
    done = host.run_rows(kind, names, fields, rnd)
    if done is None:
        return None
    replies, seconds = done
    reply_kind = kind + "_reply"
    check = getattr(runtime.reply_check, "rows", None)
    if runtime.reply_check is not None and (check is None or not check(names, kind, replies)):
        # (refused, or not decidable stacked: each reply on its own, as the per-message
        # path checks it; the step is not run again)
        requests = payloads_of(fields, len(names))
        msgs = [Message(kind, SERVER, n, p, rnd, channel) for n, p in zip(names, requests)]
        first = {
            n: StepOutcome(
                n,
                reply=Message(reply_kind, n, SERVER, {k: v[i] for k, v in replies.items()},
                              rnd, channel),
                seconds=seconds,
            )
            for i, n in enumerate(names)
        }  # fmt: skip
        return RoundReplies(names, messages=runtime._exchange(msgs, first))
    first_request = payload_at(fields, 0)
    first_reply = {k: v[0] for k, v in replies.items()}
    record_round(
        runtime.ledger,
        names,
        (rnd, kind, reply_kind, channel),
        measure(first_request),
        measure(first_reply),
    )
    runtime.add_seconds(names, seconds)
    return RoundReplies(names, stacked=replies, kind=reply_kind, round=rnd, channel=channel)


def _in_server_process(placement: Mapping[str, Any], names: list[str]) -> bool:
    """Whether every party of ``names`` runs in the server's process (``placement``: party
    -> host; one that answers ``all_in_server`` tells it at once)."""
    told = getattr(placement, "all_in_server", None)
    if told is not None:
        return told(names)
    return set(map(placement.get, names)) == {SERVER_HOST}


def _uniform(value: Any) -> bool:
    """Whether every client's value of a field has the size and shape of the first's (one
    value for all; the rows of an array; a list of floats, or of ints, alone), so that one
    measure of the first request is every request's."""
    if not isinstance(value, Rows):
        return True
    v = value.values
    if isinstance(v, np.ndarray):
        return v.ndim >= 1
    kinds = set(map(type, v))
    return kinds <= {float} or kinds <= {int}


def record_round(
    ledger: Ledger,
    names: list[str],
    what: tuple[int, str, str, str],
    request: tuple[dict, int],
    reply: tuple[dict, int],
) -> None:
    """A request row and a reply row per client of ``names``, in client order, as
    :meth:`~fedmodel.runtime.messages.Ledger.record` writes them one message at a time
    (``what``: the round, the request's and the reply's kinds, the channel; ``request``,
    ``reply``: their :func:`~fedmodel.runtime.messages.measure`, the same for every
    client): one :class:`~fedmodel.runtime.messages.RoundBlock` in a row ledger."""
    if type(ledger) is Ledger:
        ledger.rows.add_block(RoundBlock(names, what, request, reply))
        return
    rnd, kind, reply_kind, channel = what
    for n in names:
        ledger.record(Message(kind, SERVER, n, {}, rnd, channel), request)
        ledger.record(Message(reply_kind, n, SERVER, {}, rnd, channel), reply)
