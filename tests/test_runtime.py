"""Runtimes: the same answer and the same ledger on every backend; the runtime interface
(send, broadcast, peer messages, local steps) on every backend; options validation."""

from __future__ import annotations

import os
import sys

import cvxpy as cp
import numpy as np
import pytest

import fedmodel as fm
from fedmodel.runtime.endpoints import RUNTIME_PROXY, EndpointFactory
from fedmodel.runtime.factory import make_runtime
from fedmodel.runtime.messages import SERVER, Message
from fedmodel.runtime.outcomes import ClientFailure
from fedmodel.runtime.placement import default_workers, placement, shard

sys.path.insert(0, os.path.dirname(__file__))
from backend_configs import BACKENDS, REMOTE, on  # noqa: E402
from problems import np_model  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def ray_local():
    """One local Ray (num_cpus=2) for the whole session: started by the first test module
    that needs it and left running (Ray stops it at exit); the runtimes join it."""
    import ray

    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, configure_logging=False)
    yield ray


def lsq_model(n=3, d=3, m=40, seed=1):
    """Unconstrained least squares + l1 (for admm)."""
    rng = np.random.default_rng(seed)
    model = fm.Model("lsq")
    w = model.variable(d, name="w")
    for k in range(n):
        site = model.client(f"c{k}")
        A = site.data(rng.normal(size=(m, d)), name="A")
        b = site.data(rng.normal(size=m), name="b")
        site.minimize(cp.sum_squares(A @ w - b) / (n * m))
    model.regularize(0.01 * cp.norm1(w))
    return model


@pytest.fixture(scope="module")
def serial_results():
    return {
        "prox-al": np_model(3).solve("prox-al", eps=1e-4),
        "admm": lsq_model().solve("admm", eps=1e-5),
    }


@pytest.mark.parametrize("backend", REMOTE)
@pytest.mark.parametrize("method", ["prox-al", "admm"])
def test_same_answer_and_ledger_on_every_backend(backend, method, serial_results):
    model = np_model(3) if method == "prox-al" else lsq_model()
    eps = 1e-4 if method == "prox-al" else 1e-5
    ref = serial_results[method]
    res = model.solve(method, eps=eps, workers=2, **on(backend))
    assert res.status == ref.status
    assert res.extra["backend"] == on(backend)["backend"]
    hosts = set(res.extra["placement"].values())
    with_server = backend.endswith("+server")
    assert ("server" in hosts) == with_server and len(hosts) == 2 + with_server
    rel = np.abs(res.x - ref.x).max() / max(1.0, np.abs(ref.x).max())
    assert rel <= 1e-10
    assert res.rounds == ref.rounds
    assert res.ledger == ref.ledger
    assert res.communication == ref.communication
    for name, mult in ref.multipliers.items():
        for label, val in mult.items():
            np.testing.assert_allclose(res.multipliers[name][label], val, rtol=0, atol=1e-10)


def test_result_ledger_table(serial_results):
    res = serial_results["prox-al"]
    table = res.ledger_table(limit=5)
    assert "start_reply" in table and "grad[5]" in table  # (the Newton inner solver's)
    assert f"{len(res.ledger)} messages" in table
    only = res.ledger_table(channel="diagnostic", party="site1", limit=None)
    assert "admm_w" not in only and "evaluate" in only
    assert res.to_dict()["checkpoint"] is None


def test_shard_is_balanced_and_deterministic():
    names = [f"c{i}" for i in range(7)]
    weights = {n: (10 if n == "c0" else 1) for n in names}
    a = shard(names, 2, weights)
    assert a == shard(names, 2, weights)
    assert list(a) == names
    assert sum(1 for n in names if a[n] == a["c0"]) == 1  # the heavy client alone
    assert set(shard(names, 10).values()) == set(range(7))  # at most one worker per client


