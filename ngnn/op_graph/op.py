"""The op-graph node: `Op`, plus the leaves (placeholders, variables, constants).

An op knows its arguments, result shape and dtype (inferred when it is built), its type
scope (seed 000: `v`, `innbs`, `e`, `n`, or None for ordinary tensors) and a forwarding
pointer. Passes never edit an op's arguments: they set `old.forward = new`, and every
reader sees the replacement through `args` / `forwarded` (ngraph's design).
"""
import ast
import inspect
import itertools
import textwrap
from dataclasses import dataclass

import numpy as np

from ..errors import TracingError, at_user_line, control_flow_error
from ..origin import creation_site

from .scopes import combine_scopes

_op_ids = itertools.count()


# How operation batching changes an attribute when it puts `lead_shape` axes in front of
# every argument (the node or edge axis): the one thing a new op with attributes must say.
def _unchanged(value, lead_shape):
    return value


def _shifted_axes(value, lead_shape):
    shift = len(lead_shape)
    return value + shift if isinstance(value, int) else tuple(a + shift for a in value)


def _permutation(value, lead_shape):
    return tuple(range(len(lead_shape))) + _shifted_axes(value, lead_shape)


def _prefixed_shape(value, lead_shape):
    return tuple(lead_shape) + tuple(value)


def _prefixed_index(value, lead_shape):
    return tuple(slice(0, n, 1) for n in lead_shape) + tuple(value)


BATCHING = {"unchanged": _unchanged, "axes": _shifted_axes, "permutation": _permutation,
            "shape": _prefixed_shape, "index": _prefixed_index}


@dataclass(frozen=True)
class Attr:
    """A non-tensor attribute of an op, declared once in the op's `attributes`.

    field     where the op keeps it (`op.alpha`)
    param     the constructor's keyword for it, when it differs from `field`
    batching  a key of BATCHING: how it changes under operation batching
    printed   False for attributes the IR already shows (in the op's name, or a graph)
    """
    field: str
    param: str = None
    batching: str = "unchanged"
    printed: bool = True

    def __post_init__(self):
        if self.batching not in BATCHING:
            raise ValueError(f"Attr {self.field!r}: batching must be one of "
                             f"{sorted(BATCHING)}, got {self.batching!r}")

    @property
    def keyword(self):
        return self.param or self.field


class UndeclaredAttributeError(TypeError):
    """An op class keeps a constructor value it does not declare as an `Attr`."""


def check_declared_attributes(cls):
    """Refuses, when an op class is defined, a constructor that keeps a value the class does
    not declare: CSE would merge ops that differ only in it (Scale(x, 2) and Scale(x, 3)
    both giving 2x), rebuilding (operation batching, chunking) would drop it for its default
    and code generators would not find it. Also refuses a declared attribute the
    constructor cannot take back, which rebuilding would pass to it."""
    declared = {a.field for a in cls.attributes} | set(cls.derived) | OP_STATE
    for field, line in kept_fields(cls.__dict__.get("__init__")).items():
        if field not in declared:
            raise UndeclaredAttributeError(
                f"{cls.__qualname__}.__init__ keeps self.{field} (line {line}) but "
                f"{cls.__qualname__} does not declare it: add Attr({field!r}) to its "
                f"`attributes` (what CSE compares and rebuilding passes back), or name it in "
                f"`derived` if it is computed from the op's arguments and declared attributes")
    parameters = inspect.signature(cls.__init__).parameters
    if any(p.kind is p.VAR_KEYWORD for p in parameters.values()):
        return
    for attr in cls.attributes:
        if attr.keyword not in parameters:
            raise UndeclaredAttributeError(
                f"{cls.__qualname__} declares Attr({attr.field!r}) but its constructor has no "
                f"parameter {attr.keyword!r} to rebuild it with (name it with param=)")


def kept_fields(init):
    """{field: line} for each `self.field = ...` in the constructor `init` (None: none of
    its own). A constructor whose source is not available (typed into a REPL) is not
    checked."""
    if init is None:
        return {}
    try:
        lines, first = inspect.getsourcelines(init)
    except (OSError, TypeError):
        return {}
    function = ast.parse(textwrap.dedent("".join(lines))).body[0]
    me = function.args.args[0].arg
    return {node.attr: first + node.lineno - 1 for node in ast.walk(function)
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
            and isinstance(node.value, ast.Name) and node.value.id == me}


class ShapeError(ValueError):
    """An op was built from arguments whose shapes or dtypes do not fit."""


