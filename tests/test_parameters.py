"""cvxpy Parameters updatable between solves (cvxpy's DPP idea, across parties).

A ``cp.Parameter`` in a client's term, in a client's constraint bound or in ``h``: solve,
set ``param.value``, solve again without declaring the model again; each solve is checked
against plain cvxpy on the pooled problem with the same value. prox-al at ``eps = 1e-6``
on strongly convex least squares: its certificate bounds the distance to the optimum by
about ``eps`` over the curvature (>= 0.3 here), so the solutions agree to 1e-4 and the
objectives to 1e-5 relative.
"""

from __future__ import annotations

import cvxpy as cp
import numpy as np
import pytest

import fedmodel as fm
from fedmodel.errors import DataError, ModelError
from fedmodel.runtime.checkpoint import CheckpointError

EPS = 1e-6
rng = np.random.default_rng(3)
A = [rng.normal(size=(20, 3)) for _ in range(3)]
B = [rng.normal(size=20) + 3 for _ in range(3)]


def loss(k: int, w, data=None):
    return cp.sum_squares((A[k] if data is None else data) @ w - B[k]) / 60


def pooled(extra_objective=None, constraints=()):
    """Plain cvxpy on the pooled problem: ``(optimal value, x)``."""
    x = cp.Variable(3)
    objective = sum(loss(k, x) for k in range(3))
    if extra_objective is not None:
        objective = objective + extra_objective(x)
    problem = cp.Problem(cp.Minimize(objective), [c(x) for c in constraints])
    problem.solve(solver=cp.CLARABEL)
    return problem.value, x.value


def check_against(res, w, value, x_ref):
    assert res.status == "optimal", res.message
    assert abs(res.objective - value) <= 1e-5 * abs(value)
    np.testing.assert_allclose(w.value, x_ref, atol=1e-4)


def test_parameter_in_a_client_term():
    weight = cp.Parameter(nonneg=True, value=1.0, name="weight")
    model = fm.Model("term")
    w = model.variable(3, name="w")
    for k in range(3):
        site = model.client(f"site{k}")
        site.data(A[k], name="A")
        site.minimize(loss(k, w) + (weight * cp.sum_squares(w) if k == 0 else 0))
    results = []
    for value in (1.0, 0.2):
        weight.value = value
        res = model.solve(method="prox-al", eps=EPS)
        check_against(res, w, *pooled(lambda x, v=value: v * cp.sum_squares(x)))
        results.append(res.objective)
    assert results[0] - results[1] > 1e-2  # the new value was used (pooled: 9.20 -> 9.14)
    # each party's program (what is sent to where it runs) holds only its own parameters
    compiled = model.compile()
    held = {
        prog.name: {
            p.name() for t in prog.objective + prog.constraints for p in t.expr.parameters()
        }
        for prog in compiled.clients
    }
    assert held == {"site0": {"weight"}, "site1": set(), "site2": set()}


def test_parameter_in_client_data():
    data = cp.Parameter((20, 3), value=A[1], name="A1")
    model = fm.Model("data")
    w = model.variable(3, name="w")
    for k in range(3):
        site = model.client(f"site{k}")
        site.data(A[k], name="A")
        site.minimize(loss(k, w, data if k == 1 else None))
    for scale in (1.0, 2.0):
        data.value = scale * A[1]
        res = model.solve(method="prox-al", eps=EPS)
        x = cp.Variable(3)
        problem = cp.Problem(
            cp.Minimize(loss(0, x) + loss(1, x, scale * A[1]) + loss(2, x)),
        )
        problem.solve(solver=cp.CLARABEL)
        check_against(res, w, problem.value, x.value)


