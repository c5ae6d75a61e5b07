"""TU Dortmund graph-classification datasets: the text format, the embedded copies, and
synthetic graph sets for tests.

A TU folder NAME/ holds NAME_A.txt ("i, j" per line: an edge between 1-based global node
ids), NAME_graph_indicator.txt (line i: the 1-based graph of node i, graphs in order),
NAME_graph_labels.txt (one label per graph), and optionally NAME_node_labels.txt,
NAME_edge_labels.txt, NAME_node_attributes.txt. Node features are the one-hot node
labels, or, where a dataset has none (IMDB-BINARY), the one-hot degree: the inputs of the
GIN paper and of PyTorch Geometric's TUDataset. Graph labels are mapped to 0 .. C-1 in
sorted order (-1/1 becomes 0/1, 1/2 becomes 0/1).
"""
import os

import numpy as np

from ngnn.datasets.embedded import DATA_DIR, _read_arrays
from ngnn.datasets.graph_dataset import GraphDataset, one_hot
from ngnn.graph import Graph

TU_DIR = os.path.join(DATA_DIR, "tu")
# Embedded name -> the TU name, used in the splits file's keys.
EMBEDDED = {"mutag": "MUTAG", "proteins": "PROTEINS", "enzymes": "ENZYMES", "nci1": "NCI1",
            "imdb_binary": "IMDB-BINARY", "ptc_mr": "PTC_MR"}
SPLITS = os.path.join(TU_DIR, "tu_10fold_splits.npz")


def graph_names():
    """Names of the embedded graph-classification datasets."""
    return sorted(EMBEDDED)


def load_graphs(name):
    """An embedded TU dataset by name ("mutag", "proteins", ...), with DGCNN's 10 folds
    where they exist."""
    key = name.lower().replace("-", "_")
    if key not in EMBEDDED:
        raise ValueError(f"unknown graph dataset {name!r}; embedded ones are "
                         f"{', '.join(graph_names())}")
    path = os.path.join(TU_DIR, key + ".npz")
    arrays = _read_arrays(path)
    data = from_tu_arrays(key, arrays["edge_index"], arrays["graph_indicator"],
                          arrays["graph_labels"], arrays.get("node_labels"), where=path,
                          first_id=0)
    data.folds = _published_folds(EMBEDDED[key], data.num_graphs)
    return data


def _published_folds(tu_name, num_graphs):
    splits = _read_arrays(SPLITS)
    if f"{tu_name}_fold1_train" not in splits:
        return None
    return [(splits[f"{tu_name}_fold{k}_train"], splits[f"{tu_name}_fold{k}_test"])
            for k in range(1, 11)]


def load_tu(folder):
    """A GraphDataset from a folder in the TU Dortmund text format (or an embedded name).
    Malformed files raise ValueError naming the file and line."""
    text = os.fspath(folder)
    if not os.path.isdir(text):
        if text.lower().replace("-", "_") in EMBEDDED:
            return load_graphs(text)
        raise FileNotFoundError(f"load_tu: no folder {text} (and no embedded TU dataset of "
                                f"that name: {', '.join(graph_names())})")
    name = os.path.basename(os.path.normpath(text))

    def path(suffix):
        return os.path.join(text, f"{name}_{suffix}.txt")

    for required in ("A", "graph_indicator", "graph_labels"):
        if not os.path.isfile(path(required)):
            raise FileNotFoundError(f"load_tu: {path(required)} is missing (a TU folder "
                                    f"NAME/ needs NAME_A.txt, NAME_graph_indicator.txt and "
                                    f"NAME_graph_labels.txt)")
    indicator = _read_ints(path("graph_indicator"), 1)[:, 0]
    pairs = _read_ints(path("A"), 2)
    n = indicator.shape[0]
    bad = np.flatnonzero((pairs < 1) | (pairs > n))
    if bad.size:
        line, column = divmod(int(bad[0]), 2)
        raise ValueError(f"{path('A')}, line {line + 1}: node id {pairs[line, column]} is out "
                         f"of range [1, {n}] ({n} nodes in {path('graph_indicator')})")
    labels = _read_ints(path("graph_labels"), 1)[:, 0]
    node_labels = None
    if os.path.isfile(path("node_labels")):
        node_labels = _read_ints(path("node_labels"), None)[:, 0]
        if node_labels.shape[0] != n:
            raise ValueError(f"{path('node_labels')}: {node_labels.shape[0]} lines for {n} "
                             f"nodes (one label per line of {path('graph_indicator')})")
    return from_tu_arrays(name, pairs.T - 1, indicator, labels, node_labels, where=text,
                          files={"A": path("A"), "graph_indicator": path("graph_indicator"),
                                 "graph_labels": path("graph_labels")})


def _read_ints(path, columns):
    """The integers of a comma-separated text file as an (lines, columns) int64 array;
    `columns` None accepts any count (node label files may carry several)."""
    with open(path) as f:
        lines = [line for line in (raw.strip() for raw in f) if line]
    rows = []
    for number, line in enumerate(lines, 1):
        try:
            row = [int(part) for part in line.replace(",", " ").split()]
        except ValueError:
            raise ValueError(f"{path}, line {number}: expected integers, got {line!r}") from None
        if columns is not None and len(row) != columns:
            raise ValueError(f"{path}, line {number}: expected {columns} integer(s), got "
                             f"{line!r}")
        rows.append(row)
    if not rows:
        raise ValueError(f"{path} is empty")
    width = len(rows[0])
    if any(len(r) != width for r in rows):
        raise ValueError(f"{path}: lines hold different numbers of values")
    return np.array(rows, dtype=np.int64)


