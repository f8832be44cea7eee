"""prox-al's proximal quasi-Newton inner solver (``inner_solver="prox-quasi-newton"``,
fedmodel/algorithms/proxal/prox_newton.py): the server's model step against cvxpy, the loop's
stopping test, the routing of "auto", and prox-al on an l1-logistic model against cvxpy on
the pooled problem."""

import time
import warnings

import cvxpy as cp
import numpy as np
import pytest
from problems import CLARABEL_TIGHT, route, routing_model

import fedmodel as fm
from fedmodel.algorithms.proxal.newton_inner import LimitedSecantModel
from fedmodel.algorithms.proxal.prox_newton import (
    ModelOperator,
    federated_prox_newton,
    model_step,
)
from fedmodel.compiler.regularizer import Regularizer, VariablePiece


def _spd(n, seed, cond=50.0):
    rng = np.random.default_rng(seed)
    Q, _ = np.linalg.qr(rng.normal(size=(n, n)))
    return Q @ np.diag(np.geomspace(1.0, cond, n)) @ Q.T


PIECES = {
    "l1": VariablePiece(l1=0.7),
    "elastic net": VariablePiece(l1=0.4, sumsq=0.3),
    "l1 + box": VariablePiece(l1=0.2, lower=-0.3, upper=0.5, has_box=True),
    "group norm": VariablePiece(l2=1.5),
    "ball": VariablePiece(sumsq=0.1, radius=0.4),
}


@pytest.mark.parametrize("kind", list(PIECES))
def test_the_model_step_solves_its_subproblem_as_cvxpy_does(kind):
    """``min g^T (x - w) + (x - w)^T B (x - w) / 2 + h(x)`` on the server (no rounds): the
    point cvxpy finds, for every kind of h piece the regulariser has a prox for."""
    n = 6
    B = _spd(n, seed=1)
    rng = np.random.default_rng(2)
    g, w = 3 * rng.normal(size=n), np.clip(0.2 * rng.normal(size=n), -0.1, 0.1)
    reg = Regularizer.from_pieces([slice(0, n)], [PIECES[kind]])
    x, res, _ = model_step(g, ModelOperator(B), reg, w, tol=1e-11, max_iter=20_000)
    assert res <= 1e-11
    assert reg.dist_subdiff(x, g + B @ (x - w)) <= 1e-11  # (measured independently)

    X = cp.Variable(n)
    obj, cons = reg.cvxpy_parts([X])
    prob = cp.Problem(cp.Minimize(g @ (X - w) + 0.5 * cp.quad_form(X - w, B) + obj), cons)
    with warnings.catch_warnings():  # ("inaccurate" at these tolerances on the cone forms)
        warnings.simplefilter("ignore")
        prob.solve(solver="CLARABEL", **CLARABEL_TIGHT)
    # B >= I: |x - x*|^2 / 2 <= phi(x) - phi(x*); the points agree to cvxpy's accuracy
    phi = g @ (x - w) + 0.5 * (x - w) @ B @ (x - w) + reg.value(x)
    assert phi <= prob.value + 1e-8
    assert np.abs(x - X.value).max() <= 1e-5


def test_the_compact_form_of_the_limited_memory_model_is_its_bfgs_recursion():
    rng = np.random.default_rng(3)
    n = 30
    A = _spd(n, seed=4)
    model = LimitedSecantModel(n)
    for _ in range(8):
        s = rng.normal(size=n)
        model.update(s, A @ s)
    view = model.view(np.full(n, 0.01), None)
    op = ModelOperator(view)
    for _ in range(3):
        v = rng.normal(size=n)
        assert np.allclose(op.times(v), view.times(v), rtol=1e-10, atol=1e-12)
    top = np.linalg.eigvalsh(np.array([op.times(e) for e in np.eye(n)])).max()
    assert op.lipschitz() >= 0.9 * top  # (model_step doubles it when a step says so)


