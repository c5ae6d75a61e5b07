"""Link prediction: the split and its leaks, negative sampling, the pair decoders, the loss
and the ranking metrics, against references (PyTorch Geometric in float64, brute-force
NumPy) on every backend, and the training step compiled once."""
import re

import numpy as np
import pytest
import scipy.sparse

import ngnn as ng
from ngnn import datasets, link_metrics, nn, optim
from ngnn.cli import main
from ngnn.link_train import LinkTrainer, pairs_graph
from ngnn.sampling import GraphSlot, NegativeSampler
from ngnn.sampling.negative import pair_keys
from helpers import check_gradient

F = 6


def sbm(num_nodes=120, seed=0):
    return datasets.synthetic("sbm", num_nodes, 6, F, 3, seed=seed)


def keys_of(pairs, n):
    return pair_keys(pairs[0], pairs[1], n)


def both_directions(pairs, n):
    return np.concatenate([keys_of(pairs, n), keys_of(pairs[::-1], n)])


# ---- the split --------------------------------------------------------------------------

def test_the_split_of_an_undirected_graph_leaks_no_held_out_edge():
    data = sbm()
    g, n = data.graph, data.num_nodes
    split = datasets.link_split(data, val=0.1, test=0.2, seed=3)
    assert split.undirected
    links = np.unique(pair_keys(np.minimum(g.src, g.dst), np.maximum(g.src, g.dst), n))
    num_val, num_test = int(0.1 * links.size), int(0.2 * links.size)
    assert [split.val_pos.shape[1], split.test_pos.shape[1], split.train_pos.shape[1]] == \
        [num_val, num_test, links.size - num_val - num_test]
    for pairs in (split.train_pos, split.val_pos, split.test_pos, split.val_neg,
                  split.test_neg):
        assert pairs.dtype == np.int64 and pairs.shape[0] == 2
        assert np.all(pairs[0] < pairs[1])                  # unordered pairs, written u < v
    # The three positive sets partition the links.
    positives = np.concatenate([keys_of(p, n) for p in
                                (split.train_pos, split.val_pos, split.test_pos)])
    np.testing.assert_array_equal(np.sort(positives), links)
    # No held-out edge, in either direction, in the message-passing graph...
    mp = keys_of(np.stack([split.graph.src, split.graph.dst]), n)
    held_out = np.concatenate([both_directions(split.val_pos, n),
                               both_directions(split.test_pos, n)])
    assert not np.isin(held_out, mp).any()
    # ...which keeps both directions of every training link and nothing else.
    np.testing.assert_array_equal(np.unique(mp),
                                  np.unique(both_directions(split.train_pos, n)))
    # Negatives: no edge of the whole graph either way, no self pair, distinct, disjoint.
    full = keys_of(np.stack([g.src, g.dst]), n)
    negatives = np.concatenate([keys_of(split.val_neg, n), keys_of(split.test_neg, n)])
    assert not np.isin(negatives, full).any()
    assert np.unique(negatives).size == negatives.size
    assert split.val_neg.shape == split.val_pos.shape
    assert split.test_neg.shape == split.test_pos.shape
    # Training negatives: no edge of the message-passing graph either way.
    sampler = NegativeSampler(split.graph, seed=5)
    drawn = sampler.sample(3000, epoch=0)
    assert not np.isin(both_directions(drawn, n), mp).any()
    assert np.all(drawn[0] < drawn[1])


def test_the_split_of_a_directed_graph_holds_out_edges_with_their_copies():
    g = ng.Graph.from_edges([0, 1, 1, 2, 3, 3, 4, 5, 5, 0, 2, 2],
                            [1, 0, 2, 3, 4, 4, 5, 0, 1, 3, 4, 2], num_nodes=7)
    split = datasets.link_split(g, val=0.2, test=0.2, seed=1, neg_ratio=2)
    assert not split.undirected and split.data is None
    n = g.num_nodes
    links = np.unique(keys_of(np.stack([g.src, g.dst]), n)[g.src != g.dst])
    mp = keys_of(np.stack([split.graph.src, split.graph.dst]), n)
    held_out = np.concatenate([keys_of(split.val_pos, n), keys_of(split.test_pos, n)])
    assert held_out.size == 2 * int(0.2 * links.size)
    assert not np.isin(held_out, mp).any()              # the doubled 3 -> 4 goes whole
    assert 2 * 7 + 2 in mp.tolist()                     # self loops stay for message passing
    negatives = np.concatenate([keys_of(split.val_neg, n), keys_of(split.test_neg, n)])
    assert not np.isin(negatives, keys_of(np.stack([g.src, g.dst]), n)).any()
    assert split.val_neg.shape[1] == 2 * split.val_pos.shape[1]


