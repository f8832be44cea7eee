"""The server half of fair-vfl and fedbcd (seed 002, Algorithm 2).

The server holds the labels, the groups, the multipliers ``lambda`` and the latest full
scores ``z = sum_k X_k theta_k`` (the sum of the partial scores the parties publish). One
call of :meth:`VFLServer.step` is one communication round ``t`` in the order of eq. (9)
and the prose (notes 3.4): with ``z = X theta^(t)`` in hand,

1. (``t >= 1``, fair-vfl only) ``lambda^(t) = [lambda^(t-1) + alpha grad_lambda
   f~_{t-1}(theta^(t), lambda^(t-1))]_+`` (7), (9), ``alpha = beta`` or ``1/beta``;
2. send ``z`` and ``lambda^(t)`` to every party; they make their local updates;
3. receive the partial scores ``X_k theta_k^(t+1)`` and form ``X theta^(t+1)``.

fedbcd is the same round with ``lambda = 0`` held fixed and not sent.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fedmodel.algorithms.vfl.options import FairVFLOptions, Schedule
from fedmodel.algorithms.vfl.problem import ScoreFunctions
from fedmodel.runtime.base import Runtime


class VFLServer:
    """Server of fair-vfl (``constrained=True``) or fedbcd (``constrained=False``).

    Parameters
    ----------
    y, group_a : arrays (n,)
        Labels (+-1) and groups.
    opts : FairVFLOptions
    K : int
        Number of parties.
    schedule_constants : (L, L12)
        For the theoretical schedule.
    constrained : bool
        Run the dual ascent (fair-vfl) or keep ``lambda = 0`` (fedbcd).
    """

    def __init__(
        self,
        y: np.ndarray,
        group_a: np.ndarray,
        opts: FairVFLOptions,
        K: int,
        schedule_constants: tuple[float, float] = (1.0, 1.0),
        constrained: bool = True,
    ):
        self.scores_of = ScoreFunctions(y, group_a)
        self.opts = opts
        self.eps = float(opts.eps)
        self.constrained = constrained
        self.schedule = Schedule(opts, K, schedule_constants)
        self.state: dict[str, Any] = {
            "lambda": np.array(opts.lambda0 if constrained else (0.0, 0.0), dtype=float),
            "t": 0,
            "scores": np.zeros(self.scores_of.n),
            "dual_residual": np.zeros(2),
        }

    def get_state(self) -> dict[str, Any]:
        return self.state

    def set_state(self, state: dict[str, Any]) -> None:
        self.state = state

    @property
    def scores(self) -> np.ndarray:
        return self.state["scores"]

    @property
    def lam(self) -> np.ndarray:
        return self.state["lambda"]

    def _collect(self, replies) -> np.ndarray:
        z = np.zeros(self.scores_of.n)
        for reply in replies.values():
            part = np.asarray(reply.payload["partial_scores"], dtype=float)
            if part.shape != z.shape:
                raise ValueError(
                    f"party {reply.sender!r} published partial scores of shape {part.shape}, "
                    f"expected {z.shape}"
                )
            z += part
        return z

    def start(self, runtime: Runtime) -> None:
        """Round 0's upload: the parties' partial scores at ``theta^(0)``."""
        runtime.next_round()
        self.state["scores"] = self._collect(runtime.broadcast("vfl_start", {}))

    def dual_update(self) -> None:
        """(9) with ``c_{t-1}``, at the scores of ``theta^(t)``."""
        st = self.state
        t = int(st["t"])
        if not self.constrained or t == 0:
            return
        grad = self.scores_of.dual_gradient(
            st["scores"], st["lambda"], self.eps, self.schedule.c(t - 1)
        )
        st["lambda"] = np.maximum(st["lambda"] + self.schedule.dual_step * grad, 0.0)

    def dual_residual(self) -> np.ndarray:
        """The lambda part of the stationarity gap (12) at ``(theta^(t), lambda^(t))``:
        ``(1/alpha)(lambda - [lambda + alpha grad_lambda f]_+)`` (``f``, not ``f~``)."""
        if not self.constrained:
            return np.zeros(2)
        lam = self.state["lambda"]
        a = self.schedule.dual_step
        g = self.scores_of.constraint_values(self.state["scores"], self.eps)
        return (lam - np.maximum(lam + a * g, 0.0)) / a

    def step(self, runtime: Runtime) -> None:
        """One communication round ``t`` (then ``state["t"] = t + 1``)."""
        self.dual_update()
        st = self.state
        z = st["scores"]
        st["dual_residual"] = self.dual_residual()
        runtime.next_round()
        payload = {"scores": z, "lambda": st["lambda"]} if self.constrained else {"scores": z}
        st["scores"] = self._collect(runtime.broadcast("vfl_round", payload))
        st["t"] = int(st["t"]) + 1

    def summary(self, z: np.ndarray) -> dict[str, float]:
        f = self.scores_of
        d = f.deo_gap(z)
        lam = self.state["lambda"]
        pred = np.where(z >= 0, 1.0, -1.0)
        return {
            "round": int(self.state["t"]),
            "data_loss": f.data_loss(z),
            "deo_gap": d,
            "deo_loss": abs(d),
            "violation": max(0.0, abs(d) - self.eps) if self.constrained else 0.0,
            "lambda1": float(lam[0]),
            "lambda2": float(lam[1]),
            "train_accuracy": float((pred == f.y).mean()),
        }
