"""The cost of one step of a computation's plan (a plain op, a fused group, a kernel group)
on one device, in seconds, with the work and the bytes it was priced from.

A step is priced as the statements the transformer runs for it, each at the calibrated
rate of its primitive, plus the device's overhead per statement:

* dense ops: a roofline, max(flops / throughput, bytes / bandwidth); an element-wise op
  pays one pass over its operands per NumPy function it declares (`Op.numpy_calls`), each
  at its calibrated cost per element, and exp-like functions their per-element rate; a
  dropout a random draw per element;
* graph ops, by the primitives the NumPy transformer lowers them to, each a calibrated
  curve over the row width and the size of the table read (`Curve`): `np.take` of rows
  (gathers), a CSR product over random columns (sum and mean aggregations), segment
  reductions (max and min), fancy row indexing, row and column sums, log-softmax;
* a NumPy fused group by its block plan (ngnn.passes.block_planning, numpy_plan): the
  masks and per-head copies made once per call, then per block of vertices the block's
  bookkeeping (edge ids, segment ids) and each member's work on the block's rows, where
  the group's sparse products read gathered rows in place;
* communication ops (`MirrorReduce`, `MasterBroadcast`, `AllReduce`): the alpha-beta
  model over the topology's link, plus the copies of the rows sent and received.

A device without curves (the GPU presets) prices graph primitives by its scalar rates,
and a kernel group (GPU transformer) as its members' work in one call.
"""
import numpy as np

from ..op_graph import (Aggregate, AllReduce, Assign, Broadcast, Constant, Dot, Dropout,
                        EdgeSoftmax, Gather, LogSoftmax, MasterBroadcast, MirrorReduce,
                        Placeholder, Softmax, SparseDot, SparseDropout, SparseTransposedDot, Sum,
                        Variable, ZeroRowDot)
from ..passes.buffer_sharing import is_group
from ..op_graph.combiners import COMBINERS

LEAVES = (Placeholder, Variable, Constant)
# NumPy functions priced by the device's transcendental rate where no curve says otherwise.
TRANSCENDENTAL = ("np.exp", "np.log", "np.expm1", "np.tanh", "scipy.special.expit",
                  "np.power", "np.sqrt", "np.logaddexp")


class Cost:
    """`seconds` of one step; `flops`, `bytes` (memory traffic), `comm_bytes` (sent over
    links) it was priced from; `kind`: dense, product (a BLAS matrix product), graph,
    fused, comm or view; `calls`: the statements it runs (each pays the device's call
    overhead)."""

    def __init__(self, seconds=0.0, flops=0.0, nbytes=0.0, comm_bytes=0.0, kind="dense",
                 calls=1):
        self.seconds, self.flops, self.bytes = seconds, flops, nbytes
        self.comm_bytes, self.kind, self.calls = comm_bytes, kind, calls

    def __add__(self, other):
        kinds = {self.kind, other.kind}
        return Cost(self.seconds + other.seconds, self.flops + other.flops,
                    self.bytes + other.bytes, self.comm_bytes + other.comm_bytes,
                    self.kind if len(kinds) == 1 else "fused", self.calls + other.calls)


def size(op):
    return int(np.prod(op.shape, dtype=np.int64))


def nbytes(op):
    return size(op) * np.dtype(op.dtype).itemsize


def row_elements(op):
    """Elements per row of a node or edge tensor (features times heads)."""
    return int(np.prod(op.shape[1:], dtype=np.int64))


def row_width(op):
    """A row's width in float32s, the unit the curves were measured in."""
    return row_elements(op) * np.dtype(op.dtype).itemsize / 4


