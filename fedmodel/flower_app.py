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

import numpy as np

from fedmodel.errors import FedModelError

# ``fedmodel serve`` asks the ServerApp to stop (Ctrl-C) by creating ``out + STOP_SUFFIX``;
# the Flower runtime checks for it while waiting for replies (JoinedGrid.stop_file)
STOP_SUFFIX = ".stop"
# the ServerApp writes its progress (JSON lines: rounds, outer iterations) to
# ``out + PROGRESS_SUFFIX``; ``fedmodel serve`` prints it
PROGRESS_SUFFIX = ".progress"
# seconds ``fedmodel serve`` waits for the result after a Ctrl-C
INTERRUPT_WAIT = 300.0
# seconds past ``--timeout`` before the run is stopped in the SuperLink without a result
LIMIT_GRACE = 60.0
# seconds to wait for a run to finish in the SuperLink once its result is written
FINISH_WAIT = 30.0
# the longest path of a Unix socket (Linux: 108 bytes with the final NUL)
SOCKET_PATH_MAX = 107
# seconds between two looks at the run's status in the SuperLink while waiting
STATUS_EVERY = 3.0


class DeploymentError(FedModelError):
    """A deployment cannot go on: a SuperNode exited, a party's key or socket directory
    is unsafe or missing, a key is not registered."""


def _server_main(grid, context) -> None:
    """The ServerApp's main: the coordinator's side of ``fedmodel serve``."""
    from fedmodel.algorithms.dp import privacy_from_plain
    from fedmodel.deploy import coordinator_model, load_model_file
    from fedmodel.runtime.flower_runtime import JoinedGrid, discover
    from fedmodel.runtime.trusted_supernode import prompt_object_pulls

    prompt_object_pulls()  # a reply announced before its objects: retried after 10 ms
    cfg = dict(context.run_config)
    model_file = load_model_file(cfg["fedmodel-model"])
    options = privacy_from_plain(json.loads(cfg.get("fedmodel-options", "{}")))
    out = cfg["fedmodel-out"]
    deadline = float(cfg.get("fedmodel-deadline") or 0.0) or None  # time.time() seconds
    report = ProgressFile(out + PROGRESS_SUFFIX)
    # SuperNode authentication: party -> the node id its public key was registered as
    nodes = json.loads(cfg.get("fedmodel-nodes") or "null")
    wait = float(cfg.get("fedmodel-wait", 120.0))
    if deadline is not None:
        wait = max(1.0, min(wait, deadline - time.time()))
    stats: dict = {}
    found = discover(grid, model_file.parties, timeout=wait, nodes=nodes, stats=stats)
    report.write({"event": "joined", "parties": {p: n for p, (n, _info) in found.items()}})
    shapes = {p: info["shapes"][p] for p, (_node, info) in found.items()}
    model = coordinator_model(model_file, shapes)
    options = _with_progress_and_limit(
        cfg["fedmodel-method"], options, report, deadline, stats.get("hello_seconds", 1.0)
    )
    # the runtime uses these nodes (one hello per party); Ctrl-C on `fedmodel serve`
    # creates the stop file; past the deadline the runtime stops as if interrupted
    joined = JoinedGrid(
        grid, found, stop_file=out + STOP_SUFFIX, progress=report.write, deadline=deadline
    )
    res = model.solve(cfg["fedmodel-method"], backend="flower", flower_grid=joined, **options)
    if res.status == "interrupted" and deadline is not None and time.time() >= deadline:
        res.status = "time_limit"  # stopped by the runtime at the deadline, not by Ctrl-C
        res.message = res.message.replace(
            "interrupted (Ctrl-C)", "the time limit of fedmodel serve --timeout was reached"
        )
    write_outputs(res, out, cfg.get("fedmodel-ledger") or None)


class ProgressFile:
    """The ServerApp's progress, one JSON line per event, for ``fedmodel serve`` to print
    (both run on the SuperLink's machine)."""

    def __init__(self, path: str):
        self.path = path

    def write(self, row: Mapping[str, Any]) -> None:
        from fedmodel.result import _jsonable

        try:
            with open(self.path, "a") as fh:
                fh.write(json.dumps(_jsonable(dict(row))) + "\n")
        except OSError:  # progress is a courtesy: never the reason a solve fails
            pass


