"""A rank's graphs: the local graph its kernels run over, and the view its model is built
over.

`LocalGraph`: the part's vertices (masters first, then mirrors) and edges in local ids,
plus what relates them to the whole graph (global ids, the whole graph's degrees) and the
Exchange that talks to the other ranks. Graph ops over it compute on local edges only.

`MasterView`: the same edges seen from the masters. Its num_nodes is the number of
masters, so every node tensor a model builds over it has a row per master and no row per
mirror: dense node-wise work (transforms, activations, dropout) is done once per vertex,
by its master. `ngnn.distributed.lowering` rewrites its graph ops onto the LocalGraph: a
gather reads a node tensor broadcast to the mirrors first, an aggregation's partial result
is reduced onto the masters. Vertex-centric code over the view sees the whole graph's
degrees (`vertex_degrees`), and dropout masks are keyed by global ids (`global_rows`).
"""
import functools

import numpy as np

from ngnn.batch import ReadoutGraph
from ngnn.graph import Graph, _readonly
from ngnn.op_graph.combiners import COMBINERS

from .exchange import wait


class LocalGraph(Graph):
    def __init__(self, src, dst, num_nodes, global_node_ids, global_edge_ids, num_masters,
                 global_num_nodes, global_num_edges, exchange, groups=None):
        if groups is None:
            super().__init__(src, dst, num_nodes)
        else:       # (in-CSR, out-CSR) (indptr, eids, counts) of edges the caller checked
            self._set_edges(src, dst, num_nodes, num_nodes, *groups)
        self.global_node_ids = _readonly(np.asarray(global_node_ids, np.int64))
        self.global_edge_ids = _readonly(np.asarray(global_edge_ids, np.int64))
        self.num_masters = int(num_masters)
        self.global_num_nodes = int(global_num_nodes)
        self.global_num_edges = int(global_num_edges)
        self.exchange = exchange

    @classmethod
    def from_part(cls, part, exchange):
        m = part.manifest
        return cls(part.src, part.dst, part.nodes.shape[0], part.nodes, part.edges,
                   part.num_masters, m["num_nodes"], m["num_edges"], exchange)

    @functools.cached_property
    def masters(self):
        """The MasterView a model is built over."""
        return MasterView(self)

    # ---- what dropout and vertex-centric code see ----------------------------------------
    def global_rows(self, rows):
        return self, "global_node_ids" if rows == "n" else "global_edge_ids"

    def vertex_degrees(self, which):
        return self.global_in_degrees if which == "in" else self.global_out_degrees

    @functools.cached_property
    def global_in_degrees(self):
        return _readonly(self._whole(self.in_degrees))

    @functools.cached_property
    def global_out_degrees(self):
        return _readonly(self._whole(self.out_degrees))

    def _whole(self, local_counts):
        """Sum over ranks of a per-vertex count, on every copy of the vertex."""
        counts = local_counts.astype(np.int64)
        reduced = self.exchange.reduce(counts, "sum", np.empty(self.num_masters, np.int64),
                                       kind=None)
        return self.exchange.broadcast(reduced, np.empty_like(counts), kind=None)

    def with_self_loops(self):
        """The local share of the whole graph's `with_self_loops()`: local edges other than
        loops keep their order, and each master's loop is appended here, so every edge of
        the whole graph's version lives on exactly one rank with its global id there."""
        if "_looped" not in self.__dict__:
            keep = self.src != self.dst
            # Global ids in the looped graph: loops are dropped (every rank learns where
            # they were), then loop v gets id (edges kept) + v.
            loops = np.sort(np.concatenate(self.exchange.comm.allgather(
                self.global_edge_ids[~keep])))
            kept_ids = self.global_edge_ids[keep]
            kept_ids = kept_ids - np.searchsorted(loops, kept_ids)
            kept_total = self.global_num_edges - loops.shape[0]
            masters = np.arange(self.num_masters, dtype=np.int64)
            self._looped = LocalGraph(
                np.concatenate([self.src[keep], masters]),
                np.concatenate([self.dst[keep], masters]), self.num_nodes,
                self.global_node_ids, np.concatenate(
                    [kept_ids, kept_total + self.global_node_ids[:self.num_masters]]),
                self.num_masters, self.global_num_nodes, kept_total + self.global_num_nodes,
                self.exchange)
        return self._looped

    # ---- the communication ops' kernels --------------------------------------------------
    def active(self, at):
        """Which local vertices have local edges at end `at` (all of them for None)."""
        if at is None:
            return np.ones(self.num_nodes, bool)
        return (self.in_degrees if at == "dst" else self.out_degrees) > 0

    def reduce_to_masters(self, x, reduce, at, out):
        """MirrorReduce (see there for `at`): x has a row per local vertex, out per master."""
        if at is None:
            return self.exchange.reduce(x, reduce, out)
        active = self.active(at)
        plan = self.exchange.restricted((id(self), at), active)
        combiner = COMBINERS[reduce]
        if combiner.identity != 0:    # a copy without edges holds 0, no partial result
            x = np.array(x)
            x[~active] = combiner.identity_in(x.dtype)
        self.exchange.reduce(x, reduce, out, plan)
        if combiner.identity != 0:
            whole = self.global_in_degrees if at == "dst" else self.global_out_degrees
            out[whole[:self.num_masters] == 0] = 0
        return out

    def gathered_at(self, at):
        """This graph as a broadcast before a gather by `at` sees it (see GatheredAt)."""
        ends = self.__dict__.setdefault("_ends", {})
        if at not in ends:
            ends[at] = GatheredAt(self, at)
        return ends[at]

    def broadcast_to_mirrors(self, x, out, at=None):
        """MasterBroadcast: x has a row per master, out per local vertex; with `at`, only
        the mirrors with local edges at that end receive theirs (the others get 0)."""
        plan = None
        if at is not None:
            sends, receives = self.exchange.restricted((id(self), at), self.active(at))
            plan = (receives, sends)        # a broadcast runs the reduction's plan backwards
        return self.exchange.broadcast(x, out, plan)

    def __repr__(self):
        return (f"LocalGraph(rank={self.exchange.rank}, num_nodes={self.num_nodes} "
                f"({self.num_masters} masters), num_edges={self.num_edges})")


