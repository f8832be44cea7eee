"""prox-al's inner solvers ``"newton"`` (an opt-in) and ``"quasi-newton"`` (the adaptive
default on smooth models): a federated (quasi-)Newton method on Algorithm 1's subproblem
``l_k`` (the loop and the secant models: :mod:`~fedmodel.algorithms.proxal.newton_inner`).

Each round the server broadcasts a trial point; every client returns ``P_{i,k}``'s value
and gradient there (``gradient_w``), with ``curvature_directions = k > 0`` also its
Hessian-vector products along ``k`` server-chosen directions (``curvature_w``) or, with
``"newton"``, its ``d x d`` Hessian when it changed (``newton_w``). The request that starts
an inner solve (``start``, ``outer``, ``outer_aa``) is answered with the same derivatives at
the new centre ``w^k``. The inner loop stops when the measured ``||grad l_k||_inf <=
tau_k``; the outer reply then also carries the client's measured feasibility (test (8)).
A client with its own variables (or, for ``"newton"``, without exact Hessians) refuses at
the start, and the run falls back to the next route of the table.

Examples
--------
>>> QuasiNewtonInner.name, QuasiNewtonInner.probes, NewtonInner.auto
('quasi-newton', True, False)
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from fedmodel.algorithms.messages import W
from fedmodel.algorithms.proxal.inner import InnerClient, InnerOutcome, InnerSolver
from fedmodel.algorithms.proxal.newton_inner import (
    DENSE_MODEL_MAX,
    SHIFT,
    LimitedSecantModel,
    SecantModel,
    federated_newton,
)
from fedmodel.algorithms.proxal.obstacles import exact_preferred, newton_obstacle
from fedmodel.algorithms.proxal.options import NEWTON_DEFAULTS, QUASI_NEWTON_DEFAULTS
from fedmodel.algorithms.proxal.secant_rounds import SecantRounds
from fedmodel.runtime.schema import Field, MessageSpec
from fedmodel.subproblems.newton import cholesky_solve, shifted_cholesky

NEWTON = "inner_solver='newton'"
#: quasi-Newton: rejected trial points at one iterate that give a new direction from the
#: updated secant model before the line search backtracks along the last one
QN_REMODEL = 2

_VALUE = Field((), reveals="P_{i,k}(w)", sum_only=True)
_GRAD = Field(("d",), reveals="the gradient of P_{i,k} at w", sum_only=True)
_HESSIAN = Field(
    ("d", "d"),
    required=False,
    opt_in=NEWTON,
    reveals="the Hessian of P_{i,k} at w (d x d curvature: with fewer rows than d it "
    "can reveal the rows)",
)
_HVP = Field(
    ("<=cd", "d"),
    reveals="the Hessian of P_{i,k} at w times each direction (directional derivatives of "
    "its gradient; for a quadratic client the gradient difference along it)",
    sum_only=True,
)
_STIFF = Field(
    ("<=m_con", "d"),
    required=False,
    reveals="the gradients at w, times sqrt(beta), of its equality constraints and active "
    "non-affine inequalities (constraint_curvature: their augmented-Lagrangian curvature "
    "J_i^T J_i; for affine equalities, its constraint rows themselves)",
)
_DIRECTIONS = Field(("<=cd", "d"))

GRADIENT_W = MessageSpec(
    "gradient_w",
    request={"w": W},
    reply={"value": _VALUE, "grad": _GRAD, "stiff": _STIFF},
    reveals="P_{i,k}'s value and gradient at a trial point (quasi-Newton inner solver with "
    "curvature_directions = 0, its default above 500 shared variables: d + 1 floats, no "
    "curvature of its terms; with constraint_curvature, on up to 2000 shared variables, "
    "the rows of its equality and active non-affine inequality constraints, d floats each)",
    methods=("prox-al",),
)
CURVATURE_W = MessageSpec(
    "curvature_w",
    request={"w": W, "directions": _DIRECTIONS, "precondition": Field(("d",), required=False)},
    reply={
        "value": _VALUE,
        "grad": _GRAD,
        "hvp": _HVP,
        "stiff": _STIFF,
        "local_direction": Field(
            ("d",),
            required=False,
            reveals="its local Newton direction (n (H_i + p I))^(-1) r for the server's "
            "vector r (local_directions): one product of the inverse of its Hessian of "
            "P_{i,k} at w, of the kind of a Hessian-vector product",
        ),
    },
    reveals="P_{i,k}'s value, gradient and Hessian-vector products along k = "
    "curvature_directions server-chosen directions at a trial point (the quasi-Newton "
    "default up to 500 shared variables, k = min(2, d // 4): (k + 1) d + 1 floats; the "
    "products of d / k rounds span the Hessian where it does not change, e.g. a quadratic "
    "client's; with local_directions, on by default when the server has no inequality "
    "constraints, one more direction and the client's local Newton direction: (k + 3) d + 1 "
    "floats; with constraint_curvature its constraint rows, d floats each)",
    methods=("prox-al",),
)
NEWTON_W = MessageSpec(
    "newton_w",
    request={"w": W},
    reply={"value": _VALUE, "grad": _GRAD, "hessian": _HESSIAN},
    reveals="P_{i,k}'s value and gradient at a trial point (Newton inner solver)",
    methods=("prox-al",),
    party_opt_in="hessian",  # (proxal.messages.HESSIAN: the party's own opt-in)
)


class _DerivativeInner(InnerSolver):
    """What the Newton-type routes share on the server: the clients' derivatives at the
    start of an inner solve, the sums of their values and gradients, test (8)'s measured
    feasibility and the stalled message."""

    probes = True
    measures_feasibility = True

    @classmethod
    def accepts(cls, compiled, options, proximal):
        why = newton_obstacle(compiled, options, proximal)
        return f"{why}; use inner_solver='admm'" if why else None

    def __init__(self, host):
        super().__init__(host)
        self.start_derivatives: tuple[float, np.ndarray] | None = None
        self.client_hessians: dict[str, np.ndarray] = {}
        self.hessian_sum: np.ndarray | None = None

    def take_derivatives(self, replies) -> tuple[float, np.ndarray]:
        """The clients' ``P_{i,k}`` derivatives: keep the Hessians they sent (a client
        sends one only when it changed) and return the sums of their values and
        gradients (over the replies that carry them: under secure aggregation, the one
        reply of their sums)."""
        new = {n: r.payload["hessian"] for n, r in replies.items() if "hessian" in r.payload}
        if new:
            self.client_hessians = {**self.client_hessians, **new}
            self.hessian_sum = sum(
                np.asarray(H, dtype=float) for H in self.client_hessians.values()
            )
        sent = [r.payload for r in replies.values() if "grad" in r.payload]
        val = sum(float(p["value"]) for p in sent)
        grad = sum(np.asarray(p["grad"], dtype=float) for p in sent)
        return val, grad

    def take_start(self, replies) -> None:
        self.start_derivatives = self.take_derivatives(replies)

    def stall_message(self, k, outcome, tau):
        return (
            f"the federated {self.name} inner solver stalled at outer iteration {k}: its "
            f"line search found no decrease of l_k (||grad l_k||_inf = {outcome.bound:.3g}, "
            f"target tau_k = {tau:.3g}); the values are probably at rounding level. Try "
            "inner_solver='admm' or a larger eps."
        )


def _outcome(out, gradient=None) -> InnerOutcome:
    """An :class:`InnerOutcome` of the (quasi-)Newton loop's outcome (its bound is the
    measured ``||grad l_k||_inf``)."""
    return InnerOutcome(
        out.w, out.rounds, out.residual, out.satisfied, out.residual,
        timed_out=out.timed_out, stalled=out.stalled,
        gradient=out.gradient if gradient is None else gradient,
    )  # fmt: skip


def _with_h_and_prox(host, val, g, w: np.ndarray, w_center: np.ndarray, with_h: bool = True):
    """The server's terms' value and gradient at ``w`` plus a smooth ``h``'s (``with_h``)
    and the server's share ``p ||w - w_center||^2 / 2`` of the proximal term."""
    reg = host.problem.regularizer
    if with_h and not reg.is_zero:  # (a sum of squares: smooth)
        val += reg.value(w)
        g = g + reg.smooth_grad(w)
    p = host.prox_weight
    d = w - w_center
    return val + 0.5 * p * float(d @ d), g + p * d