class SparseInputError(TypeError):
    """A sparse tensor was given to an op that takes only dense ones."""


class Op:
    """A node of the op-graph.

    Class attributes describe the op's kind:
      kind      operator scope printed in the IR (seed 000): node/edge/agg/prim/layout.
                None means "derived from the type scope": edge for `e` values, else node.
      numpy     NumPy statement template ({out}, {x}, {y}, attributes), used by the NumPy
                transformer and by constant folding.
      c         CUDA/OpenCL expression template for element-wise kernels.
      numpy_calls  the NumPy functions its NumPy statement calls, each a pass over its
                elements: the simulator's price of an element-wise op (each at its
                calibrated cost per element; ngnn/simulate/cost.py).
      work      the other ops' price: a tuple of `Work` (ngnn/op_graph/work.py), the
                calibrated kernels its NumPy statement runs, with their items, row width,
                table and bytes; () for an element-wise op (priced by `numpy_calls`).

    Traits, what passes and transformers ask an op instead of testing its class
    (docs/adding_an_op.md has the table):
      is_leaf      a given value (placeholder, variable, constant), not computed
      elementwise  each result element from the same-index elements of its arguments
      broadcasts   its arguments broadcast to its shape by NumPy's rules
      is_view      its result may be a view of its first argument, no storage of its own
                   (NumPy's reshape, transpose, broadcast_to, basic slicing)
      combiner     a reduction's row of the reduction table (ngnn/op_graph/combiners.py)
      row_space    "e" or "n": a graph op whose result has a row per edge or per vertex
                   of its graph, whatever its argument's rows
      row_local(rows)  whether row i of its result reads only row i of its arguments that
                   have rows (`rows[k]`): what chunked execution may split by row blocks
      across_rows  what it does across rows where it is not row-local (for the message
                   that refuses to split it)
      fusion_role  how it joins a fused group (ngnn/passes/fusion.py): "edge" (a gather),
                   "agg" (an aggregation), "softmax" (an edge softmax), "rows" (a group
                   computes it where its rows are: element-wise ops, reshapes, broadcasts,
                   reductions within rows) or None (never in a group)
      inlinable    a GPU kernel can compute it at any coordinate from its arguments at
                   derived coordinates (element-wise ops, views, gathers, one-hots)
      positional   each result element is one element of its argument, at a position
                   computed from the element's own (views), perhaps times a function of
                   that position alone (a dropout's mask): a GPU kernel computes it
                   wherever it is read, however many read it
    """
    kind = None
    numpy = None
    numpy_calls = ()
    work = ()
    c = None
    is_stateful = False   # never folded or merged (random masks, assignments)
    attributes = ()       # Attr declarations: identity (CSE), rebuilding and printing
    derived = ()          # fields computed from the arguments and the declared attributes
    is_sparse = False     # a scipy.sparse CSR value at run time (ngnn/op_graph/sparse.py)
    takes_sparse = False  # may have sparse arguments
    is_leaf = False
    elementwise = False
    broadcasts = False
    is_view = False
    combiner = None
    row_space = None
    across_rows = None
    fusion_role = None

    @property
    def inlinable(self):
        return self.elementwise or self.is_view

    @property
    def positional(self):
        return self.is_view

    def __init__(self, args=(), *, shape, dtype, name=None, scope=None):
        self._args = tuple(args)
        for a in self._args:
            if not isinstance(a, Op):
                raise TypeError(f"{type(self).__name__}: argument {a!r} is not an ngnn op")
            if a.is_sparse and not self.takes_sparse:
                raise SparseInputError(f"{type(self).__name__}: argument {a!r} is a sparse tensor; "
                                "sparse tensors feed only ng.dot (as the first operand) and "
                                "ng.dropout")
        self.shape = tuple(int(s) for s in shape)
        self.dtype = np.dtype(dtype)
        self.name = name
        if scope is None:
            scope, zoom = combine_scopes(type(self).__name__, self._args)
            if scope in ("n", "e") and not any(a.scope == scope and a.shape[:1] == self.shape[:1]
                                               for a in self._args if a.shape):
                scope = None   # the node or edge axis was reduced, contracted or moved
        else:
            zoom = next((a.zoom for a in self._args if a.zoom is not None), None)
        self.scope = scope
        self.zoom = zoom      # the zoomIn context of a traced per-vertex value, else None
        self._forward = None
        self.origin = creation_site()     # (file, line) that built it, for run-time errors
        self.id = next(_op_ids)

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        check_declared_attributes(cls)

    # ---- graph structure -------------------------------------------------------------
    @property
    def forward(self):
        """The op that replaces this one (set by passes), or None."""
        return self._forward

    @forward.setter
    def forward(self, replacement):
        # Checked here, where a pass sets it, so a wrong replacement is reported by the
        # pass that made it rather than as a crash in a later pass or in generated code.
        if replacement is not None:
            if not isinstance(replacement, Op):
                raise TypeError(f"{self}.forward must be an ngnn op, got {replacement!r}")
            if replacement.shape != self.shape or replacement.dtype != self.dtype:
                raise ShapeError(
                    f"cannot replace {self} by {replacement}: a replacement must have the same "
                    f"shape and dtype (PeepholeGraphPass.replace_op broadcasts and casts it)")
            if replacement.origin is None:
                replacement.origin = self.origin
        self._forward = replacement

    @property
    def args(self):
        return tuple(a.forwarded for a in self._args)

    @property
    def forwarded(self):
        op = self
        while op._forward is not None:
            op = op._forward
        return op

    def attrs(self):
        """The declared attributes by keyword: part of the op's identity for CSE."""
        return {a.keyword: getattr(self, a.field) for a in self.attributes}

    def printed_attrs(self):
        return {a.keyword: getattr(self, a.field) for a in self.attributes if a.printed}

    # ---- tensor facts ----------------------------------------------------------------
    @property
    def ndim(self):
        return len(self.shape)

    @property
    def size(self):
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nbytes(self):
        return self.size * self.dtype.itemsize

    @property
    def is_scalar(self):
        return self.shape == ()

    @property
    def is_constant(self):
        return False

    @property
    def const(self):
        raise ValueError(f"{self} is not a constant")

    @property
    def op_name(self):
        """Lower-case name used in the IR and generated code (`Add` -> `add`)."""
        name = type(self).__name__
        return "".join("_" + ch.lower() if ch.isupper() and i else ch.lower()
                       for i, ch in enumerate(name))

    def with_args(self, args, lead=0):
        """The same op, with the same attributes, on new arguments; `lead` extra leading
        axes of the first argument (operation batching adds the node or edge axis in
        front) reach the attributes through their declared batching rule."""
        lead_shape = args[0].shape[:lead] if lead else ()
        values = {a.keyword: BATCHING[a.batching](getattr(self, a.field), lead_shape)
                  for a in self.attributes}
        return type(self)(*args, **values, name=self.name)

    def adjoints(self, delta):
        """Gradients with respect to each argument, given the gradient of the result."""
        raise ValueError(f"{type(self).__name__} has no gradient")

    def row_local(self, rows=()):
        """Whether row i of the result reads only row i of the arguments that have rows
        (`rows[k]`: argument k has a row per vertex, edge or graph)."""
        return self.elementwise

    def __repr__(self):
        label = f" {self.name!r}" if self.name else ""
        return f"<{type(self).__name__}{label} {list(self.shape)} {self.dtype}>"

    __hash__ = object.__hash__

    def __bool__(self):
        raise control_flow_error(self)

    # ---- Python operators build ops ----------------------------------------------------
    def __add__(self, other): return _binary("Add", self, other)
    def __radd__(self, other): return _binary("Add", other, self)
    def __sub__(self, other): return _binary("Subtract", self, other)
    def __rsub__(self, other): return _binary("Subtract", other, self)
    def __mul__(self, other): return _binary("Multiply", self, other)
    def __rmul__(self, other): return _binary("Multiply", other, self)
    def __truediv__(self, other): return _binary("Divide", self, other)
    def __rtruediv__(self, other): return _binary("Divide", other, self)
    def __pow__(self, other): return _binary("Power", self, other)
    def __rpow__(self, other): return _binary("Power", other, self)
    def __matmul__(self, other): return _binary("Dot", self, other)
    def __rmatmul__(self, other): return _binary("Dot", other, self)
    # Comparisons give 0/1 masks of the operands' float dtype; `==` stays identity (ops
    # are dictionary keys), so comparing with a number is refused rather than silently False.
    def __gt__(self, other): return _binary("Greater", self, other)
    def __ge__(self, other): return _binary("GreaterEqual", self, other)
    def __lt__(self, other): return _binary("Greater", other, self)
    def __le__(self, other): return _binary("LessEqual", self, other)

    def __eq__(self, other):
        if isinstance(other, (int, float, np.number, np.ndarray)):
            raise TypeError(f"{self} == {other!r}: `==` on a symbolic tensor does not compare "
                            "values; use ng.equal(x, y) for an element-wise 0/1 mask")
        return self is other

    def __ne__(self, other):
        return not self.__eq__(other)

    def __neg__(self):
        from .elementwise import Negative
        return Negative(self)

    def __getitem__(self, key):
        if isinstance(key, Op):
            from ..frontend.tracing import index_by_tensor     # W[e.type]
            return index_by_tensor(self, key)
        from .layout import slice_op
        return slice_op(self, key)

    def reshape(self, *shape):
        from .layout import Reshape
        return Reshape(self, shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list))
                       else shape)

    view = reshape

    @property
    def T(self):
        from .layout import Transpose
        return Transpose(self)

    # ---- Python and NumPy constructs that need a value ---------------------------------
    def __int__(self):
        raise needs_value_error(self, "int(...)", "keep it a tensor: ng.cast(x, np.int64) "
                                "converts element types")

    def __float__(self):
        raise needs_value_error(self, "float(...)", "keep it a tensor (ng.cast(x, np.float32) "
                                "converts element types); plain numbers mix with tensors as is")

    def __complex__(self):
        raise needs_value_error(self, "complex(...)", "ngnn computes with real tensors")

    def __index__(self):
        raise needs_value_error(
            self, "a Python integer index (range(...), indexing a list or tuple, ...)",
            "write the loop or the selection as tensor ops: slicing x[i] with a Python int, "
            "ng.one_hot / masks for a data-dependent choice, v.innbs to run over neighbours")

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        # An ndarray or NumPy scalar on the left of an operator (array * x) lands here.
        operator = NUMPY_OPERATORS.get(ufunc.__name__)
        if method == "__call__" and operator is not None and not kwargs and len(inputs) == 2:
            cls_name, swap = operator
            return _binary(cls_name, *(inputs[::-1] if swap else inputs))
        name = ufunc.__name__
        if method != "__call__":      # np.sum(x) is np.add.reduce(x), np.max np.maximum's
            raise needs_value_error(self, f"np.{name}.{method}(...) (what np.sum, np.max and "
                                    "similar functions call)", "use ng.sum, ng.max, ng.min or "
                                    "ng.mean, which build the computation")
        raise needs_value_error(self, f"np.{name}(...)",
                                f"use the ngnn op (ng.{name} where it exists, e.g. ng.exp, "
                                "ng.log, ng.maximum), which builds the computation")

    def __array__(self, dtype=None, copy=None):
        raise needs_value_error(self, "a NumPy array (np.asarray, np.array or a NumPy "
                                "function)", "use ngnn ops on it, or run a computation to "
                                "get its value")

    def __iter__(self):
        raise TypeError(f"cannot iterate over the tensor {self}: it is symbolic. Use "
                        "slicing, or iterate over v.innbs / v.inedges inside ng.zoomIn")

    def __len__(self):
        if not self.shape:
            raise TypeError(f"len() of the scalar tensor {self}")
        return self.shape[0]


