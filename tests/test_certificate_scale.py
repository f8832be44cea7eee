"""The KKT certificate on the user's scale (issue 23): scaled residuals decide "optimal",
objective and violation are the user's model's, non-finite constants are refused."""

from __future__ import annotations

import cvxpy as cp
import numpy as np
import pytest

import fedmodel as fm
from fedmodel.algorithms.centralized.cprox_al import pooled_evaluation
from fedmodel.datasets import load_german
from fedmodel.errors import DataError

N_ROWS, D = 1000, 3


def _hinge_data():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(N_ROWS, D))
    y = np.sign(X @ np.array([1.0, -2.0, 0.5]) + 0.8 * rng.normal(size=N_ROWS))
    return X, y


def _hinge_model(X, y, scale):
    """Hinge SVM in a unit ball, the loss times ``scale`` (1: summed, 1/N: averaged)."""
    m = fm.Model("svm")
    w = m.variable(D, name="w")
    m.server.subject_to(cp.norm(w, 2) <= 1)
    for k, idx in enumerate(np.array_split(np.arange(len(y)), 2)):
        c = m.client(f"c{k}")
        Xk, yk = c.data(X[idx], name="X"), c.data(y[idx], name="y")
        c.minimize(scale * cp.sum(cp.pos(1 - cp.multiply(yk, Xk @ w))), name="hinge")
    return m, w


def _pooled_hinge(X, y, scale):
    W = cp.Variable(X.shape[1])
    loss = scale * cp.sum(cp.pos(1 - cp.multiply(y, X @ W)))
    prob = cp.Problem(cp.Minimize(loss), [cp.norm(W, 2) <= 1])
    prob.solve(solver="CLARABEL")
    return prob.value


def _stacked_multipliers(compiled, res, factor=1.0):
    """The result's multipliers back in each party's stacking order, times ``factor``."""
    mus, nus = [], []
    for p in compiled.parties:
        got = res.program_multipliers[p.name]
        for kind, out in (("ineq", mus), ("eq", nus)):
            parts = [np.ravel(got[lab], order="F") for lab, _ in p.constraint_labels(kind)]
            out.append(factor * (np.concatenate(parts) if parts else np.zeros(0)))
    return mus, nus


def test_summed_and_averaged_losses_get_the_same_verdict_and_the_optimum():
    X, y = _hinge_data()
    eps = 1e-6
    results = {}
    for scale in (1.0, 1.0 / N_ROWS):
        m, w = _hinge_model(X, y, scale)
        res = m.solve(method="centralized", engine="cvxpy", eps=eps)
        ref = _pooled_hinge(X, y, scale)
        f_w = scale * np.maximum(1 - y * (X @ w.value), 0).sum()
        assert res.status == "optimal", res.message
        assert abs(f_w - ref) <= eps * abs(ref)
        assert res.kkt.scaled_stationarity <= eps and res.kkt.scaled_feasibility <= eps
        results[scale] = (m, res)

    # the same point and multipliers on both scales: the absolute stationarity scales with
    # the loss (N times apart), the scaled one does not. The multipliers are taken 10% off
    # the optimal ones, so that the residuals are well above rounding (at the optimum they
    # are ~1e-9, where the N-fold relation is lost in rounding)
    m_avg, res_avg = results[1.0 / N_ROWS]
    m_sum, _ = results[1.0]
    c_avg, c_sum = m_avg.compile(), m_sum.compile()
    k_avg, _ = pooled_evaluation(c_avg, res_avg.x, *_stacked_multipliers(c_avg, res_avg, 0.9))
    k_sum, _ = pooled_evaluation(
        c_sum, res_avg.x, *_stacked_multipliers(c_avg, res_avg, 0.9 * N_ROWS)
    )
    assert k_avg.scaled_stationarity > 1e-3  # away from rounding
    assert k_sum.stationarity == pytest.approx(N_ROWS * k_avg.stationarity, rel=1e-6)
    assert k_sum.scaled_stationarity == pytest.approx(k_avg.scaled_stationarity, rel=1e-6)
    assert k_sum.scaled_feasibility == pytest.approx(k_avg.scaled_feasibility, rel=1e-6)


