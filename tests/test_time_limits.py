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
        ("admm", "fedmodel.algorithms.proxal.admm_inner"),
    ],
)
def test_local_steps_get_the_time_left_as_their_budget(method, module, monkeypatch):
    """fedprox's, dald-cc's and Algorithm 2's local solves get a budget (the time left,
    shared among the clients that run one after another: 0 here) and the run ends with
    status time_limit."""
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


@pytest.mark.parametrize("kind", ["prox-grad", "gd", "newton", "sgd", "bfgs"])
def test_iterative_local_solvers_stop_at_their_deadline(kind):
    """The local solvers other than "exact" check the owner's deadline between their own
    steps, not only between repeats: with many steps asked and the deadline already
    past, a solve takes exactly one step (it always moves), and without a deadline it takes
    the steps asked."""
    import time

    from fedmodel.algorithms.local import LocalProblem

    compiled = _logistic(n=1).compile()
    program = next(p for p in compiled.parties if p.name != "server")
    many = {"local_steps": 10**5, "local_max_iter": 10**5, "local_tol": 0.0}
    lp = LocalProblem(program, compiled.regularizer, None, local_solver=kind, **many)
    x0 = np.zeros(lp.n)
    lp.set_quadratic(1.0, x0)
    lp.deadline = time.perf_counter()
    x = lp.solve(x0, repeat=3)
    assert lp.stats.iterations == 1, lp.stats
    assert np.all(np.isfinite(x)) and not np.array_equal(x, x0)

    lp = LocalProblem(program, compiled.regularizer, None, local_solver=kind, local_steps=3)
    lp.set_quadratic(1.0, x0)
    lp.solve(x0)
    if kind == "bfgs":  # (its own stopping test ends it; more than the one step above)
        assert lp.stats.iterations > 1, lp.stats
    else:
        assert lp.stats.iterations == 3, lp.stats


@pytest.mark.timing
@pytest.mark.parametrize("method", ["prox-al", "centralized"])
def test_the_time_limit_counts_the_models_compile(method, monkeypatch):
    """``time_limit`` covers the whole ``model.solve`` call, its compile included (a user's
    clock starts there): a compile that takes longer than the limit leaves the solve no
    time, and the run ends with status time_limit (it had the whole limit after the compile,
    enough for this model, and said "optimal")."""
    import time

    import fedmodel as fm

    model = _logistic()
    compile_model = fm.Model.compile

    def slow_compile(self, *args, **kwargs):
        time.sleep(0.5)
        return compile_model(self, *args, **kwargs)

    monkeypatch.setattr(fm.Model, "compile", slow_compile)
    res = model.solve(method, time_limit=0.4)
    assert res.status == "time_limit", (res.status, res.message)
    assert np.all(np.isfinite(np.asarray(res.solution["w"], dtype=float)))
