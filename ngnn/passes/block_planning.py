"""BlockPlanning: how the NumPy transformer runs each fused group, decided once.

A NumPy fused group runs over blocks of vertices (slices of the CSR of its end), so its
edge-sized intermediates exist for one block of edges at a time. What that takes is
decided here, per group (`GroupBlocks`):
  - `block_edges`: the edges a block holds, so that one block's edge intermediates and the
    rows it reads of stored edge values fit the byte budget (`fusion_block_bytes`, 8 MiB
    by default: near the size of the cache);
  - `products`: the sum and mean aggregations of `weight * gather(x)` (or of `gather(x)`,
    or of a gather widened to the aggregation's float64: WideAccumulation's
    widen_after_gather) that run as sparse products, one per attention head, reading x's
    rows in place (or a widened copy of x, made once per call);
  - `row_products`: the sum and mean aggregations at the group's own end of `weight *
    rows`, an edge value read by the block (an edge input's (E, 1, F) rows, or those rows
    widened to the sum's float64) scaled per head by an (E, H, 1) weight: one sparse
    product per head whose columns are the block's own rows, so the (E, H, F) product is
    never made (TransformerConv's sum of a e over a vertex's edges: 6 times faster than
    the product and its segment sum);
  - `row_sums` and `row_dots`: sums over trailing axes (a few values: a per-head dot
    product's features) of a product of two edge values. Of two of one shape (the
    attention logits and their gradient) the product is written and its rows summed by
    BLAS, a matrix product with ones (np.einsum's loop over rows of 8 values took 2.6
    times as long: GAT's and TransformerConv's steps 6 to 10% faster); of one broadcast
    against the other along axes of length 1 (TransformerConv's (W_e q) . e per head),
    where writing the broadcast product costs more than it saves, the sum is one
    np.einsum of the two factors, the product never written. `skipped`: the ops these
    make unnecessary (the gathered copy, the (E, heads, features) product are never made);
  - `gathered_dots`: of the row dots, the sums over the features of a gathered node tensor's
    rows (E, H, F) times an edge value's rows (E, 1, F) (TransformerConv's (W_e q) . e
    per head): one sparse product per block whose rows are the edges, each with the F
    values of its edge value's row at the gathered vertex's columns of the node tensor
    laid out (N, F, H) (copied so once per call), so neither the gathered copy nor the
    product is made (np.einsum over the gathered rows is 1.5 to 2 times slower);
  - `reads_own_ends`: whether a block makes its edges' own-end vertex ids (only a gather by
    the group's own end reads them);
  - `contiguous_tables`: the node tensors gathers read that are transposes moving the node
    axis (a per-head product's result, TransformerConv's (W_e q) per vertex): each is
    copied into contiguous rows once per call, before the blocks, as np.take of a row
    that lies in pieces across the tensor costs 8 to 30 times a contiguous row's (5 such
    gathers were 40% of TransformerConv's step with edge features at R-MAT 10K);
  - `rows_of(arg, user)`: how a block reads an input: edge rows, vertex rows, or whole;
and for the computation (`BlockPlan.csr_ordered`): the edge values only fused groups read,
each a whole row per edge, which are stored in their graph's in-CSR order, so that a
destination-parallel block reads and writes them as one contiguous slice and only a
source-parallel one goes through a permutation. Every other edge value keeps edge-id
order.

These are decisions about the plan, not about NumPy text: the NumPy transformer's group
writer renders them (transformers/numpy/fused.py) and the simulator prices them
(ngnn/simulate/numpy_plan.py), so the two read one plan and cannot disagree. The pass
sets `computation.block_plan`; it rewrites nothing.
"""
import numpy as np

from ..op_graph import Broadcast, Cast, Gather, Multiply, Sum, Transpose
from .base import GraphPass
from .fusion import FusedGroup

DEFAULT_BLOCK_BYTES = 8 << 20     # edge intermediates of one block: a few MiB, near cache size


class BlockPlanning(GraphPass):
    def __init__(self, block_bytes=DEFAULT_BLOCK_BYTES):
        self.block_bytes = block_bytes

    def do_pass(self, computation):
        groups = [s for s in computation.steps if isinstance(s, FusedGroup)]
        plain = [s for s in computation.steps if not isinstance(s, FusedGroup)]
        computation.block_plan = BlockPlan(groups, plain, computation.results,
                                           self.block_bytes)


class BlockPlan:
    """`groups`: {fused group: GroupBlocks}; `csr_ordered`: the edge values stored in the
    in-CSR order of their graph."""

    def __init__(self, groups, plain_ops, results, block_bytes=DEFAULT_BLOCK_BYTES):
        self.groups = {g: GroupBlocks(g, block_bytes) for g in groups}
        self.csr_ordered = csr_ordered_values(self.groups.values(), plain_ops, results)
        for blocks in self.groups.values():
            blocks.csr_ordered = self.csr_ordered


