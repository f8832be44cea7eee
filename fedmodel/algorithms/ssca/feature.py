"""Feature-based (vertical) halves: client ``i`` holds the columns ``P_i`` of every row and
the labels (seed 003, Algorithms 3-4, and vertical SGD / SGD-m with the same collection).

One round (``B`` = batch size, ``H`` = size of ``h``, ``d_0`` = size of ``omega_0``,
``d_i`` = size of client ``i``'s block):

========== ================================= =============================================
kind       from -> to                        payload
========== ================================= =============================================
fb_batch   server -> client i                ``idx`` (B), ``w0`` (d_0), ``wi`` (d_i);
                                             reply empty
fb_share   client i's own turn (local)       sends ``fb_h`` to every other client
fb_h       client i -> client j (peer)       ``h`` = h_i(w_i, z_{n,i}) of the batch (B x H)
fb_grad    server -> client i                empty; reply ``gi`` = sum of the block's
                                             gradients (d_i); the designated client adds
                                             ``g0`` (d_0) and, with a constraint,
                                             ``value`` (1)
fb_onestep server -> client i                Remark 4 (``one_step=True``): ``idx``, ``wi``;
                                             reply ``h`` (B x H) and ``jac`` = dh_i/dw_i
                                             (**the raw features for the MLP**), the
                                             designated client adds the labels ``y``
========== ================================= =============================================

Peer messages are sent during the client's own ``fb_share`` turn (``runtime.activate``)
and delivered by ``runtime.deliver_peer_messages``, which every backend carries (peer
messages sent while answering a broadcast are not collected on the processes/Ray
backends). Diagnostics (channel ``"diagnostic"``): ``fb_eval_h`` (``wi`` -> ``h_i`` of all
training or test rows) and ``fb_eval_top`` (to the designated client: ``w0`` and the summed
``H`` -> loss sum and correct predictions). The server thus sees summed hidden
pre-activations in monitoring rounds only; a deployment switches diagnostics off.
"""

from __future__ import annotations

import numpy as np

from fedmodel.algorithms.protocol import ClientHalf
from fedmodel.algorithms.ssca.messages import SSCA
from fedmodel.algorithms.ssca.server import LearningServer
from fedmodel.losses.base import FeatureSplitLoss


def server_batch(seed: int, t: int, n: int, B: int) -> np.ndarray:
    """The common batch of round ``t``: ``B`` distinct rows of ``n`` (seeded ``(seed, t)``)."""
    if B >= n:
        return np.arange(n)
    rng = np.random.default_rng([int(seed), int(t)])
    return np.sort(rng.choice(n, size=B, replace=False))


def _labels(Y):
    Y = np.asarray(Y)
    return Y.argmax(axis=1) if Y.ndim == 2 else Y


class FeatureClient(ClientHalf):
    """A feature-based client: its columns ``Z`` of every row, the labels, the loss."""

    messages = SSCA

    state_fields = ("idx", "w0", "wi", "h", "H")

    def __init__(
        self,
        name: str,
        Z: np.ndarray,
        Y: np.ndarray,
        loss: FeatureSplitLoss,
        peers: list[str],
        outbox,
        designated: bool,
        send_value: bool = False,
        test: tuple[np.ndarray, np.ndarray] | None = None,
    ):
        self.name, self.program = name, None
        self.stats = {"local_solves": 0, "local_iterations": 0, "seconds": 0.0, "samples": 0}
        self.Z, self.Y, self.loss, self.peers, self.outbox = Z, Y, loss, list(peers), outbox
        self.designated, self.send_value, self.test = bool(designated), bool(send_value), test
        self.idx = np.zeros(0, dtype=np.int64)
        self.w0 = self.wi = self.h = self.H = None

    def _on_fb_batch(self, idx, w0, wi):
        self.idx = np.asarray(idx, dtype=np.int64)
        self.w0, self.wi = np.asarray(w0, dtype=float), np.asarray(wi, dtype=float)
        self.h = self.loss.h(self.wi, self.Z[self.idx])
        self.H = self.h.copy()
        self.stats["samples"] += len(self.idx)
        return {}

    def _on_fb_share(self):
        for j in self.peers:
            self.outbox.send_peer(self.name, j, "fb_h", {"h": self.h})

    def _on_fb_h(self, h):
        self.H = self.H + np.asarray(h, dtype=float)

    def _on_fb_grad(self):
        value, g0, dH = self.loss.top(self.w0, self.H, self.Y[self.idx])
        out = {"gi": self.loss.block_grad(self.wi, self.Z[self.idx], dH)}
        if self.designated:
            out["g0"] = g0
            if self.send_value:
                out["value"] = float(value)
        self.stats["local_iterations"] += 1
        return out

    def _on_fb_onestep(self, idx, wi):
        idx = np.asarray(idx, dtype=np.int64)
        wi = np.asarray(wi, dtype=float)
        Zb = self.Z[idx]
        out = {"h": self.loss.h(wi, Zb), "jac": self.loss.h_jacobian(wi, Zb)}
        if self.designated:
            out["y"] = np.asarray(self.Y[idx], dtype=float)
        self.stats["samples"] += len(idx)
        return out

    def _on_fb_eval_h(self, wi, test=False):
        Z = self.Z if not test else self.test[0]
        return {"h": self.loss.h(np.asarray(wi, dtype=float), Z)}

    def _on_fb_eval_top(self, w0, H, test=False):
        Y = self.Y if not test else self.test[1]
        H = np.asarray(H, dtype=float)
        value, _, _ = self.loss.top(np.asarray(w0, dtype=float), H, Y)
        correct = self.loss.top_correct(np.asarray(w0, dtype=float), H, _labels(Y))
        return {"loss": float(value), "correct": int(correct), "n": len(Y)}

    def _on_report(self):
        return {k: float(v) for k, v in self.stats.items()}


