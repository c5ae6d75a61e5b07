"""Lowering relation-indexed products: `ng.dot(n.h, W[e.type])`, W of shape (R, F, O).

Written per edge, the product reads a different matrix on every edge; batched naively it
would copy W onto the edges, an E x F x O tensor (a user of a popular framework once asked
it for 1,300 GB). It is lowered instead to one of three computations made of ordinary ops
(dense products, slices, gathers and aggregations over graphs derived from the typed graph,
ngnn/relations.py), so gradients, every pass and every backend apply unchanged:

- transform_first: Y = h @ W for every node and relation at once, an N x R x O tensor, then
  the typed gather out[e] = Y[src[e], type[e]] (a gather over the relation graph; its
  adjoint is the typed scatter-sum).
- segments: the edges grouped by type; per relation, its edges' rows of h times W[r]
  (E_r x F then E_r x O), concatenated and put back in edge order.
- per_relation: where the products are only summed (or averaged) at a vertex, possibly
  scaled on the way (R-GCN's 1/c_{i,r}), the aggregation is split by relation:
  sum_r aggregate_r(scale_r * gather_r(h @ W[r])), each term over the subgraph of relation
  r, so no edge-sized or R-sized tensor is kept: AggregateTransformOrder then orders each
  term, and Fusion runs each gather-scale-aggregate as one sparse product.

An aggregation the user already wrote per relation (values read through
`v.innbs.of_type(r)`) needs no choice: it is lowered onto relation r's subgraph directly
(`aggregate_of_type`), where `W[e.type]` is `W[r]`.

The choice is by bytes: the largest tensor each would allocate (for the per-relation forms
the gradient of W is counted too: it is accumulated relation by relation, R x F x O each).
The ops the choice makes carry its name (`%relation_transform_first`, `%relation_segments`,
`%relation_per_relation`), so `comp.ir` shows it.
"""
import numpy as np

from ..op_graph import (Aggregate, Concat, Constant, Divide, Dot, Gather, Multiply, Transpose,
                        ordered_ops, zeros)
from ..op_graph.layout import Reshape
from ..relations import relation_edges, relation_graph, relation_subgraph, rows_graph, type_graph
from .tracing import LocalFeature, RelationIndex

SCALES = (Multiply, Divide)


def lower_index(lowering, op):
    """W[e.type] outside a product: W's rows gathered onto the edges (E, ...)."""
    table = lowering.arg(op.args[0], op.scope, "e")
    rows = Reshape(table, (table.shape[0], -1)) if table.ndim != 2 else table
    picked = Gather(rows, type_graph(lowering.graph), by="src")
    return Reshape(picked, (lowering.graph.num_edges,) + op.shape)


def relational_product(op):
    """(node operand, W) of a local dot(x, W[e.type]) with x a node value of shape (F,) and
    W of shape (R, F, O); else None."""
    if not isinstance(op, Dot):
        return None
    x, index = op.args
    if not isinstance(index, RelationIndex) or index.ndim != 2 or x.ndim != 1 or \
            x.scope not in ("v", "innbs", "outnbs"):
        return None
    return x, index.args[0]


def neighbour_end(lowering, local, edge_set):
    from .lowering import ENDS, NEIGHBOUR_OF
    vertex_end, other_end = ENDS[edge_set]
    return other_end if NEIGHBOUR_OF.get(local.scope) == edge_set else vertex_end


def strategy_bytes(graph, x, weight, split):
    """{strategy: bytes of the largest tensor it allocates} for a product of node rows x
    (F,) with W (R, F, O) on every edge."""
    R, F, O = weight.shape
    N, E = graph.num_nodes, graph.num_edges
    size = weight.dtype.itemsize
    largest_relation = max((len(e) for e in relation_edges(graph)), default=0)
    costs = {"transform_first": max(N * R * O, E * O) * size}
    if not x.is_sparse:          # a gather of a sparse tensor's rows is not an op
        costs["segments"] = max(E * O, largest_relation * F, R * F * O) * size
    if split:
        costs["per_relation"] = max(N * O, R * F * O) * size
    return costs


def choose(graph, x, weight, split):
    costs = strategy_bytes(graph, x, weight, split)
    return min(costs, key=costs.get)       # ties: the first listed (fewest ops)


def lower_product(lowering, op, edge_set):
    """The (E, O) edge tensor of dot(x, W[e.type]), by transform_first or segments."""
    x_local, weight_local = relational_product(op)
    g = lowering.graph
    x = lowering.home[x_local]
    weight = lowering.arg(weight_local, edge_set, "e")
    by = neighbour_end(lowering, x_local, edge_set)
    R, F, O = weight.shape
    if x.shape[0] != g.num_nodes or \
            choose(g, lowering.home[x_local], weight, False) == "transform_first":
        # (F, R * O): every relation's W side by side, so one product transforms all.
        flat = Reshape(Transpose(weight, (1, 0, 2)), (F, R * O))
        y = Dot(x, flat, name="relation_transform_first")
        return Gather(Reshape(y, (x.shape[0] * R, O)), relation_graph(g), by=by)
    pieces, order = [], []
    for r, eids in enumerate(relation_edges(g)):
        if len(eids):
            pieces.append(Dot(Gather(x, relation_subgraph(g, r), by=by), weight[r]))
            order.append(eids)
    if not pieces:
        return zeros((0, O), weight.dtype)
    by_type = Concat(*pieces, axis=0, name="relation_segments")
    position = np.empty(g.num_edges, dtype=np.int64)
    position[np.concatenate(order)] = np.arange(g.num_edges)
    return Gather(by_type, rows_graph(g, "type_sorted", position, g.num_edges), by="src")


