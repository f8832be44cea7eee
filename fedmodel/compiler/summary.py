"""``model.summary()``: parties, terms and constraint dimensions (the messages of a method
and what each reveals come from its declared table: :mod:`fedmodel.algorithms.privacy`)."""

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


def model_summary(compiled: CompiledModel) -> str:
    """Parties, terms, constraint dimensions; for a vertical model, its traffic per round.
    A horizontal model's messages, per method, are the privacy rows of the method's
    declared table (:func:`fedmodel.algorithms.privacy.privacy_text`)."""
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
