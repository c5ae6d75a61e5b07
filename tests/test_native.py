"""make_transformer("numpy", native=True): the batch-norm kernels and one head's sparse
products in C (transformers/numpy/native.py) give the NumPy kernels' results (float64 to
1e-12, float32 to 1e-5; the products to the bit), in GIN-0 training steps with batch norm,
GCN and GAT forward and gradients; so do the sweep groups (RowSweeps, native_sweeps.py)
and the fused groups in C (native_groups.py), with no group falling back to NumPy in a
GIN-0 step; the library is cached by its hash and reused; without a C compiler the
transformer warns and runs NumPy."""
import os
import warnings

import numpy as np
import pytest

import ngnn as ng
from ngnn import datasets, nn
from ngnn import transformers as ngt
from ngnn.graph_train import GraphTrainer
from ngnn.transformers.numpy import kernels as K
from ngnn.transformers.numpy import native

TOLERANCE = {np.float64: 1e-12, np.float32: 1e-5}


def kernel_cases(dtype, rows=23, features=5, live=17, seed=0):
    """Each kernel's arguments (without out) and output shape, over rows of which the
    first `live` are real."""
    rng = np.random.default_rng(seed)
    x = (rng.normal(1.5, 2.0, (rows, features))).astype(dtype)
    delta = rng.normal(size=(rows, features)).astype(dtype)
    weight, bias = rng.normal(size=features).astype(dtype), rng.normal(size=features).astype(dtype)
    count = None if live is None else np.array([live], dtype)
    stats = K.batch_norm_stats(x, count, np.empty((2, features), dtype))
    return {
        "batch_norm_stats": ((x, count), {}, (2, features)),
        "batch_norm_apply": ((x, stats, weight, bias, count), {"eps": 1e-5}, x.shape),
        "batch_norm_apply_grad": ((delta, stats, weight, count), {"eps": 1e-5}, x.shape),
        "batch_norm_apply_sums": ((delta, x, stats, count), {}, (2, features)),
        "batch_norm_stats_grad": ((delta[:2].copy(), x, stats, count), {}, x.shape),
    }


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("live", [17, None, 0, 23])
def test_each_kernel_equals_the_numpy_kernel(dtype, live):
    for name, (args, options, shape) in kernel_cases(dtype, live=live).items():
        expected = getattr(K, name)(*args, **options, out=np.full(shape, 7, dtype))
        prepared = native.prepare(name, *args, **options, out=np.full(shape, 7, dtype))
        assert not hasattr(prepared, "func"), f"{name} ran NumPy's kernel"
        for got in (getattr(native, name)(*args, **options, out=np.full(shape, 7, dtype)),
                    prepared()):
            np.testing.assert_allclose(got, expected, rtol=TOLERANCE[dtype],
                                       atol=TOLERANCE[dtype], err_msg=name)
            if shape[0] != 2 and live is not None:
                assert not got[live:].any(), f"{name}: rows past the live ones must be 0"


def test_a_prepared_call_reads_the_live_count_at_each_call():
    args, options, shape = kernel_cases(np.float64)["batch_norm_apply"]
    live, out = args[-1], np.empty(shape)
    call = native.prepare("batch_norm_apply", *args, **options, out=out)
    for count in (17, 4, 23):
        live[0] = count
        expected = K.batch_norm_apply(*args, **options, out=np.empty(shape))
        np.testing.assert_allclose(call(), expected, rtol=1e-12, atol=1e-12)


def test_arrays_the_c_kernels_cannot_read_run_the_numpy_kernel():
    args, options, shape = kernel_cases(np.float64)["batch_norm_apply_grad"]
    delta = np.asfortranarray(args[0])               # not C-contiguous
    prepared = native.prepare("batch_norm_apply_grad", delta, *args[1:], **options,
                              out=np.empty(shape))
    assert prepared.func is K.batch_norm_apply_grad
    np.testing.assert_array_equal(prepared(), K.batch_norm_apply_grad(
        delta, *args[1:], **options, out=np.empty(shape)))


def gin_trainer(data, dtype, **options):
    model = nn.GINGraph(data.num_features, 6, data.num_classes, num_layers=3, seed=1,
                        dtype=dtype, batch_norm=True)
    return GraphTrainer(model, data, batch_size=4, lr=0.01,
                        transformer=ngt.make_transformer("numpy", **options))


def step_gradients(trainer):
    """The loss and every parameter's gradient of the trainer's training step (dropout
    included) on its first batch, in its padded slot."""
    params = trainer.model.parameters()
    comp = trainer.transformer.computation([trainer.loss] + ng.grad(trainer.loss, params),
                                           trainer.x, trainer.y, trainer.mask,
                                           *trainer.live)
    next(iter(trainer.loader.batches(0, np.arange(12))))
    return comp(trainer.features(), trainer.loader.labels, trainer.loader.mask,
                *trainer.live_rows())


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_gin_with_batch_norm_gradients_equal_numpy_kernels(dtype):
    """GIN-0 with batch norm and dropout over a padded slot: the loss and every gradient
    with native=True equal those without."""
    data = datasets.synthetic_graphs(12, min_nodes=2, max_nodes=9, num_features=3, seed=0)
    plain, fast = gin_trainer(data, dtype), gin_trainer(data, dtype, native=True)
    expected, got = step_gradients(plain), step_gradients(fast)
    assert len(got) == 1 + len(plain.model.parameters())
    for a, b in zip(got, expected):
        np.testing.assert_allclose(a, b, rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_gin_with_batch_norm_trains_as_with_numpy_kernels(dtype):
    """Two epochs of GIN-0 with batch norm: the same losses, weights and running
    variances with native=True as without."""
    data = datasets.synthetic_graphs(12, min_nodes=2, max_nodes=9, num_features=3, seed=0)
    plain, fast = gin_trainer(data, dtype), gin_trainer(data, dtype, native=True)
    assert "N.prepare_sweep(" in fast.train_step.source
    assert "N.gather_sum(" in fast.train_step.source
    assert "N." not in plain.train_step.source
    for epoch in range(2):
        losses = [t.train_epoch(np.arange(12), epoch) for t in (plain, fast)]
        np.testing.assert_allclose(losses[1], losses[0], rtol=TOLERANCE[dtype])
    # A bias just before a batch norm has a gradient of exactly 0, computed as rounding
    # noise that differs with the order of the sums; Adam divides that noise by its own
    # size, so such biases, and the running means they shift, move by noise alone.
    # Everything else must agree.
    noise = [layer.bias for conv in plain.model.convs for name, layer in conv
             if name.endswith(("lin1", "lin2"))]
    noise += [layer.running_mean for conv in plain.model.convs for name, layer in conv
              if name.endswith(("norm1", "norm2"))]
    compared = 0
    weights = [m.parameters() + m.buffers() for m in (plain.model, fast.model)]
    for v, w in zip(*weights):
        if not any(v is n for n in noise):
            np.testing.assert_allclose(fast.transformer.variable_value(w),
                                       plain.transformer.variable_value(v),
                                       rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype],
                                       err_msg=v.name)
            compared += 1
    assert compared == len(weights[0]) - len(noise) > 0


