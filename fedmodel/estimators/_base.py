"""What every federated estimator shares: scikit-learn's estimator API without needing
scikit-learn, the per-site input, and the fit that declares a model and solves it.

The API follows scikit-learn's ``BaseEstimator`` contract, implemented here so that the
estimators work without scikit-learn: every parameter is an argument of ``__init__``
stored unchanged under its own name, ``get_params`` reads them by inspecting the
signature, ``set_params`` writes them, and ``fit`` validates them and sets the fitted
attributes (ending in ``_``). With scikit-learn installed the estimators are its
estimators as well: :class:`FederatedEstimator` derives from ``sklearn.base.BaseEstimator``
and the classifiers and regressors from its ``ClassifierMixin`` and ``RegressorMixin``
(``SklearnBase``, ``ClassifierBase``, ``RegressorBase``: empty classes
without scikit-learn), so that its tools (``clone``, ``GridSearchCV``, ``Pipeline``,
``cross_val_score``, the estimator checks) recognise them; their tags are
``__sklearn_tags__`` (``_more_tags`` before scikit-learn 1.6).
"""

from __future__ import annotations

import functools
import inspect
import sys
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["FederatedEstimator", "FitWarning", "NotFittedError"]

try:  # (scikit-learn is optional: its bases and warning when it is installed)
    from sklearn.base import BaseEstimator as SklearnBase
    from sklearn.base import ClassifierMixin as ClassifierBase
    from sklearn.base import RegressorMixin as RegressorBase
    from sklearn.exceptions import DataConversionWarning
except ImportError:  # (a test hides scikit-learn)
    SklearnBase = object  # type: ignore[misc,assignment]
    DataConversionWarning = UserWarning  # type: ignore[misc,assignment]

    class ClassifierBase:  # type: ignore[no-redef]
        """Stands for scikit-learn's ``ClassifierMixin`` without scikit-learn."""

    class RegressorBase:  # type: ignore[no-redef]
        """Stands for scikit-learn's ``RegressorMixin`` without scikit-learn."""


class NotFittedError(ValueError, AttributeError):
    """A fitted estimator's method called before ``fit`` (as scikit-learn's)."""


def _not_fitted_error() -> type:
    """:class:`NotFittedError`, also a scikit-learn ``NotFittedError`` when scikit-learn is
    loaded (its tools catch their own class)."""
    sk = sys.modules.get("sklearn.exceptions")
    if sk is None:
        return NotFittedError
    return _both(sk.NotFittedError)


@functools.lru_cache(maxsize=1)
def _both(theirs: type) -> type:
    return type("NotFittedError", (NotFittedError, theirs), {"__module__": __name__})


class FitWarning(UserWarning):
    """A fit whose solve did not end ``"optimal"`` (``est.result_.status`` says how it ended,
    ``est.result_.message`` what to do)."""


def check_array(X: Any, what: str = "X") -> np.ndarray:
    """``X`` as a finite 2-d float array with at least one row and one column; the
    messages are scikit-learn's."""
    if hasattr(X, "toarray"):  # scipy.sparse
        X = X.toarray()
    arr = np.asarray(X)
    if np.iscomplexobj(arr):
        raise ValueError("Complex data not supported")
    try:
        arr = arr.astype(float)
    except ValueError as exc:
        raise ValueError(f"{what} could not be converted to numbers: {exc}") from None
    if arr.ndim != 2:
        raise ValueError(
            f"Expected 2D array, got {arr.ndim}D array instead. Reshape your data either "
            "using array.reshape(-1, 1) if your data has a single feature or "
            "array.reshape(1, -1) if it contains a single sample."
        )
    if arr.shape[0] < 1:
        raise ValueError(
            f"Found array with 0 sample(s) (shape={arr.shape}) while a minimum of 1 is required."
        )
    if arr.shape[1] < 1:
        raise ValueError(
            f"Found array with 0 feature(s) (shape={arr.shape}) while a minimum of 1 is required."
        )
    if not np.all(np.isfinite(arr)):
        kind = "NaN" if np.isnan(arr).any() else "infinity"
        raise ValueError(f"Input {what} contains {kind}.")
    return arr


