"""Federated fair-vfl against fairlearn's centralized equal-opportunity methods (issue 24).

On COMPAS and Adult (seed 002's vertical splits, :mod:`fedmodel.algorithms.vfl.data`;
K = 6 parties), for each of ``--seeds`` random train/test splits, in the same run:

* **fair-vfl, loss-based DEO** at the paper's settings (``eps = 0.01, c = 1e-3, eta = 100,
  beta = 0.1``, Q = 4, 500 rounds; ``fedmodel reproduce vfl-table1``'s Fair VFL);
* **fair-vfl, loss-based DEO** with the primal step 1/3 (``eta = 3``; the paper's 0.01 has
  not converged after 500 rounds), the rest as above;
* **fair-vfl, rate-based equal opportunity** (``constraint="tpr"``: the surrogate
  ``|mean_{N^a} sigmoid(z/T) - mean_{N^b} sigmoid(z/T)| <= eps``, ``T = 0.1``) with
  ``eta = 3``, the rest as above, for each ``eps`` of ``--tpr-eps``;
* **ExponentiatedGradient** (fairlearn, centralized: the pooled columns;
  ``TruePositiveRateParity``, ``eps = 0.01``) around scikit-learn's ``LogisticRegression``
  with the same model (no extra intercept: the data carry one; ``C = 0.5`` is the paper's
  ``||theta||^2 / n`` on the mean loss);
* **ThresholdOptimizer** (fairlearn, centralized, ``true_positive_rate_parity``) on the
  scores of the certified centralized unconstrained logistic regression of the same model
  (:func:`fedmodel.algorithms.vfl.postprocessing.equal_opportunity`).

Reported on the test part: accuracy, the TPR gap ``|TPR_a - TPR_b|`` (the rate-based
equal opportunity difference, through ``fairlearn.metrics``) and the loss-based DEO of
Definition 1; mean +- population std over the splits. The two fairlearn methods return
randomised classifiers: their accuracy and TPRs are expectations over the randomisation
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
TPR_EPS = (0.01, 0.03, 0.05)
FAST_ETA = 3.0  # primal step 1/3: near convergence in 500 rounds (the paper's 0.01 is not)
EG_EPS = 0.01


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
    t0 = time.perf_counter()
    eg = ExponentiatedGradient(
        LogisticRegression(C=0.5, fit_intercept=False, max_iter=2000),
        constraints=TruePositiveRateParity(),
        eps=EG_EPS,
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
            f"fairlearn ExponentiatedGradient (TPR parity, eps = {EG_EPS:g}), centralized",
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


def verdicts(summary: list[dict]) -> list[str]:
    """Per data set: the rate-constrained fair-vfl row with the best accuracy among those
    whose mean test TPR gap is at most ExponentiatedGradient's, against it."""
    out = []
    for name in dict.fromkeys(s["dataset"] for s in summary):
        rows = [s for s in summary if s["dataset"] == name]
        eg = next(s for s in rows if "ExponentiatedGradient" in s["method"])
        ok = [
            s
            for s in rows
            if "TPR surrogate" in s["method"] and s["test_tpr_gap"][0] <= eg["test_tpr_gap"][0]
        ]
        if not ok:
            out.append(
                f"* {name}: no rate-constrained fair-vfl row reaches ExponentiatedGradient's "
                f"mean test TPR gap ({eg['test_tpr_gap'][0]:.1f} points): goal not reached."
            )
            continue
        best = max(ok, key=lambda s: s["test_accuracy"][0])
        diff = best["test_accuracy"][0] - eg["test_accuracy"][0]
        met = "goal met" if diff >= 0 else "goal NOT met"
        out.append(
            f"* {name}: {best['method']}: test accuracy {_pm(best['test_accuracy'])} % at a "
            f"test TPR gap of {_pm(best['test_tpr_gap'])} points; ExponentiatedGradient "
            f"{_pm(eg['test_accuracy'])} % at {_pm(eg['test_tpr_gap'])} points: "
            f"{diff:+.1f} accuracy points ({met})."
        )
    return out


DOCS = HERE.parent / "docs" / "vfl.md"
DOCS_BEGIN, DOCS_END = "<!-- fairness_vfl: begin -->\n", "<!-- fairness_vfl: end -->"


def docs_block(summary: list[dict]) -> str:
    """The table and verdicts that ``docs/vfl.md`` shows between its ``fairness_vfl``
    markers, rendered from a run's summary (tests/test_benchmark_fairness_docs.py checks the
    page against the committed ``results_fairness_vfl.json``)."""
    return "\n".join(
        [
            table(summary),
            "",
            "At equal test TPR gap (`benchmarks/fairness_vfl.py`'s verdict):",
            "",
            *verdicts(summary),
        ]
    )


def write_docs(summary: list[dict], page: Path = DOCS) -> None:
    """Replace the block between the ``fairness_vfl`` markers of ``page`` by this run's."""
    text = page.read_text()
    start = text.index(DOCS_BEGIN) + len(DOCS_BEGIN)
    end = text.index(DOCS_END)
    page.write_text(text[:start] + docs_block(summary) + "\n" + text[end:])


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
            "# Fair VFL against fairlearn's centralized equal-opportunity methods (issue 24)",
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
            "At equal test TPR gap (the rate-constrained fair-vfl row with the best accuracy "
            "among those whose mean test TPR gap is at most ExponentiatedGradient's; the eps "
            "is chosen on the test set, as the comparison asks):",
            "",
            *verdicts(summary),
            "",
        ]
    )
    Path(args.out).write_text(text)
    Path(args.out).with_name(
        Path(args.out).stem.replace("RESULTS", "results") + ".json"
    ).write_text(json.dumps({"rows": rows, "summary": summary}, indent=1))
    if not (args.quick or args.no_docs):
        write_docs(summary)
    print(text)


if __name__ == "__main__":
    main()
