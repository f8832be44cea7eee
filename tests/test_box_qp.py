"""The exact box-constrained QP step (subproblems/box_qp.py) and its use as
prox-quasi-newton's model step when h is bounds and sums of squares."""

from __future__ import annotations

import cvxpy as cp
import numpy as np
import pytest

import fedmodel as fm
from fedmodel.algorithms.proxal.prox_newton import ModelOperator, model_step
from fedmodel.compiler.regularizer import Regularizer, VariablePiece
from fedmodel.subproblems.box_qp import BOX_QP_MAX_ITER, box_qp


def _random_qp(n, cond, seed):
    rng = np.random.default_rng(seed)
    U, _ = np.linalg.qr(rng.standard_normal((n, n)))
    Q = U @ np.diag(np.logspace(0, np.log10(cond), n)) @ U.T
    Q = (Q + Q.T) / 2
    c = rng.standard_normal(n) * cond / 10
    lo = np.where(rng.random(n) < 0.2, -np.inf, -rng.random(n))
    hi = np.where(rng.random(n) < 0.2, np.inf, rng.random(n))
    return Q, c, lo, hi


@pytest.mark.parametrize("seed", range(5))
def test_box_qp_matches_clarabel_on_ill_conditioned_problems(seed):
    Q, c, lo, hi = _random_qp(40, 1e6, seed)
    x, iterations, _ = box_qp(Q, c, lo, hi)
    X = cp.Variable(40)
    cons = [X[np.isfinite(lo)] >= lo[np.isfinite(lo)], X[np.isfinite(hi)] <= hi[np.isfinite(hi)]]
    prob = cp.Problem(cp.Minimize(0.5 * cp.quad_form(X, cp.psd_wrap(Q)) + c @ X), cons)
    prob.solve(solver="CLARABEL", tol_gap_abs=1e-12, tol_gap_rel=1e-12, tol_feas=1e-12)
    f = 0.5 * x @ Q @ x + c @ x
    assert np.all(x >= lo) and np.all(x <= hi)
    assert f <= prob.value + 1e-8 * max(1.0, abs(prob.value))
    assert iterations < 50


def test_model_step_on_a_box_is_exact_whatever_the_conditioning():
    """An augmented-Lagrangian penalty of 1e5 makes the quadratic model ill conditioned:
    the accelerated proximal-gradient loop stopped at its 2,000-iteration cap short of the
    tolerance (~1.4 s a round on Maros-Meszaros CVXQP1_S); the box QP meets it."""
    Q, c, lo, hi = _random_qp(60, 1e7, 7)
    reg = Regularizer.from_pieces(
        [slice(0, 60)], [VariablePiece(lower=lo, upper=hi, has_box=True, sumsq=0.25)]
    )
    w = np.clip(np.zeros(60), lo, hi)
    g = Q @ w + c
    tol = 1e-9 * np.abs(g).max()  # (g ~ 1e6: rounding of Q x at cond 1e7 is ~1e-8)
    x, residual, iterations = model_step(g, ModelOperator(Q), reg, w, tol=tol)
    assert residual <= tol
    assert iterations < 50
    assert residual == pytest.approx(reg.dist_subdiff(x, g + Q @ (x - w)))


def test_a_settled_box_qp_ends_the_model_step_below_its_tolerance():
    """A tolerance below the rounding of an ill-conditioned model (Maros-Meszaros CVXQP3_M
    at eps 1e-6, after beta's raise): the settled active-set point is the step; the
    accelerated proximal-gradient loop ran its 2,000 iterations without a smaller residual
    (14 of a 40 s run's 23 s of model steps)."""

    class Counted(ModelOperator):
        products = 0

        def times(self, v):
            Counted.products += 1
            return super().times(v)

    Q, c, lo, hi = _random_qp(60, 1e7, 7)
    reg = Regularizer.from_pieces(
        [slice(0, 60)], [VariablePiece(lower=lo, upper=hi, has_box=True, sumsq=0.25)]
    )
    w = np.clip(np.zeros(60), lo, hi)
    g = Q @ w + c
    x, residual, iterations = model_step(g, Counted(Q), reg, w, tol=0.0)
    assert residual > 0.0  # (rounding: the tolerance is not met)
    assert iterations < BOX_QP_MAX_ITER and Counted.products <= 1
    exact, _, _ = box_qp(Q + 0.5 * np.eye(60), g - Q @ w, lo, hi, x0=w)
    assert np.array_equal(x, exact)


