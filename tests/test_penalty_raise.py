"""prox-al's adaptive variant raises a defaulted penalty beta where the multipliers crawl
(server.py ``raise_penalty``): a multiplier plateau or a multiplier step that has not
halved over ``PENALTY_WINDOW`` outer iterations; a beta the user set is kept."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import cvxpy as cp
import numpy as np
import scipy.io as sio
from scipy import sparse

import fedmodel as fm
from fedmodel.algorithms.proxal.server import PENALTY_RAISES, PENALTY_WINDOW, ProxALServer

DATA = Path(__file__).resolve().parents[1] / "benchmarks" / "data" / "maros_meszaros"


def _cvxqp3_s(factor: float):
    """Maros-Meszaros CVXQP3_S (100 variables, 75 equality rows) with its objective times
    ``factor``, federated as benchmarks/maros_meszaros.py splits it: the rows over four
    clients, the objective and the variable bounds at the server; and its pooled optimum."""
    raw = sio.loadmat(DATA / "CVXQP3_S.mat")
    n = int(np.asarray(raw["n"]).ravel()[0])
    P = sparse.csc_matrix(raw["P"], dtype=float) * factor
    q = raw["q"].ravel().astype(float) * factor
    A = sparse.csr_matrix(raw["A"], dtype=float)
    lo, up = raw["l"].ravel().astype(float), raw["u"].ravel().astype(float)
    rows = A.shape[0] - n
    assert np.array_equal(lo[:rows], up[:rows])  # (equality rows)
    bounds = (lo[rows:], up[rows:])
    model = fm.Model("cvxqp3_s")
    x = model.variable(n, name="x", bounds=bounds)
    for i, block in enumerate(np.array_split(np.arange(rows), 4)):
        site = model.client(f"client{i}")
        Ai = site.data(A[block], name="A")
        site.subject_to(Ai @ x == lo[block], name="rows")
    model.server.minimize(
        0.5 * cp.quad_form(x, model.server.data(P, name="P"), assume_PSD=True)
        + model.server.data(q, name="q") @ x
    )
    X = cp.Variable(n)
    pooled = cp.Problem(
        cp.Minimize(0.5 * cp.quad_form(X, P, assume_PSD=True) + q @ X),
        [A[:rows] @ X == lo[:rows], X >= bounds[0], X <= bounds[1]],
    )
    pooled.solve(solver=cp.CLARABEL, tol_gap_abs=1e-10, tol_gap_rel=1e-10, tol_feas=1e-10)
    return model, pooled.value, A[:rows], lo[:rows]


def test_a_crawling_multiplier_raises_the_default_beta_and_a_users_beta_is_kept():
    model, f_star, A, b = _cvxqp3_s(30.0)
    res = model.solve(method="prox-al", time_limit=120)
    assert res.status == "optimal", res.message
    raised = res.extra["penalty_raised"]
    assert 1 <= len(raised["after_outer"]) <= PENALTY_RAISES
    beta_start = raised["beta"] / 10.0 ** len(raised["after_outer"])
    # the certificate at eps = 1e-3 with the adaptive variant's kkt_factor margins
    assert abs(res.objective - f_star) <= 1e-3 * max(1.0, abs(f_star))
    assert np.abs(A @ np.asarray(res.x) - b).max() <= 1e-3 * max(1.0, np.abs(b).max())
    # the same beta set by the user is used as given: the multipliers still crawl after
    # twice the outer iterations
    limit = 2 * res.rounds["outer"]
    kept = model.solve(method="prox-al", beta=beta_start, max_outer=limit, time_limit=120)
    assert "penalty_raised" not in kept.extra
    assert kept.status == "max_iterations", kept.message


def _server(history, defaulted=("beta",), raises=(), adaptive=True, objective_units=True):
    return SimpleNamespace(
        dmu_history=list(history),
        plateau_from=0,
        penalty_raises=list(raises),
        beta=100.0,
        convex=True,
        inner=SimpleNamespace(objective_units=objective_units),
        options=SimpleNamespace(eps2=1e-6, adaptive=adaptive, _defaulted=set(defaulted)),
    )


def test_the_rule_reads_the_multiplier_steps_since_beta_last_changed():
    n = PENALTY_WINDOW
    crawling = [100.0 * 0.95**k for k in range(n + 1)]
    halving = [100.0 * 0.5**k for k in range(n + 1)]
    assert ProxALServer.multipliers_slow(_server(crawling))
    assert not ProxALServer.multipliers_slow(_server(halving))
    assert not ProxALServer.multipliers_slow(_server(crawling[:-1]))  # (too short)
    assert not ProxALServer.multipliers_slow(_server([1e-5] * (n + 1)))  # (below beta eps2)
    fresh = _server([100.0] * 3 + crawling[:2])
    fresh.plateau_from = 3  # (beta changed after the third outer iteration)
    assert not ProxALServer.multipliers_slow(fresh)
    assert ProxALServer.may_raise_penalty(_server(crawling))
    assert not ProxALServer.may_raise_penalty(_server(crawling, defaulted=()))
    assert not ProxALServer.may_raise_penalty(_server(crawling, adaptive=False))
    # (Algorithm 2 and exact-admm have no units round: their beta stays)
    assert not ProxALServer.may_raise_penalty(_server(crawling, objective_units=False))
    assert not ProxALServer.may_raise_penalty(_server(crawling, raises=range(PENALTY_RAISES)))


def test_a_raise_restarts_the_outer_anderson_memory_of_the_clients_too(monkeypatch):
    # CVXQP3_S's rows over four clients, without its bounds (a smooth h: the Newton inner
    # solver, whose outer Anderson step is on); beta raised once, after outer iteration 2,
    # whatever the multipliers do. The server's memory restarts at a raise; a client that
    # kept its Gram rows would send longer rows than the server's memory holds.
    raw = sio.loadmat(DATA / "CVXQP3_S.mat")
    n = int(np.asarray(raw["n"]).ravel()[0])
    P = sparse.csc_matrix(raw["P"], dtype=float) * 30.0
    q = raw["q"].ravel().astype(float) * 30.0
    A = sparse.csr_matrix(raw["A"], dtype=float)
    b = raw["l"].ravel().astype(float)[: A.shape[0] - n]
    A = A[: b.size]
    model = fm.Model("cvxqp3_s_free")
    x = model.variable(n, name="x")
    for i, block in enumerate(np.array_split(np.arange(b.size), 4)):
        site = model.client(f"client{i}")
        site.subject_to(site.data(A[block], name="A") @ x == b[block], name="rows")
    model.server.minimize(
        0.5 * cp.quad_form(x, model.server.data(P, name="P"), assume_PSD=True)
        + model.server.data(q, name="q") @ x
    )
    X = cp.Variable(n)
    pooled = cp.Problem(
        cp.Minimize(0.5 * cp.quad_form(X, P, assume_PSD=True) + q @ X), [A @ X == b]
    )
    pooled.solve(solver=cp.CLARABEL)
    monkeypatch.setattr(ProxALServer, "multipliers_slow", lambda self: self.k == 2)
    monkeypatch.setattr(ProxALServer, "may_raise_penalty", lambda self: not self.penalty_raises)
    res = model.solve(method="prox-al", inner_solver="newton", reveal=["hessian"], time_limit=60)
    assert res.extra["inner_solver_options"]["outer_anderson"] > 0
    assert res.extra["penalty_raised"]["after_outer"] == [2]
    assert res.status == "optimal", res.message
    assert abs(res.objective - pooled.value) <= 1e-3 * max(1.0, abs(pooled.value))
