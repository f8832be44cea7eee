"""Runs cut by their ``time_limit`` say so (status ``"time_limit"``) and return a point.

Timing itself is measured by ``benchmarks/time_limits.py``, never asserted here: these
tests give a limit already past when the first step starts, so the outcome does not
depend on the machine's speed.
"""

from __future__ import annotations

import cvxpy as cp
import numpy as np
import pytest
from problems import logistic_clients


def _logistic(n=3, rows=8, d=20, seed=5):
    m, w = logistic_clients(n, rows, d, seed)
    m.server.minimize(0.1 * cp.sum_squares(w))
    return m


def test_admm_cut_by_its_deadline_says_time_limit_not_max_iterations():
    """admm is one run of Algorithm 2: stopped inside it by the deadline, the run ends with
    status time_limit (it said max_iterations)."""
    res = _logistic().solve("admm", time_limit=1e-9)
    assert res.status == "time_limit", (res.status, res.message)
    assert "time limit" in res.message
    assert np.all(np.isfinite(np.asarray(res.solution["w"], dtype=float)))


@pytest.mark.parametrize(
    "method, module",
    [
        ("fedprox", "fedmodel.algorithms.baselines.fedavg"),
        ("dald-cc", "fedmodel.algorithms.dald.client"),
    ],
)
def test_local_steps_get_the_time_left_as_their_budget(method, module, monkeypatch):
    """fedprox's and dald-cc's local solves get a budget (the time left, shared among the
    clients that run one after another: 0 here) and the run ends with status time_limit."""
    import importlib

    mod = importlib.import_module(module)
    budgets = []
    original = mod.step_deadline

    def spy(budget, who):
        budgets.append(budget)
        return original(budget, who)

    monkeypatch.setattr(mod, "step_deadline", spy)
    res = _logistic().solve(method, time_limit=1e-9)
    assert res.status == "time_limit", (res.status, res.message)
    assert budgets and all(b == 0.0 for b in budgets), budgets
    assert np.all(np.isfinite(np.asarray(res.solution["w"], dtype=float)))


@pytest.mark.parametrize("method", ["prox-al", "admm"])
def test_a_run_cut_by_its_deadline_says_how_to_resume_and_resumes(method, tmp_path):
    """The time_limit checkpoint holds the point before the step the deadline cut: the
    message names it (``resume=...``) and a resumed run with time to spare finishes."""
    model = _logistic()
    ck = tmp_path / "ck"
    res = model.solve(method, time_limit=1e-9, checkpoint=ck, history=False)
    assert res.status == "time_limit"
    assert f"resume={str(ck)!r}" in res.message, res.message
    again = model.solve(method, resume=ck, history=False)
    assert again.status == "optimal", again.message
