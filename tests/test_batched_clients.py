"""Clients of one structure answer exact-admm's rounds in one batched step
(``batch_clients``): the same rounds and statuses as every client on its own, points within
the steps' tolerances, cohorts split where a party's structure differs, and a failure in a
batch is still its own party's."""

import cvxpy as cp
import numpy as np
import pytest

import fedmodel as fm
import fedmodel.subproblems.batched_glm as batched_glm
from fedmodel.runtime.host import PartyHost


def _model(n=12, d=4, kind="ls", constrained=(), seed=0):
    rng = np.random.default_rng(seed)
    m = fm.Model("cohort")
    w = m.variable(d, name="w")
    N = 15 * n
    for k in range(n):
        X = rng.normal(size=(15, d))
        y = X @ rng.normal(size=d) + 0.3 * rng.normal(size=15)
        c = m.client(f"c{k}")
        A = c.data(X, name="X")
        if kind == "ls":
            c.minimize(cp.sum_squares(A @ w - c.data(y, name="y")) / N)
        else:
            c.minimize(cp.sum(cp.logistic(-cp.multiply(c.data(np.sign(y), name="y"), A @ w))) / N)
        if k in constrained:
            c.subject_to(cp.sum(w) <= 1.0)
    m.server.subject_to([w <= 0.5, w >= -0.5])
    return m


@pytest.fixture
def batches(monkeypatch):
    """The size of every batched solve."""
    sizes = []
    prox = batched_glm.GLMCohort.prox

    def spy(self, *args, **kwargs):
        sizes.append(self.size)
        return prox(self, *args, **kwargs)

    monkeypatch.setattr(batched_glm.GLMCohort, "prox", spy)
    return sizes


@pytest.mark.parametrize("kind", ["ls", "logistic"])
def test_a_batched_run_is_the_per_client_run(kind, batches):
    batched = _model(kind=kind).solve("prox-al", inner_solver="exact-admm", history=False)
    assert batches and set(batches) == {12}  # every round: all 12 clients in one solve
    single = _model(kind=kind).solve(
        "prox-al", inner_solver="exact-admm", history=False, batch_clients=False
    )
    assert batched.status == single.status == "optimal"
    assert batched.rounds == single.rounds
    # each step stops within its tolerance (<= eps) of the exact step, not at the same point
    assert np.abs(batched.x - single.x).max() <= 1e-3
    ref = _model(kind=kind).solve("centralized")
    assert abs(batched.objective - ref.objective) <= 1e-3 * max(1.0, abs(ref.objective))


def test_a_party_of_another_structure_splits_the_cohort(batches):
    res = _model(constrained=(5,)).solve("prox-al", inner_solver="exact-admm", history=False)
    assert res.status == "optimal"
    # c0..c4 and c6..c11 are batched together; c5 has a constraint and steps alone
    assert set(batches) == {11}


def test_batches_are_off_with_a_client_timeout_or_when_asked(batches):
    _model().solve("prox-al", inner_solver="exact-admm", history=False, client_timeout=60)
    _model().solve("prox-al", inner_solver="exact-admm", history=False, batch_clients=False)
    assert batches == []
    with pytest.raises(fm.ModelError, match="batch_clients must be True or False"):
        _model().solve("prox-al", batch_clients="yes")


def test_a_batch_that_fails_is_handled_one_message_at_a_time(monkeypatch):
    """A batch raising leaves every party as it was; each message is then handled on its
    own, so a party's own failure is blamed on it alone."""

    def broken(self, *args, **kwargs):
        raise FloatingPointError("batched solve failed")

    monkeypatch.setattr(batched_glm.GLMCohort, "prox", broken)
    res = _model().solve("prox-al", inner_solver="exact-admm", history=False)
    ref = _model().solve("prox-al", inner_solver="exact-admm", history=False, batch_clients=False)
    assert res.status == "optimal" and res.rounds == ref.rounds
    assert np.array_equal(res.x, ref.x)  # the per-party path, bit for bit


def test_the_host_groups_parties_by_key_and_answers_in_message_order():
    class Stack:
        def __init__(self, key):
            self.key = key

        def batch_key(self, msg):
            return self.key

        @staticmethod
        def handle_batch(eps, msgs):
            return [f"batched {m.receiver}" for m in msgs]

        def handle(self, msg):
            return f"alone {msg.receiver}"

    from fedmodel.runtime.messages import Message

    seen = []

    class Counted(Stack):
        @staticmethod
        def handle_batch(eps, msgs):
            seen.append([m.receiver for m in msgs])
            return Stack.handle_batch(eps, msgs)

    parties = {"a": Counted(1), "b": Counted(2), "c": Counted(None), "d": Counted(1)}
    host = PartyHost(endpoints=parties)
    msgs = [Message("k", "server", n, {}) for n in "abcd"]
    out = host.run(msgs)
    assert [o.reply for o in out] == ["batched a", "batched b", "alone c", "batched d"]
    assert [o.name for o in out] == list("abcd")
    assert seen == [["a", "d"], ["b"]]
    # with a client_timeout every step is its own
    seen.clear()
    assert [o.reply for o in host.run(msgs, timeout=5.0)] == [f"alone {n}" for n in "abcd"]
    assert seen == []


