"""A round whose requests differ in rows of stacked arrays (``Runtime.broadcast_rows``):
on the serial backend exact-admm's rounds take the stacked path, with the iterates, the
ledger and the verdicts of the message-by-message path; a stacked step that raises, or
replies that the stacked check refuses, fall back to the message path."""

from types import SimpleNamespace

import cvxpy as cp
import numpy as np
import pytest

import fedmodel as fm
import fedmodel.runtime.base as runtime_base
import fedmodel.runtime.rows as rows_module
from fedmodel.algorithms.proxal.client import ProxALClient
from fedmodel.algorithms.proxal.exact_admm import ExactClient, _cohort_deadline, _Stacked
from fedmodel.runtime.messages import CountingLedger, Ledger, Message, measure
from fedmodel.runtime.rows import RoundReplies, Rows, payloads_of, record_round, rows_subset


def _model(n=8, d=4, seed=1):
    """Least squares over ``n`` clients of 12 or 15 rows (two cohorts), a server box."""
    rng = np.random.default_rng(seed)
    m = fm.Model("rows")
    w = m.variable(d, name="w")
    sizes = [12 if k % 2 else 15 for k in range(n)]
    total = sum(sizes)
    for k, rows in enumerate(sizes):
        X = rng.normal(size=(rows, d))
        y = X @ rng.normal(size=d) + 0.3 * rng.normal(size=rows)
        c = m.client(f"c{k}")
        c.minimize(cp.sum_squares(c.data(X, name="X") @ w - c.data(y, name="y")) / total)
    m.server.subject_to([w <= 0.4, w >= -0.4])
    return m


#: the kinds of these runs whose clients answer in one stacked step (exact-admm's, and
#: prox-al's start, outer rounds, certificate evaluations and final reports of clients
#: without constraints)
STACKED_KINDS = ("start", "xadmm_w", "outer", "outer_aa", "evaluate", "report")


@pytest.fixture
def stacked_rounds(monkeypatch):
    """Whether each round of a kind with a stacked step took the stacked path (a round of
    another kind never does)."""
    taken = []
    exchange = rows_module.exchange_rows

    def spy(*args):
        out = exchange(*args)
        if args[1] in STACKED_KINDS:
            taken.append(out is not None)
        else:
            assert out is None, args[1]
        return out

    monkeypatch.setattr(runtime_base, "exchange_rows", spy)
    return taken


def _solve(**kw):
    return _model().solve("prox-al", inner_solver="exact-admm", **kw)


@pytest.mark.parametrize("time_limit", [None, 600.0])  # (with one: each step's budget)
def test_a_stacked_run_is_the_message_by_message_run(time_limit, stacked_rounds, monkeypatch):
    stacked = _solve(time_limit=time_limit)
    assert stacked_rounds and all(stacked_rounds)
    monkeypatch.setattr(runtime_base, "exchange_rows", lambda *args: None)
    messages = _solve(time_limit=time_limit)
    assert stacked.status == messages.status == "optimal"
    assert stacked.rounds == messages.rounds
    assert np.array_equal(stacked.x, messages.x)  # bit for bit
    assert stacked.ledger == messages.ledger  # every message's row, in the same order
    assert stacked.communication == messages.communication


def test_a_counting_ledger_counts_a_stacked_round_as_its_messages(monkeypatch):
    stacked = _solve(keep_ledger=False)
    monkeypatch.setattr(runtime_base, "exchange_rows", lambda *args: None)
    messages = _solve(keep_ledger=False)
    assert stacked.communication == messages.communication


def test_a_stacked_step_that_raises_falls_back_to_the_message_path(stacked_rounds, monkeypatch):
    reference = _solve()
    stacked_rounds.clear()
    step = ExactClient._on_xadmm_w_rows

    def broken(parts, fields):
        if not isinstance(fields["sigma"], Rows):  # (the stacked round's call, not a batch's)
            raise ValueError("no stacked step here")
        return step(parts, fields)

    monkeypatch.setattr(ExactClient, "_on_xadmm_w_rows", staticmethod(broken))
    kinds = []
    exchange = rows_module.exchange_rows

    def by_kind(*args):
        out = exchange(*args)
        kinds.append((args[1], out is not None))
        return out

    monkeypatch.setattr(runtime_base, "exchange_rows", by_kind)
    res = _solve()
    assert any(k == "xadmm_w" for k, _ in kinds)
    assert not any(taken for k, taken in kinds if k == "xadmm_w")
    # (the message path's batches read the same rows: nothing changed)
    assert res.status == "optimal" and res.rounds == reference.rounds
    assert np.array_equal(res.x, reference.x)


