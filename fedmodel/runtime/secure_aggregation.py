"""Sums over clients: the server learns the sum of each message field it declared sum-only
(:attr:`~fedmodel.runtime.schema.Field.sum_only`), in the clear or through secure
aggregation, with the clipping and Gaussian noise of differential privacy.

:func:`aggregate` is the one way a server half collects such a message. Without secure
aggregation it broadcasts the message, reads each reply and adds the sum-only fields up
(with ``clip``: each client's vector of sum-only fields clipped to that norm first, and
Gaussian noise of standard deviation ``noise`` added to the sum by the server). With
:class:`SecureAggregation` it runs Flower's SecAgg+ protocol (Bell et al. 2020; the
client stages of ``flwr.client.mod.secaggplus_mod``, the server's unmasking of
``SecAggPlusWorkflow``) around that message, in four exchanges:

1. ``secagg_setup``: each client makes two key pairs (``_setup``) and sends the public keys;
2. ``secagg_share``: each client gets every participant's public keys and sends, encrypted
   for each other participant (key agreement + Fernet), a Shamir share of its mask seed
   and of its first secret key (``_share_keys``);
3. ``secagg_masked``: each client gets the shares addressed to it, answers the wrapped
   message with its own handler, and returns the sum-only fields as one vector in fixed
   point (:func:`encode`), clipped and noised when asked, plus its own mask and the
   pairwise masks agreed with every other participant (flwr's ``pseudo_rand_gen``), mod
   ``2**62``; the unmasked scalars travel beside it in the clear;
4. ``secagg_unmask``: the surviving clients send their shares of each survivor's mask seed
   and of each dropped client's secret key (``_unmask``); the server reconstructs them
   (``combine_shares``), removes the masks and decodes the sum.

A client that fails in stage 3 (``secagg_masked``) has dropped out: the pairwise masks the
others added for it are removed with its secret key, reconstructed from at least
``threshold`` shares, and the sum is over the survivors (:attr:`Aggregate.participants`).
Fewer survivors than the threshold stop the run (:class:`ClientFailure`). A server that
needs the sum over every client (``whole``: prox-al's subproblem is the sum of every
client's term, and so is the certificate) posts stage 3 once more to a client that
failed, with the same shares (a late reply completes the sum); a client that fails again
stops the run before the unmask stage, so the server never learns a sum without it.

**Fixed point.** Each entry ``v`` with ``|v| <= range`` is sent as ``round(v 2^f) mod
2^62`` with ``f = 61 - ceil(log2(n range))`` fractional bits for ``n`` participants, so
the sum of ``n`` entries never wraps; its rounding error is at most ``n 2^-(f+1)`` per
entry of the sum (:meth:`SecureAggregation.resolution`). A client whose value exceeds the
range refuses to send it (:class:`SecureRangeError`, naming the party and the field).
Flower's own ``quantize`` maps to 32-bit integers with stochastic rounding, about
``range 2^-31`` per entry: too coarse for a certificate at ``eps = 1e-9``.

Examples
--------
>>> import numpy as np
>>> cfg = SecureAggregation(range=1.0)
>>> f = cfg.fraction_bits(3)
>>> q = [encode(np.array([0.25, -0.5]), f, 1.0, "a", "x") for _ in range(3)]
>>> decode(sum(q) & (MODULUS - 1), f)
array([ 0.75, -1.5 ])
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fedmodel.runtime.outcomes import ClientFailure
from fedmodel.runtime.schema import Field, MessageSpec, MessageTable
from fedmodel.runtime.wire import register_wire_type

#: the ring of the masked sums: entries are added mod 2**62 (int64 never overflows)
MODULUS_BITS = 62
MODULUS = 1 << MODULUS_BITS

_BYTES = Field(("*",), dtype="int", max_size=1 << 16)
_BYTE_MAP = Field(None, dtype="map")

#: the messages of secure aggregation (merged into every method's table)
SECAGG = MessageTable(
    "secure-aggregation",
    (
        MessageSpec(
            "secagg_setup",
            request={"nid": Field((), dtype="int"), "config": Field(None, dtype="map")},
            reply={"pk1": _BYTES, "pk2": _BYTES},
            reveals="two fresh public keys",
        ),
        MessageSpec(
            "secagg_share",
            request={"keys": _BYTE_MAP},
            reply={"ciphertexts": _BYTE_MAP},
            reveals="Shamir shares of its mask seed and key, encrypted for each other client",
        ),
        MessageSpec(
            "secagg_masked",
            request={
                "kind": Field((), dtype="str"),
                "payload": Field(None, dtype="map"),
                "ciphertexts": _BYTE_MAP,
                "clip": Field((), required=False),
                "noise": Field((), required=False),
            },
            reply={
                "masked": Field(("*",), dtype="int", finite=False),
                "sizes": Field((), dtype="map"),
                "clear": Field((), dtype="map"),
            },
            reveals="the wrapped message's sum-only fields, masked; its unmasked scalars",
        ),
        MessageSpec(
            "secagg_unmask",
            request={"active": Field(("*",), dtype="int"), "dead": Field(("*",), dtype="int")},
            reply={"shares": _BYTE_MAP},
            reveals="its shares of the survivors' mask seeds and the dropped clients' keys",
        ),
    ),
)


class SecureRangeError(ValueError):
    """A value to be masked is outside the secure aggregation's stated range."""


