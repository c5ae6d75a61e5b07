"""Every ngnn layer against its PyTorch Geometric counterpart (tests/pyg_cases.py) on identical
weights: the output, and the gradients of a weighted sum of it with respect to the input
features, the edge features and every weight, on each backend.

Graphs: Cora (float32, to 1e-4, with 32 input features: Cora's bag of words times a fixed
random projection, so every row is dense and nonzero), and in float64 (to 1e-9) a random
multigraph with self loops, duplicate edges and vertices without in-edges, a star whose hub
has every other vertex as in- and out-neighbour, and a graph without edges. Tolerances are
relative to the largest magnitude of the reference array, so an entry near 0 is held to the
same absolute error as the array's large entries.
"""
import functools

import numpy as np
import pytest
import torch

import ngnn as ng
from ngnn import datasets
from pyg_cases import CASES, attribute

TOLERANCE = {np.float32: 1e-4, np.float64: 1e-9}
IN_FEATS = {"cora": 32, "multigraph": 5, "star": 5, "empty": 5}


@functools.lru_cache(maxsize=None)
def edges(name):
    """(src, dst, num_nodes, dtype) of a test graph."""
    if name == "cora":
        g = datasets.load("cora").graph
        return g.src, g.dst, g.num_nodes, np.float32
    if name == "multigraph":
        rng = np.random.default_rng(0)
        n, e = 12, 40
        src, dst = rng.integers(0, n - 2, e), rng.integers(2, n - 2, e)
        src[:3] = dst[:3]                               # self loops
        src[3:6], dst[3:6] = src[6], dst[6]             # an edge three times more
        return src, dst, n, np.float64                  # 0, 1: no in-edges; 10, 11: isolated
    if name == "star":
        leaves = np.arange(1, 16)
        return (np.concatenate([leaves, np.zeros(15, np.int64)]),
                np.concatenate([np.zeros(15, np.int64), leaves]), 16, np.float64)
    assert name == "empty"
    return np.zeros(0, np.int64), np.zeros(0, np.int64), 5, np.float64


@functools.lru_cache(maxsize=None)
def node_features(name):
    src, dst, n, dtype = edges(name)
    rng = np.random.default_rng(1)
    if name == "cora":
        bag = datasets.load("cora").features
        x = bag @ rng.standard_normal((bag.shape[1], IN_FEATS[name])) / 4
    else:
        x = rng.standard_normal((n, IN_FEATS[name]))
    return np.ascontiguousarray(x, dtype=dtype)


def graph_for(case, name):
    src, dst, n, _ = edges(name)
    if case.symmetric and name == "multigraph":     # the others are symmetric already
        src, dst = np.concatenate([src, dst]), np.concatenate([dst, src])
    return src, dst, n


def copy_weights(module, case, values):
    with torch.no_grad():
        for (path, transposed), value in zip(case.pairs, values):
            target = attribute(module, path)
            value = value.T if transposed else value
            target.copy_(torch.from_numpy(np.ascontiguousarray(value)).reshape(target.shape))


def pyg_gradients(module, case, shapes):
    grads = []
    for (path, transposed), shape in zip(case.pairs, shapes):
        grad = attribute(module, path).grad.numpy()
        grads.append((grad.T if transposed else grad).reshape(shape))
    return grads


def assert_close(got, want, tolerance, what):
    scale = max(float(np.abs(want).max(initial=0.0)), 1.0)
    np.testing.assert_allclose(got, want, rtol=tolerance, atol=tolerance * scale, err_msg=what)


@pytest.mark.parametrize("graph_name", list(IN_FEATS))
@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_layer_equals_pyg(transformer_factory, case, graph_name):
    src, dst, n = graph_for(case, graph_name)
    dtype = edges(graph_name)[3]
    x = node_features(graph_name)
    rng = np.random.default_rng(2)
    e = None if case.edge_dim is None else rng.standard_normal((len(src), case.edge_dim))
    e = None if e is None else e.astype(dtype)

    # ngnn: output and gradients of a weighted sum, with weights moved off their initial
    # values (zero biases would hide a bias in the wrong place)
    g = ng.Graph.from_edges(src, dst, num_nodes=n)
    layer = case.ngnn(x.shape[1], dtype)
    h = ng.placeholder(x.shape, dtype=dtype, name="h")
    placeholders, feeds = [h], [x]
    ef = None
    if e is not None:
        ef = ng.placeholder(e.shape, dtype=dtype, name="e")
        placeholders.append(ef)
        feeds.append(e)
    out = case.run_ngnn(layer, g, h, ef)
    weights = rng.standard_normal(out.shape).astype(dtype)
    loss = ng.sum(out * ng.constant(weights, dtype=dtype))
    params = layer.parameters()
    with transformer_factory() as t:
        comp = t.computation([out] + ng.grad(loss, placeholders + params), *placeholders)
        values = []
        for p in params:
            value = t.variable_value(p) + 0.1 * rng.standard_normal(p.shape)
            t.set_variable(p, value.astype(dtype))
            values.append(value.astype(dtype))
        got = comp(*feeds)

    # PyG on the same numbers
    torch.manual_seed(0)
    module = case.pyg(x.shape[1]).to(torch.float64 if dtype == np.float64 else torch.float32)
    copy_weights(module, case, values)
    tx = torch.from_numpy(x).requires_grad_(True)
    te = None if e is None else torch.from_numpy(e).requires_grad_(True)
    edge_index = torch.from_numpy(np.stack([src, dst]).astype(np.int64))
    ref = case.run_pyg(module, tx, edge_index, te)
    (ref * torch.from_numpy(weights).reshape(ref.shape)).sum().backward()
    want = [ref.detach().numpy().reshape(out.shape), tx.grad.numpy()] + \
        ([] if te is None else [te.grad.numpy()]) + \
        pyg_gradients(module, case, [p.shape for p in params])

    tolerance = TOLERANCE[dtype]
    names = ["output", "d/dh"] + ([] if te is None else ["d/de"]) + \
        [f"d/d{p.name}" for p in params]
    for what, a, b in zip(names, got, want):
        assert_close(a, b, tolerance, f"{case.name} on {graph_name}: {what}")
