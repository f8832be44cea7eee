"""A user's JAX model as a :class:`~fedmodel.losses.base.SampleLoss` (optional extra
``jax``: ``pip install fedmodel[jax]``; imported only when :func:`jax_loss` is called).

Examples
--------
>>> import numpy as np
>>> def f(w, x, y):                      # one sample  # doctest: +SKIP
...     return (x @ w - y) ** 2
>>> loss = jax_loss(f, dim=3)            # doctest: +SKIP
>>> loss.value_and_grad(np.zeros(3), np.eye(3), np.ones(3))  # doctest: +SKIP
(3.0, array([-2., -2., -2.]))
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from fedmodel.losses.base import CallableLoss


def jax_loss(
    per_sample: Callable, dim: int, predict: Callable | None = None, init: Callable | None = None
) -> CallableLoss:
    """Wrap ``per_sample(w, x, y) -> scalar`` (written with ``jax.numpy``) into a loss whose
    per-sample values and gradients come from ``jax.vmap(jax.value_and_grad(...))``,
    compiled once with ``jax.jit`` and run in float64."""
    try:
        import jax
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            "jax_loss needs JAX (the optional extra: pip install 'fedmodel[jax]')"
        ) from exc
    jax.config.update("jax_enable_x64", True)
    batched = jax.jit(jax.vmap(jax.value_and_grad(per_sample), in_axes=(None, 0, 0)))

    def value_grad(w, X, Y):
        vals, grads = batched(np.asarray(w, dtype=float), np.asarray(X), np.asarray(Y))
        return np.asarray(vals, dtype=float), np.asarray(grads, dtype=float)

    return CallableLoss(dim, value_grad, predict=predict, init=init)
