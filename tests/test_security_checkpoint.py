"""Checkpoints trust nothing they read (issue 22, items 2 and 5): no pickle, file names
chosen by the party inside its own directory, a fingerprint over every constant of the
model. Each attack is replayed and shown refused with nothing executed and no file outside
the checkpoint directory read."""

from __future__ import annotations

import builtins
import hashlib
import io
import json
import os
import pickle
import shutil
import sys

import cvxpy as cp
import numpy as np
import pytest

import fedmodel as fm
from fedmodel.runtime import plaincodec
from fedmodel.runtime.checkpoint import (
    CheckpointError,
    party_fingerprint,
    read_state_file,
    run_token,
    write_state_file,
)
from fedmodel.runtime.endpoints import EchoEndpoint
from fedmodel.runtime.flower_party import PartyServer
from fedmodel.runtime.host import PartyHost

sys.path.insert(0, os.path.dirname(__file__))
from problems import np_sites  # noqa: E402

SITES = np_sites(3)
OPTS = {"eps": 1e-4, "prox_beta": 1.0}  # (14 outer iterations: see test_failures)


def build(bounds=(0.45, 0.45, 0.45), server_bound=5.0, lam=1e-3, sites=SITES):
    """Neyman-Pearson with a bound per site, a server constraint and h = lam ||w||^2."""
    model = fm.Model("np")
    w = model.variable(np.shape(sites[0][0])[1], name="w")
    for k, (X0, X1) in enumerate(sites):
        site = model.client(f"site{k}")
        A0, A1 = site.data(X0, name="class0"), site.data(X1, name="class1")
        site.minimize(cp.sum(cp.logistic(A0 @ w)) / (len(X0) * len(sites)), name="loss0")
        site.subject_to(cp.sum(cp.logistic(-(A1 @ w))) / len(X1) <= bounds[k], name="loss1")
    model.server.subject_to(cp.norm(w, "inf") <= server_bound, name="box")
    model.regularize(lam * cp.sum_squares(w))
    return model


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A checkpoint written at outer iteration 2."""
    path = tmp_path_factory.mktemp("ck") / "run"
    res = build().solve("prox-al", checkpoint=str(path), max_outer=2, **OPTS)
    assert res.status == "max_iterations" and res.checkpoint == str(path)
    return path


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def _manifest(path):
    return json.loads((path / "manifest.json").read_text())


def _write_manifest(path, manifest):
    (path / "manifest.json").write_text(json.dumps(manifest))


def _sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


class _Sentinel:
    """Unpickling this creates the file ``path`` (what a forged pickle could do)."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


# -- round trip ---------------------------------------------------------------------------------
def test_resume_repeats_the_uninterrupted_run_bit_for_bit(checkpoint):
    reference = build().solve("prox-al", **OPTS)
    resumed = build().solve("prox-al", resume=str(checkpoint), **OPTS)
    assert resumed.status == reference.status == "optimal"
    assert np.array_equal(resumed.x, reference.x)
    assert resumed.rounds == reference.rounds
    assert resumed.ledger == reference.ledger
    files = sorted(os.listdir(checkpoint))
    assert [f for f in files if f.endswith(".pkl")] == []
    assert len([f for f in files if f.startswith("party-") and f.endswith(".npz")]) == 3
    assert _manifest(checkpoint)["version"] == 2


# -- forged files -------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", ["serial", "processes"])
@pytest.mark.parametrize("which", ["party", "server"])
def test_a_forged_pickle_with_a_matching_checksum_is_not_executed(
    checkpoint, tmp_path, backend, which
):
    bad = _copy(checkpoint, tmp_path / "bad")
    sentinel = tmp_path / "pwned"
    manifest = _manifest(bad)
    entry = manifest["parties"]["site1"] if which == "party" else manifest["server"]
    (bad / entry[0]).write_bytes(pickle.dumps(_Sentinel(sentinel)))
    entry[1] = _sha(bad / entry[0])  # the attacker controls the manifest too
    _write_manifest(bad, manifest)
    with pytest.raises(CheckpointError, match="not a fedmodel state archive") as info:
        build().solve("prox-al", resume=str(bad), backend=backend, workers=2, **OPTS)
    assert not sentinel.exists()
    if which == "party":
        assert "client 'site1'" in str(info.value)


