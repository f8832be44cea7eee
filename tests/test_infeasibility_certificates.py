"""prox-al and cprox-al certify infeasible and unbounded convex models
(:mod:`fedmodel.certificate.infeasibility`): the right status with a checked certificate
in at most 200 rounds on models of different classes, plain cvxpy agreeing on the pooled
problem, and a Farkas radius that never passes a feasible point."""

from __future__ import annotations

import os
import sys

import cvxpy as cp
import numpy as np
import pytest

import fedmodel as fm
from fedmodel.certificate.infeasibility import (
    farkas_point,
    farkas_radius,
    farkas_report,
    ray_verdict,
)
from fedmodel.compiler.regularizer import Regularizer, VariablePiece

ROUNDS = 200
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from problems import random_two_balls  # noqa: E402


def _data(seed: int, rows: int = 12, d: int = 3):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(rows, d))
    return X, X @ np.array([0.8, -0.5, 0.3])[:d] + 0.3 * rng.normal(size=rows)


def _two_balls():
    """Two clients' norm balls that do not meet (least squares objective)."""
    m = fm.Model("balls")
    w = m.variable(3, name="w")
    for k, c in enumerate([2.0, -2.0]):
        X, y = _data(k)
        client = m.client(f"c{k}")
        client.minimize(cp.sum_squares(X @ w - y) / 12)
        client.subject_to(cp.norm(w - c, 2) <= 1.0)
    return m


def _halfspaces():
    """Linear constraints of two clients: w0 >= 1 and w0 <= -1."""
    m = fm.Model("halfspaces")
    w = m.variable(2, name="w")
    a, b = m.client("a"), m.client("b")
    a.minimize(cp.sum_squares(w))
    a.subject_to(w[0] >= 1)
    b.minimize(cp.sum_squares(w))
    b.subject_to(w[0] <= -1)
    return m


def _l1_ball_vs_bound():
    """An l1 ball (epigraph pieces) against a bound; LAD objective."""
    m = fm.Model("l1")
    w = m.variable(3, name="w")
    for k in range(2):
        X, y = _data(k)
        client = m.client(f"c{k}")
        client.minimize(cp.sum(cp.abs(X @ w - y)) / 24)
        client.subject_to(cp.norm1(w) <= 0.5 if k == 0 else w[0] >= 1)
    return m


def _log_sum_exp_vs_linear():
    """A log_sum_exp constraint of a client against a server constraint."""
    m = fm.Model("lse")
    w = m.variable(3, name="w")
    for k in range(2):
        X, y = _data(k)
        client = m.client(f"c{k}")
        client.minimize(cp.sum_squares(X @ w - y) / 24)
        if k == 0:
            client.subject_to(cp.log_sum_exp(w) <= 0)
    m.server.subject_to(cp.sum(w) >= 3)
    return m


def _hinge_ball_vs_bound():
    """Hinge loss; the server's 2-norm ball against a client's bound."""
    m = fm.Model("hinge")
    w = m.variable(3, name="w")
    for k in range(2):
        X, y = _data(k)
        client = m.client(f"c{k}")
        client.minimize(cp.sum(cp.pos(1 - cp.multiply(np.sign(y), X @ w))) / 24)
        if k == 1:
            client.subject_to(w[0] >= 2)
    m.server.subject_to(cp.norm(w, 2) <= 1)
    return m


def _long_short():
    """A long-short LP: expected return over a budget sum(w) == 1, short positions allowed."""
    rng = np.random.default_rng(0)
    d = 6
    m = fm.Model("long-short")
    w = m.variable(d, name="w")
    for k in range(2):
        R = rng.normal(0.01, 0.02, size=(20, d)) + 0.01 * np.arange(d)
        m.client(f"c{k}").minimize(-cp.sum(R @ w) / 20)
    m.server.subject_to(cp.sum(w) == 1)
    return m


def _weak_l1():
    """A linear term that an l1 regulariser in h does not outweigh."""
    m = fm.Model("weak-l1")
    w = m.variable(3, name="w")
    for k in range(2):
        X, y = _data(k)
        m.client(f"c{k}").minimize(cp.sum_squares(X[:, :2] @ w[:2] - y) / 24 - w[2])
    m.regularize(0.1 * cp.norm1(w))
    return m


