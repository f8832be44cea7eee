"""Seed 004 (Guo et al.): augmented-Lagrangian decomposition over a server (``dald-cc``) and
peer-to-peer topologies (``dald-dc``), and DGD with asynchronous coordination (``dagd``):
options, server half, client and node halves, the local solver layer and the topologies.
See ``docs/dald.md``."""

from typing import Any

from fedmodel.algorithms.dald.options import DALDOptions
from fedmodel.algorithms.dald.server import run_dald_cc, run_dald_dc
from fedmodel.algorithms.protocol import MethodSpec


def _methods() -> dict[str, MethodSpec]:
    # dagd builds on the dgd baseline, whose package imports this one (dald.local): it is
    # imported when METHODS is first read, after both packages are initialised
    from fedmodel.algorithms.dald.dagd import DAGDOptions, run_dagd

    return {
        "dald-cc": MethodSpec(
            DALDOptions,
            run_dald_cc,
            "seed 004 Algorithm 2 (Fed-DALD-CC, server + clients)",
            server_sets_in_h=True,
        ),
        "dald-dc": MethodSpec(
            DALDOptions,
            run_dald_dc,
            "seed 004 Algorithm 3 (Fed-DALD-DC, peer to peer)",
            server_sets_in_h=True,
        ),
        "dagd": MethodSpec(
            DAGDOptions,
            run_dagd,
            "seed 004 DAGD (eq. 55 with non-blocking, partial-cycle coordination; asynchronous)",
        ),
    }


def __getattr__(name: str) -> Any:
    if name == "METHODS":
        methods = _methods()
        globals()["METHODS"] = methods
        return methods
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
