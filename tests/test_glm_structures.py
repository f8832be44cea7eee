"""Parties of one structure read their GLM forms through shared nodes
(:func:`fedmodel.subproblems.newton.party_glm`): each gets its own data and, bit for bit,
the form its own expression tree gives, whatever the mix of structures in the model; a
party whose structure's flags depend on its data reads its own nodes, and a decision taken
from another party's values takes it off its structure's path."""

import gc
import sys
from pathlib import Path
from types import SimpleNamespace

import cvxpy as cp
import numpy as np
import pytest
import scipy.sparse as sp

import fedmodel as fm
from fedmodel.compiler import glm
from fedmodel.compiler.glm import (
    GLMFunction,
    NotRecognised,
    recognise_components,
    recognise_scalar,
)
from fedmodel.subproblems import newton

D = 4


@pytest.fixture(autouse=True)
def fresh_structures(monkeypatch):
    monkeypatch.setattr(newton, "_STRUCTURE_NODES", {})
    monkeypatch.setattr(newton, "_RECIPES", {})
    monkeypatch.setattr(newton, "_SKELETON_NODES", {})
    monkeypatch.setattr(glm, "_VERIFIED", set())


def _mixed_model(seed: int = 0) -> fm.Model:
    """Least squares (two row counts), logistic, huber, weighted least squares, a scaled
    quadratic form of the party's own matrix, a constrained party, and sparse data of two
    densities."""
    rng = np.random.default_rng(seed)
    m = fm.Model("mixed")
    w = m.variable(D, name="w")

    def client(name):
        return m.client(name)

    for k, rows in enumerate((10, 10, 10, 12)):  # least squares, 12 rows: another structure
        c = client(f"ls{k}")
        X, y = c.data(rng.normal(size=(rows, D)), name="X"), c.data(rng.normal(size=rows), name="y")
        c.minimize(cp.sum_squares(X @ w - y) / 40)
    for k in range(3):
        c = client(f"lg{k}")
        X = c.data(rng.normal(size=(8, D)), name="X")
        lab = c.data(np.sign(rng.normal(size=8)), name="y")
        c.minimize(cp.sum(cp.logistic(-cp.multiply(lab, X @ w))) / 24 + 0.1 * cp.sum_squares(w))
    for k in range(2):
        c = client(f"hu{k}")
        X, y = c.data(rng.normal(size=(9, D)), name="X"), c.data(rng.normal(size=9), name="y")
        c.minimize(cp.sum(cp.huber(X @ w - y, 0.5)) / 9)
    for k in range(2):
        c = client(f"wls{k}")
        s = c.data(rng.uniform(0.5, 2.0, size=7), name="s")
        X, y = c.data(rng.normal(size=(7, D)), name="X"), c.data(rng.normal(size=7), name="y")
        c.minimize(cp.sum(cp.multiply(s, cp.square(X @ w + 0.3 - y))))
    for k, P in enumerate((np.eye(D), np.triu(np.ones((D, D))) + 2 * np.eye(D))):
        c = client(f"qf{k}")  # (a symmetric matrix, then one that is not)
        c.minimize(0.5 * cp.quad_form(w, c.data(P, name="P"), assume_PSD=True) + cp.sum(w))
    for k in range(2):
        c = client(f"con{k}")
        X, y = c.data(rng.normal(size=(6, D)), name="X"), c.data(rng.normal(size=6), name="y")
        c.minimize(cp.sum_squares(X @ w - y) / 6)
        c.subject_to(cp.sum(w) <= 1.0)
        c.subject_to(w[0] == c.data(np.array(0.25 * (k + 1)), name="b"))
    for k, density in enumerate((0.9, 0.9, 0.1)):
        c = client(f"sp{k}")
        X = sp.random(12, D, density=density, random_state=seed + k, format="csr")
        y = c.data(rng.normal(size=12), name="y")
        c.minimize(cp.sum_squares(c.data(X, name="X") @ w - y) / 12)
    m.server.subject_to([w <= 1, w >= -1])
    return m


def _slow(program) -> tuple[GLMFunction, list[GLMFunction], list[GLMFunction]]:
    """The form of each term read through the party's own nodes."""
    layout = program.layout
    f = None
    for t in program.objective:
        g = recognise_scalar(t.expr, layout)
        f = g if f is None else f.plus(g)

    def components(cons):
        out = []
        for c in cons:
            if c.expr.size == 1 and c.expr.ndim == 0:
                out.append(recognise_scalar(c.expr, layout))
            else:
                out.extend(recognise_components(c.expr, layout))
        return out

    return f, components(program.ineq), components(program.eq)


