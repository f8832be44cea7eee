"""prox-al's O(d) quasi-Newton inner solver with Hessian-vector products (issue 23): the
exact products of the Newton backend, the block-BFGS model, the limited-memory model,
sparse client data kept sparse, and the time limit inside the inner loops."""

from __future__ import annotations

import os
import sys
import time

import cvxpy as cp
import numpy as np
import pytest
import scipy.sparse as sparse

import fedmodel as fm
from fedmodel.algorithms.proxal.newton_inner import (
    LimitedSecantModel,
    SecantModel,
    conjugate_pairs,
)
from fedmodel.compiler.glm import GLMTerm
from fedmodel.runtime.faults import Fault
from fedmodel.subproblems.merit import MeritProblem
from fedmodel.subproblems.newton import NewtonSolver

sys.path.insert(0, os.path.dirname(__file__))
from problems import CLARABEL_TIGHT, np_model  # noqa: E402


def logistic_ball(X_parts, y_parts, radius=0.5):
    """Logistic loss over the clients' rows (dense or scipy.sparse), an l2 ball at the
    server: the model and the same pooled problem in plain cvxpy."""
    d = X_parts[0].shape[1]
    N = sum(len(y) for y in y_parts)
    m = fm.Model("logistic-ball")
    w = m.variable(d, name="w")
    W = cp.Variable(d)
    pooled = 0
    for k, (X, y) in enumerate(zip(X_parts, y_parts)):
        c = m.client(f"c{k}")
        Xd, yd = c.data(X, name="X"), c.data(y, name="y")
        c.minimize(cp.sum(cp.logistic(-cp.multiply(yd, Xd @ w))) / N)
        pooled = pooled + cp.sum(cp.logistic(-cp.multiply(y, X @ W))) / N
    m.server.subject_to([cp.norm(w, 2) <= radius])
    prob = cp.Problem(cp.Minimize(pooled), [cp.norm(W, 2) <= radius])
    return m, prob


def sparse_parts(n=3, rows=30, d=40, density=0.1, seed=0):
    rng = np.random.default_rng(seed)
    X = sparse.random(n * rows, d, density=density, format="csr", random_state=seed)
    X.data = rng.normal(size=X.nnz) * 3.0
    w0 = rng.normal(size=d)
    y = np.where(X @ w0 + 0.3 * rng.normal(size=n * rows) > 0, 1.0, -1.0)
    return [X[i * rows : (i + 1) * rows] for i in range(n)], [
        y[i * rows : (i + 1) * rows] for i in range(n)
    ]


def test_products_are_the_hessian_times_the_directions():
    """NewtonSolver.products gives H V without forming H: equal to derivatives()' H @ V,
    with the augmented-Lagrangian term of an active constraint included."""
    model = np_model(2, seed=3)
    client = model.compile().clients[0]
    solver = NewtonSolver(MeritProblem([client], 10.0))
    rng = np.random.default_rng(0)
    x = rng.normal(size=solver.n)
    mu = [np.array([0.7])]  # (an active constraint: its AL curvature is in H)
    V = rng.normal(size=(solver.n, 3))
    val, g, H = solver.derivatives(x, mu, [np.zeros(0)])
    val2, g2, HV = solver.products(x, mu, [np.zeros(0)], V)
    assert val2 == pytest.approx(val, rel=1e-14)
    assert np.allclose(g2, g, rtol=1e-13, atol=1e-15)
    assert np.allclose(HV, H @ V, rtol=1e-12, atol=1e-14)


def test_block_bfgs_takes_every_exact_pair_and_the_limited_model_solves_with_them():
    rng = np.random.default_rng(1)
    A = rng.normal(size=(6, 6))
    H = A @ A.T + 0.5 * np.eye(6)
    V = np.linalg.qr(rng.normal(size=(6, 3)))[0].T  # 3 orthonormal directions
    Y = V @ H
    pairs = conjugate_pairs(V, Y)
    assert len(pairs) == 3
    C = np.array([[s @ y for _, y in pairs] for s, _ in pairs])
    assert np.allclose(C - np.diag(np.diag(C)), 0.0, atol=1e-12)  # H-conjugate
    dense = SecantModel(6)
    assert dense.observe_products(V, Y)
    assert np.allclose(V @ dense.matrix, Y, atol=1e-10)  # B V = H V for every direction
    assert np.all(np.linalg.eigvalsh(dense.matrix) > 0)
    # the limited-memory form with a full basis of pairs inverts H exactly
    limited = LimitedSecantModel(6)
    Q = np.linalg.qr(rng.normal(size=(6, 6)))[0].T
    limited.observe_products(Q, Q @ H)
    g = rng.normal(size=6)
    known = np.full(6, 0.25)
    view = limited.view(known, g)
    step = view.solve(g)
    assert np.allclose((H + np.diag(known)) @ step, g, atol=1e-9)
    assert np.allclose(view.times(step), g, atol=1e-9)  # B v, the damping's product


