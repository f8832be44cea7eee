"""prox-al's clients whose steps stack: the dense GLM form of an unconstrained client.

A host answers the messages of parties whose steps have the same structure in one batched
step (:meth:`~fedmodel.runtime.host.PartyHost.run`, :meth:`ClientHalf.handle_batch
<fedmodel.algorithms.protocol.ClientHalf.handle_batch>`). In prox-al these are the clients
with no constraints, cones or own block whose objective has a GLM form with dense data
(:func:`~fedmodel.subproblems.newton.party_glm`): their exact-admm steps
(:meth:`~fedmodel.algorithms.proxal.exact_admm.ExactClient._on_xadmm_w_batch`) and their
certificate evaluations (:meth:`~fedmodel.algorithms.proxal.client.ProxALClient._on_evaluate_batch`)
run on one :class:`~fedmodel.subproblems.batched_glm.GLMCohort`. This module holds what
both need: which form a client has (:func:`glm_objective`; :func:`batched_steps`: whether
its steps run in cohorts), the check of that form at a client's first batched use
(:func:`check_forms`: against the model's own evaluator once per family of structures
(forms of one GLM signature, row counts aside, read with the same decisions: structures
that differ in their data's row counts alone are one), by value at a random point once
per other structure of the family, each check standing for the structure's other
clients whose forms were read along the same path, and by value for the others; a client
whose form disagrees leaves every batch for good), and the cohort of a list of clients,
built once and reused while the host groups the same clients (:func:`cohort_of`).

Examples
--------
>>> import numpy as np, cvxpy as cp
>>> import fedmodel as fm
>>> model = fm.Model()
>>> w = model.variable(3, name="w")
>>> site = model.client("a")
>>> site.minimize(cp.sum_squares(site.data(np.eye(3), name="X") @ w - 1))
>>> prog = model.compile().clients[0]
>>> unconstrained_glm(prog).n
3
"""

from __future__ import annotations

import collections
import itertools
import operator
import weakref
from typing import Any

import numpy as np

from fedmodel.compiler.glm import NotRecognised, dense_data
from fedmodel.compiler.partition import PartyProgram
from fedmodel.expressions import numeric_value
from fedmodel.runtime.endpoints import RowColumn
from fedmodel.subproblems.batched_glm import GLMCohort, glm_signature
from fedmodel.subproblems.newton import evaluations_agree, party_glm


def unconstrained_glm(program: PartyProgram):
    """The GLM form (:class:`~fedmodel.compiler.glm.GLMFunction`) of ``program``'s
    objective when the party has no constraints, no cones and no own variables and every
    term of the form has dense data; None otherwise."""
    form = _unconstrained_form(program)
    return None if form is None else form.f


def _unconstrained_form(program: PartyProgram):
    """``program``'s :func:`~fedmodel.subproblems.newton.party_glm` when its objective is
    an :func:`unconstrained_glm` form; None otherwise."""
    if program.m_ineq or program.m_eq or program.m_cone:
        return None
    if program.layout.size > program.layout.n_shared:
        return None
    try:
        form = party_glm(program)
    except NotRecognised:
        return None
    f = form.f
    if f is None or form.ineq or form.eq or not all(map(dense_data, f.terms)):
        return None
    return form


def batched_steps(host) -> bool:
    """Whether a client (``host``: a prox-al client half) takes its exact steps in cohorts:
    batches on (``batch_clients``), the library's own backend (``solver`` "auto" or
    "newton") and an :func:`unconstrained_glm` form (its :func:`glm_objective`). Its own
    backend is then the Newton backend, built only if it leaves the batches
    (:class:`~fedmodel.subproblems.select.LazySolver`)."""
    return host.options.solver in ("auto", "newton") and glm_objective(host) is not None


def glm_objective(host) -> Any:
    """The client's :func:`unconstrained_glm` form while batches are on
    (``batch_clients``) and its form has not disagreed with its evaluator; None
    otherwise. Found once per client."""
    if not host.options.batch_clients or host.glm_disagrees:
        return None
    if not host.glm_looked_up:
        form = _unconstrained_form(host.program)
        if form is not None:
            host.glm_form = form.f
            host.glm_signature = _signature(form)
            host.glm_path = form.path_key
        host.glm_looked_up = True
    return host.glm_form


