"""Synthetic graphs of any size: a learnable block-model task and R-MAT graphs for speed tests."""

import dataclasses
import numbers

import numpy as np

from ngnn.graph import Graph
from ngnn.datasets.dataset import make_dataset

KINDS = ("sbm", "rmat")

# Share of each node's sampled edges that stay inside its own block.
SBM_INTRA_FRACTION = 0.8
# R-MAT quadrant probabilities (Chakrabarti et al. 2004 defaults).
RMAT_PROBS = (0.57, 0.19, 0.19, 0.05)
TRAIN_PER_CLASS = 20
VAL_PER_CLASS = 30


def _check_int(name, value, minimum):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")


def _split(labels, num_classes, rng):
    """20 random nodes per class for training, the next 30 for validation, the rest for testing."""
    order = rng.permutation(labels.shape[0])
    order = order[np.argsort(labels[order], kind="stable")]
    starts = np.concatenate([[0], np.cumsum(np.bincount(labels, minlength=num_classes))[:-1]])
    rank = np.empty(labels.shape[0], dtype=np.int64)
    rank[order] = np.arange(labels.shape[0]) - starts[labels[order]]
    train = rank < TRAIN_PER_CLASS
    val = (rank >= TRAIN_PER_CLASS) & (rank < TRAIN_PER_CLASS + VAL_PER_CLASS)
    return train, val, ~(train | val)


def _sbm_edges(labels, num_classes, num_edges, rng):
    num_nodes = labels.shape[0]
    src = rng.integers(0, num_nodes, size=num_edges)
    # Members of each block sit contiguously in `members`, so a uniform pick inside a block is one
    # offset into its slice.
    members = np.argsort(labels, kind="stable")
    sizes = np.bincount(labels, minlength=num_classes)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    block = labels[src]
    inside = members[starts[block] + (rng.random(num_edges) * sizes[block]).astype(np.int64)]
    anywhere = rng.integers(0, num_nodes, size=num_edges)
    dst = np.where(rng.random(num_edges) < SBM_INTRA_FRACTION, inside, anywhere)
    keep = src != dst
    src, dst = src[keep], dst[keep]
    return np.concatenate([src, dst]), np.concatenate([dst, src])


def _rmat_edges(num_nodes, num_edges, rng):
    bits = max(int(num_nodes - 1).bit_length(), 1)
    a, b, c, _ = RMAT_PROBS
    src = np.empty(0, dtype=np.int64)
    dst = np.empty(0, dtype=np.int64)
    # Ids fall in [0, 2**bits); edges that land outside [0, num_nodes) are redrawn, which keeps the
    # exact node count without bending the distribution. At least a quarter of draws are kept.
    while src.shape[0] < num_edges:
        todo = num_edges - src.shape[0]
        s = np.zeros(todo, dtype=np.int64)
        d = np.zeros(todo, dtype=np.int64)
        for bit in range(bits):
            u = rng.random(todo, dtype=np.float32)
            s |= (u >= a + b).astype(np.int64) << bit
            d |= (((u >= a) & (u < a + b)) | (u >= a + b + c)).astype(np.int64) << bit
        ok = (s < num_nodes) & (d < num_nodes)
        src = np.concatenate([src, s[ok]])
        dst = np.concatenate([dst, d[ok]])
    return src, dst


def synthetic(kind, num_nodes, avg_degree, num_features, num_classes, seed=0,
              num_relations=None):
    """A generated node-classification Dataset, the same for the same arguments and seed.

    kind "sbm": stochastic block model, one block per class, about 80% of edges inside a block,
    undirected (both directions stored, self-loops removed, rare duplicates kept); features are the
    class mean plus Gaussian noise, too noisy for a per-node classifier, clean after averaging
    over neighbours. kind "rmat": directed R-MAT power-law graph with random features and labels,
    for speed measurements. Both split 20 per class train, 30 per class val, the rest test.
    `num_relations` R gives every edge a relation id drawn uniformly from [0, R) (a typed
    graph, for R-GCN); the graph and features are the same as without it.
    """
    if kind not in KINDS:
        raise ValueError(f"unknown synthetic kind {kind!r}; kinds are {', '.join(KINDS)}")
    _check_int("num_nodes", num_nodes, 1)
    _check_int("num_features", num_features, 1)
    _check_int("num_classes", num_classes, 1)
    if not isinstance(avg_degree, numbers.Real) or isinstance(avg_degree, bool) or avg_degree < 0:
        raise ValueError(f"avg_degree must be a number >= 0, got {avg_degree!r}")
    rng = np.random.default_rng(seed)
    num_edges = int(round(num_nodes * avg_degree))

    if kind == "sbm":
        labels = rng.permutation(np.arange(num_nodes, dtype=np.int64) % num_classes)
        # Each undirected draw becomes two directed edges, so draw half the requested count.
        src, dst = _sbm_edges(labels, num_classes, num_edges // 2, rng)
        # Class means have norm about 2 and the noise is unit per dimension, so a single node's
        # features say little about its class while the mean over ~avg_degree neighbours does.
        means = rng.standard_normal((num_classes, num_features), dtype=np.float32)
        means /= np.float32(np.sqrt(num_features) / 2)
        features = rng.standard_normal((num_nodes, num_features), dtype=np.float32)
        features += means[labels]
    else:
        src, dst = _rmat_edges(num_nodes, num_edges, rng)
        labels = rng.integers(0, num_classes, size=num_nodes)
        features = rng.standard_normal((num_nodes, num_features), dtype=np.float32)

    train, val, test = _split(labels, num_classes, rng)
    data = make_dataset(f"synthetic-{kind}", src, dst, features, labels, train, val, test,
                        where=f"synthetic({kind!r})", num_classes=num_classes)
    if num_relations is None:
        return data
    _check_int("num_relations", num_relations, 1)
    types = rng.integers(0, num_relations, size=data.num_edges)
    graph = Graph.from_edges(data.graph.src, data.graph.dst, num_nodes=num_nodes,
                             edge_type=types, num_relations=num_relations)
    return dataclasses.replace(data, graph=graph)
