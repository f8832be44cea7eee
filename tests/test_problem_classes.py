"""Seed 000's three problem classes at small sizes, against the centralized optimum."""

import numpy as np
import pytest
from problems import fairness_test_model, lcqp_test_model, np_model

EPS = 1e-3


@pytest.mark.parametrize("n", [1, 3, 5])
def test_lcqp_matches_centralized(n):
    model = lcqp_test_model(n, d=50, m=2, seed=n)
    ref = model.solve(method="centralized")
    assert ref.status == "optimal"
    res = model.solve(method="prox-al", eps=EPS)
    assert res.status == "optimal"
    assert res.compare(ref).relative_objective_difference <= 1e-3
    assert res.kkt.stationarity <= EPS and res.kkt.feasibility <= EPS


@pytest.mark.parametrize("n", [1, 3, 5])
def test_neyman_pearson_matches_centralized(n):
    model = np_model(n, seed=n)
    ref = model.solve(method="centralized")
    assert ref.status == "optimal"
    res = model.solve(method="prox-al", eps=EPS)
    assert res.status == "optimal"
    assert res.compare(ref).relative_objective_difference <= 1e-3
    assert res.kkt.stationarity <= EPS and res.kkt.feasibility <= EPS
    # the class-1 constraint is active somewhere, so the test is not vacuous
    assert (
        max(float(v) for p, m in ref.multipliers.items() if p != "server" for v in m.values()) > 0.1
    )


@pytest.mark.parametrize("n", [1, 3, 5])
def test_fairness_matches_cprox_al(n):
    model = fairness_test_model(n, seed=n)
    ref = model.solve(method="cprox-al", eps=1e-6, beta=100)
    assert ref.status == "optimal" and ref.kkt.local
    res = model.solve(method="prox-al", eps=EPS, beta=100)
    assert res.status == "optimal" and res.kkt.local
    assert res.compare(ref).relative_objective_difference <= 1e-3
    assert res.kkt.stationarity <= EPS and res.kkt.feasibility <= EPS
    # a disparity constraint binds (server or a client)
    assert any(float(v) > 0 for m in ref.multipliers.values() for v in m.values())


def test_tiny_qp_tight_tolerance():
    model = lcqp_test_model(2, d=6, m=1, seed=0)
    ref = model.solve(method="centralized")
    res = model.solve(method="prox-al", eps=1e-7)
    assert res.status == "optimal"
    assert res.compare(ref).relative_objective_difference <= 1e-6
    assert res.kkt.stationarity <= 1e-7 and res.kkt.feasibility <= 1e-7
    assert res.compare(ref).solution_distance <= 1e-5


def test_centralized_refuses_nonconvex_model_pointing_to_cprox_al():
    import fedmodel as fm

    model = fairness_test_model(2)
    with pytest.raises(fm.UnsupportedError, match="cprox-al"):
        model.solve(method="centralized")


def test_cprox_al_matches_centralized_on_convex_model():
    model = np_model(3, seed=7)
    ref = model.solve(method="centralized")
    res = model.solve(method="cprox-al", eps=1e-6)
    assert res.status == "optimal"
    assert res.compare(ref).relative_objective_difference <= 1e-5
    assert np.isfinite(res.objective)
