"""Endpoints: how a party's message handler is built where it runs, and what it may use there.

An :class:`EndpointFactory` (an importable callable and its picklable arguments) travels to
the host that runs the party, never a live object; :data:`RUNTIME_PROXY` among its arguments
stands for the host's peer :class:`Outbox`. :func:`copy_state` snapshots a party's state
(steps, marks, checkpoints).
"""

from __future__ import annotations

import copy
import itertools
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from operator import attrgetter, itemgetter
from typing import Any

import numpy as np

from fedmodel.runtime.messages import SERVER, Message


# -- endpoint factories ------------------------------------------------------------------------
class Placeholder:
    """A named stand-in among an :class:`EndpointFactory`'s arguments for something that
    exists only where the party is built (the runtime's peer outbox, the party's own
    program); :meth:`EndpointFactory.substituted` puts the real object in its place. One
    object per name (:func:`placeholder`), also after pickling. Arguments are told apart
    by their type being this class (it has no subclasses).

    Examples
    --------
    >>> import pickle
    >>> pickle.loads(pickle.dumps(RUNTIME_PROXY)) is RUNTIME_PROXY
    True
    >>> EndpointFactory(dict, (), {"x": RUNTIME_PROXY}).substituted({RUNTIME_PROXY: 1}).kwargs
    {'x': 1}
    """

    def __init__(self, name: str):
        self.name = name

    def __init_subclass__(cls, **kwargs):
        raise TypeError("Placeholder has no subclasses: arguments are told apart by their type")

    def __repr__(self) -> str:
        return self.name

    def __reduce__(self):
        return (placeholder, (self.name,))


_PLACEHOLDERS: dict[str, Placeholder] = {}


def placeholder(name: str) -> Placeholder:
    """The placeholder called ``name`` (made on first use)."""
    if name not in _PLACEHOLDERS:
        _PLACEHOLDERS[name] = Placeholder(name)
    return _PLACEHOLDERS[name]


#: "the runtime": endpoints that send peer-to-peer messages receive, in its place, an object
#: with ``send_peer(sender, receiver, kind, payload, channel)`` (the runtime itself in the
#: serial backend, an outbox that the worker returns with the reply elsewhere)
RUNTIME_PROXY = placeholder("RUNTIME_PROXY")


@dataclass(frozen=True)
class EndpointFactory:
    """How to build one party's endpoint where it runs: ``target(*args, **kwargs)``.

    ``target`` must be importable (a module-level class or function) so that the factory
    pickles; arguments are pickled too (a ``PartyProgram`` travels without its compiled
    evaluators, see ``PartyProgram.__getstate__``). :data:`RUNTIME_PROXY` among the arguments is replaced by the worker's peer
    outbox.

    ``reveal`` is the party's own opt-ins (``ClientHalf.reveal``; None: whatever the
    method's options ask for). It never crosses a Flower link: a deployed party sets its
    own (``fedmodel join --reveal``).
    """

    target: Callable[..., Any]
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    reveal: frozenset[str] | None = None

    def substituted(self, values: Mapping[Placeholder, Any]) -> EndpointFactory:
        """This factory with each :class:`Placeholder` among its arguments that ``values``
        names replaced by its value (the one place arguments are substituted); itself
        when none of its arguments is a placeholder."""
        if Placeholder not in map(type, (*self.args, *self.kwargs.values())):
            return self
        return self.mapped(lambda v: values.get(v, v) if type(v) is Placeholder else v)

    def mapped(self, fn: Callable[[Any], Any]) -> EndpointFactory:
        """This factory with ``fn`` applied to each argument."""
        return EndpointFactory(
            self.target,
            tuple(fn(a) for a in self.args),
            {k: fn(v) for k, v in self.kwargs.items()},
            self.reveal,
        )

    def build(self, outbox: Any = None, compiled: Any = None) -> Any:
        """The endpoint, after its target's ``check_build`` (a client half's: its
        arguments by value and the opt-ins they need against :attr:`reveal`; with
        ``compiled``, the party's own compiled model, its options' ``validate`` too)."""
        f = self.substituted({RUNTIME_PROXY: outbox})
        check = getattr(f.target, "check_build", None)
        if check is not None:
            check(f.args, f.kwargs, self.reveal, compiled)
        endpoint = f.target(*f.args, **f.kwargs)
        if check is not None:
            endpoint.reveal = self.reveal
        return endpoint


# -- the worker side -------------------------------------------------------------------------------
class Outbox:
    """Collects the peer messages an endpoint sends while handling a message (remote
    backends); the worker returns them with the step's outcome."""

    def __init__(self):
        self.round = 0
        self.messages: list[Message] = []

    def send_peer(self, sender, receiver, kind, payload, channel="algorithm") -> Message:
        msg = Message(kind, sender, receiver, payload, self.round, channel)
        self.messages.append(msg)
        return msg

    def take(self) -> list[Message]:
        out, self.messages = self.messages, []
        return out