def _slow_problem():
    """A quadratic with an l1 term and a crude constant model ``10 I``: the loop is then a
    proximal-gradient method whose residual falls by about 0.9 per round, so a stopping test
    looser than ``tau`` would return a point whose residual exceeds ``tau``."""
    A = np.diag(np.linspace(1.0, 10.0, 8))
    b = np.linspace(-3.0, 3.0, 8)
    model = 10.0 * np.eye(8)
    reg = Regularizer.from_pieces([slice(0, 8)], [VariablePiece(l1=0.5)])

    def evaluate(w):
        return 0.5 * w @ A @ w - b @ w, A @ w - b, model

    return A, b, reg, evaluate


def test_the_loop_stops_on_the_measured_subdifferential_distance():
    """The point returned satisfies ``dist(0, grad S(w) + dh(w)) <= tau`` measured here
    from the problem itself (not the loop's numbers), and is not the start; with a
    weakened test (a multiple of tau, or the model step's own residual) it would not."""
    A, b, reg, evaluate = _slow_problem()
    w0 = np.zeros(8)
    tau = 1e-6
    assert reg.dist_subdiff(w0, A @ w0 - b) > 1e3 * tau
    out = federated_prox_newton(evaluate, (w0, *evaluate(w0)), reg, tau, max_rounds=500)
    assert out.satisfied and out.rounds > 20
    measured = reg.dist_subdiff(out.w, A @ out.w - b)
    assert measured <= tau
    assert out.residual == pytest.approx(measured, rel=1e-12, abs=1e-15)
    # the rounds cap: an unsatisfied outcome at the last accepted point
    short = federated_prox_newton(evaluate, (w0, *evaluate(w0)), reg, tau, max_rounds=5)
    assert not short.satisfied and short.rounds == 5
    assert short.residual == pytest.approx(reg.dist_subdiff(short.w, A @ short.w - b))


def test_the_loop_ends_at_its_rounding_floor_short_of_max_rounds():
    """Gradients with noise of 1e-6 and values of size 1e9 (an augmented Lagrangian with a
    raised penalty): tau = 1e-9 is below the floor, so the loop ends unsatisfied within
    FLOOR_ROUNDS of the residual's last halving, not after max_rounds."""
    from fedmodel.algorithms.proxal.prox_newton import FLOOR_ROUNDS

    rng = np.random.default_rng(0)
    A = np.diag(np.linspace(1.0, 4.0, 6))
    b = np.linspace(-1.0, 1.0, 6)
    reg = Regularizer.from_pieces([slice(0, 6)], [VariablePiece(l1=0.1)])

    def evaluate(w):
        noise = 1e-6 * rng.standard_normal(6)
        return 1e9 + 0.5 * w @ A @ w - b @ w, A @ w - b + noise, A

    w0 = np.zeros(6)
    out = federated_prox_newton(evaluate, (w0, *evaluate(w0)), reg, 1e-9, max_rounds=500)
    assert not out.satisfied and not out.stalled and not out.timed_out and out.floor
    assert out.rounds <= 3 * FLOOR_ROUNDS
    # the point is the minimiser to the noise's size (coordinates beyond the l1 threshold)
    expected = np.sign(b) * np.maximum(np.abs(b) - 0.1, 0.0) / np.diag(A)
    assert np.abs(out.w - expected).max() <= 1e-5


def test_an_inner_solve_at_its_floor_asks_for_the_certificate_when_feasible():
    """Test (8) failed on the absolute stationarity of an inner solve at its rounding
    floor: the certificate is evaluated when the measured violation and complementarity
    meet (8)'s targets, and not otherwise."""
    from types import SimpleNamespace

    from fedmodel.algorithms.proxal.inner import InnerOutcome
    from fedmodel.algorithms.proxal.server import ProxALServer

    server = SimpleNamespace(
        kkt_factors=(0.5, 0.5), options=SimpleNamespace(eps2=1e-6), eps1_units=1e-6
    )

    def outcome(floor):
        return InnerOutcome(np.zeros(2), 3, 1e-5, False, 1e-5, floor=floor)

    ask = ProxALServer.floor_near_stop
    assert ask(server, outcome(True), (4e-7, 0.0))
    assert not ask(server, outcome(False), (4e-7, 0.0))  # (not at the floor: (8) decides)
    assert not ask(server, outcome(True), (6e-7, 0.0))  # (the violation misses eps2)
    assert not ask(server, outcome(True), (4e-7, 6e-7))  # (complementarity misses eps1)
    assert not ask(server, outcome(True), None)  # (nothing measured)


