"""DP-FedAvg on Adult Neyman-Pearson (seed 000 problem (26), 20 sites): what client-level
differential privacy costs in objective gap, constraint violation and test accuracy, for
epsilon in {1, 3, 8, inf} (inf: the same clipping, no noise), with and without secure
aggregation at one epsilon.

Each run is ``model.solve("fedavg", weights="uniform", penalty=..., max_rounds=R,
dp=fm.DP(epsilon, delta, clip))``; the objective gap and the violation are recomputed here
at the returned point on the pooled data (the run's own certificate is noisy by design),
against ``method="centralized"``. Test accuracy: sign of ``w^T x`` on Adult's official test
part. Writes ``benchmarks/RESULTS_privacy.md`` and ``benchmarks/results_privacy.json``.

    nice python benchmarks/privacy.py [--rounds 30] [--seeds 2]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cases import adult, np_sites  # noqa: E402

import fedmodel as fm  # noqa: E402
from fedmodel.models import neyman_pearson_model  # noqa: E402

HERE = Path(__file__).resolve().parent
R = 0.2  # the class-1 loss bound of (26)


def pooled(sites, w):
    """The objective and the largest constraint violation of (26) at ``w``."""
    n = len(sites)
    obj = sum(np.logaddexp(0, X0 @ w).mean() / n for X0, _ in sites)
    viol = max(max(0.0, np.logaddexp(0, -(X1 @ w)).mean() - R) for _, X1 in sites)
    return float(obj), float(viol)


def accuracy(w, ds) -> float:
    return float(np.mean((ds.X_test @ w > 0).astype(int) == ds.y_test))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--seeds", type=int, default=2, help="noise draws per epsilon")
    ap.add_argument("--clip", type=float, default=0.5)
    ap.add_argument("--penalty", type=float, default=10.0)
    args = ap.parse_args()
    sites = np_sites(20)
    ds = adult()
    model = neyman_pearson_model(sites, r=R)
    t0 = time.perf_counter()
    ref = model.solve("centralized")
    ref_seconds = time.perf_counter() - t0
    f_ref, v_ref = pooled(sites, ref.x)
    rows = [
        {
            "method": "centralized",
            "epsilon": None,
            "secure_aggregation": False,
            "gap": 0.0,
            "violation": v_ref,
            "accuracy": accuracy(ref.x, ds),
            "seconds": ref_seconds,
            "status": ref.status,
        }
    ]
    t0 = time.perf_counter()
    base = model.solve("fedavg", weights="uniform", penalty=args.penalty, max_rounds=args.rounds)
    f, v = pooled(sites, base.x)
    rows.append(
        {
            "method": "fedavg (no dp)",
            "epsilon": None,
            "secure_aggregation": False,
            "gap": (f - f_ref) / abs(f_ref),
            "violation": v,
            "accuracy": accuracy(base.x, ds),
            "seconds": time.perf_counter() - t0,
            "status": base.status,
        }
    )
    delta = 1.0 / (20 * 20)  # below 1 / (number of clients)
    runs = [(eps, False) for eps in (1.0, 3.0, 8.0, math.inf)] + [(3.0, True)]
    for eps, secure in runs:
        draws = 1 if (secure or not math.isfinite(eps)) else args.seeds  # (secure: slow)
        for seed in range(draws):
            t0 = time.perf_counter()
            res = model.solve(
                "fedavg",
                weights="uniform",
                penalty=args.penalty,
                max_rounds=args.rounds,
                dp=fm.DP(epsilon=eps, delta=delta, clip=args.clip),
                secure_aggregation=secure,
            )
            seconds = time.perf_counter() - t0
            f, v = pooled(sites, res.x)
            rows.append(
                {
                    "method": "fedavg (DP-FedAvg)",
                    "epsilon": eps,
                    "seed": seed,
                    "secure_aggregation": secure,
                    "gap": (f - f_ref) / abs(f_ref),
                    "violation": v,
                    "accuracy": accuracy(res.x, ds),
                    "epsilon_spent": res.privacy["epsilon"],
                    "noise_multiplier": res.privacy["noise_multiplier"],
                    "seconds": seconds,
                    "status": res.status,
                }
            )
            print(rows[-1], flush=True)
    (HERE / "results_privacy.json").write_text(json.dumps(rows, indent=1, default=str))
    lines = [
        "# DP-FedAvg on Adult Neyman-Pearson (20 sites)",
        "",
        f"`nice python benchmarks/privacy.py --rounds {args.rounds} --seeds {args.seeds} "
        f"--clip {args.clip} --penalty {args.penalty}`: fedavg, uniform weights, quadratic "
        f"penalty {args.penalty:g} of the constraints, {args.rounds} rounds, every client in "
        f"every round, clip {args.clip:g} on each client's model change, delta = {delta:g}; "
        "the noise multiplier calibrated so that the rounds and the certificate spend "
        "epsilon (dp-accounting RDP). Gap: relative objective gap to `centralized` at the "
        "returned point on the pooled data; violation: largest class-1 loss over r = 0.2; "
        "accuracy on Adult's official test part. Mean over the noise draws (min-max).",
        "",
        "| run | epsilon | noise multiplier | epsilon spent | gap | violation | test accuracy "
        "| seconds |",
        "|---|---|---|---|---|---|---|---|",
    ]

    def span(vals, fmt):
        if len(vals) == 1:
            return format(vals[0], fmt)
        return f"{format(np.mean(vals), fmt)} ({format(min(vals), fmt)}-{format(max(vals), fmt)})"

    lines.append(
        f"| centralized | - | - | - | 0 | {v_ref:.2e} | {rows[0]['accuracy']:.4f} "
        f"| {ref_seconds:.1f} |"
    )
    b = rows[1]
    lines.append(
        f"| fedavg, no dp | - | - | - | {b['gap']:.2e} | {b['violation']:.2e} "
        f"| {b['accuracy']:.4f} | {b['seconds']:.1f} |"
    )
    for eps, secure in runs:
        group = [r for r in rows[2:] if r["epsilon"] == eps and r["secure_aggregation"] == secure]
        label = "DP-FedAvg" + (" + secure aggregation" if secure else "")
        z = group[0]["noise_multiplier"]
        lines.append(
            f"| {label} | {eps:g} | {'-' if z is None else f'{z:.3f}'} "
            f"| {span([r['epsilon_spent'] for r in group], '.3f')} "
            f"| {span([r['gap'] for r in group], '.2e')} "
            f"| {span([r['violation'] for r in group], '.2e')} "
            f"| {span([r['accuracy'] for r in group], '.4f')} "
            f"| {span([r['seconds'] for r in group], '.1f')} |"
        )
    (HERE / "RESULTS_privacy.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
