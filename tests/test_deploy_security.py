"""``fedmodel join`` / ``serve`` security without a SuperLink (issue 22): the socket
directory is made private or refused, never re-permissioned; a party's ``hello`` reports
only the arrays the model reads and appears in the ledger; a node registered for one
party cannot claim another's name; the parties' key file is checked.

The deployment path is exercised in this process through :class:`LoopbackGrid`, a Grid
whose nodes are party servers called as Flower's relay ClientApp calls them (the same
codec, the same ``PartyServer.handle``); ``tests/test_flower_deployment.py`` (slow) runs
it over a real SuperLink with TLS and SuperNode authentication.
"""

from __future__ import annotations

import itertools
import os
import shutil
import stat
import tempfile
from types import SimpleNamespace

import numpy as np
import pytest
from problems import DEPLOYMENT_MODEL as MODEL
from problems import np_sites

pytest.importorskip("flwr")

from fedmodel.cli import main  # noqa: E402
from fedmodel.deploy import coordinator_model, load_model_file  # noqa: E402
from fedmodel.errors import ModelError  # noqa: E402
from fedmodel.flower_app import (  # noqa: E402
    DeploymentError,
    party_server,
    private_socket_dir,
    read_authorized_keys,
)
from fedmodel.runtime.flower_relay_app import content_of, parts_of  # noqa: E402
from fedmodel.runtime.flower_runtime import JoinedGrid, discover  # noqa: E402

OPTS = dict(max_outer=1, max_inner=3, history=False, random_state=0)
PARTIES = ["site0", "site1", "site2"]


# -- the socket directory --------------------------------------------------------------------
def test_a_missing_socket_dir_is_created_private(tmp_path):
    d = private_socket_dir(str(tmp_path / "a" / "run"))
    assert stat.S_IMODE(os.stat(d).st_mode) == 0o700


def test_an_existing_private_socket_dir_is_used_unchanged(tmp_path):
    d = tmp_path / "run"
    d.mkdir(mode=0o700)
    os.chmod(d, 0o500)  # private, and not what fedmodel would set: must stay as it is
    assert private_socket_dir(str(d)) == str(d)
    assert stat.S_IMODE(os.stat(d).st_mode) == 0o500