def test_the_limited_model_damps_a_secant_pair_like_the_dense_one():
    """Powell's damping needs B s: the limited model computes it by the direct recursion
    and keeps s^T y >= 0.2 s^T B s, as the dense model does (same pairs, same B_0)."""
    rng = np.random.default_rng(7)
    H = np.diag([100.0, 1.0, 1.0])
    known = np.zeros(3)
    dense, limited = SecantModel(3), LimitedSecantModel(3)
    limited.known = known
    V = np.eye(3)
    dense.observe_products(V, V @ H)
    limited.observe_products(V, V @ H)
    s = np.array([1.0, 0.0, 0.0])
    y = np.array([0.01, 0.0, 0.0])  # (the wall's curvature gone along s)
    dense.update(s, y)
    limited.update(s, y)
    Bs_dense = dense.matrix @ s
    Bs_limited = limited.view(known, None).times(s)
    assert float(s @ Bs_dense) == pytest.approx(0.2 * 100.0, rel=1e-9)  # s^T y damped to 0.2 sBs
    assert np.allclose(Bs_limited, Bs_dense, rtol=1e-9, atol=1e-12)
    g = rng.normal(size=3)
    assert np.allclose(limited.view(known, None).solve(g), np.linalg.solve(dense.matrix, g))


def test_the_default_inner_solver_matches_plain_cvxpy_on_a_smooth_model():
    rng = np.random.default_rng(2)
    X = [rng.normal(size=(40, 6)) for _ in range(3)]
    y = [np.where(x @ rng.normal(size=6) > 0, 1.0, -1.0) for x in X]
    model, pooled = logistic_ball(X, y, radius=0.5)
    pooled.solve(solver="CLARABEL", **CLARABEL_TIGHT)
    res = model.solve(method="prox-al", eps=1e-6, history=False)
    assert res.status == "optimal" and res.extra["inner_solver"] == "quasi-newton"
    assert any(r["kind"] == "curvature_w_reply" for r in res.ledger)
    # a KKT point at eps = 1e-6 of a convex problem: objective and point within ~eps
    assert res.objective == pytest.approx(pooled.value, rel=1e-5, abs=1e-7)
    assert np.linalg.norm(res.solution["w"]) <= 0.5 * (1 + 1e-6)


@pytest.mark.parametrize("inner", ["quasi-newton", "auto"])
def test_sparse_client_data_stays_sparse_end_to_end(monkeypatch, inner):
    """scipy.sparse data: the GLM form keeps X sparse and no dense copy of X (or of X^T D
    X) is made on the way -- compile, the clients' derivatives and Hessian-vector
    products, the server's model, the certificate; at "auto" (exact-admm for the server's
    ball) the clients' exact steps too."""
    X, y = sparse_parts()
    model, pooled = logistic_ball(X, y, radius=0.8)
    pooled.solve(solver="CLARABEL", **CLARABEL_TIGHT)
    densified = []
    for cls in {type(x) for x in X} | {sparse.csr_matrix, sparse.csc_matrix}:
        original = cls.toarray

        def spy(self, *a, _original=original, **kw):
            if self.shape[0] > 1 and self.shape[1] > 1 and self.size > 0.05 * np.prod(self.shape):
                densified.append(self.shape)
            return _original(self, *a, **kw)

        monkeypatch.setattr(cls, "toarray", spy)
    dense_A = GLMTerm.dense_A

    def dense_A_spy(self):
        if self.A.shape == X[0].shape:  # (a client's data matrix)
            densified.append(("dense_A", self.A.shape))
        return dense_A(self)

    monkeypatch.setattr(GLMTerm, "dense_A", dense_A_spy)
    kinds = []
    original_products = NewtonSolver.products

    def products(self, x, mu, nu, V):
        kinds.extend(type(t.A) for t in self.obj.terms)
        return original_products(self, x, mu, nu, V)

    monkeypatch.setattr(NewtonSolver, "products", products)
    res = model.solve(method="prox-al", eps=1e-5, history=False, inner_solver=inner)
    expected = "quasi-newton" if inner == "quasi-newton" else "exact-admm"
    assert res.status == "optimal" and res.extra["inner_solver"] == expected
    if inner == "quasi-newton":  # (exact steps send no Hessian-vector products)
        assert kinds and all(sparse.issparse(k((1, 1))) for k in kinds)  # X sparse in the GLM
        assert densified == []
    else:  # the exact steps' Newton systems are d x d (local, never sent); X stays sparse
        d = X[0].shape[1]
        assert all(shape == (d, d) for shape in densified), densified
    assert res.objective == pytest.approx(pooled.value, rel=1e-4, abs=1e-6)


