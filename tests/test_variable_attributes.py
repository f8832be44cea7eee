"""Variable attributes as cvxpy takes them: ``PSD=True`` / ``symmetric=True`` as the
equivalent constraints; refusals name the user's own term, never an internal auxiliary."""

from __future__ import annotations

import cvxpy as cp
import numpy as np
import pytest

import fedmodel as fm

RNG = np.random.default_rng(0)
C = RNG.normal(size=(3, 3))
C = C + C.T


@pytest.mark.parametrize("method", ["centralized", "prox-al"])
def test_a_psd_model_variable_solves_as_cvxpy_does(method):
    model = fm.Model()
    S = model.variable((3, 3), name="S", PSD=True)
    site = model.client("a")
    site.minimize(cp.sum_squares(S - site.data(C, name="C")))
    res = model.solve(method=method, eps=1e-6)
    X = cp.Variable((3, 3), PSD=True)
    prob = cp.Problem(cp.Minimize(cp.sum_squares(X - C)))
    prob.solve()
    assert res.status == "optimal"
    assert res.objective == pytest.approx(prob.value, rel=1e-5)
    assert np.linalg.eigvalsh(S.value).min() >= -1e-6
    np.testing.assert_allclose(S.value, S.value.T, atol=1e-8)
    # the attribute's constraints are internal: no dual of the user's, labelled by it
    assert res.multipliers["server"] == {}
    assert any(label.startswith("S (PSD=True)") for label in res.program_multipliers["server"])


def test_a_symmetric_party_variable():
    model = fm.Model()
    w = model.variable(2)
    site = model.client("b")
    T = site.variable((2, 2), name="T", symmetric=True)
    site.minimize(cp.sum_squares(T - np.array([[1.0, 2.0], [0.0, 1.0]])) + cp.sum_squares(w))
    res = model.solve(method="prox-al")
    assert res.status == "optimal"
    np.testing.assert_allclose(T.value, [[1.0, 1.0], [1.0, 1.0]], atol=1e-4)


def test_other_attributes_and_wrong_shapes_are_refused_naming_them():
    model = fm.Model()
    with pytest.raises(fm.ModelError, match=r"attribute\(s\) \['integer'\]"):
        model.variable(3, integer=True)
    site = model.client("b")
    with pytest.raises(fm.ModelError, match=r"\[b\] client.variable\(\): PSD=True needs a square"):
        site.variable(3, PSD=True)
    assert site.owned_variables == ()  # nothing was declared by the refused call


@pytest.mark.parametrize("method", ["fedprox", "dald-cc"])
def test_a_method_without_epigraph_forms_names_the_users_terms(method):
    model = fm.Model()
    w = model.variable(3, name="w")
    for k in range(2):
        site = model.client(f"c{k}")
        A = site.data(RNG.normal(size=(10, 3)), name="A")
        site.minimize(cp.norm(A @ w - 1, 2), name="residual norm")
    with pytest.raises(fm.UnsupportedError) as info:
        model.solve(method=method)
    text = str(info.value)
    assert "c0: residual norm; c1: residual norm" in text
    assert "owned" not in text and "epi" not in text.split("form:")[1]
