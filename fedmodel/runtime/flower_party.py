"""A party's own process on the Flower backend: it holds the party's data and state.

Flower runs a ClientApp for each message (on its deployment engine, a fresh
``flwr-clientapp`` process per message), so a party's state (its compiled subproblem,
multipliers, ADMM variables) cannot live in the ClientApp. It lives here instead: a
:class:`PartyServer` holds a :class:`~fedmodel.runtime.host.PartyHost` for the party
(or parties) of one organisation, listens on a local Unix socket (``0600``, with an
HMAC key of its own, so only the organisation's own relay can talk to it), and answers
the calls the relay ClientApp (:mod:`fedmodel.runtime.flower_relay_app`) forwards from
the Flower messages, one call per connection, on its main thread (so ``client_timeout``
alarms and Ctrl-C work as in a worker process).

* Deployment (``fedmodel join``): the party's program is compiled *here*, from the shared
  model file and the party's own data; the coordinator's ``build`` call carries the
  method's endpoint factory with :data:`~fedmodel.runtime.flower_codec.LOCAL_PROGRAM` in
  place of the program, which the party fills in with its own.
* Simulation (``backend="flower"`` without a grid): the Flower runtime starts one party
  server per client and hands it the client's factory directly (``build_local``), as
  the processes backend does.

What a party server accepts on its socket (one byte frame per connection, after the HMAC
handshake):

* a **codec call** (the relay's frame, :func:`fedmodel.runtime.flower_relay_app.pack`):
  JSON and ``.npy`` arrays read with ``allow_pickle=False``, decoded by
  :func:`~fedmodel.runtime.flower_codec.decode`, which builds plain values, arrays,
  messages and, for ``build``, only the endpoint classes and option dataclasses the method
  families registered by name (:mod:`fedmodel.runtime.wire`). This is all a deployed
  party (``fedmodel join``) accepts: what the coordinator sends is never unpickled, and a
  refused call (an unregistered name, a module path, a malformed frame) is answered with
  an error; the server goes on serving the next call. The messages of a ``run``,
  ``peer`` or ``activate`` call are checked against the receiving half's declared
  message table (its family's ``messages.py``, the table the coordinator's runtime checks
  requests and replies with) before any is dispatched: a message to a party not served
  here, an undeclared kind, an undeclared field or a missing one refuses the whole call
  with a :class:`~fedmodel.runtime.wire.CodecError` naming the party, the kind and the
  field.
* a **local request** (a pickle; ``accept_local=True`` only): the simulation's own
  Flower runtime, which started this server in the same program and organisation and
  reads its HMAC key file, hands it the client factories (``build_local``) and stops it,
  as the processes backend does with its workers. A deployed party server is created
  with ``accept_local=False`` (the default) and refuses these frames without reading
  them.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import secrets
import signal
import sys
import threading
from collections.abc import Mapping
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client, Listener
from typing import Any

from fedmodel.runtime.checkpoint import (
    CheckpointError,
    checked_token,
    remove_stale_temporaries,
)
from fedmodel.runtime.endpoints import EndpointFactory
from fedmodel.runtime.flower_codec import (
    LOCAL_PROGRAM,
    LOCAL_REGULARIZER,
    CodecError,
    decode,
    encode,
)
from fedmodel.runtime.host import PartyHost
from fedmodel.runtime.messages import SERVER, Message
from fedmodel.runtime.outcomes import StepOutcome

# host methods a remote coordinator may call (the relay forwards nothing else)
# the first byte of a frame on the party socket: a codec call or answer (the relay's
# pack / unpack), a local request and its pickled answer (simulation only)
LOCAL_FRAME = b"L"
PICKLED_FRAME = b"P"

REMOTE_CALLS = (
    "run",
    "peer",
    "activate",
    "mark",
    "restore_marks",
    "write_checkpoint",
    "load_checkpoint",
    "names",
)
# the calls that carry method messages, checked against the receiver's declared table
MESSAGE_CALLS = ("run", "peer", "activate")
# the declared direction of the kinds each message call carries
DIRECTION = {"run": "server", "peer": "peer", "activate": "local"}

# -- what a deployed party accepts (docs/security.md lists each cap) --------------------------
# (the frame, JSON text and array caps are the relay's: flower_relay_app.MAX_FRAME ...)
#: the deepest nesting of a call's values, and the most values it may hold
MAX_DEPTH = 64
MAX_ITEMS = 100_000
#: rounds a message may carry: 0 .. MAX_ROUND
MAX_ROUND = 2**53
#: distinct checkpoint run tokens a coordinator may name per run (build), and run
#: directories the party keeps in its checkpoint directory
MAX_TOKENS_PER_RUN = 4
MAX_RUN_DIRECTORIES = 64


def key_path(socket_path: str) -> str:
    """The file holding the party server's HMAC key (next to its socket)."""
    return socket_path + ".key"


