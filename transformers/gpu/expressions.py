"""C expressions for op values at symbolic coordinates: seed 000's broadcast index propagation.

A kernel asks for the value of an op at coordinates given as C expressions (its own loop
indices). A stored op is loaded from its buffer at the row-major offset of those
coordinates; an op planned inline is computed from its arguments, each asked for at the
coordinates that map onto it (broadcast axes read index 0, a transpose permutes, a slice
scales and shifts, a gather reads the edge's end vertex, a reshape goes through the flat
offset). Values already computed at the same coordinates in the block are reused.
"""
import re

import numpy as np

from ngnn import philox
from ngnn.naming import Namer, value_identifier
from ngnn.op_graph import (Aggregate, Broadcast, Cast, Constant, Dropout, EdgeSoftmax,
                           ElementWise, Gather, OneHot, Reduction, Reshape, Slice,
                           Transpose)
from ngnn.op_graph.combiners import COMBINERS
from ngnn.op_graph.printer import IRNames, op_comment

from .schedule import edge_schedule

CTYPES = {"float32": "float", "float64": "double", "int8": "char", "int16": "short",
          "int32": "int", "int64": "long", "uint8": "uchar", "uint16": "ushort",
          "uint32": "uint", "uint64": "ulong", "bool": "uchar"}
_FLOAT_SUFFIX = re.compile(r"(?<![\w.])(\d+\.\d*(?:[eE][-+]?\d+)?|\d+[eE][-+]?\d+)f\b")


def ctype(dtype):
    dtype = np.dtype(dtype)
    if dtype.name not in CTYPES:
        raise TypeError(f"the GPU transformer does not support dtype {dtype}")
    return CTYPES[dtype.name]


def literal(value, dtype):
    """`value` as C source of type `dtype`; a float in its dtype's shortest digits that
    read back as the same value (`0.2f`, not `0.20000000298023224f`), as the IR prints it."""
    dtype = np.dtype(dtype)
    exact = np.asarray(value, dtype=dtype)[()]
    value = exact.item()
    if dtype.kind == "f":
        single = dtype == np.float32
        if np.isnan(value):
            return "UINT_AS_FLOAT(0x7fc00000u)" if single else "(0.0 / 0.0)"
        if np.isinf(value):
            sign = "-" if value < 0 else ""
            return (f"UINT_AS_FLOAT(0x{'ff' if sign else '7f'}800000u)" if single
                    else f"({sign}1.0 / 0.0)")
        text = str(exact)       # NumPy's shortest round-trip digits for the dtype
        return f"{text}f" if single else text
    if dtype.kind == "b":
        return "1" if value else "0"
    suffix = {"int64": "L", "uint64": "UL", "uint32": "u"}.get(dtype.name, "")
    if dtype.name == "int64" and value == np.iinfo(np.int64).min:
        return "(-9223372036854775807L - 1L)"
    return f"{value}{suffix}"


def attribute_literals(op):
    """An element-wise op's numeric attributes as C literals, for its `c` template."""
    values = {a.field: getattr(op, a.field) for a in op.attributes}
    real = op.dtype if op.dtype.kind == "f" else np.float32
    return {name: literal(v, real if isinstance(v, float) else np.int64)
            for name, v in values.items() if isinstance(v, (int, float))}


def operand(expr):
    """`expr` as an operand of a template's operators: bare where it is one token (a
    variable, a literal), else parenthesized (a negative literal after a unary minus)."""
    return expr if re.fullmatch(r"\w[\w.]*(?:[eE][-+]\d+f?)?", expr) else f"({expr})"


def converted(expr, dtype, to):
    """C for `expr`, a value of `dtype`, as a value of `to`: cast only where their C types
    differ."""
    t = ctype(to)
    return operand(expr) if ctype(dtype) == t else f"(({t}){expr})"


def unwrapped(expr):
    """`expr` without the parentheses around all of it, if it has them."""
    if not expr.startswith("("):
        return expr
    depth = 0
    for i, c in enumerate(expr):
        depth += {"(": 1, ")": -1}.get(c, 0)
        if depth == 0:
            return expr[1:-1] if i == len(expr) - 1 else expr
    return expr


def extreme(dtype, largest):
    """The identity of max (largest=False) or min (largest=True) reductions in `dtype`."""
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        return literal(np.inf if largest else -np.inf, dtype)
    info = np.iinfo(dtype) if dtype.kind in "iu" else np.iinfo(np.uint8)
    return literal(info.max if largest else info.min, dtype)


def keeps_nan(x, better, acc):
    """C for the better of `x` and `acc` by `better` (">" or "<"), NaN winning as in NumPy's
    maximum and minimum (a bare comparison would drop a NaN `x`)."""
    return f"((({x} {better} {acc}) | ({x} != {x})) ? {x} : {acc})"


def in_precision(expr, dtype):
    """Op templates write float literals (1.0f); in double kernels they must be double."""
    return _FLOAT_SUFFIX.sub(r"\1", expr) if np.dtype(dtype) == np.float64 else expr


def strides(shape):
    out, step = [], 1
    for dim in reversed(shape):
        out.append(step)
        step *= max(dim, 1)
    return list(reversed(out))


