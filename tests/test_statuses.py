"""One status vocabulary: every status a method can return is in ``fm.STATUSES``."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

import fedmodel as fm
from fedmodel.result import Result

ALGORITHMS = Path(fm.__file__).parent / "algorithms"

#: status strings the methods use internally and map before a Result is made: the method's
#: stopping test held (the driver's certificate turns it into "optimal" or "inaccurate"),
#: and Clarabel's own statuses inside the pooled solve (mapped by centralized/pooled.py)
INTERNAL = {"stopped", "optimal_inaccurate", "user_limit"}


def _status_literals(tree: ast.AST) -> set[str]:
    """String constants assigned to a status: ``status = "..."``, ``x.status = "..."``,
    ``report.stop = "..."``, ``stop="..."`` keywords, ``status, message = "...", ...`` and
    ``return "...", message`` in ``conclude`` methods."""
    found: set[str] = set()

    def named(target: ast.AST) -> bool:
        name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
        return name in ("status", "stop")

    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if named(target) and isinstance(node.value, ast.Constant):
                    found.add(node.value.value)
                if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple):
                    for t, v in zip(target.elts, node.value.elts):
                        if named(t) and isinstance(v, ast.Constant):
                            found.add(v.value)
        elif isinstance(node, ast.keyword) and node.arg in ("status", "stop"):
            if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
                found.add(node.value.value)
        elif isinstance(node, ast.FunctionDef) and node.name == "conclude":
            for ret in ast.walk(node):
                if isinstance(ret, ast.Return) and isinstance(ret.value, ast.Tuple):
                    first = ret.value.elts[0]
                    if isinstance(first, ast.Constant):
                        found.add(first.value)
    return {s for s in found if isinstance(s, str)}


def test_every_status_the_methods_set_is_documented():
    found: dict[str, list[str]] = {}
    for path in sorted(ALGORITHMS.rglob("*.py")):
        for status in _status_literals(ast.parse(path.read_text())):
            found.setdefault(status, []).append(path.name)
    unknown = {s: where for s, where in found.items() if s not in set(fm.STATUSES) | INTERNAL}
    assert not unknown, f"statuses missing from fm.STATUSES: {unknown}"
    # the scan sees the federated monitors' verdicts (the pooled solver's come from its
    # status table: the next test)
    assert {"diverging", "stalled", "unbounded", "time_limit", "max_iterations"} <= set(found)


def test_the_pooled_solvers_statuses_map_into_the_vocabulary():
    from fedmodel.algorithms.centralized import direct

    # cvxpy's statuses; pooled.py keeps "infeasible"/"unbounded" of "..._inaccurate"
    mapped = {
        s.split("_")[0] if s.startswith(("inf", "unb")) else s for s in direct.STATUS.values()
    }
    assert {"infeasible", "unbounded"} <= mapped <= set(fm.STATUSES) | INTERNAL


def test_an_infeasible_model_is_infeasible_in_the_vocabulary():
    import cvxpy as cp

    model = fm.Model()
    w = model.variable(2)
    site = model.client("a")
    site.minimize(cp.sum_squares(w))
    site.subject_to(cp.sum(w) >= 1)
    model.server.subject_to(cp.sum(w) <= -1)
    res = model.solve(method="centralized")
    assert res.status == "infeasible" and res.status in fm.STATUSES


def test_every_status_has_its_meaning_and_what_to_do():
    assert "diverging" in fm.STATUSES and "stalled" in fm.STATUSES
    for status, info in fm.STATUSES.items():
        assert isinstance(info, fm.StatusInfo)
        assert info.meaning and info.action, status


def test_a_result_with_an_unknown_status_is_refused():
    with pytest.raises(ValueError, match="not one of fedmodel.STATUSES"):
        Result("converged", "m", 0.0, 0.0, np.zeros(1), {}, {}, None)
