"""fedmodel.plots: PNG output and the message when matplotlib is missing."""

from __future__ import annotations

import builtins

import cvxpy as cp
import numpy as np
import pytest

import fedmodel as fm
from fedmodel import plots

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def solved():
    rng = np.random.default_rng(1)
    model = fm.Model("plots")
    w = model.variable(3, name="w")
    for k in range(3):
        site = model.client(f"site{k}")
        A = site.data(rng.normal(size=(15, 3)), name="A")
        site.minimize(cp.sum_squares(A @ w - 1) / 45)
        site.subject_to(cp.sum(w) <= 0.5 + 0.1 * k)
    res = model.solve(method="prox-al", eps=1e-5)
    cres = model.solve(method="cprox-al", eps=1e-5)
    ref = model.solve(method="centralized")
    return res, cres, ref


def test_plot_result_png(solved, tmp_path):
    res, _, ref = solved
    path = tmp_path / "sub" / "conv.png"
    fig = plots.plot_result(res, reference=ref, path=path)
    assert path.read_bytes()[:8] == PNG
    ax = fig.axes[0]
    assert ax.get_yscale() == "log"
    assert ax.get_xlabel() == "communication rounds"
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "objective gap |f - f*|" in labels and "KKT stationarity" in labels


def test_result_plot_method_and_float_reference(solved, tmp_path):
    res, _, ref = solved
    path = tmp_path / "m.png"
    res.plot(reference=ref.objective, path=path, title="t")
    assert path.read_bytes()[:8] == PNG


def test_plot_results_two_methods(solved, tmp_path):
    res, cres, ref = solved
    path = tmp_path / "both.png"
    fig = plots.plot_results([res, cres], reference=ref, path=path)
    assert path.read_bytes()[:8] == PNG
    assert len(fig.axes) == 4
    with pytest.raises(ValueError, match="labels"):
        plots.plot_results([res], labels=["a", "b"])


def test_client_bands(solved, tmp_path):
    res, _, _ = solved
    it, names, values = plots.client_series(res)
    assert names == ["site0", "site1", "site2"]
    assert values.shape == (len(res.history), 3)
    path = tmp_path / "bands.png"
    plots.plot_client_bands(res, path=path)
    assert path.read_bytes()[:8] == PNG
    path2 = tmp_path / "bands2.png"
    plots.plot_bands(
        it,
        {"a": values, "b": values + 1},
        lines={"g": values[:, 0]},
        threshold=0.0,
        secondary={"c": values * 2},
        path=path2,
    )
    assert path2.read_bytes()[:8] == PNG


def test_no_history_is_a_clear_error(solved):
    _, _, ref = solved
    with pytest.raises(ValueError, match="no history"):
        plots.plot_result(ref)


def test_missing_matplotlib_message(solved, monkeypatch):
    real_import = builtins.__import__

    def fake_import(name, *args, **kwargs):
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake_import)
    res, _, _ = solved
    with pytest.raises(ImportError, match=r"pip install 'fedmodel\[plots\]'"):
        res.plot()
    with pytest.raises(ImportError, match="matplotlib"):
        plots.plot_bands([0, 1], {"a": np.zeros((2, 2))})
