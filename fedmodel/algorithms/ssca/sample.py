"""Sample-based (horizontal) halves: each client holds its own rows (seed 003, Algorithms
1-2, and the FedSGD / FedAvg / local momentum SGD baselines).

Message table (channel ``"algorithm"``; ``d`` = number of parameters):

========== ============================== ============================================
kind       server -> client               client -> server (reply)
========== ============================== ============================================
ssca_w     ``w`` (d)                      ``grad`` = sum of the batch's gradients (d);
                                          ``value`` = sum of its losses (1) when a
                                          constraint involves this client (Alg. 2: d+1);
                                          ``cvalue`` (k), ``cgrad`` (k x d): each other
                                          constraint it computes (another loss: sums on
                                          the same batch; its own function: value and
                                          gradient on all its rows)
sgd_w      ``w`` (d)                      ``w`` after E local (momentum) SGD steps (d)
========== ============================== ============================================

Diagnostic channel: ``evaluate`` (``w`` -> the client's loss sum, row count and correct
predictions on all its rows), ``full_grad`` (``w`` -> its full gradient sum). No row of a
client ever leaves it: only sums over its batch.
"""

from __future__ import annotations

import numpy as np

from fedmodel.algorithms.protocol import ClientHalf
from fedmodel.algorithms.ssca.constraints import evaluate_function
from fedmodel.algorithms.ssca.messages import SSCA
from fedmodel.algorithms.ssca.options import Schedule
from fedmodel.algorithms.ssca.server import LearningServer
from fedmodel.losses.base import SampleLoss


def sample_batch(seed: int, index: int, draw: int, n: int, B: int, step: int = 0) -> np.ndarray:
    """Client ``index``'s batch of its ``draw``-th round (and local step ``step``): ``B``
    distinct row indices out of ``n`` (all rows when ``B >= n``), from the generator
    seeded by ``(seed, index, draw, step)``."""
    if B >= n:
        return np.arange(n)
    rng = np.random.default_rng([int(seed), int(index), int(draw), int(step)])
    return np.sort(rng.choice(n, size=B, replace=False))


class SampleClient(ClientHalf):
    """A sample-based client: its rows ``(X, Y)``, the loss, its sampler."""

    messages = SSCA

    state_fields = ("draws", "buf")

    def __init__(
        self,
        name: str,
        index: int,
        X: np.ndarray,
        Y: np.ndarray,
        loss: SampleLoss,
        batch_size: int,
        seed: int,
        send_value: bool = False,
        lam: float = 0.0,
        lr: Schedule | None = None,
        momentum: float = 0.0,
        local_steps: int = 1,
        constraint_tasks: tuple = (),
    ):
        self.name, self.program = name, None
        #: (kind, label, loss or function) of each other constraint it computes, in order
        self.tasks = list(constraint_tasks)
        self.stats = {"local_solves": 0, "local_iterations": 0, "seconds": 0.0, "samples": 0}
        self.index, self.X, self.Y, self.loss = int(index), X, Y, loss
        self.B, self.seed, self.send_value = int(batch_size), int(seed), bool(send_value)
        self.lam, self.lr, self.momentum, self.E = float(lam), lr, float(momentum), int(local_steps)
        self.draws = 0
        self.buf = np.zeros(loss.dim)

    def _batch(self, step: int = 0) -> np.ndarray:
        idx = sample_batch(self.seed, self.index, self.draws, len(self.X), self.B, step)
        self.stats["samples"] += len(idx)
        return idx

    def _on_ssca_w(self, w):
        self.draws += 1
        idx = self._batch()
        value, grad = self.loss.value_and_grad(np.asarray(w, dtype=float), self.X[idx], self.Y[idx])
        self.stats["local_iterations"] += 1
        out = {"grad": grad}
        if self.send_value:
            out["value"] = float(value)
        if self.tasks:
            out.update(self._constraint_uploads(np.asarray(w, dtype=float), idx))
        return out

    def _constraint_uploads(self, w: np.ndarray, idx: np.ndarray | None) -> dict:
        """Values and gradients of its other constraints: a loss summed over the batch
        ``idx`` (all rows when None), its own function on all its rows."""
        values, grads = [], []
        for kind, label, obj in self.tasks:
            if kind == "sample":
                rows = slice(None) if idx is None else idx
                v, g = obj.value_and_grad(w, self.X[rows], self.Y[rows])
            else:
                v, g = evaluate_function(obj, (w, self.X, self.Y), w.size, label, self.name)
            values.append(float(v))
            grads.append(np.asarray(g, dtype=float))
        return {"cvalue": np.array(values), "cgrad": np.array(grads).reshape(len(grads), w.size)}

    def _on_sgd_w(self, w):
        self.draws += 1
        r = self.lr(self.draws)
        w = np.array(w, dtype=float)
        for e in range(self.E):
            idx = self._batch(e)
            g = self.loss.value_and_grad(w, self.X[idx], self.Y[idx])[1] / len(idx)
            g = g + 2 * self.lam * w
            if self.momentum > 0:
                self.buf = self.momentum * self.buf + g
                g = self.buf
            w -= r * g
            self.stats["local_iterations"] += 1
        return {"w": w}

    def _on_evaluate(self, w):
        w = np.asarray(w, dtype=float)
        vals = self.loss.values(w, self.X, self.Y)
        out = {"loss": float(vals.sum()), "n": len(self.X)}
        if self.tasks:
            out["cvalue"] = self._constraint_uploads(w, None)["cvalue"]
        try:
            pred = self.loss.predict(w, self.X)
            out["correct"] = int(np.sum(pred == _labels(self.Y)))
        except NotImplementedError:
            pass
        return out

    def _on_full_grad(self, w):
        return {"grad": self.loss.value_and_grad(np.asarray(w, dtype=float), self.X, self.Y)[1]}

    def _on_report(self):
        return {k: float(v) for k, v in self.stats.items()}