class GroupBlocks:
    """The block plan of one fused group (see the module's docstring)."""

    def __init__(self, group, block_bytes=DEFAULT_BLOCK_BYTES):
        self.group = group
        self.members = set(group.ops)
        self.E, self.N = group.graph.num_edges, group.graph.num_nodes
        self.csr_ordered = set()        # the computation's (BlockPlan.csr_ordered)
        self.products, skipped = self.sparse_products()
        self.row_products, row_skipped = self.edge_row_products()
        skipped |= row_skipped
        dots = self.dot_products(skipped)
        self.row_sums = {op: product for op, product in dots.items()
                         if all(a.shape == product.shape for a in product.args)}
        self.row_dots = {op: product for op, product in dots.items()
                         if op not in self.row_sums}
        self.gathered_dots = self.gathered_dot_products()
        skipped |= {gather for gather, _ in self.gathered_dots.values()}
        dot_factors = set(dots.values())
        self.skipped = skipped | set(self.row_dots.values())
        # The values sparse products skip count (the budget was tuned with them); a dot
        # product's product does not (a row sum's, written, is read back at once).
        per_edge = sum(op.nbytes // max(self.E, 1) for op in group.ops + group.inputs
                       if self.is_edge_sized(op) and op not in dot_factors)
        self.block_edges = max(1, block_bytes // max(per_edge, 1))
        self.reads_own_ends = any(isinstance(op, Gather) and op.by == group.at and
                                  op not in self.skipped for op in group.ops) or \
            any(gather.by == group.at for gather, _ in self.gathered_dots.values())
        self.contiguous_tables = list(dict.fromkeys(
            op.args[0] for op in group.ops if isinstance(op, Gather) and
            op not in self.skipped and op.args[0] not in self.members and
            isinstance(op.args[0], Transpose) and op.args[0].axes[0] != 0))

    def is_edge_sized(self, op):
        return op.scope == "e" and op.shape and op.shape[0] == self.E

    def rows_of(self, arg, user):
        """How a block reads an input of `user`: edge rows, vertex rows, or all of it
        (parameters broadcast over rows, and the node tensors gathers pick from)."""
        if isinstance(user, Gather) or not arg.shape:
            return "all"
        if user.fusion_role in ("agg", "softmax") or user.scope == "e":
            # An unscoped (E, ...) tensor of the user's rank broadcasts one row per edge.
            return "edges" if arg.shape[0] == self.E and \
                (arg.scope == "e" or arg.ndim == user.ndim) else "all"
        if arg.ndim == user.ndim and arg.shape[0] == self.N != 1:
            return "vertices"
        return "all"

    def in_csr_slices(self, op):
        """Does a block read or write `op`'s rows as a slice of its CSR (a value stored in
        in-CSR order, in a destination-parallel group), rather than through edge ids?"""
        return op in self.csr_ordered and self.group.at == "dst"

    def sparse_products(self):
        """Sum/mean aggregations of `weight * gather(x)` (or of `gather(x)`) by the other
        end run as sparse products, one per attention head: the gathered copy of x is never
        made. A product in float64 of a float32 x (a widened gather) reads a widened copy
        of x. Returns {aggregation: (x, weight or None)} and the ops this makes
        unnecessary."""
        group = self.group
        other = "src" if group.at == "dst" else "dst"
        users = {}
        for op in group.ops:
            for a in op.args:
                users.setdefault(a, []).append(op)

        def private(op):     # used once, inside the group, and not written out
            return op in self.members and op not in group.outputs and \
                len(users.get(op, [])) == 1

        def gathered(op):
            """The gathers a product reads in place: the gather by the other end of a node
            tensor, or such a gather cast (widened) to the product's dtype."""
            if isinstance(op, Cast) and op.dtype == np.float64 and \
                    op.args[0].dtype == np.float32 and private(op):
                return gathered(op.args[0])
            return isinstance(op, Gather) and op.by == other and op.args[0] not in self.members

        def rows(op):       # the gathers' own ops: the widening cast and the gather
            return [op] + rows(op.args[0]) if isinstance(op, Cast) else [op]

        # A gather other ops of the block read too (an attention's backward reads the
        # sources' features for the weighted sum and for the logits' gradient) is still
        # made for them; the product reads the node tensor all the same.
        products, skipped = {}, set()
        for agg in group.ops:
            if agg.fusion_role != "agg" or not agg.combiner.linear:
                continue
            (msg,) = agg.args
            if gathered(msg) and private(msg):
                products[agg] = (rows(msg)[-1].args[0], None)
                skipped.update(g for g in rows(msg) if private(g))
            elif isinstance(msg, Multiply) and private(msg):
                for g, w in (msg.args, msg.args[::-1]):
                    if isinstance(w, Broadcast) and w.args[0].ndim == w.ndim:
                        w = w.args[0]      # a per-head weight spread over the features
                    if gathered(g) and w.ndim == g.ndim and per_head(w.shape, g.shape) and \
                            w.dtype == g.dtype and w is not g:
                        products[agg] = (rows(g)[-1].args[0], w)
                        skipped.update([msg] + [r for r in rows(g) if private(r)])
                        break
        return products, skipped

    def edge_row_products(self):
        """Sum/mean aggregations of `weight * rows` (see the module's docstring) run as
        one sparse product per head over the block's rows. Returns {aggregation: (the edge
        value whose rows the block reads, weight)} and the ops this makes unnecessary."""
        group = self.group
        uses = {}
        for op in group.ops:
            for a in op.args:
                uses[a] = uses.get(a, 0) + 1

        def private(op):
            return op in self.members and op not in group.outputs and uses.get(op) == 1

        products, skipped = {}, set()
        for agg in group.ops:
            if agg.fusion_role != "agg" or not agg.combiner.linear or agg.at != group.at:
                continue
            (msg,) = agg.args
            if not (isinstance(msg, Multiply) and private(msg) and msg.ndim == 3):
                continue
            for rows, w in (msg.args, msg.args[::-1]):
                if isinstance(w, Broadcast) and w.args[0].ndim == w.ndim:
                    w = w.args[0]      # a per-head weight spread over the features
                read = rows
                if isinstance(rows, Cast) and private(rows) and rows.dtype == np.float64 \
                        and rows.args[0].dtype == np.float32:
                    read = rows.args[0]          # widened in the product
                if read not in self.members and self.is_edge_sized(read) and \
                        self.rows_of(read, rows if read is not rows else msg) == "edges" and \
                        rows.shape[1] == 1 and w.shape[2] == 1 and w.shape[1] > 1 and \
                        w.dtype == rows.dtype == agg.dtype:
                    products[agg] = (read, w)
                    skipped.update([msg] + ([rows] if read is not rows else []))
                    break
        return products, skipped

    def dot_products(self, skipped):
        """Sums over trailing axes of a product of two edge values of one shape, or one
        broadcast against the other along axes of length 1 (TransformerConv's (W_e q) .
        e): the row sums and row dots of the module's docstring. Returns {sum: product}."""
        users = {}
        for op in self.group.ops:
            for a in op.args:
                users.setdefault(a, []).append(op)
        dots = {}
        for op in self.group.ops:
            product = op.args[0] if type(op) is Sum else None
            if isinstance(product, Multiply) and product not in skipped and \
                    op.scope == "e" and op.numpy.startswith("np.einsum(") and \
                    product not in self.group.outputs and users[product] == [op] and \
                    all(a.ndim == product.ndim and all(d in (1, p) for d, p in zip(
                        a.shape, product.shape)) for a in product.args):
                dots[op] = product
        return dots


    def gathered_dot_products(self):
        """The row dots (see the module's docstring) of a gather of a node tensor (E, H, F),
        used by no other op, and an edge value's rows (E, 1, F), summed over F. Returns
        {sum: (the gather, the edge value)}."""
        uses = {}
        for op in self.group.ops:
            for a in op.args:
                uses[a] = uses.get(a, 0) + 1
        dots = {}
        for op, product in self.row_dots.items():
            if op.axes != (2,) or product.ndim != 3:
                continue
            for gather, rows in (product.args, product.args[::-1]):
                if isinstance(gather, Gather) and gather.args[0] not in self.members and \
                        gather not in self.group.outputs and uses[gather] == 1 and \
                        rows.shape[1] == 1 and gather.shape[1] > 1 and \
                        gather.dtype == rows.dtype:
                    dots[op] = (gather, rows)
                    break
        return dots


def heads_of(weight):
    """The attention heads a sparse product's edge weight scales (1 without a weight)."""
    return 1 if weight is None else int(np.prod(weight.shape[1:], dtype=np.int64))


def per_head(weight_shape, value_shape):
    """Does an edge weight scale whole rows of heads of a gathered value? (E, H, 1) does for
    (E, H, F), and (E, 1) for (E, F); (E, H, F) does not (a product per column of the value
    would run one sparse product per feature)."""
    heads = list(weight_shape[1:])
    while heads and heads[-1] == 1:
        heads.pop()
    return len(heads) < len(value_shape) - 1 and \
        tuple(value_shape[1:len(heads) + 1]) == tuple(heads)


def csr_ordered_values(groups, plain_ops, results):
    """The edge values that only fused groups read, each a whole row per edge (see the
    module's docstring). `groups`: the GroupBlocks of the computation's fused groups."""
    outside = set(results) | {a for op in plain_ops for a in op.args}
    ordered = set()
    for blocks in groups:
        for op in blocks.group.outputs:
            if blocks.is_edge_sized(op) and op not in outside and all(
                    reader.group.graph is blocks.group.graph and
                    reader.rows_of(op, user) == "edges"
                    for reader in groups for user in reader.group.ops
                    if op in user.args and op not in reader.members):
                ordered.add(op)
    return ordered
