"""prox-al: seed 000 Algorithm 1 (proximal AL, outer loop) with Algorithm 2 (inexact ADMM)
as the federated subproblem solver; also ``admm`` (Algorithm 2 alone).

The server half below holds only the server's program (``c_0``, server data, ``h``) and
``mu_0``; it reaches clients only through the runtime's messages (see
:mod:`fedmodel.algorithms.proxal.client` for the message table). Per outer iteration k:

1. tau_k = sbar / (k + 1)^2;
2. Algorithm 2 from w~^0 = w^k: for t = 0, 1, ... the server solves (14) to eps_{t+1} =
   q^t, broadcasts w^{t+1}; clients solve (15) and return (u~_i, eps~_i); stop on (19):
   eps_{t+1} + sum_i eps~_i <= tau_k (the server's measured residual replaces eps_{t+1}
   if it is larger);
3. mu_0 update on the server; w^{k+1} broadcast; clients update mu_i and return
   ||mu_i^{k+1} - mu_i^k||_inf (with the next ADMM initialisation u~_i^0);
4. stop on (8): ||w^{k+1} - w^k||_inf + beta tau_k <= beta eps1 and
   max_i ||mu_i^{k+1} - mu_i^k||_inf <= beta eps2.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedmodel.algorithms.common import (
    federated_evaluation,
    global_point,
    history_row,
    make_result,
    split_multipliers,
    starting_point,
)
from fedmodel.algorithms.proxal.client import ProxALClient
from fedmodel.algorithms.proxal.options import ProxALOptions
from fedmodel.compiler.partition import CompiledModel, PartyProgram
from fedmodel.compiler.regularizer import Regularizer
from fedmodel.runtime.base import Runtime
from fedmodel.runtime.checkpoint import (
    check_manifest,
    model_fingerprint,
    read_manifest,
    read_server_state,
    write_checkpoint,
)
from fedmodel.runtime.endpoints import EndpointFactory
from fedmodel.runtime.factory import make_runtime
from fedmodel.runtime.faults import inject_faults
from fedmodel.runtime.outcomes import ClientFailure
from fedmodel.subproblems.merit import MeritProblem
from fedmodel.subproblems.select import make_solver


@dataclass
class InnerOutcome:
    """Result of one run of Algorithm 2."""

    w: np.ndarray
    iterations: int
    bound: float  # eps_{t+1} + sum_i eps~_i: bounds dist_inf(0, d l_k(w)) (Theorem 4.1)
    satisfied: bool
    server_residual: float
    timed_out: bool = False


class ProxALServer:
    """Server half of prox-al / admm: aggregation, ``c_0`` with ``mu_0``, ``h``, stopping.

    Parameters
    ----------
    program : PartyProgram
        The server's own terms (``c_0``, optional ``f_0``) and data.
    regularizer : Regularizer
        ``h``.
    rhos : dict
        ``rho_i`` of every client (public algorithm parameters).
    n_clients : int
    options : ProxALOptions
    proximal : bool
        False for plain ADMM (method ``"admm"``).
    """

    def __init__(
        self,
        program: PartyProgram,
        regularizer: Regularizer,
        rhos: dict[str, float],
        n_clients: int,
        options: ProxALOptions,
        proximal: bool = True,
    ):
        layout = program.layout
        # where the server's view (shared variables, its own) sits in the model's vector
        self.view_index = layout.indices(layout.local(program.name).variables)
        program = program.local()
        self.program = program
        self.options = options
        self.beta = float(options.beta)
        self.rhos = dict(rhos)
        self.rho_sum = float(sum(rhos.values()))
        self.prox_weight = 1.0 / ((n_clients + 1) * self.beta) if proximal else 0.0
        self.proximal = proximal
        self.ns = program.layout.n_shared
        self.owned = program.layout.size > self.ns
        self.problem = MeritProblem([program], self.beta, regularizer)
        self.solver = make_solver(self.problem, options.solver)
        self.mu = np.full(program.m_ineq, float(options.mu0))
        self.nu = np.zeros(program.m_eq)
        self.local_iterations = 0

    def inner(
        self,
        runtime: Runtime,
        w_center: np.ndarray,
        u_tildes: dict[str, np.ndarray],
        tau: float,
        deadline: float | None = None,
    ) -> InnerOutcome:
        """Algorithm 2 on P_{0,k} + h + sum_i P_{i,k}, started from w~^0 = ``w_center``.

        ``w_center`` and the returned ``w`` are the server's view: the shared variables,
        then its own block ``theta_0`` (kept here with its share ``p`` of Algorithm 1's
        proximal term and a proximal-ADMM term of weight ``sum_i rho_i``; see the client
        module).
        """
        opts = self.options
        sigma = self.prox_weight + self.rho_sum
        ns = self.ns
        w = w_center
        bound = np.inf
        residual = np.inf
        floor = opts.local_floor * tau
        for t in range(opts.max_inner):
            eps = opts.q**t
            tol = max(eps, floor)  # local solves stop at tol; (19) stays a valid bound
            agg = sum(self.rhos[name] * u for name, u in u_tildes.items())
            center = (self.prox_weight * w_center[:ns] + agg) / sigma
            if self.owned:
                theta_c = (self.prox_weight * w_center[ns:] + self.rho_sum * w[ns:]) / sigma
                center = np.concatenate([center, theta_c])
            self.problem.set(sigma=sigma, center=center, mu=[self.mu], nu=[self.nu])
            report = self.solver.solve(w, tol, opts.max_local_iter)  # server step (14)
            self.local_iterations += report.iterations
            residual = report.residual
            if self.owned:  # the proximal-ADMM term on theta_0 is not part of l_k
                residual += self.rho_sum * float(np.abs(report.x[ns:] - w[ns:]).max())
            w = report.x
            runtime.next_round()
            replies = runtime.broadcast("admm_w", {"w": w[:ns], "tol": tol})
            u_tildes = {name: r.payload["u_tilde"] for name, r in replies.items()}
            bound = max(eps, residual) + sum(
                float(r.payload["eps_tilde"]) for r in replies.values()
            )
            if bound <= tau:  # (19)
                return InnerOutcome(w, t + 1, bound, True, residual)
            if deadline is not None and time.perf_counter() > deadline:
                return InnerOutcome(w, t + 1, bound, False, residual, timed_out=True)
        return InnerOutcome(w, opts.max_inner, bound, False, residual)

    def outer_change(self, w_new: np.ndarray, w_old: np.ndarray) -> float:
        """``||w^{k+1} - w^k||_inf`` of test (8) on the shared variables, and on the
        server's own block in Algorithm 1's block metric (``beta p ||.||_inf``)."""
        ns = self.ns
        dw = float(np.abs(w_new[:ns] - w_old[:ns]).max(initial=0.0))
        if self.owned and self.proximal:
            change = float(np.abs(w_new[ns:] - w_old[ns:]).max())
            dw = max(dw, self.beta * self.prox_weight * change)
        return dw

    def get_state(self) -> dict:
        """The server half's own state (``mu_0``, ``nu_0``, statistics)."""
        return {
            "mu": self.mu.copy(),
            "nu": self.nu.copy(),
            "local_iterations": self.local_iterations,
        }

    def set_state(self, state: dict) -> None:
        self.mu = np.array(state["mu"], dtype=float)
        self.nu = np.array(state["nu"], dtype=float)
        self.local_iterations = int(state["local_iterations"])

    def update_multipliers(self, w: np.ndarray) -> float:
        """mu_0^{k+1} = [mu_0^k + beta c_0(w^{k+1})]_+ (and nu_0 += beta a_0); returns the
        infinity-norm change."""
        ci, ce = self.problem.functions[0].constraint_values(w)
        change = 0.0
        if ci.size:
            new = np.maximum(self.mu + self.beta * ci, 0.0)
            change = float(np.abs(new - self.mu).max())
            self.mu = new
        if ce.size:
            step = self.beta * ce
            change = max(change, float(np.abs(step).max()))
            self.nu = self.nu + step
        return change


