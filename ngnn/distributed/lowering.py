"""Distributed lowering: a computation a model built over a rank's MasterView becomes that
rank's share of the whole-graph computation, with its communication as ops of the
op-graph.

Node tensors have a row per master, so dense node-wise work is done once per vertex.
Graph ops move onto the LocalGraph, where edges reach mirrors:

* a gather reads `MasterBroadcast(x)`: the masters' rows, and on the mirrors the rows
  their masters hold on other ranks (only the mirrors with local edges at the gathered
  end receive);
* an aggregation over local edges gives a partial result on every local vertex; it
  becomes `MirrorReduce(partial)`, the whole result on each master; a mean divides that
  sum by the whole graph's degree;
* an edge softmax becomes its max, exp, sum and divide, with both aggregations synced;
* a dropout of node rows is keyed by the masters' global ids (dropouts made inside zoomIn
  already are, through MasterView.global_rows);
* a readout over a RankReadoutGraph (a batch of graphs partitioned by vertex) is the
  rank's partial readout combined over the ranks (ReadoutAllReduce); a mean divides the
  combined sum by the whole graphs' sizes. What is computed from readouts and weights
  alone is the same on every rank: its dropouts keep their single-process masks.

Gradients then follow from the ops' adjoints: the adjoint of the broadcast is a mirror
reduction and the other way round, while gathers and aggregations stay local. Run it on
the forward graph before ng.grad; the optimizer all-reduces the weight gradients.
"""
import numpy as np

from ngnn.frontend import lower_zoom_outs
from ngnn.op_graph import (Aggregate, Constant, Divide, Dropout, EdgeSoftmax, Exp, Gather,
                           MasterBroadcast, Maximum, MirrorReduce, ReadoutAllReduce, SparseDropout,
                           StopGradient, Subtract, Variable, ordered_ops)

from .local_graph import MasterView, RankReadoutGraph


def insert_communication(results, view):
    """Rewrites the ops `results` depend on (by forwarding) for rank-local execution:
    graph ops over MasterViews move onto their LocalGraphs, dropouts over `view`'s node
    rows are keyed by global ids."""
    lower_zoom_outs(results)
    replicated = set()   # the same on every rank: readouts, and what only they and weights feed
    for op in ordered_ops(results):
        graph = getattr(op, "graph", None)
        if isinstance(graph, RankReadoutGraph):
            if isinstance(op, Aggregate) and op.at == "dst":
                op.forward = readout_reduced(op)
                replicated.update((op, op.forward))
            elif isinstance(op, EdgeSoftmax):
                raise ValueError(f"distributed: an edge softmax over a readout graph ({op}) "
                                 "is not built over ranks; readouts over ranks are sum, "
                                 "mean and max")
        elif isinstance(graph, MasterView) and op.row_space is not None:    # a graph op
            op.forward = {Gather: gathered, Aggregate: synced,
                          EdgeSoftmax: synced_softmax}[type(op)](op)
        elif any(a in replicated for a in op.args) and \
                all(a in replicated or isinstance(a, (Constant, Variable)) for a in op.args):
            replicated.add(op)       # a dropout among them keeps its single-process mask
        elif isinstance(op, (Dropout, SparseDropout)) and op.rows is None:
            op.forward = node_keyed(op, view)


def gather(x, local, by):
    """x (a row per master) gathered onto local edges by their `by` ends."""
    return Gather(MasterBroadcast(x, local, at=by), local, by=by)


def reduced(e, local, at, reduce):
    """The whole graph's aggregation of edge tensor e on each master."""
    return MirrorReduce(Aggregate(e, local, at=at, reduce=reduce), local, reduce, at)


def gathered(op):
    return gather(op.args[0], op.graph.local, op.by)


def synced(op):
    e, local, at = op.args[0], op.graph.local, op.at
    whole = reduced(e, local, at, op.combiner.partial_combiner.name)
    if not op.combiner.divides:
        return whole
    if op.graph.varies:      # a rank's slot: the whole degrees counted when run
        ones = Constant(np.ones((local.num_edges,) + (1,) * (op.ndim - 1)), dtype=whole.dtype)
        return whole * (1.0 / Maximum(reduced(ones, local, at, "sum"), 1.0))
    degrees = op.graph.vertex_degrees("in" if at == "dst" else "out")
    divisor = np.maximum(degrees, 1).astype(whole.dtype).reshape((-1,) + (1,) * (op.ndim - 1))
    return DegreeDivide(whole, Constant(divisor))


def synced_softmax(op):
    x, local, at = op.args[0], op.graph.local, op.at
    peak = StopGradient(reduced(x, local, at, "max"))
    e = Exp(Subtract(x, gather(peak, local, at)))
    return Divide(e, gather(reduced(e, local, at, "sum"), local, at))


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


def readout_reduced(op):
    """A readout over a rank's share of a batch: its partial, combined over the ranks."""
    e, g = op.args[0], op.graph
    partial = op.combiner.partial_combiner.name
    whole = ReadoutAllReduce(Aggregate(e, g, at="dst", reduce=partial), g, partial)
    if not op.combiner.divides:
        return whole
    if g.varies:      # a rank's slot: the whole graphs' sizes counted when run, the
        # reciprocal times the sum as Aggregate's mean over a slot rounds it
        ones = Constant(np.ones((g.num_edges,) + (1,) * (op.ndim - 1)), dtype=whole.dtype)
        sizes = ReadoutAllReduce(Aggregate(ones, g, at="dst", reduce="sum"), g, "sum")
        return whole * (1.0 / Maximum(sizes, 1.0))
    divisor = np.ones((g.num_nodes,) + (1,) * (op.ndim - 1), whole.dtype)
    divisor[:g.num_dst, ...] = np.maximum(g.graph_sizes, 1).reshape((-1,) + divisor.shape[1:])
    # In the readout's dtype: Constant would round a float64 array to float32.
    return DegreeDivide(whole, Constant(divisor, dtype=whole.dtype))


def node_keyed(op, view):
    if op.shape[:1] != (view.num_nodes,):
        raise ValueError(f"distributed dropout: a tensor of shape {op.shape} is neither over "
                         f"the {view.num_nodes} masters nor made inside zoomIn, so its mask "
                         "cannot be keyed by global ids")
    return type(op)(op.args[0], op.rate, seed=op.seed, name=op.name,
                    rows=view.global_rows("n"))
