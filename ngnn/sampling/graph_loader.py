"""Minibatches of whole graphs, compiled once: GraphLoader and BatchSlot.

A batch of graphs is one block-diagonal graph (Graph.batch) and its readout block; both
change size from batch to batch. A BatchSlot holds a GraphSlot for each, sized for the
largest batch the loader can draw (the batch_size largest graphs together), so a
computation built over the slot serves every batch: loading a batch replaces the slots'
edges and fills the input rows, and nothing is generated again (seed 004: allocate for the
worst case). The spare rows are padding: their edges join padding rows only, and the
readout block sends them to one padding graph, the last row of every readout, which the
loss masks out.
"""
import numbers

import numpy as np

from ngnn.batch import readout_graph

from .slot import GraphSlot


class BatchSlot:
    """Room for a batch of up to `num_graphs - 1` graphs with `num_nodes - 1` vertices and
    `num_edges` edges: `graph` (the message-passing GraphSlot) and `readout_graph` (the
    readout GraphSlot), what models and ng.readout take. The last graph row is padding."""

    def __init__(self, num_nodes, num_edges, num_graphs):
        self.num_nodes = num_nodes
        self.num_graphs = num_graphs
        self.graph = GraphSlot(num_nodes, num_edges)
        self.readout_graph = GraphSlot(num_nodes, num_nodes, num_dst=num_graphs)
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


class GraphLoader:
    """Batches of `batch_size` graphs of `dataset` (a GraphDataset), drawn from `indices`
    (default: every graph), shuffled per epoch by `seed` when `shuffle` (Philox, so the
    same seed and epoch give the same batches on any machine). `slot` is sized for every
    batch this loader can give; `self_loops` adds one self loop per vertex at load (GCN)."""

    def __init__(self, dataset, indices=None, batch_size=32, shuffle=True, seed=0,
                 self_loops=False):
        if isinstance(batch_size, bool) or not isinstance(batch_size, numbers.Integral) or \
                batch_size < 1:
            raise ValueError(f"GraphLoader: batch_size must be a positive int, got "
                             f"{batch_size!r}")
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
        nodes = int(np.sort(dataset.graph_sizes[self.indices])[::-1][:b].sum())
        edges = int(np.sort(dataset.edge_counts[self.indices])[::-1][:b].sum())
        if self_loops:
            edges += nodes
        rows = max(nodes, b) + 1
        self.slot = BatchSlot(rows, edges, b + 1)
        self.features = np.zeros((rows, dataset.num_features), dtype=np.float32)
        self.labels = np.zeros(b + 1, dtype=np.int64)
        self.mask = np.zeros(b + 1, dtype=np.bool_)
        self.filled = 0

    def __len__(self):
        return -(-self.indices.size // self.batch_size)

    def order(self, epoch, indices=None):
        """The graph ids of `epoch` in the order they are batched: of `indices` (a subset
        of the loader's, such as one cross-validation fold), default the loader's."""
        indices = self.indices if indices is None else np.asarray(indices, dtype=np.int64)
        if not self.shuffle:
            return indices
        rng = np.random.Generator(np.random.Philox(key=[self.seed, epoch]))
        return indices[rng.permutation(indices.size)]

    def batches(self, epoch=0):
        """Yields the graph ids of each batch of `epoch`, having loaded the batch into
        `slot`, `features`, `labels` and `mask` (the real graphs' rows)."""
        order = self.order(epoch)
        for start in range(0, order.size, self.batch_size):
            ids = order[start:start + self.batch_size]
            self.load(ids)
            yield ids

    def load(self, ids):
        batch, features = self.dataset.batch(ids)
        self.slot.load(batch, self.self_loops)
        n = batch.num_nodes
        self.features[:n] = features
        if self.filled > n:           # padding rows read zeros, whatever came before
            self.features[n:self.filled] = 0
        self.filled = n
        self.labels[:] = 0
        self.labels[:ids.size] = self.dataset.labels[ids]
        self.mask[:] = False
        self.mask[:ids.size] = True
