"""Real asynchrony: the runtime's non-blocking exchange (``post``/``poll``) and fair-vfl with
``asynchronous=True``: on worker processes a slow party computes while the server runs
rounds with the others' replies (its block used stale), and the run still converges to the
reference's KKT point; on the serial runtime it is deterministic (the synchronous rounds)."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest
from test_vfl import small_problem

from fedmodel.algorithms.vfl.reference import solve_constrained
from fedmodel.algorithms.vfl.run import solve_vertical
from fedmodel.errors import ModelError
from fedmodel.runtime.endpoints import EndpointFactory
from fedmodel.runtime.faults import Fault, inject_faults
from fedmodel.runtime.messages import SERVER, Message
from fedmodel.runtime.outcomes import ClientFailure
from fedmodel.runtime.processes import ProcessRuntime
from fedmodel.runtime.serial import SerialRuntime


class Sleeper:
    """An endpoint that sleeps ``payload["sleep"]`` seconds, or holds until the file
    ``payload["gate"]`` exists (the test opens it: a deterministic straggler, at most
    ``GATE_SECONDS``), and echoes ``x`` (test only)."""

    def __init__(self, name: str):
        self.name = name
        self.count = 0

    def get_state(self):
        return {"count": self.count}

    def set_state(self, state):
        self.count = state["count"]

    def handle(self, msg: Message) -> Message:
        gate = msg.payload.get("gate")
        if gate is not None:
            end = time.monotonic() + GATE_SECONDS
            while not os.path.exists(gate) and time.monotonic() < end:
                time.sleep(0.01)
        end = time.monotonic() + float(msg.payload.get("sleep", 0.0))
        while time.monotonic() < end:
            try:
                time.sleep(max(0.0, end - time.monotonic()))
            except BaseException:  # noqa: BLE001 - a stuck step ignores its timeout alarm
                if not msg.payload.get("stuck"):
                    raise
        self.count += 1
        return Message("echo", self.name, SERVER, {"x": msg.payload["x"]}, msg.round)


#: the longest a gated step holds (a test that never opens its gate still ends)
GATE_SECONDS = 120.0


def arrived(rt, ticket, within=120.0):
    """Poll ``ticket`` without waiting (``min_count=0``) until its reply is there (at most
    ``within`` s); what the last poll returned."""
    end = time.monotonic() + within
    got = rt.poll([ticket], min_count=0)
    while not got and time.monotonic() < end:
        time.sleep(0.01)
        got = rt.poll([ticket], min_count=0)
    return got


def factories(names, faults=None):
    return inject_faults({n: EndpointFactory(Sleeper, (n,)) for n in names}, faults)


# -- the runtime ---------------------------------------------------------------------------
@pytest.mark.timing
def test_processes_post_returns_at_once_and_poll_takes_what_is_ready(tmp_path):
    gate = str(tmp_path / "open")  # "slow" holds until the test opens its gate
    with ProcessRuntime(factories(["fast", "slow"]), workers=2) as rt:
        rt.next_round()
        slow = rt.post("slow", "ping", {"x": 1.0, "gate": gate})
        fast = rt.post("fast", "ping", {"x": 2.0})
        assert rt.in_flight == 2 and not slow.done
        got = rt.poll([slow, fast], min_count=1)
        assert list(got) == [fast] and got[fast].payload == {"x": 2.0}
        assert rt.in_flight == 1  # the slow party still computes
        # only the received exchange is in the ledger, request then reply
        assert [(r["receiver"], r["kind"]) for r in rt.ledger.rows] == [
            ("fast", "ping"),
            (SERVER, "echo"),
        ]
        with pytest.raises(RuntimeError, match="slow"):  # no blocking call to a busy party
            rt.send("slow", "ping", {"x": 0.0})
        assert rt.send("fast", "ping", {"x": 3.0}).payload == {"x": 3.0}  # others are free
        assert rt.poll([slow], timeout=0.01) == {}
        again = rt.post("fast", "ping", {"x": 4.0})
        assert arrived(rt, again) == {again: again.reply}  # arrived: taken
        assert again.reply.payload == {"x": 4.0}
        open(gate, "w").close()
        got = rt.poll([slow])
        assert got[slow].payload == {"x": 1.0} and rt.in_flight == 0
        rt.mark()  # quiescent again


def test_serial_post_is_answered_at_once():
    rt = SerialRuntime(factories(["a", "b"]))
    t = [rt.post(n, "ping", {"x": float(i)}) for i, n in enumerate(("a", "b"))]
    assert all(x.done for x in t) and rt.in_flight == 2
    assert [r.payload["x"] for r in rt.poll(t, min_count=0).values()] == [0.0, 1.0]
    assert rt.in_flight == 0 and not rt.supports_async


@pytest.mark.timing
def test_a_failed_posted_step_is_retried_or_raised():
    once = {"b": Fault("raise", round=1, times=1)}
    with ProcessRuntime(factories(["a", "b"], once), workers=2, on_failure="stop") as rt:
        rt.next_round()
        t = rt.post("b", "ping", {"x": 1.0})
        with pytest.raises(ClientFailure, match="'b'"):
            rt.poll([t])
        rt.recover()
        assert rt.in_flight == 0 and rt.alive == ["a", "b"]  # it raised; its worker lives
    with ProcessRuntime(
        factories(["a", "b"], once), workers=2, on_failure="retry", retries=1
    ) as rt:
        rt.next_round()
        t = rt.post("b", "ping", {"x": 1.0})
        assert rt.poll([t])[t].payload == {"x": 1.0}
        assert [r["client"] for r in rt.retried] == ["b"]
        # the failed attempt's request is in the ledger, then the retried one and its reply
        assert [r["kind"] for r in rt.ledger.rows] == ["ping", "ping", "echo"]


@pytest.mark.timing
def test_a_posted_step_past_client_timeout_fails_as_a_timeout():
    with ProcessRuntime(factories(["a", "b"]), workers=2, client_timeout=0.2) as rt:
        rt.next_round()
        t = rt.post("b", "ping", {"x": 1.0, "sleep": 1.0})
        with pytest.raises(ClientFailure, match="client_timeout") as exc:
            rt.poll([t])
        assert exc.value.failures["b"].kind == "timeout" and exc.value.kind == "ping"


# -- fair-vfl -------------------------------------------------------------------------------
KW = dict(eps=0.05, eta=2.0, Q=2, c=0.0)


def test_asynchronous_on_serial_is_the_synchronous_run():
    prob = small_problem()
    sync = solve_vertical(prob, "fair-vfl", max_rounds=25, monitor_every=7, **KW)
    a = solve_vertical(prob, "fair-vfl", max_rounds=25, monitor_every=7, asynchronous=True, **KW)
    np.testing.assert_array_equal(a.x, sync.x)
    np.testing.assert_array_equal(a.extra["lambda"], sync.extra["lambda"])
    assert "serial runtime" in a.message and "synchronous" in a.message
    for s in a.extra["asynchrony"]["parties"].values():
        assert s["replies"] == 25 and s["silent_rounds"] == 0 and s["max_staleness"] == 0
    with pytest.raises(ModelError, match="delays"):
        solve_vertical(prob, "fair-vfl", asynchronous=True, delays=(0, 1, 0), **KW)
    with pytest.raises(ModelError, match="min_replies"):
        solve_vertical(prob, "fair-vfl", asynchronous=True, min_replies=4, **KW)


@pytest.mark.timing
def test_waiting_for_every_reply_on_processes_is_the_synchronous_run():
    prob = small_problem()
    kw = dict(KW, max_rounds=20, monitor_every=7)
    sync = solve_vertical(prob, "fedbcd", **kw)
    a = solve_vertical(
        prob, "fedbcd", backend="processes", workers=3, asynchronous=True, min_replies=3, **kw
    )
    np.testing.assert_array_equal(a.x, sync.x)
    assert a.extra["asynchrony"]["parties"]["party1"]["silent_rounds"] == 0
    assert "no non-blocking exchange" not in a.message


@pytest.mark.timing
def test_a_slow_party_does_not_hold_the_rounds_back_and_the_run_converges():
    prob = small_problem()
    ref = solve_constrained(prob, eps=0.05)
    tol = 1e-6
    # (a straggler by a wide margin: 0.1 s per round, where the others take milliseconds)
    slow = {"party2": Fault("sleep", round=2, times=None, seconds=0.1, kinds=("vfl_round",))}
    res = solve_vertical(
        prob,
        "fair-vfl",
        backend="processes",
        workers=3,  # one worker per party
        asynchronous=True,
        faults=slow,
        tol=tol,
        max_rounds=20_000,
        monitor_every=50,
        **KW,
    )
    rounds = res.rounds["outer"]
    stats = res.extra["asynchrony"]["parties"]
    # the server did not wait for the slow party: in most rounds it did not reply ...
    assert stats["party2"]["silent_rounds"] > rounds / 2
    fast = min(stats["party0"]["replies"], stats["party1"]["replies"])
    assert 3 * stats["party2"]["replies"] < fast, stats
    # ... and its replies were used stale (computed from the scores of an earlier round)
    assert stats["party2"]["max_staleness"] >= 2
    stale = stats["party2"]["staleness"]
    assert len(stale) == stats["party2"]["replies"] and all(s >= 0 for s in stale)
    assert sum(h["replies"] for h in res.history) == sum(s["replies"] for s in stats.values())
    # it converges to the reference's KKT point: the gap (12) <= tol bounds the distance to
    # it by tol times the conditioning of the KKT system near it (measured below 1 for both
    # the synchronous and the asynchronous runs: errors 6e-7, 7e-7 at tol = 1e-6), with 10x
    # headroom; c = 0 leaves no c * lambda bias
    assert res.status == "optimal" and res.extra["reason"] == "gap"
    np.testing.assert_allclose(res.extra["lambda"], ref.extra["lambda"], atol=10 * tol)
    assert res.objective == pytest.approx(ref.objective, abs=10 * tol)
    assert res.extra["train"]["deo_loss"] <= 0.05 + 10 * tol
    # the network still carries only n-vectors (scores) and lambda
    n = prob.n
    for r in res.ledger:
        if r["channel"] == "algorithm":
            assert set(r["shapes"].values()) <= {(n,), (2,)}, r


@pytest.mark.timing
def test_asynchronous_failures_checkpoints_and_resume_on_processes(tmp_path):
    prob = small_problem()
    kw = dict(KW, backend="processes", workers=3, asynchronous=True, monitor_every=5)
    boom = {"party1": Fault("raise", round=8, times=1, kinds=("vfl_round",))}
    stopped = solve_vertical(prob, "fair-vfl", max_rounds=30, faults=boom, **kw)
    assert stopped.status == "client_failure" and "party1" in stopped.message
    # back to the last consistent point: a drained, monitored round
    assert stopped.rounds["outer"] % 5 == 1 and stopped.rounds["outer"] <= 8
    retried = solve_vertical(
        prob, "fair-vfl", max_rounds=30, faults=boom, on_failure="retry", retries=1, **kw
    )
    assert retried.status != "client_failure" and retried.rounds["outer"] == 30
    assert [r["client"] for r in retried.extra["retries"]] == ["party1"]
    # a checkpoint is written at a drained point and resumes
    ck = tmp_path / "ck"
    first = solve_vertical(
        prob, "fair-vfl", max_rounds=12, checkpoint=str(ck), checkpoint_every=4, **kw
    )
    assert first.checkpoint == str(ck)
    rest = solve_vertical(prob, "fair-vfl", max_rounds=20, resume=str(ck), **kw)
    assert rest.rounds["outer"] == 20 and rest.status != "client_failure"
    assert rest.extra["asynchrony"]["rounds"] == 20


@pytest.mark.slow  # starting Ray and its actors alone takes ~25 s on a loaded 2-core machine
def test_ray_post_and_poll(tmp_path):
    ray = pytest.importorskip("ray")
    from fedmodel.runtime.ray_runtime import RayRuntime

    if not ray.is_initialized():  # as the other Ray tests: one local Ray for the session
        ray.init(num_cpus=2, include_dashboard=False, configure_logging=False)
    gate = str(tmp_path / "open")  # "slow" holds until the test opens its gate
    with RayRuntime(factories(["fast", "slow"]), workers=2) as rt:
        assert rt.supports_async
        rt.next_round()
        slow = rt.post("slow", "ping", {"x": 1.0, "gate": gate})
        fast = rt.post("fast", "ping", {"x": 2.0})
        got = rt.poll([slow, fast], min_count=1)
        assert list(got) == [fast] and rt.in_flight == 1
        with pytest.raises(RuntimeError, match="slow"):
            rt.mark()
        open(gate, "w").close()
        assert rt.poll([slow])[slow].payload == {"x": 1.0}
        assert [r["kind"] for r in rt.ledger.rows] == ["ping", "echo", "ping", "echo"]


@pytest.mark.timing
def test_a_stuck_posted_step_gets_its_worker_stopped_after_the_grace_period(monkeypatch):
    import fedmodel.runtime.base as base

    monkeypatch.setattr(base, "GRACE_SECONDS", 0.5)  # 5 s by default
    with ProcessRuntime(factories(["a", "b"]), workers=2, client_timeout=0.2) as rt:
        rt.next_round()
        t = rt.post("b", "ping", {"x": 1.0, "sleep": 30.0, "stuck": True})
        t0 = time.monotonic()
        with pytest.raises(ClientFailure, match="was stopped") as exc:
            rt.poll([t])
        assert time.monotonic() - t0 < 10  # 0.2 s + the grace period, not 30 s
        assert exc.value.failures["b"].kind == "dead" and rt.alive == ["a"]
        assert rt.in_flight == 0


@pytest.mark.timing
def test_a_worker_dying_with_posted_work_is_a_client_failure():
    crash = {"b": Fault("exit", round=1, times=1)}
    with ProcessRuntime(factories(["a", "b"], crash), workers=2) as rt:
        rt.next_round()
        ta = rt.post("a", "ping", {"x": 1.0, "sleep": 0.2})
        tb = rt.post("b", "ping", {"x": 2.0})
        with pytest.raises(ClientFailure) as exc:
            rt.poll([ta, tb], min_count=2)
        assert exc.value.failures["b"].kind == "dead" and "died" in str(exc.value)
        assert rt.alive == ["a"]
        rt.recover()  # a's posted step is collected and discarded
        assert rt.in_flight == 0 and rt.alive == ["a"]


@pytest.mark.slow  # Flower's simulation engine takes about a minute to start here
def test_asynchronous_on_flower_falls_back_to_synchronous_rounds_with_a_note():
    pytest.importorskip("flwr")
    prob = small_problem()
    kw = dict(KW, max_rounds=6)
    sync = solve_vertical(prob, "fair-vfl", **kw)
    res = solve_vertical(prob, "fair-vfl", backend="flower", asynchronous=True, **kw)
    np.testing.assert_array_equal(res.x, sync.x)
    assert "flower runtime, which has no non-blocking exchange" in res.message
