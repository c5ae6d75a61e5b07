"""Graphs and datasets from PyTorch Geometric and DGL, checked with small fakes that have
the same attributes, and with the real libraries where they are installed."""
import functools
import importlib.util
import subprocess
import sys
import types

import numpy as np
import pytest

import ngnn as ng
from ngnn import datasets, nn, optim
from ngnn.train import Trainer


class FakeTensor:
    """What ngnn may use of a torch tensor: detach(), cpu() and numpy()."""

    def __init__(self, array):
        self.array = np.asarray(array)
        self.calls = []

    def detach(self):
        self.calls.append("detach")
        return self

    def cpu(self):
        self.calls.append("cpu")
        return self

    def numpy(self):
        return self.array


class ArrayLike:
    """Only NumPy's __array__ protocol."""

    def __init__(self, array):
        self.array = np.asarray(array)

    def __array__(self, dtype=None, copy=None):
        return self.array if dtype is None else self.array.astype(dtype)


class FakeDGLGraph:
    """A homogeneous DGL graph as ngnn reads it: edges(order=...), num_nodes(), ndata."""

    is_homogeneous = True

    def __init__(self, src, dst, num_nodes, **ndata):
        self.src, self.dst, self.n = src, dst, num_nodes
        self.ndata = {key: FakeTensor(value) for key, value in ndata.items()}

    def edges(self, order="eid"):
        assert order == "eid"
        return FakeTensor(self.src), FakeTensor(self.dst)

    def num_nodes(self):
        return self.n


def fake_pyg(x, edge_index, y, train_mask, val_mask, test_mask):
    return types.SimpleNamespace(x=FakeTensor(x), edge_index=FakeTensor(edge_index),
                                 y=FakeTensor(y), train_mask=FakeTensor(train_mask),
                                 val_mask=FakeTensor(val_mask),
                                 test_mask=FakeTensor(test_mask))


def real_pyg(x, edge_index, y, train_mask, val_mask, test_mask):
    import torch
    from torch_geometric.data import Data
    return Data(x=torch.from_numpy(np.ascontiguousarray(x)),
                edge_index=torch.from_numpy(np.ascontiguousarray(edge_index)),
                y=torch.from_numpy(y), train_mask=torch.from_numpy(train_mask),
                val_mask=torch.from_numpy(val_mask), test_mask=torch.from_numpy(test_mask))


# The real library joins the fakes where it is installed; the fakes always run.
PYG_MAKERS = [fake_pyg] + ([real_pyg] if importlib.util.find_spec("torch_geometric") else [])


def dense(features):
    return features.toarray() if hasattr(features, "toarray") else np.asarray(features)


def cora_arrays():
    cora = datasets.load("cora")
    g = cora.graph
    return cora, (dense(cora.features), np.stack([g.src, g.dst]), cora.labels,
                  cora.train_mask, cora.val_mask, cora.test_mask)


def train(data, epochs=15):
    model = nn.GCN(data.num_features, 16, data.num_classes, seed=0)
    trainer = Trainer(model, data, optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4),
                      seed=0)
    try:
        history = trainer.fit(epochs, progress=False)
        return [(r["loss"], r["val_acc"]) for r in history], trainer.evaluate()
    finally:
        trainer.transformer.close()


@functools.lru_cache(maxsize=None)
def embedded_cora_result():
    return train(datasets.load("cora"))


@pytest.mark.parametrize("make", PYG_MAKERS, ids=lambda make: make.__name__)
def test_pyg_shaped_cora_trains_like_embedded_cora(make):
    cora, arrays = cora_arrays()
    converted = datasets.from_pyg(make(*arrays), name="cora")
    assert converted.summary() == cora.summary()
    np.testing.assert_array_equal(converted.graph.src, cora.graph.src)
    np.testing.assert_array_equal(converted.graph.dst, cora.graph.dst)
    history, accuracy = train(converted)
    assert (history, accuracy) == embedded_cora_result()     # identical, epoch by epoch
    assert accuracy["test"] > 0.5


def test_from_edge_index_takes_numpy_tensors_and_array_likes():
    index = np.array([[0, 1, 2, 2], [1, 2, 0, 3]])
    for value in (index, FakeTensor(index), ArrayLike(index), index.tolist()):
        g = ng.Graph.from_edge_index(value)
        np.testing.assert_array_equal(g.src, [0, 1, 2, 2])
        np.testing.assert_array_equal(g.dst, [1, 2, 0, 3])
        assert g.num_nodes == 4
    assert ng.Graph.from_edge_index(index, num_nodes=10).num_nodes == 10
    tensor = FakeTensor(index)
    ng.Graph.from_edge_index(tensor)
    assert tensor.calls == ["detach", "cpu"]
    assert ng.Graph.from_edge_index(np.zeros((2, 0), dtype=np.int64)).num_edges == 0


@pytest.mark.parametrize("value, message", [
    (np.zeros((3, 4), dtype=np.int64), r"shape \(2, E\), got \(3, 4\)"),
    (np.zeros((5, 2), dtype=np.int64), "transpose it"),
    (np.zeros(4, dtype=np.int64), r"shape \(2, E\), got \(4,\)"),
    (np.array([[0.5, 1.0], [1.0, 0.0]]), "not a whole number"),
    (np.array([[True, False], [False, True]]), "got booleans"),
    (np.array([[0, 1], [1, 7]]), r"out of range \[0, 3\)"),
    (np.array([[0, -1], [1, 0]]), "out of range"),
    (None, "edge_index is missing"),
    (object(), "must be an array"),
])
def test_from_edge_index_rejects_bad_input(value, message):
    with pytest.raises(ValueError, match=message):
        ng.Graph.from_edge_index(value, num_nodes=3 if message.startswith("out") else None)


