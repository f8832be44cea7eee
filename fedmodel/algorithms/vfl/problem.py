"""The vertical problem of seed 002: K parties' column blocks, the labels and the groups.

Model (seed 002, eqs. 1-3, Sec. V): ``K`` parties hold disjoint column blocks ``X_k``
(``n x m_k``) of the same ``n`` samples and own ``theta_k``; the scores are ``z = sum_k
X_k theta_k``. With the logistic loss ``l(z, y) = log(1 + exp(-y z))`` and ``h_k(theta_k)
= l2 ||theta_k||^2`` (the paper: ``l2 = 1/n``),

    L(theta) = (1/n) sum_i l(z_i, y_i) + sum_k h_k(theta_k)
    D(theta) = lhat^a(theta) - lhat^b(theta),  lhat^s = mean_{i in N^s} l(z_i, y_i)
    min L(theta)  s.t.  |D(theta)| <= eps                                 (3)

where ``N^s`` holds the samples of group ``s`` with a *positive* label (Definition 1).
Everything the server needs (the loss, ``D``, the dual gradient (7)) and everything a
party needs besides its own block (the per-sample weights of the block gradient (8)) is a
function of the scores ``z``, the labels and the groups only: :class:`ScoreFunctions`.
Labels and groups are known to the server and to every party (the paper's assumption).

Examples
--------
>>> import numpy as np
>>> rng = np.random.default_rng(0)
>>> X = rng.normal(size=(40, 6)); y = np.where(rng.random(40) < 0.5, 1.0, -1.0)
>>> prob = VerticalProblem.from_columns(X, y, rng.random(40) < 0.5, [3, 3])
>>> [b.shape for b in prob.blocks], prob.n
([(40, 3), (40, 3)], 40)
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy.special import expit

from fedmodel.errors import ModelError


def logistic_loss(z: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Per-sample ``log(1 + exp(-y z))`` (stable)."""
    return np.logaddexp(0.0, -y * z)


