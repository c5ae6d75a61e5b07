"""GraphSlot: a graph of fixed sizes whose edges are replaced between calls.

Graph ops hold their graph, and a computation is compiled for the sizes of its graphs. A
computation built over slots serves every minibatch: before each call, `slot.load(block)`
copies the batch's block in, and the sizes, hence the generated code and its buffers, stay
those of the slot (seed 004: allocate for the worst case instead of reallocating per batch).

A slot holds more rows and edges than a block it is loaded with. The spare rows are padding,
and the spare edges join padding rows only (source rows past the block's sources to
destination rows past its destinations, spread evenly so no vertex gets them all), so they
change neither the real rows' aggregations nor their degrees. Padding rows compute finite
values that no real row reads.

A loader that cuts its blocks out of a larger graph's CSR orders (GraphLoader) loads them
with `load_csr` instead, into index arrays it keeps and rewrites in place for every block:
the slot takes them as its own until the next load (an array read from a slot is valid
until then), and what a step reads of it (the CSR pointers, the sources in in-CSR order and
the destinations in out-CSR order) is all a load makes; the edges in their own order and
the edge ids are made at their first read.

A typed slot (`relation_edges`, one edge capacity per relation) carries edge types: the
graphs derived from a typed graph (ngnn/relations.py) are made when a program is traced
and held by its ops, so a typed slot holds one slot per relation, made once, as the
relation subgraphs `v.innbs.of_type(r)` reads, and each load replaces their edges too.

A square slot may declare its live rows (`live`, a (1,) int placeholder, a BatchSlot's):
the count of the loaded block's rows, past which every row is padding. Loads keep it true
(a square block only: its padding edges then join rows past the count to rows past it,
in both directions), and a computation reading it is fed `loaded[0]` with each batch
(GraphLoader.live). It is what batch norm over the slot normalizes over and what
ngnn.passes.ZeroRowProducts knows an aggregation over the slot keeps zero: a sum or mean
over the slot's edges of rows that are 0 past the count is 0 past it.
"""
import numbers

import numpy as np

from ngnn.graph import Graph, _readonly
from ngnn.op_graph.op import Placeholder


def _size(name, value, least):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < least:
        raise ValueError(f"GraphSlot: {name} must be an int >= {least}, got {value!r}")
    return int(value)


# The edge arrays of a slot loaded by load_csr that are made at their first read: a step
# over a slot reads the CSR pointers, in_src and out_dst (what load_csr sets) only.
_ON_READ = ("src", "dst", "in_eids", "out_eids")


