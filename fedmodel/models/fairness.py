"""Seed 000 problem (28): classification with global and local loss-disparity constraints.

    min_w (1/n) sum_i (1/m_i) sum_j phi(w; x_j^(i), y_j^(i))
    s.t.  -r <= L_i^a(w) - L_i^b(w) <= r,   0 <= i <= n   (i = 0: the server's data)

where L^a, L^b are mean logistic losses over the two sensitive groups. The constraints are
differences of convex functions (non-convex), so they are declared with
``allow_nonconvex=True`` and the reference is cprox-al, as in the paper.
"""

from __future__ import annotations

from collections.abc import Sequence

import cvxpy as cp
import numpy as np

from fedmodel.dsl.model import Model
from fedmodel.dsl.party import Party


def _mean_logistic_loss(party: Party, X: np.ndarray, y: np.ndarray, w, tag: str):
    """(1/m) sum_j [log(1 + exp(x_j^T w)) - y_j x_j^T w] on the party's own data."""
    m = X.shape[0]
    A = party.data(X, name=f"X_{tag}")
    lin = party.data(X.T @ y / m, name=f"Xty_{tag}")
    return cp.sum(cp.logistic(A @ w)) / m - lin @ w


def _disparity(party: Party, X, y, s, w, r: float) -> None:
    ga, gb = s == 1, s == 0
    if ga.sum() == 0 or gb.sum() == 0:
        raise ValueError(f"party '{party.name}' has an empty sensitive group")
    la = _mean_logistic_loss(party, X[ga], y[ga], w, "a")
    lb = _mean_logistic_loss(party, X[gb], y[gb], w, "b")
    party.subject_to([la - lb <= r, lb - la <= r], allow_nonconvex=True, name="loss disparity")


def fairness_model(
    clients: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]],
    server: tuple[np.ndarray, np.ndarray, np.ndarray] | None,
    r: float = 0.1,
    name: str = "fairness",
) -> Model:
    """Build problem (28).

    Parameters
    ----------
    clients : sequence of (X, y, s)
        Each client's features, 0/1 labels and 0/1 sensitive attribute.
    server : (X, y, s) or None
        The server's data for the global disparity constraint (seed 000 gives it the test set).
    r : float
        Disparity bound.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> def part(m):
    ...     return rng.normal(size=(m, 3)), rng.integers(0, 2, m), np.arange(m) % 2
    >>> fairness_model([part(40), part(40)], part(30), r=0.1).clients[1].name
    'client2'
    """
    model = Model(name)
    d = np.shape(clients[0][0])[1]
    w = model.variable(d, name="w")
    n = len(clients)
    for i, (X, y, s) in enumerate(clients):
        site = model.client(f"client{i + 1}")
        X, y, s = np.asarray(X, float), np.asarray(y, float), np.asarray(s)
        m = X.shape[0]
        A = site.data(X, name="X")
        lin = site.data(X.T @ y / (m * n), name="Xty")
        site.minimize(cp.sum(cp.logistic(A @ w)) / (m * n) - lin @ w, name="classification loss")
        _disparity(site, X, y, s, w, r)
    if server is not None:
        X, y, s = (np.asarray(a) for a in server)
        _disparity(model.server, X.astype(float), y.astype(float), s, w, r)
    return model
