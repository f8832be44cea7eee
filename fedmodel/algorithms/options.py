"""Option helpers shared by every method: validation of numbers, building an options
dataclass from ``model.solve(**options)`` with a clear error for unknown names, and the
resume key of a checkpoint, derived from the options dataclass.

Every option of a method is part of the key a checkpoint must match to be resumed, unless
its field is declared :func:`stop_only`: an option that decides only when or where the run
stops, where it runs, or what it reports (tolerances of a stopping test, iteration caps,
time limits, callbacks, the backend, output), never the iterates. A new option is
therefore safe by default: resuming with it changed is refused, naming it.
"""

from __future__ import annotations

import contextvars
import dataclasses
import os
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

import numpy as np

from fedmodel.errors import ModelError
from fedmodel.runtime.plaincodec import plain

# The runtime options' documentation, appended to every federated method's options docstring.
#: when the ``model.solve`` call being run started (``time.perf_counter()``; None outside
#: one): set by the registry before the model's compile, read by the driver, whose
#: ``time_limit`` covers the whole call (the compile, the runtime's set-up, the steps, the
#: certificate round)
SOLVE_STARTED: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "fedmodel_solve_started", default=None
)

RUNTIME_OPTIONS_DOC = """
    time_limit : float or None
        Wall-clock seconds for the whole run, from ``model.solve``'s start (the compile and
        the runtime's set-up included); the solve returns status ``"time_limit"`` when
        exceeded. Long steps are cut inside too: each party's local solve gets a time
        budget, and no step, inner round or local iteration is begun that would end after
        the deadline. The smallest limit a run holds is its compile, set-up and one step
        (one round; prox-al: one inner round) with the evaluation round after it
        (``extra["time_limit_floor"]``): a run always takes one step, so a smaller limit
        ends there, with status ``"time_limit"`` and a message saying so.
    history : bool
        Record per-outer-iteration diagnostics (costs one diagnostic round per iteration).
    callback : callable, optional
        Called as ``callback(row)`` after every outer iteration with the history row
        (objective, max violation, KKT residuals, rounds ...); used by progress bars.
        Requires ``history=True`` for the KKT fields.
    blas_threads : int or None
        OpenBLAS threads in this process during the solve (default 1: the parties' small
        subproblems run much faster single-threaded, and up to 100x faster on a busy
        machine; ``None`` leaves the setting alone). See :mod:`fedmodel.runtime.blas`.

    backend : {"serial", "processes", "ray", "flower"}
        Where the clients run: in this process one after the other (default); in
        persistent worker processes, clients sharded over them; in Ray actors (the
        optional extra ``fedmodel[ray]``); or behind Flower SuperNodes (``fedmodel[flower]``,
        see ``flower_grid``). Every backend gives the same iterates. This option and the
        ones below (runtime, failures, checkpoints) are those of every federated method run
        by the driver; see ``docs/runtime.md``.
    workers : int, optional
        Worker processes / Ray actors (default: one per core, at most one per client; one
        fewer with ``server_hosts_clients``).
    server_hosts_clients : bool
        ``"processes"`` and ``"ray"``: also run one shard of the clients in the server's
        own process, which otherwise sits idle while the clients compute (default False).
        Much faster on a machine with few cores (on 2 cores, processes: 1.55-1.73x over
        serial instead of 1.32-1.40x, ``benchmarks/RESULTS_backends.md``); the price is
        isolation: a client that crashes the interpreter (native code) ends the whole
        solve, and a client that hangs in native code cannot be interrupted by
        ``client_timeout``.
        Raising and Python-level timeouts are client failures as on every backend.
    ray_address : str, optional
        Address of a running Ray cluster to join (``ray.init(address=...)``); default
        starts a local Ray with ``num_cpus=workers`` (or joins the one already started in
        this process).
    ray_placement : dict, optional
        ``"ray"``: client name -> custom resource label; each client runs in an actor on a
        node of the cluster that offers that resource (``ray start ...
        --resources='{"site3": 1}'``), one actor per label. Every client needs a label.
    flower_grid : flwr Grid, optional
        ``"flower"``: the Grid of the Flower ServerApp the solve runs in (deployment, e.g.
        ``fedmodel serve``; each party runs ``fedmodel join``). Without it,
        ``backend="flower"`` runs Flower's simulation engine on this machine. See
        ``docs/deployment.md``.
    client_timeout : float, optional
        Seconds a client may take to handle one message; past it the step fails.
    on_failure : {"stop", "retry"}
        ``"stop"`` (default): a client that raises or times out ends the solve with status
        ``"client_failure"``, the client's name and error in ``res.failure``, and the last
        consistent iterate (end of the last completed outer iteration). ``"retry"``:
        the client's state is put back and the step re-sent up to ``retries`` times
        first. A dead worker (process or Ray actor) is a failure of all its clients and is
        not retried.
    retries : int
        Retries per step with ``on_failure="retry"``.
    reveal : list of str, or dict of client name to list of str, optional
        What each party enables beyond its method's default messages, by opt-in name
        (``"hessian"``: prox-al's ``inner_solver="newton"`` and ``penalty_metric="hessian"``
        send the party's ``d x d`` Hessian). Default None: in one process every party
        answers what the method's options ask for (one organisation holds every party). A
        list applies to every client, a dict to the clients it names (others enable none).
        A party refuses a request that needs an opt-in it did not enable: the run ends with
        status ``"client_failure"``, ``res.failure["kind"] == "refused"`` and the party and
        opt-in named. A deployed party (``fedmodel join``) decides with its own
        ``--reveal`` flag; this option never reaches it.
    checkpoint : str or path, optional
        Directory to write checkpoints to: the algorithm's state and every client's own
        state (written where the client runs) every ``checkpoint_every`` outer iterations,
        and on a client failure or Ctrl-C (status ``"interrupted"``).
    checkpoint_every : int
        Outer iterations between checkpoints.
    keep_ledger : bool
        Keep one ledger row per message (default); ``False`` keeps only counts per
        (channel, sender, receiver), for long runs (``res.ledger`` is then empty and
        ``res.communication`` still complete).
    resume : str or path, optional
        Continue from a checkpoint directory; the run reaches the same answer as an
        uninterrupted one. A corrupted checkpoint, or one written for another model,
        method or options, raises :class:`~fedmodel.runtime.checkpoint.CheckpointError`.
    secure_aggregation : bool or fedmodel.SecureAggregation
        The server learns only the sum over the clients of each message it uses as a sum
        (Flower's SecAgg+; the methods whose messages are all sum-only: fedavg, fedprox,
        and prox-al on its inner solvers quasi-newton / prox-quasi-newton; another is
        refused, naming the message read client by client). See
        ``docs/privacy.md``.
    dp : fedmodel.DP, optional
        Client-level differential privacy of the aggregated messages (clipping, Gaussian
        noise, an RDP accountant; status ``"budget_spent"``; ``res.privacy``). See
        ``docs/privacy.md``.
"""


