"""Baselines users compare against, on the same models: ``fedavg``, ``fedprox``, ``dgd``.

* ``fedavg`` (McMahan et al. 2017): each round the server sends ``x_hat``; every client
  starts from it and either solves its local problem ``min f_i + h/n`` (``local_solver=
  "exact"``) or takes ``local_steps`` (E) proximal-gradient steps on it
  (``"prox-grad"``, the default); the server averages the returned models with weights
  proportional to the clients' sample counts (``weights="samples"``, each client reports
  the number of rows of its data once) or uniform weights.
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

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedmodel.algorithms.common import make_result, split_multipliers, starting_point
from fedmodel.algorithms.dald_client import _Endpoint
from fedmodel.algorithms.dald_common import (
    CountingLedger,
    blas_threads,
    communication_totals,
    evaluation_payload,
    pooled_certificate,
)
from fedmodel.algorithms.dald_local import LOCAL_SOLVERS, LocalProblem, scaled_regularizer
from fedmodel.algorithms.dald_options import check_constraints
from fedmodel.algorithms.registry import MethodSpec, register_method
from fedmodel.algorithms.topology import SERVER, metropolis_weights, topology_graph
from fedmodel.compiler.partition import CompiledModel, PartyProgram
from fedmodel.compiler.regularizer import Regularizer
from fedmodel.errors import ModelError, UnsupportedError
from fedmodel.runtime.serial import SerialRuntime


def _positive(method, name, value):
    try:
        ok = float(value) > 0 and np.isfinite(float(value))
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ModelError(f"{method}: {name} must be a positive number, got {value!r}")


def _int_at_least_1(method, name, value):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ModelError(f"{method}: {name} must be an integer >= 1, got {value!r}")


@dataclass
class FedAvgOptions:
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
    w0, history, callback, time_limit, keep_ledger, blas_threads : as for dald-cc.
    snapshot_iterations : sequence of int
        Rounds after which every client's local model is recorded.
    """

    local_solver: str = "prox-grad"
    local_start: str = "global"
    local_steps: int = 10
    step: float | None = None
    weights: Any = "samples"
    max_rounds: int = 1000
    tol: float = 1e-10
    penalty: float | None = None
    eps: float = 1e-3
    local_tol: float | None = None
    local_max_iter: int = 1000
    solver: str = "auto"
    w0: Any = None
    history: bool = True
    callback: Any = None
    time_limit: float | None = None
    keep_ledger: bool = True
    snapshot_iterations: Any = ()
    blas_threads: int | None = 1

    def validate(self, compiled: CompiledModel, method: str) -> None:
        if self.local_solver not in LOCAL_SOLVERS:
            raise ModelError(
                f"{method}: local_solver must be one of {LOCAL_SOLVERS}, got {self.local_solver!r}"
            )
        if self.local_start not in ("global", "previous"):
            raise ModelError(
                f"{method}: local_start must be 'global' or 'previous', got {self.local_start!r}"
            )
        _int_at_least_1(method, "local_steps", self.local_steps)
        _int_at_least_1(method, "max_rounds", self.max_rounds)
        _int_at_least_1(method, "local_max_iter", self.local_max_iter)
        _positive(method, "tol", self.tol)
        _positive(method, "eps", self.eps)
        for name in ("step", "local_tol", "penalty"):
            if getattr(self, name) is not None and getattr(self, name) != "backtracking":
                _positive(method, name, getattr(self, name))
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
                _positive(method, f"weight of '{n}'", w[n])
        elif w not in ("samples", "uniform"):
            raise ModelError(f"{method}: weights must be 'samples', 'uniform' or a dict, got {w!r}")
        check_constraints(compiled, method, self.penalty)


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
        _positive(method, "prox_coef", self.prox_coef)


def _sample_count(program: PartyProgram) -> int:
    rows = [int(np.shape(d.value)[0]) for d in program.data if np.ndim(d.value) >= 1]
    return max(rows, default=1)


