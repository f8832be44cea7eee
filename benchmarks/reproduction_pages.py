"""The reproduction pages' measured numbers, rendered from the committed results files:
each block of a page shows what ``fedmodel reproduce NAME`` (or a benchmark script) wrote
into its results file.

    python benchmarks/reproduction_pages.py                 # rewrite the pages' blocks
    python benchmarks/reproduction_pages.py --from DIR      # first copy DIR/NAME/NAME.md
                                                            # (fedmodel reproduce NAME --out
                                                            # DIR/NAME) into the results files,
                                                            # and the figures the pages show

``BLOCKS`` below is the one declaration: which page shows which reproduction, from which
results file, with which of its table's columns. A page's block sits between the markers
``<!-- reproduction NAME: begin -->`` and ``<!-- reproduction NAME: end -->``; everything
in it comes from the results file (the table's rows, the checks with what they measured,
the verdict and the wall time; for a benchmark script's file, its text around the table),
so the page's numbers are the run's.
tests/test_reproduction_pages.py checks that every committed page holds this rendering.

To bring a page up to date with the installed version::

    fedmodel reproduce table1 --quick --out /tmp/repro/table1      # each target of BLOCKS
    python benchmarks/reproduction_pages.py --from /tmp/repro
"""

from __future__ import annotations

import argparse
import shutil
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


@dataclass(frozen=True)
class Block:
    """One reproduction shown on one page.

    Attributes
    ----------
    page : str
        The docs page, relative to the repository root.
    name : str
        The reproduction's name (``fedmodel reproduce --list``).
    command : str
        The command that wrote the results file (shown on the page).
    results : str
        The committed results file (the command's ``NAME.md``), relative to the repository
        root.
    columns : tuple of str
        The columns of the results file's table shown on the page, by their header (each
        header once in the table); empty for all of them, in their order.
    target : str
        The reproduction that wrote the results file, when ``name`` is a variant of it
        (``--from DIR`` copies ``DIR/NAME/TARGET.md``); empty: ``name`` itself.
    report : bool
        True: the results file is a reproduction's report (a table, checks, a verdict and
        the wall time). False: a benchmark script's results file (a title, then text around
        one table), shown as written without its title; ``--from`` leaves it alone (the
        script writes it in place).
    figures : tuple of str
        The images of the same run that the page shows, relative to the repository root;
        ``--from DIR`` copies each from ``DIR/NAME/`` (the file of the same name).
    """

    page: str
    name: str
    command: str
    results: str
    columns: tuple[str, ...] = ()
    target: str = ""
    report: bool = True
    figures: tuple[str, ...] = ()

    @property
    def begin(self) -> str:
        return f"<!-- reproduction {self.name}: begin -->"

    @property
    def end(self) -> str:
        return f"<!-- reproduction {self.name}: end -->"


SEED000 = "docs/reproduction_seed000.md"
TABLE1_COLUMNS = ("n", "d", "m", "f* (centralized)", "rel. diff", "gap to f*", "L(w, y*) - f*",
                  "viol. prox-al", "rounds prox-al", "status")  # fmt: skip
TABLE2_COLUMNS = ("data set (rows x features)", "n", "f* (centralized)", "rel. diff", "gap to f*",
                  "class-1 loss prox-al mean / max", "outer / rounds prox-al", "status",
                  "paper obj Alg. 1 / cProx-AL", "paper rel. diff")  # fmt: skip
TABLE3_COLUMNS = ("data (train rows x features)", "n", "obj cprox-al", "rel. diff",
                  "disparity prox-al mean / max", "disparity cprox-al mean / max",
                  "outer / rounds prox-al", "status", "paper obj Alg. 1 / cProx-AL",
                  "paper rel. diff")  # fmt: skip
SSCA_COLUMNS = ("run", "rounds", "training cost", "test acc.", "||w||^2", "samples/client/round")
DALD_TABLE1_COLUMNS = ("data", "split", "iters", "MSE AIO", "MSE DALD", "node range", "paper AIO",
                       "paper DALD", "R2 AIO", "R2 DALD", "paper R2 AIO", "paper R2 DALD",
                       "max ||x_i - x_j||")  # fmt: skip
