"""The processes runtime: persistent worker processes, parties sharded over them.

Each worker is a fresh Python interpreter (started like ``multiprocessing``'s ``"spawn"``
context, but without re-importing the caller's ``__main__``, so scripts need no
``if __name__ == "__main__"`` guard; no state, thread or cvxpy object is inherited or
shared), connected by a socket pair (a ``multiprocessing`` connection), and holding a
:class:`~fedmodel.runtime.host.PartyHost`. A worker builds its parties' endpoints from
their factories (so each compiles its own subproblem), keeps them across rounds, and runs
the steps sent to it one after the other on its main thread. The server sends each worker
its share of a round's messages and waits for all of them: workers compute in parallel.

With ``server_hosts_clients=True`` one shard of the parties runs in the server's own
process instead (a :class:`~fedmodel.runtime.host.PartyHost` here): each round the server
sends the workers their messages, handles its own shard's while they compute, then
collects their replies (see :func:`~fedmodel.runtime.placement.placement`).

A worker that dies (killed, crashed) is detected through its process sentinel; a worker
that does not answer within ``client_timeout`` (per step) plus a grace period is stopped.
Either way the failure is the party whose step it was running (each worker names it in a
small file the server reads then); its other parties, idle or waiting behind it, are
lost with it for the rest of the run but not blamed (kind ``"lost"``).

Posted messages (:meth:`~fedmodel.runtime.base.Runtime.post`) are written to the worker's
connection at once and the server goes on; the worker handles them in order and its
replies are read by :meth:`~fedmodel.runtime.base.Runtime.poll` when they arrive. The
parties of one worker run one after the other, so a slow party holds back the others of
its worker only: for asynchrony between parties, give each party its own worker
(``workers`` = number of parties).

After a solve, healthy workers drop their parties and are kept idle for the next solve in
this process (starting a worker costs a second or two); :func:`shutdown_workers` stops
them, and they stop at exit.
"""

from __future__ import annotations

import atexit
import os
import signal
import socket
import subprocess
import sys
import time
from collections import deque
from collections.abc import Mapping
from multiprocessing.connection import Connection, wait
from typing import Any

from fedmodel.runtime.base import GRACE_SECONDS, Runtime, raise_build_errors
from fedmodel.runtime.endpoints import EndpointFactory
from fedmodel.runtime.host import HostDead, PartyHost, StepRecord, step_writer
from fedmodel.runtime.placement import SERVER_HOST, default_workers, placement

# One BLAS thread per worker: the workers already fill the cores.
_THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def _worker_entry() -> None:  # pragma: no cover - runs in the worker
    """Entry point of a worker interpreter: ``argv = [fd, index, record fd]``."""
    fd, index, record = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    _worker_main(Connection(fd), index, record)


def _worker_main(conn, index: int, record: int) -> None:  # pragma: no cover - in the worker
    import pickle

    from fedmodel.runtime.outcomes import portable_exception

    host = PartyHost(settles=True)
    host.install_signal_handlers(interrupts=True)
    # who is in a step, in a file the server reads when this worker dies or hangs
    host.on_step = step_writer(record)
    while True:
        try:
            blob = conn.recv_bytes()
        except (EOFError, OSError):
            break
        try:
            method, args = pickle.loads(blob)
        except Exception as exc:  # e.g. a class the worker cannot import
            conn.send(("error", portable_exception(exc)))
            continue
        if method == "path":  # the server's import path, so that its modules resolve here
            sys.path[:] = list(args[0]) + [p for p in sys.path if p not in args[0]]
            conn.send(("ok", None))
            continue
        if method == "stop":
            try:
                conn.send(("ok", None))
            except Exception:
                pass
            break
        try:
            result = ("ok", getattr(host, method)(*args))
        except BaseException as exc:  # noqa: BLE001 - reported to the server
            result = ("error", portable_exception(exc))
        try:
            conn.send(result)
        except Exception as exc:  # an unpicklable reply
            conn.send(("error", RuntimeError(f"worker {index} could not send its reply: {exc}")))


