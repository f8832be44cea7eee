"""Replies are validated against the method's declared message table before the server uses
them (issue 22, item 3): a reply of the wrong shape, NaN, inf, 1e300 entries, a million
entries, an unknown or a missing field, a string for a number, in an algorithm round or in
the certificate's evaluate/report round, is a failure of that named client under the
failure policy (status "client_failure"), never an exception out of ``solve``. Every
``_on_<kind>`` of every client half is declared; the privacy table of ``model.summary()``
and of docs/runtime.md come from the same declarations."""

from __future__ import annotations

import inspect
import os
import re
import sys

import numpy as np
import pytest

from fedmodel.algorithms.baselines.fedavg import FedAvgOptions, run_fedavg
from fedmodel.algorithms.privacy import docs_tables, privacy_rows
from fedmodel.algorithms.protocol import ClientHalf
from fedmodel.algorithms.proxal.options import ProxALOptions
from fedmodel.algorithms.proxal.server import run_prox_al
from fedmodel.algorithms.registry import FAMILIES
from fedmodel.runtime.faults import Fault
from fedmodel.runtime.outcomes import InvalidReply
from fedmodel.runtime.schema import Field, MessageSpec, MessageTable
from fedmodel.runtime.secure_aggregation import SECAGG

sys.path.insert(0, os.path.dirname(__file__))
from problems import np_model  # noqa: E402

EPS = 1e-4
DOCS = os.path.join(os.path.dirname(__file__), "..", "docs", "runtime.md")


@pytest.fixture(scope="module")
def model():
    return np_model(3)


def prox_al(model, fault, backend="serial", **kw):
    opts = ProxALOptions(eps=EPS, backend=backend, workers=2, **kw)
    return run_prox_al(model.compile(), opts, "prox-al", faults={"site1": fault})


def assert_refused(res, kind, field, what):
    """The run ended on a failure of site1 that names the message kind, the field and the
    reason; nothing escaped ``solve``."""
    assert res.status == "client_failure", (res.status, res.message)
    assert res.failure["client"] == "site1" and res.failure["kind"] == "invalid_reply"
    assert res.failure["message_kind"] == kind
    err = res.failure["error"]
    assert "'site1'" in err and f"'{kind}'" in err and what in err, err
    if field is not None:
        assert f"'{field}'" in err, err
    assert "client 'site1' failed" in res.message and "invalid_reply" in res.message


# (message kind, field, corruption, what the error says, options)
DEFAULT = [  # the default (quasi-Newton) inner solver's trial-point replies
    ("curvature_w", "grad", "shape", "has shape (6,), expected (d=5,)"),
    ("curvature_w", "grad", "nan", "is not finite"),
    ("curvature_w", "value", "large", "magnitude 1e+300"),
    ("curvature_w", "hvp", "nan", "is not finite"),
    ("curvature_w", "hvp", "huge", "has shape (1000000,)"),
    ("curvature_w", "leak", "extra", "unknown field"),
    ("curvature_w", "grad", "missing", "is missing"),
]
ADMM = [
    ("admm_w", "u_tilde", "nan", "is not finite"),
    ("admm_w", "u_tilde", "inf", "is not finite"),
    ("admm_w", "eps_tilde", "text", "not a number"),
    ("admm_w", "u_tilde", "huge", "has shape (1000000,)"),
    ("admm_w", "eps_tilde", "missing", "is missing"),
    # (a row one longer than the outer Anderson memory: within the declared bound, refused
    # by the server's own check)
    ("outer", "gram", "shape", "where the outer Anderson memory holds 1 iterates"),
]
CERTIFICATE = [
    ("evaluate", "grad", "nan", "is not finite"),
    ("evaluate", "c_ineq", "shape", "has shape (2,), expected (m_ineq=1,)"),
    ("evaluate", "objective", "large", "magnitude 1e+300"),
    ("report", "mu", "shape", "has shape (2,), expected (m_ineq=1,)"),
    ("report", "mu", "nan", "is not finite"),
]


