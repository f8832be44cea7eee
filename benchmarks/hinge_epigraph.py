"""Hinge-loss SVM through its epigraph: Newton's dense KKT solve vs the Schur complement.

    python benchmarks/hinge_epigraph.py                 # writes benchmarks/RESULTS_hinge.md
    python benchmarks/hinge_epigraph.py --rows 100,200  # other sizes
    python benchmarks/hinge_epigraph.py --dense-only    # only the dense path (the "before")

A soft-margin SVM (mean hinge loss + ridge on the server) with one client holding ``rows``
samples of 5 features, solved by prox-al to eps = 1e-4. The hinge becomes one epigraph
variable per row (``fedmodel/dsl/epigraph.py``), so the client's Newton system has
``5 + rows`` unknowns; its epigraph block is diagonal, and the Schur complement
(``subproblems/newton.py``, ``SCHUR_MIN_BLOCK``) eliminates it, leaving a 5 x 5 system;
the constraint matrix (two rows per sample, 6 nonzeros each) is multiplied in sparse form
(``SPARSE_MATVEC_DENSITY``). "Dense" switches both off, i.e. the code before the change.
Both paths must reach the same point (max |x - x_dense| is reported).
"""

from __future__ import annotations

import os

for _var in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OMP_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import platform  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import cvxpy as cp  # noqa: E402
import numpy as np  # noqa: E402

import fedmodel as fm  # noqa: E402
from fedmodel.subproblems import newton  # noqa: E402

D = 5


def svm(rows: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(rows, D))
    labels = np.sign(X @ rng.normal(size=D) + 0.5 * rng.normal(size=rows))
    model = fm.Model(f"svm-{rows}")
    w = model.variable(D, name="w")
    model.server.minimize(0.05 * cp.sum_squares(w))
    site = model.client("c0")
    Xd, yd = site.data(X, name="X"), site.data(labels, name="labels")
    site.minimize(cp.sum(cp.pos(1 - cp.multiply(yd, Xd @ w))) / rows, name="hinge")
    W = cp.Variable(D)
    ref = cp.Problem(
        cp.Minimize(
            0.05 * cp.sum_squares(W) + cp.sum(cp.pos(1 - cp.multiply(labels, X @ W))) / rows
        )
    )
    ref.solve(solver="CLARABEL")
    return model, float(ref.value)


def run(rows: int, dense: bool, eps: float):
    model, ref = svm(rows)
    saved = newton.SCHUR_MIN_BLOCK, newton.SPARSE_MATVEC_DENSITY
    if dense:  # the code before the change: no Schur complement, dense products
        newton.SCHUR_MIN_BLOCK, newton.SPARSE_MATVEC_DENSITY = 10**9, -1.0
    try:
        t0 = time.perf_counter()
        res = model.solve(method="prox-al", eps=eps)
        wall = time.perf_counter() - t0
    finally:
        newton.SCHUR_MIN_BLOCK, newton.SPARSE_MATVEC_DENSITY = saved
    return res, wall, ref


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="100,200,400,800")
    ap.add_argument("--eps", type=float, default=1e-4)
    ap.add_argument("--dense-only", action="store_true")
    ap.add_argument("--out", default=str(Path(__file__).with_name("RESULTS_hinge.md")))
    args = ap.parse_args()
    lines = [
        "# Hinge epigraph: dense Newton KKT solve vs Schur complement + sparse products",
        "",
        f"`python benchmarks/hinge_epigraph.py --rows {args.rows}` on {platform.machine()}, "
        f"Python {platform.python_version()}, one BLAS thread; prox-al to eps = {args.eps:g}, "
        f"one client, {D} features, one epigraph variable per row.",
        "",
        "| rows | path | wall (s) | status | outer | inner | objective rel. diff vs Clarabel "
        "| max abs x diff vs dense |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for rows in [int(r) for r in args.rows.split(",")]:
        dense, t_dense, ref = run(rows, True, args.eps)
        rel = abs(dense.objective - ref) / max(1.0, abs(ref))
        row = (
            f"| {rows} | dense | {t_dense:.2f} | {dense.status} | {dense.rounds['outer']} | "
            f"{dense.rounds['inner']} | {rel:.1e} | 0 |"
        )
        lines.append(row)
        print(row, flush=True)
        if args.dense_only:
            continue
        schur, t_schur, _ = run(rows, False, args.eps)
        rel = abs(schur.objective - ref) / max(1.0, abs(ref))
        diff = float(np.abs(schur.x - dense.x).max())
        row = (
            f"| {rows} | Schur | {t_schur:.2f} | {schur.status} | {schur.rounds['outer']} | "
            f"{schur.rounds['inner']} | {rel:.1e} | {diff:.1e} |"
        )
        lines.append(row)
        print(row, flush=True)
    load = os.getloadavg()
    lines += [
        "",
        f"Load average when the run ended: {load[0]:.2f} (1 min), {load[1]:.2f} (5 min) on a "
        "shared machine: wall times are indicative, the iterates are identical.",
    ]
    Path(args.out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