def test_cprox_al_no_longer_certifies_an_svm_far_from_its_optimum():
    """Issue 23: cprox-al said "optimal" on the averaged German-credit hinge SVM 6.9% above
    its optimum; its absolute residuals met eps = 1e-3 while the epigraph variables'
    stationarity (1/N - sum lambda, N = 200 here) was 15-75% of 1/N."""
    ds = load_german()
    X, y = ds.X[:200], 2.0 * ds.y[:200] - 1
    m = fm.Model("german-svm")
    w = m.variable(X.shape[1], name="w")
    m.server.subject_to(cp.norm(w, 2) <= 1)
    for k, idx in enumerate(np.array_split(np.arange(len(y)), 5)):
        c = m.client(f"c{k}")
        Xk, yk = c.data(X[idx], name="X"), c.data(y[idx], name="y")
        c.minimize(cp.sum(cp.pos(1 - cp.multiply(yk, Xk @ w))) / len(y), name="hinge")
    # (cprox-al, on the objective divided by S, is within eps of the optimum by outer
    # iteration 60; at 30 its absolute residuals meet eps at a point 0.3% above it)
    res = m.solve(method="cprox-al", max_outer=30)
    ref = _pooled_hinge(X, y, 1.0 / len(y))
    gap = (np.maximum(1 - y * (X @ w.value), 0).mean() - ref) / ref
    eps = 1e-3
    # the absolute residuals would have certified this point; it is further than eps off
    assert res.kkt.stationarity <= eps and res.kkt.feasibility <= eps and gap > eps
    assert res.status != "optimal"
    assert res.kkt.scaled_stationarity > eps
    assert "certified" in res.message


def _lad_and_quantile():
    rng = np.random.default_rng(0)
    data = []
    lad, quant = fm.Model("lad"), fm.Model("quantile")
    w_lad, w_q = lad.variable(D, name="w"), quant.variable(D, name="w")
    for k in range(2):
        X = rng.normal(size=(40, D))
        y = X @ np.array([1.0, -1.0, 0.5]) + rng.standard_t(2, size=40)
        data.append((X, y))
        c = lad.client(f"c{k}")
        c.minimize(cp.sum(cp.abs(c.data(X, name="X") @ w_lad - c.data(y, name="y"))) / 80)
        c = quant.client(f"c{k}")
        r = c.data(y, name="y") - c.data(X, name="X") @ w_q
        c.minimize(cp.sum(0.9 * cp.pos(r) + 0.1 * cp.pos(-r)) / 80)
    X = np.vstack([d[0] for d in data])
    y = np.concatenate([d[1] for d in data])
    return lad, w_lad, quant, w_q, X, y


@pytest.mark.parametrize("method", ["prox-al", "cprox-al"])
def test_objective_and_violation_are_the_users_model(method):
    lad, w_lad, quant, w_q, X, y = _lad_and_quantile()
    for model, w, loss in (
        (lad, w_lad, lambda v: np.abs(X @ v - y).mean()),
        (
            quant,
            w_q,
            lambda v: (0.9 * np.maximum(y - X @ v, 0) + 0.1 * np.maximum(X @ v - y, 0)).mean(),
        ),
    ):
        res = model.solve(method=method, eps=1e-3, max_outer=8)
        value = loss(w.value)
        # the user's objective at the returned point (not sum t of the epigraph form)
        assert res.objective == pytest.approx(value, rel=1e-9, abs=1e-12)
        # no constraint in the user's model: nothing can be violated
        assert res.max_violation == 0.0


def test_violation_of_a_rewritten_constraint_is_the_users():
    rng = np.random.default_rng(2)
    m = fm.Model("l1-ball")
    w = m.variable(D, name="w")
    m.server.subject_to(cp.norm1(w) <= 0.5)
    X, y = rng.normal(size=(30, D)), rng.normal(size=30)
    c = m.client("c0")
    c.minimize(cp.sum_squares(c.data(X, name="X") @ w - c.data(y, name="y")))
    res = m.solve(method="cprox-al", eps=1e-2, max_outer=3)
    assert res.max_violation == pytest.approx(max(np.abs(w.value).sum() - 0.5, 0.0), abs=1e-12)


