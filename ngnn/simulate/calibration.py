"""Calibration: measures this machine's rates for the cost model and writes a profile.

What is timed is a table (`SAMPLES`, a `Sample` a row): each row names a kernel the NumPy
transformer calls, the points it is timed at (row widths and table sizes, product sizes,
element counts), the state of the cache it starts from, and what its figures make: a
curve of seconds per item over the points (`Curve`), a capped curve, or a scalar rate.
Each NumPy function an op declares (`Op.numpy_calls`) is a row too. One routine builds and
times the rows (`time_samples`, `_fastest`), one fits them (`fit_curves`), one derives the
curves that are differences of two others (`Derived`, `excess`), and one merges
calibrations (`merged`). Adding a kind of sample is adding a row.

The kernels run on the data the transformer calls them on, the way it calls them: the
random rows of an R-MAT graph (the synthetic graphs of the benchmarks), at the feature
widths of a GNN layer, in blocks of a fused group's byte budget (`GraphPoint`); the
fused groups' primitives again, statement by statement, inside busy blocks
(`busy_block`: the "_busy" and "_light" curves).

Each figure is the best of a few rounds, every kernel timed once per round: other
processes on a shared machine only ever slow a run down, so the best is this machine's
own figure, and a busy moment costs one round of every kernel rather than every call
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
from typing import Callable, NamedTuple, Optional

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


def _fastest(timings, rounds, before=None, warm_up=True):
    """{key: fastest seconds} of `timings` ({key: function}), run in `rounds` rounds of
    one call each (after a warm-up round, with `warm_up`): a busy moment on a shared machine then slows
    one call of every primitive, not every call of one. `before` ({key: function}) is
    called, untimed, right before each timing of its key: to flush the cache
    (`flush_cache`), or to put what the key reads into it (the timing before may have
    moved it out). A function that times itself (a block loop's statements) returns
    its `Figures`: each its fastest, under its own key."""
    before = before or {}
    best = {}
    for round_ in range(rounds + warm_up):
        for key, run in timings.items():
            if key in before:
                before[key]()
            start = time.perf_counter()
            figures = run()
            took = time.perf_counter() - start
            if round_ >= warm_up:
                for name, seconds in (figures.items() if isinstance(figures, Figures)
                                      else [(key, took)]):
                    best[name] = min(best.get(name, float("inf")), seconds)
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


# ---- the sample table ----------------------------------------------------------------------
class Timing(NamedTuple):
    """A kernel's call at one point of its sample: `run` (no arguments) over `items`
    items (edges, rows, elements, bytes); `table`, the array it reads rows of (warmed
    before its "_warm" timings); `distinct`, the rows of it its reads touch (first_reads).
    A block loop times its statements itself: its `run` returns their `Figures`."""
    run: Callable
    items: float = 1
    table: Optional[np.ndarray] = None
    distinct: Optional[int] = None


class Figures(dict):
    """{figure key: seconds per item} a self-timing run (a block loop) measured."""


class Sample(NamedTuple):
    """A row of the calibration table (`SAMPLES`): what is timed, where, and how it is
    fitted.

      name    the curve it measures (`fit` "curve" or "capped"), the device's scalar rate
              ("rate": items per second), or the kernel timed only to derive another
              figure (None: `DERIVED`); a block loop's curves are named by its statements
      points  quick -> the points it is timed at, each (along, across): a graph kernel's
              (table rows, row width), a product's (inner, outer) sizes, a function's
              (elements, row length); [()] for a rate
      build   (bench, *point) -> Timing: the kernel's call on the data it reads there
      state   the cache each timing starts from: "cold" (flushed: a table a step wrote
              long before); "cold+warm" (cold, and timed again as name + "_warm" right
              after its table is written; with `distinct`, their difference per first
              read of a row is name + "_touch"); "warm" (its own call right before: what
              the statement before just wrote); "block" (warm at the smaller function
              size, a fused block's, else as left); None (as the timing before left it)
      fit     "curve" (seconds per item over the points), "capped" (a curve made
              `monotone`), "rate", or None
      rounds  the rounds it is timed in (None: the calibration's), after a warm-up round
              if `warm_up` (not a block loop's: each of its rounds flushes the cache)
    """
    name: str
    points: Callable
    build: Callable
    state: Optional[str] = None
    fit: Optional[str] = "curve"
    rounds: Optional[int] = None
    warm_up: bool = True


class Derived(NamedTuple):
    """A curve derived from two measured ones (`excess`): what `dearer` costs beyond
    `cheaper`, per `unit(timing, along, across)` units, at each point of the row named
    `sample` (whose timing gives the units)."""
    name: str
    dearer: str
    cheaper: str
    sample: str
    unit: Callable


class Bench:
    """What the samples' kernels run on, made once and shared by the rows that read it (as
    a step's statements share its tensors, and to hold the memory of one of each): the
    random tables, ids and scratch buffers, by name."""

    def __init__(self, quick, seed=0):
        self.quick, self.seed, self.rng = quick, seed, np.random.default_rng(seed)
        self.widths, self.tables, self.edges = graph_sizes(quick)
        self._made = {}

    def made(self, key, make):
        """`make()` the first time `key` is asked for; the same object after."""
        if key not in self._made:
            self._made[key] = make()
        return self._made[key]

    def random(self, name, shape, dtype=np.float32):
        return self.made((name, shape), lambda: self.rng.random(shape, dtype=dtype))

    def normal(self, name, shape):
        return self.made((name, shape),
                         lambda: self.rng.standard_normal(shape, dtype=np.float32))

    def scratch(self, name, size, dtype=np.float32):
        return self.made(name, lambda: np.empty(size, dtype))


class GraphPoint:
    """What a graph kernel reads at a point (table rows, row width) of its sample: an
    R-MAT block over a table of `rows` rows (`rmat_block`: its CSR `indptr`, the other
    ends' ids `cols`, the `distinct` rows they touch, and its `blocks` of a fused group's
    byte budget), the node table `x` and the block's `edge_rows` (random, views of
    buffers of the widest rows), and scratch for results (`out`, `taken`: a group's
    workspace)."""

    def __init__(self, bench, rows, width, csr="in", seed=1):
        self.bench, self.rows, self.width, self.K = bench, rows, width, _kernels()
        self.indptr, self.cols = rmat_block(rows, bench.edges, seed=seed, csr=csr)
        self.edges = len(self.cols)
        self.distinct = bench.made(("distinct", rows, csr, seed),
                                   lambda: len(np.unique(self.cols)))
        self.blocks = alone_blocks(self.indptr, width, bench.quick)
        top, most = bench.widths[-1], max(bench.tables)
        self.x = _view(bench.normal(("nodes", csr, seed), rows * top), (rows, width))
        self.out = _view(bench.scratch("out", most * top), (len(self.indptr) - 1, width))
        self.taken = bench.scratch("taken", bench.edges * top)
        self.where = csr, seed

    @functools.cached_property
    def edge_rows(self):
        values = self.bench.normal(("edge values",) + self.where,
                                   self.edges * self.bench.widths[-1])
        return _view(values, (self.edges, self.width))


def on_graph(kernel, **where):
    """A graph kernel's sample builder: `kernel` (a GraphPoint -> Timing) at each point,
    on the block `where` names (`csr`, `seed`)."""
    return lambda bench, rows, width: kernel(GraphPoint(bench, rows, width, **where))


def _kernels():
    from ..transformers.numpy import kernels
    return kernels


# Graph kernels: at every table size and width, or at the smaller table.
def every_table(quick):
    widths, tables, _ = graph_sizes(quick)
    return [(rows, w) for rows in tables for w in widths]


def first_table(quick):
    widths, tables, _ = graph_sizes(quick)
    return [(tables[0], w) for w in widths]


def take(g):
    """np.take of a node table's rows by the other ends (at random)."""
    return Timing(lambda: [take_rows(g.x, g.cols[p0:p1], g.taken) for _, _, p0, p1 in g.blocks],
                  g.edges, g.x, g.distinct)


def spmm(g):
    """A block's sparse product over a node table (K.gather_sum: the fused groups' sums)."""
    return Timing(lambda: [g.K.gather_sum(g.x, None, g.cols[p0:p1], g.indptr[v0:v1 + 1] - p0,
                                          "sum", g.out[v0:v1]) for v0, v1, p0, p1 in g.blocks],
                  g.edges, g.x, g.distinct)


def exchanged(g):
    """A third of a table's rows, sorted, as an exchange picks a peer's rows or writes
    those received into place."""
    return g.bench.made(("exchanged", g.rows), lambda: np.sort(
        g.bench.rng.choice(g.rows, g.rows // 3, replace=False)))


def pick(g):
    ids = exchanged(g)
    return Timing(lambda: g.x[ids], len(ids))


def place(g):
    ids = exchanged(g)
    received = np.zeros((len(ids), g.width), np.float32)
    return Timing(lambda: g.x.__setitem__(ids, received), len(ids))


def segment(g, reduce="max"):
    """K.segment_reduce of the block's edge rows (a maximum: max and min; "sum")."""
    return Timing(lambda: [g.K.segment_reduce(g.edge_rows[p0:p1], g.indptr[v0:v1 + 1] - p0,
                                              reduce, g.out[v0:v1])
                           for v0, v1, p0, p1 in g.blocks], g.edges, g.edge_rows)


def fancy(g):
    order = g.bench.made(("order", g.rows) + g.where, lambda: g.bench.rng.permutation(g.edges))
    return Timing(lambda: g.edge_rows[order], g.edges)


def take_sorted(g):
    """np.take of a node table's rows by the block's own ends (in order)."""
    ends = g.bench.made(("ends", g.rows) + g.where, lambda: g.K.segment_ids(g.indptr, 0))
    return Timing(lambda: [take_rows(g.x, ends[p0:p1], g.taken) for _, _, p0, p1 in g.blocks],
                  g.edges, g.x)


def row_sum(g):
    reduced = np.empty(g.rows, np.float32)
    return Timing(lambda: np.einsum("ab->a", g.x, out=reduced), g.rows)


def column_sum(g):
    column = np.empty(g.width, np.float32)
    return Timing(lambda: np.sum(g.x, axis=(0,), out=column), g.rows)


def log_softmax(g):
    soft = np.empty_like(g.x)
    return Timing(lambda: g.K.log_softmax(g.x, 1, soft), g.rows)


# The statements of a busy calibration block (`busy_block`), each the curve of its
# primitive (+ "_busy") or None (timed, not kept).
BUSY_STATEMENTS = (None, "take", "take_sorted", None, "segment", "segment_sum", "spmm",
                   "gather_sum_heads", "edge_take", "keep_take")
EDGES_PER_ROW = 10           # edge_take: a table of stored edge values, 10 rows a vertex
BUSY_ARRAYS = 3              # edge arrays a busy block makes: its rows read, and their sum
BUSY_ROUNDS = 2              # each round times every statement over many blocks
SHORT_BLOCKS = 8             # gather_sum_heads_short: blocks this many times shorter
LIGHT_FIRST_READS = ("take", "spmm")    # rows read at random: "_light_steady", "_light_touch"
HEAD_WIDTH = 8               # the widest head of the per-head product's sample


def busy_block_edges(width, quick=False):
    """Edges in a busy calibration block of rows of `width` floats: BUSY_ARRAYS edge arrays
    of them fill the group's byte budget."""
    return max(block_budget(quick) // (BUSY_ARRAYS * 4 * width), 1)


def busy_block(bench, rows, width, csr="in"):
    """The fused groups' primitives timed statement by statement (`_run_busy`) in a busy
    block loop, written as the NumPy transformer writes a group with edge values
    (ngnn.transformers.numpy.fused): each block of vertices of an R-MAT CSR takes its
    edges' rows by the other end (at random) and by its own (in order) into its
    workspace, adds them, reduces them by segment and runs the sparse products, in
    blocks of the group's byte budget. Each primitive then finds the cache and the TLB
    as a group's other statements leave them: a random row read of a block ran 3 to 4
    times slower there than in a loop of its own, its table moved out of the core's
    cache between blocks. Its figures: {(primitive + "_busy", "_light"..., table rows,
    width): seconds per item}. The per-head product is "gather_sum_heads" (attention
    groups are busy ones); "edge_take" reads rows of a stored edge value by edge ids (at
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
    g, quick = GraphPoint(bench, rows, width, csr), bench.quick
    n_e, edge_rows, most = g.edges, EDGES_PER_ROW * rows, max(bench.tables)
    # Every configuration reads views of scratch of the largest size (random values).
    heads = None
    if 4 <= width <= HEAD_WIDTH:
        heads = _view(bench.random("heads", most * HEADS * HEAD_WIDTH), (HEADS, rows, width))
    stored = keep = None
    if csr == "in" and width <= HEADS:
        values = bench.random("stored edge values", EDGES_PER_ROW * most * HEADS)
        stored = _view(values, (edge_rows, width))
        keep = _view(bench.made("keeps", lambda: values < 0.5), (edge_rows, width))
    weight, eids = bench.made(("edge ids", rows, csr), lambda: (
        bench.rng.random((n_e, HEADS, 1), dtype=np.float32),
        bench.rng.integers(0, edge_rows, n_e)))
    blocks = blocks_of(g.indptr, busy_block_edges(width, quick))
    short = blocks_of(g.indptr, max(busy_block_edges(width, quick) // SHORT_BLOCKS, 1))
    out_heads = _view(bench.scratch("out heads", most * HEADS * HEAD_WIDTH),
                      (len(g.indptr) - 1, HEADS, width))
    timed = [name for name in BUSY_STATEMENTS if name and
             (heads is not None or name != "gather_sum_heads") and
             (stored is not None or name not in ("edge_take", "keep_take")) and
             (csr == "in" or not name.startswith("segment"))]
    run = functools.partial(_run_busy, g.K, g.x, heads, weight, eids=eids, indptr=g.indptr,
                            cols=g.cols, blocks=blocks, out=g.out, out_heads=out_heads,
                            workspace=busy_workspace(bench), segments=csr == "in")
    light = functools.partial(run, None, None)
    runs = [(("_busy", "_light"), light)] if stored is None else \
        [(("_busy",), functools.partial(run, stored, keep)), (("_light",), light)]
    streamed = bench.made("streamed", lambda: np.zeros(block_budget(quick) // 4, np.float32))
    prefix = "" if csr == "in" else "out_"

    def one_round():
        figures = Figures()
        if heads is not None:
            flush_cache()
            figures[prefix + "gather_sum_heads_short", rows, width] = max(_run_short_heads(
                g.K, heads, weight, g.indptr, g.cols, short, out_heads, streamed), 1e-12) / \
                (n_e * HEADS)
        for suffixes, run_ in runs:
            flush_cache()
            for name, seconds in zip(BUSY_STATEMENTS, run_()):
                by_ids = name in ("edge_take", "keep_take")
                if name not in timed or by_ids and "_busy" not in suffixes:
                    continue
                per_head = name == "gather_sum_heads"
                table = EDGES_PER_ROW * rows if by_ids else rows
                for suffix in suffixes:
                    key = (prefix + name + ("" if per_head and suffix == "_busy" else
                                            suffix), table, width)
                    figures[key] = max(seconds, 1e-12) / (n_e * (HEADS if per_head else 1))
        # The light block once more, its tables as its first pass left them.
        for name, seconds in zip(BUSY_STATEMENTS, light()):
            if name in LIGHT_FIRST_READS:
                figures[prefix + name + "_light_steady", rows, width] = \
                    max(seconds, 1e-12) / n_e
        return figures
    return Timing(one_round, n_e, distinct=g.distinct)


def busy_workspace(bench):
    """BUSY_ARRAYS edge arrays of the longest busy block (its last vertex's edges
    included) of every configuration."""
    def make():
        longest = max(busy_block_edges(w, bench.quick) * w for w in bench.widths) + max(
            int(np.diff(rmat_block(rows, bench.edges, seed=1, csr=csr)[0]).max())
            for rows in bench.tables for csr in ("in", "out")) * bench.widths[-1]
        return [np.empty(longest, np.float32) for _ in range(BUSY_ARRAYS)]
    return bench.made("busy workspace", make)


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


# Products: a layer's (rows, inner) @ (inner, outer) and its weight gradient (inner, rows)
# @ (rows, outer), each per row of the long axis (BLAS's speed depends on the narrow sizes).
def product_points(quick):
    sizes = (4, 16) if quick else (4, 16, 64)
    return [(inner, outer) for inner in sizes for outer in sizes]


def product(bench, inner, outer, gradient=False):
    rows = 20_000 if bench.quick else 100_000
    a = bench.normal("layer input", (rows, inner))
    if gradient:
        d, grad = bench.normal("delta", (rows, outer)), np.empty((inner, outer), np.float32)
        return Timing(functools.partial(np.matmul, a.T, d, out=grad), rows)
    w, out = bench.normal("weights", (inner, outer)), np.empty((rows, outer), np.float32)
    return Timing(functools.partial(np.matmul, a, w, out=out), rows)


# Dropout keep bits: a whole tensor's at once (at the function sizes), and for a rank's
# dropout keyed by its global ids (half of a span, as 2 ranks hold) at each row width:
# kernels.dropout_keep_rows, and the bits of the ids' whole span; what picking the ids'
# rows costs beyond drawing their span is the difference (`keep_select`).
def function_points(quick):
    return [(elements, 1) for elements in FUNCTION_SIZES[quick]]


def keyed_points(quick):
    span = 20_000 if quick else TABLE_ROWS[0]
    return [(span, width) for width in ((1, 4, 16) if quick else (1, 4, 16, 64))]


def keep_bits(bench, elements, _):
    bits = np.empty(elements, np.bool_)
    return Timing(lambda: philox.keep_bits(1, 0, 0.5, bits), elements)


def keyed_ids(bench, span):
    return bench.made(("ids", span),
                      lambda: np.sort(bench.rng.choice(span, span // 2, replace=False)))


def keep_rows(bench, span, width):
    K, ids = _kernels(), keyed_ids(bench, span)
    # A new call number each time: the kernels keep a step's mask for its next use.
    calls = bench.made("dropout calls", itertools.count)
    return Timing(lambda: K.dropout_keep_rows(1, next(calls), 0.5, (len(ids), width), ids),
                  len(ids))


def keep_span(bench, span, width):
    ids, bits = keyed_ids(bench, span), np.empty(span * width, np.bool_)
    return Timing(lambda: philox.keep_bits(1, 0, 0.5, bits), len(ids))


TRAILING_WIDTHS = (4, 8, 16)   # np.multiply@trailing, np.add@bias: a broadcast's rows


def row_points(quick):
    return [(elements, row) for elements in FUNCTION_SIZES[quick] for row in TRAILING_WIDTHS]


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


# The operands a function is timed on where not the first of (x, y) it takes: x standard
# normal, y positive (past 1); the domain of a logarithm and a root, a power of a constant.
OPERANDS = {"np.log": ("y",), "np.sqrt": ("y",), "np.power": ("y", 0.5)}


def operands(bench, elements):
    """(x, y, out) of a function's sample of `elements` elements."""
    def make():
        x = bench.rng.standard_normal(elements, dtype=np.float32)
        y = np.abs(bench.rng.standard_normal(elements, dtype=np.float32)) + 1
        return x, y, np.empty_like(x)
    return bench.made(("operands", elements), make)


def numpy_call(name):
    """The sample of NumPy (or scipy.special) function `name`, per element, on the
    operands OPERANDS names."""
    module, _, attribute = name.rpartition(".")
    function = getattr({"np": np, "scipy.special": scipy.special}.get(module), attribute, None)
    if function is None:
        raise ValueError(f"numpy_calls: {name!r} is not a NumPy or scipy.special "
                         "function (an op declares the functions its statement calls)")

    def build(bench, elements, _):
        x, y, out = operands(bench, elements)
        if name == "np.copyto":          # copyto(dst, src), not a ufunc
            return Timing(functools.partial(np.copyto, out, x), elements)
        args = [{"x": x, "y": y}.get(a, a) for a in OPERANDS.get(name, ("x", "y")[:function.nin])]
        return Timing(functools.partial(function, *args, out=out), elements)
    return build


def cast_multiply(bench, elements, _):
    """A mask times floats: far slower per element than plain arrays."""
    x, y, out = operands(bench, elements)
    mask = x > 0
    return Timing(lambda: np.multiply(mask, y, out=out), elements)


def trailing_multiply(bench, elements, row):
    """A multiply by a value a row: NumPy's inner loop runs over one row (R-MAT 100K in a
    fused block, 0.83 ns an element for rows of 4 and 0.33 for rows of 16)."""
    x, y, out = operands(bench, elements)
    column = y[:elements // row].reshape(-1, 1)
    return Timing(functools.partial(np.multiply, column, x.reshape(-1, row),
                                    out=out.reshape(-1, row)), elements)


def bias_add(bench, elements, row):
    """A row added to every row, the inner loop again over one row."""
    x, y, out = operands(bench, elements)
    return Timing(functools.partial(np.add, x.reshape(-1, row), y[:row].copy(),
                                    out=out.reshape(-1, row)), elements)


def row_sums(bench, elements, row):
    """K.row_sums: rows of `row` values summed as a product with ones (a per-head dot
    product's rows of 8 in a fused group; BLAS's dot per row, 2.6 times np.einsum's)."""
    x, _, out = operands(bench, elements)
    return Timing(functools.partial(_kernels().row_sums, x, row, out[:elements // row]),
                  elements)


# Scalar rates, each of one call.
def dense_operands(bench):
    """(a, w, narrow, grad, out): a layer's input, weights, output and weight gradient."""
    rows, width = (20000, 32) if bench.quick else (200000, 64)
    a = bench.normal("dense input", (rows, width))
    return bench.made("dense", lambda: (a, bench.rng.standard_normal((width, 16), np.float32),
                                        np.empty((rows, 16), np.float32),
                                        np.empty((width, 16), np.float32), np.empty_like(a)))


def layer_product(bench):
    """A layer's product and its weight gradient: 2 * 2 * rows * width * 16 flops."""
    a, w, narrow, grad, _ = dense_operands(bench)
    return Timing(lambda: (np.dot(a, w, out=narrow), np.dot(a.T, narrow, out=grad)),
                  4 * a.shape[0] * a.shape[1] * 16)


def on_dense(call, items):
    """The sample of `call(a, out, seed)` over a layer's input `a`: `items(a)` items."""
    def build(bench):
        a, *_, out = dense_operands(bench)
        return Timing(functools.partial(call, a, out, bench.seed), items(a))
    return build


def segment_ids(bench):
    """A group's segment ids, block by block, over an R-MAT graph's degrees (zeros and
    hubs)."""
    g = GraphPoint(bench, bench.tables[0], 4)
    return Timing(lambda: [g.K.segment_ids(g.indptr[v0:v1 + 1] - p0, v0)
                           for v0, v1, p0, _ in g.blocks], g.edges)


def by_head(bench):
    """Per-head copies of a node table larger than the last-level cache, as GAT's are
    (R-MAT 100K, 8 heads of 8 floats: 26 MB): a copy of 13 MB ran twice as fast a byte."""
    K = _kernels()
    rows = 20000 // 4 if bench.quick else 200000
    heads = bench.rng.standard_normal((rows, 8, 8), dtype=np.float32)
    copies = np.empty((8, rows, 8), np.float32)
    return Timing(functools.partial(K.by_head, heads, 8, copies), 2 * heads.nbytes)


def one_point(quick):
    return [()]


# The calibration table: what is timed, at which points, from which cache state, and how
# it is fitted (Sample). A fused group's graph kernels are timed from a cold cache and
# again warm ("cold+warm": numpy_plan decides which a statement finds, by the bytes the
# step moved since its table was written). (Warmed only by the timing before, whose own
# table took its place, a block's product at R-MAT 100K, rows of 16 floats, ran at 5.7
# ns an edge, 4.1 on a table just written.) An exchange's copies and the dense
# reductions read what the statement before them wrote. A fused block's element-wise
# statements and its segment ids read what the block wrote just before: timed warm
# ("block", "warm"). (Timed after the larger size's, a mask's multiply ran at 0.51 ns an
# element, 0.19 warm; the segment ids, cold 1.22 ns an edge, warm 1.06, in GAT's groups
# at R-MAT 500K 0.8.) Each NumPy function an op declares is a row as well (`samples`).
SAMPLES = (
    Sample("flops", one_point, layer_product, fit="rate"),
    Sample("memory_bandwidth", one_point, on_dense(
        lambda a, out, _: np.add(a, a, out=out), lambda a: 3 * a.nbytes), fit="rate"),
    Sample("transcendental_rate", one_point, on_dense(
        lambda a, out, _: np.exp(a, out=out), lambda a: a.size), fit="rate"),
    Sample("dropout_rate", one_point, on_dense(
        lambda a, out, seed: philox.dropout(a, seed, 0, 0.5, out), lambda a: a.size),
        fit="rate"),
    Sample("repeat_rate", one_point, segment_ids, "warm", fit="rate"),
    Sample("transpose_rate", one_point, by_head, fit="rate"),
    Sample("take", every_table, on_graph(take), "cold+warm"),
    Sample("spmm", every_table, on_graph(spmm), "cold+warm"),
    Sample("out_take", every_table, on_graph(take, csr="out"), "cold+warm"),
    Sample("out_spmm", every_table, on_graph(spmm, csr="out"), "cold+warm"),
    Sample("pick", every_table, on_graph(pick)),
    Sample("place", every_table, on_graph(place)),
    Sample("segment", first_table, on_graph(segment, seed=2), "cold+warm"),
    Sample("segment_sum", first_table,
           on_graph(functools.partial(segment, reduce="sum"), seed=2), "cold+warm"),
    Sample("fancy", first_table, on_graph(fancy, seed=2)),
    Sample("take_sorted", first_table, on_graph(take_sorted, seed=2), "cold+warm"),
    Sample("row_sum", first_table, on_graph(row_sum, seed=2)),
    Sample("column_sum", first_table, on_graph(column_sum, seed=2)),
    Sample("log_softmax", first_table, on_graph(log_softmax, seed=2)),
    Sample("matmul", product_points, product, fit="capped"),
    Sample("matmul_t", product_points, functools.partial(product, gradient=True),
           fit="capped"),
    Sample("keep_bits", function_points, keep_bits),
    Sample("keep_rows", keyed_points, keep_rows, fit=None),
    Sample("keep_span", keyed_points, keep_span, fit=None),
    Sample("np.multiply@cast", function_points, cast_multiply, "block"),
    Sample("np.multiply@trailing", row_points, trailing_multiply, "block"),
    Sample("np.add@bias", row_points, bias_add, "block"),
    Sample("row_sums", row_points, row_sums, "block"),
    Sample("busy", every_table, busy_block, rounds=BUSY_ROUNDS, warm_up=False),
    Sample("out_busy", every_table, functools.partial(busy_block, csr="out"),
           rounds=BUSY_ROUNDS, warm_up=False),
)


def first_reads_unit(timing, *point):
    return first_reads_per_edge(timing.distinct, timing.items)


# A keyed dropout's picking, per element, beyond drawing its ids' span; a light busy
# block's first reads of its rows, as a quiet one's ("_touch", first_reads).
DERIVED = (Derived("keep_select", "keep_rows", "keep_span", "keep_rows",
                   lambda timing, span, width: width),) + tuple(
    Derived(prefix + name + "_light_touch", prefix + name + "_light",
            prefix + name + "_light_steady", prefix + "busy", first_reads_unit)
    for prefix in ("", "out_") for name in LIGHT_FIRST_READS)


def samples():
    """The calibration table: SAMPLES and a row for each NumPy function an op declares."""
    return SAMPLES + tuple(Sample(name, function_points, numpy_call(name), "block")
                           for name in declared_functions())


def derived(rows, timings, quick):
    """DERIVED and, for each row timed cold and warm whose reads touch rows at random
    (`Timing.distinct`), its first reads' cost ("_touch"): beyond its warm cost, per
    first_reads of the rows it touches."""
    return DERIVED + tuple(
        Derived(row.name + "_touch", row.name, row.name + "_warm", row.name,
                first_reads_unit) for row in rows if row.state == "cold+warm" and
        timings[(row.name,) + tuple(row.points(quick)[0])].distinct is not None)


def time_samples(rows, bench, rounds):
    """({figure key: fastest seconds}, {key: Timing}) of the table's `rows`: each built at
    each of its points (`(name, *point)`, a rate's `name`) and timed by `_fastest`, every
    timing prepared as its row's `state` says, in rounds of its row's count."""
    timings, before, by_rounds = {}, {}, {(rounds, True): {}}
    small = FUNCTION_SIZES[bench.quick][0]
    for row in rows:
        for point in row.points(bench.quick):
            key = (row.name,) + tuple(point) if point else row.name
            timing = timings[key] = row.build(bench, *point)
            group = by_rounds.setdefault((row.rounds or rounds, row.warm_up), {})
            group[key] = timing.run
            if row.state in ("cold", "cold+warm"):
                before[key] = flush_cache
            if row.state == "warm" or row.state == "block" and point[0] == small:
                before[key] = timing.run
            if row.state == "cold+warm":
                warm = (row.name + "_warm",) + tuple(point)
                timings[warm], group[warm] = timing, timing.run
                before[warm] = functools.partial(np.multiply, timing.table, 1,
                                                 out=timing.table)
    best = {}
    for (count, warm_up), group in by_rounds.items():
        best.update(_fastest(group, count, before, warm_up))
    return best, timings


def per_item(rows, bench, rounds):
    """({figure key: seconds per item}, {rate: items per second}) of the table's `rows`,
    timed (`time_samples`), with the figures derived from theirs (`derived`)."""
    best, timings = time_samples(rows, bench, rounds)
    rates = {row.name: timings[row.name].items / best.pop(row.name) for row in rows
             if row.fit == "rate"}
    figures = {key: seconds / timings[key].items if key in timings else seconds
               for key, seconds in best.items()}
    points = {row.name: row.points(bench.quick) for row in rows}
    for figure in derived(rows, timings, bench.quick):
        if figure.sample in points:
            excess(figures, figure.name, figure.dearer, figure.cheaper,
                   {point: figure.unit(timings[(figure.sample,) + point], *point)
                    for point in points[figure.sample]})
    return figures, rates


def measure(quick=False, seed=0):
    """({scalar rate: value}, {primitive: Curve}) for this machine: the calibration table
    (`samples`) timed, the curves fitted."""
    rows, rounds = samples(), 3 if quick else 5
    figures, rates = per_item(rows, Bench(quick, seed), rounds)
    rates["call_overhead"] = call_overhead(rounds)
    fits = {row.name: row.fit for row in rows}
    return rates, fit_curves({key: seconds for key, seconds in figures.items()
                              if fits.get(key[0], "curve") is not None},
                             capped={name for name, fit in fits.items() if fit == "capped"})


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
