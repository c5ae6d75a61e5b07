"""The ``Dataset`` record and checks shared by every way of making one."""

import dataclasses

import numpy as np
import scipy.sparse

from ngnn.graph import Graph


@dataclasses.dataclass(frozen=True)
class Dataset:
    """A node-classification task: a graph, node features, labels and a train/val/test split."""

    name: str
    graph: Graph
    features: object          # float32 (N, F): a scipy.sparse CSR matrix when mostly zeros
    labels: np.ndarray        # int64 (N,), values in [0, num_classes)
    train_mask: np.ndarray    # bool (N,)
    val_mask: np.ndarray      # bool (N,)
    test_mask: np.ndarray     # bool (N,)
    num_classes: int

    @property
    def feature_density(self):
        """The share of feature entries that are not zero."""
        n, f = self.features.shape
        stored = self.features.nnz if scipy.sparse.issparse(self.features) else \
            np.count_nonzero(self.features)
        return stored / max(n * f, 1)

    def dense_features(self):
        """The features as a dense float32 array."""
        if scipy.sparse.issparse(self.features):
            return self.features.toarray()
        return self.features

    @property
    def num_features(self):
        return int(self.features.shape[1])

    @property
    def num_nodes(self):
        return self.graph.num_nodes

    @property
    def num_edges(self):
        return self.graph.num_edges

    def summary(self):
        return (f"{self.name}: {self.num_nodes} nodes, {self.num_edges} edges, "
                f"{self.num_features} features, {self.num_classes} classes, "
                f"train/val/test {int(self.train_mask.sum())}/{int(self.val_mask.sum())}"
                f"/{int(self.test_mask.sum())}")


def make_dataset(name, src, dst, x, y, train_mask, val_mask, test_mask, where, num_classes=None):
    """Validates raw arrays and builds a Dataset; ``where`` names the source in error messages."""
    sparse_input = scipy.sparse.issparse(x)
    x = scipy.sparse.csr_matrix(x) if sparse_input else np.asarray(x)
    y = np.asarray(y)
    if x.ndim != 2:
        raise ValueError(f"{where}: features 'x' must be 2-D (nodes, features), got shape {x.shape}")
    num_nodes = x.shape[0]
    if y.shape != (num_nodes,):
        raise ValueError(
            f"{where}: labels 'y' have shape {y.shape} but 'x' has {num_nodes} rows")
    if x.dtype.kind not in "fiub":
        raise ValueError(f"{where}: features 'x' must be numeric, got dtype {x.dtype}")
    if sparse_input:
        features = x.astype(np.float32)
        features.sum_duplicates()
        features.eliminate_zeros()
        bad = np.count_nonzero(~np.isfinite(features.data))
    else:
        features = np.ascontiguousarray(x, dtype=np.float32)
        bad = np.count_nonzero(~np.isfinite(features))
    if bad:
        raise ValueError(f"{where}: features 'x' contain {bad} NaN or Inf value(s)")
    if y.dtype.kind not in "iu":
        raise ValueError(f"{where}: labels 'y' must be integers, got dtype {y.dtype}")
    labels = y.astype(np.int64)
    if num_classes is None:
        num_classes = int(labels.max()) + 1 if labels.size else 0
    out_of_range = np.flatnonzero((labels < 0) | (labels >= num_classes))
    if out_of_range.size:
        i = out_of_range[0]
        raise ValueError(f"{where}: label y[{i}] = {labels[i]} is out of range [0, {num_classes})")
    masks = []
    for key, mask in (("train_mask", train_mask), ("val_mask", val_mask), ("test_mask", test_mask)):
        mask = np.asarray(mask)
        if mask.dtype != np.bool_:
            raise ValueError(f"{where}: '{key}' must be boolean, got dtype {mask.dtype}")
        if mask.shape != (num_nodes,):
            raise ValueError(
                f"{where}: '{key}' has shape {mask.shape} but 'x' has {num_nodes} rows")
        masks.append(mask)
    try:
        graph = Graph.from_edges(src, dst, num_nodes=num_nodes)
    except ValueError as err:
        raise ValueError(f"{where}: invalid edges: {err}") from err
    return Dataset(name, graph, compact(features), labels, *masks, num_classes=num_classes)


def compact(features):
    """Features that are mostly zeros as a CSR matrix, others as a dense array: bag-of-words
    features (all the embedded datasets) take a few percent of their dense size."""
    n, f = features.shape
    if scipy.sparse.issparse(features):
        stored = features.nnz
    else:
        stored = np.count_nonzero(features)
    if stored * 2 < n * f:
        return scipy.sparse.csr_matrix(features, dtype=np.float32)
    return features.toarray() if scipy.sparse.issparse(features) else features
