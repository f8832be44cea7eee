"""Per-round cost of the Flower backend next to serial, processes and Ray (issue 15).

Two measurements, both on this machine, 3 clients:

* **echo**: a runtime's own cost per round (every client answers a 5-float message at
  once, ``EchoEndpoint``), after 5 warm-up rounds: serial, processes, Ray, Flower's
  simulation engine (``backend="flower"`` without a grid);
* **prox-al**: wall time per communication round of a prox-al solve of the 3-site
  Neyman-Pearson test problem (``max_outer=1, max_inner=3``), the same on every backend;
  with ``--deployment`` also on Flower's deployment engine: a SuperLink and three
  SuperNodes on 127.0.0.1 started with ``fedmodel join`` and the solve with ``fedmodel
  serve``, as in ``tests/test_flower_deployment.py`` (minutes).

    OPENBLAS_NUM_THREADS=1 python benchmarks/flower_overhead.py [--deployment] [--rounds 30]

Writes ``benchmarks/RESULTS_flower.json`` (numbers) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]

from fedmodel.runtime.endpoints import EchoEndpoint, EndpointFactory  # noqa: E402
from fedmodel.runtime.factory import make_runtime  # noqa: E402

OPTS = dict(max_outer=1, max_inner=3, history=False, random_state=0)
BACKENDS = {
    "serial": {},
    "processes": {"workers": 2},
    "ray": {"workers": 2},
    "flower (simulation)": {},
}


def _backend(name: str) -> str:
    return name.split()[0]


def echo(names, rounds: int) -> dict:
    out = {}
    for b in names:
        facts = {f"c{i}": EndpointFactory(EchoEndpoint, (f"c{i}",)) for i in range(3)}
        t0 = time.perf_counter()
        rt = make_runtime(_backend(b), facts, **BACKENDS[b])
        startup = time.perf_counter() - t0
        try:
            payload = {"w": np.zeros(5)}
            for _ in range(5):
                rt.next_round()
                rt.broadcast("ping", payload)
            t0 = time.perf_counter()
            for _ in range(rounds):
                rt.next_round()
                rt.broadcast("ping", payload)
            per_round = (time.perf_counter() - t0) / rounds
        finally:
            rt.close()
        out[b] = {"startup_s": startup, "per_round_ms": per_round * 1e3}
        print(f"echo {b:22s} start-up {startup:7.2f} s   per round {per_round * 1e3:9.3f} ms")
    return out


def proxal(names) -> dict:
    from problems import np_model

    out = {}
    for b in names:
        t0 = time.perf_counter()
        res = np_model(3).solve("prox-al", backend=_backend(b), **BACKENDS[b], **OPTS)
        wall = time.perf_counter() - t0
        rounds = res.rounds["communication"]
        out[b] = {
            "wall_s": wall,
            "solve_s": res.timing["solve"],
            "rounds": rounds,
            "per_round_ms": res.timing["solve"] / rounds * 1e3,
            "x": res.x.tolist(),
        }
        print(
            f"prox-al {b:19s} wall {wall:7.2f} s   solve {res.timing['solve']:8.3f} s   "
            f"{rounds} rounds   {out[b]['per_round_ms']:9.2f} ms per round"
        )
    return out


def deployment() -> dict:
    """The loopback federation of tests/test_flower_deployment.py, one prox-al solve."""
    import tempfile
    from pathlib import Path

    import test_flower_deployment as dep

    base = Path(tempfile.mkdtemp(prefix="fedmodel-bench-"))
    (base / "federation").mkdir()
    with dep.loopback_federation(base / "federation") as fed:
        out, ledger = base / "result.json", base / "ledger.jsonl"
        t0 = time.perf_counter()
        proc = dep._serve(fed, out, ledger, **OPTS)
        try:
            text, _ = proc.communicate(timeout=1800)
        finally:
            dep._stop([proc])
        wall = time.perf_counter() - t0
        res = json.loads(out.read_text())
    rounds = res["rounds"]["communication"]
    row = {
        "wall_s": wall,
        "solve_s": res["timing"]["solve"],
        "rounds": rounds,
        "per_round_ms": res["timing"]["solve"] / rounds * 1e3,
        "x": res["x"],
    }
    print(
        f"prox-al flower (deployment)  wall {wall:7.2f} s   solve {row['solve_s']:8.3f} s   "
        f"{rounds} rounds   {row['per_round_ms']:9.2f} ms per round"
    )
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=30, help="echo rounds per backend")
    ap.add_argument("--deployment", action="store_true", help="also Flower's deployment engine")
    ap.add_argument(
        "--deployment-only", action="store_true", help="only the deployment (and serial)"
    )
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "RESULTS_flower.json"))
    args = ap.parse_args()
    names = ["serial"] if args.deployment_only else list(BACKENDS)
    results = {"echo": echo(names, args.rounds), "prox-al": proxal(names)}
    if args.deployment or args.deployment_only:
        results["prox-al"]["flower (deployment)"] = deployment()
    ref = np.asarray(results["prox-al"]["serial"]["x"])
    for row in results["prox-al"].values():
        row["max_diff_vs_serial"] = float(np.max(np.abs(np.asarray(row.pop("x")) - ref)))
    with open(args.out, "w") as fh:
        json.dump(results, fh, indent=1)
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
