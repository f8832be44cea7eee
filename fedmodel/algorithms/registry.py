"""Dispatch ``model.solve(method=...)`` to the methods."""

from __future__ import annotations

import time
from typing import Any

from fedmodel.algorithms.options import CentralizedOptions, ProxALOptions, build_options
from fedmodel.errors import ModelError, UnsupportedError

METHODS = ("prox-al", "cprox-al", "admm", "centralized")


def describe_options(method: str) -> str:
    """The options of ``method`` with their documentation."""
    cls = CentralizedOptions if method == "centralized" else ProxALOptions
    return cls.__doc__ or ""


def solve_model(model, method: str, options: dict[str, Any]):
    if method not in METHODS:
        raise ModelError(f"unknown method {method!r}; choose one of {METHODS}")
    t0 = time.perf_counter()
    compiled = model.compile()
    compile_seconds = time.perf_counter() - t0
    if method == "centralized":
        from fedmodel.algorithms.centralized import run_centralized

        result = run_centralized(compiled, build_options(CentralizedOptions, options, method))
    else:
        opts = build_options(ProxALOptions, options, method)
        if method == "cprox-al":
            from fedmodel.algorithms.cprox_al import run_cprox_al

            result = run_cprox_al(compiled, opts)
        else:
            if method == "admm" and compiled.has_constraints:
                raise UnsupportedError(
                    "method='admm' (seed 000 Algorithm 2 alone) solves models without "
                    "constraints beyond h; this model has constraints, use method='prox-al'"
                )
            from fedmodel.algorithms.prox_al import run_prox_al

            result = run_prox_al(compiled, opts, method=method)
    result.timing["model_compile"] = compile_seconds
    return result