def _qp_halfspaces():
    """A QP with a singular Hessian and a linear term, inequality constraints of two clients."""
    m = fm.Model("qp")
    w = m.variable(2, name="w")
    a, b = m.client("a"), m.client("b")
    a.minimize(cp.sum_squares(w[0] - w[1] - 1))
    a.subject_to(w[0] + w[1] >= 0)
    b.minimize(-0.5 * (w[0] + w[1]))
    b.subject_to(w[0] - w[1] <= 3)
    return m


def _owned_block():
    """The recession direction lies in a client's own variables."""
    m = fm.Model("owned")
    w = m.variable(2, name="w")
    a = m.client("a")
    theta = a.variable(2, name="theta")
    X, y = _data(0, d=2)
    a.minimize(cp.sum_squares(X @ w - y) / 12 - cp.sum(theta))
    a.subject_to([theta >= 0, theta[0] - theta[1] <= 1])
    m.client("b").minimize(cp.sum_squares(w))
    return m


def _hinge_minus_linear():
    """A hinge loss (epigraph form) minus a linear term."""
    m = fm.Model("hinge-linear")
    w = m.variable(3, name="w")
    for k in range(2):
        X, y = _data(k)
        loss = cp.sum(cp.pos(1 - cp.multiply(np.sign(y), X @ w))) / 24
        m.client(f"c{k}").minimize(loss - 2 * w[0])
    return m


INFEASIBLE = {
    "two norm balls": _two_balls,
    "halfspaces": _halfspaces,
    "l1 ball vs bound": _l1_ball_vs_bound,
    "log_sum_exp vs linear": _log_sum_exp_vs_linear,
    "hinge, ball vs bound": _hinge_ball_vs_bound,
}
UNBOUNDED = {
    "long-short LP": _long_short,
    "l1 in h": _weak_l1,
    "QP with halfspaces": _qp_halfspaces,
    "own variables": _owned_block,
    "hinge minus linear": _hinge_minus_linear,
}


def _rounds(res, method: str) -> int:
    return res.rounds["communication"] if method == "prox-al" else res.rounds["outer"]


@pytest.mark.parametrize("method", ["prox-al", "cprox-al"])
@pytest.mark.parametrize("name", list(INFEASIBLE))
def test_an_infeasible_model_is_certified_infeasible(name, method):
    model = INFEASIBLE[name]()
    res = model.solve(method=method, time_limit=60)
    assert res.status == "infeasible" and "Farkas" in res.message, res.message
    certificate = res.extra["certificate"]
    assert certificate["kind"] == "farkas" and certificate["intercept"] > 0
    eps1 = np.ravel(res.options["eps"])[0]
    assert certificate["radius"] >= certificate["needed"] >= 1.0 / np.sqrt(eps1)
    assert _rounds(res, method) <= ROUNDS
    assert res.max_violation > 0.1
    assert model.solve(method="centralized").status == "infeasible"  # (Clarabel agrees)


#: rounds of a certificate under partial participation (half the clients a round)
SAMPLED_ROUNDS = 500


@pytest.mark.parametrize("name", list(INFEASIBLE))
def test_an_infeasible_model_is_certified_infeasible_under_sampling(name):
    """exact-admm's sampled rounds (``participation``) try the Farkas certificate as its
    full rounds do, once the primal residual has settled over windows counted in epochs."""
    res = INFEASIBLE[name]().solve(
        method="prox-al", time_limit=60, participation=0.5, random_state=0
    )
    assert res.status == "infeasible" and "Farkas" in res.message, res.message
    certificate = res.extra["certificate"]
    assert certificate["kind"] == "farkas" and certificate["intercept"] > 0
    assert certificate["radius"] >= certificate["needed"]
    assert res.rounds["communication"] <= SAMPLED_ROUNDS


@pytest.mark.parametrize("method", ["prox-al", "cprox-al"])
@pytest.mark.parametrize("name", list(UNBOUNDED))
def test_an_unbounded_model_is_certified_unbounded(name, method):
    model = UNBOUNDED[name]()
    res = model.solve(method=method, time_limit=60)
    assert res.status == "unbounded" and "falls" in res.message, res.message
    certificate = res.extra["certificate"]
    F = np.asarray(certificate["objective"], dtype=float)
    eps2 = np.ravel(res.options["eps"])[-1]
    assert certificate["kind"] == "ray" and np.max(certificate["violation"]) <= eps2
    assert F[0] - F[1] > 10 * max(1.0, abs(F[0])) and F[1] - F[2] >= 0.5 * (F[0] - F[1])
    assert _rounds(res, method) <= ROUNDS
    assert model.solve(method="centralized").status == "unbounded"


