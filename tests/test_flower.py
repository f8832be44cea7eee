"""``backend="flower"`` (issue 15): the codec, and prox-al on Flower's simulation engine.

The simulation engine runs the same Flower Messages, ClientApp (a relay) and party
servers as a deployment, but starts them itself; the deployment itself (a SuperLink and
three SuperNodes on 127.0.0.1, ``fedmodel join`` / ``fedmodel serve``) is in
``tests/test_flower_deployment.py``.

What is required: the same iterates as ``backend="serial"`` (max difference <= 1e-10;
in practice the same rounds and bit-identical iterates, since every client runs the same
code on the same data and every float crosses the link exactly), the same ledger, nothing
of a client's data in what crosses the link, and a party that dies mid-solve being a
client failure with the last consistent point kept (checkpoint, resumed elsewhere).
"""

from __future__ import annotations

import numpy as np
import pytest
from problems import np_model

from fedmodel.algorithms.proxal.client import ProxALClient
from fedmodel.runtime.endpoints import EndpointFactory
from fedmodel.runtime.flower_codec import (
    LOCAL_PROGRAM,
    CodecError,
    decode,
    encode,
)
from fedmodel.runtime.messages import Message
from fedmodel.runtime.outcomes import StepOutcome

OPTS = dict(max_outer=4, history=False, random_state=0)


# -- the codec (no Flower needed) ----------------------------------------------------------------
def test_codec_round_trips_messages_outcomes_and_factories_exactly():
    rng = np.random.default_rng(0)
    w = rng.normal(size=7) * 10.0 ** rng.integers(-300, 300, size=7)
    payload = {
        "w": w,
        "tol": 1e-12,
        "nan": float("nan"),
        "inf": -np.inf,
        "k": np.int64(3),
        "M": rng.normal(size=(2, 3)),
        "empty": np.zeros((0, 4)),
        "flag": True,
    }
    msg = Message("admm_w", "server", "site0", payload, 12, "algorithm")
    out = StepOutcome("site0", reply=msg, error=ValueError("bad step"), kind="raised", sent=[msg])
    value = {
        "outcomes": [out],
        "t": (1, "a", None),
        "keys": {3: "x"},
        "factory": EndpointFactory(ProxALClient, (LOCAL_PROGRAM, 1.0)),
    }
    text, arrays = encode(value)
    assert "site0" in text and all(isinstance(a, np.ndarray) for a in arrays)
    back = decode(text, arrays)
    got = back["outcomes"][0]
    assert isinstance(got, StepOutcome) and got.kind == "raised"
    assert isinstance(got.error, ValueError) and str(got.error) == "bad step"
    p = got.reply.payload
    assert p["w"].dtype == np.float64 and p["w"].tobytes() == w.tobytes()  # bit for bit
    assert p["M"].shape == (2, 3) and p["empty"].shape == (0, 4)
    assert np.isnan(p["nan"]) and p["inf"] == -np.inf and p["tol"] == 1e-12
    assert isinstance(p["k"], np.int64) and p["flag"] is True
    assert got.reply == msg.__class__(**{**msg.__dict__, "payload": p})
    assert back["t"] == (1, "a", None) and back["keys"] == {3: "x"}
    assert back["factory"].target is ProxALClient and back["factory"].args[0] is LOCAL_PROGRAM


def test_codec_refuses_code_from_outside_fedmodel():
    import os

    with pytest.raises(CodecError, match="only classes registered"):
        encode({"f": os.system})
    with pytest.raises(CodecError, match="no function or class is decoded"):
        decode('{"__ref": "os:system"}', [])
    with pytest.raises(CodecError, match="cannot cross a Flower link"):
        encode({"obj": object()})


def test_codec_through_flower_records():
    pytest.importorskip("flwr")
    from fedmodel.runtime.flower_codec import from_records, to_records

    w = np.linspace(0, 1, 5) / 3
    back = from_records(to_records(("run", ([Message("w", "server", "a", {"w": w})], None))))
    assert back[0] == "run" and back[1][0][0].payload["w"].tobytes() == w.tobytes()


