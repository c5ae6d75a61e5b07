"""Chunked, streamed execution (memory_budget, chunks): equal to the unchunked run on every
backend, within the budget the device's allocator measures, and clear about what it refuses.
"""
from dataclasses import replace

import numpy as np
import pytest
import scipy.sparse

import ngnn as ng
from ngnn import datasets, nn, optim
from ngnn import transformers as ngt
from ngnn.op_graph import seed_dropout
from ngnn.out_of_core import ChunkingError, plan_bytes
from ngnn.train import Trainer

MODELS = {"gcn": lambda: nn.GCN(24, 16, 4), "gat": lambda: nn.GAT(24, 8, 2, 4),
          "sage": lambda: nn.GraphSAGE(24, 16, 4), "gin": lambda: nn.GIN(24, 16, 4)}


@pytest.fixture(scope="module")
def data():
    return datasets.synthetic("rmat", 1200, 6, 24, 4, seed=3)


def one_step(model_name, data, transformer, **trainer_options):
    """The loss and every weight after one training step, and the trainer."""
    model = MODELS[model_name]()
    trainer = Trainer(model, data, optim.Adam(model.parameters(), lr=0.01),
                      transformer=transformer, **{"sparse": False, **trainer_options})
    loss = trainer.step()
    weights = {name: transformer.variable_value(v) for name, v in model.named_parameters()}
    return loss, weights, trainer


def assert_same_step(got, want):
    (loss, weights, _), (ref_loss, ref_weights, _) = got, want
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
    for name, w in ref_weights.items():
        np.testing.assert_allclose(weights[name], w, rtol=1e-5,
                                   atol=1e-6 * np.abs(w).max(), err_msg=name)


