"""Seed 004 (Guo et al.): augmented-Lagrangian decomposition over a server (``dald-cc``) and
peer-to-peer topologies (``dald-dc``), and DGD with asynchronous coordination (``dagd``):
options, server half, client and node halves. The local solver layer and the topologies are
shared with the baselines (``fedmodel/algorithms/local.py``, ``topology.py``). See
``docs/dald.md``."""

from fedmodel.algorithms.dald.dagd import DAGDOptions, run_dagd
from fedmodel.algorithms.dald.options import DALDOptions
from fedmodel.algorithms.dald.server import run_dald_cc, run_dald_dc
from fedmodel.algorithms.protocol import MethodSpec

METHODS = {
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
