"""prox-al's ``inner_solver="exact-admm"`` (consensus ADMM with exact party steps), the
default of ``"auto"`` on non-smooth and conic convex models: each model at prox-al's
defaults against plain Clarabel on the pooled problem, the messages it sends, checkpoints.

The tolerances follow from the certificate: "optimal" at ``eps`` means scaled KKT
residuals at most ``eps``, which bound the relative objective gap and violation by a
modest multiple of ``eps`` (the benchmark suite's rule: ``10 eps``, benchmarks/models.py).
"""

from __future__ import annotations

import json

import cvxpy as cp
import numpy as np
import pytest
from problems import kl_moments, logistic_clients

import fedmodel as fm
from fedmodel.algorithms.proxal.options import ProxALOptions
from fedmodel.algorithms.proxal.server import run_prox_al
from fedmodel.errors import ModelError
from fedmodel.runtime.rows import RoundReplies, payloads_of

EPS = 1e-3
TIGHT = {"tol_gap_abs": 1e-10, "tol_gap_rel": 1e-10, "tol_feas": 1e-10}


def _regression(n, rows, d, seed):
    rng = np.random.default_rng(seed)
    w0 = rng.normal(size=d)
    parts = []
    for _ in range(n):
        X = rng.normal(size=(rows, d))
        y = X @ w0 + rng.standard_t(2, size=rows) * 0.3
        parts.append((X, y))
    return parts


def loss_model(loss, parts, *, server=None, server_cons=None, name="m"):
    """Clients minimise ``loss(X, y, w)``; the same problem pooled in plain cvxpy."""
    d = parts[0][0].shape[1]
    m = fm.Model(name)
    w = m.variable(d, name="w")
    W = cp.Variable(d)
    for k, (X, y) in enumerate(parts):
        c = m.client(f"c{k}")
        c.minimize(loss(c.data(X, name="X"), c.data(y, name="y"), w), name="loss")
    obj = sum(loss(X, y, W) for X, y in parts)
    cons = []
    if server is not None:
        m.server.minimize(server(w))
        obj = obj + server(W)
    if server_cons is not None:
        m.server.subject_to(server_cons(w))
        cons = server_cons(W)
    return m, cp.Problem(cp.Minimize(obj), cons), W


def check_against_pooled(model, pooled, W, **options):
    """prox-al at its defaults: "optimal" via exact-admm, within 10 eps of Clarabel."""
    pooled.solve(solver="CLARABEL", **TIGHT)
    res = model.solve("prox-al", **options)
    assert res.extra["inner_solver"] == "exact-admm", res.extra
    assert res.status == "optimal", res.message
    f_star = pooled.value
    W.value = np.asarray(res.solution["w"], dtype=float)
    gap = (pooled.objective.value - f_star) / max(1.0, abs(f_star))
    assert abs(gap) <= 10 * EPS, gap
    for con in pooled.constraints:
        assert float(np.max(con.violation(), initial=0.0)) <= 10 * EPS
    return res


def hinge(X, y, w):
    return cp.sum(cp.pos(1 - cp.multiply(y, X @ w[:-1] + w[-1]))) / 40


def svm_model():
    rng = np.random.default_rng(1)
    m = fm.Model("svm")
    w = m.variable(4, name="w")
    W = cp.Variable(4)
    obj = 0.05 * cp.sum_squares(W[:-1])
    m.server.minimize(0.05 * cp.sum_squares(w[:-1]))
    for k in range(3):
        X = rng.normal(size=(12, 3))
        y = np.sign(X @ [1.0, -1.0, 0.5] + 0.3 * rng.normal(size=12))
        c = m.client(f"c{k}")
        c.minimize(hinge(c.data(X, name="X"), c.data(y, name="y"), w))
        obj = obj + hinge(X, y, W)
    return m, cp.Problem(cp.Minimize(obj)), W


def test_hinge_svm_matches_pooled_clarabel():
    m, pooled, W = svm_model()
    check_against_pooled(m, pooled, W)


def test_lad_with_an_equality_on_the_server():
    parts = _regression(3, 10, 4, seed=2)
    m, pooled, W = loss_model(
        lambda X, y, w: cp.sum(cp.abs(X @ w - y)) / 30,
        parts,
        server_cons=lambda w: [cp.sum(w) == 1],
    )
    check_against_pooled(m, pooled, W)


def test_quantile_regression():
    parts = _regression(3, 10, 3, seed=3)

    def pinball(X, y, w):
        r = y - X @ w
        return cp.sum(0.8 * cp.pos(r) + 0.2 * cp.pos(-r)) / 30

    m, pooled, W = loss_model(pinball, parts)
    check_against_pooled(m, pooled, W)


def test_kl_divergence_on_a_simplex_starts_inside_its_domain():
    """kl_div has no gradient at w_j = 0 (where prox-al starts): the exact conic steps
    never evaluate one there (this model failed with NaN replies before)."""
    m, pooled, W = kl_moments(seed=4, d=5, n=3, bound=0.45, step=0.0)
    check_against_pooled(m, pooled, W)


def test_two_norm_objective_and_a_box():
    parts = _regression(2, 12, 3, seed=5)
    m, pooled, W = loss_model(
        lambda X, y, w: cp.norm(X @ w - y, 2),
        parts,
        server_cons=lambda w: [w <= 0.5, w >= -0.5],
    )
    check_against_pooled(m, pooled, W)


