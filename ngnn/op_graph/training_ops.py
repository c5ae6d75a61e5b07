"""Ops that training needs: dropout masks, one-hot labels, assignment to variables."""
import itertools

import numpy as np

from .op import Op, ShapeError, Variable, as_ops

_dropout_seeds = itertools.count(1)


class DropoutMask(Op):
    """keep / (1 - rate) with keep = (u >= rate), u uniform in [0, 1) drawn by Philox from
    (seed, call number * size + element index): the same mask on every backend, a new one on
    every call of a computation.

    `rows=(graph, attribute)` makes the mask rows of a larger one: row i is row
    `getattr(graph, attribute)[i]` of a mask of `total_rows` rows. A partition's local graph
    keys its vertex and edge masks by global ids this way, so every rank draws exactly the
    numbers one process draws for the same vertex or edge."""
    is_stateful = True

    def __init__(self, shape, rate, seed=None, dtype=np.float32, name=None, rows=None,
                 total_rows=None, scope=None):
        if not 0.0 <= rate < 1.0:
            raise ValueError(f"dropout: rate must be in [0, 1), got {rate}")
        self.rate = float(rate)
        self.seed = next(_dropout_seeds) if seed is None else int(seed)
        self.rows = rows
        super().__init__((), shape=shape, dtype=dtype, name=name, scope=scope)
        self.total_size = self.size if rows is None else \
            int(total_rows) * int(np.prod(self.shape[1:], dtype=np.int64))

    kind = "prim"

    def attrs(self):
        attrs = {"rate": self.rate, "seed": self.seed}
        if self.rows is not None:
            attrs["rows"] = self.rows[1]
        return attrs

    def adjoints(self, delta):
        return []


def dropout(x, rate, seed=None):
    (x,) = as_ops(x)
    if rate == 0:
        return x
    return x * DropoutMask(x.shape, rate, seed=seed, dtype=x.dtype)


class OneHot(Op):
    """(N,) integer class ids -> (N, C) floats; an id outside [0, C) is an error at run time."""

    def __init__(self, labels, num_classes, dtype=np.float32, name=None):
        (labels,) = as_ops(labels)
        if labels.dtype.kind not in "iu":
            raise ShapeError(f"one_hot: labels must be integers, got {labels.dtype}")
        self.num_classes = int(num_classes)
        super().__init__([labels], shape=labels.shape + (self.num_classes,), dtype=dtype,
                         name=name)

    def attrs(self):
        return {"num_classes": self.num_classes}

    def with_args(self, args, lead=0):
        return OneHot(*args, self.num_classes, self.dtype, name=self.name)

    def adjoints(self, delta):
        return [None]


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

    def adjoints(self, delta):
        raise ValueError("assign has no gradient: take gradients of the values, not of the "
                         "assignments")
