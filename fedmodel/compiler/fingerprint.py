"""Fingerprints of a compiled model: what a checkpoint must match to be resumed.

Each party's fingerprint is computed where it runs, on its own program (:func:`party_fingerprint`:
its terms, with every constant, bound and coefficient in them, and its data); the server
adds the model's shape and ``h`` (:func:`model_fingerprint`). Only the hashes travel.
:mod:`fedmodel.runtime.checkpoint` compares them (``fingerprint_mismatch``) without knowing
what a program is.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import keyword
import numbers
import weakref
from fractions import Fraction
from typing import Any

import numpy as np

#: numpy dtype kinds hashed by value (bool, int, uint, float, complex)
NUMERIC_KINDS = "biufc"


#: (shape, dtype) -> the text a numeric array of that shape and dtype starts with
_ARRAY_TEXT: dict[tuple, bytes] = {}


def _feed_value(h, v: Any) -> None:
    """Hash a constant's value exactly (dense, sparse, scalar, None)."""
    if v is None:
        h.update(b"none;")
    elif hasattr(v, "nnz"):
        v = v.tocsc()
        h.update(f"sparse{v.shape}{v.dtype};".encode())
        for part in (v.data, v.indices, v.indptr):
            h.update(np.ascontiguousarray(part).tobytes())
    else:
        arr = v if type(v) is np.ndarray else np.asarray(v)
        key = (arr.shape, arr.dtype)
        text = _ARRAY_TEXT.get(key)
        if text is None:
            if arr.dtype.kind not in NUMERIC_KINDS:
                h.update(repr(v).encode())
                return
            text = _ARRAY_TEXT[key] = f"array{arr.shape}{arr.dtype};".encode()
        h.update(text)
        h.update(arr.tobytes())  # (C order, whatever the array's own)


def _data_by_name(e: Any) -> bytes:
    return f"data:{e.owner}.{e.data_name};".encode()


#: (name, shape, storage type) -> the text of private data by shape
_DATA_TEXT: dict[tuple, bytes] = {}


def _data_by_shape(e: Any) -> bytes:
    v = e.value
    key = (e.data_name, e.shape, type(v))
    text = _DATA_TEXT.get(key)
    if text is None:
        storage = "sparse" if hasattr(v, "nnz") else "dense"
        text = _DATA_TEXT[key] = f"data:{e.data_name}{e.shape}{storage};".encode()
    return text


#: type -> how :func:`_feed_expr` takes its objects: the tests against cvxpy's and
#: numbers' abstract classes, made once per type
_KINDS: dict[type, str] = {}


def _kind(t: type) -> str:
    kind = _KINDS.get(t)
    if kind is None:
        import cvxpy as cp

        from fedmodel.dsl.data import PrivateData

        if issubclass(t, cp.Variable):
            kind = "variable"
        elif issubclass(t, PrivateData):
            kind = "data"
        elif issubclass(t, cp.Expression):
            kind = "expr"
        elif issubclass(t, (list, tuple)):
            kind = "seq"
        elif issubclass(t, (np.ndarray, np.generic)) or hasattr(t, "nnz"):
            kind = "value"
        elif t is type(None) or issubclass(t, (str, bool, numbers.Number, Fraction, slice)):
            kind = "plain"
        else:
            kind = "other"
        _KINDS[t] = kind
    return kind


#: (type, shape, suffix) -> the text a node of that type and shape starts with
_NODE_TEXT: dict[tuple, bytes] = {}

#: (type, value) -> the text of a plain value of a type whose equal values print alike
_PLAIN_TEXT: dict[tuple, bytes] = {}
_PLAIN_KEYED = (str, int, bool, type(None))


def _node_text(t: type, shape: tuple, suffix: bytes = b"") -> bytes:
    key = (t, shape, suffix)
    text = _NODE_TEXT.get(key)
    if text is None:
        text = _NODE_TEXT[key] = f"{t.__name__}{shape}".encode() + suffix
    return text


def _plain_text(obj: Any) -> bytes:
    t = type(obj)
    if t not in _PLAIN_KEYED:  # (floats: 0.0 and -0.0 are equal keys that print apart)
        return f"{t.__name__}:{obj!r};".encode()
    key = (t, obj)
    text = _PLAIN_TEXT.get(key)
    if text is None:
        text = _PLAIN_TEXT[key] = f"{t.__name__}:{obj!r};".encode()
    return text


