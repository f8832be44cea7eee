"""The Flower SuperNode of a deployed fedmodel party: Flower's own, with the party's relay
ClientApp running in it for every message, and prompt polling.

Flower 1.42's deployment engine costs seconds per message, from three fixed costs: the
SuperNode's SuperExec starts a fresh ``flwr-clientapp`` process for every message
(Python, Flower's imports: 1-10 s on a loaded machine), an idle SuperNode polls the
SuperLink every 3 s, and it waits for the ClientApp's reply polling its state every
0.5 s (all hard-coded). A prox-al round, milliseconds of computation, took 7-20 s.
``fedmodel join`` runs this file in place of ``flower-supernode`` (with Flower's own
arguments): Flower's ``flower-supernode`` entry point, unchanged except that

* it runs with ``--isolation process``: the SuperNode starts no SuperExec and no task
  process. The ClientApp tasks are run by :class:`TrustedExecutor`, a thread of this
  process that claims each task from the SuperNode's state through Flower's own Runtime
  API handlers (called in-process: no HTTP, no token leaves the process), pulls the
  message, runs the relay ClientApp **of this fedmodel installation**
  (:func:`fedmodel.runtime.trusted_clientapp.load_relay_app`) and pushes its reply and
  the task's status: what Flower's ``flwr-clientapp`` does, minus the coordinator's FAB
  (never installed, never imported) and runtime dependency installation. A task of
  another type (an AgentApp run) is refused: it is answered with an error and finished
  as failed, so the SuperNode goes on serving. The Runtime API's HTTP port stays open (Flower
  always serves it) but claiming a task there needs the SuperExec secret
  (``--superexec-auth-secret-file``), which ``fedmodel join`` writes in its private
  directory;
* an idle SuperNode polls the SuperLink when the next message is due and backs off to
  Flower's 3 s when the federation is quiet (:class:`PromptPolling`), it learns that
  a reply is ready at once, and it retries an object of a message that is not uploaded
  yet after 10 ms rather than Flower's 1 s (:func:`prompt_object_pulls`).

This file imports only Flower and the standard library (and, through
``trusted_clientapp``, the relay: numpy and Flower); it is run as a script.

Example
-------
>>> from fedmodel.runtime.trusted_supernode import PromptPolling
>>> polls = PromptPolling()
>>> polls.idle_interval(idle=0.0) == polls.min_poll
True
>>> polls.idle_interval(idle=3600.0)
3.0
>>> polls.gaps.append(0.4); polls.replied()
>>> round(polls.idle_interval(idle=0.1), 3)  # the next message is due in about 0.28 s
0.18
"""

from __future__ import annotations

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
if __name__ == "__main__" and sys.path and os.path.abspath(sys.path[0] or ".") == _HERE:
    del sys.path[0]  # run as a script: this directory's modules must not shadow others

import collections  # noqa: E402
import importlib.util  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from logging import ERROR, INFO  # noqa: E402
from typing import Any  # noqa: E402

#: the isolation mode the SuperNode must run with (no SuperExec of Flower's)
ISOLATION = "process"
#: seconds between a running task's heartbeats (Flower's task processes: about 20 s; a
#: running task without one for 60 s is failed by the SuperNode)
HEARTBEAT_SECONDS = 20.0


