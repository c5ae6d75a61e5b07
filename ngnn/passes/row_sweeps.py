"""RowSweeps: which runs of row-wise ops the NumPy transformer's native mode runs as one C
loop (make_transformer("numpy", native=True); transformers/numpy/native_sweeps.py).

Between two matrix products a GNN layer's rows go through a chain of small row-wise ops:
a bias add, batch norm's statistics and its normalization, ReLU; backward, the ReLU mask,
its product with the gradient, batch norm's gradient terms. Each is one pass over a
(rows, F) tensor and one call from the generated Python; on a batch of small graphs the
calls and passes cost more than the arithmetic (docs/native.md). A sweep group runs such a
chain as passes over the rows that compute every op of the chain per element.

A group is a maximal run of consecutive steps (leaves and views made once, at bind,
aside), one op or more, each either
  - an element-wise op of at most two axes with a C template (`op.c`) whose arguments
    are scalar constants, or arrays the generated module binds once or that are fed to
    the call, or values made earlier in the group, that broadcast to it in its dtype (a
    cast's in any dtype it converts from; a broadcast view is read as its source); or
  - an op over live rows that says how it runs in a row loop (`row_phases`, batch
    norm's kernels: ngnn/op_graph/normalization.py), every group member with the same
    live-row count; or
  - a standalone op: a concat, an unslice (zeros with a slice written), a one-hot of
    class ids, or a sum whose order NumPy's call fixes (`sum_order`), over arrays
    complete in memory when it runs.
A group of one op is still worth its C call: the calls of consecutive C steps merge
into one (native segments), so a lone small op between two C calls is one Python
statement and one NumPy call less.
Consecutive ops of one (rows, F) shape form a segment, run as passes over its rows that
compute all its ops per element; segments run one after another (the small (F,) ops
between a layer's batch-norm kernels cost one C call together instead of a NumPy call
each); a standalone op is a segment of its own. The step order is kept, so the memory
plan (made on that order) holds for the group as it does for the ops one by one, given
that a segment reads and writes each element of a (rows, F) value in that order; the
writer checks, when it binds the buffers, that no other overlap exists within a segment.

The views made once (`computation.bind_views`): a reshape, transpose, slice or broadcast
of a variable or planned buffer, or of such a view (a reshape only of a whole buffer or
of a view known C-contiguous: of another it would copy), is the same array at every
call. The pass sets `computation.row_sweeps` (a list of op lists) and `bind_views`; it
rewrites nothing.
"""
import platform
import re

from ..op_graph import Constant, ElementWise, Placeholder, Variable
from ..op_graph.elementwise import Cast
from ..op_graph.layout import Broadcast, Concat, Slice, Unslice
from ..op_graph.normalization import LiveRowsOp
from ..op_graph.reductions import Sum
from ..op_graph.training_ops import Dropout, OneHot
from .base import GraphPass
from .fusion import FusedGroup

FLOATS = ("float32", "float64")
# What a cast in a group converts from (their C types: C's conversion rounds as NumPy's),
# and the class ids a one-hot reads.
CAST_FROM = FLOATS + ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
                      "uint64")
IDS = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
# C functions whose results are exactly rounded, as NumPy's are: a group keeps the NumPy
# transformer's values (exp, log, pow, tanh may differ from NumPy's in the last bit, and
# an Adam step's bias correction, a float32 power, turns that into 1e-9 in the weights).
EXACT_FUNCTIONS = {"sqrt", "fabs", "fmax", "fmin"}
# A dropout joins a group up to this many elements: its C draws a counter's Philox words
# per eight positions, one position after another, about 3.5 times NumPy's time per
# element on large masks (a (1196, 64) one: 560 us, K.dropout 160 us), so only small
# tensors, where NumPy's call costs more than the draw, join (the class scores and their
# gradients: a (33, 2) dropout in a group is 5 us with the group's call).
MAX_DROPOUT_ELEMENTS = 1024


def einsum_vector_bytes():
    """The width of the vectors np.einsum sums with (NumPy's baseline SIMD: its
    einsum_sumprod is not dispatched): 16 bytes on x86-64 builds whose baseline stops at
    x86-64-v2 (SSE), as NumPy's wheels' does; None where it is wider or another machine's
    (the order is not known: einsum sums stay NumPy)."""
    try:
        from numpy._core._multiarray_umath import __cpu_baseline__ as baseline
    except ImportError:     # NumPy 1
        from numpy.core._multiarray_umath import __cpu_baseline__ as baseline
    wide = any(b.startswith(("AVX", "X86_V3", "X86_V4", "FMA")) for b in baseline)
    return 16 if platform.machine().lower() in ("x86_64", "amd64") and not wide else None