def _same_function(a: GLMFunction, b: GLMFunction) -> None:
    assert a.n == b.n and len(a.terms) == len(b.terms)
    for s, t in zip(a.terms, b.terms):
        assert (s.kind, s.M, s.s) == (t.kind, t.M, t.s)
        assert sp.issparse(s.A) == sp.issparse(t.A)
        A, B = (s.A.toarray(), t.A.toarray()) if sp.issparse(s.A) else (s.A, t.A)
        for u, v in ((A, B), (s.b, t.b), (s.weights, t.weights)):
            assert np.array_equal(u, v)
    for u, v in ((a.Q, b.Q), (a.q, b.q)):
        assert (u is None) == (v is None) and (u is None or np.array_equal(u, v))
    assert a.r == b.r and a.Q_symmetric == b.Q_symmetric
    for x in np.random.default_rng(1).normal(size=(3, a.n)):
        va, ga, Ha = a.evaluate(x)
        vb, gb, Hb = b.evaluate(x)
        assert va == vb and np.array_equal(ga, gb) and np.array_equal(Ha, Hb)


def test_each_party_gets_the_form_of_its_own_tree_in_a_model_of_mixed_structures():
    programs = _mixed_model().compile().clients
    forms = {p.name: newton.party_glm(p) for p in programs}
    for p in programs:
        form, (f, ineq, eq) = forms[p.name], _slow(p)
        _same_function(form.f, f)
        assert len(form.ineq) == len(ineq) and len(form.eq) == len(eq)
        for a, b in zip(form.ineq + form.eq, ineq + eq):
            _same_function(a, b)
    # each party's own data, not its structure's first party's
    for name in ("ls1", "ls2", "lg1", "hu1", "wls1", "sp1"):
        first = name[:-1] + "0"
        A, B = forms[name].f.terms[0].A, forms[first].f.terms[0].A
        A, B = (A.toarray(), B.toarray()) if sp.issparse(A) else (A, B)
        assert A.shape == B.shape and not np.array_equal(A, B)
    assert forms["con1"].eq[0].r != forms["con0"].eq[0].r
    assert not np.array_equal(forms["qf1"].f.Q, forms["qf0"].f.Q)


def test_a_party_reads_its_structure_s_path_unless_a_value_decides_otherwise():
    programs = {p.name: p for p in _mixed_model().compile().clients}
    same = {name: newton.party_glm(p).same_path for name, p in programs.items()}
    # one path per structure of data-independent flags, the structure's first party's
    assert all(same[n] for n in ("ls0", "ls1", "ls2", "ls3", "lg0", "lg2", "hu1", "con1"))
    # the same data-independent flags, but the density of the data decides its storage
    assert same["sp0"] and same["sp1"] and not same["sp2"]
    # a product by the party's own weights: flags follow the weights' signs; a quadratic
    # form of the party's own matrix: its curvature follows the matrix: their own nodes
    assert not any(same[n] for n in ("wls0", "wls1", "qf0", "qf1"))
    assert programs["ls3"].structure != programs["ls0"].structure


def test_a_batched_solve_of_mixed_structures_is_the_per_client_solve():
    """Clients of four structures, two of them with two row counts, in one batched run:
    the iterates of the run with every client on its own."""
    rng = np.random.default_rng(5)
    m = fm.Model("mixed-solve")
    w = m.variable(D, name="w")
    for k in range(8):
        c = m.client(f"c{k}")
        rows = 9 if k % 3 else 14
        X = c.data(rng.normal(size=(rows, D)), name="X")
        y = rng.normal(size=rows)
        if k % 2:
            c.minimize(cp.sum_squares(X @ w - c.data(y, name="y")) / 80)
        else:
            lab = c.data(np.sign(y), name="y")
            c.minimize(cp.sum(cp.logistic(-cp.multiply(lab, X @ w))) / 80)
    m.server.subject_to(cp.norm(w, 2) <= 0.5)
    opts = dict(inner_solver="exact-admm", history=False)
    res = m.solve("prox-al", **opts)
    ref = m.solve("prox-al", batch_clients=False, **opts)
    assert res.status == ref.status == "optimal" and res.rounds == ref.rounds
    assert np.abs(res.x - ref.x).max() <= 1e-9 * max(1.0, np.abs(ref.x).max())


