"""Wall time of fair-vfl with one slow party, synchronous rounds vs ``asynchronous=True``
(real asynchrony on processes/Ray).

The problem is ``small_problem()`` of ``tests/test_vfl.py`` (n = 240, 3 parties), eps =
0.05, eta = 2, Q = 2, c = 0, stopping on the gap (12) <= 1e-6, ``monitor_every=50``, one
worker per party; party2 sleeps ``--sleep`` seconds per job (``Fault("sleep", ...)``). The
workers are warmed by a 2-round solve first. Prints one Markdown row per mode:

    OPENBLAS_NUM_THREADS=1 python benchmarks/vfl_async.py --backend processes --sleep 0.03
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]

from test_vfl import small_problem  # noqa: E402

from fedmodel.algorithms.vfl.reference import solve_constrained  # noqa: E402
from fedmodel.algorithms.vfl.run import solve_vertical  # noqa: E402
from fedmodel.runtime.faults import Fault  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="processes", choices=("processes", "ray"))
    ap.add_argument("--sleep", type=float, default=0.03)
    args = ap.parse_args()
    prob = small_problem()
    ref = solve_constrained(prob, eps=0.05)
    kw = dict(eps=0.05, eta=2.0, Q=2, c=0.0, tol=1e-6, monitor_every=50)
    kw.update(backend=args.backend, workers=3)
    slow = {"party2": Fault("sleep", round=2, times=None, seconds=args.sleep, kinds=("vfl_round",))}
    solve_vertical(prob, "fair-vfl", max_rounds=2, **kw)  # start (warm) the workers
    for asynchronous in (False, True):
        t0 = time.perf_counter()
        r = solve_vertical(
            prob, "fair-vfl", max_rounds=20_000, asynchronous=asynchronous, faults=slow, **kw
        )
        wall = time.perf_counter() - t0
        s = r.extra["asynchrony"]["parties"]["party2"]
        err = np.abs(r.extra["lambda"] - ref.extra["lambda"]).max()
        mode = "async" if asynchronous else "sync"
        print(
            f"| {args.backend} | {mode} | {r.status} | {r.rounds['outer']} | "
            f"{r.timing['solve']:.2f} | {wall:.2f} | {s['replies']} | {s['silent_rounds']} | "
            f"{s['max_staleness']} | {err:.1e} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
