"""KKT residuals of seed 000 Definition 1, recomputed from scratch.

At a point ``(w, mu)`` each party evaluates, on its own data, its share of the gradient of
the Lagrangian ``grad f_i(w) + J_{c_i}(w)^T mu_i`` and its feasibility residual
``dist_inf(c_i(w), N_{R_+}(mu_i))``; the server adds its own share and ``dh(w)``:

    stationarity = dist_inf(0, sum_i grad f_i(w) + dh(w) + sum_i J_{c_i}(w)^T mu_i)
    feasibility  = max_i dist_inf(c_i(w), N_{R_+^{m_i}}(mu_i))

A party-owned variable (``party.variable``, or an epigraph auxiliary of a non-smooth
term) appears only in its owner's terms, so the owner alone reports the stationarity of
that block (``owned_stationarity``); federated methods send only the shared part of ``w``.

Equality constraints ``a_i(w) = 0`` have free multipliers and contribute ``|a_i(w)|``.
Cone constraints ``E_i(w, s_i) in K`` (terms with no smooth form, lifted to cone form by
:mod:`fedmodel.dsl.conic`) contribute ``-J_E^T lambda_i`` to stationarity and
``max(dist(E, K), dist(lambda, K^*), |<lambda, E>|)`` to feasibility, with the conic
multipliers ``lambda_i`` the party took from its last exact (cvxpy) subproblem solve
(:mod:`fedmodel.compiler.cones`).
Nothing here reuses an algorithm's stopping quantities.

**The verdict is on the user's scale**. Both residuals are also measured relative
to the size of the terms they sum, the way OSQP, SCS and Clarabel scale theirs (OSQP:
``||P x + q + A^T y||_inf <= eps_abs + eps_rel max(||P x||_inf, ||A^T y||_inf, ||q||_inf)``),
and status ``"optimal"`` at ``eps`` means the *scaled* residuals are at most ``eps``
(:attr:`KKTResiduals.scaled_stationarity`, :attr:`KKTResiduals.scaled_feasibility`; the
absolute ones stay reported):

* shared and declared variables: ``dist_inf(0, sum of terms) / max(floor, ||grad
  f_i||_inf, ||J_j^T mu_j||_inf, ..., |dh|)``, the max over every party's objective
  gradient and every constraint block's term (one vector-Jacobian product per block,
  computed by each party on its own data and sent with its gradient in the evaluation
  round), ``floor = min(1, 10 max(1, F) / max(1, ||x||_1))`` with ``F = sum_i |f_i(x)| +
  |h(x)|`` over the shared variables ``x``: the residual times ``||x - x*||_1`` is what
  bounds the gap, so at ``||x||_1 = 295`` (sparse logistic, d = 3000) the absolute test
  is 30 times stricter than at ``||x||_1 <= 10``;
* the auxiliaries of epigraph and cone forms (one per row of a hinge, abs or pinball loss
  and per cone term), per coordinate: ``|r_i| / max(terms_i, c)`` with ``c`` the median of
  the objective's coefficients on the party's auxiliaries. For a loss averaged over ``N``
  rows the coefficient is ``1/N`` and the residual ``1/N - sum_j lambda_j`` is the relative
  error of the subgradient the multipliers certify; an absolute test would pass any
  multipliers once ``1/N <= eps`` (German credit hinge SVM: certified at 6.9% above the
  optimum);
* feasibility: each constraint's residual over its own scale (:func:`constraint_scale`):
  ``max(|c_j(0)|, |c_j(x) - c_j(0)|)`` when it has a constant side (for ``a^T x - b``:
  ``max(|b|, |a^T x|)``; a budget ``quad_form(w, S) <= 0.002`` is measured relative to
  0.002, with no absolute floor), ``max(1, |c_j(x)|)`` when it is homogeneous
  (``c_j(0) = 0``, e.g. ``sum(w) == 0``: its value is its residual, so the test is
  absolute); a cone's distance over ``||E||_inf`` likewise (``max(1, ||E||_inf)`` when
  ``E(0) = 0``), its dual distance over ``max(1, ||lambda||_inf)`` and its
  complementarity over ``max(1, ||lambda||_2 ||E||_2)``. The pieces of an objective
  term's epigraph or cone form (no constraint of the user's; ``norm(w - 1)`` has
  ``E = (t, w - 1) -> 0`` at ``w = 1``) keep ``max(1, |c_j(0)|, |c_j(x) - c_j(0)|)``.

**The objective's unit** (:mod:`fedmodel.certificate.scale`). Every ``1`` above that is in
the objective's units (the ``1`` of ``min(1, ...)`` and ``max(1, F)`` in the stationarity
floor, of ``max(1, F)`` for the complementarity gap, of the declared own variables' and the cone
multipliers' floors) is the objective's reference scale ``S``, computed once at the
starting point from the parties' gradients and curvature there (``assemble`` and
``party_evaluation`` take it as ``objective_scale``): the certificate is that of the
objective divided by ``S``, as OSQP scales its cost by ``c`` and Clarabel equilibrates
before applying their tolerances, and multiplying the objective by ``t`` multiplies ``S``
by ``t``, so the verdict at a point does not change (``tests/test_objective_scale.py``).

**Epigraph auxiliaries at the user's model** (:mod:`fedmodel.certificate.auxiliary`). Each
party first sets every hidden epigraph auxiliary bounded only by its own pieces to their
largest value at the evaluated point (the partial minimiser: DCP makes the rewritten term
nondecreasing in it), so the residuals are those of the model as written at the user's
variables, wherever the method left its auxiliaries (a federated party's own exact step at
``x_i != z``: svm-20 read a scaled feasibility of 2.8e-3 on a model with no constraint).
The complementarity of those pieces is then measured as the gap it leaves: with ``mu >= 0``
the epigraph Lagrangian falls short of the user's objective by ``sum_j mu_j |c_j|`` over
them and ``f(w') >= L(w', mu)`` for every ``w'``, so the multipliers give a ``(sum_j mu_j
|c_j|)``-subgradient; it counts in the feasibility relative to ``max(1, sum_i |f_i| +
|h|)`` (``complementarity_gap``), not piece by piece (a multiplier on a hinge row a hair off
its kink at ``z`` is a correct subgradient to within ``mu_j |c_j|``, ``mu_j <= 1/N``). Each
auxiliary's stationarity ``c - sum_k lambda_k`` is made exact by rescaling its pieces'
multipliers (within :data:`BALANCE_MAX_CHANGE`) when that lowers the party's share of the
scaled stationarity by more than it can move the shared block's; the party then reports
the multipliers it used (``mu``), and the federated driver's result reports those.

**Complementarity of the user's constraints as the gap it leaves.** On a convex model
``f(x) - f* <= <r, x - x*> + sum_j mu_j [-c_j(x)]_+ + sum_k |nu_k a_k(x)|`` (``r`` the
stationarity residual; ``L(x*, mu, nu) <= f*``), so besides Definition 1's per-row residual
(``|c_j|`` where ``mu_j > 0``, relative to the row's own scale) each party adds that sum over
its inequality and equality rows to the same ``complementarity_gap`` as its epigraph pieces,
relative to ``max(S, sum_i |f_i| + |h|)``: a row ``x_0 >= -1000`` with slack 0.5 reads
``5e-4`` against its constant, but a multiplier 1 there leaves a gap of 0.5 on an objective
of size 1 (a wrong active set the per-row residual passes at ``eps = 1e-3``).

So scaled residuals of order ``eps`` give a relative objective gap and a relative violation of
order ``eps`` (times the size of ``x - x*`` in the units the terms are measured in). The
verdict is invariant under scaling the objective: the same model with its loss summed or
averaged gets the same scaled residuals at the same point (multipliers scaled alike) once
the averaged terms are at least 1 (``tests/test_certificate_scale.py``).

**Points on the boundary of a term's domain** (``entr``, ``kl_div``, ``log`` at ``w_j = 0``;
max-entropy with moment constraints that force ``w_j = 0``). There the derivative is
unbounded (``d/dw (w log w) = log w + 1 -> -inf``), no finite multipliers exist at the exact
optimum (Slater fails on the face ``w_j = 0``), and the smooth stationarity of a correct
point ``w_j = 1e-13`` reads ``|log w_j|``-sized noise. The certificate then proves
stationarity at a point ``x'`` within ``tau = BOUNDARY_TOL max(1, ||x_shared||_inf)`` of
``x`` instead. Let ``B`` be the shared coordinates with ``0 <= x_j <= tau`` at which some
party's objective is not finite at ``x_j = -tau`` (the domain ends there); each party
reports, besides its terms at ``x``, its Lagrangian gradient and scale at ``x + tau e_B``.
On a convex model (``L(., mu)`` convex, so ``phi(t) = d_j L`` at ``x_j = t`` is
nondecreasing) a coordinate ``j`` of ``B`` is stationary to within ``delta`` at some
``x'_j in [0, x_j + tau]`` iff ``phi(x_j + tau) >= -delta``: if ``phi(0+) <= 0`` the
derivative crosses ``[-delta, delta]`` on the way (continuity), and if ``phi(0+) > 0`` the
normal cone of the domain ``{w_j >= 0}`` at ``x'_j = 0`` absorbs it (the term is ``+inf``
below 0, so that cone belongs to its subdifferential). So ``j`` contributes
``max(0, -phi(x_j + tau))`` over its scale at ``x + tau e_B``, and every other coordinate
the larger of its residuals at ``x`` and at ``x + tau e_B`` (exact when the boundary terms
are separable in ``B``, as ``entr``, ``kl_div`` and ``log`` of a coordinate are). A wrong
point near the boundary (``x_j = 1e-9`` where ``x*_j = 0.01``) has ``phi(x_j + tau) ~
log(tau / 0.01) << 0`` and stays uncertified (``tests/test_certificate_scale.py``). The
feasibility is that of ``x`` (``x'`` moves each constraint by at most ``||J||_inf tau``).
Not applied on non-convex models (``phi`` need not be monotone there).

The objective and violation reported (``res.objective``, ``res.max_violation``) are those
of the model as written (:func:`user_model_values`), not of its epigraph or cone form.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import numpy as np

from fedmodel.certificate.auxiliary import (
    auxiliary_rows,
    balance_piece_multipliers,
    epigraph_pieces,
    minimize_auxiliaries,
    owned_coordinates,
)
from fedmodel.compiler.cones import constraint_scale
from fedmodel.compiler.partition import PartyProgram
from fedmodel.compiler.regularizer import Regularizer


def feasibility_residual(ci: np.ndarray, ce: np.ndarray, mu: np.ndarray) -> float:
    """``dist_inf(c, N_{R_+}(mu))`` for inequalities plus ``|a|`` for equalities.

    ``N_{R_+}(mu) = {v <= 0 : v_j = 0 where mu_j > 0}``, so a component contributes
    ``|c_j|`` where ``mu_j > 0`` and ``max(c_j, 0)`` where ``mu_j = 0``.
    """
    r = 0.0
    if ci.size:
        r = float(np.where(mu > 0, np.abs(ci), np.maximum(ci, 0.0)).max())
    if ce.size:
        r = max(r, float(np.abs(ce).max()))
    return r


def complementarity_gap(ci: np.ndarray, ce: np.ndarray, mu: np.ndarray, nu: np.ndarray) -> float:
    """``sum_j mu_j [-c_j]_+ + sum_k |nu_k a_k|``: how far the Lagrangian at ``(mu, nu)``
    can sit below the objective at a feasible point, the term of the gap bound that
    complementarity leaves (module docstring).

    Examples
    --------
    >>> complementarity_gap(np.array([-0.5, 0.0]), np.array([1e-3]), np.ones(2), np.array([2.0]))
    0.502
    """
    gap = 0.0
    if ci.size:
        gap += float(np.abs(mu) @ np.maximum(-ci, 0.0))
    if ce.size:
        gap += float(np.abs(nu) @ np.abs(ce))
    return gap


def max_violation(ci: np.ndarray, ce: np.ndarray) -> float:
    """Largest constraint violation ``max(max_j [c_j]_+, max_j |a_j|)``."""
    v = 0.0
    if ci.size:
        v = max(v, float(np.maximum(ci, 0.0).max()))
    if ce.size:
        v = max(v, float(np.abs(ce).max()))
    return v


def scaled_feasibility_residual(
    ci: np.ndarray,
    ce: np.ndarray,
    mu: np.ndarray,
    ci0: np.ndarray,
    ce0: np.ndarray,
    internal: tuple[np.ndarray, np.ndarray] | None = None,
) -> float:
    """:func:`feasibility_residual` with each component relative to its constraint's scale
    (:func:`constraint_scale`: for ``a^T x - b`` with ``b != 0``, ``max(|b|, |a^T x|)``, the
    terms of the constraint, as OSQP scales its primal residual); ``internal`` marks the
    pieces of objective terms' epigraph forms, measured with an absolute floor."""
    abs_i, abs_e = internal if internal is not None else (None, None)
    r = 0.0
    if ci.size:
        res = np.where(mu > 0, np.abs(ci), np.maximum(ci, 0.0))
        r = float((res / constraint_scale(ci, ci0, abs_i)).max())
    if ce.size:
        r = max(r, float((np.abs(ce) / constraint_scale(ce, ce0, abs_e)).max()))
    return r