@pytest.mark.parametrize(
    "declare",
    [
        lambda m, w: m.regularize(np.nan * cp.sum_squares(w)),
        lambda m, w: m.client("a").subject_to(w <= np.array([1.0, np.nan, 2.0])),
        lambda m, w: m.server.minimize(cp.sum(cp.multiply(np.array([1.0, np.inf, 1.0]), w))),
        lambda m, w: m.client("b").minimize(cp.sum_squares(w - np.array([0.0, -np.inf, 1.0]))),
    ],
    ids=["nan-h", "nan-bound", "inf-coefficient", "inf-constant"],
)
def test_non_finite_constants_are_refused_at_declaration(declare):
    m = fm.Model("nan")
    w = m.variable(3, name="w")
    with pytest.raises(DataError, match=r"(NaN|inf) constant") as info:
        declare(m, w)
    assert info.value.party in ("server", "a", "b")


def test_cprox_al_takes_two_norm_objectives_with_a_server_box():
    """Issue 23: ``norm(X_k w - y_k, 2)`` objectives and a server box crashed cprox-al
    (Clarabel's NumericalError left SOC duals [None, None])."""
    rng = np.random.default_rng(0)
    m = fm.Model("soc")
    w = m.variable(5, name="w")
    m.server.subject_to([w >= -0.3, w <= 0.3])
    W = cp.Variable(5)
    pooled = 0
    for k in range(2):
        X = rng.normal(size=(50, 5))
        y = X @ rng.normal(size=5) + 0.1 * rng.normal(size=50)
        c = m.client(f"c{k}")
        c.minimize(cp.norm(c.data(X, name="X") @ w - c.data(y, name="y"), 2))
        pooled = pooled + cp.norm(X @ W - y, 2)
    ref = cp.Problem(cp.Minimize(pooled), [W >= -0.3, W <= 0.3])
    ref.solve(solver="CLARABEL")
    res = m.solve(method="cprox-al", eps=1e-4)
    assert res.status == "optimal", res.message
    assert abs(res.objective - ref.value) <= 1e-4 * abs(ref.value)
    assert np.abs(w.value - W.value).max() <= 1e-2


def _entropy_model(a, b):
    """Maximum entropy on the simplex (server) with one client moment bound ``a @ w <= b``."""
    m = fm.Model("maxent")
    w = m.variable(4, name="w")
    m.server.minimize(-cp.sum(cp.entr(w)))
    m.server.subject_to(cp.sum(w) == 1)
    c = m.client("c0")
    c.subject_to(c.data(np.asarray(a, dtype=float), name="a") @ w <= b)
    return m, w


def _entropy_certificate(m, x, mu, nu):
    """Pooled certificate at ``x`` with the client's multiplier ``mu`` and the server's
    ``nu`` (the parties in the compiled order)."""
    compiled = m.compile()
    mus, nus = [], []
    for p in compiled.parties:
        mus.append(np.full(p.m_ineq, mu))
        nus.append(np.full(p.m_eq, nu))
    return pooled_evaluation(compiled, np.asarray(x, dtype=float), mus, nus)[0]


def test_entropy_optimum_on_the_domain_boundary_is_certified():
    """``2 w_0 + w_1 + w_2 + w_3 <= 1`` with ``sum(w) = 1`` forces ``w_0 = 0``, where
    ``d/dw (w log w) = -inf``: no finite multipliers exist at the optimum, and the boundary
    relief certifies it (a nearby point is stationary) instead of calling it inaccurate."""
    m, w = _entropy_model([2.0, 1.0, 1.0, 1.0], 1.0)
    res = m.solve(method="centralized")
    assert res.status == "optimal", res.message
    np.testing.assert_allclose(w.value, [0, 1 / 3, 1 / 3, 1 / 3], atol=1e-6)
    # by hand: coordinates 1..3 stationary with nu = -log(1/3) - 1 - mu; coordinate 0 at
    # w_0 + tau = 1e-8 reads log(1e-8) + log(3) + mu, >= 0 iff mu >= 17.3
    x = [1e-13, 1 / 3, 1 / 3, 1 / 3 - 1e-13]
    for mu, certified in ((30.0, True), (10.0, False)):
        kkt = _entropy_certificate(m, x, mu, -np.log(1 / 3) - 1 - mu)
        assert kkt.satisfied(1e-6, 1e-6) is certified, (mu, kkt)


