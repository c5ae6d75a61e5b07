"""Graph.batch and ng.readout: the block-diagonal batch, and the per-graph sum, mean and max
against NumPy references and PyTorch Geometric's global pools (float64, forward and
gradient), with finite-difference gradient checks, on every backend."""
import numpy as np
import pytest

import ngnn as ng
from ngnn import nn

from helpers import check_gradient

SIZES = (3, 5, 1, 4, 6)      # graph 2 has one vertex and no edge
F = 4


def small_graphs(sizes=SIZES, seed=0):
    rng = np.random.default_rng(seed)
    graphs = []
    for n in sizes:
        e = 2 * n if n > 1 else 0
        graphs.append(ng.Graph.from_edges(rng.integers(0, n, e), rng.integers(0, n, e), n))
    return graphs


def reference(h, graph_ids, num_graphs, reduce):
    out = np.zeros((num_graphs,) + h.shape[1:])
    for k in range(num_graphs):
        rows = h[graph_ids == k]
        if len(rows):
            out[k] = getattr(rows, reduce)(axis=0)
    return out


def test_batch_is_block_diagonal_and_unbatches():
    graphs = small_graphs()
    gb = ng.Graph.batch(graphs)
    assert gb.num_graphs == len(SIZES) and gb.num_nodes == sum(SIZES)
    np.testing.assert_array_equal(gb.node_offsets, np.cumsum((0,) + SIZES))
    np.testing.assert_array_equal(gb.edge_offsets,
                                  np.cumsum([0] + [g.num_edges for g in graphs]))
    np.testing.assert_array_equal(gb.graph_ids, np.repeat(np.arange(len(SIZES)), SIZES))
    assert gb.graph_ids.dtype == np.int64
    # No edge crosses from one graph into another.
    np.testing.assert_array_equal(gb.graph_ids[gb.src], gb.graph_ids[gb.dst])
    for g, back in zip(graphs, gb.unbatch()):
        assert back.num_nodes == g.num_nodes
        np.testing.assert_array_equal(back.src, g.src)
        np.testing.assert_array_equal(back.dst, g.dst)


def test_a_layer_on_the_batch_equals_the_layer_on_each_graph(transformer_factory):
    graphs = small_graphs()
    gb = ng.Graph.batch(graphs)
    conv = nn.GINConv(F, 3, seed=0, dtype=np.float64)
    x = np.random.default_rng(1).standard_normal((gb.num_nodes, F))
    t = transformer_factory()
    h = ng.placeholder(x.shape, dtype=np.float64)
    whole = t.computation(conv(gb, h), h)(x)
    for k, g in enumerate(graphs):
        rows = slice(gb.node_offsets[k], gb.node_offsets[k + 1])
        hk = ng.placeholder((g.num_nodes, F), dtype=np.float64)
        alone = t.computation(conv(g, hk), hk)(x[rows])
        np.testing.assert_allclose(whole[rows], alone, rtol=0, atol=1e-12)


