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

#: the packages of pyproject.toml's optional extras: a module that needs one is skipped
#: where it is not installed (the test extra installs ray, flwr and matplotlib: none is
#: skipped in CI); any other import error fails
OPTIONAL_EXTRAS = {"ray", "flwr", "jax", "fairlearn", "tqdm", "matplotlib", "pandas"}

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
    except ImportError as exc:  # only an optional extra's package may be missing
        if (exc.name or "").split(".")[0] not in OPTIONAL_EXTRAS:
            raise
        pytest.skip(f"{name}: the optional package {exc.name!r} is not installed")
    tests = doctest.DocTestFinder(exclude_empty=True).find(module, name)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    report: list[str] = []
    failed = sum(runner.run(test, out=report.append).failed for test in tests)
    if failed:
        pytest.fail(f"{name}: {failed} docstring example(s) failed\n" + "".join(report)[:4000])
