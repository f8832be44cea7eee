"""The party half of fair-vfl and fedbcd (seed 002, Algorithm 1).

Party ``k`` holds its column block ``X_k`` (and, for evaluation, its test block), the
labels and the groups (known to every party, the paper's assumption), and its parameter
block ``theta_k``, which never leaves it (unless the run asks for it at the end,
``vfl_reveal`` on the diagnostic channel).

Messages (server -> party, reply party -> server):

==============  ===========  ===============================  ==============================
kind            channel      payload down                     reply
==============  ===========  ===============================  ==============================
``vfl_start``   algorithm    (nothing)                        ``partial_scores`` (n,)
``vfl_round``   algorithm    ``scores`` (n,), ``lambda`` (2,)  ``partial_scores`` (n,)
                             (fedbcd: ``scores`` only)
``vfl_monitor`` diagnostic   (nothing)                        ``step_sq``, ``regularizer``,
                                                              ``updates`` (scalars)
``vfl_kkt``     diagnostic   ``scores`` (n,), ``lambda`` (2,)  ``grad_inf``, ``grad_sq``,
                                                              ``regularizer`` (scalars)
``report``      diagnostic   (nothing)                        ``seconds``, ``updates_total``;
                                                              ``test_scores`` (n_test,) when
                                                              it holds a test block;
                                                              ``theta`` (m_k,) only with
                                                              ``reveal_parameters``
==============  ===========  ===============================  ==============================

One ``vfl_round`` is the party's share of round ``t`` (eqs. 10-11): from the full scores
``z = X theta^(t)`` it makes ``q`` block steps ``theta_k <- theta_k - (1/eta_t) grad_k
f(theta~, lambda)``, each on the *inconsistent read* ``theta~`` = its own current block and
every other block as of the last exchange, whose scores it forms locally as ``z + X_k
(theta_k - theta_k^(t))`` (notes 3.3); then it publishes ``X_k theta_k^(t+1)``. ``q`` is
``Q``, a draw from ``1..Q`` (its own seeded generator) or the count its speed allows.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fedmodel.algorithms.protocol import ClientHalf
from fedmodel.algorithms.vfl.messages import VFL
from fedmodel.algorithms.vfl.options import FairVFLOptions, Schedule
from fedmodel.algorithms.vfl.problem import ScoreFunctions


class VFLParty(ClientHalf):
    """One data party of fair-vfl / fedbcd (a :class:`~fedmodel.algorithms.protocol.ClientHalf`
    whose whole algorithm state is the dict ``state``; it has no
    :class:`~fedmodel.compiler.partition.PartyProgram`, only its block).

    Parameters
    ----------
    name : str
    X_block : array (n, m_k)
        This party's columns (nobody else's).
    y, group_a : arrays (n,)
        Labels (+-1) and groups, known to every party.
    index : int
        The party's position (seeds its generator; picks its speed).
    opts : FairVFLOptions
    schedule_constants : (L, L12)
        For the theoretical schedule (agreed at set-up).
    X_test : array (n_test, m_k), optional
        This party's columns of the held-out samples.
    """

    messages = VFL

    def __init__(
        self,
        name: str,
        X_block: np.ndarray,
        y: np.ndarray,
        group_a: np.ndarray,
        index: int,
        opts: FairVFLOptions,
        schedule_constants: tuple[float, float] = (1.0, 1.0),
        K: int = 1,
        l2: float = 0.0,
        X_test: np.ndarray | None = None,
    ):
        self.name = name
        self.program = None
        self.stats = {"local_solves": 0, "local_iterations": 0, "seconds": 0.0}
        self.X = np.asarray(X_block, dtype=float)
        self.X_test = None if X_test is None else np.asarray(X_test, dtype=float)
        self.scores_of = ScoreFunctions(y, group_a, opts.constraint, opts.tpr_temperature)
        self.opts = opts
        self.Q = int(opts.Q)
        self.l2 = float(l2)
        self.schedule = Schedule(opts, K, schedule_constants)
        self.speed = float(opts.speeds[index]) if opts.local_updates == "speeds" else 1.0
        m = self.X.shape[1]
        rng = np.random.default_rng([int(opts.seed), int(index)])
        self.state: dict[str, Any] = {
            "theta": np.zeros(m),
            "t": 0,
            "step_sq": 0.0,  # ||theta_k^(t) - theta_k^(t+1)||^2 of the last round
            "eta_last": float(self.schedule.eta(0)),
            "updates": 0,  # local updates made in the last round
            "updates_total": 0,
            "rng": rng.bit_generator.state,
        }

    state_fields = ("state",)

    # -- the algorithm ------------------------------------------------------------------
    def updates_this_round(self, t: int) -> int:
        """How many local updates the party completes in round ``t`` (1..Q)."""
        if self.opts.local_updates == "exact":
            return self.Q
        if self.opts.local_updates == "random":
            rng = np.random.default_rng()
            rng.bit_generator.state = self.state["rng"]
            q = int(rng.integers(1, self.Q + 1))
            self.state["rng"] = rng.bit_generator.state
            return q
        done = np.floor((t + 1) * self.Q * self.speed + 1e-12) - np.floor(
            t * self.Q * self.speed + 1e-12
        )
        return int(min(self.Q, max(1, done)))

    def block_gradient(self, z: np.ndarray, theta: np.ndarray, lam_diff: float) -> np.ndarray:
        """(8): ``grad_k f = X_k^T w(z) + 2 l2 theta_k`` from the full scores ``z``."""
        return self.X.T @ self.scores_of.score_weights(z, lam_diff) + 2.0 * self.l2 * theta

    def _on_vfl_start(self) -> dict:
        return {"partial_scores": self.X @ self.state["theta"]}

    def _on_vfl_round(self, scores: np.ndarray, **rest) -> dict:
        lam = np.asarray(rest.get("lambda", (0.0, 0.0)), dtype=float)
        lam_diff = float(lam[0] - lam[1])
        st = self.state
        t = int(st["t"])
        eta = self.schedule.eta(t)
        theta_start = st["theta"]
        theta = theta_start.copy()
        z = np.array(scores, dtype=float)  # the stale read: own block fresh, others at t
        q = self.updates_this_round(t)
        for _ in range(q):
            step = self.block_gradient(z, theta, lam_diff) / eta
            theta -= step
            z -= self.X @ step
        diff = theta_start - theta
        st.update(
            theta=theta,
            t=t + 1,
            step_sq=float(diff @ diff),
            eta_last=eta,
            updates=q,
            updates_total=int(st["updates_total"]) + q,
        )
        return {"partial_scores": self.X @ theta}

    # -- monitoring and evaluation (diagnostic channel) -----------------------------------
    def _on_vfl_monitor(self) -> dict:
        st = self.state
        theta = st["theta"]
        return {
            "step_sq": float(st["eta_last"] ** 2 * st["step_sq"]),
            "regularizer": float(self.l2 * theta @ theta),
            "updates": float(st["updates"]),
        }

    def _on_vfl_kkt(self, scores: np.ndarray, **rest) -> dict:
        lam = np.asarray(rest.get("lambda", (0.0, 0.0)), dtype=float)
        g = self.block_gradient(np.asarray(scores, float), self.state["theta"], lam[0] - lam[1])
        theta = self.state["theta"]
        return {
            "grad_inf": float(np.abs(g).max(initial=0.0)),
            "grad_sq": float(g @ g),
            "regularizer": float(self.l2 * theta @ theta),
        }

    def _on_evaluate(self, **_):
        raise ValueError(f"party {self.name!r}: a vertical party answers vfl_kkt, not evaluate")

    def _on_report(self) -> dict:
        """The end of the run (diagnostic): statistics, the test partial scores, and
        ``theta_k`` only when the run reveals the parameters."""
        theta = self.state["theta"]
        out: dict[str, Any] = {
            "seconds": float(self.stats["seconds"]),
            "updates_total": float(self.state["updates_total"]),
        }
        if self.X_test is not None:
            out["test_scores"] = self.X_test @ theta
        if self.opts.reveal_parameters:
            out["theta"] = theta.copy()
        return out
