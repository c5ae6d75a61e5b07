"""Calibration: measures this machine's rates for the cost model and writes a profile.

What is timed is what the NumPy transformer calls, on the data it calls them on, the way
it calls them: the random rows of an R-MAT graph (the synthetic graphs of the
benchmarks), at the feature widths of a GNN layer, in blocks of a fused group's byte
budget. Graph primitives are measured as curves over the row width and over the size of
the table they read (the bigger the table, the fewer of its random rows are in cache):
indexed row reads (`np.take`), a block's sparse product (the fused groups'
`gather_sum`), segment reductions, rows in order, fancy row indexing, row-wise and
column-wise sums, log-softmax; and the fused groups' primitives again, statement by
statement, inside busy blocks (`busy_blocks`: the "_busy" curves). Scalars: the tall,
thin matrix products of a layer (flop/s), an element-wise add (bytes/s), exp
(elements/s), a Philox dropout (elements/s), the segment ids of a block (edges/s), and
the overhead per call of a NumPy statement.

Each figure is the best of a few rounds, every primitive timed once per round: other
processes on a shared machine only ever slow a run down, so the best is this machine's
own figure, and a busy moment costs one round of every primitive rather than every call
of one. `quick=True` uses small sizes and three widths (tests). MPI: `measure_mpi` starts
2 ranks (calibration/mpi_probe) for latency, bandwidth and all-reduce; skipped, with a
message, without mpi4py or mpiexec.
"""
import functools
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import scipy.special

from .. import philox
from .topology import Curve, Device, Link, Topology

WIDTHS = (1, 4, 8, 16, 64)
HEADS = 8                    # gather_sum_heads: attention heads, as GAT's first layer
FUNCTION_SIZES = {False: (1 << 18, 1 << 22), True: (1 << 14, 1 << 16)}
TABLE_ROWS = (100_000, 500_000)
BLOCK_EDGES = 500_000


def default_profile_path():
    """Where `ngnn calibrate` writes and `ngnn simulate` reads: under NGNN_CACHE_DIR, else
    ~/.cache/ngnn."""
    root = os.environ.get("NGNN_CACHE_DIR") or os.path.join(os.path.expanduser("~"),
                                                            ".cache", "ngnn")
    return os.path.join(root, "profile.json")


def _fastest(timings, rounds, before=None):
    """{key: fastest seconds} of `timings` ({key: function}), run in `rounds` rounds of
    one call each (after a warm-up round): a busy moment on a shared machine then slows
    one call of every primitive, not every call of one. `before` ({key: function}) is
    called, untimed, right before each timing of its key: to flush the cache
    (`flush_cache`), or to put what the key reads into it (the timing before may have
    moved it out)."""
    before = before or {}
    best = {key: float("inf") for key in timings}
    for round_ in range(rounds + 1):
        for key, run in timings.items():
            if key in before:
                before[key]()
            start = time.perf_counter()
            run()
            if round_:
                best[key] = min(best[key], time.perf_counter() - start)
    return {key: max(value, 1e-12) for key, value in best.items()}


def last_level_cache():
    """(bytes, cores sharing it) of this machine's last-level cache, from sysfs; (32 MiB,
    every core) where it does not say."""
    where = "/sys/devices/system/cpu/cpu0/cache/index3/"
    try:
        with open(where + "size") as f:
            text = f.read().strip()
        size = int(text[:-1]) << {"K": 10, "M": 20}[text[-1]] if text[-1] in "KM" \
            else int(text)
        with open(where + "shared_cpu_list") as f:
            cores = sum(int(b) - int(a) + 1 if b else 1 for a, _, b in
                        (part.partition("-") for part in f.read().strip().split(",")))
        return size, max(cores, 1)
    except (OSError, ValueError, IndexError, KeyError):
        return 32 << 20, os.cpu_count() or 1