def test_a_structure_s_nodes_leave_with_the_party_they_were_made_from():
    """The shared nodes hold the expressions of the party they were made from: they leave
    with it (the next party of the structure makes them again)."""
    programs = _mixed_model().compile().clients
    form = newton.party_glm(programs[0])
    key = programs[0].structure
    assert newton._STRUCTURE_NODES[key] is not None and form.path_key[0] == key
    del programs, form
    gc.collect()
    assert key not in newton._STRUCTURE_NODES
    again = _mixed_model().compile().clients[0]
    assert newton.party_glm(again).same_path and key in newton._STRUCTURE_NODES


def test_structures_of_other_row_counts_take_the_flags_of_their_skeleton_s_nodes(monkeypatch):
    """Structures whose terms differ in their data's shapes alone (one skeleton:
    :func:`~fedmodel.compiler.fingerprint.structure_skeleton`) make their nodes with the
    flags of the first of them made (:func:`~fedmodel.compiler.glm.node_like`): each
    party's form is still, bit for bit, the one its own tree gives; the skeleton's nodes
    leave with the party they were made from."""
    rng = np.random.default_rng(7)
    m = fm.Model("rows")
    w = m.variable(D, name="w")
    for k in range(12):
        c = m.client(f"c{k}")
        rows = 6 + k % 4
        X = c.data(rng.normal(size=(rows, D)), name="X")
        lab = c.data(np.sign(rng.normal(size=rows)), name="y")
        c.minimize(cp.sum(cp.logistic(-cp.multiply(lab, X @ w))) / 48 + 0.1 * cp.sum_squares(w))
    programs = m.compile().clients
    assert len({p.structure for p in programs}) == 4
    made = []
    monkeypatch.setattr(
        newton, "node_of", lambda e, leaves: made.append(e) or glm.node_of(e, leaves)
    )
    forms = [newton.party_glm(p) for p in programs]
    assert len(made) == 1 and len(newton._SKELETON_NODES) == 1  # (the first structure's)
    for p, form in zip(programs, forms):
        _same_function(form.f, _slow(p)[0])
    del m, c, X, lab, programs, forms, p, form
    gc.collect()
    assert not newton._SKELETON_NODES and not newton._STRUCTURE_NODES


def test_the_structure_walk_finds_each_term_s_leaves_as_recognition_numbers_them():
    """The walk that fingerprints a party's structure also finds its terms' leaves, which
    recognition reads instead of walking the terms again: the leaves of
    :func:`~fedmodel.compiler.glm.expression_leaves`, the same objects in the same order;
    a program received by pickling finds them again with its structure (and recognises
    its form again: a program keeps its form, but does not send it)."""
    import pickle

    from fedmodel.compiler.glm import expression_leaves

    programs = _mixed_model().compile().clients
    for p in programs:
        assert p.structure
        for term in [t.expr for t in p.objective] + [c.expr for c in p.constraints]:
            found = p.term_leaves(term)
            assert found is not None
            assert [id(e) for e in found] == [id(e) for e in expression_leaves(term, [])]
        assert p.term_leaves(cp.Variable(2) + 1) is None
    form = newton.party_glm(programs[0])
    assert newton.party_glm(programs[0]) is form is programs[0].kept_glm_form
    received = pickle.loads(pickle.dumps(programs[0]))
    term = received.objective[0].expr
    # (neither the leaves nor the form are pickled: found again where it is received)
    assert received.term_leaves(term) is None and received.kept_glm_form is None
    assert received.structure
    assert [id(e) for e in received.term_leaves(term)] == [
        id(e) for e in expression_leaves(term, [])
    ]


def _values_model() -> fm.Model:
    """Parties of one structure whose values take recognition along other paths (a zero
    data matrix, sparse data without entries or dense-ish, a private scalar of either
    sign or read as a constant) and parties of two structures that differ in a constant only."""
    rng = np.random.default_rng(3)
    m = fm.Model("values")
    w = m.variable(D, name="w")
    for k, X in enumerate((rng.normal(size=(6, D)), np.zeros((6, D)), rng.normal(size=(6, D)))):
        c = m.client(f"ls{k}")
        y = c.data(np.zeros(6) if k == 2 else rng.normal(size=6), name="y")
        c.minimize(cp.sum_squares(c.data(X, name="X") @ w - y) / 40)
    for k, X in enumerate(
        (sp.csr_matrix((8, D)), sp.random(8, D, density=0.9, random_state=1, format="csr"))
    ):
        c = m.client(f"sp{k}")
        b = c.data(rng.normal(size=8), name="b")
        c.minimize(cp.sum_squares(c.data(X, name="X") @ w + b) / 8)
    for k, s in enumerate((2.0, -3.0, 0.0)):
        c = m.client(f"sg{k}")
        X = c.data(rng.normal(size=(5, D)), name="X")
        c.minimize(cp.sum(cp.logistic(c.data(np.array(s), name="s") * (X @ w))) / 5)
    for k, v in enumerate((2.0, 5.0)):  # (a private scalar read as a constant's value)
        c = m.client(f"qo{k}")
        X = c.data(rng.normal(size=(4, D)), name="X")
        c.minimize(cp.quad_over_lin(X @ w, c.data(np.array(v), name="v")))
    for k, scale in enumerate((40.0, 41.0)):
        c = m.client(f"k{k}")
        X, y = c.data(rng.normal(size=(6, D)), name="X"), c.data(rng.normal(size=6), name="y")
        c.minimize(cp.sum_squares(X @ w - y) / scale)
    return m


