"""Sweep groups as C functions (make_transformer("numpy", native=True)).

The RowSweeps pass (ngnn/passes/row_sweeps.py) groups runs of row-wise ops (element-wise
ops, batch norm's kernels) in segments of one (rows, F) shape; here each group becomes
one C function that runs its segments one after another, each as few passes over its rows
as its ops' dependencies allow:
  - an element-wise op's element is its `c` template (the GPU transformer's, with its
    literals and precision rule, as native_elementwise renders it), a batch-norm op's its
    `row_phases` (ngnn/op_graph/normalization.py): per-column values, an element, column
    sums; so the C is rendered from the ops' own snippets, nothing here knows a layer;
  - an op starts in the pass of the latest op before it (the step order, which the memory
    plan assumes, is kept), or in the next pass when it reads a sum the group makes (a
    sum is whole only when its pass ends);
  - in a pass, each element of every op is computed in step order: a value made in the same
    pass is read from a local variable, any other from memory (broadcast as NumPy
    broadcasts it); every value is stored, as the memory plan expects.
Sums run over the live rows in row order in the tensor's dtype, one accumulator per
column, as native.py's batch-norm kernels sum: results equal theirs.
A dropout's element draws its Philox word as ngnn/philox.py (and the GPU prelude) does,
from the seed, the call number `step` (then the function's first parameter) and the
row-major position, and applies NumPy's arithmetic (x times the scale, then times 0 or 1):
its values equal K.dropout's bit for bit. Eight consecutive positions share one Philox
counter: each dropout keeps the four words of the counter it drew last.
A standalone op (row_sweeps.standalone) is a segment of its own, a loop of its own over
arrays complete in memory: a concat copies its pieces, an unslice writes each element
(zeros, then its argument's elements at the key's positions), a one-hot compares each
class id (returning 1 before it writes where one is outside [0, C): the NumPy
statements then run and raise), a sum adds in NumPy's order (row_sweeps.sum_order), so
each equals its NumPy call to the bit. A function returns 0 where it ran.
"""
import ctypes

import numpy as np

from ngnn import philox
from ngnn.op_graph.training_ops import Dropout, OneHot

from ngnn.op_graph.layout import Concat, Unslice
from ngnn.op_graph.normalization import LiveRowsOp
from ngnn.passes.row_sweeps import (EINSUM_VECTOR_BYTES, broadcast_source, row_shape,
                                    standalone, sum_order)

from ..gpu.expressions import attribute_literals, ctype, in_precision, literal, unwrapped
from .native_elementwise import CFunctions

# Philox4x64-10 as templates/prelude.j2 computes it for the GPU (the 64-bit high product
# through a 128-bit one): the word of `position` of call `stream`, as ngnn/philox.py maps it.
# A counter gives the words of eight positions: `words` keeps those of counter `*kept`.
PHILOX = """typedef unsigned long long u64;
static inline unsigned int philox_word(u64 seed, u64 position, u64 stream, u64 *kept,
                                       u64 *words) {
    if (*kept != position >> 3) {
        u64 ctr[4] = {position >> 3, stream, 0, 0}, k0 = seed, k1 = 0;
        for (int r = 0; r < 10; ++r) {
            unsigned __int128 p0 = (unsigned __int128)0xD2E7470EE14C6C93ULL * ctr[0];
            unsigned __int128 p1 = (unsigned __int128)0xCA5A826395121157ULL * ctr[2];
            u64 c1 = ctr[1], c3 = ctr[3];
            ctr[0] = (u64)(p1 >> 64) ^ c1 ^ k0;
            ctr[1] = (u64)p1;
            ctr[2] = (u64)(p0 >> 64) ^ c3 ^ k1;
            ctr[3] = (u64)p0;
            k0 += 0x9E3779B97F4A7C15ULL;
            k1 += 0xBB67AE8584CAA73BULL;
        }
        for (int w = 0; w < 4; ++w) words[w] = ctr[w];
        *kept = position >> 3;
    }
    return (unsigned int)(words[(position >> 1) & 3] >> (32 * (position & 1)));
}
"""
# NumPy's pairwise summation of a contiguous run (its loops' pairwise_sum): eight
# accumulators up to 128 values, halves (a multiple of 8 first) above.
PAIRWISE = """#define PAIRWISE(T, S)                                                          \\
static T pairwise_##S(const T *a, long n) {                                          \\
    if (n < 8) {                                                                     \\
        T res = -0.0;                                                                \\
        for (long i = 0; i < n; i++) res += a[i];                                    \\
        return res;                                                                  \\
    }                                                                                \\
    if (n <= 128) {                                                                  \\
        T r[8];                                                                      \\
        long i;                                                                      \\
        for (int k = 0; k < 8; k++) r[k] = a[k];                                     \\
        for (i = 8; i < n - (n % 8); i += 8)                                         \\
            for (int k = 0; k < 8; k++) r[k] += a[i + k];                            \\
        T res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));   \\
        for (; i < n; i++) res += a[i];                                              \\
        return res;                                                                  \\
    }                                                                                \\
    long half = n / 2;                                                               \\
    half -= half % 8;                                                                \\
    return pairwise_##S(a, half) + pairwise_##S(a + half, n - half);                 \\
}
PAIRWISE(float, f32)
PAIRWISE(double, f64)
"""


