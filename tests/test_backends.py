"""Subproblem backends against a plain cvxpy solve of the same merit function.

Every backend (Newton, L-BFGS, cvxpy, FISTA, closed form) must reach the minimiser of

    phi(x) = f(x) + (||[mu + beta c(x)]_+||^2 - ||mu||^2) / (2 beta)
                  + (||nu + beta a(x)||^2 - ||nu||^2) / (2 beta) + (sigma/2)||x - center||^2 [+ h]

that an independent cvxpy problem (written here from the model's own expressions, solved
by Clarabel at tight tolerances) finds, within what its reported residual promises; report
the residual it actually reached; be chosen as ``fedmodel/subproblems/select.py`` documents;
and (Newton) reuse its Cholesky factor when only vectors change.

How close "agrees" is follows from the problem, not from one machine: every instance here
is convex, so ``phi`` is ``sigma``-strongly convex (the proximal term; the Hessian of the
rest is positive semidefinite). For any ``x`` with ``g in d phi(x)``,

    ||x - x*||_2 <= ||g||_2 / sigma,        phi(x) - phi* <= ||g||_2^2 / (2 sigma),

so a backend point and the reference point (each with its own measured residual) are at
most ``(||g|| + ||g_ref||) / sigma`` apart, and their values differ by at most the larger
of the two suboptimality bounds (plus floating-point evaluation error).
"""

from __future__ import annotations

import warnings

import cvxpy as cp
import numpy as np
import pytest
from problems import lcqp_test_model

import fedmodel as fm
from fedmodel.errors import UnsupportedError
from fedmodel.models import neyman_pearson_model
from fedmodel.subproblems.closed_form import ProxSolver
from fedmodel.subproblems.cvxpy_backend import CvxpySolver
from fedmodel.subproblems.merit import MeritProblem
from fedmodel.subproblems.newton import NewtonSolver
from fedmodel.subproblems.proximal_gradient import ProximalGradientSolver
from fedmodel.subproblems.quasi_newton import QuasiNewtonSolver
from fedmodel.subproblems.select import make_solver

TOL = 1e-10  # requested residual
SAFETY = 2.0  # on the strong-convexity bounds (module docstring)
ROUNDING = 1e-12  # relative floating-point error of evaluating phi at two points
# what each backend is asked for and must reach: Newton the requested 1e-10; L-BFGS (and
# cvxpy, polished by L-BFGS) stop on their own tests a little above it, and report so
REACHED = {"newton": TOL, "lbfgs": 5e-8, "cvxpy": 5e-8, "fista": 1e-9}

CLARABEL_TIGHT = {
    "tol_gap_abs": 1e-12,
    "tol_gap_rel": 1e-12,
    "tol_feas": 1e-12,
    "tol_ktratio": 1e-10,
    "max_iter": 500,
}


# -- instances ----------------------------------------------------------------------------
def _qp_eq(seed: int):
    """An LCQP client (seed 000 Section 5.1): quadratic form + affine equalities."""
    model = lcqp_test_model(2, d=8, m=2, seed=seed)
    return model, model.compile().clients[0]


def _qp_ineq(seed: int, rank_deficient: bool = False, slack: float = 0.0):
    """Least squares with affine inequalities (piecewise-quadratic AL term)."""
    rng = np.random.default_rng(seed)
    d = 7
    X = rng.normal(size=(30, d))
    if rank_deficient:
        X[:, 3] = X[:, 1] + X[:, 2]
        X[:, 6] = 0.0
    model = fm.Model("qp-ineq")
    w = model.variable(d, name="w")
    site = model.client("c0")
    A = site.data(X, name="X")
    b = site.data(rng.normal(size=30), name="y")
    G = site.data(rng.normal(size=(4, d)), name="G")
    h = site.data(rng.normal(size=4) * 0.3 + slack, name="h")
    site.minimize(cp.sum_squares(A @ w - b) / 30)
    site.subject_to(G @ w <= h)
    return model, model.compile().clients[0]


