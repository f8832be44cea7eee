"""Run a learning method on a :class:`~fedmodel.dsl.learning.LearningModel`: build the
client halves where they run (each from its own rows or columns only) and the server half,
and hand both to :func:`fedmodel.algorithms.driver.run_federated` (``compiled=None``: the
server half supplies the fingerprint, the evaluation round and the ``Result``). So every
backend, the ledger, history every ``eval_every`` rounds, the callback, the time limit,
checkpoints and resume, and client failures work as for every other method.

``res.extra`` holds the per-round accounting (``per_round``: floats per link and samples
per client, from the ledger), the final slack and multipliers of constrained runs, the
check of the step-size conditions and the final full gradient's norm (sample-based;
``res.kkt.stationarity`` is its infinity norm, ``res.kkt.feasibility`` the largest
constraint violation).
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from fedmodel.algorithms.driver import run_federated
from fedmodel.algorithms.options import build_options
from fedmodel.algorithms.ssca.constraints import (
    check_loss_output,
    evaluate_function,
    feature_losses,
    own_functions,
    sample_tasks,
)
from fedmodel.algorithms.ssca.feature import FeatureClient, FeatureServer
from fedmodel.algorithms.ssca.options import SGDOptions, SSCAOptions, check_conditions
from fedmodel.algorithms.ssca.sample import SampleClient, SampleServer
from fedmodel.algorithms.ssca.surrogate import SurrogateState
from fedmodel.errors import ModelError, UnsupportedError
from fedmodel.result import Result
from fedmodel.runtime.blas import blas_threads
from fedmodel.runtime.endpoints import RUNTIME_PROXY, EndpointFactory

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
    opts.validate(model, method)
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
    kind = "ssca" if ssca else "sgd"
    state = _state(model, opts) if ssca else None
    names = model.party_names
    if model.partition == "sample":
        sizes = {n: len(X) for n, (X, _) in model.clients.items()}
        small = {n: s for n, s in sizes.items() if s < opts.batch_size}
        if small:
            raise ModelError(
                f"batch_size = {opts.batch_size} exceeds the rows of clients {small} (B <= N_i)"
            )
        _probe_sample(model, w0)
        factories, tasks = {}, {}
        for k, (n, (X, Y)) in enumerate(model.clients.items()):
            send_value = ssca and any(
                c.kind == "loss" and c.party in ("server", n) for c in model.constraints
            )
            tasks[n] = sample_tasks(model.constraints, n) if ssca else []
            kw = {
                "send_value": send_value,
                "constraint_tasks": tuple(_task(model.constraints[m]) for m in tasks[n]),
            }
            if not ssca:
                kw.update(
                    lam=model.lam, lr=opts.lr, momentum=opts.momentum, local_steps=opts.local_steps
                )
            factories[n] = EndpointFactory(
                SampleClient, (n, k, X, Y, loss, opts.batch_size, opts.seed), kw
            )
        E = 1 if ssca else opts.local_steps
        samples = {n: min(opts.batch_size, s) * E for n, s in sizes.items()}
        server = SampleServer(kind, model, w0, opts, state, method, samples, sizes, tasks)
        return factories, server
    general = [c for c in model.constraints if c.kind == "sample" or c.party != "server"]
    if ssca and opts.one_step and general:
        raise UnsupportedError(
            f"one_step=True (Remark 4) collects the objective's loss only; {general[0].describe()}"
            " needs Algorithm 4's collection (one_step=False)"
        )
    if opts.batch_size > len(model.X):
        raise ModelError(f"batch_size = {opts.batch_size} exceeds the {len(model.X)} rows")
    designated = opts.designated or names[0]
    if designated not in names:
        raise ModelError(f"designated={designated!r} is not a client ({names})")
    index = loss.split(model.blocks)
    _probe_feature(model, w0, index)
    closses = tuple(
        (model.constraints[m].label, model.constraints[m].loss)
        for m in feature_losses(model.constraints)
    )
    factories = {}
    for k, n in enumerate(names):
        cols = model.blocks[k]
        test = None if model.test is None else (model.test[0][:, cols], model.test[1])
        functions = tuple(
            (model.constraints[m].label, model.constraints[m].function)
            for m in own_functions(model.constraints, n)
        )
        factories[n] = EndpointFactory(
            FeatureClient,
            (n, model.X[:, cols], model.Y, loss, [p for p in names if p != n], RUNTIME_PROXY),
            {
                "designated": n == designated,
                "send_value": ssca and any(c.kind == "loss" for c in model.constraints),
                "test": test,
                "closses": closses if ssca else (),
                "functions": functions if ssca else (),
            },
        )
    samples = {n: min(opts.batch_size, len(model.X)) for n in names}
    server = FeatureServer(kind, model, w0, opts, state, method, samples, index, designated)
    return factories, server


def _task(con) -> tuple:
    """What a sample-based client computes for constraint ``con``."""
    return (con.kind, con.label, con.loss if con.kind == "sample" else con.function)


def _probe_sample(model, w0: np.ndarray) -> None:
    """Evaluate every constraint's loss or function once at ``w0`` before the run, so that
    a wrong output is refused here, naming the party and the constraint (not as a client
    failure in round 1)."""
    d = w0.size
    for con in model.constraints:
        if con.kind == "function" and con.party == "server":
            evaluate_function(con.function, (w0,), d, con.label, "server")
        elif con.kind == "function":
            X, Y = model.clients[con.party]
            evaluate_function(con.function, (w0, X, Y), d, con.label, con.party)
        elif con.kind == "sample":
            X, Y = (
                model.clients[con.party]
                if con.party != "server"
                else next(iter(model.clients.values()))
            )
            check_loss_output(con.loss, w0, X[:2], Y[:2], con)


def _probe_feature(model, w0: np.ndarray, index: list[np.ndarray]) -> None:
    """The feature-based counterpart of :func:`_probe_sample` (a client's function on its
    block of ``w0`` and its columns)."""
    names = model.party_names
    for con in model.constraints:
        if con.kind == "function" and con.party == "server":
            evaluate_function(con.function, (w0,), w0.size, con.label, "server")
        elif con.kind == "function":
            k = names.index(con.party)
            wi = w0[index[k + 1]]
            Z = model.X[:, model.blocks[k]]
            evaluate_function(con.function, (wi, Z, model.Y), wi.size, con.label, con.party)
        elif con.kind == "sample":
            check_loss_output(con.loss, w0, model.X[:2], model.Y[:2], con)


ONE_STEP_WARNING = (
    "one_step=True (Remark 4): every client sends dh_i/dw_i of the batch to the server; for "
    "the MLP these are its raw features (footnote 16 of seed 003)"
)


def _run(model, method, opts, conditions) -> Result:
    factories, server = _build(model, method, opts)
    if opts.one_step and model.partition == "feature":
        warnings.warn(ONE_STEP_WARNING, stacklevel=4)
    res = run_federated(None, opts, method, server, factories)
    if conditions is not None:
        res.extra["schedule_conditions"] = conditions
    if opts.one_step and model.partition == "feature":
        res.extra["privacy"] = ONE_STEP_WARNING
    return res
