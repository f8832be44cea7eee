"""prox-al's monitors (issue 23): "unbounded", "diverging" and "infeasible" only with
evidence; a model with a finite optimum never gets one of these verdicts."""

from __future__ import annotations

from types import SimpleNamespace

import cvxpy as cp
import numpy as np
import pytest

import fedmodel as fm
from fedmodel.algorithms.common import DIVERGENCE_WINDOW
from fedmodel.algorithms.proxal.server import ProxALServer

FALSE_VERDICTS = ("unbounded", "infeasible", "diverging")


def _diverging(history, beta=100.0, eps2=1e-6):
    fake = SimpleNamespace(
        dmu_history=list(history),
        beta=beta,
        options=SimpleNamespace(eps2=eps2),
        plateau_from=0,
        penalty_raises=[],
    )
    return ProxALServer.diverging(fake)


def test_diverging_needs_a_plateau_of_the_violation():
    n = DIVERGENCE_WINDOW + 1
    # an infeasible model: beta times a constant violation every outer iteration
    assert "infeasible" in _diverging([100.0] * n)
    # a feasible model converging slowly (3% per outer iteration): no verdict
    assert _diverging([100.0 * 0.97**k for k in range(3 * n)]) == ""
    # a slowly converging run that oscillates (factor 3 within the window): no verdict
    assert _diverging([100.0 * (1 + 2 * (k % 2)) for k in range(3 * n)]) == ""
    # too short a history, or below beta * eps2: no verdict
    assert _diverging([100.0] * (n - 1)) == ""
    assert _diverging([1e-5] * n) == ""


def test_an_infeasible_model_ends_quickly_and_centralized_says_infeasible():
    model = fm.Model("infeasible")
    w = model.variable(2, name="w")
    a, b = model.client("a"), model.client("b")
    a.minimize(cp.sum_squares(w))
    a.subject_to(w[0] >= 1)
    b.minimize(cp.sum_squares(w))
    b.subject_to(w[0] <= -1)
    res = model.solve(method="prox-al", max_outer=200, time_limit=60)
    assert res.status == "infeasible" and "Farkas" in res.message
    assert res.rounds["outer"] <= 2 * DIVERGENCE_WINDOW
    assert model.solve(method="centralized").status == "infeasible"


def test_unbounded_needs_the_objective_to_fall_along_the_blow_up():
    model = fm.Model("unbounded")
    w = model.variable(2, name="w")
    model.client("a").minimize(-cp.sum(w))
    res = model.solve(method="prox-al", max_outer=100, divergence_limit=50)
    assert res.status == "unbounded" and "falls from" in res.message


def test_a_blow_up_with_a_finite_optimum_is_no_unbounded_verdict():
    """The iterate passes divergence_limit on its way to the optimum w = 5: the objective
    does not fall by 10 max(1, |f|), so the monitor reports a stall, with the numbers."""
    model = fm.Model("bounded")
    w = model.variable(2, name="w")
    model.client("a").minimize(cp.sum_squares(w - 5))
    res = model.solve(method="prox-al", max_outer=100, divergence_limit=1.0)
    assert res.status == "stalled"
    assert "not evidence that the model is unbounded" in res.message
    assert np.abs(res.solution["w"]).max() <= 1.0  # the last finite iterate is returned


def test_kl_divergence_on_the_simplex_gets_no_false_verdict():
    """Issue 23: KL divergence to client priors with moment constraints on the simplex
    (finite optimum) was reported "unbounded" (the inner solve started at w = 0, where the
    gradient of kl_div is infinite, and returned inf)."""
    rng = np.random.default_rng(0)
    d = 4
    values = np.arange(d, dtype=float)
    model = fm.Model("kl")
    w = model.variable(d, name="w")
    model.server.subject_to([w >= 0, cp.sum(w) == 1])
    W, pooled = cp.Variable(d), 0
    cons = [W >= 0, cp.sum(W) == 1]
    for k in range(3):
        prior = rng.dirichlet(np.ones(d))
        c = model.client(f"c{k}")
        c.minimize(cp.sum(cp.kl_div(w, c.data(prior, name="prior"))))
        c.subject_to(c.data(values, name="v") @ w >= values @ prior - 0.3)
        pooled = pooled + cp.sum(cp.kl_div(W, prior))
        cons.append(values @ W >= values @ prior - 0.3)
    ref = cp.Problem(cp.Minimize(pooled), cons)
    ref.solve(solver="CLARABEL")
    res = model.solve(method="prox-al", max_outer=30, time_limit=4)
    assert res.status not in FALSE_VERDICTS, res.message
    if res.status == "optimal":
        assert res.objective == pytest.approx(ref.value, rel=1e-2)
