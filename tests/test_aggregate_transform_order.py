"""AggregateTransformOrder moves a matrix product to the narrow end of an aggregation
chain and preserves results and gradients."""
import numpy as np
import pytest

import ngnn as ng
from ngnn import nn
from ngnn.op_graph import Aggregate, Gather

from test_fusion import random_graph


def chain(g, x, w, order, reduce="sum", at="dst", seed=0):
    """A GCN-like chain: row scales around a weighted aggregation, and a product with w,
    written aggregate-first or transform-first."""
    rng = np.random.default_rng(seed)
    by = "src" if at == "dst" else "dst"
    edge_w = ng.constant(rng.uniform(0.5, 1.5, (g.num_edges, 1)).astype(np.float32))
    node_s = ng.constant(rng.uniform(0.5, 1.5, (g.num_nodes, 1)).astype(np.float32))
    pre = x * node_s
    if order == "aggregate":
        agg = Aggregate(Gather(pre, g, by) * edge_w, g, at, reduce)
        return ng.dot(agg / node_s, w)
    agg = Aggregate(edge_w * Gather(ng.dot(pre, w), g, by), g, at, reduce)
    return agg / node_s


def gathered_widths(comp, pass_name):
    """Feature widths of the gathers in the IR right after `pass_name`."""
    text = comp.ir_after(pass_name)
    return sorted(int(line.split("Float32[E,")[1].split("]")[0])
                  for line in text.splitlines() if "edge::gather" in line)


def build(g, f_in, f_out, order, reduce, at, seed):
    rng = np.random.default_rng(seed)
    x = ng.placeholder((g.num_nodes, f_in), name="x")
    w = ng.variable((f_in, f_out), name="w", initial_value=rng.normal(size=(f_in, f_out)))
    out = chain(g, x, w, order, reduce, at, seed)
    target = ng.constant(rng.normal(size=out.shape).astype(np.float32))
    loss = ng.sum(ng.tanh(out) * target)
    return x, w, [loss, out] + list(ng.grad(loss, [w, x]))


@pytest.mark.parametrize("order,f_in,f_out,moved", [
    ("aggregate", 12, 3, True),      # W shrinks the columns: transform first
    ("aggregate", 3, 12, False),     # already narrow on the edges, forward and backward
    ("transform", 3, 12, True),      # W grows them: aggregate first
    ("transform", 12, 3, False),
])
def test_every_gather_of_a_training_step_moves_to_the_narrow_side(order, f_in, f_out, moved):
    g = random_graph(np.random.default_rng(1))
    x, w, results = build(g, f_in, f_out, order, "sum", "dst", 0)
    with ng.transformers.make_transformer("numpy") as t:
        comp = t.computation(results, x)
        comp(np.ones(x.shape, np.float32))
        assert "AggregateTransformOrder" in [name for name, _ in comp.ir_history]
        before = gathered_widths(comp, "CSE")
        after = gathered_widths(comp, "AggregateTransformOrder")
    assert (max(before) == max(f_in, f_out)) == moved
    assert set(after) == {min(f_in, f_out)}


@pytest.mark.parametrize("seed", range(6))
def test_results_and_gradients_are_preserved(transformer_factory, seed):
    rng = np.random.default_rng(seed)
    g = random_graph(rng, n=int(rng.integers(8, 40)), e=int(rng.integers(20, 200)), isolated=3)
    f_in, f_out = (int(v) for v in rng.integers(1, 20, 2))
    order = ("aggregate", "transform")[seed % 2]
    reduce, at = ("sum", "mean")[seed // 2 % 2], ("dst", "src")[seed // 3 % 2]
    x, w, results = build(g, f_in, f_out, order, reduce, at, seed)
    xv = rng.normal(size=x.shape).astype(np.float32)
    outputs = []
    for on in (True, False):
        t = transformer_factory(aggregate_transform_order=on)
        outputs.append(t.computation(results, x)(xv))
    for a, b in zip(*outputs):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_can_be_turned_off():
    g = random_graph(np.random.default_rng(2))
    x, w, results = build(g, 12, 3, "aggregate", "sum", "dst", 0)
    with ng.transformers.make_transformer("numpy", aggregate_transform_order=False) as t:
        comp = t.computation(results[1], x)
        comp(np.ones(x.shape, np.float32))
        assert "AggregateTransformOrder" not in [name for name, _ in comp.ir_history]


def test_a_vertex_program_written_aggregate_first_gathers_the_narrower_side_both_ways():
    """A user's GCN-like layer aggregates 24 features, then applies W (24 -> 4): the pass
    gathers 4 features in the forward, and in the backward, whose product with W^T
    widens 4 -> 24, aggregates first."""
    g = random_graph(np.random.default_rng(3))
    w = ng.variable((24, 4), name="w", initial_value=np.random.default_rng(0).normal(size=(24, 4)))
    x = ng.placeholder((g.num_nodes, 24), name="x")
    with ng.zoomIn(g, node_feat={"h": x}) as v:
        rst = (sum(n.h * nn.layers.inv_sqrt_degree(n.outdegree) for n in v.innbs) *
               nn.layers.inv_sqrt_degree(v.indegree)) @ w
    out = ng.zoomOut(rst)
    loss = ng.sum(out * out)
    results = [loss] + list(ng.grad(loss, [w, x]))
    with ng.transformers.make_transformer("numpy") as t:
        comp = t.computation(results, x)
        comp(np.ones(x.shape, np.float32))
        assert set(gathered_widths(comp, "CSE")) == {24}
        assert set(gathered_widths(comp, "AggregateTransformOrder")) == {4}
