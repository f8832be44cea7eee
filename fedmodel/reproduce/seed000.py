"""Reproduction of seed 000 (He, Peng, Sun: "Federated learning with convex global and
local constraints"), Tables 1-3 and Figures 1-3.

``fedmodel reproduce table1|table2|table3|fig1|fig2|fig3 [--trials N] [--quick]``

Every table runs prox-al (Algorithm 1 + 2) and cprox-al (Algorithm 3) with the paper's
settings from the same starting point ``w0`` drawn on the unit sphere with the trial's
seed, plus the centralized optimum (``method="centralized"``) where the model is
convex, and writes into the output folder:

* ``NAME.md``: mean (std) over the trials next to the paper's own numbers (stored in
  ``fedmodel/reproduce/data/seed000_paper.json``), with wall times and statuses;
* ``NAME_runs.csv`` (one row per trial and method) and ``NAME.csv`` (the aggregated table);
* ``NAME.png``: our numbers against the paper's.

Trials: trial ``t`` uses seed ``t`` for the data split (NP, fairness), the sphere point
``w0`` and, for Table 1, nothing else (one QP instance per (n, d, m), seed 0, as in the
paper). ``quick=True`` runs a small grid (3 trials, n <= 5, big data sets subsampled) and
returns checks: prox-al vs cprox-al relative objective difference <= 1e-2, every client's
constraint value <= its bound + 1e-3, prox-al within 1e-3 of the centralized optimum.
Quick runs have no time limit: they end by their iteration caps or by converging. The
fairness targets (table3, fig2) run their quick checks at rho = 1: at the paper's rho = 1e8
prox-al stays at w0 (docs/reproduction_seed000.md); table3 --quick runs that setting once
beside its checks and reports it as a finding.

Per-client quantities over the outer iterations (Figs. 1 and 2) come from the history's
constraint values; the per-client *objective* (class-0 loss, classification loss) is read
through a "monitor" constraint ``loss <= 1e6`` added to each client: it is never active, so
its multiplier stays 0 and it adds exactly nothing to the merit functions or the KKT
residuals, i.e. the iterates are those of the plain model.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

import cvxpy as cp
import numpy as np

from fedmodel.reproduce import register
from fedmodel.reproduce.output import (
    check,
    check_lines,
    mark_time_limited,
    md_table,
    verdict,
    write_csv,
)

PAPER_FILE = "seed000_paper.json"

#: The paper's settings (seed 000 Sections 5.1-5.3); ``eps`` = (1e-3, 1e-3), ``mu0`` = 0.
SETTINGS: dict[str, dict[str, float]] = {
    "table1": {"sbar": 0.1, "beta": 10.0, "rho": 1.0},
    "table2": {"r": 0.2, "sbar": 1e-3, "beta": 300.0, "rho": 0.01},
    "table3": {"r": 0.1, "sbar": 1e-3, "beta": 10.0, "rho": 1e8},
}
EPS = 1e-3
#: ``max_outer``/``max_inner`` used by every solve (the paper states none; the authors'
#: code caps both at 200 and 50-200).
CAPS = {"max_outer": 300, "max_inner": 1000}

#: Full grids (the paper's) and the ``--quick`` grids.
FULL = {
    "table1": {"grid": [(n, d, d // 100) for n in (1, 5, 10) for d in (100, 300, 500)]},
    "table2": {
        "datasets": {"breast_cancer": None, "adult": None, "monks": None},
        "n": (1, 5, 10, 20),
    },
    "table3": {"setup": "paper", "train_rows": None, "test_rows": None, "n": (1, 5, 10, 20)},
    "fig1": {"datasets": {"breast_cancer": None, "adult": None, "monks": None}, "n": 10},
    "fig2": {"setup": "paper", "train_rows": None, "test_rows": None, "n": (5, 10, 20)},
    "fig3": {
        "datasets": {"breast_cancer": None, "adult": None, "monks": None},
        "n": (5, 10, 20),
        "setup": "paper",
        "train_rows": None,
        "test_rows": None,
    },
}
QUICK = {
    "table1": {"grid": [(1, 100, 1), (5, 100, 1)]},
    # Breast cancer at n = 1, 5 and monks-1 at n = 1: prox-al with the paper's rho = 0.01
    # needs thousands of ADMM rounds on monks-1 for n >= 2 (minutes), and the small adult
    # subsamples that would fit are so flat (rare one-hot columns) that a 1e-3-KKT point
    # can be 1e-2 away from f* in objective, for cprox-al as well. See the docs.
    "table2": {
        "datasets": {"breast_cancer": None, "monks": None},
        "n": {"breast_cancer": (1, 5), "monks": (1,)},
    },
    # rho = 1, not the paper's 1e8: at 1e8 Algorithm 2 moves w by about ||grad|| / (n rho)
    # per round, so prox-al stays at w0 (measured, docs); that stall is run beside the
    # checks as a finding (STALL_CAPS), the checks are made where the method works
    # 2,000 / 600 rows: cprox-al certifies there (at 600 / 200 it ends at max_outer)
    "table3": {"setup": "paper", "train_rows": 2000, "test_rows": 600, "n": (1,), "rho": 1.0},
    # monks-1 at n = 1: at n >= 2 prox-al with the paper's rho = 0.01 runs every outer
    # iteration to max_inner without (19); n = 3 ran to the caps (300 x 1000 rounds, about
    # 4,900 s) with a class-1 loss of 0.2043 > r (a failure of the full run, see the docs)
    "fig1": {
        "datasets": {"breast_cancer": None, "adult": 1000, "monks": None},
        "n": {"breast_cancer": (3,), "adult": (3,), "monks": (1,)},
    },
    # table3's --quick run traced (trial 0, rho = 1): at the paper's 1e8 prox-al stays at
    # w0, whose disparities are below r already (the disparity check passed without a
    # step taken); n = 2 on 600 / 200 rows had not ended after 18 min on the loaded machine
    "fig2": {"setup": "paper", "train_rows": 2000, "test_rows": 600, "n": (1,), "rho": 1.0},
    "fig3": {
        "datasets": {"breast_cancer": None, "adult": 2000, "monks": None},
        "n": (3, 5),
        "setup": "paper",
        "train_rows": 2000,
        "test_rows": 500,
    },
}
#: Seconds allowed per solve (``--time-limit`` overrides). ``--quick`` runs have none:
#: they end by the iteration caps (``CAPS``), so that their checks never depend on how busy
#: the machine is. The full grids keep a safety net; a run stopped by it (or by
#: ``--time-limit``) makes a failed check "inconclusive"
#: (:func:`fedmodel.reproduce.output.mark_time_limited`), not a verdict on the paper.
TIME_LIMIT: dict[str, float | None] = {"quick": None, "full": 1800.0}

#: seed 000 Section 5.3's allocation of adult-b: rows at the clients (from the training
#: part) and at the server (from the test part)
PAPER_ADULT_B = {"train_rows": 22_654, "test_rows": 5_659}
#: adult attributes left out for the paper's 39 features (which 39 the paper does not say):
#: the sensitive attribute and its proxy ``relationship`` (husband/wife), ``education``
#: (a relabelling of ``education-num``) and the 41 sparse ``native-country`` columns; the
#: rest gives 5 numeric + 7 workclass + 7 marital-status + 14 occupation + 5 race + intercept
ADULT_B_DROP = ("sex", "education", "relationship", "native-country")
#: ``--set setup=...`` of table3/fig2/fig3: the paper's allocation and features, or every row
FAIRNESS_SETUPS = ("paper", "all-rows")

DATASET_LABEL = {"breast_cancer": "breast-cancer-wisc", "adult": "adult-a", "monks": "monks-1"}
MONITOR_BOUND = 1e6
METHODS = ("prox-al", "cprox-al", "centralized")


# -- the paper's numbers ------------------------------------------------------------------


def paper_numbers() -> dict[str, Any]:
    """The paper's Tables 1-3 (and data set table) as stored in the package."""
    text = resources.files("fedmodel.reproduce").joinpath("data", PAPER_FILE).read_text()
    return json.loads(text)


def _paper_row(table: str, **key) -> dict | None:
    for row in paper_numbers()[table]["rows"]:
        if all(row.get(k) == v for k, v in key.items()):
            return row
    return None


# -- data ---------------------------------------------------------------------------------


def np_data(name: str, max_rows: int | None = None, seed: int = 0):
    """Features and labels of a Neyman-Pearson data set (monks: train and test pooled,
    556 rows as the paper's 550; adult: the 30,162-row training part), optionally
    subsampled to ``max_rows`` rows keeping the class ratio."""
    from fedmodel.datasets import load

    ds = load(name)
    X, y = ds.X, ds.y
    if name == "monks":
        X, y = np.vstack([ds.X, ds.X_test]), np.concatenate([ds.y, ds.y_test])
    if max_rows is not None and max_rows < len(y):
        X, y = _subsample(X, y, max_rows, seed)
    return X, y


def _subsample(X, y, rows, seed, extra=None):
    rng = np.random.default_rng(10_000 + seed)
    idx = []
    for c in np.unique(y):
        members = np.flatnonzero(y == c)
        k = max(1, round(rows * len(members) / len(y)))
        idx.append(rng.choice(members, size=min(k, len(members)), replace=False))
    idx = np.sort(np.concatenate(idx))
    if extra is None:
        return X[idx], y[idx]
    return X[idx], y[idx], extra[idx]


def np_sites(X, y, n: int, seed: int):
    """Stratified split into ``n`` clients, each as (class-0 rows, class-1 rows)."""
    from fedmodel.datasets import split_by_class, split_stratified

    sites = []
    for Xk, yk in split_stratified(X, y, n, random_state=seed):
        by = split_by_class(Xk, yk)
        sites.append((by[0], by[1]))
    return sites


