"""``Result.from_json`` reads back what ``to_json`` wrote."""

from __future__ import annotations

import json

import cvxpy as cp
import numpy as np
import pytest

import fedmodel as fm


@pytest.mark.parametrize("method", ["prox-al", "centralized"])
def test_the_json_round_trip_gives_the_same_result(method):
    rng = np.random.default_rng(0)
    model = fm.Model("rt")
    w = model.variable(3, name="w")
    for k in range(2):
        site = model.client(f"s{k}")
        A = site.data(rng.normal(size=(20, 3)), name="A")
        site.minimize(cp.sum_squares(A @ w - 1) / 40)
        site.subject_to(cp.norm1(w) <= 0.5)  # an epigraph form: auxiliaries
    model.server.subject_to(w >= -2)
    res = model.solve(method=method, eps=1e-4)
    text = res.to_json()
    back = fm.Result.from_json(text)
    assert back.to_json() == text  # a fixed point: nothing lost or changed on the way
    for name in ("status", "method", "objective", "max_violation", "message", "rounds"):
        assert getattr(back, name) == getattr(res, name)
    np.testing.assert_array_equal(back.x, res.x)
    for name, value in res.solution.items():
        np.testing.assert_array_equal(back.solution[name], value)
    for table in ("multipliers", "program_multipliers"):
        mine, theirs = getattr(res, table), getattr(back, table)
        assert set(mine) == set(theirs)
        for party, values in mine.items():
            for label, value in values.items():
                np.testing.assert_array_equal(theirs[party][label], value)
    assert back.kkt.to_dict() == res.kkt.to_dict()
    # options are plain values (no Python set's repr)
    assert "{" not in json.dumps(json.loads(text)["options"]).replace('{"', "").replace("{}", "")


def test_non_finite_numbers_come_back_as_floats():
    res = fm.Result("time_limit", "m", float("nan"), float("inf"), np.array([np.nan]), {}, {}, None)
    back = fm.Result.from_json(res.to_json())
    assert np.isnan(back.objective) and back.max_violation == float("inf")
    assert np.isnan(back.x).all()
