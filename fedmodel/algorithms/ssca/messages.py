"""The message table of ``ssca`` and its SGD baselines on a ``LearningModel``.

Sample-based methods send the model ``w`` (``d`` = the loss's parameters) and receive
mini-batch gradients or local models. Feature-based methods exchange per-row hidden
pre-activations whose shapes depend on the loss (``*``: any length; the rows of a
batch are at most ``rows``); their size is bounded by ``cap`` (rows times parameters).
``k`` is the number of the model's constraints: the values and gradients of the
constraints other than the objective's own loss (another loss, a client's own function)
travel as ``k``-row arrays.

Examples
--------
>>> SSCA["ssca_w"].reply["grad"].shape
('d',)
"""

from __future__ import annotations

from fedmodel.runtime.schema import Field, MessageSpec, MessageTable

_SAMPLE = ("ssca", "fedsgd", "fedavg-sgd", "sgd-m")
_FEATURE = ("ssca", "vertical-sgd", "vertical-sgd-m")
_W = {"w": Field(("d",))}
_ANY = Field(None, max_size="cap", reveals="per-row hidden pre-activations of its block")
_ANY_OPTIONAL = Field(
    None,
    max_size="cap",
    required=False,
    reveals="per-row hidden pre-activations of its block for the constraints' losses",
)
_COUNT = Field((), dtype="int", reveals="the number of rows")


def _eval_reply(**more: Field) -> dict:
    return {"loss": Field((), reveals="its summed loss"), "n": _COUNT, **more}


SSCA = MessageTable(
    "ssca",
    (
        MessageSpec(
            "ssca_w",
            request=_W,
            reply={
                "grad": Field(("d",), reveals="its mini-batch gradient"),
                "value": Field((), required=False, reveals="its mini-batch loss"),
                "cvalue": Field(
                    ("<=k",),
                    required=False,
                    reveals="its constraint functions' values (mini-batch sums of another "
                    "loss; its own function on all its rows)",
                ),
                "cgrad": Field(
                    ("<=k", "d"), required=False, reveals="its constraint functions' gradients"
                ),
            },
            reveals="a mini-batch gradient of its loss",
            methods=_SAMPLE,
        ),
        MessageSpec(
            "sgd_w",
            request=_W,
            reply={"w": Field(("d",), reveals="its locally trained model")},
            reveals="its locally trained model",
            methods=_SAMPLE,
        ),
        MessageSpec(
            "evaluate",
            request=_W,
            reply=_eval_reply(
                correct=Field((), dtype="int", required=False),
                cvalue=Field(("<=k",), required=False, reveals="its constraint functions"),
            ),
            channel="diagnostic",
            reveals="its loss and accuracy at w",
            methods=_SAMPLE,
        ),
        MessageSpec(
            "full_grad",
            request=_W,
            reply={"grad": Field(("d",), reveals="its full gradient")},
            channel="diagnostic",
            reveals="its full-batch gradient",
            methods=_SAMPLE,
        ),
        MessageSpec(
            "fb_batch",
            request={"idx": Field(("<=rows",), dtype="int"), "w0": Field(None), "wi": Field(None)},
            methods=_FEATURE,
        ),
        MessageSpec("fb_share", direction="local", methods=_FEATURE),
        MessageSpec(
            "fb_h",
            direction="peer",
            request={"h": _ANY, "hc": _ANY_OPTIONAL},
            reveals="its hidden pre-activations of the batch",
            methods=_FEATURE,
        ),
        MessageSpec(
            "fb_grad",
            reply={
                "gi": Field(None, max_size="cap", reveals="its block's gradient"),
                "g0": Field(None, max_size="cap", required=False, reveals="the top gradient"),
                "value": Field((), required=False),
                "lgi": Field(
                    ("<=k", "*"),
                    max_size="cap",
                    required=False,
                    reveals="its block's gradients of the constraints' losses",
                ),
                "lg0": Field(("<=k", "*"), max_size="cap", required=False),
                "lvalue": Field(("<=k",), required=False, reveals="the constraints' losses"),
                "fvalue": Field(("<=k",), required=False, reveals="its own constraint functions"),
                "fgrad": Field(("<=k", "*"), max_size="cap", required=False),
            },
            reveals="its block gradient of the batch",
            methods=_FEATURE,
        ),
        MessageSpec(
            "fb_onestep",
            request={"idx": Field(("<=rows",), dtype="int"), "wi": Field(None)},
            reply={
                "h": _ANY,
                "jac": Field(None, max_size="cap", reveals="dh_i/dw_i of the batch"),
                "y": Field(None, max_size="cap", required=False, reveals="the batch's labels"),
            },
            reveals="its pre-activations and their Jacobian (the raw features for an MLP)",
            methods=_FEATURE,
        ),
        MessageSpec(
            "fb_eval_h",
            request={"wi": Field(None), "test": Field((), dtype="bool", required=False)},
            reply={
                "h": _ANY,
                "hc": _ANY_OPTIONAL,
                "fvalue": Field(("<=k",), required=False, reveals="its own constraint functions"),
            },
            channel="diagnostic",
            reveals="its pre-activations of every row",
            methods=_FEATURE,
        ),
        MessageSpec(
            "fb_eval_top",
            request={
                "w0": Field(None),
                "H": Field(None),
                "test": Field((), dtype="bool"),
                "Hc": Field(None, required=False),
            },
            reply=_eval_reply(
                correct=Field((), dtype="int", required=False),
                closs=Field(("<=k",), required=False, reveals="the constraints' summed losses"),
            ),
            channel="diagnostic",
            reveals="the loss and accuracy (designated client)",
            methods=_FEATURE,
        ),
        MessageSpec(
            "report",
            channel="diagnostic",
            reveals="statistics",
            extra=Field((), reveals="statistics"),
        ),
    ),
)
