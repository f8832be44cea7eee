"""Pieces shared by the baselines: option checks, the local problem of a client, the
evaluation round, the status rule and result assembly.
"""

from __future__ import annotations

import numpy as np

from fedmodel.algorithms.local import LocalProblem
from fedmodel.compiler.partition import PartyProgram


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
