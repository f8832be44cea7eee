"""Duals on the user's constraints, as cvxpy: ``subject_to`` returns the constraints, and
after a solve each carries ``dual_value`` in cvxpy's shape and sign convention, equal to
plain cvxpy's on the pooled problem within what ``eps`` allows."""

from __future__ import annotations

import cvxpy as cp
import numpy as np
import pytest

import fedmodel as fm

D = 6
RNG = np.random.default_rng(3)
A = [RNG.normal(size=(30, D)) for _ in range(3)]
B = [a @ np.array([1.5, -1.0, 0.8, 2.0, -0.5, 1.2]) + 0.1 * RNG.normal(size=30) for a in A]
#: (norm1 budget, ball radius): active norm1 and cone constraints; active ball and cone
BUDGETS = {"norm1": (3.5, 2.2), "ball": (4.5, 1.9)}


def constraints(x, budgets):
    """(holder, constraint) by key: 0, 1, 2 a client, else the server. One of each form:
    linear, a split max-type (norm_inf), an equality, an epigraph form (norm1), a cone form
    (a 2-norm below an affine side), a ball (sum_squares form) and a vector inequality."""
    budget, radius = BUDGETS[budgets]
    return {
        "linear": (0, x[0] + x[1] <= 0.3),
        "norm_inf": (1, cp.norm_inf(x[2:4]) <= 0.9),
        "equality": (2, x[4] - x[5] == -1.0),
        "vector": (2, x >= -3),
        "norm1": ("server", cp.norm1(x) <= budget),
        "soc": ("server", cp.norm(x[:2] - 1, 2) <= x[5] + 0.6),
        "ball": ("server", cp.norm(x, 2) <= radius),
    }


def reference(budgets):
    x = cp.Variable(D)
    cons = constraints(x, budgets)
    loss = sum(cp.sum_squares(a @ x - b) for a, b in zip(A, B)) / 90
    prob = cp.Problem(cp.Minimize(loss), [c for _, c in cons.values()])
    prob.solve(solver="CLARABEL")
    assert prob.status == "optimal"
    return {k: np.asarray(c.dual_value) for k, (_, c) in cons.items()}


def federated_model(budgets):
    model = fm.Model("duals")
    w = model.variable(D, name="w")
    sites = [model.client(f"site{k}") for k in range(3)]
    for k, site in enumerate(sites):
        a, b = site.data(A[k], name="A"), site.data(B[k], name="b")
        site.minimize(cp.sum_squares(a @ w - b) / 90)
    mine = {}
    for key, (who, c) in constraints(w, budgets).items():
        party = model.server if who == "server" else sites[who]
        mine[key] = (party.name, party.subject_to(c, name=key))
        assert mine[key][1] is c  # subject_to returns what it was given
    return model, mine


@pytest.mark.parametrize(
    "method, eps, budgets",
    [
        ("centralized", 1e-8, "norm1"),
        ("cprox-al", 1e-6, "norm1"),
        ("prox-al", 1e-6, "norm1"),
        ("centralized", 1e-8, "ball"),
        ("prox-al", 1e-6, "ball"),
    ],
)
def test_duals_equal_cvxpys_on_the_pooled_problem(method, eps, budgets):
    ref = reference(budgets)
    model, mine = federated_model(budgets)
    res = model.solve(method=method, eps=eps)
    assert res.status == "optimal"
    active = {k for k, v in ref.items() if float(np.abs(v).max()) > 1e-2}
    assert {"linear", "norm_inf", "equality", "soc", budgets} <= active
    for key, (party, con) in mine.items():
        want = ref[key]
        got = con.dual_value
        assert np.shape(got) == want.shape, key
        # the duals of a certified point are exact to ~sqrt(eps) (complementarity)
        np.testing.assert_allclose(got, want, atol=30 * np.sqrt(eps), err_msg=key)
        np.testing.assert_array_equal(res.multipliers[party][key], got)
    # internals stay apart: only the user's constraints are keyed in res.multipliers
    labels = {label for duals in res.multipliers.values() for label in duals}
    assert labels == set(mine)
    assert any(":cone[" in lab for m in res.program_multipliers.values() for lab in m)


def test_a_list_passed_to_subject_to_comes_back_with_its_duals():
    model = fm.Model()
    w = model.variable(2)
    site = model.client("a")
    site.minimize(cp.sum_squares(w - 2))
    both = site.subject_to([cp.sum(w) <= 2, w[0] == w[1]])
    assert isinstance(both, list) and len(both) == 2
    model.solve(method="centralized")
    assert float(both[0].dual_value) == pytest.approx(2.0, abs=1e-6)
    assert float(both[1].dual_value) == pytest.approx(0.0, abs=1e-6)


def test_a_method_without_a_dual_for_a_constraint_leaves_none():
    """admm takes the server's bounds into h: it has no multiplier for them, and the
    dual_value of an earlier solve does not survive."""
    model = fm.Model()
    w = model.variable(2)
    site = model.client("a")
    site.minimize(cp.sum_squares(w - 2))
    bound = model.server.subject_to(w <= 1)
    model.solve(method="centralized")
    np.testing.assert_allclose(bound.dual_value, [2.0, 2.0], atol=1e-6)
    res = model.solve(method="admm")
    assert res.status == "optimal" and bound.dual_value is None