def test_wrong_point_near_the_domain_boundary_is_not_certified():
    """The simplex alone: the optimum is uniform (1/4). A point with ``w_0 = 1e-10`` and
    the other coordinates exactly stationary is no optimum: ``log(w_0 + tau) - log(1/3)``
    is about -17 and the relief does not hide it."""
    m, _ = _entropy_model([0.0, 0.0, 0.0, 0.0], 1.0)
    x = [1e-10, 1 / 3, 1 / 3, 1 / 3 - 1e-10]
    kkt = _entropy_certificate(m, x, 0.0, -np.log(1 / 3) - 1)
    assert kkt.scaled_stationarity > 0.5
    assert not kkt.satisfied(1e-3, 1e-3)
    # and the optimum is certified with the same multiplier family
    kkt = _entropy_certificate(m, [0.25] * 4, 0.0, -np.log(0.25) - 1)
    assert kkt.satisfied(1e-9, 1e-9), kkt


def _infeasible_kl_model(d=6, n=2):
    """KL to client priors on the simplex with a moment bound no simplex point meets."""
    rng = np.random.default_rng(4)
    m = fm.Model("kl-infeasible")
    w = m.variable(d, name="w")
    m.server.subject_to([cp.sum(w) == 1, w >= 0])
    grid = np.linspace(0, 1, d)
    for k in range(n):
        c = m.client(f"c{k}")
        c.minimize(cp.sum(cp.kl_div(w, c.data(rng.dirichlet(np.ones(d)), name="q"))) / n)
        c.subject_to(c.data(grid, name="grid") @ w <= -0.1)
    return m


def test_evaluation_outside_a_terms_domain_is_infeasible_not_a_failure():
    """At ``w_j < 0`` ``kl_div(w, q)`` is ``+inf``: the party reports the point infeasible by
    its distance to the domain (finite, so the runtime accepts the reply) and no
    certificate."""
    m = _infeasible_kl_model()
    compiled = m.compile()
    x = np.full(6, 1 / 6)
    x[2] = -0.25
    mus = [np.zeros(p.m_ineq) for p in compiled.parties]
    nus = [np.zeros(p.m_eq) for p in compiled.parties]
    kkt, summary = pooled_evaluation(compiled, x, mus, nus)
    assert np.isfinite(kkt.feasibility) and kkt.feasibility >= 0.25 - 1e-12
    assert summary["max_violation"] >= 0.25 - 1e-12
    assert not kkt.satisfied(0.5, 0.5)


def test_prox_al_on_an_infeasible_kl_model_says_infeasible():
    """It ended in ``client_failure`` (a non-finite objective in an 'evaluate' reply)."""
    res = _infeasible_kl_model().solve(method="prox-al", time_limit=60)
    assert res.status in ("diverging", "infeasible"), res.message
    assert "infeasible" in res.message


# -- the certificate at a federated party's point (issue 23, exact-admm) ---------------------
def _off_point(compiled, x, delta):
    """``x`` with each party's hidden auxiliaries moved to the partial minimiser at the
    shared point ``x + delta`` (what a party's own exact step at ``x_i != z`` leaves)."""
    from fedmodel.certificate.auxiliary import minimize_auxiliaries, owned_coordinates

    out, moved = np.array(x), np.array(x)
    moved[compiled.layout.shared_indices] += delta
    for p in compiled.parties:
        hidden = owned_coordinates(p)[0]
        out[hidden] = minimize_auxiliaries(p, moved)[hidden]
    return out


