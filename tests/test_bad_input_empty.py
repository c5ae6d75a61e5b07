"""Empty shapes: a graph without vertices and node features of width 0 give empty arrays of
the right shape and the gradients the algebra defines, on every backend alike (they once
failed inside the NumPy transformer's generated code, and in the GPU's planning)."""
import numpy as np
import pytest

import ngnn as ng
from ngnn import nn

# model -> (layer of in_feats f, the shape of one vertex's output)
LAYERS = {
    "gcn": (lambda f: nn.GCNConv(f, 3, dtype=np.float64), (3,)),
    "gat": (lambda f: nn.GATConv(f, 2, num_heads=2, dtype=np.float64), (2, 2)),
    "sage": (lambda f: nn.SAGEConv(f, 3, dtype=np.float64), (3,)),
    "gin": (lambda f: nn.GINConv(f, 3, dtype=np.float64), (3,)),
}
RNG = np.random.default_rng(0)


def graph(num_nodes):
    """Self loops and a duplicate edge when there are vertices; no edges when there are none."""
    edges = np.array([[0, 1], [1, 0], [2, 2], [3, 1], [3, 1]]) if num_nodes else \
        np.zeros((0, 2), np.int64)
    return ng.Graph.from_edges(edges[:, 0], edges[:, 1], num_nodes=num_nodes)


def layer_step(transformer_factory, model, num_nodes, width):
    """The layer's output and the gradients of sum(output * weights) with respect to each
    parameter, with every bias set to random values (so outputs are not zero by accident)."""
    layer = LAYERS[model][0](width)
    h = ng.placeholder((num_nodes, width), dtype=np.float64, name="h")
    out = layer(graph(num_nodes), h)
    weights = RNG.standard_normal(out.shape)
    loss = ng.sum(out * ng.constant(weights, dtype=np.float64))
    t = transformer_factory()
    comp = t.computation([out] + [ng.grad(loss, p) for p in layer.params], h)
    names = [p.name.split(".")[-1] for p in layer.params]      # bias, b1, fc, w2, ...
    for name, p in zip(names, layer.params):
        if name.startswith("b"):
            t.set_variable(p, RNG.standard_normal(p.shape))
    values = {name: t.variable_value(p) for name, p in zip(names, layer.params)}
    out_value, *grads = comp(np.ones((num_nodes, width)))
    return out_value, dict(zip(names, grads)), values, weights


@pytest.mark.parametrize("model", sorted(LAYERS))
@pytest.mark.parametrize("width", [4, 0])
def test_a_graph_without_vertices(transformer_factory, model, width):
    out, grads, values, _ = layer_step(transformer_factory, model, 0, width)
    assert out.shape == (0,) + LAYERS[model][1]
    for name, value in values.items():
        assert grads[name].shape == value.shape
        np.testing.assert_array_equal(grads[name], 0)


@pytest.mark.parametrize("model", sorted(LAYERS))
def test_features_of_width_zero(transformer_factory, model):
    """No input feature reaches the output: every vertex outputs what the biases make, and
    only the biases (and GIN's second weight) get a gradient."""
    out, grads, values, weights = layer_step(transformer_factory, model, 4, 0)
    column = weights.sum(axis=0)
    if model == "gin":
        hidden = np.maximum(values["b1"], 0)
        want = np.broadcast_to(hidden @ values["w2"] + values["b2"], out.shape)
        want_grads = {"b2": column, "w2": np.outer(hidden, column),
                      "b1": (values["b1"] > 0) * (values["w2"] @ column)}
    else:
        want = np.broadcast_to(values["bias"], out.shape)
        want_grads = {"bias": column}
    np.testing.assert_allclose(out, want, rtol=1e-12)
    for name, value in values.items():
        assert grads[name].shape == value.shape
        np.testing.assert_allclose(grads[name], want_grads.get(name, 0), rtol=1e-12, atol=1e-12)