def test_a_call_travels_as_one_frame_unless_it_is_large():
    """A call is one frame in one ConfigRecord (three Flower objects per message); above
    FRAME_MAX bytes its arrays go in an ArrayRecord (Flower chunks them); both decode."""
    pytest.importorskip("flwr")
    from fedmodel.runtime.flower_codec import from_records, to_records
    from fedmodel.runtime.flower_relay_app import ARRAY_RECORD, FRAME_MAX, FRAME_RECORD

    small = np.linspace(0, 1, 5) / 3
    big = np.arange(FRAME_MAX // 8 + 1, dtype=float) / 7
    for w, form in ((small, FRAME_RECORD), (big, ARRAY_RECORD)):
        records = to_records(("run", ([Message("w", "server", "a", {"w": w})], None)))
        assert form in records.config_records or form in records.array_records
        back = from_records(records)
        assert back[1][0][0].payload["w"].tobytes() == w.tobytes()


def test_flower_options_are_checked():
    from fedmodel.errors import ModelError

    with pytest.raises(ModelError, match="flower_grid is used by backend='flower' only"):
        np_model(2).solve("prox-al", flower_grid=object())


# -- Flower's simulation engine ------------------------------------------------------------------
@pytest.fixture(scope="module")
def serial():
    return np_model(3).solve("prox-al", **OPTS)


@pytest.fixture
def wire(monkeypatch):
    """Everything the server decoded from what crossed the Flower link (the parties'
    answers)."""
    from fedmodel.runtime import flower_runtime

    seen = []
    original = flower_runtime.from_records

    def spy(records):
        value = original(records)
        seen.append(value)
        return value

    monkeypatch.setattr(flower_runtime, "from_records", spy)
    return seen


def test_simulation_gives_the_serial_iterates_and_ledger(serial, wire):
    pytest.importorskip("flwr")
    pytest.importorskip("ray")
    from test_ledger import _arrays

    model = np_model(3)
    res = model.solve("prox-al", backend="flower", **OPTS)
    assert res.extra["backend"] == "flower"
    assert res.rounds == serial.rounds
    assert np.max(np.abs(res.x - serial.x)) <= 1e-10 * max(1.0, np.max(np.abs(serial.x)))
    strip = [{k: v for k, v in r.items() if k != "seconds"} for r in res.ledger]
    assert strip == [{k: v for k, v in r.items() if k != "seconds"} for r in serial.ledger]
    # three different Flower nodes, one per client
    assert len(set(res.extra["placement"].values())) == 3
    # nothing of a client's data in what crossed the link
    compiled = model.compile()
    data = {c.name: [np.asarray(d.value, dtype=float) for d in c.data] for c in compiled.clients}
    rows = {r.tobytes() for arrs in data.values() for a in arrs for r in np.atleast_2d(a)}
    samples = {a.shape[0] for arrs in data.values() for a in arrs}
    assert wire, "nothing crossed the link"
    crossed = 0
    for value in wire:
        for v in _arrays(value if isinstance(value, (list, dict, tuple)) else [value]):
            if isinstance(v, StepOutcome) and v.reply is not None:
                for a in _arrays(v.reply.payload):
                    arr = np.asarray(a, dtype=float)
                    crossed += 1
                    assert not samples & set(arr.shape)
                    assert np.ascontiguousarray(arr).tobytes() not in rows
    assert crossed > 0
    # and the answer is the centralized optimum's (within what 4 outer iterations reach)
    ref = model.solve("centralized")
    assert abs(res.objective - ref.objective) <= 1e-2 * max(1.0, abs(ref.objective))


@pytest.mark.timing
def test_simulation_party_death_is_a_client_failure_and_resumes(serial, tmp_path):
    pytest.importorskip("flwr")
    pytest.importorskip("ray")
    from fedmodel.algorithms.proxal.options import ProxALOptions
    from fedmodel.algorithms.proxal.server import run_prox_al
    from fedmodel.runtime.faults import Fault

    ck = str(tmp_path / "ck")
    opts = ProxALOptions(backend="flower", checkpoint=ck, client_timeout=60, **OPTS)
    # the round of the third outer iteration's first inner step (from a serial run)
    history = np_model(3).solve("prox-al", **dict(OPTS, history=True)).history
    fail_at = history[1]["rounds"] + 1
    res = run_prox_al(np_model(3).compile(), opts, faults={"site1": Fault("exit", round=fail_at)})
    assert res.status == "client_failure", res.message
    assert res.failure["client"] == "site1" and res.failure["kind"] == "dead"
    assert "site1" in res.message and ck in res.message
    assert res.rounds["outer"] >= 1
    # the periodic checkpoint of the last completed outer iteration resumes elsewhere
    again = np_model(3).solve("prox-al", resume=ck, **OPTS)
    assert again.rounds == serial.rounds
    assert np.max(np.abs(again.x - serial.x)) <= 1e-10 * max(1.0, np.max(np.abs(serial.x)))


def test_a_node_waiting_behind_a_failed_relay_is_lost_not_blamed(monkeypatch):
    """The order of events a loaded machine showed, replayed deterministically: site1's
    party server is killed in its step, its relay's error reply is pulled before the
    runtime sees the process gone, and the other nodes have not answered by the deadline
    (the simulation's ClientApp actor relays them after it). site1 alone failed; site0 and
    site2 waited behind it: lost, not blamed."""
    import collections
    from types import SimpleNamespace

    from fedmodel.runtime import flower_runtime
    from fedmodel.runtime.base import Runtime
    from fedmodel.runtime.flower_runtime import FlowerRuntime
    from fedmodel.runtime.messages import Message

    node_of = {"site0": 10, "site1": 11, "site2": 12}

    class Grid:  # site1's relay failed; the other nodes never answer
        def push_messages(self, msgs):
            self.node = {f"m{i}": m.metadata.dst_node_id for i, m in enumerate(msgs)}
            return list(self.node)

        def pull_messages(self, ids):
            error = SimpleNamespace(reason="ClientAppException: EOFError", code=3)
            return [
                SimpleNamespace(
                    metadata=SimpleNamespace(reply_to_message_id=i),
                    has_error=lambda: True,
                    error=error,
                )
                for i in ids
                if self.node[i] == node_of["site1"]
            ]

    monkeypatch.setattr(flower_runtime, "GRACE_SECONDS", 0.0)
    rt = FlowerRuntime.__new__(FlowerRuntime)
    Runtime.__init__(rt, client_timeout=0.01)
    rt.grid, rt._route, rt._host_of = Grid(), {}, dict(node_of)
    # (the call as Flower would carry it: only its destination matters here)
    rt._message = lambda node, method, args: SimpleNamespace(
        metadata=SimpleNamespace(dst_node_id=node)
    )
    rt._durations = collections.deque(maxlen=flower_runtime.POLL_HISTORY)
    rt._stop_file = rt._deadline = rt._progress = None
    rt._sim = SimpleNamespace(procs={})  # (no party server seen exited)
    rt.client_seconds = dict.fromkeys(node_of, 0.0)
    msgs = [Message("w", "server", n, {}, 3, "algorithm") for n in node_of]
    outcomes = rt._run_messages(msgs)
    assert outcomes["site1"].kind == "dead"
    assert outcomes["site0"].kind == "lost" and outcomes["site2"].kind == "lost"
    assert "'site1''s step" in str(outcomes["site0"].error)
    # the simulation's relay takes the nodes in turn: the wait covers every node's steps
    calls, steps = dict.fromkeys(node_of.values()), dict.fromkeys(node_of.values(), 2)
    assert rt._steps_in_turn(calls, steps) == 6
    rt._sim = None  # deployed nodes compute in parallel
    assert rt._steps_in_turn(calls, steps) == 2


def test_simulation_ctrl_c_returns_interrupted_with_a_checkpoint(serial, tmp_path):
    pytest.importorskip("flwr")
    pytest.importorskip("ray")

    def ctrl_c(row):
        if row["iteration"] == 1:
            raise KeyboardInterrupt  # what Ctrl-C raises in the solving thread

    ck = str(tmp_path / "ck")
    res = np_model(3).solve("prox-al", backend="flower", checkpoint=ck, callback=ctrl_c, **OPTS)
    assert res.status == "interrupted", res.message
    assert res.rounds["outer"] == 1 and res.checkpoint == ck
    again = np_model(3).solve("prox-al", resume=ck, **OPTS)
    assert np.max(np.abs(again.x - serial.x)) <= 1e-10 * max(1.0, np.max(np.abs(serial.x)))


@pytest.mark.slow
def test_simulation_refuses_an_undeclared_reply_field_naming_kind_and_field():
    """What a party answers over the Flower link is decoded, then checked against the
    method's declared table before the server uses it (the same table the party checks
    requests with): an undeclared field is a failure of that party naming kind and field.
    (slow: the default suite checks the table on every backend in test_reply_validation.py
    and a party's invalid reply over a deployed Flower link in
    test_a_party_answering_a_string_for_its_step_is_an_invalid_reply)"""
    pytest.importorskip("flwr")
    pytest.importorskip("ray")
    from fedmodel.algorithms.proxal.options import ProxALOptions
    from fedmodel.algorithms.proxal.server import run_prox_al
    from fedmodel.runtime.faults import Fault

    fault = Fault("corrupt", round=2, kinds=("curvature_w",), target="leak", corruption="extra")
    opts = ProxALOptions(backend="flower", client_timeout=60, **OPTS)
    res = run_prox_al(np_model(3).compile(), opts, faults={"site1": fault})
    assert res.status == "client_failure", res.message
    assert res.failure["client"] == "site1" and res.failure["kind"] == "invalid_reply"
    assert res.failure["message_kind"] == "curvature_w"
    err = res.failure["error"]
    assert "'site1'" in err and "'curvature_w'" in err and "unknown field 'leak'" in err, err


def test_the_package_works_without_flower():
    """flwr is an optional extra: importing fedmodel (and its CLI, deploy and flower_app
    modules) works without it, and backend="flower" then says what to install."""
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['flwr'] = None\n"  # makes `import flwr` fail
        "import fedmodel, fedmodel.cli, fedmodel.deploy, fedmodel.flower_app\n"
        "assert fedmodel.flower_app.app is None\n"
        "from problems import np_model\n"
        "try:\n"
        "    np_model(2).solve('prox-al', backend='flower')\n"
        "except fedmodel.ModelError as exc:\n"
        "    print('ERR', exc)\n"
    )
    import os

    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(here), here]))
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "pip install 'fedmodel[flower]'" in out.stdout


