"""Flower's deployment engine on loopback (issue 15): a SuperLink and three SuperNodes on
127.0.0.1, each organisation started with ``fedmodel join`` in its own directory holding
only its own data file and its own key, the coordinator with ``fedmodel serve``; with TLS
(a CA and a server certificate the test makes) and SuperNode authentication (each party's
ECDSA key registered with the SuperLink, issue 22).

Each party's SuperNode runs its ClientApp tasks in its own process and polls promptly
(``fedmodel/runtime/trusted_supernode.py``); a round still costs tenths of a second to
seconds on a loaded machine (``benchmarks/RESULTS_flower.md``, where the timing targets
are): these tests are ``slow`` and use a few rounds. They check what ``serve`` and
``join`` say (progress, ``ready``), ``--timeout`` (status ``time_limit``, nothing left
running) and that ``join`` leaves no temporary directory, and stop every process they
started (by process group) whatever happens.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from problems import DEPLOYMENT_MODEL as MODEL
from problems import np_sites

pytest.importorskip("flwr")

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OPTS = dict(max_outer=1, max_inner=3, history=False, random_state=0)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(home: str) -> dict:
    env = dict(os.environ, FLWR_HOME=home, OPENBLAS_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([ROOT, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    # the SuperLink starts flower-superexec from PATH
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])
    return env


def make_tls(directory) -> dict:
    """A CA and a certificate for 127.0.0.1 it signs (what Flower's guide makes with
    openssl), written under ``directory``; returns their paths."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    pem = serialization.Encoding.PEM

    def cert(subject, key, issuer, issuer_key, ca, san=None):
        b = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if san:
            b = b.add_extension(x509.SubjectAlternativeName(san), critical=False)
        return b.sign(issuer_key, hashes.SHA256())

    import ipaddress

    ca_key, key = ec.generate_private_key(ec.SECP384R1()), ec.generate_private_key(ec.SECP384R1())
    ca = cert("fedmodel test CA", ca_key, "fedmodel test CA", ca_key, True)
    san = [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
    server = cert("127.0.0.1", key, "fedmodel test CA", ca_key, False, san)
    out = {
        "ca": directory / "ca.crt",
        "cert": directory / "server.pem",
        "key": directory / "server.key",
    }
    out["ca"].write_bytes(ca.public_bytes(pem))
    out["cert"].write_bytes(server.public_bytes(pem))
    out["key"].write_bytes(
        key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    os.chmod(out["key"], 0o600)
    return out


def make_node_key(path) -> str:
    """A SuperNode's ECDSA key pair, as ``ssh-keygen -t ecdsa -b 384 -N "" -f path`` makes
    it: the private key at ``path`` (0600); returns the public key line."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP384R1())
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.OpenSSH,
            serialization.NoEncryption(),
        )
    )
    os.chmod(path, 0o600)
    return (
        key.public_key()
        .public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
        .decode()
    )


def _bin(name: str) -> str:
    return os.path.join(os.path.dirname(sys.executable), name)


def _descendants(pids) -> set[int]:
    """Every live process below ``pids`` (the SuperLink starts its SuperExec, and that the
    ServerApp processes, in sessions of their own)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = set(), list(pids)
    while todo:
        for c in children.get(todo.pop(), []):
            if c not in out:
                out.add(c)
                todo.append(c)
    return out


def _stop(procs) -> None:
    below = _descendants([p.pid for p in procs])
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for p in procs:
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                pass
        for pid in below:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 10
        while sig == signal.SIGTERM and time.monotonic() < deadline:
            if all(p.poll() is not None for p in procs):
                break
            time.sleep(0.2)
    for p in procs:
        try:
            p.wait(5)
        except subprocess.TimeoutExpired:
            pass


def _wait_for(pred, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.2)
    raise TimeoutError(f"timed out waiting for {what}")


@pytest.fixture(scope="module")
def federation(tmp_path_factory):
    with loopback_federation(tmp_path_factory.mktemp("federation")) as fed:
        yield fed


def _join(fed, org, party, data, log, key, ready=None, socket_dir=None):
    """``fedmodel join`` of ``party`` in directory ``org`` (its data file ``data`` there),
    with the federation's opt-ins (``fed["reveal"]``); with ``fed["spy"]`` its party
    notes its masked stages in ``org / "masked.jsonl"`` (:data:`SPY_JOIN`)."""
    head = [_bin("fedmodel")]
    if fed.get("spy"):
        head = [sys.executable, "-c", SPY_JOIN, str(org / "masked.jsonl")]
    cmd = [*head, "join", str(fed["model"]), "--party", party, "--data", data,
           "--superlink", fed["link"], "--root-certificates", str(fed["tls"]["ca"]),
           "--auth-key", str(key), "--socket-dir", str(socket_dir or org / "run")]  # fmt: skip
    for name in fed.get("reveal", ()):
        cmd += ["--reveal", name]
    if ready is not None:
        cmd += ["--ready-file", str(ready)]
    return subprocess.Popen(
        cmd, cwd=org, env=_env(str(org)), start_new_session=True,
        stdout=open(log, "w"), stderr=subprocess.STDOUT,
    )  # fmt: skip


@contextlib.contextmanager
def loopback_federation(
    base, database: str | None = None, reveal: tuple[str, ...] = (), spy: bool = False
):
    """A SuperLink (TLS, SuperNode authentication) and three ``fedmodel join``
    organisations on 127.0.0.1 under ``base`` (a Path), each party's key registered with
    ``fedmodel register``; everything started is stopped on exit. ``database``: the
    SuperLink's ``--database`` (default: Flower's in-memory state); ``reveal``: the
    opt-ins every party enables (``fedmodel join --reveal``); ``spy``: every party notes
    its masked stages (:func:`_join`)."""
    model_path = base / "model.py"
    model_path.write_text(MODEL)
    sites = np_sites(3)
    port = _free_port()
    link = f"127.0.0.1:{port}"
    (base / "pki").mkdir()
    tls = make_tls(base / "pki")
    procs, joins = [], {}
    fed = {"base": base, "model": model_path, "link": link, "joins": joins, "sites": sites,
           "tls": tls, "keys": base / "parties.keys", "procs": {}, "reveal": reveal,
           "spy": spy}  # fmt: skip
    try:
        (base / "link").mkdir()
        db = ["--database", database] if database else []
        fed["superlink"] = subprocess.Popen(
            [_bin("flower-superlink"), "--ssl-ca-certfile", str(tls["ca"]),
             "--ssl-certfile", str(tls["cert"]), "--ssl-keyfile", str(tls["key"]),
             "--enable-supernode-auth", *db, "--host", "127.0.0.1", "--port", str(port)],
            env=_env(str(base / "link")), start_new_session=True,
            stdout=open(base / "link.log", "w"), stderr=subprocess.STDOUT,
        )  # fmt: skip
        procs.append(fed["superlink"])
        lines = []
        for i, (X0, X1) in enumerate(sites):
            org = base / f"org{i}"
            org.mkdir()
            # only its own data is here, and an array the model never reads
            np.savez(org / f"site{i}.npz", X0=X0, X1=X1, record_ids=np.arange(len(X0) + len(X1)))
            lines.append(f"site{i} " + make_node_key(org / f"site{i}.key"))
        fed["keys"].write_text("# party, its SuperNode's public key\n" + "\n".join(lines) + "\n")
        # the coordinator registers the parties' public keys (the SuperLink must be up)
        register = [_bin("fedmodel"), "register", str(model_path), "--superlink", link,
                    "--root-certificates", str(tls["ca"]), "--authorized-keys", str(fed["keys"])]  # fmt: skip
        deadline = time.monotonic() + 120
        while True:
            r = subprocess.run(register, env=_env(str(base / "link")), capture_output=True,
                               text=True, timeout=120)  # fmt: skip
            if r.returncode == 0 or time.monotonic() > deadline:
                break
            time.sleep(1.0)
        assert r.returncode == 0, r.stdout + r.stderr
        assert [line.split(":")[0] for line in r.stdout.splitlines() if ": node " in line] == [
            "site0",
            "site1",
            "site2",
        ]
        for i in range(3):
            org = base / f"org{i}"
            ready, log = org / "ready.json", base / f"join{i}.log"
            p = _join(fed, org, f"site{i}", f"site{i}.npz", log, org / f"site{i}.key", ready)
            procs.append(p)
            fed["procs"][f"site{i}"] = p
            joins[f"site{i}"] = (org, ready, log)
        for name, (_org, ready, _log) in joins.items():
            _wait_for(ready.exists, 180, f"{name} to join")
        yield fed
    finally:
        _stop(procs)


def _serial(sites, **opts):
    from fedmodel.models import neyman_pearson_model

    return neyman_pearson_model(sites, r=0.45).solve("prox-al", **opts)


# `fedmodel serve` whose FAB gets the code argv[2] appended to its file argv[1] (the relay:
# importing it, as Flower's own flwr-clientapp does with the FAB's ClientApp, runs that
# code; the ServerApp module: the coordinator's ServerApp process runs it)
APPENDED_SERVE = """
import os, sys
import fedmodel.flower_app as flower_app
from fedmodel.cli import main

target, code = sys.argv.pop(1), sys.argv.pop(1)
make_app_dir = flower_app.make_app_dir

def appended(directory, model_path):
    make_app_dir(directory, model_path)
    with open(os.path.join(directory, target), "a") as fh:
        fh.write("\\n" + code + "\\n")
    return directory

flower_app.make_app_dir = appended
sys.exit(main(sys.argv[1:]))
"""


def tampered_relay(sentinel) -> tuple[str, str]:
    """A FAB relay that writes ``sentinel`` when imported."""
    return (
        "fedmodel_relay.py",
        f"with open({str(sentinel)!r}, 'a') as _fh: _fh.write('ran the FAB relay\\n')",
    )


# the ServerApp's view of secure aggregation, one JSON line per aggregation in the file
# SPY: what it received from each party in the masked stage and the sums it unmasked
SERVER_SPY = """
import json as _json
from fedmodel.runtime import secure_aggregation as _sa

_collect, _sum = _sa._collect_masked, _sa._secure_sum
_received = {}

def _collect_masked(runtime, requests):
    replies, dropped = _collect(runtime, requests)
    _received.update({n: [int(v) for v in r["masked"]] for n, r in replies.items()})
    return replies, dropped

def _secure_sum(runtime, kind, *args, **kw):
    _received.clear()
    out = _sum(runtime, kind, *args, **kw)
    sums = {k: [float(v) for v in s] for k, s in out.sums.items()}
    with open(SPY, "a") as fh:
        fh.write(_json.dumps({"kind": kind, "received": _received, "sums": sums}) + "\\n")
    return out

_sa._collect_masked, _sa._secure_sum = _collect_masked, _secure_sum
"""


def server_spy(path) -> tuple[str, str]:
    """The ServerApp module of the FAB with :data:`SERVER_SPY` writing to ``path``."""
    return "fedmodel_server.py", f"SPY = {str(path)!r}\n" + SERVER_SPY


# `fedmodel join` (argv[2:]) whose party notes, in the file argv[1] (one JSON line per
# masked stage), the vector it masks and what it sends; while the file argv[1] + ".stop"
# holds "KIND N", its SuperNode is killed (SIGKILL) in the N-th masked stage of KIND
SPY_JOIN = """
import json, os, signal, sys
from fedmodel.cli import main
from fedmodel.runtime import secure_aggregation as sa

spy = sys.argv.pop(1)
ready = sys.argv[sys.argv.index("--ready-file") + 1]
mask, counts = sa.SecAggClient.mask, {}

def spying(self, ciphertexts, vec, what):
    out = mask(self, ciphertexts, vec, what)
    with open(spy, "a") as fh:
        fh.write(json.dumps({"what": what, "vec": [float(v) for v in vec],
                             "masked": [int(v) for v in out]}) + "\\n")
    if os.path.exists(spy + ".stop"):
        kind, n = open(spy + ".stop").read().split()
        if repr(kind) in what:
            counts[kind] = counts.get(kind, 0) + 1
            if counts[kind] == int(n):
                with open(ready) as fh:
                    os.kill(json.load(fh)["supernode_pid"], signal.SIGKILL)
    return out

sa.SecAggClient.mask = spying
sys.exit(main(sys.argv[1:]))
"""


# runs argv[1:] with Ctrl-C (SIGINT) at its default, as a command typed at a terminal: a
# test process started in the background by a non-interactive shell (a CI job, `cmd &`)
# ignores SIGINT, its children inherit that, and Python then leaves SIGINT ignored (a
# `fedmodel serve` started so ran on to "optimal" after its Ctrl-C)
DEFAULT_CTRL_C = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "os.execv(sys.argv[1], sys.argv[1:])"
)


def _with_default_ctrl_c(cmd: list[str]) -> list[str]:
    return [sys.executable, "-c", DEFAULT_CTRL_C, *cmd]


def _serve(fed, out, ledger, appended=None, timeout=900, method="prox-al", **opts):
    """``fedmodel serve --method method`` (with Python's own Ctrl-C handling whatever this
    process does with SIGINT); ``appended``: ``(file, code)``, code appended to a file of
    its FAB (:func:`tampered_relay`, :func:`server_spy`)."""
    head = _with_default_ctrl_c([_bin("fedmodel")])
    if appended is not None:
        head = [sys.executable, "-c", APPENDED_SERVE, *appended]
    cmd = head + ["serve", str(fed["model"]), "--method", method, "--superlink", fed["link"],
           "--root-certificates", str(fed["tls"]["ca"]), "--authorized-keys", str(fed["keys"]),
           "--out", str(out), "--ledger", str(ledger), "--timeout", str(timeout)]  # fmt: skip
    for k, v in opts.items():
        cmd += ["-o", f"{k}={v}"]
    return subprocess.Popen(cmd, env=_env(str(fed["base"] / "serve")), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)  # fmt: skip


def _served(fed, tmp_path, **opts) -> tuple[dict, str]:
    """:func:`_serve` that succeeds: the result (written to ``tmp_path / "result.json"``,
    the ledger beside it) and what ``serve`` printed."""
    out, ledger = tmp_path / "result.json", tmp_path / "ledger.jsonl"
    proc = _serve(fed, out, ledger, **opts)
    try:
        text, _ = proc.communicate(timeout=1000)
    finally:
        _stop([proc])
    assert proc.returncode == 0, text[-4000:]
    return json.loads(out.read_text()), text


def test_a_supernode_whose_key_is_not_registered_cannot_join(federation, tmp_path):
    """Someone with site1's data file but not site1's key cannot take its place: the
    SuperLink refuses the SuperNode, and ``fedmodel join`` says so and exits non-zero."""
    fed = federation
    org = tmp_path / "rogue"
    org.mkdir()
    X0, X1 = fed["sites"][1]
    np.savez(org / "site1.npz", X0=X0, X1=X1)
    make_node_key(org / "rogue.key")
    log = tmp_path / "rogue.log"
    p = _join(fed, org, "site1", "site1.npz", log, org / "rogue.key")
    try:
        code = p.wait(timeout=180)
    finally:
        _stop([p])
    text = log.read_text()
    assert code == 1, text[-3000:]
    said = [line for line in text.splitlines() if line.startswith("fedmodel: error:")]
    assert len(said) == 1, text[-3000:]
    assert "the Flower SuperNode of party 'site1' exited with code 1" in said[0]
    assert "Failed to activate SuperNode" in said[0]  # Flower's reason, in the message


def test_three_organisations_solve_prox_al(federation, tmp_path):
    """The solve, by a coordinator whose FAB carries a relay that would run its own code
    on the parties: each party runs its own fedmodel's relay (``fedmodel join``'s trusted
    ``flwr-clientapp``), the FAB's code never runs there, and the solve is unchanged."""
    fed = federation
    sentinel = tmp_path / "fab-relay-ran"
    for i in range(3):  # each organisation holds its own data file only
        assert sorted(f for f in os.listdir(fed["joins"][f"site{i}"][0]) if f.endswith(".npz")) == [
            f"site{i}.npz"
        ]
    out, ledger = tmp_path / "result.json", tmp_path / "ledger.jsonl"
    proc = _serve(fed, out, ledger, appended=tampered_relay(sentinel), **OPTS)
    try:
        text, _ = proc.communicate(timeout=1000)
    finally:
        _stop([proc])
    assert proc.returncode == 0, text[-4000:]
    assert not sentinel.exists(), sentinel.read_text()
    res = json.loads(out.read_text())
    ref = _serial(fed["sites"], **OPTS)
    # serve's progress: the parties joined, then every round with the parties that answered
    assert re.search(r"fedmodel serve: parties joined: site0 \(node \d+\), site1", text), text
    for r in range(1, ref.rounds["communication"] + 1):
        line = re.search(rf"fedmodel serve: round {r}: (.*) answered \(", text)
        assert line and sorted(line.group(1).split(", ")) == ["site0", "site1", "site2"], text
    # each join said what it loaded (names and shapes; the array the model does not read
    # is named as not sent) and that it was ready
    for i, (X0, X1) in enumerate(fed["sites"]):
        said = fed["joins"][f"site{i}"][2].read_text()
        assert (
            f"fedmodel join: party 'site{i}': loaded site{i}.npz: X0 {X0.shape}, X1 {X1.shape}; "
            f"not read by the model (nothing about it is sent): record_ids ({len(X0) + len(X1)},)"
        ) in said
        assert f"fedmodel join: party 'site{i}' ready: SuperNode " in said
    assert res["extra"]["backend"] == "flower"
    assert res["rounds"] == ref.rounds
    x = np.asarray(res["x"])
    assert np.max(np.abs(x - ref.x)) <= 1e-10 * max(1.0, np.max(np.abs(ref.x)))
    rows = [json.loads(line) for line in ledger.read_text().splitlines()]
    # the hello exchange first: each party reported the shapes of the arrays the model
    # reads (X0, X1: two integers each), not its other array
    hello = [r for r in rows if r["channel"] == "join"]
    assert [(r["sender"], r["receiver"], r["kind"]) for r in hello] == [
        x
        for i in range(3)
        for x in (("server", f"site{i}", "hello"), (f"site{i}", "server", "hello"))
    ]
    for r in hello[1::2]:
        assert r["shapes"] == {"X0": [2], "X1": [2]} and r["floats"] == 4, r
    strip = [{k: v for k, v in r.items() if k != "seconds"} for r in rows if r["channel"] != "join"]
    from fedmodel.result import _jsonable

    assert strip == [{k: v for k, v in _jsonable(r).items() if k != "seconds"} for r in ref.ledger]
    # what left each client: small vectors of the model's size, never a sample dimension
    samples = {a.shape[0] for s in fed["sites"] for a in s}
    for r in rows:
        if r["sender"] != "server":
            for shape in r["shapes"].values():
                assert not samples & set(shape or []), r


def test_a_coordinator_asking_the_hessian_gets_the_parties_refusal(federation, tmp_path):
    """The parties joined with their defaults: a coordinator asking prox-al's Newton inner
    solver (each party's d x d Hessian) is refused where a party is built, before any
    round: ``serve`` fails with the refusal naming the party and the opt-in, and no Hessian
    travels."""
    out, ledger = tmp_path / "result.json", tmp_path / "ledger.jsonl"
    proc = _serve(federation, out, ledger, **OPTS, inner_solver="newton")
    try:
        text, _ = proc.communicate(timeout=1000)
    finally:
        _stop([proc])
    assert proc.returncode != 0, text[-4000:]
    assert "refuses its build" in text and "opt-in 'hessian'" in text, text[-4000:]
    assert any(f"party 'site{i}'" in text for i in range(3)), text[-4000:]
    assert "Traceback" not in text, text[-4000:]
    rows = [json.loads(line) for line in ledger.read_text().splitlines()] if ledger.exists() else []
    assert not any("hessian" in r["shapes"] for r in rows if r["sender"] != "server")


def test_parties_that_enabled_the_hessian_solve_with_newton(tmp_path_factory, tmp_path):
    """The same federation with every party joined with ``--reveal hessian``: the Newton
    inner solver runs and gives the serial iterates."""
    opts = dict(OPTS, inner_solver="newton")
    with loopback_federation(tmp_path_factory.mktemp("hessian"), reveal=("hessian",)) as fed:
        for i in range(3):
            said = fed["joins"][f"site{i}"][2].read_text()
            assert f"fedmodel join: party 'site{i}': opt-ins enabled: hessian" in said
        res, _ = _served(fed, tmp_path, **opts)
        ref = _serial(fed["sites"], **opts)
        assert res["rounds"] == ref.rounds
        x = np.asarray(res["x"])
        assert np.max(np.abs(x - ref.x)) <= 1e-10 * max(1.0, np.max(np.abs(ref.x)))
        rows = [json.loads(line) for line in (tmp_path / "ledger.jsonl").read_text().splitlines()]
        assert any("hessian" in r["shapes"] for r in rows if r["sender"] != "server")


def _file_model(fed):
    """The model of the model file with every party's real data (the serial reference)."""
    from fedmodel.deploy import load_model_file

    mf = load_model_file(fed["model"])
    return mf.build({f"site{i}": {"X0": X0, "X1": X1} for i, (X0, X1) in enumerate(fed["sites"])})


def _gather_party_files(fed, ck):
    """Each organisation's checkpoint files (written in its own checkpoint directory, under
    the run token the coordinator named) copied next to the coordinator's manifest, as
    the organisations would hand them over to resume elsewhere."""
    import shutil

    from fedmodel.runtime.checkpoint import run_token

    for name, (org, _ready, _log) in fed["joins"].items():
        own = org / "fedmodel-checkpoints" / name / run_token(str(ck))
        files = [f for f in os.listdir(own) if f.startswith("party-")]
        assert files, f"{name} wrote no checkpoint file in its own directory"
        for f in files:
            shutil.copy(own / f, ck / f)


def test_serve_is_started_with_pythons_ctrl_c_whatever_the_tests_sigint(tmp_path):
    """The tests' `fedmodel serve` gets Python's KeyboardInterrupt on Ctrl-C also when
    this process ignores SIGINT (as a job started in the background by a non-interactive
    shell does)."""
    probe = [sys.executable, "-c", "import signal; print(signal.getsignal(signal.SIGINT))"]
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        ignored = subprocess.run(probe, capture_output=True, text=True, timeout=60).stdout
        default = subprocess.run(
            _with_default_ctrl_c(probe), capture_output=True, text=True, timeout=60
        ).stdout
    finally:
        signal.signal(signal.SIGINT, previous)
    assert ignored.strip() == "1"  # Handlers.SIG_IGN: inherited, and left so by Python
    assert "default_int_handler" in default


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl_c", "sigterm"])
def test_ctrl_c_on_the_coordinator_returns_interrupted(federation, tmp_path, sig):
    """Ctrl-C, or SIGTERM (kill, a service manager), on ``fedmodel serve``: status
    interrupted, a checkpoint that resumes to the uninterrupted answer, and nothing left
    running in the SuperLink."""
    fed = federation
    before = _runs(fed)
    out, ledger = tmp_path / "result.json", tmp_path / "ledger.jsonl"
    ck = tmp_path / "ck"
    # a run that cannot end before the Ctrl-C: eps = 1e-16 is below the rounding of the
    # measured stationarity (~3e-15 here; the certificate holds at 1e-14 after 16 outer
    # iterations), and 60 outer iterations of at most 3 inner ones take ~240 rounds (at
    # 0.25-2 s a round)
    opts = dict(OPTS, max_outer=60, eps=1e-16, checkpoint=str(ck))
    proc = _serve(fed, out, ledger, **opts)
    try:
        # Ctrl-C once serve has printed its 10th round
        head = []
        for line in proc.stdout:
            head.append(line)
            if "fedmodel serve: round 10:" in line:
                break
        proc.send_signal(sig)  # Ctrl-C (or SIGTERM) on `fedmodel serve`
        rest, _ = proc.communicate(timeout=600)
        text = "".join(head) + rest
    finally:
        _stop([proc])
    assert proc.returncode == 130, text[-4000:]
    res = json.loads(out.read_text())
    assert res["status"] == "interrupted", res["message"]
    assert "interrupted" in text
    runs = {r: s for r, s in _runs(fed).items() if r not in before}
    assert len(runs) == 1 and all(s.startswith("finished") for s in runs.values()), runs
    _wait_for(lambda: not _live_task_processes(fed), 60, "the ServerApp process to exit")
    # the checkpoint of the returned point resumes to the uninterrupted answer
    _gather_party_files(fed, ck)
    serial_opts = {k: v for k, v in opts.items() if k != "checkpoint"}
    ref = _file_model(fed).solve("prox-al", **serial_opts)
    assert res["rounds"]["outer"] < ref.rounds["outer"] == 60  # stopped by the Ctrl-C
    again = _file_model(fed).solve("prox-al", resume=str(ck), **serial_opts)
    assert again.rounds == ref.rounds
    assert np.max(np.abs(again.x - ref.x)) <= 1e-10 * max(1.0, np.max(np.abs(ref.x)))


def _runs(fed) -> dict[int, str]:
    """Run id -> its status in the SuperLink (``"finished:completed"``, ``"running"`` ...)."""
    from flwr.common.serde import run_from_proto
    from flwr.proto.control_pb2 import ListRunsRequest

    from fedmodel.flower_app import control_client

    client = control_client(fed["link"], insecure=False, root_certificates=str(fed["tls"]["ca"]))
    try:
        res = client.ListRuns(ListRunsRequest())
    finally:
        client.close()
    out = {}
    for proto in res.run_dict.values():
        run = run_from_proto(proto)
        out[run.run_id] = ":".join(p for p in (run.status.status, run.status.sub_status) if p)
    return out


def _live_task_processes(fed) -> list[str]:
    """The command lines of the live (not zombie) processes below the SuperLink other
    than its SuperExec: the ServerApp processes of runs."""
    out = []
    for pid in _descendants([fed["superlink"].pid]):
        try:
            with open(f"/proc/{pid}/stat") as fh:
                state = fh.read().rsplit(")", 1)[1].split()[0]
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                cmd = fh.read().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if state != "Z" and "flower-superexec" not in cmd:
            out.append(cmd)
    return out


def test_timeout_ends_the_run_with_time_limit_and_leaves_nothing_running(federation, tmp_path):
    """``fedmodel serve --timeout`` on a solve that would run far longer: the run ends
    with status ``time_limit``, a point and a checkpoint (``OUT.checkpoint``), and once
    ``serve`` returns no run is active in the SuperLink and no ServerApp process is left."""
    fed = federation
    out, ledger = tmp_path / "result.json", tmp_path / "ledger.jsonl"
    limit = 30
    before = _runs(fed)
    # (eps = 1e-16 is below the rounding of the measured stationarity, ~3e-15: never met;
    # at 1e-14 the certificate holds after ~6,000 rounds and at 1e-12 after 46, which a
    # fast run of the federation finishes within the 30 s: "optimal" where this waits for
    # time_limit, and its ServerApp still running when the next test started)
    proc = _serve(fed, out, ledger, timeout=limit, eps=1e-16, max_outer=1000, max_inner=1000)
    try:
        text, _ = proc.communicate(timeout=limit + 600)
    finally:
        _stop([proc])
    assert proc.returncode == 0, text[-4000:]
    res = json.loads(out.read_text())
    assert res["status"] == "time_limit", res["message"]
    assert f"{res['status']}: " in text and "round 1: " in text
    x = np.asarray(res["x"])
    assert x.shape == (5,) and np.all(np.isfinite(x))
    ck = tmp_path / "result.json.checkpoint"
    assert (ck / "manifest.json").is_file(), res["message"]
    assert f"resume='{ck}'" in res["message"] or "resume=" in res["message"], res["message"]
    runs = {r: s for r, s in _runs(fed).items() if r not in before}
    assert len(runs) == 1 and all(s.startswith("finished") for s in runs.values()), runs
    _wait_for(lambda: not _live_task_processes(fed), 60, "the ServerApp process to exit")


def test_join_removes_its_temporary_directory_on_sigterm_and_ctrl_c(tmp_path):
    """Without ``--socket-dir`` ``fedmodel join`` makes a private temporary directory (its
    socket, key, SuperNode home); it is gone after SIGTERM or Ctrl-C (here while the
    SuperNode waits for a SuperLink that is not there)."""
    from problems import DEPLOYMENT_MODEL

    (tmp_path / "model.py").write_text(DEPLOYMENT_MODEL)
    X0, X1 = np_sites(3)[0]
    np.savez(tmp_path / "site0.npz", X0=X0, X1=X1)
    import tempfile

    for sig in (signal.SIGTERM, signal.SIGINT):
        # (a short one: a Unix socket's path has at most 107 bytes)
        temp = Path(tempfile.mkdtemp(prefix="fj-"))
        log = tmp_path / f"join-{sig.name}.log"
        env = dict(_env(str(tmp_path)), TMPDIR=str(temp))
        p = subprocess.Popen(
            [_bin("fedmodel"), "join", str(tmp_path / "model.py"), "--party", "site0",
             "--data", str(tmp_path / "site0.npz"), "--superlink", f"127.0.0.1:{_free_port()}",
             "--insecure"],
            cwd=tmp_path, env=env, start_new_session=True, stdout=open(log, "w"),
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            _wait_for(
                lambda log=log, p=p: (
                    p.poll() is not None or "Starting Flower SuperNode" in log.read_text()
                ),
                180,
                "the SuperNode",
            )
            assert p.poll() is None, log.read_text()
            assert [d.name for d in temp.iterdir() if d.name.startswith("fedmodel-join-")]
            os.kill(p.pid, sig)
            code = p.wait(timeout=120)
        finally:
            _stop([p])
        said = log.read_text()
        assert code == 0, said[-3000:]
        assert "fedmodel join: party 'site0' stopped" in said
        assert not [d.name for d in temp.iterdir() if d.name.startswith("fedmodel-join-")], said
        temp.rmdir()


def test_a_supernode_killed_mid_solve_is_a_client_failure(federation, tmp_path):
    """(Last: it ends party site1 of the module's federation.)"""
    fed = federation
    out, ledger = tmp_path / "result.json", tmp_path / "ledger.jsonl"
    ck = tmp_path / "ck"  # the manifest; each party writes its state in its own directory
    _org, ready, log = fed["joins"]["site1"]
    info = json.loads(ready.read_text())
    seen = log.read_text().count("Receiving: query.fedmodel")
    opts = dict(OPTS, max_outer=3, client_timeout=20, checkpoint=str(ck))
    proc = _serve(fed, out, ledger, **opts)
    try:
        # once the first outer iteration (and its checkpoint) is done and the second has
        # begun at site1, its SuperNode goes away
        _wait_for(
            lambda: log.read_text().count("Receiving: query.fedmodel") >= seen + 12, 900, "rounds"
        )
        os.kill(info["supernode_pid"], signal.SIGKILL)
        # the organisation's `fedmodel join` notices, says so and exits non-zero (rather
        # than living on with a defunct child)
        join = fed["procs"]["site1"]
        assert join.wait(timeout=60) == 1
        assert "the Flower SuperNode of party 'site1' was killed by signal SIGKILL" in (
            log.read_text()
        )
        text, _ = proc.communicate(timeout=600)
    finally:
        _stop([proc])
    assert proc.returncode == 0, text[-4000:]
    res = json.loads(out.read_text())
    assert res["status"] == "client_failure", res["message"]
    assert res["failure"]["client"] == "site1" and res["failure"]["kind"] == "dead"
    assert res["rounds"]["outer"] >= 1  # the last consistent iterate: a completed iteration
    # nothing lost: the periodic checkpoint (each party's state written by the party)
    # resumes, here on the serial backend, to the uninterrupted run's answer
    assert str(ck) in res["message"]
    assert not [f for f in os.listdir(ck) if f.startswith("party-")]
    _gather_party_files(fed, ck)
    serial_opts = {k: v for k, v in opts.items() if k not in ("checkpoint", "client_timeout")}
    ref = _file_model(fed).solve("prox-al", **serial_opts)
    again = _file_model(fed).solve("prox-al", resume=str(ck), **serial_opts)
    assert again.rounds == ref.rounds
    assert np.max(np.abs(again.x - ref.x)) <= 1e-10 * max(1.0, np.max(np.abs(ref.x)))


# -- secure aggregation over the deployment (docs/privacy.md) -----------------------------------
#: fedprox on the model file's model (its class-1 constraints through the penalty)
FEDPROX = dict(method="fedprox", penalty=10.0, max_rounds=3, history=False)


@pytest.fixture(scope="module")
def masked_federation(tmp_path_factory):
    """A federation whose parties note what they mask and send (:data:`SPY_JOIN`)."""
    with loopback_federation(tmp_path_factory.mktemp("masked"), spy=True) as fed:
        yield fed


def _masked_stages(fed, party) -> list[dict]:
    path = fed["joins"][party][0] / "masked.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _rel(x, ref) -> float:
    return float(np.max(np.abs(np.asarray(x) - ref)) / np.max(np.abs(ref)))


def test_secure_aggregation_masks_each_party_and_keeps_the_plain_iterates(
    masked_federation, tmp_path
):
    """fedprox with ``secure_aggregation=True`` over the deployment gives the plain serial
    run's iterates to 1e-9 relative. In every aggregation the ServerApp receives from each
    party exactly what the party sent, which decodes to nothing like the party's true
    vector, and so does the sum of the masked vectors without the unmask stage; the sums it
    unmasks are the sums of the parties' true vectors to the fixed point's resolution."""
    from fedmodel.runtime.secure_aggregation import MODULUS, SecureAggregation, decode

    fed = masked_federation
    parties = list(fed["joins"])
    before = {p: len(_masked_stages(fed, p)) for p in parties}
    spy = tmp_path / "server.jsonl"
    res, _ = _served(fed, tmp_path, appended=server_spy(spy), secure_aggregation=True, **FEDPROX)
    plain = {k: v for k, v in FEDPROX.items() if k != "method"}
    ref = _file_model(fed).solve("fedprox", **plain)
    assert res["status"] == ref.status == "max_iterations", res["message"]
    assert _rel(res["x"], ref.x) <= 1e-9
    secure = res["privacy"]["secure_aggregation"]
    assert secure["on"] and secure["dropouts"] == []
    assert secure["messages"] == ["evaluate", "fed_round"]
    seen = [json.loads(line) for line in spy.read_text().splitlines()]
    sent = {p: _masked_stages(fed, p)[before[p] :] for p in parties}
    # three rounds and the certificate, each one aggregation with every party masking once
    assert [s["kind"] for s in seen] == ["fed_round"] * 3 + ["evaluate"]
    assert all(len(sent[p]) == len(seen) for p in parties), {p: len(s) for p, s in sent.items()}
    cfg = SecureAggregation()
    bits, tol = cfg.fraction_bits(len(parties)), cfg.resolution(len(parties))
    for k, agg in enumerate(seen):
        true = {p: np.asarray(sent[p][k]["vec"]) for p in parties}
        received = {p: np.asarray(agg["received"][p], dtype=np.int64) for p in parties}
        for p in parties:
            assert repr(agg["kind"]) in sent[p][k]["what"]
            assert received[p].tolist() == sent[p][k]["masked"]  # what the party sent
            # the server's best reading of one party's masked vector
            assert np.abs(decode(received[p], bits) - true[p]).max() > 1.0
        total = sum(true.values())
        unmasked = np.concatenate([np.asarray(v) for v in agg["sums"].values()])
        assert np.abs(unmasked - total).max() <= tol
        # without the unmask stage's shares the sum of the masked vectors is noise too
        raw = decode(sum(received.values()) & (MODULUS - 1), bits)
        assert np.abs(raw - total).max() > 1.0


def test_secure_aggregation_on_prox_al_keeps_the_plain_iterates(masked_federation, tmp_path):
    """prox-al with ``secure_aggregation=True`` over the deployment takes its route of sums
    (quasi-newton) and gives the iterates of the plain serial run with the same options."""
    fed = masked_federation
    res, _ = _served(fed, tmp_path, secure_aggregation=True, **OPTS)
    ref = _file_model(fed).solve(
        "prox-al",
        inner_solver="quasi-newton",
        local_directions=False,
        constraint_curvature=False,
        **OPTS,
    )
    assert res["status"] == ref.status, res["message"]
    assert (res["rounds"]["outer"], res["rounds"]["inner"]) == (
        ref.rounds["outer"],
        ref.rounds["inner"],
    )
    assert _rel(res["x"], ref.x) <= 1e-9
    secure = res["privacy"]["secure_aggregation"]
    assert secure["on"] and secure["dropouts"] == []
    assert secure["messages"] == ["curvature_w", "evaluate", "outer", "start"]


def test_dp_is_given_on_the_command_line(masked_federation, tmp_path):
    """``-o "dp={...}"`` (the fields of ``fm.DP``) with secure aggregation, under
    ``--timeout`` (no default checkpoint: dp refuses one): the parties add the noise in
    shares, and the run spends at most its epsilon on its three rounds and certificate."""
    dp = "{'epsilon': 3.0, 'delta': 1e-5, 'clip': 1.0}"
    opts = dict(FEDPROX, weights="uniform", secure_aggregation=True, dp=dp)
    res, _ = _served(masked_federation, tmp_path, **opts)
    p = res["privacy"]
    assert res["status"] == "max_iterations", res["message"]
    assert p["noise"] == "distributed (client shares)" and p["mechanisms"] == 4
    assert p["target_epsilon"] == 3.0 and p["epsilon"] <= 3.0 and p["delta"] == 1e-5
    assert not (tmp_path / "result.json.checkpoint").exists()


def test_a_supernode_stopped_in_the_masked_stage_is_recovered(masked_federation, tmp_path):
    """(Last: it ends party site0 of its federation.) fedprox with secure aggregation;
    site0's SuperNode is killed while its party masks its second ``fed_round``: the round
    is the sum over site1 and site2 (the threshold is 2 of 3), unmasked with the survivors'
    shares of site0's key, and the run goes on without site0. ``dropouts`` names it, and the
    iterates are those of the processes backend whose site0 worker exits at that stage."""
    from fedmodel.algorithms.baselines.fedavg import FedProxOptions, run_fedavg
    from fedmodel.runtime.faults import Fault

    fed = masked_federation
    org, _ready, log = fed["joins"]["site0"]
    (org / "masked.jsonl.stop").write_text("fed_round 2")
    res, _ = _served(fed, tmp_path, secure_aggregation=True, client_timeout=20, **FEDPROX)
    join = fed["procs"]["site0"]
    assert join.wait(timeout=60) == 1
    assert "the Flower SuperNode of party 'site0' was killed by signal SIGKILL" in log.read_text()
    assert res["status"] == "max_iterations", res["message"]
    dropouts = [{"round": 2, "kind": "fed_round", "clients": ["site0"]}]
    assert res["privacy"]["secure_aggregation"]["dropouts"] == dropouts
    plain = {k: v for k, v in FEDPROX.items() if k != "method"}
    opts = FedProxOptions(**plain, secure_aggregation=True, backend="processes", workers=3)
    exits = {"site0": Fault("exit", round=2, kinds=("secagg_masked",))}
    ref = run_fedavg(_file_model(fed).compile(), opts, "fedprox", faults=exits)
    assert ref.privacy["secure_aggregation"]["dropouts"] == dropouts
    assert _rel(res["x"], ref.x) <= 1e-9
