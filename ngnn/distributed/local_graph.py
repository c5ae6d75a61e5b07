"""A rank's local graph: its part's vertices and edges in local ids, plus what relates them
to the whole graph (global ids, the whole graph's degrees) and the Exchange that talks to
the other ranks.

Graph ops over it compute on local edges only; `ngnn.distributed.lowering` adds the
communication that makes their results those of the whole graph. Vertex-centric code sees
the whole graph's degrees (`vertex_degrees`), and dropout masks are keyed by global ids
(`global_rows`).
"""
import functools

import numpy as np

from ngnn.graph import Graph, _readonly


class LocalGraph(Graph):
    def __init__(self, src, dst, num_nodes, global_node_ids, global_edge_ids, num_masters,
                 global_num_nodes, global_num_edges, exchange):
        super().__init__(src, dst, num_nodes)
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

    # ---- what vertex-centric code and dropout see ----------------------------------------
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
        reduced = self.exchange.reduce(counts, "sum", np.empty_like(counts), kind=None)
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
    def reduce_to_masters(self, x, reduce, at, out):
        """MirrorReduce (see there for `at`)."""
        if at is None:
            return self.exchange.reduce(x, reduce, out)
        active = (self.in_degrees if at == "dst" else self.out_degrees) > 0
        plan = self.exchange.restricted((id(self), at), active)
        if reduce != "sum":
            x = np.array(x)
            x[~active] = -np.inf if reduce == "max" else np.inf
        self.exchange.reduce(x, reduce, out, plan)
        if reduce != "sum":
            whole = self.global_in_degrees if at == "dst" else self.global_out_degrees
            out[whole == 0] = 0
        return out

    def broadcast_to_mirrors(self, x, out):
        return self.exchange.broadcast(x, out)

    def __repr__(self):
        return (f"LocalGraph(rank={self.exchange.rank}, num_nodes={self.num_nodes} "
                f"({self.num_masters} masters), num_edges={self.num_edges})")