def test_every_federated_method_can_be_built_over_a_flower_link(monkeypatch):
    """What a deployed party receives to build its client half (``build``: the factory,
    its own program left out) crosses the link without pickle, for every method."""
    from test_ledger import federated_methods, solve_any

    from fedmodel.algorithms import driver
    from fedmodel.runtime.flower_codec import decode
    from fedmodel.runtime.flower_runtime import strip_programs

    class Captured(Exception):
        pass

    seen = {}

    def capture(backend, factories, **kw):
        seen["factories"] = factories
        raise Captured

    monkeypatch.setattr(driver, "make_runtime", capture)
    for method in federated_methods():
        seen.clear()
        with pytest.raises(Captured):
            solve_any(method)
        stripped = strip_programs(seen["factories"])
        text, arrays = encode(stripped)
        back = decode(text, arrays)
        for name, f in back.items():
            assert f.target is seen["factories"][name].target, method
            assert LOCAL_PROGRAM in f.args or LOCAL_PROGRAM in f.kwargs.values(), method


def _federated_methods():
    from test_ledger import federated_methods

    return federated_methods()


@pytest.mark.slow
@pytest.mark.parametrize("method", _federated_methods())
def test_every_federated_method_on_the_simulation_engine(method):
    """Every method run by the driver (peer-to-peer ones included) gives the serial
    iterates behind Flower (about 30 s each: Flower's simulation engine starts Ray)."""
    pytest.importorskip("flwr")
    pytest.importorskip("ray")
    from test_ledger import constrained_model, lsq_model

    import fedmodel as fm

    # dgd, dagd: 1000 rounds of 16 peer messages (dagd: 4 jobs), each a Flower round trip of
    # ~0.1 s: a few
    opts = {"max_rounds": 20} if method in ("dgd", "dagd") else {}
    for make in (constrained_model, lsq_model):
        try:
            ref = make().solve(method, **opts)
            break
        except fm.UnsupportedError:
            continue
    res = make().solve(method, backend="flower", **opts)
    assert res.rounds == ref.rounds and res.status == ref.status
    assert np.max(np.abs(res.x - ref.x)) <= 1e-10 * max(1.0, np.max(np.abs(ref.x)))


