"""Drive fair-vfl / fedbcd: build the parties where they run, loop the rounds, certify.

:func:`solve_vertical` is the entry point of the family (``method="fair-vfl"`` or
``"fedbcd"``). The server half talks to the parties only through the runtime; each party
is built from an :class:`~fedmodel.runtime.base.EndpointFactory` holding its own block
only. Asynchrony on the serial runtime is simulated deterministically: within a round a
party's updates read the others' blocks as of the last exchange (eq. 11), so the order in
which the parties run does not change the result; on the processes and Ray runtimes the
parties' local updates run at the same time.

Examples
--------
>>> import numpy as np
>>> from fedmodel.algorithms.vfl.problem import VerticalProblem
>>> rng = np.random.default_rng(0)
>>> X = rng.normal(size=(200, 6)); a = rng.random(200) < 0.5
>>> y = np.where(X[:, 0] + a + 0.5 * rng.normal(size=200) > 0.5, 1.0, -1.0)
>>> prob = VerticalProblem.from_columns(X, y, a, [3, 3])
>>> res = solve_vertical(prob, "fair-vfl", eps=0.05, eta=2.0, beta=10.0, Q=2, max_rounds=300)
>>> res.extra["train"]["deo_loss"] <= 0.05 + 1e-2
True
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from fedmodel.algorithms.vfl.client import VFLParty
from fedmodel.algorithms.vfl.metrics import score_metrics
from fedmodel.algorithms.vfl.options import FairVFLOptions, lipschitz_bounds
from fedmodel.algorithms.vfl.problem import VerticalProblem
from fedmodel.algorithms.vfl.server import VFLServer
from fedmodel.certificate.kkt import KKTResiduals, feasibility_residual
from fedmodel.errors import ModelError
from fedmodel.result import Result
from fedmodel.runtime.endpoints import EndpointFactory
from fedmodel.runtime.factory import make_runtime
from fedmodel.runtime.messages import CountingLedger, communication_totals
from fedmodel.runtime.outcomes import ClientFailure

DESCRIPTIONS = {
    "fair-vfl": "seed 002 Algorithms 1-2: async gradient coordinate-descent ascent (DEO)",
    "fedbcd": "FedBCD (Liu et al. 2019): unconstrained vertical block descent, Q local steps",
}


def build_options(options: FairVFLOptions | None = None, **kw: Any) -> FairVFLOptions:
    if options is None:
        options = FairVFLOptions()
    fields = FairVFLOptions.__dataclass_fields__
    unknown = sorted(set(kw) - set(fields))
    if unknown:
        raise ModelError(f"unknown option(s) {unknown} of fair-vfl/fedbcd; known: {sorted(fields)}")
    for k, v in kw.items():
        setattr(options, k, v)
    return options


def party_factories(problem: VerticalProblem, opts: FairVFLOptions, consts) -> dict:
    """One factory per party, holding that party's block (and test block) only."""
    out = {}
    for k, name in enumerate(problem.party_names):
        test = problem.test_blocks[k] if problem.test_blocks is not None else None
        out[name] = EndpointFactory(
            VFLParty,
            (name, problem.blocks[k], problem.y, problem.group_a, k, opts, consts),
            {"K": problem.K, "l2": problem.l2, "X_test": test},
        )
    return out