# What Op.__init__ keeps on every op (a subclass may set them too: Cast its dtype).
OP_STATE = frozenset(kept_fields(Op.__init__))


# ufunc name -> (op class, whether the arguments swap): what `array <op> x` means.
NUMPY_OPERATORS = {"add": ("Add", False), "subtract": ("Subtract", False),
                   "multiply": ("Multiply", False), "divide": ("Divide", False),
                   "true_divide": ("Divide", False), "power": ("Power", False),
                   "matmul": ("Dot", False), "greater": ("Greater", False),
                   "greater_equal": ("GreaterEqual", False), "less": ("Greater", True),
                   "less_equal": ("LessEqual", False)}


def needs_value_error(op, construct, advice):
    """The error for Python or NumPy code that needs a symbolic tensor's value: a
    TracingError at the user's line inside ng.zoomIn, a TypeError elsewhere."""
    message = at_user_line(
        f"{construct} on the symbolic tensor {op} needs its value, which exists only when "
        f"the computation runs; {advice}")
    return TracingError(message) if op.zoom is not None else TypeError(message)


def _binary(cls_name, x, y):
    from . import elementwise, linalg
    cls = getattr(elementwise, cls_name, None) or getattr(linalg, cls_name)
    return cls(*as_ops(x, y))


def as_ops(*values):
    """Ops from a mix of ops and Python/NumPy values; plain numbers take the dtype of the
    ops beside them (NumPy 2's weak scalars), so `x_f32 * 2.0` stays float32."""
    like = next((v for v in values if isinstance(v, Op)), None)
    return tuple(v if isinstance(v, Op) else constant(v, like=like) for v in values)