def test_a_second_order_cone_constraint_at_a_client():
    parts = _regression(3, 8, 3, seed=6)
    rng = np.random.default_rng(7)
    m = fm.Model("soc")
    w = m.variable(3, name="w")
    W = cp.Variable(3)
    obj, cons = 0, []
    for k, (X, y) in enumerate(parts):
        A, cvec = rng.normal(size=(2, 3)), rng.uniform(0, 0.2, size=3)
        c = m.client(f"c{k}")
        c.minimize(cp.sum_squares(c.data(X, name="X") @ w - c.data(y, name="y")) / 24)
        c.subject_to(cp.norm(c.data(A, name="A") @ w, 2) <= 1 + c.data(cvec, name="c") @ w)
        obj = obj + cp.sum_squares(X @ W - y) / 24
        cons.append(cp.norm(A @ W, 2) <= 1 + cvec @ W)
    check_against_pooled(m, cp.Problem(cp.Minimize(obj), cons), W)


def test_a_party_owned_variable():
    """Each client's own intercept (a party-owned variable) in an absolute loss."""
    parts = _regression(3, 10, 2, seed=8)
    m = fm.Model("owned")
    w = m.variable(2, name="w")
    W, B = cp.Variable(2), cp.Variable(3)
    obj, owned = 0, []
    for k, (X, y) in enumerate(parts):
        c = m.client(f"c{k}")
        b = c.variable(name=f"b{k}")
        owned.append(b)
        c.minimize(cp.sum(cp.abs(c.data(X, name="X") @ w + b - c.data(y, name="y") - k)) / 30)
        obj = obj + cp.sum(cp.abs(X @ W + B[k] - y - k)) / 30
    pooled = cp.Problem(cp.Minimize(obj))
    res = check_against_pooled(m, pooled, W)
    assert set(res.solution) == {"w", "b0", "b1", "b2"}
    # the owned blocks never travel: every client reply is at most d + a few scalars
    rounds = res.rounds["communication"]
    for party, sent in res.communication["per_party"].items():
        if party != "server":
            assert sent["floats_sent"] <= rounds * (2 + 3) + 10, (party, sent)


def test_forcing_exact_admm_on_a_non_convex_model_is_an_error():
    m = fm.Model("nc")
    w = m.variable(2, name="w")
    m.client("c0").minimize(-cp.sum_squares(w), allow_nonconvex=True)
    m.server.subject_to([w <= 1, w >= -1])
    with pytest.raises(ModelError, match="exact-admm"):
        m.solve("prox-al", inner_solver="exact-admm")


def test_unknown_inner_solver_names_exact_admm():
    m = fm.Model("names")
    w = m.variable(2, name="w")
    m.client("c0").minimize(cp.sum_squares(w - 1))
    with pytest.raises(ModelError, match="exact-admm"):
        m.solve("prox-al", inner_solver="nope")


# -- checkpoints and backends ------------------------------------------------------------------
def lad_model():
    parts = _regression(3, 10, 3, seed=9)
    return loss_model(lambda X, y, w: cp.sum(cp.abs(X @ w - y)) / 30, parts)[0]


def run(model, **kw):
    return run_prox_al(model.compile(), ProxALOptions(**kw), "prox-al")


def test_resume_mid_run_repeats_the_uninterrupted_run_bit_for_bit(tmp_path):
    model = lad_model()
    reference = run(model)
    assert reference.status == "optimal" and reference.extra["inner_solver"] == "exact-admm"
    assert reference.rounds["outer"] >= 2
    path = tmp_path / "ck"
    first = run(model, checkpoint=str(path), checkpoint_every=1, max_outer=1)
    assert first.status == "max_iterations"
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["iteration"] == 1
    resumed = run(model, resume=str(path))
    assert resumed.status == "optimal"
    assert np.array_equal(resumed.x, reference.x)
    assert resumed.rounds == reference.rounds
    assert resumed.ledger == reference.ledger


def test_processes_backend_gives_the_serial_iterates():
    model = lad_model()
    serial = run(model)
    procs = run(model, backend="processes", workers=2)
    assert procs.status == serial.status == "optimal"
    assert np.array_equal(procs.x, serial.x)
    assert procs.rounds == serial.rounds


# -- the user's constraints as hard rows, the direct Clarabel call, the balancing default -----
def test_inactive_client_constraints_and_a_server_simplex():
    """A kl_div model whose clients' moment bounds are hard rows of their exact steps:
    only one bound is active at the optimum, the others keep a zero multiplier (their
    interior-point duals are not read as active: the certificate would charge the slack)."""
    d, n = 5, 3
    m, pooled, W = kl_moments(seed=11, d=d, n=n)
    grid = np.linspace(0, 1, d)
    res = check_against_pooled(m, pooled, W)
    active = [abs(float(grid @ W.value) - (0.4 + 0.05 * k)) <= 1e-3 for k in range(n)]
    assert active[0] and not any(active[1:]), active  # (the instance: one active bound)
    assert res.kkt.feasibility <= EPS