def flat_index(coords, shape):
    """Row-major offset of `coords` in a contiguous tensor of `shape`."""
    terms = []
    for c, dim, stride in zip(coords, shape, strides(shape)):
        if dim == 1 or c == "0":
            continue
        terms.append(f"({c})" if stride == 1 else f"({c}) * {stride}")
    return " + ".join(terms) or "0"


def unravel(flat, shape):
    """Coordinates in `shape` of row-major offset `flat` (a C variable name)."""
    coords = []
    for i, (dim, stride) in enumerate(zip(shape, strides(shape))):
        if dim == 1:
            coords.append("0")
            continue
        c = flat if stride == 1 else f"{flat} / {stride}"
        coords.append(c if i == 0 else f"({c}) % {dim}")
    return coords


def broadcast_coords(coords, arg_shape, shape):
    """Coordinates in an argument broadcast (NumPy rules) to `shape`."""
    lead = len(shape) - len(arg_shape)
    return ["0" if dim == 1 else coords[lead + i] for i, dim in enumerate(arg_shape)]


class ReadAcrossWorkGroups(Exception):
    """An output of a kernel is read where another work-group may write it: the outputs
    need kernels of their own."""


class KernelParams:
    """The parameters one kernel needs: stored tensors it reads, graph index arrays, and
    whether it needs the call number (`step`, for dropout masks).

    A value keeps the IR's name: `%8` is the C parameter `t_8` (ngnn.naming's
    value_identifier; `names` is the computation's IRNames), and each statement computing
    an op is commented with the IR's statement of it (`comment`)."""

    def __init__(self, plan, computed, names=None, recomputed=()):
        self.plan = plan
        self.computed = computed  # ops this kernel computes in registers
        self.names = names if names is not None else IRNames()
        self.recomputed = set(recomputed)   # ops the IR marks recomputed in this group
        self.commented = set()    # ops a statement of this kernel has computed
        # Its own names (graph_*, sparse_*, partials) never start with a value's `t_`.
        self.namer = Namer()
        self.tensors = {}         # base op -> C name
        self.graph_arrays = {}    # (graph, attribute) -> C name
        self.sparse_arrays = {}   # (sparse placeholder, part) -> C name
        self.scratch = {}         # ChunkPartials -> C name
        self.partial_kernels = None   # the generator's: (EdgeReduction, params) -> ChunkPartials
        self.partial_computed = computed  # what this kernel's partial kernels compute
        self.written = {}         # op -> C name of its output, for a kernel of several outputs
        self.layout = {}          # edge value -> (graph, "dst"/"src"): the CSR it is stored in
        self.edge_inputs = set()  # stored inputs read at the edges of an edge loop
        self.own_edges = {}       # edge output this kernel wrote before -> (graph, at) walked
        self.vertex = None        # the vertex of the output element being computed
        self.uses_step = False
        self.uses_double = False
        self.counter = 0

    def tensor(self, op):
        base = self.plan.base(op)
        if base in self.written:
            return self.written[base]
        if base not in self.tensors:
            self.tensors[base] = self.identifier(base)
        return self.tensors[base]

    def identifier(self, op):
        """The C name of value `op`: `t_8` for the IR's `%8` (prefixed, so no value's name
        shadows a C function such as exp, or a name of the generator's own)."""
        return value_identifier(self.names[op])

    def comment(self, op):
        """The comment ending each statement that computes `op`: the IR's statement
        (`// %8 = divide(%6, %7)`), marked recomputed where the IR marks it or where an
        earlier statement of this kernel computed it already. Asked once per computation
        of `op`, for all its statements."""
        again = op in self.recomputed or op in self.commented
        self.commented.add(op)
        return f"// {op_comment(op, self.names)}" + ("  // recomputed" if again else "")

    def is_stored(self, op):
        return op not in self.computed

    def check_read(self, op, vertex):
        """A kernel of several outputs reads one it wrote earlier (after a barrier) only at
        the vertex of the element it computes, which its own work-group wrote."""
        base = self.plan.base(op)
        if base in self.written and base not in self.own_edges and \
                (op is not base or vertex != self.vertex):
            raise ReadAcrossWorkGroups(op)

    def graph_array(self, graph, attribute):
        key = (graph, attribute)
        if key not in self.graph_arrays:
            self.graph_arrays[key] = self.namer(f"graph_{attribute}")
        return self.graph_arrays[key]

    def sparse_array(self, placeholder, part):
        """One array of a sparse placeholder's CSR and CSC forms (SparseInput.PARTS)."""
        key = (placeholder, part)
        if key not in self.sparse_arrays:
            self.sparse_arrays[key] = self.namer(f"sparse_{part}")
        return self.sparse_arrays[key]

    def partials(self, reduction):
        """The C name of the partials of `reduction` over the heavy rows' chunks, which a
        partial kernel launched before this kernel writes."""
        buffer = self.partial_kernels(reduction, self)
        if buffer not in self.scratch:
            self.scratch[buffer] = self.namer("partials")
        return self.scratch[buffer]

    def fresh(self, prefix="v"):
        self.counter += 1
        return f"{prefix}{self.counter}"

    def note_dtype(self, dtype):
        if np.dtype(dtype) == np.float64:
            self.uses_double = True