def read_key(socket_path: str) -> bytes:
    with open(key_path(socket_path), "rb") as fh:
        return fh.read()


class PartyServer:
    """Serve some parties' endpoints on a local socket (see the module docstring).

    Parameters
    ----------
    socket_path : str
        Unix socket to listen on (its directory should be private to the organisation).
    programs : mapping, optional
        Party name -> its own compiled ``PartyProgram`` (deployment): substituted for
        :data:`LOCAL_PROGRAM` in the factories the coordinator sends.
    regularizer : Regularizer, optional
        The model's compiled regularizer (deployment), for
        :data:`~fedmodel.runtime.flower_codec.LOCAL_REGULARIZER`.
    info : dict, optional
        What ``hello`` answers besides the party names (e.g. the shapes of its data,
        which the coordinator needs to lay out the model; never the data).
    checkpoint_dir : str, optional
        Deployment: the party's own checkpoint directory. The coordinator's
        ``write_checkpoint`` / ``load_checkpoint`` calls then name only a run token (a
        plain name, :func:`~fedmodel.runtime.checkpoint.checked_token`): the party's files
        are ``checkpoint_dir/<token>/party-<name>-<tag>.npz``. Without it (simulation: a
        party server the coordinator's own process started) the directory is taken as
        given; a deployed server (``programs`` given) without it refuses checkpoint calls.
    accept_local : bool
        Accept local (pickled) requests: only for the server a simulation's Flower
        runtime starts for itself; a deployment's party server (``fedmodel join``) keeps
        the default ``False`` and answers codec calls only.
    reveal : iterable of str
        The party's own opt-ins (``fedmodel join --reveal``): what it may reveal beyond its
        method's default messages. The coordinator's build never sets them; a request or a
        build that needs another is refused, naming the opt-in.
    compiled : CompiledModel, optional
        The model as this party compiled it (deployment): the options of the
        coordinator's build are validated against it.
    max_frame : int, optional
        The largest frame read from the socket (bytes; default the relay's
        ``MAX_FRAME``): a longer one is refused from its length prefix, unread.

    Examples
    --------
    >>> import os, tempfile
    >>> server = PartyServer(os.path.join(tempfile.mkdtemp(), "party.sock"))
    >>> server.handle(("local", b"..."))[0]  # a deployment's server: no pickle
    'error'
    >>> server.close()
    """

    def __init__(
        self,
        socket_path: str,
        programs: Mapping[str, Any] | None = None,
        info: dict | None = None,
        regularizer: Any = None,
        checkpoint_dir: str | None = None,
        *,
        accept_local: bool = False,
        reveal: Any = (),
        compiled: Any = None,
        max_frame: int | None = None,
    ):
        from fedmodel.runtime.flower_relay_app import MAX_FRAME

        self.socket_path = socket_path
        self.accept_local = bool(accept_local)
        self.reveal = frozenset(reveal)
        self.max_frame = int(MAX_FRAME if max_frame is None else max_frame)
        # per party served: the dimensions of its messages, and the last round it answered
        # with the (kind, sender) pairs answered in that round (replays refused)
        self._dims: dict[str, Mapping[str, int]] = {}
        self._rounds: dict[str, tuple[int, set]] = {}
        self._tokens: set[str] = set()  # checkpoint run tokens named since the build
        self.checkpoint_dir = None if checkpoint_dir is None else os.path.abspath(checkpoint_dir)
        self._written: dict[tuple[str, str], list[str]] = {}
        self.programs = dict(programs or {})
        self.regularizer = regularizer
        self.info = dict(info or {})
        self.host = PartyHost()
        self.host.compiled = compiled
        self.key = secrets.token_bytes(32)
        fd = os.open(key_path(socket_path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(self.key)
        if os.path.exists(socket_path):
            os.unlink(socket_path)
        self.listener = Listener(socket_path, family="AF_UNIX", authkey=self.key)
        os.chmod(socket_path, 0o600)
        self.stopped = False

    # -- calls -------------------------------------------------------------------------------
    def _build(self, factories: Mapping[str, EndpointFactory]) -> dict:
        """Build the coordinator's factories with this party's own program in place of
        :data:`LOCAL_PROGRAM`; a factory for a party not served here is refused."""
        if not isinstance(factories, Mapping) or not all(
            isinstance(f, EndpointFactory) for f in factories.values()
        ):
            raise CodecError("build takes a dict of party name -> endpoint factory")
        out: dict[str, EndpointFactory] = {}
        for name, f in factories.items():
            if name not in self.programs:
                raise PermissionError(
                    f"this party server holds {sorted(self.programs)}, not '{name}'"
                )

            local = {LOCAL_PROGRAM: self.programs[name], LOCAL_REGULARIZER: self.regularizer}
            # the party's own opt-ins, never the coordinator's
            out[name] = dataclasses.replace(f.substituted(local), reveal=self.reveal)
        self.host.endpoints.clear()
        self.host.marks.clear()
        self._dims.clear()
        self._rounds.clear()
        self._tokens.clear()
        errors = self.host.build(out)
        for name, ep in self.host.endpoints.items():
            if errors.get(name) is None and hasattr(ep, "message_dims"):
                options = [a for a in out[name].args if dataclasses.is_dataclass(a)]
                self._dims[name] = ep.message_dims(options[0] if options else None)
        # an error travels as its message, never with the party's traceback
        return {n: None if e is None else (e[0], "") for n, e in errors.items()}

    def _checkpoint_directory(self, token: Any, create: bool) -> str:
        """The directory a coordinator's checkpoint call names (see ``checkpoint_dir``)."""
        if self.checkpoint_dir is None:
            if self.programs:  # deployed: never a path chosen by the coordinator
                raise CheckpointError(
                    "this party has no checkpoint directory (fedmodel join --checkpoint-dir)"
                )
            return token  # simulation: the coordinator's own process started this server
        token = checked_token(token)
        if token not in self._tokens and len(self._tokens) >= MAX_TOKENS_PER_RUN:
            raise CheckpointError(
                f"refusing checkpoint run {token!r}: this run named {len(self._tokens)} "
                f"already (at most {MAX_TOKENS_PER_RUN} per run)"
            )
        path = os.path.join(self.checkpoint_dir, token)
        if create:
            os.makedirs(self.checkpoint_dir, mode=0o700, exist_ok=True)
            if not os.path.isdir(path):
                runs = [e for e in os.scandir(self.checkpoint_dir) if e.is_dir()]
                if len(runs) >= MAX_RUN_DIRECTORIES:
                    raise CheckpointError(
                        f"refusing checkpoint run {token!r}: the party's checkpoint directory "
                        f"holds {len(runs)} runs already (at most {MAX_RUN_DIRECTORIES}; remove "
                        "old ones)"
                    )
            os.makedirs(path, mode=0o700, exist_ok=True)
        elif not os.path.isdir(path):
            raise CheckpointError(f"no checkpoint of run {token!r} in this party's directory")
        self._tokens.add(token)
        return path

    def call(self, method: str, args: tuple) -> Any:
        if method == "hello":
            return {"parties": sorted(self.programs) or self.host.names(), **self.info}
        if method == "build":
            return self._build(*args)
        if method not in REMOTE_CALLS:
            raise PermissionError(f"call {method!r} is not allowed from the coordinator")
        if method in MESSAGE_CALLS:
            self._check_messages(method, args)
        if method in ("write_checkpoint", "load_checkpoint"):
            if not args:
                raise CheckpointError(f"{method} without a run name")
            args = (self._checkpoint_directory(args[0], method == "write_checkpoint"), *args[1:])
        result = getattr(self.host, method)(*args)
        if method == "write_checkpoint" and self.checkpoint_dir is not None:
            self._prune(args[0], result)
        if method in MESSAGE_CALLS:
            result = self._answered(method, args, result)
        elif method == "restore_marks":  # the parties are back at their marks
            for _last, answered in self._rounds.values():
                answered.clear()
        return result

    def _check_messages(self, method: str, args: tuple) -> None:
        """Refuse a ``run`` / ``peer`` / ``activate`` call unless each of its messages is
        for a half built here, at most one per party served, of a kind of the call's
        direction sent by whom that direction says (the server; another party; the party
        itself), of a round not older than the last its receiver answered (and not a
        replay of a (kind, sender) answered in that round), and fits that half's declared
        table by name and by value (shape, dtype, finiteness, magnitude), before any of
        them is dispatched."""
        if not args:
            raise CodecError(f"{method} without its message")
        messages = args[0] if method == "run" else [args[0]]
        if not isinstance(messages, (list, tuple)):
            raise CodecError(f"run takes a list of messages, not a {type(messages).__name__}")
        if len(messages) > max(1, len(self.host.endpoints)):
            raise CodecError(
                f"{method} with {len(messages)} messages: at most one per party served here "
                f"({len(self.host.endpoints)})"
            )
        seen = set()
        for msg in messages:
            if not isinstance(msg, Message):
                raise CodecError(f"{method} takes messages, not a {type(msg).__name__}")
            endpoint = self.host.endpoints.get(msg.receiver)
            if endpoint is None:
                raise PermissionError(
                    f"message {msg.kind!r} for {msg.receiver!r}: this party server holds "
                    f"{sorted(self.host.endpoints)}"
                )
            if msg.receiver in seen:
                raise CodecError(f"{method} with two messages for {msg.receiver!r}")
            seen.add(msg.receiver)
            where = f"party {msg.receiver!r} refuses message {msg.kind!r}"
            table = getattr(endpoint, "messages", None)
            why = self._sender_problem(method, msg, table)
            if why is None and table is not None:
                why = table.request_problem(msg.kind, msg.payload, self._dims.get(msg.receiver))
            if why is None:
                why = self._round_problem(msg, replay=method == "run")
            if why:
                raise CodecError(f"{where}: {why}")

    @staticmethod
    def _sender_problem(method: str, msg: Message, table: Any) -> str | None:
        """Why ``msg`` cannot come through a ``method`` call: the sender the kind's declared
        direction names (the server, another party, the party itself) and its channel."""
        direction = DIRECTION[method]
        sender_ok = {
            "server": msg.sender == SERVER,
            "peer": msg.sender not in (SERVER, msg.receiver),
            "local": msg.sender == msg.receiver,
        }[direction]
        if not sender_ok:
            return f"sent by {msg.sender!r:.60} through a {method!r} call"
        if table is None or msg.kind not in table:
            return None
        spec = table[msg.kind]
        if spec.direction != direction:
            return f"declared as a {spec.direction!r} message, sent through a {method!r} call"
        expected = "local" if direction == "local" else spec.channel
        if msg.channel != expected:
            return f"on channel {msg.channel!r:.40}; declared {expected!r}"
        return None

    def _round_problem(self, msg: Message, replay: bool) -> str | None:
        """Why ``msg``'s round is refused: not an integer in 0 .. :data:`MAX_ROUND`, older
        than the last round its receiver answered, or (``replay``: a server's request) a
        kind it answered in that round already (a failed step may be sent again; peer
        messages and activations of one round may repeat a kind)."""
        rnd = msg.round
        if type(rnd) is not int or not 0 <= rnd <= MAX_ROUND:
            return f"of round {rnd!r:.40} (rounds are 0 .. 2^53)"
        last, answered = self._rounds.get(msg.receiver, (0, set()))
        if rnd < last:
            return f"of round {rnd}, older than round {last} it answered already"
        if replay and rnd == last and (msg.kind, msg.sender) in answered:
            return f"of round {rnd} again (a replay: it answered it already)"
        return None

    def _answered(self, method: str, args: tuple, result: Any) -> Any:
        """Note the rounds of the messages answered, and strip tracebacks from the
        outcomes (an error travels as its message only)."""
        messages = args[0] if method == "run" else [args[0]]
        outcomes = result if isinstance(result, list) else [result]
        for msg, out in zip(messages, outcomes):
            if not isinstance(out, StepOutcome):
                continue
            out.detail = ""
            if out.ok:
                last, answered = self._rounds.get(msg.receiver, (0, set()))
                if msg.round > last:
                    last, answered = msg.round, set()
                answered.add((msg.kind, msg.sender))
                self._rounds[msg.receiver] = (last, answered)
        return result

    def _prune(self, directory: str, written: Mapping[str, tuple[str, str]]) -> None:
        """Keep, of the files this server wrote in ``directory``, each party's last two
        (the coordinator's manifest names the newer one once written, the older one until
        then); the coordinator removes old files only from its own directory."""
        remove_stale_temporaries(directory)
        for name, (fname, _sha) in written.items():
            mine = self._written.setdefault((directory, name), [])
            mine.append(fname)
            for old in mine[:-2]:
                try:
                    os.remove(os.path.join(directory, old))
                except OSError:
                    pass
            del mine[:-2]

    def handle(self, request: tuple) -> tuple:
        """One request from a connection: ``("call", text, arrays)`` (from the relay: the
        codec's form, nothing unpickled) or ``("local", blob)`` (a pickle from the Flower
        runtime that started this server; ``accept_local`` servers only). Returns
        ``("ok" | "error", text, arrays)`` or ``("pickled", blob)``; never raises for a
        refused or failing call."""
        from fedmodel.runtime.flower_relay_app import MAX_ARRAYS, MAX_JSON_CHARS

        kind = request[0] if isinstance(request, tuple) and request else None
        try:
            if kind == "call":
                call = decode(
                    request[1],
                    request[2],
                    max_chars=MAX_JSON_CHARS,
                    max_depth=MAX_DEPTH,
                    max_items=MAX_ITEMS,
                    max_arrays=MAX_ARRAYS,
                )
                if not (
                    isinstance(call, tuple)
                    and len(call) == 2
                    and isinstance(call[0], str)
                    and isinstance(call[1], (tuple, list))
                ):
                    raise CodecError("a call is (method name, arguments)")
                return ("ok", *encode(self.call(call[0], tuple(call[1]))))
            if kind == "local":
                if not self.accept_local:
                    raise PermissionError(
                        "this party server accepts the coordinator's codec calls only "
                        "(local requests are for a simulation's own party servers)"
                    )
                method, args = pickle.loads(request[1])  # the local runtime's (see above)
                if method == "build_local":
                    self.host.endpoints.clear()
                    result: Any = self.host.build(*args)
                elif method == "stop":
                    self.stopped = True
                    result = None
                else:
                    result = getattr(self.host, method)(*args)
                return ("pickled", pickle.dumps(result, protocol=5))
            raise CodecError(f"unknown request {kind!r:.40}")
        except BaseException as exc:  # noqa: BLE001 - reported to the caller
            if isinstance(exc, KeyboardInterrupt) and kind == "local":
                raise
            try:
                return ("error", *encode(exc))
            except Exception:  # pragma: no cover - an exception always encodes
                return ("error", *encode(RuntimeError(type(exc).__name__)))

    def handle_frame(self, frame: bytes) -> bytes:
        """:meth:`handle` on the bytes of one connection; returns the answer's bytes."""
        from fedmodel.runtime.flower_relay_app import (
            FRAME,
            MAX_ARRAYS,
            MAX_JSON_CHARS,
            pack,
            unpack,
        )

        if frame[:1] == LOCAL_FRAME and self.accept_local:
            reply = self.handle(("local", frame[1:]))
        elif frame[:1] == FRAME:
            try:
                status, text, arrays = unpack(frame, max_json=MAX_JSON_CHARS, max_arrays=MAX_ARRAYS)
                if status != "call":
                    raise ValueError(f"a frame of status {status!r:.20}, not a call")
                reply = self.handle(("call", text, arrays))
            except Exception as exc:  # a malformed frame: answered, not fatal
                reply = ("error", *encode(CodecError(f"a malformed call frame: {exc}")))
        else:  # a local request to a deployed party, or bytes that are no frame
            reply = self.handle(("local" if frame[:1] == LOCAL_FRAME else "unknown",))
        if reply[0] == "pickled":
            return PICKLED_FRAME + reply[1]
        return pack(*reply)

    @staticmethod
    def _error_frame(exc: BaseException) -> bytes:
        from fedmodel.runtime.flower_relay_app import pack

        return pack("error", *encode(exc))

    def serve_one(self) -> None:
        """Accept one connection and answer its request (a failed handshake, a closed
        connection or a refused request ends only that connection)."""
        try:
            conn = self.listener.accept()
        except (OSError, EOFError, AuthenticationError):  # a failed or abandoned handshake
            return
        with conn:
            try:  # the length prefix first: a longer frame is refused unread
                frame = conn.recv_bytes(self.max_frame)
            except OSError as exc:
                if "bad message length" not in str(exc):
                    return
                refused = CodecError(
                    f"a frame longer than {self.max_frame} bytes (this party's cap) refused unread"
                )
                frame, reply = None, self._error_frame(refused)
            except EOFError:
                return
            if frame is not None:
                reply = self.handle_frame(frame)
            try:
                conn.send_bytes(reply)
            except OSError:
                pass

    def serve_forever(self, stop_on_interrupt: bool = False) -> None:
        """Answer one request per connection until stopped (``stop``, SIGTERM; with
        ``stop_on_interrupt``, also Ctrl-C between steps, as ``fedmodel join`` wants: a
        party server of the simulation outlives a Ctrl-C of the solve it serves)."""
        self.host.install_signal_handlers(interrupts=True)

        def on_term(*_):
            self.stopped = True
            sys.exit(0)

        signal.signal(signal.SIGTERM, on_term)
        if stop_on_interrupt and threading.current_thread() is threading.main_thread():
            in_step = signal.getsignal(signal.SIGINT)

            def on_int(signum, frame):
                if self.host._in_step and callable(in_step):
                    in_step(signum, frame)  # interrupts the step (the host's handler)
                else:
                    self.stopped = True
                    raise KeyboardInterrupt

            signal.signal(signal.SIGINT, on_int)
        try:
            while not self.stopped:
                self.serve_one()
        finally:
            self.close()

    def close(self) -> None:
        try:
            self.listener.close()
        except Exception:
            pass
        for p in (self.socket_path, key_path(self.socket_path)):
            try:
                os.unlink(p)
            except OSError:
                pass


def request(socket_path: str, message: tuple, key: bytes | None = None) -> tuple:
    """Send one request to the party server at ``socket_path`` and return its answer:
    ``message`` is ``("call", text, arrays)`` or ``("local", pickled bytes)``; the answer
    ``(status, text, arrays)`` or ``("pickled", bytes)`` (see :meth:`PartyServer.handle`)."""
    from fedmodel.runtime.flower_relay_app import pack, unpack

    key = read_key(socket_path) if key is None else key
    if message[0] == "local":
        frame = LOCAL_FRAME + message[1]
    else:
        frame = pack(*message)
    with Client(socket_path, family="AF_UNIX", authkey=key) as conn:
        conn.send_bytes(frame)
        answer = conn.recv_bytes()
    if answer[:1] == PICKLED_FRAME:
        return ("pickled", answer[1:])
    return unpack(answer)


def main(argv: list[str] | None = None) -> None:  # pragma: no cover - a subprocess
    """``python -m fedmodel.runtime.flower_party SOCKET``: a party server whose parties the
    Flower runtime builds (simulation)."""
    import threading
    import time

    argv = sys.argv[1:] if argv is None else argv
    parent = os.getppid()

    def orphaned():  # the Flower runtime that started this server is gone: stop
        while True:
            time.sleep(1.0)
            if os.getppid() != parent:
                os._exit(0)

    threading.Thread(target=orphaned, daemon=True).start()
    server = PartyServer(argv[0], accept_local=True)  # started by the simulation's runtime
    print("ready", flush=True)
    # nobody reads this pipe any more: anything printed later must not fill it and block
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)
    server.serve_forever()


if __name__ == "__main__":  # pragma: no cover
    main()
