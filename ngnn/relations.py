"""Relation-typed edges: the checked edge types of a graph, and the graphs derived from them
that let relation-indexed products (`W[e.type]` in per-edge code) run as the ordinary
gathers and aggregations every pass and backend already knows.

Each derived graph is made once per graph and cached on it:

- `relation_graph(g)`: N * R vertices, vertex (v, r) numbered v * R + r; edge e goes
  (src[e], type[e]) -> (dst[e], type[e]). A gather by source from an (N * R, O) tensor is
  the typed gather out[e] = Y[src[e], type[e]]; its adjoint, an aggregation at the sources,
  is the typed scatter-sum (N * R, O).
- `relation_subgraph(g, r)`: the edges of relation r over the same vertices, ordered by
  destination (then edge id). All R subgraphs are views into arrays shared by them
  (`_TypeSorted`): sorting the edges by relation once costs 5 E + 4 R N integers in all,
  where R separate graphs would copy 7 E (R-GCN at R-MAT 100K: 25 MB less).
- `type_graph(g)`: R vertices, edge e: type[e] -> type[e]; a gather by source copies a row
  of a per-relation tensor onto each edge (W[e.type] as is, E x F x O: the fallback).
- `rows_graph(rows, n)`: edge i picks row rows[i] of an n-row tensor (an edge tensor's rows
  of one relation, or type-sorted rows back in edge order).
"""
import numbers

import numpy as np


def checked_types(edge_type, num_relations, num_edges):
    """(edge_type as a read-only int64 array, num_relations), or a ValueError naming what
    is wrong."""
    if edge_type is None:
        raise ValueError("num_relations was given without edge_type; pass edge_type=, one "
                         "relation id per edge")
    types = np.asarray(edge_type)
    if types.ndim != 1 or types.shape[0] != num_edges:
        raise ValueError(f"edge_type must be a 1-D array with one relation id per edge "
                         f"({num_edges} edges), got shape {types.shape}")
    if types.dtype.kind not in "iu":
        raise ValueError(f"edge_type must hold integer relation ids, got dtype {types.dtype}")
    if types.dtype.kind == "u" and types.size and types.max() > np.iinfo(np.int64).max:
        raise ValueError("edge_type holds ids too large for int64")
    types = types.astype(np.int64)
    if num_relations is None:
        num_relations = int(types.max()) + 1 if types.size else 1
    elif isinstance(num_relations, bool) or not isinstance(num_relations, numbers.Integral) \
            or num_relations < 1:
        raise ValueError(f"num_relations must be a positive int, got {num_relations!r}")
    num_relations = int(num_relations)
    bad = np.flatnonzero((types < 0) | (types >= num_relations))
    if bad.size:
        i = bad[0]
        raise ValueError(f"edge_type[{i}] = {types[i]} is out of range [0, {num_relations}) "
                         f"({bad.size} out-of-range relation id(s) in edge_type)")
    types.flags.writeable = False
    return types, num_relations


def _cached(graph, key, make):
    cache = graph.__dict__.setdefault("_derived_graphs", {})
    if key not in cache:
        if getattr(graph, "varies", False):
            # A graph made from a slot's edges would keep the first batch's edges in the
            # program; a typed slot holds its relation subgraphs as slots of their own.
            raise ValueError(f"{graph!r} is a minibatch slot: over slots, relation-typed "
                             "code can aggregate per relation (v.innbs.of_type(r)) but not "
                             "read each edge's own type (e.type, W[e.type]); train over "
                             "the full graph")
        cache[key] = make()
    return cache[key]


def require_types(graph, what):
    if graph.edge_type is None:
        raise ValueError(f"{what}: {graph!r} has no edge types; build it with "
                         "ng.Graph.from_edges(src, dst, num_nodes=N, edge_type=t, "
                         "num_relations=R)")


