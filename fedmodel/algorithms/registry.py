"""Dispatch ``model.solve(method=...)`` to the methods.

Every method has one line in :data:`FAMILIES` (its name and the family package that defines
it); the family's ``METHODS`` dict maps the name to a :class:`MethodSpec`: its options
dataclass and a runner ``run(compiled, options, method) -> Result``. Families are imported
on first use; they import :class:`MethodSpec` from :mod:`~fedmodel.algorithms.protocol`, not
this module, so that no family imports the registry that imports it.
"""

from __future__ import annotations

import time
from typing import Any

__all__ = ["FAMILIES", "MODEL_FAMILIES", "MethodSpec", "method_spec", "solve_model"]

from fedmodel.algorithms.options import SOLVE_STARTED, build_options
from fedmodel.algorithms.protocol import MethodSpec
from fedmodel.errors import ModelError, UnsupportedError
from fedmodel.runtime.blas import blas_threads
from fedmodel.runtime.heap import settled_heap

# One line per method: its name and the family package whose ``METHODS`` dict holds its
# :class:`MethodSpec`. A new method is a family folder (or a new entry in one) and a line here.
FAMILIES: dict[str, str] = {
    "prox-al": "fedmodel.algorithms.proxal",
    "admm": "fedmodel.algorithms.proxal",
    "cprox-al": "fedmodel.algorithms.centralized",
    "centralized": "fedmodel.algorithms.centralized",
    "dald-cc": "fedmodel.algorithms.dald",
    "dald-dc": "fedmodel.algorithms.dald",
    "dagd": "fedmodel.algorithms.dald",
    "fedavg": "fedmodel.algorithms.baselines",
    "fedprox": "fedmodel.algorithms.baselines",
    "dgd": "fedmodel.algorithms.baselines",
    "fair-vfl": "fedmodel.algorithms.vfl",
    "fedbcd": "fedmodel.algorithms.vfl",
    "ssca": "fedmodel.algorithms.ssca",
    "fedsgd": "fedmodel.algorithms.ssca",
    "fedavg-sgd": "fedmodel.algorithms.ssca",
    "sgd-m": "fedmodel.algorithms.ssca",
    "vertical-sgd": "fedmodel.algorithms.ssca",
    "vertical-sgd-m": "fedmodel.algorithms.ssca",
}

#: Models that are not horizontal DSL models (shared variables), and the family package
#: that solves them with its ``solve_model(model, method, options, method_spec)`` (this
#: module's lookup handed in: a family never imports the registry), imported on first use
#: like the families above: a vertical model, whose clients publish their partial scores
#: (``client.publish``, seed 002).
MODEL_FAMILIES: dict[str, str] = {"vertical": "fedmodel.algorithms.vfl"}


def model_kind(model) -> str:
    """``"vertical"`` for a model with published expressions, else ``"horizontal"``."""
    return "vertical" if getattr(model, "publications", ()) else "horizontal"


# Methods registered at run time (plug-ins, tests): name -> spec.
_REGISTERED: dict[str, MethodSpec] = {}


def method_spec(name: str) -> MethodSpec:
    """The :class:`MethodSpec` of method ``name`` (imports its family on first use)."""
    if name in _REGISTERED:
        return _REGISTERED[name]
    if name not in FAMILIES:
        raise ModelError(f"unknown method {name!r}; choose one of {tuple(available_methods())}")
    import importlib

    return importlib.import_module(FAMILIES[name]).METHODS[name]


def available_methods() -> list[str]:
    """Every method name, registered ones last."""
    return list(FAMILIES) + [m for m in _REGISTERED if m not in FAMILIES]


def all_methods() -> dict[str, MethodSpec]:
    """Name -> spec of every method (imports every family)."""
    return {name: method_spec(name) for name in available_methods()}


def register_method(name: str, spec: MethodSpec) -> None:
    """Add a method at run time (a plug-in outside the package); built-in methods are lines
    of :data:`FAMILIES`."""
    _REGISTERED[name] = spec


def describe_options(method: str) -> str:
    """The options of ``method`` with their documentation."""
    return method_spec(method).options.__doc__ or ""


