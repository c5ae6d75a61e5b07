"""NumPy code for a fused group: the group runs over blocks of vertices (slices of the CSR
of its end), so its edge-sized intermediates exist for one block of edges at a time.

Inside a block the statements are the ops' own NumPy templates on block rows; gathers
index with the block's edge ends, aggregations and edge softmaxes are segment reductions
over the block's (sorted) edges. The loop is over blocks of thousands of edges, never over
single vertices or edges.

How many edges a block holds, which aggregations are sparse products and in which order
stored edge values lie are the block plan's (ngnn/passes/block_planning.py, which the
simulator prices too); this module renders it.

A block's values are written into arrays made once per computation (`workspace`, one
arena the groups take turns to use), each as long as the group's longest block: new
arrays for every block cost the allocator and the page faults of fresh memory again and
again (a GAT attention group ran 2 to 6 times slower in blocks of 2 MiB arrays).
"""
import re

import numpy as np

from ngnn.op_graph import Dropout, EdgeSoftmax, Gather
from ngnn.op_graph.printer import IRNames, op_comment
from ngnn.passes.block_planning import heads_of

from . import kernels as K
from .codegen import is_scalar_constant


class BlockShape:
    """A shape whose first axis is the block's row count (a name in the generated code)."""

    def __init__(self, rows, shape):
        self.text = "(" + ", ".join([rows] + [str(d) for d in shape[1:]]) + \
            ("," if len(shape) == 1 else "") + ")"

    def __str__(self):
        return self.text


