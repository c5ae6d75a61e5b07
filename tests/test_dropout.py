"""Dropout masks are recomputed, never stored: the same bits on every backend for the same
seed and call, drawn again by the backward pass and by every fused group that uses them,
so a training step with dropout plans about the memory of the same step without it."""
import numpy as np
import pytest

import ngnn as ng
from ngnn import datasets, nn, optim
from ngnn import transformers as ngt
from ngnn.op_graph import Aggregate, Dropout, Gather

GPU = "gpu" in ngt.transformer_choices()


@pytest.mark.skipif(not GPU, reason="no GPU runtime")
def test_mask_is_identical_on_numpy_and_gpu_for_the_same_seed():
    x = ng.placeholder((37, 11), name="x")        # 407 elements: counters cut mid-row
    y = ng.dropout(x, 0.6, seed=2 ** 64 - 5) * 1.0
    xv = np.random.default_rng(0).standard_normal(x.shape).astype(np.float32)
    with ngt.make_transformer("numpy") as cpu, ngt.make_transformer("gpu") as gpu:
        on_cpu, on_gpu = cpu.computation(y, x), gpu.computation(y, x)
        for _ in range(3):
            a, b = on_cpu(xv), on_gpu(xv)
            assert a.view(np.uint32).tolist() == b.view(np.uint32).tolist()


@pytest.mark.skipif(not GPU, reason="no GPU runtime")
def test_edge_dropout_in_a_fused_group_matches_the_gpu():
    rng = np.random.default_rng(1)
    g = ng.Graph.from_edges(rng.integers(0, 40, 300), rng.integers(0, 40, 300), num_nodes=40)
    h = ng.placeholder((40, 3, 2), name="h")
    out = Aggregate(ng.dropout(Gather(h, g, "src"), 0.5, seed=9) * 2.0, g, "dst", "sum")
    hv = rng.standard_normal(h.shape).astype(np.float32)
    with ngt.make_transformer("numpy", fusion_block_bytes=256) as cpu, \
            ngt.make_transformer("gpu") as gpu:
        fused, device = cpu.computation(out, h), gpu.computation(out, h)
        for _ in range(2):
            np.testing.assert_allclose(fused(hv), device(hv), rtol=1e-6, atol=1e-6)
        assert fused.fusion_groups


def test_backward_draws_the_mask_again():
    x = ng.placeholder((20, 8), name="x")
    w = ng.variable((8, 4), initial_value=np.ones((8, 4)), name="w")
    loss = ng.sum(ng.tanh(ng.dot(ng.dropout(x, 0.5, seed=4), w)))
    with ngt.make_transformer("numpy") as t:
        comp = t.computation([loss, ng.grad(loss, w)], x)
        comp.transform()
        readers = {}
        for op in comp.ordered_ops:
            for a in op.args:
                if isinstance(a, Dropout):
                    readers.setdefault(a, set()).add(op)
        assert len(readers) == 2 and all(len(r) == 1 for r in readers.values())
        assert {d.seed for d in readers} == {4}


def plan_bytes(data, rate):
    model = nn.GAT(16, hidden=8, heads=8, num_classes=8, dropout=rate)
    x = ng.placeholder((data.num_nodes, 16), name="x")
    labels = ng.placeholder((data.num_nodes,), dtype=np.int64, name="labels")
    loss = ng.cross_entropy(model(data.graph, x, training=True), labels)
    with ngt.make_transformer("numpy") as t:
        comp = t.computation([loss] + optim.Adam(model.parameters()).updates(loss), x, labels)
        return comp.memory_plan.peak_bytes


def test_gat_step_with_dropout_plans_within_ten_percent_of_the_step_without():
    # benchmarks/bench_dropout.py measures the same at R-MAT 100K, planned and peak.
    data = datasets.synthetic("rmat", 2000, 16, 16, 8, seed=0)
    assert plan_bytes(data, 0.6) <= 1.10 * plan_bytes(data, 0.0)


def gat_first_loss(t, g, x, labels):
    """The first-call training loss of a fresh nn.GAT (dropout 0.5, fixed weights)."""
    model = nn.GAT(x.shape[1], hidden=4, heads=2, num_classes=3, dropout=0.5, seed=0)
    xs = ng.placeholder(x.shape, name="x")
    ys = ng.placeholder(labels.shape, dtype=np.int64, name="labels")
    loss = ng.cross_entropy(model(g, xs, training=True), ys)
    return t.computation(loss, xs, ys)(x, labels)


def test_models_built_after_the_same_manual_seed_give_the_same_losses(transformer_factory):
    rng = np.random.default_rng(3)
    g = ng.Graph.from_edges(rng.integers(0, 30, 200), rng.integers(0, 30, 200), num_nodes=30)
    x = rng.standard_normal((30, 5)).astype(np.float32)
    labels = rng.integers(0, 3, 30)
    t = transformer_factory()
    ng.manual_seed(0)
    first = gat_first_loss(t, g, x, labels)
    unseeded = gat_first_loss(t, g, x, labels)       # the stream went on: other masks
    ng.manual_seed(0)
    again = gat_first_loss(t, g, x, labels)
    ng.manual_seed(1)
    other = gat_first_loss(t, g, x, labels)
    assert again == first
    assert unseeded != first and other != first


def test_manual_seed_restarts_the_key_stream_that_trainers_share():
    ng.manual_seed(7)
    drawn = [ng.random.next_seed() for _ in range(100)]       # past the first run of keys
    ng.manual_seed(7)
    assert [ng.random.next_seed() for _ in range(100)] == drawn
    assert drawn == [int(k) for k in ng.random.keys(7, 100)]
    assert len(set(drawn)) == 100
    ng.manual_seed(7)
    assert ng.dropout(ng.placeholder((2, 2)), 0.5).seed == drawn[0]
    for bad in (-1, 2 ** 64, 1.5, True, "0"):
        with pytest.raises(ValueError, match="seed must be an int in \\[0, 2\\*\\*64\\)"):
            ng.manual_seed(bad)