# Idle workers kept between solves of this process (a new worker costs a second or two:
# a fresh interpreter importing numpy, scipy and cvxpy); stopped at exit.
_IDLE: list[tuple[subprocess.Popen, Connection, Any]] = []


def _take_idle():
    while _IDLE:
        proc, conn, record = _IDLE.pop()
        if proc.poll() is None:
            return proc, conn, record
        conn.close()
        record.close()
    return None


@atexit.register
def _stop_idle() -> None:  # pragma: no cover - at exit
    while _IDLE:
        proc, conn, _record = _IDLE.pop()
        try:
            conn.send(("stop", ()))
            proc.wait(2)
        except Exception:
            proc.kill()


def shutdown_workers() -> None:
    """Stop the idle worker processes kept for the next solve."""
    _stop_idle()


class ProcessRuntime(Runtime):
    """Parties in persistent worker processes (see the module docstring).

    Parameters
    ----------
    factories : mapping of client name to :class:`EndpointFactory`
    workers : int, optional
        Number of worker processes (default: one per core, at most one per client; one
        fewer with ``server_hosts_clients``).
    weights : mapping, optional
        Relative cost of each client (e.g. its data size), used to balance the shards.
    server_hosts_clients : bool
        Also run one shard of the clients in this (the server's) process.
    client_timeout, on_failure, retries :
        Failure policy (see :class:`~fedmodel.runtime.base.Runtime`).
    """

    backend = "processes"
    supports_async = True

    def __init__(
        self,
        factories: Mapping[str, EndpointFactory],
        *,
        workers: int | None = None,
        weights: Mapping[str, float] | None = None,
        server_hosts_clients: bool = False,
        client_timeout: float | None = None,
        on_failure: str = "stop",
        retries: int = 0,
    ):
        super().__init__(client_timeout=client_timeout, on_failure=on_failure, retries=retries)
        names = list(factories)
        n_workers = int(workers or default_workers(os.cpu_count(), server_hosts_clients))
        self._host_of = placement(names, n_workers, weights, server_hosts_clients)
        if server_hosts_clients:
            self._local = PartyHost()
        self.client_seconds = {n: 0.0 for n in names}
        self._procs: dict[int, subprocess.Popen] = {}
        self._conns: dict[int, Connection] = {}
        self._records: dict[int, Any] = {}  # worker -> the file naming its party in a step
        self._busy: set[int] = set()
        self._posted: dict[int, deque] = {}  # worker -> posted tickets, in order
        env = dict(os.environ)
        for k in _THREAD_VARS:
            env.setdefault(k, "1")
        # the worker imports fedmodel from where this process did
        pkg_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env["PYTHONPATH"] = os.pathsep.join(
            [pkg_root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        )
        code = "from fedmodel.runtime.processes import _worker_entry; _worker_entry()"
        try:
            for h in sorted({h for h in self._host_of.values() if h != SERVER_HOST}):
                idle = _take_idle()
                if idle is not None:
                    self._procs[h], self._conns[h], self._records[h] = idle
                    continue
                mine, theirs = socket.socketpair()
                fd = theirs.fileno()
                record = self._records[h] = StepRecord()
                proc = subprocess.Popen(
                    [sys.executable, "-c", code, str(fd), str(h), str(record.fd)],
                    pass_fds=(fd, record.fd),
                    env=env,
                    stdin=subprocess.DEVNULL,
                )
                record.opened()
                theirs.close()
                self._procs[h] = proc
                self._conns[h] = Connection(mine.detach())
        except BaseException:
            self.close()
            raise
        self.workers = len(self._procs)
        try:
            path = [os.path.abspath(p) if p else os.getcwd() for p in sys.path]
            self._map({h: ("path", (path,)) for h in self._procs}, {}, build=True)
            groups = self._hosts_for(names)
            results = self._map(
                {h: ("build", ({n: factories[n] for n in ns},)) for h, ns in groups.items()},
                {h: 0 for h in groups},
                build=True,
            )
        except BaseException:
            self.close()
            raise
        errors: dict[str, Any] = {}
        for h, res in results.items():
            if isinstance(res, HostDead):
                self.close()
                raise RuntimeError(f"worker {h} failed to start: {res.reason}")
            errors.update(res)
        raise_build_errors(self, errors, names)

    @property
    def pids(self) -> dict[Any, int]:
        """Host -> process id (worker index, and ``"server"`` for the clients that run in
        this process)."""
        out: dict[Any, int] = {h: p.pid for h, p in self._procs.items()}
        if self._local is not None:
            out[SERVER_HOST] = os.getpid()
        return out

    def _alive(self, h: int) -> bool:
        return self._procs[h].poll() is None

    def _exitcode(self, h: int):
        try:
            return self._procs[h].wait(1)
        except subprocess.TimeoutExpired:
            return None

    def worker_of(self, name: str) -> Any:
        return self._host_of[name]

    # -- talking to workers -----------------------------------------------------------------
    def _kill(self, h: int) -> None:
        p = self._procs.get(h)
        if p is not None and p.poll() is None:
            p.kill()
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                pass
        self._busy.discard(h)

    def _died(self, h: int) -> HostDead:
        self._busy.discard(h)
        code = self._exitcode(h)
        how = f"killed by signal {-code}" if code is not None and code < 0 else f"exit code {code}"
        culprit = self._records[h].in_step()
        during = f" in client '{culprit}''s step" if culprit else ""
        return HostDead(f"worker process {self._procs[h].pid} died ({how}){during}", culprit)

    def _map(self, calls, steps, build: bool = False):
        out: dict[Any, Any] = {}
        sent = []
        with self.critical():
            for h, (method, args) in calls.items():
                if h == SERVER_HOST:
                    continue
                if not self._alive(h):
                    out[h] = self._died(h)
                    continue
                try:
                    self._conns[h].send((method, args))
                    self._busy.add(h)
                    sent.append(h)
                except (BrokenPipeError, ConnectionError, OSError, EOFError):
                    out[h] = self._died(h)
        failed_here = self._run_local_shard(calls, out)  # while the workers compute
        deadline = None
        if self.client_timeout and not build:
            longest = max((steps.get(h, 0) for h in sent), default=0)
            deadline = time.monotonic() + longest * float(self.client_timeout) + GRACE_SECONDS
        waiting = set(sent)
        error = None  # a host method that raised: raised once every reply is read (a reply
        # left unread would be taken as the answer to that worker's next call)
        while waiting:
            objs = {self._conns[h]: h for h in waiting}
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready = wait(list(objs), timeout=remaining)
            if not ready:  # hung past its timeout: stop it
                for h in sorted(waiting):
                    self._kill(h)
                    out[h] = self._hung(h)
                break
            for conn in ready:
                h = objs[conn]
                waiting.discard(h)
                try:
                    with self.critical():
                        status, value = conn.recv()
                except (EOFError, ConnectionError, OSError):
                    out[h] = self._died(h)
                    continue
                self._busy.discard(h)
                if status == "error":
                    error = value if error is None else error
                    continue
                out[h] = value
        if error is not None:
            raise error
        if failed_here is not None:
            raise failed_here
        return out

    # -- posted work (post/poll) ------------------------------------------------------------
    def _submit(self, ticket) -> None:
        h = ticket.host
        queue = self._posted.setdefault(h, deque())
        queue.append(ticket)
        self._busy.add(h)
        try:
            with self.critical():
                self._conns[h].send(("run", ([ticket.message], self.client_timeout)))
        except (BrokenPipeError, ConnectionError, OSError, EOFError):
            ticket.outcome = self._died(h)  # collected as dead by the next poll

    def _collect(self, pending, timeout):
        out: list = []
        for queue in self._posted.values():  # posts that could not even be sent
            if queue and isinstance(queue[0].outcome, HostDead):
                dead = queue[0].outcome
                out.extend((t, dead) for t in queue)
                queue.clear()
        if out:
            return out
        conns = {self._conns[h]: h for h, q in self._posted.items() if q}
        if not conns:
            return out
        for conn in wait(list(conns), timeout=timeout):
            h = conns[conn]
            queue = self._posted[h]
            try:
                with self.critical():
                    status, value = conn.recv()
            except (EOFError, ConnectionError, OSError):
                dead = self._died(h)
                out.extend((t, dead) for t in queue)
                queue.clear()
                continue
            ticket = queue.popleft()
            if not queue:
                self._busy.discard(h)
            if status == "error":
                raise value
            # the step's outcome (one message per post; anything else is refused as the
            # party's invalid reply by the caller)
            one = isinstance(value, (list, tuple)) and len(value) == 1
            out.append((ticket, value[0] if one else value))
        return out

    def _hung(self, h: int) -> HostDead:
        """A worker stopped for not answering: the party in a step then is the one that
        overran (the others waited behind it)."""
        culprit = self._records[h].in_step()
        return HostDead(
            f"worker process did not answer within client_timeout = {self.client_timeout:g} s "
            f"per step (+{GRACE_SECONDS:g} s) and was stopped"
            + (f" in client '{culprit}''s step" if culprit else ""),
            culprit,
        )

    def _abandon(self, host):
        queue = self._posted.get(host, deque())
        tickets = list(queue)
        queue.clear()
        self._kill(host)
        return tickets

    def _on_interrupt(self) -> None:
        for h in list(self._busy):
            if self._alive(h):
                try:
                    os.kill(self._procs[h].pid, signal.SIGINT)
                except OSError:
                    pass

    def recover(self) -> None:
        """Collect (and discard) replies still in flight after an interruption; a worker
        that does not answer within the grace period is stopped."""
        self._on_interrupt()
        if self._tickets_out:
            self._drop_posted()
        deadline = time.monotonic() + GRACE_SECONDS + float(self.client_timeout or 0.0)
        for h in sorted(self._busy):
            conn = self._conns[h]
            try:
                if conn.poll(max(0.0, deadline - time.monotonic())):
                    conn.recv()
                    self._busy.discard(h)
                    continue
            except (EOFError, ConnectionError, OSError):
                pass
            self._kill(h)
            names = [n for n, hh in self._host_of.items() if hh == h]
            self._mark_dead(names, "worker process stopped after an interruption")
        self._busy.clear()

    def close(self) -> None:
        """Return healthy idle workers to the pool; stop the others."""
        if self.closed:
            return
        self.closed = True
        lost = {self._host_of[n] for n in self.dead}
        stopping = {}
        for h, conn in self._conns.items():
            if not self._alive(h):
                continue
            if h not in self._busy and h not in lost:
                try:
                    with self.critical():
                        conn.send(("reset", ()))
                        if conn.poll(10) and conn.recv() == ("ok", True):
                            self._records[h].clear()
                            _IDLE.append((self._procs[h], conn, self._records[h]))
                            continue
                except Exception:
                    pass
            stopping[h] = self._procs[h]
            try:
                conn.send(("stop", ()))
            except Exception:
                pass
        pooled = {id(c) for _, c, _ in _IDLE}
        for p in stopping.values():
            try:
                p.wait(2)
            except subprocess.TimeoutExpired:
                p.kill()
                try:
                    p.wait(2)
                except subprocess.TimeoutExpired:
                    pass
        for h, conn in self._conns.items():
            if id(conn) in pooled:
                continue
            try:
                conn.close()
                self._records[h].close()
            except Exception:
                pass

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
