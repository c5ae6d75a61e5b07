"""The graph-classification fast paths give what the plain paths give: GraphLoader's batches
cut out of the dataset's CSR orders (GraphSlot.load_grouped) against BatchSlot.load of
GraphDataset.batch, and small dropout masks (one reset Philox, kept for recomputation)
against the chunked draw of the same positions."""
import numpy as np
import pytest

from ngnn import datasets, philox
from ngnn.datasets.graph_dataset import GraphDataset
from ngnn.distributed.partition import balanced_ranges, equal_ranges
from ngnn.graph import Graph
from ngnn.sampling.graph_loader import GraphLoader
from ngnn.sampling.slot import GraphSlot

GRAPH_ARRAYS = ("src", "dst", "in_indptr", "in_eids", "in_src", "in_degrees", "out_indptr",
                "out_eids", "out_dst", "out_degrees")


def assert_same_graph(a, b):
    assert (a.num_nodes, a.num_dst, a.num_edges, a.loaded) == \
        (b.num_nodes, b.num_dst, b.num_edges, b.loaded)
    for name in GRAPH_ARRAYS:
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype, name
        np.testing.assert_array_equal(x, y, err_msg=name)


def with_empty_graphs():
    """Graphs of 0, 1 or 2 vertices: batches with fewer vertices than graphs."""
    sizes = np.random.default_rng(0).integers(0, 3, 40)
    graphs = [Graph([0] if n > 1 else [], [1] if n > 1 else [], n) for n in sizes]
    return GraphDataset("empty", graphs, sizes % 2, np.arange(3 * sizes.sum()).reshape(-1, 3))


SMALL = {"mutag": lambda: datasets.load("mutag"),
         "synthetic": lambda: datasets.synthetic_graphs(num_graphs=40, min_nodes=1,
                                                        max_nodes=9, edge_prob=0.5),
         "empty graphs": with_empty_graphs}


@pytest.mark.parametrize("name, batch_size", [(name, size) for name in SMALL
                                              for size in (1, 7, 32)] + [("nci1", 32)])
def test_cut_batches_equal_the_batched_graphs_loaded(name, batch_size):
    data = SMALL[name]() if name in SMALL else datasets.load(name)
    fast = GraphLoader(data, batch_size=batch_size, seed=3)
    plain = GraphLoader(data, batch_size=batch_size, seed=3)
    for epoch in range(2):
        for ids in fast.split(fast.order(epoch)):
            fast.load(ids)
            batch, features = data.batch(ids)
            plain.slot.load(batch)
            assert_same_graph(fast.slot.graph, plain.slot.graph)
            assert_same_graph(fast.slot.readout_graph, plain.slot.readout_graph)
            assert fast.slot.loaded == ids.size
            np.testing.assert_array_equal(fast.features[:batch.num_nodes], features)
            assert not fast.features[batch.num_nodes:].any()
            np.testing.assert_array_equal(fast.labels[:ids.size], data.labels[ids])
            assert not fast.labels[ids.size:].any()
            np.testing.assert_array_equal(fast.mask, np.arange(fast.mask.size) < ids.size)


@pytest.mark.parametrize("name", ["mutag", "nci1"])
def test_a_cut_batch_is_the_batched_graph(name):
    # What each rank partitions (RankGraphLoader.load): the batch's edges in
    # GraphDataset.batch's order, its vertices' graphs and their feature rows.
    data = datasets.load(name)
    loader = GraphLoader(data, batch_size=32, seed=3)
    for ids in loader.split(loader.order(1)):
        batch, features = data.batch(ids)
        n, edges, graph_ids, nodes = loader._cut.batch(ids)
        assert n == batch.num_nodes
        for attribute, array in zip(("src", "dst", "in_eids", "out_eids"), edges):
            np.testing.assert_array_equal(array, getattr(batch, attribute), err_msg=attribute)
        np.testing.assert_array_equal(graph_ids, batch.graph_ids)
        np.testing.assert_array_equal(data.features[nodes], features)


@pytest.mark.parametrize("data", [datasets.load("mutag"), with_empty_graphs()],
                         ids=["mutag", "empty graphs"])
@pytest.mark.parametrize("slack", [1.0, 1.25, None])
def test_split_is_the_greedy_cut(data, slack):
    # Graph by graph: a batch takes the next graph while it stays within every limit.
    loader = GraphLoader(data, batch_size=7, seed=2, self_loops=True, slack=slack)
    order = loader.order(0)
    expected, batch, nodes, edges = [], [], 0, 0
    for graph in order.tolist():
        size = int(data.graph_sizes[graph])
        count = int(data.edge_counts[graph]) + size
        if len(batch) == 7 or nodes + size > loader.max_nodes or \
                edges + count > loader.max_edges:
            expected.append(batch)
            batch, nodes, edges = [], 0, 0
        batch, nodes, edges = batch + [graph], nodes + size, edges + count
    expected.append(batch)
    assert [ids.tolist() for ids in loader.split(order)] == expected


def test_equal_ranges_are_balanced_ranges_of_unit_weights():
    # What each rank partitions a batch by (RankGraphLoader.load).
    for n in [0, 1, 2, 3, 7, 31, 32, 33, 1000, 4099]:
        for parts in [1, 2, 3, 4, 7, 8]:
            np.testing.assert_array_equal(equal_ranges(n, parts),
                                          balanced_ranges(np.ones(n), parts))


def test_load_csr_refuses_a_block_without_room_for_padding():
    slot = GraphSlot(4, 3)
    csr, indptrs = np.zeros((2, 3), np.int64), np.zeros((2, 5), np.int64)
    csr[:, :2] = [[0, 1], [1, 2]]
    with pytest.raises(ValueError, match="do not fit"):
        slot.load_csr(4, 4, 2, csr, indptrs, None)


@pytest.mark.parametrize("shape", [(1,), (33, 64), (7, 5, 3), (philox.CHUNK,)])
def test_small_dropout_masks_equal_the_chunked_draw(shape):
    x = np.ones(shape, np.float32)
    for stream in (0, 5, 2 ** 40):
        expected = philox.keep_bits(11, stream, 0.5, np.empty(shape, np.bool_)) * \
            np.float32(2.0)
        first = philox.dropout(x, 11, stream, 0.5, np.empty_like(x))
        again = philox.dropout(x, 11, stream, 0.5, np.empty_like(x))   # the kept mask
        np.testing.assert_array_equal(first, expected)
        np.testing.assert_array_equal(again, expected)
        bits = philox.words(11, 0, x.size, stream) >= philox.keep_threshold(0.5)
        np.testing.assert_array_equal(first.reshape(-1) != 0, bits)


def test_kept_masks_tell_rates_and_sizes_apart():
    x = np.ones(64, np.float32)
    low = philox.dropout(x, 1, 2, 0.1, np.empty_like(x))
    high = philox.dropout(x, 1, 2, 0.9, np.empty_like(x))
    shorter = philox.dropout(x[:40], 1, 2, 0.1, np.empty(40, np.float32))
    assert np.count_nonzero(low) > np.count_nonzero(high)
    np.testing.assert_array_equal(shorter != 0, low[:40] != 0)
