"""Minibatches of whole graphs, compiled once: GraphLoader and BatchSlot.

A batch of graphs is one block-diagonal graph (Graph.batch) and its readout block; both
change size from batch to batch. A BatchSlot holds a GraphSlot for each, of fixed sizes, so
a computation built over the slot serves every batch: loading a batch replaces the slots'
edges and fills the input rows, and nothing is generated again (seed 004: allocate once
instead of per batch). The spare rows are padding: their edges join padding rows only, and
the readout block sends them to one padding graph, the last row of every readout, which
the loss masks out.

Every row of the slot costs a step its dense work whether it holds a vertex or padding, so
the slot is not sized for the worst batch (the batch_size largest graphs together: 3 to 6
times an average batch of the TU datasets) but for `slack` times the average batch, and
at least the largest graph. A batch that would overflow it is cut short and the graphs
left over start the next batch, so every graph is still seen once per epoch, in the
shuffled order; `slack=None` sizes the slot for the worst batch instead, and no batch is
ever cut.
"""
import numbers

import numpy as np

from ngnn.batch import ReadoutGraph, readout_graph
from ngnn.graph import Graph

from .slot import GraphSlot


class ReadoutSlot(GraphSlot, ReadoutGraph):
    """The readout GraphSlot of a BatchSlot: edge i joins row i to its graph, whatever is
    loaded (padding rows to the padding graphs), so what plans by graph knows it for a
    readout (chunked execution reduces it per row block)."""


class BatchSlot:
    """Room for a batch of up to `num_graphs - 1` graphs with `num_nodes - 1` vertices and
    `num_edges` edges: `graph` (the message-passing GraphSlot) and `readout_graph` (the
    readout GraphSlot), what models and ng.readout take. The last graph row is padding.
    `graph_mask`, a placeholder of one bool per graph row, marks the loaded batch's graphs:
    a training step is fed it (the loader's `mask`) so that the loss and batch statistics
    (ng.batch_norm) leave the padding out."""

    def __init__(self, num_nodes, num_edges, num_graphs):
        import ngnn as ng
        self.num_nodes = num_nodes
        self.num_graphs = num_graphs
        self.graph_mask = ng.placeholder((num_graphs,), dtype=np.bool_, name="graph_mask")
        self.graph = GraphSlot(num_nodes, num_edges)
        self.readout_graph = ReadoutSlot(num_nodes, num_nodes, num_dst=num_graphs)
        self.loaded = 0           # graphs of the loaded batch

    def load(self, batch, self_loops=False):
        """Loads a BatchedGraph (with one self loop per vertex added when `self_loops`)."""
        if batch.num_graphs >= self.num_graphs:
            raise ValueError(f"BatchSlot.load: {batch.num_graphs} graphs do not fit this "
                             f"slot (at most {self.num_graphs - 1})")
        self.graph.load(batch.with_self_loops() if self_loops else batch)
        self.readout_graph.load(readout_graph(batch.graph_ids, batch.num_graphs))
        self.loaded = batch.num_graphs

    def __repr__(self):
        return (f"BatchSlot(num_nodes={self.num_nodes}, num_edges={self.graph.num_edges}, "
                f"num_graphs={self.num_graphs}; loaded {self.loaded} graphs)")


def fill_rows(loader, n, features, ids):
    """Writes a batch's `n` feature rows and the labels of its graphs `ids` into the fixed
    arrays of `loader` (a GraphLoader or a rank's share of one) that the compiled step
    reads; rows and graphs past them read zeros (and a False mask), whatever an earlier
    batch left there."""
    loader.features[:n] = features
    if loader.filled > n:
        loader.features[n:loader.filled] = 0
    loader.filled = n
    loader.labels[:] = 0
    loader.labels[:ids.size] = loader.dataset.labels[ids]
    loader.mask[:] = False
    loader.mask[:ids.size] = True


