"""One compiled program for every minibatch: a model's computations over GraphSlots.

The slots are sized for the worst batch the sampler can produce (`capacities`), so the
training step and the sampled evaluation are generated once, on the first batch, and each
later batch only loads its blocks into the slots and its rows into the input buffers.
With `row_prefix` (the default) layer i's slot has the rows layer i computes; without it
every layer computes every row of the batch (the baseline benchmarks/bench_minibatch.py
measures the prefix against).
"""
import numpy as np
import scipy.sparse as sp

import ngnn as ng
from ngnn.graph import Graph
from ngnn.op_graph import seed_dropout

from .slot import GraphSlot


def capacities(g, fanouts, batch_size, self_loops=False):
    """Worst-case (rows read, rows computed, edges) of each layer's block, first to last,
    for batches of at most `batch_size` seeds of `g` sampled with `fanouts`, plus one spare
    row on each side for padding edges.

    A layer computing r rows samples at most the r largest of min(in-degree, fanout) edges;
    each row it adds is the source of one of them, and every row of a batch is a seed or the
    source of some edge of g. On power-law graphs these bounds are well below r * fanout
    edges and N rows (R-MAT 100K, [15, 10, 5]: 416,000 edges instead of 1,014,000 in the
    first layer, 63,000 rows instead of 100,000)."""
    ever_sampled = min(g.num_nodes, batch_size + int(np.count_nonzero(g.out_degrees)))
    computed = min(batch_size, g.num_nodes)
    sizes = []
    for fanout in reversed(fanouts):
        per_vertex = g.in_degrees if fanout is None else np.minimum(g.in_degrees, fanout)
        largest = np.cumsum(np.sort(per_vertex)[::-1])
        edges = int(largest[computed - 1]) if computed else 0
        read = min(computed + edges, ever_sampled)
        sizes.append((read + 1, computed + 1, edges + (computed if self_loops else 0)))
        computed = read
    return sizes[::-1]


def relation_capacities(g, edges):
    """The edges of each relation a block of at most `edges` edges of the typed graph `g`
    can hold: as many as it holds in all, or as g has of that relation."""
    return np.minimum(np.bincount(g.edge_type, minlength=g.num_relations), edges)


def with_block_self_loops(block):
    """The block with its sampled self loops dropped and one loop per destination row added
    at the end of its in-edges (kept grouped by destination, as the sampler leaves them)."""
    keep = block.src != block.dst
    src, dst = block.src[keep], block.dst[keep]
    rows = np.arange(block.num_dst)
    counts = np.bincount(dst, minlength=block.num_dst)
    ends = np.cumsum(counts)
    new_src = np.empty(src.size + block.num_dst, dtype=np.int64)
    new_dst = np.empty_like(new_src)
    # An edge of row r moves down by the r loops inserted before it; row r's loop goes
    # right after its last edge.
    moved = np.arange(src.size) + dst
    new_src[moved], new_dst[moved] = src, dst
    loops = ends + rows
    new_src[loops], new_dst[loops] = rows, rows
    return Graph(new_src, new_dst, block.num_nodes, block.num_dst)


def every_row(block, rows):
    """The block widened so that it computes all `rows` rows (no row prefix)."""
    types = {} if block.edge_type is None else dict(edge_type=block.edge_type,
                                                     num_relations=block.num_relations)
    return Graph(block.src, block.dst, rows, rows, **types)


class MinibatchProgram:
    """`model`'s computations on `transformer` for batches of at most `batch_size` seeds of
    `g` drawn with `fanouts`: `train_step(batch)` (with `optimizer`) returns the loss and
    `logits(batch)` the seeds' logits (without optimizer). `num_features` is the input
    width; `seed` picks the dropout masks. With `sparse` the batch's rows are fed as a CSR
    matrix (the trainer feeds its features sparse): featureless entities' one-hot rows
    (R-GCN on RDF graphs, thousands of columns) then make the first layer's product a
    lookup of weight rows, as on the whole graph, instead of a dense product over every
    column."""

    def __init__(self, model, g, num_features, fanouts, batch_size, transformer,
                 optimizer=None, row_prefix=True, seed=0, dtype=np.float32, sparse=False):
        self.model = model
        self.transformer = transformer
        self.row_prefix = row_prefix
        self.self_loops = model.self_loops
        sizes = capacities(g, fanouts, batch_size, self.self_loops)
        if not row_prefix:
            sizes = [(sizes[0][0], sizes[0][0], edges) for _, _, edges in sizes]
        typed = g.edge_type is not None
        self.slots = [GraphSlot(read, edges, computed,
                                relation_capacities(g, edges) if typed else None)
                      for read, computed, edges in sizes]
        rows_in, rows_out = self.slots[0].num_nodes, self.slots[-1].num_dst
        self.sparse = sparse
        self.x = ng.placeholder((rows_in, num_features), dtype=dtype, name="batch_features",
                                sparse=sparse)
        self.y = ng.placeholder((rows_out,), dtype=np.int64, name="batch_labels")
        self.mask = ng.placeholder((rows_out,), dtype=np.bool_, name="batch_mask")
        self.features = sp.csr_matrix((rows_in, num_features), dtype=dtype) if sparse else \
            np.zeros((rows_in, num_features), dtype=dtype)
        self.labels = np.zeros(rows_out, dtype=np.int64)
        self.seed_mask = np.zeros(rows_out, dtype=np.bool_)
        self.filled = 0            # feature rows holding the previous batch
        self.train_step = self.evaluate = None
        if optimizer is not None:
            self.loss = ng.cross_entropy(model(self.slots, self.x, training=True), self.y,
                                         self.mask)
            updates = optimizer.updates(self.loss)
            seed_dropout([self.loss] + updates, seed)
            self.train_step = transformer.computation([self.loss], self.x, self.y, self.mask,
                                                      updates=updates, name="minibatch_step")
        else:
            self.evaluate = transformer.computation(model(self.slots, self.x, training=False),
                                                    self.x, name="minibatch_evaluate")

    def load(self, batch, features, labels=None):
        """Copies a batch's blocks into the slots and its rows into the input buffers."""
        rows = len(batch.nodes)
        for slot, block in zip(self.slots, batch.graphs):
            if self.self_loops:
                block = with_block_self_loops(block)
            if not self.row_prefix:
                block = every_row(block, rows)
            slot.load(block)
        picked = features[batch.nodes]
        if self.sparse:             # padding rows are empty rows of the CSR
            picked = sp.csr_matrix(picked, dtype=self.features.dtype)
            indptr = np.concatenate([picked.indptr, np.full(self.features.shape[0] - rows,
                                                            picked.indptr[-1])])
            self.features = sp.csr_matrix((picked.data, picked.indices, indptr),
                                          shape=self.features.shape)
        else:
            self.features[:rows] = picked.toarray() if sp.issparse(picked) else picked
            if self.filled > rows:      # padding rows read as zeros, whatever came before
                self.features[rows:self.filled] = 0
        self.filled = rows
        seeds = batch.num_seeds
        self.seed_mask[:] = False
        self.seed_mask[:seeds] = True
        if labels is not None:
            self.labels[:] = 0
            self.labels[:seeds] = labels[batch.nodes[:seeds]]

    def step(self, batch, features, labels):
        """One optimizer step on `batch`; returns its loss."""
        self.load(batch, features, labels)
        return float(self.train_step(self.features, self.labels, self.seed_mask)[0])

    def logits(self, batch, features):
        """The logits of the batch's seeds (no dropout)."""
        self.load(batch, features)
        return self.evaluate(self.features)[:batch.num_seeds]
