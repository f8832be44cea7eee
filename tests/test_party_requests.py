"""A party decides what it reveals, and checks every request by value (docs/security.md).

Each attack is replayed through the relay ClientApp's forward path (``relay``, a crafted
Flower Message) to a party server built as ``fedmodel join`` builds it
(:func:`fedmodel.flower_app.party_server`: its own data, its own compiled program, its
own checkpoint directory, its own opt-ins), serving on a Unix socket from a thread. Each
is refused with an error naming what was refused, nothing is revealed (no Hessian leaves
the party), nothing runs (the client half's statistics do not move), nothing is written
outside the party's own directory, and the party answers the next honest call. The size
caps are checked by construction (the bytes the party reads, the texts JSON parses),
never by timing.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import socket
import struct
import tempfile
import threading
from multiprocessing import connection

import numpy as np
import pytest
from problems import DEPLOYMENT_MODEL, np_model, np_sites
from test_security_codec import _captured_factories, _serve_until_stopped

pytest.importorskip("flwr")

from fedmodel.runtime import flower_party, flower_relay_app  # noqa: E402
from fedmodel.runtime.flower_codec import decode, encode, record_parts, to_records  # noqa: E402
from fedmodel.runtime.messages import SERVER, Message  # noqa: E402
from fedmodel.runtime.outcomes import RequestRefused, StepOutcome  # noqa: E402
from fedmodel.runtime.wire import CodecError  # noqa: E402

PARTIES = ["site0", "site1", "site2"]


# -- a party as `fedmodel join` starts it, reached through the relay -------------------------
class Party:
    """``site0``'s party server (``fedmodel join``'s :func:`party_server`) on a socket,
    and :meth:`send`: a call through the relay ClientApp's forward path."""

    def __init__(self, base, reveal=(), monkeypatch=None):
        from flwr.app import Context, RecordDict
        from flwr.supercore.task_identity import TaskIdentity

        from fedmodel.deploy import coordinator_model, load_model_file, shapes_of
        from fedmodel.flower_app import party_server
        from fedmodel.runtime.flower_runtime import strip_programs

        for attr in ("_run_id", "_node_id", "_task_id"):  # (a ServerApp's run sets these)
            monkeypatch.setattr(TaskIdentity, attr, 1)
        (base / "model.py").write_text(DEPLOYMENT_MODEL)
        model_file = load_model_file(base / "model.py")
        X0, X1 = np_sites(3)[0]
        self.data = {"X0": X0, "X1": X1}
        self.own = base / "own"  # the party's own checkpoint directory
        self.sockets = tempfile.mkdtemp(prefix="fm-")  # (a socket's path must be short)
        self.server = party_server(
            model_file,
            "site0",
            self.data,
            os.path.join(self.sockets, "site0.sock"),
            checkpoint_dir=str(self.own),
            reveal=reveal,
        )
        self.d = X0.shape[1]
        shapes = {p: shapes_of(self.data) for p in PARTIES}

        def factories(**options):
            made, _ = _captured_factories(
                monkeypatch, "prox-al", lambda: coordinator_model(model_file, shapes)
            )
            f = made["site0"]
            if options:
                opts = dataclasses.replace(f.args[1], **options)
                f = dataclasses.replace(f, args=(f.args[0], opts, *f.args[2:]))
            return strip_programs({"site0": f})

        self.factories = factories
        self.context = Context(
            run_id=1,
            node_id=1,
            node_config={"fedmodel-socket": self.server.socket_path},
            state=RecordDict(),
            run_config={},
        )
        self.thread = threading.Thread(
            target=_serve_until_stopped, args=(self.server,), daemon=True
        )
        self.thread.start()

    def send(self, content):
        """The relay's answer to a Flower message of ``content``: (status, value)."""
        from flwr.app import Message as FlowerMessage

        from fedmodel.runtime.flower_codec import from_records

        msg = FlowerMessage(content=content, dst_node_id=1, message_type="query.fedmodel")
        reply = flower_relay_app.relay(msg, self.context)
        return record_parts(reply.content)[0], from_records(reply.content)

    def call(self, method, *args):
        return self.send(to_records((method, args)))

    def frame(self, frame: bytes):
        """A raw call frame, as a coordinator's call travels (one bytes record)."""
        from flwr.app import ConfigRecord, RecordDict

        content = RecordDict({flower_relay_app.FRAME_RECORD: ConfigRecord({"frame": frame})})
        return self.send(content)

    def build(self, **options):
        return self.call("build", self.factories(**options))

    @property
    def endpoint(self):
        return self.server.host.endpoints.get("site0")

    def close(self):
        self.server.stopped = True
        with socket.socket(socket.AF_UNIX) as s:  # wakes accept()
            s.connect(self.server.socket_path)
        self.thread.join(10)
        self.server.close()
        shutil.rmtree(self.sockets, ignore_errors=True)


