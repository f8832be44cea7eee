"""The package layers depend on each other in one direction (docs/architecture.md): the
runtime carries messages and knows no algorithm, compiler or DSL; the compiler and the
subproblems know no algorithm or runtime; only the ``Model.compile`` / ``Model.solve``
facades reach upwards, lazily."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import fedmodel

PACKAGE = Path(fedmodel.__file__).parent

# layer -> the layers it must never import (at module level or lazily)
FORBIDDEN = {
    "runtime": {"algorithms", "compiler", "dsl", "subproblems", "certificate", "models"},
    "compiler": {"algorithms", "runtime", "subproblems", "models"},
    "subproblems": {"algorithms", "runtime", "dsl", "models"},
    "certificate": {"algorithms", "runtime", "dsl", "models"},
    "dsl": {"runtime", "subproblems", "models"},
    "losses": {"algorithms", "compiler", "dsl", "runtime", "subproblems", "certificate", "models"},
}
# the facades: lazy imports allowed in these files only
FACADES = {("dsl", "algorithms"): {"model.py"}, ("dsl", "compiler"): {"model.py", "party.py"}}


def imports(path: Path):
    tree = ast.parse(path.read_text())
    top = {id(n) for n in tree.body}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] == "fedmodel" and len(parts) > 1:
                yield parts[1], id(node) in top, node.lineno


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_layers_import_downwards_only(layer):
    bad = []
    for path in sorted((PACKAGE / layer).rglob("*.py")):
        for target, at_top, line in imports(path):
            if target not in FORBIDDEN[layer]:
                continue
            if not at_top and path.name in FACADES.get((layer, target), set()):
                continue
            bad.append(f"{path.relative_to(PACKAGE)}:{line} imports fedmodel.{target}")
    assert not bad, "\n".join(bad)


def test_dsl_reaches_algorithms_only_through_the_solve_facade():
    for path in sorted((PACKAGE / "dsl").rglob("*.py")):
        for target, at_top, line in imports(path):
            if target in ("algorithms", "compiler"):
                assert not at_top, f"{path.name}:{line}: a module-level import of {target}"
