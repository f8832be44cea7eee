"""Topologies and client coordination sequences of seed 004 (Fed-DALD-DC, DGD).

A peer-to-peer topology is turned into a :class:`Hierarchy` (seed 004 Definitions 2-3):
every edge is oriented from a lower-level node to a higher-level node (the consensus
constraint ``x_i - x_j = 0`` with ``j > i`` of eq. 16), nodes are grouped in levels (a
node's level is one more than the highest level among its lower neighbours, so nodes of
one level share no edge and can solve in parallel) and the unique root (the node with no
higher neighbour) is solved last.

Accepted descriptions (:func:`build_hierarchy`):

* an undirected :class:`networkx.Graph` whose nodes are the model's client names (plus
  ``"server"`` where allowed). The orientation comes from ``order=`` (a list of all nodes,
  lowest first) or, by default, from the breadth-first distance to ``root=`` (default: the
  last client in model order, or ``"server"`` when it is a node): farther nodes come first,
  ties are broken by model order. A path ``c0 - c1 - c2`` therefore gives the solve order
  ``c0, c1, c2`` (the paper's chain);
* a :class:`networkx.DiGraph` read as a hierarchical network: an edge ``u -> v`` means
  ``u`` is a direct descendant (lower level) of ``v``; it must be acyclic with one root;
* a hierarchical matrix ``H`` (Definition 3, an ``n x n`` array): ``H[i, j] = 1`` if node
  ``i`` is a direct descendant of node ``j``, ``H[i, i]`` = out-degree of ``i``; row ``i``
  is the ``i``-th client in model order (or ``nodes[i]``);
* the strings ``"chain"``, ``"ring"``, ``"complete"`` (clients in model order) and
  ``"star"`` (every client linked to ``"server"``, the root).

A disconnected topology, nodes that are not the model's clients, a non-square or
inconsistent hierarchical matrix, a cycle, or several roots raise
:class:`~fedmodel.errors.ModelError` naming the problem.

:class:`Coordination` produces the sequence of nodes solved in each inner iteration:
full-cycle, partial-cycle (random or greedy selection), selective-repetitive (an explicit
sequence with repetitions), dropout, or any callable (online reconfiguration).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import networkx as nx
import numpy as np

from fedmodel.errors import ModelError

SERVER = "server"


@dataclass
class Hierarchy:
    """A hierarchical network (seed 004 Definition 2) over named nodes.

    Attributes
    ----------
    order : list of str
        The full-cycle solve order: by level (bottom first), then by rank. The root is last.
    level : dict
        Level of each node (1 = bottom).
    edges : list of (lower, higher)
        One consensus constraint ``x_lower - x_higher = 0`` per edge.
    lower, higher : dict
        Lower and higher neighbours of each node.
    root : str
        The node with no higher neighbour, solved last.
    """

    order: list[str]
    level: dict[str, int]
    edges: list[tuple[str, str]]
    lower: dict[str, list[str]]
    higher: dict[str, list[str]]
    root: str
    nodes_model_order: list[str] = field(default_factory=list)

    @property
    def nodes(self) -> list[str]:
        return list(self.order)

    @property
    def levels(self) -> list[list[str]]:
        """Nodes grouped by level, bottom level first (nodes of a level run in parallel)."""
        top = max(self.level.values(), default=0)
        return [[s for s in self.order if self.level[s] == lev] for lev in range(1, top + 1)]

    def neighbours(self, node: str) -> list[str]:
        return self.lower[node] + self.higher[node]

    def matrix(self, nodes: Sequence[str] | None = None) -> np.ndarray:
        """The hierarchical matrix (Definition 3) with rows/columns in ``nodes`` order."""
        nodes = list(nodes or self.nodes_model_order or self.order)
        idx = {s: i for i, s in enumerate(nodes)}
        H = np.zeros((len(nodes), len(nodes)), dtype=int)
        for lo, hi in self.edges:
            H[idx[lo], idx[hi]] = 1
        for s in nodes:
            H[idx[s], idx[s]] = len(self.higher[s])
        return H

    def as_graph(self) -> nx.DiGraph:
        g = nx.DiGraph()
        g.add_nodes_from(self.order)
        g.add_edges_from(self.edges)
        return g

    def describe(self) -> str:
        lev = " | ".join(", ".join(group) for group in self.levels)
        return f"levels (bottom first): {lev}; root: {self.root}; {len(self.edges)} edges"


def _check_nodes(
    nodes: Sequence[Any], clients: Sequence[str], allow_server: bool, what: str
) -> None:
    given = list(nodes)
    dup = sorted({str(s) for s in given if given.count(s) > 1})
    if dup:
        raise ModelError(f"{what}: nodes {dup} appear more than once")
    expected = set(clients)
    have = set(given)
    extra = have - expected - ({SERVER} if allow_server else set())
    missing = expected - have
    if extra or missing:
        hint = (
            " ('server' may be a node of dald-dc / dgd topologies only when the server "
            "holds terms or should act as the star's hub)"
            if SERVER in extra
            else ""
        )
        raise ModelError(
            f"{what}: the nodes must be the model's clients {sorted(expected)}; "
            f"missing {sorted(missing)}, not clients {sorted(map(str, extra))}{hint}"
        )


def _named_graph(kind: str, clients: list[str]) -> nx.Graph:
    g = nx.Graph()
    g.add_nodes_from(clients)
    if kind == "chain":
        g.add_edges_from(zip(clients[:-1], clients[1:]))
    elif kind == "ring":
        g.add_edges_from(zip(clients[:-1], clients[1:]))
        if len(clients) > 2:
            g.add_edge(clients[-1], clients[0])
    elif kind == "complete":
        g.add_edges_from((a, b) for i, a in enumerate(clients) for b in clients[i + 1 :])
    elif kind == "star":
        g.add_node(SERVER)
        g.add_edges_from((c, SERVER) for c in clients)
    else:
        raise ModelError(
            f"unknown topology {kind!r}; use 'chain', 'ring', 'complete', 'star', a networkx "
            "graph whose nodes are the client names, or a hierarchical matrix"
        )
    return g


def topology_graph(topology: Any, clients: list[str], allow_server: bool = True) -> nx.Graph:
    """The undirected graph of a topology description (used by DGD's mixing weights)."""
    if topology is None:
        topology = "chain"
    if isinstance(topology, str):
        g = _named_graph(topology, clients)
    elif isinstance(topology, nx.Graph):
        g = topology.to_undirected() if topology.is_directed() else topology
    else:
        g = build_hierarchy(topology, clients, allow_server=allow_server).as_graph().to_undirected()
    _check_nodes(list(g.nodes), clients, allow_server, "topology")
    if nx.number_of_selfloops(g):
        raise ModelError(
            "topology: self-loops are not allowed (an edge joins two different clients)"
        )
    _check_connected_undirected(g)
    return g


def build_hierarchy(
    topology: Any,
    clients: Sequence[str],
    *,
    root: str | None = None,
    order: Sequence[str] | None = None,
    nodes: Sequence[str] | None = None,
    allow_server: bool = True,
) -> Hierarchy:
    """Turn a topology description into a :class:`Hierarchy` (see the module docstring).

    Parameters
    ----------
    topology : networkx graph, hierarchical matrix, str or None
        ``None`` means ``"chain"``.
    clients : list of str
        The model's client names, in model order.
    root : str, optional
        Root of an undirected graph (default: ``"server"`` if it is a node, else the last
        client in model order).
    order : list of str, optional
        A total order of the nodes (lowest first) that orients the edges of an undirected
        graph instead of the breadth-first distance to ``root``.
    nodes : list of str, optional
        Names of the rows of a hierarchical matrix (default: the clients in model order).
    allow_server : bool
        Whether ``"server"`` may be a node.

    Examples
    --------
    >>> h = build_hierarchy([[1, 1, 0], [0, 1, 1], [0, 0, 0]], ["a", "b", "c"])
    >>> h.order, h.root
    (['a', 'b', 'c'], 'c')
    """
    clients = list(clients)
    if topology is None:
        topology = "chain"
    if isinstance(topology, str):
        topology = _named_graph(topology, clients)
    if isinstance(topology, nx.DiGraph):
        return _from_digraph(topology, clients, allow_server)
    if isinstance(topology, nx.Graph):
        if root is not None and order is not None:
            raise ModelError("give either root= or order= for an undirected topology, not both")
        return _from_graph(topology, clients, root, order, allow_server)
    if order is not None or root is not None:
        raise ModelError("root= and order= apply to undirected networkx graphs only")
    return _from_matrix(topology, clients, nodes, allow_server)


def _check_connected_undirected(g: nx.Graph) -> None:
    if g.number_of_nodes() > 1 and not nx.is_connected(g):
        comps = [sorted(map(str, c)) for c in nx.connected_components(g)]
        raise ModelError(
            f"topology is not connected (components {comps}); seed 004 Remark 1: consensus "
            "needs a connected communication topology"
        )


def _from_graph(g: nx.Graph, clients, root, order, allow_server) -> Hierarchy:
    _check_nodes(list(g.nodes), clients, allow_server, "topology")
    if nx.number_of_selfloops(g):
        raise ModelError(
            "topology: self-loops are not allowed (an edge joins two different clients)"
        )
    _check_connected_undirected(g)
    model_order = [c for c in clients if c in g] + ([SERVER] if SERVER in g else [])
    pos = {s: i for i, s in enumerate(model_order)}
    if order is not None:
        order = list(order)
        _check_nodes(order, list(g.nodes), True, "order")
        rank = {s: i for i, s in enumerate(order)}
    else:
        if root is None:
            root = SERVER if SERVER in g else model_order[-1]
        if root not in g:
            raise ModelError(f"root {root!r} is not a node of the topology")
        dist = nx.single_source_shortest_path_length(g, root)
        ranked = sorted(g.nodes, key=lambda s: (-dist[s], pos[s]))
        rank = {s: i for i, s in enumerate(ranked)}
    edges = []
    for a, b in g.edges:
        edges.append((a, b) if rank[a] < rank[b] else (b, a))
    return _finish(list(g.nodes), edges, rank, model_order, "order")


def _from_digraph(g: nx.DiGraph, clients, allow_server) -> Hierarchy:
    _check_nodes(list(g.nodes), clients, allow_server, "topology")
    if nx.number_of_selfloops(g):
        raise ModelError("topology: self-loops are not allowed")
    _check_connected_undirected(g.to_undirected())
    if not nx.is_directed_acyclic_graph(g):
        cycle = [str(e[0]) for e in nx.find_cycle(g)]
        raise ModelError(
            f"hierarchical network has a cycle through {cycle}; edges must go from lower to "
            "higher levels"
        )
    model_order = [c for c in clients if c in g] + ([SERVER] if SERVER in g else [])
    pos = {s: i for i, s in enumerate(model_order)}
    topo = list(nx.lexicographical_topological_sort(g, key=lambda s: pos[s]))
    rank = {s: i for i, s in enumerate(topo)}
    edges = [(a, b) for a, b in g.edges]
    return _finish(list(g.nodes), edges, rank, model_order, "hierarchical network")


def _from_matrix(H: Any, clients, nodes, allow_server) -> Hierarchy:
    try:
        A = np.asarray(H, dtype=float)
    except (TypeError, ValueError) as exc:
        raise ModelError(
            "topology must be a networkx graph, a hierarchical matrix (n x n array) or one of "
            f"'chain', 'ring', 'complete', 'star'; got {type(H).__name__}"
        ) from exc
    if A.ndim != 2 or A.shape[0] != A.shape[1]:
        raise ModelError(f"a hierarchical matrix must be square (n x n), got shape {A.shape}")
    names = list(nodes) if nodes is not None else list(clients)
    if A.shape[0] != len(names):
        raise ModelError(
            f"the hierarchical matrix is {A.shape[0]} x {A.shape[0]} but there are "
            f"{len(names)} nodes ({names}); pass nodes= to name its rows"
        )
    _check_nodes(names, clients, allow_server, "hierarchical matrix")
    if not np.all(np.isfinite(A)):
        raise ModelError("the hierarchical matrix contains NaN or inf")
    off = A - np.diag(np.diag(A))
    if not np.all(np.isin(off, (0.0, 1.0))):
        raise ModelError("off-diagonal entries of a hierarchical matrix must be 0 or 1")
    outdeg = off.sum(axis=1)
    bad = [names[i] for i in range(len(names)) if A[i, i] != outdeg[i]]
    if bad:
        raise ModelError(
            f"the diagonal of a hierarchical matrix is each node's out-degree (number of 1s in "
            f"its row); it is wrong for {bad}"
        )
    g = nx.DiGraph()
    g.add_nodes_from(names)
    g.add_edges_from((names[i], names[j]) for i, j in zip(*np.nonzero(off)))
    return _from_digraph(g, clients, allow_server)


def _finish(nodes, edges, rank, model_order, what) -> Hierarchy:
    lower = {s: [] for s in nodes}
    higher = {s: [] for s in nodes}
    for lo, hi in edges:
        lower[hi].append(lo)
        higher[lo].append(hi)
    for s in nodes:
        lower[s].sort(key=rank.get)
        higher[s].sort(key=rank.get)
    roots = [s for s in nodes if not higher[s]]
    if len(roots) != 1:
        raise ModelError(
            f"the {what} gives {len(roots)} roots {sorted(map(str, roots))}; a hierarchical "
            "network has one root (every other node needs a higher-level neighbour), which "
            "is solved last and gathers the stopping residuals"
        )
    level: dict[str, int] = {}
    for s in sorted(nodes, key=rank.get):
        level[s] = 1 + max((level[e] for e in lower[s]), default=0)
    order = sorted(nodes, key=lambda s: (level[s], rank[s]))
    return Hierarchy(order, level, edges, lower, higher, roots[0], list(model_order))


def metropolis_weights(g: nx.Graph, nodes: Sequence[str]) -> dict[str, dict[str, float]]:
    """Metropolis-Hastings mixing weights ``p_ij = 1 / (1 + max(d_i, d_j))`` on edges and
    ``p_ii = 1 - sum_j p_ij`` (symmetric, doubly stochastic)."""
    deg = dict(g.degree)
    out: dict[str, dict[str, float]] = {}
    for i in nodes:
        row = {j: 1.0 / (1.0 + max(deg[i], deg[j])) for j in g.neighbors(i)}
        row[i] = 1.0 - sum(row.values())
        out[i] = row
    return out


# ---------------------------------------------------------------------------------------
# coordination sequences

COORDINATION_MODES = ("full", "random", "greedy")


class Coordination:
    """The client coordination sequence of each inner iteration (seed 004 Section V-A).

    Parameters
    ----------
    spec : str, list or callable
        ``"full"`` (full-cycle, default): every node, in the default order.
        ``"random"`` (partial-cycle): ``ceil(fraction * n)`` nodes drawn uniformly without
        replacement (every node has the same probability), kept in the default order.
        ``"greedy"`` (partial-cycle): the ``ceil(fraction * n)`` nodes with the largest
        score (the caller supplies scores: the local disagreement), but a node left out
        for ``ceil(n / size)`` iterations is taken first, so every node keeps being visited
        (Remark 1).
        A list of node names: used as the sequence of every inner iteration; nodes may be
        repeated (selective-repetitive) or left out (partial-cycle).
        A callable ``fn(k, v, default_order) -> list of names``: online reconfiguration.
    default : list of str
        The full-cycle order.
    fraction : float
        Share of nodes selected by ``"random"`` and ``"greedy"``.
    dropout : float
        Probability that a node drops out of an inner iteration (independently; applied to
        every mode except forced full cycles).
    random_state : int, Generator or None
        Seed of the random choices (shared by all nodes, so all compute the same sequence).
    size : int, optional
        Number of nodes selected by ``"random"`` and ``"greedy"`` (in ``[1, n]``), in place
        of ``ceil(fraction * n)``.

    Notes
    -----
    ``sequence(k, v, full=True)`` returns the full cycle: the algorithms force it for the
    last inner iteration of every outer iteration (the paper's recommendation), so every
    multiplier update sees every node's fresh iterate.
    """

    def __init__(
        self,
        spec: Any,
        default: Sequence[str],
        fraction: float = 0.5,
        dropout: float = 0.0,
        random_state: Any = None,
        size: int | None = None,
    ):
        self.spec = spec
        self.default = list(default)
        self.fraction = float(fraction)
        self.dropout = float(dropout)
        self.rng = np.random.default_rng(random_state)
        self.age = {s: 0 for s in self.default}
        self.size = max(1, math.ceil(self.fraction * len(self.default)))
        if size is not None:
            if not 1 <= int(size) <= len(self.default):
                raise ModelError(
                    f"the coordination selects {size!r} nodes of {len(self.default)}: it must "
                    f"lie in [1, {len(self.default)}]"
                )
            self.size = int(size)
        self.visits = {s: 0 for s in self.default}
        validate_coordination(spec, self.default, self.fraction, self.dropout)

    @property
    def is_full(self) -> bool:
        return isinstance(self.spec, str) and self.spec == "full" and self.dropout == 0.0

    def get_state(self) -> dict:
        """What changes along a run, as plain values: the random generator's state, the
        ages and visit counts (the spec and fractions come from the options)."""
        return {
            "rng": self.rng.bit_generator.state,
            "age": dict(self.age),
            "visits": dict(self.visits),
        }

    def set_state(self, state: dict) -> None:
        self.rng.bit_generator.state = state["rng"]
        self.age = {str(k): int(v) for k, v in state["age"].items()}
        self.visits = {str(k): int(v) for k, v in state["visits"].items()}

    def sequence(
        self, k: int, v: int, full: bool = False, scores: dict[str, float] | None = None
    ) -> list[str]:
        if full or self.is_full:
            seq = list(self.default)
        elif callable(self.spec):
            seq = [str(s) for s in self.spec(k, v, list(self.default))]
            unknown = sorted(set(seq) - set(self.default))
            if unknown:
                raise ModelError(f"the coordination callable returned unknown nodes {unknown}")
        elif isinstance(self.spec, str) and self.spec == "random":
            pick = set(self.rng.choice(len(self.default), size=self.size, replace=False).tolist())
            seq = [s for i, s in enumerate(self.default) if i in pick]
        elif isinstance(self.spec, str) and self.spec == "greedy":
            seq = self._greedy(scores or {})
        elif isinstance(self.spec, str) and self.spec == "full":
            seq = list(self.default)
        else:
            seq = list(self.spec)
        if self.dropout > 0 and not full:
            keep = self.rng.random(len(seq)) >= self.dropout
            seq = [s for s, kept in zip(seq, keep) if kept]
        present = set(seq)
        for s in self.default:
            self.age[s] = 0 if s in present else self.age[s] + 1
        for s in seq:
            self.visits[s] += 1
        return seq

    def _greedy(self, scores: dict[str, float]) -> list[str]:
        limit = math.ceil(len(self.default) / self.size)
        overdue = [s for s in self.default if self.age[s] + 1 >= limit]
        overdue.sort(key=lambda s: -self.age[s])
        chosen = overdue[: self.size]
        rest = [s for s in self.default if s not in chosen]
        rest.sort(key=lambda s: -float(scores.get(s, np.inf)))
        chosen += rest[: self.size - len(chosen)]
        chosen_set = set(chosen)
        return [s for s in self.default if s in chosen_set]


def validate_coordination(
    spec: Any, default: Sequence[str], fraction: float, dropout: float
) -> None:
    if isinstance(spec, str):
        if spec not in COORDINATION_MODES:
            raise ModelError(
                f"coordination must be one of {COORDINATION_MODES}, a list of node names or a "
                f"callable, got {spec!r}"
            )
    elif callable(spec):
        pass
    elif isinstance(spec, Sequence):
        seq = [str(s) for s in spec]
        unknown = sorted(set(seq) - set(default))
        if unknown:
            raise ModelError(f"coordination sequence names unknown nodes {unknown}")
        if not seq:
            raise ModelError("coordination sequence is empty")
        missing = sorted(set(default) - set(seq))
        if missing and dropout == 0.0:
            pass  # partial-cycle: the forced full last inner iteration still visits them
    else:
        raise ModelError(
            f"coordination must be a string, a list of node names or a callable, got {spec!r}"
        )
    if not 0.0 < fraction <= 1.0:
        raise ModelError(f"fraction must lie in (0, 1], got {fraction!r}")
    if not 0.0 <= dropout < 1.0:
        raise ModelError(f"dropout must lie in [0, 1), got {dropout!r}")