EINSUM_VECTOR_BYTES = einsum_vector_bytes()


class RowSweeps(GraphPass):
    def do_pass(self, computation):
        plan = computation.memory_plan
        views = {}          # view made at bind -> (whether C-contiguous, the op it views)
        groups, run = [], []

        def close():
            if run:
                groups.append(list(run))
            run.clear()

        for step in computation.steps:
            if isinstance(step, (Constant, Placeholder, Variable)):
                continue        # leaves run nothing: bound once, or fed
            if isinstance(step, FusedGroup):
                close()
                continue
            if fixed_view(step, plan, views):
                base = step.args[0]
                views[step] = (contiguous_view(step, plan, views),
                               views[base][1] if base in views else base)
                continue
            if row_shape(step) is not None and joins(step, run, plan, views):
                run.append(step)
                continue
            close()
            if row_shape(step) is not None and joins(step, run, plan, views):
                run.append(step)
        close()
        computation.row_sweeps = groups
        computation.bind_views = set(views)


def fixed_view(op, plan, views):
    """Whether `op` is a view of an array made at bind, the same array at every call."""
    if not op.is_view or op.numpy is None or not op.numpy.startswith("{out} = "):
        return False
    base = plan.into_variable.get(op.args[0], op.args[0])
    whole = isinstance(base, Variable) or (base in plan.slots and not base.is_view)
    if op.numpy.startswith("{out} = {x}.reshape("):
        return whole or (op.args[0] in views and views[op.args[0]][0])
    return whole or op.args[0] in views or bound(op.args[0], plan)


def contiguous_view(op, plan, views):
    """Whether a view made at bind is C-contiguous: a reshape (of a whole buffer or a
    contiguous view), or a slice of a contiguous array taking whole rows after its first
    sliced axis."""
    base = op.args[0]
    base_contiguous = views[base][0] if base in views else \
        bound(base, plan) and not base.is_constant
    if op.numpy.startswith("{out} = {x}.reshape("):
        return True
    if not isinstance(op, Slice) or not base_contiguous:
        return False
    sliced = False
    for k, dim in zip(op.key, base.shape):
        if isinstance(k, slice):
            full = range(dim)[k] == range(dim)
            if (sliced and not full) or (k.step not in (None, 1)):
                return False
            sliced = True
        elif sliced:
            return False
    return True


def sum_order(op):
    """The order in which NumPy's call for Sum `op` (Sum.numpy) adds, where the C can
    follow it exactly, else None; each starts from 0 (a sum of -0s is +0, as NumPy's):
      - "lanes": np.einsum over trailing axes: per result, the reduced elements in vectors
        of EINSUM_VECTOR_BYTES, four vectors added pairwise into an accumulator, then the
        rest one vector at a time, then the lanes pairwise (einsum_sumprod's sum_of_arr);
      - "pairwise": np.sum of a contiguous run into one value (a vector, or one column):
        NumPy's pairwise summation (blocks of 8 accumulators up to 128, halves above);
      - "columns": np.sum of a matrix over its rows: each column row after row.
    `tests/test_native.py` checks each against NumPy on many lengths."""
    if not isinstance(op, Sum) or op.dtype.name not in FLOATS:
        return None
    x = op.args[0]
    if op.numpy.startswith("np.einsum("):
        return "lanes" if EINSUM_VECTOR_BYTES else None
    if op.axes == (0,) and (x.ndim == 1 or (x.ndim == 2 and x.shape[1] == 1)):
        return "pairwise"
    if op.axes == (0,) and x.ndim == 2:
        return "columns"
    return None


def standalone(op):
    """Whether `op` runs in a sweep group as a segment of its own: a loop of its own over
    arrays complete in memory (its own rendering in native_sweeps.py). A one-hot of
    (N,) class ids checks them there: one outside [0, C) makes the group run its NumPy
    statements, whose K.one_hot raises the error that names it. An unslice of a whole
    tensor only in order (it may run in place: reversed, it would read what it wrote)."""
    if isinstance(op, Unslice):
        return op.args[0].shape != op.shape or \
            all(k == slice(0, n, 1) for k, n in zip(op.key, op.shape))
    return isinstance(op, Concat) or sum_order(op) is not None or \
        (isinstance(op, OneHot) and op.ndim == 2 and op.args[0].dtype.name in IDS)