class Block:
    """The statements of one C block; values of an enclosing block stay visible."""

    def __init__(self, params, parent=None, indent="    "):
        self.params = params
        self.parent = parent
        self.indent = indent
        self.lines = []
        self.cache = {}
        self.loop = None          # (edge id, graph, end, vertex, hoisting block) of a loop body
        self.slot = None          # the CSR slot variable of that loop (its edge is eids[slot])
        self.counter = None       # the variable of a counted loop whose body this is
        self.reducing = None      # (EdgeReduction, its accumulator) of an edge loop body

    def child(self):
        return Block(self.params, self, self.indent + "    ")

    def nest(self, child):
        self.lines.extend("    " + line for line in child.lines)

    def _loop_of(self, eid):
        """The enclosing edge loop whose edge id variable is `eid`, if any."""
        block = self._loop_block(eid)
        return block.loop if block else None

    def _loop_block(self, eid):
        block = self
        while block is not None:
            if block.loop is not None and block.loop[0] == eid:
                return block
            block = block.parent
        return None

    def _online_reduction(self, spread, eid):
        """(OnlineSoftmaxSum, accumulator) of the enclosing edge loop over `eid` when
        `spread` is the gather of the log-sum-exp its weights are taken against."""
        block = self._loop_block(eid)
        if block is None or block.reducing is None:
            return None
        reduction = block.reducing[0]
        if not isinstance(reduction, OnlineSoftmaxSum) or reduction.match.spread is not spread:
            return None
        if block is not self:
            raise AssertionError(f"{spread} read in a loop inside its one-pass softmax's "
                                 "edge loop")
        return block.reducing

    def rewalks_own_edges(self, op, coords):
        """Whether an edge output this kernel wrote earlier is read where its work-group
        did not write it: it is read back inside a loop over the element's own vertex's
        edges in the CSR the kernel walks (a light row's edges, written by this
        work-group before a barrier), and computed again anywhere else."""
        walk = self.params.own_edges.get(op)
        if walk is None:
            return False
        loop = self._loop_of(coords[0])
        return not (loop and (loop[1], loop[2]) == walk and loop[3] == self.params.vertex)

    def edge_row(self, op, eid):
        """The row of stored edge value `op` holding edge `eid`: the edge id, or, for a
        value stored in loop order (KernelParams.layout), the slot of the enclosing loop
        over the same CSR, or that slot's position in the CSR it is stored in order of."""
        order = self.params.layout.get(self.params.plan.base(op))
        if order is None:
            return eid
        graph, order = order
        block = self._loop_block(eid)
        if block is None or block.loop[1] is not graph:
            raise AssertionError(f"{op} is stored in loop order but read outside a loop "
                                 "over its graph's edges")
        at = block.loop[2]
        if at == order:
            return block.slot
        perm = self.params.graph_array(block.loop[1], "in_to_out" if at == "dst"
                                       else "out_to_in")
        return f"{perm}[{block.slot}]"

    def hoistable(self, loop, coords, counters=True):
        """May a value at `coords` be computed before `loop`, the enclosing edge loop? Not
        when a coordinate reads the edge id or (unless `counters` is False) a counter of
        a loop inside it."""
        inner = {loop[0]}
        block = self
        while counters and block is not None and block.loop is not loop:
            if block.counter:
                inner.add(block.counter)
            block = block.parent
        return not any(re.search(rf"\b{v}\b", c) for v in inner for c in coords)

    def walks_edges(self, op):
        """Does computing `op` inline walk a vertex's edges (an aggregation or an edge
        softmax among the ops this kernel computes for it)?"""
        stack, seen = [op], set()
        while stack:
            x = stack.pop()
            if x in seen or self.params.is_stored(x):
                continue
            seen.add(x)
            if isinstance(x, (Aggregate, EdgeSoftmax)):
                return True
            stack.extend(x.args)
        return False

    def vertex_row_steps(self, loop, x, rest):
        """Per-vertex value `x` at the loop's vertex and feature coordinates `rest` that
        read a counter of a loop inside the edge loop (a per-head value in a sum over the
        heads): the vertex's whole row is computed once, before the edge loop, into a
        private array, which the body reads at `rest`. Computing it where it is read
        would walk the vertex's edges again for every edge: work quadratic in degree."""
        pre, vertex = loop[4], loop[3]
        features = x.shape[1:]
        key = ("vertex row", x, vertex)
        row = pre._lookup(key)
        if row is None:
            size = int(np.prod(features, dtype=np.int64))
            row, i = self.params.fresh("row"), self.params.fresh("i")
            self.params.note_dtype(x.dtype)
            body = pre.child()
            body.counter = i
            value = yield body.value_steps(x, (vertex,) + tuple(unravel(i, features)))
            body.emit(f"{row}[{i}] = {value};")
            pre.emit(f"{ctype(x.dtype)} {row}[{max(size, 1)}];  "
                     f"// the row of {self.params.names[x]} at the loop's vertex")
            pre.emit(f"for (int {i} = 0; {i} < {size}; ++{i}) {{")
            pre.nest(body)
            pre.emit("}")
            pre.cache[key] = row
        return self.declare(x.dtype, f"{row}[{flat_index(rest, features)}]")

    def edge_loop(self, graph, at, vertex, pre=None):
        """Opens a loop over the edges of `vertex` (its in-edges for at="dst"): returns the
        loop body block, its edge id variable and a function that closes the loop. Values
        the body asks to hoist go to `pre`, a block emitted just before the loop."""
        prefix = "in" if at == "dst" else "out"
        indptr = self.params.graph_array(graph, f"{prefix}_indptr")
        pre = pre or self
        start = pre.declare(np.int32, f"{indptr}[{vertex}]", "start")
        end = pre.declare(np.int32, f"{indptr}[{vertex} + 1]", "end")
        k = self.params.fresh("k")
        body = Block(self.params, pre, self.indent + "    ")
        eid = self.params.fresh("eid")
        body.loop = (eid, graph, at, vertex, pre)
        body.slot = k
        header = f"for (int {k} = {start}; {k} < {end}; ++{k}) {{"

        def close(heavy=None):
            """Emits the loop; `heavy` = (condition, statements) runs those instead of it
            where the condition holds (a heavy row folds its chunks' partials). The edge
            id is loaded only where the body reads it."""
            if any(re.search(rf"\b{eid}\b", line) for line in body.lines):
                eids = self.params.graph_array(graph, f"{prefix}_eids")
                body.lines.insert(0, f"int {eid} = {eids}[{k}];")
            if pre is not self:
                self.lines.extend(pre.lines)
                self.cache.update(pre.cache)
            if heavy:
                condition, statements = heavy
                self.emit(f"if ({condition}) {{")
                self.lines.extend("    " + line for line in statements)
                self.emit("} else {")
                self.lines.extend("    " + line for line in
                                  [header] + ["    " + b for b in body.lines] + ["}"])
                self.emit("}")
                return
            self.emit(header)
            self.nest(body)
            self.emit("}")
        return body, eid, (start, end), close

    def text(self):
        return "\n".join(self.indent + line for line in self.lines)

    def emit(self, line):
        self.lines.append(line)

    def declare(self, dtype, expr, prefix="v", comment=None):
        """A new variable of `dtype` holding `expr`; `comment` (KernelParams.comment) says
        which op the statement computes."""
        name = self.params.fresh(prefix)
        self.params.note_dtype(dtype)
        self.emit(f"{ctype(dtype)} {name} = {expr};" + (f"  {comment}" if comment else ""))
        return name

    def _lookup(self, key):
        block = self
        while block is not None:
            if key in block.cache:
                return block.cache[key]
            block = block.parent
        return None

    # ---- values -------------------------------------------------------------------------
    # The methods below are generators run by `evaluate`: asking for an argument's value is
    # `x = yield self.value_steps(arg, coords)`, so a chain of thousands of ops costs a list
    # of pending generators, not Python's recursion limit.
    def value(self, op, coords):
        """A C expression for `op` at `coords` (one C expression per axis)."""
        return evaluate(self.value_steps(op, coords))

    def compute(self, op, coords):
        """`op` at `coords` from its arguments (the op is planned inline)."""
        return evaluate(self.compute_steps(op, coords))

    def value_steps(self, op, coords):
        coords = tuple(str(c) for c in coords)
        key = (op, coords)
        found = self._lookup(key)
        if found is None:
            if isinstance(op, Constant) and op.is_scalar:
                found = literal(op.value, op.dtype)
            elif self.params.is_stored(op) and not self.rewalks_own_edges(op, coords):
                self.params.check_read(op, coords[0] if coords else None)
                if coords and self._loop_block(coords[0]) is not None:
                    self.params.edge_inputs.add(self.params.plan.base(op))
                    coords = (self.edge_row(op, coords[0]),) + coords[1:]
                found = self.load(op, flat_index(coords, op.shape))
            else:
                found = yield self.compute_steps(op, coords)
            self.cache[key] = found
        return found

    def value_at_flat_steps(self, op, flat):
        """`op` at row-major offset `flat`: a stored op is loaded there directly."""
        if self.params.is_stored(op) and not (isinstance(op, Constant) and op.is_scalar):
            self.params.check_read(op, None)
            if self.params.plan.base(op) in self.params.layout:
                raise AssertionError(f"{op} is stored in loop order but read at a flat offset")
            return self.load(op, flat)
        var = self.declare(np.int32, flat, "i")
        return (yield self.value_steps(op, unravel(var, op.shape)))

    def reshaped_steps(self, op, coords):
        """A reshape's argument at the coordinates `coords` map to. Leading axes the two
        shapes share keep their coordinates (row-major order: the rest's offset does not
        depend on them), so an edge or vertex index reaches the argument as the same
        variable and a gather by a loop's own end is still seen as the loop's vertex;
        only the remaining axes go through a flat offset."""
        (x,) = op.args
        shared = 0
        while shared < min(x.ndim, op.ndim) - 1 and x.shape[shared] == op.shape[shared]:
            shared += 1
        # A value stored in loop order is found by its edge's row, not a flat offset.
        ordered = self.params.plan.base(x) in self.params.layout
        if shared == 0 or (self.params.is_stored(x) and not ordered):
            return (yield self.value_at_flat_steps(x, flat_index(coords, op.shape)))
        flat = flat_index(coords[shared:], op.shape[shared:])
        rest = x.shape[shared:]
        # Inlined, not declared: a value hoisted out of an edge loop may need these.
        inner = unravel(flat if flat == "0" else f"({flat})", rest)
        return (yield self.value_steps(x, tuple(coords[:shared]) + tuple(inner)))

    def load(self, op, flat):
        return self.declare(op.dtype, f"{self.params.tensor(op)}[{flat}]")

    def compute_steps(self, op, coords):
        coords = tuple(str(c) for c in coords)
        if isinstance(op, Cast):
            (x,) = op.args
            value = yield self.value_steps(x, coords)
            if op.dtype == np.bool_:
                return self.declare(op.dtype, f"{operand(value)} != 0",
                                    comment=self.params.comment(op))
            return self.declare(op.dtype, converted(value, x.dtype, op.dtype),
                                comment=self.params.comment(op))
        if isinstance(op, Dropout):
            x = yield self.value_steps(op.args[0], coords)
            return self.dropout(op, x, self.mask_position(op, coords))
        if isinstance(op, ElementWise):
            t = ctype(op.dtype)
            fields = attribute_literals(op)
            for name, a in zip(("x", "y"), op.args):
                arg = yield self.value_steps(a, broadcast_coords(coords, a.shape, op.shape))
                fields[name] = converted(arg, a.dtype, op.dtype)
            expr = in_precision(op.c.format(out_ctype=t, **fields), op.dtype)
            return self.declare(op.dtype, unwrapped(expr), comment=self.params.comment(op))
        if isinstance(op, Broadcast):
            (x,) = op.args
            return (yield self.value_steps(x, broadcast_coords(coords, x.shape, op.shape)))
        if isinstance(op, Transpose):
            arg_coords = [None] * op.ndim
            for i, axis in enumerate(op.axes):
                arg_coords[axis] = coords[i]
            return (yield self.value_steps(op.args[0], arg_coords))
        if isinstance(op, Slice):
            out = iter(coords)
            arg_coords = []
            for k in op.key:
                if isinstance(k, int):
                    arg_coords.append(str(k))
                else:
                    c = next(out)
                    arg_coords.append(c if (k.start, k.step) == (0, 1)
                                      else f"{k.start} + ({k.step}) * ({c})")
            return (yield self.value_steps(op.args[0], arg_coords))
        if isinstance(op, Reshape):
            return (yield self.reshaped_steps(op, coords))
        if isinstance(op, Gather):
            (x,) = op.args
            online = self._online_reduction(op, coords[0])
            if online is not None:
                # In a one-pass softmax's loop the weight is taken against the running
                # max, which this edge may raise (OnlineSoftmaxSum).
                reduction, acc = online
                return (yield reduction.running_max_steps(self, acc, coords))
            loop = self._loop_of(coords[0])
            if loop and loop[1] is op.graph and loop[2] == op.by:
                # Inside a loop over this vertex's edges: the gathered value is the
                # vertex's own, computed once before the loop.
                if self.hoistable(loop, coords[1:]):
                    return (yield loop[4].value_steps(x, (loop[3],) + coords[1:]))
                if self.hoistable(loop, coords[1:], counters=False) and \
                        self.walks_edges(x):
                    return (yield self.vertex_row_steps(loop, x, coords[1:]))
            vertex = self.end_vertex(op.graph, op.by, coords[0])
            return (yield self.value_steps(x, (vertex,) + coords[1:]))
        if isinstance(op, Reduction):
            return (yield self.reduction_steps(op, coords))
        if isinstance(op, Aggregate):
            return (yield self.aggregate_steps(op, coords))
        if isinstance(op, EdgeSoftmax):
            return (yield self.edge_softmax_steps(op, coords))
        if isinstance(op, OneHot):
            label = yield self.value_steps(op.args[0], coords[:-1])
            return self.declare(op.dtype, f"({label} == ({coords[-1]})) ? "
                                f"{literal(1, op.dtype)} : {literal(0, op.dtype)}",
                                comment=self.params.comment(op))
        raise TypeError(f"the GPU transformer cannot compute {type(op).__name__} inline")

    def end_vertex(self, graph, end, eid):
        """The source or destination vertex of edge `eid`, loaded once per block: inside a
        loop over the graph's CSR the loop's vertex, or the other end from the CSR's own
        array of ends (in_src, out_dst) at the loop's slot, without the edge id."""
        key = ("vertex", graph, end, eid)
        found = self._lookup(key)
        if found is None:
            block = self._loop_block(eid)
            if block is not None and block.loop[1] is graph and block.slot is not None:
                if block.loop[2] == end:
                    return block.loop[3]
                ends = self.params.graph_array(graph, "in_src" if end == "src" else "out_dst")
                found = self.cache[key] = self.declare(np.int32, f"{ends}[{block.slot}]", "n")
                return found
            ends = self.params.graph_array(graph, end)
            found = self.cache[key] = self.declare(np.int32, f"{ends}[{eid}]", "n")
        return found

    def aggregate_steps(self, op, coords):
        """seed 000's aggInit / aggCompute / aggWrite: a loop over the vertex's edges with
        the edge values computed in registers (edgeCompute)."""
        plan = self.params.plan
        online = plan.online_softmax.get(op)
        reduction = OnlineSoftmaxSum(online) if online else EdgeReduction.of_aggregate(op)
        statistics = plan.online_statistics.get(op)
        if statistics is not None:
            # The softmax's max or sum of exponentials: from the walk of its weighted sum.
            reduction = OnlineSoftmaxSum(statistics)
            rest = statistics.coords_of_statistics(coords)[1:]
            yield self.edge_reduction_steps(reduction, coords[0], rest)
            acc, start, end, running = self._lookup(("edge reduction state", reduction.key,
                                                     coords[0], tuple(rest)))
            if running:
                part = "m" if op is statistics.peak else "s"
                return self.declare(op.dtype, f"{end} > {start} ? {acc}_{part} : "
                                    f"{literal(0, op.dtype)}", comment=self.params.comment(op))
            reduction = EdgeReduction.of_aggregate(op)      # that walk read the weight
        return (yield self.edge_reduction_steps(reduction, coords[0], coords[1:]))

    def edge_reduction_steps(self, reduction, vertex, rest, comment=None):
        """`reduction` (an EdgeReduction) of `vertex`'s edges at feature coordinates
        `rest`: a loop over the edges, or, for a heavy row of the graph's schedule, a fold
        of its chunks' partials in chunk order (computed by a partial kernel before this
        one). Computed once per block and coordinates; its statements end with `comment`,
        by default the comment of the op it reduces for."""
        key = ("edge reduction", reduction.key, vertex, tuple(rest))
        found = self._lookup(key)
        if found is not None:
            return found
        comment = comment or self.params.comment(reduction.key[0])
        t = ctype(reduction.dtype)
        acc = self.params.fresh("acc")
        pre = Block(self.params, self, self.indent)
        self.params.note_dtype(reduction.dtype)
        pre.lines.extend(f"{line}  {comment}" for line in reduction.declare(acc))
        body, eid, (start, end), close = self.edge_loop(reduction.graph, reduction.at,
                                                        vertex, pre)
        body.reducing = (reduction, acc)
        value = yield reduction.edge_steps(body, eid, vertex, rest)
        body.emit(f"{reduction.fold(acc, converted(value, reduction.edge_dtype, reduction.dtype))}"
                  f"  {comment}")
        heavy = None
        schedule = edge_schedule(reduction.graph, reduction.at)
        if schedule.has_heavy_rows:
            # The partial kernel left the row's value, its partials folded in chunk
            # order, in the row's first chunk.
            partials = self.params.partials(reduction)
            row_chunks = self.params.graph_array(schedule, "row_chunks")
            feature = flat_index(rest, reduction.features)
            heavy = (f"{row_chunks}[{vertex} + 1] > {row_chunks}[{vertex}]",
                     [f"{line}  {comment}" for line in reduction.load(
                         acc, partials, f"{row_chunks}[{vertex}]", feature)])
        close(heavy)
        final = reduction.result(acc, f"({t})({end} - {start})")
        result = self.declare(reduction.dtype,
                              f"{end} > {start} ? {final} : {literal(0, reduction.dtype)}",
                              comment=comment)
        self.cache[key] = result
        self.cache[("edge reduction state",) + key[1:]] = \
            (acc, start, end, acc in getattr(reduction, "running", ()))
        return result

    def reduction_steps(self, op, coords):
        """A row-wise reduction in registers: a loop over the reduced coordinates (the
        per-head sums of a fused group)."""
        (x,) = op.args
        t = ctype(op.dtype)
        reduced = [x.shape[a] for a in op.axes]
        count = int(np.prod(reduced, dtype=np.int64))
        kept = iter(c for i, c in enumerate(coords) if not (op.keepdims and i in op.axes))
        r = self.params.fresh("r")
        reduced_coords = iter(unravel(r, reduced))
        x_coords = [next(reduced_coords) if i in op.axes else next(kept)
                    for i in range(x.ndim)]
        acc = self.params.fresh("acc")
        self.params.note_dtype(op.dtype)
        comment = self.params.comment(op)
        combiner = op.combiner
        self.emit(f"{t} {acc} = {literal(combiner.identity_in(op.dtype), op.dtype)};  "
                  f"{comment}")
        body = self.child()
        body.counter = r
        value = converted((yield body.value_steps(x, x_coords)), x.dtype, op.dtype)
        body.emit(f"{combiner.c_fold.format(acc=acc, x=value)}  {comment}")
        self.emit(f"for (int {r} = 0; {r} < {count}; ++{r}) {{")
        self.nest(body)
        self.emit("}")
        if not count:       # every kind gives 0 over nothing, as NumPy's transformer does
            return literal(0, op.dtype)
        if combiner.divides:
            return self.declare(op.dtype, f"{acc} / {literal(count, op.dtype)}",
                                comment=comment)
        return acc

    def edge_softmax_steps(self, op, coords):
        """exp(x - max) / sum over the edges of the edge's vertex. Inside a loop over the
        same vertex's edges the max and sum are computed once, before that loop."""
        eid, rest = coords[0], coords[1:]
        loop = self._loop_of(eid)
        if loop and loop[1] is op.graph and loop[2] == op.at and self.hoistable(loop, rest):
            vertex, outer = loop[3], loop[4]
        else:
            vertex, outer = self.end_vertex(op.graph, op.at, eid), self
        comment = self.params.comment(op)
        peak, total = EdgeReduction.softmax_statistics(op)
        top = yield outer.edge_reduction_steps(peak, vertex, rest, comment)
        sum_ = yield outer.edge_reduction_steps(total, vertex, rest, comment)
        x = yield self.value_steps(op.args[0], coords)
        return self.declare(op.dtype, f"exp({converted(x, op.args[0].dtype, op.dtype)} - "
                            f"{top}) / {converted(sum_, total.dtype, op.dtype)}",
                            comment=comment)

    def mask_position(self, op, coords):
        """The element's dropout position: row-major, or for a dropout keyed by row ids
        (Dropout.rows) the row's id times the row length plus the offset within the row."""
        if op.rows is None:
            return flat_index(coords, op.shape)
        graph, attribute = op.rows
        width = int(np.prod(op.shape[1:], dtype=np.int64))
        row = f"{self.params.graph_array(graph, attribute)}[{coords[0]}]"
        return f"(ulong){row} * {width}UL + (ulong)({flat_index(coords[1:], op.shape[1:])})"

    def dropout(self, op, x, flat):
        """x * keep / (1 - rate) at row-major position `flat` of call `step`, keep drawn by
        Philox4x64 exactly as ngnn.philox draws it for the NumPy transformer (and with its
        arithmetic: x times the scale, then times 0 or 1)."""
        self.params.uses_step = True
        comment = self.params.comment(op)
        keep = self.declare(np.int32, f"philox_word({op.seed}UL, (ulong)({flat}), "
                            f"(ulong)step) >= {philox.keep_threshold(op.rate)}u", "keep",
                            comment)
        t = ctype(op.dtype)
        scaled = f"({converted(x, op.args[0].dtype, op.dtype)} * " \
            f"{literal(philox.keep_scale(op.rate, op.dtype), op.dtype)})"
        return self.declare(op.dtype, f"{scaled} * ({t}){keep}", comment=comment)


