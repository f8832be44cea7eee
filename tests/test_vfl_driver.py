"""fair-vfl on the common driver: checkpoints and resume, the time limit, callbacks and
history; simulated asynchrony (``delays``) is deterministic, converges to the reference's
KKT point and is the same on every backend."""

from __future__ import annotations

import numpy as np
import pytest
from test_vfl import small_problem

from fedmodel.algorithms.vfl.reference import solve_constrained
from fedmodel.algorithms.vfl.run import solve_vertical
from fedmodel.runtime.checkpoint import CheckpointError

KW = dict(eps=0.05, eta=2.0, Q=3, local_updates="random", seed=4)


def test_resume_from_a_checkpoint_equals_an_uninterrupted_run(tmp_path):
    prob = small_problem(test=True)
    full = solve_vertical(prob, "fair-vfl", max_rounds=12, **KW)
    ck = tmp_path / "ck"
    first = solve_vertical(
        prob, "fair-vfl", max_rounds=7, checkpoint=str(ck), checkpoint_every=7, **KW
    )
    assert first.checkpoint == str(ck) and first.rounds["outer"] == 7
    rest = solve_vertical(prob, "fair-vfl", max_rounds=12, resume=str(ck), **KW)
    np.testing.assert_array_equal(rest.x, full.x)  # theta_k and the parties' generators
    np.testing.assert_array_equal(rest.extra["lambda"], full.extra["lambda"])
    assert [h["objective"] for h in rest.history] == [h["objective"] for h in full.history]
    assert rest.extra["test"] == full.extra["test"]
    with pytest.raises(CheckpointError):  # another eps changes the iterates
        solve_vertical(prob, "fair-vfl", max_rounds=12, resume=str(ck), **{**KW, "eps": 0.1})


def test_time_limit_history_and_callback():
    prob = small_problem()
    rows = []
    res = solve_vertical(
        prob, "fair-vfl", max_rounds=20, monitor_every=5, callback=rows.append, **KW
    )
    assert [h["round"] for h in res.history] == [1, 6, 11, 16, 20]
    assert rows == res.history
    for h in res.history:  # the driver's certificate fields next to the round's
        assert {"iteration", "objective", "stationarity", "feasibility", "gap", "lambda1"} <= set(h)
    quick = solve_vertical(prob, "fair-vfl", max_rounds=10_000, time_limit=1e-9, **KW)
    assert quick.status == "time_limit" and quick.rounds["outer"] == 1
    assert quick.x.size == sum(prob.sizes)


def test_simulated_asynchrony_is_deterministic_and_converges():
    prob = small_problem()
    ref = solve_constrained(prob, eps=0.05)
    kw = dict(eps=0.05, eta=2.0, Q=2, c=0.0, monitor_every=1000)
    sync = solve_vertical(prob, "fair-vfl", max_rounds=30, **kw)
    zeros = solve_vertical(prob, "fair-vfl", max_rounds=30, delays=(0, 0, 0), **kw)
    np.testing.assert_array_equal(sync.x, zeros.x)  # no delay = the synchronous rounds
    a = solve_vertical(prob, "fair-vfl", max_rounds=30, delays=(0, 1, 2), **kw)
    b = solve_vertical(prob, "fair-vfl", max_rounds=30, delays=(0, 1, 2), **kw)
    np.testing.assert_array_equal(a.x, b.x)
    assert not np.array_equal(a.x, sync.x)
    # the delayed party is sent a job only when idle: rounds 1, 4, 7, ... for d = 2
    got = [r["round"] for r in a.ledger if r["kind"] == "vfl_round" and r["receiver"] == "party2"]
    assert got == list(range(2, 32, 3))  # round 1 is the start-up upload
    assert a.extra["local_updates"] == {"party0": 60, "party1": 30, "party2": 20}
    # and it converges to the reference's KKT point (c = 0: no c * lambda bias)
    res = solve_vertical(prob, "fair-vfl", max_rounds=1500, delays=(2, 0, 3), **kw)
    assert res.status == "optimal" and res.kkt.stationarity <= 1e-8
    np.testing.assert_allclose(res.extra["lambda"], ref.extra["lambda"], atol=1e-6)
    assert res.objective == pytest.approx(ref.objective, abs=1e-7)


def test_processes_backend_equals_serial_with_delays():
    prob = small_problem(test=True)
    kw = dict(KW, max_rounds=6, delays=(1, 0, 2))
    serial = solve_vertical(prob, "fair-vfl", **kw)
    procs = solve_vertical(prob, "fair-vfl", backend="processes", workers=2, **kw)
    np.testing.assert_array_equal(serial.x, procs.x)
    np.testing.assert_array_equal(serial.extra["lambda"], procs.extra["lambda"])
    assert serial.communication == procs.communication
