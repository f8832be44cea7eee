"""Where ``solve(method=...)`` of a vertical model goes.

Both the DSL form (a :class:`fedmodel.Model` whose clients publish their partial scores,
recognised by :mod:`.recognize`) and the ready-made builder
(:func:`fedmodel.models.fair_vfl`) end here with a
:class:`~fedmodel.algorithms.vfl.problem.VerticalProblem` and ``eps``:

* ``"fair-vfl"``, ``"fedbcd"`` (the family's federated methods, ``MethodSpec(vertical=True)``);
* ``"centralized"``, ``"cprox-al"`` (and ``"vfl-reference"``): the family's certified pooled
  reference (:mod:`.reference`; the DEO-constrained model, local KKT certificate; with
  ``constrained=False`` the plain regularised logistic regression);
* any other method: an :class:`~fedmodel.errors.UnsupportedError` listing these.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fedmodel.algorithms.options import build_options
from fedmodel.algorithms.protocol import MethodSpec
from fedmodel.algorithms.vfl.problem import VerticalProblem
from fedmodel.errors import UnsupportedError
from fedmodel.result import Result

REFERENCE_METHODS = ("centralized", "cprox-al", "vfl-reference")
VERTICAL_METHODS = ("fair-vfl", "fedbcd", *REFERENCE_METHODS)


#: the registry's lookup of a method by name (handed in by the registry, which this family
#: does not import: the registry imports the family)
SpecLookup = Callable[[str], MethodSpec]


def solve_problem(
    problem: VerticalProblem,
    eps: float,
    method: str,
    options: dict[str, Any],
    method_spec: SpecLookup,
) -> Result:
    """Solve a vertical problem with ``method`` (see the module docstring); ``method_spec``
    is the registry's lookup (:func:`fedmodel.algorithms.registry.method_spec`)."""
    options = dict(options)
    if method in REFERENCE_METHODS:
        from fedmodel.algorithms.vfl.reference import solve_constrained, solve_unconstrained

        constrained = options.pop("constrained", True)
        if constrained:
            options.setdefault("eps", eps)
            res = solve_constrained(problem, **options)
        else:
            res = solve_unconstrained(problem, **options)
        res.method = method
        return res
    spec = method_spec(method)
    if not spec.vertical:
        raise UnsupportedError(
            f"method='{method}' solves horizontal DSL models (shared variables); a vertical "
            f"model (parties owning column blocks and publishing partial scores) takes "
            f"{VERTICAL_METHODS}"
        )
    if method == "fair-vfl":
        options.setdefault("eps", eps)
    opts = build_options(spec.options, options, method)
    return spec.runner(problem, opts, method)


def solve_published(model, method: str, options: dict[str, Any], method_spec: SpecLookup) -> Result:
    """``model.solve(method, **options)`` for a DSL model with published expressions: the
    compiler's ownership checks, the recogniser, then :func:`solve_problem`; the parties'
    blocks are written to their variables' ``.value`` and ``res.solution`` is keyed by the
    variables' names when the run reveals them."""
    from fedmodel.algorithms.vfl.recognize import recognize

    if method not in VERTICAL_METHODS:
        method_spec(method)  # an unknown name: the registry's error
        raise UnsupportedError(
            f"method='{method}' does not take published expressions (client.publish: a "
            f"vertical model); methods that do: {VERTICAL_METHODS}"
        )
    if options.get("constraint", "loss") != "loss":
        raise UnsupportedError(
            f"constraint={options['constraint']!r}: this DSL model constrains the loss-based "
            "DEO it is written with (fm.deo); the rate-based equal opportunity "
            "(constraint='tpr') is an option of fm.models.fair_vfl(...).solve(...) and of "
            "fedmodel.algorithms.vfl.solve_vertical"
        )
    problem, eps = recognize(model)
    res = solve_problem(problem, eps, method, options, method_spec)
    owned = {c.name: c.owned_variables[0] for c in model.clients}  # one each (recognised)
    solution = {}
    for name in problem.party_names:  # keyed by the user's variable names, as for every model
        value = res.solution.get(f"theta_{name}")
        if value is not None:
            owned[name].value = value
            solution[owned[name].name()] = value
    res.solution = solution
    return res