def fairness_data(n: int, seed: int, train_rows=None, test_rows=None, setup: str = "paper"):
    """Adult split as in seed 000 Table 3: training rows over ``n`` clients (equal sizes,
    equal label ratios), test rows held by the server; sensitive = sex.

    ``setup="paper"`` (Section 5.3): 22,654 training rows at the clients and 5,659 test
    rows at the server (stratified subsamples drawn with the trial's seed), 39 features
    (:data:`ADULT_B_DROP` left out); ``setup="all-rows"``: all 30,162 training rows and
    15,060 test rows, our 104 features. ``train_rows``/``test_rows`` subsample further.
    """
    from fedmodel.datasets import load_adult, split_stratified

    if setup not in FAIRNESS_SETUPS:
        raise ValueError(f"setup must be one of {FAIRNESS_SETUPS}, got {setup!r}")
    paper = setup == "paper"
    ds = load_adult(drop=ADULT_B_DROP) if paper else load_adult()
    if paper:
        train_rows = PAPER_ADULT_B["train_rows"] if train_rows is None else train_rows
        test_rows = PAPER_ADULT_B["test_rows"] if test_rows is None else test_rows
    X, y, s = ds.X, ds.y, ds.sensitive
    Xt, yt, st = ds.X_test, ds.y_test, ds.sensitive_test
    if train_rows is not None and train_rows < len(y):
        X, y, s = _subsample(X, y, train_rows, seed, s)
    if test_rows is not None and test_rows < len(yt):
        Xt, yt, st = _subsample(Xt, yt, test_rows, seed + 1, st)
    parts = split_stratified(X, y, n, random_state=seed, extra={"s": s})
    clients = [(p["X"], p["y"], p["s"]) for p in parts]
    return clients, (Xt, yt, st)


def _mean_logistic(A: np.ndarray, z_sign: float, w: np.ndarray) -> float:
    """Mean of log(1 + exp(sign * A w))."""
    return float(np.mean(np.logaddexp(0.0, z_sign * (A @ w))))


def _logistic_loss(X, y, w) -> float:
    z = X @ w
    return float(np.mean(np.logaddexp(0.0, z) - y * z))


# -- models -------------------------------------------------------------------------------


def np_model(sites, r: float, monitor: bool = False):
    """Problem (26); with ``monitor`` every client also reports its class-0 loss (as the
    never-active constraint ``loss0 <= 1e6``, constraint index 1)."""
    from fedmodel.models import neyman_pearson_model

    model = neyman_pearson_model(sites, r=r)
    if monitor:
        w = model.variables[0]
        for client, (X0, _) in zip(model.clients, sites):
            A = client.data(X0, name="class0_monitor")
            loss0 = cp.sum(cp.logistic(A @ w)) / X0.shape[0]
            client.subject_to(loss0 <= MONITOR_BOUND, name="monitor: class-0 loss")
    return model


def fair_model(clients, server, r: float, monitor: bool = False):
    """Problem (28); with ``monitor`` every client also reports its classification loss
    (constraint index 2, never active)."""
    from fedmodel.models import fairness_model

    model = fairness_model(clients, server, r=r)
    if monitor:
        w = model.variables[0]
        for client, (X, y, _) in zip(model.clients, clients):
            A = client.data(X, name="X_monitor")
            lin = client.data(X.T @ np.asarray(y, float) / X.shape[0], name="Xty_monitor")
            loss = cp.sum(cp.logistic(A @ w)) / X.shape[0] - lin @ w
            client.subject_to(
                loss <= MONITOR_BOUND, allow_nonconvex=False, name="monitor: classification loss"
            )
    return model


def unconstrained_np_model(sites):
    """Problem (71): (1/n) sum_i mean logistic loss over client i's rows."""
    import fedmodel as fm

    model = fm.Model("unconstrained")
    w = model.variable(sites[0][0].shape[1], name="w")
    n = len(sites)
    for k, (X0, X1) in enumerate(sites):
        c = model.client(f"site{k}")
        A0, A1 = c.data(X0, name="class0"), c.data(X1, name="class1")
        m = X0.shape[0] + X1.shape[0]
        c.minimize((cp.sum(cp.logistic(A0 @ w)) + cp.sum(cp.logistic(-(A1 @ w)))) / (m * n))
    return model


def unconstrained_fair_model(clients):
    """Problem (72): (1/n) sum_i mean logistic loss (no disparity constraints)."""
    import fedmodel as fm

    model = fm.Model("unconstrained")
    w = model.variable(clients[0][0].shape[1], name="w")
    n = len(clients)
    for k, (X, y, _) in enumerate(clients):
        c = model.client(f"client{k + 1}")
        A = c.data(X, name="X")
        lin = c.data(X.T @ np.asarray(y, float) / (X.shape[0] * n), name="Xty")
        c.minimize(cp.sum(cp.logistic(A @ w)) / (X.shape[0] * n) - lin @ w)
    return model


# -- running ------------------------------------------------------------------------------


#: cprox-al's subproblem backend in the reproductions: scipy's L-BFGS-B, as the paper
#: ("obtained by applying L-BFGS method built in scipy.optimize.minimize", Sections
#: 5.2-5.3); ``--set cprox_solver=auto`` gives the library's choice (Newton where it applies)
CPROX_SOLVER = "lbfgs"
#: prox-al's subproblems (14)-(15) solved exactly (``exact_subproblems``) per target:
#: Section 5.1 says so for the QPs of Table 1, but every target keeps Algorithm 2's
#: ``max(q^t, local_floor * tau_k)`` by default (the measured runs in
#: docs/reproduction_seed000.md were made so; ``--set exact_subproblems=true`` is the
#: paper's Table 1 setting, compared there)
EXACT_SUBPROBLEMS: dict[str, bool] = {}


#: prox-al's iteration caps in the ``--quick`` runs of the fairness targets (the paper's
#: rho = 1e8 never meets (19), so every outer iteration runs to max_inner: 50 is the
#: authors' own cap in their fairness code); ``--set max_inner=...`` overrides
QUICK_PROX_CAPS: dict[str, dict[str, int]] = {}
#: prox-al's caps at the paper's rho = 1e8 in ``--quick`` runs (table3's finding beside its
#: checks, ``--quick --rho 1e8``): the authors' 50 inner rounds; at that rho more rounds
#: only cost time (each moves w by about ||grad|| / (n rho))
STALL_CAPS = {"max_outer": 3, "max_inner": 50}


def _paper_rho_caps(settings: dict, options: dict, quick: bool, kw: dict) -> dict:
    """``options`` with prox-al's caps at :data:`STALL_CAPS` for a ``--quick`` run at the
    paper's rho = 1e8 (``--set max_outer/max_inner`` still override)."""
    if quick and settings["rho"] == SETTINGS["table3"]["rho"]:
        options["prox_caps"].update({k: v for k, v in STALL_CAPS.items() if k not in kw})
    return options


def _method_options(table: str, kw: dict, quick: bool = False) -> dict[str, Any]:
    """The per-method choices a ``--set`` may change: ``cprox_solver``,
    ``exact_subproblems``, and prox-al's ``max_outer``/``max_inner``."""
    exact = kw.get("exact_subproblems", EXACT_SUBPROBLEMS.get(table, False))
    if not isinstance(exact, bool):
        raise ValueError(f"exact_subproblems must be true or false, got {exact!r}")
    caps = dict(CAPS)
    if quick:
        caps.update(QUICK_PROX_CAPS.get(table, {}))
    for key in caps:
        if key in kw:
            caps[key] = int(kw[key])
    return {
        "cprox_solver": str(kw.get("cprox_solver", CPROX_SOLVER)),
        "exact": exact,
        "prox_caps": caps,
    }


class _Runner:
    """Runs solves with the paper's settings, a time limit, and a progress display;
    ``options`` from :func:`_method_options` (default: cprox-al on L-BFGS, inexact
    subproblems)."""

    def __init__(
        self,
        name: str,
        total: int,
        progress: bool,
        time_limit: float | None,
        options: dict[str, Any] | None = None,
    ):
        from fedmodel.progress import make_progress

        self.name = name
        self.time_limit = time_limit
        self.options = options or _method_options(name, {})
        self.progress = make_progress(name, total=total, enabled=progress)

    def solve(self, model, method: str, settings: dict, seed: int, label: str):
        self.progress.set_description(f"{self.name} {label} {method}")
        t0 = time.perf_counter()
        if method == "centralized":
            opts: dict[str, Any] = {"time_limit": self.time_limit}
        else:
            opts = {
                "eps": EPS,
                "beta": settings["beta"],
                "sbar": settings["sbar"],
                "mu0": 0.0,
                "w0": "sphere",
                "random_state": seed,
                "time_limit": self.time_limit,
                "callback": self.progress.callback,
                **CAPS,
            }
            if method == "prox-al":
                opts["rho"] = settings["rho"]
                opts["variant"] = "paper"  # Algorithms 1-2 exactly as published
                opts["exact_subproblems"] = self.options["exact"]
                opts.update(self.options["prox_caps"])
            else:  # cprox-al: Algorithm 3, its subproblem by L-BFGS as in the paper
                opts["solver"] = self.options["cprox_solver"]
        try:
            res = model.solve(method=method, **opts)
            error = ""
        except Exception as exc:  # a failed solve is reported, not fatal
            res, error = None, f"{type(exc).__name__}: {exc}"
        seconds = time.perf_counter() - t0
        self.progress.advance()
        return res, seconds, error

    def close(self):
        self.progress.close()


def _record(res, seconds: float, error: str, **fields_) -> dict:
    row = dict(fields_)
    row["seconds"] = seconds
    if res is None:
        row.update(
            status="error",
            objective=math.nan,
            max_violation=math.nan,
            stationarity=math.nan,
            feasibility=math.nan,
            scaled_stationarity=math.nan,
            scaled_feasibility=math.nan,
            outer=0,
            rounds=0,
            inner_unmet=0,
            message=error,
        )
        return row
    row.update(
        status=res.status,
        objective=res.objective,
        max_violation=res.max_violation,
        stationarity=res.kkt.stationarity if res.kkt else math.nan,
        feasibility=res.kkt.feasibility if res.kkt else math.nan,
        scaled_stationarity=_or_nan(res.kkt and res.kkt.scaled_stationarity),
        scaled_feasibility=_or_nan(res.kkt and res.kkt.scaled_feasibility),
        outer=res.rounds.get("outer", 0),
        rounds=res.rounds.get("communication", 0),
        # outer iterations whose inner solve stopped at max_inner without (19)
        inner_unmet=sum(1 for h in res.history if h.get("inner_satisfied") is False),
        message=" ".join(str(res.message).split()),
    )
    return row


