"""Tests of fedmodel.compiler.smooth: values vs cvxpy, gradients vs finite differences."""

from __future__ import annotations

import warnings

import cvxpy as cp
import numpy as np
import pytest
import scipy.sparse as sp
from cvxpy.atoms.elementwise.elementwise import Elementwise
from cvxpy.atoms.elementwise.hyperbolic import asinh, atanh, sinh, tanh
from cvxpy.atoms.elementwise.normcdf import normcdf
from cvxpy.atoms.elementwise.trig import cos, sin, tan

from fedmodel.compiler import evaluator
from fedmodel.compiler.smooth import (
    NotSmoothError,
    SmoothFunction,
    VariableLayout,
    check_smooth,
    compile_smooth,
    smooth_atoms,
)


@pytest.fixture(autouse=True)
def _debug_shapes(monkeypatch):
    monkeypatch.setattr(evaluator, "_DEBUG_SHAPES", True)
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=UserWarning)


RNG = np.random.default_rng(0)
A = RNG.standard_normal((12, 4))
B = RNG.standard_normal((12, 4))
yb = np.sign(RNG.standard_normal(12))
b_vec = RNG.standard_normal(12)
M34 = RNG.standard_normal((3, 4))
_L = RNG.standard_normal((4, 4))
P_PSD = _L @ _L.T + np.eye(4)
P_IND = (_L + _L.T) / 2
S_SP = sp.random(6, 4, density=0.5, format="csr", random_state=1) + sp.eye(6, 4, format="csr")
S_SQ = sp.csr_matrix(P_PSD * (np.abs(P_PSD) > 0.5))

# Variables shared by the cases (tests are independent: every case stacks its own x).
w = cp.Variable(4, name="w")
v = cp.Variable(4, name="v")
s = cp.Variable(name="s")
t = cp.Variable(name="t")
X = cp.Variable((3, 4), name="X")
Y = cp.Variable((4, 2), name="Y")
Q = cp.Variable((3, 3), name="Q")
Z = cp.Variable((2, 3, 2), name="Z")
col = cp.Variable((3, 1), name="col")


