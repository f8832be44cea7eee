"""Declared message tables: what each message kind of a method carries, checked on arrival.

A method declares, once, every kind of message its halves exchange (:class:`MessageSpec`):
the fields of the request and of the reply (:class:`Field`: shape in symbolic dimensions,
dtype, whether it must be finite, whether it may be missing, what it reveals about the
party's data). A :class:`MessageTable` groups a family's specs and resolves the symbolic
dimensions for one client (``d``: the shared variables, ``m_ineq``, ``m_eq``, ``n`` rows,
...). The same declaration serves three readers:

* the server's **reply validation** (:meth:`MessageTable.checker`): the runtime calls the
  checker on every reply, peer message and activation return before the server half uses
  it; a reply of an undeclared kind, with a missing or unknown field, of the wrong shape or
  dtype, non-finite or beyond its size bound raises :class:`~fedmodel.runtime.outcomes.InvalidReply`
  naming the client, the kind and the field, which the runtime turns into a failure of that
  client (``StepOutcome(kind="invalid_reply")``);
* the **privacy table** (:meth:`MessageTable.privacy_rows`, :func:`privacy_markdown`):
  each kind, its direction, its size in numbers for a model, and what it reveals;
* the **runtime's outgoing messages** (:meth:`MessageTable.request_problem`,
  :meth:`MessageTable.channel`; ``Runtime.declare``): a request of an undeclared kind,
  with a missing or an undeclared field, is refused before it is sent, naming the kind
  and the field, and the ledger records each message on its declared channel; a client
  half checks what it receives with the same :meth:`~MessageTable.request_problem`.

This module imports nothing of the algorithms (the runtime must not): the tables live in
each family's ``messages.py`` and the driver hands the runtime their checker.

Examples
--------
>>> import numpy as np
>>> table = MessageTable("toy", (
...     MessageSpec("ping", request={"w": Field(("d",))}, reply={"g": Field(("d",))}),
... ))
>>> check = table.checker(lambda name: {"d": 2})
>>> check("a", "ping", "server", {"g": np.zeros(2)})
>>> try:
...     check("a", "ping", "server", {"g": np.full(2, np.nan)})
... except InvalidReply as exc:
...     print(exc)
client 'a', reply to 'ping': field 'g' is not finite (2 NaN/inf entries)
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any

import numpy as np

from fedmodel.runtime.outcomes import InvalidReply

#: dtypes a field may declare: numbers (``float`` accepts integers too), ``bool``, ``str``,
#: and ``map`` (a mapping of short string keys to arrays of the field's shape)
DTYPES = ("float", "int", "bool", "str", "map")
#: directions of a message kind
DIRECTIONS = ("server", "peer", "local")
#: the default largest magnitude of a finite field's entries (:attr:`Field.max_abs`)
MAX_ABS = 1e150
#: longest string a ``str`` field may carry, and most keys of a ``map`` field
MAX_STR = 4096
MAX_MAP_KEYS = 1024


@dataclass(frozen=True)
class Field:
    """One field of a message.

    Parameters
    ----------
    shape : tuple or None
        Each entry an int, a symbolic dimension (``"d"``, resolved per client by the
        table), ``"<=name"`` (at most that many), or ``"*"`` (any length: the field's
        size is then bounded by ``max_size`` only). ``()`` is a scalar; None: any shape
        (bounded by ``max_size`` only).
    dtype : {"float", "int", "bool", "str", "map"}
    finite : bool
        NaN and inf, and entries beyond ``max_abs`` in magnitude, are refused unless False.
    required : bool
        False: the field may be absent (e.g. sent only when it changed).
    nullable : bool
        The value may be ``None`` (e.g. no iterate yet).
    reveals : str
        What the field tells its receiver about the sender's data (privacy table).
    opt_in : str, optional
        The option that makes this field travel (e.g. ``"inner_solver='newton'"``): shown
        as opt-in in the privacy table.
    party_opt_in : mapping, optional
        Values of this (request or build) field that make the party reveal more than its
        method's default messages, each with the name of the party's own opt-in that
        allows it (e.g. ``{"newton": "hessian"}``): a party that did not enable that
        opt-in refuses a request carrying such a value (:meth:`MessageTable.opt_ins_needed`).
    choices : tuple, optional
        The values a ``str`` field may take.
    positive : bool
        Entries must be > 0 (a penalty, a count).
    max_size : int or str, optional
        Bound on the number of entries (a number or a dimension's name), for fields whose
        shape is not fixed.
    max_abs : float
        Largest magnitude of an entry (default :data:`MAX_ABS`: beyond it, products of two
        entries overflow to inf).
    sum_only : bool
        The server uses this reply field only as a sum over the clients (a gradient it adds
        up, a weighted model it averages): under secure aggregation it is masked and the
        server learns only the sum (the privacy table's column "masked").
    unmasked : bool
        A scalar the party still sends in the clear under secure aggregation (its largest
        constraint violation in the certificate round), said in the privacy table (its
        "masked" column's "clear"). Under dp a numeric one joins the clipped, noised sum
        instead (:attr:`dp_summed`).
    """

    shape: tuple | None = ()
    dtype: str = "float"
    finite: bool = True
    required: bool = True
    nullable: bool = False
    reveals: str = ""
    opt_in: str | None = None
    max_size: int | str | None = None
    max_abs: float = MAX_ABS
    party_opt_in: Mapping[Any, str] | None = None
    choices: tuple | None = None
    positive: bool = False
    sum_only: bool = False
    unmasked: bool = False

    @property
    def dp_summed(self) -> bool:
        """Whether a client sends this reply field in its clipped, noised vector under dp:
        the sum-only fields and the numeric unmasked scalars (a flag or a reason, such as a
        route's ``accepted`` and ``why``, stays in the clear)."""
        return self.sum_only or (self.unmasked and self.dtype in ("float", "int"))

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise ValueError(f"Field dtype must be one of {DTYPES}, got {self.dtype!r}")

    def opt_in_for(self, value: Any) -> str | None:
        """The party opt-in ``value`` needs (None: none)."""
        if not self.party_opt_in or not isinstance(value, (str, bool, int, float)):
            return None
        return self.party_opt_in.get(value)

    def dims(self, dims: Mapping[str, int]) -> list[tuple[int, bool]]:
        """``(size, exact)`` of each axis for one client (``exact=False``: an upper bound;
        ``-1``: any)."""
        out = []
        for entry in self.shape or ():
            if isinstance(entry, (int, np.integer)):
                out.append((int(entry), True))
            elif entry == "*":
                out.append((-1, False))
            elif entry.startswith("<="):
                out.append((_dim(dims, entry[2:]), False))
            else:
                out.append((_dim(dims, entry), True))
        return out

    def size(self, dims: Mapping[str, int]) -> int | None:
        """Most numbers this field carries for one client (None: only ``max_size`` bounds it)."""
        if self.dtype == "str":
            return 0
        if self.shape is None:
            return self.bound(dims)
        n = 1
        for size, _exact in self.dims(dims):
            if size < 0:
                return self.bound(dims)
            n *= size
        return n

    def bound(self, dims: Mapping[str, int]) -> int | None:
        """``max_size`` for one client (None: no bound declared)."""
        if isinstance(self.max_size, str):
            return _dim(dims, self.max_size)
        return self.max_size

    def check(self, value: Any, dims: Mapping[str, int]) -> str | None:
        """Why ``value`` does not fit this field (None when it does)."""
        if value is None:
            return None if self.nullable else "is None"
        if self.dtype == "str":
            if not isinstance(value, str):
                return f"is a {type(value).__name__}, not a string"
            if len(value) > MAX_STR:
                return f"is a string of {len(value)} characters"
            if self.choices is not None and value not in self.choices:
                return f"is {value!r:.40}, not one of {list(self.choices)}"
            return None
        if self.dtype == "map":
            if not isinstance(value, Mapping):
                return f"is a {type(value).__name__}, not a mapping"
            if len(value) > MAX_MAP_KEYS:
                return f"has {len(value)} keys (at most {MAX_MAP_KEYS})"
            for key, item in value.items():
                if not isinstance(key, str) or len(key) > 256:
                    return f"has a key that is not a short string ({key!r:.40})"
                why = _check_array(self, item, dims, "float")
                if why:
                    return f"entry {key!r} {why}"
            return None
        return _check_array(self, value, dims, self.dtype)


def _dim(dims: Mapping[str, int], name: str) -> int:
    if name not in dims:
        raise KeyError(f"message table: the dimension {name!r} is not known for this client")
    return int(dims[name])


#: Python scalars' dtype kinds, for :func:`_scalar_fits`
_SCALAR_KINDS = {bool: "b", int: "i", float: "f"}
#: an argument not passed (:meth:`MessageTable.build_signature`)
_ABSENT = object()
_INT64 = np.iinfo(np.int64)


def _scalar_fits(spec: Field, value: Any, dims: Mapping[str, int], dtype: str) -> bool:
    """Whether a plain Python ``bool``, ``int`` or ``float`` ``value`` fits ``spec``
    (every test of :func:`_check_array`, made on the number itself); False also when it
    cannot tell (then :func:`_check_array` decides and words the reason)."""
    kind = _SCALAR_KINDS.get(type(value))
    if kind is None or kind not in {"float": "fiu", "int": "iu", "bool": "b"}[dtype]:
        return False
    if kind == "i" and not _INT64.min <= value <= _INT64.max:
        return False  # (numpy would store it as an object)
    if spec.shape:  # (a 0-d value fits a shape of no axes, or no declared shape)
        return False
    bound = spec.bound(dims)
    if bound is not None and bound < 1:
        return False
    if spec.finite and kind == "f" and not abs(value) <= spec.max_abs:
        return False
    return not (spec.positive and not value > 0)


def _check_array(spec: Field, value: Any, dims: Mapping[str, int], dtype: str) -> str | None:
    if _scalar_fits(spec, value, dims, dtype):
        return None
    if isinstance(value, (bool, np.bool_)):
        arr = np.asarray(value)
    elif isinstance(value, (int, float, np.number)):
        arr = np.asarray(value)
    elif isinstance(value, (np.ndarray, list, tuple)):
        try:
            arr = np.asarray(value)
        except (ValueError, TypeError):
            return "is not a regular array"
    else:
        return f"is a {type(value).__name__}, not a number or an array"
    kind = arr.dtype.kind
    allowed = {"float": "fiu", "int": "iu", "bool": "b"}[dtype]
    if kind not in allowed:
        return f"has dtype {arr.dtype}, expected {dtype}"
    axes = spec.dims(dims)
    if spec.shape is not None and arr.ndim != len(axes):
        return f"has shape {arr.shape}, expected {_shape_text(spec, dims)}"
    for got, (size, exact) in zip(arr.shape, axes):
        if size < 0:
            continue
        if (exact and got != size) or (not exact and got > size):
            return f"has shape {arr.shape}, expected {_shape_text(spec, dims)}"
    bound = spec.bound(dims)
    if bound is not None and arr.size > bound:
        return f"has {arr.size} entries (at most {bound})"
    if spec.finite and kind == "f" and arr.size:
        top = float(np.abs(arr).max())  # (NaN if any entry is NaN)
        if not top <= spec.max_abs:
            bad = int(arr.size - np.count_nonzero(np.isfinite(arr)))
            if bad:
                return f"is not finite ({bad} NaN/inf entries)"
            return f"has entries of magnitude {top:.3g} (at most {spec.max_abs:g})"
    if spec.positive and arr.size and not bool(np.all(arr > 0)):
        return f"has entries <= 0 (smallest {arr.min()!r:.20}; must be > 0)"
    return None


def _shape_text(spec: Field, dims: Mapping[str, int]) -> str:
    parts = []
    for entry, (size, exact) in zip(spec.shape, spec.dims(dims)):
        if size < 0:
            parts.append("any")
        elif exact:
            parts.append(str(size) if str(entry) == str(size) else f"{entry}={size}")
        else:
            parts.append(f"{entry}={size}")
    return "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"


@dataclass(frozen=True)
class MessageSpec:
    """One message kind: the request's fields and the reply's.

    Parameters
    ----------
    kind : str
        The kind of the request; its reply is ``<kind>_reply``.
    request, reply : dict of str to Field
        The declared fields; a reply may carry no other field, except scalars of
        ``extra`` (e.g. a client's statistics in ``report``), at most ``max_extra`` of them.
    direction : {"server", "peer", "local"}
        ``"server"``: the server asks, the client replies. ``"peer"``: one party to
        another (``request`` is the payload, no reply). ``"local"``: the server activates a
        party's own step (nothing sent; ``reply`` or ``value`` is what the step returns).
    value : Field, optional
        A local step that returns a bare value (not a dict).
    channel : {"algorithm", "diagnostic"}
        Diagnostic messages (history, certificate) are monitoring a deployment may switch off.
    reveals : str
        What the exchange reveals, in a sentence (privacy table).
    methods : tuple of str, optional
        The methods of the family that use this kind (None: all).
    extra : Field, optional
        Undeclared reply fields allowed if they fit this field (at most ``max_extra``).
    one_of : tuple of tuples of str
        Alternatives among the optional reply fields: a reply must hold every field of at
        least one of them (e.g. the ADMM start ``("u_tilde",)`` or the Newton start
        ``("value", "grad")``).
    party_opt_in : str, optional
        The party's own opt-in this kind needs (e.g. ``"hessian"``: its reply reveals more
        than the method's default messages). A party that did not enable it refuses every
        request of this kind (see :attr:`Field.party_opt_in` for opt-ins that follow from
        a request's values).
    """

    kind: str
    request: Mapping[str, Field] = field(default_factory=dict)
    reply: Mapping[str, Field] = field(default_factory=dict)
    direction: str = "server"
    value: Field | None = None
    channel: str = "algorithm"
    reveals: str = ""
    methods: tuple[str, ...] | None = None
    extra: Field | None = None
    max_extra: int = 32
    one_of: tuple[tuple[str, ...], ...] = ()
    party_opt_in: str | None = None

    @property
    def dp_summed(self) -> bool:
        """Whether a client sends this reply field in its clipped, noised vector under dp:
        the sum-only fields and the numeric unmasked scalars (a flag or a reason, such as a
        route's ``accepted`` and ``why``, stays in the clear)."""
        return self.sum_only or (self.unmasked and self.dtype in ("float", "int"))

    def __post_init__(self):
        if self.direction not in DIRECTIONS:
            raise ValueError(f"MessageSpec direction must be one of {DIRECTIONS}")

    @property
    def masked(self) -> list[str]:
        """The reply fields the server uses only as sums over clients (masked under secure
        aggregation), in declared order."""
        return [name for name, f in self.reply.items() if f.sum_only]

    @property
    def opt_in(self) -> list[str]:
        """The options that turn on fields of this kind (opt-in traffic)."""
        fields = [*self.request.values(), *self.reply.values()]
        return sorted({f.opt_in for f in fields if f.opt_in})

    def check_payload(self, payload: Any, fields: Mapping[str, Field], dims) -> str | None:
        """Why ``payload`` does not fit ``fields`` (None when it does)."""
        if not isinstance(payload, Mapping):
            return f"payload is a {type(payload).__name__}, not a mapping of fields"
        extras = 0
        for name in payload:
            if name in fields:
                continue
            if self.extra is not None and isinstance(name, str):
                extras += 1
                why = self.extra.check(payload[name], dims)
                if why:
                    return f"field {name!r} {why}"
                continue
            return f"unknown field {name!r} (declared: {sorted(fields)})"
        if extras > self.max_extra:
            return f"{extras} undeclared statistics (at most {self.max_extra})"
        for name, spec in fields.items():
            if name not in payload:
                if spec.required:
                    return f"field {name!r} is missing"
                continue
            why = spec.check(payload[name], dims)
            if why:
                return f"field {name!r} {why}"
        if self.one_of and fields is self.reply:
            if not any(all(n in payload for n in group) for group in self.one_of):
                wanted = " or ".join("(" + ", ".join(g) + ")" for g in self.one_of)
                return f"holds none of the field sets {wanted}"
        return None


class ReplyChecker:
    """The runtime's check of what parties send (:meth:`MessageTable.checker`): called as
    a :data:`ReplyCheck` for one payload, or :meth:`many` for the replies of many parties
    to one request.

    Examples
    --------
    >>> import numpy as np
    >>> table = MessageTable("toy", (MessageSpec("ping", reply={"g": Field(("d",))}),))
    >>> check = table.checker(lambda name: {"d": 2})
    >>> bad = check.many(["a", "b"], "ping", "server", [{"g": np.zeros(2)}, {"g": np.ones(3)}])
    >>> list(bad), str(bad["b"])
    (['b'], "client 'b', reply to 'ping': field 'g' has shape (3,), expected (d=2,)")
    """

    def __init__(self, table: MessageTable, dims: Callable[[str], Mapping[str, int]]):
        self.table = table
        self._dims_of = dims
        self._dims: dict[str, Mapping[str, int]] = {}
        self._dims_key: dict[str, tuple] = {}
        self._keys: dict[tuple, tuple] = {}  # (one object per dimensions key)
        self._alike: list[str] = []  # (the last parties found of one dimensions key)

    def dims(self, party: str) -> Mapping[str, int]:
        """The dimensions of ``party`` (computed once)."""
        if party not in self._dims:
            d = self._dims_of(party)
            self._dims[party] = d
            key = tuple(sorted(d.items()))
            self._dims_key[party] = self._keys.setdefault(key, key)
        return self._dims[party]

    def _find_dims(self, parties: list[str]) -> None:
        """:meth:`dims` of ``parties`` (none found yet, each once) in one pass, all at once
        when ``dims`` has a ``many(parties)`` (their mappings, to be read): a party whose
        dimensions are or equal the previous party's takes its key, any other's is sorted
        and interned."""
        many = getattr(self._dims_of, "many", None)  # (many parties' at once)
        found = list(map(self._dims_of, parties)) if many is None else many(parties)
        intern = self._keys.setdefault
        keys, last, key = [], None, None
        for d in found:
            if d is not last and d != last:
                key = tuple(sorted(d.items()))
                last, key = d, intern(key, key)
            keys.append(key)
        self._dims.update(zip(parties, found))
        self._dims_key.update(zip(parties, keys))

    def __call__(self, party: str, kind: str, direction: str, payload: Any) -> None:
        self.table.validate(party, kind, direction, payload, self.dims)

    def many(
        self, parties: list[str], kind: str, direction: str, payloads: list[Any]
    ) -> dict[str, InvalidReply]:
        """The check of ``payloads[i]`` sent by ``parties[i]``, for all of them: the parties
        whose payload is refused, each with the error its own check raises. Payloads of
        parties with the same dimensions and field names are checked together: one
        payload in full, then each field's values at once when they are arrays of one
        dtype and shape (or floats): one bound and sign test of the stacked values instead
        of one per party; anything else, and any group in which something is refused, is
        checked payload by payload."""
        bad: dict[str, InvalidReply] = {}
        groups: dict[tuple, list[int]] = {}
        for i, (party, payload) in enumerate(zip(parties, payloads)):
            self.dims(party)
            if isinstance(payload, Mapping):
                groups.setdefault((self._dims_key[party], tuple(payload)), []).append(i)
            else:
                groups[("one", i)] = [i]
        for members in groups.values():
            if len(members) > 1 and self._stacked_ok(
                [parties[i] for i in members], kind, direction, [payloads[i] for i in members]
            ):
                continue
            for i in members:
                try:
                    self(parties[i], kind, direction, payloads[i])
                except InvalidReply as exc:
                    bad[parties[i]] = exc
        return bad

    def _stacked_ok(self, parties, kind, direction, payloads) -> bool:
        """Whether every payload of one group (same dimensions, same field names) passes,
        decided from the first payload's full check and the stacked values of the others;
        False when anything is refused or cannot be decided stacked."""
        try:
            self(parties[0], kind, direction, payloads[0])
        except InvalidReply:
            return False
        spec = self.table[kind]
        fields = spec.request if direction == "peer" else spec.reply
        d = self.dims(parties[0])
        first = payloads[0]
        for name, rep in first.items():
            field = fields.get(name, spec.extra)
            if field is None or field.dtype not in ("float", "int", "bool"):
                return False
            values = [payload[name] for payload in payloads]
            if type(rep) is np.ndarray:
                if not all(
                    type(v) is np.ndarray and v.shape == rep.shape and v.dtype == rep.dtype
                    for v in values
                ):
                    return False
                stacked = np.stack(values)
            elif type(rep) in (float, int) and all(type(v) is type(rep) for v in values):
                stacked = np.array(values)
            else:
                if any(field.check(v, d) for v in values):
                    return False
                continue
            if not _stacked_values_ok(field, stacked):
                return False
        return True

    def rows(self, parties: list[str], kind: str, fields: Mapping[str, np.ndarray]) -> bool:
        """Whether every reply of a stacked round passes, ``fields`` holding each reply
        field as an array with a row per party (party ``i``'s payload is row ``i`` of
        each): decided from the first party's payload in full and each field's stacked
        values; False when anything is refused or the parties' dimensions differ (each
        reply is then checked on its own, with its own error)."""
        if parties != self._alike:  # (the parties of the last round are known alike)
            known = self._dims_key
            if not all(map(known.__contains__, parties)):  # (each party's found once)
                self._find_dims([p for p in parties if p not in known])
            first = known[parties[0]]  # (equal keys are one object)
            if not all(map(operator.is_, map(known.__getitem__, parties), repeat(first))):
                return False
            self._alike = list(parties)
        try:
            self(parties[0], kind, "server", {k: v[0] for k, v in fields.items()})
        except InvalidReply:
            return False
        spec = self.table[kind]
        for name, stacked in fields.items():
            field = spec.reply.get(name, spec.extra)
            if field is None or field.dtype not in ("float", "int", "bool"):
                return False
            if stacked.dtype.kind not in "biuf" or not _stacked_values_ok(field, stacked):
                return False
        return True


def _stacked_values_ok(field: Field, stacked: np.ndarray) -> bool:
    """The bound and sign tests of ``field`` on the stacked values of many payloads (the
    shape and dtype of each were checked before)."""
    if field.finite and stacked.dtype.kind == "f" and stacked.size:
        if not float(np.abs(stacked).max()) <= field.max_abs:
            return False
    if field.positive and stacked.size and not bool(np.all(stacked > 0)):
        return False
    return True


def opt_in_refusal(
    party: str, what: str, needed: Mapping[str, str], enabled: Iterable[str] | None
) -> str | None:
    """Why ``party`` refuses ``what`` (a message, its build): the first opt-in of
    ``needed`` (name -> what asks for it, :meth:`MessageTable.opt_ins_needed`) not among
    ``enabled`` (None: every opt-in is enabled); None when it may answer.

    Examples
    --------
    >>> print(opt_in_refusal("site0", "message 'newton_w'", {"hessian": "the kind itself"}, ()))
    party 'site0' refuses message 'newton_w' (the kind itself): it would reveal more than the method's default messages, under the opt-in 'hessian', which this party did not enable (a deployed party enables it with fedmodel join --reveal hessian; in one process, model.solve(..., reveal=...))
    """
    if enabled is None:
        return None
    enabled = set(enabled)
    for name, why in needed.items():
        if name not in enabled:
            return (
                f"party {party!r} refuses {what} ({why}): it would reveal more than the "
                f"method's default messages, under the opt-in {name!r}, which this party did "
                f"not enable (a deployed party enables it with fedmodel join --reveal {name}; "
                "in one process, model.solve(..., reveal=...))"
            )
    return None


#: A checker the runtime calls on what a party sent: ``check(party, kind, direction,
#: payload)``; raises :class:`InvalidReply` (direction ``"server"``: the reply to a request
#: of that kind; ``"peer"``: a peer message; ``"local"``: an activation's return value).
ReplyCheck = Callable[[str, str, str, Any], None]


@dataclass(frozen=True)
class MessageTable:
    """A method family's message kinds.

    Parameters
    ----------
    family : str
    specs : tuple of MessageSpec
    option_dims : callable, optional
        ``option_dims(options) -> dict``: dimensions that follow from the method's options
        (e.g. an Anderson memory), for every client.
    build : dict of str to Field
        The arguments of the client half's constructor that a coordinator chooses (beside
        the party's own program and the options dataclass, which its ``validate`` checks),
        checked by value where the party is built (:meth:`build_problem`).
    """

    family: str
    specs: tuple[MessageSpec, ...]
    option_dims: Callable[[Any], dict[str, int]] | None = None
    build: Mapping[str, Field] = field(default_factory=dict)

    @property
    def dp_summed(self) -> bool:
        """Whether a client sends this reply field in its clipped, noised vector under dp:
        the sum-only fields and the numeric unmasked scalars (a flag or a reason, such as a
        route's ``accepted`` and ``why``, stays in the clear)."""
        return self.sum_only or (self.unmasked and self.dtype in ("float", "int"))

    def __post_init__(self):
        kinds = [s.kind for s in self.specs]
        dup = sorted({k for k in kinds if kinds.count(k) > 1})
        if dup:
            raise ValueError(f"message table {self.family!r}: kinds declared twice: {dup}")

    def __contains__(self, kind: str) -> bool:
        return kind in self._by_kind

    def __getitem__(self, kind: str) -> MessageSpec:
        try:
            return self._by_kind[kind]
        except KeyError:
            raise KeyError(f"message table {self.family!r} declares no kind {kind!r}") from None

    @property
    def _by_kind(self) -> dict[str, MessageSpec]:
        cached = self.__dict__.get("_kinds")
        if cached is None:
            cached = {s.kind: s for s in self.specs}
            object.__setattr__(self, "_kinds", cached)  # (frozen: a cache, not a field)
        return cached

    @property
    def kinds(self) -> list[str]:
        return [s.kind for s in self.specs]

    def for_method(self, method: str | None) -> list[MessageSpec]:
        return [s for s in self.specs if method is None or s.methods is None or method in s.methods]

    def merged(self, *others: MessageTable, family: str | None = None) -> MessageTable:
        """This table with the specs of ``others`` (a kind declared here wins); its
        ``option_dims`` and ``build`` are kept."""
        specs = list(self.specs)
        for other in others:
            specs += [s for s in other.specs if s.kind not in self]
        return dataclasses.replace(self, family=family or self.family, specs=tuple(specs))

    # -- validation --------------------------------------------------------------------------
    def request_problem(
        self, kind: str, payload: Mapping[str, Any], dims: Mapping[str, int] | None = None
    ) -> str | None:
        """Why a request of ``kind`` with ``payload`` does not fit the declaration (the
        field names: an undeclared kind, an undeclared field, a missing required one; with
        the receiving party's ``dims``, also each value's shape, dtype, finiteness and
        magnitude), or None when it does.

        Examples
        --------
        >>> table = MessageTable("toy", (MessageSpec("ping", request={"w": Field(("d",))}),))
        >>> table.request_problem("ping", {}), table.request_problem("pong", {})
        ("message 'ping' without its field 'w'", "message kind 'pong' is not declared in table 'toy'")
        """
        if kind not in self:
            return f"message kind {kind!r} is not declared in table {self.family!r}"
        declared = self[kind].request
        for name in payload:
            if name not in declared:
                return (
                    f"message {kind!r} with the undeclared field {name!r} "
                    f"(declared: {sorted(declared)})"
                )
        for name, spec in declared.items():
            if spec.required and name not in payload:
                return f"message {kind!r} without its field {name!r}"
        if dims is not None:
            for name, value in payload.items():
                why = declared[name].check(value, dims)
                if why:
                    return f"message {kind!r} whose field {name!r} {why}"
        return None

    def request_signature(self, kind: str, payload: Mapping[str, Any]) -> tuple | None:
        """What a party's check of a request reads (:meth:`request_problem` without
        ``dims``, :meth:`opt_ins_needed`): the field names, and the values of the fields
        whose value can need an opt-in; None when such a value is not hashable. Two
        requests of one signature get the same verdict.

        Examples
        --------
        >>> table = MessageTable("toy", (
        ...     MessageSpec("go", request={"w": Field(("d",)), "how": Field(
        ...         (), dtype="str", party_opt_in={"exact": "hessian"})}),
        ... ))
        >>> table.request_signature("go", {"w": [1.0], "how": "exact"})
        ('go', ('w', 'how'), ('exact',))
        """
        names = tuple(payload)
        valued_fields = self._valued_fields.get(kind)
        if not valued_fields:
            return (kind, names, ())
        valued = tuple(payload[name] for name in valued_fields if name in payload)
        try:
            hash(valued)
        except TypeError:
            return None
        return (kind, names, valued)

    def passed_requests(self, reveal: frozenset[str] | None) -> set[tuple]:
        """The :meth:`request_signature` values that passed a party's check against this
        table with opt-ins ``reveal`` (the check is a function of those three; the parties
        that share a table share the set)."""
        cached = self.__dict__.get("_passed")
        if cached is None:
            cached = {}
            object.__setattr__(self, "_passed", cached)  # (frozen: a cache, not a field)
        return cached.setdefault(reveal, set())

    def passed_builds(self, reveal: frozenset[str] | None) -> set[tuple]:
        """The :meth:`build_signature` values that passed a party's build check against
        this table with opt-ins ``reveal`` (shared by the parties that share the table)."""
        cached = self.__dict__.get("_passed_builds")
        if cached is None:
            cached = {}
            object.__setattr__(self, "_passed_builds", cached)  # (frozen: a cache)
        found = cached.get(reveal)
        if found is None:
            found = cached[reveal] = set()
        return found

    def build_signature(self, arguments: Mapping[str, Any]) -> tuple | None:
        """What the check of the constructor ``arguments`` reads (:meth:`build_problem`,
        :meth:`build_opt_ins`) when it reads no party's dimensions: each declared
        argument's name, type and value. None when an argument's check can read them (an
        array, a number for a field with axes or a size bound by a dimension): such
        arguments are checked party by party.

        Examples
        --------
        >>> table = MessageTable("toy", (), build={"k": Field((), dtype="int"), "v": Field(("d",))})
        >>> table.build_signature({"k": 3}), table.build_signature({"k": 3, "v": [1.0]})
        ((('k', <class 'int'>, 3),), None)
        """
        fields = self.__dict__.get("_build_fields")
        if fields is None:  # (name, whether a number's check reads no dimension)
            fields = tuple(
                (name, not spec.shape and not isinstance(spec.max_size, str))
                for name, spec in self.build.items()
            )
            object.__setattr__(self, "_build_fields", fields)  # (frozen: a cache)
        out = []
        for name, scalar in fields:
            value = arguments.get(name, _ABSENT)
            if value is _ABSENT:
                continue
            t = type(value)
            if not (value is None or t is str or (scalar and t in _SCALAR_KINDS)):
                return None
            out.append((name, t, value))
        return tuple(out)

    @property
    def _valued_fields(self) -> dict[str, tuple[str, ...]]:
        """Kind -> its request fields whose value can need an opt-in."""
        cached = self.__dict__.get("_valued")
        if cached is None:
            cached = {
                s.kind: tuple(n for n, f in s.request.items() if f.party_opt_in) for s in self.specs
            }
            object.__setattr__(self, "_valued", cached)  # (frozen: a cache, not a field)
        return cached

    def valued_fields(self, kind: str) -> tuple[str, ...]:
        """The request fields of ``kind`` whose value can need a party's opt-in (the values
        :meth:`request_signature` reads)."""
        return self._valued_fields.get(kind, ())

    def opt_ins_needed(self, kind: str, payload: Mapping[str, Any]) -> dict[str, str]:
        """The party opt-ins a request of ``kind`` with ``payload`` needs, each with what
        asks for it (the kind, or a field's value): read from the declaration
        (:attr:`MessageSpec.party_opt_in`, :attr:`Field.party_opt_in`).

        Examples
        --------
        >>> table = MessageTable("toy", (
        ...     MessageSpec("go", request={"how": Field((), dtype="str",
        ...                                            party_opt_in={"exact": "hessian"})}),
        ... ))
        >>> table.opt_ins_needed("go", {"how": "exact"}), table.opt_ins_needed("go", {"how": "x"})
        ({'hessian': "its field 'how' = 'exact'"}, {})
        """
        if kind not in self:
            return {}
        spec = self[kind]
        out = {}
        if spec.party_opt_in:
            out[spec.party_opt_in] = "the kind itself"
        for name, value in payload.items():
            f = spec.request.get(name)
            need = None if f is None else f.opt_in_for(value)
            if need and need not in out:
                out[need] = f"its field {name!r} = {value!r:.40}"
        return out

    def build_problem(self, arguments: Mapping[str, Any], dims: Mapping[str, int]) -> str | None:
        """Why the declared constructor ``arguments`` (:attr:`build`, by name) do not fit,
        or None."""
        for name, spec in self.build.items():
            if name not in arguments:
                continue
            why = spec.check(arguments[name], dims)
            if why:
                return f"argument {name!r} {why}"
        return None

    def build_opt_ins(self, arguments: Mapping[str, Any]) -> dict[str, str]:
        """The party opt-ins the constructor ``arguments`` need (:attr:`Field.party_opt_in`
        of :attr:`build`), each with the argument that asks for it."""
        out = {}
        for name, spec in self.build.items():
            need = spec.opt_in_for(arguments.get(name))
            if need and need not in out:
                out[need] = f"its argument {name!r} = {arguments[name]!r:.40}"
        return out

    def per_client(self, method: str | None) -> list[tuple[str, list[str]]]:
        """The messages of ``method`` the server reads client by client, as ``(kind,
        fields)``: a server message whose reply has fields neither sum-only nor unmasked
        (:attr:`Field.sum_only`, :attr:`Field.unmasked`), and a peer or local message that
        sends something (``fields`` empty); the diagnostic messages aside (the certificate
        round goes through sums under secure aggregation). Empty: every message is a sum.

        Examples
        --------
        >>> spec = MessageSpec("m", reply={"g": Field(("d",), sum_only=True), "x": Field(())})
        >>> MessageTable("t", (spec,)).per_client(None)
        [('m', ['x'])]
        """
        out = []
        for spec in self.for_method(method):
            if spec.channel == "diagnostic" or (
                spec.direction == "local" and not spec.reply and spec.value is None
            ):
                continue
            if spec.direction != "server":
                out.append((spec.kind, []))
                continue
            fields = [n for n, f in spec.reply.items() if not (f.sum_only or f.unmasked)]
            if fields:
                out.append((spec.kind, fields))
        return out

    def party_opt_ins(self) -> list[str]:
        """Every party opt-in this table declares (kinds, request and build fields)."""
        names = {s.party_opt_in for s in self.specs if s.party_opt_in}
        fields = [f for s in self.specs for f in s.request.values()] + list(self.build.values())
        names.update(v for f in fields for v in (f.party_opt_in or {}).values())
        return sorted(names)

    def channel(self, kind: str) -> str:
        """The declared channel of ``kind`` (``"algorithm"`` or ``"diagnostic"``)."""
        return self[kind].channel

    def validate(self, party: str, kind: str, direction: str, payload: Any, dims) -> None:
        """Raise :class:`InvalidReply` unless ``payload`` is what ``party`` may send for
        ``kind`` (see :data:`ReplyCheck`)."""
        what = {"server": "reply to", "peer": "peer message", "local": "return of step"}
        where = f"client {party!r}, {what.get(direction, direction)} {kind!r}"
        if kind not in self:
            raise InvalidReply(party, kind, None, f"{where}: the kind is not declared")
        spec = self[kind]
        if spec.direction != direction:
            raise InvalidReply(
                party, kind, None, f"{where}: declared as a {spec.direction!r} message"
            )
        d = dims(party) if callable(dims) else dims
        if direction == "local":
            if spec.value is not None:
                why = spec.value.check(payload, d)
                if why:
                    raise InvalidReply(party, kind, "value", f"{where}: value {why}")
                return
            if payload is None and not spec.reply:
                return
        fields = spec.request if direction == "peer" else spec.reply
        why = spec.check_payload(payload, fields, d)
        if why:
            field_name = why.split("'")[1] if why.startswith(("field", "unknown")) else None
            raise InvalidReply(party, kind, field_name, f"{where}: {why}")

    def checker(self, dims: Callable[[str], Mapping[str, int]]) -> ReplyChecker:
        """The runtime's :data:`ReplyCheck` for this table, with ``dims(party)`` the
        dimensions of one party (computed once per party)."""
        return ReplyChecker(self, dims)

    # -- privacy -----------------------------------------------------------------------------
    def privacy_rows(
        self, method: str | None, dims: Mapping[str, int] | None = None
    ) -> list[dict[str, Any]]:
        """One row per message kind and direction of travel: ``kind``, ``direction``
        (``server -> client``, ``client -> server``, ``client -> client``, ``local``),
        ``channel``, ``fields`` (symbolic shapes), ``floats`` (numbers at most, for
        ``dims``; None without), ``reveals``, ``opt_in``, ``masked`` (the fields the
        server uses only as sums over clients: masked under secure aggregation),
        ``clear`` (the scalars a party still sends in the clear under it),
        ``clear_under_dp`` (those it sends in the clear under dp too; the others join the
        noised sum)."""
        rows = []
        for spec in self.for_method(method):
            legs = {
                "server": [("server -> client", spec.request), ("client -> server", spec.reply)],
                "peer": [("client -> client", spec.request)],
                "local": [("local step -> server", spec.reply)],
            }[spec.direction]
            if spec.direction == "local" and spec.value is not None:
                legs = [("local step -> server", {"(value)": spec.value})]
            for direction, fields in legs:
                if spec.direction == "local" and not fields:
                    continue
                rows.append(
                    {
                        "kind": spec.kind,
                        "methods": spec.methods,
                        "direction": direction,
                        "channel": spec.channel,
                        "fields": {n: _symbolic(f) for n, f in fields.items()},
                        "floats": _floats(fields, dims) if dims is not None else None,
                        "reveals": _reveals(spec, direction, fields),
                        "opt_in": sorted({f.opt_in for f in fields.values() if f.opt_in}),
                        "masked": [n for n, f in fields.items() if f.sum_only],
                        "clear": [n for n, f in fields.items() if f.unmasked],
                        "clear_under_dp": [
                            n for n, f in fields.items() if f.unmasked and not f.dp_summed
                        ],
                    }
                )
        return rows


def _reveals(spec: MessageSpec, direction: str, fields: Mapping[str, Field]) -> str:
    """What one leg of a message reveals: the kind's sentence (what the party sends),
    then each opt-in field's own (the server's request reveals only its iterate)."""
    parts = [] if direction == "server -> client" else [spec.reveals]
    parts += [f"`{n}`: {f.reveals}" for n, f in fields.items() if f.opt_in and f.reveals]
    return "; ".join(p for p in parts if p)


def _symbolic(f: Field) -> str:
    if f.dtype == "str":
        return "text" + ("?" if not f.required else "")
    if f.shape is None:
        shape = "any" + (f" (<= {f.max_size})" if f.max_size is not None else "")
    else:
        shape = "x".join(str(s) for s in f.shape) if f.shape else "1"
    flags = ("?" if not f.required else "") + (" (opt-in)" if f.opt_in else "")
    return f"{shape}{' ' + f.dtype if f.dtype in ('map', 'bool', 'int') else ''}{flags}"


def _floats(fields: Mapping[str, Field], dims: Mapping[str, int]) -> int | None:
    total = 0
    for f in fields.values():
        try:
            n = f.size(dims)
        except KeyError:
            return None
        if n is None:
            return None
        total += n
    return total


def clear_cell(row: Mapping[str, Any], code: str = "`", brackets: str = "()") -> str:
    """The scalars of a privacy table's row sent in the clear under secure aggregation,
    said apart by whether dp noises them in the sum or leaves them clear.

    Examples
    --------
    >>> clear_cell({"clear": ["v", "ok"], "clear_under_dp": ["ok"]}, "", "[]")
    '[clear: v; under dp in the noised sum] [clear, also under dp: ok]'
    """
    names = lambda items: ", ".join(f"{code}{n}{code}" for n in items)  # noqa: E731
    stay = list(row.get("clear_under_dp", ()))
    summed = [n for n in row.get("clear", ()) if n not in stay]
    o, c = brackets
    parts = []
    if summed:
        parts.append(f"{o}clear: {names(summed)}; under dp in the noised sum{c}")
    if stay:
        parts.append(f"{o}clear, also under dp: {names(stay)}{c}")
    return " ".join(parts)


def privacy_markdown(
    rows: Iterable[Mapping[str, Any]], numbers: bool = False, methods: Iterable[str] = ()
) -> str:
    """A markdown table of :meth:`MessageTable.privacy_rows` (``numbers``: a column of
    floats per message for the model the rows were computed for; a kind used by only some
    of ``methods`` is marked with them). Field shapes are symbolic (``d``, ``m_ineq``,
    ...); ``?`` marks an optional field."""
    every = set(methods)
    head = ["kind", "direction", "fields", *(["floats"] if numbers else []), "masked", "reveals"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        fields = ", ".join(f"`{n}` {s}" for n, s in r["fields"].items()) or "(none)"
        if r["channel"] == "diagnostic":
            fields += " [diagnostic]"
        kind = f"`{r['kind']}`"
        if every and r.get("methods") and set(r["methods"]) != every:
            kind += " (" + ", ".join(r["methods"]) + ")"
        cells = [kind, r["direction"], fields]
        if numbers:
            cells.append("?" if r["floats"] is None else str(r["floats"]))
        masked = ", ".join(f"`{n}`" for n in r.get("masked", ()))
        cells.append(" ".join(filter(None, [masked, clear_cell(r)])) or "-")
        reveals = r["reveals"] or "-"
        if r["opt_in"]:
            reveals = "**opt-in** (" + ", ".join(r["opt_in"]) + "): " + reveals
        cells.append(reveals)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