# ---- leaves ------------------------------------------------------------------------------

class Leaf(Op):
    kind = "prim"
    is_leaf = True

    def __init__(self, shape, dtype, name=None, scope=None):
        super().__init__((), shape=shape, dtype=dtype, name=name, scope=scope)

    def adjoints(self, delta):
        return []


class Placeholder(Leaf):
    """A tensor fed at call time, in the computation's parameter order; a sparse one
    (`sparse=True`, a 2-D float tensor) is fed a scipy.sparse CSR matrix."""
    attributes = (Attr("is_sparse", param="sparse", printed=False),)

    def __init__(self, shape, dtype, name=None, sparse=False):
        super().__init__(shape, dtype, name=name)
        if sparse and (len(self.shape) != 2 or self.dtype.kind != "f"):
            raise ShapeError(f"placeholder {name or ''}: a sparse placeholder is a 2-D float "
                             f"matrix, got shape {self.shape} and dtype {self.dtype}")
        self.is_sparse = bool(sparse)


class Variable(Leaf):
    """State that lives on the transformer's device between calls.

    `initial_value` is an array (broadcast to the shape), a number, or a callable
    `f(shape) -> array`; the transformer's init computation writes it once.
    """
    is_stateful = True
    attributes = (Attr("initial_value", printed=False), Attr("trainable", printed=False))

    def __init__(self, shape, dtype=np.float32, initial_value=0.0, name=None, trainable=True):
        super().__init__(shape, dtype, name=name)
        self.trainable = trainable
        value = initial_value(self.shape) if callable(initial_value) else initial_value
        value = np.asarray(value)
        try:
            self.initial_value = np.broadcast_to(value, self.shape).astype(self.dtype)
        except ValueError:
            raise ShapeError(f"variable {name or ''}: initial value of shape {value.shape} "
                             f"does not fit the variable's shape {self.shape}") from None
        if self.dtype.kind == "f" and not np.all(np.isfinite(self.initial_value)):
            raise ValueError(f"variable {name or ''}: initial value contains NaN or Inf")