def test_an_archive_holding_a_pickled_object_array_is_not_executed(checkpoint, tmp_path):
    bad = _copy(checkpoint, tmp_path / "bad")
    sentinel = tmp_path / "pwned"
    manifest = _manifest(bad)
    fname = manifest["parties"]["site0"][0]
    evil = np.empty(1, dtype=object)
    evil[0] = _Sentinel(sentinel)
    buf = io.BytesIO()
    text = json.dumps({"format": "fedmodel-party-state", "party": "site0", "state": {"__a": 0}})
    np.savez(buf, text=np.frombuffer(text.encode(), dtype=np.uint8), a0=evil)
    (bad / fname).write_bytes(buf.getvalue())
    manifest["parties"]["site0"][1] = _sha(bad / fname)
    _write_manifest(bad, manifest)
    with pytest.raises(CheckpointError, match="site0.*cannot be read"):
        build().solve("prox-al", resume=str(bad), **OPTS)
    assert not sentinel.exists()


def test_an_old_pickle_checkpoint_is_refused_with_a_clear_error(checkpoint, tmp_path):
    old = _copy(checkpoint, tmp_path / "old")
    manifest = _manifest(old)
    manifest["version"] = 1
    _write_manifest(old, manifest)
    with pytest.raises(CheckpointError, match="older fedmodel.*version 1.*pickle"):
        build().solve("prox-al", resume=str(old), **OPTS)


# -- path traversal ------------------------------------------------------------------------------
@pytest.fixture
def opened(monkeypatch):
    """Every path opened with ``open`` in this process (the serial backend's parties)."""
    seen: list[str] = []
    real = builtins.open

    def spy(file, *args, **kw):
        if isinstance(file, (str, os.PathLike)):
            seen.append(os.path.abspath(os.fspath(file)))
        return real(file, *args, **kw)

    monkeypatch.setattr(builtins, "open", spy)
    return seen


def test_party_file_names_outside_the_directory_are_refused_unread(checkpoint, tmp_path, opened):
    outside = tmp_path / "outside"
    outside.mkdir()
    bad = _copy(checkpoint, tmp_path / "bad")
    manifest = _manifest(bad)
    fname, sha = manifest["parties"]["site0"]
    # a valid copy of site0's own file outside the directory: loading it would succeed,
    # so a refusal shows the name alone was refused
    shutil.copy(bad / fname, outside / fname)
    names = [
        str(outside / fname),  # absolute
        f"../outside/{fname}",  # relative, out
        f"./{fname}",  # a directory part
        "/etc/passwd",
        "/nonexistent/secret",
        "../x",
        "..",
    ]
    opened.clear()  # (the set-up above copied files)
    messages = []
    for name in names:
        manifest["parties"]["site0"] = [name, sha]
        _write_manifest(bad, manifest)
        with pytest.raises(CheckpointError) as info:
            build().solve("prox-al", resume=str(bad), **OPTS)
        msg = str(info.value)
        assert "client 'site0'" in msg and f"refusing checkpoint file {name!r}" in msg, msg
        messages.append(msg.replace(repr(name), "NAME"))
    # no oracle: the same answer whether the named file exists or not
    assert len(set(messages)) == 1
    assert not [p for p in opened if p.startswith(str(outside)) or p == "/etc/passwd"]
    assert not [p for p in opened if "nonexistent" in p]


def test_a_party_file_name_of_another_party_is_refused(checkpoint, tmp_path):
    bad = _copy(checkpoint, tmp_path / "bad")
    manifest = _manifest(bad)
    manifest["parties"]["site0"] = manifest["parties"]["site1"]
    _write_manifest(bad, manifest)
    with pytest.raises(CheckpointError, match="client 'site0'.*not a state file of party 'site0'"):
        build().solve("prox-al", resume=str(bad), **OPTS)


def test_a_server_file_name_outside_the_directory_is_refused_unread(checkpoint, tmp_path, opened):
    bad = _copy(checkpoint, tmp_path / "bad")
    manifest = _manifest(bad)
    fname, sha = manifest["server"]
    shutil.copy(bad / fname, tmp_path / fname)
    opened.clear()
    for name in (str(tmp_path / fname), f"../{fname}", "/etc/passwd"):
        manifest["server"] = [name, sha]
        _write_manifest(bad, manifest)
        with pytest.raises(CheckpointError, match="refusing checkpoint file"):
            build().solve("prox-al", resume=str(bad), **OPTS)
    assert str(tmp_path / fname) not in opened and "/etc/passwd" not in opened


