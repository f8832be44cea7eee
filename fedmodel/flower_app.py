"""Running a federated solve on Flower's deployment engine: ``fedmodel join`` and
``fedmodel serve`` (see ``docs/deployment.md``).

* :func:`join` (each organisation): loads the shared model file and **only its own
  data**, compiles its own program, serves it on a local socket
  (:class:`~fedmodel.runtime.flower_party.PartyServer`) and starts a Flower SuperNode
  connected to the coordinator's SuperLink, whose ClientApp relays the coordinator's
  messages to that socket.
* :func:`serve` (the coordinator, on the SuperLink's machine): packages a Flower app
  (this module's ServerApp :data:`app`, the relay ClientApp and the model file) and runs
  it with ``flwr run``; the ServerApp asks every node which party it serves and the
  shapes of its arrays (never their values), builds the model with stand-ins of those
  shapes, solves it with ``backend="flower"`` on the run's Grid and writes the
  :class:`~fedmodel.result.Result` (JSON) and the ledger (JSON lines).
"""

from __future__ import annotations

import collections
import inspect
import json
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from typing import Any

from fedmodel.errors import FedModelError, ModelError

# ``fedmodel serve`` asks the ServerApp to stop (Ctrl-C) by creating ``out + STOP_SUFFIX``;
# the Flower runtime checks for it while waiting for replies (FEDMODEL_STOP_FILE)
STOP_SUFFIX = ".stop"
TASK_POLL_ENV = "FLWR_SUPEREXEC_TASK_POLL_INTERVAL"
INTERRUPT_WAIT = 300.0


class DeploymentError(FedModelError):
    """A deployment cannot go on: a SuperNode exited, a party's key or socket directory
    is unsafe or missing, a key is not registered."""


def _server_main(grid, context) -> None:
    """The ServerApp's main: the coordinator's side of ``fedmodel serve``."""
    from fedmodel.deploy import coordinator_model, load_model_file
    from fedmodel.runtime.flower_runtime import JoinedGrid, discover

    cfg = dict(context.run_config)
    model_file = load_model_file(cfg["fedmodel-model"])
    options = json.loads(cfg.get("fedmodel-options", "{}"))
    # SuperNode authentication: party -> the node id its public key was registered as
    nodes = json.loads(cfg.get("fedmodel-nodes") or "null")
    found = discover(
        grid, model_file.parties, timeout=float(cfg.get("fedmodel-wait", 120.0)), nodes=nodes
    )
    shapes = {p: info["shapes"][p] for p, (_node, info) in found.items()}
    model = coordinator_model(model_file, shapes)
    os.environ["FEDMODEL_STOP_FILE"] = cfg["fedmodel-out"] + STOP_SUFFIX
    joined = JoinedGrid(grid, found)  # the runtime uses these nodes (one hello per party)
    res = model.solve(cfg["fedmodel-method"], backend="flower", flower_grid=joined, **options)
    write_outputs(res, cfg["fedmodel-out"], cfg.get("fedmodel-ledger") or None)


def write_outputs(res, out: str, ledger: str | None) -> None:
    """The Result as JSON (``out``) and its ledger as JSON lines (``ledger``)."""
    from fedmodel.result import _jsonable

    d = res.to_dict()
    d["extra"] = _jsonable({k: v for k, v in res.extra.items() if k in ("backend", "placement")})
    d["x"] = [float(v) for v in res.x]
    tmp = out + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(d, fh)
    if ledger:
        with open(ledger, "w") as fh:
            for row in res.ledger:
                fh.write(json.dumps(_jsonable(row)) + "\n")
    os.replace(tmp, out)  # last: its presence means "done"


def _make_app():
    try:
        from flwr.serverapp import ServerApp
    except ImportError:  # pragma: no cover - the package imports without Flower
        return None
    server_app = ServerApp()
    server_app.main()(_server_main)
    return server_app


app = _make_app()


