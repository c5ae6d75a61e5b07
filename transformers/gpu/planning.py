"""Kernel planning for the GPU transformer: which ops get a kernel of their own, which are
computed in registers inside the kernel that reads them, and where stored values live.

Every kernel reads its inputs through index expressions (seed 000's broadcast index
propagation), so an op that can be evaluated at any coordinate from its arguments (an
element-wise op, broadcast, transpose, slice, reshape, gather, dropout mask, one-hot) needs
no buffer when all its readers sit in one kernel: that kernel recomputes it from registers.
A chain of element-wise ops thus becomes one kernel, and a gather feeding an aggregation
disappears into the aggregation.

Liveness is per kernel, not per op: a kernel reads all its inputs while it writes its
output, so an input's buffer is freed only after the last kernel that reads it.
"""
from ngnn.op_graph import (Assign, Broadcast, Constant, DropoutMask, ElementWise, Gather,
                           OneHot, Placeholder, Reshape, Slice, Transpose, Variable)
from ngnn.passes import GraphPass, MemoryPlan

# Ops a kernel can evaluate at any coordinate, given their arguments at derived coordinates.
INLINE_OPS = (ElementWise, Broadcast, Transpose, Slice, Reshape, Gather, DropoutMask, OneHot)
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


def plan_kernels(ops, results):
    users = {op: [] for op in ops}
    for op in ops:
        for a in op.args:
            users[a].append(op)
    results = set(results)
    kernel_of = {}            # op -> the root whose kernel computes it
    inline, views = set(), set()
    for op in reversed(ops):
        if isinstance(op, LEAVES + (Assign,)):
            continue
        readers = users[op]
        if isinstance(op, INLINE_OPS) and op not in results and readers and \
                all(r in kernel_of for r in readers) and \
                len({kernel_of[r] for r in readers}) == 1:
            inline.add(op)
            kernel_of[op] = kernel_of[readers[0]]
        elif isinstance(op, Reshape):
            views.add(op)           # same bytes, same order: no kernel, no buffer
        else:
            kernel_of[op] = op
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
        slot = _take(free, root.nbytes, memory)
        memory.slots[root] = slot
        holder[slot] = root
        for slot, held in list(holder.items()):
            if last_read.get(held, i) <= i:
                free.append(slot)
                del holder[slot]
    return memory


def _take(free, nbytes, memory):
    """The smallest free buffer that fits; else the largest free one, grown; else a new one."""
    fitting = [s for s in free if memory.buffer_bytes[s] >= nbytes]
    if fitting:
        slot = min(fitting, key=lambda s: memory.buffer_bytes[s])
    elif free:
        slot = max(free, key=lambda s: memory.buffer_bytes[s])
        memory.buffer_bytes[slot] = nbytes
    else:
        memory.buffer_bytes.append(nbytes)
        return len(memory.buffer_bytes) - 1
    free.remove(slot)
    return slot


class KernelPlanning(GraphPass):
    """Sets `computation.kernel_plan`; the transformer generates kernels from it and then
    the memory plan (which needs each kernel's inputs)."""

    def do_pass(self, computation):
        computation.kernel_plan = plan_kernels(computation.ordered_ops, computation.results)
