"""Federated fair-vfl against fairlearn's centralized equal-opportunity methods, as frontiers.

On COMPAS and Adult (seed 002's vertical splits, :mod:`fedmodel.algorithms.vfl.data`;
K = 6 parties), for each of ``--seeds`` random train/test splits, in the same run:

* **fair-vfl, loss-based DEO** at the paper's settings (``eps = 0.01, c = 1e-3, eta = 100,
  beta = 0.1``, Q = 4, 500 rounds; ``fedmodel reproduce vfl-table1``'s Fair VFL);
* **fair-vfl, loss-based DEO** with the primal step 1/3 (``eta = 3``; the paper's 0.01 has
  not converged after 500 rounds), the rest as above;
* **fair-vfl, rate-based equal opportunity** (``constraint="tpr"``: the surrogate
  ``|mean_{N^a} sigmoid(z/T) - mean_{N^b} sigmoid(z/T)| <= eps``, ``T = 0.1``) with
  ``eta = 3``, the rest as above, for each ``eps`` of ``--tpr-eps`` (its frontier);
* **ExponentiatedGradient** (fairlearn, centralized: the pooled columns;
  ``TruePositiveRateParity(difference_bound=b)`` for each ``b`` of ``EG_BOUNDS``: its
  frontier) around scikit-learn's ``LogisticRegression`` with the same model (no extra intercept: the data carry one; ``C = 0.5`` is the paper's
  ``||theta||^2 / n`` on the mean loss);
* **ThresholdOptimizer** (fairlearn, centralized, ``true_positive_rate_parity``) on the
  scores of the certified centralized unconstrained logistic regression of the same model
  (:func:`fedmodel.algorithms.vfl.postprocessing.equal_opportunity`).

Reported on the test part: accuracy, the TPR gap ``|TPR_a - TPR_b|`` (the rate-based
equal opportunity difference, through ``fairlearn.metrics``) and the loss-based DEO of
Definition 1; mean +- population std over the splits. The two frontiers (accuracy against
TPR gap, training and test) are compared split by split at equal or smaller gap
(:func:`frontier_advantage`), and drawn in ``frontier_fairness_vfl.png``. The two
fairlearn methods return randomised classifiers: their accuracy and TPRs are expectations over the randomisation
(``_pmf_predict``), and their loss-based DEO is that of ``-log P(+1)`` (``inf`` where
some positive gets probability 0: "n/a").

Adult is subsampled to ``--adult-train`` training rows (default 10,000 of the paper's
40,000; the test part keeps the paper's 5,222 rows) to keep the run short on the shared
2-core machine.

    OPENBLAS_NUM_THREADS=1 python benchmarks/fairness_vfl.py            # ~25 min here
    python benchmarks/fairness_vfl.py --quick                            # 1 split, short

Writes ``benchmarks/RESULTS_fairness_vfl.md`` (and ``results_fairness_vfl.json``; with
``--quick`` the ``_quick`` files).
"""

from __future__ import annotations

import argparse
import json
import time
import warnings
from pathlib import Path

import numpy as np

from fedmodel.algorithms.vfl.data import vertical_dataset
from fedmodel.algorithms.vfl.metrics import probability_metrics, score_metrics
from fedmodel.algorithms.vfl.postprocessing import equal_opportunity
from fedmodel.algorithms.vfl.reference import solve_unconstrained
from fedmodel.algorithms.vfl.run import solve_vertical

HERE = Path(__file__).resolve().parent
PAPER = dict(c=1e-3, eta=100.0, beta=0.1, Q=4)
LOSS_EPS = 0.01
TPR_TEMPERATURE = 0.1
TPR_EPS = (0.005, 0.01, 0.02, 0.05, 0.1)
FAST_ETA = 3.0  # primal step 1/3: near convergence in 500 rounds (the paper's 0.01 is not)
#: ExponentiatedGradient's bounds on the TPR difference (``TruePositiveRateParity``'s
#: ``difference_bound``; its own ``eps`` is left at fairlearn's default): its frontier
EG_BOUNDS = (0.005, 0.01, 0.02, 0.05, 0.1)