def test_a_faulty_party_steps_alone_when_its_fault_is_due_and_batched_otherwise(batches):
    """A party wrapped with a fault takes the batched path while its fault is not due (in
    a cohort of its own: its endpoint is of another class), and a party's batched numbers
    do not depend on its cohort, so a run whose failed step is retried repeats the run
    without the fault bit for bit."""
    from fedmodel.algorithms.proxal.options import ProxALOptions
    from fedmodel.algorithms.proxal.server import run_prox_al
    from fedmodel.runtime.faults import Fault

    opts = dict(inner_solver="exact-admm", history=False)
    ref = _model().solve("prox-al", **opts)
    batches.clear()
    fault = Fault("raise", round=6, kinds=("xadmm_w",))
    res = run_prox_al(
        _model().compile(),
        ProxALOptions(on_failure="retry", retries=1, **opts),
        faults={"c3": fault},
    )
    assert res.status == "optimal" and res.extra["retries"]
    assert res.rounds == ref.rounds
    np.testing.assert_array_equal(res.x, ref.x)
    # the eleven others in one batch, c3 in its own
    assert set(batches) == {11, 1}


def _clients(model, **options):
    from fedmodel.algorithms.proxal.client import ProxALClient
    from fedmodel.algorithms.proxal.options import ProxALOptions

    progs = model.compile().clients
    opts = ProxALOptions(**options)
    return [ProxALClient(p, opts, rho=1.0, n_clients=len(progs)) for p in progs]


@pytest.mark.parametrize("kind", ["ls", "logistic"])
@pytest.mark.parametrize("at", ["generic", "near-zero"])
def test_a_batched_evaluation_is_each_party_s_own(kind, at):
    """The certificate's evaluation of clients of one structure from one batched value and
    gradient: every field each party reports on its own, to rounding (the boundary
    relief's terms too, when coordinates sit at 0)."""
    from fedmodel.algorithms.proxal.client import ProxALClient

    halves = _clients(_model(n=6, kind=kind, seed=3))
    keys = {h.step_batch_key("evaluate") for h in halves}
    assert len(keys) == 1 and None not in keys
    w = np.array([0.3, -0.2, 0.1, 0.05])
    if at == "near-zero":
        w[[0, 2]] = [0.0, 1e-10]
    payloads = [{"w": w, "objective_scale": 2.0} for _ in halves]
    batched = ProxALClient._on_evaluate_batch(halves, payloads)
    assert all(h.glm_verified for h in halves)
    for half, got in zip(halves, batched):
        own = half._on_evaluate(w, objective_scale=2.0)
        assert set(got) == set(own)
        assert ("boundary_grad" in own) == (at == "near-zero")
        for field, value in own.items():
            ref = np.asarray(value, dtype=float)
            assert np.shape(got[field]) == ref.shape, field
            tol = 1e-12 * max(1.0, float(np.abs(ref).max(initial=0.0)))
            assert np.abs(np.asarray(got[field], dtype=float) - ref).max(initial=0.0) <= tol


def test_only_plain_objective_parties_are_evaluated_in_a_batch():
    """A client with a constraint, with a restricted-domain term or with batches off is
    evaluated on its own."""
    halves = _clients(_model(n=3, constrained=(1,)))
    assert halves[0].step_batch_key("evaluate") is not None
    assert halves[1].step_batch_key("evaluate") is None
    # (the final report: stacked for a client without multipliers, on its own otherwise)
    assert halves[0].step_batch_key("report") is not None
    assert halves[1].step_batch_key("report") is None
    assert all(
        h.step_batch_key("evaluate") is None for h in _clients(_model(n=2), batch_clients=False)
    )
    m = fm.Model("entropy")
    w = m.variable(3, name="w")
    c = m.client("c0")
    c.minimize(-cp.sum(cp.entr(w)) + cp.sum_squares(c.data(np.eye(3), name="X") @ w))
    assert _clients(m)[0].step_batch_key("evaluate") is None


def test_a_run_evaluates_its_clients_in_one_batch(monkeypatch):
    import fedmodel.algorithms.proxal.client as client_module

    sizes = []

    def spy(evaluations):
        def batched(value_grad, X):
            sizes.append(X.shape[0])
            return evaluations(value_grad, X)

        return batched

    # (message by message batched, or in one stacked step: either evaluates all 12 at once)
    for name in ("plain_objective_evaluations", "plain_objective_rows"):
        monkeypatch.setattr(client_module, name, spy(getattr(client_module, name)))
    res = _model(kind="logistic").solve("prox-al", history=False)
    assert res.status == "optimal"
    assert sizes and set(sizes) == {12}


