"""Every declaration error names the party, the term and the reason."""

import cvxpy as cp
import numpy as np
import pytest
import scipy.sparse as sp

import fedmodel as fm


def _model():
    model = fm.Model("m")
    w = model.variable(3, name="w")
    return model, w


def test_nonconvex_objective_refused_with_cvxpy_reason():
    model, w = _model()
    site = model.client("site0")
    X = site.data(np.eye(3), name="X")
    with pytest.raises(fm.NonConvexError) as err:
        site.minimize(cp.sum(cp.logistic(X @ w)) - cp.sum_squares(w), name="bad loss")
    msg = str(err.value)
    assert "[site0]" in msg and "bad loss" in msg and "not DCP" in msg
    assert "allow_nonconvex=True" in msg and err.value.party == "site0"


def test_nonconvex_constraint_refused_then_accepted_with_opt_in():
    model, w = _model()
    site = model.client("site0")
    X = site.data(np.eye(3), name="X")
    loss_a = cp.sum(cp.logistic(X[:2] @ w))
    loss_b = cp.sum(cp.logistic(X[2:] @ w))
    with pytest.raises(fm.NonConvexError, match="inequality constraint 'disparity'"):
        site.subject_to(loss_a - loss_b <= 0.1, name="disparity")
    site.subject_to(loss_a - loss_b <= 0.1, name="disparity", allow_nonconvex=True)
    site.minimize(cp.sum_squares(w))
    assert model.compile().nonconvex


def test_nonsmooth_opt_in_refused():
    model, w = _model()
    site = model.client("site0")
    with pytest.raises(fm.NonConvexError, match="not smooth.*abs"):
        site.subject_to(-cp.sum(cp.abs(w)) <= 1, allow_nonconvex=True, name="neg l1")


def test_foreign_data_refused_by_handle_and_by_value():
    model, w = _model()
    a, b = model.client("a"), model.client("b")
    raw = np.arange(9.0).reshape(3, 3)
    Xa = a.data(raw, name="Xa")
    a.minimize(cp.sum_squares(Xa @ w))
    b.minimize(cp.sum_squares(Xa @ w), name="steals")
    with pytest.raises(fm.OwnershipError, match=r"\[b\].*'steals' uses data 'Xa' owned by 'a'"):
        model.compile()
    model2, w2 = _model()
    a2, b2 = model2.client("a"), model2.client("b")
    a2.minimize(cp.sum_squares(a2.data(raw, name="Xa") @ w2))
    b2.minimize(cp.sum_squares(raw @ w2), name="copy")  # a plain copy of a's data
    with pytest.raises(fm.OwnershipError, match="equal to data registered by 'a'"):
        model2.compile()


def test_shape_mismatch_names_party_and_data():
    model, w = _model()
    site = model.client("site0")
    X = site.data(np.ones((4, 5)), name="X")
    with pytest.raises(fm.DataError, match=r"\[site0\] shape mismatch using data 'X'"):
        X @ w


def test_nonscalar_objective_refused():
    model, w = _model()
    with pytest.raises(fm.DataError, match="must be scalar"):
        model.client("c").minimize(w)


@pytest.mark.parametrize("bad,kind", [(np.nan, "NaN"), (np.inf, "inf")])
def test_nan_and_inf_data_refused(bad, kind):
    model, _ = _model()
    X = np.ones((3, 3))
    X[1, 2] = bad
    with pytest.raises(fm.DataError, match=rf"\[site0\] data 'X' contains {kind}.*\(1, 2\)"):
        model.client("site0").data(X, name="X")


def test_dataframe_and_sparse_data():
    pd = pytest.importorskip("pandas")
    model, w = _model()
    site = model.client("site0")
    frame = pd.DataFrame({"a": [1.0, 2.0], "b": [3.0, 4.0], "c": [0.0, 1.0]})
    X = site.data(frame, name="frame")
    S = site.data(sp.random(5, 3, density=0.5, random_state=0), name="S")
    site.minimize(cp.sum_squares(X @ w) + cp.sum_squares(S @ w - 1))
    res = model.solve(method="prox-al", eps=1e-5)
    ref = model.solve(method="centralized")
    assert res.compare(ref).solution_distance < 1e-3
    with pytest.raises(fm.DataError, match="non-numeric columns \\['s'\\]"):
        site.data(pd.DataFrame({"s": ["x", "y"]}), name="strings")


