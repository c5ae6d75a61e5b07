"""An attention's softmax and the weighted sum consuming it in one walk of each vertex's
edges on the GPU (an online softmax: running max, rescaled sum and accumulator; a heavy
row's chunks fold their (max, sum, accumulator) triples in chunk order). A GAT layer's
forward is one graph kernel where no row is heavy and a partial kernel plus one where some
are; no E x heads tensor is stored; values and every gradient equal the NumPy transformer's
and repeat bit for bit, on a 100,000-edge star's hub and on R-MAT."""
import numpy as np
import pytest

import ngnn as ng
from ngnn import nn
from ngnn import transformers as ngt
from ngnn.op_graph import ordered_ops

from test_gpu_edge_schedule import (HUB, assert_equal_to_numpy_and_repeatable,  # noqa: F401
                                    gpu, rmat, seed_gat, star, weighted_loss)

rng = np.random.default_rng(7)


def gat(dtype):
    return nn.GAT(3, hidden=2, heads=8, num_classes=3, seed=0, dtype=dtype)


def ring(n):
    """Every vertex with two in-edges: no heavy row."""
    v = np.arange(n)
    return ng.Graph.from_edges(np.concatenate([v, v]),
                               np.concatenate([(v + 1) % n, (v + 2) % n]), num_nodes=n)


def forward_graph_kernels(comp):
    """{fused group: templates of its kernels} over the kernels computing the loss."""
    forward = set(ordered_ops(comp.results[:1]))
    groups = {}
    for row, kernel in zip(comp.kernel_report(), comp.executor.kernels):
        if row["group"] is not None and kernel.op in forward:
            groups.setdefault(row["group"], []).append(row["template"])
    return groups


@pytest.mark.parametrize("graph, heavy", [("ring", False), ("rmat", True)])
def test_a_gat_layer_forward_is_one_walk_and_stores_no_edge_tensor(gpu, graph, heavy):
    g = ring(500) if graph == "ring" else rmat(3000)
    h = ng.placeholder((g.num_nodes, 3), name="h")
    model = gat(np.float32)
    loss = weighted_loss([model(g, h, training=True)])
    comp = gpu.computation([loss] + ng.grad(loss, model.parameters()), h)
    comp(rng.standard_normal((g.num_nodes, 3)).astype(np.float32))
    forward = set(ordered_ops(comp.results[:1]))
    # Each layer's weighted sum (and a backward sum of the weights times a gradient).
    assert len(set(comp.kernel_plan.online_softmax) & forward) == 2
    groups = forward_graph_kernels(comp)
    assert len(groups) == 2, groups
    for templates in groups.values():
        # The max, the sum of exponentials and the weighted sum: one row kernel, and
        # for heavy rows one partial kernel of (max, sum, weighted sum) triples.
        assert templates == (["partial.j2"] if heavy else []) + ["vertex_rows.j2"]
    assert [op for op in comp.memory_plan.slots if op.scope == "e"] == []


def test_an_unshifted_softmax_is_not_taken_for_one_pass():
    """seed 000's GAT writes exp(x) without the max: its sum is walked as written."""
    g = ring(50)
    h = ng.placeholder((g.num_nodes, 3), dtype=np.float64, name="h")
    with ngt.make_transformer("gpu", runtime="opencl") as t:
        comp = t.computation(seed_gat(g, h), h)
        comp.transform()
        assert comp.kernel_plan.online_softmax == {}


@pytest.mark.parametrize("graph, dtype, rtol", [("star", np.float32, 1e-5),
                                                ("rmat", np.float32, 1e-5),
                                                ("rmat", np.float64, 1e-12)])
def test_gat_training_step_equals_numpy_and_repeats(gpu, graph, dtype, rtol):
    """GAT (8 heads, dropout) forward and every gradient. (The float64 star is
    test_gpu_edge_schedule's.) NumPy's reference sums in float64: a float32 sum over the
    hub's 100,000 edges in NumPy's order is off by up to 5e-5 of the result for some
    weights, the GPU's chunked sums within 1e-5 of the float64 ones."""
    g = star(HUB) if graph == "star" else rmat(3000)
    h = ng.placeholder((g.num_nodes, 3), dtype=dtype, name="h")
    model = gat(dtype)
    logits = model(g, h, training=True)
    loss = weighted_loss([logits])
    x = rng.standard_normal((g.num_nodes, 3)).astype(dtype)
    assert_equal_to_numpy_and_repeatable(
        gpu, [logits, loss] + ng.grad(loss, model.parameters() + [h]), [h], [x], rtol,
        wide_accumulation=True)


def test_seed_gat_on_rmat_equals_numpy_in_float32(gpu):
    g = rmat(3000)
    h = ng.placeholder((g.num_nodes, 3), dtype=np.float32, name="h")
    out = seed_gat(g, h, dtype=np.float32)
    loss = weighted_loss([out])
    x = rng.standard_normal((g.num_nodes, 3)).astype(np.float32)
    assert_equal_to_numpy_and_repeatable(gpu, [out, loss] + ng.grad(loss, [h]), [h], [x],
                                         rtol=1e-5)


def test_gat_step_plan_stores_no_scores_activations_or_wide_products():
    """The rest of the step's plan: attention scores are computed by the graph kernels
    reading them (no row-sum kernel before each layer), ELU by its readers, the gradient
    through ELU by the epilogue of the product before it, and each attention vector's
    gradient from the per-head gradient a group writes, not from an (N, heads, F) product
    the group would write; one product per shared weight's gradient."""
    g = rmat(3000)
    h = ng.placeholder((g.num_nodes, 16), name="h")
    model = nn.GAT(16, hidden=8, heads=8, num_classes=3, seed=0)
    loss = weighted_loss([model(g, h, training=True)])
    with ngt.make_transformer("gpu", runtime="opencl") as t:
        comp = t.computation([loss] + ng.grad(loss, model.parameters()), h)
        comp.transform()
        kernels = comp.executor.kernels
        written = [op for k in kernels for op in k.outputs]
        assert not any(type(op).__name__ == "Elu" for op in written)
        assert not any(type(op).__name__ == "Sum" and op.shape == (g.num_nodes, 8, 1)
                       for op in written)
        epilogues = [k for k in kernels if k.template == "gemm.j2" and
                     type(k.op).__name__ != "Dot"]
        assert len(epilogues) == 1
        wide = [op for k in kernels if k.template == "vertex_rows.j2"
                for op in k.outputs if op.size == g.num_nodes * 64]
        # The first layer's output and the gradient of its features: nothing else as wide.
        assert len(wide) == 2, wide
        dense_products = [k for k in kernels if k.template == "gemm.j2"]
        assert len(dense_products) == 5, [k.name for k in dense_products]
