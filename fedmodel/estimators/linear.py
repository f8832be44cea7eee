"""Federated linear models with scikit-learn's API: logistic regression, least squares
(plain, ridge, lasso), a linear SVM and quantile regression, each a :class:`fedmodel.Model`
over the sites' data solved by a federated method, with the package's constraints as
parameters (a norm budget on the coefficients; for the logistic regression a
Neyman-Pearson bound and a loss-disparity bound).

Every objective is the scikit-learn estimator's of the same name divided by the number of
rows ``N`` over all sites (the same minimiser, a loss of order one for the certificate):
the data term is a sum over sites, each site's part a client's objective on its own rows.
"""

from __future__ import annotations

from typing import Any

import cvxpy as cp
import numpy as np

from fedmodel.dsl.model import Model
from fedmodel.estimators._base import (
    ClassifierBase,
    FederatedEstimator,
    RegressorBase,
    check_bound,
    site_rows,
)

__all__ = [
    "FederatedLasso",
    "FederatedLinearRegression",
    "FederatedLinearSVC",
    "FederatedLogisticRegression",
    "FederatedQuantileRegressor",
    "FederatedRidge",
]

_NORMS = {1: 1, 2: 2, "inf": "inf", np.inf: "inf"}


class _Linear(FederatedEstimator):
    """The declaration every linear estimator shares: the coefficients ``w`` (and the
    intercept ``b``), one client per site, the norm budget on the server."""

    def __init__(
        self,
        *,
        fit_intercept: bool,
        norm_budget: float | None,
        budget_norm: Any,
        method: str,
        eps: float,
        solve_options: dict | None,
        site_column: str,
    ):  # (each estimator's own __init__ lists these with their defaults, as sklearn's)
        self.fit_intercept = fit_intercept
        self.norm_budget = norm_budget
        self.budget_norm = budget_norm
        self.method = method
        self.eps = eps
        self.solve_options = solve_options
        self.site_column = site_column

    def _variables(self, model: Model, d: int):
        w = model.variable(d, name="coef")
        b = model.variable(name="intercept") if self.fit_intercept else None
        return w, b

    def _validate_params(self) -> None:
        super()._validate_params()
        check_bound(self.norm_budget, "norm_budget")
        if self.budget_norm not in _NORMS:
            raise ValueError(f"budget_norm must be 1, 2 or 'inf', got {self.budget_norm!r}")

    def _budget(self, model: Model, w) -> None:
        if self.norm_budget is not None:
            norm = cp.norm(w, _NORMS[self.budget_norm])
            model.server.subject_to(norm <= self.norm_budget, name="norm budget")

    @staticmethod
    def _scores(site, X: np.ndarray, w, b, name: str = "X"):
        A = site.data(X, name=name)
        return A @ w + b if b is not None else A @ w


_SHARED = """
    fit_intercept : bool, default True
        Fit an intercept (never penalised, outside any budget).
    norm_budget : float, optional
        The server's constraint ``||coef_||_p <= norm_budget`` (``p = budget_norm``).
    budget_norm : {1, 2, "inf"}, default 1
        The norm of ``norm_budget``.
    method : str, default "prox-al"
        The solve method (``fedmodel.Model.solve``): a federated one, or ``"centralized"``
        for the pooled reference.
    eps : float, default 1e-4
        The certificate's tolerance.
    solve_options : dict, optional
        More options of the method (``time_limit``, ``backend``, ...).
    site_column : str, default "site"
        The site column of a DataFrame ``X``."""

_FITTED = """
    Attributes
    ----------
    coef_ : ndarray of shape (n_features,)
    intercept_ : float
    n_features_in_ : int
    feature_names_in_ : ndarray of str
        With a DataFrame ``X`` (the site column left out).
    result_ : fedmodel.Result
        The solve's result: status, certificate, duals of the constraints, rounds,
        communication."""


