"""Kernel planning for the GPU transformer: which ops get a kernel of their own, which are
computed in registers inside the kernel that reads them, and where stored values live.

Every kernel reads its inputs through index expressions (seed 000's broadcast index
propagation), so an op that can be evaluated at any coordinate from its arguments (an
element-wise op (dropout too), broadcast, transpose, slice, reshape, gather, one-hot) needs
no buffer when all its readers sit in one kernel: that kernel recomputes it from registers.
A chain of element-wise ops thus becomes one kernel, and a gather feeding an aggregation
disappears into the aggregation.

Liveness is per kernel, not per op: a kernel reads all its inputs while it writes its
output, so an input's buffer is freed only after the last kernel that reads it.
"""
from ngnn.op_graph import (Aggregate, Assign, Broadcast, Constant, EdgeSoftmax,
                           ElementWise, Gather, OneHot, Placeholder, Reshape, Slice, Transpose,
                           Variable)
from ngnn.passes import GraphPass, MemoryPlan
from ngnn.passes.buffer_sharing import take_buffer

# Ops a kernel can evaluate at any coordinate, given their arguments at derived coordinates.
INLINE_OPS = (ElementWise, Broadcast, Transpose, Slice, Reshape, Gather, OneHot)
LEAVES = (Placeholder, Variable, Constant)


class KernelPlan:
    """`kernels`: root ops in launch order, one kernel each. `inline`: ops evaluated inside
    their readers' kernels. `views`: reshapes sharing their argument's buffer.
    `base(op)`: the op whose storage holds `op`."""

    def __init__(self, kernels, inline, views):
        self.kernels = kernels
        self.inline = inline
        self.views = views

    def base(self, op):
        while op in self.views:
            op = op.args[0]
        return op

    def is_stored(self, op):
        return op not in self.inline


def fusable_into(op, readers, root, edge_loops):
    """May `op` be computed inside `root`'s kernel, given its readers there?

    An aggregation runs a loop over a vertex's edges each time it is evaluated, so it is
    fused only as the input of element-wise node ops (seed 000's nodeCompute), one
    evaluation per output element, or where a loop over the same vertex's edges gathers it
    (softmax-style max, then sum, then weighted sum: each computed once before the next).
    An edge softmax is fused only where an aggregation over the same edges reads it: its
    per-vertex max and sum are then computed once, before that aggregation's loop."""
    if isinstance(op, Aggregate):
        node_compute = isinstance(root, ElementWise) and root.shape == op.shape and \
            all(isinstance(r, ElementWise) and r.shape == op.shape for r in readers)
        own_vertex = (op.graph, op.at) in edge_loops.get(root, ()) and \
            all(isinstance(r, Gather) and r.graph is op.graph and r.by == op.at
                for r in readers)
        return node_compute or own_vertex
    if isinstance(op, EdgeSoftmax):
        return (op.graph, op.at) in edge_loops.get(root, ())
    return isinstance(op, INLINE_OPS)


def plan_kernels(ops, results, fuse=True):
    """One kernel per root op; with `fuse` off every op but a reshape is a root, the
    unfused baseline of one launch (and one stored tensor) per op."""
    users = {op: [] for op in ops}
    for op in ops:
        for a in op.args:
            users[a].append(op)
    results = set(results)
    kernel_of = {}            # op -> the root whose kernel computes it
    edge_loops = {}           # root -> (graph, end) of the aggregations its kernel runs
    inline, views = set(), set()
    for op in reversed(ops):
        if isinstance(op, LEAVES + (Assign,)):
            continue
        if op.is_sparse:
            inline.add(op)          # a sparse dropout: applied per value by every reader
            continue
        readers = users[op]
        root = kernel_of.get(readers[0]) if readers else None
        if fuse and op not in results and root is not None and \
                all(kernel_of.get(r) is root for r in readers) and \
                fusable_into(op, readers, root, edge_loops):
            inline.add(op)
            kernel_of[op] = root
            if isinstance(op, Aggregate):
                edge_loops.setdefault(root, set()).add((op.graph, op.at))
        elif isinstance(op, Reshape):
            views.add(op)           # same bytes, same order: no kernel, no buffer
        else:
            kernel_of[op] = op
            if isinstance(op, Aggregate):
                edge_loops[op] = {(op.graph, op.at)}
    kernels = [op for op in ops if kernel_of.get(op) is op]
    return KernelPlan(kernels, inline, views)


def plan_memory(plan, kernel_inputs, results, deferred):
    """Buffers for the kernels' outputs, reused once no later kernel reads them.
    `kernel_inputs[root]` are the stored ops the root's kernel loads; `deferred` the values
    assignments copy into variables after the last kernel."""
    memory = MemoryPlan()
    end = len(plan.kernels)
    last_read = {}
    for i, root in enumerate(plan.kernels):
        for op in kernel_inputs[root]:
            last_read[plan.base(op)] = i
    for op in list(results) + list(deferred):
        last_read[plan.base(op)] = end
    free, holder = [], {}
    for i, root in enumerate(plan.kernels):
        slot = take_buffer(free, root.nbytes, memory)
        memory.slots[root] = slot
        holder[slot] = root
        for slot, held in list(holder.items()):
            if last_read.get(held, i) <= i:
                free.append(slot)
                del holder[slot]
    return memory


class KernelPlanning(GraphPass):
    """Sets `computation.kernel_plan`; the transformer generates kernels from it and then
    the memory plan (which needs each kernel's inputs)."""

    def __init__(self, fuse=True):
        self.fuse = fuse

    def do_pass(self, computation):
        computation.kernel_plan = plan_kernels(computation.ordered_ops, computation.results,
                                               self.fuse)