def _cases():
    """(id, expression, variables, domain) -- domain: 'real', 'pos' (0.5..2), 'unit' (0.1..0.9)."""
    m = A.shape[0]
    logreg = cp.sum(cp.logistic(-cp.multiply(yb, A @ w + s))) / m + 0.1 * cp.sum_squares(w)
    np_obj = cp.sum(cp.logistic(A @ w + s)) / m
    np_con = cp.sum(cp.logistic(-(B @ w + s))) / m - 0.3
    diff_logistic = cp.sum(cp.logistic(A @ w)) / m - cp.sum(cp.logistic(B @ w)) / m
    X_pd = Q @ Q.T + np.eye(3)
    return [
        ("logreg", logreg, [w, s], "real"),
        ("neyman_pearson_obj", np_obj, [w, s], "real"),
        ("neyman_pearson_con", np_con, [w, s], "real"),
        ("diff_logistic_nonconvex", diff_logistic, [w], "real"),
        ("sum_squares_residual", cp.sum_squares(A @ w - b_vec), [w], "real"),
        ("quad_form_psd", cp.quad_form(w, P_PSD), [w], "real"),
        ("quad_form_indefinite", cp.quad_form(w, P_IND) + w @ v, [w, v], "real"),
        ("quad_form_sparse", cp.quad_form(w, S_SQ + S_SQ.T), [w], "real"),
        ("log_sum_exp_all", cp.log_sum_exp(X), [X], "real"),
        ("log_sum_exp_axis0", cp.log_sum_exp(X, axis=0), [X], "real"),
        ("log_sum_exp_axis1_keep", cp.log_sum_exp(X, axis=1, keepdims=True), [X], "real"),
        (
            "index_reshape_transpose_hstack",
            cp.hstack(
                [X[0, :], X[:, 1], cp.reshape(X.T, (12,), order="C"), X[1:, ::2].T[0], w[-1:]]
            ),
            [X, w],
            "real",
        ),
        (
            "combo_scalar",
            cp.sum(cp.exp(cp.vstack([X[0, :], w])))
            + cp.sum(cp.square(cp.reshape(X, (4, 3), order="F"))),
            [X, w],
            "real",
        ),
        ("reshape_C", cp.exp(cp.reshape(X, (2, 6), order="C")), [X], "real"),
        ("reshape_F", cp.reshape(X, (6, 2), order="F") @ np.ones(2), [X], "real"),
        (
            "multi_var",
            cp.multiply(w, v) + w @ v + cp.sum(X @ w) + cp.exp(s) * v,
            [w, v, X, s],
            "real",
        ),
        ("zero_d", s * t + s**2 + cp.exp(t) - cp.log(1 + cp.exp(s)), [s, t], "real"),
        ("broadcast_add_scalar", w + s + 1.0, [w, s], "real"),
        ("broadcast_add_row", X + w, [X, w], "real"),
        ("broadcast_add_col", X + col, [X, col], "real"),
        ("broadcast_to", cp.broadcast_to(w, (3, 4)) * 2.0, [w], "real"),
        ("sparse_left", S_SP @ w, [w], "real"),
        ("sparse_right", X @ S_SP.T, [X], "real"),
        ("sparse_vec_right", cp.exp(S_SP @ w) @ S_SP, [w], "real"),
        ("sparse_transpose_const", cp.Constant(S_SP).T @ cp.exp(S_SP @ w), [w], "real"),
        ("sparse_scaled_const", (S_SP / 4.0) @ w, [w], "real"),
        ("matmul_both_var_2d", X @ Y, [X, Y], "real"),
        ("matmul_vec_mat", w @ Y, [w, Y], "real"),
        ("matmul_mat_vec", X @ v, [X, v], "real"),
        ("matmul_const_left_2d", M34 @ Y, [Y], "real"),
        ("matmul_const_vec_left", np.ones(3) @ X, [X], "real"),
        ("div_by_expr", w / (1 + cp.exp(v)), [w, v], "real"),
        ("div_by_scalar_expr", w / (2 + cp.square(s)), [w, s], "real"),
        ("exp", cp.exp(X), [X], "real"),
        ("log", cp.log(w), [w], "pos"),
        ("log1p", cp.log1p(w), [w], "pos"),
        ("logistic", cp.logistic(3 * w), [w], "real"),
        ("entr", cp.entr(w), [w], "pos"),
        ("xexp", cp.xexp(w), [w], "pos"),
        ("power_3", cp.power(w, 3), [w], "real"),
        ("power_1_5", cp.power(w, 1.5), [w], "pos"),
        ("power_m2_5", cp.power(w, -2.5), [w], "pos"),
        ("square", cp.square(X), [X], "real"),
        ("sqrt", cp.sqrt(w), [w], "pos"),
        ("inv_pos", cp.inv_pos(w), [w], "pos"),
        ("huber", cp.huber(3 * w, 1.0), [w], "real"),
        ("huber_M", cp.huber(X, 0.7), [X], "real"),
        ("kl_div_vars", cp.kl_div(w, v), [w, v], "pos"),
        ("kl_div_const", cp.kl_div(w, 1.5), [w], "pos"),
        ("rel_entr_vars", cp.rel_entr(w, v), [w, v], "pos"),
        ("sin_cos_tan", sin(w) + cos(v) + tan(w / 4), [w, v], "real"),
        ("hyperbolic", sinh(w) + tanh(v) + asinh(w), [w, v], "real"),
        ("atanh", atanh(w), [w], "unit"),
        ("normcdf", normcdf(w), [w], "real"),
        ("one_minus_pos", cp.one_minus_pos(w), [w], "unit"),
        ("quad_over_lin_var_y", cp.quad_over_lin(w, s), [w, s], "pos"),
        ("quad_over_lin_axis", cp.quad_over_lin(X, 2.0, axis=0), [X], "real"),
        ("sum_squares_axis_keep", cp.sum_squares(X, axis=1, keepdims=True), [X], "real"),
        ("sum_axis", cp.sum(cp.exp(X), axis=0) + cp.sum(X, axis=0, keepdims=True), [X], "real"),
        ("cumsum", cp.cumsum(X, axis=1) + cp.cumsum(X, axis=0), [X], "real"),
        ("cumsum_vec", cp.cumsum(cp.exp(w)), [w], "real"),
        ("diag_vec", cp.diag(cp.exp(w)), [w], "real"),
        ("diag_mat_trace", cp.diag(Q) * cp.trace(Q @ Q), [Q], "real"),
        ("prod", cp.prod(w) + cp.sum(cp.prod(X, axis=1)), [w, X], "real"),
        ("special_index_list", cp.exp(w[[0, 2, 2, 3]]), [w], "real"),
        ("special_index_bool", X[np.abs(M34) > 0.5] * 2, [X], "real"),
        ("concatenate", cp.concatenate([X, cp.exp(X)], axis=1), [X], "real"),
        ("concatenate_none", cp.concatenate([X, w], axis=None), [X, w], "real"),
        ("stack", cp.stack([w, cp.exp(v)], axis=1), [w, v], "real"),
        ("wraps_real_conj", cp.real(cp.conj(cp.psd_wrap(Q + Q.T))), [Q], "real"),
        ("kron_generic_affine", cp.kron(np.array([[1.0, 2.0], [0.0, -1.0]]), X), [X], "real"),
        ("conv_generic_affine", cp.convolve(np.array([1.0, -2.0, 0.5]), cp.exp(w)), [w], "real"),
        ("upper_tri_generic_affine", cp.exp(cp.upper_tri(Q)), [Q], "real"),
        ("diff_mean_var", cp.hstack([cp.diff(w), cp.mean(X), cp.var(v)]), [w, X, v], "real"),
        ("log_det", cp.log_det(X_pd), [Q], "real"),
        (
            "nd_transpose_sum",
            cp.sum(cp.exp(cp.transpose(Z, (2, 0, 1))), axis=(0, 2)),
            [Z],
            "real",
        ),
        ("private_data_subclass", cp.sum(cp.logistic(_PrivateData(A) @ w)), [w], "real"),
        ("constant_only", cp.Constant(2.0) * cp.sum(cp.Constant(A)), [w], "real"),
        ("variable_itself", X, [X, w], "real"),
        ("shared_subexpression", cp.sum(cp.exp(w)) + cp.exp(w) @ cp.exp(w), [w], "real"),
        ("hstack_scalars", cp.hstack([s, t, cp.exp(w)]), [s, t, w], "real"),
        ("vstack_mixed", cp.vstack([X, w, cp.exp(v)]), [X, w, v], "real"),
        ("quad_form_column", cp.quad_form(col, P_PSD[:3, :3]), [col], "real"),
        ("power_1_and_0", cp.power(w, 1) + cp.power(v, 0) + cp.power(w, 4), [w, v], "real"),
        ("cumsum_axis_none", cp.cumsum(X, axis=None), [X], "real"),
        ("diag_offsets", cp.sum(cp.diag(w, k=1)) + cp.sum(cp.diag(Q, k=-1)), [w, Q], "real"),
        ("rel_entr_broadcast", cp.rel_entr(w, s), [w, s], "pos"),
        ("index_newaxis", cp.exp(X[..., np.newaxis]) + X[None, 1, :].T, [X], "real"),
        ("nd_matmul_broadcast", Z @ np.ones((2, 4)), [Z], "real"),
        ("nd_trace", cp.trace(Z[:, :2, :]), [Z], "real"),
        ("param_free_cvxpy_value", cp.sum(cp.exp(w - 1.0)) * 0.5 - 2.0, [w], "real"),
    ]