def test_a_stacked_reply_the_check_refuses_fails_its_own_party(monkeypatch):
    step = ExactClient._on_xadmm_w_rows

    def corrupt(parts, fields):
        out = step(parts, fields)
        names = [p.host.name for p in parts]
        if "c3" in names:
            out["x"][names.index("c3")] = np.nan
        return out

    monkeypatch.setattr(ExactClient, "_on_xadmm_w_rows", staticmethod(corrupt))
    stacked = _solve()
    assert stacked.status == "client_failure"
    assert stacked.failure["clients"] == ["c3"] and stacked.failure["kind"] == "invalid_reply"
    assert "field 'x' is not finite" in stacked.failure["error"]
    # (the message path's batches read the same corrupted rows: the same verdict)
    monkeypatch.setattr(runtime_base, "exchange_rows", lambda *args: None)
    messages = _solve()
    assert messages.failure == stacked.failure and messages.message == stacked.message


def test_round_replies_read_as_messages_and_stacked():
    X = np.arange(6.0).reshape(3, 2)
    replies = RoundReplies(["a", "b", "c"], stacked={"x": X}, kind="k_reply", round=4)
    assert list(replies) == ["a", "b", "c"] and len(replies) == 3
    b = replies["b"]
    assert (b.kind, b.sender, b.receiver, b.round) == ("k_reply", "b", "server", 4)
    assert list(b.payload) == ["x"] and np.array_equal(b.payload["x"], X[1])
    stacked = replies.stack("x")
    assert np.array_equal(stacked, X) and stacked is not X  # (a copy: the server's own)
    by_message = RoundReplies(["a", "b"], messages={n: replies[n] for n in "ab"})
    assert np.array_equal(by_message.stack("x"), X[:2])


def test_final_reports_read_as_columns_whatever_the_round_s_path():
    """The result reads the clients' final reports (driver._report_columns) the same from
    a stacked round in the clients' order, one in another order with a client missing, and
    the replies' messages: the clients that sent one, in order, and their fields."""
    from fedmodel.algorithms.driver import _report_columns

    clients = [SimpleNamespace(name=n) for n in "abcd"]
    fields = {
        "mu": np.arange(8.0).reshape(4, 2),
        "nu": np.zeros((4, 0)),
        "seconds": np.array([0.5, 1.0, 1.5, 2.0]),
        "local_iterations": np.array([3, 4, 5, 6]),
    }
    stacked = RoundReplies(list("abcd"), stacked=fields)
    columns = _report_columns(stacked, clients)
    assert columns[0] == clients and columns[4] == [0.5, 1.0, 1.5, 2.0]
    assert columns[5] == [3, 4, 5, 6] and columns[3] == [None] * 4
    assert np.array_equal(columns[1][2], [4.0, 5.0])
    order = [3, 0, 1]
    other = RoundReplies(["d", "a", "b"], stacked={k: v[order] for k, v in fields.items()})
    by_message = RoundReplies(["d", "a", "b"], messages={n: other[n] for n in "dab"})
    for replies in (other, by_message):
        sent, mus, nus, cones, seconds, iterations = _report_columns(replies, clients)
        assert [c.name for c in sent] == ["a", "b", "d"] and seconds == [0.5, 1.0, 2.0]
        assert iterations == [3, 4, 6] and cones == [None] * 3 and len(nus) == 3
        assert all(np.array_equal(m, fields["mu"][i]) for m, i in zip(mus, (0, 1, 3)))
    assert _report_columns({}, clients) == ([],) * 6


def test_rows_fields_give_each_client_its_own_payload():
    fields = {"c": Rows(np.eye(3)), "sigma": 2.0, "budget": Rows([1.0, 2.0, 3.0])}
    payloads = payloads_of(fields, 3)
    assert [list(p) for p in payloads] == [["c", "sigma", "budget"]] * 3
    assert np.array_equal(payloads[2]["c"], [0, 0, 1]) and payloads[1]["budget"] == 2.0
    sub = rows_subset(fields, [2, 0])
    assert np.array_equal(sub["c"].values, np.eye(3)[[2, 0]]) and sub["budget"].values == [3.0, 1.0]
    with pytest.raises(ValueError, match="field 'c' has 3 rows for 2 clients"):
        payloads_of(fields, 2)