# -- transport security and SuperNode authentication --------------------------------------------
def transport_security(command: str, insecure: bool, root_certificates: str | None) -> None:
    """Check the TLS options of ``fedmodel join`` / ``serve``: TLS by default (with the CA
    certificate ``root_certificates``, or the system's roots); ``insecure`` (no TLS) is
    printed as a warning."""
    if insecure and root_certificates:
        raise DeploymentError("--insecure and --root-certificates exclude each other")
    if insecure:
        print(
            f"fedmodel {command}: WARNING: --insecure: no TLS, so the messages travel "
            "unencrypted and the SuperLink is not authenticated (loopback tests and "
            "development only)",
            file=sys.stderr,
            flush=True,
        )
    elif root_certificates and not os.path.isfile(root_certificates):
        raise DeploymentError(f"root certificate {root_certificates!r} not found")


def _ec_public_key(text: str, where: str):
    """An OpenSSH public key line (``ecdsa-sha2-nistp384 AAAA...``) as a key object; only
    NIST elliptic curves, as Flower's SuperNode authentication needs."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    try:
        key = serialization.load_ssh_public_key(text.encode())
    except (ValueError, TypeError) as exc:
        raise DeploymentError(f"{where}: not an OpenSSH public key ({exc})") from None
    if not isinstance(key, ec.EllipticCurvePublicKey) or key.curve.name not in (
        "secp256r1",
        "secp384r1",
        "secp521r1",
    ):
        raise DeploymentError(
            f"{where}: Flower's SuperNode authentication needs an ECDSA key on a NIST "
            "curve (ssh-keygen -t ecdsa -b 384)"
        )
    return key


def read_authorized_keys(path: str, parties: list[str] | None = None) -> dict[str, bytes]:
    """The parties' public keys from ``path``: one line per party, ``PARTY`` followed by
    its OpenSSH public key (the ``.pub`` file ``ssh-keygen -t ecdsa -b 384`` writes);
    blank lines and lines starting with ``#`` are skipped. Returns party -> the key in
    the form Flower registers (DER). With ``parties``, every party must have exactly one
    key and no other name may appear.

    Examples
    --------
    >>> # fragment
    >>> read_authorized_keys("parties.keys", ["site0", "site1"])
    {'site0': b'0v0...', 'site1': b'0v0...'}
    """
    from flwr.supercore.primitives.asymmetric import public_key_to_bytes

    keys: dict[str, bytes] = {}
    owner: dict[bytes, str] = {}
    with open(path) as fh:
        for i, line in enumerate(fh, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            party, _, key_text = line.partition(" ")
            where = f"{path}, line {i} (party '{party}')"
            if not key_text.strip():
                raise DeploymentError(f"{where}: expected 'PARTY ecdsa-sha2-... KEY'")
            if party in keys:
                raise DeploymentError(f"{where}: a second key for party '{party}'")
            if parties is not None and party not in parties:
                raise DeploymentError(f"{where}: the model has no party '{party}' ({parties})")
            key = public_key_to_bytes(_ec_public_key(key_text.strip(), where))
            if key in owner:
                raise DeploymentError(f"{where}: the same key as party '{owner[key]}'")
            keys[party], owner[key] = key, party
    missing = [p for p in parties or [] if p not in keys]
    if missing:
        raise DeploymentError(f"{path}: no key for parties {missing}")
    return keys


def register_parties(
    superlink: str,
    keys: Mapping[str, bytes],
    *,
    insecure: bool = False,
    root_certificates: str | None = None,
) -> dict[str, int]:
    """Register each party's public key with the SuperLink (its Control API at
    ``superlink``), as ``flwr supernode register`` does, unless it is registered already;
    returns party -> the node id the SuperLink gave that key. A SuperLink started with
    ``--enable-supernode-auth`` accepts only the SuperNodes whose key is registered."""
    from flwr.cli.typing import SuperLinkConnection
    from flwr.cli.utils import init_http_client_from_connection

    conn = SuperLinkConnection(
        name="fedmodel",
        address=superlink,
        root_certificates=os.path.abspath(root_certificates) if root_certificates else None,
        insecure=bool(insecure),
    )
    client = init_http_client_from_connection(conn)
    try:
        return _register(client, keys)
    except FedModelError:
        raise
    except Exception as exc:  # the Control API's errors (httpx, Flower): one clear message
        raise DeploymentError(
            f"could not register the parties' keys with the SuperLink at {superlink}: "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    finally:
        client.close()


def _register(client, keys: Mapping[str, bytes]) -> dict[str, int]:
    from flwr.proto.control_pb2 import ListNodesRequest, RegisterNodeRequest

    known = {
        bytes(n.public_key): int(n.node_id)
        for n in client.ListNodes(ListNodesRequest()).nodes_info
        if n.status != "unregistered"
    }
    out = {}
    for party, key in keys.items():
        if key not in known:
            reply = client.RegisterNode(RegisterNodeRequest(public_key=key, name=party))
            if not reply.node_id:
                raise DeploymentError(f"the SuperLink did not register the key of '{party}'")
            known[key] = int(reply.node_id)
        out[party] = known[key]
    return out


# -- fedmodel serve ------------------------------------------------------------------------------
PYPROJECT = """\
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "fedmodel-run"
version = "1.0.0"
description = "A fedmodel solve (generated by fedmodel serve)"
license = "MIT"
dependencies = []

