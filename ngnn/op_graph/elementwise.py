"""Element-wise ops: shape and dtype rules, gradient, NumPy statement and C expression.

Each op is one small class; the table-like class attributes `numpy` and `c` are the
kernel snippets every backend renders, and `numpy_calls` the NumPy functions its statement
calls, each a pass over its elements (what the simulator prices it by), so adding an
element-wise op touches this file only.
"""
import numpy as np

from .op import Attr, Op, ShapeError, as_ops, constant


def broadcast_shape(op_name, *shapes):
    try:
        return np.broadcast_shapes(*shapes)
    except ValueError:
        raise ShapeError(f"{op_name}: shapes {' and '.join(map(str, shapes))} do not "
                         "broadcast together") from None


def result_dtype(op_name, *ops):
    dtypes = [a.dtype for a in ops]
    if any(d.kind not in "biuf" for d in dtypes):
        raise ShapeError(f"{op_name}: unsupported dtypes {[str(d) for d in dtypes]}")
    return np.result_type(*dtypes)


def unbroadcast(delta, shape):
    """Undo broadcasting in an adjoint: sum `delta` down to `shape`."""
    if delta.shape == tuple(shape):
        return delta
    from .reductions import Sum
    from .layout import reshape_to
    lead = delta.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(lead + i for i, s in enumerate(shape)
                                      if s == 1 and delta.shape[lead + i] != 1)
    return reshape_to(Sum(delta, axis=axes), shape)


class ElementWise(Op):
    """One output element from the same-index elements of the inputs (broadcast)."""
    elementwise = True
    broadcasts = True
    fusion_role = "rows"


class UnaryOp(ElementWise):
    float_only = True

    def __init__(self, x, name=None):
        (x,) = as_ops(x)
        dtype = x.dtype
        if self.float_only and dtype.kind != "f":
            dtype = np.dtype(np.float32)
        super().__init__([x], shape=x.shape, dtype=dtype, name=name)


class BinaryOp(ElementWise):
    def __init__(self, x, y, name=None):
        x, y = as_ops(x, y)
        op_name = type(self).__name__
        super().__init__([x, y], shape=broadcast_shape(op_name, x.shape, y.shape),
                         dtype=self.out_dtype(result_dtype(op_name, x, y)), name=name)

    def out_dtype(self, dtype):
        return dtype


# ---- arithmetic ---------------------------------------------------------------------------

class Add(BinaryOp):
    numpy = "np.add({x}, {y}, out={out})"
    numpy_calls = ("np.add",)
    c = "({x} + {y})"

    def adjoints(self, delta):
        x, y = self.args
        return [unbroadcast(delta, x.shape), unbroadcast(delta, y.shape)]


class Subtract(BinaryOp):
    numpy = "np.subtract({x}, {y}, out={out})"
    numpy_calls = ("np.subtract",)
    c = "({x} - {y})"

    def adjoints(self, delta):
        x, y = self.args
        return [unbroadcast(delta, x.shape), unbroadcast(-delta, y.shape)]


class Multiply(BinaryOp):
    numpy = "np.multiply({x}, {y}, out={out})"
    numpy_calls = ("np.multiply",)
    c = "({x} * {y})"

    def adjoints(self, delta):
        x, y = self.args
        return [unbroadcast(delta * y, x.shape), unbroadcast(delta * x, y.shape)]


class Divide(BinaryOp):
    numpy = "np.divide({x}, {y}, out={out})"
    numpy_calls = ("np.divide",)
    c = "({x} / {y})"

    def out_dtype(self, dtype):
        return dtype if dtype.kind == "f" else np.dtype(np.float32)

    def adjoints(self, delta):
        x, y = self.args
        return [unbroadcast(delta / y, x.shape), unbroadcast(-delta * self / y, y.shape)]


class Power(BinaryOp):
    numpy = "np.power({x}, {y}, out={out})"
    numpy_calls = ("np.power",)
    c = "pow({x}, {y})"

    def adjoints(self, delta):
        x, y = self.args
        dx = delta * y * Power(x, y - 1.0)
        dy = None if y.is_constant else unbroadcast(delta * self * Log(x), y.shape)
        return [unbroadcast(dx, x.shape), dy]


