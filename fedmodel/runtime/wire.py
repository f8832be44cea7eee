"""What a party may build from a coordinator's message: a closed registry, by name.

A deployed party (``fedmodel join``) receives, once, the ``build`` call of the method's
client half: an :class:`~fedmodel.runtime.endpoints.EndpointFactory` whose target is the
client-half class and whose arguments are numbers, arrays and option dataclasses. What
crosses the link is never a module path or an attribute chain, only a **registered
name** (``"proxal.client"``), looked up in this module's table; a name that is not in it
is refused with a :class:`CodecError` naming it.

* **Wire types** (:func:`register_wire_type`): the endpoint classes a deployment builds
  (each federated method's client or node half) and the option dataclasses that appear in
  their arguments. Each method family registers its own, next to the class, with an
  explicit name; this module imports no algorithm (the layering is dsl <- compiler <-
  subproblems/certificate <- algorithms, and the runtime knows none of them), so the
  party's entry point imports the families before it decodes a ``build`` (``fedmodel
  join`` does). A registered dataclass is rebuilt field by field, from its declared
  ``__init__`` fields only: an unknown field is refused.
* **Exceptions** (:data:`WIRE_EXCEPTIONS`): a fixed table of builtin and fedmodel error
  classes, by name. An exception of another class travels as its nearest registered base
  class, its own class name leading the text (``UnsupportedError("NotSmoothError:
  ...")``); an unknown name received becomes a ``RuntimeError`` carrying the name.

Examples
--------
>>> from dataclasses import dataclass
>>> @register_wire_type("example.options")
... @dataclass
... class ExampleOptions:
...     tol: float = 1e-6
>>> wire_type("example.options") is ExampleOptions, wire_name(ExampleOptions)
(True, 'example.options')
>>> wire_type("os.system")  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
fedmodel.runtime.wire.CodecError: refusing to build 'os.system': not a registered wire type ...
>>> make_exception("ValueError", ["bad step"])
ValueError('bad step')
>>> make_exception("fedmodel.runtime.flower_party:os.system", ["x"])
RuntimeError('fedmodel.runtime.flower_party:os.system: x')
>>> _ = unregister_wire_type("example.options")
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

from fedmodel.errors import (
    DataError,
    FedModelError,
    ModelError,
    NonConvexError,
    OwnershipError,
    UnsupportedError,
)


class CodecError(ValueError):
    """A value that cannot cross a Flower link, or a record that is not fedmodel's (e.g. a
    name that is not a registered wire type)."""


T = TypeVar("T", bound=type)

# registered name -> class, and back
_TYPES: dict[str, type] = {}
_NAMES: dict[type, str] = {}
_NAME_PATTERN = re.compile(r"[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)*")


def _qualified(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def register_wire_type(name: str, cls: T | None = None) -> Any:
    """Register ``cls`` under ``name``: a party may then build it from a message.

    Use it for an endpoint class a deployment builds (a method's client or node half) and
    for an option dataclass that appears in its factory's arguments; nothing else. Called
    as ``register_wire_type(name, cls)`` or as a class decorator
    ``@register_wire_type(name)``.

    Parameters
    ----------
    name : str
        Lower-case dotted name, e.g. ``"proxal.client"`` (a name, not a module path).
    cls : type, optional
        The class; omitted: returns a decorator.

    Returns
    -------
    type or callable
        ``cls`` (or the decorator).

    Raises
    ------
    ValueError
        A malformed name, or a name already registered for another class.

    Examples
    --------
    >>> class Node:
    ...     pass
    >>> register_wire_type("example.node", Node) is Node
    True
    >>> _ = unregister_wire_type("example.node")
    """
    if cls is None:

        def decorate(c: T) -> T:
            return register_wire_type(name, c)

        return decorate
    if not isinstance(name, str) or not _NAME_PATTERN.fullmatch(name):
        raise ValueError(f"wire type name {name!r}: lower-case dotted words, e.g. 'proxal.client'")
    if not isinstance(cls, type) or issubclass(cls, BaseException):
        raise ValueError(f"wire type {name!r} must be a class (not an exception): {cls!r}")
    old = _TYPES.get(name)
    if old is not None and old is not cls and _qualified(old) != _qualified(cls):
        raise ValueError(f"wire type {name!r} is already {_qualified(old)}, not {_qualified(cls)}")
    if old is not None:  # the same class again (e.g. its module reloaded)
        _NAMES.pop(old, None)
    _TYPES[name] = cls
    _NAMES[cls] = name
    return cls


def unregister_wire_type(name: str) -> type | None:
    """Remove ``name`` from the registry (tests); returns the class it named, if any."""
    cls = _TYPES.pop(name, None)
    if cls is not None:
        _NAMES.pop(cls, None)
    return cls


def wire_type(name: Any) -> type:
    """The class registered under ``name``; :class:`CodecError` naming it if there is none."""
    cls = _TYPES.get(name) if isinstance(name, str) else None
    if cls is None:
        raise CodecError(
            f"refusing to build {name!r}: not a registered wire type (a party builds only the "
            f"classes its method families registered, by name: {sorted(_TYPES)})"
        )
    return cls


def wire_name(cls: Any) -> str:
    """The registered name of ``cls``; :class:`CodecError` if it is not registered."""
    name = _NAMES.get(cls) if isinstance(cls, type) else None
    if name is None:
        raise CodecError(
            f"{cls!r} cannot cross a Flower link: only classes registered with "
            "fedmodel.runtime.wire.register_wire_type can be named in a message"
        )
    return name


def wire_types() -> dict[str, type]:
    """Every registered name and its class."""
    return dict(_TYPES)


def build_dataclass(name: str, fields: Any, decode_value: Callable[[Any], Any]) -> Any:
    """The registered dataclass ``name`` built from ``fields`` (name -> encoded value),
    each value decoded by ``decode_value``; only declared ``__init__`` fields."""
    cls = wire_type(name)
    if not dataclasses.is_dataclass(cls):
        raise CodecError(f"wire type {name!r} is not an option dataclass")
    if not isinstance(fields, dict):
        raise CodecError(f"the fields of {name!r} must be a JSON object")
    known = {f.name for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(fields) - known)
    if unknown:
        raise CodecError(f"{name!r} has no field(s) {unknown} (fields: {sorted(known)})")
    try:
        return cls(**{k: decode_value(v) for k, v in fields.items()})
    except CodecError:
        raise
    except Exception as exc:
        raise CodecError(f"cannot build {name!r} from the fields sent: {exc}") from None


def dataclass_fields(obj: Any) -> tuple[str, dict[str, Any]]:
    """``(registered name, {init field: value})`` of a registered dataclass instance."""
    name = wire_name(type(obj))
    return name, {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj) if f.init}


# -- exceptions ----------------------------------------------------------------------------------
def _exception_table() -> dict[str, type[BaseException]]:
    from fedmodel.runtime.checkpoint import CheckpointError
    from fedmodel.runtime.outcomes import RequestRefused

    classes: list[type[BaseException]] = [
        # builtins a step, a solver or the runtime raises
        ArithmeticError,
        AssertionError,
        AttributeError,
        FileExistsError,
        FileNotFoundError,
        FloatingPointError,
        IndexError,
        KeyError,
        KeyboardInterrupt,  # a party's step interrupted (its own Ctrl-C)
        LookupError,
        MemoryError,
        NotImplementedError,
        OSError,
        OverflowError,
        PermissionError,
        RecursionError,
        RuntimeError,
        TimeoutError,
        TypeError,
        ValueError,
        ZeroDivisionError,
        np.linalg.LinAlgError,
        # fedmodel's own
        FedModelError,
        ModelError,
        NonConvexError,
        OwnershipError,
        DataError,
        UnsupportedError,
        CheckpointError,
        CodecError,
        RequestRefused,
    ]
    return {c.__name__: c for c in classes}


#: exception class name -> class: the only exceptions a decoder builds
WIRE_EXCEPTIONS: dict[str, type[BaseException]] = _exception_table()
_EXCEPTION_NAMES = {c: n for n, c in WIRE_EXCEPTIONS.items()}


def exception_parts(exc: BaseException) -> tuple[str, list[str]]:
    """``(table name, texts)`` that stand for ``exc`` on the wire: its own class if it is in
    :data:`WIRE_EXCEPTIONS`, else its nearest base in the table with its class name leading
    the text (``RuntimeError`` if none)."""
    cls = type(exc)
    try:
        texts = [str(a) for a in exc.args] or [str(exc)]
    except Exception:  # an argument whose str() fails
        texts = [repr(exc)]
    if cls in _EXCEPTION_NAMES:
        return _EXCEPTION_NAMES[cls], texts
    base = next((c for c in cls.__mro__ if c in _EXCEPTION_NAMES), RuntimeError)
    if base in (BaseException, Exception):
        base = RuntimeError
    return _EXCEPTION_NAMES[base], [f"{cls.__name__}: {' '.join(texts)}"]


def make_exception(name: Any, texts: Any) -> BaseException:
    """The exception ``name`` (a key of :data:`WIRE_EXCEPTIONS`) with ``texts`` as its
    arguments; any other name becomes a ``RuntimeError`` whose text names it."""
    if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
        raise CodecError("an exception's arguments must be a list of strings")
    cls = WIRE_EXCEPTIONS.get(name) if isinstance(name, str) else None
    if cls is not None:
        try:
            return cls(*texts)
        except Exception:
            pass
    return RuntimeError(f"{name}: {' '.join(texts)}")


__all__ = [
    "WIRE_EXCEPTIONS",
    "CodecError",
    "build_dataclass",
    "dataclass_fields",
    "exception_parts",
    "make_exception",
    "register_wire_type",
    "unregister_wire_type",
    "wire_name",
    "wire_type",
    "wire_types",
]
