"""The privacy table of every method: which messages it sends, how many numbers each
carries for a model, and what each reveals (``model.summary(method=...)``, docs/runtime.md).

It reads the registry (the method's family) and the family's declared
:class:`~fedmodel.runtime.schema.MessageTable`, so it sits above both: no family imports it.

Examples
--------
>>> method_table("prox-al").family, method_table("centralized")
('proxal', None)
"""

from __future__ import annotations

import importlib
from typing import Any

from fedmodel.algorithms.messages import program_dims
from fedmodel.algorithms.options import build_options
from fedmodel.algorithms.registry import FAMILIES, method_spec
from fedmodel.runtime.schema import MessageTable, clear_cell, privacy_markdown
from fedmodel.runtime.secure_aggregation import SECAGG

#: each family's table (module:attribute), imported on first use; pooled methods have none
FAMILY_TABLES: dict[str, str] = {
    "fedmodel.algorithms.proxal": "fedmodel.algorithms.proxal.routes:PROXAL",
    "fedmodel.algorithms.dald": "fedmodel.algorithms.dald.messages:DALD",
    "fedmodel.algorithms.baselines": "fedmodel.algorithms.baselines.messages:BASELINES",
    "fedmodel.algorithms.vfl": "fedmodel.algorithms.vfl.messages:VFL",
    "fedmodel.algorithms.ssca": "fedmodel.algorithms.ssca.messages:SSCA",
}


def method_table(method: str) -> MessageTable | None:
    """The message table of ``method`` (None for the pooled methods, which exchange no
    messages: ``centralized``, ``cprox-al``).

    Examples
    --------
    >>> method_table("prox-al").family, method_table("centralized")
    ('proxal', None)
    """
    method_spec(method)  # (an unknown method is refused with the valid names)
    ref = FAMILY_TABLES.get(FAMILIES.get(method, ""))
    if ref is None:
        return None
    module, attr = ref.split(":")
    return getattr(importlib.import_module(module), attr)


def party_opt_ins() -> list[str]:
    """Every party opt-in a method declares (what ``fedmodel join --reveal`` may name).

    Examples
    --------
    >>> party_opt_ins()
    ['hessian']
    """
    names: set[str] = set()
    for ref in FAMILY_TABLES.values():
        module, attr = ref.split(":")
        names.update(getattr(importlib.import_module(module), attr).party_opt_ins())
    return sorted(names)


def run_table(compiled, method: str, **options: Any) -> tuple[MessageTable | None, str]:
    """The table a run of ``method`` on ``compiled`` declares and a line describing the
    run's plan: the family's ``run_table(compiled, method, options)`` when it has one (a
    family whose messages depend on the model, such as prox-al's inner solvers), else the
    family's table."""
    table = method_table(method)
    if table is None:
        return None, ""
    plan = getattr(importlib.import_module(FAMILIES[method]), "run_table", None)
    if plan is None:
        return table, ""
    return plan(compiled, method, build_options(method_spec(method).options, options, method))


def privacy_rows(compiled, method: str = "prox-al", **options: Any) -> list[dict[str, Any]]:
    """The privacy table of ``method`` on a compiled model with ``options``: one row per
    message kind and direction of the table a run declares (:func:`run_table`), with
    ``floats`` the numbers it carries for this model (the largest over the clients;
    optional fields counted) and ``floats_per_client``.

    Examples
    --------
    >>> import fedmodel as fm, numpy as np, cvxpy as cp
    >>> m = fm.Model("toy"); w = m.variable(3, name="w")
    >>> c = m.client("a"); c.minimize(cp.sum_squares(w - c.data(np.ones(3), "t")))
    >>> rows = privacy_rows(m.compile(), "prox-al", inner_solver="newton")
    >>> [r["floats"] for r in rows if r["kind"] == "newton_w"]
    [3, 13]
    """
    table = run_table(compiled, method, **options)[0]
    if table is None:
        return []
    opts = build_options(method_spec(method).options, options, method)
    extra = table.option_dims(opts) if table.option_dims is not None else {}
    per_client = {
        c.name: table.privacy_rows(method, {**program_dims(c), **extra}) for c in compiled.clients
    }
    first = next(iter(per_client.values()), table.privacy_rows(method, None))
    out = []
    for i, row in enumerate(first):
        counts = {name: rows[i]["floats"] for name, rows in per_client.items()}
        known = [v for v in counts.values() if v is not None]
        out.append({**row, "floats": max(known) if known else None, "floats_per_client": counts})
    return out


def privacy_text(compiled, method: str = "prox-al", **options: Any) -> str:
    """The privacy table of ``method`` as text lines for ``model.summary()``."""
    rows = privacy_rows(compiled, method, **options)
    if not rows:
        return f"messages of {method}: none (it pools every party's data; not federated)"
    heading = run_table(compiled, method, **options)[1]
    lines = [heading] if heading else []
    lines.append(
        f"messages of {method} (floats per message for this model, what each reveals; "
        "'masked': fields the server uses only as sums, masked under secure_aggregation=True; "
        "'clear': scalars each party still sends in the clear under it, which dp=... "
        "noises in the sum unless marked 'also under dp'):"
    )
    for r in rows:
        flag = " [opt-in: " + ", ".join(r["opt_in"]) + "]" if r["opt_in"] else ""
        if r["masked"]:
            flag += " [masked: " + ", ".join(r["masked"]) + "]"
        if r["clear"]:
            flag += " " + clear_cell(r, code="", brackets="[]")
        diag = " [diagnostic]" if r["channel"] == "diagnostic" else ""
        floats = "?" if r["floats"] is None else r["floats"]
        lines.append(
            f"    {r['kind']:<12} {r['direction']:<20} {floats:>8}{flag}{diag}  "
            + (r["reveals"] or "-")
        )
    return "\n".join(lines)


def docs_tables() -> str:
    """The markdown tables of every family's messages, symbolic (the section of
    docs/runtime.md between the ``message-tables`` markers; a test keeps them equal)."""
    parts = []
    for package, ref in FAMILY_TABLES.items():
        module, attr = ref.split(":")
        methods = [m for m, p in FAMILIES.items() if p == package]
        names = ", ".join(f"`{m}`" for m in methods)
        # (a family whose tables depend on the run lists them: prox-al's, one per route)
        listed = getattr(importlib.import_module(package), "docs_tables", None)
        tables = listed() if listed else [("", getattr(importlib.import_module(module), attr))]
        for title, table in tables:
            parts.append(f"#### {names}{': ' + title if title else ''}\n")
            parts.append(privacy_markdown(table.privacy_rows(None), methods=methods) + "\n")
    parts.append("#### secure aggregation (around a sum-only message, `secure_aggregation=True`)\n")
    parts.append(privacy_markdown(SECAGG.privacy_rows(None)) + "\n")
    return "\n".join(parts).rstrip() + "\n"
