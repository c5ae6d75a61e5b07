"""Operation batching (seed 000): the local IR of a zoomIn context becomes whole-graph ops.

Every per-vertex value (`v`) and every neighbour value (`innbs`, `outnbs`) is computed for
all nodes at once, as a node tensor (N,) + local shape: a superset of what the local program
needs. Edge values (`inedge`, `outedge`) become edge tensors (E,) + local shape; a node value
used on an edge is gathered there (a neighbour by its end of the edge, the vertex itself by
the other end), and an aggregation over a vertex's edges is an Aggregate at that vertex's end.

Over a block (graph.num_dst < num_nodes) the per-vertex values have only the num_dst
destination rows: features read at `v` are row prefixes, aggregations are cut to them, and
every dense op of the vertex program runs on those rows (seed 004's active row prefix).
Neighbour values keep all num_nodes rows.
"""
import numpy as np

from ..op_graph import Aggregate, Constant, Dot, Dropout, Gather, ordered_ops
from ..op_graph.layout import reshape_to
from ..origin import built_for
from ..op_graph.scopes import LOCAL_SCOPES
from .relations import (aggregate_of_type, lower_index, lower_product, relational_product,
                        split_aggregate)
from .tracing import LocalAggregate, LocalDegree, LocalFeature, RelationIndex, ZoomOut

# For each edge set: which end of an edge the current vertex sits at, and the neighbour's.
ENDS = {"inedge": ("dst", "src"), "outedge": ("src", "dst")}
NEIGHBOUR_OF = {"innbs": "inedge", "outnbs": "outedge"}


def lower_zoom_outs(results):
    """Forward every ZoomOut reachable from `results` to its whole-graph computation (the
    OperationBatching pass; see ngnn/passes/operation_batching.py for who else runs it)."""
    for op in ordered_ops(results):
        if isinstance(op, ZoomOut):
            context = op.context
            if context.lowering is None:
                context.lowering = Lowering(context.graph)
            value = context.lowering.lower(op.args[0])
            if op.over is not None:       # an edge-level output
                value = context.lowering.on_edges(op.args[0], op.over)
            op.forward = value


