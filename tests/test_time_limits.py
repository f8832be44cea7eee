"""Runs cut by their ``time_limit`` say so (status ``"time_limit"``) and return a point.

Timing itself is measured by ``benchmarks/time_limits.py``, never asserted here: these
tests give a limit already past when the first step starts, so the outcome does not
depend on the machine's speed.
"""

from __future__ import annotations

import cvxpy as cp
import numpy as np

import fedmodel as fm


def _logistic(n=3, rows=8, d=20, seed=5):
    rng = np.random.default_rng(seed)
    m = fm.Model("logistic")
    w = m.variable(d, name="w")
    for k in range(n):
        X = rng.normal(size=(rows, d))
        y = np.sign(rng.normal(size=rows))
        c = m.client(f"c{k}")
        c.minimize(cp.sum(cp.logistic(-cp.multiply(c.data(y, name="y"), c.data(X, name="X") @ w))))
    m.server.minimize(0.1 * cp.sum_squares(w))
    return m


def test_admm_cut_by_its_deadline_says_time_limit_not_max_iterations():
    """admm is one run of Algorithm 2: stopped inside it by the deadline, the run ends with
    status time_limit (it said max_iterations)."""
    res = _logistic().solve("admm", time_limit=1e-9)
    assert res.status == "time_limit", (res.status, res.message)
    assert "time limit" in res.message
    assert np.all(np.isfinite(np.asarray(res.solution["w"], dtype=float)))
