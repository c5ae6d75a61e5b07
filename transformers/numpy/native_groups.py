"""Fused graph groups as C loops (make_transformer("numpy", native=True)).

A fused group whose edge work is all sparse products (the block plan's `products`: sums
of gathered rows, optionally scaled by a per-edge weight stored in the group's CSR order)
and whose other ops are element-wise ops over vertex rows (GIN's `x + sum of
neighbours`, the backward's sum of gradients times the ReLU mask) needs no edge values
at all; in Python each block still costs a dozen NumPy calls and views, about 40 us a
group on a batch of small graphs. Here such a group is one C function: for each vertex
of the group's end, in order, each op's row in step order, a product summed over the
vertex's CSR positions in CSR order (as native.gather_sum and SciPy sum it: the same to
the bit), an element-wise op from its `c` template (the GPU transformer's, as
native_elementwise renders it); rows of values made in the group live in a local row,
and the group's outputs are stored. Other groups (edge values, softmaxes, dropout,
several heads, mean aggregations, widened products) keep the Python block loop.

The graph's CSR is read at each call (a GraphSlot's changes with every batch); the
group's arrays are passed as they are, checked C-contiguous and of the right rows at
each call, else the Python function runs.

A group whose every output is 0 past a slot's declared live count (ZeroRowProducts
found it: GIN's `x + sum of neighbours` over a GraphLoader slot, `computation.zero_rows`)
takes that fed count too: its loop stops there and it writes zeros past it. Zeros, not
whatever the rows held: they are the values the whole loop computes, and later readers
take every row (a readout over the slot's rows, whose padding graph reads the padding
rows, a product the pass left whole, the Python fallback's buffers shared with others).
"""
import ctypes

import numpy as np

from ngnn.op_graph import ElementWise, Placeholder

from ..gpu.expressions import attribute_literals, ctype, in_precision, literal, unwrapped
from . import native
from .native_elementwise import CFunctions

INDEX_TYPES = {np.dtype(np.int64): "long", np.dtype(np.int32): "int"}


