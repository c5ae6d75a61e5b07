"""KernelPlanning: the kernels of a GPU program, from the Fusion pass's groups.

A kernel writes one stored value (its root) and computes, in registers, every op it inlines:
ops it can evaluate at any coordinate from their arguments (seed 000's broadcast index
propagation). The plan keeps Fusion's decisions whole:
  - each output of a fused group is the root of one kernel named after the group, and the
    group's other ops, recomputed ones included, are inlined into those kernels; so a value
    is stored exactly where Fusion says it is (`recompute`, `max_recompute` included);
  - outside the groups, an op a kernel can evaluate per coordinate is inlined into the
    kernel that reads it when all its readers sit in that kernel (a transpose,
    slice, broadcast, reshape, dropout or element-wise op of one value, an activation,
    into each of several such kernels: a copy would cost a write and a read; a per-head
    attention score into every graph kernel reading it): a chain of element-wise
    ops becomes one kernel (ngraph's ElementWiseKernel), a dense softmax reads its exp
    chain from registers; a sparse dropout is applied per stored value by every product
    reading it. Every other op is the root of a kernel of its own.
A matrix product read by one element-wise op only writes that op's value (an epilogue).
A Reshape nobody inlines is a view: same bytes, same order, no kernel. A group's weighted
sum of softmax weights (SoftmaxByLogSumExp's OnlineSoftmax) is marked to run as one walk of
the edges (`online_softmax`).

The pass replaces the steps of the computation by `KernelGroup`s (and plain ops for
kernels that inline nothing), so BufferSharing plans the buffers the kernels read and write,
and the IR shows exactly the kernels that run.
"""
from ..op_graph import Assign, Communication, Dot, OneHot, Reshape
from .base import GraphPass
from .fusion import FusedGroup
from .softmax_by_log_sum_exp import OnlineSoftmax

ROW_REDUCTION = 64


def per_element(op):
    """Whether `op` is one element of its argument each (`positional`: a view or a dropout,
    whose mask is computed from the element's position alone; or an element-wise op of one
    value of its shape, with leaves: an activation such as ELU, read by the next layer's
    product, its own gradient and the weight gradient; a product with a weight). Each
    reader then reads that value in place of the op's (a stored copy that would be written
    and read again), no more, so it is inlined into every kernel reading it."""
    if op.positional:
        return True
    values = [a for a in op.args if not a.is_leaf]
    return op.elementwise and len(values) == 1 and values[0].shape == op.shape


def per_row(op, homes):
    """Whether `op` reduces a few elements of each row (at most ROW_REDUCTION: a head's
    attention score, the dot product of its features with the attention vector) for graph
    kernels only: each computes it from the row it reads anyway, where a kernel of its own
    would read the rows once more and write the scores for every reader to read."""
    if not (op.combiner is not None and op.row_local() and op.args[0].ndim > 1):
        return False
    count = 1
    for axis in op.axes:
        count *= op.args[0].shape[axis]
    return count <= ROW_REDUCTION and all(home.group is not None for home in homes)


class KernelGroup:
    """One step of a GPU program: one kernel per output, each computing the `inlined` ops
    it needs in registers. `group` is the Fusion group it runs, if any; `inputs` are the
    stored values its kernels read."""

    def __init__(self, outputs, inlined, group=None):
        self.outputs = list(outputs)
        self.inlined = set(inlined)
        self.group = group
        self.ops = []             # what its kernels compute, in graph order
        self.inputs = []
        # A matrix product whose one reader is this kernel's element-wise output: the
        # product's kernel writes that output from each product element (an epilogue).
        self.epilogue = None

    @property
    def name(self):
        """The fused group's name; None for a kernel that only inlines producers (the IR
        prints its ops, the program its kernel)."""
        return self.group.name if self.group else None

    @property
    def at(self):
        return self.group.at if self.group else None

    @property
    def recomputed(self):
        return self.group.recomputed if self.group else []

    def computes(self, op):
        return op in self.inlined or op in self.outputs

    def __repr__(self):
        return f"<KernelGroup {self.name or self.outputs[0]}: {len(self.outputs)} kernel(s)>"


class KernelPlan:
    """`steps`: the program, KernelGroups and plain ops (leaves, views, assignments, and
    kernels that inline nothing). `views`: Reshapes sharing their argument's buffer."""

    def __init__(self, steps, views, online_softmax=None):
        self.steps = steps
        self.views = views
        # A weighted sum of a softmax's weights that a group's kernels compute in one walk
        # of the edges: aggregate -> OnlineSoftmax; and the softmax's max and sum of
        # exponentials, which that walk holds too (where it can find them).
        self.online_softmax = online_softmax or {}
        self.online_statistics = {op: match for match in self.online_softmax.values()
                                  if match.aligned for op in (match.peak, match.sums)}

    def base(self, op):
        """The op whose storage holds `op`."""
        while op in self.views:
            op = op.args[0]
        return op


