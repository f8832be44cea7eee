"""Seed 002 in the DSL: ``client.publish``, ``fm.deo``, the recogniser and the dispatch of
``model.solve`` on a vertical model; ownership errors name the party and the term."""

from __future__ import annotations

import cvxpy as cp
import numpy as np
import pytest

import fedmodel as fm
from fedmodel.algorithms.vfl.problem import ScoreFunctions, VerticalProblem
from fedmodel.algorithms.vfl.recognize import recognize
from fedmodel.algorithms.vfl.run import solve_vertical


def data(n=240, m=10, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, m))
    X[:, -1] = 1.0
    group = rng.random(n) < 0.45
    y_pm1 = np.where(
        X[:, 0] - 0.7 * X[:, 1] + 1.2 * group - 0.3 + 0.6 * rng.normal(size=n) > 0, 1.0, -1.0
    )
    return X, y_pm1, group


def issue_example(X, y_pm1, group, blocks, eps=0.01):
    """The issue's example, verbatim up to the data."""
    n = X.shape[0]
    model = fm.Model("fair-vfl")
    scores = 0
    for k, cols in enumerate(blocks):
        bank = model.client(f"party{k}")
        theta = bank.variable(len(cols), name=f"theta{k}")  # owned, never leaves
        scores = scores + bank.publish(bank.data(X[:, cols]) @ theta, name="partial scores")
        bank.minimize(cp.sum_squares(theta) / n)  # h_k
    y, s = model.server.data(y_pm1), model.server.data(group)  # labels, groups
    model.server.minimize(cp.sum(cp.logistic(-cp.multiply(y, scores))) / n)
    model.server.subject_to(cp.abs(fm.deo(scores, y, s)) <= eps, allow_nonconvex=True)
    return model


BLOCKS = [[0, 1, 2], [3, 4, 5, 6], [7, 8, 9]]


def test_issue_example_solves_with_fair_vfl_like_the_family_directly():
    X, y, g = data()
    model = issue_example(X, y, g, BLOCKS, eps=0.05)
    res = model.solve(method="fair-vfl", Q=4, eta=2.0, max_rounds=200)
    prob = VerticalProblem([X[:, c] for c in BLOCKS], y, g, ["party0", "party1", "party2"])
    direct = solve_vertical(prob, "fair-vfl", eps=0.05, Q=4, eta=2.0, max_rounds=200)
    np.testing.assert_array_equal(res.x, direct.x)
    np.testing.assert_array_equal(res.extra["lambda"], direct.extra["lambda"])
    assert res.extra["train"]["deo_loss"] <= 0.05 + 5e-3
    # the blocks land in the owned variables' .value, as for every DSL solve
    theta0 = model.clients[0].owned_variables[0]
    np.testing.assert_array_equal(theta0.value, res.solution["theta0"])
    assert list(res.solution) == ["theta0", "theta1", "theta2"]
    # fedbcd, and the certified reference under both pooled names
    bcd = model.solve(method="fedbcd", Q=4, eta=2.0, max_rounds=50)
    assert bcd.multipliers == {}
    for name in ("centralized", "cprox-al"):
        ref = model.solve(method=name)
        assert ref.status == "optimal" and ref.method == name
        assert abs(ref.extra["train"]["deo_gap"]) <= 0.05 + 1e-7


def test_recogniser_reads_the_papers_model():
    X, y, g = data()
    model = issue_example(X, y, g, BLOCKS, eps=0.02)
    problem, eps = recognize(model)
    assert eps == 0.02 and problem.party_names == ["party0", "party1", "party2"]
    assert problem.l2 == pytest.approx(1 / X.shape[0], rel=1e-12)
    for b, c in zip(problem.blocks, BLOCKS):
        np.testing.assert_array_equal(b, X[:, c])
    np.testing.assert_array_equal(problem.y, y)
    np.testing.assert_array_equal(problem.group_a, g)
    text = model.summary(print_=False)
    assert "publishes 'partial scores' (240,) (sent to the server)" in text
    assert "fair-vfl round" in text and "admm round" not in text


