"""Options of ``dald-cc`` and ``dald-dc`` (seed 004 Algorithms 2 and 3), the inner stopping
rules (B1)-(B4) with the revised outer rule, and the penalty schedule of Theorem 2."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedmodel.algorithms.local import LOCAL_SOLVERS, SMOOTH_ONLY, check_constraints
from fedmodel.algorithms.options import RUNTIME_OPTIONS_DOC, RuntimeOptions, positive, stop_only
from fedmodel.algorithms.topology import validate_coordination
from fedmodel.compiler.partition import CompiledModel
from fedmodel.errors import ModelError, UnsupportedError
from fedmodel.runtime.wire import register_wire_type

INNER_RULES = ("B1", "B2", "B3", "B4")


@register_wire_type("dald.options")
@dataclass
class DALDOptions(RuntimeOptions):
    """Options of ``dald-cc`` (Algorithm 2) and ``dald-dc`` (Algorithm 3) of seed 004.

    Defaults follow the paper's experiments: ``mu^1 = 0``, ``rho = 1``, ``x^0 = 0``,
    ``eps_dual = eps_pri = 1e-5``, inner rule (B4) with ``vmax = 1`` (one sweep per
    multiplier update: consensus ADMM).

    Attributes
    ----------
    rho : float, array or dict
        Penalty ``rho`` of the augmented term ``||rho o C||^2`` (the multiplier step is
        ``mu += 2 rho o rho o C``, so ``rho = 1`` is the classical penalty ``c = 2``). A
        scalar, a vector with one entry per coordinate of the stacked variable, or a dict:
        ``dald-cc`` per client name, ``dald-dc`` per edge ``(a, b)`` (either orientation;
        missing edges get ``rho_default``); values are scalars or vectors.
    rho_default : float
        Penalty of edges/clients a ``rho`` dict leaves out.
    topology : networkx graph, hierarchical matrix, str or None
        ``dald-dc`` only: the communication graph (see :mod:`fedmodel.algorithms.topology`).
        Default ``"chain"`` (clients in model order, the paper's experiments).
    root, order : optional
        ``dald-dc``: root of an undirected topology, or an explicit order (lowest first).
    inner : {"B1", "B2", "B3", "B4"}
        Inner stopping rule: (B1) ``||D||_inf <= eps_dual``; (B2) ``||D||_inf <=
        eps_dual_k``; (B3) ``v = vmax_k`` or ``||D||_inf <= eps_dual``; (B4) ``v = vmax`` or
        ``||D||_inf <= eps_dual``. The outer loop stops when ``||C||_inf <= eps_pri`` and
        ``||D||_inf <= eps_dual`` (the revised outer rule; for (B1) it is the original one).
    eps_dual, eps_pri : float
    eps_dual_k : callable or sequence, optional
        (B2) tolerance of outer iteration ``k`` (1-based): ``eps_dual_k(k)`` or
        ``eps_dual_k[k - 1]`` (last entry repeated). Default ``max(eps_dual, 0.1 / 2^(k-1))``.
    vmax : int
        (B4) inner iterations per outer iteration.
    vmax_k : callable or sequence, optional
        (B3) ``vmax`` of outer iteration ``k``. Default ``k``.
    max_inner : int
        Safety cap on the inner iterations of one outer iteration (B1, B2).
    max_outer : int
    max_iter : int
        Cap on the total number of inner iterations (sweeps); the paper stops at 1000.
    local_solver : {"exact", "prox-grad", "bfgs", "gd", "newton", "sgd"}
        Solver layer of every party (see :mod:`fedmodel.algorithms.local`). ``"gd"``,
        ``"newton"``, ``"sgd"``: the surrogate reductions of Section V-B (``W`` gradient,
        damped Newton or mini-batch stochastic gradient steps on the block subproblem
        instead of its exact minimiser; smooth subproblems only).
    local_steps : int
        ``W``: proximal-gradient (gd, Newton, sgd) steps per subproblem.
    batch_size : int
        ``"sgd"``: rows per mini-batch (1: SGD).
    step : float, "backtracking" or None
        Proximal-gradient step ``alpha``; ``None``: ``1 / (L_f + max w)`` from the party's own
        curvature estimate; ``"backtracking"``: a line search at every step.
    local_tol : float or None
        ``"exact"``: residual tolerance (default 1e-10); ``"bfgs"``: ``gtol`` (default 1e-5,
        scipy's default).
    local_max_iter : int
    solver : {"auto", "lbfgs", "cvxpy"}
        Backend of exact solves.
    coordination : "full", "random", "greedy", list of names or callable
        Client coordination sequence (:class:`fedmodel.algorithms.topology.Coordination`).
        The last inner iteration of every outer iteration is always full-cycle.
    fraction : float
        Share of parties selected per inner iteration by ``"random"`` / ``"greedy"``.
    dropout : float
        Probability that a party drops out of an inner iteration.
    random_state : int or None
        Seed of the coordination's random choices.
    update_multipliers : bool
        ``False`` keeps ``mu = 0`` (FedProx / distributed proximal algorithm, eqs. 51-53).
    rho_growth : float
        Increasing penalty schedule (Theorem 2): after each multiplier update ``rho <-
        rho_growth * rho``, up to ``rho_growth_max`` times the initial ``rho``.
    rho_growth_max : float
    penalty : float or None
        Models with constraints: each party's constraints enter its objective as the
        quadratic penalty ``(penalty/2)(||[c]_+||^2 + ||a||^2)`` (an approximation; the
        violation is O(1/penalty)). ``None`` refuses constrained models.
    eps : float
        Tolerance of the KKT certificate of the returned point (status ``"optimal"``).
    w0 : None, array or dict
        Starting point ``x^0`` of every party (default zeros).
    snapshot_iterations : sequence of int
        Total inner-iteration counts at which every party's local iterate is recorded (in
        ``result.extra["snapshots"]``, diagnostic channel).
    (and the runtime options below)
    """

    rho: Any = 1.0
    rho_default: float = 1.0
    topology: Any = None
    root: Any = None
    order: Any = None
    inner: str = "B4"
    eps_dual: float = 1e-5
    eps_pri: float = 1e-5
    eps_dual_k: Any = None
    vmax: int = 1
    vmax_k: Any = None
    max_inner: int = 1000
    max_outer: int = stop_only(100_000)
    max_iter: int = stop_only(10_000)
    local_solver: str = "exact"
    local_steps: int = 1
    batch_size: int = 1
    step: float | None = None
    local_tol: float | None = None
    local_max_iter: int = 1000
    solver: str = "auto"
    coordination: Any = "full"
    fraction: float = 0.5
    dropout: float = 0.0
    random_state: Any = None
    update_multipliers: bool = True
    rho_growth: float = 1.0
    rho_growth_max: float = 1e4
    penalty: float | None = None
    eps: float = stop_only(1e-3)
    w0: Any = None
    snapshot_iterations: Any = stop_only(())
    divergence_limit: float = stop_only(1e12)

    def validate(self, compiled: CompiledModel, method: str) -> None:
        if self.inner not in INNER_RULES:
            raise ModelError(f"{method}: inner must be one of {INNER_RULES}, got {self.inner!r}")
        for name in ("eps_dual", "eps_pri", "eps", "rho_default"):
            positive(name, getattr(self, name), method=method)
        for name in (
            "vmax", "max_inner", "max_outer", "max_iter", "local_steps", "local_max_iter",
            "batch_size",
        ):  # fmt: skip
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise ModelError(f"{method}: {name} must be an integer >= 1, got {v!r}")
        if self.local_solver not in LOCAL_SOLVERS:
            raise ModelError(
                f"{method}: local_solver must be one of {LOCAL_SOLVERS}, got {self.local_solver!r}"
            )
        if self.step is not None and self.step != "backtracking":
            positive("step", self.step, method=method)
        if self.local_tol is not None:
            positive("local_tol", self.local_tol, method=method)
        if self.penalty is not None:
            positive("penalty", self.penalty, method=method)
        if not (np.isfinite(self.rho_growth) and self.rho_growth >= 1.0):
            raise ModelError(f"{method}: rho_growth must be >= 1, got {self.rho_growth!r}")
        if not self.rho_growth_max >= 1.0:
            raise ModelError(f"{method}: rho_growth_max must be >= 1, got {self.rho_growth_max!r}")
        if self.local_solver in SMOOTH_ONLY and not (
            compiled.regularizer.is_zero or compiled.regularizer.is_smooth
        ):
            raise UnsupportedError(
                f"{method}: local_solver={self.local_solver!r} needs smooth subproblems, but h "
                "has an l1, norm2 or box term; use local_solver='exact' or 'prox-grad'"
            )
        for name, sched in (("eps_dual_k", self.eps_dual_k), ("vmax_k", self.vmax_k)):
            if sched is not None and not callable(sched):
                if isinstance(sched, str) or not isinstance(sched, Sequence) or not len(sched):
                    raise ModelError(
                        f"{method}: {name} must be a callable k -> value or a non-empty sequence"
                    )
        try:
            snaps = [int(s) for s in self.snapshot_iterations]
        except TypeError as exc:
            raise ModelError(f"{method}: snapshot_iterations must be a sequence of ints") from exc
        if any(s < 1 for s in snaps):
            raise ModelError(f"{method}: snapshot_iterations must be >= 1")
        check_constraints(compiled, method, self.penalty)

    def coordination_check(self, nodes: list[str]) -> None:
        validate_coordination(self.coordination, nodes, self.fraction, self.dropout)


def rho_vector(value: Any, m: int, what: str, method: str) -> np.ndarray:
    arr = np.asarray(value, dtype=float)
    if arr.ndim == 0:
        arr = np.full(m, float(arr))
    if arr.shape != (m,):
        raise ModelError(
            f"{method}: rho for {what} must be a scalar or a vector of {m} entries (one per "
            f"coordinate of the stacked variable), got shape {arr.shape}"
        )
    if not np.all(np.isfinite(arr)) or np.any(arr <= 0):
        raise ModelError(f"{method}: rho for {what} must be positive and finite")
    return arr


def rho_for_clients(
    opts: DALDOptions, names: list[str], m: int, method: str
) -> dict[str, np.ndarray]:
    rho = opts.rho
    if isinstance(rho, dict):
        unknown = sorted(map(str, set(rho) - set(names)))
        if unknown:
            raise ModelError(f"{method}: rho names unknown clients {unknown}")
        return {
            n: rho_vector(rho.get(n, opts.rho_default), m, f"client '{n}'", method) for n in names
        }
    vec = rho_vector(rho, m, "every client", method)
    return {n: vec for n in names}


def rho_for_edges(
    opts: DALDOptions, edges: list[tuple[str, str]], m: int, method: str
) -> dict[tuple[str, str], np.ndarray]:
    rho = opts.rho
    if isinstance(rho, dict):
        known = {frozenset(e) for e in edges}
        unknown = [k for k in rho if not (isinstance(k, tuple) and frozenset(k) in known)]
        if unknown:
            raise ModelError(
                f"{method}: rho keys must be edges (a, b) of the topology; unknown {unknown}"
            )
        by_set = {frozenset(k): v for k, v in rho.items()}
        return {
            e: rho_vector(by_set.get(frozenset(e), opts.rho_default), m, f"edge {e}", method)
            for e in edges
        }
    vec = rho_vector(rho, m, "every edge", method)
    return {e: vec for e in edges}


def _schedule_value(sched: Any, k: int) -> float:
    if callable(sched):
        return sched(k)
    seq = list(sched)
    return seq[min(k, len(seq)) - 1]


class InnerRule:
    """(B1)-(B4) and the revised outer rule, evaluated where the residuals are gathered (the
    server for dald-cc, the root for dald-dc)."""

    def __init__(self, opts: DALDOptions):
        self.kind = opts.inner
        self.eps_dual = float(opts.eps_dual)
        self.eps_pri = float(opts.eps_pri)
        self.vmax = int(opts.vmax)
        self.max_inner = int(opts.max_inner)
        self.eps_dual_k = opts.eps_dual_k
        self.vmax_k = opts.vmax_k

    def tolerance(self, k: int) -> float:
        if self.kind == "B2":
            if self.eps_dual_k is None:
                return max(self.eps_dual, 0.1 * 0.5 ** (k - 1))
            return float(_schedule_value(self.eps_dual_k, k))
        return self.eps_dual

    def cap(self, k: int) -> int:
        if self.kind == "B4":
            return min(self.vmax, self.max_inner)
        if self.kind == "B3":
            raw = k if self.vmax_k is None else _schedule_value(self.vmax_k, k)
            return max(1, min(int(math.floor(raw)), self.max_inner))
        return self.max_inner

    def inner_done(self, k: int, v: int, D: float) -> bool:
        return v >= self.cap(k) or D <= self.tolerance(k)

    def is_last(self, k: int, v: int) -> bool:
        """Whether inner iteration ``v`` is the last one whatever the residual."""
        return v >= self.cap(k)

    def outer_done(self, C: float, D: float) -> bool:
        return C <= self.eps_pri and D <= self.eps_dual


class PenaltySchedule:
    """``rho^k = s_k rho`` with ``s_{k+1} = min(growth s_k, growth_max)`` (Theorem 2)."""

    def __init__(self, growth: float, growth_max: float):
        self.growth = float(growth)
        self.max = float(growth_max)
        self.scale = 1.0

    def advance(self) -> None:
        self.scale = min(self.scale * self.growth, self.max)

    def get_state(self) -> dict:
        return {"scale": self.scale}

    def set_state(self, state: dict) -> None:
        self.scale = float(state["scale"])


DALDOptions.__doc__ += RUNTIME_OPTIONS_DOC
