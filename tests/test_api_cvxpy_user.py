"""What a cvxpy user expects of the DSL: variable attributes and maximize."""

import cvxpy as cp
import numpy as np
import pytest

import fedmodel as fm
from fedmodel.errors import ModelError, NonConvexError


def _least_squares(model, w, concave=False):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(20, 3))
    y = X @ np.array([1.0, -2.0, 0.5])
    site = model.client("site0")
    A, b = site.data(X, name="X"), site.data(y, name="y")
    if concave:
        site.maximize(-cp.sum_squares(A @ w - b))
    else:
        site.minimize(cp.sum_squares(A @ w - b))
    return X, y


def test_nonneg_variable_is_a_box_in_h_and_matches_cvxpy():
    model = fm.Model()
    w = model.variable(3, name="w", nonneg=True)
    X, y = _least_squares(model, w)
    res = model.solve(method="centralized")
    ref = cp.Variable(3, nonneg=True)
    cp.Problem(cp.Minimize(cp.sum_squares(X @ ref - y))).solve()
    assert res.status == "optimal"
    assert np.abs(res.x - ref.value).max() < 1e-5
    assert res.x.min() >= -1e-9  # the bound is active at the optimum (w[1] = 0)
    assert abs(res.x[1]) < 1e-6


def test_bounds_and_nonpos_become_boxes():
    model = fm.Model()
    w = model.variable(3, name="w", bounds=(-0.25, np.array([0.5, 2.0, 0.1])))
    X, y = _least_squares(model, w)
    res = model.solve(method="centralized")
    ref = cp.Variable(3)
    cp.Problem(
        cp.Minimize(cp.sum_squares(X @ ref - y)), [ref >= -0.25, ref <= [0.5, 2.0, 0.1]]
    ).solve()
    assert np.abs(res.x - ref.value).max() < 1e-5
    model2 = fm.Model()
    v = model2.variable(2, nonpos=True)
    assert len(model2._regularizers) == 1 and v.shape == (2,)


def test_other_variable_attributes_are_refused_by_name():
    model = fm.Model()
    with pytest.raises(ModelError, match="integer"):
        model.variable(2, integer=True)
    with pytest.raises(ModelError, match="fix w = 0"):
        model.variable(2, nonneg=True, nonpos=True)


def test_maximize_a_concave_utility_equals_minimizing_its_negative():
    model = fm.Model()
    w = model.variable(3, name="w")
    _least_squares(model, w, concave=True)
    other = fm.Model()
    v = other.variable(3, name="w")
    _least_squares(other, v)
    a, b = model.solve(method="centralized"), other.solve(method="centralized")
    assert np.abs(a.x - b.x).max() < 1e-7
    assert abs(a.objective - b.objective) < 1e-7


def test_maximize_refuses_a_convex_term_and_a_constraint():
    model = fm.Model()
    w = model.variable(2, name="w")
    site = model.client("site0")
    with pytest.raises(NonConvexError, match="not DCP-concave"):
        site.maximize(cp.sum_squares(w))
    with pytest.raises(ModelError, match="not a constraint"):
        site.maximize(w >= 0)


def test_runtime_options_refuse_a_bad_time_limit_and_a_checkpoint_file(tmp_path):
    model = fm.Model()
    w = model.variable(3, name="w")
    _least_squares(model, w)
    for bad in (-1, 0, float("nan"), True, "10"):
        with pytest.raises(ModelError, match="time_limit must be a positive number"):
            model.solve(method="prox-al", time_limit=bad)
    f = tmp_path / "not-a-directory"
    f.write_text("x")
    with pytest.raises(ModelError, match="is a file; checkpoint= names a directory"):
        model.solve(method="prox-al", checkpoint=f)
    with pytest.raises(ModelError, match="retries must be an integer >= 0"):
        model.solve(method="prox-al", retries=1.5)