def positive(name: str, value: Any, method: str | None = None) -> None:
    """Refuse ``value`` unless it is a finite real number > 0 (not a string, not a bool);
    the error names the option (and the method, when given).

    Examples
    --------
    >>> positive("step", 0.5)
    >>> positive("step", 0, method="fedavg")
    Traceback (most recent call last):
    ...
    fedmodel.errors.ModelError: fedavg: step must be a positive number, got 0
    """
    ok = (
        isinstance(value, (int, float, np.integer, np.floating))
        and not isinstance(value, (bool, np.bool_))
        and np.isfinite(float(value))
        and float(value) > 0
    )
    if not ok:
        where = f"{method}: " if method else ""
        raise ModelError(f"{where}{name} must be a positive number, got {value!r}")


def whole_number(name: str, value: Any, minimum: int = 1, method: str | None = None) -> None:
    """Refuse ``value`` unless it is an integer (not a bool) of at least ``minimum``.

    Examples
    --------
    >>> whole_number("max_outer", 200)
    >>> whole_number("max_outer", 2.5)
    Traceback (most recent call last):
    ...
    fedmodel.errors.ModelError: max_outer must be an integer >= 1, got 2.5
    """
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        where = f"{method}: " if method else ""
        raise ModelError(f"{where}{name} must be an integer >= {minimum}, got {value!r}")


def stop_only(default: Any = MISSING, *, default_factory: Any = MISSING) -> Any:
    """A dataclass field that is not part of the resume key: changing it between a
    checkpoint and its resume is allowed, because it never changes the iterates (a
    tolerance of a stopping test, an iteration cap, a callback, where the parties run,
    what is reported).

    Examples
    --------
    >>> from dataclasses import dataclass
    >>> @dataclass
    ... class Opts:
    ...     step: float = 0.1
    ...     max_steps: int = stop_only(100)
    >>> resume_key(Opts(step=0.5, max_steps=7))
    {'step': 0.5}
    """
    return field(default=default, default_factory=default_factory, metadata={"stop_only": True})


def is_stop_only(f) -> bool:
    """Whether the dataclass field ``f`` is declared :func:`stop_only`."""
    return bool(f.metadata.get("stop_only", False))


