"""Options of the learning methods (seed 003): mini-batch SSCA and its SGD baselines, and
the step-size schedules ``a / t^alpha`` with a check of the paper's conditions (4), (6).

Examples
--------
>>> rho, gamma = Schedule(1.0, 0.6), Schedule(1.0, 0.9)
>>> check_conditions(rho, gamma)["satisfied"]
True
>>> check_conditions(Schedule(0.9, 0.1), Schedule(0.5, 0.1))["failed"][:1]
['(6): sum gamma_t^2 < inf needs alpha > 0.5 (alpha = 0.1)']
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedmodel.algorithms.options import RUNTIME_OPTIONS_DOC, RuntimeOptions, positive, stop_only
from fedmodel.errors import ModelError

SERVER_SOLVERS = ("auto", "lemma1", "dual", "cvxpy")


@dataclass(frozen=True)
class Schedule:
    """``a / t^alpha`` for rounds ``t = 1, 2, ...``, or ``fn(t)`` when ``fn`` is given."""

    a: float = 1.0
    alpha: float = 0.0
    fn: Callable[[int], float] | None = None

    def __call__(self, t: int) -> float:
        if self.fn is not None:
            return float(self.fn(t))
        return float(self.a) / float(t) ** float(self.alpha)

    @classmethod
    def of(cls, value: Any, name: str) -> Schedule:
        """A schedule from a ``Schedule``, a callable, a number (constant) or ``(a, alpha)``."""
        if isinstance(value, Schedule):
            return value
        if callable(value):
            return cls(fn=value)
        if isinstance(value, (int, float, np.floating)) and not isinstance(value, bool):
            return cls(float(value), 0.0)
        try:
            a, alpha = value
            return cls(float(a), float(alpha))
        except (TypeError, ValueError):
            raise ModelError(
                f"{name} must be a number, (a, alpha) for a / t^alpha, or a callable t -> value;"
                f" got {value!r}"
            ) from None


def check_conditions(rho: Schedule, gamma: Schedule, rounds: int = 1000) -> dict[str, Any]:
    """Check the step sizes against (4) (``0 < rho_t <= 1``, ``rho_t -> 0``, ``sum rho_t =
    inf``) and (6) (``0 < gamma_t <= 1``, ``gamma_t -> 0``, ``sum gamma_t = inf``,
    ``sum gamma_t^2 < inf``, ``gamma_t / rho_t -> 0``).

    Power-law schedules are checked exactly from their exponents (a monotone ``a / t^alpha``
    takes its extremes at ``t = 1`` and ``t = rounds``: no loop, whatever ``rounds``);
    callables only on their range over ``t = 1..rounds`` (the limits cannot be checked from
    finitely many values). Returns ``{"satisfied": bool, "failed": [...], "unchecked":
    [...]}``.
    """
    failed: list[str] = []
    unchecked: list[str] = []
    for name, s, eq in (("rho", rho, "(4)"), ("gamma", gamma, "(6)")):
        if s.fn is None:
            vals = np.array([s(1), s(max(1, int(rounds)))])
        else:
            vals = np.array([s(int(k)) for k in range(1, rounds + 1)])
        if not (np.all(vals > 0) and np.all(vals <= 1)):
            failed.append(f"{eq}: 0 < {name}_t <= 1 fails on t = 1..{rounds}")
    power = rho.fn is None and gamma.fn is None
    if not power:
        unchecked.append("limits and sums of callable schedules (only their range was checked)")
    else:
        for name, s, eq in (("rho", rho, "(4)"), ("gamma", gamma, "(6)")):
            if s.alpha <= 0:
                failed.append(f"{eq}: {name}_t -> 0 needs alpha > 0 (alpha = {s.alpha:g})")
            if s.alpha > 1:
                failed.append(f"{eq}: sum {name}_t = inf needs alpha <= 1 (alpha = {s.alpha:g})")
        if gamma.alpha <= 0.5:
            failed.append(f"(6): sum gamma_t^2 < inf needs alpha > 0.5 (alpha = {gamma.alpha:g})")
        if gamma.alpha <= rho.alpha:
            failed.append(
                "(6): gamma_t / rho_t -> 0 needs gamma's alpha > rho's alpha "
                f"({gamma.alpha:g} <= {rho.alpha:g})"
            )
    return {"satisfied": not failed, "failed": failed, "unchecked": unchecked}


@dataclass
class LearningOptions(RuntimeOptions):
    """Options shared by every learning method (SSCA and the SGD baselines).

    Parameters
    ----------
    rounds : int
        Communication rounds ``T`` (one iteration of the paper's algorithms per round).
    batch_size : int
        ``B``: samples per client and round (sample-based: each client's own seeded
        sampler draws ``B`` of its rows without replacement, ``B <= N_i``; feature-based:
        the server draws one common batch of ``B`` row indices).
    seed : int
        Seed of the samplers (client ``i`` in its ``t``-th round uses ``(seed, i, t)``; the
        server's common batch ``(seed, t)``) and, with ``w0=None``, of the starting point.
    w0 : array, optional
        Starting point (default ``loss.init(seed)``).
    eval_every : int
        Rounds between two diagnostic evaluations (full training loss, accuracy, test
        accuracy; ``res.history``; the start and the last round are always evaluated);
        0: only the start and the end. ``history=False`` skips all but the final one.
    designated : str, optional
        Feature-based: the client that computes the ``omega_0`` gradients (default the
        first).
    one_step : bool
        Feature-based, Remark 4: every client sends ``h_i`` and ``dh_i/dw_i`` of the batch
        straight to the server (one step, fewer messages). **For the MLP this sends the
        raw features** (``dh_i/dw_i = z_{n,i}``, footnote 16); off by default.
    final_gradient : bool
        Sample-based: one more diagnostic round at the end in which every client sends its
        full gradient (``res.kkt.stationarity``, ``res.extra["gradient_norm"]``).
    """

    rounds: int = stop_only(100)
    batch_size: int = 10
    seed: int = 0
    w0: Any = None
    eval_every: int = stop_only(10)
    designated: str | None = None
    one_step: bool = False
    final_gradient: bool = stop_only(True)

    def validate_common(self) -> None:
        for name in ("rounds", "batch_size"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise ModelError(f"{name} must be a positive integer, got {v!r}")
        v = self.eval_every
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
            raise ModelError(f"eval_every must be an integer >= 0, got {v!r}")

    def to_dict(self) -> dict[str, Any]:
        out = {}
        for k, v in self.__dict__.items():
            if k in ("w0", "callback"):
                continue
            if isinstance(v, Schedule):
                v = (v.a, v.alpha) if v.fn is None else "callable"
            out[k] = v
        return out


@dataclass
class SSCAOptions(LearningOptions):
    """Options of ``ssca`` (seed 003, Algorithms 1-4, surrogates (7)/(15)/(19)/(27)).

    Parameters
    ----------
    rho : float, (a, alpha) or callable
        Surrogate weight ``rho_t`` (default ``(0.9, 0.1)``, the paper's ``B = 10``
        sample-based row: ``0.9 / t^0.1``).
    gamma : float, (a, alpha) or callable
        Model step ``gamma_t`` (default ``(0.5, 0.1)``).
    tau : float
        Proximal weight of the surrogates (default 0.2).
    c : float
        Penalty of the slack problem (5)/(10) (the paper: ``1e5``).
    server_solver : {"auto", "lemma1", "dual", "cvxpy"}
        The constrained server step: Lemma 1's closed form (objective ``||w||^2`` and one
        constraint; what ``"auto"`` picks then), the exact dual solve of
        :func:`~fedmodel.subproblems.penalty_qcqp.solve_penalty_qcqp` (any number of
        constraints), or cvxpy/Clarabel (compiled once; small ``d`` only).
    check_schedules : {"report", "raise"}
        Conditions (4) and (6) are checked and reported in ``res.extra``;
        ``"raise"`` refuses schedules that fail them (the paper's own experiments' do).
    c_growth : float
        The increasing penalty of Theorem 2 (``c_j -> infinity``): 1 (default) keeps ``c``
        fixed (the paper's experiments); ``> 1`` multiplies ``c`` by it at the end of every
        stage of ``c_every`` rounds in which the server's surrogate problem needed its
        slack in some round (a multiplier at the penalty, ``nu_m = c``), up to ``c_max``.
        The surrogates and the iterate carry over from stage to stage (only the server's
        problem depends on ``c``); the current ``c`` is in the history rows and
        ``res.extra["c"]``.
    c_every : int
        Rounds per stage of the increasing penalty (default 50).
    c_max : float
        Largest penalty (default ``1e12``).
    """

    rho: Any = (0.9, 0.1)
    gamma: Any = (0.5, 0.1)
    tau: float = 0.2
    c: float = 1e5
    server_solver: str = "auto"
    check_schedules: str = stop_only("report")
    c_growth: float = 1.0
    c_every: int = 50
    c_max: float = 1e12

    def validate(self, problem: Any = None, method: str = "ssca") -> None:
        self.validate_common()
        self.rho = Schedule.of(self.rho, "rho")
        self.gamma = Schedule.of(self.gamma, "gamma")
        positive("tau", self.tau)
        positive("c", self.c)
        positive("c_max", self.c_max)
        g = self.c_growth
        if isinstance(g, bool) or not isinstance(g, (int, float)) or not 1 <= g < np.inf:
            raise ModelError(f"c_growth must be a number >= 1 (1: a fixed c), got {g!r}")
        v = self.c_every
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ModelError(f"c_every must be a positive integer, got {v!r}")
        if float(self.c_max) < float(self.c):
            raise ModelError(f"c_max = {self.c_max!r} is below c = {self.c!r}")
        if self.server_solver not in SERVER_SOLVERS:
            raise ModelError(
                f"server_solver must be one of {SERVER_SOLVERS}, got {self.server_solver!r}"
            )
        if self.check_schedules not in ("report", "raise"):
            raise ModelError(
                f"check_schedules must be 'report' or 'raise', got {self.check_schedules!r}"
            )


@dataclass
class SGDOptions(LearningOptions):
    """Options of the SGD baselines on the same model and data.

    ``fedsgd`` (one local step, ``local_steps=1``), ``fedavg-sgd`` (``E = local_steps``
    local SGD steps of batch ``B`` per round, models averaged with weights ``N_i/N``;
    ``B E = N_i`` is FedAvg), ``sgd-m`` (local momentum SGD), ``vertical-sgd`` and
    ``vertical-sgd-m`` (feature-based, Algorithm 3's collection, one step per round).

    Parameters
    ----------
    lr : float, (a, alpha) or callable
        Learning rate ``r_t`` (default ``(0.3, 0.3)``: the paper's ``0.3 / t^0.3``; for the
        momentum methods the paper uses a constant 0.3).
    momentum : float
        ``beta`` of the momentum methods (the paper: 0.1): ``v = beta v + g``,
        ``w = w - r v``.
    local_steps : int
        ``E`` (sample-based).
    """

    lr: Any = (0.3, 0.3)
    momentum: float = 0.1
    local_steps: int = 1

    def validate(self, problem: Any = None, method: str = "fedsgd") -> None:
        self.validate_common()
        self.lr = Schedule.of(self.lr, "lr")
        if not 0 <= float(self.momentum) < 1:
            raise ModelError(f"momentum must be in [0, 1), got {self.momentum!r}")
        v = self.local_steps
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ModelError(f"local_steps must be a positive integer, got {v!r}")


for _cls in (LearningOptions, SSCAOptions, SGDOptions):
    _cls.__doc__ = (_cls.__doc__ or "") + RUNTIME_OPTIONS_DOC
