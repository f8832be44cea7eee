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
fb_h       client i -> client j (peer)       ``h`` = h_i(w_i, z_{n,i}) of the batch (B x H);
                                             ``hc``: the h_{m,i} of each constraint with
                                             another loss, side by side (B x sum H_m)
fb_grad    server -> client i                empty; reply ``gi`` = sum of the block's
                                             gradients (d_i); the designated client adds
                                             ``g0`` (d_0) and, with a constraint,
                                             ``value`` (1); per constraint with another
                                             loss ``lgi`` (its block's gradient sum), the
                                             designated client ``lg0``, ``lvalue``
                                             (Algorithm 4's q_{f,m,0}, q_{f,m,i}); per
                                             function constraint of its own ``fvalue``,
                                             ``fgrad`` (d_i, on all its rows)
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
from fedmodel.algorithms.ssca.constraints import evaluate_function, feature_losses, own_functions
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

    state_fields = ("idx", "w0", "wi", "h", "H", "hc", "Hc", "cwidths")

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
        closses: tuple = (),
        functions: tuple = (),
    ):
        self.name, self.program = name, None
        #: (label, FeatureSplitLoss) of each constraint with another loss (every client)
        self.closses = list(closses)
        #: (label, function(w_i, Z_i, Y)) of its own function constraints
        self.functions = list(functions)
        self.hc = self.Hc = None
        self.cwidths = np.zeros(0, dtype=np.int64)
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
        if self.closses:
            self.hc = self._constraint_h(self.wi, self.Z[self.idx])
            self.Hc = self.hc.copy()
        self.stats["samples"] += len(self.idx)
        return {}

    def _constraint_h(self, wi, Z) -> np.ndarray:
        """The ``h_{m,i}`` of every constraint loss side by side (rows x sum H_m)."""
        hs = [np.asarray(loss.h(wi, Z), dtype=float) for _, loss in self.closses]
        self.cwidths = np.array([h.shape[1] for h in hs], dtype=np.int64)
        return np.concatenate(hs, axis=1)

    def _split(self, Hc) -> list[np.ndarray]:
        return np.split(np.asarray(Hc, dtype=float), np.cumsum(self.cwidths)[:-1], axis=1)

    def _on_fb_share(self):
        payload = {"h": self.h}
        if self.closses:
            payload["hc"] = self.hc
        for j in self.peers:
            self.outbox.send_peer(self.name, j, "fb_h", payload)

    def _on_fb_h(self, h, hc=None):
        self.H = self.H + np.asarray(h, dtype=float)
        if hc is not None and self.closses:
            self.Hc = self.Hc + np.asarray(hc, dtype=float)

    def _on_fb_grad(self):
        value, g0, dH = self.loss.top(self.w0, self.H, self.Y[self.idx])
        out = {"gi": self.loss.block_grad(self.wi, self.Z[self.idx], dH)}
        if self.designated:
            out["g0"] = g0
            if self.send_value:
                out["value"] = float(value)
        if self.closses:
            lgi, lg0, lvalue = [], [], []
            Zb, Yb = self.Z[self.idx], self.Y[self.idx]
            for (_, loss), Hm in zip(self.closses, self._split(self.Hc)):
                v, g0m, dHm = loss.top(self.w0, Hm, Yb)
                lgi.append(loss.block_grad(self.wi, Zb, dHm))
                lg0.append(g0m)
                lvalue.append(float(v))
            out["lgi"] = np.array(lgi)
            if self.designated:
                out["lg0"], out["lvalue"] = np.array(lg0), np.array(lvalue)
        if self.functions:
            out.update(self._function_values(self.wi))
        self.stats["local_iterations"] += 1
        return out

    def _function_values(self, wi) -> dict:
        """Value and block gradient of its own function constraints, on all its rows."""
        vals, grads = [], []
        for label, fn in self.functions:
            v, g = evaluate_function(fn, (wi, self.Z, self.Y), wi.size, label, self.name)
            vals.append(v)
            grads.append(g)
        return {"fvalue": np.array(vals), "fgrad": np.array(grads)}

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
        wi = np.asarray(wi, dtype=float)
        out = {"h": self.loss.h(wi, Z)}
        if self.closses and not test:
            out["hc"] = self._constraint_h(wi, Z)
        if self.functions and not test:
            out["fvalue"] = self._function_values(wi)["fvalue"]
        return out

    def _on_fb_eval_top(self, w0, H, test=False, Hc=None):
        Y = self.Y if not test else self.test[1]
        H, w0 = np.asarray(H, dtype=float), np.asarray(w0, dtype=float)
        value, _, _ = self.loss.top(w0, H, Y)
        out = {"loss": float(value), "n": len(Y)}
        try:
            out["correct"] = int(self.loss.top_correct(w0, H, _labels(Y)))
        except NotImplementedError:  # a regression
            pass
        if Hc is not None and self.closses:
            out["closs"] = np.array(
                [loss.top(w0, Hm, Y)[0] for (_, loss), Hm in zip(self.closses, self._split(Hc))]
            )
        return out

    def _on_report(self):
        return {k: float(v) for k, v in self.stats.items()}


class FeatureServer(LearningServer):
    """The server of the feature-based methods: ``ssca`` (Algorithms 3-4) or vertical SGD
    (``momentum > 0``: SGD-m)."""

    def __init__(self, kind, model, w0, options, state, method, samples, index, designated):
        super().__init__(kind, model, w0, options, state, method, samples)
        #: constraints with another loss (their order in lgi / lg0 / lvalue / closs)
        self.closs_index = feature_losses(self.constraints)
        #: per client, its own function constraints (their order in fvalue / fgrad)
        self.own = {
            n: own_functions(self.constraints, n)
            for n in model.party_names
            if own_functions(self.constraints, n)
        }
        self.pieces = {}
        self.names, self.index = list(model.party_names), index  # index[0]: omega_0's
        self.n, self.B = len(model.X), int(options.batch_size)
        self.designated, self.has_test = designated, model.test is not None

    def collect(self, runtime, idx) -> tuple[np.ndarray, float]:
        """The batch's summed gradient (d) and loss (when needed), by Algorithm 3's steps
        3-6 (or Remark 4's one step); the other constraints' pieces in ``self.pieces``."""
        self.pieces: dict[int, tuple[float, np.ndarray]] = {}
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
        for k, m in enumerate(self.closs_index):  # another loss: Algorithm 4's q_{f,m}
            gm = np.zeros_like(self.w)
            for n, r in reps.items():
                gm[block[n]] = np.asarray(r.payload["lgi"])[k]
            gm[i0] = np.asarray(d["lg0"])[k]
            self.pieces[m] = (float(np.asarray(d["lvalue"])[k]), gm)
        for n, ms in self.own.items():  # clients' own functions (exact, not batch sums)
            p = reps[n].payload
            for k, m in enumerate(ms):
                gm = np.zeros_like(self.w)
                gm[block[n]] = np.asarray(p["fgrad"])[k]
                self.pieces[m] = (float(np.asarray(p["fvalue"])[k]), gm)
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
        cons = []
        for m, con in enumerate(self.constraints):
            if con.kind == "loss":
                cons.append((value, g))
            elif con.kind == "sample":
                v, gm = self.pieces[m]
                cons.append((v / b, gm / b))
            elif con.party == "server":
                cons.append(self.server_function(con))
            else:
                cons.append(self.pieces[m])
        rho, gamma = self.options.rho(self.t), self.options.gamma(self.t)
        self.state.update(rho, self.w, g, cons)
        w_bar, self.slack = self.state.solve()
        self._after_solve()
        self.w = (1 - gamma) * self.w + gamma * w_bar
        return {"rho": rho, "gamma": gamma}

    def _eval(self, runtime, test: bool) -> dict:
        block = {n: self.index[k + 1] for k, n in enumerate(self.names)}
        reps = runtime.broadcast(
            "fb_eval_h", lambda n: {"wi": self.w[block[n]], "test": test}, channel="diagnostic"
        )
        H = sum(np.asarray(r.payload["h"]) for r in reps.values())
        request = {"w0": self.w[self.index[0]], "H": H, "test": test}
        if self.closs_index and not test:
            request["Hc"] = sum(np.asarray(r.payload["hc"]) for r in reps.values())
        top = dict(
            runtime.send(self.designated, "fb_eval_top", request, channel="diagnostic").payload
        )
        if not test:
            top["fvalue"] = {
                m: float(np.asarray(reps[n].payload["fvalue"])[k])
                for n, ms in self.own.items()
                for k, m in enumerate(ms)
            }
        return top

    def _evaluate(self, runtime) -> dict:
        top = self._eval(runtime, False)
        row = {"train_loss": top["loss"] / top["n"]}
        if "correct" in top:
            row["train_accuracy"] = top["correct"] / top["n"]
        vals = []
        for m, con in enumerate(self.constraints):
            if con.kind == "loss":
                value = row["train_loss"]
            elif con.kind == "sample":
                value = float(np.asarray(top["closs"])[self.closs_index.index(m)]) / top["n"]
            elif con.party == "server":
                value = self.server_function(con)[0]
            else:
                value = top["fvalue"][m]
            vals.append(value - con.U)
        row["constraint_values"] = vals
        if self.has_test:
            tt = self._eval(runtime, True)
            if "correct" in tt:
                row["test_accuracy"] = tt["correct"] / tt["n"]
        return row
