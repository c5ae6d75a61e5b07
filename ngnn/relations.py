"""Relation-typed edges: the checked edge types of a graph, and the graphs derived from them
that let relation-indexed products (`W[e.type]` in per-edge code) run as the ordinary
gathers and aggregations every pass and backend already knows.

Each derived graph is made once per graph and cached on it:

- `relation_graph(g)`: N * R vertices, vertex (v, r) numbered v * R + r; edge e goes
  (src[e], type[e]) -> (dst[e], type[e]). A gather by source from an (N * R, O) tensor is
  the typed gather out[e] = Y[src[e], type[e]]; its adjoint, an aggregation at the sources,
  is the typed scatter-sum (N * R, O).
- `relation_subgraph(g, r)`: the edges of relation r over the same vertices, in edge-id order.
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
        cache[key] = make()
    return cache[key]


def require_types(graph, what):
    if graph.edge_type is None:
        raise ValueError(f"{what}: {graph!r} has no edge types; build it with "
                         "ng.Graph.from_edges(src, dst, num_nodes=N, edge_type=t, "
                         "num_relations=R)")


def relation_edges(graph):
    """Edge ids of each relation, in edge-id order: a list of R int64 arrays."""
    require_types(graph, "relation_edges")

    def make():
        order = np.argsort(graph.edge_type, kind="stable")
        bounds = np.searchsorted(graph.edge_type[order], np.arange(graph.num_relations + 1))
        return [order[bounds[r]:bounds[r + 1]] for r in range(graph.num_relations)]
    return _cached(graph, "relation_edges", make)


def relation_graph(graph):
    require_types(graph, "relation_graph")
    from ngnn.graph import Graph
    R = graph.num_relations
    return _cached(graph, "relation_graph", lambda: Graph(
        graph.src * R + graph.edge_type, graph.dst * R + graph.edge_type,
        num_nodes=graph.num_nodes * R))


def relation_subgraph(graph, r):
    from ngnn.graph import Graph
    eids = relation_edges(graph)[r]
    return _cached(graph, ("relation", r), lambda: Graph(
        graph.src[eids], graph.dst[eids], num_nodes=graph.num_nodes, num_dst=graph.num_dst))


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