class _Classifier(ClassifierBase, _Linear):
    """A binary classifier: two classes of any labels, encoded as -1 and +1."""

    _estimator_type = "classifier"

    def __sklearn_tags__(self):
        """scikit-learn's tags: binary classification only (after its mixin's)."""
        tags = super().__sklearn_tags__()
        tags.classifier_tags.multi_class = False
        return tags

    def _prepare_targets(self, parts):
        labels = np.concatenate([p[1] for p in parts])
        if labels.dtype.kind in "fc" and np.any(labels != np.round(labels)):
            raise ValueError(
                "Unknown label type: continuous. A classifier takes class labels; for a "
                "continuous target use a regressor (FederatedLinearRegression, ...)"
            )
        classes = np.unique(labels)
        if len(classes) != 2:
            raise ValueError(
                f"Only binary classification is supported by {type(self).__name__}: y "
                f"needs exactly 2 classes, got {len(classes)} class"
                f"{'es' if len(classes) > 1 else ''} ({classes.tolist()[:5]})"
            )
        self.classes_ = classes
        return [(X, np.where(y == classes[1], 1.0, -1.0), s) for X, y, s in parts]

    def decision_function(self, X) -> np.ndarray:
        """``X @ coef_ + intercept_``: positive for ``classes_[1]``."""
        return self._linear(X)

    def predict(self, X) -> np.ndarray:
        """The class of each row (``classes_[1]`` where the decision function is positive)."""
        positive = self.decision_function(X) > 0
        return self.classes_[positive.astype(int)]

    def score(self, X, y, sample_weight=None) -> float:
        """Mean accuracy on ``(X, y)``."""
        return _accuracy(np.asarray(y), self.predict(X), sample_weight)


class FederatedLogisticRegression(_Classifier):
    __doc__ = (
        """Binary logistic regression fitted across sites, as scikit-learn's
    ``LogisticRegression(C=...)`` (an l2 penalty ``||w||^2 / 2`` against ``C`` times the
    summed log-loss, the intercept unpenalised) on the pooled rows.

    Parameters
    ----------
    C : float, default 1.0
        Inverse of the l2 penalty's weight (``None``: no penalty).
    neyman_pearson : float, optional
        Neyman-Pearson classification: minimise the loss on the negative class
        (``classes_[0]``) subject to each site's mean log-loss on its positive rows being
        at most this bound (a client constraint, the package's Neyman-Pearson model).
    fairness_bound : float, optional
        Each site's constraint ``|L_a - L_b| <= fairness_bound`` between the mean
        log-losses of its two sensitive groups (``groups`` in ``fit``, or the third item of
        each site); a difference of convex losses, so the certificate is a local one."""
        + _SHARED
        + """
"""
        + _FITTED
        + """
    classes_ : ndarray of shape (2,)

    Examples
    --------
    >>> import numpy as np
    >>> from fedmodel.estimators import FederatedLogisticRegression
    >>> rng = np.random.default_rng(0)
    >>> sites = []
    >>> for k in range(3):
    ...     X = rng.normal(size=(40, 2))
    ...     sites.append((X, (X[:, 0] + 0.5 * X[:, 1] > 0).astype(int)))
    >>> clf = FederatedLogisticRegression(C=1.0).fit(sites)
    >>> clf.result_.status, clf.predict(np.array([[2.0, 0.0], [-2.0, 0.0]])).tolist()
    ('optimal', [1, 0])
    >>> clf.predict_proba(np.array([[0.0, 0.0]])).shape
    (1, 2)
    """
    )

    def __init__(
        self,
        C: float | None = 1.0,
        *,
        fit_intercept: bool = True,
        neyman_pearson: float | None = None,
        fairness_bound: float | None = None,
        norm_budget: float | None = None,
        budget_norm: Any = 1,
        method: str = "prox-al",
        eps: float = 1e-4,
        solve_options: dict | None = None,
        site_column: str = "site",
    ):
        self.C = C
        self.neyman_pearson = neyman_pearson
        self.fairness_bound = fairness_bound
        _Linear.__init__(
            self,
            fit_intercept=fit_intercept,
            norm_budget=norm_budget,
            budget_norm=budget_norm,
            method=method,
            eps=eps,
            solve_options=solve_options,
            site_column=site_column,
        )

    def _validate_params(self) -> None:
        super()._validate_params()
        check_bound(self.C, "C")
        check_bound(self.neyman_pearson, "neyman_pearson")
        check_bound(self.fairness_bound, "fairness_bound")

    def _declare(self, parts):
        model = Model(type(self).__name__)
        w, b = self._variables(model, parts[0][0].shape[1])
        n = site_rows(parts)
        negatives = sum(int((y < 0).sum()) for _, y, _ in parts)
        for k, (X, y, s) in enumerate(parts):
            site = model.client(f"site{k}")
            if self.neyman_pearson is None:
                margin = self._scores(site, y[:, None] * X, w, None, "yX")
                if b is not None:
                    margin = margin + site.data(y, name="y") * b
                site.minimize(cp.sum(cp.logistic(-margin)) / n, name="log-loss")
            else:
                neg, pos = X[y < 0], X[y > 0]
                if len(neg):
                    scores = self._scores(site, neg, w, b, "X_negative")
                    site.minimize(cp.sum(cp.logistic(scores)) / negatives, name="log-loss")
                if len(pos):
                    scores = self._scores(site, pos, w, b, "X_positive")
                    loss = cp.sum(cp.logistic(-scores)) / len(pos)
                    site.subject_to(loss <= self.neyman_pearson, name="neyman-pearson")
            if self.fairness_bound is not None:
                self._fairness(site, X, y, s, w, b, k)
        if self.C is not None:  # ||w||^2 / 2 + C sum loss, over C N
            scale = (negatives if self.neyman_pearson is not None else n) * self.C
            model.regularize(cp.sum_squares(w) / (2 * scale))
        self._budget(model, w)
        return model, w, b

    def _fairness(self, site, X, y, s, w, b, k: int) -> None:
        if s is None:
            raise ValueError(
                "fairness_bound needs each row's sensitive group: fit(X, y, groups=...) or "
                "sites as (X, y, groups) triples"
            )
        losses = []
        for g in (1, 0):
            rows = s == g
            if not rows.any():
                raise ValueError(f"site {k} has no row of sensitive group {g}")
            margin = self._scores(site, y[rows][:, None] * X[rows], w, None, f"yX_group{g}")
            if b is not None:
                margin = margin + site.data(y[rows], name=f"y_group{g}") * b
            losses.append(cp.sum(cp.logistic(-margin)) / int(rows.sum()))
        gap = losses[0] - losses[1]
        site.subject_to(
            [gap <= self.fairness_bound, -gap <= self.fairness_bound],
            allow_nonconvex=True,
            name="loss disparity",
        )

    def predict_proba(self, X) -> np.ndarray:
        """Probabilities of ``classes_[0]`` and ``classes_[1]``, shape ``(n, 2)``."""
        p = 1.0 / (1.0 + np.exp(-self.decision_function(X)))
        return np.column_stack([1.0 - p, p])

    def predict_log_proba(self, X) -> np.ndarray:
        """Logarithm of :meth:`predict_proba`."""
        z = self.decision_function(X)
        return np.column_stack([-np.logaddexp(0.0, z), -np.logaddexp(0.0, -z)])


