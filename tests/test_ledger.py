"""The message ledger audits data ownership: for every federated method, no client data
array and no array with a client's sample dimension ever leaves that client, and what
crosses the network is what the method's paper says is sent."""

from __future__ import annotations

import os
import sys
from collections import Counter

import cvxpy as cp
import numpy as np
import pytest

import fedmodel as fm
import fedmodel.runtime.base as runtime_base
from fedmodel.algorithms.registry import all_methods
from fedmodel.runtime import messages, rows
from fedmodel.runtime.messages import SERVER

sys.path.insert(0, os.path.dirname(__file__))
from backend_configs import REMOTE, on  # noqa: E402
from problems import np_model  # noqa: E402

# Sample counts chosen to collide with no other dimension of these models.
M0, M1, M_LSQ = 37, 23, 41


def constrained_model():
    return np_model(3, m0=M0, m1=M1)


def lsq_model(n=3, d=3, seed=1):
    rng = np.random.default_rng(seed)
    model = fm.Model("lsq")
    w = model.variable(d, name="w")
    for k in range(n):
        site = model.client(f"c{k}")
        A = site.data(rng.normal(size=(M_LSQ, d)), name="A")
        b = site.data(rng.normal(size=M_LSQ), name="b")
        site.minimize(cp.sum_squares(A @ w - b) / (n * M_LSQ))
    model.regularize(0.01 * cp.norm1(w))
    return model


def federated_methods():
    # vertical methods (fair-vfl, fedbcd) solve vertical models: tests/test_vfl.py
    # learning methods (ssca, fedsgd, ...) train fm.LearningModel: tests/test_ssca_*.py
    return [
        m
        for m, spec in all_methods().items()
        if spec.federated and not spec.vertical and not spec.learning
    ]


@pytest.fixture
def captured(monkeypatch):
    """Every message recorded in any ledger, with its payload; a stacked round's
    (``runtime/rows.py``, whose ledger rows are written in one pass) as each client's
    request and reply."""
    seen: list[messages.Message] = []
    original = messages.Ledger.record
    exchange = rows.exchange_rows

    def record(self, msg, known=None):
        seen.append(msg)
        return original(self, msg, known)

    def stacked(runtime, kind, names, fields, channel):
        replies = exchange(runtime, kind, names, fields, channel)
        if replies is not None:
            for name, payload in zip(names, rows.payloads_of(fields, len(names))):
                seen.append(messages.Message(kind, SERVER, name, payload, 0, channel))
            seen.extend(replies.values())
        return replies

    monkeypatch.setattr(messages.Ledger, "record", record)
    monkeypatch.setattr(runtime_base, "exchange_rows", stacked)
    return seen


def solve_any(method):
    """Solve the constrained model, or the unconstrained one if the method needs it."""
    for make in (constrained_model, lsq_model):
        model = make()
        try:
            return model, model.solve(method)
        except fm.UnsupportedError:
            continue
    raise AssertionError(f"{method} solved neither test model")


def _arrays(value):
    if isinstance(value, dict):
        for v in value.values():
            yield from _arrays(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _arrays(v)
    else:
        yield value


@pytest.fixture(scope="module")
def ray_local():
    """A local Ray with num_cpus=2, started once for the session (see test_runtime)."""
    import ray

    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, configure_logging=False)
    return ray


@pytest.mark.parametrize("method", federated_methods())
def test_no_client_data_leaves_its_client(method, captured):
    model, res = solve_any(method)
    check_no_data_leaves(method, model, res, captured)


@pytest.mark.parametrize("backend", REMOTE)
@pytest.mark.parametrize("method", ["prox-al", "admm"])
def test_no_client_data_leaves_on_remote_backends(method, backend, captured, ray_local):
    model = constrained_model() if method == "prox-al" else lsq_model()
    res = model.solve(method, workers=2, **on(backend))
    assert res.extra["backend"] == on(backend)["backend"]
    check_no_data_leaves(method, model, res, captured)


