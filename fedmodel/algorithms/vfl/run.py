"""Run fair-vfl / fedbcd on the common driver (:func:`fedmodel.algorithms.driver.run_federated`).

:func:`solve_vertical` is the entry point of the family (``method="fair-vfl"`` or
``"fedbcd"``): it builds the server half (:class:`~fedmodel.algorithms.vfl.server.VFLServer`)
and one :class:`~fedmodel.runtime.endpoints.EndpointFactory` per party holding that party's
block only, and hands them to the driver, which runs them on any backend with
checkpoints/resume, the time limit, history rows and callbacks, failure policies, the
ledger and the :class:`~fedmodel.result.Result`. Within a round a party's updates read the
others' blocks as of the last exchange (eq. 11); with ``delays`` a party's reply counts
``d_k`` rounds late (deterministic on every runtime); on the processes and Ray runtimes the
parties sent a job in a round compute at the same time. With ``asynchronous=True`` the
asynchrony is real on processes/Ray: the server posts jobs and goes on with the replies
that have arrived, a slow party's block is used stale until its reply comes (see
:mod:`fedmodel.algorithms.vfl.server`).

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

import hashlib
import time
from typing import Any

import numpy as np

from fedmodel.algorithms.driver import run_federated
from fedmodel.algorithms.vfl.client import VFLParty
from fedmodel.algorithms.vfl.options import FairVFLOptions, lipschitz_bounds
from fedmodel.algorithms.vfl.problem import VerticalProblem
from fedmodel.algorithms.vfl.server import VFLServer
from fedmodel.errors import ModelError, UnsupportedError
from fedmodel.result import Result
from fedmodel.runtime.endpoints import EndpointFactory

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


def problem_fingerprint(problem: VerticalProblem) -> dict[str, Any]:
    """What a checkpoint of a vertical run must match: the parties, the sizes and a hash of
    the labels, groups and blocks (a set-up computation of the runner)."""
    h = hashlib.sha256()
    for a in (problem.y, problem.group_a.astype(float), *problem.blocks):
        h.update(np.ascontiguousarray(a).tobytes())
    return {
        "name": "vertical",
        "n": problem.n,
        "parties": list(problem.party_names),
        "sizes": problem.sizes,
        "l2": float(problem.l2),
        "sha256": h.hexdigest(),
    }


def solve_vertical(
    problem: VerticalProblem,
    method: str = "fair-vfl",
    options: FairVFLOptions | None = None,
    callback=None,
    faults=None,
    **kw: Any,
) -> Result:
    """Run ``fair-vfl`` or ``fedbcd`` on ``problem`` (on the driver); returns a :class:`Result`.

    ``res.history`` has one row per monitored round ``t`` (the driver's fields
    ``iteration``, ``objective``, ``max_violation``, ``stationarity``, ``feasibility`` of
    the local KKT certificate, and the round's ``round`` = ``t + 1`` rounds done,
    ``data_loss``, ``deo_gap``, ``deo_loss``, ``violation``, ``train_accuracy`` at
    ``theta^(t+1)``, the multipliers ``lambda^(t)`` used in the round, and the stationarity
    gap (12) at ``(theta^(t), lambda^(t))``); ``res.extra`` holds ``lambda``, the training
    and test metrics (:func:`~fedmodel.algorithms.vfl.metrics.score_metrics`) and the final
    scores.
    """
    if method not in DESCRIPTIONS:
        raise ModelError(f"unknown vertical method {method!r}; choose one of {tuple(DESCRIPTIONS)}")
    opts = build_options(options, **kw)
    if callback is not None:
        opts.callback = callback
    opts.validate(problem, method)
    constrained = method == "fair-vfl"
    t0 = time.perf_counter()
    consts = (1.0, 1.0)
    if opts.schedule == "theorem2":
        consts = (
            tuple(opts.lipschitz)
            if opts.lipschitz is not None
            else lipschitz_bounds(
                problem, constraint=opts.constraint, tpr_temperature=opts.tpr_temperature
            )
        )
    server = VFLServer(
        problem.y,
        problem.group_a,
        opts,
        problem.party_names,
        consts,
        constrained,
        fingerprint=problem_fingerprint(problem),
        y_test=problem.y_test,
        group_a_test=problem.group_a_test,
        method=method,
    )
    res = run_federated(
        None, opts, method, server, party_factories(problem, opts, consts), faults=faults
    )
    res.timing["setup"] = time.perf_counter() - t0 - res.timing.get("solve", 0.0)
    return res


def run_vertical(problem: VerticalProblem, opts: FairVFLOptions, method: str) -> Result:
    """The registry's runner (``MethodSpec.runner``): ``problem`` is a vertical problem
    (from a DSL model with published scores, or :func:`fedmodel.models.fair_vfl`), not a
    compiled horizontal model."""
    if not isinstance(problem, VerticalProblem):
        raise UnsupportedError(
            f"method='{method}' solves vertical models (parties owning column blocks): write "
            "the parties' partial scores with client.publish(...) or build the model with "
            "fedmodel.models.fair_vfl(X, y, group, blocks, eps)"
        )
    return solve_vertical(problem, method, opts)