def _np_client(seed: int, rank_deficient: bool = False, r: float = 0.3):
    """A Neyman-Pearson client (26): mean logistic loss, logistic constraint."""
    rng = np.random.default_rng(seed)
    d = 6
    X0 = np.c_[rng.normal(size=(50, d - 1)), np.ones(50)]
    X1 = np.c_[rng.normal(size=(25, d - 1)) + 0.5, np.ones(25)]
    if rank_deficient:  # a duplicated and a constant-zero column, as in one-hot designs
        for X in (X0, X1):
            X[:, 2] = X[:, 0] - X[:, 1]
            X[:, 3] = 0.0
    model = neyman_pearson_model([(X0, X1), (X0[:10], X1[:10])], r=r)
    return model, model.compile().clients[0]


def _set(problem: MeritProblem, prog, rng, sigma: float, mu_scale: float, nu_scale=1.0):
    n = problem.n
    problem.set(
        sigma=sigma,
        center=rng.normal(size=n),
        mu=[np.abs(rng.normal(size=prog.m_ineq)) * mu_scale],
        nu=[rng.normal(size=prog.m_eq) * nu_scale],
    )


# -- the reference --------------------------------------------------------------------------
def plain_cvxpy(model, problem: MeritProblem, h=None) -> tuple[np.ndarray, float]:
    """argmin and min of the merit function, written directly in the model's variable."""
    (w,) = model.variables
    beta = problem.beta
    obj = 0.5 * problem.sigma * cp.sum_squares(w - problem.center)
    for prog, mu, nu in zip(problem.programs, problem.mu, problem.nu):
        if prog.objective:
            obj = obj + prog.objective_expr()
        if prog.m_ineq:
            g = cp.hstack([cp.vec(c.expr, order="F") for c in prog.ineq])
            obj = obj + (cp.sum_squares(cp.pos(mu + beta * g)) - mu @ mu) / (2 * beta)
        if prog.m_eq:
            a = cp.hstack([cp.vec(c.expr, order="F") for c in prog.eq])
            obj = obj + (cp.sum_squares(nu + beta * a) - nu @ nu) / (2 * beta)
    if h is not None:
        obj = obj + h(w)
    prob = cp.Problem(cp.Minimize(obj))
    prob.solve(solver="CLARABEL", **CLARABEL_TIGHT)
    assert prob.status in ("optimal", "optimal_inaccurate"), prob.status  # checked below
    x = np.asarray(w.value, dtype=float).ravel()
    # the reference must itself be accurate for a 1e-8 comparison to mean anything
    assert problem.residual(x) <= 1e-9, f"reference inaccurate: {problem.residual(x):.1e}"
    return x, float(prob.value)


def _gradient_norm2(problem: MeritProblem, x: np.ndarray) -> float:
    """``||g||_2`` for the least-norm ``g in d phi(x)`` (bounded through the inf-norm when
    ``h`` is non-smooth: ``||g||_2 <= sqrt(n) ||g||_inf``)."""
    if problem.regularizer.is_zero:
        _, g = problem.smooth_value_grad(x)
        return float(np.linalg.norm(g))
    return float(np.sqrt(problem.n) * problem.residual(x))


def _check_against_reference(problem, report, x_ref, f_ref, reached=TOL):
    # the residual reported is the one at the returned point (recomputed here)
    true_residual = problem.residual(report.x)
    assert report.residual == pytest.approx(true_residual, rel=1e-6, abs=1e-14)
    assert report.converged == (report.residual <= report.tolerance)
    assert report.residual <= reached, (report.backend, report.residual, report.message)
    # what the two measured residuals promise on a sigma-strongly convex phi
    strong = problem.sigma
    g, g_ref = _gradient_norm2(problem, report.x), _gradient_norm2(problem, x_ref)
    dist_bound = SAFETY * (g + g_ref) / strong
    gap_bound = SAFETY * max(g, g_ref) ** 2 / (2 * strong)
    value, value_ref = problem.value(report.x), problem.value(x_ref)
    # the reference solved the same function (Clarabel's value at its own point)
    assert abs(value_ref - f_ref) <= 1e-9 * max(1.0, abs(f_ref)), (value_ref, f_ref)
    assert abs(value - value_ref) <= gap_bound + ROUNDING * max(1.0, abs(value_ref)), (
        report.backend,
        value,
        value_ref,
        gap_bound,
    )
    dist = np.linalg.norm(report.x - x_ref)
    assert dist <= dist_bound + ROUNDING * max(1.0, np.abs(x_ref).max()), (
        report.backend,
        dist,
        dist_bound,
    )


