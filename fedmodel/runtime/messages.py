"""Messages exchanged between parties, and the ledger that records every one of them."""

from __future__ import annotations

from dataclasses import dataclass, field
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


@dataclass
class Ledger:
    """Record of every message: round, sender, receiver, kind, shapes, floats."""

    rows: list[dict[str, Any]] = field(default_factory=list)

    def record(self, msg: Message, known: tuple[dict, int] | None = None) -> None:
        """One row for ``msg``; ``known``: its payload's :func:`measure` when the caller
        has it (one payload sent to many clients is measured once, and its rows share the
        shapes: rows are records, read and never changed)."""
        shapes, floats = measure(msg.payload) if known is None else known
        self.rows.append(
            {
                "round": msg.round,
                "sender": msg.sender,
                "receiver": msg.receiver,
                "kind": msg.kind,
                "channel": msg.channel,
                "shapes": shapes,
                "floats": floats,
                "bytes": 8 * floats,
            }
        )

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


def _counts(ledger: Ledger) -> dict[tuple[str, str, str], list[int]]:
    """Messages and floats per (channel, sender, receiver), in the order each first
    appears (a :class:`CountingLedger` keeps them; a row ledger is counted in one pass)."""
    if isinstance(ledger, CountingLedger):
        return ledger.counts
    counts: dict[tuple[str, str, str], list[int]] = {}
    for row in ledger.rows:
        key = (row["channel"], row["sender"], row["receiver"])
        c = counts.get(key)
        if c is None:
            counts[key] = [1, row["floats"]]
        else:
            c[0] += 1
            c[1] += row["floats"]
    return counts


def communication_totals(ledger: Ledger) -> dict[str, Any]:
    """Messages and floats: up (to the server), down (from the server), peer to peer, in all
    and per party (sent and received), for the algorithm channel; the same for the
    ``diagnostic`` channel under ``"diagnostic"``. Local turns (channel ``"local"``) carry
    nothing over the network and are only counted as ``local_steps``."""

    counts = _counts(ledger)

    def totals(channel: str) -> dict[str, Any]:
        out = {
            "messages": 0,
            "floats": 0,
            "messages_up": 0,
            "floats_up": 0,
            "messages_down": 0,
            "floats_down": 0,
            "messages_peer": 0,
            "floats_peer": 0,
            "per_party": {},
        }
        for (ch, s, r), (cnt, fl) in counts.items():
            if ch != channel or (s == r and ch == "local"):
                continue
            out["messages"] += cnt
            out["floats"] += fl
            kind = "up" if r == SERVER else ("down" if s == SERVER else "peer")
            out[f"messages_{kind}"] += cnt
            out[f"floats_{kind}"] += fl
            for party, role in ((s, "sent"), (r, "received")):
                d = out["per_party"].setdefault(
                    party,
                    {
                        "messages_sent": 0,
                        "floats_sent": 0,
                        "messages_received": 0,
                        "floats_received": 0,
                    },
                )
                d[f"messages_{role}"] += cnt
                d[f"floats_{role}"] += fl
        return out

    result = totals("algorithm")
    result["diagnostic"] = totals("diagnostic")
    result["local_steps"] = sum(cnt for (ch, _, _), (cnt, _) in counts.items() if ch == "local")
    return result