def test_a_shared_socket_dir_is_refused_not_repermissioned(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    with pytest.raises(DeploymentError, match=r"has mode 1777.*does not change the permissions"):
        private_socket_dir(str(shared))
    assert stat.S_IMODE(os.stat(shared).st_mode) == 0o1777


def test_a_socket_dir_of_another_user_or_a_link_is_refused(tmp_path):
    link = tmp_path / "link"
    (tmp_path / "mine").mkdir(mode=0o700)
    link.symlink_to(tmp_path / "mine")
    with pytest.raises(DeploymentError, match="symbolic link"):
        private_socket_dir(str(link))
    if os.geteuid() != 0:
        pytest.skip("making a directory owned by another user needs root")
    other = tmp_path / "other"
    other.mkdir(mode=0o700)
    os.chown(other, 65534, 65534)
    with pytest.raises(DeploymentError, match="belongs to user id 65534"):
        private_socket_dir(str(other))
    assert stat.S_IMODE(os.stat(other).st_mode) == 0o700 and os.stat(other).st_uid == 65534


def test_join_with_a_shared_socket_dir_exits_with_a_message(tmp_path, capsys):
    (tmp_path / "model.py").write_text(MODEL)
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    code = main(
        ["join", str(tmp_path / "model.py"), "--party", "site0", "--data", "absent.npz",
         "--superlink", "127.0.0.1:9", "--insecure", "--socket-dir", str(shared)]
    )  # fmt: skip
    err = capsys.readouterr().err
    assert code == 1
    assert "--insecure: no TLS" in err  # the warning
    assert f"--socket-dir {shared} has mode 1777" in err
    assert stat.S_IMODE(os.stat(shared).st_mode) == 0o1777
    assert os.listdir(shared) == []  # nothing made there


def test_join_with_a_socket_path_too_long_says_so(tmp_path, capsys):
    (tmp_path / "model.py").write_text(MODEL)
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    code = main(
        ["join", str(tmp_path / "model.py"), "--party", "site0", "--data", "absent.npz",
         "--superlink", "127.0.0.1:9", "--insecure", "--socket-dir", str(deep)]
    )  # fmt: skip
    err = capsys.readouterr().err
    assert code == 1
    assert "longer than a Unix socket allows (107): give a shorter --socket-dir" in err


# -- hello, the ledger and the node <-> party binding -------------------------------------------
class LoopbackGrid:
    """A Flower Grid without Flower's network: node id -> a party server, called with a
    message's codec text and arrays exactly as the relay ClientApp forwards them."""

    def __init__(self, servers):
        self.servers = dict(servers)
        self.replies = {}
        self.ids = itertools.count()

    def get_node_ids(self):
        return list(self.servers)

    def push_messages(self, messages):
        ids = []
        for m in messages:
            _status, text, arrays = parts_of(m.content)
            status, out, out_arrays = self.servers[m.metadata.dst_node_id].handle(
                ("call", text, arrays)
            )
            mid = f"message-{next(self.ids)}"
            self.replies[mid] = SimpleNamespace(
                metadata=SimpleNamespace(reply_to_message_id=mid),
                has_error=lambda: False,
                content=content_of(status, out, out_arrays),
            )
            ids.append(mid)
        return ids

    def pull_messages(self, ids):
        return [self.replies.pop(i) for i in ids if i in self.replies]


@pytest.fixture
def organisations(tmp_path, monkeypatch):
    """The model file and three party servers as ``fedmodel join`` makes them, each with
    an array in its data the model never reads."""
    from flwr.supercore.task_identity import TaskIdentity

    for field in ("_run_id", "_node_id", "_task_id"):  # (a ServerApp's run sets these)
        monkeypatch.setattr(TaskIdentity, field, 1)
    (tmp_path / "model.py").write_text(MODEL)
    model_file = load_model_file(tmp_path / "model.py")
    sites = np_sites(3)
    sockets = tempfile.mkdtemp(prefix="fm-")  # (a Unix socket's path must be short)
    data = {
        p: {"X0": X0, "X1": X1, "patient_ids": np.arange(len(X0) + len(X1))}
        for p, (X0, X1) in zip(PARTIES, sites)
    }
    servers = {  # each organisation's own checkpoint directory
        p: party_server(
            model_file,
            p,
            data[p],
            os.path.join(sockets, f"{p}.sock"),
            checkpoint_dir=str(tmp_path / "own" / p),
        )
        for p in PARTIES
    }
    yield SimpleNamespace(model_file=model_file, sites=sites, data=data, servers=servers)
    for s in servers.values():
        s.close()
    shutil.rmtree(sockets, ignore_errors=True)


def test_hello_reports_only_the_arrays_the_model_reads(organisations):
    hello = organisations.servers["site1"].call("hello", ())
    X0, X1 = organisations.sites[1]
    assert hello == {
        "parties": ["site1"],
        "shapes": {"site1": {"X0": list(X0.shape), "X1": list(X1.shape)}},
    }
    # and that is all the coordinator needs to lay out the model
    shapes = {p: s.call("hello", ())["shapes"][p] for p, s in organisations.servers.items()}
    model = coordinator_model(organisations.model_file, shapes)
    assert [c.name for c in model.clients] == PARTIES


def test_a_deployed_solve_records_the_hello_exchange(organisations):
    nodes = {p: 101 + i for i, p in enumerate(PARTIES)}
    grid = LoopbackGrid({nodes[p]: organisations.servers[p] for p in PARTIES})
    found = discover(grid, PARTIES, timeout=10, nodes=nodes)
    assert {p: node for p, (node, _info) in found.items()} == nodes
    shapes = {p: info["shapes"][p] for p, (_node, info) in found.items()}
    model = coordinator_model(organisations.model_file, shapes)
    res = model.solve("prox-al", backend="flower", flower_grid=JoinedGrid(grid, found), **OPTS)
    real = {p: {k: organisations.data[p][k] for k in ("X0", "X1")} for p in PARTIES}
    ref = organisations.model_file.build(real).solve("prox-al", **OPTS)
    assert res.rounds == ref.rounds
    assert np.max(np.abs(res.x - ref.x)) <= 1e-10 * max(1.0, np.max(np.abs(ref.x)))
    hello = [r for r in res.ledger if r["channel"] == "join"]
    assert res.ledger[: len(hello)] == hello  # first, before the method's messages
    assert [(r["sender"], r["receiver"]) for r in hello] == [
        x for p in PARTIES for x in (("server", p), (p, "server"))
    ]
    for r in hello[1::2]:  # each array's shape: two integers; patient_ids never named
        assert r["kind"] == "hello" and r["round"] == 0
        assert r["shapes"] == {"X0": (2,), "X1": (2,)} and r["floats"] == 4

    def strip(rows):
        return [{k: v for k, v in r.items() if k != "seconds"} for r in rows]

    assert strip(r for r in res.ledger if r["channel"] != "join") == strip(ref.ledger)
    # the method's traffic totals do not count the hello
    assert res.communication["messages"] == ref.communication["messages"]


def test_a_node_cannot_claim_a_party_its_key_was_not_registered_for(organisations):
    s = organisations.servers
    # node 13 holds site2's key but its party server serves site0
    grid = LoopbackGrid({11: s["site0"], 12: s["site1"], 13: s["site0"]})
    with pytest.raises(ModelError, match=r"node 13, registered for party 'site2', says it "):
        discover(grid, PARTIES, timeout=5, nodes={"site0": 11, "site1": 12, "site2": 13})


def test_a_node_not_registered_for_a_party_is_not_asked(organisations):
    s = organisations.servers
    # node 99 (no registered key) also claims site2: ignored, not "joined twice"
    grid = LoopbackGrid({11: s["site0"], 12: s["site1"], 13: s["site2"], 99: s["site2"]})
    nodes = {"site0": 11, "site1": 12, "site2": 13}
    found = discover(grid, PARTIES, timeout=5, nodes=nodes)
    assert {p: node for p, (node, _info) in found.items()} == nodes
    assert grid.replies == {}
    with pytest.raises(ModelError, match="party 'site2' joined twice"):  # without the binding
        discover(grid, PARTIES, timeout=5)


# -- the parties' keys ------------------------------------------------------------------------
def _public_key(kind="ecdsa"):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519

    key = (
        ec.generate_private_key(ec.SECP384R1())
        if kind == "ecdsa"
        else ed25519.Ed25519PrivateKey.generate()
    )
    return (
        key.public_key()
        .public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
        .decode()
    )


def test_the_authorized_keys_file_is_checked(tmp_path):
    f = tmp_path / "parties.keys"
    k0, k1 = _public_key(), _public_key()
    f.write_text(f"# party key\n\nsite0 {k0} hospital A\nsite1 {k1}\n")
    keys = read_authorized_keys(str(f), ["site0", "site1"])
    assert list(keys) == ["site0", "site1"] and keys["site0"] != keys["site1"]
    with pytest.raises(DeploymentError, match=r"no key for parties \['site2'\]"):
        read_authorized_keys(str(f), ["site0", "site1", "site2"])
    with pytest.raises(DeploymentError, match="line 3 .*the model has no party 'site0'"):
        read_authorized_keys(str(f), ["site1", "hospital"])
    f.write_text(f"site0 {k0}\nsite1 {k0}\n")
    with pytest.raises(DeploymentError, match="line 2 .*the same key as party 'site0'"):
        read_authorized_keys(str(f))
    f.write_text(f"site0 {_public_key('ed25519')}\n")
    with pytest.raises(DeploymentError, match="line 1 .*needs an ECDSA key on a NIST curve"):
        read_authorized_keys(str(f))
    f.write_text("site0 ecdsa-sha2-nistp384 not-base64\n")
    with pytest.raises(DeploymentError, match="line 1 .*not an OpenSSH public key"):
        read_authorized_keys(str(f))


def test_join_refuses_a_private_key_others_can_read(tmp_path, capsys):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    (tmp_path / "model.py").write_text(MODEL)
    key = tmp_path / "site0.key"
    key.write_bytes(
        ec.generate_private_key(ec.SECP384R1()).private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.OpenSSH,
            serialization.NoEncryption(),
        )
    )
    os.chmod(key, 0o644)
    argv = ["join", str(tmp_path / "model.py"), "--party", "site0", "--data", "absent.npz",
            "--superlink", "127.0.0.1:9", "--auth-key", str(key)]  # fmt: skip
    assert main(argv) == 1
    assert f"--auth-key {key} is readable by other users" in capsys.readouterr().err
    assert main(argv + ["--insecure", "--root-certificates", str(key)]) == 1
    assert "--insecure and --root-certificates exclude each other" in capsys.readouterr().err


