"""Reproduction of seed 002 (Liu et al., "Achieving model fairness in vertical federated
learning"): Table I, Fig. 1 (eps sweep) and Fig. 2 (Q sweep).

``fedmodel reproduce vfl-table1 [--trials 5] [--quick]``: on each data set's vertical
split (:mod:`fedmodel.algorithms.vfl.data`; K = 6) and for each seed (one random
train/test split per seed), FedBCD and Fair VFL (``eps = 0.01, c = 1e-3, eta = 100, beta =
0.1``, eq. (9) read literally: dual step ``beta``) with ``Q = 4`` local updates per party
and ``ROUNDS = 500`` communication rounds (the paper gives neither), EO (Hardt et al.) and
CEO (Pleiss et al.) post-processing FedBCD's scores on the pooled training part
(non-federated), and the certified centralized references (the unconstrained regularised
logistic regression and the DEO-constrained model solved by an augmented Lagrangian, both
run to their certificates). Test accuracy (AC), fairness FR = 1 - DEO with the loss-based
DEO of Definition 1 (the paper's metric as written; the TPR-based FR is reported too) and
their harmonic mean, mean +- std over the seeds, next to the paper's numbers.

``vfl-fig1``: Fair VFL over the paper's eps grids (seed 0): test AC, FR and the final
``lambda`` (the paper: ``lambda = 0`` at the largest eps). ``vfl-fig2``: training loss
``L(theta)`` against communication rounds for ``Q in {1, 4, 7}`` and ``eps in {0.01, 0.05,
0.1}`` (the paper does not give its three eps values).

``--quick`` (CI): one seed, 150 rounds, Adult with 4,000 training rows; fig1/fig2 on COMPAS
only with short runs. Options (``--set``): ``rounds=``, ``Q=``.
"""

from __future__ import annotations

import json
import time
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from fedmodel.algorithms.vfl.data import DATASETS, vertical_dataset
from fedmodel.algorithms.vfl.postprocessing import (
    calibrated_equal_opportunity,
    equal_opportunity,
)
from fedmodel.algorithms.vfl.reference import solve_constrained, solve_unconstrained
from fedmodel.algorithms.vfl.run import solve_vertical
from fedmodel.reproduce import register
from fedmodel.reproduce.output import check as _check
from fedmodel.reproduce.output import finish_report, md_table

PAPER_FILE = "vfl_paper.json"
EPS, C, ETA, BETA = 0.01, 1e-3, 100.0, 0.1
ROUNDS, Q_TABLE = 500, 4
QUICK_ROUNDS, QUICK_ADULT_TRAIN = 150, 4000
FIG2_EPS = (0.01, 0.05, 0.1)
METHOD_ORDER = (
    "FedBCD",
    "EO",
    "CEO",
    "Fair VFL",
    "reference (unconstrained)",
    "reference (eps = 0.01)",
)
PAPER_METHOD = {"FedBCD": "FedBCD", "EO": "EO", "CEO": "CEO", "Fair VFL": "Fair VFL"}


def paper_numbers() -> dict[str, Any]:
    """The paper's Table I and figure grids (transcribed)."""
    text = resources.files("fedmodel.reproduce").joinpath("data", PAPER_FILE).read_text()
    return json.loads(text)


def _say(progress: bool, text: str) -> None:
    if progress:
        print(text, flush=True)


def _split(name: str, seed: int, quick: bool):
    n_train = QUICK_ADULT_TRAIN if (quick and name == "adult") else None
    return vertical_dataset(name, seed=seed, n_train=n_train)


def _row(dataset, seed, method, federated, metrics, **more) -> dict:
    return {
        "dataset": dataset,
        "seed": seed,
        "method": method,
        "federated": federated,
        "AC": 100 * metrics["accuracy"],
        "FR": 100 * metrics["fairness_loss"],
        "HM": 100 * metrics["hm_loss"],
        "FR_tpr": 100 * metrics["fairness_tpr"],
        "HM_tpr": 100 * metrics["hm_tpr"],
        **more,
    }


