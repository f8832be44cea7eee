"""Fairness expressions for the DSL: the loss-based DEO of seed 002 (Definition 1, eq. 3).

``deo(scores, y, group)`` is ``lhat^a - lhat^b``, the mean logistic loss over the
positive-label samples of group ``a`` minus the same over group ``b``: one cvxpy
expression ``sum_i a_i log(1 + exp(-y_i z_i))`` with ``a_i = 1/|N^a|`` on ``N^a``,
``-1/|N^b|`` on ``N^b`` and 0 elsewhere. It is smooth and (with weights of both signs)
not convex, so a constraint on it needs ``allow_nonconvex=True``:

    model.server.subject_to(cp.abs(fm.deo(scores, y, s)) <= eps, allow_nonconvex=True)

(``abs(D) <= eps`` is split into ``D - eps <= 0`` and ``-D - eps <= 0``, eqs. 4a-4b.)

Examples
--------
>>> import numpy as np, cvxpy as cp, fedmodel as fm
>>> z = cp.Variable(4)
>>> d = fm.deo(z, np.array([1, 1, 1, -1]), np.array([1, 0, 0, 1]))
>>> z.value = np.zeros(4); round(float(d.value), 12)
0.0
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import cvxpy as cp
import numpy as np

from fedmodel.errors import ModelError


@dataclass(frozen=True)
class DEOInfo:
    """What :func:`deo` was built from (read by the vertical recogniser)."""

    scores: cp.Expression
    y: np.ndarray  # +-1
    group_a: np.ndarray  # bool
    weights: np.ndarray


def _values(a: Any) -> np.ndarray:
    if isinstance(a, cp.Expression):
        if a.variables() or a.value is None:
            raise ModelError("deo(): labels and groups must be data (constants), not variables")
        return np.asarray(a.value, dtype=float).ravel()
    return np.asarray(a, dtype=float).ravel()


def deo(scores: cp.Expression, y: Any, group: Any) -> cp.Expression:
    """Loss-based difference of equal opportunity ``lhat^a - lhat^b`` (seed 002, eq. 3).

    Parameters
    ----------
    scores : cvxpy expression, shape (n,)
        The model's scores ``z`` (in a vertical model, the sum of the published partial
        scores).
    y : array or data handle, shape (n,)
        Labels in {-1, +1}; ``N^s`` holds the samples of group ``s`` labelled +1.
    group : array or data handle, shape (n,)
        Truthy for group ``a``, falsy for group ``b``.

    Returns
    -------
    cvxpy.Expression
        The scalar ``sum_i a_i log(1 + exp(-y_i z_i))`` (signed; DEO is its absolute value).
    """
    if not isinstance(scores, cp.Expression):
        scores = cp.Constant(np.asarray(scores, dtype=float))
    yv, gv = _values(y), _values(group)
    n = scores.size
    if yv.size != n or gv.size != n:
        raise ModelError(f"deo(): scores have {n} entries, labels {yv.size}, groups {gv.size}")
    if not np.all(np.isin(yv, (-1.0, 1.0))):
        raise ModelError("deo(): labels must be -1/+1 (the loss is log(1 + exp(-y z)))")
    group_a = gv != 0
    in_a, in_b = (yv > 0) & group_a, (yv > 0) & ~group_a
    if not in_a.any() or not in_b.any():
        raise ModelError(
            "deo(): both groups need positive-label samples (N^a and N^b of Definition 1 "
            "must be non-empty)"
        )
    weights = np.zeros(n)
    weights[in_a] = 1.0 / in_a.sum()
    weights[in_b] = -1.0 / in_b.sum()
    labels = y if isinstance(y, cp.Expression) else yv
    expr = weights @ cp.logistic(-cp.multiply(labels, cp.vec(scores, order="F")))
    expr._fedmodel_deo = DEOInfo(scores, yv, group_a, weights)
    return expr
