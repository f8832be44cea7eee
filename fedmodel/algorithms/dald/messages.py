"""The message table of ``dald-cc`` (server rounds), ``dald-dc`` (nodes activated by a
coordinator, iterates peer to peer) and ``dagd`` (jobs posted to the nodes, neighbour
iterates relayed by the coordinator).

Examples
--------
>>> DALD["cc_solve"].reply["x"].shape
('d',)
"""

from __future__ import annotations

from fedmodel.algorithms.messages import PENALTY_FIELDS, evaluate_spec, report_spec
from fedmodel.runtime.schema import Field, MessageSpec, MessageTable

_X = Field(("d",), reveals="its local copy x_i of the model")
_CC, _DC = ("dald-cc",), ("dald-dc",)
_RES = Field((2,), reveals="the largest residuals (D, C) it has seen")
_CONSENSUS = {
    "mu_plus": Field(("d",), required=False, reveals="its consensus multiplier after (15)"),
    "r_dual": Field((), required=False),
    "r_primal": Field((), required=False),
}
_CONSENSUS_REQUEST = {
    "x_hat": Field(("d",), required=False),
    "rho_scale": Field((), required=False),
}

DALD = MessageTable(
    "dald",
    (
        MessageSpec(
            "cc_solve",
            request={
                "x_hat": Field(("d",)),
                "repeat": Field((), required=False),
                "rho_scale": Field((), required=False),
                "dual": Field((), required=False),
                "x_hat_dual": Field(("d",), required=False),
                "dual_rho_scale": Field((), required=False),
                # the seconds its solve may take, on its own clock (the run's time_limit)
                "budget": Field((), required=False),
            },
            reply={"x": _X},
            reveals="its solution of (13), x_i",
            methods=_CC,
        ),
        MessageSpec(
            "snapshot",
            reply={"x": Field(("d",), nullable=True, reveals="x_i")},
            channel="diagnostic",
            reveals="its current x_i",
        ),
        MessageSpec(
            "dc_solve",
            direction="local",
            request={  # repeated local solves; report=False: no residuals up the hierarchy
                "repeat": Field((), dtype="int", required=False),
                "report": Field((), dtype="bool", required=False),
            },
            methods=_DC,
        ),
        MessageSpec("dc_relay", direction="local", methods=_DC),
        MessageSpec(
            "dc_score",
            direction="local",
            value=Field((), reveals="its disagreement with its neighbours"),
            methods=_DC,
        ),
        MessageSpec(
            "dc_decide",
            direction="local",
            request={"full": Field((), dtype="bool", required=False)},  # a full sweep ended
            reply={
                "d": Field((), dtype="int"),
                "D": Field(()),
                "C": Field(()),
                "reason": Field((), dtype="str"),
                "rho_scale": Field(()),
            },
            reveals="the root's decision and the residuals it gathered",
            methods=_DC,
        ),
        MessageSpec(
            "dc_x",
            direction="peer",
            request={"x": _X, "res": Field((2,), required=False)},
            reveals="its iterate x_s, to its neighbours",
            methods=_DC,
        ),
        MessageSpec("dc_report", direction="peer", request={"res": _RES}, reveals="", methods=_DC),
        MessageSpec(
            "dc_control",
            direction="peer",
            request={"d": Field(()), "t": Field(())},
            reveals="the root's decision",
            methods=_DC,
        ),
        MessageSpec(
            "dagd_step",
            request={
                "nbr": Field(
                    ("d",), dtype="map", reveals="its neighbours' iterates (relayed to it)"
                )
            },
            reply={"x": _X, "move": Field((), finite=False)},
            reveals="its iterate x_i after an update (55), relayed to its neighbours",
            methods=("dagd",),
        ),
        MessageSpec(
            "output",
            reply={"x": _X},
            channel="diagnostic",
            reveals="the root's iterate (the returned model)",
            methods=_DC,
        ),
        evaluate_spec(request=_CONSENSUS_REQUEST, reply={**PENALTY_FIELDS, **_CONSENSUS}),
        report_spec(
            request=_CONSENSUS_REQUEST,
            reply={
                "x": Field(("d",), nullable=True, reveals="x_i"),
                "mu_consensus": Field(("d",), required=False, reveals="its consensus multiplier"),
                "mu_edges": Field(
                    ("d",), dtype="map", required=False, reveals="its edges' multipliers"
                ),
                "alpha": Field((), nullable=True, required=False),
                "updates": Field((), dtype="int", required=False),
                **_CONSENSUS,
            },
        ),
    ),
)