def table1_split(name: str, seed: int, rounds: int, Q: int, quick: bool = False) -> list[dict]:
    """Every Table I method on one split (one seed) of ``name``."""
    prob = _split(name, seed, quick)
    common = dict(Q=Q, max_rounds=rounds, monitor_every=rounds, keep_ledger=False)
    bcd = solve_vertical(prob, "fedbcd", **common)
    fair = solve_vertical(prob, "fair-vfl", eps=EPS, c=C, eta=ETA, beta=BETA, **common)
    rows = [
        _row(
            name,
            seed,
            "FedBCD",
            True,
            bcd.extra["test"],
            rounds=rounds,
            Q=Q,
            train_deo=bcd.extra["train"]["deo_loss"],
            status=bcd.status,
        ),
    ]
    z_tr, z_te = bcd.extra["scores"], bcd.extra["test_scores"]
    eo = equal_opportunity(z_tr, prob.y, prob.group_a)
    rows.append(
        _row(
            name,
            seed,
            "EO",
            False,
            eo.metrics(z_te, prob.y_test, prob.group_a_test),
            backend=eo.backend,
        )
    )
    ceo = calibrated_equal_opportunity(z_tr, prob.y, prob.group_a)
    rows.append(
        _row(
            name,
            seed,
            "CEO",
            False,
            ceo.metrics(z_te, prob.y_test, prob.group_a_test),
            alpha=ceo.alpha,
        )
    )
    rows.append(
        _row(
            name,
            seed,
            "Fair VFL",
            True,
            fair.extra["test"],
            rounds=rounds,
            Q=Q,
            train_deo=fair.extra["train"]["deo_loss"],
            lambda1=float(fair.extra["lambda"][0]),
            lambda2=float(fair.extra["lambda"][1]),
            status=fair.status,
        )
    )
    ref0 = solve_unconstrained(prob)
    rows.append(
        _row(
            name,
            seed,
            "reference (unconstrained)",
            False,
            ref0.extra["test"],
            train_deo=ref0.extra["train"]["deo_loss"],
            status=ref0.status,
            objective=ref0.objective,
        )
    )
    ref = solve_constrained(prob, EPS)
    rows.append(
        _row(
            name,
            seed,
            "reference (eps = 0.01)",
            False,
            ref.extra["test"],
            train_deo=ref.extra["train"]["deo_loss"],
            status=ref.status,
            lambda1=float(ref.extra["lambda"][0]),
            lambda2=float(ref.extra["lambda"][1]),
            objective=ref.objective,
            fair_vfl_objective=fair.objective,
        )
    )
    return rows


def _ms(vals) -> str:
    v = np.asarray([x for x in vals if np.isfinite(x)], dtype=float)
    if v.size == 0:
        return "n/a"
    return f"{v.mean():.1f}±{v.std():.1f}" if v.size > 1 else f"{v.mean():.1f}"


