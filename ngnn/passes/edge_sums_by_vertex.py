"""EdgeSumsByVertex: a sum over the edge axis becomes a sum over each vertex's in-edges (an
aggregation) followed by a sum over the vertices.

A parameter used per edge (GATv2's attention vector, AGNN's beta, an edge-level loss term)
gets its gradient as a sum over the edge axis of an edge tensor. That reduction needs every
edge of its argument, so it runs after the fused group that makes the argument, and Fusion
has to store the whole (E, ...) tensor between the two. An aggregation can run inside the
group instead:

    sum over edges e of x[e]  ==  sum over vertices v of (sum over e into v of x[e])

so the group writes the per-vertex sums, a node tensor's size, and the (E, ...) values
never leave it. The rewrite is made only where the graph has no more vertices than edges
(else the node tensor is the larger one) and where the edge tensor's graph is known: it
is the graph of the gathers it is made from, one graph for all of them.
"""
from ..op_graph import Aggregate, Sum, ordered_ops
from .base import GraphPass

MIXED = object()        # an edge value made from gathers over several graphs


class EdgeSumsByVertex(GraphPass):
    def do_pass(self, computation):
        graph_of = {}
        for op in ordered_ops(computation.results):
            graph_of[op] = edge_graph(op, graph_of)
            if type(op) is not Sum or 0 not in op.axes:
                continue
            x = op.args[0]
            graph = graph_of.get(x)
            if x.scope == "e" and graph not in (None, MIXED) and \
                    x.shape[0] == graph.num_edges and graph.num_nodes <= graph.num_edges:
                per_vertex = Aggregate(x, graph, at="dst", reduce="sum")
                op.forward = Sum(per_vertex, axis=op.axes, keepdims=op.keepdims, name=op.name)


def edge_graph(op, graph_of):
    """The graph whose edges index the rows of the edge value `op`: a gather's own, else
    the one its edge-valued arguments share (MIXED where they differ)."""
    if op.scope != "e":
        return None
    graph = getattr(op, "graph", None)
    if graph is not None:
        return graph
    found = {id(g): g for g in (graph_of.get(a) for a in op.args) if g is not None}
    if len(found) == 1:
        return next(iter(found.values()))
    return MIXED if found else None