class _AnsweringGrid:
    """A Grid whose nodes answer at once (each a :class:`PartyServer` in this process,
    called with the frame Flower would deliver): the runtime's first pull of a round
    always brings every reply, as on a deployment whose replies are in by then."""

    def __init__(self, servers, answer=None):
        self.servers = servers  # node id -> PartyServer
        self.replies: dict[str, object] = {}
        # (node, call frame) -> the frame it answers instead of its party server's, or None
        self.answer = answer or (lambda node, frame: None)

    def push_messages(self, messages):
        from types import SimpleNamespace

        from flwr.app import ConfigRecord, RecordDict

        from fedmodel.runtime.flower_relay_app import FRAME_RECORD

        ids = []
        for msg in messages:
            frame = bytes(msg.content.config_records[FRAME_RECORD]["frame"])
            node = msg.metadata.dst_node_id
            answer = self.answer(node, frame) or self.servers[node].handle_frame(frame)
            mid = f"m{len(self.replies)}"
            self.replies[mid] = SimpleNamespace(
                metadata=SimpleNamespace(reply_to_message_id=mid),
                content=RecordDict({FRAME_RECORD: ConfigRecord({"frame": answer})}),
                has_error=lambda: False,
            )
            ids.append(mid)
        return ids

    def pull_messages(self, ids):
        return [self.replies.pop(i) for i in ids if i in self.replies]