def check_target(y: Any, n: int) -> np.ndarray:
    """``y`` as a 1-d array of ``n`` labels or values (a column vector is flattened)."""
    arr = np.asarray(y)
    if arr.ndim == 2 and arr.shape[1] == 1:
        warnings.warn(
            "A column-vector y was passed when a 1d array was expected. Please change the "
            "shape of y to (n_samples, ), for example using ravel().",
            DataConversionWarning,
            stacklevel=3,
        )
        arr = arr.ravel()
    if arr.ndim != 1:
        raise ValueError(f"y should be a 1d array, got an array of shape {arr.shape} instead.")
    if arr.shape[0] != n:
        raise ValueError(
            f"Found input variables with inconsistent numbers of samples: [{n}, {arr.shape[0]}]"
        )
    if arr.dtype.kind in "fc" and not np.all(np.isfinite(arr)):
        raise ValueError("Input y contains NaN or infinity.")
    return arr


class FederatedEstimator(SklearnBase):
    """Base of the federated estimators: scikit-learn's estimator API on a federated model.

    A subclass declares its parameters as keyword arguments of ``__init__`` (stored as
    given), its fitted model in :meth:`_declare` (a :class:`fedmodel.Model` over the sites'
    data) and its predictions. ``fit`` takes the sites' data in any of three forms:

    * a list of per-site ``(X_k, y_k)`` pairs (or ``(X_k, y_k, s_k)`` triples with a
      sensitive attribute, for a fairness bound) and no ``y``;
    * a pandas DataFrame with a site column (``site_column``, default ``"site"``) and ``y``;
    * one array ``X`` and ``y`` with ``sites=`` (each row's site; one site when None).

    Every site becomes one client of the model; the estimator solves it with ``method``
    (default ``"prox-al"``, federated) and keeps the :class:`~fedmodel.Result` as
    ``result_``.
    """

    _estimator_type = ""

    # -- scikit-learn's parameter protocol ----------------------------------------------------
    @classmethod
    def _get_param_names(cls) -> list[str]:
        params = inspect.signature(cls.__init__).parameters.values()
        kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        return sorted(p.name for p in params if p.name != "self" and p.kind in kinds)

    def get_params(self, deep: bool = True) -> dict[str, Any]:
        """The estimator's parameters by name (``deep`` is accepted for scikit-learn; these
        estimators hold no sub-estimators)."""
        return {name: getattr(self, name) for name in self._get_param_names()}

    def set_params(self, **params: Any) -> FederatedEstimator:
        """Set parameters by name and return the estimator; an unknown name is a
        ``ValueError`` listing the valid ones."""
        valid = self._get_param_names()
        for name, value in params.items():
            if name not in valid:
                raise ValueError(
                    f"Invalid parameter {name!r} for estimator {type(self).__name__}. "
                    f"Valid parameters are: {valid!r}."
                )
            setattr(self, name, value)
        return self

    def __repr__(self) -> str:
        defaults = {
            p.name: p.default for p in inspect.signature(type(self).__init__).parameters.values()
        }
        shown = [
            f"{k}={v!r}" for k, v in self.get_params().items() if not _same(v, defaults.get(k))
        ]
        return f"{type(self).__name__}({', '.join(shown)})"

    def __sklearn_tags__(self):
        """scikit-learn's tags: its base's and mixin's, with a required target and sparse
        input accepted (densified)."""
        tags = super().__sklearn_tags__()
        tags.target_tags.required = True
        tags.input_tags.sparse = True
        return tags

    def _more_tags(self) -> dict[str, Any]:  # scikit-learn before 1.6
        return {"binary_only": True, "requires_y": True}

    # -- fit ----------------------------------------------------------------------------------
    def fit(self, X: Any, y: Any = None, *, sites: Any = None, groups: Any = None):
        """Declare the federated model over the sites' data, solve it and keep the result.

        Parameters
        ----------
        X : list of (X_k, y_k) or (X_k, y_k, s_k), DataFrame with a site column, or array
            The sites' data (see the class docstring).
        y : array-like, optional
            The targets of ``X`` when ``X`` is a DataFrame or an array.
        sites : array-like, optional
            With an array ``X``: each row's site (rows of a site become one client).
        groups : array-like, optional
            With a DataFrame or an array ``X``: each row's sensitive group (0/1), for a
            fairness bound.

        Returns
        -------
        self
        """
        parts, names = self._split_sites(X, y, sites, groups)
        self.n_features_in_ = parts[0][0].shape[1]
        if names is not None:
            self.feature_names_in_ = np.asarray(names, dtype=object)
        elif hasattr(self, "feature_names_in_"):
            del self.feature_names_in_
        parts = self._prepare_targets(parts)
        self._validate_params()
        model, coef, intercept = self._declare(parts)
        options = dict(self.solve_options or {})
        options.setdefault("eps", self.eps)
        res = model.solve(method=self.method, **options)
        self.result_ = res
        if coef.value is None:
            raise RuntimeError(
                f"{type(self).__name__}: the solve returned no point (status {res.status!r}: "
                f"{res.message})"
            )
        self.coef_ = np.asarray(coef.value, dtype=float).reshape(-1)
        self.intercept_ = float(intercept.value) if intercept is not None else 0.0
        if res.status != "optimal":
            warnings.warn(
                f"{type(self).__name__}: method={self.method!r} ended with status "
                f"{res.status!r}: {res.message}",
                FitWarning,
                stacklevel=2,
            )
        return self

    def _validate_params(self) -> None:
        if not isinstance(self.method, str):
            raise ValueError(f"method must be a method name, got {self.method!r}")
        if not (isinstance(self.eps, (int, float)) and self.eps > 0):
            raise ValueError(f"eps must be a positive number, got {self.eps!r}")
        if self.solve_options is not None and not isinstance(self.solve_options, dict):
            raise ValueError(f"solve_options must be a dict or None, got {self.solve_options!r}")

    def _split_sites(self, X, y, sites, groups):
        """``[(X_k, y_k, s_k or None), ...]`` and the feature names (or None)."""
        if y is None and isinstance(X, (list, tuple)) and X and isinstance(X[0], (list, tuple)):
            parts = []
            for k, part in enumerate(X):
                if len(part) not in (2, 3):
                    raise ValueError(
                        f"site {k}: expected (X, y) or (X, y, groups), got {len(part)} items"
                    )
                Xk = check_array(part[0], f"X of site {k}")
                yk = check_target(part[1], Xk.shape[0])
                sk = check_target(part[2], Xk.shape[0]) if len(part) == 3 else None
                parts.append((Xk, yk, sk))
            if len({p[0].shape[1] for p in parts}) != 1:
                raise ValueError(
                    f"the sites' X have different numbers of features: {[p[0].shape[1] for p in parts]}"
                )
            return parts, None
        if y is None:
            raise ValueError(
                f"{type(self).__name__} requires y to be passed, but the target y is None "
                "(or pass a list of per-site (X, y) pairs)"
            )
        names = None
        if hasattr(X, "columns") and hasattr(X, "iloc"):  # a pandas DataFrame
            if sites is None and self.site_column in X.columns:
                sites = np.asarray(X[self.site_column])
                X = X.drop(columns=[self.site_column])
            names = [str(c) for c in X.columns]
        Xa = check_array(X)
        ya = check_target(y, Xa.shape[0])
        sa = None if groups is None else check_target(groups, Xa.shape[0])
        if sites is None:
            return [(Xa, ya, sa)], names
        sites = check_target(sites, Xa.shape[0])
        parts = []
        for label in dict.fromkeys(sites.tolist()):  # in order of first appearance
            rows = sites == label
            parts.append((Xa[rows], ya[rows], None if sa is None else sa[rows]))
        return parts, names

    def _prepare_targets(self, parts):
        """The targets as the model uses them (a classifier encodes its two classes)."""
        return parts

    def _declare(self, parts):
        """``(model, coef, intercept)``: the :class:`fedmodel.Model` over ``parts`` and its
        coefficient and intercept variables (intercept None without one)."""
        raise NotImplementedError(f"{type(self).__name__} does not define this abstract method")

    # -- prediction ---------------------------------------------------------------------------
    def _check_fitted(self) -> None:
        if not hasattr(self, "coef_"):
            raise _not_fitted_error()(
                f"This {type(self).__name__} instance is not fitted yet. Call 'fit' with "
                "appropriate arguments before using this estimator."
            )

    def _input(self, X) -> np.ndarray:
        self._check_fitted()
        if hasattr(X, "columns") and self.site_column in getattr(X, "columns", ()):
            X = X.drop(columns=[self.site_column])
        Xa = check_array(X)
        if Xa.shape[1] != self.n_features_in_:
            raise ValueError(
                f"X has {Xa.shape[1]} features, but {type(self).__name__} is expecting "
                f"{self.n_features_in_} features as input."
            )
        return Xa

    def _linear(self, X) -> np.ndarray:
        """``X @ coef_ + intercept_``."""
        return self._input(X) @ self.coef_ + self.intercept_


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a is b or (type(a) is type(b) and a == b))
    except (TypeError, ValueError):
        return False


def site_rows(parts: Sequence[tuple]) -> int:
    """Rows over all sites."""
    return int(sum(p[0].shape[0] for p in parts))


def check_bound(value: Any, name: str) -> None:
    """``value`` is None or a positive number (a constraint's bound)."""
    if value is not None and not (isinstance(value, (int, float)) and value > 0):
        raise ValueError(f"{name} must be a positive number or None, got {value!r}")
