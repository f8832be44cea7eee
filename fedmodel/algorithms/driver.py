"""Run any federated method (a server half and its client halves, see
:mod:`fedmodel.algorithms.protocol`) on any backend, the same way for every method:

* start the runtime, building each client half where it runs from its factory;
* resume from a checkpoint (checked against the model, the method and the options that
  change the iterates) or call ``server.start``;
* call ``server.step`` until the method stops, ``server.max_steps`` is reached or the time
  limit passes; after each step, a history row (one diagnostic evaluation round, when
  ``options.history``), the callback, a consistent mark of every party's state, and a
  checkpoint every ``checkpoint_every`` steps;
* a method that posts work and moves on (``runtime.post``, e.g. fair-vfl with
  ``asynchronous=True``): while replies are in flight the step is not a consistent point
  and no mark is taken; before a history evaluation, a checkpoint and the certificate the
  driver calls ``server.quiesce(runtime)``, which takes every reply in flight;
* a client failure the policy did not recover, or Ctrl-C, returns the last consistent
  iterate (every party put back to its state there) with status ``"client_failure"`` or
  ``"interrupted"``, and a checkpoint of it when asked;
* the certificate: one evaluation round at the returned point, each party on its own data;
  status ``"optimal"`` only when the recomputed KKT residuals meet ``(eps1, eps2)``;
* the :class:`~fedmodel.result.Result`: ledger, communication totals, timing per party,
  multipliers from every party's report.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fedmodel.algorithms.common import (
    conic_note,
    global_point,
    history_row,
    make_result,
    split_multipliers,
    status_message,
)
from fedmodel.algorithms.dp import PrivacyPlan
from fedmodel.algorithms.messages import declare_messages
from fedmodel.algorithms.options import SOLVE_STARTED, resume_key
from fedmodel.algorithms.protocol import ServerHalf, StepReport
from fedmodel.certificate.kkt import (
    KKTResiduals,
    assemble,
    party_evaluation,
    party_reports,
    reported_vectors,
)
from fedmodel.compiler.fingerprint import model_fingerprint
from fedmodel.compiler.partition import CompiledModel
from fedmodel.runtime.checkpoint import (
    CheckpointError,
    check_manifest,
    checkpoint_directory,
    read_manifest,
    read_server_state,
    state_misfit,
    write_checkpoint,
)
from fedmodel.runtime.endpoints import EndpointFactory, copy_state
from fedmodel.runtime.factory import make_runtime
from fedmodel.runtime.faults import inject_faults
from fedmodel.runtime.heap import settled_heap
from fedmodel.runtime.messages import CountingLedger, communication_totals
from fedmodel.runtime.outcomes import ClientFailure


@dataclass
class _Mark:
    """The run's state at a consistent point (after a completed step): what a failure or an
    interruption returns, and what a checkpoint holds on the server side."""

    k_next: int
    history: list
    last_eval: Any
    last_eval_k: int
    round: int
    ledger_rows: int
    server: dict

    def state(self, runtime) -> dict:
        """The server side of a checkpoint, as plain values and arrays."""
        d = dict(self.__dict__)
        if self.last_eval is not None:  # (residuals, summary): the residuals as a dict
            kkt, summary = self.last_eval
            fields = {f.name: getattr(kkt, f.name) for f in dataclasses.fields(kkt)}
            d["last_eval"] = (fields, summary)
        d["ledger"] = list(runtime.ledger.rows[: self.ledger_rows])
        d["client_seconds"] = dict(runtime.client_seconds)
        return d

    @classmethod
    def from_state(cls, state: dict) -> _Mark:
        """The inverse of :meth:`state` (the ledger and client seconds are the caller's)."""
        mark = cls(**{k: state[k] for k in cls.__dataclass_fields__})
        if mark.last_eval is not None:
            kkt, summary = mark.last_eval
            mark.last_eval = (KKTResiduals(**kkt), summary)
        return mark


def run_federated(
    compiled: CompiledModel | None,
    options: Any,
    method: str,
    server: ServerHalf,
    factories: Mapping[str, EndpointFactory],
    *,
    faults: dict | None = None,
):
    """Run ``server`` with the client halves built from ``factories`` on ``options.backend``.

    ``options`` carries the runtime options of
    :class:`~fedmodel.algorithms.options.RuntimeOptions` and the tolerances ``eps1``,
    ``eps2``. ``faults`` (client name -> :class:`~fedmodel.runtime.faults.Fault`) injects
    failures, for tests.

    ``compiled=None`` runs a method on its own problem representation (the vfl family's
    vertical problem): the server half then supplies what the driver would read from the
    compiled model, ``fingerprint()``, ``placement_weights()``, ``local_certificate``,
    ``evaluate(runtime) -> (kkt, summary, row)`` and ``make_result(**fields)`` (see
    :class:`~fedmodel.algorithms.protocol.ServerHalf`).
    """
    t_start = time.perf_counter()
    started = SOLVE_STARTED.get()  # (model.solve's own start: its compile counts too)
    if started is not None:
        t_start = min(t_start, started)
    options.validate_runtime()
    fingerprint = model_fingerprint(compiled) if compiled is not None else server.fingerprint()
    # every option not declared stop-only (algorithms/options.py)
    key = resume_key(options)
    resumed = manifest = None
    if options.resume is not None:  # check before starting any worker
        manifest = read_manifest(options.resume)
        check_manifest(
            manifest,
            method=method,
            model=fingerprint,
            options=key,
            where=os.fspath(options.resume),
        )
        resumed = read_server_state(options.resume, manifest)
    table = getattr(server, "messages", None)
    reveal = options.party_reveal(list(factories), table.party_opt_ins() if table else [])
    factories = {
        n: f if f.reveal == reveal[n] else dataclasses.replace(f, reveal=reveal[n])
        for n, f in factories.items()
    }
    # secure aggregation and dp: refused before any worker starts unless the method takes them
    server.privacy = PrivacyPlan.for_run(options, method, server, len(factories), compiled)
    if faults:
        factories = inject_faults(factories, faults)
    # the parties' objects stay out of the collector's full scans (runtime/heap.py)
    with settled_heap():
        runtime = make_runtime(
            options.backend,
            factories,
            workers=options.workers,
            server_hosts_clients=options.server_hosts_clients,
            ray_address=options.ray_address,
            ray_placement=getattr(options, "ray_placement", None),
            flower_grid=getattr(options, "flower_grid", None),
            client_timeout=options.client_timeout,
            on_failure=options.on_failure,
            retries=options.retries,
            weights=(
                (lambda: {c.name: c.data_bytes() + 1 for c in compiled.clients})
                if compiled is not None
                else server.placement_weights
            ),
        )
        if not options.keep_ledger:
            runtime.ledger = CountingLedger()
        # every reply is checked against the method's declared message table before use
        declare_messages(runtime, server, compiled)
        try:
            start = None
            if manifest is not None:
                runtime.load_party_checkpoint(
                    checkpoint_directory(options.resume), manifest["parties"]
                )
                start = _resumed_mark(resumed, server, options.resume, manifest)
                # the run so far, then what this runtime recorded on starting (Flower: hello)
                runtime.ledger.rows = list(resumed["ledger"]) + runtime.ledger.rows
                runtime.client_seconds.update(resumed["client_seconds"])
            run = _Run(compiled, options, method, server, runtime, fingerprint, key)
            run.compile_seconds = time.perf_counter() - t_start
            with runtime.deferred_interrupts():
                return run.solve(start)
        finally:
            runtime.close()


def _resumed_mark(state: Any, server: ServerHalf, where: Any, manifest: dict) -> _Mark:
    """The mark a checkpoint's server state holds, checked to fit this run's server half
    (a CheckpointError naming the file, never a deep error later)."""
    fname = manifest["server"][0]
    try:
        mark = _Mark.from_state(state)
        why = state_misfit(server.get_state(), mark.server)
    except Exception as exc:  # noqa: BLE001 - a record of another form
        why = f"{type(exc).__name__}: {exc}"
    if why is None and not all(k in state for k in ("ledger", "client_seconds")):
        why = "it lacks the ledger or the clients' seconds"
    if why is not None:
        raise CheckpointError(
            f"checkpoint {os.fspath(where)!r}: {fname} does not fit this run: {why}"
        )
    return mark


class _Run:
    """One run of a method: the step loop, marks and checkpoints, and the final result."""

    def __init__(self, compiled, options, method, server, runtime, fingerprint, resume_key):
        self.compiled = compiled
        self.options = options
        self.method = method
        self.server = server
        self.runtime = runtime
        self.fingerprint = fingerprint
        self.resume_key = resume_key
        self.local = compiled.nonconvex if compiled is not None else server.local_certificate
        self.compile_seconds = 0.0
        self.mark: _Mark | None = None
        self.checkpoint_written: str | None = None
        self.checkpoint_k: int | None = None  # the step the checkpoint resumes at
        self.checkpoint_failed: str | None = None  # why the last checkpoint was not written
        self.history: list[dict] = []
        self.last_eval = None
        self.last_eval_k = -2
        self.k = -1
        self.diagnostics: dict = {}
        #: how long the last evaluation round took: under a time limit, the steps end that
        #: long before the deadline, so that the round after them (the history row, the
        #: certificate) ends by it too
        self.eval_seconds = 0.0
        self.step_floor = float("inf")  # the shortest step's seconds, its evaluation included
        #: the smallest time limit the run can hold: its compile, set-up and first step, and
        #: the evaluation round after it (a run always takes one step)
        self.limit_floor: float | None = None

    # -- marks and checkpoints ---------------------------------------------------------------
    def take_mark(self, k_next: int) -> None:
        rt = self.runtime
        if rt.in_flight:  # work in flight: not a consistent point, the last mark stands
            return
        with rt.critical():
            rt.mark()
            self.mark = _Mark(
                k_next,
                list(self.history),
                self.last_eval,
                self.last_eval_k,
                rt.round,
                len(rt.ledger.rows),
                copy_state(self.server.get_state()),
            )

    def quiesce(self) -> None:
        """Before a mark that must be taken, a checkpoint or an evaluation: the server
        drains the work it posted and has not taken yet (asynchronous methods)."""
        if self.runtime.in_flight:
            self.server.quiesce(self.runtime)
        if self.runtime.in_flight:
            raise RuntimeError(
                f"{type(self.server).__name__}.quiesce left {self.runtime.in_flight} posted "
                "messages in flight"
            )

    def save(self, reason: str) -> None:
        """Write a checkpoint of the mark; a directory that cannot be written (read-only, a
        full disk, a file in the way) costs the checkpoint, not the run: the Result's
        message says so."""
        try:
            self._write(reason)
        except (OSError, CheckpointError) as exc:
            self.checkpoint_failed = f"the {reason} checkpoint could not be written ({exc})"

    def _write(self, reason: str) -> None:
        write_checkpoint(
            self.options.checkpoint,
            self.runtime,
            method=self.method,
            model=self.fingerprint,
            options=self.resume_key,
            iteration=self.mark.k_next,
            server_state=self.mark.state(self.runtime),
            reason=reason,
        )
        self.checkpoint_written = os.fspath(self.options.checkpoint)
        self.checkpoint_k = self.mark.k_next

    def evaluate(self):
        """One diagnostic round at the server's point: every client evaluates its share with
        its own multipliers, the server adds its own and ``dh`` (timed: ``eval_seconds``)."""
        t0 = time.perf_counter()
        try:
            return self._evaluate()
        finally:
            self.eval_seconds = time.perf_counter() - t0

    def _evaluate(self):
        if self.compiled is None:  # the method evaluates on its own representation
            self.server.sync(self.runtime)
            kkt, summary, self.diagnostics = self.server.evaluate(self.runtime)
            return kkt, summary
        server, program = self.server, self.compiled.server
        server.sync(self.runtime)
        if program.layout.has_owned:
            # methods that take owned variables hold the server's program over its view of x
            # (shared variables, then its own): only the shared part is sent, and each party
            # reports its own variables' stationarity itself
            program = server.program
        x = server.point()
        ns, owned = program.layout.n_shared, program.layout.has_owned
        reports = {
            program.name: party_evaluation(
                program,
                x,
                *server.multipliers(),
                owned,
                cone=server.cone_duals(),
                objective_scale=server.objective_scale,
            )
        }
        payload = {"w": x[:ns], **server.evaluation_extras()}
        if server.privacy.active:  # the server learns sums (docs/privacy.md)
            names = self.runtime.client_names
            reports.update(server.privacy.evaluate(self.runtime, payload, names, ns))
        else:
            replies = self.runtime.broadcast("evaluate", payload, channel="diagnostic")
            reports = party_reports(reports, replies)
        kkt, summary = assemble(
            reports, self.compiled.regularizer, x[:ns], self.local, server.objective_scale
        )
        # the inequality multipliers a party's certificate used when it balanced its
        # epigraph pieces' (certificate/kkt.party_evaluation): the ones the result reports
        summary["multipliers_used"] = reported_vectors(reports, "mu")
        self.diagnostics = server.diagnostics(reports)
        return kkt, summary

    # -- the loop ----------------------------------------------------------------------------
    def solve(self, start: _Mark | None):
        opts, server, runtime = self.options, self.server, self.runtime
        self.t_solve = time.perf_counter()
        # time_limit covers the whole run: its set-up (the runtime, its workers) counts too
        t_run = self.t_solve - self.compile_seconds
        deadline = t_run + opts.time_limit if opts.time_limit else None
        status, message = "max_iterations", ""
        late = False  # the method stopped itself after the deadline
        last = StepReport()
        try:
            if start is None:
                t0 = time.perf_counter()
                server.start(runtime)
                # (until the first evaluation round is timed, the start-up round -- one
                # round trip to every client -- stands for its duration)
                self.eval_seconds = time.perf_counter() - t0
            else:  # resume from a checkpoint
                server.set_state(start.server)
                self.history = list(start.history)
                self.last_eval, self.last_eval_k = start.last_eval, start.last_eval_k
                self.k = start.k_next - 1
                runtime.round = start.round
            first = self.k + 1
            self.take_mark(first)
            for k in range(first, server.max_steps):
                self.k = k
                # (the steps end early enough for the evaluation round after them)
                cut = None if deadline is None else deadline - self.eval_seconds
                t_step = time.perf_counter()
                last = server.step(runtime, cut)
                if last.stop == "unbounded":  # the last finite iterate stands
                    status, message = last.stop, last.message
                    break
                # (under dp an evaluation round would spend privacy: no certificate per step)
                if opts.history and last.record and server.privacy.dp is None:
                    self.quiesce()
                    self.last_eval, self.last_eval_k = self.evaluate(), k
                    kkt, summary = self.last_eval
                    self.history.append(
                        history_row(
                            k,
                            summary,
                            kkt,
                            **{**last.info, **self.diagnostics},
                            rounds=runtime.round,
                        )
                    )
                if opts.callback is not None and last.record:
                    opts.callback(
                        self.history[-1]
                        if self.history
                        else {"iteration": k, "rounds": runtime.round}
                    )
                if last.stop is not None:
                    if self.limit_floor is None:
                        self.limit_floor = time.perf_counter() - t_run + self.eval_seconds
                    status, message = last.stop, last.message
                    # a step cut short by the deadline (its parties' budgets) can look like
                    # a converged one: unless certified, the run ends with time_limit
                    late = cut is not None and time.perf_counter() > cut
                    late = late and status in ("stopped", "max_iterations")
                    if late and opts.checkpoint is not None:  # (the point before it)
                        self.quiesce()
                        with runtime.critical():
                            self.save("time_limit")
                    break
                # the shortest step so far (with its evaluation) is what another one takes at
                # the least: it is not begun if it would end after the deadline, less the
                # evaluation round that follows the last step (the certificate)
                now = time.perf_counter()
                self.step_floor = min(self.step_floor, now - t_step)
                if self.limit_floor is None:
                    self.limit_floor = now - t_run + self.eval_seconds
                if deadline is not None and now + self.step_floor + self.eval_seconds > deadline:
                    status = "time_limit"
                    message = (
                        f"time limit of {opts.time_limit:g} s reached after {k + 1} "
                        f"{server.step_name}s"
                        + ("" if now > deadline else " (another would end after it)")
                        + self.below_floor()
                    )
                    if opts.checkpoint is not None:  # resumable where it stopped
                        # the checkpoint holds the point before this step: the deadline
                        # passed during it, so its parties' budgets may have cut it short
                        # (a resumed run repeats it whole, as the uninterrupted run did)
                        self.quiesce()
                        with runtime.critical():
                            self.save("time_limit")
                        if self.checkpoint_k == self.mark.k_next:  # (this save succeeded)
                            message += (
                                f"; checkpoint written to {self.checkpoint_written!r} (before "
                                f"the {server.step_name} the deadline cut): continue with "
                                f"resume={self.checkpoint_written!r}"
                            )
                    break
                due = opts.checkpoint is not None and (k + 1) % opts.checkpoint_every == 0
                if due:
                    self.quiesce()
                self.take_mark(k + 1)
                if due:
                    with runtime.critical():
                        self.save("periodic")
            if (
                opts.checkpoint is not None
                and status not in ("time_limit", "unbounded")
                and not late
                and self.checkpoint_written is None
            ):  # a run that ended before its first checkpoint_every: its final state
                self.quiesce()
                self.take_mark(self.k + 1)
                with runtime.critical():
                    self.save("final")
            if runtime.in_flight:  # the certificate is computed at a consistent point
                self.quiesce()
                self.last_eval = None
        except ClientFailure as exc:
            return self.stopped_early(exc)
        except KeyboardInterrupt:
            return self.stopped_early(None)

        try:  # the certificate round: a client may fail (or answer malformed) here too
            if self.last_eval is None or self.last_eval_k != self.k or status == "unbounded":
                self.last_eval, self.last_eval_k = self.evaluate(), self.k
        except ClientFailure as exc:
            self.last_eval = None
            return self.stopped_early(exc)
        except KeyboardInterrupt:
            return self.stopped_early(None)
        kkt, summary = self.last_eval
        if late:
            if not (status == "stopped" and kkt.satisfied(opts.eps1, opts.eps2)):
                status = "time_limit"
                message = (
                    f"time limit of {opts.time_limit:g} s reached after {self.k + 1} "
                    f"{server.step_name}s (the last one cut short by it)" + self.below_floor()
                )
                if self.checkpoint_written is not None:
                    message += (
                        f"; checkpoint written to {self.checkpoint_written!r}: continue with "
                        f"resume={self.checkpoint_written!r}"
                    )
        if status in ("stopped", "max_iterations"):  # other stops keep the step's message
            tolerance = ""  # (the cap's message needs none: ssca has no eps)
            if status == "stopped":
                status = "optimal" if kkt.satisfied(opts.eps1, opts.eps2) else "inaccurate"
                tolerance = f"(eps1, eps2) = ({opts.eps1:g}, {opts.eps2:g})"
            message = status_message(
                status,
                kkt,
                tolerance,
                rule="the method's stopping test held",
                budget=f"{server.max_steps} {server.step_name}s",
                local=self.local,
            )
        status, message = server.conclude(status, message, kkt, summary, self.history)
        status, message = server.privacy.conclude(status, message, kkt, opts)
        try:
            reports = (
                {}  # (per-client multipliers and models are not the sums a private run reveals)
                if server.privacy.active
                else runtime.broadcast("report", server.report_payload(), channel="diagnostic")
            )
        except ClientFailure as exc:
            return self.stopped_early(exc)
        except KeyboardInterrupt:
            return self.stopped_early(None)
        return self.result(status, message, kkt, summary, reports)

    def below_floor(self) -> str:
        """What a time-limit message adds when the limit is below the smallest one the run
        can hold (its compile, set-up and first step with the evaluation after it: a run
        always takes one step, so such a limit ends there)."""
        floor, limit = self.limit_floor, self.options.time_limit
        if floor is None or not limit or limit >= floor:
            return ""
        return (
            f"; the limit is below the smallest this run holds, {floor:.3g} s: the compile, "
            f"the set-up and one {self.server.step_name} with its evaluation round (a run "
            "always takes one), so it ended there"
        )

    # -- results -----------------------------------------------------------------------------
    def result(self, status, message, kkt, summary, reports, failure=None):
        compiled, server = self.compiled, self.server
        if compiled is None:
            return self.own_result(status, message, kkt, summary, reports, failure)
        used = summary.get("multipliers_used") or {}
        mu0, nu0 = server.multipliers()
        multipliers = {
            compiled.server.name: split_multipliers(
                compiled.server, used.get(compiled.server.name, mu0), nu0, server.cone_duals()
            )
        }
        local_iters = {"server": server.local_iterations}
        payloads = _Payloads(reports)
        clients, mus, nus, cones, seconds, iterations = _report_columns(reports, compiled.clients)
        names = [c.name for c in clients]
        mus = map(used.get, names, mus)  # (the multipliers its certificate used, else its own)
        multipliers.update(zip(names, map(split_multipliers, clients, mus, nus, cones)))
        per_party_seconds = dict(zip(names, seconds))
        local_iters.update(zip(names, map(int, iterations)))
        fields = self.run_fields(status, message, kkt, summary, failure, per_party_seconds)
        fields["timing"]["local_iterations"] = local_iters
        fields["privacy"] = server.privacy.record()
        fields["extra"].update(server.extra(payloads))
        if compiled.has_cones:
            fields["extra"].update(conic_note(compiled))
        return make_result(
            compiled,
            method=self.method,
            # the whole model's point: the server's view and each client's own block, which
            # reaches the caller only in the final (diagnostic) report, for .value
            x=global_point(
                compiled,
                server.point(),
                {name: p.get("owned") for name, p in payloads.items()}
                if compiled.layout.has_owned
                else {},
            ),
            multipliers=multipliers,
            **fields,
        )

    def run_fields(self, status, message, kkt, summary, failure, per_party) -> dict:
        """The Result fields the driver owns, for every method: status, message, the
        certificate, rounds, communication, timing, history, options, ledger, failure,
        checkpoint and the runtime's part of ``extra``."""
        runtime = self.runtime
        solve_seconds = time.perf_counter() - self.t_solve
        # the server's own time: what it did not spend waiting for the clients' replies
        per_party = {"server": max(0.0, solve_seconds - runtime.wait_seconds), **per_party}
        if self.checkpoint_failed:
            message = f"{message}. Note: {self.checkpoint_failed}"
        return {
            "status": status,
            "message": message,
            "kkt": kkt,
            "summary": summary,
            "rounds": {
                "outer": self.k + 1,
                **self.server.round_counts(),
                "communication": runtime.round,
            },
            "communication": communication_totals(runtime.ledger),
            "timing": {
                "compile": self.compile_seconds,
                "solve": solve_seconds,
                "per_party": per_party,
                "waiting": runtime.wait_seconds,
            },
            "history": self.history,
            "options": {
                k: v
                for k, v in self.options.__dict__.items()
                if k not in ("w0", "callback", "flower_grid")
            },
            "ledger": runtime.ledger.rows,
            "failure": failure or {},
            "checkpoint": self.checkpoint_written,
            "extra": {
                "backend": runtime.backend,
                "placement": runtime.placement,
                "retries": list(runtime.retried),
                **(
                    {"time_limit_floor": self.limit_floor}
                    if self.options.time_limit and self.limit_floor is not None
                    else {}
                ),
            },
        }

    def own_result(self, status, message, kkt, summary, reports, failure=None):
        """The :class:`Result` of a method run without a compiled model: the driver's
        fields (:meth:`run_fields`), the rest from ``server.make_result``."""
        per_party = {name: float(self.runtime.client_seconds.get(name, 0.0)) for name in reports}
        return self.server.make_result(
            reports={name: r.payload for name, r in reports.items()},
            **self.run_fields(status, message, kkt, summary, failure, per_party),
        )

    def stopped_early(self, failure: ClientFailure | None):
        """A client failed (policy exhausted) or the user pressed Ctrl-C: return the last
        consistent iterate (end of the last completed step), with every party put back to
        its state there, and write a checkpoint of it if asked."""
        runtime, server, mark = self.runtime, self.server, self.mark
        notes = []
        try:
            runtime.recover()
        except Exception as exc:  # noqa: BLE001
            notes.append(f"recovering the workers failed ({exc})")
        if mark is None:  # failed before the first consistent point (the start round)
            self.history, self.last_eval, self.k = [], None, -1
        else:
            self.history, self.k = list(mark.history), mark.k_next - 1
            self.last_eval = mark.last_eval if mark.last_eval_k == self.k else None
            server.set_state(mark.server)
            try:
                runtime.restore_marks()
            except Exception as exc:  # noqa: BLE001
                notes.append(f"restoring the clients' states failed ({exc})")
            if self.options.checkpoint is not None:
                try:
                    self._write("client_failure" if failure is not None else "interrupted")
                except Exception as exc:  # noqa: BLE001
                    notes.append(f"no checkpoint could be written ({exc})")
        usable = runtime.alive  # a client that raised may answer again; a dead one cannot
        kkt, summary = self.last_eval if self.last_eval is not None else (None, None)
        if summary is None and len(usable) == len(runtime.client_names):
            try:
                kkt, summary = self.evaluate()
            except (ClientFailure, KeyboardInterrupt):
                kkt, summary = None, None
        if summary is None:
            summary = {"objective": float("nan"), "max_violation": float("nan")}
            notes.append("the objective could not be evaluated without every client")
        reports = {}
        for name in usable if not self.server.privacy.active else ():
            try:
                reports[name] = runtime.send(
                    name, "report", self.server.report_payload(), channel="diagnostic"
                )
            except (ClientFailure, KeyboardInterrupt):
                continue
        where = (
            f"the end of {self.server.step_name} {self.k}"
            if self.k >= 0
            else f"the starting point (no {self.server.step_name} completed)"
        )
        info: dict[str, Any] = {}
        if failure is not None:
            status = "client_failure"
            blamed = failure.blamed  # (not the clients merely lost with its worker)
            name, out = blamed[0], failure.failures[blamed[0]]
            lost = [n for n in failure.failures if n not in blamed]
            info = {
                "client": name,
                "clients": blamed,
                "lost": lost,
                "error": out.describe(),
                "kind": out.kind,
                "round": failure.round,
                "message_kind": failure.kind,
                "traceback": out.detail,
            }
            message = (
                f"client '{name}' failed in round {failure.round} ('{failure.kind}' message, "
                f"{out.kind}): {out.describe()}"
            )
            if len(blamed) > 1:
                message += f" (also failed: {blamed[1:]})"
            if lost:
                message += f" (lost with its worker, not failed: {lost})"
            message += f". Returned the last consistent iterate, {where}."
        else:
            status = "interrupted"
            message = f"interrupted (Ctrl-C); returned the last consistent iterate, {where}."
        if self.checkpoint_written and self.checkpoint_k == self.k + 1:
            message += (
                f" Checkpoint written to {self.checkpoint_written!r}: continue with "
                f"resume={self.checkpoint_written!r}."
            )
        elif self.checkpoint_written:  # the last save failed: an older checkpoint remains
            message += (
                f" The checkpoint at {self.checkpoint_written!r} is an older one: it resumes "
                f"at {self.server.step_name} {self.checkpoint_k}, not where this run stopped."
            )
        if notes:
            message += " Note: " + "; ".join(notes) + "."
        return self.result(status, message, kkt, summary, reports, failure=info)


class _Payloads(Mapping):
    """The payloads of a round's replies by name, each read when it is asked for (a
    stacked round makes a reply's message when it is first read)."""

    def __init__(self, replies: Mapping[str, Any]):
        self.replies = replies

    def __getitem__(self, name: str) -> Any:
        return self.replies[name].payload

    def __iter__(self):
        return iter(self.replies)

    def __len__(self) -> int:
        return len(self.replies)


#: what the result reads of each client's final report
_REPORT_READ = ("mu", "nu", "cone", "seconds", "local_iterations")


def _report_columns(reports: Mapping[str, Any], clients: list) -> tuple[list, ...]:
    """The clients of ``clients`` that sent a final report, in that order, and their
    reports' ``mu``, ``nu``, ``cone`` (None when it sent none), ``seconds`` and
    ``local_iterations``, a list each: read as the stacked step's columns when the round
    was one (no message made per client; its rows taken as they are when they are the
    clients' in order), else from each reply."""
    stacked = getattr(reports, "stacked", None)
    if stacked is None or not {"mu", "nu", "seconds", "local_iterations"} <= stacked.keys():
        sent, found = [], []
        for c in clients:
            reply = reports.get(c.name)
            p = None if reply is None else reply.payload
            if p is not None:
                sent.append(c)
                found.append((p["mu"], p["nu"], p.get("cone"), p["seconds"], p["local_iterations"]))
        return (sent, *(list(column) for column in zip(*found))) if found else ([],) * 6
    n = len(reports.names)
    columns = [list(stacked[k]) if k in stacked else [None] * n for k in _REPORT_READ[:3]] + [
        stacked[k].tolist() for k in _REPORT_READ[3:]
    ]
    if list(reports.names) == [c.name for c in clients]:
        return (list(clients), *columns)
    at = dict(zip(reports.names, range(n)))
    places = [
        (c, i) for c, i in zip(clients, map(at.get, (c.name for c in clients))) if i is not None
    ]
    sent = [c for c, _ in places]
    return (sent, *([column[i] for _, i in places] for column in columns))