class FederatedLinearSVC(_Classifier):
    __doc__ = (
        """Linear support vector classifier fitted across sites: ``||w||^2 / 2 + C sum_i
    loss(y_i (x_i^T w + b))`` on the pooled rows with the hinge or squared hinge loss (as
    scikit-learn's ``LinearSVC``, whose liblinear solver also penalises the intercept:
    here it is not).

    Parameters
    ----------
    C : float, default 1.0
        Weight of the loss against the l2 penalty.
    loss : {"squared_hinge", "hinge"}, default "squared_hinge"
        ``max(0, 1 - m)^2`` (smooth) or ``max(0, 1 - m)`` (exact, through its epigraph)."""
        + _SHARED
        + """
"""
        + _FITTED
        + """
    classes_ : ndarray of shape (2,)

    Examples
    --------
    >>> import numpy as np
    >>> from fedmodel.estimators import FederatedLinearSVC
    >>> rng = np.random.default_rng(1)
    >>> X = rng.normal(size=(60, 2))
    >>> y = np.where(X[:, 0] - X[:, 1] > 0, "yes", "no")
    >>> svm = FederatedLinearSVC(C=1.0).fit(X, y, sites=np.arange(60) % 3)
    >>> svm.score(X, y) > 0.95
    True
    """
    )

    def __init__(
        self,
        C: float = 1.0,
        *,
        loss: str = "squared_hinge",
        fit_intercept: bool = True,
        norm_budget: float | None = None,
        budget_norm: Any = 1,
        method: str = "prox-al",
        eps: float = 1e-4,
        solve_options: dict | None = None,
        site_column: str = "site",
    ):
        self.C = C
        self.loss = loss
        _Linear.__init__(
            self,
            fit_intercept=fit_intercept,
            norm_budget=norm_budget,
            budget_norm=budget_norm,
            method=method,
            eps=eps,
            solve_options=solve_options,
            site_column=site_column,
        )

    def _validate_params(self) -> None:
        super()._validate_params()
        check_bound(self.C, "C")
        if self.loss not in ("hinge", "squared_hinge"):
            raise ValueError(f"loss must be 'hinge' or 'squared_hinge', got {self.loss!r}")

    def _declare(self, parts):
        model = Model(type(self).__name__)
        w, b = self._variables(model, parts[0][0].shape[1])
        n = site_rows(parts)
        for k, (X, y, _) in enumerate(parts):
            site = model.client(f"site{k}")
            margin = self._scores(site, y[:, None] * X, w, None, "yX")
            if b is not None:
                margin = margin + site.data(y, name="y") * b
            slack = cp.pos(1 - margin)
            loss = cp.sum(slack) if self.loss == "hinge" else cp.sum_squares(slack)
            site.minimize(self.C * loss / n, name=self.loss)
        model.regularize(cp.sum_squares(w) / (2 * n))
        self._budget(model, w)
        return model, w, b