def test_native_steps_are_deterministic():
    data = datasets.synthetic_graphs(12, min_nodes=2, max_nodes=9, num_features=3, seed=0)
    runs = []
    for _ in range(2):
        trainer = gin_trainer(data, np.float32, native=True)
        trainer.train_epoch(np.arange(12), 0)
        runs.append([trainer.transformer.variable_value(v) for v in trainer.variables])
    for a, b in zip(*runs):
        np.testing.assert_array_equal(a, b)


def layer_forward_and_gradients(layer, graph, x, dtype, **options):
    xs = ng.placeholder(x.shape, dtype=dtype, name="x")
    out = layer(graph, xs)
    grads = ng.grad(ng.sum(out * out), [xs] + layer.parameters())
    with ngt.make_transformer("numpy", **options) as t:
        comp = t.computation([out] + grads, xs)
        return comp(x), comp.source


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("make", [lambda dtype: nn.GCNConv(4, 3, seed=0, dtype=dtype),
                                  lambda dtype: nn.GATConv(4, 3, 2, seed=0,
                                                           dtype=dtype)],
                         ids=["gcn", "gat"])
def test_gcn_and_gat_forward_and_gradients_equal_numpy(dtype, make):
    rng = np.random.default_rng(0)
    src, dst = rng.integers(0, 30, 120), rng.integers(0, 30, 120)
    graph = ng.Graph.from_edges(src, dst, num_nodes=30)
    x = rng.normal(size=(30, 4)).astype(dtype)
    layer = make(dtype)
    expected, _ = layer_forward_and_gradients(layer, graph, x, dtype)
    got, source = layer_forward_and_gradients(layer, graph, x, dtype, native=True)
    assert "N.gather_sum(" in source
    for a, b in zip(got, expected):
        np.testing.assert_allclose(a, b, rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype])


def test_chunked_steps_under_a_memory_budget_equal_numpy():
    rng = np.random.default_rng(0)
    graph = ng.Graph.from_edges(rng.integers(0, 300, 3000), rng.integers(0, 300, 3000),
                                num_nodes=300)
    x = rng.normal(size=(300, 16))
    layer = nn.GATConv(16, 8, 2, seed=0, dtype=np.float64)
    expected, _ = layer_forward_and_gradients(layer, graph, x, np.float64)
    got, _ = layer_forward_and_gradients(layer, graph, x, np.float64, native=True,
                                         memory_budget=1 << 16)
    for a, b in zip(got, expected):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


def test_the_library_is_cached_by_hash_and_reused(tmp_path, monkeypatch):
    monkeypatch.setenv("NGNN_CACHE_DIR", str(tmp_path))
    native.library.cache_clear()
    try:
        native.library()
        built = os.listdir(tmp_path / "native")
        assert len(built) == 1 and built[0].startswith("kernels_") and \
            built[0].endswith(".so")         # the temporary folder it was built in is gone
        stamp = os.stat(tmp_path / "native" / built[0]).st_mtime_ns
        native.library.cache_clear()
        native.library()
        assert os.listdir(tmp_path / "native") == built
        assert os.stat(tmp_path / "native" / built[0]).st_mtime_ns == stamp
    finally:
        native.library.cache_clear()


def test_without_a_compiler_it_warns_and_runs_numpy(monkeypatch, tmp_path):
    monkeypatch.setenv("NGNN_CACHE_DIR", str(tmp_path))     # nothing cached to load
    monkeypatch.setenv("CC", "no-such-compiler-ngnn")
    monkeypatch.setattr(native.shutil, "which", lambda name: None)
    native.library.cache_clear()
    native.usable.cache_clear()
    try:
        data = datasets.synthetic_graphs(6, min_nodes=2, max_nodes=6, num_features=3, seed=0)
        trainer = gin_trainer(data, np.float64, native=True)
        with pytest.warns(RuntimeWarning, match="no C compiler found.*running the NumPy"):
            loss = trainer.train_epoch(np.arange(6), 0)     # compiles the step
        assert "N." not in trainer.train_step.source
        plain = gin_trainer(data, np.float64)
        np.testing.assert_array_equal(loss, plain.train_epoch(np.arange(6), 0))
    finally:
        native.library.cache_clear()
        native.usable.cache_clear()


def test_native_is_an_option_of_the_numpy_transformer_only():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ngt.make_transformer("numpy", native=True).close()
    with pytest.raises((TypeError, ValueError), match="native"):
        ngt.make_transformer("numpy", nativ=True)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("index", [np.int64, np.int32])
