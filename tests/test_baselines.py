"""Baselines fedavg, fedprox and dgd on the same models (seed 004's comparisons)."""

from __future__ import annotations

import cvxpy as cp
import networkx as nx
import numpy as np
import pytest

import fedmodel as fm
from fedmodel.errors import ModelError, UnsupportedError


def model(parts, l1=0.0):
    total = sum(A.shape[0] for A, _ in parts)
    m = fm.Model("ls")
    w = m.variable(parts[0][0].shape[1], name="w")
    for i, (A, b) in enumerate(parts):
        c = m.client(f"c{i}")
        Ad, bd = c.data(A, name="A"), c.data(b, name="b")
        c.minimize(cp.sum_squares(Ad @ w - bd) / total)
    if l1:
        m.regularize(l1 * cp.norm1(w))
    return m


def hetero(n=4, d=4, seed=0, rows=None):
    rng = np.random.default_rng(seed)
    rows = rows or [20] * n
    return [(rng.normal(size=(r, d)) + 0.5 * i, rng.normal(size=r) + i) for i, r in enumerate(rows)]


def rel(res, ref):
    return res.compare(ref).relative_objective_difference


def test_fedavg_exact_on_identical_clients_is_optimal():
    rng = np.random.default_rng(2)
    A, b = rng.normal(size=(30, 4)), rng.normal(size=30)
    m = model([(A, b)] * 3)
    ref = m.solve("centralized")
    res = m.solve("fedavg", local_solver="exact", max_rounds=5)
    assert res.status == "optimal" and rel(res, ref) <= 1e-8


def test_fedavg_and_fedprox_drift_on_heterogeneous_clients():
    m = model(hetero())
    ref = m.solve("centralized")
    for method in ("fedavg", "fedprox"):
        res = m.solve(method, max_rounds=3000)
        assert res.status == "inaccurate"  # a fixed point, but not the optimum
        assert 1e-4 < rel(res, ref) < 0.5
        assert "stalled" in res.message
    # the multiplier update is what fixes the drift
    assert rel(m.solve("dald-cc"), ref) <= 1e-6


def test_fedavg_weights_follow_sample_counts():
    m = model(hetero(rows=[10, 30, 60]))
    res = m.solve("fedavg", max_rounds=3)
    assert res.extra["weights"] == pytest.approx({"c0": 0.1, "c1": 0.3, "c2": 0.6})
    assert res.communication["messages_up"] == 3 * 3 + 3  # sample counts once, then rounds
    res = m.solve("fedavg", max_rounds=3, weights={"c0": 1, "c1": 1, "c2": 2})
    assert res.extra["weights"]["c2"] == pytest.approx(0.5)
    with pytest.raises(ModelError, match="weights dict must give every client"):
        m.solve("fedavg", weights={"c0": 1})
    with pytest.raises(ModelError, match="weights must be"):
        m.solve("fedavg", weights="data")


def test_fedprox_closer_with_smaller_prox_coef_matters():
    """FedProx's fixed point depends on the proximal coefficient (seed 004 Fig. 4(b))."""
    m = model(hetero())
    a = m.solve("fedprox", prox_coef=0.1, max_rounds=3000)
    b = m.solve("fedprox", prox_coef=10.0, max_rounds=3000)
    assert np.abs(a.x - b.x).max() > 1e-4


def test_dgd_converges_to_a_neighbourhood_and_decaying_steps_help():
    m = model(hetero())
    ref = m.solve("centralized")
    const = m.solve("dgd", topology="ring", max_rounds=1500, history=False)
    assert const.status == "max_iterations"
    assert rel(const, ref) < 0.2
    assert all(a > 0 for a in const.extra["steps"].values())
    decay = m.solve(
        "dgd", topology="complete", step=0.05, step_decay=0.5, max_rounds=3000, history=False
    )
    assert rel(decay, ref) < rel(const, ref)
    comm = const.communication
    assert comm["messages_up"] == 0 and comm["messages_peer"] == 1500 * 2 * 4  # ring: 4 edges


def test_dgd_mixing_matrix_checks():
    m = model(hetero(n=3))
    good = np.array([[0.5, 0.5, 0.0], [0.5, 0.0, 0.5], [0.0, 0.5, 0.5]])
    res = m.solve("dgd", mixing=good, step=0.05, max_rounds=50, history=False)
    assert res.extra["mixing"]["c1"]["c0"] == 0.5
    with pytest.raises(ModelError, match="must be 3 x 3"):
        m.solve("dgd", mixing=np.eye(2))
    with pytest.raises(ModelError, match="rows summing to 1"):
        m.solve("dgd", mixing=np.full((3, 3), 0.5))
    with pytest.raises(ModelError, match="not neighbours"):
        m.solve("dgd", mixing=np.full((3, 3), 1 / 3))  # chain: c0 and c2 are not linked
    g = nx.Graph([("c0", "c1")])
    g.add_node("c2")
    with pytest.raises(ModelError, match="not connected"):
        m.solve("dgd", topology=g)
    with pytest.raises(ModelError, match="self-loops"):
        m.solve("dgd", topology=nx.Graph([("c0", "c1"), ("c1", "c2"), ("c2", "c2")]))


def constrained(parts):
    m = model(parts)
    w = m.variables[0]
    m.server.subject_to(cp.sum(w) == 1)
    m.clients[1].subject_to(w <= 0.4)
    return m


@pytest.mark.parametrize("method", ["fedavg", "fedprox", "dgd"])
def test_constraints_through_the_quadratic_penalty(method):
    m = constrained(hetero(n=3))
    with pytest.raises(UnsupportedError, match="penalty="):
        m.solve(method)
    kw = {"topology": "star", "max_rounds": 3000, "step": 0.002} if method == "dgd" else {}
    if method != "dgd":
        kw = {"local_solver": "exact", "max_rounds": 2000}
    viol = []
    for beta in (1.0, 100.0):
        res = m.solve(method, penalty=beta, history=False, **kw)
        viol.append(res.max_violation)
        assert set(res.multipliers) >= {"server", "c1"}
    assert viol[1] < viol[0] / 5
    assert res.kkt.feasibility == pytest.approx(res.max_violation, rel=1e-6, abs=1e-12)


def test_dgd_needs_the_server_as_a_node_for_server_terms():
    m = constrained(hetero(n=3))
    with pytest.raises(UnsupportedError, match="'server' a node"):
        m.solve("dgd", penalty=10.0)


def test_l1_regulariser_is_split_over_the_clients():
    m = model(hetero(n=3), l1=0.05)
    ref = m.solve("centralized")
    res = m.solve("fedprox", prox_coef=0.5, max_rounds=4000, local_solver="prox-grad", step=0.05)
    assert res.status in ("inaccurate", "max_iterations")
    assert rel(res, ref) < 0.2


@pytest.mark.parametrize(
    "method, kw, match",
    [
        ("fedavg", {"local_solver": "sgd"}, "local_solver must be one of"),
        ("fedavg", {"local_start": "random"}, "local_start"),
        ("fedavg", {"local_steps": 0}, "local_steps must be"),
        ("fedprox", {"prox_coef": 0.0}, "prox_coef must be a positive number"),
        ("dgd", {"step_decay": -1.0}, "step_decay"),
        ("dgd", {"mixing": "max-degree"}, "mixing must be"),
    ],
)
def test_bad_baseline_options(method, kw, match):
    m = model(hetero(n=3))
    with pytest.raises(ModelError, match=match):
        m.solve(method, **kw)
