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


def finish_report(
    out_dir: Path,
    name: str,
    md: list[str],
    rows: list[dict],
    checks: list[dict],
    t0: float,
    quick: bool,
    pngs: Sequence[Path | str] = (),
    **fields: Any,
) -> dict:
    """Append the checks and the wall time to the Markdown ``md``, write ``NAME.md`` and
    ``NAME.csv`` (``rows``) into ``out_dir``, and return the reproduction's summary (its
    files, rows, checks, overall pass, seconds; ``fields`` such as ``trials`` are added)."""
    import time

    md += ["", "## Checks", ""]
    md += [f"- {'PASS' if c['passed'] else 'FAIL'}: {c['name']}: {c['detail']}" for c in checks]
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
        "passed": all(c["passed"] for c in checks),
        "seconds": seconds,
        "quick": quick,
        **fields,
    }