class FederatedLinearRegression(RegressorBase, _Linear):
    __doc__ = (
        """Least squares fitted across sites, as scikit-learn's ``LinearRegression``: the
    mean squared error ``||y - X w - b||^2 / (2 N)`` over the pooled rows."""
        + "\n\n    Parameters\n    ----------"
        + _SHARED
        + """
"""
        + _FITTED
        + """

    Examples
    --------
    >>> import numpy as np
    >>> from fedmodel.estimators import FederatedLinearRegression
    >>> rng = np.random.default_rng(0)
    >>> X = rng.normal(size=(90, 3))
    >>> y = X @ np.array([1.0, -2.0, 0.5]) + 3.0
    >>> reg = FederatedLinearRegression().fit(X, y, sites=np.arange(90) % 3)
    >>> reg.coef_.round(4).tolist(), round(reg.intercept_, 4)
    ([1.0, -2.0, 0.5], 3.0)
    """
    )

    _estimator_type = "regressor"

    def __init__(
        self,
        *,
        fit_intercept: bool = True,
        norm_budget: float | None = None,
        budget_norm: Any = 1,
        method: str = "prox-al",
        eps: float = 1e-4,
        solve_options: dict | None = None,
        site_column: str = "site",
    ):
        _Linear.__init__(
            self,
            fit_intercept=fit_intercept,
            norm_budget=norm_budget,
            budget_norm=budget_norm,
            method=method,
            eps=eps,
            solve_options=solve_options,
            site_column=site_column,
        )

    def _prepare_targets(self, parts):
        return [(X, y.astype(float), s) for X, y, s in parts]

    def _loss(self, site, X, y, w, b, n):
        residual = self._scores(site, X, w, b) - site.data(y, name="y")
        return cp.sum_squares(residual) / (2 * n)

    def _penalty(self, model: Model, w, n: int) -> None:
        """The penalty on ``coef_`` (none for plain least squares)."""

    def _declare(self, parts):
        model = Model(type(self).__name__)
        w, b = self._variables(model, parts[0][0].shape[1])
        n = site_rows(parts)
        for k, (X, y, _) in enumerate(parts):
            site = model.client(f"site{k}")
            site.minimize(self._loss(site, X, y, w, b, n), name="loss")
        self._penalty(model, w, n)
        self._budget(model, w)
        return model, w, b

    def predict(self, X) -> np.ndarray:
        """``X @ coef_ + intercept_``."""
        return self._linear(X)

    def score(self, X, y, sample_weight=None) -> float:
        """The coefficient of determination R^2 on ``(X, y)``."""
        return _r2(np.asarray(y, dtype=float), self.predict(X), sample_weight)


class FederatedRidge(FederatedLinearRegression):
    __doc__ = (
        """Ridge regression fitted across sites, as scikit-learn's ``Ridge(alpha=...)``:
    ``||y - X w - b||^2 + alpha ||w||^2`` on the pooled rows (divided by ``2 N``).

    Parameters
    ----------
    alpha : float, default 1.0
        Weight of the l2 penalty (in ``h``, the server's prox)."""
        + _SHARED
        + "\n"
        + _FITTED
        + """

    Examples
    --------
    >>> import numpy as np
    >>> from fedmodel.estimators import FederatedRidge
    >>> rng = np.random.default_rng(0)
    >>> X = rng.normal(size=(60, 2)); y = X @ np.array([1.0, 1.0])
    >>> FederatedRidge(alpha=1.0).fit(X, y, sites=np.arange(60) % 2).score(X, y) > 0.99
    True
    """
    )

    def __init__(
        self,
        alpha: float = 1.0,
        *,
        fit_intercept: bool = True,
        norm_budget: float | None = None,
        budget_norm: Any = 1,
        method: str = "prox-al",
        eps: float = 1e-4,
        solve_options: dict | None = None,
        site_column: str = "site",
    ):
        self.alpha = alpha
        _Linear.__init__(
            self,
            fit_intercept=fit_intercept,
            norm_budget=norm_budget,
            budget_norm=budget_norm,
            method=method,
            eps=eps,
            solve_options=solve_options,
            site_column=site_column,
        )

    def _validate_params(self) -> None:
        super()._validate_params()
        if not (isinstance(self.alpha, (int, float)) and self.alpha >= 0):
            raise ValueError(f"alpha must be a nonnegative number, got {self.alpha!r}")

    def _penalty(self, model: Model, w, n: int) -> None:
        if self.alpha > 0:
            model.regularize(self.alpha / (2 * n) * cp.sum_squares(w))