BLOCKS: tuple[Block, ...] = (
    Block(
        SEED000,
        "table1",
        "fedmodel reproduce table1 --quick",
        "benchmarks/RESULTS_seed000_table1_quick.md",
        TABLE1_COLUMNS + ("paper rel. diff",),
    ),
    Block(
        SEED000,
        "table1-exact",
        "fedmodel reproduce table1 --quick --set exact_subproblems=true",
        "benchmarks/RESULTS_seed000_table1_exact_quick.md",
        TABLE1_COLUMNS,
        target="table1",
    ),
    Block(
        SEED000,
        "table1-full",
        "fedmodel reproduce table1",
        "benchmarks/RESULTS_seed000_table1.md",
        TABLE1_COLUMNS + ("paper rel. diff",),
        target="table1",
    ),
    Block(
        SEED000,
        "table2",
        "fedmodel reproduce table2 --quick",
        "benchmarks/RESULTS_seed000_table2_quick.md",
        TABLE2_COLUMNS,
    ),
    Block(
        SEED000,
        "table2-breast-cancer",
        "fedmodel reproduce table2 --set 'datasets=[\"breast_cancer\"]'",
        "benchmarks/RESULTS_seed000_table2_breast_cancer.md",
        TABLE2_COLUMNS,
        target="table2",
    ),
    Block(
        SEED000,
        "table2-adult",
        "fedmodel reproduce table2 --set 'datasets=[\"adult\"]' --trials 2 --time-limit 240",
        "benchmarks/RESULTS_seed000_table2_adult.md",
        TABLE2_COLUMNS,
        target="table2",
    ),
    Block(
        SEED000,
        "table2-monks",
        "fedmodel reproduce table2 --set 'datasets=[\"monks\"]' --trials 2 --time-limit 240",
        "benchmarks/RESULTS_seed000_table2_monks.md",
        TABLE2_COLUMNS,
        target="table2",
    ),
    Block(
        SEED000,
        "table3",
        "fedmodel reproduce table3 --quick",
        "benchmarks/RESULTS_seed000_table3_quick.md",
        TABLE3_COLUMNS,
    ),
    Block(
        SEED000,
        "table3-full",
        "fedmodel reproduce table3 --trials 1 --time-limit 400",
        "benchmarks/RESULTS_seed000_table3.md",
        TABLE3_COLUMNS,
        target="table3",
    ),
    Block(
        SEED000,
        "table3-rho1",
        "fedmodel reproduce table3 --rho 1 --trials 1 --time-limit 300",
        "benchmarks/RESULTS_seed000_table3_rho1.md",
        TABLE3_COLUMNS,
        target="table3",
    ),
    Block(
        SEED000,
        "fig1",
        "fedmodel reproduce fig1 --quick",
        "benchmarks/RESULTS_seed000_fig1_quick.md",
    ),
    Block(
        SEED000,
        "fig2",
        "fedmodel reproduce fig2 --quick",
        "benchmarks/RESULTS_seed000_fig2_quick.md",
        ("n", "status", "outer", "rounds", "seconds"),
    ),
    Block(
        SEED000,
        "fig2-full",
        "fedmodel reproduce fig2",
        "benchmarks/RESULTS_seed000_fig2.md",
        ("n", "status", "outer", "rounds", "seconds"),
        target="fig2",
    ),
    Block(
        SEED000,
        "fig1-full",
        "fedmodel reproduce fig1",
        "benchmarks/RESULTS_seed000_fig1.md",
        target="fig1",
    ),
    Block(
        SEED000,
        "fig3",
        "fedmodel reproduce fig3 --quick",
        "benchmarks/RESULTS_seed000_fig3_quick.md",
    ),
    Block(
        SEED000,
        "fig3-full",
        "fedmodel reproduce fig3",
        "benchmarks/RESULTS_seed000_fig3.md",
        target="fig3",
    ),
    Block(
        "docs/ssca.md",
        "ssca-fig1",
        "fedmodel reproduce ssca-fig1 --out docs/ssca",
        "docs/ssca/ssca-fig1.md",
        SSCA_COLUMNS,
        target="ssca-fig1",
    ),
    Block(
        "docs/ssca.md",
        "ssca-fig2",
        "fedmodel reproduce ssca-fig2 --out docs/ssca",
        "docs/ssca/ssca-fig2.md",
        SSCA_COLUMNS,
        target="ssca-fig2",
    ),
    Block(
        "docs/ssca.md",
        "ssca-fig3",
        "fedmodel reproduce ssca-fig3 --out docs/ssca",
        "docs/ssca/ssca-fig3.md",
        target="ssca-fig3",
    ),
    Block(
        "docs/ssca.md",
        "ssca-fig4",
        "fedmodel reproduce ssca-fig4 --out docs/ssca",
        "docs/ssca/ssca-fig4.md",
        target="ssca-fig4",
    ),
    Block(
        "docs/dald.md",
        "dald-table1",
        "fedmodel reproduce dald-table1 --trials 3",
        "benchmarks/RESULTS_seed004_table1.md",
        DALD_TABLE1_COLUMNS,
    ),
    Block(
        "docs/dald.md",
        "dald-table2",
        "fedmodel reproduce dald-table2 --set 'n=[10,50]' --set 'lambdas=[0,0.001]'",
        "benchmarks/RESULTS_seed004_table2.md",
    ),
    Block(
        "docs/dald.md",
        "dald-fig5-quick",
        "fedmodel reproduce dald-fig5 --quick",
        "benchmarks/RESULTS_seed004_fig5_quick.md",
        target="dald-fig5",
    ),
    Block(
        "docs/dald.md",
        "dald-fig5",
        "fedmodel reproduce dald-fig5",
        "benchmarks/RESULTS_seed004_fig5.md",
    ),
    Block(
        "docs/dald.md",
        "dald-table2-n1000",
        "python benchmarks/dald_table2_n1000.py",
        "benchmarks/RESULTS_dald_table2_n1000.md",
        report=False,
    ),
    Block(
        "docs/dald.md",
        "dald-dagd",
        "python benchmarks/dald_dagd.py",
        "benchmarks/RESULTS_dald_dagd.md",
        report=False,
    ),
    Block(
        "docs/dald.md",
        "dald-rounds",
        "python benchmarks/dald_rounds.py",
        "benchmarks/RESULTS_dald.md",
        report=False,
    ),
    Block(
        "docs/vfl.md",
        "vfl-table1",
        "fedmodel reproduce vfl-table1",
        "benchmarks/RESULTS_seed002_table1.md",
    ),
    Block(
        "docs/vfl.md",
        "vfl-fig1",
        "fedmodel reproduce vfl-fig1",
        "benchmarks/RESULTS_seed002_fig1.md",
        figures=("docs/img/vfl-fig1.png",),
    ),
    Block(
        "docs/vfl.md",
        "vfl-fig2",
        "fedmodel reproduce vfl-fig2",
        "benchmarks/RESULTS_seed002_fig2.md",
        figures=("docs/img/vfl-fig2.png",),
    ),
)


