"""cprox-al: seed 000 Algorithm 3, the centralized proximal AL method.

The same outer loop as prox-al, but each subproblem

    l_k(w) = f(w) + h(w) + sum_i (||[mu_i + beta c_i(w)]_+||^2 - ||mu_i||^2) / (2 beta)
             + ||w - w^k||^2 / (2 beta)

is solved on the pooled problem to dist_inf(0, d l_k) <= tau_k = sbar/(k+1)^2. This method
reads every party's program: it is the centralized reference for models that
``centralized`` (cvxpy) refuses, such as seed 000's non-convex fairness model.
"""

from __future__ import annotations

import time

import numpy as np

from fedmodel.algorithms.common import (
    conic_note,
    history_row,
    make_result,
    multiplier_plateau,
    split_multipliers,
    starting_point,
)
from fedmodel.algorithms.proxal.options import ProxALOptions
from fedmodel.certificate.infeasibility import (
    farkas_point,
    farkas_report,
    farkas_verdict,
    ray_certificate,
    ray_points,
    ray_report,
    steady,
)
from fedmodel.certificate.kkt import assemble, party_evaluation
from fedmodel.certificate.scale import pooled_objective_scale
from fedmodel.compiler.partition import CompiledModel
from fedmodel.subproblems.merit import MeritProblem
from fedmodel.subproblems.newton import DENSE_NEWTON_MAX_SIZE
from fedmodel.subproblems.select import make_solver


def pooled_evaluation(compiled: CompiledModel, x, mus, nus, cones=None, objective_scale=None):
    """Evaluate every party at ``x`` (centralized: all programs are local here); ``cones``
    are the parties' cone multipliers (zeros when None). The multipliers are judged as
    given (``balance_pieces=False``: the pooled reference polishes its own,
    ``pooled.polish_auxiliary_duals``, and reports what it judged). ``objective_scale`` is
    the objective's reference scale (:mod:`fedmodel.certificate.scale`; default: at the
    default starting point, :func:`model_objective_scale`)."""
    if objective_scale is None:
        objective_scale = model_objective_scale(compiled)
    cones = cones if cones is not None else [None] * len(compiled.parties)
    reports = {
        p.name: party_evaluation(
            p, x, mu, nu, cone=lam, balance_pieces=False, objective_scale=objective_scale
        )
        for p, mu, nu, lam in zip(compiled.parties, mus, nus, cones)
    }
    return assemble(reports, compiled.regularizer, x, compiled.nonconvex, objective_scale)


def model_objective_scale(compiled: CompiledModel, x0=None) -> float:
    """The objective's reference scale ``S`` of the pooled model at ``x0`` (default: the
    default starting point, zeros moved into the terms' domains): every party's share on
    its program, and ``h``'s (:mod:`fedmodel.certificate.scale`)."""
    x0 = starting_point(compiled, None) if x0 is None else x0
    return pooled_objective_scale(compiled.parties, compiled.regularizer, x0)


def evaluation_seconds(compiled: CompiledModel) -> float:
    """Seconds one evaluation of every party at the origin takes now (what the certificate
    after the solve costs, a share of it per evaluation, on this machine as loaded as it
    is)."""
    t0 = time.perf_counter()
    x = np.zeros(compiled.layout.size)
    mus = [np.zeros(p.m_ineq) for p in compiled.parties]
    nus = [np.zeros(p.m_eq) for p in compiled.parties]
    try:
        pooled_evaluation(compiled, x, mus, nus, objective_scale=1.0)
    except Exception:  # noqa: BLE001 - a model not defined at the origin: no estimate
        return 0.0
    return time.perf_counter() - t0


