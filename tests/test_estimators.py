"""The federated estimators against scikit-learn on the pooled data, and through
scikit-learn's estimator checks."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

sklearn = pytest.importorskip("sklearn")

from sklearn import linear_model, svm  # noqa: E402
from sklearn.base import clone  # noqa: E402
from sklearn.utils.estimator_checks import parametrize_with_checks  # noqa: E402

from fedmodel.datasets import (  # noqa: E402
    load_breast_cancer_wisconsin_original,
    split_stratified,
)
from fedmodel.estimators import (  # noqa: E402
    FederatedLasso,
    FederatedLinearRegression,
    FederatedLinearSVC,
    FederatedLogisticRegression,
    FederatedQuantileRegressor,
    FederatedRidge,
)


@pytest.fixture(scope="module")
def cancer():
    data = load_breast_cancer_wisconsin_original(intercept=False)
    parts = split_stratified(data.X, data.y, 4, random_state=0)
    X = np.vstack([p[0] for p in parts])
    y = np.concatenate([p[1] for p in parts])
    return parts, X, y


@pytest.fixture(scope="module")
def regression():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(120, 5))
    y = X @ np.array([1.0, -2.0, 0.0, 0.5, 0.0]) + 1.0 + 0.3 * rng.normal(size=120)
    return X, y, np.arange(120) % 3


def test_logistic_regression_predicts_what_sklearns_predicts(cancer):
    parts, X, y = cancer
    ours = FederatedLogisticRegression(C=1.0).fit(parts)  # prox-al over 4 sites
    theirs = linear_model.LogisticRegression(C=1.0, tol=1e-10, max_iter=10_000).fit(X, y)
    assert ours.result_.status == "optimal" and ours.result_.rounds["communication"] > 0
    assert np.mean(ours.predict(X) == theirs.predict(X)) >= 0.99
    # the same objective: the same coefficients within the certificate's eps
    np.testing.assert_allclose(ours.coef_, theirs.coef_[0], rtol=0, atol=2e-2)
    np.testing.assert_allclose(ours.predict_proba(X), theirs.predict_proba(X), atol=1e-2)
    assert ours.score(X, y) == pytest.approx(theirs.score(X, y), abs=0.01)


@pytest.mark.parametrize(
    "ours, theirs",
    [
        (FederatedLinearRegression(), linear_model.LinearRegression()),
        (FederatedRidge(alpha=2.0), linear_model.Ridge(alpha=2.0)),
        (FederatedLasso(alpha=0.05), linear_model.Lasso(alpha=0.05, tol=1e-10)),
        (
            FederatedQuantileRegressor(quantile=0.8, alpha=0.01),
            linear_model.QuantileRegressor(quantile=0.8, alpha=0.01, solver="highs"),
        ),
    ],
    ids=lambda e: type(e).__name__,
)
def test_regressors_fit_what_sklearn_fits_on_the_pooled_rows(regression, ours, theirs):
    X, y, sites = regression
    ours.fit(X, y, sites=sites)
    theirs.fit(X, y)
    assert ours.result_.status == "optimal"
    np.testing.assert_allclose(ours.coef_, theirs.coef_, atol=2e-2)
    assert ours.intercept_ == pytest.approx(theirs.intercept_, abs=2e-2)
    assert ours.score(X, y) == pytest.approx(theirs.score(X, y), abs=1e-3)


def test_the_linear_svm_agrees_with_sklearns_on_the_same_objective(cancer):
    parts, X, y = cancer
    # liblinear penalises its intercept: compared without one, the objectives are the same
    ours = FederatedLinearSVC(C=0.1, fit_intercept=False).fit(parts)
    theirs = svm.LinearSVC(C=0.1, fit_intercept=False, tol=1e-10, max_iter=100_000).fit(X, y)
    assert ours.result_.status == "optimal"
    assert np.mean(ours.predict(X) == theirs.predict(X)) >= 0.99


def test_sites_as_a_dataframe_with_a_site_column_and_constraints_as_parameters(cancer):
    pd = pytest.importorskip("pandas")
    parts, X, y = cancer
    frame = pd.DataFrame(X, columns=[f"f{j}" for j in range(X.shape[1])])
    frame["site"] = np.repeat(np.arange(len(parts)), [len(p[1]) for p in parts])
    clf = FederatedLogisticRegression(C=1.0, norm_budget=2.0, method="centralized")
    clf.fit(frame, y)
    assert list(clf.feature_names_in_) == [f"f{j}" for j in range(X.shape[1])]
    assert len(clf.result_.multipliers) == len(parts) + 1  # the sites and the server
    budget = clf.result_.multipliers["server"]["norm budget"]
    assert np.abs(clf.coef_).sum() == pytest.approx(2.0, abs=1e-4) and float(budget) > 0
    assert clf.predict(frame).shape == (len(y),)  # the site column is left out
    # Neyman-Pearson: the positive rows' mean loss at most the bound at every site
    bound = 0.2
    np_clf = FederatedLogisticRegression(neyman_pearson=bound, method="centralized").fit(parts)
    for Xk, yk in parts:
        z = Xk[yk == 1] @ np_clf.coef_ + np_clf.intercept_
        assert np.mean(np.logaddexp(0, -z)) <= bound * (1 + 1e-4)


def test_a_fairness_bound_holds_at_every_site():
    rng = np.random.default_rng(2)
    sites = []
    for _ in range(3):
        X = rng.normal(size=(80, 3))
        s = (rng.random(80) < 0.5).astype(int)
        y = (X[:, 0] + 1.5 * s + 0.3 * rng.normal(size=80) > 0.7).astype(int)
        sites.append((X, y, s))
    clf = FederatedLogisticRegression(fairness_bound=0.05, method="cprox-al").fit(sites)
    assert clf.result_.status == "optimal"
    for X, y, s in sites:
        z = np.where(y == 1, 1, -1) * (X @ clf.coef_ + clf.intercept_)
        loss = np.logaddexp(0, -z)
        assert abs(loss[s == 1].mean() - loss[s == 0].mean()) <= 0.05 * (1 + 1e-3)


def test_parameters_and_clone():
    clf = FederatedLogisticRegression(C=0.5, method="centralized")
    assert clf.get_params()["C"] == 0.5 and "solve_options" in clf.get_params()
    copy = clone(clf).set_params(C=2.0, solve_options={"time_limit": 10})
    assert copy.C == 2.0 and clf.C == 0.5 and repr(copy).startswith("FederatedLogisticRegression(")
    with pytest.raises(ValueError, match="Invalid parameter 'c'"):
        clf.set_params(c=1.0)
    with pytest.raises(ValueError, match="C must be a positive number"):
        FederatedLogisticRegression(C=-1.0).fit(np.eye(2), [0, 1])


# the checks exercise the API, which is the same for every method: they solve with the
# pooled reference to keep the many small fits quick. A plain (X, y) fit is one site (one
# client), so every check applies and none is expected to fail; the array-API checks are
# skipped by scikit-learn itself unless SCIPY_ARRAY_API is set
@parametrize_with_checks(
    [
        FederatedLogisticRegression(method="centralized"),
        FederatedLinearSVC(method="centralized"),
        FederatedLinearRegression(method="centralized"),
        FederatedRidge(method="centralized"),
        FederatedLasso(method="centralized"),
        FederatedQuantileRegressor(method="centralized"),
    ]
)
def test_sklearn_estimator_checks(estimator, check):
    check(estimator)


def test_the_estimators_are_sklearn_estimators():
    """With scikit-learn installed: its base and mixins, its tags, no warning of the checks."""
    from sklearn.base import BaseEstimator, is_classifier, is_regressor

    for cls in (FederatedLogisticRegression, FederatedLinearSVC):
        assert issubclass(cls, BaseEstimator) and is_classifier(cls())
        assert cls().__sklearn_tags__().classifier_tags.multi_class is False
    for cls in (FederatedLinearRegression, FederatedRidge, FederatedLasso):
        assert issubclass(cls, BaseEstimator) and is_regressor(cls())
    assert FederatedQuantileRegressor().__sklearn_tags__().target_tags.required


def test_the_estimators_work_without_sklearn():
    """scikit-learn hidden: the estimators import, fit and score on their own bases."""
    code = (
        "import sys; sys.modules['sklearn'] = None\n"
        "import numpy as np\n"
        "from fedmodel.estimators import FederatedLogisticRegression, FederatedRidge\n"
        "rng = np.random.default_rng(0); X = rng.normal(size=(40, 3))\n"
        "y = X @ np.array([1.0, -1.0, 0.5])\n"
        "assert FederatedRidge.__mro__[-1] is object and 'sklearn' not in repr(FederatedRidge.__mro__)\n"
        "r = FederatedRidge(method='centralized').fit(X, y).score(X, y)\n"
        "c = FederatedLogisticRegression(method='centralized').fit(X, y > 0).score(X, y > 0)\n"
        "print(r, c)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    r2, accuracy = (float(v) for v in out.stdout.split())
    assert r2 > 0.99 and accuracy > 0.9
