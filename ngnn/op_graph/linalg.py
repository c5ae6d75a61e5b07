"""Matrix products (NumPy's matmul semantics, batched over leading axes)."""
import numpy as np

from .op import Attr, Op, ShapeError, as_ops
from .work import Work, elements, nbytes


class Dot(Op):
    def __new__(cls, a, b, name=None):
        if cls is Dot and isinstance(a, Op) and a.is_sparse:
            from .sparse import SparseDot
            return SparseDot(a, b, name=name)
        return super().__new__(cls)

    def __init__(self, a, b, name=None):
        a, b = as_ops(a, b)
        if a.ndim == 0 or b.ndim == 0:
            raise ShapeError(f"dot: operands must have at least one axis, got {a.shape} "
                             f"and {b.shape}")
        k_a = a.shape[-1]
        k_b = b.shape[-2] if b.ndim > 1 else b.shape[0]
        if k_a != k_b:
            raise ShapeError(f"dot: shapes {a.shape} and {b.shape} are not aligned "
                             f"({k_a} != {k_b})")
        try:
            batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
        except ValueError:
            raise ShapeError(f"dot: batch axes of {a.shape} and {b.shape} do not "
                             "broadcast") from None
        shape = batch + a.shape[-2:-1] + b.shape[-1:] if b.ndim > 1 else batch + a.shape[-2:-1]
        from .elementwise import result_dtype
        super().__init__([a, b], shape=shape, dtype=result_dtype("dot", a, b), name=name)

    numpy = "np.matmul({x}, {y}, out={out})"

    @property
    def work(self):
        return blas_product(self)

    def row_local(self, rows=(True, True)):
        """rows @ W, W without rows: row i of the result reads row i of a matrix."""
        return not rows[1] and self.args[0].ndim == 2

    def adjoints(self, delta):
        from .elementwise import unbroadcast
        from .layout import reshape_to
        a, b = self.args
        # Promote vectors to matrices so one rule covers every case, then undo.
        a2 = reshape_to(a, (1,) + a.shape) if a.ndim == 1 else a
        b2 = reshape_to(b, b.shape + (1,)) if b.ndim == 1 else b
        out2 = np.broadcast_shapes(a2.shape[:-2], b2.shape[:-2]) + (a2.shape[-2], b2.shape[-1])
        d2 = reshape_to(delta, out2)
        da = unbroadcast(Dot(d2, swap_last(b2)), a2.shape)
        db = unbroadcast(Dot(swap_last(a2), d2), b2.shape)
        return [reshape_to(da, a.shape), reshape_to(db, b.shape)]


def blas_product(op):
    """A BLAS product's work: its flops and bytes, and for a 2-D product the calibrated
    curve of its narrow sizes: (rows, inner) @ (inner, outer) per row ("matmul"), or, with
    fewer rows than inner, the weight gradient's (inner, rows) @ (rows, outer) per row of
    the long axis ("matmul_t")."""
    a, b = op.args[:2]
    inner = a.shape[-1] if a.ndim else 1
    flops = 2 * elements(op) * inner
    moved = nbytes(a) + nbytes(b) + nbytes(op)
    if a.ndim == b.ndim == 2:
        (m, k), n = a.shape, b.shape[1]
        if m >= k:
            return (Work("matmul", m, n, k, moved, flops),)
        return (Work("matmul_t", k, n, m, moved, flops),)
    return (Work("matmul", moved=moved, flops=flops),)


def swap_last(x):
    from .layout import Transpose
    axes = tuple(range(x.ndim - 2)) + (x.ndim - 1, x.ndim - 2)
    return Transpose(x, axes)


class ZeroRowDot(Op):
    """The matrix product a @ b of 2-D operands, given that past the first `live` rows
    ((1,) tensor, read at run time) the rows of a (`contract=False`) or the rows of b, the
    contracted axis (`contract=True`), are 0: the same value as Dot(a, b), computed from
    the live rows only. Of a batch in a GraphLoader slot, a fifth of the rows is padding
    that batch norm zeroes; ngnn.passes.ZeroRowProducts puts this op where it finds them.

    contract=False: out[:n] = a[:n] @ b, out[n:] = 0 (a zero row gives a zero row).
    contract=True:  out = a[:, :n] @ b[:n] (zero terms add nothing)."""
    attributes = (Attr("contract"),)
    numpy = "K.zero_row_matmul({xs}, contract={contract}, out={out})"

    def __init__(self, a, b, live, contract=False, name=None):
        a, b, live = as_ops(a, b, live)
        if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
            raise ShapeError(f"zero_row_dot: expected aligned matrices, got {a.shape} and "
                             f"{b.shape}")
        if live.shape != (1,):
            raise ShapeError(f"zero_row_dot: live must be a (1,) tensor, got {live.shape}")
        self.contract = bool(contract)
        from .elementwise import result_dtype
        super().__init__([a, b, live], shape=(a.shape[0], b.shape[1]),
                         dtype=result_dtype("dot", a, b), name=name)

    @property
    def work(self):
        """Priced whole: its live rows are known only at run time."""
        return blas_product(self)

    def adjoints(self, delta):
        a, b, _ = self.args
        return Dot(a, b).adjoints(delta) + [None]

    def decomposition(self):
        a, b, _ = self.args
        return Dot(a, b)
