"""Every python block in README.md, docs/*.md and the user guide (docs/guide/) runs as written.

A page's blocks run in order in one namespace (later blocks may use what earlier ones
defined), in a temporary working directory. A block whose first line is ``# fragment`` is
not run (a deliberately partial snippet); ``# model.py`` blocks define a deployment's model
file and are run as such.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
    *sorted((ROOT / "docs" / "guide").glob("*.md")),
]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def blocks(page: Path) -> list[str]:
    return [b for b in BLOCK.findall(page.read_text(encoding="utf-8"))]


def test_every_page_is_collected():
    assert any(blocks(p) for p in PAGES)


@pytest.mark.parametrize(
    "page", [p for p in PAGES if blocks(p)], ids=lambda p: p.relative_to(ROOT).as_posix()
)
def test_python_blocks_run(page, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    namespace: dict = {"__name__": f"docs_{page.stem}"}
    ran = 0
    for i, code in enumerate(blocks(page)):
        if code.lstrip().startswith("# fragment"):
            continue
        try:
            exec(compile(code, f"{page.name}[block {i + 1}]", "exec"), namespace)
        except Exception as exc:  # noqa: BLE001 - name the block
            raise AssertionError(
                f"{page.name} python block {i + 1} fails: {type(exc).__name__}: {exc}"
            ) from exc
        ran += 1
    assert ran or all(b.lstrip().startswith("# fragment") for b in blocks(page))
    assert os.getcwd() == str(tmp_path)
