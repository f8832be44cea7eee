"""Helpers shared by dald-cc, dald-dc and the baselines: a counting ledger for long runs,
communication totals that include peer-to-peer traffic, and the evaluation of the pooled
KKT certificate from the parties' reports."""

from __future__ import annotations

from typing import Any

import numpy as np

from fedmodel.certificate.kkt import assemble, party_evaluation
from fedmodel.compiler.partition import CompiledModel, PartyProgram
from fedmodel.runtime.blas import blas_threads  # noqa: F401 (used by the dald modules)
from fedmodel.runtime.messages import SERVER, Ledger, Message


class CountingLedger(Ledger):
    """A ledger that keeps message and float counts per (channel, sender, receiver) instead
    of one row per message (``keep_ledger=False``; long runs)."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: dict[tuple[str, str, str], list[int]] = {}

    def record(self, msg: Message) -> None:
        c = self.counts.setdefault((msg.channel, msg.sender, msg.receiver), [0, 0])
        c[0] += 1
        c[1] += msg.floats


def _items(ledger: Ledger):
    if isinstance(ledger, CountingLedger):
        for (ch, s, r), (cnt, fl) in ledger.counts.items():
            yield ch, s, r, cnt, fl
    else:
        for row in ledger.rows:
            yield row["channel"], row["sender"], row["receiver"], 1, row["floats"]


def communication_totals(ledger: Ledger) -> dict[str, Any]:
    """Messages and floats: up (to the server), down (from the server), peer to peer, in all
    and per party (sent and received), for the algorithm channel; the same for the
    ``diagnostic`` channel under ``"diagnostic"``. Local turns (channel ``"local"``) carry
    nothing over the network and are only counted as ``local_steps``."""

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
        for ch, s, r, cnt, fl in _items(ledger):
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
    result["local_steps"] = sum(cnt for ch, s, r, cnt, _ in _items(ledger) if ch == "local")
    return result


def penalty_multipliers(program: PartyProgram, x: np.ndarray, penalty: float | None):
    """Multipliers implied by the quadratic penalty: ``beta [c(x)]_+`` and ``beta a(x)``."""
    if not program.constraints:
        return np.zeros(program.m_ineq), np.zeros(program.m_eq)
    ci, ce = program.functions.constraint_values(x)
    beta = float(penalty or 0.0)
    return beta * np.maximum(ci, 0.0), beta * ce


def evaluation_payload(program: PartyProgram, x: np.ndarray, penalty: float | None) -> dict:
    """A party's diagnostic report at ``x`` (its own data only), with the multipliers of the
    quadratic penalty (empty when the party has no constraints)."""
    mu, nu = penalty_multipliers(program, x, penalty)
    out = party_evaluation(program, x, mu, nu)
    out["mu_c"], out["nu_c"] = mu, nu
    return out


def pooled_certificate(compiled: CompiledModel, reports: dict[str, dict], x: np.ndarray):
    """KKT residuals of the original (pooled) model at ``x`` from the parties' reports."""
    return assemble(reports, compiled.regularizer, x, compiled.nonconvex)
