"""The :class:`Dataset` container and the preprocessing helpers shared by the loaders."""

from __future__ import annotations

import gzip
import io
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

import numpy as np

__all__ = ["Dataset"]

_TASKS = ("binary", "multiclass", "regression")


@dataclass(frozen=True, eq=False)
class Dataset:
    """A bundled real data set, already turned into numeric arrays.

    Instances are returned by the ``load_*`` functions of :mod:`fedmodel.datasets`; every
    call builds fresh arrays, so modifying them in place never affects a later load.

    Parameters
    ----------
    name : str
        Short name, as accepted by :func:`fedmodel.datasets.load`.
    X : numpy.ndarray
        Feature matrix of the (training) part, shape ``(n, d)``, after the preprocessing
        described in :attr:`description`.
    y : numpy.ndarray
        Labels, shape ``(n,)``: ``0``/``1`` integers for binary tasks, integers for
        multi-class tasks, floats for regression.
    feature_names : list of str
        One name per column of ``X``; one-hot columns are named ``"attribute=value"`` and an
        appended constant column is named ``"intercept"``.
    sensitive : numpy.ndarray or None
        Sensitive attribute of each row (fairness data sets only), shape ``(n,)``.
    sensitive_name : str or None
        What :attr:`sensitive` encodes, e.g. ``"sex (1 = Female)"``.
    task : {"binary", "multiclass", "regression"}
        Learning task.
    description : str
        The preprocessing applied, in one paragraph.
    licence : str
        Licence of the data.
    source : str
        Where the data comes from.
    X_test, y_test, sensitive_test : numpy.ndarray or None
        Official test part (adult, monks), preprocessed with the training part's statistics
        and the same columns; ``None`` when the data set has no official test part.

    Examples
    --------
    >>> from fedmodel.datasets import load_breast_cancer
    >>> ds = load_breast_cancer()
    >>> ds.X.shape, ds.feature_names[-1]
    ((683, 10), 'intercept')
    """

    name: str
    X: np.ndarray
    y: np.ndarray
    feature_names: list[str]
    sensitive: np.ndarray | None
    sensitive_name: str | None
    task: str
    description: str
    licence: str
    source: str
    X_test: np.ndarray | None = None
    y_test: np.ndarray | None = None
    sensitive_test: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.task not in _TASKS:
            raise ValueError(f"task must be one of {_TASKS}, got {self.task!r}")
        if self.X.ndim != 2 or self.y.shape != (self.X.shape[0],):
            raise ValueError(f"{self.name}: X {self.X.shape} and y {self.y.shape} do not match")
        if len(self.feature_names) != self.X.shape[1]:
            raise ValueError(
                f"{self.name}: {len(self.feature_names)} feature names for "
                f"{self.X.shape[1]} columns"
            )
        if self.sensitive is not None and self.sensitive.shape != self.y.shape:
            raise ValueError(f"{self.name}: sensitive attribute has the wrong length")
        if (self.X_test is None) != (self.y_test is None):
            raise ValueError(f"{self.name}: X_test and y_test must be given together")
        if self.X_test is not None:
            if self.X_test.ndim != 2 or self.X_test.shape[1] != self.X.shape[1]:
                raise ValueError(f"{self.name}: X_test columns differ from X columns")
            if self.y_test.shape != (self.X_test.shape[0],):
                raise ValueError(f"{self.name}: X_test and y_test do not match")

    @property
    def n_samples(self) -> int:
        """Number of rows of the (training) part."""
        return int(self.X.shape[0])

    @property
    def n_features(self) -> int:
        """Number of columns of ``X`` (including the intercept column, if any)."""
        return int(self.X.shape[1])

    @property
    def has_test(self) -> bool:
        """Whether the data set comes with an official test part."""
        return self.X_test is not None

    def __repr__(self) -> str:
        parts = [f"{self.n_samples} rows x {self.n_features} features", _label_summary(self)]
        if self.X_test is not None:
            parts.append(f"test {self.X_test.shape[0]} rows")
        if self.sensitive_name is not None:
            parts.append(f"sensitive={self.sensitive_name!r}")
        return f"Dataset({self.name!r}, {self.task}: " + ", ".join(parts) + ")"


def _label_summary(ds: Dataset) -> str:
    y = ds.y
    if ds.task == "regression":
        return f"y mean {float(np.mean(y)):.4g}, std {float(np.std(y)):.4g}"
    labels, counts = np.unique(y, return_counts=True)
    if ds.task == "binary":
        return f"y=1: {int(counts[labels == 1].sum())} ({float(np.mean(y == 1)):.1%})"
    return f"{len(labels)} classes, {int(counts.min())}-{int(counts.max())} rows each"


# ---------------------------------------------------------------------------------------
# package data access


def _data_path(filename: str) -> Any:
    """A traversable pointing at ``fedmodel/datasets/data/<filename>``."""
    return resources.files(__package__).joinpath("data", filename)


def _read_bytes(filename: str) -> bytes:
    raw = _data_path(filename).read_bytes()
    return gzip.decompress(raw) if filename.endswith(".gz") else raw


