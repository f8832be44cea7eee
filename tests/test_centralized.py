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


def test_auto_takes_the_smooth_path_for_small_qps_and_agrees_with_cvxpy():
    model = lcqp_test_model(3)
    assert prefers_smooth_path(model.compile())
    res = model.solve(method="centralized")
    assert res.status == "optimal"
    assert res.extra["solved_with"] == "cprox-al (smooth exact)"
    assert res.kkt.stationarity <= 1e-6 and res.kkt.feasibility <= 1e-6
    conic = model.solve(method="centralized", engine="cvxpy")
    assert conic.status == "optimal" and conic.extra["cvxpy_solver"]
    assert abs(conic.objective - res.objective) <= 1e-6 * max(1.0, abs(conic.objective))


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
