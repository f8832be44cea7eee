"""Where prox-al's rounds go on Adult Neyman-Pearson: one line per outer iteration.

    python benchmarks/outer_trace.py                                   # defaults, 20 sites
    python benchmarks/outer_trace.py --options '{"inner_solver": "newton"}'
    python benchmarks/outer_trace.py --sites 5 --options '{"prox_beta": 1e5, "beta": 300}'

For each outer iteration k of Algorithm 1 it prints the inner solve's rounds, ``tau_k``, and
what test (8) read after the multiplier update: the measured stationarity of the Lagrangian
(``||grad l_k(w^{k+1}) - (w^{k+1} - w^k) / prox_beta||_inf``; (quasi-)Newton inner
solvers), the largest violation and complementarity, and ``||Delta mu||_inf``. Test (8)
stops at stationarity ``<= 0.01 eps`` and violation ``<= 0.001 eps`` (``kkt_factor``). Then
the totals: communication rounds, outer iterations, inner rounds, wall and objective.

Used for the outer-loop analysis in docs/performance.md ("The outer loop on Adult NP:
second-order multiplier step and model extrapolation, measured"): at the O(d) default
about 130 of the 168 rounds are inner rounds, and the last ~25 outer iterations crawl at
2-4 rounds each.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

for _var in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OMP_NUM_THREADS"):
    os.environ[_var] = "1"

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from cases import np_sites  # noqa: E402

#: the history columns printed, with their short headers
COLUMNS = (
    ("inner_iterations", "inner"),
    ("tau", "tau_k"),
    ("stationarity_measured", "stationarity"),
    ("violation_measured", "violation"),
    ("complementarity_measured", "complementarity"),
    ("dmu_inf", "dmu"),
)


def cell(v) -> str:
    """One table cell: floats to 3 significant digits, missing values empty."""
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.3g}"
    return str(v)


def main(argv=None) -> None:
    from fedmodel.models import neyman_pearson_model

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sites", type=int, default=20)
    ap.add_argument("--options", default="{}", help="prox-al options as JSON")
    ap.add_argument("--eps", type=float, default=1e-3)
    ap.add_argument("--time-limit", type=float, default=200.0)
    args = ap.parse_args(argv)
    options = json.loads(args.options)
    model = neyman_pearson_model(np_sites(args.sites), r=0.2)
    start = time.perf_counter()
    res = model.solve(
        method="prox-al", eps=args.eps, time_limit=args.time_limit, history=True, **options
    )
    wall = time.perf_counter() - start
    print("| k | " + " | ".join(h for _, h in COLUMNS) + " |")
    print("|---" * (len(COLUMNS) + 1) + "|")
    for k, row in enumerate(res.history):
        print(f"| {k} | " + " | ".join(cell(row.get(c)) for c, _ in COLUMNS) + " |")
    print(
        f"\n{res.status}: {res.rounds.get('communication')} rounds, {res.rounds.get('outer')} "
        f"outer iterations, {res.rounds.get('inner')} inner rounds, {wall:.2f} s, objective "
        f"{float(res.objective):.8g}, inner solver {res.extra.get('inner_solver')}"
    )


if __name__ == "__main__":
    main()
