"""Seed 003's mathematics: MLP gradients, feature-based gradient assembly, the closed forms
(10), (24), (38)-(39), Lemma 1 and the slack problem against cvxpy, SSCA == momentum SGD."""

from __future__ import annotations

import cvxpy as cp
import numpy as np
import pytest

import fedmodel as fm
from fedmodel.algorithms.ssca.options import Schedule, check_conditions
from fedmodel.algorithms.ssca.sample import sample_batch
from fedmodel.algorithms.ssca.surrogate import SurrogateState
from fedmodel.errors import ModelError
from fedmodel.losses import CallableLoss, SwishMLP, swish, swish_prime
from fedmodel.subproblems.penalty_qcqp import CvxpyPenaltyQCQP, lemma1, solve_penalty_qcqp


def data(n=30, P=7, L=3, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, P)), rng.integers(0, L, size=n)


# -- the MLP -------------------------------------------------------------------------------------
def test_swish_derivative_by_finite_differences():
    z = np.linspace(-30, 30, 241)
    fd = (swish(z + 1e-6) - swish(z - 1e-6)) / 2e-6
    assert np.allclose(swish_prime(z), fd, atol=1e-8)


def test_mlp_gradients_by_finite_differences():
    X, Y = data()
    net = SwishMLP(P=7, J=5, L=3)
    w = net.init(seed=2)
    value, grad = net.value_and_grad(w, X, Y)
    assert value == pytest.approx(net.total(w, X, Y), rel=1e-13)
    eye = np.eye(net.dim)
    h = 1e-6
    fd = np.array(
        [(net.total(w + h * e, X, Y) - net.total(w - h * e, X, Y)) / (2 * h) for e in eye]
    )
    # central differences: O(h^2) truncation plus O(eps |f| / h) rounding
    assert np.max(np.abs(fd - grad)) < 1e-6 * max(1.0, np.abs(grad).max())
    # the per-sample a_bar, b_bar, c_bar add up to the batch's gradient and loss
    c, a_bar, b_bar = net.per_sample(w, X, Y)
    assert np.allclose(net.pack(a_bar.sum(0), b_bar.sum(0)), grad, atol=1e-12)
    assert c.sum() == pytest.approx(value, rel=1e-12)
    assert np.all(c > 0)  # +f = -sum_l y log Q (the paper's c_bar has the opposite sign)


@pytest.mark.parametrize("seed", range(4))
def test_feature_gradients_from_exchanged_h_equal_the_centralized_gradient(seed):
    rng = np.random.default_rng(seed)
    P = 9
    X, Y = data(n=12, P=P, L=4, seed=seed)
    net = SwishMLP(P=P, J=6, L=4)
    w = net.init(seed)
    # a random partition of the columns into 1..5 blocks (some may be single columns)
    k = int(rng.integers(1, 6))
    labels = np.concatenate([np.arange(k), rng.integers(0, k, size=P - k)])
    rng.shuffle(labels)
    blocks = [np.flatnonzero(labels == i) for i in range(k)]
    index = net.split(blocks)
    H = sum(net.h(w[index[i + 1]], X[:, b]) for i, b in enumerate(blocks))
    value, g0, dH = net.top(w[index[0]], H, Y)
    g = np.zeros(net.dim)
    g[index[0]] = g0
    for i, b in enumerate(blocks):
        g[index[i + 1]] = net.block_grad(w[index[i + 1]], X[:, b], dH)
    v_ref, g_ref = net.value_and_grad(w, X, Y)
    assert value == pytest.approx(v_ref, rel=1e-12)
    assert np.allclose(g, g_ref, rtol=1e-12, atol=1e-12)
    assert sorted(np.concatenate(index).tolist()) == list(range(net.dim))


def test_split_refuses_a_non_partition():
    with pytest.raises(ValueError, match="partition"):
        SwishMLP(P=4, J=2, L=2).split([[0, 1], [1, 2, 3]])


# -- closed forms against cvxpy --------------------------------------------------------------------
def test_unconstrained_closed_forms_10_24_38_39_match_cvxpy():
    rng = np.random.default_rng(0)
    d, tau, lam = 6, 0.3, 0.05
    st = SurrogateState(d, tau, lam=lam)
    for t in range(1, 4):  # a few recursion steps
        st.update(1.0 / t**0.5, rng.normal(size=d), rng.normal(size=d))
    w_bar, _ = st.solve()
    w = cp.Variable(d)
    cp.Problem(cp.Minimize((st.f1 + 2 * lam * st.beta) @ w + tau * cp.sum_squares(w))).solve(
        solver="CLARABEL"
    )
    assert np.allclose(w_bar, w.value, atol=1e-7)
    # (10)/(24): lam = 0
    st0 = SurrogateState(d, tau)
    st0.update(1.0, np.zeros(d), np.ones(d))
    assert np.allclose(st0.solve()[0], -np.ones(d) / (2 * tau))


