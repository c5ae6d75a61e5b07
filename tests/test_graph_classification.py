"""Graph classification end to end: the graph loader and its slot, one compiled step for
every batch, GIN-0 against PyTorch Geometric on identical weights, a batched step against
per-graph steps, training, and the command line."""
import re

import numpy as np
import pytest

import ngnn as ng
from ngnn import datasets, nn, optim
from ngnn.graph_train import GraphTrainer, summarize
from ngnn.sampling.graph_loader import GraphLoader


def synthetic(num_graphs=24, seed=0):
    return datasets.synthetic_graphs(num_graphs, min_nodes=2, max_nodes=9, num_features=3,
                                     seed=seed)


def test_loader_shuffles_deterministically_and_covers_every_graph():
    data = synthetic()
    loader = GraphLoader(data, indices=np.arange(20), batch_size=6, seed=3, slack=None)
    first = [ids.copy() for ids in loader.batches(epoch=0)]
    again = [ids.copy() for ids in
             GraphLoader(data, np.arange(20), 6, seed=3, slack=None).batches(0)]
    other = np.concatenate([ids.copy() for ids in loader.batches(epoch=1)])
    assert [len(b) for b in first] == [6, 6, 6, 2] and len(loader) == 4
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(np.sort(np.concatenate(first)), np.arange(20))
    assert not np.array_equal(np.concatenate(first), other)
    np.testing.assert_array_equal(np.sort(other), np.arange(20))


def test_a_batch_that_would_overflow_the_slot_is_cut_and_continued():
    data = synthetic(40)
    loader = GraphLoader(data, batch_size=8, seed=0, slack=1.0)
    order = loader.order(0)
    batches = loader.split(order)
    np.testing.assert_array_equal(np.concatenate(batches), order)
    assert max(len(b) for b in batches) <= 8 and len(batches) > 5      # some were cut
    for ids in loader.batches(0):
        assert data.graph_sizes[ids].sum() <= loader.max_nodes
        assert data.edge_counts[ids].sum() <= loader.max_edges
        np.testing.assert_array_equal(loader.labels[:len(ids)], data.labels[ids])
        assert loader.mask.sum() == len(ids)


def test_loader_rejects_bad_input():
    data = synthetic()
    with pytest.raises(ValueError, match="batch_size must be a positive int"):
        GraphLoader(data, batch_size=0)
    with pytest.raises(ValueError, match="index 99 is out of range"):
        GraphLoader(data, indices=[0, 99])


def gin(data, dtype=np.float64, **options):
    options = {"hidden": 5, "num_layers": 3, "dropout": 0.0, "batch_norm": False, **options}
    return nn.GINGraph(data.num_features, num_classes=data.num_classes, seed=1, dtype=dtype,
                       **options)


def parameter_gradients(model, make, graph, batch, x, labels, mask=None, total=False):
    """d(loss)/d(parameter) for every parameter; the loss is the mean cross-entropy over
    the (masked) graphs, or their sum with `total`."""
    xs = ng.placeholder(x.shape, dtype=np.float64)
    logits = model(graph, xs, batch)
    loss = ng.cross_entropy(logits, ng.constant(labels, dtype=np.int64),
                            None if mask is None else ng.constant(mask, dtype=np.bool_))
    if total:
        loss = loss * float(len(labels))
    return make().computation(ng.grad(loss, model.parameters()), xs)(x)


def test_a_batched_step_equals_the_sum_of_per_graph_steps(transformer_factory):
    data = synthetic(3)
    model = gin(data)
    ids = np.arange(3)
    gb, x = data.batch(ids)
    batched = parameter_gradients(model, transformer_factory, gb, gb, x.astype(np.float64),
                                  data.labels[ids], total=True)
    per_graph = [np.zeros_like(g) for g in batched]
    for k in ids:
        g1, x1 = data.batch([k])
        for acc, g in zip(per_graph, parameter_gradients(
                model, transformer_factory, g1, g1, x1.astype(np.float64),
                data.labels[[k]])):
            acc += g
    for a, b in zip(batched, per_graph):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-9)

    # The same through a loader's padded slot, whose padding graph the mask leaves out.
    loader = GraphLoader(data, batch_size=3, shuffle=False)
    loader.load(ids)
    slotted = parameter_gradients(model, transformer_factory, loader.slot.graph, loader.slot,
                                  loader.features.astype(np.float64), loader.labels,
                                  loader.mask)
    for a, b in zip(slotted, batched):
        np.testing.assert_allclose(a * len(ids), b, rtol=1e-9, atol=1e-9)


