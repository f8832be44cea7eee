"""The message table of the baselines ``fedavg`` / ``fedprox`` (server rounds) and ``dgd``
(peer to peer, activated by a coordinator).

Examples
--------
>>> BASELINES["fed_round"].reply["x"].shape
('d',)
"""

from __future__ import annotations

from fedmodel.algorithms.messages import PENALTY_FIELDS, evaluate_spec, report_spec
from fedmodel.runtime.schema import Field, MessageSpec, MessageTable

_X = Field(("d",), reveals="its local model")
_FED = ("fedavg", "fedprox")

BASELINES = MessageTable(
    "baselines",
    (
        MessageSpec(
            "samples",
            reply={"n": Field((), reveals="its number of samples")},
            reveals="its sample count (aggregation weights)",
            methods=_FED,
        ),
        MessageSpec(
            "fed_round",
            # budget: the seconds its local training may take, on its own clock (time_limit)
            request={"x_hat": Field(("d",)), "budget": Field((), required=False)},
            reply={"x": _X},
            reveals="its locally trained model",
            methods=_FED,
        ),
        MessageSpec(
            "snapshot",
            reply={"x": Field(("d",), nullable=True, reveals="its local model")},
            channel="diagnostic",
            reveals="its current local model",
        ),
        MessageSpec("dgd_send", direction="local", methods=("dgd",)),
        MessageSpec("dgd_step", direction="local", methods=("dgd",)),
        MessageSpec(
            "dgd_x",
            direction="peer",
            request={"x": _X},
            reveals="its iterate, to its neighbours",
            methods=("dgd",),
        ),
        MessageSpec(
            "state",
            reply={"x": _X, "move": Field((), finite=False)},
            channel="diagnostic",
            reveals="its iterate",
            methods=("dgd",),
        ),
        evaluate_spec(reply=PENALTY_FIELDS),
        report_spec(
            reply={
                "x": Field(("d",), nullable=True, reveals="its local model"),
                "alpha": Field((), nullable=True, required=False),
            }
        ),
    ),
)
