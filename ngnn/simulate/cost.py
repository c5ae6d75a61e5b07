"""The cost of one step of a computation's plan (a plain op, a fused group, a kernel group)
on one device, in seconds, with the work and the bytes it was priced from.

A step is priced as the statements the transformer runs for it, each at the calibrated
rate of its primitive, plus the device's overhead per statement. Each op declares its
work (`Op.work`, ngnn/op_graph/work.py: the kernels its statement runs, with their items,
row widths, tables and bytes), which `RULES` prices:

* an element-wise op (no declared work) pays one pass over its operands per NumPy
  function it declares (`Op.numpy_calls`), each at its calibrated cost per element, and
  exp-like functions their per-element rate;
* graph primitives ("take", "spmm", "edge_take", "segment", "row_sum", "log_softmax"...),
  each at its calibrated curve over the row width and the size of the table read
  (`Curve`), else at the device's scalar rates; element-wise passes ("pass") at the
  memory bandwidth; BLAS products ("matmul") by a roofline, max(flops / throughput,
  bytes / bandwidth), and their calibrated curve; CSR products; dropouts a random draw
  per element;
* a NumPy fused group by its block plan (ngnn.passes.block_planning, numpy_plan): the
  masks and per-head copies made once per call, then per block of vertices the block's
  bookkeeping (edge ids, segment ids) and each member's work on the block's rows, where
  the group's sparse products read gathered rows in place;
* communication ops (`MirrorReduce`, `MasterBroadcast`, `AllReduce`): the alpha-beta
  model over the topology's link, plus the copies of the rows sent and received.

A device without curves (the GPU presets) prices graph primitives by its scalar rates,
and a kernel group (GPU transformer) as its members' work in one call.
"""
import functools
import operator

import numpy as np

from ..op_graph import Broadcast
from ..op_graph.work import elements as size, nbytes, row_elements
from ..passes.buffer_sharing import is_group
from ..op_graph.combiners import COMBINERS

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
    """The cost of the work of one op, without the call overheads: its declared work
    (`op.work`), each kernel by its rule (`RULES`, else a calibrated primitive); an op
    declaring none, as element-wise. `plan`: the NumPy transformer's view of the
    computation (`NumPyPlan`), whose kernels it prices; `per_call`: the rows one call of
    an element-wise op runs over (a fused block's)."""
    if op.is_leaf:
        return Cost(kind="view", calls=0)
    if op in views:                          # one statement binding a view
        return Cost(kind="view")
    if not op.work:
        return elementwise(op, device, per_call=per_call)
    priced = (RULES[w.kernel](op, w, device, topology, rank, plan) if w.kernel in RULES
              else primitive(device, w.kernel, w.items, w.width, w.table, w.calls, w.moved)
              for w in op.work)
    return functools.reduce(operator.add, priced)


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


def blas_product(device, work):
    """A roofline; for the 2-D products of a layer (`work.table` its narrow inner size),
    at least the calibrated cost of BLAS at its narrow sizes per row of its long axis
    (`work.kernel`'s curve: "matmul", or "matmul_t" for a weight gradient)."""
    seconds = max(work.flops / device.flops, work.moved / device.memory_bandwidth)
    if work.table is not None and "matmul" in device.curves:
        seconds = max(seconds, work.items * device.curves[work.kernel](work.width, work.table))
    return Cost(seconds, work.flops, work.moved, kind="product")


def dropout(op, device, masks=None):
    """A random draw and a masked scale per element (per stored value of a sparse tensor,
    bounded by its dense size); a dropout keyed by ids ("keyed_dropout": `rows`, a rank's
    global ids) as `kernels.dropout_rows` draws it: its keep bits (`keep_bits`), then the
    scale."""
    (declared,) = op.work
    if declared.kernel == "keyed_dropout" and masks is not None:
        cost = keep_bits(device, op, masks) + apply_keep(device, declared.items)
        cost.calls = 1
        return cost
    # The calibrated rate is a whole dropout's (philox.dropout: the draw and the scale).
    return Cost(declared.items / device.dropout_rate, declared.items, declared.moved)