@pytest.fixture
def party(tmp_path, monkeypatch):
    p = Party(tmp_path, monkeypatch=monkeypatch)
    yield p
    p.close()


def _msg(kind, payload, rnd=1, sender=SERVER, channel="algorithm"):
    return Message(kind, sender, "site0", payload, rnd, channel)


def _untouched(ep):
    return ep.stats["seconds"] == 0.0 and ep.stats.get("derivative_evaluations", 0) == 0


# -- 1. the party decides its opt-ins -----------------------------------------------------------
def test_a_default_party_refuses_its_hessian_whatever_the_coordinator_asks(party):
    status, built = party.build()
    assert status == "ok" and built == {"site0": None}
    w = np.zeros(party.d)
    # the Newton route's own kind is not in the table of the route this party runs
    status, err = party.call("run", [_msg("newton_w", {"w": w})], None)
    assert status == "error" and isinstance(err, CodecError), err
    assert "party 'site0' refuses message 'newton_w'" in str(err) and "not declared" in str(err)
    # a switch to the Newton route (a fallback's inner field) needs the opt-in
    for m in [_msg("start", {"w": w, "inner": "newton"})]:
        status, outcomes = party.call("run", [m], None)
        assert status == "ok" and len(outcomes) == 1, outcomes
        out = outcomes[0]
        assert isinstance(out, StepOutcome) and out.kind == "refused" and out.reply is None
        assert isinstance(out.error, RequestRefused)
        assert "party 'site0'" in str(out.error) and "opt-in 'hessian'" in str(out.error)
        assert "--reveal hessian" in str(out.error) and out.detail == ""
    assert _untouched(party.endpoint)  # no handler ran: nothing computed, nothing sent
    # the O(d) default is answered
    status, outcomes = party.call("run", [_msg("start", {"w": w, "inner": "quasi-newton"}, 3)])
    assert status == "ok" and outcomes[0].ok
    assert set(outcomes[0].reply.payload) >= {"value", "grad"}
    assert "hessian" not in outcomes[0].reply.payload


@pytest.mark.parametrize(
    "argument, value",
    # the coordinator's factory asks the Newton route, or (penalty_metric='hessian') the
    # Hessian metric
    [("route", "newton"), ("metric", "hessian")],
)
def test_a_build_asking_the_hessian_is_refused_without_the_opt_in(party, argument, value):
    f = party.factories()["site0"]
    f = dataclasses.replace(f, kwargs={**f.kwargs, argument: value})
    status, built = party.call("build", {"site0": f})
    exc, tb = built["site0"]
    assert status == "ok" and isinstance(exc, RequestRefused) and tb == ""
    assert f"its argument {argument!r} = {value!r}" in str(exc) and "opt-in 'hessian'" in str(exc)
    assert party.endpoint is None


