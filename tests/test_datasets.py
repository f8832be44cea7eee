"""Tests of fedmodel.datasets: bundled data, loaders and federated splitters."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import fedmodel.datasets as fd
from fedmodel.datasets import (
    Dataset,
    list_datasets,
    load,
    load_abalone,
    load_adult,
    load_breast_cancer,
    load_communities,
    load_compas,
    load_diabetes,
    load_german,
    load_mnist,
    load_monks,
    split_by_class,
    split_dirichlet,
    split_server,
    split_stratified,
)

PACKAGE_DIR = Path(fd.__file__).resolve().parent.parent  # .../fedmodel
DATA_DIR = Path(fd.__file__).resolve().parent / "data"

# name -> (train rows, test rows, columns of X with default options, task, positives)
EXPECTED = {
    "breast_cancer": (683, None, 10, "binary", 239),
    "monks": (124, 432, 18, "binary", 62),
    "adult": (30162, 15060, 104, "binary", 7508),
    "compas": (6172, None, 19, "binary", 2809),
    "communities": (1994, None, 100, "binary", 413),
    "german": (1000, None, 62, "binary", 300),
    "mnist": (5000, None, 785, "multiclass", None),
    "wine_quality": (4898, None, 12, "regression", None),
    "abalone": (4177, None, 11, "regression", None),
    "diabetes": (442, None, 11, "regression", None),
}
SENSITIVE = {"adult", "compas", "communities"}


@pytest.fixture(scope="module")
def datasets() -> dict[str, Dataset]:
    return {name: load(name) for name in EXPECTED}


def _ols(X: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    w = np.linalg.lstsq(X, y, rcond=None)[0]
    mse = float(np.mean((y - X @ w) ** 2))
    return mse, 1.0 - mse / float(np.var(y))


def _numeric_columns(ds: Dataset) -> list[int]:
    return [j for j, n in enumerate(ds.feature_names) if "=" not in n and n != "intercept"]


# ---------------------------------------------------------------------------------------
# loaders


@pytest.mark.parametrize("name", list(EXPECTED))
def test_shapes_and_values(datasets, name):
    rows, test_rows, n_features, task, positives = EXPECTED[name]
    ds = datasets[name]
    assert isinstance(ds, Dataset) and ds.name == name
    assert ds.X.shape == (rows, n_features)
    assert ds.y.shape == (rows,)
    assert ds.X.dtype == np.float64
    assert len(ds.feature_names) == n_features
    assert ds.task == task
    assert np.all(np.isfinite(ds.X))
    assert np.all(np.isfinite(ds.y))
    assert ds.feature_names[-1] == "intercept"
    assert np.all(ds.X[:, -1] == 1.0)
    assert ds.description and ds.licence and ds.source
    assert f"{rows} rows x {n_features} features" in repr(ds)
    if task == "binary":
        assert set(np.unique(ds.y)) <= {0, 1}
        assert np.issubdtype(ds.y.dtype, np.integer)
        assert int(ds.y.sum()) == positives
    if task == "regression":
        assert ds.y.dtype == np.float64
    if test_rows is None:
        assert ds.X_test is None and ds.y_test is None and not ds.has_test
    else:
        assert ds.X_test.shape == (test_rows, n_features)
        assert ds.y_test.shape == (test_rows,)
        assert np.all(np.isfinite(ds.X_test))
        assert np.all(ds.X_test[:, -1] == 1.0)
        assert set(np.unique(ds.y_test)) <= {0, 1}
    if name in SENSITIVE:
        assert ds.sensitive is not None and ds.sensitive.shape == (rows,)
        assert np.all(np.isfinite(ds.sensitive))
        assert ds.sensitive_name
    else:
        assert ds.sensitive is None and ds.sensitive_name is None


@pytest.mark.parametrize("name", [n for n in EXPECTED if n not in ("mnist", "diabetes")])
def test_standardized_columns(datasets, name):
    # monks is all one-hot by default (indicators are never scaled): check its ordinal form
    ds = load_monks(one_hot=False) if name == "monks" else datasets[name]
    cols = _numeric_columns(ds)
    assert cols
    Xn = ds.X[:, cols]
    np.testing.assert_allclose(Xn.mean(axis=0), 0.0, atol=1e-10)
    np.testing.assert_allclose(Xn.std(axis=0), 1.0, atol=1e-10)


@pytest.mark.parametrize("name", ["adult", "monks"])
def test_train_test_columns_align(datasets, name):
    ds = datasets[name]
    assert ds.X_test.shape[1] == ds.X.shape[1]
    # every one-hot group sums to one on every row of both parts (same category columns)
    groups: dict[str, list[int]] = {}
    for j, n in enumerate(ds.feature_names):
        if "=" in n:
            groups.setdefault(n.split("=")[0], []).append(j)
    assert groups
    for cols in groups.values():
        np.testing.assert_array_equal(ds.X[:, cols].sum(axis=1), 1.0)
        np.testing.assert_array_equal(ds.X_test[:, cols].sum(axis=1), 1.0)


def test_adult_test_part_uses_training_statistics():
    raw = load_adult(standardize=False)
    std = load_adult()
    for j in _numeric_columns(raw):
        mean, sd = raw.X[:, j].mean(), raw.X[:, j].std()
        np.testing.assert_allclose(std.X_test[:, j], (raw.X_test[:, j] - mean) / sd)
    assert int(std.y_test.sum()) == 3700
    female = raw.feature_names.index("sex=Female")
    np.testing.assert_array_equal(raw.sensitive, raw.X[:, female])
    np.testing.assert_array_equal(raw.sensitive_test, raw.X_test[:, female])
    assert int(raw.sensitive.sum()) == 9782 and int(raw.sensitive_test.sum()) == 4913


def test_adult_options():
    assert load_adult(drop_fnlwgt=False).X.shape == (30162, 105)
    ds = load_adult(drop_sensitive=True)
    assert ds.X.shape == (30162, 102)
    assert not any(n.startswith("sex=") for n in ds.feature_names)
    assert ds.sensitive is not None
    assert load_adult(one_hot=False).X.shape == (30162, 14)
    assert load_adult(intercept=False).X.shape == (30162, 103)


def test_breast_cancer_and_monks():
    bc = load_breast_cancer(standardize=False, intercept=False)
    assert bc.X.shape == (683, 9)
    assert bc.X.min() == 1 and bc.X.max() == 10
    m = load_monks()
    assert int(m.y_test.sum()) == 216
    assert load_monks(one_hot=False).X.shape == (124, 7)
    with pytest.raises(ValueError, match="problem"):
        load_monks(problem=2)


def test_compas():
    ds = load_compas(standardize=False)
    aa = ds.feature_names.index("race=African-American")
    np.testing.assert_array_equal(ds.sensitive, ds.X[:, aa])
    assert int(ds.sensitive.sum()) == 3175
    assert load_compas(propublica_filter=False).X.shape[0] == 7214
    two = load_compas(races=("African-American", "Caucasian"))
    assert two.X.shape == (5278, 15)
    assert load_compas(drop_sensitive=True).X.shape == (6172, 13)
    with pytest.raises(ValueError, match="races"):
        load_compas(races=("Martian",))


def test_communities_sensitive_removed_from_X():
    ds = load_communities()
    assert "racepctblack" not in ds.feature_names
    assert "ViolentCrimesPerPop" not in ds.feature_names
    kept = load_communities(drop_sensitive=False, standardize=False)
    assert kept.X.shape == (1994, 101)
    np.testing.assert_array_equal(ds.sensitive, kept.X[:, kept.feature_names.index("racepctblack")])
    assert ds.sensitive.min() >= 0 and ds.sensitive.max() <= 1
    assert int((ds.sensitive > 0.06).sum()) == 970
    reg = load_communities(threshold=None)
    assert reg.task == "regression" and reg.y.dtype == np.float64
    np.testing.assert_array_equal(ds.y, (reg.y > 0.375).astype(int))


def test_german_and_abalone():
    assert load_german(one_hot=False).X.shape == (1000, 21)
    ab = load_abalone()
    assert ab.feature_names[:3] == ["sex=F", "sex=I", "sex=M"]
    mse, r2 = _ols(ab.X, ab.y)
    assert mse == pytest.approx(4.8027, abs=1e-4)
    assert r2 == pytest.approx(0.5379, abs=1e-4)


def test_mnist():
    ds = load_mnist(intercept=False)
    assert ds.X.shape == (5000, 784)
    assert ds.X.min() == 0.0 and ds.X.max() == 1.0
    np.testing.assert_array_equal(np.bincount(ds.y), [500] * 10)
    two = load_mnist(digits=(3, 7))
    assert two.X.shape == (1000, 785) and two.task == "binary"
    assert int(two.y.sum()) == 500
    some = load_mnist(digits=(1, 2, 3))
    assert some.task == "multiclass" and set(np.unique(some.y)) == {1, 2, 3}
    st = load_mnist(standardize=True, intercept=False)
    np.testing.assert_allclose(st.X.mean(axis=0), 0.0, atol=1e-10)
    sd = st.X.std(axis=0)
    assert np.all((np.abs(sd - 1) < 1e-10) | (sd == 0))
    with pytest.raises(ValueError, match="digits"):
        load_mnist(digits=(3, 11))


def test_diabetes_ols():
    ds = load_diabetes()
    assert ds.X.shape == (442, 11)
    mse, r2 = _ols(ds.X, ds.y)
    assert mse == pytest.approx(2859.6963, abs=1e-4)
    assert r2 == pytest.approx(0.5177, abs=1e-4)
    # scikit-learn's default scaling: centred columns of unit Euclidean norm
    np.testing.assert_allclose(ds.X[:, :10].mean(axis=0), 0.0, atol=1e-12)
    np.testing.assert_allclose(np.linalg.norm(ds.X[:, :10], axis=0), 1.0, atol=1e-6)
    raw = load_diabetes(scaled=False)
    mse_raw, _ = _ols(raw.X, raw.y)
    assert mse_raw == pytest.approx(mse, rel=1e-9)


def test_options_dtype_and_intercept():
    ds = load_german(dtype=np.float32, intercept=False)
    assert ds.X.dtype == np.float32
    assert ds.X.shape == (1000, 61) and "intercept" not in ds.feature_names
    with pytest.raises(ValueError, match="dtype"):
        load_german(dtype=np.int64)


def test_arrays_are_fresh_copies():
    a = load_breast_cancer()
    a.X[:] = 0.0
    a.y[:] = 7
    b = load_breast_cancer()
    assert b.X[:, -1].sum() == 683 and set(np.unique(b.y)) == {0, 1}
    d = load_diabetes()
    d.y[:] = 0.0
    assert load_diabetes().y.sum() > 0


def test_load_names_and_list_datasets():
    assert load("breast-cancer-wisc").name == "breast_cancer"
    assert load("monks-1").X_test.shape == (432, 18)
    assert load("mnist", digits=(3, 7)).task == "binary"
    with pytest.raises(ValueError, match="name"):
        load("nope")
    rows = list_datasets()
    assert [r["name"] for r in rows] == list(EXPECTED)
    for r in rows:
        n_rows, test_rows, n_features, task, _ = EXPECTED[r["name"]]
        assert (r["rows"], r["test_rows"], r["features"], r["task"]) == (
            n_rows,
            test_rows,
            n_features,
            task,
        )
        assert r["licence"]


# ---------------------------------------------------------------------------------------
# package data


def test_no_reference_to_shared_folder():
    offenders = []
    for path in PACKAGE_DIR.rglob("*"):
        if not path.is_file() or "__pycache__" in path.parts:
            continue
        if path.suffix in (".gz", ".npz", ".pyc"):
            continue
        text = path.read_text(encoding="utf-8", errors="ignore")
        if "shared/" in text:
            offenders.append(str(path))
    assert not offenders, f"files referencing 'shared/': {offenders}"


def test_package_data_documented_and_small():
    files = [p for p in DATA_DIR.iterdir() if p.is_file()]
    provenance = (DATA_DIR / "PROVENANCE.md").read_text(encoding="utf-8")
    for p in files:
        if p.name != "PROVENANCE.md":
            assert p.suffix in (".gz", ".npz"), p.name
            assert p.name in provenance, f"{p.name} not described in PROVENANCE.md"
    assert sum(p.stat().st_size for p in files) < 8 * 1024 * 1024


# ---------------------------------------------------------------------------------------
# splitters


def _toy(n0: int = 23, n1: int = 9, n2: int = 14, seed: int = 0):
    y = np.repeat([0, 1, 2], [n0, n1, n2])
    rng = np.random.default_rng(seed)
    perm = rng.permutation(len(y))
    y = y[perm]
    X = np.column_stack([np.arange(len(y), dtype=float), rng.normal(size=len(y))])
    return X, y


def _assert_partition(parts, n):
    idx = np.concatenate([p["index"] for p in parts])
    assert np.array_equal(np.sort(idx), np.arange(n))
    for p in parts:
        np.testing.assert_array_equal(p["X"][:, 0], p["index"])  # X[:, 0] is the row id


@pytest.mark.parametrize("n_clients", [1, 2, 4, 9])
def test_split_stratified_partition_and_ratios(n_clients):
    X, y = _toy()
    parts = split_stratified(X, y, n_clients, random_state=0, extra={"s": y * 10})
    assert len(parts) == n_clients
    _assert_partition(parts, len(y))
    sizes = [len(p["y"]) for p in parts]
    assert max(sizes) - min(sizes) <= 1
    for c in (0, 1, 2):
        counts = [int(np.sum(p["y"] == c)) for p in parts]
        assert max(counts) - min(counts) <= 1
        assert sum(counts) == int(np.sum(y == c))
    for p in parts:
        np.testing.assert_array_equal(p["s"], p["y"] * 10)
        np.testing.assert_array_equal(p["y"], y[p["index"]])


def test_split_stratified_tuples_and_determinism():
    X, y = _toy()
    a = split_stratified(X, y, 3, random_state=5)
    b = split_stratified(X, y, 3, random_state=5)
    c = split_stratified(X, y, 3, random_state=6)
    assert all(isinstance(p, tuple) and len(p) == 2 for p in a)
    assert all(np.array_equal(pa[0], pb[0]) for pa, pb in zip(a, b, strict=True))
    assert any(not np.array_equal(pa[0], pc[0]) for pa, pc in zip(a, c, strict=True))
    g1 = split_stratified(X, y, 3, random_state=np.random.default_rng(1))
    g2 = split_stratified(X, y, 3, random_state=np.random.default_rng(1))
    assert all(np.array_equal(p[0], q[0]) for p, q in zip(g1, g2, strict=True))


def test_split_stratified_real_data():
    ds = load_breast_cancer()
    parts = split_stratified(ds.X, ds.y, 5, random_state=0)
    assert [len(yk) for _, yk in parts] == [137, 137, 137, 136, 136]
    pos = [int(yk.sum()) for _, yk in parts]
    assert max(pos) - min(pos) <= 1 and sum(pos) == 239


@pytest.mark.parametrize("alpha", [0.05, 0.5, 100.0])
def test_split_dirichlet(alpha):
    X, y = _toy(60, 30, 40)
    parts = split_dirichlet(X, y, 6, alpha, random_state=0, min_size=5, extra={})
    assert len(parts) == 6
    _assert_partition(parts, len(y))
    assert min(len(p["y"]) for p in parts) >= 5
    again = split_dirichlet(X, y, 6, alpha, random_state=0, min_size=5, extra={})
    assert all(np.array_equal(p["index"], q["index"]) for p, q in zip(parts, again, strict=True))


def test_split_dirichlet_skew():
    X, y = _toy(300, 300, 300)
    skewed = split_dirichlet(X, y, 5, 0.05, random_state=1)
    iid = split_dirichlet(X, y, 5, 1000.0, random_state=1)

    def top_share(parts):
        return np.mean([np.bincount(yk, minlength=3).max() / len(yk) for _, yk in parts])

    assert top_share(skewed) > 0.7 > 0.4 > top_share(iid)


def test_split_dirichlet_repair_reaches_min_size():
    X, y = _toy(10, 10, 10)
    parts = split_dirichlet(X, y, 10, 1e-3, random_state=0, min_size=3, extra={})
    _assert_partition(parts, 30)
    assert all(len(p["y"]) == 3 for p in parts)


@pytest.mark.parametrize("stratify", [True, False])
def test_split_server(stratify):
    X, y = _toy()
    client, server = split_server(X, y, 0.3, random_state=0, stratify=stratify, extra={"s": -y})
    _assert_partition([client, server], len(y))
    assert len(server["y"]) == round(0.3 * len(y))
    if stratify:
        for c in (0, 1, 2):
            n_c = int(np.sum(y == c))
            assert abs(int(np.sum(server["y"] == c)) - 0.3 * n_c) < 1
    (Xc, yc), (Xs, ys) = split_server(X, y, 0.3, random_state=0, stratify=stratify)
    np.testing.assert_array_equal(Xs, server["X"])
    np.testing.assert_array_equal(yc, client["y"])


def test_split_by_class():
    X, y = _toy()
    groups = split_by_class(X, y)
    assert list(groups) == [0, 1, 2]
    assert all(type(k) is int for k in groups)
    for c, rows in groups.items():
        np.testing.assert_array_equal(rows, X[y == c])
    assert sum(len(v) for v in groups.values()) == len(y)


def test_splitter_errors():
    X, y = _toy()
    with pytest.raises(ValueError, match="n_clients"):
        split_stratified(X, y, 0)
    with pytest.raises(ValueError, match="n_clients"):
        split_stratified(X, y, 2.5)
    with pytest.raises(ValueError, match=r"n_clients=10 exceeds the 9 rows of class"):
        split_stratified(X, y, 10)
    with pytest.raises(ValueError, match="n_clients"):
        split_dirichlet(X, y, 0, 1.0)
    with pytest.raises(ValueError, match="alpha"):
        split_dirichlet(X, y, 3, 0.0)
    with pytest.raises(ValueError, match="alpha"):
        split_dirichlet(X, y, 3, -1.0)
    with pytest.raises(ValueError, match="min_size"):
        split_dirichlet(X, y, 10, 1.0, min_size=5)
    with pytest.raises(ValueError, match="X and y have different numbers of rows"):
        split_stratified(X, y[:-1], 2)
    with pytest.raises(ValueError, match="X and y"):
        split_by_class(X[:-2], y)
    bad = X.copy()
    bad[3, 1] = np.nan
    for call in (
        lambda: split_stratified(bad, y, 2),
        lambda: split_dirichlet(bad, y, 2, 1.0),
        lambda: split_server(bad, y, 0.5),
        lambda: split_by_class(bad, y),
    ):
        with pytest.raises(ValueError, match=re.escape("X contains NaN")):
            call()
    with pytest.raises(ValueError, match=re.escape("y contains NaN")):
        split_stratified(X, np.where(y == 1, np.nan, y), 2)
    with pytest.raises(ValueError, match="fraction"):
        split_server(X, y, 1.0)
    with pytest.raises(ValueError, match="fraction"):
        split_server(X, y, 0.001)
    with pytest.raises(ValueError, match=r"extra\['s'\]"):
        split_stratified(X, y, 2, extra={"s": y[:-1]})
    with pytest.raises(ValueError, match="X must be a 2-D"):
        split_stratified(X[:, 0], y, 2)
