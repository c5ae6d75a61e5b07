"""Ops that training needs: dropout masks, one-hot labels, assignment to variables."""
import itertools

import numpy as np

from .op import Attr, Op, ShapeError, Variable, as_ops

_dropout_seeds = itertools.count(1)


class DropoutMask(Op):
    """keep / (1 - rate) with keep = (u >= rate), u uniform in [0, 1) drawn by Philox from
    (seed, call number * size + element index): the same mask on every backend, a new one on
    every call of a computation."""
    is_stateful = True
    attributes = (Attr("shape", batching="shape", printed=False), Attr("rate"), Attr("seed"),
                  Attr("dtype", printed=False))

    def __init__(self, shape, rate, seed=None, dtype=np.float32, name=None):
        if not 0.0 <= rate < 1.0:
            raise ValueError(f"dropout: rate must be in [0, 1), got {rate}")
        self.rate = float(rate)
        self.seed = next(_dropout_seeds) if seed is None else int(seed)
        super().__init__((), shape=shape, dtype=dtype, name=name)

    kind = "prim"

    def adjoints(self, delta):
        return []


def dropout(x, rate, seed=None):
    (x,) = as_ops(x)
    if rate == 0:
        return x
    return x * DropoutMask(x.shape, rate, seed=seed, dtype=x.dtype)


class OneHot(Op):
    """(N,) integer class ids -> (N, C) floats; an id outside [0, C) is an error at run time."""
    attributes = (Attr("num_classes"), Attr("dtype", printed=False))

    def __init__(self, labels, num_classes, dtype=np.float32, name=None):
        (labels,) = as_ops(labels)
        if labels.dtype.kind not in "iu":
            raise ShapeError(f"one_hot: labels must be integers, got {labels.dtype}")
        self.num_classes = int(num_classes)
        super().__init__([labels], shape=labels.shape + (self.num_classes,), dtype=dtype,
                         name=name)

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
