"""The inner-solver protocol of prox-al: what one inner solver of Algorithm 1 declares and
does, so that the outer loop (:mod:`~fedmodel.algorithms.proxal.server`,
:mod:`~fedmodel.algorithms.proxal.client`) holds exactly one of them.

Algorithm 1 asks its inner solver, at outer iteration ``k``, for a point ``w`` with
``dist(0, d l_k(w)) <= tau_k`` (seed 000 eqs. 10-11). An inner solver is one module with

* a **server part**, a subclass of :class:`InnerSolver`: its declarations (``name``,
  ``defaults``, ``start_request``/``start_reply``, its own round kinds ``messages``),
  ``accepts(compiled, options, proximal) -> reason or None`` (as a cvxpy reduction's
  ``accepts``), and, once built on the server half (the *host*), its own declared state
  (``state_fields``: only the running route's state is built and checkpointed, as an optax
  transformation's state) and its rounds (:meth:`InnerSolver.solve`);
* a **client part**, a subclass of :class:`InnerClient`: the handlers ``_on_<kind>`` of its
  round kinds and its own state, built on the client half when its route runs;
* one line in :data:`fedmodel.algorithms.proxal.routes.ROUTES`.

The messages that start an inner solve (``start``, ``outer``, ``outer_aa``) carry the
route's ``start_request`` fields and their replies its ``start_reply`` fields
(:func:`~fedmodel.algorithms.proxal.messages.route_table`); the ``start`` after a
fallback also names the route (``inner``).

Examples
--------
>>> import numpy as np
>>> out = InnerOutcome(np.zeros(2), iterations=3, bound=1e-4, satisfied=True,
...                    server_residual=0.0)
>>> out.satisfied, out.timed_out
(True, False)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from fedmodel.algorithms.protocol import DeclaredState, StepReport
from fedmodel.runtime.schema import Field, MessageSpec


@dataclass
class InnerOutcome:
    """Result of one inner solve (Algorithm 2, or Newton with its measured gradient)."""

    w: np.ndarray
    iterations: int
    bound: float  # eps_{t+1} + sum_i eps~_i: bounds dist_inf(0, d l_k(w)) (Theorem 4.1)
    satisfied: bool
    server_residual: float
    timed_out: bool = False
    stalled: bool = False
    gradient: np.ndarray | None = None  # grad l_k(w), measured (Newton)
    certificate: tuple[str, dict] | None = None  # a Farkas certificate found on the way
    certified: bool = False  # the KKT certificate held at w on the way (the run stops)
    floor: bool = False  # ended short of tau at its rounding floor (the outer loop goes on)


class InnerSolver(DeclaredState):
    """The server part of one inner solver (see the module docstring).

    Parameters
    ----------
    host : ProxALServer
        The server half running Algorithm 1: its iterate ``x``, multipliers, program and
        options, read by the rounds.
    """

    #: the value of ``inner_solver`` that names it
    name: ClassVar[str] = ""
    #: adaptive defaults it sets when it is the route that runs (options the user gave kept)
    defaults: ClassVar[dict[str, Any]] = {}
    #: the fields it adds to the requests that start an inner solve
    start_request: ClassVar[dict[str, Field]] = {}
    #: the fields of the replies to them (the start of its next inner solve)
    start_reply: ClassVar[dict[str, Field]] = {}
    #: its own round kinds
    messages: ClassVar[tuple[MessageSpec, ...]] = ()
    #: the fields it adds to the certificate's ``evaluate`` requests
    #: (:meth:`evaluate_request`)
    evaluate_fields: ClassVar[dict[str, Field]] = {}
    #: the client part (its handlers and state), built on each client when it runs
    client_part: ClassVar[type[InnerClient] | None] = None
    #: a client may refuse it at the start (the run then falls back to the next route)
    probes: ClassVar[bool] = False
    #: ``inner_solver="auto"`` may take it
    auto: ClassVar[bool] = True
    #: its rounds measure test (8)'s feasibility half (the ``outer`` reply carries it)
    measures_feasibility: ClassVar[bool] = False
    #: its rounds may go to a sample of the clients or proceed without late ones (options
    #: ``participation``, ``quorum``)
    samples: ClassVar[bool] = False
    #: it runs with the parameters in the objective's units
    #: (:meth:`~fedmodel.algorithms.proxal.server.ProxALServer.take_objective_units`)
    objective_units: ClassVar[bool] = True
    #: test (8) reads an inner solve cut short (max_inner, a deadline) by its measured
    #: bound, not by tau_k, which it did not meet; False: (8) only asks for the route's own
    #: check (:meth:`verify_stop`), which reads the certificate at the iterate
    cut_short_bound: ClassVar[bool] = True

    # -- declarations read before a run ----------------------------------------------------
    @classmethod
    def accepts(cls, compiled, options, proximal: bool) -> str | None:
        """Why it cannot run on ``compiled`` with ``options`` (None: it can)."""
        return None

    @classmethod
    def suits(cls, compiled, options, proximal: bool) -> str | None:
        """Why ``"auto"`` leaves it to a later route of the table although it accepts
        (None: ``"auto"`` takes it)."""
        return None

    @classmethod
    def note(cls, compiled, options, proximal: bool) -> str:
        """Why ``"auto"`` took it (``res.extra["inner_solver_note"]``; "" when it says
        nothing)."""
        return ""

    @classmethod
    def dims(cls, compiled, options) -> dict[str, int]:
        """Dimensions of its messages beyond the program's and the options' (e.g. the most
        curvature directions a round carries on this model)."""
        return {}

    @classmethod
    def unused(cls, compiled, options) -> set[str]:
        """The optional fields of its messages this run never sends (e.g. the Anderson
        fields when ``anderson = 0``): left out of the run's table, so that the table is
        what the run sends and a reply carrying one is refused."""
        return set()

    # -- the rounds ------------------------------------------------------------------------
    def __init__(self, host):
        self.host = host

    def check(self) -> None:
        """The server's own check before the first round (raise
        :class:`~fedmodel.compiler.glm.NotRecognised`: the run falls back)."""

    def request(self, move: np.ndarray | None = None) -> dict:
        """The fields it adds to a request that starts an inner solve at the host's ``x``
        (``move``: the last outer step)."""
        return {}

    def take_start(self, replies) -> None:
        """Take the clients' replies to a request that started an inner solve."""

    def evaluate_request(self) -> dict:
        """What it adds to an ``evaluate`` request now (fields of :attr:`evaluate_fields`)."""
        return {}

    def collect(self, runtime, kind: str, payload: dict) -> dict:
        """One round of its messages: the replies as the server knows them (the host's
        :meth:`~fedmodel.algorithms.proxal.server.ProxALServer.collect`: sums under
        secure aggregation)."""
        return self.host.collect(runtime, kind, payload)

    def solve(self, runtime, tau: float, deadline: float | None) -> InnerOutcome:
        """One inner solve from the host's ``x`` (``w^k``) to ``tau``."""
        raise NotImplementedError(f"{type(self).__name__} does not define this abstract method")

    # -- what Algorithm 1 asks of it (defaults: the plain outer loop) ----------------------
    def configure(self) -> None:
        """Set what it changes on the host when it becomes the route (and after a restore)."""

    def hard_rows(self) -> tuple[Any, Any]:
        """The constraint rows whose multipliers its steps set (kept by the update)."""
        return False, False

    def farkas_point(self, w: np.ndarray) -> np.ndarray:
        """The point of this client's view its multipliers belong to (the Farkas
        certificate's, :mod:`~fedmodel.certificate.infeasibility`): ``w`` with its own block."""
        return self.host._local(np.asarray(w, dtype=float), self.host.theta_at_w)

    def stalled(self, k: int, outcome: InnerOutcome, tau: float) -> StepReport:
        """The report of an inner solve that stalled (status ``"stalled"``, with
        :meth:`stall_message`)."""
        return StepReport(
            info={"inner_iterations": outcome.iterations, "inner_bound": outcome.bound},
            stop="stalled",
            message=self.stall_message(k, outcome, tau),
        )

    def stall_message(self, k: int, outcome: InnerOutcome, tau: float) -> str:
        """Why the inner solve at outer iteration ``k`` stalled, and what to try."""
        return (
            f"the {self.name} inner solver stalled at outer iteration {k} "
            f"(bound {outcome.bound:.3g}, target tau_k = {tau:.3g})"
        )

    def verify_stop(self, runtime) -> bool:
        """Test (8) held: whether to stop (a route may check the certificate first)."""
        return True

    def near_stop(self, outcome: InnerOutcome, dw: float) -> bool:
        """Test (8) failed: whether to evaluate the certificate anyway."""
        return False

    def extra(self) -> dict:
        """Its fields of ``res.extra``."""
        return {}


