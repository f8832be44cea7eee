"""The message table of ``fair-vfl`` and ``fedbcd``: parties exchange n-vectors of partial
scores and the server's ``lambda``; ``theta_k`` stays with its party unless the run
reveals the parameters.

Dimensions: ``n`` (training rows), ``n_test`` (held-out rows), ``m_k`` (the party's
columns).

Examples
--------
>>> VFL["vfl_round"].reply["partial_scores"].shape
('n',)
"""

from __future__ import annotations

from fedmodel.algorithms.messages import EVALUATE
from fedmodel.runtime.schema import Field, MessageSpec, MessageTable

_PARTIAL = Field(("n",), reveals="X_k theta_k: its partial scores of every row")
_SCORES = {"scores": Field(("n",)), "lambda": Field((2,), required=False)}

VFL = MessageTable(
    "vfl",
    (
        MessageSpec(
            "vfl_start", reply={"partial_scores": _PARTIAL}, reveals="its initial partial scores"
        ),
        MessageSpec(
            "vfl_round",
            request=_SCORES,
            reply={"partial_scores": _PARTIAL},
            reveals="its partial scores after Q local updates",
        ),
        MessageSpec(
            "vfl_monitor",
            reply={"step_sq": Field(()), "regularizer": Field(()), "updates": Field(())},
            channel="diagnostic",
            reveals="its step length and ||theta_k||^2 (monitoring)",
        ),
        MessageSpec(
            "vfl_kkt",
            request=_SCORES,
            reply={"grad_inf": Field(()), "grad_sq": Field(()), "regularizer": Field(())},
            channel="diagnostic",
            reveals="norms of its block gradient (certificate)",
        ),
        EVALUATE,  # (a vertical party refuses it: it answers vfl_kkt)
        MessageSpec(
            "report",
            reply={
                "seconds": Field(()),
                "updates_total": Field(()),
                "test_scores": Field(("n_test",), required=False, reveals="its test scores"),
                "theta": Field(
                    ("m_k",),
                    required=False,
                    opt_in="reveal_parameters=True",
                    reveals="its parameters theta_k",
                ),
            },
            channel="diagnostic",
            reveals="statistics and held-out partial scores (end of the run)",
        ),
    ),
)