@pytest.mark.parametrize("kind,field,how,what", DEFAULT + CERTIFICATE)
def test_prox_al_default_refuses_a_bad_reply_naming_the_client(model, kind, field, how, what):
    fault = Fault("corrupt", round=2, kinds=(kind,), target=field, corruption=how)
    res = prox_al(model, fault)
    assert_refused(res, kind, field, what)
    assert np.all(np.isfinite(res.x))  # the last consistent iterate, not the lie


@pytest.mark.parametrize("kind,field,how,what", ADMM + CERTIFICATE[:2])
def test_prox_al_admm_refuses_a_bad_reply_naming_the_client(model, kind, field, how, what):
    fault = Fault("corrupt", round=3, kinds=(kind,), target=field, corruption=how)
    res = prox_al(model, fault, inner_solver="admm")
    assert_refused(res, kind, field, what)


@pytest.mark.parametrize("backend", ["serial", "processes"])
@pytest.mark.parametrize(
    "kind,field,how,what,kw",
    [
        ("curvature_w", "grad", "shape", "has shape (6,)", {}),
        ("gradient_w", "grad", "shape", "has shape (6,)", {"curvature_directions": 0}),
        ("newton_w", "grad", "shape", "has shape (6,)", {"inner_solver": "newton"}),
        ("admm_w", "u_tilde", "nan", "is not finite", {"inner_solver": "admm"}),
        ("evaluate", "grad", "nan", "is not finite", {}),
        ("report", "nu", "extra", "has shape (3,), expected ()", {}),
    ],
)
def test_refused_on_every_backend(model, backend, kind, field, how, what, kw):
    if how == "extra":  # an undeclared array (a report takes undeclared scalars only)
        field = "leak"
    fault = Fault("corrupt", round=2, kinds=(kind,), target=field, corruption=how)
    res = prox_al(model, fault, backend=backend, **kw)
    assert_refused(res, kind, field, what)
    assert res.extra["backend"] == backend


def test_a_bad_reply_is_not_retried(model):
    """A malformed reply is not a transient fault and the client's step already ran (a
    retry would not repeat it): under on_failure="retry" the run still stops on it."""
    fault = Fault("corrupt", round=2, kinds=("curvature_w",), target="grad", corruption="nan")
    res = prox_al(model, fault, on_failure="retry", retries=3)
    assert_refused(res, "curvature_w", "grad", "is not finite")
    assert res.extra["retries"] == []


def test_a_lie_in_the_certificate_round_is_refused_and_the_objective_is_the_honest_one(model):
    """Before validation a lie in the final evaluate round turned the objective into a wrong
    value ("inaccurate"); now the run names the liar and returns the last consistent
    iterate (the step before the last) with its honest objective (the fault fires once:
    the driver's second evaluation round is honest), within the method's tolerance of the
    honest run's."""
    honest = model.solve("prox-al", eps=EPS, history=False)
    fault = Fault("corrupt", round=1, kinds=("evaluate",), target="grad", corruption="nan")
    res = prox_al(model, fault, history=False)
    assert_refused(res, "evaluate", "grad", "is not finite")
    assert honest.status == "optimal"
    compiled = model.compile()
    own = sum(p.functions.objective(res.x) for p in compiled.parties)  # h = 0 here
    assert res.objective == pytest.approx(own, rel=1e-12)
    assert abs(res.objective - honest.objective) <= 10 * EPS * max(1.0, abs(honest.objective))


