"""Issue 22, item 1: a coordinator cannot make a party run code through the Flower codec.

The attack (reproduced on main): a ``build`` call whose factory names
``fedmodel.runtime.flower_party:os.system`` (or ``builtins.eval`` through a fedmodel module)
made every deployed party run a shell command. Here the same crafted names travel through
the decoder, through Flower records, through a real party server on a Unix socket and
through the relay ClientApp's forward path: each is refused with a ``CodecError`` naming
what was sent, nothing runs (a sentinel file that the command would create stays absent,
``os.system`` is never called), and the party answers the next, honest call. An honest
build of every endpoint kind a deployment builds round-trips exactly.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import socket
import threading

import numpy as np
import pytest

from fedmodel.errors import ModelError, UnsupportedError
from fedmodel.runtime.endpoints import EndpointFactory
from fedmodel.runtime.flower_codec import LOCAL_PROGRAM, CodecError, decode, encode
from fedmodel.runtime.wire import (
    WIRE_EXCEPTIONS,
    make_exception,
    register_wire_type,
    unregister_wire_type,
    wire_types,
)


# -- the attack's payloads -----------------------------------------------------------------------
@pytest.fixture
def sentinel(tmp_path, monkeypatch):
    """A file the crafted commands would create, and every call of ``os.system``."""
    path = tmp_path / "pwned"
    calls: list = []

    def system(cmd):  # what os.system would do, recorded
        calls.append(cmd)
        path.write_text(str(cmd))
        return 0

    monkeypatch.setattr(os, "system", system)
    yield path, calls
    assert not path.exists(), f"the crafted message ran code: {path.read_text()}"
    assert calls == [], f"os.system was called with {calls}"


def _command(path) -> str:
    return f"touch {path}"


def _crafted(path) -> list[tuple[str, str]]:
    """(JSON text, what the error must name) for each crafted value."""
    cmd = {"__t": [_command(path)]}
    refs = [
        "os:system",
        "builtins:eval",
        "fedmodel.runtime.flower_party:os.system",
        "fedmodel.runtime.flower_codec:builtins.eval",
    ]
    names = [
        "os.system",
        "builtins.eval",
        "fedmodel.runtime.flower_party:os.system",
        "fedmodel.runtime.flower_codec:builtins.eval",
        "fedmodel.deploy:load_model_file",  # a fedmodel function, not registered
        "fedmodel.deploy.load_model_file",
        "proxal.client.__init__.__globals__",  # an attribute chain from a registered name
        "proxal.client:__init__",
        "ProxALClient",  # the class's own name is not its registered name
        "",
    ]
    out = [(json.dumps({"__ref": r}), r) for r in refs]
    out += [(json.dumps({"__factory": [n, cmd, {}]}), repr(n)) for n in names]
    out += [(json.dumps({"__dc": [n, {"command": _command(path)}]}), repr(n)) for n in names]
    out += [
        # a registered endpoint is not a dataclass; a dataclass is not an endpoint
        (json.dumps({"__dc": ["proxal.client", {}]}), "'proxal.client' is not an option"),
        (json.dumps({"__factory": ["dald.options", cmd, {}]}), "is an option dataclass"),
        # fields other than the declared ones (an attribute, a dunder)
        (json.dumps({"__dc": ["dald.options", {"__class__": "os.system"}]}), "'__class__'"),
        (json.dumps({"__dc": ["dald.options", {"eval": "x"}]}), "no field(s) ['eval']"),
        # the old exception form (module, attribute path, args)
        (json.dumps({"__exc": ["fedmodel.runtime.flower_party", "os.system", ["x"]]}), "__exc"),
        (json.dumps({"__eval": _command(path)}), "unknown entry '__eval'"),
        (json.dumps({"__a": "0"}), "array reference '0'"),
    ]
    return out


@pytest.fixture(autouse=True)
def _families():
    """Every family imported (registers its wire types), as ``fedmodel join`` does."""
    from fedmodel.algorithms.registry import all_methods

    all_methods()


def test_crafted_names_are_refused_by_the_decoder(sentinel):
    path, _ = sentinel
    for text, named in _crafted(path):
        with pytest.raises(CodecError) as err:
            decode(text, [])
        assert named in str(err.value), (text, str(err.value))
    # the one-line check of the issue
    with pytest.raises(CodecError, match="refusing '__ref'"):
        decode(json.dumps({"__ref": "fedmodel.runtime.flower_party:os.system"}), [])


def test_unregistered_names_say_what_is_registered():
    with pytest.raises(CodecError, match="not a registered wire type") as err:
        decode(json.dumps({"__factory": ["os.system", {"__t": []}, {}]}), [])
    assert "proxal.client" in str(err.value)  # the registered names are listed


def test_exceptions_come_from_a_fixed_table(sentinel):
    path, _ = sentinel
    for name in ("os.system", "fedmodel.runtime.flower_party:os.system", "SystemExit", "eval"):
        exc = decode(json.dumps({"__exc": [name, [_command(path)]]}), [])
        assert type(exc) is RuntimeError and str(exc) == f"{name}: {_command(path)}"
    assert type(decode(*encode(ValueError("bad step")))) is ValueError
    back = decode(*encode(ModelError("x", party="site1")))
    assert type(back) is ModelError and str(back) == "[site1] x"
    # a class outside the table travels as its nearest base in it, its name leading
    from fedmodel.compiler.atom_rules import NotSmoothError

    exc = NotSmoothError("abs", "abs(x)", "abs is not differentiable at 0")
    back = decode(*encode(exc))
    assert type(back) is UnsupportedError and str(back) == f"NotSmoothError: {exc}"
    back = decode(*encode(SystemExit(3)))
    assert type(back) is RuntimeError and str(back) == "SystemExit: 3"
    assert all(issubclass(c, BaseException) for c in WIRE_EXCEPTIONS.values())
    assert "SystemExit" not in WIRE_EXCEPTIONS and "BaseException" not in WIRE_EXCEPTIONS
    with pytest.raises(CodecError, match="list of strings"):
        make_exception("ValueError", [{"__ref": "os:system"}])


class _Payload:
    """Runs a shell command when unpickled (``posix.system``: the real one, not the
    fixture's recorder)."""

    def __init__(self, command: str):
        self.command = command

    def __reduce__(self):
        import posix

        return (posix.system, (self.command,))


def _npy_with_pickle(path) -> bytes:
    """An .npy file of an object array whose element runs ``touch path`` when unpickled."""
    import io

    a = np.empty(1, dtype=object)
    a[0] = _Payload(_command(path))
    buf = io.BytesIO()
    np.save(buf, a, allow_pickle=True)
    return buf.getvalue()


def test_arrays_are_numeric_and_never_unpickled(sentinel):
    path, _ = sentinel
    for bad in (np.array(["a"]), np.zeros(2, dtype=[("x", "f8")]), np.array([None], dtype=object)):
        with pytest.raises(CodecError, match="is not a numeric array"):
            decode(json.dumps({"__a": 0}), [bad])
    with pytest.raises(CodecError, match="array reference 3 out of range"):
        decode(json.dumps({"__a": 3}), [np.zeros(2)])
    with pytest.raises(CodecError, match="cannot cross a Flower link"):
        encode({"a": np.array([None], dtype=object)})


def test_crafted_flower_records_are_refused(sentinel):
    pytest.importorskip("flwr")
    from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

    from fedmodel.runtime.flower_codec import ARRAY_RECORD, CALL_RECORD, from_records

    path, _ = sentinel
    for text, named in _crafted(path):
        records = RecordDict(
            {CALL_RECORD: ConfigRecord({"json": text}), ARRAY_RECORD: ArrayRecord({})}
        )
        with pytest.raises(CodecError) as err:
            from_records(records)
        assert named in str(err.value)
    # an object array inside the ArrayRecord (a pickle in the .npy bytes)
    evil = Array(dtype="object", shape=(1,), stype="numpy.ndarray", data=_npy_with_pickle(path))
    records = RecordDict(
        {
            CALL_RECORD: ConfigRecord({"json": json.dumps({"__a": 0})}),
            ARRAY_RECORD: ArrayRecord({"0": evil}),
        }
    )
    with pytest.raises(CodecError, match="allow_pickle=False"):
        from_records(records)


# -- a real party server on a Unix socket ---------------------------------------------------------
def _captured_factories(monkeypatch, method: str, make, **options):
    """The factories ``method`` hands the runtime for ``make()``'s model (solved with
    ``options``), and the model."""
    from fedmodel.algorithms import driver

    class Captured(Exception):
        pass

    seen = {}

    def capture(backend, factories, **kw):
        seen["factories"] = factories
        raise Captured

    with monkeypatch.context() as m:
        m.setattr(driver, "make_runtime", capture)
        model = make()
        with pytest.raises(Captured):
            model.solve(method, **options)
    return seen["factories"], model


def _serve_until_stopped(server) -> None:
    while not server.stopped:
        server.serve_one()


@pytest.fixture
def party(tmp_path, monkeypatch):
    """A deployed party's server (``accept_local=False``) for 'site0' of a 3-site
    Neyman-Pearson model, serving on a Unix socket from a thread; and the stripped prox-al
    factories the coordinator sends."""
    pytest.importorskip("flwr")
    from problems import np_model

    from fedmodel.runtime.flower_party import PartyServer
    from fedmodel.runtime.flower_runtime import strip_programs

    factories, model = _captured_factories(monkeypatch, "prox-al", lambda: np_model(3))
    compiled = model.compile()
    program = next(c for c in compiled.clients if c.name == "site0")
    server = PartyServer(
        str(tmp_path / "site0.sock"), {"site0": program}, regularizer=compiled.regularizer
    )
    assert server.accept_local is False

    thread = threading.Thread(target=_serve_until_stopped, args=(server,), daemon=True)
    thread.start()
    yield server, strip_programs({"site0": factories["site0"]})
    server.stopped = True
    with socket.socket(socket.AF_UNIX) as s:  # wakes accept() (a handshake that fails)
        s.connect(server.socket_path)
    thread.join(10)
    assert not thread.is_alive()
    server.close()


def _build_text(path, target: str) -> str:
    factory = {"__factory": [target, {"__t": [_command(path)]}, {}]}
    return json.dumps({"__t": ["build", {"__t": [{"site0": factory}]}]})


def test_party_server_refuses_a_crafted_build_and_answers_the_next_call(party, sentinel):
    from fedmodel.runtime.flower_party import request

    server, honest = party
    path, _ = sentinel
    for target in ("fedmodel.runtime.flower_party:os.system", "builtins.eval", "os.system"):
        # the request tuple, as the serving loop hands it over
        status, text, arrays = server.handle(("call", _build_text(path, target), []))
        err = decode(text, arrays)
        assert status == "error" and isinstance(err, CodecError), (status, err)
        assert "not a registered wire type" in str(err) and repr(target) in str(err)
        # and over the socket
        status, text, arrays = request(server.socket_path, ("call", _build_text(path, target), []))
        assert status == "error" and "not a registered wire type" in str(decode(text, arrays))
    assert server.host.endpoints == {}
    # the honest build, then a call: the party is still up and builds its own program
    status, text, arrays = request(server.socket_path, ("call", *encode(("build", (honest,)))))
    assert status == "ok" and decode(text, arrays) == {"site0": None}
    status, text, arrays = request(server.socket_path, ("call", *encode(("names", ()))))
    assert status == "ok" and decode(text, arrays) == ["site0"]
    ep = server.host.endpoints["site0"]
    assert type(ep).__name__ == "ProxALClient" and ep.program is server.programs["site0"]


def test_deployed_party_refuses_pickles_and_malformed_frames(party, sentinel):
    from multiprocessing.connection import Client

    from fedmodel.runtime.flower_party import read_key, request
    from fedmodel.runtime.flower_relay_app import pack, unpack

    server, _ = party
    path, _ = sentinel

    # a local (pickled) request, as the simulation's runtime sends it: refused unread
    blob = pickle.dumps(_Payload(_command(path)))
    status, text, arrays = request(server.socket_path, ("local", blob))
    assert status == "error" and "codec calls only" in str(decode(text, arrays))
    npy = _npy_with_pickle(path)
    frames = [
        b"garbage",
        b"C" + b"\x00" * 3,
        b"C" + (10**6).to_bytes(8, "big") + b"{}",
        pack("call", json.dumps({"__a": 0}), [np.zeros(1)])[:-3],  # truncated
        pack("ok", json.dumps({"__a": 0}), [np.zeros(1)]),  # an answer, not a call
    ]
    # an .npy array holding a pickle, in a well-formed frame
    head = json.dumps({"status": "call", "json": json.dumps({"__a": 0}), "sizes": [len(npy)]})
    frames.append(b"C" + len(head).to_bytes(8, "big") + head.encode() + npy)
    key = read_key(server.socket_path)
    for frame in frames:
        with Client(server.socket_path, family="AF_UNIX", authkey=key) as conn:
            conn.send_bytes(frame)
            answer = conn.recv_bytes()
        status, text, arrays = unpack(answer)
        assert status == "error", frame[:40]
        assert isinstance(decode(text, arrays), CodecError)
    # a connection with the wrong key, or one that hangs up in the handshake
    from multiprocessing import AuthenticationError

    with pytest.raises(AuthenticationError):
        request(server.socket_path, ("call", *encode(("names", ()))), key=b"not the key")
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(server.socket_path)
    status, text, arrays = request(server.socket_path, ("call", *encode(("names", ()))))
    assert status == "ok" and decode(text, arrays) == []


def test_deployed_party_refuses_undeclared_messages_before_dispatch(party):
    """A ``run`` call is checked against the receiving half's declared table (prox-al's)
    after decoding and before any message is dispatched: an undeclared kind, an
    undeclared or missing field, or a party not served here refuses the whole call with an
    error naming the party, the kind and the field; the party answers the next call."""
    from fedmodel.runtime.flower_party import request
    from fedmodel.runtime.messages import SERVER, Message

    server, honest = party
    status, text, arrays = request(server.socket_path, ("call", *encode(("build", (honest,)))))
    assert status == "ok"
    ep = server.host.endpoints["site0"]
    # (the kinds of the inner solver site0 runs: np_model's default route, quasi-newton)
    fields = {"w": np.zeros(3)}  # declared names; refused before any shape check
    refused = [
        (Message("launch", SERVER, "site0", {}, 1), CodecError, ["'site0'", "'launch'"]),
        (
            Message("gradient_w", SERVER, "site0", {**fields, "evil": 1.0}, 1),
            CodecError,
            ["'site0'", "'gradient_w'", "undeclared field 'evil'"],
        ),
        (
            Message("curvature_w", SERVER, "site0", fields, 1),
            CodecError,
            ["'site0'", "'curvature_w'", "field 'directions'"],
        ),
        (Message("gradient_w", SERVER, "site9", fields, 1), PermissionError, ["'site9'"]),
    ]
    for bad, error, named in refused:
        call = ("run", ([bad], None))
        status, text, arrays = request(server.socket_path, ("call", *encode(call)))
        err = decode(text, arrays)
        assert status == "error" and isinstance(err, error), (bad, err)
        assert all(n in str(err) for n in named), (named, str(err))
        for method in ("peer", "activate"):
            status, text, arrays = server.handle(("call", *encode((method, (bad, None)))))
            assert status == "error" and isinstance(decode(text, arrays), error), method
    # nothing was dispatched
    assert ep.stats["seconds"] == 0.0 and ep.stats["local_solves"] == 0
    status, text, arrays = request(server.socket_path, ("call", *encode(("names", ()))))
    assert status == "ok" and decode(text, arrays) == ["site0"]


def test_the_relay_forward_path_refuses_a_crafted_build(party, sentinel, monkeypatch):
    """The ClientApp's handler (``relay``) with a crafted Flower Message, a real party
    server behind it: the party's answer is a refusal, and the party answers next."""
    from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
    from flwr.supercore.task_identity import TaskIdentity

    from fedmodel.runtime.flower_codec import (
        ARRAY_RECORD,
        CALL_RECORD,
        from_records,
        record_parts,
        to_records,
    )
    from fedmodel.runtime.flower_relay_app import FRAME_RECORD, pack, relay

    server, honest = party
    path, _ = sentinel
    for attr, value in (("_run_id", 1), ("_node_id", 1), ("_task_id", 1)):
        monkeypatch.setattr(TaskIdentity, attr, value)
    context = Context(
        run_id=1,
        node_id=1,
        node_config={"fedmodel-socket": server.socket_path},
        state=RecordDict(),
        run_config={},
    )

    def send(content):
        msg = Message(content=content, dst_node_id=1, message_type="query.fedmodel")
        reply = relay(msg, context)
        return record_parts(reply.content)[0], from_records(reply.content)

    for target in ("fedmodel.runtime.flower_party:os.system", "builtins.eval"):
        crafted = RecordDict(
            {
                CALL_RECORD: ConfigRecord({"json": _build_text(path, target)}),
                ARRAY_RECORD: ArrayRecord({}),
                # a route in the message cannot point a deployed relay elsewhere
                "fedmodel.route": ConfigRecord({"socket": "/nonexistent.sock"}),
            }
        )
        status, value = send(crafted)
        assert status == "error" and isinstance(value, CodecError)
        assert "not a registered wire type" in str(value)
        # the same call as one frame (how a coordinator's calls travel): the relay hands
        # it over unread, the party server refuses it
        frame = pack("call", _build_text(path, target), [])
        status, value = send(RecordDict({FRAME_RECORD: ConfigRecord({"frame": frame})}))
        assert status == "error" and isinstance(value, CodecError)
        assert "not a registered wire type" in str(value)
    status, value = send(to_records(("build", (honest,))))
    assert status == "ok" and value == {"site0": None}
    status, value = send(to_records(("names", ())))
    assert status == "ok" and value == ["site0"]


# -- honest builds round-trip ---------------------------------------------------------------------
def _same(a, b) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (
            type(a) is type(b)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and np.array_equal(a, b, equal_nan=a.dtype.kind in "fc")
        )
    if isinstance(a, EndpointFactory):
        return (
            isinstance(b, EndpointFactory)
            and a.target is b.target
            and _same(a.args, b.args)
            and _same(a.kwargs, b.kwargs)
        )
    if dataclasses.is_dataclass(a) and not isinstance(a, type):
        return type(a) is type(b) and all(
            _same(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a)
        )
    if isinstance(a, dict):
        return type(b) is dict and list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(_same, a, b))
    if isinstance(a, float) and np.isnan(a):
        return isinstance(b, float) and np.isnan(b)
    return type(a) is type(b) and a == b


