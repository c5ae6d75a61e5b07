"""Helpers the generated NumPy modules call (`K.` in `comp.source`).

Every one is vectorized: aggregations are SciPy sparse products or segment reductions
over the CSR order, never a Python loop over nodes or edges.
"""
import math
import threading
from collections import OrderedDict

import numpy as np
import scipy.sparse

from ngnn import philox
from ngnn.op_graph.combiners import COMBINERS

from ..debug_nans import check_finite  # noqa: F401  (called by modules built with debug_nans)

try:   # SciPy's kernels for CSR (CSC) @ dense that accumulate into a given output
    from scipy.sparse._sparsetools import csc_matvecs, csr_matvecs
except ImportError:        # pragma: no cover - other SciPy layouts
    csc_matvecs = csr_matvecs = None


def view(buffer, shape, dtype):
    """A tensor at offset 0 of a shared uint8 buffer."""
    dtype = np.dtype(dtype)
    # math.prod, not np.prod: fused groups view their workspace on every call, and
    # np.prod's dispatch cost more than the view (shapes are ints, so no overflow).
    nbytes = math.prod(shape) * dtype.itemsize
    return buffer[:nbytes].view(dtype).reshape(shape)


def spmm(matrix, x, out):
    """out = matrix @ x for a CSR matrix, written into `out` (no temporary result)."""
    cols = np.ascontiguousarray(x, dtype=matrix.dtype)
    return csr_product(matrix.shape, matrix.indptr, matrix.indices, matrix.data, cols, out)


def csr_product(shape, indptr, indices, data, x, out):
    """out = CSR(shape) @ x, rows of x and out flattened past their first axis; x must be
    C-contiguous. SciPy's kernel accumulates straight into `out` when it can."""
    width = x.size // max(shape[1], 1) if x.size else 0
    if csr_matvecs is None or not out.flags.c_contiguous:
        matrix = scipy.sparse.csr_matrix((data, indices, indptr), shape=shape)
        np.copyto(out, (matrix @ x.reshape(shape[1], width)).reshape(out.shape))
        return out
    out.fill(0)
    if width and len(indices):
        csr_matvecs(shape[0], shape[1], width, indptr, indices, data, x.reshape(-1),
                    out.reshape(-1))
    return out


def incidence(graph, at, dtype):
    """(N, E) CSR with a 1 at (end of edge e, e), in the dtype of the values it sums."""
    cache = graph.__dict__.setdefault("_ngnn_incidence", {})
    key = (at, np.dtype(dtype).str)
    if key not in cache:
        cache[key] = graph.incidence(at).astype(dtype)
    return cache[key]


def aggregate_sum(graph, x, at, out):
    return spmm(incidence(graph, at, out.dtype), x, out)


def aggregate_mean(graph, x, at, out):
    aggregate_sum(graph, x, at, out)
    degrees = graph.in_degrees if at == "dst" else graph.out_degrees
    out /= np.maximum(degrees, 1).reshape((-1,) + (1,) * (out.ndim - 1)).astype(out.dtype)
    return out


def _csr_order(graph, at):
    if at == "dst":
        return graph.in_indptr, graph.in_eids
    return graph.out_indptr, graph.out_eids


def aggregate_segments(graph, x, at, reduce, out):
    """A reduction of the table (ngnn/op_graph/combiners.py) over each vertex's edges, by
    its ufunc's reduceat over the CSR segments; vertices with no edges get 0."""
    indptr, eids = _csr_order(graph, at)
    in_order = np.take(x, eids, axis=0)     # np.take: x[eids] is slower on narrow rows
    return segment_reduce(in_order, indptr, reduce, out)


