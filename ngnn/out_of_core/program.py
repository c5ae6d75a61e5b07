"""The chunked program: a computation whose device plan exceeds the memory budget, run as
stages over row blocks and edge pieces (seed 003, NeuGraph's streaming).

Each stage (ngnn.out_of_core.plan) becomes an ordinary computation of the same transformer,
over block-sized placeholders, a RowBlock (vertex stages) or the ChunkSlot (edge stages), so
it is fused, planned and generated like any other. Those computations hold device memory
only while they run (`Transformer.make_resident`), one at a time; the whole tensors stay on
the host. Vertex stages stream row blocks, edge stages the grid's pieces column by column
(an aggregation at the source: row by row), and a reader thread prepares the next block's
inputs (rows gathered, features read from disk) while the current one computes.
"""
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ngnn.op_graph import Aggregate, Constant, Gather, Placeholder, SparseDropout, ordered_ops
from ngnn.op_graph.combiners import COMBINERS
from ngnn.origin import built_for

from .grid import PIECE_CACHE_BYTES, ChunkGrid, ChunkSlot, RowBlock
from .plan import GRAPH_ROWS, ROWS, ChunkingError, Plan, chunked_graphs, rewrite_for_chunks

# Device bytes per edge and per row a piece's index arrays take (int32 src, dst, both CSR
# edge orders, the ids keying dropout; both CSR row pointers and row ids).
INDEX_BYTES_PER_EDGE = 20
INDEX_BYTES_PER_ROW = 12


def row_bytes(op):
    return int(np.prod(op.shape[1:], dtype=np.int64)) * op.dtype.itemsize


def plan_bytes(computation):
    """Device bytes an unchunked run of `computation` needs: its memory plan, parameters,
    variables, constants and the index arrays of its graphs (planned, not generated)."""
    computation.plan()
    ops = computation.ordered_ops
    graphs = {op.graph for op in ops if hasattr(op, "graph") and op.graph is not None}
    leaves = sum(op.nbytes for op in ops if op.__class__.__name__ in
                 ("Placeholder", "Variable", "Constant"))
    index = sum(4 * (4 * g.num_edges + 2 * (g.num_nodes + 1)) for g in graphs)
    return computation.memory_plan.peak_bytes + leaves + index


def read_rows(array, start, stop):
    """Rows [start, stop) of `array`; from a numpy.memmap they are read from its file, so
    the mapping's pages never become part of this process's resident memory."""
    if not isinstance(array, np.memmap) or array.filename is None:
        return array[start:stop]
    width = int(np.prod(array.shape[1:], dtype=np.int64))
    offset = array.offset + start * width * array.dtype.itemsize
    with open(array.filename, "rb") as f:
        rows = np.fromfile(f, dtype=array.dtype, count=(stop - start) * width, offset=offset)
    return rows.reshape((stop - start,) + array.shape[1:])


