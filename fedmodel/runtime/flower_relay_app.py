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
"""

from __future__ import annotations

import json
from multiprocessing.connection import Client

from flwr.app import Array, ArrayRecord, ConfigRecord, Message, RecordDict
from flwr.clientapp import ClientApp

CALL_RECORD = "fedmodel"
ARRAY_RECORD = "fedmodel.arrays"
ROUTE_RECORD = "fedmodel.route"
STATUS_RECORD = "fedmodel.status"

app = ClientApp()


def _records(text: str, arrays, status: str) -> RecordDict:
    return RecordDict(
        {
            CALL_RECORD: ConfigRecord({"json": text}),
            ARRAY_RECORD: ArrayRecord({str(i): Array(a) for i, a in enumerate(arrays)}),
            STATUS_RECORD: ConfigRecord({"status": status}),
        }
    )


def forward(socket_path: str, text: str, arrays: list) -> tuple:
    """One call to the party server at ``socket_path`` (HMAC key in ``socket_path.key``)."""
    with open(socket_path + ".key", "rb") as fh:
        key = fh.read()
    with Client(socket_path, family="AF_UNIX", authkey=key) as conn:
        conn.send(("call", text, arrays))
        return conn.recv()


@app.query("fedmodel")
def relay(msg: Message, context) -> Message:
    node_config = dict(context.node_config)
    socket_path = node_config.get("fedmodel-socket")
    route = msg.content.config_records.get(ROUTE_RECORD)
    if socket_path is None and route is not None:  # simulation only (see the docstring)
        socket_path = route["socket"]
    text = msg.content.config_records[CALL_RECORD]["json"]
    ar = msg.content.array_records[ARRAY_RECORD]
    arrays = [ar[str(i)].numpy() for i in range(len(ar))]
    if socket_path is None:  # no party server here: only "which node is this"
        method = json.loads(text)
        if not (isinstance(method, dict) and method.get("__t", [None])[0] == "hello"):
            raise RuntimeError(
                "this SuperNode has no fedmodel party server (start it with fedmodel join)"
            )
        answer = json.dumps({"node_config": node_config}, allow_nan=False)
        return Message(content=_records(answer, [], "ok"), reply_to=msg)
    status, out_text, out_arrays = forward(str(socket_path), text, arrays)
    return Message(content=_records(out_text, out_arrays, status), reply_to=msg)
