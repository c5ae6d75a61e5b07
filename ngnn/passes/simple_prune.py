"""SimplePrune: algebraic identities and constant folding (ngraph's SimplePrune)."""
import numpy as np

from ..op_graph import (Add, Broadcast, Constant, Divide, Multiply, Negative, Op, StopGradient,
                        Subtract, zeros)
from .base import PeepholeGraphPass, visit

FOLD_LIMIT = 1 << 16    # elements; larger constant results stay as ops (no huge literals)


def scalar_value(op):
    """The single value of a constant (or a broadcast constant) whose elements are all
    equal, else None."""
    while isinstance(op, Broadcast):
        op = op.args[0]
    if op.is_constant and op.value.size and op.value.size <= FOLD_LIMIT:
        first = op.value.flat[0]
        if np.all(op.value == first):
            return first.item()
    return None


class SimplePrune(PeepholeGraphPass):
    """`evaluate(op, values) -> array` folds ops of constants; a transformer passes its own
    evaluator, so folded values are exactly what its generated code would compute. Without
    one, nothing is folded."""

    def __init__(self, evaluate=None):
        self.evaluate = evaluate

    @visit.on_type(Add)
    def visit(self, op):
        if self.folded(op):
            return
        x, y = op.args
        if scalar_value(y) == 0:
            self.replace_op(op, x)
        elif scalar_value(x) == 0:
            self.replace_op(op, y)

    @visit.on_type(Subtract)
    def visit(self, op):
        if self.folded(op):
            return
        x, y = op.args
        if scalar_value(y) == 0:
            self.replace_op(op, x)
        elif scalar_value(x) == 0:
            self.replace_op(op, Negative(y))

    @visit.on_type(Multiply)
    def visit(self, op):
        if self.folded(op):
            return
        x, y = op.args
        for a, b in ((x, y), (y, x)):
            value = scalar_value(b)
            if value == 1:
                return self.replace_op(op, a)
            if value == 0:
                return self.replace_op(op, zeros(op.shape, op.dtype))

    @visit.on_type(Divide)
    def visit(self, op):
        if self.folded(op):
            return
        x, y = op.args
        if scalar_value(y) == 1:
            self.replace_op(op, x)

    @visit.on_type(Negative)
    def visit(self, op):
        if self.folded(op):
            return
        (x,) = op.args
        if isinstance(x, Negative):
            self.replace_op(op, x.args[0])

    @visit.on_type(StopGradient)
    def visit(self, op):
        self.replace_op(op, op.args[0])     # gradients are built before passes run

    @visit.on_type(Op)
    def visit(self, op):
        self.folded(op)

    def folded(self, op):
        """Constant folding: an op of constants is evaluated now. Returns whether it was."""
        if op.is_stateful or not op.args or isinstance(op, (Constant, Broadcast)) or \
                op.size > FOLD_LIMIT or not all(_is_constant(a) for a in op.args):
            return False
        if getattr(op, "graph", None) is not None and op.graph.varies:
            return False      # a GraphSlot's edges change between calls
        if self.evaluate is None:
            return False
        value = self.evaluate(op, [_value(a) for a in op.args])
        self.replace_op(op, Constant(value, dtype=op.dtype))
        return True


def _is_constant(op):
    return op.is_constant or isinstance(op, Broadcast) and _is_constant(op.args[0])


def _value(op):
    if isinstance(op, Broadcast):
        return np.broadcast_to(_value(op.args[0]), op.shape)
    return op.value
