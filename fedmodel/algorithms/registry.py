"""Dispatch ``model.solve(method=...)`` to the methods.

Every method registers one entry in :data:`METHODS`: its options dataclass and a runner
``run(compiled, options, method) -> Result``. Adding a method is adding an entry.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fedmodel.algorithms.options import CentralizedOptions, ProxALOptions, build_options
from fedmodel.errors import ModelError, UnsupportedError
from fedmodel.runtime.blas import blas_threads


@dataclass(frozen=True)
class MethodSpec:
    """A registered method: its options class, its runner and a one-line description."""

    options: type
    runner: Callable[..., Any]
    description: str
    needs_no_constraints: bool = False
    needs_gradients: bool = True
    #: takes party-owned variables (``party.variable``, epigraph auxiliaries)
    owned_variables: bool = False


def _run_prox_al(compiled, opts, method):
    from fedmodel.algorithms.prox_al import run_prox_al

    with blas_threads(opts.blas_threads):
        return run_prox_al(compiled, opts, method=method)


def _run_cprox_al(compiled, opts, method):
    from fedmodel.algorithms.cprox_al import run_cprox_al

    with blas_threads(opts.blas_threads):
        return run_cprox_al(compiled, opts, method=method)


def _run_centralized(compiled, opts, method):
    from fedmodel.algorithms.centralized import run_centralized

    with blas_threads(opts.blas_threads):
        return run_centralized(compiled, opts)


METHODS: dict[str, MethodSpec] = {
    "prox-al": MethodSpec(ProxALOptions, _run_prox_al, "seed 000 Algorithm 1 + 2 (federated)"),
    "cprox-al": MethodSpec(
        ProxALOptions,
        _run_cprox_al,
        "seed 000 Algorithm 3 (centralized)",
        owned_variables=True,
    ),
    "admm": MethodSpec(
        ProxALOptions, _run_prox_al, "seed 000 Algorithm 2 alone (no constraints)", True
    ),
    "centralized": MethodSpec(
        CentralizedOptions,
        _run_centralized,
        "pooled problem solved exactly: cvxpy, or the smooth exact path (reference)",
        needs_gradients=False,
        owned_variables=True,
    ),
}


def register_method(name: str, spec: MethodSpec) -> None:
    """Add a method to :data:`METHODS` (used by algorithm modules of later methods)."""
    METHODS[name] = spec


def describe_options(method: str) -> str:
    """The options of ``method`` with their documentation."""
    return METHODS[method].options.__doc__ or ""


def solve_model(model, method: str, options: dict[str, Any]):
    _load_extensions()
    if method not in METHODS:
        raise ModelError(f"unknown method {method!r}; choose one of {tuple(METHODS)}")
    spec = METHODS[method]
    opts = build_options(spec.options, options, method)
    t0 = time.perf_counter()
    compiled = model.compile()
    compile_seconds = time.perf_counter() - t0
    if spec.needs_no_constraints and compiled.has_constraints:
        raise UnsupportedError(
            f"method='{method}' solves models without constraints beyond h; this model has "
            "constraints, use method='prox-al'"
        )
    if compiled.layout.has_owned and not spec.owned_variables:
        owners = sorted(set(compiled.layout.owners.values()))
        takes = tuple(name for name, sp in METHODS.items() if sp.owned_variables)
        raise UnsupportedError(
            f"method='{method}' does not take party-owned variables yet (owned by "
            f"{owners}; declared with party.variable(...) or introduced by a non-smooth "
            f"term's epigraph form); methods that do: {takes}"
        )
    if spec.needs_gradients:
        compiled.require_smooth(method)
    result = spec.runner(compiled, opts, method)
    result.timing["model_compile"] = compile_seconds
    return result


_EXTENSIONS = ("fedmodel.algorithms.dald",)


def _load_extensions() -> None:
    """Import algorithm modules that register further methods (if they exist)."""
    import importlib

    for name in _EXTENSIONS:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