def test_placement_gives_the_server_the_lightest_shard():
    names = [f"c{i}" for i in range(5)]
    weights = {n: (10 if n == "c0" else 1) for n in names}
    place = placement(names, 1, weights, server_hosts_clients=True)
    assert place == {"c0": 0, "c1": "server", "c2": "server", "c3": "server", "c4": "server"}
    assert placement(names, 2) == shard(names, 2)
    assert placement(["only"], 3, server_hosts_clients=True) == {"only": "server"}
    assert default_workers(2, True) == 1 and default_workers(2, False) == 2
    assert default_workers(1, True) == 1


# -- the runtime interface on every backend ----------------------------------------------------
class EchoNode:
    """A toy party: replies to server messages, forwards peer messages, counts state."""

    def __init__(self, name, peers, runtime):
        self.name = name
        self.peers = list(peers)
        self.runtime = runtime
        self.count = 0
        self.seen: list[str] = []

    def get_state(self):
        return {"count": self.count, "seen": list(self.seen)}

    def set_state(self, state):
        self.count = state["count"]
        self.seen = list(state["seen"])

    def handle(self, msg: Message):
        self.count += 1
        if msg.kind == "boom":
            raise ValueError(f"{self.name} cannot boom")
        if msg.channel == "local":  # activation: send to peers
            for p in self.peers:
                self.runtime.send_peer(self.name, p, "hello", {"v": np.full(2, self.count)})
            return self.count
        if msg.sender != SERVER:  # a peer message
            self.seen.append(msg.sender)
            if msg.kind == "hello" and self.name == "b":  # relay once
                self.runtime.send_peer(self.name, "a", "relay", {"v": np.zeros(1)})
            return None
        return Message(
            msg.kind + "_reply",
            self.name,
            SERVER,
            {"x": np.asarray(msg.payload["x"]) * 2, "count": self.count, "pid": os.getpid()},
            msg.round,
            msg.channel,
        )


def _echo_factories():
    peers = {"a": ["b"], "b": ["a", "c"], "c": []}
    return {n: EndpointFactory(EchoNode, (n, peers[n], RUNTIME_PROXY)) for n in "abc"}


@pytest.mark.parametrize("backend", BACKENDS)
def test_runtime_interface(backend):
    opts = on(backend)
    with make_runtime(opts.pop("backend"), _echo_factories(), workers=2, **opts) as rt:
        assert rt.client_names == ["a", "b", "c"]
        rt.next_round()
        replies = rt.broadcast("ping", lambda n: {"x": np.arange(3.0) + ord(n)})
        assert list(replies) == ["a", "b", "c"]
        np.testing.assert_array_equal(replies["b"].payload["x"], 2 * (np.arange(3.0) + ord("b")))
        for name, reply in replies.items():  # each client ran where the placement says
            here = reply.payload["pid"] == os.getpid()
            assert here == (rt.placement[name] == "server")
            assert backend == "serial" or reply.payload["pid"] == rt.pids[rt.placement[name]]
        in_server = {n for n, h in rt.placement.items() if h == "server"}
        expected = {"serial": {"a", "b", "c"}, "processes+server": {"c"}, "ray+server": {"c"}}
        assert in_server == expected.get(backend, set())
        assert rt.send("c", "ping", {"x": np.ones(1)}).payload["count"] == 2
        # peer messages: a -> b, then b relays to a; all recorded, none via the server
        assert rt.activate("a", "go") == 2
        assert rt.deliver_peer_messages() == 2
        states = rt.get_states()
        assert states["b"]["seen"] == ["a"] and states["a"]["seen"] == ["b"]
        peer_rows = [r for r in rt.ledger.rows if r["sender"] != SERVER and r["receiver"] != SERVER]
        assert [(r["sender"], r["receiver"], r["kind"]) for r in peer_rows] == [
            ("a", "b", "hello"),
            ("b", "a", "relay"),
        ]
        # a failing step: ClientFailure names the client; under on_failure="retry" its
        # state is put back (a stopping run puts every party back from its marks instead)
        rt.on_failure = "retry"
        with pytest.raises(ClientFailure, match="client 'b'.*cannot boom") as err:
            rt.send("b", "boom", {"x": 0})
        rt.on_failure = "stop"
        assert err.value.clients == ["b"]
        assert rt.get_states()["b"]["count"] == states["b"]["count"]
        # marks: a consistent point every party can go back to
        rt.mark()
        rt.broadcast("ping", {"x": np.zeros(1)})
        rt.restore_marks()
        assert rt.get_states() == rt.get_states() and rt.get_states()["a"]["count"] == 3


