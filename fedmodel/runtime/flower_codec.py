"""What crosses a Flower link: the runtime's calls and replies as Flower records, no pickle.

The Flower backend (:mod:`fedmodel.runtime.flower_runtime`) sends each party host the
same calls the other backends make (``run`` a list of
:class:`~fedmodel.runtime.messages.Message`, ``mark``, ``write_checkpoint`` ...), and the
host answers with :class:`~fedmodel.runtime.outcomes.StepOutcome` lists or small dicts.
Across organisations these travel as Flower ``RecordDict`` s: every numpy array of the
call (the method's payloads: ``w``, ``u_tilde`` ...) becomes an entry of an
``ArrayRecord`` (exact: the bytes of the float64 array), and the structure around them a
JSON text in a ``ConfigRecord`` (floats written with ``repr``, so they round-trip
exactly, ``nan`` and ``inf`` included).

What a decoder builds is closed: plain values (``None``, booleans, numbers, strings,
bytes, lists, tuples, dicts, slices), numpy arrays of numeric dtypes (never ``object``;
Flower loads them with ``allow_pickle=False``), messages, outcomes, the placeholders
below, exceptions of a fixed table (:data:`~fedmodel.runtime.wire.WIRE_EXCEPTIONS`; an
unknown name becomes a ``RuntimeError`` naming it) and, for the ``build`` call of a
deployment, endpoint factories and option dataclasses **by registered name**
(:mod:`fedmodel.runtime.wire`: the client and node halves the method families
registered, ``"proxal.client"`` ...). Nothing is unpickled, nothing is looked up by
module path or attribute, and no function or class crosses a link: anything else (a
``module:attribute`` reference, an unregistered name, an unknown field, a tag the decoder
does not know, an array it cannot use) is refused with a :class:`CodecError` naming it.

A party never receives another party's program or data: its own program is the
placeholder :data:`LOCAL_PROGRAM`, which the party host replaces by the program it
compiled from its own data.

Examples
--------
>>> import numpy as np
>>> text, arrays = encode({"w": np.array([0.1, 1 / 3]), "tol": 1e-6, "k": (1, "a")})
>>> out = decode(text, arrays)
>>> out["w"].tolist() == [0.1, 1 / 3], out["tol"], out["k"]
(True, 1e-06, (1, 'a'))
>>> decode('{"__ref": "fedmodel.runtime.flower_party:os.system"}', [])  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
fedmodel.runtime.wire.CodecError: refusing '__ref' ...
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from fedmodel.runtime import plaincodec
from fedmodel.runtime.endpoints import RUNTIME_PROXY, EndpointFactory, placeholder
from fedmodel.runtime.messages import Message
from fedmodel.runtime.outcomes import StepOutcome
from fedmodel.runtime.plaincodec import ARRAY_KINDS, NOT_HANDLED, PlainCodecError
from fedmodel.runtime.wire import (
    CodecError,
    build_dataclass,
    dataclass_fields,
    exception_parts,
    make_exception,
    wire_name,
    wire_type,
)

# the record names inside a Flower RecordDict
CALL_RECORD = "fedmodel"
ARRAY_RECORD = "fedmodel.arrays"
MESSAGE_TYPE = "query.fedmodel"


#: "this party's own program" in a factory sent to a deployed party
LOCAL_PROGRAM = placeholder("LOCAL_PROGRAM")
#: "the model's regularizer h, as this party compiled it" (it holds cvxpy expressions of
#: the shared model, no data; each party compiles its own)
LOCAL_REGULARIZER = placeholder("LOCAL_REGULARIZER")


def _exception(exc: BaseException) -> dict:
    return {"__exc": list(exception_parts(exc))}


def _encode_runtime(v: Any, enc) -> Any:
    """The runtime's own types, for :func:`fedmodel.runtime.plaincodec.encode`."""
    if isinstance(v, Message):
        return {"__msg": [v.kind, v.sender, v.receiver, enc(v.payload), v.round, v.channel]}
    if isinstance(v, StepOutcome):
        error = None if v.error is None else _exception(v.error)
        return {
            "__out": [v.name, enc(v.reply), error, v.kind, enc(v.seconds), v.detail, enc(v.sent)]
        }
    if isinstance(v, BaseException):
        return _exception(v)
    if v is LOCAL_PROGRAM:
        return {"__local": 1}
    if v is LOCAL_REGULARIZER:
        return {"__local_h": 1}
    if v is RUNTIME_PROXY:
        return {"__proxy": 1}
    if isinstance(v, EndpointFactory):
        return {"__factory": [wire_name(v.target), enc(v.args), enc(v.kwargs)]}
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        name, fields = dataclass_fields(v)
        return {"__dc": [name, {k: enc(x) for k, x in fields.items()}]}
    if isinstance(v, type) or callable(v):
        wire_name(v)  # raises: no function or class crosses a link, only their names
    raise CodecError(f"a {type(v).__name__} cannot cross a Flower link ({v!r:.80})")


def encode(obj: Any) -> tuple[str, list[np.ndarray]]:
    """``obj`` -> (JSON text, arrays): :func:`fedmodel.runtime.plaincodec.encode` with the
    runtime's types (see the module docstring)."""
    try:
        return plaincodec.encode(obj, _encode_runtime)
    except PlainCodecError as exc:
        raise CodecError(f"cannot cross a Flower link: {exc}") from None


