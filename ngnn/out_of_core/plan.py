"""Chunk planning: a computation's ops cut into stages that run block by block.

Every value is one of: a node tensor (rows are vertices, space "n"), an edge tensor ("e"),
the transpose of a node or edge matrix ("nT", "eT": only a matrix product contracts it),
or small (weights, scalars: None). Node tensors live on the host and reach the device a
block of rows at a time; edge tensors an edge piece at a time.

A stage is one kind of work:
  vertex  row-local ops on node tensors, run on row blocks; a reduction over the rows (a
          loss, a weight gradient X^T @ D) gives one partial result per block, summed;
  edge    gathers, edge ops and aggregations, run on the edge pieces of the chunk grid; an
          aggregation gives one partial result per piece, combined on the host;
  small   everything else, run once (the optimizer's arithmetic);
  assign  the assignments, last, so every read in the step sees the old variables.

An op joins the stage of its arguments when it can read them as they are computed (same
kind, row by row, and no partial result among them); else it starts a later stage. Ops
whose readers all sit in one later stage move there, so a cheap value (a recomputed
dropout mask) is recomputed where it is used instead of stored. Broadcasts of small values
to rows, transposes of node matrices and dropouts of sparse features are views: copied into
each stage that reads them. So are edge values: computed from node values (gathered per
piece) and small ones, they are recomputed in each edge stage that reads them, which costs
less than storing a row per edge on the host and streaming it back (GAT's attention).

A readout (ng.readout) aggregates over its batch's readout graph R, a second graph whose
edge i joins vertex i to its graph. R's edges and source rows are the vertices' own rows,
so its graph ops are row-local: a gather by source and an aggregation at the source are
the rows themselves (views), a gather by destination reads a per-graph value per row (a
vertex-stage op), and an aggregation at the destination is a per-graph reduction of the
rows, one partial per row block, combined on the host in block order. Values on R's
destination side are per-graph (space "g"): they have R's N rows in the op-graph, but only
the first num_graphs mean anything (the rest are the rows past the graphs, which no
readout reads), so stages hold them as (num_graphs, ...) small values.
"""
import numpy as np

from ngnn.graph import Graph
from ngnn.op_graph import (Aggregate, Assign, Broadcast, Communication, Constant, Divide, Dot,
                           EdgeSoftmax, Exp, Gather, Mean, Multiply, Slice, SparseTransposedDot,
                           StopGradient, Subtract, Sum, Transpose, Unslice, Variable,
                           ordered_ops)

ROWS = ("n", "e")
GRAPH_ROWS = "g"


class ChunkingError(ValueError):
    """A computation cannot run chunked (memory_budget); the message names the op."""


def chunked_graphs(ops):
    """(the one graph the message-passing graph ops run over, the readout graphs): a
    computation with readouts alone chunks the rows of a graph without edges."""
    from ngnn.batch import ReadoutGraph
    graphs = list(dict.fromkeys(op.graph for op in ops if op.row_space is not None))
    readouts = [g for g in graphs if isinstance(g, ReadoutGraph)]
    others = [g for g in graphs if not isinstance(g, ReadoutGraph)]
    for g in others:
        if g.varies and g.is_block:
            raise ChunkingError(f"memory_budget: {g!r} is a sampled minibatch's block, whose "
                                "edges change between calls and whose rows are not all "
                                "destinations; chunked execution runs whole graphs, batches "
                                "of graphs and a GraphLoader's slot")
    if len(others) > 1 or not graphs:
        what = "no graph op" if not graphs else f"graph ops over {len(others)} graphs"
        raise ChunkingError(f"memory_budget: chunked execution needs the graph ops of one "
                            f"graph (and its batch's readouts), and this computation has "
                            f"{what}")
    graph = others[0] if others else Graph(np.zeros(0, np.int64), np.zeros(0, np.int64),
                                           readouts[0].num_edges)
    for r in readouts:
        if r.num_edges != graph.num_nodes:
            raise ChunkingError(f"memory_budget: a readout over {r.num_edges} vertices in a "
                                f"computation whose graph has {graph.num_nodes}: the readout "
                                "must pool the rows of the graph it runs with")
        if r.num_nodes != graph.num_nodes:
            raise ChunkingError(f"memory_budget: a readout of {r.num_dst} graphs over "
                                f"{graph.num_nodes} vertices (more graphs than vertices: "
                                "some graphs are empty) cannot run chunked; batch graphs "
                                "with vertices")
    return graph, readouts


