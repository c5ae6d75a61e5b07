"""ng.batch_norm and nn.BatchNorm: equal to torch.nn.BatchNorm1d in float64 (training
statistics, gradients, running statistics, evaluation), statistics over the real nodes of a
batch only, gradients by finite differences; and GIN-0 with the paper's batch norm equal to
PyTorch Geometric's on identical weights through training steps over padded slots."""
import numpy as np
import pytest

import ngnn as ng
from ngnn import datasets, nn
from ngnn.graph_train import GraphTrainer
from ngnn.sampling.graph_loader import GraphLoader

from helpers import check_gradient


def graphs(num_graphs=9, seed=0):
    return datasets.synthetic_graphs(num_graphs, min_nodes=2, max_nodes=9, num_features=3,
                                     seed=seed)


def test_batch_norm_equals_torch_batchnorm1d(transformer_factory):
    import torch
    rng = np.random.default_rng(0)
    x, up = rng.normal(1.0, 2.0, (11, 4)), rng.normal(size=(11, 4))
    norm = nn.BatchNorm(4, momentum=0.3, dtype=np.float64)
    xs = ng.placeholder(x.shape, dtype=np.float64)
    y = norm(xs, training=True)
    grads = ng.grad(ng.sum(y * ng.constant(up, dtype=np.float64)), [xs, norm.weight, norm.bias])
    t = transformer_factory()
    train = t.computation([y] + grads + norm.updates, xs)
    evaluate = t.computation(norm(xs, training=False), xs)
    t.set_variable(norm.weight, np.linspace(0.5, 2.0, 4))
    t.set_variable(norm.bias, np.linspace(-1.0, 1.0, 4))
    out, dx, dw, db = train(x)[:4]
    train(2.0 * x)                                   # a second step moves the statistics on
    evaluated = evaluate(x)

    reference = torch.nn.BatchNorm1d(4, momentum=0.3).double()
    with torch.no_grad():
        reference.weight.copy_(torch.tensor(np.linspace(0.5, 2.0, 4)))
        reference.bias.copy_(torch.tensor(np.linspace(-1.0, 1.0, 4)))
    xt = torch.tensor(x, requires_grad=True)
    expected = reference(xt)
    (expected * torch.tensor(up)).sum().backward()
    reference(torch.tensor(2.0 * x))
    reference.eval()
    close = {"rtol": 1e-9, "atol": 1e-9}
    np.testing.assert_allclose(out, expected.detach().numpy(), **close)
    np.testing.assert_allclose(dx, xt.grad.numpy(), **close)
    np.testing.assert_allclose(dw, reference.weight.grad.numpy(), **close)
    np.testing.assert_allclose(db, reference.bias.grad.numpy(), **close)
    np.testing.assert_allclose(t.variable_value(norm.running_mean),
                               reference.running_mean.numpy(), **close)
    np.testing.assert_allclose(t.variable_value(norm.running_var),
                               reference.running_var.numpy(), **close)
    np.testing.assert_allclose(evaluated, reference(torch.tensor(x)).detach().numpy(), **close)


def test_batch_norm_gradient_by_finite_differences(transformer_factory):
    rng = np.random.default_rng(1)
    gb = ng.Graph.batch(graphs(4).graphs)
    x = rng.normal(size=(gb.num_nodes, 3))
    weight, bias = rng.uniform(0.5, 1.5, 3), rng.normal(size=3)
    check_gradient(lambda h, w, b: ng.tanh(ng.batch_norm(h, w, b, batch=gb)[0]),
                   [x, weight, bias], transformer_factory, coords=8)