def owned_scaled_stationarity(
    grad: np.ndarray,
    scale: np.ndarray,
    grad_f: np.ndarray,
    hidden,
    declared,
    reference: float = 1.0,
) -> float:
    """Scaled stationarity of a party's own coordinates (see the module docstring).

    Declared own variables: ``||r||_inf / max(S, ||terms||_inf)`` like the shared block
    (``S = reference``, the objective's reference scale).
    Hidden auxiliaries (one per epigraph row or cone term): per coordinate, relative to
    its own terms, ``|r_i| / max(terms_i, c)``, with ``c`` the largest magnitude of the
    objective's coefficients on the party's auxiliaries (1 when they carry none; not the
    median: a smooth term of auxiliaries, e.g. ``square(pos(r))``, has coefficients ``~0``
    on its inactive rows, which made ``2e-9 / 2e-9 = 1`` out of an exact point): an
    epigraph variable ``t_j`` of a loss averaged over ``N`` rows has coefficient ``1/N``
    and its residual ``1/N - sum lambda`` is measured relative to ``1/N``, i.e. as the
    relative error of the subgradient it certifies."""
    worst = 0.0
    if declared.size:
        denom = max(reference, float(scale[declared].max()))
        worst = float(np.abs(grad[declared]).max()) / denom
    if hidden.size:
        coef = np.abs(grad_f[hidden])
        coef = coef[coef > 0]
        floor = float(coef.max()) if coef.size else 1.0
        worst = max(worst, float((np.abs(grad[hidden]) / np.maximum(scale[hidden], floor)).max()))
    return worst


