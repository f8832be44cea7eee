"""prox-al's federated (quasi-)Newton inner solvers (issue 12; issues 22 and 23: the default
``inner_solver="quasi-newton"`` sends O(d) floats, exact Newton is an opt-in): the loop's
guarantees, the derivatives the clients send, when each runs, and their answers against
the centralized optimum."""

import cvxpy as cp
import numpy as np
import pytest
from problems import lcqp_test_model, np_model

import fedmodel as fm
from fedmodel.algorithms.proxal.newton_inner import (
    SecantModel,
    federated_newton,
    newton_direction,
)
from fedmodel.subproblems.merit import MeritProblem
from fedmodel.subproblems.newton import NewtonSolver


def _logistic_problem(seed=0, n=200, d=5):
    rng = np.random.default_rng(seed)
    A = rng.normal(size=(n, d))
    y = np.sign(rng.normal(size=n) + A[:, 0])

    def evaluate(w):
        z = -y * (A @ w)
        val = float(np.logaddexp(0.0, z).sum() / n + 0.5e-3 * w @ w)
        s = 1.0 / (1.0 + np.exp(-z))
        g = A.T @ (-y * s) / n + 1e-3 * w
        H = (A * (s * (1 - s))[:, None]).T @ A / n + 1e-3 * np.eye(d)
        return val, g, H

    return evaluate, d


def test_federated_newton_reaches_tau_with_monotone_values():
    evaluate, d = _logistic_problem()
    seen = []

    def counted(w):
        out = evaluate(w)
        seen.append(out[0])
        return out

    w0 = np.zeros(d)
    out = federated_newton(counted, (w0, *evaluate(w0)), tau=1e-10, max_rounds=50)
    assert out.satisfied and out.residual <= 1e-10
    assert out.rounds == len(seen)  # one evaluation (round) per trial point
    # the returned residual is the gradient measured at the returned point
    assert np.abs(evaluate(out.w)[1]).max() == pytest.approx(out.residual, abs=1e-16)
    # never a point with a larger value than the start; Newton: few rounds
    assert evaluate(out.w)[0] <= evaluate(w0)[0]
    assert out.rounds <= 10


def test_line_search_globalises_a_newton_step_that_would_diverge():
    # f(w) = sum sqrt(1 + w^2): pure Newton from |w| > 1 diverges (w -> -w^3)
    def evaluate(w):
        r = np.sqrt(1 + w * w)
        return float(r.sum()), w / r, np.diag(1 / r**3)

    w0 = np.array([3.0, -2.0])
    values = []

    def counted(w):
        out = evaluate(w)
        values.append(out[0])
        return out

    out = federated_newton(counted, (w0, *evaluate(w0)), tau=1e-9, max_rounds=100)
    assert out.satisfied and np.abs(out.w).max() <= 1e-9
    assert out.backtracks > 0  # the full step was rejected at least once
    assert max(values) > evaluate(w0)[0]  # (some trial overshot...)
    # ...but the accepted points' values never increase: the point returned after k
    # rounds (the last one accepted by then) has a value <= the one after k - 1 rounds
    accepted = [
        evaluate(federated_newton(evaluate, (w0, *evaluate(w0)), 1e-9, k).w)[0]
        for k in range(out.rounds + 1)
    ]
    assert all(b <= a for a, b in zip(accepted, accepted[1:]))
    assert accepted[-1] < accepted[0]


def test_federated_newton_stops_at_the_round_limit_with_the_last_accepted_point():
    evaluate, d = _logistic_problem(seed=1)
    w0 = np.zeros(d)
    out = federated_newton(evaluate, (w0, *evaluate(w0)), tau=1e-14, max_rounds=2)
    assert not out.satisfied and out.rounds == 2 and not out.stalled
    assert out.residual == pytest.approx(float(np.abs(evaluate(out.w)[1]).max()))