def _local(program, reg, penalty, opts, kind=None, steps=None) -> LocalProblem:
    return LocalProblem(
        program,
        reg,
        penalty,
        local_solver=kind or opts.local_solver,
        local_steps=steps or getattr(opts, "local_steps", 1),
        step=getattr(opts, "step", None),
        local_tol=getattr(opts, "local_tol", None),
        local_max_iter=getattr(opts, "local_max_iter", 1000),
        solver=getattr(opts, "solver", "auto"),
        uniform=True,
    )


class FedClient(_Endpoint):
    """Client of fedavg / fedprox: local training from the global model."""

    def __init__(
        self, program: PartyProgram, reg_share: Regularizer, opts: FedAvgOptions, prox_coef: float
    ):
        self.name = program.name
        self.program = program
        self.penalty = opts.penalty
        self.local = _local(program, reg_share, opts.penalty, opts)
        self.prox_coef = float(prox_coef)
        self.local_start = opts.local_start
        self.x: np.ndarray | None = None
        self.seconds = 0.0

    def _on_samples(self):
        return {"n": float(_sample_count(self.program))}

    def _on_fed_round(self, x_hat):
        x_hat = np.asarray(x_hat, dtype=float)
        self.local.set_quadratic(self.prox_coef, x_hat)  # (prox_coef/2)||x - x_hat||^2
        start = x_hat if (self.x is None or self.local_start == "global") else self.x
        self.x = self.local.solve(start.copy())
        return {"x": self.x}

    def _on_evaluate(self, w):
        return evaluation_payload(self.program, np.asarray(w, dtype=float), self.penalty)

    def _on_snapshot(self):
        return {"x": None if self.x is None else self.x.copy()}

    def _on_report(self):
        return {
            "seconds": self.seconds,
            "local_iterations": self.local.stats.iterations,
            "x": None if self.x is None else self.x.copy(),
        }


def _evaluate(runtime, compiled, x, penalty, extra_reports=None):
    replies = runtime.broadcast("evaluate", {"w": x}, channel="diagnostic")
    reports = {n: r.payload for n, r in replies.items()}
    if extra_reports:
        reports.update(extra_reports)
    if compiled.server.name not in reports:
        reports[compiled.server.name] = evaluation_payload(compiled.server, x, penalty)
    kkt, summary = pooled_certificate(compiled, reports, x)
    return kkt, summary, reports


def _status(compiled, opts, stopped: bool, kkt, r: int, dx: float, what: str):
    certified = kkt.satisfied(opts.eps, opts.eps)
    if stopped:
        status = "optimal" if certified else "inaccurate"
        message = (
            f"{what} below tol = {opts.tol:g} after {r} rounds; KKT certificate "
            + ("within" if certified else "outside")
            + f" eps = {opts.eps:g} (stationarity {kkt.stationarity:.2e}, feasibility "
            f"{kkt.feasibility:.2e})"
        )
        if not certified:
            message += (
                ": the method stalled away from the optimum (client drift on heterogeneous "
                "data, a constant step, or only a penalised treatment of the constraints)"
            )
    else:
        status = "max_iterations"
        message = (
            f"max_rounds = {r} reached ({what} {dx:.2e}); KKT stationarity "
            f"{kkt.stationarity:.2e}, feasibility {kkt.feasibility:.2e}"
        )
    return status, message


