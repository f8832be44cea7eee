"""The exact proximal step of a party in prox-al's ``inner_solver="exact-admm"``.

Each round of the exact consensus ADMM
(:mod:`fedmodel.algorithms.proxal.exact_admm`) asks every party for the exact minimiser of

    P_{i,k}(x) + (sigma / 2) ||x_shared - c||^2

over its whole view ``x = (shared, own variables)``: its objective terms, the
augmented-Lagrangian terms of the constraints the user wrote (with the multipliers of
Algorithm 1), its share of the proximal term, and the ADMM coupling about the centre
``c``. The backend is chosen here (:func:`exact_prox_solver`):

* a party whose terms are non-smooth or conic -- the epigraph pieces of ``pos``, ``abs``,
  ``norm1``, ... (``internal`` constraints of the compiler), cone constraints, or terms
  with a restricted domain (``kl_div``, ``entr``, ``log``: a gradient method may step
  outside it) -- gets the cvxpy backend compiled once (DPP; Clarabel) with the epigraph
  pieces as **hard** constraints (``CvxpySolver(hard_internal=True)``): the non-smooth
  term is then minimised exactly, as the user wrote it, and the pieces' multipliers are
  the solve's duals (written to the merit problem's ``mu``/``nu`` rows of the pieces, where
  the certificate reads them) instead of outer-loop augmented-Lagrangian multipliers;
* a party whose program is only bounds and norm balls on whole shared variables (no
  objective term, no ``h``: the server's step of a model whose server holds only such
  sets) gets their projection in closed form, with its multipliers
  (:class:`~fedmodel.subproblems.projection.ProjectionSolver`), unless ``solver="cvxpy"``;
* any other party keeps its usual backend (:func:`~fedmodel.subproblems.select.make_solver`:
  Newton, L-BFGS or the closed-form prox), asked for a tight tolerance.
"""

from __future__ import annotations

import numpy as np

from fedmodel.compiler.glm import NotRecognised
from fedmodel.expressions import nodes
from fedmodel.subproblems.cvxpy_backend import CLARABEL_FLOOR, CvxpySolver
from fedmodel.subproblems.merit import MeritProblem
from fedmodel.subproblems.multipliers import MultiplierSolver
from fedmodel.subproblems.projection import ProjectionSolver
from fedmodel.subproblems.select import make_solver


def needs_conic_step(problem: MeritProblem) -> str:
    """Why the exact step of ``problem`` goes to the hard-constraint cvxpy backend ("" when
    its smooth backend solves it exactly)."""
    for prog in problem.programs:
        if prog.cones:
            return "cone constraints"
        if any(c.internal for c in prog.constraints):
            return "epigraph pieces of non-smooth terms"
        if prog.restricted_domain:
            return "terms with a restricted domain"
    return ""


#: the user's constraints are hard constraints of the exact steps too (their multipliers
#: the steps' duals, as for the epigraph pieces), so that one consensus ADMM solves the
#: model and the outer loop has no multiplier to update: with augmented-Lagrangian terms
#: (beta = 100) the outer loop needed 12 iterations on bpdn and kl-simplex
HARD_CONSTRAINTS = True
#: the exact steps call Clarabel on cvxpy's compiled data (CvxpySolver(direct=True))
DIRECT = True


#: atoms whose cone form is the exponential cone (one cone per data row): an exact step with
#: them goes through an interior-point solve of that size (Adult Neyman-Pearson's clients,
#: logistic losses and a logistic constraint over ~1,600 rows each: about 3 s per round of
#: 20 clients, where their Newton backends take milliseconds)
EXP_CONE_ATOMS = frozenset(
    {"exp", "log", "logistic", "log_sum_exp", "entr", "kl_div", "rel_entr", "log1p", "xexp"}
)