def _or_nan(value) -> float:
    return math.nan if value is None else float(value)


def _inaccurate_lines(runs: list[dict], method: str = "prox-al") -> list[str]:
    """The Markdown finding on ``method``'s runs that ended ``inaccurate`` (none: empty):
    the absolute residuals the paper's test (8) bounds beside the scaled ones the
    certificate's status is read from."""
    runs = [r for r in runs if r["method"] == method]
    bad = [r for r in runs if r["status"] == "inaccurate"]
    if not bad:
        return []

    def most(key):
        return max(r[key] for r in bad)

    return [
        "",
        f"## Finding: {method}'s 'inaccurate' statuses (reported, not a check)",
        "",
        f"{len(bad)} of {len(runs)} {method} runs ended 'inaccurate'. Over those runs the "
        f"largest absolute KKT residuals are stationarity {most('stationarity'):.2e} and "
        f"feasibility {most('feasibility'):.2e} (the paper's test (8) bounds these by eps); "
        f"the status is the certificate's, on the scaled residuals: largest scaled "
        f"stationarity {most('scaled_stationarity'):.2e}, scaled feasibility "
        f"{most('scaled_feasibility'):.2e}. The certificate measures the stationarity "
        "relative to the size of the gradients' terms and each constraint row relative to "
        "its own terms (for C_i w + d_i: max(|d_ij|, |C_ij w|)), so absolute residuals "
        "within eps can exceed eps once scaled.",
    ]


def _stats(values) -> tuple[float, float]:
    vals = np.array([v for v in values if v is not None and np.isfinite(v)], dtype=float)
    if vals.size == 0:
        return math.nan, math.nan
    # one trial: no standard deviation (printed as n/a, not as a misleading 0)
    return float(vals.mean()), float(vals.std(ddof=1)) if vals.size > 1 else math.nan


def _fmt(pair, digits: int = 4) -> str:
    m, s = pair
    if not np.isfinite(m):
        return "n/a"
    return f"{m:.{digits}g} ({s:.2e})" if np.isfinite(s) else f"{m:.{digits}g} (n/a)"


def _fmt_e(pair) -> str:
    m, s = pair
    if not np.isfinite(m):
        return "n/a"
    return f"{m:.2e} ({s:.2e})" if np.isfinite(s) else f"{m:.2e} (n/a)"


def _statuses(rows: list[dict]) -> str:
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    return ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))


def _check(name: str, value: float, bound: float, detail: str = "") -> dict:
    ok = bool(np.isfinite(value) and value <= bound)
    text = f"max {value:.3e} <= {bound:g}" if np.isfinite(value) else "no finite value"
    return {
        "name": name,
        "passed": ok,
        "value": float(value),
        "bound": bound,
        "detail": text + (f" ({detail})" if detail else ""),
    }


def _settings_with(table: str, rho: float | None) -> dict[str, float]:
    settings = dict(SETTINGS[table])
    if rho is not None:
        settings["rho"] = float(rho)
    return settings


def _grid(name: str, quick: bool, overrides: dict) -> dict:
    grid = dict((QUICK if quick else FULL)[name])
    for key in ("n", "datasets", "train_rows", "test_rows", "grid", "setup"):
        if key in overrides and overrides[key] is not None:
            value = overrides[key]
            if key == "n" and not isinstance(value, dict):
                value = tuple(np.atleast_1d(value).astype(int).tolist())
            if key == "datasets" and isinstance(value, (list, tuple, str)):
                names = [value] if isinstance(value, str) else list(value)
                value = {d: grid.get("datasets", {}).get(d) for d in names}
            grid[key] = value
    return grid


def _ns(n, dataset: str) -> tuple[int, ...]:
    """Client counts of a grid: one tuple for all data sets or a dict per data set."""
    if isinstance(n, dict):
        return tuple(n.get(dataset, ()))
    return tuple(n)


def _time_limit(quick: bool, time_limit: float | None) -> float | None:
    return float(time_limit) if time_limit else TIME_LIMIT["quick" if quick else "full"]


def _header(
    name: str,
    quick: bool,
    trials: int,
    settings: dict,
    extra: str = "",
    time_limit: float | None = None,
) -> list[str]:
    mode = "quick (small grid, subsampled data; not the paper's grid)" if quick else "full"
    setting_text = ", ".join(f"{k} = {v:g}" for k, v in settings.items())
    paper_trials = "" if quick or trials == 10 else " (the paper runs 10)"
    limit = (
        f"Time limit: {time_limit:g} s per solve; a solve stopped by it has status "
        "time_limit, and a check that fails with such a solve is inconclusive. "
        if time_limit
        else "No time limit: every solve ends by its iteration caps or by converging. "
    )
    return [
        f"# seed 000 {name} reproduction ({mode})",
        "",
        f"{trials} trials{paper_trials}. {limit}"
        f"Settings: {setting_text}, eps = ({EPS:g}, {EPS:g}), mu0 = 0, "
        "w0 uniform on the unit sphere (same w0 for both methods in a trial). "
        "Entries are mean (std) over the trials; 'paper' columns are the paper's numbers. "
        "Relative difference = |f(prox-al) - f(cprox-al)| / |f(cprox-al)|; abs. diff = "
        "|f(prox-al) - f(cprox-al)|; gap = |f(prox-al) - f*| with f* the optimum of "
        "method='centralized' (certified to 1e-6). Times are wall seconds per solve on this machine.",
        extra,
        "",
    ]


# -- Table 1: QP ----------------------------------------------------------------------------


@register("table1")
def table1(
    out_dir: Path,
    trials: int = 10,
    quick: bool = False,
    progress: bool = True,
    rho: float | None = None,
    time_limit: float | None = None,
    **kw,
) -> dict:
    """Seed 000 Table 1: linear-equality-constrained QPs (Section 5.1)."""
    from fedmodel.models import lcqp_instance, lcqp_model

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    settings = _settings_with("table1", rho)
    grid = _grid("table1", quick, kw)["grid"]
    runner = _Runner(
        "table1",
        len(grid) * (2 * trials + 1),
        progress,
        _time_limit(quick, time_limit),
        _method_options("table1", kw, quick),
    )
    runs: list[dict] = []
    t_start = time.perf_counter()
    try:
        for n, d, m in grid:
            inst = lcqp_instance(n=n, d=d, m=m, random_state=0)
            model = lcqp_model(inst)
            label = f"n={n} d={d} m={m}"
            star, sec, err = runner.solve(model, "centralized", settings, 0, label)
            ref = _record(star, sec, err, n=n, d=d, m=m, trial=-1, method="centralized")
            runs.append(ref)
            write_csv(out_dir / "table1_runs.csv", runs)  # partial results
            for t in range(trials):
                for method in ("prox-al", "cprox-al"):
                    res, sec, err = runner.solve(model, method, settings, t, f"{label} trial {t}")
                    rec = _record(res, sec, err, n=n, d=d, m=m, trial=t, method=method)
                    rec["lagrangian_gap"] = lcqp_lagrangian_gap(inst, res, star)
                    runs.append(rec)
                    write_csv(out_dir / "table1_runs.csv", runs)  # partial results
    finally:
        runner.close()
    rows, table, checks_data = [], [], []
    for n, d, m in grid:
        sel = [r for r in runs if (r["n"], r["d"], r["m"]) == (n, d, m)]
        p = [r for r in sel if r["method"] == "prox-al"]
        c = [r for r in sel if r["method"] == "cprox-al"]
        ref = next(r for r in sel if r["method"] == "centralized")
        rel = [
            abs(a["objective"] - b["objective"]) / max(abs(b["objective"]), 1e-12)
            for a, b in zip(p, c)
        ]
        gap = [abs(a["objective"] - ref["objective"]) for a in p]
        lgap = [a["lagrangian_gap"] for a in p]
        agg = {
            "n": n,
            "d": d,
            "m": m,
            "obj_prox_al": _stats(r["objective"] for r in p),
            "obj_cprox_al": _stats(r["objective"] for r in c),
            "obj_centralized": ref["objective"],
            "rel_diff": _stats(rel),
            "gap_centralized": _stats(gap),
            "lagrangian_gap": _stats(lgap),
            "viol_prox_al": _stats(r["max_violation"] for r in p),
            "viol_cprox_al": _stats(r["max_violation"] for r in c),
            "time_prox_al": _stats(r["seconds"] for r in p),
            "time_cprox_al": _stats(r["seconds"] for r in c),
            "time_centralized": ref["seconds"],
            "rounds_prox_al": _stats(r["rounds"] for r in p),
            "status": f"prox-al: {_statuses(p)}; cprox-al: {_statuses(c)}",
        }
        rows.append(agg)
        checks_data.append((rel, [r["max_violation"] for r in p], [abs(v) for v in lgap]))
        paper = _paper_row("table1", n=n, d=d, m=m) or {}

        def pp(k, paper=paper):
            return _fmt(paper[k], 3) if k in paper else "-"

        def pe(k, paper=paper):
            return _fmt_e(paper[k]) if k in paper else "-"

        table.append(
            [
                n,
                d,
                m,
                _fmt(agg["obj_prox_al"]),
                _fmt(agg["obj_cprox_al"]),
                f"{ref['objective']:.6g}",
                _fmt_e(agg["rel_diff"]),
                _fmt_e(agg["gap_centralized"]),
                _fmt_e(agg["lagrangian_gap"]),
                _fmt_e(agg["viol_prox_al"]),
                _fmt_e(agg["viol_cprox_al"]),
                f"{agg['time_prox_al'][0]:.2f} / {agg['time_cprox_al'][0]:.2f} / "
                f"{ref['seconds']:.2f}",
                f"{agg['rounds_prox_al'][0]:.0f}",
                agg["status"],
                pp("obj_prox_al"),
                pp("obj_cprox_al"),
                pe("rel_diff"),
                pe("viol_prox_al"),
                pe("viol_cprox_al"),
            ]
        )
    header = [
        "n",
        "d",
        "m",
        "obj prox-al",
        "obj cprox-al",
        "f* (centralized)",
        "rel. diff",
        "gap to f*",
        "L(w, y*) - f*",
        "viol. prox-al",
        "viol. cprox-al",
        "time prox / cprox / f* (s)",
        "rounds prox-al",
        "status",
        "paper obj Alg. 1",
        "paper obj cProx-AL",
        "paper rel. diff",
        "paper viol. Alg. 1",
        "paper viol. cProx-AL",
    ]
    rel_all = [v for rel, _, _ in checks_data for v in rel]
    viol_all = [v for _, viol, _ in checks_data for v in viol]
    lgap_all = [v for _, _, lgap in checks_data for v in lgap]
    checks = [
        _check("prox-al vs cprox-al relative objective difference", _max(rel_all), 1e-2),
        _check("prox-al max violation (|C_i w + d_i|)", _max(viol_all), 1e-3),
        _check("prox-al |L(w, y*) - f*| at the centralized multipliers y*", _max(lgap_all), 1e-3),
    ]
    md = _header(
        "Table 1 (QP, Section 5.1)",
        quick,
        trials,
        settings,
        "One QP instance per (n, d, m) (seed 0), generated as in Section 5.1; "
        "violation = max_i |C_i w + d_i|_inf over server and clients. "
        "f(w) - f* = [L(w, y*) - f*] - sum_i y*_i^T (C_i w + d_i), with L the Lagrangian and "
        "y* the multipliers of the centralized solve: the first term is at least "
        "(n / 4) ||w - w*||^2 (each A_i >= I / 2), the second is what a point with violation "
        "eps2 = 1e-3 may have (up to ||y*||_1 eps2, more than 1e-3 once the multipliers "
        "are large). The check is on L(w, y*) - f*, the gap to f* is shown beside it.",
        time_limit=runner.time_limit,
    )
    md.append(md_table(header, table))
    md += _inaccurate_lines(runs)
    files = _finish(out_dir, "table1", md, runs, rows, checks, time.perf_counter() - t_start)
    _plot_table1(out_dir / "table1.png", rows, trials)
    return _summary(
        "table1",
        out_dir,
        files + [str(out_dir / "table1.png")],
        rows,
        checks,
        t_start,
        quick,
        trials,
    )


