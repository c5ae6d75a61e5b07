"""Locality-aware vertex orders (seed 003's selective scheduling needs one to pay).

An order is a permutation ``order`` of ``range(num_nodes)``: the renumbered graph's vertex
``k`` is the original vertex ``order[k]`` (so node features become ``x[order]``), and
``rank = inverse(order)`` maps the other way, original vertex ``v`` to new id ``rank[v]``.
``Graph.reorder(policy)`` returns the renumbered graph and its order. Policies:

* ``degree``: descending total degree (in + out), ties in the original order. After it the
  edges of an edge chunk concentrate on few source rows: the forward pass streams source
  rows and profits from grouping the destinations of many edges (in-degree), the backward
  pass streams destination rows and profits from grouping sources (out-degree); the total
  serves both (docs/vertex_order.md has the measurements).
* ``rcm``: reverse Cuthill-McKee (SciPy) on the symmetrized adjacency: neighbours get nearby
  ids, so edges sit near the diagonal of the P x P chunk grid.
* ``metis``: METIS (the optional `pymetis` package) splits the symmetrized graph into
  ``num_parts`` parts of equal vertex count with few edges between them; vertices are
  numbered part by part, by descending total degree inside a part.

Everything is vectorized NumPy / SciPy; no loop visits a vertex or an edge in Python.
"""
import difflib
import numbers

import numpy as np
import scipy.sparse as sp

POLICIES = ("degree", "rcm", "metis")


def vertex_order(graph, policy, num_parts=8):
    """The permutation ``order`` of ``policy`` for ``graph`` (int64, length num_nodes)."""
    if policy not in POLICIES:
        close = difflib.get_close_matches(str(policy).lower(), POLICIES, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"reorder: unknown policy {policy!r}{hint}; policies: "
                         f"{', '.join(POLICIES)}")
    if isinstance(num_parts, bool) or not isinstance(num_parts, numbers.Integral) or \
            num_parts < 1:
        raise ValueError(f"reorder: num_parts must be a positive int, got {num_parts!r}")
    if policy == "degree" or graph.num_nodes == 0:
        return degree_order(graph)
    if policy == "rcm":
        return rcm_order(graph)
    return metis_order(graph, int(num_parts))


def degree_order(graph):
    """Vertices by descending in + out degree; a stable sort keeps ties in id order."""
    degree = graph.in_degrees + graph.out_degrees
    return np.argsort(-degree, kind="stable").astype(np.int64)


def rcm_order(graph):
    from scipy.sparse.csgraph import reverse_cuthill_mckee
    return reverse_cuthill_mckee(symmetrized(graph), symmetric_mode=True).astype(np.int64)


def metis_order(graph, num_parts):
    n = graph.num_nodes
    if num_parts > max(n, 1):
        raise ValueError(f"reorder: {num_parts} METIS parts for {n} vertices; give "
                         "num_parts <= num_nodes")
    part = metis_parts(graph, num_parts, "reorder policy 'metis' needs the pymetis package: "
                       "pip install pymetis (or ngnn's [mpi] extra); 'degree' and 'rcm' need "
                       "only SciPy")
    degree = graph.in_degrees + graph.out_degrees
    # lexsort's last key is the primary one: by part, then by descending degree, then by id.
    return np.lexsort((-degree, part)).astype(np.int64)


def metis_parts(graph, num_parts, missing_message, vertex_weights=None):
    """Each vertex's METIS part (int64, seed 0) over the symmetrized graph; ValueError with
    `missing_message` without pymetis."""
    try:
        import pymetis
    except ImportError:
        raise ValueError(missing_message) from None
    if num_parts == 1 or graph.num_nodes == 0:
        return np.zeros(graph.num_nodes, dtype=np.int64)
    both = symmetrized(graph)
    # xadj/adjncy: the form every pymetis release takes (CSRAdjacency came in 2025.2).
    _, membership = pymetis.part_graph(num_parts, xadj=both.indptr, adjncy=both.indices,
                                       vweights=vertex_weights,
                                       options=pymetis.Options(seed=0))
    return np.asarray(membership, dtype=np.int64)


def symmetrized(graph):
    """CSR pattern of A + A^T without self loops (METIS takes none, and they tell neither
    policy anything about neighbours): one entry per connected pair."""
    n = graph.num_nodes
    keep = graph.src != graph.dst
    src, dst = graph.src[keep], graph.dst[keep]
    ones = np.ones(2 * src.shape[0], dtype=np.int8)
    rows = np.concatenate([src, dst])
    cols = np.concatenate([dst, src])
    both = sp.csr_matrix((ones, (rows, cols)), shape=(n, n))
    both.sum_duplicates()
    both.data[:] = 1
    return both


def inverse(order):
    """``rank`` with ``rank[order[k]] = k``: the new id of each original vertex."""
    rank = np.empty_like(order)
    rank[order] = np.arange(order.shape[0], dtype=order.dtype)
    return rank


def check_permutation(order, num_nodes):
    """``order`` as an int64 array if it is a permutation of range(num_nodes), else an error
    naming the first problem."""
    array = np.asarray(order)
    if array.ndim != 1 or array.shape[0] != num_nodes:
        raise ValueError(f"permute: order must have shape ({num_nodes},), one entry per "
                         f"vertex, got shape {array.shape}")
    if array.size and array.dtype.kind not in "iu":
        raise ValueError(f"permute: order must hold integer vertex ids, got dtype {array.dtype}")
    array = array.astype(np.int64)
    outside = np.flatnonzero((array < 0) | (array >= num_nodes))
    if outside.size:
        i = outside[0]
        raise ValueError(f"permute: order[{i}] = {array[i]} is not a vertex id in "
                         f"[0, {num_nodes})")
    counts = np.bincount(array, minlength=num_nodes)
    if np.any(counts != 1):
        v = int(np.flatnonzero(counts != 1)[0])
        raise ValueError(f"permute: order is not a permutation: vertex {v} appears "
                         f"{int(counts[v])} times")
    return array
