"""SAGA-NN (ng.saga): values against NumPy, G-GCN against its zoomIn twin (same IR, values
and gradients), finite-difference gradients, and the errors of bad input."""
import builtins

import numpy as np
import pytest

import ngnn as ng
from ngnn import nn
from ngnn import transformers as ngt
from ngnn.frontend import TracingError
from ngnn.op_graph import ShapeError

from helpers import check_gradient

# src -> dst: vertex 0 has no in-edges, vertex 6 no edges at all, 2 -> 3 is doubled, 4 -> 4
# is a self loop.
SRC = np.array([0, 1, 2, 2, 3, 4, 2, 1, 5, 0, 3])
DST = np.array([1, 2, 3, 3, 4, 4, 1, 3, 2, 5, 5])
N, E, F = 7, len(SRC), 3
BUILTINS = {name: getattr(builtins, name) for name in ("sum", "max", "min", "zip")}


def graph():
    return ng.Graph.from_edges(SRC, DST, num_nodes=N)


def reduce_at(values, index, reduce):
    """NumPy reference of an aggregation at `index` (0 where no edge arrives)."""
    out = np.full((N,) + values.shape[1:], -np.inf if reduce == "max" else
                  np.inf if reduce == "min" else 0.0)
    {"sum": np.add, "mean": np.add, "max": np.maximum, "min": np.minimum}[reduce].at(
        out, index, values)
    count = np.bincount(index, minlength=N).reshape((N,) + (1,) * (values.ndim - 1))
    if reduce == "mean":
        out = out / np.maximum(count, 1)
    return np.where(count > 0, out, 0.0)


@pytest.mark.parametrize("accumulator", ["sum", "mean", "max", "min"])
def test_api_example_with_edge_weights(transformer_factory, accumulator):
    rng = np.random.default_rng(0)
    h = ng.placeholder((N, F), dtype=np.float64, name="h")
    w = ng.placeholder((E, 1), dtype=np.float64, name="w")
    x, wv = rng.standard_normal((N, F)), rng.standard_normal((E, 1))
    W = rng.standard_normal((F, 2))
    weight = ng.constant(W, dtype=np.float64)
    out = ng.saga(graph(), node_feat={"h": h},
                  apply_edge=lambda src, dst, edge: src.h * edge.w,
                  accumulator=accumulator,
                  apply_vertex=lambda v, acc: ng.relu(ng.dot(acc, weight)),
                  edge_feat={"w": w})
    assert out.shape == (N, 2)
    result = transformer_factory().computation(out, h, w)(x, wv)
    expected = np.maximum(reduce_at(x[SRC] * wv, DST, accumulator) @ W, 0)
    np.testing.assert_allclose(result, expected, rtol=1e-12, atol=1e-12)


# ---- G-GCN: ng.saga against its zoomIn twin ----------------------------------------------------

def ggcn_zoomin(layer, g, h):
    """nn.GatedGCNConv written with ng.zoomIn, op for op."""
    with ng.zoomIn(g, node_feat={"h": h}) as v:
        messages = [ng.sigmoid(v.h @ layer.gate_dst + n.h @ layer.gate_src) * n.h
                    for n in v.innbs]
        rst = ng.relu(sum(messages) @ layer.weight)
    return ng.zoomOut(rst)


def ggcn_reference(x, A, B, W):
    gate = 1 / (1 + np.exp(-(x[DST] @ A + x[SRC] @ B)))
    return np.maximum(reduce_at(gate * x[SRC], DST, "sum") @ W, 0)


def test_ggcn_saga_equals_its_zoomin_twin(transformer_factory):
    x = np.random.default_rng(1).standard_normal((N, F))
    h = ng.placeholder((N, F), dtype=np.float64, name="h")
    layer = nn.GatedGCNConv(F, 4, seed=3, dtype=np.float64)
    probe = ng.constant(np.random.default_rng(2).standard_normal((N, 4)), dtype=np.float64)
    wrt = layer.parameters() + [h]
    runs = []
    for out in (layer(graph(), h), ggcn_zoomin(layer, graph(), h)):
        t = transformer_factory()
        comp = t.computation([out] + ng.grad(ng.sum(out * probe), wrt), h)
        runs.append((comp.ir_after("OperationBatching"), comp.ir, comp(x)))
    (saga_batched, saga_ir, saga_values), (twin_batched, twin_ir, twin_values) = runs
    assert saga_batched == twin_batched
    assert saga_ir == twin_ir
    for a, b in zip(saga_values, twin_values):
        np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-15)
    A, B, W = (t.variable_value(p) for p in layer.parameters())
    np.testing.assert_allclose(saga_values[0], ggcn_reference(x, A, B, W), rtol=1e-12)