class FeatureServer(LearningServer):
    """The server of the feature-based methods: ``ssca`` (Algorithms 3-4) or vertical SGD
    (``momentum > 0``: SGD-m)."""

    def __init__(self, kind, model, w0, options, state, method, samples, index, designated):
        super().__init__(kind, model, w0, options, state, method, samples)
        self.names, self.index = list(model.party_names), index  # index[0]: omega_0's
        self.n, self.B = len(model.X), int(options.batch_size)
        self.designated, self.has_test = designated, model.test is not None

    def collect(self, runtime, idx) -> tuple[np.ndarray, float]:
        """The batch's summed gradient (d) and loss (when needed), by Algorithm 3's steps
        3-6 (or Remark 4's one step)."""
        i0 = self.index[0]
        g = np.zeros_like(self.w)
        block = {n: self.index[k + 1] for k, n in enumerate(self.names)}
        if self.options.one_step:
            reps = runtime.broadcast("fb_onestep", lambda n: {"idx": idx, "wi": self.w[block[n]]})
            H = sum(np.asarray(r.payload["h"]) for r in reps.values())
            y = np.asarray(reps[self.designated].payload["y"])
            Y = y.astype(np.int64) if y.ndim == 1 else y
            value, g0, dH = self.loss.top(self.w[i0], H, Y)
            g[i0] = g0
            for n, r in reps.items():
                g[block[n]] = self.loss.block_grad(
                    self.w[block[n]], np.asarray(r.payload["jac"]), dH
                )
            return g, value
        runtime.broadcast(
            "fb_batch", lambda n: {"idx": idx, "w0": self.w[i0], "wi": self.w[block[n]]}
        )
        for n in self.names:
            runtime.activate(n, "fb_share")
        runtime.deliver_peer_messages()
        reps = runtime.broadcast("fb_grad", {})
        for n, r in reps.items():
            g[block[n]] = r.payload["gi"]
        d = reps[self.designated].payload
        g[i0] = d["g0"]
        return g, float(d.get("value", np.nan))

    def _round(self, runtime) -> dict:
        idx = server_batch(self.options.seed, self.t, self.n, self.B)
        g, value = self.collect(runtime, idx)
        b = len(idx)
        g, value = g / b, value / b
        if self.kind == "sgd":
            r = self.options.lr(self.t)
            step = g + 2 * self.lam * self.w
            if self.options.momentum > 0:
                self.v = self.options.momentum * self.v + step
                step = self.v
            self.w = self.w - r * step
            return {"lr": r}
        cons = [(value, g) for _ in self.constraints]
        rho, gamma = self.options.rho(self.t), self.options.gamma(self.t)
        self.state.update(rho, self.w, g, cons)
        w_bar, self.slack = self.state.solve()
        if self.state.last is not None:
            self.nu = self.state.last.nu
        self.w = (1 - gamma) * self.w + gamma * w_bar
        return {"rho": rho, "gamma": gamma}

    def _eval(self, runtime, test: bool) -> dict:
        block = {n: self.index[k + 1] for k, n in enumerate(self.names)}
        reps = runtime.broadcast(
            "fb_eval_h", lambda n: {"wi": self.w[block[n]], "test": test}, channel="diagnostic"
        )
        H = sum(np.asarray(r.payload["h"]) for r in reps.values())
        top = runtime.send(
            self.designated,
            "fb_eval_top",
            {"w0": self.w[self.index[0]], "H": H, "test": test},
            channel="diagnostic",
        ).payload
        return top

    def _evaluate(self, runtime) -> dict:
        top = self._eval(runtime, False)
        row = {"train_loss": top["loss"] / top["n"], "train_accuracy": top["correct"] / top["n"]}
        row["constraint_values"] = [row["train_loss"] - con.U for con in self.constraints]
        if self.has_test:
            tt = self._eval(runtime, True)
            row["test_accuracy"] = tt["correct"] / tt["n"]
        return row