def lemma_case(kind, rng, d=5, tau=0.2):
    a = rng.normal(size=d)
    b = a @ a
    if kind == "interior":
        C, U, c = 1.0, 0.9, 1e5  # U - C slightly negative, b + 4 tau (U - C) > 0
    elif kind == "nu_c_branch":
        C, U, c = 1.0 + b / (4 * tau) + 1.0, 0.0, 1e3  # b + 4 tau (U - C) <= 0
    elif kind == "clipped_at_c":
        C, U, c = 1.0, 0.9, 1e-3
    else:  # inactive: C <= U, nu = 0, w = 0
        C, U, c = 0.2, 0.5, 1e5
    return a, C, U, tau, c


@pytest.mark.parametrize("kind", ["interior", "nu_c_branch", "clipped_at_c", "inactive"])
def test_lemma1_against_cvxpy_and_the_dual_solver(kind):
    rng = np.random.default_rng(3)
    a, C, U, tau, c = lemma_case(kind, rng)
    sol = lemma1(a, C, U, tau, c)
    d = len(a)
    ref = CvxpyPenaltyQCQP(d, 1, 1.0, tau, c).solve(np.zeros(d), a[None, :], np.array([C - U]))
    dual = solve_penalty_qcqp(np.zeros(d), 1.0, a[None, :], np.array([C - U]), tau, c)
    scale = max(1.0, np.abs(ref.w).max())
    assert np.allclose(sol.w, ref.w, atol=1e-6 * scale)
    assert np.allclose(sol.w, dual.w, atol=1e-10 * scale)
    assert sol.nu[0] == pytest.approx(dual.nu[0], rel=1e-8, abs=1e-12)
    assert sol.nu[0] == pytest.approx(float(ref.nu[0]), rel=1e-4, abs=1e-6)
    # KKT of (41): 0 <= nu <= c, s = max(0, constraint), complementary slackness
    assert 0 <= sol.nu[0] <= c
    assert sol.s[0] == pytest.approx(max(0.0, sol.values[0]), abs=1e-12)
    assert abs(sol.nu[0] * min(0.0, sol.values[0])) < 1e-9 * max(1.0, c)
    if kind == "inactive":
        assert sol.nu[0] == 0 and np.all(sol.w == 0)
    if kind in ("nu_c_branch", "clipped_at_c"):
        assert sol.nu[0] == c and sol.s[0] > 0
    if kind == "interior":
        assert 0 < sol.nu[0] < c and abs(sol.values[0]) < 1e-9


def test_slack_problem_with_several_constraints_matches_cvxpy():
    rng = np.random.default_rng(5)
    d, M, tau, c = 8, 3, 0.25, 5.0
    for k0, a0 in ((tau, rng.normal(size=d)), (1.0, np.zeros(d))):
        A, e = rng.normal(size=(M, d)), rng.normal(size=M)
        sol = solve_penalty_qcqp(a0, k0, A, e, tau, c)
        ref = CvxpyPenaltyQCQP(d, M, k0, tau, c).solve(a0, A, e)
        assert sol.residual < 1e-10
        assert np.allclose(sol.w, ref.w, atol=1e-5)
        assert np.allclose(sol.s, np.maximum(sol.values, 0))
        obj = k0 * sol.w @ sol.w + a0 @ sol.w + c * sol.s.sum()
        ref_obj = k0 * ref.w @ ref.w + a0 @ ref.w + c * ref.s.sum()
        assert obj <= ref_obj + 1e-7 * max(1.0, abs(ref_obj))


def test_lemma1_refused_where_it_does_not_apply():
    with pytest.raises(ValueError, match="Lemma 1"):
        SurrogateState(3, 0.1, objective="loss", bounds=[1.0], solver="lemma1")


# -- schedules ---------------------------------------------------------------------------------------
def test_schedule_conditions():
    assert check_conditions(Schedule(1.0, 0.6), Schedule(1.0, 0.9))["satisfied"]
    paper = check_conditions(Schedule(0.9, 0.1), Schedule(0.5, 0.1))
    assert not paper["satisfied"] and any("gamma_t / rho_t" in f for f in paper["failed"])
    assert not check_conditions(Schedule(2.0, 0.6), Schedule(1.0, 0.9))["satisfied"]  # rho_1 > 1
    custom = check_conditions(Schedule(fn=lambda t: 1 / t), Schedule(fn=lambda t: t**-0.9))
    assert custom["unchecked"]
    with pytest.raises(ModelError, match="rho"):
        Schedule.of("fast", "rho")