def _with_progress_and_limit(
    method: str, options: dict, report: ProgressFile, deadline: float | None, trip: float
) -> dict:
    """The method's options with a callback writing each outer iteration's residuals to
    the progress file and, before ``deadline``, a ``time_limit`` (when the method takes
    these options and the user did not set them). The method's clock starts once the
    parties have built their halves (about two round trips of ``trip`` seconds, the
    ``hello``'s, and the compilation), and its time limit leaves time for the final
    certificate, report and checkpoint (about five round trips); past ``deadline`` the
    runtime stops the solve anyway (:class:`~fedmodel.runtime.flower_runtime.JoinedGrid`)."""
    from fedmodel.algorithms.registry import all_methods

    spec = all_methods().get(method)
    fields = getattr(getattr(spec, "options", None), "__dataclass_fields__", {})
    options = dict(options)
    if "callback" in fields:
        options["callback"] = lambda row: report.write({"event": "iteration", **row})
    if deadline is not None and "time_limit" in fields and options.get("time_limit") is None:
        left = deadline - time.time()
        options["time_limit"] = max(0.3 * left, left - (2 * trip + 1.0) - (5 * trip + 1.0))
    return options


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
    >>> import os, tempfile
    >>> from cryptography.hazmat.primitives import serialization
    >>> from cryptography.hazmat.primitives.asymmetric import ec
    >>> def openssh_public_key():
    ...     key = ec.generate_private_key(ec.SECP384R1()).public_key()
    ...     return key.public_bytes(
    ...         serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    ...     ).decode()
    >>> path = os.path.join(tempfile.mkdtemp(), "parties.keys")
    >>> with open(path, "w") as fh:
    ...     print("# one line per party", file=fh)
    ...     print("site0", openssh_public_key(), file=fh)
    ...     print("site1", openssh_public_key(), file=fh)
    >>> sorted(read_authorized_keys(path, ["site0", "site1"]))
    ['site0', 'site1']
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


def control_client(superlink: str, *, insecure: bool, root_certificates: str | None):
    """A client of the SuperLink's Control API at ``superlink`` (Flower's, as ``flwr``
    uses it); close it after use."""
    from flwr.cli.typing import SuperLinkConnection
    from flwr.cli.utils import init_http_client_from_connection

    conn = SuperLinkConnection(
        name="fedmodel",
        address=superlink,
        root_certificates=os.path.abspath(root_certificates) if root_certificates else None,
        insecure=bool(insecure),
    )
    return init_http_client_from_connection(conn)


