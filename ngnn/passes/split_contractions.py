"""SplitContractions: a matrix product with a small output and a long inner axis becomes a
batched product over slices of that axis, summed.

A weight gradient X^T D contracts over every vertex (K = 100,000 rows) into a few hundred
outputs: a tiled GEMM gives each output tile to one work-group, so one or a handful of the
GPU's work-groups walk all K rows while the rest of the device idles (10 ms for a 16 x 16
gradient at K = 100,000 on an H100). Cut into S slices, the products are S times as many
work-groups, each over K / S rows, and a reduction sums the S partial results; the sums
run in a fixed order, so results stay deterministic. The slices are slices and reshapes
of the operands, read in place by the GEMM's index expressions, never copies.

A GPU planning pass: the NumPy transformer calls BLAS, which splits long products itself.
"""
from ..op_graph import Dot, Reshape, Slice, SparseDot, Sum, Transpose
from .base import PeepholeGraphPass


class SplitContractions(PeepholeGraphPass):
    """`tile`: the GEMM's output tile edge; `work_groups`: how many work-groups a product
    should give the device at least; `min_slice`: the fewest inner-axis rows per slice."""

    def __init__(self, tile, work_groups=512, min_slice=256):
        self.tile, self.work_groups, self.min_slice = tile, work_groups, min_slice

    @visit.on_type(Dot)
    def visit(self, op):
        a, b = op.args
        if isinstance(op, SparseDot) or a.ndim != 2 or b.ndim != 2 or op.dtype.kind != "f":
            return
        (m, k), n = a.shape, b.shape[1]
        tiles = -(-m // self.tile) * -(-n // self.tile)
        if tiles == 0:
            return                    # an empty output: no work to spread
        slices = even_slices(k, min(-(-self.work_groups // tiles), k // self.min_slice))
        if slices < 2:
            return
        rows = k // slices
        split = slices * rows
        a_slices = Transpose(Reshape(take(a, 1, 0, split), (m, slices, rows)), (1, 0, 2))
        b_slices = Reshape(take(b, 0, 0, split), (slices, rows, n))
        total = Sum(Dot(a_slices, b_slices), axis=0)
        if split < k:
            total = total + Dot(take(a, 1, split, k), take(b, 0, split, k))
        self.replace_op(op, total)


def even_slices(k, most):
    """The number of slices of an inner axis of `k`: the largest divisor of k from most / 2
    to `most`, so the slices cover the axis and no remainder needs a product of its own (a
    launch reading both operands for a few rows), else `most` (k has no such divisor)."""
    for slices in range(most, (most + 1) // 2 - 1, -1):
        if slices >= 2 and k % slices == 0:
            return slices
    return most


def take(x, axis, start, stop):
    """x over [start, stop) of `axis`. Of a transpose, the slice is taken of what it
    transposes, so each part reads the stored value in place and the transpose itself is
    not left with two readers (which would store it)."""
    if start == 0 and stop == x.shape[axis]:
        return x
    if isinstance(x, Transpose):
        return Transpose(take(x.args[0], x.axes[axis], start, stop), x.axes)
    key = [slice(None)] * x.ndim
    key[axis] = slice(start, stop)
    return Slice(x, tuple(key))
