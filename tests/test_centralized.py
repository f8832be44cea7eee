"""``method="centralized"``: the engine choice (cvxpy vs the smooth exact path), agreement
of the two engines, and their certificates."""

import numpy as np
import pytest
from problems import lcqp_test_model, np_model

from fedmodel.algorithms.centralized.pooled import prefers_smooth_path
from fedmodel.errors import ModelError, UnsupportedError


def test_auto_takes_the_smooth_path_for_logistic_models_and_agrees_with_cvxpy():
    model = np_model(3)
    smooth = model.solve(method="centralized")
    conic = model.solve(method="centralized", engine="cvxpy")
    assert smooth.extra["solved_with"] == "cprox-al (smooth exact)"
    assert "cvxpy_solver" in conic.extra
    for res in (smooth, conic):
        assert res.status == "optimal"
        assert res.kkt.stationarity <= 1e-6 and res.kkt.feasibility <= 1e-6
    rel = abs(smooth.objective - conic.objective) / abs(conic.objective)
    assert rel <= 1e-6
    assert np.abs(smooth.x - conic.x).max() <= 1e-3


def test_auto_sends_small_lcqps_to_clarabel_directly_and_agrees_with_the_smooth_path():
    """An LCQP (quadratic objective, affine inequalities) goes to Clarabel on its own data
    (no cvxpy compile: faster than the augmented Lagrangian's active-set changes); with
    ``direct=False`` it takes the smooth exact path as before; both certify the same
    optimum."""
    import cvxpy as cp

    import fedmodel as fm

    rng = np.random.default_rng(2)
    model = fm.Model()
    w = model.variable(4, name="w")
    for k in range(3):
        X, y = rng.normal(size=(20, 4)), rng.normal(size=20)
        site = model.client(f"c{k}")
        site.minimize(cp.sum_squares(site.data(X) @ w - site.data(y)) / 60)
        site.subject_to(w <= 0.3 + 0.1 * k)
    model.server.subject_to(cp.sum(w) == 1)
    assert prefers_smooth_path(model.compile())  # (the smooth path applies)
    res = model.solve(method="centralized")
    assert res.status == "optimal"
    assert res.extra.get("direct") is True and "solved_with" not in res.extra
    assert res.kkt.stationarity <= 1e-6 and res.kkt.feasibility <= 1e-6
    smooth = model.solve(method="centralized", direct=False)
    assert smooth.status == "optimal"
    assert smooth.extra["solved_with"] == "cprox-al (smooth exact)"
    assert abs(smooth.objective - res.objective) <= 1e-6 * max(1.0, abs(res.objective))


def test_auto_keeps_cvxpy_for_large_qps(monkeypatch):
    from fedmodel.algorithms.centralized import pooled

    model = lcqp_test_model(3)
    monkeypatch.setattr(pooled, "SMOOTH_MAX_SIZE", model.compile().layout.size - 1)
    assert not prefers_smooth_path(model.compile())
    res = model.solve(method="centralized")
    assert res.status == "optimal"
    assert "solved_with" not in res.extra and res.extra["cvxpy_solver"]


def test_engine_is_validated():
    model = np_model(1)
    with pytest.raises(ModelError, match="unknown engine 'conic'.*'auto', 'cvxpy', 'smooth'"):
        model.solve(method="centralized", engine="conic")


def test_smooth_engine_refuses_a_term_without_gradient():
    import cvxpy as cp

    import fedmodel as fm

    model = fm.Model()
    w = model.variable(3, name="w")
    site = model.client("site1")
    a = site.data(np.array([1.0, -2.0, 0.5]), name="a")
    site.minimize(cp.norm(w - a, 2))  # no smooth exact (epigraph) form: norm2 at 0
    with pytest.raises(UnsupportedError, match="site1"):
        model.solve(method="centralized", engine="smooth")
    assert model.solve(method="centralized").status == "optimal"


