"""The NumPy transformer's fused groups priced from the computation's block plan
(`comp.block_plan`, ngnn.passes.block_planning), the plan its group writer renders
(ngnn.transformers.numpy.fused): the block size and count, which aggregations are sparse
products reading gathered rows in place, which stored edge values are in CSR order (read
as slices) and which are read or written through edge ids; and, from the group's ops,
which dropout masks are drawn once per call. Each member is priced by its kind's cost
rule (ngnn.simulate.cost), at the block's rows."""
import numpy as np

from ..op_graph.work import elements as size, nbytes, row_elements, row_width
from ..passes.block_planning import heads_of
from ..passes.buffer_sharing import is_group
from .calibration import SHORT_BLOCKS, busy_block_edges, first_reads
from .cost import (Cost, along_rows, apply_keep, blocked, draws_mask, keep_bits,
                   numpy_function, passes, per_item, primitive, segment_curve, work)


class NumPyPlan:
    """Prices the fused groups of `comp` (planned by the NumPy transformer) by its block
    plan, and follows the cache and the dropout masks as the steps are priced in order."""

    def __init__(self, comp):
        self.groups = comp.block_plan.groups        # {fused group: GroupBlocks}
        # The span masks of keyed dropouts the kernels keep between statements, as the
        # steps are priced in order (see cost.keep_bits).
        self.masks = {}
        # The bytes the steps priced so far moved, and the span of that count over which
        # each tensor was written: a step writes its outputs evenly through its traffic,
        # interleaved with its reads (NumPy's loops and BLAS write as they read).
        self.streamed, self.written = 0.0, {}
        self.is_view = comp.transformer.is_view

    def ran(self, step, cost):
        """Notes a step priced: the tensors it wrote, through the bytes it moved."""
        for op in step.outputs if is_group(step) else [step]:
            self.written[op] = (self.streamed, self.streamed + cost.bytes)
        self.streamed += cost.bytes

    def warm(self, op, device):
        """The share of tensor `op` still in a core's share of the cache when a group
        reads it: the part written during the last `cache_bytes` streamed (an LRU cache's
        rule). Inputs and tensors of earlier calls are not. GraphSAGE's second product
        reads a table its matmul wrote while reading 25.6 MB: 59% of it is there (priced
        wholly warm, the group came out 25% fast)."""
        while op not in self.written and self.is_view(op) and op.args:
            op = op.args[0]
        if device.cache_bytes is None or op not in self.written:
            return 0.0
        start, end = self.written[op]
        oldest = self.streamed - device.cache_bytes      # the oldest byte the cache holds
        if end <= start:
            return float(oldest <= start)
        return float(np.clip((end - max(start, oldest)) / (end - start), 0.0, 1.0))

    def writes(self, step):
        return step in self.groups

    def group_cost(self, group, device):
        from ngnn.transformers.numpy import kernels as K
        plan = self.groups[group]
        graph, end = group.graph, group.at
        products, skipped = plan.products, plan.skipped
        blocks = len(K.blocks(graph, end, plan.block_edges))
        edges = graph.num_edges
        context = Block(self, plan, device, blocks, skipped)
        # Once per call: per-head copies of the product sources, and the dropout masks.
        cost = Cost(kind="fused", calls=1)
        # A widened source (a float64 product of float32 rows) is a copy too, twice as wide.
        for x, weight, dtype in {(x, w, agg.dtype) for agg, (x, w) in products.items()}:
            moved = nbytes(x) * (1 + dtype.itemsize // x.dtype.itemsize)
            cost = cost + (Cost(moved / device.transpose_rate, 0, moved)
                           if heads_of(weight) > 1 or dtype != x.dtype else Cost(calls=1))
        # Transposed node tensors the gathers read, copied into contiguous rows, and the
        # node tensors of gathered row dots, laid out (N, F, H).
        tables = set(plan.contiguous_tables) | {gather.args[0] for gather, _ in
                                                plan.gathered_dots.values()}
        for x in tables:
            cost = cost + Cost(2 * nbytes(x) / device.transpose_rate, 0, 2 * nbytes(x))
        masks = {(op.seed, op.rate, op.shape, op.rows): op for op in group.ops
                 if draws_mask(op)}
        for op in masks.values():
            cost = cost + keep_bits(device, op, self.masks)
        # Per block: edge ids, the other ends and segment bounds (views); the own ends'
        # vertex ids where a gather reads them (K.segment_ids).
        cost = cost + Cost(calls=3 * blocks)
        if plan.reads_own_ends:
            cost = cost + Cost(edges / device.repeat_rate, 0, 16 * edges, calls=3 * blocks)
        for op in group.ops:
            if op not in skipped:
                cost = cost + context.member(op, products)
        for op in group.outputs:
            if not (op.fusion_role == "agg" and op.at == end):
                cost = cost + context.store(op)
        return cost


class Block:
    """Prices a fused group's members as its block plan runs them (`group_plan`, a
    GroupBlocks): every statement once per block, its work summed over the blocks."""

    def __init__(self, plan, group_plan, device, blocks, skipped):
        self.plan, self.group_plan, self.device, self.blocks = plan, group_plan, device, blocks
        group = group_plan.group
        self.edges, self.nodes, self.end = group.graph.num_edges, group.graph.num_nodes, group.at
        self.members = set(group.ops)
        # A block that makes more than one edge array is a busy one (see cost.blocked).
        made = [op for op in group.ops if group_plan.is_edge_sized(op) and op not in skipped
                and not plan.is_view(op)]
        taken = [arg for arg in group.inputs if group_plan.is_edge_sized(arg) and not
                 group_plan.in_csr_slices(arg)]
        self.busy = len(made) + len(taken) > 1
        # A busy block reading no rows by edge ids (stored edge values, an edge dropout's
        # mask) is a light one: its node tables can stay in the cache from block to block.
        self.light = self.busy and not taken and not any(
            draws_mask(op) and group_plan.is_edge_sized(op) for op in group.ops)
        # What the group streams of its own, read or written once: the other ends' ids
        # (int64) and its outputs.
        self.streams = 8 * self.edges + sum(nbytes(op) for op in group.outputs)
        # The rows a read by the other ends' ids touches: the vertices with edges there.
        other = group.graph.out_indptr if self.end == "dst" else group.graph.in_indptr
        self.touched = int(np.count_nonzero(np.diff(other)))

    def blocked(self, name, edges, width, rows, calls, table=None):
        """`name` in this block; reading `table`, at its warm cost for the share of it a
        quiet block finds still in the cache (NumPyPlan.warm) while the group's own
        streaming has not yet replaced it (its first `cache_bytes`), and the rest at its
        cold cost: where calibrated, the warm cost of every read plus the first reads of
        the rows it touches ("_touch", calibration.first_reads). (GCN at R-MAT 500K: a
        product's table of 8 MB, just written, is read over 5M edges while 48 MB of ids
        and output stream past.)"""
        if self.light and name + "_light_touch" in self.device.curves:
            # its steady cost (the light block's second pass over its sample) and the
            # first reads of its rows, as a quiet block's
            cost = blocked(self.device, name + "_light_steady", edges, width, rows, calls)
            cost.seconds += self.first_reads(name + "_light_touch", edges, width, rows)
            return cost
        cost = blocked(self.device, name, edges, width, rows, calls, self.busy, self.light)
        if self.busy or table is None or name + "_warm" not in self.device.curves:
            return cost
        held = self.plan.warm(table, self.device)
        if held:
            held *= min(1.0, self.device.cache_bytes / self.streams)
        warm = blocked(self.device, name + "_warm", edges, width, rows, calls)
        if name + "_touch" in self.device.curves:
            misses = self.first_reads(name + "_touch", edges, width, rows)
            cost.seconds = warm.seconds + (1 - held) * misses
        else:
            cost.seconds = held * warm.seconds + (1 - held) * cost.seconds
        return cost

    def first_reads(self, curve, edges, width, rows):
        """Seconds of the first reads of the rows `edges` reads by the other ends' ids
        touch, at `curve` (a "_touch" curve: calibration.first_reads)."""
        return first_reads(self.touched, edges) * per_item(self.device, curve, width, rows)

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
        if arg in self.members or self.group_plan.rows_of(arg, user) != "edges" or \
                self.group_plan.in_csr_slices(arg):
            return Cost(calls=0)
        return self.blocked("edge_take", self.edges, row_width(arg), self.edges, self.blocks)

    def member(self, op, products):
        device, blocks, edges = self.device, self.blocks, self.edges
        if op.fusion_role == "edge":      # a gather by the own end: rows in order
            kind = "take_sorted" if op.by == self.end else self.columns("take")
            return self.blocked(kind, edges, row_width(op), op.args[0].shape[0], blocks,
                                op.args[0])
        if op.fusion_role == "agg":
            return self.aggregate(op, products)
        reads = Cost(calls=0)
        for arg in op.args:
            reads = reads + self.read(arg, op)
        if op.fusion_role == "softmax":      # K.segment_softmax: the sums in float64
            width, element = row_width(op), edges * row_elements(op)
            return reads + Cost(edges / device.repeat_rate, calls=blocks) + \
                self.segment("max", width) + self.segment("sum", 2 * width) + \
                self.blocked("take_sorted", edges, width, self.nodes, blocks) + \
                self.blocked("take_sorted", edges, 2 * width, self.nodes, blocks) + \
                passes(device, element, 6 * element * 4, calls=3 * blocks,
                       transcendental=element)
        if draws_mask(op):
            rows = self.rows(op)
            elements = rows * row_elements(op)
            keep = Cost(calls=0)
            if self.group_plan.is_edge_sized(op):
                # np.take(keep, eids): rows of a byte a head, a table of rows x heads bytes
                keep = self.keep_rows(row_elements(op))
            scale = apply_keep(device, elements, elements / blocks)
            scale.calls = 3 * blocks
            return reads + keep + scale
        if self.plan.is_view(op):
            return Cost(calls=blocks)
        if op in self.group_plan.row_sums and "row_sums" in device.curves:
            # K.row_sums: the product's rows summed by BLAS, a product with ones (a
            # profile from before its curve prices the sum as declared)
            product = op.args[0]
            elements = self.rows(product) * row_elements(product)
            width = row_elements(product) // max(row_elements(op), 1)
            seconds = elements * along_rows(device, width, elements / blocks, "row_sums")
            return reads + Cost(seconds, elements, nbytes(product) + nbytes(op),
                                calls=blocks)
        cost = work(op, device, None, per_call=self.rows(op) / blocks)
        cost.calls = blocks
        return reads + cost

    def aggregate(self, op, products):
        device, blocks, edges = self.device, self.blocks, self.edges
        width, out = row_width(op), nbytes(op)
        mean = Cost(calls=0) if op.reduce != "mean" else self.divide_by_degrees(op)
        if op in self.group_plan.row_products:
            # K.weighted_row_sum: per head a product over the block's own rows of the edge
            # value (read in order), the weights by head and the heads back into rows.
            rows, weight = self.group_plan.row_products[op]
            heads = op.shape[1]
            data = self.read(rows, op) + (Cost(calls=0) if weight in self.members else
                                          self.read(weight, op))
            fill = passes(device, 0, out, calls=blocks * heads)
            product = self.blocked("spmm", edges * heads, width / heads, edges,
                                   blocks * heads)
            moved = 8 * edges * heads + 2 * out
            data = data + Cost(moved / device.transpose_rate, 0, moved, calls=3 * blocks)
            return data + fill + product + mean
        if op in products:
            x, weight = products[op]
            heads = heads_of(weight)
            data = Cost(calls=0) if weight is None or weight in self.members else \
                self.read(weight, op)
            # K.gather_sum as calibrated whole (its weights of ones, the output's fill; per
            # head a product, the weights by head and the heads back into rows).
            if heads == 1:
                return data + mean + self.blocked(self.columns("spmm"), edges, width,
                                                  x.shape[0], 2 * blocks, x)
            if self.columns("gather_sum_heads") in device.curves:
                return data + mean + self.heads_product(edges, heads, width / heads,
                                                        x.shape[0])
            fill = passes(device, 0, out, calls=blocks * heads)
            product = self.blocked(self.columns("spmm"), edges * heads, width / heads,
                                   x.shape[0] * heads, blocks * heads)
            moved = 8 * edges * heads + 2 * out      # the weights by head, the heads back
            data = data + Cost(moved / device.transpose_rate, 0, moved, calls=3 * blocks)
            return data + fill + product + mean
        return self.read(op.args[0], op) + self.segment(op.reduce, width, op.args[0]) + mean

    def keep_rows(self, heads):
        """np.take(keep, eids): the block's rows of an edge dropout's mask, a byte a head,
        from the whole mask (keep_take as calibrated, a byte a row per head; else as rows
        of a stored edge value of as many bytes)."""
        if any(name.startswith("keep_take") for name in self.device.curves):
            return self.blocked("keep_take", self.edges, heads, self.edges, self.blocks)
        return self.blocked("edge_take", self.edges, heads / 4,
                            self.edges * min(heads / 4, 1), self.blocks)

    def divide_by_degrees(self, op):
        """K.divide_by_degrees in each block: the degrees, and the rows divided by one
        value each (at the row's length where calibrated: at rows of 4 floats in a block
        of R-MAT 100K, 7 times the cost of an element-wise divide)."""
        degrees = passes(self.device, 0, 32 * self.nodes)
        elements, per_call = size(op), size(op) / self.blocks
        divide = numpy_function(self.device, "np.divide", elements, 3 * nbytes(op), per_call)
        if "np.multiply@trailing" in self.device.curves:
            divide.seconds = max(divide.seconds, elements * along_rows(
                self.device, row_elements(op), per_call))
        return degrees + divide

    def heads_product(self, edges, heads, width, rows):
        """K.gather_sum per head as calibrated whole, in blocks of busy_block_edges(width)
        edges and in blocks SHORT_BLOCKS times shorter (gather_sum_heads_short): this
        group's blocks priced between the two, log-linearly in the edges a block holds."""
        name = self.columns("gather_sum_heads")
        cost = self.blocked(name, edges * heads, width, rows, self.blocks * (3 + 2 * heads))
        if name + "_short" in self.device.curves:
            shorter = np.log(busy_block_edges(width) * self.blocks / edges) / \
                np.log(SHORT_BLOCKS)
            slower = self.device.curves[name + "_short"](width, rows) / \
                self.device.curves[name](width, rows)
            cost.seconds *= slower ** float(np.clip(shorter, 0, 1))
        return cost

    def segment(self, reduce, width, values=None):
        """K.segment_reduce over the block's edges, `width` float32s a row, of `values`."""
        return self.blocked(segment_curve(self.device, reduce), self.edges, width,
                            self.nodes, 2 * self.blocks, values)

    def store(self, op):
        """The block's rows of an output written into its tensor."""
        plan = self.group_plan
        if not plan.is_edge_sized(op) or plan.in_csr_slices(op):
            return passes(self.device, 0, 2 * nbytes(op), calls=self.blocks)
        return primitive(self.device, "fancy", self.edges, row_elements(op), self.edges,
                         calls=self.blocks)