def _decode_runtime(key: str, x: Any, dec) -> Any:
    """The runtime's own tags, for :func:`fedmodel.runtime.plaincodec.decode`."""
    if key == "__msg":
        kind, sender, receiver, payload, rnd, channel = _typed(x, list, key, 6)
        for field in (kind, sender, receiver, channel):
            _typed(field, str, key)
        return Message(kind, sender, receiver, dec(payload), _typed(rnd, int, key), channel)
    if key == "__out":
        name, reply, err, kind, seconds, detail, sent = _typed(x, list, key, 7)
        error = None if err is None else dec(err)
        if error is not None and not isinstance(error, BaseException):
            raise CodecError("an outcome's error must be an exception")
        return StepOutcome(
            _typed(name, str, key),
            reply=dec(reply),
            error=error,
            kind=_typed(kind, str, key),
            seconds=float(_typed(dec(seconds), (int, float), key)),
            detail=_typed(detail, str, key),
            sent=dec(sent),
        )
    if key == "__exc":
        name, texts = _typed(x, list, key, 2)
        return make_exception(name, texts)
    if key == "__local":
        return LOCAL_PROGRAM
    if key == "__local_h":
        return LOCAL_REGULARIZER
    if key == "__proxy":
        return RUNTIME_PROXY
    if key == "__factory":
        target, args, kwargs = _typed(x, list, key, 3)
        cls = wire_type(target)
        if dataclasses.is_dataclass(cls):
            raise CodecError(f"wire type {target!r} is an option dataclass, not an endpoint")
        args, kwargs = dec(args), dec(kwargs)
        if not isinstance(args, (tuple, list)) or not isinstance(kwargs, dict):
            raise CodecError(f"the factory of {target!r}: args a sequence, kwargs an object")
        return EndpointFactory(cls, tuple(args), kwargs)
    if key == "__dc":
        name, fields = _typed(x, list, key, 2)
        return build_dataclass(name, fields, dec)
    if key == "__ref":
        raise CodecError(
            f"refusing '__ref' {x!r:.120}: no function or class is decoded from a message "
            "(a party builds only registered wire types, by name)"
        )
    return NOT_HANDLED  # refused by the plain codec as an unknown entry


def decode(
    text: str,
    arrays: list[np.ndarray],
    *,
    max_chars: int | None = None,
    max_depth: int | None = None,
    max_items: int | None = None,
    max_arrays: int | None = None,
) -> Any:
    """The inverse of :func:`encode`: builds only what the module docstring lists
    (:func:`fedmodel.runtime.plaincodec.decode` with the runtime's tags). A party reading
    a call caps it: ``max_chars`` of JSON text and ``max_arrays`` arrays (refused before
    the text is parsed), ``max_depth`` nesting and ``max_items`` values.

    Raises
    ------
    CodecError
        Anything else, naming it (e.g. a name that is not a registered wire type).
    """
    if max_chars is not None and len(text) > max_chars:
        raise CodecError(f"a call whose JSON text has {len(text)} characters (at most {max_chars})")
    if max_arrays is not None and len(arrays) > max_arrays:
        raise CodecError(f"a call of {len(arrays)} arrays (at most {max_arrays})")
    for i, a in enumerate(arrays):
        if not isinstance(a, np.ndarray) or a.dtype.kind not in ARRAY_KINDS:
            kind = getattr(a, "dtype", type(a).__name__)
            raise CodecError(f"array {i} of a fedmodel record: {kind} is not a numeric array")
    try:
        return plaincodec.decode(
            text, arrays, _decode_runtime, max_depth=max_depth, max_items=max_items
        )
    except CodecError:
        raise
    except PlainCodecError as exc:
        raise CodecError(f"a malformed fedmodel record: {exc}") from None
    except RecursionError:
        raise CodecError("a fedmodel record nested too deeply") from None
    except (TypeError, ValueError, KeyError, IndexError, AttributeError) as exc:
        raise CodecError(f"a malformed fedmodel record: {type(exc).__name__}: {exc}") from None


def _typed(x: Any, kind: Any, tag: str, length: int | None = None) -> Any:
    """``x`` if it is a ``kind`` (of ``length`` items); else a CodecError naming ``tag``."""
    if not isinstance(x, kind) or isinstance(x, bool) and kind is not bool:
        raise CodecError(f"a malformed {tag!r} value: {x!r:.80}")
    if length is not None and len(x) != length:
        raise CodecError(f"a malformed {tag!r} value: {length} items expected, not {len(x)}")
    return x


# -- Flower records ------------------------------------------------------------------------------
def to_records(obj: Any):
    """``obj`` as a Flower ``RecordDict``: its frame (JSON text and ``.npy`` arrays, see
    :func:`fedmodel.runtime.flower_relay_app.content_of`) in one ``ConfigRecord``, or,
    for a large one, a ``ConfigRecord`` and an ``ArrayRecord``."""
    from fedmodel.runtime.flower_relay_app import content_of

    return content_of("call", *encode(obj))


def from_records(records) -> Any:
    """The inverse of :func:`to_records` (either form)."""
    return decode(*record_parts(records)[1:])


def record_parts(records) -> tuple:
    """``(status, text, arrays)`` of a fedmodel record (either form of
    :func:`to_records`; ``status`` ``"ok"`` when it says none); a :class:`CodecError`
    if it is not one."""
    from fedmodel.runtime.flower_relay_app import parts_of

    try:  # arrays read with np.load(allow_pickle=False)
        return parts_of(records)
    except KeyError as exc:
        raise CodecError(f"not a fedmodel record (missing {exc})") from None
    except (TypeError, ValueError, OSError) as exc:
        raise CodecError(f"the arrays of a fedmodel record: {exc}") from None
