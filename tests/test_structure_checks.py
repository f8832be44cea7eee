"""Clients of one structure share the checks of their GLM forms: a family's (structures
that differ in their data's row counts alone) first client against the model's evaluator, each other
structure's first client by value at a random point against cvxpy's own arithmetic, each
standing for the others whose forms were read along the same path, the rest by value (a
wrong form is still caught there), and a client whose steps run in cohorts builds its own
Newton backend only when it is used."""

import types

import cvxpy as cp
import numpy as np
import pytest

import fedmodel as fm
from fedmodel.algorithms.proxal import cohorts
from fedmodel.compiler.fingerprint import structure_fingerprint
from fedmodel.compiler.glm import GLMFunction, GLMTerm, NotRecognised
from fedmodel.subproblems.batched_glm import GLMCohort
from fedmodel.subproblems.merit import MeritProblem
from fedmodel.subproblems.newton import NewtonSolver, party_glm
from fedmodel.subproblems.select import LazySolver


def _model(kind: str, rows=(15, 15, 15, 15, 9), sparse=False, seed=0):
    rng = np.random.default_rng(seed)
    m = fm.Model("structures")
    w = m.variable(3, name="w")
    for k, r in enumerate(rows):
        X = rng.normal(size=(r, 3))
        y = X @ np.array([1.0, -2.0, 0.5]) + 0.1 * rng.normal(size=r)
        c = m.client(f"c{k}")
        A = c.data(X, name="X")
        if kind == "ls":
            c.minimize(cp.sum_squares(A @ w - c.data(y, name="y")) / 60)
        elif kind == "logistic":
            lab = c.data(np.sign(y), name="y")
            c.minimize(cp.sum(cp.logistic(-cp.multiply(lab, A @ w) + 0.1)) / 60)
        elif kind == "huber":
            c.minimize(cp.sum(cp.huber(A @ w - c.data(y, name="y"), 0.7)) / 60)
        else:  # weighted least squares with an intercept
            wts = c.data(rng.uniform(0.5, 2.0, size=r), name="s")
            c.minimize(cp.sum(cp.multiply(wts, cp.square(A @ w + 0.3 - c.data(y, name="y")))))
    return m


def _hosts(model):
    programs = model.compile().clients
    hosts = [
        types.SimpleNamespace(
            name=p.name,
            program=p,
            glm_verified=False,
            glm_disagrees=False,
            glm_structure=None,
            glm_path=party_glm(p).path_key,
        )
        for p in programs
    ]
    return hosts, [cohorts.unconstrained_glm(p) for p in programs]


def _wrong(form: GLMFunction) -> GLMFunction:
    """``form`` with its first term's offsets moved (a recognition that misread the data)."""
    t = form.terms[0]
    bad = GLMTerm(t.kind, t.A, t.b + 1e-3, t.weights, t.M, t.s)
    return GLMFunction(form.n, [bad, *form.terms[1:]], form.Q, form.q, form.r, form.Q_symmetric)


@pytest.fixture(autouse=True)
def fresh_structures(monkeypatch):
    monkeypatch.setattr(cohorts, "_CHECKED_STRUCTURES", set())
    monkeypatch.setattr(cohorts, "_CHECKED_PATHS", set())
    monkeypatch.setattr(cohorts, "_CHECKED_FAMILIES", set())


def _spy_probes(monkeypatch) -> list[str]:
    """The names of the clients probed from now on (:func:`cohorts._cvxpy_value`)."""
    probed = []
    value = cohorts._cvxpy_value

    def spy(program, x):
        probed.append(program.name)
        return value(program, x)

    monkeypatch.setattr(cohorts, "_cvxpy_value", spy)
    return probed


@pytest.mark.parametrize("kind", ["ls", "logistic", "huber", "weighted"])
def test_only_a_family_s_first_client_builds_an_evaluator(kind, monkeypatch):
    # clients 0-3 share a structure, client 4 (9 rows) is another of the same family when
    # its form is read through its structure's nodes (weighted: each through its own)
    probed = _spy_probes(monkeypatch)
    hosts, forms = _hosts(_model(kind))
    prints = [structure_fingerprint(h.program) for h in hosts]
    assert len(set(prints[:4])) == 1 and prints[4] != prints[0]  # (9 rows: another one)
    X = np.zeros((5, 3))
    by_rows = [0, 1, 2, 3]
    cohorts.check_forms([hosts[i] for i in by_rows], GLMCohort([forms[i] for i in by_rows]), X[:4])
    cohorts.check_forms(hosts[4:], GLMCohort(forms[4:]), X[4:])
    assert all(h.glm_verified and not h.glm_disagrees for h in hosts)
    built = ["functions" in h.program.__dict__ for h in hosts]
    own_nodes = kind == "weighted"  # (then the others of a structure are probed)
    assert built == [True, False, False, False, own_nodes]
    assert probed == (["c1", "c2", "c3"] if own_nodes else ["c4"])


