"""EdgeSumsByVertex: a sum over the edge axis runs as a per-vertex aggregation and a sum over
the vertices, inside the group that makes its terms, so the (E, ...) terms are not stored."""
import numpy as np

import ngnn as ng
from ngnn import transformers as ngt
from ngnn.op_graph import Aggregate, Sum

from helpers import check_gradient

SRC = np.array([0, 1, 2, 3, 0, 2, 4, 4, 1, 1])
DST = np.array([1, 2, 3, 0, 3, 1, 1, 1, 1, 0])     # vertex 4 has no in-edge
rng = np.random.default_rng(7)


def edge_term_sum(g, x, w):
    """A parameter used per edge: its terms summed over the edges (and its heads)."""
    terms = ng.tanh(ng.gather(x, g, by="src") + ng.gather(x, g, by="dst")) * w
    return ng.sum(terms, axis=0) + ng.sum(terms * terms)


def test_a_sum_over_edges_equals_the_sum_and_its_gradient(transformer_factory):
    g = ng.Graph.from_edges(SRC, DST, num_nodes=5)
    x, w = rng.standard_normal((5, 3)), rng.standard_normal((3,))
    xp = ng.placeholder(x.shape, dtype=np.float64, name="x")
    wp = ng.placeholder(w.shape, dtype=np.float64, name="w")
    got = transformer_factory().computation(edge_term_sum(g, xp, wp), xp, wp)(x, w)
    terms = np.tanh(x[SRC] + x[DST]) * w
    np.testing.assert_allclose(got, terms.sum(axis=0) + (terms * terms).sum(), rtol=1e-12)
    check_gradient(lambda a, b: edge_term_sum(g, a, b), [x, w], transformer_factory)


def planned(results, *placeholders):
    with ngt.make_transformer("numpy") as t:
        comp = t.computation(results, *placeholders)
        comp.transform()
        return comp


def test_the_terms_are_summed_per_vertex_inside_their_group():
    g = ng.Graph.from_edges(SRC, DST, num_nodes=5)
    x = ng.placeholder((5, 3), dtype=np.float64, name="x")
    w = ng.placeholder((3,), dtype=np.float64, name="w")
    comp = planned(edge_term_sum(g, x, w), x, w)
    sums = [op for op in comp.ordered_ops if isinstance(op, Sum) and 0 in op.axes]
    assert sums and all(isinstance(op.args[0], Aggregate) for op in sums), comp.ir
    assert not [op for op in comp.memory_plan.slots if op.shape[:1] == (g.num_edges,)]


def test_a_graph_with_more_vertices_than_edges_keeps_the_sum_over_edges():
    """There the per-vertex sums would be the larger tensor."""
    g = ng.Graph.from_edges(SRC[:3], DST[:3], num_nodes=5)
    x = ng.placeholder((5, 3), dtype=np.float64, name="x")
    comp = planned(ng.sum(ng.gather(x, g, by="src") * 2.0, axis=0), x)
    assert not any(isinstance(op, Aggregate) for op in comp.ordered_ops), comp.ir
