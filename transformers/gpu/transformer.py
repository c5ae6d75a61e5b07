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
from ngnn.passes import (BufferSharing, FactorProducts, KernelGroup, KernelPlanning,
                         SplitContractions, UnshareBroadcasts)

from ..base import (Computation, DeviceBufferStorage, DeviceTensor, Resident, Transformer,
                    buffer_holding)
from ..debug_nans import check_finite
from .kernels import GEMM_TILE, ChunkArrivals, GPUKernelGenerator, HostStep
from .report import kernel_report
from .runtime import DIALECTS, available_runtimes, get_runtime, template_environment
from .runtime.base import DeviceMemoryError, check_allocation_size
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


class GPUDeviceBufferStorage(DeviceBufferStorage):
    """`name` says what the buffer holds ("tensor 'x' (4, 3) float32", "the intermediate
    buffer of <Dot ...>"), for the runtime's DeviceMemoryError."""

    def allocate(self):
        self.buffer = self.transformer.runtime.alloc(self.nbytes, self.name)
        self.transformer.storages.append(self)
        self.transformer.count_allocation(self.nbytes)
        return self.buffer

    def free(self):
        self.transformer.runtime.free(self.buffer)
        self.transformer.storages.remove(self)
        self.transformer.count_allocation(-self.nbytes)
        self.buffer = None

    def owned(self):
        """The buffer this storage allocated (and frees)."""
        return self.buffer


class ParameterStorage(GPUDeviceBufferStorage):
    """A dense placeholder's device memory. A call fed a NumPy array writes it to the
    placeholder's own buffer, allocated by the first such call (a placeholder only ever fed
    resident values never has one); a call fed a resident value points the placeholder at
    that value's buffer, which the kernels read in place. `version` changes whenever the
    buffer kernels must read changes, so the executor rebinds its launches only then."""

    def __init__(self, transformer, nbytes, name):
        super().__init__(transformer, nbytes, name)
        self.buffer = self.own = None
        self.version = 0

    def allocate(self):
        self.own = super().allocate()
        self.version += 1
        return self.own

    def free(self):
        self.buffer = self.own
        super().free()
        self.own = None
        self.version += 1

    def owned(self):
        return self.own

    def feed(self, value):
        """Makes `value` (a checked NumPy array, or a GPUResident) what the kernels read."""
        if isinstance(value, GPUResident):
            target = value.buffer
        else:
            if self.own is None:
                self.allocate()
            self.transformer.runtime.write(self.own, 0, value)
            target = self.own
        if target is not self.buffer:
            self.buffer = target
            self.version += 1


def check_device_memory(runtime, requests, in_use):
    """Raises DeviceMemoryError, naming the tensor, the bytes it needs and the limit, when
    the allocations `requests` ((what, bytes) pairs) would exceed the device's largest
    allocation or, with the `in_use` bytes already held, its memory. Checked before
    allocating: drivers answer an oversized request with a bare status code or abort."""
    for what, nbytes in requests:
        check_allocation_size(runtime, what, nbytes)
    total, _ = runtime.memory_limits()
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
    storage = GPUDeviceBufferStorage(transformer, nbytes, f"tensor {name!r} {tuple(shape)} {dtype}")
    if allocate:
        check_device_memory(transformer.runtime, [(storage.name, nbytes)],
                            sum(storage.nbytes for storage in transformer.storages))
        storage.allocate()
    return GPUDeviceTensor(storage, 0, shape, dtype)


def render_program(kernels, dialect):
    if dialect not in DIALECTS:
        raise ValueError(f"unknown kernel dialect {dialect!r}; expected one of {DIALECTS}")
    fp64 = any(k.uses_double for k in kernels)
    parts = [{"comment": k.comment, "text": k.render(dialect)} for k in kernels]
    return template_environment().get_template("program.j2").render(
        dialect=dialect, fp64=fp64, kernels=parts)


def kernel_roots(step):
    """The ops a step launches a kernel for: a kernel group's outputs, or an op that is a
    kernel by itself (anything but a leaf, a view or an assignment)."""
    if isinstance(step, KernelGroup):
        return step.outputs
    if step.is_leaf or isinstance(step, (Assign, Reshape)):
        return []
    return [step]


def sparse_structure(matrix):
    """The int32 structure arrays the sparse kernels read: the CSR's indptr and indices for
    X @ W, and the CSC's colptr and rowidx, plus perm, the CSR slot of each CSC slot, for
    X^T @ D. SciPy's CSR to CSC conversion of the CSR slot numbers is the stable O(nnz)
    column sort: its values are perm, its row indices rowidx."""
    slots = scipy.sparse.csr_matrix(
        (np.arange(matrix.nnz, dtype=np.int32), matrix.indices, matrix.indptr),
        shape=matrix.shape).tocsc()
    arrays = dict(indptr=matrix.indptr, indices=matrix.indices, colptr=slots.indptr,
                  rowidx=slots.indices, perm=slots.data)
    return {part: np.ascontiguousarray(a, dtype=np.int32) for part, a in arrays.items()}