def _party_servers(model, tmp_path):
    """A deployed party server per client of ``model`` (its own program), on nodes 100, 101
    ...; returns them and what the coordinator's discovery would have found."""
    from fedmodel.runtime.flower_party import PartyServer

    compiled = model.compile()
    servers = {
        100 + i: PartyServer(
            str(tmp_path / f"party{i}.sock"),
            programs={c.name: c},
            regularizer=compiled.regularizer,
            checkpoint_dir=str(tmp_path / f"ck{i}"),
        )
        for i, c in enumerate(compiled.clients)
    }
    return servers, {c.name: (100 + i, {}) for i, c in enumerate(compiled.clients)}


@pytest.fixture
def server_app_identity(monkeypatch):
    """What Flower sets in a ServerApp's process (a Message needs it)."""
    pytest.importorskip("flwr")
    from flwr.supercore.task_identity import TaskIdentity

    for field, value in (("_run_id", 1), ("_node_id", 0), ("_task_id", 1)):
        monkeypatch.setattr(TaskIdentity, field, value)


def test_a_party_answering_a_string_for_its_step_is_an_invalid_reply(tmp_path, server_app_identity):
    """A deployed party (another organisation's code) that answers the coordinator's
    ``run`` call with a string instead of its step's outcome: status ``client_failure``
    of kind ``invalid_reply`` naming it, the last consistent point returned (never an
    ``AttributeError`` out of the runtime)."""
    from fedmodel.runtime.flower_codec import decode, encode
    from fedmodel.runtime.flower_relay_app import pack, unpack
    from fedmodel.runtime.flower_runtime import JoinedGrid

    model = np_model(3)
    servers, found = _party_servers(model, tmp_path)
    site1 = found["site1"][0]

    def answer(node, frame):
        method, args = decode(*unpack(frame)[1:])
        if node == site1 and method == "run" and args[0][0].round >= 5:
            return pack("ok", *encode("a string instead of the outcome"))
        return None

    grid = JoinedGrid(_AnsweringGrid(servers, answer), found)
    try:
        res = model.solve("prox-al", backend="flower", flower_grid=grid, **OPTS)
    finally:
        for s in servers.values():
            s.close()
    assert res.status == "client_failure", res.message
    assert res.failure["client"] == "site1" and res.failure["kind"] == "invalid_reply"
    assert (
        "client 'site1', reply to 'curvature_w': its host answered a str, not the outcome "
        "of the step"
    ) in res.failure["error"], res.failure
    assert np.all(np.isfinite(res.x))