def lcqp_lagrangian_gap(instance, res, star) -> float:
    """``L(w, y*) - f*`` for the LCQP ``instance``: ``res``'s point ``w`` in the Lagrangian
    at the multipliers ``y*`` of the centralized result ``star`` (server: ``C_0``, party
    ``clientK``: ``C_K``); NaN when either solve failed.

    ``f(w) - f* = [L(w, y*) - f*] - sum_i y*_i^T (C_i w + d_i)``: the bracket is the
    Lagrangian's own gap (zero only at ``w*``, strongly convex in ``w``), the sum is the
    first-order change of the objective along the constraints' residuals.

    Examples
    --------
    >>> from fedmodel.models import lcqp_instance, lcqp_model
    >>> inst = lcqp_instance(n=2, d=5, m=1, random_state=0)
    >>> star = lcqp_model(inst).solve(method="centralized")
    >>> abs(lcqp_lagrangian_gap(inst, star, star)) < 1e-6
    True
    """
    if res is None or star is None:
        return math.nan
    w = np.asarray(res.x, dtype=float)
    pairing = 0.0
    for party, multipliers in star.multipliers.items():
        k = 0 if party == "server" else int(party.removeprefix("client"))
        (y,) = multipliers.values()
        pairing += float(np.asarray(y) @ (instance.C[k] @ w + instance.d[k]))
    return float(res.objective + pairing - star.objective)


def _max(values) -> float:
    """Largest value; inf when there is none or one is not finite (a failed run)."""
    vals = [float(v) for v in values if v is not None]
    if not vals or not all(np.isfinite(vals)):
        return math.inf
    return max(vals)


def _finish(out_dir: Path, name: str, md: list[str], runs, rows, checks, seconds) -> list[str]:
    mark_time_limited(checks, [r["status"] for r in runs])
    md += ["", "## Checks", ""]
    md += check_lines(checks)
    md += ["", f"Total wall time: {seconds:.1f} s.", ""]
    md_path = out_dir / f"{name}.md"
    md_path.write_text("\n".join(md))
    write_csv(out_dir / f"{name}_runs.csv", runs)
    flat = []
    for r in rows:
        flat.append(
            {k: (v[0] if isinstance(v, tuple) else v) for k, v in r.items()}
            | {f"{k}_std": v[1] for k, v in r.items() if isinstance(v, tuple)}
        )
    write_csv(out_dir / f"{name}.csv", flat)
    return [str(md_path), str(out_dir / f"{name}.csv"), str(out_dir / f"{name}_runs.csv")]


def _summary(name, out_dir, files, rows, checks, t_start, quick, trials) -> dict:
    return {
        "name": name,
        "out_dir": str(out_dir),
        "markdown": str(Path(out_dir) / f"{name}.md"),
        "files": files,
        "rows": rows,
        "checks": checks,
        "verdict": verdict(checks),
        "passed": all(c["passed"] for c in checks),
        "seconds": time.perf_counter() - t_start,
        "quick": quick,
        "trials": trials,
    }


# -- Table 2: Neyman-Pearson -----------------------------------------------------------------


@register("table2")
def table2(
    out_dir: Path,
    trials: int = 10,
    quick: bool = False,
    progress: bool = True,
    rho: float | None = None,
    time_limit: float | None = None,
    **kw,
) -> dict:
    """Seed 000 Table 2: Neyman-Pearson classification on breast cancer, adult, monks-1."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    settings = _settings_with("table2", rho)
    grid = _grid("table2", quick, kw)
    r = settings["r"]
    configs = [(ds, n) for ds in grid["datasets"] for n in _ns(grid["n"], ds)]
    runner = _Runner(
        "table2",
        len(configs) * trials * 3,
        progress,
        _time_limit(quick, time_limit),
        _method_options("table2", kw, quick),
    )
    runs: list[dict] = []
    t_start = time.perf_counter()
    data = {}
    try:
        for ds, n in configs:
            for t in range(trials):
                key = (ds, t)
                if key not in data:
                    data[key] = np_data(ds, grid["datasets"][ds], seed=t)
                X, y = data[key]
                model = np_model(np_sites(X, y, n, seed=t), r)
                for method in METHODS:
                    res, sec, err = runner.solve(
                        model, method, settings, t, f"{ds} n={n} trial {t}"
                    )
                    rec = _record(
                        res,
                        sec,
                        err,
                        dataset=ds,
                        n=n,
                        trial=t,
                        method=method,
                        rows=len(y),
                        features=X.shape[1],
                    )
                    rec["client_constraint"] = _client_values(res, 0, offset=r)
                    runs.append(rec)
                    write_csv(out_dir / "table2_runs.csv", runs)  # partial results
    finally:
        runner.close()
    rows, table = [], []
    rel_all, cons_all, gap_all = [], [], []
    for ds, n in configs:
        sel = [x for x in runs if x["dataset"] == ds and x["n"] == n]
        p, c, z = ([x for x in sel if x["method"] == m] for m in METHODS)
        rel = [
            abs(a["objective"] - b["objective"]) / max(abs(b["objective"]), 1e-12)
            for a, b in zip(p, c)
        ]
        absd = [abs(a["objective"] - b["objective"]) for a, b in zip(p, c)]
        gap = [abs(a["objective"] - b["objective"]) for a, b in zip(p, z)]
        rel_all += rel
        gap_all += gap
        cons_all += [v for x in p for v in (x["client_constraint"] or [math.nan])]
        agg = {
            "dataset": ds,
            "n": n,
            "rows": sel[0]["rows"],
            "features": sel[0]["features"],
            "obj_prox_al": _stats(x["objective"] for x in p),
            "obj_cprox_al": _stats(x["objective"] for x in c),
            "obj_centralized": _stats(x["objective"] for x in z),
            "rel_diff": _stats(rel),
            "abs_diff": _stats(absd),
            "gap_centralized": _stats(gap),
            "cons_mean_prox_al": _stats(_mean(x["client_constraint"]) for x in p),
            "cons_max_prox_al": _stats(_maxl(x["client_constraint"]) for x in p),
            "cons_mean_cprox_al": _stats(_mean(x["client_constraint"]) for x in c),
            "cons_max_cprox_al": _stats(_maxl(x["client_constraint"]) for x in c),
            "time_prox_al": _stats(x["seconds"] for x in p),
            "time_cprox_al": _stats(x["seconds"] for x in c),
            "time_centralized": _stats(x["seconds"] for x in z),
            "rounds_prox_al": _stats(x["rounds"] for x in p),
            "outer_prox_al": _stats(x["outer"] for x in p),
            "status": f"prox-al: {_statuses(p)}; cprox-al: {_statuses(c)}",
        }
        rows.append(agg)
        paper = _paper_row("table2", dataset=ds, n=n) or {}
        table.append(_np_table_row(agg, paper))
    header = [
        "data set (rows x features)",
        "n",
        "obj prox-al",
        "obj cprox-al",
        "f* (centralized)",
        "rel. diff",
        "abs. diff",
        "gap to f*",
        "class-1 loss prox-al mean / max",
        "class-1 loss cprox-al mean / max",
        "time prox / cprox / f* (s)",
        "outer / rounds prox-al",
        "status",
        "paper obj Alg. 1 / cProx-AL",
        "paper rel. diff",
        "paper class-1 Alg. 1 mean / max",
        "paper class-1 cProx-AL mean / max",
    ]
    checks = [
        _check("prox-al vs cprox-al relative objective difference", _max(rel_all), 1e-2),
        _check("every client's class-1 loss <= r + 1e-3 (prox-al)", _max(cons_all), r + 1e-3),
        _check("prox-al within 1e-3 of the centralized optimum", _max(gap_all), 1e-3),
    ]
    md = _header(
        "Table 2 (Neyman-Pearson, Section 5.2)",
        quick,
        trials,
        settings,
        "Objective = class-0 logistic loss (mean over clients of the client's mean); "
        "constraint = each client's class-1 loss <= r. Our features: breast cancer "
        "10, adult 104, monks-1 18 (intercept included); the paper's 20/21/21 come "
        "from an unspecified preprocessing, so objective values differ.",
        time_limit=runner.time_limit,
    )
    md.append(md_table(header, table))
    files = _finish(out_dir, "table2", md, runs, rows, checks, time.perf_counter() - t_start)
    _plot_table23(out_dir / "table2.png", rows, "table2", trials)
    return _summary(
        "table2",
        out_dir,
        files + [str(out_dir / "table2.png")],
        rows,
        checks,
        t_start,
        quick,
        trials,
    )


def _mean(v):
    return float(np.mean(v)) if v else math.nan


def _maxl(v):
    return float(np.max(v)) if v else math.nan


def _client_values(
    res,
    index: int,
    offset: float = 0.0,
    transform: Callable | None = None,
    include_server: bool = False,
):
    """Each client's constraint value (``c[index] + offset``, or ``transform(c)``) at the
    returned point, from the last history row (empty for results without a history)."""
    if res is None or not res.history:
        return []
    out = []
    for party, vals in res.history[-1]["constraints"].items():
        if party == "server" and not include_server:
            continue
        vec = np.asarray(vals["ineq"], dtype=float).ravel()
        if vec.size == 0:
            continue
        out.append(float(transform(vec)) if transform else float(vec[index] + offset))
    return out


def _np_table_row(agg: dict, paper: dict) -> list[str]:
    def both(a, b):
        return f"{_fmt(agg[a])} / {_fmt(agg[b])}"

    def pboth(a, b):
        return f"{_fmt(paper[a], 3)} / {_fmt(paper[b], 3)}" if paper else "-"

    label = DATASET_LABEL.get(agg.get("dataset"), agg.get("dataset", "adult-b"))
    return [
        f"{label} ({agg['rows']} x {agg['features']})",
        agg["n"],
        _fmt(agg["obj_prox_al"]),
        _fmt(agg["obj_cprox_al"]),
        _fmt(agg["obj_centralized"]),
        _fmt_e(agg["rel_diff"]),
        _fmt_e(agg["abs_diff"]),
        _fmt_e(agg["gap_centralized"]),
        both("cons_mean_prox_al", "cons_max_prox_al"),
        both("cons_mean_cprox_al", "cons_max_cprox_al"),
        f"{agg['time_prox_al'][0]:.2f} / {agg['time_cprox_al'][0]:.2f} / "
        + (f"{agg['time_centralized'][0]:.2f}" if np.isfinite(agg["time_centralized"][0]) else "-"),
        f"{agg['outer_prox_al'][0]:.1f} / {agg['rounds_prox_al'][0]:.0f}",
        agg["status"],
        pboth("obj_prox_al", "obj_cprox_al"),
        _fmt_e(paper["rel_diff"]) if paper else "-",
        pboth("cons_mean_prox_al", "cons_max_prox_al"),
        pboth("cons_mean_cprox_al", "cons_max_cprox_al"),
    ]


# -- Table 3: fairness ----------------------------------------------------------------------


def _unmet_text(prox_rows: list[dict]) -> str:
    """'; (19) unmet in K of M outer iterations' over a cell's prox-al solves."""
    unmet = sum(int(x.get("inner_unmet", 0)) for x in prox_rows)
    outer = sum(int(x.get("outer", 0)) for x in prox_rows)
    return f"; prox-al: (19) unmet in {unmet} of {outer} outer iterations" if unmet else ""