_NO_DATA = _plain_text(None) + b"("

#: (values, their types) -> the text of an atom's data of plain values and the opening
#: bracket after it
_LIST_TEXT: dict[tuple, bytes] = {}
_PLAIN_TYPES = frozenset(_PLAIN_KEYED)


def _plain_list_text(d: Any) -> bytes | None:
    """The text of ``d`` and the opening bracket, when ``d`` is a list of values of types
    whose equal values print alike (:data:`_PLAIN_KEYED`); None otherwise."""
    if type(d) is not list:
        return None
    types = tuple(map(type, d))
    if not _PLAIN_TYPES.issuperset(types):
        return None
    key = (tuple(d), types)
    text = _LIST_TEXT.get(key)
    if text is None:
        text = _LIST_TEXT[key] = b"[" + b"".join(map(_plain_text, d)) + b"]("
    return text


class _Parts(list):
    """The bytes a hash is fed, kept in order and fed at once (the same digest as feeding
    them one by one: a hash of their concatenation)."""

    update = list.append


def _feed_expr(h, expr: Any, variables: dict[int, int], data=_data_by_name) -> None:
    """Hash the expression tree ``expr`` canonically: each atom's type, shape and own
    data (exponents, axes, index keys ...), each variable by its place in the layout,
    each constant and parameter by its value, private data as ``data`` writes it (by
    default its owner and name: the data itself is hashed separately)."""
    parts = _Parts()
    _expr_parts(parts, ((b"", expr, None),), variables, data)
    h.update(b"".join(parts))


def _expr_parts(parts: _Parts, items, variables: dict[int, int], data) -> None:
    """For each ``(header, expr, leaves)`` of ``items``: ``header`` and the bytes
    :func:`_feed_expr` hashes for ``expr``, appended to ``parts``; and, unless ``leaves``
    is None, the tree's leaves appended to ``leaves``, left to right (the order of
    :func:`~fedmodel.compiler.glm.expression_leaves`)."""
    put = parts.append
    kinds, texts = _KINDS, _NODE_TEXT

    def feed(obj: Any) -> None:
        kind = kinds.get(type(obj)) or _kind(type(obj))
        if kind in ("expr", "variable", "data"):
            drain(obj, None)
        elif kind == "seq":
            put(b"[")
            for x in obj:
                feed(x)
            put(b"]")
        elif kind == "value":
            _feed_value(parts, obj)
        elif kind == "plain":
            put(_plain_text(obj))
        else:  # an object without a stable value: its type only
            put(f"<{type(obj).__name__}>;".encode())

    def drain(top: Any, out: list | None) -> None:
        stack = [top]
        pop, push, close = stack.pop, stack.extend, _CLOSE
        while stack:
            e = pop()
            if e is close:
                put(b")")
                continue
            t = type(e)
            shape = e.shape
            put(texts.get((t, shape, b"")) or _node_text(t, shape))
            args = e.args
            if args:
                d = e.get_data()
                if d is None:  # (the text of None and the opening bracket at once)
                    put(_NO_DATA)
                else:
                    text = _plain_list_text(d)
                    if text is None:
                        feed(d)
                        put(b"(")
                    else:
                        put(text)
                push((close, *args[::-1]))
                continue
            if out is not None:
                out.append(e)
            kind = kinds.get(t) or _kind(t)
            if kind == "variable":
                place = variables.get(id(e))
                put(_place_text(place) if place is not None else f"'{e.name()}';".encode())
            elif kind == "data":
                put(data(e))
            else:  # a constant, a parameter
                _feed_value(parts, e.value)

    for header, expr, leaves in items:
        put(header)
        kind = kinds.get(type(expr)) or _kind(type(expr))
        if kind in ("expr", "variable", "data"):
            drain(expr, leaves)
        else:
            feed(expr)


_CLOSE = object()

#: a variable's place in the layout -> its text
_PLACE_TEXT: dict[int, bytes] = {}