@register("vfl-table1")
def table1(out_dir, trials: int = 5, quick: bool = False, progress: bool = True, **kw) -> dict:
    """Seed 002 Table I: FedBCD, EO, CEO, Fair VFL (+ certified references) on Adult,
    COMPAS, C&C."""
    t0 = time.perf_counter()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    seeds = 1 if quick else int(trials)
    rounds = int(kw.get("rounds", QUICK_ROUNDS if quick else ROUNDS))
    Q = int(kw.get("Q", Q_TABLE))
    paper = paper_numbers()["table1"]
    rows: list[dict] = []
    for name in DATASETS:
        for seed in range(seeds):
            _say(progress, f"vfl-table1: {name} seed {seed}")
            rows += table1_split(name, seed, rounds, Q, quick)
    md = [
        "# Seed 002, Table I (fedmodel reproduction)",
        "",
        f"{seeds} seed(s); Fair VFL eps = {EPS}, c = {C}, eta = {ETA}, beta = {BETA} (dual "
        f"step beta), Q = {Q}, {rounds} rounds; FedBCD the same without the constraint. "
        "Test-set AC, FR = 1 - DEO (loss-based, Definition 1) and HM in %, mean±std over "
        "seeds; FR_tpr/HM_tpr use the TPR-based DEO. EO and CEO post-process FedBCD on the "
        "pooled data (not federated). The references are centralized and certified."
        + (" QUICK run: Adult with 4,000 training rows." if quick else ""),
        "",
    ]
    header = [
        "data set",
        "method",
        "AC",
        "FR",
        "HM",
        "FR_tpr",
        "HM_tpr",
        "paper AC",
        "paper FR",
        "paper HM",
    ]
    table = []
    for name in DATASETS:
        for method in METHOD_ORDER:
            sel = [r for r in rows if r["dataset"] == name and r["method"] == method]
            if not sel:
                continue
            p = paper[name].get(PAPER_METHOD.get(method, ""), None)
            pa = (
                [f"{p[0]:.1f}±{p[1]:.1f}", f"{p[2]:.1f}±{p[3]:.1f}", f"{p[4]:.1f}±{p[5]:.1f}"]
                if p
                else ["", "", ""]
            )
            table.append(
                [name, method]
                + [_ms([r[k] for r in sel]) for k in ("AC", "FR", "HM", "FR_tpr", "HM_tpr")]
                + pa
            )
    md.append(md_table(header, table))
    checks = []
    for name in DATASETS:
        sel = {
            m: [r for r in rows if r["dataset"] == name and r["method"] == m] for m in METHOD_ORDER
        }
        fr_fair = np.mean([r["FR"] for r in sel["Fair VFL"]])
        fr_bcd = np.mean([r["FR"] for r in sel["FedBCD"]])
        checks.append(
            _check(
                f"{name}: Fair VFL fairer than FedBCD (test, loss-based)",
                fr_fair > fr_bcd,
                f"FR {fr_fair:.1f} vs {fr_bcd:.1f}",
            )
        )
        ac_fair = np.mean([r["AC"] for r in sel["Fair VFL"]])
        ac_bcd = np.mean([r["AC"] for r in sel["FedBCD"]])
        checks.append(
            _check(
                f"{name}: Fair VFL accuracy comparable to FedBCD (within 3 points)",
                ac_fair >= ac_bcd - 3.0,
                f"AC {ac_fair:.1f} vs {ac_bcd:.1f}",
            )
        )
        deo = max(r["train_deo"] for r in sel["Fair VFL"])
        checks.append(
            _check(
                f"{name}: Fair VFL training DEO near eps (<= eps + 0.01)",
                deo <= EPS + 0.01,
                f"max training DEO {deo:.4f}",
            )
        )
        st = [r["status"] for r in sel["reference (eps = 0.01)"] + sel["reference (unconstrained)"]]
        checks.append(
            _check(
                f"{name}: centralized references certified",
                all(s == "optimal" for s in st),
                ", ".join(st),
            )
        )
    return finish_report(out_dir, "vfl-table1", md, rows, checks, t0, quick, trials=seeds)


table1.default_trials = 5  # the paper's 5 runs


