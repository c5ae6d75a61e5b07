"""The NumPy transformer: each computation becomes one generated Python module.

The module's `bind(buffers, variables, constants, graphs, ops)` makes a tensor view for every
intermediate (where the memory plan put it) and returns the step function, whose body is
one or a few NumPy/SciPy statements per op, each writing into its planned view with
`out=`. So the memory plan is the memory really used.
"""
import functools
import linecache
import os
import weakref

import numpy as np

from ngnn.naming import sanitize, value_identifier
from ngnn.passes import FusedGroup, ZeroRowProducts
from ngnn.op_graph.printer import op_comment
from ngnn.op_graph import Assign, Constant, Dot, Placeholder, Variable, ZeroRowDot
from ngnn.passes.block_planning import DEFAULT_BLOCK_BYTES, BlockPlanning
from ngnn.passes.buffer_sharing import BufferSharing
from ngnn.passes.row_sweeps import RowSweeps

from ..base import DeviceBufferStorage, DeviceTensor, Resident, Transformer, buffer_holding
from . import native, native_blas
from .codegen import NumPyCodeGenerator, is_scalar_constant, literal
from .fused import FusedGroupWriter
from .native_elementwise import NativeElementwise
from .native_groups import GroupFunctions
from .native_segments import Call, Product, SegmentFunctions, Statement
from .native_sweeps import SweepFunctions

# The live counts a segment's zero-row product reads (as K.live_rows does).
LIVE_COUNT_DTYPES = {np.dtype(t) for t in (np.float32, np.float64, np.int32, np.int64)}


class NumPyDeviceBufferStorage(DeviceBufferStorage):
    def allocate(self):
        if self.nbytes > physical_memory_bytes():
            raise MemoryError(f"{self.nbytes} bytes is more than this machine's memory")
        self.data = np.empty(max(self.nbytes, 1), dtype=np.uint8)
        return self.data