def test_the_deo_constraint_as_two_inequalities():
    X, y, g = data()
    n = X.shape[0]
    model = fm.Model("two-sided")
    scores = 0
    for k, cols in enumerate(BLOCKS):
        p = model.client(f"party{k}")
        th = p.variable(len(cols), name=f"theta{k}")
        scores = scores + p.publish(p.data(X[:, cols]) @ th, name="partial scores")
        p.minimize(cp.sum_squares(th) / n)
    yh, sh = model.server.data(y), model.server.data(g)
    model.server.minimize(cp.sum(cp.logistic(-cp.multiply(yh, scores))) / n)
    d = fm.deo(scores, yh, sh)
    model.server.subject_to([d <= 0.04, d >= -0.04], allow_nonconvex=True)
    problem, eps = recognize(model)
    assert eps == 0.04
    model.server.subject_to(d <= 0.5, allow_nonconvex=True)  # no longer one |D| <= eps
    with pytest.raises(fm.UnsupportedError, match=r"\[server\].*not one symmetric bound"):
        recognize(model)


def test_the_builder_is_the_dsl_model():
    X, y, g = data()
    vm = fm.models.fair_vfl(X, (y > 0).astype(int), g, blocks=[4, 3, 3], eps=0.03)
    assert isinstance(vm.dsl, fm.Model) and vm.dsl.publications
    problem, eps = recognize(vm.dsl)
    assert eps == 0.03 and problem.sizes == vm.problem.sizes == [4, 3, 3]
    a = vm.solve(method="fair-vfl", Q=2, eta=2.0, max_rounds=20)
    b = vm.dsl.solve(method="fair-vfl", Q=2, eta=2.0, max_rounds=20)
    np.testing.assert_array_equal(a.x, b.x)


def test_deo_is_definition_1():
    X, y, g = data()
    z = cp.Variable(X.shape[0])
    d = fm.deo(z, y, g)
    z.value = np.random.default_rng(3).normal(size=X.shape[0])
    assert float(d.value) == pytest.approx(ScoreFunctions(y, g).deo_gap(z.value), rel=1e-12)
    assert not d.is_convex()  # weights of both signs: a constraint on it is non-convex
    with pytest.raises(fm.ModelError, match="-1/\\+1"):
        fm.deo(z, (y > 0).astype(float), g)
    with pytest.raises(fm.ModelError, match="N\\^a and N\\^b"):
        fm.deo(z, y, np.zeros_like(g))


def test_only_published_vectors_scores_and_lambda_cross_the_network():
    X, y, g = data()
    model = issue_example(X, y, g, BLOCKS, eps=0.05)
    n = X.shape[0]
    res = model.solve(method="fair-vfl", Q=2, eta=2.0, max_rounds=4, reveal_parameters=False)
    algo = [r for r in res.ledger if r["channel"] == "algorithm"]
    up = [r for r in algo if r["receiver"] == "server"]
    down = [r for r in algo if r["sender"] == "server"]
    assert up and all(r["shapes"] == {"partial_scores": (n,)} for r in up)
    assert down and all(set(r["shapes"]) <= {"scores", "lambda"} for r in down)
    assert all(r["shapes"].get("lambda", (2,)) == (2,) for r in down)
    assert all(r["shapes"].get("scores", (n,)) == (n,) for r in down)
    sizes = {len(c) for c in BLOCKS}
    for r in res.ledger:  # no parameter-sized vector on any channel
        assert all(not (len(s) == 1 and s[0] in sizes) for s in r["shapes"].values()), r
    assert res.x.size == 0


# -- ownership: what the server and a party may touch --------------------------------------------
def test_the_server_may_not_touch_an_unpublished_block():
    X, y, g = data()
    n = X.shape[0]
    model = fm.Model("leaky")
    thetas = []
    for k, cols in enumerate(BLOCKS):
        p = model.client(f"party{k}")
        th = p.variable(len(cols), name=f"theta{k}")
        thetas.append((p, th, cols))
        p.minimize(cp.sum_squares(th) / n)
    p0, th0, c0 = thetas[0]
    p0.publish(p0.data(X[:, c0]) @ th0, name="partial scores")
    model.server.minimize(cp.sum_squares(thetas[1][1]), name="peek")  # not published
    with pytest.raises(fm.OwnershipError) as err:
        model.compile()
    msg = str(err.value)
    assert "[server]" in msg and "'peek' uses variable 'theta1' owned by 'party1'" in msg
    assert "party1.publish" in msg