# ---- primitives ----------------------------------------------------------------------------
def per_item(device, primitive, width, rows=None):
    """Seconds per item (an edge or a row) of a graph primitive at `width` float32s per
    row, reading a table of `rows` rows: the calibrated curve (the one measured in busy
    blocks where it alone was), else the scalar rates."""
    curve = device.curves.get(primitive) or device.curves.get(primitive + "_busy")
    if curve is not None and primitive.startswith("edge_take") and rows is not None:
        return _edge_table(device, primitive, curve, width, rows)
    if curve is not None:
        return curve(width, rows)
    row = 4 * width
    if primitive in ("take", "take_sorted", "edge_take", "fancy"):
        return (2 * row + 8) / device.gather_bandwidth
    if primitive in ("spmm", "gather_sum_heads"):
        return width / device.spmm_rate + 8 / device.gather_bandwidth
    if primitive.startswith("segment"):
        return width / device.segment_rate
    if primitive == "log_softmax":
        return 5 * row / device.memory_bandwidth + width / device.transcendental_rate
    return row / device.memory_bandwidth           # row_sum, column_sum


def _edge_table(device, name, curve, width, rows):
    """Random rows of a stored edge value (edge_take), from a table smaller than the
    smallest edge table calibrated: between the node tables' take curve at its largest
    table and edge_take at its smallest, log-linear in the rows (below, the take curve)."""
    nodes = device.curves.get(name.replace("edge_take", "take"))
    if nodes is None or rows >= curve.rows[0]:
        return curve(width, rows)
    low, high = nodes.rows[-1], curve.rows[0]
    if rows <= low:
        return nodes(width, rows)
    t = np.log(rows / low) / np.log(high / low)
    return float(np.exp((1 - t) * np.log(nodes(width, low)) + t * np.log(curve(width, high))))


def primitive(device, name, items, width, rows=None, calls=1, moved=0.0):
    """`calls` statements of primitive `name` over `items` items in all."""
    seconds = items * per_item(device, name, width, rows)
    return Cost(seconds, 0, moved or items * 4 * width, kind="graph", calls=calls)


def blocked(device, name, edges, width, rows, calls, busy=False, light=False):
    """Primitive `name` over `edges` edges in a fused group's block loop, reading `width`
    floats per row from a table of `rows` rows: at its calibrated cost in blocks of its
    own, or, in a block with other edge arrays (`busy`), at its cost measured among them
    (`name`_busy, calibration.busy_blocks), where they move its table out of the cache,
    or in such a block reading no rows by edge ids (`light`: `name`_light, where
    measured); either where only the other was measured."""
    names = (name + "_busy", name) if busy else (name, name + "_busy")
    if busy and light:
        names = (name + "_light",) + names
    curve = next((n for n in names if n in device.curves), name)
    seconds = edges * per_item(device, curve, width, rows)
    return Cost(seconds, 2 * edges * width, edges * 4 * width, kind="graph", calls=calls)


def segment_curve(device, reduce):
    """The calibrated curve of a segment reduction (K.segment_reduce): NumPy's add reduces
    faster than its maximum, so sums have their own."""
    sums = COMBINERS[reduce].ufunc is np.add
    return "segment_sum" if sums and "segment_sum" in device.curves else "segment"


def passes(device, elements, moved, calls=1, transcendental=0):
    """Element-wise work: `moved` bytes at the memory bandwidth, plus `transcendental`
    exp-like evaluations."""
    seconds = moved / device.memory_bandwidth + transcendental / device.transcendental_rate
    return Cost(seconds, elements, moved, calls=calls)


# ---- steps ---------------------------------------------------------------------------------
def step_cost(step, device, topology, rank=0, views=(), plan=None):
    """The cost of one step, call overheads included. `plan`: the NumPy transformer's
    view of the computation (`NumPyPlan`), for its fused groups."""
    if is_group(step):
        if plan is not None and plan.writes(step):
            cost = plan.group_cost(step, device)
        else:
            cost = Cost(kind="fused", calls=0)
            for op in step.ops:
                cost = cost + work(op, device, topology, rank, views)
            cost.calls = 1               # one kernel
        cost.kind = "fused"
    else:
        cost = work(step, device, topology, rank, views, plan)
    cost.seconds += cost.calls * device.call_overhead
    return cost