def test_parties_of_one_structure_whose_values_differ_get_the_forms_of_their_own_trees():
    programs = {p.name: p for p in _values_model().compile().clients}
    forms = {name: newton.party_glm(p) for name, p in programs.items()}
    for name, p in programs.items():
        form, (f, ineq, eq) = forms[name], _slow(p)
        _same_function(form.f, f)
        assert not form.ineq and not form.eq and not ineq and not eq
    for group in (("ls0", "ls1", "ls2"), ("sp0", "sp1"), ("sg0", "sg1", "sg2"), ("qo0", "qo1")):
        assert len({programs[n].structure for n in group}) == 1
        assert all(forms[n].path_key is not None for n in group)
    # the empty sparse matrix is a constant to the sum, the dense-ish one is stored dense
    assert forms["sp0"].path_key != forms["sp1"].path_key
    # each its own scalar: the terms' data are the products by each party's own sign
    for name in ("sg1", "sg2"):
        assert not np.array_equal(forms[name].f.terms[0].A, forms["sg0"].f.terms[0].A)
    assert not np.any(forms["sg2"].f.terms[0].A)
    assert np.all(forms["qo0"].f.terms[0].weights == 0.5)
    assert np.all(forms["qo1"].f.terms[0].weights == 0.2)
    # the constant that tells two structures apart is each structure's own
    assert programs["k0"].structure != programs["k1"].structure
    w0, w1 = forms["k0"].f.terms[0].weights, forms["k1"].f.terms[0].weights
    assert np.all(w0 == 1.0 / 40.0) and np.all(w1 == 1.0 / 41.0)


def _read_in_full(program) -> newton._PartyGLM:
    """``program``'s form read through its structure's nodes, its recipe set aside."""
    key = program.structure
    kept = newton._RECIPES.get(key)
    newton._RECIPES[key] = None
    try:
        return newton._PartyGLM(program)
    finally:
        newton._RECIPES[key] = kept