@register("vfl-fig1")
def fig1(out_dir, trials: int = 1, quick: bool = False, progress: bool = True, **kw) -> dict:
    """Seed 002 Fig. 1: Fair VFL's test accuracy and fairness over eps (seed 0)."""
    from fedmodel.plots import require_matplotlib

    require_matplotlib()  # before the runs: fail early without matplotlib
    t0 = time.perf_counter()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    grids = paper_numbers()["fig1_eps"]
    datasets = ("compas",) if quick else DATASETS
    rounds = int(kw.get("rounds", 200 if quick else ROUNDS))
    Q = int(kw.get("Q", Q_TABLE))
    rows: list[dict] = []
    for name in datasets:
        prob = _split(name, 0, quick)
        eps_grid = grids[name] if not quick else [grids[name][1], grids[name][3], grids[name][-1]]
        for eps in eps_grid:
            _say(progress, f"vfl-fig1: {name} eps {eps}")
            res = solve_vertical(
                prob,
                "fair-vfl",
                eps=eps,
                c=C,
                eta=ETA,
                beta=BETA,
                Q=Q,
                max_rounds=rounds,
                monitor_every=rounds,
                keep_ledger=False,
            )
            rows.append(
                _row(
                    name,
                    0,
                    "Fair VFL",
                    True,
                    res.extra["test"],
                    eps=eps,
                    lambda1=float(res.extra["lambda"][0]),
                    lambda2=float(res.extra["lambda"][1]),
                    train_deo=res.extra["train"]["deo_loss"],
                    rounds=rounds,
                )
            )
    png = out_dir / "vfl-fig1.png"
    _fig1_plot(rows, datasets, png)
    md = [
        "# Seed 002, Fig. 1 (fedmodel reproduction)",
        "",
        f"Fair VFL, seed 0, c = {C}, eta = {ETA}, beta = {BETA}, Q = {Q}, {rounds} rounds.",
        "",
        md_table(
            ["data set", "eps", "AC", "FR", "FR_tpr", "train DEO", "lambda"],
            [
                [
                    r["dataset"],
                    r["eps"],
                    f"{r['AC']:.1f}",
                    f"{r['FR']:.1f}",
                    f"{r['FR_tpr']:.1f}",
                    f"{r['train_deo']:.4f}",
                    f"({r['lambda1']:.3g}, {r['lambda2']:.3g})",
                ]
                for r in rows
            ],
        ),
        "",
        f"![fig1]({png.name})",
    ]
    checks = []
    for name in datasets:
        sel = [r for r in rows if r["dataset"] == name]
        last = sel[-1]
        checks.append(
            _check(
                f"{name}: lambda = 0 at the largest eps ({last['eps']})",
                last["lambda1"] == 0 and last["lambda2"] == 0,
                f"lambda = ({last['lambda1']:.3g}, {last['lambda2']:.3g})",
            )
        )
        checks.append(
            _check(
                f"{name}: training DEO falls with eps",
                sel[0]["train_deo"] <= sel[-1]["train_deo"] + 1e-12,
                f"{sel[0]['train_deo']:.4f} at eps {sel[0]['eps']} vs "
                f"{sel[-1]['train_deo']:.4f} at {sel[-1]['eps']}",
            )
        )
    return finish_report(out_dir, "vfl-fig1", md, rows, checks, t0, quick, [png], trials=1)


def _fig1_plot(rows: list[dict], datasets, path: Path):
    """Fig. 1's PNG: accuracy and fairness (%) against eps, each point at its eps value
    (log x axis, ticks at the eps values run), one panel per data set."""
    from fedmodel.plots import require_matplotlib

    figure = require_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.ticker import NullLocator

    fig = figure.Figure(figsize=(4.5 * len(datasets), 3.8), layout="constrained")
    FigureCanvasAgg(fig)
    axes = np.atleast_1d(fig.subplots(1, len(datasets)))
    for ax, name in zip(axes, datasets):
        sel = sorted((r for r in rows if r["dataset"] == name), key=lambda r: r["eps"])
        eps = [r["eps"] for r in sel]
        ax.plot(eps, [r["AC"] for r in sel], "o-", label="accuracy (test)")
        ax.plot(eps, [r["FR"] for r in sel], "s-", label="fairness 1-DEO (test, loss)")
        ax.plot(eps, [r["FR_tpr"] for r in sel], "^--", label="fairness 1-DEO (test, TPR)")
        ax.set_xscale("log")
        ax.set_xticks(eps, [f"{e:g}" for e in eps], rotation=60 if len(eps) > 4 else 0)
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xlabel("eps (fairness bound, log scale)")
        ax.set_ylabel("accuracy / fairness (%)")
        ax.set_title(f"{name}: Fair VFL over eps")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.savefig(path, dpi=110)
    return fig


