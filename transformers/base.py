"""The transformer base (ngraph's design, seed 002).

A Transformer owns computations, the pass pipeline, the device buffers of variables and
the init computation that writes their initial values. A Computation is a set of results
and the placeholders fed at call time; `transform()` runs the passes, orders the ops,
plans memory and hands the ordered ops to the transformer, which sets `executor`.

Computations may be created at any time, before or after the first call: each one is
transformed on first use, and variables it introduces are initialized then.
"""
import difflib

import numpy as np
import scipy.sparse

from ngnn.op_graph import Assign, Cast, Constant, Op, Placeholder, Variable, ordered_ops
from ngnn.op_graph.picture import Snapshot
from ngnn.op_graph.sparse import check_sparse_value
from ngnn.op_graph.printer import IRNames, format_ir
from ngnn.origin import built_for


class DeviceBufferStorage:
    """One device allocation serving one or more tensors (at offsets, over time)."""

    def __init__(self, transformer, nbytes, name):
        self.transformer = transformer
        self.nbytes = int(nbytes)
        self.name = name

    def allocate(self):
        raise TypeError(f"{type(self).__name__} must implement allocate()")


class DeviceTensor:
    """A view (offset, shape, strides, dtype) on a DeviceBufferStorage."""

    def __init__(self, storage, offset, shape, dtype, strides=None):
        self.storage = storage
        self.offset = int(offset)
        self.shape = tuple(shape)
        self.dtype = np.dtype(dtype)
        self.strides = strides or _contiguous_strides(self.shape, self.dtype.itemsize)

    @property
    def nbytes(self):
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    def get(self):
        """A NumPy copy of the tensor."""
        raise TypeError(f"{type(self).__name__} must implement get()")

    def set(self, value):
        """Copy a NumPy array (broadcast and cast to this tensor) onto the device."""
        raise TypeError(f"{type(self).__name__} must implement set()")


def buffer_holding(memory, slot):
    """'the intermediate buffer of <op>, ...': what a memory plan's buffer holds, for errors."""
    held = [op for op, s in memory.slots.items() if s == slot]
    more = f" and {len(held) - 3} more" if len(held) > 3 else ""
    return f"the intermediate buffer of {', '.join(map(str, held[:3]))}{more}"


class Resident:
    """A value kept in a transformer's memory, made by `Transformer.resident(value)` and
    fed to any of that transformer's computations in place of the NumPy array (or SciPy CSR
    matrix) it was made from, as often as wanted: the GPU transformer uploads it once and
    its kernels read it in place, so a call fed only resident values sends no input bytes
    to the device. It is a snapshot (changing the array afterwards changes nothing), checked
    once when made: a call checks only its shape, dtype and kind against the placeholder.
    Saying which values stay is the caller's choice, not a guess whether an array changed.
    `free()` gives its memory back before the transformer closes."""

    def __init__(self, transformer, value, dtype=None):
        if scipy.sparse.issparse(value):
            dtype = np.dtype(dtype or value.dtype)
            # A copy: a snapshot, as the dense value's.
            value = check_sparse_value("resident value", value.shape, dtype, value).copy()
            data = value.data
        else:
            if isinstance(value, Resident):
                raise TypeError("resident: the value is resident already")
            value = np.array(value, dtype=dtype, order="C", copy=True)
            data = value
        self.transformer = transformer
        self.value = value             # the snapshot, until a device holds it
        self.shape, self.dtype = tuple(value.shape), np.dtype(data.dtype)
        self.is_sparse = scipy.sparse.issparse(value)
        self.nonfinite = int(data.size - np.count_nonzero(np.isfinite(data))) \
            if self.dtype.kind == "f" else 0
        # The smallest and largest value, for the range checks of class ids.
        self.range = (data.min(), data.max()) if self.dtype.kind in "iu" and data.size else None
        self.freed = False

    def class_id_outside(self, classes):
        """A value outside [0, classes), or None."""
        if self.range is None:
            return None
        low, high = self.range
        return low if low < 0 else high if high >= classes else None

    def free(self):
        self.freed, self.value = True, None

    def fed(self):
        """What the transformer's executor is handed for this value."""
        raise TypeError(f"{type(self).__name__} must implement fed()")

    def check(self, placeholder, name, transformer, check_finite):
        """This value fed to `placeholder` of a computation of `transformer`."""
        if self.transformer is not transformer:
            raise ValueError(f"parameter {name!r}: the resident value was made by another "
                             "transformer; make it with this computation's transformer")
        if self.freed:
            raise ValueError(f"parameter {name!r}: the resident value was freed")
        if placeholder.is_sparse != self.is_sparse:
            kind = "sparse" if placeholder.is_sparse else "dense"
            raise TypeError(f"parameter {name!r} is {kind} and got a "
                            f"{'sparse' if self.is_sparse else 'dense'} resident value")
        if self.shape != placeholder.shape:
            raise ValueError(f"parameter {name!r} expects shape {placeholder.shape}, got a "
                             f"resident value of shape {self.shape}")
        if self.dtype != placeholder.dtype:
            raise TypeError(f"parameter {name!r} expects {placeholder.dtype} values; the "
                            f"resident value holds {self.dtype} (make it with "
                            f"resident(value, dtype=np.{placeholder.dtype}))")
        if check_finite and self.nonfinite:
            raise ValueError(f"parameter {name!r} contains {self.nonfinite} NaN or Inf "
                             "value(s)")
        return self

    def __repr__(self):
        kind = "sparse " if self.is_sparse else ""
        return f"<Resident {kind}{self.shape} {self.dtype} on {self.transformer.name}>"