class Lowering:
    """Lowers the ops of one context; memoized, so values shared by several zoomOuts (or used
    both on nodes and on edges) are lowered once."""

    def __init__(self, graph):
        self.graph = graph
        self.home = _Home(self)   # local op -> its whole-graph tensor (node or edge rows)
        self.gathers = {}    # (local op, by) -> node tensor gathered onto edges

    def lower(self, root):
        for op in ordered_ops([root]):
            if op.scope in LOCAL_SCOPES and op not in self.home:
                if isinstance(op, RelationIndex) or relational_product(op) or \
                        not isinstance(op, LocalAggregate) and \
                        any(a in self.home.pending for a in op.args):
                    # Per-edge values from W[e.type] are lowered when first read: an
                    # aggregation split by relation never reads them, and lowering them
                    # builds graphs of E or N * R vertices for nothing.
                    self.home.pending.add(op)
                    continue
                self.home[op] = self.lower_in_place(op)
        return self.home[root]

    def lower_in_place(self, op):
        with built_for(op.origin):
            return self.lower_op(op)

    def rows(self, scope):
        return "e" if scope in ("inedge", "outedge") else "n"

    def count(self, scope):
        """Rows of the whole-graph tensor of a value of `scope`."""
        g = self.graph
        if scope in ("inedge", "outedge"):
            return g.num_edges
        return g.num_dst if scope == "v" else g.num_nodes

    def prefix(self, x, scope):
        """Node tensor x cut to the rows of `scope` (a no-op unless over a block)."""
        rows = self.count(scope)
        return x if x.shape[0] == rows else x[:rows]

    def lower_op(self, op):
        if isinstance(op, LocalFeature):
            if op.args[0].is_sparse:
                # A sparse tensor feeds only ng.dot: its rows are cut after the product
                # (dot(x[:k], W) is dot(x, W)[:k]; below).
                return op.args[0]
            return self.prefix(op.args[0], op.scope)
        g = self.graph
        if isinstance(op, LocalDegree):
            new = self.prefix(self.degrees(op), op.scope)
        elif isinstance(op, LocalAggregate):
            at = ENDS[op.over][0]
            if op.relation is not None:
                split = aggregate_of_type(self, op)
            else:
                split = split_aggregate(self, op) if g.edge_type is not None else None
            new = self.prefix(split if split is not None else
                              Aggregate(self.on_edges(op.args[0], op.over), g, at=at,
                                        reduce=op.reduce), op.scope)
        elif isinstance(op, RelationIndex):
            new = lower_index(self, op)
        elif relational_product(op):
            new = lower_product(self, op, op.scope)
        else:
            rows = self.rows(op.scope)
            args = [self.arg(a, op.scope, rows) for a in op.args]
            count = self.count(op.scope)
            if isinstance(op, Dot) and args[0].is_sparse and args[0].shape[0] != count:
                new = self.rebuild(op, args, args[0].shape[0])[:count]
            else:
                new = self.rebuild(op, args, count)
        new.scope = self.rows(op.scope)
        if isinstance(new, Dropout):
            new.rows = self.graph.global_rows(new.scope)   # ids of a partition's graph
        return new

    def degrees(self, op):
        """In- or out-degrees as a node tensor: constants, unless the graph's edges are
        replaced between calls (a GraphSlot), where they are counted by an aggregation."""
        g = self.graph
        if not g.varies:
            return Constant(op.degrees(), dtype=op.dtype)
        ones = Constant(np.ones(g.num_edges, dtype=op.dtype))
        return Aggregate(ones, g, at="dst" if op.which == "indegree" else "src", reduce="sum")

    def arg(self, a, scope, rows):
        """The lowered form of argument `a` of an op of `scope`."""
        if a.scope is None:
            return a          # parameters keep their full shape
        return self.on_edges(a, scope) if rows == "e" else self.home[a]

    def on_edges(self, a, edge_set):
        """Local value `a` as an edge tensor over `edge_set`."""
        if a.scope is None:
            return self.arg(a, edge_set, "e")
        if a.scope == edge_set:
            return self.home[a]
        vertex_end, neighbour_end = ENDS[edge_set]
        by = neighbour_end if NEIGHBOUR_OF.get(a.scope) == edge_set else vertex_end
        key = (a, by)
        if key not in self.gathers:
            self.gathers[key] = Gather(self.home[a], self.graph, by=by)
        return self.gathers[key]

    def rebuild(self, op, args, count):
        """`op` on lowered arguments, with the row axis in front."""
        local_args = op.args
        if isinstance(op, Dot):
            return self.dot(op, args, count)
        if op.broadcasts:
            # A lower-rank local argument broadcasts per row: size-1 axes go after the row axis.
            args = [pad(lowered, op.ndim, count) if local.scope is not None else lowered
                    for lowered, local in zip(args, local_args)]
        return op.with_args(args, lead=1)

    def dot(self, op, args, count):
        """matmul batches over leading axes: a local vector becomes a row (or column) matrix
        unless rows @ a matrix parameter already means the right thing, and local operands
        are padded to a common rank so the row axis lines up."""
        (a, b), (la, lb) = op.args, args
        if a.scope is not None and a.ndim == 1 and (b.scope is not None or b.ndim > 2):
            la = reshape_to(la, (count, 1) + a.shape)
        if b.scope is not None and b.ndim == 1:
            lb = reshape_to(lb, (count,) + b.shape + (1,))
        rank = max(x.ndim - 1 if local.scope is not None else x.ndim
                   for x, local in ((la, a), (lb, b)))
        if a.scope is not None and la.ndim > 2:
            la = pad(la, rank, count)
        if b.scope is not None:
            lb = pad(lb, rank, count)
        return reshape_to(Dot(la, lb, name=op.name), (count,) + op.shape)


class _Home(dict):
    """Lowered values by local op; an op in `pending` is lowered on first read."""

    def __init__(self, lowering):
        super().__init__()
        self.lowering, self.pending = lowering, set()

    def __contains__(self, op):
        return super().__contains__(op) or op in self.pending

    def __missing__(self, op):
        if op not in self.pending:
            raise KeyError(op)
        self.pending.discard(op)
        self[op] = value = self.lowering.lower_in_place(op)
        return value


def pad(lowered, rank, count):
    """`lowered` ((count,) + local shape) with size-1 axes after the row axis, up to `rank`
    local axes."""
    missing = rank - (lowered.ndim - 1)
    if missing <= 0:
        return lowered
    return reshape_to(lowered, (count,) + (1,) * missing + lowered.shape[1:])
