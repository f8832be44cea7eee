"""Options of ``prox-al``, ``admm`` and ``cprox-al`` (seed 000), with the paper's names,
defaults and validation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from fedmodel.algorithms.options import (
    RUNTIME_OPTIONS_DOC,
    RuntimeOptions,
    stop_only,
    whole_number,
)
from fedmodel.algorithms.options import positive as _positive
from fedmodel.algorithms.proxal.newton_inner import DENSE_MODEL_MAX
from fedmodel.errors import ModelError
from fedmodel.runtime.wire import register_wire_type

# Defaults of variant="paper" follow seed 000 Section 5.1 (sbar = 0.1, beta = 10, rho = 1,
# mu0 = 0). The paper does not state q; any q in (0, 1) is covered by its Theorem 4.2, and
# with exact local solves a smaller q only removes idle inner rounds, so 0.5 is used.
# variant="adaptive" (the default) changes only what the options below say; its defaults
# were chosen from measurements (benchmarks/models.py, docs/performance.md).

VARIANTS = ("adaptive", "paper")

#: defaults that differ between the variants: (adaptive, paper)
VARIANT_DEFAULTS = {
    "beta": (100.0, 10.0),
    "rho": (1.0, 1.0),
    "tau_rate": (0.1, None),
    "adaptive_rho": (True, False),
    "kkt_factor": ((0.01, 0.001), 1.0),
    "relaxation": (1.0, 1.0),
    "monitor": (True, False),
    "anderson": (5, 0),
    "outer_anderson": (5, 0),
    "prox_beta": (1e4, None),
    "penalty_metric": ("scalar", "scalar"),
    "local_cap": (0.1, 0.0),
    "inner_solver": ("auto", "admm"),
}


#: adaptive defaults that depend on the inner solver that runs (the values above are
#: Algorithm 2's): with Newton, whose rounds do not grow with the penalty's conditioning, a
#: larger beta and a longer proximal step take fewer rounds and less time (geometric mean
#: over the seed 000 problems and two small models: 34 rounds against 37, 2.4 s against
#: 3.6 s; docs/performance.md)
NEWTON_DEFAULTS = {"beta": 300.0, "prox_beta": 1e5}
#: the adaptive defaults the quasi-Newton inner solver changes: no outer Anderson step (its
#: extrapolated (w, mu) moves l_k away from what the secant model learnt, and the next inner
#: solve relearns it: Adult NP, 20 sites, 168 rounds without it against 198 with it, see
#: docs/performance.md)
QUASI_NEWTON_DEFAULTS = {"outer_anderson": 0}

PENALTY_METRICS = ("hessian", "scalar")

#: the width, in decades, of the band of objective scales ``S`` (:mod:`fedmodel.certificate.
#: scale`) the adaptive defaults of ``beta``, ``prox_beta`` and ``rho`` are measured in:
#: ``10^-1.5 <= S < 10^1.5`` (where the models of benchmarks/models.py lie)
PARAMETER_BAND_DECADES = 3


def parameter_unit(scale: float) -> float:
    """The unit of prox-al's default parameters for an objective of scale ``S``: the power
    of ``10^3`` (:data:`PARAMETER_BAND_DECADES`) that brings ``S`` into the band the
    defaults are measured in, ``10^(3 k)`` with ``k`` the nearest whole number to
    ``log10(S) / 3``. It is 1 inside the band, where the defaults hold as they are, and
    ``t`` times the model's unit for the model times any ``t = 10^(3 j)``, so that model
    takes the same iterates; 1 for an ``S`` that is not finite and positive.

    Examples
    --------
    >>> [parameter_unit(s) for s in (0.09, 1.0, 30.0, 40.0, 3e-7, 2e5)]
    [1.0, 1.0, 1.0, 1000.0, 1e-06, 1000000.0]
    """
    if not (np.isfinite(scale) and scale > 0.0):
        return 1.0
    k = int(np.floor(np.log10(scale) / PARAMETER_BAND_DECADES + 0.5))
    return float(f"1e{PARAMETER_BAND_DECADES * k}")  # (10^(3k) correctly rounded)


#: the default curvature_directions is min(2, d // 4) up to this many shared variables and
#: 0 beyond. Rounds measured with k = 0 / 2 / 8 directions (docs/performance.md): demo
#: 290 / 74 / 45, Adult NP 20 sites 1,390 / 548 / 294, Table 1 52 / 53 / 48, lcqp-1
#: 334 / 176 / 1,296, lcqp-5 171 / 207 / 808, logistic-ball-d100 79 / 98 / 72 (geometric
#: means 213 / 140 / 207); at d = 2000 (sparse logistic + l2 ball) 8 directions stalled the
#: first inner solve, and the limited-memory model gains nothing from random directions
CURVATURE_MAX_SHARED = 500
#: the default local_directions is on up to this many shared variables (each client factors
#: its d x d Hessian of P_{i,k} once per round; it never leaves the client)
LOCAL_DIRECTIONS_MAX_SHARED = 500

#: the tolerance of every party's subproblem solve with ``exact_subproblems=True``: the
#: Newton backend's floor (its Cholesky step solves a quadratic subproblem to rounding)
EXACT_TOL = 1e-10


def float_pair(name: str, value: Any) -> tuple[float, float]:
    """``value`` (a float, or a pair such as ``eps = (eps1, eps2)``) as two floats; a
    :class:`ModelError` naming the option otherwise."""
    try:
        if isinstance(value, (str, bytes)) or (
            np.ndim(value) == 1 and any(isinstance(v, (str, bytes)) for v in value)
        ):
            raise TypeError("a string is not a tolerance")
        if np.ndim(value) == 0:
            return float(value), float(value)
        if np.ndim(value) == 1 and len(value) == 2:
            return float(value[0]), float(value[1])
    except (TypeError, ValueError):
        pass
    raise ModelError(f"{name} must be a float or a pair of floats, got {value!r}")


@register_wire_type("proxal.options")
@dataclass
class ProxALOptions(RuntimeOptions):
    """Options of ``prox-al`` (seed 000 Algorithm 1 + Algorithm 2) and ``cprox-al``.

    Attributes
    ----------
    eps : float or (float, float)
        KKT tolerances (eps1 stationarity, eps2 feasibility) of Definition 1.
    variant : {"adaptive", "paper"}
        ``"paper"``: seed 000 Algorithms 1-2 exactly as published (beta = 10, rho = 1,
        tau_k = sbar/(k+1)^2, stop on (8) at eps); ``fedmodel reproduce`` uses it.
        ``"adaptive"`` (default): Algorithm 1 with the changes below, each its own
        option: a federated quasi-Newton inner solver in place of Algorithm 2 on smooth
        models (``inner_solver``), a larger penalty ``beta`` (fewer outer
        iterations), a geometric inner tolerance schedule ``tau_rate``,
        residual-balancing ADMM penalties
        (``adaptive_rho``) and a tighter internal target ``kkt_factor * eps`` for test
        (8), so that ``"optimal"`` comes with a small objective gap, not just KKT
        residuals below ``eps`` (see docs/performance.md).
    beta : float, optional
        Penalty parameter (Algorithm 1). Default 10 (paper) or, adaptive, 100 with
        Algorithm 2 or quasi-Newton as the inner solver and 300 with Newton
        (``inner_solver``). Objective units: prox-al's adaptive variant (its Algorithm 2
        route aside) runs as on the objective divided by ``u =``
        :func:`parameter_unit` ``(S)``, ``S`` the objective's scale
        (:mod:`fedmodel.certificate.scale`): ``u = 1`` while ``S`` lies in the band the
        defaults are measured in, else the power of ``10^3`` that brings ``S`` into it, so
        the default acts as ``u beta`` on the model as written and the model times any
        power of ``10^3`` takes the same iterates; a value you set is used as given, in
        your objective's units (``res.extra["objective_units"]`` lists ``u`` and the
        factors applied to ``beta``, ``1/prox_beta`` and ``rho``). The adaptive variant
        with the Newton or quasi-Newton inner solvers (those in the objective's units)
        raises a defaulted beta tenfold, at most three times, where the multipliers crawl
        (their step has not halved over 5 outer iterations, or a plateau the monitor
        would call diverging); ``res.extra["penalty_raised"]`` says after which outer
        iterations and the final beta. A value you set is never raised.
    sbar : float, optional
        Inner tolerance scale: tau_k = sbar / (k + 1)^2 (paper), or
        ``max(sbar * tau_rate^k, eps1 * kkt_factor[0] / 2)`` (adaptive; the stationarity
        factor). Default ``100 * eps1``, which is the paper's 0.1 at eps = 1e-3 and keeps the
        number of outer iterations needed by (8) (tau_k <= eps1 requires
        k + 1 >= sqrt(sbar / eps1)) independent of eps.
    tau_rate : float, optional
        Adaptive variant: geometric decrease of the inner tolerance (default 0.1). The
        paper's ``sbar/(k+1)^2`` forces about ``sqrt(sbar/eps1)`` outer iterations even when
        the outer loop has converged (10 at eps = 1e-3, 100 at eps = 1e-6).
    kkt_factor : float or (float, float), optional
        Adaptive variant: test (8) is applied with ``kkt_factor * (eps1, eps2)``, the
        stationarity and the feasibility halves (a float scales both; default
        ``(0.01, 0.001)``); the certificate still checks ``eps``. (With the Newton inner
        solver the stationarity half is the measured Lagrangian gradient at the new
        iterate, not (8)'s bound of it.) A KKT residual of ``eps``
        does not bound the objective error by ``eps`` on flat problems (logistic losses);
        the tighter stationarity target makes ``"optimal"`` come with a relative objective
        gap below eps on every seed 000 problem measured (docs/performance.md). The
        feasibility target is tighter still: a constraint's violation is what a user checks
        against their own bound (a false-negative rate, a fairness gap), and the
        multiplier update that removes it converges linearly, so each decade costs a few
        outer iterations (Adult NP, 20 sites: max violation 4.4e-6 at 0.01, 3.9e-7 at 0.001,
        131 and 145 rounds). Where the inner solver measures the stationarity and the
        feasibility (the Newton-type routes), the certificate is evaluated once the
        measured stationarity is within ``eps1`` and the feasibility within these targets,
        and the run stops where it holds (exact-admm likewise near (8)). 1.0 in the paper
        variant.
    rho : float or dict or sequence
        ADMM penalty rho_i of each client (Algorithm 2); with ``adaptive_rho`` the
        starting value. Objective units as ``beta``: the adaptive variant of prox-al
        scales the default by ``u``; a value you set is used as given (as is the default
        with ``penalty_metric="hessian"``, whose metric carries the objective's units).
    adaptive_rho : bool, optional
        Residual balancing (He, Yang, Wang 2000; Boyd et al. 2011, Sec. 3.4.1), by each
        client on its own numbers: after its step (15), client i compares its primal
        residual ``r_i = ||u_i - w||`` with its dual residual ``s_i = rho_i ||w^{t+1} - w^t||``
        and multiplies ``rho_i`` by ``rb_factor`` when ``r_i > rb_ratio s_i`` (divides when
        ``s_i > rb_ratio r_i``), within ``[rho_i / 1000, 10 rho_i]`` of its starting value
        (a server point that stops moving makes ``s_i`` vanish); ``lambda_i`` is kept
        (unscaled form) and ``u~_i`` is sent with the new ``rho_i``, which the server uses
        in its next step (14). Changes are allowed in the first ``rb_rounds`` ADMM rounds
        of each outer iteration only, so
        every run of Algorithm 2 ends with a fixed penalty (its convergence theory).
        Default on in the adaptive variant, for the clients whose penalty metric is the
        identity or who own variables (their metric covers the shared block only): with
        the Hessian metric (``penalty_metric``) ``rho_i = 1`` is the natural scale and
        balancing took more rounds (Adult NP n = 20: 382 against 357; breast
        cancer n = 20: 227 against 198; monks n = 20: 194 against 88).
    rb_ratio, rb_factor, rb_rounds : float, float, int
        Residual-balancing thresholds (10, 2, 50).
    relaxation : float, optional
        Over-relaxation ``alpha`` in (0, 2) of the ADMM (Eckstein, Bertsekas 1992): the
        server step and the multiplier update use ``alpha u_i + (1 - alpha) w`` in place
        of ``u_i``. Default 1 (Algorithm 2) in both variants: 1.6 took more rounds on seed
        000 Table 1 (measured in docs/performance.md).
    q : float
        Server/client local tolerance decay eps_{t+1} = q^t (Algorithm 2).
    mu0 : float
        Initial multipliers (all parties), >= 0.
    w0 : None, array, dict or "sphere"
        Starting point (default zeros, projected onto dom h); ``"sphere"`` draws it from the
        unit sphere with ``random_state`` as in the paper's experiments.
    anderson : int, optional
        Memory ``m`` of safeguarded type-II Anderson acceleration of the inner ADMM
        (:mod:`fedmodel.algorithms.proxal.anderson`; as in SCS 3 and a2dr): 5 (adaptive)
        or 0 (off; paper). The server sends ``m + 1`` weights with ``w``, each client
        ``m + 1`` inner products with its reply. Off with party-owned variables.
    prox_beta : float, optional
        The proximal step size of Algorithm 1's outer iteration, ``||w - w^k||^2 /
        (2 prox_beta)`` split over the parties, decoupled from the penalty ``beta`` (the
        proximal method of multipliers in the metric ``diag(1/prox_beta, 1/beta)``; test (8)
        uses ``||w^{k+1} - w^k|| / prox_beta``). Default: adaptive, 1e4 with Algorithm 2
        (a long proximal step moves fast along the flat directions of logistic losses on
        one-hot data, while the penalty beta = 100 keeps the inner ADMM well conditioned)
        and with the quasi-Newton inner solver, 1e5 with Newton; ``beta`` (paper:
        Algorithm 1). Objective units as ``beta``: the adaptive variant of prox-al divides
        the default by ``u``; a value you set is used as given.
    outer_anderson : int, optional
        Memory of the same safeguarded Anderson acceleration applied to Algorithm 1's
        outer iteration ``(w^k, mu^k) -> (w^{k+1}, mu^{k+1})`` (a proximal point map):
        5 (adaptive) or 0 (paper). Costs one more round (``outer_aa``) per accelerated
        outer iteration, and saves many where the multipliers are large (without it the
        Newton inner solver takes 27 rounds in geometric mean over the seed 000 problems
        and two small models against 34, but the method of multipliers crawls on an LCQP
        whose multipliers are ~100 beta). Off with party-owned variables, and by default
        with the quasi-Newton inner solver (:data:`QUASI_NEWTON_DEFAULTS`: an extrapolated
        ``(w, mu)`` moves ``l_k`` away from what the server's secant model learnt; Adult
        NP, 20 sites, 168 rounds without it against 198 with it).
    penalty_metric : {"scalar", "hessian"}, optional
        The metric of Algorithm 2's penalty (:mod:`fedmodel.algorithms.proxal.metric`):
        ``"scalar"`` (default, the paper: ``(rho_i/2)||u_i - w||^2``; every message is
        ``O(d)``) or ``"hessian"`` (an opt-in: ``(rho_i/2)(u_i - w)^T M_i (u_i - w)`` with
        ``M_i`` the Hessian of client i's ``P_{i,k}`` at the start of each run of
        Algorithm 2). The Hessian metric is Algorithm 2 on scaled consensus constraints
        (same theory, same bound (19)) and cuts the rounds by 4-12x on the seed 000
        problems, but **it reveals each client's d x d Hessian of its subproblem (for a
        client with fewer rows than d, its rows: a 1-row client's row comes back
        exactly)**: each client sends its ``M_i`` when it changes (evaluated at the start
        of each run of Algorithm 2 and after its rounds 4, 8, ..., 128), ``8 d^2`` bytes
        each time. It falls back to ``"scalar"`` when ``h`` is not
        smooth, the server solves with cvxpy or the model has non-convex terms, and client
        by client when a backend has no exact Hessian; ``res.extra["penalty_metric"]``
        says which was used.
    metric_floor : float, optional
        ``M_i`` is made positive definite by adding ``metric_floor * max(diag M_i)``
        (default 1e-8).
    metric_refresh : float, optional
        A client keeps (and does not resend) its ``M_i`` while its Hessian has changed by
        at most this fraction in Frobenius norm (default 0: a new metric whenever the
        Hessian changed; a quadratic client sends it once).
    monitor : bool, optional
        Stop early with a reason (adaptive variant, default on): status ``"stalled"`` when
        the inner bound (19) improves by less than 10% over ``stall_rounds`` ADMM rounds
        (default 300), ``"diverging"`` when ``max_i ||mu_i^{k+1} - mu_i^k||_inf`` (beta
        times the violation) has not halved over 10 outer iterations (an infeasible model
        without a certificate; with a defaulted beta only once beta has been raised three
        times, see ``beta``), and on convex models ``"infeasible"`` / ``"unbounded"``
        when the parties' certificate holds (:mod:`fedmodel.certificate.infeasibility`:
        tried when the multiplier or the outer steps settle). Never ``"optimal"``; the
        message says what to change.
    max_outer, max_inner : int
        Iteration caps of Algorithms 1 and 2.
    local_cap : float, optional
        Adaptive variant: local solves are never asked for less than ``local_cap * tau_k``
        (default 0.1; 0: off, the paper's ``q^t`` alone). A local solve's error enters
        ``eps~_i``, so with ``q^t`` alone (19) cannot hold before ``q^t <= tau_k``: about
        ``log(tau_k)/log(q)`` rounds per outer iteration whatever the consensus does (17 at
        tau = 1e-5). The adaptive variant also tests (19) with the server's measured
        residual in place of ``max(q^t, residual)`` (both bound ``dist(0, d l_k)``).
    local_floor : float
        Local solves are asked for max(q^t, local_floor * tau_k): once q^t is far below
        the inner target tau_k, tighter local solves cannot change the test (19), which
        stays a valid bound on dist(0, d l_k) because it uses the server's measured
        residual and the clients' exact eps~_i (Theorem 4.1's proof).
    exact_subproblems : bool, default False
        Solve the subproblems (14) and (15) of Algorithm 2 exactly, as seed 000 Section 5.1
        does ("we exactly solve the convex quadratic programming subproblems"): every
        local solve is asked for ``EXACT_TOL`` (1e-10; rounding level for the Newton
        backend) instead of ``max(q^t, local_floor * tau_k)``, and (19) uses the server's
        measured residual in place of ``max(q^t, residual)`` (an exact solve has error
        about 0, not ``q^t``). Off by default: the inexact rule is Algorithm 2 as written
        (n = 5, d = 100 QP of Table 1, seed 0, ``w0`` of trial 0: 187 ADMM rounds inexact,
        118 exact, both certified, the final ``w`` 1.2e-4 apart).
    inner_solver : {"auto", "quasi-newton", "prox-quasi-newton", "newton", "prox-newton", "admm", "exact-admm"}
        How each outer iteration's subproblem ``min l_k`` is solved. ``"admm"``: Algorithm
        2 (the paper; default of ``variant="paper"``). ``"quasi-newton"``: a federated
        quasi-Newton method on ``l_k`` (:mod:`fedmodel.algorithms.proxal.newton_inner`):
        each round the clients return ``P_{i,k}``'s value and gradient (``d + 1`` floats)
        at the server's point; the server keeps a BFGS model of their Hessian sum built
        from those gradients (:class:`~fedmodel.algorithms.proxal.newton_inner.SecantModel`,
        carried across outer iterations), adds its own exact Hessian, steps along
        ``-B^(-1) g`` with an Armijo line search, and the inner loop stops when the
        measured ``||grad l_k||_inf <= tau_k`` (the same requirement Algorithm 2's bound
        (19) certifies). ``"newton"`` (an opt-in): the same loop with each client's exact
        Hessian in place of the model -- federated semismooth Newton, the fewest rounds
        (3-30x fewer on the seed 000 problems), but **it reveals each client's d x d
        Hessian of its subproblem (for a client with fewer rows than d, its rows: a 1-row
        client's row comes back exactly)**, sent whenever it changed (``8 d^2`` bytes).
        Both need ``C^1`` terms: a smooth ``h``, no cone constraints or party-owned
        variables, and the Newton backend at the server (``"newton"``: at every party).
        ``"exact-admm"``: consensus ADMM in which every party returns the exact minimiser
        of its subproblem plus ``(sigma/2)||x - c_i||^2`` (``d`` floats each way;
        :mod:`fedmodel.algorithms.proxal.exact_admm`), for convex models.
        ``"prox-quasi-newton"``: the quasi-Newton loop's proximal form for a non-smooth
        ``h`` (l1, group norms, boxes, a ball) when the parties' terms are smooth
        (:mod:`fedmodel.algorithms.proxal.prox_newton`): the clients send the quasi-Newton
        messages, the server takes the prox of ``h`` in its model step (no rounds) and the
        inner loop stops when the measured ``dist(0, grad S_k + dh) <= tau_k``.
        ``"prox-newton"`` (an opt-in, as ``"newton"``): that loop with the clients' exact
        Hessians in place of the secant model, damped after a shortened step
        (:func:`~fedmodel.algorithms.proxal.prox_newton.next_damping`); on a QP split as
        its rows an inner solve takes a few rounds. ``"auto"`` (default of the adaptive variant), on a convex model, picks
        ``"prox-quasi-newton"`` when ``h`` is the only non-smooth part and no party has
        inequality constraints or a term with a restricted domain (measured: sparse
        logistic regression with an l1 ``h``, d = 3000, 20 clients: 621 rounds with
        exact-admm, 31 with it); otherwise ``"exact-admm"`` when a term is non-smooth or
        conic, has a restricted domain, a party owns variables, or a party has inequality
        constraints (up to 2000 shared variables, and unless a constrained party has
        exponential-cone terms, whose exact steps are slow interior-point solves; at
        ``eps < 1e-5`` a client's inequality constraints, those of the server alone stay
        with the quasi-Newton route, which runs in the objective's units); otherwise
        ``"quasi-newton"`` when the model allows it, and Algorithm 2 with the scalar
        penalty when not: no default sends a ``d x d`` matrix. On a non-convex model the
        Hessian (or model) is shifted to positive definite (modified Newton).
        ``res.extra["inner_solver"]`` says which ran (and ``"inner_solver_note"`` why).
        The ADMM options (``rho``, ``anderson``, ``penalty_metric`` ...) apply to
        Algorithm 2 (``rho``, ``anderson`` also to exact-admm).
    curvature_directions : int, optional
        ``inner_solver="quasi-newton"``: each round (and with the round that starts an
        inner solve) the server also sends ``k`` directions (the trial step and random
        ones, orthonormal) and each client returns its Hessian's products with them (``k
        d`` more floats), which the server's model takes as exact curvature pairs (block
        BFGS). 0: gradients only (``d + 1`` floats). Default: ``min(2, d // 4)`` up to 500
        shared variables, 0 beyond (``CURVATURE_MAX_SHARED``: measured, the demo 74 rounds
        instead of 290, Adult NP 548 instead of 1,390; more directions helped these -- 45
        and 294 with 8 -- but took LCQPs with a server box from 171-334 to 808-1,296). A product ``H_i v`` is a directional
        derivative of the gradient the client sends anyway (for a quadratic client, the
        gradient difference along ``v``); the products of ``d / k`` rounds span the
        client's Hessian where it does not change (a quadratic client's).
    batch_clients : bool, default True
        Clients of the same structure that a host (this process, a worker, an actor)
        holds answer a round in one batched step where their steps stack: exact-admm's
        exact step of unconstrained parties of GLM form with dense data, solved for all of
        them by one batched Newton method
        (:class:`~fedmodel.subproblems.batched_glm.GLMCohort`). The points agree with the
        per-party solves within each step's tolerance (not bit for bit). False: every
        party's step on its own. A ``client_timeout`` also turns batches off (each step
        keeps its own clock).
    local_directions : bool, optional
        ``inner_solver="quasi-newton"`` with curvature directions: each round the server
        also sends ``r``, the gradient of ``l_k`` at the last accepted point, and each
        client returns its local Newton direction ``(n (H_i + p I))^(-1) r`` (``d`` floats;
        ``H_i`` its Hessian of ``P_{i,k}`` at the trial point, which never leaves it: a
        GIANT-style direction, Wang et al., NeurIPS 2018); the average of the clients'
        directions is one more curvature direction of the next round (its products make
        the model exact along an approximate Newton direction). Default (None): on up to
        ``LOCAL_DIRECTIONS_MAX_SHARED`` = 500 shared variables, where the curvature
        directions are on (each client factors its ``d x d`` Hessian once per round).
        Measured (benchmarks/RESULTS_od_default.md, with ``constraint_curvature``, rounds
        with local directions against without): Adult NP, 20 sites, 226 against 526; the
        demo 60 against 64; Table 1 largest 18 either way. A local direction is one
        product of the inverse of the client's Hessian with a vector the server chose, of
        the kind of a Hessian-vector product. By default off when the server has inequality
        constraints (its walls are not in the clients' Hessians: an LCQP with a server box
        took 177 instead of 85 rounds with them), and under ``secure_aggregation`` (the
        server learns only sums; asking for it there is refused naming the message).
    constraint_curvature : bool, optional
        ``inner_solver="quasi-newton"``: each client adds to its replies the rows ``J_i =
        sqrt(beta) grad c_j(w)`` of its equality and active non-affine inequality
        constraints (``d`` floats each) and the server adds ``sum_i J_i^T J_i`` (with its own
        rows: equalities and active affine inequalities) to its model exactly, the BFGS
        model covering the rest
        (structured quasi-Newton, Dennis, Martinez and Tapia 1989): the stiff
        augmented-Lagrangian curvature need not be learnt pair by pair. Default (None): on up
        to 2000 shared variables (the dense model), off under ``secure_aggregation`` (each
        client's rows are its own; asking for them there is refused naming the message). Measured (rounds with the rows against
        without): Table 1 largest 18 against 53, the demo 64 against 74, markowitz (quick)
        275 against 857 (the server's ``w >= 0`` rows). Left to the secant pairs, because
        they take more rounds as rows: the clients' affine inequalities (lcqp-5 168
        instead of 122) and the server's non-affine ones (a norm ball: logistic-ball-d100
        91 instead of 84); the server's affine box still costs the quick LCQPs rounds
        (lcqp-1 106 instead of 85, lcqp-5 152 instead of 122). For an affine
        equality the row is the client's constraint row itself.
    random_state : int or None
        Seed of the random choices: ``w0="sphere"`` and the clients drawn under
        ``participation``.
    participation : float, int or None, optional
        Partial participation: the clients that take part in each round of the exact-admm
        inner solver (``inner_solver="exact-admm"``; under ``"auto"`` the only route that
        samples). A float in ``(0, 1]`` is a share of the clients (``ceil(share * n)`` per
        round), an integer in ``[1, n]`` a count (scikit-learn's convention: ``1`` is one
        client, ``1.0`` all of them); None (default) or all clients: every client in every
        round. Each round draws its clients uniformly without replacement with
        ``random_state`` (:class:`~fedmodel.algorithms.topology.Coordination`, as dald's
        ``coordination="random"``); only they receive the round's request and reply, and
        the server's step uses every client's latest reply. The method is the randomized
        block-coordinate Douglas-Rachford iteration (consensus ADMM in which only the
        sampled clients' blocks move), which converges almost surely for any fixed penalty
        when each client is drawn with a positive probability (Iutzeler, Bianchi, Ciblat
        and Hachem, "Asynchronous distributed optimization using a randomized alternating
        direction method of multipliers", IEEE CDC 2013; Combettes and Pesquet, SIAM J.
        Optim. 25(2), 2015, Theorem 3.2): under sampling the penalty changes only every
        ``ceil(n / k)`` rounds (an epoch: each client drawn once on average) within the
        first ``rb_rounds`` epochs of each inner solve, so that every inner solve ends at
        a fixed penalty, and Anderson acceleration is off (its safeguard compares the
        residuals of a deterministic map). The inner solve stops only once every client
        has replied at its current subproblem. The rounds that start an inner solve
        (``start``, ``outer``: Algorithm 1's multiplier update and new centre) and the
        certificate's evaluation round reach every client, so "optimal" is certified on
        all of them; each round counts as one communication round whatever its
        participation, and ``res.extra["participation"]`` gives the clients per round,
        the sampled rounds and the client steps.
    quorum : float, int or None, optional
        Stragglers: a round of the exact-admm inner solver proceeds once this many of its
        clients replied (a share in ``(0, 1]`` of the round's clients -- all of them, or
        the ``participation`` sample -- or a count, as ``participation``); None (default)
        or all of them: every round waits for every client it was sent to. On a runtime
        with a non-blocking exchange (processes, Ray) each client's step is posted
        (:meth:`~fedmodel.runtime.base.Runtime.post`) to the round's clients that are not
        still computing an earlier one; the server's step uses the replies that arrived,
        and a late reply is applied when it arrives, against the consensus point it was
        computed from. The iteration is the block-coordinate Douglas-Rachford form of
        ``participation`` (consensus ADMM with the server keeping each client's block;
        Anderson acceleration off, the penalty changed once per epoch) run
        asynchronously with a bounded delay: ARock (Peng, Xu, Yan and Yin, "ARock: an
        algorithmic framework for asynchronous parallel coordinate updates", SIAM J. Sci.
        Comput. 38(5), 2016) on Douglas-Rachford's firmly nonexpansive operator of the
        convex consensus (each client's prox and the server's prox with ``h``), which
        converges for delays at most ``tau`` with a block step below ``2 / (1 + 2 tau /
        sqrt(n))`` (the step is the relaxation, lowered below that bound when it is not);
        the partial barrier with a bounded delay is the scheme of Zhang and Kwok,
        "Asynchronous distributed ADMM for consensus optimization", ICML 2014. The
        steps still out at the end of an inner solve are waited for, and the
        certificate's evaluation reaches every client, so "optimal" is certified on all
        of them. On a runtime that exchanges at once (serial) no reply is late and the
        run is the one without ``quorum``. ``res.extra["quorum"]`` gives the replies per
        round, the delay bound, the late replies, their largest delay in rounds and the
        rounds in which the server waited for a step that reached the bound; a late
        message's ledger rows are recorded when its reply arrives (they carry the round
        it was posted in).
    max_delay : int or None, optional
        Under ``quorum``: the rounds a posted step may stay out; a step that old is
        waited for (bounded staleness). Default: the largest ``tau >= 1`` that meets
        ARock's step condition at the relaxation (``tau < sqrt(n) (2 / relaxation - 1) /
        2``: 1 up to 15 clients, 15 at 1,000).
    solver : {"auto", "lbfgs", "cvxpy"}
        Subproblem backend of every party.
    (and the runtime options below)
    """

    eps: Any = 1e-3
    variant: str = "adaptive"
    beta: float | None = None
    sbar: float | None = None
    rho: Any = None
    tau_rate: float | None = None
    kkt_factor: Any = None
    adaptive_rho: bool | None = None
    rb_ratio: float = 10.0
    rb_factor: float = 2.0
    rb_rounds: int = 50
    relaxation: float | None = None
    monitor: bool | None = None
    anderson: int | None = None
    outer_anderson: int | None = None
    prox_beta: float | None = None
    penalty_metric: str | None = None
    metric_floor: float = 1e-8
    metric_refresh: float = 0.0
    local_cap: float | None = None
    inner_solver: str | None = None
    curvature_directions: int | None = None
    local_directions: bool | None = None
    constraint_curvature: bool | None = None
    batch_clients: bool = True
    stall_rounds: int = 300
    q: float = 0.5
    mu0: float = 0.0
    w0: Any = None
    random_state: Any = None
    participation: Any = None
    quorum: Any = None
    max_delay: int | None = None
    max_outer: int = stop_only(500)
    max_inner: int = 500
    max_local_iter: int = 10_000
    local_floor: float = 1e-3
    exact_subproblems: bool = False
    solver: str = "auto"
    divergence_limit: float = stop_only(1e10)

    def __post_init__(self) -> None:
        # the options left to their defaults (the route that runs may set those: routes.py)
        self._defaulted = {name for name in VARIANT_DEFAULTS if getattr(self, name) is None}
        if self.variant in VARIANTS:
            pick = 0 if self.variant == "adaptive" else 1
            for name, values in VARIANT_DEFAULTS.items():
                if getattr(self, name) is None:
                    setattr(self, name, values[pick])
        if self.sbar is None:
            try:
                self.sbar = 100.0 * self.eps1
            except ModelError:
                self.sbar = 0.1  # validate() reports the bad eps

    def curvature_count(self, d: int) -> int:
        """The number of curvature directions per round for ``d`` shared variables: the
        option, or its default ``min(2, d // 4)`` up to ``CURVATURE_MAX_SHARED`` variables and
        0 beyond (see ``curvature_directions``)."""
        if self.curvature_directions is not None:
            return int(self.curvature_directions)
        return min(2, d // 4) if d <= CURVATURE_MAX_SHARED else 0

    def local_directions_on(self, d: int) -> bool:
        """Whether the quasi-Newton rounds ask for the clients' local Newton directions: the
        option, or its default (on up to ``LOCAL_DIRECTIONS_MAX_SHARED`` shared variables,
        where a client factors its ``d x d`` Hessian once per round; off under secure
        aggregation or dp, where the server learns only sums and the directions are
        averaged)."""
        if self.local_directions is not None:
            return bool(self.local_directions)
        return d <= LOCAL_DIRECTIONS_MAX_SHARED and not self.sums_only

    def constraint_curvature_on(self, d: int) -> bool:
        """Whether the quasi-Newton rounds carry the parties' active constraint rows (the
        option, or its default: on up to ``DENSE_MODEL_MAX`` shared variables, off under
        secure aggregation or dp, where the server learns only sums and the rows are each
        client's)."""
        if self.constraint_curvature is not None:
            return bool(self.constraint_curvature)
        return d <= DENSE_MODEL_MAX and not self.sums_only

    def clients_per_round(self, n: int) -> int | None:
        """The clients of each sampled round out of ``n`` (``participation``), or None when
        every client takes part in every round; a :class:`ModelError` naming the option
        and ``n`` for a value that is neither a share in ``(0, 1]`` nor a count in
        ``[1, n]``.

        Examples
        --------
        >>> ProxALOptions(participation=0.1).clients_per_round(1000)
        100
        >>> ProxALOptions(participation=25).clients_per_round(1000)
        25
        >>> ProxALOptions(participation=1.0).clients_per_round(1000) is None
        True
        """
        count = _share_or_count("participation", self.participation, n, "the model")
        return None if count is None or count >= n else count

    def penalties(
        self, objective_units: tuple, n_clients: int, proximal: bool
    ) -> tuple[float, float, float]:
        """``(beta, gamma, p)``: the penalty, Algorithm 1's proximal step size (``beta``, or
        ``prox_beta`` when decoupled) and its proximal weight ``p = 1 / ((n + 1) gamma)``
        (0 without the proximal term), in the objective's units ``objective_units = (u,
        beta's factor, 1/prox_beta's factor, rho's factor)`` (the server's
        ``take_objective_units``); what the server and every client derive alike.

        Examples
        --------
        >>> ProxALOptions(beta=10.0, prox_beta=20.0).penalties((1.0, 1.0, 1.0, 1.0), 4, True)
        (10.0, 20.0, 0.01)
        """
        _, beta_factor, prox_factor, _ = objective_units
        beta = float(self.beta) * beta_factor
        gamma = float(self.beta if self.prox_beta is None else self.prox_beta) / prox_factor
        return beta, gamma, (1.0 / ((n_clients + 1) * gamma) if proximal else 0.0)

    def quorum_size(self, k: int) -> int | None:
        """The replies a round of ``k`` clients waits for (``quorum``), or None when it
        waits for all of them; a :class:`ModelError` naming the option for a value that is
        neither a share in ``(0, 1]`` nor a count in ``[1, k]``.

        Examples
        --------
        >>> ProxALOptions(quorum=0.9).quorum_size(10)
        9
        >>> ProxALOptions(quorum=10).quorum_size(10) is None
        True
        """
        count = _share_or_count("quorum", self.quorum, k, "a round")
        return None if count is None or count >= k else count

    def delay_bound(self, m: int, relaxation: float = 1.0) -> int:
        """The rounds a posted step may stay out under ``quorum`` (``max_delay``), by
        default the largest ``tau >= 1`` with ``relaxation < 2 / (1 + 2 tau / sqrt(m))``
        (ARock's step condition for ``m`` blocks, see ``quorum``).

        Examples
        --------
        >>> ProxALOptions(quorum=0.9).delay_bound(1000)
        15
        >>> ProxALOptions(quorum=0.9, max_delay=3).delay_bound(1000)
        3
        """
        if self.max_delay is not None:
            return int(self.max_delay)
        alpha = float(relaxation)
        tau = np.sqrt(m) * (2.0 / alpha - 1.0) / 2.0  # (the supremum of the bound)
        return max(1, int(np.ceil(tau)) - 1)

    @property
    def eps1(self) -> float:
        return float_pair("eps", self.eps)[0]

    @property
    def eps2(self) -> float:
        return float_pair("eps", self.eps)[1]

    @property
    def kkt_factors(self) -> tuple[float, float]:
        """``kkt_factor`` as ``(stationarity, feasibility)``."""
        return float_pair("kkt_factor", self.kkt_factor)

    @property
    def adaptive(self) -> bool:
        return self.variant == "adaptive"

    @property
    def balancing(self) -> tuple[float, float, int] | None:
        """Residual-balancing settings ``(rb_ratio, rb_factor, rb_rounds)`` handed to the
        clients, or None (a fixed rho: ``adaptive_rho=False``)."""
        if not self.adaptive_rho:
            return None
        return (float(self.rb_ratio), float(self.rb_factor), int(self.rb_rounds))

    def validate(self, compiled, method: str) -> None:
        client_names = [c.name for c in compiled.clients]
        if self.variant not in VARIANTS:
            raise ModelError(f"variant must be one of {VARIANTS}, got {self.variant!r}")
        float_pair("eps", self.eps)  # (raises on anything else)
        _positive("eps1", self.eps1)
        _positive("eps2", self.eps2)
        _positive("beta", self.beta)
        _positive("sbar", self.sbar)
        if self.prox_beta is not None:
            _positive("prox_beta", self.prox_beta)
        if self.adaptive:
            if not 0 < self.tau_rate < 1:
                raise ModelError(f"tau_rate must lie in (0, 1), got {self.tau_rate!r}")
            if not all(0 < v <= 1 for v in self.kkt_factors):
                raise ModelError(f"kkt_factor must lie in (0, 1], got {self.kkt_factor!r}")
            if self.rb_ratio <= 1 or self.rb_factor <= 1:
                raise ModelError("rb_ratio and rb_factor must be > 1")
        if self.penalty_metric not in PENALTY_METRICS:
            raise ModelError(
                f"penalty_metric must be one of {PENALTY_METRICS}, got {self.penalty_metric!r}"
            )
        if not 0 < self.metric_floor <= 1:
            raise ModelError(f"metric_floor must lie in (0, 1], got {self.metric_floor!r}")
        if not 0 <= self.local_cap <= 1:
            raise ModelError(f"local_cap must lie in [0, 1], got {self.local_cap!r}")
        if not 0 <= self.metric_refresh < 1:
            raise ModelError(f"metric_refresh must lie in [0, 1), got {self.metric_refresh!r}")
        for name in ("anderson", "outer_anderson"):
            if int(getattr(self, name)) < 0:
                raise ModelError(f"{name} must be >= 0, got {getattr(self, name)!r}")
        if not 0 < self.relaxation < 2:
            raise ModelError(f"relaxation must lie in (0, 2), got {self.relaxation!r}")
        if not isinstance(self.exact_subproblems, (bool, np.bool_)):
            raise ModelError(
                f"exact_subproblems must be True or False, got {self.exact_subproblems!r}"
            )
        if not 0 < self.q < 1:
            raise ModelError(f"q must lie in (0, 1), got {self.q!r}")
        if self.mu0 < 0:
            raise ModelError(f"mu0 must be >= 0, got {self.mu0!r}")
        k = self.curvature_directions
        if k is not None and not (isinstance(k, (int, np.integer)) and 0 <= k <= 64):
            raise ModelError(f"curvature_directions must be an integer in [0, 64], got {k!r}")
        if not isinstance(self.batch_clients, (bool, np.bool_)):
            raise ModelError(f"batch_clients must be True or False, got {self.batch_clients!r}")
        local = self.local_directions
        if local is not None and not isinstance(local, (bool, np.bool_)):
            raise ModelError(f"local_directions must be True, False or None, got {local!r}")
        for name in ("max_outer", "max_inner", "max_local_iter"):
            whole_number(name, getattr(self, name))
        per_round = self.clients_per_round(len(client_names)) or len(client_names)
        quorum = self.quorum_size(per_round)
        if self.max_delay is not None:
            whole_number("max_delay", self.max_delay)
            if self.quorum is None:
                raise ModelError(
                    f"max_delay={self.max_delay!r} bounds how late a reply may be under "
                    "quorum; without quorum every round waits for all its clients"
                )
        if quorum is not None and method == "cprox-al":
            raise ModelError(
                f"quorum={self.quorum!r}: cprox-al solves the pooled problem in one process "
                "and has no rounds to wait for; use method='prox-al'"
            )
        if self.clients_per_round(len(client_names)) is not None and method == "cprox-al":
            raise ModelError(
                f"participation={self.participation!r}: cprox-al solves the pooled problem in "
                "one process and has no rounds to sample; use method='prox-al'"
            )
        first = {}  # (each value once, with the first client that has it: the one named)
        for name, r in self.rho_per_client(client_names).items():
            first.setdefault(r, name)
        for r, name in first.items():
            _positive(f"rho for client '{name}'", r)

    def rho_per_client(self, client_names: list[str]) -> dict[str, float]:
        rho = self.rho
        if isinstance(rho, dict):
            missing = [n for n in client_names if n not in rho]
            unknown = [n for n in rho if n not in client_names]
            if missing or unknown:
                raise ModelError(
                    f"rho dict must give every client: missing {missing}, unknown {unknown}"
                )
            return {n: float(rho[n]) for n in client_names}
        if np.ndim(rho) == 1:
            if len(rho) != len(client_names):
                raise ModelError(f"rho has {len(rho)} entries for {len(client_names)} clients")
            return {n: float(r) for n, r in zip(client_names, rho)}
        return {n: float(rho) for n in client_names}


ProxALOptions.__doc__ += RUNTIME_OPTIONS_DOC


@dataclass
class CProxALOptions(ProxALOptions):
    """Options of ``cprox-al`` (seed 000 Algorithm 3): those of :class:`ProxALOptions`,
    with the paper's defaults (``variant="paper"``: beta = 10, tau_k = sbar/(k+1)^2).

    Examples
    --------
    >>> CProxALOptions().beta
    10.0
    """

    variant: str = "paper"


@register_wire_type("admm.options")
@dataclass
class ADMMOptions(ProxALOptions):
    """Options of ``admm`` (seed 000 Algorithm 2 alone): those of :class:`ProxALOptions`
    with ``variant="paper"`` by default (a fixed rho); ``variant="adaptive"`` adds the
    residual-balancing penalties (``adaptive_rho``).

    Examples
    --------
    >>> ADMMOptions().adaptive_rho
    False
    """

    variant: str = "paper"


def _share_or_count(name: str, value: Any, n: int, whole: str) -> int | None:
    """The clients that ``value`` (option ``name``) selects out of ``n`` (``whole``: what
    the ``n`` clients are, for the error): a float in ``(0, 1]`` is a share of them
    (``ceil(share * n)``), an integer in ``[1, n]`` a count, None is None."""
    if value is None:
        return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(
        value, (int, float, np.integer, np.floating)
    ):
        raise ModelError(
            f"{name} must be a share in (0, 1], a count of clients in [1, {n}] or None, "
            f"got {value!r}"
        )
    if isinstance(value, (int, np.integer)):
        if not 1 <= value <= n:
            raise ModelError(
                f"{name}={value!r} clients per round: {whole} has {n} clients, so a count "
                f"must lie in [1, {n}] (a share is a float in (0, 1])"
            )
        return int(value)
    if not (np.isfinite(value) and 0 < value <= 1):
        raise ModelError(
            f"{name}={value!r}: a share of the clients must lie in (0, 1] (a count is an "
            f"integer in [1, {n}])"
        )
    return max(1, int(np.ceil(float(value) * n - 1e-9)))