def superlink_error(superlink: str, exc: BaseException) -> str:
    """What went wrong talking to the SuperLink, with the likely causes of a refused
    connection (among them the one Flower does not report: a SuperLink that exited
    because ``flower-superexec`` is not on its ``PATH``)."""
    import httpx

    text = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, httpx.ConnectError) or "unavailable" in str(exc).lower():
        text += (
            f" (is flower-superlink running and listening at {superlink}? It exits at "
            "start when 'flower-superexec' is not on its PATH: start it with the bin "
            "directory of the Python environment where Flower is installed first on PATH, "
            f"e.g. PATH={os.path.dirname(sys.executable)}:$PATH)"
        )
    return text


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
    client = control_client(superlink, insecure=insecure, root_certificates=root_certificates)
    try:
        return _register(client, keys)
    except FedModelError:
        raise
    except Exception as exc:  # the Control API's errors (httpx, Flower): one clear message
        raise DeploymentError(
            f"could not register the parties' keys with the SuperLink at {superlink}: "
            + superlink_error(superlink, exc)
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
fedmodel-deadline = 0.0
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
    progress: bool = True,
) -> dict:
    """Run ``method`` on the model file's model over the SuperLink whose Control API is at
    ``superlink`` (``HOST:PORT``); returns the Result as a dict (also written to ``out``).

    The ServerApp runs where the SuperLink runs it (its machine): ``out`` and ``ledger``
    are paths there. ``options`` are the method's options (as for ``model.solve``).

    ``dp=`` and ``secure_aggregation=`` may be given as dicts of their fields (as on the
    command line: ``-o "dp={'epsilon': 3, 'delta': 1e-5, 'clip': 1}"``).

    TLS unless ``insecure`` (``root_certificates``: the CA certificate of the SuperLink's
    certificate). ``authorized_keys`` (see :func:`read_authorized_keys`): each party's
    public key is registered with the SuperLink (if it is not yet) and each party is
    accepted only from the node holding its key.

    ``progress`` prints a line per communication round (the parties that answered, the
    last KKT residuals) on stdout. ``timeout`` (seconds, the whole run): the solve stops
    there with status ``"time_limit"``, its last point and a checkpoint (``checkpoint=``,
    default ``OUT.checkpoint``; none under ``dp=``, whose checkpoint would not carry the
    privacy spent); should the ServerApp not return in time, the run is
    stopped in the SuperLink and a :class:`DeploymentError` says so. Ctrl-C, or SIGTERM
    (in the main thread), stops the solve at its last consistent iterate (status
    ``"interrupted"``). When this returns (or raises) no run it started is left running in
    the SuperLink.
    """
    model_path = os.path.abspath(model_path)
    out = os.path.abspath(out)
    ledger = os.path.abspath(ledger) if ledger else ""
    from fedmodel.algorithms.dp import privacy_as_plain

    # the options must be JSON (they travel in the run config): dp= and
    # secure_aggregation= as the dicts of their fields
    options = privacy_as_plain(dict(options))
    json.dumps(options)
    start = time.time()
    deadline = None if timeout is None else start + float(timeout)
    if (
        deadline is not None
        and not {"checkpoint", "resume"} & set(options)
        and not options.get("dp")
    ):
        options["checkpoint"] = out + ".checkpoint"  # a timed-out run can be resumed
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
    stop_file, progress_file = out + STOP_SUFFIX, out + PROGRESS_SUFFIX
    for path in (out, stop_file, progress_file):
        if os.path.exists(path):
            os.unlink(path)
    config = {
        "fedmodel-model": model_path,
        "fedmodel-method": method,
        "fedmodel-options": json.dumps(options),
        "fedmodel-out": out,
        "fedmodel-ledger": ledger,
        "fedmodel-nodes": json.dumps(nodes) if nodes else "",
        "fedmodel-wait": float(wait),
        "fedmodel-deadline": float(deadline or 0.0),
    }
    client = control_client(superlink, insecure=insecure, root_certificates=root_certificates)
    run = None
    previous_term = _term_as_ctrl_c()
    try:
        work = tempfile.mkdtemp(prefix="fedmodel-serve-")
        try:
            run = _start_run(client, make_app_dir(os.path.join(work, "app"), model_path), config)
        except FedModelError:
            raise
        except Exception as exc:
            raise DeploymentError(
                f"could not start the run on the SuperLink at {superlink}: "
                + superlink_error(superlink, exc)
            ) from exc
        finally:
            shutil.rmtree(work, ignore_errors=True)
        _say("serve", f"started run {run} on the SuperLink at {superlink}; waiting for the parties")
        watch = _RunWatch(client, run, out, progress_file, progress, superlink)
        try:
            watch.until_result(deadline, wait)
        except KeyboardInterrupt:
            # Ctrl-C (or SIGTERM): ask the ServerApp (on this machine) to stop where it is;
            # it returns the last consistent iterate (status "interrupted"); Ctrl-C again:
            # stop waiting
            with open(stop_file, "w"):
                pass
            print(
                "fedmodel serve: interrupting the solve (the last consistent iterate is "
                "returned; Ctrl-C again to stop waiting)",
                file=sys.stderr,
                flush=True,
            )
            watch.until_result(time.time() + INTERRUPT_WAIT, wait, interrupted=True)
        with open(out) as fh:
            result = json.load(fh)
        watch.finished(FINISH_WAIT)  # the ServerApp returns once it has written `out`
        return result
    finally:
        try:
            if run is not None:
                _stop_run(client, run)
        finally:
            client.close()
            for path in (stop_file, progress_file):
                if os.path.exists(path):
                    os.unlink(path)
            if previous_term is not None:
                signal.signal(signal.SIGTERM, previous_term)