def test_ggcn_saga_runs_chunked_as_unchunked(transformer_factory):
    """A SAGA-NN layer is ordinary graph ops, so the P x P chunked execution runs it."""
    rng = np.random.default_rng(7)
    g = ng.Graph.from_edges(rng.integers(0, 30, 120), rng.integers(0, 30, 120), num_nodes=30)
    x = rng.standard_normal((30, F))
    h = ng.placeholder(x.shape, dtype=np.float64, name="h")
    layer = nn.GatedGCNConv(F, 4, seed=5, dtype=np.float64)
    out = layer(g, h)
    results = [out] + ng.grad(ng.sum(out * out), layer.parameters() + [h])
    whole = transformer_factory().computation(results, h)
    chunked = transformer_factory(chunks=3).computation(results, h)
    expected, got = whole(x), chunked(x)
    assert chunked.stats["chunks"] == 3
    for a, b in zip(expected, got):
        np.testing.assert_allclose(b, a, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("accumulator", ["sum", "mean", "max"])
def test_saga_gradients_by_finite_differences(transformer_factory, accumulator):
    rng = np.random.default_rng(4)
    g = graph()

    def build(h, w, A, B, W):
        def apply_edge(src, dst, edge):
            return ng.sigmoid(dst.h @ A + src.h @ B) * src.h * edge.w

        return ng.saga(g, node_feat={"h": h}, edge_feat={"w": w}, apply_edge=apply_edge,
                       accumulator=accumulator,
                       apply_vertex=lambda v, acc: ng.tanh(acc @ W + v.h @ W))

    inputs = [rng.standard_normal(s) for s in ((N, F), (E, 1), (F, F), (F, F), (F, 2))]
    check_gradient(build, inputs, transformer_factory, coords=4)


# ---- what saga accepts and returns -------------------------------------------------------------

def test_default_apply_vertex_and_several_outputs():
    h = ng.placeholder((N, F), dtype=np.float64, name="h")
    x = np.random.default_rng(5).standard_normal((N, F))
    acc = ng.saga(graph(), node_feat={"h": h}, apply_edge=lambda s, d, e: s.h - d.h)
    pair = ng.saga(graph(), node_feat={"h": h}, apply_edge=lambda s, d, e: s.h,
                   accumulator="mean", apply_vertex=lambda v, a: (a, v.h * v.indegree))
    assert isinstance(pair, tuple) and len(pair) == 2
    with ngt.make_transformer("numpy") as t:
        got_acc, got_mean, got_scaled = t.computation([acc, *pair], h)(x)
    np.testing.assert_allclose(got_acc, reduce_at(x[SRC] - x[DST], DST, "sum"))
    np.testing.assert_allclose(got_mean, reduce_at(x[SRC], DST, "mean"))
    np.testing.assert_allclose(got_scaled, x * np.bincount(DST, minlength=N)[:, None])


def test_over_a_block_only_destinations_are_computed():
    block = ng.Graph.from_edges([2, 3, 4, 0], [0, 1, 1, 0], num_nodes=5, num_dst=2)
    h = ng.placeholder((5, F), dtype=np.float64, name="h")
    x = np.arange(5 * F, dtype=np.float64).reshape(5, F)
    out = ng.saga(block, node_feat={"h": h}, apply_edge=lambda s, d, e: s.h * d.h,
                  apply_vertex=lambda v, a: a + v.h)
    assert out.shape == (2, F)
    with ngt.make_transformer("numpy") as t:
        got = t.computation(out, h)(x)
    np.testing.assert_allclose(got, [x[2] * x[0] + x[0] * x[0] + x[0],
                                     x[3] * x[1] + x[4] * x[1] + x[1]])


# ---- bad input ---------------------------------------------------------------------------------

def saga_call(**overrides):
    h = ng.placeholder((N, F), name="h")
    args = dict(node_feat={"h": h}, apply_edge=lambda s, d, e: s.h, accumulator="sum",
                apply_vertex=lambda v, a: a)
    args.update(overrides)
    return ng.saga(graph(), **args)


def test_unknown_accumulator_names_the_closest():
    with pytest.raises(ValueError, match=r"unknown accumulator 'avg'.*sum, mean, max, min"):
        saga_call(accumulator="avg")
    with pytest.raises(ValueError, match=r"did you mean 'mean'\?"):
        saga_call(accumulator="meen")
    with pytest.raises(ValueError, match="unknown accumulator None"):
        saga_call(accumulator=None)


@pytest.mark.parametrize("apply_edge, message", [
    (lambda s, d, e: None, r"apply_edge returned None \(a missing `return`\?\)"),
    (lambda s, d, e: 2.0, "apply_edge returned 2.0, which is not a tensor"),
    (lambda s, d, e: [s.h], "apply_edge returned .*, which is not a tensor"),
    (lambda s, d, e: ng.constant(np.ones(F)), "reads no src, dst or edge data"),
    (lambda s, d, e: d.h * 2.0, "one value per destination vertex: it reads only dst"),
])
def test_apply_edge_must_return_one_value_per_edge(apply_edge, message):
    with pytest.raises(TracingError, match=message) as info:
        saga_call(apply_edge=apply_edge)
    assert "test_saga.py" in str(info.value)      # points at the user's line
    assert {name: getattr(builtins, name) for name in BUILTINS} == BUILTINS


@pytest.mark.parametrize("apply_vertex, message", [
    (lambda v, a: None, "apply_vertex returned None"),
    (lambda v, a: np.zeros(F), "apply_vertex returned .*not a tensor"),
    (lambda v, a: ng.constant(1.0), "reads neither the vertex nor the accumulated value"),
])
def test_apply_vertex_must_return_vertex_data(apply_vertex, message):
    with pytest.raises(TracingError, match=message):
        saga_call(apply_vertex=apply_vertex)


def test_apply_vertex_cannot_read_edges():
    with pytest.raises(AttributeError, match="vertex.innbs: there is no node feature"):
        saga_call(apply_vertex=lambda v, a: [n.h for n in v.innbs])


def test_functions_must_be_callable():
    with pytest.raises(TypeError, match="apply_edge must be a function"):
        saga_call(apply_edge=None)
    with pytest.raises(TypeError, match="apply_vertex must be a function"):
        saga_call(apply_vertex="relu")


def test_node_feat_must_be_node_tensors():
    h = ng.placeholder((N, F), name="h")
    with pytest.raises(TypeError, match=r"ng.saga: node_feat must be a \{name: tensor\} dict"):
        saga_call(node_feat=h)
    with pytest.raises(ShapeError, match=rf"ng.saga: node_feat 'h' has shape \(5, 3\).*"
                                         rf"one row per graph node \({N} nodes\)"):
        saga_call(node_feat={"h": ng.placeholder((5, F), name="h")})
    with pytest.raises(ShapeError, match=rf"edge_feat 'w' has shape \({N}, 1\).*\({E} edges\)"):
        saga_call(edge_feat={"w": ng.placeholder((N, 1), name="w")})
    for bad in ("h", None):
        with pytest.raises(TypeError, match="ng.saga: node_feat 'h' must be a tensor"):
            saga_call(node_feat={"h": bad})
    with pytest.raises(ValueError, match="ng.saga: node_feat name 'innbs' must be"):
        saga_call(node_feat={"innbs": h})
    with pytest.raises(TypeError, match="ng.saga: expected an ng.Graph"):
        ng.saga(SRC, node_feat={"h": h}, apply_edge=lambda s, d, e: s.h)


def test_unknown_features_name_what_there_is():
    with pytest.raises(AttributeError, match=r"src.x: there is no node feature 'x' in this "
                                             r"ng.saga; available node features: h"):
        saga_call(apply_edge=lambda s, d, e: s.x)
    with pytest.raises(AttributeError, match=r"edge.w: there is no edge feature 'w'.*"
                                             r"available edge features: none"):
        saga_call(apply_edge=lambda s, d, e: s.h * e.w)
    assert {name: getattr(builtins, name) for name in BUILTINS} == BUILTINS