@pytest.mark.parametrize("features", [64, 37, 3])
def test_gather_sum_equals_the_numpy_kernel_to_the_bit(dtype, index, features):
    """One head's sparse product sums each element in CSR order, as SciPy does: equal to
    the bit, with and without edge weights, sum and mean, vertices without edges."""
    rng = np.random.default_rng(0)
    n, e = 40, 150
    x = rng.normal(size=(n, features)).astype(dtype)
    seg = np.concatenate([[0], np.cumsum(rng.multinomial(e, np.ones(n) / n))]).astype(index)
    assert (np.diff(seg) == 0).any()
    cols = rng.integers(0, n, e).astype(index)
    for weight in (None, rng.normal(size=(e, 1)).astype(dtype)):
        for reduce in ("sum", "mean"):
            expected = K.gather_sum(x, weight, cols, seg, reduce, np.full((n, features), 7, dtype))
            got = native.gather_sum(x, weight, cols, seg, reduce, np.full((n, features), 7, dtype))
            np.testing.assert_array_equal(got, expected)


def test_gather_sum_of_several_heads_runs_the_numpy_kernel():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 10, 3))                 # by_head layout: (heads, N, F)
    seg, cols = np.array([0, 2, 2, 5]), np.array([1, 4, 0, 9, 9])
    weight = rng.normal(size=(5, 2, 1))
    np.testing.assert_array_equal(
        native.gather_sum(x, weight, cols, seg, "sum", np.empty((3, 2, 3))),
        K.gather_sum(x, weight, cols, seg, "sum", np.empty((3, 2, 3))))


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_element_wise_ops_in_c_equal_numpy(dtype):
    """Element-wise ops over arrays bound once (here: intermediates and a variable) run as
    C loops rendered from their `c` templates: row, column and scalar broadcasts, NaN
    kept by ReLU and maximum, comparisons, exp and friends; equal to the NumPy
    transformer's results (the arithmetic to the bit, libm's functions to TOLERANCE)."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(48, 32)).astype(dtype)
    xs = ng.placeholder(x.shape, dtype=dtype, name="x")
    bias = ng.variable((32,), dtype=dtype, initial_value=rng.normal(size=32), name="bias")
    scale = ng.constant(np.where(np.arange(32) == 4, np.nan, 1.5), dtype=dtype)
    h = xs * scale                          # reads the placeholder: stays NumPy; NaN column 4
    rows = ng.sum(h, axis=1, keepdims=True)     # (48, 1): broadcast along the rows
    exact = [h + bias, ng.relu(h), h > 0.0, h * rows, ng.maximum(h, 0.25), h - 2.0,
             ng.leaky_relu(h, 0.1)]
    functions = [ng.exp(h), ng.sigmoid(h), ng.tanh(h)]
    results = {}
    for native_kernels in (False, True):
        with ngt.make_transformer("numpy", native=native_kernels) as t:
            comp = t.computation(exact + functions, xs)
            results[native_kernels] = comp(x)
            source = comp.source
    in_c = source.count("N.prepare_elementwise(") + sum(
        line.split("#")[1].count("%") for line in source.splitlines()
        if line.endswith("in one C function (native_sweeps.py)"))
    assert in_c >= len(exact + functions)
    for k, (got, expected) in enumerate(zip(results[True], results[False])):
        if k < len(exact):
            np.testing.assert_array_equal(got, expected)
        else:
            np.testing.assert_allclose(got, expected, rtol=TOLERANCE[dtype],
                                       atol=TOLERANCE[dtype])


def test_an_element_wise_op_over_overlapping_arrays_keeps_its_numpy_call():
    from ngnn.transformers.numpy.native_elementwise import NativeElementwise
    xs = ng.placeholder((40, 32), dtype=np.float64)
    renderer = NativeElementwise()
    function = renderer.add(ng.relu(xs), "relu")
    renderer.load()
    buffer = np.arange(41 * 32, dtype=np.float64) - 600.0
    x, shifted = buffer[:40 * 32].reshape(40, 32), buffer[32:].reshape(40, 32)

    def statement():
        return np.maximum(x, 0.0, out=shifted)

    assert native.prepare_elementwise(getattr(renderer.library, function), (x,), shifted,
                                      statement) is statement
    in_place = native.prepare_elementwise(getattr(renderer.library, function), (x,), x,
                                          statement)
    assert in_place is not statement
    np.testing.assert_array_equal(in_place(), np.maximum(buffer[:40 * 32], 0.0).reshape(40, 32))


def in_c_only(monkeypatch):
    """Makes the sweep groups' and fused groups' NumPy fallbacks fail the test, so that a
    computation's results show what the C computed; returns the count of each prepared
    (and of the groups that stop at a slot's live count)."""
    prepared = {"sweeps": 0, "groups": 0, "live groups": 0}
    sweep, group = native.prepare_sweep, native.prepare_group

    def fallback_fails(*args):
        raise AssertionError("a group fell back to NumPy")

    def prepare_sweep(function, inputs, outputs, live, segments, statements, **fed):
        prepared["sweeps"] += 1
        return sweep(function, inputs, outputs, live, segments, fallback_fails, **fed)

    def prepare_group(*args, live=False):
        prepared["groups"] += 1
        prepared["live groups"] += live
        return group(*args[:-1], fallback_fails, live=live)
    monkeypatch.setattr(native, "prepare_sweep", prepare_sweep)
    monkeypatch.setattr(native, "prepare_group", prepare_group)
    return prepared

def plain_and_in_c(monkeypatch, results, params, values):
    """`results` computed with NumPy calls and with native kernels whose NumPy fallbacks
    fail the test (in_c_only): (NumPy's values, C's values, C's source, in_c_only's counts)."""
    computed = {}
    for native_kernels in (False, True):
        prepared = in_c_only(monkeypatch) if native_kernels else None
        with ngt.make_transformer("numpy", native=native_kernels) as t:
            comp = t.computation(results, *params)
            computed[native_kernels] = comp(*values)
            source = comp.source
        monkeypatch.undo()
    return computed[False], computed[True], source, prepared



@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("live_rows", [5, 23])
def test_sweep_groups_of_batch_norm_and_element_wise_ops_equal_numpy(dtype, live_rows,
                                                                     monkeypatch):
    """A bias add, batch norm's statistics and normalization, ReLU, and their gradients over
    the live rows of a padded tensor (RowSweeps' groups): the C loops, several passes where
    a sum is read, give the NumPy transformer's values."""
    from ngnn.op_graph import BatchNormApply, BatchNormStats
    rng = np.random.default_rng(1)
    rows, features = 23, 6
    x = rng.normal(size=(rows, features)).astype(dtype)
    mask = (np.arange(rows) < live_rows).astype(dtype).reshape(rows, 1)
    xs = ng.placeholder(x.shape, dtype=dtype, name="x")
    ms = ng.placeholder(mask.shape, dtype=dtype, name="mask")
    bias = ng.variable((features,), dtype=dtype, initial_value=rng.normal(size=features))
    weight = ng.variable((features,), dtype=dtype, initial_value=rng.uniform(1, 2, features))
    shift = ng.variable((features,), dtype=dtype, initial_value=rng.normal(size=features))
    live = ng.sum(ms * 1.0, axis=0)
    h = xs * 1.5 + bias
    stats = BatchNormStats(h, live)
    out = ng.relu(BatchNormApply(h, stats, weight, shift, live))
    loss = ng.sum(out * out * 0.5)
    grads = ng.grad(loss, [xs, bias, weight, shift])
    expected_values, got_values, _, prepared = plain_and_in_c(
        monkeypatch, [out, stats] + grads, (xs, ms), (x, mask))
    assert prepared["sweeps"] >= 2
    for got, expected in zip(got_values, expected_values):
        np.testing.assert_allclose(got, expected, rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype])