def _trusted_clientapp():
    """:mod:`fedmodel.runtime.trusted_clientapp` (loaded from its file next to this one
    when run as a script, without importing the fedmodel package)."""
    name = "fedmodel.runtime.trusted_clientapp"
    if name in sys.modules:
        return sys.modules[name]
    module = sys.modules.get("fedmodel_trusted_clientapp")
    if module is None:
        path = os.path.join(_HERE, "trusted_clientapp.py")
        spec = importlib.util.spec_from_file_location("fedmodel_trusted_clientapp", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules["fedmodel_trusted_clientapp"] = module
        spec.loader.exec_module(module)
    return module


class InProcessRuntimeClient:
    """Flower's Runtime API of this SuperNode for one task, called in-process: each method
    is the handler Flower's HTTP route calls (``flwr.supernode.servicer.runtime``), with
    the task the token names (the route's task-token authentication). It has the methods
    of Flower's ``RuntimeHttpClient`` that ``flwr.supernode.runtime.run_clientapp``'s
    ``pull_task_input`` / ``push_message`` / ``push_task_output`` call."""

    #: the RPCs a ClientApp task makes, and the module of Flower's handler for each
    RPCS = {
        "PullTaskInput": ("node", "pull_task_input"),
        "PullMessages": ("node", "pull_messages"),
        "PullObject": ("node", "pull_object"),
        "ConfirmMessageReceived": ("node", "confirm_message_received"),
        "PushMessages": ("node", "push_messages"),
        "PushObject": ("node", "push_object"),
        "PushTaskOutput": ("node", "push_task_output"),
        "SendTaskHeartbeat": ("core", "send_task_heartbeat"),
    }

    def __init__(self, state: Any, token: str):
        from flwr.supercore.servicer.runtime import runtime_handlers as core
        from flwr.supernode.servicer.runtime import runtime_handlers as node

        self.state = state
        self.token = token
        self._modules = {"node": node, "core": core}

    def _task(self):
        from flwr.supercore.error import ApiErrorCode, FlowerError

        task = self.state.get_task_by_token(self.token)
        if task is None:
            raise FlowerError(
                ApiErrorCode.RUNTIME_AUTHENTICATION_FAILED,
                "Runtime task-token authentication failed.",
            )
        return task

    def __getattr__(self, rpc: str):
        if rpc not in self.RPCS:
            raise AttributeError(rpc)
        module, name = self.RPCS[rpc]
        handler = getattr(self._modules[module], name)

        def call(request):
            return handler(request, self.state, self._task())

        return call

    def close(self) -> None:
        pass


class TrustedExecutor:
    """Run this SuperNode's tasks in this process (see the module docstring): a ClientApp
    task with the relay of this fedmodel installation, any other task refused.

    Parameters
    ----------
    state : NodeState
        The SuperNode's state (the one its Runtime API serves).
    on_reply : callable, optional
        Called after a task's reply and status are pushed (wakes the SuperNode's loop).
    """

    def __init__(self, state: Any, on_reply=None):
        self.state = state
        self.on_reply = on_reply or (lambda: None)
        self.wake = threading.Event()
        self.stopped = threading.Event()
        self.tasks_run = 0

    def acquire(self):
        """Claim the oldest pending task of any type (Flower's AcquireTask); returns
        ``(task, token)`` or ``None``."""
        from flwr.proto.runtime_pb2 import AcquireTaskRequest
        from flwr.supercore.constant import TaskType
        from flwr.supernode.servicer.runtime import runtime_handlers

        request = AcquireTaskRequest(supported_task_types=[str(t) for t in TaskType])
        res = runtime_handlers.acquire_task(request, self.state)
        if res.HasField("task") and res.token:
            return res.task, res.token
        return None

    def run_pending(self) -> int:
        """Run every pending task; returns how many ran."""
        n = 0
        while (claimed := self.acquire()) is not None:
            self.run_task(*claimed)
            n += 1
        return n

    def run_task(self, task: Any, token: str) -> None:
        """One task, as Flower's ``flwr-clientapp`` runs it (``run_clientapp``), with this
        installation's relay for a ClientApp task; the FAB the task names is never
        installed nor imported (its bytes are read from the state and dropped)."""
        from flwr.app import Message
        from flwr.app.error import Error
        from flwr.common.constant import ErrorCode, SubStatus
        from flwr.supercore import log
        from flwr.supercore.constant import TaskType
        from flwr.supernode.runtime.run_clientapp import (
            pull_task_input,
            push_message,
            push_task_output,
        )

        client = InProcessRuntimeClient(self.state, token)
        message = context = reply = None
        sub_status, details = SubStatus.FAILED, "ClientApp task failed due to unknown reason"
        beat = threading.Event()
        heartbeat = threading.Thread(
            target=self._heartbeat, args=(client, beat), name="task-heartbeat", daemon=True
        )
        heartbeat.start()
        try:
            message, context, _run, _fab = pull_task_input(client)
            del _fab  # the coordinator's app bundle: never unpacked, never run
            if task.type != TaskType.CLIENT_APP:
                raise PermissionError(
                    f"fedmodel party: refused to run a {task.type} task (the coordinator's "
                    "run asked for it): this party runs only the relay ClientApp of its "
                    "own fedmodel"
                )
            relay = _trusted_clientapp().load_relay_app()
            reply = relay(message=message, context=context)
            sub_status, details = SubStatus.COMPLETED, ""
        except Exception as exc:  # noqa: BLE001 - answered to the coordinator, as Flower does
            reason = f"{type(exc)}:<'{exc}'>"
            log(ERROR, "ClientApp raised an exception", exc_info=exc)
            details = reason
            if message is not None:
                reply = Message(
                    Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=reason),
                    reply_to=message,
                )
        finally:
            beat.set()
            try:
                if reply is not None and context is not None:
                    push_message(client, reply, context)
            except Exception as exc:  # noqa: BLE001
                log(ERROR, "Failed to push reply message", exc_info=exc)
            try:
                push_task_output(client, context, sub_status, details)
            except Exception as exc:  # noqa: BLE001
                log(ERROR, "Failed to push the task's output", exc_info=exc)
            self.tasks_run += 1
            self.on_reply()

    @staticmethod
    def _heartbeat(client: InProcessRuntimeClient, done: threading.Event) -> None:
        from flwr.proto.runtime_pb2 import SendTaskHeartbeatRequest

        while not done.wait(HEARTBEAT_SECONDS):
            try:
                if not client.SendTaskHeartbeat(SendTaskHeartbeatRequest()).success:
                    return
            except Exception:  # noqa: BLE001 - the task is over
                return

    def serve(self, idle_seconds: float = 1.0) -> None:
        """Run tasks until :meth:`stop`, woken by :meth:`notify` (and every
        ``idle_seconds``)."""
        from flwr.supercore import log

        while not self.stopped.is_set():
            self.wake.clear()
            try:
                self.run_pending()
            except Exception as exc:  # noqa: BLE001 - keep serving
                log(ERROR, "fedmodel: claiming a task failed", exc_info=exc)
            self.wake.wait(idle_seconds)

    def notify(self) -> None:
        """A message was stored: a task is pending."""
        self.wake.set()

    def stop(self) -> None:
        self.stopped.set()
        self.wake.set()


