"""The server-based baselines: ``fedavg`` and ``fedprox`` (``dgd`` is in :mod:`.dgd`).

* ``fedavg`` (McMahan et al. 2017): each round the server sends ``x_hat``; every client
  starts from it and either solves its local problem ``min f_i + h/n`` (``local_solver=
  "exact"``) or takes ``local_steps`` (E) proximal-gradient steps on it
  (``"prox-grad"``, the default); the server averages the returned models with weights
  proportional to the clients' sample counts (``weights="samples"``: the server learns
  their total once, and each client weights its own model by its count over it) or
  uniform weights. Every message is a sum over the clients (each client sends its
  weighted model change and its weight; the server divides the sums), so both take
  ``secure_aggregation=True`` and ``dp=fm.DP(...)`` (DP-FedAvg: each client's model change
  clipped to ``clip``, Gaussian noise on the sum; uniform or given weights).
* ``fedprox`` (Li et al. 2020): the same with the proximal term ``(prox_coef/2)||x -
  x_hat||^2`` in the local problem; by default exact local solves and uniform weights, which
  is seed 004's distributed proximal algorithm (52)-(53), i.e. dald-cc with the multipliers
  kept at 0 and ``rho = sqrt(prox_coef / 2)``.
* ``dgd`` (seed 004 eq. 55; Nedic and Ozdaglar 2009): over a peer-to-peer topology, each node
  sends ``x_i`` to its neighbours and updates ``x_i <- prox_{alpha_i h/n}(sum_j p_ij x_j -
  alpha_i grad f_i(x_i))`` with Metropolis mixing weights (or a given matrix); the returned
  point is the average of the nodes' iterates (gathered on the diagnostic channel).

None of these methods handles constraints. For models with local or global constraints
they take ``penalty=beta``: each party's constraints enter its own objective as the
quadratic penalty ``(beta/2)(||[c(x)]_+||^2 + ||a(x)||^2)``, so the answer is the
minimiser of a penalised model, whose violation is O(1/beta); the KKT certificate of the
result (with the multipliers ``beta [c]_+`` the penalty implies) shows what is lost
compared with ``prox-al``. Global terms held by the server (``f_0`` and the penalty of
``c_0``) are handled by a server step ``x_hat = argmin f_0 + P_0 + (c n/2)||x - x_bar||^2``
after averaging (``c = prox_coef`` for fedprox, 1 for fedavg); in ``dgd`` the server must be
a node of the topology.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from fedmodel.algorithms.baselines.common import (
    _local,
    _sample_count,
    _status,
)
from fedmodel.algorithms.baselines.messages import BASELINES
from fedmodel.algorithms.common import (
    PenaltyClient,
    PenaltyServer,
    starting_point,
    step_budgets,
)
from fedmodel.algorithms.driver import run_federated
from fedmodel.algorithms.local import check_constraints, scaled_regularizer
from fedmodel.algorithms.options import RuntimeOptions, positive, stop_only, whole_number
from fedmodel.algorithms.protocol import StepReport
from fedmodel.compiler.partition import CompiledModel, PartyProgram
from fedmodel.compiler.regularizer import Regularizer
from fedmodel.errors import ModelError, UnsupportedError
from fedmodel.runtime.endpoints import EndpointFactory
from fedmodel.runtime.wire import register_wire_type
from fedmodel.subproblems.merit import step_deadline

#: the baselines' local solvers (dald's surrogate layers gd/newton/sgd are dald options only)
LOCAL_SOLVERS = ("exact", "prox-grad", "bfgs")


@register_wire_type("fedavg.options")
@dataclass
class FedAvgOptions(RuntimeOptions):
    """Options of ``fedavg``.

    Attributes
    ----------
    local_solver : {"prox-grad", "exact", "bfgs"}
        E proximal-gradient steps (default), or an exact local solve.
    local_start : {"global", "previous"}
        Where local training starts: the received global model (the usual FedAvg/FedProx)
        or the client's previous local model (seed 004's reading of FedProx as dald-cc with
        ``mu = 0``, whose solver layer warm-starts at ``x_i^{k-1}``). Irrelevant for exact
        solves of strictly convex local problems.
    local_steps : int
        E, the local steps per round.
    step : float, "backtracking" or None
        Local step size; ``None``: ``1 / L`` from the client's own curvature estimate.
    weights : "samples", "uniform" or dict
        Aggregation weights (normalised): sample counts, equal, or given per client.
    max_rounds : int
    tol : float
        Stop when ``||x_hat^r - x_hat^{r-1}||_inf <= tol``.
    penalty : float or None
        Quadratic penalty of the constraints (required for constrained models).
    eps : float
        Tolerance of the KKT certificate (status ``"optimal"``).
    local_tol, local_max_iter, solver : exact local solves (see dald-cc).
    w0 : as for dald-cc.
    snapshot_iterations : sequence of int
        Rounds after which every client's local model is recorded.
    """

    local_solver: str = "prox-grad"
    local_start: str = "global"
    local_steps: int = 10
    step: float | None = None
    weights: Any = "samples"
    max_rounds: int = stop_only(1000)
    tol: float = stop_only(1e-10)
    penalty: float | None = None
    eps: float = stop_only(1e-3)
    local_tol: float | None = None
    local_max_iter: int = 1000
    solver: str = "auto"
    w0: Any = None
    snapshot_iterations: Any = stop_only(())

    def validate(self, compiled: CompiledModel, method: str) -> None:
        if self.dp is not None and self.weights == "samples":
            raise ModelError(
                f"{method}: dp needs weights='uniform' or a dict of weights (sample counts "
                "would be revealed, or need noise of their own)"
            )
        if (self.dp is not None or self.secure_aggregation) and self.snapshot_iterations:
            raise ModelError(
                f"{method}: snapshot_iterations sends each client's local model, which "
                "secure_aggregation and dp do not reveal"
            )
        if self.local_solver not in LOCAL_SOLVERS:
            raise ModelError(
                f"{method}: local_solver must be one of {LOCAL_SOLVERS}, got {self.local_solver!r}"
            )
        if self.local_start not in ("global", "previous"):
            raise ModelError(
                f"{method}: local_start must be 'global' or 'previous', got {self.local_start!r}"
            )
        whole_number("local_steps", self.local_steps, method=method)
        whole_number("max_rounds", self.max_rounds, method=method)
        whole_number("local_max_iter", self.local_max_iter, method=method)
        positive("tol", self.tol, method=method)
        positive("eps", self.eps, method=method)
        for name in ("step", "local_tol", "penalty"):
            if getattr(self, name) is not None and getattr(self, name) != "backtracking":
                positive(name, getattr(self, name), method=method)
        if self.local_solver == "bfgs" and not (
            compiled.regularizer.is_zero or compiled.regularizer.is_smooth
        ):
            raise UnsupportedError(
                f"{method}: local_solver='bfgs' needs a smooth local problem, but h has an l1, "
                "norm2 or box term"
            )
        names = [c.name for c in compiled.clients]
        w = self.weights
        if isinstance(w, dict):
            unknown = sorted(set(w) - set(names))
            missing = sorted(set(names) - set(w))
            if unknown or missing:
                raise ModelError(
                    f"{method}: weights dict must give every client: missing {missing}, "
                    f"unknown {unknown}"
                )
            for n in names:
                positive(f"weight of '{n}'", w[n], method=method)
        elif w not in ("samples", "uniform"):
            raise ModelError(f"{method}: weights must be 'samples', 'uniform' or a dict, got {w!r}")
        check_constraints(compiled, method, self.penalty)


@register_wire_type("fedprox.options")
@dataclass
class FedProxOptions(FedAvgOptions):
    """Options of ``fedprox``: those of ``fedavg`` plus ``prox_coef``.

    Attributes
    ----------
    prox_coef : float
        The proximal coefficient (``mu`` of Li et al.): local problem ``f_i + h/n +
        (prox_coef/2)||x - x_hat||^2``. The default 2.0 corresponds to seed 004's ``rho = 1``.
    local_solver : default ``"exact"``.
    weights : default ``"uniform"`` (seed 004 eq. 53 with uniform ``beta_i``).
    """

    prox_coef: float = 2.0
    local_solver: str = "exact"
    weights: Any = "uniform"

    def validate(self, compiled: CompiledModel, method: str) -> None:
        super().validate(compiled, method)
        positive("prox_coef", self.prox_coef, method=method)


@register_wire_type("fedavg.client")
class FedClient(PenaltyClient):
    """Client of fedavg / fedprox: local training from the global model."""

    messages = BASELINES

    state_fields = ("x", "last_w", "weight")
    component_fields = ("local",)

    def __init__(
        self, program: PartyProgram, reg_share: Regularizer, opts: FedAvgOptions, prox_coef: float
    ):
        super().__init__(program)
        self.by_samples = opts.weights == "samples"
        self.private = opts.dp is not None  # (dp: the weight is public, not sent)
        self.weight: float | None = None
        self.penalty = opts.penalty
        self.local = _local(program, reg_share, opts.penalty, opts)
        self.prox_coef = float(prox_coef)
        self.local_start = opts.local_start
        self.x: np.ndarray | None = None
        self.last_w: np.ndarray | None = None

    def _on_samples(self):
        return {"n": float(_sample_count(self.program))}

    def _on_fed_round(self, x_hat, scale, budget=None):
        x_hat = np.asarray(x_hat, dtype=float)
        self.local.deadline = step_deadline(budget, f"party {self.name!r}")
        self.local.set_quadratic(self.prox_coef, x_hat)  # (prox_coef/2)||x - x_hat||^2
        start = x_hat if (self.x is None or self.local_start == "global") else self.x
        self.x = self.local.solve(start.copy())
        count = float(_sample_count(self.program)) if self.by_samples else 1.0
        self.weight = count * float(scale)
        reply = {"dx": self.weight * (self.x - x_hat)}
        return reply if self.private else {**reply, "weight": self.weight}

    def _on_report(self):
        return {
            **super()._on_report(),
            "local_iterations": self.local.stats.iterations,
            "x": None if self.x is None else self.x.copy(),
            "weight": self.weight,
        }


class FedAvgServer(PenaltyServer):
    """Server half of fedavg / fedprox: weighted averaging of the clients' local models, then
    the server's own step on ``f_0`` and the penalty of ``c_0`` (when it has terms).

    State: the global model ``x_hat``, the aggregation weights, the round counter and the
    recorded snapshots.
    """

    messages = BASELINES
    private_aggregation = ("secure_aggregation", "dp")

    state_fields = ("x", "scale", "r", "dx", "snapshots")
    component_fields = ("server_local",)
    step_name = "round"

    def __init__(self, compiled: CompiledModel, opts: FedAvgOptions, prox_coef: float, x0):
        super().__init__(compiled.server, opts)
        self.names = [c.name for c in compiled.clients]
        n = len(self.names)
        self.max_steps = int(opts.max_rounds)
        self.prox_coef = float(prox_coef)
        self.coupling = (prox_coef if prox_coef > 0 else 1.0) * n
        self.server_local = (
            _local(compiled.server, Regularizer(), opts.penalty, opts, kind="exact")
            if not compiled.server.is_empty
            else None
        )
        self.snap_at = {int(s) for s in opts.snapshot_iterations}
        self.x = np.asarray(x0, dtype=float)
        self.scale: dict[str, float] = {}
        self.r = 0
        self.snapshots: dict[int, dict] = {}
        self.dx = np.inf

    def start(self, runtime) -> None:
        w = self.options.weights
        if w == "samples":  # each client weights by its count over the total
            runtime.next_round()
            total = float(self.privacy.aggregate(runtime, "samples", {}).sums["n"][0])
            self.scale = {k: 1.0 / total for k in self.names}
        else:
            raw = {k: 1.0 for k in self.names} if w == "uniform" else dict(w)
            total = sum(float(raw[k]) for k in self.names)
            self.scale = {k: float(raw[k]) / total for k in self.names}

    def step(self, runtime, deadline) -> StepReport:
        self.r = r = self.r + 1
        runtime.next_round()
        if not self.privacy.affords(1):
            self.r -= 1
            return StepReport(
                stop="budget_spent",
                message=f"the privacy budget (epsilon = {self.options.dp.epsilon:g}) is spent "
                f"after {self.r} rounds (another round and the certificate would exceed it)",
            )
        budgets = step_budgets(runtime, runtime.client_names, deadline)  # (none without a limit)
        sums = self.privacy.aggregate(
            runtime,
            "fed_round",
            lambda n: {
                "x_hat": self.x,
                "scale": self.scale[n],
                **({"budget": budgets[n]} if budgets else {}),
            },
            clip=None
            if self.options.dp is None
            else lambda n: self.options.dp.clip * self.scale[n],
        )
        # the participants' weights: summed (those who dropped out are not in the sum), or
        # under dp the server's own (the clients do not send them)
        if self.options.dp is None:
            weight = float(sums.sums["weight"][0])
        else:
            weight = sum(self.scale[n] for n in sums.participants)
        x_bar = self.x + np.asarray(sums.sums["dx"], dtype=float) / weight
        if self.server_local is not None:
            self.server_local.set_quadratic(self.coupling, x_bar)
            x_new = self.server_local.solve(x_bar)
        else:
            x_new = x_bar
        if not np.all(np.isfinite(x_new)):
            return StepReport(
                stop="unbounded",
                message="the iterates diverge (non-finite values); the last finite iterate is returned",
            )
        self.dx = float(np.abs(x_new - self.x).max(initial=0.0))
        self.x = x_new
        if r in self.snap_at:
            reps = runtime.broadcast("snapshot", {}, channel="diagnostic")
            self.snapshots[r] = {
                "x_hat": self.x.copy(),
                "local": {k: v.payload["x"] for k, v in reps.items()},
            }
        report = StepReport(info={"iteration": r, "dx_inf": self.dx})
        if self.dx <= self.options.tol:
            report.stop = "stopped"
        return report

    def point(self) -> np.ndarray:
        return self.x

    def round_counts(self) -> dict[str, int]:
        return {"inner": self.r}

    def conclude(self, status, message, kkt, summary, history):
        if status in ("optimal", "inaccurate", "max_iterations"):
            status, message = _status(
                self.options, status != "max_iterations", kkt, self.r, self.dx,
                "||x_hat change||_inf",
            )  # fmt: skip
        return status, message

    def extra(self, reports: dict[str, dict]) -> dict:
        return {
            "local_x": {k: v.get("x") for k, v in reports.items()},
            "weights": {k: v.get("weight") for k, v in reports.items()},
            "snapshots": self.snapshots,
        }


def run_fedavg(
    compiled: CompiledModel, opts: FedAvgOptions, method: str = "fedavg", *, faults=None
):
    """Run fedavg or fedprox through the driver (any backend, checkpoints, failure policies)."""
    n = compiled.n_clients
    reg_share = scaled_regularizer(compiled.regularizer, 1.0 / n)
    prox_coef = float(getattr(opts, "prox_coef", 0.0)) if method == "fedprox" else 0.0
    client_opts = opts.for_clients()  # what travels to where the clients run
    factories = {
        c.name: EndpointFactory(FedClient, (c, reg_share, client_opts, prox_coef))
        for c in compiled.clients
    }
    server = FedAvgServer(compiled, opts, prox_coef, starting_point(compiled, opts.w0))
    return run_federated(compiled, opts, method, server, factories, faults=faults)