def _rewritten(program: PartyProgram) -> bool:
    """Whether a term of ``program`` was rewritten by the compiler (an objective term's
    epigraph or cone form, a constraint's pieces)."""
    for t in program.objective:
        if t.source is not None:
            return True
    for c in program.constraints:
        if c.origin is not None or c.internal:
            return True
    return False


def user_model_values(program: PartyProgram, x: np.ndarray) -> tuple[float, float] | None:
    """``(objective, violation)`` of the party's terms *as the user wrote them* at ``x``, or
    None when none was rewritten (then the compiled values are the user's).

    Epigraph and cone forms (``dsl/epigraph.py``, ``dsl/conic.py``) are exact at a
    minimiser, but at a returned point their auxiliaries may sit above the atoms they
    bound (LAD: ``sum t`` 0.6072 against ``f(w)`` 0.5867) and their pieces may be violated
    on a model with no constraint. So the objective is each written term evaluated at the
    user's variables, and the violation that of each constraint the user wrote (cvxpy's
    ``violation()``), leaving out the pieces of objective terms."""
    if not _rewritten(program):
        return None
    layout = program.layout
    values = layout.unstack(x)
    user = [v for v in layout.variables if v.id not in layout.hidden]
    saved = [v.value for v in user]
    try:
        for v in user:
            v.save_value(np.asarray(values[v], dtype=float).reshape(v.shape))
        objective = 0.0
        for t in program.objective:
            value = (t.source if t.source is not None else t.expr).value
            objective += float(np.sum(value)) if value is not None else float("nan")
        violation, seen = 0.0, set()
        for c in program.constraints:
            if c.internal:
                continue
            con = c.origin if c.origin is not None else c.source
            if id(con) in seen:
                continue
            seen.add(id(con))
            if con is None:  # a constraint term built without its cvxpy constraint
                g = np.asarray(c.expr.value, dtype=float)
                r = np.abs(g) if c.kind == "eq" else np.maximum(g, 0.0)
            else:
                r = np.asarray(con.violation(), dtype=float)
            violation = max(violation, float(np.max(r, initial=0.0)))
    finally:
        for v, old in zip(user, saved):
            v.save_value(old)
    return objective, violation


#: the largest relative change :func:`party_evaluation` makes to an epigraph piece's
#: multiplier to make its auxiliary's stationarity exact (a federated party's step at
#: its own point leaves its proximal term there: svm-20 2e-3 relative)
BALANCE_MAX_CHANGE = 0.1

