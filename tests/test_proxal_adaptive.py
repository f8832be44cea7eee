"""prox-al's adaptive variant (issue 12): each acceleration is checked for what it must
guarantee, and the variant against the paper's Algorithms 1-2 and the centralized optimum."""

import cvxpy as cp
import numpy as np
import pytest
from problems import lcqp_test_model, np_model

import fedmodel as fm
from fedmodel.algorithms.proxal.anderson import AndersonState, anderson_weights
from fedmodel.algorithms.proxal.client import ProxALClient
from fedmodel.algorithms.proxal.options import ProxALOptions


def test_anderson_weights_minimise_the_combined_residual():
    rng = np.random.default_rng(0)
    for _ in range(20):
        R = rng.normal(size=(4, 12))  # four residual vectors
        G = R @ R.T
        alpha = anderson_weights(G)
        assert alpha is not None and np.isclose(alpha.sum(), 1.0)
        combined = float(alpha @ G @ alpha)
        # no affine combination does better, in particular no single residual
        assert combined <= np.diag(G).min() + 1e-12
        for _ in range(20):
            beta = rng.normal(size=4)
            beta /= beta.sum()
            assert combined <= float(beta @ G @ beta) + 1e-9
    assert anderson_weights(np.ones((1, 1))) is None  # one residual: a plain step


def _run_fixed_point(A, b, memory, rounds):
    """Emulate the federated protocol on x -> A x + b: the 'client' keeps outputs and
    residuals and sends Gram rows; the server's AndersonState picks the next input."""
    x = np.zeros(b.size)
    outs, res = [], []
    state = AndersonState(memory) if memory else None
    norms = []
    for _ in range(rounds):
        fx = A @ x + b
        r = fx - x
        norms.append(float(np.linalg.norm(r)))
        if state is None:
            x = fx
            continue
        outs.append(fx)
        res.append(r)
        outs, res = outs[-(memory + 1) :], res[-(memory + 1) :]
        alpha, reset = state.observe(np.array([r @ q for q in res]))
        x = sum(a * o for a, o in zip(alpha, outs[-alpha.size :])) if alpha.size else fx
        if reset:
            outs, res = [], []
    return norms, state


def test_safeguarded_anderson_never_accepts_a_larger_residual_and_accelerates():
    rng = np.random.default_rng(1)
    Q, _ = np.linalg.qr(rng.normal(size=(30, 30)))
    A = Q @ np.diag(np.linspace(0.0, 0.98, 30)) @ Q.T  # a slow averaged linear map
    b = rng.normal(size=30)
    plain, _ = _run_fixed_point(A, b, 0, 60)
    fast, state = _run_fixed_point(A, b, 5, 60)
    # 60 rounds: plain iteration ~8e-2 of the first residual, accelerated ~1e-5
    assert fast[-1] / fast[0] <= 1e-3 * plain[-1] / plain[0]
    # at every accepted input, the residual is no larger than at the last accepted one
    accepted = [r for r, ok in zip(state.residuals, state.accepted) if ok]
    assert all(b <= a * (1 + 1e-12) for a, b in zip(accepted, accepted[1:]))
    # and an accelerated input that does not reduce it is rejected
    state = AndersonState(3)
    state.observe(np.array([1.0]))
    state.observe(np.array([1.0, 1.0]))  # the same residual twice: extrapolation pending
    alpha, reset = state.observe(np.array([1.0, 1.0, 1.0]))
    assert reset and state.accepted[-1] is False


def test_safeguard_rejects_an_accelerated_input_whose_residual_grew():
    state = AndersonState(3)
    state.observe(np.array([4.0]))  # first input: residual 2, plain
    alpha, reset = state.observe(np.array([1.0, 1.0]))  # residual 1: accepted, AA next
    assert alpha.size == 2 and not reset
    alpha, reset = state.observe(np.array([0.0, 0.0, 9.0]))  # AA input: residual 3 > 1
    assert reset and list(alpha) == [1.0, 0.0]  # back to the plain output before it
    assert state.accepted == [True, True, False] and state.rejections == 1


