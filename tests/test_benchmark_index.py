"""benchmarks/README.md is the rendering of benchmarks/index.py: every benchmark script is
filed under exactly one question, and the committed index is what the scripts say now."""

from benchmark_scripts import ROOT, load_script


def test_every_script_is_filed_under_one_question():
    index = load_script("index")
    filed = [name for names in index.QUESTIONS.values() for name in names]
    assert sorted(filed) == index.scripts(), "file every benchmarks/*.py in index.QUESTIONS once"


def test_the_committed_readme_is_the_rendering():
    index = load_script("index")
    assert (ROOT / "benchmarks" / "README.md").read_text() == index.render(), (
        "run `python benchmarks/index.py`"
    )


def test_the_rendering_shows_a_script_summary_and_its_results(tmp_path, monkeypatch):
    index = load_script("index")
    (tmp_path / "probe.py").write_text(
        '"""Probe: what it measures.\n\nDetails."""\nOUT = "RESULTS_probe.md"\n'
    )
    (tmp_path / "RESULTS_probe.md").write_text("x")
    monkeypatch.setattr(index, "HERE", tmp_path)
    monkeypatch.setattr(index, "QUESTIONS", {"Q?": ("probe.py",)})
    text = index.render()
    assert "## Q?" in text
    assert (
        "- `probe.py`: Probe: what it measures. Results: [RESULTS_probe.md](RESULTS_probe.md)."
        in text
    )
    assert "Details" not in text
