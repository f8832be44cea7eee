"""The batched proximal Newton method of a cohort of GLM parties against each party's own
Newton solve (GLMFunction.evaluate), client by client."""

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.special import expit

import fedmodel.subproblems.batched_glm as batched_glm
from fedmodel.compiler.glm import GLMFunction, GLMTerm, phi, phi_d2, phi_value_d1
from fedmodel.subproblems.batched_glm import GLMCohort, NotStackable, spd_inverse, spd_solve


def _forms(rows, n=4, kinds=("logistic", "square"), quadratic=False, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for m in rows:
        terms = [
            GLMTerm(k, rng.normal(size=(m, n)), rng.normal(size=m), rng.uniform(0.1, 1, m) / m)
            for k in kinds
        ]
        Q = None
        if quadratic:
            B = rng.normal(size=(n, n))
            Q = B @ B.T / n
        out.append(GLMFunction(n, terms, Q, rng.normal(size=n), float(rng.normal())))
    return out


def _reference(f: GLMFunction, c, s, x0, tol):
    """One party's own Newton solve of f(x) + (s/2)||x - c||^2 (damped); returns the point
    and its residual ||grad||_inf."""
    x = np.array(x0, dtype=float)
    for _ in range(100):
        _, g, H = f.evaluate(x)
        g = g + s * (x - c)
        if np.abs(g).max() <= tol:
            break
        step = -np.linalg.solve(H + s * np.eye(f.n), g)
        val = f.evaluate(x, hessian=False)[0] + 0.5 * s * (x - c) @ (x - c)
        t = 1.0
        while True:
            y = x + t * step
            new = f.evaluate(y, hessian=False)[0] + 0.5 * s * (y - c) @ (y - c)
            if new <= val + 1e-4 * t * (g @ step) or t < 1e-10:
                break
            t *= 0.5
        x = y
    _, g, _ = f.evaluate(x, hessian=False)
    return x, np.abs(g + s * (x - c)).max()


@pytest.mark.parametrize("quadratic", [False, True])
@pytest.mark.parametrize("kinds", [("logistic", "square"), ("huber",), ("exp",)])
def test_each_client_reaches_its_own_minimiser(kinds, quadratic):
    forms = _forms([3, 7, 5, 1, 6], kinds=kinds, quadratic=quadratic)
    rng = np.random.default_rng(1)
    C = rng.normal(size=(5, 4))
    S = np.array([0.5, 1.0, 2.0, 0.1, 10.0])
    X0 = np.zeros((5, 4))
    out = GLMCohort(forms).prox(C, S, X0, tol=1e-11)
    assert out.message == ["converged"] * 5
    assert (out.residual <= 1e-11).all()
    for i, f in enumerate(forms):
        ref, ref_residual = _reference(f, C[i], S[i], X0[i], 1e-13)
        # F_i is S_i-strongly convex: a point whose gradient is r from 0 is within
        # ||r||_2 / S_i <= sqrt(n) r / S_i of the minimiser
        bound = np.sqrt(4) * (out.residual[i] + ref_residual) / S[i] + 1e-12
        assert np.abs(out.x[i] - ref).max() <= bound
        # the residual reported is the gradient's at the returned point, measured
        _, g, _ = f.evaluate(out.x[i], hessian=False)
        assert np.isclose(np.abs(g + S[i] * (out.x[i] - C[i])).max(), out.residual[i])


@pytest.mark.parametrize("kinds", [("logistic", "square"), ("square",)])
def test_value_and_gradient_equal_each_form_s(kinds):
    """Also for a least-squares cohort, whose value and gradient come from f(0), its
    gradient there and its Hessian."""
    forms = _forms([2, 5, 4], kinds=kinds, quadratic=True)
    X = np.random.default_rng(2).normal(size=(3, 4))
    cohort = GLMCohort(forms)
    assert cohort.keeps_inverses == (kinds == ("square",))
    vals, G = cohort.value_grad(X)
    H = cohort.hessian(X)
    for i, f in enumerate(forms):
        v, g, h = f.evaluate(X[i])
        assert np.isclose(vals[i], v, rtol=1e-13, atol=1e-13)
        assert np.allclose(G[i], g, rtol=1e-12, atol=1e-13)
        assert np.allclose(H[i], h, rtol=1e-12, atol=1e-13)
    # the Hessians from the second derivatives of the value's own evaluation: the same
    # (the private methods take the rows in the cohort's own order)
    own = cohort._own(X)
    _, _, curvature = cohort._evaluate(own, curvature=True)
    assert np.array_equal(cohort._hessian(own, curvature), cohort._own(H))


@pytest.mark.parametrize("kind", ["logistic", "exp", "square", "huber"])
def test_one_phi_evaluation_gives_the_derivatives_of_the_separate_ones(kind):
    """phi's value, first and second derivative equal phi_value_d1's and phi_d2's; the
    logistic ones equal log(1 + e^z), the sigmoid and its derivative to rounding, without
    overflow far from 0."""
    z = np.concatenate([np.linspace(-40, 40, 801), [-1e-300, 0.0, 1e-300]])
    if kind == "logistic":
        z = np.concatenate([z, [-800.0, 800.0]])
    v, d1, d2 = phi(kind, z, 1.5)
    v1, g1 = phi_value_d1(kind, z, 1.5)
    assert np.array_equal(v, v1) and np.array_equal(d1, g1)
    assert np.array_equal(d2, phi_d2(kind, z, 1.5))
    if kind == "logistic":
        s = expit(z)
        assert np.allclose(v, np.logaddexp(0.0, z), rtol=4e-16, atol=0.0)
        assert np.allclose(d1, s, rtol=4e-16, atol=0.0)
        assert np.allclose(d2, s * expit(-z), rtol=1e-15, atol=0.0)


def test_a_client_already_at_its_minimiser_takes_no_step():
    forms = _forms([4, 4])
    cohort = GLMCohort(forms)
    C, S = np.zeros((2, 4)), np.ones(2)
    first = cohort.prox(C, S, np.zeros((2, 4)), tol=1e-12)
    X0 = np.vstack([first.x[0], np.zeros(4)])
    again = cohort.prox(C, S, X0, tol=1e-12)
    assert again.iterations[0] == 0 and again.iterations[1] > 0
    assert np.array_equal(again.x[0], first.x[0])


def test_per_client_tolerances_and_the_iteration_cap():
    forms = _forms([5, 5, 5])
    cohort = GLMCohort(forms)
    C, S, X0 = np.ones((3, 4)), np.full(3, 0.5), np.zeros((3, 4))
    loose = cohort.prox(C, S, X0, tol=np.array([1e-1, 1e-12, 1e-12]))
    assert loose.residual[0] <= 1e-1 and (loose.residual[1:] <= 1e-12).all()
    assert loose.iterations[0] <= loose.iterations[1]
    capped = cohort.prox(C, S, X0, tol=1e-14, max_iter=1)
    assert capped.message == ["max_iter"] * 3 and (capped.iterations == 1).all()


def test_clients_out_of_block_order_get_their_own_rows_back():
    """A cohort keeps its clients block by block; what it takes and returns is client by
    client, whatever the memory layout of the rows given: each client's point, residual,
    iterations and message are those of a cohort of its own, bit for bit, and its value,
    gradient and Hessian too (of a subset as well)."""
    rows = [40, 3, 20, 3, 40]  # (blocks 40, 3, 20: not in block order)
    forms = _forms(rows, kinds=("logistic", "square"), seed=3)
    rng = np.random.default_rng(4)
    C, S = rng.normal(size=(5, 4)), np.linspace(0.2, 1.0, 5)
    X = np.asfortranarray(rng.normal(size=(5, 4)))
    tol = np.array([1e-1, 1e-14, 1e-1, 1e-14, 1e-14])
    cohort = GLMCohort(forms)
    out = cohort.prox(C, S, X, tol=tol, max_iter=1)
    vals, G = cohort.value_grad(X)
    H = cohort.hessian(X)
    part = cohort.subset(np.array([4, 1]))
    for i, f in enumerate(forms):
        own = GLMCohort([f])
        alone = own.prox(C[i : i + 1], S[i : i + 1], X[i : i + 1], tol=tol[i], max_iter=1)
        assert np.array_equal(alone.x[0], out.x[i]) and alone.residual[0] == out.residual[i]
        assert alone.iterations[0] == out.iterations[i] and alone.message[0] == out.message[i]
        v, g = own.value_grad(X[i : i + 1])
        assert v[0] == vals[i] and np.array_equal(g[0], G[i])
        assert np.array_equal(own.hessian(X[i : i + 1])[0], H[i])
    assert out.message[1] == "max_iter" and out.message[0] == "converged"
    v, g = part.value_grad(X[[4, 1]])
    assert np.array_equal(v, vals[[4, 1]]) and np.array_equal(g, G[[4, 1]])


def test_parties_of_another_structure_are_refused_by_position():
    forms = _forms([3, 3]) + _forms([3], kinds=("logistic",))
    with pytest.raises(NotStackable, match="party 2"):
        GLMCohort(forms)
    sparse = _forms([3])
    sparse[0].terms[0] = GLMTerm(
        "logistic", sp.csr_matrix(np.ones((3, 4))), np.zeros(3), np.ones(3)
    )
    with pytest.raises(NotStackable, match="sparse"):
        GLMCohort(_forms([3]) + sparse)
    with pytest.raises(NotStackable, match="at least one"):
        GLMCohort([])


def test_bad_arguments_are_named():
    cohort = GLMCohort(_forms([3, 3]))
    with pytest.raises(ValueError, match="shape"):
        cohort.prox(np.zeros((3, 4)), np.ones(2), np.zeros((2, 4)), tol=1e-8)
    with pytest.raises(ValueError, match="positive proximal weight"):
        cohort.prox(np.zeros((2, 4)), np.array([1.0, 0.0]), np.zeros((2, 4)), tol=1e-8)


def _counted(cohort: GLMCohort) -> list[int]:
    """The sizes of the batches ``cohort`` evaluates ``f`` on from now on (its own calls)."""
    calls: list[int] = []
    evaluate = cohort._evaluate
    cohort._evaluate = lambda X, curvature: calls.append(len(X)) or evaluate(X, curvature)
    return calls


def test_a_solve_from_the_last_points_reuses_their_values_with_the_same_numbers():
    """A cohort starting where its last solve ended takes f and its gradient there from that
    solve (one evaluation fewer) and returns exactly what a fresh cohort returns; from
    another point it evaluates again."""
    forms = _forms([3, 7, 5, 6], kinds=("logistic", "square"))
    rng = np.random.default_rng(2)
    C1, C2 = rng.normal(size=(2, 4, 4))
    S = np.array([0.5, 1.0, 2.0, 4.0])
    cohort = GLMCohort(forms)
    first = cohort.prox(C1, S, np.zeros((4, 4)), tol=1e-10)
    reused = _counted(cohort)
    again = cohort.prox(C2, S, first.x, tol=1e-10)
    fresh_cohort = GLMCohort(forms)
    fresh = _counted(fresh_cohort)
    expected = fresh_cohort.prox(C2, S, first.x, tol=1e-10)
    for field in ("x", "residual", "iterations"):
        assert np.array_equal(getattr(again, field), getattr(expected, field))
    assert len(reused) == len(fresh) - 1
    moved = again.x + 1e-3  # (not the last points: evaluated again, as a fresh cohort)
    reused.clear()
    cohort.prox(C1, S, moved, tol=1e-10)
    other = GLMCohort(forms)
    fresh = _counted(other)
    other.prox(C1, S, moved, tol=1e-10)
    assert len(reused) == len(fresh) >= 1


def test_a_kept_inverse_is_used_only_for_its_own_proximal_weights():
    """A least-squares cohort keeps the inverse of each vector of proximal weights: every
    solve is one exact Newton step for the weights it is given (a new weight on one client
    only included), and the same numbers as a fresh cohort's."""
    forms = _forms([6, 3, 8], kinds=("square",), quadratic=True)
    rng = np.random.default_rng(5)
    cohort = GLMCohort(forms)
    X = np.zeros((3, 4))
    for S in ([1.0, 1.0, 1.0], [0.01, 0.01, 0.01], [0.01, 5.0, 0.01], [1.0, 1.0, 1.0]):
        S = np.array(S)
        C = rng.normal(size=(3, 4))
        out = cohort.prox(C, S, X, tol=1e-10)
        assert (out.iterations == 1).all() and (out.residual <= 1e-10).all()
        for i, f in enumerate(forms):
            _, g, H = f.evaluate(np.zeros(4))
            exact = np.linalg.solve(H + S[i] * np.eye(4), S[i] * C[i] - g)
            assert np.abs(out.x[i] - exact).max() <= 1e-10 * max(1.0, np.abs(exact).max())
        fresh = GLMCohort(forms).prox(C, S, X, tol=1e-10)
        assert np.array_equal(out.x, fresh.x)
        X = out.x


@pytest.mark.parametrize("n", [5, 30])
def test_the_batched_solves_and_inverses_are_numpy_s_to_rounding(n):
    """spd_solve and spd_inverse by Cholesky factors (few variables), by LU (many), and by
    LU when a matrix is not positive definite to rounding (then for the whole batch)."""
    rng = np.random.default_rng(n)
    B = rng.normal(size=(6, n, n))
    H = np.matmul(B, B.transpose(0, 2, 1)) / n
    shift = rng.uniform(0.01, 1.0, 6)
    M = H + shift[:, None, None] * np.eye(n)
    G = rng.normal(size=(6, n))
    ref = np.linalg.solve(M, G[:, :, None])[:, :, 0]
    assert np.abs(spd_solve(M, G) - ref).max() <= 1e-10 * np.abs(ref).max()
    inv = np.linalg.inv(M)
    assert np.abs(spd_inverse(H, shift) - inv).max() <= 1e-10 * np.abs(inv).max()
    M[0] = -np.eye(n)  # (no Cholesky factor)
    ref[0] = -G[0]
    assert np.abs(spd_solve(M, G) - ref).max() <= 1e-10 * np.abs(ref).max()
    inv = spd_inverse(-np.eye(n)[None] - 1.0 * np.eye(n), np.array([1.0]))
    assert np.allclose(inv[0], -np.eye(n))


def test_a_party_s_numbers_are_the_same_in_any_cohort():
    """Parties of several padded row counts (blocks) in one cohort: each gets exactly what
    it gets in a cohort of its own (its padding depends on its own rows only)."""
    rows = [33, 41, 50, 20, 34, 1]
    forms = _forms(rows, kinds=("logistic",), seed=3)
    rng = np.random.default_rng(4)
    C = rng.normal(size=(len(rows), 4))
    S = np.linspace(0.1, 3.0, len(rows))
    X0 = np.zeros((len(rows), 4))
    together = GLMCohort(forms).prox(C, S, X0, tol=1e-12)
    assert (together.residual <= 1e-12).all()
    for i, f in enumerate(forms):
        alone = GLMCohort([f]).prox(C[i : i + 1], S[i : i + 1], X0[i : i + 1], tol=1e-12)
        assert np.array_equal(alone.x[0], together.x[i])
        assert alone.iterations[0] == together.iterations[i]


def test_a_client_near_its_minimiser_steps_with_its_last_factor(monkeypatch):
    """After a full step from which one more step with the same Cholesky factor is expected
    to reach the tolerance (CHORD_MARGIN), a client takes that chord step: a warm-started
    solve has fewer factorisations than Newton iterations, every client reaches its
    tolerance and lies within its distance of its own minimiser; with an infinite margin
    every step has a new factor."""
    factored: list[int] = []
    factor = batched_glm.spd_factor
    monkeypatch.setattr(batched_glm, "spd_factor", lambda M: factored.append(len(M)) or factor(M))
    forms = _forms([30, 40, 25, 35], n=6, kinds=("logistic",), seed=7)
    rng = np.random.default_rng(8)
    C, S = rng.normal(size=(4, 6)), np.full(4, 0.01)
    for margin in (batched_glm.CHORD_MARGIN, np.inf):
        monkeypatch.setattr(batched_glm, "CHORD_MARGIN", margin)
        cohort = GLMCohort(forms)
        first = cohort.prox(C, S, np.zeros((4, 6)), tol=1e-10)
        factored.clear()
        out = cohort.prox(C + 0.01, S, first.x, tol=1e-10)  # (from the last points)
        assert out.message == ["converged"] * 4 and (out.residual <= 1e-10).all()
        if margin == np.inf:
            assert sum(factored) == out.iterations.sum()
        else:
            assert 4 <= sum(factored) < out.iterations.sum()
        for i, f in enumerate(forms):
            ref, ref_residual = _reference(f, C[i] + 0.01, S[i], first.x[i], 1e-13)
            bound = np.sqrt(6) * (out.residual[i] + ref_residual) / S[i] + 1e-12
            assert np.abs(out.x[i] - ref).max() <= bound
    # above SUBSTITUTION_SIZE variables every step solves by LU (no factor to keep)
    wide = _forms([30, 40], n=30, kinds=("logistic",), seed=9)
    factored.clear()
    out = GLMCohort(wide).prox(rng.normal(size=(2, 30)), np.full(2, 0.01), np.zeros((2, 30)), 1e-10)
    assert (out.residual <= 1e-10).all() and sum(factored) == out.iterations.sum()


def test_most_clients_still_iterating_compute_on_the_whole_cohort(monkeypatch):
    """While at least WIDE_SHARE of a cohort's clients iterate, an iteration computes on
    the whole cohort's data and picks their rows (no copy of their data: no subset of that
    many clients); each client's numbers are those of a cohort of its own, bit for bit."""
    rows = [33, 41, 50, 20, 34, 25]
    forms = _forms(rows, kinds=("logistic",), seed=13)
    rng = np.random.default_rng(14)
    C, S = rng.normal(size=(6, 4)), np.linspace(0.1, 1.0, 6)
    X0 = GLMCohort(forms).prox(C, S, np.zeros((6, 4)), tol=1e-13).x
    X0[2:] = 0.0  # (two clients start at their minimisers: four of six iterate)
    sizes: list[int] = []
    subset = GLMCohort._subset
    monkeypatch.setattr(
        GLMCohort, "_subset", lambda c, idx: sizes.append(len(idx)) or subset(c, idx)
    )
    out = GLMCohort(forms).prox(C, S, X0, tol=1e-12)
    assert (out.iterations[:2] == 0).all() and (out.iterations[2:] >= 2).all()
    assert 4 >= batched_glm.WIDE_SHARE * 6 > max(sizes)
    for i, f in enumerate(forms):
        alone = GLMCohort([f]).prox(C[i : i + 1], S[i : i + 1], X0[i : i + 1], tol=1e-12)
        assert np.array_equal(alone.x[0], out.x[i]) and alone.iterations[0] == out.iterations[i]


def test_a_kept_point_serves_value_grad_and_the_first_solve_with_the_same_numbers():
    """A cohort that keeps f at some points (keep_point) returns copies of those values from
    value_grad there and starts a solve there without evaluating f again, exactly what a
    fresh cohort returns; at other points, or the same values in another memory layout,
    it evaluates again."""
    forms = _forms([3, 7, 5, 6], kinds=("logistic", "square"))
    rng = np.random.default_rng(3)
    X, C = rng.normal(size=(2, 4, 4))
    S = np.array([0.5, 1.0, 2.0, 4.0])
    cohort, fresh_cohort = GLMCohort(forms), GLMCohort(forms)
    cohort.keep_point(X)
    kept = _counted(cohort)
    fresh = _counted(fresh_cohort)
    vals, G = cohort.value_grad(X)
    expected_vals, expected_G = fresh_cohort.value_grad(X)
    assert np.array_equal(vals, expected_vals) and np.array_equal(G, expected_G)
    vals[:], G[:] = np.nan, np.nan  # (copies: the kept values stay as they are)
    assert np.array_equal(cohort.value_grad(X)[1], expected_G)
    assert not kept and len(fresh) == 1
    cohort.value_grad(np.asfortranarray(X))  # (another layout: evaluated)
    cohort.value_grad(X + 1e-3)
    assert len(kept) == 2
    kept.clear(), fresh.clear()
    out = cohort.prox(C, S, X, tol=1e-10)
    expected = fresh_cohort.prox(C, S, X, tol=1e-10)
    for field in ("x", "residual", "iterations"):
        assert np.array_equal(getattr(out, field), getattr(expected, field))
    assert len(kept) == len(fresh) - 1


def test_a_cohort_s_blocks_are_zeroed_views_of_one_allocation_each_on_its_own_pages():
    """The blocks' arrays (:func:`~fedmodel.subproblems.batched_glm._zeros`) have their
    shapes, zeros and no memory in common, each starting on a page of its own (a large
    allocation at a huge page's boundary); a cohort's blocks hold its clients' rows."""
    shapes = [(3, 5, 4), (3, 5), (1, 1), (0, 7), (700, 56, 20)]
    arrays = batched_glm._zeros(shapes)
    assert [a.shape for a in arrays] == shapes
    assert all(a.flags.c_contiguous and a.flags.writeable and not a.any() for a in arrays)
    for i, a in enumerate(arrays):
        assert a.size == 0 or a.ctypes.data % 4096 == arrays[0].ctypes.data % 4096
        assert not any(np.shares_memory(a, b) for b in arrays[i + 1 :])
    assert arrays[0].ctypes.data % batched_glm._HUGE_PAGE == 0
    small = batched_glm._zeros([(2, 3)])[0]
    assert small.shape == (2, 3) and not small.any()
    forms = _forms([5, 7, 9, 5])
    cohort = GLMCohort(forms)
    clients = np.arange(len(forms)) if cohort._order is None else cohort._order
    for j, term in enumerate(cohort.terms):
        for blk in term.blocks:
            idx = clients[blk.at]
            for row, i in enumerate(idx):
                m = forms[i].terms[j].A.shape[0]
                assert np.array_equal(blk.A[row, :m], forms[i].terms[j].A)
                assert not blk.A[row, m:].any() and not blk.w[row, m:].any()