@functools.lru_cache(maxsize=1)
def _flushing():
    """A buffer of twice the last-level cache."""
    return np.zeros(2 * last_level_cache()[0] // 4, np.float32)


def flush_cache():
    """Moves what a primitive is about to read out of the cache: a fused group reads its
    tables once a training step, after the step's other statements have streamed far
    more than the last-level cache since they were written. Timed warm, in a loop of its
    own, a block's sparse product ran up to twice as fast (R-MAT 500K, rows of 4 floats:
    3.8 against 7.9 ns an edge, the training step's 7.9)."""
    buffer = _flushing()
    np.add(buffer, 1, out=buffer)


def _best(run, repeats):
    return _fastest({0: run}, repeats)[0]


@functools.lru_cache(maxsize=8)
def rmat_block(num_nodes, edges, seed, csr="in"):
    """(indptr, cols) of about `edges` edges of an R-MAT graph's in-CSR (`csr="out"`: its
    out-CSR): the rows of vertices drawn at random, in order, so that the block has the
    graph's degrees (as the blocks of a fused group together have; the first vertices
    alone are R-MAT's hubs, few rows with many edges) and its columns spread over the
    whole table of `num_nodes` rows."""
    from ..datasets import synthetic
    data = synthetic("rmat", num_nodes, 10.0, 1, 2, seed=seed)
    g = data.graph
    indptr, columns = (g.in_indptr, g.in_src) if csr == "in" else (g.out_indptr, g.out_dst)
    degrees = np.diff(indptr)
    order = np.random.default_rng(seed).permutation(len(degrees))
    count = int(np.searchsorted(np.cumsum(degrees[order]), min(edges, g.num_edges))) + 1
    chosen = np.sort(order[:count])
    block_indptr = np.concatenate([[0], np.cumsum(degrees[chosen])]).astype(indptr.dtype)
    total = int(block_indptr[-1])
    positions = np.repeat(indptr[chosen] - block_indptr[:-1], degrees[chosen]) + \
        np.arange(total)
    block = block_indptr, np.ascontiguousarray(columns[positions])
    for array in block:                  # kept for the next caller (lru_cache)
        array.flags.writeable = False
    return block


def first_reads(rows, edges):
    """What the first reads of a table's rows cost, in units of the "_touch" curves, when
    `edges` reads touch `rows` distinct rows: a miss a row, each the dearer the fewer
    misses there are to overlap. A calibration sample touches more rows per edge than a
    whole graph (R-MAT 500K: 500K edges touch a fifth as many rows, the graph's 5M edges
    a twentieth), and its misses beyond the warm cost, per row, were 20, 29 and 42 ns
    at a touch every 2.7, 5 and 20 edges (rows of 4 floats; rows of 16 at R-MAT 100K:
    52, 77 and 110 ns at every 5, 11 and 20): about the square root of the edges per row.
    So the geometric mean of rows and edges. (Priced a miss a row, GCN's first product at
    R-MAT 100K, cold, came out up to 36% low; at the sample's rate of misses an edge, its
    source-parallel products at 500K up to 34% high.)"""
    return float(np.sqrt(float(rows) * float(edges)))


def excess(figures, name, dearer, cheaper, units):
    """Adds `name`'s figures to `figures` ({(curve, table rows, width): seconds per item}):
    what `dearer` costs beyond `cheaper` at each of `units`' keys ({(rows, width): units
    per item}), per unit. The curves calibration derives rather than times: the first
    reads of a table's rows (a cold read's cost beyond a warm one, per first_reads of the
    rows the sample touches: the "_touch" curves) and a keyed dropout's picking (its keep
    bits' cost beyond drawing their span, per element: `keep_select`)."""
    for (rows, width), per_item in units.items():
        figures[name, rows, width] = max(figures[dearer, rows, width] -
                                         figures[cheaper, rows, width], 1e-12) / per_item


def first_reads_per_edge(distinct, edges):
    """Units of a "_touch" curve per edge of a sample of `edges` reads touching `distinct`
    rows."""
    return first_reads(distinct, edges) / edges


def graph_sizes(quick):
    """(row widths, table rows, sample edges) the graph primitives are timed at: small
    ones for `quick`."""
    return ((1, 4, 16), (5_000, 20_000), 50_000) if quick else \
        (WIDTHS, TABLE_ROWS, BLOCK_EDGES)


def blocks_of(indptr, edges):
    """(v0, v1, p0, p1): vertex ranges of about `edges` edges each of a CSR's rows, and
    their edges' positions."""
    starts = np.unique(np.searchsorted(indptr, np.arange(0, indptr[-1], edges),
                                       side="right") - 1)
    return [(v0, v1, int(indptr[v0]), int(indptr[v1]))
            for v0, v1 in zip(starts, list(starts[1:]) + [len(indptr) - 1])]


def alone_blocks(indptr, width, quick):
    """The blocks of a fused group whose block holds one edge array of `width` floats (a
    product's group): as many edges as the byte budget holds."""
    return blocks_of(indptr, max(block_budget(quick) // (4 * width), 1))


def block_budget(quick):
    """Bytes of edge arrays a calibration block holds: a fused group's (smaller, quick)."""
    from ..passes.block_planning import DEFAULT_BLOCK_BYTES
    return DEFAULT_BLOCK_BYTES // (16 if quick else 1)


def _view(buffer, shape):
    return buffer[:int(np.prod(shape))].reshape(shape)


def take_rows(x, ids, workspace):
    """x's rows `ids`, as a fused group takes them: into its workspace, unchecked (with
    mode="raise", np.take with `out=` buffers its copy: twice the time)."""
    return np.take(x, ids, axis=0, mode="clip", out=_view(workspace, (len(ids),) + x.shape[1:]))


def graph_timings(quick, rng):
    """({(primitive, table rows, width): (function, items)}, {key: the array it reads by
    row}, {key: distinct rows it reads}): the graph primitives at each measured width
    and table size, on scratch buffers shared between widths; the arrays for the
    primitives of a fused group's statements, the distinct rows for those reading rows
    at random (by the other ends' ids)."""
    from ..transformers.numpy import kernels as K
    widths, tables, block = graph_sizes(quick)
    top = widths[-1]
    timings, reads, touched = {}, {}, {}
    result, scratch = (np.empty(max(tables) * top, np.float32) for _ in range(2))
    taken = np.empty(block * top, np.float32)     # a block's rows, as a group's workspace
    for rows, csr in [(rows, csr) for rows in tables for csr in ("in", "out")]:
        # Source-parallel groups read the out-CSR's columns ("out_" curves).
        indptr, cols = rmat_block(rows, block, seed=1, csr=csr)
        prefix = "" if csr == "in" else "out_"
        n_v, n_e, distinct = len(indptr) - 1, len(cols), len(np.unique(cols))
        # A third of a table's rows, sorted, as an exchange picks a peer's rows (x[rows],
        # a new array) and writes the rows received into place (out[rows] = received).
        exchanged = np.sort(rng.choice(rows, rows // 3, replace=False))
        for w in widths:
            x = rng.random((rows, w), dtype=np.float32)
            received = np.zeros((len(exchanged), w), np.float32)
            if csr == "in":
                timings["pick", rows, w] = (lambda x=x, i=exchanged: x[i], len(exchanged))
                timings["place", rows, w] = (
                    lambda x=x, i=exchanged, r=received: x.__setitem__(i, r), len(exchanged))
            out = _view(result, (n_v, w))
            blocks = alone_blocks(indptr, w, quick)
            timings[prefix + "take", rows, w] = (
                lambda x=x, c=cols, b=blocks: [take_rows(x, c[p0:p1], taken)
                                               for _, _, p0, p1 in b], n_e)
            timings[prefix + "spmm", rows, w] = (
                lambda x=x, o=out, p=indptr, c=cols, b=blocks: [
                    K.gather_sum(x, None, c[p0:p1], p[v0:v1 + 1] - p0, "sum", o[v0:v1])
                    for v0, v1, p0, p1 in b], n_e)
            for name in ("take", "spmm"):
                reads[prefix + name, rows, w] = x
                touched[prefix + name, rows, w] = distinct
    rows = tables[0]
    indptr, _ = rmat_block(rows, block, seed=2)
    n_v, n_e = len(indptr) - 1, int(indptr[-1])
    order = rng.permutation(n_e)
    ends = K.segment_ids(indptr, 0)
    values = rng.standard_normal(n_e * top, dtype=np.float32)
    for w in widths:
        edge_rows = _view(values, (n_e, w))
        out = _view(result, (n_v, w))
        x = _view(values, (rows, w))
        reduced, column = np.empty(rows, np.float32), np.empty(w, np.float32)
        soft = _view(scratch, (rows, w))
        blocks = alone_blocks(indptr, w, quick)
        # Segment reductions: a maximum ("segment", max and min) and a sum.
        for name, reduce in (("segment", "max"), ("segment_sum", "sum")):
            timings[name, rows, w] = (
                lambda v=edge_rows, o=out, r=reduce, b=blocks: [
                    K.segment_reduce(v[p0:p1], indptr[v0:v1 + 1] - p0, r, o[v0:v1])
                    for v0, v1, p0, p1 in b], n_e)
            reads[name, rows, w] = edge_rows
        timings["fancy", rows, w] = (lambda v=edge_rows: v[order], n_e)
        timings["take_sorted", rows, w] = (
            lambda x=x, b=blocks: [take_rows(x, ends[p0:p1], taken) for _, _, p0, p1 in b],
            n_e)
        reads["take_sorted", rows, w] = x
        timings["row_sum", rows, w] = (
            lambda x=x, r=reduced: np.einsum("ab->a", x, out=r), rows)
        timings["column_sum", rows, w] = (
            lambda x=x, c=column: np.sum(x, axis=(0,), out=c), rows)
        timings["log_softmax", rows, w] = (
            lambda x=x, o=soft: K.log_softmax(x, 1, o), rows)
    return timings, reads, touched


# The statements of a busy calibration block (`busy_blocks`), each the curve of its
# primitive (+ "_busy") or None (timed, not kept).
BUSY_STATEMENTS = (None, "take", "take_sorted", None, "segment", "segment_sum", "spmm",
                   "gather_sum_heads", "edge_take", "keep_take")
EDGES_PER_ROW = 10           # edge_take: a table of stored edge values, 10 rows a vertex
BUSY_ARRAYS = 3              # edge arrays a busy block makes: its rows read, and their sum
BUSY_ROUNDS = 2              # each round times every statement over many blocks
SHORT_BLOCKS = 8             # gather_sum_heads_short: blocks this many times shorter
LIGHT_FIRST_READS = ("take", "spmm")    # rows read at random: "_light_steady", "_light_touch"


def busy_block_edges(width, quick=False):
    """Edges in a busy calibration block of rows of `width` floats: BUSY_ARRAYS edge arrays
    of them fill the group's byte budget."""
    return max(block_budget(quick) // (BUSY_ARRAYS * 4 * width), 1)


def busy_blocks(quick, rng):
    """{(primitive + "_busy", "_light"..., table rows, width): seconds per item} of the
    fused groups' primitives timed statement by statement in a busy block loop, written
    as the NumPy transformer writes a group with edge values
    (ngnn.transformers.numpy.fused): each block of vertices of an R-MAT CSR takes its
    edges' rows by the other end (at random) and by its own (in order) into its
    workspace, adds them, reduces them by segment and runs the sparse products, in
    blocks of the group's byte budget. Each primitive then finds the cache and the TLB
    as a group's other statements leave them: a random row read of a block ran 3 to 4
    times slower there than in a loop of its own, its table moved out of the core's
    cache between blocks. The per-head product is "gather_sum_heads" (attention groups
    are busy ones); "edge_take" reads rows of a stored edge value by edge ids (at
    random, from a table of EDGES_PER_ROW rows a vertex: keyed by its rows), "keep_take"
    an edge dropout's mask the same way (a byte a row per head, the width: 1 ns an edge
    at R-MAT 100K, a quarter of a float's row); "out_" the out-CSR's. The per-head
    product slows down in short blocks (each head's table is read afresh in each block:
    R-MAT 100K, 8 heads of 8 floats, 119 ms in blocks of 9,709 edges against 103 ms in
    blocks of 87,381), and an attention group's blocks are short (it makes many edge
    arrays a head), so it is timed again in blocks SHORT_BLOCKS times shorter, each
    after writing a block's byte budget as the group's other statements do:
    "gather_sum_heads_short". The same blocks without the reads by edge ids are the
    "_light" curves: a group reading nothing by edge ids keeps its node tables in the
    cache from block to block, so a light block runs twice, and its random reads are
    priced as the second pass ("_light_steady") plus the first reads of their rows
    ("_light_touch", as the quiet "_touch"). (GAT's attention scores at R-MAT 500K: a
    take of one float a row, 2.3 to 2.7 ns an edge in the training step, 2.8 to 3.7 in
    the busy sample's first pass, whose 500,000 edges pay for a fifth as many first
    reads where the graph's 5 million pay for a twentieth.)"""
    from ..transformers.numpy import kernels as K
    widths, tables, edges = graph_sizes(quick)
    streamed = np.zeros(block_budget(quick) // 4, np.float32)
    samples = {(rows, csr): rmat_block(rows, edges, seed=1, csr=csr)
               for rows in tables for csr in ("in", "out")}
    # Every configuration stays bound for the rounds below, so they share scratch of the
    # largest size, each reading its tables as views of it (random values either way).
    top, most, heads_width = widths[-1], max(tables), 8
    scratch = {name: rng.random(size, dtype=np.float32) for name, size in (
        ("table", most * top), ("heads", most * HEADS * heads_width),
        ("edge values", EDGES_PER_ROW * most * HEADS))}
    keeps = scratch["edge values"] < 0.5
    out, out_heads = (np.empty(most * size, np.float32) for size in (top, HEADS * heads_width))
    longest = max(busy_block_edges(w, quick) * w for w in widths) + \
        max(int(np.diff(indptr).max()) for indptr, _ in samples.values()) * top
    workspace = [np.empty(longest, np.float32) for _ in range(BUSY_ARRAYS)]
    timings = []         # (key prefix, table rows, width, names kept, runs, short heads' run)
    touched = {}         # {light key: (distinct rows its sample reads, edges)}
    for (rows, csr), (indptr, cols) in samples.items():
        n_v, edge_rows, distinct = len(indptr) - 1, EDGES_PER_ROW * rows, len(np.unique(cols))
        weight = rng.random((len(cols), HEADS, 1), dtype=np.float32)
        eids = rng.integers(0, edge_rows, len(cols))
        for w in widths:
            heads = _view(scratch["heads"], (HEADS, rows, w)) if 4 <= w <= heads_width \
                else None
            stored = keep = None
            if csr == "in" and w <= HEADS:
                stored = _view(scratch["edge values"], (edge_rows, w))
                keep = _view(keeps, (edge_rows, w))
            blocks = blocks_of(indptr, busy_block_edges(w, quick))
            short = blocks_of(indptr, max(busy_block_edges(w, quick) // SHORT_BLOCKS, 1))
            outputs = (_view(out, (n_v, w)), _view(out_heads, (n_v, HEADS, w)))
            timed = [name for name in BUSY_STATEMENTS if name and
                     (heads is not None or name != "gather_sum_heads") and
                     (stored is not None or name not in ("edge_take", "keep_take")) and
                     (csr == "in" or not name.startswith("segment"))]
            run = functools.partial(_run_busy, K, _view(scratch["table"], (rows, w)), heads,
                                    weight, eids=eids, indptr=indptr, cols=cols,
                                    blocks=blocks, out=outputs[0], out_heads=outputs[1],
                                    workspace=workspace, segments=csr == "in")
            light = functools.partial(run, None, None)
            runs = [(("_busy", "_light"), light)] if stored is None else \
                [(("_busy",), functools.partial(run, stored, keep)), (("_light",), light)]
            run_short = None if heads is None else functools.partial(
                _run_short_heads, K, heads, weight, indptr, cols, short, outputs[1], streamed)
            prefix = "" if csr == "in" else "out_"
            timings.append((prefix, rows, w, timed, runs, run_short, len(cols)))
            for name in LIGHT_FIRST_READS:
                touched[prefix + name + "_light", rows, w] = (distinct, len(cols))
    # Each round times every configuration once, as _fastest does: a busy moment on a
    # shared machine then slows one round of each, not every round of one.
    best = {}
    for _ in range(BUSY_ROUNDS):
        for prefix, rows, w, timed, runs, run_short, n_e in timings:
            if run_short is not None:
                flush_cache()
                key = (prefix + "gather_sum_heads_short", rows, w)
                best[key] = min(best.get(key, np.inf), max(run_short(), 1e-12) / (n_e * HEADS))
            for suffixes, run in runs:
                flush_cache()
                for name, seconds in zip(BUSY_STATEMENTS, run()):
                    by_ids = name in ("edge_take", "keep_take")
                    if name not in timed or by_ids and "_busy" not in suffixes:
                        continue
                    per_head = name == "gather_sum_heads"
                    table = EDGES_PER_ROW * rows if by_ids else rows
                    for suffix in suffixes:
                        key = (prefix + name + ("" if per_head and suffix == "_busy" else
                                                suffix), table, w)
                        best[key] = min(best.get(key, np.inf), max(seconds, 1e-12) /
                                        (n_e * (HEADS if per_head else 1)))
            # The light block once more, its tables as its first pass left them.
            for name, seconds in zip(BUSY_STATEMENTS, runs[-1][1]()):
                if name in LIGHT_FIRST_READS:
                    key = (prefix + name + "_light_steady", rows, w)
                    best[key] = min(best.get(key, np.inf), max(seconds, 1e-12) / n_e)
    # A light block's first reads of its rows, as a quiet one's ("_touch", first_reads).
    for (name, rows, w), (distinct, n_e) in touched.items():
        excess(best, name + "_touch", name, name + "_steady",
               {(rows, w): first_reads_per_edge(distinct, n_e)})
    return best


def _run_busy(K, x, heads, weight, stored, keep, *, eids, indptr, cols, blocks, out,
              out_heads, workspace, segments):
    """Seconds of each of BUSY_STATEMENTS over `blocks` of a CSR (`segments`: with the
    segment reductions, else those are skipped)."""
    clock = time.perf_counter
    took = np.zeros(len(BUSY_STATEMENTS))
    for v0, v1, p0, p1 in blocks:
        seg, c = indptr[v0:v1 + 1] - p0, cols[p0:p1]
        times = [clock()]
        ends = K.segment_ids(seg, v0)
        times.append(clock())
        a = take_rows(x, c, workspace[0])
        times.append(clock())
        b = take_rows(x, ends, workspace[1])
        times.append(clock())
        s = np.add(a, b, out=_view(workspace[2], a.shape))
        times.append(clock())
        if segments:
            K.segment_reduce(s, seg, "max", out[v0:v1])
        times.append(clock())
        if segments:
            K.segment_reduce(s, seg, "sum", out[v0:v1])
        times.append(clock())
        K.gather_sum(x, None, c, seg, "sum", out[v0:v1])
        times.append(clock())
        if heads is not None:
            K.gather_sum(heads, weight[p0:p1], c, seg, "sum", out_heads[v0:v1])
        times.append(clock())
        if stored is not None:
            np.take(stored, eids[p0:p1], axis=0)
        times.append(clock())
        if keep is not None:
            np.take(keep, eids[p0:p1], axis=0)
        times.append(clock())
        took += np.diff(times)
    return took


def _run_short_heads(K, heads, weight, indptr, cols, blocks, out_heads, streamed):
    """Seconds of the per-head products of `blocks`, each block first writing `streamed`
    (a block's byte budget), as an attention group's other statements write theirs between
    one block's products and the next's."""
    clock, took = time.perf_counter, 0.0
    for v0, v1, p0, p1 in blocks:
        np.add(streamed, 1, out=streamed)
        start = clock()
        K.gather_sum(heads, weight[p0:p1], cols[p0:p1], indptr[v0:v1 + 1] - p0, "sum",
                     out_heads[v0:v1])
        took += clock() - start
    return took


def product_timings(quick, rng):
    """{("matmul" or "matmul_t", inner, outer): (function, long rows)}: a layer's product
    (rows, inner) @ (inner, outer) and its weight gradient (inner, rows) @ (rows, outer),
    each per row of the long axis (BLAS's speed depends on the narrow sizes)."""
    rows = 20_000 if quick else 100_000
    sizes = (4, 16) if quick else (4, 16, 64)
    timings = {}
    for inner in sizes:
        a = rng.standard_normal((rows, inner), dtype=np.float32)
        for outer in sizes:
            w = rng.standard_normal((inner, outer), dtype=np.float32)
            d = rng.standard_normal((rows, outer), dtype=np.float32)
            out, grad = np.empty((rows, outer), np.float32), np.empty_like(w)
            timings["matmul", inner, outer] = (
                lambda a=a, w=w, o=out: np.matmul(a, w, out=o), rows)
            timings["matmul_t", inner, outer] = (
                lambda a=a, d=d, g=grad: np.matmul(a.T, d, out=g), rows)
    return timings, sizes


def keep_timings(quick, rng):
    """Dropout keep bits: {("keep_bits", elements, 1): (a whole tensor's, elements)} on a
    cached and an uncached tensor; and, for a rank's dropout keyed by its global ids (half
    of a span, as 2 ranks hold), {("keep_rows", span, width): (kernels.dropout_keep_rows,
    ids)} and {("keep_span", span, width): (the span's bits, ids)}: what picking the ids'
    rows costs beyond drawing their span is the difference (`keep_select`, `excess`)."""
    from ..transformers.numpy import kernels as K
    timings = {}
    for elements in FUNCTION_SIZES[quick]:
        bits = np.empty(elements, np.bool_)
        timings["keep_bits", elements, 1] = (
            lambda b=bits: philox.keep_bits(1, 0, 0.5, b), elements)
    span = 20_000 if quick else TABLE_ROWS[0]
    ids = np.sort(rng.choice(span, span // 2, replace=False))
    calls = itertools.count()
    for width in (1, 4, 16) if quick else (1, 4, 16, 64):
        bits = np.empty(span * width, np.bool_)
        # A new call number each time: the kernels keep a step's mask for its next use.
        timings["keep_rows", span, width] = (
            lambda w=width: K.dropout_keep_rows(1, next(calls), 0.5, (len(ids), w), ids),
            len(ids))
        timings["keep_span", span, width] = (
            lambda b=bits: philox.keep_bits(1, 0, 0.5, b), len(ids))
    return timings


TRAILING_WIDTHS = (4, 8, 16)   # np.multiply@trailing, np.add@bias: a broadcast's rows


def declared_functions():
    """The NumPy functions the ops declare their statements call (`Op.numpy_calls`), each
    once: what element-wise ops are priced by, so what calibration times."""
    from ..op_graph import Op
    found, classes = set(), [Op]
    while classes:
        cls = classes.pop()
        classes.extend(cls.__subclasses__())
        calls = cls.__dict__.get("numpy_calls")
        if isinstance(calls, tuple):       # (a property names some of these, by attribute)
            found.update(calls)
    return sorted(found)


def function_timings(quick, rng):
    """{(NumPy function, elements, 1): (function, elements)}: the functions the ops
    declare, per element, on a cached and an uncached array; and per row length,
    a multiply by a value a row, {("np.multiply@trailing", elements, row): ...}, and a
    row added to every row ("np.add@bias"): NumPy's inner loop runs over one row (R-MAT
    100K in a fused block, 0.83 ns an element for rows of 4 and 0.33 for rows of 16)."""
    timings = {}
    for elements in FUNCTION_SIZES[quick]:
        for name, run in _functions(rng, elements).items():
            timings[name, elements, 1] = (run, elements)
        y = rng.standard_normal(elements, dtype=np.float32)
        out = np.empty_like(y)
        for row in TRAILING_WIDTHS:
            rows, outs = y.reshape(-1, row), out.reshape(-1, row)
            column, bias = y[:elements // row].reshape(-1, 1), y[:row].copy()
            timings["np.multiply@trailing", elements, row] = (
                lambda c=column, x=rows, o=outs: np.multiply(c, x, out=o), elements)
            timings["np.add@bias", elements, row] = (
                lambda b=bias, x=rows, o=outs: np.add(x, b, out=o), elements)
    return timings


# The operands a function is timed on where not the first of (x, y) it takes: x standard
# normal, y positive (past 1); the domain of a logarithm and a root, a power of a constant.
OPERANDS = {"np.log": ("y",), "np.sqrt": ("y",), "np.power": ("y", 0.5)}


def _functions(rng, elements):
    x = rng.standard_normal(elements, dtype=np.float32)
    y = np.abs(rng.standard_normal(elements, dtype=np.float32)) + 1
    out = np.empty_like(x)
    # A mask times floats: far slower per element than plain arrays.
    mask = x > 0
    timed = {"np.multiply@cast": lambda: np.multiply(mask, y, out=out)}
    for name in declared_functions():
        if name == "np.copyto":          # copyto(dst, src), not a ufunc
            timed[name] = lambda: np.copyto(out, x)
            continue
        module, _, attribute = name.rpartition(".")
        function = getattr({"np": np, "scipy.special": scipy.special}.get(module), attribute,
                           None)
        if function is None:
            raise ValueError(f"numpy_calls: {name!r} is not a NumPy or scipy.special "
                             "function (an op declares the functions its statement calls)")
        operands = [{"x": x, "y": y}.get(a, a) for a in
                    OPERANDS.get(name, ("x", "y")[:function.nin])]
        timed[name] = functools.partial(function, *operands, out=out)
    return timed


def measure(quick=False, seed=0):
    """({scalar rate: value}, {primitive: Curve}) for this machine."""
    from ..transformers.numpy import kernels as K
    rng = np.random.default_rng(seed)
    rows, width = (20000, 32) if quick else (200000, 64)
    rounds = 3 if quick else 5
    a = rng.standard_normal((rows, width), dtype=np.float32)
    w = rng.standard_normal((width, 16), dtype=np.float32)
    narrow = np.empty((rows, 16), np.float32)
    grad = np.empty_like(w)
    out = np.empty_like(a)
    # A group's segment ids, block by block, over an R-MAT graph's degrees (zeros and hubs).
    _, tables, edges = graph_sizes(quick)
    indptr, _ = rmat_block(tables[0], edges, seed=1)
    blocks = alone_blocks(indptr, 4, quick)
    scalars = {
        # A layer's product and its weight gradient: 2 * 2 * rows * width * 16 flops.
        "flops": (lambda: (np.dot(a, w, out=narrow), np.dot(a.T, narrow, out=grad)),
                  4 * rows * width * 16),
        "memory_bandwidth": (lambda: np.add(a, a, out=out), 3 * a.nbytes),
        "transcendental_rate": (lambda: np.exp(a, out=out), a.size),
        "dropout_rate": (lambda: philox.dropout(a, seed, 0, 0.5, out), a.size),
        "repeat_rate": (lambda: [K.segment_ids(indptr[v0:v1 + 1] - p0, v0)
                                 for v0, v1, p0, _ in blocks], int(indptr[-1])),
    }
    # Per-head copies of a node table larger than the last-level cache, as GAT's are
    # (R-MAT 100K, 8 heads of 8 floats: 26 MB): a copy of 13 MB ran twice as fast a byte.
    heads = rng.standard_normal((rows // 4 if quick else rows, 8, 8), dtype=np.float32)
    by_head = np.empty((8, len(heads), 8), np.float32)
    scalars["transpose_rate"] = (lambda: K.by_head(heads, 8, by_head), 2 * heads.nbytes)
    graph, reads, touched = graph_timings(quick, rng)
    # A fused group's primitives timed twice: on tables the cache no longer holds, and
    # warm ("_warm"), as a table written by the statement before is read (numpy_plan
    # decides which by the bytes the step moved since): right after writing the table.
    # (Warmed only by the timing before, whose own table took its place, a block's
    # product at R-MAT 100K, rows of 16 floats, ran at 5.7 ns an edge, 4.1 on a table
    # just written.) An exchange's copies and the dense reductions read what the
    # statement before them wrote: warm.
    cold = {key: flush_cache for key in reads}
    warm_tables = {}
    for (name, *at), table in reads.items():
        graph[(name + "_warm", *at)] = graph[(name, *at)]
        warm_tables[(name + "_warm", *at)] = functools.partial(np.multiply, table, 1,
                                                                 out=table)
    products, sizes = product_timings(quick, rng)
    functions = function_timings(quick, rng)
    keeps = keep_timings(quick, rng)
    measured = {**graph, **products, **functions, **keeps}
    products_names = {key[0] for key in products}
    timings = {key: run for key, (run, _) in {**scalars, **measured}.items()}
    # The functions at the smaller size stand for a fused block's statements, which read
    # what the block wrote just before: timed warm. (Timed after the larger size's, a
    # mask's multiply ran at 0.51 ns an element, 0.19 warm.) So do a block's segment ids,
    # from the bounds it just sliced (timed cold, 1.22 ns an edge; warm, 1.06; in GAT's
    # groups at R-MAT 500K, 0.8).
    warm_functions = {key: timings[key] for key in functions
                      if key[1] == FUNCTION_SIZES[quick][0]}
    warm_functions["repeat_rate"] = timings["repeat_rate"]
    best = _fastest(timings, rounds, before={**cold, **warm_tables, **warm_functions})
    rates = {key: items / best[key] for key, (_, items) in scalars.items()}
    rates["call_overhead"] = call_overhead(rounds)
    per_item = {key: best[key] / items for key, (_, items) in measured.items()}
    # A cold table's reads cost their warm cost plus the first reads of its rows
    # ("_touch": seconds per first_reads of the sample).
    for (name, rows, w), distinct in touched.items():
        excess(per_item, name + "_touch", name, name + "_warm",
               {(rows, w): first_reads_per_edge(distinct, graph[name, rows, w][1])})
    # A keyed dropout's picking, per element, beyond drawing its ids' span.
    excess(per_item, "keep_select", "keep_rows", "keep_span",
           {key[1:]: key[2] for key in keeps if key[0] == "keep_rows"})
    per_item.update(busy_blocks(quick, rng))
    drawn_whole = ("keep_rows", "keep_span")
    return rates, fit_curves({key: seconds for key, seconds in per_item.items()
                              if key[0] not in drawn_whole}, capped=products_names)


def fit_curves(figures, capped=()):
    """{curve: Curve} of `figures` ({(curve, table rows, width): seconds per item}), each
    curve over the table sizes and widths it was measured at; the `capped` curves made
    `monotone`."""
    curves = {}
    for name in sorted({key[0] for key in figures}):
        along = sorted({key[1] for key in figures if key[0] == name})
        across = sorted({key[2] for key in figures if key[0] == name})
        seconds = [[figures[name, r, w] for w in across] for r in along]
        curves[name] = Curve(along, across, monotone(seconds) if name in capped else seconds)
    return curves


def monotone(seconds):
    """A product of narrower sizes costs at most what a wider one does (BLAS does less of
    the same work): each figure capped by those at larger sizes, so that one call the
    threads of BLAS lost to another process cannot stand for a whole size."""
    capped = [list(row) for row in seconds]
    for i in reversed(range(len(capped))):
        for j in reversed(range(len(capped[i]))):
            if i + 1 < len(capped):
                capped[i][j] = min(capped[i][j], capped[i + 1][j])
            if j + 1 < len(capped[i]):
                capped[i][j] = min(capped[i][j], capped[i][j + 1])
    return capped


def call_overhead(repeats, length=200):
    """Seconds per step of a NumPy transformer program on tiny tensors: a chain of
    element-wise ops compiled by the transformer, timed per call and divided by its steps
    (so the call's own fixed cost is spread over them)."""
    import ngnn as ng
    from ngnn import transformers as ngt
    from ..passes.buffer_sharing import is_group
    transformer = ngt.make_transformer("numpy")
    try:
        x = ng.placeholder((4,), np.float32)
        y = x
        for i in range(length):
            y = ng.exp(-y) if i % 2 else y * 0.5
        comp = transformer.computation(y, x)
        comp.transform()
        steps = sum(1 for step in comp.steps if is_group(step) or not step.is_leaf)
        feed = np.ones(4, np.float32)
        return _best(lambda: comp(feed), repeats) / steps
    finally:
        transformer.close()


def measure_mpi(timeout=30.0, quick=False):
    """Latency (s), bandwidth (bytes/s) and all-reduce figures of 2 MPI ranks on this
    machine, from `mpiexec -n 2` running mpi_probe; (None, reason) when MPI is missing or
    the probe fails or runs past `timeout` seconds."""
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return None, "mpi4py is not installed (pip install 'ngnn[mpi]'): MPI not measured"
    from ngnn.distributed.launch import find_mpiexec
    mpiexec = find_mpiexec()
    if mpiexec is None:
        return None, "no mpiexec beside Python or on PATH: MPI not measured"
    command = [mpiexec, "-n", "2", sys.executable, "-m", "ngnn.simulate.mpi_probe"]
    if quick:
        command.append("--quick")
    try:
        # Not from the source tree: there `-m ngnn...` would import the tree's ngnn package.
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                              cwd=tempfile.gettempdir())
    except subprocess.TimeoutExpired:
        return None, f"the MPI probe ran past {timeout:.0f} s: MPI not measured"
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        return None, f"the MPI probe failed ({tail[0]}): MPI not measured"
    return json.loads(lines[-1]), None


def calibrate(path=None, quick=False, mpi=True):
    """Measures this machine and writes its profile to `path` (default
    `default_profile_path()`) atomically; returns (topology, path, notes), notes a list
    of what was not measured and why."""
    rates, curves = measure(quick)
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    measured, why = measure_mpi(quick=quick) if mpi else (None, "MPI not measured (--no-mpi)")
    notes = [why] if why else []
    if measured is not None:
        link = Link(latency=measured["latency"], bandwidth=measured["bandwidth"],
                    allreduce_latency=measured["allreduce_latency"],
                    allreduce_bandwidth=measured["allreduce_bandwidth"],
                    contention=measured["contention"], poll_slack=poll_slack())
    else:
        # Shared-memory MPI on one machine, unmeasured: a memory copy's bandwidth.
        link = Link(latency=20e-6, bandwidth=rates["memory_bandwidth"] / 2,
                    poll_slack=poll_slack())
    cache, sharing = last_level_cache()
    device = Device("cpu", memory_bytes=memory, name="this machine", curves=curves,
                    cores=os.cpu_count(), cache_bytes=cache // sharing, **rates)
    threads = blas_threads()
    topology = Topology([device], [link], name=f"calibrated here, {threads} BLAS thread"
                        f"{'s' if threads > 1 else ''} per process" +
                        (" (quick)" if quick else ""))
    path = path or default_profile_path()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    topology.save(path)
    return topology, path, notes


def poll_slack(sleeps=30):
    """Seconds a sleep between polls of a waiting rank (ngnn.distributed.exchange.wait)
    overruns its pause here: the OS timer's slack and the wake-up. The median: it is what
    a waiting rank gets, not a best case."""
    from ..distributed.exchange import FIRST_PAUSE
    overruns = []
    for _ in range(sleeps):
        start = time.perf_counter()
        time.sleep(FIRST_PAUSE)
        overruns.append(time.perf_counter() - start - FIRST_PAUSE)
    return max(float(np.median(overruns)), 0.0)


def blas_threads():
    """The BLAS threads a process starts here: OpenBLAS's setting (OPENBLAS_NUM_THREADS,
    else OMP_NUM_THREADS), else a thread per core. The profile's name records it: BLAS
    products, and 2 ranks on 2 cores, run at the thread count they were calibrated at."""
    for variable in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
        value = os.environ.get(variable, "")
        if value.isdigit() and int(value) > 0:
            return int(value)
    return os.cpu_count() or 1


# Figures that are costs (the lower the better) and the one that is taken from the last
# calibration (the sleeps' slack: what a waiting rank gets, not a best case); every other
# figure of a device or a link is a rate or a size (the higher the better).
COSTS = ("call_overhead", "latency", "allreduce_latency", "contention", "curves")
LATEST = ("poll_slack",)
# Fields that describe the machine rather than measure it: the first calibration's.
DESCRIPTIONS = ("name", "kind", "memory_bytes", "cores", "cache_bytes", "ends")


def median_of(*topologies):
    """One profile from many calibrations of the same machine: each figure (each point of
    each curve) the median of theirs. Each calibration keeps the best of its rounds
    already; over many, the best of all is the luckiest moment's, which the runs it
    predicts rarely see."""
    return merged(topologies, lambda field, figures: np.median(figures, axis=0))


def best_of(*topologies):
    """One profile from several calibrations of the same machine: each figure the best
    any of them measured (the fastest rate, the smallest cost per item or latency, the
    smallest contention of the ranks: the least disturbed by other jobs), as each
    calibration keeps the best of its rounds; the sleeps' slack the last's."""
    def best(field, figures):
        if field in LATEST:
            return figures[-1]
        return figures.min(axis=0) if field in COSTS else figures.max(axis=0)
    return merged(topologies, best)


def merged(topologies, pick):
    """One profile of the fields of the first of `topologies` (its device and links),
    each measured figure `pick(field, figures)` of the calibrations that measured it
    (curves: those measured at the same table sizes and widths; `figures` an array, a
    calibration a row)."""
    first = topologies[0]
    devices = [t.device().to_dict() for t in topologies]
    device = _merged_fields(devices, pick)
    device["curves"] = {}
    for name, curve in devices[0].get("curves", {}).items():
        same = [d["curves"][name]["seconds"] for d in devices
                if d.get("curves", {}).get(name, {}).get("rows") == curve["rows"]
                and d["curves"][name]["widths"] == curve["widths"]]
        device["curves"][name] = dict(curve, seconds=pick("curves", np.array(same)).tolist())
    links = [_merged_fields([t.links[i].to_dict() for t in topologies if len(t.links) > i],
                            pick) for i in range(len(first.links))]
    return Topology.from_dict({"name": first.name, "validated": first.validated,
                               "devices": [device], "links": links})


def _merged_fields(records, pick):
    """The first of `records` (dicts of a device's or a link's fields) with each measured
    scalar `pick`ed over those records that have it."""
    merged_ = dict(records[0])
    for field in records[0]:
        if field not in DESCRIPTIONS + ("curves",):
            merged_[field] = float(pick(field, np.array([r[field] for r in records
                                                         if field in r])))
    return merged_
