"""R-GCN entity classification: the embedded RDF datasets, typed synthetic graphs and the
command line."""
import re

import numpy as np
import pytest
import scipy.sparse

import ngnn as ng
from ngnn import datasets, nn, optim
from ngnn.cli import main
from ngnn.relations import relation_graph
from ngnn.sampling import GraphSlot, NeighborSampler
from ngnn.sampling.program import MinibatchProgram
from ngnn.train import Trainer


@pytest.mark.parametrize("name, nodes, triples, relations, classes, train, test", [
    ("aifb", 8285, 29043, 45, 4, 140, 36),
    ("mutag_rdf", 23644, 74227, 23, 2, 272, 68),
])
def test_rdf_datasets_hold_the_papers_graphs(name, nodes, triples, relations, classes, train,
                                             test):
    data = datasets.load(name)
    g = data.graph
    assert (g.num_nodes, g.num_edges, g.num_relations) == (nodes, 2 * triples, 2 * relations)
    # Every triple's inverse: edge i + T reverses edge i, with relation r + R.
    assert np.array_equal(g.src[triples:], g.dst[:triples])
    assert np.array_equal(g.edge_type[triples:], g.edge_type[:triples] + relations)
    assert scipy.sparse.issparse(data.features) and data.features.nnz == nodes
    assert data.num_classes == classes
    assert (data.train_mask.sum(), data.test_mask.sum()) == (train, test)
    assert not (data.train_mask & data.test_mask).any()


def test_typed_synthetic_graph_keeps_the_untyped_one():
    plain = datasets.synthetic("rmat", 500, 8, 4, 3, seed=1)
    typed = datasets.synthetic("rmat", 500, 8, 4, 3, seed=1, num_relations=5)
    assert np.array_equal(plain.graph.src, typed.graph.src)
    assert np.array_equal(plain.features, typed.features)
    assert typed.graph.num_relations == 5 and set(typed.graph.edge_type) == set(range(5))


def test_train_rgcn_on_aifb_prints_the_accuracy_line(capsys):
    code = main(["train", "--model", "rgcn", "--dataset", "aifb", "--epochs", "2",
                 "--no-progress"])
    assert code == 0
    out = capsys.readouterr().out
    assert "weight decay 0.0," in out
    assert re.fullmatch(r"test accuracy: \d+\.\d ± \d+\.\d \(1 runs\)",
                        out.strip().splitlines()[-1])


def test_rgcn_on_an_untyped_dataset_is_an_error(capsys):
    code = main(["train", "--model", "rgcn", "--dataset", "cora", "--epochs", "1",
                 "--no-progress"])
    assert code == 1
    assert "rgcn needs a dataset with relation-typed edges (aifb, mutag_rdf); cora has none" \
        in capsys.readouterr().err


def typed_graph(n=90, edges=700, relations=4, seed=0):
    """Parallel edges, self loops, vertices without in-edges, and a relation no edge has."""
    rng = np.random.default_rng(seed)
    dst = np.minimum(rng.geometric(0.05, edges), n - 1)
    src = rng.integers(0, n, edges)
    src[:4] = dst[:4]
    types = rng.integers(0, relations - 1, edges)
    return ng.Graph.from_edges(src, dst, num_nodes=n, edge_type=types,
                               num_relations=relations)


@pytest.mark.parametrize("decomposition", [{}, {"num_bases": 2}, {"num_blocks": 2}])
def test_rgcn_batches_with_every_in_edge_sampled_equal_the_full_graph(transformer_factory,
                                                                      decomposition):
    """Typed slots: one compiled program serves batches of every shape, each relation's
    edges loaded into that relation's slot; with every in-edge sampled, a batch's seeds get
    the full-graph R-GCN's logits."""
    g = typed_graph()
    features = 6
    x = np.random.default_rng(1).standard_normal((g.num_nodes, features)).astype(np.float32)
    model = nn.RGCN(features, 4, 2, g.num_relations, seed=0, **decomposition)
    t = transformer_factory()
    xs = ng.placeholder(x.shape, name="x")
    full = t.computation(model(g, xs), xs)(x)
    everything = int(g.in_degrees.max())
    program = MinibatchProgram(model, g, features, [everything] * 2, 12, t)
    sampler = NeighborSampler(g, [everything] * 2, seed=0)
    rng = np.random.default_rng(2)
    sizes = set()
    for index in range(4):
        seeds = rng.choice(g.num_nodes, 12 - 3 * index, replace=False)
        batch = sampler.sample(seeds, 0, index)
        sizes.add(tuple(b.num_edges for b in batch.graphs))
        np.testing.assert_allclose(program.logits(batch, x), full[seeds], rtol=1e-4,
                                   atol=1e-5)
        compiled = compiled if index else t.compilations       # on the first batch
    assert len(sizes) == 4 and t.compilations == compiled


