"""What the route table asks of a model: the facts that decide which inner solver of
prox-al can run (``accepts``) and which one ``inner_solver="auto"`` takes (``suits``), in
one module that the route modules import (none of them imports another for it).

Examples
--------
>>> EXACT_MIN_EPS
1e-05
"""

from __future__ import annotations

from fedmodel.compiler.partition import CompiledModel
from fedmodel.subproblems import conic_prox
from fedmodel.subproblems.newton import LOW_RANK_RATIO

#: below this eps an exact-admm run of "auto" whose certificate fails at its lowest inner
#: floor goes on with Algorithm 2, and a smooth model's inequality walls at the server
#: alone stay with quasi-Newton (exact_eps_ok, exact_preferred;
#: tests/test_convex_models.py certifies hinge-squared at 1e-6 and an inv_pos barrier at
#: 1e-7 so)
EXACT_MIN_EPS = 1e-5
#: "auto" takes exact-admm for a smooth model's inequality walls up to this many shared
#: variables (the clients' exact steps factor dense ``d x d`` Hessians; quasi-Newton's
#: limited-memory model takes larger ``d``)
EXACT_WALLS_MAX_SHARED = 2000


def newton_obstacle(compiled, options, proximal: bool) -> str:
    """Why ``inner_solver`` cannot (or ``"auto"`` should not) be (quasi-)Newton; "" if it
    can."""
    if not proximal:
        return "method 'admm' is Algorithm 2 itself"
    why = compiled.shared_hessian_obstacle()
    if why:
        return why
    if options.solver not in ("auto", "newton"):
        return f"solver={options.solver!r} (Newton derivatives need the Newton backend)"
    return ""


def prox_qn_obstacle(compiled, options, proximal: bool) -> str:
    """Why ``inner_solver="prox-quasi-newton"`` cannot run ("" if it can): it needs
    prox-al, a non-smooth ``h`` (a smooth one is the quasi-Newton loop's), and smooth
    parties' terms on the shared variables only -- no party-owned variables (epigraph
    pieces of non-smooth terms are such) and no cone constraints -- with the Newton or
    L-BFGS backends."""
    if not proximal:
        return "method 'admm' is Algorithm 2 itself"
    if compiled.regularizer.is_smooth:
        return "h is smooth (inner_solver='quasi-newton' takes it)"
    if compiled.layout.has_owned:
        return "parties own variables (their blocks never travel)"
    if compiled.has_cones:
        return "parties have cone constraints (no gradients)"
    if options.solver not in ("auto", "newton", "lbfgs"):
        return f"solver={options.solver!r} (the loop needs gradients of the parties' terms)"
    return ""


def exact_eps_ok(options) -> bool:
    """Whether exact-admm's certificate is expected to hold at this ``eps``: its steps are
    interior-point solutions, whose duals of pieces at a kink are ambiguous to about the
    square root of the solver's gap (Clarabel at 1e-10: ~1e-5 relative), so below
    :data:`EXACT_MIN_EPS` the certificate may fail at a correct point; an ``"auto"`` run
    then goes on with Algorithm 2 from it
    (:meth:`~fedmodel.algorithms.proxal.exact_admm.ExactServer.may_hand_over`)."""
    return min(options.eps1, options.eps2) >= EXACT_MIN_EPS


def inequality_walls(compiled: CompiledModel) -> str:
    """Why ``"auto"`` takes exact-admm on a smooth convex model ("" if it keeps
    quasi-Newton): a party has inequality constraints of the user's, at most
    :data:`EXACT_WALLS_MAX_SHARED` shared variables or few data rows per party
    (:func:`cheap_exact_steps`), and no party whose exact step is a cvxpy solve (one with
    constraints) has exponential-cone terms.

    The quasi-Newton model learns an inequality's wall along the steps that hit it, and
    each multiplier update moves it; exact steps impose the walls (each party's own, hard)
    and the consensus needs no outer multiplier update. Quick sizes of
    ``benchmarks/models.py``, rounds of exact-admm against quasi-Newton: markowitz 53
    against 275 (full size 129 against 1,147), lcqp-1 37 against 106 (full), lcqp-5 35
    against 152 (full), logistic-ball-d100 22 against 98 (full); equality-only models stay
    with quasi-Newton (seed 000 Table 1 largest: 18 rounds against exact-admm's 35),
    unconstrained ones too (ridge-20 13 against 26).
    Constrained parties with exponential-cone terms are left out: Adult Neyman-Pearson
    (20 sites, a logistic constraint per site) took 677 rounds with exact-admm against
    quasi-Newton's 226 (its exact steps by the method of multipliers,
    :mod:`fedmodel.subproblems.multipliers`; through Clarabel ~3 s per round)."""
    if not cheap_exact_steps(compiled):
        return ""
    walled = [p.name for p in compiled.walled]
    if not walled or polyhedral_walls_only(compiled):
        return ""
    for party in compiled.parties:
        if party.constraints and conic_prox.exp_cone_terms(party):
            return ""
    return (
        f"inequality constraints ({', '.join(repr(n) for n in walled[:3])}"
        f"{', ...' if len(walled) > 3 else ''}): exact steps impose them"
    )