@dataclass(frozen=True)
class Results:
    """What a results file holds: its first table, the paragraphs before and after it (up
    to the next heading), its findings (the text of each ``## `` section other than the
    checks, by title), its checks (one line each, as written), its verdict line and its
    wall-time line."""

    header: list[str]
    rows: list[list[str]]
    findings: dict[str, str]
    checks: list[str]
    verdict: str
    wall: str
    before: list[str]
    after: list[str]


def _cells(line: str) -> list[str]:
    """The cells of a table line as ``md_table`` writes it (``| a | b |``): cells are
    separated by `` | ``, so a cell may hold a bare ``|`` (``||w||^2``)."""
    line = line.strip()
    line = line[2:] if line.startswith("| ") else line.lstrip("|")
    line = line[:-2] if line.endswith(" |") else line.rstrip("|")
    return [c.strip() for c in line.split(" | ")]


def _escaped(cell: str) -> str:
    """A cell as a Markdown table shows it (a bare ``|`` escaped)."""
    return cell.replace("\\|", "|").replace("|", "\\|")


def _paragraphs(lines: list[str]) -> list[str]:
    """The paragraphs of ``lines`` (separated by blank lines), each on one line."""
    paragraphs, current = [], []
    for ln in [*lines, ""]:
        if ln.strip():
            current.append(ln.strip())
        elif current:
            paragraphs.append(" ".join(current))
            current = []
    return paragraphs


