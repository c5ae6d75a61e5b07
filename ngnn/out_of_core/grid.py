"""The chunk grid (seed 003, NeuGraph): P vertex blocks and a P x P grid of edge chunks.

Vertex block b holds the rows [b * B, (b + 1) * B) with B = ceil(N / P). Edge chunk (i, j)
holds the edges from block i to block j. An edge stage runs its pieces column by column
(j outer, i inner), so one destination block's partial aggregations follow each other.

Each piece is a small graph in local row ids: its destination rows first (so its partial
aggregation at the destinations is a prefix of the rows), then the source rows that are not
destinations, padded to the capacities of the ChunkSlot the stage computations are compiled
for; padding edges join padding rows only.
"""
import numpy as np

from ngnn.graph import Graph
from ngnn.sampling.slot import GraphSlot

PIECE_CACHE_BYTES = 256 << 20


class ChunkSlot(GraphSlot):
    """The graph every edge stage computation is compiled over: capacities fixed, and
    `show(piece)` swaps in a piece's padded graph. Pieces keep their padded graphs (index
    arrays and CSR orders, built once) while those stay within PIECE_CACHE_BYTES on the
    host, and build them again when shown past that: kept for every piece, they would take
    more host memory than the whole graph (R-MAT 2M: 4.7 against 3.4 GiB peak).
    `global_node_ids` and `global_edge_ids` key dropout masks by whole-graph ids."""

    def __init__(self, num_nodes, num_edges):
        super().__init__(num_nodes, num_edges)
        self.global_node_ids = np.zeros(num_nodes, np.int64)
        self.global_edge_ids = np.zeros(num_edges, np.int64)
        self.versions = 0
        self.cache_left = PIECE_CACHE_BYTES

    def show(self, piece):
        state = piece.padded(self)             # may take from the cache's room
        kept = {"versions": self.versions + 1, "cache_left": self.cache_left}
        # A copy: what transformers cache on the graph it shows dies with it.
        self.__dict__ = dict(state)
        self.__dict__.update(kept, version=kept["versions"])

    def keeps(self, state):
        """Whether a piece may keep its padded graph `state` (the cache has room)."""
        nbytes = sum(v.nbytes for v in state.values() if isinstance(v, np.ndarray))
        if nbytes > self.cache_left:
            return False
        self.cache_left -= nbytes
        return True


class RowBlock(GraphSlot):
    """What a vertex stage computation is compiled over: `rows` rows and no edges, with
    `global_node_ids` the whole-graph ids of the rows shown (dropout keys), and for each
    readout graph R of `readouts` the block's share of it, `readouts[R]`: a slot whose
    edge i joins the block's row i to its graph, the graph rows all of R's."""

    def __init__(self, rows, readouts=()):
        super().__init__(rows, 0)
        self.global_node_ids = np.zeros(rows, np.int64)
        self.readouts = {r: GraphSlot(max(rows, r.num_dst), rows, r.num_dst)
                         for r in readouts}

    def show(self, start, stop):
        self.version += 1
        self.global_node_ids = np.arange(start, stop, dtype=np.int64)
        for whole, block in self.readouts.items():
            block.load(Graph(np.arange(stop - start, dtype=np.int64), whole.dst[start:stop],
                             block.num_nodes, block.num_dst))


class Piece:
    """Edges `eids` (whole-graph ids) over local rows `rows` (whole-graph ids, the
    `num_dst` destination rows first)."""

    def __init__(self, eids, rows, num_dst, src, dst):
        self.eids = eids
        self.rows = rows
        self.num_dst = num_dst
        self.src, self.dst = src, dst          # local ids
        self._state = None

    @property
    def num_edges(self):
        return self.eids.shape[0]

    def padded(self, slot):
        """The __dict__ of `slot` showing this piece (kept if the slot's cache has room)."""
        if self._state is not None:
            return self._state
        # Every local row may be a destination (slot.num_dst == slot.num_nodes), so the
        # padding edges join padding rows only, never a real row.
        spare = slot.num_edges - self.num_edges
        rows = self.rows.shape[0]
        pad_src, pad_dst = GraphSlot._padding(rows, rows, slot.num_nodes, slot.num_dst, spare)
        graph = Graph(np.concatenate([self.src, pad_src]),
                      np.concatenate([self.dst, pad_dst]), slot.num_nodes, slot.num_dst)
        state = graph.__dict__
        state["loaded"] = (rows, self.num_dst, self.num_edges)
        state["global_node_ids"] = np.concatenate(
            [self.rows, np.zeros(slot.num_nodes - rows, np.int64)])
        state["global_edge_ids"] = np.concatenate([self.eids, np.zeros(spare, np.int64)])
        if slot.keeps(state):
            self._state = state
        return state