@functools.lru_cache(maxsize=None)
def physical_memory_bytes():
    """This machine's RAM, or its cgroup's limit when lower, checked before allocating:
    where the kernel overcommits, NumPy's allocation of more succeeds and the process is
    killed later, when the pages are touched. Read once, as a chunked program allocates
    on every call."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    try:
        with open("/sys/fs/cgroup/memory.max") as f:
            limit = f.read().strip()
    except OSError:
        return total
    return min(total, int(limit)) if limit.isdigit() else total


class NumPyDeviceTensor(DeviceTensor):
    @property
    def array(self):
        raw = self.storage.data[self.offset:self.offset + self.nbytes]
        return raw.view(self.dtype).reshape(self.shape)

    def get(self):
        return self.array.copy()

    def set(self, value):
        np.copyto(self.array, np.broadcast_to(np.asarray(value), self.shape), casting="unsafe")


class NumPyResident(Resident):
    """A resident value of the NumPy transformer, whose device is the host's memory: a
    host copy, checked once, that calls read in place (nothing crosses a bus: a call's
    `transfer_bytes` are 0 either way)."""

    def __init__(self, transformer, value, dtype=None):
        super().__init__(transformer, value, dtype)
        if not self.is_sparse:
            self.value.flags.writeable = False

    def fed(self):
        return self.value


class NumPyTransformer(Transformer):
    name = "numpy"
    resident_class = NumPyResident
    # native=True: batch norm's kernels, one head's sparse products and the large
    # element-wise ops in C (native.py, native_elementwise.py), where a C compiler is found.
    extra_options = ("fusion_block_bytes", "native")

    def late_passes(self):
        # The fused groups' blocks are planned once, for the code writer and the simulator.
        block_bytes = self.options.get("fusion_block_bytes", DEFAULT_BLOCK_BYTES)
        # native=True: runs of row-wise ops become one C loop each (native_sweeps.py),
        # unless the NaN finder is to check every op's output.
        sweeps = [RowSweeps()] if self.options.get("native", False) and \
            self.fusion and not self.debug_nans else []
        return self.fusion_passes(vertex_gathers=True) + [BlockPlanning(block_bytes),
                                                          BufferSharing()] + sweeps

    def is_view(self, op):
        return op.is_view

    def decomposes(self):
        # Chunked programs split rows; batch norm's kernels need every row at once, so
        # under a budget it runs as the row-wise ops and column sums it is made of.
        return self.chunking

    def graph_passes(self):
        # Last: products skip the rows batch norm zeroed (a slot's padding). Not under a
        # memory budget or a chunk count, whose chunked programs split the products' rows
        # themselves.
        plain = self.optimize and not self.decomposes()
        return super().graph_passes() + ([ZeroRowProducts()] if plain else [])

    def allocate_variable(self, variable):
        storage = NumPyDeviceBufferStorage(self, variable.nbytes, variable.name)
        storage.allocate()
        self.count_allocation(variable.nbytes)
        return NumPyDeviceTensor(storage, 0, variable.shape, variable.dtype)

    def close(self):
        """Drops every buffer, generated module and linecache entry of this transformer."""
        for comp in self.computations:
            linecache.cache.pop(getattr(comp, "source_file", None), None)
            comp.executor, comp.buffers = None, None
        self.variable_tensors = {}
        super().close()

    def transform_ordered_ops(self, computation):
        native_kernels = self.options.get("native", False) and native.usable()
        module = ModuleWriter(computation, self.debug_nans, native_kernels)
        source = module.render()
        for library in (module.elementwise, module.sweeps, module.native_groups,
                        module.segments):
            if library is not None and library.functions:
                library.load()
        filename = f"<ngnn numpy: {computation.name}#{id(computation):x}>"
        # Registered so tracebacks through generated code show its lines, and dropped with
        # the computation (or when the transformer closes).
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        computation.source_file = filename
        weakref.finalize(computation, linecache.cache.pop, filename, None)
        namespace = {}
        exec(compile(source, filename, "exec"), namespace)
        variables = [self.variable_tensor(v).array for v in module.variables]
        computation.bind = lambda buffers: namespace["bind"](
            buffers, variables, module.constants, module.graphs, module.checked_ops)
        computation._source = source
        if not computation.transient:
            self.acquire(computation)

    def acquire(self, computation):
        """Allocates the computation's buffers and binds its generated code to them."""
        buffers = []
        for i, nbytes in enumerate(computation.memory_plan.buffer_bytes):
            storage = NumPyDeviceBufferStorage(self, nbytes, f"buffer{i}")
            try:
                buffers.append(storage.allocate())
            except MemoryError:
                raise MemoryError(f"{buffer_holding(computation.memory_plan, i)} needs "
                                  f"{nbytes} bytes ({nbytes / 2**30:.2f} GiB), more than this "
                                  "machine can allocate") from None
        self.count_allocation(sum(computation.memory_plan.buffer_bytes))
        computation.buffers = buffers
        computation.executor = computation.bind(buffers)
        if self.debug_nans:
            computation.executor = without_float_warnings(computation.executor)

    def release(self, computation):
        self.count_allocation(-sum(computation.memory_plan.buffer_bytes))
        computation.buffers = computation.executor = None


def without_float_warnings(executor):
    """NumPy's overflow and invalid-value warnings, silenced where the NaN finder reports
    the first non-finite value itself, with the op, its line and its inputs."""
    def run(*args):
        with np.errstate(all="ignore"):
            return executor(*args)
    return run


