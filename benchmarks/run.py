"""fedmodel benchmark suite: subproblem backends at solver speed, measured.

    python benchmarks/run.py [--quick] [--cases table1,table1-tight,np,fairness,scaling,memory,profile]
                             [--seeds K] [--time-limit S] [--out DIR]

(or ``fedmodel bench ...``). Every unit of work (one instance, all its solves) runs in a
fresh Python process with a per-unit time limit, the centralized reference first, so each
ratio compares solves made in the same process minutes apart. Results accumulate in
``results.json`` (a run replaces the cases it ran and keeps the others, so the full suite
can be run in chunks) and ``RESULTS.md`` is rebuilt from it. ``--quick`` (< 3 minutes)
writes ``RESULTS_quick.md`` / ``results_quick.json`` instead, so it never overwrites the
full results.

BLAS threads: this script sets ``OPENBLAS_NUM_THREADS=1`` (and the MKL/OMP equivalents,
plus threadpoolctl when installed) for every unit. On a shared 2-core machine a
multi-threaded OpenBLAS oversubscribes the cores and small products get ~40x slower; the
load average (``uptime``) at each unit is recorded so readers can judge the wall times.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

for _var in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OMP_NUM_THREADS"):
    os.environ[_var] = "1"  # before numpy is imported, here and in every unit's process

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

CASES = ("table1", "table1-tight", "np", "fairness", "scaling", "memory", "profile")
QUICK_CASES = ("table1", "table1-tight", "np", "fairness", "scaling", "memory")


def plan(case: str, quick: bool, seeds: int | None, limit: float | None) -> list[dict]:
    """Units of a case: ``{"case", "fn", "params", "timeout"}``."""
    if case == "table1":
        grid = [(1, 100, 1), (5, 100, 1), (10, 500, 5)] if quick else None
        from cases import TABLE1_GRID

        grid = grid or TABLE1_GRID
        k = seeds or (1 if quick else 10)
        t = limit or (60 if quick else 900)
        return [
            {
                "case": case,
                "fn": "table1",
                "params": {"n": n, "d": d, "m": m, "seeds": list(range(k)), "eps": 1e-3,
                           "time_limit": t},
                "timeout": t * 2 * k + 60,
            }
            for n, d, m in grid
        ]  # fmt: skip
    if case == "table1-tight":
        k = seeds or (1 if quick else 3)
        t = limit or (60 if quick else 300)
        params = {"n": 10, "d": 500, "m": 5, "seeds": list(range(k)), "eps": 1e-6}
        return [{"case": case, "fn": "table1", "params": dict(params, time_limit=t),
                 "timeout": 2 * t * k + 60}]  # fmt: skip
    if case == "np":
        ns = (20,) if quick else (1, 5, 10, 20)
        t = limit or (30 if quick else 600)
        fed = limit or (10 if quick else 300)
        units = []
        for n in ns:
            methods = ["cprox-al", "cprox-al:eps1e-3", "prox-al:best found"]
            if not quick:
                methods += ["centralized", "slsqp", "prox-al:paper"]
            units.append(
                {
                    "case": case,
                    "fn": "np",
                    "params": {"n": n, "methods": methods, "time_limit": t, "fed_limit": fed},
                    "timeout": 2 * t + 2 * fed + 300,
                }  # fmt: skip
            )
        return units
    if case == "fairness":
        ns = (1,) if quick else (1, 5, 10, 20)
        t = limit or (60 if quick else 300)
        fed = limit or (10 if quick else 300)
        methods = ["prox-al:best found"] + ([] if quick else ["cprox-al", "prox-al:paper"])
        return [
            {
                "case": case,
                "fn": "fairness",
                "params": {"n": n, "methods": methods, "time_limit": t, "fed_limit": fed},
                "timeout": t + 2 * fed + 300,
            }  # fmt: skip
            for n in ns
        ]
    if case == "scaling":
        ns = (10, 100) if quick else (10, 100, 1000)
        t = limit or (10 if quick else 300)
        return [
            {
                "case": case,
                "fn": "scaling",
                "params": {
                    "n": n,
                    "d": 50,
                    "time_limit": t,
                    "centralized": True,
                    "rounds": 30,
                    "converge": not quick or n <= 10,
                },
                "timeout": 3 * t + 600,
            }  # fmt: skip
            for n in ns
        ]
    if case == "memory":
        t = limit or (5 if quick else 60)
        ms = ("prox-al",) if quick else ("prox-al", "cprox-al", "centralized")
        return [
            {
                "case": case,
                "fn": "memory",
                "params": {"n": 20, "method": m, "time_limit": t},
                "timeout": t + 600,
            }  # fmt: skip
            for m in ms
        ]
    if case == "profile":
        s = limit or 60
        return [
            {
                "case": case,
                "fn": "profile",
                "params": {"what": w, "seconds": s},
                "timeout": 10 * s + 300,
            }  # fmt: skip
            for w in ("table1-largest", "np20", "scaling1000")
        ]
    raise SystemExit(f"unknown case {case!r}; choose from {', '.join(CASES)}")


def run_unit(unit: dict) -> list[dict]:
    """Run one unit in a fresh process with its time limit; a killed unit is a row."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--unit", json.dumps(unit)]
    t0 = time.perf_counter()
    load0 = os.getloadavg()[0]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=unit["timeout"])
    except subprocess.TimeoutExpired:
        return [dict(unit["params"], case=unit["case"], status="killed",
                     error=f"unit time limit of {unit['timeout']:.0f} s",
                     wall=time.perf_counter() - t0, load=load0)]  # fmt: skip
    for line in proc.stdout.splitlines():
        if line.startswith("@@ROWS "):
            rows = json.loads(line[len("@@ROWS ") :])
            for r in rows:
                r["case"] = unit["case"]
                r["load_start"] = load0
            return rows
    return [dict(unit["params"], case=unit["case"], status="crashed",
                 error=proc.stderr[-2000:], wall=time.perf_counter() - t0)]  # fmt: skip