class ChunkGrid:
    """The P x P chunking of `graph` and the pieces an edge stage runs, of at most
    `edge_capacity` edges each. With `selective` scheduling the edges, column by column,
    are cut into equal pieces that each load the rows their edges use; without, each chunk
    (i, j) is cut into equal pieces that each load the whole blocks i and j (the baseline
    selective scheduling is measured against). Equal pieces keep the padding, computed
    for nothing, small: R-MAT's chunks differ in size by orders of magnitude."""

    def __init__(self, graph, parts, edge_capacity=None, selective=True):
        n = graph.num_nodes
        self.graph = graph
        self.parts = parts = max(1, min(int(parts), max(n, 1)))
        self.block = -(-n // parts) if n else 1
        self.selective = selective
        key = (graph.dst // self.block).astype(np.int32) * parts     # column by column
        key += (graph.src // self.block).astype(np.int32)
        order = np.argsort(key, kind="stable")
        counts = np.bincount(key, minlength=parts * parts)
        del key
        capacity = max(int(counts.max()) if edge_capacity is None else int(edge_capacity), 1)
        if selective:
            runs = [(None, order)]
        else:
            starts = np.concatenate([[0], np.cumsum(counts)])
            runs = [(divmod(int(c), parts)[::-1], order[starts[c]:starts[c + 1]])
                    for c in np.flatnonzero(counts)]
        self.pieces = [self._piece(chunk, eids) for chunk, run in runs
                       for eids in np.array_split(run, max(-(-run.shape[0] // capacity), 1))
                       if eids.shape[0]]
        self.edge_capacity = max((p.num_edges for p in self.pieces), default=1)
        self.loaded_rows = sum(p.rows.shape[0] for p in self.pieces)

    def block_rows(self, b):
        n = self.graph.num_nodes
        return np.arange(min(b * self.block, n), min((b + 1) * self.block, n), dtype=np.int64)

    def _piece(self, chunk, eids):
        src, dst = self.graph.src[eids], self.graph.dst[eids]
        if chunk is None:
            dst_rows = np.unique(dst)
            extra = np.setdiff1d(np.unique(src), dst_rows, assume_unique=True)
        else:
            i, j = chunk
            dst_rows = self.block_rows(j)
            extra = self.block_rows(i) if i != j else np.zeros(0, np.int64)
        rows = np.concatenate([dst_rows, extra])
        local_dst = np.searchsorted(dst_rows, dst)
        at = np.searchsorted(dst_rows, src).clip(max=max(dst_rows.shape[0] - 1, 0))
        in_dst = dst_rows[at] == src if dst_rows.shape[0] else np.zeros(src.shape, bool)
        local_src = np.where(in_dst, at, dst_rows.shape[0] + np.searchsorted(extra, src))
        # By destination: the piece's in-CSR order is then its edge order, found unsorted.
        by_dst = np.argsort(local_dst, kind="stable")
        return Piece(eids[by_dst], rows, dst_rows.shape[0], local_src[by_dst].astype(np.int32),
                     local_dst[by_dst].astype(np.int32))

    def bounds(self, capacity):
        """(rows, edges) a ChunkSlot needs for the pieces of any edges of the graph's
        sizes cut with edge `capacity` (a slot's, whose edges change between calls): a
        piece has at most `capacity` edges and uses at most twice as many rows (selective)
        or two blocks, and never more than the graph's; with a spare row for the padding
        edges."""
        used = 2 * capacity if self.selective else 2 * self.block
        return min(used, self.graph.num_nodes) + 1, capacity

    def capacities(self):
        """(rows, edges) a ChunkSlot needs for every piece, with a spare row for the
        padding edges."""
        rows = max((p.rows.shape[0] for p in self.pieces), default=0)
        return rows + 1, self.edge_capacity
