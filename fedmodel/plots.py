"""Convergence and per-client plots of fedmodel results (matplotlib, optional).

Install the extra with ``pip install 'fedmodel[plots]'``. Figures are built with
:class:`matplotlib.figure.Figure` and saved with the Agg canvas, so nothing here touches
pyplot's global state or needs a display; in a notebook the returned figure shows inline.

Functions
---------
plot_result
    One result: objective gap to a reference, max violation and KKT residuals against
    communication rounds (log scale). Also available as ``res.plot()``.
plot_results
    Several results side by side, one panel per quantity.
client_series
    Per-client values of one constraint (or any function of a party's constraint values)
    over the outer iterations, read from ``res.history``.
plot_bands
    Min/mean/max bands across clients of per-client quantities (seed 000 Figs. 1-2).
plot_client_bands
    ``client_series`` + ``plot_bands`` for one result.
log_plot, zero_legend_handle, integer_ticks
    Building blocks shared with the reproductions' figures: a log-scale curve whose exact
    zeros are open markers on the axes' bottom edge (legend entry "0 (exact)") instead of
    points at an invented floor; whole-number ticks for iteration and round counts.

Examples
--------
>>> import numpy as np, cvxpy as cp, fedmodel as fm
>>> from fedmodel.plots import plot_result
>>> model = fm.Model()
>>> w = model.variable(2)
>>> for k in range(2):
...     site = model.client(f"site{k}")
...     site.minimize(cp.sum_squares(w - k))
...     budget = site.subject_to(cp.sum(w) <= 1)
>>> res = model.solve(method="prox-al")
>>> fig = plot_result(res)  # doctest: +SKIP
>>> fig.savefig("convergence.png")  # doctest: +SKIP
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

__all__ = [
    "ZERO_LABEL",
    "client_series",
    "integer_ticks",
    "log_plot",
    "plot_bands",
    "plot_client_bands",
    "plot_result",
    "plot_results",
    "require_matplotlib",
    "zero_legend_handle",
]

_MISSING = (
    "fedmodel's plots need matplotlib, which is not installed; install it with "
    "pip install 'fedmodel[plots]'"
)
#: legend entry of the markers that stand for exact zeros on a log axis (see log_plot)
ZERO_LABEL = "0 (exact)"
_QUANTITIES = (
    ("objective gap", "objective gap |f - f*|"),
    ("max_violation", "max violation"),
    ("stationarity", "KKT stationarity"),
    ("feasibility", "KKT feasibility"),
)
_STYLES = ("o-", "s--", "^-", "D:")  # plot_result's line per quantity


def require_matplotlib():
    """Import matplotlib (Agg canvas) or raise an ImportError naming the extra to install.

    Returns
    -------
    module
        :mod:`matplotlib.figure`.
    """
    try:
        import matplotlib  # noqa: F401
        from matplotlib import figure
        from matplotlib.backends import backend_agg  # noqa: F401
    except ImportError as exc:
        raise ImportError(_MISSING) from exc
    return figure


def _new_axes(ax, nrows: int = 1, ncols: int = 1, figsize=(6.4, 4.2)):
    """Return ``(fig, axes)``: ``ax``'s figure if given, else a fresh Agg figure."""
    figure = require_matplotlib()
    if ax is not None:
        return ax.figure, ax
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = figure.Figure(figsize=figsize, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols, squeeze=True)
    return fig, axes


def _save(fig, path) -> None:
    if path is None:
        return
    path = os.fspath(path)
    directory = os.path.dirname(path)
    if directory:
        os.makedirs(directory, exist_ok=True)
    if fig.canvas is None or type(fig.canvas).__name__ == "FigureCanvasBase":
        from matplotlib.backends.backend_agg import FigureCanvasAgg

        FigureCanvasAgg(fig)
    fig.savefig(path, dpi=120)


def _history(res) -> list[dict]:
    hist = list(getattr(res, "history", None) or [])
    if not hist:
        raise ValueError(
            f"result of method {getattr(res, 'method', '?')!r} has no history to plot "
            "(solve with history=True; the 'centralized' method records none)"
        )
    return hist


def _x_axis(hist: list[dict]) -> tuple[np.ndarray, str]:
    """Communication rounds when the method counts them, else outer iterations (+1)."""
    rounds = [row.get("rounds") for row in hist]
    if all(isinstance(r, (int, np.integer)) for r in rounds) and rounds[-1] > 0:
        return np.asarray(rounds, dtype=float), "communication rounds"
    return np.asarray([row["iteration"] + 1 for row in hist], dtype=float), "outer iterations"


