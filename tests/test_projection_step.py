"""The projection backend of an exact step (subproblems/projection.py): a program of only
bounds and l2 balls on whole shared variables, no objective and no ``h``, is stepped by
the projection of its centre, with the KKT multipliers of its compiled rows in closed form.

Its point and multipliers are compared with the hard-constraint cvxpy backend's (Clarabel
on the same rows), which solves the same strongly convex step to Clarabel's tolerances
(1e-10 here, a hundredth of the residual asked): they agree to 1e-7 relative. The
projection's own KKT conditions hold to rounding (1e-12).
"""

from __future__ import annotations

import cvxpy as cp
import numpy as np
import pytest

import fedmodel as fm
from fedmodel.errors import UnsupportedError
from fedmodel.subproblems.conic_prox import exact_prox_solver
from fedmodel.subproblems.cvxpy_backend import CvxpySolver
from fedmodel.subproblems.merit import MeritProblem, set_deadline
from fedmodel.subproblems.projection import ProjectionSolver

AGREE = 1e-7
KKT = 1e-12


def _server_model(sets, clients=1, objective=None):
    """A model with ``clients`` least-squares clients on ``w`` (5), ``W`` (2 x 3) and ``v``
    (4) and the server constraints ``sets(w, W, v)`` (and an objective term when given)."""
    rng = np.random.default_rng(3)
    m = fm.Model("sets")
    w = m.variable(5, name="w")
    W = m.variable((2, 3), name="W")
    v = m.variable(4, name="v")
    for k in range(clients):
        c = m.client(f"c{k}")
        X = c.data(rng.normal(size=(8, 5)), name="X")
        fit = cp.sum_squares(X @ w - 1.0) + cp.sum_squares(W - 0.3) + cp.sum_squares(v)
        c.minimize(fit, name="loss")
    m.server.subject_to(sets(w, W, v))
    if objective is not None:
        m.server.minimize(objective(w, W, v))
    return m


def _steps(model):
    """The server's exact-step backend and the cvxpy one, each on its own merit problem."""
    compiled = model.compile()
    problems = [MeritProblem([compiled.server], 100.0, compiled.regularizer) for _ in range(2)]
    return problems, [exact_prox_solver(problems[0]), exact_prox_solver(problems[1], "cvxpy")]


def _kkt(problem, x):
    """Stationarity, feasibility, complementarity and sign of the step at ``x`` with the
    problem's multipliers (in the compiled rows ``g(x) <= 0``)."""
    fn = problem.functions[0]
    mu = problem.mu[0]
    g = fn.constraint_values(x)[0]
    stationarity = problem.sigma * (x - problem.center) + fn.constraint_vjp(x, mu, np.zeros(0))
    return (
        np.abs(stationarity).max(),
        max(g.max(initial=0.0), 0.0),
        np.abs(mu * g).max(initial=0.0),
        max(-mu.min(initial=0.0), 0.0),
    )


SETS = {
    "box": lambda w, W, v: [w <= 0.5, w >= -0.5, W <= 1.0, -1.0 <= W],
    "one-sided": lambda w, W, v: [w >= 0, W <= np.arange(6.0).reshape(2, 3) / 5 - 0.2],
    "array bounds": lambda w, W, v: [w <= np.linspace(0.1, 1.0, 5), w >= -np.linspace(1, 2, 5)],
    "far bounds": lambda w, W, v: [w <= 1e6 + np.arange(5.0), -1e6 <= w, v >= 3e5],
    "balls": lambda w, W, v: [cp.norm(w, 2) <= 0.5, cp.norm(v, 2) <= 2.0],
    "ball and box": lambda w, W, v: [cp.norm(w, 2) <= 1.5, W >= -0.1, W <= 0.2, v >= 0],
}


@pytest.mark.parametrize("name", list(SETS))
def test_the_projection_step_equals_clarabels_step_and_meets_kkt(name):
    """On random centres (inside, on and outside the sets: active and inactive rows) and
    scalar or per-coordinate sigma, the projection's KKT conditions hold to 1e-12, and its
    point and every multiplier equal the cvxpy backend's within 1e-7 relative plus that
    backend's own measured residual (Clarabel at its floor stops up to ~1e-5 from the exact
    multiplier of a ball, the projection's residual is rounding)."""
    problems, (step, reference) = _steps(_server_model(SETS[name]))
    assert isinstance(step, ProjectionSolver) and isinstance(reference, CvxpySolver)
    n = problems[0].n
    rng = np.random.default_rng(7)
    active = inactive = 0
    for trial in range(6):
        center = rng.normal(size=n) * (0.05, 0.3, 1.0, 3.0, 0.3, 1.0)[trial]
        sigma = 10.0 ** rng.uniform(-1, 2)
        if trial >= 4 and "ball" not in name:  # (a diagonal metric: separable sets only)
            sigma = 10.0 ** rng.uniform(-1, 2, size=n)
        for problem in problems:
            problem.set(sigma=sigma, center=center, mu=[np.full(problem.programs[0].m_ineq, 7.0)])
        got = step.solve(np.zeros(n), 1e-10)
        want = reference.solve(np.zeros(n), 1e-10)
        mu, mu_ref = problems[0].mu[0], problems[1].mu[0]
        scale = max(1.0, np.abs(mu).max())
        assert got.backend == "projection" and got.converged
        assert max(_kkt(problems[0], got.x)) <= KKT * scale
        assert got.residual <= KKT * scale and got.residual <= want.residual
        # (a step sigma-strongly convex: sigma |dx| and |dmu| within Clarabel's residual)
        slack = AGREE * max(scale, np.abs(want.x).max()) + 4 * want.residual
        assert np.abs(sigma * (got.x - want.x)).max() <= slack
        assert mu.shape == mu_ref.shape
        assert np.abs(mu - mu_ref).max() <= slack
        active += int(np.count_nonzero(mu))
        inactive += int(np.count_nonzero(mu == 0))
    assert active and inactive  # (both kinds of rows were met)