def work(op, device, topology, rank=0, views=(), plan=None, per_call=None):
    """The cost of the work of one op, without the call overheads. `plan`: the NumPy
    transformer's view of the computation (`NumPyPlan`), whose kernels it prices;
    `per_call`: the rows one call of an element-wise op runs over (a fused block's)."""
    if op.is_leaf:
        return Cost(kind="view", calls=0)
    if op in views:                          # one statement binding a view
        return Cost(kind="view")
    if isinstance(op, (MirrorReduce, MasterBroadcast, AllReduce)):
        return communication(op, device, topology, rank)
    if isinstance(op, (Gather, Aggregate, EdgeSoftmax)):
        return graph_work(op, device)
    if isinstance(op, (SparseDot, SparseTransposedDot)):
        return sparse_product(op, device)
    if isinstance(op, (Dot, ZeroRowDot)):
        return dense_product(op, device)
    if isinstance(op, (Dropout, SparseDropout)):
        return dropout(op, device, plan.masks if plan is not None else None)
    if isinstance(op, (LogSoftmax, Softmax)):
        rows = size(op) // max(op.shape[op.axis], 1) if op.ndim else 1
        return primitive(device, "log_softmax", rows, op.shape[op.axis] if op.ndim else 1,
                         moved=2 * nbytes(op))
    if isinstance(op, Sum) and op.axes and op.args[0].ndim:
        x = op.args[0]
        reduced = int(np.prod([x.shape[a] for a in op.axes], dtype=np.int64))
        if op.axes == tuple(range(x.ndim - len(op.axes), x.ndim)):
            return primitive(device, "row_sum", size(x) // max(reduced, 1), reduced,
                             moved=nbytes(x))
        return primitive(device, "column_sum", reduced, size(x) // max(reduced, 1),
                         moved=nbytes(x))
    if isinstance(op, Assign):
        moved = 2 * nbytes(op.args[-1])
        return Cost(moved / device.memory_bandwidth, 0, moved)
    return elementwise(op, device, per_call=per_call)


def elementwise(op, device, rows=None, per_call=None):
    """An op over `rows` of its rows (default all): each NumPy function it declares
    (`op.numpy_calls`) at its calibrated cost per element, else one pass over the operands
    each (one at least). The functions' curves are read at the elements of one call:
    `per_call` rows (a fused block's, whose arrays the cache holds), else all of them."""
    fraction = 1.0 if rows is None or not op.shape else rows / max(op.shape[0], 1)
    functions = list(op.numpy_calls)
    elements = fraction * max(size(op), max((size(a) for a in op.args if not a.is_sparse),
                                            default=0))
    moved = fraction * (nbytes(op) + sum(nbytes(a) for a in op.args if not a.is_sparse))
    if device.curves and functions and all(f in device.curves for f in functions):
        call = elements if per_call is None or not op.shape else \
            elements * min(per_call / max(op.shape[0], 1), 1.0)
        # A broadcast operand's function per element, at its row length (NumPy's inner
        # loop is a row; the widest measured past those), and a mask's cast.
        slowest = []
        broadcast = row_loop(op)
        if broadcast and "np.multiply@trailing" in device.curves:
            slowest.append(along_rows(device, op.shape[-1], call, broadcast))
        if mixed_dtypes(op) and "np.multiply@cast" in device.curves:
            slowest.append(device.curves["np.multiply@cast"](1, call))
        seconds = sum(max([device.curves[f](1, call)] + slowest) for f in functions)
        return Cost(seconds * elements, elements, len(functions) * moved)
    calls = max(1, len(functions))
    heavy = sum(name in TRANSCENDENTAL for name in functions)
    return passes(device, elements, calls * moved, transcendental=heavy * elements)


def along_rows(device, row, per_call, curve="np.multiply@trailing"):
    """Seconds per element of a function over rows of `row` elements with one operand
    broadcast along them (`row_loop`'s curve, calibrated at a few row lengths; the widest
    measured past those; a profile without a bias curve reads the trailing one)."""
    curve = device.curves.get(curve, device.curves["np.multiply@trailing"])
    return curve(min(row, curve.widths[-1]), per_call)