def _term_as_ctrl_c():
    """From here on SIGTERM is Ctrl-C (a KeyboardInterrupt: ``fedmodel serve`` stopped by
    a service manager or ``kill`` ends as interrupted, with its checkpoint, and stops its
    run in the SuperLink). Returns the previous handler, or None off the main thread
    (where signals cannot be handled: there SIGTERM keeps its handling)."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def on_term(signum, frame):
        raise KeyboardInterrupt

    return signal.signal(signal.SIGTERM, on_term)


def _start_run(client, app_dir: str, config: Mapping[str, Any]) -> int:
    """Start the Flower app in ``app_dir`` on the SuperLink (as ``flwr run`` does, with
    the run config overrides ``config``); returns the run id."""
    import hashlib
    from pathlib import Path

    from flwr.cli.build import build_fab_from_disk
    from flwr.common.serde import fab_to_proto, user_config_to_proto
    from flwr.proto.control_pb2 import StartRunRequest
    from flwr.supercore.fab import Fab

    fab_bytes = build_fab_from_disk(Path(app_dir))
    fab = Fab(hashlib.sha256(fab_bytes).hexdigest(), fab_bytes, {})
    res = client.StartRun(
        StartRunRequest(fab=fab_to_proto(fab), override_config=user_config_to_proto(dict(config)))
    )
    if not res.HasField("run_id"):
        raise DeploymentError("the SuperLink did not start the run")
    return int(res.run_id)


def run_status(client, run: int) -> tuple[str, str]:
    """``(status, sub_status)`` of a run on the SuperLink (``"running"``, ``""``;
    ``"finished"``, ``"completed"`` ...)."""
    from flwr.common.serde import run_from_proto
    from flwr.proto.control_pb2 import ListRunsRequest

    res = client.ListRuns(ListRunsRequest(run_id=run))
    for proto in res.run_dict.values():
        status = run_from_proto(proto).status
        return status.status, status.sub_status
    return "unknown", ""


def _stop_run(client, run: int) -> None:
    """Stop the run in the SuperLink unless it has finished (as ``flwr stop`` does)."""
    from flwr.proto.control_pb2 import StopRunRequest

    try:
        if run_status(client, run)[0] == "finished":
            return
        client.StopRun(StopRunRequest(run_id=run))
        print(f"fedmodel serve: stopped run {run} in the SuperLink", file=sys.stderr, flush=True)
    except Exception as exc:  # noqa: BLE001 - reported, the error that got here matters more
        print(
            f"fedmodel serve: WARNING: could not stop run {run} in the SuperLink "
            f"({type(exc).__name__}: {exc}); stop it with 'flwr stop {run}'",
            file=sys.stderr,
            flush=True,
        )


class _RunWatch:
    """``fedmodel serve`` waiting for its run: prints the progress the ServerApp writes,
    watches the run's status in the SuperLink, and the time limit."""

    def __init__(self, client, run: int, out: str, progress_file: str, show: bool, link: str):
        self.client, self.run, self.out, self.link = client, run, out, link
        self.progress_file, self.show = progress_file, show
        self._offset, self._outer = 0, None
        self._status, self._checked, self._pending_since = ("pending", ""), 0.0, time.time()

    def until_result(self, deadline: float | None, wait: float, interrupted=False) -> None:
        """Return once the result file exists; raise :class:`DeploymentError` when the run
        ended without one, never started, or outlived ``deadline`` (+ a grace period)."""
        while not os.path.exists(self.out):
            self._print_progress()
            now = time.time()
            if now - self._checked > STATUS_EVERY:
                self._checked = now
                self._check_run(wait)
            if deadline is not None and now > deadline + (0 if interrupted else LIMIT_GRACE):
                what = "after the interruption" if interrupted else "at its time limit"
                raise DeploymentError(
                    f"the ServerApp of run {self.run} did not return a result {what} "
                    f"(waited {now - deadline:.0f} s more); the run is stopped in the "
                    "SuperLink, and no result was written"
                )
            time.sleep(0.1)
        self._print_progress()

    def _check_run(self, wait: float) -> None:
        status = run_status(self.client, self.run)
        if status[0] in ("pending", "starting"):
            if time.time() - self._pending_since > max(wait, 30.0):
                raise DeploymentError(
                    f"the SuperLink at {self.link} has not started the ServerApp of run "
                    f"{self.run} within {max(wait, 30.0):g} s (status {status[0]}): the "
                    "SuperLink starts it with 'flower-superexec', which must be on the "
                    "SuperLink's PATH (the bin directory of the Python environment where "
                    "fedmodel and Flower are installed)"
                )
        elif status[0] == "finished" and not os.path.exists(self.out):
            time.sleep(0.5)  # (the file written just before the run finished)
            if not os.path.exists(self.out):
                raise DeploymentError(
                    f"run {self.run} ended ({status[1] or status[0]}) without a result; "
                    f"the ServerApp's log ends with: {self.log_tail()}"
                )

    def finished(self, timeout: float) -> None:
        """Wait (bounded) until the run has finished in the SuperLink."""
        until = time.time() + timeout
        while time.time() < until and run_status(self.client, self.run)[0] != "finished":
            time.sleep(0.1)

    def log_tail(self, lines: int = 12) -> str:
        """The last lines of the ServerApp's log (Flower keeps it in the SuperLink)."""
        from flwr.proto.control_pb2 import StreamLogsRequest

        try:
            text = ""
            for res in self.client.StreamLogs(StreamLogsRequest(run_id=self.run)):
                text += res.log_output
                break
        except Exception as exc:  # noqa: BLE001
            return f"(the log could not be read: {type(exc).__name__}: {exc})"
        said = [_ANSI.sub("", t).rstrip() for t in text.splitlines() if t.strip()]
        return " | ".join(said[-lines:]) or "(empty)"

    def _print_progress(self) -> None:
        try:
            with open(self.progress_file) as fh:
                fh.seek(self._offset)
                chunk = fh.read()
        except FileNotFoundError:
            return
        done = chunk[: chunk.rfind("\n") + 1]
        self._offset += len(done.encode())
        for line in done.splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue
            text = self.describe(row)
            if text and self.show:
                _say("serve", text)

    def describe(self, row: Mapping[str, Any]) -> str | None:
        """A progress line: a round's answers (with the last residuals), or the parties
        having joined."""
        from fedmodel.progress import Progress

        if row.get("event") == "joined":
            return "parties joined: " + ", ".join(
                f"{p} (node {n})" for p, n in row.get("parties", {}).items()
            )
        if row.get("event") == "iteration":
            self._outer = Progress.describe(row)
            return None
        if row.get("event") != "round":
            return None
        what = "" if row.get("channel", "algorithm") == "algorithm" else f" ({row.get('kind')})"
        text = f"round {row['round']}{what}: {', '.join(row['answered']) or 'no party'} answered"
        if row.get("failed"):
            text += f", {', '.join(row['failed'])} failed"
        text += f" ({row.get('seconds', 0.0):.2f} s)"
        if self._outer:
            text += f"; {self._outer}"
        return text


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
    reveal: tuple[str, ...] = (),
):
    """The party server of ``party`` (its own data ``data``): its program compiled from the
    model file, a ``hello`` that reports the shapes of the arrays the model reads, its
    checkpoint files under ``checkpoint_dir`` (none accepted without one) and the opt-ins
    it enables (``reveal``: nothing beyond its method's default messages by default)."""
    from fedmodel.algorithms.privacy import party_opt_ins
    from fedmodel.algorithms.registry import all_methods
    from fedmodel.deploy import join_info, party_compiled
    from fedmodel.runtime.flower_party import PartyServer

    all_methods()  # every family registers the client halves a coordinator may build (wire)
    known = party_opt_ins()
    unknown = sorted(set(reveal) - set(known))
    if unknown:
        raise DeploymentError(f"--reveal {' '.join(unknown)}: unknown opt-in; known: {known}")
    built = party_compiled(model_file, party, data)
    return PartyServer(
        socket_path,
        {party: built.program},
        info=join_info(party, data, built.used),
        regularizer=built.regularizer,
        checkpoint_dir=checkpoint_dir,
        reveal=reveal,
        compiled=built.compiled,
    )