def test_a_measured_stationarity_within_eps_asks_for_the_certificate_with_a_growing_wait():
    """Test (8) failed on ``kkt_factor * eps1``: the certificate is evaluated when the
    measured stationarity is within ``eps1`` and the measured violation and
    complementarity meet (8)'s targets; a try that fails doubles the outer iterations
    until the next (outer iterations 0, 1, 3, 7, 15: five tries in 16)."""
    from types import SimpleNamespace

    from fedmodel.algorithms.proxal.server import ProxALServer

    server = SimpleNamespace(
        kkt_factors=(0.01, 0.5),
        options=SimpleNamespace(eps2=1e-6),
        eps1_units=1e-6,
        near_next=[0, 1],
        k=0,
    )
    ask = ProxALServer.measured_near_stop
    assert not ask(server, 2e-6, (0.0, 0.0))  # (the stationarity misses eps1)
    assert not ask(server, None, (0.0, 0.0))  # (not measured)
    assert not ask(server, 5e-7, None)
    assert not ask(server, 5e-7, (6e-7, 0.0))  # (the violation misses (8)'s eps2 target)
    assert not ask(server, 5e-7, (0.0, 2e-8))  # (complementarity misses kkt_factor eps1)
    tries = []
    for k in range(16):
        server.k = k
        if ask(server, 5e-7, (0.0, 0.0)):
            tries.append(k)
    assert tries == [0, 1, 3, 7, 15]


@pytest.mark.parametrize("eps", [1e-3, 1e-6])
def test_prox_al_stops_at_the_first_outer_iteration_whose_certificate_holds(eps):
    """Test (8) asks ``kkt_factor * eps1`` (1e-2 eps1) of the measured stationarity; the
    certificate, evaluated once that stationarity is within ``eps1``, ends the run where it
    holds: every outer iteration before the last fails the certificate (the history's
    scaled residuals) and the last meets it, with the objective within eps of cvxpy's."""
    model, prob, W = _l1_logistic()
    res = model.solve(method="prox-al", eps=eps, inner_solver="prox-quasi-newton")
    assert res.status == "optimal", res.message
    rows = [r for r in res.history if "scaled_stationarity" in r]

    def holds(r):
        return r["scaled_stationarity"] <= eps and r["scaled_feasibility"] <= eps

    assert len(rows) >= 2 and holds(rows[-1])
    assert not any(holds(r) for r in rows[:-1])
    f_star = prob.value
    W.value = res.x
    assert abs(prob.objective.value - f_star) <= eps * max(1.0, abs(f_star))


def test_the_loop_and_the_model_step_respect_a_deadline():
    A, b, reg, evaluate = _slow_problem()
    w0 = np.zeros(8)
    past = time.perf_counter() - 1.0
    out = federated_prox_newton(evaluate, (w0, *evaluate(w0)), reg, 1e-12, 500, deadline=past)
    assert out.timed_out and out.rounds == 0
    x, _, iterations = model_step(A @ w0 - b, ModelOperator(A), reg, w0, 1e-14, deadline=past)
    assert iterations <= 1


def test_closest_subgradient_has_the_norm_of_dist_subdiff():
    rng = np.random.default_rng(5)
    for kind, piece in PIECES.items():
        reg = Regularizer.from_pieces([slice(0, 5)], [piece])
        for _ in range(20):
            x = reg.prox(rng.normal(size=5), 0.5)  # (points on kinks and bounds)
            g = rng.normal(size=5)
            r = reg.closest_subgradient(x, g)
            assert np.abs(r).max() == pytest.approx(reg.dist_subdiff(x, g), abs=1e-12), kind


