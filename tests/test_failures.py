"""Failures lose nothing: a client that raises, sleeps past its timeout or whose worker is
killed; retries; checkpoints and resume; Ctrl-C. On every backend."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time

import numpy as np
import pytest

import fedmodel as fm
from fedmodel.algorithms.proxal.options import ProxALOptions
from fedmodel.algorithms.proxal.server import run_prox_al
from fedmodel.runtime.checkpoint import CheckpointError
from fedmodel.runtime.faults import Fault

sys.path.insert(0, os.path.dirname(__file__))
from backend_configs import BACKENDS, REMOTE, on  # noqa: E402
from problems import np_model  # noqa: E402

EPS = 1e-4
#: a short proximal step (the default Newton inner solver needs only 3-5 outer iterations
#: here): 14 outer iterations to checkpoint, interrupt and resume in
SLOW = {"prox_beta": 1.0}


@pytest.fixture(scope="module", autouse=True)
def ray_local():
    """A local Ray with num_cpus=2, started once for the session (see test_runtime)."""
    import ray

    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, configure_logging=False)
    yield ray


@pytest.fixture(scope="module")
def model():
    return np_model(3)


@pytest.fixture(scope="module")
def reference(model):
    return model.solve("prox-al", eps=EPS, **SLOW)


def run(model, faults=None, **kw):
    opts = ProxALOptions(eps=EPS, **{"workers": 2, **SLOW, **kw})
    return run_prox_al(model.compile(), opts, "prox-al", faults=faults)


def plain(history):
    """History rows as plain JSON values (rows hold numpy arrays)."""
    from fedmodel.result import _jsonable

    return _jsonable(history)


def same(a, b, tol=1e-10):
    return np.abs(a.x - b.x).max() / max(1.0, np.abs(b.x).max()) <= tol


@pytest.mark.parametrize("backend", BACKENDS)
def test_client_raising_on_round_3_stops_with_its_name_and_error(model, backend):
    res = run(model, {"site1": Fault("raise", round=3)}, **on(backend))
    assert res.status == "client_failure"
    assert res.failure["client"] == "site1" and res.failure["kind"] == "raised"
    assert "InjectedFault" in res.failure["error"] and res.failure["round"] == 3
    assert "site1" in res.message and "round 3" in res.message
    assert res.rounds["outer"] == 0 and res.history == []  # failed in outer iteration 0
    np.testing.assert_array_equal(res.x, np.zeros_like(res.x))  # the starting point
    assert np.isfinite(res.objective)  # site1 recovered: evaluated at the starting point
    assert set(res.multipliers) == {"server", "site0", "site1", "site2"}


@pytest.mark.parametrize("backend", BACKENDS)
def test_failure_returns_the_last_consistent_iterate(model, reference, backend):
    fail_round = reference.history[1]["rounds"] + 1  # first round of outer iteration 2
    res = run(model, {"site2": Fault("raise", round=fail_round, times=None)}, **on(backend))
    assert res.status == "client_failure" and res.failure["client"] == "site2"
    two = run(model, max_outer=2, backend="serial")
    assert res.rounds["outer"] == 2
    assert same(res, two)
    assert plain(res.history) == plain(two.history) == plain(reference.history[:2])
    assert res.objective == pytest.approx(two.objective, abs=1e-12)
    assert "site2" not in res.multipliers  # it keeps failing: no report from it
    # the ledger keeps everything sent, including the failed round
    assert max(r["round"] for r in res.ledger) == fail_round


@pytest.mark.parametrize("backend", BACKENDS)
def test_retry_recovers_and_gives_the_same_answer(model, reference, backend):
    res = run(
        model,
        {"site1": Fault("raise", round=3, times=2)},
        **on(backend),
        on_failure="retry",
        retries=2,
    )
    assert res.status == "optimal"
    assert same(res, reference)
    assert [r["client"] for r in res.extra["retries"]] == ["site1", "site1"]
    # the failed attempts are in the ledger: two extra requests to site1 in round 3
    down = [r for r in res.ledger if r["receiver"] == "site1" and r["round"] == 3]
    assert len(down) == 3
    retries_exhausted = run(
        model, {"site1": Fault("raise", round=3, times=3)}, **on(backend), on_failure="retry"
    )
    assert retries_exhausted.status == "client_failure"


@pytest.mark.timing
@pytest.mark.parametrize("backend", BACKENDS)
def test_client_sleeping_past_its_timeout(model, reference, backend):
    """The sleeping step is interrupted: on a worker or actor a step that was not would be
    a worker stopped after the grace period (kind "dead", not "timeout"); in the server's
    process it would hold the test for its 600 s (no wall-time verdict here: a busy
    machine starts workers slowly)."""
    res = run(model, {"site0": Fault("sleep", round=3, seconds=600)}, **on(backend),
              client_timeout=2)  # fmt: skip
    assert res.status == "client_failure"
    assert res.failure["client"] == "site0" and res.failure["kind"] == "timeout"
    assert "client_timeout = 2 s" in res.failure["error"]
    res = run(
        model,
        {"site0": Fault("sleep", round=3, seconds=600)},
        **on(backend),
        client_timeout=2,
        on_failure="retry",
        retries=1,
    )
    assert res.status == "optimal" and same(res, reference)


@pytest.mark.timing
@pytest.mark.parametrize("backend", REMOTE)
def test_killed_worker_is_a_failure_of_its_parties(model, backend, tmp_path):
    res = run(
        model,
        {"site1": Fault("exit", round=3)},
        **on(backend),
        on_failure="retry",
        checkpoint=str(tmp_path / "ck"),
    )
    assert res.status == "client_failure"
    assert res.failure["kind"] == "dead" and "site1" in res.failure["clients"]
    assert "died" in res.failure["error"]
    assert res.extra["retries"] == []  # a dead worker is not retried
    assert "no checkpoint could be written" in res.message  # its parties' state is gone
    assert res.checkpoint is None


@pytest.mark.timing
@pytest.mark.parametrize("backend", ["processes+server", "ray+server"])
def test_a_client_in_the_server_process_fails_like_a_remote_one(model, reference, backend):
    """site2 runs in the server's process (the lightest shard): raising and sleeping past
    its timeout are client failures, and retries recover, while the workers' replies of
    the same round are collected."""
    res = run(model, {"site2": Fault("raise", round=3)}, **on(backend))
    assert res.extra["placement"]["site2"] == "server"
    assert res.status == "client_failure" and res.failure["client"] == "site2"
    assert res.failure["kind"] == "raised" and res.failure["round"] == 3
    # (the alarm interrupts the local step: otherwise it would sleep its 600 s)
    res = run(model, {"site2": Fault("sleep", round=3, seconds=600)}, client_timeout=2,
              **on(backend))  # fmt: skip
    assert res.status == "client_failure" and res.failure["kind"] == "timeout"
    res = run(model, {"site2": Fault("sleep", round=3, seconds=600)}, client_timeout=2,
              on_failure="retry", retries=1, **on(backend))  # fmt: skip
    assert res.status == "optimal" and same(res, reference)


def test_worker_crash_refused_in_the_server_process(model):
    res = run(model, {"site1": Fault("exit", round=3)}, backend="serial")
    assert res.status == "client_failure" and "server's process" in res.failure["error"]


# -- checkpoints ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def checkpoint_at_2(model, tmp_path_factory):
    """A checkpoint written at outer iteration 2 by the processes backend."""
    path = tmp_path_factory.mktemp("ckpt") / "run"
    res = run(model, backend="processes", checkpoint=str(path), checkpoint_every=2, max_outer=2)
    assert res.status == "max_iterations" and res.checkpoint == str(path)
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["iteration"] == 2 and sorted(manifest["parties"]) == [
        "site0",
        "site1",
        "site2",
    ]
    return path


@pytest.mark.parametrize("backend", BACKENDS)
def test_resume_from_iteration_2_gives_the_uninterrupted_answer(
    model, reference, checkpoint_at_2, backend
):
    res = run(model, **on(backend), resume=str(checkpoint_at_2))
    assert res.status == reference.status == "optimal"
    assert same(res, reference)
    assert res.rounds == reference.rounds
    assert plain(res.history) == plain(reference.history)
    assert res.ledger == reference.ledger
    assert res.communication == reference.communication


def test_checkpoint_every_k_keeps_only_the_latest(model, tmp_path):
    path = tmp_path / "ck"
    res = run(model, checkpoint=str(path), checkpoint_every=3)
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["iteration"] % 3 == 0 and manifest["iteration"] <= res.rounds["outer"]
    files = sorted(os.listdir(path))
    assert len([f for f in files if f.startswith("party-")]) == 3
    assert len([f for f in files if f.startswith("server-")]) == 1


def _copy(src, dst):
    import shutil

    shutil.copytree(src, dst)
    return dst


def test_corrupted_checkpoints_give_clear_errors(model, checkpoint_at_2, tmp_path):
    bad = _copy(checkpoint_at_2, tmp_path / "bad1")
    party = sorted(f for f in os.listdir(bad) if f.startswith("party-"))[0]
    blob = bytearray((bad / party).read_bytes())
    blob[len(blob) // 2] ^= 0xFF
    (bad / party).write_bytes(bytes(blob))
    with pytest.raises(CheckpointError, match="corrupted.*checksum"):
        run(model, resume=str(bad))
    bad = _copy(checkpoint_at_2, tmp_path / "bad2")
    (bad / "manifest.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="corrupted"):
        run(model, resume=str(bad))
    bad = _copy(checkpoint_at_2, tmp_path / "bad3")
    server = next(f for f in os.listdir(bad) if f.startswith("server-"))
    os.remove(bad / server)
    with pytest.raises(CheckpointError, match="missing"):
        run(model, resume=str(bad))
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="manifest.json is missing"):
        run(model, resume=str(tmp_path / "empty"))


def test_mismatched_checkpoints_give_clear_errors(model, checkpoint_at_2):
    with pytest.raises(CheckpointError, match="different options.*beta"):
        run(model, resume=str(checkpoint_at_2), beta=5.0)
    with pytest.raises(CheckpointError, match="different model.*clients"):
        run(np_model(4), resume=str(checkpoint_at_2))
    with pytest.raises(CheckpointError, match="site0.*different terms or data"):
        run(np_model(3, seed=7), resume=str(checkpoint_at_2))
    with pytest.raises(CheckpointError, match="method 'prox-al', not 'admm'"):
        opts = ProxALOptions(eps=EPS, resume=str(checkpoint_at_2), **SLOW)
        run_prox_al(model.compile(), opts, "admm")


# -- Ctrl-C ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_ctrl_c_returns_interrupted_with_a_checkpoint_and_resumes(
    model, reference, backend, tmp_path
):
    def stop_at_iteration_3(row):
        if row["iteration"] == 3:
            raise KeyboardInterrupt

    path = str(tmp_path / "ck")
    res = run(model, **on(backend), callback=stop_at_iteration_3, checkpoint=path,
              checkpoint_every=100)  # fmt: skip
    assert res.status == "interrupted"
    assert res.rounds["outer"] == 3  # the last consistent iterate: end of iteration 2
    assert plain(res.history) == plain(reference.history[:3])
    assert res.checkpoint == path and "resume=" in res.message
    resumed = run(model, backend="serial", resume=path)
    assert resumed.status == "optimal" and same(resumed, reference)
    assert resumed.ledger == reference.ledger


def test_a_failed_final_save_does_not_claim_a_fresh_checkpoint(model, tmp_path, monkeypatch):
    """Periodic checkpoint at iteration 2, then Ctrl-C at 3 with a failing save: the message
    says the checkpoint on disk is an older one (where it resumes), never "written"."""
    import fedmodel.algorithms.driver as driver

    real, calls = driver.write_checkpoint, []

    def write_once(*args, **kw):
        calls.append(kw.get("reason"))
        if len(calls) > 1:
            raise OSError("disk full")
        return real(*args, **kw)

    def stop_at_iteration_3(row):
        if row["iteration"] == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(driver, "write_checkpoint", write_once)
    path = str(tmp_path / "ck")
    res = run(model, callback=stop_at_iteration_3, checkpoint=path, checkpoint_every=2)
    assert res.status == "interrupted" and len(calls) == 2
    assert "Checkpoint written" not in res.message
    assert "is an older one: it resumes at outer iteration 2" in res.message
    assert "no checkpoint could be written (disk full)" in res.message


@pytest.fixture
def python_ctrl_c():
    """Python's default SIGINT handler for the test, the previous one back afterwards. The
    tests below are about a process with Python's own Ctrl-C handling, and the test
    process may not have it: started in the background by a non-interactive shell (a CI
    job, ``pytest &``), it inherits SIGINT *ignored*, and Python then leaves it ignored
    (``signal.getsignal`` gives ``SIG_IGN``; the solve leaves Ctrl-C alone, as for any
    handler it did not install, and even ``_thread.interrupt_main`` does nothing). That
    was the "handler left installed by an earlier test" of full-suite CI runs: no test
    changes SIGINT (checked before and after every test of a full run)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield previous
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.mark.timing
@pytest.mark.parametrize("backend", ["serial", "processes", "processes+server"])
def test_sigint_during_a_solve(model, reference, backend, tmp_path, python_ctrl_c):
    """A real SIGINT (as from Ctrl-C) while the clients are computing."""
    # site0 takes >= 0.3 s per round from round 2: the >= 10 rounds after outer iteration 0
    # last >= 3 s, so a SIGINT 0.2 s after it lands mid-solve even on a loaded machine
    slow = {"site0": Fault("sleep", round=2, times=None, seconds=0.3)}
    timer = threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT))

    def start_timer(row):  # once the solve runs: SIGINT 0.2 s later
        if row["iteration"] == 0:
            timer.start()

    path = str(tmp_path / "ck")
    try:
        res = run(model, slow, **on(backend), checkpoint=path, checkpoint_every=1000,
                  callback=start_timer)  # fmt: skip
    finally:
        timer.cancel()
    assert res.status == "interrupted"
    assert res.checkpoint == path
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    resumed = run(model, **on(backend), resume=path)
    assert resumed.status == "optimal" and same(resumed, reference)