def row_shape(op):
    """The (rows, F) an op runs over in a sweep, or None where it cannot join one (a
    standalone op's is (1, its size))."""
    if standalone(op):
        return (1, op.size)
    if isinstance(op, LiveRowsOp) and op.row_phases:
        rows = op.args[op.row_args.index("x" if "x" in op.row_args else "delta")]
        # Two rows would read as batch norm's (2, F) statistics.
        return rows.shape if rows.ndim == 2 and rows.shape[0] != 2 else None
    if isinstance(op, Dropout):
        # Its mask is Philox's of (seed, call number, row-major position): the C computes
        # the same words (native_sweeps.py), keyed rows (`rows=`) aside.
        return (1,) * (2 - op.ndim) + op.shape if op.rows is None and op.ndim <= 2 and \
            op.size <= MAX_DROPOUT_ELEMENTS else None
    if isinstance(op, ElementWise) and op.c is not None and not op.is_view and \
            op.ndim <= 2 and set(re.findall(r"\b(\w+)\(", op.c)) <= EXACT_FUNCTIONS:
        return (1,) * (2 - op.ndim) + op.shape
    return None


def broadcast_source(a):
    """What an element-wise op of a group reads for its argument `a`: a broadcast's source
    (read broadcast, as the group reads any argument of fewer elements), else `a`."""
    while isinstance(a, Broadcast):
        a = a.args[0]
    return a


def bound(op, plan):
    """Whether the generated module makes `op`'s array when it binds its buffers."""
    op = plan.into_variable.get(op, op)
    return isinstance(op, Variable) or op in plan.slots or \
        (isinstance(op, Constant) and op.value.ndim > 0)


def segment_of(op, run):
    """The ops of `run` in the segment `op` would join: the trailing ops of its shape
    (none for a standalone op, or after one)."""
    segment = []
    for member in reversed(run):
        if standalone(op) or standalone(member) or row_shape(member) != row_shape(op):
            break
        segment.append(member)
    return set(segment)


def joins(op, run, plan, views):
    """Whether `op` can run in the sweep group `run` (its ops before it)."""
    if op.dtype.name not in FLOATS or not bound(op, plan) or \
            (run and op.dtype != run[0].dtype):      # one C type a group
        return False
    rows, features = row_shape(op)
    made, segment = set(run), segment_of(op, run)

    def readable(a):
        """Complete in memory when `op` runs, C-contiguous: bound at bind, fed (its
        address taken at the call, where it is C-contiguous), made by an earlier segment
        of the group, or a contiguous view of either (a view of a value of op's own
        segment would read elements its passes have not made yet)."""
        if a in views:
            contiguous, base = views[a]
            return contiguous and base not in segment
        return bound(a, plan) or isinstance(a, Placeholder) or \
            (a in made and a not in segment)

    if isinstance(op, OneHot):
        return readable(op.args[0])
    if standalone(op):
        return all(a.dtype == op.dtype and readable(a) for a in op.args)
    if isinstance(op, LiveRowsOp):
        live = op.live
        lives = {r.live for r in run if isinstance(r, LiveRowsOp)}
        if lives and lives != {live}:
            return False
        if live is not None and (live.dtype != op.dtype or live.size < 1 or
                                 not bound(live, plan) or live in segment):
            return False
        shapes = {(rows, features), (2, features), (features,)}
        return all(a.dtype == op.dtype and a.shape in shapes and (a in segment or readable(a))
                   for a in op.args[:op.fixed_args])
    for a in map(broadcast_source, op.args):
        if a.is_constant and a.value.ndim == 0:
            continue
        if a.dtype != op.dtype and not (isinstance(op, Cast) and a.dtype.name in CAST_FROM):
            return False
        if a in segment:
            if a.shape != op.shape:
                return False
        elif not (readable(a) and a.ndim <= op.ndim and
                  all(d in (1, o) for d, o in zip(a.shape[::-1], op.shape[::-1]))):
            return False
    return True