def copy_state(obj: Any) -> Any:
    """A deep copy of a party's state: dicts, lists and tuples of numpy arrays and scalars
    are copied directly (a step snapshots its party's state and every mark copies every
    party's, so this is on the hot path: a container's leaves are copied inline, without a
    call each); read-only and empty arrays are shared (nobody can change them in place:
    the Newton backend's carried factor; an array without elements), as are tuples of
    scalars; anything else goes through ``copy.deepcopy``."""
    t = type(obj)  # (the exact types first: a state holds thousands of them)
    if t is np.ndarray:
        return _array_copy(obj)
    if t in _ATOMS:
        return obj
    if t is dict:  # (one of many scalars, a value per party: copied in one call)
        if len(obj) > _MANY and _ATOMS.issuperset(map(type, obj.values())):
            return dict(obj)
        return {k: _copy_item(v) for k, v in obj.items()}
    if t is list:
        if len(obj) > _MANY and _ATOMS.issuperset(map(type, obj)):
            return list(obj)
        return [_copy_item(v) for v in obj]
    if t is tuple:  # (shared while every item is: scalars, empty or read-only arrays)
        items = [_copy_item(v) for v in obj]
        return obj if all(a is b for a, b in zip(items, obj)) else tuple(items)
    if isinstance(obj, np.ndarray):
        return _array_copy(obj)
    if isinstance(obj, (float, int, str, bool, np.generic)):
        return obj
    return copy.deepcopy(obj)


def _copy_item(v: Any) -> Any:
    """:func:`copy_state` of an item of a container, its common leaves without a call."""
    tv = type(v)
    if tv in _ATOMS:
        return v
    if tv is np.ndarray:
        return _array_copy(v)
    return copy_state(v)


def _array_copy(a: np.ndarray) -> np.ndarray:
    """A copy of ``a``, or ``a`` itself when it is empty or read-only."""
    return a.copy() if a.size and a.flags.writeable else a


#: the immutable scalar types a state is copied without looking further
_ATOMS = frozenset({float, int, str, bool, type(None)})

#: the length from which a container's values are first looked at together (all scalars:
#: the container copied in one call)
_MANY = 16


def _get_state(ep: Any) -> Any:
    getter = getattr(ep, "get_state", None)
    return copy_state(getter()) if getter is not None else None


class StateColumns(dict):
    """The states of many parties of one class given as columns: key -> a list with each
    party's value, in order (the dicts their ``get_state`` gives, with these keys in this
    order); a value may itself be a :class:`StateColumns` (the states of their components)
    or a :class:`RowColumn` (values already copied). What a class's
    ``state_columns(parties)`` returns, uncopied; :class:`StatesCopy` copies it without a
    dict per party."""


class RowColumn:
    """A column of :class:`StateColumns` whose value for party ``i`` is row ``index[i]``
    of ``rows``, a read-only array that is already a copy (the rows of a stacked array
    that many parties' values are rows of, copied once): a mark keeps it as it is and a
    party's value is a read-only view of its row, made when it is read.

    Examples
    --------
    >>> rows = np.arange(6.0).reshape(3, 2)
    >>> rows.flags.writeable = False
    >>> StatesCopy(StateColumns(x=RowColumn(rows, np.array([2, 0])))).state(0)
    {'x': array([4., 5.])}
    """

    __slots__ = ("rows", "index")

    def __init__(self, rows: np.ndarray, index: np.ndarray):
        if rows.flags.writeable:
            raise ValueError("a RowColumn's rows are read-only")
        self.rows, self.index = rows, index

    def __len__(self) -> int:
        return len(self.index)

    def at(self, i: int) -> np.ndarray:
        return self.rows[self.index[i]]


def party_states(parties: list[Any]) -> list[Any] | StateColumns:
    """The uncopied ``get_state()`` of each of ``parties`` (None for one without it): as
    :class:`StateColumns` when they are of one class that reads many at once
    (``state_columns``: a dict of columns, or None), else a list."""
    kinds = set(map(type, parties))
    if len(kinds) == 1:
        columns = getattr(kinds.pop(), "state_columns", None)
        cols = columns(parties) if columns is not None else None
        if cols is not None:
            return cols if type(cols) is StateColumns else StateColumns(cols)
    getters = [getattr(p, "get_state", None) for p in parties]
    return [g() if g is not None else None for g in getters]


