"""PackCollectives: the all-reduces of a rank's step that no one of them feeds, sent as one.

A step over ranks makes tens of collectives (GIN-0 with batch norm over 2 ranks: 42
weight-gradient all-reduces, 57 readout all-reduces of readouts and batch-norm statistics),
each a few kilobytes. What one costs is not its bytes but the meeting: both ranks must
reach it, and on a shared machine one of them is often off its core. Collectives that
depend on none of the others can meet once: the pass gives each collective its height,
the most collectives on a path from it to the results, and packs the collectives of one
communicator, dtype and height into one PackedCollective. Two collectives of one height
never feed each other (a path from one to the other would make the first higher), so the
packed op is acyclic; packing by height rather than by depth waits for the latest member,
which puts every weight gradient (height 0) in one message and every layer's readout
before the loss in another. As many messages remain as the longest chain of collectives
that feed each other (batch norm's mean, then its variance, then their gradients, layer
after layer): no grouping sends fewer.

Each member then reads its part of the packed result (a slice, reshaped: views, no copy).
Every rank builds the same graph, so every rank packs the same members in the same order.
After autodiff and WideAccumulation: it widens through the members one by one.
"""
from ..op_graph import (AllReduce, PackedCollective, ReadoutAllReduce, Reshape, Slice,
                        ordered_ops)
from .base import GraphPass


class PackCollectives(GraphPass):
    def do_pass(self, computation):
        ops = ordered_ops(computation.results)
        height = {id(op): 0 for op in ops}
        for op in reversed(ops):         # users before their arguments
            above = height[id(op)] + (1 if packable(op) else 0)
            for arg in op.args:
                height[id(arg)] = max(height[id(arg)], above)
        groups = {}
        for op in ops:
            if packable(op):
                key = (id(exchange_of(op)), op.dtype, height[id(op)])
                groups.setdefault(key, []).append(op)
        for members in groups.values():
            if len(members) > 1:
                pack(members)


def packable(op):
    return type(op) in (AllReduce, ReadoutAllReduce) and op.forward is None


def exchange_of(op):
    return op.exchange if isinstance(op, AllReduce) else op.graph.exchange


def pack(members):
    parts = [(None, "sum", op.shape) if isinstance(op, AllReduce)
             else (op.graph, op.reduce, op.shape) for op in members]
    packing = exchange_of(members[0]).packing(parts, members[0].dtype)
    packed = PackedCollective(*[op.args[0] for op in members], packing=packing)
    for op, start, stop in zip(members, packing.offsets[:-1], packing.offsets[1:]):
        op.forward = Reshape(Slice(packed, (slice(int(start), int(stop)),)), op.shape)
