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


def _rewrite(e, sign: int, make_aux: AuxFactory, pieces: list) -> cp.Expression:
    if not e.args:
        return e
    name = type(e).__name__
    axis = getattr(e, "axis", None)
    # a convex piecewise-linear atom where the expression is nondecreasing in it
    if sign > 0 and e.is_convex() and not e.is_affine():
        if name == "maximum":
            args = [_rewrite(a, +1, make_aux, pieces) for a in e.args]
            t = make_aux(e.shape, "max")
            pieces.extend(_flat(a - t) for a in args)
            return t
        if name == "abs":
            (a,) = [_rewrite(a, 0, make_aux, pieces) for a in e.args]
            t = make_aux(e.shape, "abs")
            pieces.extend([_flat(a - t), _flat(-a - t)])
            return t
        if name == "max" and axis is None:
            (a,) = [_rewrite(a, +1, make_aux, pieces) for a in e.args]
            t = make_aux((), "max")
            pieces.append(_flat(a - t))
            return t
        if name == "norm1" and axis is None:
            (a,) = [_rewrite(a, 0, make_aux, pieces) for a in e.args]
            t = make_aux(a.shape, "abs")
            pieces.extend([_flat(a - t), _flat(-a - t)])
            return cp.sum(t)
        if name == "norm_inf" and axis is None:
            (a,) = [_rewrite(a, 0, make_aux, pieces) for a in e.args]
            t = make_aux((), "max")
            pieces.extend([_flat(a - t), _flat(-a - t)])
            return t
        if name == "sum_largest":
            # sum of the k largest entries = min_s k s + sum(pos(x - s))
            (a,) = [_rewrite(a, +1, make_aux, pieces) for a in e.args]
            s = make_aux((), "level")
            u = make_aux(a.shape, "excess")
            pieces.extend([_flat(a - s - u), _flat(-u)])
            return float(e.k) * s + cp.sum(u)
    # a concave piecewise-linear atom where the expression is nonincreasing in it
    if sign < 0 and e.is_concave() and not e.is_affine():
        if name == "minimum":
            args = [_rewrite(a, -1, make_aux, pieces) for a in e.args]
            t = make_aux(e.shape, "min")
            pieces.extend(_flat(t - a) for a in args)
            return t
        if name == "min" and axis is None:
            (a,) = [_rewrite(a, -1, make_aux, pieces) for a in e.args]
            t = make_aux((), "min")
            pieces.append(_flat(t - a))
            return t
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