def _place_text(place: int) -> bytes:
    text = _PLACE_TEXT.get(place)
    if text is None:
        text = _PLACE_TEXT[place] = f"#{place};".encode()
    return text


def terms_fingerprint(program: Any) -> str:
    """A hash of one party's terms: every objective term and constraint (label, kind,
    size, the whole expression with every constant in it), over its variable layout."""
    h = hashlib.sha256()
    h.update(f"{program.name}:{program.layout.size};".encode())
    variables = {id(v): i for i, v in enumerate(program.layout.variables)}
    for t in program.objective:
        h.update(f"obj:{t.label}:{t.allow_nonconvex};".encode())
        _feed_expr(h, t.expr, variables)
    for c in program.constraints:
        h.update(f"con:{c.label}:{c.kind}:{c.size}:{c.allow_nonconvex};".encode())
        _feed_expr(h, c.expr, variables)
    return h.hexdigest()


def structure_fingerprint(program: Any) -> str:
    """A hash of one party's terms up to its data: like :func:`terms_fingerprint`, but
    without the party's name and the terms' labels, and each of its private data by name,
    shape and storage (dense or sparse) instead of its owner. Parties with equal ones
    have the same expressions, with the same constants, over data of the same shapes:
    everything the compiler derives from an expression's structure (its GLM
    recognition's path, for one) is the same for them.

    Examples
    --------
    >>> import cvxpy as cp, numpy as np, fedmodel as fm
    >>> m = fm.Model("demo")
    >>> w = m.variable(2, name="w")
    >>> for k, y in enumerate([np.ones(2), np.zeros(2), np.ones(3)]):
    ...     c = m.client(f"site{k}")
    ...     c.minimize(cp.sum_squares(w[0] - c.data(y, name="y")), name=f"loss{k}")
    >>> a, b, c = (structure_fingerprint(p) for p in m.compile().clients)
    >>> a == b, a == c
    (True, False)
    """
    return structure_reading(program)[0]


def structure_reading(program: Any) -> tuple[str, dict[int, tuple[Any, list]]]:
    """:func:`structure_fingerprint` of ``program`` and, from the same walk, each term's
    leaves: ``id(expr) -> (expr, its leaves left to right)`` (what
    :func:`~fedmodel.compiler.glm.expression_leaves` finds), for every objective term and
    constraint.

    The terms are read by a matcher of their key when one was made for their skeleton
    (:func:`_matcher`: when terms of that key were walked again): it checks every node and leaf
    against the walk it was made from, gives the leaves and collects the nodes' shapes and
    the private data's names, shapes and types of value: the fingerprint is the one the
    walk of terms with those gave."""
    layout = program.layout
    headers, exprs, types = [], [], []
    for t in program.objective:
        expr = t.expr
        headers.append(_term_text("obj", t.allow_nonconvex))
        exprs.append(expr)
        types.append(type(expr))
    for c in program.constraints:
        expr = c.expr
        headers.append(_con_text(c.kind, c.size, c.allow_nonconvex))
        exprs.append(expr)
        types.append(type(expr))
    key = (layout.size, tuple(headers), tuple(types))
    places = _places(layout)
    matchers = _MATCHERS.get(key, ())  # (None: none for good)
    matcher = read = None
    for matcher in matchers or ():
        read = matcher(exprs, places)
        if read is not None:
            digest = _MATCHED.get((matcher, read[1]))
            if digest is not None:
                _TALLY[key][0] += 1
                return digest, read[0]
            break
    parts = _Parts((_size_text(layout.size),))
    items = [(header, expr, []) for header, expr in zip(headers, exprs)]
    _expr_parts(parts, items, places, _data_by_shape)
    found = {id(expr): (expr, leaves) for _, expr, leaves in items}
    digest = hashlib.sha256(b"".join(parts)).hexdigest()
    if read is None and key in _WALKED and matchers is not None:
        read = _new_matcher(key, exprs, places)
        matcher = _MATCHERS[key][0] if read is not None else None
    _WALKED.add(key)
    if read is not None:
        _MATCHED[(matcher, read[1])] = digest
        _SKELETONS[digest] = matcher
    return digest, found


