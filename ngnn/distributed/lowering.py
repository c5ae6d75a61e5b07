"""Distributed lowering: a computation over a rank's LocalGraph becomes that rank's share of
the whole-graph computation, with its communication as ops of the op-graph.

Every rank computes every node tensor on all its local vertices, masters and mirrors
alike (a mirror's row equals its master's), and every edge tensor on its local edges. So:

* an aggregation onto vertices sums (or maxes) over local edges only, a partial result:
  it becomes `MasterBroadcast(MirrorReduce(partial))`, the whole result on every copy;
  a mean divides that sum by the whole graph's degree;
* an edge softmax becomes its max, exp, sum and divide, with both aggregations synced;
* a dropout of node rows is keyed by global vertex ids (dropouts made inside zoomIn
  already are, through LocalGraph.global_rows).

Gradients then follow from the ops' adjoints: the adjoint of the broadcast is a mirror
reduction and the other way round, while gathers and aggregations stay local. Run it on
the forward graph before ng.grad; the optimizer all-reduces the weight gradients.
"""
import numpy as np

from ngnn.frontend import lower_zoom_outs
from ngnn.op_graph import (Aggregate, Constant, Divide, Dropout, EdgeSoftmax, Exp, Gather,
                           MasterBroadcast, MirrorReduce, SparseDropout, StopGradient, Subtract,
                           ordered_ops)

from .local_graph import LocalGraph


def insert_communication(results, graph):
    """Rewrites the ops `results` depend on (by forwarding) for rank-local execution over
    `graph`, a LocalGraph."""
    lower_zoom_outs(results)
    for op in ordered_ops(results):
        if isinstance(op, (Aggregate, EdgeSoftmax)) and isinstance(op.graph, LocalGraph) \
                and not getattr(op, "rank_local", False):
            op.forward = synced_softmax(op) if isinstance(op, EdgeSoftmax) else synced(op)
        elif isinstance(op, (Dropout, SparseDropout)) and op.rows is None:
            op.forward = node_keyed(op, graph)


def local_aggregate(x, graph, at, reduce):
    op = Aggregate(x, graph, at=at, reduce=reduce)
    op.rank_local = True          # a partial result on purpose: not to be synced again
    return op


def synced(op):
    x, g, at = op.args[0], op.graph, op.at
    reduce = "sum" if op.reduce == "mean" else op.reduce
    whole = MasterBroadcast(MirrorReduce(local_aggregate(x, g, at, reduce), g, reduce, at), g)
    if op.reduce != "mean":
        return whole
    degrees = g.global_in_degrees if at == "dst" else g.global_out_degrees
    divisor = np.maximum(degrees, 1).astype(whole.dtype).reshape((-1,) + (1,) * (op.ndim - 1))
    return DegreeDivide(whole, Constant(divisor))


class DegreeDivide(Divide):
    """A synced sum over degrees: the mean. Its adjoint multiplies by the degrees'
    reciprocals, as Aggregate(mean)'s adjoint does, so that a rank rounds the gradient as
    one process does (delta / d and delta * (1 / d) can differ in the last bit, and Adam
    turns that bit into a visible step where a gradient is nearly 0)."""

    @property
    def op_name(self):
        return "divide"

    def adjoints(self, delta):
        divisor = self.args[1]
        return [delta * Constant(1.0 / divisor.value, dtype=divisor.dtype), None]


def synced_softmax(op):
    x, g, at = op.args[0], op.graph, op.at
    peak = StopGradient(MasterBroadcast(MirrorReduce(local_aggregate(x, g, at, "max"), g,
                                                     "max", at), g))
    e = Exp(Subtract(x, Gather(peak, g, by=at)))
    total = MasterBroadcast(MirrorReduce(local_aggregate(e, g, at, "sum"), g, "sum", at), g)
    return Divide(e, Gather(total, g, by=at))


def node_keyed(op, graph):
    if op.shape[:1] != (graph.num_nodes,):
        raise ValueError(f"distributed dropout: a tensor of shape {op.shape} is neither over "
                         f"the {graph.num_nodes} local vertices nor made inside zoomIn, so "
                         "its mask cannot be keyed by global ids")
    return type(op)(op.args[0], op.rate, seed=op.seed, name=op.name,
                    rows=graph.global_rows("n"))
