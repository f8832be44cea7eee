"""docs/privacy.md's table of prox-al and DP-FedAvg under dp is the output of
benchmarks/dp_proxal.py: the block between its markers is the script's rendering of the
committed results file, so a hand edit of the page, or a results file from another run,
fails here."""

import json

from benchmark_scripts import ROOT, load_script


def test_docs_table_is_the_scripts_rendering_of_the_committed_results():
    script = load_script("dp_proxal")
    rows = json.loads((ROOT / "benchmarks" / "results_dp_proxal.json").read_text())
    page = (ROOT / "docs" / "privacy.md").read_text()
    start = page.index(script.DOCS_BEGIN) + len(script.DOCS_BEGIN)
    end = page.index(script.DOCS_END)
    assert page[start:end].strip() == script.tables(rows).strip()
    # every finite-epsilon run spent at most its target, and prox-al's violation is reported
    for r in rows:
        if r["method"] != "centralized" and r["epsilon"] != float("inf"):
            assert r["epsilon_spent"] <= r["epsilon"]
        assert r["violation"] >= 0
