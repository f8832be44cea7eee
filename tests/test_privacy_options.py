"""Secure aggregation and differential privacy (docs/privacy.md): the same iterates under
masking, what the server receives from one client, dropouts, refusals, the accountant."""

from __future__ import annotations

import math

import cvxpy as cp
import numpy as np
import pytest

import fedmodel as fm
from fedmodel.algorithms.baselines.fedavg import FedProxOptions, run_fedavg
from fedmodel.algorithms.dp import DP, calibrate, spent
from fedmodel.algorithms.privacy import privacy_rows, privacy_text
from fedmodel.errors import ModelError, UnsupportedError
from fedmodel.runtime.faults import Fault
from fedmodel.runtime.secure_aggregation import (
    MODULUS,
    SecureAggregation,
    SecureRangeError,
    decode,
    encode,
)

pytest.importorskip("flwr")


def model(rows=(10, 30, 60, 20), d=4, seed=0):
    rng = np.random.default_rng(seed)
    total = sum(rows)
    m = fm.Model("ls")
    w = m.variable(d, name="w")
    for i, r in enumerate(rows):
        A, b = rng.normal(size=(r, d)) + 0.5 * i, rng.normal(size=r) + i
        c = m.client(f"c{i}")
        c.minimize(cp.sum_squares(c.data(A, name="A") @ w - c.data(b, name="b")) / total)
    return m


def rel(a, b):
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.mark.parametrize("method", ["fedavg", "fedprox"])
def test_secure_aggregation_gives_the_same_iterates(method):
    m = model()
    plain = m.solve(method, max_rounds=4)
    masked = m.solve(method, max_rounds=4, secure_aggregation=True)
    assert rel(masked.x, plain.x) <= 1e-9
    for a, b in zip(plain.history, masked.history):
        assert b["objective"] == pytest.approx(a["objective"], rel=1e-9)
    sa = masked.privacy["secure_aggregation"]
    assert sa["on"] and "fed_round" in sa["messages"] and "evaluate" in sa["messages"]
    assert sa["resolution"] < 1e-9 and sa["dropouts"] == []
    assert masked.privacy["epsilon"] == 0.0 and plain.privacy["secure_aggregation"] == {"on": False}
    assert '"privacy"' in masked.to_json() and "secure_aggregation=on" in repr(masked)


@pytest.mark.parametrize("backend", ["processes", "ray"])
def test_secure_aggregation_on_other_backends(backend):
    if backend == "ray":
        pytest.importorskip("ray")
    m = model()
    plain = m.solve("fedprox", max_rounds=3, history=False)
    masked = m.solve(
        "fedprox",
        max_rounds=3,
        history=False,
        secure_aggregation=True,
        backend=backend,
        workers=2,
    )
    assert rel(masked.x, plain.x) <= 1e-9


@pytest.mark.slow
def test_secure_aggregation_over_flower_links():
    """The same stages as Flower messages (the Flower simulation engine, the party servers
    and their request checks): the plain iterates to the resolution."""
    m = model()
    plain = m.solve("fedprox", max_rounds=3, history=False)
    masked = m.solve(
        "fedprox", max_rounds=3, history=False, secure_aggregation=True, backend="flower"
    )
    assert masked.status == "max_iterations" and rel(masked.x, plain.x) <= 1e-9


