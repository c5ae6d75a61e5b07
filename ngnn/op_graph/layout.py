"""Ops that move or view data: reshape, transpose, broadcast, concat, slicing."""
import numpy as np

from .op import Attr, Op, ShapeError, as_ops


class LayoutOp(Op):
    kind = "layout"


class Reshape(LayoutOp):
    attributes = (Attr("shape", batching="shape"),)
    is_view = True
    across_rows = "reshapes across rows"
    fusion_role = "rows"

    def __init__(self, x, shape, name=None):
        (x,) = as_ops(x)
        shape = tuple(int(s) for s in ((shape,) if np.ndim(shape) == 0 else shape))
        if shape.count(-1) > 1:
            raise ShapeError(f"reshape: at most one -1 in {shape}")
        if -1 in shape:
            known = int(np.prod([s for s in shape if s != -1], dtype=np.int64))
            if known == 0 or x.size % known:
                raise ShapeError(f"reshape: cannot reshape {x.shape} into {shape}")
            shape = tuple(x.size // known if s == -1 else s for s in shape)
        if int(np.prod(shape, dtype=np.int64)) != x.size:
            raise ShapeError(f"reshape: cannot reshape {x.shape} ({x.size} elements) into "
                             f"{shape}")
        super().__init__([x], shape=shape, dtype=x.dtype, name=name)

    numpy = "{out} = {x}.reshape({shape})"

    def adjoints(self, delta):
        return [Reshape(delta, self.args[0].shape)]

    def row_local(self, rows=()):
        return self.shape[:1] == self.args[0].shape[:1]


class Transpose(LayoutOp):
    attributes = (Attr("axes", batching="permutation"),)
    is_view = True

    def __init__(self, x, axes=None, name=None):
        (x,) = as_ops(x)
        axes = tuple(reversed(range(x.ndim))) if axes is None else tuple(int(a) % max(x.ndim, 1)
                                                                          for a in axes)
        if sorted(axes) != list(range(x.ndim)):
            raise ShapeError(f"transpose: axes {axes} are not a permutation of the "
                             f"{x.ndim} axes of {x.shape}")
        self.axes = axes
        super().__init__([x], shape=tuple(x.shape[a] for a in axes), dtype=x.dtype, name=name)

    numpy = "{out} = {x}.transpose({axes})"

    def adjoints(self, delta):
        return [Transpose(delta, tuple(np.argsort(self.axes)))]

    def row_local(self, rows=()):
        return self.axes[0] == 0


class Broadcast(LayoutOp):
    """A read-only view of `x` repeated to `shape` (NumPy broadcasting)."""
    attributes = (Attr("shape", batching="shape"),)
    is_view = True
    broadcasts = True
    fusion_role = "rows"

    def __init__(self, x, shape, name=None):
        (x,) = as_ops(x)
        shape = tuple(int(s) for s in shape)
        try:
            if np.broadcast_shapes(x.shape, shape) != shape:
                raise ValueError
        except ValueError:
            raise ShapeError(f"broadcast: cannot broadcast {x.shape} to {shape}") from None
        super().__init__([x], shape=shape, dtype=x.dtype, name=name)

    numpy = "{out} = np.broadcast_to({x}, {shape})"

    def adjoints(self, delta):
        from .elementwise import unbroadcast
        return [unbroadcast(delta, self.args[0].shape)]

    def row_local(self, rows=(False,)):
        """Row-local where x has the rows (else it repeats a value along them)."""
        return rows[0]


class Concat(LayoutOp):
    attributes = (Attr("axis", batching="axes"),)
    across_rows = "concatenates rows"

    def __init__(self, *xs, axis=0, name=None):
        xs = as_ops(*xs)
        if not xs:
            raise ShapeError("concat: needs at least one tensor")
        ndim = xs[0].ndim
        if ndim == 0:
            raise ShapeError("concat: cannot concatenate scalars")
        self.axis = int(axis) % ndim
        for x in xs:
            if x.ndim != ndim or any(a != b for i, (a, b) in enumerate(zip(x.shape, xs[0].shape))
                                     if i != self.axis):
                raise ShapeError(f"concat: shapes {xs[0].shape} and {x.shape} differ outside "
                                 f"axis {self.axis}")
        shape = list(xs[0].shape)
        shape[self.axis] = sum(x.shape[self.axis] for x in xs)
        from .elementwise import result_dtype
        super().__init__(xs, shape=shape, dtype=result_dtype("concat", *xs), name=name)

    def adjoints(self, delta):
        grads, start = [], 0
        for x in self.args:
            index = [slice(None)] * self.ndim
            index[self.axis] = slice(start, start + x.shape[self.axis])
            grads.append(Slice(delta, tuple(index)))
            start += x.shape[self.axis]
        return grads

    def row_local(self, rows=()):
        return self.axis != 0


def _normalize_index(shape, key):
    """Basic indexing only: ints and slices, optionally with one Ellipsis. The result is
    normalized: non-negative ints and starts, a stop of None only where a reversed slice runs
    past index 0, empty slices as 0:0; normalizing a normalized key changes nothing, which
    is what lets operation batching rebuild a Slice from its own key."""
    key = key if isinstance(key, tuple) else (key,)
    if sum(k is Ellipsis for k in key) > 1:
        raise ShapeError("slice: at most one Ellipsis")
    if Ellipsis in key:
        i = key.index(Ellipsis)
        key = key[:i] + (slice(None),) * (len(shape) - len(key) + 1) + key[i + 1:]
    if len(key) > len(shape):
        raise ShapeError(f"slice: too many indices {key} for shape {shape}")
    key = key + (slice(None),) * (len(shape) - len(key))
    out = []
    for k, n in zip(key, shape):
        if isinstance(k, (int, np.integer)):
            if not -n <= k < n:
                raise ShapeError(f"slice: index {k} is out of range for an axis of size {n}")
            out.append(int(k) % n)
        elif isinstance(k, slice):
            start, stop, step = k.indices(n)
            if not len(range(start, stop, step)):
                out.append(slice(0, 0, 1))
            else:
                out.append(slice(start, None if stop < 0 else stop, step))
        else:
            raise ShapeError(f"slice: only ints and slices are supported, got {k!r}")
    return tuple(out)


def slice_length(k):
    """Elements a normalized slice takes."""
    return len(range(k.start, -1 if k.stop is None else k.stop, k.step))


class Slice(LayoutOp):
    """x[key], for a basic index key (ints and slices)."""
    attributes = (Attr("key", batching="index"),)
    is_view = True
    across_rows = "slices the rows"

    def __init__(self, x, key, name=None):
        (x,) = as_ops(x)
        self.key = _normalize_index(x.shape, key)
        shape = tuple(slice_length(k) for k in self.key if isinstance(k, slice))
        super().__init__([x], shape=shape, dtype=x.dtype, name=name)

    numpy = "{out} = {x}[{key}]"

    def adjoints(self, delta):
        return [Unslice(delta, self.args[0].shape, self.key)]

    def row_local(self, rows=()):
        return self.key[0] == slice(0, self.args[0].shape[0], 1)


class Unslice(LayoutOp):
    """Zeros of `shape` with `x` written at `key`, a normalized key of a Slice: the adjoint
    of a slice."""
    attributes = (Attr("shape", batching="shape"), Attr("key", batching="index"))
    across_rows = "slices the rows"

    def __init__(self, x, shape, key, name=None):
        (x,) = as_ops(x)
        self.key = tuple(key)
        super().__init__([x], shape=shape, dtype=x.dtype, name=name)

    numpy = "{out}.fill(0)\n{out}[{key}] = {x}"

    def adjoints(self, delta):
        return [Slice(delta, self.key)]

    def row_local(self, rows=()):
        return self.key[0] == slice(0, self.shape[0], 1)


def format_index(key):
    def one(k):
        if isinstance(k, int):
            return str(k)
        step = "" if k.step == 1 else f":{k.step}"
        stop = "" if k.stop is None else k.stop      # a reversed slice running past index 0
        return f"{k.start}:{stop}{step}"
    return ", ".join(one(k) for k in key)


def reshape_to(x, shape):
    return x if x.shape == tuple(shape) else Reshape(x, shape)


def slice_op(x, key):
    return Slice(x, key)
