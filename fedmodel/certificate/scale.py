"""The objective's reference scale ``S``: the certificate's unit of the objective.

The conic and operator-splitting solvers scale the objective before they apply their
tolerances (OSQP multiplies ``P`` and ``q`` by a cost scale ``c = 1 / max(mean_j
||P_j||_inf, ||q||_inf)`` computed once from the data; Clarabel equilibrates likewise), so a
model and the same model times ``t`` get the same verdict. The certificate does the same:
``S`` is computed once, at the starting point ``x0`` of the solve (zeros unless ``w0`` says
otherwise), from the gradient and the curvature of the objective there:

    S_i = max(||g_i(x0)||_inf, mean_j |grad f_i(x0 + delta 1) - grad f_i(x0)|_j / delta)

(``g_i`` the gradient of the objective as the user wrote it, :func:`user_gradient`: a
term in epigraph form, ``|r| / n`` as ``t / n`` with ``-t <= r <= t``, counts by its
subgradient ``sign(r) a / n``, not by the auxiliary's coefficient ``1 / n``)
for each party ``i`` on its own data (``delta = CURVATURE_STEP max(1, ||x0||_inf)``, the
whole of the party's view: shared, own and auxiliary coordinates; the curvature by its mean
over the coordinates, as OSQP's cost scale takes the mean of ``P``'s column norms: one dense
row of ``P`` makes ``||P 1||_inf`` the row's sum, a unit far above the objective's, where a
gap of 4.7e-3 on an objective of size 1 read as 1.3e-4 of ``S = 35``), the same two numbers
for ``h`` (its subgradient scale), and ``S = sum_i S_i`` over the parties and ``h``: one
scalar per party, of which the server needs only the sum (under secure aggregation it
learns nothing else). Every quantity in the objective's units that the
certificate compares with an absolute ``1`` (the floor of the stationarity scale, the
objective size the epigraph gap is relative to, the dual floors of cone constraints and
declared own variables) is compared with ``S`` instead, which is the certificate of the
objective divided by ``S``. ``S`` is a reference independent of the iterate (a floor on
the current objective value would break exact fits, where the optimum is 0), and
multiplying the objective by ``t`` multiplies every ``S_i`` by ``t`` exactly, so the scaled
residuals at a point (multipliers scaled alike) and the verdict do not change.

A model with no objective (``S = 0``) or one not finite at ``x0`` in every party keeps
``S = 1``: the objective's units are the user's.

Examples
--------
>>> reference_scale([2.0, 0.5, 0.0, float("nan")])
2.5
>>> reference_scale([0.0])
1.0
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from fedmodel.certificate.auxiliary import auxiliary_rows, minimize_auxiliaries
from fedmodel.compiler.partition import PartyProgram
from fedmodel.compiler.regularizer import Regularizer

#: the secant step of the curvature, relative to ``max(1, ||x0||_inf)``
CURVATURE_STEP = 1e-3


def _secant_reference(value, x0: np.ndarray) -> float:
    """``max(||v(x0)||_inf, mean_j |v(x0 + delta 1) - v(x0)|_j / delta)`` of a
    vector-valued ``v``."""
    x0 = np.asarray(x0, dtype=float)
    delta = CURVATURE_STEP * max(1.0, float(np.abs(x0).max(initial=0.0)))
    with np.errstate(all="ignore"):
        try:
            g0 = np.atleast_1d(np.asarray(value(x0), dtype=float))
        except (ValueError, FloatingPointError, ZeroDivisionError):
            return 0.0
        if not np.all(np.isfinite(g0)):
            return 0.0
        ref = float(np.abs(g0).max(initial=0.0))
        try:
            g1 = np.atleast_1d(np.asarray(value(x0 + delta), dtype=float))
        except (ValueError, FloatingPointError, ZeroDivisionError):
            return ref
        if np.all(np.isfinite(g1)) and g1.size:
            ref = max(ref, float(np.abs(g1 - g0).mean()) / delta)
    return ref


def user_gradient(program: PartyProgram, x: np.ndarray) -> np.ndarray:
    """The gradient of the party's objective as the user wrote it, at ``x``: its epigraph
    auxiliaries at their partial minimiser (:func:`minimize_auxiliaries`), each one's
    objective coefficient carried over to its variables by the piece that attains it
    (the multiplier ``-c_t / a`` on that row): ``sign(r) a / n`` for a term ``|r| / n``,
    where the epigraph form's own gradient is ``1 / n`` on the auxiliary and 0 elsewhere.
    The auxiliaries' coordinates are 0 then; the others are the objective's gradient.

    Examples
    --------
    >>> import cvxpy as cp, numpy as np, fedmodel as fm
    >>> m = fm.Model(); w = m.variable(1, name="w")
    >>> c = m.client("a")
    >>> c.minimize(cp.abs(w[0] - 3.0) / 4)
    >>> user_gradient(m.compile().program("a"), np.array([1.0, 0.5])).tolist()  # (w, t)
    [-0.25, 0.0]
    """
    fn = program.functions
    x = np.asarray(x, dtype=float)
    match = auxiliary_rows(program, x)
    x = minimize_auxiliaries(program, x, match)
    grad = np.array(fn.objective_and_grad(x)[1], dtype=float)
    if not match.determined.any():
        return grad
    rows, aux = match.rows, match.aux
    keep = match.determined[aux]
    rows, aux, coef = rows[keep], aux[keep], match.coef[keep]
    values = fn.constraint_values(x)[0][rows]
    # per auxiliary, the piece that attains its bound (the largest row value, ~0)
    order = np.lexsort((values, aux))
    last = np.r_[aux[order][1:] != aux[order][:-1], True]
    active = order[last]
    mu = np.zeros(program.m_ineq)
    mu[rows[active]] = np.maximum(-grad[match.hidden[aux[active]]] / coef[active], 0.0)
    out = fn.lagrangian_terms(x, mu, np.zeros(program.m_eq))[0]
    out[match.hidden[match.determined]] = 0.0
    return out


def objective_reference(program: PartyProgram, x0: np.ndarray) -> float:
    """A party's ``S_i`` at ``x0`` (its view of the starting point), on its own data: the
    largest magnitude of its objective's gradient as the user wrote it
    (:func:`user_gradient`) and the mean magnitude of the gradient's change along ``1``
    per unit step (module docstring); 0 when its objective is not finite at ``x0``."""
    fn = program.functions
    if fn.n == 0:
        return 0.0
    x0 = np.asarray(x0, dtype=float)
    curvature = _secant_reference(lambda x: fn.objective_and_grad(x)[1], x0)
    if curvature == 0.0:  # (not finite at x0, or no objective)
        return 0.0
    with np.errstate(all="ignore"):
        try:
            user = float(np.abs(user_gradient(program, x0)).max(initial=0.0))
        except (ValueError, FloatingPointError, ZeroDivisionError):
            user = 0.0
    return max(curvature, user) if np.isfinite(user) else curvature


def plain_objective_references(value_grad, X: np.ndarray) -> np.ndarray:
    """:func:`objective_reference` of parties whose evaluation is their objective's value
    and gradient alone (:func:`~fedmodel.certificate.kkt.plain_objective_party`: no
    auxiliaries, so the user's gradient is the objective's), at the rows of ``X``, from
    two calls of their batched ``value_grad(X) -> (values, gradients)``: ``S_i = max(
    ||g_i(x_i)||_inf, mean_j |g_i(x_i + delta_i 1) - g_i(x_i)|_j / delta_i)``, 0 where the
    gradient at ``x_i`` is not finite.

    Examples
    --------
    >>> plain_objective_references(lambda Z: ((Z**2).sum(1), 2 * Z), np.array([[0.5, -3.0]]))
    array([6.])
    """
    X = np.asarray(X, dtype=float)
    delta = CURVATURE_STEP * np.maximum(1.0, np.abs(X).max(axis=1, initial=0.0))
    with np.errstate(all="ignore"):
        G0 = value_grad(X)[1]
        G1 = value_grad(X + delta[:, None])[1]
    finite0 = np.all(np.isfinite(G0), axis=1)
    both = finite0 & np.all(np.isfinite(G1), axis=1)
    G0 = np.where(finite0[:, None], G0, 0.0)
    change = np.abs(np.where(both[:, None], G1 - G0, 0.0)).mean(axis=1) if X.shape[1] else 0.0
    return np.maximum(np.abs(G0).max(axis=1, initial=0.0), change / delta)


def regularizer_reference(regularizer: Regularizer, x0: np.ndarray) -> float:
    """``h``'s share of ``S``: its subgradient scale at ``x0`` and that scale's change per
    unit step along ``1`` (``2 sumsq`` for a squared norm)."""
    if regularizer.is_zero:
        return 0.0
    return _secant_reference(lambda x: regularizer.subgradient_scale(x), x0)


def reference_scale(references: Iterable[float]) -> float:
    """``S``: the sum of the parties' finite positive references, 1 when there is none
    (module docstring)."""
    values = np.array(list(references), dtype=float)
    finite = values[np.isfinite(values) & (values > 0.0)].tolist()  # (in order)
    return float(sum(finite)) if finite else 1.0


def pooled_objective_scale(programs: Iterable[PartyProgram], regularizer: Regularizer, x0):
    """``S`` of a pooled model at the stacked point ``x0`` (every party's program over the
    whole layout, as the centralized methods hold them)."""
    refs = [objective_reference(p, x0) for p in programs]
    refs.append(regularizer_reference(regularizer, x0))
    return reference_scale(refs)