def solve_vertical(
    problem: VerticalProblem,
    method: str = "fair-vfl",
    options: FairVFLOptions | None = None,
    callback=None,
    faults=None,
    **kw: Any,
) -> Result:
    """Run ``fair-vfl`` or ``fedbcd`` on ``problem``; returns a :class:`Result`.

    ``res.history`` has one row per monitored round ``t``, written after the round: the
    loss, objective, DEO, violation and training accuracy at ``theta^(t+1)`` (``round`` =
    ``t + 1`` rounds done), the multipliers ``lambda^(t)`` used in the round, and the
    stationarity gap (12) at ``(theta^(t), lambda^(t))``; ``res.extra`` holds ``lambda``, the training and test metrics
    (:func:`~fedmodel.algorithms.vfl.metrics.score_metrics`) and the final scores.
    """
    if method not in DESCRIPTIONS:
        raise ModelError(f"unknown vertical method {method!r}; choose one of {tuple(DESCRIPTIONS)}")
    opts = build_options(options, **kw)
    opts.validate(problem.K)
    constrained = method == "fair-vfl"
    t0 = time.perf_counter()
    consts = (1.0, 1.0)
    if opts.schedule == "theorem2":
        consts = tuple(opts.lipschitz) if opts.lipschitz is not None else lipschitz_bounds(problem)
    factories = party_factories(problem, opts, consts)
    if faults:
        from fedmodel.runtime.faults import inject_faults

        factories = inject_faults(factories, faults)
    runtime = make_runtime(
        opts.backend,
        factories,
        workers=opts.workers,
        client_timeout=opts.client_timeout,
        on_failure=opts.on_failure,
        retries=opts.retries,
    )
    if not opts.keep_ledger:
        runtime.ledger = CountingLedger()
    server = VFLServer(problem.y, problem.group_a, opts, problem.K, consts, constrained)
    t_setup = time.perf_counter() - t0
    t1 = time.perf_counter()
    history: list[dict[str, Any]] = []
    status, reason, gap = "max_iterations", "max_rounds", np.inf
    try:
        server.start(runtime)
        for t in range(opts.max_rounds):
            server.step(runtime)
            if not np.all(np.isfinite(server.scores)):
                status, reason = "unbounded", "the scores are no longer finite; lower the steps"
                break
            last = t == opts.max_rounds - 1
            if t % opts.monitor_every == 0 or last:
                reps = runtime.broadcast("vfl_monitor", {}, channel="diagnostic")
                step_sq = sum(r.payload["step_sq"] for r in reps.values())
                reg = sum(r.payload["regularizer"] for r in reps.values())
                dual = server.state["dual_residual"]
                gap = float(np.sqrt(step_sq + dual @ dual))
                row = server.summary(server.scores)
                row.update(
                    objective=row["data_loss"] + reg,
                    gap=gap,
                    local_updates=sum(r.payload["updates"] for r in reps.values()),
                )
                history.append(row)
                if callback is not None:
                    callback(row)
                if opts.tol > 0 and gap <= opts.tol:
                    status, reason = "stopped", "gap"
                    break
    except ClientFailure as exc:
        runtime.close()
        return _failed(problem, opts, method, server, runtime, history, exc, t_setup, t1)
    except BaseException:
        runtime.close()
        raise
    try:
        return _finish(
            problem, opts, method, server, runtime, history, status, reason, gap, t_setup, t1
        )
    finally:
        runtime.close()


def _failed(problem, opts, method, server, runtime, history, exc, t_setup, t1) -> Result:
    """Status ``client_failure``: the round did not complete; the parties' blocks are not
    collected (the last consistent scores and ``lambda`` are in ``extra``)."""
    first = exc.clients[0]
    outcome = exc.failures[first]
    return Result(
        status="client_failure",
        method=method,
        objective=float("nan"),
        max_violation=float("nan"),
        x=np.zeros(0),
        solution={},
        multipliers={},
        kkt=None,
        rounds={"outer": int(server.state["t"]), "communication": runtime.round},
        communication=communication_totals(runtime.ledger),
        timing={"compile": t_setup, "solve": time.perf_counter() - t1},
        history=history,
        message=f"party {first!r} failed in round {exc.round} ({exc.kind}): {outcome.describe()}",
        options=opts.to_dict(),
        ledger=list(runtime.ledger.rows),
        extra={"lambda": server.lam.copy(), "scores": server.scores.copy()},
        failure={
            "client": first,
            "clients": exc.clients,
            "error": outcome.describe(),
            "kind": outcome.kind,
            "round": exc.round,
            "message_kind": exc.kind,
            "traceback": outcome.detail,
        },
    )


