"""The cyclic garbage collector during a solve.

A solve with many parties holds millions of long-lived objects (the parties' data, their
compiled programs and states) and allocates many short-lived ones every round (messages,
replies, ledger rows). CPython's full collections scan every tracked object, so with
thousands of parties they cost a large share of a round's CPU while finding nothing among
the long-lived ones. Once the parties are built, their objects move to the collector's
permanent generation (:func:`gc.freeze`) and full collections scan only what the rounds
allocate; the end of the solve moves them back (:func:`gc.unfreeze`). Frozen objects are
still freed by reference counting as usual; only cycles among them wait for the unfreeze.
Building the parties freezes every few parties (:func:`freeze_built`: what a build
allocates is the parties' own long-lived objects, so it is not scanned for cycles first;
the few a build leaves wait for the unfreeze), and every round's end freezes what survived
the round (the ledger's rows, the history) after a collection of the young generations
(:func:`resettle`), so the full collections of a long solve never scan its records either.

A process whose collector is disabled, or that already froze objects of its own, is left
as it is.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["freeze_built", "resettle", "settle", "settled_heap", "unsettle"]

_SETTLED = False  # (this module froze the heap and has not unfrozen it)
_THRESHOLDS: tuple[int, int, int] | None = None  # (the process's own, while settled)
#: the collector's thresholds while settled: a round allocates tens of thousands of
#: short-lived containers (messages, payloads, outcomes), most of which die before a young
#: generation of 50,000 fills, and what the oldest generation gains in a round is frozen at
#: its end, so its collections can be rare
SETTLED_THRESHOLDS = (50_000, 20, 100)


def settle() -> bool:
    """Freeze the objects tracked now (see the module's docstring); False when the
    process manages its collector itself (disabled, or objects frozen by someone else).

    Examples
    --------
    >>> from fedmodel.runtime.heap import settle, unsettle
    >>> frozen = settle()
    >>> unsettle()
    """
    global _SETTLED, _THRESHOLDS
    if _SETTLED:
        resettle()  # (what was built since the last settle)
        return True
    if not gc.isenabled() or gc.get_freeze_count():
        return False
    gc.freeze()
    _SETTLED = True
    _THRESHOLDS = gc.get_threshold()
    gc.set_threshold(*(max(a, b) for a, b in zip(SETTLED_THRESHOLDS, _THRESHOLDS)))
    return True


def resettle() -> None:
    """At a round's end: collect the young generations' cycles, then freeze what survived
    (nothing when the heap is not settled)."""
    if _SETTLED:
        gc.collect(1)
        gc.freeze()


def freeze_built() -> None:
    """While parties are built: freeze what was allocated since the last freeze, without
    a collection (nothing when the heap is not settled)."""
    if _SETTLED:
        gc.freeze()


def unsettle() -> None:
    """Move what :func:`settle` froze back to the collector (nothing if it froze nothing)."""
    global _SETTLED, _THRESHOLDS
    if _SETTLED:
        gc.unfreeze()
        if _THRESHOLDS is not None:
            gc.set_threshold(*_THRESHOLDS)
            _THRESHOLDS = None
        _SETTLED = False


@contextmanager
def settled_heap() -> Iterator[bool]:
    """:func:`settle` for the block, :func:`unsettle` after it (unless the heap was
    settled before the block: the outer owner unsettles).

    Examples
    --------
    >>> from fedmodel.runtime.heap import settled_heap
    >>> with settled_heap():
    ...     total = sum(range(10))
    >>> total
    45
    """
    owner = not _SETTLED
    settled = settle()
    try:
        yield settled
    finally:
        if owner:
            unsettle()