class _PrivateData(cp.Constant):
    """Stands in for the repo's PrivateData(cp.Constant) data handles."""


def _point(layout: VariableLayout, domain: str, rng: np.random.Generator) -> np.ndarray:
    if domain == "pos":
        return rng.uniform(0.5, 2.0, layout.size)
    if domain == "unit":
        return rng.uniform(0.1, 0.9, layout.size)
    return rng.standard_normal(layout.size)


def _fd_jacobian(f: SmoothFunction, x: np.ndarray, h: float = 1e-6) -> np.ndarray:
    jac = np.zeros((f.size, x.size))
    for j in range(x.size):
        e = np.zeros_like(x)
        e[j] = h
        jac[:, j] = (f.value(x + e) - f.value(x - e)) / (2 * h)
    return jac


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(a - b), initial=0.0) / max(1.0, np.max(np.abs(b), initial=0.0)))


CASES = _cases()


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_value_and_derivatives(case):
    name, expr, variables, domain = case
    rng = np.random.default_rng(abs(hash(name)) % 2**32)
    layout = VariableLayout(variables)
    f = compile_smooth(expr, layout)
    assert f.shape == expr.shape
    assert f.size == expr.size
    for _ in range(2):
        x = _point(layout, domain, rng)
        layout.write_values(x)
        expected = np.reshape(np.asarray(expr.value, dtype=float), -1, order="F")
        val = f.value(x)
        assert val.shape == (f.size,)
        np.testing.assert_allclose(val, expected, rtol=1e-10, atol=1e-10, err_msg=name)

        jac = f.jacobian(x)
        assert jac.shape == (f.size, layout.size)
        assert _rel(jac, _fd_jacobian(f, x)) < 1e-6, name

        adj = rng.standard_normal(f.size)
        vval, vgrad = f.vjp(x, adj)
        np.testing.assert_allclose(vval, val, rtol=1e-12)
        np.testing.assert_allclose(vgrad, jac.T @ adj, rtol=1e-9, atol=1e-9)

        if f.size == 1:
            fval, grad = f.value_and_grad(x)
            assert isinstance(fval, float)
            np.testing.assert_allclose(fval, expected[0], rtol=1e-10, atol=1e-10)
            np.testing.assert_allclose(grad, jac[0], rtol=1e-12, atol=1e-12)


