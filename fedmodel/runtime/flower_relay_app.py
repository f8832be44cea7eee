"""The Flower ClientApp of a fedmodel party: a relay to the party's own process.

Each Flower message of type ``query.fedmodel`` carries one runtime call (codec form, see
:mod:`fedmodel.runtime.flower_codec`: a JSON text and numpy arrays); the relay forwards it
unchanged to the party server of its SuperNode (:mod:`fedmodel.runtime.flower_party`),
which decodes and answers it, and returns the answer as the reply.

This module is self-contained on purpose (it imports only Flower, numpy and the standard
library, not fedmodel, cvxpy or any data): Flower's deployment engine starts a fresh
ClientApp process per message, and ``fedmodel serve`` ships this file as the ClientApp
of its Flower app, so that process starts quickly.

Where the party server listens:

* deployment: the SuperNode's node config, ``fedmodel-socket`` (set by ``fedmodel join``:
  ``flower-supernode --node-config "fedmodel-socket='/path/party.sock'"``). A route in the
  message is then ignored: the coordinator cannot point the relay elsewhere;
* simulation: the Flower runtime that started the party servers names the socket in each
  message (all on one machine, in one program).

``hello`` to a node without a party server answers its node config (the simulation's
partition id), so that the coordinator can map nodes to parties.

Between the relay and the party server, a call and its answer travel as one byte frame
(:func:`pack` / :func:`unpack`, also used by the party server): a JSON header (status,
the codec's JSON text, the arrays' sizes) and each array in numpy's ``.npy`` format,
written and read with ``allow_pickle=False``. Nothing on this socket is pickled, so a
party server never unpickles what came from the coordinator; the party server decodes
the call (:mod:`fedmodel.runtime.flower_codec`) and refuses anything it does not know.
"""

from __future__ import annotations

import io
import json
import struct
from multiprocessing.connection import Client

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, RecordDict
from flwr.clientapp import ClientApp

CALL_RECORD = "fedmodel"
ARRAY_RECORD = "fedmodel.arrays"
ROUTE_RECORD = "fedmodel.route"
STATUS_RECORD = "fedmodel.status"
# a call or answer whose frame (:func:`pack`) is at most FRAME_MAX bytes travels as that
# frame, one bytes entry of one ConfigRecord: three Flower objects per message (the
# message, its RecordDict, the record), each one HTTP request to the SuperLink each way;
# a larger one as the JSON text in a ConfigRecord and its arrays in an ArrayRecord
# (Flower chunks large arrays)
FRAME_RECORD = "fedmodel.frame"
FRAME_MAX = 4 * 2**20
# the first byte of a frame on the party socket: a codec call or answer (this module's
# pack / unpack); the party server's other frames (simulation only) start with others
FRAME = b"C"
# what a party accepts (its relay here, its party server on the socket: docs/security.md):
# the largest call frame, in bytes (a longer one is refused unread); a call's JSON text
# (its structure: the numbers travel as .npy arrays beside it), in characters; the most
# arrays one call carries
MAX_FRAME = 64 * 2**20
MAX_JSON_CHARS = 2**20
MAX_ARRAYS = 1024

app = ClientApp()


def _records(text: str, arrays, status: str) -> RecordDict:
    return RecordDict(
        {
            CALL_RECORD: ConfigRecord({"json": text}),
            ARRAY_RECORD: ArrayRecord({str(i): Array(a) for i, a in enumerate(arrays)}),
            STATUS_RECORD: ConfigRecord({"status": status}),
        }
    )


def content_of(status: str, text: str, arrays) -> RecordDict:
    """A call (``status`` ``"call"``) or an answer (``"ok"``, ``"error"``) as the content of
    a Flower message: its frame in a :data:`FRAME_RECORD` when small enough, else the
    records of :func:`_records`."""
    frame = pack(status, text, arrays)
    if len(frame) <= FRAME_MAX:
        return RecordDict({FRAME_RECORD: ConfigRecord({"frame": frame})})
    return _records(text, arrays, status)


def parts_of(content: RecordDict, default_status: str = "ok") -> tuple:
    """``(status, text, arrays)`` of a message's content (either form of
    :func:`content_of`); ``KeyError`` / ``ValueError`` if it is neither."""
    if FRAME_RECORD in content.config_records:
        frame = content.config_records[FRAME_RECORD]["frame"]
        if not isinstance(frame, bytes):
            raise ValueError("a fedmodel frame record holds no bytes")
        return unpack(frame)
    text = content.config_records[CALL_RECORD]["json"]
    ar = content.array_records[ARRAY_RECORD]
    arrays = [ar[str(i)].numpy() for i in range(len(ar))]
    status = content.config_records.get(STATUS_RECORD, {}).get("status", default_status)
    return status, text, arrays


def pack(status: str, text: str, arrays) -> bytes:
    """One frame on the party socket: ``status`` (``"call"``, ``"ok"``, ``"error"``), the
    codec's JSON ``text`` and its ``arrays`` (``.npy``, no pickle)."""
    parts = []
    for a in arrays:
        buf = io.BytesIO()
        np.save(buf, np.asarray(a), allow_pickle=False)
        parts.append(buf.getvalue())
    head = json.dumps({"status": status, "json": text, "sizes": [len(p) for p in parts]})
    head_bytes = head.encode("utf-8")
    return FRAME + struct.pack("!Q", len(head_bytes)) + head_bytes + b"".join(parts)