NOT_TAKEN = {
    "an objective term": (SETS["box"], lambda w, W, v: cp.sum_squares(w)),
    "a general linear constraint": (lambda w, W, v: [cp.sum(w) <= 1, w >= 0], None),
    "a ball on part of a variable": (lambda w, W, v: [cp.norm(w[:3], 2) <= 1], None),
    "a ball on a matrix variable": (lambda w, W, v: [cp.norm(W, "fro") <= 1], None),
    "two balls on one variable": (lambda w, W, v: [cp.norm(w, 2) <= 1, cp.norm(w, 2) <= 2], None),
    "a ball and a bound on one variable": (lambda w, W, v: [cp.norm(w, 2) <= 1, w >= 0], None),
    "two upper bounds on one variable": (lambda w, W, v: [w <= 1, w <= 2], None),
    "equal bounds": (lambda w, W, v: [w <= 1, w >= 1], None),
    "a bound on a scaled variable": (lambda w, W, v: [2 * w <= 1], None),
    "an equality": (lambda w, W, v: [w == 0.5], None),
}


@pytest.mark.parametrize("name", list(NOT_TAKEN))
def test_a_program_with_anything_else_goes_to_clarabel(name):
    sets, objective = NOT_TAKEN[name]
    _, (step, _) = _steps(_server_model(sets, objective=objective))
    assert isinstance(step, CvxpySolver), type(step)


def test_a_metric_that_differs_across_a_ball_takes_the_cvxpy_step():
    """A per-coordinate sigma that differs across a ball's variable has no closed-form
    projection: that step is the cvxpy backend's (built then), with its multipliers; a full
    metric gets that backend's refusal."""
    problems, (step, reference) = _steps(_server_model(SETS["balls"]))
    n = problems[0].n
    center = np.random.default_rng(2).normal(size=n)
    sigma = np.linspace(1.0, 2.0, n)
    for problem in problems:
        problem.set(sigma=sigma, center=center)
    set_deadline(step, 1e12)  # (the run's deadline reaches the fallback's iterative solve)
    got, want = step.solve(np.zeros(n), 1e-9), reference.solve(np.zeros(n), 1e-9)
    assert got.backend == "cvxpy" and step._fallback.deadline == 1e12
    assert np.array_equal(got.x, want.x) and np.array_equal(problems[0].mu[0], problems[1].mu[0])
    problems[0].set(sigma=np.eye(n), center=center)  # (a full metric: the cvxpy backend's refusal)
    with pytest.raises(UnsupportedError, match="scalar or diagonal"):
        step.solve(np.zeros(n), 1e-9)


def _glm_case(kind, sets, clients=8):
    rng = np.random.default_rng(11)
    w0 = rng.normal(size=6)
    m = fm.Model(kind)
    w = m.variable(6, name="w")
    for k in range(clients):
        X = rng.normal(size=(20, 6))
        c = m.client(f"c{k}")
        if kind == "ls":
            y = X @ w0 + 0.3 * rng.normal(size=20)
            loss = cp.sum_squares(c.data(X, name="X") @ w - c.data(y, name="y")) / 160
        else:
            y = np.where(X @ w0 + 0.5 * rng.normal(size=20) > 0, 1.0, -1.0)
            margin = cp.multiply(c.data(y, name="y"), c.data(X, name="X") @ w)
            loss = cp.sum(cp.logistic(-margin)) / 160
        c.minimize(loss, name="loss")
    m.server.subject_to(sets(w))
    return m


@pytest.mark.parametrize(
    "kind, sets",
    [("ls", lambda w: [w <= 0.5, w >= -0.5]), ("logistic", lambda w: [cp.norm(w, 2) <= 0.5])],
)
def test_full_solves_with_the_projection_step_take_clarabels_rounds(kind, sets, monkeypatch):
    """ls-box and logistic-ball over 8 clients through exact-admm: "optimal" in the rounds
    of the same run with the server's step through Clarabel, at its objective."""
    res = _glm_case(kind, sets).solve("prox-al", inner_solver="exact-admm")
    monkeypatch.setattr(
        ProjectionSolver, "recognise", classmethod(lambda cls, problem, fallback: None)
    )
    ref = _glm_case(kind, sets).solve("prox-al", inner_solver="exact-admm")
    assert res.status == ref.status == "optimal", (res.message, ref.message)
    assert res.rounds["communication"] == ref.rounds["communication"]
    assert abs(res.objective - ref.objective) <= 1e-6 * max(1.0, abs(ref.objective))
