"""The table of prox-al's inner solvers (routes), in the order ``inner_solver="auto"`` tries
them, and the one place a run's route is chosen.

``"auto"`` takes the first route whose ``auto`` flag is set, that ``accepts`` the model and
the options, and that it ``suits``; a named route runs if it ``accepts`` (else a
:class:`~fedmodel.errors.ModelError` with its reason). A route that ``probes`` may be
refused at the start of the run (by the server's own check or by a client): the run then
takes :func:`fallback` -- under ``"auto"`` the next route of the table that accepts and
does not probe, else Algorithm 2 -- and says so in ``res.extra``. A route's ``defaults``
are applied to the options (those the user left unset, adaptive variant) when it is the
route that runs; ``res.extra["inner_solver_options"]`` lists the values the run used.

Adding an inner solver is one module (an
:class:`~fedmodel.algorithms.proxal.inner.InnerSolver` and its
:class:`~fedmodel.algorithms.proxal.inner.InnerClient`) and one line below.

Examples
--------
>>> [route.name for route in ROUTES]
['prox-quasi-newton', 'quasi-newton', 'newton', 'prox-newton', 'exact-admm', 'admm']
"""

from __future__ import annotations

from fedmodel.algorithms.proxal.admm_inner import ADMMInner
from fedmodel.algorithms.proxal.exact_admm import ExactInner
from fedmodel.algorithms.proxal.inner import InnerSolver
from fedmodel.algorithms.proxal.messages import family_table, per_client
from fedmodel.algorithms.proxal.newton_route import NewtonInner, QuasiNewtonInner
from fedmodel.algorithms.proxal.prox_newton import ProxNewtonInner, ProxQNInner
from fedmodel.errors import ModelError, UnsupportedError

#: why a checkpoint of an earlier prox-al state layout is not resumed
LAYOUT_REFUSED = (
    "this prox-al checkpoint holds the state of an earlier fedmodel version (another layout "
    "of its state); it cannot be resumed: start the run again without "
    "resume="
)

#: the inner solvers, in the order "auto" tries them (Algorithm 2 takes every model)
ROUTES: tuple[type[InnerSolver], ...] = (
    ProxQNInner,
    QuasiNewtonInner,
    NewtonInner,
    ProxNewtonInner,
    ExactInner,
    ADMMInner,
)
#: the family's message table for readers that see no route (the client half's request
#: check before its route is known, the docs): every route's kinds, the start replies of
#: all routes as alternatives
PROXAL = family_table(ROUTES)


def route_named(name: str, routes=None) -> type[InnerSolver]:
    """The route called ``name``."""
    for route in routes or ROUTES:
        if route.name == name:
            return route
    raise ModelError(f"no prox-al inner solver is called {name!r}")


def choose(compiled, options, proximal: bool, routes=None) -> tuple[type[InnerSolver], str]:
    """The route of a run and why ``"auto"`` took it (``res.extra["inner_solver_note"]``).

    Under ``secure_aggregation`` or ``dp`` a route runs only if its run's messages are all
    sums over clients (or a client's unmasked scalars: :func:`secure_obstacle`); ``"auto"`` takes
    the first such route that accepts the model (one it ``suits`` first), and a model
    without one is refused naming the message each route reads client by client."""
    routes = routes or ROUTES
    choice = options.inner_solver
    names = ("auto", *(route.name for route in routes))
    if choice not in names:
        raise ModelError(f"inner_solver must be one of {names}, got {choice!r}")
    if choice != "auto":
        route = route_named(choice, routes)
        why = route.accepts(compiled, options, proximal) or sampling_obstacle(
            route, compiled, options
        )
        if why:
            raise ModelError(f"inner_solver={choice!r} is not available: {why}")
        why = secure_obstacle(route, compiled, options, proximal)
        if why:
            raise UnsupportedError(f"inner_solver={choice!r} is not available: {why}")
        return route, ""
    secure = sums_only(options)
    taken, refused = None, []
    for route in routes:
        if not route.auto:
            continue
        why = route.accepts(compiled, options, proximal) or sampling_obstacle(
            route, compiled, options
        )
        if why:
            refused.append(f"{route.name!r}: {why}")
            continue
        why = secure_obstacle(route, compiled, options, proximal)
        if why:
            refused.append(f"{route.name!r}: {why}")
            continue
        if route.suits(compiled, options, proximal) is None:
            return route, route.note(compiled, options, proximal)
        taken = taken or route
    if secure and taken is not None:  # (it accepts, although "auto" prefers another)
        return taken, f"the first inner solver whose messages are sums ({private_name(options)})"
    if taken is not None and sampled(compiled, options):
        return taken, f"the first inner solver that samples clients ({sampling_options(options)})"
    if secure:
        raise UnsupportedError(
            f"prox-al with {private_name(options)} (the server learns only sums over clients): "
            "no inner solver that accepts this model has only messages the server uses as "
            "sums; " + "; ".join(refused)
        )
    if sampled(compiled, options):
        raise ModelError(
            f"{sampling_options(options)}: no prox-al inner solver that samples "
            "clients accepts this model; " + "; ".join(refused)
        )
    raise ModelError("no prox-al inner solver accepts this model")  # (the last accepts all)