#: the boundary relief's distance, relative to ``max(1, ||x_shared||_inf)`` (module
#: docstring): a certified point is within this of one whose residuals are as reported
BOUNDARY_TOL = 1e-8
#: at most this many coordinates are tested for a domain boundary (one objective
#: evaluation each); beyond it no relief (conservative: never certifies more)
BOUNDARY_MAX_COORDS = 256


def boundary_tau(x_shared: np.ndarray):
    """The boundary relief's distance ``BOUNDARY_TOL max(1, ||x_shared||_inf)`` (of each
    row, for a stack of points)."""
    return BOUNDARY_TOL * np.maximum(1.0, np.abs(x_shared).max(axis=-1, initial=0.0))


def _boundary_report(program, x, mu, nu, cone, ns) -> dict:
    """A party's share of the boundary relief (module docstring): which shared coordinates
    near 0 end its objective's domain, and its Lagrangian terms at ``x + tau e_B``."""
    xs = np.asarray(x[:ns], dtype=float)
    if not np.all(np.isfinite(xs)):
        return {}
    tau = boundary_tau(xs)
    near = np.flatnonzero((xs >= 0.0) & (xs <= tau))
    if near.size == 0 or near.size > BOUNDARY_MAX_COORDS:
        return {}
    fn = program.functions

    def ends_domain(coords) -> bool:
        probe = np.array(x, dtype=float)
        probe[coords] = -tau
        with np.errstate(all="ignore"):
            try:
                return not np.isfinite(fn.objective(probe))
            except (ValueError, FloatingPointError, ZeroDivisionError):
                return True

    mask = np.zeros(ns)
    if ends_domain(near):  # one evaluation when no coordinate of B ends a domain
        for j in near:
            mask[j] = 1.0 if ends_domain([j]) else 0.0
    plus = np.array(x, dtype=float)
    plus[near] += tau
    grad, scale = fn.lagrangian_terms(plus, mu, nu, cone)
    return {"boundary_grad": grad[:ns], "boundary_scale": scale[:ns], "boundary_mask": mask}


def _domain_violation(program: PartyProgram, x: np.ndarray) -> float:
    """How far ``x`` is outside the domain of the party's objective terms (cvxpy's
    ``domain`` of each term, e.g. ``w >= 0`` for ``entr(w)``, evaluated at the user's
    variables); ``inf`` when no domain constraint measures it."""
    layout = program.layout
    values = layout.unstack(x)
    saved = [v.value for v in layout.variables]
    worst = 0.0
    try:
        for v in layout.variables:
            v.save_value(np.asarray(values[v], dtype=float).reshape(v.shape))
        for t in program.objective:
            expr = t.source if t.source is not None else t.expr
            for con in getattr(expr, "domain", []):
                r = np.asarray(con.violation(), dtype=float)
                worst = max(worst, float(np.max(r, initial=0.0)))
    finally:
        for v, old in zip(layout.variables, saved):
            v.save_value(old)
    return worst if worst > 0 else float("inf")


def _outside_domain_evaluation(program: PartyProgram, x: np.ndarray, shared_only) -> dict:
    """The report at a point where the party's objective is not finite (outside a term's
    domain, e.g. ``kl_div(w, q)`` at ``w_j < 0``, where an infeasible model's iterates go):
    the objective there is ``+inf``, so no stationarity is certified (``owned_scaled =
    owned_stationarity = 1``) and the point counts as infeasible by its distance to the
    domain, instead of a non-finite reply the runtime refuses as a client failure."""
    ns = program.layout.n_shared if shared_only else x.size
    far = _domain_violation(program, x)
    far = far if np.isfinite(far) else 1.0
    ci, ce = program.functions.constraint_values(x)
    ci, ce = np.nan_to_num(ci, nan=far, posinf=far), np.nan_to_num(ce, nan=far, posinf=far)
    zeros = np.zeros(ns)
    return {
        "objective": 0.0,
        "grad": zeros,
        "scale": zeros,
        "owned_stationarity": 1.0,
        "owned_scaled": 1.0,
        "owned_index": np.zeros(0, dtype=int),
        "feasibility": far,
        "feasibility_scaled": far / max(1.0, float(np.abs(x[:ns]).max(initial=0.0))),
        "complementarity_gap": 0.0,
        "violation": max(far, max_violation(ci, ce)),
        "c_ineq": ci,
        "c_eq": ce,
    }