def _growth_note(w_norms: list[float], history: list[dict]) -> str:
    """Say so when the iterates grow steadily while the objective falls (unboundedness)."""
    half = w_norms[len(w_norms) // 2 :]
    if len(half) < 3 or half[0] <= 0:
        return ""
    growing = all(b > a for a, b in zip(half, half[1:])) and half[-1] >= 1.5 * half[0]
    falling = len(history) >= 3 and all(
        b["objective"] < a["objective"] for a, b in zip(history[-3:], history[-2:])
    )
    if growing and (falling or not history):
        return (
            f"; ||w||_inf grew steadily from {half[0]:.3g} to {half[-1]:.3g} while the "
            "objective kept falling, so the model may be unbounded below"
        )
    return ""


# Options whose change alters the iterates: a checkpoint resumes only with the same values.
_RESUME_OPTIONS = (
    "eps", "beta", "sbar", "rho", "q", "mu0", "max_inner", "max_local_iter", "local_floor",
    "solver", "divergence_limit",
)  # fmt: skip


@dataclass
class _Mark:
    """The outer loop's state at a consistent point (end of an outer iteration): what a
    failure or an interruption returns and what a checkpoint holds on the server side."""

    k_next: int
    x: np.ndarray
    u_tildes: dict
    history: list
    inner_total: int
    mu_norms: list
    w_norms: list
    last_eval: Any
    round: int
    ledger_rows: int
    server: dict

    def state(self, runtime) -> dict:
        d = dict(self.__dict__)
        d["ledger"] = list(runtime.ledger.rows[: self.ledger_rows])
        d["client_seconds"] = dict(runtime.client_seconds)
        return d


def _client_factories(compiled: CompiledModel, options: ProxALOptions, rhos, proximal):
    n = compiled.n_clients
    x0 = starting_point(compiled, options.w0, options.random_state)
    layout = compiled.layout
    return {
        c.name: EndpointFactory(
            ProxALClient,
            (
                c,
                options.beta,
                rhos[c.name],
                n,
                proximal,
                options.mu0,
                options.solver,
                options.max_local_iter,
                # the client's own block of the starting point (its own variables)
                x0[layout.indices(layout.owned_by(c.name))] if layout.has_owned else None,
            ),
        )
        for c in compiled.clients
    }


def run_prox_al(
    compiled: CompiledModel,
    options: ProxALOptions,
    method: str = "prox-al",
    *,
    faults: dict | None = None,
):
    """Run prox-al (``method="prox-al"``) or plain Algorithm 2 (``method="admm"``).

    The clients run on ``options.backend``; ``faults`` (client name ->
    :class:`~fedmodel.runtime.faults.Fault`) injects failures, for tests.
    """
    proximal = method == "prox-al"
    t_start = time.perf_counter()
    names = [c.name for c in compiled.clients]
    options.validate(names)
    rhos = options.rho_per_client(names)
    n = compiled.n_clients
    fingerprint = model_fingerprint(compiled)
    resume_options = {k: getattr(options, k) for k in _RESUME_OPTIONS}
    resume_options["rho"] = rhos
    manifest = None
    if options.resume is not None:  # check before starting any worker
        manifest = read_manifest(options.resume)
        check_manifest(
            manifest,
            method=method,
            model=fingerprint,
            options=resume_options,
            where=os.fspath(options.resume),
        )
        resumed = read_server_state(options.resume, manifest)
    factories = _client_factories(compiled, options, rhos, proximal)
    if faults:
        factories = inject_faults(factories, faults)
    runtime = make_runtime(
        options.backend,
        factories,
        workers=options.workers,
        server_hosts_clients=options.server_hosts_clients,
        ray_address=options.ray_address,
        client_timeout=options.client_timeout,
        on_failure=options.on_failure,
        retries=options.retries,
        weights={c.name: c.data_bytes() + 1 for c in compiled.clients},
    )
    try:
        server = ProxALServer(compiled.server, compiled.regularizer, rhos, n, options, proximal)
        if manifest is not None:
            runtime.load_party_checkpoint(options.resume, manifest["parties"])
            start = _Mark(**{k: resumed[k] for k in _Mark.__dataclass_fields__})
            runtime.ledger.rows = list(resumed["ledger"])
            runtime.client_seconds.update(resumed["client_seconds"])
        else:
            start = None
        compile_seconds = time.perf_counter() - t_start
        with runtime.deferred_interrupts():
            return _solve(
                compiled, options, method, runtime, server, start, compile_seconds,
                fingerprint, resume_options,
            )  # fmt: skip
    finally:
        runtime.close()


def _solve(
    compiled, options, method, runtime, server, start, compile_seconds, fingerprint, resume_opts
):
    proximal = method == "prox-al"
    t_solve = time.perf_counter()
    deadline = t_solve + options.time_limit if options.time_limit else None
    local = compiled.nonconvex
    max_outer = options.max_outer if proximal else 1
    status, message = "max_iterations", ""
    failure: ClientFailure | None = None
    interrupted = False
    checkpoint_note = ""
    checkpoint_written = None
    mark: _Mark | None = None

    def take_mark(k_next):
        nonlocal mark
        with runtime.critical():
            runtime.mark()
            mark = _Mark(
                k_next,
                x.copy(),
                dict(u_tildes),
                list(history),
                inner_total,
                list(mu_norms),
                list(w_norms),
                last_eval,
                runtime.round,
                len(runtime.ledger.rows),
                server.get_state(),
            )

    def save(reason):
        nonlocal checkpoint_written
        write_checkpoint(
            options.checkpoint,
            runtime,
            method=method,
            model=fingerprint,
            options=resume_opts,
            iteration=mark.k_next,
            server_state=mark.state(runtime),
            reason=reason,
        )
        checkpoint_written = os.fspath(options.checkpoint)

    try:
        if start is None:
            x = starting_point(compiled, options.w0, options.random_state)[server.view_index]
            runtime.next_round()
            start_w = {"w": x[: server.ns]}
            u_tildes = {
                k: r.payload["u_tilde"] for k, r in runtime.broadcast("start", start_w).items()
            }
            history: list[dict] = []
            inner_total, k = 0, -1
            last_eval = None
            mu_norms: list[float] = []
            w_norms: list[float] = []
        else:  # resume from a checkpoint
            x, u_tildes, history = start.x, dict(start.u_tildes), list(start.history)
            inner_total, k = start.inner_total, start.k_next - 1
            last_eval = start.last_eval
            mu_norms, w_norms = list(start.mu_norms), list(start.w_norms)
            server.set_state(start.server)
            runtime.round = start.round
        first = k + 1
        take_mark(first)
        for k in range(first, max_outer):
            tau = options.sbar / (k + 1) ** 2 if proximal else options.eps1
            outcome = server.inner(runtime, x, u_tildes, tau, deadline)
            inner_total += outcome.iterations
            w_new = outcome.w
            if not np.all(np.isfinite(w_new)) or np.abs(w_new).max() > options.divergence_limit:
                status = "unbounded"
                message = (
                    f"the iterates diverge (||w||_inf = {np.abs(w_new).max():.3g} at outer "
                    f"iteration {k}); the model is likely unbounded below. The last finite "
                    "iterate is returned."
                )
                break
            dw = server.outer_change(w_new, x)
            x = w_new
            if proximal:
                dmu = server.update_multipliers(x)
                runtime.next_round()
                replies = runtime.broadcast("outer", {"w": x[: server.ns]})
                dmu = max([dmu] + [float(r.payload["dmu_inf"]) for r in replies.values()])
                dw = max(
                    [dw] + [float(r.payload.get("dtheta_scaled", 0.0)) for r in replies.values()]
                )
                u_tildes = {name: r.payload["u_tilde"] for name, r in replies.items()}
            else:
                dmu = 0.0
            if options.history:
                last_eval = federated_evaluation(
                    runtime, server.program, compiled.regularizer, x, server.mu, server.nu, local
                )
                kkt, summary = last_eval
                history.append(
                    history_row(
                        k,
                        summary,
                        kkt,
                        inner_iterations=outcome.iterations,
                        inner_bound=outcome.bound,
                        tau=tau,
                        dw_inf=dw,
                        dmu_inf=dmu,
                        rounds=runtime.round,
                    )
                )
            if options.callback is not None:
                options.callback(
                    history[-1] if history else {"iteration": k, "rounds": runtime.round}
                )
            mu_norms.append(float(np.abs(server.mu).max(initial=0.0)))
            w_norms.append(float(np.abs(x).max(initial=0.0)))
            if not proximal:  # admm: one run of Algorithm 2 to tau = eps1
                status = "stopped" if outcome.satisfied else "max_iterations"
                break
            if (
                dw + options.beta * tau <= options.beta * options.eps1
                and dmu <= options.beta * options.eps2
            ):
                status = "stopped"  # (8) holds; the certificate below decides "optimal"
                break
            if deadline is not None and time.perf_counter() > deadline:
                status = "time_limit"
                message = (
                    f"time limit of {options.time_limit:g} s reached after {k + 1} outer iterations"
                )
                break
            take_mark(k + 1)
            if options.checkpoint is not None and (k + 1) % options.checkpoint_every == 0:
                with runtime.critical():
                    save("periodic")
    except ClientFailure as exc:
        failure = exc
    except KeyboardInterrupt:
        interrupted = True

    if failure is not None or interrupted:
        return _stopped_early(
            compiled, options, method, runtime, server, mark, failure, compile_seconds,
            t_solve, save, lambda: checkpoint_written,
        )  # fmt: skip

    if last_eval is None or history[-1]["iteration"] != k or status == "unbounded":
        last_eval = federated_evaluation(
            runtime, server.program, compiled.regularizer, x, server.mu, server.nu, local
        )
    kkt, summary = last_eval
    certified = kkt.satisfied(options.eps1, options.eps2)
    if status == "stopped":
        if certified:
            status = "optimal"
            message = f"(eps1, eps2) = ({options.eps1:g}, {options.eps2:g})-KKT point certified"
            if local:
                message += " (a local certificate: the model has non-convex terms)"
        else:
            status = "inaccurate"
            message = (
                "the stopping test (8) held but the recomputed KKT residuals "
                f"(stationarity {kkt.stationarity:.2e}, feasibility {kkt.feasibility:.2e}) "
                "exceed the tolerance; the inner ADMM probably hit max_inner. Raise "
                "max_inner or lower sbar."
            )
    elif status == "max_iterations" and not proximal:
        message = f"Algorithm 2 reached max_inner = {options.max_inner} before (19) held"
    elif status == "max_iterations":
        message = f"max_outer = {options.max_outer} outer iterations reached without meeting (8)"
        if certified:
            message += ", although the KKT certificate already holds"
        message += _growth_note(w_norms, history)
        if summary["max_violation"] > options.eps2 and len(mu_norms) >= 2:
            message += (
                f"; the max violation is still {summary['max_violation']:.3g} while the "
                "multipliers keep growing, so the model may be infeasible"
            )
    message += checkpoint_note

    reports = runtime.broadcast("report", {}, channel="diagnostic")
    multipliers = {compiled.server.name: split_multipliers(compiled.server, server.mu, server.nu)}
    per_party_seconds = {"server": 0.0}
    local_iters = {"server": server.local_iterations}
    owned = {}
    for c in compiled.clients:
        p = reports[c.name].payload
        multipliers[c.name] = split_multipliers(c, p["mu"], p["nu"])
        per_party_seconds[c.name] = p["seconds"]
        local_iters[c.name] = int(p["local_iterations"])
        owned[c.name] = p.get("owned")
    x = global_point(compiled, x, owned)
    return _result(
        compiled, options, method, runtime, server, status, message, x, kkt, summary,
        multipliers, k, inner_total, history, compile_seconds, t_solve, per_party_seconds,
        local_iters, checkpoint_written,
    )  # fmt: skip


def _result(
    compiled, options, method, runtime, server, status, message, x, kkt, summary, multipliers,
    k, inner_total, history, compile_seconds, t_solve, per_party_seconds, local_iters,
    checkpoint, failure=None,
):  # fmt: skip
    solve_seconds = time.perf_counter() - t_solve
    # the server's own time: what it did not spend waiting for the clients' replies
    per_party_seconds["server"] = max(0.0, solve_seconds - runtime.wait_seconds)
    totals = runtime.ledger.totals("algorithm")
    totals["diagnostic"] = runtime.ledger.totals("diagnostic")
    return make_result(
        compiled,
        method=method,
        status=status,
        x=x,
        kkt=kkt,
        summary=summary,
        multipliers=multipliers,
        message=message,
        rounds={"outer": k + 1, "inner": inner_total, "communication": runtime.round},
        communication=totals,
        timing={
            "compile": compile_seconds,
            "solve": solve_seconds,
            "per_party": per_party_seconds,
            "waiting": runtime.wait_seconds,
            "local_iterations": local_iters,
        },
        history=history,
        options={k_: v for k_, v in options.__dict__.items() if k_ not in ("w0", "callback")},
        ledger=runtime.ledger.rows,
        failure=failure or {},
        checkpoint=checkpoint,
        extra={
            "backend": runtime.backend,
            "placement": runtime.placement,
            "retries": list(runtime.retried),
        },
    )


def _stopped_early(
    compiled, options, method, runtime, server, mark, failure, compile_seconds, t_solve, save,
    written,
):  # fmt: skip
    """A client failed (policy exhausted) or the user pressed Ctrl-C: return the last
    consistent iterate (end of the last completed outer iteration), with every party put
    back to its state there, and write a checkpoint of it if asked."""
    notes = []
    try:
        runtime.recover()
    except Exception as exc:  # noqa: BLE001
        notes.append(f"recovering the workers failed ({exc})")
    if mark is None:  # failed before the first consistent point (the start round)
        x = starting_point(compiled, options.w0, options.random_state)[server.view_index]
        history, inner_total, k, last_eval = [], 0, -1, None
        server_state = None
    else:
        x, history, inner_total, k = mark.x, list(mark.history), mark.inner_total, mark.k_next - 1
        last_eval, server_state = mark.last_eval, mark.server
        server.set_state(server_state)
        try:
            runtime.restore_marks()
        except Exception as exc:  # noqa: BLE001
            notes.append(f"restoring the clients' states failed ({exc})")
        if options.checkpoint is not None:
            try:
                save("client_failure" if failure is not None else "interrupted")
            except Exception as exc:  # noqa: BLE001
                notes.append(f"no checkpoint could be written ({exc})")
    local = compiled.nonconvex
    usable = runtime.alive  # a client that raised may answer again; a dead one cannot
    kkt, summary = last_eval if last_eval is not None else (None, None)
    if summary is None and len(usable) == len(runtime.client_names):
        try:
            kkt, summary = federated_evaluation(
                runtime, server.program, compiled.regularizer, x, server.mu, server.nu, local
            )
        except (ClientFailure, KeyboardInterrupt):
            kkt, summary = None, None
    if summary is None:
        summary = {"objective": float("nan"), "max_violation": float("nan")}
        notes.append("the objective could not be evaluated without every client")
    multipliers = {compiled.server.name: split_multipliers(compiled.server, server.mu, server.nu)}
    per_party_seconds = {"server": 0.0}
    local_iters = {"server": server.local_iterations}
    owned = {}
    for c in compiled.clients:
        if c.name not in usable:
            continue
        try:
            p = runtime.send(c.name, "report", {}, channel="diagnostic").payload
        except (ClientFailure, KeyboardInterrupt):
            continue
        multipliers[c.name] = split_multipliers(c, p["mu"], p["nu"])
        per_party_seconds[c.name] = p["seconds"]
        local_iters[c.name] = int(p["local_iterations"])
        owned[c.name] = p.get("owned")
    x = global_point(compiled, x, owned)
    where = (
        f"the end of outer iteration {k}"
        if k >= 0
        else "the starting point (no outer iteration completed)"
    )
    info: dict[str, Any] = {}
    if failure is not None:
        status = "client_failure"
        name, out = next(iter(failure.failures.items()))
        info = {
            "client": name,
            "clients": list(failure.failures),
            "error": out.describe(),
            "kind": out.kind,
            "round": failure.round,
            "message_kind": failure.kind,
            "traceback": out.detail,
        }
        message = (
            f"client '{name}' failed in round {failure.round} ('{failure.kind}' message, "
            f"{out.kind}): {out.describe()}"
        )
        if len(failure.failures) > 1:
            message += f" (also failed: {sorted(failure.failures)[1:]})"
        message += f". Returned the last consistent iterate, {where}."
    else:
        status = "interrupted"
        message = f"interrupted (Ctrl-C); returned the last consistent iterate, {where}."
    ckpt = written()
    if ckpt:
        message += f" Checkpoint written to {ckpt!r}: continue with resume={ckpt!r}."
    if notes:
        message += " Note: " + "; ".join(notes) + "."
    return _result(
        compiled, options, method, runtime, server, status, message, x, kkt, summary,
        multipliers, k, inner_total, history, compile_seconds, t_solve, per_party_seconds,
        local_iters, ckpt, failure=info,
    )  # fmt: skip
