"""Seed 000 (He, Peng, Sun): ``prox-al`` (Algorithm 1 with the inexact ADMM of Algorithm 2) and
``admm`` (Algorithm 2 alone): options, server half, client half."""

from fedmodel.algorithms.protocol import MethodSpec
from fedmodel.algorithms.proxal import client as _client  # noqa: F401 - registers "proxal.client"
from fedmodel.algorithms.proxal.options import ADMMOptions, ProxALOptions


def run_table(compiled, method: str, options):
    """The message table a run of ``method`` on ``compiled`` with ``options`` declares (its
    inner solver's, the fields it never sends left out) and a line naming that inner
    solver: what ``model.summary()`` and the privacy rows print."""
    from fedmodel.algorithms.proxal.messages import route_table
    from fedmodel.algorithms.proxal.routes import apply_defaults, choose

    proximal = method == "prox-al"
    route, note = choose(compiled, options, proximal)
    apply_defaults(route, options)
    why = f" ({note})" if note else ""
    heading = f"inner solver of {method} on this model: {route.name}{why}"
    return route_table(route, compiled, options, proximal), heading


def docs_tables() -> list:
    """``(title, table)`` per inner solver (routes with the same messages together), for
    docs/runtime.md (:func:`fedmodel.algorithms.privacy.docs_tables`)."""
    from fedmodel.algorithms.proxal.messages import route_table
    from fedmodel.algorithms.proxal.routes import ROUTES

    groups: dict = {}
    for route in ROUTES:
        table = route_table(route)
        key = repr(table.specs)
        groups.setdefault(key, (table, []))[1].append(route.name)
    return [
        (f"inner solver {' / '.join(repr(n) for n in names)}", table)
        for table, names in groups.values()
    ]


def _run(compiled, options, method):
    from fedmodel.algorithms.proxal.server import run_prox_al

    return run_prox_al(compiled, options, method=method)


METHODS = {
    "prox-al": MethodSpec(
        ProxALOptions, _run, "seed 000 Algorithm 1 + 2 (federated)", owned_variables=True
    ),
    "admm": MethodSpec(
        ADMMOptions,
        _run,
        "seed 000 Algorithm 2 alone (no constraints)",
        needs_no_constraints=True,
        owned_variables=True,
        server_sets_in_h=True,
    ),
}