def test_residual_balancing_moves_rho_towards_the_larger_residual():
    compiled = lcqp_test_model(2).compile()
    options = ProxALOptions(beta=10.0, adaptive_rho=True, rb_ratio=10.0, rb_factor=2.0, rb_rounds=3)
    client = ProxALClient(compiled.clients[0], options, rho=1.0, n_clients=2).inner
    client.w_last = np.zeros(client.host.ns)
    w = np.full(client.host.ns, 1e-3)  # small change of w: small dual residual
    client.balance(w + 1.0, w)  # large primal residual: rho grows
    assert client.rho == 2.0
    client.balance(w + 1.0 + 1e-6, w + 1.0)  # w moved, u_i close to it: rho shrinks
    assert client.rho == 1.0
    client.balance(w + 1.0, w + 1.0)  # both residuals zero: kept
    client.balance(w + 5.0, w + 1.0)  # past `rounds` adaptive rounds: rho is kept
    assert client.rho == 1.0 and client.admm_round == 4


@pytest.mark.parametrize("make", [lambda: lcqp_test_model(3), lambda: np_model(3, seed=2)])
def test_adaptive_default_matches_the_optimum_in_fewer_rounds(make):
    model = make()
    ref = model.solve(method="centralized")
    paper = model.solve(method="prox-al", variant="paper", history=False)
    res = model.solve(method="prox-al", history=False)
    assert ref.status == res.status == "optimal"
    # the paper's test (8) is absolute: its point violates a constraint with a budget
    # below 1 by 1.4e-3 of that budget, which the certificate at eps = 1e-3 refuses
    assert paper.status in ("optimal", "inaccurate")
    gap = abs(res.objective - ref.objective) / max(1.0, abs(ref.objective))
    assert gap <= 1e-3
    assert res.rounds["communication"] < paper.rounds["communication"]


def test_each_acceleration_alone_still_certifies():
    model = lcqp_test_model(3)
    ref = model.solve(method="centralized")
    for opts in (
        {"anderson": 0, "adaptive_rho": False},
        {"anderson": 0},
        {"adaptive_rho": False},
        {"relaxation": 1.5, "anderson": 0},
    ):
        res = model.solve(method="prox-al", history=False, **opts)
        assert res.status == "optimal", opts
        assert abs(res.objective - ref.objective) <= 1e-3 * max(1.0, abs(ref.objective)), opts


def test_paper_variant_keeps_the_published_defaults():
    opts = ProxALOptions(variant="paper")
    assert (opts.beta, opts.rho, opts.anderson, opts.adaptive_rho) == (10.0, 1.0, 0, False)
    assert (opts.kkt_factor, opts.relaxation, opts.monitor) == (1.0, 1.0, False)
    with pytest.raises(fm.ModelError, match="variant must be one of"):
        np_model(1).solve(method="prox-al", variant="fast")


@pytest.mark.parametrize("inner", ["admm", "newton"])
def test_kkt_factor_bounds_the_returned_violation(inner):
    """Test (8) at ``kkt_factor[1] * eps2`` on ||mu^{k+1} - mu^k||_inf / beta bounds the
    violation of every constraint at the returned w^{k+1} (where the multipliers were
    updated): the returned point is feasible to ``kkt_factor[1] * eps2``, whatever the
    stationarity half or the inner solver; a float factor scales both halves."""
    model = np_model(3, r=0.3, seed=2)
    violations = {}
    for factors in ((1.0, 1.0), (0.01, 0.01), (0.01, 0.001), (0.1, 1e-4)):
        res = model.solve(
            method="prox-al", eps=1e-3, kkt_factor=factors, inner_solver=inner, history=False
        )
        # at factor 1, test (8) allows an absolute violation eps2 = 1e-3, which is 3e-3 of
        # the budget r = 0.3: the certificate (relative to the budget) may refuse it
        assert res.status == "optimal" or factors[1] == 1.0, factors
        assert res.status in ("optimal", "inaccurate"), factors
        assert res.extra["inner_solver"] == inner
        assert res.max_violation <= factors[1] * 1e-3 * (1 + 1e-9), factors
        violations[factors] = res.max_violation
    if inner == "admm":  # the constraints are active: at eps the bound is not met by accident
        assert violations[(1.0, 1.0)] > 1e-5