def test_sweep_groups_passes_follow_the_sums_they_read():
    """An op reading a sum the group makes starts a pass after it; element-wise ops and
    normalizations share the pass of the op before them."""
    from ngnn.op_graph import BatchNormApply, BatchNormStats
    from ngnn.transformers.numpy.native_sweeps import assign_sweeps
    h = ng.placeholder((10, 4), dtype=np.float64) + 1.0
    stats = BatchNormStats(h)
    normed = BatchNormApply(h, stats, np.ones(4), np.zeros(4))
    relu = ng.relu(normed)
    assert assign_sweeps([h, stats, normed, relu]) == {h: (0, 0), stats: (0, 1),
                                                       normed: (2, 2), relu: (2, 2)}


def test_a_sweep_group_over_overlapping_arrays_keeps_its_numpy_calls():
    """Arrays of one segment that overlap other than element for element (an output over
    a broadcast input, wider elements over narrower ones) get the ops one by one; an
    output over its (rows, F) input runs the C (so do float32 values over float64 ones),
    and so do overlapping arrays of different segments (run one after another)."""
    buffer = np.zeros(10 * 4 + 4)
    rows, vector = buffer[:40].reshape(10, 4), buffer[36:]
    one_segment = (((10, 4), (0, 1)),)

    def statements():
        pass

    def function(*addresses):
        pass
    assert native.prepare_sweep(function, (vector,), (rows,), None, one_segment,
                                statements) is statements
    assert native.prepare_sweep(function, (rows,), (rows,), None, one_segment,
                                statements) is not statements
    assert native.prepare_sweep(function, (rows[:, :2],), (np.zeros((10, 4)),), None,
                                one_segment, statements) is statements
    wide = np.zeros(40)            # float32 values over the float64 a cast read: in C
    narrow = wide.view(np.float32)[:40].reshape(10, 4)
    assert native.prepare_sweep(function, (wide.reshape(10, 4),), (narrow,), None,
                                one_segment, statements) is not statements
    assert native.prepare_sweep(function, (narrow,), (wide.reshape(10, 4),), None,
                                one_segment, statements) is statements
    two_segments = (((1, 4), (0, 1)), ((10, 4), (1, 2)))
    assert native.prepare_sweep(function, (vector,), (np.zeros(4), rows), None,
                                two_segments, statements) is not statements


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_gin_steps_run_their_groups_in_c(dtype, monkeypatch):
    """GIN-0 with batch norm: every sweep group and every fused group of its training
    step runs in C (none falls back), with the NumPy transformer's loss and gradients;
    the aggregations over the slot's graph (x + sum of neighbours forward, its adjoint
    backward) stop at the slot's live count."""
    data = datasets.synthetic_graphs(12, min_nodes=2, max_nodes=9, num_features=3, seed=0)
    expected = step_gradients(gin_trainer(data, dtype))
    prepared = in_c_only(monkeypatch)
    fast = gin_trainer(data, dtype, native=True)
    got = step_gradients(fast)
    assert prepared["sweeps"] >= 6 and prepared["groups"] >= 6
    assert prepared["live groups"] >= 3, prepared      # two forward, one backward
    for a, b in zip(got, expected):
        np.testing.assert_allclose(a, b, rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype])


def test_a_fused_group_in_c_over_arrays_it_was_not_rendered_for_runs_python():
    """prepare_group's C reads the CSR at each call; an input of another shape or a
    non-contiguous one runs the group's Python function."""
    graph = ng.Graph.from_edges(np.array([0, 1, 2]), np.array([1, 2, 0]), num_nodes=3)
    calls = []

    def python(*args):
        calls.append("python")

    def function(*args):
        calls.append("c")
    out = np.zeros((3, 2))
    run = native.prepare_group(function, graph, "in", "src", (0,), ((3, 2),), np.float64,
                               (out,), python)
    run(np.zeros((3, 2)), 0)
    run(np.zeros((3, 4))[:, :2], 0)
    run(np.zeros((3, 2), np.float32), 0)
    assert calls == ["c", "python", "python"]