def _series(hist: list[dict], key: str, reference: float | None) -> np.ndarray | None:
    if key == "objective gap":
        if reference is None:
            return None
        vals = np.array([abs(row["objective"] - reference) for row in hist], dtype=float)
    else:
        if any(row.get(key) is None for row in hist):
            return None
        vals = np.array([row[key] for row in hist], dtype=float)
    return vals


def integer_ticks(axis) -> None:
    """Ticks at whole numbers only on ``axis`` (an Axes' ``xaxis`` or ``yaxis``): iteration
    and round counts never get ticks such as 1.25.

    Examples
    --------
    >>> from matplotlib.figure import Figure
    >>> from fedmodel.plots import integer_ticks
    >>> ax = Figure().subplots()
    >>> integer_ticks(ax.xaxis)
    """
    from matplotlib.ticker import MaxNLocator

    axis.set_major_locator(MaxNLocator(integer=True))


def _integer_valued(x) -> bool:
    x = np.asarray(x, dtype=float)
    return x.size > 0 and bool(np.all(np.isfinite(x) & (x == np.round(x))))


def log_plot(ax, x, y, fmt: str = "o-", zero_marker: str = "v", **kw):
    """Plot ``y`` against ``x`` on a log y axis without inventing values for zeros.

    Positive values are drawn as usual; exact zeros (and negative values, which a log
    axis cannot show) break the line and are marked by an open ``zero_marker`` on the
    bottom edge of the axes, whatever its limits (add :func:`zero_legend_handle` to the
    legend to explain them). NaN values are simply left out.

    Parameters
    ----------
    ax : matplotlib Axes
        Its y scale is set to log.
    x, y : array-like
    fmt : str
        matplotlib format string of the positive values.
    zero_marker : str
        Marker of the zeros.
    **kw
        Passed to ``ax.plot`` (``label``, ``color``, ...).

    Returns
    -------
    tuple (line, zeros)
        The line of positive values and the Line2D of the zero markers (None if none).

    Examples
    --------
    >>> from matplotlib.figure import Figure
    >>> from fedmodel.plots import log_plot
    >>> ax = Figure().subplots()
    >>> line, zeros = log_plot(ax, [1, 2, 3], [1e-2, 0.0, 1e-4], label="max violation")
    >>> int(zeros.get_xdata()[0])
    2
    """
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    zero = np.isfinite(y) & (y <= 0)
    ax.set_yscale("log")
    (line,) = ax.plot(x, np.where(y > 0, y, np.nan), fmt, **kw)
    zeros = None
    if zero.any():
        (zeros,) = ax.plot(
            x[zero],
            np.zeros(int(zero.sum())),
            linestyle="none",
            marker=zero_marker,
            markersize=7,
            markerfacecolor="white",
            color=line.get_color(),
            transform=ax.get_xaxis_transform(),  # y in axes units: 0 = the bottom edge
            clip_on=False,
            zorder=3,
        )
    return line, zeros


def zero_legend_handle(color: str = "0.3", marker: str = "v"):
    """A legend handle for the zero markers of :func:`log_plot` (label :data:`ZERO_LABEL`).

    Examples
    --------
    >>> from fedmodel.plots import zero_legend_handle
    >>> zero_legend_handle().get_label()
    '0 (exact)'
    """
    require_matplotlib()
    from matplotlib.lines import Line2D

    return Line2D(
        [],
        [],
        linestyle="none",
        marker=marker,
        markersize=7,
        markerfacecolor="white",
        color=color,
        label=ZERO_LABEL,
    )


def _legend(ax, extra=(), **kw) -> None:
    """The axes' legend with ``extra`` handles appended."""
    handles, _ = ax.get_legend_handles_labels()
    handles = list(handles) + list(extra)
    if handles:
        ax.legend(handles=handles, **kw)


def _reference_objective(reference) -> float | None:
    if reference is None:
        return None
    if isinstance(reference, (int, float, np.floating, np.integer)):
        return float(reference)
    return float(reference.objective)


