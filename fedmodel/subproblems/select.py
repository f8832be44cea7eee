"""Choose a backend for a merit problem.

``"auto"`` picks, in order:

1. the closed form when the problem has no party terms (the server's averaging + prox);
2. Newton with exact (generalised) Hessians when every term is of GLM form (sums of
   logistic/exp/square/huber of affine maps, quadratic forms, affine terms) and ``h`` is
   smooth -- the usual case for client subproblems;
3. an exact box-constrained QP when the terms are quadratic with equality constraints only
   and ``h`` is bounds and sums of squares (:mod:`fedmodel.subproblems.box_qp`);
4. L-BFGS-B on values and gradients (any smooth term; box and l1 parts of ``h`` exactly);
5. cvxpy (convex) or accelerated proximal gradient (non-convex) when ``h`` has a group norm.

A program with cone constraints (a term with no smooth form, :mod:`fedmodel.dsl.conic`)
always takes cvxpy: the conic path.

``solver=`` overrides the choice; ``"newton-cg"`` (never picked by ``"auto"``) is Newton
with conjugate-gradient steps on Hessian-vector products, for GLM-form problems with too
many variables for a dense Hessian (:mod:`fedmodel.subproblems.newton_cg`).
"""

from __future__ import annotations

from itertools import repeat
from operator import attrgetter, is_, itemgetter

from fedmodel.compiler.glm import NotRecognised
from fedmodel.errors import UnsupportedError
from fedmodel.subproblems.box_qp import BoxQuadraticSolver
from fedmodel.subproblems.closed_form import ProxSolver
from fedmodel.subproblems.cvxpy_backend import CvxpySolver
from fedmodel.subproblems.merit import MeritProblem
from fedmodel.subproblems.newton import NewtonSolver
from fedmodel.subproblems.proximal_gradient import ProximalGradientSolver
from fedmodel.subproblems.quasi_newton import QuasiNewtonSolver

BACKENDS = ("auto", "newton", "newton-cg", "lbfgs", "cvxpy")


def make_solver(problem: MeritProblem, solver: str = "auto", direct: bool = False):
    """Return a backend object with ``solve(x0, tol, max_iter) -> SolveReport``; ``direct``:
    a cvxpy backend calls Clarabel on the compiled data (``CvxpySolver(direct=True)``)."""
    if solver not in BACKENDS:
        raise UnsupportedError(f"unknown subproblem solver {solver!r}; choose one of {BACKENDS}")
    if problem.has_cones:
        if solver not in ("auto", "cvxpy"):
            where = [f"{p.name}: {p.cones[0].label}" for p in problem.programs if p.cones]
            raise UnsupportedError(
                f"subproblem solver {solver!r} cannot take cone constraints ({', '.join(where)}: "
                "terms with no smooth form); they are solved exactly by solver='cvxpy' "
                "(the default 'auto' picks it)"
            )
        return CvxpySolver(problem, direct=direct)
    if not problem.has_smooth_terms:
        return ProxSolver(problem)
    # a group norm, a norm ball or a matrix norm in h: no bounds/splitting form for L-BFGS-B
    has_group_norm = any(p.couples for p in problem.regularizer.pieces)
    if solver == "cvxpy":
        return CvxpySolver(problem, direct=direct)
    if solver == "newton-cg":  # (never chosen by "auto": the large pooled problems' backend)
        from fedmodel.subproblems.newton_cg import NewtonCGSolver

        try:
            return NewtonCGSolver(problem)
        except NotRecognised as exc:
            raise UnsupportedError(
                f"the Newton-CG backend needs GLM-form terms and a smooth h ({exc}); use "
                "solver='lbfgs' or 'cvxpy'"
            ) from exc
    if solver in ("auto", "newton"):
        try:
            return NewtonSolver(problem)
        except NotRecognised as exc:
            try:  # (quadratic terms over a box: one exact box-constrained QP)
                return BoxQuadraticSolver(problem)
            except NotRecognised:
                pass
            if solver == "newton":
                raise UnsupportedError(
                    f"the Newton backend needs GLM-form terms and a smooth h ({exc}); use "
                    "solver='lbfgs' or 'cvxpy'"
                ) from exc
    if has_group_norm:
        if any(p.nonconvex for p in problem.programs):
            return ProximalGradientSolver(problem)
        return CvxpySolver(problem, direct=direct)
    return QuasiNewtonSolver(problem)


