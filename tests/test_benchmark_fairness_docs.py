"""docs/vfl.md's fairness table is the output of benchmarks/fairness_vfl.py (issue 24): the
block between its markers is the script's rendering of the committed results file, so a
hand edit of the page, or a results file from another run, fails here."""

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location(
        "fairness_vfl", ROOT / "benchmarks" / "fairness_vfl.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_docs_table_is_the_scripts_rendering_of_the_committed_results(tmp_path):
    script = _script()
    summary = json.loads((ROOT / "benchmarks" / "results_fairness_vfl.json").read_text())["summary"]
    page = (ROOT / "docs" / "vfl.md").read_text()
    start = page.index(script.DOCS_BEGIN) + len(script.DOCS_BEGIN)
    end = page.index(script.DOCS_END)
    assert page[start:end].strip() == script.docs_block(summary).strip()
    # and the writer replaces exactly that block
    copy = tmp_path / "vfl.md"
    copy.write_text(page[:start] + "stale\n" + page[end:])
    script.write_docs(summary, copy)
    assert copy.read_text() == page


def test_a_changed_number_is_seen():
    script = _script()
    summary = json.loads((ROOT / "benchmarks" / "results_fairness_vfl.json").read_text())["summary"]
    page = (ROOT / "docs" / "vfl.md").read_text()
    mean, std = summary[0]["test_accuracy"]
    summary[0]["test_accuracy"] = [mean + 1.0, std]  # one accuracy a point higher
    start = page.index(script.DOCS_BEGIN) + len(script.DOCS_BEGIN)
    with pytest.raises(AssertionError):
        assert (
            page[start : page.index(script.DOCS_END)].strip() == script.docs_block(summary).strip()
        )
