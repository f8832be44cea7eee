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


# -- the figures' properties (issue 25: labels, categorical axes, integer ticks, units,
# zeros, error bars, legends, one file per variant) ----------------------------------------


def _fake_result(max_violation, rounds):
    """A Result-like object with a history (what plot_result reads)."""
    from types import SimpleNamespace

    hist = [
        {
            "iteration": k,
            "rounds": r,
            "objective": 1.0 + 10.0 ** (-k - 1),
            "max_violation": v,
            "stationarity": 10.0 ** (-k - 1),
            "feasibility": 10.0 ** (-k - 2),
        }
        for k, (v, r) in enumerate(zip(max_violation, rounds))
    ]
    return SimpleNamespace(history=hist, method="prox-al", status="optimal", options={"eps": 1e-3})


def _data_lines(ax):
    """Lines drawn in data coordinates (not the zero markers, not the axhlines)."""
    return [
        ln
        for ln in ax.lines
        if ln.get_transform() == ax.transData and len(np.atleast_1d(ln.get_xdata())) > 1
    ]


def _legend_texts(ax):
    legend = ax.get_legend()
    return [] if legend is None else [t.get_text() for t in legend.get_texts()]


def _canvas_ticks(fig, axis):
    fig.canvas.draw()
    lo, hi = axis.get_view_interval()
    return [t for t in axis.get_majorticklocs() if lo <= t <= hi]


def test_zeros_marked_on_the_axis_bottom_not_drawn_at_an_invented_floor(tmp_path):
    viol = [2e-3, 0.0, 1e-5, 0.0]
    fig = plots.plot_result(
        _fake_result(viol, [1, 2, 3, 4]), reference=1.0, path=tmp_path / "z.png"
    )
    ax = fig.axes[0]
    smallest = min(
        v
        for row in _fake_result(viol, [1, 2, 3, 4]).history
        for v in (row["max_violation"], row["stationarity"], row["feasibility"])
        if v > 0
    )
    for line in _data_lines(ax):
        y = np.asarray(line.get_ydata(), dtype=float)
        assert np.all(np.isnan(y) | (y >= smallest * (1 - 1e-12))), line.get_label()
    # the two zeros: open markers at y = 0 in axes units (the bottom edge), rounds 2 and 4
    zeros = [ln for ln in ax.lines if ln.get_transform() == ax.get_xaxis_transform()]
    assert len(zeros) == 1
    assert list(zeros[0].get_xdata()) == [2.0, 4.0]
    assert list(zeros[0].get_ydata()) == [0.0, 0.0]
    assert plots.ZERO_LABEL in _legend_texts(ax)
    # no zero -> no legend entry for zeros
    fig2 = plots.plot_result(_fake_result([1e-3, 1e-4, 1e-5, 1e-6], [1, 2, 3, 4]))
    assert plots.ZERO_LABEL not in _legend_texts(fig2.axes[0])


def test_round_and_iteration_ticks_are_integers():
    fig = plots.plot_result(_fake_result([1e-3, 1e-4], [1, 2]))
    ticks = _canvas_ticks(fig, fig.axes[0].xaxis)
    assert ticks and all(float(t).is_integer() for t in ticks), ticks
    # plot_bands (seed 000 Figs. 1-2) over 4 outer iterations: the default locator would
    # put ticks at 0.5 steps
    fig = plots.plot_bands([0, 1, 2, 3], {"loss": np.ones((4, 3))}, threshold=0.5)
    ticks = _canvas_ticks(fig, fig.axes[0].xaxis)
    assert ticks and all(float(t).is_integer() for t in ticks), ticks
    assert "feasible if below this line (0.5)" in _legend_texts(fig.axes[0])
    fig = plots.plot_bands([0, 1], {"loss": np.ones((2, 3))}, threshold=0.2,
                           threshold_label="class-1 bound r = 0.2")  # fmt: skip
    assert "class-1 bound r = 0.2" in _legend_texts(fig.axes[0])


