"""Seed 002's model: vertical logistic regression under the DEO constraint.

``fair_vfl(X, y, group, blocks, eps)`` builds the paper's model: party ``k`` owns the
columns ``blocks[k]`` of ``X`` and its parameter block ``theta_k``, and publishes only its
partial scores ``X_k theta_k``; the server (and every party) knows the labels and the
groups; the server's loss and constraint use only the published scores:

    min_theta (1/n) sum_i log(1 + exp(-y_i z_i)) + sum_k l2 ||theta_k||^2,  z = sum_k X_k theta_k
    s.t. |lhat^a(z) - lhat^b(z)| <= eps                                   (DEO, eq. 3)

``model.solve(method="fair-vfl", Q=4)`` and ``method="fedbcd"`` dispatch through the method
registry to :mod:`fedmodel.algorithms.vfl`; ``method="centralized"`` solves the pooled
model and certifies it (:mod:`fedmodel.algorithms.vfl.reference`).

The builder writes the model with the generic DSL (:func:`vertical_dsl_model`: each party
``party.variable`` for ``theta_k``, ``party.publish(party.data(X_k) @ theta_k)``, the server's
logistic loss of the summed scores and ``cp.abs(fm.deo(scores, y, s)) <= eps``) and converts
it with the vfl family's recogniser (:func:`fedmodel.algorithms.vfl.recognize.recognize`);
``model.dsl`` is that DSL model (``model.dsl.solve(method="fair-vfl")`` is the same solve
without the held-out part).

Examples
--------
>>> import numpy as np
>>> import fedmodel as fm
>>> rng = np.random.default_rng(0)
>>> X = rng.normal(size=(300, 6)); group = rng.random(300) < 0.5
>>> y = (X[:, 0] + group + 0.5 * rng.normal(size=300) > 0.5).astype(int)
>>> model = fm.models.fair_vfl(X, y, group, blocks=[3, 3], eps=0.05)
>>> res = model.solve(method="fair-vfl", Q=4, eta=2.0, max_rounds=400)
>>> ref = model.solve(method="centralized")
>>> ref.status, res.extra["train"]["deo_loss"] <= 0.05 + 5e-3
('optimal', True)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from fedmodel.errors import ModelError
from fedmodel.result import Result


def _pm1(y, where: str) -> np.ndarray:
    y = np.asarray(y).ravel()
    values = set(np.unique(y).tolist())
    if values <= {0, 1}:
        return np.where(y == 1, 1.0, -1.0)
    if values <= {-1, 1}:
        return y.astype(float)
    raise ModelError(f"{where}: labels must be 0/1 or -1/+1, got values {sorted(values)[:5]}")


class VerticalModel:
    """A vertical model: parties' column blocks, the server's labels and groups, ``eps``.

    Attributes
    ----------
    problem : fedmodel.algorithms.vfl.problem.VerticalProblem
    eps : float
    dsl : fedmodel.Model or None
        The same model in the DSL (what :func:`fair_vfl` built and converted).
    """

    def __init__(self, problem, eps: float, name: str = "fair-vfl", dsl=None):
        self.problem = problem
        self.eps = float(eps)
        self.name = name
        self.dsl = dsl

    @property
    def parties(self) -> list[str]:
        return list(self.problem.party_names)

    def solve(self, method: str = "fair-vfl", **options: Any) -> Result:
        """Solve with a vertical method (``"fair-vfl"``, ``"fedbcd"``) or the certified
        centralized reference (``"centralized"`` or ``"cprox-al"``: the DEO-constrained
        model; with ``constrained=False`` the plain regularised logistic regression).

        ``constraint="tpr"`` (with ``eps=`` and ``tpr_temperature=``) constrains instead the
        smooth surrogate of the TPR gap, in fair-vfl and in the reference alike
        (:class:`~fedmodel.algorithms.vfl.problem.ScoreFunctions`); ``res.extra
        ["constraint"]`` then reports the true TPR gap and the surrogate's error bound."""
        from fedmodel.algorithms.registry import method_spec
        from fedmodel.algorithms.vfl.solve import solve_problem

        return solve_problem(self.problem, self.eps, method, options, method_spec)

    def summary(self) -> str:
        p = self.problem
        lines = [f"vertical model {self.name!r}: n = {p.n}, K = {p.K}, eps = {self.eps:g}"]
        for name, m in zip(p.party_names, p.sizes):
            lines.append(f"  {name}: {m} columns, owns theta ({m},), publishes X theta ({p.n},)")
        lines.append("  server: labels, groups; loss and DEO constraint on the published scores")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"VerticalModel({self.name!r}, n={self.problem.n}, K={self.problem.K}, eps={self.eps:g})"


