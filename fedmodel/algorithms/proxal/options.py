"""Options of ``prox-al``, ``admm`` and ``cprox-al`` (seed 000), with the paper's names,
defaults and validation.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedmodel.algorithms.options import positive as _positive
from fedmodel.errors import ModelError

# Defaults follow seed 000 Section 5.1 (sbar = 0.1, beta = 10, rho = 1, mu0 = 0). The paper
# does not state q; any q in (0, 1) is covered by its Theorem 4.2, and with exact local
# solves a smaller q only removes idle inner rounds, so 0.5 is used.


@dataclass
class ProxALOptions:
    """Options of ``prox-al`` (seed 000 Algorithm 1 + Algorithm 2) and ``cprox-al``.

    Attributes
    ----------
    eps : float or (float, float)
        KKT tolerances (eps1 stationarity, eps2 feasibility) of Definition 1.
    beta : float
        Penalty parameter (Algorithm 1).
    sbar : float, optional
        Inner tolerance scale: tau_k = sbar / (k + 1)^2. Default ``100 * eps1``, which is
        the paper's 0.1 at eps = 1e-3 and keeps the number of outer iterations needed by
        (8) (tau_k <= eps1 requires k + 1 >= sqrt(sbar / eps1)) independent of eps.
    rho : float or dict or sequence
        ADMM penalty rho_i of each client (Algorithm 2).
    q : float
        Server/client local tolerance decay eps_{t+1} = q^t (Algorithm 2).
    mu0 : float
        Initial multipliers (all parties), >= 0.
    w0 : None, array, dict or "sphere"
        Starting point (default zeros, projected onto dom h); ``"sphere"`` draws it from the
        unit sphere with ``random_state`` as in the paper's experiments.
    max_outer, max_inner : int
        Iteration caps of Algorithms 1 and 2.
    local_floor : float
        Local solves are asked for max(q^t, local_floor * tau_k): once q^t is far below
        the inner target tau_k, tighter local solves cannot change the test (19), which
        stays a valid bound on dist(0, d l_k) because it uses the server's measured
        residual and the clients' exact eps~_i (Theorem 4.1's proof).
    solver : {"auto", "lbfgs", "cvxpy"}
        Subproblem backend of every party.
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

    Runtime, failures and checkpoints (federated methods ``prox-al`` and ``admm``; see
    ``docs/runtime.md``):

    backend : {"serial", "processes", "ray"}
        Where the clients run: in this process one after the other (default); in
        persistent worker processes, clients sharded over them; or in Ray actors (the
        optional extra ``fedmodel[ray]``). Every backend gives the same iterates.
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
    resume : str or path, optional
        Continue from a checkpoint directory; the run reaches the same answer as an
        uninterrupted one. A corrupted checkpoint, or one written for another model,
        method or options, raises :class:`~fedmodel.runtime.checkpoint.CheckpointError`.
    """

    eps: Any = 1e-3
    beta: float = 10.0
    sbar: float | None = None
    rho: Any = 1.0
    q: float = 0.5
    mu0: float = 0.0
    w0: Any = None
    random_state: Any = None
    max_outer: int = 500
    max_inner: int = 500
    max_local_iter: int = 10_000
    local_floor: float = 1e-3
    solver: str = "auto"
    time_limit: float | None = None
    history: bool = True
    divergence_limit: float = 1e10
    callback: Any = None
    blas_threads: int | None = 1
    backend: str = "serial"
    workers: int | None = None
    server_hosts_clients: bool = False
    ray_address: str | None = None
    client_timeout: float | None = None
    on_failure: str = "stop"
    retries: int = 2
    checkpoint: Any = None
    checkpoint_every: int = 1
    resume: Any = None

    def __post_init__(self) -> None:
        if self.sbar is None:
            try:
                self.sbar = 100.0 * self.eps1
            except (TypeError, ValueError, IndexError):
                self.sbar = 0.1  # validate() reports the bad eps

    @property
    def eps1(self) -> float:
        return float(self.eps[0] if np.ndim(self.eps) else self.eps)

    @property
    def eps2(self) -> float:
        return float(self.eps[1] if np.ndim(self.eps) else self.eps)

    def validate(self, client_names: list[str]) -> None:
        if np.ndim(self.eps) not in (0, 1) or (np.ndim(self.eps) == 1 and len(self.eps) != 2):
            raise ModelError(f"eps must be a float or a pair (eps1, eps2), got {self.eps!r}")
        _positive("eps1", self.eps1)
        _positive("eps2", self.eps2)
        _positive("beta", self.beta)
        _positive("sbar", self.sbar)
        if not 0 < self.q < 1:
            raise ModelError(f"q must lie in (0, 1), got {self.q!r}")
        if self.mu0 < 0:
            raise ModelError(f"mu0 must be >= 0, got {self.mu0!r}")
        for name in ("max_outer", "max_inner", "max_local_iter"):
            if int(getattr(self, name)) < 1:
                raise ModelError(f"{name} must be >= 1, got {getattr(self, name)!r}")
        for name, r in self.rho_per_client(client_names).items():
            _positive(f"rho for client '{name}'", r)
        self.validate_runtime()

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
        if self.client_timeout is not None:
            _positive("client_timeout", self.client_timeout)
        if self.on_failure not in ON_FAILURE:
            raise ModelError(f"on_failure must be one of {ON_FAILURE}, got {self.on_failure!r}")
        if (
            isinstance(self.retries, bool)
            or not isinstance(self.retries, (int, np.integer))
            or self.retries < 0
        ):
            raise ModelError(f"retries must be an integer >= 0, got {self.retries!r}")
        for name in ("checkpoint", "resume"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, (str, os.PathLike)):
                raise ModelError(f"{name} must be a directory path, got {value!r}")
        if (
            isinstance(self.checkpoint_every, bool)
            or not isinstance(self.checkpoint_every, (int, np.integer))
            or self.checkpoint_every < 1
        ):
            raise ModelError(
                f"checkpoint_every must be an integer >= 1, got {self.checkpoint_every!r}"
            )
        if self.resume is not None and not os.path.isdir(self.resume):
            raise ModelError(f"resume={os.fspath(self.resume)!r}: no such checkpoint directory")

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
