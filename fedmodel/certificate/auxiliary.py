"""The hidden auxiliaries of epigraph forms, at the partial minimiser of the user's model.

The DSL rewrites a piecewise-linear term into an epigraph form (:mod:`fedmodel.dsl.epigraph`):
``pos(1 - y a^T w)`` becomes ``t`` with the pieces ``1 - y a^T w - t <= 0`` and ``-t <= 0``,
``t`` a *hidden* variable owned by the party. DCP guarantees that the rewritten expression is
nondecreasing in every such ``t`` (nonincreasing in a hypograph variable), so at a given
point of the user's variables the smallest feasible ``t``, the largest of its pieces, is
optimal: the user's model at ``w`` *is* the epigraph form at ``(w, t(w))``.

A federated method's party holds the ``t`` of its last exact step at its own point ``x_i``;
evaluated at the shared point ``z != x_i`` its pieces read off by about ``||a_j||_1 ||x_i -
z||`` (svm-20: scaled feasibility 2.8e-3 on a model with no constraint). The certificate
therefore sets each auxiliary it can prove determined by its own pieces to that partial
minimiser first (:func:`minimize_auxiliaries`, called by
:func:`fedmodel.certificate.kkt.party_evaluation`): its residuals are then those of the
user's model at ``w``. Which rows bound which auxiliary is found from evaluations of the
rows (:func:`auxiliary_rows`), the one matching also used by the pooled reference to polish
the auxiliaries' multipliers (:func:`fedmodel.algorithms.centralized.pooled.polish_auxiliary_duals`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedmodel.compiler.partition import PartyProgram

#: the fixed seed of the random probe weights (deterministic matching, bit for bit)
_PROBE_SEED = 20261126


def owned_coordinates(program: PartyProgram) -> tuple[np.ndarray, np.ndarray]:
    """Coordinates (in the program's layout) of the party's hidden auxiliaries (epigraph
    and cone variables the DSL introduced) and of its declared own variables."""
    layout = program.layout
    hidden, declared = [], []
    for v in layout.variables:
        if layout.owners.get(v.id) != program.name:
            continue
        idx = np.arange(layout.size)[layout.slice_of(v)]
        (hidden if v.id in layout.hidden else declared).append(idx)
    join = lambda parts: np.concatenate(parts) if parts else np.zeros(0, dtype=int)  # noqa: E731
    return join(hidden), join(declared)


@dataclass(frozen=True)
class AuxiliaryRows:
    """Which inequality rows of a party bound which of its hidden auxiliaries.

    Attributes
    ----------
    hidden : numpy.ndarray
        Coordinates (in the program's layout) of the party's hidden auxiliaries.
    rows : numpy.ndarray
        Indices of the stacked inequality rows that are affine in exactly one auxiliary.
    aux : numpy.ndarray
        For each of ``rows``, the position in ``hidden`` of its auxiliary.
    coef : numpy.ndarray
        For each of ``rows``, its coefficient on that auxiliary (``-1`` for an epigraph
        piece ``p(w) - t``, ``+1`` for a hypograph piece ``t - p(w)``).
    determined : numpy.ndarray
        Per auxiliary (bool): bounded by rows of ``rows`` of one sign only and by no other
        row, equality or cone constraint, so the bound its rows give is its partial
        minimiser.
    """

    hidden: np.ndarray
    rows: np.ndarray
    aux: np.ndarray
    coef: np.ndarray
    determined: np.ndarray


def auxiliary_rows(program: PartyProgram, x: np.ndarray) -> AuxiliaryRows:
    """Match ``program``'s inequality rows to the hidden auxiliaries they bound, at ``x``.

    Evaluations of the rows with the auxiliaries moved by ones, by their labels ``1..H``,
    by twice the labels and by random weights in ``[1, 2]`` find the rows affine in exactly
    one auxiliary: the change under ones is the row's coefficient ``a``, the change under
    the labels ``a k`` names the auxiliary ``k``, twice the labels must give twice that
    (affine) and the random weights ``a w_k`` (one auxiliary: a row ``t_1 + t_3`` passes
    the labels' test, ``k = 2``, and fails this one). One vector-Jacobian product of every
    other row touching an auxiliary, of the equalities and of the cone constraints, with
    random weights, finds the auxiliaries those touch, which are then not ``determined``.

    Parameters
    ----------
    program : PartyProgram
        The party's program (any layout: the pooled one or the party's own view).
    x : numpy.ndarray
        A point of that layout.

    Returns
    -------
    AuxiliaryRows

    Examples
    --------
    >>> import cvxpy as cp, numpy as np, fedmodel as fm
    >>> m = fm.Model(); w = m.variable(2, name="w")
    >>> c = m.client("a")
    >>> c.minimize(cp.sum(cp.pos(1 - np.array([[1.0, 2.0], [3.0, -1.0]]) @ w)))
    >>> p = m.compile().program("a")
    >>> match = auxiliary_rows(p, np.zeros(p.layout.size))
    >>> match.coef.tolist(), bool(match.determined.all())
    ([-1.0, -1.0, -1.0, -1.0], True)
    """
    fn = program.functions
    x = np.asarray(x, dtype=float)
    key = x.tobytes()
    cached = fn.__dict__.get("_auxiliary_rows")  # (the last point's: the pooled reference
    if cached is not None and cached[0] == key:  # polishes, then certifies, at one x)
        return cached[1]
    match = _auxiliary_rows(program, x)
    fn.__dict__["_auxiliary_rows"] = (key, match)
    return match


def _auxiliary_rows(program: PartyProgram, x: np.ndarray) -> AuxiliaryRows:
    hidden = owned_coordinates(program)[0]
    none = np.zeros(0, dtype=int)
    empty = AuxiliaryRows(hidden, none, none, np.zeros(0), np.zeros(hidden.size, dtype=bool))
    fn = program.functions
    if not hidden.size or not fn.m_ineq:
        return empty
    x = np.asarray(x, dtype=float)
    rng = np.random.default_rng(_PROBE_SEED)
    label = np.arange(1.0, hidden.size + 1)
    weights = rng.uniform(1.0, 2.0, hidden.size)

    def change(v: np.ndarray) -> np.ndarray:
        probe = np.array(x)
        probe[hidden] += v
        return fn.constraint_values(probe)[0] - c0

    with np.errstate(all="ignore"):
        c0 = fn.constraint_values(x)[0]
        a, b = change(np.ones(hidden.size)), change(label)
        b2, r = change(2 * label), change(weights)
        k = b / a
    touched = (a != 0) | (b != 0) | (r != 0) | ~np.isfinite(b) | ~np.isfinite(r)
    single = touched & (a != 0) & np.isfinite(k) & np.isfinite(b2) & np.isfinite(r)
    single &= np.isclose(k, np.rint(k), rtol=0.0, atol=1e-6) & (k >= 0.5) & (k <= hidden.size + 0.5)
    k = np.where(single, np.rint(k), 1).astype(int) - 1
    single &= np.isclose(b2, 2 * b, rtol=1e-9, atol=0.0)
    single &= np.isclose(r, a * weights[k], rtol=1e-9, atol=0.0)
    rows = np.flatnonzero(single)
    aux, coef = k[rows], a[rows]
    # auxiliaries bounded by rows of one sign only and touched by no other row or cone
    lower = np.bincount(aux, weights=(coef < 0), minlength=hidden.size) > 0
    upper = np.bincount(aux, weights=(coef > 0), minlength=hidden.size) > 0
    determined = lower ^ upper
    others = touched & ~single
    with np.errstate(all="ignore"):
        reach = np.zeros(x.size)
        if others.any():
            y = np.where(others, rng.uniform(1.0, 2.0, others.size), 0.0)
            reach += np.abs(fn.c.vjp(x, y)[1])
        if fn.m_eq:
            reach += np.abs(fn.a.vjp(x, rng.uniform(1.0, 2.0, fn.m_eq))[1])
        if fn.m_cone:
            reach += np.abs(fn.k.vjp(x, rng.uniform(1.0, 2.0, fn.m_cone))[1])
    determined &= np.isfinite(reach[hidden]) & (reach[hidden] == 0)
    return AuxiliaryRows(hidden, rows, aux, coef, determined)


def minimize_auxiliaries(
    program: PartyProgram, x: np.ndarray, match: AuxiliaryRows | None = None
) -> np.ndarray:
    """``x`` with each determined hidden auxiliary at its partial minimiser.

    An epigraph auxiliary ``t`` bounded below by its rows ``c_j(x) + a_j (t' - t) <= 0``
    (``a_j < 0``) is set to ``max_j (t - c_j(x) / a_j)``, the largest of its pieces (a
    hypograph one, bounded above, to the smallest); the others and every other coordinate
    keep their values. An auxiliary whose objective derivative at the new point points the
    wrong way (decreasing the objective as ``t`` grows above its bound, which DCP rules
    out) keeps its value. On a convex model the result is the point of the epigraph form
    that *is* the user's model at ``x``'s user variables (module docstring), so the
    certificate measured there is the user's model's.

    Parameters
    ----------
    program : PartyProgram
        The party's program.
    x : numpy.ndarray
        A point of its layout.
    match : AuxiliaryRows, optional
        The rows' matching (:func:`auxiliary_rows`), computed at ``x`` when None.

    Returns
    -------
    numpy.ndarray
        A new vector (``x`` itself when nothing is determined).

    Examples
    --------
    >>> import cvxpy as cp, numpy as np, fedmodel as fm
    >>> m = fm.Model(); w = m.variable(1, name="w")
    >>> c = m.client("a")
    >>> c.minimize(cp.abs(w[0] - 3.0))
    >>> p = m.compile().program("a")
    >>> minimize_auxiliaries(p, np.array([1.0, 0.5])).tolist()  # (w, t): t = |1 - 3|
    [1.0, 2.0]
    """
    x = np.asarray(x, dtype=float)
    match = auxiliary_rows(program, x) if match is None else match
    if not match.determined.any():
        return x
    hidden, aux, coef = match.hidden, match.aux, match.coef
    with np.errstate(all="ignore"):
        c = program.functions.constraint_values(x)[0][match.rows]
        bound = x[hidden][aux] - c / coef
    lower = np.full(hidden.size, -np.inf)
    upper = np.full(hidden.size, np.inf)
    np.maximum.at(lower, aux[coef < 0], bound[coef < 0])
    np.minimum.at(upper, aux[coef > 0], bound[coef > 0])
    value = np.where(np.isfinite(lower), lower, upper)
    take = match.determined & np.isfinite(value)
    if not take.any():
        return x
    out = np.array(x)
    out[hidden[take]] = value[take]
    with np.errstate(all="ignore"):
        grad = program.functions.objective_and_grad(out)[1][hidden]
    # the objective must not fall as a lower-bounded auxiliary rises (nor as an upper one
    # falls): DCP's guarantee, checked, so that the bound is the partial minimiser
    wrong = take & (np.where(np.isfinite(lower), grad < 0, grad > 0) | ~np.isfinite(grad))
    if wrong.any():
        out[hidden[wrong]] = x[hidden[wrong]]
    return out


def epigraph_pieces(program: PartyProgram, match: AuxiliaryRows) -> np.ndarray:
    """The inequality rows (stacked indices) that are pieces of an objective term's
    epigraph form bounding a ``determined`` auxiliary.

    At :func:`minimize_auxiliaries`' point these hold (``c_j <= 0``) and the largest piece
    of each auxiliary is tight, so with multipliers ``mu >= 0`` the epigraph Lagrangian
    falls short of the user's objective by exactly ``sum_j mu_j |c_j|`` over them: the
    certificate measures their complementarity as that gap (relative to the objective),
    the ``eps``-subdifferential of the user's term, instead of piece by piece (a
    multiplier on a piece a hair below its kink at the evaluated point is a correct
    subgradient of the user's model to within ``mu_j |c_j|``)."""
    if not match.rows.size:
        return np.zeros(0, dtype=int)
    internal = program.functions.internal_masks[0]
    keep = match.determined[match.aux] & internal[match.rows]
    return match.rows[keep]


def balance_piece_multipliers(
    program: PartyProgram,
    x: np.ndarray,
    mu: np.ndarray,
    match: AuxiliaryRows,
    max_change: float,
) -> np.ndarray | None:
    """The inequality multipliers with each auxiliary's stationarity made exact.

    An epigraph auxiliary ``t`` enters only its own affine rows ``piece_k(w) - t <= 0``
    (and the objective, coefficient ``c``, e.g. ``1/N``), so its stationarity reads ``c -
    sum_k lambda_k``; scaling its rows' multipliers by ``c / sum_k lambda_k`` makes it 0
    and moves the shared variables' stationarity by the same relative amount. An
    interior-point point leaves ``1e-6``-``1e-5`` (Clarabel, pooled); a federated party's
    exact step at its own point ``x_i`` leaves its proximal term ``sigma (t_i - c_t)``
    (svm-20: ``2e-3`` relative). Factors further than ``max_change`` from 1 are not
    applied. ``x`` is the point the certificate evaluates (:func:`minimize_auxiliaries`'),
    ``match`` its :func:`auxiliary_rows`. None when nothing changed.

    Examples
    --------
    >>> import cvxpy as cp, numpy as np, fedmodel as fm
    >>> m = fm.Model(); w = m.variable(1, name="w")
    >>> c = m.client("a")
    >>> c.minimize(cp.abs(w[0] - 3.0) / 4)  # coefficient 1/4 on the auxiliary
    >>> p = m.compile().program("a")
    >>> x = np.array([1.0, 2.0])  # (w, t = |1 - 3|): the piece 3 - w - t is tight
    >>> match = auxiliary_rows(p, x)
    >>> balance_piece_multipliers(p, x, np.array([0.0, 0.2505]), match, 0.01).round(6).tolist()
    [0.0, 0.25]
    """
    if not match.rows.size or not mu.size:
        return None
    active = mu[match.rows] > 0
    rows, aux, coef = match.rows[active], match.aux[active], match.coef[active]
    if not rows.size:
        return None
    with np.errstate(all="ignore"):
        g = program.functions.objective_and_grad(x)[1][match.hidden]
        total = np.bincount(aux, weights=coef * mu[rows], minlength=match.hidden.size)
        factor = np.where(total != 0, -g / total, 1.0)
    factor = np.where(np.abs(factor - 1) <= max_change, factor, 1.0)
    new = np.array(mu, dtype=float)
    new[rows] = mu[rows] * factor[aux]
    return new if np.any(new != mu) else None