CVXPY_GRAD_CASES = [
    "logreg",
    "neyman_pearson_obj",
    "diff_logistic_nonconvex",
    "sum_squares_residual",
    "quad_form_psd",
    "log_sum_exp_axis0",
    "multi_var",
    "zero_d",
    "sparse_left",
    "log",
    "entr",
    "power_1_5",
    "huber",
    "kl_div_vars",
    "quad_over_lin_var_y",
    "index_reshape_transpose_hstack",
    "cumsum",
    "kron_generic_affine",
]


@pytest.mark.parametrize("name", CVXPY_GRAD_CASES)
def test_gradient_matches_cvxpy_grad(name):
    _, expr, variables, domain = next(c for c in CASES if c[0] == name)
    rng = np.random.default_rng(7)
    layout = VariableLayout(variables)
    f = compile_smooth(expr, layout)
    x = _point(layout, domain, rng)
    layout.write_values(x)
    grads = expr.grad
    jac = f.jacobian(x)
    for var in variables:
        g = grads.get(var)
        assert g is not None, (name, var)
        g = g.toarray() if sp.issparse(g) else np.atleast_2d(np.asarray(g, dtype=float))
        g = np.reshape(g, (var.size, expr.size))
        np.testing.assert_allclose(jac[:, layout.slice_of(var)].T, g, rtol=1e-8, atol=1e-8)


def test_parameters_are_read_at_evaluation_time():
    lam = cp.Parameter(nonneg=True, value=0.5)
    c = cp.Parameter(4, value=np.ones(4))
    p = cp.Parameter(value=3.0)
    mm = cp.Parameter(nonneg=True, value=1.0)
    expr = cp.sum(cp.logistic(A @ w)) + lam * cp.sum_squares(w - c) + cp.sum(cp.huber(w, mm))
    expr = expr + cp.sum(cp.power(cp.exp(w), p))
    layout = VariableLayout([w])
    f = compile_smooth(expr, layout)
    x = RNG.standard_normal(4)
    for lam_v, c_v, p_v, m_v in [(0.5, np.ones(4), 3.0, 1.0), (2.0, np.arange(4.0), 1.5, 0.2)]:
        lam.value, c.value, p.value, mm.value = lam_v, c_v, p_v, m_v
        layout.write_values(x)
        val, grad = f.value_and_grad(x)
        assert val == pytest.approx(expr.value, rel=1e-12)
        assert _rel(grad, _fd_jacobian(f, x)[0]) < 1e-6
    lam.value = None
    with pytest.raises(ValueError, match="has no value"):
        f.value(x)


def test_parameter_matrix_product():
    G = cp.Parameter((3, 4), value=M34)
    expr = cp.sum_squares(G @ w)
    layout = VariableLayout([w])
    f = compile_smooth(expr, layout)
    x = RNG.standard_normal(4)
    g1 = f.value_and_grad(x)[1]
    G.value = 2 * M34
    g2 = f.value_and_grad(x)[1]
    np.testing.assert_allclose(g2, 4 * g1)


