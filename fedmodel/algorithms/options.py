"""Option helpers shared by every method: validation of numbers and building an options
dataclass from ``model.solve(**options)`` with a clear error for unknown names.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from fedmodel.errors import ModelError

# The runtime options' documentation, appended to every federated method's options docstring.
RUNTIME_OPTIONS_DOC = """
    time_limit : float or None
        Wall-clock seconds; the solve returns status ``"time_limit"`` when exceeded.
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
"""


def positive(name: str, value: Any) -> None:
    """Refuse ``value`` unless it is a finite real number > 0 (not a string, not a bool)."""
    ok = (
        isinstance(value, (int, float, np.integer, np.floating))
        and not isinstance(value, (bool, np.bool_))
        and np.isfinite(float(value))
        and float(value) > 0
    )
    if not ok:
        raise ModelError(f"{name} must be a positive number, got {value!r}")


def whole_number(name: str, value: Any, minimum: int = 1) -> None:
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
        raise ModelError(f"{name} must be an integer >= {minimum}, got {value!r}")


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

    time_limit: float | None = None
    history: bool = True
    callback: Any = None
    blas_threads: int | None = 1
    backend: str = "serial"
    workers: int | None = None
    server_hosts_clients: bool = False
    ray_address: str | None = None
    ray_placement: dict | None = None
    flower_grid: Any = None
    client_timeout: float | None = None
    on_failure: str = "stop"
    retries: int = 2
    checkpoint: Any = None
    checkpoint_every: int = 1
    resume: Any = None
    keep_ledger: bool = True

    def validate_runtime(self) -> None:
        """Check the runtime, failure and checkpoint options."""
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