def assert_same_logits(trainer, reference):
    want = reference.predict()
    np.testing.assert_allclose(trainer.predict(), want, rtol=1e-5,
                               atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("model_name", ["gcn", "gat"])
def test_training_step_within_a_quarter_of_the_plan(transformer_factory, data, model_name):
    reference = one_step(model_name, data, ngt.make_transformer("numpy"))
    model = MODELS[model_name]()
    plain = Trainer(model, data, optim.Adam(model.parameters(), lr=0.01),
                    transformer=transformer_factory(), sparse=False)
    need = plan_bytes(plain.train_step)          # this backend's unchunked plan
    budget = need // 4
    chunked = transformer_factory(memory_budget=budget)
    got = one_step(model_name, data, chunked)
    step = got[2].train_step
    assert step.chunked and step.stats["chunks"] >= 2
    assert 0 < step.stats["device_peak_bytes"] <= budget
    assert step.stats["bytes_to_device"] > 0 and step.stats["bytes_from_device"] > 0
    assert_same_step(got, reference)
    assert_same_logits(got[2], reference[2])


@pytest.mark.parametrize("model_name", ["sage", "gin"])
def test_more_models_and_evaluation(data, model_name):
    reference = one_step(model_name, data, ngt.make_transformer("numpy"))
    got = one_step(model_name, data, ngt.make_transformer("numpy", chunks=3))
    assert got[2].train_step.stats["chunks"] == 3
    assert_same_step(got, reference)
    assert_same_logits(got[2], reference[2])


def aggregations(g, x, w):
    """Every reduction at both ends, an edge softmax and a gradient through them."""
    h = ng.dot(x, w)
    e = ng.gather(h, g, by="src") * ng.gather(h, g, by="dst")
    outs = [ng.aggregate(e, g, at=at, reduce=r) for at in ("dst", "src")
            for r in ("sum", "mean", "max", "min")]
    attention = ng.edge_softmax(g, ng.sum(e, axis=1, keepdims=True))
    outs.append(ng.aggregate(attention * ng.gather(h, g, by="src"), g, at="dst"))
    loss = ng.sum(ng.concat([ng.sum(o * o, axis=1, keepdims=True) for o in outs], axis=1))
    return outs + [loss, ng.grad(loss, w)]


def test_aggregations_and_gradients(transformer_factory):
    rng = np.random.default_rng(0)
    # Vertex 0 has no in-edges and vertex 1 no out-edges: 0 for them, as unchunked.
    src = rng.integers(1, 300, 2000)
    dst = rng.integers(2, 300, 2000)
    g = ng.Graph(np.concatenate([src, [0]]), np.concatenate([dst, [1]]), 300)
    x = ng.placeholder((300, 5), name="x")
    w = ng.variable((5, 3), initial_value=rng.normal(size=(5, 3)).astype(np.float32))
    value = rng.normal(size=(300, 5)).astype(np.float32)
    want = ngt.make_transformer("numpy").computation(aggregations(g, x, w), x)(value)
    t = transformer_factory(chunks=3)
    comp = t.computation(aggregations(g, x, w), x)
    got = comp(value)
    assert comp.chunked and comp.stats["pieces"] >= 3
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def degree_sorted(g):
    order = np.argsort(-(g.in_degrees + g.out_degrees), kind="stable")
    rank = np.empty_like(order)
    rank[order] = np.arange(order.shape[0])
    return ng.Graph(rank[g.src], rank[g.dst], g.num_nodes), order


def test_selective_scheduling_moves_fewer_bytes_with_the_same_results(data):
    graph, order = degree_sorted(data.graph)
    sorted_data = replace(data, graph=graph, features=data.features[order],
                          labels=data.labels[order], train_mask=data.train_mask[order],
                          val_mask=data.val_mask[order], test_mask=data.test_mask[order])
    runs = {}
    for selective in (True, False):
        t = ngt.make_transformer("numpy", chunks=4, selective_scheduling=selective)
        runs[selective] = one_step("gcn", sorted_data, t)
    assert_same_step(runs[True], runs[False])
    moved = {k: run[2].train_step.stats["bytes_to_device"] for k, run in runs.items()}
    assert moved[True] < moved[False]


def test_memmap_features_equal_in_memory(data, tmp_path):
    path = tmp_path / "features.f32"
    on_disk = np.memmap(path, dtype=np.float32, mode="w+", shape=data.features.shape)
    on_disk[:] = data.features
    on_disk.flush()
    mapped = replace(data, features=np.memmap(path, dtype=np.float32, mode="r",
                                              shape=data.features.shape))
    want = one_step("gcn", data, ngt.make_transformer("numpy"), normalize=False)
    got = one_step("gcn", mapped, ngt.make_transformer("numpy", chunks=3), normalize=False)
    assert isinstance(got[2].features, np.memmap)
    assert_same_step(got, want)


def test_nan_in_a_memmap_block_is_named(data, tmp_path):
    path = tmp_path / "features.f32"
    on_disk = np.memmap(path, dtype=np.float32, mode="w+", shape=data.features.shape)
    on_disk[:] = data.features
    on_disk[1000, 3] = np.nan
    on_disk.flush()
    mapped = replace(data, features=np.memmap(path, dtype=np.float32, mode="r",
                                              shape=data.features.shape))
    with pytest.raises(ValueError, match="'features' contains NaN or Inf values in rows"):
        one_step("gcn", mapped, ngt.make_transformer("numpy", chunks=3), normalize=False)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "1"])
def test_bad_budget_and_chunk_options(bad):
    with pytest.raises(ValueError, match="memory_budget must be a positive int"):
        ngt.make_transformer("numpy", memory_budget=bad)
    with pytest.raises(ValueError, match="chunks must be a positive int"):
        ngt.make_transformer("numpy", chunks=bad)


def test_a_budget_too_small_is_named(data):
    with pytest.raises(ChunkingError, match="memory_budget=64 bytes leaves no room"):
        one_step("gcn", data, ngt.make_transformer("numpy", memory_budget=64))


def test_what_cannot_be_chunked_is_named():
    g = ng.Graph([0, 1, 2], [1, 2, 0], 3)
    x = ng.placeholder((3, 2), name="x")
    over_rows = ng.softmax(ng.aggregate(ng.gather(x, g), g), axis=0)
    with pytest.raises(ChunkingError, match="softmax.*normalizes over the rows"):
        ngt.make_transformer("numpy", chunks=2).computation(over_rows, x)(np.ones((3, 2)))
    h = ng.Graph([0, 1], [1, 0], 3)
    two = ng.aggregate(ng.gather(x, g), g) + ng.aggregate(ng.gather(x, h), h)
    with pytest.raises(ChunkingError, match="graph ops over 2 graphs"):
        ngt.make_transformer("numpy", chunks=2).computation(two, x)(np.ones((3, 2)))