def test_a_party_host_refuses_tags_and_names_that_leave_the_directory(tmp_path):
    host = PartyHost(endpoints={"site0": EchoEndpoint("site0")})
    host.mark()
    for tag in ("../../x", "/tmp/x", "000001-0a1b2c3d/../../y", ""):
        with pytest.raises(CheckpointError, match="refusing checkpoint tag"):
            host.write_checkpoint(str(tmp_path), tag)
    assert os.listdir(tmp_path) == []
    files = host.write_checkpoint(str(tmp_path), "000003-0a1b2c3d")
    fname, sha = files["site0"]
    assert fname.startswith("party-site0-") and fname.endswith("-000003-0a1b2c3d.npz")
    host.endpoints["site0"].count = 7
    assert host.load_checkpoint(str(tmp_path), {"site0": (fname, sha)}) == {"site0": None}
    assert host.endpoints["site0"].count == 0
    errors = host.load_checkpoint(str(tmp_path), {"site0": ("/etc/passwd", sha)})
    assert "refusing checkpoint file '/etc/passwd'" in errors["site0"]


# -- a deployed party: its own directory, a run token from the coordinator ----------------------
@pytest.fixture
def party_server(tmp_path):
    server = PartyServer(
        str(tmp_path / "p.sock"), {"site0": None}, checkpoint_dir=str(tmp_path / "own")
    )
    server.host.endpoints["site0"] = EchoEndpoint("site0")
    server.host.mark()
    yield server
    server.close()


def test_a_deployed_party_writes_only_in_its_own_directory(party_server, tmp_path):
    tag = "000002-0a1b2c3d"
    for token in ("/tmp/evil", "../evil", "..", ".", "a/b", "", 3):
        with pytest.raises(CheckpointError, match="refusing checkpoint directory"):
            party_server.call("write_checkpoint", (token, tag, True))
    with pytest.raises(CheckpointError, match="refusing checkpoint tag"):
        party_server.call("write_checkpoint", ("run", "../../../x", True))
    files = party_server.call("write_checkpoint", (run_token(tmp_path / "ck"), tag, True))
    fname, sha = files["site0"]
    own = tmp_path / "own" / run_token(tmp_path / "ck")
    assert sorted(os.listdir(own)) == [fname]
    assert sorted(os.listdir(tmp_path)) == ["own", "p.sock", "p.sock.key"]
    ok = party_server.call(
        "load_checkpoint", (run_token(tmp_path / "ck"), {"site0": files["site0"]})
    )
    assert ok == {"site0": None}
    bad = party_server.call(
        "load_checkpoint", (run_token(tmp_path / "ck"), {"site0": ["/etc/passwd", sha]})
    )
    assert "refusing checkpoint file '/etc/passwd'" in bad["site0"]
    with pytest.raises(CheckpointError, match="refusing checkpoint directory"):
        party_server.call("load_checkpoint", ("/etc", {"site0": [fname, sha]}))
    # later checkpoints: the party keeps its last two files (the manifest names one of them)
    later = [
        party_server.call(
            "write_checkpoint", (run_token(tmp_path / "ck"), f"00000{k}-0a1b2c3d", True)
        )
        for k in (3, 4)
    ]
    assert sorted(os.listdir(own)) == sorted(w["site0"][0] for w in later)


def test_a_deployed_party_without_a_checkpoint_directory_refuses_checkpoints(tmp_path):
    server = PartyServer(str(tmp_path / "p.sock"), {"site0": None})
    try:
        with pytest.raises(CheckpointError, match="no checkpoint directory"):
            server.call("write_checkpoint", (str(tmp_path), "000001-0a1b2c3d", True))
    finally:
        server.close()
    assert sorted(os.listdir(tmp_path)) == []


# -- the model's fingerprint covers every constant ----------------------------------------------
def test_a_changed_constraint_bound_is_refused_naming_the_party(checkpoint):
    with pytest.raises(CheckpointError) as info:
        build(bounds=(0.45, 0.3, 0.45)).solve("prox-al", resume=str(checkpoint), **OPTS)
    msg = str(info.value)
    assert "client 'site1'" in msg and "terms of party 'site1' changed" in msg, msg
    assert "site0" not in msg and "site2" not in msg


