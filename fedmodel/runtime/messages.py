"""Messages exchanged between parties, and the ledger that records every one of them."""

from __future__ import annotations

import collections
import itertools
import operator
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

SERVER = "server"


@dataclass(frozen=True)
class Message:
    """One message between two parties.

    Attributes
    ----------
    kind : str
        What the message means (``"admm_w"``, ``"admm_reply"``, ...). Each algorithm
        documents its kinds.
    sender, receiver : str
        Party names (``"server"`` for the server).
    payload : dict
        Named numpy arrays or floats. Only this crosses the network.
    round : int
        Communication round in which the message is sent.
    channel : str
        ``"algorithm"`` for the method's own traffic, ``"diagnostic"`` for monitoring
        (history, certificates), which a deployment may switch off.
    """

    kind: str
    sender: str
    receiver: str
    payload: dict[str, Any]
    round: int = 0
    channel: str = "algorithm"

    @property
    def floats(self) -> int:
        """Number of floating-point numbers in the payload."""
        return measure(self.payload)[1]

    @property
    def nbytes(self) -> int:
        return 8 * self.floats

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return measure(self.payload)[0]


def _size(v: Any) -> int:
    if isinstance(v, np.ndarray):
        return v.size
    if isinstance(v, str):  # (a keyword such as inner="newton": not a float)
        return 0
    if isinstance(v, (float, int)):
        return 1
    return int(np.size(v))


def _shape(v: Any) -> tuple[int, ...]:
    if isinstance(v, np.ndarray):
        return v.shape
    if isinstance(v, (float, int)):
        return ()
    return tuple(np.shape(v))


def measure(payload: dict[str, Any]) -> tuple[dict[str, tuple[int, ...]], int]:
    """The shape of every field of ``payload`` and the number of floats it carries (a
    None field none), in one pass: what :meth:`Message.shapes`, :attr:`Message.floats`
    and the ledger's rows read."""
    shapes, floats = {}, 0
    for k, v in payload.items():
        if type(v) is np.ndarray:
            shapes[k] = v.shape
            floats += v.size
        elif type(v) is float or type(v) is int:
            shapes[k] = ()
            floats += 1
        else:
            shapes[k] = _shape(v)
            if v is not None:
                floats += _size(v)
    return shapes, floats


#: a ledger row's fields, in the order :class:`LedgerRows` keeps them (``bytes`` is
#: ``8 * floats``)
ROW_FIELDS = ("round", "sender", "receiver", "kind", "channel", "shapes", "floats")


def _row(t: tuple) -> dict[str, Any]:
    row = dict(zip(ROW_FIELDS, t))
    row["bytes"] = 8 * t[6]
    return row


class RoundBlock:
    """The ledger rows of one stacked round: a request row and a reply row per client of
    ``names``, in client order, as :meth:`Ledger.record` writes them one message at a time
    (``what``: the round, the request's and the reply's kinds, the channel; ``request``,
    ``reply``: their :func:`measure`, the same for every client), kept as those facts and
    read as those rows (:meth:`tuples`)."""

    __slots__ = ("names", "what", "request", "reply")

    def __init__(
        self,
        names: Sequence[str],
        what: tuple[int, str, str, str],
        request: tuple[dict, int],
        reply: tuple[dict, int],
    ):
        self.names = list(names)
        self.what, self.request, self.reply = what, request, reply

    def __len__(self) -> int:
        return 2 * len(self.names)

    def tuples(self) -> Iterator[tuple]:
        """Its rows as :class:`LedgerRows` keeps them, in order."""
        rnd, kind, reply_kind, channel = self.what
        (qs, qf), (ps, pf) = self.request, self.reply
        for n in self.names:
            yield (rnd, SERVER, n, kind, channel, qs, qf)
            yield (rnd, n, SERVER, reply_kind, channel, ps, pf)


