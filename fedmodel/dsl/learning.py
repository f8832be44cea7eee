"""``LearningModel``: federated learning of a smooth (possibly non-convex) model whose loss
is a sum over the rows of the parties' data, declared by a per-sample loss with its
gradient (:mod:`fedmodel.losses`), beside the cvxpy :class:`~fedmodel.dsl.model.Model`.

Two partitions (seed 003):

* **sample-based**: ``model.client(name, X, Y)`` per client (its own rows);
* **feature-based**: ``model.vertical(X, Y, blocks)``: client ``i`` holds the columns
  ``blocks[i]`` of every row and the labels (the loss must be a
  :class:`~fedmodel.losses.base.FeatureSplitLoss`, e.g. the MLP).

Objective: the average training loss ``F(w)`` plus ``lam ||w||^2`` (``objective="loss"``,
the paper's (32)) or ``||w||^2`` (``objective="norm"``, (40)). Constraints ``G_m(w) <= U_m``
(the paper's Problems 3 and 8, general smooth ``F_{s,m}`` / ``F_{f,m}``), several at once:

* ``model.constrain_loss(U)``: the average of a per-sample loss over every row (the
  objective's own loss by default, or another one: ``loss=...``), assembled by the server
  from every client's mini-batch uploads; ``party="c3"``: over client ``c3``'s own rows
  (sample-based);
* ``model.constrain(function, U)``: a differentiable function of the parameters returning
  ``(value, gradient)`` (a norm, a fairness-type term, ...), held by the server
  (``function(w)``) or by a client (``party="c3"``; ``function(w, X, Y)`` on its own rows;
  feature-based ``function(w_i, Z_i, Y)`` on its block of the parameters and its columns).

Each is handled by mini-batch SSCA with the paper's constraint surrogate (15)/(27) (value
+ linear + ``tau ||w - w_t||^2``, recursively averaged) and the slack problem (5)/(10).

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

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedmodel.errors import ModelError
from fedmodel.losses.base import FeatureSplitLoss, SampleLoss
from fedmodel.result import Result

OBJECTIVES = ("loss", "norm")


@dataclass
class LearningConstraint:
    """One constraint ``G(w) <= U`` of a :class:`LearningModel`.

    Attributes
    ----------
    U : float
        The bound.
    party : str
        Who holds it: ``"server"`` or a client's name.
    loss : SampleLoss or None
        A per-sample loss averaged over the rows (over every row for ``party="server"``,
        over the client's own rows otherwise); None with ``function=None``: the
        objective's own loss (the paper's (40)).
    function : callable or None
        A differentiable function of the parameters returning ``(value, gradient)``:
        ``function(w)`` held by the server; ``function(w, X, Y)`` held by a sample-based
        client (its own rows); ``function(w_i, Z_i, Y)`` held by a feature-based client
        (its block of the parameters and its columns; the gradient is the block's).
    name : str
        Its label (``res.multipliers["server"][name]``, errors).
    """

    U: float
    party: str = "server"
    loss: SampleLoss | None = None
    function: Callable | None = None
    name: str = ""

    @property
    def kind(self) -> str:
        """``"loss"`` (the objective's loss), ``"sample"`` (another per-sample loss) or
        ``"function"``."""
        if self.function is not None:
            return "function"
        return "loss" if self.loss is None else "sample"

    @property
    def label(self) -> str:
        if self.name:
            return self.name
        return f"loss[{self.party}] <= {self.U:g}"

    def describe(self) -> str:
        """``constraint 'name' of party 'p'`` (errors)."""
        return f"constraint {self.label!r} of party {self.party!r}"


#: another name of :class:`LearningConstraint`, kept for code written against it
LossConstraint = LearningConstraint


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
        self.constraints: list[LearningConstraint] = []

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

    def constrain_loss(
        self,
        U: float,
        party: str = "server",
        loss: SampleLoss | None = None,
        name: str | None = None,
    ) -> LearningConstraint:
        """Add ``(1/N) sum_n f(w; x_n) <= U``: the average per-sample loss ``f`` over every
        row (``party="server"``: the server assembles it from every client's mini-batch
        uploads, the paper's ``F_{s,m}`` / ``F_{f,m}``) or over a sample-based client's
        own rows (``party=<client>``).

        Parameters
        ----------
        U : float
            The bound (finite).
        party : str
            ``"server"`` or a sample-based client's name.
        loss : SampleLoss, optional
            The per-sample loss (default: the objective's own loss, the paper's (40)); it
            must have the objective's number of parameters, and a feature-based model needs a
            :class:`~fedmodel.losses.base.FeatureSplitLoss` with the same parameter blocks.
        name : str, optional
            The constraint's label (default ``"loss[party] <= U"`` for the objective's loss,
            ``"<loss class>[party] <= U"`` for another one).

        Examples
        --------
        >>> import numpy as np, fedmodel as fm
        >>> from fedmodel.losses import LinearLoss
        >>> model = fm.LearningModel(LinearLoss(3, kind="squared"))
        >>> _ = model.client("a", np.eye(3), np.ones(3))
        >>> model.constrain_loss(0.7, loss=LinearLoss(3, kind="logistic")).label
        'LinearLoss[server] <= 0.7'
        """
        U = self._bound(U, party, name or "loss")
        self._party(party, "constrain_loss", name)
        if loss is not None:
            who = f"constrain_loss (constraint {name or type(loss).__name__!r} of party {party!r})"
            if not isinstance(loss, SampleLoss):
                raise ModelError(
                    f"{who}: loss must be a fedmodel.losses.SampleLoss (value and gradient on a "
                    f"batch), got {type(loss).__name__}"
                )
            if int(loss.dim) != int(self.loss.dim):
                raise ModelError(
                    f"{who}: the loss has {loss.dim} parameters but the model's has "
                    f"{self.loss.dim}; a constraint is a function of the same w"
                )
            if name is None:
                name = f"{type(loss).__name__}[{party}] <= {U:g}"
        con = LearningConstraint(U, party, loss=loss, name=name or "")
        self._add(con)
        return con

    def constrain(
        self,
        function: Callable,
        U: float,
        party: str = "server",
        name: str | None = None,
    ) -> LearningConstraint:
        """Add ``G(w) <= U`` for a differentiable function ``G`` of the parameters (a
        norm, a fairness-type term, ...) returning ``(value, gradient)``.

        Parameters
        ----------
        function : callable
            Held by the server: ``function(w) -> (value, gradient (d,))``. Held by a
            sample-based client: ``function(w, X, Y)`` on all its rows. Held by a
            feature-based client: ``function(w_i, Z_i, Y) -> (value, gradient (d_i,))`` on
            its block ``w_i`` of the parameters and its columns ``Z_i``.
        U : float
            The bound (finite).
        party : str
            ``"server"`` or a client's name.
        name : str, optional
            The constraint's label (default ``"function[party] <= U"``).

        Examples
        --------
        >>> import numpy as np, fedmodel as fm
        >>> from fedmodel.losses import LinearLoss
        >>> model = fm.LearningModel(LinearLoss(3, kind="squared"))
        >>> _ = model.client("a", np.eye(3), np.ones(3))
        >>> model.constrain(lambda w: (w @ w, 2 * w), 1.0, name="norm").describe()
        "constraint 'norm' of party 'server'"
        """
        label = name or "function"
        U = self._bound(U, party, label)
        self._party(party, "constrain", name)
        if not callable(function):
            raise ModelError(
                f"constrain: constraint {label!r} of party {party!r}: function must be a "
                f"callable returning (value, gradient), got {type(function).__name__}"
            )
        con = LearningConstraint(
            U, party, function=function, name=name or f"function[{party}] <= {U:g}"
        )
        self._add(con)
        return con

    def _bound(self, U: Any, party: str, label: str) -> float:
        try:
            value = float(U)
        except (TypeError, ValueError):
            value = float("nan")
        if not np.isfinite(value):
            raise ModelError(
                f"constraint {label!r} of party {party!r}: the bound U must be a finite number, "
                f"got {U!r}"
            )
        return value

    def _party(self, party: str, where: str, name: str | None) -> None:
        if party == "server" or party in self.clients or party in self.block_names:
            return
        known = self.party_names if self.partition else []
        raise ModelError(
            f"{where}: constraint {name or '(unnamed)'!r}: unknown party {party!r} (a client's "
            f"name {known} or 'server')"
        )

    def _add(self, con: LearningConstraint) -> None:
        if any(c.label == con.label for c in self.constraints):
            raise ModelError(f"{con.describe()}: a constraint with that name exists; pass name=...")
        self.constraints.append(con)

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
        for con in self.constraints:
            if (
                con.party != "server"
                and self.partition == "sample"
                and con.party not in self.clients
            ):
                raise ModelError(f"{con.describe()}: no such client")
            if self.partition == "feature":
                self._check_feature_constraint(con)

    def _check_feature_constraint(self, con: LearningConstraint) -> None:
        """Feature-based: a client-held constraint must be a function of its block; a
        second per-sample loss must have the objective's parameter blocks."""
        if con.party != "server" and con.kind != "function":
            raise ModelError(
                f"{con.describe()}: a feature-based client holds only its columns; a loss "
                "over rows is a constraint of the server (party='server'), a client's own "
                "constraint is model.constrain(function(w_i, Z_i, Y), U, party=...)"
            )
        if con.kind == "sample":
            if not isinstance(con.loss, FeatureSplitLoss):
                raise ModelError(
                    f"{con.describe()}: feature-based learning needs a FeatureSplitLoss, got "
                    f"{type(con.loss).__name__}"
                )
            mine = self.loss.split(self.blocks)
            try:
                theirs = con.loss.split(self.blocks)
            except ValueError as exc:
                raise ModelError(f"{con.describe()}: {exc}") from None
            if len(mine) != len(theirs) or any(
                not np.array_equal(a, b) for a, b in zip(mine, theirs)
            ):
                raise ModelError(
                    f"{con.describe()}: its loss splits the parameters into other blocks than "
                    "the objective's (each client's block w_i must be the same)"
                )

    # -- solve -------------------------------------------------------------------------------
    def solve(self, method: str = "ssca", **options: Any) -> Result:
        """Train with ``method`` (``"ssca"``, ``"fedsgd"``, ``"fedavg-sgd"``, ``"sgd-m"``,
        ``"vertical-sgd"``, ``"vertical-sgd-m"``); see the method's options
        (``fedmodel.algorithms.ssca.options``)."""
        from fedmodel.algorithms.ssca.run import fit

        return fit(self, method, **options)
