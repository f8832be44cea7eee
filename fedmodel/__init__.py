"""fedmodel: federated optimization with constraints.

Declare a model with cvxpy expressions, solve it with a published federated algorithm
(seed 000's proximal augmented Lagrangian with inexact ADMM), and certify the answer
against the centralized optimum by its KKT residuals.

Examples
--------
>>> import numpy as np, cvxpy as cp, fedmodel as fm
>>> rng = np.random.default_rng(0)
>>> model = fm.Model("demo")
>>> w = model.variable(3, name="w")
>>> for k in range(3):
...     site = model.client(f"site{k}")
...     A = site.data(rng.normal(size=(30, 3)), name="A")
...     site.minimize(cp.sum_squares(A @ w - 1) / 90)
...     budget = site.subject_to(cp.sum(w) <= 1)
>>> res = model.solve(method="prox-al", eps=1e-5)
>>> ref = model.solve(method="centralized")
>>> res.compare(ref).relative_objective_difference < 1e-4
True
"""

from fedmodel import models  # fm.models.fair_vfl, ...
from fedmodel.algorithms.dp import DP
from fedmodel.dsl.data import PrivateData
from fedmodel.dsl.fairness import deo
from fedmodel.dsl.learning import LearningModel
from fedmodel.dsl.model import Model
from fedmodel.dsl.party import Client, Server
from fedmodel.errors import (
    DataError,
    FedModelError,
    ModelError,
    NonConvexError,
    OwnershipError,
    UnsupportedError,
)
from fedmodel.result import STATUSES, Comparison, Result, StatusInfo
from fedmodel.runtime.outcomes import RequestRefused
from fedmodel.runtime.secure_aggregation import SecureAggregation

__version__ = "0.1.0"

__all__ = [
    "DP",
    "Client",
    "Comparison",
    "DataError",
    "FedModelError",
    "LearningModel",
    "Model",
    "ModelError",
    "NonConvexError",
    "OwnershipError",
    "PrivateData",
    "RequestRefused",
    "Result",
    "SecureAggregation",
    "STATUSES",
    "Server",
    "StatusInfo",
    "UnsupportedError",
    "__version__",
    "deo",
    "models",
]