class SparseInput:
    """The device arrays of a sparse placeholder's value (`sparse_structure` and the
    values, "data"). A call fed a matrix uploads them to the placeholder's own buffers, all
    of them when its structure differs from the last one's, else only its values; buffers
    grow when a call brings more stored values. A call fed a resident matrix points the
    kernels at its buffers (`current`); `version` changes whenever those change."""

    PARTS = ("indptr", "indices", "data", "colptr", "rowidx", "perm")

    def __init__(self, transformer, placeholder):
        self.transformer = transformer
        self.placeholder = placeholder
        self.buffers = {}
        self.current = {}           # what kernels read: self.buffers or a resident's
        self.version = 0
        self.structure = None       # (indptr, indices) of the last upload
        transformer.sparse_inputs.append(self)

    def free(self):
        for buffer in self.buffers.values():
            self.transformer.runtime.free(buffer)
            self.transformer.count_allocation(-buffer.nbytes)
        self.buffers, self.current, self.structure = {}, {}, None
        self.version += 1

    def feed(self, value):
        """Makes `value` (a checked CSR matrix, or a GPUResident) what the kernels read."""
        if isinstance(value, GPUResident):
            target = value.buffers
        else:
            self.set(value)
            target = self.buffers
        if target is not self.current:
            self.current = target
            self.version += 1

    def set(self, matrix):
        arrays = {"data": np.ascontiguousarray(matrix.data, dtype=self.placeholder.dtype)}
        if self.structure is None or not all(
                np.array_equal(a, b) for a, b in zip(self.structure, (matrix.indptr,
                                                                      matrix.indices))):
            arrays.update(sparse_structure(matrix))
            self.structure = (matrix.indptr.copy(), matrix.indices.copy())
        runtime = self.transformer.runtime
        for part, array in arrays.items():
            buffer = self.buffers.get(part)
            if buffer is None or buffer.nbytes < array.nbytes:
                if buffer is not None:
                    runtime.free(buffer)
                    self.transformer.count_allocation(-buffer.nbytes)
                buffer = self.buffers[part] = runtime.alloc(
                    max(array.nbytes, 4), f"the {part} of sparse placeholder {self.placeholder}")
                self.transformer.count_allocation(buffer.nbytes)
                self.version += 1
            if array.nbytes:
                runtime.write(buffer, 0, array)


class GPUResident(Resident):
    """A resident value on the device: uploaded once, into buffers of its own (`buffer`
    for a dense array; for a CSR matrix `buffers`, the parts SparseInput uploads), which
    the kernels of every call fed this value read in place."""

    def __init__(self, transformer, value, dtype=None):
        super().__init__(transformer, value, dtype)
        arrays = dict(sparse_structure(self.value), data=self.value.data) \
            if self.is_sparse else {"value": self.value}
        runtime = transformer.runtime
        check_device_memory(runtime, [(f"resident value {self.shape} {self.dtype}",
                                       sum(a.nbytes for a in arrays.values()))],
                            transformer.device_allocated)
        self.buffers = {}
        for part, array in arrays.items():
            self.buffers[part] = runtime.alloc(array.nbytes)
            transformer.count_allocation(array.nbytes)
            runtime.write(self.buffers[part], 0, np.ascontiguousarray(array))
        self.buffer = self.buffers.get("value")
        self.value = None           # the device holds it now
        transformer.residents.append(self)

    def fed(self):
        return self

    def free(self):
        """Gives the device memory back; feeding the value afterwards is an error."""
        if not self.freed:
            for buffer in self.buffers.values():
                self.transformer.runtime.free(buffer)
                self.transformer.count_allocation(-buffer.nbytes)
            self.transformer.residents.remove(self)
        super().free()


class HostLaunch:
    """A host step (communication between ranks) in the sequence of launches."""

    def __init__(self, run):
        self.run = run

    def seconds(self):
        return None


