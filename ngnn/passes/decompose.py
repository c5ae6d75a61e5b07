"""Decompose: ops that a transformer has no kernel for become the ops they are made of.

An op may come with a `decomposition()`: the same value built from ops every backend
lowers (element-wise ops, reductions, layout), next to its shape rule and gradient. A
transformer that runs such an op as one kernel of its own (the NumPy transformer's batch
norm, ngnn/op_graph/normalization.py) keeps it; one that has none (the GPU transformer)
runs this pass first, and the usual passes then fuse and plan what it leaves. The ops a
decomposition builds may decompose again; the pass repeats until none is left.
"""
from ..op_graph import Op
from .base import PeepholeGraphPass


class Decompose(PeepholeGraphPass):
    """Replaces every op that has a `decomposition()` by it."""

    @visit.on_type(Op)
    def visit(self, op):
        if hasattr(op, "decomposition"):
            self.replace_op(op, op.decomposition())