def test_parameter_in_a_client_constraint_bound():
    budget = cp.Parameter(nonneg=True, value=0.3, name="budget")
    model = fm.Model("bound")
    w = model.variable(3, name="w")
    for k in range(3):
        site = model.client(f"site{k}")
        site.data(A[k], name="A")
        site.minimize(loss(k, w))
        site.subject_to(cp.sum(w) <= budget)
    for value in (0.3, 0.1):  # unconstrained, sum(w) = 0.42: both bounds are active
        budget.value = value
        res = model.solve(method="prox-al", eps=EPS)
        check_against(res, w, *pooled(constraints=[lambda x, v=value: cp.sum(x) <= v]))
        assert np.sum(w.value) == pytest.approx(value, abs=1e-5)  # the bound is active


def test_parameter_in_a_norm_ball_radius_keeps_its_cone_form():
    # norm(w, 2) <= r becomes sum_squares(w) <= r^2 only for a constant r (its value would
    # be frozen at declaration); with a Parameter the constraint stays a cone
    radius = cp.Parameter(nonneg=True, value=1.0, name="radius")
    model = fm.Model("ball")
    w = model.variable(3, name="w")
    for k in range(3):
        site = model.client(f"site{k}")
        site.data(A[k], name="A")
        site.minimize(loss(k, w))
    model.clients[0].subject_to(cp.norm(w, 2) <= radius)
    for value in (0.3, 0.2):  # the unconstrained solution has norm 0.41: both active
        radius.value = value
        res = model.solve(method="prox-al", eps=EPS)
        ref_value, x_ref = pooled(constraints=[lambda x, v=value: cp.norm(x, 2) <= v])
        assert res.status == "optimal", res.message
        assert abs(res.objective - ref_value) <= 1e-4 * abs(ref_value)
        np.testing.assert_allclose(np.linalg.norm(w.value), value, atol=1e-4)


@pytest.mark.parametrize("form", ["l1", "box"])
def test_parameter_in_h(form):
    p = cp.Parameter(nonneg=True, value=1.0, name="p")
    model = fm.Model("h")
    w = model.variable(3, name="w")
    for k in range(3):
        site = model.client(f"site{k}")
        site.data(A[k], name="A")
        site.minimize(loss(k, w))
    if form == "l1":
        model.regularize(p * cp.norm1(w))
    else:
        model.regularize(w <= p)
    for value in (1.0, 0.3):
        p.value = value
        res = model.solve(method="prox-al", eps=EPS)
        if form == "l1":
            ref = pooled(lambda x, v=value: v * cp.norm1(x))
        else:
            ref = pooled(constraints=[lambda x, v=value: x <= v])
        check_against(res, w, *ref)
        central = model.solve(method="centralized")
        assert abs(central.objective - ref[0]) <= 1e-6 * abs(ref[0])


def test_a_parameter_without_a_value_is_refused_at_the_solve():
    budget = cp.Parameter(nonneg=True, value=1.0, name="budget")
    model = fm.Model("unset")
    w = model.variable(3, name="w")
    site = model.client("site0")
    site.data(A[0], name="A")
    site.minimize(loss(0, w))
    site.subject_to(cp.sum(w) <= budget)
    budget.value = None
    with pytest.raises(DataError, match="parameter 'budget' without a value") as info:
        model.solve(method="prox-al")
    assert info.value.party == "site0"
    weight = cp.Parameter(nonneg=True, name="weight")
    with pytest.raises(ModelError, match="parameter 'weight'.*has no value"):
        model.regularize(weight * cp.norm1(w))


def test_a_negative_parameter_weight_in_h_is_refused_at_the_solve():
    p = cp.Parameter(value=1.0, name="p")
    model = fm.Model("sign")
    w = model.variable(3, name="w")
    site = model.client("site0")
    site.data(A[0], name="A")
    site.minimize(loss(0, w))
    model.regularize(p * cp.norm1(w))
    p.value = -1.0
    with pytest.raises(fm.UnsupportedError, match="negative weight"):
        model.solve(method="prox-al")