def test_fedavg_refuses_bad_replies(model):
    compiled = model.compile()
    for backend in ("serial", "processes"):
        for kind, field, how, what in [
            ("fed_round", "dx", "shape", "has shape (6,), expected (d=5,)"),
            ("fed_round", "dx", "nan", "is not finite"),
            ("evaluate", "c_ineq", "missing", "is missing"),
        ]:
            opts = FedAvgOptions(max_rounds=5, penalty=10.0, backend=backend, workers=2)
            fault = Fault("corrupt", round=2, kinds=(kind,), target=field, corruption=how)
            res = run_fedavg(compiled, opts, "fedavg", faults={"site1": fault})
            assert_refused(res, kind, field, what)


def test_honest_runs_pass_validation(model):
    """The declared tables accept every honest reply (the families' own tests run with
    validation on; here the options that add optional fields)."""
    for kw in [
        {},
        {"inner_solver": "admm"},
        {"inner_solver": "admm", "penalty_metric": "hessian", "anderson": 3},
    ]:
        res = model.solve("prox-al", eps=EPS, **kw)
        assert res.status == "optimal", (kw, res.message)
    for method in ("fedavg", "dald-cc"):
        limit = {"max_rounds": 5} if method == "fedavg" else {"max_outer": 5}
        res = model.solve(method, penalty=10.0, **limit)
        assert res.status != "client_failure", res.message


def test_vertical_method_without_a_compiled_model_validates_replies():
    from test_vfl import small_problem

    from fedmodel.algorithms.vfl.run import solve_vertical

    prob = small_problem()
    name = prob.party_names[1]
    fault = Fault(
        "corrupt", round=2, kinds=("vfl_round",), target="partial_scores", corruption="shape"
    )
    res = solve_vertical(prob, "fair-vfl", max_rounds=10, eps=0.05, faults={name: fault})
    assert res.status == "client_failure" and res.failure["client"] == name
    assert f"has shape ({prob.n + 1},), expected (n={prob.n},)" in res.failure["error"]


# -- the declarations ----------------------------------------------------------------------------
def _client_halves() -> list[type]:
    import importlib

    for package in set(FAMILIES.values()):
        importlib.import_module(package)
    seen, todo = [], list(ClientHalf.__subclasses__())
    while todo:
        cls = todo.pop()
        todo += cls.__subclasses__()
        # (a base shared by several families' halves, such as PenaltyClient, declares no
        # table of its own: each of its subclasses does)
        base = cls.messages is None and bool(cls.__subclasses__())
        if cls.__module__.startswith("fedmodel.") and cls not in seen and not base:
            seen.append(cls)
    return seen


def test_every_kind_a_client_half_answers_is_declared():
    halves = _client_halves()
    names = {c.__name__ for c in halves}
    assert {"ProxALClient", "FedClient", "DGDNode", "DALDCCClient", "DALDDCNode"} <= names
    assert {"VFLParty", "SampleClient", "FeatureClient"} <= names
    missing = []
    for cls in halves:
        kinds = {n[4:] for n, _ in inspect.getmembers(cls) if n.startswith("_on_")}
        # (``_on_<kind>_batch`` and ``_on_<kind>_rows`` answer many parties' ``kind`` at
        # once: not kinds of their own)
        for suffix in ("_batch", "_rows"):
            kinds -= {k for k in kinds if k.endswith(suffix) and k[: -len(suffix)] in kinds}
        table = cls.messages
        assert table is not None, f"{cls.__name__} declares no message table"
        # (the kinds of secure aggregation, answered by every client half, are SECAGG's)
        missing += [
            f"{cls.__name__}._on_{k}" for k in sorted(kinds) if k not in table and k not in SECAGG
        ]
    assert missing == [], f"message kinds answered but not declared: {missing}"


def test_a_kind_declared_nowhere_is_refused():
    table = MessageTable("toy", (MessageSpec("ping", reply={"g": Field(("d",))}),))
    check = table.checker(lambda name: {"d": 2})
    check("a", "ping", "server", {"g": np.zeros(2)})
    with pytest.raises(InvalidReply, match="'pong': the kind is not declared"):
        check("a", "pong", "server", {"g": np.zeros(2)})
    with pytest.raises(InvalidReply, match="declared as a 'server' message"):
        check("a", "ping", "peer", {"g": np.zeros(2)})
    with pytest.raises(InvalidReply, match="has dtype <U1, expected float"):
        check("a", "ping", "server", {"g": np.array(["a", "b"])})
    with pytest.raises(InvalidReply, match="not a mapping"):
        check("a", "ping", "server", [1.0, 2.0])