@pytest.mark.timing
def test_a_solve_leaves_an_ignored_ctrl_c_ignored(model, reference):
    """In a process that ignores SIGINT (a background job), a solve neither takes Ctrl-C
    over nor is interrupted by it, and SIGINT is still ignored afterwards."""
    timer = threading.Timer(0.0, os.kill, (os.getpid(), signal.SIGINT))

    def send_sigint(row):
        if row["iteration"] == 0:
            timer.start()
            timer.join()

    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        res = run(model, callback=send_sigint)
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)
    assert res.status == "optimal" and same(res, reference)


def test_result_statuses_include_failures():
    from fedmodel.result import STATUSES

    assert "client_failure" in STATUSES and "interrupted" in STATUSES
    assert issubclass(CheckpointError, fm.ModelError)


# -- what a host answers is checked, and every reply of an exchange is read -------------------------
class Party:
    """A toy party: answers ``ping`` with twice its ``x``. ``answer="text"``: answers a
    string instead of a message. ``state="set"``: its state holds a set (a checkpoint of
    it cannot be written). ``fingerprint_seconds``: computing its fingerprint (for a
    checkpoint file) takes that long."""

    def __init__(self, name, answer="message", state="plain", fingerprint_seconds=0.0):
        from types import SimpleNamespace

        self.name, self.answer, self.state = name, answer, state
        self.count = 0

        def fingerprint():
            time.sleep(fingerprint_seconds)
            return None

        self.program = SimpleNamespace(fingerprint=fingerprint)

    def get_state(self):
        out = {"count": self.count}
        if self.state == "set":
            out["unwritable"] = {1, 2}
        return out

    def set_state(self, state):
        self.count = state["count"]

    def handle(self, msg):
        from fedmodel.runtime.messages import SERVER, Message

        self.count += 1
        if self.answer == "text":
            return "a string instead of a message"
        x = 2 * np.asarray(msg.payload["x"])
        return Message(msg.kind + "_reply", self.name, SERVER, {"x": x}, msg.round, msg.channel)