def test_demo_writes_one_file_per_variant_with_a_title_naming_it():
    from fedmodel.cli import _demo_plot_path, _demo_plot_title, build_parser

    assert _demo_plot_path(None, "adaptive").name == "fedmodel-demo.png"
    assert _demo_plot_path(None, "paper").name == "fedmodel-demo-paper.png"
    assert _demo_plot_path("x/mine.png", "paper").as_posix() == "x/mine.png"
    args = build_parser().parse_args(["demo", "--variant", "paper"])
    assert args.plot is None  # the default depends on the variant
    paper = _demo_plot_title("paper", 5, "optimal")
    adaptive = _demo_plot_title("adaptive", 3, "optimal")
    assert "as published" in paper and "5 clients" in paper
    assert "adaptive" in adaptive and "3 clients" in adaptive and paper != adaptive


def _table1_rows():
    return [
        {"n": 1, "d": 100, "m": 1, "rel_diff": (2e-3, 5e-4),
         "viol_prox_al": (2e-4, 1e-5), "viol_cprox_al": (3e-4, 2e-5)},
        {"n": 1, "d": 300, "m": 3, "rel_diff": (3e-3, 4e-4),
         "viol_prox_al": (0.0, 0.0), "viol_cprox_al": (4e-4, 2e-5)},
        {"n": 5, "d": 100, "m": 1, "rel_diff": (1e-3, 2e-4),
         "viol_prox_al": (1e-4, 1e-5), "viol_cprox_al": (2e-4, 1e-5)},
    ]  # fmt: skip


def test_table1_plot_has_y_labels_and_categorical_points(tmp_path):
    from fedmodel.reproduce.seed000 import _plot_table1

    path = tmp_path / "table1.png"
    fig = _plot_table1(path, _table1_rows(), trials=3)
    assert path.read_bytes()[:8] == PNG
    axes = fig.axes
    assert len(axes) == 2
    for ax in axes:
        assert ax.get_ylabel()
        assert [t.get_text() for t in ax.get_xticklabels()] == ["1/100/1", "1/300/3", "5/100/1"]
        for line in _data_lines(ax):  # categories are not joined by lines
            assert line.get_linestyle() == "None", line.get_label()
        assert ax.containers, "no error bars"
    assert "pass threshold 0.001" in _legend_texts(axes[1])
    # ours prox-al's violation 0 on instance 1/300/3 is a marker on the bottom edge
    zeros = [ln for ln in axes[1].lines if ln.get_transform() == axes[1].get_xaxis_transform()]
    assert len(zeros) == 1 and round(float(zeros[0].get_xdata()[0])) == 1
    assert plots.ZERO_LABEL in _legend_texts(axes[1])


def _table2_rows():
    rows = []
    for ds in ("breast_cancer", "monks"):
        for n, rel in ((1, 0.0), (5, 3e-3)):
            rows.append(
                {"dataset": ds, "n": n, "obj_prox_al": (0.1 * n, 0.01),
                 "obj_cprox_al": (0.1 * n - 1e-4, 0.01), "obj_centralized": (0.1 * n - 2e-4, 0.01),
                 "rel_diff": (rel, 1e-3), "status": "prox-al: 3 optimal; cprox-al: 3 optimal"}
            )  # fmt: skip
    return rows


def test_table2_plot_separates_the_papers_objectives_and_shows_error_bars(tmp_path):
    from matplotlib.container import ErrorbarContainer

    from fedmodel.reproduce.seed000 import _plot_table23

    path = tmp_path / "table2.png"
    fig = _plot_table23(path, _table2_rows(), "table2", trials=3)
    assert path.read_bytes()[:8] == PNG
    by_title = {ax.get_title(): ax for ax in fig.axes}
    ours = by_title["breast-cancer-wisc: our objective"]
    paper = by_title["breast-cancer-wisc: the paper's objective"]
    rel = by_title["relative difference prox-al vs cprox-al"]
    assert len(fig.axes) == 5  # ours + paper per data set, one relative-difference panel
    # our three methods: one marker each per n, beside each other, with +-std error bars
    lines = {ln.get_label(): ln for ln in _data_lines(ours)}
    assert {"prox-al", "cprox-al", "centralized (f*)"} <= set(lines)
    xs = [tuple(lines[k].get_xdata()) for k in ("prox-al", "cprox-al", "centralized (f*)")]
    assert len(set(xs)) == 3
    bars = [c for c in ours.containers if isinstance(c, ErrorbarContainer)]
    assert len(bars) == 3
    seg = bars[0].lines[2][0].get_segments()[0]  # the first prox-al bar: mean -+ std
    np.testing.assert_allclose([seg[0][1], seg[1][1]], [0.09, 0.11], rtol=1e-12)
    assert "over 3 trials" in ours.get_ylabel()
    # the paper's objectives live on their own axes (their scale does not squash ours)
    assert {"paper Alg. 1", "paper cProx-AL"} <= {ln.get_label() for ln in paper.lines}
    assert not any(ln.get_label().startswith("paper") for ln in ours.lines)
    # the 1e-2 line is in the legend; the zero relative differences are marked
    assert "pass threshold 1e-2" in _legend_texts(rel)
    assert plots.ZERO_LABEL in _legend_texts(rel)
    for line in _data_lines(rel):
        y = np.asarray(line.get_ydata(), dtype=float)
        assert np.all(np.isnan(y) | (y > 0))


