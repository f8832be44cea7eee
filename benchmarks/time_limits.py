"""Does ``time_limit`` hold, inside inner solves and centralized too? Every method on the
models of ``benchmarks/models.py`` with a limit below what the method would otherwise
take, measured as a user sees it.

    python benchmarks/time_limits.py --quick --limit 10           # the quick suite
    python benchmarks/time_limits.py --models sparse-logistic-d3000 --methods prox-al --limit 60

Each (model, method) solve runs in a forked child (as in ``benchmarks/models.py``) with
``time_limit=LIMIT``, killed after ``2 LIMIT + 60`` s (reported as ``killed``: the limit
not held); a run that finished before ``LIMIT`` in ``W`` seconds is run again with the
limit ``W / 3`` (``--rerun-fraction``) when that is at least ``--min-limit``, so that every
method that takes long enough meets a limit below its need. Per run: the status, the wall of ``model.solve`` (compile, solve, final
certificate: what a user waits for), the driver's own ``timing["solve"]`` and their
ratios to the limit. A run **overran** when its wall exceeds ``1.1 LIMIT``, whatever its
status (a run that ends "optimal" after the limit overran too); a run that finished
before the limit says nothing about it (``finished``). Results:
``benchmarks/RESULTS_time_limits.md`` and ``benchmarks/results_time_limits.json`` (a run
replaces the rows of the (model, method, size, limit) it ran).
"""

from __future__ import annotations

import os

for _var in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OMP_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import json  # noqa: E402
import multiprocessing as mp  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import models as suite  # noqa: E402

from fedmodel.errors import ModelError, UnsupportedError  # noqa: E402

JSON = HERE / "results_time_limits.json"
MD = HERE / "RESULTS_time_limits.md"
#: the federated and pooled methods that take a model of the suite (those that refuse one
#: say so in their row: "not applicable")
METHODS = ("prox-al", "cprox-al", "centralized", "admm", "fedprox", "dald-cc", "ssca")
#: a wall above this multiple of the limit (or of the run's floor, when the limit is below
#: it) is an overrun
SLACK = 1.2


def mlp_learning(quick: bool):
    """The one model of the learning methods (``ssca``, which takes no cvxpy model): a
    Swish MLP over 10 clients of synthetic rows, with a round budget far above what a
    limit allows (the schedule check ``check_conditions`` costs O(rounds) before the run)."""
    import numpy as np

    import fedmodel as fm
    from fedmodel.losses import SwishMLP

    rng = np.random.default_rng(0)
    rows, P = (200, 20) if quick else (1000, 100)
    X = rng.normal(size=(10 * rows, P))
    y = rng.integers(0, 3, size=10 * rows)
    model = fm.LearningModel(SwishMLP(P=P, J=16, L=3), lam=1e-5)
    for k in range(10):
        model.client(f"c{k}", X[rows * k : rows * (k + 1)], y[rows * k : rows * (k + 1)])
    return model, {"rounds": 20_000, "batch_size": 10}


#: models beside the suite's (name -> builder returning (model, solve options))
EXTRA = {"mlp-learning": mlp_learning}


def run_one(name: str, method: str, quick: bool, limit: float) -> dict:
    """Build the model, solve it with ``method`` and ``time_limit=limit``; the row."""
    if name in EXTRA:
        model, kwargs = EXTRA[name](quick)
    else:
        model, kwargs = suite.MODELS[name][0](quick).model, {}
    row = {"model": name, "method": method, "quick": quick, "limit": limit}
    t0 = time.perf_counter()
    try:
        res = model.solve(method=method, time_limit=limit, **kwargs)
    except Exception as exc:  # a method that does not take the model, or a failure
        row["wall"] = time.perf_counter() - t0
        row["status"] = f"{type(exc).__name__}: {str(exc)[:100]}"
        # (the method refuses the model, or it failed)
        row["refused"] = isinstance(exc, (UnsupportedError, ModelError))
        row["error"] = not row["refused"]
        return row
    row["wall"] = time.perf_counter() - t0
    row["status"] = res.status
    row["solve"] = float((res.timing or {}).get("solve", float("nan")))
    row["rounds"] = int((res.rounds or {}).get("communication", 0))
    row["inner_solver"] = (res.extra or {}).get("inner_solver", "")
    # the smallest limit the run holds (its compile and first step), when it says so
    row["floor"] = (res.extra or {}).get("time_limit_floor")
    row["peak_mb"] = suite._peak_mb()
    return row


def _child(conn, name, method, quick, limit):
    try:
        conn.send(run_one(name, method, quick, limit))
    except BaseException as exc:  # noqa: BLE001 - reported, never hidden
        conn.send({"model": name, "method": method, "quick": quick, "limit": limit,
                   "status": f"error: {exc!r}"})  # fmt: skip
    conn.close()


