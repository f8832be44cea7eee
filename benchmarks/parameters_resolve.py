"""Re-solving after a cvxpy Parameter change: the compiled model is reused.

A model of ``clients`` sites (least squares on ``rows x d`` data, each with the bound
``sum(w) <= budget``, ``budget`` a ``cp.Parameter``, and ``lam * ||w||_2^2`` in ``h``,
``lam`` a Parameter) is solved with prox-al on the serial backend; then ``budget`` and
``lam`` change and it is solved again, ``repeats`` times. Each re-solve is timed twice in
the same run: reusing the compiled model (what ``model.solve`` does) and with the cache
dropped (``model._compiled = None``: every solve partitions and compiles the evaluators
anew, as before). Reported: the model compile (``timing["model_compile"]``), the runner's
set-up (``timing["compile"]``: endpoints and their subproblems) and the total wall, medians
over the repeats; and that both answers agree with plain cvxpy at the new values.

    python benchmarks/parameters_resolve.py            # writes results_parameters.json
                                                       # and RESULTS_parameters.md
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import cvxpy as cp
import numpy as np

import fedmodel as fm

HERE = Path(__file__).resolve().parent


def build(clients: int, rows: int, d: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    budget = cp.Parameter(nonneg=True, value=1.0, name="budget")
    lam = cp.Parameter(nonneg=True, value=0.1, name="lam")
    model = fm.Model("resolve")
    w = model.variable(d, name="w")
    data = []
    for k in range(clients):
        site = model.client(f"site{k}")
        X = rng.normal(size=(rows, d))
        y = X @ rng.normal(size=d) + 0.1 * rng.normal(size=rows) + 1.0
        data.append((X, y))
        Xd = site.data(X, name="X")
        site.minimize(cp.sum_squares(Xd @ w - y) / (rows * clients))
        site.subject_to(cp.sum(w) <= budget)
    model.regularize(lam * cp.sum_squares(w))
    return model, w, budget, lam, data


def pooled(data, d: int, budget: float, lam: float) -> float:
    x = cp.Variable(d)
    n = sum(len(y) for _, y in data)
    objective = sum(cp.sum_squares(X @ x - y) for X, y in data) / n + lam * cp.sum_squares(x)
    problem = cp.Problem(cp.Minimize(objective), [cp.sum(x) <= budget])
    problem.solve(solver=cp.CLARABEL)
    return float(problem.value)


def timed_solve(model, eps: float) -> tuple[dict, object]:
    t0 = time.perf_counter()
    res = model.solve(method="prox-al", eps=eps)
    wall = time.perf_counter() - t0
    row = {
        "model_compile_s": res.timing["model_compile"],
        "runner_setup_s": res.timing["compile"],
        "wall_s": wall,
    }
    return row, res


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--rows", type=int, default=100)
    parser.add_argument("--d", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--eps", type=float, default=1e-6)
    parser.add_argument("--out", default=str(HERE / "results_parameters.json"))
    args = parser.parse_args(argv)
    model, w, budget, lam, data = build(args.clients, args.rows, args.d)
    first, res = timed_solve(model, args.eps)
    worst = abs(res.objective - pooled(data, args.d, 1.0, 0.1)) / abs(res.objective)
    reused, fresh = [], []
    rng = np.random.default_rng(1)
    for _ in range(args.repeats):
        b, lv = float(rng.uniform(0.2, 1.0)), float(rng.uniform(0.01, 0.2))
        budget.value, lam.value = b, lv
        ref = pooled(data, args.d, b, lv)
        for rows, drop in ((reused, False), (fresh, True)):
            if drop:
                model._compiled = None  # the behaviour before the cache: compile anew
            row, res = timed_solve(model, args.eps)
            assert res.status == "optimal", res.message
            worst = max(worst, abs(res.objective - ref) / abs(ref))
            rows.append(row)

    def median(rows, key):
        return statistics.median(r[key] for r in rows)

    keys = ("model_compile_s", "runner_setup_s", "wall_s")
    summary = {
        "problem": {k: getattr(args, k) for k in ("clients", "rows", "d", "repeats", "eps")},
        "first_solve": first,
        "resolve_reused": {k: median(reused, k) for k in keys},
        "resolve_recompiled": {k: median(fresh, k) for k in keys},
        "max_relative_objective_difference_vs_cvxpy": worst,
    }
    Path(args.out).write_text(json.dumps(summary, indent=2) + "\n")
    lines = [
        "# Re-solving after a Parameter change (benchmarks/parameters_resolve.py)",
        "",
        f"prox-al, serial backend, {args.clients} clients x {args.rows} rows, d = {args.d}, "
        f"eps = {args.eps:g}; medians over {args.repeats} re-solves with new `budget` and "
        "`lam` values. Wall times are noisy (shared machine): compare the rows of one run.",
        "",
        "| solve | model compile (s) | runner set-up (s) | total wall (s) |",
        "|---|---|---|---|",
    ]
    for label, row in (
        ("first solve", first),
        ("re-solve, compiled model reused", summary["resolve_reused"]),
        ("re-solve, compiled anew (before)", summary["resolve_recompiled"]),
    ):
        lines.append(
            f"| {label} | {row['model_compile_s']:.4f} | {row['runner_setup_s']:.4f} "
            f"| {row['wall_s']:.3f} |"
        )
    lines += [
        "",
        "Largest relative objective difference against plain cvxpy at the same values: "
        f"{worst:.1e}.",
        "",
    ]
    (HERE / "RESULTS_parameters.md").write_text("\n".join(lines))
    print("\n".join(lines))
    return summary


if __name__ == "__main__":
    main()