class ModuleWriter:
    """Renders one computation as a Python module."""

    def __init__(self, computation, debug_nans=False, native_kernels=False):
        self.comp = computation
        self.debug_nans = debug_nans
        self.native_kernels = native_kernels
        self.checked_ops = []       # ops whose outputs the NaN finder checks (`ops[i]`)
        self.plan = computation.memory_plan
        # op -> its name in the module: the IR's name (`%8` is `t_8`, ngnn/naming.py), a
        # scalar constant's literal, or the variable a value is written into.
        self.names = {}
        self.value_names = computation.value_names
        self.variables, self.constants, self.graphs = [], [], []
        self.bind_lines, self.body, self.deferred = [], [], []
        self.native_copies = []     # (variable, value, comment) copied in C, native mode
        self.codegen = NumPyCodeGenerator(self.ref, "N" if native_kernels else "K")
        self.elementwise = NativeElementwise() if native_kernels else None
        self.sweeps = SweepFunctions() if native_kernels else None
        self.native_groups = GroupFunctions() if native_kernels else None
        # Runs of the body's C calls and products as one C function each (native_segments.py)
        self.segments = SegmentFunctions() if native_kernels else None
        # Views the same at every call, made once in bind (RowSweeps, native mode only).
        self.bind_views = getattr(computation, "bind_views", set()) if native_kernels else set()
        # op -> its sweep group (RowSweeps), where the group runs as one C function
        self.sweep_of = {op: group for group in getattr(computation, "row_sweeps", [])
                         for op in group} if native_kernels else {}
        self.sweep_values = {}      # sweep group member -> bind_value(member)

    def ref(self, kind, obj):
        """Name of a module-level object the code uses: a graph, the exchange that talks
        to other ranks, or the native element-wise functions (all passed to bind in
        `graphs`)."""
        prefix = {"graph": "g", "exchange": "exchange", "native": "native"}[kind]
        index = next((i for i, known in enumerate(self.graphs) if known is obj), None)
        if index is None:
            index = len(self.graphs)
            self.graphs.append(obj)
            self.bind_lines.append(f"{prefix}{index} = graphs[{index}]")
        return f"{prefix}{index}"

    def name_of(self, op):
        if op not in self.names:
            self.names[op] = literal(op.value, op.dtype) if is_scalar_constant(op) else \
                value_identifier(self.value_names[op])
        return self.names[op]

    def bound_at_bind(self, op):
        """Whether `op`'s array is made by `bind` (a variable, an array constant, a planned
        buffer's view), so is the same array at every call."""
        op = self.plan.into_variable.get(op, op)
        return isinstance(op, Variable) or op in self.plan.slots or \
            (isinstance(op, Constant) and op.value.ndim > 0)

    def comment(self, op):
        """`  # %8 = divide(%6, %7)`: the op a line computes, as the IR writes it."""
        return "  # " + op_comment(op, self.value_names)

    def render(self):
        for step in self.comp.steps:
            for op in step.ops if isinstance(step, FusedGroup) else [step]:
                self.name_of(op)
        self.writers = {group: FusedGroupWriter(blocks, self.names, self.codegen, self.ref,
                                                self.value_names)
                        for group, blocks in self.comp.block_plan.groups.items()}
        for step in self.comp.steps:
            if isinstance(step, FusedGroup):
                self.emit_group(step)
            elif step in self.sweep_of:
                # Each member's array bound at its place (views made at bind may read
                # it); the group's call at its last member, the leaves it reads bound.
                self.sweep_values[step] = self.bind_value(step)
                if step is self.sweep_of[step][-1]:
                    self.emit_sweep(self.sweep_of[step])
            else:
                self.emit(step)
        if self.native_copies:
            self.bind_lines += ["copies = N.prepare_copies(("] + [
                f"    ({variable}, {value}),{comment}, landing last"
                for variable, value, comment in self.native_copies] + ["))"]
            self.deferred.append("copies()  # the step's assignments (`copies` in bind), "
                                 "landing last")
        body = self.segmented(self.body) if self.segments is not None else self.body
        function = "run"
        params = [self.name_of(p) for p in self.comp.parameters] + ["step"]
        results = [f"np.array({self.name_of(r)})" if is_scalar_constant(r) else
                   f"{self.name_of(r)}.copy()" for r in self.comp.returned_results]
        lines = [f'"""ngnn computation {sanitize(self.comp.name)}, generated by the NumPy '
                 'transformer."""',
                 "import numpy as np",
                 "import scipy.special",
                 "from ngnn.transformers.numpy import kernels as K"]
        if self.native_kernels:
            lines.append("from ngnn.transformers.numpy import native as N")
        lines += ["", "",
                 "def bind(buffers, variables, constants, graphs, ops):"]
        # Made whenever a group has block values, even of 0 bytes (no vertices, or rows of
        # width 0): the groups' views into it are bound all the same.
        if any(w.scratch for w in self.writers.values()):
            workspace = max(w.workspace_bytes for w in self.writers.values())
            lines.append(f"    workspace = np.empty({workspace}, np.uint8)  "
                         "# the fused groups' block values (fused.py)")
        lines += ["    " + line for line in self.bind_lines]
        lines += ["", f"    def {function}({', '.join(params)}):"]
        lines += ["        " + line for line in body + self.deferred]
        lines += [f"        return ({', '.join(results)}{',' if len(results) == 1 else ''})",
                  "", f"    return {function}", ""]
        return "\n".join(lines)

    def emit_group(self, group):
        for op in group.outputs:
            self.bind_lines.append(f"{self.name_of(op)} = K.view(buffers[{self.plan.slots[op]}], "
                                   f"{op.shape}, np.{op.dtype.name})")
        function, call = self.writers[group].function()
        self.bind_lines += [""] + function
        outputs = ", ".join(self.value_names[o] for o in group.outputs)
        inputs = ", ".join(self.value_names[i] for i in group.inputs)
        blocks = self.comp.block_plan.groups[group]
        if self.native_groups is not None and self.native_groups.accepts(blocks):
            # The whole group as one C loop over its vertices (native_groups.py), the
            # Python function kept for arrays it does not fit.
            skipped = blocks.skipped
            live = self.native_groups.live_count(blocks, getattr(self.comp, "zero_rows", {}))
            name, reads = self.native_groups.add(
                blocks, [op_comment(op, self.value_names) for op in group.ops
                         if op not in skipped], live)
            params = [i for i in group.inputs if not is_scalar_constant(i)]
            csr = "in" if group.at == "dst" else "out"
            native_call = "native_" + group.name
            self.bind_lines.append(
                f"{native_call} = N.prepare_group("
                f"{self.ref('native', self.native_groups)}.library.{name}, "
                f"{self.ref('graph', group.graph)}, {csr!r}, "
                f"{'src' if csr == 'in' else 'dst'!r}, "
                f"{tuple(params.index(a) for a in reads)}, {tuple(a.shape for a in reads)}, "
                f"np.{group.outputs[0].dtype.name}, "
                f"({''.join(self.name_of(o) + ', ' for o in group.outputs)}), {group.name}"
                f"{', live=True' if live is not None else ''})")
            call = native_call + call[len(group.name):]
            if live is not None:        # the fed count, after the group's own arguments
                call = f"{call[:-1]}, {self.name_of(live)})"
            outputs += " in one C loop (native_groups.py)"
            if all(self.bound_at_bind(a) or a in self.bind_views or isinstance(a, Placeholder)
                   for a in params):
                # It may join a segment: its arrays bound once, but for the CSR and the
                # arrays fed to the step (`fed`), whose addresses the segment takes.
                index = getattr(group.graph, f"{csr}_indptr").dtype
                names = ["None" if isinstance(a, Placeholder) else self.name_of(a)
                         for a in params]
                fed = {f"a{k}": (self.name_of(a), a.shape, a.dtype)
                       for k, a in enumerate(reads) if isinstance(a, Placeholder)}
                if live is not None:        # the slot's fed live count
                    fed["live"] = (self.name_of(live), live.shape, live.dtype)
                made = ", ".join(self.value_names[o] for o in group.outputs)
                self.body.append(Statement(
                    call, f"  # {outputs} = {group.name}({inputs})",
                    [f"{made} = {group.name}({inputs}) in one C loop (native_groups.py)"],
                    Call(self.native_groups, name, (group.graph, csr, "src" if csr == "in"
                                                    else "dst", group.outputs[0].shape[0],
                                                    index), fed),
                    f"N.group_arguments({native_call}, ({''.join(n + ', ' for n in names)}))",
                    self.name_of(group.outputs[0])))
                return
        self.body.append(f"{call}  # {outputs} = {group.name}({inputs})")

    def emit_sweep(self, group):
        """One C function for a sweep group (native_sweeps.py), prepared in bind; its ops'
        statements one by one, in a function of bind, where the arrays turn out to overlap."""
        statements, comments = [], []
        for op in group:
            name, args, comment = self.sweep_values[op]
            statements += [s + comment for s in self.codegen.generate_op(op, name, args)]
            comments.append(op_comment(op, self.value_names))
        function, inputs, live, segments, stepped = self.sweeps.add(group, comments)
        first = self.names[group[0]]
        fallback, call = "sweep" + first[1:], "call" + first[1:]
        # The arrays fed to the step, passed at each call, then a dropout's call number.
        fed = [k for k, a in enumerate(inputs) if isinstance(a, Placeholder)]
        params = ", ".join([self.name_of(inputs[k]) for k in fed] +
                           (["step"] if stepped else []))
        self.bind_lines += [f"def {fallback}({params}):"] + ["    " + s for s in statements]
        arrays = ["None" if k in fed else self.name_of(a) for k, a in enumerate(inputs)]
        outputs = [self.names[op] for op in group]
        fed_shapes = "".join(f"({k}, {inputs[k].shape}, np.{inputs[k].dtype.name}), "
                             for k in fed)
        self.bind_lines.append(
            f"{call} = N.prepare_sweep({self.ref('native', self.sweeps)}.library.{function}, "
            f"({''.join(a + ', ' for a in arrays)}), ({''.join(o + ', ' for o in outputs)}), "
            f"{'None' if live is None else self.name_of(live)}, {tuple(segments)}, "
            f"{fallback}{f', fed=({fed_shapes})' if fed else ''})")
        self.body.append(Statement(
            f"{call}({params})", f"  # {', '.join(self.value_names[op] for op in group)} in one "
            "C function (native_sweeps.py)", comments,
            Call(self.sweeps, function, fed={f"a{k}": (self.name_of(inputs[k]), inputs[k].shape,
                                                       inputs[k].dtype) for k in fed}),
            f"N.call_arguments({call})", first, [f"# {c}" for c in comments]))

    def in_c_product(self, op):
        """Whether `op` is a product a segment may make (native_segments.py): a 2-D
        np.matmul or K.zero_row_matmul (its live count a number bound once or fed) of
        float32 or float64 matrices bound once, NumPy's BLAS found, no NaN checks between
        statements."""
        if not isinstance(op, (Dot, ZeroRowDot)) or self.debug_nans:
            return False
        a, b, *live = op.args
        return a.ndim == b.ndim == 2 and a.dtype == b.dtype == op.dtype and \
            native_blas.cblas(native_blas.GEMM, op.dtype) is not None and \
            all(self.bound_at_bind(x) or x in self.bind_views for x in [a, b, op]) and \
            all(x.dtype in LIVE_COUNT_DTYPES and (self.bound_at_bind(x) or
                                                  x in self.bind_views or
                                                  isinstance(x, Placeholder)) for x in live)

    def segmented(self, body):
        """The body with each run of two or more Statements as one segment: a C function
        making their calls in order (native_segments.py), prepared in bind, called once
        in the body after the IR statements it computes."""
        lines, run = [], []
        for entry in body + [None]:
            if isinstance(entry, Statement):
                run.append(entry)
                continue
            if len(run) == 1:
                lines += run[0].lines()
            elif run:
                lines += self.emit_segment(run)
            run = []
            if entry is not None:
                lines.append(entry)
        return lines

    def emit_segment(self, run):
        """The body lines of a segment of the Statements `run`: the comment of every IR
        statement it computes, in order, and its call; in bind, its C function's table
        (N.prepare_segment, from each statement's slots) and the statements one by one,
        which run where the C does not."""
        function, graphs, fed, size = self.segments.add([s.member for s in run],
                                                        [s.ir for s in run])
        name = "segment" + run[0].key[1:]
        library = self.ref("native", self.segments)
        graphs = [f"({self.ref('graph', graph)}, {csr!r}, {other!r}, {rows}, "
                  f"np.{index.name})" for graph, csr, other, rows, index in graphs]
        given = "".join(f", {array}" for array, _, _ in fed)      # the run's parameters
        self.bind_lines += [f"{name} = N.prepare_segment({library}.library.{function}, "
                            f"{size}, ("] + \
            [f"    {s.arguments},  # {', '.join(ir.split(' = ')[0] for ir in s.ir)}"
             for s in run] + ["), ("] + \
            [f"    lambda step{given}: {s.text},{s.comment}" for s in run] + \
            [f"), ({''.join(g + ', ' for g in graphs)}), "
             f"({''.join(f'({shape}, np.{dtype.name}), ' for _, shape, dtype in fed)}))"]
        values = [ir.split(" = ")[0] for s in run for ir in s.ir]
        return [f"# {ir}" for s in run for ir in s.ir] + [
            f"{name}(step{given})  # {values[0]} ... {values[-1]}: {len(run)} statements in "
            "one C function (native_segments.py)"]

    def bind_value(self, op):
        """The name of `op`'s array (bound to its planned view, or the variable it is
        written into), its arguments' names and the comment of its statement."""
        name = self.name_of(op)
        args = [self.name_of(a) for a in op.args]
        note = ""
        if op in self.plan.into_variable:
            variable = self.plan.into_variable[op]
            name = self.names[op] = self.name_of(variable)
            note = f"  # into {self.value_names[variable]}"
        if op in self.plan.slots:
            self.bind_lines.append(f"{name} = K.view(buffers[{self.plan.slots[op]}], "
                                   f"{op.shape}, np.{op.dtype.name})")
        return name, args, self.comment(op) + note

    def emit(self, op):
        name = self.name_of(op)
        if isinstance(op, Placeholder):
            return
        if isinstance(op, Variable):
            self.variables.append(op)
            self.bind_lines.append(f"{name} = variables[{len(self.variables) - 1}]")
            return
        if isinstance(op, Constant):
            if op.value.ndim > 0:       # a scalar is written as a literal where it is read
                self.constants.append(op.value)
                self.bind_lines.append(f"{name} = constants[{len(self.constants) - 1}]"
                                       f"{self.comment(op)}")
            return
        args = [self.name_of(a) for a in op.args]
        if op in self.bind_views:
            # The same view at every call: made once (a view costs NumPy about half a
            # microsecond, and a GIN-0 step has 170 of them).
            self.bind_lines += [s + self.comment(op) for s in
                                self.codegen.generate_op(op, self.name_of(op), args)]
            return
        if isinstance(op, Assign):
            variable, value = args
            if value != variable and self.native_kernels and \
                    (self.bound_at_bind(op.args[1]) or op.args[1] in self.bind_views):
                # Landing last, with the others, in one C call (native.prepare_copies).
                self.native_copies.append((variable, value, self.comment(op)))
            elif value != variable:          # else computed in place (memory plan)
                self.deferred.append(f"np.copyto({variable}, {value}){self.comment(op)}, "
                                     "landing last")
            self.names[op] = variable
            return
        name, args, comment = self.bind_value(op)
        statements = self.codegen.generate_op(op, name, args)
        if self.native_kernels and statements[0].startswith("N.") and \
                all(self.bound_at_bind(a) for a in [*op.args, op]):
            # A native kernel over arrays bound once: its call is prepared there too.
            call = "call" + name[1:]
            self.bind_lines.append(f"{call} = N.prepare({op.kernel!r}, " +
                                   statements[0][len(f"N.{op.kernel}("):])
            statements = [f"{call}()"]
        elif self.elementwise is not None and len(statements) == 1 and \
                self.bound_at_bind(op) and self.elementwise.accepts(
                    op, [self.bound_at_bind(a) for a in op.args]):
            # An element-wise op in C (native_elementwise.py), its NumPy call kept for
            # arrays that turn out to overlap.
            function = self.elementwise.add(op, op_comment(op, self.value_names))
            arrays = [a for a, arg in zip(args, op.args) if not is_scalar_constant(arg)]
            call = "call" + name[1:]
            self.bind_lines.append(
                f"{call} = N.prepare_elementwise({self.ref('native', self.elementwise)}"
                f".library.{function}, ({''.join(a + ', ' for a in arrays)}), {name}, "
                f"lambda: {statements[0]})")
            statements = [Statement(f"{call}()", comment, [op_comment(op, self.value_names)],
                                    Call(self.elementwise, function),
                                    f"N.call_arguments({call})", name)]
        elif self.segments is not None and self.in_c_product(op):
            # A product made by NumPy's own BLAS from C, in a segment (native_segments.py).
            a, b, *live = args
            count = op.args[2] if live else None
            fed = {"live": (live[0], count.shape, count.dtype)} \
                if isinstance(count, Placeholder) else {}
            arguments = f"{a}, {b}, {name}" + \
                (f", {op.contract}" + ("" if fed else f", {live[0]}") if live else "")
            statements = [Statement(
                statements[0], comment, [op_comment(op, self.value_names)],
                Product(op.dtype, None if count is None else count.dtype,
                        getattr(op, "contract", False), fed),
                f"N.product_arguments({arguments})", name)]
        self.body.extend(s if isinstance(s, Statement) else s + comment for s in statements)
        if self.debug_nans and not op.is_view:
            self.checked_ops.append(op)
            self.body.append(f"K.check_finite(ops[{len(self.checked_ops) - 1}], {name}, "
                             f"({''.join(a + ', ' for a in args)}))")
