"""Output files shared by the reproductions: CSV rows and Markdown tables."""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np


def write_csv(path: Path, rows: list[dict]) -> None:
    """One row per dict; the columns are the union of the keys in first-seen order.
    Floats are written with 10 significant digits, arrays as JSON lists."""
    if not rows:
        path.write_text("")
        return
    keys: list[str] = []
    for r in rows:
        keys += [k for k in r if k not in keys]
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=keys)
        writer.writeheader()
        for r in rows:
            writer.writerow({k: csv_value(r.get(k)) for k in keys})


def csv_value(v: Any) -> Any:
    if isinstance(v, float):
        return f"{v:.10g}"
    if isinstance(v, (list, tuple, np.ndarray)):
        return json.dumps([float(x) for x in np.ravel(v)])
    return v


def md_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A Markdown table.

    Examples
    --------
    >>> print(md_table(["n", "obj"], [[1, 0.5]]))
    | n | obj |
    |---|---|
    | 1 | 0.5 |
    """
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def check(name: str, passed: bool, detail: str) -> dict:
    """One reproduction check: its name, whether it passed, what was measured."""
    return {"name": name, "passed": bool(passed), "detail": detail}


#: The status of a solve stopped by its wall-clock ``time_limit``.
TIME_LIMIT_STATUS = "time_limit"
#: What a reproduction concludes: every check passed; a check failed on runs that ran to
#: their iteration caps or converged; no failed check can be trusted (a run behind it was
#: stopped by a time limit).
VERDICTS = ("pass", "fail", "inconclusive")


def mark_time_limited(checks: list[dict], statuses: Sequence[str]) -> list[dict]:
    """Mark the failed checks inconclusive when a run of the reproduction was stopped by
    its time limit (status ``"time_limit"`` among ``statuses``).

    Reproductions decide by iteration caps, never by wall time: a run cut short by the
    clock (a busy machine, a ``--time-limit``) says nothing about the paper's claim, so a
    check that fails with such a run behind it is reported ``inconclusive``, not as a
    failure. Checks that pass stay passed. Changes ``checks`` in place and returns it.

    Examples
    --------
    >>> checks = [check("gap <= 1e-3", False, "max 2e-2")]
    >>> mark_time_limited(checks, ["optimal", "time_limit"])[0]["inconclusive"]
    True
    >>> verdict(checks)
    'inconclusive'
    """
    cut = sum(1 for s in statuses if s == TIME_LIMIT_STATUS)
    for c in checks:
        if not c["passed"] and cut:
            c["inconclusive"] = True
            c["detail"] += (
                f" [inconclusive: {cut} run(s) stopped by their time limit, not by the "
                "method's iteration caps]"
            )
    return checks


def verdict(checks: Sequence[dict]) -> str:
    """``"fail"`` when a check failed on runs not cut by a time limit, else
    ``"inconclusive"`` when a check is inconclusive (:func:`mark_time_limited`), else
    ``"pass"``. The command line exits 0 unless the verdict is ``"fail"``."""
    if any(not c["passed"] and not c.get("inconclusive") for c in checks):
        return "fail"
    if any(c.get("inconclusive") for c in checks):
        return "inconclusive"
    return "pass"


def check_mark(c: dict) -> str:
    """``PASS``, ``FAIL`` or ``INCONCLUSIVE``: how a check is printed."""
    if c.get("passed"):
        return "PASS"
    return "INCONCLUSIVE" if c.get("inconclusive") else "FAIL"


def check_lines(checks: Sequence[dict]) -> list[str]:
    """The Markdown lines of a report's checks and its verdict."""
    lines = [f"- {check_mark(c)}: {c['name']}: {c['detail']}" for c in checks]
    v = verdict(checks)
    lines += ["", f"Verdict: {v}."]
    if v == "inconclusive":
        lines[-1] += (
            " A run was stopped by its time limit: this is no verdict on the paper's claim; "
            "rerun without --time-limit (or with a larger one) on a less busy machine."
        )
    return lines


def finish_report(
    out_dir: Path,
    name: str,
    md: list[str],
    rows: list[dict],
    checks: list[dict],
    t0: float,
    quick: bool,
    pngs: Sequence[Path | str] = (),
    statuses: Sequence[str] = (),
    **fields: Any,
) -> dict:
    """Append the checks and the wall time to the Markdown ``md``, write ``NAME.md`` and
    ``NAME.csv`` (``rows``) into ``out_dir``, and return the reproduction's summary (its
    files, rows, checks, verdict, overall pass, seconds; ``fields`` such as ``trials`` are
    added). ``statuses`` are the statuses of the solves behind the checks: a failed check
    is inconclusive when one of them was stopped by a time limit
    (:func:`mark_time_limited`)."""
    import time

    mark_time_limited(checks, statuses)
    md += ["", "## Checks", ""]
    md += check_lines(checks)
    seconds = time.perf_counter() - t0
    md += ["", f"Total wall time: {seconds:.1f} s{' (--quick)' if quick else ''}.", ""]
    md_path = out_dir / f"{name}.md"
    md_path.write_text("\n".join(md))
    csv_path = out_dir / f"{name}.csv"
    write_csv(csv_path, rows)
    return {
        "name": name,
        "out_dir": str(out_dir),
        "markdown": str(md_path),
        "files": [str(md_path), str(csv_path), *[str(p) for p in pngs]],
        "rows": rows,
        "checks": checks,
        "verdict": verdict(checks),
        "passed": all(c["passed"] for c in checks),
        "seconds": seconds,
        "quick": quick,
        **fields,
    }