def test_an_honest_build_of_every_registered_endpoint_round_trips(monkeypatch):
    from test_ledger import constrained_model, federated_methods, lsq_model

    import fedmodel as fm
    from fedmodel.runtime.flower_runtime import strip_programs

    def dataclass_types(value):
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            yield type(value)
            for f in dataclasses.fields(value):
                yield from dataclass_types(getattr(value, f.name))

    built = set()
    runs = [(method, {}) for method in federated_methods()]
    # the privacy options travel inside the clients' options when they are set
    runs.append(
        (
            "fedavg",
            {"dp": fm.DP(epsilon=8.0, delta=1e-5, clip=1.0), "weights": "uniform", "max_rounds": 2},
        )
    )
    runs.append(("fedavg", {"secure_aggregation": fm.SecureAggregation(), "max_rounds": 2}))
    for method, options in runs:
        for make in (constrained_model, lsq_model):
            try:
                factories, _ = _captured_factories(monkeypatch, method, make, **options)
                break
            except fm.UnsupportedError:
                continue
        stripped = strip_programs(factories)
        back = decode(*encode(stripped))
        assert list(back) == list(stripped), method
        for name, f in stripped.items():
            assert _same(f, back[name]), (method, name)
            assert LOCAL_PROGRAM in f.args, (method, name)
        for f in stripped.values():
            built.add(f.target)
            for a in f.args:
                built.update(dataclass_types(a))
    # every registered fedmodel wire type is one a deployment builds, and vice versa
    registered = {c for c in wire_types().values() if c.__module__.startswith("fedmodel.")}
    assert registered == built