class NewtonInner(_DerivativeInner):
    """``inner_solver="newton"`` (an opt-in: clients send ``d x d`` Hessians)."""

    name = "newton"
    auto = False
    #: the model holds ``h`` (smooth); False: ``h`` enters through its prox (prox-newton)
    h_in_model: ClassVar[bool] = True
    defaults = NEWTON_DEFAULTS
    start_reply = {"value": _VALUE, "grad": _GRAD, "hessian": _HESSIAN}
    messages = (NEWTON_W,)
    state_fields = ("client_hessians", "start_derivatives")

    def __init__(self, host):
        super().__init__(host)
        self._no_terms_hessian: np.ndarray | None = None  # (a server without terms)
        self._total_hessian = None  # (hessian_sum, server part, l_k's Hessian)

    def check(self) -> None:
        """The server's terms need Hessians (raises :class:`NotRecognised`: the run falls
        back)."""
        backend = self.terms_backend()
        if backend is not None and not hasattr(backend, "derivatives"):
            from fedmodel.compiler.glm import NotRecognised

            raise NotRecognised(f"the server's subproblem backend ({backend.name}) has no Hessians")
        self.own_derivatives(self.host.x, self.host.x)

    def state_restored(self) -> None:
        self.hessian_sum = sum(self.client_hessians.values()) if self.client_hessians else None

    def terms_backend(self):
        """The backend that differentiates the server's terms (None: it has none)."""
        host = self.host
        return host.solver if host.problem.has_smooth_terms else None

    def server_terms(self, w: np.ndarray):
        """Value, gradient and Hessian at ``w`` of the server's terms with ``mu_0``,
        ``nu_0`` (no proximal term, no ``h``); zeros for a server without terms."""
        backend = self.terms_backend()
        if backend is not None:
            return backend.derivatives(w, [self.host.mu], [self.host.nu])
        if self._no_terms_hessian is None:
            self._no_terms_hessian = np.zeros((w.size, w.size))
        return 0.0, np.zeros(w.size), self._no_terms_hessian

    def own_derivatives(self, w: np.ndarray, w_center: np.ndarray):
        """Value, gradient and Hessian at ``w`` of ``l_k``'s server share: ``P_{0,k}`` (its
        terms with ``mu_0``, its share of the proximal term about ``w_center``) plus ``h``
        when the route's model holds it (:attr:`h_in_model`: smooth here); the Hessian
        returned is the model's (the clients' last ones added), the same array while no
        part of it changed (the Newton loop reuses its factor)."""
        host = self.host
        n = w.size
        val, g, H0 = self.server_terms(w)
        reg = host.problem.regularizer
        cached = self._total_hessian
        if cached is None or cached[0] is not self.hessian_sum or cached[1] is not H0:
            H = H0 + (0.0 if self.hessian_sum is None else self.hessian_sum)
            H[np.diag_indices(n)] += host.prox_weight
            if self.h_in_model:
                H[np.diag_indices(n)] += reg.smooth_grad(np.ones(n))
            cached = self._total_hessian = (self.hessian_sum, H0, H)
        return (*_with_h_and_prox(host, val, g, w, w_center, self.h_in_model), cached[2])

    def rounds(self, runtime, w_center: np.ndarray):
        """``(evaluate, start)`` of an inner solve about ``w_center``: one ``newton_w``
        round per trial point, the clients' sums plus the server's share, and the start
        from the derivatives that came with the round that set up ``l_k``."""

        def evaluate(w):
            runtime.next_round()
            replies = runtime.broadcast("newton_w", {"w": w})
            val, grad = self.take_derivatives(replies)
            v0, g0, H = self.own_derivatives(w, w_center)
            return val + v0, grad + g0, H

        val, grad = self.start_derivatives
        v0, g0, H = self.own_derivatives(w_center, w_center)
        return evaluate, (w_center, val + v0, grad + g0, H)

    def solve(self, runtime, tau, deadline) -> InnerOutcome:
        """Federated (semismooth) Newton on ``l_k`` from ``w^k``; one round per trial
        point."""
        evaluate, start = self.rounds(runtime, self.host.x)
        out = federated_newton(evaluate, start, tau, int(self.host.options.max_inner), deadline)
        return _outcome(out)


