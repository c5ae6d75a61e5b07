"""Graph ops: the few, orthogonal ops that move data between nodes and edges.

`Gather` copies a node tensor onto edges (by each edge's source or destination);
`Aggregate` reduces an edge tensor onto nodes (at each edge's destination or source) with
a kind of the reduction table (ngnn/op_graph/combiners.py: sum, mean, max, min, prod);
`EdgeSoftmax` normalizes edge values over each destination's
in-edges. The adjoint of a gather is a sum aggregation at the same end, and the other way
round (seed 000's srcagg / dstagg).
"""
import numpy as np

from .combiners import combiner_of
from .op import Attr, Constant, Op, ShapeError, as_ops
from .work import Work, elements, nbytes, row_elements, row_width

ENDS = ("src", "dst")


class GraphOp(Op):
    attributes = (Attr("graph", printed=False),)

    def __init__(self, args, graph, *, shape, dtype, scope, name=None):
        from ..graph import Graph
        if not isinstance(graph, Graph):
            raise TypeError(f"{type(self).__name__}: expected an ng.Graph, got {graph!r}")
        self.graph = graph
        super().__init__(args, shape=shape, dtype=dtype, scope=scope, name=name)


def _check_end(op_name, end):
    if end not in ENDS:
        raise ValueError(f"{op_name}: end must be one of {ENDS}, got {end!r}")


def _check_rows(op_name, x, rows, what):
    if x.ndim == 0 or x.shape[0] != rows:
        raise ShapeError(f"{op_name}: expected a {what} tensor with {rows} rows, got shape "
                         f"{x.shape}")


class Gather(GraphOp):
    """out[e] = x[src[e]] (by="src") or x[dst[e]] (by="dst"). Gathering by destination from a
    block (graph.num_dst < num_nodes), x may hold just the num_dst destination rows."""
    kind = "edge"
    row_space = "e"
    fusion_role = "edge"
    inlinable = True
    attributes = (Attr("graph", printed=False), Attr("by", printed=False))

    def __init__(self, x, graph, by="src", name=None):
        (x,) = as_ops(x)
        _check_end("gather", by)
        if not (by == "dst" and x.ndim and x.shape[0] == graph.num_dst):
            _check_rows("gather", x, graph.num_nodes, "node")
        self.by = by
        super().__init__([x], graph, shape=(graph.num_edges,) + x.shape[1:], dtype=x.dtype,
                         scope="e", name=name)

    @property
    def op_name(self):
        return f"gather_{self.by}"

    @property
    def work(self):
        """np.take of x's rows by the edges' ends."""
        return (Work("take", self.graph.num_edges, row_width(self), self.args[0].shape[0]),)

    def adjoints(self, delta):
        total = Aggregate(delta, self.graph, at=self.by, reduce="sum")
        rows = self.args[0].shape[0]
        return [total if rows == self.graph.num_nodes else total[:rows]]


class Aggregate(GraphOp):
    """out[v] = reduce over edges e with dst[e] == v (at="dst") or src[e] == v (at="src").
    A vertex with no such edge gets 0 for every reduction, and a zero gradient."""
    row_space = "n"
    fusion_role = "agg"
    attributes = (Attr("graph", printed=False), Attr("at"), Attr("reduce", printed=False))

    def __init__(self, x, graph, at="dst", reduce="sum", name=None):
        (x,) = as_ops(x)
        _check_end("aggregate", at)
        combiner_of(reduce, "aggregate")
        _check_rows(f"aggregate {reduce}", x, graph.num_edges, "edge")
        self.at, self.reduce = at, reduce
        super().__init__([x], graph, shape=(graph.num_nodes,) + x.shape[1:],
                         dtype=x.dtype if x.dtype.kind == "f" else np.float32, scope="n",
                         name=name)

    @property
    def kind(self):
        return "agg" if self.at == "dst" else "srcagg"

    @property
    def op_name(self):
        return self.reduce

    @property
    def combiner(self):
        """Its row of the reduction table: start, combine, finish, gradient."""
        return combiner_of(self.reduce)

    @property
    def work(self):
        """A linear kind: the incidence matrix (N, E) @ x, x's rows in edge order, and a
        pass over the result; the others: x's rows taken into CSR order, then a segment
        reduction (K.aggregate)."""
        edges, width = self.graph.num_edges, row_width(self)
        if self.combiner.linear:
            return (Work("spmm", edges, width, edges),
                    Work("pass", elements(self), moved=2 * nbytes(self)))
        return (Work("edge_take", edges, width, edges), Work("segment", edges, width))

    def degree_scale(self):
        """1 / max(degree, 1) shaped to broadcast over the result."""
        trailing = (1,) * (self.ndim - 1)
        if self.graph.varies:     # edges replaced between calls: count them when run
            from .elementwise import Maximum
            # In the op's dtype: Constant would round a float64 array to float32, and the
            # reciprocal with it.
            ones = Constant(np.ones((self.graph.num_edges,) + trailing), dtype=self.dtype)
            return 1.0 / Maximum(Aggregate(ones, self.graph, at=self.at, reduce="sum"), 1.0)
        degrees = self.graph.in_degrees if self.at == "dst" else self.graph.out_degrees
        scale = 1.0 / np.maximum(degrees, 1).astype(self.dtype)
        # In the op's dtype: Constant would round a float64 array to float32.
        return Constant(scale.reshape((-1,) + trailing), dtype=self.dtype)

    def adjoints(self, delta):
        return [self.combiner.edge_adjoint(self.args[0], self, delta, self.graph, self.at)]


class EdgeSoftmax(GraphOp):
    """Softmax of edge values over the in-edges of each destination (or out-edges of each
    source with at="src"), computed stably: the per-vertex max is subtracted first."""
    kind = "edge"
    row_space = "e"
    fusion_role = "softmax"
    attributes = (Attr("graph", printed=False), Attr("at"))

    def __init__(self, x, graph, at="dst", name=None):
        (x,) = as_ops(x)
        _check_end("edge_softmax", at)
        _check_rows("edge_softmax", x, graph.num_edges, "edge")
        self.at = at
        super().__init__([x], graph, shape=x.shape,
                         dtype=x.dtype if x.dtype.kind == "f" else np.float32, scope="e",
                         name=name)

    @property
    def work(self):
        """K.edge_softmax: a segment max, a gather of it, subtract and exp, a float64 sum
        (an incidence product), a gather of it, a divide."""
        edges, nodes, width = self.graph.num_edges, self.graph.num_nodes, row_width(self)
        element = edges * row_elements(self)
        return (Work("edge_take", edges, width, edges), Work("segment", edges, width),
                Work("take", edges, width, nodes), Work("spmm", edges, 2 * width, edges),
                Work("take", edges, 2 * width, nodes),
                Work("pass", element, moved=6 * element * 4, calls=4, transcendental=element))

    def adjoints(self, delta):
        total = Aggregate(delta * self, self.graph, at=self.at, reduce="sum")
        return [self * (delta - Gather(total, self.graph, by=self.at))]


def edge_softmax(graph, logits, at="dst"):
    return EdgeSoftmax(logits, graph, at=at)


def gather(x, graph, by="src"):
    return Gather(x, graph, by=by)


def aggregate(x, graph, at="dst", reduce="sum"):
    return Aggregate(x, graph, at=at, reduce=reduce)