class GPUKernelGroup:
    """The executor: `kernels` in launch order; called with the parameter values and the
    call number.

    `bind` prepares every launch once (Runtime.prepare: geometry checked, argument buffers
    resolved); a call then only feeds its parameters, sets the call number where dropout
    reads it, and runs the prepared launches in order. A parameter whose device buffer
    changed (a resident value fed in place of an array, or the other way round) has just
    its own arguments rebound."""

    def __init__(self, transformer, kernels, launches, parameters, results, deferred,
                 label_checks, storages, groups):
        self.transformer = transformer
        self.kernels = kernels
        self.planned = launches             # (GPUKernel, built kernel, global, local, args,
        #                                     checks), or (HostStep, its function, None...)
        self.parameters = parameters        # ParameterStorage or SparseInput, in call order
        self.results = results              # DeviceTensors to download
        self.deferred = deferred            # (value tensor, variable tensor)
        self.label_checks = label_checks    # (parameter index, classes): before the upload
        self.storages = storages            # allocated when resident (a transient computation)
        self.groups = groups                # root op -> name of the fused group computing it
        self.launches = None                # (GPUKernel, PreparedLaunch), in launch order
        self.called = False

    def bind(self):
        """Prepares the launches with the device buffers their tensors now hold."""
        runtime, timed = self.transformer.runtime, self.transformer.time_kernels
        index_of = {id(source): i for i, source in enumerate(self.parameters)}
        self.parameter_slots = [[] for _ in self.parameters]   # (launch, argument, part)
        self.step_slots = []                                   # (launch, argument)
        self.launches, self.sequence = [], []
        for kernel, built, global_size, local_size, bound, checks in self.planned:
            if global_size is None:
                self.sequence.append((HostLaunch(built), checks))
                continue
            args, slots = [], []
            for position, a in enumerate(bound):
                if a is None:                       # the call number, set per call
                    slots.append((self.step_slots, position, None))
                    args.append(np.uint32(0))
                elif isinstance(a, tuple):          # (SparseInput, part)
                    slots.append((self.parameter_slots[index_of[id(a[0])]], position, a[1]))
                    args.append(a[0].current.get(a[1]))
                else:
                    if id(a.storage) in index_of:
                        slots.append((self.parameter_slots[index_of[id(a.storage)]],
                                      position, None))
                    args.append(a.buffer)
            launch = runtime.prepare(built, global_size, local_size, args, timed)
            for where, position, part in slots:
                where.append((launch, position) if where is self.step_slots else
                             (launch, position, part))
            self.launches.append((kernel, launch))
            self.sequence.append((launch, checks))
        self.bound_versions = [source.version for source in self.parameters]
        self.called = False

    def rebind(self, index):
        """Points parameter `index`'s arguments at the buffers it holds now."""
        source = self.parameters[index]
        for launch, position, part in self.parameter_slots[index]:
            launch.set_arg(position, source.current[part] if part else source.buffer)
        self.bound_versions[index] = source.version

    def __call__(self, *args):
        *values, step = args
        for index, classes in self.label_checks:
            check_labels(values[index], classes)
        for index, (source, value) in enumerate(zip(self.parameters, values)):
            source.feed(value)
            if source.version != self.bound_versions[index]:
                self.rebind(index)
        self.transformer.refresh_graphs()
        call = np.uint32(step)
        for launch, position in self.step_slots:
            launch.set_arg(position, call)
        # Checks of a launch's output (computed class ids, debug_nans) run right after it,
        # while its inputs are intact and before any assignment lands.
        for launch, checks in self.sequence:
            launch.run()
            for check in checks:
                check()
        self.called = True
        # Assignments land after every kernel, so every read saw the old values; a variable
        # among the results then reads as its new value, as on the NumPy transformer.
        runtime = self.transformer.runtime
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
    """The NumPy transformer's one-hot error, checked on the host before the upload (a
    resident value's range was taken when it was made)."""
    if isinstance(labels, Resident):
        bad = labels.class_id_outside(classes)
    else:
        outside = labels[(labels < 0) | (labels >= classes)]
        bad = outside.flat[0] if outside.size else None
    if bad is not None:
        raise ValueError(f"one_hot: class id {bad} is outside [0, {classes})")


class GPUComputation(Computation):
    def source_for(self, dialect):
        """The computation's kernels rendered for `dialect` ("cuda" or "opencl")."""
        self.transform()
        return render_program(self.executor.kernels, dialect)

    def kernel_report(self):
        """One dict per kernel, in launch order: what it is ("name", "values": the IR
        names of the values it computes, "template", "group": the fused group it runs, or
        None), what one call launches ("launches",
        "work_groups"), the most and the mean edges one work-group walks ("max_edges",
        "mean_edges"; None without an edge loop), the global memory it moves per call
        ("global_bytes", GPUKernel.global_bytes) and its device time in the last call
        ("seconds": None before a call, or where the runtime does not time launches)."""
        self.transform()
        if self.chunked:
            raise ValueError(f"kernel_report: computation {self.name!r} runs chunk by chunk "
                             "(memory_budget); its stages are computations of their own")
        if self.executor.launches is None:       # a transient computation not running now
            raise ValueError(f"kernel_report: computation {self.name!r} holds no device "
                             "memory now (memory_budget); call it first")
        return kernel_report(self.executor)