@pytest.mark.parametrize("method", ["prox-al", "cprox-al"])
@pytest.mark.parametrize("seed", [0, 3, 18, 22])
def test_random_disjoint_balls_are_certified_infeasible(seed, method):
    """Random two-ball models (least squares on even seeds through exact-admm, logistic on
    odd ones through a Newton-type route; seeds 3, 18 and 22 need the Farkas point's
    extrapolation): "infeasible" with a checked certificate within the round budget."""
    res = random_two_balls(seed).solve(method=method, time_limit=60)
    assert res.status == "infeasible" and "Farkas" in res.message, res.message
    certificate = res.extra["certificate"]
    assert certificate["radius"] >= certificate["needed"] and certificate["intercept"] > 0
    assert _rounds(res, method) <= ROUNDS


def test_the_farkas_point_removes_the_one_over_m_term():
    """Iterates ``x* + a / M_k`` with multipliers growing by ``s`` a step: the
    extrapolation from the last two gives ``x*``; without a step, the iterate."""
    x_star, a, steps = np.array([1.0, -2.0]), np.array([3.0, 0.5]), [4.0, 2.0, 2.0, 2.0]
    M = np.cumsum(steps)
    x_prev, x_now = x_star + a / M[-2], x_star + a / M[-1]
    np.testing.assert_allclose(farkas_point(x_now, x_now - x_prev, steps), x_star, atol=1e-12)
    assert farkas_point(x_now, None, steps) is x_now


def test_the_certificate_rounds_are_declared_and_send_o_d_floats():
    """The farkas round's reply: two vectors of d floats (the multipliers' and their
    change's) and six scalars, in the ledger on the diagnostic channel."""
    model = _two_balls()
    res = model.solve(method="prox-al", time_limit=60)
    rows = [r for r in res.ledger if r["kind"] == "farkas_reply"]
    assert rows and all(r["channel"] == "diagnostic" for r in rows)
    assert {r["floats"] for r in rows} == {2 * 3 + 6}
    summary = model.summary(method="prox-al", print_=False)
    assert "farkas" in summary and "ray" in summary


def test_a_farkas_radius_never_reaches_a_feasible_point():
    """Soundness: on random feasible systems ``A x <= b`` split over three parties, random
    multipliers at random points never prove a radius beyond a feasible point's norm."""
    rng = np.random.default_rng(3)
    for _ in range(40):
        d = 4
        m = fm.Model("feasible")
        w = m.variable(d, name="w")
        x_star = rng.normal(size=d)
        for k in range(3):
            A = rng.normal(size=(3, d))
            b = A @ x_star + rng.uniform(0, 1, size=3)
            _ = m.client(f"c{k}").subject_to(A @ w <= b)
        compiled = m.compile()
        reports = [
            farkas_report(p, rng.normal(size=d), rng.exponential(size=p.m_ineq), np.zeros(0))
            for p in compiled.clients
        ]
        radius, _ = farkas_radius(reports, compiled.regularizer)
        assert radius < np.abs(x_star).max()


def test_the_domain_of_h_enters_the_farkas_radius():
    """``w <= 1`` in h's box and the constraint ``w >= 2`` (multiplier 1 at w = 0): the
    affine minorant ``2 - w`` is positive on the whole box, so the proof is outright; without
    the box it holds only within ``|w| < 2``."""
    report = {"y": np.array([-1.0]), "b": 2.0, "rho": 0.0, "size": 2.0}
    box = Regularizer.from_pieces([slice(0, 1)], [VariablePiece(upper=1.0, has_box=True)])
    assert farkas_radius([report], box)[0] == np.inf
    radius = farkas_radius([report], Regularizer())[0]
    assert 1.99 < radius < 2.0


def test_the_ray_verdict_needs_a_feasible_fall_that_does_not_slow():
    assert ray_verdict([0.0, -100.0, -200.0], [0.0, 0.0, 0.0], 1e-3)
    assert not ray_verdict([0.0, -100.0, -120.0], [0.0, 0.0, 0.0], 1e-3)  # slowing down
    assert not ray_verdict([0.0, -100.0, -200.0], [0.0, 0.1, 0.2], 1e-3)  # infeasible
    assert not ray_verdict([50.0, -100.0, -250.0], [0.0, 0.0, 0.0], 1e-3)  # too small a fall
