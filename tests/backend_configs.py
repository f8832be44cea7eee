"""The backends that the runtime, failure and ledger tests run on: the three backends, and
the processes and Ray backends with one shard of the clients in the server's own process
(``server_hosts_clients=True``)."""

from __future__ import annotations

BACKENDS = ["serial", "processes", "ray", "processes+server", "ray+server"]
REMOTE = [b for b in BACKENDS if b != "serial"]


def on(backend: str) -> dict:
    """Solve options of a backend id: ``"processes+server"`` ->
    ``{"backend": "processes", "server_hosts_clients": True}``."""
    name, _, extra = backend.partition("+")
    if extra not in ("", "server"):
        raise ValueError(f"unknown backend id {backend!r}")
    return {"backend": name, **({"server_hosts_clients": True} if extra else {})}