def run_fedavg(compiled: CompiledModel, opts: FedAvgOptions, method: str = "fedavg"):
    """Run fedavg or fedprox."""
    t0 = time.perf_counter()
    opts.validate(compiled, method)
    names = [c.name for c in compiled.clients]
    n = len(names)
    reg_share = scaled_regularizer(compiled.regularizer, 1.0 / n)
    prox_coef = float(getattr(opts, "prox_coef", 0.0)) if method == "fedprox" else 0.0
    clients = {c.name: FedClient(c, reg_share, opts, prox_coef) for c in compiled.clients}
    runtime = SerialRuntime(clients)
    if not opts.keep_ledger:
        runtime.ledger = CountingLedger()
    server_has_terms = not compiled.server.is_empty
    coupling = (prox_coef if prox_coef > 0 else 1.0) * n
    server_local = (
        _local(compiled.server, Regularizer(), opts.penalty, opts, kind="exact")
        if server_has_terms
        else None
    )
    x_hat = starting_point(compiled, opts.w0)
    t_setup = time.perf_counter() - t0
    t_solve = time.perf_counter()
    deadline = t_solve + opts.time_limit if opts.time_limit else None

    if opts.weights == "samples":
        runtime.next_round()
        raw = {k: float(r.payload["n"]) for k, r in runtime.broadcast("samples", {}).items()}
    elif opts.weights == "uniform":
        raw = {k: 1.0 for k in names}
    else:
        raw = {k: float(opts.weights[k]) for k in names}
    total_w = sum(raw.values())
    p = {k: raw[k] / total_w for k in names}

    history: list[dict] = []
    snapshots: dict[int, dict] = {}
    snaps = {int(s) for s in opts.snapshot_iterations}
    stopped, status_override = False, None
    dx = np.inf
    r = 0
    for r in range(1, opts.max_rounds + 1):
        runtime.next_round()
        replies = runtime.broadcast("fed_round", {"x_hat": x_hat})
        x_bar = sum(p[k] * np.asarray(rep.payload["x"], dtype=float) for k, rep in replies.items())
        if server_local is not None:
            server_local.set_quadratic(coupling, x_bar)
            x_new = server_local.solve(x_bar)
        else:
            x_new = x_bar
        dx = float(np.abs(x_new - x_hat).max(initial=0.0))
        x_hat = x_new
        if not np.all(np.isfinite(x_hat)):
            status_override = "unbounded"
            break
        if opts.history:
            kkt, summary, _ = _evaluate(runtime, compiled, x_hat, opts.penalty)
            history.append(
                {
                    "iteration": r,
                    "objective": summary["objective"],
                    "max_violation": summary["max_violation"],
                    "stationarity": kkt.stationarity,
                    "feasibility": kkt.feasibility,
                    "dx_inf": dx,
                    "rounds": runtime.round,
                }
            )
        if opts.callback is not None:
            opts.callback(history[-1] if history else {"iteration": r, "dx_inf": dx})
        if r in snaps:
            reps = runtime.broadcast("snapshot", {}, channel="diagnostic")
            snapshots[r] = {
                "x_hat": x_hat.copy(),
                "local": {k: v.payload["x"] for k, v in reps.items()},
            }
        if dx <= opts.tol:
            stopped = True
            break
        if deadline is not None and time.perf_counter() > deadline:
            status_override = "time_limit"
            break

    kkt, summary, reports = _evaluate(runtime, compiled, x_hat, opts.penalty)
    status, message = _status(compiled, opts, stopped, kkt, r, dx, "||x_hat change||_inf")
    if status_override == "unbounded":
        status, message = "unbounded", "the iterates diverge (non-finite values)"
    elif status_override == "time_limit":
        status, message = (
            "time_limit",
            f"time limit of {opts.time_limit:g} s reached after {r} rounds",
        )
    finals = {
        k: v.payload for k, v in runtime.broadcast("report", {}, channel="diagnostic").items()
    }
    return _result(
        compiled,
        opts,
        method,
        status,
        message,
        x_hat,
        kkt,
        summary,
        reports,
        runtime,
        r,
        t_setup,
        t_solve,
        history,
        {"local_x": {k: v["x"] for k, v in finals.items()}, "weights": p, "snapshots": snapshots},
        finals,
    )


