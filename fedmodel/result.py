"""What every solve returns: status, solution, certificate, communication, timing."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fedmodel.certificate.kkt import KKTResiduals
from fedmodel.runtime.plaincodec import plain

STATUSES = (
    "optimal",  # the KKT tolerance was met
    "inaccurate",  # a solver finished but its certificate falls short of the tolerance
    "max_iterations",
    "time_limit",
    "infeasible",
    "unbounded",
    "solver_error",
    "client_failure",  # a client raised, timed out or died (see Result.failure)
    "interrupted",  # Ctrl-C during the solve
    "budget_spent",  # dp=...: another round would exceed the privacy budget (Result.privacy)
)


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
        Per party, per constraint label, the multiplier (array shaped like the constraint).
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
    ledger : list of dict
        Every message of the run: ``round``, ``sender``, ``receiver``, ``kind``,
        ``channel``, ``shapes`` (name -> shape of each payload entry), ``floats``,
        ``bytes``. :meth:`ledger_table` prints it; :meth:`ledger_frame` gives a pandas
        DataFrame.
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
    ledger: list[dict[str, Any]] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    failure: dict[str, Any] = field(default_factory=dict)
    checkpoint: str | None = None
    privacy: dict[str, Any] = field(default_factory=dict)

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

        return pd.DataFrame(self.ledger)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable record of the result."""
        return _jsonable(
            {
                "status": self.status,
                "method": self.method,
                "objective": self.objective,
                "max_violation": self.max_violation,
                "solution": self.solution,
                "multipliers": self.multipliers,
                "kkt": self.kkt.to_dict() if self.kkt else None,
                "rounds": self.rounds,
                "communication": self.communication,
                "timing": self.timing,
                "history": self.history,
                "message": self.message,
                "options": self.options,
                "failure": {k: v for k, v in self.failure.items() if k != "traceback"},
                "checkpoint": self.checkpoint,
                "privacy": self.privacy,
            }
        )

    def to_json(self, **kw) -> str:
        return json.dumps(self.to_dict(), **kw)

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
    non-finite number as its text); an object with ``to_dict`` through it, another by its
    text."""
    return plain(obj, lambda o: o.to_dict() if hasattr(o, "to_dict") else str(o))