def test_a_party_that_enabled_the_hessian_answers_with_it(tmp_path, monkeypatch):
    p = Party(tmp_path, reveal=("hessian",), monkeypatch=monkeypatch)
    try:
        f = p.factories()["site0"]
        f = dataclasses.replace(f, kwargs={**f.kwargs, "metric": "hessian"})
        assert p.call("build", {"site0": f}) == ("ok", {"site0": None})
        status, outcomes = p.call("run", [_msg("start", {"w": np.zeros(p.d), "inner": "newton"})])
        assert status == "ok" and outcomes[0].ok
        assert outcomes[0].reply.payload["hessian"].shape == (p.d, p.d)
    finally:
        p.close()


def test_a_build_check_that_passed_stands_for_the_same_values_and_opt_ins_only():
    # a check of plain arguments is made once per table: another party's build with the
    # same values and opt-ins passes without it, any other value or opt-in is checked again
    from fedmodel.algorithms.proxal.client import ProxALClient
    from fedmodel.algorithms.proxal.options import ProxALOptions
    from fedmodel.errors import ModelError

    programs = np_model(3).compile().clients
    opts = ProxALOptions()

    def check(k, rho=1.0, reveal=None, **kwargs):
        ProxALClient.check_build((programs[k], opts, rho, 3), kwargs, reveal)

    for k in range(3):
        check(k, route="admm")
    with pytest.raises(ModelError, match="party 'site1' refuses its build: argument 'rho'"):
        check(1, rho=-1.0, route="admm")
    with pytest.raises(ModelError, match="argument 'n_clients'"):
        ProxALClient.check_build((programs[2], opts, 1.0, 0), {"route": "admm"}, None)
    check(0, metric="hessian", reveal=frozenset({"hessian"}))
    check(1, metric="hessian", reveal=frozenset({"hessian"}))
    with pytest.raises(RequestRefused, match="party 'site2' refuses its build.*'hessian'"):
        check(2, metric="hessian", reveal=frozenset())
    with pytest.raises(ModelError, match="argument 'theta0'"):  # (an array: by value)
        check(0, theta0=np.zeros(5))
    # every argument by position, or the program by keyword: the same check, per party
    every = (opts, 1.0, 3, True, None, "scalar", "admm")
    ProxALClient.check_build((programs[0], *every), {}, None)
    ProxALClient.check_build((programs[1], *every), {}, None)
    with pytest.raises(ModelError, match="party 'site2' refuses its build: argument 'rho'"):
        ProxALClient.check_build((programs[2], opts, -2.0, *every[2:]), {}, None)
    named = {"options": opts, "rho": 1.0, "n_clients": 3, "route": "admm"}
    ProxALClient.check_build((), {"program": programs[2], **named}, None)
    with pytest.raises(ModelError, match="party 'site0' refuses its build: argument 'rho'"):
        ProxALClient.check_build((), {"program": programs[0], **named, "rho": -3.0}, None)
    with pytest.raises(ModelError, match="built without the party's own program"):
        ProxALClient.check_build((None, opts, 1.0, 3), {"route": "admm"}, None)


def test_join_refuses_an_unknown_opt_in(tmp_path, monkeypatch):
    from fedmodel.flower_app import DeploymentError

    with pytest.raises(DeploymentError, match=r"--reveal gradients: unknown opt-in.*'hessian'"):
        Party(tmp_path, reveal=("gradients",), monkeypatch=monkeypatch)


def test_in_one_process_the_reveal_option_decides_per_party():
    model = np_model(3)
    opts = dict(inner_solver="newton", max_outer=2, random_state=0)
    assert model.solve("prox-al", **opts).status != "client_failure"  # default: as asked
    # the Newton route is refused where site1 is built, before any message
    with pytest.raises(RequestRefused, match="party 'site1' refuses its build.*'hessian'"):
        model.solve("prox-al", reveal={"site0": ["hessian"], "site2": ["hessian"]}, **opts)
    res = model.solve(
        "prox-al", reveal={n: ["hessian"] for n in ("site0", "site1", "site2")}, **opts
    )
    assert res.status != "client_failure"
    # the Hessian metric is refused at the build, naming the party and the opt-in
    with pytest.raises(RequestRefused, match="party 'site0' refuses its build.*'hessian'"):
        model.solve("prox-al", penalty_metric="hessian", inner_solver="admm", reveal=[])
    from fedmodel.errors import ModelError

    with pytest.raises(ModelError, match=r"unknown opt-in\(s\) \['gradient'\]"):
        model.solve("prox-al", reveal=["gradient"])
    with pytest.raises(ModelError, match=r"reveal names unknown clients \['site9'\]"):
        model.solve("prox-al", reveal={"site9": []})


