"""Secure aggregation on prox-al (docs/privacy.md): the routes whose messages are sums run
with the plain iterates, what the server receives from one client is masked while the
sum is exact, a dropout is recovered, and the routes that read a message client by
client are refused naming it."""

from __future__ import annotations

import cvxpy as cp
import numpy as np
import pytest
from test_privacy_options import model as least_squares  # (quasi-newton: a smooth h)
from test_privacy_options import rel

import fedmodel as fm
from fedmodel.algorithms import dp as dp_module
from fedmodel.algorithms.privacy import privacy_rows, privacy_text
from fedmodel.algorithms.proxal.options import ProxALOptions
from fedmodel.algorithms.proxal.server import run_prox_al
from fedmodel.errors import UnsupportedError
from fedmodel.runtime import secure_aggregation as sa
from fedmodel.runtime.faults import Fault

pytest.importorskip("flwr")

#: the defaults secure aggregation turns off (their messages are each client's): the
#: plain run they are compared with takes the same
SAME = {"local_directions": False, "constraint_curvature": False}


def constrained_lasso(d=5, seed=1):
    """Prox-quasi-Newton (an l1 ``h``), with a client's inequality constraint active at the
    solution (its multiplier, violation and complementarity travel)."""
    rng = np.random.default_rng(seed)
    m = fm.Model("lasso")
    w = m.variable(d, name="w")
    for i in range(3):
        A, b = rng.normal(size=(20, d)), rng.normal(size=20) + 2.0
        c = m.client(f"c{i}")
        c.minimize(cp.sum_squares(c.data(A, name="A") @ w - c.data(b, name="b")) / 60)
        if i == 1:
            c.subject_to(cp.sum(w) <= 0.5)
    m.regularize(0.05 * cp.norm1(w))
    return m


@pytest.mark.parametrize(
    ("make", "route"), [(least_squares, "quasi-newton"), (constrained_lasso, "prox-quasi-newton")]
)
def test_the_same_iterates_as_without(make, route):
    m = make()
    plain = m.solve("prox-al", inner_solver=route, **SAME)
    masked = m.solve("prox-al", secure_aggregation=True)  # ("auto" takes a route of sums)
    assert masked.extra["inner_solver"] == route
    assert masked.status == plain.status == "optimal"
    assert rel(masked.x, plain.x) <= 1e-9
    # (the same iterations; a second aggregation in one round takes the next round)
    assert masked.rounds["outer"] == plain.rounds["outer"]
    assert masked.rounds["inner"] == plain.rounds["inner"]
    for a, b in zip(plain.history, masked.history, strict=True):
        assert b["objective"] == pytest.approx(a["objective"], rel=1e-9)
    # the certificate's objective scale is a sum of the clients' shares: the same from
    # their masked start replies
    scale = plain.extra["objective_scale"]
    assert masked.extra["objective_scale"] == pytest.approx(scale, rel=1e-9)
    # the certificate on the sums: the plain one's (unscaled) residuals
    assert masked.kkt.stationarity == pytest.approx(plain.kkt.stationarity, rel=1e-6)
    assert masked.kkt.feasibility == pytest.approx(plain.kkt.feasibility, abs=1e-12)
    sa_ = masked.privacy["secure_aggregation"]
    assert sa_["on"] and sa_["dropouts"] == [] and sa_["resolution"] < 1e-11
    assert {"start", "outer", "evaluate"} <= set(sa_["messages"])
    assert {"gradient_w", "curvature_w"} & set(sa_["messages"])


@pytest.mark.parametrize("backend", ["processes", "ray"])
def test_the_same_iterates_on_workers(backend):
    if backend == "ray":
        pytest.importorskip("ray")
    m = least_squares()
    plain = m.solve("prox-al", history=False, **SAME)
    masked = m.solve("prox-al", history=False, secure_aggregation=True, backend=backend, workers=2)
    assert masked.status == "optimal" and rel(masked.x, plain.x) <= 1e-9
    assert masked.privacy["secure_aggregation"]["on"]