def test_build_errors_are_raised_unchanged():
    for backend in ("serial", "processes"):
        factories = {"a": EndpointFactory(_bad_endpoint, ("a",))}
        with pytest.raises(fm.UnsupportedError, match="cannot be built"):
            make_runtime(backend, factories)


def _bad_endpoint(name):
    raise fm.UnsupportedError("endpoint cannot be built", name)


def test_unsupported_term_still_reported_from_a_worker():
    model = fm.Model("norm2")
    w = model.variable(2, name="w")
    site = model.client("s0")
    A = site.data(np.ones((5, 2)), name="A")
    # a 2-norm in an objective has no smooth exact form: cone constraints (the conic path),
    # which the L-BFGS backend cannot take; the worker building the client says so
    site.minimize(cp.norm(A @ w - 1, 2), name="norm2 loss")
    with pytest.raises(fm.UnsupportedError, match="norm2 loss"):
        model.solve("prox-al", backend="processes", workers=1, solver="lbfgs")
    # the default backend choice takes the cvxpy backend, in the worker as well
    res = model.solve("prox-al", backend="processes", workers=1, eps=1e-3)
    assert res.status == "optimal" and res.extra["conic_parties"] == ["s0"]


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"backend": "gpu"}, "backend must be one of"),
        ({"workers": 0}, "workers must be a positive integer"),
        ({"client_timeout": -1}, "client_timeout must be a positive"),
        ({"on_failure": "ignore"}, "on_failure must be one of"),
        ({"retries": -1}, "retries must be an integer"),
        ({"checkpoint_every": 0}, "checkpoint_every must be an integer"),
        ({"checkpoint": 3}, "checkpoint must be a directory path"),
        ({"resume": "/nonexistent/ckpt"}, "no such checkpoint directory"),
        ({"ray_address": "auto"}, "ray_address is used by backend='ray' only"),
        ({"server_hosts_clients": True}, "server_hosts_clients is for backend='processes'"),
        (
            {"server_hosts_clients": "yes", "backend": "processes"},
            "server_hosts_clients must be True or False",
        ),
    ],
)
def test_runtime_options_are_validated(kw, match):
    with pytest.raises(fm.ModelError, match=match):
        np_model(2).solve("prox-al", **kw)


def test_options_are_documented():
    from fedmodel.algorithms.registry import describe_options

    doc = describe_options("prox-al")
    for name in (
        "backend",
        "workers",
        "server_hosts_clients",
        "ray_address",
        "client_timeout",
        "on_failure",
        "retries",
        "checkpoint",
        "checkpoint_every",
        "resume",
    ):
        assert f"{name} :" in doc or f"{name}," in doc


def test_blas_threads_pins_during_a_solve_and_restores_after():
    """Every method runs with one OpenBLAS thread by default (``blas_threads=1``) and
    leaves the process's setting as it found it."""
    from problems import lcqp_test_model

    from fedmodel.runtime.blas import _openblas_handles, blas_threads

    handles = _openblas_handles()
    if not handles:
        pytest.skip("no OpenBLAS loaded in this process (not Linux / another BLAS)")
    setter, getter = handles[0]
    before = int(getter())
    seen = []
    model = lcqp_test_model(2)
    with blas_threads(2):
        res = model.solve("prox-al", callback=lambda row: seen.append(int(getter())))
        assert int(getter()) == 2
        model.solve("prox-al", blas_threads=None, callback=lambda row: seen.append(-int(getter())))
    assert res.status == "optimal"
    assert seen and all(s in (1, -2) for s in seen) and 1 in seen and -2 in seen
    assert int(getter()) == before