# -- 2. requests by value -------------------------------------------------------------------------
@pytest.mark.parametrize(
    "change, named",
    [
        ({"eps": -1.0}, "eps"),
        ({"beta": float("nan")}, "beta"),
        ({"rho": -1.0}, "rho"),
        ({"max_outer": 0}, "max_outer"),
        ("rho=-1", "argument 'rho'"),
        ("n_clients=0", "argument 'n_clients'"),
        ("theta0", "argument 'theta0'"),
    ],
)
def test_a_build_with_values_the_options_refuse_builds_nothing(party, change, named):
    f = party.factories()["site0"]
    if isinstance(change, dict):
        f = dataclasses.replace(
            f, args=(f.args[0], dataclasses.replace(f.args[1], **change), *f.args[2:])
        )
    elif change == "rho=-1":
        f = dataclasses.replace(f, args=(*f.args[:2], -1.0, *f.args[3:]))
    elif change == "n_clients=0":
        f = dataclasses.replace(f, args=(*f.args[:3], 0, *f.args[4:]))
    else:  # the party owns no variable: its block has 0 entries
        f = dataclasses.replace(f, kwargs={**f.kwargs, "theta0": np.zeros(5)})
    status, built = party.call("build", {"site0": f})
    exc, tb = built["site0"]
    assert status == "ok" and exc is not None and tb == "", built
    assert "party 'site0' refuses" in str(exc) and named in str(exc), str(exc)
    assert party.endpoint is None
    assert party.build() == ("ok", {"site0": None})  # and the honest build after it


def test_a_failing_constructor_answers_its_message_never_a_traceback(party):
    status, built = party.build(solver="no-such-backend")
    exc, tb = built["site0"]
    assert status == "ok" and "no-such-backend" in str(exc) and tb == ""
    text, _ = encode(built)
    assert "Traceback" not in text and ".py" not in text and os.sep + "site-packages" not in text


def test_requests_are_checked_by_value_before_dispatch(party):
    assert party.build()[0] == "ok"
    d = party.d
    # (gradient_w: a kind of the route this party runs, quasi-newton)
    bad = [
        ({"w": np.zeros(d + 1)}, "shape"),
        ({"w": np.full(d, np.nan)}, "not finite"),
        ({"w": np.full(d, 1e200)}, "magnitude"),
        ({"w": np.zeros(d, dtype=bool)}, "dtype bool"),
        ({"w": "x"}, "not a number"),
    ]
    for payload, named in bad:
        status, err = party.call("run", [_msg("gradient_w", payload)], None)
        assert status == "error" and isinstance(err, CodecError), err
        assert "party 'site0' refuses message 'gradient_w'" in str(err) and named in str(err)
    assert _untouched(party.endpoint)


