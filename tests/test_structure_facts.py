"""What a party's structure decides is found once per structure and shared by the parties
that have it (``PartyProgram.structure_fact``): parties of one structure with other data
each keep their own data, parties of other structures get their own facts, and a fact
that fails (a non-smooth term) is refused for every party that has it."""

import dataclasses
import pickle

import cvxpy as cp
import numpy as np
import pytest

import fedmodel as fm
import fedmodel.compiler.partition as partition
from fedmodel.algorithms.proxal.cohorts import unconstrained_glm
from fedmodel.errors import UnsupportedError
from fedmodel.runtime.schema import Field


def _model(kinds, seed=0, d=3):
    """One client per entry of ``kinds``: least squares ("ls", 6 rows), an entropy term
    ("entr", defined for w > 0 only) or an l1 norm ("l1", not smooth)."""
    rng = np.random.default_rng(seed)
    m = fm.Model("structures")
    w = m.variable(d, name="w")
    data = []
    for k, kind in enumerate(kinds):
        c = m.client(f"c{k}")
        X, y = rng.normal(size=(6, d)), rng.normal(size=6)
        data.append((X, y))
        loss = cp.sum_squares(c.data(X, name="X") @ w - c.data(y, name="y")) / 6
        if kind == "entr":
            loss = loss - cp.sum(cp.entr(w))
        elif kind == "l1":
            loss = loss + cp.norm(w, 1)
        c.minimize(loss, name=f"loss{k}")
    return m, data


@pytest.fixture
def found(monkeypatch):
    """The ``(structure, fact)`` pairs found by a ``find`` (not read from the cache)."""
    calls = []
    monkeypatch.setattr(partition, "_STRUCTURE_FACTS", {})
    fact = partition.PartyProgram.structure_fact

    def spy(self, name, find):
        def counted():
            calls.append((self.structure, name))
            return find()

        return fact(self, name, counted)

    monkeypatch.setattr(partition.PartyProgram, "structure_fact", spy)
    return calls


def test_parties_of_one_structure_share_its_facts_and_keep_their_own_data(found):
    model, data = _model(["ls", "ls", "ls"])
    programs = model.compile().clients
    assert len({p.structure for p in programs}) == 1
    assert [p.restricted_domain for p in programs] == [False, False, False]
    assert found == [(programs[0].structure, "restricted_domain")]  # found once
    x = np.array([0.3, -0.2, 0.5])
    for p, (X, y) in zip(programs, data):
        form = unconstrained_glm(p)
        (term,) = form.terms
        np.testing.assert_array_equal(term.A, X)  # its own matrix, in place
        assert form.evaluate(x, hessian=False)[0] == pytest.approx(
            np.sum((X @ x - y) ** 2) / 6, rel=1e-12
        )


@pytest.mark.parametrize("order", [["ls", "entr"], ["entr", "ls"]])
def test_parties_of_other_structures_get_their_own_facts(order, found):
    model, _ = _model(order)
    programs = model.compile().clients
    assert programs[0].structure != programs[1].structure
    assert [p.restricted_domain for p in programs] == [k == "entr" for k in order]
    assert len(found) == 2


def _with_abs(program, name):
    """``program`` with ``|w_0|`` added to its objective (not smooth; the DSL would
    rewrite it, so the term is put in by hand) under the party name ``name``."""
    (term,) = program.objective
    w = program.layout.variables[0]
    rough = dataclasses.replace(term, expr=term.expr + cp.abs(w[0]), label=f"rough-{name}")
    return dataclasses.replace(program, name=name, objective=[rough])


def test_a_non_smooth_term_is_refused_for_every_party_of_its_structure(found):
    model, _ = _model(["ls", "ls", "ls"])
    compiled = model.compile()
    smooth, a, b = compiled.clients
    compiled = dataclasses.replace(
        compiled, clients=[smooth, _with_abs(a, "c1"), _with_abs(b, "c2")]
    )
    assert compiled.clients[1].structure == compiled.clients[2].structure != smooth.structure
    with pytest.raises(UnsupportedError, match="rough-c1"):
        compiled.require_smooth("prox-al")
    assert (smooth.structure, "smooth") in partition._STRUCTURE_FACTS
    assert (compiled.clients[1].structure, "smooth") not in partition._STRUCTURE_FACTS
    alone = dataclasses.replace(compiled, clients=[compiled.clients[2]])
    with pytest.raises(UnsupportedError, match="rough-c2"):  # (its structure's: refused too)
        alone.require_smooth("prox-al")


def test_a_program_s_structure_is_found_again_where_it_is_received():
    (program,) = _model(["ls"])[0].compile().clients
    key = program.structure
    received = pickle.loads(pickle.dumps(program))
    assert "structure" not in received.__dict__
    assert received.structure == key


FIELDS = [
    Field(()),
    Field((), positive=True),
    Field((), dtype="int", positive=True),
    Field((), dtype="bool"),
    Field((), max_abs=10.0),
    Field(("d",)),
    Field(None, max_size=0),
]
VALUES = [0.0, 1.5, -2.0, 3, -1, 0, True, False, float("nan"), float("inf"), 1e300, 2**70]


@pytest.mark.parametrize("field", FIELDS)
def test_a_python_number_gets_the_verdict_of_its_array(field):
    """A plain bool, int or float is checked on the number itself: the same verdict, and
    the same words, as the 0-d array of it."""
    dims = {"d": 2}
    for v in VALUES:
        assert field.check(v, dims) == field.check(np.asarray(v), dims), (field, v)
