"""Exceptions raised by fedmodel.

Every error raised while declaring or compiling a model names the party and the term at
fault, so that a user with twenty clients knows where to look.
"""

from __future__ import annotations


class FedModelError(Exception):
    """Base class of all fedmodel errors."""


class ModelError(FedModelError, ValueError):
    """A model is declared wrongly.

    Parameters
    ----------
    message : str
        What is wrong.
    party : str, optional
        Name of the party (client or ``"server"``) whose declaration is at fault.
    term : str, optional
        The offending term or constraint, as cvxpy prints it.
    """

    def __init__(self, message: str, party: str | None = None, term: str | None = None):
        self.party = party
        self.term = term
        prefix = f"[{party}] " if party else ""
        suffix = f"\n    term: {_shorten(term)}" if term else ""
        super().__init__(f"{prefix}{message}{suffix}")


class NonConvexError(ModelError):
    """A term or constraint is not DCP-convex and was not opted in with ``allow_nonconvex``."""


class OwnershipError(ModelError):
    """A party's expression uses data (or a variable) that belongs to another party."""


class DataError(ModelError):
    """Data handed to a party is malformed (NaN/inf, wrong type, shape mismatch)."""


class UnsupportedError(ModelError):
    """A term is valid cvxpy but outside what the chosen method can handle."""


def _shorten(text: str, limit: int = 160) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
