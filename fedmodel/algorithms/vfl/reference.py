"""The certified reference: seed 002's model solved centrally on the pooled blocks.

Centralized by design (it reads every party's block): the yardstick every fair-vfl answer
is compared with.

* :func:`solve_unconstrained`: ``min L(theta)`` (the regularised logistic regression;
  ``eps`` large enough that the constraint is inactive), L-BFGS then Newton steps, certified
  by ``||grad L||_inf``;
* :func:`solve_constrained`: ``min L(theta) s.t. D - eps <= 0, -D - eps <= 0`` (non-convex:
  ``D`` is a difference of convex functions) by an augmented Lagrangian with L-BFGS inner
  solves (the cprox-al recipe without the proximal term), certified locally by the KKT
  residuals of notes 6.2: stationarity ``||grad L + (lam_1 - lam_2) grad D||_inf``,
  feasibility and complementarity ``dist_inf(c, N(lam))`` (``|c_j|`` where ``lam_j > 0``,
  ``[c_j]_+`` otherwise).

Examples
--------
>>> import numpy as np
>>> from fedmodel.algorithms.vfl.problem import VerticalProblem
>>> rng = np.random.default_rng(1)
>>> X = rng.normal(size=(300, 6)); a = rng.random(300) < 0.5
>>> y = np.where(X[:, 0] + a > 0.5, 1.0, -1.0)
>>> prob = VerticalProblem.from_columns(X, y, a, [3, 3])
>>> ref = solve_constrained(prob, eps=0.05)
>>> ref.status, abs(ref.extra["train"]["deo_gap"]) <= 0.05 + ref.kkt.feasibility
('optimal', True)
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from scipy.optimize import minimize

from fedmodel.algorithms.vfl.metrics import score_metrics
from fedmodel.algorithms.vfl.problem import VerticalProblem
from fedmodel.certificate.kkt import KKTResiduals, feasibility_residual
from fedmodel.result import Result


class PooledVerticalModel:
    """``f(theta, lambda) = L(theta) + lam_1 (D - eps) - lam_2 (D + eps)`` (5) on the
    stacked ``X = [X_1 ... X_K]``, with its exact gradients. Centralized by design.

    ``constraint``/``temperature``: which ``D`` (the loss-based DEO or the TPR surrogate,
    :class:`~fedmodel.algorithms.vfl.problem.ScoreFunctions`)."""

    def __init__(self, problem: VerticalProblem, constraint: str = "loss", temperature=0.25):
        self.problem = problem
        self.X = np.hstack(problem.blocks)
        self.f = problem.score_functions(constraint, temperature)
        self.l2 = float(problem.l2)

    def loss(self, theta: np.ndarray) -> float:
        """``L(theta)`` (1)."""
        return self.f.data_loss(self.X @ theta) + self.l2 * float(theta @ theta)

    def deo_gap(self, theta: np.ndarray) -> float:
        """The constrained ``D(theta)`` (the loss-based DEO unless ``constraint="tpr"``)."""
        return self.f.constraint_gap(self.X @ theta)

    def lagrangian(self, theta: np.ndarray, lam: np.ndarray, eps: float, c: float = 0.0) -> float:
        """``f~ = f - (c/2)||lam||^2``."""
        d = self.deo_gap(theta)
        lam = np.asarray(lam, dtype=float)
        return (
            self.loss(theta) + lam[0] * (d - eps) - lam[1] * (d + eps) - 0.5 * c * float(lam @ lam)
        )

    def grad_theta(self, theta: np.ndarray, lam: np.ndarray) -> np.ndarray:
        """``grad_theta f(theta, lam) = grad L + (lam_1 - lam_2) grad D`` (8), all blocks."""
        lam = np.asarray(lam, dtype=float)
        w = self.f.score_weights(self.X @ theta, float(lam[0] - lam[1]))
        return self.X.T @ w + 2.0 * self.l2 * theta

    def grad_deo(self, theta: np.ndarray) -> np.ndarray:
        """``grad_theta D`` of the constrained ``D``."""
        return self.X.T @ self.f.constraint_derivative(self.X @ theta)

    def hessian_theta(self, theta: np.ndarray, lam_diff: float = 0.0) -> np.ndarray:
        c = self.f.score_curvature(self.X @ theta, lam_diff)
        return (self.X * c[:, None]).T @ self.X + 2.0 * self.l2 * np.eye(self.X.shape[1])

    def grad_lambda(self, theta: np.ndarray, lam: np.ndarray, eps: float, c: float) -> np.ndarray:
        """(7)."""
        return self.f.dual_gradient(self.X @ theta, lam, eps, c)


def solve_unconstrained(
    problem: VerticalProblem, tol: float = 1e-9, max_newton: int = 20
) -> Result:
    """The regularised logistic regression ``min L(theta)``, certified by the gradient."""
    t0 = time.perf_counter()
    pm = PooledVerticalModel(problem)
    zero = np.zeros(2)
    m = pm.X.shape[1]
    out = minimize(
        lambda th: (pm.loss(th), pm.grad_theta(th, zero)),
        np.zeros(m),
        jac=True,
        method="L-BFGS-B",
        options={"gtol": tol, "ftol": 1e-15, "maxiter": 5000},
    )
    theta = out.x
    for _ in range(max_newton):  # Newton polish: L is strongly convex (l2 > 0)
        g = pm.grad_theta(theta, zero)
        if np.abs(g).max() <= tol * 1e-2:
            break
        theta = theta - np.linalg.solve(pm.hessian_theta(theta), g)
    g = pm.grad_theta(theta, zero)
    stat = float(np.abs(g).max())
    kkt = KKTResiduals(stat, 0.0, {}, local=False)
    status = "optimal" if stat <= tol else "inaccurate"
    msg = f"L-BFGS + Newton: ||grad L||_inf = {stat:.2e} (tol {tol:g})"
    return _result(problem, pm, "vfl-reference", status, theta, np.zeros(2), kkt, msg, t0, {})


def solve_constrained(
    problem: VerticalProblem,
    eps: float,
    tol: float = 1e-7,
    rho: float = 10.0,
    max_outer: int = 50,
    theta0: np.ndarray | None = None,
    constraint: str = "loss",
    tpr_temperature: float = 0.25,
) -> Result:
    """``min L s.t. |D| <= eps`` by an augmented Lagrangian; local KKT certificate.

    ``constraint="loss"`` (default) is seed 002's loss-based DEO; ``"tpr"`` the smooth
    surrogate of the TPR gap with temperature ``tpr_temperature`` (as in fair-vfl's options;
    ``res.extra["constraint"]`` then has the true TPR gap and the surrogate's error bound).

    Inner problems ``L + (1/(2 rho)) sum_j ([mu_j + rho g_j]_+^2 - mu_j^2)`` are solved by
    L-BFGS to ``tol / 10``; ``mu_j <- [mu_j + rho g_j]_+``; ``rho`` grows tenfold when the
    violation does not fall by 4. Status ``"optimal"`` when stationarity and
    feasibility/complementarity are both ``<= tol`` (a local certificate: the constraint
    is non-convex).
    """
    t0 = time.perf_counter()
    pm = PooledVerticalModel(problem, constraint, tpr_temperature)
    m = pm.X.shape[1]
    theta = np.zeros(m) if theta0 is None else np.asarray(theta0, dtype=float).copy()
    if theta0 is None:
        theta = solve_unconstrained(problem, tol=min(tol, 1e-8)).x
    mu = np.zeros(2)
    zero = np.zeros(2)
    last_viol = np.inf
    history: list[dict[str, Any]] = []

    def g_of(th):
        d = pm.deo_gap(th)
        return np.array([d - eps, -d - eps])

    stat = feas = np.inf
    for k in range(max_outer):

        def phi(th, mu=mu, rho=rho):
            gv = g_of(th)
            shifted = np.maximum(mu + rho * gv, 0.0)
            val = pm.loss(th) + (shifted @ shifted - mu @ mu) / (2 * rho)
            grad = pm.grad_theta(th, zero) + (shifted[0] - shifted[1]) * pm.grad_deo(th)
            return val, grad

        out = minimize(
            phi,
            theta,
            jac=True,
            method="L-BFGS-B",
            options={"gtol": tol / 10, "ftol": 1e-16, "maxiter": 5000, "maxcor": 30},
        )
        theta = out.x
        gv = g_of(theta)
        mu = np.maximum(mu + rho * gv, 0.0)
        stat = float(np.abs(pm.grad_theta(theta, mu)).max())
        feas = feasibility_residual(gv, np.zeros(0), mu)
        viol = float(max(gv.max(), 0.0))
        history.append(
            {
                "iteration": k + 1,
                "rho": rho,
                "stationarity": stat,
                "feasibility": feas,
                "lambda1": float(mu[0]),
                "lambda2": float(mu[1]),
                "violation": viol,
            }
        )
        if stat <= tol and feas <= tol:
            break
        if viol > 0.25 * last_viol:
            rho *= 10.0
        last_viol = viol
    kkt = KKTResiduals(stat, feas, {"server": feas}, local=True)
    status = "optimal" if kkt.satisfied(tol, tol) else "inaccurate"
    msg = (
        f"augmented Lagrangian, {len(history)} outer iterations: local KKT stationarity "
        f"{stat:.2e}, feasibility/complementarity {feas:.2e} (tol {tol:g})"
    )
    return _result(
        problem,
        pm,
        "vfl-reference",
        status,
        theta,
        mu,
        kkt,
        msg,
        t0,
        {"history": history, "eps": eps},
    )


def _result(problem, pm, method, status, theta, lam, kkt, msg, t0, extra) -> Result:
    z = pm.X @ theta
    blocks = problem.split_theta(theta)
    solution = {f"theta_{n}": b for n, b in zip(problem.party_names, blocks)}
    eps = extra.get("eps")
    viol = 0.0 if eps is None else max(0.0, abs(pm.f.constraint_gap(z)) - eps)
    info: dict[str, Any] = {
        "lambda": np.asarray(lam, dtype=float),
        "train": score_metrics(z, problem.y, problem.group_a),
        "scores": z,
        **{k: v for k, v in extra.items() if k != "history"},
    }
    if eps is not None:
        info["constraint"] = pm.f.constraint_report(z, eps)
    if problem.test_blocks is not None:
        z_test = np.hstack(problem.test_blocks) @ theta
        info["test"] = score_metrics(z_test, problem.y_test, problem.group_a_test)
        info["test_scores"] = z_test
    return Result(
        status=status,
        method=method,
        objective=pm.loss(theta),
        max_violation=viol,
        x=theta,
        solution=solution,
        multipliers={"server": {"deo": np.asarray(lam, dtype=float)}},
        kkt=kkt,
        rounds={"outer": len(extra.get("history", [])), "inner": 0, "communication": 0},
        timing={"solve": time.perf_counter() - t0},
        history=extra.get("history", []),
        message=msg,
        extra=info,
    )
