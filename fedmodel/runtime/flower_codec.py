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

Nothing is unpickled: the decoder builds only plain values, numpy arrays, messages,
outcomes, exceptions (by name; unknown types become ``RuntimeError``) and, for the
``build`` call of a deployment, classes, functions and dataclasses **of the fedmodel
package** (``EndpointFactory`` targets and their option objects). A party never receives
another party's program or data: its own program is the placeholder
:data:`LOCAL_PROGRAM`, which the party host replaces by the program it compiled from its
own data.

Examples
--------
>>> import numpy as np
>>> text, arrays = encode({"w": np.array([0.1, 1 / 3]), "tol": 1e-6, "k": (1, "a")})
>>> out = decode(text, arrays)
>>> out["w"].tolist() == [0.1, 1 / 3], out["tol"], out["k"]
(True, 1e-06, (1, 'a'))
"""

from __future__ import annotations

import base64
import builtins
import dataclasses
import importlib
import json
import math
from typing import Any

import numpy as np

from fedmodel.runtime.endpoints import RUNTIME_PROXY, EndpointFactory
from fedmodel.runtime.messages import Message
from fedmodel.runtime.outcomes import StepOutcome

# the record names inside a Flower RecordDict
CALL_RECORD = "fedmodel"
ARRAY_RECORD = "fedmodel.arrays"
MESSAGE_TYPE = "query.fedmodel"

# modules whose classes, functions and dataclasses a decoder may instantiate
TRUSTED_PREFIX = "fedmodel."


class _LocalProgram:
    """Placeholder for "this party's own program" in a factory sent to a deployed party."""

    def __repr__(self) -> str:
        return "LOCAL_PROGRAM"

    def __reduce__(self):
        return (_local_program, ())


def _local_program() -> _LocalProgram:
    return LOCAL_PROGRAM


LOCAL_PROGRAM = _LocalProgram()


class _LocalRegularizer:
    """Placeholder for "the model's regularizer h, as this party compiled it" (it holds
    cvxpy expressions of the shared model, no data; each party compiles its own)."""

    def __repr__(self) -> str:
        return "LOCAL_REGULARIZER"

    def __reduce__(self):
        return (_local_regularizer, ())


def _local_regularizer() -> _LocalRegularizer:
    return LOCAL_REGULARIZER


LOCAL_REGULARIZER = _LocalRegularizer()


class CodecError(ValueError):
    """A value that cannot cross a Flower link (or a record that is not fedmodel's)."""


def _ref(obj: Any) -> str:
    mod, name = getattr(obj, "__module__", ""), getattr(obj, "__qualname__", "")
    if not (mod + ".").startswith(TRUSTED_PREFIX) or "<" in name:
        raise CodecError(
            f"{obj!r} cannot cross a Flower link: only module-level classes and functions "
            "of the fedmodel package can be named in a factory"
        )
    return f"{mod}:{name}"


def _resolve(ref: str) -> Any:
    mod, _, name = ref.partition(":")
    if not (mod + ".").startswith(TRUSTED_PREFIX):
        raise CodecError(f"refusing to load {ref!r}: not part of the fedmodel package")
    obj: Any = importlib.import_module(mod)
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


def _float(x: float) -> Any:
    x = float(x)
    if math.isfinite(x):
        return x
    return {"__f": repr(x)}  # 'nan', 'inf', '-inf'


def _exception(exc: BaseException) -> dict:
    cls = type(exc)
    return {"__exc": [cls.__module__, cls.__qualname__, [str(a) for a in exc.args] or [str(exc)]]}


def _make_exception(mod: str, name: str, args: list[str]) -> BaseException:
    cls = None
    if mod == "builtins":
        cls = getattr(builtins, name, None)
    elif (mod + ".").startswith(TRUSTED_PREFIX):
        try:
            cls = _resolve(f"{mod}:{name}")
        except Exception:
            cls = None
    if isinstance(cls, type) and issubclass(cls, BaseException):
        try:
            return cls(*args)
        except Exception:
            pass
    return RuntimeError(f"{name}: {' '.join(args)}")


def encode(obj: Any) -> tuple[str, list[np.ndarray]]:
    """``obj`` -> (JSON text, arrays); see the module docstring for what may be in it."""
    arrays: list[np.ndarray] = []

    def enc(v: Any) -> Any:
        if v is None or isinstance(v, (bool, str)):
            return v
        if isinstance(v, (int, np.integer)) and not isinstance(v, np.bool_):
            return int(v) if isinstance(v, int) else {"__s": _array(np.reshape(v, (1,)))}
        if isinstance(v, float):
            return _float(v)
        if isinstance(v, (np.ndarray, np.generic)):
            a = np.asarray(v)
            if a.dtype.kind not in "biufc":
                raise CodecError(f"array of dtype {a.dtype} cannot cross a Flower link")
            if isinstance(v, np.ndarray):
                return {"__a": _array(a)}
            return {"__s": _array(np.reshape(a, (1,)))}  # a numpy scalar keeps its type
        if isinstance(v, bytes):
            return {"__b": base64.b64encode(v).decode("ascii")}
        if isinstance(v, slice):
            return {"__slice": [enc(v.start), enc(v.stop), enc(v.step)]}
        if isinstance(v, list):
            return [enc(x) for x in v]
        if isinstance(v, tuple):
            return {"__t": [enc(x) for x in v]}
        if isinstance(v, dict):
            if all(isinstance(k, str) and not k.startswith("__") for k in v):
                return {k: enc(x) for k, x in v.items()}
            return {"__d": [[enc(k), enc(x)] for k, x in v.items()]}
        if isinstance(v, Message):
            return {"__msg": [v.kind, v.sender, v.receiver, enc(v.payload), v.round, v.channel]}
        if isinstance(v, StepOutcome):
            return {
                "__out": [
                    v.name,
                    enc(v.reply),
                    None if v.error is None else _exception(v.error),
                    v.kind,
                    _float(v.seconds),
                    v.detail,
                    enc(v.sent),
                ]
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
            return {"__factory": [_ref(v.target), enc(v.args), enc(v.kwargs)]}
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            return {
                "__dc": [
                    _ref(type(v)),
                    {f.name: enc(getattr(v, f.name)) for f in dataclasses.fields(v) if f.init},
                ]
            }
        if isinstance(v, type) or callable(v):
            return {"__ref": _ref(v)}
        raise CodecError(f"a {type(v).__name__} cannot cross a Flower link ({v!r:.80})")

    def _array(a: np.ndarray) -> int:
        arrays.append(np.array(a, order="C"))  # (ascontiguousarray makes 0-d 1-d)
        return len(arrays) - 1

    text = json.dumps(enc(obj), allow_nan=False)
    return text, arrays


def decode(text: str, arrays: list[np.ndarray]) -> Any:
    """The inverse of :func:`encode`."""

    def dec(v: Any) -> Any:
        if isinstance(v, list):
            return [dec(x) for x in v]
        if not isinstance(v, dict):
            return v
        if len(v) == 1:
            ((key, x),) = v.items()
            if key == "__a":
                return np.array(arrays[x])
            if key == "__s":
                return np.asarray(arrays[x]).reshape(-1)[0]
            if key == "__f":
                return float(x)
            if key == "__b":
                return base64.b64decode(x)
            if key == "__t":
                return tuple(dec(e) for e in x)
            if key == "__slice":
                return slice(*(dec(e) for e in x))
            if key == "__d":
                return {dec(k): dec(e) for k, e in x}
            if key == "__msg":
                kind, sender, receiver, payload, rnd, channel = x
                return Message(kind, sender, receiver, dec(payload), int(rnd), channel)
            if key == "__out":
                name, reply, err, kind, seconds, detail, sent = x
                return StepOutcome(
                    name,
                    reply=dec(reply),
                    error=None if err is None else dec(err),
                    kind=kind,
                    seconds=float(dec(seconds)),
                    detail=detail,
                    sent=dec(sent),
                )
            if key == "__exc":
                return _make_exception(*x)
            if key == "__local":
                return LOCAL_PROGRAM
            if key == "__local_h":
                return LOCAL_REGULARIZER
            if key == "__proxy":
                return RUNTIME_PROXY
            if key == "__factory":
                target, args, kwargs = x
                return EndpointFactory(_resolve(target), dec(args), dec(kwargs))
            if key == "__dc":
                cls, fields = x
                cls = _resolve(cls)
                if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
                    raise CodecError(f"{x[0]!r} is not a dataclass")
                return cls(**{k: dec(e) for k, e in fields.items()})
            if key == "__ref":
                return _resolve(x)
        return {k: dec(e) for k, e in v.items()}

    return dec(json.loads(text))


# -- Flower records ------------------------------------------------------------------------------
def to_records(obj: Any):
    """``obj`` as a Flower ``RecordDict`` (a ``ConfigRecord`` and an ``ArrayRecord``)."""
    from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

    text, arrays = encode(obj)
    return RecordDict(
        {
            CALL_RECORD: ConfigRecord({"json": text}),
            ARRAY_RECORD: ArrayRecord({str(i): Array(a) for i, a in enumerate(arrays)}),
        }
    )


def from_records(records) -> Any:
    """The inverse of :func:`to_records`."""
    try:
        text = records.config_records[CALL_RECORD]["json"]
        ar = records.array_records[ARRAY_RECORD]
    except KeyError as exc:
        raise CodecError(f"not a fedmodel record (missing {exc})") from None
    arrays = [ar[str(i)].numpy() for i in range(len(ar))]
    return decode(text, arrays)
