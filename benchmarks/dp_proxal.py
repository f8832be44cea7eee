"""prox-al under client-level differential privacy next to DP-FedAvg: objective gap,
constraint violation, test accuracy and rounds for epsilon in {1, 3, 8, inf}, on Adult
Neyman-Pearson (seed 000 problem (26), 20 sites) and on logistic regression with an l2
ball (Adult, the same 20 stratified sites, ``||w||_2 <= radius`` at the server).

Both methods spend the same budget the same way: every noised sum is one Gaussian
mechanism of noise multiplier ``z`` on dp-accounting's RDP accountant, ``z`` calibrated
so that ``T`` sums and the certificate spend epsilon (``fedavg``: ``max_rounds=T``;
``prox-al``: ``max_outer=T``, whose run then stops with ``budget_spent`` after ``T``
sums, since each round of it is one sum), ``delta = 1 / 400``, every client's
contribution clipped in L2 (fedavg: its model change; prox-al: its message, value,
gradient and clear scalars together). ``inf``: the same clipping, no noise (prox-al then
runs to ``max_outer`` outer iterations, more than ``T`` rounds). The gap and the
violation are recomputed here at the returned point on the pooled data, against
``method="centralized"``; test accuracy is the sign of ``w^T x`` on Adult's test part.
Writes ``benchmarks/RESULTS_dp_proxal.md``, ``benchmarks/results_dp_proxal.json`` and
``benchmarks/dp_proxal.png``.

    nice python benchmarks/dp_proxal.py [--sums 30] [--seeds 2]
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import sys
import time
from pathlib import Path

import cvxpy as cp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cases import adult, np_sites  # noqa: E402
from privacy import R, accuracy  # noqa: E402
from privacy import pooled as np_pooled  # noqa: E402

import fedmodel as fm  # noqa: E402
from fedmodel.datasets import split_stratified  # noqa: E402
from fedmodel.models import neyman_pearson_model  # noqa: E402

HERE = Path(__file__).resolve().parent
EPSILONS = (1.0, 3.0, 8.0, math.inf)
RADIUS = 1.0  # the l2 ball of the logistic model (active at the optimum)


def logistic_sites(n: int, seed: int = 0):
    ds = adult()
    return [(X, 2.0 * y - 1.0) for X, y in split_stratified(ds.X, ds.y, n, random_state=seed)]


def logistic_ball(sites) -> fm.Model:
    """Mean logistic loss over the pooled rows, ``||w||_2^2 <= RADIUS^2`` at the server."""
    total = sum(len(y) for _, y in sites)
    m = fm.Model("logistic-ball")
    w = m.variable(sites[0][0].shape[1], name="w")
    for k, (X, y) in enumerate(sites):
        c = m.client(f"site{k}")
        margin = cp.multiply(c.data(y, name="y"), c.data(X, name="X") @ w)
        c.minimize(cp.sum(cp.logistic(-margin)) / total)
    m.server.subject_to(cp.sum_squares(w) <= RADIUS**2)
    return m


def logistic_pooled(sites, w):
    total = sum(len(y) for _, y in sites)
    obj = sum(np.logaddexp(0, -y * (X @ w)).sum() for X, y in sites) / total
    return float(obj), float(max(0.0, np.linalg.norm(w) - RADIUS))


def cases():
    """``(name, model, pooled(w) -> (objective, violation), violation's meaning)``."""
    sites = np_sites(20)
    yield (
        "Adult Neyman-Pearson (26), 20 sites",
        neyman_pearson_model(sites, r=R),
        lambda w: np_pooled(sites, w),
        f"largest class-1 loss over r = {R:g}",
    )
    lsites = logistic_sites(20)
    yield (
        f"Adult logistic regression, l2 ball of radius {RADIUS:g}, 20 sites",
        logistic_ball(lsites),
        lambda w: logistic_pooled(lsites, w),
        f"||w||_2 - {RADIUS:g}",
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sums", type=int, default=30, help="noised sums T of each run")
    ap.add_argument("--seeds", type=int, default=2, help="noise draws per epsilon")
    ap.add_argument("--clip", type=float, default=0.05, help="prox-al's clip")
    ap.add_argument("--fedavg-clip", type=float, default=0.5)
    ap.add_argument("--prox-beta", type=float, default=0.1)
    ap.add_argument("--penalty", type=float, default=10.0, help="fedavg's constraint penalty")
    ap.add_argument("--render", action="store_true", help="tables and plot from the json")
    ap.add_argument(
        "--suffix", default="", help="of the output files (a side grid: docs/privacy.md untouched)"
    )
    args = ap.parse_args()
    delta = 1.0 / 400
    if args.render:
        rows = json.loads((HERE / f"results_dp_proxal{args.suffix}.json").read_text())
        for r in rows:  # (the JSON keeps the epsilons as numbers, inf as Infinity)
            r["epsilon"] = None if r["epsilon"] is None else float(r["epsilon"])
        write(rows, args, delta)
        plot(rows, args.suffix)
        return
    ds = adult()
    T = args.sums
    runs = [
        ("prox-al", args.clip, {"max_outer": T, "prox_beta": args.prox_beta}),
        ("prox-al", args.fedavg_clip, {"max_outer": T, "prox_beta": args.prox_beta}),
        (
            "fedavg",
            args.fedavg_clip,
            {"max_rounds": T, "weights": "uniform", "penalty": args.penalty},
        ),
    ]
    rows = []
    for case, model, pooled, violation in cases():
        t0 = time.perf_counter()
        ref = model.solve("centralized")
        f_ref, v_ref = pooled(ref.x)
        rows.append(
            dict(case=case, method="centralized", clip=None, epsilon=None, gap=0.0,
                 violation=v_ref, accuracy=accuracy(ref.x, ds), rounds=0, status=ref.status,
                 seconds=time.perf_counter() - t0, meaning=violation)
        )  # fmt: skip
        print(rows[-1], flush=True)
        for method, clip, options in runs:
            for eps in EPSILONS:
                for seed in range(args.seeds if math.isfinite(eps) else 1):
                    t0 = time.perf_counter()
                    res = model.solve(
                        method,
                        dp=fm.DP(epsilon=eps, delta=delta, clip=clip),
                        history=False,
                        **options,
                    )
                    f, v = pooled(res.x)
                    rows.append(
                        dict(case=case, method=method, clip=clip, epsilon=eps, seed=seed,
                             gap=(f - f_ref) / abs(f_ref), violation=v,
                             accuracy=accuracy(res.x, ds),
                             rounds=res.rounds.get("communication", res.rounds.get("outer")),
                             status=res.status, epsilon_spent=res.privacy["epsilon"],
                             noise_multiplier=res.privacy["noise_multiplier"],
                             seconds=time.perf_counter() - t0)
                    )  # fmt: skip
                    print(rows[-1], flush=True)
    (HERE / f"results_dp_proxal{args.suffix}.json").write_text(
        json.dumps(rows, indent=1, default=str)
    )
    write(rows, args, delta)
    plot(rows, args.suffix)


def span(vals, fmt):
    if len(vals) == 1:
        return format(vals[0], fmt)
    return f"{format(np.mean(vals), fmt)} ({format(min(vals), fmt)}-{format(max(vals), fmt)})"


def label(r) -> str:
    return f"{'DP-FedAvg' if r['method'] == 'fedavg' else 'prox-al'}, clip {r['clip']:g}"


def header(args, delta) -> list[str]:
    today = datetime.date.today().isoformat()
    return [
        "# prox-al and DP-FedAvg under client-level differential privacy",
        "",
        f"`nice python benchmarks/dp_proxal.py --sums {args.sums} --seeds {args.seeds} "
        + (f"--suffix {args.suffix} " if args.suffix else "")
        + f"--clip {args.clip} --fedavg-clip {args.fedavg_clip} --prox-beta {args.prox_beta} "
        f"--penalty {args.penalty}` ({today}). Every noised sum is one Gaussian mechanism "
        f"on dp-accounting's RDP accountant; each run's noise multiplier is calibrated for "
        f"T = {args.sums} sums and the certificate at delta = {delta:g} (prox-al: "
        f"`max_outer={args.sums}`, stopping with `budget_spent` after {args.sums} sums; "
        f"fedavg: `max_rounds={args.sums}`, uniform weights, constraint penalty "
        f"{args.penalty:g}); prox-al with `prox_beta={args.prox_beta:g}`. Clip: per client, "
        "L2, on fedavg's model change and on prox-al's message (value, gradient and the "
        "clear scalars together). `inf`: the same clipping, no noise. Gap: relative "
        "objective gap to `centralized` at the returned point on the pooled data; "
        "violation: see each table; accuracy: sign of `w^T x` on Adult's test part; "
        "rounds: communication rounds (the certificate's included). Mean over the noise "
        f"draws ({args.seeds} per finite epsilon; min-max in brackets).",
        "",
    ]


def tables(rows) -> str:
    """The per-model tables of a run (``RESULTS_dp_proxal.md`` and ``docs/privacy.md``
    between its ``dp_proxal`` markers; tests/test_benchmark_dp_docs.py checks the page
    against the committed ``results_dp_proxal.json``)."""
    lines = []
    for case in dict.fromkeys(r["case"] for r in rows):
        group = [r for r in rows if r["case"] == case]
        ref = group[0]
        lines += [
            f"**{case}.** Violation: {ref['meaning']}. Centralized: violation "
            f"{ref['violation']:.2e}, test accuracy {ref['accuracy']:.4f}.",
            "",
            "| run | epsilon | noise multiplier | epsilon spent | gap | violation "
            "| test accuracy | rounds | statuses |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for name in dict.fromkeys(label(r) for r in group[1:]):
            for eps in EPSILONS:
                g = [r for r in group[1:] if label(r) == name and r["epsilon"] == eps]
                z = g[0]["noise_multiplier"]
                statuses = ", ".join(sorted({r["status"] for r in g}))
                lines.append(
                    f"| {name} | {eps:g} | {'-' if z is None else f'{z:.2f}'} "
                    f"| {span([r['epsilon_spent'] for r in g], '.3f')} "
                    f"| {span([r['gap'] for r in g], '.2e')} "
                    f"| {span([r['violation'] for r in g], '.2e')} "
                    f"| {span([r['accuracy'] for r in g], '.4f')} "
                    f"| {span([r['rounds'] for r in g], '.0f')} | {statuses} |"
                )
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


NOTES = "## Notes"
DOCS = HERE.parent / "docs" / "privacy.md"
DOCS_BEGIN, DOCS_END = "<!-- dp_proxal: begin -->\n", "<!-- dp_proxal: end -->"


def write(rows, args, delta) -> None:
    text = "\n".join(header(args, delta)) + "\n" + tables(rows)
    path = HERE / f"RESULTS_dp_proxal{args.suffix}.md"
    old = path.read_text() if path.exists() else ""
    if NOTES in old:  # (the reader's notes on a run, kept when its tables are rendered again)
        text += "\n" + old[old.index(NOTES) :]
    path.write_text(text)
    if not args.suffix:
        page = DOCS.read_text()
        start = page.index(DOCS_BEGIN) + len(DOCS_BEGIN)
        DOCS.write_text(page[:start] + tables(rows) + page[page.index(DOCS_END) :])
    print(text)


def plot(rows, suffix: str = "") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    case_names = list(dict.fromkeys(r["case"] for r in rows))
    fig, axes = plt.subplots(len(case_names), 2, figsize=(10, 3.6 * len(case_names)))
    xs = {1.0: 0, 3.0: 1, 8.0: 2, math.inf: 3}
    for row_axes, case in zip(np.atleast_2d(axes), case_names, strict=True):
        group = [r for r in rows if r["case"] == case and r["method"] != "centralized"]
        for name in dict.fromkeys(label(r) for r in group):
            for ax, key in zip(row_axes, ("gap", "violation"), strict=True):
                pts = [
                    (xs[eps], np.mean([r[key] for r in group
                                       if label(r) == name and r["epsilon"] == eps]))
                    for eps in EPSILONS
                ]  # fmt: skip
                ax.plot(*zip(*pts, strict=True), marker="o", label=name)
        for ax, key in zip(row_axes, ("objective gap (relative)", "constraint violation"),
                           strict=True):  # fmt: skip
            ax.set_yscale("symlog", linthresh=1e-3)
            ax.set_xticks(range(4), ["1", "3", "8", "inf"])
            ax.set_xlabel("epsilon")
            ax.set_title(f"{case.split(',')[0]}: {key}", fontsize=9)
        row_axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(HERE / f"dp_proxal{suffix}.png", dpi=110)


if __name__ == "__main__":
    main()