def test_a_client_inequality_on_a_non_smooth_model_is_met():
    """LAD with an affine bound at each client (hard rows of the exact steps: their
    multipliers are the steps' duals, no outer update) and an equality at the server."""
    parts = _regression(3, 10, 3, seed=12)
    m = fm.Model("lad-bounds")
    w = m.variable(3, name="w")
    W = cp.Variable(3)
    m.server.subject_to(cp.sum(w) == 0.5)
    obj, cons = 0, [cp.sum(W) == 0.5]
    for k, (X, y) in enumerate(parts):
        c = m.client(f"c{k}")
        c.minimize(cp.sum(cp.abs(c.data(X, name="X") @ w - c.data(y, name="y"))) / 30)
        c.subject_to(w[k] <= 0.1 * k + 0.1)
        obj = obj + cp.sum(cp.abs(X @ W - y)) / 30
        cons.append(W[k] <= 0.1 * k + 0.1)
    check_against_pooled(m, cp.Problem(cp.Minimize(obj), cons), W)


def test_an_infeasible_model_ends_quickly_with_a_verdict():
    """The parties' hard rows admit no common point (w_k <= 0.1 k at client k, sum(w) ==
    0.5 at the server): the consensus gap settles at a constant while the duals grow, and
    the run stops with "infeasible" and the parties' Farkas certificate within a few hundred
    rounds."""
    parts = _regression(3, 10, 3, seed=12)
    m = fm.Model("lad-infeasible")
    w = m.variable(3, name="w")
    m.server.subject_to(cp.sum(w) == 0.5)
    for k, (X, y) in enumerate(parts):
        c = m.client(f"c{k}")
        c.minimize(cp.sum(cp.abs(c.data(X, name="X") @ w - c.data(y, name="y"))) / 30)
        c.subject_to(w[k] <= 0.1 * k)
    res = m.solve("prox-al")
    assert res.extra["inner_solver"] == "exact-admm"
    assert res.status == "infeasible" and "Farkas" in res.message, res.message
    assert res.extra["certificate"]["radius"] >= res.extra["certificate"]["needed"]
    assert res.rounds["communication"] <= 400


def test_direct_clarabel_steps_equal_cvxpy_solves():
    """``CvxpySolver(direct=True)`` (Clarabel on cvxpy's compiled data of the subproblem
    without its proximal term, sigma added to ``P``, ``q`` recomputed) returns the points and
    duals of full cvxpy solves across changes of sigma and of the centre, and compiles once.
    Both solve the same strongly convex subproblem (modulus sigma >= 1) to residual 1e-8 in
    different compiled forms, so points and duals agree to a small multiple of that."""
    from fedmodel.subproblems.cvxpy_backend import CvxpySolver
    from fedmodel.subproblems.merit import MeritProblem

    parts = _regression(1, 12, 3, seed=13)
    m, _, _ = loss_model(
        lambda X, y, w: cp.sum(cp.abs(X @ w - y)) / 12,
        parts,
        name="direct",
    )
    m.clients[0].subject_to(cp.sum(m.variables[0]) <= 0.2)
    prog = m.compile().clients[0]
    problems = [MeritProblem([prog], 10.0) for _ in range(2)]
    solvers = [
        CvxpySolver(p, hard_internal=True, hard_constraints=True, direct=flag)
        for p, flag in zip(problems, (True, False))
    ]
    compiled = []
    refresh = solvers[0]._refresh_direct
    solvers[0]._refresh_direct = lambda: (compiled.append(1), refresh())
    rng = np.random.default_rng(14)
    for sigma in (1.0, 1.0, 4.0, 4.0, 1.0 / 16, 4.0):
        center = rng.normal(size=problems[0].n)
        reports = []
        for problem, solver in zip(problems, solvers):
            problem.set(sigma=sigma, center=center)
            reports.append(solver.solve(np.zeros(problem.n), 1e-8))
        assert np.allclose(reports[0].x, reports[1].x, rtol=0, atol=1e-6 / min(sigma, 1.0))
        assert np.allclose(problems[0].mu[0], problems[1].mu[0], rtol=0, atol=1e-6)
        assert reports[0].residual <= 1e-6
    assert len(compiled) == 1  # (the direct path ran, compiled once across sigma changes)


def test_exact_admm_balancing_default():
    from fedmodel.algorithms.proxal.exact_admm import exact_balancing

    assert exact_balancing(ProxALOptions()) == (None, 2.0, 50)  # (OSQP's relative rule)
    assert exact_balancing(ProxALOptions(rb_ratio=7.0)) == (7.0, 2.0, 50)  # (the user's)
    assert exact_balancing(ProxALOptions(variant="paper")) is None


def test_exact_admm_relative_penalty_rule():
    """OSQP's rule: sigma sqrt((r / max(||x||, sqrt(m) ||z+||)) / (s / ||sigma u+||)),
    taken only when it moves sigma by more than RELATIVE_CHANGE, within SIGMA_RANGE."""
    from fedmodel.algorithms.proxal.exact_admm import RELATIVE_CHANGE, SIGMA_RANGE, ExactADMM

    state = ExactADMM(sigma=2.0, anderson=0, balancing=(None, 2.0, 50), max_inner=10)
    z, z_new = np.zeros(2), np.array([1.0, 0.0])
    X = np.array([[1.0, 2.0], [3.0, 0.0]])  # (a row per client)
    U_new = np.array([[0.5, 0.0], [0.0, 0.0]])
    r = np.sqrt(0 + 4 + 4 + 0)
    s = 2.0 * np.sqrt(2) * 1.0
    scale_x = max(np.sqrt(1 + 4 + 9), np.sqrt(2) * 1.0)
    scale_y = 2.0 * 0.5
    expected = 2.0 * np.sqrt((r / scale_x) / (s / scale_y))
    assert expected / 2.0 < RELATIVE_CHANGE  # (a move within the tolerance: kept)
    assert state.penalty(2.0, z, z_new, X, U_new) == 2.0
    U_far = np.array([[50.0, 0.0], [0.0, 0.0]])  # (dual 100x larger)
    expected = 2.0 * np.sqrt((r / scale_x) / (s / (2.0 * 50.0)))
    assert expected / 2.0 > RELATIVE_CHANGE
    assert np.isclose(state.penalty(2.0, z, z_new, X, U_far), expected, rtol=1e-12)
    U_huge = np.array([[1e12, 0.0], [0.0, 0.0]])
    assert state.penalty(2.0, z, z_new, X, U_huge) == 2.0 * SIGMA_RANGE