def _result(
    compiled,
    opts,
    method,
    status,
    message,
    x,
    kkt,
    summary,
    reports,
    runtime,
    r,
    t_setup,
    t_solve,
    history,
    extra,
    finals,
):
    multipliers = {
        prog.name: split_multipliers(prog, reports[prog.name]["mu_c"], reports[prog.name]["nu_c"])
        for prog in compiled.parties
        if prog.name in reports
    }
    return make_result(
        compiled,
        method=method,
        status=status,
        x=x,
        kkt=kkt,
        summary=summary,
        multipliers=multipliers,
        message=message,
        rounds={"outer": r, "inner": r, "communication": runtime.round},
        communication=communication_totals(runtime.ledger),
        timing={
            "compile": t_setup,
            "solve": time.perf_counter() - t_solve,
            "per_party": {k: float(v.get("seconds", 0.0)) for k, v in finals.items()},
            "local_iterations": {k: int(v.get("local_iterations", 0)) for k, v in finals.items()},
        },
        history=history,
        options={k: v for k, v in opts.__dict__.items() if k not in ("w0", "callback", "topology")},
        ledger=runtime.ledger.rows,
        extra=extra,
    )


# ---------------------------------------------------------------------------------------
# dgd


@dataclass
class DGDOptions:
    """Options of ``dgd`` (seed 004 eq. 55).

    Attributes
    ----------
    topology : networkx graph, hierarchical matrix, str or None
        The communication graph (default ``"chain"``); ``"server"`` may be a node.
    mixing : "metropolis" or array
        Mixing weights ``p_ij``: Metropolis-Hastings weights on the graph (default), or an
        ``n x n`` row-stochastic matrix over the nodes (clients in model order, then
        ``"server"`` if it is a node) with ``p_ij = 0`` off the graph's edges.
    step : float or None
        ``alpha``; ``None``: each node uses ``1 / (2 L_i)``, with ``L_i`` its own gradient's
        Lipschitz estimate at ``x^0`` (power iteration on Hessian-vector products); the
        factor 1/2 keeps the iteration stable for mixing matrices with eigenvalues down to
        -1/2.
    step_decay : float
        ``alpha_k = alpha / k^step_decay`` (0: constant step, which converges to an
        O(alpha) neighbourhood of the optimum; seed 004 expects ``alpha_k -> 0``).
    max_rounds : int
    tol : float or None
        Stop when every node moved less than ``tol`` (gathered on the diagnostic channel).
    penalty, eps, w0, history, callback, time_limit, keep_ledger, blas_threads : as for
        fedavg.
    """

    topology: Any = None
    mixing: Any = "metropolis"
    step: float | None = None
    step_decay: float = 0.0
    max_rounds: int = 1000
    tol: float | None = None
    penalty: float | None = None
    eps: float = 1e-3
    w0: Any = None
    history: bool = True
    callback: Any = None
    time_limit: float | None = None
    keep_ledger: bool = True
    snapshot_iterations: Any = ()
    blas_threads: int | None = 1

    def validate(self, compiled: CompiledModel, method: str) -> None:
        _int_at_least_1(method, "max_rounds", self.max_rounds)
        for name in ("step", "tol", "penalty"):
            if getattr(self, name) is not None:
                _positive(method, name, getattr(self, name))
        _positive(method, "eps", self.eps)
        if not (np.isfinite(self.step_decay) and self.step_decay >= 0):
            raise ModelError(f"{method}: step_decay must be >= 0, got {self.step_decay!r}")
        check_constraints(compiled, method, self.penalty)