def _parties(**special):
    from fedmodel.runtime.endpoints import EndpointFactory

    return {n: EndpointFactory(Party, (n,), special.get(n, {})) for n in ("a", "b", "c")}


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_client_answering_a_string_is_an_invalid_reply_naming_it(backend):
    from fedmodel.runtime.factory import make_runtime
    from fedmodel.runtime.outcomes import ClientFailure

    opts = on(backend)
    factories = _parties(b={"answer": "text"})
    with make_runtime(opts.pop("backend"), factories, workers=2, **opts) as rt:
        rt.next_round()
        with pytest.raises(ClientFailure) as err:
            rt.broadcast("ping", {"x": np.ones(2)})
    assert err.value.clients == ["b"]
    assert err.value.failures["b"].kind == "invalid_reply"
    assert "client 'b', reply to 'ping': not a message (str)" in str(err.value)


def test_a_host_answering_a_string_for_a_step_is_an_invalid_reply_naming_its_parties(
    monkeypatch,
):
    """A worker whose answer to a step is not the step's outcome (a string, as once under
    load: ``'str' object has no attribute 'kind'`` out of the runtime) fails the parties
    it holds, with a message naming each; the other parties' replies are used."""
    from fedmodel.runtime.outcomes import ClientFailure
    from fedmodel.runtime.processes import ProcessRuntime

    with ProcessRuntime(_parties(), workers=3) as rt:
        real = rt._map
        host_b = rt.worker_of("b")

        def garbled(calls, steps, build=False):
            out = real(calls, steps, build)
            if calls.get(host_b, ("",))[0] == "run":
                out[host_b] = "b"  # (once: a desynchronised pipe, a stray answer)
            return out

        monkeypatch.setattr(rt, "_map", garbled)
        rt.next_round()
        with pytest.raises(ClientFailure) as err:
            rt.broadcast("ping", {"x": np.ones(2)})
    assert err.value.clients == ["b"]
    assert err.value.failures["b"].kind == "invalid_reply"
    assert (
        "client 'b', reply to 'ping': its host answered a str, not the outcome of the step"
    ) in str(err.value)