def edge_softmax(graph, x, at, out):
    """exp(x - max) / sum(exp(x - max)) over each vertex's edges, stably."""
    ends = graph.dst if at == "dst" else graph.src
    n = graph.num_nodes
    peak = aggregate_segments(graph, x, at, "max", np.empty((n,) + x.shape[1:], x.dtype))
    np.subtract(x, np.take(peak, ends, axis=0), out=out)
    np.exp(out, out=out)
    # The denominator summed in float64 and rounded once, as WideAccumulation sums a
    # distributed softmax's: the same whatever the order of the edges.
    total = np.empty(peak.shape, np.float64)
    aggregate_sum(graph, out, at, total)
    out /= np.take(total, ends, axis=0).astype(out.dtype)
    return out


def softmax(x, axis, out):
    np.subtract(x, np.max(x, axis=axis, keepdims=True), out=out)
    np.exp(out, out=out)
    out /= np.sum(out, axis=axis, keepdims=True)
    return out


def log_softmax(x, axis, out):
    np.subtract(x, np.max(x, axis=axis, keepdims=True), out=out)
    out -= np.log(np.sum(np.exp(out), axis=axis, keepdims=True))
    return out


def relu(x, out):
    """out = max(x, 0), NaN kept. np.maximum against a zero array of x's shape runs its
    vectorized loop, three times as fast as against the scalar 0 (NumPy 2.4); the zeros
    are a view of one calloc'd array that only grows, whose pages are never written."""
    zeros = _zeros(x.size, x.dtype)
    return np.maximum(x, zeros[:x.size].reshape(x.shape), out=out)


def _zeros(size, dtype):
    dtype = np.dtype(dtype)
    zeros = _ZEROS.get(dtype)
    if zeros is None or zeros.size < size:
        zeros = _ZEROS[dtype] = np.zeros(max(size, 1 << 16), dtype)
    return zeros


_ZEROS = {}


def _ones(size, dtype):
    """At least `size` ones of `dtype`: the data of an unweighted block's sparse product,
    kept instead of made on every call."""
    dtype = np.dtype(dtype)
    ones = _ONES.get(dtype)
    if ones is None or ones.size < size:
        ones = _ONES[dtype] = np.ones(max(size, 1 << 12), dtype)
        ones.flags.writeable = False
    return ones


_ONES = {}


def dropout(x, seed, step, rate, out):
    """out = x * keep / (1 - rate); keep drawn by Philox (ngnn/philox.py) from the seed, the
    call number and each element's flat index."""
    return philox.dropout(x, seed, step, rate, out)


def dropout_keep(seed, step, rate, shape):
    """The keep bits of a whole tensor's dropout mask (one byte each): a fused group draws
    them once at C speed and reads the rows of each block."""
    return philox.keep_bits(seed, step, rate, np.empty(shape, np.bool_))


def dropout_rows(x, seed, step, rate, rows, out):
    """dropout, row i at the positions of row rows[i] (ngnn.op_graph.Dropout's rows)."""
    keep = dropout_keep_rows(seed, step, rate, out.shape, rows)
    return apply_keep(np.broadcast_to(x, out.shape), keep, rate, out)


SPARSE_ROWS = 4       # rows at most a quarter of their span: draw the span once, keep it
RECENT_MASKS = 4      # the masks kept (the latest calls' scattered-row dropouts)
_span_masks = OrderedDict()       # (seed, call number, rate, row width) -> keep bits
_row_masks = OrderedDict()        # (seed, call number, rate, row width) -> (rows, keep bits)


def _remember(cache, key, value):
    cache[key] = value
    while len(cache) > RECENT_MASKS:
        cache.popitem(last=False)
    return value


