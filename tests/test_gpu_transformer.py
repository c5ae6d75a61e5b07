"""The GPU transformer on OpenCL (PoCL on machines without a GPU): agreement with the NumPy
transformer over every op family, kernel fusion and counts, kernel names and dialects,
dropout masks, training steps and runtime selection."""
import numpy as np
import pytest

import ngnn as ng
from ngnn import transformers as ngt
from ngnn.op_graph import Broadcast, Dot, Reduction, Softmax, Unslice
from ngnn.transformers.gpu import GPUKernel, GPUKernelGroup

rng = np.random.default_rng(0)


@pytest.fixture(scope="module")
def gpu():
    with ngt.make_transformer("gpu", runtime="opencl") as t:
        yield t


def run_both(results, params, values, gpu_transformer):
    """The results on NumPy and on the GPU, each one computation."""
    numpy_values = ngt.make_transformer("numpy").computation(results, *params)(*values)
    comp = gpu_transformer.computation(results, *params)
    return numpy_values, comp(*values), comp


def assert_match(expected, actual, names):
    for name, e, a in zip(names, expected, actual):
        assert e.dtype == a.dtype and e.shape == a.shape, name
        np.testing.assert_allclose(a, e, rtol=1e-4, atol=1e-5, err_msg=name)


def small_graph():
    src = rng.integers(0, 7, 20)
    dst = rng.integers(0, 7, 20)
    return ng.Graph.from_edges(src, dst, num_nodes=8)     # vertex 7 has no edges


def test_every_op_family_matches_numpy(gpu):
    a = ng.placeholder((3, 4, 5), name="a")
    b = ng.placeholder((4, 5), name="b")
    labels = ng.placeholder((6,), dtype=np.int64, name="labels")
    mask = ng.placeholder((6,), dtype=np.bool_, name="mask")
    d = ng.placeholder((3, 4), dtype=np.float64, name="d")
    logits = ng.placeholder((6, 5), name="logits")
    flat_b = ng.reshape(b, (20,))
    cases = {
        "arith": ng.tanh(a) * b + ng.exp(-a) / b - ng.sqrt(b) ** 2.0,
        "unary": ng.maximum(a, b) + ng.minimum(a, 0.1) + ng.abs(a) + ng.sigmoid(a) +
        ng.elu(a) + ng.leaky_relu(a, 0.1) + ng.log(b),
        "sum_axis": ng.sum(a, axis=1), "mean_keepdims": ng.mean(a, axis=(0, 2), keepdims=True),
        "max": ng.max(a, axis=-1), "min_all": ng.min(a), "sum_all": ng.sum(a),
        "softmax": ng.softmax(a, axis=1), "log_softmax": ng.log_softmax(a),
        "dot": ng.dot(a, ng.transpose(b)), "matvec": ng.dot(b, flat_b[:5]),
        "vecmat": ng.dot(flat_b[:4], b), "batched": ng.dot(a, ng.transpose(a, (0, 2, 1))),
        "transpose": ng.transpose(a, (2, 0, 1)) * 1.0, "reshape": ng.reshape(a * 2.0, (12, 5)),
        "slice": a[1:, ::2, 3] + 1.0, "reversed": a[::-1, 1, :],
        "concat": ng.concat([a, a * 2.0], axis=1), "concat0": ng.concat([b, b[:2]], axis=0),
        "one_hot": ng.one_hot(labels, 5), "cross_entropy": ng.cross_entropy(logits, labels),
        "masked_ce": ng.cross_entropy(logits, labels, mask=mask),
        "cast": ng.cast(mask, np.float32),
        "double": ng.exp(d) * 2.0 + ng.sum(d, axis=0), "double_softmax": ng.softmax(d),
        "broadcast": Broadcast(b, (3, 4, 5)) + 0.0,
        "unslice": Unslice(b, (6, 5), (slice(1, 5, 1), slice(0, 5, 1))),
        "unslice_step": Unslice(b[:, 1], (9,), (slice(0, 8, 2),)),
    }
    params = [a, b, labels, mask, d, logits]
    values = [rng.standard_normal((3, 4, 5)).astype(np.float32),
              rng.random((4, 5)).astype(np.float32) + 0.5, rng.integers(0, 5, 6),
              rng.random(6) > 0.3, rng.standard_normal((3, 4)),
              rng.standard_normal((6, 5)).astype(np.float32)]
    expected, actual, _ = run_both(list(cases.values()), params, values, gpu)
    assert_match(expected, actual, list(cases))


