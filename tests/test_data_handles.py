"""Arithmetic on data handles: ``site.data(...)`` behaves like the array it wraps.

Each operation is checked against numpy on the wrapped array, keeps the owner tag inside
the expression (so the ownership check still sees it), and a model written with all of
them solves to the same point as plain cvxpy on the raw arrays.
"""

import cvxpy as cp
import numpy as np
import pytest

import fedmodel as fm

RAW = np.arange(1.0, 7.0).reshape(2, 3)
VEC = np.array([1.0, -2.0, 0.5])

OPS = {
    "scalar * data": (lambda D: 2.5 * D, lambda A: 2.5 * A),
    "numpy scalar * data": (lambda D: np.float64(2.5) * D, lambda A: 2.5 * A),
    "data * scalar": (lambda D: D * 2.5, lambda A: A * 2.5),
    "-data": (lambda D: -D, lambda A: -A),
    "data / scalar": (lambda D: D / 4.0, lambda A: A / 4.0),
    "scalar + data": (lambda D: 1.0 + D, lambda A: 1.0 + A),
    "scalar - data": (lambda D: 1.0 - D, lambda A: 1.0 - A),
    "data[0]": (lambda D: D[0], lambda A: A[0]),
    "data[:, 1:]": (lambda D: D[:, 1:], lambda A: A[:, 1:]),
    "data.T": (lambda D: D.T, lambda A: A.T),
    "array @ data": (lambda D: np.ones(2) @ D, lambda A: np.ones(2) @ A),
    "scalar * data.T[1:]": (lambda D: 3 * D.T[1:], lambda A: 3 * A.T[1:]),
}


@pytest.mark.parametrize("op", list(OPS))
def test_operation_matches_numpy_and_keeps_the_owner(op):
    model = fm.Model()
    site = model.client("site0")
    handle = site.data(RAW, name="X")
    on_handle, on_array = OPS[op]
    expr = on_handle(handle)
    np.testing.assert_allclose(expr.value, on_array(RAW))
    # the owner tag travels with the expression: another party may not use it
    w = model.variable(expr.shape[-1] if expr.ndim else 1, name="w")
    other = model.client("other")
    other.minimize(cp.sum_squares(w))
    site.minimize(cp.sum_squares(w))
    term = expr @ w if expr.ndim else expr * cp.sum(w)
    other.minimize(cp.sum_squares(term), name="borrowed")
    with pytest.raises(fm.OwnershipError, match=r"\[other\].*'borrowed' uses data 'X'"):
        model.compile()


def test_scalar_times_data_models_solve_like_plain_cvxpy():
    """A quadratic-form model written with ``scalar * data``, ``-data``, ``data / scalar``,
    a slice and a transpose: prox-al reaches plain cvxpy's optimum."""
    rng = np.random.default_rng(0)
    d = 3
    model = fm.Model("ops")
    w = model.variable(d, name="w")
    parts = []
    for k in range(2):
        site = model.client(f"s{k}")
        M = rng.normal(size=(d, d))
        Q = site.data(M @ M.T + np.eye(d), name="Q")
        q = site.data(rng.normal(size=d), name="q")
        B = site.data(rng.normal(size=(d, 2)), name="B")
        site.minimize(0.5 * cp.quad_form(w, Q) - 2 * q @ w / 3 + cp.sum_squares(B.T @ w) / 4)
        site.subject_to(-q[:2] @ w[:2] <= 1)
        parts.append((M @ M.T + np.eye(d), q.value, B.value))
    res = model.solve(method="prox-al", eps=1e-7)
    x = cp.Variable(d)
    obj = sum(
        0.5 * cp.quad_form(x, Q) - 2 * q @ x / 3 + cp.sum_squares(B.T @ x) / 4 for Q, q, B in parts
    )
    cons = [-q[:2] @ x[:2] <= 1 for _, q, _ in parts]
    prob = cp.Problem(cp.Minimize(obj), cons)
    prob.solve(solver="CLARABEL", tol_gap_abs=1e-12, tol_gap_rel=1e-12, tol_feas=1e-12)
    assert res.status == "optimal"
    assert res.kkt.satisfied(1e-7, 1e-7)
    assert abs(res.objective - prob.value) <= 1e-6 * max(1.0, abs(prob.value))