def test_the_limited_memory_model_runs_with_sparse_data(monkeypatch):
    """Above DENSE_MODEL_MAX shared variables the server keeps curvature pairs, not a d x d
    matrix (forced here at d = 40), and reaches the same optimum."""
    import fedmodel.algorithms.proxal.newton_route as server_module

    X, y = sparse_parts(seed=4)
    model, pooled = logistic_ball(X, y, radius=0.8)
    pooled.solve(solver="CLARABEL", **CLARABEL_TIGHT)
    monkeypatch.setattr(server_module, "DENSE_MODEL_MAX", 10)
    res = model.solve(
        method="prox-al",
        eps=1e-5,
        history=False,
        curvature_directions=0,
        inner_solver="quasi-newton",
    )
    assert res.status == "optimal" and res.extra["inner_solver"] == "quasi-newton"
    assert res.objective == pytest.approx(pooled.value, rel=1e-4, abs=1e-6)
    assert not any(r["kind"] == "curvature_w" for r in res.ledger)


@pytest.mark.timing
@pytest.mark.parametrize("inner", ["quasi-newton", "newton"])
def test_the_time_limit_ends_the_inner_loop(inner):
    """A slow client (0.2 s per trial point) and time_limit = 0.5 s: the (quasi-)Newton
    inner loop checks the deadline after every round, so the run returns with status
    "time_limit" instead of finishing its inner solve."""
    model = np_model(2, seed=1)
    kind = {"quasi-newton": "curvature_w", "newton": "newton_w"}[inner]
    fault = Fault("sleep", round=1, seconds=0.2, kinds=(kind,), times=None)
    from fedmodel.algorithms.proxal.options import ProxALOptions
    from fedmodel.algorithms.proxal.server import run_prox_al

    opts = ProxALOptions(eps=1e-9, time_limit=0.5, inner_solver=inner, history=False)
    t0 = time.perf_counter()
    res = run_prox_al(model.compile(), opts, faults={"site0": fault})
    assert res.status == "time_limit"
    assert res.rounds["communication"] < 20  # (it returned: no full run at eps = 1e-9)
    assert time.perf_counter() - t0 < 60


def test_centralized_stops_at_its_time_limit_with_a_point():
    """centralized passes what is left of time_limit to the solver it calls: a tiny limit
    ends the solve with status "time_limit" (or a certified point when it was quick)."""
    rng = np.random.default_rng(5)
    X = [rng.normal(size=(200, 30)) for _ in range(2)]
    y = [np.where(x @ rng.normal(size=30) > 0, 1.0, -1.0) for x in X]
    model, _ = logistic_ball(X, y)
    res = model.solve(method="centralized", time_limit=1e-4)
    assert res.status in ("time_limit", "optimal")
    assert np.all(np.isfinite(res.solution["w"]))


