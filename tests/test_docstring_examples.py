"""Every docstring example in the package runs as written and prints what it shows.

The engineering standards ask for numpy-style docstrings with a short runnable example; this
runs them all (``doctest`` over every module of ``fedmodel``), so an example that drifts from
the code fails here. A module whose optional extra is not installed (Ray, Flower, JAX) is
skipped, not failed.
"""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import fedmodel

MODULES = sorted(
    m.name for m in pkgutil.walk_packages(fedmodel.__path__, prefix="fedmodel.") if not m.ispkg
) + ["fedmodel"]


def test_the_package_is_walked():
    assert len(MODULES) > 50
    assert "fedmodel.algorithms.proxal.newton_inner" in MODULES


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    try:
        module = importlib.import_module(name)
    except ImportError as exc:  # an optional extra (ray, flwr, jax) not installed
        pytest.skip(f"{name}: {exc}")
    tests = doctest.DocTestFinder(exclude_empty=True).find(module, name)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    report: list[str] = []
    failed = sum(runner.run(test, out=report.append).failed for test in tests)
    if failed:
        pytest.fail(f"{name}: {failed} docstring example(s) failed\n" + "".join(report)[:4000])
