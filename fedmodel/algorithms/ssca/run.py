"""Run a learning method on a :class:`~fedmodel.dsl.learning.LearningModel`: build the
client halves where they run (each from its own rows or columns only), loop the rounds
through the runtime, evaluate, and return a :class:`~fedmodel.result.Result`.

This family has its own round loop (like ``algorithms/vfl/run.py``), not
``driver.run_federated``: the driver is written around a compiled cvxpy model (its
fingerprint, the KKT certificate round, ``make_result``). What the loop gives: every
backend (the halves are :class:`~fedmodel.algorithms.protocol.ClientHalf` built from
:class:`~fedmodel.runtime.endpoints.EndpointFactory`), the ledger and communication
totals, history every ``eval_every`` rounds, the callback, client failures as a status.
Not given: checkpoints/resume and time limits.

``res.extra`` holds the per-round accounting (``per_round``: floats per link and samples
per client, from the ledger), the final slack and multipliers of constrained runs, the
check of the step-size conditions and the final full gradient (sample-based).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from fedmodel.algorithms.options import build_options
from fedmodel.algorithms.ssca.feature import FeatureClient, FeatureServer
from fedmodel.algorithms.ssca.options import SGDOptions, SSCAOptions, check_conditions
from fedmodel.algorithms.ssca.sample import SampleClient, SampleServer
from fedmodel.algorithms.ssca.surrogate import SurrogateState
from fedmodel.errors import ModelError, UnsupportedError
from fedmodel.result import Result
from fedmodel.runtime.blas import blas_threads
from fedmodel.runtime.endpoints import RUNTIME_PROXY, EndpointFactory
from fedmodel.runtime.factory import make_runtime
from fedmodel.runtime.messages import CountingLedger, communication_totals
from fedmodel.runtime.outcomes import ClientFailure

#: method -> (partition it runs on: "sample", "feature" or "both"; options; description)
LEARNING_METHODS: dict[str, tuple[str, type, str]] = {
    "ssca": (
        "both",
        SSCAOptions,
        "seed 003 Algorithms 1-4: mini-batch SSCA (sample- or feature-based, constrained via "
        "the exact-penalty slack problem)",
    ),
    "fedsgd": ("sample", SGDOptions, "FedSGD: one local SGD step of batch B per round"),
    "fedavg-sgd": ("sample", SGDOptions, "FedAvg: E local SGD steps of batch B per round"),
    "sgd-m": ("sample", SGDOptions, "local momentum SGD (E steps), models averaged"),
    "vertical-sgd": ("feature", SGDOptions, "vertical SGD with Algorithm 3's collection"),
    "vertical-sgd-m": ("feature", SGDOptions, "vertical momentum SGD, Algorithm 3's collection"),
}
MOMENTUM_METHODS = ("sgd-m", "vertical-sgd-m")


def fit(model, method: str = "ssca", **options: Any) -> Result:
    """Train ``model`` (a :class:`~fedmodel.dsl.learning.LearningModel`) with ``method``.

    Examples
    --------
    >>> # res = fit(model, "ssca", rounds=100, batch_size=10)  (see LearningModel)
    """
    if method not in LEARNING_METHODS:
        raise ModelError(
            f"unknown learning method {method!r}; choose one of {tuple(LEARNING_METHODS)}"
        )
    where, cls, _ = LEARNING_METHODS[method]
    model.check()
    if where != "both" and where != model.partition:
        raise UnsupportedError(
            f"method={method!r} is {where}-based; model {model.name!r} is {model.partition}-based"
            f" (use {'vertical-sgd' if model.partition == 'feature' else 'fedavg-sgd'} or 'ssca')"
        )
    if cls is SGDOptions:
        if model.constraints:
            raise UnsupportedError(
                f"method={method!r} has no constraint handling (the paper has no constrained "
                "baseline); use method='ssca'"
            )
        if model.objective != "loss":
            raise UnsupportedError(f"method={method!r} trains objective='loss' models only")
        if method in MOMENTUM_METHODS and "lr" not in options:
            options = {**options, "lr": 0.3}  # the paper's constant rate for SGD-m
        if method in MOMENTUM_METHODS and "momentum" not in options:
            options = {**options, "momentum": 0.1}
        if method not in MOMENTUM_METHODS:
            if options.get("momentum", 0.0) not in (0, 0.0):
                raise ModelError(f"method={method!r} has no momentum; use sgd-m / vertical-sgd-m")
            options = {**options, "momentum": 0.0}
        if (
            method in ("fedsgd", "vertical-sgd", "vertical-sgd-m")
            and options.get("local_steps", 1) != 1
        ):
            raise ModelError(f"method={method!r} takes one step per round (local_steps=1)")
    opts = build_options(cls, options, method)
    opts.validate()
    conditions = None
    if cls is SSCAOptions:
        conditions = check_conditions(opts.rho, opts.gamma, opts.rounds)
        if opts.check_schedules == "raise" and not conditions["satisfied"]:
            raise ModelError("step sizes fail the conditions: " + "; ".join(conditions["failed"]))
    with blas_threads(opts.blas_threads):
        return _run(model, method, opts, conditions)


def _state(model, opts) -> SurrogateState:
    return SurrogateState(
        model.loss.dim,
        opts.tau,
        lam=model.lam,
        objective=model.objective,
        bounds=[c.U for c in model.constraints],
        c=opts.c,
        solver=opts.server_solver,
    )


def _build(model, method, opts):
    loss = model.loss
    w0 = loss.init(opts.seed) if opts.w0 is None else np.array(opts.w0, dtype=float)
    if w0.shape != (loss.dim,):
        raise ModelError(f"w0 must have shape ({loss.dim},), got {w0.shape}")
    ssca = method == "ssca"
    state = _state(model, opts) if ssca else None
    names = model.party_names
    if model.partition == "sample":
        sizes = {n: len(X) for n, (X, _) in model.clients.items()}
        small = {n: s for n, s in sizes.items() if s < opts.batch_size}
        if small:
            raise ModelError(
                f"batch_size = {opts.batch_size} exceeds the rows of clients {small} (B <= N_i)"
            )
        factories = {}
        for k, (n, (X, Y)) in enumerate(model.clients.items()):
            send_value = ssca and any(c.party in ("server", n) for c in model.constraints)
            kw = {"send_value": send_value}
            if not ssca:
                kw.update(
                    lam=model.lam, lr=opts.lr, momentum=opts.momentum, local_steps=opts.local_steps
                )
            factories[n] = EndpointFactory(
                SampleClient, (n, k, X, Y, loss, opts.batch_size, opts.seed), kw
            )
        server = SampleServer(
            "ssca" if ssca else "sgd", sizes, w0, opts, state, model.constraints, loss
        )
        samples = {
            n: min(opts.batch_size, s) * (1 if ssca else opts.local_steps) for n, s in sizes.items()
        }
        return factories, server, samples
    if any(c.party != "server" for c in model.constraints):
        raise UnsupportedError("feature-based models take constraints on the whole loss only")
    if opts.batch_size > len(model.X):
        raise ModelError(f"batch_size = {opts.batch_size} exceeds the {len(model.X)} rows")
    designated = opts.designated or names[0]
    if designated not in names:
        raise ModelError(f"designated={designated!r} is not a client ({names})")
    index = loss.split(model.blocks)
    factories = {}
    for k, n in enumerate(names):
        cols = model.blocks[k]
        test = None if model.test is None else (model.test[0][:, cols], model.test[1])
        factories[n] = EndpointFactory(
            FeatureClient,
            (n, model.X[:, cols], model.Y, loss, [p for p in names if p != n], RUNTIME_PROXY),
            {
                "designated": n == designated,
                "send_value": ssca and bool(model.constraints),
                "test": test,
            },
        )
    server = FeatureServer(
        "ssca" if ssca else "sgd",
        names,
        index,
        len(model.X),
        w0,
        opts,
        state,
        model.constraints,
        loss,
        designated,
        lam=model.lam,
        has_test=model.test is not None,
    )
    samples = {n: min(opts.batch_size, len(model.X)) for n in names}
    return factories, server, samples


def _objective(model, w, row) -> float:
    if model.objective == "norm":
        return float(w @ w)
    return row["train_loss"] + model.lam * float(w @ w)


def _run(model, method, opts, conditions) -> Result:
    t0 = time.perf_counter()
    factories, server, samples = _build(model, method, opts)
    runtime = make_runtime(
        opts.backend,
        factories,
        workers=opts.workers,
        server_hosts_clients=opts.server_hosts_clients,
        ray_address=opts.ray_address,
        client_timeout=opts.client_timeout,
        on_failure=opts.on_failure,
        retries=opts.retries,
    )
    if not opts.keep_ledger:
        runtime.ledger = CountingLedger()
    test = model.test if model.partition == "sample" else None
    history: list[dict[str, Any]] = []
    t_setup = time.perf_counter() - t0
    t1 = time.perf_counter()

    def record(t, info):
        row = {"round": t, **server.evaluate(runtime, test), **info}
        row["objective"] = _objective(model, server.w, row)
        row["norm_sq"] = float(server.w @ server.w)
        if model.constraints:
            row["slack"] = [float(s) for s in server.slack]
        history.append(row)
        if opts.callback is not None:
            opts.callback(row)

    status, message, failure = "max_iterations", "", {}
    try:
        try:
            record(0, {})
            info: dict[str, Any] = {}
            for t in range(1, opts.rounds + 1):
                info = server.step(runtime)
                if not np.all(np.isfinite(server.w)):
                    status = "unbounded"
                    message = f"the iterate is no longer finite in round {t}; lower the steps"
                    break
                if t == opts.rounds or (opts.eval_every and t % opts.eval_every == 0):
                    record(t, info)
            grad = server.full_gradient(runtime) if hasattr(server, "full_gradient") else None
            reports = runtime.broadcast("report", {}, channel="diagnostic")
        except ClientFailure as exc:
            first = exc.clients[0]
            outcome = exc.failures[first]
            status = "client_failure"
            message = (
                f"client {first!r} failed in round {exc.round} ({exc.kind}): {outcome.describe()}"
            )
            failure = {
                "client": first,
                "clients": exc.clients,
                "error": outcome.describe(),
                "kind": outcome.kind,
                "round": exc.round,
                "message_kind": exc.kind,
                "traceback": outcome.detail,
            }
            grad, reports = None, {}
        comm = communication_totals(runtime.ledger)
        ledger_rows = list(runtime.ledger.rows)
        n_rounds = runtime.round
        backend = runtime.backend
    finally:
        runtime.close()
    last = history[-1] if history else {"train_loss": float("nan"), "constraint_values": []}
    w = server.w
    violation = max([0.0, *last.get("constraint_values", [])])
    if status == "max_iterations":
        message = (
            f"{opts.rounds} rounds done (a stochastic method with a round budget): training "
            f"loss {last['train_loss']:.4g}"
        )
        if model.constraints:
            message += f", largest constraint violation {violation:.3g}"
    rounds_done = server.t
    per_round = _per_round(comm, rounds_done, samples)
    extra: dict[str, Any] = {
        "partition": model.partition,
        "per_round": per_round,
        "samples": {n: float(r.payload.get("samples", 0)) for n, r in reports.items()},
        "backend": backend,
    }
    if conditions is not None:
        extra["schedule_conditions"] = conditions
    if grad is not None:
        extra["gradient_norm"] = float(
            np.linalg.norm(grad + (2 * model.lam * w if model.objective == "loss" else 0))
        )
    multipliers = {}
    if model.constraints:
        extra["slack"] = np.asarray(server.slack, dtype=float)
        extra["nu"] = np.asarray(server.nu, dtype=float)
        multipliers = {
            "server": {
                f"loss[{c.party}] <= {c.U:g}": np.array(server.nu[k])
                for k, c in enumerate(model.constraints)
            }
        }
    return Result(
        status=status,
        method=method,
        objective=_objective(model, w, last) if history else float("nan"),
        max_violation=violation,
        x=w.copy(),
        solution={"w": w.copy()},
        multipliers=multipliers,
        kkt=None,
        rounds={"outer": rounds_done, "communication": n_rounds},
        communication=comm,
        timing={"compile": t_setup, "solve": time.perf_counter() - t1},
        history=history,
        message=message,
        options=opts.to_dict(),
        ledger=ledger_rows,
        extra=extra,
        failure=failure,
    )


def _per_round(comm: dict, rounds: int, samples: dict) -> dict[str, Any]:
    """Algorithm traffic per round and link (floats), and samples per client and round."""
    r = max(rounds, 1)
    per = comm.get("per_party", {})
    out = {
        "floats_up": comm["floats_up"] / r,
        "floats_down": comm["floats_down"] / r,
        "floats_peer": comm["floats_peer"] / r,
        "per_client": {
            n: {
                "floats_sent": per.get(n, {}).get("floats_sent", 0) / r,
                "floats_received": per.get(n, {}).get("floats_received", 0) / r,
                "samples": samples[n],
            }
            for n in samples
        },
        "samples": float(np.mean(list(samples.values()))) if samples else 0.0,
    }
    return out
