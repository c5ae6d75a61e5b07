"""The chunk grid (seed 003, NeuGraph): P vertex blocks and a P x P grid of edge chunks.

Vertex block b holds the rows [b * B, (b + 1) * B) with B = ceil(N / P). Edge chunk (i, j)
holds the edges from block i to block j. An edge stage runs chunk by chunk, column by
column (j outer, i inner), so one destination block's partial aggregations follow each
other; a chunk with more edges than the edge capacity runs as several pieces.

Each piece is a small graph in local row ids: its destination rows first (so its partial
aggregation at the destinations is a prefix of the rows), then the source rows that are not
destinations, padded to the capacities of the ChunkSlot the stage computations are compiled
for; padding edges join padding rows only. Selective scheduling (the seed's rule, decided per chunk here, at compile
time): load only the rows the chunk's edges use when that is fewer than the whole blocks.
"""
import numpy as np

from ngnn.graph import Graph
from ngnn.sampling.slot import GraphSlot


class ChunkSlot(GraphSlot):
    """The graph every edge stage computation is compiled over: capacities fixed, and
    `show(piece)` swaps in a piece's padded graph (its CSR arrays and the caches the
    transformers keep on a graph are computed once per piece and kept with it).
    `global_node_ids` and `global_edge_ids` key dropout masks by whole-graph ids."""

    def __init__(self, num_nodes, num_edges):
        super().__init__(num_nodes, num_edges)
        self.global_node_ids = np.zeros(num_nodes, np.int64)
        self.global_edge_ids = np.zeros(num_edges, np.int64)
        self.versions = 0

    def show(self, piece):
        versions = self.versions + 1
        self.__dict__ = piece.padded(self)     # the piece's own: caches stay with it
        self.version = self.versions = versions


class RowBlock(GraphSlot):
    """What a vertex stage computation is compiled over: `rows` rows and no edges, with
    `global_node_ids` the whole-graph ids of the rows shown (dropout keys)."""

    def __init__(self, rows):
        super().__init__(rows, 0)
        self.global_node_ids = np.zeros(rows, np.int64)

    def show(self, start, stop):
        self.version += 1
        self.global_node_ids = np.arange(start, stop, dtype=np.int64)


class Piece:
    """Edges `eids` (whole-graph ids) of chunk (i, j), over local rows `rows` (whole-graph
    ids, the `num_dst` destination rows first)."""

    def __init__(self, chunk, eids, rows, num_dst, src, dst):
        self.chunk = chunk
        self.eids = eids
        self.rows = rows
        self.num_dst = num_dst
        self.src, self.dst = src, dst          # local ids
        self._state = None

    @property
    def num_edges(self):
        return self.eids.shape[0]

    def padded(self, slot):
        """The __dict__ of `slot` showing this piece (built on first use)."""
        if self._state is None:
            # Every local row may be a destination (slot.num_dst == slot.num_nodes), so the
            # padding edges join padding rows only, never a real row.
            spare = slot.num_edges - self.num_edges
            rows = self.rows.shape[0]
            pad_src, pad_dst = GraphSlot._padding(rows, rows, slot.num_nodes, slot.num_dst,
                                                  spare)
            graph = Graph(np.concatenate([self.src, pad_src]),
                          np.concatenate([self.dst, pad_dst]), slot.num_nodes, slot.num_dst)
            state = graph.__dict__
            state["loaded"] = (self.rows.shape[0], self.num_dst, self.num_edges)
            state["global_node_ids"] = np.concatenate(
                [self.rows, np.zeros(slot.num_nodes - self.rows.shape[0], np.int64)])
            state["global_edge_ids"] = np.concatenate(
                [self.eids, np.zeros(spare, np.int64)])
            self._state = state
        return self._state


class ChunkGrid:
    """The P x P chunking of `graph`; `edge_capacity` bounds a piece's edges; `selective`
    lets a chunk load only its used rows (else always the whole blocks)."""

    def __init__(self, graph, parts, edge_capacity=None, selective=True):
        n = graph.num_nodes
        self.graph = graph
        self.parts = parts = max(1, min(int(parts), max(n, 1)))
        self.block = -(-n // parts) if n else 1
        self.selective = selective
        src_block, dst_block = graph.src // self.block, graph.dst // self.block
        key = dst_block * parts + src_block            # column by column
        order = np.argsort(key, kind="stable")
        counts = np.bincount(key, minlength=parts * parts)
        if edge_capacity is None:
            edge_capacity = max(int(counts.max()) if counts.size else 0, 1)
        self.edge_capacity = int(edge_capacity)
        self.pieces = []
        self.loaded_rows = {"selective": 0, "whole": 0}    # rows a whole step's chunks load
        starts = np.concatenate([[0], np.cumsum(counts)])
        for c in np.flatnonzero(counts):
            j, i = divmod(int(c), parts)
            eids = order[starts[c]:starts[c + 1]]
            for first in range(0, eids.shape[0], self.edge_capacity):
                self.pieces.append(self._piece((i, j), eids[first:first + self.edge_capacity]))

    def block_rows(self, b):
        n = self.graph.num_nodes
        return min(b * self.block, n), min((b + 1) * self.block, n)

    def _piece(self, chunk, eids):
        i, j = chunk
        src, dst = self.graph.src[eids], self.graph.dst[eids]
        used_dst = np.unique(dst)
        used_src = np.setdiff1d(np.unique(src), used_dst, assume_unique=True)
        whole_dst = np.arange(*self.block_rows(j), dtype=np.int64)
        whole_src = np.arange(*self.block_rows(i), dtype=np.int64) if i != j else \
            np.zeros(0, np.int64)
        selective = used_dst.shape[0] + used_src.shape[0]
        whole = whole_dst.shape[0] + whole_src.shape[0]
        self.loaded_rows["selective"] += selective
        self.loaded_rows["whole"] += whole
        if self.selective and selective < whole:
            dst_rows, extra = used_dst, used_src
        else:
            dst_rows, extra = whole_dst, whole_src
        rows = np.concatenate([dst_rows, extra])
        local_dst = np.searchsorted(dst_rows, dst)
        at = np.searchsorted(dst_rows, src).clip(max=max(dst_rows.shape[0] - 1, 0))
        in_dst = dst_rows[at] == src if dst_rows.shape[0] else np.zeros(src.shape, bool)
        local_src = np.where(in_dst, at, dst_rows.shape[0] + np.searchsorted(extra, src))
        return Piece(chunk, eids, rows, dst_rows.shape[0], local_src, local_dst)

    def capacities(self):
        """(rows, edges) a ChunkSlot needs for every piece, with a spare row for the
        padding edges."""
        rows = max((p.rows.shape[0] for p in self.pieces), default=0)
        return rows + 1, self.edge_capacity

    def row_order(self):
        """The pieces source block by source block (for aggregations at the source)."""
        return sorted(self.pieces, key=lambda p: p.chunk)
