"""The round trip of prox-al's quasi-Newton inner solvers: ``inner_solver="quasi-newton"``
(:class:`~fedmodel.algorithms.proxal.newton_route.QuasiNewtonInner`, a smooth
``l_k``) and ``"prox-quasi-newton"`` (:mod:`~fedmodel.algorithms.proxal.prox_newton`, a
non-smooth ``h`` kept out of the smooth part). Both run the same rounds and keep the same
secant model; they differ in the step they take from it and in what the server's own
share holds, so this is the one place that knows the rounds.

One round (:meth:`SecantRounds.evaluate`): the server broadcasts a point ``w`` (with
``curvature_directions`` on, ``curvature_w`` and ``k`` directions, and the gradient the
clients' local directions precondition; else ``gradient_w``); each client returns its
``P_{i,k}``'s value and gradient (``d + 1`` floats), its Hessian-vector products along
the directions and, with ``constraint_curvature``, its constraint rows. The server adds
its own share (``own``), feeds the exact products and the secant pair of the gradients to
its model (the known diagonal, the proximal term's and any other exact part, taken out)
and returns the value, the gradient and the model (:meth:`SecantRounds.curvature`: the
dense ``B + J^T J + diag(known)``, or the limited-memory model's view).

Examples
--------
A server with no clients and a quadratic share: the first round's model is the secant
model's starting guess plus the known diagonal, and the rounds are counted.

>>> import numpy as np
>>> from types import SimpleNamespace
>>> from fedmodel.algorithms.proxal.newton_inner import SecantModel
>>> class Runtime:
...     round = 0
...     def next_round(self):
...         self.round += 1
...     def broadcast(self, kind, payload):
...         return {}
>>> server = SimpleNamespace(
...     x=np.zeros(2), secant=SecantModel(2), curvature_k=0, local_directions=False,
...     stiff_on=False, start_products=None, start_derivatives=(0.0, np.zeros(2)),
...     take_derivatives=lambda replies: (0.0, np.zeros(2)),
...     collect=lambda runtime, kind, payload: runtime.broadcast(kind, payload))
>>> A = np.diag([2.0, 4.0])
>>> def own(w, center, V):  # (value, gradient, V H at w; no directions: V is None)
...     return 0.5 * w @ A @ w - w.sum(), A @ w - 1.0, None if V is None else V @ A
>>> rounds = SecantRounds(server, Runtime(), np.ones(2), own)
>>> w, value, grad, model = rounds.start()
>>> grad.tolist(), model.shape
([-1.0, -1.0], (2, 2))
>>> value, grad, model = rounds.evaluate(np.array([0.5, 0.25]))
>>> grad.tolist(), rounds.runtime.round
([0.0, 0.0], 1)
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from fedmodel.algorithms.proxal.newton_inner import LimitedSecantModel

#: the server's own share of ``l_k``'s smooth part: ``own(w, w_center, V)`` -> its value,
#: gradient and ``V H_0`` (rows) at ``w``, the proximal term about ``w_center`` included
OwnShare = Callable[[np.ndarray, np.ndarray, "np.ndarray | None"], tuple]


class SecantRounds:
    """The rounds of one quasi-Newton inner solve from the server's ``x`` (``w^k``).

    Parameters
    ----------
    server : ProxALServer
        The server half: its secant model, curvature directions, the clients' start-up
        replies (``start_derivatives``, ``start_products``, ``start_stiff``) and the
        methods that read replies (``take_derivatives``, ``take_stiff``, ``own_stiff``).
    runtime : Runtime
        Where the rounds go.
    known : ndarray
        The diagonal of ``l_k``'s Hessian the server knows exactly (the proximal term's
        weight, and a smooth ``h``'s with ``"quasi-newton"``): kept out of the secant
        pairs and added to the model.
    own : callable
        The server's own share, ``own(w, w_center, V)`` (see :data:`OwnShare`).
    """

    def __init__(self, server, runtime, known: np.ndarray, own: OwnShare):
        self.server, self.runtime, self.own = server, runtime, own
        self.known = np.asarray(known, dtype=float)
        self.w_center = server.x
        self.secant = server.secant
        self.k_dirs = server.curvature_k
        self.anchor_w = self.w_center  # the last accepted point (the directions' origin)
        self.anchor_g = None  # the gradient the clients' local directions precondition
        self.round = 0  # rounds of this inner solve (the directions' seed)
        self.stiff = None  # constraint_curvature: the parties' J^T J at the last point
        self.local_direction = None  # the clients' mean local Newton direction
        self.last = None  # (w, gradient) of the last round
        self.grad0 = None
        self._model: dict = {}  # B -> B + S + diag(known) (one matrix per model update)
        if isinstance(self.secant, LimitedSecantModel):
            self.secant.known = self.known  # (its damping needs the model's B s)

    def curvature(self):
        """The model of ``l_k``'s smooth Hessian: dense ``B + S + diag(known)``, or the
        limited-memory model's view."""
        secant = self.secant
        if isinstance(secant, LimitedSecantModel):
            return secant.view(self.known, self.grad0)
        B = secant.matrix
        if B is None:
            B = secant.initial(self.grad0)
        S = self.stiff
        if self._model.get("B") is not B or self._model.get("S") is not S:
            H = np.array(B) if S is None else B + S
            H[np.diag_indices(H.shape[0])] += self.known
            self._model.update(B=B, S=S, H=H)
        return self._model["H"]

    def on_accept(self, w: np.ndarray) -> None:
        """The line search accepted ``w``: the next directions start from it."""
        self.anchor_w = w
        if self.server.local_directions:  # (the gradient the clients' local solves take)
            last = self.last
            self.anchor_g = (
                self.grad0 if w is self.w_center else last[1] if last is not None else None
            )

    def evaluate(self, w: np.ndarray):
        """One round at ``w``: ``(value, gradient, model)`` of ``l_k``'s smooth part."""
        server, secant = self.server, self.secant
        self.runtime.next_round()
        self.round += 1
        if self.k_dirs:
            seed = (server.k, self.round)
            V = server.curvature_directions(w - self.anchor_w, seed, self.local_direction)
            request = {"w": w, "directions": V}
            if server.local_directions and self.anchor_g is not None:
                request["precondition"] = self.anchor_g
            replies = server.collect(self.runtime, "curvature_w", request)
        else:
            V = np.zeros((0, w.size))
            replies = server.collect(self.runtime, "gradient_w", {"w": w})
        val, grad = server.take_derivatives(replies)
        v0, g0, HV0 = self.own(w, self.w_center, V)
        S = None
        if server.stiff_on:
            S = self.stiff = server.take_stiff(replies) + server.own_stiff(w)
        if V.shape[0]:
            hvp = sum(
                np.asarray(r.payload["hvp"], dtype=float).reshape(V.shape)
                for r in replies.values()
                if "hvp" in r.payload
            )
            secant.observe_products(V, HV0 + hvp - (0.0 if S is None else V @ S))
        val, grad = val + v0, grad + g0
        secant.observe(w, grad - self.known * w, S)  # (the pair of l_k less its known part)
        z = [r.payload.get("local_direction") for r in replies.values()]
        z = [np.asarray(v, dtype=float) for v in z if v is not None]
        self.local_direction = sum(z) / len(z) if z else None
        self.last = (w, grad)
        return val, grad, self.curvature()

    def start(self):
        """``(w^k, value, gradient, model)`` at the centre, from the replies of the round
        that set up ``l_k`` (the outer round): the model restarts there (pairs only within
        one ``l_k``), after the exact products of that round."""
        server, secant, w_center = self.server, self.secant, self.w_center
        start_V = None if server.start_products is None else server.start_products[0]
        val0, grad0, HV0 = self.own(w_center, w_center, start_V)
        val0 += server.start_derivatives[0]
        self.grad0 = grad0 = grad0 + server.start_derivatives[1]
        if server.stiff_on:
            self.stiff = server.start_stiff + server.own_stiff(w_center)
        if start_V is not None:
            S0 = 0.0 if self.stiff is None else start_V @ self.stiff
            secant.observe_products(start_V, HV0 + server.start_products[1] - S0)
        secant.restart(w_center, grad0 - self.known * w_center)
        return w_center, val0, grad0, self.curvature()

    def finish(self, satisfied: bool, timed_out: bool) -> None:
        """The safeguard of the default ``curvature_directions``: a solve with directions
        that ended short of ``tau_k`` turns them off
        (:meth:`~fedmodel.algorithms.proxal.server.ProxALServer.drop_curvature_directions`)."""
        if self.k_dirs and not (satisfied or timed_out) and self.server.curvature_auto:
            self.server.drop_curvature_directions()
