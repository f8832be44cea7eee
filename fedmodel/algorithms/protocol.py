"""The method protocol: what a federated method provides, and what the driver, every runtime,
the ledger, checkpoints and the certificate rely on.

A method is four small pieces (a new method is a family folder and a registry line):

1. an **options** dataclass, validated at the boundary (:func:`~fedmodel.algorithms.options.build_options`);
2. a **client half** per client (:class:`ClientHalf`): built *where the client runs* from an
   :class:`~fedmodel.runtime.endpoints.EndpointFactory` that holds only that client's own
   :class:`~fedmodel.compiler.partition.PartyProgram` and the options; it answers messages
   (``_on_<kind>(**payload) -> reply payload``) and keeps its algorithm state in the
   attributes named by ``state_fields``, so that :meth:`ClientHalf.get_state` /
   :meth:`ClientHalf.set_state` give checkpoints and retries all of it;
3. a **server half** (:class:`ServerHalf`): the server's own program, ``h`` and explicit
   state; it reaches clients only through the runtime (``runtime.broadcast``,
   ``runtime.send``) and is driven like optax's ``init``/``update`` pair::

       server.start(runtime)                        # init: the first exchange
       while not done:
           step = server.step(runtime, deadline)    # update: one iteration of the paper
           (history row, callback, time limit, checkpoint: the driver's business)

   Everything the next step needs is in its declared state (``state_fields``), so the driver can
   stop after any step (client failure, Ctrl-C, time limit) and return or checkpoint the
   last consistent iterate, and resume from it bit for bit;
4. a :class:`~fedmodel.algorithms.registry.MethodSpec` in its family's ``METHODS`` and a line in
   :data:`~fedmodel.algorithms.registry.FAMILIES`.

:func:`fedmodel.algorithms.driver.run_federated` runs any such method on any backend:
runtime start-up, resume, per-step history and callback, time limit, checkpoints, failure
policies and interrupts, the final certificate round (every client answers ``evaluate`` on
its own data) and the :class:`~fedmodel.result.Result`.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import inspect
import itertools
import operator
import time
import weakref
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any, ClassVar

import numpy as np

from fedmodel.algorithms.messages import program_dims
from fedmodel.certificate.kkt import party_evaluation
from fedmodel.compiler.partition import PartyProgram
from fedmodel.errors import ModelError
from fedmodel.runtime.endpoints import StateColumns, copy_state, party_states
from fedmodel.runtime.messages import SERVER, Message
from fedmodel.runtime.outcomes import RequestRefused
from fedmodel.runtime.rows import Rows, payload_at, rows_subset
from fedmodel.runtime.schema import MessageTable, opt_in_refusal
from fedmodel.runtime.secure_aggregation import (
    SECAGG,
    SecAggClient,
    clip_and_noise,
    split_reply,
)

#: what a half declares (its state fields and components: its class's, or its own)
_DECLARED = attrgetter("state_fields", "component_fields")


class DeclaredState:
    """Algorithm state declared once and saved, restored and copied by the protocol (as
    optax's ``ScaleByAdamState`` or jaxopt's ``ProxGradState`` are typed state values): the
    attributes named by ``state_fields`` hold plain values and numpy arrays (containers of
    them), and those named by ``component_fields`` hold objects with their own
    ``get_state``/``set_state`` (a secant model, a local solver's carried factor; ``None``
    when absent). :meth:`get_state` reads them (the caller copies: the host before each
    step, the driver at each mark), :meth:`set_state` puts copies back and then calls
    :meth:`state_restored`, where a half recomputes what derives from its state (sums,
    factorisations). A state missing a declared field is refused, naming it.

    Examples
    --------
    >>> class Counter(DeclaredState):
    ...     state_fields = ("x", "k")
    ...     def __init__(self):
    ...         self.x, self.k = np.zeros(2), 0
    >>> c = Counter()
    >>> c.k = 3
    >>> saved = c.get_state()
    >>> c.k = 9
    >>> c.set_state(saved)
    >>> c.k
    3
    """

    state_fields: ClassVar[tuple[str, ...]] = ()
    #: attributes holding objects with their own get_state/set_state, saved with the state
    component_fields: ClassVar[tuple[str, ...]] = ()

    def get_state(self) -> dict:
        """The declared state: every ``state_fields`` attribute and each component's own
        state, by name (not copied: the host and the driver copy it)."""
        state = {key: getattr(self, key) for key in self.state_fields}
        for key in self.component_fields:
            part = getattr(self, key)
            state[key] = part.get_state() if hasattr(part, "get_state") else None
        return state

    @classmethod
    def state_columns(cls, halves: list[DeclaredState]) -> StateColumns | None:
        """The :meth:`get_state` of each of ``halves`` (all of this class), uncopied, read
        as columns (a mark reads thousands of parties' states at once); None when the class
        defines its own :meth:`get_state` (each is then read by it)."""
        if cls.get_state is not DeclaredState.get_state:
            return None
        return cls._declared_columns(halves)

    @classmethod
    def _declared_columns(cls, halves: list[DeclaredState]) -> StateColumns | None:
        """The declared fields and the components' states of ``halves`` as columns; None
        when they declare different fields (a half may extend its class's). A field whose
        class attribute has a ``column(halves)`` (a value kept as a row of a stacked array,
        :func:`~fedmodel.algorithms.proxal.cohorts.stack_row`) is read by it."""
        try:
            declared = set(map(_DECLARED, halves))
        except TypeError:  # (fields declared in a list: read half by half)
            return None
        if len(declared) != 1:
            return None
        fields, components = declared.pop()
        cols = StateColumns((f, []) for f in fields)
        # (a field whose class attribute reads many halves at once: by it)
        kind = type(halves[0]) if halves else cls
        found = {f: getattr(getattr(kind, f, None), "column", None) for f in fields}
        plain = [f for f in fields if found[f] is None]
        if plain and halves:
            rows = list(map(attrgetter(*plain), halves))
            if len(plain) == 1:
                cols[plain[0]] = rows
            else:
                cols.update(zip(plain, map(list, zip(*rows))))
        for f in fields:
            if found[f] is not None and halves:
                cols[f] = found[f](halves)
        for key in components:
            cols[key] = party_states(list(map(attrgetter(key), halves)))
        return cols

    def set_state(self, state: dict) -> None:
        """Put the half back to a :meth:`get_state` result (a copy of it)."""
        missing = [k for k in (*self.state_fields, *self.component_fields) if k not in state]
        if missing:
            raise ValueError(
                f"{type(self).__name__}: the state to restore lacks the declared field(s) {missing}"
            )
        for key in self.state_fields:
            value = state[key]
            # (an array as a writable copy: one read from a checkpoint may be read-only)
            if isinstance(value, np.ndarray):
                setattr(self, key, np.array(value, dtype=value.dtype))
            else:
                setattr(self, key, copy_state(value))
        for key in self.component_fields:
            part = getattr(self, key)
            if state[key] is not None and hasattr(part, "set_state"):
                part.set_state(copy_state(state[key]))
        self.state_restored()

    def state_restored(self) -> None:
        """Recompute what derives from the declared state after :meth:`set_state`;
        default nothing."""


class ClientHalf(DeclaredState):
    """Base of every method's client half: message dispatch and explicit state.

    Subclasses set ``state_fields`` (the attributes that make up the algorithm state; the
    program and compiled subproblems are rebuilt from the program, never saved),
    ``component_fields`` (local solvers whose own ``get_state`` matters to the iterates) and
    implement one ``_on_<kind>(**payload) -> dict`` per message kind of their message table.
    Every client half answers the certificate's messages ``evaluate`` (the party's share of
    the KKT residuals at ``w``, on its own data, with its own multipliers) and ``report``
    (multipliers and statistics); :meth:`multipliers` says which multipliers those are.

    Messages on the ``"local"`` channel, and peer-to-peer messages (sender not the server),
    return the handler's value itself rather than a reply message.

    Examples
    --------
    >>> class Echo(ClientHalf):
    ...     state_fields = ("count",)
    ...     def __init__(self, program):
    ...         super().__init__(program)
    ...         self.count = 0
    ...     def _on_ping(self, x):
    ...         self.count += 1
    ...         return {"x": x}
    """

    #: the declared kinds this half answers (its family's ``messages.py``); every
    #: ``_on_<kind>`` must be declared there (tests/test_reply_validation.py)
    messages: MessageTable | None = None
    #: the party's own opt-ins (``MessageSpec.party_opt_in``, ``Field.party_opt_in``): set
    #: where the half is built, from the party's setting (``fedmodel join --reveal``; in
    #: one process the solve's ``reveal`` option); None: whatever the method's options ask
    #: for (one organisation holds every party)
    reveal: frozenset[str] | None = None
    #: the kinds whose ``step_batch_key`` (of this class, as a handler's owner) changes only
    #: at an event that calls :func:`plans_changed`: a stacked round of such a kind groups
    #: its halves once (:class:`RowsPlan`); other kinds' keys are read every round
    stable_batch_keys: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, program: PartyProgram):
        self.name = program.name
        self.program = program
        family = type(self).messages
        if family is not None:  # (what it answers: its family's kinds and secure aggregation's)
            self.messages = _answered(family)
        self.stats = {"local_solves": 0, "local_iterations": 0, "seconds": 0.0}

    # -- statistics ----------------------------------------------------------------------------
    @property
    def stats(self) -> dict[str, float]:
        """This party's statistics (``local_solves``, ``local_iterations``, ``seconds``, and
        what its method adds), the counts that stacked steps keep for it in a
        :class:`Tally` added in first."""
        found = self.__dict__
        tallies = found.get("_tallies")
        if tallies:
            for tally in tallies:
                tally.settle()
        return found["_stats"]

    @stats.setter
    def stats(self, value: dict[str, float]) -> None:
        found = self.__dict__
        tallies = found.get("_tallies")
        if tallies:  # (what a tally holds for it belongs to the statistics replaced)
            for tally, i in tallies.items():
                tally.forget(i)
        found["_stats"] = value

    # -- messages ----------------------------------------------------------------------------
    def handle(self, msg: Message) -> Any:
        """Dispatch ``msg`` to the handler of its kind, ``_on_<kind>(**payload)`` (with
        ``sender=`` when the handler takes it: peer messages), after checking the kind and
        the payload's field names against the declared table (``messages``): an unknown
        kind, a missing required field or an undeclared one is a ValueError naming the
        party, the kind and the field."""
        t0 = time.perf_counter()
        owner, (handler, takes_sender) = self.handler_owner(msg.kind)
        if handler is None:
            raise ValueError(f"party {self.name!r} got unknown message kind {msg.kind!r}")
        if self.messages is not None:
            self._check_request(msg)
        if takes_sender:
            out = handler(owner, sender=msg.sender, **msg.payload)
        else:
            out = handler(owner, **msg.payload)
        self.stats["seconds"] += time.perf_counter() - t0
        if msg.channel == "local" or msg.sender != SERVER:
            return out
        return Message(msg.kind + "_reply", self.name, SERVER, out, msg.round, msg.channel)

    def batch_key(self, msg: Message) -> Any:
        """What ``msg``'s step must share with other parties' to be handled with theirs in
        one batch (:meth:`handle_batch`); None (the default): this party's step runs on
        its own. The owner of ``msg.kind``'s handler decides, by defining
        ``_on_<kind>_batch`` and ``step_batch_key(kind)``."""
        if msg.channel == "local" or msg.sender != SERVER:
            return None
        owner, (handler, _) = self.handler_owner(msg.kind)
        if handler is None or not hasattr(type(owner), f"_on_{msg.kind}_batch"):
            return None
        key = owner.step_batch_key(msg.kind) if hasattr(owner, "step_batch_key") else None
        return None if key is None else (msg.kind, key)

    @staticmethod
    def handle_batch(halves: list[ClientHalf], msgs: list[Message]) -> list[Message]:
        """Handle ``msgs[i]`` at ``halves[i]`` in one batched step: every request checked
        as :meth:`handle` checks it, then one call of the owners' ``_on_<kind>_batch``
        (``owners, payloads -> replies``), which changes no party's state unless it
        returns. Any exception leaves every party as it was (the host then handles each
        message on its own)."""
        kind = msgs[0].kind
        owners = []
        for half, msg in zip(halves, msgs):
            if msg.kind != kind:
                raise ValueError("a batch holds messages of one kind")
            owner, (handler, _) = half.handler_owner(kind)
            if handler is None:
                raise ValueError(f"party {half.name!r} got unknown message kind {kind!r}")
            if half.messages is not None:
                half._check_request(msg)
            owners.append(owner)
        t0 = time.perf_counter()
        outs = getattr(type(owners[0]), f"_on_{kind}_batch")(owners, [m.payload for m in msgs])
        share = (time.perf_counter() - t0) / len(msgs)
        replies = []
        for half, msg, out in zip(halves, msgs, outs):
            half.stats["seconds"] += share
            replies.append(Message(kind + "_reply", half.name, SERVER, out, msg.round, msg.channel))
        return replies

    @staticmethod
    def handle_rows(
        halves: list[ClientHalf], kind: str, fields: Mapping[str, Any]
    ) -> dict[str, np.ndarray] | None:
        """Answer the request ``kind`` with ``fields`` (:class:`~fedmodel.runtime.rows.Rows`,
        row ``i`` for ``halves[i]``, or one value for all) at every half in one stacked
        step: the replies' fields with a row per half, or None when the halves cannot take
        it together (they or their owners of ``kind`` differ in class, the owners have no
        ``_on_<kind>_rows`` or no ``step_batch_key``; halves of different keys take one
        step per key).
        Each request is checked as :meth:`handle` checks it, once per message table and
        opt-ins when the values that can need an opt-in are one for all. Raises (changing
        no party's state) when a check refuses or the step fails; the host then sends the
        round message by message. What it reads of the halves is found once
        (:class:`RowsPlan`) and kept while they come back and nothing changes it."""
        plan = RowsPlan.of(halves, kind)
        if plan is None:
            return None
        cohorts = plan.cohorts if plan.cohorts is not None else _cohorts(plan.owners, kind)
        if cohorts is None:
            return None
        # (a row field whose value can need an opt-in: every request checked on its own)
        per_half = not plan.valued.isdisjoint([k for k, v in fields.items() if isinstance(v, Rows)])
        for i in range(len(halves)) if per_half else plan.firsts:
            half = halves[i]
            if half.messages is not None:
                half._check_request(Message(kind, SERVER, half.name, payload_at(fields, i)))
        step = plan.step
        t0 = time.perf_counter()
        if not cohorts:
            replies = step(plan.owners, fields)
        else:
            parts = [(idx, step(owners, rows_subset(fields, idx))) for idx, owners in cohorts]
            replies = {}
            for name, first in parts[0][1].items():
                out = np.empty((len(halves), *np.shape(first)[1:]), dtype=np.asarray(first).dtype)
                for idx, part in parts:
                    out[idx] = part[name]
                replies[name] = out
        share = (time.perf_counter() - t0) / len(halves)
        if plan.cohorts is not None:
            groups = plan.groups
        else:  # (the keys of this round's cohorts)
            groups = [[halves[i] for i in idx] for idx, _ in cohorts] or [plan.halves]
        for group in groups:
            Tally.of(group).add("seconds", share)
        return replies

    def handler_owner(self, kind: str) -> tuple[Any, tuple[Any, bool]]:
        """The object whose ``_on_<kind>`` answers ``kind`` (this half; a half made of
        parts may name one of them) and that handler with whether it takes the sender."""
        return self, _handler(type(self), kind)

    @classmethod
    def handler_owners(cls, halves: list[ClientHalf], kind: str) -> list[Any]:
        """The owner of ``kind``'s handler at each of ``halves`` (all of this class): the
        first item of each one's :meth:`handler_owner`, found in one pass where the class
        keeps the base's."""
        if cls.handler_owner is ClientHalf.handler_owner:
            return list(halves)
        return [half.handler_owner(kind)[0] for half in halves]

    def _check_request(self, msg: Message) -> None:
        """The payload's field names against the kind's declared request fields, then the
        party's opt-ins: a kind or a field value that needs an opt-in this party did not
        enable is refused (:class:`~fedmodel.runtime.outcomes.RequestRefused`) before its
        handler runs. A request of a signature that passed before against the same table
        and opt-ins (:meth:`~fedmodel.runtime.schema.MessageTable.passed_requests`) passes
        again without the check."""
        table = self.messages
        signature = table.request_signature(msg.kind, msg.payload)
        passed = table.passed_requests(self.reveal)
        if signature is not None and signature in passed:
            return
        self._check_payload(msg.kind, msg.payload)
        if signature is not None:
            passed.add(signature)

    def _check_payload(self, kind: str, payload: dict) -> None:
        why = self.messages.request_problem(kind, payload)
        if why:
            raise ValueError(f"party {self.name!r} got {why}")
        needed = self.messages.opt_ins_needed(kind, payload)
        why = opt_in_refusal(self.name, f"message {kind!r}", needed, self.reveal)
        if why:
            raise RequestRefused(why)

    @classmethod
    def check_build(
        cls, args: tuple, kwargs: dict, reveal: frozenset[str] | None, compiled: Any = None
    ) -> None:
        """Check the constructor's arguments where the party is built, before it is:
        each option dataclass by its own ``validate`` (with ``compiled``, the model as the
        party compiled it: a deployed party), the arguments the table declares
        (:attr:`~fedmodel.runtime.schema.MessageTable.build`) by value, and the opt-ins
        they need against ``reveal``. Raises ModelError or RequestRefused naming the party.
        """
        try:
            arguments = _bound(cls, args, kwargs)
        except TypeError as exc:
            raise ModelError(
                f"{cls.__name__} cannot be built from the arguments sent: {exc}"
            ) from None
        program = args[0] if args and type(args[0]) is PartyProgram else None
        if program is None:  # (the program elsewhere than first, or a subclass's)
            program = next((a for a in arguments.values() if isinstance(a, PartyProgram)), None)
        name = getattr(program, "name", "?")
        if compiled is not None:
            for value in arguments.values():
                if dataclasses.is_dataclass(value) and hasattr(value, "validate"):
                    try:
                        value.validate(compiled, type(value).__name__)
                    except (ModelError, ValueError, TypeError) as exc:
                        raise ModelError(
                            f"party {name!r} refuses the options sent: {exc}"
                        ) from None
        table = cls.messages
        if table is None or not table.build:
            return
        if program is None:
            raise ModelError(f"{cls.__name__} is built without the party's own program")
        # (arguments that read no dimensions: checked once per table, opt-ins and values)
        signature = table.build_signature(arguments)
        passed = table.passed_builds(reveal)
        if signature is not None and signature in passed:
            return
        dims = {**program_dims(program)}
        options = [v for v in arguments.values() if dataclasses.is_dataclass(v)]
        if options and table.option_dims is not None:
            dims.update(table.option_dims(options[0]))
        why = table.build_problem(arguments, dims)
        if why:
            raise ModelError(f"party {name!r} refuses its build: {why}")
        why = opt_in_refusal(name, "its build", table.build_opt_ins(arguments), reveal)
        if why:
            raise RequestRefused(why)
        if signature is not None:
            passed.add(signature)

    def message_dims(self, options: Any = None) -> dict[str, int]:
        """The dimensions of this party's messages: its program's
        (:func:`~fedmodel.algorithms.messages.program_dims`) and those the table derives
        from ``options``."""
        out = dict(program_dims(self.program))
        table = self.messages
        if options is not None and table is not None and table.option_dims is not None:
            out.update(table.option_dims(options))
        return out

    # -- secure aggregation (fedmodel.runtime.secure_aggregation) ---------------------------
    def _on_secagg_setup(self, nid, config):
        self.secagg = SecAggClient(self.name)
        return self.secagg.setup(nid, config)

    def _on_secagg_share(self, keys):
        return self.secagg.share(keys)

    def _on_secagg_masked(self, kind, payload, ciphertexts, clip=None, noise=None):
        """Answer the wrapped message ``kind`` with its own handler, and send its sum-only
        fields masked (with ``clip``: clipped to that norm, its unmasked scalars summed
        too, and Gaussian noise of standard deviation ``noise`` added). A reply that
        refuses (``accepted = False``, a route's probe) is raised with its reason: the run
        stops naming the party."""
        if self.messages is None or kind not in self.messages or kind in SECAGG:
            raise ValueError(f"party {self.name!r} got a masked message of unknown kind {kind!r}")
        self._check_payload(kind, payload)
        owner, (handler, takes_sender) = self.handler_owner(kind)
        if handler is None or takes_sender:
            raise ValueError(f"party {self.name!r} answers no server message {kind!r}")
        body = handler(owner, **payload)
        if body.get("accepted") is False:  # (a refused probe: its reason, not a vector)
            raise RequestRefused(f"party {self.name!r} refuses {kind!r}: {body.get('why', '')}")
        vec, sizes, clear = split_reply(self.messages[kind], body, summed_clear=clip is not None)
        vec = clip_and_noise(vec, clip, noise, np.random.default_rng())
        masked = self.secagg.mask(ciphertexts, vec, f"message {kind!r}")
        return {"masked": masked, "sizes": sizes, "clear": clear}

    def _on_secagg_unmask(self, active, dead):
        return self.secagg.unmask(active, dead)

    # -- state -------------------------------------------------------------------------------
    def get_state(self) -> dict:
        """The algorithm state (``state_fields``, ``component_fields``) and statistics; the
        host copies it."""
        return {**super().get_state(), "stats": dict(self.stats)}

    @classmethod
    def state_columns(cls, halves: list[DeclaredState]) -> StateColumns | None:
        """:meth:`DeclaredState.state_columns` with each half's statistics."""
        if cls.get_state is not ClientHalf.get_state:
            return None
        cols = cls._declared_columns(halves)
        if cols is not None:  # (every tally's counts added first: each one's statistics)
            Tally.settle_all()
            cols["stats"] = list(map(_STATS, halves))
        return cols

    def set_state(self, state: dict) -> None:
        self.stats = dict(state["stats"])
        super().set_state(state)
        plans_changed()  # (a state put back may hold another route, another grouping)

    # -- the certificate's messages ----------------------------------------------------------
    def multipliers(self) -> tuple[np.ndarray, np.ndarray]:
        """This party's multiplier estimates (``mu`` for ``c_i <= 0``, ``nu`` for ``a_i = 0``);
        zeros by default (methods without multipliers)."""
        return np.zeros(self.program.m_ineq), np.zeros(self.program.m_eq)

    def cone_duals(self) -> np.ndarray | None:
        """Multipliers of this party's cone constraints (terms with no smooth form, solved
        exactly by the cvxpy backend); None when the method keeps none."""
        return None

    def _on_evaluate(self, w, mu=None, nu=None, objective_scale=1.0):
        own_mu, own_nu = self.multipliers()
        mu = own_mu if mu is None else np.asarray(mu, dtype=float)
        nu = own_nu if nu is None else np.asarray(nu, dtype=float)
        w = np.asarray(w, dtype=float)
        return party_evaluation(
            self.program,
            w,
            mu,
            nu,
            cone=self.cone_duals(),
            objective_scale=float(objective_scale),
        )

    def _on_report(self):
        mu, nu = self.multipliers()
        out = {
            "mu": np.array(mu),
            "nu": np.array(nu),
            **{k: float(v) for k, v in self.stats.items()},
        }
        cone = self.cone_duals()
        if cone is not None:
            out["cone"] = np.array(cone)
        return out


_MESSAGES = attrgetter("messages")
_REVEAL = attrgetter("reveal")

#: bumped by every event after which a stacked round looks at its halves again
_GENERATION = [0]


def plans_changed() -> None:
    """Make every stacked round's :class:`RowsPlan` again at its next round: what decides
    how halves take a round together changed for some half (its route and message table,
    its state put back, its leaving the batches)."""
    _GENERATION[0] += 1


def plans_generation() -> int:
    """How many times :func:`plans_changed` has been called: what a stacked step keeps of
    its halves between rounds holds while this stays the same."""
    return _GENERATION[0]


class RowsPlan:
    """How a stacked round of one kind reaches one list of halves
    (:meth:`ClientHalf.handle_rows`), found once and kept while the same halves come back
    and no event changed it (:func:`plans_changed`): each half's owner of the kind, their
    stacked step (``step`` None: they cannot take the round together), their cohorts by
    ``step_batch_key`` (``cohorts``: ``[]`` for one cohort, else ``(rows, owners)`` per
    key, in the order each first appears; None when the keys are read every round: a
    kind not in the owners' :attr:`ClientHalf.stable_batch_keys`), the first half of each
    run of halves with one message table and opt-ins (``firsts``: its request's check
    stands for the run's), the fields whose values can need an opt-in (``valued``) and the
    halves of each cohort (``groups``: their statistics are counted in one :class:`Tally`
    per cohort, the one their step's own counts go to)."""

    __slots__ = ("halves", "generation", "step", "owners", "cohorts", "firsts", "valued")
    __slots__ += ("groups",)

    def __init__(self, halves: list[ClientHalf], kind: str):
        self.halves = list(halves)
        self.generation = _GENERATION[0]
        self.step: Callable[..., dict] | None = None
        alike = _Alike.of(halves)
        if not alike.one_class:  # (halves of one class alone)
            return
        cls = type(halves[0].handler_owner(kind)[0])
        step = getattr(cls, f"_on_{kind}_rows", None)
        if step is None:  # (the kind has no stacked step: nothing to look at per half)
            return
        # (an owner's handler is its class's: owners of one class have one handler)
        self.owners = type(halves[0]).handler_owners(halves, kind)
        if _handler(cls, kind)[0] is None or set(map(type, self.owners)) != {cls}:
            return
        self.cohorts = None
        if kind in getattr(cls, "stable_batch_keys", ()):
            self.cohorts = _cohorts(self.owners, kind)
            if self.cohorts is None:
                return
            self.groups = [[halves[i] for i in idx] for idx, _ in self.cohorts] or [self.halves]
        self.firsts = alike.firsts
        self.valued = frozenset(
            name for i in self.firsts for name in halves[i].messages.valued_fields(kind)
        )
        self.step = step

    @staticmethod
    def of(halves: list[ClientHalf], kind: str) -> RowsPlan | None:
        """The plan of a round of ``kind`` at ``halves`` (kept by the first half, a plan
        per kind), or None when they cannot take it together."""
        found = halves[0].__dict__
        plans = found.get("_rows_plans")
        if plans is None:
            plans = found["_rows_plans"] = {}
        plan = plans.get(kind)
        if plan is None or plan.generation != _GENERATION[0] or plan.halves != halves:
            plan = plans[kind] = RowsPlan(halves, kind)
        return plan if plan.step is not None else None


def kept_alike(halves: list, name: str, make: Callable[[list], Any]) -> Any:
    """``make(halves)``, kept by the first half under ``name`` while the same list of
    halves comes back and no event changed what decides it (:func:`plans_changed`): what
    the stacked rounds of many kinds read of one list of halves is read once."""
    found = halves[0].__dict__
    kept = found.get(name)
    if kept is None or kept[0] != _GENERATION[0] or kept[1] != halves:
        kept = found[name] = (_GENERATION[0], list(halves), make(halves))
    return kept[2]


class _Alike:
    """What the plans of every kind at one list of halves read alike (:class:`RowsPlan`),
    found once and kept by the first half (:func:`kept_alike`): whether they are of one
    class, and the first half of each message table and opt-ins (``firsts``: its
    request's check stands for those of the halves of its table and opt-ins)."""

    __slots__ = ("one_class", "firsts")

    def __init__(self, halves: list[ClientHalf]):
        self.one_class = set(map(type, halves)) == {type(halves[0])}
        tables = list(map(_MESSAGES, halves))
        keys = list(zip(map(id, tables), map(_REVEAL, halves)))
        n = len(keys)
        first = dict(zip(reversed(keys), range(n - 1, -1, -1)))  # (the last write: the first)
        self.firsts = sorted(i for i in first.values() if tables[i] is not None)

    @staticmethod
    def of(halves: list[ClientHalf]) -> _Alike:
        return kept_alike(halves, "_rows_alike", _Alike)


def _cohorts(owners: list, kind: str) -> list[tuple[np.ndarray, list]] | None:
    """``owners`` grouped by their ``step_batch_key(kind)`` (:attr:`RowsPlan.cohorts`):
    ``[]`` when it is one for all, None when one of them has none."""
    found = getattr(type(owners[0]), "step_batch_keys", None)
    if found is not None:  # (the class finds them in one pass)
        keys = found(owners, kind)
    else:
        keys = [owner.step_batch_key(kind) for owner in owners]
    if None in keys:
        return None
    if keys.count(keys[0]) == len(keys):
        return []
    # (the halves of each key object, then those of equal keys together, in the order each
    # key first appears, as the host groups: keys are compared once per object)
    ids = np.fromiter(map(id, keys), dtype=np.uintp, count=len(keys))
    _, first, inverse = np.unique(ids, return_index=True, return_inverse=True)
    members = np.argsort(inverse, kind="stable")
    ends = np.cumsum(np.bincount(inverse)).tolist()
    starts = [0, *ends[:-1]]
    cohorts: dict[Any, list[np.ndarray]] = {}
    for g in np.argsort(first).tolist():
        cohorts.setdefault(keys[first[g]], []).append(members[starts[g] : ends[g]])
    groups = [p[0] if len(p) == 1 else np.sort(np.concatenate(p)) for p in cohorts.values()]
    return [(idx, [owners[i] for i in idx.tolist()]) for idx in groups]


class Tally:
    """Counts of many halves' statistics kept as one array per counter, slot ``i`` for
    ``halves[i]``, and added to the halves' ``stats`` when one of them reads its own
    (:attr:`ClientHalf.stats`; all at once, in one pass): what a stacked step counts for
    each of its halves is one array operation. :meth:`add` sums (a counter appears in a
    half's statistics once its sum there is nonzero), :meth:`maximum` keeps the largest
    value.

    Examples
    --------
    >>> from types import SimpleNamespace
    >>> halves = [ClientHalf(SimpleNamespace(name=n)) for n in "ab"]
    >>> tally = Tally.of(halves)
    >>> tally.add("local_iterations", np.array([3, 4]), dtype=int)
    >>> tally.add("seconds", 0.5)
    >>> halves[1].stats["local_iterations"], halves[0].stats["seconds"]
    (4, 0.5)
    """

    __slots__ = ("halves", "sums", "maxima", "pending", "__weakref__")

    #: the tallies a half keeps of lists it comes first in (one per length)
    KEPT = 4

    def __init__(self, halves: list):
        self.halves = list(halves)
        self.sums: dict[str, np.ndarray] = {}
        self.maxima: dict[str, np.ndarray] = {}
        self.pending = False  # (counts not added to the halves' statistics yet)
        for i, half in enumerate(self.halves):
            half.__dict__.setdefault("_tallies", {})[self] = i

    @staticmethod
    def of(halves: list) -> Tally:
        """The tally of exactly ``halves`` (in that order), kept by the first half while
        the same list comes back; one it replaces adds what it holds to its halves."""
        kept = halves[0].__dict__.setdefault("_tally_of", {})
        tally = kept.get(len(halves))
        if tally is not None and tally.halves == halves:
            return tally
        if tally is not None:
            tally.close()
            del kept[len(halves)]
        while len(kept) >= Tally.KEPT:
            kept.pop(next(iter(kept))).close()
        tally = kept[len(halves)] = Tally(halves)
        return tally

    def add(self, name: str, values: Any, dtype: type = float) -> None:
        """Add ``values`` (one for all, or a value per half) to counter ``name``."""
        column = self.sums.get(name)
        if column is None:
            column = self.sums[name] = np.zeros(len(self.halves), dtype=dtype)
        column += values
        self._pend()

    def maximum(self, name: str, values: np.ndarray) -> None:
        """Keep the largest of counter ``name`` and ``values`` (a value per half)."""
        column = self.maxima.get(name)
        if column is None:
            column = self.maxima[name] = np.full(len(self.halves), -np.inf)
        np.maximum(column, values, out=column)
        self._pend()

    def _pend(self) -> None:
        if not self.pending:
            self.pending = True
            _PENDING.add(self)

    @staticmethod
    def settle_all() -> None:
        """:meth:`settle` every tally holding counts (a mark reads every half's
        statistics: the tallies are settled once, not once per half)."""
        while _PENDING:
            _PENDING.pop().settle()

    def settle(self) -> None:
        """Add every slot's counts to its half's statistics and empty the slots."""
        if not self.pending:
            return
        self.pending = False
        found = list(map(_STATS, self.halves))
        for name, column in self.sums.items():
            if column.all():  # (a count for every half: each one's sum, in one C pass)
                held = map(dict.get, found, itertools.repeat(name), itertools.repeat(0))
                sums = map(operator.add, held, column.tolist())
                _consume(map(operator.setitem, found, itertools.repeat(name), sums))
            else:
                for stats, value in zip(found, column.tolist()):
                    if value:
                        stats[name] = stats.get(name, 0) + value
            column[:] = 0
        for name, column in self.maxima.items():
            if np.isfinite(column).all():  # (a value for every half: each one's largest)
                held = map(dict.get, found, itertools.repeat(name), itertools.repeat(-np.inf))
                largest = map(max, held, column.tolist())
                _consume(map(operator.setitem, found, itertools.repeat(name), largest))
            else:
                for stats, value in zip(found, column.tolist()):
                    if value != -np.inf and (name not in stats or value > stats[name]):
                        stats[name] = value
            column[:] = -np.inf

    def forget(self, i: int) -> None:
        """Empty slot ``i`` (its half's statistics were replaced)."""
        for column in self.sums.values():
            column[i] = 0
        for column in self.maxima.values():
            column[i] = -np.inf

    def close(self) -> None:
        """Add what it holds to its halves' statistics and leave them."""
        self.settle()
        for half in self.halves:
            half.__dict__["_tallies"].pop(self, None)


#: the tallies that took counts since they were last settled (held weakly: a tally lives
#: as long as its halves)
_PENDING: weakref.WeakSet[Tally] = weakref.WeakSet()

_STATS = attrgetter("_stats")


def _consume(iterator) -> None:
    """Run ``iterator`` to its end (a pass made of C calls, its values dropped)."""
    collections.deque(iterator, maxlen=0)


#: id(family table) -> (the table, it merged with secure aggregation's): made once per table
_ANSWERED: dict[int, tuple[MessageTable, MessageTable]] = {}


def _answered(family: MessageTable) -> MessageTable:
    """``family`` merged with secure aggregation's kinds, one table shared by every half
    of the classes that declare ``family`` (a table is not changed once declared)."""
    entry = _ANSWERED.get(id(family))
    if entry is None or entry[0] is not family:
        entry = _ANSWERED[id(family)] = (family, family.merged(SECAGG))
    return entry[1]


@functools.cache
def _signature(cls: type) -> inspect.Signature:
    """The constructor signature of a half's class (read once per class)."""
    return inspect.signature(cls)


def _bound(cls: type, args: tuple, kwargs: dict) -> dict[str, Any]:
    """``inspect.signature(cls).bind(*args, **kwargs).arguments`` as a dict: the argument
    names, in the constructor's order, found once per class and form of the call (how
    many positional arguments, which keywords; a party per client builds with one form),
    or by ``bind`` itself for a constructor with ``*args`` or ``**kwargs``. Raises
    TypeError as ``bind`` does."""
    found = _bound_names(cls, len(args), tuple(kwargs))
    if found is None:
        return dict(_signature(cls).bind(*args, **kwargs).arguments)
    names, ordered = found
    values = dict(zip(names, args))
    if not kwargs:  # (the positional names are the constructor's first, in its order)
        return values
    values.update(kwargs)
    return values if ordered else {name: values[name] for name in names}


@functools.cache
def _bound_names(cls: type, n_args: int, keys: tuple[str, ...]) -> tuple[tuple, bool] | None:
    """The names ``bind`` gives a call of ``cls`` with ``n_args`` positional arguments and
    the keywords ``keys``, in the constructor's order, and whether the keywords come in
    that order; None for a constructor with ``*args`` or ``**kwargs``. Raises TypeError
    when such a call does not bind."""
    sig = _signature(cls)
    if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in sig.parameters.values()):
        return None
    names = tuple(sig.bind(*range(n_args), **dict.fromkeys(keys)).arguments)
    return names, names[n_args:] == keys