class _L1Consensus:
    """A federated ``min sum_i lam_i ||w - a_i||_1 + c ||w||_1`` for :class:`ExactADMM`
    without clients: each party's exact step is a soft-threshold, the server's too. It
    plays both the server (``exact_step``) and the runtime (``broadcast``), and records
    each round's ADMM state ``(z, u_i)`` from the centres ``c_i = z - u_i`` it is sent."""

    def __init__(self, m, d, seed):
        rng = np.random.default_rng(seed)
        self.a = {f"c{i}": rng.normal(size=d) for i in range(m)}
        self.lam = {n: rng.uniform(0.5, 2.0) for n in self.a}
        self.c0, self.ns, self.x = 0.3, d, rng.normal(size=d)
        self.prox_weight = 0.0  # (no proximal term)
        self.options = ProxALOptions(monitor=False)
        self.alive, self.z, self.states = list(self.a), self.x.copy(), []

    @staticmethod
    def shrink(v, k):
        return np.sign(v) * np.maximum(np.abs(v) - k, 0.0)

    def next_round(self):
        pass

    def broadcast(self, kind, payload_of):
        payloads = {n: payload_of(n) for n in self.alive}
        self.states.append((self.z.copy(), np.array([self.z - p["c"] for p in payloads.values()])))

        class Reply:
            def __init__(self, x):
                self.payload = {"x": x}

        return {
            n: Reply(self.a[n] + self.shrink(p["c"] - self.a[n], self.lam[n] / p["sigma"]))
            for n, p in payloads.items()
        }

    def broadcast_rows(self, kind, fields, to=None):
        names = self.alive if to is None else list(to)
        payloads = dict(zip(names, payloads_of(fields, len(names))))
        return RoundReplies(names, messages=self.broadcast(kind, payloads.__getitem__))

    def exact_step(self, avg, weight, tol, deadline=None):
        self.z = self.shrink(avg, self.c0 / weight)
        return self.z.copy(), 0.0

    def certifies_inner(self, tau):  # (no certificate on the way: plain ADMM rounds)
        return False


def test_anderson_residual_is_admms_contraction_measure():
    """Plain exact-admm steps at a fixed sigma never increase ``m ||z+ - z||^2 + sum_i
    ||u_i+ - u_i||^2`` (ADMM's contraction, He and Yuan 2015): the residual that
    Anderson's weights minimise and its safeguard compares must be that one
    (``ExactADMM.fixed_point_residual``). The unweighted norm used before rises on the
    same iterates, and the safeguard then rejected accelerated steps on that noise."""
    from fedmodel.algorithms.proxal.exact_admm import ExactADMM

    fake = _L1Consensus(m=5, d=6, seed=1)
    state = ExactADMM(sigma=0.7, anderson=0, balancing=None, max_inner=300)
    state.solve(fake, fake, tau=1e-14, deadline=None)  # (300 plain rounds)
    pairs = list(zip(fake.states[:-1], fake.states[1:]))
    weighted = [
        np.linalg.norm(ExactADMM.fixed_point_residual(z, z1, U, U1)) for (z, U), (z1, U1) in pairs
    ]
    plain = [
        np.linalg.norm(np.concatenate([z1 - z, (U1 - U).ravel()])) for (z, U), (z1, U1) in pairs
    ]
    weighted, plain = np.array(weighted), np.array(plain)
    assert weighted[0] > 1e-3 and weighted[-1] < weighted[0]  # (the run moved)
    # non-increasing up to rounding (the soft-thresholds are exact)
    assert np.all(weighted[1:] <= weighted[:-1] * (1 + 1e-12) + 1e-15)
    assert np.any(plain[1:] > plain[:-1] * (1 + 1e-6))  # (the old norm is not monotone)


def _sparse_logistic_l1(n=3, rows=8, d=40, seed=21):
    """Logistic clients (their exact steps: Newton) and an l1 ``h`` (the server's: Clarabel)."""
    m, w = logistic_clients(n, rows, d, seed, name="logistic-l1")
    m.regularize(0.05 * cp.norm1(w))
    return m