class GraphSlot(Graph):
    """Rows `num_nodes`, destination rows `num_dst` (default num_nodes) and `num_edges`
    edges; `version` counts the loads, so a device copy of the index arrays knows when it
    is stale; `live`, where given, the slot's declared live-row count (see the module)."""

    varies = True
    relations = None      # an untyped slot's; a typed one holds a slot per relation
    live = None           # the declared live-row count (see the module), or None

    def __init__(self, num_nodes, num_edges, num_dst=None, relation_edges=None, live=None):
        num_nodes = _size("num_nodes", num_nodes, 1)
        num_dst = num_nodes if num_dst is None else _size("num_dst", num_dst, 1)
        num_edges = _size("num_edges", num_edges, 0)
        if num_dst > num_nodes:
            raise ValueError(f"GraphSlot: num_dst={num_dst} exceeds num_nodes={num_nodes}")
        if live is not None and not (isinstance(live, Placeholder) and live.shape == (1,) and
                                     live.dtype.kind in "iu" and num_dst == num_nodes and
                                     relation_edges is None):
            raise ValueError("GraphSlot: live must be a (1,) int placeholder, declared by an "
                             "untyped square slot (num_dst = num_nodes)")
        # One slot per relation (the relation subgraphs), or None for an untyped slot.
        self.relations = None if relation_edges is None else [
            GraphSlot(num_nodes, _size("relation_edges", edges, 0), num_dst)
            for edges in relation_edges]
        if self.relations == []:
            raise ValueError("GraphSlot: relation_edges must list at least one relation")
        self.version = -1
        self.live = live
        self._fill(*self._padding(0, 0, num_nodes, num_dst, num_edges), num_nodes, num_dst)
        self.loaded = (0, 0, 0)       # (rows, destination rows, edges) of the loaded block

    def load(self, graph):
        """Replaces the edges by those of `graph` (a Graph or block) plus padding."""
        if not isinstance(graph, Graph):
            raise TypeError(f"GraphSlot.load: expected an ng.Graph, got {graph!r}")
        spare = self.num_edges - graph.num_edges
        fits = graph.num_nodes <= self.num_nodes and graph.num_dst <= self.num_dst and \
            spare >= 0
        if fits and spare:
            fits = graph.num_nodes < self.num_nodes and graph.num_dst < self.num_dst
        if not fits:
            raise ValueError(
                f"GraphSlot.load: {graph!r} does not fit this slot ({self.num_nodes} rows, "
                f"{self.num_dst} destination rows, {self.num_edges} edges; padding edges "
                "need a spare source row and a spare destination row)")
        self._check_square(graph.num_nodes, graph.num_dst)
        if self.relations is not None:
            self._load_relations(graph)
        pad_src, pad_dst = self._padding(graph.num_nodes, graph.num_dst, self.num_nodes,
                                         self.num_dst, spare)
        types = None if self.relations is None else \
            np.concatenate([graph.edge_type, np.zeros(spare, np.int64)])
        self._fill(np.concatenate([graph.src, pad_src]), np.concatenate([graph.dst, pad_dst]),
                   self.num_nodes, self.num_dst, types)
        self.loaded = (graph.num_nodes, graph.num_dst, graph.num_edges)

    def _load_relations(self, graph):
        """Loads each relation's edges of the typed block `graph` into its relation slot
        (padding edges, which join padding rows only, are typed 0 in this slot and belong
        to no relation slot)."""
        if graph.edge_type is None or graph.num_relations != len(self.relations):
            raise ValueError(f"GraphSlot.load: this slot carries {len(self.relations)} "
                             f"relations; {graph!r} is not a graph of as many relations")
        order = np.argsort(graph.edge_type, kind="stable")
        bounds = np.searchsorted(graph.edge_type[order], np.arange(len(self.relations) + 1))
        counts = np.diff(bounds)
        over = np.flatnonzero(counts > [slot.num_edges for slot in self.relations])
        if over.size:
            r = over[0]
            raise ValueError(f"GraphSlot.load: {graph!r} has {counts[r]} edges of relation "
                             f"{r}; this slot holds {self.relations[r].num_edges}")
        for r, slot in enumerate(self.relations):
            edges = order[bounds[r]:bounds[r + 1]]
            slot.load(Graph(graph.src[edges], graph.dst[edges], graph.num_nodes,
                            graph.num_dst))

    def load_csr(self, num_nodes, num_dst, num_edges, csr, indptrs, edges):
        """`load` for a block whose CSR orders the caller cuts out of a larger graph's
        (GraphLoader), into arrays it keeps and rewrites for every load: `csr`,
        (2, self.num_edges) int64, holds in its first `num_edges` columns the block's
        sources in in-CSR (by destination) order and destinations in out-CSR (by
        source) order, both stable; `indptrs`, (2, self.num_nodes + 1) int64, starts
        with 0; `edges()` gives the block's (src, dst, in_eids, out_eids). The padding
        goes into the rest of `csr` and the CSR pointers into `indptrs`, which the slot
        takes as its arrays until the next load: what a step over the slot reads. src,
        dst and the edge ids are made at their first read (`edges()` then), so a load
        allocates, copies, checks and sorts nothing of the block's edges (only the
        padding's few edges are sorted)."""
        if self.relations is not None:
            raise ValueError("GraphSlot.load_csr: a typed slot loads typed blocks with load, "
                             "which splits their edges by relation")
        spare = self.num_edges - num_edges
        if not (0 < spare and num_nodes < self.num_nodes and num_dst < self.num_dst or
                spare == 0 and num_nodes <= self.num_nodes and num_dst <= self.num_dst):
            raise ValueError(f"GraphSlot.load_csr: {num_nodes} rows, {num_dst} destination "
                             f"rows and {num_edges} edges do not fit {self!r}")
        self._check_square(num_nodes, num_dst)
        in_src, out_dst = csr
        pad = slice(num_edges, None)
        # Padding edges come ordered by destination (their ids in in-CSR order); by source
        # too when each padding row has one at most.
        _, pad_dst = self._padding(num_nodes, num_dst, self.num_nodes, self.num_dst, spare,
                                   in_src[pad])
        by_source = None
        if spare <= self.num_nodes - num_nodes:
            out_dst[pad] = pad_dst
        else:
            by_source = in_src[pad].argsort(kind="stable")
            pad_dst.take(by_source, out=out_dst[pad])

        def every_edge():
            # The padding's ids: in in-CSR order, and in out-CSR order when sorted.
            src, dst, in_eids, out_eids = edges()
            ids = np.arange(num_edges, self.num_edges)
            return (np.concatenate([src, self.in_src[pad]]),
                    np.concatenate([dst, pad_dst]),
                    np.concatenate([in_eids, ids]),
                    np.concatenate([out_eids, ids if by_source is None else ids[by_source]]))
        out_degrees = np.bincount(in_src, minlength=self.num_nodes)
        out_degrees.cumsum(out=indptrs[1, 1:])
        self._hold((num_nodes, num_dst, num_edges), in_src, out_dst, indptrs[0],
                   (indptrs[1], out_degrees), every_edge)

    def _hold(self, loaded, in_src, out_dst, in_indptr, out_csr, every_edge):
        """Takes the arrays of a load_csr as the slot's: `in_src`, `out_dst`, the in-CSR
        pointers counted from `out_dst` into `in_indptr`, `out_csr` (out-CSR pointers,
        out-degrees), and `every_edge()` as what gives (src, dst, in_eids, out_eids) at
        their first read."""
        in_degrees = np.bincount(out_dst, minlength=self.num_nodes)
        in_degrees.cumsum(out=in_indptr[1:])
        out_indptr, out_degrees = out_csr
        nodes, dst_rows, edges = self.num_nodes, self.num_dst, self.num_edges
        version = self._forget_edges()
        self.num_nodes, self.num_dst, self.num_edges = nodes, dst_rows, edges
        self.in_indptr, self.in_src = _readonly(in_indptr), _readonly(in_src)
        self.in_degrees = _readonly(in_degrees)
        self.out_indptr, self.out_dst = _readonly(out_indptr), _readonly(out_dst)
        self.out_degrees = _readonly(out_degrees)
        self._incidence, self._adjacency = {}, None
        self._unread = every_edge
        self.version = version
        self.loaded = loaded

    def __getattr__(self, name):
        # Reached only for an attribute not set: the edge arrays a load_csr leaves to their
        # first read.
        unread = self.__dict__.get("_unread")
        if unread is None or name not in _ON_READ:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        del self._unread
        for attribute, array in zip(_ON_READ, unread()):
            setattr(self, attribute, _readonly(array))
        return getattr(self, name)

    def _check_square(self, num_nodes, num_dst):
        """A slot declaring its live rows takes square blocks only: of a block with fewer
        destination rows, padding edges would join rows below the count to rows past it."""
        if self.live is not None and num_dst != num_nodes:
            raise ValueError(f"GraphSlot.load: this slot declares its live rows (live); a "
                             f"block of {num_nodes} rows and {num_dst} destination rows "
                             "is not square")

    @staticmethod
    def _padding(rows, dst_rows, num_nodes, num_dst, count, src=None):
        """`count` edges from the padding rows [rows, num_nodes) to the padding destination
        rows [dst_rows, num_dst), ordered by destination: (sources, destinations), the
        sources written into `src` where given."""
        spread = np.arange(count, dtype=np.int64)
        src = np.remainder(spread, max(num_nodes - rows, 1), out=src)
        src += rows
        return src, GraphSlot._padding_destinations(dst_rows, num_dst, count, spread)

    @staticmethod
    def _padding_destinations(dst_rows, num_dst, count, spread=None, out=None):
        """The destinations of _padding's edges, written into `out` where given (`spread`:
        0, 1, ..., count - 1, where the caller has it)."""
        spread = np.arange(count, dtype=np.int64) if spread is None else spread
        dst = np.multiply(spread, num_dst - dst_rows, out=out)
        dst //= max(count, 1)
        dst += dst_rows
        return dst

    def _forget_edges(self):
        """Clears the object's state before a load: caches kept on the graph (CSR
        permutations, transformers' incidence matrices and blocks) describe the old edges.
        Keeps what no load changes, the relation slots (a typed slot's relation subgraphs,
        whatever is loaded) and the declared live count; returns the load's version."""
        version, relations, live = self.version + 1, self.relations, self.live
        self.__dict__.clear()
        self.relations, self.live = relations, live
        return version

    def _fill(self, src, dst, num_nodes, num_dst, edge_type=None):
        version = self._forget_edges()
        relations = self.relations
        if relations is None:
            Graph.__init__(self, src, dst, num_nodes, num_dst)
        else:
            Graph.__init__(self, src, dst, num_nodes, num_dst,
                           np.zeros(len(src), np.int64) if edge_type is None else edge_type,
                           len(relations))
            self._derived_graphs = {("relation", r): slot for r, slot in enumerate(relations)}
        self.version = version

    def __repr__(self):
        rows, dst_rows, edges = self.loaded
        return (f"GraphSlot(num_nodes={self.num_nodes}, num_dst={self.num_dst}, "
                f"num_edges={self.num_edges}; loaded {rows} rows, {dst_rows} destination "
                f"rows, {edges} edges)")

