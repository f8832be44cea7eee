"""Seed 000 problem (25): linear-equality-constrained QP, generated as in its Section 5.1.

min_w  sum_{i=1}^n ( w^T A_i w / 2 + b_i^T w )   s.t.  C_i w + d_i = 0,  0 <= i <= n
"""

from __future__ import annotations

from dataclasses import dataclass

import cvxpy as cp
import numpy as np

from fedmodel.dsl.model import Model


@dataclass
class LCQPInstance:
    """Data of one instance: ``A[i], b[i]`` for clients 1..n, ``C[i], d[i]`` for 0..n."""

    A: list[np.ndarray]
    b: list[np.ndarray]
    C: list[np.ndarray]
    d: list[np.ndarray]

    @property
    def n(self) -> int:
        return len(self.A)

    @property
    def dim(self) -> int:
        return self.A[0].shape[0]


def _sphere(rng: np.random.Generator, size: int) -> np.ndarray:
    v = rng.normal(size=size)
    return v / np.linalg.norm(v)


def _orthogonal(rng: np.random.Generator, d: int) -> np.ndarray:
    # Haar-distributed orthogonal matrix: QR of a Gaussian matrix with sign correction.
    q, r = np.linalg.qr(rng.normal(size=(d, d)))
    return q * np.sign(np.diag(r))


def lcqp_instance(n: int, d: int, m: int, random_state=None) -> LCQPInstance:
    """Random instance as in seed 000 Section 5.1.

    ``A_i = U_i D_i U_i^T`` with ``D_i`` uniform on [0.5, 1] and ``U_i`` Haar orthogonal;
    ``C_i`` entries N(0, 1/d); ``b_i`` and ``d_i`` uniform on the unit sphere.

    Examples
    --------
    >>> inst = lcqp_instance(n=2, d=5, m=1, random_state=0)
    >>> inst.A[0].shape, inst.C[0].shape, len(inst.C)
    ((5, 5), (1, 5), 3)
    """
    rng = np.random.default_rng(random_state)
    A, b = [], []
    for _ in range(n):
        U = _orthogonal(rng, d)
        D = rng.uniform(0.5, 1.0, size=d)
        Ai = (U * D) @ U.T
        A.append(0.5 * (Ai + Ai.T))
        b.append(_sphere(rng, d))
    C = [rng.normal(0.0, 1.0 / np.sqrt(d), size=(m, d)) for _ in range(n + 1)]
    dd = [_sphere(rng, m) if m > 1 else rng.choice([-1.0, 1.0], size=1) for _ in range(n + 1)]
    return LCQPInstance(A, b, C, dd)


def lcqp_model(instance: LCQPInstance, name: str = "lcqp") -> Model:
    """The federated model of an :class:`LCQPInstance`: client i holds (A_i, b_i, C_i, d_i),
    the server holds (C_0, d_0).

    Examples
    --------
    >>> model = lcqp_model(lcqp_instance(n=2, d=5, m=1, random_state=0))
    >>> len(model.clients)
    2
    """
    model = Model(name)
    w = model.variable(instance.dim, name="w")
    for i in range(instance.n):
        site = model.client(f"client{i + 1}")
        A = site.data(instance.A[i], name="A")
        b = site.data(instance.b[i], name="b")
        C = site.data(instance.C[i + 1], name="C")
        dvec = site.data(instance.d[i + 1], name="d")
        site.minimize(0.5 * cp.quad_form(w, A, assume_PSD=True) + b @ w, name="quadratic")
        site.subject_to(C @ w + dvec == 0, name="C_i w + d_i = 0")
    C0 = model.server.data(instance.C[0], name="C0")
    d0 = model.server.data(instance.d[0], name="d0")
    model.server.subject_to(C0 @ w + d0 == 0, name="C_0 w + d_0 = 0")
    return model