def _l1_logistic(n=3, rows=15, d=8, lam=0.02, seed=0):
    rng = np.random.default_rng(seed)
    w_true = rng.normal(size=d) * (rng.random(d) < 0.5)
    m = fm.Model("l1-logistic")
    w = m.variable(d, name="w")
    W = cp.Variable(d)
    pooled = 0
    for k in range(n):
        X = rng.normal(size=(rows, d))
        y = np.where(X @ w_true + 0.5 * rng.normal(size=rows) > 0, 1.0, -1.0)
        c = m.client(f"c{k}")
        Xd, yd = c.data(X, name="X"), c.data(y, name="y")
        c.minimize(cp.sum(cp.logistic(-cp.multiply(yd, Xd @ w))) / (n * rows))
        pooled = pooled + cp.sum(cp.logistic(-cp.multiply(y, X @ W))) / (n * rows)
    m.regularize(lam * cp.norm1(w))
    prob = cp.Problem(cp.Minimize(pooled + lam * cp.norm1(W)))
    prob.solve(solver="CLARABEL", **CLARABEL_TIGHT)
    return m, prob, W


@pytest.mark.parametrize("eps", [1e-4, 1e-6])
def test_prox_al_with_the_proximal_quasi_newton_loop_matches_cvxpy_on_the_pooled_problem(eps):
    """l1-regularised logistic regression over 3 clients: "optimal", and the objective of
    the returned w on the pooled data within eps (relative) of plain cvxpy's optimum; the
    l1 zeros are exact zeros where cvxpy's solution is zero (h's prox)."""
    model, prob, W = _l1_logistic()
    res = model.solve(method="prox-al", eps=eps, inner_solver="prox-quasi-newton")
    assert res.status == "optimal", res.message
    assert res.extra["inner_solver"] == "prox-quasi-newton"
    W_star = W.value.copy()
    f_star = prob.value
    W.value = res.x
    gap = (prob.objective.value - f_star) / max(1.0, abs(f_star))
    assert -eps <= gap <= eps
    zeros = np.abs(W_star) <= 1e-7
    assert zeros.any() and np.all(res.x[zeros] == 0.0)
    # every outer iteration's inner solve met its test, measured: dist(0, d l_k) <= tau_k
    rows = [r for r in res.history if "inner_satisfied" in r]
    assert rows and all(r["inner_satisfied"] and r["inner_bound"] <= r["tau"] for r in rows)


def test_the_loop_sends_only_the_quasi_newton_messages():
    """O(d) messages: the clients see the quasi-Newton inner solver's kinds (value and
    gradient, d + 1 floats, plus Hessian-vector products along a few directions) and never
    a d x d matrix; h and the model step stay on the server."""
    model, _, _ = _l1_logistic()
    res = model.solve(method="prox-al", eps=1e-4)
    d = res.x.size
    assert res.extra["inner_solver"] == "prox-quasi-newton"
    algo = [r for r in res.ledger if r["channel"] == "algorithm"]
    kinds = {r["kind"] for r in algo}
    assert "curvature_w" in kinds or "gradient_w" in kinds
    assert not kinds & {"newton_w", "admm_w", "xadmm_w"}
    for r in algo:
        for shape in dict(r["shapes"]).values():
            assert int(np.prod(shape)) <= 4 * d + 1  # ((k + 1) d + 1 with k <= 3 directions)


def _routing_model(client_term="logistic", server_con=None, reg="l1"):
    return routing_model(client_term, server_con=server_con, reg=reg)


