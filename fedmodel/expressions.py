"""Walking and rewriting cvxpy expression trees: one implementation for the DSL, the compiler
and the subproblems.

* :func:`nodes`: every node of a tree once, depth first, left to right (the smoothness
  check, the DSL's declaration checks);
* :func:`leaves`: its variables, parameters, constants and data, optionally stopping at
  nodes to take whole (a published expression in the ownership checks);
* :func:`substitute`, :func:`substitute_constraint`: a copy with variables replaced by
  other expressions (the cone form's plain auxiliaries, the cvxpy backend's stacked
  variable);
* :func:`summands`: the terms of a nested sum;
* :func:`numeric_value`: a tree's value by cvxpy's own arithmetic (each atom's
  ``numeric``), its variables' values given;
* :class:`AtomTable`: per-atom knowledge for one purpose, a table from the atom's class name
  to a function (in the spirit of cvxpy's canonicalizer maps). Each table is the one place
  that knows an atom for its purpose: the compiler's affine maps (``compiler/glm.py``), its
  derivative rules (``compiler/atom_rules.py``), the regularizer's weights and proxes
  (``compiler/regularizer.py``), the epigraph rewrite of piecewise-linear atoms
  (``dsl/epigraph.py``) and the max-pieces of a constraint (``dsl/party.py``);
  :func:`atom_tables` lists them.

The module imports nothing of the package, so every layer may use it.

Examples
--------
>>> import cvxpy as cp
>>> x, y = cp.Variable(2, name="x"), cp.Variable(2, name="y")
>>> e = cp.sum_squares(x) + 3 * cp.sum(y)
>>> [leaf.name() for leaf in leaves(e) if isinstance(leaf, cp.Variable)]
['x', 'y']
>>> z = cp.Variable(2, name="z")
>>> [v.name() for v in substitute(e, {y.id: 2 * z}).variables()]
['x', 'z']
>>> len(summands(e))
2
>>> doubled = AtomTable("example: doubled")
>>> @doubled.register("abs")
... def _double_abs(expr):
...     return 2 * expr
>>> doubled.rule_for(cp.abs(x)) is _double_abs, doubled.rule_for(cp.sum(x))
(True, None)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import cvxpy as cp
from cvxpy.atoms.affine.add_expr import AddExpression


class AtomTable(dict):
    """Per-atom knowledge for one purpose: the name of an atom's class -> a function.

    A table is filled with :meth:`register` where its purpose is implemented and read with
    :meth:`rule_for`; an atom without an entry has nothing to say for that purpose (the
    caller decides what that means: not recognised, walk on, or an error). Every table is
    listed by :func:`atom_tables` under its purpose.

    Parameters
    ----------
    purpose : str
        What the table's functions do (unique among the tables).

    Examples
    --------
    >>> import cvxpy as cp
    >>> negated = AtomTable("example: negated")
    >>> @negated.register("maximum", "minimum")
    ... def _negate(expr):
    ...     return -expr
    >>> sorted(negated), negated.purpose
    (['maximum', 'minimum'], 'example: negated')
    """

    def __init__(self, purpose: str):
        super().__init__()
        if purpose in _TABLES:
            raise ValueError(f"an atom table for {purpose!r} exists already")
        self.purpose = purpose
        _TABLES[purpose] = self

    def register(self, *names: str) -> Callable[[Callable], Callable]:
        """Decorator: the function is this table's entry for each atom class in ``names``."""

        def deco(fn: Callable) -> Callable:
            for name in names:
                self[name] = fn
            return fn

        return deco

    def rule_for(self, expr: Any) -> Callable | None:
        """The entry for ``expr``'s class (by name), or ``None``."""
        return self.get(type(expr).__name__)


_TABLES: dict[str, AtomTable] = {}


def atom_tables() -> dict[str, AtomTable]:
    """Every :class:`AtomTable` by purpose (those of the modules imported so far)."""
    return dict(_TABLES)


def nodes(expr: cp.Expression) -> Iterator[cp.Expression]:
    """Every node of ``expr`` (atoms and leaves) once, depth first, left to right."""
    seen: set[int] = set()
    stack = [expr]
    while stack:
        e = stack.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        stack.extend(reversed(e.args))


def leaves(expr: cp.Expression, whole: Callable[[Any], Any] | None = None) -> Iterator[Any]:
    """The leaves of ``expr`` (variables, parameters, constants, data), left to right; where
    ``whole(node)`` is not None, that value is yielded instead of walking into the node."""
    stack = [expr]
    while stack:
        e = stack.pop()
        taken = whole(e) if whole is not None else None
        if taken is not None:
            yield taken
        elif not e.args:
            yield e
        else:
            stack.extend(reversed(e.args))


def substitute(expr: cp.Expression, mapping: Mapping[int, cp.Expression]) -> cp.Expression:
    """Copy of ``expr`` with each variable ``v`` (by id) replaced by ``mapping[v.id]``."""
    if isinstance(expr, cp.Variable):
        return mapping.get(expr.id, expr)
    if not expr.args:
        return expr
    return expr.copy(args=[substitute(a, mapping) for a in expr.args])


def substitute_constraint(con, mapping: Mapping[int, cp.Expression]):
    """Copy of a cvxpy constraint with its variables replaced (see :func:`substitute`)."""
    return con.copy(args=[substitute(a, mapping) for a in con.args])


def summands(expr: cp.Expression) -> list[cp.Expression]:
    """The terms of a (nested) sum ``a + b + ...``; ``[expr]`` for anything else."""
    if isinstance(expr, AddExpression):
        return [s for a in expr.args for s in summands(a)]
    return [expr]


def numeric_value(expr: cp.Expression, variable_value: Callable[[cp.Variable], Any]) -> Any:
    """The value of ``expr`` computed by cvxpy's own arithmetic (each atom's ``numeric`` on
    its arguments' values, as ``expr.value`` does), each variable's value from
    ``variable_value`` (no variable's ``value`` is set or read).

    Examples
    --------
    >>> import numpy as np
    >>> x = cp.Variable(2)
    >>> float(numeric_value(cp.sum_squares(x - 1), lambda v: np.array([1.0, 3.0])))
    4.0
    """
    if isinstance(expr, cp.Variable):
        return variable_value(expr)
    if not expr.args:
        return expr.value
    return expr.numeric([numeric_value(a, variable_value) for a in expr.args])
