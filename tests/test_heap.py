"""The collector during a solve (fedmodel/runtime/heap.py): the parties' objects are frozen
while the solve runs and handed back after it; a process that manages its collector itself
is left alone."""

import gc

import cvxpy as cp
import numpy as np
import pytest

import fedmodel as fm
from fedmodel.runtime import heap


def _model():
    rng = np.random.default_rng(0)
    m = fm.Model()
    w = m.variable(3, name="w")
    for i in range(3):
        c = m.client(f"c{i}")
        X, y = c.data(rng.normal(size=(8, 3)), name="X"), c.data(rng.normal(size=8), name="y")
        c.minimize(cp.sum_squares(X @ w - y))
    m.server.subject_to(cp.norm(w, "inf") <= 1)
    return m


def _frozen_during_solve(monkeypatch) -> list[int]:
    """The freeze counts seen at each round of a prox-al solve."""
    seen: list[int] = []
    real = heap.resettle

    def spy():
        real()
        seen.append(gc.get_freeze_count())

    monkeypatch.setattr(heap, "resettle", spy)
    monkeypatch.setattr("fedmodel.runtime.base.resettle", spy)
    res = _model().solve(method="prox-al")
    assert res.status == "optimal"
    return seen


def test_a_solve_freezes_the_heap_and_hands_it_back(monkeypatch):
    assert gc.get_freeze_count() == 0
    thresholds = gc.get_threshold()
    seen = _frozen_during_solve(monkeypatch)
    assert seen and min(seen) > 0  # every round ran with the parties frozen
    assert gc.get_freeze_count() == 0 and not heap._SETTLED
    assert gc.get_threshold() == thresholds


def test_a_disabled_collector_is_left_alone(monkeypatch):
    gc.disable()
    try:
        seen = _frozen_during_solve(monkeypatch)
        assert gc.get_freeze_count() == 0 and set(seen) == {0}
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_objects_frozen_by_the_process_stay_frozen(monkeypatch):
    gc.freeze()
    mine = gc.get_freeze_count()
    try:
        seen = _frozen_during_solve(monkeypatch)
        # nothing added, nothing unfrozen (a frozen object may still be freed)
        assert seen and max(seen) <= mine and min(seen) > mine // 2
        assert mine // 2 < gc.get_freeze_count() <= mine
    finally:
        gc.unfreeze()


def test_a_failing_solve_hands_the_heap_back(monkeypatch):
    from fedmodel.algorithms import driver

    def broken(self, start):
        assert gc.get_freeze_count() > 0  # (the parties are built and frozen)
        raise RuntimeError("a bug in the server's loop")

    monkeypatch.setattr(driver._Run, "solve", broken)
    with pytest.raises(RuntimeError, match="a bug in the server's loop"):
        _model().solve(method="prox-al")
    assert gc.get_freeze_count() == 0 and not heap._SETTLED


def test_settled_heap_nests_and_the_outer_owner_unfreezes():
    with heap.settled_heap() as outer:
        assert outer and gc.get_freeze_count() > 0
        with heap.settled_heap() as inner:
            assert inner
        assert heap._SETTLED  # (the inner block did not unfreeze)
    assert gc.get_freeze_count() == 0 and not heap._SETTLED


def test_a_worker_host_freezes_its_parties_and_thaws_on_reset():
    from fedmodel.runtime.host import PartyHost

    host = PartyHost(settles=True)
    assert host.build({}) == {}
    assert heap._SETTLED and gc.get_freeze_count() > 0
    host.reset()
    assert not heap._SETTLED and gc.get_freeze_count() == 0