def _disparity(vec: np.ndarray, r: float) -> float:
    """|L_a - L_b| from the two-sided constraint values (L_a - L_b - r, L_b - L_a - r)."""
    return float(max(vec[0], vec[1]) + r)


@register("table3")
def table3(
    out_dir: Path,
    trials: int = 10,
    quick: bool = False,
    progress: bool = True,
    rho: float | None = None,
    time_limit: float | None = None,
    **kw,
) -> dict:
    """Seed 000 Table 3: fairness-constrained classification on adult (server: test part)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    grid = _grid("table3", quick, kw)
    settings = _settings_with("table3", rho if rho is not None else grid.get("rho"))
    r = settings["r"]
    runner = _Runner(
        "table3",
        len(grid["n"]) * trials * 2,
        progress,
        _time_limit(quick, time_limit),
        _paper_rho_caps(settings, _method_options("table3", kw, quick), quick, kw),
    )
    runs: list[dict] = []
    t_start = time.perf_counter()
    try:
        for n in grid["n"]:
            for t in range(trials):
                clients, server = fairness_data(
                    n, t, grid["train_rows"], grid["test_rows"], grid["setup"]
                )
                model = fair_model(clients, server, r)
                rows_train = sum(len(c[1]) for c in clients)
                for method in ("prox-al", "cprox-al"):
                    res, sec, err = runner.solve(model, method, settings, t, f"n={n} trial {t}")
                    rec = _record(
                        res,
                        sec,
                        err,
                        n=n,
                        trial=t,
                        method=method,
                        rows=rows_train,
                        test_rows=len(server[1]),
                        features=clients[0][0].shape[1],
                    )
                    rec["disparity"] = _client_values(
                        res, 0, transform=lambda v: _disparity(v, r), include_server=True
                    )
                    runs.append(rec)
                    write_csv(out_dir / "table3_runs.csv", runs)  # partial results
        stall = _table3_stall(grid, settings, r, runner, quick, kw)
    finally:
        runner.close()
    rows, table = [], []
    rel_all, cons_all = [], []
    for n in grid["n"]:
        sel = [x for x in runs if x["n"] == n]
        p = [x for x in sel if x["method"] == "prox-al"]
        c = [x for x in sel if x["method"] == "cprox-al"]
        rel = [
            abs(a["objective"] - b["objective"]) / max(abs(b["objective"]), 1e-12)
            for a, b in zip(p, c)
        ]
        absd = [abs(a["objective"] - b["objective"]) for a, b in zip(p, c)]
        rel_all += rel
        cons_all += [v for x in p for v in (x["disparity"] or [math.nan])]
        agg = {
            "dataset": "adult-b",
            "n": n,
            "rows": sel[0]["rows"],
            "features": sel[0]["features"],
            "test_rows": sel[0]["test_rows"],
            "obj_prox_al": _stats(x["objective"] for x in p),
            "obj_cprox_al": _stats(x["objective"] for x in c),
            "obj_centralized": (math.nan, math.nan),
            "rel_diff": _stats(rel),
            "abs_diff": _stats(absd),
            "gap_centralized": (math.nan, math.nan),
            "cons_mean_prox_al": _stats(_mean(x["disparity"]) for x in p),
            "cons_max_prox_al": _stats(_maxl(x["disparity"]) for x in p),
            "cons_mean_cprox_al": _stats(_mean(x["disparity"]) for x in c),
            "cons_max_cprox_al": _stats(_maxl(x["disparity"]) for x in c),
            "time_prox_al": _stats(x["seconds"] for x in p),
            "time_cprox_al": _stats(x["seconds"] for x in c),
            "time_centralized": (math.nan, math.nan),
            "rounds_prox_al": _stats(x["rounds"] for x in p),
            "outer_prox_al": _stats(x["outer"] for x in p),
            "status": f"prox-al: {_statuses(p)}; cprox-al: {_statuses(c)}" + _unmet_text(p),
            "inner_unmet_prox_al": _stats(x["inner_unmet"] for x in p),
        }
        rows.append(agg)
        table.append(_np_table_row(agg, _paper_row("table3", n=n) or {}))
    header = [
        "data (train rows x features)",
        "n",
        "obj prox-al",
        "obj cprox-al",
        "f*",
        "rel. diff",
        "abs. diff",
        "gap to f*",
        "disparity prox-al mean / max",
        "disparity cprox-al mean / max",
        "time prox / cprox / - (s)",
        "outer / rounds prox-al",
        "status",
        "paper obj Alg. 1 / cProx-AL",
        "paper rel. diff",
        "paper disparity Alg. 1 mean / max",
        "paper disparity cProx-AL mean / max",
    ]
    checks = [
        _check("prox-al vs cprox-al relative objective difference", _max(rel_all), 1e-2),
        _check("every party's loss disparity <= r + 1e-3 (prox-al)", _max(cons_all), r + 1e-3),
    ]
    options = runner.options
    if grid["setup"] == "paper":
        data_text = (
            "Adult-b as in the paper's Section 5.3: a stratified subsample of the training "
            "part split over the n clients, one of the test part held by the server (global "
            f"constraint); the paper's allocation is {PAPER_ADULT_B['train_rows']:,} / "
            f"{PAPER_ADULT_B['test_rows']:,} rows; 39 features ({', '.join(ADULT_B_DROP)} "
            "left out; the paper does not say which 39)"
        )
    else:
        data_text = (
            "Adult, setup=all-rows (not the paper's): all training rows over the n clients, "
            "all test rows at the server, our 104 features"
        )
    md = _header(
        "Table 3 (fairness, Section 5.3)",
        quick,
        trials,
        settings,
        f"{data_text}; sensitive = sex. The constraints are non-convex, so there is no cvxpy "
        "optimum; cprox-al is the reference, as in the paper (its subproblems by "
        f"solver={options['cprox_solver']!r}). prox-al: variant='paper', "
        f"exact_subproblems={options['exact']}, max_outer = "
        f"{options['prox_caps']['max_outer']}, max_inner = {options['prox_caps']['max_inner']}. "
        "Disparity = |L_female - L_male| over clients and server. The status column counts the "
        "outer iterations whose Algorithm 2 stopped at max_inner without (19) (Algorithm 1 "
        "goes on with that point, as the paper's does).",
        time_limit=runner.time_limit,
    )
    if settings["rho"] != SETTINGS["table3"]["rho"]:
        md += [
            f"rho = {settings['rho']:g}, not the paper's {SETTINGS['table3']['rho']:g}"
            + (": see the finding below the table." if stall is not None else "."),
            "",
        ]
    md.append(md_table(header, table))
    if stall is not None:
        ref = next(
            x for x in runs if x["method"] == "cprox-al" and x["n"] == stall["n"] and not x["trial"]
        )
        md += ["", *_stall_lines(stall, ref["objective"], settings["rho"])]
        runs.append(stall)
    files = _finish(out_dir, "table3", md, runs, rows, checks, time.perf_counter() - t_start)
    _plot_table23(out_dir / "table3.png", rows, "table3", trials)
    return _summary(
        "table3",
        out_dir,
        files + [str(out_dir / "table3.png")],
        rows,
        checks,
        t_start,
        quick,
        trials,
    )


def _table3_stall(grid, settings, r, runner, quick: bool, kw: dict) -> dict | None:
    """``--quick`` at a rho other than the paper's: one prox-al run at the paper's
    rho = 1e8 (first n, trial 0, :data:`STALL_CAPS`), the measured stall reported beside
    the checks; None otherwise."""
    paper_rho = SETTINGS["table3"]["rho"]
    if not quick or settings["rho"] == paper_rho:
        return None
    n = grid["n"][0]
    clients, server = fairness_data(n, 0, grid["train_rows"], grid["test_rows"], grid["setup"])
    options = dict(runner.options, prox_caps=dict(STALL_CAPS))
    stall_runner = _Runner("table3", 1, False, runner.time_limit, options)
    res, sec, err = stall_runner.solve(
        fair_model(clients, server, r), "prox-al", dict(settings, rho=paper_rho), 0, "stall"
    )
    rec = _record(res, sec, err, n=n, trial=0, method=f"prox-al (rho = {paper_rho:g})")
    rec["disparity"] = _client_values(
        res, 0, transform=lambda v: _disparity(v, r), include_server=True
    )
    return rec


def _stall_lines(stall: dict, cprox_objective: float, rho: float) -> list[str]:
    """The Markdown of the paper's-rho finding (:func:`_table3_stall`)."""
    return [
        "## Finding: the paper's rho = 1e8 (reported, not a check)",
        "",
        f"The checks above run prox-al at rho = {rho:g}. With the paper's rho = 1e8 (n = "
        f"{stall['n']}, trial 0, max_outer = {STALL_CAPS['max_outer']}, max_inner = "
        f"{STALL_CAPS['max_inner']}) prox-al ends with status {stall['status']} at objective "
        f"{stall['objective']:.4f} (cprox-al, same trial: {cprox_objective:.4f}); (19) unmet in "
        f"{stall['inner_unmet']} of {stall['outer']} outer iterations. At rho = 1e8 one round "
        "of Algorithm 2 moves w by about ||grad|| / (n rho), so prox-al stays at "
        "its starting point w0, exact subproblems or not: at that rho our Algorithm 2 as "
        "published does not give the paper's Table 3 / Fig. 2.",
    ]