@functools.cache
def _handler(cls: type, kind: str) -> tuple[Any, bool]:
    """The handler of message ``kind`` on class ``cls`` (``_on_<kind>``, None when there is
    none) and whether it takes the sender."""
    fn = getattr(cls, f"_on_{kind}", None)
    if fn is None:
        return None, False
    return fn, "sender" in inspect.signature(fn).parameters


@dataclass
class StepReport:
    """What one server step did: per-iteration facts for the history row (``info``), and
    ``stop`` when the method's own stopping rule ended the run (``"stopped"``: its test
    held, the certificate decides ``"optimal"``; ``"unbounded"``, ``"max_iterations"``, or
    another status), with a ``message``."""

    info: dict[str, Any] = field(default_factory=dict)
    stop: str | None = None
    message: str = ""
    record: bool = True  # False: the step is inside an iteration the history does not record


class ServerHalf(DeclaredState, ABC):
    """Base of every method's server half (see the module docstring for the protocol).

    Subclasses implement :meth:`start`, :meth:`step` and :meth:`point`, and declare their
    state (``state_fields``, ``component_fields``: :class:`DeclaredState`; everything the
    next :meth:`step` needs: iterate, multipliers, counters); they may refine :meth:`conclude` (status messages), :meth:`multipliers`
    and :meth:`extra`.

    Attributes
    ----------
    step_name : str
        What one step is called in messages (``"outer iteration"`` for prox-al).
    max_steps : int
        Steps after which the run ends with status ``"max_iterations"``.
    """

    #: the method family's message table: the driver validates every reply against it
    messages: ClassVar[MessageTable | None] = None
    #: what applies to the run because the server collects every algorithm message through
    #: its privacy plan (sums over clients; fedmodel/algorithms/dp.py): "secure_aggregation",
    #: "dp" (which also needs the clients' contributions clipped)
    private_aggregation: ClassVar[tuple[str, ...]] = ()
    #: the run's privacy plan (:class:`~fedmodel.algorithms.dp.PrivacyPlan`), set by the driver
    privacy: Any = None
    step_name: ClassVar[str] = "iteration"
    max_steps: int = 1

    def __init__(self, program: PartyProgram, options: Any):
        self.program = program
        self.options = options
        self.local_iterations = 0

    # -- the protocol ------------------------------------------------------------------------
    @abstractmethod
    def start(self, runtime) -> None:
        """The first exchange (e.g. send the starting point); sets the initial state."""

    @abstractmethod
    def step(self, runtime, deadline: float | None) -> StepReport:
        """One iteration of the method; ``deadline`` (``time.perf_counter()`` value) lets a long
        inner loop stop early."""

    @abstractmethod
    def point(self) -> np.ndarray:
        """The current iterate (stacked variables) the certificate is computed at."""

    # -- refinements -------------------------------------------------------------------------
    def multipliers(self) -> tuple[np.ndarray, np.ndarray]:
        """The server's own multipliers (``c_0``, ``a_0``)."""
        return np.zeros(self.program.m_ineq), np.zeros(self.program.m_eq)

    def cone_duals(self) -> np.ndarray | None:
        """The server's cone-constraint multipliers (None when the method keeps none)."""
        return None

    def conclude(
        self, stop: str, message: str, kkt, summary: dict, history: list
    ) -> tuple[str, str]:
        """Final status and message from the method's stop reason and the recomputed
        certificate; the driver has already checked ``kkt`` against the tolerance for
        ``"stopped"`` (this hook adds method-specific explanations)."""
        return stop, message

    def sync(self, runtime) -> None:
        """Bring :meth:`point` up to date before an evaluation round (a peer-to-peer method
        gathers its output from a node here); default nothing."""
        return None

    def quiesce(self, runtime) -> None:
        """Take every reply of the messages this server posted (``runtime.post``) and has
        not polled yet, so that the point is consistent: the driver calls it before an
        evaluation, a checkpoint and the certificate when ``runtime.in_flight``; default
        nothing (methods that only use blocking exchanges)."""
        return None

    #: the objective's reference scale ``S`` the certificate uses
    #: (:mod:`fedmodel.certificate.scale`; 1 for a method that does not measure it)
    objective_scale: float = 1.0

    def evaluation_extras(self) -> dict:
        """Extra payload of the certificate's ``evaluate`` messages (besides ``w``)."""
        return {}

    def diagnostics(self, reports: dict[str, dict]) -> dict:
        """Extra history fields computed from the parties' ``evaluate`` reports."""
        return {}

    def report_payload(self) -> dict:
        """Payload of the final ``report`` messages."""
        return {}

    def message_dims(self, client: str) -> dict[str, int]:
        """Dimensions of ``client``'s messages beyond those of its compiled program
        (:func:`fedmodel.algorithms.messages.program_dims`): e.g. an Anderson memory, or
        every dimension when the method runs without a compiled model. By default those
        the table derives from the options (``messages.option_dims``)."""
        table = self.messages
        if table is None or table.option_dims is None:
            return {}
        # (the same for every client: found once per table and options object)
        found = self.__dict__.get("_option_dims")
        if found is None or found[0] is not table or found[1] is not self.options:
            found = self._option_dims = (table, self.options, table.option_dims(self.options))
        return dict(found[2])

    def message_dims_alike(self) -> bool:
        """Whether :meth:`message_dims` is one for every client (the default's: found from
        the options alone), so that many clients' dimensions are found at once."""
        return type(self).message_dims is ServerHalf.message_dims

    def round_counts(self) -> dict[str, int]:
        """Counts for ``res.rounds`` besides ``outer`` (steps) and ``communication``."""
        return {}

    def extra(self, reports: dict[str, dict]) -> dict:
        """Method-specific fields for ``res.extra``; ``reports`` are the clients' final
        ``report`` payloads."""
        return {}

    # -- methods on their own problem representation (run_federated(compiled=None)) ---------
    #: the certificate is a local (non-convex) one
    local_certificate: bool = False

    def fingerprint(self) -> dict:
        """What a checkpoint must match to be resumed (``compiled=None`` only)."""
        raise NotImplementedError(
            f"{type(self).__name__}.fingerprint() is needed only to run without a compiled "
            "model (run_federated(compiled=None)); this server half does not define it"
        )

    def placement_weights(self) -> dict[str, float] | None:
        """Relative load of each client, for sharding them over workers (``compiled=None``)."""
        return None

    def evaluate(self, runtime) -> tuple[Any, dict, dict]:
        """One diagnostic round at the current point (``compiled=None`` only): the KKT
        residuals, a summary (``objective``, ``max_violation``, ``constraints``) and extra
        history fields."""
        raise NotImplementedError(
            f"{type(self).__name__}.evaluate() is needed only to run without a compiled "
            "model (run_federated(compiled=None)); this server half does not define it"
        )

    def make_result(self, **fields: Any):
        """The :class:`~fedmodel.result.Result` from the driver's fields (``status``,
        ``message``, ``kkt``, ``summary``, ``reports`` = the clients' final report payloads,
        ``rounds``, ``communication``, ``timing``, ``history``, ``options``, ``ledger``,
        ``failure``, ``checkpoint``, ``extra``) (``compiled=None`` only)."""
        raise NotImplementedError(
            f"{type(self).__name__}.make_result() is needed only to run without a compiled "
            "model (run_federated(compiled=None)); this server half does not define it"
        )


@dataclass(frozen=True)
class MethodSpec:
    """A registered method: its options class, its runner and a one-line description,
    with what it requires of a model. Families build theirs here (their ``METHODS``); the
    registry imports the families, never the other way round.

    Examples
    --------
    >>> from fedmodel.algorithms.registry import method_spec
    >>> spec = method_spec("dald-cc")
    >>> spec.options.__name__, spec.server_sets_in_h
    ('DALDOptions', True)
    """

    options: type
    runner: Callable[..., Any]
    description: str
    needs_no_constraints: bool = False
    needs_gradients: bool = True
    federated: bool = True  # False: the method reads every party's program (a reference)
    #: takes party-owned variables (``party.variable``, epigraph auxiliaries)
    owned_variables: bool = False
    #: applies the server's simple-set constraints (box, nonnegativity, norm ball) as part
    #: of h (methods without constraint handling)
    server_sets_in_h: bool = False
    vertical: bool = False  # True: solves vertical models (fedmodel.models.fair_vfl), not DSL ones
    learning: bool = False  # True: trains fm.LearningModel (per-sample losses), not DSL ones
