"""The server half of fair-vfl and fedbcd (seed 002, Algorithm 2), run by the common driver.

The server holds the labels, the groups, the multipliers ``lambda``, the latest partial
scores each party published and their sum, the full scores ``z = sum_k X_k theta_k``. One
:meth:`VFLServer.step` is one communication round ``t`` in the order of eq. (9) and the
prose (notes 3.4): with ``z = X theta^(t)`` in hand,

1. (``t >= 1``, fair-vfl only) ``lambda^(t) = [lambda^(t-1) + alpha grad_lambda
   f~_{t-1}(theta^(t), lambda^(t-1))]_+`` (7), (9), ``alpha = beta`` or ``1/beta``;
2. send ``z`` and ``lambda^(t)`` to every idle party; they make their local updates;
3. receive the partial scores ``X_k theta_k^(t+1)`` and form ``X theta^(t+1)``.

fedbcd is the same round with ``lambda = 0`` held fixed and not sent.

**Asynchrony** (option ``delays``): party ``k``'s reply to the job it gets in round ``t``
counts in the server's sum from the end of round ``t + d_k``; until then the server keeps
its previous partial scores (the others compute on those stale scores) and does not send
the busy party anything; the party gets its next job in round ``t + d_k + 1``. The
schedule depends on the delays only, so every backend gives the same iterates; with all
``d_k = 0`` it is the synchronous round above.

**Real asynchrony** (option ``asynchronous=True``): each round the server posts ``z`` and
``lambda`` to every idle party (:meth:`~fedmodel.runtime.base.Runtime.post`), then takes the
replies that are ready (:meth:`~fedmodel.runtime.base.Runtime.poll`, at least
``min_replies``) and goes on: a party still computing keeps its last published block in the
sum (the others and ``lambda`` use it stale), and its reply, computed from the scores of the
round it was posted in, counts in the round it arrives. On the processes and Ray runtimes
the parties compute while the server runs rounds; on the serial runtime every reply is
ready at once (the synchronous iterates, deterministic). Before a monitored round (the gap,
the history), a checkpoint and the certificate the server drains the work in flight
(:meth:`quiesce`): those are consistent points, and the only ones where the driver marks the
parties' states (a failure returns to the last of them).

Every reply used is logged (``state["replies"]``: round received, party, round posted; the
staleness is the difference) and summarised in ``res.extra["asynchrony"]``.

It runs on :func:`fedmodel.algorithms.driver.run_federated` without a compiled model: it
supplies the checkpoint fingerprint, the evaluation round (the local KKT certificate of
notes 6.2 from the parties' block gradients) and the :class:`~fedmodel.result.Result`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fedmodel.algorithms.common import status_message
from fedmodel.algorithms.protocol import ServerHalf, StepReport
from fedmodel.algorithms.vfl.messages import VFL
from fedmodel.algorithms.vfl.metrics import score_metrics
from fedmodel.algorithms.vfl.options import FairVFLOptions, Schedule
from fedmodel.algorithms.vfl.problem import ScoreFunctions
from fedmodel.certificate.kkt import KKTResiduals, feasibility_residual
from fedmodel.result import Result


class VFLServer(ServerHalf):
    """Server of fair-vfl (``constrained=True``) or fedbcd (``constrained=False``).

    Parameters
    ----------
    y, group_a : arrays (n,)
        Labels (+-1) and groups.
    opts : FairVFLOptions
    parties : list of str
        The parties' names (in the problem's order).
    schedule_constants : (L, L12)
        For the theoretical schedule.
    constrained : bool
        Run the dual ascent (fair-vfl) or keep ``lambda = 0`` (fedbcd).
    fingerprint : dict, optional
        What a checkpoint must match (set up by the runner from the problem).
    y_test, group_a_test : arrays, optional
        Labels and groups of the held-out part (for the test metrics in ``res.extra``).

    Examples
    --------
    >>> import numpy as np
    >>> opts = FairVFLOptions(eps=0.05)
    >>> srv = VFLServer(np.array([1.0, -1, 1, 1]), np.array([1, 0, 0, 1]) > 0, opts, ["a", "b"])
    >>> srv.get_state()["state"]["lambda"], srv.max_steps
    (array([0., 0.]), 1000)
    """

    messages = VFL
    #: one dict of plain values and arrays: lambda, the round, the scores and partial
    #: scores, the asynchronous bookkeeping, the gap
    state_fields = ("state",)
    step_name = "round"

    def __init__(
        self,
        y: np.ndarray,
        group_a: np.ndarray,
        opts: FairVFLOptions,
        parties: list[str],
        schedule_constants: tuple[float, float] = (1.0, 1.0),
        constrained: bool = True,
        fingerprint: dict | None = None,
        y_test: np.ndarray | None = None,
        group_a_test: np.ndarray | None = None,
        method: str = "fair-vfl",
    ):
        super().__init__(None, opts)
        self.scores_of = ScoreFunctions(y, group_a, opts.constraint, opts.tpr_temperature)
        self.opts = opts
        self.parties = list(parties)
        self.method = method
        self.eps = float(opts.eps)
        self.constrained = constrained
        self.local_certificate = constrained
        self.schedule = Schedule(opts, len(parties), schedule_constants)
        self.max_steps = int(opts.max_rounds)
        self.delays = {
            p: int(d) for p, d in zip(self.parties, opts.delays or [0] * len(self.parties))
        }
        self._tickets: dict[str, Any] = {}  # party -> posted job (asynchronous)
        self._fingerprint = dict(fingerprint or {})
        self.y_test, self.group_a_test = y_test, group_a_test
        n = self.scores_of.n
        self.state: dict[str, Any] = {
            "lambda": np.array(opts.lambda0 if constrained else (0.0, 0.0), dtype=float),
            "t": 0,
            "scores": np.zeros(n),
            "partials": {p: np.zeros(n) for p in self.parties},
            "pending": {},  # party -> (round its reply counts from, partial scores)
            "busy_until": {p: -1 for p in self.parties},
            "sent": {p: 0 for p in self.parties},  # round of each party's last job
            "replies": [],  # (round received, party, round posted) of every reply used
            "row_round": -1,  # the round of the last history row
            "dual_residual": np.zeros(2),
            "gap": np.inf,
            "reason": "max_rounds",  # why the run stopped: max_rounds, gap, unbounded
        }

    def message_dims(self, client: str) -> dict[str, int]:
        """``n`` training rows, ``n_test`` held-out rows, ``m_k`` the party's columns (from
        the problem's fingerprint, when the runner set it up)."""
        sizes = dict(zip(self._fingerprint.get("parties", ()), self._fingerprint.get("sizes", ())))
        n_test = 0 if self.y_test is None else len(self.y_test)
        return {"n": int(self.scores_of.n), "n_test": int(n_test), "m_k": int(sizes.get(client, 0))}

    # -- state ----------------------------------------------------------------------------
    def state_restored(self) -> None:
        self._tickets = {}  # work posted after that point is gone (the runtime dropped it)

    @property
    def scores(self) -> np.ndarray:
        return self.state["scores"]

    @property
    def lam(self) -> np.ndarray:
        return self.state["lambda"]

    def point(self) -> np.ndarray:
        """The server's iterate: the full scores and ``lambda`` (``theta_k`` stay with the
        parties)."""
        return np.concatenate([self.state["scores"], self.state["lambda"]])

    # -- the rounds ---------------------------------------------------------------------------
    def _partial(self, reply) -> np.ndarray:
        part = np.asarray(reply.payload["partial_scores"], dtype=float)
        if part.shape != (self.scores_of.n,):
            raise ValueError(
                f"party {reply.sender!r} published partial scores of shape {part.shape}, "
                f"expected {(self.scores_of.n,)}"
            )
        return part

    def _sum(self) -> np.ndarray:
        z = np.zeros(self.scores_of.n)
        for p in self.parties:  # a fixed order: the same floating-point sum everywhere
            z += self.state["partials"][p]
        return z

    def start(self, runtime) -> None:
        """Round 0's upload: the parties' partial scores at ``theta^(0)``."""
        runtime.next_round()
        replies = runtime.broadcast("vfl_start", {})
        for p in self.parties:
            self.state["partials"][p] = self._partial(replies[p])
        self.state["scores"] = self._sum()

    def dual_update(self) -> None:
        """(9) with ``c_{t-1}``, at the scores of ``theta^(t)``."""
        st = self.state
        t = int(st["t"])
        if not self.constrained or t == 0:
            return
        grad = self.scores_of.dual_gradient(
            st["scores"], st["lambda"], self.eps, self.schedule.c(t - 1)
        )
        st["lambda"] = np.maximum(st["lambda"] + self.schedule.dual_step * grad, 0.0)

    def dual_residual(self) -> np.ndarray:
        """The lambda part of the stationarity gap (12) at ``(theta^(t), lambda^(t))``:
        ``(1/alpha)(lambda - [lambda + alpha grad_lambda f]_+)`` (``f``, not ``f~``)."""
        if not self.constrained:
            return np.zeros(2)
        lam = self.state["lambda"]
        a = self.schedule.dual_step
        g = self.scores_of.constraint_values(self.state["scores"], self.eps)
        return (lam - np.maximum(lam + a * g, 0.0)) / a

    def step(self, runtime, deadline: float | None = None) -> StepReport:
        """One communication round ``t`` (then ``state["t"] = t + 1``)."""
        self.dual_update()
        st = self.state
        t = int(st["t"])
        z = st["scores"]
        st["dual_residual"] = self.dual_residual()
        runtime.next_round()
        payload = {"scores": z, "lambda": st["lambda"]} if self.constrained else {"scores": z}
        last = t + 1 >= self.max_steps
        record = t % self.opts.monitor_every == 0 or last
        if self.opts.asynchronous:
            self._async_round(runtime, t, payload)
            if record:  # a consistent point: the gap and the history need every block
                self._drain(runtime, t)
        else:
            idle = [p for p in self.parties if st["busy_until"][p] < t]
            replies = runtime.broadcast("vfl_round", payload, to=idle) if idle else {}
            for p in idle:
                arrives = t + self.delays[p]
                st["pending"][p] = (arrives, self._partial(replies[p]))
                st["busy_until"][p] = arrives
                st["sent"][p] = t
            for p in self.parties:  # replies that count from this round's end
                if p in st["pending"] and st["pending"][p][0] <= t:
                    st["partials"][p] = st["pending"].pop(p)[1]
                    st["replies"].append((t, p, st["sent"][p]))
        st["scores"] = self._sum()
        st["t"] = t + 1
        if not np.all(np.isfinite(st["scores"])):
            st["reason"] = "unbounded"
            return StepReport(
                stop="unbounded", message="the scores are no longer finite; lower the steps"
            )
        if not record:
            return StepReport(record=False)
        reps = runtime.broadcast("vfl_monitor", {}, channel="diagnostic")
        step_sq = sum(r.payload["step_sq"] for r in reps.values())
        dual = st["dual_residual"]
        gap = float(np.sqrt(step_sq + dual @ dual))
        st["gap"] = gap
        row = self.summary(st["scores"])
        row.update(gap=gap, local_updates=sum(r.payload["updates"] for r in reps.values()))
        since = [r for r in st["replies"] if r[0] > st.get("row_round", -1)]
        row.update(replies=len(since), max_staleness=max((r[0] - r[2] for r in since), default=0))
        st["row_round"] = t
        if self.opts.tol > 0 and gap <= self.opts.tol:
            st["reason"] = "gap"
            return StepReport(info=row, stop="stopped", message="gap (12) <= tol")
        return StepReport(info=row)

    # -- asynchrony on the runtime (post/poll) ---------------------------------------------
    def _async_round(self, runtime, t: int, payload: dict) -> None:
        """Post the round's job to every idle party, take the replies that are ready (at
        least ``min_replies``), and put them in the sum."""
        st = self.state
        self._runtime_async = (runtime.backend, runtime.supports_async)
        for p in self.parties:
            if p not in self._tickets:
                self._tickets[p] = runtime.post(p, "vfl_round", payload)
                st["sent"][p] = t
        want = min(int(self.opts.min_replies), len(self._tickets))
        got = runtime.poll(list(self._tickets.values()), min_count=want)
        self._take(got, t)

    def _take(self, got: dict, t: int) -> None:
        st = self.state
        for p in self.parties:  # a fixed order
            ticket = self._tickets.get(p)
            if ticket is not None and ticket in got:
                st["partials"][p] = self._partial(got[ticket])
                st["replies"].append((t, p, st["sent"][p]))
                del self._tickets[p]

    def _drain(self, runtime, t: int) -> None:
        if self._tickets:
            tickets = list(self._tickets.values())
            self._take(runtime.poll(tickets, min_count=len(tickets)), t)

    def quiesce(self, runtime) -> None:
        """Wait for every job in flight and put its reply in the sum (a consistent point:
        every party's state matches the block the server holds)."""
        if self._tickets:
            self._drain(runtime, int(self.state["t"]) - 1)
            self.state["scores"] = self._sum()

    def asynchrony(self) -> dict[str, Any]:
        """Per party: replies used, rounds in which it did not reply, the staleness of each
        reply (rounds between the job and the round its reply counted in)."""
        st = self.state
        rounds = int(st["t"])
        out: dict[str, Any] = {"rounds": rounds, "mode": self.mode(), "parties": {}}
        for p in self.parties:
            stale = [r - s for r, q, s in st["replies"] if q == p]
            out["parties"][p] = {
                "replies": len(stale),
                "silent_rounds": rounds - len({r for r, q, _ in st["replies"] if q == p}),
                "staleness": stale,
                "max_staleness": max(stale, default=0),
                "mean_staleness": float(np.mean(stale)) if stale else 0.0,
            }
        return out

    def mode(self) -> str:
        if self.opts.asynchronous:
            return "asynchronous"
        return "delays" if any(self.delays.values()) else "synchronous"

    def summary(self, z: np.ndarray) -> dict[str, float]:
        f = self.scores_of
        d = f.deo_gap(z)
        gap = f.constraint_gap(z)
        lam = self.state["lambda"]
        pred = np.where(z >= 0, 1.0, -1.0)
        return {
            "round": int(self.state["t"]),
            "data_loss": f.data_loss(z),
            "deo_gap": d,
            "deo_loss": abs(d),
            "tpr_gap": f.tpr_gap(z),
            "constraint_gap": gap,
            "violation": max(0.0, abs(gap) - self.eps) if self.constrained else 0.0,
            "lambda1": float(lam[0]),
            "lambda2": float(lam[1]),
            "train_accuracy": float((pred == f.y).mean()),
        }

    # -- the driver's hooks (run_federated without a compiled model) --------------------------
    def fingerprint(self) -> dict:
        return self._fingerprint

    def round_counts(self) -> dict[str, int]:
        return {"inner": int(self.state["t"])}

    def evaluate(self, runtime) -> tuple[KKTResiduals, dict, dict]:
        """The local KKT certificate at ``(theta, lambda)`` (notes 6.2): each party's block of
        ``grad_theta f`` from the full scores (``vfl_kkt``, diagnostic), the server's
        feasibility/complementarity ``dist_inf([D - eps, -D - eps], N(lambda))``."""
        z, lam = self.state["scores"], self.state["lambda"]
        payload = {"scores": z, "lambda": lam} if self.constrained else {"scores": z}
        reps = runtime.broadcast("vfl_kkt", payload, channel="diagnostic")
        stationarity = max(r.payload["grad_inf"] for r in reps.values())
        reg = sum(r.payload["regularizer"] for r in reps.values())
        cvals = self.scores_of.constraint_values(z, self.eps)
        if self.constrained:
            feas = feasibility_residual(cvals, np.zeros(0), lam)
            violation = max(0.0, float(cvals.max()))
        else:
            feas, violation = 0.0, 0.0
        kkt = KKTResiduals(stationarity, feas, {"server": feas}, local=self.constrained)
        summary = {
            "objective": self.scores_of.data_loss(z) + reg,
            "max_violation": violation,
            "constraints": {"server": {"deo": cvals}} if self.constrained else {},
            "regularizer": reg,
        }
        return kkt, summary, {}

    def conclude(self, stop, message, kkt, summary, history) -> tuple[str, str]:
        """A run that reached ``max_rounds`` with the certificate met is ``"optimal"`` too;
        with a constant ``c > 0`` the message explains the ``c * lambda`` violation."""
        opts = self.opts
        rounds = int(self.state["t"])
        gap = self.state["gap"]
        certified = kkt is not None and kkt.satisfied(opts.kkt_tol, opts.kkt_tol)
        if stop == "max_iterations" and certified:
            stop, rule = "optimal", f"{rounds} rounds"
        else:
            rule = "gap (12) <= tol"
        if stop in ("optimal", "max_iterations"):
            message = status_message(
                stop,
                kkt,
                f"eps = {opts.kkt_tol:g}",
                rule=rule,
                budget=f"max_rounds = {opts.max_rounds} (gap (12) {gap:.2e})",
                local=self.constrained,  # the DEO constraint is not convex
            )
        backend, real = getattr(self, "_runtime_async", (None, True))
        if opts.asynchronous and not real:
            message += (
                f"; asynchronous=True on the {backend} runtime, which has no non-blocking "
                "exchange: every posted job was answered at once (synchronous rounds"
                + (", deterministic)" if backend == "serial" else ")")
            )
        if (
            self.constrained
            and kkt is not None
            and opts.schedule == "constant"
            and opts.c > 0
            and kkt.feasibility > opts.kkt_tol
        ):
            message += (
                f"; with a constant c = {opts.c:g} the multiplier's fixed point leaves a "
                "violation of about c * lambda (notes 3.6): lower c or use schedule='theorem2'"
            )
        return stop, message

    def make_result(self, **fields: Any) -> Result:
        z = self.state["scores"]
        lam = self.state["lambda"].copy()
        reports = fields.pop("reports")
        summary = fields.pop("summary")
        cvals = self.scores_of.constraint_values(z, self.eps)
        extra: dict[str, Any] = {
            **fields.pop("extra"),
            "lambda": lam,
            "train": score_metrics(z, self.scores_of.y, self.scores_of.group_a),
            "scores": z.copy(),
            "complementarity": np.abs(lam * cvals) if self.constrained else np.zeros(2),
            "gap": self.state["gap"],
            "reason": self.state["reason"],
            "local_updates": {
                p: int(r["updates_total"]) for p, r in reports.items() if "updates_total" in r
            },
            "asynchrony": self.asynchrony(),
        }
        if self.constrained:
            extra["constraint"] = self.scores_of.constraint_report(z, self.eps)
        tests = [reports[p].get("test_scores") for p in self.parties if p in reports]
        if self.y_test is not None and tests and all(v is not None for v in tests):
            z_test = np.zeros(self.y_test.size)
            for v in tests:
                z_test += np.asarray(v, dtype=float)
            extra["test"] = score_metrics(z_test, self.y_test, self.group_a_test)
            extra["test_scores"] = z_test
        solution = {
            f"theta_{p}": np.asarray(reports[p]["theta"])
            for p in self.parties
            if p in reports and reports[p].get("theta") is not None
        }
        x = (
            np.concatenate([solution[f"theta_{p}"] for p in self.parties])
            if len(solution) == len(self.parties)
            else np.zeros(0)
        )
        if fields["status"] == "client_failure":
            solution, x = {}, np.zeros(0)
        return Result(
            method=self.method,
            objective=float(summary["objective"]),
            max_violation=float(summary["max_violation"]),
            x=x,
            solution=solution,
            multipliers={"server": {"deo": lam}} if self.constrained else {},
            extra=extra,
            **fields,
        )