def test_test_8_reads_the_bound_of_an_inner_solve_cut_short():
    """Test (8) takes tau_k as the bound on the inner solution's error; an inner solve cut
    short (here max_inner = 1) has only its own measured bound, so the outer iteration at
    which (8) stops the run passes (8) with that bound."""
    rng = np.random.default_rng(0)
    m = fm.Model("cut-short")
    w = m.variable(5, name="w")
    m.server.subject_to(cp.norm(w, 2) <= 0.3)
    for i in range(4):
        A, b = rng.normal(size=(20, 5)), rng.normal(size=20)
        c = m.client(f"c{i}")
        c.minimize(cp.sum_squares(c.data(A, name="A") @ w - c.data(b, name="b")) / 80)
        c.subject_to(cp.sum(w) >= -0.2 + 0.01 * i)
    res = m.solve(method="prox-al", inner_solver="admm", max_inner=1, max_outer=300)
    assert res.status == "optimal", res.message
    beta = res.extra["inner_solver_options"]["beta"]
    last = res.history[-1]
    bound = last["tau"] if last["inner_satisfied"] else max(last["tau"], last["inner_bound"])
    # (8)'s stationarity half at the adaptive default kkt_factor (0.01, 0.001)
    assert last["dw_inf"] + beta * bound <= beta * 0.01 * 1e-3 * (1 + 1e-9)


def test_kkt_factor_is_validated():
    opts = ProxALOptions(kkt_factor=0.05)
    assert opts.kkt_factors == (0.05, 0.05)
    assert ProxALOptions().kkt_factors == (0.01, 0.001)
    for bad in (0.0, 2.0, (0.01, 0.0), (0.1, 0.1, 0.1)):
        with pytest.raises(fm.ModelError, match="kkt_factor"):
            np_model(1).solve(method="prox-al", kkt_factor=bad)


def test_an_infeasible_model_says_infeasible_well_before_max_outer():
    model = fm.Model("infeasible")
    w = model.variable(2, name="w")
    a, b = model.client("a"), model.client("b")
    a.minimize(cp.sum_squares(w))
    a.subject_to(w[0] >= 1)
    b.minimize(cp.sum_squares(w))
    b.subject_to(w[0] <= -1)
    res = model.solve(method="prox-al", max_outer=200, time_limit=60)
    assert res.status == "infeasible" and "Farkas" in res.message
    assert res.rounds["outer"] <= 20


def test_penalty_metric_operations_are_consistent():
    from fedmodel.algorithms.proxal.metric import PenaltyMetric, hessian_metric, shifted_solver

    rng = np.random.default_rng(4)
    B = rng.normal(size=(7, 7))
    M = B @ B.T + 0.1 * np.eye(7)
    met = PenaltyMetric(7, M)
    v = rng.normal(size=7)
    assert np.allclose(met.times(met.solve(v)), v)
    assert np.isclose(np.linalg.norm(met.root(v)) ** 2, v @ M @ v)
    assert np.isclose(np.linalg.norm(met.inverse_root(v)) ** 2, v @ np.linalg.solve(M, v))
    assert np.allclose(
        shifted_solver(met, 0.3, 2.0)(v), np.linalg.solve(0.3 * np.eye(7) + 2 * M, v)
    )
    ident = PenaltyMetric(7)
    assert ident.is_identity and np.array_equal(ident.solve(v), v)
    # only the upper triangle is read; a singular Hessian is made positive definite
    H = np.triu(np.outer(v, v))
    met = hessian_metric(H, 1e-8)
    assert np.allclose(met.matrix, np.outer(v, v) + 1e-8 * (v * v).max() * np.eye(7))
    assert hessian_metric(np.zeros((3, 3)), 1e-8).is_identity


@pytest.mark.parametrize("make", [lambda: lcqp_test_model(3), lambda: np_model(3, seed=2)])
def test_hessian_metric_keeps_the_inner_bound_valid_and_cuts_rounds(make):
    """The bound (19) stays a certificate under the metric (status "optimal" is decided by
    the recomputed KKT residuals at eps = 1e-6), the answer is the optimum, and Algorithm 2
    needs fewer rounds than with the identity (everything else equal)."""
    model = make()
    ref = model.solve(method="centralized", eps=1e-8)
    runs = {}
    for metric in ("scalar", "hessian"):
        res = model.solve(
            method="prox-al", eps=1e-6, penalty_metric=metric, inner_solver="admm", history=True
        )
        assert res.status == "optimal" and res.kkt.satisfied(1e-6, 1e-6), metric
        assert res.extra["penalty_metric"] == metric
        # |f - f*| <= eps * (||w - w*||_1 + sum of |multipliers|) at a certified point
        scale = np.abs(ref.x).sum() + np.abs(res.x).sum() + 10.0
        assert abs(res.objective - ref.objective) <= 1e-6 * scale, metric
        for row in res.history:
            assert row["inner_bound"] <= row["tau"] or row["inner_iterations"] == 500
        runs[metric] = res.rounds["inner"]
        sent = [r for r in res.ledger if "metric" in r["shapes"]]
        if metric == "scalar":
            assert not sent
        elif compiled_is_quadratic(model):  # the Hessian never changes: sent once per
            # start (a units round puts P_{i,k} in the objective's units)
            starts = 1 if res.extra["objective_units"][0] == 1.0 else 2
            assert sorted(r["sender"] for r in sent) == sorted(
                starts * [c.name for c in model.compile().clients]
            )
        else:  # a logistic Hessian moves: re-evaluated (and resent) within runs too
            assert any(r["kind"] == "admm_w_reply" for r in sent)
    assert runs["hessian"] < runs["scalar"]