def _zoo():
    """Every model of the benchmarks' suite (quick sizes), the scaling cases' two GLM
    models and this module's models."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import models as suite
    import scaling

    yield "mixed", _mixed_model()
    yield "values", _values_model()
    for name, (make, _) in suite.MODELS.items():
        yield name, make(True).model
    for name in ("ls-box-n30", "logistic-ball-n30"):
        yield name, scaling.build(name).model


def test_replayed_forms_are_the_forms_read_in_full_array_for_array():
    """Every party of every model: its form, replayed from its structure's recipe when
    it has one, equals bit for bit the form read in full, with the same path; every
    party of a structure beyond its first two (the recorded one, the one its replay is
    compared with, unless a recipe of the same operations was) whose decisions come out
    as its first's is replayed, unless a form has a quadratic part (whose rules do not
    record their decisions); no other party is."""
    replayed = 0
    for name, model in _zoo():
        # (an earlier model's programs of a structure of this one, collected in the middle
        # of its loop, would take that structure's nodes and recipe with them)
        gc.collect()
        seen: dict[str, int] = {}
        for p in model.compile().parties:
            try:
                form = newton._PartyGLM(p)
            except NotRecognised:
                with pytest.raises(NotRecognised):
                    _read_in_full(p)
                continue
            full = _read_in_full(p)
            made = [form.f, *form.ineq, *form.eq]
            assert glm.same_forms(made, [full.f, *full.ineq, *full.eq]), (name, p.name)
            assert (form.path_key, form.same_path) == (full.path_key, full.same_path), name
            if form.path_key is None or any(f is not None and f.Q is not None for f in made):
                continue
            seen[p.structure] = k = seen.get(p.structure, 0) + 1
            if k == 1 or not form.same_path:
                assert not form.replayed, (name, p.name)
            elif k > 2:  # (the second: replayed when a recipe of its operations was compared)
                assert form.replayed, (name, p.name)
            replayed += form.replayed
    assert replayed >= 60


def test_a_party_whose_values_decide_otherwise_is_read_in_full():
    """A replay takes each decision again from the party's values: the sparse party whose
    density changes its storage, and a leaf of another shape or storage than recorded,
    stop it; the party is then read in full."""
    programs = {p.name: p for p in _mixed_model().compile().clients}
    forms = {name: newton.party_glm(p) for name, p in programs.items()}
    # (each structure's first party is recorded, its second compared with the replay)
    assert forms["ls2"].replayed and not forms["ls0"].replayed
    assert forms["sp1"].path_key == forms["sp0"].path_key
    assert not forms["sp2"].replayed and forms["sp2"].path_key != forms["sp0"].path_key
    recipe = newton._RECIPES[programs["ls0"].structure][0]
    leaves = [
        leaf for t in programs["ls2"].objective for leaf in programs["ls2"].term_leaves(t.expr)
    ]
    assert glm.same_forms(recipe.replay(leaves), [forms["ls2"].f])
    X = next(i for i, leaf in enumerate(leaves) if getattr(leaf, "data_name", "") == "X")
    for other in (np.ones((11, D)), sp.csr_matrix(np.ones((10, D)))):
        changed = list(leaves)
        changed[X] = SimpleNamespace(value=other)
        assert recipe.replay(changed) is None


def _alternating_model() -> fm.Model:
    """Parties of one skeleton whose terms differ in a constant, a data's shape or its
    storage, in turn."""
    rng = np.random.default_rng(4)
    m = fm.Model("alternating")
    w = m.variable(D, name="w")
    for k in range(12):
        c = m.client(f"a{k}")
        rows = (6, 6, 7)[k % 3]
        X = rng.normal(size=(rows, D))
        X = c.data(sp.csr_matrix(X) if k % 4 == 3 else X, name="X")
        y = c.data(rng.normal(size=rows), name="y")
        c.minimize(cp.sum_squares(X @ w - y) / (40.0 if k % 2 else 41.0))
    return m


def _assert_read_as_walked(monkeypatch, programs: list, read: list) -> None:
    """Each of ``programs``' :func:`~fedmodel.compiler.fingerprint.structure_reading`
    in ``read`` is the walk's of its terms: the same structure, terms and leaves."""
    from fedmodel.compiler import fingerprint

    monkeypatch.setattr(fingerprint, "_MATCHERS", {})
    monkeypatch.setattr(fingerprint, "MATCHERS_PER_KEY", 0)  # (every party walked)
    for p, (digest, leaves) in zip(programs, read):
        walked, walked_leaves = fingerprint.structure_reading(p)
        assert digest == walked, p.name
        assert leaves.keys() == walked_leaves.keys()
        for key, (expr, found) in leaves.items():
            assert expr is walked_leaves[key][0]
            assert [id(e) for e in found] == [id(e) for e in walked_leaves[key][1]]


def test_a_structure_read_by_its_skeleton_s_matcher_is_the_walk_s(monkeypatch):
    """Every party's structure and term leaves, read by a matcher of its terms' skeleton
    when one matches (:func:`~fedmodel.compiler.fingerprint.structure_reading`), are those
    of the walk of its terms; parties that differ in a constant, a shape or a storage get
    their own structures."""
    from fedmodel.compiler import fingerprint

    monkeypatch.setattr(fingerprint, "_MATCHERS", {})
    monkeypatch.setattr(fingerprint, "_TALLY", {})
    programs = [p for _, model in _zoo() for p in model.compile().parties]
    programs += _alternating_model().compile().clients
    read = [fingerprint.structure_reading(p) for p in programs]
    assert sum(hits for hits, _ in fingerprint._TALLY.values()) >= 100
    _assert_read_as_walked(monkeypatch, programs, read)
    alternating = {p.name: d for p, (d, _) in zip(programs, read) if p.name.startswith("a")}
    for k in range(12):  # (a constant, a shape, a storage: their own structures)
        same = [j for j in range(12) if alternating[f"a{j}"] == alternating[f"a{k}"]]
        assert all(j % 2 == k % 2 and (j % 3 == 2) == (k % 3 == 2) for j in same)
        assert all((j % 4 == 3) == (k % 4 == 3) for j in same)


