"""A GraphLoader slot's declared live rows (BatchSlot.live): what the loader loads for them,
the products ZeroRowProducts then computes over the live rows (every GIN layer's first
Linear included), equality with the step without the pass, and no skip from a count the
slot does not declare (one derived from a caller's own graph mask)."""
import numpy as np
import pytest

import ngnn as ng
from ngnn import datasets, nn, optim
from ngnn import transformers as ngt
from ngnn.graph_train import GraphTrainer
from ngnn.op_graph import BatchNormApply, BatchNormStats
from ngnn.passes import ZeroRowProducts
from ngnn.sampling.graph_loader import GraphLoader
from ngnn.sampling.slot import GraphSlot


def synthetic(num_graphs=24):
    return datasets.synthetic_graphs(num_graphs, min_nodes=2, max_nodes=9, num_features=3,
                                     seed=0)


def gin(data):
    return nn.GINGraph(data.num_features, 6, data.num_classes, num_layers=3, seed=1,
                       dtype=np.float64)


def trained(data, transformer, adam=False, epochs=2):
    """Per-epoch losses and the final parameters of GIN-0 with batch norm (and dropout)
    trained on `data` with `transformer` by SGD, or by Adam (whose step, g / sqrt(v),
    blows rounding up to the learning rate for the Linear biases batch norm cancels:
    their gradients are rounding alone)."""
    model = gin(data)
    optimizer = None if adam else optim.SGD(model.parameters(), lr=0.05)
    trainer = GraphTrainer(model, data, batch_size=5, transformer=transformer,
                           optimizer=optimizer)
    train = np.arange(data.num_graphs)
    losses = [trainer.train_epoch(train, epoch) for epoch in range(epochs)]
    values = [trainer.transformer.variable_value(v) for v in trainer.model.parameters()]
    return losses, values, trainer


@pytest.mark.parametrize("self_loops", [False, True])
def test_a_load_leaves_every_fed_row_past_the_live_count_zero(self_loops):
    """After a large batch, a small one: the live count is the small batch's vertices,
    the feature rows, labels and mask past it are 0, and every edge joins two rows below
    the count or two rows past it (both load paths: the dataset cut, BatchSlot.load)."""
    data = synthetic()
    loader = GraphLoader(data, batch_size=6, shuffle=False, self_loops=self_loops,
                         slack=None)
    loader.load(np.arange(6))
    small = np.array([3])
    loader.load(small)
    n = int(data.graph_sizes[3])
    assert loader.live.tolist() == [n] == [loader.slot.graph.loaded[0]]
    assert not loader.features[n:].any() and loader.features[:n].any()
    assert not loader.labels[1:].any() and loader.mask.tolist() == [True] + [False] * 6
    g = loader.slot.graph
    assert np.array_equal(g.src < n, g.dst < n) and (g.src < n).sum() == \
        data.edge_counts[3] + (n if self_loops else 0)


def test_a_slot_declaring_its_live_rows_takes_square_blocks_only():
    live = ng.placeholder((1,), dtype=np.int64)
    slot = GraphSlot(6, 8, live=live)
    with pytest.raises(ValueError, match="not square"):
        slot.load(ng.Graph(np.array([0, 1]), np.array([0, 0]), 3, num_dst=2))
    with pytest.raises(ValueError, match=r"live must be a \(1,\) int placeholder"):
        GraphSlot(6, 8, num_dst=4, live=live)
    with pytest.raises(ValueError, match=r"live must be a \(1,\) int placeholder"):
        GraphSlot(6, 8, live=ng.placeholder((1,), dtype=np.float64))


@pytest.mark.parametrize("native", [False, True])
def test_gin_trains_as_without_the_pass(native, monkeypatch):
    """GIN-0 with batch norm and dropout, two epochs over a slot in float64: the losses
    (by Adam, as the benchmarks train, and by SGD), the weights and the logits (by SGD)
    are those of the step without ZeroRowProducts, to 1e-12 (only the order of float sums
    differs)."""
    data = synthetic()
    got = trained(data, ngt.make_transformer("numpy", native=native))
    adam = trained(data, ngt.make_transformer("numpy", native=native), adam=True)
    with monkeypatch.context() as patch:
        patch.setattr(ZeroRowProducts, "do_pass", lambda self, computation: None)
        expected = trained(data, ngt.make_transformer("numpy", native=native))
        adam_expected = trained(data, ngt.make_transformer("numpy", native=native),
                                adam=True)
    np.testing.assert_allclose(adam[0], adam_expected[0], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got[0], expected[0], rtol=1e-12, atol=1e-12)
    for a, b in zip(got[1], expected[1]):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got[2].predict(np.arange(8)),
                               expected[2].predict(np.arange(8)), rtol=1e-12, atol=1e-12)


def test_gin_over_a_slot_trains_alike_on_every_backend(transformer_factory):
    """The same two epochs on each backend (the GPU transformer decomposes ZeroRowDot and
    batch norm) equal the NumPy step's."""
    data = synthetic(12)
    got = trained(data, transformer_factory())
    with ngt.make_transformer("numpy") as reference:
        expected = trained(data, reference)
    np.testing.assert_allclose(got[0], expected[0], rtol=1e-9, atol=1e-9)
    for a, b in zip(got[1], expected[1]):
        np.testing.assert_allclose(a, b, rtol=1e-8, atol=1e-9)


