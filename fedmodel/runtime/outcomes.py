"""What happens when a party handles one message: :class:`StepOutcome`, and the errors a
failed step turns into (:class:`ClientFailure`, :class:`ClientTimeout`, :class:`StepInterrupted`).
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field
from typing import Any

from fedmodel.errors import FedModelError
from fedmodel.runtime.messages import Message


# -- failures ------------------------------------------------------------------------------------
class ClientTimeout(BaseException):
    """Raised inside a party's step when it exceeds ``client_timeout`` (a BaseException so
    that a client's own ``except Exception`` does not swallow it)."""


class StepInterrupted(BaseException):
    """Raised inside a worker's step when the server was interrupted (Ctrl-C)."""


class InvalidReply(FedModelError):
    """What a party sent does not fit the method's declared message table (see
    :mod:`fedmodel.runtime.schema`): the runtime turns it into a failure of that party
    (:class:`StepOutcome` of kind ``"invalid_reply"``).

    Attributes
    ----------
    party, kind : str
        Who sent it, and the message kind it answered.
    field : str or None
        The offending field (None: the message as a whole).
    """

    def __init__(self, party: str, kind: str, field: str | None, message: str):
        self.party, self.kind, self.field = party, kind, field
        super().__init__(message)

    def __reduce__(self):
        return (InvalidReply, (self.party, self.kind, self.field, str(self)))


class RequestRefused(FedModelError):
    """A party refuses a request it did not enable: a message kind, or a value of one of
    its fields, that would make it reveal more than its method's default messages, when
    the party did not enable that opt-in (``fedmodel join --reveal``; in one process the
    solve's ``reveal`` option). The runtime reports it as a failure of that party of kind
    ``"refused"`` (not retried: the party answers the same)."""


@dataclass
class StepOutcome:
    """What happened when a party handled one message."""

    name: str
    reply: Any = None  # the reply Message (or an activation's return value)
    error: BaseException | None = None
    # "ok", "raised", "timeout", "interrupted", "dead", "invalid_reply", "refused", or
    # "lost": the party's worker died (or hung) in another party's step; it is gone, but
    # not to blame
    kind: str = "ok"
    seconds: float = 0.0
    detail: str = ""  # traceback text of the error
    sent: list[Message] = field(default_factory=list)  # peer messages sent while handling

    @property
    def ok(self) -> bool:
        return self.kind == "ok"

    @property
    def retryable(self) -> bool:
        return self.kind in ("raised", "timeout")

    def describe(self) -> str:
        if self.kind in ("dead", "lost"):
            return str(self.error)
        if self.kind in ("timeout", "invalid_reply", "refused"):
            return str(self.error)
        return f"{type(self.error).__name__}: {self.error}"


class ClientFailure(FedModelError):
    """One or more clients failed a step (raised, timed out, or their worker died) and the
    failure policy did not recover it.

    Attributes
    ----------
    failures : dict
        Client name -> :class:`StepOutcome` of the failed step, the failed clients first
        and then those lost with a failed client's worker (kind ``"lost"``).
    round : int
        Communication round of the step.
    kind : str
        Message kind of the step.
    """

    def __init__(self, failures: dict[str, StepOutcome], round_: int, kind: str):
        items = list(failures.items())
        self.failures = dict(
            [(n, o) for n, o in items if o.kind != "lost"]
            + [(n, o) for n, o in items if o.kind == "lost"]
        )
        self.round = int(round_)
        self.kind = kind
        parts = [f"client '{n}' ({o.kind}): {o.describe()}" for n, o in self.failures.items()]
        super().__init__(f"round {round_}, message '{kind}': " + "; ".join(parts))

    def __reduce__(self):
        return (ClientFailure, (self.failures, self.round, self.kind))

    @property
    def clients(self) -> list[str]:
        return list(self.failures)

    @property
    def blamed(self) -> list[str]:
        """The clients that failed: not those lost only because they shared a worker
        with one that did (all of them when no step can be blamed)."""
        own = [n for n, o in self.failures.items() if o.kind != "lost"]
        return own or list(self.failures)


def portable_exception(exc: BaseException) -> BaseException:
    """``exc`` if it survives pickling, else a RuntimeError carrying its text."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc}")