class DGDNode(_Endpoint):
    """Node of dgd: keeps ``x_i`` and its neighbours' last iterates."""

    def __init__(self, program, reg_share, neighbours, weights, x0, opts: DGDOptions, runtime):
        self.name = program.name
        self.program = program
        self.penalty = opts.penalty
        self.local = _local(program, reg_share, opts.penalty, opts, kind="prox-grad", steps=1)
        self.neighbours = list(neighbours)
        self.weights = dict(weights)
        self.runtime = runtime
        self.x = np.array(x0, dtype=float)
        self.nbr = {j: self.x.copy() for j in self.neighbours}
        self.alpha = float(opts.step) if opts.step is not None else None
        self.decay = float(opts.step_decay)
        self.seconds = 0.0
        self.k = 0
        self.last_move = np.inf

    def handle(self, msg):
        if msg.kind == "dgd_x":
            self.nbr[msg.sender] = np.asarray(msg.payload["x"], dtype=float)
            return None
        return super().handle(msg)

    def _on_dgd_send(self):
        for j in self.neighbours:
            self.runtime.send_peer(self.name, j, "dgd_x", {"x": self.x})

    def _on_dgd_step(self):
        if self.alpha is None:
            L = self.local.lipschitz_estimate(self.x)
            self.alpha = 0.5 / L if L > 0 else 1.0
        self.k += 1
        alpha = self.alpha / self.k**self.decay
        mixed = self.weights[self.name] * self.x
        for j in self.neighbours:
            mixed = mixed + self.weights[j] * self.nbr[j]
        z = mixed - alpha * self.local.gradient_f(self.x)
        new = self.local.reg.prox(z, alpha) if not self.local.reg.is_zero else z
        self.last_move = float(np.abs(new - self.x).max(initial=0.0))
        self.x = new
        self.local.stats.iterations += 1

    def _on_state(self):
        return {"x": self.x.copy(), "move": self.last_move}

    def _on_evaluate(self, w):
        return evaluation_payload(self.program, np.asarray(w, dtype=float), self.penalty)

    def _on_snapshot(self):
        return {"x": self.x.copy()}

    def _on_report(self):
        return {
            "seconds": self.seconds,
            "local_iterations": self.local.stats.iterations,
            "x": self.x.copy(),
            "alpha": self.alpha,
        }


def _mixing(opts: DGDOptions, g, nodes: list[str], method: str) -> dict[str, dict[str, float]]:
    if isinstance(opts.mixing, str):
        if opts.mixing != "metropolis":
            raise ModelError(
                f"{method}: mixing must be 'metropolis' or a matrix, got {opts.mixing!r}"
            )
        return metropolis_weights(g, nodes)
    P = np.asarray(opts.mixing, dtype=float)
    if P.shape != (len(nodes), len(nodes)):
        raise ModelError(
            f"{method}: the mixing matrix must be {len(nodes)} x {len(nodes)} (nodes {nodes}), "
            f"got shape {P.shape}"
        )
    if np.any(P < 0) or not np.allclose(P.sum(axis=1), 1.0):
        raise ModelError(f"{method}: the mixing matrix must be nonnegative with rows summing to 1")
    out = {}
    for i, a in enumerate(nodes):
        row = {}
        for j, b in enumerate(nodes):
            if P[i, j] == 0:
                continue
            if a != b and not g.has_edge(a, b):
                raise ModelError(
                    f"{method}: mixing weight p[{a!r}, {b!r}] > 0 but they are not neighbours"
                )
            row[b] = float(P[i, j])
        row.setdefault(a, 0.0)
        out[a] = row
    return out