class FederatedLasso(FederatedRidge):
    __doc__ = (
        """The lasso fitted across sites, as scikit-learn's ``Lasso(alpha=...)``:
    ``||y - X w - b||^2 / (2 N) + alpha ||w||_1`` on the pooled rows.

    Parameters
    ----------
    alpha : float, default 1.0
        Weight of the l1 penalty (in ``h``: its exact prox at the server)."""
        + _SHARED
        + "\n"
        + _FITTED
        + """

    Examples
    --------
    >>> import numpy as np
    >>> from fedmodel.estimators import FederatedLasso
    >>> rng = np.random.default_rng(0)
    >>> X = rng.normal(size=(90, 4)); y = X @ np.array([2.0, 0.0, 0.0, -1.0])
    >>> lasso = FederatedLasso(alpha=0.1).fit(X, y, sites=np.arange(90) % 3)
    >>> (np.abs(lasso.coef_) > 1e-6).tolist()
    [True, False, False, True]
    """
    )

    def _penalty(self, model: Model, w, n: int) -> None:
        if self.alpha > 0:
            model.regularize(self.alpha * cp.norm1(w))


class FederatedQuantileRegressor(FederatedLasso):
    __doc__ = (
        """Quantile regression fitted across sites, as scikit-learn's
    ``QuantileRegressor(quantile=..., alpha=...)``: the mean pinball loss
    ``(1/N) sum_i q max(r_i, 0) + (1 - q) max(-r_i, 0)`` (``r = y - X w - b``) plus
    ``alpha ||w||_1`` on the pooled rows (the pinball loss through its exact epigraph form).

    Parameters
    ----------
    quantile : float, default 0.5
        The quantile ``q`` in ``(0, 1)``.
    alpha : float, default 1.0
        Weight of the l1 penalty."""
        + _SHARED
        + "\n"
        + _FITTED
        + """

    Examples
    --------
    >>> import numpy as np
    >>> from fedmodel.estimators import FederatedQuantileRegressor
    >>> rng = np.random.default_rng(0)
    >>> X = rng.normal(size=(60, 1)); y = 2 * X[:, 0] + rng.normal(size=60)
    >>> q90 = FederatedQuantileRegressor(quantile=0.9, alpha=0.0).fit(X, y, sites=np.arange(60) % 2)
    >>> 0.8 <= float(np.mean(y <= q90.predict(X))) <= 1.0
    True
    """
    )

    def __init__(
        self,
        quantile: float = 0.5,
        alpha: float = 1.0,
        *,
        fit_intercept: bool = True,
        norm_budget: float | None = None,
        budget_norm: Any = 1,
        method: str = "prox-al",
        eps: float = 1e-4,
        solve_options: dict | None = None,
        site_column: str = "site",
    ):
        self.quantile = quantile
        self.alpha = alpha
        _Linear.__init__(
            self,
            fit_intercept=fit_intercept,
            norm_budget=norm_budget,
            budget_norm=budget_norm,
            method=method,
            eps=eps,
            solve_options=solve_options,
            site_column=site_column,
        )

    def _validate_params(self) -> None:
        super()._validate_params()
        if not (isinstance(self.quantile, (int, float)) and 0 < self.quantile < 1):
            raise ValueError(f"quantile must be in (0, 1), got {self.quantile!r}")

    def _loss(self, site, X, y, w, b, n):
        r = site.data(y, name="y") - self._scores(site, X, w, b)
        q = self.quantile
        return cp.sum(q * cp.pos(r) + (1 - q) * cp.pos(-r)) / n


def _accuracy(y: np.ndarray, pred: np.ndarray, weight) -> float:
    hit = (y == pred).astype(float)
    return float(np.average(hit, weights=weight))


def _r2(y: np.ndarray, pred: np.ndarray, weight) -> float:
    w = np.ones_like(y) if weight is None else np.asarray(weight, dtype=float)
    mean = np.average(y, weights=w)
    total = float(np.sum(w * (y - mean) ** 2))
    residual = float(np.sum(w * (y - pred) ** 2))
    if total == 0.0:
        return 1.0 if residual == 0.0 else 0.0
    return 1.0 - residual / total