def row_loop(op):
    """The calibrated curve of NumPy's inner loop where it runs over single rows, else
    None: an operand repeating each value along the last axis (a size-1 last axis, or a
    broadcast view of one: "np.multiply@trailing"), or repeating one row along the others
    (a bias: "np.add@bias", half as dear again at rows of 4: 1.0 against 0.7 ns an
    element). (R-MAT 100K in a fused block, rows of 4 floats: a bias added at 0.82 ns an
    element, a whole array at 0.12.)"""
    if not op.shape or op.shape[-1] == 1:
        return None
    for arg in op.args:
        source = arg.args[0] if isinstance(arg, Broadcast) else arg
        if source.shape and source.shape[-1] == 1 and size(source) > 1:
            return "np.multiply@trailing"
        if len(op.shape) > 1 and source.shape and source.shape[-1] == op.shape[-1] and \
                size(source) == op.shape[-1]:
            return "np.add@bias"
    return None


def mixed_dtypes(op):
    """Does an operand of another dtype (a mask) need casting in the inner loop?"""
    return any(arg.dtype != op.dtype and size(arg) > 1 for arg in op.args)


def dense_product(op, device):
    """A roofline; for the 2-D products of a layer, at least the calibrated cost of BLAS at
    its narrow sizes: (rows, inner) @ (inner, outer) per row, or the weight gradient
    (inner, rows) @ (rows, outer) per row of the long axis. A ZeroRowDot is priced whole:
    its live rows are known only at run time."""
    a, b = op.args[:2]
    inner = a.shape[-1] if a.ndim else 1
    flops = 2 * size(op) * inner
    moved = nbytes(a) + nbytes(b) + nbytes(op)
    seconds = max(flops / device.flops, moved / device.memory_bandwidth)
    if a.ndim == b.ndim == 2 and "matmul" in device.curves:
        (m, k), n = a.shape, b.shape[1]
        if m >= k:
            seconds = max(seconds, m * device.curves["matmul"](n, k))
        else:
            seconds = max(seconds, k * device.curves["matmul_t"](n, m))
    return Cost(seconds, flops, moved, kind="product")


def dropout(op, device, masks=None):
    """A random draw and a masked scale per element (per stored value of a sparse tensor,
    bounded by its dense size); a dropout keyed by ids (`rows`, a rank's global ids) as
    `kernels.dropout_rows` draws it: its keep bits (`keep_bits`), then the scale."""
    draws = size(op)
    moved = 2 * nbytes(op)
    if isinstance(op, Dropout) and op.rows is not None and masks is not None:
        cost = keep_bits(device, op, masks) + apply_keep(device, draws)
        cost.calls = 1
        return cost
    # The calibrated rate is a whole dropout's (philox.dropout: the draw and the scale).
    return Cost(draws / device.dropout_rate, draws, moved)


def numpy_function(device, name, elements, moved, per_call=None):
    """`elements` of NumPy function `name` at its calibrated cost per element (in calls
    of `per_call` elements, default all), else `moved` bytes at the memory bandwidth (no
    statement of its own)."""
    curve = device.curves.get(name)
    seconds = elements * curve(1, per_call or elements) if curve is not None else \
        moved / device.memory_bandwidth
    return Cost(seconds, elements, moved, calls=0)


def apply_keep(device, elements, per_call=None):
    """x * scale * keep (kernels.apply_keep): a multiply, and one by a mask of bytes."""
    return numpy_function(device, "np.multiply", elements, 12 * elements, per_call) + \
        numpy_function(device, "np.multiply@cast", elements, 6 * elements, per_call)