def test_parties_whose_atoms_data_or_constants_differ_are_other_structures(monkeypatch):
    """A matcher compares each atom's own data (an axis, here) and each constant (its
    type, shape and bytes) with its skeleton's: parties that differ in an axis or in a
    constant have the structures their walks give."""
    from fedmodel.compiler import fingerprint

    monkeypatch.setattr(fingerprint, "_MATCHERS", {})
    monkeypatch.setattr(fingerprint, "_TALLY", {})
    rng = np.random.default_rng(6)
    m = fm.Model("atom-data")
    w = m.variable(D, name="w")
    for k in range(12):
        c = m.client(f"c{k}")
        Z = c.data(rng.normal(size=(D, D)), name="Z")
        scale = np.array(2.0 if k % 3 else 3.0)
        c.minimize(cp.sum_squares(Z @ w) + cp.sum_squares(cp.sum(Z, axis=k % 2)) * scale)
    programs = m.compile().clients
    read = [fingerprint.structure_reading(p)[0] for p in programs]
    assert sum(hits for hits, _ in fingerprint._TALLY.values()) >= 4  # (matchers read them)
    monkeypatch.setattr(fingerprint, "_MATCHERS", {})
    monkeypatch.setattr(fingerprint, "MATCHERS_PER_KEY", 0)  # (every party walked)
    assert read == [fingerprint.structure_reading(p)[0] for p in programs]
    assert len(set(read)) == 4


def test_owned_variables_of_one_size_and_other_shapes_are_other_structures(monkeypatch):
    """Parties whose owned variables sit at the same place with the same size but another
    shape (a (2, 3) and a (3, 2) matrix, summed alike) have other structures: the matcher
    of one party's skeleton does not read the other's terms as its own."""
    from fedmodel.compiler import fingerprint

    monkeypatch.setattr(fingerprint, "_MATCHERS", {})
    monkeypatch.setattr(fingerprint, "_TALLY", {})
    rng = np.random.default_rng(5)
    m = fm.Model("owned-shapes")
    w = m.variable(2, name="w")
    for k in range(8):
        c = m.client(f"c{k}")
        v = c.variable((2, 3) if k % 2 else (3, 2), name=f"v{k}")
        X = c.data(rng.normal(size=(5, 2)), name="X")
        y = c.data(rng.normal(size=5), name="y")
        c.minimize(cp.sum_squares(X @ w - y) + cp.sum(v))
    programs = [p.local() for p in m.compile().clients]  # (over its own view: (w, v))
    read = [fingerprint.structure_reading(p) for p in programs]
    monkeypatch.setattr(fingerprint, "_MATCHERS", {})
    monkeypatch.setattr(fingerprint, "MATCHERS_PER_KEY", 0)  # (every party walked)
    walked = [fingerprint.structure_reading(p)[0] for p in programs]
    assert sum(hits for hits, _ in fingerprint._TALLY.values()) >= 4  # (matchers read them)
    assert [d for d, _ in read] == walked
    assert walked[0] != walked[1] and len(set(walked)) == 2


def test_a_matcher_tells_data_names_apart_and_gives_every_term_s_leaves(monkeypatch):
    """A matcher collects each private data's name, shape and storage: parties whose data
    differ in name only have other structures, as their walks give; every objective term
    and constraint of a matched party gets the leaves its walk gives."""
    from fedmodel.compiler import fingerprint

    rng = np.random.default_rng(7)
    m = fm.Model("data-names")
    w = m.variable(D, name="w")
    for k in range(12):
        c = m.client(f"c{k}")
        X = c.data(rng.normal(size=(5, D)), name="X" if k % 2 else "Z")
        c.minimize(cp.sum_squares(X @ w - c.data(rng.normal(size=5), name="y")), name="fit")
        c.minimize(cp.sum_squares(w) / 10, name="ridge")
        c.subject_to(cp.sum(X @ w) <= 1.0)
    monkeypatch.setattr(fingerprint, "_MATCHERS", {})
    monkeypatch.setattr(fingerprint, "_TALLY", {})
    programs = m.compile().clients
    read = [fingerprint.structure_reading(p) for p in programs]
    assert sum(hits for hits, _ in fingerprint._TALLY.values()) >= 8  # (matchers read them)
    assert all(len(leaves) == 3 for _, leaves in read)
    assert len({digest for digest, _ in read}) == 2
    _assert_read_as_walked(monkeypatch, programs, read)


