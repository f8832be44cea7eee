"""What every learning method's server half shares: the :class:`ServerHalf` protocol for
``driver.run_federated(compiled=None, ...)`` (state, history rows every ``eval_every``
rounds, the evaluation round, fingerprint, the :class:`~fedmodel.result.Result`).

Subclasses (:class:`~fedmodel.algorithms.ssca.sample.SampleServer`,
:class:`~fedmodel.algorithms.ssca.feature.FeatureServer`) implement ``_round(runtime)``
(one communication round; updates ``self.w``), ``_evaluate(runtime, test)`` (a diagnostic
row) and optionally ``_full_gradient(runtime)``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fedmodel.algorithms.protocol import ServerHalf, StepReport
from fedmodel.algorithms.ssca.constraints import evaluate_function
from fedmodel.algorithms.ssca.messages import SSCA
from fedmodel.algorithms.ssca.surrogate import SurrogateState
from fedmodel.certificate.kkt import KKTResiduals
from fedmodel.result import Result


class LearningServer(ServerHalf):
    """Base of the learning methods' server halves.

    Parameters
    ----------
    kind : {"ssca", "sgd"}
    model : LearningModel
        Read for public facts only (names, sizes, the loss, the objective, the
        constraints' bounds, the server's test set); never the clients' rows.
    w0 : array
    options : SSCAOptions or SGDOptions
    state : SurrogateState or None
    method : str
    samples : dict
        Samples per client and round (the computation accounting).
    """

    messages = SSCA

    #: a stochastic method on a non-convex loss: the certificate is a local one
    local_certificate = True

    state_fields = ("w", "t", "slack", "nu", "v", "initial", "c", "slack_seen")
    component_fields = ("state",)  # the SSCA surrogate's running sums (None for SGD)
    step_name = "round"

    def __init__(self, kind, model, w0, options, state: SurrogateState | None, method, samples):
        super().__init__(None, options)
        self.kind, self.method, self.samples = kind, method, dict(samples)
        self.name, self.partition = model.name, model.partition
        self.party_names = model.party_names
        self.loss, self.objective, self.lam = model.loss, model.objective, model.lam
        self.constraints = list(model.constraints)
        self.w = np.array(w0, dtype=float)
        # the most rows one message covers (reply validation: message_dims)
        parts = [X for X, _ in model.clients.values()] if model.partition == "sample" else [model.X]
        if getattr(model, "test", None) is not None:
            parts.append(model.test[0])
        self.message_rows = max((len(X) for X in parts), default=0)
        self.state = state
        self.max_steps = int(options.rounds)
        self.t = 0
        self.slack = np.zeros(len(self.constraints))
        self.nu = np.zeros(len(self.constraints))
        self.v = np.zeros_like(self.w)  # momentum buffer (vertical SGD-m)
        # the increasing penalty (Theorem 2's c_j -> infinity; options c_growth, c_every)
        self.c = float(getattr(options, "c", 0.0))
        self.slack_seen = False
        self.initial: dict | None = None
        self.final_gradient: np.ndarray | None = None

    def state_restored(self) -> None:
        """The surrogate's penalty from the restored ``c`` (the increasing-penalty loop)."""
        if self.state is not None:
            self.state.set_penalty(self.c)

    def message_dims(self, client: str) -> dict[str, int]:
        """``d`` the model's parameters; ``rows`` the most rows a message may cover (a
        client's, the feature-based model's or its test set's); ``cap`` bounds the
        feature-based messages whose shape depends on the loss (rows x (d + 1)^2: per row
        at most a Jacobian of every parameter); ``k`` the number of constraints."""
        d = int(self.w.size)
        rows = self.message_rows
        return {"d": d, "rows": rows, "cap": rows * (d + 1) ** 2, "k": len(self.constraints)}

    def server_function(self, con) -> tuple[float, np.ndarray]:
        """``(value, gradient)`` of a server-held function constraint at ``w``."""
        return evaluate_function(con.function, (self.w,), self.w.size, con.label, "server")

    def _after_solve(self) -> None:
        """After the server's surrogate problem: keep its multipliers and run the increasing
        penalty. A stage is ``c_every`` rounds; when in some round of the stage the surrogate
        problem needed its slack (a multiplier at the penalty, ``nu_m = c``: the penalty
        binds), ``c <- min(c_growth c, c_max)`` (Theorem 2: runs with ``c_j -> infinity``
        reach a KKT point of Problem 3 / 8; with zero slack at ``c_j``, ``c_j`` is kept)."""
        last = self.state.last
        if last is None:
            return
        self.nu = last.nu
        self.slack_seen = self.slack_seen or bool(np.any(last.nu >= self.c * (1 - 1e-12)))
        growth, every = float(self.options.c_growth), int(self.options.c_every)
        if growth > 1 and self.t % every == 0:
            if self.slack_seen and self.c < self.options.c_max:
                self.c = min(self.c * growth, float(self.options.c_max))
                self.state.set_penalty(self.c)
            self.slack_seen = False

    # -- the protocol ------------------------------------------------------------------------
    def start(self, runtime) -> None:
        if self.options.history:
            self.initial = self._row(runtime)

    def step(self, runtime, deadline: float | None) -> StepReport:
        self.t += 1
        runtime.next_round()
        info = self._round(runtime)
        if not np.all(np.isfinite(self.w)):
            return StepReport(
                info,
                stop="unbounded",
                message=f"the iterate is no longer finite in round {self.t}; lower the steps",
            )
        every = self.options.eval_every
        record = self.t == self.max_steps or bool(every and self.t % every == 0)
        return StepReport(info, record=record)

    def point(self) -> np.ndarray:
        return self.w

    def report_payload(self) -> dict:
        return {}

    # -- what the compiled model would supply -------------------------------------------------
    def fingerprint(self) -> dict:
        return {
            "name": self.name,
            "n_variables": int(self.loss.dim),
            "clients": list(self.party_names),
            "partition": self.partition,
            "objective": self.objective,
            "lam": self.lam,
            "constraints": [[c.U, c.party, c.kind, c.label] for c in self.constraints],
        }

    def placement_weights(self) -> dict | None:
        return {n: float(s) for n, s in self.samples.items()}

    def _objective(self, row) -> float:
        if self.objective == "norm":
            return float(self.w @ self.w)
        return row["train_loss"] + self.lam * float(self.w @ self.w)

    def _row(self, runtime) -> dict:
        row = {"round": self.t, **self._evaluate(runtime)}
        row["objective"] = self._objective(row)
        row["norm_sq"] = float(self.w @ self.w)
        if self.constraints:
            row["slack"] = [float(s) for s in self.slack]
            if self.state is not None:
                row["c"] = self.c
        return row

    def evaluate(self, runtime):
        row = self._row(runtime)
        violation = max([0.0, *row.get("constraint_values", [])])
        stationarity = float("nan")
        final = self.t == self.max_steps and self.options.final_gradient
        if final and hasattr(self, "_full_gradient"):
            g = self._full_gradient(runtime)
            if self.objective == "loss" and not self.constraints:
                g = g + 2 * self.lam * self.w
            self.final_gradient = g
            stationarity = float(np.abs(g).max())
        kkt = KKTResiduals(stationarity, violation, {"server": violation}, local=True)
        summary = {"objective": row["objective"], "max_violation": violation, "constraints": {}}
        return kkt, summary, row

    def conclude(self, stop, message, kkt, summary, history):
        if stop == "max_iterations":
            last = history[-1] if history else {}
            message = f"{self.t} rounds done (a stochastic method with a round budget)"
            if "train_loss" in last:
                message += f": training loss {last['train_loss']:.4g}"
            if self.constraints:
                message += f", largest constraint violation {summary['max_violation']:.3g}"
        return stop, message

    def make_result(
        self,
        *,
        status,
        message,
        kkt,
        summary,
        reports,
        rounds,
        communication,
        timing,
        history,
        options,
        ledger,
        failure,
        checkpoint,
        extra,
    ) -> Result:
        runtime_extra = extra
        history = ([self.initial] if self.initial is not None else []) + list(history)
        r = max(self.t, 1)
        per = communication.get("per_party", {})
        per_round = {
            "floats_up": communication["floats_up"] / r,
            "floats_down": communication["floats_down"] / r,
            "floats_peer": communication["floats_peer"] / r,
            "per_client": {
                n: {
                    "floats_sent": per.get(n, {}).get("floats_sent", 0) / r,
                    "floats_received": per.get(n, {}).get("floats_received", 0) / r,
                    "samples": self.samples[n],
                }
                for n in self.samples
            },
            "samples": float(np.mean(list(self.samples.values()))),
        }
        extra: dict[str, Any] = {
            "partition": self.partition,
            "per_round": per_round,
            "samples": {n: float(p.get("samples", 0)) for n, p in reports.items()},
            **runtime_extra,
        }
        if self.final_gradient is not None:
            extra["gradient_norm"] = float(np.linalg.norm(self.final_gradient))
        multipliers = {}
        if self.constraints:
            extra["slack"] = self.slack.copy()
            extra["nu"] = self.nu.copy()
            extra["constraints"] = [c.label for c in self.constraints]
            if self.state is not None:
                extra["c"] = self.c
            multipliers = {
                "server": {c.label: np.array(self.nu[k]) for k, c in enumerate(self.constraints)}
            }
        per_party = {"server": max(0.0, timing["solve"] - timing["waiting"])}
        per_party.update({n: float(p.get("seconds", 0.0)) for n, p in reports.items()})
        timing = {**timing, "per_party": per_party}
        return Result(
            status=status,
            method=self.method,
            objective=float(summary.get("objective", float("nan"))),
            max_violation=float(summary.get("max_violation", float("nan"))),
            x=self.w.copy(),
            solution={"w": self.w.copy()},
            multipliers=multipliers,
            kkt=kkt,
            rounds=rounds,
            communication=communication,
            timing=timing,
            history=history,
            message=message,
            options=self.options.to_dict(),
            ledger=list(ledger),
            extra=extra,
            failure=failure,
            checkpoint=checkpoint,
        )