def test_register_without_a_reachable_superlink_says_so(tmp_path, capsys):
    import socket

    (tmp_path / "model.py").write_text(MODEL)
    keys = tmp_path / "parties.keys"
    keys.write_text("".join(f"{p} {_public_key()}\n" for p in PARTIES))
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = ["register", str(tmp_path / "model.py"), "--superlink", f"127.0.0.1:{port}",
            "--insecure", "--authorized-keys", str(keys)]  # fmt: skip
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert f"could not register the parties' keys with the SuperLink at 127.0.0.1:{port}" in err
    # the likely causes, among them the one Flower does not report: a SuperLink that
    # exited because flower-superexec is not on its PATH
    assert "is flower-superlink running" in err and "'flower-superexec' is not on its PATH" in err
    argv = ["serve", str(tmp_path / "model.py"), "--superlink", f"127.0.0.1:{port}",
            "--insecure", "--out", str(tmp_path / "result.json")]  # fmt: skip
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert f"could not start the run on the SuperLink at 127.0.0.1:{port}" in err
    assert "'flower-superexec' is not on its PATH" in err
    assert not (tmp_path / "result.json").exists()


def test_a_resumed_deployed_solve_keeps_the_run_so_far_then_its_own_hello(organisations, tmp_path):
    nodes = {p: 101 + i for i, p in enumerate(PARTIES)}
    grid = LoopbackGrid({nodes[p]: organisations.servers[p] for p in PARTIES})
    found = discover(grid, PARTIES, timeout=10, nodes=nodes)
    shapes = {p: info["shapes"][p] for p, (_node, info) in found.items()}
    model = coordinator_model(organisations.model_file, shapes)
    ck = tmp_path / "ck"
    opts = dict(OPTS, max_outer=2)
    first = model.solve(
        "prox-al", backend="flower", flower_grid=JoinedGrid(grid, found), checkpoint=str(ck),
        **dict(opts, max_outer=1),
    )  # fmt: skip
    again = model.solve(
        "prox-al", backend="flower", flower_grid=JoinedGrid(grid, found), resume=str(ck), **opts
    )
    channels = [r["channel"] for r in again.ledger]
    # the first run up to its checkpoint (its hello first), then this run's hello, then
    # the rest of the method's messages
    n = next(i for i in range(6, len(channels)) if channels[i] == "join")
    assert channels[:6] == ["join"] * 6 and "join" not in channels[6:n]
    assert again.ledger[:n] == first.ledger[:n]
    assert channels[n : n + 6] == ["join"] * 6
    assert again.ledger[n : n + 6] == first.ledger[:6]
    assert "join" not in channels[n + 6 :] and len(channels) > n + 6
