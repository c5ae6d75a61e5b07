"""SoftmaxByLogSumExp: an edge softmax keeps its per-vertex log-sum-exp and every reader of
its weights, the backward pass included, recomputes them from it; a GAT training step on
the GPU transformer stores no edge-sized tensor."""
import numpy as np
import pytest

import ngnn as ng
from ngnn import datasets, nn
from ngnn import transformers as ngt
from ngnn.op_graph import Divide, Log

from helpers import check_gradient

SRC = np.array([0, 1, 2, 3, 0, 2, 4, 4, 1])
DST = np.array([1, 2, 3, 0, 3, 1, 1, 1, 1])     # vertex 4 has no in-edge
rng = np.random.default_rng(3)


def graph():
    return ng.Graph.from_edges(SRC, DST, num_nodes=5)


def shifted_softmax(g, x, f):
    """GAT's form: exp(x - max) / sum, then the weighted sum of per-edge values."""
    with ng.zoomIn(g, node_feat={"x": x, "f": f}) as v:
        logits = [n.x + v.x for n in v.innbs]
        peak = ng.stop_gradient(max(logits))
        coeff = [ng.exp(y - peak) for y in logits]
        s = sum(coeff)
        rst = sum(c / s * n.f for c, n in zip(coeff, v.innbs))
    return ng.zoomOut(rst)


def plain_softmax(g, x, f):
    """seed 000's form: exp(x) / sum, no shift."""
    with ng.zoomIn(g, node_feat={"x": x, "f": f}) as v:
        coeff = [ng.exp(n.x * v.x) for n in v.innbs]
        s = sum(coeff)
        rst = sum(c / s * n.f for c, n in zip(coeff, v.innbs))
    return ng.zoomOut(rst)


FORMS = [shifted_softmax, plain_softmax]


def reference(x, f, logit):
    """NumPy: per destination, softmax of the logits times the sources' f."""
    out = np.zeros((5,) + f.shape[1:])
    for v in range(5):
        edges = np.flatnonzero(DST == v)
        if edges.size:
            z = logit(x[SRC[edges]], x[v])
            w = np.exp(z - z.max(axis=0))
            w /= w.sum(axis=0)
            out[v] = np.einsum("e...,e...->...", w, f[SRC[edges]])
    return out


LOGITS = {shifted_softmax: lambda xs, xv: xs + xv, plain_softmax: lambda xs, xv: xs * xv}


@pytest.mark.parametrize("form", FORMS, ids=lambda f: f.__name__)
def test_the_rewrite_equals_the_softmax_and_its_finite_difference_gradient(
        transformer_factory, form):
    x = rng.standard_normal((5, 2))
    f = rng.standard_normal((5, 2))
    g = graph()
    xs = [ng.placeholder(v.shape, dtype=np.float64, name=n) for n, v in (("x", x), ("f", f))]
    out = transformer_factory().computation(form(g, *xs), *xs)(x, f)
    np.testing.assert_allclose(out, reference(x, f, LOGITS[form]), rtol=1e-12, atol=1e-14)
    check_gradient(lambda a, b: form(g, a, b), [x, f], transformer_factory, coords=10)


@pytest.mark.parametrize("form", FORMS, ids=lambda f: f.__name__)
def test_weights_are_recomputed_from_a_per_vertex_log_sum_exp(form):
    g = graph()
    x = ng.placeholder((5, 2), dtype=np.float64, name="x")
    f = ng.placeholder((5, 2), dtype=np.float64, name="f")
    out = form(g, x, f)
    loss = ng.sum(out * out)
    with ngt.make_transformer("numpy", fusion=False) as t:
        comp = t.computation([loss] + ng.grad(loss, [x, f]), x, f)
        comp.transform()
        ops = comp.ordered_ops
    logs = [op for op in ops if isinstance(op, Log)]
    assert len(logs) == 1 and logs[0].shape == (5, 2), comp.ir
    # No division by the softmax's sum is left, forward or backward.
    assert not any(isinstance(op, Divide) for op in ops), comp.ir


def test_a_softmax_whose_parts_are_read_elsewhere_is_left_as_written(transformer_factory):
    """A user reading the exponentials themselves (not only through the softmax) gets
    them unscaled: the rewrite would change them, so it does not apply."""
    g = graph()
    x = rng.standard_normal((5, 2))
    xp = ng.placeholder(x.shape, dtype=np.float64, name="x")
    with ng.zoomIn(g, node_feat={"x": xp}) as v:
        coeff = [ng.exp(n.x) for n in v.innbs]
        s = sum(coeff)
        rst = sum(c / s for c in coeff) + sum(c * 2.0 for c in coeff)
    out = transformer_factory().computation(ng.zoomOut(rst), xp)(x)
    expected = np.zeros((5, 2))
    for v in range(5):
        edges = np.flatnonzero(DST == v)
        if edges.size:
            expected[v] = 1.0 + 2.0 * np.exp(x[SRC[edges]]).sum(axis=0)
    np.testing.assert_allclose(out, expected, rtol=1e-12)


def test_gat_training_step_stores_no_edge_tensor_on_the_gpu():
    """nn.GAT (8 heads, attention and feature dropout) on R-MAT: the memory plan of a
    training step holds no (E, ...) buffer: the forward keeps (max, log-sum) per vertex and
    head, and the backward recomputes the weights and the logits' gradient in each group."""
    data = datasets.synthetic("rmat", 2000, 16.0, 16, 4, seed=0)
    model = nn.GAT(16, hidden=4, heads=8, num_classes=4, seed=0)
    h = ng.placeholder((data.num_nodes, 16), name="h")
    labels = ng.placeholder((data.num_nodes,), dtype=np.int64, name="labels")
    loss = ng.cross_entropy(model(data.graph, h, training=True), labels)
    grads = ng.grad(loss, model.parameters())
    with ngt.make_transformer("gpu", runtime="opencl") as t:
        comp = t.computation([loss] + grads, h, labels)
        comp.transform()
        stored = [op for op in comp.memory_plan.slots if op.scope == "e"]
        assert stored == [], stored
        assert any(isinstance(op, Log) and op.shape == (data.num_nodes, 8, 1)
                   for op in comp.ordered_ops)