def test_newton_direction_is_a_descent_direction_for_singular_and_indefinite_H():
    rng = np.random.default_rng(3)
    g = rng.normal(size=4)
    for H in (np.zeros((4, 4)), np.diag([1.0, 0.0, 0.0, 2.0]), np.diag([1.0, -1.0, 2.0, 3.0])):
        d = newton_direction(H, g)
        assert np.all(np.isfinite(d)) and g @ d < 0


def test_newton_backend_derivatives_match_finite_differences():
    """What a client sends: value, gradient and the full (both triangles) generalised
    Hessian of its merit terms, at multipliers that make some constraints active."""
    model = np_model(1, seed=4)
    program = model.compile().clients[0]
    problem = MeritProblem([program], beta=10.0)
    solver = NewtonSolver(problem)
    rng = np.random.default_rng(0)
    mu = [np.array([0.7])]
    nu = [np.zeros(0)]
    x = rng.normal(size=problem.n) * 0.3
    val, g, H = solver.derivatives(x, mu, nu)
    assert np.allclose(H, H.T)
    ref_val, ref_g = program.functions.merit(x, mu[0], nu[0], 10.0)
    assert val == pytest.approx(ref_val, rel=1e-12) and np.allclose(g, ref_g, atol=1e-12)
    h = 1e-6
    for j in range(problem.n):
        e = np.zeros(problem.n)
        e[j] = h
        col = (solver.derivatives(x + e, mu, nu)[1] - solver.derivatives(x - e, mu, nu)[1]) / (
            2 * h
        )
        assert np.allclose(H[:, j], col, atol=1e-5)


def _algorithm_shapes(res):
    """(kind, field, shape) of every algorithm message of a run."""
    return [
        (r["kind"], key, tuple(shape))
        for r in res.ledger
        if r["channel"] == "algorithm"
        for key, shape in dict(r["shapes"]).items()
    ]


@pytest.mark.parametrize("inner", ["quasi-newton", "newton"])
def test_prox_al_with_either_newton_inner_solver_matches_centralized(inner):
    model = np_model(4, seed=2)
    ref = model.solve(method="centralized", eps=1e-8)
    res = model.solve(method="prox-al", inner_solver=inner)
    assert res.extra["inner_solver"] == inner
    assert res.status == "optimal"
    assert abs(res.objective - ref.objective) <= 1e-3 * abs(ref.objective)
    assert res.max_violation <= 1e-3 * 1e-3 * (1 + 1e-9)  # kkt_factor's feasibility half
    for row in res.history:  # the inner loop's bound is the measured ||grad l_k||_inf
        assert row["inner_bound"] <= row["tau"]


