"""The server's recursive surrogate state of mini-batch SSCA (seed 003) and its solve.

With the surrogates (7)/(19) (objective: linear + ``tau ||w - w_t||^2``) and (15)/(27)
(constraints: value + linear + ``tau ||w - w_t||^2``) every surrogate is
``const + f1' w + tau ||w||^2`` and the server keeps only the coefficients:

* (9)/(23)/(36)-(37): ``f1 <- (1 - rho) f1 + rho (g - 2 tau w_t)`` (objective, ``g`` the
  weighted batch gradient the clients uploaded);
* (35): ``beta <- (1 - rho) beta + rho w_t`` (the linearised ``lambda ||w||^2``, (33));
* per constraint ``m``: ``e_m <- (1 - rho) e_m + rho (v_m - g_m' w_t + tau ||w_t||^2)`` (42)
  and ``f1_m <- (1 - rho) f1_m + rho (g_m - 2 tau w_t)``.

The quadratic coefficient is ``tau`` as in the paper's closed forms (10), (24), (38)-(39),
(43)-(44) (exact for ``rho_1 = 1``; with ``rho_1 < 1`` the recursion's coefficient is
``tau (1 - prod_k (1 - rho_k))``, which tends to ``tau``; notes 3.1).

:meth:`SurrogateState.solve` returns ``w_bar``: the closed form (10)/(38)-(39) without
constraints, else the slack problem (5)/(10)/(41) through
:mod:`fedmodel.subproblems.penalty_qcqp` (Lemma 1 when it applies).

Examples
--------
>>> import numpy as np
>>> st = SurrogateState(dim=2, tau=0.5)
>>> st.update(1.0, np.zeros(2), np.array([1.0, -2.0]))
>>> st.solve()[0].tolist()        # -f1 / (2 tau)
[-1.0, 2.0]
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fedmodel.subproblems.penalty_qcqp import (
    CvxpyPenaltyQCQP,
    PenaltySolution,
    lemma1,
    solve_penalty_qcqp,
)


class SurrogateState:
    """Coefficients of the averaged surrogates and the server's convex subproblem.

    Parameters
    ----------
    dim : int
        ``d``.
    tau : float
        Proximal weight of the surrogates.
    lam : float
        ``lambda`` of the objective ``F(w) + lambda ||w||^2`` (32).
    objective : {"loss", "norm"}
        ``"loss"``: the surrogate of the training loss (+ ``lambda ||w||^2``);
        ``"norm"``: ``||w||^2`` used exactly (the constrained formulation (40)).
    bounds : sequence of float
        ``U_m`` of the constraints ``F_m(w) <= U_m``.
    c : float
        Penalty of the slacks.
    solver : {"auto", "lemma1", "dual", "cvxpy"}
    """

    def __init__(
        self,
        dim: int,
        tau: float,
        lam: float = 0.0,
        objective: str = "loss",
        bounds: Sequence[float] = (),
        c: float = 1e5,
        solver: str = "auto",
    ):
        self.dim, self.tau, self.lam = int(dim), float(tau), float(lam)
        self.objective = objective
        self.bounds = np.asarray(bounds, dtype=float)
        self.c = float(c)
        M = len(self.bounds)
        if solver == "auto":
            solver = "lemma1" if (M == 1 and objective == "norm") else "dual"
        if solver == "lemma1" and not (M == 1 and objective == "norm"):
            raise ValueError(
                "Lemma 1 solves min ||w||^2 s.t. one loss constraint; use server_solver='dual'"
            )
        self.solver = solver
        self.f1 = np.zeros(self.dim)
        self.beta = np.zeros(self.dim)
        self.e = np.zeros(M)
        self.F1 = np.zeros((M, self.dim))
        self.last: PenaltySolution | None = None
        self._cvx = None

    @property
    def M(self) -> int:
        return len(self.bounds)

    def update(
        self,
        rho: float,
        w: np.ndarray,
        grad: np.ndarray | None,
        constraints: Sequence[tuple[float, np.ndarray]] = (),
    ) -> None:
        """One recursion step at ``w = w_t`` with the weighted batch averages: ``grad`` of the
        objective's loss (None for ``objective="norm"``) and ``(value, gradient)`` of each
        constraint's loss."""
        tau = self.tau
        if self.objective == "loss":
            self.f1 = (1 - rho) * self.f1 + rho * (np.asarray(grad) - 2 * tau * w)
            self.beta = (1 - rho) * self.beta + rho * w
        ww = float(w @ w)
        for m, (v, g) in enumerate(constraints):
            g = np.asarray(g, dtype=float)
            self.e[m] = (1 - rho) * self.e[m] + rho * (float(v) - float(g @ w) + tau * ww)
            self.F1[m] = (1 - rho) * self.F1[m] + rho * (g - 2 * tau * w)

    def objective_terms(self) -> tuple[np.ndarray, float]:
        """``(a0, k0)`` of the surrogate objective ``k0 ||w||^2 + a0' w``."""
        if self.objective == "loss":
            return self.f1 + 2 * self.lam * self.beta, self.tau
        return np.zeros(self.dim), 1.0

    def solve(self) -> tuple[np.ndarray, np.ndarray]:
        """``(w_bar, s)``: the minimiser of the surrogate problem and the slacks."""
        a0, k0 = self.objective_terms()
        if self.M == 0:
            self.last = None
            return -a0 / (2 * k0), np.zeros(0)
        e = self.e - self.bounds
        if self.solver == "lemma1":
            sol = lemma1(self.F1[0], float(self.e[0]), float(self.bounds[0]), self.tau, self.c)
        elif self.solver == "cvxpy":
            if self._cvx is None:
                self._cvx = CvxpyPenaltyQCQP(self.dim, self.M, k0, self.tau, self.c)
            sol = self._cvx.solve(a0, self.F1, e)
        else:
            sol = solve_penalty_qcqp(a0, k0, self.F1, e, self.tau, self.c)
        self.last = sol
        return sol.w, sol.s

    def set_penalty(self, c: float) -> None:
        """A new penalty ``c`` of the slacks (the increasing-penalty loop)."""
        if float(c) != self.c:
            self.c = float(c)
            self._cvx = None  # compiled with c

    def get_state(self) -> dict:
        return {
            "f1": self.f1.copy(),
            "beta": self.beta.copy(),
            "e": self.e.copy(),
            "F1": self.F1.copy(),
        }

    def set_state(self, state: dict) -> None:
        self.f1, self.beta = state["f1"].copy(), state["beta"].copy()
        self.e, self.F1 = state["e"].copy(), state["F1"].copy()
