"""The index of the benchmarks: which script answers which question.

    python benchmarks/index.py          # writes benchmarks/README.md

Each script is filed under one question in ``QUESTIONS`` below (the one declaration);
the README lists them with the first paragraph of each script's docstring and the
results files it writes, so the index follows the scripts. tests/test_benchmark_index.py
checks that every script is filed and that the committed README is this rendering.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

HERE = Path(__file__).resolve().parent
README = HERE / "README.md"

#: question -> the scripts that answer it (in the order shown)
QUESTIONS: dict[str, tuple[str, ...]] = {
    "Does my model solve, and how fast?": (
        "models.py",
        "conic_survey.py",
        "maros_meszaros.py",
        "maros_meszaros_splitting.py",
        "nuclear_norm.py",
        "hinge_epigraph.py",
        "parameters_resolve.py",
        "time_limits.py",
        "infeasibility.py",
    ),
    "How does it scale (clients, dimension, backends, deployment)?": (
        "scaling.py",
        "stragglers.py",
        "backends.py",
        "flower_overhead.py",
        "party_refusals.py",
    ),
    "How do the methods and their options compare?": (
        "proxal_vs_paper.py",
        "proxal_default_candidates.py",
        "od_default.py",
        "outer_trace.py",
        "dald_rounds.py",
        "dald_dagd.py",
        "privacy.py",
        "dp_proxal.py",
        "fairness_vfl.py",
        "vfl_async.py",
    ),
    "The papers' experiments": (
        "run.py",
        "dald_table2_n1000.py",
        "ssca_constrained.py",
        "reproduction_pages.py",
    ),
    "Tools the scripts above share": (
        "cases.py",
        "report.py",
        "protocol_iterates.py",
        "index.py",
    ),
}


def scripts() -> list[str]:
    """Every benchmark script in this directory."""
    return sorted(p.name for p in HERE.glob("*.py"))


def summary(script: str) -> str:
    """The first paragraph of ``script``'s docstring, on one line."""
    doc = ast.get_docstring(ast.parse((HERE / script).read_text())) or ""
    return " ".join(doc.split("\n\n")[0].split())


def results_files(script: str) -> list[str]:
    """The committed results files (``RESULTS_*.md``, ``results_*.json``) that ``script``
    names in its source."""
    text = (HERE / script).read_text()
    names = set(re.findall(r"\b(?:RESULTS|results)_?[A-Za-z0-9_]*\.(?:md|json)\b", text))
    return sorted(n for n in names if (HERE / n).exists())


def render() -> str:
    lines = [
        "# Benchmarks",
        "",
        "Written by `python benchmarks/index.py` from the scripts' docstrings. Each script",
        "writes its results file(s) in this directory; timings are quoted as ratios against a",
        "reference measured in the same run (the machine may be shared).",
    ]
    for question, names in QUESTIONS.items():
        lines += ["", f"## {question}", ""]
        for name in names:
            files = ", ".join(f"[{f}]({f})" for f in results_files(name))
            lines.append(f"- `{name}`: {summary(name)}" + (f" Results: {files}." if files else ""))
    return "\n".join(lines) + "\n"


def main() -> None:
    README.write_text(render())
    print(f"wrote {README}")


if __name__ == "__main__":
    main()