# -- the privacy table ---------------------------------------------------------------------------
def test_summary_privacy_table_of_prox_al(model):
    d = model.compile().layout.n_shared
    assert d == 5
    # (each inner solver's rows: the table of a run that takes it)
    rows = {}
    for opts in ({"inner_solver": "newton"}, {"inner_solver": "admm", "penalty_metric": "hessian"}):
        rows.update({(r["kind"], r["direction"]): r for r in privacy_rows(model.compile(), **opts)})
    newton = rows[("newton_w", "client -> server")]
    assert newton["floats"] == 1 + d + d * d  # value, gradient, the opt-in Hessian
    assert newton["opt_in"] == ["inner_solver='newton'"]
    assert "d x d curvature" in newton["reveals"]
    admm = rows[("admm_w", "client -> server")]
    aa = ProxALOptions().anderson + 1
    assert admm["floats"] == d + 1 + 1 + d * d + aa  # u~, eps~, rho, opt-in metric, Gram
    assert admm["opt_in"] == ["penalty_metric='hessian'"]
    assert rows[("admm_w", "server -> client")]["floats"] == d + 1 + aa + 1
    # objective, grad, scale, owned_stationarity, owned_scaled, owned_index (<= d here),
    # feasibility, feasibility_scaled, violation, c_ineq (1), c_eq (0), and at most the
    # complementarity gap (1), the balanced multipliers mu (1) and the boundary relief's
    # boundary_grad, boundary_scale, boundary_mask (d each)
    assert (
        rows[("evaluate", "client -> server")]["floats"]
        == 1 + d + d + 1 + 1 + d + 1 + 1 + 1 + 1 + 0 + 1 + 1 + 3 * d
    )
    assert rows[("report", "client -> server")]["opt_in"] == []
    text = model.summary(print_=False)
    assert "messages of prox-al" in text and "inner solver of prox-al on this model" in text
    assert "newton_w" not in text  # (the default run takes another inner solver)
    pooled = model.summary(print_=False, method="centralized")
    assert "messages of centralized: none" in pooled


def test_docs_tables_are_the_generated_ones():
    text = open(DOCS).read()
    m = re.search(r"<!-- message-tables:begin -->\n(.*?)<!-- message-tables:end -->", text, re.S)
    assert m, "docs/runtime.md has no message-tables section"
    assert m.group(1).strip() == docs_tables().strip()


@pytest.mark.parametrize("backend", ["serial", "processes"])
def test_a_bad_peer_message_is_a_failure_of_its_sender(model, backend):
    """dgd's iterates travel node to node (the runtime carries them): a NaN or a wrong shape
    in a peer message is refused before any neighbour reads it, naming the sender."""
    from fedmodel.algorithms.baselines.dgd import DGDOptions, run_dgd

    compiled = model.compile()
    for how, what in [("nan", "is not finite"), ("shape", "has shape (6,), expected (d=5,)")]:
        opts = DGDOptions(penalty=10.0, max_rounds=10, backend=backend, workers=2)
        fault = Fault("corrupt", round=3, kinds=("dgd_x",), target="x", corruption=how)
        res = run_dgd(compiled, opts, "dgd", faults={"site1": fault})
        assert res.status == "client_failure", res.message
        assert res.failure["client"] == "site1" and res.failure["kind"] == "invalid_reply"
        assert "peer message 'dgd_x'" in res.failure["error"] and what in res.failure["error"]
        assert "'x'" in res.failure["error"]


