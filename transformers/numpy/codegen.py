"""NumPyCodeGenerator: one op -> NumPy/SciPy statements writing into `out`.

Most ops are rendered from their `numpy` template (ngnn.op_graph); ops whose code needs
more than a template have a `generate_op` method here, chosen by op type.
"""
import numpy as np

from ngnn.dispatch import TypeDispatched, on_type
from ngnn.op_graph import (AllReduce, Aggregate, Concat, Dropout, EdgeSoftmax, Gather, LogSoftmax,
                           MasterBroadcast, MirrorReduce, Op, OneHot, PackedCollective,
                           ReadoutAllReduce, Softmax, SparseDot, SparseDropout,
                           SparseTransposedDot)
from ngnn.op_graph.layout import format_index
from ngnn.op_graph.normalization import LiveRowsOp

from .native import NATIVE_KERNELS

generate_op = on_type


def template_fields(op, out, args, shape=None):
    """What an op's `numpy` template may mention: {out}, {x}, {y}, {xs} and the op's
    declared attributes by field name."""
    fields = {a.field: getattr(op, a.field) for a in op.attributes}
    if "key" in fields:
        fields["key"] = format_index(fields["key"])
    fields.update(out=out, xs=", ".join(args), shape=shape or op.shape)
    fields.update(zip(("x", "y"), args))
    return fields


class NumPyCodeGenerator(TypeDispatched):
    """`generate_op(op, out, args)` returns the statements computing `op` into the array
    named `out` from arrays named `args`. `refs(kind, obj)` names module-level objects
    (graphs) the statements use."""

    def __init__(self, refs, kernels="K"):
        self.refs = refs
        self.kernels = kernels      # where the live-row kernels are: "K", or "N" (native.py)

    @generate_op.on_type(Op)
    def generate_op(self, op, out, args, shape=None):
        """`shape` replaces op.shape in the template (a fused block has fewer rows)."""
        if op.numpy is None:
            raise TypeError(f"the NumPy transformer cannot compute {type(op).__name__}")
        return op.numpy.format(**template_fields(op, out, args, shape)).split("\n")

    @staticmethod
    def is_view_template(op):
        """Templates that bind `out` to a view instead of writing into it."""
        return op.numpy is not None and op.numpy.startswith("{out} = ")

    @generate_op.on_type(LiveRowsOp)
    def generate_op(self, op, out, args, shape=None):
        text = op.numpy.format(**template_fields(op, out, args, shape))
        return [self.kernel(op.kernel) + text[len(f"K.{op.kernel}"):]]

    def kernel(self, name):
        """`K.<name>`, or `N.<name>` where the native kernels are asked for and have it."""
        return f"{'N' if self.kernels == 'N' and name in NATIVE_KERNELS else 'K'}.{name}"

    @generate_op.on_type(Concat)
    def generate_op(self, op, out, args):
        return [f"np.concatenate([{', '.join(args)}], axis={op.axis}, out={out})"]

    @generate_op.on_type(Softmax)
    def generate_op(self, op, out, args):
        return [f"K.softmax({args[0]}, axis={op.axis}, out={out})"]

    @generate_op.on_type(LogSoftmax)
    def generate_op(self, op, out, args):
        return [f"K.log_softmax({args[0]}, axis={op.axis}, out={out})"]

    @generate_op.on_type(Dropout)
    def generate_op(self, op, out, args):
        if op.rows is not None:
            return [f"K.dropout_rows({args[0]}, seed={op.seed}, step=step, rate={op.rate!r}, "
                    f"rows={self.mask_rows(op)}, out={out})"]
        return [f"K.dropout({args[0]}, seed={op.seed}, step=step, rate={op.rate!r}, "
                f"out={out})"]

    @generate_op.on_type(SparseDropout)
    def generate_op(self, op, out, args):
        # A new CSR matrix (its size is the fed matrix's, unknown to the memory plan).
        ids = "" if op.rows is None else f", ids={self.mask_rows(op)}"
        return [f"{out} = K.sparse_dropout({args[0]}, seed={op.seed}, step=step, "
                f"rate={op.rate!r}{ids})"]

    @generate_op.on_type(SparseDot)
    def generate_op(self, op, out, args):
        return [f"K.sparse_dot({args[0]}, {args[1]}, out={out})"]

    @generate_op.on_type(SparseTransposedDot)
    def generate_op(self, op, out, args):
        return [f"K.sparse_transposed_dot({args[0]}, {args[1]}, out={out})"]

    def mask_rows(self, op):
        """The ids a keyed dropout's rows take their positions from (see Dropout)."""
        graph, attribute = op.rows
        return f"{self.refs('graph', graph)}.{attribute}"

    @generate_op.on_type(MirrorReduce)
    def generate_op(self, op, out, args):
        g = self.refs("graph", op.graph)
        return [f"{g}.reduce_to_masters({args[0]}, {op.reduce!r}, {op.at!r}, out={out})"]

    @generate_op.on_type(MasterBroadcast)
    def generate_op(self, op, out, args):
        g = self.refs("graph", op.graph)
        return [f"{g}.broadcast_to_mirrors({args[0]}, out={out})"]

    @generate_op.on_type(AllReduce)
    def generate_op(self, op, out, args):
        return [f"{self.refs('exchange', op.exchange)}.allreduce({args[0]}, out={out})"]

    @generate_op.on_type(ReadoutAllReduce)
    def generate_op(self, op, out, args):
        g = self.refs("graph", op.graph)
        return [f"{g}.combine_ranks({args[0]}, {op.reduce!r}, out={out})"]

    @generate_op.on_type(PackedCollective)
    def generate_op(self, op, out, args):
        packing = self.refs("exchange", op.packing)
        return [f"{packing}.run(({', '.join(args)},), out={out})"]

    @generate_op.on_type(OneHot)
    def generate_op(self, op, out, args):
        return [f"K.one_hot({args[0]}, out={out})"]

    @generate_op.on_type(Gather)
    def generate_op(self, op, out, args):
        g = self.refs("graph", op.graph)
        # mode="clip": the graph checked its ids when it was built, and np.take into `out`
        # copies through a buffer (twice the time) only to raise on ids out of range.
        return [f"np.take({args[0]}, {g}.{op.by}, axis=0, out={out}, mode='clip')"]

    @generate_op.on_type(Aggregate)
    def generate_op(self, op, out, args):
        g = self.refs("graph", op.graph)
        if op.combiner.linear:     # a sparse product with the incidence matrix
            return [f"K.aggregate_{op.reduce}({g}, {args[0]}, at={op.at!r}, out={out})"]
        return [f"K.aggregate_segments({g}, {args[0]}, at={op.at!r}, "
                f"reduce={op.reduce!r}, out={out})"]

    @generate_op.on_type(EdgeSoftmax)
    def generate_op(self, op, out, args):
        g = self.refs("graph", op.graph)
        return [f"K.edge_softmax({g}, {args[0]}, at={op.at!r}, out={out})"]


def literal(value, dtype):
    """A scalar as source text that keeps its dtype and prints the shortest digits that
    round-trip in it (np.float32(0.8), not 0.8 or np.float32(0.800000011920929))."""
    dtype = np.dtype(dtype)
    value = dtype.type(np.asarray(value, dtype=dtype).item())
    if dtype == np.bool_:
        return f"np.bool_({bool(value)})"
    if dtype.kind == "f" and not np.isfinite(value):
        return f"np.{dtype.name}({str(value)!r})"
    return f"np.{dtype.name}({str(value)})"


def is_scalar_constant(op):
    """A constant of one value, written as a literal where it is read."""
    return op.is_constant and op.value.ndim == 0