def _contiguous_strides(shape, itemsize):
    strides, step = [], itemsize
    for dim in reversed(shape):
        strides.append(step)
        step *= max(dim, 1)
    return tuple(reversed(strides))


class Computation:
    def __init__(self, transformer, results, parameters, name=None, updates=()):
        self.transformer = transformer
        self.single = isinstance(results, Op)
        results = [results] if self.single else list(results)
        updates = list(updates)
        for u in updates:
            if not isinstance(u, Assign):
                raise TypeError(f"computation: updates must be ng.assign ops, got {u!r}")
        # Updates run like assignments among the results but return nothing: a training
        # step asks for its loss and no copy of every weight it writes.
        self.returned = len(results)
        results += updates
        for r in results:
            if not isinstance(r, Op):
                raise TypeError(f"computation: results must be ngnn ops, got {r!r}")
            if r.is_sparse:
                raise TypeError(f"computation: result {r} is sparse; results are dense "
                                "tensors (use ng.dot to bring a sparse tensor to dense)")
        for p in parameters:
            if not isinstance(p, Placeholder):
                raise TypeError(f"computation: parameters must be placeholders, got {p!r}")
        if len(set(parameters)) != len(parameters):
            raise ValueError("computation: a placeholder is listed twice among the parameters")
        self._results = results
        self.parameters = list(parameters)
        self.name = name or "computation"
        self.transformed = False
        self.ir_history = []          # (pass name, IR text) after each pass
        self.ir_snapshots = []        # (pass name, picture.Snapshot) after each pass
        self._memory_plan = None
        self.ordered_ops = None
        self.executor = None
        self._source = None
        self.calls = 0
        self.transfer_bytes = {"to_device": 0, "from_device": 0}    # of the last call
        self.transient = False     # holds device memory only while it runs (memory_budget)
        self.stage = False         # a stage of a chunked program (never chunked again)

    @property
    def results(self):
        """Every op the computation runs for: the returned results, then the updates."""
        return [r.forwarded for r in self._results]

    @property
    def returned_results(self):
        """The results a call returns (not the updates)."""
        return self.results[:self.returned]

    # ---- transformation ------------------------------------------------------------------
    def plan(self):
        """Runs the passes (graph passes, fusion, memory planning) without generating
        code: `memory_plan` and the IR are then known."""
        if self.ordered_ops is not None:
            return
        self._record("Trace")
        # Ops the passes build take the origin of the ops they replace (Op.forward).
        with built_for(None):
            for graph_pass in self.transformer.graph_passes():
                graph_pass.do_pass(self)
                self._record(type(graph_pass).__name__)
            self._snapshot_assigned_variables()
        self.ordered_ops = ordered_ops(self.results)
        self._check_parameters()
        self.steps = list(self.ordered_ops)     # ops and fused groups, in execution order
        self.fusion_groups = []
        for late_pass in self.transformer.late_passes():
            late_pass.do_pass(self)
            self._record(type(late_pass).__name__, self.steps)
        self.variables = [op for op in self.ordered_ops if isinstance(op, Variable)]
        if self._memory_plan is not None:
            self._memory_plan.names = self.value_names

    def transform(self):
        if self.transformed:
            return
        self.plan()
        if self.runs_chunked():
            self.executor = self.chunked_program(self)
            self._source = self.executor.source
        else:
            self.transformer.transform_ordered_ops(self)
        self.transformer.compilations += 1
        self.transformed = True

    # What runs a computation chunk by chunk under a memory budget or a chunk count: a
    # class taking the planned computation, whose `wanted(computation)` says when. It is
    # ngnn.out_of_core's ChunkedProgram, which is built on this module and plugged in by
    # transformers/__init__.py, so the base transformer does not depend on it.
    chunked_program = None

    def runs_chunked(self):
        """Whether this computation runs chunk by chunk (docs/out_of_core.md)."""
        t = self.transformer
        if self.stage or not t.chunking:
            return False
        return self.chunked_program.wanted(self)

    @property
    def chunked(self):
        return isinstance(self.executor, self.chunked_program)

    @property
    def stats(self):
        """What the last call did: for a chunked computation (memory_budget) the chunk
        count P, the device's peak allocated bytes, the bytes sent to and from the device
        and the share of transfer time hidden behind computation; else {"chunks": 1}."""
        self.transform()
        return dict(self.executor.stats) if self.chunked else {"chunks": 1}

    def _snapshot_assigned_variables(self):
        """Results, and values assigned, that are (views of) a variable this call assigns
        become copies of it: generated code hands results out and copies assigned values
        after the assignments land (ng.assign(v, w) and ng.assign(w, v) would both see the
        new v), and every read in a call must see the old value. Runs after the passes,
        which would prune the copies."""
        assigned = {r.args[0] for r in self.results if isinstance(r, Assign)}

        def reads_assigned(op):
            while self.transformer.is_view(op):
                op = op.args[0]
            return op in assigned

        for i, r in enumerate(self.results):
            if isinstance(r, Assign):
                variable, value = r.args
                if reads_assigned(value):
                    self._results[i] = Assign(variable, Cast(value, value.dtype))
            elif reads_assigned(r):
                self._results[i] = Cast(r, r.dtype)

    def _record(self, pass_name, steps=None):
        steps = ordered_ops(self.results) if steps is None else steps
        names = IRNames()     # shared, so the picture names values as the text does
        self.ir_history.append((pass_name, self._format_ir(steps, names)))
        # The last record's are the planned steps' names: the generated code, the memory
        # plan and the simulator name every value as the IR does (ngnn/naming.py).
        self.value_names = names
        self.ir_snapshots.append(
            (pass_name, Snapshot(self.name, steps, self.results, self.parameters, names)))

    def _check_parameters(self):
        needed = [op for op in self.ordered_ops if isinstance(op, Placeholder)]
        missing = [p for p in needed if p not in self.parameters]
        if missing:
            names = ", ".join(repr(p.name or str(p)) for p in missing)
            raise ValueError(f"computation {self.name!r}: the results depend on placeholder(s) "
                             f"{names}, which are not among the parameters")
        for r in self.results:
            if any(isinstance(a, Assign) for a in r.args):
                raise ValueError("ng.assign must be a result of the computation, not an "
                                 "argument of another op")

    # ---- inspection ----------------------------------------------------------------------
    def _format_ir(self, steps, names=None):
        return format_ir(self.name, steps, self.results, self.parameters,
                         names=names or IRNames())

    @property
    def ir(self):
        """The optimized IR as SSA text."""
        self.transform()
        return self.transformer.format_ir(self)

    def ir_after(self, pass_name):
        """The IR right after the named pass ("Trace" for before any pass)."""
        self.transform()
        for name, text in self.ir_history:
            if name == pass_name:
                return text
        raise KeyError(f"no pass named {pass_name!r}; passes run: "
                       f"{[name for name, _ in self.ir_history]}")

    def draw(self, path, after=None, format=None, collapse=False, forward=False, layer=None):
        """Draws the op-graph after the pass `after` (default: the last one) to `path`.

        The format is `format` or the extension of `path`: "png", "svg", "pdf" or "dot"
        (Graphviz source). Each fused group is a box around its ops; edge-scoped values
        are orange, node-scoped ones blue, and stored edge values have a double border.
        `collapse=True` draws each group as one box, `forward=True` only the forward ops,
        and `layer=[variables]` the forward ops of the layer that owns those variables.
        Needs the `graphviz` package and, except for "dot", Graphviz's `dot` program.
        Returns the path written."""
        from ngnn.op_graph.picture import render, to_dot
        snapshot = self.snapshot(after)
        title = f"{self.name} after {after or self.ir_snapshots[-1][0]}"
        dot = to_dot(snapshot, collapse=collapse, forward=forward, layer=layer, title=title)
        return render(dot, path, format)

    def snapshot(self, after=None):
        """The op-graph's structure after the named pass (default: the last one)."""
        self.transform()
        if after is None:
            return self.ir_snapshots[-1][1]
        for name, snapshot in self.ir_snapshots:
            if name == after:
                return snapshot
        raise KeyError(f"no pass named {after!r}; passes run: "
                       f"{[name for name, _ in self.ir_snapshots]}")

    @property
    def memory_plan(self):
        """Where the intermediate tensors live (planned by BufferSharing on transform)."""
        if self._memory_plan is None:   # set by BufferSharing before the code is generated
            self.transform()
        return self._memory_plan

    @memory_plan.setter
    def memory_plan(self, plan):
        self._memory_plan = plan

    @property
    def source(self):
        """The generated program text."""
        self.transform()
        return self._source

    def kernel_report(self):
        """One dict per device kernel, in launch order (docs/gpu_transformer.md): only a
        transformer that launches kernels has them."""
        raise ValueError(f"kernel_report: the {self.transformer.name} transformer runs no "
                         "device kernels; it is a report of make_transformer('gpu')")

    # ---- execution -----------------------------------------------------------------------
    def __call__(self, *args):
        if self.transformer.closed:
            raise RuntimeError("the transformer is closed")
        before = self.transformer.transferred()
        try:
            self.transform()
            self.transformer.initialize()
            values = self._check_arguments(args)
            if self.transient and not self.chunked:
                self.transformer.make_resident(self)
            outputs = self.executor(*values, self.calls)
        finally:
            # The bytes this call moved between host and device, compilation and the
            # first call's initialization of variables included.
            after = self.transformer.transferred()
            self.transfer_bytes = {key: after[key] - before[key] for key in after}
        self.calls += 1
        outputs = outputs[:self.returned]    # a chunked program's include the updates
        return outputs[0] if self.single else tuple(outputs)

    def _check_arguments(self, args):
        if len(args) != len(self.parameters):
            names = ", ".join(p.name or "?" for p in self.parameters)
            raise TypeError(f"computation {self.name!r} takes {len(self.parameters)} "
                            f"argument(s) ({names}), got {len(args)}")
        if self.chunked:
            for p, a in zip(self.parameters, args):
                if isinstance(a, Resident):
                    raise TypeError(f"parameter {p.name or p.id!r}: computation "
                                    f"{self.name!r} runs chunk by chunk and reads its inputs "
                                    "from the host; feed the array, not a resident value")
        # A chunked program checks a memory-mapped argument block by block as it reads it.
        return [check_argument(p, a, self.transformer.check_finite and
                               not (self.chunked and isinstance(a, np.memmap)),
                               self.transformer)
                for p, a in zip(self.parameters, args)]


