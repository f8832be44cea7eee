"""Checkpoints: the algorithm's state and every party's state, written where each runs.

A checkpoint is a directory::

    PATH/manifest.json          what was written, when, for which run; file checksums
    PATH/server-<tag>.pkl       the server half's state and the outer loop's state
    PATH/party-<name>-<tag>.pkl one per client, written by the client itself (its worker)

Each party serialises its own state (``get_state()``) together with a fingerprint of its
own terms and data, computed where it runs; only the file name and checksum go back to the
server, which writes the manifest last (so a crash while writing leaves the previous
checkpoint usable). Files of older checkpoints in the same directory are removed once the
new manifest is in place.

Loading checks, with a clear :class:`~fedmodel.runtime.checkpoint.CheckpointError`: that the
directory holds a fedmodel checkpoint, that every file is present with its checksum, that
it was written by the same method for a model with the same clients and variables, that
the options that change the iterates are the same, and (on each party) that the party's
terms and data are the ones it was written with. Checkpoints are pickles: load only
checkpoints you wrote.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import time
import uuid
from typing import Any

import numpy as np

from fedmodel.errors import ModelError


class CheckpointError(ModelError):
    """A checkpoint cannot be used: missing, corrupted, or written for another run."""


def file_sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def write_atomic(path: str, blob: bytes) -> str:
    """Write ``blob`` to ``path`` atomically; returns its sha256."""
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "wb") as fh:
        fh.write(blob)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    return hashlib.sha256(blob).hexdigest()


def safe_filename(name: str) -> str:
    keep = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name)
    return f"{keep}-{hashlib.sha1(name.encode()).hexdigest()[:8]}"


FORMAT = "fedmodel-checkpoint"
VERSION = 1
MANIFEST = "manifest.json"


def party_fingerprint(program: Any) -> str | None:
    """A hash of one party's terms (labels, sizes) and data, computed where it runs."""
    if program is None:
        return None
    h = hashlib.sha256()
    h.update(str(program.name).encode())
    h.update(str(program.layout.size).encode())
    for t in program.objective:
        h.update(f"obj:{t.label}".encode())
    for c in program.constraints:
        h.update(f"con:{c.label}:{c.kind}:{c.size}".encode())
    for d in program.data:
        v = d.value
        h.update(str(getattr(d, "data_name", "")).encode())
        if hasattr(v, "nnz"):
            v = v.tocsc()
            for part in (v.data, v.indices, v.indptr):
                h.update(np.ascontiguousarray(part).tobytes())
            h.update(str(v.shape).encode())
        else:
            arr = np.ascontiguousarray(np.asarray(v, dtype=float))
            h.update(str(arr.shape).encode())
            h.update(arr.tobytes())
    return h.hexdigest()


def model_fingerprint(compiled) -> dict[str, Any]:
    """What the server knows of the model: its name, variables, clients, own terms."""
    return {
        "name": compiled.name,
        "n_variables": int(compiled.layout.size),
        "clients": [c.name for c in compiled.clients],
        "server": party_fingerprint(compiled.server),
    }


def _jsonable(v: Any) -> Any:
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, (np.floating, np.integer)):
        return v.item()
    if isinstance(v, np.ndarray):
        return _jsonable(v.tolist())
    return v


def write_checkpoint(
    directory: str,
    runtime,
    *,
    method: str,
    model: dict,
    options: dict,
    iteration: int,
    server_state: dict,
    reason: str = "periodic",
) -> str:
    """Write a checkpoint from the parties' marked states and ``server_state``."""
    directory = os.fspath(directory)
    os.makedirs(directory, exist_ok=True)
    tag = f"{iteration:06d}-{uuid.uuid4().hex[:8]}"
    parties = runtime.write_party_checkpoint(directory, tag, marked=True)
    server_file = f"server-{tag}.pkl"
    record = {"format": "fedmodel-server-state", "state": server_state}
    server_sha = write_atomic(os.path.join(directory, server_file), pickle.dumps(record, 4))
    manifest = {
        "format": FORMAT,
        "version": VERSION,
        "method": method,
        "model": model,
        "options": _jsonable(options),
        "iteration": int(iteration),
        "reason": reason,
        "written": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "server": [server_file, server_sha],
        "parties": {n: list(v) for n, v in parties.items()},
    }
    write_atomic(os.path.join(directory, MANIFEST), json.dumps(manifest, indent=1).encode("utf-8"))
    keep = {server_file, MANIFEST} | {f for f, _ in parties.values()}
    for f in os.listdir(directory):
        if (f.startswith("server-") or f.startswith("party-")) and f.endswith(".pkl"):
            if f not in keep:
                try:
                    os.remove(os.path.join(directory, f))
                except OSError:
                    pass
    return directory


