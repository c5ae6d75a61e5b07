"""NumPy code for a fused group: the group runs over blocks of vertices (slices of the CSR
of its end), so its edge-sized intermediates exist for one block of edges at a time.

Inside a block the statements are the ops' own NumPy templates on block rows; gathers
index with the block's edge ends, aggregations and edge softmaxes are segment reductions
over the block's (sorted) edges. The loop is over blocks of thousands of edges, never over
single vertices or edges.
"""
from ngnn.op_graph import Aggregate, DropoutMask, EdgeSoftmax, Gather, Multiply

DEFAULT_BLOCK_BYTES = 8 << 20     # edge intermediates of one block: a few MiB, near cache size


class BlockShape:
    """A shape whose first axis is the block's row count (a name in the generated code)."""

    def __init__(self, rows, shape):
        self.text = "(" + ", ".join([rows] + [str(d) for d in shape[1:]]) + \
            ("," if len(shape) == 1 else "") + ")"

    def __str__(self):
        return self.text


def edge_rows(name):
    """The block's rows of a stored edge tensor. np.take, not name[eids]: fancy indexing
    of rows of a few floats is twenty times slower."""
    return f"np.take({name}, eids, axis=0)"


def per_head(weight_shape, value_shape):
    """Does an edge weight scale whole rows of heads of a gathered value? (E, H, 1) does for
    (E, H, F), and (E, 1) for (E, F)."""
    heads = list(weight_shape[1:])
    while heads and heads[-1] == 1:
        heads.pop()
    return tuple(value_shape[1:len(heads) + 1]) == tuple(heads)


