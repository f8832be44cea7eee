"""Multi-task logistic regression with a nuclear-norm regulariser: prox-al against pooled
Clarabel.

    python benchmarks/nuclear_norm.py                 # 3 tasks x 80 features, 5 clients
    python benchmarks/nuclear_norm.py --repeat 3 --eps 1e-3,1e-6

The model (:func:`multitask_model`): ``T`` tasks share the features; client ``i`` holds
``X_i`` (rows x features) and the labels ``Y_i`` (rows x tasks, +-1) and minimises its
share of the mean logistic loss of ``X_i W`` against ``Y_i``; ``h = lam ||W||_*``, the
nuclear norm of the weight matrix (``features x tasks``), whose prox is closed form (SVD
soft-thresholding, :mod:`fedmodel.compiler.regularizer`). The labels come from a
rank-one weight matrix plus noise.

Rows: plain cvxpy + Clarabel on the pooled problem (its wall includes cvxpy's compile;
its optimum ``f*`` judges the others), and prox-al at its defaults with each ``eps``
(rounds, wall, relative gap ``(f - f*) / max(1, |f*|)``, the wall over Clarabel's), and
at eps = 1e-3 with the nuclear norm written as the server's objective term (which the
DSL adds to ``h``).
Results: ``benchmarks/RESULTS_nuclear_norm.md`` (table and command, rewritten by a run).
"""

from __future__ import annotations

import os

for _var in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OMP_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import platform  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import cvxpy as cp  # noqa: E402
import numpy as np  # noqa: E402

import fedmodel as fm  # noqa: E402

MD = Path(__file__).resolve().parent / "RESULTS_nuclear_norm.md"


def multitask_data(tasks=3, features=80, clients=5, rows=60, seed=0):
    """Each client's ``(X_i, Y_i)``: Gaussian features, labels of a rank-one weight matrix
    plus noise."""
    rng = np.random.default_rng(seed)
    W = rng.normal(size=(features, 1)) @ rng.normal(size=(1, tasks))
    W += 0.1 * rng.normal(size=(features, tasks))
    parts = []
    for _ in range(clients):
        X = rng.normal(size=(rows, features))
        parts.append((X, np.sign(X @ W + 0.5 * rng.normal(size=(rows, tasks)))))
    return parts


def _loss(X, Y, W, N):
    return cp.sum(cp.logistic(-cp.multiply(Y, X @ W))) / N


def multitask_model(parts, lam: float, server_term: bool = False) -> fm.Model:
    """The federated model: each client its loss share, ``lam ||W||_*`` in ``h`` (with
    ``server_term``, written as the server's objective term instead)."""
    N = sum(X.shape[0] for X, _ in parts)
    model = fm.Model("multitask-nuclear")
    W = model.variable((parts[0][0].shape[1], parts[0][1].shape[1]), name="W")
    for i, (X, Y) in enumerate(parts):
        site = model.client(f"client{i}")
        site.minimize(_loss(site.data(X, name="X"), site.data(Y, name="Y"), W, N), name="loss")
    if server_term:
        model.server.minimize(lam * cp.normNuc(W), name="nuclear")
    else:
        model.regularize(lam * cp.normNuc(W))
    return model


def pooled_problem(parts, lam: float) -> tuple[cp.Problem, cp.Variable]:
    N = sum(X.shape[0] for X, _ in parts)
    W = cp.Variable((parts[0][0].shape[1], parts[0][1].shape[1]))
    objective = sum(_loss(X, Y, W, N) for X, Y in parts) + lam * cp.normNuc(W)
    return cp.Problem(cp.Minimize(objective)), W


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tasks", type=int, default=3)
    ap.add_argument("--features", type=int, default=80)
    ap.add_argument("--clients", type=int, default=5)
    ap.add_argument("--rows", type=int, default=60, help="rows per client")
    ap.add_argument("--lam", type=float, default=0.05)
    ap.add_argument("--eps", default="1e-3,1e-6")
    ap.add_argument("--repeat", type=int, default=1, help="prox-al solves per eps (median)")
    ap.add_argument("--time-limit", type=float, default=120.0)
    args = ap.parse_args(argv)
    parts = multitask_data(args.tasks, args.features, args.clients, args.rows)
    problem, W = pooled_problem(parts, args.lam)
    t0 = time.perf_counter()
    problem.solve(solver="CLARABEL")
    clarabel_wall = time.perf_counter() - t0
    f_star = float(problem.value)
    rank = int(np.sum(np.linalg.svd(W.value, compute_uv=False) > 1e-6))
    rows = [("cvxpy + Clarabel (pooled)", problem.status, "-", clarabel_wall, 0.0, 1.0, "")]
    runs = [(float(e), False) for e in args.eps.split(",")] + [(1e-3, True)]
    for eps, server_term in runs:
        walls, res = [], None
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            res = multitask_model(parts, args.lam, server_term).solve(
                method="prox-al", eps=eps, time_limit=args.time_limit
            )
            walls.append(time.perf_counter() - t0)
        wall = float(np.median(walls))
        gap = (res.objective - f_star) / max(1.0, abs(f_star))
        rows.append(
            (
                f"prox-al eps={eps:g}" + (" (server term)" if server_term else ""),
                res.status,
                res.rounds.get("communication", 0),
                wall,
                gap,
                wall / clarabel_wall,
                res.extra.get("inner_solver", ""),
            )
        )
        print(rows[-1], flush=True)
    command = "python benchmarks/nuclear_norm.py " + " ".join(argv or sys.argv[1:])
    lines = [
        "# Multi-task logistic regression with a nuclear-norm h: prox-al against Clarabel",
        "",
        "Written by `benchmarks/nuclear_norm.py` (its docstring defines the model). Command:",
        "",
        f"    {command.strip()}",
        "",
        f"{args.tasks} tasks x {args.features} features, {args.clients} clients x "
        f"{args.rows} rows, lam = {args.lam:g}; f* = {f_star:.10g} (rank of the pooled "
        f"solution {rank}). prox-al walls are the median of {args.repeat} solve(s), each "
        "with its compile. Machine: "
        f"{platform.machine()}, {os.cpu_count()} cores shared with other jobs (1-minute "
        f"load {os.getloadavg()[0]:.1f} at the end).",
        "",
        "| solver | status | rounds | wall s | gap | wall / Clarabel | inner solver |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, status, rounds, wall, gap, ratio, inner in rows:
        lines.append(
            f"| {name} | {status} | {rounds} | {wall:.2f} | {gap:.1e} | {ratio:.3f} | {inner} |"
        )
    MD.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