class PromptPolling:
    """The SuperNode's waits, prompt while the federation is busy.

    Flower's loop sleeps 3 s whenever the SuperLink has no message for it, and 0.5 s
    between looks at whether the ClientApp's reply is ready. Here, after a reply, the
    first poll of the SuperLink comes at ``lead`` times the shortest of the last few gaps
    between a reply and the next message (the coordinator's rounds take about as long as
    the last ones: no poll before it is due), then the wait is a fraction (``backoff``)
    of the time since the reply, between ``min_poll`` and Flower's 3 s: a message that
    arrives ``t`` seconds after the reply waits at most about ``backoff * t`` more, and a
    quiet SuperNode is back to Flower's rate after ``3 / backoff`` seconds. A reply wakes
    the loop at once (:meth:`reply_ready`).
    """

    def __init__(
        self,
        min_poll: float = 0.02,
        backoff: float = 0.25,
        max_poll: float = 3.0,
        lead: float = 0.7,
        history: int = 3,
    ):
        self.min_poll, self.backoff, self.max_poll = min_poll, backoff, max_poll
        self.lead = lead
        self.gaps: collections.deque[float] = collections.deque(maxlen=history)
        self.last_message = time.monotonic()
        self._replied = False  # idle since a reply (not since start-up)
        self._reply = threading.Event()
        self.polls = self.messages = 0  # SuperLink polls that found nothing; messages

    def idle_interval(self, idle: float) -> float:
        """Seconds to wait before the next poll, ``idle`` seconds after the last reply."""
        due = self.lead * min(self.gaps) if self.gaps and self._replied else 0.0
        if idle < due:
            return min(self.max_poll, due - idle)
        return min(self.max_poll, max(self.min_poll, self.backoff * idle))

    def message_seen(self) -> None:
        """A message arrived: the gap since the last reply is remembered."""
        now = time.monotonic()
        self.messages += 1
        if self._replied and now - self.last_message < self.max_poll:
            self.gaps.append(now - self.last_message)
        self.last_message, self._replied = now, False

    def replied(self) -> None:
        """The reply to the last message was sent: idle from now."""
        self.last_message, self._replied = time.monotonic(), True

    def reply_ready(self) -> None:
        self._reply.set()

    def wait_until_due(self) -> None:
        """Before a poll of the SuperLink: right after a reply, wait until the next
        message is due (Flower's loop polls again as soon as it has pushed a reply, a
        poll that always finds nothing: the coordinator needs every party's reply first)."""
        if self._replied and self.gaps:
            idle = time.monotonic() - self.last_message
            due = self.lead * min(self.gaps)
            if idle < due:
                time.sleep(min(self.max_poll, due - idle))

    def sleep(self, seconds: float) -> None:
        """Replaces ``time.sleep`` in Flower's SuperNode loop."""
        if seconds >= 1.0:  # the idle poll of the SuperLink (3 s) found nothing
            self.polls += 1
            time.sleep(self.idle_interval(time.monotonic() - self.last_message))
        else:  # waiting for the ClientApp's reply, or its content (0.5 s)
            self._reply.wait(min(seconds, 0.05))
            self._reply.clear()


#: retrying an object that is not there yet: first after this many seconds, doubling up to
#: OBJECT_RETRY_CAP (Flower: 1 s, up to 10 s)
OBJECT_RETRY_FIRST = 0.01
OBJECT_RETRY_CAP = 0.5


