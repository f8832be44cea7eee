"""Seed 003's protocols: message sizes as in notes section 3.5, no raw row leaving a client,
constrained runs meeting ``loss <= U``, the baselines, backends and errors."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

import fedmodel as fm
from fedmodel.errors import ModelError, UnsupportedError
from fedmodel.losses import SwishMLP

P, J, L = 6, 4, 3
ROWS = (29, 31, 37)  # primes: no payload dimension can be a client's row count by accident
N_V = 41


def labels_of(X):
    return (X[:, 0] > 0).astype(int) + (X[:, 1] + X[:, 2] > 0.5).astype(int)


def sample_model(**kw):
    rng = np.random.default_rng(0)
    model = fm.LearningModel(SwishMLP(P=P, J=J, L=L), **kw)
    for k, n in enumerate(ROWS):
        X = rng.normal(size=(n, P))
        model.client(f"c{k}", X, labels_of(X))
    return model


BLOCKS = [[0, 3], [1, 2, 5], [4]]


def feature_model(**kw):
    rng = np.random.default_rng(1)
    X = rng.normal(size=(N_V, P))
    model = fm.LearningModel(SwishMLP(P=P, J=J, L=L), **kw)
    model.vertical(X, labels_of(X), BLOCKS, test=(X[:11], labels_of(X[:11])))
    return model


def algorithm_rows(res, round_=2):
    return [r for r in res.ledger if r["channel"] == "algorithm" and r["round"] == round_]


D = J * (P + L)
D0 = L * J


# -- message sizes (notes 3.5) -------------------------------------------------------------------
def test_algorithm1_and_2_message_sizes():
    res = sample_model().solve("ssca", rounds=3, batch_size=5, eval_every=0)
    rows = algorithm_rows(res)
    assert Counter(r["floats"] for r in rows if r["receiver"] == "server") == {D: 3}
    assert Counter(r["floats"] for r in rows if r["sender"] == "server") == {D: 3}
    assert res.extra["per_round"]["floats_up"] == 3 * D
    assert res.extra["per_round"]["per_client"]["c0"]["samples"] == 5

    m = sample_model(objective="norm")
    m.constrain_loss(0.5)  # the server's constraint: every client uploads d + 1 (Alg. 2, M = 1)
    rows = algorithm_rows(m.solve("ssca", rounds=3, batch_size=5, eval_every=0))
    assert Counter(r["floats"] for r in rows if r["receiver"] == "server") == {D + 1: 3}

    m = sample_model()
    m.constrain_loss(0.5, party="c1")  # a client's own constraint: only c1 adds its value
    rows = algorithm_rows(m.solve("ssca", rounds=3, batch_size=5, eval_every=0))
    up = {r["sender"]: r["floats"] for r in rows if r["receiver"] == "server"}
    assert up == {"c0": D, "c1": D + 1, "c2": D}


@pytest.mark.parametrize("constrained", [False, True])
def test_algorithm3_and_4_message_sizes(constrained):
    m = feature_model(objective="norm" if constrained else "loss")
    if constrained:
        m.constrain_loss(0.6)
    B = 7
    res = m.solve("ssca", rounds=3, batch_size=B, eval_every=0)
    rows = algorithm_rows(res)
    d_i = {f"client{k}": J * len(b) for k, b in enumerate(BLOCKS)}
    down = {r["receiver"]: r["floats"] for r in rows if r["sender"] == "server" and r["floats"]}
    assert down == {n: B + D0 + d for n, d in d_i.items()}  # N^(t), omega_0, omega_i
    peer = [r for r in rows if r["sender"] != "server" and r["receiver"] != "server"]
    assert len(peer) == 3 * 2 and all(r["floats"] == B * J for r in peer)  # h_{0,i}: B x H_0
    up = {r["sender"]: r["floats"] for r in rows if r["kind"] == "fb_grad_reply"}
    extra = 1 if constrained else 0
    assert up == {
        "client0": D0 + d_i["client0"] + extra,
        "client1": d_i["client1"],
        "client2": d_i["client2"],
    }


def test_no_raw_row_leaves_a_client():
    """Only batch sums (sample-based) and h's of the batch (feature-based) travel; Remark 4's
    one-step collection does send the raw features (footnote 16), and is flagged."""
    sm = sample_model()
    res = sm.solve("ssca", rounds=4, batch_size=5, eval_every=2)
    shapes = [s for r in res.ledger for s in r["shapes"].values()]
    assert all(n not in s for s in shapes for n in ROWS)
    for m in ("fedavg-sgd", "sgd-m"):
        res = sm.solve(m, rounds=2, batch_size=5, local_steps=2, eval_every=0)
        assert all(s in ((D,), ()) for r in res.ledger for s in r["shapes"].values())

    fm_ = feature_model()
    res = fm_.solve("ssca", rounds=3, batch_size=7, eval_every=0)
    algo = [s for r in res.ledger if r["channel"] == "algorithm" for s in r["shapes"].values()]
    widths = {len(b) for b in BLOCKS}
    assert not any(len(s) == 2 and s[1] in widths for s in algo)  # no (rows, P_i) array
    with pytest.warns(UserWarning, match="raw features"):
        leaky = fm_.solve("ssca", rounds=1, batch_size=7, eval_every=0, one_step=True)
    assert "raw features" in leaky.extra["privacy"]
    jac = [r for r in leaky.ledger if r["kind"] == "fb_onestep_reply"]
    assert {r["shapes"]["jac"] for r in jac} == {(7, len(b)) for b in BLOCKS}


def test_one_step_collection_gives_the_same_iterates():
    m = feature_model()
    a = m.solve("ssca", rounds=5, batch_size=7, eval_every=0)
    with pytest.warns(UserWarning, match="Remark 4"):
        b = m.solve("ssca", rounds=5, batch_size=7, eval_every=0, one_step=True)
    assert np.allclose(a.x, b.x, rtol=1e-12, atol=1e-14)


def test_feature_ssca_equals_sample_ssca_on_the_same_batches():
    """With the full batch, Algorithm 3's assembled gradient is the pooled one, so one
    feature-based round equals the pooled gradient step."""
    m = feature_model()
    w0 = m.loss.init(0)
    res = m.solve(
        "ssca", rounds=1, batch_size=N_V, rho=1.0, gamma=1.0, tau=0.5, w0=w0, eval_every=0
    )
    g = m.loss.value_and_grad(w0, m.X, m.Y)[1] / N_V
    assert np.allclose(res.x, w0 - g, atol=1e-13)


# -- constrained runs --------------------------------------------------------------------------
@pytest.mark.parametrize(
    "partition, penalties", [("sample", (10.0, 100.0, 1e5)), ("feature", (3.0, 10.0, 1e5))]
)
def test_constrained_run_meets_the_bound_and_slack_vanishes_as_c_grows(partition, penalties):
    """min ||w||^2 s.t. F(w) <= U (40): a small c lets the norm win (w = 0 is a stationary
    point of the bias-free MLP, loss log 3), the slack shrinks as c grows, and c = 1e5
    (the paper's) ends feasible."""
    U = 0.6
    make = sample_model if partition == "sample" else feature_model
    kw = dict(rounds=300, batch_size=20, rho=(1.0, 0.5), gamma=(1.0, 0.6), tau=0.5, eval_every=0)
    slacks, losses = [], []
    for c in penalties:
        m = make(objective="norm")
        m.constrain_loss(U)
        res = m.solve("ssca", c=c, **kw)
        slacks.append(float(res.extra["slack"][0]))
        losses.append(res.history[-1]["train_loss"])
    assert losses[-1] <= U + 1e-3
    assert slacks[0] > slacks[1] >= slacks[2] and slacks[2] < 1e-6
    assert losses[0] > U  # a weak penalty leaves the constraint violated


def test_constrained_loss_objective_uses_the_dual_solver_and_cvxpy_agrees():
    m = sample_model(lam=1e-3)
    m.constrain_loss(0.7)
    m.constrain_loss(0.8, party="c2")
    kw = dict(rounds=4, batch_size=5, eval_every=0, tau=0.5)
    a = m.solve("ssca", server_solver="dual", **kw)
    b = m.solve("ssca", server_solver="cvxpy", **kw)
    assert np.allclose(a.x, b.x, atol=1e-6)


# -- baselines -----------------------------------------------------------------------------------
def test_fedsgd_round_is_the_weighted_gradient_step():
    m = fm.LearningModel(SwishMLP(P=P, J=J, L=L))
    rng = np.random.default_rng(2)
    for k in range(2):
        X = rng.normal(size=(13, P))
        m.client(f"c{k}", X, labels_of(X))
    w0 = m.loss.init(1)
    res = m.solve("fedsgd", rounds=1, batch_size=13, lr=0.2, w0=w0, eval_every=0)
    X = np.vstack([X for X, _ in m.clients.values()])
    Y = np.concatenate([Y for _, Y in m.clients.values()])
    g = m.loss.value_and_grad(w0, X, Y)[1] / len(X)
    assert np.allclose(res.x, w0 - 0.2 * g, atol=1e-13)


def test_vertical_sgd_equals_fedsgd_on_the_full_batch():
    m = feature_model()
    w0 = m.loss.init(0)
    res = m.solve("vertical-sgd", rounds=1, batch_size=N_V, lr=0.3, w0=w0, eval_every=0)
    g = m.loss.value_and_grad(w0, m.X, m.Y)[1] / N_V
    assert np.allclose(res.x, w0 - 0.3 * g, atol=1e-13)
    mom = m.solve("vertical-sgd-m", rounds=2, batch_size=N_V, w0=w0, eval_every=0)
    assert mom.options["lr"] == (0.3, 0.0) and mom.options["momentum"] == 0.1


# -- backends --------------------------------------------------------------------------------------
def test_processes_backend_gives_the_same_iterates_with_peer_messages():
    m = feature_model()
    kw = dict(rounds=3, batch_size=7, eval_every=0)
    serial = m.solve("ssca", **kw)
    procs = m.solve("ssca", backend="processes", workers=2, **kw)
    assert np.array_equal(serial.x, procs.x)
    assert serial.communication["floats_peer"] == procs.communication["floats_peer"] > 0


# -- errors ----------------------------------------------------------------------------------------
def test_errors_name_what_is_wrong():
    m = sample_model()
    with pytest.raises(ModelError, match="exceeds the rows"):
        m.solve("ssca", batch_size=30)
    m.constrain_loss(0.5)
    with pytest.raises(UnsupportedError, match="no constraint handling"):
        m.solve("fedavg-sgd")
    with pytest.raises(UnsupportedError, match="sample-based"):
        feature_model().solve("fedavg-sgd")
    with pytest.raises(ModelError, match="unknown option"):
        sample_model().solve("ssca", step=0.1)
    with pytest.raises(ModelError, match="step sizes fail"):
        sample_model().solve("ssca", check_schedules="raise")
    with pytest.raises(ModelError, match="trivial solution"):
        sample_model(objective="norm").solve("ssca")
    with pytest.raises(ModelError, match="unknown party"):
        sample_model().constrain_loss(0.1, party="nobody")
    from fedmodel.losses import CallableLoss

    plain = fm.LearningModel(CallableLoss(2, lambda w, X, Y: (X @ w, X)))
    with pytest.raises(ModelError, match="FeatureSplitLoss"):
        plain.vertical(np.ones((3, 2)), np.ones(3), [[0], [1]])
    # a cvxpy model cannot be trained by a learning method
    import cvxpy as cp

    cvx = fm.Model("m")
    w = cvx.variable(2, name="w")
    cvx.client("a").minimize(cp.sum_squares(w))
    with pytest.raises(UnsupportedError, match="LearningModel"):
        cvx.solve("ssca")


def test_result_fields_and_schedule_report():
    res = sample_model().solve("ssca", rounds=5, batch_size=5, eval_every=2)
    assert res.status == "max_iterations"
    assert [r["round"] for r in res.history] == [0, 2, 4, 5]
    assert res.rounds == {"outer": 5, "communication": 5}
    assert not res.extra["schedule_conditions"]["satisfied"]  # the paper's schedules fail (6)
    assert res.extra["gradient_norm"] > 0
    assert "train_accuracy" in res.history[-1]


# -- on the driver: checkpoints, resume, time limit, failures ----------------------------------
@pytest.mark.parametrize("make", [sample_model, feature_model])
def test_checkpoint_and_resume_repeat_the_uninterrupted_run(tmp_path, make):
    kw = dict(batch_size=7, eval_every=2, seed=3)
    full = make().solve("ssca", rounds=6, **kw)
    # a run of 3 rounds checkpointed after round 2, resumed to 6 rounds
    first = make().solve("ssca", rounds=3, checkpoint=tmp_path / "ck", checkpoint_every=2, **kw)
    assert first.checkpoint is not None
    resumed = make().solve("ssca", rounds=6, resume=tmp_path / "ck", **kw)
    assert np.array_equal(resumed.x, full.x)
    assert [r["round"] for r in resumed.history] == [r["round"] for r in full.history]
    with pytest.raises(Exception, match="batch_size|options"):
        make().solve("ssca", rounds=6, resume=tmp_path / "ck", batch_size=5, eval_every=2)


@pytest.mark.timing
def test_time_limit_and_client_failure_statuses():
    res = sample_model().solve("ssca", rounds=10_000, batch_size=5, time_limit=0.3, eval_every=0)
    assert res.status == "time_limit" and 0 < res.rounds["outer"] < 10_000
    from fedmodel.algorithms.ssca import run as ssca_run
    from fedmodel.runtime.faults import Fault

    m = sample_model()
    factories, server = ssca_run._build(m, "ssca", _opts(rounds=5, batch_size=5))
    from fedmodel.algorithms.driver import run_federated

    out = run_federated(
        None,
        server.options,
        "ssca",
        server,
        factories,
        faults={"c1": Fault("raise", round=3, kinds=("ssca_w",))},
    )
    assert out.status == "client_failure" and out.failure["client"] == "c1"
    assert np.all(np.isfinite(out.x))


def _opts(**kw):
    from fedmodel.algorithms.ssca.options import SSCAOptions

    o = SSCAOptions(**kw)
    o.validate()
    return o


def test_gradient_norm_decreases_under_schedules_meeting_4_and_6():
    """Theorem 1 is asymptotic (almost-sure convergence to stationary points); on a small
    non-convex problem the full gradient shrinks along the run with schedules satisfying
    (4) and (6) (rho = t^-0.4, gamma = t^-0.55)."""
    m = sample_model()
    kw = dict(batch_size=10, rho=(1.0, 0.4), gamma=(1.0, 0.55), tau=0.1, eval_every=0)
    norms = []
    for T in (1, 1000, 3000):
        res = m.solve("ssca", rounds=T, keep_ledger=False, **kw)
        assert res.extra["schedule_conditions"]["satisfied"]
        norms.append(res.extra["gradient_norm"])
        assert res.kkt.stationarity <= norms[-1]  # inf-norm <= 2-norm
    assert norms[1] < 0.25 * norms[0] and norms[2] < norms[1]


def test_rows_of_the_wrong_width_are_refused_by_name():
    """MNIST's loader appends an intercept (785 columns) against SwishMLP(P=784): a clear
    error at declaration, not a client failure from a matmul inside the solve."""
    X = np.zeros((4, 785))
    model = fm.LearningModel(SwishMLP(P=784, J=4, L=10))
    with pytest.raises(ModelError, match="client 'c0': X has 785 columns.*intercept"):
        model.client("c0", X, np.zeros(4, dtype=int))
    with pytest.raises(ModelError, match="vertical"):
        model.vertical(X, np.zeros(4, dtype=int), blocks=[range(392), range(392, 784)])
    with pytest.raises(ModelError, match="the test set"):
        model.set_test(X[:, :3], np.zeros(4, dtype=int))