def party_evaluation(
    program: PartyProgram,
    x: np.ndarray,
    mu: np.ndarray,
    nu: np.ndarray,
    shared_only=False,
    cone: np.ndarray | None = None,
    balance_pieces: bool = True,
    objective_scale: float = 1.0,
) -> dict:
    """What one party reports in an evaluation round, computed on its own data only.

    With ``shared_only`` (federated methods on a party's own view ``x = (shared, own)``),
    ``grad`` is the shared part of the Lagrangian gradient and ``owned_stationarity`` the
    infinity norm of its own block's part (its owned variables enter no other party's
    terms and no ``h``, so that block's stationarity is the owner's alone). ``cone`` holds
    the multipliers of the party's cone constraints (zeros when None).

    The party's hidden epigraph auxiliaries are first set to their partial minimiser at
    ``x``'s user variables (:func:`~fedmodel.certificate.auxiliary.minimize_auxiliaries`:
    the point of the user's model), the complementarity of those pieces is reported as
    the gap it leaves (``complementarity_gap``, module docstring, with that of its other
    rows), and with ``balance_pieces``
    the pieces' multipliers are rescaled to make each auxiliary's stationarity exact
    (:func:`~fedmodel.certificate.auxiliary.balance_piece_multipliers`, within
    :data:`BALANCE_MAX_CHANGE`) when that lowers this party's share of the scaled
    stationarity by more than it can move the shared block's; the multipliers then used
    are reported as ``mu`` (the ones the method's result must report).

    ``objective_scale`` is the objective's reference scale ``S``
    (:mod:`fedmodel.certificate.scale`), the unit of the floors of its own variables'
    and its cone multipliers' scaled residuals.
    """
    fn = program.functions
    # the hidden epigraph auxiliaries at their partial minimiser: the user's model at x
    x = np.asarray(x, dtype=float)
    match = auxiliary_rows(program, x)
    x = minimize_auxiliaries(program, x, match)
    with np.errstate(all="ignore"):
        objective_x = fn.objective(x)
    if not np.isfinite(objective_x):
        return _outside_domain_evaluation(program, x, shared_only)
    ci, ce = fn.constraint_values(x)
    grad_f = fn.objective_and_grad(x)[1]  # (at x: computed once, read below)
    hidden, declared = owned_coordinates(program)
    ns = program.layout.n_shared

    def terms(m):
        grad, scale = fn.lagrangian_terms(x, m, nu, cone, grad_f=grad_f)
        owned = owned_scaled_stationarity(grad, scale, grad_f, hidden, declared, objective_scale)
        return grad, scale, owned

    grad, scale, owned_scaled = terms(mu)
    balanced = None
    if balance_pieces and owned_scaled > 0:
        balanced = balance_piece_multipliers(program, x, mu, match, BALANCE_MAX_CHANGE)
    if balanced is not None:
        grad_b, scale_b, owned_b = terms(balanced)
        # what the rescaling can add to the shared block's scaled stationarity: its change
        # over this party's own scale there (the certificate's scale is at least that)
        denom = min(float(scale[:ns].max(initial=0.0)), float(scale_b[:ns].max(initial=0.0)))
        moved = float(np.abs(grad_b[:ns] - grad[:ns]).max(initial=0.0))
        cost = moved / denom if denom > 0 else (0.0 if moved == 0 else float("inf"))
        if max(owned_b, cost) < owned_scaled:
            mu, grad, scale, owned_scaled = balanced, grad_b, scale_b, owned_b
        else:
            balanced = None
    # complementarity as the gap it leaves (module docstring): over every row, and on the
    # pieces of objective terms (at their partial minimiser) instead of per piece
    pieces = epigraph_pieces(program, match)
    gap = complementarity_gap(ci, ce, mu, nu)
    mu_pieces = mu
    if pieces.size:
        mu_pieces = np.array(mu, dtype=float)
        mu_pieces[pieces] = 0.0
    cone_feas, cone_viol, cone_scaled = fn.cone_residuals(
        x, cone, scaled=True, reference=objective_scale
    )
    owned = 0.0
    owned_index = np.concatenate([hidden, declared]).astype(int)
    if shared_only:
        owned = float(np.abs(grad[ns:]).max(initial=0.0))
        grad, scale = grad[:ns], scale[:ns]
        owned_index = np.zeros(0, dtype=int)
    ns = program.layout.n_shared if shared_only else x.size
    boundary = _boundary_report(program, x, mu, nu, cone, ns)
    ci0, ce0 = fn.constant_parts
    objective, violation = objective_x, max(max_violation(ci, ce), cone_viol)
    on_user_model = user_model_values(program, x)
    if on_user_model is not None:
        objective, violation = on_user_model
    out = {
        "objective": objective,
        "grad": grad,
        "scale": scale,
        "owned_stationarity": owned,
        "owned_scaled": owned_scaled,
        "owned_index": owned_index,
        "feasibility": max(feasibility_residual(ci, ce, mu_pieces), cone_feas),
        "feasibility_scaled": max(
            scaled_feasibility_residual(ci, ce, mu_pieces, ci0, ce0, fn.internal_masks[:2]),
            cone_scaled,
        ),
        "complementarity_gap": gap,
        "violation": violation,
        "c_ineq": ci,
        "c_eq": ce,
        **boundary,
    }
    if balanced is not None:
        out["mu"] = balanced
    return out


def plain_objective_party(program: PartyProgram) -> bool:
    """Whether :func:`party_evaluation` of ``program`` is its objective's value and gradient
    alone: no constraints, cones, own variables or auxiliaries, no term rewritten and
    none with a restricted domain (so no coordinate ends its domain). Such parties'
    evaluations can be computed many at once (:func:`plain_objective_evaluations`)."""
    layout = program.layout
    return not (
        program.m_ineq
        or program.m_eq
        or program.m_cone
        or layout.size > layout.n_shared
        or _rewritten(program)
        or program.restricted_domain
    )


def plain_objective_evaluations(value_grad, X: np.ndarray) -> list[dict]:
    """:func:`party_evaluation` of parties with :func:`plain_objective_party` at the rows
    of ``X``, from the batched ``value_grad(X) -> (values, gradients)`` of their
    objectives (row ``i`` is party ``i``'s point and objective): the same fields, with
    the boundary relief's terms at ``x + tau e_B`` from one more batched gradient
    (:func:`plain_objective_rows`, split into one report per party).

    Raises FloatingPointError when a value or gradient is not finite (each party is then
    evaluated on its own, which reports such points).

    Examples
    --------
    >>> X = np.array([[1.0, 2.0], [0.5, -1.0]])
    >>> reports = plain_objective_evaluations(lambda Z: ((Z**2).sum(1), 2 * Z), X)
    >>> reports[1]["objective"], reports[1]["grad"]
    (1.25, array([ 1., -2.]))
    """
    fields, relief = plain_objective_rows(value_grad, X)
    values, G, scale = fields["objective"], fields["grad"], fields["scale"]
    no_rows, no_index = np.zeros(0), np.zeros(0, dtype=int)
    reports = []
    for i in range(G.shape[0]):
        report = {
            "objective": float(values[i]),
            "grad": G[i],
            "scale": scale[i],
            "owned_stationarity": 0.0,
            "owned_scaled": 0.0,
            "owned_index": no_index,
            "feasibility": 0.0,
            "feasibility_scaled": 0.0,
            "complementarity_gap": 0.0,
            "violation": 0.0,
            "c_ineq": no_rows,
            "c_eq": no_rows,
        }
        if relief[i]:
            report["boundary_grad"] = fields["boundary_grad"][i]
            report["boundary_scale"] = fields["boundary_scale"][i]
            report["boundary_mask"] = fields["boundary_mask"][i]
        reports.append(report)
    return reports