def structure_skeleton(structure: str) -> Any:
    """The skeleton of the terms of ``structure`` (a :func:`structure_fingerprint`), when
    a matcher has read terms of it (:func:`structure_reading`): that matcher. Structures
    of one skeleton have terms with the same atoms (type, own data), variables at the same
    places and constants of the same values, their nodes of any shape and their private
    data of any name, shape or storage; None when no matcher has read terms of it."""
    return _SKELETONS.get(structure)


def _new_matcher(key: tuple, exprs: list, places: dict[int, int]) -> tuple | None:
    """A matcher made from ``exprs`` (:func:`_matcher`) for terms of ``key``, first among
    its matchers, and its reading of ``exprs``; None when it has none: the terms hold what
    a matcher does not check, or terms of this key have been walked more often than
    matched (each of its parties of its own skeleton: its matchers are then dropped for
    good), or it has :data:`MATCHERS_PER_KEY` already."""
    tally = _TALLY.setdefault(key, [0, 0])
    tally[1] += 1
    if tally[1] > 2 * MATCHERS_PER_KEY and tally[1] > tally[0]:
        _MATCHERS[key] = None
        return None
    matchers = _MATCHERS.setdefault(key, [])
    if len(matchers) >= MATCHERS_PER_KEY:
        return None
    made = _matcher(exprs, places)
    if made is None:
        return None
    matchers.insert(0, made)
    return made(exprs, places)


@functools.lru_cache(maxsize=256)
def _con_text(kind: str, size: int, allow_nonconvex: bool) -> bytes:
    return f"con:{kind}:{size}:{allow_nonconvex};".encode()


#: (layout size, term headers, term types) -> the matchers of terms of that key
#: (:func:`_matcher`), the last made first, or None when it has none for good
_MATCHERS: dict[tuple, list | None] = {}

#: a key of :data:`_MATCHERS` -> [terms read by a matcher, terms walked after the first]
_TALLY: dict[tuple, list[int]] = {}

#: the most matchers kept for one key (parties whose terms differ in a constant)
MATCHERS_PER_KEY = 4

#: the keys of :data:`_MATCHERS` whose terms have been walked
_WALKED: set[tuple] = set()

#: (matcher, the nodes' shapes and private data's names, shapes and types of value it
#: collected) -> the structure fingerprint the walk gave
_MATCHED: dict[tuple, str] = {}

#: a structure fingerprint -> the matcher that read terms of it (its skeleton, as
#: :func:`structure_skeleton` gives it): one per entry of :data:`_MATCHED`
_SKELETONS: dict[str, Any] = {}

#: a matcher is made for terms of at most this many nodes
MATCHER_MAX_NODES = 200


class _NoMatcher(Exception):
    """The terms hold what a matcher does not check (internal)."""


def _value_bytes(v: Any) -> bytes:
    """The bytes :func:`_feed_value` hashes for ``v``."""
    parts = _Parts()
    _feed_value(parts, v)
    return b"".join(parts)