class Sizes:
    """The chunking a budget allows (or `parts` fixes): P (vertex blocks of the grid), the
    edge capacity of a piece, and the rows of a vertex stage's block. The seed's rule: P
    is the smallest count whose blocks and pieces fit, the bytes of every value a stage
    holds counted without buffer sharing (an upper bound of its memory plan)."""

    def __init__(self, plan, budget, parts, variables):
        graph = plan.graph
        n, e = graph.num_nodes, graph.num_edges
        self.room = None
        if budget is None:
            self.parts = min(parts, max(n, 1))
            self.vertex_rows, self.edge_capacity = max(-(-n // self.parts), 1), None
            return
        persistent = sum(v.nbytes for v in variables)
        # Stages hold memory one at a time: the most small values one of them holds
        # (per-graph values count a row per graph).
        small = max([sum(op.nbytes if plan.space[op] is None else
                         plan.num_graphs * row_bytes(op)
                         for op in s.inputs + s.ops + s.views
                         if plan.space[op] in (None, GRAPH_ROWS)) for s in plan.stages],
                    default=0)

        def stage_row_bytes(kind, space):
            return max([sum(row_bytes(op) for op in s.inputs + s.ops + s.views
                            if plan.space[op] == space)
                        for s in plan.stages if s.kind == kind], default=0)

        # A vertex block's readout graphs: an edge and a row per row of the block.
        vertex_row = stage_row_bytes("vertex", "n") + len(plan.readouts) * (
            INDEX_BYTES_PER_EDGE + INDEX_BYTES_PER_ROW)
        self.node_row = node_row = stage_row_bytes("edge", "n") + INDEX_BYTES_PER_ROW
        self.edge_row = edge_row = stage_row_bytes("edge", "e") + INDEX_BYTES_PER_EDGE
        self.room = room = budget - persistent - small
        if room <= 0:
            raise ChunkingError(f"memory_budget={budget} bytes leaves no room: the weights "
                                f"and small values alone take {persistent + small} bytes")
        self.vertex_rows = int(min(max(n, 1), room // max(vertex_row, 1)))
        if self.vertex_rows < 1:
            raise ChunkingError(f"memory_budget={budget} bytes cannot hold one row of a "
                                f"vertex stage ({vertex_row} bytes)")
        for p in [parts] if parts else range(1, max(n, 1) + 1):
            block = -(-n // p)
            edges = (room - (2 * block + 1) * node_row) // edge_row
            if edges >= max(1, -(-e // (p * p))) or parts and edges >= 1:
                self.parts, self.edge_capacity = p, int(edges)
                return
        raise ChunkingError(f"memory_budget={budget} bytes cannot hold the rows and edges of "
                            f"one piece of {'a' if parts is None else parts} x "
                            f"{'P' if parts is None else parts} chunking")

    def fits(self, rows, edges):
        """Whether a piece slot of `rows` rows and `edges` edges fits the budget."""
        return self.room is None or rows * self.node_row + edges * self.edge_row <= self.room


class ChunkedProgram:
    """The executor of a computation run chunk by chunk (see the module doc); `stats`
    holds the last call's figures."""

    @staticmethod
    def wanted(computation):
        """Whether `computation`, on a transformer with a memory budget or a chunk count,
        runs chunk by chunk: it has graph ops, and the chunk count is fixed or the
        unchunked plan needs more than the budget."""
        t = computation.transformer
        if not any(op.row_space is not None for op in computation.ordered_ops):
            return False
        return t.chunks is not None or plan_bytes(computation) > t.memory_budget

    def __init__(self, computation):
        self.computation = computation
        transformer = self.transformer = computation.transformer
        budget = transformer.memory_budget
        with built_for(None):
            results = rewrite_for_chunks(computation.results)
        self.results = results
        graph, readouts = chunked_graphs(ordered_ops(results))
        self.plan = plan = Plan(results, graph, readouts)
        for r in results:
            if plan.kind[r] in ("leaf", "view"):
                raise ChunkingError(f"memory_budget: the result {r} is not computed by the "
                                    "computation (a leaf or a view); return a computed value")
            if plan.space[r] == GRAPH_ROWS:
                raise ChunkingError(f"memory_budget: the result {r} has a row per vertex but "
                                    f"holds per-graph rows (a readout before its row cut); "
                                    f"return its first {plan.num_graphs} rows")
        self.sizes = sizes = Sizes(plan, budget, transformer.chunks, computation.variables)
        capacity = sizes.edge_capacity
        if graph.varies and capacity is None:      # a chunk count for any load: P pieces
            capacity = max(-(-graph.num_edges // sizes.parts), 1)
        while True:
            self.grid = ChunkGrid(graph, sizes.parts, capacity, transformer.selective_scheduling)
            rows, edges = self.grid.capacities() if not graph.varies else \
                self.grid.bounds(capacity)
            if sizes.fits(rows, edges):
                break
            # The pieces' used rows outgrew the two blocks the sizes assumed: smaller pieces.
            capacity = edges * 2 // 3
            if capacity < 1:
                raise ChunkingError(f"memory_budget={budget} bytes cannot hold one piece of "
                                    f"{sizes.parts} x {sizes.parts} chunking")
        # A slot (a GraphLoader's) changes its edges between calls: its grid is cut again
        # for each load (`grid_for`), into pieces within the bounds the ChunkSlot holds.
        self.capacity, self.grid_version = capacity, getattr(graph, "version", None)
        self.slot = ChunkSlot(rows, edges)
        self.budget = budget
        self.parameters = {p: i for i, p in enumerate(computation.parameters)}
        # One RowBlock per block size, shared by the vertex stages: their index arrays (the
        # blocks' readout graphs) are held on the device once, not per stage.
        self.row_blocks = {}
        self.runners = [StageRunner(self, k, stage) for k, stage in enumerate(plan.stages)]
        self.graphs = [self.slot] + [g for h in self.row_blocks.values()
                                     for g in [h, *h.readouts.values()]]
        transformer.drop_graphs(self.graphs)
        # The host drops a value after the last stage that reads it.
        last_read = {a: k for k, stage in enumerate(plan.stages) for a in stage.inputs}
        self.dead_after = [[a for a, k in last_read.items() if k == index and
                            a not in results and not isinstance(a, (Placeholder, Constant))]
                           for index in range(len(plan.stages))]
        self.stats = {"chunks": self.grid.parts, "pieces": len(self.grid.pieces),
                      "stages": len(self.runners), "vertex_block_rows": self.sizes.vertex_rows}

    @property
    def source(self):
        return "\n\n".join(f"# ---- stage {r.index} ({r.stage.kind}) ----\n{c.source}"
                           for r in self.runners for c in r.computations.values())

    def __call__(self, *args):
        *values, step = args
        t = self.transformer
        self.host = {}
        self.moved = {"to": 0, "from": 0, "to edge stages": 0}
        self.timing = {"prefetch": 0.0, "waited": 0.0}
        self.grid_for(self.plan.graph)
        t.evict()
        t.hold_graphs(self.graphs)
        t.device_peak = t.device_allocated
        started = time.perf_counter()
        try:
            with ThreadPoolExecutor(max_workers=1) as reader:
                for runner, dead in zip(self.runners, self.dead_after):
                    runner.run(values, step, reader)
                    for op in dead:
                        del self.host[op]
        finally:        # a failed call (a NaN read from disk) leaves no device memory held
            t.evict()
            t.drop_graphs(self.graphs)
        prefetch, waited = self.timing["prefetch"], self.timing["waited"]
        self.stats.update({
            "device_peak_bytes": t.device_peak, "budget_bytes": self.budget,
            "bytes_to_device": self.moved["to"], "bytes_from_device": self.moved["from"],
            "edge_stage_bytes_to_device": self.moved["to edge stages"],
            "seconds": time.perf_counter() - started, "transfer_seconds": prefetch,
            "hidden_transfer_share": max(0.0, prefetch - waited) / prefetch if prefetch else 1.0,
            "loaded_rows": self.grid.loaded_rows})
        outputs = [self.host[r] for r in self.results]
        self.host = None
        return outputs

    def grid_for(self, graph):
        """The grid of the edges `graph` holds now: cut again when a slot was loaded since
        the last cut (its pieces within the ChunkSlot's bounds)."""
        if graph.varies and graph.version != self.grid_version:
            self.grid = ChunkGrid(graph, self.sizes.parts, self.capacity,
                                  self.transformer.selective_scheduling)
            self.grid_version = graph.version
            self.slot.cache_left = PIECE_CACHE_BYTES       # the old pieces go with their grid
            self.stats.update(pieces=len(self.grid.pieces))

    # ---- values on the host ----------------------------------------------------------
    def value(self, op, values):
        if op in self.host:
            return self.host[op]
        if isinstance(op, Placeholder):
            return values[self.parameters[op]]
        return op.value            # a constant with a row per vertex or edge


class StageRunner:
    """One stage: its computation(s) and how it streams."""

    def __init__(self, program, index, stage):
        self.program = program
        self.index = index
        self.stage = stage
        plan, t = program.plan, program.transformer
        name = f"{program.computation.name}.stage{index}_{stage.kind}"
        self.holders = {}          # RowBlock per block size (vertex stages)
        if stage.kind == "vertex":
            n, rows = plan.graph.num_nodes, program.sizes.vertex_rows
            self.blocks = [(s, min(s + rows, n)) for s in range(0, n, rows)]
            sizes = sorted({stop - start for start, stop in self.blocks}, reverse=True)
            self.holders = {r: program.row_blocks.setdefault(r, RowBlock(r, plan.readouts))
                            for r in sizes}
            self.computations = {r: self._compile(t, f"{name}_{r}", {"n": r},
                                                  self.holders[r]) for r in sizes}
        elif stage.kind == "edge":
            slot = program.slot
            self.computations = {None: self._compile(
                t, name, {"n": slot.num_nodes, "e": slot.num_edges}, slot)}
        else:
            self.computations = {None: self._compile(t, name, {}, None)}

    # ---- building ---------------------------------------------------------------------
    def _compile(self, transformer, name, rows, holder):
        plan, stage = self.program.plan, self.stage
        mapping, params = {}, []
        for k, a in enumerate(stage.inputs):
            space = plan.space[a]
            shape = (rows[space],) + a.shape[1:] if space in ROWS else plan.stage_shape(a)
            p = Placeholder(shape, a.dtype, name=f"in{k}", sparse=a.is_sparse)
            mapping[a] = p
            params.append(p)
        members = set(stage.ops) | set(stage.views)
        with built_for(None):
            for op in plan.ops:
                if op in members:
                    mapping[op] = clone(op, [mapping.get(a, a) for a in op.args],
                                        plan, rows, holder)
        comp = transformer.computation_class(transformer, [mapping[o] for o in stage.outputs],
                                             params, name=name)
        comp.transient = comp.stage = True
        transformer.computations.append(comp)
        comp.transform()
        return comp

    # ---- running ----------------------------------------------------------------------
    def run(self, values, step, reader):
        program, stage = self.program, self.stage
        host = program.host
        plan = program.plan
        for o in stage.outputs:
            space = plan.space[o]
            if o in plan.partial:       # folded from partial results by its table row
                host[o] = np.full(plan.stage_shape(o), partial_combiner(o).identity_in(o.dtype),
                                  o.dtype)
            elif space in ROWS and stage.kind in ("vertex", "edge"):
                host[o] = np.empty(o.shape, o.dtype)
        if stage.kind == "vertex":
            items = self.blocks
        elif stage.kind == "edge":
            items = program.grid.pieces
        else:
            items = [None]
        pending = reader.submit(self.feeds, items[0], values)
        for k, item in enumerate(items):
            waited = time.perf_counter()
            feeds, seconds = pending.result()
            program.timing["waited"] += time.perf_counter() - waited
            program.timing["prefetch"] += seconds
            if k + 1 < len(items):
                pending = reader.submit(self.feeds, items[k + 1], values)
            comp = self.show(item)
            program.transformer.make_resident(comp)
            outs = comp.executor(*feeds, step)
            program.moved["from"] += sum(o.nbytes for o in outs)
            self.store(item, outs)
        for o in stage.outputs:
            if isinstance(o, Aggregate) and o.combiner.identity != 0:
                host[o][without_edges(o, host[o].shape[0])] = 0       # still the identity

    def show(self, item):
        if self.stage.kind == "vertex":
            start, stop = item
            self.holders[stop - start].show(start, stop)
            return self.computations[stop - start]
        if self.stage.kind == "edge":
            self.program.slot.show(item)
        return self.computations[None]

    def feeds(self, item, values):
        """The inputs of one block or piece (run on the reader thread)."""
        started = time.perf_counter()
        program, plan = self.program, self.program.plan
        slot = program.slot
        out = []
        for a in self.stage.inputs:
            whole = program.value(a, values)
            space = plan.space[a]
            if space is None:
                part = whole
            elif space == GRAPH_ROWS:
                part = whole[:plan.num_graphs]     # a constant's rows past the graphs: unread
            elif self.stage.kind == "vertex":
                part = read_rows(whole, *item)
                if isinstance(whole, np.memmap) and program.transformer.check_finite and \
                        a.dtype.kind == "f" and not np.isfinite(part).all():
                    raise ValueError(f"parameter {a.name!r} contains NaN or Inf values in "
                                     f"rows {item[0]} to {item[1]}")
            elif a.is_sparse:
                part = padded_sparse(whole, item.rows, slot.num_nodes)
            else:
                ids = item.rows if space == "n" else item.eids
                rows = slot.num_nodes if space == "n" else slot.num_edges
                # Padding rows hold ones: the padding edges that read them compute finite
                # values (no 0 / 0) that no real row reads.
                part = np.ones((rows,) + a.shape[1:], a.dtype)
                np.take(whole, ids, axis=0, out=part[:ids.shape[0]])
            if space is not None:
                nbytes = part.data.nbytes if hasattr(part, "indptr") else part.nbytes
                program.moved["to"] += nbytes
                if self.stage.kind == "edge":
                    program.moved["to edge stages"] += nbytes
            out.append(part)
        return out, time.perf_counter() - started

    def store(self, item, outs):
        plan, host = self.program.plan, self.program.host
        for o, val in zip(self.stage.outputs, outs):
            space = plan.space[o]
            if plan.is_readout_op(o):
                combine_readout(host[o], o, o.graph.dst[item[0]:item[1]], val)
            elif isinstance(o, Aggregate):
                combine_aggregate(host[o], o, item, val)
            elif o in plan.partial:
                partial_combiner(o).ufunc(host[o], val, out=host[o])
            elif space in ROWS and self.stage.kind == "vertex":
                host[o][item[0]:item[1]] = val
            elif space == "e" and self.stage.kind == "edge":
                host[o][item.eids] = val[:item.num_edges]
            else:
                host[o] = val


def partial_combiner(op):
    """The reduction table row that folds `op`'s partial results: its kind's (a
    contraction's partials, X^T @ D over row blocks, are sums)."""
    return (op.combiner or COMBINERS["sum"]).partial_combiner


def without_edges(op, rows):
    """Which of the first `rows` rows of aggregation `op` have no edge at its end."""
    degrees = op.graph.in_degrees if op.at == "dst" else op.graph.out_degrees
    return degrees[:rows] == 0


def combine_aggregate(acc, op, piece, partial):
    """Folds a piece's partial aggregation into the whole one (rows are unique within a
    piece, so fancy-index updates are exact)."""
    if op.at == "dst":
        rows, part = piece.rows[:piece.num_dst], partial[:piece.num_dst]
        ends = piece.dst
    else:
        rows, part = piece.rows, partial[:piece.rows.shape[0]]
        ends = piece.src
    if op.combiner.identity != 0:    # a row without edges in the piece holds 0, no partial
        active = np.bincount(ends, minlength=rows.shape[0])[:rows.shape[0]] > 0
        rows, part = rows[active], part[active]
    op.combiner.fold(acc, rows, part)


def combine_readout(acc, op, graph_ids, partial):
    """Folds a row block's partial readout (aggregation over a readout graph at the
    graphs), `graph_ids` the graphs of the block's rows, into the whole one. A sum adds
    every graph's partial (0 where the block has none of its rows); a max or min combines
    only the graphs with rows in the block. Blocks come in row order, so the sum is
    always added in the same order."""
    if op.combiner.identity == 0:
        acc += partial
        return
    active = np.bincount(graph_ids, minlength=acc.shape[0]) > 0
    op.combiner.fold(acc, active, partial[active])


def padded_sparse(matrix, rows, num_rows):
    import scipy.sparse
    picked = matrix[rows]
    pad = scipy.sparse.csr_matrix((num_rows - rows.shape[0], matrix.shape[1]),
                                  dtype=matrix.dtype)
    return scipy.sparse.vstack([picked, pad], format="csr")


def clone(op, args, plan, rows, holder):
    """`op` on the stage's block-sized arguments: attributes that name a row count (shapes,
    slice keys) take the block's, a graph op runs over the stage's ChunkSlot and a dropout
    keys its rows by the ids the holder shows."""
    space = plan.space[op]
    if plan.is_readout_op(op):
        return readout_clone(op, args, holder)
    if space == "bcast":
        space = "n" if op.shape[0] == plan.graph.num_nodes else "e"
    new_rows = rows.get(space) if space in ROWS else None
    if isinstance(op, SparseDropout):
        return SparseDropout(args[0], op.rate, seed=op.seed, name=op.name,
                             rows=(holder, "global_node_ids"))
    values = {}
    for attr in op.attributes:
        value = getattr(op, attr.field)
        if attr.field == "graph":
            value = holder
        elif attr.field == "rows" and space in ROWS:
            value = (holder, "global_node_ids" if space == "n" else "global_edge_ids")
        elif new_rows is not None and attr.batching == "shape":
            value = (new_rows,) + tuple(value[1:])
        elif space == GRAPH_ROWS and attr.batching == "shape":
            value = plan.stage_shape(op)     # row keys stay: they cut within the graphs
        elif new_rows is not None and attr.batching == "index":
            value = (slice(0, new_rows, 1),) + tuple(value[1:])
        values[attr.keyword] = value
    return type(op)(*args, **values, name=op.name)


def readout_clone(op, args, holder):
    """A graph op over a readout graph R, in a vertex stage over row block `holder`: a
    gather by source and an aggregation at the source are the rows themselves (each row is
    one edge of R); a gather by destination and an aggregation at the destination run
    over the block's share of R, the latter cut to the graphs' rows."""
    (x,) = args
    if isinstance(op, Gather) and op.by == "src" or isinstance(op, Aggregate) and op.at == "src":
        return x
    block = holder.readouts[op.graph]
    if isinstance(op, Gather):
        return Gather(x, block, by="dst", name=op.name)
    pooled = Aggregate(x, block, at="dst", reduce=op.reduce, name=op.name)
    return pooled if block.num_nodes == block.num_dst else pooled[:block.num_dst]