def _labels(Y):
    Y = np.asarray(Y)
    return Y.argmax(axis=1) if Y.ndim == 2 else Y


class SampleServer(LearningServer):
    """The server of the sample-based methods: ``ssca`` (Algorithms 1-2) or an SGD
    baseline (``sgd``: average of the clients' local models, weights ``N_i / N``)."""

    def __init__(self, kind, model, w0, options, state, method, samples, sizes, tasks=None):
        super().__init__(kind, model, w0, options, state, method, samples)
        #: per client, the indices of the constraints in its ``cvalue``/``cgrad`` (in order)
        self.tasks = dict(tasks or {})
        self.sizes = dict(sizes)
        self.N = sum(self.sizes.values())
        self.B = int(options.batch_size)
        self.test = model.test

    def _round(self, runtime) -> dict:
        if self.kind == "sgd":
            reps = runtime.broadcast("sgd_w", {"w": self.w})
            self.w = sum(
                self.sizes[n] / self.N * np.asarray(r.payload["w"]) for n, r in reps.items()
            )
            return {}
        reps = runtime.broadcast("ssca_w", {"w": self.w})
        b = {n: min(self.B, self.sizes[n]) for n in reps}
        wt = {n: self.sizes[n] / (b[n] * self.N) for n in reps}
        g = sum(wt[n] * np.asarray(r.payload["grad"]) for n, r in reps.items())
        cons = [
            self._constraint_estimate(m, con, reps, g, wt, b)
            for m, con in enumerate(self.constraints)
        ]
        rho, gamma = self.options.rho(self.t), self.options.gamma(self.t)
        self.state.update(rho, self.w, g, cons)
        w_bar, self.slack = self.state.solve()
        self._after_solve()
        step = float(np.linalg.norm(w_bar - self.w))
        self.w = (1 - gamma) * self.w + gamma * w_bar
        return {"rho": rho, "gamma": gamma, "w_bar_distance": step}

    def _constraint_estimate(self, m, con, reps, g, wt, b) -> tuple[float, np.ndarray]:
        """``(value, gradient)`` estimates of constraint ``m`` at ``w_t`` from the replies:
        weights ``N_i / (B N)`` over every client, ``1/B`` for a client's own rows, exact
        for a function."""
        if con.kind == "function" and con.party == "server":
            return self.server_function(con)
        if con.kind == "loss":
            if con.party == "server":
                return sum(wt[n] * r.payload["value"] for n, r in reps.items()), g
            p = reps[con.party].payload
            return p["value"] / b[con.party], np.asarray(p["grad"]) / b[con.party]

        def part(n):
            p, k = reps[n].payload, self.tasks[n].index(m)
            return float(p["cvalue"][k]), np.asarray(p["cgrad"][k], dtype=float)

        if con.kind == "function":
            return part(con.party)
        if con.party != "server":
            v, gm = part(con.party)
            return v / b[con.party], gm / b[con.party]
        parts = {n: part(n) for n in reps}
        return (
            sum(wt[n] * v for n, (v, _) in parts.items()),
            sum(wt[n] * gm for n, (_, gm) in parts.items()),
        )

    def _evaluate(self, runtime) -> dict:
        reps = runtime.broadcast("evaluate", {"w": self.w}, channel="diagnostic")
        loss = sum(r.payload["loss"] for r in reps.values())
        row = {"train_loss": loss / self.N}
        if all("correct" in r.payload for r in reps.values()):
            row["train_accuracy"] = sum(r.payload["correct"] for r in reps.values()) / self.N
        vals = []
        for m, con in enumerate(self.constraints):
            if con.kind == "function" and con.party == "server":
                value = self.server_function(con)[0]
            elif con.kind == "function":
                value = float(reps[con.party].payload["cvalue"][self.tasks[con.party].index(m)])
            elif con.party == "server" and con.kind == "loss":
                value = row["train_loss"]
            elif con.party == "server":
                value = sum(
                    float(r.payload["cvalue"][self.tasks[n].index(m)]) for n, r in reps.items()
                )
                value /= self.N
            else:
                p = reps[con.party].payload
                total = (
                    p["loss"] if con.kind == "loss" else p["cvalue"][self.tasks[con.party].index(m)]
                )
                value = float(total) / p["n"]
            vals.append(value - con.U)
        row["constraint_values"] = vals
        if self.test is not None:
            pred = self.loss.predict(self.w, self.test[0])
            row["test_accuracy"] = float(np.mean(pred == _labels(self.test[1])))
        return row

    def _full_gradient(self, runtime) -> np.ndarray:
        reps = runtime.broadcast("full_grad", {"w": self.w}, channel="diagnostic")
        return sum(np.asarray(r.payload["grad"]) for r in reps.values()) / self.N