@pytest.mark.parametrize("where", ["client", "h"])
def test_resuming_after_a_parameter_changed_is_refused(where, tmp_path):
    p = cp.Parameter(nonneg=True, value=1.0, name="p")
    model = fm.Model("resume")
    w = model.variable(3, name="w")
    for k in range(3):
        site = model.client(f"site{k}")
        site.data(A[k], name="A")
        site.minimize(loss(k, w))
        if where == "client" and k == 2:
            site.subject_to(cp.sum(w) <= p)
    if where == "h":  # (a small weight: with p = 1, w = 0 is optimal and the start point)
        model.regularize(0.01 * p * cp.norm1(w))
    ck = tmp_path / "ck"
    first = model.solve(method="prox-al", eps=EPS, max_outer=2, checkpoint=str(ck))
    assert first.status == "max_iterations"
    # the same value resumes; a changed one is refused, naming what changed
    model.solve(method="prox-al", eps=EPS, max_outer=3, resume=str(ck))
    p.value = 0.5
    match = "site2.*different terms or data" if where == "client" else "different model"
    with pytest.raises(CheckpointError, match=match):
        model.solve(method="prox-al", eps=EPS, max_outer=3, resume=str(ck))


def budget_model(budget, data=None):
    """Three sites, site1's data a Parameter when given, every site bounded by ``budget``."""
    model = fm.Model("resolve")
    w = model.variable(3, name="w")
    for k in range(3):
        site = model.client(f"site{k}")
        site.data(A[k], name="A")
        site.minimize(loss(k, w, data if k == 1 else None))
        site.subject_to(cp.sum(w) <= budget)
    return model, w


def counting(monkeypatch):
    """Count the model partitions and the compiled evaluators of a test's solves."""
    from fedmodel.compiler import partition

    calls = {"partitions": 0, "evaluators": 0}
    compile_model, functions_init = partition.compile_model, partition.PartyFunctions.__init__

    def counted_compile(model):
        calls["partitions"] += 1
        return compile_model(model)

    def counted_functions(self, program):
        calls["evaluators"] += 1
        functions_init(self, program)

    monkeypatch.setattr(partition, "compile_model", counted_compile)
    monkeypatch.setattr(partition.PartyFunctions, "__init__", counted_functions)
    return calls


def test_a_resolve_after_a_parameter_change_does_not_recompile(monkeypatch):
    calls = counting(monkeypatch)
    budget = cp.Parameter(nonneg=True, value=0.3, name="budget")
    model, w = budget_model(budget)
    first = model.solve(method="prox-al", eps=EPS)
    check_against(first, w, *pooled(constraints=[lambda x: cp.sum(x) <= 0.3]))
    after_first = dict(calls)
    assert after_first["partitions"] == 1 and after_first["evaluators"] >= 4
    budget.value = 0.1
    second = model.solve(method="prox-al", eps=EPS)
    check_against(second, w, *pooled(constraints=[lambda x: cp.sum(x) <= 0.1]))
    assert np.sum(w.value) == pytest.approx(0.1, abs=1e-5)
    assert calls == after_first  # neither the partition nor any evaluator was built again
    # the certificate's constant parts follow the new bound (they were computed from it)
    program = model.compile().clients[0]
    np.testing.assert_allclose(program.functions.constant_parts[0], [-0.1])
    # the checks run at every solve of the kept model: an unset value, a negative h weight
    budget.value = None
    with pytest.raises(DataError, match="parameter 'budget' without a value"):
        model.solve(method="prox-al", eps=EPS)
    budget.value = 0.1
    lam = cp.Parameter(value=1.0, name="lam")
    model.regularize(lam * cp.norm1(w))
    model.solve(method="prox-al", eps=EPS, max_outer=1)
    lam.value = -1.0
    with pytest.raises(fm.UnsupportedError, match="negative weight"):
        model.solve(method="prox-al", eps=EPS)
    assert calls["partitions"] == 2  # (the regularize call, not the values)