def test_fused_groups_read_the_csr_of_each_load_of_a_slot():
    """The groups over a slot take its CSR's addresses once per load, all of them from
    the arrays loaded last (a stale address would read a freed array)."""
    from ngnn.sampling.slot import GraphSlot
    slot = GraphSlot(4, 3)
    seen = []

    def function(rows, indptr, cols, *arrays):
        seen.append((indptr, cols))
    out = np.zeros((4, 2))
    runs = [native.prepare_group(function, slot, "in", "src", (0,), ((4, 2),), np.float64,
                                 (out,), None) for _ in range(2)]
    for src, dst in (([0, 1], [1, 2]), ([2, 0, 1], [0, 1, 2])):
        slot.load(ng.Graph.from_edges(np.array(src), np.array(dst), num_nodes=3))
        for run in runs:
            run(np.zeros((4, 2)), 0)
        current = (slot.in_indptr.ctypes.data, slot.in_src.ctypes.data)
        assert seen[-2:] == [current, current]


def test_assignments_landing_last_are_copied_in_one_call():
    """prepare_copies copies every (variable, value) pair, in C where all fit and with
    np.copyto where one does not (here a float32 value cast into a float64 variable)."""
    a, b = np.zeros(5), np.zeros((2, 3))
    native.prepare_copies([(a, np.arange(5.0)), (b, np.ones((2, 3)))])()
    np.testing.assert_array_equal(a, np.arange(5.0))
    np.testing.assert_array_equal(b, np.ones((2, 3)))
    native.prepare_copies([(a, np.full(5, 2, np.float32))])()
    np.testing.assert_array_equal(a, np.full(5, 2.0))


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("name", ["GINConv", "APPNPConv", "GatedGCNConv", "EdgeConv",
                                  "SGConv"])
def test_layers_with_sweep_and_c_groups_equal_numpy(dtype, name):
    """Layers whose steps have sweep groups or fused groups in C (GIN's sum of neighbours,
    APPNP's propagation chain, gated and edge convolutions' element-wise runs): forward
    and gradients equal the NumPy transformer's."""
    rng = np.random.default_rng(0)
    src, dst = rng.integers(0, 30, 120), rng.integers(0, 30, 120)
    graph = ng.Graph.from_edges(src, dst, num_nodes=30)
    x = rng.normal(size=(30, 4)).astype(dtype)
    layer = getattr(nn, name)(4, 3, seed=0, dtype=dtype)
    expected, _ = layer_forward_and_gradients(layer, graph, x, dtype)
    got, source = layer_forward_and_gradients(layer, graph, x, dtype, native=True)
    assert "native_sweeps.py" in source or "native_groups.py" in source
    for a, b in zip(got, expected):
        np.testing.assert_allclose(a, b, rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype])


def products_in_one_segment(products):
    """One segment (native_segments.py) of the products `(a, b, out, live, contract)`:
    np.matmul where live is None, else K.zero_row_matmul. Returns the segment's function
    of `step`, whether each product is made in C, and the list of the products that ran
    in Python (their statements' calls)."""
    from ngnn.transformers.numpy.native_segments import Product, SegmentFunctions
    functions = SegmentFunctions()
    name, _, _, size = functions.add(
        [Product(a.dtype, None if live is None else live.dtype, contract)
         for a, b, out, live, contract in products],
        [[f"product {k}"] for k in range(len(products))])
    functions.load()
    ran_in_python = []

    def statement(k):
        a, b, out, live, contract = products[k]
        ran_in_python.append(k)
        if live is None:
            np.matmul(a, b, out=out)
        else:
            K.zero_row_matmul(a, b, live, contract, out)
    slots = [native.product_arguments(a, b, out, *([] if live is None else [contract, live]))
             for a, b, out, live, contract in products]
    run = native.prepare_segment(getattr(functions.library, name), size, slots,
                                 [lambda step, k=k: statement(k) for k in range(len(products))],
                                 ())
    return run, [s is not None for s in slots], ran_in_python


def bundled_blas():
    """The products from C need NumPy's bundled BLAS, which every NumPy wheel from PyPI
    (what scripts/setup.sh installs) has; without it they stay NumPy calls, as
    test_without_the_bundled_blas_products_stay_numpy_calls checks."""
    from ngnn.transformers.numpy import native_blas
    assert native_blas.bundled_openblas(), "this NumPy bundles no scipy-openblas64"


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("m, k, n", [(900, 37, 64), (64, 900, 64), (32, 64, 2), (2, 3, 2),
                                     (1, 900, 64), (1, 2, 2)])
def test_products_from_c_equal_matmul_to_the_bit(dtype, m, k, n):
    """A product a segment makes through NumPy's bundled BLAS equals np.matmul's to the
    bit: matrix @ matrix (gemm) with either operand transposed, row @ matrix (gemv)."""
    bundled_blas()
    rng = np.random.default_rng(m + k + n)
    a, b = rng.standard_normal((m, k)).astype(dtype), rng.standard_normal((k, n)).astype(dtype)
    cases = [(a, b), (np.ascontiguousarray(a.T).T, b), (a, np.ascontiguousarray(b.T).T)]
    outs = [np.full((m, n), np.nan, dtype) for _ in cases]
    run, in_c, ran_in_python = products_in_one_segment(
        [(x, y, out, None, False) for (x, y), out in zip(cases, outs)])
    run(0)
    assert all(in_c) and ran_in_python == []
    for (x, y), out in zip(cases, outs):
        np.testing.assert_array_equal(out, np.matmul(x, y))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("live", [0, 1, 1.5, 2, 17, 40, 55.0])