@pytest.mark.parametrize("partition", ["sample", "feature"])
def test_learning_methods_without_a_compiled_model_validate_replies(partition):
    """ssca runs on its own representation (run_federated(compiled=None)): its replies are
    checked against its table too (d = the loss's parameters; feature-based replies bounded
    in size)."""
    from test_ssca_methods import feature_model, sample_model

    from fedmodel.algorithms.driver import run_federated
    from fedmodel.algorithms.ssca.options import SSCAOptions
    from fedmodel.algorithms.ssca.run import _build

    model = sample_model() if partition == "sample" else feature_model()
    opts = SSCAOptions(rounds=4, batch_size=5, eval_every=0)
    opts.validate()  # (the schedules become callables)
    name = model.party_names[1]
    kind, field = ("ssca_w", "grad") if partition == "sample" else ("fb_grad", "gi")
    for how, what in [
        ("nan", "is not finite"),
        ("huge", "entries" if partition == "feature" else "has shape (1000000,)"),
    ]:
        fault = Fault("corrupt", round=2, kinds=(kind,), target=field, corruption=how)
        factories, server = _build(model, "ssca", opts)
        res = run_federated(None, opts, "ssca", server, factories, faults={name: fault})
        assert res.status == "client_failure" and res.failure["client"] == name, res.message
        assert f"'{field}'" in res.failure["error"] and what in res.failure["error"]


class _Echo:
    """An endpoint answering every request with ``g = 2 w`` (or nothing)."""

    name = "a"

    def handle(self, msg):
        from fedmodel.runtime.messages import SERVER, Message

        out = {"g": 2 * np.asarray(msg.payload["w"])} if "w" in msg.payload else {}
        return Message(msg.kind + "_reply", "a", SERVER, out, msg.round, msg.channel)


def test_the_runtime_checks_requests_against_the_same_declaration():
    """One declaration for both directions: the runtime refuses a request of an undeclared
    kind, or with a missing or an undeclared field, before it leaves (naming kind and
    field, nothing recorded), puts each message on its declared channel in the ledger,
    refuses a contradicting channel, and validates the reply with the same table."""
    from fedmodel.runtime.serial import SerialRuntime

    table = MessageTable(
        "toy",
        (
            MessageSpec("ping", request={"w": Field(("d",))}, reply={"g": Field(("d",))}),
            MessageSpec("look", channel="diagnostic"),
        ),
    )
    rt = SerialRuntime({"a": _Echo()}, on_failure="stop")
    rt.declare(table, lambda name: {"d": 2})
    with pytest.raises(ValueError, match="message kind 'pong' is not declared in table 'toy'"):
        rt.send("a", "pong", {})
    with pytest.raises(ValueError, match="message 'ping' without its field 'w'"):
        rt.broadcast("ping", {})
    with pytest.raises(ValueError, match="message 'ping' with the undeclared field 'x'"):
        rt.post("a", "ping", {"w": np.ones(2), "x": 1.0})
    with pytest.raises(ValueError, match="channel 'algorithm'; its declaration .* 'diagnostic'"):
        rt.send("a", "look", {}, channel="algorithm")
    assert rt.ledger.rows == []  # nothing refused was sent
    assert rt.send("a", "ping", {"w": np.ones(2)}).payload["g"].tolist() == [2.0, 2.0]
    rt.send("a", "look", {})
    assert [(r["kind"], r["channel"]) for r in rt.ledger.rows] == [
        ("ping", "algorithm"),
        ("ping_reply", "algorithm"),
        ("look", "diagnostic"),
        ("look_reply", "diagnostic"),
    ]
    with pytest.raises(Exception, match="'g'"):  # the reply, checked by the same table
        rt.send("a", "ping", {"w": np.ones(3)})