def test_a_matcher_reads_what_a_plain_getter_returns_and_calls_any_other():
    """A matcher reads the attribute a property returns when its getter is
    ``return self.<attribute>`` (cvxpy's shapes and constants' values), and calls any
    other getter, and any getter of a class with its own attribute lookup."""
    from fedmodel.compiler.fingerprint import _attribute_read
    from fedmodel.dsl.data import PrivateData

    x = cp.Variable(3)
    assert _attribute_read(type(cp.sum(x)), "shape") == "_shape"
    assert _attribute_read(cp.Variable, "shape") == "_shape"
    assert _attribute_read(PrivateData, "value") == "_value"

    class Declared(cp.Constant):
        @property
        def shape(self):
            return self._declared

    class Reversed(cp.Constant):
        @property
        def shape(self):
            return self._shape[::-1]

    class Looked(cp.Constant):
        def __getattribute__(self, name):
            return super().__getattribute__(name)

    assert _attribute_read(Declared, "shape") == "_declared"
    assert _attribute_read(Declared, "value") == "_value"
    assert _attribute_read(Reversed, "shape") == "shape"
    assert _attribute_read(Looked, "shape") == "shape"
    assert _attribute_read(SimpleNamespace, "shape") == "shape"  # (no property)


def _logistic_model() -> fm.Model:
    """Logistic clients of two row counts (two structures of the same operations)."""
    rng = np.random.default_rng(6)
    m = fm.Model("logistic")
    w = m.variable(D, name="w")
    for k, rows in enumerate((6, 6, 6, 6, 7, 7, 7)):
        c = m.client(f"lg{k}")
        X = c.data(rng.normal(size=(rows, D)), name="X")
        y = c.data(np.sign(rng.normal(size=rows)), name="y")
        c.minimize(cp.sum(cp.logistic(-cp.multiply(y, X @ w))) / 40)
    return m


def test_a_replayed_rows_product_is_made_at_its_first_use_or_written_to_a_cohort():
    """A replayed term whose data matrix is a product ``c[:, None] * X`` defers it
    (:class:`~fedmodel.compiler.glm.RowsTerm`): a cohort of such forms has the blocks, bit
    for bit, of a cohort of the forms read in full, without making the products; a
    product made later is the full reading's, and a scaled term defers it too."""
    from fedmodel.subproblems.batched_glm import GLMCohort

    programs = _logistic_model().compile().clients
    forms = [newton.party_glm(p).f for p in programs]
    full = [_read_in_full(p).f for p in programs]
    deferred = [f.terms[0] for f in forms if type(f.terms[0]) is glm.RowsTerm]
    assert len(deferred) == 4  # (each structure's first two are read in full)
    assert all("A" not in t.__dict__ for t in deferred)
    for a, b in zip(GLMCohort(forms).terms, GLMCohort(full).terms):
        assert a.s == b.s == 1.0 and len(a.blocks) == len(b.blocks) == 2
        for u, v in zip(a.blocks, b.blocks):
            for x, y in ((u.A, v.A), (u.b, v.b), (u.w, v.w)):
                assert x.shape == y.shape and x.tobytes() == y.tobytes()
    assert all("A" not in t.__dict__ for t in deferred)
    scaled = [f.scaled(0.5) for f in forms]
    assert [type(f.terms[0]) for f in scaled] == [type(f.terms[0]) for f in forms]
    assert all("A" not in f.terms[0].__dict__ for f in scaled if type(f.terms[0]) is glm.RowsTerm)
    assert glm.same_forms(scaled, [f.scaled(0.5) for f in full])
    assert glm.same_forms(forms, full) and all(t.A.flags.c_contiguous for t in deferred)
    assert all(glm.row_count(t) == t.A.shape[0] and glm.dense_data(t) for t in deferred)