# -- figures ------------------------------------------------------------------------------


def _np_trace(res, r: float):
    """Iterations, per-client class-0 losses and class-1 losses from a monitored run."""
    it = np.array([row["iteration"] + 1 for row in res.history], dtype=float)
    names = [p for p in res.history[0]["constraints"] if p != "server"]
    c1 = np.array([[row["constraints"][p]["ineq"][0] + r for p in names] for row in res.history])
    c0 = np.array(
        [[row["constraints"][p]["ineq"][1] + MONITOR_BOUND for p in names] for row in res.history]
    )
    return it, c0, c1


@register("fig1")
def fig1(
    out_dir: Path,
    trials: int = 1,
    quick: bool = False,
    progress: bool = True,
    rho: float | None = None,
    time_limit: float | None = None,
    **kw,
) -> dict:
    """Seed 000 Fig. 1: per-client class-0/class-1 losses over prox-al's outer iterations."""
    from fedmodel.plots import plot_bands, require_matplotlib

    figure = require_matplotlib()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    settings = _settings_with("table2", rho)
    grid = _grid("fig1", quick, kw)
    r = settings["r"]
    datasets = list(grid["datasets"])
    runner = _Runner(
        "fig1",
        len(datasets),
        progress,
        _time_limit(quick, time_limit),
        _method_options("fig1", kw, quick),
    )
    t_start = time.perf_counter()
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = figure.Figure(figsize=(5 * len(datasets), 4), layout="constrained")
    FigureCanvasAgg(fig)
    axes = np.atleast_1d(fig.subplots(1, len(datasets)))
    runs, checks_vals = [], []
    try:
        for ax, ds in zip(axes, datasets):
            n = (
                _ns(grid["n"], ds)[0]
                if isinstance(grid["n"], dict)
                else int(np.atleast_1d(grid["n"])[0])
            )
            X, y = np_data(ds, grid["datasets"][ds], seed=0)
            model = np_model(np_sites(X, y, n, seed=0), r, monitor=True)
            res, sec, err = runner.solve(model, "prox-al", settings, 0, f"{ds} n={n}")
            rec = _record(res, sec, err, dataset=ds, n=n, method="prox-al")
            runs.append(rec)
            if res is None or not res.history:
                ax.set_title(f"{DATASET_LABEL[ds]}: {rec['message'] or 'no history'}")
                continue
            it, c0, c1 = _np_trace(res, r)
            checks_vals.append(float(c1[-1].max()))
            plot_bands(
                it,
                {"class-0 loss (objective)": c0, "class-1 loss (constraint)": c1},
                threshold=r,
                threshold_label=f"class-1 bound r = {r:g}",
                ax=ax,
                ylabel="logistic loss",
                title=f"{DATASET_LABEL[ds]}, n = {n} ({res.status})",
            )
    finally:
        runner.close()
    _wrapped_suptitle(
        fig,
        "seed 000 Fig. 1: per-client logistic losses over prox-al's outer iterations "
        "(lines = mean, bands = min..max over clients)",
    )
    png = out_dir / "fig1.png"
    fig.savefig(png, dpi=120)
    checks = [_check("final class-1 loss of every client <= r + 1e-3", _max(checks_vals), r + 1e-3)]
    md = [
        f"# seed 000 Fig. 1 ({'quick' if quick else 'full'})",
        "",
        "prox-al with the Table 2 settings, one trial (seed 0); bands = min/max "
        "over clients, lines = mean. ![fig1](fig1.png)",
        "",
    ]
    if quick:
        md += [
            "--quick: breast cancer and adult (1,000 rows) at n = 3, monks-1 at n = 1 (at "
            "n >= 2 the paper's rho = 0.01 needs max_inner rounds in every outer iteration: "
            "hours; the full run, n = 10, decides monks-1). No time limit: the runs end "
            "by their iteration caps or by converging.",
            "",
        ]
    md.append(
        md_table(
            ["data set", "n", "status", "outer", "rounds", "seconds"],
            [
                [
                    x["dataset"],
                    x["n"],
                    x["status"],
                    x["outer"],
                    x["rounds"],
                    f"{x['seconds']:.1f}",
                ]
                for x in runs
            ],
        )
    )
    files = _finish(out_dir, "fig1", md, runs, [], checks, time.perf_counter() - t_start)
    return _summary("fig1", out_dir, files + [str(png)], runs, checks, t_start, quick, 1)


@register("fig2")
def fig2(
    out_dir: Path,
    trials: int = 1,
    quick: bool = False,
    progress: bool = True,
    rho: float | None = None,
    time_limit: float | None = None,
    **kw,
) -> dict:
    """Seed 000 Fig. 2: per-client loss disparity and classification loss (adult)."""
    from fedmodel.plots import plot_bands, require_matplotlib

    figure = require_matplotlib()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    grid = _grid("fig2", quick, kw)
    settings = _settings_with("table3", rho if rho is not None else grid.get("rho"))
    r = settings["r"]
    ns = list(grid["n"])
    runner = _Runner(
        "fig2",
        len(ns),
        progress,
        _time_limit(quick, time_limit),
        _paper_rho_caps(settings, _method_options("fig2", kw, quick), quick, kw),
    )
    t_start = time.perf_counter()
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = figure.Figure(figsize=(5.5 * len(ns), 4), layout="constrained")
    FigureCanvasAgg(fig)
    axes = np.atleast_1d(fig.subplots(1, len(ns)))
    runs, checks_vals, loss_drops = [], [], []
    try:
        for ax, n in zip(axes, ns):
            clients, server = fairness_data(
                n, 0, grid["train_rows"], grid["test_rows"], grid["setup"]
            )
            model = fair_model(clients, server, r, monitor=True)
            res, sec, err = runner.solve(model, "prox-al", settings, 0, f"n={n}")
            rec = _record(res, sec, err, n=n, method="prox-al")
            runs.append(rec)
            if res is None or not res.history:
                ax.set_title(f"n = {n}: {rec['message'] or 'no history'}")
                continue
            hist = res.history
            it = np.array([row["iteration"] + 1 for row in hist], dtype=float)
            names = [p for p in hist[0]["constraints"] if p != "server"]
            disp = np.array(
                [
                    [_disparity(np.asarray(row["constraints"][p]["ineq"]), r) for p in names]
                    for row in hist
                ]
            )
            loss = np.array(
                [[row["constraints"][p]["ineq"][2] + MONITOR_BOUND for p in names] for row in hist]
            )
            glob = np.array(
                [_disparity(np.asarray(row["constraints"]["server"]["ineq"]), r) for row in hist]
            )
            checks_vals.append(float(max(disp[-1].max(), glob[-1])))
            loss_drops.append((n, float(loss[0].mean()), float(loss[-1].mean())))
            plot_bands(
                it,
                {"local loss disparity": disp},
                lines={"global disparity": glob},
                threshold=r,
                threshold_label=f"disparity bound r = {r:g}",
                ax=ax,
                ylabel="loss disparity",
                secondary={"classification loss": loss},
                secondary_label="classification loss",
                title=f"adult, n = {n}, rho = {settings['rho']:g} ({res.status})",
            )
    finally:
        runner.close()
    _wrapped_suptitle(
        fig,
        "seed 000 Fig. 2: per-party loss disparity (left axis) and classification loss "
        "(right axis) over prox-al's outer iterations (lines = mean, bands = min..max)",
    )
    png = out_dir / "fig2.png"
    fig.savefig(png, dpi=120)
    checks = [_check("final disparity of every party <= r + 1e-3", _max(checks_vals), r + 1e-3)]
    # the figure's other half: the classification loss is minimised, not left at w0's
    checks += [
        check(
            f"n = {n}: mean classification loss lower at the last outer iteration than at "
            f"the first by more than eps = {EPS:g}",
            last < first - EPS,
            f"first {first:.4f}, last {last:.4f}, drop {first - last:.2e}",
        )
        for n, first, last in loss_drops
    ]
    md = [
        f"# seed 000 Fig. 2 ({'quick' if quick else 'full'})",
        "",
        f"prox-al with the Table 3 settings (rho = {settings['rho']:g}), one trial (seed 0). "
        "![fig2](fig2.png)",
        "",
    ]
    md.append(
        md_table(
            ["n", "status", "outer", "rounds", "seconds", "message"],
            [
                [x["n"], x["status"], x["outer"], x["rounds"], f"{x['seconds']:.1f}", x["message"]]
                for x in runs
            ],
        )
    )
    files = _finish(out_dir, "fig2", md, runs, [], checks, time.perf_counter() - t_start)
    return _summary("fig2", out_dir, files + [str(png)], runs, checks, t_start, quick, 1)