#: a path (:attr:`~fedmodel.subproblems.newton.party_glm`'s ``path_key``) -> the
#: :func:`~fedmodel.subproblems.batched_glm.glm_signature` (with rows) of its forms, which
#: is theirs alike (kinds, signs, ``M`` and row counts follow from the terms and the path)
_SIGNATURES: dict[tuple, tuple] = {}


def _signature(form) -> tuple:
    """The signature with rows of the form ``form`` (a
    :func:`~fedmodel.subproblems.newton.party_glm`): found once per path."""
    if form.path_key is None:
        return glm_signature(form.f, rows=True)
    found = _SIGNATURES.get(form.path_key)
    if found is None:
        found = _SIGNATURES[form.path_key] = glm_signature(form.f, rows=True)
    return found


def glm_structure(host) -> tuple | None:
    """The structure a client's batched steps share with their cohort: its
    :func:`glm_objective`'s signature with row counts
    (:func:`~fedmodel.subproblems.batched_glm.glm_signature`), or None."""
    return None if glm_objective(host) is None else host.glm_signature


class StackRow(property):
    """A client's attribute kept once for its cohort (:func:`stack_row`), which also
    reads many clients' values at once (:meth:`column`)."""

    def __init__(self, fget, fset, doc: str, getters: tuple, own: tuple, tick):
        super().__init__(fget, fset, doc=doc)
        self.getters = getters  # (own value, own time, stack, slot, the stack's rows)
        self.own, self.tick = own, tick  # (the names of the own value and its time; the clock)

    def write(self, objs: list, values: list) -> None:
        """Set the attribute of each of ``objs`` to its item of ``values``, as one write
        (one time of the clock for all of them; a few C passes)."""
        own, own_time = self.own
        time = self.tick()
        collections.deque(map(setattr, objs, itertools.repeat(own), values), maxlen=0)
        collections.deque(
            map(setattr, objs, itertools.repeat(own_time), itertools.repeat(time)), maxlen=0
        )

    def values(self, objs: list) -> list:
        """The value of each of ``objs`` as it reads it, uncopied: their own values in one
        C pass when none is in a stack, else each read on its own."""
        stacks = list(map(self.getters[2], objs))
        if stacks.count(None) == len(stacks):
            return list(map(self.getters[0], objs))
        return list(map(self.fget, objs))

    def column(self, objs: list) -> list | RowColumn:
        """The value of each of ``objs`` (clients of one class), as each reads it, for a
        mark (:class:`~fedmodel.runtime.endpoints.StateColumns`). When every one of them
        reads its row of its stack (stacks whose rows are arrays of one row shape and
        dtype), those rows are copied once, together and read-only, and the values are
        the clients' rows of that copy (a :class:`~fedmodel.runtime.endpoints.RowColumn`:
        no pass that reads a row per client); else each value is read on its own,
        uncopied (:meth:`values`)."""
        get_own, get_time, get_stack, get_slot, get_rows = self.getters
        n = len(objs)
        stacks = list(map(get_stack, objs))
        if stacks.count(None) == n:
            return list(map(get_own, objs))
        ids = np.fromiter(map(id, stacks), dtype=np.uintp, count=n)
        _, first, inverse = np.unique(ids, return_index=True, return_inverse=True)
        distinct = [stacks[i] for i in first.tolist()]
        blocks = [None if s is None else get_rows(s) for s in distinct]
        if not all(type(b) is np.ndarray and b.ndim >= 1 for b in blocks):
            return self.values(objs)  # (a client in no stack, or one not written)
        if len({(b.shape[1:], b.dtype) for b in blocks}) != 1:
            return self.values(objs)
        times = np.fromiter(map(get_time, objs), dtype=np.int64, count=n)
        written = np.array([s.time for s in distinct], dtype=np.int64)
        sizes = np.array([len(b) for b in blocks])
        slots = np.fromiter(map(get_slot, objs), dtype=np.intp, count=n)
        current = (times < written[inverse]) & (slots >= 0) & (slots < sizes[inverse])
        if not bool(current.all()):
            return self.values(objs)  # (a client wrote its own since)
        held = np.concatenate(blocks) if len(blocks) > 1 else np.array(blocks[0])
        held.flags.writeable = False
        return RowColumn(held, (np.cumsum(sizes) - sizes)[inverse] + slots)