class EdgeReduction:
    """A reduction over each vertex's edges, computed inline: `key` names it (one partial
    kernel per key), `edge_steps(body, eid, vertex, rest)` is the steps computing the
    edge's value inside a loop `body` over `vertex`'s edges, at feature coordinates `rest`
    of `features`, in `edge_dtype` (by default `dtype`), folded in `dtype` by the rules of
    its kind's row of the reduction table (start, fold, finish)."""

    def __init__(self, key, graph, at, reduce, dtype, features, edge_steps, edge_dtype=None):
        self.key, self.graph, self.at, self.reduce = key, graph, at, reduce
        self.dtype, self.features, self.edge_steps = np.dtype(dtype), tuple(features), edge_steps
        # The dtype of the values edge_steps gives, which a fold converts where it differs.
        self.edge_dtype = self.dtype if edge_dtype is None else np.dtype(edge_dtype)
        self.size = int(np.prod(self.features, dtype=np.int64))

    @classmethod
    def of_aggregate(cls, op):
        def edge_steps(body, eid, vertex, rest):
            return (yield body.value_steps(op.args[0], (eid,) + tuple(rest)))
        return cls((op,), op.graph, op.at, op.reduce, op.dtype, op.shape[1:], edge_steps,
                   op.args[0].dtype)

    @classmethod
    def softmax_statistics(cls, op):
        """An edge softmax's per-vertex max and sum of exp(x - max) (in double, rounded
        once: ngnn.passes.WideAccumulation)."""
        x = op.args[0]

        def value(body, eid, vertex, rest):
            return (yield body.value_steps(x, (eid,) + tuple(rest)))
        peak = cls((op, "max"), op.graph, op.at, "max", op.dtype, op.shape[1:], value,
                   x.dtype)

        def shifted(body, eid, vertex, rest):
            top = yield body.loop[4].edge_reduction_steps(peak, vertex, rest)
            edge = yield body.value_steps(x, (eid,) + tuple(rest))
            return f"exp({converted(edge, x.dtype, op.dtype)} - {top})"
        total = cls((op, "sum"), op.graph, op.at, "sum", np.float64, op.shape[1:], shifted,
                    op.dtype)
        return peak, total

    # Values per feature a chunk's partial holds (ChunkPartials: `width` per chunk).
    parts = 1

    @property
    def width(self):
        return self.size * self.parts

    @property
    def combiner(self):
        """Its kind's row of the reduction table (ngnn/op_graph/combiners.py)."""
        return COMBINERS[self.reduce]

    def identity(self):
        return literal(self.combiner.identity_in(self.dtype), self.dtype)

    def declare(self, acc):
        """C statements declaring the state `acc` of the reduction, empty."""
        return [f"{ctype(self.dtype)} {acc} = {self.identity()};"]

    def fold(self, acc, x):
        """The C statement folding `x` (an edge's value or a chunk's partial) into `acc`:
        the table's `c_fold` (NaN wins a max or min, as in NumPy)."""
        return self.combiner.c_fold.format(acc=acc, x=x)

    def partial(self, buffer, chunk, feature, part=0):
        offset = f" + {part * self.size}" if part else ""
        return f"{buffer}[({chunk}) * {self.width}{offset} + {feature}]"

    def store(self, acc, buffer, chunk, feature):
        """C statements writing the state into chunk `chunk`'s partial."""
        return [f"{self.partial(buffer, chunk, feature)} = {acc};"]

    def load(self, acc, buffer, chunk, feature):
        """C statements setting the state from chunk `chunk`'s partial."""
        return [f"{acc} = {self.partial(buffer, chunk, feature)};"]

    def merge(self, acc, buffer, chunk, feature):
        """C statements folding chunk `chunk`'s partial into the state."""
        return [self.fold(acc, self.partial(buffer, chunk, feature))]

    def result(self, acc, count):
        """The C value of a row with edges (`count` of them) from its state."""
        return f"{acc} / {count}" if self.combiner.divides else acc