def test_auto_sends_epigraph_models_to_clarabel_and_certifies_them():
    """Hinge SVM (epigraph of pos): Clarabel directly at tight tolerances, certified at
    1e-6 without the smooth path or a refinement, at Clarabel's optimum."""
    import cvxpy as cp

    import fedmodel as fm

    rng = np.random.default_rng(0)
    model, W, B, obj = fm.Model(), cp.Variable(4), cp.Variable(), 0
    w, b = model.variable(4, name="w"), model.variable(name="b")
    model.server.subject_to(cp.norm(w, 2) <= 1)
    for k in range(3):
        X = rng.normal(size=(60, 4))
        y = np.sign(X @ np.array([1.0, -1.0, 0.5, 0.0]) + 0.3 * rng.normal(size=60))
        site = model.client(f"c{k}")
        Xd, yd = site.data(X, name="X"), site.data(y, name="y")
        site.minimize(cp.sum(cp.pos(1 - cp.multiply(yd, Xd @ w + b))) / 180)
        obj += cp.sum(cp.pos(1 - cp.multiply(y, X @ W + B))) / 180
    assert not prefers_smooth_path(model.compile())
    res = model.solve(method="centralized")
    assert res.status == "optimal"
    assert res.extra["cvxpy_solver"] == "CLARABEL"
    assert "solved_with" not in res.extra and "refined_with" not in res.extra
    ref = cp.Problem(cp.Minimize(obj), [cp.norm(W, 2) <= 1])
    ref.solve(solver="CLARABEL")
    Xs = [np.asarray(d.value) for c in model.clients for d in c.data_handles]
    hinge = sum(
        np.maximum(0.0, 1 - y * (X @ res.solution["w"] + res.solution["b"])).sum() / 180
        for X, y in zip(Xs[::2], Xs[1::2])
    )
    assert abs(hinge - ref.value) <= 1e-6 * max(1.0, abs(ref.value))


def _logistic_ball(sparse_data: bool, d: int = 30, rows: int = 40, radius: float = 0.5):
    """Logistic regression in an active l2 ball over 3 clients, and the same problem pooled
    in plain cvxpy (its optimum is the reference)."""
    import cvxpy as cp
    import scipy.sparse as sps

    import fedmodel as fm

    rng = np.random.default_rng(3)
    model = fm.Model("logistic-ball")
    w = model.variable(d, name="w")
    W = cp.Variable(d)
    model.server.subject_to(cp.norm(w, 2) <= radius)
    obj = 0
    for k in range(3):
        X = rng.normal(size=(rows, d)) * (rng.random((rows, d)) < 0.15)
        y = np.where(X @ rng.normal(size=d) + 0.2 * rng.normal(size=rows) > 0, 1.0, -1.0)
        X = sps.csr_matrix(X) if sparse_data else X
        site = model.client(f"c{k}")
        Xd, yd = site.data(X, name="X"), site.data(y, name="y")
        site.minimize(cp.sum(cp.logistic(-cp.multiply(yd, Xd @ w))) / (3 * rows))
        obj += cp.sum(cp.logistic(-cp.multiply(y, X @ W))) / (3 * rows)
    return model, cp.Problem(cp.Minimize(obj), [cp.norm(W, 2) <= radius]), W


def test_the_smooth_path_takes_newton_cg_on_a_ball_and_agrees_with_cvxpy(monkeypatch):
    """The Newton-CG path (Newton-CG subproblems, Hessian-vector products on the sparse
    data) on a tiny instance: certified, at plain Clarabel's optimum, the ball active."""
    from problems import CLARABEL_TIGHT

    from fedmodel.algorithms.centralized import pooled
    from fedmodel.subproblems.merit import MeritProblem
    from fedmodel.subproblems.newton_cg import NewtonCGSolver

    model, ref, W = _logistic_ball(sparse_data=True)
    compiled = model.compile()
    # a curved constraint (the ball) takes Newton-CG at any size, for its second-order
    # correction; above the dense size so does every model with a non-quadratic GLM term
    assert pooled.route(compiled).backend == "newton-cg" and prefers_smooth_path(compiled)
    monkeypatch.setattr(pooled, "SMOOTH_MAX_SIZE", 10)
    assert pooled.route(compiled).backend == "newton-cg"
    import scipy.sparse as sps

    solver = NewtonCGSolver(MeritProblem(compiled.parties, 1.0))
    assert solver.obj.terms and all(sps.issparse(t.A) for t in solver.obj.terms)

    res = model.solve(method="centralized")
    assert res.status == "optimal"
    assert res.extra["subproblem_solver"] == "newton-cg"
    ref.solve(solver="CLARABEL", **CLARABEL_TIGHT)
    # "optimal" at eps = 1e-6: a relative gap of order eps on this convex model
    assert abs(res.objective - ref.value) <= 1e-6 * max(1.0, abs(ref.value))
    assert abs(np.linalg.norm(res.solution["w"]) - 0.5) <= 1e-6
    assert np.abs(res.solution["w"] - W.value).max() <= 1e-4


