"""The method-of-multipliers exact step (subproblems/multipliers.py) against cvxpy."""

import cvxpy as cp
import numpy as np
import pytest

import fedmodel as fm
from fedmodel.subproblems.conic_prox import exact_prox_solver
from fedmodel.subproblems.merit import MeritProblem
from fedmodel.subproblems.multipliers import MultiplierSolver


def _np_client(seed=0, rows=40, d=4, r=0.6):
    """A Neyman-Pearson-type party: logistic loss on class 0, logistic constraint on class 1."""
    rng = np.random.default_rng(seed)
    A0, A1 = rng.normal(size=(rows, d)), rng.normal(size=(rows, d)) + 0.5
    m = fm.Model("np")
    w = m.variable(d, name="w")
    c = m.client("c")
    c.minimize(cp.sum(cp.logistic(c.data(A0, name="A0") @ w)) / rows)
    c.subject_to(cp.sum(cp.logistic(-(c.data(A1, name="A1") @ w))) / rows <= r, name="class 1")
    return m, (A0, A1, rows, d, r)


@pytest.mark.parametrize("sigma", [1e-3, 1.0])
def test_the_multiplier_step_is_the_exact_constrained_minimiser(sigma):
    model, (A0, A1, rows, d, r) = _np_client()
    program = model.compile().clients[0]
    problem = MeritProblem([program], beta=100.0)
    center = np.linspace(-1, 1, d)
    problem.set(sigma=sigma, center=center)
    solver = exact_prox_solver(problem)
    assert isinstance(solver, MultiplierSolver)  # (exponential-cone terms: not Clarabel)
    report = solver.solve(np.zeros(d), 1e-8)
    x = cp.Variable(d)
    con = cp.sum(cp.logistic(-(A1 @ x))) / rows <= r
    ref = cp.Problem(
        cp.Minimize(cp.sum(cp.logistic(A0 @ x)) / rows + sigma / 2 * cp.sum_squares(x - center)),
        [con],
    )
    ref.solve(solver="CLARABEL", tol_gap_abs=1e-10, tol_gap_rel=1e-10, tol_feas=1e-10)
    assert ref.status == "optimal" and con.dual_value > 1e-3  # (the constraint is active)
    # both exact to ~1e-8: the minimiser of a sigma-strongly convex problem within
    # ~sqrt(1e-8 / sigma) at worst, the multiplier likewise
    assert np.allclose(report.x, x.value, atol=1e-4)
    assert problem.mu[0][0] == pytest.approx(float(con.dual_value), rel=1e-3, abs=1e-6)
    assert report.residual <= 1e-8


def test_exact_admm_with_multiplier_steps_matches_the_pooled_optimum():
    model, _ = _np_client(seed=1)
    c2 = model.client("c2")
    rng = np.random.default_rng(5)
    w = model.variables[0]
    B = rng.normal(size=(30, 4))
    c2.minimize(cp.sum(cp.logistic(c2.data(B, name="B") @ w)) / 30)
    ref = model.solve(method="centralized", eps=1e-7)
    res = model.solve(method="prox-al", inner_solver="exact-admm", eps=1e-4, history=False)
    assert res.status == "optimal"
    assert res.objective == pytest.approx(ref.objective, rel=1e-3, abs=1e-4)


def test_the_multiplier_step_honours_its_deadline():
    """A deadline given to the step (``set_deadline``, exact-admm's time budget) reaches
    the Newton solves, and a deadline already past stops the loop after one update, with
    the violation it reached as its residual."""
    import time

    from fedmodel.subproblems.merit import set_deadline

    model, _ = _np_client()
    problem = MeritProblem([model.compile().clients[0]], beta=100.0)
    problem.set(sigma=1e-3, center=np.zeros(4))
    solver = MultiplierSolver(problem)
    set_deadline(solver, time.perf_counter() - 1.0)
    assert solver.newton.deadline == solver.deadline
    report = solver.solve(np.zeros(4), 1e-12)
    assert solver.updates == 1
    assert report.residual > 1e-12  # (not converged, and says so)
    set_deadline(solver, None)
    assert solver.solve(report.x, 1e-9).residual <= 1e-9