class Constant(Leaf):
    """A value known when the graph is built."""
    attributes = (Attr("value"),)

    def __init__(self, value, dtype=None, name=None):
        value = np.asarray(value, dtype=dtype)
        if value.dtype == np.float64 and dtype is None:
            value = value.astype(np.float32)
        super().__init__(value.shape, value.dtype, name=name)
        self.value = value
        self.value.flags.writeable = False

    @property
    def is_constant(self):
        return True

    @property
    def const(self):
        return self.value.item() if self.value.ndim == 0 else self.value

    def printed_attrs(self):
        if self.value.ndim == 0:
            return {"value": self.value.item()}
        if self.value.size <= 16:
            return {"value": self.value.tolist()}
        return {"value": f"<{self.value.size} values>"}


def constant(value, dtype=None, name=None, like=None):
    """A constant; plain numbers adopt the dtype of `like` when the kinds agree."""
    if dtype is None and like is not None and np.ndim(value) == 0 and \
            not isinstance(value, np.ndarray):
        kind = np.asarray(value).dtype.kind
        if like.dtype.kind == "f" or (like.dtype.kind in "iu" and kind in "biu"):
            dtype = like.dtype
    return Constant(value, dtype=dtype, name=name)


def placeholder(shape, dtype=np.float32, name=None, sparse=False):
    return Placeholder(_shape_tuple(shape), dtype, name=name, sparse=sparse)


def variable(shape, dtype=np.float32, initial_value=0.0, name=None, trainable=True):
    return Variable(_shape_tuple(shape), dtype, initial_value, name=name, trainable=trainable)


def _shape_tuple(shape):
    shape = (shape,) if np.ndim(shape) == 0 else tuple(shape)
    for s in shape:
        if not isinstance(s, (int, np.integer)) or s < 0:
            raise ShapeError(f"shape {shape}: every dimension must be a non-negative int")
    return tuple(int(s) for s in shape)


def ordered_ops(results):
    """Every op the results depend on, arguments before users (iterative DFS)."""
    order, seen = [], set()
    for root in results:
        stack = [(root.forwarded, False)]
        while stack:
            op, expanded = stack.pop()
            if expanded:
                order.append(op)
                continue
            if op in seen:
                continue
            seen.add(op)
            stack.append((op, True))
            stack.extend((a, False) for a in reversed(op.args) if a not in seen)
    return order