def check_no_data_leaves(method, model, res, captured):
    assert res.ledger, f"{method} recorded no messages"
    assert len(captured) >= len(res.ledger)
    compiled = model.compile()
    for c in compiled.clients:
        data = [np.asarray(d.value, dtype=float) for d in c.data]
        samples = {a.shape[0] for a in data if a.ndim >= 1 and a.shape[0] > 1}
        assert samples and samples.isdisjoint({compiled.layout.size, 1})
        rows = {np.ascontiguousarray(r).tobytes() for a in data for r in np.atleast_2d(a)}
        whole = {np.ascontiguousarray(a).tobytes() for a in data}
        out = [m for m in captured if m.sender == c.name and m.receiver != c.name]
        assert out, f"{method}: client {c.name} sent nothing"
        for msg in out:
            for key, value in msg.payload.items():
                for v in _arrays(value):
                    assert v is None or isinstance(
                        v, (int, float, bool, np.number, np.bool_, np.ndarray)
                    ), f"{method}: {c.name} sent a {type(v).__name__} as '{key}' ({msg.kind})"
                    arr = np.asarray(v)
                    assert not samples & set(arr.shape), (
                        f"{method}: {c.name} sent '{key}' of shape {arr.shape} in '{msg.kind}': "
                        f"a sample dimension ({sorted(samples)})"
                    )
                    if arr.size > 1:
                        b = np.ascontiguousarray(arr, dtype=float).tobytes()
                        assert b not in rows and b not in whole, (
                            f"{method}: {c.name} sent its own data as '{key}' ({msg.kind})"
                        )
    # the ledger's rows match the messages, and res.communication adds them up
    alg = [r for r in res.ledger if r["channel"] == "algorithm"]
    up = [r for r in alg if r["receiver"] == SERVER]
    assert res.communication["messages_up"] == len(up)
    assert res.communication["floats_up"] == sum(r["floats"] for r in up)
    for r in res.ledger:
        assert set(r) >= {"round", "sender", "receiver", "kind", "shapes", "bytes"}


def _by(ledger, **kw):
    return [r for r in ledger if all(r[k] == v for k, v in kw.items())]


@pytest.mark.parametrize("method", ["prox-al", "admm"])
def test_prox_al_traffic_matches_the_paper(method):
    """Seed 000: w down; u~_i and eps~_i up per inner round; ||mu_i^{k+1} - mu_i^k||_inf
    up per outer round (with the next ADMM initialisation u~_i^0); beyond the paper, once,
    each client's share of the certificate's objective scale in its start reply."""
    model = constrained_model() if method == "prox-al" else lsq_model()
    res = model.solve(method, eps=1e-4, variant="paper")
    d = model.compile().layout.size
    alg = [r for r in res.ledger if r["channel"] == "algorithm"]
    expected = {
        ("start", "down"): {"w": (d,)},
        ("start_reply", "up"): {"u_tilde": (d,), "objective_reference": ()},
        ("admm_w", "down"): {"w": (d,), "tol": ()},
        ("admm_w_reply", "up"): {"u_tilde": (d,), "eps_tilde": ()},
    }
    if method == "prox-al":
        expected[("outer", "down")] = {"w": (d,)}
        expected[("outer_reply", "up")] = {"dmu_inf": (), "u_tilde": (d,)}
    seen = set()
    for r in alg:
        direction = "up" if r["receiver"] == SERVER else "down"
        assert (r["sender"] == SERVER) != (r["receiver"] == SERVER)
        key = (r["kind"], direction)
        assert key in expected, f"unexpected message {key}"
        assert r["shapes"] == expected[key], key
        seen.add(key)
    assert seen == set(expected)
    clients = [c.name for c in model.compile().clients]
    for name in clients:
        ups = Counter(r["kind"] for r in alg if r["sender"] == name)
        assert ups["start_reply"] == 1
        assert ups["admm_w_reply"] == res.rounds["inner"]
        assert ups["outer_reply"] == (res.rounds["outer"] if method == "prox-al" else 0)
    # one algorithm message per client per round, and every round reaches every client
    per_round = Counter((r["round"], r["receiver"]) for r in alg if r["sender"] == SERVER)
    assert set(per_round.values()) == {1}
    assert len(per_round) == res.rounds["communication"] * len(clients)
    # nothing else travels on the algorithm channel: floats add up to the paper's count
    n_in, n_out = res.rounds["inner"], res.rounds["outer"] if method == "prox-al" else 0
    per_client_up = d + 1 + n_in * (d + 1) + n_out * (d + 1)
    assert res.communication["floats_up"] == len(clients) * per_client_up