@pytest.mark.parametrize("at", ["dst", "src"])
def test_graph_ops_match_numpy(gpu, at):
    g = small_graph()
    h = ng.placeholder((8, 2, 3), name="h")
    w = ng.placeholder((20, 2, 1), name="w")
    messages = ng.gather(h, g, by="src" if at == "dst" else "dst") * w
    cases = {f"{reduce}": ng.aggregate(messages, g, at=at, reduce=reduce)
             for reduce in ("sum", "mean", "max", "min")}
    cases["gather"] = ng.gather(h, g, by=at)
    cases["edge_softmax"] = ng.edge_softmax(g, w * 2.0, at=at)
    values = [rng.standard_normal((8, 2, 3)).astype(np.float32),
              rng.standard_normal((20, 2, 1)).astype(np.float32)]
    expected, actual, comp = run_both(list(cases.values()), [h, w], values, gpu)
    assert_match(expected, actual, list(cases))
    for kernel in comp.executor.kernels:
        assert "atomic" not in kernel.render("opencl")


def test_element_wise_chain_is_one_kernel(gpu):
    x = ng.placeholder((100, 7), name="x")
    bias = ng.placeholder((7,), name="bias")
    y = ng.tanh(ng.relu(x * 2.0 + bias) - 1.0) / 3.0
    comp = gpu.computation(y, x, bias)
    xv, bv = rng.standard_normal((100, 7)).astype(np.float32), np.ones(7, np.float32)
    np.testing.assert_allclose(comp(xv, bv), np.tanh(np.maximum(xv * 2 + bv, 0) - 1) / 3,
                               rtol=1e-5)
    (kernel,) = comp.executor.kernels
    assert kernel.template == "elementwise.j2"
    # Intermediates stay in registers: the only buffer is the result.
    assert comp.memory_plan.buffer_bytes == [100 * 7 * 4]


def test_executor_kernels_are_named_after_ops_in_launch_order(gpu):
    x = ng.placeholder((8, 4), name="features")
    w = ng.variable((4, 3), initial_value=np.ones((4, 3)), name="weight")
    hidden = ng.dot(x, w)
    hidden.name = "hidden layer"
    out = ng.softmax(ng.relu(hidden), axis=-1)
    out.name = "probs"
    comp = gpu.computation([out, ng.sum(out)], x)
    comp(np.ones((8, 4), np.float32))
    group = comp.executor
    assert isinstance(group, GPUKernelGroup)
    assert all(isinstance(k, GPUKernel) for k in group.kernels)
    assert [k.name for k in group.kernels] == ["gemm_t_hidden_layer", "softmax_t_probs",
                                               "reduce_t_1"]
    assert "%1 : Float32[] = sum(%probs" in comp.ir      # the IR's names: %1 is t_1
    source = comp.source
    assert [source.index(f"void {k.name}(") for k in group.kernels] == \
        sorted(source.index(f"void {k.name}(") for k in group.kernels)
    assert "t_weight" in source and "t_features" in source


def test_source_for_both_dialects(gpu):
    x = ng.placeholder((5,), name="x")
    comp = gpu.computation(ng.exp(x) + 1.0, x)
    cuda, opencl = comp.source_for("cuda"), comp.source_for("opencl")
    assert 'extern "C" __global__' in cuda and "__kernel" in opencl
    assert comp.source == opencl
    body = cuda[cuda.index("KERNEL void"):]
    assert body == opencl[opencl.index("KERNEL void"):]
    with pytest.raises(ValueError, match="dialect"):
        comp.source_for("metal")


def test_double_precision_enables_fp64(gpu):
    x = ng.placeholder((3,), dtype=np.float64, name="x")
    comp = gpu.computation(ng.sigmoid(x) * 3.0, x)
    xv = np.array([0.1, -2.0, 5.0])
    np.testing.assert_allclose(comp(xv), 3.0 / (1.0 + np.exp(-xv)), rtol=1e-12)
    assert "cl_khr_fp64" in comp.source and "1.0f" not in comp.source.split("KERNEL")[-1]


