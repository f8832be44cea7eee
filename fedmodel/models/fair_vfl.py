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

This builder works on the vertical problem representation of
:mod:`fedmodel.algorithms.vfl.problem`; writing the same model with the generic DSL
(``party.variable`` / ``party.publish``) is the planned next step once party-owned variables
exist in the DSL.

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

REFERENCE_METHODS = ("centralized", "vfl-reference")


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
    """

    def __init__(self, problem, eps: float, name: str = "fair-vfl"):
        self.problem = problem
        self.eps = float(eps)
        self.name = name

    @property
    def parties(self) -> list[str]:
        return list(self.problem.party_names)

    def solve(self, method: str = "fair-vfl", **options: Any) -> Result:
        """Solve with a vertical method (``"fair-vfl"``, ``"fedbcd"``) or the certified
        centralized reference (``"centralized"``: the DEO-constrained model; with
        ``constrained=False`` the plain regularised logistic regression)."""
        if method in REFERENCE_METHODS:
            from fedmodel.algorithms.vfl.reference import solve_constrained, solve_unconstrained

            constrained = options.pop("constrained", True)
            if constrained:
                options.setdefault("eps", self.eps)
                return solve_constrained(self.problem, **options)
            return solve_unconstrained(self.problem, **options)
        from fedmodel.algorithms.options import build_options
        from fedmodel.algorithms.registry import method_spec

        spec = method_spec(method)
        if not spec.vertical:
            raise ModelError(
                f"method='{method}' solves horizontal DSL models; a vertical model takes "
                "'fair-vfl', 'fedbcd' or 'centralized'"
            )
        if method == "fair-vfl":
            options.setdefault("eps", self.eps)
        opts = build_options(spec.options, options, method)
        return spec.runner(self.problem, opts, method)

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
    from fedmodel.algorithms.vfl.problem import VerticalProblem

    if eps < 0:
        raise ModelError(f"eps must be >= 0, got {eps}")
    kw: dict[str, Any] = {"l2": l2}
    if party_names is not None:
        kw["party_names"] = list(party_names)
    if X_test is not None:
        kw.update(
            X_test=X_test, y_test=_pm1(y_test, "y_test"), group_a_test=np.asarray(group_test) != 0
        )
    problem = VerticalProblem.from_columns(X, _pm1(y, "y"), np.asarray(group) != 0, blocks, **kw)
    return VerticalModel(problem, eps)