@pytest.mark.parametrize("kind", ["ls", "logistic", "huber"])
def test_a_family_s_other_structures_are_probed_once_each(kind, monkeypatch):
    # two structures of one family in one cohort: the first client of each is checked
    # (in full, then by value), and each stands for the others of its path
    probed = _spy_probes(monkeypatch)
    hosts, forms = _hosts(_model(kind, rows=(15, 9, 15, 9, 9)))
    cohorts.check_forms(hosts, GLMCohort(forms), np.zeros((5, 3)))
    assert all(h.glm_verified and not h.glm_disagrees for h in hosts)
    assert ["functions" in h.program.__dict__ for h in hosts] == [True] + [False] * 4
    assert probed == ["c1"]


@pytest.mark.parametrize("kind", ["ls", "logistic", "huber"])
@pytest.mark.parametrize("at", [1, 3])
@pytest.mark.parametrize("split", [False, True])
def test_a_wrong_form_of_another_structure_of_a_family_is_caught(kind, at, split):
    # a misread form of the 9-row structure: its first client (at 1: probed for its
    # structure), or one read through its own nodes (at 3: probed on its own); its family
    # checked in the same call or in an earlier one (split)
    hosts, forms = _hosts(_model(kind, rows=(15, 9, 15, 9)))
    forms[at] = _wrong(forms[at])
    if at == 3:
        hosts[at].glm_path = None
    if split:
        cohorts.check_forms(hosts[:1], GLMCohort(forms[:1]), np.zeros((1, 3)))
    with pytest.raises(NotRecognised, match=repr(hosts[at].name)):
        cohorts.check_forms(hosts, GLMCohort(forms), np.zeros((4, 3)))
    assert [h.glm_disagrees for h in hosts] == [i == at for i in range(4)]
    assert "functions" in hosts[at].program.__dict__  # (refused by value: checked in full)


@pytest.mark.parametrize("kind", ["ls", "logistic", "huber", "weighted"])
@pytest.mark.parametrize("at", [1, 3])
def test_a_wrong_form_of_a_checked_structure_is_caught_by_value(kind, at):
    hosts, forms = _hosts(_model(kind))
    hosts, forms = hosts[:4], forms[:4]
    forms[at] = _wrong(forms[at])
    hosts[at].glm_path = None  # (a form read through its own nodes is probed)
    # at w = 0 the wrong offsets of a least-squares form show in the value, not in what
    # the point alone tells about the data matrix: the probe point is random
    with pytest.raises(NotRecognised, match=repr(hosts[at].name)):
        cohorts.check_forms(hosts, GLMCohort(forms), np.zeros((4, 3)))
    assert [h.glm_disagrees for h in hosts] == [i == at for i in range(4)]
    assert not any(h.glm_verified for h in hosts)


def test_checked_structures_are_probed_in_their_clients_order():
    # a cohort of two structures (15 and 14 rows pad to 16), interleaved: once both are
    # checked, every client off its structure's path is probed at its own row, and none
    # is checked in full
    hosts, forms = _hosts(_model("ls", rows=(15, 14, 15, 14)))
    for h in hosts[2:]:
        h.glm_path = None
    cohorts.check_forms(hosts, GLMCohort(forms), np.zeros((4, 3)))
    assert len(cohorts._CHECKED_STRUCTURES) == 2
    hosts, forms = _hosts(_model("ls", rows=(15, 14, 15, 14)))
    cohorts.check_forms(hosts, GLMCohort(forms), np.zeros((4, 3)))
    assert all(h.glm_verified and not h.glm_disagrees for h in hosts)
    assert not any("functions" in h.program.__dict__ for h in hosts)


def test_a_wrong_first_form_leaves_its_structure_unchecked():
    hosts, forms = _hosts(_model("ls"))
    forms[0] = _wrong(forms[0])
    with pytest.raises(NotRecognised):
        cohorts.check_forms(hosts[:4], GLMCohort(forms[:4]), np.zeros((4, 3)))
    assert not cohorts._CHECKED_STRUCTURES
    # the others of its structure were checked in full, and agreed
    assert all("functions" in h.program.__dict__ for h in hosts[:4])
    assert [h.glm_disagrees for h in hosts[:4]] == [True, False, False, False]


