"""DAGD (seed 004: DGD, eq. 55, with non-blocking coordination) against synchronous DGD,
with and without a straggler, on the serial (deterministic delays) and processes (real
asynchrony) runtimes.

    python benchmarks/dald_dagd.py            # writes benchmarks/RESULTS_dald_dagd.md
    python benchmarks/dald_dagd.py --quick    # fewer rounds, a smoke test

Model: least squares ``f_i = (1/N) ||A_i w - b_i||^2`` on synthetic heterogeneous data (4
clients, 50 rows each, 10 features; client i's rows and targets shifted by i / 2, seed 0),
complete graph, Metropolis weights, each node's step ``1/(2 L_i)`` (the same for dgd and
dagd). Every run does the same work, ``R`` rounds = ``4R`` local updates in all (dagd's
``max_rounds``), except the last row: asynchronous dagd with the straggler given the wall
time of synchronous dgd with it (``time_limit``). Reported: solve time, updates per node,
the largest staleness, the distance of the returned average to DGD's fixed point ``x_fp``
(a 20,000-round dgd run; with a constant step DGD and DAGD share it) and the relative
objective difference to the centralized optimum (DGD's O(alpha) bias). The processes
runtime runs each node in its own worker (``workers=4``).

Straggler: node c0 sleeps ``--sleep`` seconds in each of its updates (failure injection,
``Fault("sleep")``); synchronous DGD waits for it every round, DAGD's other nodes go on
with each other's iterates. Timings are from a shared machine: compare the ratios within
one run.
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import cvxpy as cp
import numpy as np

import fedmodel as fm
from fedmodel.algorithms.baselines.dgd import DGDOptions, run_dgd
from fedmodel.algorithms.dald.dagd import DAGDOptions, run_dagd
from fedmodel.runtime.faults import Fault

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "RESULTS_dald_dagd.md")
STEP = None  # each node 1/(2 L_i), the same for dgd and dagd


def synthetic_model(n_clients: int = 4, rows: int = 50, d: int = 10, seed: int = 0) -> fm.Model:
    rng = np.random.default_rng(seed)
    N = n_clients * rows
    m = fm.Model("hetero-ls")
    w = m.variable(d, name="w")
    for i in range(n_clients):
        c = m.client(f"c{i}")
        A = c.data(rng.normal(size=(rows, d)) + 0.5 * i, name="A")
        b = c.data(rng.normal(size=rows) + 0.5 * i, name="b")
        c.minimize(cp.sum_squares(A @ w - b) / N)
    return m


def run(model, method: str, rounds: int, backend: str, sleep: float, **kw) -> dict:
    compiled = model.compile()
    common = dict(topology="complete", step=STEP, max_rounds=rounds, history=False)
    if backend != "serial":
        common.update(backend=backend, workers=4, server_hosts_clients=False)
    if method == "dgd":
        opts, runner, kind = DGDOptions(**common, **kw), run_dgd, "dgd_step"
    else:
        opts, runner, kind = DAGDOptions(**common, **kw), run_dagd, "dagd_step"
    opts.validate(compiled, method)
    faults = (
        {"c0": Fault("sleep", round=1, times=None, seconds=sleep, kinds=(kind,))} if sleep else None
    )
    t = time.perf_counter()
    res = runner(compiled, opts, method, faults=faults)
    return {"res": res, "wall": time.perf_counter() - t, "solve": res.timing.get("solve")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--sleep", type=float, default=0.02)
    args = ap.parse_args()
    R = args.rounds or (60 if args.quick else 400)
    model = synthetic_model()
    ref = model.solve("centralized")
    fp = model.solve("dgd", topology="complete", step=STEP, max_rounds=20000, history=False)
    t0 = time.perf_counter()
    cases = [
        ("dgd", "serial", 0.0, {}, "synchronous"),
        ("dagd", "serial", 0.0, {}, "no delays (= dgd)"),
        ("dagd", "serial", 0.0, {"delays": (3, 0, 0, 0)}, "delays (3, 0, 0, 0): c0 4x slower"),
        ("dgd", "processes", 0.0, {}, "synchronous"),
        ("dagd", "processes", 0.0, {}, "blocking jobs (= dgd)"),
        ("dagd", "processes", 0.0, {"asynchronous": True}, "asynchronous"),
        ("dgd", "processes", args.sleep, {}, f"synchronous, c0 sleeps {args.sleep:g} s/update"),
        ("dagd", "processes", args.sleep, {}, f"blocking jobs, c0 sleeps {args.sleep:g} s/update"),
        (
            "dagd",
            "processes",
            args.sleep,
            {"asynchronous": True},
            f"asynchronous, c0 sleeps {args.sleep:g} s/update",
        ),
    ]
    rows = []
    cases.append(("dagd", "processes", args.sleep, None, "asynchronous, c0 sleeps, dgd's time"))
    for method, backend, sleep, kw, label in cases:
        if kw is None:  # the wall time of synchronous dgd with the straggler, as much work as fits
            budget = next(r for r in rows if r["label"].startswith("synchronous,"))["solve"]
            kw = {"asynchronous": True, "time_limit": budget}
            R_run = 100 * R
        else:
            R_run = R
        out = run(model, method, R_run, backend, sleep, **kw)
        res = out["res"]
        info = res.extra.get("asynchrony")
        if info is None:
            updates = {s: R_run for s in res.extra["local_x"]}
            stale = 0
        else:
            updates = {s: p["updates"] for s, p in info["parties"].items()}
            stale = max(p["max_staleness"] for p in info["parties"].values())
        rows.append(
            {
                "method": method,
                "backend": backend,
                "label": label,
                "wall": out["wall"],
                "solve": out["solve"],
                "updates": updates,
                "stale": stale,
                "dist_fp": float(np.abs(res.x - fp.x).max()),
                "rel": res.compare(ref).relative_objective_difference,
            }
        )
        print(rows[-1], flush=True)
    total = time.perf_counter() - t0
    lines = [
        "# DAGD against synchronous DGD (benchmarks/dald_dagd.py)",
        "",
        f"Generated by `python benchmarks/dald_dagd.py{' --quick' if args.quick else ''}` on "
        f"{platform.node()} ({platform.machine()}, Python {platform.python_version()}, "
        f"{os.cpu_count()} CPUs, shared with other jobs); total {total:.0f} s. Model and "
        f"protocol: see the script's docstring. R = {R} rounds (= {4 * R} local updates), "
        "step 1/(2 L_i) per node, complete graph on 4 clients. DGD's fixed point is "
        f"{fp.compare(ref).relative_objective_difference:.2e} (relative objective) from the "
        "centralized optimum (the O(alpha) bias of a constant step).",
        "",
        "| method | runtime | run | solve s | updates c0 / c1 / c2 / c3 | max staleness | "
        "max abs. dist. to DGD fixed point | rel. objective diff. vs centralized |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        up = " / ".join(str(r["updates"][s]) for s in sorted(r["updates"]))
        lines.append(
            f"| {r['method']} | {r['backend']} | {r['label']} | {r['solve']:.2f} | {up} | "
            f"{r['stale']} | {r['dist_fp']:.1e} | {r['rel']:.2e} |"
        )
    sync_s = next(r for r in rows if r["label"].startswith("synchronous,"))
    block_s = next(r for r in rows if r["label"].startswith("blocking jobs,"))
    async_s = next(r for r in rows if r["label"].startswith("asynchronous, c0 sleeps 0"))
    lines += [
        "",
        f"With the straggler, dagd's asynchronous solve took {async_s['solve'] / sync_s['solve']:.2f} x "
        f"synchronous dgd's time and {async_s['solve'] / block_s['solve']:.2f} x dagd's with blocking "
        "jobs (the same messages, each node waiting for every job) for the same number of local "
        "updates.",
    ]
    with open(OUT, "w") as fh:
        fh.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