def read_results(text: str, report: bool = True) -> Results:
    """Parse a reproduction's Markdown report (``fedmodel/reproduce/output.py`` writes it:
    a table, then ``## Checks`` with one ``- PASS: ...`` line per check, ``Verdict: ...``
    and ``Total wall time: ...``), or with ``report=False`` a benchmark script's results
    file (a table, no checks).

    Examples
    --------
    >>> r = read_results("| n | obj |\\n|---|---|\\n| 1 | 0.5 |\\n\\n## Checks\\n\\n"
    ...                  "- PASS: gap: max 1e-4 <= 1e-3\\n\\nVerdict: pass.\\n\\n"
    ...                  "Total wall time: 3.0 s.\\n")
    >>> r.rows, r.checks, r.verdict
    ([['1', '0.5']], ['- PASS: gap: max 1e-4 <= 1e-3'], 'Verdict: pass.')
    """
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith("|")), None)
    if start is None or start + 1 >= len(lines) or not lines[start + 1].startswith("|--"):
        raise ValueError("the results file has no Markdown table")
    header = _cells(lines[start])
    rows = []
    for ln in lines[start + 2 :]:
        if not ln.startswith("|"):
            break
        rows.append(_cells(ln))
    first = next((i for i, ln in enumerate(lines) if not ln.startswith("# ")), 0)
    stop = start + 2 + len(rows)
    stop_after = next((i for i in range(stop, len(lines)) if lines[i].startswith("#")), len(lines))
    before = _paragraphs(lines[first:start])
    after = _paragraphs(lines[stop:stop_after])
    if not report:
        return Results(header, rows, {}, [], "", "", before, after)
    if "## Checks" not in lines:
        raise ValueError("the results file has no '## Checks' section")
    findings: dict[str, str] = {}
    for i, ln in enumerate(lines):
        if ln.startswith("## ") and ln != "## Checks":
            body = []
            for nxt in lines[i + 1 :]:
                if nxt.startswith("#"):
                    break
                body.append(nxt)
            findings[ln[3:].strip()] = " ".join(" ".join(body).split())
    after = lines[lines.index("## Checks") + 1 :]
    checks = [ln for ln in after if ln.startswith("- ")]
    verdict = next((ln for ln in after if ln.startswith("Verdict:")), "")
    wall = next((ln for ln in after if ln.startswith("Total wall time:")), "")
    if not checks:
        raise ValueError("the results file's '## Checks' section has no check")
    return Results(header, rows, findings, checks, verdict, wall, before, after)


def render(block: Block, text: str) -> str:
    """The page's block for ``block``, from its results file's ``text``."""
    res = read_results(text, block.report)
    columns = list(block.columns) or res.header
    missing = [c for c in columns if c not in res.header]
    if missing:
        raise KeyError(f"{block.results} has no column {missing}; its columns are {res.header}")
    ambiguous = [c for c in block.columns if res.header.count(c) > 1]
    if ambiguous:
        raise KeyError(f"{block.results} has several columns {ambiguous}: show all its columns")
    index = [res.header.index(c) for c in block.columns] or list(range(len(res.header)))
    if block.report:
        wall = (res.wall[0].lower() + res.wall[1:]).rstrip(".") if res.wall else "no wall time"
        lines = [f"`{block.command}` (results file `{block.results}`; {wall})", ""]
    else:
        lines = [f"`{block.command}` (results file `{block.results}`)", ""]
        lines += [line for p in res.before for line in (p, "")]
    lines += [
        "| " + " | ".join(_escaped(c) for c in columns) + " |",
        "|" + "|".join("---" for _ in columns) + "|",
    ]
    lines += ["| " + " | ".join(_escaped(row[i]) for i in index) + " |" for row in res.rows]
    if not block.report:
        return "\n".join(lines + [line for p in res.after for line in ("", p)])
    for title, body in res.findings.items():
        lines += ["", f"**{title}.** {body}"]
    lines += ["", *res.checks]
    if res.verdict:
        lines += ["", res.verdict]
    return "\n".join(lines)


def results_text(block: Block) -> str:
    return (ROOT / block.results).read_text()


def page_block(block: Block, page: str) -> str:
    """What ``page`` holds between ``block``'s markers (stripped)."""
    for marker in (block.begin, block.end):
        if page.count(marker) != 1:
            raise ValueError(f"{block.page} must hold {marker!r} exactly once")
    start = page.index(block.begin) + len(block.begin)
    return page[start : page.index(block.end)].strip()


def write_block(block: Block, text: str, path: Path | None = None) -> None:
    """Replace ``block``'s part of its page (or of ``path``) by the rendering of ``text``."""
    path = path or ROOT / block.page
    page = path.read_text()
    page_block(block, page)  # both markers, once each
    start = page.index(block.begin) + len(block.begin)
    end = page.index(block.end)
    path.write_text(page[:start] + "\n\n" + render(block, text) + "\n\n" + page[end:])


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--from",
        dest="source",
        metavar="DIR",
        help="copy DIR/NAME/TARGET.md into each block's results file first, and the block's "
        "figures from DIR/NAME/ (the runs present)",
    )
    args = ap.parse_args(argv)
    for block in BLOCKS:
        if args.source and block.report:
            fresh = Path(args.source) / block.name / f"{block.target or block.name}.md"
            if fresh.exists():
                for target, copy in [(block.results, fresh)] + [
                    (f, fresh.parent / Path(f).name) for f in block.figures
                ]:
                    shutil.copyfile(copy, ROOT / target)
                    print(f"{copy} -> {target}")
        write_block(block, results_text(block))
        print(f"{block.page}: {block.name} block written")


if __name__ == "__main__":
    main()
