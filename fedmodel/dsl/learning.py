"""``LearningModel``: federated learning of a smooth (possibly non-convex) model whose loss
is a sum over the rows of the parties' data, declared by a per-sample loss with its
gradient (:mod:`fedmodel.losses`), beside the cvxpy :class:`~fedmodel.dsl.model.Model`.

Two partitions (seed 003):

* **sample-based**: ``model.client(name, X, Y)`` per client (its own rows);
* **feature-based**: ``model.vertical(X, Y, blocks)``: client ``i`` holds the columns
  ``blocks[i]`` of every row and the labels (the loss must be a
  :class:`~fedmodel.losses.base.FeatureSplitLoss`, e.g. the MLP).

Objective: the average training loss ``F(w)`` plus ``lam ||w||^2`` (``objective="loss"``,
the paper's (32)) or ``||w||^2`` (``objective="norm"``, (40)); constraints
``model.constrain_loss(U)`` (``F(w) <= U``, held by the server from every client's
uploads) or ``model.constrain_loss(U, party="c3")`` (client ``c3``'s own average loss).

Examples
--------
>>> import numpy as np, fedmodel as fm
>>> from fedmodel.losses import SwishMLP
>>> rng = np.random.default_rng(0)
>>> X = rng.normal(size=(120, 4)); Y = (X[:, 0] + X[:, 1] > 0).astype(int)
>>> model = fm.LearningModel(SwishMLP(P=4, J=8, L=2))
>>> for k in range(3):
...     _ = model.client(f"c{k}", X[40 * k : 40 * (k + 1)], Y[40 * k : 40 * (k + 1)])
>>> res = model.solve("ssca", rounds=200, batch_size=10, rho=(1.0, 0.5), gamma=(1.0, 0.6),
...                   tau=0.5, eval_every=0)
>>> bool(res.history[-1]["train_loss"] < res.history[0]["train_loss"])
True
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedmodel.errors import ModelError
from fedmodel.losses.base import FeatureSplitLoss, SampleLoss
from fedmodel.result import Result

OBJECTIVES = ("loss", "norm")


@dataclass
class LossConstraint:
    """``F_party(w) <= U``: ``party="server"`` is the whole training loss."""

    U: float
    party: str = "server"


class LearningModel:
    """A federated learning problem with a per-sample loss (module docstring).

    Parameters
    ----------
    loss : SampleLoss
        The per-sample loss and its gradient (e.g. :class:`~fedmodel.losses.SwishMLP`).
    name : str
    objective : {"loss", "norm"}
    lam : float
        ``lambda`` of ``F(w) + lambda ||w||^2`` (``objective="loss"``).
    """

    def __init__(
        self, loss: SampleLoss, name: str = "learning", objective: str = "loss", lam: float = 0.0
    ):
        if not isinstance(loss, SampleLoss):
            raise ModelError(
                f"loss must be a fedmodel.losses.SampleLoss (value and gradient on a batch), "
                f"got {type(loss).__name__}"
            )
        if objective not in OBJECTIVES:
            raise ModelError(f"objective must be one of {OBJECTIVES}, got {objective!r}")
        if not (float(lam) >= 0 and np.isfinite(float(lam))):
            raise ModelError(f"lam must be >= 0, got {lam!r}")
        self.loss, self.name, self.objective, self.lam = loss, name, objective, float(lam)
        self.partition: str | None = None
        self.clients: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self.blocks: list[np.ndarray] = []
        self.block_names: list[str] = []
        self.X: np.ndarray | None = None
        self.Y: np.ndarray | None = None
        self.test: tuple[np.ndarray, np.ndarray] | None = None
        self.constraints: list[LossConstraint] = []

    # -- declaration -------------------------------------------------------------------------
    def client(self, name: str, X: np.ndarray, Y: np.ndarray) -> str:
        """Add a sample-based client holding the rows ``(X, Y)``; returns its name."""
        if self.partition == "feature":
            raise ModelError("this model is feature-based (model.vertical); cannot add rows")
        if name in self.clients or name == "server":
            raise ModelError(f"client name {name!r} is taken")
        X, Y = np.asarray(X, dtype=float), np.asarray(Y)
        if X.ndim != 2 or len(X) != len(Y) or len(X) == 0:
            raise ModelError(
                f"client {name!r}: X must be (N_i, K) with N_i >= 1 rows and Y one label per "
                f"row; got X {X.shape}, Y {Y.shape}"
            )
        self._check_columns(X, f"client {name!r}")
        self.partition = "sample"
        self.clients[name] = (X, Y)
        return name

    def vertical(
        self,
        X: np.ndarray,
        Y: np.ndarray,
        blocks: Sequence[Sequence[int]],
        names: Sequence[str] | None = None,
        test: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> list[str]:
        """Feature-based partition: client ``i`` holds ``X[:, blocks[i]]`` and ``Y`` (and the
        same columns of ``test``); returns the client names."""
        if self.partition is not None:
            raise ModelError("the model's data are already declared")
        if not isinstance(self.loss, FeatureSplitLoss):
            raise ModelError(
                f"feature-based learning needs a loss with the structure g(w0, sum_i h_i): a "
                f"fedmodel.losses.FeatureSplitLoss, got {type(self.loss).__name__}"
            )
        X, Y = np.asarray(X, dtype=float), np.asarray(Y)
        self._check_columns(X, "vertical()")
        blocks = [np.asarray(b, dtype=np.int64) for b in blocks]
        self.loss.split(blocks)  # checks the partition of the columns
        names = list(names) if names is not None else [f"client{i}" for i in range(len(blocks))]
        if len(names) != len(blocks) or len(set(names)) != len(names):
            raise ModelError("need one distinct name per feature block")
        self.partition = "feature"
        self.X, self.Y, self.blocks, self.block_names = X, Y, blocks, names
        if test is not None:
            self.set_test(*test)
        return names

    def set_test(self, X: np.ndarray, Y: np.ndarray) -> None:
        """A test set: held by the server (sample-based) or split by the feature blocks."""
        X = np.asarray(X, dtype=float)
        self._check_columns(X, "the test set")
        self.test = (X, np.asarray(Y))

    def _check_columns(self, X: np.ndarray, who: str) -> None:
        """Refuse rows whose width is not the loss's input width (e.g. MNIST's 785 columns,
        an intercept included, against ``SwishMLP(P=784)``)."""
        want = getattr(self.loss, "n_inputs", None)
        if want is not None and X.ndim == 2 and X.shape[1] != want:
            hint = (
                " (an intercept column? fedmodel.datasets loaders take intercept=False)"
                if X.shape[1] == want + 1
                else ""
            )
            raise ModelError(
                f"{who}: X has {X.shape[1]} columns but {type(self.loss).__name__} takes rows "
                f"of {want}{hint}"
            )

    def constrain_loss(self, U: float, party: str = "server") -> None:
        """Add ``F(w) <= U`` (``party="server"``: the average loss over every row) or a
        client's own average loss ``<= U`` (sample-based)."""
        if party != "server" and party not in self.clients:
            raise ModelError(
                f"constrain_loss: unknown party {party!r} (a sample-based client's name or "
                "'server')"
            )
        self.constraints.append(LossConstraint(float(U), party))

    # -- facts -------------------------------------------------------------------------------
    @property
    def party_names(self) -> list[str]:
        return list(self.clients) if self.partition == "sample" else list(self.block_names)

    @property
    def n_samples(self) -> int:
        if self.partition == "sample":
            return sum(len(X) for X, _ in self.clients.values())
        return 0 if self.X is None else len(self.X)

    def check(self) -> None:
        if self.partition is None:
            raise ModelError(f"model {self.name!r} has no data: add clients or model.vertical")
        if self.objective == "norm" and not self.constraints:
            raise ModelError(
                "objective='norm' without a loss constraint has the trivial solution w = 0; "
                "add model.constrain_loss(U)"
            )

    # -- solve -------------------------------------------------------------------------------
    def solve(self, method: str = "ssca", **options: Any) -> Result:
        """Train with ``method`` (``"ssca"``, ``"fedsgd"``, ``"fedavg-sgd"``, ``"sgd-m"``,
        ``"vertical-sgd"``, ``"vertical-sgd-m"``); see the method's options
        (``fedmodel.algorithms.ssca.options``)."""
        from fedmodel.algorithms.ssca.run import fit

        return fit(self, method, **options)
