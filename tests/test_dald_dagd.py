"""dagd: seed 004's DAGD (DGD, eq. 55, with non-blocking partial-cycle coordination) with
deterministic delays on the serial runtime and real asynchrony on the processes runtime."""

from __future__ import annotations

import numpy as np
import pytest
from test_baselines import hetero, model

from fedmodel.algorithms.dald.dagd import DAGDOptions, run_dagd
from fedmodel.errors import ModelError
from fedmodel.runtime.faults import Fault


@pytest.fixture(scope="module")
def lsq():
    m = model(hetero(n=4), l1=0.01)  # heterogeneous clients: DGD's bias is not zero
    return m, m.solve("centralized")


def test_without_delays_dagd_is_dgd_bit_for_bit(lsq):
    m, _ = lsq
    for topology in ("ring", "chain", "star"):  # star: "server" is a node
        a = m.solve("dgd", topology=topology, max_rounds=60, history=False)
        b = m.solve("dagd", topology=topology, max_rounds=60, history=False)
        assert np.array_equal(a.x, b.x)
        for s in a.extra["local_x"]:
            assert np.array_equal(a.extra["local_x"][s], b.extra["local_x"][s])
        info = b.extra["asynchrony"]
        assert info["mode"] == "synchronous" and info["ticks"] == 60
        assert len(info["parties"]) == (5 if topology == "star" else 4)
        assert all(p["updates"] == 60 and p["max_staleness"] == 0 for p in info["parties"].values())


def test_delays_give_stale_updates_and_the_synchronous_fixed_point(lsq):
    """Every fixed point of the asynchronous iteration is one of synchronous DGD (all copies
    equal the iterates): with delays the nodes update at different rates, on stale copies
    (staleness <= the node's delay), and land on dgd's fixed point."""
    m, _ = lsq
    delays = (0, 2, 1, 3)
    sync = m.solve("dgd", topology="ring", step=0.05, max_rounds=1500, history=False)
    res = m.solve("dagd", topology="ring", step=0.05, delays=delays, max_rounds=1500, history=False)
    parties = res.extra["asynchrony"]["parties"]
    assert res.extra["asynchrony"]["mode"] == "delays"
    updates = [parties[f"c{i}"]["updates"] for i in range(4)]
    assert updates[0] > updates[1] > updates[3]  # delay 0 > delay 2 > delay 3
    assert sum(updates) == res.rounds["updates"] >= 4 * 1500
    for i, d in enumerate(delays):  # at most one delivery per neighbour per tick it waits
        assert parties[f"c{i}"]["max_staleness"] <= d
    assert max(p["max_staleness"] for p in parties.values()) >= 2
    for s, x in sync.extra["local_x"].items():
        assert np.abs(res.extra["local_x"][s] - x).max() <= 1e-9


def test_against_centralized_the_bias_is_first_order_in_the_step(lsq):
    """With a constant step DGD (hence DAGD) stops in an O(alpha) neighbourhood of the
    optimum: halving alpha halves the distance (to first order), with delays."""
    m, ref = lsq
    dist = []
    for step in (0.04, 0.02):
        res = m.solve(
            "dagd", topology="ring", step=step, delays=(1, 0, 2, 0), max_rounds=3000,
            history=False,
        )  # fmt: skip
        assert res.extra["asynchrony"]["mode"] == "delays"
        dist.append(np.linalg.norm(res.x - ref.x) / np.linalg.norm(ref.x))
    assert 1e-4 < dist[0] < 0.05
    assert 0.4 < dist[1] / dist[0] < 0.6


def test_asynchronous_on_serial_is_synchronous_and_says_so(lsq):
    m, _ = lsq
    a = m.solve("dgd", topology="ring", max_rounds=40, history=False)
    b = m.solve("dagd", topology="ring", asynchronous=True, max_rounds=40, history=False)
    assert np.array_equal(a.x, b.x)
    assert "no non-blocking exchange" in b.message