def check_argument(placeholder, value, check_finite, transformer=None):
    name = placeholder.name or f"placeholder #{placeholder.id}"
    if isinstance(value, Resident):
        return value.check(placeholder, name, transformer, check_finite).fed()
    if placeholder.is_sparse:
        matrix = check_sparse_value(name, placeholder.shape, placeholder.dtype, value)
        if check_finite and not np.isfinite(matrix.data).all():
            bad = int(matrix.nnz - np.count_nonzero(np.isfinite(matrix.data)))
            raise ValueError(f"parameter {name!r} contains {bad} NaN or Inf value(s)")
        return matrix
    if scipy.sparse.issparse(value):
        raise TypeError(f"parameter {name!r} is dense and got a scipy.sparse matrix; declare "
                        "it ng.placeholder(..., sparse=True), or pass value.toarray()")
    array = np.asarray(value)
    if array.shape != placeholder.shape:
        raise ValueError(f"parameter {name!r} expects shape {placeholder.shape}, got an array "
                         f"of shape {array.shape}")
    want, got = placeholder.dtype.kind, array.dtype.kind
    compatible = want == got or want in "iu" and got in "iu" or want == "f" and got in "iu"
    if not compatible:
        raise TypeError(f"parameter {name!r} expects {placeholder.dtype} values, got an array "
                        f"of dtype {array.dtype}")
    if want in "iu" and got in "iu" and array.size and \
            not np.can_cast(array.dtype, placeholder.dtype) and \
            (array.min() < np.iinfo(placeholder.dtype).min or
             array.max() > np.iinfo(placeholder.dtype).max):
        raise ValueError(f"parameter {name!r}: values do not fit {placeholder.dtype}")
    # Not np.ascontiguousarray: it turns a 0-d argument into shape (1,). A memory map of
    # the right layout stays one, so a chunked computation can read it from its file.
    if isinstance(value, np.memmap) and value.dtype == placeholder.dtype and \
            value.flags.c_contiguous:
        array = value
    else:
        array = np.asarray(array, dtype=placeholder.dtype, order="C")
    if check_finite and want == "f" and not np.isfinite(array).all():
        bad = int(array.size - np.count_nonzero(np.isfinite(array)))
        raise ValueError(f"parameter {name!r} contains {bad} NaN or Inf value(s)")
    return array


