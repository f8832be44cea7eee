"""Exact smooth reformulations of non-smooth convex terms (epigraph form).

A DCP-convex term ``f(x)`` that contains piecewise-linear atoms (``pos``/hinge,
``maximum``, ``abs``, ``max``, ``norm1``, ``norm_inf``, ``sum_largest``, and the concave
``minimum``/``min``/``neg`` where they enter with a minus sign) is rewritten as

    f(x) = min_t  f~(x, t)   s.t.  piece_j(x) - t <= 0   (affine in t),

where ``f~`` is ``f`` with each such atom node replaced by an auxiliary ``t`` (owned by
the party that wrote the term). DCP guarantees that every convex node sits where the
expression is nondecreasing in it (and every concave node where it is nonincreasing), so
at a minimiser each ``t`` equals the node's value and the reformulation is exact; the
rewritten term and constraints are smooth whenever the atoms' arguments are. This is what
lets gradient methods and the KKT certificate (Definition 1 of seed 000, on the epigraph
form) treat soft-margin SVMs, pinball and l1 losses exactly.

The norm ball ``norm(x, 2) <= r`` (``r > 0`` constant) is the same set as
``sum_squares(x) <= r^2``, which is smooth; see :func:`norm_ball_as_smooth`.

Examples
--------
>>> import cvxpy as cp
>>> x = cp.Variable(3)
>>> made = []
>>> def aux(shape, stem):
...     made.append(cp.Variable(shape, name=f"t{len(made)}"))
...     return made[-1]
>>> smooth, pieces = epigraph_form(cp.sum(cp.pos(1 - x)), aux)
>>> smooth
Expression(AFFINE, UNKNOWN, ())
>>> len(pieces)
2
"""

from __future__ import annotations

from collections.abc import Callable

import cvxpy as cp
import numpy as np

from fedmodel.expressions import AtomTable

#: makes an auxiliary variable of the given shape (owned by the party writing the term)
AuxFactory = Callable[[tuple[int, ...], str], cp.Variable]


def epigraph_form(
    expr: cp.Expression, make_aux: AuxFactory
) -> tuple[cp.Expression, list[cp.Expression]]:
    """Replace the piecewise-linear atoms of a convex ``expr`` by epigraph variables.

    Parameters
    ----------
    expr : cvxpy.Expression
        A DCP-convex expression (an objective term, or ``g`` of a constraint ``g <= 0``).
    make_aux : callable
        ``make_aux(shape, stem)`` returns a new auxiliary variable.

    Returns
    -------
    smooth_expr : cvxpy.Expression
        ``expr`` with the atoms replaced (unchanged when there was nothing to replace).
    pieces : list of cvxpy.Expression
        Expressions ``p`` that must satisfy ``p <= 0`` (elementwise).
    """
    pieces: list[cp.Expression] = []
    out = _rewrite(expr, +1, make_aux, pieces)
    return out, pieces


def _flat(e: cp.Expression) -> cp.Expression:
    return cp.vec(e, order="F") if e.ndim else cp.reshape(e, (1,), order="F")


# The piecewise-linear atoms the rewrite replaces by auxiliaries: where the expression is
# nondecreasing in a convex one (its epigraph) or nonincreasing in a concave one (its
# hypograph). Each entry returns the replacement (adding its pieces ``p <= 0``), or None
# where the atom is kept (an axis).
EPIGRAPH = AtomTable("epigraph of a convex piecewise-linear atom")
HYPOGRAPH = AtomTable("hypograph of a concave piecewise-linear atom")


@EPIGRAPH.register("maximum")
def _epigraph_maximum(e, make_aux: AuxFactory, pieces: list):
    args = [_rewrite(a, +1, make_aux, pieces) for a in e.args]
    t = make_aux(e.shape, "max")
    pieces.extend(_flat(a - t) for a in args)
    return t


@EPIGRAPH.register("abs")
def _epigraph_abs(e, make_aux: AuxFactory, pieces: list):
    (a,) = [_rewrite(a, 0, make_aux, pieces) for a in e.args]
    t = make_aux(e.shape, "abs")
    pieces.extend([_flat(a - t), _flat(-a - t)])
    return t


@EPIGRAPH.register("max")
def _epigraph_max(e, make_aux: AuxFactory, pieces: list):
    if getattr(e, "axis", None) is not None:
        return None
    (a,) = [_rewrite(a, +1, make_aux, pieces) for a in e.args]
    t = make_aux((), "max")
    pieces.append(_flat(a - t))
    return t


