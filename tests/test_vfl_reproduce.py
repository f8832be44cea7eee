"""The --quick variants of the seed 002 reproductions (vfl-table1, vfl-fig1, vfl-fig2)."""

from __future__ import annotations

import csv

import pytest

from fedmodel import cli
from fedmodel.reproduce import available, run
from fedmodel.reproduce.vfl import paper_numbers


def test_reproductions_are_registered_with_the_papers_numbers():
    assert {"vfl-table1", "vfl-fig1", "vfl-fig2"} <= set(available())
    paper = paper_numbers()["table1"]
    assert paper["adult"]["Fair VFL"][:3] == [82.5, 0.0, 95.1]
    assert paper["communities"]["EO"][4] == 68.5
    assert paper_numbers()["fig1_eps"]["adult"][-1] == 0.4


def test_table1_quick_through_the_cli(tmp_path, capsys):
    out = tmp_path / "t1"
    assert cli.main(["reproduce", "vfl-table1", "--quick", "--quiet", "--out", str(out)]) == 0
    text = (out / "vfl-table1.md").read_text()
    assert "paper FR" in text and "95.1±0.2" in text and "FAIL" not in text
    rows = list(csv.DictReader((out / "vfl-table1.csv").open()))
    methods = {r["method"] for r in rows}
    assert {"FedBCD", "EO", "CEO", "Fair VFL", "reference (eps = 0.01)"} <= methods
    for ds in ("adult", "compas", "communities"):
        fair = next(r for r in rows if r["dataset"] == ds and r["method"] == "Fair VFL")
        bcd = next(r for r in rows if r["dataset"] == ds and r["method"] == "FedBCD")
        assert float(fair["FR"]) > float(bcd["FR"])
    assert "vfl-table1" in capsys.readouterr().out


@pytest.mark.parametrize("name", ["vfl-fig1", "vfl-fig2"])
def test_figures_quick(tmp_path, name):
    summary = run(name, out_dir=tmp_path, trials=1, quick=True, progress=False)
    assert summary["passed"], [c for c in summary["checks"] if not c["passed"]]
    png = tmp_path / f"{name}.png"
    assert png.stat().st_size > 10_000


@pytest.mark.slow
def test_table1_one_full_seed(tmp_path):
    """One seed of the full Table I (500 rounds, Adult with 40,000 rows; minutes)."""
    summary = run("vfl-table1", out_dir=tmp_path, trials=1, quick=False, progress=False)
    assert summary["passed"], [c for c in summary["checks"] if not c["passed"]]