def test_newton_cg_hessian_products_and_steps_match_dense_newton():
    """Newton-CG's Hessian-vector products are the dense Newton Hessian's (with the active
    ball's augmented-Lagrangian terms), and both backends reach the same subproblem
    minimiser."""
    from fedmodel.subproblems.merit import MeritProblem
    from fedmodel.subproblems.newton import NewtonSolver
    from fedmodel.subproblems.newton_cg import NewtonCGSolver

    model, _, _ = _logistic_ball(sparse_data=False)
    compiled = model.compile()
    n = compiled.layout.size
    problems = [MeritProblem(compiled.parties, 1e5, compiled.regularizer) for _ in range(2)]
    for p in problems:
        p.set(sigma=1e-5, center=np.zeros(n), mu=[np.array([0.05])] + [np.zeros(0)] * 3)
    dense, cg = NewtonSolver(problems[0]), NewtonCGSolver(problems[1])
    a, b = dense.solve(np.zeros(n), 1e-9), cg.solve(np.zeros(n), 1e-9)
    assert a.converged and b.converged
    assert np.abs(a.x - b.x).max() <= 1e-7
    # at a point outside the ball (the AL term active): H v from products = dense H v
    x = b.x * 1.01
    for s in (dense, cg):
        s._m_in, s._m_eq = np.zeros(0), np.zeros(0)
    st = cg._evaluate(x)
    assert st.comps  # the ball's term is active there
    H = dense._hessian(dense._evaluate(x))
    H = np.triu(H) + np.triu(H, 1).T
    v = np.random.default_rng(0).normal(size=n)
    Hv = H @ v
    assert np.abs(cg._hvp(cg._curvature(st), v) - Hv).max() <= 1e-9 * np.abs(Hv).max()


def test_time_limit_ends_the_newton_cg_path_with_status_time_limit(monkeypatch):
    """A time limit far below the solve time: the call returns, says "time_limit" and
    returns its current point (no timing asserted)."""
    from fedmodel.algorithms.centralized import pooled

    monkeypatch.setattr(pooled, "SMOOTH_MAX_SIZE", 10)
    model, _, _ = _logistic_ball(sparse_data=True)
    res = model.solve(method="centralized", time_limit=1e-4)
    assert res.status == "time_limit"
    assert res.extra["subproblem_solver"] == "newton-cg"
    assert np.all(np.isfinite(res.solution["w"]))


def test_time_limit_spent_before_the_conic_solve_says_so():
    """An epigraph model (hinge) goes to Clarabel: with the time limit gone while its data
    is built (directly, or by cvxpy's compile with ``direct=False``), no solve starts and
    the status says time_limit."""
    import cvxpy as cp

    import fedmodel as fm

    rng = np.random.default_rng(1)
    model = fm.Model()
    w = model.variable(3, name="w")
    site = model.client("c")
    X, y = rng.normal(size=(40, 3)), np.sign(rng.normal(size=40))
    site.minimize(cp.sum(cp.pos(1 - cp.multiply(site.data(y, name="y"), site.data(X) @ w))))
    res = model.solve(method="centralized", time_limit=1e-9)
    assert res.status == "time_limit" and res.extra.get("cvxpy_solver") == "CLARABEL"
    assert "building" in res.message and np.all(np.isnan(res.solution["w"]))
    res = model.solve(method="centralized", time_limit=1e-9, direct=False)
    assert res.status == "time_limit"
    assert "compile" in res.message and np.all(np.isnan(res.solution["w"]))