def sampled(compiled, options) -> bool:
    """Whether the options ask for rounds without some clients on this model
    (``participation`` below every client, or a ``quorum``)."""
    per_round = getattr(options, "clients_per_round", None)
    if per_round is None:
        return False
    return per_round(compiled.n_clients) is not None or getattr(options, "quorum", None) is not None


def sampling_options(options) -> str:
    """The options that ask for rounds without some clients, as written (for errors)."""
    given = {k: getattr(options, k, None) for k in ("participation", "quorum")}
    return ", ".join(f"{k}={v!r}" for k, v in given.items() if v is not None)


def sampling_obstacle(route: type[InnerSolver], compiled, options) -> str:
    """Why ``route`` cannot run with the options' ``participation`` ("" when it can or every
    client takes part in every round)."""
    if not sampled(compiled, options):
        return ""
    if not route.samples:
        return (
            f"its rounds need every client ({sampling_options(options)} is "
            "taken by inner_solver='exact-admm')"
        )
    if sums_only(options):
        return f"{private_name(options)} takes sums over every client, not over a sample of them"
    return ""


def secure_obstacle(route: type[InnerSolver], compiled, options, proximal: bool) -> str:
    """Why ``route`` cannot run under the options' ``secure_aggregation`` or ``dp`` (""
    when it can or both are off): the messages of its run that the server reads client by
    client, named with their fields."""
    if not sums_only(options):
        return ""
    which = per_client(route, compiled, options, proximal)
    if not which:
        return ""
    return (
        f"under {private_name(options)} the {route.name} inner solver reads {which} client "
        "by client"
    )


def sums_only(options) -> bool:
    """Whether the run's server may learn only sums over clients (``secure_aggregation``
    or ``dp``)."""
    return bool(getattr(options, "sums_only", False))


def private_name(options) -> str:
    """The option that asks for sums only, as an error names it."""
    return "secure_aggregation" if getattr(options, "secure_aggregation", False) else "dp"


def fallback(failed: type[InnerSolver], compiled, options, proximal, routes=None):
    """The route a run takes when ``failed`` is refused at its start: under ``"auto"`` the
    next route of the table that accepts and does not probe, else the last (Algorithm 2).
    (Under secure aggregation the server refuses a fallback route that reads a message
    client by client: :func:`secure_obstacle`.)"""
    routes = routes or ROUTES
    if options.inner_solver == "auto":
        later = routes[routes.index(failed) + 1 :]
        for route in later:
            if not route.probes and not route.accepts(compiled, options, proximal):
                return route
    return routes[-1]


def apply_defaults(route: type[InnerSolver], options) -> None:
    """Set ``route``'s adaptive defaults on the options the user left unset."""
    if options.adaptive:
        for name, value in route.defaults.items():
            if name in getattr(options, "_defaulted", ()):
                setattr(options, name, value)


def route_option_values(options) -> dict:
    """The values a run uses for every option some route's defaults name
    (``res.extra["inner_solver_options"]``)."""
    names = sorted({n for r in ROUTES for n in r.defaults})
    return {n: getattr(options, n) for n in names}