def _row(dataset, seed, method, test, train, seconds, **more) -> dict:
    return {
        "dataset": dataset,
        "seed": seed,
        "method": method,
        "test_accuracy": 100 * test["accuracy"],
        "test_tpr_gap": 100 * test["deo_tpr"],
        "test_deo_loss": 100 * test["deo_loss"],
        "train_tpr_gap": 100 * train["deo_tpr"],
        "seconds": seconds,
        **more,
    }


def fair_vfl_rows(prob, name, seed, rounds, tpr_eps) -> list[dict]:
    common = dict(max_rounds=rounds, monitor_every=rounds, keep_ledger=False, **PAPER)
    rows = []
    t0 = time.perf_counter()
    res = solve_vertical(prob, "fair-vfl", eps=LOSS_EPS, **common)
    rows.append(
        _row(
            name,
            seed,
            f"fair-vfl, loss DEO, eps = {LOSS_EPS:g}",
            res.extra["test"],
            res.extra["train"],
            time.perf_counter() - t0,
        )
    )
    fast = {**common, "eta": FAST_ETA}
    t0 = time.perf_counter()
    res = solve_vertical(prob, "fair-vfl", eps=LOSS_EPS, **fast)
    rows.append(
        _row(
            name,
            seed,
            f"fair-vfl, loss DEO, eps = {LOSS_EPS:g}, eta = {FAST_ETA:g}",
            res.extra["test"],
            res.extra["train"],
            time.perf_counter() - t0,
        )
    )
    for eps in tpr_eps:
        t0 = time.perf_counter()
        res = solve_vertical(
            prob,
            "fair-vfl",
            eps=eps,
            constraint="tpr",
            tpr_temperature=TPR_TEMPERATURE,
            **fast,
        )
        rows.append(
            _row(
                name,
                seed,
                f"fair-vfl, TPR surrogate, eps = {eps:g}, eta = {FAST_ETA:g}",
                res.extra["test"],
                res.extra["train"],
                time.perf_counter() - t0,
                train_surrogate_gap=100 * abs(res.extra["constraint"]["gap"]),
            )
        )
    return rows


