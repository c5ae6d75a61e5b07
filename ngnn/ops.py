"""The functional API: `ng.exp(x)`, `ng.sum(x, axis=1)`, `ng.cross_entropy(...)`, ..."""
import numpy as np

from .op_graph import (Abs, Assign, Cast, Concat, Dot, Elu, Equal, Exp, LeakyRelu, Log, LogSoftmax,
                       Max, Maximum, Mean, Min, Minimum, OneHot, Relu, Reshape, Sigmoid, Slice,
                       Softmax, Softplus, Sqrt, StopGradient, Sum, Tanh, Transpose, as_ops,
                       constant)
from .op_graph.graph_ops import aggregate, edge_softmax, gather  # noqa: F401 (re-exported)
from .op_graph.training_ops import dropout  # noqa: F401 (re-exported)


def dot(a, b):
    return Dot(a, b)


def exp(x): return Exp(x)
def log(x): return Log(x)
def sqrt(x): return Sqrt(x)
def tanh(x): return Tanh(x)
def sigmoid(x): return Sigmoid(x)
def softplus(x): return Softplus(x)
def relu(x): return Relu(x)
def elu(x): return Elu(x)
def abs(x): return Abs(x)  # noqa: A001 (mirrors numpy's name)
def leaky_relu(x, alpha=0.2): return LeakyRelu(x, alpha=alpha)
def maximum(x, y): return Maximum(x, y)
def minimum(x, y): return Minimum(x, y)
def softmax(x, axis=-1): return Softmax(x, axis=axis)
def log_softmax(x, axis=-1): return LogSoftmax(x, axis=axis)
def reshape(x, shape): return Reshape(x, shape)
def transpose(x, axes=None): return Transpose(x, axes)
def concat(xs, axis=0): return Concat(*xs, axis=axis)
def assign(variable, value): return Assign(variable, value)
def cast(x, dtype): return Cast(x, dtype)
def equal(x, y): return Equal(x, y)
def stop_gradient(x): return StopGradient(x)


def slice(x, key):  # noqa: A001 (the API name)
    return Slice(x, key)


def _reduce(cls, reduce, x, axis, keepdims):
    if isinstance(x, (list, tuple)):
        from .frontend import reduce_neighbours
        return reduce_neighbours(x, reduce)
    return cls(x, axis=axis, keepdims=keepdims)


def sum(x, axis=None, keepdims=False):  # noqa: A001
    """Sum along axes; over a neighbour list inside ng.zoomIn, a sum aggregation."""
    return _reduce(Sum, "sum", x, axis, keepdims)


def mean(x, axis=None, keepdims=False):
    return _reduce(Mean, "mean", x, axis, keepdims)


def max(x, axis=None, keepdims=False):  # noqa: A001
    return _reduce(Max, "max", x, axis, keepdims)


def min(x, axis=None, keepdims=False):  # noqa: A001
    return _reduce(Min, "min", x, axis, keepdims)


def one_hot(labels, num_classes, dtype=np.float32):
    return OneHot(labels, num_classes, dtype=dtype)


def cross_entropy(logits, labels, mask=None, count=None):
    """Mean over rows (over the rows where `mask` is true) of -log softmax(logits)[label].
    `count`, with a mask, divides the masked sum by that many rows instead: a partition's
    share of the whole graph's mean (ngnn.distributed)."""
    logits, labels = as_ops(logits, labels)
    if logits.ndim != 2 or labels.shape != logits.shape[:1]:
        from .op_graph import ShapeError
        raise ShapeError(f"cross_entropy: logits must be (rows, classes) and labels (rows,), "
                         f"got {logits.shape} and {labels.shape}")
    picked = Sum(LogSoftmax(logits, axis=-1) * OneHot(labels, logits.shape[1],
                                                       dtype=logits.dtype), axis=-1)
    if mask is None:
        return -Mean(picked)
    (mask,) = as_ops(mask)
    if mask.shape != labels.shape:
        from .op_graph import ShapeError
        raise ShapeError(f"cross_entropy: mask shape {mask.shape} differs from labels shape "
                         f"{labels.shape}")
    weight = Cast(mask, logits.dtype)
    rows = Maximum(Sum(weight), 1.0) if count is None else constant(float(count),
                                                                      dtype=logits.dtype)
    return -Sum(picked * weight) / rows


def binary_cross_entropy_with_logits(logits, labels, mask=None):
    """Mean over elements (over those where `mask` is true) of
    -(y log sigmoid(x) + (1 - y) log(1 - sigmoid(x))) for logits x and labels y in [0, 1],
    written softplus(x) - x y: finite for any logit, with gradient sigmoid(x) - y."""
    logits, labels = as_ops(logits, labels)
    if labels.shape != logits.shape:
        from .op_graph import ShapeError
        raise ShapeError(f"binary_cross_entropy_with_logits: labels shape {labels.shape} "
                         f"differs from logits shape {logits.shape}")
    if logits.dtype.kind != "f":
        from .op_graph import ShapeError
        raise ShapeError(f"binary_cross_entropy_with_logits: logits must be floats, got "
                         f"{logits.dtype}")
    losses = Softplus(logits) - logits * Cast(labels, logits.dtype)
    if mask is None:
        return Mean(losses)
    (mask,) = as_ops(mask)
    if mask.shape != logits.shape:
        from .op_graph import ShapeError
        raise ShapeError(f"binary_cross_entropy_with_logits: mask shape {mask.shape} differs "
                         f"from logits shape {logits.shape}")
    weight = Cast(mask, logits.dtype)
    return Sum(losses * weight) / Maximum(Sum(weight), 1.0)
