"""Pieces shared by the baselines: option checks, the local problem of a client, the
evaluation round, the status rule and result assembly.
"""

from __future__ import annotations

import numpy as np

from fedmodel.algorithms.common import status_message
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


def _status(opts, stopped: bool, kkt, r: int, dx: float, what: str) -> tuple[str, str]:
    """The baselines' status (certified at ``opts.eps``) and message after ``r`` rounds,
    ``dx`` the last change of ``what``."""
    certified = kkt.satisfied(opts.eps, opts.eps)
    status = ("optimal" if certified else "inaccurate") if stopped else "max_iterations"
    return status, status_message(
        status,
        kkt,
        f"eps = {opts.eps:g}",
        rule=f"{what} below tol = {opts.tol:g} after {r} rounds",
        budget=f"max_rounds = {r} ({what} {dx:.2e})",
        hint="the method stalled away from the optimum (client drift on heterogeneous data, "
        "a constant step, or only a penalised treatment of the constraints)"
        if stopped
        else "",
    )
