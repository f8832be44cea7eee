"""Client half of prox-al (seed 000 Algorithm 1) and of its inner inexact ADMM (Algorithm 2).

The client keeps its own state: its multipliers ``mu_i`` (and ``nu_i`` for equalities),
the proximal centre ``w^k``, and the ADMM variables ``u_i``, ``lambda_i``, ``u~_i``. It
answers these messages (everything else stays on the client):

=============  =================================  =====================================
kind           payload in                         reply payload
=============  =================================  =====================================
``start``      ``w`` (= w^0)                      ``u_tilde`` (ADMM initialisation)
``outer``      ``w`` (= w^{k+1})                  ``dmu_inf`` = ||mu_i^{k+1}-mu_i^k||_inf,
                                                  ``u_tilde`` (next ADMM initialisation)
``admm_w``     ``w`` (= w^{t+1}), ``tol``         ``u_tilde``, ``eps_tilde`` (eqs. 16-18)
``evaluate``   ``w``                              diagnostic: f_i, Lagrangian gradient,
                                                  feasibility, constraint values
``report``     (nothing)                          diagnostic: multipliers, local stats
=============  =================================  =====================================
"""

from __future__ import annotations

import numpy as np

from fedmodel.algorithms.protocol import ClientHalf
from fedmodel.compiler.partition import PartyProgram
from fedmodel.subproblems.merit import MeritProblem
from fedmodel.subproblems.select import make_solver


class ProxALClient(ClientHalf):
    """Client ``i`` of seed 000: owns ``f_i``, ``c_i``, ``mu_i`` and its ADMM state.

    Parameters
    ----------
    program : PartyProgram
        This client's own terms and data (nothing else).
    beta : float
        Penalty parameter. Ignored when ``proximal=False`` and there are no constraints.
    rho : float
        This client's ADMM penalty ``rho_i``.
    n_clients : int
        ``n``; the proximal term ``||w - w^k||^2 / (2 beta)`` is split evenly over the
        ``n + 1`` parties (eq. 11).
    proximal : bool
        False for plain ADMM on ``f_i`` (method ``"admm"``).
    """

    def __init__(
        self,
        program: PartyProgram,
        beta: float,
        rho: float,
        n_clients: int,
        proximal: bool = True,
        mu0: float = 0.0,
        solver: str = "auto",
        max_local_iter: int = 10_000,
    ):
        super().__init__(program)
        self.beta = float(beta)
        self.rho = float(rho)
        self.prox_weight = 1.0 / ((n_clients + 1) * beta) if proximal else 0.0
        self.mu = np.full(program.m_ineq, float(mu0))
        self.nu = np.zeros(program.m_eq)
        self.problem = MeritProblem([program], beta)
        self.solver = make_solver(self.problem, solver)
        if hasattr(self.solver, "carry_factor"):
            # ADMM rounds solve the same subproblem with moving vectors: start each Newton
            # solve from the last factor (carried in this client's state, see get_state)
            self.solver.carry_factor = True
        self.max_local_iter = max_local_iter
        self.w_center: np.ndarray | None = None
        self.u = self.lam = self.u_tilde = None
        self.stats["max_residual_gap"] = 0.0

    # -- P_{i,k} and its gradient -----------------------------------------------------------
    def _grad_P(self, w: np.ndarray) -> np.ndarray:
        """Gradient of P_{i,k} (eq. 11) at ``w``: merit gradient plus the prox share.

        From the Newton backend's GLM form when it has been cross-checked against the
        model's evaluator (one pass over each data matrix, affine images shared with the
        next solve), else from the model's expression-tree evaluator: the same quantity.
        """
        solver = self.solver
        if getattr(solver, "verified", False):
            _, g = solver.merit_value_grad(w, [self.mu], [self.nu])
        else:
            _, g = self.problem.functions[0].merit(w, self.mu, self.nu, self.beta)
        return g + self.prox_weight * (w - self.w_center)

    def _start_admm(self, w: np.ndarray) -> np.ndarray:
        """Algorithm 2 initialisation with w~^0 = w: u^0 = w, lambda^0 = -grad P(w)."""
        self.w_center = w.copy()
        g = self._grad_P(w)
        self.u = w.copy()
        self.lam = -g
        self.u_tilde = w - g / self.rho
        return self.u_tilde

    # -- state (checkpoints, retries) --------------------------------------------------------
    state_fields = ("mu", "nu", "w_center", "u", "lam", "u_tilde")
    component_fields = ("solver",)  # the Newton backend's carried factor

    def multipliers(self) -> tuple[np.ndarray, np.ndarray]:
        return self.mu, self.nu

    # -- message handlers --------------------------------------------------------------------
    def _on_start(self, w):
        return {"u_tilde": self._start_admm(np.asarray(w, dtype=float))}

    def _on_outer(self, w):
        w = np.asarray(w, dtype=float)
        ci, ce = self.problem.functions[0].constraint_values(w)
        dmu = 0.0
        if ci.size:
            new = np.maximum(self.mu + self.beta * ci, 0.0)
            dmu = float(np.abs(new - self.mu).max())
            self.mu = new
        if ce.size:  # equalities: unprojected update
            step = self.beta * ce
            dmu = max(dmu, float(np.abs(step).max()))
            self.nu = self.nu + step
        return {"dmu_inf": dmu, "u_tilde": self._start_admm(w)}

    def _on_admm_w(self, w, tol):
        w = np.asarray(w, dtype=float)
        # eps~ (eq. 18): grad phi_{i,t}(w^{t+1}) = grad P_i(w^{t+1}) + lambda^t
        eps_tilde = float(np.abs(self._grad_P(w) + self.lam - self.rho * (w - self.u)).max())
        # client step (15): phi = P_i(u) + <lambda, u - w> + rho/2 ||u - w||^2, written as the
        # merit function plus (sigma/2)||u - center||^2 with the prox share folded in.
        sigma = self.prox_weight + self.rho
        center = (self.prox_weight * self.w_center + self.rho * w - self.lam) / sigma
        self.problem.set(sigma=sigma, center=center, mu=[self.mu], nu=[self.nu])
        report = self.solver.solve(self.u, float(tol), self.max_local_iter)
        self.stats["local_solves"] += 1
        self.stats["local_iterations"] += report.iterations
        self.stats["max_residual_gap"] = max(
            self.stats["max_residual_gap"], report.residual / max(float(tol), 1e-300)
        )
        self.u = report.x
        self.lam = self.lam + self.rho * (self.u - w)  # (16)
        self.u_tilde = self.u + self.lam / self.rho  # (17)
        return {"u_tilde": self.u_tilde, "eps_tilde": eps_tilde}
