"""dald-cc and dald-dc (seed 004 Algorithms 2 and 3): reductions, invariants, agreement
with the centralized optimum, KKT residuals, options and errors."""

from __future__ import annotations

import cvxpy as cp
import networkx as nx
import numpy as np
import pytest

import fedmodel as fm
from fedmodel.algorithms.registry import all_methods
from fedmodel.errors import ModelError, UnsupportedError


def ls_data(n=4, d=5, rows=20, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        A = rng.normal(size=(rows, d)) + 0.5 * i
        b = rng.normal(size=rows) + i
        out.append((A, b))
    return out


def ls_model(data, l1=0.0, server_term=False):
    n = len(data)
    rows = data[0][0].shape[0]
    m = fm.Model("ls")
    w = m.variable(data[0][0].shape[1], name="w")
    for i, (A, b) in enumerate(data):
        c = m.client(f"c{i}")
        Ad, bd = c.data(A, name="A"), c.data(b, name="b")
        c.minimize(cp.sum_squares(Ad @ w - bd) / (n * rows))
    if l1:
        m.regularize(l1 * cp.norm1(w))
    if server_term:
        m.server.minimize(0.1 * cp.sum_squares(w - 1))
    return m


def logit_model(n=3, d=6, rows=30, lam=0.02, seed=1):
    rng = np.random.default_rng(seed)
    m = fm.Model("l1-logistic")
    w = m.variable(d, name="w")
    wt = rng.normal(size=d)
    for i in range(n):
        c = m.client(f"c{i}")
        A = rng.normal(size=(rows, d)) + 0.3 * i
        y = np.sign(A @ wt + 0.5 * rng.normal(size=rows))
        M = c.data(A * y[:, None], name="M")
        c.minimize(cp.sum(cp.logistic(-(M @ w))) / (n * rows))
    m.regularize(lam * cp.norm1(w))
    return m


@pytest.fixture(scope="module")
def ls():
    data = ls_data()
    m = ls_model(data)
    return data, m, m.solve("centralized")


@pytest.fixture(scope="module")
def logit():
    m = logit_model()
    return m, m.solve("centralized")


def rel(res, ref):
    return res.compare(ref).relative_objective_difference


def test_methods_registered():
    for name in ("dald-cc", "dald-dc", "fedavg", "fedprox", "dgd"):
        assert name in all_methods()


# -- agreement with the centralized optimum and KKT residuals -----------------------------


@pytest.mark.parametrize("method", ["dald-cc", "dald-dc"])
def test_least_squares_reaches_centralized(ls, method):
    _, m, ref = ls
    res = m.solve(method, eps_pri=1e-7, eps_dual=1e-7)
    assert res.status == "optimal"
    assert rel(res, ref) <= 1e-6
    assert np.abs(res.x - ref.x).max() < 1e-5


@pytest.mark.parametrize("method", ["dald-cc", "dald-dc"])
def test_l1_logistic_reaches_centralized(logit, method):
    m, ref = logit
    res = m.solve(method, rho=0.1, eps_pri=1e-7, eps_dual=1e-7)
    assert res.status == "optimal"
    assert rel(res, ref) <= 1e-6
    # sparsity pattern of the l1 solution is recovered
    assert np.array_equal(np.abs(res.x) > 1e-6, np.abs(ref.x) > 1e-6)


@pytest.mark.parametrize(
    "method, keys",
    [("dald-cc", ("primal_65", "dual_66", "sum_mu_67")), ("dald-dc", ("primal_73", "dual_74"))],
)
def test_consensus_kkt_residuals_go_to_zero(ls, method, keys):
    _, m, _ = ls
    res = m.solve(method, eps_pri=1e-8, eps_dual=1e-8)
    first, last = res.history[0], res.history[-1]
    for key in keys[:2]:
        assert last[key] <= 1e-6
        assert last[key] <= 1e-3 * max(first[key], 1e-12)
    assert last["stationarity"] <= 1e-5 and last["stationarity"] < first["stationarity"]
    assert res.extra["consensus_kkt"][keys[0]] <= 1e-6


def test_cc_invariant_sum_of_multipliers_is_zero(ls):
    """Appendix eq. (68): with an exact server step, sum_i mu_i^{k+1} = 0 at every update."""
    _, m, _ = ls
    res = m.solve("dald-cc", max_iter=40, rho=np.linspace(0.5, 1.5, 5))
    scale = max(np.abs(v).max() for v in res.extra["consensus_multipliers"].values())
    assert scale > 1e-3  # the multipliers are not trivially zero
    assert all(row["sum_mu_67"] <= 1e-10 * scale for row in res.history)


# -- reductions --------------------------------------------------------------------------


def test_n1_without_multipliers_is_the_proximal_point_method():
    """n = 1, mu = 0: x^{k+1} = argmin f(x) + ||x - x^k||^2 / (2 alpha), alpha = 1/(2 rho^2)."""
    ((A, b),) = ls_data(n=1)
    m = ls_model([(A, b)])
    rho, K = 0.7, 8
    res = m.solve(
        "dald-cc",
        rho=rho,
        update_multipliers=False,
        max_iter=K,
        eps_pri=1e-300,
        eps_dual=1e-300,
        snapshot_iterations=range(1, K + 1),
        history=False,
    )
    alpha = 1.0 / (2 * rho**2)
    N = A.shape[0]
    H = 2 * A.T @ A / N + np.eye(A.shape[1]) / alpha
    x = np.zeros(A.shape[1])
    for k in range(1, K + 1):
        x = np.linalg.solve(H, 2 * A.T @ b / N + x / alpha)  # (33)
        assert np.allclose(res.extra["snapshots"][k]["x_hat"], x, atol=1e-8)


def test_b4_vmax1_is_consensus_admm(ls):
    """(B4) with vmax = 1 is consensus ADMM: x_i = argmin f_i + y_i^T(x - z) + c/2 ||x - z||^2,
    z = mean(x_i + y_i / c), y_i += c (x_i - z), with c = 2 rho^2 and y_i = -mu_i."""
    data, m, _ = ls
    rho, K = 0.8, 6
    res = m.solve(
        "dald-cc",
        rho=rho,
        inner="B4",
        vmax=1,
        max_iter=K,
        eps_pri=1e-300,
        eps_dual=1e-300,
        snapshot_iterations=range(1, K + 1),
        history=False,
    )
    c = 2 * rho**2
    n, rows = len(data), data[0][0].shape[0]
    d = data[0][0].shape[1]
    z = np.zeros(d)
    y = [np.zeros(d) for _ in data]
    for k in range(1, K + 1):
        xs = []
        for (A, b), yi in zip(data, y):
            H = 2 * A.T @ A / (n * rows) + c * np.eye(d)
            xs.append(np.linalg.solve(H, 2 * A.T @ b / (n * rows) - yi + c * z))
        z = np.mean([xi + yi / c for xi, yi in zip(xs, y)], axis=0)
        y = [yi + c * (xi - z) for xi, yi in zip(xs, y)]
        snap = res.extra["snapshots"][k]
        assert np.allclose(snap["x_hat"], z, atol=1e-8)
        for i, xi in enumerate(xs):
            assert np.allclose(snap["local"][f"c{i}"], xi, atol=1e-8)


@pytest.mark.parametrize("local_solver", ["exact", "prox-grad"])
def test_fedprox_equals_cc_with_multipliers_fixed_at_zero(ls, local_solver):
    _, m, _ = ls
    rho, K = 0.6, 10
    common = dict(local_solver=local_solver, snapshot_iterations=range(1, K + 1), history=False)
    if local_solver == "prox-grad":
        common.update(step=0.05, local_steps=3)
    cc = m.solve(
        "dald-cc",
        rho=rho,
        update_multipliers=False,
        max_iter=K,
        eps_pri=1e-300,
        eps_dual=1e-300,
        **common,
    )
    fp = m.solve(
        "fedprox",
        prox_coef=2 * rho**2,
        weights="uniform",
        max_rounds=K,
        tol=1e-300,
        local_start="previous",
        **common,
    )
    for k in range(1, K + 1):
        assert np.allclose(
            cc.extra["snapshots"][k]["x_hat"], fp.extra["snapshots"][k]["x_hat"], atol=1e-8
        )


def test_dc_on_a_star_rooted_at_the_server_equals_cc(ls):
    _, m, _ = ls
    K = 12
    common = dict(
        rho=0.9,
        max_iter=K,
        eps_pri=1e-300,
        eps_dual=1e-300,
        snapshot_iterations=range(1, K + 1),
        local_solver="prox-grad",
        step=0.05,
        local_steps=2,
    )
    cc = m.solve("dald-cc", **common)
    dc = m.solve("dald-dc", topology="star", **common)
    assert dc.extra["root"] == "server"
    for k in range(1, K + 1):
        a, b = cc.extra["snapshots"][k], dc.extra["snapshots"][k]
        assert np.allclose(a["x_hat"], b["local"]["server"], atol=1e-12, rtol=0)
        for name, x in a["local"].items():
            assert np.allclose(x, b["local"][name], atol=1e-12, rtol=0)
    for rc, rd in zip(cc.history, dc.history):
        assert rc["D"] == pytest.approx(rd["D"], rel=1e-9, abs=1e-14)
        assert rc["C"] == pytest.approx(rd["C"], rel=1e-9, abs=1e-14)


def test_schedule_from_the_hierarchical_matrix_orders_1_2_3(ls):
    _, m, _ = ls
    data = ls_data(n=3)
    m3 = ls_model(data)
    S = [[1, 1, 0], [0, 1, 1], [0, 0, 0]]
    res = m3.solve("dald-dc", topology=S, max_iter=3, history=False)
    assert res.extra["hierarchy"]["order"] == ["c0", "c1", "c2"]
    assert res.extra["hierarchy"]["levels"] == [["c0"], ["c1"], ["c2"]]
    assert res.extra["root"] == "c2"


# -- inner rules, solver layers, penalties ---------------------------------------------------


@pytest.mark.parametrize(
    "kw",
    [
        {"inner": "B1", "eps_dual": 1e-7, "eps_pri": 1e-7},
        {"inner": "B2", "eps_dual": 1e-7, "eps_pri": 1e-7},
        {"inner": "B3", "eps_dual": 1e-7, "eps_pri": 1e-7},
        {"inner": "B4", "vmax": 3, "eps_dual": 1e-7, "eps_pri": 1e-7},
    ],
)
def test_inner_rules_reach_the_optimum(ls, kw):
    _, m, ref = ls
    res = m.solve("dald-dc", **kw)
    assert res.status == "optimal" and rel(res, ref) <= 1e-6
    inner_per_outer = res.rounds["inner"] / res.rounds["outer"]
    if kw["inner"] == "B4":
        assert inner_per_outer <= 3
    if kw["inner"] == "B1":
        assert inner_per_outer > 3  # the exact version solves each inner problem to eps_dual


@pytest.mark.parametrize(
    "kw",
    [
        {"local_solver": "prox-grad", "local_steps": 5},
        {"local_solver": "prox-grad", "step": "backtracking"},
        {"local_solver": "bfgs", "local_tol": 1e-9},
        {"rho": np.linspace(0.5, 2.0, 5)},
        {"rho": {"c0": 2.0, "c3": 0.5}},
    ],
)
def test_solver_layers_and_vector_rho(ls, kw):
    _, m, ref = ls
    res = m.solve("dald-cc", eps_pri=1e-7, eps_dual=1e-7, **kw)
    assert res.status == "optimal" and rel(res, ref) <= 1e-6


def test_edge_rho_and_other_topologies(ls):
    _, m, ref = ls
    for kw in ({"topology": "ring"}, {"topology": "complete"}, {"rho": {("c1", "c0"): 2.0}}):
        res = m.solve("dald-dc", eps_pri=1e-7, eps_dual=1e-7, **kw)
        assert res.status == "optimal" and rel(res, ref) <= 1e-6


def test_bfgs_needs_a_smooth_subproblem(logit):
    m, _ = logit
    with pytest.raises(UnsupportedError, match="bfgs"):
        m.solve("dald-cc", local_solver="bfgs")


def test_increasing_penalty_schedule_theorem2(ls):
    """rho^k increasing and eps_dual^k -> 0 (B2): C^k -> 0 and the multipliers converge."""
    data, m, ref = ls
    res = m.solve(
        "dald-cc",
        rho=0.2,
        rho_growth=1.5,
        rho_growth_max=50.0,
        inner="B2",
        eps_dual_k=lambda k: max(1e-9, 0.1 * 0.3**k),
        eps_pri=1e-8,
        eps_dual=1e-8,
        eps=1e-3,
    )
    scales = [row["rho_scale"] for row in res.history]
    assert scales[-1] > scales[0] and all(b >= a for a, b in zip(scales, scales[1:]))
    assert res.history[-1]["primal_65"] <= 1e-8
    assert rel(res, ref) <= 1e-6
    # mu_i -> mu_i^* = grad f_i(x^*) (eq. 66)
    n, rows = len(data), data[0][0].shape[0]
    for i, (A, b) in enumerate(data):
        g = 2 * A.T @ (A @ ref.x - b) / (n * rows)
        assert np.allclose(res.extra["consensus_multipliers"][f"c{i}"], g, atol=1e-4)


@pytest.mark.parametrize(
    "method, kw",
    [
        ("dald-cc", {"coordination": "random", "vmax": 4, "random_state": 0}),
        ("dald-cc", {"coordination": "greedy", "vmax": 4}),
        ("dald-dc", {"coordination": "random", "vmax": 4, "random_state": 0}),
        ("dald-dc", {"coordination": "greedy", "vmax": 4}),
        ("dald-dc", {"dropout": 0.3, "vmax": 3, "random_state": 1}),
        ("dald-cc", {"dropout": 0.3, "vmax": 3, "random_state": 1}),
        ("dald-dc", {"coordination": ["c0", "c1", "c1", "c3"], "vmax": 3}),
        ("dald-dc", {"coordination": lambda k, v, order: order[::-1], "vmax": 2}),
    ],
)
def test_coordination_sequences_converge(ls, method, kw):
    """Partial-cycle, selective-repetitive, dropout and reconfiguration, with the last inner
    iteration of every outer iteration full-cycle, still reach the optimum."""
    _, m, ref = ls
    res = m.solve(method, eps_pri=1e-7, eps_dual=1e-7, **kw)
    assert res.status == "optimal" and rel(res, ref) <= 1e-6


def test_partial_cycle_visits_every_client_equally(ls):
    _, m, _ = ls
    res = m.solve(
        "dald-cc",
        coordination="random",
        fraction=0.5,
        vmax=10**6,
        inner="B4",
        eps_dual=1e-300,
        max_iter=800,
        history=False,
        random_state=3,
    )
    visits = np.array(list(res.extra["visits"].values()))
    assert visits.min() / visits.max() > 0.9


# -- constraints, server terms, communication ----------------------------------------------


def constrained(data):
    m = ls_model(data)
    w = m.variables[0]
    m.server.subject_to(cp.sum(w) == 1)
    m.clients[0].subject_to(w >= -0.5)
    return m


def test_constraints_need_a_penalty(ls):
    data, _, _ = ls
    m = constrained(data)
    for method in ("dald-cc", "dald-dc", "fedavg", "fedprox", "dgd"):
        with pytest.raises(UnsupportedError, match=rf"'{method}'.*penalty=.*prox-al"):
            m.solve(method)


def test_penalised_constraints_approach_the_constrained_optimum(ls):
    data, _, _ = ls
    m = constrained(data)
    ref = m.solve("centralized")
    viol = []
    for beta in (10.0, 1000.0):
        res = m.solve("dald-cc", penalty=beta, eps_pri=1e-8, eps_dual=1e-8)
        viol.append(res.max_violation)
        assert res.multipliers["server"]  # the multipliers implied by the penalty
    assert viol[1] < viol[0] / 20
    assert rel(res, ref) < 1e-3
    with pytest.raises(UnsupportedError, match="server holds terms"):
        m.solve("dald-dc", penalty=10.0)
    res = m.solve("dald-dc", topology="star", penalty=1000.0, eps_pri=1e-8, eps_dual=1e-8)
    assert res.max_violation < 1e-2


def test_server_objective_terms(ls):
    data, _, _ = ls
    m = ls_model(data, server_term=True)
    ref = m.solve("centralized")
    res = m.solve("dald-cc", eps_pri=1e-8, eps_dual=1e-8)
    assert res.status == "optimal" and rel(res, ref) <= 1e-6
    g = nx.star_graph(4)
    g = nx.relabel_nodes(g, {0: "server", 1: "c0", 2: "c1", 3: "c2", 4: "c3"})
    res = m.solve("dald-dc", topology=g, eps_pri=1e-8, eps_dual=1e-8)
    assert res.status == "optimal" and rel(res, ref) <= 1e-6


def test_communication_is_counted(ls):
    _, m, _ = ls
    K, d, n = 5, 5, 4
    cc = m.solve("dald-cc", max_iter=K, eps_pri=1e-300, eps_dual=1e-300)
    comm = cc.communication
    assert comm["messages_up"] == n * K and comm["messages_down"] == n * K
    assert comm["floats_up"] == n * K * d
    assert comm["messages_peer"] == 0
    dc = m.solve("dald-dc", max_iter=K, eps_pri=1e-300, eps_dual=1e-300)  # chain of 4
    comm = dc.communication
    assert comm["messages_up"] == comm["messages_down"] == 0
    # per sweep: 2 x per edge (up with [D, C], down without) + 1 control per edge
    assert comm["messages_peer"] == K * 3 * (n - 1)
    assert comm["floats_peer"] == K * (n - 1) * ((d + 2) + d + 2)
    slim = m.solve("dald-dc", max_iter=K, eps_pri=1e-300, eps_dual=1e-300, keep_ledger=False)
    assert slim.ledger == [] and slim.communication["messages_peer"] == comm["messages_peer"]


# -- options and errors --------------------------------------------------------------------


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"inner": "B5"}, "inner must be one of"),
        ({"vmax": 0}, "vmax must be an integer"),
        ({"local_solver": "lbfgs-b"}, "local_solver must be one of"),
        ({"rho": -1.0}, "rho for every client must be positive"),
        ({"rho": [1.0, 2.0]}, "vector of 5 entries"),
        ({"rho": {"nobody": 1.0}}, "unknown clients"),
        ({"topology": "chain"}, "options of dald-dc"),
        ({"coordination": "sometimes"}, "coordination must be one of"),
        ({"fraction": 0.0}, "fraction must lie"),
        ({"rho_growth": 0.5}, "rho_growth must be >= 1"),
        ({"eps_dual_k": "fast"}, "eps_dual_k must be"),
        ({"not_an_option": 1}, "unknown option"),
    ],
)
def test_bad_options(ls, kw, match):
    _, m, _ = ls
    with pytest.raises(ModelError, match=match):
        m.solve("dald-cc", **kw)


