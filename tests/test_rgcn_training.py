"""R-GCN entity classification: the embedded RDF datasets, typed synthetic graphs and the
command line."""
import re

import numpy as np
import pytest
import scipy.sparse

from ngnn import datasets
from ngnn.cli import main


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


def test_rgcn_over_minibatches_is_a_clear_error(capsys):
    """Minibatch programs do not carry edge types through their graph slots yet: R-GCN
    over sampled blocks says so instead of training on untyped blocks."""
    code = main(["train", "--model", "rgcn", "--dataset", "aifb", "--batch-size", "64",
                 "--epochs", "1", "--no-progress"])
    assert code == 1
    assert "minibatch training (batch_size / --batch-size) does not carry edge types" \
        in capsys.readouterr().err
