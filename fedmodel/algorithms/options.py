"""Option helpers shared by every method: validation of numbers and building an options
dataclass from ``model.solve(**options)`` with a clear error for unknown names.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

import numpy as np

from fedmodel.errors import ModelError


def positive(name: str, value: Any) -> None:
    try:
        ok = float(value) > 0 and np.isfinite(float(value))
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ModelError(f"{name} must be a positive number, got {value!r}")


def build_options(cls, options: dict[str, Any], method: str):
    """Instantiate an options dataclass, refusing unknown names with the valid ones."""
    names = {f.name for f in fields(cls)}
    unknown = sorted(set(options) - names)
    if unknown:
        raise ModelError(
            f"unknown option(s) {unknown} for method '{method}'; valid: {sorted(names)}"
        )
    return cls(**options)