#: a lazy solver's backend (None while not built) and initial state
_BUILT, _INITIAL = attrgetter("_backend"), attrgetter("_initial")


class LazySolver:
    """A subproblem backend built at its first use.

    A party whose steps run batched with other parties' (a cohort's Newton solve) never
    uses its own backend unless it leaves the batches; with thousands of parties building
    them is a share of the set-up worth skipping. The owner knows which backend it would
    build (``build``, which must not fail) and the state such a backend reports before its
    first use (``initial_state``).

    Every attribute is the built backend's, except its state: before the backend is
    built :meth:`get_state` is ``initial_state``, what the backend would report, and
    :meth:`set_state` builds it and restores the state into it, as into a backend built
    eagerly: runs repeat with the backend built eagerly or lazily, checkpoints included.

    Parameters
    ----------
    build : callable
        ``build() -> backend``.
    initial_state : dict or None
        The backend's ``get_state()`` before its first use (read, never changed: lazy
        solvers may share one).
    configure : callable, optional
        Called with the backend right after it is built (the owner's settings).

    Examples
    --------
    >>> import numpy as np, cvxpy as cp
    >>> import fedmodel as fm
    >>> from fedmodel.subproblems.merit import MeritProblem
    >>> model = fm.Model()
    >>> w = model.variable(2, name="w")
    >>> site = model.client("a")
    >>> site.minimize(cp.sum_squares(w - site.data(np.ones(2), name="y")))
    >>> problem = MeritProblem([model.compile().clients[0]], 1.0)
    >>> lazy = LazySolver(lambda: NewtonSolver(problem), NewtonSolver.initial_state())
    >>> lazy.built is None, lazy.get_state() == NewtonSolver(problem).get_state()
    (True, True)
    >>> lazy.name, lazy.built is None
    ('newton', False)
    """

    def __init__(self, build, initial_state: dict | None, configure=None):
        self._build, self._initial, self._configure = build, initial_state, configure
        self._backend = None

    @property
    def built(self):
        """The backend, or None while it is not built."""
        return self._backend

    def backend(self):
        """The backend (built now if it was not)."""
        if self._backend is None:
            backend = self._build()
            if self._configure is not None:
                self._configure(backend)
            self._backend = backend
        return self._backend

    @property
    def verified(self) -> bool:
        """The backend's ``verified`` (False before it is built, as a new backend's)."""
        return self._backend is not None and bool(getattr(self._backend, "verified", False))

    def get_state(self) -> dict | None:
        if self._backend is None:
            return None if self._initial is None else dict(self._initial)
        getter = getattr(self._backend, "get_state", None)
        return None if getter is None else getter()

    @classmethod
    def state_columns(cls, solvers: list[LazySolver]) -> dict[str, list] | None:
        """The :meth:`get_state` of each of ``solvers``, uncopied, as columns (key -> a
        list with each solver's value) when none is built and their initial states are
        dicts of the same keys (a mark reads thousands at once); else None (each is read by
        :meth:`get_state`)."""
        n = len(solvers)
        if not solvers or list(map(_BUILT, solvers)).count(None) != n:
            return None
        initials = list(map(_INITIAL, solvers))
        first = initials[0]
        if type(first) is dict and all(map(is_, initials, repeat(first))):
            # (one initial state shared by all: its values, each repeated)
            return {key: [value] * n for key, value in first.items()}
        if set(map(type, initials)) != {dict} or len(set(map(tuple, initials))) != 1:
            return None
        return {key: list(map(itemgetter(key), initials)) for key in initials[0]}

    def set_state(self, state: dict) -> None:
        backend = self.backend()
        if hasattr(backend, "set_state"):
            backend.set_state(state)

    def __getattr__(self, name: str):
        if name.startswith("__") or name in ("_backend", "_build", "_initial", "_configure"):
            raise AttributeError(name)
        return getattr(self.backend(), name)