def draws_mask(op):
    """Does the op draw a dropout mask (a declared "dropout" or "keyed_dropout")?"""
    return any(w.kernel in ("dropout", "keyed_dropout") for w in op.work)


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


def csr_product(op, work, device):
    """A CSR product: its multiply-adds at the device's sparse rate, its result written."""
    return Cost(work.items / device.spmm_rate + nbytes(op) / device.memory_bandwidth,
                work.flops, work.moved, kind="graph")


def all_reduce(op, work, device, topology, rank):
    """Its fixed cost plus the bytes at the all-reduce bandwidth (both measured on 2
    ranks)."""
    ranks = op.exchange.size
    if ranks <= 1:
        return Cost(kind="comm", calls=0)
    link = topology.link(rank, (rank + 1) % ranks)
    moved = work.moved
    # A ring moves 2 (p - 1) / p of the tensor; the calibrated bandwidth is for p = 2.
    share = (ranks - 1) / ranks * 2
    seconds = link.allreduce_latency * max(1.0, np.log2(ranks)) + \
        share * moved / link.allreduce_bandwidth
    return Cost(seconds, 0, 2 * moved, share * moved, kind="comm", calls=3)


def exchange(op, work, device, topology, rank):
    """A point-to-point exchange (mirrors' rows to their masters, "mirror_reduce", or
    masters' to their mirrors): each peer's rows over its link, one message each, and the
    copies of the rows out of and into the tensor."""
    reduces = work.kernel == "mirror_reduce"
    local = op.graph if reduces else op.local_graph
    row = row_elements(op) * np.dtype(op.dtype).itemsize
    width = row / 4
    mirrors, masters = exchange_rows(local, op.at)
    sends, receives = (mirrors, masters) if reduces else (masters, mirrors)
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
    if reduces:
        copy = copy + picks(device, in_rows, width, op.shape[0]) + \
            passes(device, in_rows * width, 3 * in_rows * row, calls=0)
    copy = copy + places(device, in_rows, width, op.shape[0] if op.shape else 1)
    masters_part = nbytes(op) if reduces else nbytes(op.args[0])
    whole = passes(device, 0, 2 * masters_part, calls=0)     # the masters' own rows
    cost = copy + whole
    if reduces and op.reduce != "sum":
        # A copy of x with the inactive rows set to -inf or inf; masters without edges to 0.
        cost = cost + passes(device, 0, 3 * nbytes(op.args[0]), calls=2)
    if not reduces and op.at is not None:
        cost = cost + passes(device, 0, nbytes(op) - masters_part, calls=1)   # mirrors to 0
    return Cost(seconds + cost.seconds, 0, cost.bytes, sent, kind="comm",
                calls=calls + cost.calls)


# The declared kernels (`Op.work`) priced otherwise than by one calibrated primitive, each
# a rule of (op, work, device, topology, rank, plan).
RULES = {
    "pass": lambda op, w, device, *_: passes(device, w.items, w.moved, w.calls,
                                             w.transcendental),
    "matmul": lambda op, w, device, *_: blas_product(device, w),
    "matmul_t": lambda op, w, device, *_: blas_product(device, w),
    "csr_product": lambda op, w, device, *_: csr_product(op, w, device),
    "dropout": lambda op, w, device, *_: dropout(op, device),
    "keyed_dropout": lambda op, w, device, topology, rank, plan: dropout(
        op, device, plan.masks if plan is not None else None),
    "all_reduce": lambda op, w, device, topology, rank, _: all_reduce(op, w, device,
                                                                      topology, rank),
    "mirror_reduce": lambda op, w, device, topology, rank, _: exchange(op, w, device,
                                                                       topology, rank),
    "master_broadcast": lambda op, w, device, topology, rank, _: exchange(op, w, device,
                                                                          topology, rank),
}


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