def test_the_server_may_not_touch_a_partys_data_outside_a_publication():
    X, y, g = data()
    model = fm.Model("leaky data")
    p = model.client("party0")
    th = p.variable(3, name="theta0")
    Xp = p.data(X[:, :3], name="X0")
    z = p.publish(Xp @ th, name="partial scores")
    p.minimize(cp.sum_squares(th))
    model.server.minimize(cp.sum_squares(z) + cp.sum(Xp @ np.ones(3)), name="mixes")
    with pytest.raises(fm.OwnershipError, match=r"\[server\].*'mixes' uses data 'X0' owned by"):
        model.compile()


def test_a_party_that_touches_anothers_block_is_a_clear_error():
    X, y, g = data()
    model = fm.Model("thief")
    a, b = model.client("bank"), model.client("insurer")
    ta, tb = a.variable(3, name="theta_bank"), b.variable(3, name="theta_insurer")
    a.publish(a.data(X[:, :3]) @ ta, name="scores")
    a.minimize(cp.sum_squares(ta))
    b.minimize(cp.sum_squares(ta - tb), name="copies the bank")
    with pytest.raises(fm.OwnershipError) as err:
        model.compile()
    msg = str(err.value)
    assert (
        "[insurer]" in msg and "'copies the bank' uses variable 'theta_bank' owned by 'bank'" in msg
    )
    # ... nor publish it, nor publish another party's data
    with pytest.raises(fm.OwnershipError, match=r"\[insurer\].*'theta_bank' owned by 'bank'"):
        b.publish(b.data(X[:, 3:6]) @ ta, name="stolen")
    Xa = a.data(X[:, 3:6], name="Xa2")
    with pytest.raises(fm.OwnershipError, match=r"\[insurer\].*data 'Xa2' owned by 'bank'"):
        b.publish(Xa @ tb, name="stolen data")
    # ... nor use what another party publishes (it goes to the server only)
    zb = b.publish(b.data(X[:, 3:6], name="Xb") @ tb, name="scores")
    model2_term = cp.sum_squares(zb)
    a.minimize(model2_term, name="reads insurer")
    with pytest.raises(fm.OwnershipError, match=r"\[bank\].*published by 'insurer'"):
        model.compile()


def test_vertical_shapes_the_family_does_not_take_are_named():
    X, y, g = data()
    n = X.shape[0]

    def build(h=None, loss=None, constrain=True):
        model = fm.Model("v")
        scores = 0
        for k, cols in enumerate(BLOCKS):
            p = model.client(f"party{k}")
            th = p.variable(len(cols), name=f"theta{k}")
            scores = scores + p.publish(p.data(X[:, cols]) @ th, name="partial scores")
            p.minimize(h(th) if (h is not None and k == 1) else cp.sum_squares(th) / n)
        yh, sh = model.server.data(y), model.server.data(g)
        model.server.minimize(
            loss(yh, scores) if loss else cp.sum(cp.logistic(-cp.multiply(yh, scores))) / n
        )
        if constrain:
            model.server.subject_to(cp.abs(fm.deo(scores, yh, sh)) <= 0.05, allow_nonconvex=True)
        return model

    with pytest.raises(fm.UnsupportedError, match=r"\[party1\].*not l2 \* cp.sum_squares"):
        build(h=lambda th: cp.sum_squares(th - 1)).solve(method="fair-vfl")
    with pytest.raises(fm.UnsupportedError, match=r"\[server\].*logistic"):
        build(loss=lambda yh, z: cp.sum_squares(z - yh) / n).solve(method="fair-vfl")
    with pytest.raises(fm.UnsupportedError, match=r"\[server\].*no constraint"):
        build(constrain=False).solve(method="fedbcd")
    with pytest.raises(fm.UnsupportedError, match="methods that do: \\('fair-vfl'"):
        build().solve(method="prox-al")
    with pytest.raises(fm.ModelError, match="unknown method"):
        build().solve(method="nope")