def test_the_server_receives_masked_vectors_whose_sum_is_exact():
    m = model()
    res = m.solve("fedprox", max_rounds=2, history=False, secure_aggregation=True)
    replies = [r for r in res.ledger if r["kind"] == "secagg_masked_reply"]
    # one vector per reply: d + 1 numbers in fed_round (dx, weight), d + 2 in evaluate
    assert replies and {r["shapes"]["masked"] for r in replies} == {(5,), (6,)}
    # what one client sends, and what the server can do with it alone, is checked on the
    # engine directly (the ledger keeps shapes, not values)
    from fedmodel.runtime.secure_aggregation import aggregate

    class Spy:
        def __init__(self, runtime):
            self.runtime, self.seen = runtime, []

        def __getattr__(self, name):
            return getattr(self.runtime, name)

        def poll(self, tickets, **kw):
            got = self.runtime.poll(tickets, **kw)
            for ticket, rep in got.items():
                if ticket.message.kind == "secagg_masked":
                    self.seen.append((ticket.receiver, np.asarray(rep.payload["masked"])))
            return got

    from fedmodel.algorithms.baselines.fedavg import FedClient
    from fedmodel.algorithms.baselines.messages import BASELINES
    from fedmodel.algorithms.messages import program_dims
    from fedmodel.compiler.regularizer import Regularizer
    from fedmodel.runtime.secure_aggregation import SECAGG
    from fedmodel.runtime.serial import SerialRuntime

    compiled = m.compile()
    opts = FedProxOptions()
    clients = {c.name: FedClient(c, Regularizer(), opts, 2.0) for c in compiled.clients}
    runtime = SerialRuntime(clients)
    dims = {c.name: program_dims(c) for c in compiled.clients}
    runtime.declare(BASELINES.merged(SECAGG), lambda n: dims[n])
    spy = Spy(runtime)
    x_hat = np.zeros(4)
    cfg = SecureAggregation()
    out = aggregate(spy, "fed_round", {"x_hat": x_hat, "scale": 0.25}, secure=cfg)
    true = {}
    for name, client in clients.items():  # each client's true reply (fresh halves agree)
        twin = FedClient(client.program, Regularizer(), opts, 2.0)
        true[name] = twin._on_fed_round(x_hat, 0.25)
    total = sum(t["dx"] for t in true.values())
    assert np.allclose(out.sums["dx"], total, rtol=0, atol=cfg.resolution(4))
    assert out.sums["weight"][0] == pytest.approx(1.0, abs=cfg.resolution(4))
    bits = cfg.fraction_bits(4)
    assert len(spy.seen) == 4
    for name, seen in spy.seen:
        alone = decode(seen, bits)[:4]  # the server's best reading of one masked vector
        assert np.abs(alone - true[name]["dx"]).max() > 1.0  # nothing like the message
    # the sum of the masked vectors without the unmask round's shares is noise too
    raw = decode(sum(s for _, s in spy.seen) & (MODULUS - 1), bits)[:4]
    assert np.abs(raw - total).max() > 1.0


@pytest.mark.parametrize("backend", ["serial", "processes"])
def test_a_client_dropping_out_is_recovered(backend):
    compiled = model().compile()
    opts = FedProxOptions(
        max_rounds=4, secure_aggregation=True, history=False, backend=backend, workers=2
    )
    fault = Fault("raise", round=2, kinds=("secagg_masked",))
    res = run_fedavg(compiled, opts, "fedprox", faults={"c1": fault})
    assert res.status == "max_iterations"
    assert res.privacy["secure_aggregation"]["dropouts"] == [
        {"round": 2, "kind": "fed_round", "clients": ["c1"]}
    ]
    # the round without c1 is the average of the other three: replay it in the clear
    plain = run_fedavg(compiled, FedProxOptions(max_rounds=4, history=False), "fedprox")
    assert rel(res.x, plain.x) > 1e-6  # (a round with three clients is another iterate)
    assert np.all(np.isfinite(res.x)) and res.kkt is not None


def test_refusals():
    m = model()
    with pytest.raises(UnsupportedError, match="admm_w"):
        m.solve("admm", secure_aggregation=True)
    with pytest.raises(UnsupportedError, match="dgd_x"):
        m.solve("dgd", secure_aggregation=True)
    with pytest.raises(ModelError, match="snapshot_iterations"):
        m.solve("fedavg", secure_aggregation=True, snapshot_iterations=(1,))
    with pytest.raises(ModelError, match="dp needs weights"):
        m.solve("fedavg", dp=DP(epsilon=1.0, delta=1e-5, clip=1.0))
    with pytest.raises(UnsupportedError, match="at least 3 clients"):
        model(rows=(5, 5)).solve("fedavg", secure_aggregation=True)


def test_fixed_point_range_and_resolution():
    cfg = SecureAggregation(range=1.0)
    bits = cfg.fraction_bits(3)
    v = np.array([0.1, -0.3, 0.999])
    assert np.abs(decode(encode(v, bits, 1.0, "a", "x"), bits) - v).max() <= 2.0 ** -(bits + 1)
    with pytest.raises(SecureRangeError, match="party 'a': x has an entry of magnitude 2"):
        encode(np.array([2.0]), bits, 1.0, "a", "x")
    m = model()
    res = m.solve(
        "fedprox",
        max_rounds=1,
        history=False,
        secure_aggregation=SecureAggregation(range=1e-3),
    )
    assert res.status == "client_failure" and "outside the secure aggregation range" in (
        res.message + str(res.failure)
    )


def test_privacy_table_has_the_masked_column():
    compiled = model().compile()
    rows = {(r["kind"], r["direction"]): r for r in privacy_rows(compiled, "fedavg")}
    assert rows[("fed_round", "client -> server")]["masked"] == ["dx", "weight"]
    assert rows[("evaluate", "client -> server")]["masked"] == [
        "objective",
        "grad",
        "complementarity_gap",
    ]
    assert "[masked: dx, weight]" in privacy_text(compiled, "fedavg")