def polyhedral_walls_only(compiled: CompiledModel) -> bool:
    """Whether the model's inequality walls are all clients' affine rows on parties with no
    objective, and the server's ``h`` has a non-smooth prox (bounds, a norm): a QP or LP
    split as its rows. Each client's exact step is then the projection of a point onto its
    polyhedron, and exact-admm's consensus of such projections crawls (alternating
    projections), while prox-quasi-newton's method of multipliers reaches the vertex: the
    federated Maros-Meszaros benchmark (``benchmarks/maros_meszaros.py``, eps 1e-3,
    60 s) with prox-quasi-newton in place of exact-admm gives PRIMALC1, PRIMALC2,
    PRIMALC5, PRIMALC8, QPCSTAIR, QRECIPE, QSCAGR7 and QSCORPIO optimal and right
    (exact-admm: diverging, time_limit or inaccurate on each), and QAFIRO in 119 rounds
    against 631. With a smooth ``h`` the quasi-Newton route would take it, which this
    does not claim (its certificate held at HS268's wrong point).

    Examples
    --------
    >>> import cvxpy as cp, numpy as np, fedmodel as fm
    >>> m = fm.Model("lp")
    >>> x = m.variable(3, name="x", bounds=(0.0, 1.0))
    >>> m.server.minimize(np.ones(3) @ x)
    >>> _ = m.client("c").subject_to(np.ones((2, 3)) @ x >= 1.0)
    >>> polyhedral_walls_only(m.compile())
    True
    """
    if compiled.regularizer.is_smooth:
        return False
    for party in compiled.walled:
        if party is compiled.server or party.objective:
            return False
        if not all(c.expr.is_affine() for c in party.constraints):
            return False
    return True


def cheap_exact_steps(compiled: CompiledModel) -> bool:
    """Whether every party's exact step is cheap at this size: at most
    :data:`EXACT_WALLS_MAX_SHARED` shared variables (a dense ``d x d`` Newton system), or
    every party's data matrices have at most ``LOW_RANK_RATIO * d`` rows in all (its Newton
    steps are Woodbury steps with an ``m x m`` factor; ``subproblems/newton.py``). Sparse
    logistic regression in an l2 ball, d = 10,000, 20 clients x 500 rows: exact-admm 27
    rounds and 9.2 s, quasi-Newton 303 rounds and 10.4 s."""
    d = compiled.layout.n_shared
    if d <= EXACT_WALLS_MAX_SHARED:
        return True
    for party in compiled.parties:
        rows = sum(item.shape[0] for item in party.data if len(item.shape) == 2)
        if rows > LOW_RANK_RATIO * d:
            return False
    return True


def restricted_domain_party(compiled: CompiledModel) -> str:
    """Which party has a term defined on part of the space only ("" if none)."""
    for party in compiled.parties:
        if party.restricted_domain:
            return f"party '{party.name}' has terms with a restricted domain (kl_div, entr, log)"
    return ""


def exact_preferred(compiled: CompiledModel, options, proximal: bool) -> bool:
    """Whether ``"auto"`` would take exact-admm over a smooth model's Newton-type route:
    a term with a restricted domain (at any ``eps``), inequality walls
    (:func:`inequality_walls`) at an ``eps`` it certifies (:func:`exact_eps_ok`), and
    below that a client's walls (:func:`client_walls`).

    Below :data:`EXACT_MIN_EPS` walls at the server alone stay with the quasi-Newton
    route: the server's model step imposes them itself, and the route runs in the
    objective's units (exact-admm keeps the user's; on a smooth model with server walls
    and its objective scaled by 1e-6 it did not meet eps = 1e-6 in 40 outer iterations).
    A client's walls reach the quasi-Newton model only through its multiplier updates and
    secant pairs, which do not settle at such an ``eps``: Maros-Meszaros HS268 (5
    variables, its rows at the clients) ended max_iterations after 500 outer iterations
    at a gap of 0.2 there, and KSIP "diverging", where exact-admm certifies them in 44
    and 189 rounds."""
    if not proximal or compiled.nonconvex:
        return False
    if restricted_domain_party(compiled):  # (a Newton-type step may leave the domain)
        return True
    if not inequality_walls(compiled):
        return False
    return bool(exact_eps_ok(options) or client_walls(compiled))


def client_walls(compiled: CompiledModel) -> bool:
    """Whether a client has inequality constraints of the user's
    (:attr:`~fedmodel.compiler.partition.CompiledModel.walled`)."""
    server = compiled.server
    return any(party is not server for party in compiled.walled)
