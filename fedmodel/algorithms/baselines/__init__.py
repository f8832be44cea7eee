"""Baselines users compare against on the same models: ``fedavg``, ``fedprox`` (server-based)
and ``dgd`` (peer-to-peer)."""

from fedmodel.algorithms.baselines.dgd import DGDOptions, run_dgd
from fedmodel.algorithms.baselines.fedavg import FedAvgOptions, FedProxOptions, run_fedavg
from fedmodel.algorithms.protocol import MethodSpec

METHODS = {
    "fedavg": MethodSpec(FedAvgOptions, run_fedavg, "FedAvg baseline (penalty= for constraints)"),
    "fedprox": MethodSpec(
        FedProxOptions, run_fedavg, "FedProx baseline (penalty= for constraints)"
    ),
    "dgd": MethodSpec(
        DGDOptions, run_dgd, "DGD baseline, seed 004 eq. 55 (penalty= for constraints)"
    ),
}
