"""Federated estimators with scikit-learn's API.

Each estimator declares a :class:`fedmodel.Model` over the sites' data (one client per
site), solves it with a federated method (``method=``, default ``"prox-al"``) and keeps
the :class:`~fedmodel.Result` as ``result_``; ``fit`` / ``predict`` / ``predict_proba`` /
``score`` / ``get_params`` / ``set_params`` behave as in scikit-learn, which they do not
need (scikit-learn's tools take them when it is installed). See ``docs/estimators.md``.

Examples
--------
>>> import numpy as np
>>> from fedmodel.estimators import FederatedRidge
>>> rng = np.random.default_rng(0)
>>> sites = [(rng.normal(size=(30, 2)), rng.normal(size=30)) for _ in range(3)]
>>> FederatedRidge(alpha=1.0).fit(sites).result_.status
'optimal'
"""

from fedmodel.estimators._base import FederatedEstimator, FitWarning, NotFittedError
from fedmodel.estimators.linear import (
    FederatedLasso,
    FederatedLinearRegression,
    FederatedLinearSVC,
    FederatedLogisticRegression,
    FederatedQuantileRegressor,
    FederatedRidge,
)

__all__ = [
    "FederatedEstimator",
    "FederatedLasso",
    "FederatedLinearRegression",
    "FederatedLinearSVC",
    "FederatedLogisticRegression",
    "FederatedQuantileRegressor",
    "FederatedRidge",
    "FitWarning",
    "NotFittedError",
]