class KernelPlanning(GraphPass):
    """`inline=False` gives the unfused baseline: one kernel (and one stored tensor) per op."""

    def __init__(self, inline=True):
        self.inline = inline

    def do_pass(self, computation):
        plan = plan_kernels(computation.steps, computation.ordered_ops, computation.results,
                            self.inline)
        computation.kernel_plan = plan
        computation.steps = plan.steps


def plan_kernels(steps, ops, results, inline=True):
    groups = [s for s in steps if isinstance(s, FusedGroup)]
    position = {op: i for i, op in enumerate(ops)}
    recomputed = {op for g in groups for op in g.recomputed}
    users = {op: [] for op in ops}
    for op in ops:
        for a in op.args:
            users[a].append(op)
    results = set(results)
    kernel_of = {}          # op -> the KernelGroup whose outputs it is, or inlined into
    computed_by = {}        # op -> every KernelGroup computing it (recomputing ones too)
    grouped = {}
    for group in groups:
        kernel = KernelGroup(group.outputs, set(group.ops) - set(group.outputs), group)
        grouped[group] = kernel
        for op in group.core:
            kernel_of[op] = kernel
        for op in group.ops:
            computed_by.setdefault(op, set()).add(kernel)
    views = set()
    for op in reversed(ops):
        if op in kernel_of or op in recomputed or op.is_leaf or isinstance(op, Assign):
            continue
        homes = set().union(*(computed_by.get(r, ()) for r in users[op]))
        if op.is_sparse:            # a sparse dropout: applied per value by every reader
            for home in homes:
                home.inlined.add(op)
            kernel_of[op] = next(iter(homes))
            computed_by[op] = homes
            continue
        # Stored, never inlined: class ids a one-hot reads (the executor range-checks
        # them) and values communication reads (it runs on the host).
        must_store = any(isinstance(r, (OneHot, Communication)) for r in users[op])
        epilogue = epilogue_home(op, users, kernel_of, results) if inline else None
        if inline and op not in results and (
                op.inlinable and (len(homes) == 1 or per_element(op)) or
                per_row(op, homes)) and \
                all(r in computed_by for r in users[op]) and not must_store:
            for home in homes:
                home.inlined.add(op)
            kernel_of[op] = next(iter(homes))
            computed_by[op] = homes
        elif epilogue is not None:
            epilogue.inlined.add(op)
            epilogue.epilogue = op
            kernel_of[op] = epilogue
            computed_by[op] = {epilogue}
        elif isinstance(op, Reshape):
            views.add(op)
        else:
            kernel_of[op] = KernelGroup([op], ())
            computed_by[op] = {kernel_of[op]}
    online = {op: match for g in groups if inline for op in g.ops
              if op.fusion_role == "agg" for match in [OnlineSoftmax.of(op)] if match}
    plan = KernelPlan([], views, online)
    for step in steps:
        if isinstance(step, FusedGroup):
            kernel = grouped[step]
        else:
            kernel = kernel_of.get(step)
            if kernel is None:
                plan.steps.append(step)         # a leaf, a view or an assignment
                continue
            if step not in kernel.outputs:
                continue                        # computed by its readers' kernel
        kernel.ops = sorted(kernel.inlined | set(kernel.outputs), key=position.__getitem__)
        kernel.inputs = _stored_inputs(kernel)
        plan.steps.append(kernel if kernel.group or kernel.inlined else step)
    return plan


def epilogue_home(op, users, kernel_of, results):
    """The kernel of the element-wise op that reads matrix product `op` (itself or
    through one element-wise op inlined into it, a dropout's mask), when the product has
    no other reader and that op is its kernel's only output, of the product's shape: the
    product's kernel writes it from each element (a gradient times an activation's
    derivative), so the product is never stored and read back."""
    if type(op) is not Dot or op in results or len(users[op]) != 1 or \
            min(a.ndim for a in op.args) < 2:
        return None
    (reader,) = users[op]
    home = kernel_of.get(reader)
    if home is None or home.group is not None or home.epilogue is not None or \
            len(home.outputs) != 1:
        return None
    (out,) = home.outputs
    chain = [reader] if reader is out else [reader, out]
    if len(chain) == 2 and users[reader] != [out]:
        return None
    if not all(x.elementwise and x.shape == op.shape for x in chain):
        return None
    return home


def _stored_inputs(kernel):
    """The stored values a kernel group reads: arguments of what it computes that it
    does not compute itself."""
    inputs = []
    for op in kernel.ops:
        for a in op.args:
            if not kernel.computes(a) and a not in inputs:
                inputs.append(a)
    return inputs
