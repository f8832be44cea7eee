"""The resume key of a checkpoint is derived from the method's options dataclass (issue 26):
every option is part of it unless its field is declared ``stop_only``, so resuming with any
other option changed is refused with a CheckpointError naming it, for every registered
method; a resume with only stop-only options changed (a larger iteration cap) repeats the
uninterrupted run bit for bit."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from problems import least_squares_model
from test_ssca_methods import feature_model, sample_model
from test_vfl import small_problem

from fedmodel.algorithms.options import RuntimeOptions, is_stop_only, resume_value
from fedmodel.algorithms.registry import all_methods
from fedmodel.algorithms.vfl.run import solve_vertical
from fedmodel.runtime.checkpoint import CheckpointError, check_manifest, read_manifest


def _dsl(method, **kw):
    return lambda **more: least_squares_model(3, seed=3).solve(method, **kw, **more)


def _vfl(method):
    prob = small_problem(n=60)
    return lambda **more: solve_vertical(prob, method, eps=0.05, eta=2.0, Q=2, **more)


def _learning(make, method):
    return lambda **more: make().solve(method, batch_size=5, eval_every=1, **more)


# method -> (run(**options), the option that caps the run, the cut and full caps, an option
# that changes the iterates and a valid other value of it)
CASES = {
    "prox-al": (_dsl("prox-al", eps=1e-6), "max_outer", 2, 4, ("beta", 50.0)),
    # (admm is one step: Algorithm 2 to its end; the checkpoint is of its final state)
    "admm": (_dsl("admm", eps=1e-6, max_inner=5), "max_outer", 1, 2, ("q", 0.4)),
    "dald-cc": (_dsl("dald-cc"), "max_iter", 3, 6, ("rho", 2.0)),
    "dald-dc": (_dsl("dald-dc", topology="chain"), "max_iter", 3, 6, ("rho", 2.0)),
    "fedavg": (_dsl("fedavg", local_steps=2), "max_rounds", 3, 6, ("weights", "uniform")),
    "fedprox": (_dsl("fedprox"), "max_rounds", 3, 6, ("prox_coef", 50.0)),
    "dgd": (_dsl("dgd", topology="ring"), "max_rounds", 3, 6, ("step_decay", 0.5)),
    "dagd": (_dsl("dagd", topology="ring", delays=(0, 1, 2)), "max_rounds", 3, 6, ("step", 0.01)),
    "fair-vfl": (_vfl("fair-vfl"), "max_rounds", 3, 6, ("c", 0.002)),
    "fedbcd": (_vfl("fedbcd"), "max_rounds", 3, 6, ("c", 0.002)),
    "ssca": (_learning(sample_model, "ssca"), "rounds", 2, 4, ("seed", 5)),
    "fedsgd": (_learning(sample_model, "fedsgd"), "rounds", 2, 4, ("seed", 5)),
    "fedavg-sgd": (_learning(sample_model, "fedavg-sgd"), "rounds", 2, 4, ("seed", 5)),
    "sgd-m": (_learning(sample_model, "sgd-m"), "rounds", 2, 4, ("seed", 5)),
    "vertical-sgd": (_learning(feature_model, "vertical-sgd"), "rounds", 2, 4, ("seed", 5)),
    "vertical-sgd-m": (_learning(feature_model, "vertical-sgd-m"), "rounds", 2, 4, ("seed", 5)),
}


def checkpointed_methods() -> list[str]:
    """Every registered method run by the driver (its options take ``checkpoint``)."""
    return [
        name
        for name, spec in all_methods().items()
        if spec.federated and issubclass(spec.options, RuntimeOptions)
    ]


def test_every_method_with_checkpoints_has_a_case_here():
    assert sorted(checkpointed_methods()) == sorted(CASES)


def other_value(value):
    """A value different from ``value`` (of a similar kind where one exists)."""
    if isinstance(value, (bool, np.bool_)):
        return not value
    if isinstance(value, (int, np.integer)):
        return value + 1
    if isinstance(value, (float, np.floating)):
        return 2.0 * value + 1.0
    if isinstance(value, str):
        return value + "-changed"
    if isinstance(value, dict):
        return {k: other_value(v) for k, v in value.items()} or {"x": 1}
    if isinstance(value, (list, tuple)):
        return [other_value(v) for v in value] or [1]
    if isinstance(value, np.ndarray):
        return value + 1.0
    return 0.5  # None or an object


@pytest.mark.parametrize("method", list(CASES))
def test_resuming_with_any_iterate_option_changed_names_it(tmp_path, method):
    run, cap, cut, full_cap, (changed, value) = CASES[method]
    full = run(**{cap: full_cap})
    ck = tmp_path / "ck"
    first = run(**{cap: cut}, checkpoint=ck, checkpoint_every=1)
    assert first.checkpoint == str(ck)
    # a real resume: only a stop-only option (the cap) changed -> the uninterrupted run
    resumed = run(**{cap: full_cap}, resume=ck)
    assert np.array_equal(resumed.x, full.x)
    assert resumed.rounds == full.rounds
    # a real resume with an option that changes the iterates: refused, naming it
    with pytest.raises(CheckpointError, match=rf"different options \({changed}: "):
        run(**{cap: full_cap, changed: value}, resume=ck)
    # the checkpoint's key holds every option not declared stop-only, and any of them
    # changed is refused, naming it
    manifest = read_manifest(ck)
    spec = all_methods()[method]
    names = {f.name for f in dataclasses.fields(spec.options) if not is_stop_only(f)}
    assert set(manifest["options"]) == names
    assert cap not in names and "backend" not in names and "time_limit" not in names
    check = dict(method=method, model=manifest["model"], where=str(ck))
    check_manifest(manifest, options=manifest["options"], **check)
    for name in sorted(names):
        other = {**manifest["options"], name: resume_value(other_value(manifest["options"][name]))}
        with pytest.raises(CheckpointError, match=rf"different options \({name}: "):
            check_manifest(manifest, options=other, **check)


def test_a_prox_al_checkpoint_of_the_earlier_state_layout_is_refused_clearly():
    """A checkpoint written before prox-al's inner solvers had their own state (every
    route's state in one server half; tests/data holds one, of np_model(3) after two outer
    iterations of the quasi-Newton route) is refused with a message saying why and what
    to do, naming each client; it never resumes into a mixed state."""
    from pathlib import Path

    from problems import np_model

    old = Path(__file__).parent / "data" / "proxal-checkpoint-earlier-layout"
    with pytest.raises(CheckpointError, match="earlier fedmodel version.*without resume="):
        np_model(3).solve("prox-al", eps=1e-6, max_outer=4, resume=str(old), history=False)