def _matcher(exprs: list, places: dict[int, int]):
    """A function ``(exprs, places) -> (each term's leaves, what it collected)`` that
    reads terms of the skeleton of ``exprs``: the same atoms (type, own data), variables
    at the same places and constants of the same values (what :func:`structure_reading`
    hashes of them), nodes of any shape and private data of any name, shape and storage;
    None from it when the terms differ. The leaves are ``id(expr) -> (expr, its leaves
    left to right)`` for each term; what it collected is, in the walk's order, each node's
    shape and each private data's name, shape and type of value (what its text is made
    of, :func:`_data_by_shape`). None when the terms hold what it does not check (atoms
    with data other than plain values, variables outside the layout) or more than
    :data:`MATCHER_MAX_NODES` nodes."""
    from cvxpy.utilities.canonical import Canonical

    no_data = Canonical.get_data  # (the data of an atom without any: None)
    names: dict[str, Any] = {"_value_bytes": _value_bytes}
    lines: list[str] = []
    collected: list[str] = []  # (read once every check has passed)
    count = [0]

    def constant(x: Any) -> str:
        name = f"k{len(names)}"
        names[name] = x
        return name

    def node(e: Any, var: str, out: list[str]) -> None:
        count[0] += 1
        if count[0] > MATCHER_MAX_NODES:
            raise _NoMatcher
        t = type(e)
        lines.append(f"if type({var}) is not {constant(t)}: return None")
        args = e.args
        kind = _kind(t)
        shape = f"{var}.{_attribute_read(t, 'shape')}"
        if args or kind != "data":  # (a variable by its place and shape, data in its text)
            collected.append(shape)
        if args:
            d = e.get_data()
            if d is None:
                if t.get_data is not no_data:  # (else none: its type has cvxpy's default)
                    lines.append(f"if {var}.get_data() is not None: return None")
            else:
                if _plain_list_text(d) is None:
                    raise _NoMatcher
                lines.append(f"d = {var}.get_data()")
                lines.extend(_plain_list_check(d, constant))
            subs = [f"e{count[0]}_{i}" for i in range(len(args))]
            lines.append(f"a = {var}.args")
            lines.append(f"if len(a) != {len(args)}: return None")
            lines.append(f"{', '.join(subs)}, = a")
            for a, sub in zip(args, subs):
                node(a, sub, out)
            return
        lines.append(f"if {var}.args: return None")
        out.append(var)
        if kind == "variable":
            place = places.get(id(e))
            if place is None:
                raise _NoMatcher
            lines.append(f"if places.get(id({var})) != {int(place)}: return None")
        elif kind == "data":
            value = f"{var}.{_attribute_read(t, 'value')}"
            collected.extend((f"{var}.data_name", shape, f"type({value})"))
        elif kind == "expr":  # (a constant, a parameter: by value)
            lines.extend(_value_check(f"{var}.{_attribute_read(t, 'value')}", e.value, constant))
        else:
            raise _NoMatcher

    terms = []
    try:
        for i, e in enumerate(exprs):
            if _kind(type(e)) not in ("expr", "variable", "data"):
                raise _NoMatcher
            lines.append(f"t{i} = exprs[{i}]")
            leaves: list[str] = []
            node(e, f"t{i}", leaves)
            terms.append(f"id(t{i}): (t{i}, [{', '.join(leaves)}])")
    except _NoMatcher:
        return None
    found = "{" + ", ".join(terms) + "}"
    body = [*lines, f"return {found}, ({''.join(f'{x}, ' for x in collected)})"]
    text = "def match(exprs, places):\n" + "\n".join(f"    {line}" for line in body)
    # (the text holds this module's names, generated identifiers, integers and the keywords
    # None, True and False only; every object of the terms it compares with is in
    # ``names``: nothing of a value is code)
    exec(compile(text, "<structure matcher>", "exec"), names)  # (names: its constants)
    return names["match"]


def _plain_list_check(d: list, constant) -> list[str]:
    """Lines of a matcher that return None unless ``d`` (its variable) is a list of the
    values of the plain list ``d`` (:func:`_plain_list_text`), each of the same type: the
    same text."""
    lines = [f"if type(d) is not list or len(d) != {len(d)}: return None"]
    for i, x in enumerate(d):
        if x is None or type(x) is bool:  # (singletons)
            literal = "None" if x is None else repr(bool(x))  # (one of three keywords)
            lines.append(f"if d[{i}] is not {literal}: return None")
        else:
            lines.append(f"if type(d[{i}]) is not {constant(type(x))}: return None")
            lines.append(f"if d[{i}] != {constant(x)}: return None")
    return lines


def _value_check(value: str, v: Any, constant) -> list[str]:
    """Lines of a matcher that return None unless the value ``value`` reads (a leaf's) has
    the bytes :func:`_feed_value` hashes for ``v``: for a numeric array or numpy scalar,
    one of the same type, dtype, shape and bytes."""
    kind = getattr(getattr(v, "dtype", None), "kind", None)
    if (type(v) is np.ndarray or isinstance(v, np.generic)) and kind in NUMERIC_KINDS:
        return [
            f"v = {value}",
            f"if type(v) is not {constant(type(v))} or v.dtype != {constant(v.dtype)}:",
            "    return None",
            f"if v.shape != {constant(v.shape)} or v.tobytes() != {constant(v.tobytes())}:",
            "    return None",
        ]
    return [f"if _value_bytes({value}) != {constant(_value_bytes(v))}: return None"]


