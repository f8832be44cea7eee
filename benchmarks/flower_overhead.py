"""Per-round cost of the Flower backend next to serial, processes and Ray.

Two measurements, both on this machine, 3 clients:

* **echo**: a runtime's own cost per round (every client answers a 5-float message at
  once, ``EchoEndpoint``), after 5 warm-up rounds: serial, processes, Ray, Flower's
  simulation engine (``backend="flower"`` without a grid);
* **prox-al**: wall time per communication round of a prox-al solve of the 3-site
  Neyman-Pearson test problem (``max_outer=1, max_inner=3``), the same on every backend;
* with ``--deployment``, **Flower's deployment engine**: a SuperLink and three SuperNodes
  on 127.0.0.1 (TLS, SuperNode authentication) started with ``fedmodel join``, the demo
  problem of the deployment docs (the same 3-site model file) solved by prox-al at its
  defaults with ``fedmodel serve``, as in ``tests/test_flower_deployment.py``: wall time,
  seconds and CPU seconds per round (by process), against the targets of issue 25
  (at most 60 s wall and 0.5 s per round).

    OPENBLAS_NUM_THREADS=1 python benchmarks/flower_overhead.py [--deployment] [--rounds 30]

Writes ``benchmarks/RESULTS_flower.json`` (numbers; with ``--deployment-only`` only its
``deployment`` row and the serial reference measured in the same run are replaced, with
the load averages before and after) and prints a table.
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


class CpuMeter:
    """CPU seconds used by a set of processes and everything below them, sampled from
    ``/proc`` in a thread (a process that ends between two samples loses at most one
    interval), by kind of process."""

    KINDS = (
        ("flower-superlink", "SuperLink"),
        ("flower-superexec", "SuperExec"),
        ("flwr-serverapp", "ServerApp"),
        ("trusted_supernode", "SuperNodes"),
        (" join ", "party servers (join)"),
        (" serve ", "fedmodel serve"),
    )

    def __init__(self, roots, every: float = 0.2):
        import threading

        self.roots, self.every = list(roots), every
        self.first: dict[int, float] = {}
        self.last: dict[int, tuple[str, float]] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> dict[int, tuple[str, float]]:
        import test_flower_deployment as dep

        tick = os.sysconf("SC_CLK_TCK")
        out = {}
        for pid in set(self.roots) | dep._descendants(self.roots):
            try:
                with open(f"/proc/{pid}/stat") as fh:
                    fields = fh.read().rsplit(")", 1)[1].split()
                with open(f"/proc/{pid}/cmdline", "rb") as fh:
                    cmd = " " + fh.read().replace(b"\0", b" ").decode() + " "
            except OSError:
                continue
            kind = next((k for key, k in self.KINDS if key in cmd), "other")
            out[pid] = (kind, (int(fields[11]) + int(fields[12])) / tick)
        return out

    def _update(self) -> None:
        for pid, (kind, t) in self._sample().items():
            # (a process that has ended is a zombie without a command line until reaped)
            self.last[pid] = (self.last.get(pid, (kind, 0.0))[0], t)

    def _run(self) -> None:
        while not self.stop.wait(self.every):
            self._update()

    def __enter__(self):
        self.first = {pid: t for pid, (_k, t) in self._sample().items()}
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()
        self._update()

    def add_root(self, pid: int) -> None:
        self.roots.append(pid)

    def seconds(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for pid, (kind, t) in self.last.items():
            out[kind] = out.get(kind, 0.0) + t - self.first.get(pid, 0.0)
        return dict(sorted(out.items()))


def deployment(options: dict) -> dict:
    """The loopback federation of tests/test_flower_deployment.py (TLS, SuperNode
    authentication, Flower's in-memory SuperLink state), one prox-al solve of its model
    (the demo problem of the deployment docs) with ``options``: wall time of ``fedmodel
    serve``, its solve, rounds, seconds per round and CPU seconds per round by process."""
    import shutil
    import tempfile
    from pathlib import Path

    import test_flower_deployment as dep

    base = Path(tempfile.mkdtemp(prefix="fedmodel-bench-"))
    (base / "federation").mkdir()
    try:
        with dep.loopback_federation(base / "federation") as fed:
            row, text = _deployment_solve(fed, base, options)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(
        f"prox-al flower (deployment)  {row['status']}  wall {row['wall_s']:7.2f} s   solve "
        f"{row['solve_s']:8.3f} s   {row['rounds']} rounds   {row['per_round_s']:6.3f} s per "
        f"round   CPU {row['cpu_per_round_s']:.3f} s per round (load average "
        f"{row['load_average']:.1f})"
    )
    print("  CPU seconds by process: " + ", ".join(f"{k} {v:.1f}" for k, v in row["cpu_s"].items()))
    return row


def _deployment_solve(fed, base, options: dict) -> tuple[dict, str]:
    """One ``fedmodel serve`` on the federation ``fed``, measured (see :func:`deployment`)."""
    import test_flower_deployment as dep

    out, ledger = base / "result.json", base / "ledger.jsonl"
    roots = [fed["superlink"].pid] + [p.pid for p in fed["procs"].values()]
    load = os.getloadavg()[0]
    with CpuMeter(roots) as cpu:
        t0 = time.perf_counter()
        proc = dep._serve(fed, out, ledger, **options)
        cpu.add_root(proc.pid)
        try:
            text, _ = proc.communicate(timeout=1800)
        finally:
            dep._stop([proc])
        wall = time.perf_counter() - t0
    res = json.loads(out.read_text())
    progress = [line for line in text.splitlines() if "fedmodel serve: round" in line]
    rounds = res["rounds"]["communication"]
    used = cpu.seconds()
    row = {
        "options": options,
        "status": res["status"],
        "wall_s": wall,
        "solve_s": res["timing"]["solve"],
        "rounds": rounds,
        "per_round_s": res["timing"]["solve"] / rounds,
        "cpu_s": used,
        "cpu_per_round_s": sum(used.values()) / rounds,
        "progress_lines": len(progress),
        "load_average": load,
        "x": res["x"],
    }
    return row, text


#: the deployment run of the timing targets (issue 25): the demo problem solved by prox-al
#: at its defaults, at most 60 s of `fedmodel serve` wall time and 0.5 s per round
TARGET_WALL_S = 60.0
TARGET_PER_ROUND_S = 0.5


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
    ref = np.asarray(results["prox-al"]["serial"]["x"])
    for row in results["prox-al"].values():
        row["max_diff_vs_serial"] = float(np.max(np.abs(np.asarray(row.pop("x")) - ref)))
    if args.deployment_only and os.path.exists(args.out):
        # only the deployment (and its serial reference) is measured: the other rows of
        # the results file are kept as they are
        with open(args.out) as fh:
            results = {**json.load(fh), "serial_reference_of_deployment": results}
    if args.deployment or args.deployment_only:
        from problems import np_model

        load_before = os.getloadavg()
        row = deployment({})  # prox-al at its defaults, to its certificate
        row["load_average_1_5_15_before_after"] = [list(load_before), list(os.getloadavg())]
        # the same solve on the serial backend, in this run (the per-round reference)
        ref = np_model(3).solve("prox-al")
        row["rounds_serial"] = ref.rounds["communication"]
        row["serial_solve_s"] = ref.timing["solve"]
        row["serial_per_round_s"] = ref.timing["solve"] / ref.rounds["communication"]
        row["per_round_vs_serial"] = row["per_round_s"] / row["serial_per_round_s"]
        row["max_diff_vs_serial"] = float(np.max(np.abs(np.asarray(row.pop("x")) - ref.x)))
        print(
            f"  serial, same solve: {row['serial_solve_s']:.3f} s, "
            f"{row['serial_per_round_s'] * 1e3:.2f} ms per round (deployment / serial per "
            f"round: {row['per_round_vs_serial']:.0f})"
        )
        row["targets"] = {
            "wall_s": [TARGET_WALL_S, row["wall_s"] <= TARGET_WALL_S],
            "per_round_s": [TARGET_PER_ROUND_S, row["per_round_s"] <= TARGET_PER_ROUND_S],
        }
        results["deployment"] = row
        for name, (target, met) in row["targets"].items():
            print(f"  target {name} <= {target:g}: {'met' if met else 'NOT met'}")
    with open(args.out, "w") as fh:
        json.dump(results, fh, indent=1)
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