def test_no_code_generation_after_the_first_batch(transformer_factory):
    data = synthetic(20)
    t = transformer_factory()
    trainer = GraphTrainer(gin(data, dtype=np.float32, hidden=4, num_layers=2), data,
                           batch_size=6, transformer=t)
    train, test = np.arange(14), np.arange(14, 20)
    next(trainer.loader.batches(0, train))
    trainer.train_step(trainer.loader.features, trainer.loader.labels, trainer.loader.mask,
                       trainer.loader.live)
    trainer.predict(test)
    compiled = t.compilations
    for epoch in range(2):
        trainer.train_epoch(train, epoch)
        trainer.accuracy(test)
    assert t.compilations == compiled


def torch_gin(model, weights):
    """PyTorch Geometric's GIN-0 of the same architecture (GINConv with a Linear-ReLU-Linear
    MLP, ReLU, global_add_pool of every layer, a Linear per layer) holding `weights`."""
    import torch
    from torch_geometric.nn import GINConv, global_add_pool

    convs = []
    for i in range(len(model.layers) - len(model.heads)):
        w1, b1, w2, b2 = (torch.tensor(weights.pop(0)) for _ in range(4))
        mlp = torch.nn.Sequential(torch.nn.Linear(*w1.shape), torch.nn.ReLU(),
                                  torch.nn.Linear(*w2.shape)).double()
        convs.append(GINConv(mlp, eps=0.0))      # resets the MLP: weights are set after
        with torch.no_grad():
            mlp[0].weight.copy_(w1.T), mlp[0].bias.copy_(b1)
            mlp[2].weight.copy_(w2.T), mlp[2].bias.copy_(b2)
    heads = []
    for _ in model.heads:
        w, b = (torch.tensor(weights.pop(0)) for _ in range(2))
        lin = torch.nn.Linear(*w.shape).double()
        with torch.no_grad():
            lin.weight.copy_(w.T), lin.bias.copy_(b)
        heads.append(lin)

    def forward(x, edge_index, batch):
        states = [x]
        for conv in convs:
            states.append(torch.relu(conv(states[-1], edge_index)))
        return sum(head(global_add_pool(h, batch)) for head, h in zip(heads, states))
    return forward, [p for m in convs + heads for p in m.parameters()]


