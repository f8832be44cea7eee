"""The method protocol and the driver: a method written as a ServerHalf + ClientHalf runs on
any backend with checkpoints and failure policies, and a new method is a registry line."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
from problems import least_squares_model

import fedmodel as fm
from fedmodel.algorithms.baselines.fedavg import FedAvgOptions, run_fedavg
from fedmodel.algorithms.common import starting_point
from fedmodel.algorithms.driver import run_federated
from fedmodel.algorithms.messages import evaluate_spec, report_spec
from fedmodel.algorithms.options import RuntimeOptions, positive, stop_only
from fedmodel.algorithms.protocol import ClientHalf, MethodSpec, ServerHalf, StepReport
from fedmodel.algorithms.registry import available_methods, register_method
from fedmodel.runtime.checkpoint import CheckpointError
from fedmodel.runtime.endpoints import EndpointFactory
from fedmodel.runtime.faults import Fault
from fedmodel.runtime.messages import Message
from fedmodel.runtime.schema import Field, MessageSpec, MessageTable

# -- a new method in a few lines: gradient descent with exact averaging ------------------------
# (the whole method, from TOY to the registration in the test, is the walkthrough of
# docs/architecture.md "Add a method"; test_the_toy_method_fits_in_80_lines counts it)
TOY = MessageTable(
    "toy",
    (
        MessageSpec(
            "gradient",
            request={"w": Field(("d",))},
            reply={"g": Field(("d",), reveals="the gradient of f_i at w")},
            reveals="its gradient at the server's point",
        ),
        evaluate_spec(),
        report_spec(),
    ),
)


@dataclass
class GradientOptions(RuntimeOptions):
    step: float = 0.1
    max_steps: int = stop_only(2000)  # a cap: a resumed run may go further
    eps: float = stop_only(1e-6)  # the certificate's tolerance (eps1 = eps2 = eps)

    def validate(self, compiled, method):
        positive("step", self.step)


class GradientClient(ClientHalf):
    """Sends the gradient of its own f_i at the model it receives."""

    messages = TOY
    state_fields = ("calls",)

    def __init__(self, program, options):
        super().__init__(program)
        self.calls = 0

    def _on_gradient(self, w):
        self.calls += 1
        _, g = self.program.functions.objective_and_grad(np.asarray(w, dtype=float))
        return {"g": g}


class GradientServer(ServerHalf):
    messages = TOY
    state_fields = ("x",)

    def __init__(self, compiled, options):
        super().__init__(compiled.server, options)
        self.reg, self.max_steps = compiled.regularizer, options.max_steps
        self.x = starting_point(compiled, None)

    def start(self, runtime):
        pass

    def step(self, runtime, deadline):
        runtime.next_round()
        g = sum(r.payload["g"] for r in runtime.broadcast("gradient", {"w": self.x}).values())
        x_new = self.reg.prox(self.x - self.options.step * g, self.options.step)
        dx = float(np.abs(x_new - self.x).max())
        self.x = x_new
        return StepReport(info={"dx": dx}, stop="stopped" if dx < 1e-10 else None)

    def point(self):
        return self.x


def run_gradient(compiled, options, method):
    clients = {
        c.name: EndpointFactory(GradientClient, (c, options.for_clients()))
        for c in compiled.clients
    }
    return run_federated(compiled, options, method, GradientServer(compiled, options), clients)


TOY_END = "(the toy method ends here)"


def test_the_toy_method_fits_in_80_lines():
    import inspect
    import sys

    source = inspect.getsource(sys.modules[__name__])
    start = source.index("TOY = MessageTable(")
    lines = source[start : source.index("TOY_END = ")].splitlines()
    code = [ln for ln in lines if ln.strip() and not ln.strip().startswith("#")]
    assert len(code) + 1 <= 80  # (+ the register_method line in the test)


@pytest.fixture
def toy_method(monkeypatch):
    from fedmodel.algorithms import registry

    # registered for this test only: other tests iterate over every registered method
    monkeypatch.setattr(registry, "_REGISTERED", dict(registry._REGISTERED))
    register_method("toy-gd", MethodSpec(GradientOptions, run_gradient, "test method"))
    return "toy-gd"


def test_a_new_method_is_a_server_half_a_client_half_and_a_registry_line(toy_method, tmp_path):
    assert toy_method in available_methods()
    model = least_squares_model()
    ref = model.solve("centralized")
    res = model.solve(toy_method, step=0.1)
    assert res.status == "optimal", res.message
    assert res.kkt.stationarity <= 1e-6
    assert res.compare(ref).relative_objective_difference <= 1e-6
    # the ledger holds only the declared messages: w down, g up; the certificate's
    kinds = {r["kind"] for r in res.ledger}
    assert kinds == {"gradient", "gradient_reply", "evaluate", "evaluate_reply", "report",
                     "report_reply"}  # fmt: skip
    declared = {k for spec in TOY.specs for k in (spec.kind, spec.kind + "_reply")}
    assert kinds <= declared
    assert len(res.history) == res.rounds["outer"]
    # checkpoint after 5 steps, resume with the cap raised (a stop-only option): the same run
    ck = tmp_path / "ck"
    cut = model.solve(toy_method, step=0.1, max_steps=5, checkpoint=ck)
    assert cut.status == "max_iterations" and cut.checkpoint == str(ck)
    resumed = model.solve(toy_method, step=0.1, resume=ck)
    assert np.array_equal(resumed.x, res.x) and resumed.rounds == res.rounds
    assert [h["objective"] for h in resumed.history] == [h["objective"] for h in res.history]
    with pytest.raises(CheckpointError, match=r"different options \(step: 0.1 -> 0.2\)"):
        model.solve(toy_method, step=0.2, resume=ck)
    with pytest.raises(fm.ModelError, match="step must be a positive number"):
        model.solve(toy_method, step=-1.0)


@pytest.mark.parametrize("backend", ["processes", "ray"])
def test_the_toy_method_runs_on_every_backend(toy_method, backend):
    if backend == "ray":
        ray = pytest.importorskip("ray")
        import sys

        # the toy's classes live in this test module: Ray's workers receive them by value
        ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    model = least_squares_model()
    serial = model.solve(toy_method, step=0.1, max_steps=30)
    other = model.solve(toy_method, step=0.1, max_steps=30, backend=backend, workers=2)
    assert other.extra["backend"] == backend
    assert np.array_equal(serial.x, other.x)
    assert serial.rounds == other.rounds
    assert serial.communication == other.communication


def test_unknown_message_kind_names_the_party():
    model = least_squares_model(1)
    client = GradientClient(model.compile().clients[0], GradientOptions())
    with pytest.raises(ValueError, match="site0.*unknown message kind 'nope'"):
        client.handle(Message("nope", "server", "site0", {}, 1))
    with pytest.raises(ValueError, match="'gradient' without its field 'w'"):
        client.handle(Message("gradient", "server", "site0", {}, 1))
    with pytest.raises(ValueError, match="'gradient' with the undeclared field 'v'"):
        client.handle(Message("gradient", "server", "site0", {"w": np.zeros(4), "v": 1}, 1))


def test_a_peer_handler_gets_the_sender():
    class Peer(ClientHalf):
        messages = MessageTable("peer", (MessageSpec("hi", direction="peer", request={}),))

        def _on_hi(self, sender):
            self.last = sender

    model = least_squares_model(1)
    peer = Peer(model.compile().clients[0])
    assert peer.handle(Message("hi", "site7", "site0", {}, 1)) is None
    assert peer.last == "site7"


# -- fedavg on the driver: backends, checkpoints, failures --------------------------------------
def fedavg_options(**kw):
    return FedAvgOptions(local_steps=2, max_rounds=25, tol=1e-12, **kw)


def test_fedavg_gives_the_same_iterates_on_every_backend():
    compiled = least_squares_model().compile()
    serial = run_fedavg(compiled, fedavg_options())
    procs = run_fedavg(compiled, fedavg_options(backend="processes", workers=2))
    assert procs.extra["backend"] == "processes"
    assert np.array_equal(serial.x, procs.x)
    assert serial.rounds == procs.rounds
    assert serial.communication["floats_up"] == procs.communication["floats_up"]


@pytest.mark.parametrize("stop", ["client_failure", "time_limit"])
def test_fedavg_resumes_from_a_checkpoint_bit_for_bit(tmp_path, stop):
    compiled = least_squares_model().compile()
    full = run_fedavg(compiled, fedavg_options())
    ck = tmp_path / "ck"
    if stop == "client_failure":
        cut = run_fedavg(
            compiled,
            fedavg_options(checkpoint=ck, checkpoint_every=2),
            faults={"site2": Fault("raise", round=4)},
        )
    else:  # a time-limited run leaves a checkpoint of where it stopped
        cut = run_fedavg(compiled, fedavg_options(checkpoint=ck, time_limit=1e-9))
    assert cut.status == stop
    assert cut.checkpoint == str(ck)
    resumed = run_fedavg(compiled, fedavg_options(resume=ck))
    assert np.array_equal(resumed.x, full.x)
    assert resumed.rounds["outer"] == full.rounds["outer"]
    assert len(resumed.history) == len(full.history)


def test_fedavg_client_failure_returns_the_last_consistent_iterate():
    compiled = least_squares_model().compile()
    res = run_fedavg(compiled, fedavg_options(), faults={"site1": Fault("raise", round=4)})
    assert res.status == "client_failure"
    assert res.failure["client"] == "site1"
    assert np.all(np.isfinite(res.x))
    retried = run_fedavg(
        compiled,
        fedavg_options(on_failure="retry"),
        faults={"site1": Fault("raise", round=4)},
    )
    clean = run_fedavg(compiled, fedavg_options())
    assert np.array_equal(retried.x, clean.x)


def test_dald_cc_runs_on_the_driver_on_every_backend_and_resumes(tmp_path):
    model = least_squares_model(n_clients=3, seed=2)
    serial = model.solve("dald-cc", eps_pri=1e-7, eps_dual=1e-7)
    procs = model.solve("dald-cc", eps_pri=1e-7, eps_dual=1e-7, backend="processes", workers=2)
    assert serial.status == procs.status == "optimal"
    assert np.array_equal(serial.x, procs.x)
    assert serial.rounds == procs.rounds
    ck = tmp_path / "dald"
    cut = model.solve("dald-cc", eps_pri=1e-7, eps_dual=1e-7, checkpoint=ck, time_limit=1e-9)
    assert cut.status == "time_limit"
    resumed = model.solve("dald-cc", eps_pri=1e-7, eps_dual=1e-7, resume=ck)
    assert np.array_equal(resumed.x, serial.x)
    assert resumed.rounds == serial.rounds


@pytest.mark.parametrize("method", ["dald-dc", "dgd"])
def test_peer_to_peer_methods_run_on_the_driver_on_every_backend_and_resume(tmp_path, method):
    model = least_squares_model(n_clients=3, seed=3)
    kw = (
        {"eps_pri": 1e-6, "eps_dual": 1e-6, "topology": "chain"}
        if method == "dald-dc"
        else {"topology": "ring", "max_rounds": 40, "tol": 1e-12}
    )
    serial = model.solve(method, **kw)
    procs = model.solve(method, backend="processes", workers=2, **kw)
    assert np.array_equal(serial.x, procs.x)
    assert serial.rounds == procs.rounds
    assert serial.communication["floats_peer"] == procs.communication["floats_peer"] > 0
    ck = tmp_path / method
    cut = model.solve(method, checkpoint=ck, time_limit=1e-9, **kw)
    assert cut.status == "time_limit"
    resumed = model.solve(method, resume=ck, **kw)
    assert np.array_equal(resumed.x, serial.x)
    assert resumed.rounds == serial.rounds


def test_declared_state_is_restored_as_a_copy_and_a_missing_field_is_named():
    compiled = least_squares_model(2).compile()
    server = GradientServer(compiled, GradientOptions())
    saved = {"x": np.arange(4.0)}
    server.set_state(saved)
    server.x[0] = 9.0  # the server's array is its own: the saved state is untouched
    assert saved["x"][0] == 0.0 and server.get_state()["x"][0] == 9.0
    with pytest.raises(
        ValueError, match=r"GradientServer: .* lacks the declared field\(s\) \['x'\]"
    ):
        server.set_state({})
    client = GradientClient(compiled.clients[0], GradientOptions())
    client.handle(Message("gradient", "server", "site0", {"w": np.zeros(4)}, 1))
    state = client.get_state()
    assert state["calls"] == 1 and state["stats"]["seconds"] > 0
    client.handle(Message("gradient", "server", "site0", {"w": np.zeros(4)}, 2))
    client.set_state(state)
    assert client.calls == 1
