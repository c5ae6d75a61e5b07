"""GPU kernels: one GPUKernel per planned root op, rendered from the Jinja templates.

`GPUKernelGenerator.kernel_for(root, step)` dispatches on the root's type (ngraph's
`GPUKernelGroup.add_kernel`); every generator reads its inputs through `Block.value`, so
the ops the kernel plan inlines are computed in registers, and ElementWiseKernel (any op
evaluable per element, plus everything inlined into it) is the default.

Kernels name values as the IR does (ngnn/naming.py): the kernel writing `%8` of fused
group fusedGraph3 is `fusedGraph3_t_8` (outside a group its template's prefix, `ew_t_8`),
its output parameter `t_8`, an input `%3` the parameter `t_3`; every statement computing
an op ends with the IR's statement of it (`// %8 = divide(%6, %7)`).
"""
import re
from collections import namedtuple

import numpy as np

from ngnn.dispatch import TypeDispatched, on_type
from ngnn.naming import Namer
from ngnn import philox
from ngnn.op_graph import (Aggregate, Communication, Concat, Dot, EdgeSoftmax, LogSoftmax,
                           MasterBroadcast, MirrorReduce, Op, PackedCollective, ReadoutAllReduce,
                           Reduction, Softmax, SparseDot, SparseTransposedDot, Unslice)
from ngnn.op_graph.layout import slice_length
from ngnn.op_graph.printer import IRNames, op_comment
from ngnn.op_graph.sparse import sparse_source
from ngnn.passes import KernelGroup

from .expressions import (Block, KernelParams, ReadAcrossWorkGroups, broadcast_coords,
                          converted, ctype, evaluate, extreme, flat_index, literal,
                          unravel)
from .runtime import template_environment
from .schedule import edge_schedule

PREFIXES = {"elementwise.j2": "ew", "reduce.j2": "reduce", "softmax.j2": "softmax",
            "gemm.j2": "gemm", "vertex_rows.j2": "agg",
            "partial.j2": "partial", "sparse_dot.j2": "spmm"}
WORK_GROUP = 256
GEMM_TILE = 16
FEATURE_THREADS = 64
ROW_GROUP = 128
SPARSE_STAGED = 256       # stored values a sparse product's work-group stages at a time
CHUNKS_PER_GROUP = 2      # a partial kernel's work-group walks about as many edges as others
# A graph's index arrays with one entry per edge (or per CSR slot).
EDGE_INDEXED = {"src", "dst", "in_eids", "out_eids", "in_src", "out_dst", "in_to_out",
                "out_to_in"}


