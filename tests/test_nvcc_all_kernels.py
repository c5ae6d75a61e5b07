"""Every kernel the GPU transformer generated in this test session, rendered for CUDA and
compiled by nvcc for sm_80 in one batched call: the kernels that ran on OpenCL are the
exact kernels an NVIDIA GPU would run.

A representative set of computations covering every template is built here too, so the
test is complete when it runs alone; run with the whole suite it also covers every
kernel of every other test (the transformer records them in `generated_kernels`)."""
import re

import numpy as np
import pytest

import ngnn as ng
from ngnn import transformers as ngt
from ngnn.op_graph import Unslice
from ngnn.transformers.gpu.kernels import PREFIXES
from ngnn.transformers.gpu.runtime import compile_ptx, nvcc_available, render_prelude
from ngnn.transformers.gpu.transformer import generated_kernels

# after_all (tests/conftest.py): the whole suite's kernels exist by the time this runs.
pytestmark = [pytest.mark.skipif(not nvcc_available(), reason="nvcc is not on PATH"),
              pytest.mark.after_all]


def representative_computations(t):
    """Computations that use every kernel template and every kind of fused producer."""
    g = ng.Graph.from_edges([0, 1, 2, 2, 3], [1, 2, 0, 3, 3], num_nodes=5)
    x = ng.placeholder((5, 4), name="x")
    labels = ng.placeholder((5,), dtype=np.int64, name="labels")
    d = ng.placeholder((5, 4), dtype=np.float64, name="d")
    w = ng.variable((4, 4), initial_value=np.eye(4), name="w")
    e = ng.gather(ng.dot(x, w), g, by="src") * ng.gather(x, g, by="dst")
    attention = ng.edge_softmax(g, ng.sum(e, axis=-1, keepdims=True))
    results = [
        ng.relu(ng.dropout(x, 0.5) * 2.0 + 1.0),
        ng.concat([x, x[:, ::-1]], axis=1), Unslice(x, (7, 4), (slice(1, 6, 1), slice(0, 4, 1))),
        ng.max(x, axis=0), ng.mean(x), ng.log_softmax(x), ng.softmax(ng.transpose(x), axis=0),
        ng.cross_entropy(x, labels), ng.one_hot(labels, 4),
        ng.aggregate(e, g, at="src", reduce="max"), attention,
        ng.elu(ng.aggregate(ng.gather(x, g) * attention, g, reduce="mean")),
        ng.exp(d) + ng.sum(d, axis=1, keepdims=True), ng.cast(labels, np.float32),
        ng.assign(w, w * 0.5),
    ]
    loss = ng.sum(ng.aggregate(e, g, reduce="sum")) + ng.sum(ng.softmax(x))
    xs = ng.placeholder((5, 4), sparse=True, name="xs")
    sparse_loss = ng.sum(ng.tanh(ng.dot(ng.dropout(xs, 0.5), w)))
    # A hub heavier than the schedule's chunks: partial kernels and heavy-row paths.
    hub = ng.Graph.from_edges(np.arange(1, 301), np.zeros(300, np.int64), num_nodes=301)
    hx = ng.placeholder((301, 4), name="hx")
    scores = ng.sum(ng.gather(hx, hub, by="src") * ng.gather(hx, hub, by="dst"), axis=-1,
                    keepdims=True)
    weights = ng.edge_softmax(hub, scores)
    hub_loss = ng.sum(ng.aggregate(ng.gather(hx, hub) * weights, hub, reduce="max"))
    return [t.computation(results, x, labels, d), t.computation(ng.grad(loss, [w, x]), x),
            t.computation([sparse_loss, ng.grad(sparse_loss, w)], xs),
            t.computation([weights, hub_loss, ng.grad(hub_loss, hx)], hx)]


def test_every_generated_kernel_compiles_with_nvcc():
    with ngt.make_transformer("gpu", runtime="opencl") as t:
        for comp in representative_computations(t):
            comp.transform()
    # One translation unit: each distinct kernel once, renamed apart where names repeat.
    texts, names = {}, []
    for kernel in generated_kernels.values():
        text = kernel.render("cuda")
        if text not in texts:
            name = f"{kernel.name}_{len(texts)}"
            texts[text] = re.sub(rf"\bvoid {kernel.name}\(", f"void {name}(", text)
            names.append((name, kernel.template))
    source = render_prelude("cuda") + "\n\n".join(texts.values())
    ptx = compile_ptx({"all_kernels": source}, arch="sm_80")["all_kernels"]
    for name, _ in names:
        assert f".entry {name}(" in ptx
    assert {template for _, template in names} == set(PREFIXES)
    assert any(".f64" in line for line in ptx.splitlines())