def _returns_attribute(self):  # (the code of a getter that returns an attribute of its object)
    return self.attribute


def _attribute_read(t: type, name: str) -> str:
    """The attribute a matcher reads for the attribute ``name`` of objects of type ``t``:
    when ``t``'s ``name`` is a property whose getter is ``return self.<attribute>`` (the
    code of :func:`_returns_attribute`, over another name perhaps) and ``t`` looks its
    attributes up as ``object`` does, that attribute (the same value, without calling the
    getter); else ``name``."""
    prop = inspect.getattr_static(t, name, None)
    code = getattr(prop.fget, "__code__", None) if type(prop) is property else None
    if (
        code is not None
        and t.__getattribute__ is object.__getattribute__
        and code.co_code == _returns_attribute.__code__.co_code
        and code.co_argcount == 1
        and code.co_kwonlyargcount == 0
        and len(code.co_names) == 1
        and code.co_names[0].isidentifier()
        and not keyword.iskeyword(code.co_names[0])
    ):
        return code.co_names[0]
    return name


#: layout -> {id(variable): its place}
_PLACES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


_LAST_PLACES: list = [None, None]  # (a weak reference to the last layout, its places)


def _places(layout: Any) -> dict[int, int]:
    """``{id(v): i}`` over ``layout``'s variables, made once per layout (read only)."""
    ref, found = _LAST_PLACES
    if ref is not None and ref() is layout:
        return found
    found = _PLACES.get(layout)
    if found is None:
        found = _PLACES[layout] = {id(v): i for i, v in enumerate(layout.variables)}
    _LAST_PLACES[:] = (weakref.ref(layout), found)
    return found


@functools.lru_cache(maxsize=64)
def _size_text(size: int) -> bytes:
    return f"{size};".encode()


@functools.lru_cache(maxsize=8)
def _term_text(what: str, allow_nonconvex: bool) -> bytes:
    return f"{what}:{allow_nonconvex};".encode()


def data_fingerprint(program: Any) -> str:
    """A hash of one party's private data (names, shapes and values)."""
    h = hashlib.sha256()
    for d in program.data:
        h.update(f"data:{getattr(d, 'data_name', '')};".encode())
        v = d.value
        _feed_value(h, v if hasattr(v, "nnz") else np.asarray(v, dtype=float))
    return h.hexdigest()


def party_fingerprint(program: Any) -> dict[str, str] | None:
    """One party's fingerprint, computed where it runs: ``{"terms": ..., "data": ...}``
    (:func:`terms_fingerprint`, :func:`data_fingerprint`); None without a program.

    Examples
    --------
    >>> import cvxpy as cp, numpy as np, fedmodel as fm
    >>> def build(bound):
    ...     m = fm.Model("demo")
    ...     w = m.variable(2, name="w")
    ...     c = m.client("site0")
    ...     c.minimize(cp.sum_squares(w - c.data(np.ones(2), name="a")))
    ...     c.subject_to(w[0] <= bound)
    ...     return m.compile().clients[0]
    >>> a, b = party_fingerprint(build(0.45)), party_fingerprint(build(0.3))
    >>> a["data"] == b["data"], a["terms"] == b["terms"]
    (True, False)
    """
    if program is None:
        return None
    return {"terms": terms_fingerprint(program), "data": data_fingerprint(program)}


def regularizer_fingerprint(regularizer: Any) -> str:
    """A hash of the regularizer ``h``: each piece's variable slice and coefficients."""
    h = hashlib.sha256()
    for s, piece in zip(regularizer.slices, regularizer.pieces):
        h.update(f"{s.start}:{s.stop};".encode())
        for key, value in sorted(vars(piece).items()):
            h.update(f"{key}=".encode())
            _feed_value(h, value)
    return h.hexdigest()


def model_fingerprint(compiled) -> dict[str, Any]:
    """What the server knows of the model: its name, variables, clients, own terms, h."""
    return {
        "name": compiled.name,
        "n_variables": int(compiled.layout.size),
        "clients": [c.name for c in compiled.clients],
        "server": party_fingerprint(compiled.server),
        "h": regularizer_fingerprint(compiled.regularizer),
    }