def test_dropout_mask_equals_numpy_every_call(gpu):
    x = ng.placeholder((50, 20), name="x")
    y = ng.dropout(x, 0.4, seed=1234) + 0.0
    xv = rng.standard_normal((50, 20)).astype(np.float32)
    reference = ngt.make_transformer("numpy").computation(y, x)
    comp = gpu.computation(y, x)
    masks = []
    for _ in range(3):
        expected, actual = reference(xv), comp(xv)
        np.testing.assert_array_equal(actual, expected)
        masks.append(actual != 0)
    assert not np.array_equal(masks[0], masks[1])
    assert len(comp.executor.kernels) == 1          # the mask is drawn inside the add


def test_training_step_assigns_after_results(gpu):
    x = ng.placeholder((16, 3), name="x")
    w = ng.variable((3, 1), initial_value=np.full((3, 1), 0.5), name="w")
    loss = ng.mean((ng.dot(x, w) - 1.0) ** 2.0)
    step = [loss, w, ng.assign(w, w - 0.1 * ng.grad(loss, w))]
    xv = rng.standard_normal((16, 3)).astype(np.float32)
    numpy_t = ngt.make_transformer("numpy")
    numpy_step, gpu_step = numpy_t.computation(step, x), gpu.computation(step, x)
    for _ in range(3):
        expected, actual = numpy_step(xv), gpu_step(xv)
        assert_match(expected, actual, ["loss", "w", "new w"])
    np.testing.assert_allclose(gpu.variable_value(w), numpy_t.variable_value(w), rtol=1e-5)


def test_gradients_in_double_match_numpy(gpu):
    g = small_graph()
    h = ng.placeholder((8, 4), dtype=np.float64, name="h")
    w = ng.variable((4, 4), dtype=np.float64, initial_value=rng.standard_normal((4, 4)))
    z = ng.aggregate(ng.gather(ng.tanh(ng.dot(h, w)), g), g, reduce="max")
    loss = ng.sum(ng.log_softmax(z) * z)
    grads = ng.grad(loss, [w, h])
    hv = rng.standard_normal((8, 4))
    numpy_t = ngt.make_transformer("numpy")
    expected = numpy_t.computation([loss] + grads, h)(hv)
    actual = gpu.computation([loss] + grads, h)(hv)
    assert_match(expected, actual, ["loss", "dw", "dh"])


def test_gat_layer_launches_no_more_kernels_than_groups_plus_dense(gpu):
    from ngnn.nn import GATConv
    g = ng.Graph.from_edges(rng.integers(0, 30, 200), rng.integers(0, 30, 200), num_nodes=32)
    h = ng.placeholder((32, 6), name="h")
    out = GATConv(6, 3, num_heads=2)(g, h)
    hv = rng.standard_normal((32, 6)).astype(np.float32)
    expected, actual, comp = run_both([out], [h], [hv], gpu)
    assert_match(expected, actual, ["gat"])
    groups, kernels = comp.fusion_groups, comp.executor.kernels
    dense = [k for k in kernels if isinstance(k.op, (Dot, Reduction, Softmax)) and
             not k.name.startswith("fusedGraph")]
    assert groups and len(kernels) <= len(groups) + len(dense)
    # The attention (max, exp, sum, divide), the weighted sum and the bias are one kernel
    # over the in-CSR (the bias add is its nodeCompute): no edge-sized buffer at all.
    templates = [k.template for k in comp.executor.kernels]
    assert templates.count("vertex_rows.j2") == 1 and "elementwise.j2" not in templates
    assert max(comp.memory_plan.buffer_bytes) < g.num_edges * 4
    # fusion=False: one kernel per op, edge values stored, the same numbers.
    with ngt.make_transformer("gpu", runtime="opencl", fusion=False) as unfused:
        separate = unfused.computation(out, h)
        assert_match(expected, [separate(hv)], ["gat unfused"])
        assert len(separate.executor.kernels) > 3 * len(comp.executor.kernels)
        assert max(separate.memory_plan.buffer_bytes) >= g.num_edges * 4


def test_memory_plan_reuses_buffers(gpu):
    x = ng.placeholder((64, 64), name="x")
    y = x
    for _ in range(6):
        y = ng.softmax(ng.dot(y, x), axis=-1)
    comp = gpu.computation(y, x)
    xv = rng.standard_normal((64, 64)).astype(np.float32) * 0.1
    expected = ngt.make_transformer("numpy").computation(y, x)(xv)
    np.testing.assert_allclose(comp(xv), expected, rtol=1e-4, atol=1e-6)
    assert len(comp.memory_plan.buffer_bytes) <= 3 < len(comp.executor.kernels)