@pytest.mark.parametrize(
    "client_term, server_con, reg, expected",
    [
        ("logistic", None, "l1", "prox-quasi-newton"),  # smooth parties, l1 in h
        ("logistic", None, "group", "prox-quasi-newton"),  # a group norm in h
        ("logistic", lambda w: [cp.sum(w) == 1], "l1", "prox-quasi-newton"),  # equalities
        ("logistic", None, "sumsq", "quasi-newton"),  # a smooth h: the smooth loop
        ("logistic", lambda w: [w <= 1], "l1", "exact-admm"),  # inequality walls
        ("hinge", None, "l1", "exact-admm"),  # a non-smooth party term (epigraph pieces)
        ("kl", None, "l1", "exact-admm"),  # a restricted domain
    ],
)
def test_auto_routes_a_non_smooth_h_with_smooth_parties_to_prox_quasi_newton(
    client_term, server_con, reg, expected
):
    mode, note = route(_routing_model(client_term, server_con, reg))
    assert mode == expected
    assert ("prox-quasi-newton" in note) == (expected == "prox-quasi-newton")


def test_the_prox_quasi_newton_routing_keeps_its_limits():
    model = _routing_model()
    # below eps = 1e-5 too; a non-smooth party term takes exact-admm at every eps (below
    # 1e-5 a run whose certificate fails at its lowest floor hands over to Algorithm 2)
    assert route(model, eps=1e-6)[0] == "prox-quasi-newton"
    assert route(_routing_model(client_term="hinge"), eps=1e-6)[0] == "exact-admm"
    # the user's choice is kept, and refused where the loop cannot run
    assert route(model, inner_solver="exact-admm")[0] == "exact-admm"
    assert route(model, eps=1e-6, inner_solver="prox-quasi-newton")[0] == "prox-quasi-newton"
    with pytest.raises(fm.ModelError, match="prox-quasi-newton' is not available: parties own"):
        route(_routing_model("hinge"), inner_solver="prox-quasi-newton")
    with pytest.raises(fm.ModelError, match="h is smooth"):
        route(_routing_model(reg="sumsq"), inner_solver="prox-quasi-newton")


def test_a_time_limit_far_below_one_round_stops_prox_al_with_the_loop():
    """The run's deadline reaches the loop (and its model steps): with a time limit far
    below one round, prox-al returns after the first inner round with status time_limit."""
    model, _, _ = _l1_logistic()
    res = model.solve("prox-al", time_limit=1e-9)
    assert res.extra["inner_solver"] == "prox-quasi-newton"
    assert res.status == "time_limit", res.message
    assert res.rounds["outer"] == 1 and res.rounds["inner"] <= 1, res.rounds
    assert np.all(np.isfinite(np.asarray(res.solution["w"], dtype=float)))


def test_resume_mid_run_repeats_the_uninterrupted_run_bit_for_bit(tmp_path):
    """The loop's state is the server half's (the secant model, a declared component):
    a run resumed from a checkpoint after two outer iterations is the uninterrupted run."""
    import json

    model, _, _ = _l1_logistic()
    reference = model.solve("prox-al", eps=1e-5, inner_solver="prox-quasi-newton")
    assert reference.status == "optimal" and reference.rounds["outer"] > 2
    path = tmp_path / "ck"
    first = model.solve(
        "prox-al", eps=1e-5, inner_solver="prox-quasi-newton", checkpoint=str(path),
        checkpoint_every=1, max_outer=2,
    )  # fmt: skip
    assert first.status == "max_iterations"
    assert json.loads((path / "manifest.json").read_text())["iteration"] == 2
    resumed = model.solve("prox-al", eps=1e-5, inner_solver="prox-quasi-newton", resume=str(path))
    assert resumed.status == "optimal"
    assert np.array_equal(resumed.x, reference.x)
    assert resumed.rounds == reference.rounds


def test_the_processes_backend_gives_the_serial_iterates():
    model, _, _ = _l1_logistic()
    serial = model.solve("prox-al", eps=1e-4)
    procs = model.solve("prox-al", eps=1e-4, backend="processes", workers=2)
    assert procs.status == serial.status == "optimal"
    assert procs.extra["inner_solver"] == "prox-quasi-newton"
    assert np.array_equal(procs.x, serial.x)
    assert procs.rounds == serial.rounds