@pytest.mark.parametrize("build", [_sparse_logistic_l1, lambda: svm_model()[0]])
def test_a_deadline_already_past_stops_exact_admm_after_one_round(build, monkeypatch):
    """time_limit far below one round: every party's exact step gets a budget (what is left,
    0 here) on its own clock, the inner solve stops after its first round and the run
    returns a point with status time_limit."""
    import fedmodel.algorithms.proxal.exact_admm as client_mod

    budgets = []  # (each client's, whether its step ran alone or in a cohort's batch)
    original, cohort = client_mod.step_deadline, client_mod._cohort_deadline

    def spy(budget, who):
        budgets.append(budget)
        return original(budget, who)

    def cohort_spy(budget, hosts):
        budgets.extend(budget.values)
        return cohort(budget, hosts)

    monkeypatch.setattr(client_mod, "step_deadline", spy)
    monkeypatch.setattr(client_mod, "_cohort_deadline", cohort_spy)
    m = build()
    # (forced: "auto" takes prox-quasi-newton on the l1 model, whose parties are smooth)
    res = m.solve("prox-al", time_limit=1e-9, inner_solver="exact-admm")
    assert res.extra["inner_solver"] == "exact-admm"
    assert res.status == "time_limit", res.message
    n_clients = len(m.compile().clients)
    assert len(budgets) == n_clients and all(b == 0.0 for b in budgets), budgets
    assert res.rounds["inner"] == 1 and res.rounds["outer"] == 1, res.rounds
    assert np.all(np.isfinite(np.asarray(res.solution["w"], dtype=float)))


def test_a_bad_step_budget_is_refused_naming_the_field():
    from fedmodel.subproblems.merit import step_deadline

    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="party 'c0'.*'budget'"):
            step_deadline(bad, "party 'c0'")
    assert step_deadline(None, "party 'c0'") is None


def test_the_infeasibility_check_runs_only_where_a_model_can_be_infeasible(monkeypatch):
    """Without constraints or a box/ball in h the consensus ``x_i = z`` is always
    feasible: exact-admm never asks its infeasibility check (sparse-logistic-d3000 at
    rho = 0.03 read a slow consensus as infeasible, "diverging"); with a constraint it does."""
    from fedmodel.algorithms.proxal.exact_admm import ExactADMM

    asked = []

    def always(self, primals, dual, tau, window=None):
        asked.append(True)
        return True

    monkeypatch.setattr(ExactADMM, "infeasible", always)
    monkeypatch.setattr("fedmodel.algorithms.proxal.exact_admm.INFEASIBLE_WINDOW", 0)
    rng = np.random.default_rng(3)
    m = fm.Model("l1")
    w = m.variable(3, name="w")
    for k in range(2):
        c = m.client(f"c{k}")
        A = c.data(rng.normal(size=(8, 3)), name="A")
        c.minimize(cp.sum(cp.abs(A @ w - 1)) / 16)
    m.regularize(1e-3 * cp.norm1(w))
    res = m.solve(method="prox-al", eps=1e-4, history=False)
    assert res.extra["inner_solver"] == "exact-admm"
    assert res.status == "optimal" and not asked
    m.server.subject_to(cp.sum(w) <= 10)  # (a constraint: the check runs, and here says so)
    res = m.solve(method="prox-al", eps=1e-4, history=False)
    assert asked and res.status == "diverging"


def test_the_run_stops_at_the_first_outer_iteration_whose_certificate_holds():
    """Test (8)'s targets with exact-admm are fractions of eps (a tenth with a constraint of
    the user's) plus tau_k, so it missed points already certified at eps; near the end (the
    inner bound and the outer step at most eps) the certificate is evaluated and the run
    stops when it holds. No earlier outer iteration of the history met those conditions with
    a certificate that held (the history rows are the certificate at each iterate), and
    the answer is within the certificate's guarantee of the pooled optimum."""
    parts = _regression(6, 30, 6, seed=1)
    m, pooled, W = loss_model(
        lambda X, y, w: cp.sum(cp.abs(X @ w - y)) / 180,
        parts,
        server_cons=lambda w: [cp.sum(w[:5]) == 0],
    )
    res = check_against_pooled(m, pooled, W)
    beta = ProxALOptions().beta
    eps1 = EPS * min(1.0, res.extra["objective_scale"])  # (test (8)'s unit, min(1, S))
    for row in res.history[:-1]:
        near_end = row["inner_satisfied"] and max(row["inner_bound"], row["dw_inf"] / beta) <= eps1
        held = max(row["scaled_stationarity"], row["scaled_feasibility"]) <= EPS
        assert not (near_end and held), (row["iteration"], row["rounds"])
    assert len(res.history) == 3, [r["rounds"] for r in res.history]  # (4 without the check)


def test_many_small_shares_keep_the_points_of_the_steps_accurate():
    """200 clients whose losses are small shares of one objective: the residual balancing
    drives exact-admm's penalty to the order of the shares, and each step's tolerance
    scales with its strong convexity (``step_tolerances``), so that the steps' points
    stay within the inner target and the consensus converges as with few clients.

    With tolerances on the residuals alone the points were off by ``1/sigma`` times the
    target and the same run took 71 rounds; here 24: the bound of 40 leaves room for
    the platform's floating point, not for a stalled consensus."""
    rng = np.random.default_rng(0)
    d, n = 10, 200
    w0 = rng.normal(size=d)
    parts = []
    for _ in range(n):
        rows = int(rng.integers(d, 2 * d + 1))
        X = rng.normal(size=(rows, d))
        parts.append((X, X @ w0 + 0.3 * rng.normal(size=rows)))
    scale = 10.0 * sum(len(y) for _, y in parts)  # (a loss over ten times the rows)

    def loss(X, y, w):
        return cp.sum_squares(X @ w - y) / scale

    model, pooled, W = loss_model(loss, parts, server_cons=lambda w: [w <= 0.5, w >= -0.5])
    res = model.solve(method="prox-al")
    assert res.status == "optimal", res.message
    assert res.extra["inner_solver"] == "exact-admm"
    assert res.rounds["communication"] <= 40, res.rounds
    pooled.solve(solver=cp.CLARABEL, **TIGHT)
    W.value = np.asarray(res.solution["w"])
    gap = (pooled.objective.value - pooled.value) / max(1.0, abs(pooled.value))
    assert abs(gap) <= 10 * EPS, gap