class GraphLoader:
    """Batches of up to `batch_size` graphs of `dataset` (a GraphDataset), drawn from
    `indices` (default: every graph), shuffled per epoch by `seed` when `shuffle` (Philox,
    so the same seed and epoch give the same batches on any machine). `slot` holds a batch
    of `slack` times the average batch's vertices and edges (see the module docstring);
    `self_loops` adds one self loop per vertex at load (GCN)."""

    def __init__(self, dataset, indices=None, batch_size=32, shuffle=True, seed=0,
                 self_loops=False, slack=1.25):
        if isinstance(batch_size, bool) or not isinstance(batch_size, numbers.Integral) or \
                batch_size < 1:
            raise ValueError(f"GraphLoader: batch_size must be a positive int, got "
                             f"{batch_size!r}")
        if slack is not None and not (isinstance(slack, numbers.Real) and slack >= 1):
            raise ValueError(f"GraphLoader: slack must be a number >= 1 or None, got {slack!r}")
        self.dataset = dataset
        self.indices = np.arange(dataset.num_graphs) if indices is None else \
            np.asarray(indices, dtype=np.int64)
        if self.indices.ndim != 1 or not self.indices.size:
            raise ValueError("GraphLoader: indices must be a non-empty 1-D array of graph ids")
        bad = np.flatnonzero((self.indices < 0) | (self.indices >= dataset.num_graphs))
        if bad.size:
            raise ValueError(f"GraphLoader: index {self.indices[bad[0]]} is out of range "
                             f"[0, {dataset.num_graphs})")
        self.batch_size = int(min(batch_size, self.indices.size))
        self.shuffle, self.seed, self.self_loops = shuffle, seed, self_loops
        b = self.batch_size
        sizes = dataset.graph_sizes[self.indices]
        edges = dataset.edge_counts[self.indices] + (sizes if self_loops else 0)
        self.max_nodes, self.max_edges = (
            int(np.sort(counts)[::-1][:b].sum()) if slack is None else
            max(int(np.ceil(slack * b * counts.mean())), int(counts.max()))
            for counts in (sizes, edges))
        rows = max(self.max_nodes, b) + 1
        self.slot = BatchSlot(rows, self.max_edges, b + 1)
        self.features = np.zeros((rows, dataset.num_features), dtype=np.float32)
        self.labels = np.zeros(b + 1, dtype=np.int64)
        self.mask = np.zeros(b + 1, dtype=np.bool_)
        self.filled = 0
        self._cut = None if self_loops else _DatasetCut(dataset)
        # 0, 1, 2, ...: the ids a batch's vertices, edges and graphs count up from.
        self._counting = np.arange(max(rows, self.max_edges), dtype=np.int64)

    def order(self, epoch, indices=None):
        """The graph ids of `epoch` in the order they are batched: of `indices` (a subset
        of the loader's, such as one cross-validation fold), default the loader's."""
        indices = self.indices if indices is None else np.asarray(indices, dtype=np.int64)
        if not self.shuffle:
            return indices
        rng = np.random.Generator(np.random.Philox(key=[self.seed, epoch]))
        return indices[rng.permutation(indices.size)]

    def split(self, order):
        """`order` cut into consecutive batches of at most batch_size graphs that fit the
        slot (a batch ends early where the next graph would overflow it)."""
        sizes = self.dataset.graph_sizes[order]
        edges = self.dataset.edge_counts[order] + (sizes if self.self_loops else 0)
        if sizes.max(initial=0) > self.max_nodes or edges.max(initial=0) > self.max_edges:
            k = int(np.flatnonzero((sizes > self.max_nodes) | (edges > self.max_edges))[0])
            raise ValueError(f"GraphLoader: graph {order[k]} ({sizes[k]} nodes, {edges[k]} "
                             f"edges) does not fit the slot ({self.max_nodes} nodes, "
                             f"{self.max_edges} edges); build the loader over indices that "
                             "include it")
        batches, start = [], 0
        while start < order.size:
            # The longest run from `start` within every limit: cumulative sums, no loop
            # over graphs.
            stop = min(start + self.batch_size, order.size)
            nodes = np.cumsum(sizes[start:stop])
            links = np.cumsum(edges[start:stop])
            stop = start + int(np.count_nonzero((nodes <= self.max_nodes) &
                                                (links <= self.max_edges)))
            batches.append(order[start:stop])
            start = stop
        return batches

    def batches(self, epoch=0, indices=None):
        """Yields the graph ids of each batch of `epoch` (of `indices`, default the
        loader's), having loaded the batch into `slot`, `features`, `labels` and `mask`
        (the real graphs' rows)."""
        for ids in self.split(self.order(epoch, indices)):
            self.load(ids)
            yield ids

    def __len__(self):
        return len(self.split(self.order(0)))

    def load(self, ids):
        ids = np.asarray(ids, dtype=np.int64)
        if self._cut is None:
            batch, features = self.dataset.batch(ids)
            self.slot.load(batch, self.self_loops)
            n = batch.num_nodes
        else:
            n, features = self._load_cut(ids)
        fill_rows(self, n, features, ids)

    def _load_cut(self, ids):
        """Loads the batch `ids` into the slot as `BatchSlot.load(dataset.batch(ids))`
        does, edge for edge and in the same CSR orders, but cut out of the whole
        dataset's (`_DatasetCut`) instead of building, checking and sorting the batch's
        graph and its readout block again: that was most of a step's host time. Returns
        (vertices, their feature rows)."""
        n, edges, graph_ids, nodes = self._cut.batch(ids)
        slot = self.slot
        slot.graph.load_grouped(edges[:, 0], edges[:, 1], n, n, edges[:, 2], edges[:, 3])
        # The readout block (batch.readout_graph): edge i goes vertex i -> its graph, in
        # both CSR orders already.
        slot.readout_graph.load_grouped(self._counting[:n], graph_ids, max(n, ids.size),
                                        ids.size, None, None)
        slot.loaded = ids.size
        return n, np.take(self.dataset.features, nodes, axis=0)