@pytest.mark.parametrize("ledger", [Ledger(), CountingLedger()])
def test_record_round_writes_what_recording_each_message_writes(ledger):
    by_message = type(ledger)()
    request, reply = {"c": np.zeros(3), "tol": 0.1}, {"x": np.zeros(3)}
    for n in ("a", "b"):
        by_message.record(Message("k", "server", n, request, 2))
        by_message.record(Message("k_reply", n, "server", reply, 2))
    record_round(
        ledger, ["a", "b"], (2, "k", "k_reply", "algorithm"), measure(request), measure(reply)
    )
    if isinstance(ledger, CountingLedger):
        assert ledger.counts == by_message.counts
    else:
        assert ledger.rows == by_message.rows


def test_a_cohort_step_has_its_clients_budgets_added_up(monkeypatch):
    """One batched step for a cohort may take the seconds its clients were granted one
    after another (read on a fixed clock); a bad budget names its party."""
    import fedmodel.algorithms.proxal.exact_admm as exact_admm

    monkeypatch.setattr(exact_admm, "time", SimpleNamespace(perf_counter=lambda: 100.0))
    hosts = [SimpleNamespace(name=n) for n in ("a", "b", "c")]
    assert _cohort_deadline(Rows([None, None, None]), hosts) is None
    assert _cohort_deadline(None, hosts) is None
    assert _cohort_deadline(Rows([5.0, None, 2.0]), hosts) == 107.0
    assert _cohort_deadline(1.5, hosts) == 104.5  # (one value for all three)
    with pytest.raises(ValueError, match="party 'b' got a time budget"):
        _cohort_deadline(Rows([5.0, -1.0, float("nan")]), hosts)
    with pytest.raises(ValueError, match="party 'a' got a time budget .field 'budget'. of -2.0"):
        _cohort_deadline(-2.0, hosts)
    # (one value for all is the same sum as those values as rows, bad ones named alike)
    many = [SimpleNamespace(name=f"p{i}") for i in range(1001)]
    for seconds in (0.1, 1e-3 / 3, 0.0, 7.25):
        assert _cohort_deadline(seconds, many) == _cohort_deadline(Rows([seconds] * 1001), many)
    assert _cohort_deadline(2, hosts) == 106.0
    for bad in (float("nan"), float("inf"), -1e-9):
        with pytest.raises(ValueError, match="party 'a' got a time budget"):
            _cohort_deadline(bad, hosts)


def test_stacked_evaluations_are_the_reports_row_by_row():
    """``plain_objective_rows`` holds ``plain_objective_evaluations``' reports as rows, the
    boundary relief's fields stacked when some party carries them."""
    from fedmodel.certificate.kkt import plain_objective_evaluations, plain_objective_rows

    def value_grad(Z):
        return (Z**2).sum(axis=1), 2.0 * Z

    relief_fields = {"boundary_grad", "boundary_scale", "boundary_mask"}
    for X in (np.array([[0.0, 2.0], [0.5, -1.0], [1e-12, 3.0]]), np.array([[0.5, -1.0]])):
        reports = plain_objective_evaluations(value_grad, X)
        fields, relief = plain_objective_rows(value_grad, X)
        assert relief.tolist() == ["boundary_grad" in r for r in reports]
        assert relief_fields <= set(fields) if relief.any() else not relief_fields & set(fields)
        for i, report in enumerate(reports):
            assert set(report) == set(fields) - (set() if relief[i] else relief_fields)
            for name, value in report.items():
                assert np.array_equal(fields[name][i], value), name


def test_a_stacked_run_counts_each_client_s_statistics_as_the_message_path(monkeypatch):
    """Each client's statistics (kept for a stacked round's clients in one Tally and
    added to theirs when read) are those the message path counts one by one."""
    stacked = _solve()
    monkeypatch.setattr(runtime_base, "exchange_rows", lambda *args: None)
    messages = _solve()
    assert stacked.timing["local_iterations"] == messages.timing["local_iterations"]
    assert all(stacked.timing["per_party"][f"c{k}"] > 0 for k in range(8))


def test_a_stacked_run_resumed_from_its_checkpoint_is_the_uninterrupted_run(tmp_path):
    """Each client's state saved after stacked steps (its point a row of its cohort's last
    stack) is its own: resuming repeats the uninterrupted run bit for bit."""
    from fedmodel.algorithms.proxal.options import ProxALOptions
    from fedmodel.algorithms.proxal.server import run_prox_al

    def run(**kw):
        return run_prox_al(
            _model().compile(), ProxALOptions(inner_solver="exact-admm", **kw), "prox-al"
        )

    reference = run()
    assert reference.status == "optimal" and reference.rounds["outer"] >= 2
    path = tmp_path / "ck"
    first = run(checkpoint=str(path), checkpoint_every=1, max_outer=1)
    assert first.status == "max_iterations"
    resumed = run(resume=str(path))
    assert np.array_equal(resumed.x, reference.x)
    assert resumed.rounds == reference.rounds and resumed.ledger == reference.ledger
    assert resumed.timing["local_iterations"] == reference.timing["local_iterations"]