def test_a_thousand_clients_steps_follow_their_shares_from_the_first_round():
    """1,000 clients, each a thousandth of a logistic loss, an active l2 ball on the
    server, from ``w = 0`` with the penalty at its start of 1: a client's gradient is
    below the inner target's hundredth, so the steps' tolerance is the client's share of
    the summed residuals (``step_tolerances``). The steps then follow the shares, the
    relative penalty rule lowers ``sigma`` in the second round and the first inner solve
    takes 9 rounds, the run 18; with the budget itself as each client's tolerance the
    steps were noise of the points' size, ``sigma`` stayed at 1 for 50 rounds and the run
    took 62. The bounds leave room for the platform's floating point, not for that."""
    rng = np.random.default_rng(0)
    n, d, rows = 1000, 5, 10
    w0 = rng.normal(size=d)
    parts = []
    for _ in range(n):
        X = rng.normal(size=(rows, d))
        parts.append((X, np.where(X @ w0 + rng.normal(size=rows) > 0, 1.0, -1.0)))
    N = n * rows

    def loss(X, y, w):
        return cp.sum(cp.logistic(-cp.multiply(y, X @ w))) / N

    model = fm.Model("shares")
    w = model.variable(d, name="w")
    for k, (X, y) in enumerate(parts):
        c = model.client(f"c{k}")
        c.minimize(loss(c.data(X, name="X"), c.data(y, name="y"), w), name="loss")
    model.server.subject_to(cp.norm(w, 2) <= 0.5)
    W = cp.Variable(d)
    Xs, ys = np.vstack([X for X, _ in parts]), np.concatenate([y for _, y in parts])
    pooled = cp.Problem(cp.Minimize(loss(Xs, ys, W)), [cp.norm(W, 2) <= 0.5])
    res = check_against_pooled(model, pooled, W)
    assert res.history[0]["inner_iterations"] <= 15, [r["rounds"] for r in res.history]
    assert res.rounds["communication"] <= 30, res.rounds


def test_the_last_inner_solve_stops_where_the_certificate_at_its_iterate_holds(monkeypatch):
    """With tau_k at eps the consensus residuals stall above their target while the
    certificate at the inner iterate already holds: evaluated on the way (from round 4,
    when the dual residual is at most eps), it ends the run in fewer rounds than the
    inner solve's own test, still within the certificate's guarantee of the pooled optimum."""
    from fedmodel.algorithms.proxal.exact_admm import ExactInner

    def lad():
        parts = _regression(8, 40, 8, seed=20)
        return loss_model(lambda X, y, w: cp.sum(cp.abs(X @ w - y)) / 320, parts)

    checked = check_against_pooled(*lad())
    monkeypatch.setattr(ExactInner, "certifies_inner", lambda self, tau: False)
    plain = check_against_pooled(*lad())
    assert checked.rounds["communication"] < plain.rounds["communication"], (
        checked.rounds,
        plain.rounds,
    )


def _bpdn():
    """Basis pursuit denoising over three clients (benchmarks/models.py's bpdn at its
    quick size): ``min ||w||_1`` on the server, each client's ``||X_k w - y_k||_2 <=
    eps_k``. Its last inner solve checks the certificate on the way five times, the last
    check holding."""
    rng = np.random.default_rng(5)
    d, rows = 20, 10
    w0 = np.zeros(d)
    w0[rng.choice(d, 5, replace=False)] = rng.normal(size=5)
    m = fm.Model("bpdn")
    w = m.variable(d, name="w")
    m.server.minimize(cp.norm1(w))
    for k in range(3):
        X = rng.normal(size=(rows, d)) / np.sqrt(rows)
        noise = 0.05 * rng.normal(size=rows)
        c = m.client(f"c{k}")
        X_k, y_k = c.data(X, name="X"), c.data(X @ w0 + noise, name="y")
        c.subject_to(cp.norm(X_k @ w - y_k, 2) <= 1.2 * np.linalg.norm(noise))
    return m


def _checks(res) -> list[int]:
    """The rounds of exact-admm that carried the certificate's check (``xadmm_check``)."""
    return sorted({r["round"] for r in res.ledger if r["kind"] == "xadmm_check"})


def _same_answer(a, b) -> None:
    """``a`` and ``b`` end with the same verdict, point, multipliers and certificate."""
    assert a.status == b.status == "optimal", (a.message, b.message)
    assert np.array_equal(a.x, b.x)
    assert a.multipliers.keys() == b.multipliers.keys()
    for party, mine in a.multipliers.items():
        for key, value in mine.items():
            assert np.array_equal(value, b.multipliers[party][key]), (party, key)
    assert (a.kkt.stationarity, a.kkt.feasibility) == (b.kkt.stationarity, b.kkt.feasibility)
    assert (a.rounds["outer"], a.rounds["inner"]) == (b.rounds["outer"], b.rounds["inner"])