class OnlineSoftmaxSum(EdgeReduction):
    """A weighted sum of softmax weights (ngnn.passes.OnlineSoftmax) in one walk of the
    edges: per feature the running max `acc_m` of the logits, the sum `acc_s` of exp(x -
    acc_m) and the weighted sum `acc` with the weights exp(x - acc_m), both rescaled when
    the max grows; the value is acc / max(acc_s, 1). A chunk's partial holds (m, s, acc)
    per feature, folded with the same rescaling in chunk order. Its start and a fold of a
    weight read as stored are the table's sum (and max, for the running max); the
    rescaling is its own."""
    parts = 3

    def __init__(self, match):
        total = match.total
        self.match = match
        # Accumulators whose loops computed the weight (and so raised the running max);
        # one reading the weight stored (an edge output of its kernel) sums it as it is,
        # leaving the max at -inf and the sum at 0, which every fold and the result keep.
        self.running = set()

        def edge_steps(body, eid, vertex, rest):
            return (yield body.value_steps(total.args[0], (eid,) + tuple(rest)))
        super().__init__((total, "online"), total.graph, total.at, "sum", total.dtype,
                         total.shape[1:], edge_steps)

    def declare(self, acc):
        t = ctype(self.dtype)
        running_max = COMBINERS["max"].identity_in(self.dtype)
        return [f"{t} {acc} = {self.identity()};",
                f"{t} {acc}_m = {literal(running_max, self.dtype)};",
                f"{t} {acc}_s = {self.identity()};"]

    def rescale(self, old, new):
        """exp(old - new), exactly 1 where the max did not move (-inf included)."""
        return f"({old} == {new} ? {literal(1, self.dtype)} : exp({old} - {new}))"

    def running_max_steps(self, block, acc, coords):
        """The edge's logit raises the running max (`acc_mn`, the loop's `spread`):
        the sum of exponentials is rescaled and takes the edge's term; the accumulator is
        rescaled by `fold`, with the same factor `acc_sc`."""
        t = ctype(self.dtype)
        x = yield block.value_steps(self.match.x, coords)
        x = converted(x, self.match.x.dtype, self.dtype)
        block.emit(f"{t} {acc}_mn = {keeps_nan(x, '>', f'{acc}_m')};")
        block.emit(f"{t} {acc}_sc = {self.rescale(f'{acc}_m', f'{acc}_mn')};")
        block.emit(f"{acc}_s = {acc}_s * {acc}_sc + exp({x} - {acc}_mn);")
        self.running.add(acc)
        return f"{acc}_mn"

    def fold(self, acc, x):
        if acc not in self.running:
            return super().fold(acc, x)
        return f"{acc} = {acc} * {acc}_sc + {x}; {acc}_m = {acc}_mn;"

    def store(self, acc, buffer, chunk, feature):
        return [f"{self.partial(buffer, chunk, feature, part)} = {name};"
                for part, name in enumerate((f"{acc}_m", f"{acc}_s", acc))]

    def load(self, acc, buffer, chunk, feature):
        return [f"{name} = {self.partial(buffer, chunk, feature, part)};"
                for part, name in enumerate((f"{acc}_m", f"{acc}_s", acc))]

    def merge(self, acc, buffer, chunk, feature):
        t = ctype(self.dtype)
        m, s, a = (self.partial(buffer, chunk, feature, part) for part in range(3))
        return [f"{{ {t} top = {keeps_nan(m, '>', f'{acc}_m')};",
                f"  {t} mine = {self.rescale(f'{acc}_m', 'top')}, "
                f"theirs = {self.rescale(m, 'top')};",
                f"  {acc}_s = {acc}_s * mine + {s} * theirs;",
                f"  {acc} = {acc} * mine + {a} * theirs; {acc}_m = top; }}"]

    def result(self, acc, count):
        floor = keeps_nan(f"{acc}_s", ">", literal(1, self.dtype))
        return f"{acc} / {floor}"


def evaluate(steps):
    """Runs a generator of the value methods to its result, running each generator it
    yields (a request for a value) first and sending that value back: an explicit stack
    where plain calls would recurse once per op of a chain."""
    stack, sent = [steps], None
    while True:
        try:
            request = stack[-1].send(sent)
        except StopIteration as done:
            stack.pop()
            if not stack:
                return done.value
            sent = done.value
            continue
        stack.append(request)
        sent = None