def test_state_snapshots_copy_writable_arrays_and_share_read_only_ones():
    from fedmodel.runtime.endpoints import copy_state

    frozen = np.arange(4.0)
    frozen.flags.writeable = False
    state = {"u": np.ones(3), "factor": (frozen, False), "stats": {"n": 1}, "l": [np.zeros(2)]}
    snap = copy_state(state)
    state["u"][0] = 5.0
    state["l"][0][1] = 7.0
    state["stats"]["n"] = 2
    assert snap["u"][0] == 1.0 and snap["l"][0][1] == 0.0 and snap["stats"]["n"] == 1
    assert snap["factor"][0] is frozen and snap["factor"][1] is False
    # (containers of many values: copied in one call when all are scalars, else each)
    rhos = {f"c{i}": float(i) for i in range(40)}
    mixed = [*range(30), np.zeros(2)]
    copied = copy_state({"rhos": rhos, "mixed": mixed, "ints": list(range(30))})
    rhos["c0"], mixed[-1][0] = 9.0, 9.0
    assert copied["rhos"] == {f"c{i}": float(i) for i in range(40)}
    assert copied["mixed"][-1][0] == 0.0 and copied["ints"] == list(range(30))
    assert type(copied["rhos"]) is dict and copied["mixed"][-1] is not mixed[-1]


def test_states_copied_together_equal_their_copies_one_by_one():
    """StatesCopy (a mark of many parties) gives each party what copy_state gives: places
    of one layout read as columns, the others (a None against an array, dicts with other
    keys, lists of other lengths, a numpy scalar) copied one by one; later in-place changes
    of the parties' states do not reach it, and each read is in containers of its own."""
    from fedmodel.runtime.endpoints import StatesCopy, copy_state

    frozen = np.arange(3.0)
    frozen.flags.writeable = False

    def state(i):
        return {
            "u": np.full(2, float(i)),
            "empty": np.zeros(0),
            "factor": frozen,
            "maybe": None if i % 2 else np.ones(1),
            "log": [(np.zeros(0), float(i))] * (1 + i % 2),
            "stats": {"n": i, "t": 0.5} if i != 3 else {"n": i},
            "units": (1.0, i),
            "x": np.float64(i),
        }

    states = [state(i) for i in range(5)]
    expected = [copy_state(s) for s in states]
    snap = StatesCopy(states)
    for s in states:
        s["u"][0] = -1.0
        s["stats"]["n"] = -1
        s["log"].append(None)
    for i, want in enumerate(expected):
        got = snap.state(i)
        assert got.keys() == want.keys()
        for key in want:
            assert type(got[key]) is type(want[key])
            np.testing.assert_equal(got[key], want[key])
        assert got["factor"] is frozen
        got["stats"]["n"] = 99
        assert snap.state(i)["stats"]["n"] == want["stats"]["n"]


def test_marks_taken_together_are_read_by_name():
    """Marks: the states taken together are each read by its party's name (in containers
    of its own), a later take of some parties replaces only theirs, and a state set by
    name is kept as given."""
    from fedmodel.runtime.host import Marks

    marks = Marks()
    states = [{"u": np.full(2, float(i)), "k": i} for i in range(4)]
    marks.take(["a", "b", "c", "d"], states)
    states[2]["u"][0] = -1.0
    assert marks.get("c")["u"][0] == 2.0 and marks.get("c") is not marks.get("c")
    marks.take(["d", "b"], [{"u": np.zeros(1), "k": 7}, {"u": np.ones(1), "k": 8}])
    given = {"k": 9}
    marks["e"] = given
    assert [marks.get(n)["k"] for n in "abcde"] == [0, 8, 2, 7, 9] and marks.get("e") is given
    assert [name for name, _ in marks.items()] == list("abcde") and len(marks) == 5
    assert "e" in marks and marks.get("f", 0) == 0
    marks.clear()
    assert len(marks) == 0 and marks.get("a") is None


