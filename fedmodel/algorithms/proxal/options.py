"""Options of ``prox-al``, ``admm`` and ``cprox-al`` (seed 000), with the paper's names,
defaults and validation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from fedmodel.algorithms.options import RUNTIME_OPTIONS_DOC, RuntimeOptions
from fedmodel.algorithms.options import positive as _positive
from fedmodel.errors import ModelError

# Defaults follow seed 000 Section 5.1 (sbar = 0.1, beta = 10, rho = 1, mu0 = 0). The paper
# does not state q; any q in (0, 1) is covered by its Theorem 4.2, and with exact local
# solves a smaller q only removes idle inner rounds, so 0.5 is used.


@dataclass
class ProxALOptions(RuntimeOptions):
    """Options of ``prox-al`` (seed 000 Algorithm 1 + Algorithm 2) and ``cprox-al``.

    Attributes
    ----------
    eps : float or (float, float)
        KKT tolerances (eps1 stationarity, eps2 feasibility) of Definition 1.
    beta : float
        Penalty parameter (Algorithm 1).
    sbar : float, optional
        Inner tolerance scale: tau_k = sbar / (k + 1)^2. Default ``100 * eps1``, which is
        the paper's 0.1 at eps = 1e-3 and keeps the number of outer iterations needed by
        (8) (tau_k <= eps1 requires k + 1 >= sqrt(sbar / eps1)) independent of eps.
    rho : float or dict or sequence
        ADMM penalty rho_i of each client (Algorithm 2).
    q : float
        Server/client local tolerance decay eps_{t+1} = q^t (Algorithm 2).
    mu0 : float
        Initial multipliers (all parties), >= 0.
    w0 : None, array, dict or "sphere"
        Starting point (default zeros, projected onto dom h); ``"sphere"`` draws it from the
        unit sphere with ``random_state`` as in the paper's experiments.
    max_outer, max_inner : int
        Iteration caps of Algorithms 1 and 2.
    local_floor : float
        Local solves are asked for max(q^t, local_floor * tau_k): once q^t is far below
        the inner target tau_k, tighter local solves cannot change the test (19), which
        stays a valid bound on dist(0, d l_k) because it uses the server's measured
        residual and the clients' exact eps~_i (Theorem 4.1's proof).
    solver : {"auto", "lbfgs", "cvxpy"}
        Subproblem backend of every party.
    (and the runtime options below)
    """

    eps: Any = 1e-3
    beta: float = 10.0
    sbar: float | None = None
    rho: Any = 1.0
    q: float = 0.5
    mu0: float = 0.0
    w0: Any = None
    random_state: Any = None
    max_outer: int = 500
    max_inner: int = 500
    max_local_iter: int = 10_000
    local_floor: float = 1e-3
    solver: str = "auto"
    divergence_limit: float = 1e10

    def __post_init__(self) -> None:
        if self.sbar is None:
            try:
                self.sbar = 100.0 * self.eps1
            except (TypeError, ValueError, IndexError):
                self.sbar = 0.1  # validate() reports the bad eps

    @property
    def eps1(self) -> float:
        return float(self.eps[0] if np.ndim(self.eps) else self.eps)

    @property
    def eps2(self) -> float:
        return float(self.eps[1] if np.ndim(self.eps) else self.eps)

    def validate(self, client_names: list[str]) -> None:
        if np.ndim(self.eps) not in (0, 1) or (np.ndim(self.eps) == 1 and len(self.eps) != 2):
            raise ModelError(f"eps must be a float or a pair (eps1, eps2), got {self.eps!r}")
        _positive("eps1", self.eps1)
        _positive("eps2", self.eps2)
        _positive("beta", self.beta)
        _positive("sbar", self.sbar)
        if not 0 < self.q < 1:
            raise ModelError(f"q must lie in (0, 1), got {self.q!r}")
        if self.mu0 < 0:
            raise ModelError(f"mu0 must be >= 0, got {self.mu0!r}")
        for name in ("max_outer", "max_inner", "max_local_iter"):
            if int(getattr(self, name)) < 1:
                raise ModelError(f"{name} must be >= 1, got {getattr(self, name)!r}")
        for name, r in self.rho_per_client(client_names).items():
            _positive(f"rho for client '{name}'", r)
        self.validate_runtime()

    def rho_per_client(self, client_names: list[str]) -> dict[str, float]:
        rho = self.rho
        if isinstance(rho, dict):
            missing = [n for n in client_names if n not in rho]
            unknown = [n for n in rho if n not in client_names]
            if missing or unknown:
                raise ModelError(
                    f"rho dict must give every client: missing {missing}, unknown {unknown}"
                )
            return {n: float(rho[n]) for n in client_names}
        if np.ndim(rho) == 1:
            if len(rho) != len(client_names):
                raise ModelError(f"rho has {len(rho)} entries for {len(client_names)} clients")
            return {n: float(r) for n, r in zip(client_names, rho)}
        return {n: float(rho) for n in client_names}


ProxALOptions.__doc__ += RUNTIME_OPTIONS_DOC