def test_a_worker_error_leaves_no_reply_unread_for_the_next_call(tmp_path):
    """One worker's call raises (party a's state cannot be written to a checkpoint: the
    driver notes it and goes on) while another worker is still answering the same call:
    its answer is read then, not taken as its answer to the next call (which gave
    ``'str' object has no attribute 'kind'``: the checkpoint's file table read as the
    outcomes of the next round)."""
    from fedmodel.runtime.processes import ProcessRuntime

    factories = _parties(a={"state": "set"}, b={"fingerprint_seconds": 1.0})
    with ProcessRuntime(factories, workers=3) as rt:
        assert len({rt.worker_of(n) for n in "abc"}) == 3
        rt.next_round()
        rt.mark()
        with pytest.raises(CheckpointError, match="party 'a'"):
            rt.write_party_checkpoint(str(tmp_path), "000001-abcdef01")
        rt.next_round()
        replies = rt.broadcast("ping", lambda n: {"x": np.full(2, float(ord(n)))})
        for n in "abc":
            np.testing.assert_array_equal(replies[n].payload["x"], np.full(2, 2.0 * ord(n)))
            assert replies[n].round == rt.round


def test_a_relative_checkpoint_directory_is_the_servers_whatever_the_workers_cwd(
    model, tmp_path, monkeypatch
):
    """Workers are kept between solves: one started while the server was in another
    directory (since removed) writes the parties' files of ``checkpoint="run1"`` in the
    server's ``run1`` too (it once failed there, in some workers only: the docs' block
    ``checkpoint="run1"`` then ``resume="run1"``), and the run resumes from it."""
    import shutil

    from fedmodel.runtime.processes import shutdown_workers

    shutdown_workers()
    for d in ("before", "now"):
        (tmp_path / d).mkdir()
    monkeypatch.chdir(tmp_path / "before")
    run(model, backend="processes", max_outer=1)  # its workers are kept, started here
    monkeypatch.chdir(tmp_path / "now")
    shutil.rmtree(tmp_path / "before")
    res = run(model, backend="processes", checkpoint="run1", checkpoint_every=1, max_outer=3)
    assert "could not be written" not in res.message, res.message
    files = sorted(os.listdir(tmp_path / "now" / "run1"))
    assert [f for f in files if f.startswith("party-")], files
    again = run(model, backend="processes", resume="run1", max_outer=3)
    ref = run(model, backend="serial", max_outer=3)
    assert again.rounds == ref.rounds and same(again, ref)


