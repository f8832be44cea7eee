"""Checkpoints: the algorithm's state and every party's state, written where each runs.

A checkpoint is a directory::

    PATH/manifest.json           what was written, when, for which run; file checksums
    PATH/server-<tag>.npz        the server half's state and the outer loop's state
    PATH/party-<name>-<tag>.npz  one per client, written by the client itself (its worker)

Format (version 2). Every state file is a numpy ``.npz`` archive read with
``allow_pickle=False``: its entry ``text`` is the state's structure as JSON (UTF-8) and
``a0``, ``a1`` ... are the numeric arrays it refers to, as written by the plain codec
(:mod:`fedmodel.runtime.plaincodec`: plain values, numpy scalars and arrays, lists, tuples
and dicts). Nothing in a checkpoint is unpickled and no class or function is looked up by
name: reading one builds plain values and arrays only, which each party's ``set_state``
takes. Version 1 checkpoints (pickles) are refused with a :class:`CheckpointError`.

Each party serialises its own state (``get_state()``) together with a fingerprint of its
own terms and data, computed where it runs, and chooses its file's name itself
(``party-<name>-<tag>.npz`` in the directory it writes to); only the file name and
checksum go back to the server, which writes the manifest last (so a crash while writing
leaves the previous checkpoint usable). Files of older checkpoints in the same directory
are removed once the new manifest is in place. A party deployed in its own organisation
(``fedmodel join``) writes to its own checkpoint directory (``--checkpoint-dir``): the
coordinator names only a run token, a plain name checked by the party
(:func:`checked_token`), never a path.

Loading checks, each with a clear :class:`CheckpointError`:

* the directory holds a fedmodel checkpoint of this format version;
* every file name is a bare name of the expected form (``server-<tag>.npz``, and on each
  party its own ``party-<name>-<tag>.npz``): no directory part, no ``..``, not absolute,
  resolved inside the directory; anything else is refused before any file is opened;
* every file is present, matches its checksum, and is a state archive of the plain form;
* it was written by the same method, for a model with the same clients and variables, with
  the same options that change the iterates;
* the model is the same one: the server's terms and the
  regularizer ``h`` (:mod:`fedmodel.compiler.fingerprint`) and, on each party, that party's
  own terms and data. A term's fingerprint covers its expression tree and **every
  constant in it** (bounds, coefficients, cvxpy constants and parameter values), so a
  resume after, e.g., a constraint bound changed from 0.45 to 0.3 is refused naming the
  party whose terms changed.

Within one organisation, worker processes and Ray actors still receive their endpoint
factories and messages as pickles (``multiprocessing`` and Ray use pickle): both ends are
processes the same user started on machines of the same trust domain, so nothing unpickled
there crossed an organisation's boundary. Checkpoints are files that may be copied around,
and a deployed party's checkpoint calls come from another organisation's coordinator:
those never use pickle.

Examples
--------
>>> import tempfile, os, numpy as np
>>> d = tempfile.mkdtemp()
>>> sha = write_state_file(os.path.join(d, "server-000001-0a1b2c3d.npz"),
...                        {"x": np.arange(3.0), "k": 1})
>>> read_state_file(d, "server-000001-0a1b2c3d.npz", sha, "server")["x"].tolist()
[0.0, 1.0, 2.0]
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import tempfile
import time
import uuid
from collections.abc import Mapping
from typing import Any

import numpy as np

from fedmodel.errors import ModelError
from fedmodel.runtime import plaincodec


class CheckpointError(ModelError):
    """A checkpoint cannot be used: missing, corrupted, or written for another run."""


def file_sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


#: the infix of a temporary file (``<name>.tmp-<random>``) while it is written
TMP = ".tmp-"


def write_atomic(path: str, blob: bytes) -> str:
    """Write ``blob`` to ``path`` atomically; returns its sha256. The temporary file is
    created exclusively under a random name (``O_CREAT | O_EXCL``, mode 0600): a file or
    a symbolic link already there is never opened, let alone followed."""
    directory, base = os.path.split(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=base + TMP, dir=directory)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(blob)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return hashlib.sha256(blob).hexdigest()


def remove_stale_temporaries(directory: str, names: Any = None) -> list[str]:
    """Remove the temporary files a crashed write left in ``directory`` (``<name>.tmp-*``
    of fedmodel's own files: the manifest and state files, or ``names``); a symbolic link
    there is removed itself, never followed. Returns the names removed."""
    removed = []
    for f in os.listdir(directory):
        base, sep, _ = f.partition(TMP)
        if not sep:
            continue
        ours = base == MANIFEST or (
            base.endswith(SUFFIX) and base.startswith(("server-", "party-"))
        )
        if ours or (names is not None and base in names):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(directory, f))
                removed.append(f)
    return removed


def state_misfit(fresh: Any, loaded: Any, where: str = "the state") -> str | None:
    """Why a checkpointed state ``loaded`` does not fit the state of the half it is for
    (``fresh``: that half's state now), or None: every field the half has is there, an
    array where it has an array (of the same kind and number of axes, and the same shape
    unless the half's is empty), a number, a string, a mapping
    or a sequence where it has one. (A field that is None now is not judged.)

    >>> import numpy as np
    >>> state_misfit({"mu": np.zeros(2)}, {"mu": np.zeros(3)})
    "the state['mu'] has shape (3,), not (2,)"
    """
    if fresh is None:
        return None
    if isinstance(fresh, np.ndarray):
        if not isinstance(loaded, np.ndarray):
            return f"{where} is a {type(loaded).__name__}, not an array"
        if loaded.ndim != fresh.ndim or (fresh.size and loaded.shape != fresh.shape):
            return f"{where} has shape {loaded.shape}, not {fresh.shape}"
        if loaded.dtype.kind != fresh.dtype.kind:
            return f"{where} has dtype {loaded.dtype}, not {fresh.dtype}"
        return None
    if isinstance(fresh, Mapping):
        if not isinstance(loaded, Mapping):
            return f"{where} is a {type(loaded).__name__}, not a mapping"
        for key, value in fresh.items():
            if key not in loaded:
                return f"{where} lacks {key!r}"
            why = state_misfit(value, loaded[key], f"{where}[{key!r}]")
            if why:
                return why
        return None
    if isinstance(fresh, (list, tuple)):
        ok = isinstance(loaded, (list, tuple))
        return None if ok else f"{where} is a {type(loaded).__name__}, not a sequence"
    if isinstance(fresh, (bool, np.bool_)):
        ok = isinstance(loaded, (bool, np.bool_))
        return None if ok else f"{where} is a {type(loaded).__name__}, not a bool"
    if isinstance(fresh, (int, float, np.number)):
        ok = isinstance(loaded, (int, float, np.number)) and not isinstance(loaded, bool)
        return None if ok else f"{where} is a {type(loaded).__name__}, not a number"
    if isinstance(fresh, str):
        return None if isinstance(loaded, str) else f"{where} is not a string"
    return None


def safe_filename(name: str) -> str:
    """``name`` as a file-name part: other characters replaced, a short hash appended.

    >>> safe_filename("site 0/a")
    'site_0_a-50ef2216'
    """
    keep = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name)
    return f"{keep}-{hashlib.sha1(name.encode()).hexdigest()[:8]}"


FORMAT = "fedmodel-checkpoint"
#: 2: states as .npz archives of the plain codec (1: pickles, no longer read)
VERSION = 2
MANIFEST = "manifest.json"
SUFFIX = ".npz"
#: a checkpoint's tag: the iteration it resumes at and a random part
TAG = re.compile(r"[0-9]{6,12}-[0-9a-f]{8}")
#: a run token a coordinator may name for a deployed party's checkpoint subdirectory
_TOKEN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
_ZIP_MAGIC = b"PK\x03\x04"


def checked_tag(tag: Any) -> str:
    """``tag`` when it is a checkpoint tag (``NNNNNN-xxxxxxxx``), else CheckpointError."""
    if not isinstance(tag, str) or not TAG.fullmatch(tag):
        raise CheckpointError(f"refusing checkpoint tag {tag!r:.80}: not of the form NNNNNN-hex8")
    return tag


def checked_token(token: Any) -> str:
    """``token`` when it is a plain name (letters, digits, ``_ . -``; not ``.``/``..``; no
    directory part), else CheckpointError: what a coordinator may name for a deployed
    party's checkpoint subdirectory.

    >>> checked_token("run-1")
    'run-1'
    """
    if not isinstance(token, str) or not _TOKEN.fullmatch(token) or token.strip(".") == "":
        raise CheckpointError(
            f"refusing checkpoint directory {token!r:.80} from the coordinator: a deployed "
            "party takes only a plain run name (its checkpoints stay in its own directory)"
        )
    return token


def checkpoint_directory(directory: Any) -> str:
    """A checkpoint directory as an absolute path of the caller's working directory:
    resolved once, here, before it goes to any backend (a pooled worker or a Ray actor runs
    in its own working directory, where a relative path would name another directory).

    >>> import os
    >>> checkpoint_directory("run1") == os.path.join(os.getcwd(), "run1")
    True
    """
    return os.path.abspath(os.fspath(directory))


def run_token(directory: str) -> str:
    """The run token a coordinator sends deployed parties for its checkpoint ``directory``
    (the directory's base name as a plain name).

    >>> run_token("/tmp/runs/ck")
    'ck-c8c2ca9f'
    """
    base = os.path.basename(os.path.normpath(os.path.abspath(os.fspath(directory))))
    return safe_filename(base or "checkpoint")


def state_file_name(kind: str, tag: str, party: str | None = None) -> str:
    """The file name a state is written to: ``server-<tag>.npz`` or
    ``party-<safe name>-<tag>.npz``."""
    checked_tag(tag)
    if kind == "server":
        return f"server-{tag}{SUFFIX}"
    return f"party-{safe_filename(str(party))}-{tag}{SUFFIX}"


def resolve_state_file(directory: str, fname: Any, kind: str, party: str | None = None) -> str:
    """The path of the state file ``fname`` inside ``directory``, after checking that
    ``fname`` is a bare name of the form :func:`state_file_name` gives for ``kind`` (and
    ``party``); anything else raises CheckpointError naming the file, before any file
    is opened."""
    prefix = "server-" if kind == "server" else f"party-{safe_filename(str(party))}-"
    ok = (
        isinstance(fname, str)
        and fname.startswith(prefix)
        and fname.endswith(SUFFIX)
        and TAG.fullmatch(fname[len(prefix) : -len(SUFFIX)]) is not None
    )
    if not ok:
        who = "the server" if kind == "server" else f"party '{party}'"
        shown = repr(fname) if len(repr(fname)) <= 512 else f"{repr(fname)[:512]}... (truncated)"
        raise CheckpointError(
            f"refusing checkpoint file {shown}: not a state file of {who} (a bare "
            f"name {prefix}<tag>{SUFFIX} inside the checkpoint directory)"
        )
    directory = os.fspath(directory)
    path = os.path.join(directory, fname)
    real_dir = os.path.realpath(directory)
    if os.path.dirname(os.path.realpath(path)) != real_dir:  # a symbolic link out
        raise CheckpointError(f"refusing checkpoint file {fname!r}: it leads out of {directory!r}")
    return path


def write_state_file(path: str, record: Any) -> str:
    """Write ``record`` (plain values and arrays) as a state archive; returns its sha256.

    Raises CheckpointError naming the field when a value is not plain (see
    :mod:`fedmodel.runtime.plaincodec`).
    """
    try:
        text, arrays = plaincodec.encode(record)
    except plaincodec.PlainCodecError as exc:
        raise CheckpointError(
            f"a state in {os.path.basename(path)!r} cannot be written: {exc}"
        ) from None
    entries = {"text": np.frombuffer(text.encode("utf-8"), dtype=np.uint8)}
    entries.update({f"a{i}": a for i, a in enumerate(arrays)})
    buf = io.BytesIO()
    np.savez(buf, **entries)
    return write_atomic(path, buf.getvalue())


def read_state_file(
    directory: str, fname: Any, sha: Any, kind: str, party: str | None = None
) -> Any:
    """Read the state archive ``fname`` of ``directory`` (checked with
    :func:`resolve_state_file`, its checksum ``sha`` and its form); returns the record."""
    path = resolve_state_file(directory, fname, kind, party)
    if not os.path.isfile(path):
        raise CheckpointError(f"file {fname} is missing")
    with open(path, "rb") as fh:
        blob = fh.read()
    if hashlib.sha256(blob).hexdigest() != sha:
        raise CheckpointError(f"file {fname} is corrupted (checksum mismatch)")
    if not blob.startswith(_ZIP_MAGIC):
        raise CheckpointError(f"file {fname} is not a fedmodel state archive (.npz)")
    try:
        with np.load(io.BytesIO(blob), allow_pickle=False) as z:
            names = set(z.files)
            n = len(names) - 1
            if names != {"text", *(f"a{i}" for i in range(n))}:
                raise CheckpointError(f"file {fname} has unexpected entries")
            text = z["text"]
            if text.dtype != np.uint8 or text.ndim != 1:
                raise CheckpointError(f"file {fname} has no state text")
            arrays = [z[f"a{i}"] for i in range(n)]
        return plaincodec.decode(text.tobytes().decode("utf-8"), arrays)
    except CheckpointError:
        raise
    except Exception as exc:  # a corrupted archive, an object array, a malformed text
        raise CheckpointError(f"file {fname} cannot be read ({exc})") from exc


# -- fingerprints (computed by fedmodel.compiler.fingerprint where each party runs) -----------
def fingerprint_mismatch(theirs: Any, mine: Any, party: str) -> str | None:
    """Why a party's fingerprint differs from the one its checkpoint was written with (None
    when equal)."""
    if theirs == mine:
        return None
    if isinstance(theirs, dict) and isinstance(mine, dict):
        if theirs.get("terms") != mine.get("terms"):
            return (
                f"the model's terms of party '{party}' changed since the checkpoint was "
                "written (an expression, a constant, a bound or a coefficient differs): "
                "the checkpoint was written for different terms or data of this party"
            )
        if theirs.get("data") != mine.get("data"):
            return (
                f"the data of party '{party}' changed since the checkpoint was written: the "
                "checkpoint was written for different terms or data of this party"
            )
    return f"the checkpoint was written for different terms or data of party '{party}'"


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
    """Write a checkpoint from the parties' marked states and ``server_state`` (a relative
    ``directory`` is the caller's: :func:`checkpoint_directory`)."""
    directory = checkpoint_directory(directory)
    os.makedirs(directory, exist_ok=True)
    tag = f"{iteration:06d}-{uuid.uuid4().hex[:8]}"
    parties = runtime.write_party_checkpoint(directory, tag, marked=True)
    server_file = state_file_name("server", tag)
    record = {"format": "fedmodel-server-state", "state": server_state}
    server_sha = write_state_file(os.path.join(directory, server_file), record)
    manifest = {
        "format": FORMAT,
        "version": VERSION,
        "method": method,
        "model": model,
        "options": plaincodec.plain(options),
        "iteration": int(iteration),
        "reason": reason,
        "written": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "server": [server_file, server_sha],
        "parties": {n: list(v) for n, v in parties.items()},
    }
    write_atomic(os.path.join(directory, MANIFEST), json.dumps(manifest, indent=1).encode("utf-8"))
    remove_stale_temporaries(directory)
    keep = {server_file, MANIFEST} | {f for f, _ in parties.values()}
    for f in os.listdir(directory):
        # (.pkl: the files of a version-1 checkpoint that was in this directory)
        if (f.startswith("server-") or f.startswith("party-")) and f.endswith((SUFFIX, ".pkl")):
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
    if manifest.get("version") == 1:
        raise CheckpointError(
            f"checkpoint {directory!r} was written by an older fedmodel (format version 1, "
            f"pickled states), which this fedmodel does not read (version {VERSION}: no "
            "pickle); run again from the start, or finish the run with the fedmodel that "
            "wrote it"
        )
    if manifest.get("version") != VERSION:
        raise CheckpointError(
            f"checkpoint {directory!r} has format version {manifest.get('version')!r}; this "
            f"fedmodel reads version {VERSION}"
        )
    for key in ("method", "model", "options", "iteration", "server", "parties"):
        if key not in manifest:
            raise CheckpointError(f"checkpoint {directory!r} is corrupted: no '{key}' entry")
    if not isinstance(manifest["parties"], dict) or not all(
        isinstance(v, list) and len(v) == 2 for v in manifest["parties"].values()
    ):
        raise CheckpointError(f"checkpoint {directory!r} is corrupted: malformed 'parties'")
    if not (isinstance(manifest["server"], list) and len(manifest["server"]) == 2):
        raise CheckpointError(f"checkpoint {directory!r} is corrupted: malformed 'server'")
    for key in ("model", "options"):
        if not isinstance(manifest[key], dict):
            raise CheckpointError(f"checkpoint {directory!r} is corrupted: malformed '{key}'")
    return manifest


def check_manifest(manifest: dict, *, method: str, model: dict, options: dict, where: str):
    """Raise CheckpointError when the checkpoint was written for another run."""
    if manifest["method"] != method:
        raise CheckpointError(
            f"checkpoint {where!r} was written by method '{manifest['method']}', not '{method}'"
        )
    theirs = manifest["model"]
    if not isinstance(theirs, dict):
        raise CheckpointError(f"checkpoint {where!r} is corrupted: malformed 'model'")
    for key, label in (
        ("clients", "clients"),
        ("n_variables", "number of variables"),
    ):
        if theirs.get(key) != model.get(key):
            raise CheckpointError(
                f"checkpoint {where!r} was written for a different model ({label} differ: "
                f"{_short(theirs.get(key))} vs {_short(model.get(key))})"
            )
    why = fingerprint_mismatch(theirs.get("server"), model.get("server"), "server")
    if why is not None:
        raise CheckpointError(
            f"checkpoint {where!r} was written for a different model (server terms or data "
            f"differ): {why}"
        )
    if theirs.get("h") != model.get("h"):
        raise CheckpointError(
            f"checkpoint {where!r} was written for a different model: the regularizer h "
            "changed since it was written (a coefficient or a bound of h differs)"
        )
    for key in sorted(set(theirs) | set(model)):  # e.g. a vertical problem's fingerprint
        if key not in ("clients", "n_variables", "server", "h") and theirs.get(key) != model.get(
            key
        ):
            raise CheckpointError(
                f"checkpoint {where!r} was written for a different model ({key} differ: "
                f"{_short(theirs.get(key))} vs {_short(model.get(key))})"
            )
    mine = plaincodec.plain(options)
    missing = sorted(set(mine) - set(manifest["options"]))
    if missing:
        raise CheckpointError(
            f"checkpoint {where!r} was written by an earlier fedmodel version (its options "
            f"lack {missing}); start the run again without resume="
        )
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
    """The server's state of the checkpoint in ``directory`` (checked: file name, checksum,
    form)."""
    fname, sha = manifest["server"]
    try:
        record = read_state_file(directory, fname, sha, "server")
    except CheckpointError as exc:
        msg = str(exc)
        if msg.startswith(f"file {fname} is corrupted"):
            msg = f"is corrupted: {fname} does not match its checksum"
        elif msg.startswith(f"file {fname} is missing"):
            msg = f"is incomplete: {fname} is missing"
        else:
            msg = f"cannot be used: {msg}"
        raise CheckpointError(f"checkpoint {os.fspath(directory)!r} {msg}") from None
    if not isinstance(record, dict) or record.get("format") != "fedmodel-server-state":
        raise CheckpointError(f"checkpoint {directory!r}: {fname} is not a server state")
    return record["state"]


def _short(v: Any) -> str:
    s = repr(v)
    return s if len(s) <= 60 else s[:57] + "..."