def stack_row(
    own: str, own_time: str, stack: str, slot: str, rows: str, tick, doc: str
) -> StackRow:
    """A client's attribute kept once for its cohort: it reads as row ``slot`` of the
    array ``rows`` of the client's ``stack`` (an object with a ``time``) when that stack
    was written after the client's own last write, else as the client's own value
    ``own``. Setting it writes ``own`` with the time ``tick()`` (the write's time, on the
    clock the stack's ``time`` is read from; an integer). Many clients' values are read
    at once by its :meth:`StackRow.column` and written at once by :meth:`StackRow.write`.

    Examples
    --------
    >>> from types import SimpleNamespace
    >>> clock = [0]
    >>> def tick():
    ...     clock[0] += 1
    ...     return clock[0]
    >>> class Client:
    ...     x = stack_row("_x", "_x_time", "_stack", "_slot", "rows", tick, "x")
    ...     _stack, _slot = None, 0
    >>> c = Client()
    >>> c.x = 1.0
    >>> c._stack, c._slot = SimpleNamespace(rows=[5.0, 7.0], time=tick()), 1
    >>> c.x  # (the stack's row: written after the client's own value)
    7.0
    >>> c.x = 2.0
    >>> c.x
    2.0
    """
    get_own, get_time = operator.attrgetter(own), operator.attrgetter(own_time)
    get_stack, get_slot = operator.attrgetter(stack), operator.attrgetter(slot)
    get_rows = operator.attrgetter(rows)

    def fget(self):
        written = get_stack(self)
        if written is not None and written.time > get_time(self):
            return get_rows(written)[get_slot(self)]
        return get_own(self)

    def fset(self, value) -> None:
        time = tick()
        setattr(self, own, value)
        setattr(self, own_time, time)

    getters = (get_own, get_time, get_stack, get_slot, get_rows)
    return StackRow(fget, fset, doc, getters, (own, own_time), tick)


def cohort_of(hosts: list) -> GLMCohort:
    """The stacked forms of ``hosts`` (clients with a :func:`glm_objective` of one
    signature), built once and kept by the first client while the same clients are
    grouped."""
    cached = hosts[0].glm_cohort
    if cached is not None and cached[0] == hosts:  # (the same clients: compared by identity)
        return cached[1]
    forms = [glm_objective(h) for h in hosts]
    if any(f is None for f in forms):
        raise NotRecognised("a client without a dense unconstrained GLM form in a cohort")
    cohort = GLMCohort(forms)
    hosts[0].glm_cohort = (list(hosts), cohort)
    return cohort


#: structures (:func:`~fedmodel.compiler.fingerprint.structure_fingerprint`) whose GLM
#: form has agreed with the model on a client of this process (:func:`check_forms`)
_CHECKED_STRUCTURES: set[str] = set()

#: the paths (:func:`~fedmodel.subproblems.newton.party_glm`'s ``path_key``: a structure
#: and the decisions its reading took from the data's values) of forms that have agreed
#: with the model on a client of this process (:func:`check_forms`)
_CHECKED_PATHS: set[tuple] = set()

#: the families (:func:`_family`) of forms that have agreed with the model's evaluator on
#: a client of this process
_CHECKED_FAMILIES: set[tuple] = set()

#: whether a client's form has been checked (one C call per client, :func:`check_forms`)
_VERIFIED = operator.attrgetter("glm_verified")

#: the cohorts (:func:`cohort_of`, each of one list of clients) whose every client's form
#: has been checked: a client's check stands for good (one that disagrees leaves every
#: cohort), so such a cohort is not looked at again
_VERIFIED_COHORTS: weakref.WeakSet = weakref.WeakSet()