def read_manifest(directory: str) -> dict:
    directory = os.fspath(directory)
    path = os.path.join(directory, MANIFEST)
    if not os.path.isdir(directory):
        raise CheckpointError(f"no checkpoint at {directory!r} (not a directory)")
    if not os.path.exists(path):
        raise CheckpointError(f"no checkpoint at {directory!r}: {MANIFEST} is missing")
    try:
        with open(path, encoding="utf-8") as fh:
            manifest = json.load(fh)
    except (OSError, ValueError) as exc:
        raise CheckpointError(
            f"checkpoint {directory!r} is corrupted: {MANIFEST} cannot be read ({exc})"
        ) from exc
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CheckpointError(f"{directory!r} does not hold a fedmodel checkpoint")
    if manifest.get("version") != VERSION:
        raise CheckpointError(
            f"checkpoint {directory!r} has format version {manifest.get('version')!r}; this "
            f"fedmodel reads version {VERSION}"
        )
    for key in ("method", "model", "options", "iteration", "server", "parties"):
        if key not in manifest:
            raise CheckpointError(f"checkpoint {directory!r} is corrupted: no '{key}' entry")
    return manifest


def check_manifest(manifest: dict, *, method: str, model: dict, options: dict, where: str):
    """Raise CheckpointError when the checkpoint was written for another run."""
    if manifest["method"] != method:
        raise CheckpointError(
            f"checkpoint {where!r} was written by method '{manifest['method']}', not '{method}'"
        )
    theirs = manifest["model"]
    for key, label in (
        ("clients", "clients"),
        ("n_variables", "number of variables"),
        ("server", "server terms or data"),
    ):
        if theirs.get(key) != model.get(key):
            raise CheckpointError(
                f"checkpoint {where!r} was written for a different model ({label} differ: "
                f"{_short(theirs.get(key))} vs {_short(model.get(key))})"
            )
    mine = _jsonable(options)
    diff = sorted(
        k for k in set(mine) | set(manifest["options"]) if mine.get(k) != manifest["options"].get(k)
    )
    if diff:
        pairs = ", ".join(f"{k}: {manifest['options'].get(k)!r} -> {mine.get(k)!r}" for k in diff)
        raise CheckpointError(
            f"checkpoint {where!r} was written with different options ({pairs}); resume "
            "with the options it was written with"
        )


def read_server_state(directory: str, manifest: dict) -> dict:
    fname, sha = manifest["server"]
    path = os.path.join(os.fspath(directory), fname)
    if not os.path.exists(path):
        raise CheckpointError(f"checkpoint {directory!r} is incomplete: {fname} is missing")
    if file_sha256(path) != sha:
        raise CheckpointError(
            f"checkpoint {directory!r} is corrupted: {fname} does not match its checksum"
        )
    try:
        with open(path, "rb") as fh:
            record = pickle.load(fh)
    except Exception as exc:
        raise CheckpointError(f"checkpoint {directory!r}: {fname} cannot be read ({exc})") from exc
    if not isinstance(record, dict) or record.get("format") != "fedmodel-server-state":
        raise CheckpointError(f"checkpoint {directory!r}: {fname} is not a server state")
    return record["state"]


def _short(v: Any) -> str:
    s = repr(v)
    return s if len(s) <= 60 else s[:57] + "..."