@register_wire_type("secure_aggregation")
@dataclass(frozen=True)
class SecureAggregation:
    """Secure aggregation of the sum-only messages (``secure_aggregation=`` of a solve;
    ``True`` means these defaults).

    Parameters
    ----------
    range : float
        Largest magnitude of an entry a client masks (a larger one is refused, naming the
        party and the field); the fixed point's resolution follows from it and the number
        of participants (:meth:`resolution`).
    threshold : float
        Fraction of the participants whose shares reconstruct a secret (SecAgg+'s
        reconstruction threshold, at least 2 clients): fewer survivors stop the run, and
        fewer colluding clients (with the server) learn nothing of one client's message.

    Examples
    --------
    >>> cfg = SecureAggregation()
    >>> cfg.threshold_count(10), f"{cfg.resolution(10):.1e}"
    (6, '3.6e-11')
    """

    range: float = 2.0**20
    threshold: float = 0.5

    def __post_init__(self):
        if not (math.isfinite(self.range) and self.range > 0):
            raise ValueError(f"secure aggregation: range must be positive, got {self.range!r}")
        if not 0 < self.threshold <= 1:
            raise ValueError(
                f"secure aggregation: threshold must be in (0, 1], got {self.threshold!r}"
            )

    def fraction_bits(self, n: int) -> int:
        """Fractional bits of the fixed point for ``n`` participants."""
        return MODULUS_BITS - 1 - math.ceil(math.log2(max(2, n) * self.range))

    def resolution(self, n: int) -> float:
        """Largest rounding error of one entry of a sum over ``n`` participants."""
        return n * 2.0 ** -(self.fraction_bits(n) + 1)

    def threshold_count(self, n: int) -> int:
        """Shares needed to reconstruct a secret among ``n`` participants."""
        return min(n, max(2, math.floor(self.threshold * n) + 1))


def as_secure_aggregation(value: Any) -> SecureAggregation | None:
    """The option ``secure_aggregation=`` as a :class:`SecureAggregation` (None: off)."""
    if value is None or value is False:
        return None
    if value is True:
        return SecureAggregation()
    if isinstance(value, SecureAggregation):
        return value
    raise ValueError(
        f"secure_aggregation must be True, False or a SecureAggregation, got {value!r}"
    )


# -- fixed point -----------------------------------------------------------------------------
def encode(vec: np.ndarray, bits: int, value_range: float, party: str, what: str) -> np.ndarray:
    """``vec`` in fixed point with ``bits`` fractional bits, mod :data:`MODULUS`."""
    vec = np.asarray(vec, dtype=float)
    top = float(np.abs(vec).max(initial=0.0))
    if not top <= value_range:
        raise SecureRangeError(
            f"party {party!r}: {what} has an entry of magnitude {top:.3g}, outside the secure "
            f"aggregation range {value_range:g} (raise SecureAggregation(range=...))"
        )
    return np.rint(np.ldexp(vec, bits)).astype(np.int64) & (MODULUS - 1)