def unit_main(spec: str) -> None:
    try:
        from threadpoolctl import threadpool_limits

        threadpool_limits(1)
    except ImportError:
        pass
    from cases import UNITS

    unit = json.loads(spec)
    # warm-up: imports and a tiny solve, so the first timed solve pays no start-up cost
    from cases import scaling_model

    import fedmodel  # noqa: F401

    scaling_model(2, 5).solve(method="centralized")
    scaling_model(2, 5).solve(method="prox-al", history=False)
    rows = UNITS[unit["fn"]](**unit["params"])
    print("@@ROWS " + json.dumps(rows, default=_jsonable))


def _jsonable(v):
    import numpy as np

    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, np.ndarray):
        return v.tolist()
    return str(v)


def machine() -> dict:
    import cvxpy
    import numpy
    import scipy

    try:
        import clarabel

        clarabel_version = clarabel.__version__
    except Exception:  # noqa: BLE001
        clarabel_version = "?"
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=HERE
        ).stdout.strip()
    except OSError:
        commit = "?"
    return {
        "platform": platform.platform(),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "numpy": numpy.__version__,
        "scipy": scipy.__version__,
        "cvxpy": cvxpy.__version__,
        "clarabel": clarabel_version,
        "commit": commit,
        "blas_threads": os.environ.get("OPENBLAS_NUM_THREADS"),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="small grid, short limits (< 3 min)")
    p.add_argument("--cases", default=None, help=f"comma-separated subset of {','.join(CASES)}")
    p.add_argument("--seeds", type=int, default=None, help="seeds per Table 1 instance")
    p.add_argument("--time-limit", type=float, default=None, help="seconds per solve")
    p.add_argument("--out", default=str(HERE), help="folder of RESULTS*.md / results*.json")
    p.add_argument("--unit", default=None, help=argparse.SUPPRESS)
    p.add_argument("--render", action="store_true", help="only rebuild the markdown")
    args = p.parse_args(argv)
    if args.unit:
        unit_main(args.unit)
        return 0
    from report import render

    out = Path(args.out)
    suffix = "_quick" if args.quick else ""
    json_path, md_path = out / f"results{suffix}.json", out / f"RESULTS{suffix}.md"
    data = json.loads(json_path.read_text()) if json_path.exists() else {"cases": {}}
    if not args.render:
        cases = args.cases.split(",") if args.cases else list(QUICK_CASES if args.quick else CASES)
        t_all = time.perf_counter()
        for case in cases:
            units = plan(case, args.quick, args.seeds, args.time_limit)
            t0, load0 = time.perf_counter(), os.getloadavg()
            rows = []
            for i, unit in enumerate(units):
                print(f"[{case} {i + 1}/{len(units)}] {json.dumps(unit['params'])}", flush=True)
                got = run_unit(unit)
                for r in got:
                    print(f"    {_summary(r)}", flush=True)
                rows += got
                data["cases"][case] = {  # written after every unit: a cut run keeps its rows
                    "rows": rows,
                    "seconds": time.perf_counter() - t0,
                    "load_start": load0,
                    "load_end": os.getloadavg(),
                    "finished": time.strftime("%Y-%m-%d %H:%M:%S"),
                    "quick": args.quick,
                    "partial": i + 1 < len(units),
                    "command": " ".join([Path(sys.argv[0]).name] + sys.argv[1:]),
                }
                data["machine"] = machine()
                json_path.write_text(json.dumps(data, indent=1, default=_jsonable))
                md_path.write_text(render(data, quick=args.quick))
        print(f"done in {time.perf_counter() - t_all:.0f} s; wrote {md_path} and {json_path}")
    else:
        md_path.write_text(render(data, quick=args.quick))
        print(f"wrote {md_path}")
    return 0


def _summary(r: dict) -> str:
    parts = [str(r.get(k)) for k in ("method", "label", "n", "d", "status") if k in r]
    if "wall" in r:
        parts.append(f"{r['wall']:.2f}s")
    if r.get("rel_diff") is not None:
        parts.append(f"rel {r['rel_diff']:.1e}")
    if r.get("error"):
        parts.append(r["error"][-200:].replace("\n", " "))
    return " ".join(parts)


if __name__ == "__main__":
    sys.exit(main())