class GroupFunctions(CFunctions):
    """The fused groups of one computation that run as C: `accepts(blocks, names)`, then
    `add(blocks, ...)` for each, `load()` to compile them all."""
    prefix, leading = "group", (ctypes.c_long,)

    @staticmethod
    def accepts(blocks):
        """Whether the group of this block plan runs as a C loop (see the module)."""
        group = blocks.group
        graph, csr = group.graph, "in" if group.at == "dst" else "out"
        indptr = getattr(graph, f"{csr}_indptr", None)
        if indptr is None or indptr.dtype not in INDEX_TYPES or \
                getattr(graph, f"{csr}_{'src' if csr == 'in' else 'dst'}").dtype != indptr.dtype:
            return False
        n = graph.num_nodes
        dtypes = set()
        members = [op for op in group.ops if op not in blocks.skipped]
        for op in members:
            dtypes.add(op.dtype)
            if op.shape[:1] != (n,) or op.scope == "e":
                return False
            if op in blocks.products:
                x, weight = blocks.products[op]
                if op.reduce != "sum" or x.dtype != op.dtype or x.shape[1:] != op.shape[1:]:
                    return False
                if weight is not None and not (
                        group.at == "dst" and weight in blocks.csr_ordered and
                        weight.size == weight.shape[0] and weight.dtype == op.dtype):
                    return False
            elif isinstance(op, ElementWise) and op.c is not None and not op.is_view:
                for a in op.args:
                    scalar = a.is_constant and a.value.ndim == 0
                    if not scalar and not (a.shape == op.shape and a.dtype == op.dtype and
                                           (a in members or
                                            blocks.rows_of(a, op) == "vertices")):
                        return False
            else:
                return False
        return len(dtypes) == 1 and dtypes <= set(native.SUFFIX) and \
            all(op.shape[:1] == (n,) for op in group.outputs) and \
            all(op in members for op in group.outputs)

    @staticmethod
    def live_count(blocks, zero_rows):
        """The fed int64 count past which every output of the group is 0 (`zero_rows`,
        op -> count, from ZeroRowProducts), or None."""
        counts = {zero_rows.get(op) for op in blocks.group.outputs}
        live = counts.pop() if len(counts) == 1 else None
        return live if isinstance(live, Placeholder) and live.shape == (1,) and \
            live.dtype == np.int64 else None

    def add(self, blocks, comments, live=None):
        """Renders the group as `group<k>(n_v, indptr, cols[, live], arrays...,
        outputs...)`, with `live` (live_count) computing the rows below the fed count
        and writing zeros past it; returns the name and the ops whose arrays it reads (in
        parameter order; the outputs, the group's, follow)."""
        group = blocks.group
        name = f"group{len(self.functions)}"
        csr = "in" if group.at == "dst" else "out"
        index = INDEX_TYPES[getattr(group.graph, f"{csr}_indptr").dtype]
        members = [op for op in group.ops if op not in blocks.skipped]
        t = ctype(members[0].dtype)
        inputs = []
        for op in members:
            reads = [a for a in blocks.products[op] if a is not None] \
                if op in blocks.products else op.args
            for a in reads:
                if a not in members and a not in inputs and \
                        not (a.is_constant and a.value.ndim == 0):
                    inputs.append(a)
        outputs = list(group.outputs)
        param = {a: f"a{k}" for k, a in enumerate(inputs)}
        param.update({op: f"o{k}" for k, op in enumerate(outputs)})
        width = {op: int(np.prod(op.shape[1:], dtype=np.int64)) for op in members}
        lines = [f"/* {c} */" for c in comments]
        lines.append(f"void {name}(long n_v, const {index} *indptr, const {index} *cols, " +
                     ", ".join(["const long *live"] * (live is not None) +
                               [f"const {t} *{param[a]}" for a in inputs] +
                               [f"{t} *{param[o]}" for o in outputs]) + ") {")
        rows = "n_v"
        if live is not None:
            rows = "n_live"
            lines += ["    long n_live = live[0] < 0 ? 0 : live[0] < n_v ? live[0] : n_v;"]
            lines += [f"    memset({param[o]} + n_live * {width[o]}, 0, "
                      f"(size_t)(n_v - n_live) * {width[o]} * sizeof({t}));" for o in outputs]
        lines.append(f"    for (long v = 0; v < {rows}; v++) {{")
        for k, op in enumerate(members):
            f = width[op]
            lines.append(f"        {t} r{k}[{max(f, 1)}];")
            if op in blocks.products:
                x, weight = blocks.products[op]
                term = f"{param[x]}[(long)cols[p] * {f} + j]"
                if weight is not None:
                    term = f"{param[weight]}[p] * {term}"
                lines += [f"        for (long j = 0; j < {f}; j++) r{k}[j] = 0;",
                          "        for (long p = indptr[v]; p < indptr[v + 1]; p++)",
                          f"            for (long j = 0; j < {f}; j++) r{k}[j] += {term};"]
            else:
                fields = attribute_literals(op)
                for field, a in zip(("x", "y"), op.args):
                    if a.is_constant and a.value.ndim == 0:
                        fields[field] = literal(a.value, op.dtype)
                    elif a in members:
                        fields[field] = f"r{members.index(a)}[j]"
                    else:
                        fields[field] = f"{param[a]}[v * {f} + j]"
                expr = unwrapped(in_precision(op.c.format(out_ctype=t, **fields), op.dtype))
                lines.append(f"        for (long j = 0; j < {f}; j++) r{k}[j] = {expr};")
            if op in param:
                lines.append(f"        for (long j = 0; j < {f}; j++) "
                             f"{param[op]}[v * {f} + j] = r{k}[j];")
        lines += ["    }", "}"]
        self.functions.append("\n".join(lines) + "\n")
        self.arity.append(2 + (live is not None) + len(inputs) + len(outputs))
        return name, inputs
