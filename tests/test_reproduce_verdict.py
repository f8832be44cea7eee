"""Reproductions decide by iteration caps, never by wall time.

A check that fails while one of the reproduction's runs was stopped by its time limit is
"inconclusive" (exit code 0, said so on the verdict line), not a verdict on the paper's
claim; a check that fails on runs that ended by their iteration caps or converged is a
failure (exit code 3). ``--quick`` runs have no time limit at all.
"""

from __future__ import annotations

import pytest

from fedmodel import cli, reproduce
from fedmodel.reproduce import seed000
from fedmodel.reproduce.output import check, finish_report, mark_time_limited, verdict


def test_verdicts():
    assert verdict([check("a", True, "")]) == "pass"
    assert verdict([check("a", True, ""), check("b", False, "")]) == "fail"
    checks = mark_time_limited([check("a", True, ""), check("b", False, "x")], ["time_limit"])
    assert checks[0].get("inconclusive") is None  # a passed check stays passed
    assert checks[1]["inconclusive"] and "time limit" in checks[1]["detail"]
    assert verdict(checks) == "inconclusive"
    # runs that ended by their caps or converged: a failure is a failure
    checks = mark_time_limited([check("b", False, "x")], ["max_iterations", "optimal"])
    assert verdict(checks) == "fail"


def test_quick_runs_have_no_wall_clock_limit():
    assert seed000._time_limit(quick=True, time_limit=None) is None
    assert seed000._time_limit(quick=False, time_limit=None) == seed000.TIME_LIMIT["full"]
    assert seed000._time_limit(quick=True, time_limit=5) == 5.0


@pytest.fixture
def toy(monkeypatch):
    """A registered reproduction whose one check fails, behind runs with given statuses."""

    def register(statuses):
        def toy_reproduction(out_dir, trials, quick, progress, **kw):
            checks = [check("gap <= 1e-3", False, "max 2e-2"), check("feasible", True, "ok")]
            return finish_report(
                out_dir, "toy", ["# toy"], [], checks, 0.0, quick, statuses=statuses
            )

        monkeypatch.setitem(reproduce.REPRODUCTIONS, "toy", toy_reproduction)

    return register


def test_cli_inconclusive_exits_0(toy, tmp_path, capsys):
    toy(["optimal", "time_limit"])
    code = cli.main(["-q", "reproduce", "toy", "--quick", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0
    assert "[INCONCLUSIVE] gap <= 1e-3" in out and "[PASS] feasible" in out
    assert "toy: inconclusive: 1 of 2 checks" in out
    assert "Verdict: inconclusive." in (tmp_path / "toy.md").read_text()


def test_cli_failure_without_a_time_limit_exits_3(toy, tmp_path, capsys):
    toy(["optimal", "max_iterations"])
    code = cli.main(["-q", "reproduce", "toy", "--quick", "--out", str(tmp_path)])
    captured = capsys.readouterr()
    assert code == cli.EXIT_CHECKS
    assert "[FAIL] gap <= 1e-3" in captured.out
    assert "1 of 2 checks failed" in captured.err
    assert "Verdict: fail." in (tmp_path / "toy.md").read_text()


def test_a_real_reproduction_cut_by_the_clock_is_never_a_failure(tmp_path, capsys):
    # table1 on one tiny QP with a time limit no solve can meet: prox-al stops after its
    # first outer iteration; whatever the checks measure, the run exits 0
    code = cli.main(
        [
            "-q",
            "reproduce",
            "table1",
            "--quick",
            "--trials",
            "1",
            "--time-limit",
            "1e-9",
            "--out",
            str(tmp_path),
            "--set",
            "grid=[(2, 20, 1)]",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    assert "time_limit" in (tmp_path / "table1_runs.csv").read_text()
    assert "[FAIL]" not in out
