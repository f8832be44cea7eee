"""Compile smooth cvxpy expressions into fast numpy value / gradient functions.

A cvxpy expression tree is compiled once into a *tape*: a topologically ordered list of
small numpy closures.  Evaluating the compiled function runs a forward pass that stores
every intermediate value, and (for gradients) a reverse pass that propagates
vector-Jacobian products back to a flat vector ``x`` that stacks all model variables
(see :class:`VariableLayout`).  No cvxpy code runs at evaluation time, constant data is
converted once at compile time (``scipy.sparse`` constants stay sparse inside matrix
products), and :class:`cvxpy.Parameter` values are read at every evaluation.

The compiler only cares about *differentiability*, not curvature: any expression made
of the supported smooth atoms compiles, including nonconvex ones such as a difference
of two logistic losses.  Atoms that are not (continuously) differentiable -- ``abs``,
``maximum``, ``norm1``, ``norm2`` ... -- raise :class:`NotSmoothError`.

Example
-------
>>> import cvxpy as cp, numpy as np
>>> w = cp.Variable(3)
>>> A = np.arange(6.0).reshape(2, 3)
>>> layout = VariableLayout([w])
>>> f = compile_smooth(cp.sum(cp.logistic(A @ w)), layout)
>>> val, grad = f.value_and_grad(np.zeros(3))
>>> round(val, 6), grad.shape
(1.386294, (3,))

The implementation is split along its seams: :mod:`~fedmodel.compiler.layout` (the flat
vector ``x``), :mod:`~fedmodel.compiler.atom_rules` (forward/backward rule of each atom,
and the reasons non-smooth atoms are refused), :mod:`~fedmodel.compiler.evaluator` (the
tape, :class:`SmoothFunction`, :func:`compile_smooth`) and
:mod:`~fedmodel.compiler.smoothness` (:func:`check_smooth`, :func:`smooth_atoms`). This
module gathers the public names.
"""

from __future__ import annotations

from fedmodel.compiler.atom_rules import NotSmoothError
from fedmodel.compiler.evaluator import SmoothFunction, compile_smooth
from fedmodel.compiler.layout import VariableLayout
from fedmodel.compiler.smoothness import check_smooth, smooth_atoms

__all__ = [
    "NotSmoothError",
    "SmoothFunction",
    "VariableLayout",
    "check_smooth",
    "compile_smooth",
    "smooth_atoms",
]