def test_a_changed_server_constant_is_refused(checkpoint):
    with pytest.raises(CheckpointError, match="server terms.*terms of party 'server' changed"):
        build(server_bound=4.0).solve("prox-al", resume=str(checkpoint), **OPTS)


def test_a_changed_coefficient_of_h_is_refused(checkpoint):
    with pytest.raises(CheckpointError, match="regularizer h changed"):
        build(lam=2e-3).solve("prox-al", resume=str(checkpoint), **OPTS)


def test_changed_data_is_refused_naming_the_party(checkpoint):
    sites = [SITES[0], SITES[1], (SITES[2][0], SITES[2][1] + 1e-12)]
    with pytest.raises(CheckpointError, match="client 'site2'.*data of party 'site2' changed"):
        build(sites=sites).solve("prox-al", resume=str(checkpoint), **OPTS)


def test_the_fingerprint_sees_every_constant_of_an_expression():
    def program(expr_of):
        model = fm.Model("m")
        w = model.variable(3, name="w")
        c = model.client("site0")
        a = c.data(np.arange(3.0), name="a")
        c.minimize(expr_of(w, a))
        return model.compile().clients[0]

    base = party_fingerprint(program(lambda w, a: cp.sum(cp.huber(w - a, 2.0))))
    same = party_fingerprint(program(lambda w, a: cp.sum(cp.huber(w - a, 2.0))))
    assert base == same  # stable: variables by their place, not their cvxpy ids
    for changed in (
        lambda w, a: cp.sum(cp.huber(w - a, 2.5)),  # an atom's own constant
        lambda w, a: cp.sum(cp.huber(w - 2 * a, 2.0)),  # a coefficient
        lambda w, a: cp.sum(cp.huber(w[[0, 2, 1]] - a, 2.0)),  # an index
        lambda w, a: cp.sum(cp.abs(w - a)),  # the atom
    ):
        fp = party_fingerprint(program(changed))
        assert fp["data"] == base["data"] and fp["terms"] != base["terms"]


# -- the plain codec -----------------------------------------------------------------------------
def test_the_plain_codec_round_trips_states_exactly():
    state = {
        "x": np.array([0.1, np.nan, -np.inf, 1 / 3]),
        "k": np.int64(7),
        "flag": np.bool_(True),
        "rng": np.random.default_rng(3).bit_generator.state,  # 128-bit integers
        ("a", "b"): [(1, 2.5), None, "s", float("inf")],
        "M": np.arange(6.0).reshape(2, 3, order="F"),
        "empty": np.zeros((0, 0)),
    }
    out = plaincodec.decode(*plaincodec.encode(state))
    assert out.keys() == state.keys()
    assert np.array_equal(out["x"], state["x"], equal_nan=True)
    assert type(out["k"]) is np.int64 and out["k"] == 7 and type(out["flag"]) is np.bool_
    assert out["rng"] == state["rng"] and out[("a", "b")] == state[("a", "b")]
    assert np.array_equal(out["M"], state["M"]) and out["empty"].shape == (0, 0)


def test_the_plain_codec_writes_and_builds_no_objects():
    with pytest.raises(plaincodec.PlainCodecError, match=r"value\['m'\]: a _Sentinel"):
        plaincodec.encode({"m": _Sentinel("x")})
    with pytest.raises(plaincodec.PlainCodecError, match="dtype object"):
        plaincodec.encode(np.array([None]))
    for text, arrays in (
        ('{"__ref": "os:system"}', []),
        ('{"__dc": ["fedmodel.runtime.flower_party:os.system", {}]}', []),
        ('{"__a": 3}', [np.zeros(1)]),
        ('{"__a": 0}', [np.array(["x"])]),
        ('{"__f": "__import__"}', []),
    ):
        with pytest.raises(plaincodec.PlainCodecError):
            plaincodec.decode(text, arrays)


def test_a_state_file_holds_only_plain_entries(tmp_path):
    path = tmp_path / "server-000001-0a1b2c3d.npz"
    sha = write_state_file(str(path), {"x": np.arange(3.0)})
    with np.load(path, allow_pickle=False) as z:
        assert sorted(z.files) == ["a0", "text"]
    out = read_state_file(str(tmp_path), path.name, sha, "server")
    assert out["x"].tolist() == [0.0, 1.0, 2.0]
    with pytest.raises(CheckpointError, match="cannot be written: value\\['m'\\]"):
        write_state_file(str(path), {"m": object()})