@pytest.mark.parametrize("loss", ["hinge", "lad"])
def test_a_party_off_its_point_is_judged_on_the_users_model(loss):
    """A party evaluated at the shared point with the auxiliaries of its own point: the
    pieces read off by ``||a_j||_1 ||x_i - z||`` (violated here by > 1e-3); the certificate
    puts the auxiliaries at their partial minimiser first, so the verdict and residuals are
    those of the pooled solution, and a wrong shared point is still refused."""
    if loss == "hinge":
        X, y = _hinge_data()
        model, _ = _hinge_model(X, y, 1.0 / N_ROWS)
    else:
        model = _lad_and_quantile()[0]
    eps = 1e-6
    res = model.solve(method="centralized", engine="cvxpy", eps=eps)
    assert res.status == "optimal", res.message
    compiled = model.compile()
    mus, nus = _stacked_multipliers(compiled, res)
    at_opt, _ = pooled_evaluation(compiled, res.x, mus, nus)
    delta = 0.02 * np.random.default_rng(3).standard_normal(compiled.layout.n_shared)
    x_off = _off_point(compiled, res.x, delta)
    violated = max(
        float(p.functions.constraint_values(x_off)[0].max(initial=-np.inf))
        for p in compiled.parties
    )
    assert violated > 1e-3  # the pieces as a party's own auxiliaries leave them
    off, _ = pooled_evaluation(compiled, x_off, mus, nus)
    assert off.satisfied(eps, eps) and at_opt.satisfied(eps, eps)
    assert off.scaled_feasibility <= 1e-9
    assert off.scaled_stationarity == pytest.approx(at_opt.scaled_stationarity, rel=1e-9, abs=0)
    # a wrong shared point (its auxiliaries at their minimiser too) is refused
    wrong = _off_point(compiled, res.x, delta)
    wrong[compiled.layout.shared_indices] += delta
    bad, _ = pooled_evaluation(compiled, wrong, mus, nus)
    assert not bad.satisfied(1e-3, 1e-3)


def test_the_gap_of_misplaced_piece_multipliers_is_charged():
    """Multipliers on pieces that are not the largest at the point leave ``sum mu_j |c_j|``
    between the epigraph Lagrangian and the user's objective: the certificate charges that
    gap relative to the objective (here all of each row's weight put on the wrong piece)."""
    X, y = _hinge_data()
    model, _ = _hinge_model(X, y, 1.0 / N_ROWS)
    res = model.solve(method="centralized", engine="cvxpy", eps=1e-6)
    compiled = model.compile()
    mus, nus = _stacked_multipliers(compiled, res)
    swapped = []
    for p, mu in zip(compiled.parties, mus):
        if not p.is_server:  # the hinge rows first, then the rows -t <= 0: swap the halves
            half = mu.size // 2
            mu = np.concatenate([mu[half:], mu[:half]])
        swapped.append(mu)
    kkt, summary = pooled_evaluation(compiled, res.x, swapped, nus)
    assert kkt.scaled_feasibility > 0.1 and not kkt.satisfied(1e-3, 1e-3)


@pytest.mark.parametrize("on_the_way", [True, False])
def test_the_result_reports_the_multipliers_its_certificate_used(on_the_way, monkeypatch):
    """prox-al (exact-admm) on a hinge SVM: the clients' exact steps at their own points
    leave each auxiliary's stationarity ``1/N - sum lambda`` off by their proximal term;
    the certificate rescales the pieces' multipliers (certificate/auxiliary.py) where that
    lowers its residual, and the result reports those: recomputed from ``res.multipliers``
    at ``res.x`` the certificate is the one the run reported. At the end of a whole inner
    solve (exact-admm's certificate on the way off) the rescaling is taken and each
    auxiliary's stationarity is exact; stopped on the way, at a looser consensus, it may be
    declined (the shared block's stationarity would grow more), and the run's own
    certificate at eps is the guarantee."""
    from fedmodel.algorithms.proxal.exact_admm import ExactInner

    if not on_the_way:
        monkeypatch.setattr(ExactInner, "certifies_inner", lambda self, tau: False)
    X, y = _hinge_data()
    model, _ = _hinge_model(X, y, 1.0 / N_ROWS)
    res = model.solve(method="prox-al", eps=1e-4)
    assert res.status == "optimal", res.message
    compiled = model.compile()
    mus, nus = _stacked_multipliers(compiled, res)
    again, _ = pooled_evaluation(compiled, res.x, mus, nus)
    assert again.scaled_stationarity == pytest.approx(res.kkt.scaled_stationarity, rel=1e-6)
    assert again.scaled_feasibility == pytest.approx(
        res.kkt.scaled_feasibility, rel=1e-6, abs=1e-15
    )
    assert again.satisfied(1e-4, 1e-4)
    if on_the_way:
        return
    for p, mu in zip(compiled.parties, mus):
        if p.is_server:
            continue
        half = mu.size // 2  # each row's two pieces: its weights sum to 1/N
        assert np.allclose(mu[:half] + mu[half:], 1.0 / N_ROWS, rtol=1e-9, atol=0)