def test_a_round_plan_is_kept_until_an_event_changes_it():
    """A stacked round's plan (owners, cohorts, checks) is made once for its halves and
    kept; a route change, a state put back or a client leaving the batches makes it anew,
    and a client whose form disagrees leaves its cohort."""
    from fedmodel.algorithms.protocol import RowsPlan
    from fedmodel.algorithms.proxal.client import ProxALClient
    from fedmodel.algorithms.proxal.options import ProxALOptions

    progs = _model().compile().clients
    opts = ProxALOptions(inner_solver="exact-admm")
    halves = [
        ProxALClient(p, opts, rho=1.0, n_clients=len(progs), route="exact-admm") for p in progs
    ]
    plan = RowsPlan.of(halves, "xadmm_w")
    assert plan is not None and RowsPlan.of(list(halves), "xadmm_w") is plan
    assert plan.cohorts is not None  # (the step's keys are stable: grouped once)
    assert RowsPlan.of(halves[:5], "xadmm_w") is not plan  # (other halves: another plan)
    plan = RowsPlan.of(halves, "xadmm_w")
    halves[3].use_route("exact-admm")  # (a route change)
    assert RowsPlan.of(halves, "xadmm_w") is not plan
    plan = RowsPlan.of(halves, "xadmm_w")
    halves[0].set_state(halves[0].get_state())  # (a state put back)
    assert RowsPlan.of(halves, "xadmm_w") is not plan
    halves[2].glm_disagrees = True  # (it leaves every batch: no stacked round for all)
    assert RowsPlan.of(halves, "xadmm_w") is None
    assert RowsPlan.of(halves[3:], "xadmm_w") is not None


def test_a_tally_adds_its_counts_to_each_half_s_own_statistics_when_read():
    """Counts kept for many halves are each half's: added when one reads its statistics,
    forgotten for a half whose statistics are replaced, and left where they were when a
    tally of another list replaces it."""
    from types import SimpleNamespace

    from fedmodel.algorithms.protocol import ClientHalf, Tally

    halves = [ClientHalf(SimpleNamespace(name=n)) for n in "abc"]
    tally = Tally.of(halves)
    tally.add("local_solves", 1, dtype=int)
    tally.add("local_iterations", np.array([3, 0, 5]), dtype=int)
    tally.maximum("gap", np.array([0.5, -np.inf, 2.0]))
    tally.add("missed", np.array([0, 1, 0]), dtype=int)
    fresh = ClientHalf(SimpleNamespace(name="fresh")).stats  # (what no tally added to)
    assert halves[0].stats == {**fresh, "local_solves": 1, "local_iterations": 3, "gap": 0.5}
    assert halves[1].stats == {**fresh, "local_solves": 1, "missed": 1}
    tally.maximum("gap", np.array([0.1, 0.2, 3.0]))
    halves[2].stats = {"local_solves": 7}  # (replaced: what the tally held for it is gone)
    assert halves[0].stats["gap"] == 0.5 and halves[1].stats["gap"] == 0.2
    assert halves[2].stats == {"local_solves": 7}
    tally.add("local_solves", 1, dtype=int)
    assert Tally.of(halves[::-1]) is not tally  # (another list of that length replaces it)
    assert [h.stats["local_solves"] for h in halves] == [2, 2, 8]


def test_a_stacked_outer_step_refuses_memories_of_different_lengths():
    """Clients of one stacked outer step whose outer Anderson memories differ in length
    (their ``gram`` replies would differ in shape) are refused before any state changes:
    the round then goes message by message."""
    from fedmodel.algorithms.proxal.client import ProxALClient

    halves = [
        SimpleNamespace(outer_anderson=2, outer_mem=[(np.zeros(0),) * 3], mu=np.zeros(0)),
        SimpleNamespace(outer_anderson=2, outer_mem=[], mu=np.zeros(0)),
    ]
    for step in (ProxALClient._on_outer_rows, ProxALClient._on_outer_aa_rows):
        with pytest.raises(ValueError, match="differ in length"):
            step(halves, {"w": np.zeros(3), "alpha": np.zeros(0), "reset": False})
        assert [len(h.outer_mem) for h in halves] == [1, 0]
        assert not any(hasattr(h, "mu_mark") for h in halves)


