"""Relational (RDF) entity-classification datasets, as the R-GCN paper uses them (AIFB and
MUTAG of Ristoski et al. 2016; Schlichtkrull et al. 2018, Table 1).

The files hold the original triples only (subject -> object, relation ids in [0, R)). The
graph built here adds each triple's inverse as relation r + R, so messages flow both ways
with their own weights: 2R relations (the paper's self-connection is the layer's root
weight). Entities have no features: `features` is a sparse N x N identity, so the first
layer's product is a lookup of its weight rows. The labelled entities are split as in the
paper (train / test); the paper chose its settings on a fifth of the training set and then
trained on all of it, so there is no validation split: `val_mask` is the training set.
"""
import numpy as np
import scipy.sparse

from ngnn.datasets.dataset import Dataset
from ngnn.graph import Graph

KEYS = ("src", "dst", "edge_type", "num_nodes", "num_relations", "train_idx", "train_y",
        "test_idx", "test_y", "class_names")


def is_relational(arrays):
    return "edge_type" in arrays


def relational_dataset(name, arrays, where):
    """The Dataset of an RDF .npz's arrays (docs/datasets.md); `where` names the file in
    error messages."""
    missing = [key for key in KEYS if key not in arrays]
    if missing:
        raise ValueError(f"{where} is missing required array(s) {', '.join(missing)}; "
                         f"found {', '.join(sorted(arrays))}")
    n, num_relations = int(arrays["num_nodes"]), int(arrays["num_relations"])
    src, dst, types = arrays["src"], arrays["dst"], arrays["edge_type"]
    try:
        graph = Graph.from_edges(np.concatenate([src, dst]), np.concatenate([dst, src]),
                                 num_nodes=n,
                                 edge_type=np.concatenate([types, types + num_relations]),
                                 num_relations=2 * num_relations)
    except ValueError as err:
        raise ValueError(f"{where}: invalid triples: {err}") from err
    labels = np.zeros(n, dtype=np.int64)
    masks = {}
    for split in ("train", "test"):
        idx, y = arrays[f"{split}_idx"], arrays[f"{split}_y"]
        if idx.shape != y.shape or idx.size and (idx.min() < 0 or idx.max() >= n):
            raise ValueError(f"{where}: {split}_idx and {split}_y must be equally long, with "
                             f"entity ids in [0, {n})")
        labels[idx] = y
        masks[split] = np.zeros(n, dtype=bool)
        masks[split][idx] = True
    num_classes = len(arrays["class_names"])
    features = scipy.sparse.identity(n, dtype=np.float32, format="csr")
    return Dataset(name, graph, features, labels, masks["train"], masks["train"].copy(),
                   masks["test"], num_classes=num_classes)