def test_the_split_is_a_function_of_its_seed():
    data = sbm()
    a, b = (datasets.link_split(data, seed=7) for _ in range(2))
    c = datasets.link_split(data, seed=8)
    for name in ("train_pos", "val_pos", "val_neg", "test_pos", "test_neg"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    assert not np.array_equal(a.test_pos, c.test_pos)
    np.testing.assert_array_equal(a.graph.src, b.graph.src)


@pytest.mark.parametrize("kwargs, match", [
    (dict(val=0.5, test=0.5), r"val \+ test must be below 1"),
    (dict(val=-0.1), r"val must be a share of the links in \[0, 1\), got -0.1"),
    (dict(test=float("nan")), r"test must be a share"),
    (dict(neg_ratio=-1), r"neg_ratio .* must be a finite number >= 0, got -1"),
    (dict(neg_ratio=float("inf")), r"neg_ratio"),
    (dict(seed=-1), r"seed must be an int in \[0, 2\*\*64\)"),
    (dict(val=0.001), r"val=0.001 of the graph's \d+ links is no link at all"),
])
def test_bad_split_arguments_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        datasets.link_split(sbm(), **kwargs)


def test_bad_split_inputs():
    with pytest.raises(TypeError, match="expected a datasets.Dataset or an ng.Graph"):
        datasets.link_split(np.zeros((2, 3)))
    # A complete graph has no pair left to be a negative: an error, not an endless draw.
    n = 5
    u, v = np.nonzero(~np.eye(n, dtype=bool))
    with pytest.raises(ValueError, match=r"validation and test negatives: \d+ distinct vertex "
                                         r"pairs that are not edges are needed, but the "
                                         r"graph has only 0"):
        datasets.link_split(ng.Graph.from_edges(u, v, n), val=0.2, test=0.2)


# ---- negative sampling ------------------------------------------------------------------

def test_negatives_are_fixed_by_seed_and_epoch_and_new_each_epoch():
    g = sbm().graph
    a, b = NegativeSampler(g, seed=11), NegativeSampler(g, seed=11)
    np.testing.assert_array_equal(a.sample(500, epoch=4), b.sample(500, epoch=4))
    assert not np.array_equal(a.sample(500, epoch=4), a.sample(500, epoch=5))
    assert not np.array_equal(a.sample(500, epoch=4), NegativeSampler(g, seed=12).sample(500, 4))
    drawn = a.sample(500, epoch=4)
    assert drawn.shape == (2, 500) and drawn.dtype == np.int64
    assert np.all(drawn[0] != drawn[1])
    assert drawn.min() >= 0 and drawn.max() < g.num_nodes
    assert np.unique(drawn[0]).size > 100       # spread over the vertices


def test_negatives_without_a_seed_take_their_key_where_dropouts_do(monkeypatch):
    # One place hands out the keys of unseeded random ops, so reseeding it (ng.manual_seed)
    # reseeds the negatives with the dropout masks.
    from ngnn.sampling import negative
    g = sbm().graph
    a, b = NegativeSampler(g), NegativeSampler(g)
    assert a.seed != b.seed and not np.array_equal(a.sample(50), b.sample(50))
    monkeypatch.setattr(negative, "dropout_seed", lambda seed: 1234 if seed is None else seed)
    assert NegativeSampler(g).seed == 1234 and NegativeSampler(g, seed=7).seed == 7


def test_bad_sampler_arguments():
    g = sbm().graph
    with pytest.raises(ValueError, match="count must be an int >= 0, got -3"):
        NegativeSampler(g, seed=0).sample(-3)
    with pytest.raises(ValueError, match="epoch must be an int"):
        NegativeSampler(g, seed=0).sample(3, epoch=-1)
    with pytest.raises(ValueError, match=r"seed must be an int in \[0, 2\*\*64\) or None"):
        NegativeSampler(g, seed=1.5)
    with pytest.raises(ValueError, match="has no pair of distinct vertices"):
        NegativeSampler(ng.Graph.from_edges([0], [0], 1))
    with pytest.raises(TypeError, match="expected an ng.Graph"):
        NegativeSampler(np.zeros((2, 2)))


# ---- metrics ----------------------------------------------------------------------------

def reference_auc(pos, neg):
    return np.mean((pos[:, None] > neg[None, :]) + 0.5 * (pos[:, None] == neg[None, :]))


def reference_ap(pos, neg):
    """Precision at each distinct threshold times the recall it adds, threshold by
    threshold (scikit-learn's definition)."""
    scores = np.concatenate([pos, neg])
    labels = np.concatenate([np.ones(pos.size), np.zeros(neg.size)])
    total, recall = 0.0, 0.0
    for threshold in sorted(set(scores.tolist()), reverse=True):
        chosen = scores >= threshold
        hits = labels[chosen].sum()
        total += (hits / pos.size - recall) * hits / chosen.sum()
        recall = hits / pos.size
    return total


@pytest.mark.parametrize("seed", range(4))
def test_auc_and_ap_equal_their_definitions_with_ties(seed):
    rng = np.random.default_rng(seed)
    pos = np.round(rng.normal(0.8, 1.0, 40), 1)         # rounded: many ties
    neg = np.round(rng.normal(0.0, 1.0, 55), 1)
    assert link_metrics.auc(pos, neg) == pytest.approx(reference_auc(pos, neg), abs=1e-12)
    assert link_metrics.average_precision(pos, neg) == \
        pytest.approx(reference_ap(pos, neg), abs=1e-12)


def test_hits_and_mrr():
    pos = np.array([5.0, 3.0, 1.0, 2.0])
    neg = np.array([4.0, 2.0, 0.0, 2.0, 6.0])
    # The 2nd best negative is 4: positives above it are 5 only.
    assert link_metrics.hits_at_k(pos, neg, 2) == 0.25
    assert link_metrics.hits_at_k(pos, neg, 5) == 1.0
    # Ranks among the negatives: 5 -> 2, 3 -> 3, 1 -> 5, 2 -> 1 + 2 + (0 + 2) / 2 = 4.
    expected = np.mean(1 / np.array([2.0, 3.0, 5.0, 4.0]))
    assert link_metrics.mrr(pos, neg) == pytest.approx(expected)
    assert link_metrics.mrr(pos, np.tile(neg, (4, 1))) == pytest.approx(expected)
    assert link_metrics.auc([1.0], [0.0]) == 1.0 and link_metrics.auc([0.0], [0.0]) == 0.5


@pytest.mark.parametrize("call, match", [
    (lambda: link_metrics.auc([], [1.0]), "at least one positive and one negative"),
    (lambda: link_metrics.average_precision([np.nan], [1.0]), "NaN or Inf"),
    (lambda: link_metrics.hits_at_k([1.0], [1.0, 2.0], 3), r"k must be an int in \[1, 2\]"),
    (lambda: link_metrics.mrr([1.0, 2.0], np.ones((3, 4))), "one row per positive"),
    (lambda: link_metrics.auc(np.ones((2, 2)), [1.0]), "expected 1-D positive scores"),
])
def test_bad_metric_inputs(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# ---- decoders and loss on every backend -------------------------------------------------

def query_pairs(n=9, count=14, seed=0):
    rng = np.random.default_rng(seed)
    u, v = rng.integers(0, n, count), rng.integers(0, n, count)
    return ng.Graph.from_edges(u, v, num_nodes=n)


def test_dot_decoder_and_loss_equal_numpy(transformer_factory):
    pairs = query_pairs()
    rng = np.random.default_rng(1)
    zv = rng.standard_normal((pairs.num_nodes, 4))
    labels = (rng.random(pairs.num_edges) < 0.5).astype(np.float64)
    z = ng.placeholder(zv.shape, dtype=np.float64, name="z")
    logits = nn.DotDecoder()(pairs, z)
    assert logits.shape == (pairs.num_edges,)
    loss = ng.binary_cross_entropy_with_logits(logits, ng.constant(labels, dtype=np.float64))
    got = transformer_factory().computation([logits, loss, ng.grad(loss, [z])[0]], z)(zv)
    expected = np.sum(zv[pairs.src] * zv[pairs.dst], axis=1)
    np.testing.assert_allclose(got[0], expected, rtol=1e-12)
    np.testing.assert_allclose(got[1], np.mean(np.logaddexp(expected, 0) - expected * labels),
                               rtol=1e-12)
    coefficient = (1 / (1 + np.exp(-expected)) - labels)[:, None] / pairs.num_edges
    gradient = np.zeros_like(zv)
    np.add.at(gradient, pairs.src, coefficient * zv[pairs.dst])
    np.add.at(gradient, pairs.dst, coefficient * zv[pairs.src])
    np.testing.assert_allclose(got[2], gradient, rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize("decoder", ["dot", "mlp"])
def test_decoder_and_loss_gradients_against_finite_differences(transformer_factory, decoder):
    pairs = query_pairs()
    labels = ng.constant((np.arange(pairs.num_edges) % 3 == 0).astype(np.float64),
                         dtype=np.float64)
    layer = nn.DotDecoder(dtype=np.float64) if decoder == "dot" else \
        nn.MLPDecoder(4, 5, seed=2, dtype=np.float64)
    z = np.random.default_rng(3).standard_normal((pairs.num_nodes, 4))
    check_gradient(lambda h: ng.binary_cross_entropy_with_logits(layer(pairs, h), labels),
                   [z], transformer_factory, coords=10)


def test_loss_with_a_mask_and_its_bad_input(transformer_factory):
    x = np.array([-3.0, 0.0, 2.0, 40.0])
    y = np.array([0.0, 1.0, 1.0, 0.0])
    mask = np.array([True, True, False, True])
    xs = ng.placeholder((4,), dtype=np.float64)
    loss = ng.binary_cross_entropy_with_logits(xs, ng.constant(y, dtype=np.float64),
                                               ng.constant(mask))
    got = transformer_factory().computation(loss, xs)(x)
    assert got == pytest.approx(np.mean((np.logaddexp(x, 0) - x * y)[mask]), rel=1e-12)
    with pytest.raises(ng.ShapeError, match="labels shape \\(3,\\) differs from logits"):
        ng.binary_cross_entropy_with_logits(xs, ng.constant(np.zeros(3)))
    with pytest.raises(ng.ShapeError, match="mask shape"):
        ng.binary_cross_entropy_with_logits(xs, ng.constant(y), ng.constant(mask[:2]))


# ---- against PyTorch Geometric, float64, identical weights ------------------------------

@pytest.mark.parametrize("decoder", ["dot", "mlp"])
def test_gcn_encoder_decoder_and_loss_equal_pyg_in_float64(transformer_factory, decoder):
    torch = pytest.importorskip("torch")
    from torch_geometric.nn import GCNConv
    data = sbm(60, seed=2)
    split = datasets.link_split(data, val=0.1, test=0.1, seed=0)
    g = split.graph
    neg = NegativeSampler(g, seed=1).sample(split.train_pos.shape[1])
    pairs = pairs_graph(split.train_pos, neg, g.num_nodes)
    labels = np.concatenate([np.ones(split.train_pos.shape[1]), np.zeros(neg.shape[1])])
    xv = np.asarray(data.features, dtype=np.float64)

    encoder = nn.GCN(F, 8, 4, dropout=0.0, seed=5, dtype=np.float64)
    head = nn.DotDecoder(dtype=np.float64) if decoder == "dot" else \
        nn.MLPDecoder(4, 6, seed=6, dtype=np.float64)
    model = nn.LinkPredictor(encoder, head)
    x = ng.placeholder(xv.shape, dtype=np.float64, name="x")
    logits = model(g, x, pairs)
    loss = ng.binary_cross_entropy_with_logits(logits, ng.constant(labels, dtype=np.float64))
    params = model.parameters()
    got = transformer_factory().computation([logits, loss] + ng.grad(loss, params), x)(xv)

    weights = [torch.tensor(np.asarray(p.initial_value), requires_grad=True) for p in params]
    edge_index = torch.tensor(np.stack([g.src, g.dst]))
    convs = [GCNConv(F, 8).double(), GCNConv(8, 4).double()]
    for conv, w, b in zip(convs, weights[0:4:2], weights[1:4:2]):
        conv.lin.weight = torch.nn.Parameter(w.T)       # PyG's Linear: x @ W.T
        conv.bias = torch.nn.Parameter(b)
    h = torch.relu(convs[0](torch.tensor(xv), edge_index))
    z = convs[1](h, edge_index)
    product = z[torch.tensor(pairs.src)] * z[torch.tensor(pairs.dst)]
    if decoder == "dot":
        reference = product.sum(-1)
    else:
        w1, b1, w2, b2 = weights[4:]
        reference = (torch.relu(product @ w1 + b1) @ w2 + b2).sum(-1)
    ref_loss = torch.nn.functional.binary_cross_entropy_with_logits(
        reference, torch.tensor(labels))
    # The GCNConv's parameters are those tensors (or their transposes): grads flow back.
    leaves = [convs[0].lin.weight, convs[0].bias, convs[1].lin.weight, convs[1].bias]
    leaves += weights[4:]
    ref_grads = torch.autograd.grad(ref_loss, leaves)
    np.testing.assert_allclose(got[0], reference.detach().numpy(), rtol=1e-9, atol=1e-12)
    assert got[1] == pytest.approx(ref_loss.item(), rel=1e-12)
    for i, (ours, theirs) in enumerate(zip(got[2:], ref_grads)):
        theirs = theirs.numpy()
        if i in (0, 2):
            theirs = theirs.T
        np.testing.assert_allclose(ours, theirs, rtol=1e-9, atol=1e-12,
                                   err_msg=f"gradient of {params[i].name}")


# ---- training ---------------------------------------------------------------------------

def make_trainer(transformer, data=None, hidden=16, **options):
    data = data or sbm()
    split = datasets.link_split(data, val=0.1, test=0.1, seed=0)
    model = nn.LinkPredictor(nn.GCN(F, hidden, 8, dropout=0.2, seed=0))
    # Raw features: rows of Gaussian features can sum to about zero.
    return LinkTrainer(model, split, optim.Adam(model.parameters(), lr=0.01),
                       transformer=transformer, normalize=False, **options)


def test_the_training_step_compiles_once_for_every_epochs_pairs(transformer_factory):
    t = transformer_factory()
    trainer = make_trainer(t)
    assert isinstance(trainer.pairs, GraphSlot)
    assert t.compilations == 0
    trainer.step()
    compiled = t.compilations
    assert compiled >= 2              # the step, the evaluation and the initial values
    first = np.stack([trainer.pairs.src, trainer.pairs.dst]).copy()
    losses = [trainer.step() for _ in range(3)]
    trainer.evaluate()
    trainer.fit(2, progress=False)
    assert t.compilations == compiled   # six draws of pairs, one program
    assert not np.array_equal(first, np.stack([trainer.pairs.src, trainer.pairs.dst]))
    assert np.all(np.isfinite(losses))


def test_every_backend_trains_as_numpy_does_over_new_pairs(transformer_factory):
    # Each step loads new pairs into the slot: a backend that kept the first step's index
    # arrays on its device would drift from NumPy's losses after it.
    from ngnn import transformers as ngt
    with ngt.make_transformer("numpy") as t:
        trainer = make_trainer(t)
        expected = [trainer.step() for _ in range(4)]
        expected_scores = trainer.scores()["test"]
    trainer = make_trainer(transformer_factory())
    np.testing.assert_allclose([trainer.step() for _ in range(4)], expected, rtol=1e-4)
    for ours, theirs in zip(trainer.scores()["test"], expected_scores):
        np.testing.assert_allclose(ours, theirs, rtol=1e-3, atol=1e-5)


def test_training_learns_and_is_reproducible():
    from ngnn import transformers as ngt
    results = []
    for _ in range(2):
        with ngt.make_transformer("numpy") as t:
            trainer = make_trainer(t, data=sbm(200, seed=4))
            history = trainer.fit(40, progress=False)
            results.append((trainer.evaluate(), [r["loss"] for r in history]))
    (metrics, losses), (again, losses_again) = results
    assert losses == losses_again and metrics == again
    assert losses[-1] < losses[0]
    assert metrics["test"]["auc"] > 0.65           # community structure is learnable


def test_sparse_and_dense_features_train_alike():
    from ngnn import transformers as ngt
    data = sbm(150, seed=6)
    sparse_data = datasets.Dataset(**{**data.__dict__,
                                      "features": scipy.sparse.csr_matrix(data.features)})
    losses = []
    # hidden 4 < 6 features: the first layer transforms first, a product a sparse x feeds.
    for d, sparse in ((data, False), (sparse_data, True)):
        with ngt.make_transformer("numpy") as t:
            trainer = make_trainer(t, data=d, hidden=4, sparse=sparse)
            assert trainer.sparse == sparse
            losses.append([trainer.step() for _ in range(3)])
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-5)
    with ngt.make_transformer("numpy") as t:      # aggregating first: sparse is refused
        assert not make_trainer(t, data=sparse_data, hidden=16).sparse
        with pytest.raises(ValueError, match="GCN cannot take sparse features"):
            make_trainer(t, data=sparse_data, hidden=16, sparse=True)


def test_bad_trainer_inputs():
    data = sbm()
    split = datasets.link_split(data, seed=0)
    model = nn.LinkPredictor(nn.GCN(F, 4, 4, dropout=0.0))
    with pytest.raises(ValueError, match=r"neg_ratio .* must be a finite number >= 0"):
        LinkTrainer(model, split, neg_ratio=-0.5)
    with pytest.raises(ValueError, match="the split has no node features"):
        LinkTrainer(model, datasets.link_split(data.graph, seed=0))
    with pytest.raises(ValueError, match="no test positives or no test negatives"):
        LinkTrainer(model, datasets.link_split(data, test=0.0, seed=0))


# ---- the command line -------------------------------------------------------------------

SBM = ["--dataset", "sbm", "--num-nodes", "200", "--avg-degree", "6", "--num-features", "8",
       "--num-classes", "3"]


def test_train_task_link_prints_auc_and_ap(capsys):
    code = main(["train", "--task", "link", "--model", "gcn", *SBM, "--epochs", "5",
                 "--runs", "2", "--no-progress"])
    assert code == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert re.fullmatch(r"test AUC: \d+\.\d ± \d+\.\d, AP: \d+\.\d ± \d+\.\d \(2 runs\)",
                        lines[-1])
    assert any(line.startswith("link split (undirected): ") for line in lines)
    assert any("latent 16, dot decoder, dropout 0.0" in line and "raw features" in line
               for line in lines)


@pytest.mark.parametrize("argv, normalized", [([], True), (["--task", "link"], False),
                                              (["--task", "link", "--normalize-features"],
                                               True),
                                              (["--no-normalize-features"], False)])
def test_features_are_normalized_but_for_links_unless_asked(argv, normalized):
    from ngnn import cli, recipes
    args = cli.make_parser().parse_args(["train", *argv])
    recipes.fill_defaults(args)
    assert args.normalize_features is normalized


def test_train_task_link_with_the_mlp_decoder(capsys):
    assert main(["train", "--task", "link", "--model", "sage", "--decoder", "mlp", *SBM,
                 "--epochs", "3", "--no-progress"]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1].endswith("(1 runs)")


@pytest.mark.parametrize("argv, match", [
    (["--neg-ratio", "-1"], r"argument --neg-ratio: must be in \[0, inf\), got -1"),
    (["--save", "w.npz"], r"--task link does not take --save"),
    (["--batch-size", "16"], r"--task link does not take --batch-size"),
])
def test_train_task_link_bad_options(capsys, argv, match):
    try:
        code = main(["train", "--task", "link", *SBM, "--epochs", "2", "--no-progress", *argv])
    except SystemExit as exit:
        code = exit.code
    assert code != 0
    assert re.search(match, capsys.readouterr().err)


def test_link_options_need_task_link(capsys):
    assert main(["train", *SBM, "--epochs", "2", "--no-progress", "--latent", "8"]) == 1
    assert "--latent is an option of link prediction; add --task link" in \
        capsys.readouterr().err