def compiled_is_quadratic(model) -> bool:
    from fedmodel.subproblems.merit import MeritProblem
    from fedmodel.subproblems.newton import NewtonSolver

    return all(NewtonSolver(MeritProblem([c], 1.0)).quadratic for c in model.compile().clients)


def test_hessian_metric_falls_back_to_scalar_on_a_nonconvex_model():
    from problems import fairness_test_model

    res = fairness_test_model(2).solve(method="prox-al", eps=1e-4)
    assert res.status == "optimal"
    assert res.extra["penalty_metric"] == "scalar"
    assert not [r for r in res.ledger if "metric" in r["shapes"]]


def test_hessian_metric_falls_back_to_scalar_for_a_nonsmooth_h():
    model = lcqp_test_model(2)
    model.regularize(0.01 * cp.norm1(model.variables[0]))
    res = model.solve(method="prox-al", eps=1e-5)
    assert res.status == "optimal"
    assert res.extra["penalty_metric"] == "scalar"
    sizes = {tuple(s) for r in res.ledger for k, s in r["shapes"].items() if k == "metric"}
    assert not sizes  # nothing but Algorithm 2's vectors


def test_local_cap_certifies_and_saves_the_rounds_q_t_costs():
    """local_cap asks the local solves for at most local_cap * tau_k: the same certified
    answer, in fewer rounds than the paper's q^t schedule (which alone needs
    log(tau)/log(q) rounds before (19) can hold)."""
    model = lcqp_test_model(3)
    ref = model.solve(method="centralized", eps=1e-8)
    rounds = {}
    for cap in (0.0, 0.1):
        res = model.solve(
            method="prox-al", eps=1e-5, local_cap=cap, inner_solver="admm", history=False
        )
        assert res.status == "optimal" and res.kkt.satisfied(1e-5, 1e-5), cap
        assert abs(res.objective - ref.objective) <= 1e-3 * max(1.0, abs(ref.objective))
        rounds[cap] = res.rounds["inner"]
    assert rounds[0.1] < rounds[0.0]
    with pytest.raises(fm.ModelError, match="local_cap"):
        model.solve(method="prox-al", local_cap=2.0)


def test_a_monitor_stop_at_a_certified_point_is_optimal():
    """ "diverging"/"stalled" describe the iteration; when the point returned is certified
    the status says so (and keeps the monitor's reason in the message)."""
    from fedmodel.algorithms.proxal.server import ProxALServer
    from fedmodel.certificate.kkt import KKTResiduals

    compiled = lcqp_test_model(2).compile()
    opts = ProxALOptions(eps=1e-3)
    opts.validate(compiled, "prox-al")
    server = ProxALServer(compiled.server, compiled.regularizer, {"client1": 1.0, "client2": 1.0},
                          2, opts, x0=np.zeros(compiled.layout.size))  # fmt: skip
    good = KKTResiduals(stationarity=1e-4, feasibility=1e-5)
    bad = KKTResiduals(stationarity=1e-4, feasibility=1e-2)
    status, message = server.conclude("diverging", "the multipliers diverge", good, {}, [])
    assert status == "optimal" and "certified" in message and "diverge" in message
    status, message = server.conclude("diverging", "the multipliers diverge", bad, {}, [])
    assert status == "diverging"
    status, _ = server.conclude("stalled", "the inner ADMM stalled", good, {}, [])
    assert status == "optimal"