def unpack(frame: bytes, max_json: int | None = None, max_arrays: int | None = None) -> tuple:
    """``(status, text, arrays)`` of a :func:`pack` frame; ``ValueError`` if it is not one
    (arrays read with ``allow_pickle=False``: an object array is refused). With
    ``max_json`` / ``max_arrays`` (a party reading a call) a longer JSON text (judged from
    the header's length, before it is read) or more arrays are refused."""
    view = memoryview(frame)
    if bytes(view[:1]) != FRAME or len(view) < 9:
        raise ValueError("not a fedmodel frame")
    (n,) = struct.unpack("!Q", view[1:9])
    if n > len(view) - 9:
        raise ValueError("a truncated fedmodel frame")
    # (the header holds the JSON text as a JSON string: escapes at most 6 characters each)
    if max_json is not None and n > 6 * max_json + 4096:
        raise ValueError(f"a call whose header has {n} bytes (its JSON text: at most {max_json})")
    head = json.loads(bytes(view[9 : 9 + n]).decode("utf-8"))
    if not (
        isinstance(head, dict)
        and isinstance(head.get("status"), str)
        and isinstance(head.get("json"), str)
        and isinstance(head.get("sizes"), list)
        and all(type(k) is int and k >= 0 for k in head["sizes"])
    ):
        raise ValueError("a malformed fedmodel frame header")
    if max_json is not None and len(head["json"]) > max_json:
        raise ValueError(
            f"a call whose JSON text has {len(head['json'])} characters (at most {max_json})"
        )
    if max_arrays is not None and len(head["sizes"]) > max_arrays:
        raise ValueError(f"a call of {len(head['sizes'])} arrays (at most {max_arrays})")
    pos, arrays = 9 + n, []
    for k in head["sizes"]:
        if pos + k > len(view):
            raise ValueError("a truncated fedmodel frame")
        a = np.load(io.BytesIO(view[pos : pos + k]), allow_pickle=False)
        if not isinstance(a, np.ndarray):
            raise ValueError("an array of a fedmodel frame is not a .npy array")
        arrays.append(a)
        pos += k
    if pos != len(view):
        raise ValueError("trailing bytes after a fedmodel frame")
    return head["status"], head["json"], arrays


def forward(socket_path: str, text: str, arrays: list) -> tuple:
    """One call to the party server at ``socket_path`` (HMAC key in ``socket_path.key``);
    returns ``(status, text, arrays)`` of its answer."""
    return unpack(forward_frame(socket_path, pack("call", text, arrays)))


def refusal(text: str) -> bytes:
    """An error answer (the codec's form of a ``CodecError``) for a call the relay refuses
    itself."""
    return pack("error", json.dumps({"__exc": ["CodecError", [text]]}), [])


def forward_frame(socket_path: str, frame: bytes) -> bytes:
    """One call frame to the party server at ``socket_path``, unread (the party server
    checks it); returns its answer's frame. A frame longer than :data:`MAX_FRAME` is
    refused here, never forwarded."""
    if len(frame) > MAX_FRAME:
        return refusal(f"a call frame of {len(frame)} bytes refused unread (at most {MAX_FRAME})")
    with open(socket_path + ".key", "rb") as fh:
        key = fh.read()
    with Client(socket_path, family="AF_UNIX", authkey=key) as conn:
        try:
            conn.send_bytes(frame)
        except OSError:  # the party server refused it before reading it all: its answer
            pass
        return conn.recv_bytes()


def _content_size(content: RecordDict) -> int:
    """The bytes a message's content holds (its arrays' buffers and its config values),
    counted without reading them."""
    size = 0
    for record in content.config_records.values():
        size += sum(len(v) if isinstance(v, (bytes, str)) else 8 for v in record.values())
    for record in content.array_records.values():
        size += sum(len(a.data) for a in record.values())
    return size


@app.query("fedmodel")
def relay(msg: Message, context) -> Message:
    node_config = dict(context.node_config)
    socket_path = node_config.get("fedmodel-socket")
    route = msg.content.config_records.get(ROUTE_RECORD)
    if socket_path is None and route is not None:  # simulation only (see the docstring)
        socket_path = route["socket"]
    frame = msg.content.config_records.get(FRAME_RECORD)
    if socket_path is not None and frame is not None:  # the frame as it came, unread
        answer = forward_frame(str(socket_path), bytes(frame["frame"]))
        if len(answer) > FRAME_MAX:
            return Message(content=content_of(*unpack(answer)), reply_to=msg)
        return Message(
            content=RecordDict({FRAME_RECORD: ConfigRecord({"frame": answer})}), reply_to=msg
        )
    size = _content_size(msg.content)
    if socket_path is not None and size > MAX_FRAME:  # refused before its arrays are read
        answer = refusal(f"a call of {size} bytes refused unread (at most {MAX_FRAME})")
        return Message(
            content=RecordDict({FRAME_RECORD: ConfigRecord({"frame": answer})}), reply_to=msg
        )
    _status, text, arrays = parts_of(msg.content, "call")
    if socket_path is None:  # no party server here: only "which node is this"
        method = json.loads(text)
        if not (isinstance(method, dict) and method.get("__t", [None])[0] == "hello"):
            raise RuntimeError(
                "this SuperNode has no fedmodel party server (start it with fedmodel join)"
            )
        answer = json.dumps({"node_config": node_config}, allow_nan=False)
        return Message(content=content_of("ok", answer, []), reply_to=msg)
    status, out_text, out_arrays = forward(str(socket_path), text, arrays)
    return Message(content=content_of(status, out_text, out_arrays), reply_to=msg)