@pytest.mark.parametrize(
    ("make", "atom", "words"),
    [
        (lambda: cp.sum(cp.abs(w)), "abs", ["abs", "not differentiable at 0"]),
        (lambda: cp.norm1(w) + cp.sum_squares(w), "norm1", ["norm1", "0"]),
        (lambda: cp.sum(cp.maximum(w, v)), "maximum", ["maximum", "equal"]),
        (lambda: cp.sum(cp.pos(w)), "maximum", ["maximum"]),
        (lambda: cp.norm2(w), None, ["pnorm", "norm2", "not differentiable at 0"]),
        (lambda: cp.norm(X, "fro"), None, ["not differentiable at 0"]),
        (lambda: cp.max(w), "max", ["max"]),
        (lambda: cp.sum_largest(w, 2), "sum_largest", ["sum_largest"]),
        (lambda: cp.norm_inf(w), "norm_inf", ["norm_inf"]),
        (lambda: cp.lambda_max(Q + Q.T), "lambda_max", ["eigenvalues"]),
    ],
)
def test_not_smooth_error_names_atom(make, atom, words):
    expr = make()
    for call in (lambda: check_smooth(expr), lambda: compile_smooth(expr, VariableLayout([w]))):
        with pytest.raises(NotSmoothError) as info:
            call()
        err = info.value
        assert isinstance(err, ValueError)
        if atom is not None:
            assert err.atom == atom
        assert err.atom in str(err)
        assert err.expression and err.expression.split("(")[0] in str(err)
        for word in words:
            assert word in str(err)


class my_kinky_atom(Elementwise):
    """A user-defined atom the compiler knows nothing about."""

    def numeric(self, values):
        return np.abs(values[0])

    def sign_from_args(self):
        return (True, False)

    def is_atom_convex(self):
        return True

    def is_atom_concave(self):
        return False

    def is_incr(self, idx):
        return False

    def is_decr(self, idx):
        return False

    def _grad(self, values):
        return None


def test_unknown_atom_raises():
    expr = cp.sum(my_kinky_atom(w)) + cp.sum_squares(w)
    with pytest.raises(NotSmoothError, match="my_kinky_atom") as info:
        check_smooth(expr)
    assert info.value.atom == "my_kinky_atom"
    assert "not a supported smooth atom" in str(info.value)


def test_foreign_variable_raises_value_error():
    foreign = cp.Variable(4, name="foreign_weights")
    with pytest.raises(ValueError, match="foreign_weights"):
        compile_smooth(cp.sum_squares(w - foreign), VariableLayout([w]))


def test_value_and_grad_requires_scalar():
    f = compile_smooth(cp.exp(w), VariableLayout([w]))
    with pytest.raises(ValueError, match="scalar"):
        f.value_and_grad(np.zeros(4))
    with pytest.raises(ValueError):
        f.vjp(np.zeros(4), np.ones(3))


def test_atoms_and_smooth_atoms():
    f = compile_smooth(cp.sum(cp.logistic(A @ w)) / 12 + cp.sum_squares(w), VariableLayout([w]))
    assert {"logistic", "MulExpression", "Sum", "quad_over_lin"} <= f.atoms()
    names = smooth_atoms()
    assert {"logistic", "exp", "log", "quad_form", "QuadForm", "sum_squares"} <= names
    assert {"abs", "norm1", "maximum", "Pnorm", "PnormApprox", "sum_largest"}.isdisjoint(names)
    assert {"kron", "PowerApprox", "special_index", "index", "psd_wrap"} <= names


def test_layout_roundtrip():
    layout = VariableLayout([s, X, w])
    assert layout.size == 1 + 12 + 4
    assert layout.slice_of(X) == slice(1, 13)
    Xv = np.arange(12.0).reshape(3, 4)
    x = layout.stack({X: Xv, s: 2.5})
    assert x[0] == 2.5
    np.testing.assert_array_equal(x[1:13], Xv.ravel(order="F"))
    np.testing.assert_array_equal(x[13:], 0.0)
    assert np.all(layout.stack({w: 3.0}, default=-1.0)[13:] == 3.0)
    assert layout.stack(default=-1.0)[0] == -1.0 or s.value is not None
    parts = layout.unstack(x)
    np.testing.assert_array_equal(parts[X], Xv)
    assert parts[s].shape == ()
    layout.write_values(x)
    np.testing.assert_array_equal(X.value, Xv)
    np.testing.assert_array_equal(layout.stack(), x)  # values=None reads var.value
    with pytest.raises(ValueError):
        layout.stack({X: np.ones((4, 3))})
    with pytest.raises(ValueError):
        layout.slice_of(v)
    with pytest.raises(ValueError):
        VariableLayout([w, w])


