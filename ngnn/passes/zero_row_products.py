"""ZeroRowProducts: matrix products skip the rows they know to be 0.

A GraphLoader slot is sized for a large batch, so a fifth of its rows is padding on
average (1196 rows for 952 vertices of NCI1 at batch 32), and every dense product over
node rows spends that fifth on them. Batch norm over a slot zeroes the padding rows of
its result and of its input gradient (ngnn/op_graph/normalization.py: ops with
`zero_past_live` write 0 past their `live` rows, a count known only at run time), and
zero rows stay zero through what follows: ReLU, dropout, a product, the sum of two
such values. A product reading them then computes the live rows only:

    relu(batch_norm(h)) @ W        -> out[:n] = a[:n] @ W, the rest 0       (forward)
    delta @ W.T                    -> the same, delta the batch norm's input gradient
    h.T @ delta                    -> h.T[:, :n] @ delta[:n]                (weight gradient)
    sum(delta, axis=0)             -> ones[:, :n] @ delta[:n]               (bias gradient)

with n read at run time (ZeroRowDot, ngnn/op_graph/linalg.py).

A GraphLoader slot declares its live rows (BatchSlot.live, ngnn/sampling/graph_loader.py):
one count fed with each batch, the one batch norm over the slot reads (cast to its dtype).
Two more facts hold past it, and reach the first Linear of every GIN layer, forward and
backward:

    the slot's features (SlotRows)          0 past the count, as loaded
    sum or mean over the slot's edges of rows 0 past the count
                                            0 past it: padding edges join padding rows only

so `x + sum of neighbours` of the first layer and of every later one (whose h batch norm
zeroed) is 0 past the count, and so is the gradient the backward sends through the
aggregation. Both facts are the slot's, so they hold for its declared count only: the
count must be that very op (after batch norm's cast), never one derived from a fed graph
mask, and the features' declaration counts only where the computation is fed the count.

The value is the one the whole product gives, whatever the other operand holds in those
rows (0 times a finite value), so nothing but the time (and the order of a float sum's
terms) changes, and a computation compiled once serves every batch size.

The analysis runs forward over the ops: `zero[op]` is the op holding the live count past
which op's rows are 0, or absent. Run by the NumPy transformer, whose kernels slice
(its last graph pass, after every rewrite and the widening of sums); ZeroRowDot
decomposes back to Dot for a transformer without a kernel for it.
"""
import numpy as np

from ..op_graph import (Abs, Add, Aggregate, Cast, Constant, Dot, Dropout, Elu, Gather,
                        LeakyRelu, Multiply, Negative, Relu, Reshape, Sign, Sqrt, Subtract, Sum,
                        Tanh, Transpose, ZeroRowDot, ordered_ops)
from .base import GraphPass

# Element-wise maps of one tensor with f(0) = 0: zero rows stay zero.
KEEPS_ZERO = (Relu, LeakyRelu, Elu, Negative, Tanh, Abs, Sign, Sqrt, Cast, Dropout)


class ZeroRowProducts(GraphPass):
    def do_pass(self, computation):
        zero = {}
        self.fed = computation.parameters
        # What the NumPy transformer's native groups read (native_groups.py): each op
        # found 0 past a count, with the op whose value that count is.
        computation.zero_rows = {}
        for op in ordered_ops(computation.results):
            live = self.zero_past(op, zero)
            if type(op) is Dot:
                live = self.replace_product(op, zero)
            elif type(op) is Sum:
                self.replace_column_sum(op, zero)
            if live is not None:
                zero[op] = zero[op.forwarded] = live
                computation.zero_rows[op] = computation.zero_rows[op.forwarded] = \
                    self.count(live)

    @staticmethod
    def rows(x, like):
        """x spans the rows of `like` (row for row), not broadcast along them."""
        return x.ndim == like.ndim and x.shape[0] == like.shape[0]

    @staticmethod
    def count(live):
        """The op whose value `live` is: batch norm reads a slot's int count cast to its
        float dtype (exact: counts are far below 2**24)."""
        if isinstance(live, Cast) and live.args[0].dtype.kind in "iu" and \
                live.dtype.kind == "f":
            return live.args[0]
        return live

    def zero_past(self, op, zero):
        """The live-count op past which `op`'s rows are 0, or None."""
        args = op.args
        if getattr(op, "zero_past_live", False):
            # An op's count is one of its arguments; a placeholder's (a slot's features)
            # is the slot's, which only a computation fed it can read.
            fed = args or any(p is op.live for p in self.fed)
            return op.live if fed else None
        if isinstance(op, Aggregate):
            return self.aggregated(op, zero)
        if isinstance(op, KEEPS_ZERO):
            return zero.get(args[0])
        if isinstance(op, Multiply) and op.ndim:
            # A zero row of either factor gives a zero row (0 times a finite value).
            for x in args:
                if x in zero and self.rows(x, op):
                    return zero[x]
            return None
        if isinstance(op, (Add, Subtract)) and op.ndim:
            lives = [zero.get(x) if self.rows(x, op) else None for x in args]
            if lives[0] is not None and self.count(lives[0]) is self.count(lives[1]):
                return lives[0]
        return None

    def aggregated(self, op, zero):
        """The count of a sum or mean over a slot's edges of values gathered from rows 0
        past the slot's declared count: each padding row's edges join padding rows, whose
        values are 0, so the padding rows of the result are 0 (mean divides by at least
        1). Only for the slot's own count, with which its padding edges start."""
        (edges,) = op.args
        declared = getattr(op.graph, "live", None)
        if declared is None or op.reduce not in ("sum", "mean") or \
                not isinstance(edges, Gather) or edges.graph is not op.graph:
            return None
        live = zero.get(edges.args[0])
        return live if live is not None and self.count(live) is declared else None

    def replace_product(self, op, zero):
        """Puts a ZeroRowDot for the product `op` where an operand's zero rows allow;
        returns the live count past which the result's rows are 0, or None."""
        a, b = op.args
        if a.ndim != 2 or b.ndim != 2 or op.dtype.kind != "f":
            return None
        if a in zero:                                   # rows of a
            op.forward = ZeroRowDot(a, b, zero[a], contract=False)
            return zero[a]
        contracted = zero.get(b)
        if contracted is None and isinstance(a, Transpose):      # a = x.T, rows of x
            contracted = zero.get(a.args[0])
        if contracted is not None:
            op.forward = ZeroRowDot(a, b, contracted, contract=True)
        return None

    @staticmethod
    def replace_column_sum(op, zero):
        """A sum down the rows of a matrix whose rows past the live ones are 0 becomes
        the product ones @ x over the live rows: BLAS's, several times as fast as
        np.sum down the rows (a bias gradient)."""
        (x,) = op.args
        if op.axes != (0,) or x.ndim != 2 or x not in zero or op.dtype.kind != "f":
            return
        ones = Constant(np.ones((1, x.shape[0])), dtype=x.dtype)
        op.forward = Reshape(ZeroRowDot(ones, x, zero[x], contract=True), op.shape)
