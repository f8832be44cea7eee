"""The message tables of ``prox-al`` and ``admm``: Algorithm 1's kinds composed with the
declarations of one inner solver (:mod:`~fedmodel.algorithms.proxal.routes`).

A run declares :func:`route_table` of its route: ``start`` (the first inner start),
``outer`` (Algorithm 1's multiplier round, whose reply also starts the next inner solve),
``outer_aa`` (the outer Anderson step), the route's own round kinds, and the certificate's
``evaluate`` (with the fields the route adds to its request) and ``report``. The requests that start an inner solve carry ``w`` and the
route's ``start_request`` fields (the ``start`` after a fallback also the route's name,
``inner``); their replies carry its ``start_reply`` fields. A route that ``probes`` may be refused at ``start``: that reply is
``accepted = False`` with the reason ``why``, or ``accepted = True`` with the start fields.

Dimensions: ``d`` (shared variables), ``d_own`` (the client's own block, never sent but in
the final report), ``m_ineq``, ``m_eq``, ``m_cone``, ``aa`` / ``oaa`` (the inner and
outer Anderson memories plus one, from the options) and ``cd`` (``curvature_directions``).

:data:`~fedmodel.algorithms.proxal.routes.PROXAL` (:func:`family_table` of the route
table) is the family's table for readers that see no route (the client half's
request check before its route is known, the docs): every route's kinds, the start replies
of all routes as alternatives.

Examples
--------
>>> from fedmodel.algorithms.proxal.admm_inner import ADMMInner
>>> route_table(ADMMInner)["outer"].reply["u_tilde"].required
True
>>> family_table([ADMMInner])["admm_w"].reply["u_tilde"].shape
('d',)
"""

from __future__ import annotations

import dataclasses

from fedmodel.algorithms.messages import OBJECTIVE_REFERENCE, W, evaluate_spec, report_spec
from fedmodel.runtime.schema import Field, MessageSpec, MessageTable

#: the party's own opt-in to send its d x d Hessian (fedmodel join --reveal hessian)
HESSIAN = "hessian"

#: the routes whose rounds carry the party's Hessian (their client part answers
#: ``newton_w``): building or starting one is the party's opt-in
HESSIAN_ROUTES = ("newton", "prox-newton")
_HESSIAN_ROUTE = dict.fromkeys(HESSIAN_ROUTES, HESSIAN)
# the route's name, after a fallback (the Newton routes send the Hessian: an opt-in)
_INNER = Field((), dtype="str", required=False, party_opt_in=_HESSIAN_ROUTE)
#: the parameters' units (ProxALServer.take_objective_units): their unit u and the
#: factors of beta, 1/prox_beta and rho_i (u or 1)
_OBJECTIVE_UNITS = Field((4,), positive=True)
#: ProxALClient's arguments besides its program and options, checked where it is built
BUILD = {
    "rho": Field((), positive=True),
    "n_clients": Field((), dtype="int", positive=True),
    "proximal": Field((), dtype="bool"),
    "theta0": Field(("d_own",), nullable=True),
    "metric": Field(
        (), dtype="str", choices=("scalar", "hessian"), party_opt_in={"hessian": HESSIAN}
    ),
    # (any route of the table, a route added to it included; the Newton routes' Hessian
    # is the party's opt-in)
    "route": Field((), dtype="str", party_opt_in=_HESSIAN_ROUTE),
}
# (test (8) reads the largest over the clients of these scalars: each client sends its own
# in the clear under secure aggregation, unmasked)
_DMU = Field((), reveals="||mu_i^{k+1} - mu_i^k||_inf", unmasked=True)
_DTHETA = Field(
    (), required=False, reveals="the change of its block (party-owned variables)", unmasked=True
)
_OUTER_GRAM = Field(
    ("<=oaa",),
    required=False,
    reveals="inner products of its multiplier changes (outer_anderson)",
    sum_only=True,
)
#: test (8)'s feasibility half, measured by the client (routes with measures_feasibility)
_FEASIBILITY = {
    "violation": Field((), reveals="its largest constraint violation at w^{k+1}", unmasked=True),
    "complementarity": Field((), reveals="max_j mu_ij^{k+1} max(-c_ij(w^{k+1}), 0)", unmasked=True),
}