BACKENDS = {"newton": NewtonSolver, "lbfgs": QuasiNewtonSolver, "cvxpy": CvxpySolver}

# (instance builder, sigma, mu scale): mu scale 0 with a generous bound makes the AL term
# inactive at the solution, a large one makes it active
CASES = {
    "qp-eq": (lambda s: _qp_eq(s), 0.7, 1.0),
    "qp-ineq-active": (lambda s: _qp_ineq(s), 0.5, 3.0),
    "qp-ineq-inactive": (lambda s: _qp_ineq(s, slack=10.0), 0.5, 0.0),
    "qp-rank-deficient": (lambda s: _qp_ineq(s, rank_deficient=True), 0.3, 1.0),
    "np-active": (lambda s: _np_client(s), 0.5, 2.0),
    "np-inactive": (lambda s: _np_client(s, r=5.0), 0.5, 0.0),
    "np-rank-deficient": (lambda s: _np_client(s, rank_deficient=True), 0.2, 2.0),
}


# seeds whose plain cvxpy reference is accurate to 1e-9 (Clarabel's exponential-cone
# answers sometimes stop near 1e-6; plain_cvxpy asserts the reference's own residual)
SEEDS = [2, 4]


@pytest.mark.parametrize("backend", list(BACKENDS))
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("seed", SEEDS)
def test_backend_agrees_with_plain_cvxpy(case, backend, seed):
    build, sigma, mu_scale = CASES[case]
    model, prog = build(seed)
    rng = np.random.default_rng(100 + seed)
    beta = float(rng.uniform(2.0, 20.0))
    problem = MeritProblem([prog], beta)
    _set(problem, prog, rng, sigma, mu_scale)
    x_ref, f_ref = plain_cvxpy(model, problem)
    solver = BACKENDS[backend](problem)
    report = solver.solve(np.zeros(problem.n), TOL)
    _check_against_reference(problem, report, x_ref, f_ref, REACHED[backend])
    if case.endswith("inactive"):
        ci, _ = prog.functions.constraint_values(report.x)
        assert np.all(problem.mu[0] + beta * ci <= 0), "the AL term should be inactive here"
    if case.endswith("-active"):
        ci, _ = prog.functions.constraint_values(report.x)
        assert np.any(problem.mu[0] + beta * ci > 0), "the AL term should be active here"


@pytest.mark.parametrize("seed", SEEDS)
def test_newton_with_ridge_h_agrees_with_cvxpy(seed):
    """A smooth h (sum of squares) is part of the Newton merit function (server/pooled)."""
    model, prog = _np_client(seed)
    (w,) = model.variables
    model.regularize(0.05 * cp.sum_squares(w))
    compiled = model.compile()
    prog = compiled.clients[0]
    rng = np.random.default_rng(seed)
    problem = MeritProblem([prog], 5.0, compiled.regularizer)
    _set(problem, prog, rng, 0.3, 1.0)
    x_ref, f_ref = plain_cvxpy(model, problem, h=lambda v: 0.05 * cp.sum_squares(v))
    for name, cls in BACKENDS.items():
        report = cls(problem).solve(np.zeros(problem.n), TOL)
        _check_against_reference(problem, report, x_ref, f_ref, REACHED[name])


def _group_norm_problem(seed: int):
    model, prog = _qp_ineq(seed)
    (w,) = model.variables
    model.regularize(0.3 * cp.norm(w, 2))
    compiled = model.compile()
    prog = compiled.clients[0]
    rng = np.random.default_rng(seed)
    problem = MeritProblem([prog], 4.0, compiled.regularizer)
    _set(problem, prog, rng, 0.5, 1.0)
    x_ref, f_ref = plain_cvxpy(model, problem, h=lambda v: 0.3 * cp.norm(v, 2))
    return problem, x_ref, f_ref


@pytest.mark.parametrize("seed", [0, 3])  # seeds with an accurate conic reference
def test_group_norm_h_cvxpy_backend_agrees_with_plain_cvxpy(seed):
    """A group norm in h: the cvxpy backend (the automatic choice) against the plain solve."""
    problem, x_ref, f_ref = _group_norm_problem(seed)
    solver = make_solver(problem)
    assert isinstance(solver, CvxpySolver)
    report = solver.solve(np.zeros(problem.n), REACHED["cvxpy"])
    _check_against_reference(problem, report, x_ref, f_ref, REACHED["cvxpy"])


