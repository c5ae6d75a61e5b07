"""Graph-classification datasets: many small graphs, one label each.

A GraphDataset keeps all its graphs in flat arrays (edges in per-graph vertex ids,
concatenated; node features concatenated; offsets into both), so cutting a batch out of it
is a few NumPy gathers, not a Python loop over graphs.
"""
import numpy as np

from ngnn.batch import BatchedGraph
from ngnn.graph import Graph


class GraphDataset:
    """`graphs` (list of Graph), `labels` (G,) int64 in [0, num_classes), node `features`
    (one float32 (n_k, F) array per graph, or one (N, F) array of every graph's rows in
    order), `name`. `folds` optionally fixes the cross-validation splits: a list of
    (train indices, test indices)."""

    def __init__(self, name, graphs, labels, features, num_classes=None, folds=None,
                 where=None):
        where = where or name
        graphs = list(graphs)
        if not graphs:
            raise ValueError(f"{where}: a graph dataset needs at least one graph")
        for i, g in enumerate(graphs):
            if not isinstance(g, Graph) or g.is_block or g.varies:
                raise ValueError(f"{where}: graphs[{i}] is {g!r}, not a whole ng.Graph")
        labels = np.asarray(labels)
        if labels.shape != (len(graphs),):
            raise ValueError(f"{where}: {labels.shape[0] if labels.ndim else 0} labels for "
                             f"{len(graphs)} graphs (labels must have shape ({len(graphs)},))")
        if labels.dtype.kind not in "iu":
            raise ValueError(f"{where}: labels must be integer class ids, got dtype "
                             f"{labels.dtype}")
        labels = labels.astype(np.int64)
        if num_classes is None:
            num_classes = int(labels.max()) + 1
        bad = np.flatnonzero((labels < 0) | (labels >= num_classes))
        if bad.size:
            raise ValueError(f"{where}: label {labels[bad[0]]} of graph {bad[0]} is out of "
                             f"range [0, {num_classes}) ({bad.size} label(s) out of range)")
        sizes = np.array([g.num_nodes for g in graphs], dtype=np.int64)
        if isinstance(features, (list, tuple)):
            if len(features) != len(graphs):
                raise ValueError(f"{where}: {len(features)} feature arrays for "
                                 f"{len(graphs)} graphs (one per graph)")
            features = np.concatenate([np.asarray(f, dtype=np.float32).reshape(n, -1)
                                       for f, n in zip(features, sizes)])
        features = np.asarray(features, dtype=np.float32)
        if features.ndim != 2 or features.shape[0] != sizes.sum():
            raise ValueError(f"{where}: features must have one row per node of every graph "
                             f"({int(sizes.sum())} rows), got shape {features.shape}")
        if not np.all(np.isfinite(features)):
            raise ValueError(f"{where}: features contain NaN or Inf")
        self.name = name
        self.graphs = graphs
        self.labels = labels
        self.features = features
        self.num_classes = int(num_classes)
        self.node_offsets = np.concatenate([[0], np.cumsum(sizes)])
        edge_counts = np.array([g.num_edges for g in graphs], dtype=np.int64)
        self.edge_offsets = np.concatenate([[0], np.cumsum(edge_counts)])
        self.src = np.concatenate([g.src for g in graphs])     # per-graph vertex ids
        self.dst = np.concatenate([g.dst for g in graphs])
        self.folds = folds

    def __len__(self):
        return len(self.graphs)

    @property
    def num_features(self):
        return int(self.features.shape[1])

    @property
    def num_graphs(self):
        return len(self.graphs)

    @property
    def graph_sizes(self):
        return np.diff(self.node_offsets)

    @property
    def edge_counts(self):
        return np.diff(self.edge_offsets)

    def summary(self):
        return (f"{self.name}: {self.num_graphs} graphs, {int(self.node_offsets[-1])} nodes, "
                f"{int(self.edge_offsets[-1])} edges, {self.num_features} features, "
                f"{self.num_classes} classes")

    def batch(self, indices):
        """(BatchedGraph of the graphs `indices` in that order, their node feature rows)."""
        indices = np.asarray(indices, dtype=np.int64)
        nodes, edges = _ranges(self.node_offsets, indices), _ranges(self.edge_offsets, indices)
        sizes = self.graph_sizes[indices]
        node_offsets = np.concatenate([[0], np.cumsum(sizes)])
        edge_offsets = np.concatenate([[0], np.cumsum(self.edge_counts[indices])])
        shift = np.repeat(node_offsets[:-1], self.edge_counts[indices])
        batch = BatchedGraph.from_arrays(self.src[edges] + shift, self.dst[edges] + shift,
                                         node_offsets, edge_offsets)
        return batch, self.features[nodes]

    def cross_validation(self, folds=10, seed=0):
        """[(train indices, test indices)] for `folds`-fold cross-validation: the dataset's
        published splits when it has them (DGCNN's 10 folds of PROTEINS, NCI1, IMDB-BINARY,
        ENZYMES), else a stratified split drawn with `seed`: each class's graphs are
        permuted and dealt to the folds in turn."""
        if self.folds is not None and folds == len(self.folds):
            return self.folds
        if folds < 2 or folds > self.num_graphs:
            raise ValueError(f"folds must be in [2, {self.num_graphs}] for {self.name}, "
                             f"got {folds}")
        rng = np.random.default_rng(seed)
        fold_of = np.empty(self.num_graphs, dtype=np.int64)
        dealt = 0
        for c in range(self.num_classes):
            members = rng.permutation(np.flatnonzero(self.labels == c))
            fold_of[members] = (dealt + np.arange(members.size)) % folds
            dealt += members.size
        everything = np.arange(self.num_graphs)
        return [(everything[fold_of != k], everything[fold_of == k]) for k in range(folds)]


def _ranges(offsets, indices):
    """Concatenated ranges offsets[i]:offsets[i + 1] for i in indices, vectorized."""
    starts, counts = offsets[indices], offsets[indices + 1] - offsets[indices]
    if counts.sum() == 0:
        return np.zeros(0, dtype=np.int64)
    positions = np.repeat(starts - np.concatenate([[0], np.cumsum(counts)[:-1]]), counts)
    return positions + np.arange(positions.shape[0], dtype=np.int64)


def one_hot(values):
    """One-hot rows of integer `values`, columns min .. max (as PyTorch Geometric's
    TUDataset encodes node labels)."""
    values = np.asarray(values, dtype=np.int64)
    if values.size == 0:
        return np.zeros((0, 1), dtype=np.float32)
    low = values.min()
    out = np.zeros((values.size, int(values.max() - low) + 1), dtype=np.float32)
    out[np.arange(values.size), values - low] = 1.0
    return out