#: the seed of the point where a client's form is probed (:func:`check_forms`)
PROBE_SEED = 0


def _probe_point(n: int) -> np.ndarray:
    """The point where forms are probed: fixed, random, entries of order ``1/sqrt(n)``."""
    return np.random.default_rng(PROBE_SEED).standard_normal(n) / np.sqrt(max(n, 1))


def _cvxpy_value(program: PartyProgram, x: np.ndarray) -> float:
    """The program's objective at ``x`` by cvxpy's own arithmetic."""
    layout = program.layout

    def value(v):
        return np.reshape(x[layout.slice_of(v)], v.shape, order="F")

    return float(sum(np.sum(numeric_value(t.expr, value)) for t in program.objective))


def _family(host, cohort: GLMCohort) -> tuple | None:
    """The family of a client's form in ``cohort``: its GLM signature without row counts
    (the cohort's) and the decisions its reading took from its data's values (its path
    without its structure), which structures that differ in their data's row counts alone
    share; None for a form read through its own nodes."""
    path = host.glm_path
    return None if path is None else (cohort.signature, path[1])


def check_forms(hosts: list, cohort: GLMCohort, X: np.ndarray) -> None:
    """Check the GLM form of each client of ``hosts`` at its first batched use.

    The first client of each family of structures (:func:`_family`: the form's GLM
    signature without rows and the decisions its reading took from its data's values, one
    for structures (:func:`~fedmodel.compiler.fingerprint.structure_fingerprint`) that
    differ in their data's row counts alone; a structure on its own for a form read
    through its own nodes) compares its form's value and gradient at its row of ``X`` with its model's
    own evaluator (as the per-party Newton backend's first solve does,
    :func:`~fedmodel.subproblems.newton.evaluations_agree`). The first client of each other
    structure of a family that agreed so compares its form's value at a fixed random
    point with its objective's value there by cvxpy's own arithmetic
    (:func:`~fedmodel.expressions.numeric_value`). Either check of a structure's first
    client (one whose form was read through its structure's nodes when there is one:
    ``glm_path``, its form's path) stands for the structure's other clients whose forms
    took the same path: they build no evaluator. Any other client of a structure that
    agreed is probed at the random point. A client whose form disagrees leaves the
    batches for good and NotRecognised is raised, so that each message is handled on its
    own; when a structure's first client disagrees, its other clients are checked in full.

    Why the shared checks are enough: clients of one structure have the same terms up to
    their data's values, and their forms are read through the same nodes
    (:func:`~fedmodel.subproblems.newton.party_glm`), each decision taken from its own
    values and noted in its path. Two forms of one path are the same operations applied
    to their own data, so the check of one validates the others. A form of another path,
    or of another structure of a family, took a decision or read a shape that the
    checked one did not; any misstep there gives a form that is another function of
    ``x``. Form and objective are analytic in ``x`` (piecewise, for huber, on the piece
    the point falls in), so if they differ they agree only on a set of measure zero: their
    values at a random point are equal (to the same relative tolerance as the full check)
    only when they are the same function, gradient included. The bookkeeping is a few
    set and dictionary operations per client; evaluators are built once per family.
    """
    if cohort in _VERIFIED_COHORTS or all(map(_VERIFIED, hosts)):
        _VERIFIED_COHORTS.add(cohort)
        return
    new = [i for i, verified in enumerate(map(_VERIFIED, hosts)) if not verified]
    paths = [hosts[i].glm_path for i in new]
    first_of = dict(zip(reversed(paths), reversed(new)))  # (each path's first client)
    own = [i for i, p in zip(new, paths) if p is None] if None in first_of else []
    # (each unchecked structure's first client: one whose form took a path when there is one)
    firsts: dict[str, int] = {}
    for i in sorted([i for p, i in first_of.items() if p not in _CHECKED_PATHS] + own):
        key = _structure(hosts[i])
        if key not in _CHECKED_STRUCTURES:
            at = firsts.setdefault(key, i)
            if hosts[at].glm_path is None and hosts[i].glm_path is not None:
                firsts[key] = i
    full, standing, planned = [], [], set()  # (planned: families checked in full here)
    for i in sorted(firsts.values()):
        family = _family(hosts[i], cohort)
        if family is not None and (family in _CHECKED_FAMILIES or family in planned):
            standing.append(i)
        else:
            full.append(i)
            planned.add(family)
    wrong = _check_in_full(hosts, cohort, X, full)
    for i in full:
        if hosts[i] not in wrong:
            _agreed(hosts[i], _family(hosts[i], cohort))
    standing = [i for i in standing if _family(hosts[i], cohort) in _CHECKED_FAMILIES]
    refused = _probe(hosts, cohort, standing)
    for i in standing:
        if i not in refused:
            _agreed(hosts[i], None)
    unchecked, probed = [], []
    if own or not _CHECKED_PATHS.issuperset(first_of):
        done = set(full).union(standing)
        for i, p in zip(new, paths):
            if p in _CHECKED_PATHS or i in done:
                continue
            if _structure(hosts[i]) in _CHECKED_STRUCTURES:
                probed.append(i)
            else:
                unchecked.append(i)
    wrong += _check_in_full(hosts, cohort, X, unchecked + refused + _probe(hosts, cohort, probed))
    if wrong:
        for h in wrong:
            h.glm_disagrees = True
        names = ", ".join(repr(h.name) for h in wrong)
        raise NotRecognised(f"the GLM form of party {names} disagrees with its evaluator")
    for i in new:
        hosts[i].glm_verified = True
    _VERIFIED_COHORTS.add(cohort)


