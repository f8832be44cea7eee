"""prox-al's O(d)-message default inner solver against the opt-ins that send
d x d matrices.

    python benchmarks/od_default.py [--cases demo,np20,table1,suite] [--time-limit S]
    python benchmarks/od_default.py --cases np20 --save np20.json    # rows only
    python benchmarks/od_default.py --merge demo.json,np20.json     # the table from saved rows

For each case, at eps = 1e-3: rounds, floats a client sends per round (mean over the run,
and its largest single message), wall and the relative objective gap to the centralized
solve, for

- the default (``inner_solver="auto"`` = ``"quasi-newton"``: value, gradient and the
  Hessian-vector products along ``k = min(2, d // 4)`` server-chosen directions up, a
  server-side block-BFGS model of the clients' Hessian sum),
  (since issue 23's second pass also the clients' constraint rows, ``constraint_curvature``,
  and their local Newton directions, ``local_directions``),
- the same without the local direction, and without both (the previous default),
- the same with gradients only (``curvature_directions=0``, the default of issue 22),
- the Newton opt-in (``inner_solver="newton"``: each client's d x d Hessian),
- with ``--all``: Algorithm 2 with the Hessian metric opt-in (``inner_solver="admm",
  penalty_metric="hessian"``) and with the scalar penalty (``inner_solver="admm"``).

Adult NP also gets scipy SLSQP on the pooled data, in the same run. ``suite`` runs the
default and the Newton opt-in over ``proxal_default_candidates.py``'s 10 problems (geometric mean
of rounds). Writes ``benchmarks/RESULTS_od_default.md``. ``OPENBLAS_NUM_THREADS=1``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

for _var in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OMP_NUM_THREADS"):
    os.environ[_var] = "1"

import numpy as np  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from cases import load1, np_sites, rel, slsqp_np, timed  # noqa: E402

MD = HERE / "RESULTS_od_default.md"

#: Algorithm 2 with the scalar penalty is the slowest by far: its solves stop at this many
#: seconds (its status then says "time_limit")
SCALAR_ADMM_LIMIT = 120.0

#: the configurations compared: label -> prox-al options (``--all`` adds ``ADMM_CONFIGS``)
CONFIGS = {
    "default (quasi-newton + H v + constraint rows + local direction)": {},
    "the same without the local direction": {"local_directions": False},
    "previous default (H v only)": {"local_directions": False, "constraint_curvature": False},
    "quasi-newton, gradients only": {"curvature_directions": 0},
    "newton (opt-in)": {"inner_solver": "newton"},
}
ADMM_CONFIGS = {
    "admm + hessian metric (opt-in)": {"inner_solver": "admm", "penalty_metric": "hessian"},
    "admm scalar": {"inner_solver": "admm"},
}


def demo_model():
    """`fedmodel demo`'s problem: breast cancer Neyman-Pearson, 5 stratified sites."""
    from fedmodel.datasets import load_breast_cancer, split_by_class, split_stratified
    from fedmodel.models import neyman_pearson_model

    ds = load_breast_cancer()
    parts = split_stratified(ds.X, ds.y, 5, random_state=0)
    sites = [split_by_class(X, y) for X, y in parts]
    return neyman_pearson_model([(by[0], by[1]) for by in sites], r=0.2)


def traffic(res, n_clients: int) -> tuple[float, int]:
    """(floats a client sends per round, mean over the run; the largest single message a
    client sent) from the ledger's algorithm channel."""
    up = [r for r in res.ledger if r["channel"] == "algorithm" and r["sender"] != "server"]
    rounds = max(int(res.rounds.get("communication", 0)), 1)
    total = sum(int(r["floats"]) for r in up)
    return total / (n_clients * rounds), max((int(r["floats"]) for r in up), default=0)


def solve_row(model, case: str, label: str, opts: dict, fstar: float, time_limit: float) -> dict:
    n = model.compile().n_clients
    if opts == ADMM_CONFIGS["admm scalar"]:
        time_limit = min(time_limit, SCALAR_ADMM_LIMIT)
    res, wall, _, err = timed(
        model.solve, method="prox-al", eps=1e-3, time_limit=time_limit, history=False, **opts
    )
    row = {"case": case, "method": label, "wall": wall, "load": load1()}
    if res is None:
        return dict(row, status="error", error=err[:200])
    mean_up, max_up = traffic(res, n)
    row.update(
        status=res.status,
        rounds=int(res.rounds["communication"]),
        floats_up=mean_up,
        max_message=max_up,
        gap=rel(float(res.objective), fstar),
        inner=res.extra.get("inner_solver"),
    )
    return row


def run_case(case: str, model, time_limit: float, configs=None) -> list[dict]:
    configs = configs or CONFIGS
    model.compile()
    d = model.compile().layout.n_shared
    ref, wall, _, err = timed(model.solve, method="centralized", eps=1e-6)
    fstar = float(ref.objective) if ref is not None else float("nan")
    rows = [{"case": case, "method": "centralized", "wall": wall, "status": ref.status, "d": d}]
    for label, opts in configs.items():
        row = solve_row(model, case, label, opts, fstar, time_limit)
        row["d"] = d
        print(row, flush=True)
        rows.append(row)
    return rows