def test_serve_ctrl_c_stops_a_run_whose_replies_are_in_at_the_first_pull(
    tmp_path, monkeypatch, server_app_identity
):
    """``fedmodel serve``'s Ctrl-C (its stop file, seen by the ServerApp's runtime) stops
    the solve before the next exchange even when every round's replies are in at the
    runtime's first pull (it once looked for the stop file only while still waiting, so
    such a run went on to the end, status ``optimal``: the coordinator's Ctrl-C test)."""
    from fedmodel.runtime import flower_runtime
    from fedmodel.runtime.flower_runtime import JoinedGrid

    # the first pull of a round right after the push (as when the predicted time of the
    # replies has passed by then): it brings every reply
    monkeypatch.setattr(flower_runtime, "POLL_LEAD", 0.0)

    model = np_model(3)
    servers, found = _party_servers(model, tmp_path)
    stop_file = tmp_path / "result.json.stop"
    rounds = []

    def progress(row):  # Ctrl-C on serve once it has printed round 6
        rounds.append(row["round"])
        if row["round"] == 6:
            stop_file.touch()

    grid = JoinedGrid(_AnsweringGrid(servers), found, stop_file=str(stop_file), progress=progress)
    opts = dict(OPTS, max_outer=30)
    try:
        res = model.solve("prox-al", backend="flower", flower_grid=grid, **opts)
    finally:
        for s in servers.values():
            s.close()
    full = np_model(3).solve("prox-al", **opts)
    assert full.rounds["communication"] > 12  # the run goes on well past round 6
    assert res.status == "interrupted", res.message
    assert not stop_file.exists()  # seen (and removed) by the runtime
    # no algorithm round was sent after the one during which the stop was asked for
    # no algorithm round was sent after the one during which the stop was asked for (the
    # evaluation and the reports of the returned point follow on the diagnostic channel)
    sent = [r["round"] for r in res.ledger if r["channel"] == "algorithm"]
    assert max(sent) == 6, sent
    assert {r["channel"] for r in res.ledger if r["round"] > 6} == {"diagnostic"}


def test_a_party_answering_a_string_for_its_checkpoint_costs_the_checkpoint_only(
    tmp_path, server_app_identity
):
    """A party that answers the coordinator's ``write_checkpoint`` with a string (not the
    file it wrote): that checkpoint is not written, the message says why naming the party,
    and the solve goes on to the same answer."""
    from fedmodel.runtime.flower_codec import decode, encode
    from fedmodel.runtime.flower_relay_app import pack, unpack
    from fedmodel.runtime.flower_runtime import JoinedGrid

    model = np_model(3)
    servers, found = _party_servers(model, tmp_path)
    site1 = found["site1"][0]

    def answer(node, frame):
        if node == site1 and decode(*unpack(frame)[1:])[0] == "write_checkpoint":
            return pack("ok", *encode("a string instead of the file it wrote"))
        return None

    grid = JoinedGrid(_AnsweringGrid(servers, answer), found)
    ck = str(tmp_path / "ck")
    try:
        res = model.solve("prox-al", backend="flower", flower_grid=grid, checkpoint=ck, **OPTS)
    finally:
        for s in servers.values():
            s.close()
    ref = np_model(3).solve("prox-al", **OPTS)
    assert res.status == ref.status and res.rounds == ref.rounds
    assert np.max(np.abs(res.x - ref.x)) <= 1e-10 * max(1.0, np.max(np.abs(ref.x)))
    assert "checkpoint could not be written" in res.message, res.message
    assert "party 'site1' did not answer the file it wrote (its host answered str)" in (res.message)


def test_serve_takes_sigterm_as_ctrl_c_and_restores_the_previous_handler():
    import os
    import signal
    import time

    from fedmodel.flower_app import _term_as_ctrl_c

    before = signal.getsignal(signal.SIGTERM)
    previous = _term_as_ctrl_c()
    try:
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(100):  # the handler runs between bytecodes of the main thread
                time.sleep(0.01)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert signal.getsignal(signal.SIGTERM) == before