def test_registered_dataclasses_are_built_field_by_field():
    from fedmodel.algorithms.dald.options import DALDOptions

    opts = DALDOptions(eps=1e-5, max_outer=7, on_failure="retry")
    back = decode(*encode({"o": opts}))["o"]
    assert type(back) is DALDOptions and _same(back, opts)
    text, arrays = encode(opts)
    fields = json.loads(text)["__dc"][1]
    assert "eps" in fields and fields["eps"] == 1e-5
    with pytest.raises(CodecError, match="'no_such_field'"):
        decode(json.dumps({"__dc": ["dald.options", {"no_such_field": 1}]}), [])


def test_the_registry_is_closed_and_explicit():
    @dataclasses.dataclass
    class Other:
        x: int = 0

    with pytest.raises(CodecError, match="only classes registered"):
        encode(Other())  # an unregistered dataclass cannot be sent
    try:
        register_wire_type("test.other", Other)
        assert _same(decode(*encode(Other(3))), Other(3))

        @dataclasses.dataclass
        class Another:
            y: int = 0

        with pytest.raises(ValueError, match="already"):
            register_wire_type("test.other", Another)
    finally:
        unregister_wire_type("test.other")
    with pytest.raises(CodecError, match="'test.other'"):
        decode(json.dumps({"__dc": ["test.other", {"x": 1}]}), [])
    with pytest.raises(ValueError, match="lower-case dotted"):
        register_wire_type("fedmodel.runtime.flower_party:os.system", Other)
    with pytest.raises(ValueError, match="must be a class"):
        register_wire_type("test.system", os.system)