def test_batch_statistics_leave_the_slots_padding_out(transformer_factory):
    """In a loader's slot (padding rows and padding graphs past the batch), the statistics
    are those of the batch's nodes alone (the slot's declared live rows, fed with the
    batch), whatever the padding rows hold."""
    import torch
    data = graphs(12)
    loader = GraphLoader(data, batch_size=5, shuffle=False)
    slot = loader.slot
    ids = np.arange(3)
    loader.load(ids)
    n = int(data.node_offsets[3])
    assert slot.num_nodes > n and loader.mask.sum() == 3 < slot.num_graphs
    rng = np.random.default_rng(2)
    x = rng.normal(size=(slot.num_nodes, 3))
    x[n:] = 1e3                                      # padding that would spoil the statistics
    xs = ng.placeholder(x.shape, dtype=np.float64)
    y, mean, var, count = ng.batch_norm(xs, ng.constant(np.ones(3), dtype=np.float64),
                                        ng.constant(np.zeros(3), dtype=np.float64),
                                        batch=slot)
    assert loader.live.tolist() == [n]
    out = transformer_factory().computation([y, mean, var, count], xs, slot.live)(
        x, loader.live)
    expected = torch.nn.functional.batch_norm(torch.tensor(x[:n]), None, None, training=True)
    np.testing.assert_allclose(out[0][:n], expected.numpy(), rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(out[1], x[:n].mean(axis=0), rtol=1e-9)
    np.testing.assert_allclose(out[2], x[:n].var(axis=0), rtol=1e-9)
    assert out[3].tolist() == [n]


def test_batch_norm_without_real_nodes_stays_finite(transformer_factory):
    """Statistics over no node (no live row) divide by 1, not 0."""
    loader = GraphLoader(graphs(4), batch_size=2, shuffle=False)
    x = np.ones((loader.slot.num_nodes, 3))
    xs = ng.placeholder(x.shape, dtype=np.float64)
    y, mean, var, count = ng.batch_norm(xs, ng.constant(np.ones(3), dtype=np.float64),
                                        ng.constant(np.zeros(3), dtype=np.float64),
                                        batch=loader.slot)
    out = transformer_factory().computation([y, count], xs, loader.slot.live)(
        x, np.zeros(1, dtype=np.int64))
    assert np.isfinite(out[0]).all() and out[1].tolist() == [1.0]


def test_batch_norm_rejects_bad_input():
    x = ng.placeholder((5, 3), dtype=np.float64)
    with pytest.raises(ng.op_graph.ShapeError, match="batch_norm: expected x"):
        ng.batch_norm(x, np.ones(4), np.zeros(3))
    with pytest.raises(ValueError, match="eps must be positive"):
        ng.batch_norm(x, np.ones(3), np.zeros(3), eps=0.0)
    with pytest.raises(ValueError, match="momentum must be in"):
        nn.BatchNorm(3, momentum=0.0)


def torch_gin_bn(model, weights):
    """PyTorch Geometric's GIN-0 with the paper's batch norm (GINConv over Linear-
    BatchNorm1d-ReLU-Linear, then BatchNorm1d and ReLU; global_add_pool of every layer; a
    Linear per layer) holding `weights` (ngnn's parameters, in order)."""
    import torch
    from torch_geometric.nn import GINConv, global_add_pool

    def holding(module, w, b):
        with torch.no_grad():
            module.weight.copy_(torch.tensor(w.T)), module.bias.copy_(torch.tensor(b))
        return module

    def linear(w, b):
        return holding(torch.nn.Linear(*w.shape).double(), w, b)

    convs, after, layers = [], [], []
    for _ in model.convs:
        lin1, norm1, lin2, norm2 = [(weights.pop(0), weights.pop(0)) for _ in range(4)]
        mlp = torch.nn.Sequential(torch.nn.Linear(*lin1[0].shape), torch.nn.BatchNorm1d(
            lin1[0].shape[1]), torch.nn.ReLU(), torch.nn.Linear(*lin2[0].shape)).double()
        convs.append(GINConv(mlp, eps=0.0))      # resets the MLP: weights are set after
        for module, (w, b) in zip((mlp[0], mlp[1], mlp[3]), (lin1, norm1, lin2)):
            holding(module, w, b)
        after.append(holding(torch.nn.BatchNorm1d(norm2[0].shape[0]).double(), *norm2))
        layers += [convs[-1], after[-1]]          # parameters in ngnn's order
    heads = [linear(weights.pop(0), weights.pop(0)) for _ in model.heads]
    modules = torch.nn.ModuleList(layers + heads)

    def forward(x, edge_index, batch):
        states = [x]
        for conv, bn in zip(convs, after):
            states.append(torch.relu(bn(conv(states[-1], edge_index))))
        return sum(head(global_add_pool(h, batch)) for head, h in zip(heads, states))
    return forward, modules


def test_gin_with_batch_norm_trains_as_pyg_does():
    """Two epochs of GIN-0 with batch norm (no dropout, batches in the same order, each
    in a padded slot) with Adam: the same weights, running statistics and evaluation logits
    as PyTorch Geometric's with torch's Adam."""
    import torch
    from torch_geometric.data import Batch, Data
    data = graphs(10)
    model = nn.GINGraph(data.num_features, 6, data.num_classes, num_layers=3, dropout=0.0,
                        seed=1, dtype=np.float64, batch_norm=True)
    trainer = GraphTrainer(model, data, batch_size=4, lr=0.01)
    trainer.loader.shuffle = False
    forward, modules = torch_gin_bn(model, [p.initial_value for p in model.parameters()])
    adam = torch.optim.Adam(modules.parameters(), lr=0.01)

    def pyg_batch(ids):
        gb, x = data.batch(ids)
        return Batch.from_data_list([
            Data(x=torch.tensor(x[gb.node_offsets[k]:gb.node_offsets[k + 1]],
                                dtype=torch.float64),
                 edge_index=torch.tensor(np.stack([g.src, g.dst])), num_nodes=g.num_nodes)
            for k, g in enumerate(gb.unbatch())])

    for epoch in range(2):
        modules.train()
        for ids in trainer.loader.split(np.arange(10)):
            batch = pyg_batch(ids)
            adam.zero_grad()
            torch.nn.functional.cross_entropy(forward(batch.x, batch.edge_index, batch.batch),
                                              torch.tensor(data.labels[ids])).backward()
            adam.step()
        trainer.train_epoch(np.arange(10), epoch)
    # Within float32 rounding: ngnn's Adam keeps its step counter and the betas' powers in
    # float32 (ngnn/optim.py).
    for p, q in zip(model.parameters(), modules.parameters()):
        value = q.detach().numpy()
        np.testing.assert_allclose(trainer.transformer.variable_value(p),
                                   value.T if value.ndim == 2 else value, rtol=1e-5, atol=1e-6)
    statistics = [b for m in modules.modules() if isinstance(m, torch.nn.BatchNorm1d)
                  for b in (m.running_mean, m.running_var)]
    assert len(model.buffers()) == len(statistics) == 4 * len(model.convs)
    for b, expected in zip(model.buffers(), statistics):
        np.testing.assert_allclose(trainer.transformer.variable_value(b), expected.numpy(),
                                   rtol=1e-5, atol=1e-6)
    modules.eval()
    batch = pyg_batch(np.arange(10))
    with torch.no_grad():
        expected = forward(batch.x, batch.edge_index, batch.batch).numpy()
    np.testing.assert_allclose(trainer.predict(np.arange(10)), expected, rtol=1e-5, atol=1e-5)


# ---- the batch-norm ops (ngnn/op_graph/normalization.py) ---------------------------------

def batch_norm_ops(h, w, b, live=None):
    from ngnn.op_graph import BatchNormApply, BatchNormStats
    stats = BatchNormStats(h, live)
    return BatchNormApply(h, stats, w, b, live, eps=1e-3), stats


@pytest.mark.parametrize("live", [None, 5.0, 0.0])
def test_batch_norm_ops_gradient_by_finite_differences(transformer_factory, live):
    """Every op's gradient (the statistics', the normalization's, their closed forms),
    over all rows and over the first 5 of 8 (or none), by central differences; the mean
    and variance enter the result too, so their gradients are checked as well."""
    rng = np.random.default_rng(3)
    x, weight, bias = rng.normal(size=(8, 3)), rng.uniform(0.5, 1.5, 3), rng.normal(size=3)

    def build(h, w, b):
        rows = None if live is None else ng.constant(np.array([live]), dtype=np.float64)
        y, stats = batch_norm_ops(h, w, b, rows)
        return ng.sum(ng.tanh(y), axis=0) + ng.tanh(stats[0]) * stats[1]

    check_gradient(build, [x, weight, bias], transformer_factory, coords=24)


def test_batch_norm_ops_take_the_live_rows_at_run_time(transformer_factory):
    """`live` fed at run time: statistics of the leading rows alone, the other rows 0 in
    the result and in every gradient, whatever they hold; equal to NumPy's."""
    rng = np.random.default_rng(4)
    x, up = rng.normal(2.0, 3.0, (10, 4)), rng.normal(size=(10, 4))
    weight, bias = np.linspace(0.5, 2.0, 4), np.linspace(-1.0, 1.0, 4)
    xs = ng.placeholder(x.shape, dtype=np.float64)
    live = ng.placeholder((1,), dtype=np.float64)
    y, stats = batch_norm_ops(xs, ng.constant(weight, dtype=np.float64),
                              ng.constant(bias, dtype=np.float64), live)
    dx = ng.grad(ng.sum(y * ng.constant(up, dtype=np.float64)), xs)
    comp = transformer_factory().computation([y, stats, dx], xs, live)
    # The live rows are those whose index is below the count: 6.5 counts 7, 12 all 10.
    for n, count in ((7, 7.0), (10, 10.0), (0, 0.0), (7, 6.5), (10, 12.0)):
        spoiled = x.copy()
        spoiled[n:] = 1e6
        out, moments, grad = comp(spoiled, np.array([count]))
        rows = x[:n]
        mean = rows.mean(axis=0) if n else np.zeros(4)
        var = rows.var(axis=0) if n else np.zeros(4)
        xhat = (rows - mean) / np.sqrt(var + 1e-3)
        np.testing.assert_allclose(moments, [mean, var], rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(out[:n], xhat * weight + bias, rtol=1e-12, atol=1e-12)
        dy = up[:n] * weight
        if n:
            expected = (dy - dy.mean(axis=0) - xhat * (dy * xhat).mean(axis=0)) / \
                np.sqrt(var + 1e-3)
            np.testing.assert_allclose(grad[:n], expected, rtol=1e-10, atol=1e-12)
        assert not out[n:].any() and not grad[n:].any()


def test_batch_norm_ops_reject_bad_input():
    from ngnn.op_graph import BatchNormApply, BatchNormStats
    x = ng.placeholder((5, 3), dtype=np.float64)
    with pytest.raises(ng.op_graph.ShapeError, match="live must be a \\(1,\\) tensor"):
        BatchNormStats(x, ng.placeholder((2,), dtype=np.float64))
    with pytest.raises(ng.op_graph.ShapeError, match="stats must have shape \\(2, 3\\)"):
        BatchNormApply(x, ng.placeholder((3,), dtype=np.float64), np.ones(3), np.zeros(3))
    with pytest.raises(ng.op_graph.ShapeError, match="expected x of shape \\(rows, F\\)"):
        BatchNormStats(ng.placeholder((5,), dtype=np.float64))


def test_decompositions_equal_the_kernels():
    """Each op's decomposition (what the GPU transformer runs) gives its NumPy kernel's
    values, gradients included, for a live count fed at run time: run through the NumPy
    transformer with the Decompose pass added, so it is checked wherever the tests run."""
    from ngnn import transformers as ngt
    from ngnn.passes import Decompose
    rng = np.random.default_rng(5)
    x, up = rng.normal(1.0, 2.0, (9, 3)), rng.normal(size=(9, 3))
    weight, bias = rng.uniform(0.5, 1.5, 3), rng.normal(size=3)

    def build():
        xs = ng.placeholder(x.shape, dtype=np.float64)
        w, b = (ng.placeholder((3,), dtype=np.float64) for _ in range(2))
        live = ng.placeholder((1,), dtype=np.float64)
        y, stats = batch_norm_ops(xs, w, b, live)
        loss = ng.sum(y * ng.constant(up, dtype=np.float64)) + ng.sum(stats * stats)
        return [y, stats] + ng.grad(loss, [xs, w, b]), xs, w, b, live

    outputs = []
    for passes in ([], [Decompose()]):
        results, *params = build()
        with ngt.make_transformer("numpy", passes=passes) as t:
            comp = t.computation(results, *params)
            assert ("K.batch_norm" in comp.source) == (not passes)
            outputs.append(comp(x, weight, bias, np.array([6.0])))
    for kernel, decomposed in zip(*outputs):
        np.testing.assert_allclose(kernel, decomposed, rtol=1e-12, atol=1e-12)