def rewrite_for_chunks(results):
    """Rewrites, by forwarding, what a partial result cannot compute: a mean aggregation
    becomes a sum times 1 / degree, an edge softmax its max, exp, sum and divide (each
    aggregation then combined over pieces), a mean over rows a sum divided by the count."""
    for op in ordered_ops(results):
        if isinstance(op, Aggregate) and op.reduce == "mean":
            op.forward = Multiply(Aggregate(op.args[0], op.graph, op.at, "sum"),
                                  op.degree_scale())
        elif isinstance(op, EdgeSoftmax):
            x, g, at = op.args[0], op.graph, op.at
            peak = StopGradient(Aggregate(x, g, at=at, reduce="max"))
            e = Exp(Subtract(x, Gather(peak, g, by=at)))
            op.forward = Divide(e, Gather(Aggregate(e, g, at=at, reduce="sum"), g, by=at))
        elif isinstance(op, Mean) and op.args[0].ndim and 0 in op.axes:
            total = Sum(op.args[0], axis=op.axes, keepdims=op.keepdims)
            op.forward = Divide(total, Constant(np.asarray(max(op.count, 1), op.dtype)))
    return [r.forwarded for r in results]


class Plan:
    """Spaces, stages and the values stages exchange, for the ops `results` need over
    `graph`."""

    def __init__(self, results, graph, readouts=()):
        self.graph = graph
        self.readouts = set(readouts)
        # The graphs of the batch (one count: a computation reads out one batch).
        self.num_graphs = max((r.num_dst for r in readouts), default=0)
        if len({r.num_dst for r in readouts}) > 1:
            raise ChunkingError(f"memory_budget: readouts of batches of "
                                f"{sorted({r.num_dst for r in readouts})} graphs in one "
                                "computation; chunked execution reads out one batch")
        self.results = results
        self.result_set = set(results)
        self.ops = ordered_ops(results)
        self.users = {op: [] for op in self.ops}
        for op in self.ops:
            for a in op.args:
                self.users[a].append(op)
        self.space, self.kind, self.partial = {}, {}, set()
        self.made_graph_rows = set()      # values given space "g" by the op reading them
        self.read_as_graph_rows = self._read_as_graph_rows()
        for op in self.ops:
            self.space[op] = self._space(op)
        self._check_graph_rows()
        for op in self.ops:
            self.kind[op] = self._kind(op)
        self.level = self._levels()
        self.stages = self._stages()

    # ---- spaces -----------------------------------------------------------------------
    def _space(self, op):
        n, e = self.graph.num_nodes, self.graph.num_edges
        if isinstance(op, Communication):
            raise ChunkingError(f"memory_budget: {op} is communication between ranks; "
                                "distributed computations are not chunked")
        if op in self.read_as_graph_rows and (isinstance(op, Constant) or
                                              isinstance(op, Unslice) and
                                              self.space[op.args[0]] is None):
            return self._make_graph_rows(op, op)
        if op.is_leaf:
            if isinstance(op, Variable) or not op.shape:
                return None
            if op.shape[0] == n:
                return "n"
            return "e" if op.shape[0] == e else None
        if self.is_readout_op(op):
            return self._readout_space(op)
        if op.row_space is not None:          # a gather or an aggregation
            if op.combiner is not None:
                self.partial.add(op)
            return op.row_space
        args = [self.space[a] for a in op.args]
        if GRAPH_ROWS in args:
            return self._graph_rows_space(op, args)
        rows = [s for s in args if s is not None]
        if not rows:
            if isinstance(op, Broadcast) and op.shape and op.shape[0] in (n, e):
                return "bcast"
            return None
        if isinstance(op, Transpose):
            (s,) = args
            if op.row_local():
                return s
            if s in ROWS and op.ndim == 2:
                return s + "T"
            return self._refuse(op, "moves the row axis")
        if isinstance(op, (Dot, SparseTransposedDot)):
            a, b = args
            if a in ROWS and b is None and not isinstance(op, SparseTransposedDot):
                return a
            if isinstance(op, SparseTransposedDot) and a == b == "n" or \
                    a in ("nT", "eT") and b == a[0]:
                self.partial.add(op)
                return None
            return self._refuse(op, "is a product this chunking does not split")
        if op.takes_sparse:        # a sparse product or dropout: the sparse matrix's rows
            return args[0]
        real = set(rows) - {"bcast"}
        if len(real) > 1 or real - set(ROWS):
            return self._refuse(op, f"mixes values of different row spaces {sorted(real)}")
        space = real.pop() if real else "bcast"
        has_rows = [s is not None for s in args]
        if op.combiner is not None:          # a reduction over axes
            if op.row_local(has_rows):
                return space
            if space == "e" or op.combiner.divides:
                return self._refuse(op, "reduces over every edge")
            self.partial.add(op)
            return None
        if not op.row_local(has_rows):
            return self._refuse(op, op.across_rows or "is not an op this chunking splits")
        for a, s in zip(op.args, args):
            if s is None and a.ndim == op.ndim and a.shape[0] == op.shape[0] != 1:
                return self._refuse(op, f"reads {a}, which has a row per vertex or edge "
                                        "but is not computed row by row")
        return space if space in ROWS else "bcast"

    def _readout_space(self, op):
        """Spaces of the graph ops over a readout graph R (module doc): R's edges and
        source rows are the vertex rows ("n"), its destination rows the graphs ("g")."""
        (x,) = op.args
        space = self.space[x]
        if isinstance(op, Gather) and op.by == "dst":
            if space in (None, "n") and x.shape[0] == self.graph.num_nodes != self.num_graphs:
                space = self._make_graph_rows(x, op)
            if space not in (None, GRAPH_ROWS):
                return self._refuse(op, f"gathers per-graph rows from a value of space {space}")
            return "n"
        if space != "n":
            return self._refuse(op, f"reads a value of space {space} where the readout "
                                    "needs a row per vertex")
        if isinstance(op, Gather):
            return "n"                    # by="src": row i is vertex i's row
        if op.combiner is not None and x.dtype.kind == "f":       # an aggregation
            if op.at == "src":
                return "n"                # each vertex has one edge, to its graph
            if op.reduce in ("sum", "max", "min"):
                self.partial.add(op)
                return GRAPH_ROWS
        return self._refuse(op, "is not a readout op this chunking splits")

    def _graph_rows_space(self, op, args):
        """The space of an op reading a per-graph value ("g"): row-wise ops keep it (or give
        a small value when they cut the graphs' rows); what reads the rows past the graphs,
        or mixes them with vertex or edge rows, is refused."""
        n = self.graph.num_nodes
        for a, s in zip(op.args, args):
            if s in ("n", "bcast", None) and a.ndim == op.ndim and a.shape[0] == n != 1 and \
                    op.shape[0] == n:
                self._make_graph_rows(a, op)
        mixed = sorted({self.space[a] for a in op.args} - {None, GRAPH_ROWS})
        if mixed:
            return self._refuse(op, f"mixes per-graph values (a readout's) with values of "
                                    f"spaces {mixed}")
        if isinstance(op, Slice):
            rows = op.key[0]
            if isinstance(rows, slice) and rows.start == 0 and rows.step == 1 and \
                    rows.stop <= self.num_graphs:
                return GRAPH_ROWS if op.shape[0] == n else None
            return self._refuse(op, "slices per-graph rows past the graphs' rows")
        if not op.row_local([s is not None for s in args]):
            return self._refuse(op, "reads the rows of per-graph values (a readout's) "
                                    "past the graphs' rows")
        return GRAPH_ROWS if op.shape and op.shape[0] == n else None

    def _read_as_graph_rows(self):
        """The values of the vertex count of rows that a gather by destination over a
        readout graph reads as per-graph rows, directly or through element-wise ops (the
        gradient of a mean readout: the output's gradient, unsliced, times 1 / |graph|)."""
        n, wanted = self.graph.num_nodes, set()
        if n == self.num_graphs:
            return wanted
        for op in reversed(self.ops):
            if self.is_readout_op(op) and isinstance(op, Gather) and op.by == "dst" or \
                    op in wanted and op.elementwise:
                wanted.update(a for a in op.args if a.ndim and a.shape[0] == n)
        return wanted

    def _make_graph_rows(self, a, reader):
        """Gives space "g" to `a`, a value of the vertex count of rows read as per-graph
        rows: a constant (a mean readout's 1 / |graph|), or a small value written into the
        first rows (the gradient of a readout's row cut), whose rows past the graphs no
        readout reads. Anything else is refused."""
        rows = a.key[0] if isinstance(a, Unslice) else None
        if isinstance(a, Constant) or rows is not None and self.space[a.args[0]] is None and \
                rows.start == 0 and rows.step == 1 and rows.stop <= self.num_graphs:
            self.space[a] = GRAPH_ROWS
            self.made_graph_rows.add(a)
            return GRAPH_ROWS
        return self._refuse(reader, f"reads {a} as per-graph rows, but it has a row per "
                                    "vertex")

    def _check_graph_rows(self):
        for a in self.made_graph_rows:
            for u in self.users[a]:
                if self.space[u] not in (GRAPH_ROWS, None) and \
                        not (isinstance(u, Gather) and u.graph in self.readouts):
                    self._refuse(u, f"reads {a} as a row per vertex, where a readout reads "
                                    "it as per-graph rows")

    def stage_shape(self, op):
        """`op`'s shape in the stages and on the host: per-graph values have one row per
        graph."""
        if self.space[op] == GRAPH_ROWS:
            return (self.num_graphs,) + op.shape[1:]
        return op.shape

    def is_readout_op(self, op):
        return op.row_space is not None and op.graph in self.readouts

    def _refuse(self, op, why):
        raise ChunkingError(f"memory_budget: cannot run {op} ({op.op_name}, built at "
                            f"{op.origin and ':'.join(map(str, op.origin))}) chunk by chunk: "
                            f"it {why}")

    # ---- stages -----------------------------------------------------------------------
    def _kind(self, op):
        if op.is_leaf:
            return "leaf"
        if isinstance(op, Assign):
            return "assign"
        space = self.space[op]
        if self.is_readout_op(op):
            # A gather by source or an aggregation at the source is the rows themselves.
            if isinstance(op, Gather) and op.by == "src" or \
                    isinstance(op, Aggregate) and op.at == "src":
                return "view"
            return "vertex"
        if space == "bcast" or space in ("nT", "eT") or op.is_sparse:
            return "view"          # copied into each stage that reads it (a sparse dropout)
        if space == "e" and op not in self.result_set and \
                not any(self.space[a] == "e" and self.kind[a] == "edge" for a in op.args):
            return "view"          # recomputed where it is read, not stored
        if op.row_space is not None or space == "e":
            return "edge"
        if space == "n" or op in self.partial:
            return "vertex"
        return "small"

    def reads(self, op):
        """The values `op` reads, seen through the views it reads (views are copied into
        every stage that reads them)."""
        for a in op.args:
            if self.kind[a] == "view":
                yield from self.reads(a)
            else:
                yield a

    def readers(self, op):
        """The ops that read `op`, seen through views."""
        for u in self.users[op]:
            if self.kind[u] == "view":
                yield from self.readers(u)
            else:
                yield u

    def _levels(self):
        level = {}
        for op in self.ops:
            if self.kind[op] in ("leaf", "view"):
                continue
            level[op] = max((level[a] + self._complete_before(a, op) for a in self.reads(op)
                             if self.kind[a] != "leaf"), default=0)
        last = max(level.values(), default=0) + 1
        for op in self.ops:
            if self.kind[op] == "assign":
                level[op] = last
        # A value read by one later stage only moves into that stage.
        results = set(self.results)
        for op in reversed(self.ops):
            kind = self.kind[op]
            if kind not in ("vertex", "edge") or op in self.partial or op in results:
                continue
            readers = {(level[u], self.kind[u]) for u in self.readers(op)}
            if len(readers) == 1:
                (where,) = readers
                if where[1] == kind and where[0] > level[op]:
                    level[op] = where[0]
        return level

    def _complete_before(self, arg, op):
        """Whether `op` must wait until `arg` is complete (a later stage)."""
        return int(arg in self.partial or self.kind[arg] != self.kind[op])

    def _stages(self):
        stages = {}
        for op in self.ops:
            if self.kind[op] in ("leaf", "view"):
                continue
            key = (self.level[op], self.kind[op])
            stages.setdefault(key, []).append(op)
        ordered = [Stage(kind, ops, self) for (level, kind), ops in sorted(stages.items())]
        placed = {op: s for s in ordered for op in s.ops}
        results = set(self.results)
        for s in ordered:
            s.find_inputs(placed)
        for s in ordered:
            for op in s.ops:
                elsewhere = {placed[u] for u in self.readers(op)} - {s}
                if op in results or elsewhere:
                    s.outputs.append(op)
        return ordered