class InnerClient(DeclaredState):
    """The client part of one inner solver: a handler ``_on_<kind>`` per round kind of its
    route, its own declared state, and :meth:`start`, the reply to a request that starts
    an inner solve.

    Parameters
    ----------
    host : ProxALClient
        The client half (its multipliers, centre, subproblem backend, options).
    """

    def __init__(self, host):
        self.host = host

    def refuses(self) -> str:
        """Why this client cannot take the route ("" when it can; asked at the start of a
        route that ``probes``)."""
        return ""

    def start(self, w: np.ndarray, **request) -> dict:
        """Set ``w`` as the centre of ``P_{i,k}`` and return the route's start reply."""
        raise NotImplementedError(f"{type(self).__name__} does not define this abstract method")

    def hard_rows(self) -> tuple[Any, Any]:
        """The constraint rows whose multipliers its steps set (kept by the update)."""
        return False, False

    def farkas_point(self, w: np.ndarray) -> np.ndarray:
        """The point of this client's view its multipliers belong to (the Farkas
        certificate's, :mod:`~fedmodel.certificate.infeasibility`): ``w`` with its own block."""
        return self.host._local(np.asarray(w, dtype=float), self.host.theta_at_w)

    def before_evaluation(self, **request) -> None:
        """Act on the fields of :attr:`InnerSolver.evaluate_fields` of an ``evaluate``
        request, before the evaluation (none by default)."""
