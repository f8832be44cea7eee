"""Flower's deployment engine on loopback (issue 15): a SuperLink and three SuperNodes on
127.0.0.1, each organisation started with ``fedmodel join`` in its own directory holding
only its own data file, the coordinator with ``fedmodel serve``.

Flower's deployment engine starts a fresh ClientApp process for every message and a
SuperNode polls for messages every 3 s, so a round costs seconds (see
``benchmarks/RESULTS_flower.md``): these tests are ``slow`` and use a few rounds. They
stop every process they started (by process group) whatever happens.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from problems import np_sites

pytest.importorskip("flwr")

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OPTS = dict(max_outer=1, max_inner=3, history=False, random_state=0)

MODEL = textwrap.dedent(
    """
    import cvxpy as cp
    import fedmodel as fm

    PARTIES = ["site0", "site1", "site2"]


    def build(data):
        model = fm.Model("np-deploy")
        d = data[PARTIES[0]]["X0"].shape[1]
        w = model.variable(d, name="w")
        for name in PARTIES:
            X0, X1 = data[name]["X0"], data[name]["X1"]
            site = model.client(name)
            A0 = site.data(X0, name="class0")
            A1 = site.data(X1, name="class1")
            site.minimize(cp.sum(cp.logistic(A0 @ w)) / (X0.shape[0] * len(PARTIES)))
            site.subject_to(cp.sum(cp.logistic(-(A1 @ w))) / X1.shape[0] <= 0.45)
        return model
    """
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(home: str) -> dict:
    env = dict(os.environ, FLWR_HOME=home, OPENBLAS_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([ROOT, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


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


@contextlib.contextmanager
def loopback_federation(base):
    """A SuperLink and three ``fedmodel join`` organisations on 127.0.0.1 under ``base``
    (a Path); everything started is stopped on exit."""
    model_path = base / "model.py"
    model_path.write_text(MODEL)
    sites = np_sites(3)
    port = _free_port()
    link = f"127.0.0.1:{port}"
    procs, joins = [], {}
    try:
        (base / "link").mkdir()
        procs.append(
            subprocess.Popen(
                [_bin("flower-superlink"), "--insecure", "--database", str(base / "link" / "state.db"),
                 "--host", "127.0.0.1", "--port", str(port)],
                env=_env(str(base / "link")), start_new_session=True,
                stdout=open(base / "link.log", "w"), stderr=subprocess.STDOUT,
            )
        )  # fmt: skip
        for i, (X0, X1) in enumerate(sites):
            org = base / f"org{i}"
            org.mkdir()
            np.savez(org / f"site{i}.npz", X0=X0, X1=X1)  # only its own data is here
            ready = org / "ready.json"
            p = subprocess.Popen(
                [_bin("fedmodel"), "join", str(model_path), "--party", f"site{i}",
                 "--data", f"site{i}.npz", "--superlink", link, "--insecure",
                 "--socket-dir", str(org / "run"), "--ready-file", str(ready)],
                cwd=org, env=_env(str(org)), start_new_session=True,
                stdout=open(base / f"join{i}.log", "w"), stderr=subprocess.STDOUT,
            )  # fmt: skip
            procs.append(p)
            joins[f"site{i}"] = (org, ready, base / f"join{i}.log")
        for name, (_org, ready, _log) in joins.items():
            _wait_for(ready.exists, 180, f"{name} to join")
        yield {"base": base, "model": model_path, "link": link, "joins": joins, "sites": sites}
    finally:
        _stop(procs)


def _serial(sites, **opts):
    from fedmodel.models import neyman_pearson_model

    return neyman_pearson_model(sites, r=0.45).solve("prox-al", **opts)


def _serve(fed, out, ledger, **opts):
    cmd = [_bin("fedmodel"), "serve", str(fed["model"]), "--superlink", fed["link"],
           "--insecure", "--out", str(out), "--ledger", str(ledger), "--timeout", "900"]  # fmt: skip
    for k, v in opts.items():
        cmd += ["-o", f"{k}={v}"]
    return subprocess.Popen(cmd, env=_env(str(fed["base"] / "serve")), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)  # fmt: skip


def test_three_organisations_solve_prox_al(federation, tmp_path):
    fed = federation
    for i in range(3):  # each organisation holds its own data file only
        assert sorted(f for f in os.listdir(fed["joins"][f"site{i}"][0]) if f.endswith(".npz")) == [
            f"site{i}.npz"
        ]
    out, ledger = tmp_path / "result.json", tmp_path / "ledger.jsonl"
    proc = _serve(fed, out, ledger, **OPTS)
    try:
        text, _ = proc.communicate(timeout=1000)
    finally:
        _stop([proc])
    assert proc.returncode == 0, text[-4000:]
    res = json.loads(out.read_text())
    ref = _serial(fed["sites"], **OPTS)
    assert res["extra"]["backend"] == "flower"
    assert res["rounds"] == ref.rounds
    x = np.asarray(res["x"])
    assert np.max(np.abs(x - ref.x)) <= 1e-10 * max(1.0, np.max(np.abs(ref.x)))
    rows = [json.loads(line) for line in ledger.read_text().splitlines()]
    strip = [{k: v for k, v in r.items() if k != "seconds"} for r in rows]
    from fedmodel.result import _jsonable

    assert strip == [{k: v for k, v in _jsonable(r).items() if k != "seconds"} for r in ref.ledger]
    # what left each client: small vectors of the model's size, never a sample dimension
    samples = {a.shape[0] for s in fed["sites"] for a in s}
    for r in rows:
        if r["sender"] != "server":
            for shape in r["shapes"].values():
                assert not samples & set(shape or []), r


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


def test_ctrl_c_on_the_coordinator_returns_interrupted(federation, tmp_path):
    fed = federation
    out, ledger = tmp_path / "result.json", tmp_path / "ledger.jsonl"
    ck = tmp_path / "ck"
    _org, _ready, log = fed["joins"]["site0"]
    seen = log.read_text().count("Receiving: query.fedmodel")
    opts = dict(OPTS, max_outer=3, checkpoint=str(ck))
    proc = _serve(fed, out, ledger, **opts)
    try:
        _wait_for(
            lambda: log.read_text().count("Receiving: query.fedmodel") >= seen + 10, 900, "rounds"
        )
        proc.send_signal(signal.SIGINT)  # Ctrl-C on `fedmodel serve`
        text, _ = proc.communicate(timeout=600)
    finally:
        _stop([proc])
    assert proc.returncode == 130, text[-4000:]
    res = json.loads(out.read_text())
    assert res["status"] == "interrupted", res["message"]
    assert "interrupted" in text
    # the checkpoint of the returned point resumes to the uninterrupted answer
    _gather_party_files(fed, ck)
    serial_opts = {k: v for k, v in opts.items() if k != "checkpoint"}
    ref = _file_model(fed).solve("prox-al", **serial_opts)
    again = _file_model(fed).solve("prox-al", resume=str(ck), **serial_opts)
    assert again.rounds == ref.rounds
    assert np.max(np.abs(again.x - ref.x)) <= 1e-10 * max(1.0, np.max(np.abs(ref.x)))


def test_a_supernode_killed_mid_solve_is_a_client_failure(federation, tmp_path):
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
