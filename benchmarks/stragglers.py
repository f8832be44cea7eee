"""Stragglers: prox-al with ``quorum`` on the processes backend, one slow client injected,
against waiting for every client in the same run.

    python benchmarks/stragglers.py                          # ls-box-n100, c0 sleeps 0.3 s
    python benchmarks/stragglers.py --sleep 2 --times 3      # c0 sleeps 2 s in 3 steps only
    python benchmarks/stragglers.py --case ls-box-n10 --workers 10 --quorum 0.9
    python benchmarks/stragglers.py --case ls-box-n10 --workers 10 --stagger --sleep 1 \
        --quorum 0.8 --max-delay 3                         # each client slow once

The case is ``benchmarks/scaling.py``'s (least squares over N clients, d = 20, an active
server box). Client ``c0`` sleeps ``--sleep`` seconds in each of its exact-admm steps, or
in its first ``--times`` of them (:class:`~fedmodel.runtime.faults.Fault`); with
``--stagger`` client ``c<i>`` sleeps once instead, in its first step from round ``4 + 2i``
(a different client late every other round). The clients run on ``--workers`` worker
processes (a worker takes its clients' steps one after the other: the clients that share
``c0``'s worker queue behind it). After an untimed solve that starts the workers, three
runs, in this order, each with the same faults:

* ``default``: prox-al at its defaults (every round waits for every client);
* ``exact-admm``: the inner solver that ``quorum`` takes, waiting for every client;
* ``quorum``: ``--quorum`` of the clients per round, ``--max-delay`` (default: the
  option's default).

Each row gives the status, the rounds (communication and inner), the wall seconds, the gap
``(f(x) - f*) / max(1, |f*|)`` against Clarabel on the pooled problem (solved in the same
run) and, under quorum, the late replies, their largest delay in rounds and the rounds in
which the server waited for a step at the delay bound. ``benchmarks/RESULTS_stragglers.md``
keeps the rows of the last run per setting (the wall clocks of a shared machine: compare rows
of one run only).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from scaling import build  # noqa: E402

from fedmodel.algorithms.proxal.options import ProxALOptions  # noqa: E402
from fedmodel.algorithms.proxal.server import run_prox_al  # noqa: E402
from fedmodel.runtime.faults import Fault  # noqa: E402

OUT = HERE / "RESULTS_stragglers.md"
RUNS = {
    "default": {},
    "exact-admm": {"inner_solver": "exact-admm"},
    "quorum": None,  # (filled from --quorum)
}


def run(args) -> list[dict]:
    """The three runs of ``args.case`` with ``c0`` sleeping ``args.sleep`` s per step."""
    case, sleep, quorum = args.case, args.sleep, args.quorum
    built = build(case)
    built.pooled.solve(solver="CLARABEL")
    fstar = float(built.pooled.value)
    compiled = built.model.compile()
    kinds = ("xadmm_w",)
    if args.stagger:
        names = [c.name for c in compiled.clients]
        faults = {
            n: Fault("sleep", round=4 + 2 * i, times=1, seconds=sleep, kinds=kinds)
            for i, n in enumerate(names)
        }
    else:
        faults = {"c0": Fault("sleep", round=1, times=args.times, seconds=sleep, kinds=kinds)}
    # (a first solve starts the worker processes, which the runs below reuse: not timed)
    run_prox_al(compiled, ProxALOptions(backend="processes", workers=args.workers, max_outer=1))
    rows = []
    for name, extra in RUNS.items():
        extra = {"quorum": quorum, "max_delay": args.max_delay} if extra is None else extra
        opts = ProxALOptions(
            backend="processes", workers=args.workers, time_limit=args.time_limit, **extra
        )
        t0 = time.perf_counter()
        res = run_prox_al(compiled, opts, "prox-al", faults=faults)
        wall = time.perf_counter() - t0
        row = {
            "run": name,
            "route": res.extra.get("inner_solver"),
            "status": res.status,
            "communication": res.rounds.get("communication"),
            "inner": res.rounds.get("inner"),
            "wall": wall,
            "gap": (res.objective - fstar) / max(1.0, abs(fstar)),
            "quorum": res.extra.get("quorum"),
        }
        rows.append(row)
        print(row, flush=True)
    return rows


def title(args) -> str:
    steps = "every step" if args.times is None else f"{args.times} steps"
    who = f"c0 sleeps {args.sleep:g} s in {steps}"
    if args.stagger:
        who = f"each client sleeps {args.sleep:g} s once (staggered)"
    delay = "" if args.max_delay is None else f", max_delay {args.max_delay}"
    return f"{args.case}: {who}, {args.workers} workers, quorum {args.quorum:g}{delay}"


def report(args, rows: list[dict]) -> list[str]:
    ref = next(r for r in rows if r["run"] == "exact-admm")
    load = os.getloadavg()[0]
    times = "" if args.times is None else f" --times {args.times}"
    times += " --stagger" if args.stagger else ""
    times += "" if args.max_delay is None else f" --max-delay {args.max_delay}"
    lines = [
        f"## {title(args)}",
        "",
        f"`python benchmarks/stragglers.py --case {args.case} --sleep {args.sleep:g}{times} "
        f"--workers {args.workers} --quorum {args.quorum:g}`; {platform.node()}, "
        f"{os.cpu_count()} cores, load {load:.1f} at the end.",
        "",
        "| run | inner solver | status | rounds (comm / inner) | wall s | wall / exact-admm "
        "| gap | late replies | max delay | waits at the bound |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        q = r["quorum"] or {}
        lines.append(
            f"| {r['run']} | {r['route']} | {r['status']} | {r['communication']} / "
            f"{r['inner']} | {r['wall']:.1f} | {r['wall'] / ref['wall']:.2f} | "
            f"{r['gap']:.1e} | {q.get('late_replies', '')} | {q.get('max_staleness', '')} | "
            f"{q.get('delay_waits', '')} |"
        )
    return lines


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--case", default="ls-box-n100")
    ap.add_argument("--sleep", type=float, default=0.3, help="c0's seconds per step")
    ap.add_argument("--times", type=int, default=None, help="c0's slow steps (default: all)")
    ap.add_argument("--stagger", action="store_true", help="every client slow once")
    ap.add_argument("--max-delay", type=int, default=None)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--quorum", type=float, default=0.5)
    ap.add_argument("--time-limit", type=float, default=600.0)
    args = ap.parse_args(argv)
    rows = run(args)
    lines = report(args, rows)
    sections = {}
    if OUT.exists():  # (the other settings' sections stay)
        text = OUT.read_text().split("\n## ")[1:]
        sections = {s.split("\n")[0]: "## " + s.rstrip() for s in text}
    sections[title(args)] = "\n".join(lines)
    head = [
        "# Stragglers: prox-al with quorum against waiting for every client",
        "",
        "Written by `benchmarks/stragglers.py` (see its docstring); one section per "
        "setting, the rows of one run each.",
        "",
    ]
    body = "\n\n".join(sections[k] for k in sorted(sections))
    OUT.write_text("\n".join(head) + "\n" + body + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