class _Host(SimpleNamespace):
    """A client half as exact-admm's stacked start reads it: its centre (written alone or
    with its cohort's, :class:`~fedmodel.algorithms.proxal.client.CentreRows`) as a
    client half keeps it."""

    w_center = ProxALClient.w_center
    centre_rows = staticmethod(ProxALClient.centre_rows)
    centre_writes = staticmethod(ProxALClient.centre_writes)


def test_a_stacked_start_hands_its_centres_to_its_clients_stack():
    hosts = [
        _Host(
            theta_at_w=theta, theta_center=np.zeros(len(theta)), prox_weight=1.0, max_local_iter=9
        )
        for theta in (np.zeros(0), np.array([1.0, 2.0]), np.zeros(0))
    ]
    for i, h in enumerate(hosts):
        h._centre_rows, h._centre_slot, h._centre_time, h._w_center = None, 0, 0, None
        h.w_center = np.full(2, -1.0 - i)
    parts = []
    for h in hosts:
        part = object.__new__(ExactClient)
        part.host, part._u, part._checked, part._stack, part._slot = h, None, None, None, 0
        part._u_time = part._checked_time = 0
        parts.append(part)
    stack = _Stacked(parts)
    # joining the stack keeps each client's centre as it was
    assert [h.w_center.tolist() for h in hosts] == [[-1.0] * 2, [-2.0] * 2, [-3.0] * 2]
    W = np.arange(6.0).reshape(3, 2)
    before = _Host.centre_writes()
    assert ExactClient.start_rows(parts, W, {})["exact"].tolist() == [True] * 3
    # one write of the cohort's centres, no pass over its clients; each reads its row
    assert _Host.centre_writes() == before + 1
    assert stack.centred == _Host.centre_writes() and np.array_equal(stack.centres(), W)
    assert all(np.array_equal(h.w_center, W[i]) for i, h in enumerate(hosts))
    # the own block's centre is a copy of the own block (none to copy without one)
    assert hosts[1].theta_center.tolist() == [1.0, 2.0]
    assert hosts[1].theta_center is not hosts[1].theta_at_w
    # a client's own write is its centre from then on, and the stack reads it
    hosts[2].w_center = np.array([7.0, 8.0])
    assert hosts[2].w_center.tolist() == [7.0, 8.0] and hosts[0].w_center.tolist() == [0.0, 1.0]
    assert stack.centres()[2].tolist() == [7.0, 8.0]
    # the same clients in another list: each writes its own, their stack reads them again
    ExactClient.start_rows(parts[::-1], W, {})
    assert [h.w_center.tolist() for h in hosts] == W[::-1].tolist()
    assert np.array_equal(stack.centres(), W[::-1])


def _exact_parts(n: int) -> list:
    """``n`` exact-admm client halves as a stacked start reads them, each its own
    centre ``-1 - i``."""
    parts = []
    for i in range(n):
        h = _Host(theta_at_w=np.zeros(0), theta_center=np.zeros(0), prox_weight=1.0)
        h.max_local_iter = 9
        h._centre_rows, h._centre_slot, h._centre_time, h._w_center = None, 0, 0, None
        h.w_center = np.full(2, -1.0 - i)
        part = object.__new__(ExactClient)
        part.host, part._u, part._checked, part._stack, part._slot = h, None, None, None, 0
        part._u_time = part._checked_time = 0
        parts.append(part)
    return parts


def test_a_start_over_two_stacks_writes_each_stack_s_centres_once():
    """A start round whose clients are two cohorts' stacks, interleaved, and one client of
    no stack: each stack's centres written once, each client reading its row of ``W``,
    each stack's centres its clients' rows in its own order."""
    parts = _exact_parts(5)
    first, second = _Stacked([parts[3], parts[0]]), _Stacked([parts[1], parts[4]])
    W = np.arange(10.0).reshape(5, 2)
    for _ in range(2):  # (the second start reuses the first's split)
        before = _Host.centre_writes()
        ExactClient.start_rows(parts, W, {})
        assert _Host.centre_writes() == before + 3  # (two stacks, one client alone)
        assert [p.host.w_center.tolist() for p in parts] == W.tolist()
        assert np.array_equal(first.centres(), W[[3, 0]])
        assert np.array_equal(second.centres(), W[[1, 4]])
        W = W + 100.0
    # a stack made since: the split is found again
    third = _Stacked([parts[2]])
    ExactClient.start_rows(parts, W, {})
    assert np.array_equal(third.centres(), W[[2]])
    assert [p.host.w_center.tolist() for p in parts] == W.tolist()