class SweepFunctions(CFunctions):
    """The sweep groups of one computation as C functions: `add(group, comments)` renders
    one, `load()` compiles all."""
    prefix = "sweep"

    def __init__(self):
        super().__init__()
        self.stepped = []       # whether each function takes the call number first
        self.pairwise = False   # whether PAIRWISE is in the source already

    def load(self):
        super().load()
        for k, stepped in enumerate(self.stepped):
            function = getattr(self.library, f"{self.prefix}{k}")
            function.restype = ctypes.c_int     # not 0: run the NumPy statements
            if stepped:
                function.argtypes = [ctypes.c_uint64] + function.argtypes

    def add(self, group, comments):
        """Renders `group` (ops in step order) as `sweep<k>`, whose parameters are the
        arrays it reads, the group's outputs and the live-row count where there is one.
        Returns the name, the ops it reads, the live-row count's op (or None) and the
        segments: (rows, F), the positions of the arrays each reads or writes, in that
        parameter order, and of those it writes; and whether it takes the call number
        `step` first (a group with a dropout)."""
        name = f"sweep{len(self.functions)}"
        t = ctype(group[0].dtype)
        members = set(group)
        inputs = []
        for op in group:
            for a in operands(op):
                if a not in members and a not in inputs and not is_scalar(a):
                    inputs.append(a)
        live = next((op.live for op in group if isinstance(op, LiveRowsOp)), None)
        param = {a: f"a{k}" for k, a in enumerate(inputs)}
        param.update({op: f"o{k}" for k, op in enumerate(group)})
        arrays = inputs + group + ([live] if live is not None else [])
        position = {a: k for k, a in enumerate(arrays)}
        stepped = any(isinstance(op, Dropout) for op in group)
        lines = [PHILOX] if stepped and not any(self.stepped) else []
        if not self.pairwise and any(sum_order(op) == "pairwise" for op in group):
            lines.append(PAIRWISE)
            self.pairwise = True
        lines += [f"/* {c} */" for c in comments]
        lines.append(f"int {name}(" + ", ".join(
            (["unsigned long long step"] if stepped else []) +
            [f"const {ctype(a.dtype)} *{param[a]}" for a in inputs] +
            [f"{t} *{param[op]}" for op in group] +
            ([f"const {t} *live"] if live is not None else [])) + ") {")
        lines += [f"    u64 kept_{param[op]} = ~0ULL, words_{param[op]}[4];"
                  for op in group if isinstance(op, Dropout)]
        segments = []
        for segment in split_segments(group):
            rows, width = row_shape(segment[0])
            # Only a segment of batch-norm ops reads the live count: another group member
            # may make it, in an earlier segment.
            reads_live = live is not None and any(isinstance(op, LiveRowsOp) for op in segment)
            if standalone(segment[0]):
                lines += self.render_standalone(segment[0], param, t)
            else:
                lines += self.render_segment(segment, param, t, rows, width, reads_live)
            writes = {position[op] for op in segment}
            used = writes | {position[a] for op in segment for a in operands(op)
                             if a in position}
            if reads_live:
                used.add(position[live])
            segments.append(((rows, width), tuple(sorted(used)), tuple(sorted(writes))))
        lines += ["    return 0;", "}"]
        self.functions.append("\n".join(lines) + "\n")
        self.arity.append(len(inputs) + len(group) + (live is not None))
        self.stepped.append(stepped)
        return name, inputs, live, segments, stepped

    @staticmethod
    def render_standalone(op, param, t):
        """The C of a standalone op's segment (row_sweeps.standalone): a loop of its own
        over its arguments, complete in memory."""
        out, lines = param[op], ["    {"]
        if isinstance(op, Concat):
            # out as (outer, L, inner): each piece's (outer, l, inner) at its offset.
            outer = int(np.prod(op.shape[:op.axis], dtype=np.int64))
            inner = int(np.prod(op.shape[op.axis + 1:], dtype=np.int64))
            length, offset = op.shape[op.axis], 0
            for a in op.args:
                block = a.shape[op.axis] * inner
                lines += [f"    for (long o = 0; o < {outer}; o++)",
                          f"        for (long e = 0; e < {block}; e++)",
                          f"            {out}[(o * {length} + {offset}) * {inner} + e] = "
                          f"{param[a]}[o * {block} + e];"]
                offset += a.shape[op.axis]
        elif isinstance(op, OneHot):
            # Class ids outside [0, C): return before writing, the NumPy statements raise.
            ids, (count, classes) = param[op.args[0]], op.shape
            lines += [f"    for (long i = 0; i < {count}; i++)",
                      f"        if ({ids}[i] < 0 || {ids}[i] >= {classes}) return 1;",
                      f"    for (long i = 0; i < {count}; i++)",
                      f"        for (long j = 0; j < {classes}; j++)",
                      f"            {out}[i * {classes} + j] = ({t})({ids}[i] == j);"]
        elif isinstance(op, Unslice):
            # Zeros, then the argument's elements at the key's positions (a loop over
            # the argument's axes); an argument of the output's shape fills it all (the
            # key takes every element in order), in place where it is the output.
            x = op.args[0]
            if x.shape != op.shape:
                lines.append(f"    memset({out}, 0, {op.size} * sizeof({t}));")
            out_strides = [int(np.prod(op.shape[d + 1:], dtype=np.int64))
                           for d in range(op.ndim)]
            index, axis = [], 0
            for k, stride in zip(op.key, out_strides):
                if isinstance(k, slice):
                    index.append(f"({k.start} + {k.step} * i{axis}) * {stride}")
                    axis += 1
                else:
                    index.append(f"{k} * {stride}")
            lines += [f"    {'    ' * d}for (long i{d} = 0; i{d} < {size}; i{d}++)"
                      for d, size in enumerate(x.shape)]
            flat = " + ".join(f"i{d} * {int(np.prod(x.shape[d + 1:], dtype=np.int64))}"
                              for d in range(x.ndim)) or "0"
            lines.append(f"    {'    ' * x.ndim}{out}[{' + '.join(index) or '0'}] = "
                         f"{param[x]}[{flat}];")
        else:
            lines += SweepFunctions.render_sum(op, param[op.args[0]], out, t)
        return lines + ["    }"]

    @staticmethod
    def render_sum(op, x, out, t):
        """A Sum in NumPy's order (row_sweeps.sum_order), from 0 (a sum of -0s is +0)."""
        order, shape = sum_order(op), op.args[0].shape
        if order == "pairwise":
            return [f"    {out}[0] = ({t})0 + pairwise_{'f32' if t == 'float' else 'f64'}"
                    f"({x}, {op.args[0].size});"]
        if order == "columns":
            rows, width = shape
            return [f"    for (long j = 0; j < {width}; j++) {out}[j] = 0;",
                    f"    for (long i = 0; i < {rows}; i++)",
                    f"        for (long j = 0; j < {width}; j++) "
                    f"{out}[j] = {out}[j] + {x}[i * {width} + j];"]
        # "lanes": np.einsum's vectors of L lanes, four at a time into the accumulator.
        n = int(np.prod([shape[a] for a in op.axes], dtype=np.int64))
        lanes = EINSUM_VECTOR_BYTES // op.dtype.itemsize
        tree = "(acc[0] + acc[1]) + (acc[2] + acc[3])" if lanes == 4 else "acc[0] + acc[1]"
        return [f"    for (long r = 0; r < {op.size}; r++) {{",
                f"        const {t} *a = {x} + r * {n};",
                f"        {t} acc[{lanes}] = {{0}};",
                "        long c = " + str(n) + ";",
                f"        for (; c >= {4 * lanes}; c -= {4 * lanes}, a += {4 * lanes})",
                f"            for (int l = 0; l < {lanes}; l++)",
                f"                acc[l] = ((a[l] + a[{lanes} + l]) + (a[{2 * lanes} + l] + "
                f"a[{3 * lanes} + l])) + acc[l];",
                f"        for (; c > 0; c -= {lanes}, a += {lanes})",
                f"            for (int l = 0; l < {lanes}; l++) "
                f"acc[l] = (l < c ? a[l] : ({t})0) + acc[l];",
                f"        {out}[r] = ({tree}) + ({t})0;",
                "    }"]

    def render_segment(self, segment, param, t, rows, width, has_live):
        """The C of one segment, in a block of its own: its live rows, its sums'
        accumulators, its passes."""
        sweeps = assign_sweeps(segment)
        lines = ["    {", f"    const long rows = {rows}, F = {width};"]
        if has_live:
            lines += ["    double bound = ceil((double)live[0]);",
                      "    long n = bound < 0 ? 0 : bound > rows ? rows : (long)bound;"]
        else:
            lines.append("    long n = rows;")
        lines += [f"    const {t} count = ({t})(n > 1 ? n : 1);",
                  "    const double inverse = 1.0 / (double)(n > 1 ? n : 1);",
                  "    (void)count; (void)inverse;"]
        for k, op in enumerate(segment):
            if isinstance(op, LiveRowsOp) and any(p.sums for p in op.row_phases):
                for r in sorted({row for p in op.row_phases for row, _ in p.sums}):
                    lines.append(f"    {t} s{k}_{r}[{width}];")
        last = max(end for _, end in sweeps.values())
        for sweep in range(last + 1):
            lines += self.render_sweep(segment, sweep, sweeps, param, t, rows, width)
        return lines + ["    }"]

    def render_sweep(self, group, sweep, sweeps, param, t, rows, width):
        """The C of one pass over the rows of a segment (`group`): column values, zeroed
        sums, the live rows, the rows past them, the sums' ends."""
        active = [(k, op) for k, op in enumerate(group)
                  if sweeps[op][0] <= sweep <= sweeps[op][1]]
        lines = [f"    /* pass {sweep} */"]
        columns, live_body, dead_body, finish = [], [], [], []
        for k, op in active:
            if not isinstance(op, LiveRowsOp):
                expr = self.element_expr(op, group, sweep, sweeps, param, t, rows, width)
                for body in (live_body, dead_body):
                    body += [f"            {t} v{k} = {expr};",
                             f"            {param[op]}[i * F + j] = v{k};"]
                continue
            phase = op.row_phases[sweep - sweeps[op][0]]
            fields = self.row_fields(op, k, group, sweep, sweeps, param, t, rows, width)
            for column, expr in phase.columns:
                columns.append(f"    {t} c{k}_{column}[{width}];")
                columns.append(f"    for (long j = 0; j < F; j++) c{k}_{column}[j] = "
                               f"{expr.format(**fields)};")
            if phase.element is not None:
                live_body += [f"            {t} v{k} = {phase.element.format(**fields)};",
                              f"            {param[op]}[i * F + j] = v{k};"]
                dead_body += [f"            {t} v{k} = 0;",
                              f"            {param[op]}[i * F + j] = v{k};"]
            for row, expr in phase.sums:
                columns.append(f"    for (long j = 0; j < F; j++) s{k}_{row}[j] = 0;")
                live_body.append(f"            s{k}_{row}[j] += {expr.format(**fields)};")
                divide = " / count" if phase.mean else ""
                finish.append(f"    for (long j = 0; j < F; j++) {{ s{k}_{row}[j] = "
                              f"s{k}_{row}[j]{divide}; {param[op]}[{row} * F + j] = "
                              f"s{k}_{row}[j]; }}")
        lines += columns
        for first, last, body in (("0", "n", live_body), ("n", "rows", dead_body)):
            if body:
                lines += [f"    for (long i = {first}; i < {last}; i++)",
                          "        for (long j = 0; j < F; j++) {"] + body + ["        }"]
        return lines + finish

    @staticmethod
    def value(a, group, sweep, sweeps, param, rows, width):
        """A value at (i, j) of the segment `group`: the local of an op made in this pass,
        else memory, broadcast over the axes where `a` has one element."""
        if a in sweeps and sweeps[a][1] == sweep:
            return f"v{group.index(a)}"
        shape = (1,) * (2 - a.ndim) + a.shape
        index = {(True, True): "i * F + j", (False, True): "j", (True, False): "i",
                 (False, False): "0"}[(shape[0] == rows and rows != 1,
                                       shape[1] == width and width != 1)]
        return f"{param[a]}[{index}]"

    def element_expr(self, op, group, sweep, sweeps, param, t, rows, width):
        if isinstance(op, Dropout):
            x = self.value(operands(op)[0], group, sweep, sweeps, param, rows, width)
            scale = literal(philox.keep_scale(op.rate, op.dtype), op.dtype)
            keep = f"(philox_word({op.seed}ULL, (u64)(i * F + j), step, " \
                f"&kept_{param[op]}, words_{param[op]}) >= {philox.keep_threshold(op.rate)}u)"
            return f"({x} * {scale}) * ({t}){keep}"
        fields = attribute_literals(op)
        for field, a in zip(("x", "y"), operands(op)):
            fields[field] = literal(a.value, op.dtype) if is_scalar(a) else \
                self.value(a, group, sweep, sweeps, param, rows, width)
        return unwrapped(in_precision(op.c.format(out_ctype=t, **fields), op.dtype))

    def row_fields(self, op, k, group, sweep, sweeps, param, t, rows, width):
        """The fields of a RowPhase template for `op` (the k-th of the segment) in `sweep`."""
        fields = {"T": t, "eps": repr(getattr(op, "eps", 0.0)), "count": "count",
                  "inverse": "inverse", "out0": f"s{k}_0[j]", "out1": f"s{k}_1[j]"}
        for name, a in zip(op.row_args, op.args):
            if a.shape == (rows, width):
                fields[name] = self.value(a, group, sweep, sweeps, param, rows, width)
            elif a.shape == (2, width):
                for r in (0, 1):
                    # A sum the segment made is read from its accumulator.
                    fields[f"{name}{r}"] = f"s{group.index(a)}_{r}[j]" if a in sweeps \
                        else f"{param[a]}[{r} * F + j]"
            else:
                fields[name] = f"{param[a]}[j]"
        fields.update({c: f"c{k}_{c}[j]" for p in op.row_phases for c, _ in p.columns})
        return fields