def logistic_loss_derivative(z: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``d l(z, y) / dz = -y sigmoid(-y z)``."""
    return -y * expit(-y * z)


def logistic_loss_curvature(z: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``d^2 l(z, y) / dz^2 = sigmoid(z) sigmoid(-z)`` (at most 1/4)."""
    p = expit(z)
    return p * (1.0 - p)


CONSTRAINTS = ("loss", "tpr")
"""The fairness constraints ``|D(z)| <= eps`` of the family: ``"loss"``, seed 002's
loss-based DEO (Definition 1); ``"tpr"``, a smooth surrogate of the TPR gap (equal
opportunity as practitioners measure it)."""


def _constraint_kind(constraint: str) -> str:
    if constraint not in CONSTRAINTS:
        raise ModelError(f"constraint must be one of {CONSTRAINTS}, got {constraint!r}")
    return constraint


class ScoreFunctions:
    """What depends only on the scores ``z``, the labels ``y`` (+-1) and the groups.

    Held by the server (loss, ``D``, dual gradient (7)) and by every party (the weights of
    its block gradient (8)). Never holds features or parameters.

    Parameters
    ----------
    y : array of +-1, shape (n,)
    group_a : bool array, shape (n,)
        True for group ``a``, False for group ``b``.
    constraint : {"loss", "tpr"}
        What ``D`` is. ``"loss"`` (seed 002, Definition 1): ``D = lhat^a - lhat^b``, the
        mean logistic loss over the positives of group ``a`` minus that of group ``b``.
        ``"tpr"`` (rate-based equal opportunity): ``D = r^a - r^b`` with ``r^s =
        mean_{i in N^s} sigmoid(z_i / T)``, a smooth surrogate of the true positive rate
        ``TPR_s = mean_{i in N^s} 1[z_i >= 0]`` (the prediction rule).
    temperature : float
        ``T > 0`` of the ``"tpr"`` surrogate (smaller: closer to the indicator, stiffer).
        Per sample ``|1[z >= 0] - sigmoid(z / T)| <= sigmoid(-|z| / T)``, so the true TPR gap
        differs from the surrogate's by at most :meth:`surrogate_error_bound`.

    Examples
    --------
    >>> import numpy as np
    >>> f = ScoreFunctions(np.array([1.0, 1, 1, 1]), np.array([1, 1, 0, 0]) > 0, "tpr", 0.1)
    >>> z = np.array([3.0, -3.0, 3.0, 3.0])
    >>> round(f.constraint_gap(z), 4), f.tpr_gap(z), round(f.surrogate_error_bound(z), 4)
    (-0.5, -0.5, 0.0)
    """

    def __init__(
        self,
        y: np.ndarray,
        group_a: np.ndarray,
        constraint: str = "loss",
        temperature: float = 0.25,
    ):
        self.y = np.asarray(y, dtype=float)
        self.group_a = np.asarray(group_a, dtype=bool)
        self.n = self.y.size
        self.constraint = _constraint_kind(constraint)
        self.temperature = float(temperature)
        if not self.temperature > 0:
            raise ModelError(f"the TPR surrogate's temperature must be > 0, got {temperature}")
        pos = self.y > 0
        self.in_a = pos & self.group_a
        self.in_b = pos & ~self.group_a
        self.size_a = int(self.in_a.sum())
        self.size_b = int(self.in_b.sum())
        # the weights of lhat^a - lhat^b per sample: 1/|N^a| on N^a, -1/|N^b| on N^b
        self.deo_weights = np.zeros(self.n)
        if self.size_a:
            self.deo_weights[self.in_a] = 1.0 / self.size_a
        if self.size_b:
            self.deo_weights[self.in_b] = -1.0 / self.size_b

    def losses(self, z: np.ndarray) -> np.ndarray:
        return logistic_loss(z, self.y)

    def data_loss(self, z: np.ndarray) -> float:
        """``(1/n) sum_i l(z_i, y_i)`` (L without the regularisers)."""
        return float(self.losses(z).mean())

    def group_losses(self, z: np.ndarray) -> tuple[float, float]:
        """``(lhat^a, lhat^b)`` of Definition 1."""
        losses = self.losses(z)
        return float(losses[self.in_a].mean()), float(losses[self.in_b].mean())

    def deo_gap(self, z: np.ndarray) -> float:
        """``D = lhat^a - lhat^b`` (signed; DEO is ``|D|``), the loss-based DEO whatever the
        constraint."""
        return float(self.deo_weights @ self.losses(z))

    def tpr_gap(self, z: np.ndarray) -> float:
        """The true ``TPR_a - TPR_b`` of the rule ``z >= 0`` (signed)."""
        return float(self.deo_weights @ (np.asarray(z) >= 0))

    def surrogate_rates(self, z: np.ndarray) -> np.ndarray:
        """Per sample ``sigmoid(z / T)`` (the ``"tpr"`` surrogate of ``1[z >= 0]``)."""
        return expit(np.asarray(z, dtype=float) / self.temperature)

    def surrogate_error_bound(self, z: np.ndarray) -> float:
        """A bound on ``|(TPR_a - TPR_b) - (r^a - r^b)|`` at ``z``: ``mean_{N^a}
        sigmoid(-|z|/T) + mean_{N^b} sigmoid(-|z|/T)`` (each indicator is within
        ``sigmoid(-|z|/T)`` of its surrogate)."""
        err = expit(-np.abs(np.asarray(z, dtype=float)) / self.temperature)
        return float(np.abs(self.deo_weights) @ err)

    def constraint_gap(self, z: np.ndarray) -> float:
        """The constrained ``D(z)``: :meth:`deo_gap` (``"loss"``) or ``r^a - r^b``
        (``"tpr"``)."""
        if self.constraint == "loss":
            return self.deo_gap(z)
        return float(self.deo_weights @ self.surrogate_rates(z))

    def constraint_derivative(self, z: np.ndarray) -> np.ndarray:
        """Per sample ``dD / dz_i`` (``grad_k D = X_k^T`` of it)."""
        if self.constraint == "loss":
            return self.deo_weights * logistic_loss_derivative(z, self.y)
        r = self.surrogate_rates(z)
        return self.deo_weights * r * (1.0 - r) / self.temperature

    def constraint_curvature(self, z: np.ndarray) -> np.ndarray:
        """Per sample ``d^2 D / dz_i^2``."""
        if self.constraint == "loss":
            return self.deo_weights * logistic_loss_curvature(z, self.y)
        r = self.surrogate_rates(z)
        return self.deo_weights * r * (1.0 - r) * (1.0 - 2.0 * r) / self.temperature**2

    def constraint_values(self, z: np.ndarray, eps: float) -> np.ndarray:
        """``[D - eps, -D - eps]`` (4a)-(4b): feasible when both are ``<= 0``."""
        d = self.constraint_gap(z)
        return np.array([d - eps, -d - eps])

    def constraint_report(self, z: np.ndarray, eps: float) -> dict[str, float | str]:
        """What the constraint is and where ``z`` stands: ``kind``, ``eps``, the
        constrained ``gap`` (signed ``D``), and for ``"tpr"`` its ``temperature``, the true
        ``tpr_gap`` and the ``surrogate_error_bound``."""
        out: dict[str, float | str] = {
            "kind": self.constraint,
            "eps": float(eps),
            "gap": self.constraint_gap(z),
        }
        if self.constraint == "tpr":
            out.update(
                temperature=self.temperature,
                tpr_gap=self.tpr_gap(z),
                surrogate_error_bound=self.surrogate_error_bound(z),
            )
        return out

    def dual_gradient(self, z: np.ndarray, lam: np.ndarray, eps: float, c: float) -> np.ndarray:
        """(7): ``grad_lambda f~ = [-c lam_1 + D - eps, -c lam_2 - D - eps]``."""
        return self.constraint_values(z, eps) - c * np.asarray(lam, dtype=float)

    def score_weights(self, z: np.ndarray, lam_diff: float = 0.0) -> np.ndarray:
        """Per-sample ``w`` with ``grad_k f = X_k^T w + grad h_k`` (8): ``w_i = l'(z_i, y_i) /
        n + (lam_1 - lam_2) dD/dz_i`` (loss-based DEO: ``dD/dz_i = l'(z_i, y_i) a_i`` with
        ``a_i`` the DEO weight of sample ``i``)."""
        dl = logistic_loss_derivative(z, self.y)
        if self.constraint == "loss":
            return dl * (1.0 / self.n + lam_diff * self.deo_weights)
        return dl * (1.0 / self.n) + lam_diff * self.constraint_derivative(z)

    def score_curvature(self, z: np.ndarray, lam_diff: float = 0.0) -> np.ndarray:
        """Diagonal ``d^2/dz^2`` of ``f`` in the scores (Newton polish of the reference)."""
        curv = logistic_loss_curvature(z, self.y)
        if self.constraint == "loss":
            return curv * (1.0 / self.n + lam_diff * self.deo_weights)
        return curv * (1.0 / self.n) + lam_diff * self.constraint_curvature(z)


@dataclass
class VerticalProblem:
    """K parties' column blocks of the same samples, the labels and the groups.

    Parameters
    ----------
    blocks : list of arrays, shape (n, m_k)
        Party ``k``'s features. Party ``k`` alone ever reads ``blocks[k]``.
    y : array, shape (n,)
        Labels in {-1, +1}; ``+1`` is the class ``N^s`` is taken from (the protected class).
    group_a : bool array, shape (n,)
        Membership of group ``a`` (False: group ``b``).
    party_names : list of str, optional
        Default ``party0 .. party{K-1}``.
    l2 : float, optional
        ``h_k(theta_k) = l2 ||theta_k||^2``; default ``1/n`` (the paper).
    test_blocks, y_test, group_a_test : optional
        A held-out part with the same columns (each party holds its test block).
    """

    blocks: list[np.ndarray]
    y: np.ndarray
    group_a: np.ndarray
    party_names: list[str] = field(default_factory=list)
    l2: float | None = None
    test_blocks: list[np.ndarray] | None = None
    y_test: np.ndarray | None = None
    group_a_test: np.ndarray | None = None
    description: str = ""

    def __post_init__(self) -> None:
        self.blocks = [np.ascontiguousarray(b, dtype=float) for b in self.blocks]
        if len(self.blocks) < 2:
            raise ModelError(f"a vertical problem needs K >= 2 parties, got {len(self.blocks)}")
        if not self.party_names:
            self.party_names = [f"party{k}" for k in range(len(self.blocks))]
        if len(self.party_names) != len(self.blocks):
            raise ModelError(
                f"{len(self.party_names)} party names for {len(self.blocks)} column blocks"
            )
        if len(set(self.party_names)) != len(self.party_names) or "server" in self.party_names:
            raise ModelError(f"party names must be distinct and not 'server': {self.party_names}")
        self.y, self.group_a = _labels_and_groups(self.y, self.group_a, "training part")
        n = self.y.size
        for name, b in zip(self.party_names, self.blocks):
            if b.ndim != 2 or b.shape[0] != n:
                raise ModelError(
                    f"block of shape {b.shape} does not have the n = {n} rows of the labels",
                    party=name,
                )
            if b.shape[1] < 1:
                raise ModelError("a party needs at least one column", party=name)
            if not np.all(np.isfinite(b)):
                raise ModelError("block contains NaN or inf", party=name)
        small = [nm for nm, b in zip(self.party_names, self.blocks) if b.shape[1] <= 2]
        if small:
            warnings.warn(
                f"parties {small} hold at most 2 columns: seed 002's security theorem "
                "(Theorem 1) needs m_k > 2",
                stacklevel=2,
            )
        if self.l2 is None:
            self.l2 = 1.0 / n
        if self.test_blocks is not None:
            if self.y_test is None or self.group_a_test is None:
                raise ModelError("test_blocks need y_test and group_a_test")
            self.y_test, self.group_a_test = _labels_and_groups(
                self.y_test, self.group_a_test, "test part"
            )
            self.test_blocks = [np.ascontiguousarray(b, dtype=float) for b in self.test_blocks]
            for name, b, tr in zip(self.party_names, self.test_blocks, self.blocks):
                if b.shape != (self.y_test.size, tr.shape[1]):
                    raise ModelError(
                        f"test block of shape {b.shape}, expected ({self.y_test.size}, "
                        f"{tr.shape[1]})",
                        party=name,
                    )

    @classmethod
    def from_columns(
        cls,
        X: np.ndarray,
        y: np.ndarray,
        group_a: np.ndarray,
        blocks: Sequence[int] | Sequence[Sequence[int]],
        **kw,
    ) -> VerticalProblem:
        """Cut ``X`` column-wise: ``blocks`` is a list of block sizes (contiguous) or of
        column index lists (disjoint, covering every column)."""
        X = np.asarray(X, dtype=float)
        cols = column_blocks(X.shape[1], blocks, kw.get("party_names"))
        X_test = kw.pop("X_test", None)
        test = [np.asarray(X_test, float)[:, c] for c in cols] if X_test is not None else None
        return cls([X[:, c] for c in cols], y, group_a, test_blocks=test, **kw)

    @property
    def n(self) -> int:
        return int(self.y.size)

    @property
    def K(self) -> int:
        return len(self.blocks)

    @property
    def sizes(self) -> list[int]:
        return [b.shape[1] for b in self.blocks]

    def score_functions(
        self, constraint: str = "loss", temperature: float = 0.25
    ) -> ScoreFunctions:
        """The score-side functions with the given constraint (:class:`ScoreFunctions`)."""
        return ScoreFunctions(self.y, self.group_a, constraint, temperature)

    def split_theta(self, theta: np.ndarray) -> list[np.ndarray]:
        """The stacked ``theta`` cut into the parties' blocks."""
        return np.split(np.asarray(theta, dtype=float), np.cumsum(self.sizes)[:-1])


def column_blocks(
    m: int,
    blocks: Sequence[int] | Sequence[Sequence[int]],
    names: Sequence[str] | None = None,
) -> list[np.ndarray]:
    """Column indices of each block: sizes (contiguous) or explicit disjoint index lists.

    A party whose block takes a column already given to another party is an error naming
    both."""
    blocks = list(blocks)
    names = list(names) if names else [f"party{k}" for k in range(len(blocks))]
    if all(np.isscalar(b) for b in blocks):
        sizes = [int(b) for b in blocks]
        if sum(sizes) != m or min(sizes) < 1:
            raise ModelError(f"block sizes {sizes} do not add up to the {m} columns")
        edges = np.cumsum([0] + sizes)
        return [np.arange(edges[k], edges[k + 1]) for k in range(len(sizes))]
    cols = [np.asarray(b, dtype=int).ravel() for b in blocks]
    owner: dict[int, int] = {}
    for k, c in enumerate(cols):
        bad = [int(j) for j in c if j < 0 or j >= m]
        if bad:
            raise ModelError(f"column(s) {bad} do not exist (X has {m})", party=names[k])
        for j in c:
            if int(j) in owner:
                taken = sorted({int(i) for i in c if int(i) in owner})
                raise ModelError(
                    f"column(s) {taken} already belong to {names[owner[int(j)]]}: a party may "
                    "only hold its own block (vertical blocks are disjoint)",
                    party=names[k],
                )
        owner.update({int(j): k for j in c})
    if len(owner) != m:
        missing = sorted(set(range(m)) - set(owner))
        raise ModelError(f"column(s) {missing} are held by no party")
    return cols


def paper_block_sizes(m: int, K: int = 6) -> list[int]:
    """Seed 002's layout: ``K-1`` parties get ``m // K`` columns, the first the rest
    (104 columns: 19 + 5 x 17; 26: 6 + 5 x 4; 99: 19 + 5 x 16)."""
    other = m // K
    if other < 1:
        raise ModelError(f"{m} columns cannot be split over K = {K} parties")
    return [m - (K - 1) * other] + [other] * (K - 1)


def _labels_and_groups(y, group_a, where: str) -> tuple[np.ndarray, np.ndarray]:
    y = np.asarray(y, dtype=float).ravel()
    if not np.all(np.isin(y, (-1.0, 1.0))):
        raise ModelError(f"labels of the {where} must be -1/+1")
    g = np.asarray(group_a).ravel()
    if g.shape != y.shape:
        raise ModelError(f"groups ({g.shape}) and labels ({y.shape}) of the {where} differ")
    g = g.astype(bool)
    pos = y > 0
    if not (pos & g).any() or not (pos & ~g).any():
        raise ModelError(
            f"the {where} needs positive-label samples in both groups (N^a and N^b of "
            "Definition 1 must be non-empty)"
        )
    return y, g