def test_a_plan_finds_each_half_s_key_and_owner_as_each_half_does():
    """The keys a plan groups halves by, found once for halves alike in what decides them
    (:meth:`ProxALClient.step_batch_keys`), are each half's own ``step_batch_key``, and
    its owners each half's ``handler_owner``: for halves of one structure, of two, and
    with one half of another route or whose form disagrees."""
    from fedmodel.algorithms.protocol import RowsPlan, _cohorts
    from fedmodel.algorithms.proxal.client import ProxALClient
    from fedmodel.algorithms.proxal.options import ProxALOptions

    progs = _model().compile().clients
    opts = ProxALOptions(inner_solver="exact-admm")
    halves = [
        ProxALClient(p, opts, rho=1.0, n_clients=len(progs), route="exact-admm") for p in progs
    ]
    kinds = ("start", "evaluate", "outer", "outer_aa", "xadmm_w", "report")

    def check(group):
        for kind in kinds:
            own = [h.handler_owner(kind)[0] for h in group]
            owners = ProxALClient.handler_owners(group, kind)
            assert all(a is b for a, b in zip(own, owners)), kind
            cls = type(owners[0])
            keys = [o.step_batch_key(kind) for o in owners]
            if hasattr(cls, "step_batch_keys"):
                assert cls.step_batch_keys(owners, kind) == keys, kind
            # (the cohorts: each key's halves, in the order each key first appears)
            expected: dict = {}
            for i, key in enumerate(keys):
                expected.setdefault(key, []).append(i)
            found = _cohorts(owners, kind)
            if None in keys:
                assert found is None
            elif len(expected) == 1:
                assert found == []
            else:
                assert [idx.tolist() for idx, _ in found] == list(expected.values())
                assert all(o is owners[i] for idx, os in found for i, o in zip(idx, os))

    for kind in kinds:  # (the first plans look each half's form up)
        RowsPlan.of(halves, kind)
    check(halves)  # (two structures: 12 and 15 rows)
    check(halves[1::2])  # (one)
    halves[4].use_route("admm")
    check(halves)
    halves[4].use_route("exact-admm")
    halves[5].glm_disagrees = True
    check(halves)


def test_a_mark_reads_each_half_s_statistics_with_its_tallies_counts():
    """The statistics a mark reads as a column (every tally settled once) are those each
    half reads on its own."""
    from fedmodel.algorithms.protocol import ClientHalf, Tally

    halves = [ClientHalf(SimpleNamespace(name=n)) for n in "abcd"]
    Tally.of(halves).add("local_solves", np.array([1, 0, 2, 3]), dtype=int)
    Tally.of(halves[1:3]).maximum("gap", np.array([0.5, 2.0]))
    Tally.of(halves[1:3]).add("seconds", 0.25)
    cols = ClientHalf.state_columns(halves)
    fresh = ClientHalf(SimpleNamespace(name="fresh")).stats  # (what no tally added to)
    expected = [
        {**fresh, "local_solves": 1},
        {**fresh, "local_solves": 0, "seconds": fresh["seconds"] + 0.25, "gap": 0.5},
        {**fresh, "local_solves": 2, "seconds": fresh["seconds"] + 0.25, "gap": 2.0},
        {**fresh, "local_solves": 3},
    ]
    assert cols["stats"] == expected
    assert [h.stats for h in halves] == expected  # (settled once: nothing added twice)


