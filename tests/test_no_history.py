"""README, docs and the package's docstrings and comments state the rules, not the history.

Development history (issue numbers, work-branch names, before -> after numbers, dates,
commit hashes) belongs in commit messages and in the benchmarks' results files. This scans
README.md, every docs/**/*.md and the docstrings, string literals and comments of
fedmodel/**/*.py (doctest examples and their output excluded: a checksum there is data),
and names every line that reads like a lab notebook.
"""

from __future__ import annotations

import ast
import doctest
import inspect
import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

PENDING_REWRITE: tuple[str, ...] = ()

#: names of the project's work branches (their merges are in the git log)
BRANCHES = (
    "adult2",
    "bigd",
    "cert2",
    "cert3",
    "ctrlc",
    "flowerfast",
    "npqn",
    "qstall",
    "seeds004",
    "smooth2",
    "wt-conic",
    "wt-flower",
    "wt-robust",
    "wt-ssca",
    "wt-vfl",
    "secagg35",
    "kkt36",
    "mm36",
    "scale37",
    "scale37b",
    "infeas37",
    "repro38",
    "repro38b",
    "straggle40",
    "structure40",
)
NUMBER = r"\d[\d.,]*(?:e-?\d+)?"
PATTERNS = {
    "an issue number": re.compile(r"\bissues? ?#?\d+", re.I),
    "a branch": re.compile(
        r"\b(?:this|the|work|merged) branch\b|\bbranch(?:es)? (?!`)[a-z0-9]|\b(?:"
        + "|".join(map(re.escape, BRANCHES))
        + r")\b",
        re.I,
    ),
    "a before -> after number": re.compile(
        NUMBER + r"\s*(?:x|s|ms|%|rounds?)?\s*(?:->|→)\s*[~≈]?" + NUMBER
    ),
    "a commit hash": re.compile(
        r"(?<![.\d])\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b(?![-+]\d)"
    ),
    "a date": re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b"),
}


def _pending(path: Path) -> bool:
    rel = path.relative_to(ROOT).as_posix()
    return any(rel == p or (p.endswith("/") and rel.startswith(p)) for p in PENDING_REWRITE)


def markdown_lines(path: Path) -> list[tuple[int, str]]:
    return list(enumerate(path.read_text(encoding="utf-8").splitlines(), 1))


def python_lines(path: Path) -> list[tuple[int, str]]:
    """The comments and string literals of a module, doctest examples left out."""
    out = []
    source = path.read_text(encoding="utf-8")
    parser = doctest.DocTestParser()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            out.append((tok.start[0], tok.string))
        elif tok.type == tokenize.STRING:
            try:  # a docstring: its text without the examples (an f-string as written)
                text = inspect.cleandoc(ast.literal_eval(tok.string))
                prose = "".join(p for p in parser.parse(text) if isinstance(p, str))
            except (ValueError, SyntaxError, TypeError):
                prose = tok.string
            out.extend((tok.start[0] + i, line) for i, line in enumerate(prose.splitlines()))
    return out


def pages() -> list[Path]:
    found = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    found += sorted((ROOT / "fedmodel").rglob("*.py"))
    return [p for p in found if not _pending(p)]


def offences(path: Path) -> list[str]:
    lines = python_lines(path) if path.suffix == ".py" else markdown_lines(path)
    rel = path.relative_to(ROOT).as_posix()
    return [
        f"{rel}:{number}: {what} ({match.group(0)!r})"
        for number, line in lines
        for what, pattern in PATTERNS.items()
        for match in pattern.finditer(line)
    ]


def test_the_scan_finds_what_it_looks_for():
    line = "issue 23 on branch adult2 (main fe97918, 2026-11-27): 505 -> 31 rounds"
    assert not PATTERNS["a commit hash"].search("slack 8.881784197001252e-16")
    found = {what for what, p in PATTERNS.items() if p.search(line)}
    assert found == set(PATTERNS)
    assert not any(p.search("w -> prox(w); tau = 1e-3; rows 0-9") for p in PATTERNS.values())


@pytest.mark.parametrize("path", pages(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_development_history(path):
    found = offences(path)
    assert not found, "development history in user-facing text:\n" + "\n".join(found[:40])