def run_isolated(name: str, method: str, quick: bool, limit: float) -> dict:
    """:func:`run_one` in a forked child, killed after ``2 limit + 60`` s."""
    hard = 2 * limit + 60
    recv, send = mp.get_context("fork").Pipe(duplex=False)
    proc = mp.get_context("fork").Process(target=_child, args=(send, name, method, quick, limit))
    t0 = time.perf_counter()
    proc.start()
    send.close()
    row = recv.recv() if recv.poll(hard) else None
    if proc.is_alive():
        proc.kill()
    proc.join()
    if row is None:
        row = {"model": name, "method": method, "quick": quick, "limit": limit,
               "status": f"killed after {hard:g} s", "wall": time.perf_counter() - t0}  # fmt: skip
    row["load1"] = os.getloadavg()[0]
    return row


def verdict(row: dict) -> str:
    """``overran`` (wall above SLACK x limit), ``held`` (stopped by the limit within it),
    ``finished`` (ended before the limit: no test of it), ``not applicable`` (the method
    refuses the model) or ``error``."""
    status = row["status"]
    if row.get("refused"):
        return "not applicable"
    if row.get("error") or status.startswith("error"):
        return "error"
    wall, limit = row.get("wall", float("nan")), row["limit"]
    floor = row.get("floor")
    if status == "time_limit" and floor is not None and limit < floor:
        # below the floor the run ends there (the message says so)
        return "held at floor" if wall <= SLACK * floor else "overran"
    if status.startswith("killed") or wall > SLACK * limit:
        return "overran"
    return "held" if status == "time_limit" else "finished"


def _key(row: dict) -> tuple:
    return (row["model"], row["method"], bool(row["quick"]), float(row["limit"]))