@pytest.mark.parametrize("reduce", ["sum", "mean", "max"])
def test_readout_and_its_gradient_equal_numpy(transformer_factory, reduce):
    gb = ng.Graph.batch(small_graphs())
    rng = np.random.default_rng(2)
    x = rng.standard_normal((gb.num_nodes, F))
    weights = rng.uniform(0.5, 1.5, (gb.num_graphs, F))
    h = ng.placeholder(x.shape, dtype=np.float64)
    pooled = ng.readout(h, gb, reduce)
    assert pooled.shape == (gb.num_graphs, F)
    loss = ng.sum(pooled * ng.constant(weights, dtype=np.float64))
    out, grad = transformer_factory().computation([pooled, ng.grad(loss, h)], h)(x)
    np.testing.assert_allclose(out, reference(x, gb.graph_ids, gb.num_graphs, reduce),
                               rtol=0, atol=1e-12)
    expected = weights[gb.graph_ids]
    if reduce == "mean":
        expected = expected / gb.graph_sizes[gb.graph_ids][:, None]
    if reduce == "max":
        expected = expected * (x == out[gb.graph_ids])
    np.testing.assert_allclose(grad, expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("reduce", ["sum", "mean", "max"])
def test_readout_gradient_by_finite_differences(transformer_factory, reduce):
    gb = ng.Graph.batch(small_graphs())
    x = np.random.default_rng(3).standard_normal((gb.num_nodes, F))
    check_gradient(lambda h: ng.readout(ng.tanh(h), gb, reduce), [x], transformer_factory,
                   coords=12)


def test_max_readout_shares_the_gradient_among_ties(transformer_factory):
    gb = ng.Graph.batch(small_graphs((3, 2)))
    x = np.array([[1.0], [2.0], [2.0], [5.0], [-1.0]])
    h = ng.placeholder(x.shape, dtype=np.float64)
    grad = transformer_factory().computation(
        ng.grad(ng.sum(ng.readout(h, gb, "max")), h), h)(x)
    np.testing.assert_array_equal(grad[:, 0], [0.0, 0.5, 0.5, 1.0, 0.0])


@pytest.mark.parametrize("reduce", ["sum", "mean", "max"])
def test_readout_equals_pyg_global_pools(transformer_factory, reduce):
    import torch
    from torch_geometric.nn import global_add_pool, global_max_pool, global_mean_pool
    pools = {"sum": global_add_pool, "mean": global_mean_pool, "max": global_max_pool}
    gb = ng.Graph.batch(small_graphs())
    rng = np.random.default_rng(4)
    x = rng.standard_normal((gb.num_nodes, F))
    weights = rng.uniform(0.5, 1.5, (gb.num_graphs, F))
    h = ng.placeholder(x.shape, dtype=np.float64)
    pooled = ng.readout(ng.tanh(h), gb, reduce)
    loss = ng.sum(pooled * ng.constant(weights, dtype=np.float64))
    out, grad = transformer_factory().computation([pooled, ng.grad(loss, h)], h)(x)

    xt = torch.tensor(x, requires_grad=True)
    expected = pools[reduce](torch.tanh(xt), torch.tensor(gb.graph_ids))
    (expected * torch.from_numpy(weights)).sum().backward()
    np.testing.assert_allclose(out, expected.detach().numpy(), rtol=0, atol=1e-9)
    np.testing.assert_allclose(grad, xt.grad.numpy(), rtol=0, atol=1e-9)


@pytest.mark.parametrize("reduce", ["sum", "mean", "max"])
def test_an_empty_graph_reads_out_zero_with_zero_gradient(transformer_factory, reduce):
    graphs = small_graphs((2, 0, 3, 0))
    gb = ng.Graph.batch(graphs)
    x = np.random.default_rng(5).standard_normal((gb.num_nodes, F)) - 3.0   # all negative
    h = ng.placeholder(x.shape, dtype=np.float64)
    pooled = ng.readout(h, gb, reduce)
    out, grad = transformer_factory().computation([pooled, ng.grad(ng.sum(pooled), h)], h)(x)
    np.testing.assert_array_equal(out[[1, 3]], 0.0)
    np.testing.assert_allclose(out[[0, 2]], reference(x, gb.graph_ids, 4, reduce)[[0, 2]],
                               rtol=0, atol=1e-12)
    assert np.all(np.isfinite(grad))


def test_more_graphs_than_nodes(transformer_factory):
    gb = ng.Graph.batch(small_graphs((0, 1, 0, 0)))
    h = ng.placeholder((1, F), dtype=np.float64)
    out = transformer_factory().computation(ng.readout(h, gb, "mean"), h)(np.ones((1, F)))
    np.testing.assert_array_equal(out, [[0.0] * F, [1.0] * F, [0.0] * F, [0.0] * F])


def test_readout_rejects_bad_input():
    gb = ng.Graph.batch(small_graphs())
    h = ng.placeholder((gb.num_nodes + 1, F))
    with pytest.raises(ng.ShapeError, match=f"node tensor with {gb.num_nodes} rows"):
        ng.readout(h, gb)
    with pytest.raises(ValueError, match="reduce must be one of"):
        ng.readout(ng.placeholder((gb.num_nodes, F)), gb, "min")
    with pytest.raises(TypeError, match="expected a batch of graphs"):
        ng.readout(ng.placeholder((3, F)), ng.Graph.from_edges([0], [1], 3))
    with pytest.raises(ValueError, match="at least one graph"):
        ng.Graph.batch([])
    with pytest.raises(TypeError, match="item 1 is int"):
        ng.Graph.batch([small_graphs()[0], 3])


def test_the_api_md_block_runs_as_written():
    from ngnn import datasets
    from ngnn import transformers as ngt
    g1, g2, g3 = small_graphs((3, 2, 4))
    # ---- API.md, "Many graphs, readouts and graph classification" (verbatim) ----
    gb = ng.Graph.batch([g1, g2, g3])       # one block-diagonal graph
    gb.graph_ids                            # (N,) int64: the graph each node belongs to
    gb.num_graphs, gb.node_offsets          # offsets: (num_graphs + 1,)
    gs = gb.unbatch()                       # the graphs again
    h = ng.placeholder((gb.num_nodes, F), dtype=np.float64)
    pooled = ng.readout(h, gb, reduce="sum")   # (num_graphs, F); also "mean", "max"; has gradients

    data = datasets.load("mutag")           # a GraphDataset: embedded TU datasets "mutag", ...
    data.graphs, data.labels, data.num_classes, data.num_features   # labels mapped to 0 .. C-1
    # ----
    assert [g.num_nodes for g in gs] == [3, 2, 4] and gb.node_offsets.tolist() == [0, 3, 5, 9]
    x = np.arange(9 * F, dtype=np.float64).reshape(9, F)
    with ngt.make_transformer("numpy") as t:
        np.testing.assert_array_equal(t.computation(pooled, h)(x),
                                      [x[:3].sum(0), x[3:5].sum(0), x[5:].sum(0)])
    assert (len(data.graphs), data.num_classes, data.num_features) == (188, 2, 7)