def solve_model(model, method: str, options: dict[str, Any]):
    """``model.solve(method, **options)``: the options built and validated against the
    compiled model, the method's requirements checked, its runner called (BLAS pinned);
    a model of another kind (:data:`MODEL_FAMILIES`) goes to the family that solves it."""
    kind = model_kind(model)
    if kind != "horizontal":
        import importlib

        family = importlib.import_module(MODEL_FAMILIES[kind])
        with blas_threads(options.get("blas_threads", 1)):
            return family.solve_model(model, method, options, method_spec)
    spec = method_spec(method)
    if spec.vertical:
        raise UnsupportedError(
            f"method='{method}' solves vertical models (parties owning column blocks and "
            "publishing partial scores with client.publish(X_k @ theta_k)); write one so, or "
            "build it with fedmodel.models.fair_vfl(X, y, group, blocks, eps)"
        )
    if spec.learning:
        raise UnsupportedError(
            f"method='{method}' trains learning models (a per-sample differentiable loss over "
            "the parties' rows or feature blocks); build one with fedmodel.LearningModel(loss) "
            "and call its solve()"
        )
    opts = build_options(spec.options, options, method)
    t0 = time.perf_counter()
    started = SOLVE_STARTED.set(t0)  # (the time limit counts the compile too)
    try:
        return _compile_and_run(model, spec, opts, method, t0)
    finally:
        SOLVE_STARTED.reset(started)


def rewritten_terms(compiled) -> str:
    """The user's terms that have an epigraph or cone form (no smooth one), by party:
    ``"site0: objective[0]; server: budget"``."""
    out = []
    for program in compiled.parties:
        labels = [t.label for t in program.objective if t.source is not None]
        for c in program.constraints:
            if (
                not c.internal
                and c.origin is not None
                and c.kind == "cone"
                or ":epigraph[" in c.label
            ):
                labels.append(c.user_label.split(":epigraph[")[0])
        if labels:
            out.append(f"{program.name}: {', '.join(dict.fromkeys(labels))}")
    return "; ".join(out)


def _compile_and_run(model, spec: MethodSpec, opts, method: str, t0: float):
    """:func:`solve_model`'s horizontal case from the model's compile on."""
    compiled = model.compile()
    compile_seconds = time.perf_counter() - t0
    if spec.server_sets_in_h:
        compiled = compiled.with_simple_sets_in_h(method)
    if spec.needs_no_constraints and compiled.has_constraints:
        where = [
            f"{p.name}: {c.label}" for p in compiled.parties for c in p.constraints
            if c.kind != "cone"  # cone constraints are solved inside their party's step
        ]  # fmt: skip
        shown = ", ".join(where[:4]) + (" ..." if len(where) > 4 else "")
        raise UnsupportedError(
            f"method='{method}' solves models without constraints beyond h; it takes the "
            "server's bounds and norm balls on whole shared variables as part of h, but not "
            f"these constraints ({shown}); use method='prox-al'"
        )
    if compiled.layout.has_owned and not spec.owned_variables:
        takes = tuple(name for name, sp in all_methods().items() if sp.owned_variables)
        layout = compiled.layout
        declared = sorted(
            {owner for vid, owner in layout.owners.items() if vid not in layout.hidden}
        )
        if declared:
            raise UnsupportedError(
                f"method='{method}' does not take party-owned variables yet (declared with "
                f"party.variable(...) by {declared}); methods that do: {takes}"
            )
        raise UnsupportedError(
            f"method='{method}' takes only terms with a smooth form; these have none and "
            f"are solved through an epigraph or cone form: {rewritten_terms(compiled)}; "
            f"methods that take them: {takes}"
        )
    if spec.needs_gradients:
        compiled.require_smooth(method)
    opts.validate(compiled, method)  # the options against the model (naming the option)
    # (the compiled model's objects stay out of the collector's full scans: runtime/heap.py)
    with blas_threads(getattr(opts, "blas_threads", None)), settled_heap():
        result = spec.runner(compiled, opts, method)
    result.timing["model_compile"] = compile_seconds
    return result