def decode(q: np.ndarray, bits: int) -> np.ndarray:
    """The signed values of fixed-point entries mod :data:`MODULUS`."""
    q = np.asarray(q, dtype=np.int64) & (MODULUS - 1)
    q = np.where(q >= MODULUS // 2, q - MODULUS, q)
    return np.ldexp(q.astype(float), -bits)


def _u8(data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype=np.uint8).copy()


def _bytes(arr: Any) -> bytes:
    return np.asarray(arr, dtype=np.uint8).tobytes()


# -- what a client sends of a reply ----------------------------------------------------------
def split_reply(
    spec: MessageSpec, reply: Mapping[str, Any], summed_clear: bool = False
) -> tuple[np.ndarray, dict[str, int], dict[str, float]]:
    """A reply of ``spec``'s kind as the vector of its sum-only fields (declared order; an
    absent optional one is 0 for a scalar, else empty -- sizes travel in ``sizes``), their
    sizes, and its unmasked scalars (``summed_clear``, under dp: those of
    :attr:`~fedmodel.runtime.schema.Field.dp_summed` join the vector instead)."""
    parts, sizes, clear = [], {}, {}
    for name, f in spec.reply.items():
        if f.dp_summed if summed_clear else f.sum_only:
            absent = np.zeros(1 if f.shape == () else 0)
            value = np.ravel(np.asarray(reply.get(name, absent), dtype=float))
            parts.append(value)
            sizes[name] = int(value.size)
        elif f.unmasked and name in reply:
            clear[name] = reply[name] if f.dtype == "str" else float(reply[name])
    vec = np.concatenate(parts) if parts else np.zeros(0)
    return vec, sizes, clear


def clip_and_noise(
    vec: np.ndarray, clip: float | None, noise: float | None, rng: np.random.Generator
) -> np.ndarray:
    """``vec`` scaled to norm at most ``clip`` (None: as is), plus Gaussian noise of
    standard deviation ``noise`` per entry (None or 0: none)."""
    if clip is not None:
        norm = float(np.linalg.norm(vec))
        if norm > clip:
            vec = vec * (clip / norm)
    if noise:
        vec = vec + rng.normal(0.0, noise, vec.shape)
    return vec


def _fields(vec: np.ndarray, sizes: Mapping[str, int]) -> dict[str, np.ndarray]:
    out, at = {}, 0
    for name, size in sizes.items():
        out[name] = vec[at : at + size]
        at += size
    return out


# -- the client's side ------------------------------------------------------------------------
class SecAggClient:
    """One client's SecAgg+ state for the aggregation under way (fresh keys, seeds and
    shares every time: nothing of it is the algorithm's state)."""

    def __init__(self, name: str):
        self.name = name
        self.state: Any = None
        self.config: dict[str, Any] = {}

    def setup(self, nid: int, config: Mapping[str, Any]) -> dict:
        from flwr.client.mod.secure_aggregation.secaggplus_mod import SecAggPlusState, _setup

        self.state = SecAggPlusState()
        self.state.nid = int(nid)
        self.config = {k: np.asarray(v).item() for k, v in config.items()}
        cfg = {
            "sample_num": int(self.config["sample_num"]),
            "share_num": int(self.config["sample_num"]),
            "threshold": int(self.config["threshold"]),
            "clipping_range": float(self.config["range"]),
            "target_range": 1 << int(self.config["bits"]),
            "mod_range": MODULUS,
            "max_weight": 1.0,
        }
        keys = _setup(self.state, cfg)
        return {"pk1": _u8(keys["pk1"]), "pk2": _u8(keys["pk2"])}

    def share(self, keys: Mapping[str, Any]) -> dict:
        from flwr.client.mod.secure_aggregation.secaggplus_mod import _share_keys

        pairs = {int(k): [_bytes(v[0]), _bytes(v[1])] for k, v in _key_pairs(keys).items()}
        out = _share_keys(self.state, {str(k): pairs[k] for k in sorted(pairs)})
        return {
            "ciphertexts": {str(d): _u8(c) for d, c in zip(out["dsts"], out["ctxts"])},
        }

    def mask(
        self,
        ciphertexts: Mapping[str, Any],
        vec: np.ndarray,
        what: str,
    ) -> np.ndarray:
        """Store the shares addressed to this client (as ``_collect_masked_vectors``) and
        return ``vec`` in fixed point with its own and the pairwise masks."""
        from flwr.client.mod.secure_aggregation.secaggplus_mod import (
            bytes_to_private_key,
            bytes_to_public_key,
        )
        from flwr.common.secure_aggregation.crypto.symmetric_encryption import (
            decrypt,
            generate_shared_key,
        )
        from flwr.common.secure_aggregation.ndarrays_arithmetic import (
            parameters_addition,
            parameters_mod,
            parameters_subtraction,
        )
        from flwr.common.secure_aggregation.secaggplus_utils import (
            pseudo_rand_gen,
            share_keys_plaintext_separate,
        )

        state = self.state
        if len(ciphertexts) + 1 < state.threshold:
            raise ValueError(f"party {self.name!r}: fewer shares than the threshold")
        senders = []
        for src_text, ciphertext in ciphertexts.items():
            src = int(src_text)
            plain = decrypt(state.ss2_dict[src], _bytes(ciphertext))
            actual, dst, seed_share, sk1_share = share_keys_plaintext_separate(plain)
            if actual != src or dst != state.nid:
                raise ValueError(f"party {self.name!r}: a share from {actual} for {dst} misrouted")
            state.rd_seed_share_dict[src] = seed_share
            state.sk1_share_dict[src] = sk1_share
            senders.append(src)
        q = [encode(vec, int(self.config["bits"]), float(self.config["range"]), self.name, what)]
        shapes = [q[0].shape]
        q = parameters_addition(q, pseudo_rand_gen(state.rd_seed, MODULUS, shapes))
        for nid in senders:
            key = generate_shared_key(
                bytes_to_private_key(state.sk1), bytes_to_public_key(state.public_keys_dict[nid][0])
            )
            pairwise = pseudo_rand_gen(key, MODULUS, shapes)
            q = parameters_mod(
                (parameters_addition if state.nid > nid else parameters_subtraction)(q, pairwise),
                MODULUS,
            )
        return parameters_mod(q, MODULUS)[0]

    def unmask(self, active: Any, dead: Any) -> dict:
        from flwr.client.mod.secure_aggregation.secaggplus_mod import _unmask

        out = _unmask(
            self.state,
            {"active_nids": [int(a) for a in active], "dead_nids": [int(d) for d in dead]},
        )
        self.state = None
        return {"shares": {str(n): _u8(s) for n, s in zip(out["nids"], out["shares"])}}


def _key_pairs(keys: Mapping[str, Any]) -> dict[int, tuple[Any, Any]]:
    """``{"<nid>:1": pk1, "<nid>:2": pk2}`` as ``{nid: (pk1, pk2)}``."""
    out: dict[int, list] = {}
    for key, value in keys.items():
        nid, which = key.split(":")
        out.setdefault(int(nid), [None, None])[int(which) - 1] = value
    return {k: (v[0], v[1]) for k, v in out.items()}


# -- the server's side ------------------------------------------------------------------------
@dataclass
class Aggregate:
    """What the server learns of one aggregated message: the sum over ``participants`` of
    each sum-only field (``sums``), each participant's unmasked scalars (``clear``), who
    dropped out (``dropped``) and who answered only when asked again (``late``)."""

    sums: dict[str, np.ndarray]
    clear: dict[str, dict[str, float]] = field(default_factory=dict)
    participants: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    late: list[str] = field(default_factory=list)


def aggregate(
    runtime,
    kind: str,
    payload: dict[str, Any] | Callable[[str], dict[str, Any]],
    *,
    secure: SecureAggregation | None = None,
    clip: float | Callable[[str], float] | None = None,
    noise: float = 0.0,
    rng: np.random.Generator | None = None,
    channel: str | None = None,
    whole: bool = False,
) -> Aggregate:
    """The sums over the live clients of the sum-only fields of their replies to ``kind``.

    ``clip`` (per client, or one number) bounds the norm of each client's vector of
    sum-only fields; ``noise`` is the standard deviation of the Gaussian noise on each
    entry of the sum: added by the server in the clear, and by the clients in shares of
    standard deviation ``noise / sqrt(threshold)`` under secure aggregation (any
    ``threshold`` survivors' shares make at least ``noise``). With ``clip`` the unmasked
    scalars are summed (and noised) too, rather than sent in the clear. ``whole``: the sum
    must be over every live client (a client that drops out is asked once more; failing
    again it stops the run before anything is unmasked).
    """
    spec = runtime.messages[kind]
    rng = rng if rng is not None else np.random.default_rng()
    names = runtime.alive
    payloads = {n: payload(n) if callable(payload) else payload for n in names}
    clips = {n: clip(n) if callable(clip) else clip for n in names}
    if secure is None:
        replies = runtime.broadcast(kind, lambda n: payloads[n], channel=channel, to=names)
        total: np.ndarray | None = None
        sizes: dict[str, int] = {}
        clear = {}
        for name, rep in replies.items():
            vec, sizes_i, clear[name] = split_reply(spec, rep.payload, clips[name] is not None)
            vec = clip_and_noise(vec, clips[name], None, rng)
            sizes = _check_sizes(sizes, sizes_i, name, kind)
            total = vec if total is None else total + vec
        total = clip_and_noise(total, None, noise, rng)
        return Aggregate(_fields(total, sizes), clear, list(replies), [])
    return _secure_sum(runtime, kind, payloads, secure, clips, noise, names, whole)


def _check_sizes(known: dict, got: dict, name: str, kind: str) -> dict:
    if known and got != known:
        raise ClientFailure(
            {name: _invalid(name, kind, f"sum-only fields of sizes {got}, others {known}")},
            0,
            kind,
        )
    return got


def _invalid(name: str, kind: str, why: str):
    from fedmodel.runtime.outcomes import InvalidReply, StepOutcome

    return StepOutcome(
        name, error=InvalidReply(name, kind, None, f"client {name!r}, {kind!r}: {why}"),
        kind="invalid_reply",
    )  # fmt: skip


def _secure_sum(runtime, kind, payloads, secure, clips, noise, names, whole=False):
    from flwr.common.secure_aggregation.crypto.shamir import combine_shares
    from flwr.common.secure_aggregation.crypto.symmetric_encryption import generate_shared_key
    from flwr.common.secure_aggregation.ndarrays_arithmetic import (
        parameters_addition,
        parameters_mod,
        parameters_subtraction,
    )
    from flwr.common.secure_aggregation.secaggplus_utils import pseudo_rand_gen
    from flwr.server.workflow.secure_aggregation.secaggplus_workflow import (
        bytes_to_private_key,
        bytes_to_public_key,
    )

    n = len(names)
    threshold = secure.threshold_count(n)
    if n < 2:
        raise ValueError("secure aggregation needs at least two clients")
    nid = {name: i + 1 for i, name in enumerate(names)}
    config = {
        "sample_num": n,
        "threshold": threshold,
        "range": float(secure.range),
        "bits": secure.fraction_bits(n),
    }
    # stage 1: public keys
    replies = runtime.broadcast(
        "secagg_setup", lambda name: {"nid": nid[name], "config": config}, to=names
    )
    keys = {}
    for name, rep in replies.items():
        keys[f"{nid[name]}:1"] = np.asarray(rep.payload["pk1"], dtype=np.uint8)
        keys[f"{nid[name]}:2"] = np.asarray(rep.payload["pk2"], dtype=np.uint8)
    public = {k: (_bytes(v[0]), _bytes(v[1])) for k, v in _key_pairs(keys).items()}
    # stage 2: encrypted shares, forwarded by the server
    replies = runtime.broadcast("secagg_share", {"keys": keys}, to=names)
    inbox: dict[str, dict[str, np.ndarray]] = {name: {} for name in names}
    by_nid = {v: k for k, v in nid.items()}
    for name, rep in replies.items():
        for dst, ciphertext in rep.payload["ciphertexts"].items():
            inbox[by_nid[int(dst)]][str(nid[name])] = ciphertext
    # stage 3: the masked vectors (a client failing here has dropped out)
    share_noise = noise / math.sqrt(threshold) if noise else 0.0
    requests = {
        name: {
            "kind": kind,
            "payload": payloads[name],
            "ciphertexts": inbox[name],
            **({"clip": float(clips[name])} if clips[name] is not None else {}),
            **({"noise": float(share_noise)} if share_noise else {}),
        }
        for name in names
    }
    replies, dropped = _collect_masked(runtime, requests)
    late = [name for name in dropped if name in runtime.alive] if whole else []
    if late:  # (the same shares: a late reply completes the sum)
        more, dropped = _collect_masked(runtime, {name: requests[name] for name in late})
        replies.update(more)
        dropped += [name for name in names if name not in replies and name not in dropped]
    if whole and dropped:
        raise ClientFailure(
            {
                d: _invalid(
                    d,
                    kind,
                    "dropped out of secure aggregation twice; the sum must be over every "
                    "client, so nothing of the others' vectors is unmasked",
                )
                for d in dropped
            },
            runtime.round,
            kind,
        )
    masked, clear, sizes = {}, {}, {}
    for name in names:
        if name not in replies:
            continue
        rep = replies[name]
        got = {k: int(np.asarray(v)) for k, v in rep["sizes"].items()}
        sizes = _check_sizes(sizes, got, name, kind)
        masked[name] = np.asarray(rep["masked"], dtype=np.int64)
        clear[name] = {k: float(np.asarray(v)) for k, v in rep["clear"].items()}
    active = [name for name in names if name in masked]
    if len(active) < threshold:
        raise ClientFailure(
            {d: _invalid(d, kind, "dropped out of secure aggregation") for d in dropped},
            runtime.round,
            kind,
        )
    # stage 4: shares of the survivors' seeds and of the dropped clients' keys
    replies = runtime.broadcast(
        "secagg_unmask",
        {
            "active": np.array([nid[a] for a in active], dtype=np.int64),
            "dead": np.array([nid[d] for d in dropped], dtype=np.int64),
        },
        to=active,
    )
    collected: dict[int, list[bytes]] = {nid[name]: [] for name in names}
    for rep in replies.values():
        for owner, share in rep.payload["shares"].items():
            collected[int(owner)].append(_bytes(share))
    total = [sum(masked[a] for a in active) & (MODULUS - 1)]
    shapes = [total[0].shape]
    for owner, shares in collected.items():
        if len(shares) < threshold:
            raise ValueError(f"secure aggregation: too few shares for client {by_nid[owner]!r}")
        secret = combine_shares(shares)
        if by_nid[owner] in masked:  # a survivor's own mask
            total = parameters_subtraction(total, pseudo_rand_gen(secret, MODULUS, shapes))
        else:  # a dropped client's pairwise masks, from its reconstructed key
            for other in active:
                key = generate_shared_key(
                    bytes_to_private_key(secret), bytes_to_public_key(public[nid[other]][0])
                )
                pairwise = pseudo_rand_gen(key, MODULUS, shapes)
                op = parameters_addition if owner > nid[other] else parameters_subtraction
                total = op(total, pairwise)
        total = parameters_mod(total, MODULUS)
    vec = decode(total[0], int(config["bits"]))
    return Aggregate(_fields(vec, sizes), clear, active, dropped, late)


def _collect_masked(runtime, requests: dict[str, dict]) -> tuple[dict[str, dict], list[str]]:
    """Stage 3: post every client its masked request (they compute in parallel where the
    backend can) and take the replies; a client that fails has dropped out, unless its
    value was out of range or it refused the request (that stops the run)."""
    tickets, dropped = {}, []

    def drop(exc: ClientFailure) -> None:
        if any(_stops_the_run(o) for o in exc.failures.values()):
            raise exc
        dropped.extend(n for n in exc.clients if n not in dropped)

    for name, request in requests.items():
        try:
            tickets[name] = runtime.post(name, "secagg_masked", request)
        except ClientFailure as exc:  # (a synchronous backend exchanges it at once)
            drop(exc)
    replies: dict[str, dict] = {}
    waiting = dict(tickets)
    while waiting:
        try:
            got = runtime.poll(list(waiting.values()), min_count=len(waiting))
        except ClientFailure as exc:
            drop(exc)
            for name in exc.clients:
                waiting.pop(name, None)
            continue
        for name, ticket in list(waiting.items()):
            if ticket in got:
                replies[name] = got[ticket].payload
                del waiting[name]
    return replies, dropped


def _stops_the_run(outcome) -> bool:
    """A value out of range, or a client refusing the request: not a dropout."""
    return outcome.kind == "refused" or (
        outcome.error is not None and "outside the secure aggregation range" in str(outcome.error)
    )
