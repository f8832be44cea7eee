"""A deployed party never runs the coordinator's FAB code (issue 22, "a party trusts nobody").

``fedmodel join`` puts a ``flwr-clientapp`` of its own first on its SuperNode's ``PATH``
(:mod:`fedmodel.runtime.trusted_clientapp`): Flower's ClientApp process with the FAB
installation, the ClientApp loader and the dependency installation replaced. These tests
drive Flower's own ``run_clientapp`` (its Runtime API connection replaced by the test) with
a FAB made by ``fedmodel serve``'s ``make_app_dir`` whose relay is tampered: importing it
writes a sentinel file. The loopback deployment test (tests/test_flower_deployment.py,
``-m slow``) solves through the real SuperNode with such a FAB.
"""

import hashlib
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("flwr")

from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict  # noqa: E402
from flwr.cli.build import build_fab_from_disk  # noqa: E402
from flwr.common.config import get_metadata_from_config, get_project_config  # noqa: E402
from flwr.supercore.exit import ExitCode  # noqa: E402
from flwr.supercore.fab import Fab  # noqa: E402
from flwr.supercore.run import Run  # noqa: E402
from flwr.supercore.task_identity import TaskIdentity  # noqa: E402
from flwr.supernode.runtime import run_clientapp as process  # noqa: E402

from fedmodel.flower_app import make_app_dir  # noqa: E402
from fedmodel.runtime import flower_relay_app, trusted_clientapp  # noqa: E402

HOOKED = trusted_clientapp.HOOKED


@pytest.fixture
def tampered_fab(tmp_path, monkeypatch):
    """``(fab, run, sentinel)``: the FAB of ``fedmodel serve`` whose relay module writes
    ``sentinel`` when imported and when it handles a message."""
    monkeypatch.setenv("FLWR_HOME", str(tmp_path / "flwr-home"))
    sentinel = tmp_path / "fab-code-ran"
    model = tmp_path / "model.py"
    model.write_text("# a model file\n")
    app_dir = Path(make_app_dir(str(tmp_path / "app"), str(model)))
    relay = app_dir / "fedmodel_relay.py"
    relay.write_text(
        relay.read_text()
        + f"\nopen({str(sentinel)!r}, 'a').write('imported\\n')\n"
        + "_genuine = relay\n\n\n"
        + "def relay(msg, context):  # replaces the handler: runs code, then relays\n"
        + f"    open({str(sentinel)!r}, 'a').write('handled\\n')\n"
        + "    return _genuine(msg, context)\n\n\n"
        + "app._registered_funcs['query.fedmodel'] = relay\n"
    )
    content = build_fab_from_disk(app_dir)
    fab_id, fab_version = get_metadata_from_config(get_project_config(app_dir))
    run = Run.create_empty(7)
    run.fab_id, run.fab_version = fab_id, fab_version
    run.fab_hash = hashlib.sha256(content).hexdigest()
    return Fab(run.fab_hash, content, {}), run, sentinel


def _hello(node_config):
    """A ``hello`` query as the coordinator sends it, and the party's context."""
    content = RecordDict(
        {
            flower_relay_app.CALL_RECORD: ConfigRecord({"json": json.dumps({"__t": ["hello"]})}),
            flower_relay_app.ARRAY_RECORD: ArrayRecord(),
        }
    )
    msg = Message(content=content, dst_node_id=5, message_type="query.fedmodel")
    msg.metadata.__dict__["_message_id"] = msg.object_id
    context = Context(
        run_id=7, node_id=5, node_config=node_config, state=RecordDict(), run_config={}
    )
    return msg, context