def test_gin0_equals_pyg_on_identical_weights(transformer_factory):
    import torch
    data = synthetic(7)
    model = gin(data)
    gb, x = data.batch(np.arange(7))
    x = x.astype(np.float64)
    labels = data.labels[:7]
    xs = ng.placeholder(x.shape, dtype=np.float64)
    logits = model(gb, xs, gb)
    loss = ng.cross_entropy(logits, ng.constant(labels, dtype=np.int64))
    t = transformer_factory()
    out, *grads = t.computation([logits] + ng.grad(loss, model.parameters()), xs)(x)

    forward, params = torch_gin(model, [p.initial_value for p in model.parameters()])
    expected = forward(torch.tensor(x), torch.tensor(np.stack([gb.src, gb.dst])),
                       torch.tensor(gb.graph_ids))
    torch.nn.functional.cross_entropy(expected, torch.tensor(labels)).backward()
    np.testing.assert_allclose(out, expected.detach().numpy(), rtol=1e-9, atol=1e-9)
    # torch's Linear keeps W transposed; PyG's parameters come in ngnn's order.
    for g, p in zip(grads, params):
        np.testing.assert_allclose(g, p.grad.numpy().T if g.ndim == 2 else p.grad.numpy(),
                                   rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("model", ["gin", "gin-without-batch-norm", "gcn"])
def test_graph_models_learn_synthetic_graphs(model):
    data = synthetic(80, seed=1)
    net = nn.GCNGraph(data.num_features, 16, data.num_classes) if model == "gcn" else \
        nn.GINGraph(data.num_features, 16, data.num_classes, num_layers=3,
                    batch_norm=model == "gin")
    trainer = GraphTrainer(net, data, batch_size=16, lr=0.01)
    curve = trainer.fit(np.arange(60), np.arange(60, 80), epochs=30)
    assert curve.max() >= 0.8, curve


def test_summarize_takes_the_epoch_with_the_best_mean():
    curves = np.array([[0.5, 0.9, 0.7], [0.7, 0.7, 0.9]])
    best, mean, std = summarize(curves)
    assert best == 1 and mean == pytest.approx(80.0) and std == pytest.approx(10.0)


def test_cli_cross_validates_and_prints_the_papers_line(capsys):
    from ngnn.cli import main
    assert main(["train", "--task", "graph", "--model", "gin", "--dataset", "mutag",
                 "--folds", "3", "--epochs", "2", "--hidden", "8", "--no-progress"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert re.fullmatch(r"test accuracy: \d+\.\d ± \d+\.\d \(3 folds\)", lines[-1]), lines[-1]
    assert "stratified folds drawn with seed 0" in "\n".join(lines)
    # The GIN paper's recipe: Adam at 0.01, halved every 50 epochs.
    assert "lr 0.01 times 0.5 every 50 epochs" in "\n".join(lines)


def test_cli_trains_graph_minibatches_under_a_memory_budget(capsys):
    """`--memory-budget` chunks the loader's training step (its grid cut again per batch,
    tests/test_readout_out_of_core.py checks the values) and cross-validates as without.
    (In float32 the accuracies may differ by a graph: batch norm's statistics are
    combined from float32 partials, and Adam turns the pre-norm biases' rounding-size
    gradients into steps.)"""
    from ngnn.cli import main
    assert main(["train", "--task", "graph", "--model", "gin", "--dataset", "mutag", "--folds",
                 "2", "--epochs", "2", "--hidden", "16", "--no-progress", "--memory-budget",
                 "1M"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert re.match(r"memory budget: training step in \d+ x \d+ chunks .* device peak "
                    r"0\.\d MiB of 1\.0 MiB", lines[2]), lines
    assert re.fullmatch(r"test accuracy: \d+\.\d ± \d+\.\d \(2 folds\)", lines[-1]), lines


def test_cli_takes_the_decay_and_rejects_bad_values(capsys):
    from ngnn.cli import main
    assert main(["train", "--task", "graph", "--dataset", "mutag", "--folds", "2", "--epochs",
                 "1", "--hidden", "4", "--lr-step", "7", "--lr-gamma", "0.1",
                 "--no-progress"]) == 0
    assert "lr 0.01 times 0.1 every 7 epochs" in capsys.readouterr().out
    for option, value, message in [("--lr-step", "0", "must be at least 1"),
                                   ("--lr-gamma", "0", r"must be in \(0, inf\)"),
                                   ("--lr-gamma", "-1", r"must be in \(0, inf\)")]:
        with pytest.raises(SystemExit):
            main(["train", "--task", "graph", "--dataset", "mutag", option, value])
        assert re.search(f"argument {option}: {message}", capsys.readouterr().err)
    assert main(["train", "--dataset", "cora", "--lr-step", "5", "--epochs", "1",
                 "--no-progress"]) == 1
    assert "--lr-step applies to --task graph only" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--task", "graph", "--dataset", "cora"], "cora is a node-classification dataset"),
    (["--dataset", "mutag"], "mutag is a graph-classification dataset"),
    (["--task", "graph", "--dataset", "mutag", "--model", "gat"], "trains gin or gcn"),
])
def test_cli_rejects_a_task_that_does_not_fit(capsys, argv, message):
    from ngnn.cli import main
    assert main(["train", "--epochs", "1", "--no-progress"] + argv) == 1
    assert message in capsys.readouterr().err


def torch_step(data, ids, forward, adam):
    """One Adam step of the PyG model `forward` on the graphs `ids` of `data`."""
    import torch
    from torch_geometric.data import Batch, Data
    gb, x = data.batch(ids)
    batch = Batch.from_data_list([
        Data(x=torch.tensor(x[gb.node_offsets[k]:gb.node_offsets[k + 1]], dtype=torch.float64),
             edge_index=torch.tensor(np.stack([g.src, g.dst])), num_nodes=g.num_nodes)
        for k, g in enumerate(gb.unbatch())])
    adam.zero_grad()
    loss = torch.nn.functional.cross_entropy(
        forward(batch.x, batch.edge_index, batch.batch), torch.tensor(data.labels[ids]))
    loss.backward()
    adam.step()


def assert_same_weights(trainer, model, params):
    """ngnn's weights equal torch's `params`, within float32 rounding: ngnn's Adam keeps
    its step counter and the betas' powers in float32 (ngnn/optim.py), so its bias
    correction differs in the 7th digit."""
    for p, q in zip(model.parameters(), params):
        value = q.detach().numpy()
        np.testing.assert_allclose(trainer.transformer.variable_value(p),
                                   value.T if value.ndim == 2 else value, rtol=1e-5, atol=1e-6)


def test_training_equals_pyg_on_identical_weights():
    """Two epochs of GIN-0 (no dropout, batches in the same order) with Adam: the same
    weights as PyTorch Geometric's GINConv + global_add_pool with torch's Adam."""
    import torch
    data = synthetic(10)
    model = gin(data, hidden=6)
    trainer = GraphTrainer(model, data, batch_size=4, lr=0.01)
    trainer.loader.shuffle = False
    forward, params = torch_gin(model, [p.initial_value for p in model.parameters()])
    adam = torch.optim.Adam(params, lr=0.01)
    for epoch in range(2):
        for ids in trainer.loader.split(np.arange(10)):
            torch_step(data, ids, forward, adam)
        trainer.train_epoch(np.arange(10), epoch)
    assert_same_weights(trainer, model, params)


def test_step_decay_equals_torch_step_lr_without_recompiling():
    """Three epochs of GIN-0 with Adam halved after every epoch (StepLR step 1, gamma 0.5):
    the same weights as PyG's GIN with torch's Adam and StepLR, and the rate changes
    reach the step compiled in the first epoch without compiling again."""
    import torch
    data = synthetic(10)
    model = gin(data, hidden=6)
    trainer = GraphTrainer(model, data, batch_size=4, lr=0.01,
                           schedule=optim.StepLR(step_size=1, gamma=0.5))
    trainer.loader.shuffle = False
    forward, params = torch_gin(model, [p.initial_value for p in model.parameters()])
    adam = torch.optim.Adam(params, lr=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(adam, step_size=1, gamma=0.5)
    compiled = []
    for epoch in range(3):
        for ids in trainer.loader.split(np.arange(10)):
            torch_step(data, ids, forward, adam)
        scheduler.step()
        trainer.train_epoch(np.arange(10), epoch)
        compiled.append(trainer.transformer.compilations)
        assert trainer.transformer.variable_value(trainer.optimizer.rate) == 0.01 * 0.5 ** epoch
    assert compiled == compiled[:1] * 3
    assert_same_weights(trainer, model, params)
    # Without the decay the weights are measurably elsewhere: the test can tell them apart.
    constant = GraphTrainer(gin(data, hidden=6), data, batch_size=4, lr=0.01)
    constant.loader.shuffle = False
    for epoch in range(3):
        constant.train_epoch(np.arange(10), epoch)
    first = model.parameters()[0]
    assert not np.allclose(constant.transformer.variable_value(constant.model.parameters()[0]),
                           trainer.transformer.variable_value(first), rtol=1e-5, atol=1e-6)