class _TypeSorted:
    """The edges grouped by (relation, destination) and by (relation, source), one counting
    sort each over R x N groups; relation r's edges are positions bounds[r]:bounds[r + 1]
    of both orders, and its subgraph's arrays are slices of these (edge k of subgraph r is
    edge in_eids[bounds[r] + k] of the graph)."""

    def __init__(self, graph):
        from ngnn.graph import _grouped
        R, N = graph.num_relations, graph.num_nodes
        types = graph.edge_type
        in_indptr, self.in_eids, in_counts = _grouped(types * N + graph.dst, R * N)
        self.bounds = in_indptr[::N] if N else np.zeros(R + 1, np.int64)
        self.src = graph.src[self.in_eids]
        self.dst = graph.dst[self.in_eids]
        # Grouped by source over the in-order, so each group lists its edges in subgraph
        # order, as a graph built from the relation's edges would.
        sorted_types = np.repeat(np.arange(R), np.diff(self.bounds))
        out_indptr, self.out_local, out_counts = _grouped(sorted_types * N + self.src, R * N)
        self.out_dst = self.dst[self.out_local]
        self.out_local -= self.bounds[sorted_types[self.out_local]]   # ids in the relation
        del sorted_types
        self.in_indptr = self.local_indptr(in_indptr, R, N)
        self.out_indptr = self.local_indptr(out_indptr, R, N)
        self.in_degrees = in_counts.reshape(R, N)
        self.out_degrees = out_counts.reshape(R, N)
        self.identity = np.arange(int(np.diff(self.bounds).max(initial=0)))

    def local_indptr(self, indptr, R, N):
        """(R, N + 1): relation r's CSR offsets, counted from its first edge."""
        local = np.empty((R, N + 1), np.int64)
        local[:, :N] = indptr[:-1].reshape(R, N) - self.bounds[:-1, None]
        local[:, N] = np.diff(self.bounds)
        return local

    def subgraph(self, graph, r):
        from ngnn.graph import Graph
        p0, p1 = self.bounds[r], self.bounds[r + 1]
        sub = Graph.__new__(Graph)
        sub._set_edges(self.src[p0:p1], self.dst[p0:p1], graph.num_nodes, graph.num_dst,
                       (self.in_indptr[r], self.identity[:p1 - p0], self.in_degrees[r]),
                       (self.out_indptr[r], self.out_local[p0:p1], self.out_degrees[r]),
                       in_src=self.src[p0:p1], out_dst=self.out_dst[p0:p1])
        return sub


def _type_sorted(graph):
    require_types(graph, "relation_edges")
    return _cached(graph, "type_sorted", lambda: _TypeSorted(graph))


def relation_edges(graph):
    """Edge ids of each relation, ordered by destination then edge id (the order of
    `relation_subgraph`'s edges): a list of R int64 arrays."""
    sorted_ = _type_sorted(graph)
    b = sorted_.bounds
    return [sorted_.in_eids[b[r]:b[r + 1]] for r in range(graph.num_relations)]


def relation_graph(graph):
    require_types(graph, "relation_graph")
    from ngnn.graph import Graph
    R = graph.num_relations
    return _cached(graph, "relation_graph", lambda: Graph(
        graph.src * R + graph.edge_type, graph.dst * R + graph.edge_type,
        num_nodes=graph.num_nodes * R))


def relation_subgraph(graph, r):
    return _cached(graph, ("relation", r), lambda: _type_sorted(graph).subgraph(graph, r))


def type_graph(graph):
    require_types(graph, "type_graph")
    from ngnn.graph import Graph
    return _cached(graph, "type_graph", lambda: Graph(
        graph.edge_type, graph.edge_type, num_nodes=graph.num_relations))


def rows_graph(graph, key, rows, num_rows):
    """The graph whose edge i picks row rows[i] of a num_rows-row tensor, cached on `graph`
    under `key`."""
    from ngnn.graph import Graph
    return _cached(graph, ("rows", key), lambda: Graph(rows, rows, num_nodes=num_rows))


def relation_norm(graph, at="dst"):
    """1 / c_{v,r} per edge: one over the number of edges of the edge's relation at the
    edge's destination (at="dst") or source: R-GCN's per-relation mean, as an (E,) array."""
    require_types(graph, "relation_norm")
    ends = graph.dst if at == "dst" else graph.src
    keys = ends * graph.num_relations + graph.edge_type
    _, inverse, counts = np.unique(keys, return_inverse=True, return_counts=True)
    return 1.0 / counts[inverse].astype(np.float64)
