"""The ``fedmodel`` command line: demo, solve, reproduce, bench, datasets, errors."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import textwrap

import pytest

from fedmodel import cli

SCRIPT_MODEL = textwrap.dedent(
    """
    import numpy as np, cvxpy as cp, fedmodel as fm

    rng = np.random.default_rng(0)
    model = fm.Model("tiny")
    w = model.variable(3, name="w")
    for k in range(2):
        site = model.client(f"site{k}")
        A = site.data(rng.normal(size=(20, 3)), name="A")
        site.minimize(cp.sum_squares(A @ w - 1) / 40)
        site.subject_to(cp.sum(w) <= 1)

    if __name__ == "__main__":
        raise SystemExit("the CLI must not run the script's main block")
    """
)

SCRIPT_BUILD = textwrap.dedent(
    """
    import numpy as np, cvxpy as cp, fedmodel as fm

    def build():
        model = fm.Model("built")
        w = model.variable(2, name="w")
        site = model.client("only")
        site.minimize(cp.sum_squares(w - np.array([1.0, 2.0])))
        site.subject_to(w[0] + w[1] <= 1)
        return model
    """
)


def _write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def _one_error_line(err: str) -> str:
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("fedmodel: error: "), err
    assert "Traceback" not in err
    return lines[0]


def test_demo_prints_table_and_names_plot(tmp_path, capsys):
    png = tmp_path / "demo.png"
    assert cli.main(["-q", "demo", "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert "prox-al" in out and "centralized" in out
    assert "prox-al at its defaults" in out
    assert "status: prox-al optimal, centralized optimal" in out
    assert "relative objective difference" in out
    assert "communication rounds" in out and "wall time" in out
    assert f"convergence plot: {png.resolve()}" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_solve_module_level_model(tmp_path, capsys):
    script = _write(tmp_path, "model_script.py", SCRIPT_MODEL)
    assert cli.main(["-q", "solve", script, "--eps", "1e-5"]) == 0
    out = capsys.readouterr().out
    assert "status: optimal" in out
    assert "model: tiny (2 clients), method: prox-al" in out
    assert "w = [" in out


def test_solve_build_function_with_options_and_compare(tmp_path, capsys):
    script = _write(tmp_path, "build_script.py", SCRIPT_BUILD)
    code = cli.main(
        [
            "-q",
            "solve",
            script,
            "--method",
            "cprox-al",
            "-o",
            "beta=5",
            "--option",
            "max_outer=200",
            "--compare",
            "--strict",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    assert "method: cprox-al" in out
    assert "relative objective difference" in out  # the comparison with centralized


def test_solve_json_parses(tmp_path, capsys):
    script = _write(tmp_path, "model_script.py", SCRIPT_MODEL)
    assert cli.main(["solve", script, "--json", "--compare"]) == 0
    captured = capsys.readouterr()
    record = json.loads(captured.out)
    assert record["status"] == "optimal"
    assert record["method"] == "prox-al"
    assert record["comparison"]["reference_method"] == "centralized"
    assert record["wall_seconds"] > 0
    assert captured.err == ""  # --json implies no progress output


def test_solve_plot_without_matplotlib(tmp_path, capsys, monkeypatch):
    import fedmodel.plots as plots

    def missing():
        raise ImportError(plots._MISSING)

    monkeypatch.setattr(plots, "require_matplotlib", missing)
    script = _write(tmp_path, "model_script.py", SCRIPT_MODEL)
    assert cli.main(["-q", "solve", script, "--plot", str(tmp_path / "x.png")]) == 0
    captured = capsys.readouterr()
    assert "status: optimal" in captured.out
    notes = [line for line in captured.err.splitlines() if line.strip()]
    assert len(notes) == 1 and "pip install 'fedmodel[plots]'" in notes[0]
    assert not (tmp_path / "x.png").exists()


@pytest.mark.parametrize(
    "argv, code, fragment",
    [
        (["frobnicate"], 2, "invalid choice"),
        (["solve"], 2, "required"),
        (["solve", "/nonexistent/script.py"], 1, "no such script"),
        (["solve", "{script}", "-o", "beta"], 2, "KEY=VALUE"),
        (["solve", "{script}", "-o", "colour=red"], 1, "unknown option(s) ['colour']"),
        (["solve", "{script}", "--method", "nope"], 1, "unknown method 'nope'"),
        (["solve", "{empty}"], 1, "defines neither a module-level 'model'"),
        (["solve", "{broken}"], 1, "broken.py (line 3) raised ZeroDivisionError"),
        (["reproduce", "table99"], 2, "unknown reproduction 'table99'"),
        (["reproduce", "table2", "--trials", "0"], 2, "--trials must be >= 1"),
        (["demo", "--clients", "many"], 2, "invalid int value"),
    ],
)
def test_errors_are_one_line(tmp_path, capsys, argv, code, fragment):
    paths = {
        "script": _write(tmp_path, "model_script.py", SCRIPT_MODEL),
        "empty": _write(tmp_path, "empty.py", "x = 1\n"),
        "broken": _write(tmp_path, "broken.py", "import math\n\nvalue = 1 / 0\n"),
    }
    argv = [a.format(**paths) for a in argv]
    assert cli.main(argv) == code
    line = _one_error_line(capsys.readouterr().err)
    assert fragment in line


def test_nonconvex_model_error_is_one_line(tmp_path, capsys):
    script = _write(
        tmp_path,
        "nonconvex.py",
        textwrap.dedent(
            """
        import cvxpy as cp, fedmodel as fm
        model = fm.Model()
        w = model.variable(2)
        c = model.client("a")
        c.minimize(-cp.sum_squares(w))
        """
        ),
    )
    assert cli.main(["solve", script]) == 1
    line = _one_error_line(capsys.readouterr().err)
    assert "[a]" in line and "not DCP-convex" in line


def test_datasets_lists_bundled_data(capsys):
    assert cli.main(["datasets"]) == 0
    out = capsys.readouterr().out
    for name in ("breast_cancer", "monks", "adult", "licence"):
        assert name in out
    assert cli.main(["datasets", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["name"] for r in rows} >= {"breast_cancer", "monks", "adult"}


def test_reproduce_list_and_run(tmp_path, capsys):
    assert cli.main(["reproduce", "--list"]) == 0
    out = capsys.readouterr().out
    for name in ("table1", "table2", "table3", "fig1", "fig2", "fig3"):
        assert name in out
    code = cli.main(
        [
            "-q",
            "reproduce",
            "table1",
            "--quick",
            "--trials",
            "1",
            "--out",
            str(tmp_path / "t1"),
            "--set",
            "grid=[(1, 20, 1)]",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    assert "| n | d | m |" in out and "[PASS]" in out
    assert (tmp_path / "t1" / "table1.md").is_file()
    assert (tmp_path / "t1" / "table1.png").is_file()


def test_bench_without_suite(capsys, monkeypatch):
    monkeypatch.setattr(cli, "_find_bench", lambda: None)
    assert cli.main(["bench"]) == 1
    assert "no benchmark suite found" in _one_error_line(capsys.readouterr().err)


def test_bench_runs_suite(tmp_path, capsys, monkeypatch):
    suite = tmp_path / "benchmarks" / "run.py"
    suite.parent.mkdir()
    suite.write_text("import sys\nprint('bench', sys.argv[1:])\nsys.exit(3)\n")
    monkeypatch.setattr(cli, "_find_bench", lambda: suite)
    assert cli.main(["-q", "bench", "--fast"]) == 3


def test_progress_line_printer_without_tqdm():
    stream = io.StringIO()
    p = cli.Progress("prox-al", stream=stream, use_tqdm=False)
    p.callback({"iteration": 0, "rounds": 12, "stationarity": 1e-2, "feasibility": 3e-4})
    p.close()
    text = stream.getvalue()
    assert "outer 1" in text and "rounds 12" in text and "stat 1.0e-02" in text


def test_progress_quiet_prints_nothing():
    stream = io.StringIO()
    p = cli.Progress("x", stream=stream, enabled=False)
    p.callback({"iteration": 3})
    p.advance()
    p.close()
    assert stream.getvalue() == ""


def test_module_entry_point_exit_code(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "fedmodel.cli", "solve", str(tmp_path / "missing.py")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1
    _one_error_line(proc.stderr)
