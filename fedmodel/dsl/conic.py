"""Conic form of convex terms that have no smooth exact form (the cvxpy-backend path).

A DCP-convex objective term or constraint that contains atoms with no smooth or epigraph
form in fedmodel (``norm(A w - b, 2)`` in an objective, ``norm(x, 2) <= t`` with a
variable ``t``, ``lambda_max``, ``geo_mean``, ...) is rewritten with cvxpy's own
DCP-to-cone reduction (``Dcp2Cone``) into *cone constraints on affine expressions*

    E_j(x, s) in K_j,   K_j in {R_+, {0}, second-order, PSD, exponential and 3-d power cones}

over the model's variables ``x`` and auxiliary variables ``s`` created by the reduction
(owned by the party that wrote the term and hidden from ``res.solution``, like the epigraph
variables of :mod:`fedmodel.dsl.epigraph`). An objective term ``f(x)`` becomes an auxiliary
``t`` in the objective with the cone form of ``f(x) <= t``; a constraint ``g(x) <= 0``
becomes the cone form of itself. Both are exact: ``f(x) = min {t : (x, t, s) feasible}``.

The cone constraints are *hard* constraints of their party's subproblem, which the cvxpy
backend solves exactly (its conic duals ``lambda_j in K_j^*`` are the multipliers of the
KKT certificate, see :mod:`fedmodel.compiler.cones`). Every lifted constraint is written
here as ``E in K`` with the Lagrangian ``f - <lambda, E>``.

Examples
--------
>>> import cvxpy as cp
>>> x, t = cp.Variable(3), cp.Variable()
>>> cones, new_vars = lift(cp.norm(x - 1, 2) <= t)
>>> [cone_kind(c) for c in cones]
['soc', 'nonneg']
>>> len(new_vars)
1
"""

from __future__ import annotations

import cvxpy as cp
from cvxpy.constraints import (
    PSD,
    SOC,
    Equality,
    ExpCone,
    Inequality,
    NonNeg,
    NonPos,
    PowCone3D,
    Zero,
)

from fedmodel.expressions import substitute_constraint

#: cone constraint classes the certificate can measure (see cone_kind)
SUPPORTED = (Inequality, NonNeg, NonPos, Equality, Zero, SOC, PSD, ExpCone, PowCone3D)


def cone_kind(con: cp.constraints.constraint.Constraint) -> str:
    """``"nonneg"``, ``"zero"``, ``"soc"``, ``"psd"``, ``"exp"`` or ``"pow"`` for a supported
    constraint.

    Raises ``TypeError`` for other cone types (e.g. the n-dimensional power cone).
    """
    if isinstance(con, (Inequality, NonNeg, NonPos)):
        return "nonneg"
    if isinstance(con, (Equality, Zero)):
        return "zero"
    if isinstance(con, SOC):
        return "soc"
    if isinstance(con, PSD):
        return "psd"
    if isinstance(con, ExpCone):
        return "exp"
    if isinstance(con, PowCone3D):
        return "pow"
    raise TypeError(f"{type(con).__name__} cones are not supported")


def _flat(e: cp.Expression) -> cp.Expression:
    return cp.vec(e, order="F") if e.ndim else cp.reshape(e, (1,), order="F")


def cone_vector(con: cp.constraints.constraint.Constraint) -> cp.Expression:
    """The affine vector ``E`` with ``con`` meaning ``E in K`` (flattened column-major).

    ``lhs <= rhs``: ``rhs - lhs``; ``NonNeg(e)``: ``e``; ``NonPos(e)``: ``-e``;
    ``lhs == rhs``: ``lhs - rhs``; ``Zero(e)``: ``e``; ``SOC(t, X)``: ``(t, vec X)``;
    ``PSD(A)``: ``vec A``; ``ExpCone(x, y, z)`` and ``PowCone3D(x, y, z, alpha)``:
    ``(x, y, z)``.
    """
    if isinstance(con, Inequality):
        return _flat(con.args[1] - con.args[0])
    if isinstance(con, NonPos):
        return _flat(-con.args[0])
    if isinstance(con, Equality):
        return _flat(con.args[0] - con.args[1])
    if isinstance(con, (NonNeg, Zero, PSD)):
        return _flat(con.args[0])
    if isinstance(con, (SOC, ExpCone, PowCone3D)):
        return cp.hstack([_flat(a) for a in con.args[:3]])
    raise TypeError(f"{type(con).__name__} cones are not supported")


def lift(
    con: cp.constraints.constraint.Constraint,
) -> tuple[list[cp.constraints.constraint.Constraint], list[cp.Variable]]:
    """The cone form of a DCP constraint: cone constraints on affine expressions and the
    auxiliary variables cvxpy's ``Dcp2Cone`` reduction introduced. The last cone is the
    constraint itself with its atoms replaced by their auxiliaries (``g(x) <= 0`` as
    ``g~(x, s) <= 0``, the same shape): its multiplier is the constraint's.

    Raises ``TypeError`` when the reduction produces a cone the certificate cannot measure.
    """
    from cvxpy.reductions.dcp2cone.dcp2cone import Dcp2Cone

    known = {v.id for v in con.variables()}
    lifted, _ = Dcp2Cone(quad_obj=False).apply(cp.Problem(cp.Minimize(0), [con]))
    cones = list(lifted.constraints)
    # auxiliaries with attributes (symmetric, PSD, ...) become plain variables with those
    # attributes as cone constraints: the subproblems stack plain vectors
    plain: dict[int, cp.Variable] = {}
    extra: list = []
    for c in cones:
        for v in c.variables():
            if v.id in known or v.id in plain:
                continue
            flags = sorted(k for k, on in v.attributes.items() if on is True)
            if not flags:
                continue
            unknown = set(flags) - {"symmetric", "PSD", "nonneg", "nonpos"}
            if unknown:
                raise TypeError(f"the cone form needs a variable with attributes {sorted(unknown)}")
            V = cp.Variable(v.shape)
            plain[v.id] = V
            if "symmetric" in flags or "PSD" in flags:
                extra.append(cp.upper_tri(V) == cp.upper_tri(V.T))
            if "PSD" in flags:
                extra.append(PSD(V))
            if "nonneg" in flags:
                extra.append(NonNeg(V))
            if "nonpos" in flags:
                extra.append(NonPos(V))
    if plain:  # (the constraint itself stays last, after its pieces: see the docstring)
        cones = [substitute_constraint(c, plain) for c in cones]
        cones = cones[:-1] + extra + cones[-1:]
    for c in cones:
        cone_kind(c)  # raises for unsupported cones
        for a in c.args:
            if not a.is_affine():  # pragma: no cover - Dcp2Cone's contract
                raise TypeError(f"the cone form of {con} has a non-affine argument {a}")
    new_vars: list[cp.Variable] = []
    seen: set[int] = set()
    for c in cones:
        for v in c.variables():
            if v.id not in known and v.id not in seen:
                seen.add(v.id)
                new_vars.append(v)
    return cones, new_vars