def test_rgcn_batches_of_featureless_entities_feed_one_hot_rows_sparse(transformer_factory):
    """Featureless entities (a sparse identity, as the RDF datasets give them): a program
    fed the batch's rows as a CSR matrix (the first layer's product a lookup of weight rows,
    its self-connection's rows cut after the product) gives the logits the program fed
    dense one-hot rows gives, and with every in-edge sampled the full graph's."""
    g = typed_graph()
    x = scipy.sparse.identity(g.num_nodes, dtype=np.float32, format="csr")
    model = nn.RGCN(g.num_nodes, 4, 2, g.num_relations, num_bases=2, seed=0)
    t = transformer_factory()
    xs = ng.placeholder(x.shape, name="x", sparse=True)
    full = t.computation(model(g, xs), xs)(x)
    everything = int(g.in_degrees.max())
    sampler = NeighborSampler(g, [everything] * 2, seed=0)
    sparse, dense = (MinibatchProgram(model, g, g.num_nodes, [everything] * 2, 12, t,
                                      sparse=fed) for fed in (True, False))
    assert sparse.x.is_sparse and not dense.x.is_sparse
    rng = np.random.default_rng(2)
    for index in range(3):
        seeds = rng.choice(g.num_nodes, 12 - 3 * index, replace=False)
        batch = sampler.sample(seeds, 0, index)
        got = sparse.logits(batch, x)
        np.testing.assert_allclose(got, dense.logits(batch, x), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got, full[seeds], rtol=1e-4, atol=1e-5)


def test_trainer_trains_rgcn_over_minibatches():
    """The Trainer's minibatch side over a typed graph: its program's slots carry the
    relations, the loss falls, and the full-graph evaluation reads the trained weights."""
    data = datasets.synthetic("sbm", 200, 6, 5, 3, seed=0, num_relations=4)
    model = nn.RGCN(5, 8, 3, data.graph.num_relations, num_bases=2, seed=0)
    trainer = Trainer(model, data, optim.Adam(model.parameters(), lr=0.05), batch_size=32,
                      fanouts=[4, 3])
    assert all(slot.relations is not None for slot in trainer.minibatches.program.slots)
    losses = [trainer.step() for _ in range(6)]
    assert losses[-1] < losses[0]
    assert trainer.predict().shape == (200, 3)


def test_typed_slots_refuse_what_they_cannot_carry():
    g = typed_graph()
    block = NeighborSampler(g, [5], seed=0).sample(np.arange(10)).graphs[0]
    slot = GraphSlot(block.num_nodes + 1, block.num_edges + 1, block.num_dst + 1,
                     relation_edges=[block.num_edges] * 3)
    with pytest.raises(ValueError, match="carries 3 relations"):
        slot.load(block)
    counts = np.bincount(block.edge_type, minlength=4)
    slot = GraphSlot(block.num_nodes + 1, block.num_edges + 1, block.num_dst + 1,
                     relation_edges=counts - (counts == counts.max()))
    with pytest.raises(ValueError, match=f"has {counts.max()} edges of relation "
                                         f"{counts.argmax()}; this slot holds"):
        slot.load(block)
    slot = GraphSlot(block.num_nodes + 1, block.num_edges + 1, block.num_dst + 1,
                     relation_edges=counts)
    slot.load(block)
    with pytest.raises(ValueError, match="is a minibatch slot: over slots, relation-typed"):
        relation_graph(slot)