def plot_result(res, reference=None, ax=None, path=None, title: str | None = None):
    """Objective gap, max violation and KKT residuals of one result, on a log scale.

    Parameters
    ----------
    res : Result
        A result with a history (``prox-al``, ``cprox-al``, ``admm`` ...).
    reference : Result or float, optional
        The reference optimum (e.g. ``model.solve(method="centralized")``); adds the curve
        ``|f(w^k) - f*|``.
    ax : matplotlib Axes, optional
        Draw into this axes instead of a new figure.
    path : str or path-like, optional
        Save the figure there as PNG.
    title : str, optional
        Axes title (default: the method and its status).

    Returns
    -------
    matplotlib.figure.Figure

    Raises
    ------
    ImportError
        matplotlib is missing (the message names ``pip install 'fedmodel[plots]'``).
    ValueError
        The result has no history.
    """
    hist = _history(res)
    fig, ax = _new_axes(ax)
    x, xlabel = _x_axis(hist)
    ref = _reference_objective(reference)
    data = [(label, _series(hist, key, ref)) for key, label in _QUANTITIES]
    any_zero = False
    for (label, y), fmt in zip(data, _STYLES):
        if y is not None:  # distinct styles: curves that coincide stay visible
            _, zeros = log_plot(ax, x, y, fmt, markersize=4, label=label)
            any_zero |= zeros is not None
    eps = (getattr(res, "options", None) or {}).get("eps")
    if eps is not None and np.ndim(eps) == 0:
        ax.axhline(float(eps), color="0.4", linestyle=":", linewidth=1, label=f"eps = {eps:g}")
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    integer_ticks(ax.xaxis)
    ax.set_ylabel("value (log scale)")
    ax.set_title(title or f"{res.method}: {res.status}")
    ax.grid(True, which="major", alpha=0.3)
    _legend(ax, [zero_legend_handle()] if any_zero else [], fontsize="small")
    _save(fig, path)
    return fig


def plot_results(
    results: Sequence[Any],
    reference=None,
    labels: Sequence[str] | None = None,
    path=None,
    title: str | None = None,
):
    """Compare several results: one panel per quantity, one curve per result.

    Parameters
    ----------
    results : sequence of Result
        Results with histories (results without one are skipped with a note in the legend).
    reference : Result or float, optional
        The reference optimum for the objective-gap panel.
    labels : sequence of str, optional
        Legend labels (default: each result's method).
    path : str or path-like, optional
        Save the figure there as PNG.
    title : str, optional
        Figure title.

    Returns
    -------
    matplotlib.figure.Figure
    """
    results = list(results)
    if not results:
        raise ValueError("plot_results needs at least one result")
    labels = list(labels) if labels is not None else [r.method for r in results]
    if len(labels) != len(results):
        raise ValueError(f"{len(labels)} labels for {len(results)} results")
    ref = _reference_objective(reference)
    fig, axes = _new_axes(None, 2, 2, figsize=(10, 7))
    xlabels = set()
    curves = []
    for res, label in zip(results, labels):
        hist = list(getattr(res, "history", None) or [])
        if not hist:
            continue
        x, xlabel = _x_axis(hist)
        xlabels.add(xlabel)
        curves.append((label, x, [_series(hist, key, ref) for key, _ in _QUANTITIES]))
    zero_in = set()
    for q, axis in enumerate(axes.flat):
        for label, x, ys in curves:
            if ys[q] is not None:
                _, zeros = log_plot(axis, x, ys[q], "o-", markersize=3, label=label)
                if zeros is not None:
                    zero_in.add(q)
    for q, (axis, (key, name)) in enumerate(zip(axes.flat, _QUANTITIES)):
        axis.set_title(name)
        axis.set_yscale("log")
        axis.set_xlabel(" / ".join(sorted(xlabels)) or "iterations")
        integer_ticks(axis.xaxis)
        axis.grid(True, alpha=0.3)
        if axis.lines:
            _legend(axis, [zero_legend_handle()] if q in zero_in else [], fontsize="small")
        elif key == "objective gap":
            axis.text(
                0.5,
                0.5,
                "no reference given",
                ha="center",
                va="center",
                transform=axis.transAxes,
                color="0.5",
            )
    if title:
        fig.suptitle(title)
    _save(fig, path)
    return fig


def client_series(
    res,
    index: int = 0,
    kind: str = "ineq",
    parties: Sequence[str] | None = None,
    transform: Callable[[np.ndarray], float] | None = None,
) -> tuple[np.ndarray, list[str], np.ndarray]:
    """Per-party constraint values over the outer iterations, from ``res.history``.

    Parameters
    ----------
    res : Result
    index : int
        Which scalar constraint of each party (in declaration order, flattened).
    kind : {"ineq", "eq"}
        Inequalities (``g(w) <= 0`` values) or equalities.
    parties : sequence of str, optional
        Parties to include (default: every party but the server).
    transform : callable, optional
        ``transform(values) -> float`` applied to the party's whole constraint vector
        instead of picking ``index`` (e.g. ``lambda c: max(c) + 0.1`` for a two-sided
        disparity bound).

    Returns
    -------
    iterations : ndarray, shape (K,)
    names : list of str
    values : ndarray, shape (K, len(names))
    """
    hist = _history(res)
    first = hist[0].get("constraints") or {}
    names = list(parties) if parties is not None else [p for p in first if p != "server"]
    if not names:
        raise ValueError("the history records no client constraints")
    values = np.empty((len(hist), len(names)))
    for i, row in enumerate(hist):
        for j, name in enumerate(names):
            vec = np.asarray(row["constraints"][name][kind], dtype=float).ravel()
            values[i, j] = transform(vec) if transform is not None else vec[index]
    iterations = np.array([row["iteration"] for row in hist], dtype=float)
    return iterations, names, values