def test_client_without_terms_refused():
    model, w = _model()
    model.client("active").minimize(cp.sum_squares(w - 1))
    model.client("idle")
    with pytest.raises(fm.ModelError, match=r"\[idle\] client 'idle' has no data and no terms"):
        model.compile()
    model2, w2 = _model()
    model2.client("active").minimize(cp.sum_squares(w2 - 1))
    model2.client("holder").data(np.ones(3), name="x")
    with pytest.raises(fm.ModelError, match="has data but no objective terms"):
        model2.compile()


def test_undeclared_variable_and_misc_declaration_errors():
    model, w = _model()
    other = cp.Variable(3, name="rogue")
    with pytest.raises(fm.ModelError, match="uses variable 'rogue'"):
        model.client("c").minimize(cp.sum_squares(other))
    with pytest.raises(fm.ModelError, match="already exists"):
        model.client("c")
        model.client("c")
    with pytest.raises(fm.ModelError, match="reserved"):
        model.client("server")
    with pytest.raises(fm.ModelError, match="plain boolean"):
        model.client("d").subject_to(1 <= 2)
    with pytest.raises(fm.UnsupportedError, match="no simple prox"):
        model.regularize(cp.sum(cp.logistic(w)))
    with pytest.raises(fm.UnsupportedError, match="whole model variable"):
        model.regularize(cp.norm1(w[:2]))
    with pytest.raises(fm.ModelError, match="no variables"):
        empty = fm.Model()
        empty.client("c")
        empty.compile()


def test_nonsmooth_client_term_takes_the_conic_path_and_is_certified():
    """A term with no smooth exact form (a 2-norm in the objective: not differentiable at
    0, no piecewise-linear epigraph) goes to the cvxpy backend in cone form; prox-al and
    centralized both certify it through the conic duals."""
    model, w = _model()
    site = model.client("c")
    site.minimize(cp.sum_squares(w - 1) + cp.norm(w, 2), name="group-lasso-ish")
    # stationarity 2 (w - 1) + w / ||w|| = 0 along the ones direction
    expected = (1 - 0.5 / np.sqrt(3)) * np.ones(3)
    for method in ("prox-al", "centralized"):
        res = model.solve(method=method, eps=1e-6)
        assert res.status == "optimal" and res.kkt.satisfied(1e-6, 1e-6), (method, res.message)
        assert res.extra["conic_parties"] == ["c"]
        np.testing.assert_allclose(res.solution["w"], expected, atol=1e-5)


def test_a_cone_the_certificate_cannot_measure_names_party_and_term():
    model, w = _model()
    with pytest.raises(fm.UnsupportedError, match=r"\[c\] term 'gm'.*PowConeND"):
        model.client("c").minimize(-cp.geo_mean(w + 2, approx=False), name="gm")


def test_piecewise_linear_client_term_is_solved_through_its_epigraph():
    """l1 in a client's objective: rewritten exactly into the party's own epigraph
    variables, solved by a gradient method and certified."""
    model, w = _model()
    site = model.client("c")
    site.minimize(cp.sum_squares(w - 1) + cp.norm1(w), name="lasso-ish")
    res = model.solve(method="cprox-al", eps=1e-8)
    assert res.status == "optimal" and res.kkt.satisfied(1e-8, 1e-8)
    np.testing.assert_allclose(res.solution["w"], 0.5 * np.ones(3), atol=1e-6)
    assert list(res.solution) == ["w"] and list(res.extra["auxiliary"]) == ["c.abs0"]


def test_a_data_name_that_is_not_a_string_is_refused_naming_the_party():
    model, _ = _model()
    site = model.client("site0")
    with pytest.raises(fm.DataError, match=r"\[site0\] a data name is a string, got ndarray"):
        site.data("X", np.eye(3))  # (the arguments swapped)
    assert site.data(np.eye(3), name="X").data_name == "X"
