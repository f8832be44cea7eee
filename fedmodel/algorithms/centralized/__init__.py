"""The pooled references: ``centralized`` (the pooled problem solved exactly and certified)
and ``cprox-al`` (seed 000 Algorithm 3). Centralized by design: they read every program."""

from fedmodel.algorithms.centralized.options import CentralizedOptions
from fedmodel.algorithms.protocol import MethodSpec
from fedmodel.algorithms.proxal.options import CProxALOptions


def _run_cprox_al(compiled, options, method):
    from fedmodel.algorithms.centralized.cprox_al import run_cprox_al
    from fedmodel.algorithms.options import SOLVE_STARTED

    # (as a method of its own, its time limit counts from model.solve's start)
    return run_cprox_al(compiled, options, method=method, started=SOLVE_STARTED.get())


def _run_centralized(compiled, options, method):
    from fedmodel.algorithms.centralized.pooled import run_centralized

    return run_centralized(compiled, options)


METHODS = {
    "cprox-al": MethodSpec(
        CProxALOptions,
        _run_cprox_al,
        "seed 000 Algorithm 3 (centralized)",
        federated=False,
        owned_variables=True,
    ),
    "centralized": MethodSpec(
        CentralizedOptions,
        _run_centralized,
        "pooled problem solved exactly: cvxpy, or the smooth exact path (reference)",
        needs_gradients=False,
        federated=False,
        owned_variables=True,
    ),
}