class Maximum(BinaryOp):
    """Ties send the gradient to the first argument."""
    numpy = "np.maximum({x}, {y}, out={out})"
    numpy_calls = ("np.maximum",)
    # Not C's fmax, which drops NaN: NaN in either argument gives NaN, as in NumPy.
    c = "(((({x}) > ({y})) | (({x}) != ({x}))) ? ({x}) : ({y}))"

    def adjoints(self, delta):
        x, y = self.args
        first = GreaterEqual(x, y)
        return [unbroadcast(delta * first, x.shape),
                unbroadcast(delta * (1.0 - first), y.shape)]


class Minimum(BinaryOp):
    """Ties send the gradient to the first argument."""
    numpy = "np.minimum({x}, {y}, out={out})"
    numpy_calls = ("np.minimum",)
    c = "(((({x}) < ({y})) | (({x}) != ({x}))) ? ({x}) : ({y}))"

    def adjoints(self, delta):
        x, y = self.args
        first = LessEqual(x, y)
        return [unbroadcast(delta * first, x.shape),
                unbroadcast(delta * (1.0 - first), y.shape)]


# ---- comparisons: 1.0 where true, 0.0 elsewhere, in the arguments' float dtype -------------

class Comparison(BinaryOp):
    def out_dtype(self, dtype):
        return dtype if dtype.kind == "f" else np.dtype(np.float32)

    def adjoints(self, delta):
        return [None, None]


class Greater(Comparison):
    numpy = "np.greater({x}, {y}, out={out})"
    numpy_calls = ("np.greater",)
    c = "(({x} > {y}) ? 1.0f : 0.0f)"


class GreaterEqual(Comparison):
    numpy = "np.greater_equal({x}, {y}, out={out})"
    numpy_calls = ("np.greater_equal",)
    c = "(({x} >= {y}) ? 1.0f : 0.0f)"


class LessEqual(Comparison):
    numpy = "np.less_equal({x}, {y}, out={out})"
    numpy_calls = ("np.less_equal",)
    c = "(({x} <= {y}) ? 1.0f : 0.0f)"


class Equal(Comparison):
    numpy = "np.equal({x}, {y}, out={out})"
    numpy_calls = ("np.equal",)
    c = "(({x} == {y}) ? 1.0f : 0.0f)"


# ---- unary ----------------------------------------------------------------------------------

class Negative(UnaryOp):
    float_only = False
    numpy = "np.negative({x}, out={out})"
    numpy_calls = ("np.negative",)
    c = "(-{x})"

    def adjoints(self, delta):
        return [-delta]


class Exp(UnaryOp):
    numpy = "np.exp({x}, out={out})"
    numpy_calls = ("np.exp",)
    c = "exp({x})"

    def adjoints(self, delta):
        return [delta * self]


class Log(UnaryOp):
    numpy = "np.log({x}, out={out})"
    numpy_calls = ("np.log",)
    c = "log({x})"

    def adjoints(self, delta):
        return [delta / self.args[0]]


class Sqrt(UnaryOp):
    numpy = "np.sqrt({x}, out={out})"
    numpy_calls = ("np.sqrt",)
    c = "sqrt({x})"

    def adjoints(self, delta):
        return [delta / (2.0 * self)]


class Tanh(UnaryOp):
    numpy = "np.tanh({x}, out={out})"
    numpy_calls = ("np.tanh",)
    c = "tanh({x})"

    def adjoints(self, delta):
        return [delta * (1.0 - self * self)]


class Sigmoid(UnaryOp):
    numpy = "scipy.special.expit({x}, out={out})"
    numpy_calls = ("scipy.special.expit",)
    c = "(1.0f / (1.0f + exp(-{x})))"

    def adjoints(self, delta):
        return [delta * self * (1.0 - self)]


