"""RecomputeDropout: a dropout read both in the forward and in the backward pass is computed
again for each later reader instead of being kept alive in between.

A dropout's mask is a pure function of (seed, call number, position) and its input is
usually alive anyway (a placeholder, or a value the backward pass needs itself), so a
second evaluation costs one cheap element-wise pass and saves a tensor of the input's size
from the forward pass to the backward one (the gradient of `dot(dropout(x), W)` with respect
to W reads the dropped x). Each copy sits right before its reader in the execution order.
"""
from ..op_graph import Dropout, ordered_ops
from .base import GraphPass


class RecomputeDropout(GraphPass):
    def do_pass(self, computation):
        readers = {}
        for op in ordered_ops(computation.results):
            for a in dict.fromkeys(op.args):
                if isinstance(a, Dropout):
                    readers.setdefault(a, []).append(op)
        for dropout, users in readers.items():
            for user in users[1:]:
                again = dropout.with_args(dropout.args)
                user.forward = user.with_args([again if a is dropout else a
                                               for a in user.args])