def small_arrays(n=5):
    x = np.arange(n * 3, dtype=np.float32).reshape(n, 3)
    edge_index = np.array([[0, 1, 2, 3, 4], [1, 2, 3, 4, 0]])
    y = np.array([0, 1, 0, 1, 2])
    train_mask = np.array([1, 1, 0, 0, 0], dtype=np.uint8)    # 0/1 masks, as older data
    val_mask = np.array([False, False, True, False, False])
    test_mask = np.array([False, False, False, True, True])
    return x, edge_index, y, train_mask, val_mask, test_mask


def test_from_pyg_reads_masks_labels_and_keeps_edge_order():
    x, edge_index, y, *masks = small_arrays()
    data = datasets.from_pyg(fake_pyg(x, edge_index, y.reshape(-1, 1), *masks), name="tiny")
    assert data.name == "tiny" and data.num_classes == 3
    np.testing.assert_array_equal(data.graph.src, edge_index[0])
    np.testing.assert_array_equal(data.labels, y)
    assert data.train_mask.dtype == bool and data.train_mask.tolist() == [1, 1, 0, 0, 0]
    assert datasets.from_pyg(fake_pyg(x, edge_index, y, *masks), num_classes=5).num_classes == 5


def broken(key, value):
    arrays = dict(zip(("x", "edge_index", "y", "train_mask", "val_mask", "test_mask"),
                      small_arrays()))
    arrays[key] = value
    data = fake_pyg(*arrays.values())
    if value is None:
        setattr(data, key, None)
    return data


@pytest.mark.parametrize("key, value, message", [
    ("x", None, "the data has no 'x'"),
    ("test_mask", None, "the data has no 'test_mask'"),
    ("edge_index", np.array([[0, 1], [1, 9]]), r"invalid edges: .*out of range \[0, 5\)"),
    ("edge_index", np.zeros((4, 2), dtype=np.int64), "transpose it"),
    ("y", np.array([0, 1, 0]), "labels 'y' have shape"),
    ("y", np.array([0.0, 1, 0, 1, 2]), "labels 'y' must be integers"),
    ("y", np.array([0, 1, -1, 1, 2]), "out of range"),
    ("x", np.array([[np.nan]] * 5), "NaN or Inf"),
    ("train_mask", np.array([0, 2, 0, 0, 0]), "'train_mask' must be boolean"),
    ("val_mask", np.zeros((5, 20), dtype=bool), r"several splits; pick one column"),
])
def test_from_pyg_rejects_bad_data(key, value, message):
    with pytest.raises(ValueError, match=message):
        datasets.from_pyg(broken(key, value))


def test_from_dgl_graph_and_dataset():
    x, edge_index, y, *masks = small_arrays()
    g = FakeDGLGraph(edge_index[0], edge_index[1], 6, feat=np.vstack([x, x[:1]]),
                     label=np.append(y, 0), train_mask=np.append(masks[0], 0),
                     val_mask=np.append(masks[1], False), test_mask=np.append(masks[2], False))
    graph = ng.Graph.from_dgl(g)
    assert graph.num_nodes == 6 and graph.num_edges == 5     # node 5 is isolated
    np.testing.assert_array_equal(graph.dst, edge_index[1])
    data = datasets.from_dgl(g, name="tiny")
    assert data.num_nodes == 6 and data.num_features == 3 and data.num_classes == 3
    np.testing.assert_array_equal(data.graph.src, edge_index[0])


def test_from_dgl_rejects_bad_graphs():
    x, edge_index, y, *masks = small_arrays()
    ndata = dict(feat=x, label=y, train_mask=masks[0], val_mask=masks[1], test_mask=masks[2])
    with pytest.raises(ValueError, match=r"no 'label'"):
        datasets.from_dgl(FakeDGLGraph(edge_index[0], edge_index[1], 5,
                                       **{k: v for k, v in ndata.items() if k != "label"}))
    with pytest.raises(ValueError, match="has 5 rows but the graph has 7 nodes"):
        datasets.from_dgl(FakeDGLGraph(edge_index[0], edge_index[1], 7, **ndata))
    hetero = FakeDGLGraph(edge_index[0], edge_index[1], 5, **ndata)
    hetero.is_homogeneous = False
    with pytest.raises(ValueError, match="dgl.to_homogeneous"):
        ng.Graph.from_dgl(hetero)
    with pytest.raises(ValueError, match=r"needs a DGL graph \(with .edges\(\)\)"):
        ng.Graph.from_dgl(object())
    with pytest.raises(ValueError, match="expected a DGL graph with .ndata"):
        datasets.from_dgl(object())


def test_import_ngnn_imports_no_optional_library():
    code = ("import sys, ngnn, ngnn.datasets, ngnn.cli, ngnn.train, ngnn.transformers; "
            "print(sorted(m for m in ('torch', 'torch_geometric', 'dgl', 'matplotlib', "
            "'graphviz', 'mkdocs') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"
