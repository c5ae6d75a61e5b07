"""Every ngnn layer against its PyTorch Geometric counterpart (tests/pyg_cases.py) on identical
weights: the output, and the gradients of a weighted sum of it with respect to the input
features, the edge features and every weight, on each backend.

Graphs: Cora (float32, to 1e-4, with 32 input features: Cora's bag of words times a fixed
random projection plus a little noise, so every row is dense, nonzero and unique), and in
float64 (to 1e-9) a random multigraph with self loops, duplicate edges and vertices without
in-edges, a star whose hub has every other vertex as in- and out-neighbour, and a graph
without edges. Tolerances are relative to the largest magnitude of the reference array, so
an entry near 0 is held to the same absolute error as the array's large entries.
"""
import functools

import numpy as np
import pytest
import torch

import ngnn as ng
from ngnn import datasets
from pyg_cases import CASES, HEADS, HIDDEN, attribute

TOLERANCE = {np.float32: 1e-4, np.float64: 1e-9}
IN_FEATS = {"cora": 32, "multigraph": 5, "star": 5, "empty": 5}


@functools.lru_cache(maxsize=None)
def edges(name):
    """(src, dst, num_nodes) of a test graph."""
    if name == "cora":
        g = datasets.load("cora").graph
        return g.src, g.dst, g.num_nodes
    if name == "multigraph":
        rng = np.random.default_rng(0)
        n, e = 12, 40
        src, dst = rng.integers(0, n - 2, e), rng.integers(2, n - 2, e)
        src[:3] = dst[:3]                               # self loops
        src[3:6], dst[3:6] = src[6], dst[6]             # an edge three times more
        return src, dst, n                              # 0, 1: no in-edges; 10, 11: isolated
    if name == "star":
        leaves = np.arange(1, 16)
        return (np.concatenate([leaves, np.zeros(15, np.int64)]),
                np.concatenate([np.zeros(15, np.int64), leaves]), 16)
    assert name == "empty"
    return np.zeros(0, np.int64), np.zeros(0, np.int64), 5


@functools.lru_cache(maxsize=None)
def node_features(name):
    src, dst, n = edges(name)
    rng = np.random.default_rng(1)
    if name == "cora":
        bag = datasets.load("cora").features
        x = bag @ rng.standard_normal((bag.shape[1], IN_FEATS[name])) / 4
        # Cora holds papers with equal words: noise keeps them from tying in a max, where
        # rounding would break the tie differently on the two sides
        x = x + 0.01 * rng.standard_normal(x.shape)
    else:
        x = rng.standard_normal((n, IN_FEATS[name]))
    return np.ascontiguousarray(x, dtype=np.float64)


def graph_for(case, name):
    src, dst, n = edges(name)
    if case.symmetric and name == "multigraph":     # the others are symmetric already
        src, dst = np.concatenate([src, dst]), np.concatenate([dst, src])
    if case.loop_free:
        src, dst = src[src != dst], dst[src != dst]
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


