"""The --quick variants of the seed 003 reproductions (ssca-fig1 .. ssca-fig4)."""

from __future__ import annotations

import csv

import pytest

from fedmodel import cli
from fedmodel.reproduce import available, run


def test_fig1_quick_through_the_cli(tmp_path, capsys):
    assert {"ssca-fig1", "ssca-fig2", "ssca-fig3", "ssca-fig4"} <= set(available())
    out = tmp_path / "f1"
    assert cli.main(["reproduce", "ssca-fig1", "--quick", "--quiet", "--out", str(out)]) == 0
    rows = list(csv.DictReader((out / "ssca-fig1.csv").open()))
    assert {r["method"] for r in rows} == {"ssca", "sgd", "sgd-m"}
    assert (out / "ssca-fig1.png").stat().st_size > 10_000
    text = (out / "ssca-fig1.md").read_text()
    assert "FAIL" not in text and text.count("PASS") == 4
    assert "ssca-fig1" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.parametrize("name", ["ssca-fig2", "ssca-fig3", "ssca-fig4"])
def test_other_figures_quick(tmp_path, name):
    summary = run(name, out_dir=tmp_path, trials=1, quick=True, progress=False)
    assert summary["rows"] and (tmp_path / f"{name}.png").exists()
