"""UnshareBroadcasts: a broadcast read by several ops becomes one broadcast per reader.

A broadcast costs nothing where it is read (a GPU kernel reads its argument at the
broadcast coordinates), but one op read by several others ties them together for the
Fusion pass: a per-head gradient broadcast over each head's features that one reader uses
inside a fused group (its share of the features' gradient) and another outside it (the
gradient of an attention vector, summed over all vertices) keeps the broadcast, and with
it the outside reader, in the group, which then writes the wide product for the reduction
to read back. With a broadcast of its own, each reader is placed on its own (Fusion's
trim_wide_tails leaves the outside one to its reader). A GPU pass: NumPy's groups gain
nothing from it.
"""
from ..op_graph import Broadcast, ordered_ops
from .base import GraphPass


class UnshareBroadcasts(GraphPass):
    def do_pass(self, computation):
        readers = {}
        for op in ordered_ops(computation.results):
            for a in dict.fromkeys(op.args):
                if isinstance(a, Broadcast):
                    readers.setdefault(a, []).append(op)
        for broadcast, users in readers.items():
            for user in users[1:]:
                again = broadcast.with_args(broadcast.args)
                user.forward = user.with_args([again if a is broadcast else a
                                               for a in user.args])
