"""``backend="ray"`` joining an existing Ray cluster (issue 15).

A cluster is started the way an operator would: ``ray start --head`` plus a second
``ray start --address ...`` node, both on this machine, each node carrying a custom
resource (an organisation's label). A fresh interpreter joins it with
``ray_address=...`` and ``ray_placement=`` (client -> label); the test checks that each
client ran on the node that carries its label and that the iterates are those of the
serial backend. The cluster is stopped (its processes, by process group) whatever happens.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time

import numpy as np
import pytest
from problems import np_model

pytest.importorskip("ray")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLACEMENT = {"site0": "org_a", "site1": "org_b", "site2": "org_b"}
OPTS = dict(max_outer=4, history=False, random_state=0)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env() -> dict:
    env = dict(os.environ)
    env.update(
        RAY_AUTH_MODE="disabled",  # a loopback test cluster; see docs/deployment.md for TLS
        OPENBLAS_NUM_THREADS="1",
        RAY_USAGE_STATS_ENABLED="0",
        PYTHONPATH=ROOT + os.pathsep + os.path.join(ROOT, "tests"),
    )
    return env


def _stop(procs: list[subprocess.Popen]) -> None:
    """Stop every process the cluster started: ``ray start`` daemonises the head's and the
    node's processes in the process group of the ``ray start`` call that we started."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for p in procs:
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                pass
        time.sleep(2.0 if sig == signal.SIGTERM else 0.0)


@pytest.fixture(scope="module")
def cluster():
    # Ray's socket paths must stay under 107 bytes: a short directory, not pytest's deep one
    tmp = tempfile.mkdtemp(prefix="fm-ray-", dir="/tmp")
    port = _free_port()
    address = f"127.0.0.1:{port}"
    common = ["--num-cpus=1", "--disable-usage-stats", "--node-ip-address=127.0.0.1"]
    head = [
        sys.executable, "-m", "ray.scripts.scripts", "start", "--head", f"--port={port}",
        f"--temp-dir={tmp}", "--include-dashboard=false", '--resources={"org_a": 1}', *common,
    ]  # fmt: skip
    node = [
        sys.executable, "-m", "ray.scripts.scripts", "start", f"--address={address}",
        '--resources={"org_b": 1}', *common,
    ]  # fmt: skip
    procs = []
    try:
        for cmd in (head, node):
            p = subprocess.Popen(
                cmd,
                env=_env(),
                start_new_session=True,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            procs.append(p)
            out, _ = p.communicate(timeout=120)
            if p.returncode != 0:
                pytest.fail(f"{' '.join(cmd[3:5])} failed:\n{out[-3000:]}")
        yield address
    finally:
        _stop(procs)
        shutil.rmtree(tmp, ignore_errors=True)


JOB = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import ray
    from problems import np_model
    from fedmodel.runtime.endpoints import EchoEndpoint, EndpointFactory
    from fedmodel.runtime.factory import make_runtime

    address, placement, opts, out = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3]), sys.argv[4]
    res = np_model(3).solve(
        "prox-al", backend="ray", ray_address=address, ray_placement=placement, **opts
    )
    facts = {n: EndpointFactory(EchoEndpoint, (n,)) for n in placement}
    with make_runtime("ray", facts, ray_address=address, ray_placement=placement) as rt:
        nodes = {n: rt.nodes[h] for n, h in rt.placement.items()}
    labels = {
        lab: [n["NodeID"] for n in ray.nodes() if n["Alive"] and lab in n["Resources"]]
        for lab in set(placement.values())
    }
    json.dump(
        {"x": res.x.tolist(), "status": res.status, "nodes": nodes, "labels": labels,
         "placement": res.extra["placement"], "rounds": res.rounds["communication"]},
        open(out, "w"),
    )
    """
)


def test_parties_placed_by_label_on_a_two_node_cluster(cluster, tmp_path):
    out = tmp_path / "out.json"
    job = subprocess.run(
        [sys.executable, "-c", JOB, cluster, json.dumps(PLACEMENT), json.dumps(OPTS), str(out)],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert job.returncode == 0, job.stderr[-4000:]
    got = json.loads(out.read_text())
    # every client ran on the node that carries its label, the two labels on two nodes
    for name, label in PLACEMENT.items():
        assert got["labels"][label] == [got["nodes"][name]], (name, label, got)
    assert got["nodes"]["site0"] != got["nodes"]["site1"]
    assert got["placement"] == {"site0": 0, "site1": 1, "site2": 1}
    ref = np_model(3).solve("prox-al", **OPTS)
    assert got["rounds"] == ref.rounds["communication"]
    x = np.asarray(got["x"])
    assert np.max(np.abs(x - ref.x)) <= 1e-10 * max(1.0, np.max(np.abs(ref.x)))


def test_placement_errors_name_the_client():
    from fedmodel.errors import ModelError
    from fedmodel.runtime.ray_runtime import labelled_placement

    with pytest.raises(ModelError, match="no resource label for client 'b'"):
        labelled_placement(["a", "b"], {"a": "x"}, {"x": 1})
    with pytest.raises(ModelError, match="client 'a'.*'y', which no node"):
        labelled_placement(["a"], {"a": "y"}, {"x": 1})
    with pytest.raises(ModelError, match="ray_placement is used by backend='ray' only"):
        np_model(2).solve("prox-al", ray_placement={"site0": "x", "site1": "x"})