def test_a_rows_product_of_other_shapes_is_not_deferred():
    """The deferred product (:func:`~fedmodel.compiler.glm._deferred_rows_times`) is
    deferred only for float arrays (of the float descriptor itself) of matching rows;
    otherwise it is the product itself, failing as it fails (a replay on such leaves is
    then None)."""
    c, X = np.arange(3.0), np.ones((3, 2))
    assert type(glm._deferred_rows_times(c, X)) is glm.DeferredRows
    assert glm._deferred_rows_times(c, X).made().tobytes() == (c[:, None] * X).tobytes()
    F = np.asfortranarray(np.arange(6.0).reshape(3, 2))  # (deferred, made C-contiguous)
    made = glm._deferred_rows_times(c, F).made()
    assert made.flags.c_contiguous and made.tobytes() == glm._contiguous(c[:, None] * F).tobytes()
    tagged = np.dtype(float, metadata={"tag": 1})  # (== float, not the float descriptor)
    others = ((c[:1], X), (c.astype(np.float32), X), (c, X.astype(int)), (c, X.astype(tagged)))
    for cc, XX in others:
        out = glm._deferred_rows_times(cc, XX)
        assert type(out) is np.ndarray and out.tobytes() == glm._rows_times(cc, XX).tobytes()
    for cc, XX in ((np.arange(4.0), X), (c, sp.csr_matrix(X))):
        with pytest.raises(ValueError):
            glm._rows_times(cc, XX)
        with pytest.raises(ValueError):
            glm._deferred_rows_times(cc, XX)
    programs = _logistic_model().compile().clients
    for p in programs:
        newton.party_glm(p)
    recipe = newton._RECIPES[programs[0].structure][0]
    leaves = [leaf for t in programs[2].objective for leaf in programs[2].term_leaves(t.expr)]
    X = next(i for i, leaf in enumerate(leaves) if getattr(leaf, "data_name", "") == "X")
    changed = list(leaves)
    changed[X] = SimpleNamespace(value=np.ones((7, D)))
    assert recipe.replay(changed) is None


def test_flat_float_and_product_operations_answer_a_flat_float_array_at_once():
    """A replay's conversions (:func:`~fedmodel.compiler.glm._as_float`,
    :func:`~fedmodel.compiler.glm._flat`, :func:`~fedmodel.compiler.glm._matvec`) give
    a float array of the float dtype (itself, or its flat view) at once: the bits, shape
    and storage the general conversion gives; any other value (another dtype, one equal
    to float but not the same, more dimensions, strided, sparse, a 2-D product) takes
    the general conversion."""
    tagged = np.dtype(float, metadata={"tag": 1})  # (== float, not the float descriptor)
    x = np.arange(6.0)
    values = [
        x,
        x[::2],
        x.reshape(2, 3),
        np.asfortranarray(x.reshape(2, 3)),
        x.astype(np.float32),
        x.astype(int),
        x.astype(">f8"),
        x.astype(tagged),
        np.float64(2.0),
        3,
    ]
    for v in values:
        general = np.asarray(v, dtype=float)
        out = glm._as_float(v)
        assert (out is v) == (general is v)
        assert out.dtype == general.dtype and out.shape == general.shape
        assert out.tobytes() == general.tobytes()
        flat = glm._flat(v)
        general = np.asarray(v, dtype=float).ravel(order="F")
        assert flat is not v and flat.dtype == general.dtype and flat.shape == general.shape
        assert flat.tobytes() == general.tobytes()
        assert np.shares_memory(flat, v) == np.shares_memory(general, v)
    S = sp.csr_matrix(x.reshape(2, 3))
    assert glm._flat(S).tobytes() == x.reshape(2, 3).ravel("F").tobytes()
    C = np.arange(12.0).reshape(4, 3) - 5.0
    for b in (np.array([1.0, -0.0, 2.5]), np.zeros(3), np.ones((3, 2)), np.ones((3, 1))):
        general = np.asarray(C @ b).ravel()
        for M in (C, sp.csr_matrix(C)):
            out = glm._matvec(M, b)
            assert type(out) is np.ndarray and out.shape == general.shape
            assert out.tobytes() == general.tobytes()
    with pytest.raises(ValueError):
        glm._matvec(C, np.ones(4))


def test_a_tape_tells_its_constants_by_their_type_alone():
    """:func:`~fedmodel.compiler.glm._untracked` (a tape's constants that are never its
    slots) answers as ``isinstance`` with :data:`~fedmodel.compiler.glm._UNTRACKED`, for
    the arrays and floats it answers at once and the subclasses and other types it
    does not."""
    import enum

    class Flag(enum.IntEnum):
        ON = 1

    class Real(float):
        pass

    class Array(np.ndarray):
        pass

    values = [np.ones(2), 2.5, np.float64(2.5), Real(2.5), np.ones(2).view(Array), 3, True]
    values += [np.bool_(True), "s", None, Flag.ON, sp.csr_matrix((1, 1)), (1,)]
    for v in values:
        assert glm._untracked(v) == isinstance(v, glm._UNTRACKED), v
    tape = glm.Tape()
    x, y = np.ones(2), 2.5
    tape.record(np.add, (x, y), x + y, False)
    assert tape.ops == [] and tape.slot(3) is None and tape.slot(x) is None
    tape.slots[id(x)] = 0
    out = x + y
    tape.record(np.add, (x, y), out, False)
    assert tape.ops == [(np.add, ((True, 0), (False, y)), False, None)]
    assert tape.slot(out) == 0 and tape.slot(True) is None