def test_rounds_rise_and_the_sender_is_the_declared_one(party):
    assert party.build()[0] == "ok"
    ev = {"w": np.zeros(party.d)}
    status, outcomes = party.call("run", [_msg("evaluate", ev, 5, channel="diagnostic")])
    assert status == "ok" and outcomes[0].ok
    refused = [
        (_msg("evaluate", ev, 5, channel="diagnostic"), "again (a replay"),
        (_msg("evaluate", ev, 4, channel="diagnostic"), "older than round 5"),
        (_msg("evaluate", ev, -5, channel="diagnostic"), "round -5"),
        (_msg("evaluate", ev, 2**80, channel="diagnostic"), f"round {2**80}"),
        (_msg("evaluate", ev, 6, sender="site1", channel="diagnostic"), "sent by 'site1'"),
        (_msg("evaluate", ev, 6, channel="algorithm"), "channel 'algorithm'"),
    ]
    for m, named in refused:
        status, err = party.call("run", [m], None)
        assert status == "error" and named in str(err), (m, err)
    # a peer call carrying a server's kind, and a sender posing as the party itself
    status, err = party.call("peer", _msg("gradient_w", {"w": ev["w"]}, 6, "site1"), None)
    assert status == "error" and "declared as a 'server' message" in str(err)
    status, outcomes = party.call("run", [_msg("evaluate", ev, 6, channel="diagnostic")])
    assert status == "ok" and outcomes[0].ok
    # a step that failed may be sent again (a retry), as may everything after a restore
    assert party.call("restore_marks")[0] == "ok"
    status, outcomes = party.call("run", [_msg("evaluate", ev, 6, channel="diagnostic")])
    assert status == "ok" and outcomes[0].ok


# -- caps -----------------------------------------------------------------------------------------
@pytest.fixture
def parsed(monkeypatch):
    """The length of every text ``json.loads`` parses."""
    seen: list[int] = []
    loads = json.loads

    def recording(text, *a, **k):
        seen.append(len(text))
        return loads(text, *a, **k)

    monkeypatch.setattr(json, "loads", recording)
    return seen


def test_an_oversized_frame_is_refused_by_the_relay_unforwarded(party, monkeypatch):
    monkeypatch.setattr(flower_relay_app, "MAX_FRAME", 2**20)  # (a 300 MB frame, scaled)
    read = []
    monkeypatch.setattr(flower_party.PartyServer, "handle_frame", lambda s, f: read.append(f))
    frame = flower_relay_app.pack("call", json.dumps(["names", []]), [np.zeros(2**17 + 8)])
    status, err = party.frame(frame)
    assert status == "error" and isinstance(err, CodecError)
    assert f"a call frame of {len(frame)} bytes refused unread" in str(err)
    assert read == []  # never reached the party server


def test_the_party_server_reads_a_length_prefix_and_refuses_the_frame_unread(party, monkeypatch):
    """A frame announced as 300 MB: the party server reads its length prefix and answers
    the refusal; of the bytes the client writes it reads none past the prefix."""
    counted = {"read": 0}
    original = connection.Connection._recv

    def counting(self, size, read=None):
        out = original(self, size) if read is None else original(self, size, read)
        if threading.current_thread() is party.thread:
            counted["read"] += size
        return out

    monkeypatch.setattr(connection.Connection, "_recv", counting)
    key = flower_party.read_key(party.server.socket_path)
    with connection.Client(party.server.socket_path, family="AF_UNIX", authkey=key) as conn:
        conn._send(struct.pack("!i", -1) + struct.pack("!Q", 300 * 2**20))
        try:  # the frame begins; the party never reads it (and may have hung up already)
            conn._send(b"C" + b"\0" * 65536)
        except BrokenPipeError:
            pass
        answer = conn.recv_bytes()
    status, text, arrays = flower_relay_app.unpack(answer)
    assert status == "error" and "refused unread" in str(decode(text, arrays))
    # the HMAC handshake and the length prefix: none of the 64 KiB of the frame sent
    assert counted["read"] < 1024, counted
    assert party.call("names") == ("ok", [])  # and the next call is served


@pytest.mark.parametrize(
    "text",
    [
        "[" + "0," * (10**7 - 1) + "0]",  # a JSON list of 10^7 ints
        "{" + ",".join(f'"k{i}":0' for i in range(10**6)) + "}",  # a dict of 10^6 keys
    ],
    ids=["list-1e7", "dict-1e6"],
)
def test_a_long_json_text_is_refused_before_it_is_parsed(party, parsed, text):
    status, err = party.frame(flower_relay_app.pack("call", text, []))
    assert status == "error" and "JSON text" in str(err) and "at most 1048576" in str(err)
    assert max(parsed) < 2 * 2**20  # no text longer than the cap was parsed