def test_group_norm_h_cvxpy_backend_tight_tolerance():
    """Asked for 1e-10: the cvxpy backend passes Clarabel gap/feasibility tolerances of a
    hundredth of the request (``clarabel_tolerances``), so Clarabel's own point meets it
    and the FISTA polish (which stalls near 1e-6, see the xfail below) is not needed."""
    problem, x_ref, f_ref = _group_norm_problem(0)
    report = CvxpySolver(problem).solve(np.zeros(problem.n), TOL)
    _check_against_reference(problem, report, x_ref, f_ref, REACHED["cvxpy"])


def test_group_norm_h_fista_reaches_tolerance_seed3():
    problem, x_ref, f_ref = _group_norm_problem(3)
    report = ProximalGradientSolver(problem).solve(np.zeros(problem.n), 1e-9, 20_000)
    _check_against_reference(problem, report, x_ref, f_ref, REACHED["fista"])


def test_group_norm_h_fista_reaches_tolerance_seed0():
    problem, x_ref, f_ref = _group_norm_problem(0)
    report = ProximalGradientSolver(problem).solve(np.zeros(problem.n), 1e-9, 20_000)
    _check_against_reference(problem, report, x_ref, f_ref, REACHED["fista"])


def test_closed_form_server_step_agrees_with_cvxpy():
    """No party terms: the closed form (prox of h at the centre)."""
    rng = np.random.default_rng(3)
    X0, X1 = rng.normal(size=(20, 4)), rng.normal(size=(10, 4)) + 1
    model = neyman_pearson_model([(X0, X1)], r=0.5)
    (w,) = model.variables
    model.regularize(0.2 * cp.norm1(w) + 0.1 * cp.sum_squares(w))
    compiled = model.compile()
    problem = MeritProblem([compiled.server], 3.0, compiled.regularizer)
    problem.set(sigma=0.8, center=rng.normal(size=4))
    solver = make_solver(problem)
    assert isinstance(solver, ProxSolver)
    report = solver.solve(np.zeros(4), TOL)
    x_ref, f_ref = plain_cvxpy(
        model, problem, h=lambda v: 0.2 * cp.norm1(v) + 0.1 * cp.sum_squares(v)
    )
    _check_against_reference(problem, report, x_ref, f_ref)


# -- backend selection (select.py's docstring) ----------------------------------------------
def _selected(model, party="clients", solver="auto"):
    compiled = model.compile()
    prog = compiled.clients[0] if party == "clients" else compiled.server
    problem = MeritProblem([prog], 10.0, compiled.regularizer if party == "server" else None)
    return make_solver(problem, solver)


def test_selection_per_model_class():
    from problems import fairness_test_model, np_model

    # 1. no party terms (the server of a model without server constraints): closed form
    assert isinstance(_selected(np_model(2), "server"), ProxSolver)
    # 2. GLM-form terms with a smooth h: Newton -- QP clients (Table 1), logistic NP clients
    #    (Table 2), the non-convex fairness clients and server (Table 3)
    assert isinstance(_selected(lcqp_test_model(2)), NewtonSolver)
    assert isinstance(_selected(lcqp_test_model(2), "server"), NewtonSolver)
    assert isinstance(_selected(np_model(2)), NewtonSolver)
    assert isinstance(_selected(fairness_test_model(2)), NewtonSolver)
    assert isinstance(_selected(fairness_test_model(2), "server"), NewtonSolver)
    # quadratic merit functions are flagged for factor caching, logistic ones are not
    assert _selected(lcqp_test_model(2)).quadratic
    assert not _selected(np_model(2)).quadratic
    # 3. a smooth term outside the GLM catalogue: L-BFGS
    model = fm.Model("quartic")
    w = model.variable(3, name="w")
    c = model.client("c0")
    c.minimize(cp.sum(cp.power(w - 1, 4)) + cp.log_sum_exp(w))
    assert isinstance(_selected(model), QuasiNewtonSolver)
    # ... and a GLM model whose h is not smooth (l1, box): L-BFGS on the server
    model = lcqp_test_model(2)
    model.regularize(0.1 * cp.norm1(model.variables[0]))
    assert isinstance(_selected(model, "server"), QuasiNewtonSolver)
    # 4. a group norm in h: cvxpy when convex, FISTA with non-convex terms
    model = lcqp_test_model(2)
    model.regularize(0.1 * cp.norm(model.variables[0], 2))
    assert isinstance(_selected(model, "server"), CvxpySolver)
    model = fairness_test_model(2)
    model.regularize(0.1 * cp.norm(model.variables[0], 2))
    assert isinstance(_selected(model, "server"), ProximalGradientSolver)
    # overrides
    assert isinstance(_selected(np_model(2), solver="lbfgs"), QuasiNewtonSolver)
    assert isinstance(_selected(np_model(2), solver="cvxpy"), CvxpySolver)
    assert isinstance(_selected(np_model(2), solver="newton"), NewtonSolver)
    model = fm.Model("quartic")
    w = model.variable(3, name="w")
    model.client("c0").minimize(cp.sum(cp.power(w, 4)))
    with pytest.raises(UnsupportedError, match="Newton backend"):
        _selected(model, solver="newton")
    with pytest.raises(UnsupportedError, match="unknown subproblem solver"):
        _selected(np_model(2), solver="osqp")


