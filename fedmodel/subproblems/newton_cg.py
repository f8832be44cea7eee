"""Truncated Newton (Newton-CG) for GLM-form merit problems at any dimension.

The same merit function, GLM form, gradient and Armijo line search as
:class:`~fedmodel.subproblems.newton.NewtonSolver`, but each Newton system ``H p = -g`` is
solved inexactly by preconditioned conjugate gradients on Hessian-vector products, so no
``n x n`` matrix is ever formed: a product is ``A^T (d2 * (A v))`` per data block (sparse
data stays sparse), the active augmented-Lagrangian rows and the proximal term. Memory is
``O(nnz(data) + n)``; at ``n = 10,000`` a dense Hessian alone would take 800 MB and its
factorisation tens of seconds.

* Forcing terms (Eisenstat-Walker): CG stops at a relative residual ``eta = min(0.1,
  sqrt(||g|| / ||g_0||))`` measured in the preconditioner's norm (in the Euclidean norm
  the stiff augmented-Lagrangian directions dominate it: one CG step resolving only them
  passed, and Newton became preconditioned gradient descent, 91 steps on sparse logistic
  regression at d = 10,000), so early steps are cheap and the last ones Newton-accurate.
* Preconditioner: the diagonal of ``H`` (the squares of the data are kept once) plus the
  rank-``k`` augmented-Lagrangian terms ``beta grad c_j grad c_j^T`` of the active nonlinear
  constraints through the Woodbury identity: a ball ``||w||^2 <= r^2`` with ``beta = 1e5``
  adds one eigenvalue ~1e5 times the others, which plain CG would chase.
* Negative curvature met by CG (non-convex terms) ends the inner loop with the step so far
  (the steepest-descent step if it is the first).
* ``deadline`` (a ``time.perf_counter()`` value) is checked in the CG loop as well, and no
  Newton step starts that the last step's wall says would end after it, so an owner's
  time limit holds within about one line search.

It is the backend of ``centralized``'s smooth exact path above
:data:`~fedmodel.algorithms.centralized.pooled.SMOOTH_MAX_SIZE` variables.
"""

from __future__ import annotations

import time

import numpy as np
import scipy.sparse as sp

from fedmodel.compiler.glm import phi_d2
from fedmodel.subproblems.merit import MeritProblem, SolveReport
from fedmodel.subproblems.newton import NewtonSolver, _State, residuals_agree

#: CG's relative residual (in the preconditioner's norm) at most this, and at most
#: ``sqrt(||g|| / ||g_0||)`` (Eisenstat-Walker's choice 2): superlinear convergence
FORCING_CAP = 0.1


