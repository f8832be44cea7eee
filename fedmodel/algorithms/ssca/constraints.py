"""General constraints of mini-batch SSCA (seed 003, Problems 3 and 8): who computes what.

A :class:`~fedmodel.dsl.learning.LearningConstraint` ``G_m(w) <= U_m`` is one of

* ``"loss"``: the objective's own average loss (over every row, or a client's rows): the
  clients' objective upload carries it (``value``; the paper's NN case ``d + 1``);
* ``"sample"``: another per-sample loss ``f_m`` averaged over the rows: each client
  concerned computes ``sum f_m`` and ``sum grad f_m`` on the same mini-batch as the
  objective (Algorithm 2's ``q_{s,m}``, ``1 + d`` numbers); feature-based, every client
  also exchanges ``h_{m,i}`` and the designated client computes the top part (Algorithm
  4's ``q_{f,m,0}``, ``q_{f,m,i}``);
* ``"function"``: a differentiable function of ``w``: the server evaluates its own
  (``function(w)``), a client evaluates its own on all its rows (``function(w, X, Y)``;
  feature-based ``function(w_i, Z_i, Y)``, the block's gradient) and uploads
  ``(value, gradient)``.

The server then forms the paper's constraint surrogate (15)/(27) from the (estimated)
value and gradient of each ``G_m`` at ``w_t`` (:class:`~.surrogate.SurrogateState`).

Examples
--------
>>> import numpy as np
>>> value, grad = evaluate_function(lambda w: (w @ w, 2 * w), (np.ones(2),), 2, "norm", "server")
>>> value, grad.tolist()
(2.0, [2.0, 2.0])
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from fedmodel.errors import ModelError


def evaluate_function(
    function: Callable, args: Sequence, dim: int, label: str, party: str
) -> tuple[float, np.ndarray]:
    """``function(*args)`` as ``(value, gradient of shape (dim,))``, both finite; a
    :class:`~fedmodel.errors.ModelError` naming the party and the constraint otherwise."""
    who = f"constraint {label!r} of party {party!r}"
    try:
        out = function(*args)
    except ModelError:
        raise
    except Exception as exc:  # a user's function: say whose it was
        raise ModelError(f"{who}: its function raised {type(exc).__name__}: {exc}") from exc
    try:
        value, grad = out
    except (TypeError, ValueError):
        raise ModelError(
            f"{who}: its function must return (value, gradient), got {type(out).__name__}"
        ) from None
    try:
        value = float(np.asarray(value, dtype=float).reshape(()))
        grad = np.asarray(grad, dtype=float)
    except (TypeError, ValueError):
        raise ModelError(
            f"{who}: its function must return a scalar value and an array gradient"
        ) from None
    if grad.shape != (dim,):
        raise ModelError(
            f"{who}: its function returned a gradient of shape {grad.shape}, expected ({dim},)"
        )
    if not (np.isfinite(value) and np.all(np.isfinite(grad))):
        raise ModelError(f"{who}: its function returned a non-finite value or gradient")
    return value, grad


def sample_tasks(constraints: Sequence, client: str) -> list[int]:
    """Indices of the constraints a sample-based client computes besides its objective
    upload: another loss over every row or its own rows, and its own functions."""
    return [
        m
        for m, con in enumerate(constraints)
        if (con.kind == "sample" and con.party in ("server", client))
        or (con.kind == "function" and con.party == client)
    ]


def feature_losses(constraints: Sequence) -> list[int]:
    """Indices of the constraints with another per-sample loss (feature-based: every client
    exchanges its ``h_{m,i}`` for them)."""
    return [m for m, con in enumerate(constraints) if con.kind == "sample"]


def own_functions(constraints: Sequence, client: str) -> list[int]:
    """Indices of the function constraints held by ``client``."""
    return [
        m for m, con in enumerate(constraints) if con.kind == "function" and con.party == client
    ]


def check_loss_output(loss, w: np.ndarray, X, Y, con) -> None:
    """Evaluate a constraint's per-sample loss at ``w`` on a few rows and refuse a wrong
    gradient shape or non-finite values, naming the party and the constraint."""
    dim = int(np.asarray(w).size)
    try:
        value, grad = loss.value_and_grad(np.asarray(w, dtype=float), X, Y)
    except Exception as exc:
        raise ModelError(f"{con.describe()}: its loss raised {type(exc).__name__}: {exc}") from exc
    grad = np.asarray(grad, dtype=float)
    if grad.shape != (dim,):
        raise ModelError(
            f"{con.describe()}: its loss returned a gradient of shape {grad.shape}, expected "
            f"({dim},)"
        )
    if not (np.isfinite(float(value)) and np.all(np.isfinite(grad))):
        raise ModelError(f"{con.describe()}: its loss is not finite on the data")
