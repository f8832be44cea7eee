"""KKT residuals of seed 000 Definition 1, recomputed from scratch.

At a point ``(w, mu)`` each party evaluates, on its own data, its share of the gradient of
the Lagrangian ``grad f_i(w) + J_{c_i}(w)^T mu_i`` and its feasibility residual
``dist_inf(c_i(w), N_{R_+}(mu_i))``; the server adds its own share and ``dh(w)``:

    stationarity = dist_inf(0, sum_i grad f_i(w) + dh(w) + sum_i J_{c_i}(w)^T mu_i)
    feasibility  = max_i dist_inf(c_i(w), N_{R_+^{m_i}}(mu_i))

A party-owned variable (``party.variable``, or an epigraph auxiliary of a non-smooth
term) appears only in its owner's terms, so the owner alone reports the stationarity of
that block (``owned_stationarity``); federated methods send only the shared part of ``w``.

Equality constraints ``a_i(w) = 0`` have free multipliers and contribute ``|a_i(w)|``.
Cone constraints ``E_i(w, s_i) in K`` (terms with no smooth form, lifted to cone form by
:mod:`fedmodel.dsl.conic`) contribute ``-J_E^T lambda_i`` to stationarity and
``max(dist(E, K), dist(lambda, K^*), |<lambda, E>|)`` to feasibility, with the conic
multipliers ``lambda_i`` the party took from its last exact (cvxpy) subproblem solve
(:mod:`fedmodel.compiler.cones`).
Nothing here reuses an algorithm's stopping quantities.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fedmodel.compiler.partition import PartyProgram
from fedmodel.compiler.regularizer import Regularizer


def feasibility_residual(ci: np.ndarray, ce: np.ndarray, mu: np.ndarray) -> float:
    """``dist_inf(c, N_{R_+}(mu))`` for inequalities plus ``|a|`` for equalities.

    ``N_{R_+}(mu) = {v <= 0 : v_j = 0 where mu_j > 0}``, so a component contributes
    ``|c_j|`` where ``mu_j > 0`` and ``max(c_j, 0)`` where ``mu_j = 0``.
    """
    r = 0.0
    if ci.size:
        r = float(np.where(mu > 0, np.abs(ci), np.maximum(ci, 0.0)).max())
    if ce.size:
        r = max(r, float(np.abs(ce).max()))
    return r


def max_violation(ci: np.ndarray, ce: np.ndarray) -> float:
    """Largest constraint violation ``max(max_j [c_j]_+, max_j |a_j|)``."""
    v = 0.0
    if ci.size:
        v = max(v, float(np.maximum(ci, 0.0).max()))
    if ce.size:
        v = max(v, float(np.abs(ce).max()))
    return v


def party_evaluation(
    program: PartyProgram,
    x: np.ndarray,
    mu: np.ndarray,
    nu: np.ndarray,
    shared_only=False,
    cone: np.ndarray | None = None,
) -> dict:
    """What one party reports in an evaluation round, computed on its own data only.

    With ``shared_only`` (federated methods on a party's own view ``x = (shared, own)``),
    ``grad`` is the shared part of the Lagrangian gradient and ``owned_stationarity`` the
    infinity norm of its own block's part (its owned variables enter no other party's
    terms and no ``h``, so that block's stationarity is the owner's alone). ``cone`` holds
    the multipliers of the party's cone constraints (zeros when None).
    """
    fn = program.functions
    ci, ce = fn.constraint_values(x)
    grad = fn.lagrangian_grad(x, mu, nu, cone)
    cone_feas, cone_viol = fn.cone_residuals(x, cone)
    owned = 0.0
    if shared_only:
        ns = program.layout.n_shared
        owned = float(np.abs(grad[ns:]).max(initial=0.0))
        grad = grad[:ns]
    return {
        "objective": fn.objective(x),
        "grad": grad,
        "owned_stationarity": owned,
        "feasibility": max(feasibility_residual(ci, ce, mu), cone_feas),
        "violation": max(max_violation(ci, ce), cone_viol),
        "c_ineq": ci,
        "c_eq": ce,
    }


@dataclass
class KKTResiduals:
    """The two residuals of seed 000 Definition 1 (infinity norm).

    Attributes
    ----------
    stationarity : float
        ``dist_inf(0, grad f(w) + dh(w) + grad c(w) mu)``.
    feasibility : float
        ``dist_inf(c(w), N(mu))`` (max over parties; equalities by ``|a(w)|``).
    per_party : dict
        Feasibility residual of each party.
    local : bool
        True when the model has non-convex terms: the point is then certified as an
        approximate KKT (local) point, not as a global optimum.
    """

    stationarity: float
    feasibility: float
    per_party: dict[str, float] = field(default_factory=dict)
    local: bool = False

    def satisfied(self, eps1: float, eps2: float) -> bool:
        return bool(self.stationarity <= eps1 and self.feasibility <= eps2)

    def to_dict(self) -> dict:
        return {
            "stationarity": self.stationarity,
            "feasibility": self.feasibility,
            "per_party": dict(self.per_party),
            "local": self.local,
        }

    def __repr__(self) -> str:
        kind = "local " if self.local else ""
        return (
            f"KKTResiduals({kind}stationarity={self.stationarity:.3e}, "
            f"feasibility={self.feasibility:.3e})"
        )


def assemble(
    reports: dict[str, dict], regularizer: Regularizer, x: np.ndarray, local: bool
) -> tuple[KKTResiduals, dict]:
    """Combine the parties' evaluation reports into residuals and summary values.

    Returns the residuals and a dict with the objective ``f + h``, the max violation and
    each party's constraint values.
    """
    grad = sum(r["grad"] for r in reports.values())
    stationarity = (
        float(np.abs(grad).max(initial=0.0))
        if regularizer.is_zero
        else regularizer.dist_subdiff(x, grad)
    )
    # blocks of party-owned variables, reported by their owners (federated evaluation)
    owned = max((float(r.get("owned_stationarity", 0.0)) for r in reports.values()), default=0.0)
    stationarity = max(stationarity, owned)
    per_party = {name: float(r["feasibility"]) for name, r in reports.items()}
    feasibility = max(max(per_party.values(), default=0.0), regularizer.box_violation(x))
    kkt = KKTResiduals(stationarity, feasibility, per_party, local)
    summary = {
        "objective": float(sum(r["objective"] for r in reports.values()) + regularizer.value(x)),
        "max_violation": max(
            max((float(r["violation"]) for r in reports.values()), default=0.0),
            regularizer.box_violation(x),
        ),
        "constraints": {
            name: {"ineq": np.asarray(r["c_ineq"]), "eq": np.asarray(r["c_eq"])}
            for name, r in reports.items()
        },
    }
    return kkt, summary
