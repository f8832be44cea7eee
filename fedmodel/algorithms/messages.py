"""Message tables shared by the families: the certificate's ``evaluate`` and ``report``, the
dimensions of a client, and the declaration of a server half's table to the runtime (the
privacy table of every method, which needs the registry, is
:mod:`~fedmodel.algorithms.privacy`).

Each family declares its own kinds in ``<family>/messages.py`` (a
:class:`~fedmodel.runtime.schema.MessageTable`, set as ``messages`` on its client and
server halves); the driver declares the server half's table to the runtime
(:func:`declare_messages`), so every request is checked before it leaves, travels on its
declared channel, and every reply is validated in one place before the server half reads
it.

Dimensions (per client): ``d`` the shared variables (what travels), ``d_own`` the
client's own block, ``m_ineq``, ``m_eq``, ``m_cone`` its constraint rows; a family adds
its own (``aa``: Anderson memory, ``n``: rows of a vertical problem, ...) through
``ServerHalf.message_dims``.

Examples
--------
>>> EVALUATE.reply["grad"].shape
('d',)
"""

from __future__ import annotations

import operator
from collections.abc import Mapping
from typing import Any

from fedmodel.runtime.schema import Field, MessageSpec, MessageTable
from fedmodel.runtime.secure_aggregation import SECAGG

#: the point of an evaluation (sent by the server)
W = Field(("d",), reveals="")
#: the objective's reference scale S (certificate/scale.py), sent with ``evaluate``
OBJECTIVE_SCALE = Field((), required=False, positive=True)
#: a party's share of S at the starting point (certificate/scale.objective_reference)
OBJECTIVE_REFERENCE = Field(
    (),
    required=False,
    sum_only=True,  # (the server adds them up: masked under secure aggregation)
    reveals="the size of its objective's gradient and curvature at w^0 (one scalar)",
)

#: a party's share of the KKT residuals at ``w`` (certificate/kkt.party_evaluation)
EVALUATION_FIELDS: dict[str, Field] = {
    "objective": Field((), reveals="f_i(w)", sum_only=True),
    "grad": Field(("d",), reveals="the gradient of its Lagrangian at w", sum_only=True),
    "scale": Field(
        ("d",),
        reveals="per coordinate, the largest magnitude of its gradient and constraint-Jacobian "
        "terms at w (the certificate's scale)",
    ),
    "owned_stationarity": Field((), reveals="stationarity of its own block"),
    "owned_scaled": Field((), reveals="scaled stationarity of its own block"),
    "owned_index": Field(("<=d_party",), dtype="int", reveals="which coordinates are its own"),
    "feasibility": Field((), unmasked=True),
    "feasibility_scaled": Field(()),
    "violation": Field((), unmasked=True),
    "c_ineq": Field(("m_ineq",), reveals="its inequality constraint values at w"),
    "c_eq": Field(("m_eq",), reveals="its equality constraint values at w"),
    "complementarity_gap": Field(
        (),
        required=False,
        reveals="the gap its multipliers leave on its constraints and epigraph pieces at w "
        "(sum_j mu_j [-c_j(w)]_+ + sum_k |nu_k a_k(w)|)",
        sum_only=True,
    ),
    "mu": Field(
        ("m_ineq",),
        required=False,
        reveals="its multipliers, when the certificate rescaled its epigraph pieces' ones",
    ),
    # only when some shared coordinate sits at a term's domain boundary (certificate/kkt.py)
    "boundary_grad": Field(
        ("d",), required=False, reveals="the gradient of its Lagrangian at w + tau e_B"
    ),
    "boundary_scale": Field(("d",), required=False, reveals="its certificate scale at w + tau e_B"),
    "boundary_mask": Field(
        ("d",), required=False, reveals="which coordinates of B end its objective's domain"
    ),
}
#: the multipliers a quadratic-penalty method implies (common.evaluation_payload)
PENALTY_FIELDS: dict[str, Field] = {
    "mu_c": Field(("m_ineq",)),
    "nu_c": Field(("m_eq",)),
}

EVALUATE = MessageSpec(
    "evaluate",
    request={
        "w": W,
        "mu": Field(("m_ineq",), required=False),
        "nu": Field(("m_eq",), required=False),
        "objective_scale": OBJECTIVE_SCALE,
    },
    reply=EVALUATION_FIELDS,
    channel="diagnostic",
    reveals="f_i, its Lagrangian gradient and constraint values at w (the certificate)",
)

#: a client's statistics in ``report`` (counts, seconds): any short list of scalars
STATISTIC = Field((), reveals="statistics")

REPORT_FIELDS: dict[str, Field] = {
    "mu": Field(("m_ineq",), reveals="its multipliers"),
    "nu": Field(("m_eq",), reveals="its multipliers"),
    "cone": Field(("m_cone",), required=False, reveals="its cone multipliers"),
}