def test_methods_use_the_documented_backend():
    """prox-al's clients get Newton on these model classes (seen in the local stats)."""
    from problems import np_model

    res = np_model(2).solve(method="prox-al", eps=1e-4, history=False)
    assert res.status == "optimal"
    res = lcqp_test_model(2).solve(method="prox-al", eps=1e-4, history=False)
    assert res.status == "optimal"


# -- factorization reuse ------------------------------------------------------------------
def test_cholesky_factor_reused_when_only_vectors_change():
    model, prog = _qp_eq(0)
    problem = MeritProblem([prog], 10.0)
    solver = NewtonSolver(problem)
    assert solver.quadratic
    rng = np.random.default_rng(0)
    x = np.zeros(problem.n)
    for _ in range(25):  # ADMM pattern: new centre and multipliers, same sigma and beta
        _set(problem, prog, rng, 0.7, 1.0)
        report = solver.solve(x, 1e-10)
        assert report.converged
        x = report.x
    assert solver.factorizations == 1
    problem.set(sigma=0.9, center=problem.center)  # new sigma: one new factor
    solver.solve(x, 1e-10)
    assert solver.factorizations == 2
    x_ref, f_ref = plain_cvxpy(model, problem)
    _check_against_reference(problem, solver.solve(x_ref + 1.0, 1e-10), x_ref, f_ref)
    assert solver.factorizations == 2


def test_cholesky_factor_per_active_set():
    """Affine inequalities: one factor per active set, reused while it repeats."""
    model, prog = _qp_ineq(1)
    problem = MeritProblem([prog], 10.0)
    solver = NewtonSolver(problem)
    assert solver.quadratic
    rng = np.random.default_rng(1)
    centers = [rng.normal(size=problem.n) for _ in range(3)]
    mus = [np.abs(rng.normal(size=prog.m_ineq)) * s for s in (0.0, 1.0, 3.0)]
    seen = set()
    for _ in range(4):  # alternating problems (and so active sets), always from 0
        for c, mu in zip(centers, mus):
            problem.set(sigma=0.5, center=c, mu=[mu])
            report = solver.solve(np.zeros(problem.n), 1e-10)
            assert report.converged
            ci, _ = prog.functions.constraint_values(report.x)
            seen.add((mu + 10.0 * ci > 0).tobytes())
    # one factor per (sigma, beta, active set) met along the way: repeating the same three
    # problems four times adds none
    assert solver.factorizations <= len(seen) + 3 * 2  # + active sets passed on the way
    before = solver.factorizations
    for c, mu in zip(centers, mus):
        problem.set(sigma=0.5, center=c, mu=[mu])
        solver.solve(np.zeros(problem.n), 1e-10)
    assert solver.factorizations == before