def test_the_default_sends_vectors_only_and_newton_is_the_opt_in_that_sends_hessians():
    """Issue 22/23: at its defaults prox-al sends no d x d matrix (a client with fewer rows
    than d would reveal them through its Hessian); inner_solver="newton" does, and takes
    fewer rounds."""
    model = np_model(3, seed=2)
    d = model.compile().layout.n_shared
    res = model.solve(method="prox-al")
    assert res.status == "optimal" and res.extra["inner_solver"] == "quasi-newton"
    assert res.extra["penalty_metric"] == "scalar"
    shapes = _algorithm_shapes(res)
    k = min(2, d // 4)  # the default curvature directions: Hessian-vector products
    assert ("curvature_w_reply", "grad", (d,)) in shapes
    # (k directions, and the average of the clients' local Newton directions on top)
    assert ("curvature_w_reply", "hvp", (k + 1, d)) in shapes
    assert ("curvature_w_reply", "local_direction", (d,)) in shapes
    assert ("curvature_w_reply", "stiff", (1, d)) in shapes  # (its active constraint row)
    # O(d): d-vectors, k + 1 of them in a block, its one constraint's row, and the Anderson
    # weights / Gram rows (6)
    assert all(int(np.prod(shape)) <= max((k + 1) * d, d, 6) for _, _, shape in shapes)
    assert all(
        shape[-1:] != (d,) or shape[:-1] in ((), (0,), (1,), (k,), (k + 1,))
        for _, _, shape in shapes
    )
    # model.summary()'s rows (the run's declared table) say the same: the most floats of a
    # round, its constraint rows (d floats each, the client's one row here) included
    from fedmodel.algorithms.privacy import privacy_rows

    rows = {(r["kind"], r["direction"]): r["floats"] for r in privacy_rows(model.compile())}
    sizes = {(r["kind"], r["floats"]) for r in res.ledger if r["channel"] == "algorithm"}
    up = rows[("curvature_w", "client -> server")]
    assert ("curvature_w_reply", up) in sizes or ("curvature_w_reply", up - d) in sizes
    assert "quasi-newton" in model.summary(print_=False)
    assert ("curvature_w", rows[("curvature_w", "server -> client")]) in sizes
    gradients_only = model.solve(method="prox-al", curvature_directions=0, history=False)
    assert gradients_only.status == "optimal"
    assert ("gradient_w_reply", "grad", (d,)) in _algorithm_shapes(gradients_only)
    newton_rows = privacy_rows(model.compile(), inner_solver="newton")
    assert {(r["kind"], r["floats"]) for r in newton_rows} >= {("newton_w", d * d + d + 1)}
    newton = model.solve(method="prox-al", inner_solver="newton")
    assert newton.status == "optimal"
    assert ("newton_w_reply", "hessian", (d, d)) in _algorithm_shapes(newton)
    assert newton.rounds["communication"] < res.rounds["communication"]
    # Algorithm 2 at its (scalar-metric) default sends vectors only too
    admm = model.solve(method="prox-al", inner_solver="admm", history=False)
    assert admm.status == "optimal" and admm.extra["penalty_metric"] == "scalar"
    assert all(len(shape) <= 1 for _, _, shape in _algorithm_shapes(admm))


def test_secant_model_meets_the_secant_equation_and_stays_positive_definite():
    rng = np.random.default_rng(0)
    A = rng.normal(size=(4, 4))
    A = A @ A.T + np.eye(4)
    model = SecantModel(4)
    w = rng.normal(size=4)
    model.restart(w, A @ w)
    for _ in range(6):
        w_new = w + rng.normal(size=4)
        assert model.observe(w_new, A @ w_new)
        s = w_new - w
        assert np.allclose(model.matrix @ s, A @ s)  # (the last pair, undamped: convex)
        assert np.all(np.linalg.eigvalsh(model.matrix) > 0)
        w = w_new
    # negative curvature along a step (a non-convex model): Powell's damping keeps B > 0
    before = model.matrix
    assert model.observe(w + np.ones(4), A @ w - 5.0 * np.ones(4))
    assert np.all(np.linalg.eigvalsh(model.matrix) > 0) and model.matrix is not before
    # restart: the next pair starts at the new point (never across two l_k), B is kept
    kept = model.matrix
    model.restart(np.zeros(4), np.full(4, 100.0))
    assert model.matrix is kept
    assert not SecantModel(4).observe(w, A @ w)  # (no pair yet)


def test_quasi_newton_loop_on_a_quadratic_reaches_tau():
    rng = np.random.default_rng(1)
    A = rng.normal(size=(6, 6))
    A = A @ A.T + 0.1 * np.eye(6)
    b = rng.normal(size=6)
    model = SecantModel(6)

    def evaluate(w):
        g = A @ w - b
        model.observe(w, g)
        return 0.5 * float(w @ A @ w) - float(b @ w), g, model.matrix

    w0 = np.zeros(6)
    model.restart(w0, -b)
    start = (w0, 0.0, -b, model.initial(-b))
    out = federated_newton(evaluate, start, tau=1e-9, max_rounds=100, remodel=2)
    assert out.satisfied and np.allclose(out.w, np.linalg.solve(A, b), atol=1e-7)


def test_newton_inner_on_a_qp_matches_cvxpy():
    model = lcqp_test_model(3, d=12, m=3, seed=1)
    ref = model.solve(method="centralized", eps=1e-9)
    res = model.solve(method="prox-al", eps=1e-6, inner_solver="newton")
    assert res.status == "optimal" and res.extra["inner_solver"] == "newton"
    assert abs(res.objective - ref.objective) <= 1e-6 * max(1.0, abs(ref.objective))


def test_a_quadratic_client_sends_its_hessian_only_when_it_changes():
    model = lcqp_test_model(3, d=8, m=2, seed=0)
    res = model.solve(method="prox-al", inner_solver="newton")
    d = res.x.size
    replies = [
        r
        for r in res.ledger
        if r["channel"] == "algorithm"
        and r["kind"].endswith("_reply")
        and r["kind"] != "evaluate_reply"
    ]
    with_h = [r for r in replies if "hessian" in dict(r["shapes"])]
    assert with_h and len(with_h) < len([r for r in replies if "grad" in dict(r["shapes"])])
    for r in with_h:
        assert tuple(dict(r["shapes"])["hessian"]) == (d, d)


def test_newton_messages():
    model = np_model(3, seed=3)
    res = model.solve(method="prox-al", eps=1e-3, inner_solver="newton")
    d = res.x.size
    algo = [r for r in res.ledger if r["channel"] == "algorithm"]
    kinds = {r["kind"] for r in algo}
    assert {"start", "newton_w", "outer"} <= kinds and "admm_w" not in kinds
    for r in algo:
        shapes = dict(r["shapes"])
        if r["kind"] == "newton_w":  # down: the point only
            assert set(shapes) == {"w"} and tuple(shapes["w"]) == (d,)
        if r["kind"] == "newton_w_reply":  # up: value, gradient, Hessian (when changed)
            assert set(shapes) - {"hessian"} == {"value", "grad"}


def test_auto_takes_prox_quasi_newton_for_a_non_smooth_h_and_says_why():
    """A convex model with smooth parties and a non-smooth h runs the proximal quasi-Newton
    loop at "auto" (issue 23; exact-admm or Algorithm 2 when forced), and says why not
    quasi-Newton."""
    base = np_model(2, seed=1)
    w = base.variables[0]
    base.regularize(0.01 * cp.norm1(w))  # a non-smooth h
    res = base.solve(method="prox-al")
    assert res.status == "optimal"
    assert res.extra["inner_solver"] == "prox-quasi-newton"
    assert "h is not smooth" in res.extra["inner_solver_note"]
    res = base.solve(method="prox-al", inner_solver="exact-admm", max_outer=1)
    assert res.extra["inner_solver"] == "exact-admm"
    res = base.solve(method="prox-al", inner_solver="admm", max_outer=1)
    assert res.extra["inner_solver"] == "admm"
    with pytest.raises(
        fm.ModelError, match="inner_solver='newton' is not available: h is not smooth"
    ):
        base.solve(method="prox-al", inner_solver="newton")
    with pytest.raises(fm.ModelError, match="inner_solver must be one of"):
        base.solve(method="prox-al", inner_solver="bfgs")


def test_a_client_without_hessians_switches_the_newton_opt_in_to_admm():
    """A client whose terms the Newton backend does not recognise (L-BFGS) says so in its
    ``start`` reply to the Newton opt-in; the server runs Algorithm 2 from the same start
    and reports why. The default quasi-Newton solver needs only its gradients."""
    model = np_model(2, seed=5)
    w = model.variables[0]
    extra = model.client("extra")
    A = extra.data(np.random.default_rng(0).normal(size=(6, w.size)), name="A")
    extra.minimize(0.1 * cp.log_sum_exp(A @ w), name="soft max")
    ref = model.solve(method="centralized", eps=1e-8)
    res = model.solve(method="prox-al", inner_solver="newton")
    assert res.extra["inner_solver"] == "admm"
    assert "client 'extra'" in res.extra["inner_solver_note"]
    assert res.status == "optimal"
    assert abs(res.objective - ref.objective) <= 1e-3 * max(1.0, abs(ref.objective))
    default = model.solve(method="prox-al")
    assert default.extra["inner_solver"] == "quasi-newton" and default.status == "optimal"
    assert abs(default.objective - ref.objective) <= 1e-3 * max(1.0, abs(ref.objective))


def test_newton_defaults_apply_only_when_newton_runs_and_keep_user_options():
    from fedmodel.algorithms.proxal.options import NEWTON_DEFAULTS, ProxALOptions
    from fedmodel.algorithms.proxal.routes import apply_defaults, route_named

    def resolved(name, **kw):
        opts = ProxALOptions(**kw)
        apply_defaults(route_named(name), opts)
        return opts

    opts = ProxALOptions()
    assert (opts.beta, opts.prox_beta) == (100.0, 1e4)  # Algorithm 2's, until resolved
    opts = resolved("newton")
    assert (opts.beta, opts.prox_beta) == (NEWTON_DEFAULTS["beta"], NEWTON_DEFAULTS["prox_beta"])
    given = resolved("newton", beta=50.0)
    assert (given.beta, given.prox_beta) == (50.0, NEWTON_DEFAULTS["prox_beta"])
    admm = resolved("admm")
    assert (admm.beta, admm.prox_beta) == (100.0, 1e4)
    paper = resolved("newton", variant="paper")  # (the paper variant has no Newton defaults)
    assert paper.beta == 10.0
    qn = resolved("quasi-newton")  # (Algorithm 2's)
    assert (qn.beta, qn.prox_beta) == (100.0, 1e4)
    # what a solve used is what it reports (res.options): each inner solver at its beta; a
    # model that falls back to Algorithm 2 keeps Algorithm 2's
    res = np_model(2, seed=1).solve(method="prox-al", history=False)
    assert res.extra["inner_solver"] == "quasi-newton" and res.options["beta"] == 100.0
    res = np_model(2, seed=1).solve(method="prox-al", history=False, inner_solver="newton")
    assert res.extra["inner_solver"] == "newton" and res.options["beta"] == 300.0
    model = np_model(2, seed=1)
    model.regularize(0.01 * cp.norm1(model.variables[0]))
    res = model.solve(method="prox-al", history=False)
    assert res.extra["inner_solver"] == "prox-quasi-newton" and res.options["beta"] == 100.0
    assert res.options["outer_anderson"] == 0  # (the quasi-Newton loops' default)
    res = model.solve(method="prox-al", history=False, inner_solver="exact-admm")
    assert res.extra["inner_solver"] == "exact-admm" and res.options["beta"] == 100.0


def test_a_line_search_that_finds_no_decrease_stalls_at_the_start_point():
    # the reported gradient has the wrong sign: every Newton trial point increases f
    def evaluate(w):
        return float(w @ w), -2 * w, 2 * np.eye(w.size)

    w0 = np.array([1.0, -0.5])
    out = federated_newton(evaluate, (w0, *evaluate(w0)), tau=1e-8, max_rounds=200)
    assert out.stalled and not out.satisfied
    assert np.array_equal(out.w, w0) and out.rounds < 200


def test_a_stalled_newton_inner_solve_ends_the_run_with_its_reason(monkeypatch):
    import fedmodel.algorithms.proxal.newton_route as server_module
    from fedmodel.algorithms.proxal.newton_inner import NewtonOutcome

    def stalled(
        evaluate, start, tau, max_rounds, deadline=None, remodel=0, on_accept=None, noise=0.0
    ):
        return NewtonOutcome(start[0], 3, 1.0, False, stalled=True)

    monkeypatch.setattr(server_module, "federated_newton", stalled)
    res = np_model(2, seed=1).solve(method="prox-al")
    assert res.status == "stalled"
    assert "quasi-newton inner solver stalled" in res.message
    assert "inner_solver='admm'" in res.message


def test_many_shared_variables_take_the_limited_memory_model(monkeypatch):
    """Above DENSE_MODEL_MAX shared variables the server keeps the last curvature pairs
    (two-loop recursion) instead of a d x d matrix; the answer is the same optimum."""
    import fedmodel.algorithms.proxal.newton_route as server_module
    from fedmodel.algorithms.proxal.newton_inner import LimitedSecantModel

    model = np_model(2, seed=1)  # 5 shared variables
    dense = model.solve(method="prox-al", eps=1e-6, history=False)
    monkeypatch.setattr(server_module, "DENSE_MODEL_MAX", 3)
    built = []
    original = LimitedSecantModel.__init__

    def spy(self, n):
        built.append(n)
        original(self, n)

    monkeypatch.setattr(LimitedSecantModel, "__init__", spy)
    limited = model.solve(method="prox-al", eps=1e-6, history=False, curvature_directions=0)
    # (the route's server part is built again when a units round puts the parameters in
    # the objective's units)
    assert built == [5] * (1 if limited.extra["objective_units"][0] == 1.0 else 2)
    assert limited.extra["inner_solver"] == "quasi-newton" and limited.status == "optimal"
    assert limited.objective == pytest.approx(dense.objective, rel=1e-5, abs=1e-8)


def test_measured_stationarity_of_test_8_is_the_certificates():
    """With Newton, test (8)'s stationarity half uses grad l_k(w^{k+1}) - (w^{k+1} - w^k) /
    prox_beta, which is the Lagrangian's gradient at (w^{k+1}, mu^{k+1}): the value the
    certificate recomputes from the clients' own evaluations at the returned point."""
    for model, inner in (
        (np_model(3, seed=2), "quasi-newton"),
        (lcqp_test_model(3, d=12, m=3, seed=0), "newton"),
    ):
        res = model.solve(method="prox-al", eps=1e-4, inner_solver=inner)
        assert res.status == "optimal" and res.extra["inner_solver"] == inner
        measured = res.history[-1]["stationarity_measured"]
        assert measured == pytest.approx(res.kkt.stationarity, rel=1e-3, abs=1e-13)
        assert measured <= 0.01 * 1e-4  # (8) at kkt_factor[0] * eps1


def test_a_route_refused_at_the_start_falls_back_and_says_so_with_the_options_it_ran():
    """inner_solver="newton" on clients whose backend has no exact Hessians (log_sum_exp:
    L-BFGS): the clients refuse at the start, the run takes the fallback route (Algorithm
    2 for a named route) and res.extra names both, why, and the option values the run used
    (newton's defaults were in effect when the halves were built)."""
    rng = np.random.default_rng(0)
    m = fm.Model("lse")
    w = m.variable(3, name="w")
    for k in range(2):
        c = m.client(f"c{k}")
        A = c.data(rng.normal(size=(6, 3)), name="A")
        c.minimize(cp.log_sum_exp(A @ w) / 6 + cp.sum_squares(w) / 10)
    res = m.solve("prox-al", inner_solver="newton", history=False)
    assert res.status == "optimal" and res.extra["inner_solver"] == "admm"
    assert res.extra["inner_solver_refused"] == "newton"
    assert "client 'c0': its subproblem backend" in res.extra["inner_solver_note"]
    assert res.extra["inner_solver_options"]["beta"] == res.options["beta"] == 300.0
    assert {r["kind"] for r in res.ledger} >= {"start_reply", "admm_w_reply"}


def test_the_line_search_takes_a_step_the_values_cannot_resolve():
    """Near the optimum a value that carries rounding (here ~1e-10, as a sum of terms far
    larger than itself does) cannot show the decrease of a step the gradient shows: the
    step is taken when its value rises by rounding only and its gradient falls, so the
    loop reaches a tolerance below the values' resolution (the Armijo test alone stalls)."""
    from fedmodel.algorithms.proxal.newton_inner import federated_newton

    for seed in range(5):
        rng = np.random.default_rng(seed)
        M = rng.normal(size=(6, 6))
        A, b = M @ M.T + np.eye(6), rng.normal(size=6)

        def evaluate(w, A=A, b=b):
            value = 0.5 * w @ A @ w - b @ w + 1e-10 * np.sin(1e9 * float(w.sum()))
            return value, A @ w - b, A + np.eye(6)  # (a model: linear convergence)

        w0 = np.linalg.solve(A, b) + 1e-4 * rng.normal(size=6)
        out = federated_newton(evaluate, (w0, *evaluate(w0)), 1e-9, 60)
        assert out.satisfied and out.residual <= 1e-9, (seed, out.rounds, out.residual)
