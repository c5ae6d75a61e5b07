"""Edge-balanced schedules of a graph's CSR for the kernels that walk it.

A kernel that gives each vertex one row of work-items runs as long as the vertex with the
most edges: on a power-law graph one work-group walks a hub's tens of thousands of edges
while the rest of the device idles. An `EdgeSchedule` (one per graph, CSR direction and
chunk size, computed once with NumPy and uploaded with the graph's index arrays) cuts the
work so that every work-group walks about the same number of edges:

- a *heavy* row (more than `chunk` edges) is cut into nearly equal chunks of at most
  `chunk` edges (at most sqrt(degree) chunks for a row of more than `chunk ** 2`); a
  reduction over its edges runs as a partial kernel, one partial per chunk, and the
  reader folds the partials in chunk order (deterministic: no float atomics, the same
  order on every run);
- light rows are packed, consecutive in vertex order, into work-groups of about
  `2 * chunk` edges (a heavy row costs one per partial it folds there);
- a kernel writing one value per edge walks light rows in those groups and heavy rows in
  pieces of at most `2 * chunk` edges, one work-group each.

A GraphSlot (a minibatch's graph, loaded again each step) gets arrays of fixed capacity,
padded with empty groups and chunks, so the kernels bound to them stay valid; the
schedule is recomputed when the slot's version changes.
"""
import weakref

import numpy as np

CHUNK = 128       # the most edges of a heavy row one chunk (one partial) covers


