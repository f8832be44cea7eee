"""What a pooled splitting method needs on the Maros-Meszaros problems prox-al misses.

    python benchmarks/maros_meszaros_splitting.py                 # prox-al's misses at 1e-3
    python benchmarks/maros_meszaros_splitting.py --problems QBORE3D,QE226

The problems are those whose prox-al row in ``RESULTS_maros_meszaros.json`` (split
``server-objective``, eps 1e-3) is not right (:func:`maros_meszaros.is_right`). Each is
solved pooled by OSQP -- ADMM whose every iteration solves with an exact factorisation of
the pooled KKT matrix, which holds every party's rows (no federated party can form it from
``O(d)`` numbers a round) -- at ``eps_abs = eps_rel`` of 1e-3, 1e-5 and 1e-7, with up to
``--max-iter`` iterations, polishing on and the time limit, and each point is judged as in
``maros_meszaros.py`` against a tight pooled Clarabel solve. The table sets the iterations
OSQP needs before its point is right beside the rounds prox-al ran in its time limit: an
iteration of a splitting method is at least one round of a federated one. Results:
``benchmarks/RESULTS_maros_meszaros_splitting.md`` and ``.json`` (a run replaces the rows of
the problems it ran).
"""

from __future__ import annotations

import os

for _var in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OMP_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import maros_meszaros as mm  # noqa: E402

JSON = HERE / "RESULTS_maros_meszaros_splitting.json"
MD = HERE / "RESULTS_maros_meszaros_splitting.md"
#: the OSQP tolerances tried, loosest first
EPS_LIST = (1e-3, 1e-5, 1e-7)


def proxal_misses(tol: float = 1e-3) -> dict[str, dict]:
    """prox-al's rows (split ``server-objective``, eps 1e-3) whose point is not right."""
    rows = json.loads(mm.JSON.read_text())["rows"]
    return {
        r["problem"]: r
        for r in rows
        if r["method"] == "prox-al"
        and r.get("split") == "server-objective"
        and r["eps"] == 1e-3
        and not mm.is_right(r, tol)
    }


def run_problem(name: str, max_iter: int, time_limit: float, tol: float) -> dict:
    prob = mm.load(name)
    ref = mm.solve_clarabel(prob, 60.0, True)
    f_star = mm.objective(prob, ref["x"])
    tries = []
    for eps in EPS_LIST:
        out = mm.solve_osqp(prob, eps, time_limit, max_iter=max_iter, polishing=True)
        judged = mm.judge(prob, out.pop("x"), f_star)
        tries.append({"eps": eps, **out, **judged, "right": mm.is_right(judged, tol)})
    return {"problem": name, "n": prob["P"].shape[0], "tries": tries, "load1": os.getloadavg()[0]}


def write_report(rows: list[dict], misses: dict[str, dict], command: list[str], tol) -> None:
    lines = [
        "# Maros-Meszaros: what a pooled splitting method needs where prox-al misses",
        "",
        "Written by `benchmarks/maros_meszaros_splitting.py` (its docstring says what it "
        "runs). Commands:",
        "",
        *(f"    {c}" for c in command),
        "",
        f"Right = relative gap and relative violation both at most {tol:g}, judged as in "
        "`maros_meszaros.py`. prox-al: its row in RESULTS_maros_meszaros.json (split "
        "server-objective, eps 1e-3, its time limit). OSQP: pooled, polishing on; each cell "
        "is status, iterations, gap / violation of its point at that eps.",
        "",
    ]
    first_right = []
    for r in rows:
        good = [t for t in r["tries"] if t["right"]]
        first_right.append(good[0]["iterations"] if good else None)
    solved = [it for it in first_right if it is not None]
    lines += [
        f"- problems: {len(rows)} (prox-al not right at eps 1e-3)",
        f"- OSQP right at one of eps {', '.join(f'{e:g}' for e in EPS_LIST)}: "
        f"{len(solved)} of {len(rows)}",
    ]
    if solved:
        lines.append(
            f"- iterations before OSQP's first right point: median {int(np.median(solved)):,}, "
            f"least {min(solved):,}, most {max(solved):,}"
        )
    header = "| problem | n | prox-al (status, rounds, gap / viol) |"
    header += "".join(f" OSQP eps {e:g} |" for e in EPS_LIST)
    lines += ["", header, "|---|---:|---|" + "---|" * len(EPS_LIST)]
    for r in rows:
        p = misses.get(r["problem"], {})
        cells = [
            f"{p.get('status', '-')}, {p.get('rounds', '-')}, "
            f"{mm._fmt(p.get('gap'))} / {mm._fmt(p.get('violation'))}"
        ]
        for t in r["tries"]:
            mark = " **right**" if t["right"] else ""
            cells.append(
                f"{t['status']}, {t['iterations']:,}, "
                f"{mm._fmt(t['gap'])} / {mm._fmt(t['violation'])}{mark}"
            )
        lines.append(f"| {r['problem']} | {r['n']} | " + " | ".join(cells) + " |")
    MD.write_text("\n".join(lines) + "\n")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--problems", default="", help="comma-separated (default: prox-al's misses)")
    ap.add_argument("--max-iter", type=int, default=1_000_000)
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--judge-tol", type=float, default=1e-3)
    args = ap.parse_args(argv)
    misses = proxal_misses(args.judge_tol)
    names = [p for p in args.problems.split(",") if p] or sorted(misses)
    unknown = sorted(set(names) - set(mm.problem_names()))
    if unknown:
        ap.error(f"unknown problems {unknown}")
    old = json.loads(JSON.read_text()) if JSON.exists() else {"rows": [], "commands": []}
    rows = {r["problem"]: r for r in old["rows"]}
    command = "python benchmarks/maros_meszaros_splitting.py " + " ".join(argv or sys.argv[1:])
    commands = [*old["commands"], command.strip()]
    for name in names:
        row = run_problem(name, args.max_iter, args.time_limit, args.judge_tol)
        rows[name] = row
        print(name, [(t["eps"], t["status"], t["iterations"], t["right"]) for t in row["tries"]])
        ordered = [rows[k] for k in sorted(rows)]
        JSON.write_text(json.dumps({"rows": ordered, "commands": commands}, indent=1))
        write_report(ordered, misses, commands, args.judge_tol)


if __name__ == "__main__":
    main()