def test_write_values_projects_attributes():
    nn = cp.Variable(3, nonneg=True)
    layout = VariableLayout([nn])
    layout.write_values(np.array([1.0, -1e-3, 2.0]))
    assert np.all(nn.value >= 0)


def test_dense_logistic_is_fast_enough():
    """Smoke test of the hot path: one value_and_grad is a couple of mat-vecs."""
    rng = np.random.default_rng(3)
    data = rng.standard_normal((3000, 20))
    ww = cp.Variable(20)
    f = compile_smooth(cp.sum(cp.logistic(data @ ww)) / 3000, VariableLayout([ww]))
    x = rng.standard_normal(20)
    val, grad = f.value_and_grad(x)
    z = data @ x
    assert val == pytest.approx(np.mean(np.logaddexp(0, z)), rel=1e-12)
    np.testing.assert_allclose(grad, data.T @ (1 / (1 + np.exp(-z))) / 3000, rtol=1e-10)


def test_prod_gradient_with_zero_entries():
    f = compile_smooth(cp.prod(w) + cp.sum(cp.prod(X, axis=0)), VariableLayout([w, X]))
    x = np.random.default_rng(5).standard_normal(16)
    x[[1, 6, 7]] = 0.0  # one zero in w, two zeros in the same column of X
    jac = f.jacobian(x)
    assert _rel(jac, _fd_jacobian(f, x)) < 1e-6


def test_sparse_constants_stay_sparse():
    ss = sp.random(400, 300, density=0.01, format="csr", random_state=2)
    ww = cp.Variable(300)
    expr = cp.sum_squares(cp.Constant(ss).T @ cp.exp(ss @ ww)) + cp.sum((2 * cp.Constant(ss)) @ ww)
    f = compile_smooth(expr, VariableLayout([ww]))
    big_dense = [
        c for c in f._base if isinstance(c, np.ndarray) and c.size >= ss.size and c.base is None
    ]
    assert not big_dense
    assert any(sp.issparse(c) for c in f._base)
    x = np.random.default_rng(0).standard_normal(300) * 0.1
    ww.value = x
    val, grad = f.value_and_grad(x)
    assert val == pytest.approx(expr.value, rel=1e-10)
    assert grad.shape == (300,)


def test_check_smooth_accepts_nonconvex_and_generic_affine_rejects_parameters():
    check_smooth(cp.sum(cp.logistic(A @ w)) - cp.sum(cp.logistic(B @ w)))
    check_smooth(cp.multiply(w, v) @ np.ones(4) - cp.quad_form(w, P_IND))
    kernel = cp.Parameter(3, value=np.ones(3))
    with pytest.raises(NotSmoothError, match="Parameter"):
        compile_smooth(cp.sum(cp.convolve(kernel, w)), VariableLayout([w]))


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_glm_gram_upper_matches_the_full_gram_for_any_sign_of_the_weights(sign):
    """The Newton backend's Hessian pieces: ``gram_upper`` (syrk, one or two) equals the
    upper triangle of ``s^2 A^T diag(d) A`` also when ``d`` has negative entries (the
    concave half of a difference-of-convex constraint)."""
    from fedmodel.compiler.glm import GLMTerm

    rng = np.random.default_rng(3)
    A = rng.normal(size=(300, 12))
    term = GLMTerm("logistic", A, np.zeros(300), np.ones(300), s=sign)
    for d in (rng.random(300), rng.normal(size=300), -rng.random(300)):
        full = (A.T * d) @ A
        assert np.allclose(np.triu(term.gram_upper(d)), np.triu(full), atol=1e-10)
        assert np.allclose(term.gram(d), full, atol=1e-10)


def test_log_det_outside_its_domain():
    # -I has determinant +1 (an even number of negative eigenvalues) but is no point of
    # log_det's domain: its value is -inf, and its gradient is refused with the reason
    M = cp.Variable((2, 2))
    f = compile_smooth(cp.log_det(M), VariableLayout([M]))
    assert f.value(np.eye(2).flatten(order="F")) == pytest.approx(0.0)
    assert f.value(-np.eye(2).flatten(order="F")) == -np.inf
    with pytest.raises(ValueError, match="not positive definite"):
        f.value_and_grad(np.zeros(4))
