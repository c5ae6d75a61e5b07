"""Readouts under a memory budget (docs/out_of_core.md, "Readouts"): ng.readout and the
graph-classification models run chunked, row block by row block, and equal the unchunked
run in float64 (forward, gradients, two training steps), on every backend; what still
cannot run chunked is named. A GraphLoader's slot runs chunked too, its grid cut again
for every batch."""
import numpy as np
import pytest

import ngnn as ng
from ngnn import datasets, nn, optim
from ngnn import transformers as ngt
from ngnn.op_graph import seed_dropout
from ngnn.out_of_core import ChunkingError, plan_bytes
from ngnn.graph_train import GraphTrainer

TOLERANCE = dict(rtol=1e-12, atol=1e-12)
BATCH = 20      # graphs of a loader's batch


def batch_of_graphs(seed=0):
    """Five graphs (one of a single vertex), 20 vertices; rows chunked by 2 or 3 split
    graphs across row blocks."""
    rng = np.random.default_rng(seed)
    graphs = [ng.Graph.from_edges(rng.integers(0, n, 2 * n), rng.integers(0, n, 2 * n),
                                  num_nodes=n) for n in (5, 3, 7, 1, 4)]
    return ng.Graph.batch(graphs)


def readout_and_gradients(gb, reduce):
    """A readout of a transformed node tensor, and the gradients of a loss through it."""
    rng = np.random.default_rng(1)
    h = ng.placeholder((gb.num_nodes, 3), dtype=np.float64, name="h")
    w = ng.variable((3, 2), initial_value=rng.standard_normal((3, 2)), dtype=np.float64)
    # ReLU, shifted below 0, before a max readout: ties (at -0.5) within graphs and across
    # row blocks, and graphs whose maximum is negative, so a part without rows of a graph
    # (whose partial is 0) must not take part.
    z = ng.relu(ng.dot(h, w)) - 0.5 if reduce == "max" else ng.tanh(ng.dot(h, w))
    pooled = ng.readout(z, gb, reduce)
    loss = ng.sum(pooled * pooled * np.arange(1.0, 3.0))
    return h, [pooled] + ng.grad(loss, [h, w])


@pytest.mark.parametrize("reduce", ["sum", "mean", "max"])
def test_readout_and_its_gradient_chunked_equal_unchunked(transformer_factory, reduce):
    gb = batch_of_graphs()
    x = np.random.default_rng(2).standard_normal((gb.num_nodes, 3))
    # Every vertex of graph 2 the same: ties at the maximum whatever it is, across row blocks.
    first, last = gb.node_offsets[2:4]
    x[first:last] = x[first]
    h, results = readout_and_gradients(gb, reduce)
    want = ngt.make_transformer("numpy").computation(results, h)(x)
    for chunks in (2, 3):
        h, results = readout_and_gradients(gb, reduce)
        comp = transformer_factory(chunks=chunks).computation(results, h)
        got = comp(x)
        assert comp.chunked and comp.stats["chunks"] == chunks
        for a, b in zip(got, want):
            np.testing.assert_allclose(a, b, **TOLERANCE)


def graph_step(model, g, gb, x, labels, lr=0.01):
    """Loss and the optimizer's assignments of one graph-classification training step
    (dropout on, seeded), the placeholders, and the evaluation logits. Adam, except with
    batch norm: the biases before a batch norm have a gradient of 0 up to rounding, which
    Adam's division by its square root turns into a step of lr (any order of summation
    gives another); SGD with momentum keeps it at rounding size."""
    h = ng.placeholder(x.shape, dtype=np.float64, name="x")
    y = ng.placeholder(labels.shape, dtype=np.int64, name="y")
    loss = ng.cross_entropy(model(g, h, gb, training=True), y)
    optimizer = optim.SGD(model.parameters(), lr=lr, momentum=0.9) if model.buffers() else \
        optim.Adam(model.parameters(), lr=lr)
    updates = optimizer.updates(loss) + model.state_updates()
    seed_dropout([loss] + updates, 7)
    return [loss] + updates, (h, y), model(g, h, gb, training=False)


def models(data):
    f, c = data.num_features, data.num_classes
    return {"gin": lambda: nn.GINGraph(f, 8, c, num_layers=3, seed=1, dtype=np.float64,
                                       batch_norm=False),
            "gin_bn": lambda: nn.GINGraph(f, 8, c, num_layers=3, seed=1, dtype=np.float64),
            "gcn_mean": lambda: nn.GCNGraph(f, 8, c, num_layers=2, seed=1, dtype=np.float64)}