def pooled_recession(
    compiled: CompiledModel, x, step, duals, steps, eps1, eps2, checks, dmu_steps=()
):
    """The infeasibility and unboundedness certificates of
    :mod:`~fedmodel.certificate.infeasibility` on the pooled problem at ``x``: ``duals`` and
    ``steps`` are the parties' ``(mu, nu, cone)`` and their changes over the last outer
    iteration (the two candidates of the Farkas certificate, at
    :func:`~fedmodel.certificate.infeasibility.farkas_point` of ``x`` with the multiplier
    steps ``dmu_steps``), ``step`` the last change of ``x`` (the candidate direction);
    ``checks`` says which to run (``"infeasible"``, ``"unbounded"``). Returns ``(status,
    message, extra)``, status "" when none holds."""
    parties, reg = compiled.parties, compiled.regularizer
    found = None
    if "infeasible" in checks:
        point = farkas_point(x, step, dmu_steps)
        candidates = [
            [farkas_report(p, point, mu, nu, lam) for p, (mu, nu, lam) in zip(parties, candidate)]
            for candidate in (steps, duals)
        ]
        found = farkas_verdict(candidates, reg, point, eps1)
        if found is not None:
            return "infeasible", found[0], {"certificate": found[1]}
    if "unbounded" in checks:
        d, ts = step / float(np.abs(step).max(initial=0.0)), ray_points(x, eps1)
        reports = [ray_report(p, x, d, ts) for p in parties]
        found = ray_certificate(
            [r["objective"] for r in reports],
            [r["violation"] for r in reports],
            reg,
            x,
            d,
            ts,
            eps2,
        )
        if found is not None:
            return "unbounded", found[0], {"certificate": found[1]}
    return "", "", {}


def _backend_choice(problem: MeritProblem, choice: str) -> str:
    """``choice``, except that ``"auto"`` takes L-BFGS instead of Newton above
    ``DENSE_NEWTON_MAX_SIZE`` variables (``centralized``'s limit for its Newton path too): a Newton
    step factors a dense Hessian, ~10 s at 4,011 variables (a hinge SVM's epigraph over
    4,000 rows) and over 100 s at d = 10,000, longer than a whole ``time_limit``."""
    if choice != "auto" or problem.n <= DENSE_NEWTON_MAX_SIZE or problem.has_cones:
        return choice
    if any(p.couples for p in problem.regularizer.pieces):
        return choice  # (L-BFGS-B takes no group norm; "auto" picks cvxpy for these)
    return "lbfgs"


def _recession_checks(compiled, dmu_history, steps, beta, options) -> tuple[str, ...]:
    """Which certificates to try after an outer iteration: ``"infeasible"`` when the
    multiplier steps have settled above ``beta eps2`` (:func:`steady`), ``"unbounded"``
    when the outer steps have settled above ``beta eps1`` (the differences of both converge
    on such models); none on a non-convex model."""
    if compiled.nonconvex:
        return ()
    out = ()
    if dmu_history[-1] > beta * options.eps2 and steady(dmu_history):
        out += ("infeasible",)
    if steps[-1] > beta * options.eps1 and steady(steps, spread=0.01):
        out += ("unbounded",)
    return out


