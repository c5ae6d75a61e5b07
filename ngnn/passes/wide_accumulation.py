"""WideAccumulation: every order-dependent float32 sum is accumulated in float64 and
rounded to float32 once, after the last step that adds to it.

A float32 sum depends on the order of its terms: adding a vertex's in-edges in another
sequence, or a weight gradient X^T G as partial products, changes the last bits, and
Adam turns those bits into visible steps where a gradient is nearly 0. A float64 sum of
float32 terms holds them (and the float64 products of two float32 values) exactly as
long as they span fewer than 2**29 in magnitude, and otherwise errs by ~2**-53 of its
largest partial sum; rounded to float32 it is the same whatever the order, except in
vanishingly rare ties. So a computation split over ranks (partial sums per rank, then
across ranks: ngnn.distributed) or over row blocks equals the one-process computation.

The pass widens, for float32 results:

* `Dot` (dense, over more than one term): rows of a float32 BLAS product change with
  the number of rows (its blocking); rows of a float64 product rounded to float32 do not.
  Weight gradients X^T G sum over vertices.
* `SparseTransposedDot` (X^T D, the weight gradient of sparse features).
* `Aggregate` sum and mean: the message is widened where it is made, so a gather reads
  a widened node tensor and an edge weight times it is an exact float64 product.
* `Sum` over the first axis (vertex or edge rows: biases' gradients, losses).
* Batch norm's statistics and the column sums of its gradient (BatchNormStats,
  BatchNormApplySums).

Edge softmax denominators are accumulated in float64 by the kernels themselves.

Then the rounding moves past the ops that still add to the value, so they add in float64:
communication (mirror reduction, all-reduce), sums of widened values (a weight read
twice; the slices of a split product), a division by a constant (a distributed mean),
and layout ops. Last, a widened gather of a value that is also gathered in float32, over
the same graph and end, widens the float32 gather's rows instead (`widen_after_gather`):
a walk that needs both loads each row once, as float32, and casts it in registers.
"""
import numpy as np

from ..op_graph import (Add, BatchNormApplySums, BatchNormStats, Cast, Communication,
                        Constant, Divide, Dot, Gather, MasterBroadcast, Multiply,
                        Reshape, SparseTransposedDot, Sum, Transpose, ordered_ops)
from .base import GraphPass

F32, F64 = np.dtype(np.float32), np.dtype(np.float64)


class WideAccumulation(GraphPass):
    def do_pass(self, computation):
        self.rounded = {}          # id -> a Cast to float32 this pass made (ops compare
                                   # symbolically, so they key by id)
        changed = True
        while changed:
            changed = False
            for op in ordered_ops(computation.results):
                if op.forward is None:
                    replacement = self.pushed(op)
                    if replacement is None:
                        replacement = self.widened(op)
                    if replacement is not None:
                        op.forward = replacement
                        changed = True
        widen_after_gather(computation.results)

    def round(self, wide):
        narrow = Cast(wide, F32)
        self.rounded[id(narrow)] = narrow
        return narrow

    def widened(self, op):
        """The float64 accumulation of `op`, rounded, or None."""
        if op.dtype != F32:
            return None
        if type(op) is Dot and not any(a.is_sparse for a in op.args) and \
                op.args[0].shape[-1] > 1:
            return self.round(Dot(wide(op.args[0]), wide(op.args[1]), name=op.name))
        if isinstance(op, SparseTransposedDot):
            x, d = op.args
            return self.round(SparseTransposedDot(x, wide(d), name=op.name))
        if op.row_space is not None and op.combiner is not None and op.combiner.linear:
            # an aggregation of a sum (or mean) of its messages
            return self.round(op.with_args([message(op.args[0])]))
        if type(op) is Sum and 0 in op.axes and op.args[0].shape[0] > 1:
            return self.round(op.with_args([wide(op.args[0])]))
        if isinstance(op, (BatchNormStats, BatchNormApplySums)):
            # Column sums over the live rows; the live count stays as it is.
            fixed = op.args[:op.fixed_args]
            return self.round(op.with_args([wide(a) for a in fixed] +
                                           list(op.args[op.fixed_args:])))
        return None

    def pushed(self, op):
        """`op` applied before the rounding of its widened argument(s), or None."""
        args = op.args
        inner = [a.args[0] if id(a) in self.rounded else None for a in args]
        if isinstance(op, Communication) and not isinstance(op, MasterBroadcast) and \
                inner[0] is not None:
            return self.round(op.with_args([inner[0]]))
        if isinstance(op, (Reshape, Transpose)) and inner[0] is not None:
            return self.round(op.with_args([inner[0]]))
        if type(op) is Add and all(i is not None for i in inner):
            return self.round(Add(*inner))
        if type(op) is Sum and inner[0] is not None:
            return self.round(op.with_args([inner[0]]))
        if isinstance(op, Divide) and inner[0] is not None and isinstance(args[1], Constant) and \
                args[1].dtype == F32:
            return self.round(op.with_args([inner[0], Constant(args[1].value, dtype=F64)]))
        return None


def widen_after_gather(results):
    """A gather of x widened (an aggregation's message) next to a float32 gather of x, over
    the same graph and end, becomes the float32 gather cast to float64 (exact: the same
    values). GAT's and TransformerConv's source-side backward walk reads the output
    gradient at each edge's destination for the features' gradient, widened, and for the
    logits' gradient in float32: reading the float32 rows once, the walk recomputes the
    logits' gradient from rows it loads anyway (docs/fusion.md). Reading the widened rows
    for both instead would load twice the bytes per edge."""
    ops = ordered_ops(results)
    narrow = {}
    for op in ops:
        if isinstance(op, Gather) and op.dtype == F32:
            narrow.setdefault((id(op.graph), op.by, id(op.args[0])), op)
    for op in ops:
        if isinstance(op, Gather) and op.forward is None and op.dtype == F64 and \
                isinstance(op.args[0], Cast) and op.args[0].args[0].dtype == F32:
            rows = narrow.get((id(op.graph), op.by, id(op.args[0].args[0])))
            if rows is not None:
                op.forward = Cast(rows, F64)


def wide(x):
    """x in float64; a transposed value is cast before its transpose, so the cast keeps
    the rows of the value it reads (chunked execution splits by them)."""
    if isinstance(x, Transpose):
        return x.with_args([Cast(x.args[0], F64)])
    return Cast(x, F64)


def message(x):
    """An aggregation's float32 message, widened where it is made: gathers read the
    widened node tensor (a gather only copies rows), a product of two factors is the
    exact float64 product of their float32 values."""
    if isinstance(x, Gather):
        return x.with_args([wide(x.args[0])])
    if type(x) is Multiply and x.args[0].dtype == x.args[1].dtype == F32:
        return Multiply(*(a.with_args([wide(a.args[0])]) if isinstance(a, Gather) else wide(a)
                          for a in x.args))
    return wide(x)