def resume_key(options: Any) -> dict[str, Any]:
    """The options a checkpoint must have been written with to be resumed: every field of
    the options dataclass not declared :func:`stop_only`, by name, as plain values
    (:func:`resume_value`).

    Examples
    --------
    >>> from fedmodel.algorithms.baselines.fedavg import FedProxOptions
    >>> key = resume_key(FedProxOptions(prox_coef=2.0, tol=1e-8))
    >>> key["prox_coef"], "tol" in key
    (2.0, False)
    """
    return {
        f.name: resume_value(getattr(options, f.name))
        for f in fields(options)
        if not is_stop_only(f)
    }


def resume_value(value: Any) -> Any:
    """``value`` as a plain value comparable across runs (JSON types): numpy arrays and
    scalars as lists and numbers, dicts and sequences element-wise, a dataclass (a
    schedule) field by field, a graph (an object with ``nodes`` and ``edges``) as its sorted
    nodes and edges; a function by its name and another object by its type (compared by
    name only: keep such options plain)."""
    return plain(value, _resume_object)


def _resume_object(value: Any) -> Any:
    """An option's value that is not a plain value or a container of them, for the key."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):  # e.g. a schedule
        return {
            "type": type(value).__qualname__,
            **{f.name: getattr(value, f.name) for f in fields(value)},
        }
    if hasattr(value, "nodes") and hasattr(value, "edges"):  # a networkx graph
        return {
            "nodes": sorted(str(n) for n in value.nodes),
            "edges": sorted(sorted((str(a), str(b))) for a, b in value.edges),
        }
    if callable(value):
        name = getattr(value, "__qualname__", type(value).__qualname__)
        return f"<callable {getattr(value, '__module__', '')}.{name}>"
    return f"<{type(value).__module__}.{type(value).__qualname__}>"


def build_options(cls, options: dict[str, Any], method: str):
    """Instantiate an options dataclass, refusing unknown names with the valid ones."""
    names = {f.name for f in fields(cls)}
    unknown = sorted(set(options) - names)
    if unknown:
        raise ModelError(
            f"unknown option(s) {unknown} for method '{method}'; valid: {sorted(names)}"
        )
    return cls(**options)


@dataclass
class RuntimeOptions:
    """Options every federated method run by :func:`fedmodel.algorithms.driver.run_federated`
    takes (where the clients run, failures, checkpoints, time limit, history); a method's
    options dataclass inherits them.

    Attributes
    ----------"""

    # every runtime option is stop-only: every backend gives the same iterates, and a
    # resumed run may run elsewhere, with other limits, history and checkpoints
    time_limit: float | None = stop_only(None)
    history: bool = stop_only(True)
    callback: Any = stop_only(None)
    blas_threads: int | None = stop_only(1)
    backend: str = stop_only("serial")
    workers: int | None = stop_only(None)
    server_hosts_clients: bool = stop_only(False)
    ray_address: str | None = stop_only(None)
    ray_placement: dict | None = stop_only(None)
    flower_grid: Any = stop_only(None)
    client_timeout: float | None = stop_only(None)
    on_failure: str = stop_only("stop")
    retries: int = stop_only(2)
    reveal: Any = stop_only(None)
    checkpoint: Any = stop_only(None)
    checkpoint_every: int = stop_only(1)
    resume: Any = stop_only(None)
    keep_ledger: bool = stop_only(True)
    # what the server may learn (docs/privacy.md; fedmodel/algorithms/dp.py): not stop-only,
    # since the noise of dp and the fixed point of secure aggregation change the iterates
    secure_aggregation: Any = False
    dp: Any = None

    @property
    def sums_only(self) -> bool:
        """Whether the server may learn only sums over clients: ``secure_aggregation`` or
        ``dp`` (whose sums are clipped and noised) is on."""
        return bool(self.secure_aggregation) or self.dp is not None

    @property
    def eps1(self) -> float:
        """The certificate's stationarity tolerance (``eps``; a method with a pair of
        tolerances defines its own)."""
        return float(self.eps)

    @property
    def eps2(self) -> float:
        """The certificate's feasibility tolerance (``eps``)."""
        return float(self.eps)

    def for_clients(self, **changes: Any):
        """These options as they travel to where the clients run: no callback and no
        Flower grid (objects of the coordinator's process), with ``changes`` applied."""
        return dataclasses.replace(self, callback=None, flower_grid=None, reveal=None, **changes)

    def validate(self, problem: Any, method: str) -> None:
        """Check the method's own options against the problem it is about to solve (the
        compiled model; a vertical problem; a learning model), naming the option. Each
        options class has this one check, called by the registry (``solve_model``; the
        vertical and learning entry points for theirs); the runtime options are checked by
        the driver (:meth:`validate_runtime`)."""

    def party_reveal(self, clients: list[str], known: list[str]) -> dict[str, Any]:
        """Client name -> the opt-ins it enables (``reveal``: None for every client when
        unset), checked against the client names and the opt-ins the method declares
        (``known``).

        Examples
        --------
        >>> RuntimeOptions(reveal=["hessian"]).party_reveal(["a", "b"], ["hessian"])
        {'a': frozenset({'hessian'}), 'b': frozenset({'hessian'})}
        """
        value = self.reveal
        if value is None:
            return {n: None for n in clients}

        def names(v: Any, where: str) -> frozenset[str]:
            if isinstance(v, str) or not all(isinstance(x, str) for x in v):
                raise ModelError(f"reveal{where} must be a list of opt-in names, got {v!r}")
            unknown = sorted(set(v) - set(known))
            if unknown:
                raise ModelError(
                    f"reveal{where}: unknown opt-in(s) {unknown}; this method declares {known}"
                )
            return frozenset(v)

        if isinstance(value, dict):
            unknown = sorted(map(str, set(value) - set(clients)))
            if unknown:
                raise ModelError(f"reveal names unknown clients {unknown} (clients: {clients})")
            return {n: names(value.get(n, ()), f" for client {n!r}") for n in clients}
        try:
            every = names(list(value), "")
        except TypeError:
            raise ModelError(f"reveal must be a list or a dict, got {value!r}") from None
        return {n: every for n in clients}

    def validate_runtime(self) -> None:
        """Check the runtime, failure and checkpoint options (the driver calls it)."""
        from fedmodel.runtime.base import BACKENDS, ON_FAILURE

        if self.backend not in BACKENDS:
            raise ModelError(f"backend must be one of {BACKENDS}, got {self.backend!r}")
        if self.workers is not None and (
            isinstance(self.workers, bool)
            or not isinstance(self.workers, (int, np.integer))
            or self.workers < 1
        ):
            raise ModelError(f"workers must be a positive integer or None, got {self.workers!r}")
        if not isinstance(self.server_hosts_clients, (bool, np.bool_)):
            raise ModelError(
                f"server_hosts_clients must be True or False, got {self.server_hosts_clients!r}"
            )
        if self.server_hosts_clients and self.backend == "serial":
            raise ModelError(
                "server_hosts_clients is for backend='processes' or 'ray' (with 'serial' "
                "every client runs in the server's process already)"
            )
        if self.ray_address is not None and not isinstance(self.ray_address, str):
            raise ModelError(f"ray_address must be a string, got {self.ray_address!r}")
        if self.ray_address is not None and self.backend != "ray":
            raise ModelError(
                f"ray_address is used by backend='ray' only (backend={self.backend!r})"
            )
        if self.ray_placement is not None:
            if self.backend != "ray":
                raise ModelError(
                    f"ray_placement is used by backend='ray' only (backend={self.backend!r})"
                )
            if not isinstance(self.ray_placement, dict) or not all(
                isinstance(k, str) and isinstance(v, str) and v
                for k, v in self.ray_placement.items()
            ):
                raise ModelError(
                    "ray_placement must map client names to resource labels (strings), got "
                    f"{self.ray_placement!r}"
                )
        if self.flower_grid is not None and self.backend != "flower":
            raise ModelError(
                f"flower_grid is used by backend='flower' only (backend={self.backend!r})"
            )
        if self.backend == "flower" and self.server_hosts_clients:
            raise ModelError("server_hosts_clients is for backend='processes' or 'ray'")
        if self.time_limit is not None:
            positive("time_limit", self.time_limit)
        if self.client_timeout is not None:
            positive("client_timeout", self.client_timeout)
        if self.on_failure not in ON_FAILURE:
            raise ModelError(f"on_failure must be one of {ON_FAILURE}, got {self.on_failure!r}")
        whole_number("retries", self.retries, minimum=0)
        for name in ("checkpoint", "resume"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, (str, os.PathLike)):
                raise ModelError(f"{name} must be a directory path, got {value!r}")
        whole_number("checkpoint_every", self.checkpoint_every)
        if self.checkpoint is not None and os.path.exists(self.checkpoint):
            if not os.path.isdir(self.checkpoint):
                raise ModelError(
                    f"checkpoint={os.fspath(self.checkpoint)!r} is a file; checkpoint= names a "
                    "directory (created if missing)"
                )
        if self.resume is not None and not os.path.isdir(self.resume):
            raise ModelError(f"resume={os.fspath(self.resume)!r}: no such checkpoint directory")


RuntimeOptions.__doc__ += RUNTIME_OPTIONS_DOC