@EPIGRAPH.register("norm1")
def _epigraph_norm1(e, make_aux: AuxFactory, pieces: list):
    if getattr(e, "axis", None) is not None:
        return None
    (a,) = [_rewrite(a, 0, make_aux, pieces) for a in e.args]
    t = make_aux(a.shape, "abs")
    pieces.extend([_flat(a - t), _flat(-a - t)])
    return cp.sum(t)


@EPIGRAPH.register("norm_inf")
def _epigraph_norm_inf(e, make_aux: AuxFactory, pieces: list):
    if getattr(e, "axis", None) is not None:
        return None
    (a,) = [_rewrite(a, 0, make_aux, pieces) for a in e.args]
    t = make_aux((), "max")
    pieces.extend([_flat(a - t), _flat(-a - t)])
    return t


@EPIGRAPH.register("sum_largest")
def _epigraph_sum_largest(e, make_aux: AuxFactory, pieces: list):
    # sum of the k largest entries = min_s k s + sum(pos(x - s))
    (a,) = [_rewrite(a, +1, make_aux, pieces) for a in e.args]
    s = make_aux((), "level")
    u = make_aux(a.shape, "excess")
    pieces.extend([_flat(a - s - u), _flat(-u)])
    return float(e.k) * s + cp.sum(u)


@HYPOGRAPH.register("minimum")
def _hypograph_minimum(e, make_aux: AuxFactory, pieces: list):
    args = [_rewrite(a, -1, make_aux, pieces) for a in e.args]
    t = make_aux(e.shape, "min")
    pieces.extend(_flat(t - a) for a in args)
    return t


@HYPOGRAPH.register("min")
def _hypograph_min(e, make_aux: AuxFactory, pieces: list):
    if getattr(e, "axis", None) is not None:
        return None
    (a,) = [_rewrite(a, -1, make_aux, pieces) for a in e.args]
    t = make_aux((), "min")
    pieces.append(_flat(t - a))
    return t


def _rewrite(e, sign: int, make_aux: AuxFactory, pieces: list) -> cp.Expression:
    if not e.args:
        return e
    # a convex piecewise-linear atom where the expression is nondecreasing in it, or a
    # concave one where it is nonincreasing in it
    table = EPIGRAPH if sign > 0 else HYPOGRAPH if sign < 0 else None
    if table is not None:
        curved = e.is_convex() if sign > 0 else e.is_concave()
        rule = table.rule_for(e) if curved and not e.is_affine() else None
        replaced = rule(e, make_aux, pieces) if rule is not None else None
        if replaced is not None:
            return replaced
    if e.is_affine():
        return e  # nothing non-smooth below an affine node
    new_args = []
    for i, a in enumerate(e.args):
        if a.is_affine():
            new_args.append(a)
            continue
        incr, decr = _monotone(e, i)
        child = sign if incr else (-sign if decr else 0)
        new_args.append(_rewrite(a, child, make_aux, pieces))
    if all(n is o for n, o in zip(new_args, e.args)):
        return e
    return e.copy(args=new_args)


def _monotone(e, i: int) -> tuple[bool, bool]:
    try:
        return bool(e.is_incr(i)), bool(e.is_decr(i))
    except Exception:  # pragma: no cover - atoms without monotonicity information
        return False, False


def norm_ball_as_smooth(lhs: cp.Expression, rhs: cp.Expression) -> cp.Expression | None:
    """``sum_squares(x) - r^2`` for ``norm(x, 2) <= r`` with a constant ``r > 0``, else None.

    The two sets are equal, and the new ``g`` is smooth (the norm is not at ``x = 0``).
    A radius holding a :class:`cvxpy.Parameter` is not rewritten (its value, read here,
    could change before the next solve); the constraint keeps its cone form.
    """
    if type(lhs).__name__ not in ("Pnorm", "PnormApprox") or getattr(lhs, "p", None) != 2:
        return None
    if rhs.parameters():
        return None
    if getattr(lhs, "axis", None) is not None or not rhs.is_constant() or rhs.size != 1:
        return None
    r = float(np.asarray(rhs.value).reshape(-1)[0])
    if not r > 0:
        return None
    return cp.sum_squares(lhs.args[0]) - r**2