def fairlearn_rows(prob, name, seed) -> list[dict]:
    from fairlearn.reductions import ExponentiatedGradient, TruePositiveRateParity
    from sklearn.linear_model import LogisticRegression

    X, X_te = np.hstack(prob.blocks), np.hstack(prob.test_blocks)
    y01 = (prob.y > 0).astype(int)
    rows = []
    for bound in EG_BOUNDS:
        t0 = time.perf_counter()
        eg = ExponentiatedGradient(
            LogisticRegression(C=0.5, fit_intercept=False, max_iter=2000),
            constraints=TruePositiveRateParity(difference_bound=bound),
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            eg.fit(X, y01, sensitive_features=prob.group_a.astype(int))
            p_tr = eg._pmf_predict(X)[:, 1]
            p_te = eg._pmf_predict(X_te)[:, 1]
        rows.append(
            _row(
                name,
                seed,
                f"fairlearn ExponentiatedGradient (TPR parity, bound {bound:g}), centralized",
                probability_metrics(p_te, prob.y_test, prob.group_a_test),
                probability_metrics(p_tr, prob.y, prob.group_a),
                time.perf_counter() - t0,
            )
        )
    t0 = time.perf_counter()
    ref = solve_unconstrained(prob)
    z_tr, z_te = ref.extra["scores"], ref.extra["test_scores"]
    rule = equal_opportunity(z_tr, prob.y, prob.group_a, backend="fairlearn")
    rows.append(
        _row(
            name,
            seed,
            "fairlearn ThresholdOptimizer (TPR parity) on the centralized logistic regression",
            rule.metrics(z_te, prob.y_test, prob.group_a_test),
            rule.metrics(z_tr, prob.y, prob.group_a),
            time.perf_counter() - t0,
        )
    )
    rows.append(
        _row(
            name,
            seed,
            "centralized logistic regression (unconstrained)",
            score_metrics(z_te, prob.y_test, prob.group_a_test),
            score_metrics(z_tr, prob.y, prob.group_a),
            0.0,
        )
    )
    return rows


def summarise(rows: list[dict]) -> list[dict]:
    out = []
    keys = ("test_accuracy", "test_tpr_gap", "test_deo_loss", "train_tpr_gap", "seconds")
    for name in dict.fromkeys(r["dataset"] for r in rows):
        for method in dict.fromkeys(r["method"] for r in rows if r["dataset"] == name):
            sel = [r for r in rows if r["dataset"] == name and r["method"] == method]
            agg = {"dataset": name, "method": method, "splits": len(sel)}
            for k in keys:
                v = np.array([r[k] for r in sel], dtype=float)
                agg[k] = (float(v.mean()), float(v.std())) if np.all(np.isfinite(v)) else None
            out.append(agg)
    return out


def _pm(v, digits=1) -> str:
    return "n/a" if v is None else f"{v[0]:.{digits}f}±{v[1]:.{digits}f}"


def table(summary: list[dict]) -> str:
    lines = [
        "| data set | method | test accuracy (%) | test TPR gap (points) | test loss DEO (x100) "
        "| train TPR gap (points) | seconds per split |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in summary:
        lines.append(
            f"| {s['dataset']} | {s['method']} | {_pm(s['test_accuracy'])} | "
            f"{_pm(s['test_tpr_gap'])} | {_pm(s['test_deo_loss'])} | "
            f"{_pm(s['train_tpr_gap'])} | {s['seconds'][0]:.1f} |"
        )
    return "\n".join(lines)


FRONTIER = "TPR surrogate"  # the fair-vfl rows of the frontier (rate-constrained)
EG = "ExponentiatedGradient"
GAPS = {"train_tpr_gap": "training", "test_tpr_gap": "test"}


def _best_at_most(points: list[dict], gap: float, gap_key: str) -> float | None:
    """The best test accuracy among ``points`` whose ``gap_key`` is at most ``gap``."""
    fair = [p["test_accuracy"] for p in points if p[gap_key] <= gap]
    return max(fair) if fair else None


def frontier_advantage(rows: list[dict], dataset: str, gap_key: str) -> dict:
    """fair-vfl's frontier against ExponentiatedGradient's on one data set, split by split.

    On each split, every rate-constrained fair-vfl point is compared with the most accurate
    ExponentiatedGradient point of that split whose gap (``gap_key``) is at most its own,
    and every ExponentiatedGradient point with the most accurate fair-vfl point at most as
    unfair; the split's advantage is the mean of the first differences minus the mean of the
    second (test accuracy points, positive where fair-vfl is more accurate at equal or
    smaller gap). A point fairer than every point of the other method has no comparison.
    Returned: the per-split advantages, their mean and standard error, the number of
    comparisons made and the verdict ("above", "below" or "level": the mean more than two
    standard errors above zero, below it, or within).
    """
    per_split, compared = [], 0
    for seed in dict.fromkeys(r["seed"] for r in rows if r["dataset"] == dataset):
        sel = [r for r in rows if r["dataset"] == dataset and r["seed"] == seed]
        fvl = [r for r in sel if FRONTIER in r["method"]]
        eg = [r for r in sel if EG in r["method"]]
        ahead = [
            r["test_accuracy"] - best
            for r in fvl
            if (best := _best_at_most(eg, r[gap_key], gap_key)) is not None
        ]
        behind = [
            r["test_accuracy"] - best
            for r in eg
            if (best := _best_at_most(fvl, r[gap_key], gap_key)) is not None
        ]
        compared += len(ahead) + len(behind)
        if ahead or behind:
            per_split.append(
                (float(np.mean(ahead)) if ahead else 0.0)
                - (float(np.mean(behind)) if behind else 0.0)
            )
    v = np.array(per_split, dtype=float)
    mean = float(v.mean()) if v.size else float("nan")
    se = float(v.std(ddof=1) / np.sqrt(v.size)) if v.size > 1 else float("inf")
    verdict = "above" if mean - 2 * se > 0 else "below" if mean + 2 * se < 0 else "level"
    return {
        "per_split": per_split,
        "mean": mean,
        "se": se,
        "compared": compared,
        "verdict": verdict,
    }


def verdicts(rows: list[dict]) -> list[str]:
    """Per data set and gap (training, test): fair-vfl's frontier of accuracy against TPR
    gap next to ExponentiatedGradient's (:func:`frontier_advantage`)."""
    words = {
        "above": "fair-vfl's frontier is above ExponentiatedGradient's",
        "below": "fair-vfl's frontier is below ExponentiatedGradient's",
        "level": "the two frontiers are level within the noise",
    }
    out = []
    for name in dict.fromkeys(r["dataset"] for r in rows):
        for key, label in GAPS.items():
            f = frontier_advantage(rows, name, key)
            out.append(
                f"* {name}, at equal {label} TPR gap: {words[f['verdict']]} "
                f"({f['mean']:+.2f} ± {2 * f['se']:.2f} accuracy points, two standard errors "
                f"over {len(f['per_split'])} splits, {f['compared']} comparisons)."
            )
    return out


def plot_frontier(summary: list[dict], path: Path) -> None:
    """Mean test accuracy against mean TPR gap (training and test) of every
    rate-constrained fair-vfl and ExponentiatedGradient point, one panel per data set and
    gap."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(s["dataset"] for s in summary))
    fig, axes = plt.subplots(len(names), 2, figsize=(9, 3.6 * len(names)), squeeze=False)
    for i, name in enumerate(names):
        for j, (key, label) in enumerate(GAPS.items()):
            ax = axes[i][j]
            for tag, marker in ((FRONTIER, "o-"), (EG, "s--")):
                pts = sorted(
                    (s[key][0], s["test_accuracy"][0])
                    for s in summary
                    if s["dataset"] == name and tag in s["method"]
                )
                ax.plot(*zip(*pts), marker, label="fair-vfl (TPR)" if tag == FRONTIER else tag)
            ax.set_xlabel(f"mean {label} TPR gap (points)")
            ax.set_ylabel("mean test accuracy (%)")
            ax.set_title(name)
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


DOCS = HERE.parent / "docs" / "vfl.md"
DOCS_BEGIN, DOCS_END = "<!-- fairness_vfl: begin -->\n", "<!-- fairness_vfl: end -->"


FRONTIER_RULE = (
    "Frontiers: on each split, every rate-constrained fair-vfl point is compared with the "
    "most accurate ExponentiatedGradient point whose TPR gap is at most its own, and every "
    "ExponentiatedGradient point with the most accurate fair-vfl point at most as unfair; a "
    "split's advantage is the mean difference of the first comparisons less that of the "
    "second (accuracy points, positive where fair-vfl is more accurate at equal or smaller "
    "gap). The verdict is the mean over the splits with two standard errors:"
)


def docs_block(results: dict) -> str:
    """The table and verdicts that ``docs/vfl.md`` shows between its ``fairness_vfl``
    markers, rendered from a run's results (its ``rows`` and ``summary``;
    tests/test_benchmark_fairness_docs.py checks the page against the committed
    ``results_fairness_vfl.json``)."""
    return "\n".join([table(results["summary"]), "", FRONTIER_RULE, "", *verdicts(results["rows"])])


def write_docs(results: dict, page: Path = DOCS) -> None:
    """Replace the block between the ``fairness_vfl`` markers of ``page`` by this run's."""
    text = page.read_text()
    start = text.index(DOCS_BEGIN) + len(DOCS_BEGIN)
    end = text.index(DOCS_END)
    page.write_text(text[:start] + docs_block(results) + "\n" + text[end:])


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=500)
    ap.add_argument("--adult-train", type=int, default=10000)
    ap.add_argument("--datasets", default="compas,adult")
    ap.add_argument("--tpr-eps", default=",".join(str(e) for e in TPR_EPS))
    ap.add_argument("--quick", action="store_true", help="1 split, 100 rounds, Adult 3,000 rows")
    ap.add_argument("--out", default=None, help="default RESULTS_fairness_vfl[_quick].md here")
    ap.add_argument(
        "--no-docs",
        action="store_true",
        help="do not write the table into docs/vfl.md (a --quick run never does)",
    )
    args = ap.parse_args(argv)
    if args.quick:
        args.seeds, args.rounds, args.adult_train = 1, 100, 3000
    if args.out is None:
        args.out = str(HERE / f"RESULTS_fairness_vfl{'_quick' if args.quick else ''}.md")
    tpr_eps = tuple(float(e) for e in args.tpr_eps.split(","))
    rows: list[dict] = []
    t_start = time.perf_counter()
    for name in args.datasets.split(","):
        for seed in range(args.seeds):
            n_train = args.adult_train if name == "adult" else None
            prob = vertical_dataset(name, seed=seed, n_train=n_train)
            rows += fair_vfl_rows(prob, name, seed, args.rounds, tpr_eps)
            rows += fairlearn_rows(prob, name, seed)
            print(f"{name} split {seed} done ({time.perf_counter() - t_start:.0f} s)", flush=True)
    summary = summarise(rows)
    text = "\n".join(
        [
            "# Fair VFL against fairlearn's centralized equal-opportunity methods",
            "",
            f"`python benchmarks/fairness_vfl.py{' --quick' if args.quick else ''}`: "
            f"{args.seeds} random train/test splits (seeds 0-{args.seeds - 1}) of seed 002's "
            f"vertical data, K = 6 parties, {args.rounds} rounds, Q = 4, c = 1e-3, beta = 0.1 "
            f"for every fair-vfl row, eta = 100 (the paper's) unless the row says eta = "
            f"{FAST_ETA:g}; TPR surrogate temperature {TPR_TEMPERATURE:g}; "
            f"COMPAS 4,800 / 478 rows (15 columns, race one-hot kept as features); Adult "
            f"subsampled to {args.adult_train:,} training rows, test 5,222 rows. Mean ± "
            f"population std over the splits; total {time.perf_counter() - t_start:.0f} s on "
            "the shared 2-core machine.",
            "",
            "fair-vfl is federated (the parties exchange only n-vectors of scores and "
            "lambda); ExponentiatedGradient and ThresholdOptimizer read the pooled data "
            "(centralized). Their accuracy and TPRs are expectations over their randomised "
            "predictions. TPR gap = |TPR_a - TPR_b| on the positives (fairlearn.metrics for "
            "hard predictions); loss DEO = Definition 1's |lhat^a - lhat^b| x 100.",
            "",
            table(summary),
            "",
            FRONTIER_RULE,
            "",
            *verdicts(rows),
            "",
        ]
    )
    out = Path(args.out)
    out.write_text(text)
    results = {"rows": rows, "summary": summary}
    out.with_name(out.stem.replace("RESULTS", "results") + ".json").write_text(
        json.dumps(results, indent=1)
    )
    plot_frontier(summary, out.with_name(out.stem.replace("RESULTS", "frontier") + ".png"))
    if not (args.quick or args.no_docs):
        write_docs(results)
    print(text)


if __name__ == "__main__":
    main()
