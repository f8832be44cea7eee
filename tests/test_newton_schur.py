"""The Newton backend's Schur complement for epigraph variables (hinge-type terms).

A hinge term becomes one epigraph variable per data row, each in its own constraint rows,
so the quadratic merit function's Hessian has a diagonal block for them; the backend then
factors only the small block of the other unknowns. These tests check that the block is
found, and that the Schur path gives the same Newton steps and solutions as the dense
Cholesky path (what it replaces) and a model solve certified against plain cvxpy.
"""

from __future__ import annotations

import cvxpy as cp
import numpy as np
import pytest

import fedmodel as fm
from fedmodel.subproblems import newton
from fedmodel.subproblems.merit import MeritProblem
from fedmodel.subproblems.newton import NewtonSolver, _SchurFactor


def _svm(rows=60, d=4, seed=0, pinball=False):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(rows, d))
    labels = np.sign(X @ rng.normal(size=d) + 0.3 * rng.normal(size=rows))
    model = fm.Model("svm")
    w = model.variable(d, name="w")
    model.server.minimize(0.05 * cp.sum_squares(w))
    site = model.client("c0")
    Xd, yd = site.data(X, name="X"), site.data(labels, name="y")
    if pinball:  # two epigraph pieces per row (maximum), plus a smooth square term
        r = Xd @ w - yd
        site.minimize(cp.sum(cp.maximum(0.3 * r, -0.7 * r)) / rows + cp.sum_squares(r) / rows)
    else:
        site.minimize(cp.sum(cp.pos(1 - cp.multiply(yd, Xd @ w))) / rows, name="hinge")
    return model, X, labels


def _client_problem(model, beta=0.7, sigma=0.9, seed=1):
    prog = model.compile().clients[0].local()
    problem = MeritProblem([prog], beta)
    rng = np.random.default_rng(seed)
    problem.set(sigma=sigma, center=rng.normal(size=problem.n), mu=[rng.random(prog.m_ineq)])
    return problem


@pytest.mark.parametrize("pinball", [False, True])
def test_epigraph_block_is_found_and_steps_match_the_dense_solve(pinball):
    model, X, _ = _svm(pinball=pinball)
    problem = _client_problem(model)
    solver = NewtonSolver(problem)
    assert solver.quadratic and solver._schur is not None
    assert solver._schur["T"].size == X.shape[0]  # one epigraph variable per row
    rng = np.random.default_rng(2)
    x = rng.normal(size=problem.n)
    solver._m_in = solver._multipliers(solver.gather_in, problem.mu)  # as solve() does
    solver._m_eq = solver._multipliers(solver.gather_eq, problem.nu)
    st = solver._evaluate(x)
    assert 0 < st.act.sum() < st.act.size  # a mixed active set
    schur = solver._schur_factor(st.act)
    assert isinstance(schur, _SchurFactor)
    H = solver._quadratic_hessian(st)
    H = np.triu(H) + np.triu(H, 1).T  # the dense path reads the upper triangle
    g = rng.normal(size=problem.n)
    np.testing.assert_allclose(H @ schur.solve(g), g, rtol=0, atol=1e-9 * np.abs(g).max())


def test_schur_and_dense_solves_agree(monkeypatch):
    model, _, _ = _svm(rows=80)
    problem = _client_problem(model)
    x_schur = NewtonSolver(problem).solve(np.zeros(problem.n), 1e-10).x
    monkeypatch.setattr(newton, "SCHUR_MIN_BLOCK", 10**9)
    dense = NewtonSolver(problem)
    assert dense._schur is None
    report = dense.solve(np.zeros(problem.n), 1e-10)
    assert report.converged
    np.testing.assert_allclose(x_schur, report.x, atol=1e-8)


def test_svm_with_the_schur_path_matches_plain_cvxpy():
    model, X, labels = _svm(rows=120)
    res = model.solve(method="prox-al", eps=1e-5)
    W = cp.Variable(X.shape[1])
    ref = cp.Problem(
        cp.Minimize(0.05 * cp.sum_squares(W) + cp.sum(cp.pos(1 - cp.multiply(labels, X @ W))) / 120)
    )
    ref.solve(solver="CLARABEL", tol_gap_abs=1e-10, tol_gap_rel=1e-10, tol_feas=1e-10)
    assert res.status == "optimal"
    assert abs(res.objective - ref.value) / max(1.0, abs(ref.value)) <= 1e-4