def _run_flower_clientapp(monkeypatch, fab, run, node_config, dependency_install=False):
    """Flower's ``run_clientapp`` on one ``hello`` message; its Runtime API (SuperNode)
    replaced by this test. Returns ``(reply, exit_code)``."""
    for name, value in (("_task_id", 1), ("_run_id", 7), ("_node_id", 5)):  # as Flower's
        monkeypatch.setattr(TaskIdentity, name, value)  # pull_task_input sets them
    msg, context = _hello(node_config)
    seen = {}

    class NoClient:
        @classmethod
        def from_server_address(cls, **kwargs):
            return cls()

        def close(self):
            pass

    class NoHeartbeat:
        is_running = False

        def __init__(self, fn):
            pass

        def start(self):
            pass

    monkeypatch.setattr(process, "RuntimeHttpClient", NoClient)
    monkeypatch.setattr(process, "HeartbeatSender", NoHeartbeat)
    monkeypatch.setattr(process, "register_signal_handlers", lambda **kw: None)
    monkeypatch.setattr(process, "event", lambda *a, **kw: None)
    monkeypatch.setattr(process, "pull_task_input", lambda client: (msg, context, run, fab))
    monkeypatch.setattr(process, "push_message", lambda c, m, ctx: seen.update(reply=m))
    monkeypatch.setattr(process, "flwr_exit", lambda code, **kw: seen.update(code=code))
    process.run_clientapp(
        runtime_api_address="127.0.0.1:1",
        token="t",
        insecure=True,
        runtime_dependency_install=dependency_install,
    )
    return seen.get("reply"), seen.get("code")


@pytest.fixture
def hooks(monkeypatch):
    """install_trusted_hooks, undone after the test (Flower's names restored)."""
    for name in HOOKED:
        monkeypatch.setattr(process, name, getattr(process, name))
    trusted_clientapp.install_trusted_hooks()


def test_the_trusted_loader_gives_the_installed_relay_whatever_the_fab(tampered_fab, hooks):
    fab, run, sentinel = tampered_fab
    load = process.get_load_client_app_fn(default_app_ref="", app_path=None, multi_app=True)
    app = load(run.fab_id, run.fab_version, fab.hash_str)
    assert app is trusted_clientapp.load_relay_app()
    relay_module = sys.modules["fedmodel_trusted_relay"]
    assert os.path.samefile(relay_module.__file__, flower_relay_app.__file__)
    process.install_from_fab(fab.content, skip_prompt=True)  # a no-op: nothing unpacked
    assert not (Path(os.environ["FLWR_HOME"]) / "apps").exists()
    assert not sentinel.exists()


def test_flower_clientapp_with_the_hooks_answers_with_the_installed_relay(
    tampered_fab, hooks, monkeypatch
):
    fab, run, sentinel = tampered_fab
    reply, code = _run_flower_clientapp(monkeypatch, fab, run, {"partition-id": 3})
    assert code == ExitCode.SUCCESS and not reply.has_error(), (code, reply)
    answer = json.loads(flower_relay_app.parts_of(reply.content)[1])
    assert answer == {"node_config": {"partition-id": 3}}
    assert not sentinel.exists()
    assert not (Path(os.environ["FLWR_HOME"]) / "apps").exists()  # the FAB never unpacked
    # a dependency installation asked for anyway is refused (main forces it off)
    reply, code = _run_flower_clientapp(
        monkeypatch, fab, run, {"partition-id": 3}, dependency_install=True
    )
    assert code == ExitCode.TASK_PROC_EXCEPTION and reply.has_error()
    assert "dependency installation" in reply.error.reason
    assert not sentinel.exists()


def test_without_the_hooks_flower_runs_the_fab_code(tampered_fab, monkeypatch):
    """The control: the same message through Flower's ``run_clientapp`` as shipped imports
    the FAB's relay (what ``fedmodel join`` prevents); the sentinel is written."""
    fab, run, sentinel = tampered_fab
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delitem(sys.modules, "fedmodel_relay", raising=False)
    try:
        reply, code = _run_flower_clientapp(monkeypatch, fab, run, {"partition-id": 3})
    finally:
        sys.modules.pop("fedmodel_relay", None)
    assert code == ExitCode.SUCCESS and not reply.has_error(), (code, reply)
    assert sentinel.read_text() == "imported\nhandled\n"


