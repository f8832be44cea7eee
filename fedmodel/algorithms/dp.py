"""Privacy a run states: secure aggregation of the sum-only messages and client-level
differential privacy (docs/privacy.md).

:class:`DP` is the option ``dp=`` of a solve; :class:`PrivacyPlan` is what the driver
hands a server half (``server.privacy``) to collect its sum-only messages
(:meth:`PrivacyPlan.aggregate`, through
:func:`~fedmodel.runtime.secure_aggregation.aggregate`), spends the privacy budget round by
round on Google's ``dp-accounting`` RDP accountant, runs the certificate round on sums
(:meth:`PrivacyPlan.evaluate`) and reports what the run guaranteed (``res.privacy``).

**Differential privacy** is client-level, on the aggregated messages: each client's
vector of sum-only fields (in prox-al also its numeric clear scalars:
:attr:`~fedmodel.runtime.schema.Field.dp_summed`) is clipped to norm ``clip`` (scaled by
its aggregation weight),
and Gaussian noise of standard deviation ``noise_multiplier * clip`` is added to the sum
-- by the server without secure aggregation (the released iterates and result are
private; the server, which sees each clipped message, is trusted), and by the clients in
shares under secure aggregation (no party sees an unnoised sum). Every noised sum is one
Gaussian mechanism of sensitivity ``clip`` (add or remove one client); the accountant
composes them, and a run whose next round and certificate would exceed ``epsilon`` stops
with status ``"budget_spent"``. The noise multiplier, unless given, is the smallest whose
``max_rounds`` rounds (prox-al: ``max_outer`` sums) and one certificate round compose to
``epsilon``.

Examples
--------
>>> dp = DP(epsilon=3.0, delta=1e-5, clip=1.0)
>>> z = calibrate(dp, rounds=10)
>>> round(spent(z, 11, dp.delta), 6) <= 3.0
True
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedmodel.errors import ModelError, UnsupportedError
from fedmodel.runtime.messages import SERVER, Message
from fedmodel.runtime.secure_aggregation import (
    Aggregate,
    SecureAggregation,
    aggregate,
    as_secure_aggregation,
)
from fedmodel.runtime.wire import register_wire_type

#: the accountant's name in ``res.privacy``
ACCOUNTANT = "dp-accounting RDP (Gaussian mechanism, add/remove one client)"
#: the sender of what the server learns of a message under secure aggregation: the sums
SUMMED = "(clients' sum)"
#: the confidence of the certificate's bounds under noise
CONFIDENCE = 0.95


class BudgetSpent(Exception):
    """Another noised sum and the certificate would exceed the privacy budget: raised by
    :meth:`PrivacyPlan.reserve` where a server half collects, and turned by it into the
    status ``"budget_spent"``."""


@register_wire_type("dp")
@dataclass(frozen=True)
class DP:
    """Client-level differential privacy of a run (``dp=`` of a solve).

    Parameters
    ----------
    epsilon, delta : float
        The target: the run never spends more (``epsilon=inf``: clipping, no noise).
    clip : float
        Largest norm of one client's contribution to a sum (its model update in fedavg /
        fedprox, before its aggregation weight; in prox-al its whole numeric reply to a
        round: value, gradient, products and clear scalars together).
    noise_multiplier : float, optional
        Noise standard deviation over ``clip``; by default the smallest that lets
        ``max_rounds`` rounds and the certificate fit in ``epsilon``.
    certificate_clip : float, optional
        Clip of a client's certificate vector (objective, gradient, violations); default
        ``clip``.
    """

    epsilon: float
    delta: float
    clip: float
    noise_multiplier: float | None = None
    certificate_clip: float | None = None

    def __post_init__(self):
        if not (self.epsilon > 0):
            raise ModelError(f"dp: epsilon must be positive, got {self.epsilon!r}")
        if not (0 < self.delta < 1):
            raise ModelError(f"dp: delta must be in (0, 1), got {self.delta!r}")
        for name in ("clip", "noise_multiplier", "certificate_clip"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value > 0):
                raise ModelError(f"dp: {name} must be positive and finite, got {value!r}")


def spent(z: float, events: int, delta: float) -> float:
    """The epsilon of ``events`` Gaussian mechanisms of noise multiplier ``z`` at
    ``delta`` (dp-accounting's RDP accountant)."""
    from dp_accounting import dp_event, rdp

    if events == 0:
        return 0.0
    accountant = rdp.RdpAccountant()
    accountant.compose(dp_event.GaussianDpEvent(z), int(events))
    return float(accountant.get_epsilon(delta))


def calibrate(dp: DP, rounds: int) -> float:
    """The smallest noise multiplier (to 0.1%) whose ``rounds + 1`` mechanisms (the
    certificate's included) spend at most ``dp.epsilon``."""
    lo, hi = 1e-2, 1.0
    while spent(hi, rounds + 1, dp.delta) > dp.epsilon:
        lo, hi = hi, hi * 2
        if hi > 1e7:
            raise ModelError(f"dp: epsilon = {dp.epsilon:g} is out of reach in {rounds} rounds")
    while hi / lo > 1.001:
        mid = math.sqrt(lo * hi)
        lo, hi = (lo, mid) if spent(mid, rounds + 1, dp.delta) <= dp.epsilon else (mid, hi)
    return hi


#: the privacy options of a solve and their classes (given as a dict of the fields in plain
#: values: the command line's ``-o``, a deployment's run config)
PRIVACY_OPTIONS = {"dp": DP, "secure_aggregation": SecureAggregation}


def privacy_as_plain(options: dict[str, Any]) -> dict[str, Any]:
    """``options`` with a :class:`DP` or :class:`SecureAggregation` value as the dict of
    its fields (plain values, to travel as JSON); :func:`privacy_from_plain` reverses it.

    Examples
    --------
    >>> plain = privacy_as_plain({"dp": DP(epsilon=3.0, delta=1e-5, clip=1.0), "rho": 2.0})
    >>> plain["dp"]["epsilon"], privacy_from_plain(plain)["dp"] == DP(3.0, 1e-5, 1.0)
    (3.0, True)
    """
    from dataclasses import asdict

    return {
        k: asdict(v) if isinstance(v, tuple(PRIVACY_OPTIONS.values())) else v
        for k, v in options.items()
    }


def privacy_from_plain(options: dict[str, Any]) -> dict[str, Any]:
    """``options`` with ``dp`` and ``secure_aggregation`` given as dicts of their fields
    (``-o "dp={'epsilon': 3, 'delta': 1e-5, 'clip': 1}"``) as :class:`DP` and
    :class:`SecureAggregation`; a field they do not have is refused, naming the option."""
    out = dict(options)
    for name, cls in PRIVACY_OPTIONS.items():
        value = out.get(name)
        if isinstance(value, dict):
            try:
                out[name] = cls(**value)
            except TypeError as exc:
                raise ModelError(f"{name}: {exc} (given {value!r})") from None
    return out


class PrivacyPlan:
    """The privacy of one run: secure aggregation and differential privacy (module
    docstring). Built by the driver (:meth:`for_run`) and set as ``server.privacy``."""

    def __init__(self, secure: SecureAggregation | None, dp: DP | None, n_clients: int):
        self.secure = secure
        self.dp = dp
        self.n_clients = n_clients
        self.events = 0
        self.z = None if dp is None or math.isinf(dp.epsilon) else dp.noise_multiplier
        self.dropouts: list[dict[str, Any]] = []
        self.masked: set[str] = set()
        self.certificate: dict[str, Any] = {}
        self.last_round: int | None = None  # (the round of the last secure aggregation)
        #: every client's certificate feasibility and violation are 0 by the model's
        #: structure (:func:`violation_free`): the certificate reports 0, not their noised sum
        self.violation_free = False

    @property
    def active(self) -> bool:
        return self.secure is not None or self.dp is not None

    @classmethod
    def for_run(
        cls, options: Any, method: str, server: Any, n_clients: int, compiled: Any = None
    ) -> PrivacyPlan:
        """The plan of ``options.secure_aggregation`` and ``options.dp`` for ``server``,
        refusing a method whose messages the server uses other than as sums (naming the
        message) and a method that does not collect through the plan. ``compiled``: the
        model's partition, as the server holds it (the clients' terms, not their data)."""
        secure = as_secure_aggregation(getattr(options, "secure_aggregation", False))
        dp = getattr(options, "dp", None)
        if dp is not None and not isinstance(dp, DP):
            raise ModelError(
                f"dp must be a fedmodel.DP(epsilon=..., delta=..., clip=...), got {dp!r}"
            )
        plan = cls(secure, dp, n_clients)
        if not plan.active:
            return plan
        if compiled is not None:
            plan.violation_free = all(violation_free(c) for c in compiled.clients)
        if dp is not None and (options.checkpoint is not None or options.resume is not None):
            raise ModelError(
                f"{method}: dp with checkpoint or resume: a checkpoint does not carry the "
                "privacy spent, so a resumed run could exceed epsilon"
            )
        what = "secure_aggregation" if dp is None else "dp"
        table = server.messages
        takes = getattr(server, "private_aggregation", ())
        available = UnsupportedError(
            f"{method}: {what} is available for the methods whose server collects its "
            "messages as sums (secure_aggregation and dp: fedavg, fedprox, prox-al)"
        )
        if takes and what not in takes:
            raise available
        for kind, fields in table.per_client(method) if table is not None else ():
            if not fields:
                raise UnsupportedError(
                    f"{method}: {what} needs every message to be a sum over clients, but "
                    f"{kind!r} is a {table[kind].direction} message"
                )
            raise UnsupportedError(
                f"{method}: {what} needs every message to be a sum over clients, but the "
                f"server reads {kind!r} ({', '.join(fields)}) client by client"
            )
        if table is None or what not in takes:
            raise available
        if secure is not None and n_clients < 3:
            raise UnsupportedError(f"{method}: secure aggregation needs at least 3 clients")
        if dp is not None and not math.isinf(dp.epsilon) and plan.z is None:
            plan.z = calibrate(dp, int(server.max_steps))
        if plan.z is not None and not plan.affords(1):
            raise ModelError(
                f"{method}: dp with noise_multiplier = {plan.z:g} spends "
                f"epsilon = {spent(plan.z, 2, dp.delta):.3g} on one round and the certificate, "
                f"more than epsilon = {dp.epsilon:g}: raise noise_multiplier or leave it unset"
            )
        if secure is not None:
            eps = min(options.eps1, options.eps2) if hasattr(options, "eps") else 1e-3
            resolution = secure.resolution(n_clients)
            if resolution > 1e-3 * eps:
                raise ModelError(
                    f"{method}: secure aggregation's rounding error {resolution:.1e} is not "
                    f"far below eps = {eps:g}: lower SecureAggregation(range=...)"
                )
        return plan

    # -- sums ------------------------------------------------------------------------------
    def aggregate(self, runtime, kind: str, payload, clip=None, whole=False) -> Aggregate:
        """The sums over the live clients of ``kind``'s sum-only fields; with ``dp``,
        ``clip`` (per client: the bound of its weighted contribution) and the mechanism's
        noise, one event for the accountant; ``whole``: over every client (a dropout is
        asked again, else stops the run: see
        :func:`~fedmodel.runtime.secure_aggregation.aggregate`)."""
        if self.dp is None:
            clip = None
        if self.secure is not None:
            # (a party answers each kind once per round, refusing a replay -- a second
            # masked stage under the same masks would reveal a difference of messages --
            # so a second aggregation in one round takes the next round)
            if self.last_round == runtime.round:
                runtime.next_round()
            self.last_round = runtime.round
        noise = 0.0
        if clip is not None and self.z is not None:
            names = runtime.alive
            top = max(clip(n) if callable(clip) else clip for n in names)
            noise = self.z * top
        out = aggregate(
            runtime, kind, payload, secure=self.secure, clip=clip, noise=noise, whole=whole
        )
        if clip is not None:
            self.events += 1
        if self.secure is not None:
            self.masked.add(kind)
        if out.dropped:
            self.dropouts.append({"round": runtime.round, "kind": kind, "clients": out.dropped})
        if out.late:
            self.dropouts.append(
                {"round": runtime.round, "kind": kind, "clients": out.late, "late_reply": True}
            )
        return out

    def collect(self, runtime, kind: str, payload) -> dict[str, Message]:
        """The replies to ``kind`` as the server knows them: without secure aggregation
        and dp every client's (a broadcast); under either one reply from :data:`SUMMED`
        holding the sums of the sum-only fields (a scalar as a float, a field no client
        sent left out) and one per participant holding only its unmasked scalars. A server
        half that reads sums and the unmasked scalars' maxima over these replies runs the
        same with secure aggregation on or off (prox-al).

        Under dp each client's vector of numeric fields -- the sum-only ones and its
        unmasked scalars, which then travel in the sum rather than in the clear -- is
        clipped to ``dp.clip``, the sum is noised (one mechanism for the accountant), and
        :class:`BudgetSpent` is raised first when the budget does not afford it and the
        certificate."""
        if self.secure is None and self.dp is None:
            return runtime.broadcast(kind, payload)
        clip = None
        if self.dp is not None:
            self.reserve()
            clip = self.dp.clip
        out = self.aggregate(runtime, kind, payload, clip=clip, whole=True)
        spec = runtime.messages[kind]
        replies = {
            name: Message(kind, name, SERVER, dict(out.clear.get(name, {})), runtime.round)
            for name in out.participants
        }
        summed = {}
        for name, value in out.sums.items():
            field = spec.reply.get(name)
            if field is None:  # (a field of the clients' table this run does not use)
                continue
            if field.shape == ():
                summed[name] = float(value.sum())
            elif value.size:
                summed[name] = value
        replies[SUMMED] = Message(kind, SUMMED, SERVER, summed, runtime.round)
        return replies

    @property
    def epsilon(self) -> float:
        """The privacy spent so far (0 without dp; inf with dp at epsilon = inf)."""
        if self.dp is None:
            return 0.0
        if self.z is None:
            return math.inf
        return spent(self.z, self.events, self.dp.delta)

    def affords(self, more: int) -> bool:
        """Whether ``more`` mechanisms and the certificate's stay within the budget."""
        if self.dp is None or self.z is None:
            return True
        return spent(self.z, self.events + more + 1, self.dp.delta) <= self.dp.epsilon * (1 + 1e-9)

    def reserve(self) -> None:
        """Raise :class:`BudgetSpent` unless one more mechanism and the final certificate
        stay within the budget (the check before a noised sum a method takes mid-run)."""
        if not self.affords(1):
            raise BudgetSpent(
                f"the privacy budget (epsilon = {self.dp.epsilon:g}) is spent after "
                f"{self.events} noised sums (another and the certificate would exceed it)"
            )

    # -- the certificate round -------------------------------------------------------------
    def evaluate(self, runtime, payload: dict, names: list[str], d: int) -> dict[str, dict]:
        """The certificate round on sums: the clients' ``evaluate`` replies as the server
        knows them -- one report ``"(clients' sum)"`` holding the sums of the sum-only
        fields (with dp also of the violations, noised), and per client only its unmasked
        scalars (without dp) -- for :func:`~fedmodel.certificate.kkt.assemble`."""
        clip = None
        if self.dp is not None:
            clip = self.dp.certificate_clip or self.dp.clip
        out = self.aggregate(runtime, "evaluate", payload, clip=clip, whole=True)
        sums = out.sums
        empty = np.zeros(0)
        reports = {}
        for name in names:
            clear = out.clear.get(name, {})
            reports[name] = {
                "objective": 0.0,
                "grad": np.zeros(d),
                "feasibility": clear.get("feasibility", 0.0),
                "violation": clear.get("violation", 0.0),
                "c_ineq": empty,
                "c_eq": empty,
            }
        # (under dp, on a model whose clients cannot violate anything, the noised sums of
        # their zeros, violations and complementarity gaps, are dropped for the structural 0: see
        # violation_free)
        exact_zero = self.dp is not None and self.violation_free
        total = {
            "objective": float(sums["objective"].sum()),
            "grad": np.asarray(sums["grad"], dtype=float),
            "feasibility": _summed(sums, "feasibility", exact_zero),
            "violation": _summed(sums, "violation", exact_zero),
            "c_ineq": empty,
            "c_eq": empty,
        }
        if "complementarity_gap" in sums and sums["complementarity_gap"].size and not exact_zero:
            total["complementarity_gap"] = float(sums["complementarity_gap"].sum())
        reports[SUMMED] = total
        if self.dp is not None and self.z is not None:
            self.certificate = {
                "noise_std": self.z * clip,
                "confidence": CONFIDENCE,
                "stationarity_margin": self.noise_bound(d, clip),
                "feasibility_margin": 0.0 if exact_zero else self.noise_bound(1, clip),
            }
        return reports

    def noise_bound(self, entries: int = 1, clip: float | None = None) -> float:
        """The :data:`CONFIDENCE` upper bound of the largest ``|noise|`` over ``entries``
        entries of one noised sum (a union bound over Gaussian tails of standard deviation
        ``noise_multiplier * clip``; ``clip`` by default ``dp.clip``); 0 without noise."""
        if self.dp is None or self.z is None:
            return 0.0
        sigma = self.z * (self.dp.clip if clip is None else clip)
        return sigma * math.sqrt(2 * math.log(2 * max(1, entries) / (1 - CONFIDENCE)))

    def conclude(self, status: str, message: str, kkt, options: Any):
        """Under dp, ``"optimal"`` stands only when the residuals plus their margins (the
        confidence bounds of the noise) meet the tolerance (``options.eps1``, ``eps2``)."""
        if self.dp is None or not self.certificate or status != "optimal" or kkt is None:
            return status, message
        eps1, eps2 = options.eps1, options.eps2
        stat = kkt.stationarity + self.certificate["stationarity_margin"]
        feas = kkt.feasibility + self.certificate["feasibility_margin"]
        if stat <= eps1 and feas <= eps2:
            return status, message
        return "inaccurate", (
            f"{message}; under dp the residuals are noisy: their {CONFIDENCE:.0%} upper bounds "
            f"(stationarity {stat:.2e}, feasibility {feas:.2e}) do not meet the tolerance"
        )

    def record(self) -> dict[str, Any]:
        """``res.privacy``."""
        n = self.n_clients
        sa: dict[str, Any] = {"on": self.secure is not None}
        if self.secure is not None:
            sa.update(
                messages=sorted(self.masked),
                protocol="SecAgg+ (flwr primitives)",
                range=self.secure.range,
                resolution=self.secure.resolution(n),
                threshold=self.secure.threshold_count(n),
                dropouts=list(self.dropouts),
            )
        out: dict[str, Any] = {
            "secure_aggregation": sa,
            "epsilon": self.epsilon,
            "delta": 0.0 if self.dp is None else self.dp.delta,
            "accountant": None if self.dp is None else ACCOUNTANT,
        }
        if self.dp is not None:
            out.update(
                target_epsilon=self.dp.epsilon,
                clip=self.dp.clip,
                noise_multiplier=self.z,
                mechanisms=self.events,
                noise="distributed (client shares)" if self.secure else "central (server)",
                certificate=dict(self.certificate),
            )
        return out


def _summed(sums: dict[str, np.ndarray], name: str, exact_zero: bool) -> float:
    return 0.0 if exact_zero or name not in sums else float(sums[name].sum())


def violation_free(program: Any) -> bool:
    """Whether a client's certificate reports feasibility, violation and complementarity gap 0
    at every point, whatever its data: its program has no constraint of any kind (its
    own, the epigraph pieces of its objective terms, cones) and none of its objective
    terms has a domain that depends on the variables (outside one, the certificate
    reports the distance to it). Then its feasibility residual is the distance of an
    empty vector of constraint values to its normal cone, its violation the largest of
    none and its complementarity gap a sum over no rows: 0, a function of the terms'
    structure alone, which the server holds in its compiled partition without any
    message. Under dp the certificate reports that 0 rather than a noised sum of zeros: a
    release that does not depend on any client's data costs no privacy, and the noise
    drawn on those entries of the certificate's sum is discarded (post-processing); the
    certificate's one Gaussian mechanism, for the objective and gradient, is spent as
    before. (Where such a term overflows to infinity, far out, the client's evaluation
    reports the point 1 away from its domain; under dp that report is among the entries
    dropped.)

    Examples
    --------
    >>> import cvxpy as cp, numpy as np, fedmodel as fm
    >>> m = fm.Model("ls")
    >>> w = m.variable(2, name="w")
    >>> a, b = m.client("a"), m.client("b")
    >>> a.minimize(cp.sum_squares(a.data(np.ones((3, 2)), "A") @ w - 1) / 6)
    >>> b.minimize(cp.sum_squares(w))
    >>> _ = b.subject_to(cp.sum(w) <= 1)
    >>> [violation_free(c) for c in m.compile().clients]
    [True, False]
    """
    if program.constraints:
        return False
    for term in program.objective:
        expr = term.source if term.source is not None else term.expr
        if any(con.variables() for con in getattr(expr, "domain", [])):
            return False
    return True


def describe(privacy: dict[str, Any]) -> str:
    """``res.privacy`` in one line (the command line's summary).

    Examples
    --------
    >>> describe({"secure_aggregation": {"on": True, "messages": ["fed_round"]},
    ...           "epsilon": 1.5, "delta": 1e-5, "accountant": ACCOUNTANT})
    'secure aggregation of fed_round; epsilon 1.5 at delta 1e-05 spent (dp-accounting RDP)'
    """
    sa = privacy.get("secure_aggregation", {})
    parts = [
        "secure aggregation of " + ", ".join(sa.get("messages", []))
        if sa.get("on")
        else "no secure aggregation"
    ]
    if privacy.get("accountant"):
        parts.append(
            f"epsilon {privacy['epsilon']:.3g} at delta {privacy['delta']:g} spent "
            "(dp-accounting RDP)"
        )
    return "; ".join(parts)