def test_communication_totals_add_up_each_party_s_rows():
    """``res.communication``'s totals and each party's sent and received counts, on both
    channels, are those of the ledger's rows counted one by one (stacked rounds' blocks
    and single messages alike), and local turns only in ``local_steps``."""
    from fedmodel.runtime.messages import Ledger, Message, communication_totals

    rng = np.random.default_rng(3)
    m = fm.Model("totals")
    w = m.variable(3, name="w")
    for k in range(6):  # (clients without constraints: their rounds are stacked)
        X = rng.normal(size=(10 + k % 2, 3))
        c = m.client(f"c{k}")
        c.minimize(cp.sum_squares(c.data(X, name="X") @ w - c.data(X @ np.ones(3), name="y")))
    m.server.subject_to([w <= 0.5, w >= -0.5])
    res = m.solve("prox-al", inner_solver="exact-admm")
    ledger = Ledger(list(res.ledger))  # (the rows one by one, the blocks written out)
    assert res.communication == communication_totals(ledger)
    ledger.record(Message("step", "c0", "c0", {"x": np.zeros(3)}, 9, "local"))
    ledger.record(Message("peer", "c0", "c1", {"x": np.zeros(2)}, 9))
    got = communication_totals(ledger)
    assert got["local_steps"] == 1
    for channel, out in (("algorithm", got), ("diagnostic", got["diagnostic"])):
        rows = [r for r in ledger.rows if r["channel"] == channel]
        assert out["messages"] == len(rows) and out["floats"] == sum(r["floats"] for r in rows)
        for kind, pick in (
            ("up", lambda r: r["receiver"] == SERVER),
            ("down", lambda r: r["sender"] == SERVER),
            ("peer", lambda r: SERVER not in (r["sender"], r["receiver"])),
        ):
            picked = [r for r in rows if pick(r)]
            assert out[f"messages_{kind}"] == len(picked), (channel, kind)
            assert out[f"floats_{kind}"] == sum(r["floats"] for r in picked), (channel, kind)
        parties = {p for r in rows for p in (r["sender"], r["receiver"])}
        assert set(out["per_party"]) == parties
        for party, d in out["per_party"].items():
            sent = [r["floats"] for r in rows if r["sender"] == party]
            received = [r["floats"] for r in rows if r["receiver"] == party]
            assert d == {
                "messages_sent": len(sent),
                "floats_sent": sum(sent),
                "messages_received": len(received),
                "floats_received": sum(received),
            }, (channel, party)


def test_communication_totals_of_blocks_with_overlapping_clients():
    """Stacked rounds' blocks of different clients that share some, between single
    messages and on both channels, count as their rows written out one by one, the
    parties in the order of their first rows, each with a dict of its own."""
    from fedmodel.runtime.messages import Ledger, Message, RoundBlock, communication_totals

    ledger = Ledger()
    shapes = {"x": (2,)}

    def block(names, rnd, channel="algorithm", floats=(2, 3)):
        what = (rnd, "ping", "ping_reply", channel)
        ledger.rows.add_block(RoundBlock(names, what, (shapes, floats[0]), (shapes, floats[1])))

    block(["a", "b"], 1)
    ledger.record(Message("ping", SERVER, "d", {"x": np.zeros(4)}, 2))
    block(["b", "c"], 3, floats=(5, 1))
    block(["a", "b"], 4)
    block(["e", "f"], 5)
    block(["e", "f"], 6, floats=(1, 1))
    block(["c", "a"], 7, channel="diagnostic")
    ledger.record(Message("ping_reply", "a", SERVER, {"x": np.zeros(1)}, 8))
    got = communication_totals(ledger)
    assert got == communication_totals(Ledger(list(ledger.rows)))
    assert list(got["per_party"]) == [SERVER, "a", "b", "d", "c", "e", "f"]
    assert list(got["diagnostic"]["per_party"]) == [SERVER, "c", "a"]
    assert got["per_party"]["e"] == {
        "messages_sent": 2,
        "floats_sent": 4,
        "messages_received": 2,
        "floats_received": 3,
    }
    assert got["per_party"]["e"] is not got["per_party"]["f"]
