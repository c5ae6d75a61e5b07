"""BufferSharing: liveness over the ordered ops, then buffers reused when lifetimes don't
overlap, and element-wise ops written in place over an argument that dies with them."""
from ..op_graph import Assign, ElementWise, Op
from ..op_graph.printer import IRNames
from .base import GraphPass


class MemoryPlan:
    """Where every intermediate tensor lives: `slots[op] = buffer index` (offset 0),
    `buffer_bytes[i]` the size of buffer i. Results are returned as copies, so they share
    nothing with later calls."""

    def __init__(self):
        self.slots = {}
        self.buffer_bytes = []
        self.inplace = set()
        self.into_variable = {}     # value op -> variable it is written into directly
        # The IR's names of values (printer.IRNames), given by the computation once its
        # steps are planned, so the plan names values as the IR and the generated code do.
        self.names = IRNames()

    @property
    def peak_bytes(self):
        """Bytes of intermediate buffers: all of them are live at the busiest point."""
        return sum(self.buffer_bytes)

    def __str__(self):
        lines = [f"memory plan: {len(self.buffer_bytes)} buffers, {self.peak_bytes} bytes"]
        for i, nbytes in enumerate(self.buffer_bytes):
            users = [op for op, b in self.slots.items() if b == i]
            names = ", ".join(self.names[op] for op in users)
            lines.append(f"  buffer {i}: {nbytes} bytes <- {names}")
        return "\n".join(lines)


class BufferSharing(GraphPass):
    """Runs on ordered ops; asks the computation's transformer which ops are views of their
    argument (no storage) and which need no intermediate storage at all."""

    def do_pass(self, computation):
        computation.memory_plan = plan_memory(computation.steps, computation.results,
                                              computation.transformer)


def is_group(step):
    """Fused groups and kernel groups: steps that are not a single op."""
    return not isinstance(step, Op)


def reads_writes(step, transformer):
    """(ops read, ops written to fresh storage) by one step: an op or a group of ops."""
    if is_group(step):
        return step.inputs, step.outputs
    return step.args, [step] if transformer.needs_storage(step) else []


def plan_memory(steps, results, transformer):
    plan = MemoryPlan()
    root = {}

    def root_of(op):
        return root.get(op, op)

    for step in steps:
        if not is_group(step) and (transformer.is_view(step) or
                                                 isinstance(step, Assign)):
            root[step] = root_of(step.args[0])
    end = len(steps)
    last_use = {}
    for i, step in enumerate(steps):
        for arg in reads_writes(step, transformer)[0]:
            # max: an assignment reads its value at the very end, even when the
            # assignment comes before other readers in the order.
            last_use[root_of(arg)] = max(last_use.get(root_of(arg), -1),
                                         end if isinstance(step, Assign) else i)
    for r in results:
        last_use[root_of(r.forwarded)] = end

    plan.into_variable = updates_in_place(steps, results, root_of)
    free = []                      # buffer indices not holding a live tensor
    holder = {}                    # buffer index -> root op living in it
    for i, step in enumerate(steps):
        for op in reads_writes(step, transformer)[1]:
            if op in plan.into_variable:
                continue
            slot = None if is_group(step) else \
                _inplace_slot(op, i, plan, root_of, last_use, transformer)
            if slot is not None:
                plan.inplace.add(op)
            else:
                slot = take_buffer(free, op.nbytes, plan)
            plan.slots[op] = slot
            holder[slot] = op
        for slot, held in list(holder.items()):
            if last_use.get(held, i) <= i:      # dead after this step (or never used)
                free.append(slot)
                del holder[slot]
    return plan


def updates_in_place(steps, results, root_of):
    """{value op: variable} for assignments whose new value may be written straight into
    the variable: an element-wise op reading the variable (same shape), used only by the
    assignment, after which nothing reads the old value."""
    position = {s: i for i, s in enumerate(steps)}
    last_read, users = {}, {}
    for i, step in enumerate(steps):
        reads = step.inputs if is_group(step) else step.args
        for arg in reads:
            users[arg] = users.get(arg, 0) + 1
            if not isinstance(step, Assign):
                last_read[root_of(arg)] = i
    # An assignment's own result is the new value; only other results need the old one.
    returned = {root_of(r.forwarded) for r in results if not isinstance(r.forwarded, Assign)}
    updates = {}
    for step in steps:
        if not isinstance(step, Assign):
            continue
        variable, value = step.args
        if isinstance(value, ElementWise) and value in position and users[value] == 1 and \
                value not in returned and variable not in returned and \
                any(a is variable for a in value.args) and value.shape == variable.shape and \
                value.dtype == variable.dtype and \
                last_read.get(variable, -1) <= position[value]:
            updates[value] = variable
    return updates


def _inplace_slot(op, i, plan, root_of, last_use, transformer):
    """An argument's buffer, if `op` may overwrite it: element-wise, same shape and dtype,
    the argument's storage dies here and nothing else views it."""
    if not isinstance(op, ElementWise) or not transformer.inplace_ok(op):
        return None
    for arg in op.args:
        r = root_of(arg)
        if arg is r and r in plan.slots and last_use.get(r) == i and \
                arg.shape == op.shape and arg.dtype == op.dtype:
            return plan.slots[r]
    return None


def take_buffer(free, nbytes, plan):
    """Best-fit free buffer, unless it is more than twice the size (a small tensor that
    lives long would keep a large buffer from the large tensors after it: R-GCN's
    per-relation gradients); else the largest free one, grown; else a new buffer."""
    fitting = [s for s in free if plan.buffer_bytes[s] >= nbytes]
    if fitting and min(plan.buffer_bytes[s] for s in fitting) > 2 * nbytes:
        plan.buffer_bytes.append(nbytes)
        return len(plan.buffer_bytes) - 1
    if fitting:
        slot = min(fitting, key=lambda s: plan.buffer_bytes[s])
    elif free:
        slot = max(free, key=lambda s: plan.buffer_bytes[s])
        plan.buffer_bytes[slot] = nbytes
    else:
        plan.buffer_bytes.append(nbytes)
        return len(plan.buffer_bytes) - 1
    free.remove(slot)
    return slot