def test_zero_row_products_from_c_read_the_live_count(dtype, live):
    """K.zero_row_matmul in a segment, both kinds (the weight gradient's contraction over
    a transposed operand, and its ones-row bias gradient, by gemv) beside a plain
    product: each count from 2 to the rows in C, equal to the bit; below 2 (np.matmul's
    gemv or own loop) the segment stops and Python makes the rest."""
    bundled_blas()
    rng = np.random.default_rng(3)
    rows = 40
    x = rng.standard_normal((rows, 6)).astype(dtype)
    x[int(np.ceil(min(live, rows))):] = 0
    delta = rng.standard_normal((rows, 5)).astype(dtype)
    weight = rng.standard_normal((6, 5)).astype(dtype)
    count = np.array([live], dtype)
    ones = np.ones((1, rows), dtype)
    products = [(x, weight, np.full((rows, 5), np.nan, dtype), count, False),
                (x.T, delta, np.full((6, 5), np.nan, dtype), count, True),
                (ones, delta, np.full((1, 5), np.nan, dtype), count, True),
                (x, weight, np.full((rows, 5), np.nan, dtype), None, False)]
    run, in_c, ran_in_python = products_in_one_segment(products)
    run(0)
    assert all(in_c)
    assert ran_in_python == ([] if np.ceil(live) >= 2 else [0, 1, 2, 3])
    for a, b, out, count_, contract in products:
        expected = np.empty_like(out)
        if count_ is None:
            np.matmul(a, b, out=expected)
        else:
            K.zero_row_matmul(a, b, count_, contract, expected)
        np.testing.assert_array_equal(out, expected)


@pytest.mark.parametrize("live", [0, 1, 2, 9, 40])
def test_a_zero_row_product_reads_a_live_count_fed_to_the_segment(live):
    """A zero-row product whose int64 live count is fed to the step (a slot's declared
    count) reads it from the segment's fed slot at each call; a count of another dtype
    than rendered runs the statements one by one."""
    from ngnn.transformers.numpy.native_segments import Product, SegmentFunctions
    bundled_blas()
    rng = np.random.default_rng(5)
    rows = 40
    x = rng.standard_normal((rows, 6))
    x[live:] = 0
    weight, delta = rng.standard_normal((6, 5)), rng.standard_normal((rows, 5))
    outs = [np.full((rows, 5), np.nan), np.full((6, 5), np.nan)]
    operands = [(x, weight, outs[0], False), (x.T, delta, outs[1], True)]
    spec = ("t_live", (1,), np.dtype(np.int64))
    functions = SegmentFunctions()
    name, _, fed, size = functions.add(
        [Product(np.float64, np.int64, contract, {"live": spec}) for *_, contract in operands],
        [["%1 = first"], ["%2 = second"]])
    functions.load()
    assert fed == [spec]
    ran_in_python = []

    def statement(k, count):
        ran_in_python.append(k)
        a, b, out, contract = operands[k]
        K.zero_row_matmul(a, b, count, contract, out)
    run = native.prepare_segment(
        getattr(functions.library, name), size,
        [native.product_arguments(a, b, out, contract) for a, b, out, contract in operands],
        [lambda step, count, k=k: statement(k, count) for k in range(2)], (),
        (((1,), np.dtype(np.int64)),))
    for count, in_python in ((np.array([live]), [] if live >= 2 else [0, 1]),
                             (np.array([float(live)]), [0, 1])):
        ran_in_python.clear()
        outs[0][:], outs[1][:] = np.nan, np.nan
        run(0, count)
        assert ran_in_python == in_python
        for a, b, out, contract in operands:
            np.testing.assert_array_equal(
                out, K.zero_row_matmul(a, b, np.array([live]), contract, np.empty_like(out)))


def test_a_live_count_that_is_not_a_number_raises_as_numpy_does():
    bundled_blas()
    x, weight = np.ones((8, 3)), np.ones((3, 4))
    run, _, ran_in_python = products_in_one_segment(
        [(x, weight, np.empty((8, 4)), np.array([np.nan]), False)])
    with pytest.raises(ValueError):
        run(0)
    assert ran_in_python == [0]


def test_products_numpy_makes_otherwise_stay_numpy_products():
    """A column, an inner axis of 1, an output over an operand, a matrix times its own
    transpose (NumPy's syrk), a non-contiguous fast axis, mixed dtypes: no slots, so a
    segment holding one runs its statements one by one."""
    from ngnn.transformers.numpy import native_blas
    a, b = np.ones((6, 4)), np.ones((4, 3))
    assert native_blas.matmul_call(a, b[:, :1], np.empty((6, 1))) is None
    assert native_blas.matmul_call(a[:, :1], b[:1], np.empty((6, 3))) is None
    shared = np.ones((6, 6))
    assert native_blas.matmul_call(shared, shared[:, :3], shared[:, 3:]) is None
    assert native_blas.matmul_call(a, a.T, np.empty((6, 6))) is None
    assert native_blas.matmul_call(np.ones((6, 8))[:, ::2], b, np.empty((6, 3))) is None
    assert native_blas.matmul_call(a, b.astype(np.float32), np.empty((6, 3))) is None
    assert native.product_arguments(a, b[:, :1], np.empty((6, 1))) is None