def test_a_quadratic_step_over_a_box_is_solved_exactly_by_the_box_qp_backend():
    """The server of a federated QP (Maros-Meszaros, server-objective: 1/2 x'Px + q'x and
    the variable bounds) took L-BFGS-B for its exact-admm step; it is one box QP."""
    from fedmodel.subproblems.box_qp import BoxQuadraticSolver
    from fedmodel.subproblems.merit import MeritProblem
    from fedmodel.subproblems.select import make_solver

    Q, c, lo, hi = _random_qp(30, 1e4, 3)
    m = fm.Model("box-qp")
    x = m.variable(30, name="x", bounds=(lo, hi))
    m.server.minimize(0.5 * cp.quad_form(x, cp.psd_wrap(Q)) + c @ x)
    m.client("c").subject_to(cp.sum(x) <= 100.0)
    compiled = m.compile()
    problem = MeritProblem([compiled.server], 1.0, compiled.regularizer)
    rng = np.random.default_rng(0)
    center = rng.standard_normal(30)
    problem.set(sigma=2.0, center=center)
    solver = make_solver(problem)
    assert isinstance(solver, BoxQuadraticSolver)
    report = solver.solve(np.zeros(30), 1e-9 * np.abs(c).max())
    assert report.backend == "box-qp" and report.converged
    expected, _, _ = box_qp(Q + 2.0 * np.eye(30), c - 2.0 * center, lo, hi)
    assert np.allclose(report.x, expected, atol=1e-9)


def test_a_cycling_active_set_is_finished_by_the_interior_point_method():
    """A principal block (17 variables, x >= 0) of a secant model prox-quasi-newton built
    on Maros-Meszaros QSCSD1, kept to 6 digits: its primal-dual active-set guesses never
    repeat within the cap; the interior-point solve gives the minimiser (Clarabel on the
    problem as cvxpy states it agrees), where the last guess's point is ~1e4 off in its KKT
    residual, and the loop from the interior point (the polish) repeats its guess: the
    point is exact (settled)."""
    from pathlib import Path

    from fedmodel.subproblems.box_qp import _active_set_loop, kkt_residual

    data = np.load(Path(__file__).parent / "data" / "box_qp_cycle.npz")
    Q, c, lo, hi = data["Q"], data["c"], data["lo"], data["hi"]
    _, cycle, repeated = _active_set_loop(Q, c, lo, hi, np.clip(np.zeros(c.size), lo, hi), 50)
    assert cycle == BOX_QP_MAX_ITER and not repeated  # (no repeated guess from 0)
    x, iterations, exact = box_qp(Q, c, lo, hi)
    assert exact  # (the polish's)
    assert kkt_residual(Q, c, lo, hi, x) <= 1e-9 * np.abs(c).max()
    X = cp.Variable(c.size)
    pooled = cp.Problem(cp.Minimize(0.5 * cp.quad_form(X, Q, assume_PSD=True) + c @ X), [X >= lo])
    pooled.solve(solver="CLARABEL")
    assert 0.5 * x @ Q @ x + c @ x <= pooled.value + 1e-8 * abs(pooled.value)


_FORKED_AFTER_A_PARALLEL_CLARABEL = """
import multiprocessing as mp, sys
import clarabel, numpy as np, scipy.sparse as sp
from fedmodel.subproblems.box_qp import box_qp_interior

n = 500
rng = np.random.default_rng(0)
M = rng.standard_normal((n, n))
Q, c, lo, hi = M @ M.T + np.eye(n), rng.standard_normal(n), -np.ones(n), np.ones(n)
# a solve at Clarabel's defaults (all threads) starts its thread pool in this process
settings = clarabel.DefaultSettings()
settings.verbose = False
eye = sp.eye(n, format="csc")
cone = [clarabel.NonnegativeConeT(2 * n)]
A, b = sp.vstack([-eye, eye]).tocsc(), np.ones(2 * n)
clarabel.DefaultSolver(sp.csc_matrix(np.triu(Q)), c, A, b, cone, settings).solve()

def child(conn):
    conn.send(box_qp_interior(Q, c, lo, hi))

ctx = mp.get_context("fork")
recv, send = ctx.Pipe(duplex=False)
proc = ctx.Process(target=child, args=(send,))
proc.start()
x = recv.recv() if recv.poll(float(sys.argv[1])) else None
proc.kill()
proc.join()
print("hung" if x is None else np.abs(x - np.clip(x - (Q @ x + c), lo, hi)).max())
"""


def test_the_interior_point_finish_runs_in_a_process_forked_after_a_parallel_solve():
    """A parallel Clarabel factorisation in a process forked from one whose Clarabel
    thread pool is running waits for the pool's threads, which the fork did not copy:
    the interior-point finish, on one thread, solves there (a 500-variable dense box QP,
    the size at which Clarabel factorises in parallel)."""
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", _FORKED_AFTER_A_PARALLEL_CLARABEL, "60"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() != "hung"
    assert float(out.stdout) <= 1e-7
