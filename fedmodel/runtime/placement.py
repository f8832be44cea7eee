"""Where clients run: sharding parties over hosts (worker processes, Ray actors, and
optionally the server's own process, host :data:`SERVER_HOST`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# The host key of the clients that run in the server's own process (see the module docstring).
SERVER_HOST = "server"


def shard(names: list[str], n_hosts: int, weights: Mapping[str, float] | None = None) -> dict:
    """Assign parties to ``n_hosts`` hosts: heaviest first onto the least loaded host
    (ties broken by client order), so the result is deterministic."""
    n_hosts = max(1, min(int(n_hosts), len(names)))
    w = {n: float((weights or {}).get(n, 1.0)) for n in names}
    order = sorted(range(len(names)), key=lambda i: (-w[names[i]], i))
    load = [0.0] * n_hosts
    out = {}
    for i in order:
        h = min(range(n_hosts), key=lambda j: (load[j], j))
        out[names[i]] = h
        load[h] += max(w[names[i]], 1e-9)
    return {n: out[n] for n in names}


def placement(
    names: list[str],
    workers: int,
    weights: Mapping[str, float] | None = None,
    server_hosts_clients: bool = False,
) -> dict[str, Any]:
    """Client -> host: worker indices ``0 .. workers - 1`` (see :func:`shard`) and, with
    ``server_hosts_clients``, :data:`SERVER_HOST` for one more shard that runs in the
    server's own process (the shard the greedy fills last, the lightest: the server also
    does its own work each round).

    Examples
    --------
    >>> placement(["a", "b", "c", "d"], 1, server_hosts_clients=True)
    {'a': 0, 'b': 'server', 'c': 0, 'd': 'server'}
    """
    if not server_hosts_clients:
        return shard(names, workers, weights)
    place = shard(names, int(workers) + 1, weights)
    last = max(place.values(), default=0)
    return {n: (SERVER_HOST if h == last else h) for n, h in place.items()}


def default_workers(available: float | int | None, server_hosts_clients: bool) -> int:
    """Worker processes / actors when the user gives none: one per core, less the one the
    server's process takes when it hosts clients (at least one)."""
    cores = int(available or 1)
    return max(1, cores - 1) if server_hosts_clients else max(1, cores)