def plain_objective_rows(value_grad, X: np.ndarray) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """The reports of :func:`plain_objective_evaluations` as stacked fields (each an array
    with a row per party, in :func:`party_evaluation`'s order), and which parties carry
    the boundary relief's fields (``boundary_grad``, ``boundary_scale``,
    ``boundary_mask``: stacked only when some party does, their rows meaningful only for
    those parties). Raises FloatingPointError as :func:`plain_objective_evaluations`.

    Examples
    --------
    >>> X = np.array([[1.0, 2.0], [0.5, -1.0]])
    >>> fields, relief = plain_objective_rows(lambda Z: ((Z**2).sum(1), 2 * Z), X)
    >>> fields["objective"], fields["c_eq"].shape, relief
    (array([5.  , 1.25]), (2, 0), array([False, False]))
    """
    X = np.asarray(X, dtype=float)
    values, G = value_grad(X)
    if not (np.all(np.isfinite(values)) and np.all(np.isfinite(G))):
        raise FloatingPointError("an objective value or gradient is not finite")
    m, n = X.shape
    tau = boundary_tau(X)
    near = (X >= 0.0) & (X <= tau[:, None])
    count = near.sum(axis=1)
    relief = (count > 0) & (count <= BOUNDARY_MAX_COORDS)
    fields = {
        "objective": np.asarray(values, dtype=float),
        "grad": G,
        "scale": np.abs(G),
        **{k: np.zeros(m) for k in ("owned_stationarity", "owned_scaled")},
        "owned_index": np.zeros((m, 0), dtype=int),
        **{
            k: np.zeros(m)
            for k in ("feasibility", "feasibility_scaled", "complementarity_gap", "violation")
        },
        "c_ineq": np.zeros((m, 0)),
        "c_eq": np.zeros((m, 0)),
    }
    if relief.any():
        G_plus = value_grad(X + tau[:, None] * near)[1]
        fields["boundary_grad"] = G_plus
        fields["boundary_scale"] = np.abs(G_plus)
        fields["boundary_mask"] = np.zeros((m, n))
    return fields, relief


@dataclass
class KKTResiduals:
    """The two residuals of seed 000 Definition 1 (infinity norm).

    Attributes
    ----------
    stationarity : float
        ``dist_inf(0, grad f(w) + dh(w) + grad c(w) mu)``.
    feasibility : float
        ``dist_inf(c(w), N(mu))`` (max over parties; equalities by ``|a(w)|``).
    per_party : dict
        Feasibility residual of each party.
    local : bool
        True when the model has non-convex terms: the point is then certified as an
        approximate KKT (local) point, not as a global optimum.
    """

    stationarity: float
    feasibility: float
    per_party: dict[str, float] = field(default_factory=dict)
    local: bool = False
    scaled_stationarity: float | None = None
    scaled_feasibility: float | None = None

    @property
    def verdict_residuals(self) -> tuple[float, float]:
        """The residuals the verdict uses: the scaled ones when measured, else the absolute
        ones (methods with their own certificate, e.g. ssca and the vertical methods)."""
        stat = self.stationarity if self.scaled_stationarity is None else self.scaled_stationarity
        feas = self.feasibility if self.scaled_feasibility is None else self.scaled_feasibility
        return stat, feas

    def satisfied(self, eps1: float, eps2: float) -> bool:
        """True when the (scaled) residuals meet ``(eps1, eps2)``."""
        stat, feas = self.verdict_residuals
        return bool(stat <= eps1 and feas <= eps2)

    def describe(self) -> str:
        """The residuals in words, for status messages."""
        stat, feas = self.verdict_residuals
        text = f"scaled stationarity {stat:.2e}, scaled feasibility {feas:.2e}"
        if self.scaled_stationarity is None:
            text = f"stationarity {stat:.2e}, feasibility {feas:.2e}"
        else:
            text += (
                f"; absolute stationarity {self.stationarity:.2e}, feasibility "
                f"{self.feasibility:.2e}"
            )
        return text

    def to_dict(self) -> dict:
        return {
            "stationarity": self.stationarity,
            "feasibility": self.feasibility,
            "scaled_stationarity": self.scaled_stationarity,
            "scaled_feasibility": self.scaled_feasibility,
            "per_party": dict(self.per_party),
            "local": self.local,
        }

    def __repr__(self) -> str:
        kind = "local " if self.local else ""
        scaled = ""
        if self.scaled_stationarity is not None:
            scaled = (
                f", scaled_stationarity={self.scaled_stationarity:.3e}, "
                f"scaled_feasibility={self.scaled_feasibility:.3e}"
            )
        return (
            f"KKTResiduals({kind}stationarity={self.stationarity:.3e}, "
            f"feasibility={self.feasibility:.3e}{scaled})"
        )


class StackedReports(Mapping):
    """Evaluation reports of many parties, by name: some as dicts (``own``: the server's),
    the others as stacked fields (``fields``: field -> array with a row per party of
    ``names``, as a stacked round answers them), each such party's report made as a dict
    when it is read. :func:`assemble` reads the stacked fields as they are."""

    def __init__(self, own: Mapping[str, dict], names: list[str], fields: Mapping[str, np.ndarray]):
        self.own, self.names, self.fields = dict(own), list(names), dict(fields)
        self._index = {n: i for i, n in enumerate(self.names)}

    def __getitem__(self, name: str) -> dict:
        if name in self.own:
            return self.own[name]
        i = self._index[name]
        return {k: (v[i].item() if v.ndim == 1 else v[i]) for k, v in self.fields.items()}

    def __iter__(self) -> Iterator[str]:
        yield from self.own
        yield from self.names

    def __len__(self) -> int:
        return len(self.own) + len(self.names)


