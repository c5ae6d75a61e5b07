"""Ops that training needs: dropout, one-hot labels, assignment to variables."""
import numpy as np

from ngnn.random import keys, next_seed

from .elementwise import ElementWise
from .op import Attr, Op, ShapeError, Variable, as_ops, ordered_ops
from .work import Work, elements, nbytes


def dropout_seed(seed):
    """A dropout's Philox key: the one given (an int in [0, 2**64)), else the next key of
    the stream ng.manual_seed restarts (ngnn/random.py)."""
    if seed is None:
        return next_seed()
    if not isinstance(seed, (int, np.integer)) or not 0 <= seed < 2 ** 64:
        raise ValueError(f"dropout: seed must be an int in [0, 2**64), got {seed!r}")
    return int(seed)


class Dropout(ElementWise):
    """x * keep / (1 - rate), where keep is a random bit drawn by Philox (ngnn/philox.py)
    from (seed, call number, the element's row-major position): the same mask on every
    backend, a new one on every call. The mask is a pure function of those, so it is never
    stored: the gradient is a dropout of the incoming gradient with the same seed, which
    draws the same mask again.

    `rows=(graph, attribute)` keys the rows by ids: element (i, j) of an (N, F) tensor takes
    position `getattr(graph, attribute)[i] * F + j`. A partition's local graph keys vertex
    and edge tensors by their global ids this way, so every rank draws exactly the mask one
    process draws for the same vertex or edge."""
    is_stateful = True
    positional = True
    attributes = (Attr("rate"), Attr("seed"), Attr("rows"))

    def __init__(self, x, rate, seed=None, name=None, rows=None):
        (x,) = as_ops(x)
        self.rows = rows
        if not 0.0 <= rate < 1.0:
            raise ValueError(f"dropout: rate must be in [0, 1), got {rate}")
        if x.dtype.kind != "f":
            raise ShapeError(f"dropout: needs a float tensor, got {x.dtype}")
        self.rate = float(rate)
        self.seed = dropout_seed(seed)
        super().__init__([x], shape=x.shape, dtype=x.dtype, name=name)

    @property
    def work(self):
        """A random draw and a masked scale per element; keyed by ids, the keep bits as
        `kernels.dropout_keep_rows` draws them, then the scale."""
        kernel = "dropout" if self.rows is None else "keyed_dropout"
        return (Work(kernel, elements(self), moved=2 * nbytes(self)),)

    def adjoints(self, delta):
        return [Dropout(delta, self.rate, seed=self.seed, rows=self.rows)]


def dropout(x, rate, seed=None):
    """Dropout of a dense tensor, or of the stored values of a sparse one (the values the
    dense dropout keeps at the same positions)."""
    (x,) = as_ops(x)
    if rate == 0:
        return x
    if x.is_sparse:
        from .sparse import SparseDropout
        return SparseDropout(x, rate, seed=seed)
    return Dropout(x, rate, seed=seed)


def seed_dropout(results, seed):
    """Gives every dropout mask the results depend on (dense or sparse: the ops that keep a
    `seed`) a seed derived from `seed` and its position in the graph, so a run is
    reproducible whatever was built before it."""
    masks = [op for op in ordered_ops(results) if any(a.field == "seed" for a in op.attributes)]
    # A dropout in the backward pass shares its forward dropout's seed (that is how it
    # draws the same mask), so seeds are renamed, not handed out per op.
    old = list(dict.fromkeys(op.seed for op in masks))
    new = {s: int(key) for s, key in zip(old, keys(seed, len(old)))}
    for op in masks:
        op.seed = new[op.seed]


class OneHot(Op):
    """(N,) integer class ids -> (N, C) floats; an id outside [0, C) is an error at run time."""
    attributes = (Attr("num_classes"), Attr("dtype", printed=False))
    numpy_calls = ("np.equal",)      # the ids against each class (K.one_hot)
    inlinable = True

    def __init__(self, labels, num_classes, dtype=np.float32, name=None):
        (labels,) = as_ops(labels)
        if labels.dtype.kind not in "iu":
            raise ShapeError(f"one_hot: labels must be integers, got {labels.dtype}")
        self.num_classes = int(num_classes)
        super().__init__([labels], shape=labels.shape + (self.num_classes,), dtype=dtype,
                         name=name)

    def adjoints(self, delta):
        return [None]

    def row_local(self, rows=()):
        return True


class Assign(Op):
    """Writes `value` to `variable` after every other result of the call is computed; the
    result is the new value."""
    is_stateful = True

    def __init__(self, variable, value, name=None):
        if not isinstance(variable, Variable):
            raise TypeError(f"assign: the target must be an ng.variable, got {variable!r}")
        (value,) = as_ops(value)
        if value.shape != variable.shape:
            try:
                if np.broadcast_shapes(value.shape, variable.shape) != variable.shape:
                    raise ValueError
            except ValueError:
                raise ShapeError(f"assign: value of shape {value.shape} does not fit variable "
                                 f"{variable.name or ''} of shape {variable.shape}") from None
            from .layout import Broadcast
            value = Broadcast(value, variable.shape)
        if value.dtype != variable.dtype:
            from .elementwise import Cast
            value = Cast(value, variable.dtype)
        super().__init__([variable, value], shape=variable.shape, dtype=variable.dtype,
                         name=name)

    kind = "prim"

    @property
    def work(self):
        """A copy of the value into the variable."""
        return (Work("pass", 0, moved=2 * nbytes(self.args[-1])),)

    def adjoints(self, delta):
        raise ValueError("assign has no gradient: take gradients of the values, not of the "
                         "assignments")
