"""Seed 002's vertical data sets (Sec. V-A) from the bundled loaders.

=============  ======================  =========  ==================  ======================
data set       rows (train / test)     columns    blocks (K = 6)      paper's columns/blocks
=============  ======================  =========  ==================  ======================
``adult``      45,222 (40,000 / 5,222)  104       19 + 5 x 17         104, 19 + 5 x 17
``compas``     5,278 (4,800 / 478)     15         5 + 5 x 2           26, 6 + 5 x 4
``communities`` 1,994 (1,200 / 794)    100        20 + 5 x 16         99, 19 + 5 x 16
=============  ======================  =========  ==================  ======================

* Adult: :func:`fedmodel.datasets.load_adult` (official train and test parts, rows with a
  missing value dropped, pooled: 30,162 + 15,060 = 45,222 rows, the paper's count); 5
  standardised numeric columns, 98 one-hot columns (``sex`` kept), an intercept. Label
  ``+1`` = income > 50K (the protected class of Definition 1); groups female (a) / male.
* COMPAS: :func:`fedmodel.datasets.load_compas` with ProPublica's filter and the
  African-American and Caucasian rows (5,278, the paper's count); 5 numeric + 9 one-hot
  columns and an intercept: **15 columns, not the paper's 26** (its preprocessing is not
  given), so the parties hold 2 columns each (below Theorem 1's ``m_k > 2``). The two race
  one-hot columns (African-American, Caucasian) are among the features by default (the
  model may use the protected attribute directly); ``drop_sensitive=True`` leaves them out
  (13 columns). Label ``+1`` = not a recidivist (the protected class); groups
  African-American (a) / Caucasian.
* Communities and Crime: :func:`fedmodel.datasets.load_communities` (``racepctblack``
  removed from ``X``): 99 standardised attributes and an intercept, **100 columns** (the
  paper: 99, no intercept mentioned). Label ``+1`` = ``ViolentCrimesPerPop <= 0.375`` (the
  paper makes the negative the protected class); groups ``racepctblack <= 0.06`` (a, the
  paper's protected group) / ``> 0.06``.

Splits: uniform random train/test splits of the paper's sizes, one per seed; blocks are
contiguous runs of the loader's columns (:func:`~fedmodel.algorithms.vfl.problem.
paper_block_sizes`; the paper does not say which column goes where). Standardisation
uses the loader's statistics (Adult: the official training part).

Examples
--------
>>> prob = vertical_dataset("compas", seed=0)   # doctest: +SKIP
>>> prob.sizes, prob.n, prob.y_test.size        # doctest: +SKIP
([5, 2, 2, 2, 2, 2], 4800, 478)
"""

from __future__ import annotations

import warnings

import numpy as np

from fedmodel.algorithms.vfl.problem import VerticalProblem, paper_block_sizes

DATASETS = ("adult", "compas", "communities")
PAPER_SIZES = {
    "adult": (40000, 5222, 104),
    "compas": (4800, 478, 26),
    "communities": (1200, 794, 99),
}


def _pooled(name: str, drop_sensitive: bool = False):
    from fedmodel.datasets import load_adult, load_communities, load_compas

    if name == "adult":
        ds = load_adult(drop_sensitive=drop_sensitive)
        X = np.vstack([ds.X, ds.X_test])
        y01 = np.concatenate([ds.y, ds.y_test])
        female = np.concatenate([ds.sensitive, ds.sensitive_test]).astype(bool)
        return X, np.where(y01 == 1, 1.0, -1.0), female
    if name == "compas":
        ds = load_compas(races=("African-American", "Caucasian"), drop_sensitive=drop_sensitive)
        return ds.X, np.where(ds.y == 0, 1.0, -1.0), ds.sensitive.astype(bool)
    if name == "communities":
        ds = load_communities()
        return ds.X, np.where(ds.y == 0, 1.0, -1.0), ds.sensitive <= 0.06
    raise ValueError(f"unknown data set {name!r}; choose one of {DATASETS}")


def vertical_dataset(
    name: str,
    seed: int = 0,
    K: int = 6,
    n_train: int | None = None,
    drop_sensitive: bool = False,
) -> VerticalProblem:
    """Seed 002's vertical split of ``name`` for trial ``seed`` (see the module doc).

    ``n_train`` overrides the paper's training size (the rest is the test part, capped at
    the paper's test size). ``drop_sensitive=True`` leaves the protected attribute's
    one-hot columns out of the features (COMPAS: the two race columns, 13 columns, blocks
    3 + 5 x 2; Adult: the two sex columns, 102 columns, blocks 6 x 17); it stays the
    group. The paper does not say whether its features include it; the default keeps it.
    Communities has no such column (``racepctblack`` is always removed).
    """
    if drop_sensitive and name == "communities":
        drop_sensitive = False  # racepctblack is never a feature there
    X, y, group_a = _pooled(name, drop_sensitive)
    tr, te, _ = PAPER_SIZES[name]
    if n_train is not None:
        tr = int(n_train)
    rng = np.random.default_rng(seed)
    perm = rng.permutation(X.shape[0])
    itr, ite = perm[:tr], perm[tr : tr + te]
    sizes = paper_block_sizes(X.shape[1], K)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # COMPAS: m_k = 2 (documented above)
        return VerticalProblem.from_columns(
            X[itr],
            y[itr],
            group_a[itr],
            sizes,
            X_test=X[ite],
            y_test=y[ite],
            group_a_test=group_a[ite],
            description=f"{name}, seed {seed}: {len(itr)} train / {len(ite)} test, blocks {sizes}",
        )