@pytest.mark.parametrize(
    "topology, match",
    [
        (nx.Graph([("c0", "c1"), ("c2", "c3")]), "not connected"),
        (nx.path_graph(["c0", "c1", "c2"]), "missing \\['c3'\\]"),
        (nx.path_graph(["c0", "c1", "c2", "c3", "x"]), "not clients \\['x'\\]"),
        (np.zeros((4, 3)), "must be square"),
        (np.eye(3), "3 x 3 but there are 4 nodes"),
        ([[1, 1, 0, 0], [0, 1, 1, 0], [0, 0, 0, 0], [0, 0, 0, 0]], "roots|not connected"),
        ([[1, 1, 0, 0], [0, 1, 1, 0], [0, 0, 1, 1], [1, 0, 0, 1]], "cycle"),
        ([[2, 1, 0, 0], [0, 1, 1, 0], [0, 0, 1, 1], [0, 0, 0, 0]], "out-degree"),
        ("lattice", "unknown topology"),
    ],
)
def test_bad_topologies(ls, topology, match):
    _, m, _ = ls
    with pytest.raises(ModelError, match=match):
        m.solve("dald-dc", topology=topology)


def test_bad_order_gives_several_roots(ls):
    _, m, _ = ls
    with pytest.raises(ModelError, match="2 roots"):
        m.solve(
            "dald-dc",
            topology=nx.path_graph(["c0", "c1", "c2", "c3"]),
            order=["c1", "c0", "c2", "c3"],
        )
