"""How the NumPy transformer runs a computation's fused groups, asked of its own group
writer (ngnn.transformers.numpy.fused), so the price follows the code that runs: the
block size and count, which aggregations are sparse products reading gathered rows in
place, which stored edge values are in CSR order (read as slices) and which are read or
written through edge ids, which dropout masks are drawn once per call."""
import numpy as np

from ..op_graph import Aggregate, Dropout, EdgeSoftmax, Gather
from .cost import (Cost, apply_keep, blocked, keep_bits, nbytes, passes, primitive,
                   row_elements, row_width, work)


class NumPyPlan:
    """The fused groups of `comp` (transformed by the NumPy transformer) as it writes them."""

    def __init__(self, comp):
        from ngnn.passes import FusedGroup
        from ngnn.transformers.numpy.fused import (DEFAULT_BLOCK_BYTES, FusedGroupWriter,
                                                    csr_ordered_values)
        block_bytes = comp.transformer.options.get("fusion_block_bytes", DEFAULT_BLOCK_BYTES)
        groups = [s for s in comp.steps if isinstance(s, FusedGroup)]
        self.writers = {g: FusedGroupWriter(g, {}, None, lambda kind, graph: kind,
                                            block_bytes) for g in groups}
        ordered = csr_ordered_values(self.writers.values(),
                                     [s for s in comp.steps if not isinstance(s, FusedGroup)],
                                     comp.results)
        for writer in self.writers.values():
            writer.csr_ordered = ordered
        # The span masks of keyed dropouts the kernels keep between statements, as the
        # steps are priced in order (see cost.keep_bits).
        self.masks = {}

    def writes(self, step):
        return step in self.writers

    def group_cost(self, group, device):
        from ngnn.transformers.numpy import kernels as K
        writer = self.writers[group]
        graph, end = group.graph, group.at
        other = "src" if end == "dst" else "dst"
        products, skipped = writer.sparse_products(other)
        blocks = len(K.blocks(graph, end, writer.edge_block_limit()))
        edges, nodes = graph.num_edges, graph.num_nodes
        context = Block(writer, device, blocks, min(edges, writer.edge_block_limit()))
        # Once per call: per-head copies of the product sources, and the dropout masks.
        cost = Cost(kind="fused", calls=1)
        for x, weight in {(x, w) for x, w in products.values()}:
            heads = 1 if weight is None else int(np.prod(weight.shape[1:], dtype=np.int64))
            cost = cost + (Cost(2 * nbytes(x) / device.transpose_rate, 0, 2 * nbytes(x))
                           if heads > 1 else Cost(calls=1))
        masks = {(op.seed, op.rate, op.shape, op.rows): op for op in group.ops
                 if isinstance(op, Dropout)}
        for op in masks.values():
            cost = cost + keep_bits(device, op, self.masks)
        # Per block: edge ids, the other ends and segment bounds (views), segment ids.
        cost = cost + Cost(edges / device.repeat_rate, 0, 16 * edges, calls=6 * blocks)
        for op in group.ops:
            if op not in skipped:
                cost = cost + context.member(op, products)
        for op in group.outputs:
            if not (isinstance(op, Aggregate) and op.at == end):
                cost = cost + context.store(op)
        return cost


