"""prox-al's partial participation (option ``participation``): only the sampled clients take
part in a round of the exact-admm inner solver, the certificate still reaches every client,
the default is unchanged bit for bit, and bad values are refused naming the option."""

from __future__ import annotations

from collections import Counter

import cvxpy as cp
import numpy as np
import pytest

import fedmodel as fm
from fedmodel.errors import ModelError

N_CLIENTS, D = 10, 4


def box_model(n: int = N_CLIENTS, d: int = D, seed: int = 3):
    """Least squares over ``n`` clients (the loss over the pooled rows) with an active server
    box: exact-admm's model; also the pooled cvxpy problem."""
    rng = np.random.default_rng(seed)
    w_true = rng.normal(size=d)
    parts = []
    for _ in range(n):
        X = rng.normal(size=(int(rng.integers(8, 15)), d))
        parts.append((X, X @ w_true + 0.3 * rng.normal(size=len(X))))
    rows = sum(len(y) for _, y in parts)
    model = fm.Model("box")
    w = model.variable(d, name="w")
    for k, (X, y) in enumerate(parts):
        c = model.client(f"c{k}")
        c.minimize(cp.sum_squares(c.data(X, name="X") @ w - c.data(y, name="y")) / rows)
    model.server.subject_to([w <= 0.3, w >= -0.3])
    v = cp.Variable(d)
    loss = sum(cp.sum_squares(X @ v - y) for X, y in parts) / rows
    pooled = cp.Problem(cp.Minimize(loss), [v <= 0.3, v >= -0.3])
    pooled.solve(solver="CLARABEL")
    return model, pooled, v


@pytest.fixture(scope="module")
def case():
    return box_model()


def _xadmm_receivers(res) -> dict[int, list[str]]:
    rounds: dict[int, list[str]] = {}
    for row in res.ledger:
        if row["kind"] == "xadmm_w" and row["sender"] == "server":
            rounds.setdefault(row["round"], []).append(row["receiver"])
    return rounds


def test_default_unchanged_bit_for_bit(case):
    """participation None, 1.0 or every client: the same iterates as a run without it."""
    model = case[0]
    ref = model.solve("prox-al")
    assert ref.extra["inner_solver"] == "exact-admm"
    assert "participation" not in ref.extra
    for value in (None, 1.0, N_CLIENTS):
        res = model.solve("prox-al", participation=value)
        assert res.rounds == ref.rounds
        np.testing.assert_array_equal(res.solution["w"], ref.solution["w"])
        assert [h["objective"] for h in res.history] == [h["objective"] for h in ref.history]


@pytest.mark.parametrize("participation, per_round", [(0.3, 3), (4, 4)])
def test_sampled_rounds_reach_optimum(case, participation, per_round):
    """A share or a count of the clients per inner round: only they are sent the round's
    request, every client still answers the certificate, and the point is the pooled
    optimum within what the certificate at eps = 1e-3 guarantees."""
    model, pooled, v = case
    res = model.solve("prox-al", participation=participation, random_state=1)
    assert res.status == "optimal", res.message
    info = res.extra["participation"]
    assert info["clients_per_round"] == per_round and info["clients"] == N_CLIENTS
    sampled = _xadmm_receivers(res)
    assert len(sampled) == info["sampled_rounds"] > 0
    assert all(len(names) == per_round == len(set(names)) for names in sampled.values())
    assert sum(len(names) for names in sampled.values()) == info["client_steps"]
    assert len({n for names in sampled.values() for n in names}) == N_CLIENTS
    # the certificate's evaluation round reaches every client
    evaluated: dict[int, Counter] = {}
    for row in res.ledger:
        if row["kind"] == "evaluate" and row["sender"] == "server":
            evaluated.setdefault(row["round"], Counter())[row["receiver"]] += 1
    assert evaluated
    for receivers in evaluated.values():
        assert len(receivers) == N_CLIENTS and len(set(receivers.values())) == 1
    # each round counts once, whatever its participation
    assert res.rounds["communication"] >= info["sampled_rounds"]
    w = res.solution["w"]
    gap = abs(_objective(case, w) - pooled.value) / max(1.0, abs(pooled.value))
    assert gap <= 1e-3
    assert np.abs(w).max() <= 0.3 + 1e-3
    np.testing.assert_allclose(w, v.value, atol=1e-2)


