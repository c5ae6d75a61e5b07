"""The cost of one step of a computation's plan (a plain op, a fused group, a kernel group)
on one device, in seconds, with the work and the bytes it was priced from.

Dense ops: a roofline, max(flops / throughput, bytes / bandwidth). Graph ops: the
primitives the transformers lower them to, each at its calibrated rate: a gather reads and
writes one row per edge (`gather_bandwidth`); a sum or mean aggregation is a sparse-dense
product with one multiply-add per edge and feature (`spmm_rate`); a max or min one a
segment reduction (`segment_rate`); a dropout draws a random number per
element (`dropout_rate`); an edge softmax is a segment max, a gather of it, the
element-wise exp and shift, a segment sum, a gather of the sums and a divide. A fused
group or kernel group is one call that does its members' work (on the NumPy transformer,
less the gathers its sparse products read in place). Communication: the alpha-beta
model over the link to each peer. Every step pays the device's per-call overhead once.
"""
import numpy as np

from ..op_graph import (Aggregate, AllReduce, Assign, Constant, Dot, Dropout, EdgeSoftmax,
                        Gather, MasterBroadcast, MirrorReduce, Placeholder, SparseDot,
                        SparseDropout, SparseTransposedDot, Variable)
from ..passes.buffer_sharing import is_group

LEAVES = (Placeholder, Variable, Constant)


class Cost:
    """`seconds` of one step; `flops`, `bytes` (memory traffic), `comm_bytes` (sent over
    links) it was priced from; `kind`: dense, graph, fused, comm or view."""

    def __init__(self, seconds=0.0, flops=0.0, nbytes=0.0, comm_bytes=0.0, kind="dense"):
        self.seconds, self.flops, self.bytes = seconds, flops, nbytes
        self.comm_bytes, self.kind = comm_bytes, kind

    def __add__(self, other):
        kinds = {self.kind, other.kind}
        return Cost(self.seconds + other.seconds, self.flops + other.flops,
                    self.bytes + other.bytes, self.comm_bytes + other.comm_bytes,
                    self.kind if len(kinds) == 1 else "fused")


def size(op):
    return int(np.prod(op.shape, dtype=np.int64))


def nbytes(op):
    return size(op) * np.dtype(op.dtype).itemsize


def row_elements(op):
    """Elements per row of a node or edge tensor (features times heads)."""
    return int(np.prod(op.shape[1:], dtype=np.int64))


def step_cost(step, device, topology, rank=0, views=()):
    """The cost of one step, overhead included."""
    if is_group(step):
        cost = Cost(kind="fused")
        for op in step.ops:
            if op not in folded_into_products(step, device):
                cost = cost + work(op, device, topology, rank, views)
        cost.kind = "fused"
    else:
        cost = work(step, device, topology, rank, views)
    cost.seconds += device.call_overhead
    return cost


def folded_into_products(step, device):
    """Ops of a fused group that the NumPy transformer never runs on its own: a sum of
    gathered rows (times an edge weight) is one sparse product, priced as the aggregation,
    so the gather and the multiply it reads cost nothing more. Asked of the transformer's
    own writer, so the prediction follows the plan that runs."""
    from ..passes.fusion import FusedGroup
    if device.kind != "cpu" or not isinstance(step, FusedGroup):
        return set()
    from ..transformers.numpy.fused import FusedGroupWriter
    writer = FusedGroupWriter(step, {}, None, lambda kind, graph: kind)
    return writer.sparse_products("src" if step.at == "dst" else "dst")[1]


def work(op, device, topology, rank=0, views=()):
    """The cost of the work of one op, without the call overhead."""
    if isinstance(op, LEAVES):
        return Cost(kind="view")
    if op in views:
        return Cost(kind="view")
    if isinstance(op, (MirrorReduce, MasterBroadcast, AllReduce)):
        return communication(op, topology, rank)
    if isinstance(op, (Gather, Aggregate, EdgeSoftmax)):
        return graph_work(op, device)
    if isinstance(op, (SparseDot, SparseTransposedDot)):
        return sparse_product(op, device)
    if isinstance(op, Dot):
        return dense_product(op, device)
    if isinstance(op, (Dropout, SparseDropout)):
        return dropout(op, device)
    if isinstance(op, Assign):
        moved = 2 * nbytes(op.args[-1])
        return Cost(moved / device.memory_bandwidth, 0, moved)
    moved = nbytes(op) + sum(nbytes(arg) for arg in op.args if not arg.is_sparse)
    flops = size(op)
    return Cost(max(flops / device.flops, moved / device.memory_bandwidth), flops, moved)


