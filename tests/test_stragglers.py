"""prox-al's stragglers (option ``quorum``): on the processes backend a round of the
exact-admm inner solver proceeds without a slow client, whose late reply is applied when it
arrives, and the run is still certified optimal at the pooled optimum; on the serial backend
(no reply is ever late) the run is the one without ``quorum`` bit for bit; bad values are
refused naming the option."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

from fedmodel.algorithms.proxal.options import ProxALOptions
from fedmodel.algorithms.proxal.server import run_prox_al
from fedmodel.errors import ModelError
from fedmodel.runtime.faults import Fault

sys.path.insert(0, os.path.dirname(__file__))
from test_participation import N_CLIENTS, box_model  # noqa: E402


@pytest.fixture(scope="module")
def case():
    return box_model()


@pytest.mark.parametrize("participation", [None, 0.3])
def test_serial_quorum_is_the_synchronous_run(case, participation):
    """Every reply is in at once on the serial backend: the iterates, rounds and ledger
    are those of the run without ``quorum``."""
    model = case[0]
    opts = {"participation": participation, "random_state": 4}
    ref = model.solve("prox-al", **opts)
    res = model.solve("prox-al", quorum=0.5, **opts)
    assert res.status == ref.status == "optimal"
    np.testing.assert_array_equal(res.solution["w"], ref.solution["w"])
    assert res.rounds == ref.rounds and res.ledger == ref.ledger
    info = res.extra["quorum"]
    assert info["replies_per_round"] == (5 if participation is None else 2)
    assert info["late_replies"] == info["max_staleness"] == info["delay_waits"] == 0
    assert "quorum" not in ref.extra


@pytest.mark.timing
def test_straggler_on_processes_reaches_the_pooled_optimum(case):
    """c0 sleeps 0.1 s in each of its exact-admm steps; the clients that share its worker
    queue behind it, the other worker's five make the quorum. Rounds go on without them,
    their replies are applied late (at most ``max_delay`` rounds), and the run is optimal
    at the pooled optimum within what the certificate at eps = 1e-3 guarantees."""
    model, pooled, v = case
    opts = ProxALOptions(quorum=5, max_delay=2, backend="processes", workers=2)
    slow = Fault("sleep", round=1, times=None, seconds=0.1, kinds=("xadmm_w",))
    res = run_prox_al(model.compile(), opts, "prox-al", faults={"c0": slow})
    assert res.status == "optimal", res.message
    info = res.extra["quorum"]
    assert info["replies_per_round"] == 5 and info["max_delay"] == 2
    assert info["late_replies"] >= 1 and 1 <= info["max_staleness"] <= 2
    gap = abs(res.objective - pooled.value) / max(1.0, abs(pooled.value))
    assert gap <= 1e-3
    np.testing.assert_allclose(res.solution["w"], v.value, atol=1e-2)
    # a late message's rows are recorded when its reply arrives: after the rows of a
    # later round, carrying the round it was posted in
    late = latest = 0
    for r in res.ledger:
        if r["kind"] in ("xadmm_w", "xadmm_w_reply"):
            late += r["round"] < latest
            latest = max(latest, r["round"])
    assert 1 <= late <= 2 * info["late_replies"]  # (an arrival before the new round's: unseen)
    # every client answers the certificate's evaluation rounds
    evaluated = {r["receiver"] for r in res.ledger if r["kind"] == "evaluate"}
    assert len(evaluated) == N_CLIENTS


@pytest.mark.parametrize(
    "options, words",
    [
        ({"quorum": 0.0}, "quorum=0.0: a share of the clients must lie in (0, 1]"),
        ({"quorum": 11}, "quorum=11 clients per round: a round has 10 clients"),
        ({"quorum": 4, "participation": 3}, "a round has 3 clients"),
        ({"quorum": "most"}, "quorum must be a share"),
        ({"quorum": 0.5, "max_delay": 0}, "max_delay must be an integer >= 1"),
        ({"quorum": 0.5, "max_delay": 1.5}, "max_delay must be an integer >= 1"),
        ({"max_delay": 2}, "max_delay=2 bounds how late a reply may be under quorum"),
    ],
)
def test_bad_quorum_refused(case, options, words):
    with pytest.raises(ModelError) as info:
        case[0].solve("prox-al", **options)
    assert words in str(info.value)


def test_routes_without_stragglers_refused(case):
    model = case[0]
    with pytest.raises(ModelError, match="quorum=0.5 is taken by inner_solver='exact-admm'"):
        model.solve("prox-al", quorum=0.5, inner_solver="admm")
    with pytest.raises(ModelError, match="quorum"):
        model.solve("admm", quorum=0.5)
    with pytest.raises(ModelError, match="quorum=0.5: cprox-al"):
        model.solve("cprox-al", quorum=0.5)


class _Step:
    """A posted step whose reply is in once ``done`` (the part of a Ticket gather reads)."""

    def __init__(self, done: bool):
        self.done = done


class _Waiting:
    """poll's contract: the done steps of ``tickets``, waiting (here: finishing steps in
    order) until ``min_count`` of them are done."""

    def __init__(self):
        self.waited: list[int] = []

    def poll(self, tickets, min_count=1):
        short = max(0, min(min_count, len(tickets)) - sum(t.done for t in tickets))
        self.waited.append(short)
        for t in [t for t in tickets if not t.done][:short]:
            t.done = True
        return {t: f"reply of {id(t)}" for t in tickets if t.done}


def test_gather_waits_for_the_quorum_and_the_delay_bound():
    """Round 5, max_delay 2: the step posted in round 3 is waited for although the quorum
    (2) is met by the replies in; the others that arrived are taken too; the one of round 5
    still out stays out."""
    from fedmodel.algorithms.proxal.exact_admm import ExactADMM

    admm = ExactADMM(1.0, 0, None, 10, quorum=2, max_delay=2)
    out = {
        "a": (_Step(False), 3, None, None, 1.0),  # overdue
        "b": (_Step(True), 4, None, None, 1.0),
        "c": (_Step(True), 5, None, None, 1.0),
        "d": (_Step(False), 5, None, None, 1.0),
    }
    runtime = _Waiting()
    got = admm.gather(runtime, out, 5, admm.quorum)
    assert sorted(got) == ["a", "b", "c"] and list(out) == ["d"]
    assert [v[1] for v in got.values()] == [3, 4, 5]
    assert runtime.waited == [1, 0] and admm.late[2] == 1
    # fewer steps out than the quorum: every one of them
    out = {"d": out["d"]}
    got = ExactADMM(1.0, 0, None, 10, quorum=3, max_delay=2).gather(runtime, out, 6, 3)
    assert list(got) == ["d"] and out == {}