def plot_bands(
    x: Sequence[float],
    series: Mapping[str, np.ndarray],
    lines: Mapping[str, Sequence[float]] | None = None,
    threshold: float | None = None,
    ax=None,
    path=None,
    xlabel: str = "outer iteration",
    ylabel: str = "value",
    title: str | None = None,
    secondary: Mapping[str, np.ndarray] | None = None,
    secondary_label: str | None = None,
    threshold_label: str | None = None,
):
    """Min/mean/max bands across clients (seed 000 Figs. 1 and 2).

    Parameters
    ----------
    x : sequence of float, length K
        Horizontal axis (outer iterations).
    series : mapping label -> array (K, n_clients)
        Each entry becomes a solid mean line with a shaded min-max band.
    lines : mapping label -> sequence (K,), optional
        Extra single curves (dash-dot), e.g. the server's global disparity.
    threshold : float, optional
        A dashed "feasible if below this line" level.
    ax : matplotlib Axes, optional
    path : str or path-like, optional
        Save as PNG.
    secondary : mapping label -> array (K, n_clients), optional
        Bands drawn on a right-hand axis (e.g. the objective next to the constraints).
    secondary_label : str, optional
        Label of the right-hand axis.
    threshold_label : str, optional
        Legend entry of the threshold line (default "feasible if below this line (T)").

    Returns
    -------
    matplotlib.figure.Figure
    """
    fig, ax = _new_axes(ax)
    x = np.asarray(x, dtype=float)
    colors = iter(["tab:blue", "tab:brown", "tab:green", "tab:purple", "tab:red", "tab:olive"])
    handles = []

    def bands(axis, data):
        for label, vals in data.items():
            vals = np.asarray(vals, dtype=float)
            if vals.ndim == 1:
                vals = vals[:, None]
            color = next(colors)
            (h,) = axis.plot(
                x,
                vals.mean(axis=1),
                color=color,
                marker="o",
                markersize=3,
                label=f"{label} (mean)",
            )
            axis.fill_between(
                x, vals.min(axis=1), vals.max(axis=1), color=color, alpha=0.25, linewidth=0
            )
            handles.append(h)

    bands(ax, series)
    for label, vals in (lines or {}).items():
        (h,) = ax.plot(
            x, np.asarray(vals, dtype=float), linestyle="-.", color=next(colors), label=label
        )
        handles.append(h)
    if threshold is not None:
        h = ax.axhline(
            threshold,
            color="k",
            linestyle="--",
            linewidth=1,
            label=threshold_label or f"feasible if below this line ({threshold:g})",
        )
        handles.append(h)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if _integer_valued(x):
        integer_ticks(ax.xaxis)
    ax.grid(True, alpha=0.3)
    if secondary:
        ax2 = ax.twinx()
        bands(ax2, secondary)
        ax2.set_ylabel(secondary_label or "")
    ax.legend(handles=handles, fontsize="small", loc="best")
    if title:
        ax.set_title(title)
    _save(fig, path)
    return fig


def plot_client_bands(
    res,
    index: int = 0,
    transform: Callable[[np.ndarray], float] | None = None,
    label: str = "constraint value",
    threshold: float | None = 0.0,
    ax=None,
    path=None,
    title: str | None = None,
):
    """Min/mean/max across clients of one constraint's value over the outer iterations.

    With the default ``threshold=0`` the dashed line marks feasibility of ``g(w) <= 0``;
    use ``transform`` to show, e.g., the loss itself (``lambda c: c[0] + r``) with
    ``threshold=r``.

    Returns
    -------
    matplotlib.figure.Figure
    """
    it, _, values = client_series(res, index=index, transform=transform)
    return plot_bands(
        it,
        {label: values},
        threshold=threshold,
        ax=ax,
        path=path,
        ylabel=label,
        title=title or f"{res.method}: per-client {label}",
    )