class RankReadoutGraph(ReadoutGraph):
    """A rank's readout graph for a batch of graphs partitioned by vertex: edge i joins
    master i to its graph `graph_ids[i]` (of `num_graphs`), so an aggregation over it at
    the graphs is the rank's partial readout, which ngnn.distributed.lowering combines over
    the ranks (ReadoutAllReduce). `holds` (ranks, num_graphs): which ranks hold vertices
    of each graph; `graph_sizes`: each graph's vertices over all ranks. `every`, each rank's
    count of vertices per graph, is gathered from the ranks unless given (a caller that
    partitions the batch the same way on every rank computes it locally)."""

    def __init__(self, graph_ids, num_graphs, exchange, every=None):
        n = graph_ids.shape[0]
        super().__init__(np.arange(n, dtype=np.int64), graph_ids, max(n, num_graphs),
                         num_graphs)
        self.exchange = exchange
        if every is None:       # (ranks, num_graphs) vertex counts, unless the caller knows
            counts = np.bincount(graph_ids, minlength=num_graphs).astype(np.int64)
            every = np.empty((exchange.size, num_graphs), np.int64)
            wait([exchange.comm.Iallgather(counts, every)])
        self.holds = _readonly(every > 0)
        self.graph_sizes = _readonly(every.sum(axis=0))

    def combine_ranks(self, x, reduce, out):
        """ReadoutAllReduce: x's per-graph rows (its first num_graphs) combined over the
        ranks in rank order into out, the same on every rank; the other rows copied."""
        self.combine_gathered(x, self.exchange.allgather(x[:self.num_dst]), reduce, out)
        return out

    def combine_gathered(self, x, every, reduce, out):
        """combine_ranks's combination of `every`, every rank's per-graph rows of x in rank
        order (gathered by combine_ranks, or packed with other collectives:
        Exchange.packing)."""
        graphs = self.num_dst
        np.copyto(out, x)
        combiner = COMBINERS[reduce]
        if combiner.identity == 0:
            total = every[0].copy()
            for partial in every[1:]:
                total += partial
        else:       # over the ranks that hold vertices of the graph
            total = np.full(every.shape[1:], combiner.identity_in(x.dtype), x.dtype)
            for holds, partial in zip(self.holds, every):
                combiner.fold(total, holds, partial[holds])
            total[self.graph_sizes == 0] = 0       # no vertices anywhere: 0, as one process
        out[:graphs] = total
        return out

    def __repr__(self):
        return (f"RankReadoutGraph(rank={self.exchange.rank}, {self.num_edges} masters, "
                f"{self.num_dst} graphs)")


class GatheredAt:
    """A LocalGraph whose broadcasts reach only the mirrors with local edges at end `at`,
    the rows a gather by that end reads: what a MasterBroadcast before such a gather
    calls. Everything else is the LocalGraph's."""

    def __init__(self, local, at):
        self.local, self.at = local, at

    def broadcast_to_mirrors(self, x, out):
        return self.local.broadcast_to_mirrors(x, out, self.at)

    def __getattr__(self, name):
        return getattr(self.local, name)

    def __repr__(self):
        return f"{self.local!r} gathered at {self.at}"


class MasterView(Graph):
    """A LocalGraph seen from its masters (see the module docstring). It holds no edges of
    its own: graph ops over it exist only until insert_communication moves them onto
    `local`."""

    def __init__(self, local):       # no Graph.__init__: the view's edges reach mirrors
        self.local = local
        self.num_nodes = self.num_dst = local.num_masters
        self.num_edges = local.num_edges
        self.exchange = local.exchange
        self.global_node_ids = local.global_node_ids[:local.num_masters]

    def global_rows(self, rows):
        return (self, "global_node_ids") if rows == "n" else (self.local, "global_edge_ids")

    def vertex_degrees(self, which):
        return self.local.vertex_degrees(which)[:self.num_nodes]

    def with_self_loops(self):
        return self.local.with_self_loops().masters

    def __getattr__(self, name):
        # Everything that needs the edges (CSR, incidence, degrees) belongs to the
        # LocalGraph; reaching for it here means a graph op escaped the rewrite.
        raise AttributeError(f"MasterView has no {name!r}: graph ops over a rank's masters "
                             "run after ngnn.distributed.insert_communication, over its "
                             "LocalGraph")

    def __repr__(self):
        return (f"MasterView(rank={self.exchange.rank}, {self.num_nodes} masters, "
                f"num_edges={self.num_edges})")