[tool.hatch.build.targets.wheel]
packages = ["."]

[tool.flwr.app]
publisher = "fedmodel"

[tool.flwr.app.components]
serverapp = "fedmodel_server:app"
clientapp = "fedmodel_relay:app"

[tool.flwr.app.config]
fedmodel-model = ""
fedmodel-method = "prox-al"
fedmodel-options = "{{}}"
fedmodel-out = ""
fedmodel-ledger = ""
fedmodel-nodes = ""
fedmodel-wait = 120.0
"""


def _toml_str(s: str) -> str:
    return json.dumps(s)  # a JSON string is a valid TOML basic string


def make_app_dir(directory: str, model_path: str) -> str:
    """Write the Flower app ``fedmodel serve`` runs: the ServerApp (this module's
    :data:`app`), the relay ClientApp (a copy of
    :mod:`fedmodel.runtime.flower_relay_app`, which needs no fedmodel on the nodes'
    ClientApp side) and the model file."""
    from fedmodel.runtime import flower_relay_app

    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "pyproject.toml"), "w") as fh:
        fh.write(PYPROJECT.format())
    with open(os.path.join(directory, "fedmodel_server.py"), "w") as fh:
        fh.write(
            '"""fedmodel serve: the ServerApp."""\n'
            "import fedmodel.flower_app as _fedmodel_app\n\n"
            "app = _fedmodel_app.app\n"
        )
    with open(os.path.join(directory, "fedmodel_relay.py"), "w") as fh:
        fh.write(inspect.getsource(flower_relay_app))
    shutil.copy(model_path, os.path.join(directory, "fedmodel_model.py"))
    return directory


def serve(
    model_path: str,
    method: str,
    options: dict[str, Any],
    superlink: str,
    out: str,
    ledger: str | None = None,
    *,
    insecure: bool = False,
    root_certificates: str | None = None,
    authorized_keys: str | None = None,
    wait: float = 120.0,
    timeout: float | None = None,
    stream: bool = True,
) -> dict:
    """Run ``method`` on the model file's model over the SuperLink whose Control API is at
    ``superlink`` (``HOST:PORT``); returns the Result as a dict (also written to ``out``).

    The ServerApp runs where the SuperLink runs it (its machine): ``out`` and ``ledger``
    are paths there. ``options`` are the method's options (as for ``model.solve``).

    TLS unless ``insecure`` (``root_certificates``: the CA certificate of the SuperLink's
    certificate). ``authorized_keys`` (see :func:`read_authorized_keys`): each party's
    public key is registered with the SuperLink (if it is not yet) and each party is
    accepted only from the node holding its key.
    """
    model_path = os.path.abspath(model_path)
    out = os.path.abspath(out)
    ledger = os.path.abspath(ledger) if ledger else ""
    json.dumps(options)  # the options must be JSON (they travel in the run config)
    transport_security("serve", insecure, root_certificates)
    nodes = None
    if authorized_keys:
        from fedmodel.deploy import load_model_file

        parties = load_model_file(model_path).parties
        keys = read_authorized_keys(authorized_keys, parties)
        nodes = register_parties(
            superlink, keys, insecure=insecure, root_certificates=root_certificates
        )
    else:
        print(
            "fedmodel serve: WARNING: no --authorized-keys: any SuperNode that reaches the "
            "SuperLink can claim a party's name",
            file=sys.stderr,
            flush=True,
        )
    if os.path.exists(out):
        os.unlink(out)
    work = tempfile.mkdtemp(prefix="fedmodel-serve-")
    try:
        app_dir = make_app_dir(os.path.join(work, "app"), model_path)
        home = os.path.join(work, "flwr")
        os.makedirs(home)
        conn = [f"address = {_toml_str(superlink)}"]
        if insecure:
            conn.append("insecure = true")
        if root_certificates:
            conn.append(f"root-certificates = {_toml_str(os.path.abspath(root_certificates))}")
        with open(os.path.join(home, "config.toml"), "w") as fh:
            fh.write('[superlink]\ndefault = "fedmodel"\n\n[superlink.fedmodel]\n')
            fh.write("\n".join(conn) + "\n")
        run_config = os.path.join(work, "run_config.toml")
        with open(run_config, "w") as fh:  # a file: the options' JSON has quotes and spaces
            for k, v in {
                "fedmodel-model": model_path,
                "fedmodel-method": method,
                "fedmodel-options": json.dumps(options),
                "fedmodel-out": out,
                "fedmodel-ledger": ledger,
                "fedmodel-nodes": json.dumps(nodes) if nodes else "",
            }.items():
                fh.write(f"{k} = {_toml_str(v)}\n")
            fh.write(f"fedmodel-wait = {float(wait)!r}\n")
        env = dict(os.environ, FLWR_HOME=home)
        cmd = [_flwr_bin("flwr"), "run", app_dir, "fedmodel", "--run-config", run_config]
        if stream:
            cmd.append("--stream")
        deadline = None if timeout is None else time.monotonic() + timeout
        stop_file = out + STOP_SUFFIX
        if os.path.exists(stop_file):
            os.unlink(stop_file)
        proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL)
        interrupted_at = None
        try:
            while not os.path.exists(out):
                try:
                    now = time.monotonic()
                    if deadline is not None and now > deadline:
                        break
                    if interrupted_at is None and stream and proc.poll() is not None:
                        break  # the run ended without a result
                    if interrupted_at is not None and now > interrupted_at + INTERRUPT_WAIT:
                        break
                    time.sleep(0.1)
                except KeyboardInterrupt:
                    if interrupted_at is not None:
                        raise  # a second Ctrl-C: stop waiting
                    # Ctrl-C: ask the ServerApp (on this machine) to stop where it is; it
                    # returns the last consistent iterate (status "interrupted")
                    interrupted_at = time.monotonic()
                    with open(stop_file, "w"):
                        pass
                    print(
                        "fedmodel serve: interrupting the solve (the last consistent iterate "
                        "is returned; Ctrl-C again to stop waiting)",
                        file=sys.stderr,
                        flush=True,
                    )
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        if not os.path.exists(out):
            raise ModelError(
                f"the Flower run ended without a result (flwr run exit code {proc.returncode}); "
                "see the SuperLink's log"
            )
        with open(out) as fh:
            return json.load(fh)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _flwr_bin(name: str) -> str:
    here = os.path.join(os.path.dirname(sys.executable), name)
    return here if os.path.exists(here) else name


# -- fedmodel join -------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def private_socket_dir(path: str) -> str:
    """The directory of a party server's socket and key (``fedmodel join --socket-dir``):
    created with mode 0700 when missing; an existing one must be a directory (not a
    link) of this user that no other user can enter. An existing directory is never
    re-permissioned: an unsafe one is refused with a :class:`DeploymentError`.

    Examples
    --------
    >>> import os, stat, tempfile
    >>> d = private_socket_dir(os.path.join(tempfile.mkdtemp(), "run"))
    >>> oct(stat.S_IMODE(os.stat(d).st_mode))
    '0o700'
    """
    path = os.path.abspath(path)
    while True:
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            try:
                os.mkdir(path, 0o700)
            except FileExistsError:
                continue  # made meanwhile by someone else: check it as an existing one
            os.chmod(path, 0o700)  # the directory just made (the umask may have cut bits)
            return path
        break
    advice = "give a directory only you can access (mkdir -m 700 DIR) or omit --socket-dir"
    if stat.S_ISLNK(st.st_mode):
        raise DeploymentError(f"--socket-dir {path} is a symbolic link; {advice}")
    if not stat.S_ISDIR(st.st_mode):
        raise DeploymentError(f"--socket-dir {path} is not a directory")
    if st.st_uid != os.geteuid():
        raise DeploymentError(
            f"--socket-dir {path} belongs to user id {st.st_uid}, not to this user "
            f"({os.geteuid()}); {advice}"
        )
    if st.st_mode & 0o077:
        raise DeploymentError(
            f"--socket-dir {path} has mode {stat.S_IMODE(st.st_mode):04o}: other users "
            "could reach the party server's socket and key, and fedmodel join does not "
            f"change the permissions of an existing directory; {advice}"
        )
    return path


def party_server(
    model_file,
    party: str,
    data: Mapping[str, Any],
    socket_path: str,
    checkpoint_dir: str | None = None,
):
    """The party server of ``party`` (its own data ``data``): its program compiled from the
    model file, a ``hello`` that reports the shapes of the arrays the model reads, and its
    checkpoint files under ``checkpoint_dir`` (none accepted without one)."""
    from fedmodel.algorithms.registry import all_methods
    from fedmodel.deploy import join_info, party_compiled
    from fedmodel.runtime.flower_party import PartyServer

    all_methods()  # every family registers the client halves a coordinator may build (wire)
    built = party_compiled(model_file, party, data)
    return PartyServer(
        socket_path,
        {party: built.program},
        info=join_info(party, data, built.used),
        regularizer=built.regularizer,
        checkpoint_dir=checkpoint_dir,
    )


_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # colours in Flower's log


def _exit_text(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def join(
    model_path: str,
    party: str,
    data_path: str,
    superlink: str,
    *,
    insecure: bool = False,
    root_certificates: str | None = None,
    auth_key: str | None = None,
    socket_dir: str | None = None,
    ready_file: str | None = None,
    checkpoint_dir: str | None = None,
) -> int:
    """Serve ``party`` (its data from ``data_path`` only) to the SuperLink whose Fleet API
    is at ``superlink``, until stopped (SIGTERM / Ctrl-C); returns an exit code.

    TLS unless ``insecure`` (``root_certificates``: the CA certificate of the SuperLink's
    certificate); ``auth_key``: the party's private key (OpenSSH, ECDSA) with which its
    SuperNode authenticates (its public key registered with the SuperLink). If the
    SuperNode exits (refused by the SuperLink, killed), the party server stops and a
    :class:`DeploymentError` says why.

    The party writes its checkpoint files only under ``checkpoint_dir`` (default
    ``fedmodel-checkpoints/<party>`` in the working directory; created ``0700`` when
    missing), one subdirectory per run token the coordinator names.
    """
    from fedmodel.deploy import load_model_file
    from fedmodel.runtime.trusted_clientapp import write_shim

    transport_security("join", insecure, root_certificates)
    if auth_key:
        _check_private_key(auth_key)
    elif not insecure:
        print(
            "fedmodel join: WARNING: no --auth-key: this SuperNode does not authenticate "
            "(a SuperLink started with --enable-supernode-auth refuses it)",
            file=sys.stderr,
            flush=True,
        )
    base = (
        private_socket_dir(socket_dir) if socket_dir else tempfile.mkdtemp(prefix="fedmodel-join-")
    )
    model_file = load_model_file(model_path)
    data = model_file.load(party, data_path)
    sock = os.path.join(base, f"{party}.sock")
    server = party_server(
        model_file,
        party,
        data,
        sock,
        checkpoint_dir=checkpoint_dir or os.path.join("fedmodel-checkpoints", party),
    )
    home = os.path.join(base, "flwr-" + party)
    os.makedirs(home, exist_ok=True)
    cmd = [
        _flwr_bin("flower-supernode"),
        "--superlink",
        superlink,
        "--node-config",
        f"fedmodel-socket={_toml_str(sock)} fedmodel-party={_toml_str(party)}",
        "--port",
        str(_free_port()),
    ]
    if insecure:
        cmd.append("--insecure")
    if root_certificates:
        cmd += ["--root-certificates", os.path.abspath(root_certificates)]
    if auth_key:
        cmd += ["--auth-supernode-private-key", os.path.abspath(auth_key)]
    env = dict(os.environ, FLWR_HOME=home)
    # the SuperExec starts `flwr-clientapp` from PATH for every message: ours first, which
    # runs this installation's relay and never the coordinator's FAB code (trusted_clientapp)
    shim_dir = os.path.join(base, "bin")
    write_shim(shim_dir)
    env["PATH"] = os.pathsep.join(
        [shim_dir, os.path.dirname(sys.executable), os.environ.get("PATH", "")]
    ).rstrip(os.pathsep)
    # the SuperNode's SuperExec looks for a message to start a ClientApp for every second by
    # default: every message would wait up to 1 s more (Flower's only latency knob here)
    env.setdefault(TASK_POLL_ENV, "0.05")

    def on_term(*_):
        server.stopped = True
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, on_term)  # (before the SuperNode can exit: see watch)
    stopping = threading.Event()
    exited: list[int] = []
    tail: collections.deque[str] = collections.deque(maxlen=1)  # its last line
    error: list[str] = []  # its last error block (Flower: an ERROR line, then details)
    try:
        node = subprocess.Popen(
            cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
    except OSError:
        server.close()
        raise

    def relay_output():  # the SuperNode's log to ours, keeping what says why it exited
        in_error = False
        for raw in node.stdout:
            line = raw.decode(errors="replace")
            text = _ANSI.sub("", line).strip()
            if "ERROR" in text:
                error[:], in_error = [text], True
            elif in_error and text and len(error) < 6:
                error.append(text)
            else:
                in_error = False
            if text:
                tail.append(text)
            try:
                sys.stderr.write(line)
                sys.stderr.flush()
            except (OSError, ValueError):
                pass

    def watch():  # the SuperNode exits on its own: stop the party server (SIGTERM)
        code = node.wait()
        time.sleep(0.2)  # a Ctrl-C reaches both processes: let this one's be seen first
        if not stopping.is_set() and not server.stopped:
            exited.append(code)
            server.stopped = True
            os.kill(os.getpid(), signal.SIGTERM)

    output = threading.Thread(target=relay_output, name="supernode-output", daemon=True)
    watcher = threading.Thread(target=watch, name="supernode-watch", daemon=True)
    output.start()
    watcher.start()
    if ready_file:
        with open(ready_file, "w") as fh:
            json.dump({"pid": os.getpid(), "supernode_pid": node.pid, "socket": sock}, fh)
    try:
        server.serve_forever(stop_on_interrupt=True)
    except (KeyboardInterrupt, SystemExit):
        pass
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # cleaning up: bounded, not interrupted
        stopping.set()
        if node.poll() is None:
            node.terminate()
        watcher.join(10)
        if watcher.is_alive():
            node.kill()
            watcher.join(10)
        output.join(5)
        server.close()
        if not socket_dir:
            shutil.rmtree(base, ignore_errors=True)  # the temporary directory made above
    if exited:
        said = tail if exited[0] < 0 or not error else error  # (killed: no error of its own)
        last = " | ".join(" ".join(line.split()) for line in said) or "no output"
        raise DeploymentError(
            f"the Flower SuperNode of party '{party}' {_exit_text(exited[0])} "
            f"({last}); the party server is stopped"
        )
    return 0


def _check_private_key(path: str) -> None:
    """``fedmodel join --auth-key``: an OpenSSH ECDSA private key on a NIST curve, readable
    by this user only."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    try:
        with open(path, "rb") as fh:
            key = serialization.load_ssh_private_key(fh.read(), None)
    except FileNotFoundError:
        raise DeploymentError(f"--auth-key {path} not found") from None
    except (ValueError, TypeError) as exc:
        raise DeploymentError(
            f"--auth-key {path}: not an unencrypted OpenSSH private key ({exc})"
        ) from None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise DeploymentError(
            f"--auth-key {path}: Flower's SuperNode authentication needs an ECDSA key "
            "(ssh-keygen -t ecdsa -b 384)"
        )
    if os.stat(path).st_mode & 0o077:
        raise DeploymentError(f"--auth-key {path} is readable by other users (chmod 600 it)")
