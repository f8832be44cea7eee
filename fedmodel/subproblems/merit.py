"""The one subproblem every party solves: a proximal augmented-Lagrangian merit function.

    phi(x) = sum_p [ f_p(x) + (||[mu_p + beta c_p(x)]_+||^2 - ||mu_p||^2) / (2 beta)
                            + (||nu_p + beta a_p(x)||^2 - ||nu_p||^2) / (2 beta) ]
             + (1/2) ||x - center||_sigma^2  [+ h(x)]

(``sigma`` a scalar, a vector -- a diagonal metric -- or a symmetric positive definite
matrix: ``||d||_sigma^2 = d^T sigma d``)

over one or more party programs ``p``. With one client program it is seed 000's client
step (15) on ``P_{i,k}`` (11); with the server program plus ``h`` it is the server step
(14) on ``P_{0,k}`` (10); with all programs and ``sigma = 1/beta`` it is the centralized
proximal AL subproblem of Algorithm 3; with ``beta = None`` (no constraints) it is plain
ADMM's local step. The quadratic collects the proximal term and the ADMM coupling terms.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from fedmodel.compiler.partition import PartyProgram
from fedmodel.compiler.regularizer import Regularizer


@dataclass
class SolveReport:
    """What a subproblem solve reached.

    Attributes
    ----------
    x : ndarray
        The approximate minimiser.
    residual : float
        ``dist_inf(0, d phi(x))`` measured at ``x`` (never assumed).
    tolerance : float
        What was asked for.
    iterations : int
        Iterations of the local solver.
    backend : str
        Which backend produced ``x``.
    """

    x: np.ndarray
    residual: float
    tolerance: float
    iterations: int
    backend: str
    message: str = ""
    extra: dict = field(default_factory=dict)

    @property
    def converged(self) -> bool:
        return bool(self.residual <= self.tolerance)


def step_deadline(budget: float | None, who: str) -> float | None:
    """The ``time.perf_counter()`` deadline of a step granted ``budget`` seconds from now
    (None: no limit), counted on this process's own clock: a party never trusts another's
    clock, only the seconds it was granted. Raises ``ValueError`` naming ``who`` and the
    field ``budget`` for a negative or non-finite budget.

    Examples
    --------
    >>> import time
    >>> step_deadline(None, "party 'a'") is None, step_deadline(2.0, "party 'a'") > time.perf_counter()
    (True, True)
    """
    if budget is None:
        return None
    value = float(budget)
    if not (np.isfinite(value) and value >= 0.0):
        raise ValueError(f"{who} got a time budget (field 'budget') of {budget!r} s: "
                         "it must be a finite number of seconds >= 0")  # fmt: skip
    return time.perf_counter() + value


def set_deadline(solver, deadline: float | None) -> None:
    """Give a subproblem backend its ``deadline`` (a ``time.perf_counter()`` value after
    which its solve returns the point it reached; every iterative backend has the
    attribute, the closed-form prox needs none)."""
    if hasattr(solver, "deadline"):
        solver.deadline = deadline


#: the multipliers of a program without rows of a kind (one array for all: nothing can
#: change an array without elements)
_EMPTY = np.zeros(0)
#: the ``h`` of a problem without one (a party's: one object for all, never changed)
_NO_H = Regularizer()


class MeritProblem:
    """Parametrised merit function of seed 000 (see module docstring).

    Parameters
    ----------
    programs : list of PartyProgram
        Whose ``f`` and constraints enter ``phi``.
    beta : float
        Penalty parameter of the augmented Lagrangian terms.
    regularizer : Regularizer, optional
        ``h``; only the server (or a centralized solve) passes it.
    """

    def __init__(
        self,
        programs: list[PartyProgram],
        beta: float,
        regularizer: Regularizer | None = None,
    ):
        self.programs = list(programs)
        self.beta = float(beta)
        self.regularizer = regularizer if regularizer is not None else _NO_H
        self.n = programs[0].layout.size
        self.mu = [np.zeros(p.m_ineq) if p.m_ineq else _EMPTY for p in self.programs]
        self.nu = [np.zeros(p.m_eq) if p.m_eq else _EMPTY for p in self.programs]
        # multipliers of the programs' cone constraints (hard constraints of the
        # subproblem), written by the cvxpy backend after each solve
        self.cone = [np.zeros(p.m_cone) if p.m_cone else _EMPTY for p in self.programs]
        self.sigma = 0.0
        self._sigma_array = None
        self._sigma_version = 0
        self.center = np.zeros(self.n)
        self.evaluations = 0

    @property
    def has_smooth_terms(self) -> bool:
        return any(not p.is_empty for p in self.programs)

    @property
    def has_cones(self) -> bool:
        return any(p.cones for p in self.programs)

    def cone_grad(self, x: np.ndarray) -> np.ndarray:
        """``-sum_p J_{E_p}^T lambda_p``: the cone constraints' share of the gradient of the
        subproblem's Lagrangian at the current cone multipliers."""
        g = np.zeros(self.n)
        for fn, lam in zip(self.functions, self.cone):
            if fn.k is not None:
                g = g + fn.cone_grad(x, lam)
        return g

    @property
    def sigma_key(self):
        """A hashable form of ``sigma`` (cache keys of factorisations)."""
        s = self.sigma
        return s if np.ndim(s) == 0 else ("array", self._sigma_version)

    @property
    def functions(self):
        return [p.functions for p in self.programs]

    def set(self, *, sigma, center: np.ndarray, mu=None, nu=None) -> None:
        """Update the parameters (vectors only; nothing is recompiled). ``sigma`` is a
        scalar, a positive vector of length ``n`` (a diagonal metric) or a symmetric
        positive definite ``n x n`` matrix; an array passed again (the same object) keeps
        its :attr:`sigma_key`, so backends keep the factorisations they cached for it."""
        if np.ndim(sigma) == 0:
            self.sigma = float(sigma)
        elif sigma is not self._sigma_array:
            self._sigma_array = sigma
            self._sigma_version += 1
            self.sigma = np.asarray(sigma, dtype=float)
        self.center = np.asarray(center, dtype=float)
        if mu is not None:
            self.mu = [np.asarray(m, dtype=float) for m in mu]
        if nu is not None:
            self.nu = [np.asarray(v, dtype=float) for v in nu]

    def smooth_value_grad(self, x: np.ndarray) -> tuple[float, np.ndarray]:
        """Value and gradient of ``phi`` without the nonsmooth part of ``h``."""
        self.evaluations += 1
        d = x - self.center
        grad = self.sigma @ d if np.ndim(self.sigma) == 2 else self.sigma * d
        val = 0.5 * d.dot(grad)
        for fn, mu, nu in zip(self.functions, self.mu, self.nu):
            v, g = fn.merit(x, mu, nu, self.beta)
            val += v
            grad = grad + g
        if not self.regularizer.is_zero:
            sq = self.regularizer.smooth_grad(x)
            val += 0.5 * sq.dot(x)  # sum b ||v||^2 has gradient 2 b v
            grad = grad + sq
        return float(val), grad

    def value(self, x: np.ndarray) -> float:
        """``phi(x)`` including ``h``."""
        val, _ = self.smooth_value_grad(x)
        if not self.regularizer.is_zero:
            sq = self.regularizer.smooth_grad(x)
            val += self.regularizer.value(x) - 0.5 * sq.dot(x)
        return val

    def residual(self, x: np.ndarray) -> float:
        """``dist_inf(0, d phi(x))`` (exact, using the subdifferential of ``h``).

        With cone constraints, the KKT residual of the subproblem in its cone form at the
        current cone multipliers: the Lagrangian gradient ``d phi(x) - J_E^T lambda`` and,
        per block, ``dist(E, K)``, ``dist(lambda, K^*)`` and ``|<lambda, E>|``.
        """
        _, g = self.smooth_value_grad(x)
        cone_feas = 0.0
        if self.has_cones:
            g = g + self.cone_grad(x)
            for fn, lam in zip(self.functions, self.cone):
                cone_feas = max(cone_feas, fn.cone_residuals(x, lam)[0])
        if self.regularizer.is_zero:
            return max(float(np.abs(g).max(initial=0.0)), cone_feas)
        g = g - self.regularizer.smooth_grad(x)  # dist_subdiff adds the smooth part itself
        return max(self.regularizer.dist_subdiff(x, g), cone_feas)