def test_backends_benchmark_runs_and_reports_where_clients_ran():
    """benchmarks/backends.py on a tiny problem: the same iterates on every configuration,
    and the busiest host's load read from the run's own placement."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(0, os.path.join(root, "benchmarks"))
    try:
        import backends as bench
    finally:
        sys.path.pop(0)
    rows = bench.heavy(["serial", "processes+server"], n=4, d=3, total=400, repeats=1)
    assert rows["processes+server"]["diff"] == 0.0
    assert rows["processes+server"]["rounds"] == rows["serial"]["rounds"]
    both = rows["processes+server"]
    assert 0 < both["max_worker"] < both["client_seconds"]  # split over two hosts
    table = "\n".join(bench._heavy_table(4, 3, 400, 1, {("serial", "processes+server"): rows}))
    assert "| processes+server |" in table and "0.0e+00" in table


def test_declared_states_read_as_columns_are_their_get_states():
    """A host's mark reads the declared state of many halves of one class as columns
    (DeclaredState.state_columns, components too): copied, it is each half's get_state; a
    half that extends its class's fields is read by its own get_state."""
    from fedmodel.algorithms.protocol import DeclaredState
    from fedmodel.runtime.endpoints import StatesCopy, copy_state, party_states

    class Part(DeclaredState):
        state_fields = ("u",)

        def __init__(self, i):
            self.u = np.full(2, float(i))

    class Half(DeclaredState):
        state_fields = ("x", "k", "log")
        component_fields = ("part",)

        def __init__(self, i, extra=False):
            self.x, self.k, self.log = np.arange(3.0) * i, i, [(i, np.zeros(0))]
            self.part = Part(i) if i % 2 else None
            if extra:
                self.state_fields = (*type(self).state_fields, "more")
                self.more = -i

    halves = [Half(i) for i in range(5)]
    cols = party_states(halves)
    assert type(cols).__name__ == "StateColumns" and list(cols) == ["x", "k", "log", "part"]
    for group in (halves, [*halves, Half(5, extra=True)]):
        snap = StatesCopy(party_states(group))
        for i, h in enumerate(group):
            want, got = copy_state(h.get_state()), snap.state(i)
            assert list(got) == list(want)
            for key in want:
                np.testing.assert_equal(got[key], want[key])
    snap = StatesCopy(cols)
    halves[1].x[0] = 9.0
    assert snap.state(1)["x"][0] == 0.0 and snap.state(1)["part"]["u"][0] == 1.0


def test_lazy_solvers_read_as_columns_are_their_get_states():
    """Lazy solvers none of which is built are read as columns of their initial states
    (LazySolver.state_columns): copied, each is its get_state; one built, or initial
    states of different keys, and each is read by its own get_state."""
    from fedmodel.runtime.endpoints import StatesCopy, copy_state, party_states
    from fedmodel.subproblems.select import LazySolver

    class Backend:
        def __init__(self):
            self.factor = np.eye(2)

        def get_state(self):
            return {"factor": self.factor, "verified": True}

    def lazies(initials):
        return [LazySolver(Backend, init) for init in initials]

    same = lazies([{"factor": None, "verified": False, "k": i} for i in range(4)])
    cols = party_states(same)
    assert type(cols).__name__ == "StateColumns" and cols["k"] == [0, 1, 2, 3]
    # (one initial state object for all: its values repeated, as each solver's own)
    shared = lazies([{"factor": np.eye(2), "verified": False}] * 3)
    cols = party_states(shared)
    assert type(cols).__name__ == "StateColumns" and cols["verified"] == [False] * 3
    built = lazies([{"factor": None, "verified": False}] * 3)
    built[1].backend()
    mixed = lazies([{"factor": None}, {"verified": False}])
    for group in (same, shared, built, mixed):
        columns = group is same or group is shared
        assert type(party_states(group)).__name__ == ("StateColumns" if columns else "list")
        snap = StatesCopy(party_states(group))
        for i, lazy in enumerate(group):
            assert list(snap.state(i)) == list(lazy.get_state())
            for key, value in copy_state(lazy.get_state()).items():
                np.testing.assert_equal(snap.state(i)[key], value)
    snap = StatesCopy(party_states(shared))
    shared[0]._initial["factor"][0, 0] = 5.0  # (after the copy: none of its states sees it)
    assert [snap.state(i)["factor"][0, 0] for i in range(3)] == [1.0] * 3
    assert LazySolver.state_columns([]) is None