class _DatasetCut:
    """What GraphLoader cuts a batch out of, once per dataset: `table`, one row per edge
    (edge ids as in dataset.src): [source, destination] vertices numbered across the
    dataset as GraphDataset.batch numbers them within a batch, then the edge ids grouped
    by destination and by source vertex, stably (the whole dataset's CSR orders); per
    graph, `offsets` and `amounts`, its first and its count of [vertex, vertex, edge,
    edge], the units of the table's columns."""

    def __init__(self, dataset):
        shift = np.repeat(dataset.node_offsets[:-1], dataset.edge_counts)
        src, dst = dataset.src + shift, dataset.dst + shift
        everything = Graph(src, dst, int(dataset.node_offsets[-1]))
        self.table = np.stack([src, dst, everything.in_eids, everything.out_eids],
                              axis=1).astype(np.int64)
        nodes, edges = dataset.node_offsets[:-1], dataset.edge_offsets[:-1]
        self.offsets = np.stack([nodes, nodes, edges, edges], axis=1).astype(np.int64)
        sizes, counts = dataset.graph_sizes, dataset.edge_counts
        self.amounts = np.stack([sizes, sizes, counts, counts], axis=1).astype(np.int64)
        # 0, 1, 2, ...: the ids a batch's vertices, edges and graphs count up from.
        self.counting = np.arange(max(len(self.table), len(sizes), int(sizes.sum())),
                                  dtype=np.int64)

    def batch(self, ids):
        """The batch of graphs `ids` as dataset.batch(ids) numbers it, cut out of the
        table: (its vertex count, its table rows renumbered to the batch's vertex and
        edge ids, each vertex's graph in the batch, each vertex's dataset-wide id)."""
        # Per graph, [vertex, vertex, edge, edge] offsets: the dataset's minus the batch's,
        # what renumbers each of the table's columns from the dataset to the batch.
        amounts = self.amounts[ids]
        ends = np.cumsum(amounts, axis=0)
        back = self.offsets[ids] - ends + amounts
        n, e = (int(ends[-1, 0]), int(ends[-1, 2])) if ids.size else (0, 0)
        # A graph's edges end in its own vertices, so its edges hold one run of each
        # dataset-wide CSR order: the run, renumbered to the batch's vertex and edge ids.
        edge_back = np.repeat(back, amounts[:, 2], axis=0)
        # np.take: several times as fast as indexing with an array, for the same rows.
        edges = np.take(self.table, self.counting[:e] + edge_back[:, 3], axis=0)
        edges -= edge_back
        graph_ids = np.repeat(self.counting[:ids.size], amounts[:, 0])
        nodes = self.counting[:n] + np.repeat(back[:, 0], amounts[:, 0])
        return n, edges, graph_ids, nodes