class EdgeSchedule:
    """The schedule of `graph`'s in-CSR (at="dst") or out-CSR (at="src"). Arrays (int32),
    read as attributes like a graph's index arrays:

    - `row_chunks` (rows + 1): row v's chunks are row_chunks[v] .. row_chunks[v + 1]; a
      light row has none;
    - `chunk_row`, `chunk_start`, `chunk_end`: each chunk's row and CSR slot range;
    - `group_rows` (groups + 1): the rows of each work-group of a per-vertex kernel;
    - `piece_row`, `piece_start`, `piece_end`: the work-groups an edge kernel adds for
      heavy rows (it skips them in `group_rows`' groups).
    """

    ARRAYS = ("row_chunks", "chunk_row", "chunk_start", "chunk_end", "group_rows",
              "piece_row", "piece_start", "piece_end")

    def __init__(self, graph, at, chunk=CHUNK):
        self.graph, self.at, self.chunk = graph, at, chunk
        self._arrays, self._version = None, None

    @property
    def varies(self):
        return self.graph.varies

    @property
    def version(self):
        return getattr(self.graph, "version", None)

    def __getattr__(self, name):
        if name not in EdgeSchedule.ARRAYS:
            raise AttributeError(name)
        if self._arrays is None or self._version != self.version:
            self._arrays = self.compute()
            self._version = self.version
        return self._arrays[name]

    @property
    def has_heavy_rows(self):
        """Whether kernels need the heavy-row paths: a slot always may."""
        return self.varies or self.chunk_row.size > 0

    @property
    def num_groups(self):
        return self.group_rows.size - 1

    @property
    def num_chunks(self):
        return self.chunk_row.size

    @property
    def num_pieces(self):
        return self.piece_row.size

    def indptr(self):
        g = self.graph
        return np.asarray(g.in_indptr if self.at == "dst" else g.out_indptr, np.int64)

    def compute(self):
        indptr = self.indptr()
        rows = indptr.size - 1
        degrees = np.diff(indptr)
        chunk, group = self.chunk, 2 * self.chunk
        heavy = degrees > chunk
        # At most sqrt(degree) chunks: every chunk of a reduction that needs the row's
        # value of another one folds that one's partials, so folding costs no more than
        # walking the chunk, and a hub's work stays linear in its degree.
        size = np.maximum(chunk, np.ceil(np.sqrt(degrees)).astype(np.int64))
        chunks = np.where(heavy, -(-degrees // size), 0)
        row_chunks = np.concatenate([[0], np.cumsum(chunks)])
        chunk_row, chunk_start, chunk_end = split_rows(indptr, chunks)
        pieces = np.where(heavy, -(-degrees // group), 0)
        piece_row, piece_start, piece_end = split_rows(indptr, pieces)
        # Consecutive rows per group: a boundary wherever the running cost (light edges,
        # partials folded, one per row for its output) passes a multiple of `group`.
        cost = np.where(heavy, chunks, degrees) + 1
        total = np.concatenate([[0], np.cumsum(cost)])
        marks = np.arange(group, total[-1], group)
        inner = np.unique(np.searchsorted(total, marks, side="right") - 1)
        group_rows = np.concatenate([[0], inner[(inner > 0) & (inner < rows)], [rows]])
        arrays = {"row_chunks": row_chunks, "chunk_row": chunk_row,
                  "chunk_start": chunk_start, "chunk_end": chunk_end,
                  "group_rows": group_rows, "piece_row": piece_row,
                  "piece_start": piece_start, "piece_end": piece_end}
        if self.varies:
            arrays = self.padded(arrays, rows, indptr[-1])
        return {name: np.ascontiguousarray(a, dtype=np.int32) for name, a in arrays.items()}

    def padded(self, arrays, rows, edges):
        """Arrays of the most groups, chunks and pieces any graph of these sizes needs,
        the unused ones empty, so a slot's kernels keep their launch sizes."""
        chunks, pieces = 2 * edges // self.chunk, edges // self.chunk
        groups = -(-(edges + rows) // (2 * self.chunk)) + 1

        def pad(a, size, value):
            return np.concatenate([a, np.full(size - a.size, value, a.dtype)])
        out = dict(arrays)
        out["group_rows"] = pad(arrays["group_rows"], groups + 1, rows)
        for name in ("chunk_row", "chunk_start", "chunk_end"):
            out[name] = pad(arrays[name], max(chunks, 1), 0)
        for name in ("piece_row", "piece_start", "piece_end"):
            out[name] = pad(arrays[name], max(pieces, 1), 0)
        return out

    def walked_share(self, how):
        """(edges, vertices): the shares of the graph's edges a kernel walking this
        schedule `how` ("vertex", "edge" or "partial", GPUKernel.walk) reads values of,
        and of its vertices it reads values at. A per-vertex kernel walks the light rows'
        edges (a heavy row's value comes folded from its partials) and writes every row;
        a partial kernel walks the heavy rows' edges and reads at most their rows and
        those edges' other ends; an edge kernel walks every edge."""
        if how == "edge":
            return 1.0, 1.0
        indptr = self.indptr()
        edges, rows = max(int(indptr[-1]), 1), max(indptr.size - 1, 1)
        heavy_rows = np.diff(self.row_chunks.astype(np.int64)) > 0
        heavy_edges = int(np.diff(indptr)[heavy_rows].sum())
        if how == "vertex":
            return (edges - heavy_edges) / edges if indptr[-1] else 0.0, 1.0
        g = self.graph
        other = np.asarray(g.in_src if self.at == "dst" else g.out_dst)
        slots = np.repeat(heavy_rows, np.diff(indptr))
        touched = np.zeros(indptr.size - 1, bool)
        touched[heavy_rows] = True
        touched[other[:slots.size][slots]] = True
        return heavy_edges / edges, int(touched.sum()) / rows

    def light_edges_per_group(self):
        """Edges each per-vertex work-group walks (its light rows' edges)."""
        indptr, row_chunks = self.indptr(), self.row_chunks.astype(np.int64)
        light = np.where(np.diff(row_chunks) == 0, np.diff(indptr), 0)
        walked = np.concatenate([[0], np.cumsum(light)])
        return walked[self.group_rows[1:]] - walked[self.group_rows[:-1]]


def split_rows(indptr, counts):
    """Row, first and past-the-last CSR slot of each piece when row v is cut into
    counts[v] pieces of nearly equal size (the first ones one edge larger)."""
    rows = np.repeat(np.arange(counts.size), counts)
    index = np.arange(rows.size) - np.repeat(np.cumsum(counts) - counts, counts)
    start, degree, n = indptr[rows], indptr[rows + 1] - indptr[rows], counts[rows]
    base, extra = degree // np.maximum(n, 1), degree % np.maximum(n, 1)
    first = start + index * base + np.minimum(index, extra)
    return rows, first, first + base + (index < extra)


_schedules = weakref.WeakKeyDictionary()     # graph -> {(at, chunk): EdgeSchedule}


def edge_schedule(graph, at, chunk=None):
    """The schedule of `graph`'s CSR at `at`, made once per graph and kept with it."""
    chunk = chunk or CHUNK
    per_graph = _schedules.setdefault(graph, {})
    if (at, chunk) not in per_graph:
        per_graph[(at, chunk)] = EdgeSchedule(graph, at, chunk)
    return per_graph[(at, chunk)]