def test_a_run_with_the_limited_memory_model_resumes_from_a_checkpoint(monkeypatch, tmp_path):
    """The limited-memory model's pairs and the curvature directions (seeded by outer
    iteration and round) are state: a resumed run repeats the uninterrupted one."""
    import fedmodel.algorithms.proxal.newton_route as server_module
    from fedmodel.algorithms.proxal.options import ProxALOptions
    from fedmodel.algorithms.proxal.server import run_prox_al

    monkeypatch.setattr(server_module, "DENSE_MODEL_MAX", 3)
    compiled = np_model(3).compile()

    def run(**kw):
        opts = ProxALOptions(eps=1e-5, prox_beta=1.0, curvature_directions=2, **kw)
        return run_prox_al(compiled, opts, "prox-al")

    whole = run()
    path = tmp_path / "run"
    cut = run(checkpoint=str(path), checkpoint_every=2, max_outer=2)
    assert cut.status == "max_iterations"
    resumed = run(resume=str(path))
    assert whole.status == resumed.status == "optimal"
    assert np.array_equal(resumed.x, whole.x)
    assert resumed.rounds == whole.rounds


def test_a_client_without_exact_hessians_sends_difference_products():
    """A smooth term outside the GLM catalogue (log_sum_exp of an affine map) takes the
    L-BFGS backend at the client, which has no exact Hessian: its products come from a
    forward difference of its gradient, and the run still reaches the optimum."""
    rng = np.random.default_rng(6)
    m = fm.Model("lse")
    w = m.variable(4, name="w")
    W = cp.Variable(4)
    pooled = 0.1 * cp.sum_squares(W)
    m.server.minimize(0.1 * cp.sum_squares(w))
    for k in range(2):
        A, b = rng.normal(size=(8, 4)), rng.normal(size=8)
        c = m.client(f"c{k}")
        c.minimize(cp.log_sum_exp(c.data(A, name="A") @ w - c.data(b, name="b")))
        pooled = pooled + cp.log_sum_exp(A @ W - b)
    prob = cp.Problem(cp.Minimize(pooled))
    prob.solve(solver="CLARABEL", **CLARABEL_TIGHT)
    from fedmodel.algorithms.proxal.client import ProxALClient
    from fedmodel.algorithms.proxal.options import ProxALOptions

    client = ProxALClient(m.compile().clients[0], ProxALOptions(beta=100.0), 1.0, 2)
    assert not hasattr(client.solver, "products")
    res = m.solve(method="prox-al", eps=1e-6, history=False, curvature_directions=1)
    assert res.status == "optimal" and res.extra["inner_solver"] == "quasi-newton"
    assert any(r["kind"] == "curvature_w_reply" for r in res.ledger)
    assert res.objective == pytest.approx(prob.value, rel=1e-6, abs=1e-8)


def test_a_client_returns_its_local_newton_direction():
    """local_directions: with a ``precondition`` vector r the client also returns
    ``(n (H_i + p I))^(-1) r`` (its Hessian of P_{i,k} at w, never sent), and its
    Hessian-vector products are those of the products path."""
    from fedmodel.algorithms.proxal.client import ProxALClient
    from fedmodel.algorithms.proxal.options import ProxALOptions

    model = np_model(2, seed=3)
    client = ProxALClient(model.compile().clients[0], ProxALOptions(beta=10.0), 1.0, 2)
    rng = np.random.default_rng(1)
    n = client.ns
    w = rng.normal(size=n)
    client.mu = np.array([0.7])  # (an active constraint: its AL curvature is in H_i)
    client._on_start(np.zeros(n), inner="quasi-newton")
    V, r = rng.normal(size=(2, n)), rng.normal(size=n)
    plain = client.inner._on_curvature_w(w, V)
    local = client.inner._on_curvature_w(w, V, precondition=r)
    assert "local_direction" not in plain
    _, _, H = client.solver.derivatives(w, [client.mu], [client.nu])
    M = 2 * (H + client.prox_weight * np.eye(n))
    assert np.allclose(M @ local["local_direction"], r, rtol=1e-10, atol=1e-12)
    assert np.allclose(local["hvp"], plain["hvp"], rtol=1e-12, atol=1e-14)
    assert np.allclose(local["grad"], plain["grad"], rtol=1e-13, atol=1e-15)
    assert local["value"] == pytest.approx(plain["value"], rel=1e-14)


