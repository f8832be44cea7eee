"""``model.summary()``: parties, terms, constraint dimensions, and traffic per round."""

from __future__ import annotations

from fedmodel.compiler.partition import CompiledModel, PartyProgram
from fedmodel.dsl.conic import cone_kind

_CONES = {
    "nonneg": "R_+",
    "zero": "{0}",
    "soc": "a second-order cone",
    "psd": "the PSD cone",
    "exp": "an exponential cone",
    "pow": "a power cone",
}


def _party_lines(p: PartyProgram, publications=()) -> list[str]:
    kind = "server" if p.is_server else "client"
    data = ", ".join(f"{d.data_name}{tuple(d.shape)}" for d in p.data) or "none"
    lines = [f"{kind} '{p.name}': data {data}"]
    for t in p.objective:
        flag = " [non-convex, opted in]" if t.allow_nonconvex else ""
        lines.append(f"    minimize  {t.label}{flag}")
    for c in p.constraints:
        flag = " [non-convex, opted in]" if c.allow_nonconvex else ""
        rel = {"ineq": "<= 0", "eq": "== 0"}.get(c.kind)
        if rel is None:  # a cone constraint of a term with no smooth form (cvxpy backend)
            rel = f"in {_CONES[cone_kind(c.source)]} (hard, cvxpy backend)"
        lines.append(f"    subject to {c.label}: {c.size} component(s) {rel}{flag}")
    for pub in publications:
        if pub.owner == p.name:
            lines.append(f"    publishes '{pub.name}' {tuple(pub.expr.shape)} (sent to the server)")
    if not p.objective and not p.constraints:
        lines.append("    (no terms)")
    return lines


def traffic_per_round(
    compiled: CompiledModel,
    curvature_directions: int = 0,
    local_direction: bool = False,
    constraint_rows: bool = False,
) -> dict[str, dict[str, int]]:
    """Floats crossing the network per client and round, for each method.

    prox-al inner round (Algorithm 2): down w^{t+1} and the local tolerance (d + 1),
    up u~_i and eps~_i (d + 1); outer round: down w^{k+1} (d), up ||dmu_i||_inf and the
    next ADMM initialisation u~_i^0 (d + 1), plus one scalar (the change of its own
    block) when it owns variables. d counts the shared variables only: party-owned ones
    never travel. centralized/cprox-al pool the data. The default (adaptive) prox-al
    sends one more scalar up per inner round: the client's residual-balanced rho_i; on
    models without party-owned variables its Anderson acceleration adds up to ``m + 2``
    numbers down (weights, reset flag) and ``m + 1`` up (Gram row) per inner round
    (``m = anderson = 5``), ``m + 1`` up per outer round and, per accelerated outer step,
    one ``outer_aa`` round (``w`` and the weights down, ``u~_i`` up), not counted in this
    table. On a smooth model without cone constraints or party-owned variables the
    default prox-al runs its quasi-Newton inner solver
    instead of Algorithm 2 (``inner_solver="auto"``): per inner round, down the point
    ``w`` and ``k`` curvature directions (``(k + 1) d``), up the client's value, gradient
    and Hessian-vector products along them (``(k + 1) d + 1``), ``k = min(2, d // 4)`` up
    to 500 shared variables and 0 beyond (``curvature_directions``): the row ``"prox-al
    quasi-Newton round"``. With ``local_direction`` (``local_directions``, on by default up
    to 500 shared variables) a round also sends the server's vector ``r`` down and the
    client's local Newton direction up, with one more curvature direction (``2 d`` more each
    way); with ``constraint_rows`` (``constraint_curvature``, on by default up to 2000) the
    reply adds the rows of the client's active constraints (``d`` floats each; the row
    ``"prox-al quasi-Newton constraint rows (most)"`` counts all of them active). On the other convex models (non-smooth or conic terms,
    party-owned variables, a non-smooth ``h``) it runs exact-admm: per inner round, down the
    client's centre, the penalty and the tolerance (d + 2), up its exact step's shared part
    (d): the row ``"prox-al exact-admm round"``; its outer round sends ``||dmu_i||_inf``, a
    start flag and, with own variables, the change of its block up. No default sends a
    ``d x d`` matrix. Two opt-ins do, and reveal each
    client's Hessian of its subproblem (for a client with fewer rows than d, its rows):
    ``inner_solver="newton"`` adds the client's ``d x d`` Hessian to each reply when it
    changed (every round on a non-quadratic client, with the active set on a quadratic
    one): the row ``"prox-al Newton round (opt-in)"``, counted with the Hessian; the ADMM
    penalty's Hessian metric (``penalty_metric="hessian"``, when ``h`` is smooth and the
    server has no cone constraints) adds its ``d x d`` metric ``M_i`` to a reply whenever
    it changed -- at the start of a run of Algorithm 2 and after its rounds 4, 8, ..., 128
    (a quadratic client sends it once): the row ``"prox-al metric (opt-in)"``.
    ``variant="paper"`` sends exactly Algorithm 2's messages.
    """
    d = compiled.layout.n_shared
    owned = 1 if compiled.layout.has_owned else 0
    metric = d * d if compiled.regularizer.is_smooth and not compiled.server.cones else 0
    newton = not compiled.shared_hessian_obstacle()
    rows = {
        "prox-al inner round": {"down": d + 1, "up": d + 2},
        "prox-al inner round (variant='paper')": {"down": d + 1, "up": d + 1},
        "prox-al outer round": {"down": d, "up": d + 1 + owned},
        "admm round": {"down": d + 1, "up": d + 1},
    }
    if not newton and not compiled.nonconvex:  # exact-admm (the default there)
        rows["prox-al exact-admm round"] = {"down": d + 2, "up": d}
        rows["prox-al outer round (exact-admm)"] = {"down": d, "up": 2 + owned}
    if newton:  # (k: the curvature directions of a quasi-Newton round, from the caller)
        k = int(curvature_directions) + 2 * bool(local_direction)
        rows["prox-al quasi-Newton round"] = {"down": d + k * d, "up": d + 1 + k * d}
        if constraint_rows:
            m = max((p.m_ineq + p.m_eq for p in compiled.clients), default=0)
            rows["prox-al quasi-Newton constraint rows (most)"] = {"down": 0, "up": m * d}
        rows["prox-al Newton round (opt-in)"] = {"down": d, "up": d + 1 + d * d}
    if metric:
        rows["prox-al metric (opt-in)"] = {"down": 0, "up": metric}
    return rows


