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

A BatchSlot declares its live rows: `live`, a placeholder fed the loaded batch's vertex
count (GraphLoader.live, read from the slot's graph as loaded), past which every row is
padding: the message-passing slot's padding edges join padding rows only (GraphSlot), and
the feature rows as loaded are 0 (fill_rows). Batch norm normalizes over the rows below
it, and the features placeholder of `node_features` declares its rows 0 past it, so that
ngnn.passes.ZeroRowProducts computes every product of a GIN layer over the live rows, from
the first layer's input on. The count is this one fed value, never one derived from the
graph mask: a caller may feed its own mask (a loss over some graphs only), which says
nothing about which rows are zero.
"""
import bisect
import functools
import numbers

import numpy as np

from ngnn.batch import ReadoutGraph, readout_graph
from ngnn.graph import Graph, _readonly
from ngnn.op_graph.op import Attr, Placeholder

from .slot import GraphSlot


class ReadoutSlot(GraphSlot, ReadoutGraph):
    """The readout GraphSlot of a BatchSlot: edge i joins row i to its graph, whatever is
    loaded (padding rows to the padding graphs), so what plans by graph knows it for a
    readout (chunked execution reduces it per row block)."""

    def load_graphs(self, graph_ids, num_graphs, csr, indptrs):
        """Loads the readout block of a batch of `num_graphs` graphs whose vertices'
        graphs are `graph_ids` (batch.readout_graph: edge i goes vertex i -> its graph, in
        both CSR orders already) as load_csr does, into load_csr's `csr` and `indptrs`.
        While the batch has a vertex per graph at least, padding edges too join row i to
        a graph for every row i (a padding graph), so only the destinations and what is
        counted from them differ from batch to batch: the rest is kept, made once."""
        n, rows = graph_ids.shape[0], self.num_nodes
        in_src, out_dst = csr
        out_dst[:n] = graph_ids
        counting, ones = _counting(rows + 1), _ones(rows)
        if n < num_graphs:    # graphs without vertices: padding rows join past the graphs
            in_src[:n] = counting[:n]
            self.load_csr(num_graphs, num_graphs, n, csr, indptrs,
                          lambda: (counting[:n], graph_ids, counting[:n], counting[:n]))
            return
        self._padding_destinations(num_graphs, self.num_dst, rows - n, counting[:rows - n],
                                   out_dst[n:])
        every = counting[:rows]
        self._hold((n, num_graphs, n), every, out_dst, indptrs[0], (counting, ones),
                   lambda: (every, self.out_dst, every, every))


@functools.lru_cache(maxsize=None)
def _counting(size):
    """0, 1, ..., size - 1, read-only: a readout slot's pointers and ids that every batch
    shares."""
    return _readonly(np.arange(size, dtype=np.int64))


@functools.lru_cache(maxsize=None)
def _ones(size):
    return _readonly(np.ones(size, dtype=np.int64))


class SlotRows(Placeholder):
    """A placeholder of a BatchSlot's node rows (BatchSlot.node_features), fed rows that
    are 0 past the slot's live count `live`, as GraphLoader.features is: what
    ngnn.passes.ZeroRowProducts reads of it (`zero_past_live`), where the computation is
    fed `live` too."""
    attributes = (Attr("live", printed=False),)
    zero_past_live = True

    def __init__(self, shape, dtype, live, name=None):
        super().__init__(shape, dtype, name=name)
        self.live = live


class BatchSlot:
    """Room for a batch of up to `num_graphs - 1` graphs with `num_nodes - 1` vertices and
    `num_edges` edges: `graph` (the message-passing GraphSlot) and `readout_graph` (the
    readout GraphSlot), what models and ng.readout take. The last graph row is padding.
    `graph_mask`, a placeholder of one bool per graph row, marks the loaded batch's graphs:
    a training step is fed it (the loader's `mask`) so that the loss leaves the padding
    out. `live`, a (1,) int64 placeholder, is the slot's declared live rows (the module
    docstring): a step is fed the loaded batch's vertex count (the loader's `live`), what
    batch statistics (ng.batch_norm) are taken over."""

    def __init__(self, num_nodes, num_edges, num_graphs):
        import ngnn as ng
        self.num_nodes = num_nodes
        self.num_graphs = num_graphs
        self.graph_mask = ng.placeholder((num_graphs,), dtype=np.bool_, name="graph_mask")
        self.live = ng.placeholder((1,), dtype=np.int64, name="live_rows")
        self.graph = GraphSlot(num_nodes, num_edges, live=self.live)
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

    def node_features(self, width, dtype=np.float32, name="batch_features"):
        """The placeholder of the slot's (num_nodes, width) feature rows, declared 0 past
        `live` (SlotRows): feed it rows as GraphLoader.features holds them."""
        return SlotRows((self.num_nodes, width), dtype, self.live, name=name)

    def __repr__(self):
        return (f"BatchSlot(num_nodes={self.num_nodes}, num_edges={self.graph.num_edges}, "
                f"num_graphs={self.num_graphs}; loaded {self.loaded} graphs)")


def fill_rows(loader, n, ids):
    """Completes the fixed arrays of `loader` (a GraphLoader or a rank's share of one)
    that the compiled step reads, its first `n` feature rows written: the labels of the
    batch's graphs `ids` and its mask; rows and graphs past them read zeros (and a False
    mask), whatever an earlier batch left there."""
    if loader.filled > n:
        loader.features[n:loader.filled] = 0
    loader.filled = n
    m = ids.size
    loader.labels[:m] = loader.dataset.labels[ids]
    loader.labels[m:] = 0
    loader.mask[:m] = True
    loader.mask[m:] = False


class GraphLoader:
    """Batches of up to `batch_size` graphs of `dataset` (a GraphDataset), drawn from
    `indices` (default: every graph), shuffled per epoch by `seed` when `shuffle` (Philox,
    so the same seed and epoch give the same batches on any machine). `slot` holds a batch
    of `slack` times the average batch's vertices and edges (see the module docstring);
    `self_loops` adds one self loop per vertex at load (GCN). A load fills `features`,
    `labels`, `mask` and `live` (the arrays a step is fed for the slot's placeholders)."""

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
        self.live = np.zeros(1, dtype=np.int64)
        self.filled = 0
        self._cut = None if self_loops else _DatasetCut(dataset)
        if self._cut is not None:
            # The arrays the slot's two graphs take as theirs at each load (load_csr):
            # rewritten in place for every batch, never allocated again. The readout block
            # has an edge per row.
            self._csr = (np.zeros((2, self.max_edges), np.int64),
                         np.zeros((2, rows), np.int64))
            self._indptrs = np.zeros((2, 2, rows + 1), np.int64)

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
        # Each batch is the longest run from its start within every limit: bisections of
        # the running totals, Python numbers, so a batch costs no NumPy call.
        nodes = np.concatenate([[0], np.cumsum(sizes)]).tolist()
        links = np.concatenate([[0], np.cumsum(edges)]).tolist()
        batches, start = [], 0
        while start < order.size:
            stop = min(start + self.batch_size,
                       bisect.bisect_right(nodes, nodes[start] + self.max_nodes) - 1,
                       bisect.bisect_right(links, links[start] + self.max_edges) - 1)
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
            self.features[:n] = features
        else:
            n = self._load_cut(ids)
        fill_rows(self, n, ids)
        # The count as the slot's graph holds it, what its padding edges start past.
        self.live[0] = self.slot.graph.loaded[0]

    def _load_cut(self, ids):
        """Loads the batch `ids` into the slot as `BatchSlot.load(dataset.batch(ids))`
        does, edge for edge and in the same CSR orders, but cut out of the whole
        dataset's (`_DatasetCut`) into arrays the loader keeps and rewrites in place
        (GraphSlot.load_csr), instead of building, checking and sorting the batch's
        graph and its readout block again: that was most of a step's host time. Writes
        the batch's feature rows; returns its vertex count."""
        cut, slot, (csr, readout) = self._cut, self.slot, self._csr
        n, e, graphs, back = cut.graphs_of(ids)
        shift, at = cut.csr_into(csr, graphs, back, e)
        slot.graph.load_csr(n, n, e, csr, self._indptrs[0],
                            lambda: cut.edges_at(at, shift))
        slot.readout_graph.load_graphs(cut.graph_ids(graphs), ids.size, readout,
                                       self._indptrs[1])
        slot.loaded = ids.size
        # Indices in range by construction: mode="clip" writes into `out` directly, where
        # the default ("raise") takes into a temporary first.
        self.dataset.features.take(cut.nodes(graphs, back, n), axis=0,
                                   out=self.features[:n], mode="clip")
        return n


class _DatasetCut:
    """What GraphLoader cuts a batch out of, once per dataset, its vertices numbered
    across the dataset as GraphDataset.batch numbers them within a batch: `csr`, one row
    per edge of the dataset's in-CSR order's source and out-CSR order's destination
    (stable orders); `edges`, one row per edge (edge ids as in dataset.src) of its
    source, destination, and edge ids in in-CSR and out-CSR order; `graphs`, one row per
    graph of its end vertex, end edge, vertex count and edge count. A graph's edges end
    in its own vertices, so they hold one run of each CSR order: a batch's rows of each
    table are its graphs' runs, renumbered."""

    def __init__(self, dataset):
        shift = np.repeat(dataset.node_offsets[:-1], dataset.edge_counts)
        src, dst = dataset.src + shift, dataset.dst + shift
        everything = Graph(src, dst, int(dataset.node_offsets[-1]))
        self.csr = np.stack([everything.in_src, everything.out_dst], axis=1).astype(np.int64)
        self.edges = np.stack([src, dst, everything.in_eids, everything.out_eids],
                              axis=1).astype(np.int64)
        self.graphs = np.stack([dataset.node_offsets[1:], dataset.edge_offsets[1:],
                                dataset.graph_sizes, dataset.edge_counts],
                               axis=1).astype(np.int64)
        # 0, 1, 2, ...: the ids a batch's vertices, edges and graphs count up from.
        self.counting = np.arange(max(len(self.edges), len(self.graphs),
                                      int(dataset.node_offsets[-1])), dtype=np.int64)

    def graphs_of(self, ids):
        """(vertex count, edge count, the `graphs` rows of `ids`, and per graph its
        [vertex, edge] offset in the dataset less its offset in the batch: what
        renumbers its vertices and edges from the dataset to the batch)."""
        graphs = self.graphs.take(ids, axis=0)
        ends = graphs[:, 2:].cumsum(axis=0)
        n, e = ends[-1].tolist() if ids.size else (0, 0)
        return n, e, graphs, np.subtract(graphs[:, :2], ends, out=ends)

    def csr_into(self, csr, graphs, back, e):
        """Writes the batch's `e` edges' in_src and out_dst (its graphs' runs of `csr`,
        renumbered) into the first columns of `csr`; returns (per edge, its graph's
        [vertex, edge] renumbering; the rows of the dataset's tables the batch's edges
        are cut from)."""
        shift = back.repeat(graphs[:, 3], axis=0)
        at = self.counting[:e] + shift[:, 1]
        np.subtract(self.csr.take(at, axis=0).T, shift[:, 0], out=csr[:, :e])
        return shift, at

    def edges_at(self, at, shift):
        """The batch's (src, dst, in_eids, out_eids) from its rows `at` of `edges`,
        renumbered by `shift` (what csr_into returned)."""
        edges = self.edges.take(at, axis=0)
        edges -= np.repeat(shift, 2, axis=1)
        return tuple(np.ascontiguousarray(edges.T))

    def graph_ids(self, graphs):
        """Each vertex's graph in the batch."""
        return self.counting[:graphs.shape[0]].repeat(graphs[:, 2])

    def nodes(self, graphs, back, n):
        """The batch's `n` vertices' ids in the dataset."""
        return self.counting[:n] + back[:, 0].repeat(graphs[:, 2])

    def batch(self, ids):
        """The batch of graphs `ids` as dataset.batch(ids) numbers it, cut out of the
        dataset's: (its vertex count, its edges' (src, dst, in_eids, out_eids), each
        vertex's graph in the batch, each vertex's dataset-wide id)."""
        n, e, graphs, back = self.graphs_of(ids)
        shift = back.repeat(graphs[:, 3], axis=0)
        edges = self.edges_at(self.counting[:e] + shift[:, 1], shift)
        return n, edges, self.graph_ids(graphs), self.nodes(graphs, back, n)