class Setup:
    """One case on one graph: the ngnn layer and its inputs, and the PyG module."""

    def __init__(self, case, graph_name):
        self.case, self.graph_name = case, graph_name
        self.src, self.dst, n = graph_for(case, graph_name)
        self.dtype = case.cora_dtype if graph_name == "cora" else np.float64
        self.rng = np.random.default_rng(2)
        self.x = node_features(graph_name).astype(self.dtype)
        self.e = None if case.edge_dim is None else \
            self.rng.standard_normal((len(self.src), case.edge_dim)).astype(self.dtype)
        self.g = ng.Graph.from_edges(self.src, self.dst, num_nodes=n)
        self.layer = case.ngnn(self.x.shape[1], self.dtype)
        self.h = ng.placeholder(self.x.shape, dtype=self.dtype, name="h")
        self.ef = None if self.e is None else \
            ng.placeholder(self.e.shape, dtype=self.dtype, name="e")
        self.placeholders = [p for p in (self.h, self.ef) if p is not None]
        self.feeds = [v for v in (self.x, self.e) if v is not None]

    def run_ngnn(self, t, results, **options):
        """`results` computed by `t`, with the layer's weights moved off their initial
        values first (zero biases would hide a bias in the wrong place); -> (values of the
        results, the weights used)."""
        comp = t.computation(results, *self.placeholders)
        weights = []
        for p in self.layer.parameters():
            value = (t.variable_value(p) + 0.1 * self.rng.standard_normal(p.shape))
            weights.append(value.astype(self.dtype))
            t.set_variable(p, weights[-1])
        return comp(*self.feeds), weights

    def pyg_module(self, weights):
        torch.manual_seed(0)
        module = self.case.pyg(self.x.shape[1]).to(
            torch.float64 if self.dtype == np.float64 else torch.float32)
        self.case.after_cast(module)
        copy_weights(module, self.case, weights)
        return module

    def pyg_inputs(self):
        tx = torch.from_numpy(self.x).requires_grad_(True)
        te = None if self.e is None else torch.from_numpy(self.e).requires_grad_(True)
        edge_index = torch.from_numpy(np.stack([self.src, self.dst]).astype(np.int64))
        return tx, edge_index, te

    def assert_close(self, got, want, what):
        assert_close(got, want, TOLERANCE[self.dtype],
                     f"{self.case.name} on {self.graph_name}: {what}")


@pytest.mark.parametrize("graph_name", list(IN_FEATS))
@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_layer_equals_pyg(transformer_factory, case, graph_name):
    """Output, and gradients of a weighted sum of it with respect to h, e and every weight."""
    setup = Setup(case, graph_name)
    out = case.run_ngnn(setup.layer, setup.g, setup.h, setup.ef)
    weighing = setup.rng.standard_normal(out.shape).astype(setup.dtype)
    loss = ng.sum(out * ng.constant(weighing, dtype=setup.dtype))
    params = setup.layer.parameters()
    with transformer_factory() as t:
        got, weights = setup.run_ngnn(t, [out] + ng.grad(loss, setup.placeholders + params))

    module = setup.pyg_module(weights)
    tx, edge_index, te = setup.pyg_inputs()
    ref = case.run_pyg(module, tx, edge_index, te)
    (ref * torch.from_numpy(weighing).reshape(ref.shape)).sum().backward()
    want = [ref.detach().numpy().reshape(out.shape), tx.grad.numpy()] + \
        ([] if te is None else [te.grad.numpy()]) + \
        pyg_gradients(module, case, [p.shape for p in params])
    names = ["output", "d/dh"] + ([] if te is None else ["d/de"]) + \
        [f"d/d{p.name}" for p in params]
    assert len(got) == len(want) == len(names)
    for what, a, b in zip(names, got, want):
        setup.assert_close(a, b, what)


ATTENTION = [case for case in CASES if case.attention]


@pytest.mark.parametrize("graph_name", list(IN_FEATS))
@pytest.mark.parametrize("case", ATTENTION, ids=lambda case: case.name)
def test_attention_weights_equal_pygs(transformer_factory, case, graph_name):
    """return_attention=True: alpha (E, heads), edge i's weight in row i, as PyG's."""
    setup = Setup(case, graph_name)
    out, alpha = case.run_ngnn(setup.layer, setup.g, setup.h, setup.ef, return_attention=True)
    assert alpha.shape[0] == setup.g.num_edges and alpha.ndim == 2
    with transformer_factory() as t:
        (got_out, got_alpha), weights = setup.run_ngnn(t, [out, alpha])
    tx, edge_index, te = setup.pyg_inputs()
    with torch.no_grad():
        ref_out, ref_alpha = case.pyg_attention(setup.pyg_module(weights), tx, edge_index, te)
    setup.assert_close(got_out, ref_out.numpy().reshape(got_out.shape), "output")
    setup.assert_close(got_alpha, ref_alpha.numpy(), "alpha")


