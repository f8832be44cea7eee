"""docs/vfl.md's fairness table is the output of benchmarks/fairness_vfl.py: the block
between its markers is the script's rendering of the committed results file, so a hand edit
of the page, or a results file from another run, fails here; and the frontier comparison
behind its verdicts says what hand-made frontiers show."""

import json

import numpy as np
import pytest
from benchmark_scripts import ROOT, load_script


def test_docs_table_is_the_scripts_rendering_of_the_committed_results(tmp_path):
    script = load_script("fairness_vfl")
    results = json.loads((ROOT / "benchmarks" / "results_fairness_vfl.json").read_text())
    page = (ROOT / "docs" / "vfl.md").read_text()
    start = page.index(script.DOCS_BEGIN) + len(script.DOCS_BEGIN)
    end = page.index(script.DOCS_END)
    assert page[start:end].strip() == script.docs_block(results).strip()
    # and the writer replaces exactly that block
    copy = tmp_path / "vfl.md"
    copy.write_text(page[:start] + "stale\n" + page[end:])
    script.write_docs(results, copy)
    assert copy.read_text() == page


def test_a_changed_number_is_seen():
    script = load_script("fairness_vfl")
    results = json.loads((ROOT / "benchmarks" / "results_fairness_vfl.json").read_text())
    page = (ROOT / "docs" / "vfl.md").read_text()
    mean, std = results["summary"][0]["test_accuracy"]
    results["summary"][0]["test_accuracy"] = [mean + 1.0, std]  # one accuracy a point higher
    start = page.index(script.DOCS_BEGIN) + len(script.DOCS_BEGIN)
    with pytest.raises(AssertionError):
        assert (
            page[start : page.index(script.DOCS_END)].strip() == script.docs_block(results).strip()
        )


def _frontier_rows(shift: float, noise: list[float]) -> list[dict]:
    """Five splits; on each, ExponentiatedGradient's frontier is accuracy = 80 + gap / 2 at
    gaps 1, 3, 5, 7 and fair-vfl's the same line moved up by ``shift`` (plus the split's
    ``noise``) at gaps 2, 4, 6."""
    rows = []
    for seed, e in enumerate(noise):
        for gap in (1.0, 3.0, 5.0, 7.0):
            rows.append(
                dict(
                    dataset="d",
                    seed=seed,
                    method="fairlearn ExponentiatedGradient",
                    test_accuracy=80 + gap / 2,
                    train_tpr_gap=gap,
                    test_tpr_gap=gap,
                )
            )
        for gap in (2.0, 4.0, 6.0):
            rows.append(dict(dataset="d", seed=seed, method="fair-vfl, TPR surrogate",
                             test_accuracy=80 + gap / 2 + shift + e, train_tpr_gap=gap,
                             test_tpr_gap=gap))  # fmt: skip
    return rows


@pytest.mark.parametrize(
    "shift, noise, verdict",
    [
        (2.0, [0.1, -0.1, 0.2, 0.0, -0.2], "above"),
        (-2.0, [0.1, -0.1, 0.2, 0.0, -0.2], "below"),
        (0.0, [1.0, -1.0, 2.0, -2.0, 0.0], "level"),
    ],
)
def test_the_frontier_comparison_sees_which_frontier_is_higher(shift, noise, verdict):
    script = load_script("fairness_vfl")
    rows = _frontier_rows(shift, noise)
    out = script.frontier_advantage(rows, "d", "test_tpr_gap")
    assert out["verdict"] == verdict
    assert len(out["per_split"]) == 5
    # fair-vfl's 3 points each meet an EG point at a smaller gap (the best: 0.5 lower, from
    # the line's slope); EG's 4 points but the first meet a fair-vfl point at a smaller gap
    assert out["compared"] == 5 * (3 + 3)
    line = 0.5  # at the nearest smaller gap, one step of 1 on a slope of 1/2
    expected = [(shift + e + line) - (-(shift + e) + line) for e in noise]
    assert np.allclose(out["per_split"], expected)