def test_replies_checked_together_get_each_party_s_own_verdict():
    """``many``: the replies to one kind checked at once refuse exactly the payloads the
    one-by-one check refuses, with the same errors (stacked values, a party of other
    dimensions, a payload of other fields, a non-finite entry, a bad positive scalar)."""
    table = MessageTable(
        "toy",
        (
            MessageSpec(
                "ping",
                reply={
                    "g": Field(("d",)),
                    "t": Field((), positive=True),
                    "k": Field((), dtype="int", required=False),
                },
            ),
        ),
    )
    dims = {"e": {"d": 3}}
    check = table.checker(lambda name: dims.get(name, {"d": 2}))
    good = {f"p{i}": {"g": np.full(2, float(i)), "t": 1.0 + i} for i in range(6)}
    assert check.many(list(good), "ping", "server", list(good.values())) == {}
    cases = dict(good)
    cases["p1"] = {"g": np.array([0.0, np.inf]), "t": 1.0}
    cases["p2"] = {"g": np.zeros(2), "t": -1.0}
    cases["p3"] = {"g": np.zeros(2), "t": 1.0, "k": 2.5}
    cases["p4"] = {"g": np.zeros(2), "t": 1.0, "k": 3}
    cases["e"] = {"g": np.zeros(2), "t": 1.0}  # (its d is 3)
    cases["p5"] = "not a mapping"
    bad = check.many(list(cases), "ping", "server", list(cases.values()))
    expected = {}
    for name, payload in cases.items():
        try:
            check(name, "ping", "server", payload)
        except InvalidReply as exc:
            expected[name] = str(exc)
    assert set(expected) == {"p1", "p2", "p3", "e", "p5"}
    assert {name: str(exc) for name, exc in bad.items()} == expected


def test_many_parties_dimensions_at_once_are_each_one_s(model):
    """``PartyDims.many``: the dimensions of many clients found at once are those found one
    by one, for clients alike (one mapping shared), a server half whose dimensions differ
    between clients, clients with own variables and names without a program."""
    from types import SimpleNamespace as NS

    from fedmodel.algorithms.messages import PartyDims
    from fedmodel.algorithms.protocol import ServerHalf
    from fedmodel.algorithms.proxal.server import ProxALServer
    from fedmodel.algorithms.ssca.server import LearningServer

    programs = {p.name: p for p in model.compile().parties}
    names = list(programs)
    alike = NS(message_dims=lambda name: {"k_mem": 3}, message_dims_alike=lambda: True)
    dims = PartyDims(programs, alike)
    found = dims.many(names)
    assert found == [dims(n) for n in names] and found[0]["k_mem"] == 3
    # (one mapping for the clients of equal dimensions)
    assert len(set(map(id, found))) == len({tuple(sorted(d.items())) for d in found})
    own = {n: i for i, n in enumerate(names)}
    differ = NS(message_dims=lambda name: {"k": own[name]}, message_dims_alike=lambda: False)
    dims = PartyDims(programs, differ)
    assert dims.many(names) == [dims(n) for n in names]
    assert [d["k"] for d in dims.many(names)] == list(range(len(names)))
    dims = PartyDims(programs, NS(message_dims=lambda name: {}))  # (not known alike)
    assert dims.many([*names, "nobody"]) == [dims(n) for n in [*names, "nobody"]]
    owned = NS(has_owned=True, n_shared=2, owned_by=lambda name: (NS(size=len(name)),))
    theirs = {n: NS(name=n, layout=owned, m_ineq=0, m_eq=1, m_cone=0) for n in ("a", "bb")}
    dims = PartyDims(theirs, alike)
    assert [d["d_own"] for d in dims.many(["a", "bb"])] == [1, 2]
    assert dims.many(["a", "bb"]) == [dims("a"), dims("bb")]
    # a server half's own dimensions are one for all unless its class finds its own
    assert ServerHalf.message_dims_alike(object.__new__(ProxALServer))
    assert not ServerHalf.message_dims_alike(object.__new__(LearningServer))