def prompt_object_pulls() -> None:
    """Retry an object that is not yet available promptly, in this process.

    Flower announces a message as soon as it is registered, while its objects are still
    being uploaded; a receiver that pulls them then finds one missing and, by Flower's
    default, waits 1 s (doubling up to 10 s) before trying again: most rounds of a fast
    federation paid that second. Here the first retry comes after
    :data:`OBJECT_RETRY_FIRST` seconds, doubling up to :data:`OBJECT_RETRY_CAP` (each retry
    is one small request). Used by ``fedmodel join``'s SuperNode and by ``fedmodel
    serve``'s ServerApp; idempotent.

    Example
    -------
    >>> from flwr.supercore.inflatable.inflatable_utils import pull_objects
    >>> prompt_object_pulls()
    >>> pull_objects.__kwdefaults__["initial_backoff"]
    0.01
    """
    from flwr.supercore.inflatable import inflatable_utils

    defaults = inflatable_utils.pull_objects.__kwdefaults__
    if not defaults or "initial_backoff" not in defaults or "backoff_cap" not in defaults:
        raise RuntimeError(
            "fedmodel: flwr.supercore.inflatable.inflatable_utils.pull_objects has no "
            "initial_backoff / backoff_cap; this Flower version is not supported"
        )
    defaults["initial_backoff"] = OBJECT_RETRY_FIRST
    defaults["backoff_cap"] = OBJECT_RETRY_CAP


class _TimeWithPromptSleep:
    """The ``time`` module as Flower's SuperNode loop sees it: its ``sleep`` is
    :meth:`PromptPolling.sleep`."""

    def __init__(self, polling: PromptPolling):
        self.sleep = polling.sleep

    def __getattr__(self, name: str):
        return getattr(time, name)


def install(polling: PromptPolling, executor_box: list) -> None:
    """Patch Flower's SuperNode loop (:mod:`flwr.supernode.start_client_internal`): its
    waits go through ``polling``; a stored message wakes the executor; the executor of
    the SuperNode's state is created when the loop starts and appended to
    ``executor_box``."""
    from flwr.supernode import start_client_internal as loop

    for name in ("time", "_pull_and_store_message", "_push_messages", "start_client_internal"):
        if not hasattr(loop, name):  # a Flower whose SuperNode loop changed
            raise RuntimeError(
                f"fedmodel party: flwr.supernode.start_client_internal has no {name}; this "
                "Flower version is not supported by fedmodel join's SuperNode"
            )
    pull, push, start = (
        loop._pull_and_store_message,
        loop._push_messages,
        loop.start_client_internal,
    )

    def pull_and_store_message(*args, **kwargs):
        polling.wait_until_due()
        run_id = pull(*args, **kwargs)
        if run_id is not None:
            polling.message_seen()
            for executor in executor_box:
                executor.notify()
        return run_id

    def push_messages(*args, **kwargs):
        try:
            return push(*args, **kwargs)
        finally:
            polling.replied()

    def start_client_internal(*, state_factory, isolation, **kwargs):
        if isolation != ISOLATION:
            raise RuntimeError(
                f"fedmodel party: the SuperNode must run with --isolation {ISOLATION} (its "
                "ClientApp tasks are run by fedmodel's trusted executor)"
            )
        executor = TrustedExecutor(state_factory.state(), on_reply=polling.reply_ready)
        executor_box.append(executor)
        threading.Thread(target=executor.serve, name="fedmodel-executor", daemon=True).start()
        from flwr.supercore import log

        log(INFO, "fedmodel: this SuperNode runs the relay ClientApp of its own fedmodel")
        try:
            return start(state_factory=state_factory, isolation=isolation, **kwargs)
        finally:
            executor.stop()
            log(
                INFO,
                "fedmodel: %d messages, %d tasks run, %d polls of the SuperLink that found "
                "no message",
                polling.messages,
                executor.tasks_run,
                polling.polls,
            )

    prompt_object_pulls()
    loop.time = _TimeWithPromptSleep(polling)
    loop._pull_and_store_message = pull_and_store_message
    loop._push_messages = push_messages
    loop.start_client_internal = start_client_internal


def main(argv: list[str] | None = None) -> None:
    """``flower-supernode`` (Flower's arguments; ``--isolation process`` required) with
    the trusted executor and prompt polling."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--isolation" not in argv or argv[argv.index("--isolation") + 1 :][:1] != [ISOLATION]:
        sys.exit(f"fedmodel party: run the SuperNode with --isolation {ISOLATION}")
    install(PromptPolling(), [])
    # (the package flwr.supernode.cli exports a function of the same name as the module)
    cli = importlib.import_module("flwr.supernode.cli.flower_supernode")
    from flwr.supernode import start_client_internal as loop

    # (the CLI module imported start_client_internal by name)

    cli.start_client_internal = loop.start_client_internal
    sys.argv = ["flower-supernode", *argv]
    cli.flower_supernode()


if __name__ == "__main__":
    main()