def linear_chain(value, edge_set):
    """The relational product at the bottom of `value`, if value is that product scaled by
    factors not depending on it (Multiply, or Divide with it as numerator); else None."""
    while not relational_product(value):
        if not isinstance(value, SCALES) or value.scope != edge_set:
            return None
        below = [a for a in value.args if a.scope == edge_set and _depends_on_product(a)]
        if len(below) != 1 or isinstance(value, Divide) and below[0] is not value.args[0] \
                or below[0].shape != value.shape:
            return None
        value = below[0]
    return value


def _depends_on_product(value):
    return any(relational_product(op) for op in ordered_ops([value]))


def split_aggregate(lowering, op):
    """sum / mean over a vertex's edges of a scaled relational product, as the sum over
    relations of aggregations over each relation's subgraph; None where that does not
    apply or is not the cheapest form."""
    if op.reduce not in ("sum", "mean"):
        return None
    from .lowering import ENDS
    edge_set = op.over
    value = op.args[0]
    product = linear_chain(value, edge_set)
    if product is None:
        return None
    x_local, weight_local = relational_product(product)
    g = lowering.graph
    weight = lowering.arg(weight_local, edge_set, "e")
    if choose(g, lowering.home[x_local], weight, True) != "per_relation":
        return None
    at = ENDS[edge_set][0]
    terms = []
    for r, eids in enumerate(relation_edges(g)):
        if len(eids):
            sub = relation_subgraph(g, r)
            edges = _RelationEdges(lowering, edge_set, r, sub)
            terms.append(Aggregate(edges.lower(value), sub, at=at, reduce="sum"))
    if not terms:
        return zeros((g.num_nodes,) + op.shape, op.dtype)
    total = terms[0]
    for term in terms[1:]:
        total = total + term
    if op.reduce == "mean":
        degrees = g.in_degrees if at == "dst" else g.out_degrees
        scale = 1.0 / np.maximum(degrees, 1).astype(op.dtype)
        total = total * Constant(scale.reshape((-1,) + (1,) * len(op.shape)), dtype=op.dtype)
    total.name = "relation_per_relation"
    return total


def aggregate_of_type(lowering, op):
    """An aggregation over the edges of one relation (values read through
    `v.innbs.of_type(r)` / `v.inedges.of_type(r)`): the value lowered onto that relation's
    subgraph only, W[e.type] there being W[r], and aggregated over it (a mean divides by
    the vertex's number of relation-r edges)."""
    from .lowering import ENDS
    g, r = lowering.graph, op.relation
    sub = relation_subgraph(g, r)
    edges = _RelationEdges(lowering, op.over, r, sub)
    return Aggregate(edges.lower(op.args[0]), sub, at=ENDS[op.over][0], reduce=op.reduce,
                     name=f"relation_of_type_{r}")


class _RelationEdges:
    """Lowers per-edge values onto the edges of one relation (its subgraph's edges), where
    dot(x, W[e.type]) is dot(x, W[r]) for every edge."""

    def __init__(self, lowering, edge_set, r, sub):
        self.lowering, self.edge_set, self.r = lowering, edge_set, r
        self.sub = sub
        self.done = {}

    @property
    def eids(self):
        """The graph's ids of the relation's edges, for values read per edge of the whole
        graph (edge features, b[e.type]); looked up only then (a typed minibatch slot's
        relation subgraphs have no fixed ids, and say so)."""
        return relation_edges(self.lowering.graph)[self.r]

    def lower(self, local):
        if local not in self.done:
            self.done[local] = self.lower_new(local)
        return self.done[local]

    def lower_new(self, local):
        lw, g = self.lowering, self.lowering.graph
        product = relational_product(local)
        if product:
            x_local, weight_local = product
            weight = lw.arg(weight_local, self.edge_set, "e")
            return Gather(Dot(lw.home[x_local], weight[self.r]), self.sub,
                          by=neighbour_end(lw, x_local, self.edge_set))
        if local.scope is None:
            return lw.arg(local, self.edge_set, "e")
        if local.scope != self.edge_set:          # a node value: gathered at its end
            return Gather(lw.home[local], self.sub,
                          by=neighbour_end(lw, local, self.edge_set))
        if isinstance(local, RelationIndex):       # b[e.type]: row r of b on every edge
            table = lw.arg(local.args[0], self.edge_set, "e")
            flat = Reshape(table, (table.shape[0], -1)) if table.ndim != 2 else table
            same = np.full(self.sub.num_edges, self.r, dtype=np.int64)
            picked = Gather(flat, rows_graph(g, ("type", self.r), same, table.shape[0]),
                            by="src")
            return Reshape(picked, (self.sub.num_edges,) + local.shape)
        if isinstance(local, LocalFeature):        # an edge feature: this relation's rows
            rows = lw.home[local]
            if isinstance(rows, Constant):
                return Constant(rows.value[self.eids], dtype=rows.dtype)
            return Gather(rows, rows_graph(g, ("relation", self.r), self.eids, g.num_edges),
                          by="src")
        args = [self.lower(a) for a in local.args]
        return lw.rebuild(local, args, self.sub.num_edges)
