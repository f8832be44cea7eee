"""Loaders of the real data sets bundled in ``fedmodel/datasets/data``.

Every loader reads only the package's own compressed copies (see ``data/PROVENANCE.md``),
never the network, and returns a :class:`~fedmodel.datasets.Dataset`. Common keyword
options, where meaningful:

``standardize`` (default ``True``)
    Numeric columns to zero mean and unit population variance, with the statistics of the
    training part (also applied to the official test part, if any). One-hot indicator
    columns are never scaled; a column constant on the training part is only centred.
``intercept`` (default ``True``)
    Append a final column of ones named ``"intercept"``.
``one_hot`` (default ``True``)
    Encode each categorical attribute as one indicator column per category, dropping none
    (so, with an intercept, each group of indicators is collinear with the intercept; add
    a little regularisation or drop a column yourself if that matters). With
    ``one_hot=False`` a categorical attribute becomes the integer index of its category
    (in the order listed in the loader's docstring), which is then standardized like a
    numeric column.
``dtype`` (default ``numpy.float64``)
    Floating dtype of the feature matrices.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Any

import numpy as np

from ._base import Dataset, _check_dtype, _Col, _design, _options_text, _read_npz, _read_text

__all__ = [
    "load",
    "list_datasets",
    "load_breast_cancer",
    "load_breast_cancer_wisconsin_original",
    "load_monks",
    "load_adult",
    "load_compas",
    "load_communities",
    "load_german",
    "load_mnist",
    "load_wine_quality",
    "load_abalone",
    "load_diabetes",
]

_UCI = "CC BY 4.0 (UCI Machine Learning Repository)"


def _frozen(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


# ---------------------------------------------------------------------------------------
# breast cancer


_BC_NAMES = [
    "clump_thickness",
    "uniformity_cell_size",
    "uniformity_cell_shape",
    "marginal_adhesion",
    "single_epithelial_cell_size",
    "bare_nuclei",
    "bland_chromatin",
    "normal_nucleoli",
    "mitoses",
]


@lru_cache(maxsize=1)
def _raw_breast_cancer() -> tuple[np.ndarray, np.ndarray, int]:
    rows = list(csv.reader(io.StringIO(_read_text("breast-cancer-wisconsin.data.gz"))))
    header, rows = rows[0], [r for r in rows[1:] if r]
    if header != ["id", "a", "b", "c", "d", "e", "f", "g", "h", "i", "class"]:
        raise RuntimeError(f"unexpected breast-cancer header {header}")
    complete = [r for r in rows if "?" not in r]
    values = np.array([[float(v) for v in r[1:10]] for r in complete])
    label = np.array([r[10] for r in complete])
    y = (label == "4").astype(np.int64)
    return _frozen(values), _frozen(y), len(rows)


def load_breast_cancer_wisconsin_original(
    *, standardize: bool = True, intercept: bool = True, dtype: Any = np.float64
) -> Dataset:
    """UCI Breast Cancer Wisconsin (Original): 683 complete rows, 9 cytology features.

    This is the *Original* data set (Wolberg 1992: cytology scores 1-10), not the
    *Diagnostic* one (569 rows, 30 real-valued nucleus features) that scikit-learn's
    ``sklearn.datasets.load_breast_cancer`` returns; :func:`load_breast_cancer` is an alias
    of this function.

    The 699 rows of the original file lose the 16 rows with a missing value (``?``, all in
    *bare nuclei*), leaving 683 rows (444 benign, 239 malignant). The sample ``id`` column
    is dropped; the nine attributes (integers 1-10) are treated as numeric. Label:
    malignant (class 4) = 1, benign (class 2) = 0. With the defaults ``X`` has
    9 + 1 = **10 columns** (the seed paper's 20 comes from an unspecified preprocessing).

    Parameters
    ----------
    standardize : bool, default True
        Standardize the nine attributes (zero mean, unit population variance).
    intercept : bool, default True
        Append a final column of ones named ``"intercept"``.
    dtype : numpy floating dtype, default numpy.float64
        dtype of ``X``.

    Returns
    -------
    Dataset
        ``task="binary"``, no test part, no sensitive attribute.

    Examples
    --------
    >>> from fedmodel.datasets import load_breast_cancer_wisconsin_original
    >>> ds = load_breast_cancer_wisconsin_original()
    >>> ds.X.shape, int(ds.y.sum())
    ((683, 10), 239)
    """
    dtype = _check_dtype(dtype)
    values, y, n_raw = _raw_breast_cancer()
    cols = [_Col(n, values[:, j]) for j, n in enumerate(_BC_NAMES)]
    X, _, names, _ = _design(
        cols, standardize=standardize, intercept=intercept, one_hot=False, dtype=dtype
    )
    desc = (
        f"UCI Breast Cancer Wisconsin (Original). {n_raw} rows read, the {n_raw - len(y)} rows "
        f"with a missing value ('?') dropped, leaving {len(y)}; sample id dropped; the nine "
        "integer cytology attributes (1-10) treated as numeric; label malignant (class 4) = 1, "
        "benign (class 2) = 0; " + _options_text(standardize=standardize, intercept=intercept)
    )
    return Dataset(
        name="breast_cancer",
        X=X,
        y=y.copy(),
        feature_names=names,
        sensitive=None,
        sensitive_name=None,
        task="binary",
        description=desc,
        licence=_UCI,
        source="UCI Breast Cancer Wisconsin (Original), W. H. Wolberg, University of Wisconsin "
        "Hospitals (1992); https://doi.org/10.24432/C5HP4Z",
    )


def load_breast_cancer(
    *, standardize: bool = True, intercept: bool = True, dtype: Any = np.float64
) -> Dataset:
    """Alias of :func:`load_breast_cancer_wisconsin_original`: the UCI Breast Cancer
    Wisconsin **Original** data, 683 rows x 10 columns (9 cytology scores and an
    intercept), not scikit-learn's ``load_breast_cancer`` (the *Diagnostic* data, 569 rows
    x 30 features).

    Examples
    --------
    >>> from fedmodel.datasets import load_breast_cancer
    >>> load_breast_cancer().X.shape
    (683, 10)
    """
    return load_breast_cancer_wisconsin_original(
        standardize=standardize, intercept=intercept, dtype=dtype
    )


# ---------------------------------------------------------------------------------------
# monks


def _parse_arff(text: str) -> tuple[list[str], list[list[str]], list[list[str]]]:
    names: list[str] = []
    domains: list[list[str]] = []
    rows: list[list[str]] = []
    in_data = False
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("%"):
            continue
        low = line.lower()
        if low.startswith("@attribute"):
            _, name, dom = line.split(None, 2)
            names.append(name)
            domains.append([d.strip() for d in dom.strip().strip("{}").split(",")])
        elif low.startswith("@data"):
            in_data = True
        elif in_data:
            rows.append([v.strip() for v in line.split(",")])
    return names, domains, rows


@lru_cache(maxsize=1)
def _raw_monks1() -> tuple[list[str], list[list[str]], list[list[str]], list[list[str]]]:
    names, domains, train = _parse_arff(_read_text("monks-1.train.gz"))
    names_t, _, test = _parse_arff(_read_text("monks-1.test.gz"))
    if names != names_t or names[0] != "class":
        raise RuntimeError("unexpected monks-1 ARFF headers")
    return names, domains, train, test


def load_monks(
    problem: int = 1,
    *,
    one_hot: bool = True,
    standardize: bool = True,
    intercept: bool = True,
    dtype: Any = np.float64,
) -> Dataset:
    """UCI MONK's problem 1: 124 training rows, 432 test rows, 6 categorical attributes.

    The six attributes (``head_shape`` 1-3, ``body_shape`` 1-3, ``is_smilling`` 1-2 (the
    ARFF file's spelling), ``holding`` 1-3, ``jacket_color`` 1-4, ``has_tie`` 1-2) are
    one-hot encoded over the full domains declared in the ARFF header, so the training
    and test parts always have the same columns. With the defaults ``X`` and ``X_test``
    have 17 + 1 = **18 columns** (the seed paper's 21 comes from an unspecified
    preprocessing). Label: the ARFF ``class`` column (0/1); the training part has 62
    positives, the test part 216.

    Parameters
    ----------
    problem : int, default 1
        MONK's problem number; only problem 1 is bundled.
    one_hot : bool, default True
        One-hot encode the attributes; if False, keep each attribute's value (1, 2, ...) as
        a numeric column (then standardized if ``standardize``).
    standardize : bool, default True
        Standardize numeric columns (only relevant with ``one_hot=False``: indicator columns
        are never scaled).
    intercept : bool, default True
        Append a final column of ones named ``"intercept"``.
    dtype : numpy floating dtype, default numpy.float64
        dtype of ``X`` and ``X_test``.

    Returns
    -------
    Dataset
        ``task="binary"`` with ``X_test``/``y_test`` (the official test part).

    Examples
    --------
    >>> from fedmodel.datasets import load_monks
    >>> ds = load_monks()
    >>> ds.X.shape, ds.X_test.shape
    ((124, 18), (432, 18))
    """
    if problem != 1:
        raise ValueError(f"problem must be 1 (only MONK's problem 1 is bundled), got {problem!r}")
    dtype = _check_dtype(dtype)
    names, domains, train, test = _raw_monks1()
    cols = []
    for j in range(1, len(names)):
        tr = [r[j] for r in train]
        te = [r[j] for r in test]
        if one_hot:
            cols.append(_Col(names[j], tr, te, categorical=True, categories=domains[j]))
        else:
            cols.append(_Col(names[j], np.array(tr, float), np.array(te, float)))
    X, X_test, fnames, _ = _design(
        cols, standardize=standardize, intercept=intercept, one_hot=one_hot, dtype=dtype
    )
    y = np.array([int(r[0]) for r in train], dtype=np.int64)
    y_test = np.array([int(r[0]) for r in test], dtype=np.int64)
    coding = (
        "one-hot encoded over the domains declared in the ARFF header (one column per value, "
        "none dropped), so training and test columns are identical"
        if one_hot
        else "kept as their numeric values (1, 2, ...)"
    )
    desc = (
        f"UCI MONK's problem 1, official split: {len(y)} training rows and {len(y_test)} test "
        f"rows. The six categorical attributes are {coding}; label = the ARFF 'class' column; "
        + _options_text(standardize=standardize, intercept=intercept)
    )
    return Dataset(
        name="monks",
        X=X,
        y=y,
        feature_names=fnames,
        sensitive=None,
        sensitive_name=None,
        task="binary",
        description=desc,
        licence=_UCI,
        source="UCI MONK's Problems, S. Thrun et al. (1991); https://doi.org/10.24432/C5R30R",
        X_test=X_test,
        y_test=y_test,
    )


# ---------------------------------------------------------------------------------------
# adult


_ADULT_COLS = [
    ("age", False),
    ("workclass", True),
    ("fnlwgt", False),
    ("education", True),
    ("education-num", False),
    ("marital-status", True),
    ("occupation", True),
    ("relationship", True),
    ("race", True),
    ("sex", True),
    ("capital-gain", False),
    ("capital-loss", False),
    ("hours-per-week", False),
    ("native-country", True),
]


def _parse_adult(text: str) -> tuple[list[list[str]], int]:
    rows = []
    n_read = 0
    for line in text.splitlines():
        if not line.strip() or line.startswith("|"):
            continue
        n_read += 1
        r = [v.strip() for v in line.split(",")]
        if len(r) != 15:
            raise RuntimeError(f"adult: malformed line {line!r}")
        if "?" in r:
            continue
        r[14] = r[14].rstrip(".")
        rows.append(r)
    return rows, n_read


@lru_cache(maxsize=1)
def _raw_adult() -> tuple[list[list[str]], int, list[list[str]], int]:
    train, n_train = _parse_adult(_read_text("adult.data.gz"))
    test, n_test = _parse_adult(_read_text("adult.test.gz"))
    return train, n_train, test, n_test


def load_adult(
    *,
    one_hot: bool = True,
    standardize: bool = True,
    intercept: bool = True,
    drop_fnlwgt: bool = True,
    drop_sensitive: bool = False,
    drop: Sequence[str] = (),
    dtype: Any = np.float64,
) -> Dataset:
    """UCI Adult (census income), official train/test split, rows with '?' removed.

    ``adult.data`` has 32,561 rows and ``adult.test`` 16,281 (its first line, a comment,
    is skipped and its labels' trailing ``.`` stripped); dropping every row with a missing
    value (``?``) leaves **30,162 training rows and 15,060 test rows**. Label: income
    ``>50K`` = 1 (7,508 training positives, 24.9 %; 3,700 test positives).

    Features: numeric ``age``, ``education-num``, ``capital-gain``, ``capital-loss``,
    ``hours-per-week`` (and ``fnlwgt`` if ``drop_fnlwgt=False``; it is a census sampling
    weight, not an attribute of the person, so it is dropped by default); categorical
    ``workclass`` (7 categories), ``education`` (16), ``marital-status`` (7),
    ``occupation`` (14), ``relationship`` (6), ``race`` (5), ``sex`` (2),
    ``native-country`` (41), one-hot encoded with the categories seen in the training part
    (sorted; every test category also occurs in training, ``Holand-Netherlands`` occurs
    only in training, so train and test columns are identical). With the defaults ``X``
    has 5 + 98 + 1 = **104 columns** (105 with ``fnlwgt``, 102 with ``drop_sensitive=True``, 14 with
    ``one_hot=False``).
    ``education-num`` is a relabelling of ``education`` and is kept as in the raw data.

    Sensitive attribute: ``sex``, coded 1 = Female, 0 = Male (9,782 women in the training
    part). Its indicator columns stay in ``X`` unless ``drop_sensitive=True``.

    Parameters
    ----------
    one_hot : bool, default True
        One-hot encode the categorical attributes (no category dropped).
    standardize : bool, default True
        Standardize the numeric columns with the training part's mean/std (also applied to
        ``X_test``).
    intercept : bool, default True
        Append a final column of ones named ``"intercept"``.
    drop_fnlwgt : bool, default True
        Leave out the ``fnlwgt`` sampling weight.
    drop_sensitive : bool, default False
        Leave ``sex`` out of ``X`` (it is still returned in ``sensitive``).
    drop : sequence of str, default ()
        Further attributes to leave out of ``X`` (names as in ``adult.names``, e.g.
        ``("education", "relationship", "native-country")``). Dropping ``sex`` here is the
        same as ``drop_sensitive=True``.
    dtype : numpy floating dtype, default numpy.float64
        dtype of ``X`` and ``X_test``.

    Returns
    -------
    Dataset
        ``task="binary"`` with ``X_test``, ``y_test``, ``sensitive_test``. For a
        server-held public part (seed 000, Table 3) use ``X_test`` directly.

    Examples
    --------
    >>> from fedmodel.datasets import load_adult
    >>> ds = load_adult()
    >>> ds.X.shape, ds.X_test.shape, ds.sensitive_name
    ((30162, 104), (15060, 104), 'sex (1 = Female, 0 = Male)')
    """
    dtype = _check_dtype(dtype)
    known = [name for name, _ in _ADULT_COLS]
    unknown = [name for name in drop if name not in known]
    if isinstance(drop, str) or unknown:
        raise ValueError(f"adult: drop must name attributes among {known}, got {drop!r}")
    drop_sensitive = drop_sensitive or "sex" in drop
    train, n_train, test, n_test = _raw_adult()
    cols = []
    for j, (name, categorical) in enumerate(_ADULT_COLS):
        if (name == "fnlwgt" and drop_fnlwgt) or (name == "sex" and drop_sensitive):
            continue
        if name in drop:
            continue
        tr = [r[j] for r in train]
        te = [r[j] for r in test]
        if categorical:
            cols.append(_Col(name, tr, te, categorical=True))
        else:
            cols.append(_Col(name, np.array(tr, float), np.array(te, float)))
    X, X_test, names, _ = _design(
        cols, standardize=standardize, intercept=intercept, one_hot=one_hot, dtype=dtype
    )
    y = np.array([r[14] == ">50K" for r in train], dtype=np.int64)
    y_test = np.array([r[14] == ">50K" for r in test], dtype=np.int64)
    s = np.array([r[9] == "Female" for r in train], dtype=np.int64)
    s_test = np.array([r[9] == "Female" for r in test], dtype=np.int64)
    desc = (
        f"UCI Adult, official split: {n_train} training and {n_test} test rows read (the test "
        "file's comment line skipped, its labels' trailing '.' stripped); rows with any missing "
        f"value ('?') dropped, leaving {len(y)} training and {len(y_test)} test rows; label "
        "income >50K = 1; "
        + ("fnlwgt dropped; " if drop_fnlwgt else "fnlwgt kept; ")
        + ("sex left out of X; " if drop_sensitive else "sex kept in X; ")
        + "".join(f"{name} left out of X; " for name in drop if name != "sex")
        + "sensitive attribute sex (1 = Female); categories taken from the training part; "
        + _options_text(standardize=standardize, intercept=intercept, one_hot=one_hot)
    )
    return Dataset(
        name="adult",
        X=X,
        y=y,
        feature_names=names,
        sensitive=s,
        sensitive_name="sex (1 = Female, 0 = Male)",
        task="binary",
        description=desc,
        licence=_UCI,
        source="UCI Adult, B. Becker and R. Kohavi (1996); https://doi.org/10.24432/C5XW20",
        X_test=X_test,
        y_test=y_test,
        sensitive_test=s_test,
    )


# ---------------------------------------------------------------------------------------
# compas


_COMPAS_NUMERIC = ["age", "priors_count", "juv_fel_count", "juv_misd_count", "juv_other_count"]
_COMPAS_CATEGORICAL = ["sex", "age_cat", "race", "c_charge_degree"]
_COMPAS_RACES = (
    "African-American",
    "Asian",
    "Caucasian",
    "Hispanic",
    "Native American",
    "Other",
)


@lru_cache(maxsize=1)
def _raw_compas() -> tuple[list[str], list[list[str]]]:
    rows = list(csv.reader(io.StringIO(_read_text("compas-scores-two-years.csv.gz"))))
    return rows[0], [r for r in rows[1:] if r]


def load_compas(
    *,
    one_hot: bool = True,
    standardize: bool = True,
    intercept: bool = True,
    propublica_filter: bool = True,
    races: Sequence[str] | None = None,
    drop_sensitive: bool = False,
    dtype: Any = np.float64,
) -> Dataset:
    """ProPublica COMPAS two-year recidivism data (``compas-scores-two-years.csv``).

    Rows: the file's 7,214 rows, reduced by ProPublica's own filter
    (``propublica_filter=True``: ``-30 <= days_b_screening_arrest <= 30``,
    ``is_recid != -1``, ``c_charge_degree != "O"``, ``score_text != "N/A"``) to **6,172
    rows**. ``races=("African-American", "Caucasian")`` further keeps those two groups only,
    giving the 5,278 rows of seed 002 (Table I); categories are those of the rows kept, so
    that version has 2 race columns (15 columns in all).

    Label: ``two_year_recid`` (1 = re-offended within two years; 45.5 % of the 6,172 rows).
    Features: numeric ``age``, ``priors_count``, ``juv_fel_count``, ``juv_misd_count``,
    ``juv_other_count``; categorical ``sex`` (Female, Male), ``age_cat`` (3 bands),
    ``race`` (6 groups: African-American, Asian, Caucasian, Hispanic, Native American,
    Other) and ``c_charge_degree`` (F = felony, M = misdemeanour), one-hot encoded. The
    COMPAS scores themselves (``decile_score``, ``score_text``, ...), identifiers, dates
    and the outcome-derived columns are not used. With the defaults ``X`` has
    5 + 13 + 1 = **19 columns** (13 with ``drop_sensitive=True``; seed 002 reports 26 via
    an unspecified preprocessing).

    Sensitive attribute: race, coded 1 = African-American, 0 = any other race (3,175 of
    the 6,172 rows). The race indicators stay in ``X`` unless ``drop_sensitive=True``.

    Parameters
    ----------
    one_hot : bool, default True
        One-hot encode the categorical attributes (no category dropped).
    standardize : bool, default True
        Standardize the numeric columns.
    intercept : bool, default True
        Append a final column of ones named ``"intercept"``.
    propublica_filter : bool, default True
        Apply ProPublica's row filter (see above); if False, all 7,214 rows are kept.
    races : sequence of str, optional
        Keep only rows of these races (names as in the file's ``race`` column).
    drop_sensitive : bool, default False
        Leave ``race`` out of ``X`` (it is still returned in ``sensitive``).
    dtype : numpy floating dtype, default numpy.float64
        dtype of ``X``.

    Returns
    -------
    Dataset
        ``task="binary"``, no official test part.

    Examples
    --------
    >>> from fedmodel.datasets import load_compas
    >>> ds = load_compas(races=("African-American", "Caucasian"))
    >>> ds.X.shape, int(ds.sensitive.sum())
    ((5278, 15), 3175)
    """
    dtype = _check_dtype(dtype)
    header, rows = _raw_compas()
    col = {}
    for j, h in enumerate(header):  # the file repeats some names; use the first occurrence
        col.setdefault(h, j)
    n_raw = len(rows)
    if propublica_filter:

        def keep(r: list[str]) -> bool:
            d = r[col["days_b_screening_arrest"]]
            return (
                d != ""
                and -30 <= float(d) <= 30
                and r[col["is_recid"]] != "-1"
                and r[col["c_charge_degree"]] != "O"
                and r[col["score_text"]] not in ("N/A", "")
            )

        rows = [r for r in rows if keep(r)]
    n_filtered = len(rows)
    if races is not None:
        if isinstance(races, str):
            races = (races,)
        unknown = sorted(set(races) - set(_COMPAS_RACES))
        if unknown:
            raise ValueError(f"races: unknown race(s) {unknown}; known: {list(_COMPAS_RACES)}")
        rows = [r for r in rows if r[col["race"]] in set(races)]
        if not rows:
            raise ValueError("races: no row left")
    cols = [_Col(n, np.array([r[col[n]] for r in rows], float)) for n in _COMPAS_NUMERIC]
    for n in _COMPAS_CATEGORICAL:
        if n == "race" and drop_sensitive:
            continue
        cols.append(_Col(n, [r[col[n]] for r in rows], categorical=True))
    X, _, names, _ = _design(
        cols, standardize=standardize, intercept=intercept, one_hot=one_hot, dtype=dtype
    )
    y = np.array([int(r[col["two_year_recid"]]) for r in rows], dtype=np.int64)
    s = np.array([r[col["race"]] == "African-American" for r in rows], dtype=np.int64)
    desc = (
        f"ProPublica COMPAS two-year data: {n_raw} rows read"
        + (
            f", ProPublica's filter (-30 <= days_b_screening_arrest <= 30, is_recid != -1, "
            f"c_charge_degree != 'O', score_text != 'N/A') leaves {n_filtered}"
            if propublica_filter
            else ", no row filter"
        )
        + (f", races {list(races)} kept: {len(rows)} rows" if races is not None else "")
        + "; label two_year_recid; features age, priors_count, juv_fel_count, juv_misd_count, "
        "juv_other_count, sex, age_cat, c_charge_degree"
        + (", race" if not drop_sensitive else " (race left out of X)")
        + "; COMPAS scores not used; sensitive attribute race (1 = African-American, 0 = other); "
        "categories taken from the rows kept; "
        + _options_text(standardize=standardize, intercept=intercept, one_hot=one_hot)
    )
    return Dataset(
        name="compas",
        X=X,
        y=y,
        feature_names=names,
        sensitive=s,
        sensitive_name="race (1 = African-American, 0 = other)",
        task="binary",
        description=desc,
        licence="ProPublica data, published for analysis with the article "
        "'How we analyzed the COMPAS recidivism algorithm' (2016); no explicit licence",
        source="ProPublica, https://github.com/propublica/compas-analysis "
        "(compas-scores-two-years.csv)",
    )


# ---------------------------------------------------------------------------------------
# communities and crime


@lru_cache(maxsize=1)
def _raw_communities() -> tuple[list[str], np.ndarray, int]:
    lines = [ln for ln in _read_text("communities.data.gz").splitlines() if ln.strip()]
    header = [h.strip() for h in lines[0].split("\t")]
    cells = [[v.strip() for v in ln.split("\t")] for ln in lines[1:]]
    values = np.array([[np.nan if v == "?" else float(v) for v in r] for r in cells])
    n_missing = int(np.isnan(values).sum())
    col_means = np.nanmean(values, axis=0)
    values = np.where(np.isnan(values), col_means, values)
    return header, _frozen(values), n_missing


def load_communities(
    *,
    threshold: float | None = 0.375,
    standardize: bool = True,
    intercept: bool = True,
    drop_sensitive: bool = True,
    dtype: Any = np.float64,
) -> Dataset:
    """UCI Communities and Crime (cleaned copy): 1,994 communities, 100 attributes.

    The bundled copy has the 100 predictive attributes of the UCI data (already normalised
    to [0, 1] by UCI) plus the target ``ViolentCrimesPerPop``; the columns with many missing
    values were removed upstream. One value is missing (``OtherPerCap`` of one row) and is
    replaced by the mean of that column over the other 1,993 rows.

    Label: ``ViolentCrimesPerPop > threshold`` = 1 (seed 002 uses 0.375: 413 positives,
    20.7 %); ``threshold=None`` returns the continuous target (``task="regression"``).

    Sensitive attribute: ``racepctblack`` (percentage of the population that is
    African-American, normalised to [0, 1]) returned **as its value** in ``sensitive``; it
    is **removed from X** (unless ``drop_sensitive=False``). Seed 002 forms groups by
    ``racepctblack > 0.06`` (970 of the 1,994 rows): ``ds.sensitive > 0.06``. With the
    defaults ``X`` has 99 + 1 = **100 columns** (seed 002: 99 features, no intercept).

    Parameters
    ----------
    threshold : float or None, default 0.375
        Binarisation threshold for ``ViolentCrimesPerPop``; None for regression.
    standardize : bool, default True
        Standardize the attributes.
    intercept : bool, default True
        Append a final column of ones named ``"intercept"``.
    drop_sensitive : bool, default True
        Remove ``racepctblack`` from ``X``.
    dtype : numpy floating dtype, default numpy.float64
        dtype of ``X``.

    Returns
    -------
    Dataset
        ``task="binary"`` (or ``"regression"``), no official test part.

    Examples
    --------
    >>> from fedmodel.datasets import load_communities
    >>> ds = load_communities()
    >>> ds.X.shape, "racepctblack" in ds.feature_names, ds.sensitive.shape
    ((1994, 100), False, (1994,))
    """
    dtype = _check_dtype(dtype)
    header, values, n_missing = _raw_communities()
    target = header.index("ViolentCrimesPerPop")
    sens = header.index("racepctblack")
    cols = [
        _Col(h, values[:, j])
        for j, h in enumerate(header)
        if j != target and not (j == sens and drop_sensitive)
    ]
    X, _, names, _ = _design(
        cols, standardize=standardize, intercept=intercept, one_hot=False, dtype=dtype
    )
    raw_y = values[:, target]
    if threshold is None:
        y, task, lab = raw_y.copy(), "regression", "target ViolentCrimesPerPop (continuous)"
    else:
        y = (raw_y > threshold).astype(np.int64)
        task, lab = "binary", f"label ViolentCrimesPerPop > {threshold} = 1"
    desc = (
        f"UCI Communities and Crime, cleaned copy: {values.shape[0]} rows, "
        f"{values.shape[1] - 1} predictive attributes (normalised to [0, 1] upstream); "
        f"{n_missing} missing value (OtherPerCap) replaced by its column mean; {lab}; "
        "sensitive attribute racepctblack returned as its value"
        + (" and removed from X; " if drop_sensitive else " and also kept in X; ")
        + _options_text(standardize=standardize, intercept=intercept)
    )
    return Dataset(
        name="communities",
        X=X,
        y=y,
        feature_names=names,
        sensitive=values[:, sens].copy(),
        sensitive_name="racepctblack (fraction African-American, normalised to [0, 1])",
        task=task,
        description=desc,
        licence=_UCI,
        source="UCI Communities and Crime, M. Redmond (2009); https://doi.org/10.24432/C53W3X",
    )


# ---------------------------------------------------------------------------------------
# german credit


_GERMAN_COLS = [
    ("checking_status", True),
    ("duration", False),
    ("credit_history", True),
    ("purpose", True),
    ("credit_amount", False),
    ("savings", True),
    ("employment_since", True),
    ("installment_rate", False),
    ("personal_status_sex", True),
    ("other_debtors", True),
    ("residence_since", False),
    ("property", True),
    ("age", False),
    ("other_installment_plans", True),
    ("housing", True),
    ("existing_credits", False),
    ("job", True),
    ("num_dependents", False),
    ("telephone", True),
    ("foreign_worker", True),
]


@lru_cache(maxsize=1)
def _raw_german() -> list[list[str]]:
    rows = [ln.split() for ln in _read_text("german.data.gz").splitlines() if ln.strip()]
    if {len(r) for r in rows} != {21}:
        raise RuntimeError("german.data: expected 21 fields per line")
    return rows


def load_german(
    *,
    one_hot: bool = True,
    standardize: bool = True,
    intercept: bool = True,
    dtype: Any = np.float64,
) -> Dataset:
    """UCI Statlog German Credit (``german.data``): 1,000 applicants, 20 attributes.

    Label: bad credit risk = 1 (file class 2; 300 rows), good = 0 (file class 1; 700
    rows). Seven numeric attributes (``duration``, ``credit_amount``, ``installment_rate``,
    ``residence_since``, ``age``, ``existing_credits``, ``num_dependents``) and thirteen
    categorical ones, kept with their UCI codes (``A11``...) and one-hot encoded over the
    codes that occur (``purpose`` A47 and ``personal_status_sex`` A95 never occur and get no
    column), ordered by code number. With the defaults ``X`` has 7 + 54 + 1 = **62
    columns** (21 with ``one_hot=False``). No sensitive attribute is set
    (``personal_status_sex`` mixes sex and marital status; ``age`` is in ``X``).

    Parameters
    ----------
    one_hot : bool, default True
        One-hot encode the categorical attributes (no category dropped).
    standardize : bool, default True
        Standardize the numeric columns.
    intercept : bool, default True
        Append a final column of ones named ``"intercept"``.
    dtype : numpy floating dtype, default numpy.float64
        dtype of ``X``.

    Returns
    -------
    Dataset
        ``task="binary"``, no official test part.

    Examples
    --------
    >>> from fedmodel.datasets import load_german
    >>> ds = load_german()
    >>> ds.X.shape, int(ds.y.sum())
    ((1000, 62), 300)
    """
    dtype = _check_dtype(dtype)
    rows = _raw_german()
    cols = []
    for j, (name, categorical) in enumerate(_GERMAN_COLS):
        vals = [r[j] for r in rows]
        if categorical:
            cats = sorted(set(vals), key=lambda c: (len(c), c))
            cols.append(_Col(name, vals, categorical=True, categories=cats))
        else:
            cols.append(_Col(name, np.array(vals, float)))
    X, _, names, _ = _design(
        cols, standardize=standardize, intercept=intercept, one_hot=one_hot, dtype=dtype
    )
    y = np.array([r[20] == "2" for r in rows], dtype=np.int64)
    desc = (
        f"UCI Statlog German Credit: {len(rows)} rows, 7 numeric and 13 categorical attributes "
        "(UCI codes, categories = codes that occur, ordered by code); label bad credit risk "
        "(class 2) = 1, good (class 1) = 0; no sensitive attribute set; "
        + _options_text(standardize=standardize, intercept=intercept, one_hot=one_hot)
    )
    return Dataset(
        name="german",
        X=X,
        y=y,
        feature_names=names,
        sensitive=None,
        sensitive_name=None,
        task="binary",
        description=desc,
        licence=_UCI,
        source="UCI Statlog (German Credit Data), H. Hofmann (1994); "
        "https://doi.org/10.24432/C5NC77",
    )


# ---------------------------------------------------------------------------------------
# mnist


@lru_cache(maxsize=1)
def _raw_mnist() -> tuple[np.ndarray, np.ndarray]:
    a = np.loadtxt(io.StringIO(_read_text("mnist_5k.csv.gz")), delimiter=",", dtype=np.uint8)
    return _frozen(a[:, :-1]), _frozen(a[:, -1].astype(np.int64))


def load_mnist(
    digits: Sequence[int] | None = None,
    *,
    scale: bool = True,
    standardize: bool = False,
    intercept: bool = True,
    relabel: bool = True,
    dtype: Any = np.float64,
) -> Dataset:
    """A 5,000-image subset of MNIST (500 images of each digit), 784 pixel features.

    Rows are in the bundled file's order (sorted by digit). Pixels (row-major, named
    ``pixel0`` ... ``pixel783``) are divided by 255 (``scale=True``) into [0, 1]; they are
    **not** standardized by default (``standardize=True`` standardizes every pixel, a
    constant pixel being only centred). With the defaults ``X`` has 784 + 1 = **785
    columns**.

    ``digits`` keeps only the images of the given digits, e.g. ``(3, 7)`` gives 1,000 rows
    (seed 004 uses 12,396 training images of 3 and 7: a reduced-size version). With
    exactly two digits and ``relabel=True`` the task becomes binary: ``y = 0`` for
    ``digits[0]`` and ``y = 1`` for ``digits[1]``; otherwise ``y`` holds the digits (0-9).

    Parameters
    ----------
    digits : sequence of int, optional
        Digits to keep (default: all ten).
    scale : bool, default True
        Divide pixel values by 255.
    standardize : bool, default False
        Standardize every pixel column.
    intercept : bool, default True
        Append a final column of ones named ``"intercept"``.
    relabel : bool, default True
        With two digits, map them to 0/1 (binary task).
    dtype : numpy floating dtype, default numpy.float64
        dtype of ``X``.

    Returns
    -------
    Dataset
        ``task="multiclass"`` (or ``"binary"``), no official test part.

    Examples
    --------
    >>> from fedmodel.datasets import load_mnist
    >>> ds = load_mnist(digits=(3, 7))
    >>> ds.X.shape, ds.task, int(ds.y.sum())
    ((1000, 785), 'binary', 500)
    """
    dtype = _check_dtype(dtype)
    pixels, labels = _raw_mnist()
    if digits is not None:
        digits = [int(d) for d in np.atleast_1d(np.asarray(digits))]
        bad = [d for d in digits if not 0 <= d <= 9]
        if bad or not digits or len(set(digits)) != len(digits):
            raise ValueError(f"digits must be distinct integers in 0..9, got {digits}")
        mask = np.isin(labels, digits)
        pixels, labels = pixels[mask], labels[mask]
    values = pixels.astype(np.float64)
    if scale:
        values /= 255.0
    cols = [_Col(f"pixel{j}", values[:, j]) for j in range(values.shape[1])]
    X, _, names, _ = _design(
        cols, standardize=standardize, intercept=intercept, one_hot=False, dtype=dtype
    )
    if digits is not None and len(digits) == 2 and relabel:
        y = (labels == digits[1]).astype(np.int64)
        task = "binary"
        lab = f"label digit {digits[1]} = 1, digit {digits[0]} = 0"
    else:
        y, task, lab = labels.copy(), "multiclass", "label = the digit"
    desc = (
        "MNIST, 5,000-image subset (500 per digit), rows sorted by digit"
        + (f", digits {digits} kept: {len(y)} rows" if digits is not None else "")
        + f"; {lab}; 784 pixels (row-major)"
        + (" divided by 255" if scale else " as 0-255 integers")
        + "; "
        + ("pixels standardized" if standardize else "pixels not standardized")
        + ("; a final all-ones column 'intercept' appended." if intercept else "; no intercept.")
    )
    return Dataset(
        name="mnist",
        X=X,
        y=y,
        feature_names=names,
        sensitive=None,
        sensitive_name=None,
        task=task,
        description=desc,
        licence="CC BY-SA 3.0 (MNIST, Y. LeCun, C. Cortes, C. J. C. Burges)",
        source="MNIST database, http://yann.lecun.com/exdb/mnist/ (5,000-image subset)",
    )


# ---------------------------------------------------------------------------------------
# wine quality, abalone, diabetes (regression)


@lru_cache(maxsize=1)
def _raw_wine() -> tuple[list[str], np.ndarray]:
    rows = list(csv.reader(io.StringIO(_read_text("winequality-white.csv.gz"))))
    header = [h.strip() for h in rows[0]]
    return header, _frozen(np.array([[float(v) for v in r] for r in rows[1:] if r]))


def load_wine_quality(
    *, standardize: bool = True, intercept: bool = True, dtype: Any = np.float64
) -> Dataset:
    """UCI Wine Quality, white wine: 4,898 wines, 11 physico-chemical features.

    Target: the sensory ``quality`` score (integers 3-9) as a float, regression task
    (seed 004, Table I: ordinary least squares with an intercept on all rows gives
    MSE 0.5632 and R^2 0.2819 here; the paper's 0.5398 / 0.2921 come from an unspecified
    variant). With the defaults ``X`` has 11 + 1 = **12 columns**.

    Parameters
    ----------
    standardize : bool, default True
        Standardize the features.
    intercept : bool, default True
        Append a final column of ones named ``"intercept"``.
    dtype : numpy floating dtype, default numpy.float64
        dtype of ``X``.

    Returns
    -------
    Dataset
        ``task="regression"``, no official test part.

    Examples
    --------
    >>> from fedmodel.datasets import load_wine_quality
    >>> load_wine_quality().X.shape
    (4898, 12)
    """
    dtype = _check_dtype(dtype)
    header, values = _raw_wine()
    cols = [_Col(h, values[:, j]) for j, h in enumerate(header[:-1])]
    X, _, names, _ = _design(
        cols, standardize=standardize, intercept=intercept, one_hot=False, dtype=dtype
    )
    desc = (
        f"UCI Wine Quality (white): {values.shape[0]} rows, 11 numeric features; target quality "
        "(3-9) as a float; " + _options_text(standardize=standardize, intercept=intercept)
    )
    return Dataset(
        name="wine_quality",
        X=X,
        y=values[:, -1].copy(),
        feature_names=names,
        sensitive=None,
        sensitive_name=None,
        task="regression",
        description=desc,
        licence=_UCI,
        source="UCI Wine Quality, P. Cortez, A. Cerdeira, F. Almeida, T. Matos, J. Reis (2009); "
        "https://doi.org/10.24432/C56S3T",
    )


_ABALONE_NUMERIC = [
    "length",
    "diameter",
    "height",
    "whole_weight",
    "shucked_weight",
    "viscera_weight",
    "shell_weight",
]


@lru_cache(maxsize=1)
def _raw_abalone() -> tuple[list[str], np.ndarray, np.ndarray]:
    rows = [r for r in csv.reader(io.StringIO(_read_text("abalone.csv.gz"))) if r]
    sex = [r[0] for r in rows]
    values = np.array([[float(v) for v in r[1:]] for r in rows])
    return sex, _frozen(values[:, :-1]), _frozen(values[:, -1])


def load_abalone(
    *,
    one_hot: bool = True,
    standardize: bool = True,
    intercept: bool = True,
    dtype: Any = np.float64,
) -> Dataset:
    """UCI Abalone: 4,177 abalones, sex (M/F/I) and 7 measurements; target: rings.

    ``sex`` is one-hot encoded as ``sex=F``, ``sex=I``, ``sex=M`` (``one_hot=False``: codes
    F = 0, I = 1, M = 2, standardized like a numeric column); the 7 measurements are
    numeric. Target: number of rings (age = rings + 1.5 years) as a float, regression
    task. With the defaults ``X`` has 3 + 7 + 1 = **11 columns**. Ordinary least squares
    on all rows gives MSE 4.8027 and R^2 0.5379, the values of seed 004 (Table I, which
    counts sex as one of 8 features); with ``one_hot=False`` it gives 4.9065 / 0.5279.

    Parameters
    ----------
    one_hot : bool, default True
        One-hot encode ``sex`` (no category dropped).
    standardize : bool, default True
        Standardize the numeric columns.
    intercept : bool, default True
        Append a final column of ones named ``"intercept"``.
    dtype : numpy floating dtype, default numpy.float64
        dtype of ``X``.

    Returns
    -------
    Dataset
        ``task="regression"``, no official test part.

    Examples
    --------
    >>> from fedmodel.datasets import load_abalone
    >>> load_abalone().X.shape
    (4177, 11)
    """
    dtype = _check_dtype(dtype)
    sex, values, rings = _raw_abalone()
    cols = [_Col("sex", sex, categorical=True, categories=["F", "I", "M"])]
    cols += [_Col(n, values[:, j]) for j, n in enumerate(_ABALONE_NUMERIC)]
    X, _, names, _ = _design(
        cols, standardize=standardize, intercept=intercept, one_hot=one_hot, dtype=dtype
    )
    desc = (
        f"UCI Abalone: {len(sex)} rows; sex (F/I/M) categorical, 7 numeric measurements; "
        "target rings as a float; "
        + _options_text(standardize=standardize, intercept=intercept, one_hot=one_hot)
    )
    return Dataset(
        name="abalone",
        X=X,
        y=rings.copy(),
        feature_names=names,
        sensitive=None,
        sensitive_name=None,
        task="regression",
        description=desc,
        licence=_UCI,
        source="UCI Abalone, W. Nash, T. Sellers, S. Talbot, A. Cawthorn, W. Ford (1994); "
        "https://doi.org/10.24432/C55C7W",
    )


@lru_cache(maxsize=1)
def _raw_diabetes() -> dict[str, np.ndarray]:
    return {k: _frozen(v) for k, v in _read_npz("diabetes.npz").items()}


def load_diabetes(
    *,
    scaled: bool = True,
    standardize: bool = False,
    intercept: bool = True,
    dtype: Any = np.float64,
) -> Dataset:
    """The diabetes data of Efron et al. (2004), as shipped by scikit-learn: 442 x 10.

    ``X`` is scikit-learn's default ``load_diabetes()`` matrix (``scaled=True``): each of
    the 10 baseline variables (``age``, ``sex``, ``bmi``, ``bp``, ``s1`` ... ``s6``) mean
    centred and scaled by its standard deviation times ``sqrt(442)``, so every column has
    unit Euclidean norm. ``scaled=False`` gives scikit-learn's raw values
    (``load_diabetes(scaled=False)``). Target: disease progression one year after
    baseline (float), regression task. Not standardized by default, so that ``X`` equals
    scikit-learn's. With the defaults ``X`` has 10 + 1 = **11 columns**; ordinary least
    squares on all 442 rows gives MSE 2859.6963 and R^2 0.5177 (seed 004, Table I).

    Parameters
    ----------
    scaled : bool, default True
        scikit-learn's scaled matrix (True) or the raw values (False).
    standardize : bool, default False
        Additionally standardize the 10 columns (zero mean, unit population variance).
    intercept : bool, default True
        Append a final column of ones named ``"intercept"``.
    dtype : numpy floating dtype, default numpy.float64
        dtype of ``X``.

    Returns
    -------
    Dataset
        ``task="regression"``, no official test part.

    Examples
    --------
    >>> import numpy as np
    >>> from fedmodel.datasets import load_diabetes
    >>> ds = load_diabetes()
    >>> w = np.linalg.lstsq(ds.X, ds.y, rcond=None)[0]
    >>> round(float(np.mean((ds.y - ds.X @ w) ** 2)), 4)
    2859.6963
    """
    dtype = _check_dtype(dtype)
    raw = _raw_diabetes()
    values = raw["data"] if scaled else raw["data_raw"]
    fnames = [str(n) for n in raw["feature_names"]]
    cols = [_Col(n, values[:, j]) for j, n in enumerate(fnames)]
    X, _, names, _ = _design(
        cols, standardize=standardize, intercept=intercept, one_hot=False, dtype=dtype
    )
    desc = (
        "Diabetes data (Efron, Hastie, Johnstone, Tibshirani 2004) as shipped by scikit-learn: "
        "442 rows, 10 baseline variables "
        + (
            "in scikit-learn's default scaling (centred, divided by std * sqrt(442))"
            if scaled
            else "as raw values"
        )
        + ("; additionally standardized" if standardize else "")
        + "; target disease progression after one year (float)"
        + ("; a final all-ones column 'intercept' appended." if intercept else "; no intercept.")
    )
    return Dataset(
        name="diabetes",
        X=X,
        y=raw["target"].copy(),
        feature_names=names,
        sensitive=None,
        sensitive_name=None,
        task="regression",
        description=desc,
        licence="BSD 3-Clause (scikit-learn distribution; see PROVENANCE.md)",
        source="B. Efron, T. Hastie, I. Johnstone, R. Tibshirani, 'Least Angle Regression', "
        "Annals of Statistics 32(2), 2004; via scikit-learn's sklearn.datasets.load_diabetes",
    )


# ---------------------------------------------------------------------------------------
# registry


_LOADERS: dict[str, Callable[..., Dataset]] = {
    "breast_cancer": load_breast_cancer_wisconsin_original,
    "monks": load_monks,
    "adult": load_adult,
    "compas": load_compas,
    "communities": load_communities,
    "german": load_german,
    "mnist": load_mnist,
    "wine_quality": load_wine_quality,
    "abalone": load_abalone,
    "diabetes": load_diabetes,
}

_ALIASES = {
    "breast_cancer_wisconsin": "breast_cancer",
    "breast_cancer_wisconsin_original": "breast_cancer",
    "breast_cancer_wisc": "breast_cancer",
    "monks_1": "monks",
    "adult_a": "adult",
    "adult_b": "adult",
    "communities_and_crime": "communities",
    "wine": "wine_quality",
    "german_credit": "german",
}

# Default-option shapes, checked against the loaders by tests/test_datasets.py.
_SUMMARY = {
    "breast_cancer": (683, None, 10, "binary"),
    "monks": (124, 432, 18, "binary"),
    "adult": (30162, 15060, 104, "binary"),
    "compas": (6172, None, 19, "binary"),
    "communities": (1994, None, 100, "binary"),
    "german": (1000, None, 62, "binary"),
    "mnist": (5000, None, 785, "multiclass"),
    "wine_quality": (4898, None, 12, "regression"),
    "abalone": (4177, None, 11, "regression"),
    "diabetes": (442, None, 11, "regression"),
}

_LICENCES = {
    "breast_cancer": "CC BY 4.0",
    "monks": "CC BY 4.0",
    "adult": "CC BY 4.0",
    "compas": "ProPublica (no explicit licence)",
    "communities": "CC BY 4.0",
    "german": "CC BY 4.0",
    "mnist": "CC BY-SA 3.0",
    "wine_quality": "CC BY 4.0",
    "abalone": "CC BY 4.0",
    "diabetes": "BSD-3-Clause (scikit-learn)",
}


def _canonical(name: str) -> str:
    key = str(name).strip().lower().replace("-", "_").replace(" ", "_")
    key = _ALIASES.get(key, key)
    if key not in _LOADERS:
        raise ValueError(f"name: unknown data set {name!r}; available: {sorted(_LOADERS)}")
    return key


def load(name: str, **kwargs: Any) -> Dataset:
    """Load a bundled data set by name.

    Parameters
    ----------
    name : str
        One of :func:`list_datasets`'s names (``"adult"``, ``"breast_cancer"``, ...);
        hyphens and a few aliases (``"breast-cancer-wisc"``, ``"monks-1"``,
        ``"adult-a"``, ``"wine"``) are accepted.
    **kwargs
        Passed to the data set's loader (e.g. ``digits=(3, 7)`` for ``"mnist"``).

    Returns
    -------
    Dataset

    Examples
    --------
    >>> from fedmodel.datasets import load
    >>> load("monks-1").X_test.shape
    (432, 18)
    """
    return _LOADERS[_canonical(name)](**kwargs)


def list_datasets() -> list[dict[str, Any]]:
    """Summary of the bundled data sets with their loaders' default options.

    Returns
    -------
    list of dict
        One dict per data set with keys ``name``, ``rows`` (training part),
        ``test_rows`` (official test part, or None), ``features`` (columns of ``X``,
        intercept included), ``task``, ``licence`` and ``loader`` (function name).

    Examples
    --------
    >>> from fedmodel.datasets import list_datasets
    >>> [d["name"] for d in list_datasets()][:3]
    ['breast_cancer', 'monks', 'adult']
    """
    out = []
    for name, loader in _LOADERS.items():
        rows, test_rows, features, task = _SUMMARY[name]
        out.append(
            {
                "name": name,
                "rows": rows,
                "test_rows": test_rows,
                "features": features,
                "task": task,
                "licence": _LICENCES[name],
                "loader": loader.__name__,
            }
        )
    return out
