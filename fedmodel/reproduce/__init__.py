"""One-command reproductions of the seed papers' tables and figures.

Each reproduction registers itself with :func:`register`; ``fedmodel reproduce NAME``
and :func:`run` look it up here. A reproduction is a function
``fn(out_dir: pathlib.Path, trials: int, quick: bool, progress: bool) -> dict`` that writes
its Markdown/CSV/PNG files into ``out_dir`` and returns a summary (including the checks it
made, for ``--quick`` runs in CI).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

REPRODUCTIONS: dict[str, Callable[..., dict[str, Any]]] = {}
_MODULES = (
    "fedmodel.reproduce.seed000",
    "fedmodel.reproduce.dald",
    "fedmodel.reproduce.vfl",
    "fedmodel.reproduce.ssca",
)


def register(name: str):
    """Decorator registering a reproduction under ``name``."""

    def wrap(fn):
        REPRODUCTIONS[name] = fn
        return fn

    return wrap


def available() -> list[str]:
    _load()
    return sorted(REPRODUCTIONS)


def run(name: str, **kwargs: Any) -> dict[str, Any]:
    """Run the reproduction ``name``."""
    _load()
    if name not in REPRODUCTIONS:
        raise KeyError(f"unknown reproduction {name!r}; available: {sorted(REPRODUCTIONS)}")
    return REPRODUCTIONS[name](**kwargs)


def _load() -> None:
    for mod in _MODULES:
        try:
            importlib.import_module(mod)
        except ModuleNotFoundError as exc:
            if exc.name != mod:
                raise
