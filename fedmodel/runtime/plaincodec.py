"""Plain values and numpy arrays as (JSON text, list of arrays): no pickle, no classes.

One codec for everything fedmodel writes or sends that another trust domain reads back:
checkpoints (:mod:`fedmodel.runtime.checkpoint`) and, extended with the runtime's own
message types, what crosses a Flower link (:mod:`fedmodel.runtime.flower_codec`).

What it carries: ``None``, ``bool``, ``int``, ``float`` (``nan`` and ``inf`` included,
written with ``repr`` so every float round-trips bit for bit), ``str``, ``bytes``,
``slice``, numpy scalars (their dtype kept) and numeric or boolean numpy arrays (exact:
the arrays travel beside the text), and lists, tuples and dicts (any of these as keys)
of them. The decoder builds only these: it never looks a class or a function up by name,
so a crafted text can make nothing but plain values. Anything else is refused with a
:class:`PlainCodecError` naming where in the value it was.

A caller with types of its own passes ``extra`` hooks: the encoder's hook turns such a
value into ``{"__<tag>": ...}`` (returning :data:`NOT_HANDLED` for values it does not
know), the decoder's hook turns ``("__<tag>", ...)`` back (returning
:data:`NOT_HANDLED` for tags it does not know, which are then refused).

Examples
--------
>>> import numpy as np
>>> text, arrays = encode({"w": np.array([0.1, 1 / 3]), "tol": float("nan"), 3: (1, "a")})
>>> out = decode(text, arrays)
>>> out["w"].tolist() == [0.1, 1 / 3], bool(np.isnan(out["tol"])), out[3]
(True, True, (1, 'a'))
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Callable
from typing import Any

import numpy as np

#: the array dtype kinds that travel: bool, signed, unsigned, float, complex
ARRAY_KINDS = "biufc"

#: returned by an ``extra`` hook for a value (or tag) it does not handle
NOT_HANDLED = object()

_TAGS = ("__a", "__s", "__f", "__b", "__t", "__slice", "__d")


class PlainCodecError(ValueError):
    """A value the plain codec cannot write, or a text/array list it refuses to read."""


def plain(value: Any, other: Callable[[Any], Any] | None = None) -> Any:
    """``value`` as plain JSON values, one-way (for a record a person or a comparison reads,
    not a round trip: that is :func:`encode`): dicts with their keys as strings, lists and
    tuples as lists, numpy arrays as nested lists, numpy scalars as Python numbers, and a
    non-finite float as its text (``"nan"``, ``"inf"``, ``"-inf"``: JSON has no such
    number). Another object goes through ``other`` (its result made plain in turn), or is
    kept when ``other`` is None.

    Examples
    --------
    >>> import numpy as np
    >>> plain({1: np.array([0.5, np.nan]), "k": (np.int64(2), np.bool_(True))})
    {'1': [0.5, 'nan'], 'k': [2, True]}
    """
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        f = float(value)
        return f if math.isfinite(f) else repr(f)
    if isinstance(value, np.ndarray):
        return plain(value.tolist(), other)
    if isinstance(value, dict):
        return {str(k): plain(v, other) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v, other) for v in value]
    if other is None:
        return value
    return plain(other(value), other)


def _float(x: float) -> Any:
    x = float(x)
    if math.isfinite(x):
        return x
    return {"__f": repr(x)}  # 'nan', 'inf', '-inf'


def encode(
    obj: Any, extra: Callable[[Any, Callable[[Any], Any]], Any] | None = None
) -> tuple[str, list[np.ndarray]]:
    """``obj`` -> (JSON text, arrays).

    Parameters
    ----------
    obj : plain value
        See the module docstring for what may be in it.
    extra : callable, optional
        ``extra(value, enc)`` for values the codec does not know: a JSON value
        ``{"__<tag>": ...}`` (``enc`` encodes nested values), or :data:`NOT_HANDLED`.

    Examples
    --------
    >>> encode([1.5, float("inf")])
    ('[1.5, {"__f": "inf"}]', [])
    """
    arrays: list[np.ndarray] = []

    def array(a: np.ndarray) -> int:
        arrays.append(np.array(a, order="C"))  # (ascontiguousarray makes 0-d 1-d)
        return len(arrays) - 1

    def enc(v: Any, where: str = "value") -> Any:
        if v is None or isinstance(v, (bool, str)):
            return v
        if isinstance(v, int):
            return int(v)
        if isinstance(v, float):
            return _float(v)
        if isinstance(v, (np.ndarray, np.generic)):
            a = np.asarray(v)
            if a.dtype.kind not in ARRAY_KINDS:
                raise PlainCodecError(f"{where}: an array of dtype {a.dtype} cannot be written")
            if isinstance(v, np.ndarray):
                return {"__a": array(a)}
            return {"__s": array(np.reshape(a, (1,)))}  # a numpy scalar keeps its type
        if isinstance(v, bytes):
            return {"__b": base64.b64encode(v).decode("ascii")}
        if isinstance(v, slice):
            return {"__slice": [enc(v.start, where), enc(v.stop, where), enc(v.step, where)]}
        if type(v) is list:
            return [enc(x, f"{where}[{i}]") for i, x in enumerate(v)]
        if type(v) is tuple:
            return {"__t": [enc(x, f"{where}[{i}]") for i, x in enumerate(v)]}
        if type(v) is dict:
            if all(isinstance(k, str) and not k.startswith("__") for k in v):
                return {k: enc(x, f"{where}[{k!r}]") for k, x in v.items()}
            return {"__d": [[enc(k, where), enc(x, f"{where}[{k!r}]")] for k, x in v.items()]}
        if extra is not None:
            out = extra(v, enc)
            if out is not NOT_HANDLED:
                return out
        raise PlainCodecError(
            f"{where}: a {type(v).__name__} cannot be written (only plain values, numpy "
            f"arrays, lists, tuples and dicts of them): {v!r:.80}"
        )

    text = json.dumps(enc(obj), allow_nan=False)
    return text, arrays


def decode(
    text: str,
    arrays: list[np.ndarray],
    extra: Callable[[str, Any, Callable[[Any], Any]], Any] | None = None,
    *,
    max_depth: int | None = None,
    max_items: int | None = None,
) -> Any:
    """The inverse of :func:`encode`: builds only plain values and the given arrays.

    ``extra(tag, x, dec)`` decodes ``{"__<tag>": x}`` entries of the caller's own types
    (or returns :data:`NOT_HANDLED`); any other ``"__"`` entry, an array index out of
    range, an array of another dtype kind or a malformed entry raises
    :class:`PlainCodecError`, as do values nested deeper than ``max_depth`` or more than
    ``max_items`` values in all (each JSON value, key or element counts one), counted
    before any value is built.

    Examples
    --------
    >>> decode('{"__t": [1, {"__f": "nan"}]}', [])
    (1, nan)
    """

    def arr(i: Any) -> np.ndarray:
        if type(i) is not int or not 0 <= i < len(arrays):
            raise PlainCodecError(f"array reference {i!r} out of range ({len(arrays)} arrays)")
        a = arrays[i]
        if not isinstance(a, np.ndarray) or a.dtype.kind not in ARRAY_KINDS:
            raise PlainCodecError(f"array {i} is not a numeric array")
        return a

    def seq(x: Any, n: int | None = None) -> list:
        if type(x) is not list or (n is not None and len(x) != n):
            raise PlainCodecError(f"malformed entry {x!r:.60}")
        return x

    def dec(v: Any) -> Any:
        if isinstance(v, list):
            return [dec(x) for x in v]
        if not isinstance(v, dict):
            return v
        if len(v) == 1:
            ((key, x),) = v.items()
            if key.startswith("__"):
                if key == "__a":
                    return np.array(arr(x))
                if key == "__s":
                    a = arr(x)
                    if a.size != 1:
                        raise PlainCodecError(f"scalar array {x} has {a.size} elements")
                    return a.reshape(-1)[0]
                if key == "__f":
                    if x not in ("nan", "inf", "-inf"):
                        raise PlainCodecError(f"malformed float {x!r:.60}")
                    return float(x)
                if key == "__b":
                    if not isinstance(x, str):
                        raise PlainCodecError("malformed bytes entry")
                    return base64.b64decode(x, validate=True)
                if key == "__t":
                    return tuple(dec(e) for e in seq(x))
                if key == "__slice":
                    return slice(*(dec(e) for e in seq(x, 3)))
                if key == "__d":
                    out = {}
                    for pair in seq(x):
                        k, e = seq(pair, 2)
                        k = dec(k)
                        try:
                            out[k] = dec(e)
                        except TypeError as exc:  # an unhashable key
                            raise PlainCodecError(f"malformed dict key {k!r:.60}") from exc
                    return out
                if extra is not None:
                    out = extra(key, x, dec)
                    if out is not NOT_HANDLED:
                        return out
                raise PlainCodecError(f"unknown entry {key!r:.40}")
        return {k: dec(e) for k, e in v.items()}

    try:
        parsed = json.loads(text)
    except ValueError as exc:
        raise PlainCodecError(f"not a JSON text ({exc})") from exc
    if max_depth is not None or max_items is not None:
        _check_size(parsed, max_depth, max_items)
    return dec(parsed)


def _check_size(parsed: Any, max_depth: int | None, max_items: int | None) -> None:
    """Refuse a parsed JSON value nested deeper than ``max_depth`` or holding more than
    ``max_items`` values (breadth first: the walk stops at the first excess)."""
    depth_cap = float("inf") if max_depth is None else max_depth
    item_cap = float("inf") if max_items is None else max_items
    level, items, depth = [parsed], 0, 0
    while level:
        depth += 1
        if depth > depth_cap:
            raise PlainCodecError(f"values nested deeper than {max_depth}")
        items += len(level)
        if items > item_cap:
            raise PlainCodecError(f"more than {max_items} values")
        nxt: list = []
        for v in level:
            if isinstance(v, list):
                nxt.extend(v)
            elif isinstance(v, dict):
                nxt.extend(v.values())
                items += len(v)  # (its keys)
        if items + len(nxt) > item_cap:
            raise PlainCodecError(f"more than {max_items} values")
        level = nxt


__all__ = ["NOT_HANDLED", "PlainCodecError", "decode", "encode"]
