"""Neighbour sampling: the k-hop subgraph of a minibatch's seed vertices (seed 004).

    sampler = NeighborSampler(g, fanouts=[25, 10], seed=0)
    batch = sampler.sample(seed_nodes, epoch=0, index=0)

`fanouts[i]` is the number of in-edges sampled, uniformly without replacement, for every
vertex layer i computes (None or -1: all of them); layers are listed first to last, as in
the GraphSAGE paper and DGL (PyG's `num_neighbors` lists hops from the seeds outward, the
reverse). Sampling starts at the last layer: its rows are the seeds, and the sources of
their sampled in-edges that are new become hop 1; the layer before it samples in-edges for
the seeds and hop 1, and so on. `batch.nodes` lists the seeds, then hop 1, hop 2, ... (each
hop sorted by global id), so every layer computes a prefix of the rows of the layer before.

Every random number is Philox (ngnn.philox) at a counter made of the epoch and layer (the
stream), the batch index, the vertex's row in the batch and the draw, so a batch is a pure
function of (seed, epoch, batch index): the same for any backend or thread count.
Choosing k of d in-edges uses Floyd's algorithm, k rounds that each draw one number per
vertex, vectorized over the vertices: the work is O(vertices * k^2) whatever the degrees.
"""
import numbers

import numpy as np

from ngnn import philox
from ngnn.graph import Graph

# The Philox stream of a draw is epoch * STREAMS_PER_EPOCH + layer, the last one of an
# epoch's streams shuffles its seeds; the position is (batch index << INDEX_SHIFT) + the
# vertex's row in the batch * fanout + the draw.
STREAMS_PER_EPOCH = 16
SHUFFLE_STREAM = STREAMS_PER_EPOCH - 1
INDEX_SHIFT = 40


class Batch:
    """One sampled minibatch: `nodes` (global ids: seeds, hop 1, hop 2, ...), `layer_rows`
    (rows each layer computes, first to last), `graphs` (one block per layer: layer i reads
    `graphs[i].num_nodes` rows and computes the first `graphs[i].num_dst` of them) and
    `edge_ids` (per layer, the global id of each sampled edge, in the block's edge order)."""

    def __init__(self, nodes, graphs, edge_ids):
        self.nodes = nodes
        self.graphs = graphs
        self.edge_ids = edge_ids
        self.layer_rows = [g.num_dst for g in graphs]

    @property
    def num_seeds(self):
        return self.layer_rows[-1]

    @property
    def num_sampled_edges(self):
        return sum(g.num_edges for g in self.graphs)

    def __repr__(self):
        return (f"Batch({len(self.nodes)} nodes, layer_rows={self.layer_rows}, "
                f"{self.num_sampled_edges} sampled edges)")


def _fanout(value, i):
    if value is None or (isinstance(value, numbers.Integral) and not isinstance(value, bool)
                         and value == -1):
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"fanouts[{i}] must be a positive int, or -1 / None for every "
                         f"in-edge, got {value!r}")
    return int(value)


def _check_counter(name, value, limit):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or \
            not 0 <= value < limit:
        raise ValueError(f"{name} must be an int in [0, {limit}), got {value!r}")
    return int(value)