def test_deep_or_wide_json_is_refused_before_any_value_is_built(party):
    deep = "[" * 200 + "]" * 200
    wide = "[" + "0," * 150_000 + "0]"  # (under the text cap)
    for text, named in ((deep, "nested deeper than 64"), (wide, "more than 100000 values")):
        status, err = party.frame(flower_relay_app.pack("call", text, []))
        assert status == "error" and named in str(err), err


def test_a_call_of_twenty_thousand_messages_is_refused_and_runs_none(party, parsed):
    assert party.build()[0] == "ok"
    many = [_msg("evaluate", {"w": np.zeros(party.d)}, 1, channel="diagnostic")] * 20_000
    status, err = party.call("run", many, None)
    assert status == "error" and "JSON text" in str(err)
    # within the text cap, more than one message per party served is refused too
    status, err = party.call("run", many[:2], None)
    assert status == "error" and "at most one per party served here" in str(err)
    assert _untouched(party.endpoint)


def test_checkpoint_run_tokens_are_capped_per_run(party, tmp_path):
    assert party.build()[0] == "ok"
    before = sorted(os.listdir(tmp_path))
    answers = [
        party.call("write_checkpoint", f"run{i}", "000001-0a1b2c3d", False)[0] for i in range(2000)
    ]
    assert answers[: flower_party.MAX_TOKENS_PER_RUN] == ["ok"] * flower_party.MAX_TOKENS_PER_RUN
    assert set(answers[flower_party.MAX_TOKENS_PER_RUN :]) == {"error"}
    status, err = party.call("write_checkpoint", "run-x", "000001-0a1b2c3d", False)
    assert "at most 4 per run" in str(err)
    assert len(os.listdir(party.own)) == flower_party.MAX_TOKENS_PER_RUN
    # nothing written outside the party's own directory
    assert sorted(set(os.listdir(tmp_path)) - {party.own.name}) == before


# -- 3. checkpoint files ---------------------------------------------------------------------------
def test_a_link_planted_at_a_temporary_name_is_never_followed(tmp_path):
    from fedmodel.runtime.checkpoint import MANIFEST, remove_stale_temporaries, write_atomic

    target = tmp_path / "precious"
    target.write_text("keep me")
    ck = tmp_path / "ck"
    ck.mkdir()
    # links at the old fixed temporary name, and a half-written temporary of a crash
    for name in (f"{MANIFEST}.tmp-{os.getpid()}", f"{MANIFEST}.tmp-1"):
        (ck / name).symlink_to(target)
    (ck / "server-000001-0a1b2c3d.npz.tmp-abc").write_bytes(b"half")
    write_atomic(str(ck / MANIFEST), b"{}")
    assert target.read_text() == "keep me" and (ck / MANIFEST).read_bytes() == b"{}"
    removed = remove_stale_temporaries(str(ck))
    assert sorted(removed) == sorted(
        [f"{MANIFEST}.tmp-{os.getpid()}", f"{MANIFEST}.tmp-1", "server-000001-0a1b2c3d.npz.tmp-abc"]
    )
    assert sorted(os.listdir(ck)) == [MANIFEST] and target.read_text() == "keep me"


def test_a_checkpoint_written_over_planted_links_leaves_their_targets(tmp_path):
    target = tmp_path / "precious"
    target.write_text("keep me")
    ck = tmp_path / "ck"
    ck.mkdir()
    (ck / f"manifest.json.tmp-{os.getpid()}").symlink_to(target)
    res = np_model(3).solve("prox-al", max_outer=2, checkpoint=str(ck), random_state=0)
    assert res.status in ("max_iterations", "optimal")
    assert target.read_text() == "keep me"
    assert not [f for f in os.listdir(ck) if ".tmp-" in f]


