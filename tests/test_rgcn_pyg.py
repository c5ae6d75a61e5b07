"""nn.RGCNConv against PyTorch Geometric's RGCNConv on identical weights: forward and
gradients (of the input and of every parameter), in float64 to 1e-9 and float32 to 1e-4,
on every backend, with free, basis (2 and 30 bases) and block-diagonal relation weights,
over a random typed multigraph with self loops and duplicate edges, a hub graph and a
graph without edges; and featureless input (PyG's x=None, ngnn's sparse identity)."""
import numpy as np
import pytest
import scipy.sparse

import ngnn as ng
from ngnn import nn

torch = pytest.importorskip("torch")
pyg_nn = pytest.importorskip("torch_geometric.nn")

N, R, F, O = 12, 4, 6, 4
TOLERANCE = {np.float64: 1e-9, np.float32: 1e-4}


def random_multigraph(rng):
    src = rng.integers(0, N, 40)
    dst = rng.integers(0, N, 40)
    src[:3], dst[:3] = 5, 5                      # self loops
    src[3:6], dst[3:6] = 2, 7                     # duplicates, in one relation and across
    types = rng.integers(0, R, 40)
    types[3:5] = 1
    return src, dst, types


def hub(rng):
    leaves = np.arange(1, N)
    src = np.concatenate([leaves, np.zeros(N - 1, dtype=np.int64)])
    dst = np.concatenate([np.zeros(N - 1, dtype=np.int64), leaves])
    return src, dst, rng.integers(0, R, src.size)


def no_edges(rng):
    empty = np.zeros(0, dtype=np.int64)
    return empty, empty, empty


GRAPHS = {"multigraph": random_multigraph, "hub": hub, "no_edges": no_edges}
DECOMPOSITIONS = {"free": {}, "bases2": {"num_bases": 2}, "bases30": {"num_bases": 30},
                  "blocks": {"num_blocks": 2}}


def pyg_reference(src, dst, types, x, options, dtype, seed):
    """PyG's layer (its own initialization, bias made non-zero), its output and the
    gradients of sum(out * weights) with respect to x and each parameter, by name."""
    torch.manual_seed(seed)
    conv = pyg_nn.RGCNConv(F if x is not None else N, O, R, **options).to(
        torch.float64 if dtype == np.float64 else torch.float32)
    with torch.no_grad():
        conv.bias.uniform_(-1, 1)
    edge_index = torch.from_numpy(np.stack([src, dst]))
    xt = None if x is None else torch.tensor(x, requires_grad=True)
    out = conv(xt, edge_index, torch.from_numpy(types))
    weights = torch.from_numpy(np.random.default_rng(seed).uniform(0.5, 1.5, out.shape)
                               .astype(dtype))
    (out * weights).sum().backward()
    grads = {name: p.grad.numpy() for name, p in conv.named_parameters()}
    if x is not None:
        grads["x"] = xt.grad.numpy()
    params = {name: p.detach().numpy() for name, p in conv.named_parameters()}
    return params, out.detach().numpy(), weights.numpy(), grads


def ngnn_layer(params, in_feats, options, dtype):
    conv = nn.RGCNConv(in_feats, O, num_relations=R, dtype=dtype, **options)
    variables = {"weight": conv.weight, "comp": getattr(conv, "comp", None),
                 "root": conv.root, "bias": conv.bias}
    assert set(params) == {k for k, v in variables.items() if v is not None}
    for name, value in params.items():
        assert variables[name].shape == value.shape, name
        variables[name].initial_value = value.astype(dtype)
    return conv, variables


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("graph", list(GRAPHS))
@pytest.mark.parametrize("decomposition", list(DECOMPOSITIONS))
def test_rgcnconv_equals_pyg(transformer_factory, decomposition, graph, dtype):
    rng = np.random.default_rng(7)
    src, dst, types = GRAPHS[graph](rng)
    x = rng.standard_normal((N, F)).astype(dtype)
    options = DECOMPOSITIONS[decomposition]
    params, expected, weights, expected_grads = pyg_reference(src, dst, types, x, options,
                                                              dtype, seed=3)
    g = ng.Graph.from_edges(src, dst, num_nodes=N, edge_type=types, num_relations=R)
    conv, variables = ngnn_layer(params, F, options, dtype)
    h = ng.placeholder((N, F), dtype=dtype, name="x")
    out = conv(g, h)
    loss = ng.sum(out * ng.constant(weights, dtype=dtype))
    names = sorted(params)
    grads = ng.grad(loss, [h] + [variables[n] for n in names])
    comp = transformer_factory().computation([out] + grads, h)
    got, *got_grads = comp(x)
    tol = TOLERANCE[dtype]
    np.testing.assert_allclose(got, expected, rtol=tol, atol=tol)
    for name, value in zip(["x"] + names, got_grads):
        np.testing.assert_allclose(value, expected_grads[name], rtol=tol, atol=tol,
                                   err_msg=f"gradient of {name}")


@pytest.mark.parametrize("decomposition", ["free", "bases2"])
def test_featureless_rgcnconv_equals_pyg(transformer_factory, decomposition):
    """PyG's x=None looks rows of W_r up by node id; ngnn multiplies by a sparse identity."""
    rng = np.random.default_rng(11)
    src, dst, types = random_multigraph(rng)
    options = DECOMPOSITIONS[decomposition]
    params, expected, weights, expected_grads = pyg_reference(
        src, dst, types, None, options, np.float64, seed=5)
    g = ng.Graph.from_edges(src, dst, num_nodes=N, edge_type=types, num_relations=R)
    conv, variables = ngnn_layer(params, N, options, np.float64)
    x = ng.placeholder((N, N), dtype=np.float64, name="x", sparse=True)
    out = conv(g, x)
    loss = ng.sum(out * ng.constant(weights, dtype=np.float64))
    names = sorted(params)
    grads = ng.grad(loss, [variables[n] for n in names])
    comp = transformer_factory().computation([out] + grads, x)
    got, *got_grads = comp(scipy.sparse.identity(N, dtype=np.float64, format="csr"))
    # A row lookup per relation: the sparse identity is never made dense.
    assert not [op for op in comp.ordered_ops if op.shape == (N, N) and not op.is_sparse]
    np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-9)
    for name, value in zip(names, got_grads):
        np.testing.assert_allclose(value, expected_grads[name], rtol=1e-9, atol=1e-9,
                                   err_msg=f"gradient of {name}")
