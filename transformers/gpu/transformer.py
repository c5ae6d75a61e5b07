"""The GPU transformer: each computation becomes one program of kernels over device buffers.

Pipeline per computation (seed 002's design): the graph passes, then Fusion (its groups),
`KernelPlanning` (one kernel per group output, element-wise producers computed in the
registers of the kernel that reads them) and BufferSharing (the buffers, as for NumPy);
this transformer only lowers that plan: the kernel generator renders one GPUKernel per
planned root from the templates, and a GPUKernelGroup (the executor) uploads parameters,
launches the kernels in order, downloads the results and lands deferred assignments.

Layout ops: a Reshape that is not fused is a view (same buffer, same row-major order);
Transpose, Broadcast and Slice never get storage of their own unless they are results:
their readers index through them.
"""
import functools
from collections import OrderedDict
from functools import lru_cache

import numpy as np
import scipy.sparse

from ngnn.op_graph import Assign, Constant, OneHot, Placeholder, Reshape, Variable
from ngnn.passes import BufferSharing, KernelGroup, KernelPlanning, SplitContractions

from ..base import Computation, DeviceBufferStorage, DeviceTensor, Transformer, buffer_holding
from ..debug_nans import check_finite
from .kernels import GEMM_TILE, ChunkArrivals, GPUKernelGenerator, HostStep
from .runtime import DIALECTS, available_runtimes, get_runtime, template_environment
from .schedule import EdgeSchedule

GRAPH_ARRAYS = ("src", "dst", "in_indptr", "in_eids", "out_indptr", "out_eids")


@lru_cache(maxsize=None)
def shared_runtime(name):
    """One runtime per process and name: device contexts are slow to create, and sharing
    one lets every transformer reuse the programs already built on it."""
    return get_runtime(name)


class BoundedCache(OrderedDict):
    """A dict that keeps its `limit` most recently stored or used entries, so a process
    that builds transformer after transformer does not grow without bound."""

    def __init__(self, limit):
        super().__init__()
        self.limit = limit

    def remember(self, key, make):
        if key in self:
            self.move_to_end(key)
        else:
            self[key] = make()
            while len(self) > self.limit:
                self.popitem(last=False)
        return self[key]


_programs = BoundedCache(256)     # (runtime name, source) -> {kernel name: runtime Kernel}
# The distinct kernels generated in this process, so tests can compile each one for the
# dialect it did not run in (tests/test_nvcc_all_kernels.py).
generated_kernels = BoundedCache(50000)


def build_program(runtime, source, names):
    return _programs.remember((runtime.name, source), lambda: runtime.build(source, names))


def record_kernels(kernels):
    for k in kernels:
        key = (k.template, k.signature, tuple(sorted(k.fields.items())))
        generated_kernels.remember(key, lambda: k)


def graph_of(owner):
    """The graph an index array on the device belongs to (an edge schedule's graph)."""
    return owner.graph if isinstance(owner, EdgeSchedule) else owner


class DeviceMemoryError(MemoryError):
    """A computation needs more device memory than the device has or allows at once."""


class GPUDeviceBufferStorage(DeviceBufferStorage):
    def allocate(self):
        self.buffer = self.transformer.runtime.alloc(self.nbytes)
        self.transformer.storages.append(self)
        self.transformer.count_allocation(self.nbytes)
        return self.buffer

    def free(self):
        self.transformer.runtime.free(self.buffer)
        self.transformer.storages.remove(self)
        self.transformer.count_allocation(-self.nbytes)
        self.buffer = None


def check_device_memory(runtime, requests, in_use):
    """Raises DeviceMemoryError, naming the tensor, the bytes it needs and the limit, when
    the allocations `requests` ((what, bytes) pairs) would exceed the device's largest
    allocation or, with the `in_use` bytes already held, its memory. Checked before
    allocating: drivers answer an oversized request with a bare status code or abort."""
    total, largest = runtime.memory_limits()
    for what, nbytes in requests:
        if nbytes > largest:
            raise DeviceMemoryError(
                f"{what} needs {nbytes} bytes ({nbytes / 2**30:.2f} GiB), more than the "
                f"largest single allocation the device {runtime.device_name!r} allows "
                f"({largest} bytes, {largest / 2**30:.2f} GiB)")
    need = sum(nbytes for _, nbytes in requests)
    if need + in_use > total:
        what, nbytes = max(requests, key=lambda r: r[1])
        raise DeviceMemoryError(
            f"the computation needs {need} bytes of device memory ({need / 2**30:.2f} GiB; "
            f"the largest is {what}, {nbytes} bytes) on top of {in_use} bytes in use, more "
            f"than the {total} bytes ({total / 2**30:.2f} GiB) of the device "
            f"{runtime.device_name!r}")