def test_the_shim_runs_the_trusted_clientapp(tmp_path):
    """The ``flwr-clientapp`` ``fedmodel join`` puts first on the SuperNode's PATH: this
    user's only, and it runs :mod:`fedmodel.runtime.trusted_clientapp` (Flower's argument
    parser answers ``--help``; the module is run as a file, not from the FAB)."""
    shim = trusted_clientapp.write_shim(str(tmp_path / "bin"))
    assert os.path.basename(shim) == "flwr-clientapp"
    assert stat.S_IMODE(os.stat(shim).st_mode) == 0o700
    text = Path(shim).read_text()
    assert os.path.abspath(trusted_clientapp.__file__) in text and sys.executable in text
    env = dict(os.environ, PATH=os.pathsep.join([str(tmp_path / "bin"), os.environ["PATH"]]))
    out = subprocess.run(
        ["flwr-clientapp", "--help"], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert "Run a Flower ClientApp" in out.stdout


def test_the_shims_refuse_every_other_task_command(tmp_path):
    """A coordinator can make a SuperNode run other task types from its FAB (a run whose
    primary task is an AgentApp: ``flwr-agentapp``); every such command on the party's
    PATH refuses to start, before anything of the FAB is read."""
    from flwr.supercore.constant import TASK_TYPE_TO_COMMAND

    trusted_clientapp.write_shim(str(tmp_path / "bin"))
    others = set(TASK_TYPE_TO_COMMAND.values()) - {"flwr-clientapp"}
    assert "flwr-agentapp" in others
    assert sorted(os.listdir(tmp_path / "bin")) == sorted(others | {"flwr-clientapp"})
    env = dict(os.environ, PATH=os.pathsep.join([str(tmp_path / "bin"), os.environ["PATH"]]))
    for command in others:
        out = subprocess.run(
            [command, "--runtime-api-address", "127.0.0.1:1", "--token", "t"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 1, (command, out)
        assert f"fedmodel party: refused to start {command}" in out.stderr


def test_main_turns_runtime_dependency_installation_off(hooks, monkeypatch):
    """``--allow-runtime-dependency-installation`` (which a SuperNode passes on when it was
    started with it) reaches Flower's ``run_clientapp`` as off."""
    import importlib

    cli = importlib.import_module("flwr.supernode.cli.flwr_clientapp")
    calls = []
    monkeypatch.setattr(cli, "run_clientapp", lambda **kw: calls.append(kw))
    monkeypatch.setattr(
        sys,
        "argv",
        ["flwr-clientapp", "--runtime-api-address", "127.0.0.1:1", "--token", "t", "--insecure",
         "--allow-runtime-dependency-installation"],
    )  # fmt: skip
    trusted_clientapp.main()
    assert len(calls) == 1 and calls[0]["runtime_dependency_install"] is False
    assert calls[0]["runtime_api_address"] == "127.0.0.1:1"
    assert process.get_load_client_app_fn is trusted_clientapp.trusted_load_client_app_fn


# -- fedmodel join's SuperNode: the trusted executor (trusted_supernode) -----------------------
def _node_with_task(monkeypatch, fab, run, node_config, task_type="flwr-clientapp"):
    """A SuperNode's state as Flower's loop leaves it after pulling a ``hello`` from the
    SuperLink (run, FAB, context, the message and its objects, a pending task)."""
    from flwr.supercore.object_store import ObjectStoreFactory
    from flwr.supernode.nodestate import NodeStateFactory
    from flwr.supernode.start_client_internal import _insert_message

    for name, value in (("_task_id", 1), ("_run_id", run.run_id), ("_node_id", 5)):
        monkeypatch.setattr(TaskIdentity, name, value)
    factory = NodeStateFactory(objectstore_factory=ObjectStoreFactory())
    state = factory.state()
    state.set_node_id(5)
    msg, context = _hello(node_config)
    state.store_run(run)
    state.store_fab(fab)
    state.set_run_series_context(run.series_id, context)
    task_id = state.create_task(task_type=task_type, run_id=run.run_id, fab_hash=run.fab_hash)
    _insert_message(msg, state, factory.objectstore_factory.store())
    return state, task_id


def _reply(state):
    """The one reply the SuperNode would send (inflated from its object store)."""
    from flwr.supercore.inflatable.inflatable_object import iterate_object_tree
    from flwr.supercore.inflatable.inflatable_utils import inflate_object_from_contents

    (stored,) = state.get_messages_legacy(is_reply=True)
    mid = stored.metadata.message_id
    tree = state.object_store.get_object_tree(mid)
    contents = {t.object_id: state.object_store.get(t.object_id) for t in iterate_object_tree(tree)}
    return inflate_object_from_contents(mid, contents)


def _task_status(state, task_id):
    task = state.get_tasks(task_ids=[task_id])[0]
    return task.status.status, task.status.sub_status


def test_the_supernode_executor_answers_with_the_installed_relay(tampered_fab, monkeypatch):
    """``fedmodel join``'s SuperNode runs each ClientApp task in its own process: the task
    is claimed and answered through Flower's Runtime API handlers by the relay of this
    installation; the FAB the coordinator shipped is never unpacked nor imported."""
    from fedmodel.runtime.trusted_supernode import TrustedExecutor

    fab, run, sentinel = tampered_fab
    state, task_id = _node_with_task(monkeypatch, fab, run, {"partition-id": 3})
    woken = []
    executor = TrustedExecutor(state, on_reply=lambda: woken.append(True))
    assert executor.run_pending() == 1 and woken == [True]
    reply = _reply(state)
    assert not reply.has_error()
    status, text, arrays = flower_relay_app.parts_of(reply.content)
    assert (status, json.loads(text), arrays) == ("ok", {"node_config": {"partition-id": 3}}, [])
    assert _task_status(state, task_id) == ("finished", "completed")
    assert not sentinel.exists()
    assert not (Path(os.environ["FLWR_HOME"]) / "apps").exists()  # the FAB never unpacked
    assert executor.run_pending() == 0  # nothing else pending


def test_the_supernode_executor_refuses_an_agentapp_task(tampered_fab, monkeypatch):
    """A run whose primary task is an AgentApp would run the FAB's code: the executor
    answers it with an error (so the SuperNode goes on) and fails the task."""
    from fedmodel.runtime.trusted_supernode import TrustedExecutor

    fab, run, sentinel = tampered_fab
    state, task_id = _node_with_task(monkeypatch, fab, run, {}, task_type="flwr-agentapp")
    assert TrustedExecutor(state).run_pending() == 1
    reply = _reply(state)
    assert reply.has_error() and "refused to run a flwr-agentapp task" in reply.error.reason
    assert _task_status(state, task_id) == ("finished", "failed")
    assert not sentinel.exists()


def test_the_supernode_loop_is_patched_and_needs_process_isolation(monkeypatch):
    """``install`` replaces the waits, the pull and the push of Flower's SuperNode loop, and
    the loop refuses to start in Flower's default subprocess isolation (where Flower's
    SuperExec would start the task processes)."""
    from flwr.supernode import start_client_internal as loop

    from fedmodel.runtime import trusted_supernode

    for name in ("time", "_pull_and_store_message", "_push_messages", "start_client_internal"):
        monkeypatch.setattr(loop, name, getattr(loop, name))
    polling = trusted_supernode.PromptPolling()
    trusted_supernode.install(polling, [])
    assert loop.time.sleep == polling.sleep and loop.time.monotonic is __import__("time").monotonic
    with pytest.raises(RuntimeError, match="--isolation process"):
        loop.start_client_internal(state_factory=None, isolation="subprocess")


def test_prompt_polling_waits_for_the_expected_message_then_backs_off():
    from fedmodel.runtime.trusted_supernode import PromptPolling

    polls = PromptPolling(min_poll=0.02, backoff=0.25, max_poll=3.0, lead=0.7)
    assert polls.idle_interval(0.0) == 0.02  # nothing known yet: prompt
    polls.gaps.extend([0.5, 0.4, 0.6])
    polls.replied()
    assert polls.idle_interval(0.0) == pytest.approx(0.28)  # due at 0.7 * 0.4 s
    assert polls.idle_interval(0.3) == pytest.approx(0.075)  # then a quarter of the wait
    assert polls.idle_interval(100.0) == 3.0  # a quiet federation: Flower's rate


def test_no_poll_right_after_a_reply_before_the_next_message_is_due():
    # Flower's loop polls again as soon as a reply is pushed: that poll waits until the
    # next message is due (0.7 * the shortest recent gap), and not at all before any gap
    # is known or when the reply is older than that
    import time

    from fedmodel.runtime.trusted_supernode import PromptPolling

    polls = PromptPolling(lead=0.7)
    polls.replied()
    t0 = time.monotonic()
    polls.wait_until_due()  # nothing known yet: no wait
    assert time.monotonic() - t0 < 0.05
    polls.gaps.extend([0.3, 0.2])
    polls.replied()
    t0 = time.monotonic()
    polls.wait_until_due()
    assert time.monotonic() - t0 >= 0.14 - 1e-3  # due at 0.7 * 0.2 s after the reply
    polls.message_seen()  # a message: not idle after a reply any more
    t0 = time.monotonic()
    polls.wait_until_due()
    assert time.monotonic() - t0 < 0.05