def run_dgd(compiled: CompiledModel, opts: DGDOptions, method: str = "dgd"):
    t0 = time.perf_counter()
    opts.validate(compiled, method)
    names = [c.name for c in compiled.clients]
    g = topology_graph(opts.topology, names)
    if SERVER not in g and not compiled.server.is_empty:
        raise UnsupportedError(
            f"{method} has no server, but the server holds terms or constraints; make 'server' "
            "a node of the topology"
        )
    nodes = names + ([SERVER] if SERVER in g else [])
    weights = _mixing(opts, g, nodes, method)
    reg_share = scaled_regularizer(compiled.regularizer, 1.0 / len(names))
    x0 = starting_point(compiled, opts.w0)
    runtime = SerialRuntime({})
    if not opts.keep_ledger:
        runtime.ledger = CountingLedger()
    endpoints = {}
    for s in nodes:
        prog = compiled.server if s == SERVER else compiled.program(s)
        nbrs = [j for j in weights[s] if j != s]
        endpoints[s] = DGDNode(
            prog, Regularizer() if s == SERVER else reg_share, nbrs, weights[s], x0, opts, runtime
        )
    runtime.endpoints.update(endpoints)
    runtime.client_seconds.update({s: 0.0 for s in endpoints})
    t_setup = time.perf_counter() - t0
    t_solve = time.perf_counter()
    deadline = t_solve + opts.time_limit if opts.time_limit else None
    history: list[dict] = []
    snapshots: dict[int, dict] = {}
    snaps = {int(s) for s in opts.snapshot_iterations}
    stopped, status_override = False, None
    move = np.inf

    def gather():
        states = {
            k: v.payload for k, v in runtime.broadcast("state", {}, channel="diagnostic").items()
        }
        x_avg = sum(s["x"] for s in states.values()) / len(states)
        return x_avg, max(s["move"] for s in states.values()), states

    r = 0
    for r in range(1, opts.max_rounds + 1):
        runtime.next_round()
        for s in nodes:
            runtime.activate(s, "dgd_send", {})
        runtime.deliver_peer_messages()
        for s in nodes:
            runtime.activate(s, "dgd_step", {})
        need = opts.history or opts.tol is not None or r in snaps
        if need:
            x_avg, move, states = gather()
            if not np.all(np.isfinite(x_avg)):
                status_override = "unbounded"
                break
            if opts.history:
                kkt, summary, _ = _evaluate(runtime, compiled, x_avg, opts.penalty)
                history.append(
                    {
                        "iteration": r,
                        "objective": summary["objective"],
                        "max_violation": summary["max_violation"],
                        "stationarity": kkt.stationarity,
                        "feasibility": kkt.feasibility,
                        "move_inf": move,
                        "rounds": runtime.round,
                    }
                )
            if r in snaps:
                snapshots[r] = {"x_avg": x_avg, "local": {k: v["x"] for k, v in states.items()}}
        if opts.callback is not None:
            opts.callback(history[-1] if history else {"iteration": r})
        if opts.tol is not None and move <= opts.tol:
            stopped = True
            break
        if deadline is not None and time.perf_counter() > deadline:
            status_override = "time_limit"
            break

    x_avg, move, states = gather()
    kkt, summary, reports = _evaluate(runtime, compiled, x_avg, opts.penalty)
    tol_opts = opts if opts.tol is not None else _WithTol(opts)
    status, message = _status(compiled, tol_opts, stopped, kkt, r, move, "largest node move")
    if status_override == "unbounded" or not np.all(np.isfinite(x_avg)):
        status, message = "unbounded", "the iterates diverge (non-finite values); lower step"
    elif status_override == "time_limit":
        status, message = (
            "time_limit",
            f"time limit of {opts.time_limit:g} s reached after {r} rounds",
        )
    finals = {
        k: v.payload for k, v in runtime.broadcast("report", {}, channel="diagnostic").items()
    }
    return _result(
        compiled,
        opts,
        method,
        status,
        message,
        x_avg,
        kkt,
        summary,
        reports,
        runtime,
        r,
        t_setup,
        t_solve,
        history,
        {
            "local_x": {k: v["x"] for k, v in finals.items()},
            "mixing": weights,
            "steps": {k: v["alpha"] for k, v in finals.items()},
            "snapshots": snapshots,
        },
        finals,
    )


class _WithTol:
    def __init__(self, opts):
        self.__dict__.update(opts.__dict__)
        self.tol = 0.0


def _run_fedavg(compiled, opts, method):
    with blas_threads(opts.blas_threads):
        return run_fedavg(compiled, opts, method)


def _run_dgd(compiled, opts, method):
    with blas_threads(opts.blas_threads):
        return run_dgd(compiled, opts, method)


register_method(
    "fedavg", MethodSpec(FedAvgOptions, _run_fedavg, "FedAvg baseline (penalty= for constraints)")
)
register_method(
    "fedprox",
    MethodSpec(FedProxOptions, _run_fedavg, "FedProx baseline (penalty= for constraints)"),
)
register_method(
    "dgd",
    MethodSpec(DGDOptions, _run_dgd, "DGD baseline, seed 004 eq. 55 (penalty= for constraints)"),
)