def test_local_directions_reach_the_plain_cvxpy_optimum_and_are_sent():
    """The default quasi-Newton run with the clients' local directions (and without them)
    certifies the optimum of the same pooled problem in plain cvxpy; with them every
    curvature reply after the first round of an inner solve carries one more d-vector."""
    rng = np.random.default_rng(2)
    X = [rng.normal(size=(40, 6)) for _ in range(3)]
    y = [np.where(x @ rng.normal(size=6) > 0, 1.0, -1.0) for x in X]
    model, pooled = logistic_ball(X, y, radius=0.5)
    pooled.solve(solver="CLARABEL", **CLARABEL_TIGHT)
    floats = {}
    for local in (True, False):
        res = model.solve(method="prox-al", eps=1e-6, history=False, local_directions=local)
        assert res.status == "optimal" and res.extra["inner_solver"] == "quasi-newton"
        assert res.objective == pytest.approx(pooled.value, rel=1e-5, abs=1e-7)
        assert np.linalg.norm(res.solution["w"]) <= 0.5 * (1 + 1e-6)
        rows = [r for r in res.ledger if r["kind"] == "curvature_w_reply"]
        floats[local] = max(r["floats"] for r in rows)
    # k = min(2, d // 4) = 1: (k + 1) d + 1 floats without; with, one more direction's
    # products and the direction itself
    assert floats[False] == 2 * 6 + 1 and floats[True] == 4 * 6 + 1


def test_local_directions_must_be_a_flag():
    model = np_model(2, seed=3)
    with pytest.raises(fm.ModelError, match="local_directions"):
        model.solve(method="prox-al", local_directions="yes")


def test_constraint_rows_are_sent_when_they_change_and_a_resumed_run_repeats_the_whole(tmp_path):
    """constraint_curvature on seed 000's LCQP (affine equalities at every party): each
    client sends its rows once (they never change), the model with them reaches the
    exact optimum in fewer rounds than without, and the rows the server keeps are state:
    a run resumed from a checkpoint repeats the uninterrupted one bit for bit."""
    from fedmodel.algorithms.proxal.options import ProxALOptions
    from fedmodel.algorithms.proxal.server import run_prox_al
    from fedmodel.models import lcqp_instance, lcqp_model

    inst = lcqp_instance(n=3, d=30, m=2, random_state=1)
    compiled = lcqp_model(inst).compile()
    W = cp.Variable(30)  # the pooled problem in plain cvxpy
    objective = sum(
        0.5 * cp.quad_form(W, A, assume_PSD=True) + b @ W for A, b in zip(inst.A, inst.b)
    )
    pooled = cp.Problem(cp.Minimize(objective), [C @ W + d == 0 for C, d in zip(inst.C, inst.d)])
    pooled.solve(solver="CLARABEL", **CLARABEL_TIGHT)
    x_star = W.value

    def run(**kw):
        return run_prox_al(compiled, ProxALOptions(eps=1e-6, **kw), "prox-al")

    whole = run()
    assert whole.status == "optimal" and whole.extra["inner_solver"] == "quasi-newton"
    assert np.abs(whole.x - x_star).max() <= 1e-5
    rows = [r for r in whole.ledger if "stiff" in dict(r["shapes"])]
    assert {dict(r["shapes"])["stiff"] for r in rows} == {(2, 30)}
    # (once per start: a units round starts the route again in the objective's units)
    starts = 1 if whole.extra["objective_units"][0] == 1.0 else 2
    assert sorted(r["sender"] for r in rows) == sorted(starts * ["client1", "client2", "client3"])
    without = run(constraint_curvature=False)
    assert without.status == "optimal"
    assert whole.rounds["communication"] < without.rounds["communication"]
    path = tmp_path / "run"
    cut = run(checkpoint=str(path), checkpoint_every=1, max_outer=2)
    assert cut.status == "max_iterations"
    resumed = run(resume=str(path))
    assert resumed.status == "optimal"
    assert np.array_equal(resumed.x, whole.x)
    assert resumed.rounds == whole.rounds


def test_local_directions_are_off_by_default_when_the_server_has_inequalities():
    """The clients' Hessians do not know the server's walls: with a norm ball at the server
    the default sends no local direction (the option turns it on); Neyman-Pearson clients
    with no server constraint send one."""
    rng = np.random.default_rng(2)
    X = [rng.normal(size=(40, 6)) for _ in range(3)]
    y = [np.where(x @ rng.normal(size=6) > 0, 1.0, -1.0) for x in X]
    model, _ = logistic_ball(X, y, radius=0.5)

    def fields(res):
        return {key for r in res.ledger for key in dict(r["shapes"])}

    assert "local_direction" not in fields(model.solve(method="prox-al", history=False))
    assert "local_direction" in fields(np_model(2, seed=3).solve(method="prox-al", history=False))