def keep_bits(device, op, masks):
    """The keep bits of a dropout's mask (a byte per element) as the NumPy kernels draw
    them: a whole tensor's at once (philox.keep_bits); keyed by ids (`op.rows`), as
    `kernels.dropout_keep_rows` does: consecutive ids draw their own positions, ids spread
    over a span at least `SPARSE_ROWS` times their count draw the whole span and take
    their rows, and denser ids draw the span between the first and the last id in chunks
    and pick theirs (`keep_select`, per element picked). The kernels keep the latest
    masks of scattered ids (`RECENT_MASKS` of each kind), so a backward dropout or a
    fused group applying a mask drawn earlier in the step reads it; `masks` follows them
    as the steps are priced in order."""
    from ngnn.transformers.numpy.kernels import RECENT_MASKS, SPARSE_ROWS
    elements, width = size(op), max(row_elements(op), 1)
    if op.rows is None:
        return Cost(elements * _per_draw(device, elements), elements, elements, calls=0)
    graph, attribute = op.rows
    ids = np.asarray(getattr(graph, attribute))
    if ids.size == 0:
        return Cost(calls=0)
    first, last = int(ids.min()), int(ids.max())
    if last - first + 1 == ids.size and np.all(np.diff(ids) == 1):
        return Cost(elements * _per_draw(device, elements), elements, elements, calls=0)
    key = (op.seed, op.rate, width)
    if ids.size * SPARSE_ROWS < last + 1:
        cache = masks.setdefault("span", {})
        kept = cache.get(key)
        span = 0 if kept is not None and kept >= last + 1 else (last + 1) * width
        if span:
            _remember(cache, key, last + 1, RECENT_MASKS)
        take = picks(device, ids.size, width / 4, last + 1)
        return take + Cost(span * _per_draw(device, span), span, span, calls=0)
    cache = masks.setdefault("rows", {})
    if cache.get(key) is getattr(graph, attribute):
        return Cost(calls=0)
    _remember(cache, key, getattr(graph, attribute), RECENT_MASKS)
    span = (last - first + 1) * width
    select = device.curves["keep_select"](width) if "keep_select" in device.curves else \
        8 / device.gather_bandwidth
    return Cost(span * _per_draw(device, span) + elements * select, span, span + elements,
                calls=0)


def _remember(cache, key, value, capacity):
    """As the kernels' caches keep masks: the latest `capacity` insertions."""
    cache[key] = value
    while len(cache) > capacity:
        cache.pop(next(iter(cache)))


def _per_draw(device, elements):
    """Seconds per keep bit drawn (philox.keep_bits), over `elements` bits."""
    curve = device.curves.get("keep_bits")
    return curve(1, elements) if curve is not None else 1 / device.dropout_rate


def sparse_product(op, device):
    """A CSR product priced at full density: the plan does not know how many of the
    sparse operand's entries are non-zero, so this bounds the work from above."""
    x, d = op.args
    stored = size(x)
    macs = stored * op.shape[-1]
    moved = nbytes(d) + nbytes(op) + stored * 8
    return Cost(macs / device.spmm_rate + nbytes(op) / device.memory_bandwidth,
                2 * macs, moved, kind="graph")


def graph_work(op, device):
    """A whole-graph graph op (outside fused groups), as ngnn.transformers.numpy.kernels
    computes it."""
    graph = op.graph
    edges, nodes = graph.num_edges, graph.num_nodes
    width = row_width(op)
    if isinstance(op, Gather):
        return primitive(device, "take", edges, width, op.args[0].shape[0])
    if isinstance(op, Aggregate):
        if op.combiner.linear:     # incidence (N, E) @ x: x's rows in edge order
            return primitive(device, "spmm", edges, width, edges) + \
                passes(device, size(op), 2 * nbytes(op))
        # x's rows taken into CSR order, then a segment reduction.
        return primitive(device, "edge_take", edges, width, edges) + \
            primitive(device, "segment", edges, width)
    # EdgeSoftmax: a segment max, a gather of it, subtract and exp, a float64 sum (an
    # incidence product), a gather of it, a divide.
    element = edges * row_elements(op)
    return (primitive(device, "edge_take", edges, width, edges)
            + primitive(device, "segment", edges, width)
            + primitive(device, "take", edges, width, nodes)
            + primitive(device, "spmm", edges, 2 * width, edges)
            + primitive(device, "take", edges, 2 * width, nodes)
            + passes(device, element, 6 * element * 4, calls=4, transcendental=element))


