"""Which cvxpy expressions are smooth (:func:`check_smooth`, :func:`smooth_atoms`) and which are
defined on part of the space only (:func:`restricted_domain`)."""

from __future__ import annotations

import cvxpy as cp
from cvxpy.atoms.affine.affine_atom import AffAtom
from cvxpy.atoms.atom import Atom
from cvxpy.expressions.constants.constant import Constant
from cvxpy.expressions.constants.parameter import Parameter
from cvxpy.expressions.leaf import Leaf
from cvxpy.expressions.variable import Variable

from fedmodel.compiler.atom_rules import _NOT_SMOOTH, _RULES, NotSmoothError, _classify
from fedmodel.expressions import nodes


def check_smooth(expr: cp.Expression) -> None:
    """Raise :class:`NotSmoothError` if ``expr`` uses a non-smooth or unsupported atom.

    Needs no layout, so it can be called when a model term is declared.

    Examples
    --------
    >>> import cvxpy as cp
    >>> x = cp.Variable(3)
    >>> check_smooth(cp.sum(cp.logistic(x)) - cp.sum(cp.logistic(2 * x)))  # nonconvex: fine
    >>> try:
    ...     check_smooth(cp.norm(x, 2))
    ... except NotSmoothError as err:
    ...     print(err.atom, "|", err.reason.split(";")[0])
    PnormApprox | pnorm with p=2 (norm2 / norm) is not differentiable at 0
    """
    for e in nodes(expr):
        if isinstance(e, Leaf):
            if not isinstance(e, (Variable, Parameter, Constant)):
                name = type(e).__name__
                raise NotSmoothError(name, str(e), f"unsupported leaf type {name}")
            continue
        if not isinstance(e, Atom):
            name = type(e).__name__
            raise NotSmoothError(name, str(e), f"{name} is not a cvxpy expression atom")
        name, rule, reason = _classify(e)
        if rule is None:
            raise NotSmoothError(name, str(e), reason or "unsupported")


_SMOOTH_ATOMS_CACHE: frozenset[str] | None = None
_ABSTRACT_BASES = {
    "Atom",
    "AffAtom",
    "AxisAtom",
    "Elementwise",
    "Wrap",
    "UnaryOperator",
    "BinaryOperator",
}
# User-facing cvxpy functions that build only supported atoms.
_SMOOTH_FUNCTIONS = {
    "sum",
    "sum_squares",
    "square",
    "sqrt",
    "inv_pos",
    "power",
    "quad_form",
    "matmul",
    "hstack",
    "vstack",
    "concatenate",
    "stack",
    "bmat",
    "trace",
    "diag",
    "vec",
    "squeeze",
    "promote",
    "prod",
    "mean",
    "var",
    "diff",
}


def restricted_domain(expr: cp.Expression) -> bool:
    """True when ``expr`` is defined on part of the space only (cvxpy's ``domain``:
    ``kl_div``, ``entr``, ``log``, ...): its gradient may be infinite at a finite point.
    A property of the expression's structure, not of the values of its data.

    Examples
    --------
    >>> import cvxpy as cp
    >>> x = cp.Variable(2)
    >>> restricted_domain(cp.sum(cp.kl_div(x, 1))), restricted_domain(cp.sum_squares(x))
    (True, False)
    """
    try:  # (constant conditions, such as quad_over_lin's y >= 0 for y = 1, do not count)
        return any(con.variables() for con in expr.domain)
    except (AttributeError, TypeError, ValueError):
        return False


def smooth_atoms() -> frozenset[str]:
    """Names (cvxpy class names) of the atoms the smooth compiler differentiates.

    Contains cvxpy atom class names (what :attr:`NotSmoothError.atom` and
    :meth:`SmoothFunction.atoms` report) -- including every affine cvxpy atom class, which
    is handled through its coefficient matrix (e.g. ``kron``, ``conv``, ``upper_tri``) --
    and the user-facing cvxpy functions that build only such atoms (``sum_squares``,
    ``quad_form``, ``sqrt``, ...).

    Examples
    --------
    >>> {"logistic", "quad_over_lin", "MulExpression"} <= smooth_atoms()
    True
    >>> "abs" in smooth_atoms()
    False
    """
    global _SMOOTH_ATOMS_CACHE
    if _SMOOTH_ATOMS_CACHE is None:
        names = set(_RULES) | _SMOOTH_FUNCTIONS
        todo = list(AffAtom.__subclasses__()) + list(Atom.__subclasses__())
        seen: set[type] = set()
        while todo:
            cls = todo.pop()
            if cls in seen:
                continue
            seen.add(cls)
            todo.extend(cls.__subclasses__())
            if not cls.__module__.startswith("cvxpy"):
                continue
            kinds = [c.__name__ for c in cls.__mro__ if c.__module__.startswith("cvxpy")]
            blocked = next((k for k in kinds if k in _NOT_SMOOTH or k == "Pnorm"), None)
            ruled = next((k for k in kinds if k in _RULES), None)
            if ruled is not None and (blocked is None or kinds.index(ruled) < kinds.index(blocked)):
                names.add(cls.__name__)
            elif blocked is None and issubclass(cls, AffAtom) and cls.__name__ != "AffAtom":
                names.add(cls.__name__)
        _SMOOTH_ATOMS_CACHE = frozenset(names - _ABSTRACT_BASES)
    return _SMOOTH_ATOMS_CACHE
