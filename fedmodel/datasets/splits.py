"""Federated splitters: cut a data set ``(X, y)`` into client parts.

All splitters are deterministic given ``random_state`` (an int seed, a
:class:`numpy.random.Generator`, which is then advanced, or ``None`` for fresh entropy),
return copies of the rows, keep each part's rows in their original order (sorted row
indices), and raise :class:`ValueError` naming the offending argument on bad input.

When ``extra`` is given (a mapping ``name -> array`` with one entry per row, e.g.
``{"sensitive": ds.sensitive}``), each part is returned as a dict with keys ``"X"``,
``"y"``, ``"index"`` (the original row indices) and the names of ``extra``; otherwise as
a tuple ``(X_k, y_k)``.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = ["split_stratified", "split_dirichlet", "split_server", "split_by_class"]

RandomState = int | np.random.Generator | None
Part = tuple[np.ndarray, np.ndarray] | dict[str, np.ndarray]

_MAX_DIRICHLET_TRIES = 100


# ---------------------------------------------------------------------------------------
# validation


def _check_finite(name: str, a: np.ndarray) -> None:
    if a.dtype.kind in "fc" and not np.all(np.isfinite(a)):
        raise ValueError(f"{name} contains NaN or infinite values")
    if a.dtype.kind == "O":
        try:
            bad = any(isinstance(v, float) and not np.isfinite(v) for v in a.ravel())
        except TypeError:  # pragma: no cover - exotic objects
            bad = False
        if bad:
            raise ValueError(f"{name} contains NaN or infinite values")


def _check_xy(
    X: Any, y: Any, extra: Mapping[str, Any] | None = None
) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray] | None]:
    X = np.asarray(X)
    y = np.asarray(y)
    if X.ndim != 2:
        raise ValueError(f"X must be a 2-D array (rows x features), got shape {X.shape}")
    if y.ndim != 1:
        raise ValueError(f"y must be a 1-D array, got shape {y.shape}")
    if X.shape[0] != y.shape[0]:
        raise ValueError(
            f"X and y have different numbers of rows: X has {X.shape[0]}, y has {y.shape[0]}"
        )
    if X.shape[0] == 0:
        raise ValueError("X has no rows")
    _check_finite("X", X)
    _check_finite("y", y)
    if extra is None:
        return X, y, None
    if not isinstance(extra, Mapping):
        raise ValueError("extra must be a mapping name -> array (e.g. {'sensitive': s})")
    checked = {}
    for key, value in extra.items():
        if key in ("X", "y", "index"):
            raise ValueError(f"extra: the name {key!r} is reserved")
        a = np.asarray(value)
        if a.ndim == 0 or a.shape[0] != X.shape[0]:
            raise ValueError(
                f"extra[{key!r}] must have one entry per row of X ({X.shape[0]}), "
                f"got shape {a.shape}"
            )
        _check_finite(f"extra[{key!r}]", a)
        checked[str(key)] = a
    return X, y, checked


def _check_n_clients(n_clients: Any) -> int:
    if isinstance(n_clients, bool) or not isinstance(n_clients, numbers.Integral):
        raise ValueError(f"n_clients must be a positive integer, got {n_clients!r}")
    if n_clients < 1:
        raise ValueError(f"n_clients must be >= 1, got {n_clients}")
    return int(n_clients)


def _part(
    X: np.ndarray, y: np.ndarray, extra: dict[str, np.ndarray] | None, idx: np.ndarray
) -> Part:
    idx = np.sort(np.asarray(idx, dtype=np.int64))
    if extra is None:
        return X[idx], y[idx]
    out = {"X": X[idx], "y": y[idx], "index": idx}
    out.update({k: v[idx] for k, v in extra.items()})
    return out


def _class_indices(y: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
    classes, inverse = np.unique(y, return_inverse=True)
    inverse = inverse.reshape(-1)
    return classes, [np.flatnonzero(inverse == c) for c in range(len(classes))]


# ---------------------------------------------------------------------------------------
# splitters


def split_stratified(
    X: Any,
    y: Any,
    n_clients: int,
    random_state: RandomState = None,
    extra: Mapping[str, Any] | None = None,
) -> list[Part]:
    """Split rows into ``n_clients`` parts of (nearly) equal size and equal class ratios.

    The rows of each class are shuffled; the classes are then laid end to end (in sorted
    label order) and the rows dealt round-robin to the clients, the deal continuing from
    one class to the next. Hence every client receives ``floor(n_c / n_clients)`` or
    ``ceil(n_c / n_clients)`` rows of each class ``c`` (class counts differ by at most one
    row between clients), and the part sizes differ by at most one row overall: the
    remainder rows of one class go to the clients that come next in the deal, so no
    client collects the remainders of every class. This is the "n folds with equal
    imbalance ratios" split of seed 000.

    Parameters
    ----------
    X : array_like, shape (n, d)
        Features.
    y : array_like, shape (n,)
        Class labels (any values; each distinct value is a class).
    n_clients : int
        Number of parts; at most the number of rows of the smallest class, so that every
        client holds every class.
    random_state : int, numpy.random.Generator or None
        Seed or generator of the shuffles.
    extra : mapping of str to array_like, optional
        Further per-row arrays (e.g. a sensitive attribute) split along; parts are then
        dicts (see the module docstring).

    Returns
    -------
    list
        ``n_clients`` tuples ``(X_k, y_k)`` (or dicts when ``extra`` is given).

    Raises
    ------
    ValueError
        If ``n_clients < 1``, ``n_clients`` exceeds the rows of a class, ``X`` and ``y``
        lengths differ, or an input contains NaN/inf.

    Examples
    --------
    >>> import numpy as np
    >>> from fedmodel.datasets import split_stratified
    >>> X, y = np.arange(20.0).reshape(10, 2), np.array([0] * 7 + [1] * 3)
    >>> [yk.tolist() for _, yk in split_stratified(X, y, 3, random_state=0)]
    [[0, 0, 0, 1], [0, 0, 1], [0, 0, 1]]
    """
    X, y, extra = _check_xy(X, y, extra)
    n_clients = _check_n_clients(n_clients)
    classes, per_class = _class_indices(y)
    for label, idx in zip(classes, per_class, strict=True):
        if len(idx) < n_clients:
            raise ValueError(
                f"n_clients={n_clients} exceeds the {len(idx)} rows of class {label!r}: "
                "a stratified split needs every class on every client"
            )
    rng = np.random.default_rng(random_state)
    order = np.concatenate([rng.permutation(idx) for idx in per_class])
    owner = np.arange(order.size) % n_clients
    return [_part(X, y, extra, order[owner == k]) for k in range(n_clients)]


def split_dirichlet(
    X: Any,
    y: Any,
    n_clients: int,
    alpha: float,
    random_state: RandomState = None,
    min_size: int = 1,
    extra: Mapping[str, Any] | None = None,
) -> list[Part]:
    """Label-skewed split: each class is spread over the clients by Dirichlet(alpha) shares.

    For every class (in sorted label order) the class's rows are shuffled, proportions
    ``p ~ Dirichlet(alpha, ..., alpha)`` over the ``n_clients`` clients are drawn, and the
    rows are cut at ``floor(cumsum(p) * n_c)``. Small ``alpha`` (e.g. 0.1) gives clients
    dominated by few classes; large ``alpha`` (e.g. 100) approaches an i.i.d. split. The
    whole draw is repeated (up to 100 times) until every client has at least
    ``min_size`` rows; if that never happens, the last draw is repaired by moving
    randomly chosen rows from the largest clients to the ones below ``min_size``.

    Parameters
    ----------
    X : array_like, shape (n, d)
        Features.
    y : array_like, shape (n,)
        Class labels.
    n_clients : int
        Number of parts (``n_clients * min_size`` must not exceed the number of rows).
    alpha : float
        Concentration of the Dirichlet distribution, > 0.
    random_state : int, numpy.random.Generator or None
        Seed or generator.
    min_size : int, default 1
        Minimum number of rows per client.
    extra : mapping of str to array_like, optional
        Further per-row arrays split along; parts are then dicts.

    Returns
    -------
    list
        ``n_clients`` tuples ``(X_k, y_k)`` (or dicts when ``extra`` is given).

    Raises
    ------
    ValueError
        If ``n_clients < 1``, ``alpha <= 0``, ``min_size < 0`` or too large, ``X`` and
        ``y`` lengths differ, or an input contains NaN/inf.

    Examples
    --------
    >>> import numpy as np
    >>> from fedmodel.datasets import split_dirichlet
    >>> X, y = np.zeros((100, 2)), np.repeat([0, 1], 50)
    >>> parts = split_dirichlet(X, y, n_clients=4, alpha=0.5, random_state=0)
    >>> sum(len(yk) for _, yk in parts), min(len(yk) for _, yk in parts) >= 1
    (100, True)
    """
    X, y, extra = _check_xy(X, y, extra)
    n_clients = _check_n_clients(n_clients)
    if isinstance(alpha, bool) or not isinstance(alpha, numbers.Real):
        raise ValueError(f"alpha must be a positive number, got {alpha!r}")
    if not (np.isfinite(alpha) and alpha > 0):
        raise ValueError(f"alpha must be > 0 and finite, got {alpha}")
    if isinstance(min_size, bool) or not isinstance(min_size, numbers.Integral) or min_size < 0:
        raise ValueError(f"min_size must be a non-negative integer, got {min_size!r}")
    n = X.shape[0]
    if n_clients * min_size > n:
        raise ValueError(
            f"min_size={min_size} is impossible: {n_clients} clients x {min_size} rows > {n} rows"
        )
    _, per_class = _class_indices(y)
    rng = np.random.default_rng(random_state)
    owner = np.empty(n, dtype=np.int64)
    for _ in range(_MAX_DIRICHLET_TRIES):
        for idx in per_class:
            idx = rng.permutation(idx)
            p = rng.dirichlet(np.full(n_clients, float(alpha)))
            if not np.all(np.isfinite(p)) or p.sum() <= 0:  # underflow for tiny alpha
                p = np.zeros(n_clients)
                p[rng.integers(n_clients)] = 1.0
            cuts = np.floor(np.cumsum(p)[:-1] * idx.size).astype(np.int64)
            cuts = np.clip(cuts, 0, idx.size)
            for k, piece in enumerate(np.split(idx, cuts)):
                owner[piece] = k
        sizes = np.bincount(owner, minlength=n_clients)
        if sizes.min() >= min_size:
            break
    else:
        _repair(owner, n_clients, min_size, rng)
    return [_part(X, y, extra, np.flatnonzero(owner == k)) for k in range(n_clients)]


def _repair(owner: np.ndarray, n_clients: int, min_size: int, rng: np.random.Generator) -> None:
    """Move random rows from the largest clients to those with fewer than min_size rows."""
    members = [list(rng.permutation(np.flatnonzero(owner == k))) for k in range(n_clients)]
    while True:
        sizes = np.array([len(m) for m in members])
        small = int(np.argmin(sizes))
        if sizes[small] >= min_size:
            break
        big = int(np.argmax(sizes))
        row = members[big].pop()
        members[small].append(row)
        owner[row] = small


def split_server(
    X: Any,
    y: Any,
    fraction: float,
    random_state: RandomState = None,
    stratify: bool = True,
    extra: Mapping[str, Any] | None = None,
) -> tuple[Part, Part]:
    """Hold out a server-side part, e.g. the server's public data of a fairness constraint.

    The server part has ``round(fraction * n)`` rows (halves rounded up). With
    ``stratify=True`` each class contributes ``fraction`` of its rows, rounded by the
    largest-remainder rule so that the total is exact (each class's share is within one
    row of ``fraction * n_c``); otherwise rows are drawn uniformly. Seed 000 (Table 3)
    gives the server the *test* set instead: with :func:`~fedmodel.datasets.load_adult`
    use ``ds.X_test``, ``ds.y_test``, ``ds.sensitive_test`` directly and split ``ds.X``
    among the clients.

    Parameters
    ----------
    X : array_like, shape (n, d)
        Features.
    y : array_like, shape (n,)
        Labels.
    fraction : float
        Share of the rows for the server, in (0, 1).
    random_state : int, numpy.random.Generator or None
        Seed or generator.
    stratify : bool, default True
        Keep the class ratios in both parts.
    extra : mapping of str to array_like, optional
        Further per-row arrays split along; parts are then dicts.

    Returns
    -------
    (client_part, server_part)
        Each a tuple ``(X, y)`` (or a dict when ``extra`` is given).

    Raises
    ------
    ValueError
        If ``fraction`` is not in (0, 1) or leaves a part empty, ``X`` and ``y`` lengths
        differ, or an input contains NaN/inf.

    Examples
    --------
    >>> import numpy as np
    >>> from fedmodel.datasets import split_server
    >>> X, y = np.zeros((10, 2)), np.array([0] * 6 + [1] * 4)
    >>> (Xc, yc), (Xs, ys) = split_server(X, y, fraction=0.5, random_state=0)
    >>> len(yc), len(ys), int(ys.sum())
    (5, 5, 2)
    """
    X, y, extra = _check_xy(X, y, extra)
    if isinstance(fraction, bool) or not isinstance(fraction, numbers.Real):
        raise ValueError(f"fraction must be a number in (0, 1), got {fraction!r}")
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"fraction must be in (0, 1), got {fraction}")
    n = X.shape[0]
    n_server = int(np.floor(fraction * n + 0.5))
    if n_server < 1 or n_server > n - 1:
        raise ValueError(
            f"fraction={fraction} of {n} rows leaves an empty part ({n_server} server rows)"
        )
    rng = np.random.default_rng(random_state)
    if stratify:
        _, per_class = _class_indices(y)
        sizes = np.array([len(idx) for idx in per_class])
        exact = fraction * sizes
        quota = np.floor(exact).astype(np.int64)
        remainder = n_server - int(quota.sum())
        if remainder > 0:
            # largest fractional parts first; ties broken by class order (stable sort)
            order = np.argsort(-(exact - quota), kind="stable")
            quota[order[:remainder]] += 1
        server = np.concatenate(
            [rng.permutation(idx)[:q] for idx, q in zip(per_class, quota, strict=True)]
        ).astype(np.int64)
    else:
        server = rng.permutation(n)[:n_server]
    mask = np.zeros(n, dtype=bool)
    mask[server] = True
    return _part(X, y, extra, np.flatnonzero(~mask)), _part(X, y, extra, np.flatnonzero(mask))


def split_by_class(X: Any, y: Any) -> dict[Any, np.ndarray]:
    """Rows of ``X`` grouped by label, e.g. per-client class-0 and class-1 matrices.

    Parameters
    ----------
    X : array_like, shape (n, d)
        Features.
    y : array_like, shape (n,)
        Labels.

    Returns
    -------
    dict
        ``label -> X[y == label]`` (copies, original row order), labels in sorted order and
        as Python scalars.

    Raises
    ------
    ValueError
        If ``X`` and ``y`` lengths differ or an input contains NaN/inf.

    Examples
    --------
    >>> import numpy as np
    >>> from fedmodel.datasets import split_by_class
    >>> X, y = np.arange(8.0).reshape(4, 2), np.array([1, 0, 1, 1])
    >>> {k: v.shape for k, v in split_by_class(X, y).items()}
    {0: (1, 2), 1: (3, 2)}
    """
    X, y, _ = _check_xy(X, y)
    classes, per_class = _class_indices(y)
    return {
        (c.item() if hasattr(c, "item") else c): X[idx]
        for c, idx in zip(classes, per_class, strict=True)
    }