def case_np20(time_limit: float) -> list[dict]:
    from fedmodel.models import neyman_pearson_model

    sites = np_sites(20)
    model = neyman_pearson_model(sites, r=0.2)
    rows = run_case("Adult NP, 20 sites", model, time_limit)
    out, wall, _, err = timed(slsqp_np, sites, 0.2)
    row = {"case": "Adult NP, 20 sites", "method": "scipy SLSQP (pooled)", "wall": wall}
    row["status"] = "error: " + err[:80] if out is None else "not certified"
    rows.append(row)
    return rows


def case_table1(time_limit: float) -> list[dict]:
    from fedmodel.models import lcqp_instance, lcqp_model

    model = lcqp_model(lcqp_instance(n=10, d=500, m=5, random_state=0))
    return run_case("Table 1 largest (n=10, d=500)", model, time_limit)


def case_suite(time_limit: float) -> list[dict]:
    from proxal_default_candidates import problems

    configs = {k: CONFIGS[k] for k in ("default (quasi-newton + H v)", "newton (opt-in)")}
    rows = []
    for name, make in problems().items():
        rows += run_case(f"suite: {name}", make(), time_limit, configs)
    return rows


def fmt(v, spec="{:.3g}"):
    if v is None:
        return ""
    if isinstance(v, float):
        return spec.format(v)
    return str(v)


def write_md(rows: list[dict], argv: list[str]) -> None:
    lines = [
        "# prox-al with O(d) messages by default (issues 22, 23)",
        "",
        f"`python benchmarks/od_default.py {' '.join(argv)}`; {time.strftime('%Y-%m-%d %H:%M')}"
        f" UTC, {platform.machine()}, load {load1():.1f} (shared machine: walls are noisy; "
        "rounds are not). eps = 1e-3. `floats up` = floats a client sends per round (mean "
        "over the run, algorithm channel); `largest` = its largest single message; gap = "
        "relative objective difference to `centralized` (eps = 1e-6).",
        "",
        "| case | d | method | status | rounds | floats up / client / round | largest "
        "message | wall (s) | wall ratio | gap |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    # the wall ratio: to scipy SLSQP where the case has it (same run), else to centralized
    refs = {}
    for r in rows:
        if r["method"] == "scipy SLSQP (pooled)" or (
            r["method"] == "centralized" and r["case"] not in refs
        ):
            refs[r["case"]] = (r["method"].split()[0 if "SLSQP" not in r["method"] else 1], r)
    for r in rows:
        ref = refs.get(r["case"])
        ratio = ""
        if ref is not None and ref[1] is not r and "rounds" in r and ref[1]["wall"] > 0:
            ratio = f"{r['wall'] / ref[1]['wall']:.2f}x {ref[0]}"
        lines.append(
            f"| {r['case']} | {r.get('d', '')} | {r['method']} | {r['status']} | "
            f"{fmt(r.get('rounds'))} | {fmt(r.get('floats_up'), '{:.0f}')} | "
            f"{fmt(r.get('max_message'))} | {r['wall']:.2f} | {ratio} | "
            f"{fmt(r.get('gap'), '{:.1e}')} |"
        )
    suite = [r for r in rows if r["case"].startswith("suite") and "rounds" in r]
    if suite:
        lines += ["", "Suite (proxal_default_candidates.py's 10 problems):", ""]
        lines += ["| method | geometric mean of rounds | sum | wall (s) | all optimal |"]
        lines += ["|---|---|---|---|---|"]
        for label in sorted({r["method"] for r in suite}):
            mine = [r for r in suite if r["method"] == label]
            geo = float(np.exp(np.mean(np.log([max(r["rounds"], 1) for r in mine]))))
            ok = all(r["status"] == "optimal" for r in mine)
            lines.append(
                f"| {label} | {geo:.0f} | {sum(r['rounds'] for r in mine)} | "
                f"{sum(r['wall'] for r in mine):.1f} | {'yes' if ok else 'no'} |"
            )
    MD.write_text("\n".join(lines) + "\n")


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="demo,np20,table1,suite")
    ap.add_argument("--time-limit", type=float, default=300.0)
    ap.add_argument("--all", action="store_true", help="also Algorithm 2 (admm) configurations")
    ap.add_argument("--save", help="write the rows to this JSON file (no table)")
    ap.add_argument("--merge", help="build the table from these saved JSON files")
    args = ap.parse_args(argv)
    rows: list[dict] = []
    if args.all:
        CONFIGS.update(ADMM_CONFIGS)
    if args.merge:
        for path in args.merge.split(","):
            rows += json.loads(Path(path).read_text())
        write_md(rows, argv)
        print(MD.read_text())
        return
    for case in args.cases.split(","):
        if case == "demo":
            rows += run_case("demo: breast cancer NP, 5 sites", demo_model(), args.time_limit)
        elif case == "np20":
            rows += case_np20(args.time_limit)
        elif case == "table1":
            rows += case_table1(args.time_limit)
        elif case == "suite":
            rows += case_suite(args.time_limit)
        else:
            raise SystemExit(f"unknown case {case!r}")
    if args.save:
        Path(args.save).write_text(json.dumps(rows, default=float))
        return
    write_md(rows, argv)
    print(MD.read_text())


if __name__ == "__main__":
    main()