def test_a_declaration_change_after_a_solve_recompiles(monkeypatch):
    calls = counting(monkeypatch)
    budget = cp.Parameter(nonneg=True, value=1.0, name="budget")
    model, w = budget_model(budget)
    model.solve(method="prox-al", eps=EPS)
    compiled = model.compile()
    assert calls["partitions"] == 1 and model.compile().clients[0] is compiled.clients[0]
    model.clients[2].subject_to(w[0] >= 0.5)  # a new constraint
    res = model.solve(method="prox-al", eps=EPS)
    assert calls["partitions"] == 2
    check_against(res, w, *pooled(constraints=[lambda x: cp.sum(x) <= 1.0, lambda x: x[0] >= 0.5]))
    model.regularize(0.5 * cp.sum_squares(w))  # a new term of h
    res = model.solve(method="prox-al", eps=EPS)
    assert calls["partitions"] == 3
    check_against(
        res,
        w,
        *pooled(
            lambda x: 0.5 * cp.sum_squares(x),
            constraints=[lambda x: cp.sum(x) <= 1.0, lambda x: x[0] >= 0.5],
        ),
    )
    model.client("site3").minimize(cp.sum_squares(w))  # a new party
    assert calls["partitions"] == 3 and len(model.compile().clients) == 4
    assert calls["partitions"] == 4


@pytest.mark.parametrize("backend", ["processes", "ray"])
def test_a_parameter_change_reaches_the_party_on_kept_workers(backend):
    """The processes and Ray backends keep their workers between solves: the second solve
    runs on the workers of the first, and the party holding the parameters (site1's data,
    every site's bound) computes with their new values."""
    budget = cp.Parameter(nonneg=True, value=0.3, name="budget")
    data = cp.Parameter((20, 3), value=A[1], name="A1")
    model, w = budget_model(budget, data)
    for scale, bound in ((1.0, 0.3), (2.0, 0.1)):
        budget.value, data.value = bound, scale * A[1]
        res = model.solve(method="prox-al", eps=EPS, backend=backend, workers=2)
        x = cp.Variable(3)
        problem = cp.Problem(
            cp.Minimize(loss(0, x) + loss(1, x, scale * A[1]) + loss(2, x)),
            [cp.sum(x) <= bound],
        )
        problem.solve(solver=cp.CLARABEL)
        check_against(res, w, problem.value, x.value)
        assert np.sum(w.value) == pytest.approx(bound, abs=1e-5)


def test_a_resolve_keeps_the_evaluators_of_a_party_with_its_own_variables(monkeypatch):
    """A cone-constrained party works on its own view (shared and its own cone variables):
    that view and its evaluators are kept too, and a re-solve at a new radius repeats the
    iterates of a solve compiled anew, bit for bit."""
    calls = counting(monkeypatch)
    radius = cp.Parameter(nonneg=True, value=0.3, name="radius")
    model = fm.Model("ball")
    w = model.variable(3, name="w")
    for k in range(3):
        site = model.client(f"site{k}")
        site.data(A[k], name="A")
        site.minimize(loss(k, w))
    model.clients[0].subject_to(cp.norm(w, 2) <= radius)
    assert model.compile().layout.has_owned
    model.solve(method="prox-al", eps=EPS)
    built = calls["evaluators"]
    radius.value = 0.2
    kept = model.solve(method="prox-al", eps=EPS)
    w_kept = w.value.copy()
    assert calls["evaluators"] == built and calls["partitions"] == 1
    ref_value, _ = pooled(constraints=[lambda x: cp.norm(x, 2) <= 0.2])
    assert kept.status == "optimal", kept.message
    assert abs(kept.objective - ref_value) <= 1e-4 * abs(ref_value)
    model._compiled = None  # compiled anew: the same iterates
    fresh = model.solve(method="prox-al", eps=EPS)
    assert calls["partitions"] == 2 and calls["evaluators"] > built
    assert fresh.objective == kept.objective and fresh.rounds == kept.rounds
    np.testing.assert_array_equal(w.value, w_kept)