def option_dims(options) -> dict[str, int]:
    """``aa`` / ``oaa``: the inner and outer Anderson memories plus one (the most weights
    and Gram entries a message carries); ``cd``: the most curvature directions."""
    return {
        "aa": int(getattr(options, "anderson", 0)) + 1,
        "oaa": int(getattr(options, "outer_anderson", 0)) + 1,
        "cd": _curvature_bound(options),
        "cs": _curvature_bound(options, local=False),
    }


def _curvature_bound(options, local: bool = True) -> int:
    """The most curvature directions a message carries (``curvature_directions``, or its
    default's largest value, 2; with ``local``, a round's, the local direction on top)."""
    k = getattr(options, "curvature_directions", None)
    k = 2 if k is None else int(k)
    on = getattr(options, "local_directions", None)
    return k + 1 if local and (on is None or on) else k


def _optional(fields: dict[str, Field]) -> dict[str, Field]:
    return {k: dataclasses.replace(f, required=False) for k, f in fields.items()}


def _start_specs(request: dict, reply: dict, probes: bool, one_of=(), outer=None) -> tuple:
    """``start``, ``units``, ``outer`` and ``outer_aa`` around a route's start fields."""
    start_reply, start_one_of = reply, one_of
    if probes:  # (accepted, or refused with a reason)
        start_reply = {
            # (whether it takes the route, in the clear; under secure aggregation a client
            # that refuses stops the run with its reason)
            "accepted": Field((), dtype="bool", unmasked=True),
            "why": Field((), dtype="str", required=False, unmasked=True),
            **_optional(reply),
        }
        needed = tuple(k for k, f in reply.items() if f.required)
        start_one_of = (*(one_of or (needed,)), ("why",))
    return (
        MessageSpec(
            "start",
            request={"w": W, "inner": _INNER, **request},
            reply={**start_reply, "objective_reference": OBJECTIVE_REFERENCE},
            one_of=start_one_of,
            reveals="the start of its inner solver at w^0",
        ),
        MessageSpec(
            "units",
            request={"w": W, "objective_units": _OBJECTIVE_UNITS, **request},
            reply=start_reply,
            one_of=start_one_of,
            reveals="the start of its inner solver at w^0 in the objective's units",
            methods=("prox-al",),
        ),
        MessageSpec(
            "outer",
            request={"w": W, **request},
            reply={
                "dmu_inf": _DMU,
                "dtheta_scaled": _DTHETA,
                "gram": _OUTER_GRAM,
                **(outer or {}),
                **reply,
            },
            one_of=one_of,
            reveals="the change of its multipliers and the next inner start",
            methods=("prox-al",),
        ),
        MessageSpec(
            "outer_aa",
            request={
                "w": W,
                "alpha": Field(("<=oaa",)),
                "reset": Field((), dtype="bool"),
                **request,
            },
            reply=reply,
            one_of=one_of,
            reveals="the inner start at the combined point (outer Anderson step)",
            methods=("prox-al",),
        ),
    )


def _sum(reveals: str, shape=()) -> Field:
    return Field(shape, reveals=reveals, sum_only=True)


#: the certificates of infeasibility and unboundedness (certificate/infeasibility.py): a
#: party's share of the Farkas certificate, for its multipliers and for their last change
_FARKAS_REPLY = {
    f"{name}{suffix}": field
    for suffix, which in (("", "its multipliers"), ("_step", "their last change"))
    for name, field in (
        ("y", _sum(f"the gradient of its constraints weighted by {which}, at its point", ("d",))),
        ("b", _sum(f"the intercept of that weighted sum's tangent plane ({which})")),
        ("rho", _sum(f"the 1-norm of that gradient on its own block ({which})")),
        ("size", _sum(f"the magnitude of the terms of that intercept ({which})")),
    )
}
RECESSION_SPECS = (
    MessageSpec(
        "farkas",
        request={"w": W},
        reply=_FARKAS_REPLY,
        reveals="its share of a Farkas certificate of infeasibility (sums over parties)",
        methods=("prox-al",),
        channel="diagnostic",
    ),
    MessageSpec(
        "ray",
        request={"w": W, "d": Field(("d",)), "scale": Field((), positive=True), "t": Field((3,))},
        reply={
            "objective": _sum("its objective at three points of a ray", (3,)),
            "violation": Field(
                (), reveals="its largest violation over three points of a ray", unmasked=True
            ),
        },
        reveals="its objective and violation along a ray (the unboundedness certificate)",
        methods=("prox-al",),
        channel="diagnostic",
    ),
)