def row_launch(rows, row_size, most_rows=ROW_GROUP):
    """Global and local sizes of the templates that give each sparse row (or chunk of a
    heavy row's edges) a row of work-items across its features and loop over its values:
    as many rows per work-group as fill ROW_GROUP work-items, up to `most_rows`, so narrow
    rows (one value per head, one feature) still fill the GPU's warps; a row past `rows`
    returns at once."""
    local = pow2_at_most(row_size, FEATURE_THREADS)
    per_group = max(1, min(ROW_GROUP // local, most_rows))
    return (local, round_up(rows, per_group)), (local, per_group)


def uses(text, name):
    """Whether C source `text` reads the variable `name`."""
    return re.search(rf"\b{name}\b", text) is not None


def pow2_at_most(n, limit):
    """The largest power of two <= min(n, limit), at least 1 (tree reductions need 2**k)."""
    size = 1
    while size * 2 <= min(n, limit):
        size *= 2
    return size


def round_up(n, step):
    return -(-n // step) * step


class ChunkPartials:
    """The scratch buffer of a reduction's partial results over the heavy rows' chunks of
    an edge schedule: one row of `width` values (`dtype`) per chunk (a value per feature;
    a one-pass softmax's three)."""

    def __init__(self, reduction, schedule):
        self.reduction, self.schedule = reduction, schedule
        self.dtype = reduction.dtype
        self.shape = (max(schedule.num_chunks, 1), reduction.width)
        self.nbytes = int(np.prod(self.shape)) * self.dtype.itemsize
        self.arrivals = ChunkArrivals(self)

    def __repr__(self):
        return f"<ChunkPartials {self.reduction.key[0]} {self.shape}>"


class ChunkArrivals:
    """Per heavy row (at its first chunk), how many of a partial kernel's work-groups have
    written their partials: zero between launches (the last one resets it)."""

    def __init__(self, partials):
        self.partials = partials
        self.dtype = np.dtype(np.int32)
        self.shape = (partials.shape[0],)
        self.nbytes = 4 * partials.shape[0]

    def __repr__(self):
        return f"<ChunkArrivals of {self.partials}>"


class GPUKernel:
    """A kernel of a computation: template and fields to render it in either dialect, the
    launch geometry, and `bindings`, what each parameter is bound to at launch:
    ("out", op), ("tensor", op), ("graph", graph, attribute) (a graph's or its edge
    schedule's index array), ("sparse", placeholder, part), ("scratch", ChunkPartials) or
    ("step",). A kernel writes `outputs` (a per-vertex kernel of a group may write
    several); a partial kernel's output is its ChunkPartials (`partials`); `walk` is the
    edge schedule its work-groups follow and how ("vertex", "edge" or "partial").
    `out` is the C name of the (first) output, `values` the IR names of the values it
    computes (a partial kernel: the reduction's) and `comment` the program's comment
    above it."""

    def __init__(self, name, op, template, fields, params, global_size, local_size,
                 partials=None, walk=None, outputs=None, out="out", values=(), comment=""):
        self.name = name
        self.op = op
        self.out = out
        self.values = list(values)
        self.comment = comment
        self.outputs = [] if partials else list(outputs or [op])
        self.template = template
        self.fields = fields
        self.inputs = list(params.tensors)
        self.input_names = dict(params.tensors)      # stored input -> its C parameter
        self.edge_inputs = set(params.edge_inputs)    # inputs read one row per edge walked
        self.partials = partials
        self.walk = walk
        out_dtype = partials.dtype if partials else op.dtype
        self.uses_double = params.uses_double or out_dtype == np.float64
        self.bindings = ([("scratch", partials), ("scratch", partials.arrivals)] if partials
                         else [("out", o) for o in self.outputs]) + \
            [("tensor", t) for t in params.tensors] + \
            [("graph", g, attr) for g, attr in params.graph_arrays] + \
            [("sparse", p, part) for p, part in params.sparse_arrays] + \
            [("scratch", b) for b in params.scratch] + \
            ([("step",)] if params.uses_step else [])
        decls = [f"GLOBAL {ctype(out_dtype)}* RESTRICT {out}"]
        decls += ["GLOBAL int* RESTRICT arrivals"] if partials else []
        decls += [f"GLOBAL {ctype(o.dtype)}* RESTRICT {params.written[o]}"
                  for o in self.outputs[1:]]
        decls += [f"GLOBAL const {ctype(t.dtype)}* RESTRICT {name}"
                  for t, name in params.tensors.items()]
        decls += [f"GLOBAL const int* RESTRICT {name}" for name in params.graph_arrays.values()]
        decls += [f"GLOBAL const {ctype(p.dtype) if part == 'data' else 'int'}* RESTRICT {name}"
                  for (p, part), name in params.sparse_arrays.items()]
        decls += [f"GLOBAL const {ctype(b.dtype)}* RESTRICT {name}"
                  for b, name in params.scratch.items()]
        decls += ["uint step"] if params.uses_step else []
        self.signature = ", ".join(decls)
        self.global_size = tuple(global_size)
        self.local_size = tuple(local_size)

    def render(self, dialect):
        template = template_environment().get_template(self.template)
        return template.render(dialect=dialect, name=self.name, params=self.signature,
                               out=self.out, **self.fields).strip("\n")

    def global_bytes(self):
        """Bytes this kernel moves to and from global memory, as a perfectly cached run
        touches them (`traffic`, summed): the same measure for fused and unfused plans."""
        return sum(nbytes for _, nbytes in self.traffic())

    def traffic(self):
        """(buffer, bytes) for each buffer the kernel touches: its outputs, scratch buffers
        and dense inputs whole, except where its edge loops walk only part of the graph's
        edges (a partial kernel its heavy rows, a per-vertex kernel its light ones;
        EdgeSchedule.walked_share): of an input its edge loops read one row per edge, or
        an edge-indexed graph array, it touches those edges' rows, of a node-sized input
        the rows of the vertices it reads at."""
        edges, vertices = (1.0, 1.0) if self.walk is None else \
            self.walk[0].walked_share(self.walk[1])
        graph = self.walk[0].graph if self.walk else None

        def share(t):
            if t in self.edge_inputs:
                return edges
            return vertices if graph is not None and t.shape and \
                t.shape[0] == graph.num_nodes else 1.0
        out = [(o, o.nbytes) for o in self.outputs]
        out += [(b[1], b[1].nbytes) for b in self.bindings if b[0] == "scratch"]
        out += [(t, round(t.nbytes * share(t))) for t in self.inputs]
        for kind, owner, attribute in (b for b in self.bindings if b[0] == "graph"):
            array = np.asarray(getattr(owner, attribute))
            indexed = attribute in EDGE_INDEXED and owner is graph
            out.append((f"{attribute}", round(4 * array.size * (edges if indexed else 1.0))))
        return out

    def edges_per_work_group(self):
        """The number of edges each work-group of this kernel walks, in launch order (an
        empty array for a kernel without an edge loop): a per-vertex kernel's work-group
        walks its light rows' edges (a heavy row's value is folded from partials), an edge
        kernel's also each heavy row's piece, a partial kernel's its chunks."""
        if self.walk is None:
            return np.zeros(0, np.int64)
        schedule, how = self.walk
        if how == "partial":
            sizes = (schedule.chunk_end - schedule.chunk_start).astype(np.int64)
            per_group = self.local_size[1]
            sizes = np.concatenate([sizes, np.zeros(-sizes.size % per_group, np.int64)])
            return sizes.reshape(-1, per_group).sum(axis=1)
        light = schedule.light_edges_per_group()
        if how == "edge":
            pieces = (schedule.piece_end - schedule.piece_start).astype(np.int64)
            return np.concatenate([light, pieces]) if schedule.has_heavy_rows else light
        return light

    def __repr__(self):
        return f"<GPUKernel {self.name} {self.template} global={self.global_size}>"


class HostStep:
    """A communication op, run on the host between kernels: its input is downloaded, the
    rank's exchange (MPI) computes the result, which is uploaded. `inputs` as a kernel's."""

    def __init__(self, op, plan):
        self.op = op
        self.name = f"host_{op.op_name}"
        self.inputs = [plan.base(a) for a in op.args]
        self.bindings = []        # no device parameters: it moves tensors through the host

    def bind(self, xs, out):
        """The launch: a function of no arguments moving the tensors xs (the op's
        arguments') into out's."""
        op = self.op

        def run():
            values, result = [x.get() for x in xs], np.empty(op.shape, op.dtype)
            value = values[0]
            if isinstance(op, PackedCollective):
                op.packing.run(values, out=result)
            elif isinstance(op, MirrorReduce):
                op.graph.reduce_to_masters(value, op.reduce, op.at, out=result)
            elif isinstance(op, MasterBroadcast):
                op.graph.broadcast_to_mirrors(value, out=result)
            elif isinstance(op, ReadoutAllReduce):
                op.graph.combine_ranks(value, op.reduce, out=result)
            else:
                op.exchange.allreduce(value, out=result)
            out.set(result)
        return run


generate = on_type
# One output's loop in vertex_rows.j2: a per-vertex one (`row` elements per vertex, `body`)
# or an edge one (also `hoisted`, `value`, its output `out`, the `slot` it writes and the
# C name of the edge ids `eids`, None where the loop does not read them).
RowLoop = namedtuple("RowLoop", "row body edge hoisted value out slot eids",
                     defaults=(False, "", "", "out", "eid", None))
# Ops the generator gives a template of their own (everything else is element-wise).
OWN_TEMPLATES = (Communication, Concat, Unslice, Reduction, Softmax, Dot, SparseDot,
                 SparseTransposedDot, EdgeSoftmax)


def loop_order(plan, results):
    """{edge value: (graph, "dst" or "src")}: the edge values stored in the order of the CSR their
    group walks (the in-CSR for "dst"), so the loops that write and read them index them by
    CSR slot, `x[k]`, not by edge id, `x[eids[k]]`; a loop over the other CSR reads them
    through one permutation (Graph.in_to_out, out_to_in). That holds for an edge value a
    fused group stores over a graph of fixed edges and only graph kernels of groups over
    that graph read, each inside its edge loops: not a result (read back in edge order),
    not read by a dense kernel or through a view. The NumPy transformer keeps such values
    in in-CSR order too (transformers/numpy/fused.py, csr_ordered_values)."""
    readers = {}
    for step in plan.steps:
        reads = step.inputs if isinstance(step, KernelGroup) else getattr(step, "args", ())
        for op in reads:
            readers.setdefault(op, []).append(step)
    viewed = {view.args[0] for view in plan.views}
    results = set(results)
    order = {}
    for step in plan.steps:
        group = step.group if isinstance(step, KernelGroup) else None
        if group is None or group.graph.varies:
            continue
        for op in step.outputs:
            walks = GPUKernelGenerator.walked(op, group) or isinstance(op, EdgeSoftmax)
            if op.scope == "e" and walks and op not in results and op not in viewed and \
                    all(isinstance(r, KernelGroup) and r.group is not None and
                        r.group.graph is group.graph for r in readers.get(op, ())):
                order[op] = (group.graph, op.at if isinstance(op, EdgeSoftmax) else group.at)
    return order


class GPUKernelGenerator(TypeDispatched):
    """`names`: the computation's IRNames (Computation.value_names), which kernel names,
    parameters and comments use."""

    def __init__(self, plan, results=(), names=None):
        self.plan = plan
        self.layout = loop_order(plan, results)
        self.names = names if names is not None else IRNames()
        self.namer = Namer()
        self.step = None
        self.partial_buffers = {}     # (reduction key, graph, at, inlined ops) -> ChunkPartials
        self.pending = []             # partial kernels the next kernel reads

    def kernels_for(self, step, roots):
        """The kernels writing `roots`, computing what `step` (a KernelGroup, or the root
        op alone) inlines, each after the partial kernels it reads. A group's consecutive
        per-vertex and edge outputs share one kernel, one walk of the edge schedule."""
        self.step = step
        group = step.group if isinstance(step, KernelGroup) else None
        kernels, run = [], []
        for root in list(roots) + [None]:
            if root is not None and group is not None and self.walked(root, group):
                run.append(root)
                continue
            if run:
                kernels += self.vertex_rows_of(run, group.graph, group.at)
                run = []
            if root is None:
                break
            if isinstance(step, KernelGroup) and step.epilogue is not None:
                kernel = self.product(step.epilogue, epilogue=root)
            else:
                kernel = self.generate(root)
            kernels, self.pending = kernels + self.pending + [kernel], []
        return kernels

    @staticmethod
    def walked(op, group):
        """Whether a group's output is written from its walk of the edges: a per-vertex or
        per-edge value computed element by element (an edge softmax, which walks its own
        end, and the ops with templates of their own are not)."""
        rows = {"n": group.graph.num_nodes, "e": group.graph.num_edges}.get(op.scope)
        return bool(op.ndim) and op.shape[0] == rows and not isinstance(op, OWN_TEMPLATES)

    def vertex_rows_of(self, ops, graph, at):
        """One kernel writing `ops`; where an output reads an earlier one at a vertex
        another work-group owns, the outputs before it in one kernel (or several) and
        the rest, from it on, after them."""
        pending, buffers = list(self.pending), dict(self.partial_buffers)
        try:
            kernel = self.vertex_rows(ops, graph, at)
        except ReadAcrossWorkGroups as split:
            if not split.part:
                raise       # an output read before any is written: a planning error
            self.pending, self.partial_buffers = pending, buffers
            return self.vertex_rows_of(ops[:split.part], graph, at) + \
                self.vertex_rows_of(ops[split.part:], graph, at)
        kernels, self.pending = self.pending + [kernel], []
        return kernels

    def params(self, computed=None):
        group = self.step if isinstance(self.step, KernelGroup) else None
        if computed is None:
            computed = group.inlined if group else set()
        params = KernelParams(self.plan, computed, self.names,
                              group.recomputed if group else ())
        params.layout = self.layout
        params.partial_kernels = self.partial_buffer
        return params

    def kernel(self, op, template, fields, params, global_size, local_size, prefix=None,
               **kinds):
        # The template's prefix keeps kernel names clear of C functions (exp, max, ...).
        group = self.step.group if isinstance(self.step, KernelGroup) else None
        prefix = group.name if group else prefix or PREFIXES[template]
        infix = "_partial" if template == "partial.j2" and group else ""
        name = self.namer(f"{prefix}{infix}_{params.identifier(op)}")
        if kinds.get("partials"):
            values = [self.names[op]]
            comment = f"{name}: the partials of {op_comment(op, self.names)}"
        else:
            outputs = kinds.get("outputs") or [op]
            values = [self.names[o] for o in outputs]
            comment = "\n   ".join([f"{name}:"] + [op_comment(o, self.names)
                                                     for o in outputs])
        out = "out" if kinds.get("partials") else params.identifier(op)
        return GPUKernel(name, op, template, fields, params, global_size, local_size,
                         out=out, values=values, comment=comment, **kinds)

    def vertex_rows(self, ops, graph, at):
        """One kernel writing `ops` from one walk of the graph's edge schedule, one loop
        (`RowLoop`) per output: a per-vertex output over the schedule's rows, reading one
        written before it (after a barrier) at its own vertex only, which its work-group
        wrote; an edge output (a group's stored edge value, an edge softmax) over each
        row's edges, light rows in the schedule's groups, heavy ones in pieces. A later
        per-vertex output reads an edge output back on its own vertex's edges (a light
        row's, which its work-group wrote) and computes it again elsewhere (a partial
        kernel does); an edge part reads none of the kernel's per-vertex outputs (a heavy
        row's piece is walked by a work-group that did not write its vertex): where it
        would, `vertex_rows_of` cuts the kernel before it."""
        schedule = edge_schedule(graph, at)
        params = self.params()
        edge_ops = [op for op in ops if op.scope == "e"]
        outs = [params.identifier(op) for op in ops]
        written = dict(zip(ops, outs)) if len(ops) > 1 else {}
        vertex_computed = set(params.computed) | set(edge_ops)
        # Partial kernels run before this one: they compute its outputs themselves.
        params.partial_computed = set(params.computed) | set(ops)
        pieces = bool(edge_ops) and schedule.has_heavy_rows
        parts = []
        for i, (op, out) in enumerate(zip(ops, outs)):
            row = int(np.prod(op.shape[1:], dtype=np.int64))
            params.written = {o: name for o, name in written.items() if o.scope != "e"}
            try:
                if op.scope == "e":
                    params.computed, params.own_edges = vertex_computed, {}
                    params.vertex = None        # it reads none of the kernel's vertex outputs
                    parts.append(self.edge_part(op, out, params, graph, at))
                    continue
                # Edge outputs written before: read back on the rows this work-group wrote.
                params.own_edges = {o: (graph, at) for o in ops[:i] if o.scope == "e"}
                params.computed = vertex_computed - set(params.own_edges)
                params.written.update((o, written[o]) for o in params.own_edges)
                block = Block(params, indent="        ")
                coords = unravel("gid", op.shape)
                params.vertex = coords[0]
                value = block.compute(op, coords)
                block.emit(f"{out}[gid] = {value};")
                parts.append(RowLoop(row, block.text(), edge=False))
            except ReadAcrossWorkGroups as split:
                split.part = i          # the kernel can write the outputs before this one
                raise
        params.written = written
        fields = {"group_rows": params.graph_array(schedule, "group_rows"),
                  "parts": tuple(parts), "groups": schedule.num_groups, "pieces": pieces,
                  "edges": graph.num_edges}
        if edge_ops:
            fields["indptr"] = self.csr(params, graph, at, "indptr")
        if pieces:
            fields.update({name: params.graph_array(schedule, name) for name in
                           ("row_chunks", "piece_row", "piece_start", "piece_end")})
        tasks = schedule.num_groups + (schedule.num_pieces if pieces else 0)
        row = max(part.row for part in parts)
        local = pow2_at_most(max(1, row * graph.num_nodes // max(schedule.num_groups, 1)),
                             ROW_GROUP)
        return self.kernel(ops[0], "vertex_rows.j2", fields, params, (tasks * local,),
                           (local,), prefix="edge" if edge_ops else "agg",
                           walk=(schedule, "edge" if edge_ops else "vertex"), outputs=ops)

    def edge_part(self, op, out, params, graph, at):
        """The loop of `vertex_rows.j2` writing edge value `op` at each edge of a row,
        with the values it needs once per vertex hoisted before the edge loop."""
        hoisted = Block(params, indent="        ")
        block = Block(params, hoisted, indent="            ")
        block.loop = ("eid", graph, at, "vertex", hoisted)
        block.slot = "k"
        features = op.shape[1:]
        value = block.compute(op, ["eid"] + unravel("f", features))
        slot = "k" if self.layout.get(op) == (graph, at) else "eid"
        text = block.text() + hoisted.text() + value
        eids = self.csr(params, graph, at, "eids") if slot == "eid" or uses(text, "eid") \
            else None
        return RowLoop(int(np.prod(features, dtype=np.int64)), block.text(), edge=True,
                       hoisted=hoisted.text(), value=value, out=out, slot=slot, eids=eids)

    def partial_buffer(self, reduction, params):
        """The partials of `reduction` over its schedule's chunks, for a kernel computing
        the ops `params` computes: made, with the partial kernel writing them, on the
        first request."""
        key = (reduction.key, reduction.graph, reduction.at, id(params.partial_computed))
        if key not in self.partial_buffers:
            schedule = edge_schedule(reduction.graph, reduction.at)
            buffer = ChunkPartials(reduction, schedule)
            self.partial_buffers[key] = buffer
            self.pending.append(self.partial_kernel(buffer, params.partial_computed))
        return self.partial_buffers[key]

    def partial_kernel(self, buffer, computed):
        reduction, schedule = buffer.reduction, buffer.schedule
        params = self.params(computed)
        hoisted = Block(params, indent="        ")
        block = Block(params, hoisted, indent="            ")
        block.loop = ("eid", reduction.graph, reduction.at, "vertex", hoisted)
        block.slot = "k"
        block.reducing = (reduction, "acc")
        value = evaluate(reduction.edge_steps(block, "eid", "vertex",
                                              unravel("f", reduction.features)))
        params.note_dtype(reduction.dtype)
        text = hoisted.text() + block.text() + value
        eids = self.csr(params, reduction.graph, reduction.at, "eids") \
            if uses(text, "eid") else None
        lines = "\n".join
        fields = {"eids": eids, "features": reduction.size, "chunks": buffer.shape[0],
                  "hoisted": hoisted.text(), "edge_compute": block.text(),
                  "declare": lines(reduction.declare("acc")),
                  "fold": reduction.fold("acc", converted(value, reduction.edge_dtype,
                                                          reduction.dtype)),
                  "store": lines(reduction.store("acc", "out", "chunk", "f")),
                  "load_first": lines(reduction.load("acc", "out", "first", "f")),
                  "merge": lines(reduction.merge("acc", "out", "c", "f")),
                  "store_first": lines(reduction.store("acc", "out", "first", "f")),
                  "per_group": CHUNKS_PER_GROUP}
        fields.update({name: params.graph_array(schedule, name)
                       for name in ("chunk_row", "chunk_start", "chunk_end", "row_chunks")})
        (op,) = reduction.key[:1]
        return self.kernel(op, "partial.j2", fields, params,
                           *row_launch(buffer.shape[0], reduction.size, CHUNKS_PER_GROUP),
                           partials=buffer, walk=(schedule, "partial"))

    @generate.on_type(Communication)
    def generate(self, op):
        return HostStep(op, self.plan)

    @generate.on_type(Op)
    def generate(self, op):
        params = self.params()
        block = Block(params)
        value = block.compute(op, unravel("gid", op.shape))
        block.emit(f"{params.identifier(op)}[gid] = {value};")
        return self.elementwise(op, params, block)

    def elementwise(self, op, params, block):
        return self.kernel(op, "elementwise.j2", {"size": op.size, "body": block.text()},
                           params, (round_up(op.size, WORK_GROUP),), (WORK_GROUP,))

    @generate.on_type(Concat)
    def generate(self, op):
        params = self.params()
        block = Block(params)
        coords = unravel("gid", op.shape)
        start = 0
        for i, x in enumerate(op.args):
            stop = start + x.shape[op.axis]
            test = f"({coords[op.axis]}) < {stop}"
            if i == len(op.args) - 1:
                block.emit("} else {" if i else "{")
            else:
                block.emit(f"{'} else ' if i else ''}if ({test}) {{")
            inner = block.child()
            arg_coords = list(coords)
            arg_coords[op.axis] = f"({coords[op.axis]}) - {start}" if start else coords[op.axis]
            value = inner.value(x, arg_coords)
            inner.emit(f"{params.identifier(op)}[gid] = {value};")
            block.lines.extend("    " + line for line in inner.lines)
            start = stop
        block.emit("}")
        return self.elementwise(op, params, block)

    @generate.on_type(Unslice)
    def generate(self, op):
        params = self.params()
        block = Block(params)
        coords = unravel("gid", op.shape)
        tests, inner_coords = [], []
        for c, k in zip(coords, op.key):
            if isinstance(k, int):
                tests.append(f"({c}) == {k}")
                continue
            last = k.start + k.step * (slice_length(k) - 1)
            low, high = min(k.start, last), max(k.start, last)
            tests.append(f"({c}) >= {low} && ({c}) <= {high}")
            if k.step != 1:
                tests.append(f"(({c}) - {k.start}) % {k.step} == 0")
            inner_coords.append(f"(({c}) - {k.start}) / {k.step}")
        block.emit(f"if ({' && '.join(tests) or '1'}) {{")
        inner = block.child()
        out = params.identifier(op)
        inner.emit(f"{out}[gid] = {inner.value(op.args[0], inner_coords)};")
        block.lines.extend("    " + line for line in inner.lines)
        block.emit("} else {")
        block.emit(f"    {out}[gid] = {literal(0, op.dtype)};")
        block.emit("}")
        return self.elementwise(op, params, block)

    @generate.on_type(Reduction)
    def generate(self, op):
        (x,) = op.args
        reduced = [x.shape[a] for a in op.axes]
        kept = [s for i, s in enumerate(x.shape) if i not in op.axes]
        count = int(np.prod(reduced, dtype=np.int64))
        params = self.params()
        block = Block(params, indent="        ")
        kept_coords, reduced_coords = iter(unravel("o", kept)), iter(unravel("r", reduced))
        coords = [next(reduced_coords) if i in op.axes else next(kept_coords)
                  for i in range(x.ndim)]
        acc = ctype(op.dtype)
        value = converted(block.value(x, coords), x.dtype, op.dtype)
        combiner = op.combiner
        if not count:       # every kind gives 0 over nothing, as NumPy's transformer does
            final = literal(0, op.dtype)
        elif combiner.divides:
            final = f"partial[0] / {literal(count, op.dtype)}"
        else:
            final = "partial[0]"
        local = pow2_at_most(count, WORK_GROUP)
        fields = {"acc_type": acc, "local": local,
                  "init": literal(combiner.identity_in(op.dtype), op.dtype), "count": count,
                  "body": block.text(), "fold": combiner.c_fold.format(acc="acc", x=value),
                  "fold_tree": combiner.c_fold.format(acc="partial[lid]",
                                                      x="partial[lid + s]"),
                  "final": final}
        return self.kernel(op, "reduce.j2", fields, params, (op.size * local,), (local,))

    @generate.on_type(Softmax)
    def generate(self, op):
        (x,) = op.args
        count = x.shape[op.axis]
        rows = [s for i, s in enumerate(x.shape) if i != op.axis]
        params = self.params()
        row_coords = unravel("o", rows)
        coords = list(row_coords)
        coords.insert(op.axis, "r")
        fields = {"type": ctype(op.dtype), "lowest": extreme(op.dtype, largest=False),
                  "count": count, "log": isinstance(op, LogSoftmax),
                  "out_index": flat_index(coords, op.shape)}
        for phase in ("max", "sum", "out"):
            block = Block(params, indent="        ")
            fields[f"value_{phase}"] = converted(block.value(x, coords), x.dtype, op.dtype)
            fields[f"body_{phase}"] = block.text()
        local = pow2_at_most(count, WORK_GROUP)
        fields["local"] = local
        num_rows = int(np.prod(rows, dtype=np.int64))
        return self.kernel(op, "softmax.j2", fields, params, (num_rows * local,), (local,))

    @generate.on_type(Dot)
    def generate(self, op):
        return self.product(op)

    def product(self, op, epilogue=None):
        """The tiled product `op`; with `epilogue`, an element-wise op reading it, the
        kernel writes the epilogue's value at each element of the product instead."""
        a, b = op.args
        batch = op.shape[:len(op.shape) - (a.ndim > 1) - (b.ndim > 1)]
        batch_coords = unravel("b", batch)
        m = a.shape[-2] if a.ndim > 1 else 1
        n = b.shape[-1] if b.ndim > 1 else 1
        k = a.shape[-1]
        params = self.params()
        block_a = Block(params, indent="            ")
        a_coords = broadcast_coords(batch_coords, a.shape[:-2], batch) + \
            (["i"] if a.ndim > 1 else []) + ["ka"]
        value_a = block_a.value(a, a_coords)
        block_b = Block(params, indent="            ")
        b_coords = broadcast_coords(batch_coords, b.shape[:-2], batch) + ["kb"] + \
            (["j"] if b.ndim > 1 else [])
        value_b = block_b.value(b, b_coords)
        fields = {"type": ctype(op.dtype), "tile": GEMM_TILE, "m": m, "n": n, "k": k,
                  "body_a": block_a.text(), "value_a": value_a,
                  "body_b": block_b.text(), "value_b": value_b, "epilogue": "",
                  "result": "acc"}
        if epilogue is not None:
            block = Block(params, indent="        ")
            coords = batch_coords + ["i", "j"]
            block.cache[(op, tuple(broadcast_coords(coords, op.shape, op.shape)))] = "acc"
            fields["result"] = block.compute(epilogue, coords)
            fields["epilogue"] = block.text()
        batches = int(np.prod(batch, dtype=np.int64))
        return self.kernel(op if epilogue is None else epilogue, "gemm.j2", fields, params,
                           (round_up(n, GEMM_TILE), round_up(m, GEMM_TILE), batches),
                           (GEMM_TILE, GEMM_TILE, 1))

    @generate.on_type(SparseDot)
    def generate(self, op):
        return self.sparse_product(op, transposed=False)

    @generate.on_type(SparseTransposedDot)
    def generate(self, op):
        return self.sparse_product(op, transposed=True)

    def sparse_product(self, op, transposed):
        """X @ W over X's CSR, or X^T @ D over X's CSC; X's dropouts applied per value."""
        x, dense = op.args
        source, dropouts = sparse_source(x)
        params = self.params()
        arrays = ("colptr", "rowidx") if transposed else ("indptr", "indices")
        ptr, idx = (params.sparse_array(source, part) for part in arrays)
        block = Block(params, indent="                ")
        slot = f"{params.sparse_array(source, 'perm')}[k]" if transposed else "k"
        value = block.declare(op.dtype, f"{params.sparse_array(source, 'data')}[{slot}]")
        row, col = ("other", "row") if transposed else ("row", "other")
        for d in reversed(dropouts):            # innermost first, as they were applied
            keyed = row if d.rows is None else f"{params.graph_array(*d.rows)}[{row}]"
            position = f"(ulong){keyed} * {x.shape[1]}UL + (ulong){col}"
            params.uses_step = True
            comment = params.comment(d)
            keep = block.declare(np.int32, f"philox_word({d.seed}UL, {position}, "
                                 f"(ulong)step) >= {philox.keep_threshold(d.rate)}u", "keep",
                                 comment)
            t = ctype(op.dtype)
            scale = literal(philox.keep_scale(d.rate, op.dtype), op.dtype)
            value = block.declare(op.dtype, f"({value} * {scale}) * ({t}){keep}",
                                  comment=comment)
        dense_block = Block(params, indent="                ")
        dense_value = dense_block.value(dense, ["other", "j"])
        columns = op.shape[1]
        fields = {"ptr": ptr, "idx": idx, "columns": columns, "acc_type": ctype(op.dtype),
                  "body": block.text(), "value": value, "dense_body": dense_block.text(),
                  "dense": dense_value, "rows": op.shape[0]}
        global_size, local_size = row_launch(op.shape[0], columns)
        per_group = local_size[1]
        fields.update(per_group=per_group,
                      chunk=max(local_size[0], SPARSE_STAGED // per_group))
        return self.kernel(op, "sparse_dot.j2", fields, params, global_size, local_size)

    @staticmethod
    def csr(params, graph, at, part):
        """The C name of the `part` ("indptr" or "eids") of the graph's CSR at `at`."""
        return params.graph_array(graph, f"{'in' if at == 'dst' else 'out'}_{part}")

    @generate.on_type(Aggregate)
    def generate(self, op):
        return self.vertex_rows([op], op.graph, op.at)

    @generate.on_type(EdgeSoftmax)
    def generate(self, op):
        return self.vertex_rows([op], op.graph, op.at)