def _read_text(filename: str) -> str:
    return _read_bytes(filename).decode("utf-8")


def _read_npz(filename: str) -> dict[str, np.ndarray]:
    with np.load(io.BytesIO(_read_bytes(filename)), allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


# ---------------------------------------------------------------------------------------
# design matrix assembly


@dataclass
class _Col:
    """One raw attribute: numeric values, or categorical strings to encode."""

    name: str
    train: np.ndarray
    test: np.ndarray | None = None
    categorical: bool = False
    categories: Sequence[str] | None = None  # None: sorted values seen in the training part


def _design(
    cols: list[_Col],
    *,
    standardize: bool,
    intercept: bool,
    one_hot: bool | str,
    dtype: Any,
) -> tuple[np.ndarray, np.ndarray | None, list[str], list[str]]:
    """Assemble the feature matrices of the training (and test) part.

    Categorical columns become one indicator column per category (``one_hot=True``, no
    category dropped) or the integer index of the category (``one_hot=False``); categories
    come from ``_Col.categories`` or, if not given, from the training part (a test value
    unseen in training gets all-zero indicators, resp. code ``-1``). Numeric columns, and
    categorical codes when ``one_hot=False``, are standardized with the training part's
    mean and (population) standard deviation when ``standardize=True``; a column that is
    constant on the training part is only centred. Indicator columns are never scaled.

    ``one_hot="drop_first"`` drops each attribute's first (sorted) category, the usual
    reference coding: with an intercept the design then has full column rank, which keeps
    logistic models strongly convex (no flat directions) and their solutions unique.

    Returns ``(X, X_test, feature_names, standardized_names)``.
    """
    if one_hot not in (True, False, "drop_first"):
        raise ValueError(f"one_hot must be True, False or 'drop_first', got {one_hot!r}")
    has_test = cols[0].test is not None
    blocks: list[np.ndarray] = []
    blocks_test: list[np.ndarray] = []
    names: list[str] = []
    scaled: list[str] = []
    for col in cols:
        if col.categorical:
            cats = list(col.categories) if col.categories is not None else sorted(set(col.train))
            index = {c: i for i, c in enumerate(cats)}
            unknown = set(col.train) - set(cats)
            if unknown:
                raise ValueError(f"column {col.name!r}: values {sorted(unknown)} not in categories")
            codes = np.array([index[v] for v in col.train], dtype=np.int64)
            codes_t = (
                np.array([index.get(v, -1) for v in col.test], dtype=np.int64) if has_test else None
            )
            if one_hot:
                eye = np.eye(len(cats))
                keep = slice(1, None) if one_hot == "drop_first" else slice(None)
                blocks.append(eye[codes][:, keep])
                if has_test:
                    blocks_test.append(
                        np.where((codes_t >= 0)[:, None], eye[codes_t], 0.0)[:, keep]
                    )
                names.extend(f"{col.name}={c}" for c in cats[keep])
                continue
            values, values_t = codes.astype(np.float64), codes_t
        else:
            values, values_t = np.asarray(col.train, dtype=np.float64), col.test
        values_t = None if values_t is None else np.asarray(values_t, dtype=np.float64)
        if standardize:
            mean, std = values.mean(), values.std()
            std = std if std > 0 else 1.0
            values = (values - mean) / std
            if values_t is not None:
                values_t = (values_t - mean) / std
            scaled.append(col.name)
        blocks.append(values[:, None])
        if has_test:
            blocks_test.append(values_t[:, None])
        names.append(col.name)
    if intercept:
        blocks.append(np.ones((len(cols[0].train), 1)))
        if has_test:
            blocks_test.append(np.ones((len(cols[0].test), 1)))
        names.append("intercept")
    X = np.ascontiguousarray(np.hstack(blocks), dtype=dtype)
    X_test = np.ascontiguousarray(np.hstack(blocks_test), dtype=dtype) if has_test else None
    return X, X_test, names, scaled


def _options_text(*, standardize: bool, intercept: bool, one_hot: bool | None = None) -> str:
    """One sentence describing the common keyword options, for ``Dataset.description``."""
    bits = []
    if one_hot == "drop_first":
        bits.append(
            "categorical attributes one-hot encoded with the first category dropped "
            "(reference coding)"
        )
    elif one_hot is True:
        bits.append(
            "categorical attributes one-hot encoded (one column per category, none dropped)"
        )
    elif one_hot is False:
        bits.append("categorical attributes coded as the integer index of their category")
    if standardize:
        bits.append(
            "numeric columns standardized to zero mean and unit (population) variance "
            "with the training part's statistics"
        )
    else:
        bits.append("numeric columns left unscaled")
    bits.append("a final all-ones column 'intercept' appended" if intercept else "no intercept")
    return "; ".join(bits) + "."


def _check_dtype(dtype: Any) -> np.dtype:
    dt = np.dtype(dtype)
    if dt.kind != "f":
        raise ValueError(f"dtype must be a floating type, got {dt}")
    return dt