def fair_vfl(
    X: np.ndarray,
    y: np.ndarray,
    group: np.ndarray,
    blocks: Sequence[int] | Sequence[Sequence[int]],
    eps: float = 0.01,
    *,
    party_names: Sequence[str] | None = None,
    l2: float | None = None,
    X_test: np.ndarray | None = None,
    y_test: np.ndarray | None = None,
    group_test: np.ndarray | None = None,
) -> VerticalModel:
    """Build seed 002's model.

    Parameters
    ----------
    X : array (n, m)
        Features; party ``k`` gets the columns ``blocks[k]``.
    y : array (n,)
        Labels, 0/1 or -1/+1; ``1`` is the class the DEO compares (Definition 1's positive
        label).
    group : array (n,)
        Protected group: truthy = group ``a``.
    blocks : list of block sizes (contiguous) or of column-index lists (disjoint).
    eps : float
        DEO tolerance.
    party_names : list of str, optional
    l2 : float, optional
        ``h_k = l2 ||theta_k||^2`` (default ``1/n``, the paper).
    X_test, y_test, group_test : optional held-out part (each party holds its columns).

    Returns
    -------
    VerticalModel
    """
    from fedmodel.algorithms.vfl.problem import column_blocks
    from fedmodel.algorithms.vfl.recognize import recognize

    if eps < 0:
        raise ModelError(f"eps must be >= 0, got {eps}")
    X = np.asarray(X, dtype=float)
    names = list(party_names) if party_names is not None else None
    cols = column_blocks(X.shape[1], blocks, names)
    names = names or [f"party{k}" for k in range(len(cols))]
    y_pm = _pm1(y, "y")
    dsl = vertical_dsl_model(X, y_pm, np.asarray(group) != 0, cols, eps, names, l2)
    problem, _ = recognize(dsl)
    if X_test is not None:
        problem = type(problem)(
            problem.blocks,
            problem.y,
            problem.group_a,
            problem.party_names,
            problem.l2,
            test_blocks=[np.asarray(X_test, float)[:, c] for c in cols],
            y_test=_pm1(y_test, "y_test"),
            group_a_test=np.asarray(group_test) != 0,
        )
    else:  # the small-block warning of the problem (Theorem 1)
        problem = type(problem)(
            problem.blocks, problem.y, problem.group_a, problem.party_names, problem.l2
        )
    return VerticalModel(problem, eps, dsl=dsl)


def vertical_dsl_model(
    X: np.ndarray,
    y_pm1: np.ndarray,
    group_a: np.ndarray,
    cols: Sequence[np.ndarray],
    eps: float,
    party_names: Sequence[str],
    l2: float | None = None,
    name: str = "fair-vfl",
):
    """Seed 002's model written with the DSL (the form of the issue's example).

    Party ``k`` owns ``theta_k`` (``party.variable``), publishes ``X_k theta_k`` and
    minimizes ``l2 ||theta_k||^2``; the server holds the labels and groups, minimizes the
    mean logistic loss of the summed published scores and constrains the DEO.
    """
    import cvxpy as cp

    from fedmodel.dsl.fairness import deo
    from fedmodel.dsl.model import Model

    n = len(y_pm1)
    l2 = 1.0 / n if l2 is None else float(l2)
    model = Model(name)
    scores = 0
    for party_name, c in zip(party_names, cols):
        party = model.client(party_name)
        theta = party.variable(len(c), name=f"theta_{party_name}")
        Xk = party.data(X[:, c], name="X")
        scores = scores + party.publish(Xk @ theta, name="partial scores")
        party.minimize(l2 * cp.sum_squares(theta), name="h")
    y = model.server.data(y_pm1, name="y")
    s = model.server.data(np.asarray(group_a, dtype=float), name="group")
    model.server.minimize(cp.sum(cp.logistic(-cp.multiply(y, scores))) / n, name="loss")
    model.server.subject_to(cp.abs(deo(scores, y, s)) <= eps, allow_nonconvex=True, name="DEO")
    return model
