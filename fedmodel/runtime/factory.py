"""``make_runtime``: start the runtime of a backend and build every client's endpoint where
it runs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from fedmodel.errors import ModelError
from fedmodel.runtime.base import BACKENDS, Runtime
from fedmodel.runtime.endpoints import EndpointFactory


def make_runtime(
    backend: str,
    factories: Mapping[str, EndpointFactory],
    *,
    workers: int | None = None,
    ray_address: str | None = None,
    client_timeout: float | None = None,
    on_failure: str = "stop",
    retries: int = 0,
    weights: Mapping[str, float] | Callable[[], Mapping[str, float]] | None = None,
    server_hosts_clients: bool = False,
    ray_placement: Mapping[str, str] | None = None,
    flower_grid: Any = None,
) -> Runtime:
    """Start the runtime of ``backend`` and build every client's endpoint where it runs.

    ``weights`` (processes and Ray): client -> its share of a host's load, or a function
    without arguments that gives them (called only by the backends that place clients by
    weight).

    ``server_hosts_clients`` (processes and Ray): one shard of the clients runs in the
    server's own process too (see :func:`placement`); ignored by ``"serial"``, where
    every client does.

    ``ray_placement`` (Ray): client -> custom resource label; each client runs in an actor
    on a node that carries its label (one actor per label).

    ``flower_grid`` (Flower): the Grid of the ServerApp this runs in (deployment); without
    one, Flower's simulation engine is started (see :mod:`fedmodel.runtime.flower_runtime`).

    Errors raised while building an endpoint (e.g. an unsupported term) are re-raised
    here unchanged.
    """
    policy = dict(client_timeout=client_timeout, on_failure=on_failure, retries=retries)
    if backend in ("processes", "ray") and callable(weights):
        weights = weights()
    where = dict(weights=weights, server_hosts_clients=bool(server_hosts_clients))
    if backend == "serial":
        from fedmodel.runtime.serial import SerialRuntime

        rt = SerialRuntime(dict(factories), **policy)
    elif backend == "processes":
        from fedmodel.runtime.processes import ProcessRuntime

        rt = ProcessRuntime(factories, workers=workers, **where, **policy)
    elif backend == "ray":
        from fedmodel.runtime.ray_runtime import RayRuntime

        rt = RayRuntime(
            factories,
            workers=workers,
            address=ray_address,
            labels=ray_placement,
            **where,
            **policy,
        )
    elif backend == "flower":
        from fedmodel.runtime.flower_runtime import FlowerRuntime

        rt = FlowerRuntime(factories, grid=flower_grid, **policy)
    else:
        raise ModelError(f"unknown backend {backend!r}; choose one of {BACKENDS}")
    return rt
