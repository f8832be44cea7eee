"""Differentiable per-sample losses for the learning methods (seed 003, mini-batch SSCA).

A loss here is a sum over the rows of a party's data of a smooth, possibly non-convex
per-sample function ``f(w; x_n)``; what the algorithms need is its value and gradient on a
batch of rows (:class:`SampleLoss`). Models with a vertical (feature-split) structure
``g(w_0, sum_i h_i(w_i, z_{n,i}))`` also implement :class:`FeatureSplitLoss`.

* :mod:`.base`: the protocols and :class:`CallableLoss` (a user's own model from two
  functions);
* :mod:`.mlp`: :class:`SwishMLP`, the paper's Section V network (no biases, swish hidden
  layer, softmax cross-entropy) with the analytic gradients ``a_bar``, ``b_bar``;
* :mod:`.linear`: :class:`LinearLoss`, least squares and logistic regression (convex;
  feature-split too);
* :mod:`.jax_adapter`: :func:`jax_loss`, a user's JAX function as a :class:`SampleLoss`
  (optional extra ``jax``, imported lazily).

This layer knows nothing of the DSL, the compiler, the runtime or the algorithms.
"""

from fedmodel.losses.base import CallableLoss, FeatureSplitLoss, SampleLoss
from fedmodel.losses.linear import LinearLoss
from fedmodel.losses.mlp import SwishMLP, swish, swish_prime

__all__ = [
    "CallableLoss",
    "FeatureSplitLoss",
    "LinearLoss",
    "SampleLoss",
    "SwishMLP",
    "swish",
    "swish_prime",
]