class NewtonCGSolver(NewtonSolver):
    """Newton-CG with line search for GLM-form merit problems (see module docstring).

    Raises :class:`~fedmodel.compiler.glm.NotRecognised` at construction when the problem
    is not of GLM form or ``h`` is not smooth, as :class:`NewtonSolver` does.

    Attributes
    ----------
    cg_iterations : int
        Hessian-vector products spent in CG so far (all solves).
    max_cg : int
        CG iterations per Newton step at most.

    Examples
    --------
    >>> import cvxpy as cp, fedmodel as fm
    >>> m = fm.Model("ncg"); w = m.variable(3, name="w"); c = m.client("c")
    >>> c.minimize(cp.sum(cp.logistic(c.data(np.eye(3), name="X") @ w)) + cp.sum_squares(w))
    >>> solver = NewtonCGSolver(MeritProblem(m.compile().parties, 1.0))
    >>> report = solver.solve(np.zeros(3), 1e-10)
    >>> bool(report.converged), np.round(report.x, 4).tolist()
    (True, [-0.2223, -0.2223, -0.2223])
    """

    name = "newton-cg"

    def __init__(self, problem: MeritProblem):
        super().__init__(problem)
        self.cg_iterations = 0
        self.max_cg = 500
        self._squares: dict[int, object] = {}

    # -- Hessian-vector products ----------------------------------------------------------
    def _curvature(self, st: _State):
        """What every product at ``st`` reuses: per objective term its second-derivative
        weights, the active linear rows, the active nonlinear components."""
        beta = self.problem.beta
        zs, _ = st.images
        d2 = [t.weights * phi_d2(t.kind, z, t.M) * (t.s * t.s) for t, z in zip(self.obj.terms, zs)]
        Ga = self.G_in[st.act] if st.act is not None and st.act.any() else None
        comps = [
            (comp, [c.weights * phi_d2(c.kind, z, c.M) * (c.s * c.s) for c, z in zip(
                comp.terms, img[0])], y, cg)
            for comp, img, y, cg in st.comps
        ]  # fmt: skip
        return {"d2": d2, "Ga": Ga, "comps": comps, "beta": beta}

    def _hvp(self, cur, v: np.ndarray) -> np.ndarray:
        """``H v`` for the merit function's (generalised) Hessian at the point of ``cur``."""
        p, beta = self.problem, cur["beta"]
        sigma = p.sigma
        out = sigma @ v if np.ndim(sigma) == 2 else sigma * v
        if self.has_h:
            out = out + 2 * self.h_sumsq * v
        out = out + _smooth_products(self.obj, cur["d2"], v)
        if cur["Ga"] is not None:
            out += beta * (cur["Ga"].T @ (cur["Ga"] @ v))
        if self.G_eq.shape[0]:
            out += beta * (self._mvT_eq @ (self._mv_eq @ v))
        for comp, d2, y, cg in cur["comps"]:
            out += y * _smooth_products(comp, d2, v) + beta * cg * float(cg @ v)
        return out

    def _square(self, A):
        key = id(A)
        if key not in self._squares:
            self._squares[key] = A.multiply(A).tocsr() if sp.issparse(A) else A * A
        return self._squares[key]

    def _diagonal(self, smooth, d2) -> np.ndarray:
        out = np.zeros(self.n)
        for t, w in zip(smooth.terms, d2):
            out += np.asarray(self._square(t.A).T @ w).ravel()
        if smooth.Q is not None:
            out += np.diag(smooth.Q)
        return out

    def _preconditioner(self, cur):
        """``r -> P^{-1} r`` with ``P = diag(H without the rank-one AL terms) + beta C C^T``,
        ``C`` the gradients of the active nonlinear constraint components (Woodbury)."""
        p, beta = self.problem, cur["beta"]
        sigma = p.sigma
        D = np.diag(sigma).copy() if np.ndim(sigma) == 2 else np.broadcast_to(
            np.asarray(sigma, dtype=float), (self.n,)).copy()  # fmt: skip
        D += 2 * self.h_sumsq + self._diagonal(self.obj, cur["d2"])
        if cur["Ga"] is not None:
            D += beta * (cur["Ga"] ** 2).sum(axis=0)
        if self.G_eq.shape[0]:
            D += beta * np.asarray((self.G_eq**2).sum(axis=0)).ravel()
        C = []
        for comp, d2, y, cg in cur["comps"]:
            D += y * self._diagonal(comp, d2)
            C.append(cg)
        top = float(D.max(initial=0.0))
        D = np.maximum(D, 1e-12 * top if top > 0 else 1.0)
        if not C or len(C) > 50:
            if C:
                D += beta * np.sum(np.square(C), axis=0)
            return lambda r: r / D
        C = np.array(C).T  # n x k
        DC = C / D[:, None]
        small = np.linalg.cholesky(np.eye(C.shape[1]) / beta + C.T @ DC)

        def apply(r: np.ndarray) -> np.ndarray:
            Dr = r / D
            z = np.linalg.solve(small.T, np.linalg.solve(small, C.T @ Dr))
            return Dr - DC @ z

        return apply

    def _cg(self, st: _State, eta: float) -> tuple[np.ndarray, int, bool]:
        """Preconditioned CG on ``H p = -g`` to ``||H p + g|| <= eta ||g||``; returns the
        step, the products spent and whether the deadline stopped it."""
        cur = self._curvature(st)
        precond = self._preconditioner(cur)
        r = -np.asarray(st.g, dtype=float)
        x = np.zeros(self.n)
        z = precond(r)
        d = z.copy()
        rz = float(r @ z)
        # the residual in the preconditioner's norm: the AL's stiff directions (beta = 1e5)
        # would dominate the Euclidean one, so that a step resolving only them passes
        target = eta * eta * rz
        it = 0
        while it < self.max_cg:
            if self.deadline is not None and time.perf_counter() > self.deadline:
                return (x if it else r), it, True
            Hd = self._hvp(cur, d)
            it += 1
            curv = float(d @ Hd)
            if curv <= 0:  # negative curvature (non-convex terms)
                return (x if it > 1 else r), it, False
            alpha = rz / curv
            x += alpha * d
            r -= alpha * Hd
            z = precond(r)
            rz_new = float(r @ z)
            if rz_new <= target:
                break
            d = z + (rz_new / rz) * d
            rz = rz_new
        return x, it, False

    def _second_order_correction(self, st: _State, step: np.ndarray) -> np.ndarray:
        """The correction ``q`` that puts the active nonlinear constraints back on their
        linearisation after ``step``: ``c_j(x + p) - c_j(x) - grad c_j^T p`` removed by the
        least-norm ``q`` in the span of their gradients (zero without such constraints).

        Without it, a step tangent to a curved constraint (a ball at beta = 1e5) leaves it
        by ``|p|^2`` and the penalty rejects all but tiny steps (Maratos effect): Newton
        took 200 steps on a subproblem of logistic regression in a ball at d = 800. The
        line search then follows the arc ``x + t p + t^2 q``."""
        if not st.comps:
            return np.zeros(self.n)
        C, err = [], []
        for comp, img, _, cg in st.comps:
            c0 = comp.value_grad(st.x, img)[0]
            c1 = comp.value_grad(st.x + step, comp.images(st.x + step))[0]
            err.append(c1 - c0 - float(cg @ step))
            C.append(cg)
        C = np.array(C)
        try:
            coef = np.linalg.solve(C @ C.T, np.array(err))
        except np.linalg.LinAlgError:
            return np.zeros(self.n)
        q = -(C.T @ coef)
        return q if np.all(np.isfinite(q)) else np.zeros(self.n)

    # -- solve ------------------------------------------------------------------------------
    def solve(self, x0: np.ndarray, tol: float, max_iter: int = 200) -> SolveReport:
        """Minimise the merit function from ``x0`` to ``||grad||_inf <= tol``."""
        if self._delegate is not None:
            report = self._delegate.solve(x0, tol, max_iter)
            report.backend = "newton-cg->lbfgs"
            return report
        p = self.problem
        self._m_in = self._multipliers(self.gather_in, p.mu)
        self._m_eq = self._multipliers(self.gather_eq, p.nu)
        st = self._evaluate(np.array(x0, dtype=float))
        if not self._verified and not self._cross_check(st):
            return self.solve(x0, tol, max_iter)  # now with the L-BFGS delegate
        gnorm = float(np.abs(st.g).max(initial=0.0))
        g0 = max(float(np.linalg.norm(st.g)), 1e-300)
        it, products, message = 0, 0, "converged"
        step_seconds = 0.0  # the last Newton step's wall: no step starts that would end late
        while gnorm > tol:
            started = time.perf_counter()
            if self.deadline is not None and started + step_seconds > self.deadline:
                message = "time limit"
                break
            if it >= max_iter:
                message = f"max_iter = {max_iter} Newton steps"
                break
            it += 1
            eta = min(FORCING_CAP, np.sqrt(float(np.linalg.norm(st.g)) / g0))
            step, used, stopped = self._cg(st, eta)
            products += used
            slope = float(st.g @ step)
            if not slope < 0:  # not a descent direction (numerical trouble): the gradient
                step, slope = -st.g, -float(st.g @ st.g)
            bend = self._second_order_correction(st, step)
            t = 1.0
            while True:
                new = self._evaluate(st.x + t * step + (t * t) * bend)
                if new.val <= st.val + 1e-4 * t * slope:
                    break
                new_gnorm = float(np.abs(new.g).max(initial=0.0))
                if (  # at machine precision: accept a full step that reduces the gradient
                    t == 1.0
                    and new.val - st.val <= 1e-13 * max(1.0, abs(st.val))
                    and new_gnorm < gnorm
                ):
                    break
                if t < 1e-10:
                    break
                t *= 0.5
            if t < 1e-10 and new.val > st.val:
                message = "line search failed (at machine precision?)"
                self._images(st.x)
                break
            st = new
            gnorm = float(np.abs(st.g).max(initial=0.0))
            step_seconds = time.perf_counter() - started
            if stopped:
                message = "time limit"
                break
        self.cg_iterations += products
        if not self._verified and message != "time limit":  # (no time left to cross-check)
            check = self.problem.residual(st.x)
            if not residuals_agree(check, gnorm, st.val):
                self._disagree()
                return self.solve(x0, tol, max_iter)
            self._verified = True
        return SolveReport(
            st.x, gnorm, tol, it, self.name, message, extra={"hessian_products": products}
        )


def _smooth_products(smooth, d2: list[np.ndarray], v: np.ndarray) -> np.ndarray:
    """``grad^2 (sum_terms w phi(A x + b) + x^T Q x / 2) v`` with the terms' second
    derivatives ``d2`` already weighted."""
    out = np.zeros(v.shape[0])
    for t, w in zip(smooth.terms, d2):
        out += t.A.T @ (w * (t.A @ v))
    if smooth.Q is not None:
        out += smooth.Q @ v
    return out