def model_summary(
    compiled: CompiledModel,
    curvature_directions: int = 0,
    local_direction: bool = False,
    constraint_rows: bool = False,
) -> str:
    n = compiled.n_clients
    layout = compiled.layout
    lines = [f"Model '{compiled.name}': {n} client(s), {layout.size} scalar unknown(s)"]
    lines.append(
        "variables: "
        + ", ".join(
            f"{v.name()}{tuple(v.shape)}"
            + (f" [{layout.owner_of(v)}]" if layout.owner_of(v) is not None else "")
            for v in layout.variables
        )
    )
    if layout.has_owned:
        lines.append(
            "[party] marks a party-owned variable (kept by its owner, never sent); the "
            "hidden ones are epigraph or cone variables of non-smooth terms"
        )
    reg = compiled.regularizer
    lines.append("h (server prox): " + ("; ".join(reg.describe(layout)) or "none"))
    for p in compiled.parties:
        lines += _party_lines(p, compiled.publications)
    if compiled.nonconvex:
        lines.append(
            "non-convex terms present: certificates are local (KKT); the reference is cprox-al"
        )
    if compiled.publications:  # a vertical model: the vfl family's traffic
        n = max(int(pub.expr.size) for pub in compiled.publications)
        lines.append("vertical model (published expressions): traffic per client and round:")
        lines.append(f"    fair-vfl round         down {n + 2:>6}   up {n:>6}")
        lines.append(f"    fedbcd round           down {n:>6}   up {n:>6}")
        lines.append("    centralized / cprox-al  pool every party's data (not federated)")
        return "\n".join(lines)
    lines.append("traffic per client and round (floats):")
    table = traffic_per_round(compiled, curvature_directions, local_direction, constraint_rows)
    width = max(len(name) for name in table)
    for name, t in table.items():
        lines.append(f"    {name:<{width}} down {t['down']:>6}   up {t['up']:>6}")
    lines.append("    (opt-in: reveals each client's d x d Hessian of its subproblem)")
    lines.append("    centralized / cprox-al  pool every party's data (not federated)")
    return "\n".join(lines)
