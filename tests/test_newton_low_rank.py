"""The Newton backend's Woodbury steps when a party has far fewer rows than unknowns.

A GLM client's Newton matrix is a positive diagonal (the proximal and ADMM terms) plus
one weighted row per data row and per active augmented-Lagrangian row; with ``m`` rows
and ``n >> m`` unknowns the backend solves the Newton system through an ``m x m``
factor (the Woodbury identity) instead of a dense ``n x n`` Cholesky factor. Both are
exact linear solves, so the steps agree to rounding (relative 1e-9 on these well
conditioned instances) and full solves to the solver's tolerance.
"""

from __future__ import annotations

import cvxpy as cp
import numpy as np
import pytest
import scipy.sparse as sp

import fedmodel as fm
from fedmodel.subproblems.merit import MeritProblem
from fedmodel.subproblems.newton import NewtonSolver, _WoodburyFactor

SIGMA = 0.5
TOL = 1e-10


def _client(rows, d, sparse, seed=0):
    """Logistic loss on ``rows`` rows, a diagonal square term, an l2 ball (a non-affine
    inequality), an equality and affine inequalities (active at the centre)."""
    rng = np.random.default_rng(seed)
    if sparse:
        X = sp.random(rows, d, density=0.05, random_state=seed, format="csr")
    else:
        X = rng.normal(size=(rows, d))
    y = np.sign(rng.normal(size=rows))
    m = fm.Model("low-rank")
    w = m.variable(d, name="w")
    c = m.client("c")
    Xd, yd = c.data(X, name="X"), c.data(y, name="y")
    c.minimize(cp.sum(cp.logistic(-cp.multiply(yd, Xd @ w))) + 0.1 * cp.sum_squares(w[:5]))
    c.subject_to([cp.sum_squares(w) <= 1.0, cp.sum(w[:10]) == 0.2, w[:8] <= 0.01])
    return m.compile().clients[0]


def _solver(prog, low_rank, seed=1):
    rng = np.random.default_rng(seed)
    p = MeritProblem([prog], 10.0)
    center = 0.3 + 0.1 * rng.normal(size=prog.layout.size)
    p.set(sigma=SIGMA, center=center, mu=[np.full(prog.m_ineq, 0.5)], nu=[np.ones(prog.m_eq)])
    s = NewtonSolver(p)
    s.low_rank = low_rank
    return s


@pytest.mark.parametrize("sparse", [False, True])
def test_woodbury_steps_equal_the_dense_newton_steps(sparse):
    prog = _client(rows=20, d=200, sparse=sparse)
    x = np.random.default_rng(2).normal(size=200) * 0.2
    steps = {}
    for low_rank in (False, True):
        s = _solver(prog, low_rank)
        s._m_in = s._multipliers(s.gather_in, s.problem.mu)
        s._m_eq = s._multipliers(s.gather_eq, s.problem.nu)
        st = s._evaluate(x)
        assert st.act is not None and st.act.any() and st.comps  # AL rows are in the matrix
        steps[low_rank], _ = s._step(st, refresh=True)
        assert isinstance(s._factor, _WoodburyFactor) == low_rank
        if low_rank:  # sparse data stays sparse in the factor's rows
            assert sp.issparse(s._factor.B) == sparse
    rel = np.linalg.norm(steps[True] - steps[False]) / np.linalg.norm(steps[False])
    assert rel <= 1e-9, rel


@pytest.mark.parametrize("sparse", [False, True])
def test_woodbury_and_dense_solves_agree_to_the_tolerance(sparse):
    prog = _client(rows=20, d=200, sparse=sparse)
    reports = {}
    for low_rank in (False, None):  # None: picked automatically (20 + AL rows << 200)
        s = _solver(prog, low_rank)
        reports[low_rank] = s.solve(np.zeros(200), TOL)
        assert reports[low_rank].converged, reports[low_rank]
        assert (s.low_rank_steps > 0) == (low_rank is None)
    # phi is SIGMA-strongly convex: ||x - x*|| <= ||grad phi(x)||_2 / SIGMA for each point
    bound = 2 * np.sqrt(200) * TOL / SIGMA
    assert np.linalg.norm(reports[None].x - reports[False].x) <= bound


@pytest.mark.parametrize("sparse", [False, True])
def test_plain_glm_client_reuses_its_rows_gram_and_agrees_with_dense(sparse):
    """A client with data rows only (uniform diagonal: the proximal term): the stacked rows
    and their Gram matrix are computed once and reused by every later factorisation."""
    rng = np.random.default_rng(3)
    d, rows = 300, 25
    X = sp.random(rows, d, density=0.05, random_state=3, format="csr") if sparse else (
        rng.normal(size=(rows, d)))  # fmt: skip
    m = fm.Model("plain")
    w = m.variable(d, name="w")
    c = m.client("c")
    c.minimize(cp.sum(cp.logistic(c.data(X, name="X") @ w - 1.0)))
    prog = m.compile().clients[0]
    xs = {}
    for low_rank in (False, None):
        s = _solver(prog, low_rank)
        for k in range(2):  # a second solve from a shifted centre (an ADMM round)
            s.problem.set(
                sigma=SIGMA, center=np.full(d, 0.3 + k), mu=[np.zeros(0)], nu=[np.zeros(0)]
            )
            report = s.solve(np.zeros(d), TOL)
            assert report.converged
        xs[low_rank] = report.x
        if low_rank is None:
            assert s.low_rank_steps >= 2 and len(s._low_rank_rows) == 1
            ((B, gram),) = s._low_rank_rows.values()
            assert gram is not None and sp.issparse(B) == sparse
    assert np.linalg.norm(xs[None] - xs[False]) <= 2 * np.sqrt(d) * TOL / SIGMA


def test_dense_steps_when_the_rows_are_not_few():
    """100 data rows against 200 unknowns: above LOW_RANK_RATIO, the dense factor."""
    s = _solver(_client(rows=100, d=200, sparse=False), None)
    assert s.solve(np.zeros(200), TOL).converged
    assert s.low_rank_steps == 0 and s.factorizations > 0
