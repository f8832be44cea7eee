"""Seed 004 Table II at n = 1000 (the slow end of ``fedmodel reproduce dald-table2``), one
method at a time, each result written as soon as it is in (a long run that is stopped keeps
what it finished).

    python benchmarks/dald_table2_n1000.py                 # n=1000, lambda=1e-3, 1000 it.
    python benchmarks/dald_table2_n1000.py --iters 100 300 1000 --methods CC DC FedProx

Each (n, lambda, method) run is :func:`fedmodel.reproduce.dald.run_table2_case` (the setup of
``dald-table2``: bundled MNIST 3 vs 7, the paper's stride split, raw pixels, one BCPG step
with step 1e-4, rho = 1) with snapshots at ``--iters``; rows go to
``benchmarks/RESULTS_dald_table2_n1000.json`` (keyed by n, lambda, method) beside the
paper's Table II numbers, and the Markdown table to ``RESULTS_dald_table2_n1000.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

from fedmodel.reproduce.dald import METHODS_T2, mnist_3_vs_7, paper_numbers, run_table2_case

HERE = os.path.dirname(os.path.abspath(__file__))
JSON = os.path.join(HERE, "RESULTS_dald_table2_n1000.json")
MD = os.path.join(HERE, "RESULTS_dald_table2_n1000.md")


def load() -> dict:
    if os.path.exists(JSON):
        with open(JSON) as fh:
            return json.load(fh)
    return {"rows": {}}


def write_md(results: dict) -> None:
    paper = {
        (r["n"], r["lambda"], r["method"], r["iters"]): (r["mean"], r["std"])
        for r in paper_numbers()["table2"]["rows"]
    }
    lines = [
        "# Seed 004 Table II at large n (benchmarks/dald_table2_n1000.py)",
        "",
        f"Machine: {platform.node()} ({platform.machine()}, Python {platform.python_version()}, "
        f"{os.cpu_count()} CPUs, shared). Accuracy of every client's local model on the pooled "
        "training images: mean % / std across clients (per ten-thousand); paper: Table II at "
        "the same n, lambda and iteration count where it has one.",
        "",
        "| n | lambda | method | iteration | mean % | std | paper mean % | paper std | run s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in sorted(results["rows"].values(), key=lambda r: (r["n"], r["lambda"], r["method"])):
        for it, (mean, std) in sorted(row["acc"].items(), key=lambda kv: int(kv[0])):
            pm, ps = paper.get((row["n"], row["lambda"], row["method"], int(it)), (None, None))
            ptxt = ("-", "-") if pm is None else (f"{pm:.2f}", f"{ps:.1f}")
            lines.append(
                f"| {row['n']} | {row['lambda']:g} | {row['method']} | {it} | {mean:.2f} | "
                f"{std:.1f} | {ptxt[0]} | {ptxt[1]} | {row['seconds']:.0f} |"
            )
    with open(MD, "w") as fh:
        fh.write("\n".join(lines) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--lam", type=float, default=1e-3)
    ap.add_argument("--iters", type=int, nargs="+", default=[100, 300, 1000])
    ap.add_argument("--methods", nargs="+", default=["CC", "DC", "FedProx"])
    args = ap.parse_args()
    unknown = set(args.methods) - set(METHODS_T2)
    if unknown:
        ap.error(f"unknown methods {sorted(unknown)}; choose from {list(METHODS_T2)}")
    X, b = mnist_3_vs_7()
    results = load()
    for method in args.methods:
        t = time.perf_counter()
        out = run_table2_case(X, b, args.n, args.lam, method, args.iters)
        key = f"n={args.n} lambda={args.lam:g} {method}"
        results["rows"][key] = {
            "n": args.n,
            "lambda": args.lam,
            "method": method,
            "acc": {str(k): list(v) for k, v in out["acc"].items()},
            "seconds": out["seconds"],
            "wall": time.perf_counter() - t,
            "rounds": out["rounds"],
            "status": out["status"],
        }
        with open(JSON, "w") as fh:
            json.dump(results, fh, indent=1)
        write_md(results)
        print(f"{key}: {out['acc']} ({out['seconds']:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