class QuasiNewtonInner(_DerivativeInner):
    """``inner_solver="quasi-newton"``: the server's secant model of ``l_k`` less its
    constant diagonal (the proximal term and ``h``), from the gradients of consecutive
    rounds and, with ``curvature_directions``, the clients' Hessian-vector products
    (:class:`~fedmodel.algorithms.proxal.secant_rounds.SecantRounds`). The model covers the
    server's own terms too: their exact Hessian at an iterate where an augmented-Lagrangian
    term is inactive says nothing of the wall it meets along the step, which a secant pair
    across it does."""

    name = "quasi-newton"
    defaults = QUASI_NEWTON_DEFAULTS
    # (an inner solve starts with the k random directions and the last step; its rounds
    # may add the clients' local direction: cs <= cd)
    start_request = {"directions": Field(("<=cs", "d"), required=False)}
    start_reply = {
        "value": _VALUE,
        "grad": _GRAD,
        "hvp": Field(("<=cs", "d"), required=False, reveals=_HVP.reveals, sum_only=True),
        "stiff": _STIFF,
    }
    messages = (GRADIENT_W, CURVATURE_W)
    state_fields = (
        "start_derivatives", "start_products", "curvature_k", "client_stiff", "start_stiff",
    )  # fmt: skip
    component_fields = ("secant",)

    @classmethod
    def directions(cls, compiled, options) -> tuple[int, bool]:
        """``(k, local)``: the curvature directions per round on this model and whether the
        clients' local Newton directions come on top (the defaults: see ``__init__``)."""
        d = compiled.layout.n_shared
        k = options.curvature_count(d)
        local = bool(k) and options.local_directions_on(d)
        if options.local_directions is None and compiled.server.m_ineq:
            local = False
        return k, local

    @classmethod
    def dims(cls, compiled, options):
        k, local = cls.directions(compiled, options)
        return {"cd": k + local, "cs": k}

    @classmethod
    def unused(cls, compiled, options):
        k, local = cls.directions(compiled, options)
        off = set() if local else {"precondition", "local_direction"}
        if not k:
            off |= {"directions", "hvp"}
        # (the clients send their rows by the option, see DerivativeClient.send_stiff)
        return off if options.constraint_curvature_on(compiled.layout.n_shared) else off | {"stiff"}

    @classmethod
    def suits(cls, compiled, options, proximal):
        if exact_preferred(compiled, options, proximal):
            return "exact-admm imposes its walls (or restricted domains) exactly"
        return None

    def __init__(self, host):
        super().__init__(host)
        options, ns = host.options, host.ns
        self.secant = SecantModel(ns) if ns <= DENSE_MODEL_MAX else LimitedSecantModel(ns)
        # curvature directions per round (curvature_directions)
        self.curvature_k = options.curvature_count(ns)
        # (the default number of directions may be turned off; one the user set is kept)
        self.curvature_auto = options.curvature_directions is None
        # the clients' local Newton directions as one more direction (by default only when
        # the server has no inequality constraints: the clients' local Hessians do not
        # know its walls; measured, LCQPs with a server box and a norm ball at the server
        # took 1.2-2x the rounds with them)
        self.local_directions = bool(self.curvature_k) and options.local_directions_on(ns)
        if options.local_directions is None and host.mu.size:  # (see directions())
            self.local_directions = False
        # the parties' active constraint rows J (their AL curvature J^T J) added to the
        # model exactly (constraint_curvature; dense model only)
        self.stiff_on = isinstance(self.secant, SecantModel) and options.constraint_curvature_on(ns)
        self.start_stiff: np.ndarray | None = None  # sum of the clients' J^T J at w^k
        self.client_stiff: dict[str, np.ndarray] = {}  # each client's rows as last sent
        self._stiff_sum = None  # (client_stiff, its sum of J^T J)
        self.start_directions: np.ndarray | None = None  # (sent with the inner start)
        # (directions, the clients' summed Hessian products) at w^k
        self.start_products: tuple[np.ndarray, np.ndarray] | None = None

    # (what SecantRounds reads of "the server")
    @property
    def x(self) -> np.ndarray:
        return self.host.x

    @property
    def k(self) -> int:
        return self.host.k

    def check(self) -> None:
        host = self.host
        if host.problem.has_smooth_terms and not hasattr(host.solver, "derivatives"):
            from fedmodel.compiler.glm import NotRecognised

            raise NotRecognised(
                f"the server's subproblem backend ({host.solver.name}) has no Hessians"
            )
        self.own_products(host.x, host.x, np.zeros((0, host.x.size)))  # (no d x d matrix)

    def request(self, move=None) -> dict:
        """With ``curvature_directions > 0``, the directions of the clients'
        Hessian-vector products at the new centre (``move``, the last outer step, first)."""
        self.start_directions = None
        if self.curvature_k:
            step = np.zeros(self.host.ns) if move is None else move[: self.host.ns]
            self.start_directions = self.curvature_directions(step, (self.host.k + 1, 0))
            return {"directions": self.start_directions}
        return {}

    def take_start(self, replies) -> None:
        super().take_start(replies)
        self.start_stiff = self.take_stiff(replies)
        V = self.start_directions
        self.start_products = None
        sent = [r.payload for r in replies.values() if "grad" in r.payload]
        if V is not None and sent and all("hvp" in p for p in sent):
            hvp = [np.asarray(p["hvp"], dtype=float).reshape(V.shape) for p in sent]
            self.start_products = (V, sum(hvp))

    def take_stiff(self, replies) -> np.ndarray | None:
        """``sum_i J_i^T J_i`` of the ``stiff`` rows the clients' replies carry
        (``constraint_curvature``; None when off)."""
        if not self.stiff_on:
            return None
        ns = self.host.ns
        new = {
            name: np.asarray(r.payload["stiff"], dtype=float).reshape(-1, ns)
            for name, r in replies.items()
            if r.payload.get("stiff") is not None
        }
        if new:  # (a client sends its rows when they changed)
            self.client_stiff = {**self.client_stiff, **new}
        cached = self._stiff_sum
        if cached is None or cached[0] is not self.client_stiff:
            S = np.zeros((ns, ns))
            for J in self.client_stiff.values():
                if J.shape[0]:
                    S += J.T @ J
            cached = self._stiff_sum = (self.client_stiff, S)
        return cached[1]

    def own_stiff(self, w: np.ndarray) -> np.ndarray:
        """The server's own ``J_0^T J_0`` at ``w``: the AL curvature of its equalities and
        active affine inequalities (markowitz's ``w >= 0``: 757 rounds without them, 275
        with; its non-affine inequalities' walls are left to the secant pairs: with a norm
        ball at the server, logistic-ball-d100 took 91 rounds with them, 84 without)."""
        host = self.host
        if host.problem.has_smooth_terms and hasattr(host.solver, "stiff_rows"):
            J = host.solver.stiff_rows(w, [host.mu], [host.nu], affine=True, nonaffine=False)
            if J.shape[0]:
                return J.T @ J
        return 0.0

    def own_products(self, w: np.ndarray, w_center: np.ndarray, V: np.ndarray | None):
        """Value and gradient at ``w`` of ``l_k``'s server share (``P_{0,k}`` plus ``h``)
        and ``V H_0`` (rows, ``V`` None: none) with ``H_0`` the Hessian of its terms only
        (the proximal share and ``h`` are the known diagonal): no ``d x d`` matrix."""
        host = self.host
        n = w.size
        V = np.zeros((0, n)) if V is None else V
        if host.problem.has_smooth_terms:
            val, g, HV = host.solver.products(w, [host.mu], [host.nu], V.T)
            HV = HV.T
        else:
            val, g, HV = 0.0, np.zeros(n), np.zeros_like(V)
        return (*_with_h_and_prox(host, val, g, w, w_center), HV)

    def curvature_directions(
        self, step: np.ndarray, seed: tuple, local: np.ndarray | None = None
    ) -> np.ndarray:
        """The ``curvature_directions`` directions (orthonormal rows) of the clients'
        Hessian-vector products at a point ``w + step``: the step itself (when nonzero)
        and random Gaussian directions, drawn from a generator seeded with ``seed`` (the
        outer iteration and round: a resumed run draws the same ones). Random directions
        spread the curvature learnt over the whole space; the model keeps what it learnt
        along earlier ones (measured: demo 68 rounds with 4 random directions, 183 with
        the last steps instead, 290 with gradients only)."""
        k, n = self.curvature_k, step.size
        rng = np.random.default_rng([int(v) for v in seed])
        first = [v for v in (step, local) if v is not None and np.any(v)]
        k += len(first) - bool(np.any(step))  # (a local direction comes on top of k)
        rows = first + list(rng.standard_normal((k, n)))
        Q, R = np.linalg.qr(np.array(rows[:k], dtype=float).T)
        keep = np.abs(np.diag(R)) > 1e-10 * np.abs(np.diag(R)).max()
        return np.ascontiguousarray(Q[:, keep].T)

    def drop_curvature_directions(self) -> None:
        """The safeguard of the default ``curvature_directions``: an inner solve that ends
        without reaching ``tau_k`` (``max_inner`` rounds, or a line search that cannot move)
        with directions turns them off for the rest of the run and starts a new secant model
        (markowitz: with 2 directions every inner solve ran to ``max_inner`` and the run
        ended "diverging" after 5,051 rounds; without them it is optimal in 420). A value
        the user set is kept as it is."""
        host = self.host
        self.curvature_k = 0
        self.secant = type(self.secant)(host.ns)
        host.inner_note = (
            (f"{host.inner_note}; " if host.inner_note else "")
            + f"curvature directions off from outer iteration {host.k} (an inner solve "
            "with them ended short of tau_k)"
        )

    def solve(self, runtime, tau, deadline) -> InnerOutcome:
        """The Newton loop with the secant model in place of the Hessian; with
        ``curvature_directions = k > 0`` every round (and the round that set up ``l_k``)
        carries ``k`` directions and the clients return their Hessian-vector products:
        exact curvature pairs at that point, taken before the secant pair of the
        gradients."""
        host = self.host
        n = host.x.size
        reg = host.problem.regularizer
        known = host.prox_weight + (0.0 if reg.is_zero else reg.smooth_grad(np.ones(n)))
        known = np.array(np.broadcast_to(np.asarray(known, dtype=float), (n,)))
        rounds = SecantRounds(self, runtime, known, self.own_products)
        out = federated_newton(
            rounds.evaluate, rounds.start(), tau, int(host.options.max_inner), deadline,
            remodel=QN_REMODEL, on_accept=rounds.on_accept, noise=host.noise[0],
        )  # fmt: skip
        rounds.finish(out.satisfied, out.timed_out)
        return _outcome(out)


