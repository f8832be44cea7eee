"""Pieces shared by the methods: starting points, the federated evaluation round, the
halves of the quadratic-penalty methods (:class:`PenaltyClient`, :class:`PenaltyServer`),
the status messages (:func:`status_message`), and assembling a
:class:`~fedmodel.result.Result`."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import numpy as np

from fedmodel.algorithms.protocol import ClientHalf, ServerHalf
from fedmodel.certificate.kkt import KKTResiduals, assemble, party_evaluation
from fedmodel.compiler.partition import CompiledModel, PartyProgram
from fedmodel.errors import ModelError
from fedmodel.result import Result
from fedmodel.runtime.rows import Rows

#: outer iterations of a plateau of max ||mu^(k+1) - mu^k|| before a run is judged not to
#: meet its constraints (:func:`multiplier_plateau`)
DIVERGENCE_WINDOW = 10


def multiplier_plateau(dmu_history: list[float], beta: float, eps2: float) -> str:
    """A message when the multiplier steps show constraints the method cannot meet, else "".

    ``max_i ||mu_i^{k+1} - mu_i^k||_inf = beta * (violation of the active constraints)``.
    On an infeasible model the violation settles at a positive level and the multipliers
    grow by about that much every outer iteration; on a feasible one it keeps falling, if
    slowly. The verdict needs :data:`DIVERGENCE_WINDOW` outer iterations in which it
    neither halved nor varied by more than a factor 2 (a plateau, not the oscillation of a
    slowly converging run), above ``beta eps2``.

    Examples
    --------
    >>> multiplier_plateau([100.0] * 11, beta=100.0, eps2=1e-6)[:30]
    'the multipliers diverge: ||mu^'
    >>> multiplier_plateau([100.0 * 0.5**k for k in range(11)], beta=100.0, eps2=1e-6)
    ''
    """
    h, n = dmu_history, DIVERGENCE_WINDOW
    if len(h) < n + 1 or h[-1] <= beta * eps2:
        return ""
    window = h[-n:]
    if min(window) < 0.5 * h[-n - 1] or max(window) > 2.0 * min(window):
        return ""
    # a plateau still falling steadily (a slow but converging run) is no verdict
    if window[-1] < 0.8 * window[0]:
        return ""
    return (
        f"the multipliers diverge: ||mu^(k+1) - mu^k||_inf stayed above {min(h[-n:]):.3g} "
        f"over the last {n} outer iterations (a constraint violation of about "
        f"{h[-1] / beta:.3g} that the penalty beta = {beta:g} does not reduce); "
        "the model is likely infeasible"
    )


def starting_point(compiled: CompiledModel, w0: Any, random_state: Any = None) -> np.ndarray:
    """The stacked starting point: zeros, an array, a dict of variable values, or
    ``"sphere"`` (uniform on the unit sphere, as in seed 000's experiments); projected
    onto dom(h), and moved inside the domain of terms whose gradient is infinite there
    (:func:`_into_gradient_domain`: ``kl_div(w, q)`` at ``w = 0``)."""
    layout = compiled.layout
    if w0 is None:
        x = np.zeros(layout.size)
    elif isinstance(w0, str):
        if w0 != "sphere":
            raise ModelError(f"w0 must be None, an array, a dict or 'sphere', got {w0!r}")
        rng = np.random.default_rng(random_state)
        x = rng.normal(size=layout.size)
        x /= np.linalg.norm(x)
    elif isinstance(w0, dict):
        by_name = {v.name(): v for v in layout.variables}
        values = {}
        for key, val in w0.items():
            var = by_name.get(key) if isinstance(key, str) else key
            if var is None or all(var is not v for v in layout.variables):
                raise ModelError(f"w0 names an unknown variable {key!r}")
            values[var] = val
        x = layout.stack(values)
    else:
        x = np.asarray(w0, dtype=float).ravel(order="F")
        shared = layout.shared_indices
        if x.size == shared.size and x.size != layout.size:  # party-owned blocks start at 0
            full = np.zeros(layout.size)
            full[shared] = x
            x = full
        if x.size != layout.size:
            raise ModelError(f"w0 has {x.size} entries; the model's variables have {layout.size}")
    if not np.all(np.isfinite(x)):
        raise ModelError("w0 contains NaN or inf")
    x = compiled.regularizer.project_domain(x)
    return _into_gradient_domain(compiled, x)


#: where a term's gradient is infinite at the starting point (the boundary of the domain
#: of ``kl_div``, ``entr``, ``log``: ``w = 0``), those coordinates start here instead
INTERIOR_START = 1.0


def _into_gradient_domain(compiled: CompiledModel, x: np.ndarray) -> np.ndarray:
    """``x`` with the coordinates where some party's objective or constraint gradient is not
    finite moved to :data:`INTERIOR_START` (then projected onto dom(h)), when that makes
    every gradient finite; otherwise ``x`` unchanged.

    ``kl_div(w, q)`` has gradient ``log(w / q) = -inf`` at ``w = 0``, the default start: the
    first subproblem's gradient is then infinite and a method reads its iterates as
    diverging ("unbounded" on a model with a finite optimum). Only structure is used: the
    coordinates moved are those whose gradient is infinite, not a guess of the solution.
    Models with no such term (:attr:`PartyProgram.restricted_domain`, structure only) are
    not evaluated: their gradients are finite everywhere. The evaluation runs on the
    programs the compiled model holds (in a deployment, the coordinator's stand-ins of the
    parties' data)."""
    if not any(p.restricted_domain for p in compiled.parties):
        return x  # (every term is defined everywhere: its gradient is finite)
    bad = _nonfinite_gradient(compiled, x)
    if not bad.any():
        return x
    y = x.copy()
    y[bad] = INTERIOR_START
    y = compiled.regularizer.project_domain(y)
    return y if not _nonfinite_gradient(compiled, y).any() else x


def _nonfinite_gradient(compiled: CompiledModel, x: np.ndarray) -> np.ndarray:
    """Coordinates where some party's objective gradient or constraint Jacobian (through a
    vector-Jacobian product with ones) is not finite at ``x``."""
    bad = np.zeros(x.size, dtype=bool)
    with np.errstate(all="ignore"):
        for p in compiled.parties:
            fn = p.functions
            try:
                grads = [fn.objective_and_grad(x)[1]]
                ones_i, ones_e = np.ones(p.m_ineq), np.ones(p.m_eq)
                if p.m_ineq or p.m_eq:
                    grads.append(fn.constraint_vjp(x, ones_i, ones_e))
            except (ValueError, FloatingPointError, ZeroDivisionError):
                continue
            for g in grads:
                bad |= ~np.isfinite(np.asarray(g, dtype=float))
    return bad


def split_multipliers(
    program: PartyProgram, mu: np.ndarray, nu: np.ndarray, cone: np.ndarray | None = None
) -> dict[str, np.ndarray]:
    """Multipliers of one party keyed by constraint label, shaped like each constraint
    (a cone constraint's ``lambda`` flattened like its vector ``E``, see
    :func:`fedmodel.dsl.conic.cone_vector`)."""
    out: dict[str, np.ndarray] = {}
    if not program.constraints:  # (no constraint, no cone: nothing to split)
        return out
    if program.cones:
        cone = np.zeros(program.m_cone) if cone is None else np.asarray(cone, dtype=float)
        offset = 0
        for c in program.cones:
            out[c.label] = cone[offset : offset + c.size].copy()
            offset += c.size
    for kind, vec in (("ineq", mu), ("eq", nu)):
        offset = 0
        for c in program.constraints:
            if c.kind != kind:
                continue
            piece = np.asarray(vec[offset : offset + c.size])
            out[c.label] = (
                piece.reshape(c.expr.shape, order="F") if c.expr.shape else piece.reshape(())
            )
            offset += c.size
    return out


def conic_note(compiled: CompiledModel) -> dict:
    """``res.extra`` entries of a model with terms that have no smooth form: which parties'
    subproblems take the conic path (cvxpy backend, cone constraints solved exactly)."""
    return {
        "conic_parties": compiled.conic_parties(),
        "conic_path": (
            "terms with no smooth form are cone constraints solved exactly by the cvxpy "
            "backend in their party's subproblem; the certificate uses their conic duals"
        ),
    }


def federated_evaluation(
    runtime, server_program, regularizer, x, mu0, nu0, local
) -> tuple[KKTResiduals, dict]:
    """One diagnostic round: every client evaluates its share at ``x`` with its own
    multipliers; the server adds its own and ``dh``.

    ``x`` is the server's view (shared variables, then its own); only the shared part is
    sent, and each party reports the stationarity of its own variables itself.
    """
    ns = server_program.layout.n_shared
    owned = server_program.layout.has_owned
    reports = {server_program.name: party_evaluation(server_program, x, mu0, nu0, owned)}
    replies = runtime.broadcast("evaluate", {"w": x[:ns]}, channel="diagnostic")
    reports.update({name: r.payload for name, r in replies.items()})
    return assemble(reports, regularizer, x[:ns], local)


def global_point(compiled: CompiledModel, shared_and_server: np.ndarray, owned: dict) -> np.ndarray:
    """The stacked point of the whole model from the server's view ``(shared, server's
    own)`` and each client's own block (``owned[name]``, NaN where one is missing)."""
    layout = compiled.layout
    if not layout.has_owned:
        return np.asarray(shared_and_server, dtype=float)
    x = np.full(layout.size, np.nan)
    server_view = layout.local(compiled.server.name)
    x[layout.indices(server_view.variables)] = shared_and_server
    for c in compiled.clients:
        own = layout.owned_by(c.name)
        if own and owned.get(c.name) is not None:
            x[layout.indices(own)] = owned[c.name]
    return x


def history_row(k: int, summary: dict, kkt: KKTResiduals, **extra) -> dict:
    return {
        "iteration": k,
        "objective": summary["objective"],
        "max_violation": summary["max_violation"],
        "stationarity": kkt.stationarity,
        "feasibility": kkt.feasibility,
        "scaled_stationarity": kkt.scaled_stationarity,
        "scaled_feasibility": kkt.scaled_feasibility,
        "constraints": summary["constraints"],
        **extra,
    }


def make_result(
    compiled: CompiledModel,
    *,
    method: str,
    status: str,
    x: np.ndarray,
    kkt: KKTResiduals | None,
    summary: dict,
    multipliers: dict,
    message: str = "",
    **fields_: Any,
) -> Result:
    layout = compiled.layout
    if np.all(np.isfinite(x)):
        layout.write_values(x)  # cvxpy convention: the solution lands in variable.value
    values = layout.unstack(x)
    solution = {v.name(): np.asarray(val) for v, val in values.items() if v.id not in layout.hidden}
    auxiliary = {v.name(): np.asarray(val) for v, val in values.items() if v.id in layout.hidden}
    if auxiliary:  # epigraph variables of non-smooth terms: there when asked for
        fields_["extra"] = {**(fields_.get("extra") or {}), "auxiliary": auxiliary}
    # a pooled solve (centralized, cprox-al) sends nothing: say so rather than leave it empty
    fields_["rounds"] = {"communication": 0, **(fields_.get("rounds") or {})}
    return Result(
        status=status,
        method=method,
        objective=float(summary["objective"]),
        max_violation=float(summary["max_violation"]),
        x=np.asarray(x, dtype=float),
        solution=solution,
        multipliers=user_duals(compiled, multipliers),
        program_multipliers=multipliers,
        kkt=kkt,
        message=message,
        **fields_,
    )


def user_duals(compiled: CompiledModel, multipliers: dict) -> dict[str, dict[str, np.ndarray]]:
    """The dual values of the constraints the user passed to ``subject_to``, per party and
    label, from the multipliers of the parties' programs (``multipliers[party][label]``,
    :func:`split_multipliers`), in cvxpy's convention
    (:meth:`~fedmodel.dsl.party.ConstraintTerm.user_dual`); each is also set as its
    constraint's ``dual_value`` (None for a party without multipliers)."""
    out: dict[str, dict[str, np.ndarray]] = {}
    for program in compiled.parties:
        own = multipliers.get(program.name)
        duals: dict[str, np.ndarray] = {}
        for term in program.constraints:
            if term.dual_map is None:
                continue
            value = None
            if own is not None and term.label in own:
                value = term.user_dual(own[term.label])
                duals[term.user_label] = value
            term.user_constraint.save_dual_value(value)
        if own is not None:
            out[program.name] = duals
    return out


def penalty_multipliers(program: PartyProgram, x: np.ndarray, penalty: float | None):
    """Multipliers implied by the quadratic penalty: ``beta [c(x)]_+`` and ``beta a(x)``."""
    if not program.constraints:
        return np.zeros(program.m_ineq), np.zeros(program.m_eq)
    ci, ce = program.functions.constraint_values(x)
    beta = float(penalty or 0.0)
    return beta * np.maximum(ci, 0.0), beta * ce


def evaluation_payload(program: PartyProgram, x: np.ndarray, penalty: float | None) -> dict:
    """A party's diagnostic report at ``x`` (its own data only), with the multipliers of the
    quadratic penalty (empty when the party has no constraints)."""
    mu, nu = penalty_multipliers(program, x, penalty)
    out = party_evaluation(program, x, mu, nu)
    out["mu_c"], out["nu_c"] = mu, nu
    return out


def pooled_certificate(compiled: CompiledModel, reports: dict[str, dict], x: np.ndarray):
    """KKT residuals of the original (pooled) model at ``x`` from the parties' reports."""
    return assemble(reports, compiled.regularizer, x, compiled.nonconvex)


class PenaltyClient(ClientHalf):
    """Base of the client halves of the methods that treat constraints by the quadratic
    penalty (``penalty=beta``: dald-cc, dald-dc, fedavg, fedprox, dgd): their multipliers
    are the penalty's at the last evaluated point ``last_w``, their ``evaluate`` reply adds
    them (``mu_c``, ``nu_c``), and ``snapshot`` returns the local model ``x``.

    Subclasses set ``penalty``, ``last_w`` (None) and ``x`` in their constructor and keep
    ``last_w`` in their ``state_fields``.
    """

    penalty: float | None = None
    last_w: np.ndarray | None = None
    x: np.ndarray | None = None

    def multipliers(self) -> tuple[np.ndarray, np.ndarray]:
        """The multipliers the quadratic penalty implies at the last evaluated model."""
        if self.last_w is None:
            return super().multipliers()
        return penalty_multipliers(self.program, self.last_w, self.penalty)

    def _on_evaluate(self, w):
        self.last_w = np.asarray(w, dtype=float)
        return evaluation_payload(self.program, self.last_w, self.penalty)

    def _on_snapshot(self):
        return {"x": None if self.x is None else self.x.copy()}


class PenaltyServer(ServerHalf):
    """Base of the server halves of the quadratic-penalty methods (``penalty=beta``): the
    server's multipliers are the penalty's at its :meth:`point` (the client halves'
    counterpart is :class:`PenaltyClient`)."""

    def multipliers(self) -> tuple[np.ndarray, np.ndarray]:
        """``beta [c_0(x)]_+`` and ``beta a_0(x)`` at the current point."""
        return penalty_multipliers(self.program, self.point(), self.options.penalty)


#: the statuses whose message :func:`status_message` writes (decided by the driver)
JUDGED = ("optimal", "inaccurate", "max_iterations")


def status_message(
    status: str,
    kkt: KKTResiduals,
    tolerance: str,
    *,
    rule: str,
    budget: str = "",
    hint: str = "",
    local: bool = False,
) -> str:
    """The message of a run whose status the driver has judged, in one wording for every
    method: what stopped it (``rule``: the method's stopping test; ``budget``: the cap
    reached) and what the recomputed certificate reads against ``tolerance``.

    Parameters
    ----------
    status : {"optimal", "inaccurate", "max_iterations"}
        The judged status.
    kkt : KKTResiduals
        The recomputed certificate.
    tolerance : str
        The tolerance in words, e.g. ``"eps = 1e-06"``.
    rule, budget : str
        The method's stopping test that held (``optimal``, ``inaccurate``), the cap reached
        (``max_iterations``), each with the method's own numbers.
    hint : str
        Why an uncertified point may be uncertified and what to change (``inaccurate``
        and ``max_iterations``).
    local : bool
        The certificate is a local one (non-convex terms).

    Examples
    --------
    >>> kkt = KKTResiduals(1e-7, 2e-8)
    >>> status_message("optimal", kkt, "eps = 1e-06", rule="||dx||_inf below tol")
    '||dx||_inf below tol; KKT certificate within eps = 1e-06 (stationarity 1.00e-07, \
feasibility 2.00e-08)'
    """
    if status == "optimal":
        text = f"{rule}; KKT certificate within {tolerance} ({kkt.describe()})"
        return text + (" (a local certificate: the model has non-convex terms)" if local else "")
    if status == "inaccurate":
        text = f"{rule} but the recomputed KKT residuals ({kkt.describe()}) exceed {tolerance}"
    elif status == "max_iterations":
        text = f"{budget} reached without meeting the stopping test (KKT {kkt.describe()})"
    else:
        raise ValueError(f"status_message: status {status!r} is not one of {JUDGED}")
    return text + (f": {hint}" if hint else "")


def step_budgets(runtime, names: list[str], deadline: float | None) -> dict[str, float]:
    """Seconds each client's step of a round may take (none without a ``deadline``, a
    ``time.perf_counter()`` value): what is left before the deadline, shared among the
    clients that run one after another on the same host (``runtime.placement``: all of
    them on the serial backend), so that the round ends by the deadline. Each party counts
    its budget on its own clock (:func:`~fedmodel.subproblems.merit.step_deadline`).

    Examples
    --------
    >>> import time
    >>> from types import SimpleNamespace
    >>> rt = SimpleNamespace(placement={"a": 0, "b": 0, "c": 1})
    >>> out = step_budgets(rt, ["a", "b", "c"], time.perf_counter() + 10.0)
    >>> round(out["a"]), round(out["c"])
    (5, 10)
    """
    field = budget_field(runtime, names, deadline)
    if field is None:
        return {}
    if isinstance(field, Rows):
        return dict(zip(names, field.values))
    return dict.fromkeys(names, field)


def budget_field(runtime, names: list[str], deadline: float | None) -> float | Rows | None:
    """:func:`step_budgets` as the ``budget`` field of a round's requests to ``names``
    (:meth:`~fedmodel.runtime.base.Runtime.broadcast_rows`): None without a ``deadline``,
    one value for all when the clients run on one host (``runtime.one_host``), else
    :class:`~fedmodel.runtime.rows.Rows` of each client's seconds."""
    if deadline is None:
        return None
    left = max(deadline - time.perf_counter(), 0.0)
    one_host = getattr(runtime, "one_host", None)
    if names and one_host is not None and one_host(names):  # (one share for all)
        return left / len(names)
    where = runtime.placement
    sharing = Counter(map(where.get, names))
    return Rows([left / sharing[where.get(n)] for n in names])