def test_without_the_bundled_blas_products_stay_numpy_calls(monkeypatch):
    """Another NumPy build (no scipy-openblas64): no product joins a segment; the sweep
    and fused groups still do, and the step computes what it computes with the BLAS."""
    from ngnn.transformers.numpy import native_blas
    data = datasets.synthetic_graphs(12, min_nodes=2, max_nodes=9, num_features=3, seed=0)
    with_blas = gin_trainer(data, np.float64, native=True)
    expected = step_gradients(with_blas)
    monkeypatch.setattr(native_blas, "bundled_openblas", lambda: [])
    native_blas.cblas.cache_clear()
    try:
        without = gin_trainer(data, np.float64, native=True)
        got = step_gradients(without)
        source = without.train_step.source
    finally:
        monkeypatch.undo()
        native_blas.cblas.cache_clear()
    assert "N.product_arguments(" not in source and "N.prepare_segment(" in source
    assert "np.matmul(" in source and "K.zero_row_matmul(" in source
    for a, b in zip(got, expected):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_segments_equal_their_statements_one_by_one(dtype, monkeypatch):
    """GIN-0 with batch norm, two epochs: every segment of the training step runs in C
    (none falls back) and gives, to the bit, the losses and weights of the same step with
    each segment's statements run one by one (the native step without segments); its
    source still comments every IR statement a segment computes, in order."""
    data = datasets.synthetic_graphs(12, min_nodes=2, max_nodes=9, num_features=3, seed=0)
    prepare_segment, made = native.prepare_segment, []

    def spy(*args):
        run = prepare_segment(*args)
        made.append(run)
        return run

    def one_by_one(function, size, members, statements, graphs, fed):
        return prepare_segment(function, size, [None], statements, graphs, fed)
    results = []
    for prepare in (spy, one_by_one):
        monkeypatch.setattr(native, "prepare_segment", prepare)
        trainer = gin_trainer(data, dtype, native=True)
        losses = [trainer.train_epoch(np.arange(12), epoch) for epoch in range(2)]
        results.append(losses + [trainer.transformer.variable_value(v)
                                 for v in trainer.variables])
        source = trainer.train_step.source
        monkeypatch.undo()
    assert len(made) >= 5 and all(run.__name__ == "run" for run in made)
    for a, b in zip(*results):
        np.testing.assert_array_equal(a, b)
    body = [line.strip() for line in source[source.index("    def run("):].splitlines()]
    blocks = []
    for k, line in enumerate(body):
        if line.startswith("segment_"):
            first, last = line.split("  # ")[1].split(":")[0].split(" ... ")
            start = k
            while body[start - 1].startswith("# %"):
                start -= 1
            block = body[start:k]
            assert block[0].startswith(f"# {first} = ") and block[-1].startswith(f"# {last} = ")
            blocks.append(block)
    assert len(blocks) >= 2
    assert any("zero_row_dot(" in c for block in blocks for c in block)
    assert any(" = dot(" in c for block in blocks for c in block)
    # The fused groups reading the batch's features join segments, fed at each call.
    assert any(line.startswith("segment_") and "(step, t_batch_features" in line
               for line in body)


def test_a_segment_fed_an_array_it_was_not_rendered_for_runs_its_statements(monkeypatch):
    """The batch's features fed to the evaluation step's segments as a Fortran-ordered
    array: the segments run their statements one by one (the fused groups their Python
    loops), with the same logits as from a C-ordered array; then C-ordered again, in C."""
    data = datasets.synthetic_graphs(12, min_nodes=2, max_nodes=9, num_features=3, seed=0)
    trainer = gin_trainer(data, np.float64, native=True)
    expected = trainer.predict(np.arange(12))
    assert "(step, t_batch_features" in trainer.logits.source
    c_ordered = trainer.features
    monkeypatch.setattr(trainer, "features", lambda: np.asfortranarray(c_ordered()))
    np.testing.assert_array_equal(trainer.predict(np.arange(12)), expected)
    monkeypatch.undo()
    np.testing.assert_array_equal(trainer.predict(np.arange(12)), expected)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("shape", [(23, 6), (7,), (40, 25)])
@pytest.mark.parametrize("rate", [0.0, 0.5, 0.9])
def test_dropout_in_a_sweep_group_equals_numpy_to_the_bit(dtype, shape, rate, monkeypatch):
    """A dropout and its gradient between element-wise ops run in the group's C: Philox's
    words of (seed, call number, position), NaN and signs kept as NumPy's arithmetic keeps
    them, equal to K.dropout bit for bit at every call."""
    from ngnn.op_graph import Dropout
    rng = np.random.default_rng(2)
    x = rng.normal(size=shape).astype(dtype)
    xs = ng.placeholder(shape, dtype=dtype, name="x")
    scale = ng.constant(np.where(np.arange(shape[-1]) == 1, np.nan, 1.5), dtype=dtype)
    bias = ng.variable(shape[-1:], dtype=dtype, initial_value=rng.normal(size=shape[-1]))
    h = xs * scale                   # reads the placeholder: stays NumPy; NaN column 1
    dropped = Dropout(h + bias, rate, seed=2 ** 63 + 5) * 2.0
    grads = ng.grad(ng.sum(dropped * dropped), [bias])
    results = {}
    for native_kernels in (False, True):
        prepared = in_c_only(monkeypatch) if native_kernels else None
        with ngt.make_transformer("numpy", native=native_kernels) as t:
            comp = t.computation([dropped] + grads, xs)
            results[native_kernels] = [[r.copy() for r in comp(x)] for _ in range(3)]
            source = comp.source
        monkeypatch.undo()
    assert prepared["sweeps"] >= 1
    assert "K.dropout(" not in source.split("def run", 1)[-1]
    for calls_got, calls_expected in zip(results[True], results[False]):
        for got, expected in zip(calls_got, calls_expected):
            assert got.tobytes() == expected.tobytes()
    assert results[False][0][0].tobytes() != results[False][1][0].tobytes() or rate == 0


def run_body(source):
    return source.split("def run", 1)[-1]