def test_a_mark_reads_clients_rows_of_their_stacks_once_per_stack():
    """Values kept as rows of stacked arrays (cohorts.stack_row) are read for a mark by
    their column: the stacks' rows copied once, read-only, each client's value its row
    (a RowColumn), equal to what each reads on its own and not changed by a later write
    of the stacks; a client that wrote its own value since, or one in no written stack,
    and each is read on its own."""
    from fedmodel.algorithms.protocol import DeclaredState
    from fedmodel.algorithms.proxal.cohorts import stack_row
    from fedmodel.runtime.endpoints import RowColumn, StatesCopy, copy_state, party_states

    clock = [0]

    def tick():
        clock[0] += 1
        return clock[0]

    class Client(DeclaredState):
        state_fields = ("x", "k")
        x = stack_row("_x", "_x_time", "_stack", "_slot", "rows", tick, "x")

        def __init__(self, i):
            self._stack, self._slot, self.k = None, 0, i
            self.x = np.full(2, -float(i))

    clients = [Client(i) for i in range(4)]
    assert type(party_states(clients)["x"]) is list  # (in no stack)
    a = SimpleNamespace(rows=np.arange(4.0).reshape(2, 2), time=tick())
    b = SimpleNamespace(rows=10 + np.arange(4.0).reshape(2, 2), time=tick())
    for c, (stack, slot) in zip(clients, [(a, 1), (b, 0), (a, 0), (b, 1)]):
        c._stack, c._slot = stack, slot
    want = [copy_state(c.get_state()) for c in clients]
    cols = party_states(clients)
    assert type(cols["x"]) is RowColumn and cols["k"] == [0, 1, 2, 3]
    snap = StatesCopy(cols)
    a.rows[:] = b.rows[:] = 99.0  # (the stacks written again, in place)
    for i, w in enumerate(want):
        got = snap.state(i)
        np.testing.assert_array_equal(got["x"], w["x"])
        assert got["k"] == w["k"] and not got["x"].flags.writeable
    clients[2].x = np.zeros(2)  # (its own write, after its stack's)
    cols = party_states(clients)
    assert type(cols["x"]) is list
    for c, x in zip(clients, cols["x"]):
        np.testing.assert_array_equal(x, c.x)
    clients[2]._x_time = 0
    a.rows, a.time = None, 0  # (a stack not written yet)
    assert type(party_states(clients)["x"]) is list


def test_exact_step_keys_found_together_are_each_client_s_own():
    """ExactClient.step_batch_keys at clients that have not found their keys yet gives
    (and notes in each) the key each finds on its own: for clients alike, for one
    without batches among them, and for one whose form disagrees; so do
    ProxALClient.step_batch_keys' start and evaluation keys at clients that have not
    judged their evaluations yet."""
    from fedmodel.algorithms.proxal.client import ProxALClient
    from fedmodel.algorithms.proxal.exact_admm import ExactClient
    from fedmodel.algorithms.proxal.options import ProxALOptions

    progs = _model().compile().clients

    def fresh(change=None):
        halves = []
        for i, p in enumerate(progs):
            opts = ProxALOptions(inner_solver="exact-admm", batch_clients=i != change)
            halves.append(ProxALClient(p, opts, rho=1.0, n_clients=len(progs), route="exact-admm"))
        for h in halves:  # (forms looked up, as the start round's keys do)
            h.step_batch_key("start")
        return [h.inner for h in halves]

    for change in (None, 3):
        for kind in ("xadmm_w", "xadmm_check", "start"):
            together, alone = fresh(change), fresh(change)
            keys = ExactClient.step_batch_keys(together, kind)
            assert keys == [p.step_batch_key(kind) for p in alone]
            assert [p.step_batch_key(kind) for p in together] == keys
    parts = fresh()
    assert None not in ExactClient.step_batch_keys(parts, "xadmm_w")
    for change in (None, 1):  # (the start's and evaluation's keys: each judges its own)
        for kind in ("start", "evaluate"):
            together = [p.host for p in fresh(change)]
            alone = [p.host for p in fresh(change)]
            for h in together + alone:
                h.glm_plain = None
            keys = ProxALClient.step_batch_keys(together, kind)
            assert keys == [h.step_batch_key(kind) for h in alone]
            assert [h.glm_plain for h in together] == [h.glm_plain for h in alone]
    parts = fresh()
    parts[2].host.glm_disagrees = True
    keys = ExactClient.step_batch_keys(parts, "xadmm_w")
    assert keys[2] is None and keys == [p.step_batch_key("xadmm_w") for p in parts]


def test_clients_values_written_together_are_one_write():
    """StackRow.write sets each client's own value as one write (one time of the clock
    for all): each reads its own value until its stack is written after it, then its
    row there, as after a write of its own; StackRow.values reads each as it reads it."""
    from fedmodel.algorithms.proxal.cohorts import stack_row

    clock = [0]

    def tick():
        clock[0] += 1
        return clock[0]

    class Client:
        x = stack_row("_x", "_x_time", "_stack", "_slot", "rows", tick, "x")

    clients = [Client() for _ in range(3)]
    stack = SimpleNamespace(rows=np.zeros((3, 2)), time=tick())
    for i, c in enumerate(clients):
        c._stack, c._slot = stack, i
    values = [np.full(2, float(i)) for i in range(3)]
    Client.x.write(clients, values)
    assert clock[0] == 2 and all(c.x is v for c, v in zip(clients, values))
    stack.time = tick()
    assert all(np.array_equal(c.x, np.zeros(2)) for c in clients)
    Client.x.write(clients[1:], values[1:])
    assert np.array_equal(clients[0].x, np.zeros(2)) and clients[2].x is values[2]
    read = Client.x.values(clients)  # (each as it reads it, uncopied)
    assert all(np.array_equal(r, c.x) for r, c in zip(read, clients)) and read[2] is values[2]
    for c in clients:
        c._stack = None
    assert all(r is v for r, v in zip(Client.x.values(clients), values))