def test_the_probe_agrees_with_the_evaluator():
    hosts, _ = _hosts(_model("logistic"))
    x = cohorts._probe_point(3)
    for h in hosts:
        ref = h.program.functions.objective(x)
        assert cohorts._cvxpy_value(h.program, x) == pytest.approx(ref, rel=1e-12)


def test_a_lazy_backend_is_built_at_its_first_use_and_restores_like_an_eager_one():
    program = _model("logistic").compile().clients[0]
    eager = NewtonSolver(MeritProblem([program], 1.0))
    lazy = LazySolver(
        lambda: NewtonSolver(MeritProblem([program], 1.0)), NewtonSolver.initial_state()
    )
    assert lazy.get_state() == eager.get_state() and not lazy.verified
    assert lazy.built is None
    x0 = np.zeros(3)
    for backend in (eager, lazy):
        backend.problem.set(sigma=1.0, center=np.ones(3))
    a, b = eager.solve(x0, 1e-10), lazy.solve(x0, 1e-10)
    assert lazy.built is not None and np.array_equal(a.x, b.x)
    assert lazy.get_state() == eager.get_state() and lazy.verified


def test_a_batched_client_builds_no_backend_of_its_own(monkeypatch):
    built = []
    init = NewtonSolver.__init__

    def spy(self, problem):
        built.extend(p.name for p in problem.programs)
        init(self, problem)

    monkeypatch.setattr(NewtonSolver, "__init__", spy)
    m = _model("logistic", rows=(15,) * 6)
    m.server.subject_to(cp.norm(m.variables[0], 2) <= 0.5)
    res = m.solve("prox-al", inner_solver="exact-admm", history=False)
    assert not [name for name in built if name.startswith("c")]
    ref = m.solve("prox-al", inner_solver="exact-admm", history=False, batch_clients=False)
    assert res.status == ref.status == "optimal" and res.rounds == ref.rounds
    assert np.abs(res.x - ref.x).max() <= 1e-3


def test_a_batched_client_makes_its_merit_problem_only_when_used(monkeypatch):
    """A client whose exact steps run in cohorts makes no MeritProblem in a run; one made
    later has the client's penalty and h (none) and takes a new one with it, and its route
    part's hard rows are those of that problem."""
    from fedmodel.algorithms.proxal.client import ProxALClient
    from fedmodel.subproblems.conic_prox import internal_rows

    made = []
    init = MeritProblem.__init__

    def spy(self, programs, *args):
        made.extend(p.name for p in programs)
        init(self, programs, *args)

    monkeypatch.setattr(MeritProblem, "__init__", spy)
    m = _model("logistic", rows=(15,) * 6)
    m.server.subject_to(cp.norm(m.variables[0], 2) <= 0.5)
    res = m.solve("prox-al", inner_solver="exact-admm", history=False)
    assert res.status == "optimal" and not [name for name in made if name.startswith("c")]
    program = m.compile().clients[0]
    options = fm.algorithms.proxal.ProxALOptions(beta=2.0)
    client = ProxALClient(program, options, 1.0, 6, route="exact-admm")
    assert "problem" not in client.__dict__ and client.solver.built is None
    client.objective_units = (1.0, 3.0, 1.0, 1.0)
    client.derive_parameters()
    assert client.problem.beta == client.beta == 6.0 and client.problem.regularizer.is_zero
    client.objective_units = (1.0, 0.5, 1.0, 1.0)
    client.derive_parameters()
    assert client.problem.beta == 1.0 and client.problem.programs == [program]
    rows = client.inner.hard_rows()
    assert all(np.array_equal(a, b) for a, b in zip(rows, internal_rows(client.problem)))
    assert client.solver.backend().problem is client.problem


def test_a_form_read_along_its_structure_s_path_is_verified_by_its_first_client(monkeypatch):
    """Forms read through their structure's nodes with every decision taken from values as
    for the client checked in full are neither checked in full nor probed; a form whose
    path differs is probed."""
    probed = _spy_probes(monkeypatch)
    hosts, forms = _hosts(_model("logistic"))
    hosts, forms = hosts[:4], forms[:4]
    assert len({h.glm_path for h in hosts}) == 1 and hosts[0].glm_path is not None
    hosts[2].glm_path = None
    cohorts.check_forms(hosts, GLMCohort(forms), np.zeros((4, 3)))
    assert all(h.glm_verified and not h.glm_disagrees for h in hosts)
    assert probed == ["c2"]
    assert [("functions" in h.program.__dict__) for h in hosts] == [True, False, False, False]