def run_cprox_al(
    compiled: CompiledModel,
    options: ProxALOptions,
    method: str = "cprox-al",
    mu_init: list[np.ndarray] | None = None,
    nu_init: list[np.ndarray] | None = None,
    stop_on_plateau: bool = False,
    started: float | None = None,
):
    """Run Algorithm 3; ``mu_init``/``nu_init`` warm-start the multipliers (refinement).

    ``stop_on_plateau``: end with status ``"stalled"`` when the multiplier steps plateau
    (:func:`~fedmodel.algorithms.common.multiplier_plateau`: constraints the penalty does
    not reduce, e.g. an infeasible model) instead of running to ``max_outer``; used by
    ``centralized``, whose pooled solver then gives the verdict (an infeasibility
    certificate where one exists). cprox-al itself gives no such verdict: a plateau alone
    is no proof of infeasibility.

    ``started`` (a ``time.perf_counter()`` value): when the run's ``time_limit`` began
    (``model.solve``'s start, its compile included); default: this call's start."""
    t0 = time.perf_counter()
    # time_limit covers the whole run, the backend's set-up included (Newton's on the
    # epigraph of a 4000-row hinge SVM: ~8 s); every backend stops its solve at the deadline
    started = t0 if started is None else min(t0, started)  # (the caller's compile counts)
    deadline = started + options.time_limit if options.time_limit else None
    floor = None  # the smallest limit the run holds: up to its first outer iteration's end
    parties = compiled.parties
    x = starting_point(compiled, options.w0, options.random_state)
    # Algorithm 3 on the objective divided by its reference scale S, written in the model's
    # units: l_k times S has the penalty S beta, the proximal weight S / beta, and the
    # multiplier steps and the subproblems' tolerances S times those of f / S (beta, sbar
    # and eps are in the units of f / S; mu0 is a multiplier of the model's), so the same
    # model with its objective times t takes the same steps
    scale = model_objective_scale(compiled, x)  # (once, at the start)
    beta = options.beta * scale
    problem = MeritProblem(parties, beta, compiled.regularizer)
    solver = make_solver(problem, _backend_choice(problem, options.solver))
    # the subproblem solves end early enough for the certificate after them (one
    # evaluation of every party, timed now: on a loaded machine it takes seconds)
    tail = evaluation_seconds(compiled) if deadline is not None else 0.0
    solver.deadline = None if deadline is None else deadline - tail
    compile_seconds = time.perf_counter() - t0
    t_solve = time.perf_counter()
    mus = mu_init or [np.full(p.m_ineq, float(options.mu0)) for p in parties]
    nus = nu_init or [np.zeros(p.m_eq) for p in parties]
    mus = [np.maximum(np.asarray(m, dtype=float), 0.0) for m in mus]
    nus = [np.asarray(v, dtype=float) for v in nus]
    history, status, message = [], "max_iterations", ""
    dmu_history: list[float] = []
    steps: list[float] = []  # ||x^{k+1} - x^k||_inf (the unboundedness trigger)
    # the outer iteration from which each certificate is tried again, and the wait after
    # the next failed try (doubling: a slowly converging model costs few evaluations)
    next_try = {"infeasible": [0, 1], "unbounded": [0, 1]}
    certificate: dict = {}
    local_iters, k = 0, -1
    for k in range(options.max_outer):
        tau_scaled = options.sbar / (k + 1) ** 2  # (in the units of f / S)
        tau = scale * tau_scaled
        problem.set(sigma=scale / options.beta, center=x, mu=mus, nu=nus)
        report = solver.solve(x, tau, options.max_local_iter)
        local_iters += report.iterations
        w_new = report.x
        if not np.all(np.isfinite(w_new)) or np.abs(w_new).max() > options.divergence_limit:
            status, message = (
                "unbounded",
                "the iterates diverge; the model is likely unbounded below",
            )
            break
        dw = float(np.abs(w_new - x).max())
        step, x = w_new - x, w_new
        floor = time.perf_counter() - started if floor is None else floor
        if deadline is not None and (
            report.message == "time limit" or time.perf_counter() + tail > deadline
        ):
            # the subproblem was cut short: its point is kept, but no multiplier update
            # from it (a stopped solve leaves c(x) where it was, and beta c(x) added at
            # every later round made the multipliers grow without bound)
            status, message = "time_limit", f"time limit of {options.time_limit:g} s reached"
            break
        dmu = 0.0
        before = [
            (m.copy(), v.copy(), np.array(lam, dtype=float))
            for m, v, lam in zip(mus, nus, problem.cone)
        ]
        for j, p in enumerate(parties):
            ci, ce = p.functions.constraint_values(x)
            if ci.size:
                new = np.maximum(mus[j] + beta * ci, 0.0)
                dmu = max(dmu, float(np.abs(new - mus[j]).max()))
                mus[j] = new
            if ce.size:
                dmu = max(dmu, float(np.abs(beta * ce).max()))
                nus[j] = nus[j] + beta * ce
        if options.history:
            kkt, summary = pooled_evaluation(compiled, x, mus, nus, problem.cone, scale)
            history.append(
                history_row(
                    k,
                    summary,
                    kkt,
                    inner_iterations=report.iterations,
                    inner_bound=report.residual,
                    tau=tau,
                    dw_inf=dw,
                    dmu_inf=dmu,
                )
            )
        if options.callback is not None:
            options.callback(history[-1] if history else {"iteration": k})
        b = options.beta
        if dw + b * tau_scaled <= b * options.eps1 and dmu <= beta * options.eps2:
            # test (8) on f / S; the verdict is the scaled certificate: stop when it
            # holds, otherwise keep iterating (tau_k keeps shrinking) until it does
            status = "stopped"
            kkt, _ = pooled_evaluation(compiled, x, mus, nus, problem.cone, scale)
            if kkt.satisfied(options.eps1, options.eps2):
                break
        dmu_history.append(dmu)
        steps.append(dw)
        checks = _recession_checks(compiled, dmu_history, steps, beta, options)
        checks = tuple(c for c in checks if k >= next_try[c][0])
        if checks:
            duals = list(zip(mus, nus, problem.cone))
            changes = [
                (m - b[0], v - b[1], np.asarray(lam, dtype=float) - b[2])
                for (m, v, lam), b in zip(duals, before)
            ]
            verdict, why, certificate = pooled_recession(
                compiled, x, step, duals, changes, options.eps1, options.eps2, checks, dmu_history
            )
            if verdict:
                status, message = verdict, f"after {k + 1} outer iterations {why}"
                break
            for c in checks:
                next_try[c] = [k + next_try[c][1], 2 * next_try[c][1]]
        plateau = multiplier_plateau(dmu_history, beta, options.eps2) if stop_on_plateau else ""
        if plateau:
            status, message = "stalled", f"stopped after {k + 1} outer iterations: {plateau}"
            break
        if deadline is not None and time.perf_counter() + tail > deadline:
            status, message = "time_limit", f"time limit of {options.time_limit:g} s reached"
            break
        status = "max_iterations"
    t_eval = time.perf_counter()
    kkt, summary = pooled_evaluation(compiled, x, mus, nus, problem.cone, scale)
    if floor is not None:  # (and the certificate after the first outer iteration)
        floor += time.perf_counter() - t_eval
    if status == "stopped":
        status = "optimal" if kkt.satisfied(options.eps1, options.eps2) else "inaccurate"
        message = (
            f"(eps1, eps2) = ({options.eps1:g}, {options.eps2:g})-KKT point certified"
            if status == "optimal"
            else f"stopping test (8) held but the certificate reads {kkt.describe()}"
        )
        if status == "optimal" and kkt.local:
            message += " (a local certificate: the model has non-convex terms)"
    elif status == "max_iterations":
        message = (
            f"max_outer = {options.max_outer} outer iterations reached without a certified "
            f"point ({kkt.describe()})"
        )
    multipliers = {
        p.name: split_multipliers(p, m, v, lam)
        for p, m, v, lam in zip(parties, mus, nus, problem.cone)
    }
    extra = {"mu": mus, "nu": nus, **certificate}
    if options.time_limit and floor is not None:
        extra["time_limit_floor"] = floor
        if status == "time_limit" and options.time_limit < floor:
            message += (
                f"; the limit is below the smallest this run holds, {floor:.3g} s: the "
                "set-up, one outer iteration (a run always takes one) and the certificate, so it "
                "ended there"
            )
    if compiled.has_cones:
        extra.update(conic_note(compiled))
    return make_result(
        compiled,
        method=method,
        status=status,
        x=x,
        kkt=kkt,
        summary=summary,
        multipliers=multipliers,
        message=message,
        rounds={"outer": k + 1, "inner": local_iters, "communication": 0},
        communication={
            "messages_up": 0,
            "floats_up": 0,
            "messages_down": 0,
            "floats_down": 0,
            "per_party": {},
        },
        timing={
            "compile": compile_seconds,
            "solve": time.perf_counter() - t_solve,
            "per_party": {},
        },
        history=history,
        options={k_: v for k_, v in options.__dict__.items() if k_ not in ("w0", "callback")},
        extra=extra,
    )