def party_reports(own: Mapping[str, dict], replies: Mapping) -> Mapping[str, dict]:
    """The parties' evaluation reports: ``own`` (dicts by party) and the payload of each
    reply of ``replies`` (a round's ``evaluate`` replies by client, or reports already);
    replies a stacked round answered stay stacked (a :class:`StackedReports`)."""
    if isinstance(replies, StackedReports):
        return StackedReports({**own, **replies.own}, replies.names, replies.fields)
    stacked = getattr(replies, "stacked", None)
    if stacked is not None:
        return StackedReports(own, list(replies), stacked)
    return {
        **own,
        **{n: (r if isinstance(r, dict) else r.payload) for n, r in replies.items()},
    }


def reported_vectors(reports: Mapping[str, dict], key: str) -> dict[str, np.ndarray]:
    """Vector ``key`` of each party whose report has it, by party."""
    if not isinstance(reports, StackedReports):
        return {n: np.asarray(r[key], dtype=float) for n, r in reports.items() if key in r}
    out = {n: np.asarray(r[key], dtype=float) for n, r in reports.own.items() if key in r}
    rows = reports.fields.get(key)
    if rows is not None:
        out.update(zip(reports.names, np.asarray(rows, dtype=float)))
    return out


class _Columns:
    """The parties' reports read field by field, in party order: from dicts, or from a
    :class:`StackedReports` without a dict per party (sums in the same order either way,
    so both give the same numbers)."""

    def __init__(self, reports: Mapping[str, dict]):
        if isinstance(reports, StackedReports):
            self.dicts, self.fields = list(reports.own.values()), reports.fields
            self.names = [*reports.own, *reports.names]
        else:
            self.dicts, self.fields, self.names = list(reports.values()), None, list(reports)

    def __len__(self) -> int:
        return len(self.names)

    def has(self, key: str) -> bool:
        """Whether every party's report has ``key``."""
        return all(key in r for r in self.dicts) and (self.fields is None or key in self.fields)

    def floats(self, key: str, default: float | None = None) -> list[float]:
        """Scalar ``key`` of every party (``default`` where absent; None: required)."""
        out = [float(r[key] if default is None else r.get(key, default)) for r in self.dicts]
        if self.fields is not None:
            v = self.fields.get(key)
            if v is None and default is None:
                raise KeyError(key)
            out += [default] * len(self.fields_rows()) if v is None else v.tolist()
        return out

    def fields_rows(self) -> range:
        return range(len(self.names) - len(self.dicts))

    def total(self, key: str):
        """The sum of vector ``key`` over the parties, in party order."""
        if self.fields is None:
            return sum(np.asarray(r[key], dtype=float) for r in self.dicts)
        rows = np.asarray(self.fields[key], dtype=float)
        if self.dicts:
            rows = np.concatenate([np.stack([r[key] for r in self.dicts]), rows])
        return np.add.reduce(rows, axis=0)  # (row after row, as the sum over dicts)

    def arrays(self, key: str, dtype=float) -> list[np.ndarray]:
        """Vector ``key`` of every party (an empty one where absent)."""
        out = [np.asarray(r.get(key, ()), dtype=dtype) for r in self.dicts]
        if self.fields is not None:
            v = self.fields.get(key)
            out += [np.zeros(0, dtype=dtype)] if v is None else [np.asarray(v, dtype=dtype)]
        return out

    def largest(self, key: str, into: np.ndarray) -> np.ndarray:
        """``into`` raised to the elementwise maximum of vector ``key`` over the parties."""
        for r in self.dicts:
            np.maximum(into, r[key], out=into)
        if self.fields is not None and len(self.fields_rows()):
            np.maximum(into, np.maximum.reduce(self.fields[key], axis=0), out=into)
        return into

    def by_party(self, key: str) -> list[np.ndarray]:
        """Array field ``key`` of every party (the stacked parties' rows; one empty row
        for all when the rows are empty: nothing can change an array without elements)."""
        out = [np.asarray(r[key]) for r in self.dicts]
        if self.fields is not None:
            rows = self.fields[key]
            if len(rows) and not rows[0].size:
                out += [rows[0]] * len(rows)
            else:
                out += list(rows)
        return out


def assemble(
    reports: Mapping[str, dict],
    regularizer: Regularizer,
    x: np.ndarray,
    local: bool,
    objective_scale: float = 1.0,
) -> tuple[KKTResiduals, dict]:
    """Combine the parties' evaluation reports (dicts by party, or a
    :class:`StackedReports`) into residuals and summary values; ``objective_scale`` is the
    objective's reference scale ``S`` (:mod:`fedmodel.certificate.scale`; the parties
    evaluated with the same).

    Returns the residuals and a dict with the objective ``f + h``, the max violation and
    each party's constraint values.
    """
    cols = _Columns(reports)
    grad = cols.total("grad") if len(cols) else 0
    relief = None if local else _boundary_relief(cols, grad)
    if relief is not None:
        grad = relief[0]
    stationarity = (
        float(np.abs(grad).max(initial=0.0))
        if regularizer.is_zero
        else regularizer.dist_subdiff(x, grad)
    )
    # blocks of party-owned variables, reported by their owners (federated evaluation)
    owned = max(cols.floats("owned_stationarity", 0.0), default=0.0)
    stationarity = max(stationarity, owned)
    per_party = dict(zip(cols.names, cols.floats("feasibility")))
    box = regularizer.box_violation(x)
    gap = sum(cols.floats("complementarity_gap", 0.0))
    feasibility = max(max(per_party.values(), default=0.0), box, gap)
    kkt = KKTResiduals(stationarity, feasibility, per_party, local)
    if cols.has("scale"):
        kkt.scaled_stationarity, kkt.scaled_feasibility = _scaled(
            cols,
            regularizer,
            x,
            grad,
            None if relief is None else relief[1],
            objective_scale,
        )
        kkt.scaled_feasibility = max(
            kkt.scaled_feasibility,
            box / max(1.0, float(np.abs(x).max(initial=0.0))),
            gap
            / np.nan_to_num(
                _objective_size(cols, regularizer, x, objective_scale), nan=objective_scale
            ),
        )
    summary = {
        "objective": float(sum(cols.floats("objective")) + regularizer.value(x)),
        "max_violation": max(
            max(cols.floats("violation"), default=0.0),
            regularizer.box_violation(x),
        ),
        "constraints": {
            name: {"ineq": ci, "eq": ce}
            for name, ci, ce in zip(cols.names, cols.by_party("c_ineq"), cols.by_party("c_eq"))
        },
    }
    return kkt, summary