@register("fig3")
def fig3(
    out_dir: Path,
    trials: int = 1,
    quick: bool = False,
    progress: bool = True,
    rho: float | None = None,
    time_limit: float | None = None,
    **kw,
) -> dict:
    """Seed 000 Fig. 3: constrained vs unconstrained models across clients."""
    from fedmodel.plots import require_matplotlib

    require_matplotlib()  # before the runs: fail early without matplotlib
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    grid = _grid("fig3", quick, kw)
    ns = list(grid["n"])
    datasets = list(grid["datasets"])
    s2, s3 = _settings_with("table2", None), _settings_with("table3", rho)
    runner = _Runner(
        "fig3",
        (len(datasets) + 1) * len(ns) * 2,
        progress,
        _time_limit(quick, time_limit),
        _method_options("fig3", kw, quick),
    )
    t_start = time.perf_counter()
    runs = []
    checks_vals: list[float] = []
    fair_vals: list[float] = []
    np_points: dict[str, dict[int, dict]] = {ds: {} for ds in datasets}
    fair_points: dict[int, dict] = {}
    try:
        for ds in datasets:
            X, y = np_data(ds, grid["datasets"][ds], seed=0)
            for n in ns:
                sites = np_sites(X, y, n, seed=0)
                cons, sec, err = runner.solve(
                    np_model(sites, s2["r"]), "centralized", s2, 0, f"{ds} n={n} constrained"
                )
                unc, sec2, err2 = runner.solve(
                    unconstrained_np_model(sites), "centralized", s2, 0, f"{ds} n={n} unconstrained"
                )
                runs.append(_record(cons, sec, err, dataset=ds, n=n, model="constrained"))
                runs.append(_record(unc, sec2, err2, dataset=ds, n=n, model="unconstrained"))
                if cons is None or unc is None:
                    continue
                for res, tag in ((cons, "NP"), (unc, "unconstrained")):
                    l0 = [_mean_logistic(X0, 1.0, res.x) for X0, _ in sites]
                    l1 = [_mean_logistic(X1, -1.0, res.x) for _, X1 in sites]
                    np_points[ds].setdefault(n, {})[tag] = (l0, l1)
                    if tag == "NP":
                        checks_vals.append(max(l1))
        for n in ns:
            clients, server = fairness_data(
                n, 0, grid["train_rows"], grid["test_rows"], grid["setup"]
            )
            cons, sec, err = runner.solve(
                fair_model(clients, server, s3["r"]),
                "cprox-al",
                s3,
                0,
                f"adult-b n={n} constrained",
            )
            unc, sec2, err2 = runner.solve(
                unconstrained_fair_model(clients),
                "centralized",
                s3,
                0,
                f"adult-b n={n} unconstrained",
            )
            runs.append(_record(cons, sec, err, dataset="adult-b", n=n, model="constrained"))
            runs.append(_record(unc, sec2, err2, dataset="adult-b", n=n, model="unconstrained"))
            if cons is None or unc is None:
                continue
            parties = list(clients) + [server]
            for res, tag in ((cons, "fair"), (unc, "unconstrained")):
                loss = [_logistic_loss(Xk, yk, res.x) for Xk, yk, _ in clients]
                disp = [
                    abs(
                        _logistic_loss(Xk[sk == 1], yk[sk == 1], res.x)
                        - _logistic_loss(Xk[sk == 0], yk[sk == 0], res.x)
                    )
                    for Xk, yk, sk in parties
                ]
                fair_points.setdefault(n, {})[tag] = (loss, disp)
                if tag == "fair":
                    fair_vals.append(max(disp))
    finally:
        runner.close()
    png = out_dir / "fig3.png"
    _plot_fig3(png, ns, np_points, fair_points, s2["r"], s3["r"])
    checks = [
        _check(
            "NP models: every client's class-1 loss <= r + 1e-3", _max(checks_vals), s2["r"] + 1e-3
        ),
        _check("fair models: every party's disparity <= r + 1e-3", _max(fair_vals), s3["r"] + 1e-3),
    ]
    md = [
        f"# seed 000 Fig. 3 ({'quick' if quick else 'full'})",
        "",
        "Constrained (NP: cvxpy optimum of (26); fairness: cprox-al on (28), rho unused) vs "
        "unconstrained logistic regression ((71), (72); cvxpy), per-client min/mean/max. "
        "![fig3](fig3.png)",
        "",
    ]
    md.append(
        md_table(
            ["data set", "n", "model", "status", "objective", "seconds"],
            [
                [
                    x["dataset"],
                    x["n"],
                    x["model"],
                    x["status"],
                    f"{x['objective']:.5g}",
                    f"{x['seconds']:.1f}",
                ]
                for x in runs
            ],
        )
    )
    files = _finish(out_dir, "fig3", md, runs, [], checks, time.perf_counter() - t_start)
    return _summary("fig3", out_dir, files + [str(png)], runs, checks, t_start, quick, 1)


def _range_point(ax, x, vals, color, marker, label, hollow=False) -> None:
    """One marker at the mean of ``vals`` with a bar from their min to their max."""
    vals = np.asarray(vals, dtype=float)
    mean = vals.mean()
    ax.errorbar(
        [x],
        [mean],
        yerr=[[mean - vals.min()], [vals.max() - mean]],
        color=color,
        marker=marker,
        capsize=4,
        linestyle="none",
        label=label,
        mfc="white" if hollow else color,
    )


def _plot_fig3(
    path: Path,
    ns: list[int],
    np_points: dict[str, dict[int, dict[str, tuple]]],
    fair_points: dict[int, dict[str, tuple]],
    r_np: float,
    r_fair: float,
):
    """Seed 000 Fig. 3. ``np_points[ds][n][tag] = (class-0 losses, class-1 losses)`` per
    client for tag "NP" / "unconstrained"; ``fair_points[n][tag] = (losses per client,
    disparities per party)`` for tag "fair" / "unconstrained". One panel per NP data set
    (both losses share the unit "logistic loss"), and two for adult-b: the classification
    loss and the loss disparity, each on its own axis; bound lines are in the legends."""
    from fedmodel.plots import require_matplotlib

    figure = require_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    names = list(np_points)
    fig = figure.Figure(figsize=(4.5 * (len(names) + 2), 4.4), layout="constrained")
    FigureCanvasAgg(fig)
    axes = np.atleast_1d(fig.subplots(1, len(names) + 2))
    shifts = {"NP": -0.12, "fair": -0.12, "unconstrained": 0.12}
    for ax, ds in zip(axes, names):
        for j, n in enumerate(ns):
            for tag, (l0, l1) in np_points[ds].get(n, {}).items():
                first = j == 0
                hollow = tag == "unconstrained"
                x = j + shifts[tag]
                _range_point(
                    ax, x - 0.04, l0, "tab:blue", "o", f"class 0, {tag}" if first else None, hollow
                )
                _range_point(
                    ax, x + 0.04, l1, "tab:brown", "s", f"class 1, {tag}" if first else None, hollow
                )
        ax.axhline(
            r_np, color="k", linestyle="--", linewidth=1, label=f"class-1 bound r = {r_np:g}"
        )
        ax.set_ylabel("logistic loss (min / mean / max over clients)")
        ax.set_title(f"{DATASET_LABEL[ds]} (Neyman-Pearson)")
    ax_loss, ax_disp = axes[-2], axes[-1]
    for j, n in enumerate(ns):
        for tag, (loss, disp) in fair_points.get(n, {}).items():
            first = j == 0
            hollow = tag == "unconstrained"
            x = j + shifts[tag]
            _range_point(ax_loss, x, loss, "tab:blue", "o", tag if first else None, hollow)
            _range_point(ax_disp, x, disp, "tab:brown", "s", tag if first else None, hollow)
    ax_disp.axhline(
        r_fair, color="k", linestyle="--", linewidth=1, label=f"disparity bound r = {r_fair:g}"
    )
    ax_loss.set_ylabel("logistic loss (min / mean / max over clients)")
    ax_loss.set_title("adult-b (fairness): classification loss")
    ax_disp.set_ylabel("loss disparity |L(female) - L(male)|\n(min / mean / max over parties)")
    ax_disp.set_title("adult-b (fairness): loss disparity")
    for ax in axes:
        ax.set_xticks(range(len(ns)), [f"n = {n}" for n in ns])
        ax.set_xlim(-0.5, len(ns) - 0.5)
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize="x-small")
    fig.suptitle("seed 000 Fig. 3: constrained (filled) vs unconstrained (open) models")
    fig.savefig(path, dpi=120)
    return fig


# -- table plots --------------------------------------------------------------------------