class FusedGroupWriter:
    """Renders one fused group as its block plan (ngnn.passes.block_planning.GroupBlocks,
    `blocks`) says: the block size, the sparse products, the order of stored edge values."""

    def __init__(self, blocks, names, codegen, graph_ref, value_names=None):
        self.blocks = blocks
        self.group = group = blocks.group
        self.names = names            # op -> name in the generated module (`t_8`)
        self.value_names = value_names or IRNames()     # op -> the IR's name (`%8`)
        self.codegen = codegen
        self.g = graph_ref("graph", group.graph)
        self.csr_ordered = blocks.csr_ordered     # edge values stored in in-CSR order
        # workspace array name -> (rows, shape, dtype): a block value's ("n_e" or "n_v"
        # rows, as many as the longest block has), or a whole tensor's (rows None).
        self.scratch = {}
        self.workspace_bytes = 0

    def block_rows(self):
        """{"n_e": edges, "n_v": vertices} of the group's longest blocks. A graph whose
        edges are replaced between calls (a GraphSlot) has other blocks at every load, so
        its workspace is sized for any load instead: every vertex (a run of vertices
        without edges can make a block of nearly all of them) and the block edge limit
        (only a lone vertex with more edges exceeds it: see scratch_rows)."""
        graph, limit = self.group.graph, self.blocks.block_edges
        if graph.varies:
            return {"n_e": min(graph.num_edges, limit), "n_v": graph.num_nodes}
        blocks = K.blocks(graph, self.group.at, limit)
        return {"n_e": max((p1 - p0 for _, _, p0, p1 in blocks), default=0),
                "n_v": max((v1 - v0 for v0, v1, _, _ in blocks), default=0)}

    def scratch_rows(self, op, name):
        """The rows of the block value `name` of `op`, in the group's workspace array; over
        a varying graph, a block longer than the workspace gets an array of its own."""
        rows, array = "n_e" if op.scope == "e" else "n_v", "w" + name[1:]
        self.scratch[array] = (rows, op.shape, op.dtype)
        if self.group.graph.varies:
            return f"K.block_array({array}, {rows})"
        return f"{array}[:{rows}]"

    def workspace_layout(self):
        """Lines making the group's workspace arrays, laid out one after another (64-byte
        aligned), and the bytes they span."""
        most, lines, offset = self.block_rows(), [], 0
        for name, (rows, shape, dtype) in self.scratch.items():
            full = tuple(shape) if rows is None else (most[rows],) + tuple(shape[1:])
            lines.append(f"    {name} = K.view(workspace[{offset}:], {full}, np.{dtype.name})")
            nbytes = int(np.prod(full, dtype=np.int64)) * dtype.itemsize
            offset += -(-nbytes // 64) * 64
        return lines, offset

    def function(self):
        """Lines of the nested function that runs the group, and the line calling it."""
        g, group = self.g, self.group
        params = [self.names[a] for a in group.inputs if not is_scalar_constant(a)] + ["step"]
        end = "dst" if group.at == "dst" else "src"
        other = "src" if end == "dst" else "dst"
        csr = "in" if end == "dst" else "out"
        self.products, self.row_dots, skipped = (self.blocks.products, self.blocks.row_dots,
                                                 self.blocks.skipped)
        self.row_products = self.blocks.row_products
        lines = [f"def {group.name}({', '.join(params)}):",
                 f"    # {len(group.ops)} ops, {'destination' if end == 'dst' else 'source'}"
                 f"-parallel over the {csr}-CSR; edge values live one block at a time"]
        lines += [f"    {name} = {source}"
                  for name, source in dict(self.product_source(x, w, agg.dtype)
                                           for agg, (x, w) in self.products.items()).items()]
        # Node tensors the gathered row dots read, laid out (N, F, H) once.
        self.dot_tables = {}
        for gather, _ in self.blocks.gathered_dots.values():
            x = gather.args[0]
            if x not in self.dot_tables:
                copy = self.dot_tables[x] = "wf" + self.names[x][1:]
                self.scratch[copy] = (None, (x.shape[0], x.shape[2], x.shape[1]), x.dtype)
                lines.append(f"    np.copyto({copy}, {self.names[x]}.transpose(0, 2, 1))  "
                             f"# the rows of {self.value_names[x]} as (N, F, H), for its row dots")
        # Transposed node tensors the gathers read, copied into contiguous rows once.
        self.tables = {}
        for x in self.blocks.contiguous_tables:
            copy = self.tables[x] = "wc" + self.names[x][1:]
            self.scratch[copy] = (None, x.shape, x.dtype)
            lines.append(f"    np.copyto({copy}, {self.names[x]})  "
                         f"# the rows of {self.value_names[x]}, contiguous for its gathers")
        permuted = end == "src" and any(op in self.csr_ordered
                                        for op in group.inputs + group.outputs)
        if permuted:
            lines.append(f"    in_csr = K.in_csr_positions({g})")
        # Each dropout's keep bits, drawn for the whole tensor at C speed when the group
        # starts and gone when it ends: masks are regenerated by every group that uses them.
        # Dropouts of one mask (a forward dropout and the backward's) share the bits.
        self.keep_names, drawn = {}, {}
        for op in group.ops:
            if isinstance(op, Dropout):
                mask = (op.seed, op.rate, op.shape, op.rows)
                if mask not in drawn:
                    drawn[mask] = "k" + self.names[op][1:]
                    keyed = "" if op.rows is None else "_rows"
                    rows = "" if op.rows is None else f", {self.codegen.mask_rows(op)}"
                    lines.append(f"    {drawn[mask]} = K.dropout_keep{keyed}({op.seed}, "
                                 f"step, {op.rate!r}, {op.shape}{rows})  "
                                 f"# keep bits of {self.value_names[op]}")
                self.keep_names[op] = drawn[mask]
        local, body, self.block_views = {}, [], []
        recomputed = set(group.recomputed)
        for op in group.ops:
            if op not in skipped:
                comment = "  # " + op_comment(op, self.value_names) + \
                    ("  # recomputed" if op in recomputed else "")
                body += ["        " + s + comment for s in self.statements(op, local, end)]
        # The views the block's values are written into, bound first, so that each op
        # is one statement below them.
        body[:0] = ["        " + s for s in self.block_views]
        for op in group.outputs:
            if not (op.fusion_role == "agg" and op.at == end):
                body.append(f"        {self.stored_rows(op)} = {local[op]}")
        lines.append(f"    for v0, v1, p0, p1 in K.blocks({g}, {end!r}, "
                     f"{self.blocks.block_edges}):")
        lines += self.block_bounds(body, csr, end, other, permuted)
        lines += body
        lines[2:2], self.workspace_bytes = self.workspace_layout()
        return lines, f"{group.name}({', '.join(params)})"

    def block_bounds(self, body, csr, end, other, permuted):
        """The lines naming what `body` reads of its block: edge ids, the other ends, the
        segment bounds, the own ends (made, so only where a gather reads them), counts."""
        g, used = self.g, set(re.findall(r"\w+", "\n".join(body)))
        own_ends = self.blocks.reads_own_ends
        lines = []
        if "eids" in used:
            lines.append(f"        eids = {g}.{csr}_eids[p0:p1]")
        if other in used:
            lines.append(f"        {other} = {g}.{csr}_{other}[p0:p1]")
        if "seg" in used or own_ends:
            lines.append(f"        seg = {g}.{csr}_indptr[v0:v1 + 1] - p0")
        if own_ends:
            lines.append(f"        {end} = K.segment_ids(seg, v0)")
        if f"{end}_in_block" in used:
            lines.append(f"        {end}_in_block = {end} - v0")
        if permuted:
            lines.append("        in_pos = in_csr[p0:p1]   # this block's edges in the in-CSR")
        counts = {"n_e": "p1 - p0", "n_v": "v1 - v0"}
        counts = {name: value for name, value in counts.items() if name in used}
        if counts:
            lines.append(f"        {', '.join(counts)} = {', '.join(counts.values())}")
        return lines

    def product_source(self, x, weight, dtype):
        """(name, expression) of the gathered node tensor as a sparse product in `dtype`
        reads it: contiguous rows, or one contiguous matrix per head when the weight scales
        heads (K.gather_sum), copied into the workspace; widened to `dtype` on the way
        where the product sums float32 rows in float64 (a widened gather). Made once per
        call, before the blocks."""
        heads = heads_of(weight)
        name = self.names[x]
        wide = "c" if dtype != x.dtype else ""
        if heads == 1:
            if not wide:
                return name, f"np.ascontiguousarray({name})"
            return wide + name[1:], f"np.ascontiguousarray({name}, dtype=np.{dtype.name})"
        copy = "wh" + wide + name[1:]
        per_head = int(np.prod(x.shape[1:], dtype=np.int64)) // heads
        self.scratch[copy] = (None, (heads, x.shape[0], per_head), dtype)
        return "h" + wide + name[1:], f"K.by_head({name}, {heads}, {copy})"

    def stored_rows(self, op):
        """The rows of a stored value that this block writes or reads whole."""
        name = self.names[op]
        if not self.blocks.is_edge_sized(op):
            return f"{name}[v0:v1]"
        if op not in self.csr_ordered:
            return f"{name}[eids]"
        return f"{name}[p0:p1]" if self.group.at == "dst" else f"{name}[in_pos]"

    def edge_rows(self, op):
        """The block's rows of a stored edge tensor: a slice where the tensor is in the
        order of the group's CSR, else np.take (not name[eids]: fancy indexing of rows of a
        few floats is twenty times slower)."""
        name = self.names[op]
        if op not in self.csr_ordered:
            return f"np.take({name}, eids, axis=0)"
        return f"{name}[p0:p1]" if self.group.at == "dst" else f"np.take({name}, in_pos, axis=0)"

    def arguments(self, op, local):
        """How the block's statement for `op` names each argument."""
        args = []
        for a in op.args:
            if a in local:
                args.append(local[a])
            else:
                how = self.blocks.rows_of(a, op)
                full = self.names[a]
                args.append({"all": full, "edges": self.edge_rows(a),
                             "vertices": f"{full}[v0:v1]"}[how])
        return args

    def statements(self, op, local, end):
        # Block values are named "b_" + the tensor's name after its "t_" prefix (the IR's
        # id: ngnn/naming.py): unique, and clear of the tensors' and the generator's own.
        name = "b" + self.names[op][1:]
        local[op] = name
        args = self.arguments(op, local)
        shape = BlockShape("n_e" if op.scope == "e" else "n_v", op.shape)
        if op in self.blocks.gathered_dots:
            gather, rows = self.blocks.gathered_dots[op]
            rows = local.get(rows) or self.edge_rows(rows)
            self.block_views.append(f"{name} = {self.scratch_rows(op, name)}")
            return [f"K.gathered_row_dot({self.dot_tables[gather.args[0]]}, {gather.by}, "
                    f"{rows}, out={name})"]
        if op in self.blocks.row_sums:
            # The product's rows summed by BLAS, a matrix product with ones.
            product = self.blocks.row_sums[op]
            width = int(np.prod([product.shape[a] for a in op.axes], dtype=np.int64))
            self.block_views.append(f"{name} = {self.scratch_rows(op, name)}")
            return [f"K.row_sums({local[product]}, {width}, out={name})"]
        if op in self.row_dots:
            x, y = self.arguments(self.row_dots[op], local)
            subscripts, out = re.match(r"np\.einsum\('(\w+->\w*)', \{x\}, out=(.*)\)$",
                                       op.numpy).groups()
            inputs = subscripts.split("->")[0]
            self.block_views.append(f"{name} = {self.scratch_rows(op, name)}")
            return [f"np.einsum('{inputs},{subscripts}', {x}, {y}, "
                    f"out={out.format(out=name)})"]
        if isinstance(op, Gather):
            # A value this block made (a vertex gather, by the group's own end: Fusion's
            # vertex_gathers) holds the block's vertices only, row 0 for v0.
            index = f"{op.by}_in_block" if op.args[0] in local else op.by
            table = self.tables.get(op.args[0], args[0])
            # mode="clip" takes without checking again: the graph checked its ids.
            return [f"{name} = np.take({table}, {index}, axis=0, "
                    f"out={self.scratch_rows(op, name)}, mode='clip')"]
        if op.fusion_role == "agg":
            target = f"{self.names[op]}[v0:v1]" if op in self.group.outputs else \
                self.scratch_rows(op, name)
            if op in self.products:
                x, weight = self.products[op]
                w = "None" if weight is None else \
                    local.get(weight) or self.edge_rows(weight)
                other = "src" if end == "dst" else "dst"
                self.block_views.append(f"{name} = {target}")
                return [f"{self.codegen.kernel('gather_sum')}("
                        f"{self.product_source(x, weight, op.dtype)[0]}, "
                        f"{w}, {other}, "
                        f"seg, {op.reduce!r}, "
                        f"out={name})"]
            self.block_views.append(f"{name} = {target}")
            if op in self.row_products:
                rows, weight = self.row_products[op]
                return [f"K.weighted_row_sum({self.edge_rows(rows)}, "
                        f"{local.get(weight) or self.edge_rows(weight)}, seg, "
                        f"{op.reduce!r}, out={name})"]
            return [f"K.segment_reduce({args[0]}, seg, {op.reduce!r}, out={name})"]
        if isinstance(op, EdgeSoftmax):
            return [f"{name} = K.segment_softmax({args[0]}, seg, "
                    f"out={self.scratch_rows(op, name)})"]
        if isinstance(op, Dropout):
            keep = self.keep_names[op]
            # np.take: indexing a bool array of (E, heads, 1) by eids costs ~50x more a row.
            rows = f"np.take({keep}, eids, axis=0)" if self.blocks.is_edge_sized(op) else \
                f"{keep}[v0:v1]"
            self.block_views.append(f"{name} = {self.scratch_rows(op, name)}")
            return [f"K.apply_keep({args[0]}, {rows}, rate={op.rate!r}, out={name})"]
        if self.codegen.is_view_template(op):
            return self.codegen.generate_op(op, name, args, shape=shape)
        self.block_views.append(f"{name} = {self.scratch_rows(op, name)}")
        return self.codegen.generate_op(op, name, args, shape=shape)