#: "of order eps": the stationarity floor lets ``||r||_inf ||x||_1`` reach this many times
#: ``eps max(1, F)`` (a point is a silent wrong answer in ``benchmarks/models.py`` above
#: 10 eps; ``||x - x*||_1`` is at most ``||x||_1`` + ``||x*||_1`` and near x* far below)
GAP_ORDER = 10.0


def _objective_size(cols: _Columns, regularizer: Regularizer, x, reference: float = 1.0) -> float:
    """``max(S, F)``, ``F = sum_i |f_i(x)| + |h(x)|`` over the parties' reports, ``S`` the
    objective's reference scale: the size the stationarity floor and the complementarity gap are
    relative to (NaN when not finite)."""
    size = sum(map(abs, cols.floats("objective")))
    size += abs(float(regularizer.value(x))) if not regularizer.is_zero else 0.0
    return max(reference, size) if np.isfinite(size) else float("nan")


def _stationarity_floor(
    cols: _Columns, regularizer: Regularizer, x, owned, reference: float = 1.0
) -> float:
    """The floor of the stationarity scale: ``min(S, 10 max(S, F) / max(1, ||x||_1))``,
    ``S`` the objective's reference scale (:mod:`fedmodel.certificate.scale`),
    ``F`` the sum of the magnitudes of the parties' objectives and ``h`` at ``x``, ``x``
    the variables every party shares (module docstring; 10 is :data:`GAP_ORDER`). On a
    convex model the gap obeys ``f(x) - f* <= ||r||_inf ||x - x*||_1``, so a residual
    ``eps`` times this floor bounds the gap relative to ``max(1, F)`` by ``10 eps ||x -
    x*||_1 / ||x||_1`` at any dimension; a floor of 1 passed ``||r||_inf = 1e-3`` at
    ``||x||_1 = 295`` (sparse logistic, d = 3000: 3.7% above the optimum)."""
    keep = np.ones(x.size, dtype=bool)
    keep[owned] = False
    x_l1 = float(np.abs(np.asarray(x, dtype=float)[keep]).sum())
    size = _objective_size(cols, regularizer, x, reference)
    if not (np.isfinite(size) and np.isfinite(x_l1)):
        return reference
    return min(reference, GAP_ORDER * size / max(1.0, x_l1))


def _boundary_relief(cols: _Columns, grad: np.ndarray):
    """The stationarity terms with the boundary relief applied (module docstring), as
    ``(grad, scale)``, or None when no coordinate sits at a domain boundary (or a party did
    not report its terms at ``x + tau e_B``)."""
    keys = ("boundary_grad", "boundary_scale", "boundary_mask")
    if not len(cols) or not all(cols.has(k) for k in keys):
        return None
    mask = np.zeros(np.shape(grad), dtype=bool)
    for m in cols.arrays("boundary_mask"):
        mask |= (m > 0) if m.ndim == mask.ndim else (m > 0).any(axis=0)
    if not mask.any():
        return None
    plus = cols.total("boundary_grad")
    scale_plus = cols.largest("boundary_scale", np.zeros(mask.shape))
    scale = cols.largest("scale", np.zeros(mask.shape))
    grad = np.asarray(grad, dtype=float)
    # off B: the larger residual of the two points; on B: only a derivative still
    # negative at x_j + tau (pointing into the domain) is left uncertified
    worse = np.where(np.abs(plus) > np.abs(grad), plus, grad)
    relieved = np.where(mask, np.minimum(plus, 0.0), worse)
    return relieved, np.where(mask, scale_plus, np.maximum(scale, scale_plus))


def _scaled(
    cols: _Columns,
    regularizer: Regularizer,
    x: np.ndarray,
    grad,
    scale=None,
    reference: float = 1.0,
) -> tuple:
    """Scaled stationarity and feasibility from the parties' reports (module docstring);
    ``scale`` overrides the reports' (the boundary relief's), ``reference`` is ``S``."""
    grad = np.array(grad, dtype=float)
    if scale is None:
        scale = cols.largest("scale", np.zeros_like(grad))
    else:
        scale = np.array(scale, dtype=float)
    owned = [a.reshape(-1) for a in cols.arrays("owned_index", dtype=int)]
    owned = np.concatenate(owned) if owned else np.zeros(0, dtype=int)
    if owned.size:  # the pooled evaluation: owned blocks are judged by their owners
        grad[owned] = 0.0
        scale[owned] = 0.0
    if regularizer.is_zero:
        residual = float(np.abs(grad).max(initial=0.0))
    else:
        residual = regularizer.dist_subdiff(x, grad)
    denom = max(
        _stationarity_floor(cols, regularizer, x, owned, reference),
        float(scale.max(initial=0.0)),
        regularizer.subgradient_scale(x),
    )
    stationarity = residual / denom if np.isfinite(denom) else float("inf")
    if not np.isfinite(stationarity):  # (inf / inf) at a blown-up point: no certificate
        stationarity = float("inf")
    stationarity = max(stationarity, max(cols.floats("owned_scaled", 0.0), default=0.0))
    feasibility = max(cols.floats("feasibility_scaled"), default=0.0)
    return stationarity, feasibility