def test_power_schedules_are_range_checked_at_both_ends_without_a_loop():
    """A power schedule's range over ``t = 1..rounds`` is read from its two ends (it is
    monotone), so a growing one that passes 1 only late is caught, and the check of a run of
    a billion rounds costs nothing before its time limit starts."""
    growing = Schedule(0.5, -0.1)  # 0.998 at t = 1000, 1.26 at t = 10,000
    assert "0 < rho_t <= 1" not in " ".join(
        check_conditions(growing, Schedule(1.0, 0.9), rounds=1000)["failed"]
    )
    late = check_conditions(growing, Schedule(1.0, 0.9), rounds=10_000)["failed"]
    assert any("0 < rho_t <= 1 fails on t = 1..10000" in f for f in late), late
    assert check_conditions(Schedule(1.0, 0.6), Schedule(1.0, 0.9), rounds=10**9)["satisfied"]


# -- SSCA with rho_1 = 1 is momentum SGD (11)-(12) ----------------------------------------------------
def small_model(n_clients=3, rows=(20, 17, 23), P=5, J=4, L=3, seed=0, **kw):
    rng = np.random.default_rng(seed)
    model = fm.LearningModel(SwishMLP(P=P, J=J, L=L), **kw)
    for k in range(n_clients):
        X = rng.normal(size=(rows[k], P))
        Y = (X[:, 0] > 0).astype(int) + (X[:, 1] > 0.5).astype(int)
        model.client(f"c{k}", X, Y)
    return model


@pytest.mark.parametrize("T", [1, 2, 25])
def test_ssca_with_rho1_equal_one_is_momentum_sgd_iterate_for_iterate(T):
    model = small_model()
    rho, gamma, tau, B, seed = Schedule(1.0, 0.4), Schedule(0.8, 0.6), 0.3, 6, 7
    res = model.solve(
        "ssca", rounds=T, batch_size=B, rho=rho, gamma=gamma, tau=tau, seed=seed, eval_every=0
    )
    net = model.loss
    N = model.n_samples
    w = net.init(seed)
    v = np.zeros(net.dim)
    gamma_prev = 0.0
    for t in range(1, T + 1):
        g = np.zeros(net.dim)
        for k, (X, Y) in enumerate(model.clients.values()):
            idx = sample_batch(seed, k, t, len(X), B)
            g += len(X) / (B * N) * net.value_and_grad(w, X[idx], Y[idx])[1]
        v = (1 - rho(t)) * (1 - gamma_prev) * v + rho(t) / (2 * tau) * g  # (12)
        w = w - gamma(t) * v  # (11)
        gamma_prev = gamma(t)
    assert np.allclose(res.x, w, rtol=1e-12, atol=1e-13)


def test_full_batch_round_is_a_gradient_step_on_the_pooled_loss():
    # B = N_i: each client's batch is all its rows; one round with rho = gamma = 1 is
    # w_1 = w_0 - grad F(w_0) / (2 tau) with the pooled gradient (weights N_i / (B N))
    tau = 0.5
    full = small_model(rows=(17, 17, 17))
    w0 = full.loss.init(3)
    res = full.solve(
        "ssca", rounds=1, batch_size=17, rho=1.0, gamma=1.0, tau=tau, w0=w0, eval_every=0
    )
    X = np.vstack([X for X, _ in full.clients.values()])
    Y = np.concatenate([Y for _, Y in full.clients.values()])
    g = full.loss.value_and_grad(w0, X, Y)[1] / len(X)
    assert np.allclose(res.x, w0 - g / (2 * tau), atol=1e-13)


def test_a_users_own_model_trains():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(90, 3))
    y = X @ np.array([1.0, -2.0, 0.5]) + 0.1 * rng.normal(size=90)

    def value_grad(w, Xb, yb):
        r = Xb @ w - yb
        return r**2, 2 * r[:, None] * Xb

    model = fm.LearningModel(CallableLoss(3, value_grad))
    for k in range(3):
        model.client(f"c{k}", X[30 * k : 30 * (k + 1)], y[30 * k : 30 * (k + 1)])
    res = model.solve("ssca", rounds=300, batch_size=10, rho=(1.0, 0.6), gamma=(1.0, 0.9), tau=1.0)
    assert np.allclose(res.x, [1.0, -2.0, 0.5], atol=0.1)
    assert res.history[-1]["train_loss"] < 0.05


def test_jax_adapter_matches_the_analytic_gradient():
    jax = pytest.importorskip("jax")
    from fedmodel.losses.jax_adapter import jax_loss

    jnp = jax.numpy

    def f(w, x, y):
        return (x @ w - y) ** 2

    loss = jax_loss(f, dim=3)
    X, y = np.eye(3), np.ones(3)
    value, grad = loss.value_and_grad(np.zeros(3), X, y)
    assert value == pytest.approx(3.0) and np.allclose(grad, -2.0)
    assert jnp is not None