#: what the runs showed (hand-written; the tables below are generated)
NOTES = """## Notes (2026-11-29, main: beside two CPU-bound processes and nothing else)

- The quick suite at 1 s and at 10 s with `--busy 2` on the 2-core machine with no other
  job (the 1-minute load rose from 0.3 to 3 during each sweep: the two processes and the
  solves).
- At 1 s: 33 held, the worst 1.093 x the limit (cprox-al, svm-20); 9 below their floor,
  all ended within 1.0 x it; 55 finished before the limit; none overran.
- At 10 s: 16 held, the worst 1.032 x (ssca, mlp-learning); 1 below its floor (admm,
  sparse-logistic-d3000, 10.06 s); 80 finished before the limit; none overran.

## Notes (2026-11-28, branch busy: beside two CPU-bound processes)

- The quick suite at 1 s and at 10 s with `--busy 2` (two `while True: pass` processes the
  script starts and stops), on the shared 2-core machine while other jobs ran too: the
  1-minute load was 18-25 during the 1 s sweep and 20-32 during the 10 s sweep, far
  busier than the two processes alone. An overrun is now above 1.2 x the limit, and a
  limit below the run's floor (`time_limit_floor`: the compile, set-up and one step with
  its evaluation round, measured by the run itself) is held when the run ends within 1.2 x
  that floor.
- At 1 s: 58 runs below their floor, all ended within 1.05 x it (prox-al's floor
  1.3-15 s at that load: the compile, the runtime and one outer iteration cut to its
  first inner round); 28 held within 1.166 x the limit (ssca on mlp-learning the worst);
  10 finished before it. One overran: `centralized` on sparse-logistic-ball, 2.18 s
  against a floor of 1.60 s (1.37 x, load 19); its rerun (the row below, load 7) held at
  1.11 s.
- At 10 s: 39 held, the worst at 1.062 x (cprox-al, lad-20); 7 below their floor (dald-cc,
  admm, prox-al on the larger quick models at load 30), all within 1.0 x it; none overran.
- Before, in the first sweep of this branch at 1 s beside the same processes (load 14-34):
  cprox-al overran on 20 of 25 models (up to 2.9 x its first iteration: its limit did not
  count the model's compile, and the certificate after its last subproblem, seconds at
  that load, was not reserved); `centralized` overran on 6 (up to 2.3 x: its conic stage
  got the whole limit from its own start, so the model's compile, the route and the
  LCQP's data build were not counted); ssca 1.23 s (the certificate after its last round
  was not reserved).

## Notes (2026-11-26, branch tl; 2026-11-27, branch central)

- Before: on main (43d15b5) prox-al's exact-admm on sparse-logistic-d3000 ran 61.7 s
  against 60 s in `benchmarks/models.py` (20 dense 3000 x 3000 Newton factorisations per
  round). Earlier sweeps on this branch, before the fixes that followed them: fedprox and
  dald-cc on sparse-logistic-d3000 (full) ran 18.3 s and 15.9 s against 10 s (their local
  solves had no budget); at limits of 0.6-1.8 s prox-al overran by 12-33% (its set-up, up
  to 0.3 s, was not counted); admm cut inside Algorithm 2 said `max_iterations`.
- Not held then: `centralized` on sparse-logistic-d3000 at 3.49 s (4.00 s): cvxpy's
  compile of the pooled problem cannot be interrupted. Since branch central (2026-11-27)
  `centralized` builds Clarabel's data itself (`algorithms/centralized/direct.py`, 20 ms
  there), stops Clarabel between iterations when the last one says the next would end
  after the deadline (less a reserve for the certificate), and compiles the certificate's
  evaluators before the solve: the `centralized` rows below are that branch's (full and
  quick; `--min-limit 0.1` reruns at a third of the wall, and explicit limits on the
  three longest solves). Held at every limit from 0.19 s up (sparse-logistic-d3000 at
  3.49 s: 3.07 s). Over by a hair: quantile-communities at 0.11 s, a third of its
  0.33 s solve, 0.122 s (1.107 x); five reruns at 0.11 s ended at 0.11-0.12 s, one of
  them above 1.1 x: at that limit the fixed costs outside any solver in a fresh process
  (the certificate's evaluators ~45 ms, Clarabel's set-up ~20 ms and its first iteration,
  the certificate ~13 ms) take most of the time and the 11 ms slack is the machine's
  scheduling noise.
- dald-cc on sparse-logistic-ball (d = 10,000) was killed after 80 s in the branch's sweep:
  a party's local solve with the ball (a cone) went through cvxpy's parameterised (DPP)
  compile, 6-18 s and ~1.5 GB at n = 10,000, at every solve. Since main da449fd local
  problems with a cvxpy engine call Clarabel on the compiled data (`make_solver(direct=
  True)`); its row above is the rerun (`--limit 10 --models sparse-logistic-ball --methods
  dald-cc,fedprox`): held, 10.16 s.
- 2026-11-27 (main, after branch central): the limit counts from `model.solve`'s start
  (the model's compile included: `SOLVE_STARTED`); the driver's steps end the last
  evaluation round's duration before the deadline and another step is not begun when the
  shortest so far would end after it; exact-admm begins no inner round that would end
  after it. Before -> after: svm-20 (quick) at 0.29 s 0.33 -> 0.29 s; sparse-logistic-ball
  (d = 10,000) at 0.36 s 0.44 -> 0.22 s; sparse-logistic-d3000 (prox-quasi-newton) at
  0.1 s 0.126 -> 0.10 s. The prox-al and centralized rows are reruns on that main
  (`--limit 10 --min-limit 0.2 --methods prox-al,centralized`, quick and full, then the
  three small limits explicitly): every one held, except that `centralized` on
  quantile-communities at 0.11 s (a third of its 0.33 s solve) sits at the edge: of three
  reruns two held (0.12 s, 1.09 x) and one overran (1.12 x): the fixed costs of a cold
  process, above."""


def _floor_summary(floored: list[dict]) -> str:
    """The sentence on the runs held at their floor (a limit below it)."""
    if not floored:
        return ""
    w = max(floored, key=lambda r: r["wall"] / r["floor"])
    return (
        f" Held at their floor (a limit below it): {len(floored)}, the worst at "
        f"{w['wall'] / w['floor']:.3f} x its floor of {w['floor']:.2f} s ({w['model']}, "
        f"{w['method']}, limit {w['limit']:g} s)."
    )


