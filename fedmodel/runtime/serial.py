"""The serial runtime: every party runs in this process, one after the other.

Algorithms reach clients only through a runtime: they send a message and receive the
reply. Each client endpoint owns its own state (data, compiled subproblem, multipliers)
and never sees another's. Other runtimes (processes, Ray) implement the same interface
(:class:`~fedmodel.runtime.base.Runtime`).
"""

from __future__ import annotations

from collections.abc import Iterable, KeysView, Mapping
from typing import Any, Protocol

from fedmodel.runtime.base import Runtime, raise_build_errors
from fedmodel.runtime.endpoints import EndpointFactory
from fedmodel.runtime.host import PartyHost
from fedmodel.runtime.messages import Message
from fedmodel.runtime.placement import SERVER_HOST


class Endpoint(Protocol):
    """A party's message handler: takes a message, returns the reply."""

    name: str

    def handle(self, msg: Message) -> Message: ...


class SerialRuntime(Runtime):
    """Deliver messages to in-process client endpoints and record them in a ledger.

    Parameters
    ----------
    endpoints : mapping of client name to endpoint or :class:`EndpointFactory`
        Objects with ``name`` and ``handle(message) -> reply`` (factories are built here).
    client_timeout, on_failure, retries :
        Failure policy (see :class:`~fedmodel.runtime.base.Runtime`).
    propagate_errors : bool
        Re-raise a client's exception unchanged (default, the historical behaviour when
        the runtime is used directly) instead of :class:`ClientFailure`.
    """

    backend = "serial"

    def __init__(
        self,
        endpoints: Mapping[str, Endpoint | EndpointFactory],
        *,
        client_timeout: float | None = None,
        on_failure: str = "stop",
        retries: int = 0,
        propagate_errors: bool | None = None,
    ):
        if propagate_errors is None:
            propagate_errors = not any(isinstance(e, EndpointFactory) for e in endpoints.values())
        super().__init__(
            client_timeout=client_timeout,
            on_failure=on_failure,
            retries=retries,
            propagate_errors=propagate_errors,
        )
        self.endpoints: dict[str, Any] = {}
        self._local = PartyHost(outbox=self, endpoints=self.endpoints)
        factories = {n: e for n, e in endpoints.items() if isinstance(e, EndpointFactory)}
        errors = self._local.build(factories)
        raise_build_errors(self, errors, list(endpoints))
        for n, e in endpoints.items():  # keep the given order
            if not isinstance(e, EndpointFactory):
                self.endpoints[n] = e
            else:
                self.endpoints[n] = self.endpoints.pop(n)
        self.client_seconds = {n: 0.0 for n in self.endpoints}

    # The placement is dynamic: callers may add endpoints to ``self.endpoints``.
    @property
    def _host_of(self) -> Mapping[str, int]:
        endpoints = getattr(self, "endpoints", {})
        view = self.__dict__.get("_one_host")  # (one view per endpoints dict)
        if view is None or view._endpoints is not endpoints:
            view = self.__dict__["_one_host"] = _OneHost(endpoints)
        return view

    @_host_of.setter
    def _host_of(self, value) -> None:
        pass

    @property
    def placement(self) -> dict[str, Any]:
        """Client -> where it runs: ``"server"`` (:data:`SERVER_HOST`) for every one."""
        return dict.fromkeys(self.endpoints, SERVER_HOST)

    def _map(self, calls, steps):
        return {h: self._run_local(method, args) for h, (method, args) in calls.items()}


class _OneHost(Mapping):
    """Every endpoint in the server's process (host :data:`SERVER_HOST`): a live view of
    ``endpoints`` (no copy per message)."""

    def __init__(self, endpoints: dict) -> None:
        self._endpoints = endpoints

    def __getitem__(self, name: str) -> int:
        if name not in self._endpoints:
            raise KeyError(name)
        return SERVER_HOST

    def __contains__(self, name: object) -> bool:
        return name in self._endpoints

    def get(self, name: str, default: Any = None) -> Any:
        return SERVER_HOST if name in self._endpoints else default

    def keys(self) -> KeysView[str]:
        """The endpoints' names (a dict's view: its membership test is one C call)."""
        return self._endpoints.keys()

    def all_in_server(self, names: Iterable[str]) -> bool:
        """Whether every party of ``names`` is one of these endpoints (all run here)."""
        return all(map(self._endpoints.__contains__, names))

    def __iter__(self):
        return iter(self._endpoints)

    def __len__(self) -> int:
        return len(self._endpoints)