class Stage:
    """Ops of one kind that run together, block by block (vertex), piece by piece (edge)
    or once (small, assign). `inputs`: the values it reads from outside (completed
    values of earlier stages, and row-space leaves fed block by block); `views`: the view
    ops it copies in; `outputs`: what later stages or the results read."""

    def __init__(self, kind, ops, plan):
        self.kind = kind
        self.ops = ops
        self.plan = plan
        self.inputs, self.views, self.outputs = [], [], []

    def find_inputs(self, placed):
        inside = set(self.ops)
        seen = set()

        def visit(a):
            if a in inside or a in seen:
                return
            seen.add(a)
            kind = self.plan.kind[a]
            if kind == "view":
                for b in a.args:
                    visit(b)
                self.views.append(a)
            elif kind == "leaf" and (isinstance(a, Variable) or self.plan.space[a] is None
                                     and isinstance(a, Constant)):
                return            # weights and small constants: the same op in every stage
            else:
                self.inputs.append(a)

        for op in self.ops:
            for a in op.args:
                visit(a)
        order = {op: i for i, op in enumerate(self.plan.ops)}
        self.views.sort(key=order.get)

    def __repr__(self):
        return f"<Stage {self.kind}: {len(self.ops)} ops, {len(self.inputs)} inputs, " \
               f"{len(self.outputs)} outputs>"