def test_newton_chord_steps_within_a_solve_and_history_independence():
    """Logistic terms: a solve reuses its own factor (chord steps) while they contract,
    still reaches the exact tolerance, and its answer does not depend on earlier solves
    (a fresh solver given the same x0 and parameters returns the same bits: what makes
    resumed and retried runs repeat the uninterrupted iterates)."""
    model, prog = _np_client(2)
    problem = MeritProblem([prog], 10.0)
    solver = NewtonSolver(problem)
    rng = np.random.default_rng(0)
    c = rng.normal(size=problem.n)
    problem.set(sigma=0.5, center=c, mu=[np.ones(1)])
    x = solver.solve(np.zeros(problem.n), 1e-10).x
    iterations = factorizations = 0
    for _ in range(10):  # small moves of the centre, as in late ADMM rounds
        c = c + 1e-3 * rng.normal(size=problem.n)
        problem.set(sigma=0.5, center=c, mu=[np.ones(1)])
        before = solver.factorizations
        report = solver.solve(x, 1e-10)
        assert report.residual <= 1e-10
        assert report.residual == pytest.approx(problem.residual(report.x), rel=1e-6, abs=1e-15)
        iterations += report.iterations
        factorizations += solver.factorizations - before
        fresh = NewtonSolver(problem).solve(x, 1e-10)
        assert np.array_equal(fresh.x, report.x) and fresh.iterations == report.iterations
        x = report.x
    assert factorizations < iterations  # some steps reused a factor
    x_ref, f_ref = plain_cvxpy(model, problem)
    _check_against_reference(problem, report, x_ref, f_ref)


def test_newton_cross_check_hands_over_on_disagreement():
    """If the GLM form and the model's evaluator ever disagreed, Newton would not be
    trusted: it warns and solves with L-BFGS (simulated by corrupting the GLM form)."""
    model, prog = _np_client(0)
    problem = MeritProblem([prog], 10.0)
    _set(problem, prog, np.random.default_rng(0), 0.5, 1.0)
    solver = NewtonSolver(problem)
    solver.obj.terms[0].weights = solver.obj.terms[0].weights * 1.5
    with pytest.warns(RuntimeWarning, match="disagrees"):
        report = solver.solve(np.zeros(problem.n), 1e-9)
    assert report.backend == "newton->lbfgs"
    assert report.residual == pytest.approx(problem.residual(report.x), rel=1e-6)
    assert report.converged


def test_newton_keeps_its_answer_on_large_data():
    """On data of size 1e4 (merit about 1e12) the GLM form's residual and the model's
    evaluator's differ by rounding only, relative to the merit: Newton keeps its answer
    (no hand-over to L-BFGS, which stalls far above the tolerance on such a merit)."""
    scale = 1e4
    rng = np.random.default_rng(0)
    d = 7
    model = fm.Model("qp-large")
    w = model.variable(d, name="w")
    site = model.client("c0")
    A = site.data(rng.normal(size=(30, d)) * scale, name="X")
    b = site.data(rng.normal(size=30) * 10 * scale, name="y")
    G = site.data(rng.normal(size=(4, d)) * scale, name="G")
    h = site.data(rng.normal(size=4) * scale, name="h")
    site.minimize(cp.sum_squares(A @ w - b) / 30)
    site.subject_to(G @ w <= h)
    prog = model.compile().clients[0]
    problem = MeritProblem([prog], 10.0)
    problem.set(sigma=0.5, center=rng.normal(size=d), mu=[np.zeros(4)], nu=[np.zeros(0)])
    tol = 1e-11 * scale**2
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        report = NewtonSolver(problem).solve(np.zeros(d), tol)
    assert report.backend == "newton" and report.converged
    # the evaluator's residual at the answer: the tolerance up to rounding of the merit
    value = problem.value(report.x)
    assert problem.residual(report.x) <= tol + 1e-8 * abs(value)
    # at least as low as a pooled Clarabel solve of the same merit (less accurate here)
    (var,) = model.variables
    rows = prog.ineq[0].expr
    merit = 0.5 * problem.sigma * cp.sum_squares(var - problem.center) + prog.objective_expr()
    merit = merit + cp.sum_squares(cp.pos(problem.beta * rows)) / (2 * problem.beta)
    f_ref = cp.Problem(cp.Minimize(merit)).solve(solver="CLARABEL")
    assert value <= f_ref + 1e-9 * abs(f_ref)


