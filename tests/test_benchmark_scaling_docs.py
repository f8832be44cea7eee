"""docs/performance.md's scaling table is the output of benchmarks/scaling.py: the block
between its markers is the script's rendering of the committed results file (the rows
labelled ``main``), so a hand edit of the page, or a results file from another run, fails
here."""

import copy
import json

import numpy as np
import pytest
from benchmark_scripts import ROOT, load_script


def _block(script, page: str) -> str:
    start = page.index(script.DOCS_BEGIN) + len(script.DOCS_BEGIN)
    return page[start : page.index(script.DOCS_END)]


def test_docs_table_is_the_scripts_rendering_of_the_committed_results(tmp_path):
    script = load_script("scaling")
    rows = json.loads((ROOT / "benchmarks" / "results_scaling.json").read_text())
    page = (ROOT / "docs" / "performance.md").read_text()
    assert _block(script, page).strip() == script.docs_block(rows).strip()
    # the writer replaces exactly that block
    start = page.index(script.DOCS_BEGIN) + len(script.DOCS_BEGIN)
    stale = tmp_path / "performance.md"
    stale.write_text(page[:start] + "stale\n" + page[page.index(script.DOCS_END) :])
    script.write_docs(rows, stale)
    assert stale.read_text() == page


def test_only_the_main_rows_are_shown_and_a_changed_number_is_seen():
    script = load_script("scaling")
    rows = json.loads((ROOT / "benchmarks" / "results_scaling.json").read_text())
    shown = script.docs_block(rows)
    main = {r["case"] for r in rows if r.get("label") == "main" and r["method"] == "prox-al"}
    assert main and all(f"| {case} |" in shown for case in main)
    assert shown.count("\n") == len(main) + 1  # a header, its rule and a row per case
    changed = copy.deepcopy(rows)
    row = next(r for r in changed if r.get("label") == "main" and r["method"] == "prox-al")
    row["rounds"] += 1
    with pytest.raises(AssertionError):
        assert script.docs_block(changed) == shown


def test_the_participation_table_is_the_scripts_rendering():
    script = load_script("scaling")
    rows = json.loads((ROOT / "benchmarks" / "results_scaling.json").read_text())
    page = (ROOT / "docs" / "performance.md").read_text()
    start = page.index(script.PARTICIPATION_BEGIN) + len(script.PARTICIPATION_BEGIN)
    block = page[start : page.index(script.PARTICIPATION_END)]
    assert block.strip() == script.participation_block(rows).strip()
    sampled = [r for r in rows if r["method"] == "prox-al" and r.get("participation")]
    assert sampled and block.count("\n| ") == len(sampled) + 1
    changed = copy.deepcopy(rows)
    full = next(r for r in changed if r.get("label") == script.FULL_PARTICIPATION)
    full["rounds"] += 1
    assert script.participation_block(changed) != script.participation_block(rows)


def test_the_bytes_a_round_moves_are_every_clients_messages_once():
    script = load_script("scaling")
    comm = {
        "per_party": {
            "server": {
                "messages_sent": 6,
                "floats_sent": 60,
                "messages_received": 6,
                "floats_received": 30,
            },
            "c0": {
                "messages_sent": 3,
                "floats_sent": 15,
                "messages_received": 3,
                "floats_received": 30,
            },
            "c1": {
                "messages_sent": 3,
                "floats_sent": 15,
                "messages_received": 3,
                "floats_received": 30,
            },
        },
        "diagnostic": {
            "per_party": {
                "c0": {
                    "messages_sent": 1,
                    "floats_sent": 7,
                    "messages_received": 0,
                    "floats_received": 0,
                }
            }
        },
    }
    sizes = script.client_message_sizes(comm)
    assert sorted(sizes) == sorted([5, 5, 5, 10, 10, 10] * 2 + [7])
    messages = [np.arange(float(k)) for k in sizes]
    assert script.round_trip(messages) == 8 * sum(sizes)  # (every message, each once)
    assert np.isnan(script.moved_seconds(comm, rounds=0))
    assert np.isnan(script.moved_seconds({"per_party": {}}, rounds=3))


def test_a_repeated_row_is_its_median_run_and_shows_the_spread():
    script = load_script("scaling")
    runs = [
        {"case": "c", "method": "prox-al", "ratio_with_bytes": r, "cpu": c}
        for r, c in ((4.6, 0.23), (4.1, 0.2), (4.3, 0.21), (3.9, 0.19))
    ]
    row = script.median_run(runs)
    assert row["cpu"] == 0.2 and row["ratio_with_bytes_runs"] == [3.9, 4.1, 4.3, 4.6]
    assert script._spread(row) == " (3.9-4.6, 4 runs)"
    assert script._spread(runs[0]) == ""
    # a run that failed is the row: a repeat never hides it
    failed = {"case": "c", "method": "prox-al", "status": "killed after 1020 s"}
    assert script.median_run([runs[0], failed, runs[1]]) is failed
    row.update(label="main", n=1000, d=20, status="optimal", rounds=12)
    assert "4.1x (3.9-4.6, 4 runs)" in script.docs_block([row])
