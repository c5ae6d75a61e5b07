"""The directed graph that graph ops run over.

Edge ``i`` goes ``src[i] -> dst[i]``; edge ids are positions in the edge list the graph was built
from. Everything a transformer needs to aggregate along edges (degrees, both CSR orders, the
permutations between them, incidence and adjacency matrices) is derived here once, with NumPy
sorting and counting rather than Python loops, so that graphs with millions of edges stay cheap.
"""

import functools
import hashlib
import numbers

import numpy as np
import scipy.sparse as sp


def _readonly(array):
    array.flags.writeable = False
    return array


def _as_ids(values, name):
    """Converts user ids to a fresh int64 array, rejecting anything that is not a whole number."""
    array = np.asarray(values)
    if array.ndim != 1:
        raise ValueError(f"{name} must be a 1-D array of node ids, got shape {array.shape}")
    kind = array.dtype.kind
    if kind == "b":
        raise ValueError(f"{name} must hold integer node ids, got booleans")
    if kind == "f":
        if not np.all(np.isfinite(array)):
            raise ValueError(f"{name} must hold integer node ids, got non-finite values")
        fractional = np.flatnonzero(array != np.floor(array))
        if fractional.size:
            i = fractional[0]
            raise ValueError(
                f"{name} must hold integer node ids, but {name}[{i}] = {array[i]} is not a whole number")
        return array.astype(np.int64)
    if kind == "u":
        if array.size and array.max() > np.iinfo(np.int64).max:
            raise ValueError(f"{name} holds ids too large for int64")
        return array.astype(np.int64)
    if kind == "i":
        return array.astype(np.int64)
    if kind in "USO" and array.size and isinstance(array.flat[0], str):
        raise ValueError(f"{name} must hold integer node ids, got strings such as {array.flat[0]!r}")
    raise ValueError(f"{name} must hold integer node ids, got dtype {array.dtype}")


def _check_range(ids, name, num_nodes):
    bad = np.flatnonzero((ids < 0) | (ids >= num_nodes))
    if bad.size:
        i = bad[0]
        raise ValueError(
            f"{name}[{i}] = {ids[i]} is out of range [0, {num_nodes}) "
            f"({bad.size} out-of-range id(s) in {name})")


def _inverse(permutation):
    """``inverse[permutation[p]] = p``: where each edge id sits in a CSR order."""
    inverse = np.empty_like(permutation)
    inverse[permutation] = np.arange(permutation.shape[0], dtype=permutation.dtype)
    return inverse