def dense_product(op, device):
    a, b = op.args
    inner = a.shape[-1] if a.ndim else 1
    flops = 2 * size(op) * inner
    moved = nbytes(a) + nbytes(b) + nbytes(op)
    return Cost(max(flops / device.flops, moved / device.memory_bandwidth), flops, moved)


def dropout(op, device):
    """A random draw per element (per stored value of a sparse tensor, bounded by its
    dense size), then a masked scale."""
    draws = size(op)
    moved = 2 * nbytes(op)
    return Cost(draws / device.dropout_rate + moved / device.memory_bandwidth, draws, moved)


def sparse_product(op, device):
    """A CSR product priced at full density: the plan does not know how many of the
    sparse operand's entries are non-zero, so this bounds the work from above."""
    x, d = op.args
    stored = size(x)
    macs = stored * op.shape[-1]
    moved = nbytes(d) + nbytes(op) + stored * 8
    return Cost(macs / device.spmm_rate + nbytes(op) / device.memory_bandwidth,
                2 * macs, moved, kind="graph")


def graph_work(op, device):
    graph = op.graph
    edges = graph.num_edges
    width = row_elements(op)
    item = np.dtype(op.dtype).itemsize
    index = edges * 8
    if isinstance(op, Gather):
        moved = 2 * edges * width * item + index
        return Cost(moved / device.gather_bandwidth, 0, moved, kind="graph")
    if isinstance(op, Aggregate):
        out = nbytes(op)
        touched = edges * width
        moved = touched * item + out + index
        rate = device.spmm_rate if op.reduce in ("sum", "mean") else device.segment_rate
        seconds = touched / rate + out / device.memory_bandwidth
        if op.reduce not in ("sum", "mean"):
            seconds += 2 * touched * item / device.gather_bandwidth   # x[eids] first
        return Cost(seconds, touched, moved, kind="graph")
    # EdgeSoftmax: segment max, shift, exp, segment sum, divide over edges x width.
    touched = edges * width
    edge_bytes = touched * item
    node_bytes = graph.num_nodes * width * item
    seconds = (touched / device.segment_rate + touched / device.spmm_rate
               + 6 * edge_bytes / device.gather_bandwidth
               + 6 * edge_bytes / device.memory_bandwidth
               + 2 * node_bytes / device.memory_bandwidth)
    return Cost(seconds, 5 * touched, 12 * edge_bytes + 2 * node_bytes + 2 * index,
                kind="graph")


def communication(op, topology, rank):
    """Point-to-point exchanges: each peer's rows over its link, one message each;
    all-reduce: a ring, 2(p - 1) messages of 1/p of the tensor."""
    if isinstance(op, AllReduce):
        ranks = op.exchange.size
        if ranks <= 1:
            return Cost(kind="comm")
        chunk = nbytes(op) / ranks
        link = topology.link(rank, (rank + 1) % ranks)
        steps = 2 * (ranks - 1)
        return Cost(link.time(steps * chunk, steps), 0, 0, steps * chunk, kind="comm")
    exchange = op.graph.exchange
    row = row_elements(op) * np.dtype(op.dtype).itemsize
    sends, receives = ((exchange.mirrors_from, exchange.masters_to)
                       if isinstance(op, MirrorReduce)
                       else (exchange.masters_to, exchange.mirrors_from))
    seconds, sent = 0.0, 0
    for peer in sorted(set(sends) | set(receives)):
        out_bytes = len(sends.get(peer, ())) * row
        in_bytes = len(receives.get(peer, ())) * row
        seconds += topology.link(rank, peer).time(max(out_bytes, in_bytes), 1)
        sent += out_bytes
    return Cost(seconds, 0, 0, sent, kind="comm")