@pytest.mark.parametrize("kind", ["ls", "logistic"])
def test_a_batched_start_is_each_party_s_own(kind):
    """``start`` of clients of one structure: each client's share of the objective's scale
    from one batched computation equals its own ``objective_reference`` (to rounding), and
    each client's route starts as on its own."""
    from fedmodel.algorithms.proxal.client import ProxALClient
    from fedmodel.certificate.scale import objective_reference

    halves = _clients(_model(n=5, kind=kind, seed=4))
    for h in halves:
        h.use_route("exact-admm")
    w = np.array([0.2, 0.0, -0.4, 1.5])
    replies = ProxALClient._on_start_batch(halves, [{"w": w} for _ in halves])
    for h, reply in zip(halves, replies):
        own = objective_reference(h.program, w)
        assert abs(reply["objective_reference"] - own) <= 1e-12 * own
        assert reply["exact"] is True and np.array_equal(h.w_center, w)
    probing = _clients(_model(n=2, kind=kind))
    assert probing[0].route.probes or probing[0].step_batch_key("start") is not None
    for h in probing:
        h.use_route("quasi-newton")
    assert probing[0].step_batch_key("start") is None
    with pytest.raises(ValueError, match="probes"):
        ProxALClient._on_start_batch(probing, [{"w": w} for _ in probing])


@pytest.mark.parametrize("backend", ["processes", "ray"])
def test_workers_batch_their_parties_and_give_the_serial_iterates(backend):
    """A worker process or a Ray actor answers its parties' round (one call, or one task
    without a client_timeout) and batches the steps that stack there: each party's numbers
    do not depend on its cohort, so the run repeats the serial one bit for bit."""
    if backend == "ray":
        pytest.importorskip("ray")
    serial = _model(kind="logistic").solve("prox-al", history=False)
    workers = _model(kind="logistic").solve("prox-al", history=False, backend=backend, workers=2)
    assert workers.status == serial.status == "optimal"
    assert workers.rounds == serial.rounds
    np.testing.assert_array_equal(workers.x, serial.x)


def test_a_stacked_report_round_is_the_message_by_message_one(monkeypatch):
    """The final report of clients without multipliers in one stacked step: the Result's
    multipliers, local iterations and the report's ledger rows are those of the round sent
    message by message; the Result reads the stacked round's columns, making no message
    per client."""
    from fedmodel.algorithms.proxal.client import ProxALClient
    from fedmodel.runtime.rows import RoundReplies

    def report_rows(model):
        res = model.solve("prox-al", inner_solver="exact-admm", history=False)
        rows = [r for r in res.ledger if r["kind"].startswith("report")]
        return res, rows

    step, sizes = ProxALClient._on_report_rows, []

    def spy(halves, fields):
        sizes.append(len(halves))
        return step(halves, fields)

    monkeypatch.setattr(ProxALClient, "_on_report_rows", staticmethod(spy))
    made = []  # (the kinds of stacked rounds whose replies' messages were made)
    make, read = RoundReplies._make_all, RoundReplies.__getitem__
    monkeypatch.setattr(RoundReplies, "_make_all", lambda r: made.append(r.kind) or make(r))
    monkeypatch.setattr(RoundReplies, "__getitem__", lambda r, n: made.append(r.kind) or read(r, n))
    stacked, stacked_rows = report_rows(_model(n=4))
    assert sizes == [4]
    assert not [k for k in made if k.startswith("report")]  # (the result reads the columns)

    def refuse(halves, fields):
        raise ValueError("one message at a time")

    monkeypatch.setattr(ProxALClient, "_on_report_rows", staticmethod(refuse))
    single, single_rows = report_rows(_model(n=4))
    assert stacked.status == single.status == "optimal"
    assert stacked_rows == single_rows and len(stacked_rows) == 8
    assert stacked.timing["local_iterations"] == single.timing["local_iterations"]
    assert stacked.timing["per_party"].keys() == single.timing["per_party"].keys()
    assert stacked.multipliers.keys() == single.multipliers.keys()
    for party, blocks in single.multipliers.items():
        for label, value in blocks.items():
            assert np.array_equal(stacked.multipliers[party][label], value)


def test_built_clients_keep_their_own_multipliers_and_share_only_empty_blocks():
    from fedmodel.algorithms.proxal.client import ProxALClient
    from fedmodel.algorithms.proxal.options import ProxALOptions

    programs = _model(n=4, constrained=(1, 2)).compile().clients
    opts = ProxALOptions(inner_solver="exact-admm")
    c = [ProxALClient(p, opts, 1.0, 4, route="exact-admm") for p in programs]
    # without constraints: empty blocks (nothing can write into them)
    for k in (0, 3):
        assert c[k].mu.size == c[k].problem.mu[0].size == c[k].theta_center.size == 0
    # with constraints: each client's multipliers its own, written apart
    one, two = c[1].problem.mu[0], c[2].problem.mu[0]
    assert one.shape == two.shape == (1,) and one is not two
    one[:] = 2.0
    assert two[0] == 0.0 and c[1].mu is not c[2].mu
    # a new client's exact-admm part has no point and no check state yet
    assert all(h.inner.u is None and h.inner.checked is None for h in c)
