"""CSE: ops with the same type, arguments and attributes are computed once."""
from ..graph import Graph
from ..op_graph import Constant, Leaf, ordered_ops
from .base import GraphPass


def structural_key(op):
    """What makes two ops compute the same value, or None for ops that never merge."""
    if isinstance(op, Constant):
        return (Constant, op.dtype.str, op.shape, op.value.tobytes())
    if op.is_stateful or isinstance(op, Leaf):
        return None
    attrs = tuple(sorted((k, _freeze(v)) for k, v in op.attrs().items()))
    return (type(op), op.op_name, op.dtype.str, op.shape, tuple(a.id for a in op.args), attrs)


def _freeze(value):
    if isinstance(value, Graph):
        return ("graph", id(value))
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, slice):      # unhashable before Python 3.12
        return ("slice", value.start, value.stop, value.step)
    return value


class CSE(GraphPass):
    def do_pass(self, computation):
        first = {}
        for op in ordered_ops(computation.results):
            key = structural_key(op)
            if key is None:
                continue
            if key in first:
                op.forward = first[key]
            else:
                first[key] = op