def wide(rng, shape, dtype):
    """Values of magnitudes 1e-6 to 1e6: sums of them depend on the order of the adds."""
    return (rng.normal(size=shape) * 10.0 ** rng.integers(-6, 7, size=shape)).astype(dtype)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_sums_in_sweep_groups_add_in_numpys_order(dtype, monkeypatch):
    """The sums a group runs in C (row_sweeps.sum_order) add in the order of the NumPy
    call they replace: np.einsum's vectors for short trailing sums, np.sum's pairwise
    summation down a vector or one column, row after row down a matrix's columns; equal
    to the bit on lengths around each order's block sizes, and -0s sum to +0 as NumPy's.
    Where NumPy's einsum vectors are not known, its sums stay NumPy calls."""
    from ngnn.passes.row_sweeps import sum_order
    rng = np.random.default_rng(3)
    cases = [((n,), 0, False) for n in (1, 5, 8, 9, 16, 33, 127, 128, 129, 256, 257, 300,
                                        1000, 1196)]
    cases += [((r, 1), 0, True) for r in (7, 33, 300, 1196)]
    cases += [((r, c), 0, False) for r, c in ((33, 2), (300, 5), (2, 64))]
    cases += [((r, c), 1, keep) for r, c in ((33, 2), (5, 7), (9, 64), (3, 200))
              for keep in (False, True)]
    inputs, sums, orders = [], [], set()
    for k, (shape, axis, keepdims) in enumerate(cases):
        xs = ng.placeholder(shape, dtype=dtype, name=f"x{k}")
        s = ng.sum(xs * 2.0, axis=axis, keepdims=keepdims)      # reads a value bound once
        orders.add(sum_order(s))
        inputs.append(xs)
        sums.append(s)
    assert orders == {"lanes", "pairwise", "columns"}
    from ngnn.passes import row_sweeps
    with monkeypatch.context() as patch:       # NumPy's einsum vectors of unknown width
        patch.setattr(row_sweeps, "EINSUM_VECTOR_BYTES", None)
        assert {sum_order(s) for s in sums} == {None, "pairwise", "columns"}
    values = [wide(rng, x.shape, dtype) for x in inputs]
    values[0][:] = -0.0
    expected_values, got_values, source, prepared = plain_and_in_c(
        monkeypatch, sums, inputs, values)
    assert prepared["sweeps"] >= 1
    assert "np.sum(" not in run_body(source) and "np.einsum(" not in run_body(source)
    for got, expected in zip(got_values, expected_values):
        assert got.tobytes() == expected.tobytes()


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_concat_unslice_and_lone_ops_in_sweep_groups_equal_numpy(dtype, monkeypatch):
    """Concats along either axis, unslices (slices' gradients: ranges, steps, an int key)
    and a lone small op read through a broadcast run in the groups' C, equal to the bit."""
    from ngnn.op_graph.layout import Broadcast, Unslice, _normalize_index
    rng = np.random.default_rng(4)
    keys = ((slice(1, 4), slice(0, 6)), (slice(8, None, -3), slice(1, 5, 2)), (2, slice(0, 6)))
    shapes = [(9, 6), (6,), (9, 2)] + [np.zeros((9, 6))[key].shape for key in keys]
    feeds = [ng.placeholder(shape, dtype=dtype, name=f"in{k}") for k, shape in enumerate(shapes)]
    h, w, side, *parts = [x * 2.0 for x in feeds]
    outs = [ng.concat([h, ng.slice(h, (slice(0, 2),)), h], axis=0),
            ng.concat([h, side], axis=1)]
    outs += [Unslice(part, (9, 6), _normalize_index((9, 6), key))
             for part, key in zip(parts, keys)]
    outs.append(w * Broadcast(ng.reshape(ng.sum(w), (1,)), (6,)))      # lone, broadcast
    values = [rng.normal(size=shape).astype(dtype) for shape in shapes]
    expected_values, got_values, source, prepared = plain_and_in_c(
        monkeypatch, outs, feeds, values)
    assert prepared["sweeps"] >= 1
    numpy_calls = [line.strip() for line in run_body(source).splitlines()[1:]
                   if line.strip().startswith(("np.", "t_", "K."))]
    assert numpy_calls == []        # the products of the fed arrays by 2.0 too
    for got, expected in zip(got_values, expected_values):
        assert got.tobytes() == expected.tobytes()


def test_casts_and_one_hots_of_fed_arrays_run_in_c_and_bad_ids_raise(monkeypatch):
    """A cast of a fed mask (bool, int) and a one-hot of fed class ids run in a group's
    C, the fed arrays' addresses taken at the call: equal to the NumPy transformer's;
    fed arrays it was not rendered for (another dtype, not C-contiguous) run the NumPy
    statements, and so does a class id out of range, whose error names it."""
    masks = [ng.placeholder((7,), dtype=d, name=f"mask{k}")
             for k, d in enumerate((np.bool_, np.int64))]
    ids = ng.placeholder((7,), dtype=np.int64, name="ids")
    outs = [ng.cast(m, np.float32) * 3.0 for m in masks] + [ng.one_hot(ids, 3) * 2.0]
    rng = np.random.default_rng(5)
    feeds = [rng.random(7) < 0.5, rng.integers(-3, 3, 7), rng.integers(0, 3, 7)]
    results = {}
    for native_kernels in (False, True):
        with ngt.make_transformer("numpy", native=native_kernels) as t:
            comp = t.computation(outs, *masks, ids)
            results[native_kernels] = [r.copy() for r in comp(*feeds)]
            source = comp.source
            if native_kernels:
                strided = comp(feeds[0], np.repeat(feeds[1], 2)[::2], feeds[2].astype(np.int32))
                for got, expected in zip(strided, results[False]):
                    assert got.tobytes() == expected.tobytes()
                with pytest.raises(ValueError, match="class id 3 is outside"):
                    comp(feeds[0], feeds[1], np.array([0, 1, 2, 3, 0, 1, 2]))
    body = run_body(source)
    assert "np.copyto(" not in body and "K.one_hot(" not in body and "np.multiply(" not in body
    for got, expected in zip(results[True], results[False]):
        assert got.tobytes() == expected.tobytes()


@pytest.mark.parametrize("shape", [(16,), (16, 7)])
def test_a_cast_to_float32_whose_float64_argument_dies_runs_in_c(shape, monkeypatch):
    """A float64 value cast to float32 and dying there (as weight decay's terms do): the
    memory plan puts the next float32 value (here of a variable) in its buffer; the group
    still runs in C (each element read before any narrower write reaches it), equal to
    the bit."""
    rng = np.random.default_rng(6)
    x = rng.normal(size=shape)
    xs = ng.placeholder(shape, dtype=np.float64, name="x")
    bias = ng.variable(shape, dtype=np.float32, initial_value=rng.normal(size=shape))
    out = ng.cast(xs * 3.0, np.float32) + bias * 0.5
    results = {}
    for native_kernels in (False, True):
        prepared = in_c_only(monkeypatch) if native_kernels else None
        with ngt.make_transformer("numpy", native=native_kernels) as t:
            comp = t.computation(out, xs)
            results[native_kernels] = comp(x)
            source = comp.source
        monkeypatch.undo()
    assert f"K.view(buffers[0], {shape}, np.float32)" in source     # over the float64
    assert prepared["sweeps"] == 2
    assert results[True].tobytes() == results[False].tobytes()
