"""How prox-al's adaptive defaults were chosen: rounds of candidate settings
over the seed 000 problems and two small test-suite-style models, side by side.

    python benchmarks/proxal_default_candidates.py                       # the candidates below
    python benchmarks/proxal_default_candidates.py "" "prox_beta=1e6"    # your own (one per arg)

Each argument is one configuration (``key=value`` pairs separated by spaces; ``""`` = the
defaults). Every problem's reference is ``method="centralized"``; a configuration is
acceptable only if every solve is ``"optimal"`` with a relative objective gap <= 1e-3.
Prints one line per solve and a summary (geometric mean and sum of rounds, total wall).
Rounds do not depend on the machine's load; wall times do (``OPENBLAS_NUM_THREADS=1``).
"""

from __future__ import annotations

import os
import sys
import time

for _var in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OMP_NUM_THREADS"):
    os.environ[_var] = "1"

import numpy as np  # noqa: E402

#: the candidates compared when run without arguments
CANDIDATES = (
    "",
    "penalty_metric=scalar",
    "prox_beta=1e6",
    "kkt_factor=0.001",
    "prox_beta=1e6 kkt_factor=0.001",
    "outer_anderson=0",
    "tau_rate=0.01",
)


def _value(text: str):
    if text in ("True", "False"):
        return text == "True"
    try:
        return float(text)
    except ValueError:
        return text


def parse(config: str) -> dict:
    return {k: _value(v) for k, v in (item.split("=") for item in config.split())}


def synthetic_np(n: int, d: int = 4, seed: int = 2):
    """Overlapping Gaussian classes with an intercept (as tests/problems.py's np_model)."""
    from fedmodel.models import neyman_pearson_model

    rng = np.random.default_rng(seed)
    shift = np.r_[np.full(d, 0.6), 0.0]
    sites = []
    for _ in range(n):
        X0 = np.c_[rng.normal(size=(60, d)), np.ones(60)]
        X1 = np.c_[rng.normal(size=(30, d)), np.ones(30)] + shift
        sites.append((X0, X1))
    return neyman_pearson_model(sites, r=0.45)


def problems() -> dict:
    from fedmodel.models import lcqp_instance, lcqp_model
    from fedmodel.reproduce.seed000 import np_data, np_model, np_sites

    out = {"table1 (seed 0)": lambda: lcqp_model(lcqp_instance(10, 500, 5, random_state=0))}
    for name in ("breast_cancer", "monks", "adult"):
        for n in (5, 20):
            out[f"NP {name}, n = {n}"] = lambda name=name, n=n: np_model(
                np_sites(*np_data(name), n, 0), 0.2
            )
    out["synthetic NP, n = 3"] = lambda: synthetic_np(3)
    out["small LCQP, n = 3"] = lambda: lcqp_model(lcqp_instance(3, 10, 2, random_state=0))
    # (objective ~ 2.5e3: multipliers far larger than beta times the violation)
    out["LCQP d = 12, m = 3, n = 3"] = lambda: lcqp_model(lcqp_instance(3, 12, 3, random_state=1))
    return out


def main(argv: list[str]) -> None:
    configs = [parse(c) for c in (argv or CANDIDATES)]
    rows: dict[int, list] = {i: [] for i in range(len(configs))}
    for pname, make in problems().items():
        model = make()
        model.compile()
        ref = model.solve(method="centralized")
        for i, kw in enumerate(configs):
            t0 = time.perf_counter()
            res = model.solve(method="prox-al", history=False, time_limit=120, **kw)
            wall = time.perf_counter() - t0
            gap = abs(res.objective - ref.objective) / max(1.0, abs(ref.objective))
            rounds = int(res.rounds["communication"])
            rows[i].append((res.status, rounds, wall, gap))
            print(
                f"{pname:24s} {kw!s:45s} {res.status:10s} {rounds:6d} rounds "
                f"{wall:7.2f} s  gap {gap:.1e}  viol {res.max_violation:.1e}",
                flush=True,
            )
    print(
        "\n| configuration | geometric mean of rounds | sum | wall (s) | all optimal, gap <= 1e-3 |"
    )
    print("|---|---|---|---|---|")
    for i, kw in enumerate(configs):
        r = [row[1] for row in rows[i]]
        ok = all(row[0] == "optimal" and row[3] <= 1e-3 for row in rows[i])
        geo = float(np.exp(np.mean(np.log(np.maximum(r, 1)))))
        wall = sum(row[2] for row in rows[i])
        print(
            f"| {kw or 'defaults'} | {geo:.0f} | {sum(r)} | {wall:.1f} | {'yes' if ok else 'no'} |"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