def _wrapped_suptitle(fig, text: str) -> None:
    """``fig.suptitle(text)`` broken into lines that fit the figure's width (a one-panel
    figure cut a one-line title at both edges)."""
    import textwrap

    chars = max(int(fig.get_figwidth() * 11), 40)  # about 11 characters per inch at 12 pt
    fig.suptitle(textwrap.fill(text, chars, break_on_hyphens=False))


def _table_figure(figsize):
    """A fresh Agg figure, or None without matplotlib (the tables are written anyway)."""
    try:
        from fedmodel.plots import require_matplotlib

        figure = require_matplotlib()
    except ImportError:
        return None
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = figure.Figure(figsize=figsize, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _trials_text(trials: int) -> str:
    return f"mean +- std over {trials} trials" if trials > 1 else "one trial (no error bar)"


def _points(ax, x, pairs, marker: str, label: str, color=None, log: bool = False, **kw):
    """Means at categorical positions ``x`` with +-std error bars (none where the std is
    NaN: one trial), markers only; on a log axis exact zeros sit on the bottom edge
    (:func:`fedmodel.plots.log_plot`). Returns the colour used and whether a zero was drawn."""
    from fedmodel.plots import log_plot

    x = np.asarray(x, dtype=float)
    mean = np.array([p[0] if p is not None else math.nan for p in pairs], dtype=float)
    std = np.array([p[1] if p is not None else math.nan for p in pairs], dtype=float)
    if log:
        line, zeros = log_plot(ax, x, mean, marker, color=color, label=label, **kw)
    else:
        (line,) = ax.plot(x, mean, marker, color=color, label=label, **kw)
        zeros = None
    bar = np.isfinite(mean) & np.isfinite(std) & (mean > 0 if log else True)
    if bar.any():
        lower = np.minimum(std[bar], mean[bar] * 0.999) if log else std[bar]
        ax.errorbar(
            x[bar],
            mean[bar],
            yerr=[lower, std[bar]],
            fmt="none",
            ecolor=line.get_color(),
            capsize=3,
        )
    return line.get_color(), zeros is not None


def _categorical_x(ax, labels, xlabel: str) -> None:
    ax.set_xticks(range(len(labels)), labels)
    ax.set_xlim(-0.5, len(labels) - 0.5)
    ax.set_xlabel(xlabel)
    ax.xaxis.set_minor_locator(_null_locator())
    ax.grid(True, axis="y", alpha=0.3)


def _null_locator():
    from matplotlib.ticker import NullLocator

    return NullLocator()


def _plot_table1(path: Path, rows: list[dict], trials: int = 1):
    """Table 1 against the paper, per (n, d, m) instance (categorical x positions, markers
    with +-std error bars, no lines joining instances)."""
    from fedmodel.plots import zero_legend_handle

    fig = _table_figure((11, 4.4))
    if fig is None:
        return
    ax1, ax2 = fig.subplots(1, 2)
    labels = [f"{r['n']}/{r['d']}/{r['m']}" for r in rows]
    x = np.arange(len(rows))
    paper = [_paper_row("table1", n=r["n"], d=r["d"], m=r["m"]) or {} for r in rows]
    zero = False
    for ax, series, ylabel, title, bound in (
        (
            ax1,
            [
                ("rel_diff", "o", "ours: prox-al vs cprox-al", rows),
                ("rel_diff", "s", "paper: Alg. 1 vs cProx-AL", paper),
            ],
            "|f(prox-al) - f(cprox-al)| / |f(cprox-al)|",
            "relative objective difference",
            1e-2,
        ),
        (
            ax2,
            [
                ("viol_prox_al", "o", "ours: prox-al", rows),
                ("viol_cprox_al", "^", "ours: cprox-al", rows),
                ("viol_prox_al", "s", "paper: Alg. 1", paper),
                ("viol_cprox_al", "D", "paper: cProx-AL", paper),
            ],
            "max violation  max_i |C_i w + d_i|_inf",
            "feasibility violation",
            1e-3,
        ),
    ):
        width = 0.6 / len(series)
        for k, (key, marker, label, src) in enumerate(series):
            shift = (k - (len(series) - 1) / 2) * width
            color = "0.45" if src is paper else None
            if src is paper and "D" in marker:
                color = "0.2"
            _, z = _points(ax, x + shift, [r.get(key) for r in src], marker, label, color, log=True)
            zero |= z
        ax.axhline(bound, color="k", linestyle=":", linewidth=1, label=f"pass threshold {bound:g}")
        _categorical_x(ax, labels, "instance n / d / m")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
    for ax in (ax1, ax2):
        handles, _ = ax.get_legend_handles_labels()
        ax.legend(handles=handles + ([zero_legend_handle()] if zero else []), fontsize="small")
    fig.suptitle(f"seed 000 Table 1 (QP): ours vs the paper, {_trials_text(trials)}")
    fig.savefig(path, dpi=120)
    return fig


def _prox_uncertified(row: dict) -> bool:
    """True when some prox-al trial of an aggregated row did not end ``optimal``
    (time limit, inaccurate, ...): its point is an iterate, not a certified answer."""
    part = str(row.get("status", "")).split(";")[0]
    return any(st != "optimal" for _, st in re.findall(r"(\d+) (\w+)", part))


def _mark_uncertified(ax, xs, ys, flags, label: bool) -> None:
    pts = [(x, y) for x, y, f in zip(xs, ys, flags) if f and np.isfinite(y)]
    if pts:
        ax.plot(
            *zip(*pts), "o", markersize=13, markerfacecolor="none", markeredgecolor="red",
            label="prox-al not certified (time limit, inaccurate)" if label else None,
        )  # fmt: skip


def _plot_table23(path: Path, rows: list[dict], table: str, trials: int = 1):
    """Tables 2/3 against the paper. Per data set: our three methods' objectives (top,
    mean +- std over the trials, one marker per method beside each other) and the paper's
    (bottom: its preprocessing differs, so its values get their own panel and scale);
    right: the relative difference prox-al vs cprox-al, ours and the paper's, on a log
    scale with the 1e-2 pass threshold."""
    from fedmodel.plots import zero_legend_handle

    groups: dict[str, list[dict]] = {}
    for r in rows:
        groups.setdefault(r["dataset"], []).append(r)
    fig = _table_figure((4.2 * (len(groups) + 1), 7))
    if fig is None:
        return
    names = list(groups)
    mosaic = [[f"ours:{ds}" for ds in names] + ["rel"], [f"paper:{ds}" for ds in names] + ["rel"]]
    axes = fig.subplot_mosaic(mosaic)
    what = "Neyman-Pearson" if table == "table2" else "fairness"
    for ds, rs in groups.items():
        label = DATASET_LABEL.get(ds, ds)
        ns = [r["n"] for r in rs]
        x = np.arange(len(ns))
        key = {"dataset": ds} if table == "table2" else {}
        paper = [_paper_row(table, n=n, **key) or {} for n in ns]
        ax = axes[f"ours:{ds}"]
        for k, (col, marker, name) in enumerate(
            (
                ("obj_prox_al", "o", "prox-al"),
                ("obj_cprox_al", "^", "cprox-al"),
                ("obj_centralized", "x", "centralized (f*)"),
            )
        ):
            vals = [r.get(col) for r in rs]
            if any(v is not None and np.isfinite(v[0]) for v in vals):
                _points(ax, x + (k - 1) * 0.2, vals, marker, name)
        _mark_uncertified(
            ax, x - 0.2, [r["obj_prox_al"][0] for r in rs], [_prox_uncertified(r) for r in rs], True
        )
        ax.set_ylabel(f"objective (ours), {_trials_text(trials)}")
        ax.set_title(f"{label}: our objective")
        ax.legend(fontsize="x-small")
        ax = axes[f"paper:{ds}"]
        _points(ax, x - 0.1, [p.get("obj_prox_al") for p in paper], "s", "paper Alg. 1", "0.45")
        _points(ax, x + 0.1, [p.get("obj_cprox_al") for p in paper], "D", "paper cProx-AL", "0.2")
        ax.set_ylabel("objective (paper), mean +- std")
        ax.set_title(f"{label}: the paper's objective")
        ax.legend(fontsize="x-small")
        for ax in (axes[f"ours:{ds}"], axes[f"paper:{ds}"]):
            _categorical_x(ax, [str(n) for n in ns], "clients n")
    ax = axes["rel"]
    all_ns = sorted({r["n"] for r in rows})
    pos = {n: i for i, n in enumerate(all_ns)}
    width = 0.7 / (2 * len(groups))
    zero = False
    for g, (ds, rs) in enumerate(groups.items()):
        label = DATASET_LABEL.get(ds, ds)
        x = np.array([pos[r["n"]] for r in rs], dtype=float)
        key = {"dataset": ds} if table == "table2" else {}
        shift = (2 * g - (2 * len(groups) - 1) / 2) * width
        color, z = _points(
            ax, x + shift, [r["rel_diff"] for r in rs], "o", f"{label}: ours", log=True
        )
        zero |= z
        _mark_uncertified(
            ax,
            x + shift,
            [r["rel_diff"][0] for r in rs],
            [_prox_uncertified(r) for r in rs],
            g == 0,
        )
        _, z = _points(
            ax,
            x + shift + width,
            [(_paper_row(table, n=r["n"], **key) or {}).get("rel_diff") for r in rs],
            "s",
            f"{label}: paper",
            color,
            log=True,
            markerfacecolor="white",
        )
        zero |= z
    ax.axhline(1e-2, color="k", linestyle=":", linewidth=1, label="pass threshold 1e-2")
    _categorical_x(ax, [str(n) for n in all_ns], "clients n")
    ax.set_ylabel("|f(prox-al) - f(cprox-al)| / |f(cprox-al)|")
    ax.set_title("relative difference prox-al vs cprox-al")
    handles, _ = ax.get_legend_handles_labels()
    ax.legend(handles=handles + ([zero_legend_handle()] if zero else []), fontsize="x-small")
    fig.suptitle(f"seed 000 Table {table[-1]} ({what}): ours vs the paper")
    fig.savefig(path, dpi=120)
    return fig