REPORT = MessageSpec(
    "report",
    reply=REPORT_FIELDS,
    channel="diagnostic",
    reveals="its multipliers and statistics (end of the run)",
    extra=STATISTIC,
)


def evaluate_spec(
    request: Mapping[str, Field] | None = None, reply: Mapping[str, Field] | None = None
) -> MessageSpec:
    """:data:`EVALUATE` with a family's fields added (request and reply)."""
    return MessageSpec(
        "evaluate",
        request={**EVALUATE.request, **(request or {})},
        reply={**EVALUATE.reply, **(reply or {})},
        channel="diagnostic",
        reveals=EVALUATE.reveals,
    )


def report_spec(
    request: Mapping[str, Field] | None = None, reply: Mapping[str, Field] | None = None
) -> MessageSpec:
    """:data:`REPORT` with a family's fields added."""
    return MessageSpec(
        "report",
        request=dict(request or {}),
        reply={**REPORT.reply, **(reply or {})},
        channel="diagnostic",
        reveals=REPORT.reveals,
        extra=STATISTIC,
    )


def program_dims(program) -> dict[str, int]:
    """The dimensions of a client's messages from its compiled
    :class:`~fedmodel.compiler.partition.PartyProgram`."""
    layout = program.layout
    own = sum(int(v.size) for v in layout.owned_by(program.name)) if layout.has_owned else 0
    d, m_ineq, m_eq = int(layout.n_shared), int(program.m_ineq), int(program.m_eq)
    return {
        "d": d,
        "d_own": own,
        "d_party": d + own,
        "m_ineq": m_ineq,
        "m_eq": m_eq,
        "m_cone": int(program.m_cone),
        "m_con": m_ineq + m_eq,
    }


def declare_messages(runtime, server, compiled=None) -> None:
    """Declare ``server``'s message table to ``runtime`` (``Runtime.declare``: outgoing
    requests checked and put on their declared channels, every reply validated), each
    client's dimensions from its program in ``compiled`` (when given) and the server half's
    ``message_dims(name)`` (:class:`PartyDims`), with the kinds of secure aggregation;
    nothing when the server half declares no table."""
    table: MessageTable | None = getattr(server, "messages", None)
    if table is not None:
        table = table.merged(SECAGG)
    programs = {p.name: p for p in compiled.parties} if compiled is not None else {}
    runtime.declare(table, PartyDims(programs, server))


#: what :func:`program_dims` reads of a program without own variables
_DIM_FACTS = operator.attrgetter("layout.n_shared", "layout.has_owned", "m_ineq", "m_eq", "m_cone")


class PartyDims:
    """The dimensions of a client's messages (:func:`declare_messages`): called with its
    name, its program's :func:`program_dims` (``programs``: name -> program; none for a
    name without one) and the server half's ``message_dims(name)``; :meth:`many` for many
    clients at once.

    Examples
    --------
    >>> from types import SimpleNamespace as NS
    >>> layout = NS(n_shared=3, has_owned=False)
    >>> programs = {n: NS(name=n, layout=layout, m_ineq=1, m_eq=0, m_cone=0) for n in "ab"}
    >>> dims = PartyDims(programs, NS(message_dims=lambda name: {"k": 2}))
    >>> dims("a")["d"], dims("a")["k"], dims.many(["a", "b"]) == [dims("a"), dims("b")]
    (3, 2, True)
    """

    __slots__ = ("programs", "server")

    def __init__(self, programs: Mapping[str, Any], server: Any):
        self.programs, self.server = programs, server

    def __call__(self, name: str) -> dict[str, int]:
        programs = self.programs
        out: dict[str, Any] = program_dims(programs[name]) if name in programs else {}
        out.update(self.server.message_dims(name))
        return out

    def many(self, names: list[str]) -> list[Mapping[str, int]]:
        """The dimensions of each of ``names``, in order, to be read and not changed: the
        clients whose programs agree in all :func:`program_dims` reads (no own variables)
        share one mapping when the server half's dimensions are one for all clients
        (its ``message_dims_alike``); else each is found on its own."""
        alike = getattr(self.server, "message_dims_alike", None)
        programs = list(map(self.programs.get, names))
        if not names or alike is None or not alike() or None in programs:
            return list(map(self, names))
        facts = list(map(_DIM_FACTS, programs))
        found = dict(zip(facts, programs))  # (a program of each)
        if any(fact[1] for fact in found):  # (own variables: each program's own)
            return list(map(self, names))
        extra = self.server.message_dims(names[0])
        for fact, program in found.items():
            found[fact] = {**program_dims(program), **extra}
        return list(map(found.__getitem__, facts))