def test_a_failed_certificate_check_on_the_way_costs_no_round(monkeypatch):
    """The certificate's check at an inner iterate rides on the next round of exact-admm
    (``xadmm_check``: each client evaluates before its step and replies both): a check that fails costs no
    round, one that holds ends the run at the same point as a diagnostic round of its
    own would, with the same multipliers (the clients take the extra step back at the
    certificate's evaluate) -- and the evaluations' floats are still in the ledger, on the
    diagnostic channel with the step that carried them."""
    from fedmodel.algorithms.proxal.exact_admm import ExactADMM

    carried = _bpdn().solve("prox-al")
    monkeypatch.setattr(ExactADMM, "carry", False)
    alone = _bpdn().solve("prox-al")
    assert carried.extra["inner_solver"] == "exact-admm"
    checks = _checks(carried)
    assert _checks(alone) == []
    # the last check held in the run's last round; the others failed, a round each saved
    assert len(checks) >= 2 and checks[-1] == carried.rounds["communication"], checks
    saved = alone.rounds["communication"] - carried.rounds["communication"]
    assert saved == len(checks) - 1, (checks, carried.rounds, alone.rounds)
    _same_answer(carried, alone)
    # one message per client and round; a check round's carries the evaluation
    rows = [r for r in carried.ledger if r["receiver"] == "server" and r["sender"] == "c0"]
    steps = [r for r in rows if r["kind"] in ("xadmm_w_reply", "xadmm_check_reply")]
    assert len(steps) == len({r["round"] for r in steps})
    assert {r["round"] for r in steps if r["kind"] == "xadmm_check_reply"} == set(checks)
    plain = next(r["floats"] for r in steps if r["kind"] == "xadmm_w_reply")
    evaluation = next(
        r["floats"] for r in alone.ledger if r["kind"] == "evaluate_reply" and r["sender"] == "c0"
    )
    for r in steps:
        if r["round"] in checks:
            assert (r["floats"], r["channel"]) == (plain + evaluation, "diagnostic")
    last = carried.rounds["communication"]
    final = [r for r in carried.ledger if r["kind"] == "evaluate" and r["round"] == last]
    assert final and all("held" in r["shapes"] for r in final if r["sender"] == "server")


def test_a_cohort_evaluates_and_steps_together_in_a_check_round(monkeypatch):
    """Clients whose steps are batched (least squares, no constraints) answer a round that
    carries the check in one batched evaluation and step (message by message instead of
    the stacked rows), with the iterates of a run that checks in rounds of its own."""
    from fedmodel.algorithms.proxal.exact_admm import ExactADMM, ExactClient

    def lasso():
        parts = _regression(5, 30, 20, seed=2)
        m, _, _ = loss_model(
            lambda X, y, w: cp.sum_squares(X @ w - y) / 150,
            parts,
            server=lambda w: 0.1 * cp.norm1(w),
        )
        return m.solve("prox-al", inner_solver="exact-admm")

    batches = []
    batch = ExactClient._on_xadmm_check_batch

    def spy(parts, payloads):
        batches.append(len(parts))
        return batch(parts, payloads)

    monkeypatch.setattr(ExactClient, "_on_xadmm_check_batch", staticmethod(spy))
    carried = lasso()
    assert _checks(carried) and 5 in batches, (_checks(carried), batches)
    monkeypatch.setattr(ExactADMM, "carry", False)
    alone = lasso()
    saved = alone.rounds["communication"] - carried.rounds["communication"]
    held = _checks(carried)[-1] == carried.rounds["communication"]
    assert saved == len(_checks(carried)) - held
    _same_answer(carried, alone)


def test_the_check_takes_a_round_of_its_own_under_a_privacy_plan(monkeypatch):
    """Under secure aggregation or dp the certificate round collects sums, so the check
    cannot ride on exact-admm's rounds (whose points the server reads client by client):
    the server says so, the run's table then has none of the carried fields, and a run
    whose server says so checks in rounds of its own."""
    from types import SimpleNamespace

    from fedmodel.algorithms.proxal.exact_admm import ExactADMM, ExactInner
    from fedmodel.algorithms.proxal.server import ProxALServer

    def plan(active):
        return SimpleNamespace(privacy=None if active is None else SimpleNamespace(active=active))

    assert ProxALServer.carries_evaluation(plan(None))
    assert ProxALServer.carries_evaluation(plan(False))
    assert not ProxALServer.carries_evaluation(plan(True))
    private = SimpleNamespace(sums_only=True, adaptive=True, time_limit=None)
    assert {"xadmm_check", "evaluate.held"} <= ExactInner.unused(None, private)
    monkeypatch.setattr(ProxALServer, "carries_evaluation", lambda self: False)
    gated = _bpdn().solve("prox-al")
    monkeypatch.setattr(ExactADMM, "carry", False)
    alone = _bpdn().solve("prox-al")
    assert _checks(gated) == [] and gated.rounds == alone.rounds
    _same_answer(gated, alone)