def _finish(problem, opts, method, server, runtime, history, status, reason, gap, t_setup, t1):
    constrained = server.constrained
    z = server.scores
    lam = server.lam.copy()
    f = server.scores_of
    reps = runtime.broadcast(
        "vfl_kkt",
        {"scores": z, "lambda": lam} if constrained else {"scores": z},
        channel="diagnostic",
    )
    stationarity = max(r.payload["grad_inf"] for r in reps.values())
    mon = runtime.broadcast("vfl_monitor", {}, channel="diagnostic")
    reg = sum(r.payload["regularizer"] for r in mon.values())
    cvals = f.constraint_values(z, opts.eps)
    if constrained:
        feas = feasibility_residual(cvals, np.zeros(0), lam)
        violation = max(0.0, float(cvals.max()))
        compl = np.abs(lam * cvals)
    else:
        feas, violation, compl = 0.0, 0.0, np.zeros(2)
    kkt = KKTResiduals(stationarity, feas, {"server": feas}, local=constrained)
    certified = kkt.satisfied(opts.kkt_tol, opts.kkt_tol)
    rounds = int(server.state["t"])
    if status in ("stopped", "max_iterations") and certified:
        how = "gap (12) <= tol" if status == "stopped" else f"{rounds} rounds"
        status = "optimal"
        message = (
            f"{how}; local KKT certificate within {opts.kkt_tol:g} (stationarity "
            f"{stationarity:.2e}, feasibility/complementarity {feas:.2e})"
        )
    elif status == "stopped":
        status = "inaccurate"
        message = (
            f"gap (12) = {gap:.2e} <= tol but the KKT certificate reads stationarity "
            f"{stationarity:.2e}, feasibility {feas:.2e} (kkt_tol {opts.kkt_tol:g})"
        )
    elif status == "max_iterations":
        message = (
            f"max_rounds = {opts.max_rounds} reached; gap (12) {gap:.2e}, KKT stationarity "
            f"{stationarity:.2e}, feasibility {feas:.2e}"
        )
    else:
        message = reason
    if constrained and opts.schedule == "constant" and opts.c > 0 and feas > opts.kkt_tol:
        message += (
            f"; with a constant c = {opts.c:g} the multiplier's fixed point leaves a violation "
            "of about c * lambda (notes 3.6): lower c or use schedule='theorem2'"
        )
    extra: dict[str, Any] = {
        "lambda": lam,
        "train": score_metrics(z, problem.y, problem.group_a),
        "scores": z.copy(),
        "complementarity": compl,
        "gap": gap,
        "reason": reason,
    }
    if problem.test_blocks is not None:
        preds = runtime.broadcast("vfl_predict", {}, channel="diagnostic")
        z_test = sum(np.asarray(r.payload["partial_scores"]) for r in preds.values())
        extra["test"] = score_metrics(z_test, problem.y_test, problem.group_a_test)
        extra["test_scores"] = z_test
    solution: dict[str, np.ndarray] = {}
    x = np.zeros(0)
    if opts.reveal_parameters:
        rev = runtime.broadcast("vfl_reveal", {}, channel="diagnostic")
        solution = {f"theta_{n}": np.asarray(rev[n].payload["theta"]) for n in problem.party_names}
        x = np.concatenate(list(solution.values()))
    ledger = runtime.ledger
    comm = communication_totals(ledger)
    return Result(
        status=status,
        method=method,
        objective=f.data_loss(z) + reg,
        max_violation=violation,
        x=x,
        solution=solution,
        multipliers={"server": {"deo": lam}} if constrained else {},
        kkt=kkt,
        rounds={"outer": rounds, "inner": rounds, "communication": runtime.round},
        communication=comm,
        timing={"compile": t_setup, "solve": time.perf_counter() - t1},
        history=history,
        message=message,
        options=opts.to_dict(),
        ledger=list(ledger.rows),
        extra=extra,
    )


def run_vertical(problem: VerticalProblem, opts: FairVFLOptions, method: str) -> Result:
    """The registry's runner (``MethodSpec.runner``): ``problem`` is a vertical problem
    (built by :func:`fedmodel.models.fair_vfl`), not a compiled horizontal model."""
    if not isinstance(problem, VerticalProblem):
        from fedmodel.errors import UnsupportedError

        raise UnsupportedError(
            f"method='{method}' solves vertical models (parties owning column blocks): build "
            "the model with fedmodel.models.fair_vfl(X, y, group, blocks, eps)"
        )
    return solve_vertical(problem, method, opts)