def test_auto_sends_qcqps_and_kl_models_to_clarabel_and_certifies_them_at_once():
    """A Markowitz QCQP (linear objective, per-client quadratic risk budgets) and a KL
    divergence on the simplex: Clarabel at tight tolerances, certified without a
    refinement (at Clarabel's defaults the KL model read stationarity 7.5e-5), at plain
    Clarabel's optimum."""
    import cvxpy as cp

    import fedmodel as fm

    rng = np.random.default_rng(6)
    d = 8
    markowitz, kl = fm.Model("markowitz"), fm.Model("kl")
    w, v = markowitz.variable(d, name="w"), kl.variable(d, name="v")
    W, V = cp.Variable(d), cp.Variable(d)
    markowitz.server.subject_to([cp.sum(w) == 1, w >= 0])
    kl.server.subject_to([cp.sum(v) == 1, v >= 0])
    obj_m, cons_m = 0, [cp.sum(W) == 1, W >= 0]
    obj_k, cons_k = 0, [cp.sum(V) == 1, V >= 0]
    grid = np.linspace(0, 1, d)
    for k in range(3):
        F = rng.normal(size=(d, 2)) * 0.05
        S = F @ F.T + np.diag(rng.uniform(0.002, 0.01, size=d))
        mu = rng.uniform(0.0, 0.1, size=d)
        c = markowitz.client(f"c{k}")
        c.minimize(-c.data(mu, name="mu") @ w / 3)
        c.subject_to(cp.quad_form(w, c.data(S, name="S")) <= 0.002)
        obj_m += -mu @ W / 3
        cons_m.append(cp.quad_form(W, S) <= 0.002)
        q = rng.dirichlet(np.ones(d))
        c = kl.client(f"c{k}")
        c.minimize(cp.sum(cp.kl_div(v, c.data(q, name="q"))) / 3)
        c.subject_to(c.data(grid, name="grid") @ v <= 0.4 + 0.02 * k)
        obj_k += cp.sum(cp.kl_div(V, q)) / 3
        cons_k.append(grid @ V <= 0.4 + 0.02 * k)
    for model, ref, at_once in (
        (markowitz, cp.Problem(cp.Minimize(obj_m), cons_m), False),
        (kl, cp.Problem(cp.Minimize(obj_k), cons_k), True),
    ):
        assert not prefers_smooth_path(model.compile())
        res = model.solve(method="centralized")
        assert res.status == "optimal", res.message
        # (the Markowitz objective, a linear one of size 0.03, is certified relative to its
        # own scale S: Clarabel's QCQP point at 1e-12 stops at a scaled stationarity of
        # ~1e-5, and the smooth exact path finishes it)
        if at_once:
            assert res.extra["cvxpy_solver"] == "CLARABEL"
            assert "refined_with" not in res.extra and "solved_with" not in res.extra
        ref.solve(solver="CLARABEL")
        assert abs(res.objective - ref.value) <= 1e-6 * max(1.0, abs(ref.value))


def test_polishing_the_epigraph_duals_restores_their_stationarity():
    """Hinge SVM (one epigraph auxiliary per row): multipliers off by a relative 1e-4 fail
    the certificate (each auxiliary's stationarity is measured relative to its 1/N); the
    polish rescales each auxiliary's rows back and the certificate holds again."""
    import cvxpy as cp

    import fedmodel as fm
    from fedmodel.algorithms.centralized import pooled
    from fedmodel.algorithms.centralized.cprox_al import pooled_evaluation

    rng = np.random.default_rng(2)
    model = fm.Model()
    w = model.variable(4, name="w")
    model.server.minimize(0.05 * cp.sum_squares(w))
    for k in range(2):
        X, y = rng.normal(size=(30, 4)), np.sign(rng.normal(size=30))
        site = model.client(f"c{k}")
        Xd, yd = site.data(X, name="X"), site.data(y, name="y")
        site.minimize(cp.sum(cp.pos(1 - cp.multiply(yd, Xd @ w))) / 60)
    compiled = model.compile()
    prob, per_party = pooled.pooled_problem(compiled)
    prob.solve(solver="CLARABEL", tol_gap_abs=1e-12, tol_gap_rel=1e-12, tol_feas=1e-12)
    x = compiled.layout.stack({v: v.value for v in compiled.layout.variables})
    mus = [np.maximum(pooled._duals(ineq), 0.0) for ineq, _, _ in per_party]
    mus = [np.where(m <= 1e-8 * max(m.max(initial=0), 1e-300), 0.0, m) for m in mus]
    nus = [pooled._duals(eq) for _, eq, _ in per_party]
    assert pooled_evaluation(compiled, x, mus, nus)[0].satisfied(1e-6, 1e-6)
    off = [m * (1 + 1e-4) for m in mus]
    assert not pooled_evaluation(compiled, x, off, nus)[0].satisfied(1e-6, 1e-6)
    polished = pooled.polish_auxiliary_duals(compiled, x, off)
    assert pooled_evaluation(compiled, x, polished, nus)[0].satisfied(1e-6, 1e-6)
    for a, b in zip(polished, mus):
        np.testing.assert_allclose(a, b, rtol=1e-8, atol=1e-14)