def test_an_exact_step_with_exponential_cones_asks_clarabel_for_a_hundredth_of_1e_9():
    """exact-admm asks its steps for residuals down to ``LOCAL_FLOOR`` (1e-9) in the last
    stage of a tight ``eps``; Clarabel gets a hundredth of the request, down to 1e-11 in a
    step with exponential cones (the server's entr) and to its floor of 1e-10 in a
    quadratic one (the client's linear constraint)."""
    from fedmodel.algorithms.proxal.exact_admm import LOCAL_FLOOR
    from fedmodel.subproblems.conic_prox import exact_prox_solver
    from fedmodel.subproblems.cvxpy_backend import CLARABEL_FLOOR, clarabel_tolerances
    from fedmodel.subproblems.merit import MeritProblem

    m = fm.Model("entropy")
    w = m.variable(4, name="w")
    m.server.minimize(-cp.sum(cp.entr(w)))
    m.server.subject_to([cp.sum(w) == 1])
    m.client("c").subject_to(np.ones((1, 4)) @ w <= 0.9)
    compiled = m.compile()
    for program, floor in ((compiled.server, 0.01 * LOCAL_FLOOR), (compiled.clients[0], None)):
        solver = exact_prox_solver(MeritProblem([program], 100.0, compiled.regularizer))
        asked = clarabel_tolerances(LOCAL_FLOOR, solver.floor)
        expected = floor if floor is not None else CLARABEL_FLOOR
        assert asked["tol_gap_abs"] == asked["tol_feas"] == pytest.approx(expected)


@pytest.mark.slow
def test_maximum_entropy_is_optimal_at_a_tight_eps():
    """The maximum-entropy model of the benchmark suite (entr on the server's simplex, two
    moment bounds per client; quick size) at eps = 1e-6: exact-admm's steps reach the
    accuracy the last inner solves ask for, and the certificate holds without a handover
    to Algorithm 2 (with Clarabel's tolerances held at 1e-10 the consensus stalls at a
    scaled feasibility of ~5e-6). "optimal" at eps bounds the relative gap and violation
    by 10 eps (the suite's rule)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import models as suite

    case = suite.MODELS["max-entropy"][0](True)
    ref = suite.pooled_reference(case, 30.0)
    res = case.model.solve(method="prox-al", eps=1e-6)
    assert res.status == "optimal", res.message
    assert "inner_solver_handed_over" not in res.extra
    verdict = suite.judge(case, res.solution, ref["f_star"])
    assert abs(verdict["rel_gap"]) <= 1e-5
    assert verdict["rel_violation"] <= 1e-5


def test_a_settled_consensus_gap_raises_sigma_before_it_reads_as_infeasible(monkeypatch):
    """A free variable pushed to 1e4 by a linear objective and held by one client's row
    (``x_0 + a^T x <= 0``; the model is feasible, ``f* = 0``) dominates ``||x_i||``, so the
    relative rule reads the consensus gap of the other coordinates as small and drives
    ``sigma`` to the bottom of its range, where the gap settles: a sign of infeasibility
    only at the top of the range. The run takes one outer iteration without a false
    verdict, with sigma raised above the relative rule's floor by the raise factor."""
    from fedmodel.algorithms.proxal import exact_admm

    starts = []
    init = exact_admm.ExactADMM.__init__

    def keep(self, *args, **kwargs):
        init(self, *args, **kwargs)
        starts.append(self.sigma_start)

    monkeypatch.setattr(exact_admm.ExactADMM, "__init__", keep)
    rng = np.random.default_rng(0)
    n, rows = 12, 4
    A = np.hstack([np.ones((rows, 1)), rng.uniform(0, 2000, (rows, n - 1))])
    b = np.concatenate([[0.0], rng.uniform(1, 3, rows - 1) * 1e4])
    m = fm.Model("free-variable")
    x = m.variable(n, name="x")
    m.server.minimize(-x[0] + 0.5 * cp.sum_squares(x[1:]))
    m.server.subject_to(x[1:] >= 0)
    for i in range(rows):
        c = m.client(f"c{i}")
        c.subject_to(c.data(A[i : i + 1], name="A") @ x <= b[i])
    res = m.solve("prox-al", eps=1e-3, max_outer=1, history=False)
    assert res.extra["inner_solver"] == "exact-admm"
    assert res.status not in ("diverging", "infeasible", "unbounded"), res.message
    floor = starts[-1] / exact_admm.SIGMA_RANGE
    assert res.extra["exact_admm_sigma"] >= exact_admm.STALL_RAISE * floor * (1 - 1e-12)


def test_duals_kept_as_rows_are_a_state_of_names_and_rows_that_comes_back():
    """Duals kept as rows are given as the clients' names and one array of rows (a mark
    copies one array, not one per client); putting the state back, or a state of duals by
    name, gives the same duals."""
    from fedmodel.algorithms.proxal.exact_admm import ExactADMM
    from fedmodel.runtime.endpoints import copy_state

    names, U = ["a", "b", "c"], np.arange(6.0).reshape(3, 2)
    inner = ExactADMM(sigma=1.0, anderson=0, balancing=None, max_inner=10)
    inner.keep_duals(names, U)
    state = copy_state(inner.get_state())
    assert state["duals"] == {} and state["dual_rows"][0] == names
    U[0, 0] = 99.0  # (the mark is a copy)
    other = ExactADMM(sigma=2.0, anderson=0, balancing=None, max_inner=10)
    other.set_state(state)
    assert other.duals_of(names, 2).tolist() == [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]]
    assert sorted(other.duals) == names and other.duals["b"].tolist() == [2.0, 3.0]
    # by name (no rows kept): the state is a dict of them, and comes back the same
    other.duals = {"x": np.ones(2)}
    again = ExactADMM(sigma=1.0, anderson=0, balancing=None, max_inner=10)
    again.set_state(copy_state(other.get_state()))
    assert "dual_rows" not in other.get_state() and again.duals["x"].tolist() == [1.0, 1.0]