def is_scalar(op):
    return op.is_constant and op.value.ndim == 0


def operands(op):
    """The arrays a group member reads: its arguments, a batch-norm op's live count
    aside, an element-wise op's broadcasts as their sources."""
    if isinstance(op, LiveRowsOp):
        return op.args[:op.fixed_args]
    return op.args if standalone(op) else [broadcast_source(a) for a in op.args]


def split_segments(group):
    """The group's runs of consecutive ops of one (rows, F) shape."""
    segments = []
    for op in group:
        if segments and not standalone(op) and not standalone(segments[-1][0]) and \
                row_shape(segments[-1][0]) == row_shape(op):
            segments[-1].append(op)
        else:
            segments.append([op])
    return segments


def assign_sweeps(segment):
    """{op: (first pass, last pass)}: each op starts no earlier than the op before it
    ends (the step order), and after the pass that completes a sum it reads."""
    sweeps, current = {}, 0
    for op in segment:
        start = current
        for a in operands(op):
            if a in sweeps:
                made_by_sums = isinstance(a, LiveRowsOp) and a.row_phases[-1].element is None
                start = max(start, sweeps[a][1] + made_by_sums)
        phases = len(op.row_phases) if isinstance(op, LiveRowsOp) else 1
        sweeps[op] = (start, start + phases - 1)
        current = sweeps[op][1]
    return sweeps
