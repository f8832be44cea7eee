"""What refusing an oversized request costs a deployed party: its time and peak memory.

A party server built as ``fedmodel join`` builds it (``fedmodel.flower_app.party_server``,
site0 of the deployment test model) runs in its own process; this script sends it, over
its Unix socket, the largest requests of docs/security.md's caps and reads the party
process's peak resident memory (``VmHWM`` in ``/proc``) before and after each, and the
seconds until the refusal arrives:

* a frame announcing 300 MB (streamed by the client in 1 MiB chunks; the party reads the
  length prefix only),
* a JSON list of 10^7 ints (a 20 MB frame: read, refused from its header's length),
* a JSON dict of 10^6 keys (about 11 MB),
* one ``run`` call of 20,000 messages.

Run: ``python benchmarks/party_refusals.py`` (Linux: reads /proc). Prints a markdown table.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import tempfile
import textwrap
import time
from multiprocessing import connection

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]

from problems import DEPLOYMENT_MODEL, np_sites  # noqa: E402

from fedmodel.runtime.flower_codec import decode, encode  # noqa: E402
from fedmodel.runtime.flower_relay_app import pack, unpack  # noqa: E402
from fedmodel.runtime.messages import SERVER, Message  # noqa: E402

SERVE = textwrap.dedent(
    """
    import sys, numpy as np
    from fedmodel.deploy import load_model_file
    from fedmodel.flower_app import party_server
    base = sys.argv[1]
    X0, X1 = np.load(base + "/site0.npz")["X0"], np.load(base + "/site0.npz")["X1"]
    server = party_server(load_model_file(base + "/model.py"), "site0", {"X0": X0, "X1": X1},
                          base + "/site0.sock", checkpoint_dir=base + "/own")
    print("ready", flush=True)
    server.serve_forever()
    """
)


def peak_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmHWM"))


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmRSS"))


def send_frame(sock: str, key: bytes, frame: bytes) -> str:
    with connection.Client(sock, family="AF_UNIX", authkey=key) as conn:
        try:
            conn.send_bytes(frame)
        except OSError:
            pass
        status, text, arrays = unpack(conn.recv_bytes())
    return f"{status}: {str(decode(text, arrays))[:90]}"


def send_announced(sock: str, key: bytes, size: int) -> str:
    """A frame whose prefix announces ``size`` bytes, streamed in 1 MiB chunks."""
    chunk = b"\0" * 2**20
    with connection.Client(sock, family="AF_UNIX", authkey=key) as conn:
        try:
            conn._send(struct.pack("!i", -1) + struct.pack("!Q", size))
            for _ in range(size // len(chunk)):
                conn._send(chunk)
        except OSError:  # the party answered and hung up
            pass
        status, text, arrays = unpack(conn.recv_bytes())
    return f"{status}: {str(decode(text, arrays))[:90]}"


def main() -> None:
    base = tempfile.mkdtemp(prefix="fm-")
    with open(os.path.join(base, "model.py"), "w") as fh:
        fh.write(DEPLOYMENT_MODEL)
    X0, X1 = np_sites(3)[0]
    np.savez(os.path.join(base, "site0.npz"), X0=X0, X1=X1)
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVE, base], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout.readline().strip() == "ready"
        sock = os.path.join(base, "site0.sock")
        with open(sock + ".key", "rb") as fh:
            key = fh.read()
        msg = Message("evaluate", SERVER, "site0", {"w": np.zeros(5)}, 1, "diagnostic")
        frames = {  # built before the clock starts: only the party's answer is timed
            "a JSON list of 10^7 ints": pack("call", "[" + "0," * (10**7 - 1) + "0]", []),
            "a JSON dict of 10^6 keys": pack(
                "call", "{" + ",".join(f'"k{i}":0' for i in range(10**6)) + "}", []
            ),
            "a run call of 20,000 messages": pack("call", *encode(("run", ([msg] * 20_000, None)))),
        }
        attacks = [("a frame announcing 300 MB", lambda: send_announced(sock, key, 300 * 2**20))]
        attacks += [(n, lambda f=f: send_frame(sock, key, f)) for n, f in frames.items()]
        print("| request | frame (MB) | answer | seconds to the answer | party: peak RSS (MiB) |")
        print("|---|---|---|---|---|")
        for name, attack in attacks:
            before = peak_kib(proc.pid)
            t0 = time.perf_counter()
            answer = attack()
            seconds = time.perf_counter() - t0
            after = peak_kib(proc.pid)
            size = len(frames[name]) if name in frames else 300 * 2**20
            print(
                f"| {name} | {size / 1e6:.1f} | {answer} | {seconds:.3f} | "
                f"{before / 1024:.0f} -> {after / 1024:.0f} |"
            )
        print(f"\nparty resident memory at the end: {rss_kib(proc.pid) / 1024:.0f} MiB")
        print(json.dumps({"python": sys.version.split()[0]}))
    finally:
        proc.terminate()
        proc.wait(10)


if __name__ == "__main__":
    main()