def communication(op, device, topology, rank):
    """Point-to-point exchanges: each peer's rows over its link, one message each, and
    the copies of the rows out of and into the tensor; all-reduce: its fixed cost plus
    the bytes at the all-reduce bandwidth (both measured on 2 ranks)."""
    if isinstance(op, AllReduce):
        ranks = op.exchange.size
        if ranks <= 1:
            return Cost(kind="comm", calls=0)
        link = topology.link(rank, (rank + 1) % ranks)
        moved = nbytes(op)
        # A ring moves 2 (p - 1) / p of the tensor; the calibrated bandwidth is for p = 2.
        share = (ranks - 1) / ranks * 2
        seconds = link.allreduce_latency * max(1.0, np.log2(ranks)) + \
            share * moved / link.allreduce_bandwidth
        return Cost(seconds, 0, 2 * moved, share * moved, kind="comm", calls=3)
    local = op.local_graph if isinstance(op, MasterBroadcast) else op.graph
    row = row_elements(op) * np.dtype(op.dtype).itemsize
    width = row / 4
    mirrors, masters = exchange_rows(local, op.at)
    sends, receives = (mirrors, masters) if isinstance(op, MirrorReduce) else \
        (masters, mirrors)
    seconds, sent, calls = 0.0, 0, 2
    for peer in sorted(set(sends) | set(receives)):
        out_rows, in_rows = sends.get(peer, 0), receives.get(peer, 0)
        seconds += topology.link(rank, peer).time(max(out_rows, in_rows) * row, 1)
        sent += out_rows * row
        calls += 4
    out_rows, in_rows = sum(sends.values()), sum(receives.values())
    # Sent rows are picked (x[rows]); received ones are written into place, a reduction
    # first picking the rows they combine with (out[rows] = combine(out[rows], got)).
    table = op.args[0].shape[0] if op.args[0].shape else 1
    copy = picks(device, out_rows, width, table)
    if isinstance(op, MirrorReduce):
        copy = copy + picks(device, in_rows, width, op.shape[0]) + \
            passes(device, in_rows * width, 3 * in_rows * row, calls=0)
    copy = copy + places(device, in_rows, width, op.shape[0] if op.shape else 1)
    masters_part = nbytes(op) if isinstance(op, MirrorReduce) else nbytes(op.args[0])
    whole = passes(device, 0, 2 * masters_part, calls=0)     # the masters' own rows
    cost = copy + whole
    if isinstance(op, MirrorReduce) and op.reduce != "sum":
        # A copy of x with the inactive rows set to -inf or inf; masters without edges to 0.
        cost = cost + passes(device, 0, 3 * nbytes(op.args[0]), calls=2)
    if isinstance(op, MasterBroadcast) and op.at is not None:
        cost = cost + passes(device, 0, nbytes(op) - masters_part, calls=1)   # mirrors to 0
    return Cost(seconds + cost.seconds, 0, cost.bytes, sent, kind="comm",
                calls=calls + cost.calls)


def picks(device, rows, width, table):
    """x[rows] of `rows` sorted rows of a table of `table` rows (a new array)."""
    name = "pick" if "pick" in device.curves else "fancy"
    return primitive(device, name, rows, width, table, calls=0)


def places(device, rows, width, table):
    """out[rows] = values, `rows` sorted rows of a table of `table` rows."""
    name = "place" if "place" in device.curves else "fancy"
    return primitive(device, name, rows, width, table, calls=0)


def exchange_rows(local, at):
    """({peer: mirror rows}, {peer: master rows}) that take part in an exchange over
    `local` (a rank's LocalGraph) restricted to copies with local edges at `at` (None: all),
    as `Exchange.restricted` finds them: a rank knows its own mirrors' flags; its masters'
    come from the peers, read here from the ranks built together for a prediction
    (`PlanningComm.world`), else from a plan the exchange already made, else all rows."""
    exchange = local.exchange
    mirrors = {q: len(rows) for q, rows in exchange.mirrors_from.items()}
    masters = {q: len(rows) for q, rows in exchange.masters_to.items()}
    if at is None:
        return mirrors, masters
    active = local.active(at)
    mirrors = {q: int(active[rows].sum()) for q, rows in exchange.mirrors_from.items()}
    world = getattr(exchange.comm, "world", None)
    if world:
        looped = local is not world[exchange.rank]
        for q in masters:
            peer = world[q].__dict__.get("_looped", world[q]) if looped else world[q]
            masters[q] = int(peer.active(at)[peer.exchange.mirrors_from[exchange.rank]].sum())
    else:
        made = exchange._restricted.get((id(local), at))
        if made is not None:
            masters = {q: len(made[1].get(q, ())) for q in masters}
    return mirrors, masters
