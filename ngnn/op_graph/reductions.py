"""Reductions along axes, and softmax / log-softmax."""
import numpy as np

from .combiners import COMBINERS
from .op import Attr, Op, ShapeError, as_ops
from .work import Work, elements, nbytes


def normalize_axes(op_name, axis, ndim):
    axes = range(ndim) if axis is None else (axis,) if np.ndim(axis) == 0 else axis
    out = []
    for a in axes:
        if not -ndim <= int(a) < max(ndim, 1) or ndim == 0 and axis is not None:
            raise ShapeError(f"{op_name}: axis {a} is out of range for a tensor of "
                             f"{ndim} dimensions")
        out.append(int(a) % ndim if ndim else 0)
    if len(set(out)) != len(out):
        raise ShapeError(f"{op_name}: repeated axis in {axis}")
    return tuple(sorted(out))


class Reduction(Op):
    """A reduction over axes; `combiner` is its kind's row of the reduction table
    (ngnn/op_graph/combiners.py)."""
    combiner = None
    attributes = (Attr("axes", param="axis", batching="axes"), Attr("keepdims"))

    def __init__(self, x, axis=None, keepdims=False, name=None):
        (x,) = as_ops(x)
        self.axes = normalize_axes(type(self).__name__.lower(), axis, x.ndim)
        self.keepdims = bool(keepdims)
        shape = tuple(1 if i in self.axes else s for i, s in enumerate(x.shape)
                      if keepdims or i not in self.axes)
        dtype = x.dtype if x.dtype.kind == "f" or type(self) is not Mean else np.float32
        super().__init__([x], shape=shape, dtype=dtype, name=name)

    @property
    def numpy(self):
        return (f"np.{self.combiner.numpy_reduce}({{x}}, axis={self.axes}, keepdims={self.keepdims}, "
                "out={out})")

    def row_local(self, rows=()):
        return 0 not in self.axes

    @property
    def fusion_role(self):
        return "rows" if self.row_local() else None      # reduces within each row

    def kept(self, t):
        """`t` (shaped like the result) with the reduced axes as size-1 axes."""
        from .layout import Reshape
        shape = tuple(1 if i in self.axes else s for i, s in enumerate(self.args[0].shape))
        return t if t.shape == shape else Reshape(t, shape)

    def spread(self, t):
        """`t` (shaped like the result) broadcast back to the input's shape."""
        from .layout import Broadcast
        return Broadcast(self.kept(t), self.args[0].shape)


class Sum(Reduction):
    combiner = COMBINERS["sum"]
    EINSUM_LIMIT = 256

    @property
    def numpy(self):
        """np.sum over a short trailing axis (a per-head dot product's 8 features) runs
        several times slower than np.einsum, which accumulates straight through it; long
        reductions keep np.sum's pairwise summation for its accuracy."""
        x = self.args[0]
        trailing = self.axes == tuple(range(x.ndim - len(self.axes), x.ndim))
        count = int(np.prod([x.shape[a] for a in self.axes], dtype=np.int64))
        if not self.axes or not trailing or count > self.EINSUM_LIMIT or x.dtype.kind != "f":
            return super().numpy
        letters = "abcdefghijklmnopqrstuvwxyz"[:x.ndim]
        kept = "".join(c for i, c in enumerate(letters) if i not in self.axes)
        out = "{out}"
        if self.keepdims:       # write through a view without the trailing size-1 axes
            out = f"{{out}}.reshape({{out}}.shape[:{len(kept)}])"
        return f"np.einsum('{letters}->{kept}', {{x}}, out={out})"

    @property
    def work(self):
        """Sums along rows (trailing axes) or down columns, each a calibrated kernel; a
        whole tensor's sum is element-wise work."""
        x = self.args[0]
        if not (self.axes and x.ndim):
            return ()
        reduced = int(np.prod([x.shape[a] for a in self.axes], dtype=np.int64))
        others = elements(x) // max(reduced, 1)
        if self.axes == tuple(range(x.ndim - len(self.axes), x.ndim)):
            return (Work("row_sum", others, reduced, moved=nbytes(x)),)
        return (Work("column_sum", reduced, others, moved=nbytes(x)),)

    def adjoints(self, delta):
        return [self.spread(delta)]


class Mean(Reduction):
    combiner = COMBINERS["mean"]

    @property
    def count(self):
        return int(np.prod([self.args[0].shape[a] for a in self.axes], dtype=np.int64))

    def adjoints(self, delta):
        return [self.spread(delta / float(max(self.count, 1)))]


class Max(Reduction):
    """Ties share the gradient equally."""
    combiner = COMBINERS["max"]

    def adjoints(self, delta):
        from .elementwise import Equal
        x = self.args[0]
        hit = Equal(x, self.spread(self))
        ties = Sum(hit, axis=self.axes, keepdims=self.keepdims)
        return [self.spread(delta / ties) * hit]


class Min(Max):
    combiner = COMBINERS["min"]


class Softmax(Op):
    attributes = (Attr("axis", batching="axes"),)
    across_rows = "normalizes over the rows"

    def __init__(self, x, axis=-1, name=None):
        (x,) = as_ops(x)
        (self.axis,) = normalize_axes(type(self).__name__.lower(), axis, x.ndim)
        super().__init__([x], shape=x.shape,
                         dtype=x.dtype if x.dtype.kind == "f" else np.float32, name=name)

    @property
    def work(self):
        """K.log_softmax over the rows along its axis (a softmax: the same passes)."""
        if not self.ndim:
            return (Work("log_softmax", 1, 1, moved=2 * nbytes(self)),)
        row = self.shape[self.axis]
        return (Work("log_softmax", elements(self) // max(row, 1), row, moved=2 * nbytes(self)),)

    def adjoints(self, delta):
        total = Sum(delta * self, axis=self.axis, keepdims=True)
        return [self * (delta - total)]

    def row_local(self, rows=()):
        return self.axis != 0


class LogSoftmax(Softmax):
    def adjoints(self, delta):
        from .elementwise import Exp
        return [delta - Exp(self) * Sum(delta, axis=self.axis, keepdims=True)]