class NeighborSampler:
    """Samples k-hop blocks of `g` (an ng.Graph) for minibatches; see the module docstring."""

    def __init__(self, g, fanouts, seed=0):
        if not isinstance(g, Graph):
            raise TypeError(f"NeighborSampler: expected an ng.Graph, got {g!r}")
        if isinstance(fanouts, (str, bytes)) or not hasattr(fanouts, "__len__") or \
                not 1 <= len(fanouts) <= SHUFFLE_STREAM:
            raise ValueError(f"fanouts must be a list of 1 to {SHUFFLE_STREAM} per-layer "
                             f"fanouts, got {fanouts!r}")
        self.graph = g
        self.fanouts = [_fanout(f, i) for i, f in enumerate(fanouts)]
        self.seed = _check_counter("seed", seed, 2 ** 64)
        # A batch's rows are distinct vertices, so a layer draws fewer than num_nodes * fanout
        # numbers: they must fit below the batch index's bits of the Philox position.
        widest = max(f or 1 for f in self.fanouts)
        if g.num_nodes * widest >= 2 ** INDEX_SHIFT:
            raise ValueError(f"NeighborSampler: {g.num_nodes} vertices times fanout {widest} "
                             f"exceeds the 2**{INDEX_SHIFT} draws a batch may number")
        # Global id -> row in the batch being sampled, -1 elsewhere; reset after each batch
        # so no batch pays for clearing all of it.
        self._row = np.full(g.num_nodes, -1, dtype=np.int64)
        self._fresh = np.zeros(g.num_nodes, dtype=np.bool_)

    @property
    def num_layers(self):
        return len(self.fanouts)

    def sample(self, seed_nodes, epoch=0, index=0):
        """The Batch of `seed_nodes` (distinct global ids) for batch `index` of `epoch`."""
        g = self.graph
        seeds = np.asarray(seed_nodes)
        if seeds.ndim != 1 or seeds.size == 0 or seeds.dtype.kind not in "iu":
            raise ValueError("seed_nodes must be a non-empty 1-D array of integer vertex ids, "
                             f"got {seeds.dtype} of shape {seeds.shape}")
        seeds = seeds.astype(np.int64)
        if seeds.min() < 0 or seeds.max() >= g.num_nodes:
            raise ValueError(f"seed_nodes must lie in [0, {g.num_nodes}); got ids from "
                             f"{seeds.min()} to {seeds.max()}")
        epoch = _check_counter("epoch", epoch, 2 ** 32 // STREAMS_PER_EPOCH)
        index = _check_counter("index", index, 2 ** (64 - INDEX_SHIFT))
        if np.unique(seeds).size != seeds.size:
            raise ValueError("seed_nodes holds repeated vertex ids")
        row = self._row
        row[seeds] = np.arange(seeds.size)
        nodes = [seeds]
        count = seeds.size
        graphs, edge_ids = [], []
        try:
            for layer in reversed(range(self.num_layers)):
                dst_rows = count
                frontier = np.concatenate(nodes) if len(nodes) > 1 else nodes[0]
                nodes = [frontier]
                positions, dst = self._sample_in_edges(frontier, layer, epoch, index)
                src_global = g.in_src[positions]
                src = row[src_global]
                fresh = src < 0
                if fresh.any():
                    # Marking and scanning sorts the new vertices by id in O(N), faster
                    # than np.unique's sort for the frontiers of large batches.
                    self._fresh[src_global[fresh]] = True
                    new = np.flatnonzero(self._fresh)
                    self._fresh[new] = False
                    row[new] = np.arange(count, count + new.size)
                    nodes.append(new)
                    count += new.size
                    src = row[src_global]
                eids = g.in_eids[positions]
                # A typed graph's blocks keep each sampled edge's relation.
                types = {} if g.edge_type is None else dict(
                    edge_type=g.edge_type[eids], num_relations=g.num_relations)
                graphs.append(Graph(src, dst, num_nodes=count, num_dst=dst_rows, **types))
                edge_ids.append(eids)
            all_nodes = np.concatenate(nodes) if len(nodes) > 1 else nodes[0]
        finally:
            row[np.concatenate(nodes)] = -1
        return Batch(all_nodes, graphs[::-1], edge_ids[::-1])

    def _sample_in_edges(self, vertices, layer, epoch, index):
        """In-CSR positions of the sampled in-edges of `vertices`, grouped by vertex in
        order, and the row (index into `vertices`) each one ends at."""
        g, fanout = self.graph, self.fanouts[layer]
        start = g.in_indptr[vertices]
        degree = g.in_degrees[vertices]
        take = degree if fanout is None else np.minimum(degree, fanout)
        rows = np.repeat(np.arange(vertices.size), take)
        # Offsets 0..take-1 within each vertex's edges; vertices with more in-edges than the
        # fanout replace theirs by a sampled subset.
        first = np.cumsum(take) - take
        offset = np.arange(rows.size) - np.repeat(first, take)
        if fanout is not None:
            over = np.flatnonzero(degree > fanout)
            if over.size:
                chosen = self._choose(over, degree[over], fanout, layer, epoch, index)
                slots = first[over][:, None] + np.arange(fanout)
                offset[slots.reshape(-1)] = chosen.reshape(-1)
        return np.repeat(start, take) + offset, rows

    def _choose(self, rows, degree, k, layer, epoch, index):
        """(len(rows), k) distinct offsets in [0, degree), uniformly (Floyd: for j from
        d - k to d - 1, draw t in [0, j] and take t, or j if t was taken). Row r's draws
        sit at Philox positions batch base + r * k + 0..k-1."""
        stream = epoch * STREAMS_PER_EPOCH + layer
        start = (index << INDEX_SHIFT) + int(rows[0]) * k
        span = (int(rows[-1]) - int(rows[0]) + 1) * k
        draws = philox.uniform(self.seed, start, span, stream).reshape(-1, k)
        u = draws[rows - rows[0]].astype(np.float64)
        chosen = np.empty((rows.size, k), dtype=np.int64)
        for i in range(k):           # k rounds, each vectorized over the vertices
            j = degree - k + i
            t = np.minimum((u[:, i] * (j + 1)).astype(np.int64), j)
            taken = (chosen[:, :i] == t[:, None]).any(axis=1)
            chosen[:, i] = np.where(taken, j, t)
        return chosen

    def batches(self, nodes, batch_size, epoch=0, shuffle=True):
        """The batches of one epoch over `nodes` (e.g. the training vertices), in an order
        drawn from (seed, epoch) when `shuffle`; the last batch may be smaller."""
        nodes = np.asarray(nodes, dtype=np.int64)
        if isinstance(batch_size, bool) or not isinstance(batch_size, numbers.Integral) or \
                batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        if shuffle:
            nodes = nodes[self.order(nodes.size, epoch)]
        for index, start in enumerate(range(0, nodes.size, batch_size)):
            yield self.sample(nodes[start:start + batch_size], epoch=epoch, index=index)

    def order(self, n, epoch):
        """The permutation of n seeds used in `epoch` (Philox keys, sorted stably)."""
        epoch = _check_counter("epoch", epoch, 2 ** 32 // STREAMS_PER_EPOCH)
        keys = philox.uniform(self.seed, 0, n, stream=epoch * STREAMS_PER_EPOCH +
                              SHUFFLE_STREAM)
        return np.argsort(keys, kind="stable")