def two_steps(make_model, data, transformer, graph_of):
    """Every parameter and buffer after two training steps on one batch of 40 MUTAG
    graphs, the losses, the evaluation logits, and the training step's computation."""
    gb, x = data.batch(np.arange(40))
    model = make_model()
    step, (h, y), logits = graph_step(model, graph_of(model, gb), gb, x, data.labels[:40])
    train = transformer.computation(step, h, y)
    losses = [float(train(x, data.labels[:40])[0]) for _ in range(2)]
    state = [transformer.variable_value(v) for v in model.parameters() + model.buffers()]
    return losses, state, transformer.computation(logits, h)(x), train


@pytest.mark.parametrize("name", ["gin", "gin_bn", "gcn_mean"])
def test_graph_classification_steps_under_a_memory_budget(transformer_factory, name):
    """GIN-0 (sum readouts of every layer, with and without batch norm) and the
    mean-readout GCN baseline: two training steps with dropout under a quarter of the plan's
    bytes give the unchunked weights, running statistics, losses and logits."""
    data = datasets.load("mutag")
    make = models(data)[name]

    def graph_of(model, gb):      # GCNGraph wants the batch with a self loop per vertex
        return gb.with_self_loops() if model.self_loops else gb

    want = two_steps(make, data, ngt.make_transformer("numpy"), graph_of)
    plain = transformer_factory()
    need = plan_bytes(two_steps(make, data, plain, graph_of)[3])
    got = two_steps(make, data, transformer_factory(memory_budget=need // 4), graph_of)
    train = got[3]
    assert train.chunked and train.stats["chunks"] >= 2
    assert 0 < train.stats["device_peak_bytes"] <= need // 4
    np.testing.assert_allclose(got[0], want[0], **TOLERANCE)
    for a, b in zip(got[1] + [got[2]], want[1] + [want[2]]):
        np.testing.assert_allclose(a, b, **TOLERANCE)


def test_what_a_chunked_readout_refuses_is_named():
    gb = batch_of_graphs()
    h = ng.placeholder((gb.num_nodes, 3), dtype=np.float64, name="h")
    x = np.ones((gb.num_nodes, 3))

    def run(result, placeholder=h, value=x):
        ngt.make_transformer("numpy", chunks=2).computation(result, placeholder)(value)

    # The readout's per-graph rows past the graphs (before its row cut) mean nothing.
    uncut = ng.readout(h, gb, "sum").args[0]
    with pytest.raises(ChunkingError, match="holds per-graph rows .* first 5 rows"):
        run(uncut)
    with pytest.raises(ChunkingError, match=r"sum.*reads the rows of per-graph values .* past"):
        run(ng.sum(ng.readout(h, gb, "sum").args[0], axis=0))
    with pytest.raises(ChunkingError, match="reads .*'h'.* as per-graph rows, but it has a row "
                                            "per vertex"):
        run(ng.readout(h, gb, "sum").args[0] + h)
    # A batch with more graphs than vertices (empty graphs).
    empty = ng.Graph.batch([ng.Graph.from_edges([0], [0], num_nodes=1),
                            ng.Graph.from_edges([], [], num_nodes=0),
                            ng.Graph.from_edges([], [], num_nodes=0)])
    e = ng.placeholder((1, 3), dtype=np.float64, name="e")
    with pytest.raises(ChunkingError, match="3 graphs over 1 vertices"):
        run(ng.readout(e, empty, "sum"), e, np.ones((1, 3)))
    # A readout of another batch than the graph the layers run over.
    other = ng.Graph.batch([ng.Graph.from_edges([0], [1], num_nodes=2)] * 3)
    conv = nn.GINConv(3, 3, dtype=np.float64)
    with pytest.raises(ChunkingError, match="readout over 6 vertices .* graph has 20"):
        run(ng.readout(conv(gb, h)[:6], other, "sum"))


def loader_epochs(make_model, data, transformer):
    """Two epochs of GraphTrainer (60 MUTAG graphs, batches of 20 in a GraphLoader's slot,
    dropout on; SGD with momentum with batch norm, see graph_step) after a first batch
    and evaluation: the losses, every parameter and buffer, the test logits, the programs
    generated after the first batch, and the training step's computation."""
    model = make_model()
    optimizer = optim.SGD(model.parameters(), lr=0.01, momentum=0.9) if model.buffers() \
        else None
    trainer = GraphTrainer(model, data, batch_size=BATCH, seed=5, transformer=transformer,
                           optimizer=optimizer)
    train, test = np.arange(60), np.arange(60, 80)
    next(trainer.loader.batches(0, train))
    trainer.step()
    trainer.predict(test)
    compiled = transformer.compilations
    trainer.reset()
    losses = [trainer.train_epoch(train, epoch) for epoch in range(2)]
    state = [transformer.variable_value(v) for v in model.parameters() + model.buffers()]
    return (losses, state, trainer.predict(test), transformer.compilations - compiled,
            trainer.train_step)


@pytest.mark.parametrize("name", ["gin", "gin_bn", "gcn_mean"])
def test_graph_loader_training_under_a_memory_budget(transformer_factory, name):
    """A GraphLoader's slot changes its edges every batch: the chunked program cuts its
    grid again for each load, into pieces within the bounds its compiled stages hold, so
    two epochs of minibatches under a quarter of the plan's bytes give the unchunked
    losses, weights, running statistics and test logits, and nothing is generated after
    the first batch. (Against the same backend's unchunked run: with Adam, two epochs on
    gpu (PoCL) differ from numpy's by 1.6e-8 relative, chunked or not; with SGD they
    agree exactly.)"""
    data = datasets.load("mutag")
    make = models(data)[name]
    want = loader_epochs(make, data, transformer_factory())      # unchunked, same backend
    need = plan_bytes(want[4])
    got = loader_epochs(make, data, transformer_factory(memory_budget=need // 4))
    train = got[4]
    assert train.chunked and train.stats["chunks"] >= 2
    assert 0 < train.stats["device_peak_bytes"] <= need // 4
    assert got[3] == 0
    np.testing.assert_allclose(got[0], want[0], **TOLERANCE)
    for a, b in zip(got[1] + [got[2]], want[1] + [want[2]]):
        np.testing.assert_allclose(a, b, **TOLERANCE)


def test_a_sampled_minibatch_is_refused_under_a_memory_budget():
    """A neighbour sampler's block slot (rows not all destinations) is not chunked."""
    from ngnn.sampling import GraphSlot
    slot = GraphSlot(6, 8, num_dst=3)
    h = ng.placeholder((6, 3), dtype=np.float64, name="h")
    out = ng.aggregate(ng.gather(h, slot, by="src"), slot, at="dst")
    with pytest.raises(ChunkingError, match="a sampled minibatch's block"):
        ngt.make_transformer("numpy", chunks=2).computation(out, h).transform()


def test_float32_steps_chunked_with_wide_accumulation_equal_bit_for_bit():
    """In float32 with wide accumulation (as `ngnn train` runs) the readouts' partial sums
    are float64 and rounded once, so three Adam steps of GIN-0 over 3 chunks give the
    unchunked weights to the last bit (dropout on)."""
    data = datasets.load("mutag")
    gb, x = data.batch(np.arange(60))
    x = x.astype(np.float32)

    def three_steps(**options):
        model = nn.GINGraph(data.num_features, 16, data.num_classes, num_layers=3, seed=1,
                            batch_norm=False)
        h = ng.placeholder(x.shape, dtype=np.float32, name="x")
        y = ng.placeholder((60,), dtype=np.int64, name="y")
        loss = ng.cross_entropy(model(gb, h, gb, training=True), y)
        updates = optim.Adam(model.parameters()).updates(loss)
        seed_dropout([loss] + updates, 3)
        t = ngt.make_transformer("numpy", wide_accumulation=True, **options)
        step = t.computation([loss] + updates, h, y)
        losses = [step(x, data.labels[:60])[0] for _ in range(3)]
        return losses, [t.variable_value(v) for v in model.parameters()], step

    want, got = three_steps(), three_steps(chunks=3)
    assert got[2].chunked and got[2].stats["chunks"] == 3
    # The loss value itself is a mean over the graphs, which chunking takes as a sum over
    # the count: its last bit may differ; the gradients, hence the weights, may not.
    np.testing.assert_allclose(got[0], want[0], rtol=1e-6)
    for a, b in zip(got[1], want[1]):
        np.testing.assert_array_equal(a, b)