@register("vfl-fig2")
def fig2(out_dir, trials: int = 1, quick: bool = False, progress: bool = True, **kw) -> dict:
    """Seed 002 Fig. 2: training loss against communication rounds for Q in {1, 4, 7}."""
    from fedmodel.plots import require_matplotlib

    figure = require_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    t0 = time.perf_counter()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    datasets = ("compas",) if quick else DATASETS
    rounds = int(kw.get("rounds", 150 if quick else 300))
    eps_values = FIG2_EPS[::2] if quick else FIG2_EPS
    qs = paper_numbers()["fig2_Q"]
    rows: list[dict] = []
    curves: dict[tuple, tuple] = {}
    for name in datasets:
        prob = _split(name, 0, quick)
        every = 1 if prob.n <= 5000 else 5
        for eps in eps_values:
            for Q in qs:
                _say(progress, f"vfl-fig2: {name} eps {eps} Q {Q}")
                res = solve_vertical(
                    prob,
                    "fair-vfl",
                    eps=eps,
                    c=C,
                    eta=ETA,
                    beta=BETA,
                    Q=Q,
                    max_rounds=rounds,
                    monitor_every=every,
                    keep_ledger=False,
                )
                r = [h["round"] for h in res.history]
                loss = [h["objective"] for h in res.history]
                curves[(name, eps, Q)] = (r, loss)
                rows.append(
                    {
                        "dataset": name,
                        "eps": eps,
                        "Q": Q,
                        "rounds": rounds,
                        "final_loss": loss[-1],
                        "final_deo": res.extra["train"]["deo_loss"],
                        "loss_at_quarter": float(np.interp(rounds / 4, r, loss)),
                    }
                )
    fig = figure.Figure(figsize=(4.5 * len(datasets), 3.6), layout="constrained")
    FigureCanvasAgg(fig)
    axes = np.atleast_1d(fig.subplots(1, len(datasets)))
    styles = dict(zip(eps_values, ("-", "--", ":")))
    colors = dict(zip(qs, ("C0", "C1", "C2")))
    for ax, name in zip(axes, datasets):
        for eps in eps_values:
            for Q in qs:
                r, loss = curves[(name, eps, Q)]
                ax.plot(r, loss, styles[eps], color=colors[Q], label=f"Q={Q}, eps={eps:g}")
        ax.set_xlabel("communication round")
        ax.set_ylabel("training loss L(theta)")
        ax.set_title(name)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    png = out_dir / "vfl-fig2.png"
    fig.savefig(png, dpi=110)
    md = [
        "# Seed 002, Fig. 2 (fedmodel reproduction)",
        "",
        f"Fair VFL, seed 0, c = {C}, eta = {ETA}, beta = {BETA}, {rounds} rounds, every "
        "party exactly Q local updates per round.",
        "",
        md_table(
            ["data set", "eps", "Q", "loss at rounds/4", "final loss", "final DEO"],
            [
                [
                    r["dataset"],
                    r["eps"],
                    r["Q"],
                    f"{r['loss_at_quarter']:.5f}",
                    f"{r['final_loss']:.5f}",
                    f"{r['final_deo']:.4f}",
                ]
                for r in rows
            ],
        ),
        "",
        f"![fig2]({png.name})",
    ]
    checks = []
    for name in datasets:
        for eps in eps_values:
            sel = sorted(
                (r for r in rows if r["dataset"] == name and r["eps"] == eps), key=lambda r: r["Q"]
            )
            vals = [r["loss_at_quarter"] for r in sel]
            checks.append(
                _check(
                    f"{name}, eps {eps}: larger Q, lower loss after rounds/4",
                    all(a >= b - 1e-12 for a, b in zip(vals, vals[1:])),
                    " > ".join(f"{v:.5f}" for v in vals),
                )
            )
        big_q = [r for r in rows if r["dataset"] == name and r["Q"] == max(qs)]
        big_q.sort(key=lambda r: r["eps"])
        checks.append(
            _check(
                f"{name}: smaller eps, larger final loss (Q = {max(qs)})",
                big_q[0]["final_loss"] >= big_q[-1]["final_loss"] - 1e-12,
                f"{big_q[0]['final_loss']:.5f} at eps {big_q[0]['eps']} vs "
                f"{big_q[-1]['final_loss']:.5f} at {big_q[-1]['eps']}",
            )
        )
    return finish_report(out_dir, "vfl-fig2", md, rows, checks, t0, quick, [png], trials=1)
