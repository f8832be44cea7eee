"""The message table of the baselines ``fedavg`` / ``fedprox`` (server rounds) and ``dgd``
(peer to peer, activated by a coordinator).

Examples
--------
>>> BASELINES["fed_round"].reply["dx"].shape
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
            reply={"n": Field((), reveals="its number of samples", sum_only=True)},
            reveals="its sample count (the server uses the total)",
            methods=_FED,
        ),
        MessageSpec(
            "fed_round",
            # scale: the server's factor of the client's aggregation weight (1 / total
            # samples, 1 / clients, or the given weight over their sum); budget: the
            # seconds its local training may take, on its own clock (time_limit)
            request={
                "x_hat": Field(("d",)),
                "scale": Field(()),
                "budget": Field((), required=False),
            },
            reply={
                "dx": Field(
                    ("d",),
                    sum_only=True,
                    reveals="its aggregation weight times its local model's change",
                ),
                # (under dp the weights are the server's own: not sent)
                "weight": Field(
                    (), sum_only=True, required=False, reveals="its aggregation weight"
                ),
            },
            reveals="its locally trained model's change, weighted",
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
                "weight": Field((), nullable=True, required=False, reveals="its weight"),
            }
        ),
    ),
)
