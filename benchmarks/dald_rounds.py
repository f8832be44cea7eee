"""Rounds and wall time to reach a relative objective difference of 1e-4 (seed 004 methods
against the baselines and seed 000's methods).

    python benchmarks/dald_rounds.py            # writes benchmarks/RESULTS_dald.md
    python benchmarks/dald_rounds.py --quick    # small caps, for a smoke test

Models (both unconstrained, so every method applies):

* diabetes: least squares ``(1/N) sum (a^T w - b)^2`` on the bundled diabetes data
  (standardized features + intercept), 3 clients (rows shuffled with seed 0, thirds);
* mnist: l1-regularised logistic regression, MNIST 3 vs 7 from the bundled subset (pixels
  scaled to [0, 1], intercept), 10 clients with seed 004's stride split, ``f_i = (1/N)
  sum log(1 + exp(-b a^T w))`` and ``h = 1e-2 ||w||_1``.

Relative difference = ``|f(w) + h(w) - f* - h*| / |f* + h*|`` against
``method="centralized"``. For the methods that log every round (dald-cc, dald-dc,
fedprox, fedavg) a first run with diagnostics finds the first communication round ``R``
at which the returned point (x_hat, the root's iterate, the server model) is within 1e-4;
a second run of exactly ``R`` rounds without diagnostics gives the wall time. admm and
prox-al (seed 000) are run with tolerances ``eps`` = 1e-2, 1e-3, ... and the first run
within 1e-4 is reported (its rounds and solve time). Rounds are communication rounds: for
dald-dc one round is one sweep of the hierarchy (the nodes solve one after another).
Runs are capped (rounds and seconds); "not reached" says so.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

import cvxpy as cp
import numpy as np

import fedmodel as fm
from fedmodel.datasets import load_diabetes, load_mnist
from fedmodel.reproduce.dald import stride_split

TARGET = 1e-4


def diabetes_model():
    ds = load_diabetes(standardize=True)
    X, y = ds.X, ds.y
    parts = np.array_split(np.random.default_rng(0).permutation(len(y)), 3)
    m = fm.Model("diabetes")
    w = m.variable(X.shape[1], name="w")
    for i, p in enumerate(parts):
        c = m.client(f"node{i + 1}")
        A, b = c.data(X[p], name="A"), c.data(y[p], name="b")
        c.minimize(cp.sum_squares(A @ w - b) / len(y))
    return m


def mnist_model(n: int = 10, lam: float = 1e-2):
    ds = load_mnist(digits=(3, 7))
    X, b = ds.X, 2.0 * ds.y - 1.0
    parts = stride_split(b, n)
    N = sum(len(p) for p in parts)
    m = fm.Model("mnist")
    w = m.variable(X.shape[1], name="w")
    for i, p in enumerate(parts):
        c = m.client(f"c{i}")
        M = c.data(X[p] * b[p, None], name="M")
        c.minimize(cp.sum(cp.logistic(-(M @ w))) / N)
    m.regularize(lam * cp.norm1(w))
    return m


def per_round(model, ref, method, label, opts, cap_rounds, cap_seconds):
    """First round within TARGET (run with diagnostics), then a timed run of that length."""
    cap_key = "max_rounds" if method in ("fedavg", "fedprox") else "max_iter"
    f_star = ref.objective
    t0 = time.perf_counter()
    res = model.solve(method, **opts, **{cap_key: cap_rounds}, time_limit=cap_seconds, history=True)
    probe_seconds = time.perf_counter() - t0
    rels = [abs(h["objective"] - f_star) / abs(f_star) for h in res.history]
    hit = next((h for h, r in zip(res.history, rels) if r <= TARGET), None)
    row = {
        "model": model.name,
        "method": label,
        "final_rel": rels[-1] if rels else float("nan"),
        "probe_rounds": res.rounds["communication"],
        "probe_seconds": probe_seconds,
        "status": res.status,
    }
    if hit is None:
        row.update(rounds=None, seconds=None)
        return row
    rounds = int(hit["rounds"]) if "rounds" in hit else int(hit["iteration"])
    inner = int(hit.get("inner_total", hit["iteration"]))
    timed = (
        model.solve(
            method, **opts, **{cap_key: inner}, eps_dual=1e-300, eps_pri=1e-300, history=False
        )
        if method.startswith("dald")
        else model.solve(method, **opts, **{cap_key: inner}, tol=1e-300, history=False)
    )
    comm = timed.communication
    row.update(
        rounds=rounds,
        seconds=timed.timing["solve"],
        messages=comm["messages"]
        if "messages" in comm
        else comm["messages_up"] + comm["messages_down"],
        floats=comm["floats"] if "floats" in comm else comm["floats_up"] + comm["floats_down"],
        check_rel=timed.compare(ref).relative_objective_difference,
    )
    return row


def by_tolerance(model, ref, method, label, opts, cap_seconds, epss):
    row = {"model": model.name, "method": label}
    last = None
    for eps in epss:
        t0 = time.perf_counter()
        res = model.solve(method, eps=eps, time_limit=cap_seconds, history=False, **opts)
        wall = time.perf_counter() - t0
        rel = res.compare(ref).relative_objective_difference
        last = (eps, rel, res, wall)
        if rel <= TARGET:
            comm = res.communication
            row.update(
                rounds=res.rounds["communication"],
                seconds=res.timing["solve"],
                messages=comm["messages_up"] + comm["messages_down"],
                floats=comm["floats_up"] + comm["floats_down"],
                eps=eps,
                final_rel=rel,
                status=res.status,
            )
            return row
        if res.status == "time_limit":
            break
    eps, rel, res, wall = last
    row.update(
        rounds=None,
        seconds=None,
        eps=eps,
        final_rel=rel,
        status=res.status,
        probe_rounds=res.rounds["communication"],
        probe_seconds=wall,
    )
    return row


def configurations(quick: bool):
    cap_r = 400 if quick else 6000
    cap_s = 30.0 if quick else 300.0
    epss = (1e-2, 1e-3) if quick else (1e-2, 1e-3, 1e-4, 1e-5, 1e-6)
    pg = {"local_solver": "prox-grad", "local_steps": 5}
    per_round_runs = {
        "diabetes": [
            ("dald-cc", "dald-cc (exact, rho=1)", {}),
            ("dald-dc", "dald-dc (exact, rho=1, chain)", {}),
            ("dald-cc", "dald-cc (exact, rho=0.3)", {"rho": 0.3}),
            ("dald-dc", "dald-dc (exact, rho=0.3, chain)", {"rho": 0.3}),
            ("fedprox", "fedprox (exact, prox_coef=2)", {}),
            ("fedavg", "fedavg (E=10 gradient steps)", {}),
        ],
        "mnist": [
            ("dald-cc", "dald-cc (exact, rho=1)", {"local_tol": 1e-8}),
            ("dald-cc", "dald-cc (prox-grad W=5, rho=0.1)", {**pg, "rho": 0.1}),
            ("dald-dc", "dald-dc (prox-grad W=5, rho=0.1, chain)", {**pg, "rho": 0.1}),
            ("fedprox", "fedprox (prox-grad W=5, prox_coef=0.02)", {**pg, "prox_coef": 0.02}),
            ("fedavg", "fedavg (E=10 gradient steps)", {}),
        ],
    }
    tol_runs = [
        ("admm", "admm (seed 000 Alg. 2)", {"max_inner": cap_r}),
        ("prox-al", "prox-al (seed 000)", {}),
    ]
    return cap_r, cap_s, epss, per_round_runs, tol_runs


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "RESULTS_dald.md"))
    parser.add_argument("--models", default="diabetes,mnist")
    parser.add_argument("--methods", default="", help="only methods whose label contains this")
    parser.add_argument(
        "--merge", action="store_true", help="replace matching rows of the existing results"
    )
    args = parser.parse_args(argv)
    cap_r, cap_s, epss, per_round_runs, tol_runs = configurations(args.quick)
    rows = []
    t_all = time.perf_counter()
    for name in args.models.split(","):
        model = diabetes_model() if name == "diabetes" else mnist_model()
        ref = model.solve("centralized")
        print(f"{name}: f* = {ref.objective:.10g} ({ref.status})", flush=True)
        for method, label, opts in per_round_runs[name]:
            if args.methods not in label:
                continue
            row = per_round(model, ref, method, label, opts, cap_r, cap_s)
            rows.append(row)
            print("  ", row, flush=True)
        for method, label, opts in tol_runs:
            if args.methods not in label:
                continue
            row = by_tolerance(model, ref, method, label, opts, cap_s, epss)
            rows.append(row)
            print("  ", row, flush=True)
    seconds = time.perf_counter() - t_all
    raw = os.path.splitext(args.out)[0] + ".json"
    if args.merge and os.path.exists(raw):
        with open(raw) as fh:
            old = json.load(fh)
        new_keys = {(r["model"], r["method"]) for r in rows}
        rows = [r for r in old["rows"] if (r["model"], r["method"]) not in new_keys] + rows
        order = {name: i for i, name in enumerate(("diabetes", "mnist"))}
        rows.sort(key=lambda r: order.get(r["model"], 9))
        seconds += old.get("seconds", 0.0)
    with open(raw, "w") as fh:
        json.dump({"rows": rows, "seconds": seconds}, fh, indent=1, default=float)
    text = render(rows, args.quick, cap_r, cap_s, seconds)
    with open(args.out, "w") as fh:
        fh.write(text)
    print(text)
    return 0


def render(rows, quick, cap_r, cap_s, seconds) -> str:
    lines = [
        "# Rounds and wall time to a relative objective difference of 1e-4",
        "",
        f"Generated by `python benchmarks/dald_rounds.py{' --quick' if quick else ''}` on "
        f"{platform.node()} ({platform.processor() or platform.machine()}, Python "
        f"{sys.version.split()[0]}, {os.cpu_count()} CPUs); total {seconds:.0f} s. Models and "
        "protocol: see the script's docstring. Caps: "
        f"{cap_r} rounds and {cap_s:g} s per run. 'rounds' = communication rounds until the "
        "returned point is within 1e-4 of the centralized objective; 'seconds' = solve wall "
        "time of a run of exactly that length without diagnostics (admm, prox-al: the first "
        "tolerance eps whose run is within 1e-4). Messages/floats: algorithm traffic of that "
        "run (dald-dc: peer to peer, including the residual reports and decisions).",
        "",
        "| model | method | rounds | seconds | messages | floats | note |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r.get("rounds") is None:
            note = (
                f"not reached: rel. diff {r.get('final_rel', float('nan')):.1e} after "
                f"{r.get('probe_rounds', '?')} rounds / {r.get('probe_seconds', float('nan')):.0f} s"
                f" ({r.get('status')})"
            )
            lines.append(f"| {r['model']} | {r['method']} | - | - | - | - | {note} |")
        else:
            note = (
                f"eps = {r['eps']:g}"
                if "eps" in r
                else f"rel. diff at stop {r.get('check_rel', float('nan')):.1e}"
            )
            lines.append(
                f"| {r['model']} | {r['method']} | {r['rounds']} | {r['seconds']:.2f} | "
                f"{r['messages']} | {r['floats']} | {note} |"
            )
    lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
