"""Many graphs as one: `Graph.batch` and the readout (a per-graph reduction over nodes).

`Graph.batch([g1, g2, ...])` renumbers the graphs' vertices into consecutive ranges and
concatenates their edges, so the result is one block-diagonal graph: every layer, pass and
transformer runs on it unchanged, and no message crosses from one graph to another.

A readout reduces the node rows of each graph to one row. It is not a new op: it is an
aggregation over the *readout graph* R of the batch, a block with an edge from every node i
to its graph: `src = i`, `dst = graph_ids[i]`, `num_dst = num_graphs`. So

    readout(h) = Aggregate(Gather(h, R, by="src"), R, at="dst")[:num_graphs]

and it inherits from Aggregate and Gather their gradients (sum: a gather; mean: a gather
of the scaled gradient; max: the gradient to the maximal node, ties sharing it), their
kernels on both transformers, their fusion (the gather and the aggregation make one group;
downstream element-wise ops join it), and, where the readout graph is a GraphSlot, the
replacement of its edges between calls. The row cut `[:num_graphs]` is the same row prefix
a minibatch block's aggregation is cut to.
"""
import functools

import numpy as np

from ngnn.graph import Graph

READOUTS = ("sum", "mean", "max")


class BatchedGraph(Graph):
    """A block-diagonal union of graphs (``Graph.batch``). Graph k's vertices are rows
    ``node_offsets[k]:node_offsets[k + 1]`` and its edges positions
    ``edge_offsets[k]:edge_offsets[k + 1]``, in their original order; ``graph_ids`` (N,)
    names each vertex's graph."""

    def __init__(self, graphs):
        graphs = list(graphs)
        if not graphs:
            raise ValueError("Graph.batch: needs at least one graph, got an empty list")
        for i, g in enumerate(graphs):
            if not isinstance(g, Graph):
                raise TypeError(f"Graph.batch: item {i} is {type(g).__name__}, not an ng.Graph")
            if g.is_block or g.varies:
                raise ValueError(f"Graph.batch: item {i} is {g!r}, a block or slot; batch "
                                 "whole graphs")
        nodes = np.array([g.num_nodes for g in graphs], dtype=np.int64)
        edges = np.array([g.num_edges for g in graphs], dtype=np.int64)
        node_offsets = np.zeros(len(graphs) + 1, dtype=np.int64)
        edge_offsets = np.zeros(len(graphs) + 1, dtype=np.int64)
        np.cumsum(nodes, out=node_offsets[1:])
        np.cumsum(edges, out=edge_offsets[1:])
        shift = np.repeat(node_offsets[:-1], edges)
        src = np.concatenate([g.src for g in graphs]) + shift
        dst = np.concatenate([g.dst for g in graphs]) + shift
        super().__init__(src, dst, int(node_offsets[-1]))
        self._set_batch(node_offsets, edge_offsets)

    @classmethod
    def from_arrays(cls, src, dst, node_offsets, edge_offsets):
        """The batch with edges `src -> dst` (batch-wide vertex ids) and graph k owning
        vertices node_offsets[k]:node_offsets[k + 1] and edges edge_offsets[k]:...[k + 1]
        (as GraphDataset.batch cuts them, without a Graph per item)."""
        batch = cls.__new__(cls)
        Graph.__init__(batch, src, dst, int(node_offsets[-1]))
        batch._set_batch(np.asarray(node_offsets, dtype=np.int64),
                         np.asarray(edge_offsets, dtype=np.int64))
        return batch

    def _set_batch(self, node_offsets, edge_offsets):
        self.num_graphs = int(node_offsets.shape[0] - 1)
        self.node_offsets = _readonly(node_offsets)
        self.edge_offsets = _readonly(edge_offsets)
        self.graph_ids = _readonly(np.repeat(np.arange(self.num_graphs, dtype=np.int64),
                                             np.diff(node_offsets)))

    @property
    def graph_sizes(self):
        """Vertices of each graph, (num_graphs,)."""
        return np.diff(self.node_offsets)

    def unbatch(self):
        """The graphs again, each with its own vertex numbering and edge order."""
        out = []
        for k in range(self.num_graphs):
            lo, hi = self.edge_offsets[k], self.edge_offsets[k + 1]
            first = self.node_offsets[k]
            out.append(Graph(self.src[lo:hi] - first, self.dst[lo:hi] - first,
                             int(self.node_offsets[k + 1] - first)))
        return out

    @functools.cached_property
    def readout_graph(self):
        """The block R over which `readout` aggregates: edge i goes node i -> graph_ids[i]."""
        return readout_graph(self.graph_ids, self.num_graphs)

    def __repr__(self):
        return (f"BatchedGraph(num_graphs={self.num_graphs}, num_nodes={self.num_nodes}, "
                f"num_edges={self.num_edges})")


def _readonly(array):
    array.flags.writeable = False
    return array


class ReadoutGraph(Graph):
    """The readout block of a batch (see the module doc). Its own class so that what plans
    by graph knows a readout when it meets one: chunked execution (ngnn.out_of_core) runs
    an aggregation over it as a per-graph reduction of row blocks, not over edge chunks."""


def readout_graph(graph_ids, num_graphs):
    """The readout block of a batch: vertex rows max(N, num_graphs) (a batch with empty
    graphs can have fewer nodes than graphs), num_dst = num_graphs, edge i: i -> graph_ids[i]."""
    n = graph_ids.shape[0]
    return ReadoutGraph(np.arange(n, dtype=np.int64), graph_ids, max(n, num_graphs),
                        num_graphs)


def readout(h, batch, reduce="sum"):
    """(num_graphs,) + h.shape[1:]: the sum, mean or max of the node rows of each graph of
    `batch` (a BatchedGraph, or a loader's slot of batches). A graph without nodes reads out
    0 for every reduction, with a zero gradient."""
    import ngnn as ng
    from ngnn.op_graph import Aggregate, Gather, ShapeError
    from ngnn.op_graph.op import as_ops

    if reduce not in READOUTS:
        raise ValueError(f"readout: reduce must be one of {READOUTS}, got {reduce!r}")
    g = getattr(batch, "readout_graph", None)
    if g is None:
        raise TypeError(f"readout: expected a batch of graphs (ng.Graph.batch([...]) or a "
                        f"GraphLoader's slot), got {batch!r}")
    (h,) = as_ops(h)
    rows = batch.num_nodes
    if h.ndim == 0 or h.shape[0] != rows:
        raise ShapeError(f"readout: expected a node tensor with {rows} rows (one per vertex "
                         f"of the batch), got shape {h.shape}")
    if g.num_nodes > rows:      # more graphs than nodes: the empty graphs' rows read zeros
        h = ng.concat([h, ng.constant(np.zeros((g.num_nodes - rows,) + h.shape[1:]),
                                      dtype=h.dtype)], axis=0)
    pooled = Aggregate(Gather(h, g, by="src"), g, at="dst", reduce=reduce)
    return pooled if g.num_nodes == g.num_dst else pooled[:g.num_dst]
