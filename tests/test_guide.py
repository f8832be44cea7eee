"""The user guide's derived content is generated, never kept by hand.

- docs/guide/methods.md's method chooser (between its ``method-chooser`` markers): for one
  small model of each class, the inner solver prox-al's default picks
  (``res.extra["inner_solver"]``) and the fields of the message a client sends each round
  (the kinds of the run's ledger, their fields' sizes from the method's declared message
  table). Run ``python tests/test_guide.py`` to print the table the page must hold.
- docs/guide/troubleshooting.md has one section per status of ``fedmodel.result.STATUSES``.
- docs/guide/methods.md names every method of the registry.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import cvxpy as cp
import numpy as np

import fedmodel as fm
from fedmodel.algorithms.privacy import method_table
from fedmodel.algorithms.registry import available_methods
from fedmodel.result import STATUSES

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "guide"
CHOOSER = re.compile(r"<!-- method-chooser:begin -->\n(.*?)<!-- method-chooser:end -->", re.S)

#: the model classes of the chooser, in the page's order
CLASSES = (
    "smooth terms, no constraints",
    "smooth terms, smooth inequality constraints",
    "smooth terms, affine equality constraints",
    "linear inequality constraints",
    "smooth terms, non-smooth h (l1, box)",
    "piecewise-linear terms (hinge, l1)",
    "cone terms (2-norm, ...)",
    "party-owned variables",
    "smooth non-convex constraints",
)


def class_model(kind: str, d: int = 6) -> fm.Model:
    """A three-client model of class ``kind`` on random data (``d`` shared variables)."""
    rng = np.random.default_rng(0)
    model = fm.Model(kind)
    w = model.variable(d, name="w")
    for k in range(3):
        site = model.client(f"site{k}")
        A = site.data(rng.normal(size=(30, d)), name="A")
        y = np.sign(rng.normal(size=30))
        logistic = cp.sum(cp.logistic(-cp.multiply(y, A @ w))) / 90
        squares = cp.sum_squares(A @ w - y) / 90
        if kind == CLASSES[0]:
            site.minimize(logistic)
        elif kind == CLASSES[1]:
            site.minimize(logistic)
            site.subject_to(cp.sum(cp.logistic(A @ w)) / 30 <= 0.8)
        elif kind == CLASSES[2]:
            site.minimize(squares)
            site.subject_to(A[:2] @ w == 0)
        elif kind == CLASSES[3]:
            site.minimize(squares)
            site.subject_to(cp.sum(w) <= 0.1)
        elif kind == CLASSES[4]:
            site.minimize(squares)
        elif kind == CLASSES[5]:
            site.minimize(cp.sum(cp.pos(1 - cp.multiply(y, A @ w))) / 90)
        elif kind == CLASSES[6]:
            site.minimize(cp.norm(A @ w - y, 2))
        elif kind == CLASSES[7]:
            b = site.variable(name=f"b{k}")
            site.minimize(cp.sum_squares(A @ w + b - y) / 90)
        else:
            site.minimize(squares)
            site.subject_to(cp.sum_squares(w) - 2 * cp.square(w[0]) >= 0.5, allow_nonconvex=True)
    if kind == CLASSES[4]:
        model.regularize(0.05 * cp.norm1(w))
    return model


def _fields(method: str, kind: str, present: set[str] | None = None) -> str:
    """``kind: field size, ...`` of the client's reply, sizes as the message table declares
    them (only the fields of ``present``, when given)."""
    rows = method_table(method).privacy_rows(method, None)
    row = next(r for r in rows if r["kind"] == kind and r["direction"] != "server -> client")
    fields = [
        f"`{name}` {_size(size)}"
        for name, size in row["fields"].items()
        if present is None or name in present
    ]
    return f"`{kind}`: " + ", ".join(fields)


def _size(size: str) -> str:
    """A declared size as the page writes it: ``<=cdxd`` -> ``≤ cd × d``, ``*xd`` ->
    ``rows × d``."""
    size = size.rstrip("?")
    bound = "≤ " if size.startswith("<=") else ""
    matrix = re.fullmatch(r"(\w+?|\*)x(\w+)", size.removeprefix("<="))
    if matrix:
        rows = "rows" if matrix.group(1) == "*" else matrix.group(1)
        return f"{bound}{rows} × {matrix.group(2)}"
    return bound + size.removeprefix("<=")


def proxal_row(kind: str) -> str:
    res = class_model(kind).solve("prox-al", max_outer=2)
    replies = Counter(
        r["kind"].removesuffix("_reply")
        for r in res.ledger
        if r["channel"] == "algorithm" and r["sender"] != "server"
    )
    per_round = next(k for k, _ in replies.most_common() if k not in ("start", "outer"))
    present = {
        name
        for r in res.ledger
        if r["kind"] == f"{per_round}_reply" and r["sender"] != "server"
        for name in r["shapes"]
    }
    inner = res.extra["inner_solver"]
    return f"| {kind} | `prox-al` | `{inner}` | {_fields('prox-al', per_round, present)} |"


def chooser_table() -> str:
    lines = [
        "| model class | method | inner solver | what a client sends each round |",
        "|---|---|---|---|",
        *(proxal_row(kind) for kind in CLASSES),
        "| any of the above, data pooled (the reference) | `centralized` | (none) | "
        "nothing: it is not federated |",
        "| vertical: parties hold column blocks and `publish` partial scores | `fair-vfl`, "
        f"`fedbcd` | (none) | {_fields('fair-vfl', 'vfl_round')} |",
        "| `fm.LearningModel` (a per-sample loss over clients' rows) | `ssca` | (none) | "
        f"{_fields('ssca', 'ssca_w')} |",
        "| no server: parties talk to neighbours over a `topology=` | `dald-dc`, `dgd` | "
        f"(none) | {_fields('dald-dc', 'dc_x')} |",
    ]
    return "\n".join(lines) + "\n"


def test_the_method_chooser_is_the_generated_one():
    page = (GUIDE / "methods.md").read_text(encoding="utf-8")
    found = CHOOSER.search(page)
    assert found, "docs/guide/methods.md has no method-chooser section"
    expected = chooser_table()
    assert found.group(1) == expected, "regenerate it (python tests/test_guide.py):\n" + expected


def test_every_method_is_named_on_the_methods_page():
    page = (GUIDE / "methods.md").read_text(encoding="utf-8")
    missing = [m for m in available_methods() if f"`{m}`" not in page]
    assert not missing, f"docs/guide/methods.md does not name {missing}"


def test_troubleshooting_has_a_section_per_status():
    page = (GUIDE / "troubleshooting.md").read_text(encoding="utf-8")
    headings = re.findall(r"^## `([a-z_]+)`", page, re.M)
    assert headings == list(STATUSES)


if __name__ == "__main__":
    print(chooser_table(), end="")