def _common(evaluate_request: dict[str, Field]) -> tuple:
    return (
        *RECESSION_SPECS,
        evaluate_spec(request=evaluate_request),
        report_spec(reply={"owned": Field(("d_own",), required=False, reveals="its own block")}),
    )


def route_table(route, compiled=None, options=None, proximal: bool = True) -> MessageTable:
    """The message table of a run whose inner solver is ``route``: Algorithm 1's kinds with
    the route's start fields (required as the route declares them), the route's own kinds,
    ``evaluate`` (with the route's ``evaluate_fields``) and ``report``. With the run's model and options, the optional fields the
    run never sends are left out (the route's ``unused`` and Algorithm 1's own: the outer
    Anderson Gram row, the change of an own block) and the route's ``dims`` are added to
    the table's dimensions."""
    outer = _FEASIBILITY if route.measures_feasibility else None
    request, reply = dict(route.start_request), dict(route.start_reply)
    specs = (*_start_specs(request, reply, route.probes, (), outer), *route.messages)
    dims = option_dims
    adaptive = options is None or getattr(options, "adaptive", True)
    if not (route.objective_units and proximal and adaptive):  # (its units never change)
        specs = tuple(spec for spec in specs if spec.kind != "units")
    if compiled is not None:
        off = route.unused(compiled, options) | _unused(compiled, options, proximal)
        specs = tuple(_without(spec, off) for spec in specs if spec.kind not in off)
        extra = route.dims(compiled, options)
        dims = lambda opts: {**option_dims(opts), **extra}  # noqa: E731
    common = _common(dict(route.evaluate_fields))
    return MessageTable("proxal", (*specs, *common), option_dims=dims, build=BUILD)


def per_client(route, compiled, options, proximal: bool = True) -> str:
    """The messages of a run on ``route`` that the server reads client by client (what
    prevents secure aggregation), as ``"kind (fields)"`` joined; "" when every message
    of the run's table is a sum over clients or a client's unmasked scalars.

    Examples
    --------
    >>> from fedmodel.algorithms.proxal.admm_inner import ADMMInner
    >>> per_client(ADMMInner, None, None).split(", admm_w")[1]
    ' (u_tilde, rho, metric)'
    """
    method = "prox-al" if proximal else "admm"
    table = route_table(route, compiled, options, proximal)
    return ", ".join(f"{kind} ({', '.join(fields)})" for kind, fields in table.per_client(method))


def _unused(compiled, options, proximal: bool) -> set[str]:
    """Algorithm 1's optional fields and kinds this run never sends."""
    off = set()
    if compiled.layout.has_owned or not int(options.outer_anderson) or not proximal:
        off |= {"outer.gram", "outer_aa"}  # (no outer Anderson step)
    if not proximal:
        off |= {"outer", "farkas", "ray"}
    if not compiled.layout.has_owned:
        off.add("dtheta_scaled")
    return off


def _without(spec: MessageSpec, off: set[str]) -> MessageSpec:
    """``spec`` without the optional fields named in ``off`` (``"field"`` in any kind,
    ``"kind.field"`` in that kind only)."""

    def keep(fields):
        return {
            k: f
            for k, f in fields.items()
            if f.required or (k not in off and f"{spec.kind}.{k}" not in off)
        }

    return dataclasses.replace(spec, request=keep(spec.request), reply=keep(spec.reply))


def family_table(routes) -> MessageTable:
    """Every route's kinds; the start replies of all routes as alternatives (optional fields,
    each route's required ones an alternative)."""
    request: dict[str, Field] = {}
    reply: dict[str, Field] = {}
    alternatives = []
    kinds: list[MessageSpec] = []
    evaluate: dict[str, Field] = {}
    for route in routes:
        evaluate.update(_optional(route.evaluate_fields))
        request.update(_optional(route.start_request))
        reply.update(_optional(route.start_reply))
        alternatives.append(tuple(k for k, f in route.start_reply.items() if f.required))
        kinds += [s for s in route.messages if s.kind not in {k.kind for k in kinds}]
    specs = _start_specs(request, reply, True, tuple(alternatives), _optional(_FEASIBILITY))
    return MessageTable(
        "proxal", (*specs, *kinds, *_common(evaluate)), option_dims=option_dims, build=BUILD
    )