def dropout_keep_rows(seed, step, rate, shape, rows):
    """The keep bits of a dropout whose row i takes the row-major positions of row
    rows[i]: drawn at C speed (NumPy's Philox) over the span of the ids, one chunk of
    rows at a time, keeping the rows asked for. Costs at most a whole tensor's draw.

    Scattered rows (a rank's masters under cvc or metis) cost the draw of their whole
    span, so the bits of the latest calls are kept (one byte per element, a quarter of
    the float32 tensor): the backward pass's dropout and every fused group that applies
    the same mask in the same step read them instead of drawing the span again."""
    width = int(np.prod(shape[1:], dtype=np.int64))
    keep = np.empty((len(rows), width), np.bool_)
    if keep.size == 0:
        return keep.reshape(shape)
    first = int(rows[0])
    if int(rows[-1]) - first + 1 == len(rows) and np.all(np.diff(rows) == 1):
        # Consecutive ids (a block of rows): the mask of positions first * width on.
        return philox.keep_bits(seed, step, rate, keep.reshape(-1), start=first * width) \
            .reshape(shape)
    key = (seed, step, rate, width)
    span = int(rows.max()) + 1
    if len(rows) * SPARSE_ROWS < span:
        # Few rows scattered over many (an edge piece of a chunked run, whose every stage
        # draws the same mask): the mask of rows [0, span) is drawn once per call number.
        mask = _span_masks.get(key)
        if mask is None or mask.shape[0] < span:
            mask = _remember(_span_masks, key, philox.keep_bits(
                seed, step, rate, np.empty((span, width), np.bool_)))
        return mask[rows].reshape(shape)
    kept = _row_masks.get(key)
    if kept is not None and kept[0] is rows:
        return kept[1].reshape(shape)
    order = np.argsort(rows, kind="stable")
    ids = np.asarray(rows, dtype=np.int64)[order]
    threshold = np.uint32(philox.keep_threshold(rate))
    per_chunk = max(1, philox.CHUNK // width)
    done = 0
    while done < len(ids):
        low = int(ids[done])
        high = low + per_chunk
        stop = int(np.searchsorted(ids, high, side="left"))
        high = int(ids[stop - 1]) + 1
        words = philox.words(seed, low * width, (high - low) * width, step)
        keep[order[done:stop]] = words.reshape(high - low, width)[ids[done:stop] - low] >= \
            threshold
        done = stop
    keep.flags.writeable = False
    _remember(_row_masks, key, (rows, keep))
    return keep.reshape(shape)


def apply_keep(x, keep, rate, out):
    """out = x * keep / (1 - rate) (the arithmetic of philox.dropout)."""
    np.multiply(x, philox.keep_scale(rate, out.dtype), out=out)
    out *= keep
    return out


def sparse_dropout(x, seed, step, rate, ids=None):
    """Dropout of the stored values of a CSR matrix: the value at (i, j) gets the mask of
    dense position i * F + j (ids[i] * F + j when keyed by row ids), so it equals the dense
    dropout there."""
    rows = np.repeat(np.arange(x.shape[0], dtype=np.uint64) if ids is None else
                     np.asarray(ids, dtype=np.uint64), np.diff(x.indptr))
    positions = rows * np.uint64(x.shape[1]) + x.indices.astype(np.uint64)
    data = philox.dropout_at(x.data, seed, step, rate, positions, np.empty_like(x.data))
    return scipy.sparse.csr_matrix((data, x.indices, x.indptr), shape=x.shape)


def sparse_dot(x, w, out):
    """out = x @ w for a CSR x, without densifying x."""
    return spmm(x, w, out)


def sparse_transposed_dot(x, d, out):
    """out = x^T @ d for a CSR x: its arrays read as the CSC form of x^T."""
    d = np.ascontiguousarray(d, dtype=out.dtype)
    if csc_matvecs is None:
        np.copyto(out, x.T @ d)
        return out
    out.fill(0)
    if x.nnz and out.size:
        csc_matvecs(x.shape[1], x.shape[0], d.shape[1], x.indptr, x.indices,
                    x.data.astype(out.dtype, copy=False), d.reshape(-1), out.reshape(-1))
    return out


def one_hot(labels, out):
    classes = out.shape[-1]
    if labels.size and (labels.min() < 0 or labels.max() >= classes):
        bad = labels[(labels < 0) | (labels >= classes)][0]
        raise ValueError(f"one_hot: class id {bad} is outside [0, {classes})")
    np.equal(labels[..., None], np.arange(classes), out=out, casting="unsafe")
    return out


# ---- batch normalization over the live rows (ngnn/op_graph/normalization.py) -------------
# A (rows, F) result gets its live rows written, the rest zeroed. Column sums are products
# with a vector of ones (BLAS gemv: a third of the time of np.add.reduce down the rows, and
# as deterministic); the centred rows live in a scratch array kept between calls.

def live_rows(live, rows):
    """How many leading rows are real: all `rows` without `live`, else those whose index
    is below live[0] (an integer count in practice)."""
    return rows if live is None else min(max(math.ceil(live[0]), 0), rows)


def column_sums(rows, out):
    return np.matmul(_ones(rows.shape[0], rows.dtype)[:rows.shape[0]], rows, out=out)


def _scratch(shape, dtype):
    """An uninitialized array of `shape`, a view of one kept buffer per thread (ranks may
    run as threads) that only grows: a kernel's temporary, valid until the next kernel
    asks for one (a new array of this size per call would be mapped and faulted in by the
    allocator every time)."""
    dtype = np.dtype(dtype)
    size = math.prod(shape)
    kept = _per_thread.__dict__.setdefault("scratch", {})
    scratch = kept.get(dtype)
    if scratch is None or scratch.size < size:
        scratch = kept[dtype] = np.empty(max(size, 1 << 16), dtype)
    return scratch[:size].reshape(shape)


_per_thread = threading.local()


def _centred(x, mean):
    return np.subtract(x, mean, out=_scratch(x.shape, x.dtype))


def zero_row_matmul(a, b, live, contract, out):
    """a @ b where rows past live[0] of a (contract=False) or of b (contract=True) are 0
    (ZeroRowDot): from the live rows alone."""
    if contract:
        n = live_rows(live, b.shape[0])
        return np.matmul(a[:, :n], b[:n], out=out)
    n = live_rows(live, a.shape[0])
    np.matmul(a[:n], b, out=out[:n])
    out[n:] = 0
    return out


def batch_norm_stats(x, live, out):
    """out[0] the mean, out[1] the biased variance of each column over the live rows."""
    n = live_rows(live, x.shape[0])
    mean, var = out
    column_sums(x[:n], mean)
    mean /= max(n, 1)
    centred = _centred(x[:n], mean)
    np.einsum("ij,ij->j", centred, centred, out=var)
    var /= max(n, 1)
    return out


def batch_norm_apply(x, stats, weight, bias, live, eps, out):
    """(x - mean) / sqrt(var + eps) * weight + bias. Centred first, as torch does: x * scale
    + (bias - mean * scale) saves a pass but loses digits where |mean| >> std."""
    n = live_rows(live, x.shape[0])
    rows = out[:n]
    np.subtract(x[:n], stats[0], out=rows)
    rows *= weight / np.sqrt(stats[1] + eps)
    rows += bias
    out[n:] = 0
    return out


def batch_norm_apply_grad(delta, stats, weight, live, eps, out):
    n = live_rows(live, delta.shape[0])
    np.multiply(delta[:n], weight / np.sqrt(stats[1] + eps), out=out[:n])
    out[n:] = 0
    return out


def batch_norm_apply_sums(delta, x, stats, live, out):
    """out[0] = sum of delta * (x - mean), out[1] = sum of delta, over the live rows."""
    n = live_rows(live, x.shape[0])
    column_sums(delta[:n], out[1])
    np.einsum("ij,ij->j", delta[:n], _centred(x[:n], stats[0]), out=out[0])
    return out


def batch_norm_stats_grad(delta, x, stats, live, out):
    """(delta[0] + 2 delta[1] (x - mean)) / n on the n live rows."""
    n = live_rows(live, x.shape[0])
    inverse = 1.0 / max(n, 1)
    np.subtract(x[:n], stats[0], out=out[:n])
    out[:n] *= delta[1] * (2.0 * inverse)
    out[:n] += delta[0] * inverse
    out[n:] = 0
    return out


# ---- fused groups: one block of vertices (a CSR slice) at a time ---------------------------

def blocks(graph, at, max_edges):
    """(v0, v1, p0, p1) vertex ranges whose edges (CSR positions p0:p1) number at most
    `max_edges`, unless one vertex alone has more."""
    cache = graph.__dict__.setdefault("_ngnn_blocks", {})
    key = (at, int(max_edges))
    if key not in cache:
        indptr = graph.in_indptr if at == "dst" else graph.out_indptr
        n = graph.num_nodes
        starts = [0]
        while starts[-1] < n:        # one iteration per block, each a binary search
            v0 = starts[-1]
            v1 = int(np.searchsorted(indptr, indptr[v0] + max_edges, side="right")) - 1
            starts.append(min(max(v1, v0 + 1), n))
        cache[key] = [(v0, v1, int(indptr[v0]), int(indptr[v1]))
                      for v0, v1 in zip(starts[:-1], starts[1:])]
    return cache[key]


def block_array(workspace, rows):
    """The first `rows` rows of a workspace array, or a new array when the block has more
    rows than the workspace (a vertex of a GraphSlot with more edges than a block holds)."""
    if rows <= len(workspace):
        return workspace[:rows]
    return np.empty((rows,) + workspace.shape[1:], workspace.dtype)


def segment_ids(seg, v0):
    """The vertex of each edge of a block, from the block's local indptr."""
    return np.repeat(np.arange(v0, v0 + len(seg) - 1), np.diff(seg))


def segment_reduce(values, seg, reduce, out):
    """Reduce each segment of sorted edge rows by the table's `reduce` (its ufunc's
    reduceat, then a division by the count for a mean); empty segments give 0."""
    combiner = COMBINERS[reduce]
    counts = np.diff(seg)
    nonempty = counts > 0
    out.fill(0)
    if nonempty.any():
        out[nonempty] = combiner.ufunc.reduceat(values, seg[:-1][nonempty], axis=0)
        if combiner.divides:
            divide_by_degrees(out, seg)
    return out


def divide_by_degrees(out, seg):
    """out /= each segment's edge count (at least 1), in out's dtype: an int64 divisor
    would make NumPy divide the rows in float64 and cast them back."""
    degrees = np.maximum(np.diff(seg), 1).astype(out.dtype)
    out /= degrees.reshape((-1,) + (1,) * (out.ndim - 1))


def by_head(x, heads, out):
    """x of shape (N, heads, ...) as `heads` contiguous (N, F) matrices, the layout the
    per-head products of gather_sum read, written into `out` (heads, N, F): a kept
    buffer, as a new array this size pays for fresh pages on every call (GAT's backward
    at R-MAT 500K: the 128 MB copy took 211 ms a training step new)."""
    np.copyto(out, x.reshape(x.shape[0], heads, out.shape[2]).transpose(1, 0, 2))
    return out


def gather_sum(x, weight, cols, seg, reduce, out):
    """out[v] = sum over the block's edges e of v of weight[e] * x[cols[e]] (mean divides
    by the degree): a sparse product over the block's CSR with the weights as its data, so
    the gathered rows are never copied. A weight of shape (n_e, H, 1, ...) scales each of H
    heads: then x is by_head(x, H), and each head is one product whose data is that head's
    column of weights."""
    n_v, n_e = len(seg) - 1, len(cols)
    heads = 1 if weight is None else int(np.prod(weight.shape[1:], dtype=np.int64))
    if heads == 1:
        data = _ones(n_e, out.dtype)[:n_e] if weight is None else \
            np.ascontiguousarray(weight.reshape(n_e))
        csr_product((n_v, x.shape[0]), seg, cols, data, x, out)
    else:
        weights = np.ascontiguousarray(weight.reshape(n_e, heads).T)
        per_head = np.empty((heads, n_v, x.shape[2]), out.dtype)
        for h in range(heads):
            csr_product((n_v, x.shape[1]), seg, cols, weights[h], x[h], per_head[h])
        np.copyto(out.reshape(n_v, heads, -1), per_head.transpose(1, 0, 2))
    if reduce == "mean":
        divide_by_degrees(out, seg)
    return out


def row_sums(product, width, out):
    """out = the sums of `product`'s rows of `width` values (its trailing axes), as a
    matrix product with ones: BLAS's dot per row, where np.einsum's loop over rows of a
    few values (a per-head dot product's 8 features) is 2.6 times slower."""
    rows = product.size // width if width else 0
    np.matmul(product.reshape(rows, width), _ones(width, product.dtype)[:width],
              out=out.reshape(rows))
    return out


def gathered_row_dot(table, ids, rows, out):
    """out[e, h] = sum over f of table[ids[e], f, h] * rows[e, f]: each edge's row of an
    edge value against its vertex's (F, H) matrix, as one sparse product whose row e holds
    rows[e] at the columns of vertex ids[e] of the table seen as (N * F, H), so the
    vertex's rows are never gathered per edge."""
    n_e, width = len(ids), table.shape[1]
    columns = (ids.astype(np.int64) * width)[:, None] + np.arange(width)
    indptr = np.arange(0, n_e * width + 1, width)
    data = np.ascontiguousarray(rows.reshape(n_e, width), dtype=out.dtype)
    return csr_product((n_e, table.shape[0] * width), indptr, columns.reshape(-1),
                       data.reshape(-1), table, out)


def weighted_row_sum(rows, weight, seg, reduce, out):
    """out[v, h] = sum over the block's edges e of v of weight[e, h] * rows[e] (mean
    divides by the degree), for rows (n_e, 1, F) of an edge value and weight (n_e, H, 1):
    one sparse product per head whose columns are the block's own rows, so the (n_e, H, F)
    products are never made. The rows are cast to out's dtype (a widened sum)."""
    n_v, n_e = len(seg) - 1, len(rows)
    heads = out.shape[1]
    x = np.ascontiguousarray(rows.reshape(n_e, out.shape[2]), dtype=out.dtype)
    weights = np.ascontiguousarray(weight.reshape(n_e, heads).T)
    columns = _positions(n_e, seg.dtype)
    per_head = np.empty((heads, n_v, x.shape[1]), out.dtype)
    for h in range(heads):
        csr_product((n_v, n_e), seg, columns, weights[h], x, per_head[h])
    np.copyto(out, per_head.transpose(1, 0, 2))
    if reduce == "mean":
        divide_by_degrees(out, seg)
    return out


def _positions(size, dtype):
    """0, 1, ..., size - 1 as `dtype` (the block-local columns of weighted_row_sum),
    kept instead of made for every block."""
    dtype = np.dtype(dtype)
    positions = _POSITIONS.get(dtype)
    if positions is None or positions.size < size:
        positions = _POSITIONS[dtype] = np.arange(max(size, 1 << 12), dtype=dtype)
        positions.flags.writeable = False
    return positions[:size]


_POSITIONS = {}


def in_csr_positions(graph):
    """For each edge in out-CSR order, its position in the in-CSR order: how a
    source-parallel block finds its rows of a value stored in in-CSR order."""
    cache = graph.__dict__.setdefault("_ngnn_in_csr_positions", {})
    if not cache:
        position = np.empty(graph.num_edges, dtype=np.int64)
        position[graph.in_eids] = np.arange(graph.num_edges)
        cache["out"] = position[graph.out_eids]
    return cache["out"]


def segment_softmax(values, seg, out):
    """Stable softmax over each segment of sorted edge rows, into `out`."""
    shape = (len(seg) - 1,) + values.shape[1:]
    local = segment_ids(seg, 0)
    peak = segment_reduce(values, seg, "max", np.empty(shape, values.dtype))
    np.subtract(values, np.take(peak, local, axis=0), out=out)
    np.exp(out, out=out)
    total = segment_reduce(out.astype(np.float64), seg, "sum", np.empty(shape, np.float64))
    out /= np.take(total, local, axis=0).astype(out.dtype)   # summed wide as edge_softmax's
    return out