class StatesCopy:
    """:func:`copy_state` of many parties' states, taken together (a mark copies every
    party's state of a host: thousands of states of one layout).

    The states are read as columns, one per place in their common layout (a key of a dict,
    an item of a tuple or list), so each place costs a few C-level passes over the parties
    instead of a recursive call per value: the values of a place are kept as they are when
    they are immutable scalars, empty or read-only arrays, copied when they are writable
    arrays, and copied one by one by :func:`copy_state` where the parties' values differ in
    type or layout. A party's state is assembled from its columns when it is read
    (:meth:`state`): the same value :func:`copy_state` gives, in containers of its own.

    Examples
    --------
    >>> states = [{"x": np.zeros(2), "k": i, "log": [(1.0, i)]} for i in range(3)]
    >>> snap = StatesCopy(states)
    >>> states[1]["x"][0] = 5.0
    >>> snap.state(1)
    {'x': array([0., 0.]), 'k': 1, 'log': [(1.0, 1)]}
    """

    __slots__ = ("_root",)

    def __init__(self, states: list[Any] | StateColumns):
        self._root = _column(states if type(states) is StateColumns else list(states))

    def state(self, i: int) -> Any:
        """Party ``i``'s state (in the order given)."""
        return self._root.at(i)


class _Values:
    """A place whose value for party ``i`` is ``values[i]`` (kept or already copied)."""

    __slots__ = ("values",)

    def __init__(self, values: list[Any]):
        self.values = values

    def at(self, i: int) -> Any:
        return self.values[i]


class _Copies(_Values):
    """A place whose values differ in type or layout between parties: copied one by one,
    and again when read (a read has containers of its own)."""

    __slots__ = ()

    def at(self, i: int) -> Any:
        return copy_state(self.values[i])


class _Dicts:
    """A place holding a dict with the same keys, in the same order, for every party."""

    __slots__ = ("keys", "children")

    def __init__(self, keys: tuple, children: list):
        self.keys, self.children = keys, children

    def at(self, i: int) -> dict:
        return {k: c.at(i) for k, c in zip(self.keys, self.children)}


class _Sequences:
    """A place holding a tuple (or a list) of the same length for every party."""

    __slots__ = ("kind", "children")

    def __init__(self, kind: type, children: list):
        self.kind, self.children = kind, children

    def at(self, i: int) -> tuple | list:
        return self.kind([c.at(i) for c in self.children])


def _column(
    values: list[Any] | StateColumns | RowColumn,
) -> _Values | _Copies | _Dicts | _Sequences | RowColumn:
    """The copy of one place of many parties' states (``values``: its value per party, or
    the dicts there as :class:`StateColumns`)."""
    if type(values) is StateColumns:
        return _Dicts(tuple(values), [_column(v) for v in values.values()])
    if type(values) is RowColumn:  # (a copy already, read-only: kept)
        return values
    if len(values) > 1 and _one_shared(values):  # (one object for all, kept as it is)
        return _Values(values)
    types = set(map(type, values))
    t = types.pop() if len(types) == 1 else None
    if t in _ATOMS:
        return _Values(values)
    if t is np.ndarray:
        if not any(map(_size, values)):  # (empty arrays are shared)
            return _Values(values)
        if all(map(_writeable, values)):
            return _Values(list(map(np.ndarray.copy, values)))
        if not any(map(_writeable, values)):  # (read-only arrays are shared)
            return _Values(values)
        return _Values([_array_copy(a) for a in values])
    if t is dict:
        keys = tuple(values[0])
        if len(set(map(tuple, values))) == 1:
            return _Dicts(keys, [_column(list(map(itemgetter(k), values))) for k in keys])
    elif t is tuple or t is list:
        if len(set(map(len, values))) == 1:
            return _Sequences(t, [_column(list(col)) for col in zip(*values)])
    return _Copies([copy_state(v) for v in values])


def _one_shared(values: list[Any]) -> bool:
    """Whether ``values`` are one object that :func:`copy_state` shares (a scalar, an
    empty or read-only array, a tuple of such: nothing can change it); the test stops at
    the first value that is another object."""
    first = values[0]
    return all(map(operator.is_, values, itertools.repeat(first))) and copy_state(first) is first


_size = attrgetter("size")
_writeable = attrgetter("flags.writeable")


class EchoEndpoint:
    """A trivial party that answers every message with its payload (measures a runtime's
    own cost per round: ``benchmarks/backends.py``)."""

    def __init__(self, name: str):
        self.name = name
        self.count = 0

    def get_state(self) -> dict:
        return {"count": self.count}

    def set_state(self, state: dict) -> None:
        self.count = int(state["count"])

    def handle(self, msg: Message) -> Message:
        self.count += 1
        return Message(msg.kind + "_reply", self.name, SERVER, dict(msg.payload), msg.round)