class Block:
    """Prices a fused group's members as its generated block loop runs them: every
    statement once per block, its work summed over the blocks."""

    def __init__(self, writer, device, blocks, block_edges):
        self.writer, self.device = writer, device
        self.blocks, self.block_edges = blocks, block_edges
        group = writer.group
        self.edges, self.nodes, self.end = group.graph.num_edges, group.graph.num_nodes, group.at
        self.members = set(group.ops)

    def columns(self, name):
        """The curve of primitive `name` reading rows by the other end's ids: a
        source-parallel group walks the out-CSR, whose columns (destinations) fall
        otherwise than the in-CSR's sources ("out_" curves, where calibrated)."""
        if self.end == "src" and "out_" + name in self.device.curves:
            return "out_" + name
        return name

    def rows(self, op):
        return self.edges if op.scope == "e" else self.nodes

    def read(self, arg, user):
        """Reading a group input's block rows: a slice, or np.take by edge ids."""
        if arg in self.members or self.writer.rows_of(arg, user) != "edges":
            return Cost(calls=0)
        if arg in self.writer.csr_ordered and self.end == "dst":
            return Cost(calls=0)
        return blocked(self.device, "take", self.edges, row_width(arg), self.edges,
                       self.block_edges, self.blocks)

    def member(self, op, products):
        device, blocks, edges = self.device, self.blocks, self.edges
        if isinstance(op, Gather):       # by the group's own end: rows in order
            kind = "take_sorted" if op.by == self.end else self.columns("take")
            return blocked(device, kind, edges, row_width(op), op.args[0].shape[0],
                           self.block_edges, blocks)
        if isinstance(op, Aggregate):
            return self.aggregate(op, products)
        reads = Cost(calls=0)
        for arg in op.args:
            reads = reads + self.read(arg, op)
        if isinstance(op, EdgeSoftmax):
            width, element = row_width(op), edges * row_elements(op)
            return reads + Cost(edges / device.repeat_rate, calls=blocks) + \
                primitive(device, "segment", 2 * edges, width, calls=2 * blocks) + \
                primitive(device, "fancy", 2 * self.nodes, width, calls=2 * blocks) + \
                blocked(device, "take_sorted", 2 * edges, width, self.nodes,
                        self.block_edges, 2 * blocks) + \
                passes(device, element, 3 * element * 8, calls=3 * blocks,
                       transcendental=element)
        if isinstance(op, Dropout):
            rows = self.rows(op)
            elements = rows * row_elements(op)
            keep = Cost(calls=0)
            if self.writer.is_edge_sized(op):    # np.take(keep, eids): rows of bytes
                keep = primitive(device, "take", rows, row_elements(op) / 4, rows,
                                 calls=blocks)
            scale = apply_keep(device, elements)
            scale.calls = 3 * blocks
            return reads + keep + scale
        if _is_view_template(op):
            return Cost(calls=blocks)
        cost = work(op, device, None)
        cost.calls = blocks
        return reads + cost

    def aggregate(self, op, products):
        device, blocks, edges = self.device, self.blocks, self.edges
        width, out = row_width(op), nbytes(op)
        mean = passes(device, 0, 2 * out) if op.reduce == "mean" else Cost(calls=0)
        if op in products:
            x, weight = products[op]
            heads = 1 if weight is None else int(np.prod(weight.shape[1:], dtype=np.int64))
            data = passes(device, 0, 4 * edges, calls=blocks) if weight is None else \
                self.read(weight, op) if weight not in self.members else Cost(calls=0)
            if heads > 1 and self.columns("gather_sum_heads") in device.curves:
                # Calibrated whole: per head a product, the weights by head and the heads
                # back into rows; every block reads all heads' tables.
                return data + mean + blocked(device, self.columns("gather_sum_heads"),
                                             edges * heads, width / heads, x.shape[0],
                                             self.block_edges, blocks * (3 + 2 * heads))
            fill = passes(device, 0, out, calls=blocks * heads)
            product = blocked(device, self.columns("spmm"), edges * heads, width / heads,
                              x.shape[0] * heads, self.block_edges, blocks * heads)
            if heads > 1:          # the weights by head, and the heads back into rows:
                moved = 8 * edges * heads + 2 * out             # two strided copies
                data = data + Cost(moved / device.transpose_rate, 0, moved, calls=3 * blocks)
            return data + fill + product + mean
        reads = self.read(op.args[0], op)
        return reads + passes(device, 0, out, calls=blocks) + \
            primitive(device, "segment", edges, width, calls=blocks) + \
            primitive(device, "fancy", self.nodes, width, calls=2 * blocks) + mean

    def store(self, op):
        """The block's rows of an output written into its tensor."""
        if not self.writer.is_edge_sized(op) or (op in self.writer.csr_ordered and
                                                 self.end == "dst"):
            return passes(self.device, 0, 2 * nbytes(op), calls=self.blocks)
        return primitive(self.device, "fancy", self.edges, row_elements(op), self.edges,
                         calls=self.blocks)


def _is_view_template(op):
    template = getattr(op, "numpy", None)
    return isinstance(template, str) and template.startswith("{out} = ")