def epsilon_by_hand(z: float, T: int, delta: float) -> float:
    """T Gaussian mechanisms of noise multiplier z: RDP of order a is T a / (2 z^2) (Mironov
    2017, Prop. 7 and composition); dp-accounting converts it to (eps, delta) by eps =
    min_a rdp(a) + log((a - 1) / a) - (log(delta) + log(a)) / (a - 1) (Canonne, Kamath,
    Steinke 2020, Prop. 12)."""
    from dp_accounting import rdp

    orders = np.array(rdp.RdpAccountant()._orders, dtype=float)
    by_hand = T * orders / (2 * z**2)
    by_hand += np.log((orders - 1) / orders) - (math.log(delta) + np.log(orders)) / (orders - 1)
    return float(by_hand.min())


def test_the_accountant_composes_as_computed_by_hand():
    z, T, delta = 1.3, 21, 1e-5
    assert spent(z, T, delta) == pytest.approx(epsilon_by_hand(z, T, delta), rel=1e-9)
    # calibration: the noise of 20 rounds + the certificate stays within the target
    dp = DP(epsilon=3.0, delta=1e-5, clip=1.0)
    z = calibrate(dp, 20)
    assert spent(z, 21, 1e-5) <= 3.0 < spent(z / 1.01, 21, 1e-5)


@pytest.mark.parametrize("secure", [False, True])
def test_dp_fedavg_spends_at_most_its_budget(secure):
    m = model(rows=(10, 10, 10, 10))
    dp = DP(epsilon=2.0, delta=1e-5, clip=1.0)
    res = m.solve("fedavg", weights="uniform", max_rounds=5, dp=dp, secure_aggregation=secure)
    p = res.privacy
    assert (
        p["epsilon"] <= 2.0 and p["delta"] == 1e-5 and p["accountant"].startswith("dp-accounting")
    )
    assert p["mechanisms"] == 6  # five rounds and the certificate
    assert p["epsilon"] == pytest.approx(spent(p["noise_multiplier"], 6, 1e-5))
    assert p["certificate"]["noise_std"] == pytest.approx(p["noise_multiplier"] * 1.0)
    assert res.status in ("max_iterations", "inaccurate", "optimal")
    assert res.history == []  # no certificate per round under dp (it would spend budget)
    # a given noise multiplier: the run stops when the budget is spent
    low = DP(epsilon=2.0, delta=1e-5, clip=1.0, noise_multiplier=4.0)
    res = m.solve("fedavg", weights="uniform", max_rounds=100, dp=low)
    assert res.status == "budget_spent" and res.privacy["epsilon"] <= 2.0
    assert res.rounds["outer"] == res.privacy["mechanisms"]  # the rounds, then the certificate
    assert spent(4.0, res.privacy["mechanisms"] + 1, 1e-5) > 2.0
    with pytest.raises(ModelError, match="spends epsilon = .* on one round and the certificate"):
        m.solve("fedavg", weights="uniform", dp=DP(2.0, 1e-5, 1.0, noise_multiplier=2.0))


def test_dp_without_noise_is_clipped_fedavg():
    m = model(rows=(10, 10, 10, 10))
    plain = m.solve("fedavg", weights="uniform", max_rounds=3, history=False)
    clipped = m.solve(
        "fedavg",
        weights="uniform",
        max_rounds=3,
        history=False,
        dp=DP(epsilon=math.inf, delta=1e-5, clip=1e6),
    )
    assert rel(clipped.x, plain.x) <= 1e-12 and clipped.privacy["epsilon"] == math.inf


def test_privacy_options_given_as_plain_values():
    """``dp=`` and ``secure_aggregation=`` as the dicts of their fields (the command line's
    ``-o``, a deployment's run config, which travels as JSON)."""
    import json

    from fedmodel.algorithms.dp import privacy_as_plain, privacy_from_plain

    given = {
        "dp": {"epsilon": 3.0, "delta": 1e-5, "clip": 1.0},
        "secure_aggregation": {"range": 1024.0},
    }
    opts = privacy_from_plain({**given, "max_rounds": 2})
    assert opts["dp"] == DP(3.0, 1e-5, 1.0) and opts["max_rounds"] == 2
    assert opts["secure_aggregation"] == SecureAggregation(range=1024.0)
    assert privacy_from_plain(json.loads(json.dumps(privacy_as_plain(opts)))) == opts
    assert privacy_from_plain({"secure_aggregation": True}) == {"secure_aggregation": True}
    with pytest.raises(ModelError, match="dp: .*'eps'"):
        privacy_from_plain({"dp": {"eps": 3.0}})
    m = model(rows=(10, 10, 10, 10))
    res = m.solve("fedavg", weights="uniform", max_rounds=2, **privacy_from_plain(given))
    assert res.privacy["secure_aggregation"]["range"] == 1024.0 and res.privacy["epsilon"] <= 3.0