@pytest.mark.parametrize("case", ["qp-eq", "qp-ineq-active", "np-active", "np-inactive"])
def test_newton_merit_value_grad_matches_the_model_evaluator(case):
    """``merit_value_grad`` (f + AL terms from the GLM form, any multipliers) equals the
    model's own ``PartyFunctions.merit``, and leaves the solver's answers unchanged."""
    build, sigma, mu_scale = CASES[case]
    model, prog = build(2)
    problem = MeritProblem([prog], 7.0)
    rng = np.random.default_rng(5)
    _set(problem, prog, rng, sigma, mu_scale)
    solver = NewtonSolver(problem)
    x0 = solver.solve(np.zeros(problem.n), 1e-10).x
    for _ in range(3):
        w = rng.normal(size=problem.n)
        mu = np.abs(rng.normal(size=prog.m_ineq)) * 2
        nu = rng.normal(size=prog.m_eq)
        val, g = solver.merit_value_grad(w, [mu], [nu])
        ref_val, ref_g = prog.functions.merit(w, mu, nu, 7.0)
        assert val == pytest.approx(ref_val, rel=1e-12, abs=1e-12)
        assert np.abs(g - ref_g).max() <= 1e-10 * max(1.0, np.abs(ref_g).max())
    again = solver.solve(x0, 1e-10)
    assert np.array_equal(again.x, NewtonSolver(problem).solve(x0, 1e-10).x)


def test_carried_factor_is_state_and_keeps_solves_exact():
    """With ``carry_factor`` (prox-al clients), a solve starts from the previous solve's
    factor: still to the requested tolerance, fewer factorisations, and restoring
    ``get_state()`` into a fresh solver repeats the next solve bit for bit."""
    build, sigma, mu_scale = CASES["np-active"]
    model, prog = build(2)
    rng = np.random.default_rng(11)
    carried, fresh = (NewtonSolver(MeritProblem([prog], 7.0)) for _ in range(2))
    carried.carry_factor = True
    x = np.zeros(carried.problem.n)
    for _ in range(6):  # ADMM-like: the same subproblem with moving centres
        center = rng.normal(size=x.size) * 0.3
        for s in (carried, fresh):
            s.problem.set(sigma=sigma, center=center, mu=[np.full(prog.m_ineq, mu_scale)])
        a, b = carried.solve(x, 1e-10), fresh.solve(x, 1e-10)
        assert a.residual <= 1e-10 and b.residual <= 1e-10
        assert a.residual == pytest.approx(carried.problem.residual(a.x), rel=1e-6, abs=1e-13)
        assert np.abs(a.x - b.x).max() <= 1e-8
        x = a.x
    assert carried.factorizations < fresh.factorizations
    state = carried.get_state()
    assert state["factor"] is not None
    twin = NewtonSolver(MeritProblem([prog], 7.0))
    twin.carry_factor = True
    twin.solve(x, 1e-10)  # verified, with a factor of its own
    twin.set_state(state)
    center = rng.normal(size=x.size) * 0.3
    for s in (carried, twin):
        s.problem.set(sigma=sigma, center=center, mu=[np.full(prog.m_ineq, mu_scale)])
    assert np.array_equal(carried.solve(x, 1e-10).x, twin.solve(x, 1e-10).x)


def test_newton_step_prediction_that_stops_a_step_is_forgotten():
    """A step is not begun when the recorded step walls predict it would end after the
    deadline; that prediction is dropped (its largest wall first), so one slow outlier
    cannot stop every later solve of the party: after at most as many skipped solves as
    walls are kept, a solve with its deadline ahead takes its steps and converges."""
    import time

    model, _ = _np_client(seed=2)
    prog = model.compile().clients[0]
    problem = MeritProblem([prog], 4.0)
    _set(problem, prog, np.random.default_rng(2), 0.5, 1.0)
    solver = make_solver(problem, "newton")
    assert isinstance(solver, NewtonSolver)
    x0 = np.zeros(problem.n)
    solver.solve(x0, TOL)  # (first solve: the cross-check, and the walls of real steps)
    kept = solver._step_walls.maxlen
    # outliers a year long against a deadline a day ahead: every prediction overshoots it,
    # whatever the machine's load
    solver._step_walls.extend([3e7] * kept)
    reports = []
    for _ in range(kept + 1):
        solver.deadline = time.perf_counter() + 86400.0
        reports.append(solver.solve(x0, TOL))
        if reports[-1].iterations:
            break
    skipped, last = reports[:-1], reports[-1]
    assert all(r.message == "time limit" and r.iterations == 0 for r in skipped)
    assert len(skipped) <= kept
    assert last.message == "converged" and last.iterations > 0 and last.residual <= TOL