def _structure(host) -> str:
    """A client's structure (:func:`~fedmodel.compiler.fingerprint.structure_fingerprint`):
    its form's path's when it has one, found once."""
    if host.glm_structure is None:
        path = host.glm_path
        host.glm_structure = host.program.structure if path is None else path[0]
    return host.glm_structure


def _agreed(host, family: tuple | None) -> None:
    """Note that ``host``'s form agreed with its model: its structure, its path and (for a
    check against the evaluator, ``family``) its family are checked."""
    _CHECKED_STRUCTURES.add(host.glm_structure)
    if host.glm_path is not None:
        _CHECKED_PATHS.add(host.glm_path)
    if family is not None:
        _CHECKED_FAMILIES.add(family)


def _subset(cohort: GLMCohort, idx: list[int]) -> GLMCohort:
    """The clients ``idx`` of ``cohort``, in that order."""
    if len(idx) == cohort.size and all(k == i for k, i in enumerate(idx)):
        return cohort
    return cohort.subset(np.array(idx))


def _check_in_full(hosts: list, cohort: GLMCohort, X: np.ndarray, idx: list[int]) -> list:
    """The clients of ``idx`` whose form's value and gradient at their row of ``X``
    disagree with their model's own evaluator."""
    if not idx:
        return []
    vals, grads = _subset(cohort, idx).value_grad(X[np.array(idx)])
    return [
        hosts[i]
        for k, i in enumerate(idx)
        if not evaluations_agree(
            hosts[i].program.functions.objective_and_grad(X[i]), (vals[k], grads[k])
        )
    ]


def _probe(hosts: list, cohort: GLMCohort, idx: list[int]) -> list[int]:
    """The clients of ``idx`` whose form's value at the probe point differs from their
    objective's value there by cvxpy's own arithmetic (or that cvxpy cannot evaluate):
    they are checked in full."""
    if not idx:
        return []
    point = _probe_point(hosts[idx[0]].program.layout.size)
    vals, _ = _subset(cohort, idx).value_grad(np.tile(point, (len(idx), 1)))
    out = []
    for k, i in enumerate(idx):
        try:
            with np.errstate(all="ignore"):
                ref = _cvxpy_value(hosts[i].program, point)
        except Exception:  # noqa: BLE001 - an atom cvxpy cannot evaluate so: the full check
            out.append(i)
            continue
        if not abs(vals[k] - ref) <= 1e-8 * max(1.0, abs(ref)):
            out.append(i)
    return out