def test_fitting_plan_runs_unchunked_and_source_shows_stages(data):
    roomy = ngt.make_transformer("numpy", memory_budget=1 << 40)
    _, _, trainer = one_step("gcn", data, roomy)
    assert not trainer.train_step.chunked and trainer.train_step.stats == {"chunks": 1}
    _, _, trainer = one_step("gcn", data, ngt.make_transformer("numpy", chunks=2))
    source = trainer.train_step.source
    assert "# ---- stage 0 (" in source and "(vertex) ----" in source and "(edge) ----" in source


def sparse_features(data):
    return replace(data, features=np.where(data.features > 1.5, data.features, 0))


@pytest.mark.parametrize("model_name", ["gcn", "gat"])
def test_sparse_features(transformer_factory, data, model_name):
    """X @ W and X^T @ D over sparse features (dropout on): every backend's chunked step
    equals its unchunked one. Under chunking the GPU keeps the weight gradients over all
    1200 vertices whole: SplitContractions' slices of them (the second layer's H^T @ D)
    were refused by the chunk planner ("mixes values of different row spaces")."""
    sparse = sparse_features(data)
    want = one_step(model_name, sparse, transformer_factory(), sparse=None)
    got = one_step(model_name, sparse, transformer_factory(chunks=3), sparse=None)
    assert got[2].sparse and got[2].train_step.chunked
    assert got[2].train_step.stats["chunks"] == 3
    assert_same_step(got, want)
    assert_same_logits(got[2], want[2])


def sparse_steps(transformer, model_name, features, labels, mask, graph, steps=2):
    """Losses, weights and evaluation logits after `steps` Adam steps (dropout on) of a
    float64 model over float64 sparse features, and the training step."""
    model = {"gcn": lambda: nn.GCN(24, 16, 4, dtype=np.float64),
             "gat": lambda: nn.GAT(24, 8, 2, 4, dtype=np.float64)}[model_name]()
    x = ng.placeholder(features.shape, dtype=np.float64, name="x", sparse=True)
    y = ng.placeholder(labels.shape, dtype=np.int64, name="y")
    m = ng.placeholder(mask.shape, dtype=np.bool_, name="mask")
    loss = ng.cross_entropy(model(graph, x, training=True), y, m)
    seed_dropout([loss], 7)
    step = transformer.computation(
        loss, x, y, m, updates=optim.Adam(model.parameters(), lr=0.01).updates(loss))
    losses = [float(step(features, labels, mask)) for _ in range(steps)]
    logits = transformer.computation(model(graph, x, training=False), x)(features)
    weights = {name: transformer.variable_value(v) for name, v in model.named_parameters()}
    return losses, weights, logits, step


@pytest.mark.parametrize("model_name", ["gcn", "gat"])
def test_sparse_features_float64_chunks_and_budget(transformer_factory, data, model_name):
    """Two float64 steps over sparse features, chunked by a count and by a quarter of the
    unchunked plan's bytes, equal the unchunked steps to 1e-10 on every backend."""
    features = scipy.sparse.csr_matrix(sparse_features(data).features, dtype=np.float64)
    args = (features, data.labels.astype(np.int64), data.train_mask.astype(bool), data.graph)
    want = sparse_steps(transformer_factory(), model_name, *args)
    budget = plan_bytes(want[3]) // 4
    for options in ({"chunks": 3}, {"memory_budget": budget}):
        losses, weights, logits, step = sparse_steps(transformer_factory(**options),
                                                     model_name, *args)
        assert step.chunked and step.stats["chunks"] >= 2, options
        if "memory_budget" in options:
            assert 0 < step.stats["device_peak_bytes"] <= budget
        np.testing.assert_allclose(losses, want[0], rtol=1e-10, err_msg=str(options))
        for name, w in want[1].items():
            np.testing.assert_allclose(weights[name], w, rtol=1e-10, atol=1e-12,
                                       err_msg=f"{name} {options}")
        np.testing.assert_allclose(logits, want[2], rtol=1e-10, atol=1e-12,
                                   err_msg=str(options))


def test_cli_memory_budget(capsys):
    from ngnn.cli import main
    main(["train", "--model", "gcn", "--dataset", "cora", "--epochs", "2", "--no-progress",
          "--memory-budget", "4M"])
    out = capsys.readouterr().out
    assert "memory budget: training step in" in out and "of 4.0 MiB" in out