def test_a_side_at_rounding_level_is_measured_as_a_homogeneous_row():
    """A row ``a^T x == -2.2e-16`` (a zero written in floating point, as in 30 of the
    Maros-Meszaros files) is measured as ``a^T x == 0``: relative to ``2.2e-16`` its
    violation at any point short of exact reads 1, and prox-al ran to its time limit."""
    from fedmodel.compiler.cones import constraint_scale

    c = np.array([1e-7, 1e-7])
    scaled = c / constraint_scale(c, np.array([2.2e-16, 0.0]))
    assert scaled.tolist() == [1e-7, 1e-7]
    assert (c / constraint_scale(c, np.array([1e-3, 0.0])))[0] == pytest.approx(1e-4)

    m = fm.Model("rounding-side")
    x = m.variable(2, name="x")
    m.server.minimize(cp.sum_squares(x - np.array([1.0, 2.0])))
    m.client("c").subject_to(x[0] - x[1] == -2.220446049250313e-16)
    res = m.solve("centralized", eps=1e-6)
    assert res.status == "optimal"
    assert res.kkt.scaled_feasibility <= 1e-6
    assert np.allclose(res.solution["x"], [1.5, 1.5], atol=1e-5)


@pytest.mark.parametrize("relief", [False, True])
def test_stacked_reports_assemble_to_the_same_residuals_as_dicts(relief):
    """The certificate read from a stacked round's replies (StackedReports: a field per
    column) gives bit for bit what it gives from one dict per party: the sums go row after
    row in party order, the maxima over the same values."""
    from fedmodel.certificate.kkt import StackedReports, assemble, reported_vectors
    from fedmodel.compiler.regularizer import Regularizer, VariablePiece

    rng = np.random.default_rng(3)
    m, d = 40, 4
    fields = {
        "objective": rng.uniform(-1, 1, m) * 10.0 ** rng.integers(-6, 6, m),
        "grad": rng.standard_normal((m, d)) * 10.0 ** rng.integers(-8, 8, (m, 1)),
        "owned_stationarity": np.zeros(m),
        "owned_scaled": np.zeros(m),
        "owned_index": np.zeros((m, 0), dtype=int),
        "feasibility": rng.uniform(0, 1e-3, m),
        "feasibility_scaled": rng.uniform(0, 1e-3, m),
        "complementarity_gap": rng.uniform(0, 1e-6, m),
        "violation": rng.uniform(0, 1e-3, m),
        "c_ineq": np.zeros((m, 0)),
        "c_eq": np.zeros((m, 0)),
        "mu": rng.uniform(0, 1, (m, 2)),
    }
    fields["scale"] = np.abs(fields["grad"])
    if relief:
        fields["boundary_grad"] = fields["grad"] + rng.standard_normal((m, d))
        fields["boundary_scale"] = np.abs(fields["boundary_grad"])
        fields["boundary_mask"] = (rng.uniform(size=(m, d)) < 0.3).astype(float)
    names = [f"c{i}" for i in range(m)]
    server = {k: (v[0].item() if v.ndim == 1 else v[0]) for k, v in fields.items() if k != "mu"}
    server["objective"] = 0.25
    stacked = StackedReports({"server": server}, names, fields)
    dicts = {"server": server, **{n: stacked[n] for n in names}}
    assert list(stacked) == list(dicts)
    x = rng.standard_normal(d)
    for regularizer in (
        Regularizer(),
        Regularizer.from_pieces([slice(0, d)], [VariablePiece(l1=0.1)]),
    ):
        a, sa = assemble(dicts, regularizer, x, False, 2.0)
        b, sb = assemble(stacked, regularizer, x, False, 2.0)
        assert (a.stationarity, a.feasibility) == (b.stationarity, b.feasibility)
        assert (a.scaled_stationarity, a.scaled_feasibility) == (
            b.scaled_stationarity,
            b.scaled_feasibility,
        )
        assert a.per_party == b.per_party and sa["objective"] == sb["objective"]
        assert sa["max_violation"] == sb["max_violation"]
        assert list(sa["constraints"]) == list(sb["constraints"])
    used_a, used_b = reported_vectors(dicts, "mu"), reported_vectors(stacked, "mu")
    assert list(used_a) == names and all(np.array_equal(used_a[n], used_b[n]) for n in names)
