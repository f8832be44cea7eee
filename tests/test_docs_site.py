"""The documentation site (mkdocs.yml) builds with warnings as errors.

``mkdocs build --strict`` fails on a broken link or image, a page missing from the nav, a
README section the getting-started page includes and no longer finds, and every docstring
griffe cannot parse in the API reference. Skipped when mkdocs (the ``docs`` extra) is not
installed; CI installs it (``.ci/run``).
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NEEDED = ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python")


def _missing() -> list[str]:
    missing = []
    for name in NEEDED:
        try:
            found = importlib.util.find_spec(name) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            missing.append(name)
    return missing


@pytest.mark.skipif(
    bool(_missing()),
    reason=f"the docs extra is not installed ({', '.join(_missing())} missing): "
    'pip install -e ".[docs]"',
)
def test_site_builds_strict(tmp_path):
    site = tmp_path / "site"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    warnings = [line for line in proc.stderr.splitlines() if "WARNING" in line]
    assert proc.returncode == 0, "mkdocs build --strict failed:\n" + "\n".join(
        warnings or proc.stderr.splitlines()[-20:]
    )
    # the getting-started page includes the README's sections (pymdownx.snippets)
    start = (site / "getting-started" / "index.html").read_text(encoding="utf-8")
    assert "Set-up: two commands" in start and "fm.Model" in start
    setup = start[start.index('id="set-up-two-commands"') :]
    setup = setup[: setup.index("<h2")]
    assert setup.count("<ol>") == 1 and setup.count("<li>") == 2, "set-up steps not 1. and 2."
    # the API reference is generated from the docstrings: a field of each options class
    options = (site / "api" / "options" / "index.html").read_text(encoding="utf-8")
    for name in ("ProxALOptions", "DALDOptions", "FairVFLOptions", "SSCAOptions", "max_outer"):
        assert name in options, name
    model = (site / "api" / "model" / "index.html").read_text(encoding="utf-8")
    assert "subject_to" in model and "regularize" in model
    # no builtin type's docstring on an attribute, no raw Sphinx role, every public method
    for page in (site / "api").glob("*/index.html"):
        text = page.read_text(encoding="utf-8")
        for builtin in ("Create a new string object", "Convert a string or number", "int([x])"):
            assert builtin not in text, (page.parent.name, builtin)
        raw = re.findall(r":(?:class|meth|func|attr|data|mod|exc):`", text)
        assert not raw, (page.parent.name, raw[:3])
    result = (site / "api" / "result" / "index.html").read_text(encoding="utf-8")
    import fedmodel

    public = [n for n in vars(fedmodel.Result) if not n.startswith("_")]
    public = [n for n in public if callable(getattr(fedmodel.Result, n)) or n == "is_optimal"]
    for name in public:
        assert f'id="fedmodel.Result.{name}"' in result, name
    from fedmodel.result import STATUSES

    for status in STATUSES:
        assert f"&quot;{status}&quot;" in result or f'"{status}"' in result, status
    # every tutorial's images are in the site
    for png in ("ssca/ssca-fig1.png", "ssca/ssca-fig4.png"):
        assert (site / png).is_file(), png


def test_every_page_is_in_the_nav():
    """Without mkdocs too: each page of docs/, docs/guide/ and docs/api/ is in mkdocs.yml."""
    config = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    pages = [*(ROOT / "docs").glob("*.md")]
    pages += [*(ROOT / "docs" / "guide").glob("*.md"), *(ROOT / "docs" / "api").glob("*.md")]
    missing = [p.relative_to(ROOT / "docs").as_posix() for p in pages]
    missing = [name for name in missing if f" {name}" not in config]
    assert not missing, f"pages not in mkdocs.yml's nav: {missing}"


def test_readme_sections_the_site_includes_exist():
    """Each ``--8<-- "README.md:NAME"`` of a page has its start and end marker in the README."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for page in (ROOT / "docs").glob("*.md"):
        for name in re.findall(r'^--8<-- "README\.md:([\w-]+)"$', page.read_text(), re.M):
            for edge in ("start", "end"):
                assert f"<!-- --8<-- [{edge}:{name}] -->" in readme, (page.name, edge, name)