def test_fig3_adult_b_loss_and_disparity_on_their_own_axes(tmp_path):
    from fedmodel.reproduce.seed000 import _plot_fig3

    rng = np.random.default_rng(0)
    ns = [1, 5]
    np_points = {
        "breast_cancer": {
            n: {t: (rng.uniform(0.1, 0.4, n), rng.uniform(0.1, 0.2, n))
                for t in ("NP", "unconstrained")}
            for n in ns
        }
    }  # fmt: skip
    fair = {
        n: {t: (rng.uniform(0.3, 0.5, n), rng.uniform(0.0, 0.1, n + 1))
            for t in ("fair", "unconstrained")}
        for n in ns
    }  # fmt: skip
    path = tmp_path / "fig3.png"
    fig = _plot_fig3(path, ns, np_points, fair, 0.2, 0.05)
    assert path.read_bytes()[:8] == PNG
    assert len(fig.axes) == 3
    np_ax, loss_ax, disp_ax = fig.axes
    assert "logistic loss" in loss_ax.get_ylabel()
    assert "disparity" in disp_ax.get_ylabel() and "logistic loss" not in disp_ax.get_ylabel()
    assert "disparity bound r = 0.05" in _legend_texts(disp_ax)
    assert "class-1 bound r = 0.2" in _legend_texts(np_ax)
    assert {"fair", "unconstrained"} <= set(_legend_texts(loss_ax))


def test_ssca_accuracy_not_clipped_and_in_the_legend():
    from fedmodel.reproduce.ssca import _curves_figure

    rows = [
        {"method": m, "B": 10, "E": 1, "constrained": False, "round": t,
         "train_loss": 2.0 / (t + 1), "test_accuracy": acc}
        for m, accs in (("ssca", (0.1, 0.8, 0.92)), ("sgd", (0.12, 0.7, 0.9)))
        for t, acc in zip((0, 10, 20), accs)
    ]  # fmt: skip
    panels = [
        ("B = 10", [("SSCA", {"method": "ssca"}, "C0", "-"), ("SGD", {"method": "sgd"}, "C1", "-")])
    ]
    fig = _curves_figure(rows, panels, "t")
    loss_ax, acc_ax = fig.axes
    lo, hi = acc_ax.get_ylim()
    assert lo <= 0.1 and 0.92 <= hi <= 1.0  # every accuracy drawn (the first is 0.1)
    assert _legend_texts(acc_ax) == ["SSCA", "SGD"]
    assert _legend_texts(loss_ax) == ["SSCA", "SGD"]


def test_vfl_fig1_points_sit_at_their_eps_values(tmp_path):
    from fedmodel.reproduce.vfl import _fig1_plot

    eps = [0.01, 0.1, 0.25]
    rows = [
        {"dataset": "compas", "eps": e, "AC": 80.0 + k, "FR": 70.0 + k, "FR_tpr": 60.0 + k}
        for k, e in enumerate(eps)
    ]
    path = tmp_path / "vfl-fig1.png"
    fig = _fig1_plot(rows, ["compas"], path)
    assert path.read_bytes()[:8] == PNG
    (ax,) = fig.axes
    for line in ax.lines:
        np.testing.assert_array_equal(line.get_xdata(), eps)
    assert list(ax.get_xticks()) == eps
    assert ax.get_ylabel() and ax.get_xlabel().startswith("eps")