@pytest.mark.timing
def test_real_asynchrony_on_processes_with_a_straggler(lsq):
    """On the processes runtime the nodes do not wait for a round: while c0 sleeps 100 ms
    per update (its first 20: 2 s), the others keep updating with each other's iterates
    (c0's copy stale), and the run still lands on the synchronous fixed point. The margins
    are generous: a node on the other worker needs 5 updates in those 2 s (it makes
    hundreds on an idle machine)."""
    m, _ = lsq
    sync = m.solve("dgd", topology="complete", step=0.05, max_rounds=5000, history=False)
    opts = DAGDOptions(
        topology="complete", step=0.05, max_rounds=5000, tol=1e-13, history=False,
        asynchronous=True,
        backend="processes", workers=2, server_hosts_clients=False,
    )  # fmt: skip
    compiled = m.compile()
    opts.validate(compiled, "dagd")
    slow = Fault("sleep", round=1, times=20, seconds=0.1, kinds=("dagd_step",))
    res = run_dagd(compiled, opts, faults={"c0": slow})
    info = res.extra["asynchrony"]
    assert info["mode"] == "asynchronous" and res.rounds["inner"] < 5000  # stopped by tol
    parties = info["parties"]
    # c0's 20 slow updates take >= 2 s; meanwhile the nodes on the other worker update
    fast = max(p["updates"] for p in parties.values())
    assert fast >= parties["c0"]["updates"] + 5
    assert max(p["max_staleness"] for p in parties.values()) >= 2
    assert np.abs(res.x - sync.x).max() <= 1e-8


def test_options_are_checked(lsq):
    m, _ = lsq
    with pytest.raises(ModelError, match="one entry per node"):
        m.solve("dagd", delays=(1, 2))
    with pytest.raises(ModelError, match="delay of node 'c1'"):
        m.solve("dagd", delays=(0, -1, 0, 0))
    with pytest.raises(ModelError, match=r"unknown nodes \['c9'\]"):
        m.solve("dagd", delays={"c9": 1})
    with pytest.raises(ModelError, match="use one or the other"):
        m.solve("dagd", delays=(0, 1, 0, 0), asynchronous=True)
    with pytest.raises(ModelError, match="min_neighbours must be an integer >= 1"):
        m.solve("dagd", min_neighbours=0)


def test_waiting_for_every_neighbour_with_equal_delays_is_dgd(lsq):
    """``min_neighbours`` = the degree and the same delay everywhere: every node waits for
    all its neighbours, so each update uses the previous round's iterates (dgd)."""
    m, _ = lsq
    a = m.solve("dgd", topology="ring", max_rounds=50, history=False)
    b = m.solve(
        "dagd", topology="ring", delays=(2, 2, 2, 2), min_neighbours=2, max_rounds=50,
        history=False,
    )  # fmt: skip
    assert np.array_equal(a.x, b.x)
    assert b.extra["asynchrony"]["ticks"] == 150


@pytest.mark.parametrize("on_failure", ["stop", "retry"])
def test_a_failing_node_under_real_asynchrony(lsq, on_failure):
    """A node that raises while others' jobs are in flight: with ``on_failure="stop"`` the
    run returns the last consistent point (status client_failure, naming the node), with
    ``"retry"`` its job is re-posted and the run lands on dgd's fixed point."""
    m, _ = lsq
    compiled = m.compile()
    opts = DAGDOptions(
        topology="complete", step=0.05, max_rounds=40, history=True, asynchronous=True,
        backend="processes", workers=2, on_failure=on_failure, retries=2,
    )  # fmt: skip
    opts.validate(compiled, "dagd")
    res = run_dagd(compiled, opts, faults={"c1": Fault("raise", round=5, kinds=("dagd_step",))})
    if on_failure == "stop":
        assert res.status == "client_failure" and res.failure["client"] == "c1"
        assert np.all(np.isfinite(res.x)) and len(res.history) >= 3
    else:
        sync = m.solve("dgd", topology="complete", step=0.05, max_rounds=40, history=False)
        assert res.status in ("max_iterations", "inaccurate")
        assert [r["client"] for r in res.extra["retries"]] == ["c1"]
        assert np.abs(res.x - sync.x).max() <= 0.05  # 40 rounds: near, not at, the point
