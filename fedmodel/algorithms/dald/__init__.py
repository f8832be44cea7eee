"""Seed 004 (Guo et al.): augmented-Lagrangian decomposition over a server (``dald-cc``) and
peer-to-peer topologies (``dald-dc``): options, server half, client and node halves, the
local solver layer and the topologies. See ``docs/dald.md``."""

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
}