_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # colours in Flower's log


def _exit_text(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def describe_data(data: Mapping[str, Any], used: tuple[str, ...]) -> str:
    """What ``fedmodel join`` says it loaded: each array's name and shape, those the model
    reads (whose shapes the party reports when joining) and those it does not.

    Examples
    --------
    >>> import numpy as np
    >>> describe_data({"X0": np.zeros((60, 5)), "ids": np.zeros(90)}, ("X0",))
    'X0 (60, 5); not read by the model (nothing about it is sent): ids (90,)'
    """

    def shape(k):
        return f"{k} {tuple(int(n) for n in np.shape(data[k]))}"

    text = ", ".join(shape(k) for k in used) or "no array read by the model"
    unread = [k for k in data if k not in used]
    if unread:
        text += "; not read by the model (nothing about it is sent): "
        text += ", ".join(shape(k) for k in unread)
    return text


def _say(command: str, text: str) -> None:
    print(f"fedmodel {command}: {text}", flush=True)


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
    reveal: tuple[str, ...] = (),
) -> int:
    """Serve ``party`` (its data from ``data_path`` only) to the SuperLink whose Fleet API
    is at ``superlink``, until stopped (SIGTERM / Ctrl-C); returns an exit code.

    TLS unless ``insecure`` (``root_certificates``: the CA certificate of the SuperLink's
    certificate); ``auth_key``: the party's private key (OpenSSH, ECDSA) with which its
    SuperNode authenticates (its public key registered with the SuperLink). If the
    SuperNode exits (refused by the SuperLink, killed), the party server stops and a
    :class:`DeploymentError` says why.

    It prints what it loaded (each array's name and shape) and ``ready`` once its
    SuperNode is connected. The SuperNode is Flower's, run by
    :mod:`fedmodel.runtime.trusted_supernode`: every message is handled in that process
    by the relay ClientApp of this fedmodel installation (never the coordinator's code).
    The temporary directory it makes (without ``socket_dir``) is removed when it stops,
    also on SIGTERM or Ctrl-C.

    The party writes its checkpoint files only under ``checkpoint_dir`` (default
    ``fedmodel-checkpoints/<party>`` in the working directory; created ``0700`` when
    missing), one subdirectory per run token the coordinator names.

    ``reveal`` names the opt-ins the party enables beyond its method's default messages
    (``"hessian"``: its ``d x d`` Hessian, for prox-al's ``inner_solver="newton"`` and
    ``penalty_metric="hessian"``); none by default, whatever the coordinator asks.
    """
    from fedmodel.deploy import load_model_file
    from fedmodel.runtime.flower_runtime import import_flwr

    import_flwr()
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
    stopping = threading.Event()

    def on_term(*_):
        if not stopping.is_set():
            stopping.set()
            raise SystemExit(0)

    # from here on SIGTERM unwinds (and cleans up) like Ctrl-C
    previous = signal.signal(signal.SIGTERM, on_term)
    base = None
    try:
        base = (
            private_socket_dir(socket_dir)
            if socket_dir
            else tempfile.mkdtemp(prefix="fedmodel-join-")
        )
        sock = os.path.join(base, f"{party}.sock")
        if len(os.fsencode(sock)) > SOCKET_PATH_MAX:
            raise DeploymentError(
                f"the party server's socket {sock} would have a path of "
                f"{len(os.fsencode(sock))} bytes, longer than a Unix socket allows "
                f"({SOCKET_PATH_MAX}): give a shorter --socket-dir (or TMPDIR)"
            )
        model_file = load_model_file(model_path)
        data = model_file.load(party, data_path)
        server = party_server(
            model_file,
            party,
            data,
            sock,
            checkpoint_dir=checkpoint_dir or os.path.join("fedmodel-checkpoints", party),
            reveal=tuple(reveal),
        )
        used = tuple(server.info["shapes"][party])
        _say("join", f"party '{party}': loaded {data_path}: {describe_data(data, used)}")
        enabled = ", ".join(sorted(server.reveal)) or "none (the method's default messages only)"
        _say("join", f"party '{party}': opt-ins enabled: {enabled}")
        try:
            return _run_supernode(
                server, party, superlink, base, sock, stopping,
                insecure=insecure, root_certificates=root_certificates,
                auth_key=auth_key, ready_file=ready_file,
            )  # fmt: skip
        finally:
            server.close()
    except (KeyboardInterrupt, SystemExit):
        if not stopping.is_set():
            stopping.set()
            raise  # stopped while loading: the exit code says so
        return 0
    finally:
        stopping.set()
        if base is not None and not socket_dir:
            shutil.rmtree(base, ignore_errors=True)  # the temporary directory made above
        signal.signal(signal.SIGTERM, previous)