class Softplus(UnaryOp):
    """log(1 + exp(x)), without overflow for large x or lost digits for very negative x:
    the stable form of a binary cross-entropy's log-sigmoid terms (log sigmoid(x) is
    -softplus(-x)). Its derivative is sigmoid(x), also where x is 0, which a composition of
    relu and abs would get wrong there."""
    numpy = "np.logaddexp({x}, 0.0, out={out})"
    numpy_calls = ("np.logaddexp",)
    # NaN stays NaN: fmax drops it but the log1p term keeps it.
    c = "(fmax({x}, 0.0f) + log1p(exp(-fabs({x}))))"

    def adjoints(self, delta):
        return [delta * Sigmoid(self.args[0])]


class Relu(UnaryOp):
    numpy = "K.relu({x}, out={out})"
    c = "(((({x}) > 0.0f) | (({x}) != ({x}))) ? ({x}) : 0.0f)"

    def adjoints(self, delta):
        return [delta * Greater(self.args[0], 0.0)]


class Abs(UnaryOp):
    float_only = False
    numpy = "np.absolute({x}, out={out})"
    numpy_calls = ("np.absolute",)
    c = "fabs({x})"

    def adjoints(self, delta):
        return [delta * Sign(self.args[0])]


class Sign(UnaryOp):
    numpy = "np.sign({x}, out={out})"
    numpy_calls = ("np.sign",)
    c = "(({x} > 0.0f) - ({x} < 0.0f))"

    def adjoints(self, delta):
        return [None]


class LeakyRelu(UnaryOp):
    attributes = (Attr("alpha"),)

    # max(x, a*x) is leaky relu for 0 <= a <= 1, min(x, a*x) for a > 1: one ufunc, no mask.
    def __init__(self, x, alpha=0.2, name=None):
        self.alpha = float(alpha)
        if self.alpha < 0:
            raise ShapeError(f"leaky_relu: alpha must be >= 0, got {alpha}")
        super().__init__(x, name=name)

    @property
    def numpy(self):
        pick = "maximum" if self.alpha <= 1 else "minimum"
        return f"np.{pick}({{x}}, {{x}} * {self.alpha!r}, out={{out}})"

    @property
    def numpy_calls(self):
        return ("np.maximum" if self.alpha <= 1 else "np.minimum",)

    c = "(({x} > 0.0f) ? {x} : {alpha} * {x})"

    def adjoints(self, delta):
        return [delta * (Greater(self.args[0], 0.0) * (1.0 - self.alpha) + self.alpha)]


class Elu(UnaryOp):
    # In place in `out` (which may be x's own buffer): np.where's form made four
    # temporaries the size of x, fresh pages on every call (GAT's first layer at R-MAT
    # 500K: 373 ms a training step, 209 ms in place).
    numpy = "np.copyto({out}, {x})\nnp.expm1({out}, out={out}, where={out} < 0)"
    # where={out} < 0: a comparison, at np.greater's calibrated cost
    numpy_calls = ("np.copyto", "np.expm1", "np.greater")
    c = "(({x} > 0.0f) ? {x} : (exp({x}) - 1.0f))"

    def adjoints(self, delta):
        x = self.args[0]
        positive = Greater(x, 0.0)
        return [delta * (positive + (1.0 - positive) * (self + 1.0))]


class Cast(UnaryOp):
    """Converts dtype (bool masks and integer ids to floats, for instance)."""
    float_only = False
    numpy = "np.copyto({out}, {x}, casting='unsafe')"
    numpy_calls = ("np.copyto",)
    attributes = (Attr("to", param="dtype"),)

    def __init__(self, x, dtype, name=None):
        self.to = np.dtype(dtype)
        super().__init__(x, name=name)
        self.dtype = self.to

    c = "(({out_ctype}){x})"

    def adjoints(self, delta):
        x = self.args[0]
        return [Cast(delta, x.dtype) if x.dtype.kind == "f" else None]


class StopGradient(UnaryOp):
    """The value of x, seen by ng.grad as a constant: for shifts that cancel out, such as
    the max a softmax subtracts for stability, whose gradient would be exactly zero after
    a costly computation. SimplePrune replaces it by x once gradients are built."""
    float_only = False
    numpy = "np.copyto({out}, {x})"
    numpy_calls = ("np.copyto",)
    c = "{x}"

    def adjoints(self, delta):
        return [None]


def zeros(shape, dtype=np.float32):
    from .layout import Broadcast
    return Broadcast(constant(0, dtype=dtype), shape)