def test_a_relative_checkpoint_directory_is_the_callers_on_ray(model, tmp_path, monkeypatch):
    """Ray's actors run in the Ray session's working directory, not the caller's: the
    parties' files of ``checkpoint="run1"`` are written in the caller's ``run1`` all the
    same (the directory is resolved once, in the caller, for every backend), and the run
    resumes from it to the uninterrupted answer."""
    monkeypatch.chdir(tmp_path)
    res = run(model, backend="ray", checkpoint="run1", checkpoint_every=1, max_outer=3)
    assert "could not be written" not in res.message, res.message
    files = sorted(os.listdir(tmp_path / "run1"))
    assert len([f for f in files if f.startswith("party-")]) == len(model.compile().clients)
    again = run(model, backend="ray", resume="run1", max_outer=3)
    ref = run(model, backend="serial", max_outer=3)
    assert again.rounds == ref.rounds and same(again, ref)


@pytest.mark.parametrize(
    "backend",
    # (Flower's party death is rerun beside busy processes by test_flower.py's own test)
    [pytest.param(b, marks=pytest.mark.timing) for b in ("serial", "processes", "ray")]
    + ["flower"],
)
def test_a_killed_worker_is_blamed_on_the_client_in_its_step_only(model, backend):
    """All three clients share one worker (one actor; on Flower's simulation, one ClientApp
    actor relays every node) and site1's step kills it (serial: site1's step raises,
    there is no worker to kill): site1 alone failed; site0 (before it) and site2 (waiting
    behind it) are never blamed, whatever the order their replies would have come in."""
    if backend == "flower":
        pytest.importorskip("flwr")
    action = "raise" if backend == "serial" else "exit"
    res = run(model, {"site1": Fault(action, round=3)}, backend=backend, workers=1,
              client_timeout=120)  # fmt: skip
    assert res.status == "client_failure", res.message
    assert res.failure["client"] == "site1" and res.failure["clients"] == ["site1"]
    assert res.failure["kind"] == ("raised" if backend == "serial" else "dead")
    assert res.failure["round"] == 3
    assert "client 'site1' failed" in res.message
    if backend in ("processes", "ray"):  # the worker's other clients are lost with it
        assert "site2" in res.failure["lost"] and "site1" not in res.failure["lost"]
        assert "site1" in res.failure["error"] and "'site1''s step" in res.failure["error"]
    else:
        assert res.failure["lost"] == []


@pytest.mark.timing
@pytest.mark.parametrize("backend", ["serial", "processes+server"])
def test_client_timeout_holds_when_the_solve_runs_off_the_main_thread(model, backend):
    """``model.solve`` in a thread (a notebook's worker, a web server): SIGALRM cannot reach
    a step run there, so a watchdog thread raises the timeout into it. site2 (in the
    server's process on both backends) sleeps 600 s in round 3 with client_timeout = 1 s:
    the failure is its timeout, long before the sleep would have ended (the bound, 300 s,
    leaves any machine room; without the watchdog the step runs its 600 s)."""
    out = {}
    faults = {"site2": Fault("sleep", round=3, seconds=600)}

    def solve():
        out["res"] = run(model, faults, client_timeout=1, **on(backend))

    thread = threading.Thread(target=solve, daemon=True)
    thread.start()
    thread.join(300)
    assert not thread.is_alive(), "the sleeping step was not interrupted"
    res = out["res"]
    assert res.extra["placement"]["site2"] == "server"
    assert res.status == "client_failure", res.message
    assert res.failure["client"] == "site2" and res.failure["kind"] == "timeout"
    assert "client_timeout = 1 s" in res.failure["error"]