def test_kkt_feasibility_reads_violation_and_complementarity_of_the_soft_rows():
    from fedmodel.algorithms.proxal.client import kkt_feasibility

    ci = np.array([-0.5, 2e-3, 0.4, -0.1])
    mu = np.array([0.2, 1.0, 3.0, 0.0])
    ce = np.array([-3e-3, 1e-4])
    out = kkt_feasibility(ci, ce, mu)
    # violation: max(c^+, |a|) = max(0.4, 3e-3); complementarity: max mu_j (-c_j)^+ = 0.1
    assert out == {"violation": pytest.approx(0.4), "complementarity": pytest.approx(0.1)}
    # rows imposed exactly (exact-admm's hard rows) are left out
    out = kkt_feasibility(ci, ce, mu, np.array([True, False, True, False]), np.array([1, 0]))
    assert out == {"violation": pytest.approx(2e-3), "complementarity": 0.0}


@pytest.mark.parametrize("inner", ["quasi-newton", "newton"])
def test_test8_reads_the_measured_violation_and_complementarity(inner):
    """With a (quasi-)Newton inner solver test (8)'s feasibility half is the measured
    violation (at kkt_factor[1] eps) and complementarity (at kkt_factor[0] eps) at the
    outer iterate: the last outer iteration meets both, and the answer is the pooled
    optimum to within the accuracy a KKT point at eps = 1e-6 gives on this model."""
    model = np_model(3, r=0.45)
    ref = model.solve(method="centralized", eps=1e-8)
    res = model.solve(method="prox-al", eps=1e-6, history=True, inner_solver=inner)
    assert res.status == "optimal" and res.extra["inner_solver"] == inner
    last = res.history[-1]
    assert last["violation_measured"] <= 1e-3 * 1e-6
    assert last["complementarity_measured"] <= 1e-2 * 1e-6
    assert last["stationarity_measured"] <= 1e-2 * 1e-6
    # every outer iteration measured them (the clients' outer replies carry two scalars)
    assert all("violation_measured" in h for h in res.history)
    assert res.objective == pytest.approx(ref.objective, rel=1e-5, abs=1e-7)
    assert res.max_violation <= 1e-9


def test_quasi_newton_tau_follows_the_outer_step_and_runs_without_outer_anderson():
    """With quasi-Newton: tau_k = max(u sbar tau_rate^k, u kkt_factor[0] eps / 2,
    PROX_RELATIVE_TAU ||w^k - w^{k-1}||_inf / prox_beta), u = v min(1, S / v) the unit
    of the targets (S the certificate's objective scale, v = parameter_unit(S) the unit
    of the adaptive variant's beta and prox_beta; history's dw_inf is that step times
    beta / prox_beta), and no outer Anderson round unless the user asks for one."""
    from fedmodel.algorithms.proxal.options import parameter_unit
    from fedmodel.algorithms.proxal.server import PROX_RELATIVE_TAU

    model = np_model(3, r=0.45)
    eps = 1e-6
    res = model.solve(method="prox-al", eps=eps, history=True, inner_solver="quasi-newton")
    assert res.status == "optimal"
    assert not any(r["kind"].startswith("outer_aa") for r in res.ledger)
    taus = [h["tau"] for h in res.history]
    scale = res.extra["objective_scale"]
    unit, beta_factor = res.extra["objective_units"][:2]
    assert unit == parameter_unit(scale) == beta_factor
    # (adaptive defaults in the objective's units; tau_0 = u sbar at this eps)
    beta, sbar, rate = 100.0 * beta_factor, taus[0], 0.1
    floor = 0.5 * 0.01 * eps * unit * min(1.0, scale / unit)
    relative = [0.0] + [PROX_RELATIVE_TAU * h["dw_inf"] / beta for h in res.history[:-1]]
    expected = [max(sbar * rate**k, floor, r) for k, r in enumerate(relative)]
    assert taus == pytest.approx(expected, rel=1e-12)
    assert any(r > max(sbar * rate**k, floor) for k, r in enumerate(relative))
    forced = model.solve(
        method="prox-al", eps=eps, history=False, inner_solver="quasi-newton", outer_anderson=5
    )
    assert forced.status == "optimal"
    assert any(r["kind"] == "outer_aa" for r in forced.ledger)