class GPUTransformer(Transformer):
    """make_transformer("gpu", runtime=None | "cuda" | "opencl"): None picks CUDA when an
    NVIDIA device is present, else OpenCL. `time_kernels=True` times every launch where
    that costs extra (CUDA events), for `kernel_report`; OpenCL's launches are timed
    anyway."""

    name = "gpu"
    computation_class = GPUComputation
    resident_class = GPUResident
    extra_options = ("runtime", "time_kernels")      # named so a misspelling is suggested

    def __init__(self, runtime=None, time_kernels=False, **options):
        super().__init__(**options)
        # Kernel times where they cost extra (CUDA events around each launch); OpenCL's
        # profiling events time every launch anyway.
        self.time_kernels = bool(time_kernels)
        if runtime is None:
            available = available_runtimes()
            runtime = available[0] if available else None
        self.runtime = shared_runtime(runtime) if runtime is not None else get_runtime()
        self.constant_tensors = {}
        self.graph_tensors = {}
        self.storages = []       # every allocation, freed by close()
        self.sparse_inputs = []  # their buffers too
        self.residents = []      # resident values, freed by close() or their own free()
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
        # A weight used twice (GATConv's `fc`, on a vertex and on its neighbours) gets its
        # gradient as one product over the summed gradients, not two over every vertex: a
        # GPU is bound by the bytes a product reads.
        split = self.optimize and not self.debug_nans and not self.chunking
        return super().graph_passes() + \
            ([FactorProducts(), UnshareBroadcasts()] if self.optimize else []) + \
            ([SplitContractions(tile=GEMM_TILE)] if split else [])

    def decomposes(self):
        return True       # no kernels of batch norm's own: element-wise ops and reductions

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

    def transferred(self):
        return dict(self.runtime.transferred)

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
                self.runtime.free(storage.owned())
            for sparse in self.sparse_inputs:
                sparse.free()
            for resident in list(self.residents):
                resident.free()
            self.storages, self.sparse_inputs = [], []
            self.variable_tensors, self.constant_tensors, self.graph_tensors = {}, {}, {}
            for comp in self.computations:
                comp.executor = None
            self.memory_holder = None
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
        generator = GPUKernelGenerator(plan, computation.results, computation.value_names)
        kernels = [k for step in plan.steps
                   for k in generator.kernels_for(step, kernel_roots(step))]
        assigns = [op for op in computation.ordered_ops if isinstance(op, Assign)]
        memory = computation.memory_plan
        now = not computation.transient      # else allocated when resident
        if now:
            check_device_memory(self.runtime,
                                self.allocation_requests(computation, kernels, memory),
                                sum(storage.nbytes for storage in self.storages))
        buffers = [GPUDeviceBufferStorage(self, nbytes, buffer_holding(memory, i))
                   for i, nbytes in enumerate(memory.buffer_bytes)]
        # A dense placeholder's own buffer is allocated when a call first feeds it an array
        # (a transient computation's when it becomes resident).
        placeholders = {p: SparseInput(self, p) if p.is_sparse else
                        GPUDeviceTensor(ParameterStorage(self, p.nbytes, p.name), 0, p.shape,
                                        p.dtype)
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
                run = k.bind([tensor_of(a) for a in k.op.args], tensor_of(k.op))
                launches.append((k, run, None, None, None, []))
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
            launches.append((k, built[k.name], k.global_size, k.local_size, bound, checks))
        label_checks = [(computation.parameters.index(op.args[0]), op.num_classes)
                        for op in computation.ordered_ops
                        if isinstance(op, OneHot) and op.args[0] in placeholders]
        # The fused group each kernel runs, by the op it computes (an output, or the
        # reduction a partial kernel folds), for kernel_report.
        groups = {op: step.name for step in plan.steps if isinstance(step, KernelGroup)
                  for op in [*step.outputs, *step.ops]}
        computation.executor = GPUKernelGroup(
            self, kernels, launches,
            [placeholders[p] if p.is_sparse else placeholders[p].storage
             for p in computation.parameters],
            [tensor_of(r) for r in computation.returned_results],
            [(tensor_of(a.args[1]), self.variable_tensor(a.args[0])) for a in assigns
             if plan.base(a.args[1]) not in memory.into_variable],
            label_checks, [] if now else transient, groups)
        if now:
            computation.executor.bind()
        computation._source = source