def _grouped(keys, num_nodes):
    """Stable CSR grouping of edge ids by ``keys``: (indptr, eids, counts)."""
    counts = np.bincount(keys, minlength=num_nodes).astype(np.int64)
    indptr = np.zeros(num_nodes + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    if np.all(keys[1:] >= keys[:-1]):     # already grouped (sampled blocks are)
        eids = np.arange(keys.size, dtype=np.int64)
    else:
        # A counting sort in SciPy's COO -> CSR conversion, O(E + N) against a sort's
        # O(E log E): row = key, column = edge id, so each row lists its edge ids in order.
        marks = np.ones(keys.size, dtype=np.int8)
        matrix = sp.csr_matrix((marks, (keys, np.arange(keys.size))),
                               shape=(num_nodes, keys.size))
        eids = matrix.indices.astype(np.int64)
    return indptr, eids, counts


class Graph:
    """A directed multigraph with ``num_nodes`` vertices and ``num_edges`` edges.

    Build one with ``from_edges``, ``from_scipy``, ``from_networkx``, ``from_edge_index``
    (PyTorch Geometric) or ``from_dgl``. Arrays are int64 and
    read-only; graphs are compared by identity (ops hold them as attributes), and ``fingerprint``
    identifies the structure for caches. Self-loops, multi-edges and isolated vertices are allowed.

    ``num_dst`` (default ``num_nodes``) makes a block, the graph one layer of a minibatch runs
    over: every edge ends at one of the first ``num_dst`` vertices, so per-vertex code traced
    with ``ng.zoomIn`` computes only those rows (seed 004's active row prefix) while
    neighbours are read from all ``num_nodes`` rows.
    """

    def __init__(self, src, dst, num_nodes=None, num_dst=None, edge_type=None,
                 num_relations=None):
        src = _as_ids(src, "src")
        dst = _as_ids(dst, "dst")
        if src.shape[0] != dst.shape[0]:
            raise ValueError(
                f"src and dst must have the same length, got {src.shape[0]} and {dst.shape[0]}")
        if num_nodes is None:
            # Clamped at 0 so that all-negative ids are reported as out of range, not as a bad count.
            num_nodes = max(int(max(src.max(), dst.max())) + 1, 0) if src.size else 0
        elif isinstance(num_nodes, bool) or not isinstance(num_nodes, numbers.Integral):
            raise ValueError(f"num_nodes must be an int, got {num_nodes!r}")
        num_nodes = int(num_nodes)
        if num_nodes < 0:
            raise ValueError(f"num_nodes must be non-negative, got {num_nodes}")
        _check_range(src, "src", num_nodes)
        if num_dst is None:
            num_dst = num_nodes
        elif isinstance(num_dst, bool) or not isinstance(num_dst, numbers.Integral) or \
                not 0 <= num_dst <= num_nodes:
            raise ValueError(f"num_dst must be an int in [0, num_nodes={num_nodes}], "
                             f"got {num_dst!r}")
        num_dst = int(num_dst)
        _check_range(dst, "dst", num_dst)
        self._set_edges(src, dst, num_nodes, num_dst, _grouped(dst, num_nodes),
                        _grouped(src, num_nodes))
        self._set_types(edge_type, num_relations)

    # Untyped unless built with edge_type= (see ngnn/relations.py for what types derive).
    edge_type = None
    num_relations = 0

    def _set_types(self, edge_type, num_relations):
        from ngnn.relations import checked_types
        if edge_type is not None or num_relations is not None:
            self.edge_type, self.num_relations = checked_types(edge_type, num_relations,
                                                               self.num_edges)

    def _set_edges(self, src, dst, num_nodes, num_dst, in_groups, out_groups, in_src=None,
                   out_dst=None):
        """Stores checked edges with their in- and out-CSR groups (indptr, eids, counts);
        `in_src` / `out_dst`, src and dst in CSR order, are derived unless given (shared
        arrays, as ngnn/relations.py gives its subgraphs)."""
        self.num_nodes = num_nodes
        self.num_dst = num_dst
        self.num_edges = int(src.shape[0])
        self.src = _readonly(src)
        self.dst = _readonly(dst)

        in_indptr, in_eids, in_degrees = in_groups
        out_indptr, out_eids, out_degrees = out_groups
        self.in_indptr = _readonly(in_indptr)
        self.in_eids = _readonly(in_eids)
        self.in_src = _readonly(src[in_eids] if in_src is None else in_src)
        self.in_degrees = _readonly(in_degrees)
        self.out_indptr = _readonly(out_indptr)
        self.out_eids = _readonly(out_eids)
        self.out_dst = _readonly(dst[out_eids] if out_dst is None else out_dst)
        self.out_degrees = _readonly(out_degrees)
        self._incidence = {}
        self._adjacency = None

    @classmethod
    def from_edges(cls, src, dst, num_nodes=None, num_dst=None, edge_type=None,
                   num_relations=None):
        """Graph with edge ``i`` going ``src[i] -> dst[i]``; ``num_nodes`` defaults to max id + 1,
        ``num_dst`` to ``num_nodes`` (see the class docstring). ``edge_type`` (integers in
        [0, num_relations), one per edge) makes a relation-typed graph: ``e.type`` inside
        ``ng.zoomIn`` (docs/rgcn.md)."""
        return cls(src, dst, num_nodes, num_dst, edge_type, num_relations)

    @staticmethod
    def batch(graphs):
        """One block-diagonal graph of `graphs` (a BatchedGraph, ngnn/batch.py): graph k's
        vertices follow graph k-1's; ``graph_ids``, ``num_graphs``, ``node_offsets``,
        ``edge_offsets`` and ``unbatch()`` tell them apart again."""
        from ngnn.batch import BatchedGraph
        return BatchedGraph(graphs)

    @classmethod
    def from_scipy(cls, matrix):
        """Graph with an edge ``i -> j`` for every stored nonzero ``(i, j)`` of a square matrix.

        Edges come in row-major order (by source, then target).
        """
        if not sp.issparse(matrix):
            raise ValueError(f"from_scipy needs a scipy sparse matrix, got {type(matrix).__name__}")
        if matrix.ndim != 2 or matrix.shape[0] != matrix.shape[1]:
            raise ValueError(f"from_scipy needs a square matrix, got shape {matrix.shape}")
        csr = sp.csr_matrix(matrix)
        csr.sum_duplicates()
        csr.eliminate_zeros()
        rows = np.repeat(np.arange(csr.shape[0], dtype=np.int64), np.diff(csr.indptr))
        return cls(rows, csr.indices.astype(np.int64), csr.shape[0])

    @classmethod
    def from_networkx(cls, graph):
        """Graph from a networkx graph, vertices renumbered 0..n-1 in ``graph``'s node order.

        Undirected graphs give both directions of every edge (a self-loop once); multigraphs keep
        every parallel edge. Edges come ordered by source, then target.
        """
        import networkx as nx

        nodes = list(graph.nodes())
        if not nodes:
            return cls([], [], 0)
        matrix = nx.to_scipy_sparse_array(graph, nodelist=nodes, weight=None, format="csr")
        # Converting to CSR merged networkx's uncombined entries; with weight=None each entry now
        # counts the parallel edges between its two vertices.
        matrix.sum_duplicates()
        matrix.eliminate_zeros()
        counts = matrix.data.astype(np.int64)
        rows = np.repeat(np.arange(len(nodes), dtype=np.int64), np.diff(matrix.indptr))
        src = np.repeat(rows, counts)
        dst = np.repeat(matrix.indices.astype(np.int64), counts)
        return cls(src, dst, len(nodes))

    @classmethod
    def from_edge_index(cls, edge_index, num_nodes=None):
        """Graph from PyTorch Geometric's (2, E) ``edge_index``: edge ``i`` goes
        ``edge_index[0, i] -> edge_index[1, i]``. Takes a NumPy array, a torch tensor or
        anything with ``__array__`` (ngnn does not import torch). ``num_nodes`` defaults to
        max id + 1."""
        from ngnn.foreign import to_numpy

        index = to_numpy(edge_index, "edge_index")
        if index.ndim != 2 or index.shape[0] != 2:
            hint = "; transpose it (an (E, 2) list of pairs)" \
                if index.ndim == 2 and index.shape[1] == 2 else ""
            raise ValueError(f"edge_index must have shape (2, E), got {index.shape}{hint}")
        return cls(_as_ids(index[0], "edge_index[0]"), _as_ids(index[1], "edge_index[1]"),
                   num_nodes)

    @classmethod
    def from_dgl(cls, graph):
        """Graph from a homogeneous DGL graph, with DGL's edge ids and node count. ngnn
        reads ``graph.edges()`` and ``graph.num_nodes()`` and does not import DGL."""
        from ngnn.foreign import to_numpy

        for method in ("edges", "num_nodes"):
            if not callable(getattr(graph, method, None)):
                raise ValueError(f"from_dgl needs a DGL graph (with .{method}()), got "
                                 f"{type(graph).__name__}")
        if getattr(graph, "is_homogeneous", True) is False:
            raise ValueError("from_dgl needs a homogeneous DGL graph (one node and one edge "
                             "type); convert a heterograph with dgl.to_homogeneous first")
        src, dst = graph.edges(order="eid")
        return cls(_as_ids(to_numpy(src, "DGL edges()[0]"), "src"),
                   _as_ids(to_numpy(dst, "DGL edges()[1]"), "dst"), int(graph.num_nodes()))

    @functools.cached_property
    def in_to_out(self):
        """For position ``p`` in in-CSR order, the position of the same edge in out-CSR order."""
        return _readonly(_inverse(self.out_eids)[self.in_eids])

    @functools.cached_property
    def out_to_in(self):
        """For position ``p`` in out-CSR order, the position of the same edge in in-CSR order."""
        return _readonly(_inverse(self.in_eids)[self.out_eids])

    def incidence(self, at="dst", dtype=np.float32):
        """Cached (N, E) CSR matrix with a 1 at (dst[e], e) (``at="dst"``) or (src[e], e) (``at="src"``).

        ``incidence("dst") @ edge_values`` sums an edge tensor onto destinations. The CSR rows are
        exactly the in-CSR (or out-CSR) groups, so no sorting is needed to build it.
        """
        if at not in ("dst", "src"):
            raise ValueError(f"incidence(at=...) must be 'dst' or 'src', got {at!r}")
        key = (at, np.dtype(dtype))
        if key not in self._incidence:
            if at == "dst":
                indptr, eids = self.in_indptr, self.in_eids
            else:
                indptr, eids = self.out_indptr, self.out_eids
            matrix = sp.csr_matrix(
                (np.ones(self.num_edges, dtype=dtype), eids, indptr),
                shape=(self.num_nodes, self.num_edges))
            self._incidence[key] = _freeze(matrix)
        return self._incidence[key]

    def adjacency(self):
        """Cached (N, N) CSR matrix with ``A[d, s]`` = number of edges ``s -> d`` (float32).

        ``adjacency() @ X`` sums in-neighbour features, counting parallel edges.
        """
        if self._adjacency is None:
            matrix = sp.csr_matrix(
                (np.ones(self.num_edges, dtype=np.float32), (self.dst, self.src)),
                shape=(self.num_nodes, self.num_nodes))
            matrix.sum_duplicates()
            self._adjacency = _freeze(matrix)
        return self._adjacency

    def add_self_loops(self):
        """New graph with an extra edge ``v -> v`` for every vertex (every destination vertex of
        a block), appended after existing edges."""
        self._check_untyped("add_self_loops")
        loops = np.arange(self.num_dst, dtype=np.int64)
        return Graph(np.concatenate([self.src, loops]), np.concatenate([self.dst, loops]),
                     self.num_nodes, self.num_dst)

    def with_self_loops(self):
        """New graph with exactly one self loop per vertex: existing loops are dropped, the
        other edges kept in order, then loop ``v -> v`` appended for every vertex in order
        (GCN's and GAT's A + I)."""
        self._check_untyped("with_self_loops")
        keep = self.src != self.dst
        loops = np.arange(self.num_dst, dtype=np.int64)
        # Built at once, not as a graph without loops plus loops: no third graph's worth of
        # index arrays at the peak.
        return Graph(np.concatenate([self.src[keep], loops]),
                     np.concatenate([self.dst[keep], loops]), self.num_nodes, self.num_dst)

    def reorder(self, policy, num_parts=8):
        """``(g2, order)``: the same graph with its vertices renumbered by a locality-aware
        ``policy``, "degree", "rcm" or "metis" (``ngnn.vertex_order``; ``num_parts`` is
        METIS's part count). g2's vertex ``k`` is this graph's vertex ``order[k]``, so node
        features become ``x[order]``; edge ``i`` of g2 is edge ``i`` here, so edge features
        stay as they are. See ``permute``."""
        from ngnn.vertex_order import vertex_order
        self._check_renumberable("reorder")
        order = vertex_order(self, policy, num_parts)
        return self.permute(order), order

    def permute(self, order):
        """The graph with vertex ``k`` being this graph's vertex ``order[k]`` (``order`` a
        permutation of ``range(num_nodes)``) and the same edges in the same order: edge ``i``
        goes ``rank[src[i]] -> rank[dst[i]]`` with ``rank = vertex_order.inverse(order)``.
        Node features of the new graph are ``x[order]``; a result ``y2`` computed on it is
        ``y2[rank]`` in this graph's numbering. The CSR groups are moved, not re-sorted:
        vertex k's group is vertex order[k]'s, in the same (edge id) order."""
        from ngnn.vertex_order import check_permutation, inverse
        self._check_renumberable("permute")
        order = check_permutation(order, self.num_nodes)
        rank = inverse(order)
        graph = Graph.__new__(Graph)
        graph._set_edges(rank[self.src], rank[self.dst], self.num_nodes, self.num_nodes,
                         _moved_groups(self.in_indptr, self.in_eids, order),
                         _moved_groups(self.out_indptr, self.out_eids, order))
        if self.edge_type is not None:       # the same edges in the same order
            graph._set_types(self.edge_type, self.num_relations)
        return graph

    def _check_untyped(self, what):
        if self.edge_type is not None:
            raise ValueError(f"{what}: {self!r} has edge types, which the new edges would "
                             "lack; build the graph with its extra edges and their types "
                             "with Graph.from_edges(..., edge_type=...)")

    def _check_renumberable(self, what):
        if self.varies or self.is_block or self.global_rows("n") is not None:
            raise ValueError(
                f"{what}: {self!r} is a {type(self).__name__} (a block, a slot or a "
                "partition's local graph), whose vertex numbering carries meaning; renumber "
                "the whole graph before sampling or partitioning it")

    def vertex_degrees(self, which):
        """The degrees vertex-centric code sees as ``v.indegree`` (which="in") or
        ``v.outdegree`` ("out"); a partition's local graph answers with the whole graph's."""
        return self.in_degrees if which == "in" else self.out_degrees

    def global_rows(self, rows):
        """Where the rows of a node (rows="n") or edge ("e") tensor of this graph sit in a
        larger graph it is part of, for dropouts keyed by global ids: (graph, attribute
        naming the global ids), or None for a whole graph."""
        return None

    def to_undirected(self):
        """New graph holding both directions of every edge, with duplicate edges removed.

        Parallel edges collapse to one per direction and a self-loop is kept once. Edge ids are not
        preserved: the result is sorted by (dst, src), the convention of the embedded datasets.
        """
        self._check_untyped("to_undirected")
        src = np.concatenate([self.src, self.dst])
        dst = np.concatenate([self.dst, self.src])
        keys = np.unique(dst * max(self.num_nodes, 1) + src)
        n = max(self.num_nodes, 1)
        return Graph(keys % n, keys // n, self.num_nodes)

    @functools.cached_property
    def fingerprint(self):
        """sha256 hex digest of the structure (num_nodes, src, dst), for caches keyed by graph."""
        digest = hashlib.sha256()
        sizes = [self.num_nodes, self.num_edges]
        if self.is_block:
            sizes.append(self.num_dst)
        digest.update(np.array(sizes, dtype=np.int64).tobytes())
        digest.update(self.src.tobytes())
        digest.update(self.dst.tobytes())
        if self.edge_type is not None:
            digest.update(np.int64(self.num_relations).tobytes())
            digest.update(self.edge_type.tobytes())
        return digest.hexdigest()

    # Whether the edges may be replaced between calls of a computation (GraphSlot): then
    # nothing may be derived from them when a computation is built.
    varies = False

    @property
    def is_block(self):
        """Whether only a prefix of the vertices has in-edges (num_dst < num_nodes)."""
        return self.num_dst < self.num_nodes

    def __repr__(self):
        block = f", num_dst={self.num_dst}" if self.is_block else ""
        typed = f", num_relations={self.num_relations}" if self.edge_type is not None else ""
        return f"Graph(num_nodes={self.num_nodes}{block}, num_edges={self.num_edges}{typed})"


def _moved_groups(indptr, eids, order):
    """CSR groups (indptr, eids, counts) with group ``k`` being group ``order[k]`` of the
    given ones: one vectorized gather of every edge id, no sort."""
    counts = np.diff(indptr)[order]
    new_indptr = np.zeros(order.shape[0] + 1, dtype=np.int64)
    np.cumsum(counts, out=new_indptr[1:])
    # Position p of the new eids reads old position p + (old start - new start) of its group.
    positions = np.repeat(indptr[:-1][order] - new_indptr[:-1], counts)
    positions += np.arange(positions.shape[0], dtype=np.int64)
    return new_indptr, eids[positions], counts


def _freeze(matrix):
    # Cached matrices are shared by every caller, so an in-place edit must fail loudly.
    for array in (matrix.data, matrix.indices, matrix.indptr):
        array.flags.writeable = False
    return matrix