# The widest edge value (floats per edge) each attention layer's forward pass stores without
# return_attention, on NumPy and on the GPU: none. Every softmax keeps a per-vertex
# log-sum-exp and its weights are recomputed from it (ngnn.passes.SoftmaxByLogSumExp);
# the logits are recomputed from gathered per-vertex values in each group that reads them
# (Fusion: docs/fusion.md); TransformerConv never encodes edge features per edge.
STORED_EDGE_WIDTH = {backend: {case.name: 0 for case in CASES if case.attention}
                     for backend in ("numpy", "gpu")}


def stored_edge_values(results, placeholders, num_edges, backend, **options):
    """(floats per edge, op type) of each edge-sized buffer of the plan of `results`."""
    with ng.transformers.make_transformer(backend, **options) as t:
        comp = t.computation(results, *placeholders)
        comp.transform()
        return sorted((int(np.prod(op.shape[1:])), type(op).__name__)
                      for op in comp.memory_plan.slots if op.shape and op.shape[0] == num_edges)


@pytest.mark.parametrize("backend", list(STORED_EDGE_WIDTH))
@pytest.mark.parametrize("case", ATTENTION, ids=lambda case: case.name)
def test_attention_stores_alpha_only_when_asked(case, backend):
    """The forward pass of an attention layer on Cora, planned without and with
    return_attention: alpha, (E, heads), is a buffer of the plan only when asked for, and
    no weight (an exp) is stored without it."""
    setup = Setup(case, "cora")
    stored = {}
    for asked in (False, True):
        result = case.run_ngnn(setup.layer, setup.g, setup.h, setup.ef,
                               **({"return_attention": True} if asked else {}))
        stored[asked] = stored_edge_values(result, setup.placeholders, setup.g.num_edges,
                                           backend)
    widths = {asked: [w for w, _ in values] for asked, values in stored.items()}
    assert max(widths[False], default=0) == STORED_EDGE_WIDTH[backend][case.name], stored
    assert not any(kind == "Exp" for _, kind in stored[False]), stored
    assert len(widths[True]) > len(widths[False]), stored


# What a training step of each attention layer stores per edge, on both backends, with
# float32 sums and with float64 ones (wide_accumulation, `ngnn train`'s default): nothing,
# TransformerConv with edge features included (docs/fusion.md, "What an attention's
# training step stores"); asked for the gradient of its edge features too, it plans that
# result (E x edge_dim) and nothing else per edge. With float64 sums, GAT's and
# TransformerConv's source-side walk reads the output gradient's rows once, in float32,
# for the logits' gradient and, widened after the gather, for the features'.


@pytest.mark.parametrize("wide", [False, True], ids=["float32_sums", "float64_sums"])
@pytest.mark.parametrize("backend", ["numpy", "gpu"])
@pytest.mark.parametrize("case", ATTENTION, ids=lambda case: case.name)
def test_attention_training_step_keeps_nothing_edge_sized(case, backend, wide):
    """An attention layer's forward and the gradients of its weights and input features,
    planned together on Cora: no (E, ...) buffer (but as listed above). The backward recomputes the weights from
    the per-vertex log-sum-exp and the logits and their gradient in each walk that reads
    them; parameters used per edge get their gradient through per-vertex sums
    (ngnn.passes.EdgeSumsByVertex)."""
    setup = Setup(case, "cora")
    out = case.run_ngnn(setup.layer, setup.g, setup.h, setup.ef, training=True)
    loss = ng.sum(out * out)
    results = [loss] + ng.grad(loss, [setup.h] + setup.layer.parameters())
    stored = stored_edge_values(results, setup.placeholders, setup.g.num_edges, backend,
                                wide_accumulation=wide)
    assert stored == [], stored
    if setup.ef is not None:
        results = [loss] + ng.grad(loss, [setup.h, setup.ef] + setup.layer.parameters())
        stored = stored_edge_values(results, setup.placeholders, setup.g.num_edges, backend,
                                    wide_accumulation=wide)
        assert [width for width, _ in stored] == [case.edge_dim], stored