def test_a_run_that_converges_before_checkpoint_every_still_writes_one(tmp_path):
    model = fm.Model()
    w = model.variable(3, name="w")
    X, y = _least_squares(model, w)
    run = tmp_path / "run1"
    first = model.solve(method="prox-al", checkpoint=run, checkpoint_every=1000)
    assert first.status == "optimal" and first.rounds["outer"] < 1000
    assert (run / "manifest.json").exists()
    again = model.solve(method="prox-al", resume=run)
    assert again.status == "optimal"
    # both points within what their certificates allow of the least-squares solution:
    # ||x - x*||_2 <= ||grad f(x)||_2 / lambda_min(2 X^T X), ||grad||_2 <= sqrt(d) ||grad||_inf
    x_star = np.linalg.lstsq(X, y, rcond=None)[0]
    lam = np.linalg.eigvalsh(2 * X.T @ X)[0]
    for res in (first, again):
        bound = np.sqrt(3) * res.kkt.stationarity / lam
        assert np.linalg.norm(res.x - x_star) <= bound


def test_pooled_results_say_they_sent_nothing_and_ledger_frame_names_pandas(monkeypatch):
    import builtins

    model = fm.Model()
    w = model.variable(3, name="w")
    _least_squares(model, w)
    assert model.solve(method="centralized").rounds["communication"] == 0
    res = model.solve(method="prox-al")
    assert res.rounds["communication"] > 0
    real_import = builtins.__import__

    def no_pandas(name, *args, **kwargs):
        if name == "pandas":
            raise ModuleNotFoundError("No module named 'pandas'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_pandas)
    with pytest.raises(ModuleNotFoundError, match="ledger_table"):
        res.ledger_frame()


def test_prox_al_refuses_a_fractional_iteration_cap_and_a_string_tolerance():
    model = fm.Model()
    w = model.variable(3, name="w")
    _least_squares(model, w)
    with pytest.raises(ModelError, match="max_outer must be an integer >= 1, got 2.5"):
        model.solve(method="prox-al", max_outer=2.5)
    with pytest.raises(ModelError, match="eps must be a float or a pair of floats"):
        model.solve(method="prox-al", eps="1e-3")


def test_prox_al_names_the_first_client_whose_rho_is_not_positive():
    model = fm.Model()
    w = model.variable(3, name="w")
    for name in ("a", "b", "c"):
        model.client(name).minimize(cp.sum_squares(w - 1.0))
    bad = {"a": 1.0, "b": float("nan"), "c": -1.0}
    with pytest.raises(ModelError, match="rho for client 'b' must be a positive number, got nan"):
        model.solve(method="prox-al", rho=bad)
    with pytest.raises(ModelError, match="rho for client 'c' must be a positive number, got -1"):
        model.solve(method="prox-al", rho={**bad, "b": 1.0})
    with pytest.raises(ModelError, match="rho for client 'b' must be a positive number, got 0.0"):
        model.solve(method="prox-al", rho=[1.0, 0.0, 0.0])


def test_a_checkpoint_directory_that_cannot_be_written_costs_the_checkpoint_not_the_run(
    tmp_path,
):
    model = fm.Model()
    w = model.variable(3, name="w")
    _least_squares(model, w)
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    res = model.solve(method="prox-al", checkpoint=blocker / "ck", checkpoint_every=1)
    assert res.status == "optimal"
    assert res.checkpoint is None
    assert "checkpoint could not be written" in res.message


def test_variable_bounds_with_infinite_entries_leave_those_sides_free():
    # as in cvxpy: -inf / inf entries of bounds= are no bound on that coordinate
    lo, hi = np.array([0.0, -np.inf, -1.0]), np.array([np.inf, 0.5, 1.0])
    model = fm.Model()
    w = model.variable(3, name="w", bounds=(lo, hi))
    model.client("c").minimize(cp.sum_squares(w - np.array([-2.0, 2.0, 3.0])))
    res = model.solve(method="prox-al")
    ref = cp.Variable(3, bounds=[lo, hi])
    cp.Problem(cp.Minimize(cp.sum_squares(ref - np.array([-2.0, 2.0, 3.0])))).solve()
    assert res.status == "optimal"
    np.testing.assert_allclose(res.solution["w"], ref.value, atol=1e-3)
    with pytest.raises(ModelError, match="lower bound must be finite or -inf"):
        fm.Model().variable(2, bounds=(np.array([np.inf, 0.0]), None))