class LedgerRows(Sequence):
    """A ledger's rows: each read as a dict (``round``, ``sender``, ``receiver``,
    ``kind``, ``channel``, ``shapes``, ``floats``, ``bytes``), kept as a tuple (a long
    run records a row per message: 10,000 clients, a million rows), the rows of a stacked
    round as one :class:`RoundBlock` until they are read by position. A sequence like a
    list of those dicts: ``len``, indexing, slices (lists), iteration, ``==`` with a
    list, ``+`` (a list).

    Examples
    --------
    >>> rows = LedgerRows()
    >>> rows.append({"round": 1, "sender": "server", "receiver": "a", "kind": "ping",
    ...              "channel": "algorithm", "shapes": {"w": (3,)}, "floats": 3})
    >>> rows.add_block(RoundBlock(["a", "b"], (2, "ping", "ping_reply", "algorithm"),
    ...                           ({"w": (3,)}, 3), ({}, 0)))
    >>> len(rows), rows[0]["bytes"], rows == [rows[0], *rows[1:]], rows[4]["sender"]
    (5, 24, True, 'b')
    """

    __slots__ = ("_parts", "_tail", "_closed")

    def __init__(self, rows: Iterable[dict[str, Any]] = ()):
        # (lists of row tuples and blocks, in order; the last is the list rows go to, and
        # ``_closed`` counts the rows before it)
        self._tail: list[tuple] = [tuple(r[k] for k in ROW_FIELDS) for r in rows]
        self._parts: list[Any] = [self._tail]
        self._closed = 0

    @property
    def tuples(self) -> list[tuple]:
        """Every row as a tuple, in order, in one list (the blocks written out)."""
        if len(self._parts) > 1:
            self._tail = list(self.iter_tuples())
            self._parts, self._closed = [self._tail], 0
        return self._tail

    def iter_tuples(self) -> Iterator[tuple]:
        """Every row as a tuple, in order (the blocks read, not written out)."""
        parts = self._parts
        if len(parts) == 1:
            return iter(parts[0])
        return itertools.chain.from_iterable(
            part if type(part) is list else part.tuples() for part in parts
        )

    def parts(self) -> list[Any]:
        """Its rows as kept, in order: lists of row tuples and :class:`RoundBlock` s."""
        return self._parts

    def add(self, row: tuple) -> None:
        """One row, as the tuple it is kept as (:data:`ROW_FIELDS`' order)."""
        self._tail.append(row)

    def add_block(self, block: RoundBlock) -> None:
        """A stacked round's rows, kept as its block."""
        parts = self._parts
        if self._tail:
            self._closed += len(self._tail)
        else:
            parts.pop()
        parts.append(block)
        self._closed += len(block)
        self._tail = []
        parts.append(self._tail)

    def append(self, row: dict[str, Any]) -> None:
        self._tail.append(tuple(row[k] for k in ROW_FIELDS))

    def __len__(self) -> int:
        return self._closed + len(self._tail)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [_row(t) for t in self.tuples[i]]
        return _row(self.tuples[i])

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return map(_row, self.iter_tuples())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, LedgerRows):
            return len(self) == len(other) and all(
                a == b for a, b in zip(self.iter_tuples(), other.iter_tuples())
            )
        if isinstance(other, (list, tuple)):
            return len(other) == len(self) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __add__(self, other: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
        return list(self) + list(other)

    def __radd__(self, other: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
        return list(other) + list(self)

    def __repr__(self) -> str:
        return f"LedgerRows({len(self)} rows)"


class Ledger:
    """Record of every message: round, sender, receiver, kind, shapes, floats
    (:class:`LedgerRows`)."""

    def __init__(self, rows: Iterable[dict[str, Any]] = ()):
        self._rows = LedgerRows(rows)

    @property
    def rows(self) -> LedgerRows:
        return self._rows

    @rows.setter
    def rows(self, rows: Iterable[dict[str, Any]]) -> None:
        self._rows = rows if isinstance(rows, LedgerRows) else LedgerRows(rows)

    def record(self, msg: Message, known: tuple[dict, int] | None = None) -> None:
        """One row for ``msg``; ``known``: its payload's :func:`measure` when the caller
        has it (one payload sent to many clients is measured once, and its rows share the
        shapes: rows are records, read and never changed)."""
        shapes, floats = measure(msg.payload) if known is None else known
        self._rows.add((msg.round, msg.sender, msg.receiver, msg.kind, msg.channel, shapes, floats))

    def totals(self, channel: str | None = "algorithm") -> dict[str, Any]:
        """Messages and floats sent up (client to server) and down, in all and per party."""
        rows = [r for r in self.rows if channel is None or r["channel"] == channel]
        per_party: dict[str, dict[str, int]] = {}
        up = [r for r in rows if r["receiver"] == SERVER]
        down = [r for r in rows if r["sender"] == SERVER]
        for r in rows:
            client = r["sender"] if r["receiver"] == SERVER else r["receiver"]
            d = per_party.setdefault(
                client, {"messages_up": 0, "floats_up": 0, "messages_down": 0, "floats_down": 0}
            )
            key = "up" if r["receiver"] == SERVER else "down"
            d[f"messages_{key}"] += 1
            d[f"floats_{key}"] += r["floats"]
        return {
            "messages_up": len(up),
            "floats_up": int(sum(r["floats"] for r in up)),
            "messages_down": len(down),
            "floats_down": int(sum(r["floats"] for r in down)),
            "per_party": per_party,
        }


class CountingLedger(Ledger):
    """A ledger that keeps message and float counts per (channel, sender, receiver) instead
    of one row per message (``keep_ledger=False``; long runs)."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: dict[tuple[str, str, str], list[int]] = {}

    def record(self, msg: Message, known: tuple[dict, int] | None = None) -> None:
        c = self.counts.setdefault((msg.channel, msg.sender, msg.receiver), [0, 0])
        c[0] += 1
        c[1] += msg.floats if known is None else known[1]


def communication_totals(ledger: Ledger) -> dict[str, Any]:
    """Messages and floats: up (to the server), down (from the server), peer to peer, in all
    and per party (sent and received), for the algorithm channel; the same for the
    ``diagnostic`` channel under ``"diagnostic"``. Local turns (channel ``"local"``) carry
    nothing over the network and are only counted as ``local_steps``.

    One pass over what the ledger keeps: a :class:`CountingLedger`'s counts, a row
    ledger's rows, and a :class:`RoundBlock` as its count and sizes (the blocks of one
    channel and clients are summed, and their clients' counts each take those sums once);
    each party appears in ``per_party`` in the order of its first row."""
    # (per channel: [messages, floats] up, down, peer, and each party's
    # [messages sent, floats sent, messages received, floats received])
    channels: dict[str, tuple[dict[str, list[int]], dict[str, list[int]]]] = {
        ch: ({"up": [0, 0], "down": [0, 0], "peer": [0, 0]}, {}) for ch in _TOTALLED
    }
    local_steps = 0

    def add(ch: str, s: str, r: str, cnt: int, fl: int) -> None:
        found = channels.get(ch)
        if found is None:
            return
        sums, per = found
        total = sums["up" if r == SERVER else ("down" if s == SERVER else "peer")]
        total[0] += cnt
        total[1] += fl
        sent = per.get(s)
        if sent is None:
            sent = per[s] = [0, 0, 0, 0]
        sent[0] += cnt
        sent[1] += fl
        received = per.get(r)
        if received is None:
            received = per[r] = [0, 0, 0, 0]
        received[2] += cnt
        received[3] += fl

    # ((channel, clients) -> [blocks, request floats, reply floats])
    blocks: dict[tuple[str, tuple[str, ...]], list[int]] = {}
    if isinstance(ledger, CountingLedger):
        for (ch, s, r), (cnt, fl) in ledger.counts.items():
            if ch == "local":
                local_steps += cnt
            add(ch, s, r, cnt, fl)
    else:
        for part in ledger.rows.parts():
            if type(part) is list:
                for _round, s, r, _kind, ch, _shapes, fl in part:
                    if ch == "local":
                        local_steps += 1
                    add(ch, s, r, 1, fl)
                continue
            ch = part.what[3]
            key = (ch, tuple(part.names))
            b = blocks.get(key)
            if b is None:
                b = blocks[key] = [0, 0, 0]
                found = channels.get(ch)
                if found is not None:  # (its parties where their first rows put them)
                    per = found[1]
                    per.setdefault(SERVER, None)
                    setting = map(per.setdefault, part.names, itertools.repeat(None))
                    collections.deque(setting, maxlen=0)  # (in C: no call per party)
            b[0] += 1
            b[1] += part.request[1]
            b[2] += part.reply[1]
    for (ch, names), (n_blocks, q_floats, p_floats) in blocks.items():
        n = len(names)
        if ch == "local":
            local_steps += 2 * n * n_blocks
        found = channels.get(ch)
        if found is None:
            continue
        sums, per = found
        for kind, fl in (("down", q_floats), ("up", p_floats)):
            sums[kind][0] += n * n_blocks
            sums[kind][1] += n * fl
        server = _counts(per, SERVER)
        server[0] += n * n_blocks
        server[1] += n * q_floats
        server[2] += n * n_blocks
        server[3] += n * p_floats
        if all(map(operator.is_, map(per.__getitem__, names), itertools.repeat(None))):
            # (none counted yet, None: each one's counts are the blocks', one tuple for all)
            counted = (n_blocks, p_floats, n_blocks, q_floats)
            per.update(zip(names, itertools.repeat(counted)))
            continue
        for name in names:
            counts = _counts(per, name)
            counts[0] += n_blocks
            counts[1] += p_floats
            counts[2] += n_blocks
            counts[3] += q_floats

    def totals(channel: str) -> dict[str, Any]:
        sums, per = channels[channel]
        out = {
            "messages": sum(m for m, _ in sums.values()),
            "floats": sum(f for _, f in sums.values()),
        }
        for kind, (m, f) in sums.items():
            out[f"messages_{kind}"] = m
            out[f"floats_{kind}"] = f
        # (a party's dict of its own; parties of one counts object copy one dict)
        per_party: dict[str, dict[str, int]] = {}
        last, made = None, None
        for p, v in per.items():
            if v is not last:
                last, made = v, dict(zip(_PARTY_FIELDS, v or (0, 0, 0, 0)))
            per_party[p] = made.copy()
        out["per_party"] = per_party
        return out

    result = totals("algorithm")
    result["diagnostic"] = totals("diagnostic")
    result["local_steps"] = local_steps
    return result


def _counts(per: dict[str, Any], name: str) -> list[int]:
    """The counts of ``name`` in ``per`` (:func:`communication_totals`) as a list of its
    own, to add to: none counted yet (None) or counts shared with other parties (a tuple)
    become one."""
    counts = per[name]
    if type(counts) is not list:
        counts = per[name] = list(counts or (0, 0, 0, 0))
    return counts


#: the channels :func:`communication_totals` adds up, and a party's fields there
_TOTALLED = ("algorithm", "diagnostic")
_PARTY_FIELDS = ("messages_sent", "floats_sent", "messages_received", "floats_received")
