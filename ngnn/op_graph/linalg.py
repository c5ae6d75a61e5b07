"""Matrix products (NumPy's matmul semantics, batched over leading axes)."""
import numpy as np

from .op import Op, ShapeError, as_ops


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


def swap_last(x):
    from .layout import Transpose
    axes = tuple(range(x.ndim - 2)) + (x.ndim - 1, x.ndim - 2)
    return Transpose(x, axes)