BASE_OPTIONS = ("passes", "optimize", "fusion", "recompute", "max_recompute", "check_finite",
                "debug_nans", "aggregate_transform_order", "memory_budget", "chunks",
                "selective_scheduling", "wide_accumulation")


def unknown_option_error(what, name, valid):
    """A TypeError naming an unknown option, the closest valid one and all of them."""
    close = difflib.get_close_matches(str(name).lower(), valid, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return TypeError(f"{what}: unknown option {name!r}{hint}; valid options: "
                     f"{', '.join(sorted(valid))}")


def check_passes(passes):
    """The user's passes as a list of pass objects, or an error saying what was given."""
    from ngnn.passes import GraphPass
    if isinstance(passes, GraphPass) or isinstance(passes, type):
        passes = [passes]
    checked = []
    for p in passes or []:
        if isinstance(p, type) and issubclass(p, GraphPass):
            raise TypeError(f"passes: got the class {p.__name__}; give an instance, "
                            f"{p.__name__}()")
        if not isinstance(p, GraphPass):
            raise TypeError(f"passes: {p!r} is not a pass; a custom pass is an instance of a "
                            "subclass of ngnn.passes.GraphPass or PeepholeGraphPass")
        checked.append(p)
    return checked


class Transformer:
    """Options: passes=[...] appended to the pipeline; optimize=False skips the rewriting
    passes (SimplePrune, CSE), so the graph runs as traced; fusion=False turns fusion off;
    recompute=False stores every edge value the backward needs instead of recomputing it
    inside fused groups (and keeps dropped values alive for the backward instead of
    dropping again), max_recompute bounds the ops recomputed for one value;
    check_finite=False skips the NaN/Inf check of arguments; debug_nans=True checks every
    op's output as it runs and raises at the first NaN or Inf (docs/errors.md);
    aggregate_transform_order=False keeps every aggregation and matrix product in the
    order the model wrote them; memory_budget=BYTES runs a computation whose plan needs
    more device memory chunk by chunk within that many bytes (docs/out_of_core.md),
    chunks=P runs every computation with graph ops over a P x P chunk grid, and
    selective_scheduling=False makes edge chunks always load whole vertex blocks;
    wide_accumulation=True adds float32 sums (aggregations, matrix products, sums over
    rows) in float64 and rounds them once (ngnn.passes.WideAccumulation), so they do not
    depend on summation order: K MPI ranks then equal one process bit for bit (`ngnn
    train` turns it on; docs/distributed.md, "What is exact"). A transformer kind names
    its own further options in `extra_options`; any other name is an error that suggests
    the closest valid one."""

    name = None
    computation_class = Computation
    resident_class = None          # the kind of Resident this transformer makes
    extra_options = ()

    def __init__(self, passes=None, optimize=True, fusion=True, recompute=True,
                 max_recompute=16, check_finite=True, debug_nans=False,
                 aggregate_transform_order=True, memory_budget=None, chunks=None,
                 selective_scheduling=True, wide_accumulation=False, **options):
        valid = BASE_OPTIONS + tuple(self.extra_options)
        for key in options:
            if key not in valid:
                raise unknown_option_error(f"make_transformer({self.name!r})", key, valid)
        if not isinstance(max_recompute, (int, np.integer)) or max_recompute < 0:
            raise ValueError(f"max_recompute must be a non-negative int, got {max_recompute!r}")
        for name, value in (("memory_budget", memory_budget), ("chunks", chunks)):
            if value is not None and (isinstance(value, bool) or not isinstance(
                    value, (int, np.integer)) or value <= 0):
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        self.memory_budget = None if memory_budget is None else int(memory_budget)
        self.chunks = None if chunks is None else int(chunks)
        self.selective_scheduling = bool(selective_scheduling)
        self.device_allocated = 0      # bytes this transformer holds on its device now
        self.device_peak = 0           # the most it held at once (reset per chunked call)
        self.memory_holder = None      # the transient computation holding memory now
        self.user_passes = check_passes(passes)
        self.debug_nans = bool(debug_nans)
        self.optimize = optimize
        self.fusion = fusion
        self.recompute = recompute
        self.max_recompute = max_recompute
        self.check_finite = check_finite
        self.aggregate_transform_order = aggregate_transform_order
        self.wide_accumulation = bool(wide_accumulation)
        self.options = options
        self.computations = []
        self.variable_tensors = {}     # Variable -> DeviceTensor
        self.initialized_variables = set()
        self.compilations = 0          # programs generated so far (init computations too)
        self.closed = False

    @property
    def chunking(self):
        """Whether computations with graph ops may run chunk by chunk (a memory budget or a
        chunk count): graph passes then leave a product's rows whole, since the chunk
        planner splits them into row blocks itself and refuses ops that move the row axis
        (docs/out_of_core.md)."""
        return self.memory_budget is not None or self.chunks is not None

    def decomposes(self):
        """Does this transformer run ops that have a `decomposition()` (batch norm's) as
        the ops they are made of, having no kernels of its own for them?"""
        return False

    def graph_passes(self):
        """Passes over the graph, in order (they rewrite through forwarding)."""
        from ngnn.passes import (AggregateTransformOrder, CSE, Decompose, EdgeSumsByVertex,
                                 OperationBatching, PackCollectives, RecomputeDropout,
                                 SimplePrune, SoftmaxByLogSumExp, WideAccumulation)
        from .numpy.evaluate import evaluate
        # OperationBatching is lowering, not optimization: graph code cannot run without it,
        # and no pass after it meets a traced per-vertex value.
        # SoftmaxByLogSumExp first: SimplePrune drops the divisions by 1 it leaves.
        # EdgeSumsByVertex before SimplePrune and CSE, which tidy what it builds.
        rewrites = [SoftmaxByLogSumExp(), EdgeSumsByVertex(), SimplePrune(evaluate), CSE()] \
            if self.optimize else []
        if self.optimize and self.aggregate_transform_order:
            rewrites.append(AggregateTransformOrder())     # ends with a CSE of its own
        # After every CSE, which would merge the copies again.
        recompute = [RecomputeDropout()] if self.recompute else []
        # Numerics, not optimization: last, once every rewrite has found the ops it matches.
        widen = [WideAccumulation()] if self.wide_accumulation else []
        # Right after lowering: the rewriting passes then see the ops a decomposition makes.
        decompose = [Decompose()] if self.decomposes() else []
        # After widening, which moves roundings past the collectives one by one. Not an
        # optimization: every rank packs alike (whatever its options), or none would meet.
        return [OperationBatching()] + decompose + rewrites + recompute + self.user_passes + \
            widen + [PackCollectives()]

    def late_passes(self):
        """Passes over the ordered ops of one computation (planning, not rewriting)."""
        from ngnn.passes import BufferSharing
        return self.fusion_passes(vertex_gathers=True) + [BufferSharing()]

    def fusion_passes(self, **options):
        from ngnn.passes import Fusion
        if not self.fusion or self.debug_nans:    # the NaN finder checks every op's output
            return []
        return [Fusion(recompute=self.recompute, max_recompute=self.max_recompute, **options)]

    def computation(self, results, *parameters, name=None, updates=()):
        """Runs `results` (an op or a list) on the placeholders `parameters`, and the
        assignments `updates` with them, returning only the results' values."""
        if self.closed:
            raise RuntimeError("the transformer is closed")
        comp = self.computation_class(self, results, parameters, name=name, updates=updates)
        # Under a memory budget every computation holds device memory only while it runs.
        comp.transient = self.chunking
        self.computations.append(comp)
        return comp

    def initialize(self):
        """Transform every computation, then run the init computation: it writes the
        initial value of every variable not initialized yet."""
        if self.closed:
            raise RuntimeError("the transformer is closed")
        for comp in self.computations:
            comp.transform()
        new = [v for comp in self.computations for v in comp.variables
               if v not in self.initialized_variables]
        new = list(dict.fromkeys(new))
        if not new:
            return
        # In the variable's own dtype: a bare Constant would round float64 values to float32.
        init = Computation(self, [Assign(v, Constant(v.initial_value, dtype=v.dtype))
                                  for v in new], (), name="init")
        init.transform()
        init.executor(0)
        self.initialized_variables.update(new)

    def resident(self, value, dtype=None):
        """`value` (a NumPy array, or a SciPy CSR matrix for a sparse placeholder) kept in
        this transformer's memory, to feed its computations in place of the value: see
        Resident. `dtype` converts it first (a call needs the placeholder's dtype)."""
        if self.closed:
            raise RuntimeError("the transformer is closed")
        return self.resident_class(self, value, dtype)

    def transferred(self):
        """{"to_device": bytes, "from_device": bytes} copied between host and device so
        far; a transformer whose device is the host's memory copies nothing."""
        return {"to_device": 0, "from_device": 0}

    def variable_tensor(self, variable):
        """The DeviceTensor holding a variable (allocated on first request)."""
        if variable not in self.variable_tensors:
            self.variable_tensors[variable] = self.allocate_variable(variable)
        return self.variable_tensors[variable]

    # ---- device memory ------------------------------------------------------------------
    def count_allocation(self, nbytes):
        self.device_allocated += int(nbytes)
        self.device_peak = max(self.device_peak, self.device_allocated)

    def make_resident(self, computation):
        """Gives a transient computation (a stage of a chunked program) its buffers,
        taking them from the one that held them: one transient computation at a time."""
        if self.memory_holder is not computation:
            self.evict()
            self.acquire(computation)
            self.memory_holder = computation

    def evict(self):
        if self.memory_holder is not None:
            self.release(self.memory_holder)
            self.memory_holder = None

    def hold_graphs(self, graphs):
        """Device copies of the index arrays of `graphs` (a chunked program's slots),
        held only while the program runs; a host-memory transformer has none."""

    def drop_graphs(self, graphs):
        """Frees what hold_graphs allocated."""

    def acquire(self, computation):
        raise TypeError(f"{type(self).__name__} must implement acquire()")

    def release(self, computation):
        raise TypeError(f"{type(self).__name__} must implement release()")

    def is_view(self, op):
        """Whether op's result is a view of its first argument (no storage of its own)."""
        return False

    def needs_storage(self, op):
        """Whether op's result needs an intermediate buffer from the memory plan."""
        return not (op.is_leaf or isinstance(op, Assign)) and \
            not self.is_view(op) and not op.is_sparse

    def inplace_ok(self, op):
        return not self.debug_nans     # the NaN finder reports the inputs after the op

    def format_ir(self, computation):
        return computation._format_ir(computation.steps, computation.value_names)

    def allocate_variable(self, variable):
        raise TypeError(f"{type(self).__name__} must implement allocate_variable()")

    def transform_ordered_ops(self, computation):
        raise TypeError(f"{type(self).__name__} must implement transform_ordered_ops()")

    def variable_value(self, variable):
        """The current value of a variable, as a NumPy array."""
        self.initialize()
        if variable not in self.initialized_variables:
            raise KeyError(f"variable {variable.name!r} is not used by any computation of "
                           "this transformer")
        return self.variable_tensors[variable].get()

    def set_variable(self, variable, value):
        """Writes `value` (of the variable's shape, or a scalar) to the variable."""
        if not isinstance(variable, Variable):
            raise TypeError(f"set_variable: expected an ngnn variable, got {variable!r}")
        value = np.asarray(value)
        if value.shape not in ((), variable.shape):
            raise ValueError(f"set_variable: variable {variable.name or variable!r} has shape "
                             f"{variable.shape}, got a value of shape {value.shape}")
        if value.dtype.kind not in "biuf":
            raise TypeError(f"set_variable: variable {variable.name or variable!r} holds "
                            f"{variable.dtype} numbers, got a value of dtype {value.dtype}")
        self.initialize()
        if variable not in self.variable_tensors:
            raise KeyError(f"set_variable: variable {variable.name!r} is not used by any "
                           "computation of this transformer")
        self.variable_tensors[variable].set(value)

    def close(self):
        self.closed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
