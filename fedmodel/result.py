"""What every solve returns: status, solution, certificate, communication, timing."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from fedmodel.certificate.kkt import KKTResiduals
from fedmodel.runtime.plaincodec import plain


class StatusInfo(NamedTuple):
    """What a status means and what to do about it (:data:`STATUSES`)."""

    meaning: str
    action: str


#: Every status a solve returns, for every method (federated and pooled alike), with its
#: meaning and what to do. ``res.message`` says, for the run at hand, which test or limit
#: ended it and with what numbers.
STATUSES: dict[str, StatusInfo] = {
    "optimal": StatusInfo(
        "the recomputed KKT certificate meets the tolerance eps (scaled residuals): a "
        "relative gap and violation of order eps on a convex model, an approximate KKT "
        "point on a non-convex one",
        "use the result",
    ),
    "inaccurate": StatusInfo(
        "the method's stopping test held, or a solver finished, but the recomputed "
        "certificate falls short of eps",
        "read res.kkt; lower eps, raise the method's iteration caps, or compare with "
        "method='centralized'",
    ),
    "max_iterations": StatusInfo(
        "the method's iteration cap (max_outer, max_inner, max_steps, ...) was reached "
        "before its stopping test held",
        "raise the cap or resume from a checkpoint; res.message says whether the "
        "certificate already holds",
    ),
    "time_limit": StatusInfo(
        "time_limit seconds passed; the last iterate is returned with its certificate",
        "raise time_limit, or resume from the checkpoint named in res.message",
    ),
    "infeasible": StatusInfo(
        "the constraints admit no common point, with the solver's infeasibility certificate "
        "(prox-al, cprox-al: a Farkas certificate checked on each party's terms, its proven "
        "radius in res.extra['certificate'])",
        "relax or correct the constraints; res.message names the solver that proved it",
    ),
    "unbounded": StatusInfo(
        "the objective falls without bound over the feasible set (the solver's certificate, "
        "a feasible ray along which f + h keeps falling checked on each party's terms, or "
        "f + h falling along diverging feasible iterates)",
        "add the missing constraint or regularisation (a bound, a norm budget)",
    ),
    "diverging": StatusInfo(
        "a federated method's multipliers grow while the violation settles at a positive "
        "level (a plateau of beta x violation): the model is likely infeasible, not proven",
        "check the constraints; method='centralized' gives the pooled solver's certificate",
    ),
    "stalled": StatusInfo(
        "the iteration stopped making progress (an inner solver without decrease, a "
        "non-finite or blown-up step, a plateau of the multiplier steps) away from a "
        "certified point",
        "follow res.message (another inner solver, a smaller beta, a starting point in the "
        "domain), or compare with method='centralized'",
    ),
    "solver_error": StatusInfo(
        "a local or pooled solver failed and returned no usable point",
        "read res.message; try another engine or solver option",
    ),
    "client_failure": StatusInfo(
        "a client raised, timed out or died (see res.failure); the run stopped",
        "fix the client, or set a failure policy (on_failure=...) and resume",
    ),
    "interrupted": StatusInfo(
        "Ctrl-C during the solve; the last iterate is returned",
        "resume from a checkpoint (checkpoint=..., resume=...)",
    ),
    "budget_spent": StatusInfo(
        "dp=...: another round would exceed the privacy budget; the last iterate is "
        "returned with its noisy certificate (res.privacy)",
        "raise epsilon or max_rounds' share of it, or accept the point (docs/privacy.md)",
    ),
}


def relative_difference(value: float, reference: float) -> float:
    """``|value - reference| / max(|reference|, 1e-12)``."""
    return float(abs(value - reference) / max(abs(reference), 1e-12))


@dataclass
class Comparison:
    """``res.compare(ref)``: how far one result is from another (usually the reference)."""

    method: str
    reference_method: str
    objective: float
    reference_objective: float
    relative_objective_difference: float
    solution_distance: float
    max_violation: float
    reference_max_violation: float
    kkt: KKTResiduals | None
    reference_kkt: KKTResiduals | None

    def to_dict(self) -> dict:
        d = {k: v for k, v in self.__dict__.items() if k not in ("kkt", "reference_kkt")}
        d["kkt"] = self.kkt.to_dict() if self.kkt else None
        d["reference_kkt"] = self.reference_kkt.to_dict() if self.reference_kkt else None
        return d

    def __str__(self) -> str:
        def k(r, attr):
            return f"{getattr(r, attr):.2e}" if r is not None else "n/a"

        rows = [
            ("", self.method, self.reference_method),
            ("objective", f"{self.objective:.8g}", f"{self.reference_objective:.8g}"),
            ("max violation", f"{self.max_violation:.2e}", f"{self.reference_max_violation:.2e}"),
            (
                "KKT stationarity",
                k(self.kkt, "stationarity"),
                k(self.reference_kkt, "stationarity"),
            ),
            ("KKT feasibility", k(self.kkt, "feasibility"), k(self.reference_kkt, "feasibility")),
        ]
        w0 = max(len(r[0]) for r in rows)
        w1 = max(len(r[1]) for r in rows)
        lines = [f"{a:<{w0}}  {b:>{w1}}  {c:>14}" for a, b, c in rows]
        lines.append(f"relative objective difference: {self.relative_objective_difference:.3e}")
        lines.append(f"solution distance (inf-norm):  {self.solution_distance:.3e}")
        return "\n".join(lines)

    __repr__ = __str__


@dataclass
class Result:
    """The outcome of ``model.solve``.

    Attributes
    ----------
    status : str
        One of :data:`STATUSES`. ``"optimal"`` means the KKT tolerance was met.
    method : str
    objective : float
        ``f(w) + h(w)`` at the returned point.
    max_violation : float
        Largest constraint violation at the returned point.
    x : ndarray
        The stacked solution; :attr:`solution` gives it per variable.
    multipliers : dict
        Per party, per label of a constraint the user passed to ``subject_to``, its dual
        value in cvxpy's convention (shaped like the constraint; ``>= 0`` for an
        inequality; for an equality ``lhs == rhs`` the multiplier of ``lhs - rhs`` in the
        Lagrangian ``f + sum mu_j (lhs_j - rhs_j)``); the same value is set as that
        constraint's ``dual_value``. Empty for a method without multipliers.
    program_multipliers : dict
        Per party, per row block of the compiled program, the multipliers the certificate
        measured: the user's constraints as normalised (``g(w) <= 0``, split max-type rows,
        cone blocks) and the internal rows of epigraph and cone forms
        (``"objective[0]:epigraph[0]"``, ...), which have no counterpart in the model as
        written.
    kkt : KKTResiduals or None
        Residuals of seed 000 Definition 1 recomputed at the returned ``(w, mu)``.
    rounds : dict
        ``outer`` iterations, ``inner`` iterations in all, ``communication`` rounds.
    communication : dict
        Messages and floats, up and down, in all and per party (algorithm traffic only;
        ``communication["diagnostic"]`` holds the monitoring traffic).
    timing : dict
        ``compile`` and ``solve`` seconds, ``per_party`` solve seconds.
    history : list of dict
        Per outer iteration: objective, max violation, each party's constraint values,
        KKT residuals, inner iterations.
    message : str
        Human-readable explanation of the status (and remedies when it is not optimal).
    ledger : sequence of dict
        Every message of the run: ``round``, ``sender``, ``receiver``, ``kind``,
        ``channel``, ``shapes`` (name -> shape of each payload entry), ``floats``,
        ``bytes`` (a :class:`~fedmodel.runtime.messages.LedgerRows`, read like a list of
        those dicts; ``list(res.ledger)`` is one). :meth:`ledger_table` prints it;
        :meth:`ledger_frame` gives a pandas DataFrame.
    failure : dict
        With status ``"client_failure"``: ``client`` (the first failed client),
        ``clients``, ``error``, ``kind`` (``"raised"``, ``"timeout"``, ``"dead"``),
        ``round``, ``message_kind`` and the client's ``traceback``.
    checkpoint : str or None
        Directory of the last checkpoint written by this solve.
    privacy : dict
        What the run guaranteed (docs/privacy.md): ``secure_aggregation`` (on or off, the
        masked messages, range, resolution, threshold, dropouts), ``epsilon`` and
        ``delta`` spent, ``accountant``, and under ``dp`` the noise and the certificate's
        confidence bounds; empty for a pooled solve.
    """

    status: str
    method: str
    objective: float
    max_violation: float
    x: np.ndarray
    solution: dict[str, np.ndarray]
    multipliers: dict[str, dict[str, np.ndarray]]
    kkt: KKTResiduals | None
    rounds: dict[str, int] = field(default_factory=dict)
    communication: dict[str, Any] = field(default_factory=dict)
    timing: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    message: str = ""
    options: dict[str, Any] = field(default_factory=dict)
    ledger: Sequence[dict[str, Any]] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    failure: dict[str, Any] = field(default_factory=dict)
    checkpoint: str | None = None
    privacy: dict[str, Any] = field(default_factory=dict)
    program_multipliers: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(
                f"status {self.status!r} is not one of fedmodel.STATUSES {tuple(STATUSES)}"
            )

    @property
    def is_optimal(self) -> bool:
        return self.status == "optimal"

    def compare(self, other: Result) -> Comparison:
        """Compare with another result (typically the centralized reference).

        Examples
        --------
        >>> # res = model.solve("prox-al"); ref = model.solve("centralized")
        >>> # print(res.compare(ref))
        """
        if self.x.shape != other.x.shape:
            raise ValueError("results of different models cannot be compared")
        return Comparison(
            method=self.method,
            reference_method=other.method,
            objective=self.objective,
            reference_objective=other.objective,
            relative_objective_difference=relative_difference(self.objective, other.objective),
            solution_distance=float(np.abs(self.x - other.x).max(initial=0.0)),
            max_violation=self.max_violation,
            reference_max_violation=other.max_violation,
            kkt=self.kkt,
            reference_kkt=other.kkt,
        )

    def ledger_table(
        self,
        channel: str | None = None,
        limit: int | None = 50,
        party: str | None = None,
    ) -> str:
        """The message ledger as a text table (one row per message).

        Parameters
        ----------
        channel : str, optional
            Only ``"algorithm"``, ``"diagnostic"`` or ``"local"`` messages.
        limit : int or None
            Rows shown (the first ``limit``; None for all).
        party : str, optional
            Only messages sent or received by this party.
        """
        rows = [
            r
            for r in self.ledger
            if (channel is None or r.get("channel") == channel)
            and (party is None or party in (r.get("sender"), r.get("receiver")))
        ]
        shown = rows if limit is None else rows[:limit]
        head = ("round", "sender", "receiver", "kind", "channel", "shapes", "floats", "bytes")

        def shapes(r):
            return ", ".join(
                f"{k}{list(v) if v else '()'}" for k, v in (r.get("shapes") or {}).items()
            )

        table = [head] + [
            (
                str(r["round"]),
                str(r["sender"]),
                str(r["receiver"]),
                str(r["kind"]),
                str(r.get("channel", "")),
                shapes(r),
                str(r["floats"]),
                str(r["bytes"]),
            )
            for r in shown
        ]
        widths = [max(len(row[i]) for row in table) for i in range(len(head))]
        lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in table]
        lines.insert(1, "  ".join("-" * w for w in widths))
        if len(rows) > len(shown):
            lines.append(f"... {len(rows) - len(shown)} more messages")
        total = sum(r["bytes"] for r in rows)
        lines.append(f"{len(rows)} messages, {total} bytes")
        return "\n".join(lines)

    def ledger_frame(self):
        """The ledger as a pandas DataFrame (needs pandas: ``pip install pandas``)."""
        try:
            import pandas as pd
        except ModuleNotFoundError:
            raise ModuleNotFoundError(
                "Result.ledger_frame() needs pandas (pip install pandas, or the extra "
                "fedmodel[pandas]); Result.ledger_table() prints the same rows without it"
            ) from None

        return pd.DataFrame(list(self.ledger))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable record of the result (:meth:`from_dict` reads it back)."""
        return _jsonable(
            {
                "status": self.status,
                "method": self.method,
                "objective": self.objective,
                "max_violation": self.max_violation,
                "x": self.x,
                "solution": self.solution,
                "multipliers": self.multipliers,
                "program_multipliers": self.program_multipliers,
                "kkt": self.kkt.to_dict() if self.kkt else None,
                "rounds": self.rounds,
                "communication": self.communication,
                "timing": self.timing,
                "history": self.history,
                "message": self.message,
                "options": self.options,
                "extra": self.extra,
                "failure": {k: v for k, v in self.failure.items() if k != "traceback"},
                "checkpoint": self.checkpoint,
                "privacy": self.privacy,
            }
        )

    def to_json(self, **kw) -> str:
        """The result as JSON text (:meth:`to_dict`); :meth:`from_json` reads it back.

        Examples
        --------
        >>> import cvxpy as cp, fedmodel as fm
        >>> model = fm.Model()
        >>> w = model.variable(2, name="w")
        >>> model.client("site0").minimize(cp.sum_squares(w - 1))
        >>> res = model.solve(method="centralized")
        >>> back = fm.Result.from_json(res.to_json())
        >>> back.status, back.solution["w"].round(6).tolist()
        ('optimal', [1.0, 1.0])
        """
        return json.dumps(self.to_dict(), **kw)

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> Result:
        """The :class:`Result` a :meth:`to_dict` record describes: arrays (the solution,
        the multipliers, ``x``) as float arrays, non-finite numbers written as text
        (``"nan"``, ``"inf"``) as floats, the certificate as :class:`KKTResiduals`. The
        ledger is not part of the record (``ledger`` is empty)."""
        kkt = record.get("kkt")
        if kkt is not None:
            kkt = KKTResiduals(
                stationarity=_number(kkt["stationarity"]),
                feasibility=_number(kkt["feasibility"]),
                per_party={k: _number(v) for k, v in (kkt.get("per_party") or {}).items()},
                local=bool(kkt.get("local", False)),
                scaled_stationarity=_number(kkt.get("scaled_stationarity")),
                scaled_feasibility=_number(kkt.get("scaled_feasibility")),
            )
        return cls(
            status=record["status"],
            method=record["method"],
            objective=_number(record["objective"]),
            max_violation=_number(record["max_violation"]),
            x=np.asarray(record.get("x", []), dtype=float),
            solution={k: np.asarray(v, dtype=float) for k, v in record["solution"].items()},
            multipliers=_arrays(record.get("multipliers") or {}),
            program_multipliers=_arrays(record.get("program_multipliers") or {}),
            kkt=kkt,
            rounds=dict(record.get("rounds") or {}),
            communication=dict(record.get("communication") or {}),
            timing=dict(record.get("timing") or {}),
            history=list(record.get("history") or []),
            message=record.get("message", ""),
            options=dict(record.get("options") or {}),
            extra=dict(record.get("extra") or {}),
            failure=dict(record.get("failure") or {}),
            checkpoint=record.get("checkpoint"),
            privacy=dict(record.get("privacy") or {}),
        )

    @classmethod
    def from_json(cls, text: str) -> Result:
        """The :class:`Result` that :meth:`to_json` wrote as ``text`` (see :meth:`from_dict`)."""
        return cls.from_dict(json.loads(text))

    def plot(self, **kw):
        """Plot the convergence history (objective gap to ``reference=``, max violation,
        KKT residuals against communication rounds); see :func:`fedmodel.plots.plot_result`
        for the keywords (``reference``, ``ax``, ``path``, ``title``). Needs matplotlib
        (``pip install 'fedmodel[plots]'``)."""
        from fedmodel.plots import plot_result

        return plot_result(self, **kw)

    def __repr__(self) -> str:
        kkt = f", kkt={self.kkt!r}" if self.kkt else ""
        private = ""
        if self.privacy:
            sa = self.privacy.get("secure_aggregation", {})
            private = (
                f", privacy=(secure_aggregation={'on' if sa.get('on') else 'off'}, "
                f"epsilon={self.privacy.get('epsilon')}, delta={self.privacy.get('delta')})"
            )
        return (
            f"Result(method={self.method!r}, status={self.status!r}, "
            f"objective={self.objective:.8g}, max_violation={self.max_violation:.2e}{kkt}, "
            f"rounds={self.rounds}{private})"
        )


def _jsonable(obj: Any) -> Any:
    """``obj`` as plain JSON values (:func:`fedmodel.runtime.plaincodec.plain`: a
    non-finite number as its text); a set as its sorted list, an object with ``to_dict``
    through it, another by its text."""
    return plain(obj, _other)


def _other(obj: Any) -> Any:
    if isinstance(obj, (set, frozenset)):
        return sorted(obj, key=str)
    return obj.to_dict() if hasattr(obj, "to_dict") else str(obj)


def _number(value: Any) -> float | None:
    """A number of a :meth:`Result.to_dict` record (non-finite ones are written as text)."""
    return None if value is None else float(value)


def _arrays(per_party: dict[str, dict[str, Any]]) -> dict[str, dict[str, np.ndarray]]:
    return {
        party: {label: np.asarray(v, dtype=float) for label, v in values.items()}
        for party, values in per_party.items()
    }
