"""Hierarchies, hierarchical matrices and coordination sequences (seed 004 Section V-A)."""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest

from fedmodel.algorithms.topology import (
    Coordination,
    build_hierarchy,
    metropolis_weights,
    topology_graph,
)
from fedmodel.errors import ModelError

NAMES = ["a", "b", "c", "d", "e"]


def test_paper_matrix_gives_order_1_2_3():
    h = build_hierarchy([[1, 1, 0], [0, 1, 1], [0, 0, 0]], ["1", "2", "3"])
    assert h.order == ["1", "2", "3"]
    assert h.edges == [("1", "2"), ("2", "3")]
    assert h.root == "3"
    assert h.matrix(["1", "2", "3"]).tolist() == [[1, 1, 0], [0, 1, 1], [0, 0, 0]]


@pytest.mark.parametrize(
    "graph",
    [
        nx.path_graph(NAMES),
        nx.cycle_graph(NAMES),
        nx.complete_graph(NAMES),
        nx.relabel_nodes(nx.balanced_tree(2, 2), dict(enumerate("abcdefg"))),
    ],
)
def test_levels_are_independent_sets_and_the_root_is_last(graph):
    names = sorted(graph.nodes)
    h = build_hierarchy(graph, names)
    assert h.order[-1] == h.root and not h.higher[h.root]
    for group in h.levels:
        assert not any(graph.has_edge(u, v) for u in group for v in group if u != v)
    for lo, hi in h.edges:
        assert h.level[lo] < h.level[hi]
        assert h.order.index(lo) < h.order.index(hi)
    assert len(h.edges) == graph.number_of_edges()
    # every node except the root can pass its residual report upwards
    assert all(h.higher[s] for s in h.order if s != h.root)


def test_root_and_order_options():
    g = nx.path_graph(NAMES)
    h = build_hierarchy(g, NAMES, root="c")
    assert h.root == "c" and h.levels[0] == ["a", "e"]
    h = build_hierarchy(g, NAMES, order=["a", "b", "c", "d", "e"])
    assert h.order == NAMES
    with pytest.raises(ModelError, match="root 'z'"):
        build_hierarchy(g, NAMES, root="z")
    with pytest.raises(ModelError, match="either root= or order="):
        build_hierarchy(g, NAMES, root="a", order=NAMES)


def test_digraph_is_read_as_a_hierarchical_network():
    g = nx.DiGraph([("a", "c"), ("b", "c"), ("c", "e"), ("d", "e")])
    h = build_hierarchy(g, NAMES)
    assert h.root == "e" and h.levels == [["a", "b", "d"], ["c"], ["e"]]
    g.add_edge("e", "a")
    with pytest.raises(ModelError, match="cycle"):
        build_hierarchy(g, NAMES)


def test_star_and_server_node():
    h = build_hierarchy("star", NAMES)
    assert h.root == "server" and h.levels == [NAMES, ["server"]]
    with pytest.raises(ModelError, match="not clients \\['server'\\]"):
        build_hierarchy("star", NAMES, allow_server=False)


def test_metropolis_weights_are_doubly_stochastic():
    g = topology_graph("ring", NAMES)
    W = metropolis_weights(g, NAMES)
    P = np.array([[W[i].get(j, 0.0) for j in NAMES] for i in NAMES])
    assert np.allclose(P.sum(axis=0), 1) and np.allclose(P.sum(axis=1), 1)
    assert np.allclose(P, P.T) and (P >= 0).all()


def test_coordination_modes():
    full = Coordination("full", NAMES)
    assert full.sequence(1, 1) == NAMES and full.is_full
    rnd = Coordination("random", NAMES, fraction=0.4, random_state=0)
    seqs = [rnd.sequence(1, v) for v in range(1, 2001)]
    assert all(len(s) == 2 and s == sorted(s, key=NAMES.index) for s in seqs)
    counts = np.array([rnd.visits[s] for s in NAMES])
    assert counts.min() / counts.max() > 0.9
    assert rnd.sequence(1, 1, full=True) == NAMES  # forced full cycle
    greedy = Coordination("greedy", NAMES, fraction=0.4)
    scores = {"a": 9.0, "b": 8.0, "c": 0.0, "d": 0.0, "e": 0.0}
    seen = set()
    first = greedy.sequence(1, 1, scores=scores)
    assert first == ["a", "b"]  # the largest scores
    for v in range(2, 7):
        seen |= set(greedy.sequence(1, v, scores=scores))
    assert seen == set(NAMES)  # nobody starves: stale nodes are taken first
    rep = Coordination(["a", "a", "c"], NAMES)
    assert rep.sequence(1, 1) == ["a", "a", "c"]
    drop = Coordination("full", NAMES, dropout=0.5, random_state=1)
    assert not drop.is_full and len(drop.sequence(1, 1)) < len(NAMES) + 1
    rec = Coordination(lambda k, v, order: order[v % 2 :], NAMES)
    assert rec.sequence(1, 1) == NAMES[1:] and rec.sequence(1, 2) == NAMES
    with pytest.raises(ModelError, match="unknown nodes"):
        Coordination(["a", "zz"], NAMES)
    with pytest.raises(ModelError, match="dropout"):
        Coordination("full", NAMES, dropout=1.0)