def test_every_node_row_product_of_the_gin_step_skips_the_padding():
    """Every product over the slot's node rows is a ZeroRowDot, forward and backward,
    each layer's first Linear (over `x + sum of neighbours`) included; the first layer's
    reads the slot's count itself (its features are declared 0 past it)."""
    data = synthetic()
    with ngt.make_transformer("numpy") as t:
        trainer = GraphTrainer(gin(data), data, batch_size=5, transformer=t)
        trainer.train_epoch(np.arange(10), 0)
        source = trainer.train_step.source
    skipping = [line.split("#")[1] for line in source.splitlines()
                if "K.zero_row_matmul(" in line]
    linear_maps = 2 * 2                     # two layers of two Linear maps
    # Forward, each map's product; backward, its input gradient (but the first map's,
    # whose input is the features), and its weight gradient and bias column sum.
    assert sum("contract=False" in p for p in skipping) == 2 * linear_maps - 1, skipping
    assert sum("contract=True" in p for p in skipping) == 2 * linear_maps, skipping
    assert "%linear_weight_1, %live_rows, contract=False)" in source


def slot_layer(loader, x, live):
    """relu(batch_norm(x)) over `live` rows, then `z + sum of neighbours` over the slot's
    graph, times W: a GIN layer's first Linear."""
    rng = np.random.default_rng(0)
    slot = loader.slot
    gamma = ng.constant(rng.uniform(0.5, 1.5, 3), dtype=np.float64)
    beta = ng.constant(rng.normal(size=3), dtype=np.float64)
    z = ng.relu(BatchNormApply(x, BatchNormStats(x, live), gamma, beta, live))
    total = z + ng.aggregate(ng.gather(z, slot.graph), slot.graph)
    return ng.dot(total, ng.constant(rng.normal(size=(3, 2)), dtype=np.float64))


def test_a_count_derived_from_a_callers_mask_enables_no_skip():
    """Batch norm over a count the caller derives from its own graph mask zeroes the rows
    past that count, but the slot's aggregation keeps rows zero past the slot's declared
    count only: the product after it stays whole, and equals the product without the
    pass where the mask marks graphs that are not the leading ones."""
    data = synthetic()
    loader = GraphLoader(data, batch_size=6, shuffle=False)
    loader.load(np.arange(4))
    slot = loader.slot
    x = ng.placeholder((slot.num_nodes, 3), dtype=np.float64)
    ones = ng.constant(np.ones((slot.num_nodes, 1)))
    mask = ng.placeholder((slot.num_graphs,), dtype=np.bool_)
    counted = ng.sum(ng.readout(ones, slot, "sum") *
                     ng.reshape(ng.cast(mask, np.float64), (slot.num_graphs, 1)), axis=0)
    own_mask = np.zeros(slot.num_graphs, dtype=bool)
    own_mask[2:4] = True                    # graphs 2 and 3: not the leading rows
    features = np.random.default_rng(1).normal(size=(slot.num_nodes, 3))
    with ngt.make_transformer("numpy") as t, \
            ngt.make_transformer("numpy", optimize=False) as plain:
        comp = t.computation(slot_layer(loader, x, counted), x, mask)
        got = comp(features, own_mask)
        expected = plain.computation(slot_layer(loader, x, counted), x, mask)(
            features, own_mask)
        declared = t.computation(slot_layer(loader, x, ng.cast(slot.live, np.float64)),
                                 x, slot.live)
        declared(features, loader.live)
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)
    assert "zero_row_dot" not in comp.source
    assert "zero_row_dot" in declared.source


def test_declared_features_skip_only_where_the_count_is_fed():
    """The features placeholder declares its rows 0 past the slot's count; a computation
    not fed the count keeps its products whole (and needs no count)."""
    data = synthetic()
    loader = GraphLoader(data, batch_size=6, shuffle=False)
    loader.load(np.arange(4))
    slot = loader.slot
    x = slot.node_features(3, np.float64)
    w = ng.constant(np.ones((3, 2)))
    product = ng.dot(x + ng.aggregate(ng.gather(x, slot.graph), slot.graph), w)
    features = loader.features.astype(np.float64)
    with ngt.make_transformer("numpy") as t:
        unfed = t.computation(product, x)
        fed = t.computation(product, x, slot.live)
        np.testing.assert_allclose(unfed(features), fed(features, loader.live),
                                   rtol=1e-12, atol=1e-12)
    assert "zero_row_dot" not in unfed.source and "zero_row_dot" in fed.source


def test_native_groups_stop_at_the_live_count_and_write_zeros(monkeypatch):
    """`x + sum of neighbours` over the slot, as the C group that stops at the fed count
    (its NumPy fallback would fail the test): after a large batch and then a small one
    (whose padding rows the large one filled), the rows below the count equal NumPy's and
    the rows past it are exactly 0."""
    from ngnn.transformers.numpy import native
    prepare_group = native.prepare_group

    def fallback_fails(*args):
        raise AssertionError("the group fell back to NumPy")

    def in_c_only(*args, live=False):
        return prepare_group(*args[:-1], fallback_fails, live=live)
    monkeypatch.setattr(native, "prepare_group", in_c_only)
    data = synthetic()
    loader = GraphLoader(data, batch_size=6, shuffle=False, slack=None)
    slot = loader.slot
    x = slot.node_features(3, np.float64)
    total = x + ng.aggregate(ng.gather(x, slot.graph), slot.graph)
    with ngt.make_transformer("numpy", native=True) as fast, \
            ngt.make_transformer("numpy") as t:
        native_step = fast.computation(ng.relu(total), x, slot.live)
        numpy_step = t.computation(ng.relu(total), x, slot.live)
        for ids in (np.arange(6), np.array([3])):
            loader.load(ids)
            features = loader.features.astype(np.float64)
            got = native_step(features, loader.live)
            n = loader.live[0]
            np.testing.assert_array_equal(got[:n], numpy_step(features, loader.live)[:n])
            assert got[:n].any() and not got[n:].any()
    assert "live=True" in native_step.source
