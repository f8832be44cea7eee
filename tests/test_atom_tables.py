"""The per-atom tables of fedmodel.expressions: each names real cvxpy atoms and is the one
place that knows an atom for its purpose."""

import cvxpy as cp
import pytest

import fedmodel.compiler.atom_rules  # noqa: F401 - fills the tables
import fedmodel.compiler.glm  # noqa: F401
import fedmodel.compiler.regularizer  # noqa: F401
import fedmodel.dsl.epigraph  # noqa: F401
import fedmodel.dsl.party  # noqa: F401
from fedmodel.expressions import AtomTable, atom_tables

# names kept for other cvxpy versions (norm(x, 2) is a Pnorm in this one)
OTHER_CVXPY_VERSIONS = {"Norm2", "norm2"}


def _cvxpy_classes() -> set[str]:
    names, stack = set(), [cp.Expression]
    while stack:
        cls = stack.pop()
        names.add(cls.__name__)
        stack.extend(cls.__subclasses__())
    return names


def test_every_table_entry_is_a_cvxpy_atom():
    tables = atom_tables()
    assert {
        "affine map of an affine atom",
        "value and derivative of a smooth atom",
        "regularizer: weight into the argument",
        "regularizer: closed-form prox",
        "epigraph of a convex piecewise-linear atom",
        "hypograph of a concave piecewise-linear atom",
        "max pieces of a constraint",
    } <= set(tables)
    known = _cvxpy_classes() | OTHER_CVXPY_VERSIONS
    unknown = {p: sorted(set(t) - known) for p, t in tables.items() if set(t) - known}
    assert not unknown, f"table entries that are no cvxpy class: {unknown}"


def test_a_purpose_has_one_table():
    with pytest.raises(ValueError, match="affine map of an affine atom"):
        AtomTable("affine map of an affine atom")


def test_lookup_is_by_the_atoms_class():
    x = cp.Variable(3)
    tables = atom_tables()
    epi = tables["epigraph of a convex piecewise-linear atom"]
    assert epi.rule_for(cp.abs(x)) is epi["abs"]
    assert epi.rule_for(cp.minimum(x, 0)) is None
    hypo = tables["hypograph of a concave piecewise-linear atom"]
    assert hypo.rule_for(cp.minimum(x, 0)) is hypo["minimum"]