@pytest.mark.slow
def test_the_same_iterates_over_flower_links():
    """The masked stages as Flower messages (the simulation engine, the party servers and
    their replay checks)."""
    m = least_squares()
    plain = m.solve("prox-al", history=False, **SAME)
    masked = m.solve("prox-al", history=False, secure_aggregation=True, backend="flower")
    assert masked.status == "optimal" and rel(masked.x, plain.x) <= 1e-9


def test_the_server_receives_masked_vectors_whose_sum_is_exact(monkeypatch):
    """Each client's true vector (what it masks) against what the server receives, and
    the server's sums against the sum of the true vectors, in every aggregation of a run."""
    masks, sums = [], []
    mask = sa.SecAggClient.mask

    def spy_mask(self, ciphertexts, vec, what):
        out = mask(self, ciphertexts, vec, what)
        masks.append((self.name, np.array(vec, dtype=float), np.array(out)))
        return out

    aggregate = dp_module.aggregate

    def spy_aggregate(runtime, kind, payload, **kw):
        before = len(masks)
        out = aggregate(runtime, kind, payload, **kw)
        sums.append((kind, out, masks[before:]))
        return out

    monkeypatch.setattr(sa.SecAggClient, "mask", spy_mask)
    monkeypatch.setattr(dp_module, "aggregate", spy_aggregate)
    res = least_squares().solve("prox-al", secure_aggregation=True, history=False)
    assert res.status == "optimal"
    cfg = sa.SecureAggregation()
    bits, tol = cfg.fraction_bits(4), cfg.resolution(4)
    kinds = {kind for kind, _, _ in sums}
    assert {"start", "outer", "curvature_w", "evaluate"} <= kinds
    for kind, out, seen in sums:
        assert sorted(n for n, _, _ in seen) == ["c0", "c1", "c2", "c3"]
        total = sum(vec for _, vec, _ in seen)
        summed = np.concatenate([np.ravel(v) for v in out.sums.values()])
        assert np.abs(summed - total).max() <= tol, kind  # the sum is exact
        for _, vec, masked in seen:  # one client's vector alone: nothing like the message
            assert np.abs(sa.decode(masked, bits) - vec).max() > 1.0, kind
        # the masked vectors added up without the unmask stage's shares: noise too
        raw = sa.decode(sum(m for _, _, m in seen) & (sa.MODULUS - 1), bits)
        assert np.abs(raw - total).max() > 1.0, kind
        # the unmasked scalars (test (8)'s maxima) arrive per client, in the clear
        if kind == "outer":
            assert set(out.clear) == {"c0", "c1", "c2", "c3"}
            assert all("dmu_inf" in c for c in out.clear.values())


@pytest.mark.parametrize("backend", ["serial", "processes", "ray"])
def test_a_client_dropping_out_is_recovered(backend):
    """A client that fails in the masked stage is asked once more with the same shares
    (prox-al's subproblem needs every client's term); the iterates are the plain ones."""
    if backend == "ray":
        pytest.importorskip("ray")
    m = least_squares()
    compiled = m.compile()
    plain = m.solve("prox-al", history=False, **SAME)
    opts = ProxALOptions(secure_aggregation=True, history=False, backend=backend, workers=2)
    fault = Fault("raise", round=3, kinds=("secagg_masked",))
    res = run_prox_al(compiled, opts, faults={"c1": fault})
    assert res.status == "optimal" and rel(res.x, plain.x) <= 1e-9
    (dropout,) = res.privacy["secure_aggregation"]["dropouts"]
    assert dropout["clients"] == ["c1"] and dropout["late_reply"] and dropout["round"] == 3


