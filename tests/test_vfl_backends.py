"""fair-vfl on worker processes: the parties' local updates run in parallel, the iterates,
the ledger and the party states are those of the serial runtime."""

from __future__ import annotations

import numpy as np
from test_vfl import small_problem

from fedmodel.algorithms.vfl.run import solve_vertical


def test_processes_backend_equals_serial():
    prob = small_problem(test=True)
    kw = dict(eps=0.05, eta=2.0, Q=3, max_rounds=8, local_updates="random", seed=1)
    serial = solve_vertical(prob, "fair-vfl", **kw)
    procs = solve_vertical(prob, "fair-vfl", backend="processes", workers=2, **kw)
    np.testing.assert_array_equal(serial.x, procs.x)
    np.testing.assert_array_equal(serial.extra["lambda"], procs.extra["lambda"])
    assert serial.communication == procs.communication
    strip = [
        {k: r[k] for k in ("round", "sender", "receiver", "kind", "shapes")} for r in serial.ledger
    ]
    assert strip == [
        {k: r[k] for k in ("round", "sender", "receiver", "kind", "shapes")} for r in procs.ledger
    ]


def test_a_failed_party_round_is_retried_from_its_snapshot_or_reported():
    from fedmodel.runtime.faults import Fault

    prob = small_problem()
    kw = dict(eps=0.05, eta=2.0, Q=2, max_rounds=6, local_updates="random", seed=2)
    clean = solve_vertical(prob, "fair-vfl", **kw)
    once = {"party1": Fault("raise", round=3, times=1)}
    retried = solve_vertical(prob, "fair-vfl", on_failure="retry", retries=1, faults=once, **kw)
    np.testing.assert_array_equal(retried.x, clean.x)  # the generator state was restored too
    stopped = solve_vertical(prob, "fair-vfl", on_failure="stop", faults=once, **kw)
    assert stopped.status == "client_failure"
    assert stopped.failure["client"] == "party1" and "party1" in stopped.message