class DerivativeClient(InnerClient):
    """Client ``i``'s side of the Newton-type routes: ``P_{i,k}``'s derivatives at a trial
    point (``gradient_w``, ``curvature_w``, ``newton_w``)."""

    state_fields = ("newton_H", "stiff_sent")
    #: the kind whose reply starts an inner solve ("newton_w" for Newton)
    newton = False

    def __init__(self, host):
        super().__init__(host)
        # inner_solver="newton": (the backend's Hessian, the one last sent) -- read-only
        self.newton_H: tuple[np.ndarray, np.ndarray] | None = None
        # local directions: (the backend's Hessian, the Cholesky factor of n (H_i + p I)),
        # reused while a quadratic client's Hessian is the same array
        self.local_factor: tuple[np.ndarray, np.ndarray | None] | None = None
        # constraint_curvature: the rows of its active AL terms' curvature
        self.send_stiff = host.options.constraint_curvature_on(host.ns) and hasattr(
            host.solver, "stiff_rows"
        )
        self.stiff_sent: np.ndarray | None = None  # (the rows last sent: resent on change)

    def refuses(self) -> str:
        """Its own variables never travel; Newton needs exact (generalised) Hessians."""
        h = self.host
        if h.owned:
            return "it has its own variables"
        if self.newton and not hasattr(h.solver, "derivatives"):
            return f"its subproblem backend ({h.solver.name}) has no exact Hessians"
        return ""

    def start(self, w, directions=None, **request) -> dict:
        self.host.w_center = np.asarray(w, dtype=float).copy()
        if self.newton:
            return self._on_newton_w(w)
        if directions is not None:
            return self._on_curvature_w(w, directions)
        return self._on_gradient_w(w)

    def _count(self) -> None:
        stats = self.host.stats
        stats["derivative_evaluations"] = stats.get("derivative_evaluations", 0) + 1

    def _on_gradient_w(self, w):
        """Value and gradient of ``P_{i,k}`` at ``w`` (``d + 1`` floats)."""
        val, g = self.host._value_grad_P(np.asarray(w, dtype=float))
        self._count()
        return self._with_stiff(w, {"value": val, "grad": g})

    def _with_stiff(self, w, reply: dict) -> dict:
        """``reply`` with ``stiff``, the rows ``J_i`` of its augmented-Lagrangian terms'
        curvature ``J_i^T J_i`` at ``w`` (``constraint_curvature``), when they differ from
        the rows it sent last (the server keeps those: affine equalities' rows go once)."""
        if self.send_stiff:
            h = self.host
            J = h.solver.stiff_rows(np.asarray(w, dtype=float), [h.mu], [h.nu])
            last = self.stiff_sent
            if last is None or last.shape != J.shape or not np.array_equal(last, J):
                J.setflags(write=False)  # (shared, not copied, by state snapshots)
                reply["stiff"] = self.stiff_sent = J
        return reply

    def _on_curvature_w(self, w, directions, precondition=None):
        """Value, gradient and Hessian-vector products of ``P_{i,k}`` at ``w`` along the
        rows of ``directions`` (``(k + 1) d + 1`` floats). Exact from the Newton backend's
        GLM form (no ``d x d`` matrix, sparse data stays sparse); from a forward difference
        of the gradient for other backends.

        With ``precondition`` (a vector ``r``: ``local_directions``) also its local Newton
        direction ``z_i = (n (H_i + p I))^(-1) r`` (``d`` floats more), with ``H_i`` the
        Hessian of ``P_{i,k}``'s terms at ``w``, which never leaves the client (GIANT:
        Wang et al., NeurIPS 2018); a client whose backend has no exact Hessian, or whose
        shifted Hessian has no Cholesky factor, or whose data are scipy.sparse, sends
        none."""
        h = self.host
        w = np.asarray(w, dtype=float)
        V = np.asarray(directions, dtype=float).reshape(-1, w.size)
        p = h.prox_weight
        local = None
        if precondition is not None and self._local_hessian_ok():
            val, g, H_raw = h.solver.derivatives(w, [h.mu], [h.nu])
            d = w - h.w_center
            val, g = float(val) + 0.5 * p * float(d @ d), g + p * d
            HV = V @ H_raw + p * V
            local = self._local_direction(H_raw, np.asarray(precondition, dtype=float))
        elif hasattr(h.solver, "products"):
            val, g, HV = h.solver.products(w, [h.mu], [h.nu], V.T)
            d = w - h.w_center
            val, g = float(val) + 0.5 * p * float(d @ d), g + p * d
            HV = HV.T + p * V
        else:
            val, g = h._value_grad_P(w)
            step = 1e-7 * max(1.0, float(np.abs(w).max(initial=0.0)))
            HV = np.array([(h._value_grad_P(w + step * v)[1] - g) / step for v in V])
            HV = HV.reshape(V.shape)
        self._count()
        reply = {"value": val, "grad": g, "hvp": HV}
        if local is not None:
            reply["local_direction"] = local
        return self._with_stiff(w, reply)

    def _local_hessian_ok(self) -> bool:
        """Whether this client can form its local Hessian for a local direction: exact
        Hessians (the Newton backend) and dense data (scipy.sparse data stays sparse: no
        ``d x d`` product of it is formed)."""
        solver = self.host.solver
        if not hasattr(solver, "derivatives"):
            return False
        terms = getattr(getattr(solver, "obj", None), "terms", ())
        return not any(hasattr(t.A, "toarray") for t in terms)

    def _local_direction(self, H_raw: np.ndarray, r: np.ndarray) -> np.ndarray | None:
        """``(n (H_i + p I))^(-1) r`` with ``H_i`` = ``H_raw`` (shifted to positive definite
        on a non-convex model); None when no shift gives a factor."""
        h = self.host
        cached = self.local_factor
        if cached is None or cached[0] is not H_raw:
            M = H_raw * float(h.n_clients)
            M[np.diag_indices_from(M)] += h.n_clients * h.prox_weight
            cached = self.local_factor = (H_raw, shifted_cholesky(M, **SHIFT))
        if cached[1] is None or not np.all(np.isfinite(r)):
            return None
        return cholesky_solve(cached[1], r)

    def _on_newton_w(self, w):
        """Value, gradient and Hessian of ``P_{i,k}`` (eq. 11: the merit terms plus this
        party's share ``p ||w - w^k||^2 / 2`` of the proximal term) at ``w``; the Hessian
        only when it differs from the one last sent (the server keeps that one)."""
        h = self.host
        w = np.asarray(w, dtype=float)
        val, g, H_raw = h.solver.derivatives(w, [h.mu], [h.nu])
        p = h.prox_weight
        d = w - h.w_center
        val += 0.5 * p * float(d @ d)
        g += p * d
        self._count()
        reply = {"value": float(val), "grad": g}
        last = self.newton_H
        if last is not None and H_raw is last[0]:  # (a quadratic client's, unchanged)
            return reply
        H = H_raw.copy()
        H[np.diag_indices_from(H)] += p
        H.setflags(write=False)  # (shared, not copied, by state snapshots)
        if last is None or not np.array_equal(H, last[1]):
            reply["hessian"] = H
            last = (H_raw, H)
        self.newton_H = (H_raw, last[1])
        return reply


class NewtonClient(DerivativeClient):
    newton = True


NewtonInner.client_part = NewtonClient
QuasiNewtonInner.client_part = DerivativeClient