def _tamper(path, fname, change):
    """Rewrite the state file ``fname`` with ``change`` applied to its state, and its
    checksum in the manifest (a tampered state that passes the checksum)."""
    import hashlib

    from fedmodel.runtime.checkpoint import read_state_file, write_state_file

    manifest = json.loads((path / "manifest.json").read_text())
    entry = (
        manifest["server"]
        if fname.startswith("server-")
        else next(v for v in manifest["parties"].values() if v[0] == fname)
    )
    kind, party = (
        ("server", None) if fname.startswith("server-") else ("party", fname.split("-")[1])
    )
    record = read_state_file(str(path), fname, entry[1], kind, party)
    change(record["state"])
    write_state_file(str(path / fname), record)
    entry[1] = hashlib.sha256((path / fname).read_bytes()).hexdigest()
    (path / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize("which", ["party", "server"])
def test_a_state_that_passes_its_checksum_but_does_not_fit_is_a_checkpoint_error(tmp_path, which):
    from fedmodel.runtime.checkpoint import CheckpointError

    ck = tmp_path / "ck"
    opts = dict(max_outer=2, random_state=0)
    np_model(3).solve("prox-al", checkpoint=str(ck), **opts)
    manifest = json.loads((ck / "manifest.json").read_text())
    if which == "party":
        fname = manifest["parties"]["site1"][0]

        def change(state):
            state["mu"] = np.zeros(7)  # site1 has one inequality
    else:
        fname = manifest["server"][0]

        def change(state):
            state["server"]["x"] = "not an iterate"

    _tamper(ck, fname, change)
    with pytest.raises(CheckpointError, match=rf"{fname} does not fit this run"):
        np_model(3).solve("prox-al", resume=str(ck), **opts)


# -- 4. declarations -----------------------------------------------------------------------------
def test_complex_and_other_non_real_data_are_refused_naming_party_and_data():
    import cvxpy as cp

    import fedmodel as fm
    from fedmodel.errors import DataError

    X = np.random.default_rng(0).normal(size=(6, 3))
    model = fm.Model()
    model.variable(3, name="w")
    site = model.client("site0")
    for bad, named in (
        (X + 1j * X, "is complex"),
        (np.array([1.0, 2j], dtype=object), "is complex"),
        (np.array(["a", "b"]), "not real numbers"),
    ):
        with pytest.raises(DataError, match=named) as err:
            site.data(bad, name="rows")
        assert err.value.party == "site0" and "'rows'" in str(err.value)
    w = model.variables[0]
    with pytest.raises(DataError, match="complex constant"):
        site.minimize(cp.real(cp.sum(w) * (1 + 1j)))


def test_infinite_bounds_mean_no_bound_as_in_cvxpy():
    import cvxpy as cp

    import fedmodel as fm
    from fedmodel.errors import ModelError

    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(20, 3)), rng.normal(size=20)
    hi = np.array([0.1, np.inf, 0.2])
    model = fm.Model()
    w = model.variable(3, name="w")
    site = model.client("site0")
    site.minimize(cp.sum_squares(site.data(X, name="X") @ w - site.data(y, name="y")) / 20)
    site.subject_to([w <= np.inf, w <= hi, -np.inf <= w[0]])
    model.server.subject_to(w >= -np.inf)
    model.regularize([w <= np.inf, -np.inf <= w])  # no bound: nothing added to h
    assert model._regularizers == []
    res = model.solve("prox-al", eps=1e-7)
    v = cp.Variable(3)
    ref = cp.Problem(cp.Minimize(cp.sum_squares(X @ v - y) / 20), [v <= np.inf, v <= hi])
    ref.solve()
    assert res.status == "optimal" and abs(res.objective - ref.value) <= 1e-5 * max(1, ref.value)
    with pytest.raises(ModelError, match="bound of -inf on its right side"):
        site.subject_to(w <= -np.inf)