class FusedGroupWriter:
    def __init__(self, group, names, codegen, graph_ref, block_bytes=DEFAULT_BLOCK_BYTES):
        self.group = group
        self.names = names            # op -> name in the generated module
        self.codegen = codegen
        self.g = graph_ref("graph", group.graph)
        self.block_bytes = block_bytes
        self.members = set(group.ops)
        self.E, self.N = group.graph.num_edges, group.graph.num_nodes

    def edge_block_limit(self):
        """Edges per block so that one block's edge intermediates fit the byte budget."""
        per_edge = sum(op.nbytes // max(self.E, 1) for op in self.group.ops
                       if self.is_edge_sized(op))
        return max(1, self.block_bytes // max(per_edge, 1))

    def is_edge_sized(self, op):
        return op.scope == "e" and op.shape and op.shape[0] == self.E

    def rows_of(self, arg, user):
        """How a block reads an input of `user`: edge rows, vertex rows, or all of it
        (parameters broadcast over rows, and the node tensors gathers pick from)."""
        if isinstance(user, Gather) or not arg.shape:
            return "all"
        if isinstance(user, (Aggregate, EdgeSoftmax)) or user.scope == "e":
            # An unscoped (E, ...) tensor of the user's rank broadcasts one row per edge.
            return "edges" if arg.shape[0] == self.E and \
                (arg.scope == "e" or arg.ndim == user.ndim) else "all"
        if arg.ndim == user.ndim and arg.shape[0] == self.N != 1:
            return "vertices"
        return "all"

    def function(self):
        """Lines of the nested function that runs the group, and the line calling it."""
        g, group = self.g, self.group
        params = [self.names[a] for a in group.inputs] + ["step"]
        end = "dst" if group.at == "dst" else "src"
        other = "src" if end == "dst" else "dst"
        csr = "in" if end == "dst" else "out"
        lines = [f"def {group.name}({', '.join(params)}):",
                 f"    # {len(group.ops)} ops, {'destination' if end == 'dst' else 'source'}"
                 f"-parallel over the {csr}-CSR; edge values live one block at a time",
                 f"    for v0, v1, p0, p1 in K.blocks({g}, {end!r}, {self.edge_block_limit()}):",
                 f"        eids = {g}.{csr}_eids[p0:p1]",
                 f"        {other} = {g}.{csr}_{other}[p0:p1]",
                 f"        seg = {g}.{csr}_indptr[v0:v1 + 1] - p0",
                 f"        {end} = K.segment_ids(seg, v0)",
                 "        n_e, n_v = p1 - p0, v1 - v0"]
        self.products, skipped = self.sparse_products(other)
        sources = {x for x, _ in self.products.values()}
        lines[1:1] = [f"    {self.names[x]} = np.ascontiguousarray({self.names[x]})"
                      for x in group.inputs if x in sources]
        local = {}
        for op in group.ops:
            if op not in skipped:
                lines += ["        " + s for s in self.statements(op, local, end)]
        for op in group.outputs:
            rows = "eids" if self.is_edge_sized(op) else "v0:v1"
            if not (isinstance(op, Aggregate) and op.at == end):
                lines.append(f"        {self.names[op]}[{rows}] = {local[op]}")
        return lines, f"{group.name}({', '.join(params)})"

    def sparse_products(self, other):
        """Sum/mean aggregations of `weight * gather(x)` (or of `gather(x)`) are run as sparse
        products, one per attention head: the gathered copy of x is never made.
        Returns {aggregation: (x, weight or None)} and the ops this makes unnecessary."""
        members = set(self.group.ops)
        users = {}
        for op in self.group.ops:
            for a in op.args:
                users.setdefault(a, []).append(op)

        def private(op):     # used once, inside the group, and not written out
            return op in members and op not in self.group.outputs and len(users.get(op, [])) == 1

        def gathered(op):
            return isinstance(op, Gather) and op.by == other and op.args[0] not in members \
                and private(op)

        products, skipped = {}, set()
        for agg in self.group.ops:
            if not isinstance(agg, Aggregate) or agg.reduce not in ("sum", "mean"):
                continue
            (msg,) = agg.args
            if gathered(msg):
                products[agg] = (msg.args[0], None)
                skipped.add(msg)
            elif isinstance(msg, Multiply) and private(msg):
                for g, w in (msg.args, msg.args[::-1]):
                    if gathered(g) and w.ndim == g.ndim and per_head(w.shape, g.shape) and \
                            w.dtype == g.dtype and w is not g:
                        products[agg] = (g.args[0], w)
                        skipped.update((msg, g))
                        break
        return products, skipped

    def statements(self, op, local, end):
        # Block values are named "b_" + the tensor's name after its "t_" prefix: unique,
        # and clear of the tensors' and the generator's own names.
        name = "b" + self.names[op][1:]
        local[op] = name
        args = []
        for a in op.args:
            if a in local:
                args.append(local[a])
            else:
                how = self.rows_of(a, op)
                full = self.names[a]
                args.append({"all": full, "edges": edge_rows(full),
                             "vertices": f"{full}[v0:v1]"}[how])
        rows = "n_e" if op.scope == "e" else "n_v"
        shape = BlockShape(rows, op.shape)
        dtype = f"np.{op.dtype.name}"
        if isinstance(op, Gather):
            return [f"{name} = np.take({args[0]}, {op.by}, axis=0)"]
        if isinstance(op, Aggregate):
            target = f"{self.names[op]}[v0:v1]" if op in self.group.outputs else \
                f"np.empty({shape}, {dtype})"
            if op in self.products:
                x, weight = self.products[op]
                w = "None" if weight is None else \
                    local.get(weight) or edge_rows(self.names[weight])
                other = "src" if end == "dst" else "dst"
                return [f"{name} = {target}",
                        f"K.gather_sum({self.names[x]}, {w}, {other}, seg, {op.reduce!r}, "
                        f"out={name})"]
            return [f"{name} = {target}",
                    f"K.segment_reduce({args[0]}, seg, {op.reduce!r}, out={name})"]
        if isinstance(op, EdgeSoftmax):
            return [f"{name} = K.segment_softmax({args[0]}, seg)"]
        if isinstance(op, DropoutMask):
            return [f"{name} = np.empty({shape}, {dtype})",
                    f"K.dropout_mask_rows(seed={op.seed}, step=step, rate={op.rate!r}, "
                    f"rows=eids, size={op.size}, out={name})"]
        if self.codegen.is_view_template(op):
            return self.codegen.generate_op(op, name, args, shape=shape)
        return [f"{name} = np.empty({shape}, {dtype})"] + \
            self.codegen.generate_op(op, name, args, shape=shape)


