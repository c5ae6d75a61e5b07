"""Minibatches (ngnn.sampling): the sampler's blocks, the row prefix, one compiled program
for every batch, and batch outputs against NumPy references and the full-graph forward."""
import re

import numpy as np
import pytest

import ngnn as ng
from ngnn import datasets, nn, optim
from ngnn.cli import main
from ngnn.datasets.dataset import make_dataset
from ngnn.frontend import TracingError
from ngnn.sampling import GraphSlot, NeighborSampler
from ngnn.sampling.program import MinibatchProgram, capacities, with_block_self_loops
from ngnn.train import Trainer

from helpers import check_gradient

N, F, CLASSES = 120, 6, 3


def random_graph(n=N, edges=900, seed=0):
    """In-degrees from 0 to well past the fanouts, parallel edges and self loops."""
    rng = np.random.default_rng(seed)
    dst = np.minimum(rng.geometric(0.04, edges), n - 1)     # a few vertices take most edges
    src = rng.integers(0, n, edges)
    src[:4], dst[:4] = dst[:4], dst[:4]
    src[4:8], dst[4:8] = src[8], dst[8]
    return ng.Graph.from_edges(src, dst, num_nodes=n)


def graph_with_isolated_vertices(n=N, seed=0):
    """random_graph's edges (self loops and parallel edges included) among a third of the
    vertices, their ids spread over [0, n): the others have no edge at all, in runs of
    every length, as many vertices of the Amazon graphs have none."""
    rng = np.random.default_rng(seed)
    members = np.sort(rng.choice(n, n // 3, replace=False))
    small = random_graph(n // 3, 300, seed)
    return ng.Graph.from_edges(members[small.src], members[small.dst], num_nodes=n)


GRAPHS = [random_graph, graph_with_isolated_vertices]


def small_blocks(transformer_factory):
    """A transformer whose fused groups (NumPy) run over blocks of a few edges, so a slot's
    blocks change with every batch it is loaded with, as the Amazon graphs' blocks do at
    full size; other backends as they are."""
    t = transformer_factory()
    return transformer_factory(fusion_block_bytes=256) \
        if "fusion_block_bytes" in t.extra_options else t


def global_edges(batch, layer):
    block = batch.graphs[layer]
    return batch.nodes[block.src], batch.nodes[block.dst]


# ---- the sampler -------------------------------------------------------------------------

@pytest.mark.parametrize("graph", GRAPHS)
@pytest.mark.parametrize("fanouts", [[4, 3], [5, 2, 3], [-1, 2], [None]])
def test_sampled_in_edges_are_real_distinct_and_min_of_degree_and_fanout(fanouts, graph):
    g = graph()
    sampler = NeighborSampler(g, fanouts, seed=3)
    seeds = np.array([0, 1, 7, 50, 119, 2, 3])
    batch = sampler.sample(seeds, epoch=1, index=2)
    assert len(batch.graphs) == len(fanouts) == len(batch.edge_ids)
    for layer, (block, eids) in enumerate(zip(batch.graphs, batch.edge_ids)):
        src, dst = global_edges(batch, layer)
        np.testing.assert_array_equal(g.src[eids], src)      # each one a real edge...
        np.testing.assert_array_equal(g.dst[eids], dst)      # ...into its vertex
        vertices = batch.nodes[:block.num_dst]
        fanout = sampler.fanouts[layer]
        want = g.in_degrees[vertices] if fanout is None else \
            np.minimum(g.in_degrees[vertices], fanout)
        np.testing.assert_array_equal(np.bincount(block.dst, minlength=block.num_dst), want)
        assert np.unique(eids).size == eids.size             # distinct in-edges


def test_layer_rows_are_the_sizes_of_the_k_hop_frontiers():
    g = random_graph()
    batch = NeighborSampler(g, [3, 4, 2], seed=0).sample(np.array([5, 9, 60]), 0, 0)
    assert batch.layer_rows[-1] == 3
    assert np.unique(batch.nodes).size == batch.nodes.size
    reached = list(batch.nodes[:3])
    # Walk the hops from the seeds outward: layer L-k's sampled sources, added in the order
    # the sampler promises (each hop's new vertices sorted by id), give the rows of layer
    # L-k-1 (and of the input for k = L-1).
    for k, layer in enumerate(reversed(range(3))):
        block = batch.graphs[layer]
        assert block.num_dst == len(reached) == batch.layer_rows[layer]
        src, _ = global_edges(batch, layer)
        new = np.setdiff1d(src, reached)
        reached += list(new)
        assert block.num_nodes == len(reached)
    np.testing.assert_array_equal(batch.nodes, reached)


def test_a_batch_is_a_function_of_seed_epoch_and_index():
    g = random_graph()
    seeds = np.arange(10, 30)

    def edges(sampler, epoch, index):
        batch = sampler.sample(seeds, epoch, index)
        return [batch.nodes] + batch.edge_ids

    first = edges(NeighborSampler(g, [3, 2], seed=7), 2, 5)
    again = NeighborSampler(g, [3, 2], seed=7)
    edges(again, 0, 0)                 # whatever was sampled before does not matter
    for a, b in zip(first, edges(again, 2, 5)):
        np.testing.assert_array_equal(a, b)
    for other in (edges(again, 3, 5), edges(again, 2, 6),
                  edges(NeighborSampler(g, [3, 2], seed=8), 2, 5)):
        assert any(a.shape != b.shape or (a != b).any() for a, b in zip(first, other))


def test_each_in_edge_is_equally_likely():
    # Vertex 0 has 10 in-edges; 3 are sampled per batch: each should be picked 30% of the
    # time (4000 batches: a standard deviation of 0.7 points).
    g = ng.Graph.from_edges(np.arange(1, 11), np.zeros(10, dtype=np.int64), 11)
    sampler = NeighborSampler(g, [3], seed=1)
    picks = np.concatenate([sampler.sample(np.array([0]), 0, i).edge_ids[0]
                            for i in range(4000)])
    share = np.bincount(picks, minlength=10) / 4000
    assert np.abs(share - 0.3).max() < 0.03, share


def test_epochs_shuffle_every_training_vertex_into_batches_once():
    g = random_graph()
    sampler = NeighborSampler(g, [2], seed=0)
    nodes = np.arange(3, 100, 2)
    for epoch in (0, 1):
        batches = list(sampler.batches(nodes, 16, epoch=epoch))
        assert [b.num_seeds for b in batches] == [16, 16, 16, 1]
        seen = np.concatenate([b.nodes[:b.num_seeds] for b in batches])
        np.testing.assert_array_equal(np.sort(seen), nodes)
    assert not np.array_equal(sampler.order(50, 0), sampler.order(50, 1))


@pytest.mark.parametrize("fanouts, message", [
    ([0], "fanouts\\[0\\] must be a positive int"), ([2.5], "positive int"), ([], "1 to"),
    ("15,10", "list")])
def test_bad_fanouts_are_named(fanouts, message):
    with pytest.raises(ValueError, match=message):
        NeighborSampler(random_graph(), fanouts)


@pytest.mark.parametrize("seeds, message", [
    ([1, 2, 1], "repeated"), ([0, N], "must lie in"), ([], "non-empty"), ([0.5], "integer")])
def test_bad_seeds_are_named(seeds, message):
    sampler = NeighborSampler(random_graph(), [2])
    with pytest.raises(ValueError, match=message):
        sampler.sample(np.array(seeds))
    batch = sampler.sample(np.array([1, 2]))       # a failed call leaves no state behind
    assert batch.nodes[:2].tolist() == [1, 2]


# ---- blocks and slots ----------------------------------------------------------------------

def test_block_graphs_check_their_destination_prefix():
    with pytest.raises(ValueError, match="dst\\[1\\] = 3 is out of range \\[0, 2\\)"):
        ng.Graph.from_edges([0, 1], [1, 3], num_nodes=4, num_dst=2)
    with pytest.raises(ValueError, match="num_dst must be an int in \\[0, num_nodes=4\\]"):
        ng.Graph.from_edges([0], [0], num_nodes=4, num_dst=5)
    block = ng.Graph.from_edges([2, 3], [0, 1], num_nodes=4, num_dst=2)
    h = ng.placeholder((4, 2), name="h")
    with ng.zoomIn(block, node_feat={"h": h}) as v:
        assert ng.zoomOut(v.h).shape == (2, 2)
        with pytest.raises(TracingError, match="block"):
            sum(n.h for n in v.outnbs)


def test_slots_pad_without_touching_the_loaded_rows():
    block = ng.Graph.from_edges([3, 4, 1, 0], [0, 0, 1, 2], num_nodes=5, num_dst=3)
    slot = GraphSlot(num_nodes=9, num_edges=10, num_dst=6)
    version = slot.version
    slot.load(block)
    assert slot.version == version + 1
    np.testing.assert_array_equal(slot.in_degrees[:3], block.in_degrees[:3])
    np.testing.assert_array_equal(slot.out_degrees[:5], block.out_degrees)
    assert slot.src[4:].min() >= 5 and slot.dst[4:].min() >= 3
    assert slot.in_degrees[3:6].max() == 2            # padding edges spread out
    with pytest.raises(ValueError, match="does not fit"):
        slot.load(ng.Graph.from_edges([0], [0], num_nodes=9, num_dst=1))


@pytest.mark.parametrize("graph", GRAPHS)
def test_capacities_bound_every_batch(graph):
    g = graph()
    sizes = capacities(g, [4, None], 8, self_loops=True)
    sampler = NeighborSampler(g, [4, None], seed=0)
    for index in range(20):
        seeds = np.random.default_rng(index).choice(N, 8, replace=False)
        batch = sampler.sample(seeds, 0, index)
        for (read, computed, edges), block in zip(sizes, batch.graphs):
            looped = with_block_self_loops(block)
            assert block.num_nodes < read and block.num_dst < computed
            assert looped.num_edges <= edges
    for read, computed, _ in capacities(g, [3], N + 5):     # more seeds than vertices
        assert read >= computed == N + 1


def test_block_self_loops_replace_sampled_ones_and_stay_grouped():
    block = ng.Graph.from_edges([1, 0, 2, 2, 3], [0, 0, 1, 2, 2], num_nodes=4, num_dst=3)
    looped = with_block_self_loops(block)
    pairs = sorted(zip(looped.dst.tolist(), looped.src.tolist()))
    assert pairs == [(0, 0), (0, 1), (1, 1), (1, 2), (2, 2), (2, 3)]
    assert np.all(np.diff(looped.dst) >= 0)


# ---- batch outputs against references, on every backend --------------------------------------

def inv_sqrt(degree):
    return np.where(degree > 0, 1.0 / np.sqrt(np.maximum(degree, 1)), 0.0)


def sage_reference(params, blocks, x):
    """GraphSAGE (mean) on the blocks: each layer computes its block's num_dst rows."""
    h = x
    for i, (block, (w_self, w_neigh, bias)) in enumerate(zip(blocks, params)):
        total = np.zeros((block.num_dst, h.shape[1]))
        np.add.at(total, block.dst, h[block.src])
        mean = total / np.maximum(block.in_degrees[:block.num_dst], 1)[:, None]
        h = h[:block.num_dst] @ w_self + mean @ w_neigh + bias
        if i < len(blocks) - 1:
            h = np.maximum(h, 0)
    return h


def gcn_reference(params, blocks, x):
    """GCN on self-looped blocks, normalized by the degrees within each block."""
    h = x
    for i, (block, (weight, bias)) in enumerate(zip(blocks, params)):
        block = with_block_self_loops(block)
        total = np.zeros((block.num_dst, h.shape[1]))
        np.add.at(total, block.dst, h[block.src] * inv_sqrt(block.out_degrees)[block.src, None])
        h = (total * inv_sqrt(block.in_degrees[:block.num_dst])[:, None]) @ weight + bias
        if i < len(blocks) - 1:
            h = np.maximum(h, 0)
    return h


def gat_reference(params, blocks, x):
    """GAT on self-looped blocks: attention softmax over each vertex's sampled in-edges and
    its self loop; ELU between the layers, one head at the end."""
    h = x
    for i, (block, (fc, attn_l, attn_r, bias)) in enumerate(zip(blocks, params)):
        block = with_block_self_loops(block)
        heads, width = attn_l.shape
        feat = (h @ fc).reshape(len(h), heads, width)
        el, er = (feat * attn_l).sum(-1), (feat[:block.num_dst] * attn_r).sum(-1)
        logits = el[block.src] + er[block.dst]
        logits = np.where(logits > 0, logits, 0.2 * logits)
        peak = np.full((block.num_dst, heads), -np.inf)
        np.maximum.at(peak, block.dst, logits)
        coeff = np.exp(logits - peak[block.dst])
        total = np.zeros((block.num_dst, heads))
        np.add.at(total, block.dst, coeff)
        out = np.zeros((block.num_dst, heads, width))
        np.add.at(out, block.dst, (coeff / total[block.dst])[:, :, None] * feat[block.src])
        h = (out + bias).reshape(block.num_dst, heads * width)
        if i < len(blocks) - 1:
            h = np.where(h > 0, h, np.expm1(np.minimum(h, 0)))
    return h


def model_params(t, model):
    return [[t.variable_value(p) for p in layer.parameters()] for _, layer in model.layers]


def make_model(kind, seed=0):
    if kind == "gat":
        return nn.GAT(F, hidden=4, heads=2, num_classes=CLASSES, seed=seed)
    return {"sage": nn.GraphSAGE, "gcn": nn.GCN, "gin": nn.GIN}[kind](F, 8, CLASSES, seed=seed)


def seeds_of_every_kind(g):
    """Batches of seeds for one program: with edges first (its code is generated for
    those blocks), then vertices without in-edges, then a mix; the later blocks have long
    runs of rows without edges."""
    bare = np.flatnonzero(g.in_degrees == 0)
    linked = np.flatnonzero(g.in_degrees > 0)
    return [linked[:12], bare[:12], np.concatenate([bare[-5:], linked[-4:]])]


@pytest.mark.parametrize("graph", GRAPHS)
@pytest.mark.parametrize("kind, reference", [("sage", sage_reference), ("gcn", gcn_reference),
                                             ("gat", gat_reference)])
def test_batch_output_equals_a_numpy_reference_on_the_sampled_blocks(transformer_factory, kind,
                                                                     reference, graph):
    g = graph()
    x = np.random.default_rng(1).standard_normal((N, F)).astype(np.float32)
    model = make_model(kind)
    t = small_blocks(transformer_factory)
    program = MinibatchProgram(model, g, F, [4, 3], 12, t)
    sampler = NeighborSampler(g, [4, 3], seed=0)
    batches = [np.arange(0, 12), np.array([100, 3, 57])] + seeds_of_every_kind(g)
    for index, seeds in enumerate(batches):
        batch = sampler.sample(seeds, 0, index)
        out = program.logits(batch, x)
        want = reference(model_params(t, model), batch.graphs, x[batch.nodes].astype(np.float64))
        np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("graph", GRAPHS)
@pytest.mark.parametrize("kind", ["sage", "gat", "gin"])
def test_with_every_in_edge_sampled_a_batch_equals_the_full_graph_forward(transformer_factory,
                                                                          kind, graph):
    g = graph()
    x = np.random.default_rng(2).standard_normal((N, F)).astype(np.float32)
    model = make_model(kind)
    t = small_blocks(transformer_factory)
    xs = ng.placeholder((N, F), name="x")
    full = t.computation(model(g, xs), xs)(x)
    big = int(g.in_degrees.max()) + 1
    program = MinibatchProgram(model, g, F, [big, big], 12, t)
    sampler = NeighborSampler(g, [big, -1], seed=0)
    batches = [np.random.default_rng(index).choice(N, 10 - 3 * index, replace=False)
               for index in range(2)] + seeds_of_every_kind(g)
    for index, seeds in enumerate(batches):
        out = program.logits(sampler.sample(seeds, 0, index), x)
        np.testing.assert_allclose(out, full[seeds], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("graph", GRAPHS)
def test_the_row_prefix_computes_the_same_seeds_as_every_row(transformer_factory, graph):
    g = graph()
    x = np.random.default_rng(3).standard_normal((N, F)).astype(np.float32)
    model = make_model("gcn")
    t = small_blocks(transformer_factory)
    prefix = MinibatchProgram(model, g, F, [3, 2], 12, t)
    every = MinibatchProgram(model, g, F, [3, 2], 12, t, row_prefix=False)
    assert [s.num_dst for s in prefix.slots] < [s.num_dst for s in every.slots]
    sampler = NeighborSampler(g, [3, 2], seed=4)
    for index, seeds in enumerate([np.arange(40, 48)] + seeds_of_every_kind(g)):
        batch = sampler.sample(seeds, 0, index)
        np.testing.assert_allclose(prefix.logits(batch, x), every.logits(batch, x),
                                   rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("graph", GRAPHS)
@pytest.mark.parametrize("kind", ["sage", "gcn", "gat"])
def test_gradients_over_a_loaded_slot(transformer_factory, kind, graph):
    g = graph()
    bare = np.flatnonzero(g.in_degrees == 0)[:2]
    seeds = np.concatenate([np.flatnonzero(g.in_degrees > 0)[[0, 5, 9]], bare])
    block = NeighborSampler(g, [3], seed=0).sample(seeds).graphs[0]
    if kind != "sage":
        block = with_block_self_loops(block)
    slot = GraphSlot(block.num_nodes + 2, block.num_edges + 3, block.num_dst + 2)
    slot.load(block)
    conv = {"sage": nn.SAGEConv(3, 2, dtype=np.float64),
            "gcn": nn.GCNConv(3, 2, dtype=np.float64),
            "gat": nn.GATConv(3, 2, 2, dtype=np.float64)}[kind]
    x = np.random.default_rng(5).standard_normal((slot.num_nodes, 3))
    check_gradient(lambda h: conv(slot, h), [x], lambda: small_blocks(transformer_factory),
                   coords=8)


def dataset_with_isolated_vertices(n=240, seed=0):
    """A Dataset over graph_with_isolated_vertices: random features and labels, training
    vertices with and without edges."""
    rng = np.random.default_rng(seed)
    g = graph_with_isolated_vertices(n, seed)
    split = rng.permutation(n)
    masks = [np.isin(np.arange(n), part) for part in (split[:60], split[60:100], split[100:])]
    return make_dataset("isolated", g.src, g.dst, rng.standard_normal((n, F)).astype(np.float32),
                        rng.integers(0, CLASSES, n), *masks, where="test")


@pytest.mark.parametrize("make_data", [
    lambda: datasets.synthetic("sbm", 200, 6, F, CLASSES, seed=0), dataset_with_isolated_vertices])
def test_no_code_is_generated_after_the_first_batch_over_two_epochs(transformer_factory,
                                                                     make_data):
    data = make_data()
    model = make_model("gcn")
    t = small_blocks(transformer_factory)
    trainer = Trainer(model, data, optim.Adam(model.parameters(), lr=0.01), transformer=t,
                      batch_size=16, fanouts=[4, 3])
    batches = trainer.minibatches
    assert t.compilations == 0
    first = next(batches.sampler.batches(batches.train_nodes, 16, epoch=99))
    batches.program.step(first, trainer.features, data.labels)
    compiled = t.compilations
    assert compiled >= 2              # the step, the evaluation and the initial values
    sizes = set()
    for epoch in range(2):
        for batch in batches.sampler.batches(batches.train_nodes, 16, epoch=epoch):
            batches.program.step(batch, trainer.features, data.labels)
            sizes.add((len(batch.nodes), batch.num_sampled_edges))
        trainer.predict()
    assert len(sizes) > 4             # batches of many shapes...
    assert t.compilations == compiled  # ...served by the programs of the first one


def test_minibatches_over_vertices_without_edges_train_and_evaluate_exactly(transformer_factory):
    """The Amazon graphs' case: training vertices without edges, over programs whose
    fused blocks change with every batch; sampled evaluation with every in-edge equals
    the full-graph one."""
    data = dataset_with_isolated_vertices()
    model = make_model("sage")
    t = small_blocks(transformer_factory)
    trainer = Trainer(model, data, optim.Adam(model.parameters(), lr=0.01), transformer=t,
                      batch_size=16, fanouts=[4, 3], eval_fanouts=[-1, -1])
    history = trainer.fit(3, progress=False)
    assert len(history) == 3 and all(np.isfinite(r["loss"]) for r in history)
    full = Trainer(model, data, transformer=t)
    np.testing.assert_allclose(trainer.predict(), full.predict(), rtol=1e-4, atol=1e-5)


def test_trainer_learns_from_minibatches_and_evaluates_sampled_when_asked():
    data = datasets.synthetic("sbm", 300, 8, F, CLASSES, seed=1)
    model = make_model("sage")
    trainer = Trainer(model, data, optim.Adam(model.parameters(), lr=0.02), batch_size=16,
                      fanouts=[5, 5], eval_fanouts=[-1, -1])
    history = trainer.fit(15, progress=False)
    assert history[-1]["loss"] < history[0]["loss"]
    assert trainer.evaluate()["test"] > 0.45          # 3 classes: chance is 0.33
    assert trainer.train_step.calls == 15 * 4       # 60 training vertices, 4 batches each
    full = Trainer(model, data, transformer=trainer.transformer)
    np.testing.assert_allclose(trainer.predict(), full.predict(), rtol=1e-4, atol=1e-5)


def test_resumed_minibatch_training_continues_exactly(tmp_path):
    data = datasets.synthetic("sbm", 200, 6, F, CLASSES, seed=2)

    def trainer():
        model = make_model("sage", seed=3)
        return Trainer(model, data, optim.Adam(model.parameters(), lr=0.01), batch_size=16,
                       fanouts=[3, 3], seed=5)

    straight = trainer()
    losses = [straight.step() for _ in range(3)]
    first = trainer()
    first.step(), first.step()
    first.save(tmp_path / "c.npz")
    resumed = trainer()
    resumed.load(tmp_path / "c.npz")
    assert resumed.minibatches.epoch == 2
    assert resumed.step() == losses[2]


def test_minibatch_options_are_checked():
    data = datasets.synthetic("sbm", 100, 4, F, CLASSES, seed=0)
    model = make_model("sage")
    with pytest.raises(ValueError, match="name 3 layers; the model has 2"):
        Trainer(model, data, batch_size=8, fanouts=[2, 2, 2])
    with pytest.raises(ValueError, match="batch_size must be a positive int"):
        Trainer(model, data, batch_size=0, fanouts=[2, 2])


def test_cli_trains_from_minibatches(capsys):
    code = main(["train", "--model", "sage", "--dataset", "sbm", "--num-nodes", "300",
                 "--num-features", "8", "--num-classes", "3", "--batch-size", "16",
                 "--fanouts", "15,10", "--epochs", "3", "--no-progress"])
    assert code == 0
    out = capsys.readouterr().out
    assert "minibatches of 16 with fanouts [15, 10]" in out
    assert re.search(r"time per epoch: \d+\.\d ms", out)
    assert re.search(r"test accuracy: \d+\.\d", out.strip().splitlines()[-1])
    with pytest.raises(SystemExit):
        main(["train", "--model", "sage", "--fanouts", "15,x"])
    assert "expected comma-separated ints" in capsys.readouterr().err