def test_one_hot_rejects_bad_labels(gpu):
    labels = ng.placeholder((3,), dtype=np.int64, name="labels")
    comp = gpu.computation(ng.one_hot(labels, 4), labels)
    np.testing.assert_array_equal(comp(np.array([0, 3, 1])), np.eye(4, dtype=np.float32)[[0, 3, 1]])
    with pytest.raises(ValueError, match="class id 7 is outside"):
        comp(np.array([0, 7, 1]))


def test_explicit_opencl_runtime_and_unknown_runtime():
    with ngt.make_transformer("gpu", runtime="opencl") as t:
        assert t.runtime.name == "opencl"
        x = ng.placeholder((2,), name="x")
        np.testing.assert_array_equal(t.computation(x * 2.0, x)(np.ones(2, np.float32)), [2, 2])
    assert "gpu" in ngt.transformer_choices()
    with pytest.raises(ValueError, match="unknown GPU runtime 'metal'"):
        ngt.make_transformer("gpu", runtime="metal")


def gat_training_step(num_nodes=120, num_edges=900):
    from ngnn import nn
    g = ng.Graph.from_edges(rng.integers(0, num_nodes, num_edges),
                            rng.integers(0, num_nodes, num_edges), num_nodes=num_nodes)
    model = nn.GAT(16, hidden=4, heads=4, num_classes=3, seed=0)
    h = ng.placeholder((num_nodes, 16), name="h")
    labels = ng.placeholder((num_nodes,), dtype=np.int64, name="labels")
    loss = ng.cross_entropy(model(g, h, training=True), labels)
    params = model.parameters()
    results = [loss] + [ng.assign(p, p - 0.1 * d) for p, d in zip(params, ng.grad(loss, params))]
    values = [rng.standard_normal((num_nodes, 16)).astype(np.float32),
              rng.integers(0, 3, num_nodes)]
    return results, [h, labels], values


def stored_edge_values(comp):
    return [op for op in comp.memory_plan.slots if op.scope == "e"]


def test_every_fused_group_runs_as_the_kernels_that_name_it():
    results, params, values = gat_training_step()
    with ngt.make_transformer("gpu", runtime="opencl") as t:
        comp = t.computation(results, *params)
        comp(*values)
        names = [k.name for k in comp.executor.kernels]
        for group in comp.fusion_groups:
            assert f"{group.name}(" in comp.ir
            named = [k for k in comp.executor.kernels
                     if k.name.startswith(group.name + "_") and k.template != "partial.j2"]
            # Every output is written by one kernel named after the group; its per-vertex
            # outputs share one kernel.
            written = [op for k in named for op in k.outputs]
            assert sorted(map(id, written)) == sorted(map(id, group.outputs))
        assert any(len(k.outputs) > 1 for k in comp.executor.kernels)
        graph_kernels = [k for k in comp.executor.kernels
                         if any(b[0] == "graph" for b in k.bindings)]
        groups = {g.name for g in comp.fusion_groups}
        assert graph_kernels and all(k.name.rsplit("_", 1)[0] in groups or
                                     k.name.split("_")[0] in groups for k in graph_kernels)
        assert all(f"KERNEL void {n}(" in comp.source for n in names)


def test_gpu_plans_no_more_than_numpy():
    results, params, _ = gat_training_step()
    with ngt.make_transformer("numpy") as t:
        reference = t.computation(results, *params)
        reference.transform()
    with ngt.make_transformer("gpu", runtime="opencl") as t:
        comp = t.computation(results, *params)
        comp.transform()
    assert comp.memory_plan.peak_bytes <= 1.1 * reference.memory_plan.peak_bytes
    assert len(stored_edge_values(comp)) <= len(stored_edge_values(reference))


@pytest.mark.parametrize("options", [{"recompute": False}, {"max_recompute": 0}])
def test_recompute_options_change_the_gpu_plan_not_its_results(options):
    results, params, values = gat_training_step()
    runs = {}
    for name, opts in [("default", {}), ("changed", options)]:
        with ngt.make_transformer("gpu", runtime="opencl", **opts) as t:
            comp = t.computation(results, *params)
            runs[name] = comp, comp(*values)
    (default, first), (changed, second) = runs["default"], runs["changed"]
    assert len(stored_edge_values(changed)) > len(stored_edge_values(default))
    for a, b in zip(first, second):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
