"""Seed 000 problem (26): federated Neyman-Pearson classification with logistic loss.

    min_w (1/n) sum_i (1/m_i0) sum_j phi(w; x_j^(i0), 0)
    s.t.  (1/m_i1) sum_j phi(w; x_j^(i1), 1) <= r,   1 <= i <= n

with phi(w; x, 0) = log(1 + exp(w^T x)) and phi(w; x, 1) = log(1 + exp(-w^T x)).
"""

from __future__ import annotations

from collections.abc import Sequence

import cvxpy as cp
import numpy as np

from fedmodel.dsl.model import Model


def neyman_pearson_model(
    sites: Sequence[tuple[np.ndarray, np.ndarray]],
    r: float = 0.2,
    name: str = "neyman-pearson",
    global_bound: float | None = None,
) -> Model:
    """Build problem (26) from per-site ``(X0, X1)`` (class-0 and class-1 feature rows).

    Parameters
    ----------
    sites : sequence of (X0, X1)
        Each client's class-0 rows (objective) and class-1 rows (constraint).
    r : float
        Bound on each client's class-1 loss.
    global_bound : float, optional
        Adds the server constraint ``||w||_inf <= global_bound`` (as in the README).

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> sites = [(rng.normal(size=(20, 3)), rng.normal(1, 1, size=(10, 3))) for _ in range(2)]
    >>> neyman_pearson_model(sites, r=0.5).clients[0].name
    'site0'
    """
    model = Model(name)
    d = np.shape(sites[0][0])[1]
    w = model.variable(d, name="w")
    n = len(sites)
    for k, (X0, X1) in enumerate(sites):
        site = model.client(f"site{k}")
        A0 = site.data(X0, name="class0")
        A1 = site.data(X1, name="class1")
        site.minimize(cp.sum(cp.logistic(A0 @ w)) / (np.shape(X0)[0] * n), name="class-0 loss")
        site.subject_to(cp.sum(cp.logistic(-(A1 @ w))) / np.shape(X1)[0] <= r, name="class-1 loss")
    if global_bound is not None:
        model.server.subject_to(cp.norm(w, "inf") <= global_bound, name="||w||_inf bound")
    return model