def _run_supernode(
    server,
    party: str,
    superlink: str,
    base: str,
    sock: str,
    stopping: threading.Event,
    *,
    insecure: bool,
    root_certificates: str | None,
    auth_key: str | None,
    ready_file: str | None,
) -> int:
    """Start ``fedmodel join``'s SuperNode and serve ``server`` until stopped."""
    import secrets

    from fedmodel.runtime import trusted_supernode
    from fedmodel.runtime.trusted_clientapp import write_shim

    home = os.path.join(base, "flwr-" + party)
    os.makedirs(home, exist_ok=True)
    # claiming a task on the SuperNode's Runtime API (its HTTP port) needs this secret
    secret = os.path.join(base, "superexec.secret")
    fd = os.open(secret, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(secrets.token_bytes(32))
    cmd = [
        sys.executable,
        os.path.abspath(trusted_supernode.__file__),
        "--superlink",
        superlink,
        "--node-config",
        f"fedmodel-socket={_toml_str(sock)} fedmodel-party={_toml_str(party)}",
        "--isolation",
        trusted_supernode.ISOLATION,
        "--superexec-auth-secret-file",
        secret,
        "--host",
        "127.0.0.1",
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
    # the SuperNode runs every ClientApp task itself (trusted_supernode); should a Flower
    # start a task process anyway, it finds fedmodel's commands first on its PATH
    # (trusted_clientapp: its flwr-clientapp runs this installation's relay, the others
    # refuse to start)
    shim_dir = os.path.join(base, "bin")
    write_shim(shim_dir)
    env["PATH"] = os.pathsep.join(
        [shim_dir, os.path.dirname(sys.executable), os.environ.get("PATH", "")]
    ).rstrip(os.pathsep)
    exited: list[int] = []
    tail: collections.deque[str] = collections.deque(maxlen=1)  # its last line
    error: list[str] = []  # its last error block (Flower: an ERROR line, then details)
    node = subprocess.Popen(
        cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    node_id = re.compile(r"SuperNode ID:\s*(\d+)")

    def relay_output():  # the SuperNode's log to ours, keeping what says why it exited
        in_error, ready = False, False
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
            found = None if ready else node_id.search(text)
            if found:
                ready = True
                _say(
                    "join",
                    f"party '{party}' ready: SuperNode {found.group(1)} connected to the "
                    f"SuperLink at {superlink} (Ctrl-C or SIGTERM stops it)",
                )
                if ready_file:
                    with open(ready_file, "w") as fh:
                        json.dump({"pid": os.getpid(), "supernode_pid": node.pid,
                                   "socket": sock, "node_id": int(found.group(1))}, fh)  # fmt: skip

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
    if exited:
        said = tail if exited[0] < 0 or not error else error  # (killed: no error of its own)
        last = " | ".join(" ".join(line.split()) for line in said) or "no output"
        raise DeploymentError(
            f"the Flower SuperNode of party '{party}' {_exit_text(exited[0])} "
            f"({last}); the party server is stopped"
        )
    _say("join", f"party '{party}' stopped")
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