def write_report(rows: list[dict], commands: list[str]) -> None:
    tested = [r for r in rows if verdict(r) in ("held", "held at floor", "overran")]
    # (a run held at its floor is judged against that floor, not the limit)
    worst = max(
        (r for r in tested if verdict(r) != "held at floor"),
        key=lambda r: r["wall"] / r["limit"],
        default=None,
    )
    lines = [
        "# time_limit: wall against the limit (benchmarks/time_limits.py)",
        "",
        "Generated by `benchmarks/time_limits.py`; commands:",
        "",
        *[f"    {c}" for c in commands],
        "",
        f"A run **overran** when the wall of `model.solve` exceeds {SLACK:g} x the limit "
        "(whatever its status); **held**: stopped by the limit within it; **held at "
        "floor**: the limit is below the smallest the run holds (its compile, set-up and "
        "one step with its evaluation round, `time_limit_floor` in the result: a run always "
        f"takes one step) and it ended within {SLACK:g} x that floor; **finished**: "
        "ended before the limit (no test of it). `solve` is the driver's own "
        "`timing['solve']` (from its first step to the end of the certificate round: "
        "without the set-up). Walls are noisy (a shared machine: `load` is the 1-minute "
        "load average after the run).",
        "",
        NOTES,
        "",
    ]
    if worst is not None:
        over = [r for r in tested if verdict(r) == "overran"]
        held = [r for r in tested if verdict(r) == "held"]
        floored = [r for r in tested if verdict(r) == "held at floor"]
        best = max(held, key=lambda r: r["wall"] / r["limit"], default=None)
        lines += [
            f"Runs that met their limit: {len(tested)}; overran: {len(over)}; worst wall / "
            f"limit {worst['wall'] / worst['limit']:.3f} ({worst['model']}, "
            f"{worst['method']}, limit {worst['limit']:g} s)"
            + (
                f"; worst of those that held {best['wall'] / best['limit']:.3f} "
                f"({best['model']}, {best['method']}, limit {best['limit']:g} s)."
                if best
                else "."
            )
            + _floor_summary(floored),
            "",
        ]
    lines += [
        "| model | size | method | limit (s) | status | wall (s) | wall / limit | "
        "solve / limit | rounds | inner | peak MB | load | verdict |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(rows, key=lambda r: (r["quick"], r["model"], r["method"], r["limit"])):
        wall, limit = r.get("wall"), r["limit"]
        solve = r.get("solve")
        lines.append(
            f"| {r['model']} | {'quick' if r['quick'] else 'full'} | {r['method']} | "
            f"{limit:g} | {r['status'][:60]} | {suite._fmt(wall, '.2f')} | "
            f"{suite._fmt(wall / limit if wall is not None else None, '.3f')} | "
            f"{suite._fmt(solve / limit if solve is not None else None, '.3f')} | "
            f"{r.get('rounds', '-')} | {r.get('inner_solver', '')} | "
            f"{suite._fmt(r.get('peak_mb'), '.0f')} | {suite._fmt(r.get('load1'), '.1f')} | "
            f"{verdict(r)} |"
        )
    MD.write_text("\n".join(lines) + "\n")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--models", default=",".join([*suite.MODELS, *EXTRA]), help="comma-separated subset"
    )
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--limit", type=float, default=2.0, help="time_limit of every solve (s)")
    ap.add_argument("--quick", action="store_true", help="the suite's small sizes")
    ap.add_argument(
        "--rerun-fraction",
        type=float,
        default=1 / 3,
        help="a run that finished before --limit is run again with this fraction of its wall "
        "as its limit, when that is at least --min-limit (0: never)",
    )
    ap.add_argument("--min-limit", type=float, default=0.5, help="smallest limit of a rerun (s)")
    ap.add_argument(
        "--busy",
        type=int,
        default=0,
        help="CPU-bound processes to run beside the solves (a busy machine), stopped at the end",
    )
    args = ap.parse_args(argv)
    names = [s for s in args.models.split(",") if s]
    unknown = [s for s in names if s not in suite.MODELS and s not in EXTRA]
    if unknown:
        ap.error(f"unknown models {unknown}; choose from {[*suite.MODELS, *EXTRA]}")
    methods = [s for s in args.methods.split(",") if s]
    command = "python benchmarks/time_limits.py " + " ".join(sys.argv[1:] if argv is None else argv)
    from fedmodel.algorithms.registry import method_spec

    for method in methods:  # (imported before the forks, as models.py does)
        method_spec(method)
    data = json.loads(JSON.read_text()) if JSON.exists() else {"rows": [], "commands": []}
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # (the busy ones stop too)
    try:
        sweep(args, names, methods, command, data)
    finally:
        for p in busy:
            p.kill()
            p.wait()


def sweep(args, names: list[str], methods: list[str], command: str, data: dict) -> None:
    """Run every (model, method) at ``args.limit`` (and its reruns); the rows go to the
    results files as they come."""
    for name in names:
        for method in methods:
            limit = args.limit
            while limit:
                row = run_isolated(name, method, args.quick, limit)
                data["rows"] = [r for r in data["rows"] if _key(r) != _key(row)] + [row]
                if command not in data["commands"]:
                    data["commands"].append(command)
                JSON.write_text(json.dumps(data, indent=1, default=float))
                write_report(data["rows"], data["commands"])
                print(
                    f"{name:24s} {method:12s} {row['status'][:40]:40s} "
                    f"wall={suite._fmt(row.get('wall'), '.2f')} limit={limit:g} "
                    f"-> {verdict(row)}",
                    flush=True,
                )
                # finished before the limit: again with a limit it would otherwise pass
                again = round(args.rerun_fraction * row.get("wall", 0.0), 2)
                if verdict(row) != "finished" or limit != args.limit or again < args.min_limit:
                    break
                limit = again


if __name__ == "__main__":
    main()