#: the smallest Clarabel tolerance of an exact step with exponential cones: exact-admm's
#: last inner solves at a tight eps ask their steps for residuals near 1e-9
#: (``step_tolerances``), whose hundredth is below :data:`CLARABEL_FLOOR`, and on an
#: exponential cone Clarabel's point at 1e-10 was not accurate enough for them (the
#: maximum-entropy model, entr on the server's simplex, at eps = 1e-6: the consensus stalled
#: with the certificate's scaled feasibility at 4.9e-6; at 1e-11, 1e-12 and 1e-13 the same
#: run certified). Quadratic and second-order cone steps keep the floor: on LAD over 20
#: clients a lower one took more rounds at eps = 1e-6 (526 against 377)
EXP_CONE_FLOOR = 1e-11


def exp_cone_terms(program) -> bool:
    """Whether a party's terms or constraints contain an :data:`EXP_CONE_ATOMS` atom."""
    exprs = [t.expr for t in program.objective] + [c.expr for c in program.constraints]
    return any(type(node).__name__ in EXP_CONE_ATOMS for e in exprs for node in nodes(e))


def has_constraints(problem: MeritProblem) -> bool:
    """Whether a party of ``problem`` has inequality or equality constraints."""
    return any(prog.ineq or prog.eq for prog in problem.programs)


def exact_prox_solver(problem: MeritProblem, solver: str = "auto"):
    """The backend of a party's exact proximal step (see the module docstring);
    ``solver`` is the method's ``solver`` option (``"cvxpy"`` forces cvxpy)."""
    hard = HARD_CONSTRAINTS and has_constraints(problem)
    if hard and solver != "cvxpy":
        projection = ProjectionSolver.recognise(problem, lambda: clarabel_step(problem, False))
        if projection is not None:
            return projection
    conic = needs_conic_step(problem) or solver == "cvxpy"
    exp_cones = any(exp_cone_terms(prog) for prog in problem.programs)
    if hard and exp_cones and not conic and solver in ("auto", "newton"):
        # smooth exponential-cone terms in GLM form (logistic ...): the method of
        # multipliers on Newton (the demo's Neyman-Pearson clients, exact-admm: 0.18 s
        # against 1.8 s through Clarabel, 48 rounds against 50). Quadratic and second-order
        # cone steps stay with Clarabel (markowitz: 129 rounds, against 176 with multipliers)
        try:
            return MultiplierSolver(problem)
        except NotRecognised:
            pass
    if conic or hard:
        return clarabel_step(problem, exp_cones)
    return make_solver(problem, solver)


def clarabel_step(problem: MeritProblem, exp_cones: bool) -> CvxpySolver:
    """The cvxpy backend of an exact step (hard constraints, Clarabel on the compiled data;
    ``exp_cones``: the step has exponential-cone terms, :data:`EXP_CONE_FLOOR`)."""
    return CvxpySolver(
        problem,
        hard_internal=True,
        hard_constraints=HARD_CONSTRAINTS,
        direct=DIRECT,
        floor=EXP_CONE_FLOOR if exp_cones else CLARABEL_FLOOR,
    )


#: the masks of a program without constraints (one pair for all: nothing can change an
#: array without elements)
_NO_ROWS = (np.zeros(0, dtype=bool), np.zeros(0, dtype=bool))


def internal_rows(problem: MeritProblem) -> tuple[np.ndarray, np.ndarray]:
    """Masks of the first program's inequality and equality rows that are hard in the
    exact steps (the epigraph pieces, ``internal``, and with :data:`HARD_CONSTRAINTS` every
    row): their multipliers come from the exact steps' duals."""
    prog = problem.programs[0]
    if not prog.constraints:
        return _NO_ROWS
    ineq = [np.full(c.size, c.internal or HARD_CONSTRAINTS) for c in prog.ineq]
    eq = [np.full(c.size, c.internal or HARD_CONSTRAINTS) for c in prog.eq]
    return (
        np.concatenate(ineq).astype(bool) if ineq else np.zeros(0, dtype=bool),
        np.concatenate(eq).astype(bool) if eq else np.zeros(0, dtype=bool),
    )