def _objective(case, w) -> float:
    """The pooled objective at ``w``."""
    pooled, v = case[1], case[2]
    saved = v.value
    v.value = np.asarray(w, dtype=float)
    value = float(pooled.objective.value)
    v.value = saved
    return value


def test_sampling_repeats_with_random_state(case):
    model = case[0]
    a = model.solve("prox-al", participation=0.3, random_state=7)
    b = model.solve("prox-al", participation=0.3, random_state=7)
    assert _xadmm_receivers(a) == _xadmm_receivers(b)
    np.testing.assert_array_equal(a.solution["w"], b.solution["w"])


@pytest.mark.parametrize(
    "value, words",
    [
        (0.0, "(0, 1]"),
        (1.5, "(0, 1]"),
        (-2, "[1, 10]"),
        (11, "[1, 10]"),
        (True, "share"),
        ("half", "share"),
        (float("nan"), "(0, 1]"),
    ],
)
def test_bad_participation_refused(case, value, words):
    with pytest.raises(ModelError, match="participation") as info:
        case[0].solve("prox-al", participation=value)
    assert words in str(info.value)


def test_routes_without_sampling_refused(case):
    """A route whose rounds need every client refuses a partial participation by name;
    under "auto" the run takes exact-admm even on a model another route would take."""
    model = case[0]
    with pytest.raises(ModelError, match="exact-admm"):
        model.solve("prox-al", participation=0.5, inner_solver="admm")
    with pytest.raises(ModelError, match="participation"):
        model.solve("admm", participation=0.5)
    with pytest.raises(ModelError, match="participation=0.5: cprox-al"):
        model.solve("cprox-al", participation=0.5)
    rng = np.random.default_rng(0)
    smooth = fm.Model("smooth")
    w = smooth.variable(3, name="w")
    for k in range(4):
        c = smooth.client(f"c{k}")
        X = c.data(rng.normal(size=(6, 3)), name="X")
        c.minimize(cp.sum_squares(X @ w - 1.0) / 24)
    assert smooth.solve("prox-al").extra["inner_solver"] != "exact-admm"
    res = smooth.solve("prox-al", participation=2, random_state=0)
    assert res.extra["inner_solver"] == "exact-admm"
    assert res.status == "optimal", res.message


def test_resume_draws_the_same_clients(case, tmp_path):
    """The sampler's generator is part of the checkpointed state: a run resumed after its
    first outer iteration repeats the uninterrupted run bit for bit, ledger included."""
    model = case[0]
    opts = {"participation": 0.3, "random_state": 5}
    reference = model.solve("prox-al", **opts)
    assert reference.rounds["outer"] >= 2
    path = tmp_path / "ck"
    first = model.solve("prox-al", checkpoint=str(path), checkpoint_every=1, max_outer=1, **opts)
    assert first.status == "max_iterations"
    resumed = model.solve("prox-al", resume=str(path), **opts)
    np.testing.assert_array_equal(resumed.solution["w"], reference.solution["w"])
    assert resumed.rounds == reference.rounds
    assert resumed.ledger == reference.ledger


def test_processes_backend_gives_the_serial_iterates(case):
    """Sampled rounds on worker processes (clients sharded over hosts, each round reaching
    only the sampled ones) repeat the serial run bit for bit."""
    model = case[0]
    opts = {"participation": 0.3, "random_state": 2}
    serial = model.solve("prox-al", **opts)
    procs = model.solve("prox-al", backend="processes", workers=2, **opts)
    assert procs.status == serial.status == "optimal"
    np.testing.assert_array_equal(procs.solution["w"], serial.solution["w"])
    assert _xadmm_receivers(procs) == _xadmm_receivers(serial)