class GPUDeviceTensor(DeviceTensor):
    @property
    def buffer(self):
        return self.storage.buffer

    def get(self):
        out = np.empty(self.shape, dtype=self.dtype)
        self.storage.transformer.runtime.read(self.buffer, self.offset, out)
        return out

    def set(self, value):
        value = np.asarray(value, dtype=self.dtype)
        if value.size == int(np.prod(self.shape, dtype=np.int64)):
            value = value.reshape(self.shape)    # checked scalars arrive with shape (1,)
        array = np.ascontiguousarray(np.broadcast_to(value, self.shape))
        self.storage.transformer.runtime.write(self.buffer, self.offset, array)

    def view(self, shape):
        return GPUDeviceTensor(self.storage, self.offset, shape, self.dtype)


def new_tensor(transformer, shape, dtype, name, allocate=True):
    """A device tensor of its own buffer, allocated now (or, `allocate=False`, when its
    transient computation becomes resident)."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    storage = GPUDeviceBufferStorage(transformer, nbytes, name)
    if allocate:
        check_device_memory(transformer.runtime,
                            [(f"tensor {name!r} {tuple(shape)} {dtype}", nbytes)],
                            sum(storage.nbytes for storage in transformer.storages))
        storage.allocate()
    return GPUDeviceTensor(storage, 0, shape, dtype)


def render_program(kernels, dialect):
    if dialect not in DIALECTS:
        raise ValueError(f"unknown kernel dialect {dialect!r}; expected one of {DIALECTS}")
    fp64 = any(k.uses_double for k in kernels)
    parts = [{"comment": f"{k.name}: {k.op.op_name} {list(k.op.shape)} {k.op.dtype}",
              "text": k.render(dialect)} for k in kernels]
    return template_environment().get_template("program.j2").render(
        dialect=dialect, fp64=fp64, kernels=parts)


def kernel_roots(step):
    """The ops a step launches a kernel for: a kernel group's outputs, or an op that is a
    kernel by itself (anything but a leaf, a view or an assignment)."""
    if isinstance(step, KernelGroup):
        return step.outputs
    if isinstance(step, (Placeholder, Variable, Constant, Assign, Reshape)):
        return []
    return [step]


class SparseInput:
    """The device arrays of a sparse placeholder's value, uploaded on each call: its CSR
    (indptr, indices, data) for X @ W, and its CSC (colptr, rowidx, plus perm, the CSR slot
    of each CSC slot) for X^T @ D. A call whose matrix has the structure of the last one
    (a Trainer feeds the same features every step) uploads only its values. Buffers grow
    when a call brings more stored values."""

    PARTS = ("indptr", "indices", "data", "colptr", "rowidx", "perm")

    def __init__(self, transformer, placeholder):
        self.transformer = transformer
        self.placeholder = placeholder
        self.buffers = {}
        self.structure = None       # (indptr, indices) of the last upload
        transformer.sparse_inputs.append(self)

    def free(self):
        for buffer in self.buffers.values():
            self.transformer.runtime.free(buffer)
            self.transformer.count_allocation(-buffer.nbytes)
        self.buffers, self.structure = {}, None

    def set(self, matrix):
        arrays = {"data": matrix.data}
        if self.structure is None or not all(
                np.array_equal(a, b) for a, b in zip(self.structure, (matrix.indptr,
                                                                      matrix.indices))):
            # SciPy's CSR to CSC conversion, on the CSR slot numbers, is the stable O(nnz)
            # column sort: its values are perm, its row indices rowidx.
            slots = scipy.sparse.csr_matrix(
                (np.arange(matrix.nnz, dtype=np.int32), matrix.indices, matrix.indptr),
                shape=matrix.shape).tocsc()
            arrays.update(indptr=matrix.indptr, indices=matrix.indices, colptr=slots.indptr,
                          rowidx=slots.indices, perm=slots.data)
            self.structure = (matrix.indptr.copy(), matrix.indices.copy())
        runtime = self.transformer.runtime
        for part, array in arrays.items():
            array = np.ascontiguousarray(array, dtype=self.placeholder.dtype
                                         if part == "data" else np.int32)
            buffer = self.buffers.get(part)
            if buffer is None or buffer.nbytes < array.nbytes:
                if buffer is not None:
                    runtime.free(buffer)
                    self.transformer.count_allocation(-buffer.nbytes)
                buffer = self.buffers[part] = runtime.alloc(max(array.nbytes, 4))
                self.transformer.count_allocation(buffer.nbytes)
            if array.nbytes:
                runtime.write(buffer, 0, array)


class GPUKernelGroup:
    """The executor: `kernels` in launch order; called with the parameter values and the
    call number."""

    def __init__(self, transformer, kernels, launches, parameters, results, deferred,
                 label_checks, storages):
        self.transformer = transformer
        self.kernels = kernels
        self.planned = launches             # (kernel, global, local, args) or (host step, None...)
        self.parameters = parameters        # DeviceTensors, in call order
        self.results = results              # DeviceTensors to download
        self.deferred = deferred            # (value tensor, variable tensor)
        self.label_checks = label_checks    # (parameter index, classes): before the upload
        self.storages = storages            # allocated when resident (a transient computation)
        self.launches = None

    def bind(self):
        """The launches with the device buffers their tensors now hold."""
        self.launches = [(kernel, global_size, local_size,
                          bound and [a.buffer if isinstance(a, GPUDeviceTensor) else a
                                     for a in bound], checks)
                         for kernel, global_size, local_size, bound, checks in self.planned]

    def __call__(self, *args):
        *values, step = args
        runtime = self.transformer.runtime
        for index, classes in self.label_checks:
            check_labels(values[index], classes)
        for tensor, value in zip(self.parameters, values):
            tensor.set(value)
        self.transformer.refresh_graphs()
        # Checks of a launch's output (computed class ids, debug_nans) run right after it,
        # while its inputs are intact and before any assignment lands.
        for kernel, global_size, local_size, bound, checks in self.launches:
            if global_size is None:
                kernel()            # a host step (communication between ranks)
                continue
            call_args = [np.uint32(step) if a is None else
                         a[0].buffers[a[1]] if isinstance(a, tuple) else a for a in bound]
            runtime.launch(kernel, global_size, local_size, call_args)
            for check in checks:
                check()
        # Assignments land after every kernel, so every read saw the old values; a variable
        # among the results then reads as its new value, as on the NumPy transformer.
        for value, variable in self.deferred:
            runtime.copy(variable.buffer, variable.offset, value.buffer, value.offset,
                         variable.nbytes)
        return [tensor.get() for tensor in self.results]


def check_output(op, out, inputs):
    """debug_nans: `op`'s output, right after its kernel ran, with its arguments' values
    for the report (a sparse argument's values stay on the device)."""
    if op.dtype.kind == "f":
        check_finite(op, out.get(), [np.empty(0) if t is None else t.get() for t in inputs])


def check_labels(labels, classes):
    """The NumPy transformer's one-hot error, checked on the host before the upload."""
    bad = labels[(labels < 0) | (labels >= classes)]
    if bad.size:
        raise ValueError(f"one_hot: class id {bad.flat[0]} is outside [0, {classes})")


class GPUComputation(Computation):
    def source_for(self, dialect):
        """The computation's kernels rendered for `dialect` ("cuda" or "opencl")."""
        self.transform()
        return render_program(self.executor.kernels, dialect)


class GPUTransformer(Transformer):
    """make_transformer("gpu", runtime=None | "cuda" | "opencl"): None picks CUDA when an
    NVIDIA device is present, else OpenCL."""

    name = "gpu"
    computation_class = GPUComputation

    def __init__(self, runtime=None, **options):
        super().__init__(**options)
        if runtime is None:
            available = available_runtimes()
            runtime = available[0] if available else None
        self.runtime = shared_runtime(runtime) if runtime is not None else get_runtime()
        self.constant_tensors = {}
        self.graph_tensors = {}
        self.storages = []       # every allocation, freed by close()
        self.sparse_inputs = []  # their buffers too
        self.uploaded_versions = {}     # (GraphSlot, attribute) -> version on the device

    def is_view(self, op):
        return isinstance(op, Reshape)

    def late_passes(self):
        # Every graph op runs inside a group's kernels, lone ones in groups of their own;
        # fusion=False gives one kernel per op, and so does debug_nans, which checks each
        # op's output.
        return self.fusion_passes(single_ops=True, vertex_gathers=True) + \
            [KernelPlanning(inline=self.fusion and not self.debug_nans), BufferSharing()]

    def graph_passes(self):
        # Long products are split for the device's work-groups, except where the user's ops
        # are to be seen whole: debug_nans names them, and a chunked program splits its
        # row reductions by blocks itself.
        split = self.optimize and not self.debug_nans and self.memory_budget is None
        return super().graph_passes() + ([SplitContractions(tile=GEMM_TILE)] if split else [])

    def inplace_ok(self, op):
        return False      # kernel arguments are declared restrict: never out and in at once

    def hold_graphs(self, graphs):
        """Allocates the index arrays of `graphs` (slots) again; refresh_graphs uploads
        them before the next launch."""
        for key, tensor in self.graph_tensors.items():
            if graph_of(key[0]) in graphs and tensor.storage.buffer is None:
                tensor.storage.allocate()
                self.uploaded_versions[key] = None

    def drop_graphs(self, graphs):
        for key, tensor in self.graph_tensors.items():
            if graph_of(key[0]) in graphs and tensor.storage.buffer is not None:
                tensor.storage.free()

    def acquire(self, computation):
        for storage in computation.executor.storages:
            storage.allocate()
        computation.executor.bind()

    def release(self, computation):
        for storage in computation.executor.storages:
            storage.free()
        computation.executor.launches = None

    def allocate_variable(self, variable):
        return new_tensor(self, variable.shape, variable.dtype, variable.name)

    def constant_tensor(self, op):
        if op not in self.constant_tensors:
            tensor = new_tensor(self, op.shape, op.dtype, op.name)
            tensor.set(op.value)
            self.constant_tensors[op] = tensor
        return self.constant_tensors[op]

    def graph_tensor(self, graph, attribute):
        """A graph's index array on the device, as int32 (uploaded once per graph, and again
        when a GraphSlot has been loaded with new edges: see refresh_graphs)."""
        key = (graph, attribute)
        if key not in self.graph_tensors:
            array = np.asarray(getattr(graph, attribute))
            self.graph_tensors[key] = new_tensor(self, array.shape, np.int32, attribute)
            self.graph_tensors[key].set(array.astype(np.int32))
            if graph.varies:
                self.uploaded_versions[key] = graph.version
        return self.graph_tensors[key]

    def allocation_requests(self, computation, kernels, memory):
        """(what, bytes) of every allocation the computation is about to make."""
        plan = computation.kernel_plan
        requests = [(buffer_holding(memory, i), nbytes)
                     for i, nbytes in enumerate(memory.buffer_bytes)]
        requests += [(f"placeholder {p}", p.nbytes) for p in computation.parameters
                     if not p.is_sparse]      # a sparse value's size is known when fed
        leaves = {plan.base(t) for k in kernels for t in k.inputs}
        requests += [(f"variable {v}", v.nbytes) for v in computation.variables
                     if v not in self.variable_tensors]
        requests += [(f"constant {c}", c.nbytes) for c in leaves
                     if isinstance(c, Constant) and c not in self.constant_tensors]
        graphs = {b[1:] for k in kernels for b in k.bindings if b[0] == "graph"}
        requests += [(f"the graph's {attribute}", 4 * np.asarray(getattr(graph, attribute)).size)
                     for graph, attribute in graphs if (graph, attribute) not in self.graph_tensors]
        requests += [(f"scratch {b[1]}", b[1].nbytes)
                     for k in kernels for b in k.bindings if b[0] == "scratch"]
        return requests

    def close(self):
        """Frees every device buffer of this transformer now."""
        if not self.closed:
            for storage in self.storages:
                self.runtime.free(storage.buffer)
            for sparse in self.sparse_inputs:
                sparse.free()
            self.storages, self.sparse_inputs = [], []
            self.variable_tensors, self.constant_tensors, self.graph_tensors = {}, {}, {}
            for comp in self.computations:
                comp.executor = None
            self.resident = None
        super().close()

    def refresh_graphs(self):
        """Uploads the index arrays of slots loaded since their last upload (same sizes,
        same device buffers, so the compiled kernels stay valid)."""
        for key, version in self.uploaded_versions.items():
            graph, attribute = key
            if graph.version != version:
                self.graph_tensors[key].set(np.asarray(getattr(graph, attribute), np.int32))
                self.uploaded_versions[key] = graph.version

    def transform_ordered_ops(self, computation):
        plan = computation.kernel_plan
        generator = GPUKernelGenerator(plan)
        kernels = [k for step in plan.steps
                   for k in generator.kernels_for(step, kernel_roots(step))]
        assigns = [op for op in computation.ordered_ops if isinstance(op, Assign)]
        memory = computation.memory_plan
        now = not computation.transient      # else allocated when resident
        if now:
            check_device_memory(self.runtime,
                                self.allocation_requests(computation, kernels, memory),
                                sum(storage.nbytes for storage in self.storages))
        buffers = [GPUDeviceBufferStorage(self, nbytes, f"buffer{i}")
                   for i, nbytes in enumerate(memory.buffer_bytes)]
        placeholders = {p: SparseInput(self, p) if p.is_sparse else
                        new_tensor(self, p.shape, p.dtype, p.name, allocate=now)
                        for p in computation.parameters}
        transient = buffers + [t.storage for t in placeholders.values()
                               if isinstance(t, GPUDeviceTensor)]
        # The partial results of heavy rows' chunks, one buffer per reduction.
        scratch = {b[1]: new_tensor(self, b[1].shape, b[1].dtype, "partials")
                   for k in kernels for b in k.bindings if b[0] == "scratch"}
        for buffer, tensor in scratch.items():
            if isinstance(buffer, ChunkArrivals):
                tensor.set(np.zeros(buffer.shape, np.int32))    # counts start at zero
        for storage in buffers if now else []:
            storage.allocate()

        def tensor_of(op):
            if isinstance(op, Assign):
                return tensor_of(op.args[1])
            base = plan.base(op)
            if isinstance(base, Placeholder):
                tensor = placeholders[base]
            elif isinstance(base, Variable):
                tensor = self.variable_tensor(base)
            elif isinstance(base, Constant):
                tensor = self.constant_tensor(base)
            elif base in memory.into_variable:     # an update written in place
                tensor = self.variable_tensor(memory.into_variable[base])
            else:
                tensor = GPUDeviceTensor(buffers[memory.slots[base]], 0, base.shape, base.dtype)
            return tensor.view(op.shape)

        steps, kernels = kernels, [k for k in kernels if not isinstance(k, HostStep)]
        record_kernels(kernels)
        source = render_program(kernels, self.runtime.dialect)
        built = build_program(self.runtime, source, [k.name for k in kernels])
        computed_labels = {plan.base(op.args[0]): op.num_classes
                           for op in computation.ordered_ops
                           if isinstance(op, OneHot) and op.args[0] not in placeholders}
        launches = []
        for k in steps:
            if isinstance(k, HostStep):
                launches.append((k.bind(tensor_of(k.op.args[0]), tensor_of(k.op)), None, None,
                                 None, []))
                continue
            if not all(k.global_size):
                continue              # an empty tensor: nothing to compute
            checks = []         # of the ops a kernel writes (a partial kernel: none)
            for op in k.outputs:
                if op in computed_labels:
                    checks.append(functools.partial(
                        lambda out, classes: check_labels(out.get(), classes),
                        tensor_of(op), computed_labels[op]))
                if self.debug_nans:
                    checks.append(functools.partial(check_output, op, tensor_of(op),
                                                    [None if a.is_sparse else tensor_of(a)
                                                     for a in op.args]))
            bound = []
            for binding in k.bindings:
                if binding[0] in ("out", "tensor"):
                    bound.append(tensor_of(binding[1]))
                elif binding[0] == "graph":
                    bound.append(self.graph_tensor(*binding[1:]))
                elif binding[0] == "scratch":
                    bound.append(scratch[binding[1]])
                elif binding[0] == "sparse":
                    bound.append((placeholders[binding[1]], binding[2]))   # set per call
                else:
                    bound.append(None)      # the call number, known at launch
            launches.append((built[k.name], k.global_size, k.local_size, bound, checks))
        label_checks = [(computation.parameters.index(op.args[0]), op.num_classes)
                        for op in computation.ordered_ops
                        if isinstance(op, OneHot) and op.args[0] in placeholders]
        computation.executor = GPUKernelGroup(
            self, kernels, launches, [placeholders[p] for p in computation.parameters],
            [tensor_of(r) for r in computation.results],
            [(tensor_of(a.args[1]), self.variable_tensor(a.args[0])) for a in assigns
             if plan.base(a.args[1]) not in memory.into_variable],
            label_checks, [] if now else transient)
        if now:
            computation.executor.bind()
        computation._source = source