def test_plans_of_several_kinds_read_what_they_share_once():
    """The plans of several kinds at one list of halves share what they read alike (one
    class, the first half of each message table and opt-ins), found again after an event
    and for another list."""
    from fedmodel.algorithms.protocol import RowsPlan, plans_changed
    from fedmodel.algorithms.proxal.client import ProxALClient
    from fedmodel.algorithms.proxal.options import ProxALOptions

    progs = _model().compile().clients
    opts = ProxALOptions(inner_solver="exact-admm")
    halves = [
        ProxALClient(p, opts, rho=1.0, n_clients=len(progs), route="exact-admm") for p in progs
    ]
    halves[2].reveal = ("hessian",)  # (the third half's opt-ins differ from the others')
    start, outer = RowsPlan.of(halves, "start"), RowsPlan.of(halves, "outer")
    assert start.firsts is outer.firsts and start.firsts == [0, 2]
    plans_changed()
    again = RowsPlan.of(halves, "outer")
    assert again is not outer and again.firsts == [0, 2] and again.firsts is not outer.firsts
    assert RowsPlan.of(halves[1:], "outer").firsts == [0, 1]


def test_the_serial_placement_knows_a_list_of_its_clients_until_they_change():
    """The serial runtime's placement says a list of names all runs here as the endpoints
    do: asked again of an equal list, after an endpoint joined, after one left (then
    unknown), after one left and another joined in a later round, and for names of which
    one is unknown (never kept)."""
    from fedmodel.runtime.endpoints import EchoEndpoint
    from fedmodel.runtime.serial import SerialRuntime

    rt = SerialRuntime({n: EchoEndpoint(n) for n in "abc"})
    where = rt._host_of
    assert where is rt._host_of  # (one view of the endpoints)
    assert where.all_in_server(["a", "b"]) and where.all_in_server(["a", "b"])
    assert not where.all_in_server(["a", "z"]) and not where.all_in_server(["a", "z"])
    rt.endpoints["d"] = EchoEndpoint("d")
    assert where.all_in_server(["a", "b"]) and where.all_in_server(["a", "d"])
    del rt.endpoints["a"]
    assert not where.all_in_server(["a", "d"])
    assert where.all_in_server(["b", "d"])
    rt.next_round()
    del rt.endpoints["b"]
    rt.endpoints["a"] = EchoEndpoint("a")
    assert not where.all_in_server(["b", "d"])
    rt.endpoints["b"] = EchoEndpoint("b")
    assert where.all_in_server(("b", "d")) and not where.all_in_server(iter(["z"]))
    with pytest.raises(KeyError, match="unknown receivers"):
        rt.broadcast_rows("ping", {"x": 1.0}, to=["b", "z"])
    rt.endpoints = {"e": EchoEndpoint("e")}  # (another dict: another view)
    assert rt._host_of is not where and rt._host_of.all_in_server(["e"])


def test_a_stacked_start_starts_each_half_s_route_part_of_now():
    """The stacked start reaches each half's route part, read once while nothing changes
    the halves and again after an event that does (a route taken)."""
    from fedmodel.algorithms.protocol import plans_changed
    from fedmodel.algorithms.proxal.client import _start_rows

    class Part:
        started: list = []

        @staticmethod
        def start_rows(parts, W, request):
            Part.started.append(list(parts))
            return {"exact": np.ones(len(parts), dtype=bool)}

    halves = [SimpleNamespace(inner=Part()) for _ in range(3)]
    W = np.zeros((3, 2))
    _start_rows(halves, W, {})
    _start_rows(halves, W, {})
    assert Part.started[0] == Part.started[1] == [h.inner for h in halves]
    halves[1].inner = Part()  # (a route taken: the event says so)
    plans_changed()
    _start_rows(halves, W, {})
    assert Part.started[2] == [h.inner for h in halves] != Part.started[0]