def from_tu_arrays(name, edge_index, graph_indicator, graph_labels, node_labels=None,
                   where=None, files=None, first_id=1):
    """A GraphDataset from TU arrays: edge_index (2, E) global 0-based node ids,
    graph_indicator (N,) graph ids from `first_id` (1 in the text files, 0 in the embedded
    .npz files; non-decreasing, no gap), graph_labels (G,)
    any integers, node_labels (N,) or None. Duplicate edges are dropped (IMDB-BINARY lists
    every one twice). `files` names the file each array came from, for errors."""
    where = where or name
    files = files or {}
    indicator = np.asarray(graph_indicator, dtype=np.int64)
    at = files.get("graph_indicator", f"{where} (graph_indicator)")
    if indicator.size == 0:
        raise ValueError(f"{at}: no nodes")
    if indicator[0] != first_id:
        raise ValueError(f"{at}, line 1: graph ids must start at {first_id}, got "
                         f"{indicator[0]}")
    step = np.diff(indicator)
    back = np.flatnonzero(step < 0)
    if back.size:
        raise ValueError(f"{at}, line {back[0] + 2}: graph id {indicator[back[0] + 1]} after "
                         f"{indicator[back[0]]}; the nodes of each graph must be listed "
                         "together, graphs in increasing order")
    gap = np.flatnonzero(step > 1)
    if gap.size:
        i = gap[0]
        raise ValueError(f"{at}, line {i + 2}: graph id jumps from {indicator[i]} to "
                         f"{indicator[i + 1]}: graph(s) {indicator[i] + 1}..."
                         f"{indicator[i + 1] - 1} have no nodes (a graph id gap)")
    num_graphs = int(indicator[-1] - first_id + 1)
    labels = np.asarray(graph_labels, dtype=np.int64)
    at = files.get("graph_labels", f"{where} (graph_labels)")
    if labels.shape[0] != num_graphs:
        raise ValueError(f"{at}: {labels.shape[0]} labels for {num_graphs} graphs")
    edge_index = np.asarray(edge_index, dtype=np.int64)
    n = indicator.shape[0]
    at = files.get("A", f"{where} (edge_index)")
    bad = np.flatnonzero((edge_index < 0).any(axis=0) | (edge_index >= n).any(axis=0))
    if bad.size:
        raise ValueError(f"{at}, edge {bad[0] + 1}: node id out of range [0, {n})")
    graph_of = indicator - first_id
    crossing = np.flatnonzero(graph_of[edge_index[0]] != graph_of[edge_index[1]])
    if crossing.size:
        i = crossing[0]
        raise ValueError(f"{at}, line {i + 1}: edge {edge_index[0, i] + 1}, "
                         f"{edge_index[1, i] + 1} joins graphs {indicator[edge_index[0, i]]} "
                         f"and {indicator[edge_index[1, i]]}")
    keys = np.unique(edge_index[0] * n + edge_index[1], return_index=True)[1]
    edge_index = edge_index[:, np.sort(keys)]          # first copy of each, in file order
    classes, mapped = np.unique(labels, return_inverse=True)
    sizes = np.bincount(graph_of, minlength=num_graphs)
    node_offsets = np.concatenate([[0], np.cumsum(sizes)])
    order = np.argsort(graph_of[edge_index[0]], kind="stable")
    src, dst = edge_index[0][order], edge_index[1][order]
    edge_counts = np.bincount(graph_of[src], minlength=num_graphs)
    edge_offsets = np.concatenate([[0], np.cumsum(edge_counts)])
    first = node_offsets[graph_of[src]]
    graphs = [Graph(src[a:b] - first[a:b], dst[a:b] - first[a:b], int(sizes[k]))
              for k, (a, b) in enumerate(zip(edge_offsets[:-1], edge_offsets[1:]))]
    if node_labels is not None:
        features = one_hot(node_labels)
    else:       # no node labels: one-hot out-degree (as PyG's OneHotDegree)
        degree = np.bincount(src, minlength=n)
        features = np.zeros((n, int(degree.max()) + 1), dtype=np.float32)
        features[np.arange(n), degree] = 1.0
    return GraphDataset(name, graphs, mapped.astype(np.int64), features,
                        num_classes=len(classes), where=where)


def synthetic_graphs(num_graphs=64, min_nodes=4, max_nodes=16, num_features=8,
                     num_classes=2, edge_prob=0.3, seed=0):
    """Random undirected graphs whose class sets their density (class c: edge probability
    edge_prob * (1 + c) / num_classes) and shifts their features, for tests: learnable from
    a sum or mean readout, small enough for any backend."""
    rng = np.random.default_rng(seed)
    graphs, labels, features = [], [], []
    for _ in range(num_graphs):
        c = int(rng.integers(num_classes))
        n = int(rng.integers(min_nodes, max_nodes + 1))
        upper = np.triu(rng.random((n, n)) < edge_prob * (1 + c) / num_classes, k=1)
        src, dst = np.nonzero(upper | upper.T)
        graphs.append(Graph(src, dst, n))
        labels.append(c)
        features.append(rng.normal(0.5 * c, 1.0, (n, num_features)))
    return GraphDataset("synthetic_graphs", graphs, np.array(labels), features,
                        num_classes=num_classes)