def test_a_client_that_does_not_come_back_stops_the_run():
    compiled = least_squares().compile()
    opts = ProxALOptions(secure_aggregation=True, history=False)
    fault = Fault("raise", round=3, kinds=("secagg_masked",), times=2)
    res = run_prox_al(compiled, opts, faults={"c1": fault})
    assert res.status == "client_failure" and res.failure["client"] == "c1"
    assert "nothing of the others' vectors is unmasked" in res.failure["error"]


def test_a_client_refusing_the_route_stops_the_run_with_its_reason(monkeypatch):
    """Under secure aggregation the probe's refusal is not a masked vector: the run stops
    naming the party and its reason (no route of sums to fall back to)."""
    from fedmodel.algorithms.proxal.newton_route import DerivativeClient

    refuses = DerivativeClient.refuses

    def c1_refuses(self):
        return "its own reason" if self.host.name == "c1" else refuses(self)

    monkeypatch.setattr(DerivativeClient, "refuses", c1_refuses)
    res = least_squares().solve("prox-al", secure_aggregation=True, history=False)
    assert res.status == "client_failure" and res.failure["client"] == "c1"
    assert "party 'c1' refuses 'start': its own reason" in res.failure["error"]


def test_refusals_name_the_message():
    m = least_squares()
    with pytest.raises(UnsupportedError, match=r"'admm'.*admm_w \(u_tilde"):
        m.solve("prox-al", secure_aggregation=True, inner_solver="admm")
    with pytest.raises(UnsupportedError, match=r"'exact-admm'.*xadmm_w \(x\)"):
        m.solve("prox-al", secure_aggregation=True, inner_solver="exact-admm")
    with pytest.raises(UnsupportedError, match=r"'newton'.*newton_w \(hessian\)"):
        m.solve("prox-al", secure_aggregation=True, inner_solver="newton")
    # an option that makes a route's message each client's own
    with pytest.raises(UnsupportedError, match=r"curvature_w \(local_direction\)"):
        m.solve("prox-al", secure_aggregation=True, local_directions=True)
    with pytest.raises(UnsupportedError, match=r"gradient_w \(stiff\)"):
        m.solve("prox-al", secure_aggregation=True, constraint_curvature=True)
    # a model with no route of sums (party-owned variables: the quasi-Newton routes do
    # not take them) is refused naming what each route reads client by client
    owned = fm.Model("own")
    w = owned.variable(2, name="w")
    for i in range(3):
        c = owned.client(f"c{i}")
        t = c.variable(1, name=f"t{i}")
        c.minimize(cp.sum_squares(w - c.data(np.full(2, float(i)), "a")) + cp.sum_squares(t - w[0]))
    with pytest.raises(UnsupportedError, match=r"no inner solver.*xadmm_w \(x\).*admm_w"):
        owned.solve("prox-al", secure_aggregation=True)


def test_the_privacy_table_says_what_is_masked():
    compiled = least_squares().compile()
    rows = privacy_rows(compiled, "prox-al", secure_aggregation=True)
    got = {(r["kind"], r["direction"]): r for r in rows}
    assert got[("curvature_w", "client -> server")]["masked"] == ["value", "grad", "hvp"]
    assert "objective_reference" in got[("start", "client -> server")]["masked"]
    assert got[("outer", "client -> server")]["clear"] == [
        "dmu_inf", "violation", "complementarity",
    ]  # fmt: skip
    # every message of the run is a sum or a client's unmasked scalars (the certificate
    # round aside, which goes through the sums)
    for r in rows:
        if r["direction"] == "client -> server" and r["channel"] != "diagnostic":
            fields = set(r["fields"])
            assert fields == set(r["masked"]) | set(r["clear"]), r["kind"]
    text = privacy_text(compiled, "prox-al", secure_aggregation=True)
    assert "[masked: value, grad, hvp]" in text
    assert "[clear: dmu_inf, violation, complementarity; under dp in the noised sum]" in text
    assert "[clear, also under dp: accepted, why]" in text
    assert "[masked: value, grad, hvp]" in least_squares().summary(
        print_=False, secure_aggregation=True
    )
