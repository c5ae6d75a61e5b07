"""Relation-typed edges: Graph(edge_type=), `e.type`, `W[e.type]` and its three lowerings
(per_relation, segments, transform_first), against NumPy on every backend, with
finite-difference gradients, and no E x F x O tensor in any plan."""
import numpy as np
import pytest

import ngnn as ng
from ngnn import nn
from ngnn.errors import TracingError
from ngnn.frontend.relations import strategy_bytes
from ngnn.op_graph import ShapeError
from ngnn.relations import relation_edges, relation_norm, relation_subgraph

from helpers import check_gradient


def typed_graph(num_nodes, num_edges, num_relations, seed=0):
    rng = np.random.default_rng(seed)
    src = rng.integers(0, num_nodes, num_edges)
    dst = rng.integers(0, num_nodes, num_edges)
    types = rng.integers(0, num_relations, num_edges)
    return ng.Graph.from_edges(src, dst, num_nodes=num_nodes, edge_type=types,
                               num_relations=num_relations)


# ---- typed graphs -------------------------------------------------------------------------

@pytest.mark.parametrize("edge_type, num_relations, message", [
    (np.array([0.0, 1.0, 1.0]), 2, "must hold integer relation ids, got dtype float64"),
    (np.array([True, False, True]), 2, "must hold integer relation ids, got dtype bool"),
    (np.array([0, 1]), 2, r"one relation id per edge \(3 edges\), got shape \(2,\)"),
    (np.array([[0, 1, 1]]), 2, r"one relation id per edge \(3 edges\), got shape \(1, 3\)"),
    (np.array([0, 3, 1]), 3, r"edge_type\[1\] = 3 is out of range \[0, 3\)"),
    (np.array([0, -1, 1]), 3, r"edge_type\[1\] = -1 is out of range \[0, 3\)"),
    (np.array([0, 1, 1]), 0, "num_relations must be a positive int, got 0"),
    (np.array([0, 1, 1]), 2.0, "num_relations must be a positive int, got 2.0"),
    (np.array([0, 1, 1]), True, "num_relations must be a positive int, got True"),
    (None, 2, "num_relations was given without edge_type"),
])
def test_bad_edge_types_are_named(edge_type, num_relations, message):
    with pytest.raises(ValueError, match=message):
        ng.Graph.from_edges([0, 1, 2], [1, 2, 0], num_nodes=3, edge_type=edge_type,
                            num_relations=num_relations)


def test_typed_graph_facts():
    g = ng.Graph.from_edges([0, 1, 2], [1, 2, 0], edge_type=np.array([2, 0, 2], np.uint8))
    assert g.num_relations == 3 and g.edge_type.dtype == np.int64
    assert not g.edge_type.flags.writeable
    plain = ng.Graph.from_edges([0, 1, 2], [1, 2, 0])
    assert plain.edge_type is None and plain.fingerprint != g.fingerprint
    assert "num_relations=3" in repr(g)
    g2, order = g.reorder("degree")
    assert np.array_equal(g2.edge_type, g.edge_type)
    for make in (g.add_self_loops, g.with_self_loops, g.to_undirected):
        with pytest.raises(ValueError, match="has edge types, which the new edges would lack"):
            make()


def test_relation_norm_is_one_over_edges_of_the_relation_at_the_destination():
    g = ng.Graph.from_edges([0, 1, 2, 0], [1, 1, 1, 2], edge_type=[0, 0, 1, 0],
                            num_relations=2)
    assert relation_norm(g).tolist() == [0.5, 0.5, 1.0, 1.0]


# ---- tracing errors -----------------------------------------------------------------------

def test_e_type_of_an_untyped_graph_is_an_error():
    g = ng.Graph.from_edges([0, 1], [1, 0])
    h = ng.placeholder((2, 3), name="h")
    with pytest.raises(AttributeError, match="has no edge types; build it with"):
        with ng.zoomIn(g, node_feat=[h]) as v:
            [e.type for e in v.inedges]


def test_relation_weight_with_the_wrong_number_of_rows_is_an_error():
    g = typed_graph(4, 6, 3)
    h = ng.placeholder((4, 2), name="h")
    W = ng.variable((2, 2, 5), name="W")
    with pytest.raises(ShapeError, match=r"one row per relation \(3\)"):
        with ng.zoomIn(g, node_feat=[h]) as v:
            sum(ng.dot(n.h, W[e.type]) for n, e in zip(v.innbs, v.inedges))


def test_indexing_by_another_tensor_is_an_error():
    g = typed_graph(4, 6, 3)
    h = ng.placeholder((4, 3), name="h")
    W = ng.variable((3, 3, 5), name="W")
    with pytest.raises(TracingError, match=r"indexed by the edge type only, as W\[e.type\]"):
        with ng.zoomIn(g, node_feat=[h]) as v:
            [W[e.type + 0] for e in v.inedges]
    with pytest.raises(TypeError, match="only W\\[e.type\\] inside ng.zoomIn"):
        W[ng.constant(np.array([0, 1]))]


# ---- the three lowerings ------------------------------------------------------------------

def reference(g, x, W, norm, reduce):
    messages = np.einsum("ef,efo->eo", x[g.src], W[g.edge_type]) * norm
    out = np.zeros((g.num_nodes, W.shape[2]))
    if reduce == "sum":
        np.add.at(out, g.dst, messages)
        return out
    out[:] = -np.inf
    np.maximum.at(out, g.dst, messages)
    out[np.isinf(out)] = 0
    return out


def typed_messages(g, h, W, reduce):
    norm = ng.constant(relation_norm(g).reshape(-1, 1), dtype=h.dtype)
    with ng.zoomIn(g, node_feat={"h": h}, edge_feat={"norm": norm}) as v:
        messages = [ng.dot(n.h, W[e.type]) * e.norm for n, e in zip(v.innbs, v.inedges)]
        out = sum(messages) if reduce == "sum" else ng.max(messages)
    return ng.zoomOut(out)


# (nodes, edges, relations, in, out, aggregation) -> the lowering the bytes choose
CASES = {"per_relation": (7, 20, 3, 4, 5, "sum"),
         "segments": (50, 30, 8, 3, 4, "max"),
         "transform_first": (5, 60, 2, 8, 3, "max")}


@pytest.mark.parametrize("strategy", list(CASES))
def test_lowering_is_chosen_by_bytes_and_computes_the_product(transformer_factory, strategy):
    N, E, R, F, O, reduce = CASES[strategy]
    g = typed_graph(N, E, R, seed=1)
    rng = np.random.default_rng(2)
    x, Wv = rng.standard_normal((N, F)), rng.standard_normal((R, F, O))
    h = ng.placeholder((N, F), dtype=np.float64, name="h")
    W = ng.placeholder((R, F, O), dtype=np.float64, name="W")
    comp = transformer_factory().computation(typed_messages(g, h, W, reduce), h, W)
    expected = reference(g, x, Wv, relation_norm(g)[:, None], reduce)
    np.testing.assert_allclose(comp(x, Wv), expected, rtol=1e-12, atol=1e-12)
    assert f"%relation_{strategy}" in comp.ir
    costs = strategy_bytes(g, h, W, split=reduce == "sum")
    assert min(costs, key=costs.get) == strategy


@pytest.mark.parametrize("strategy", list(CASES))
def test_gradients_of_the_relation_weights_and_the_features(transformer_factory, strategy):
    N, E, R, F, O, reduce = CASES[strategy]
    g = typed_graph(N, E, R, seed=3)
    rng = np.random.default_rng(4)
    check_gradient(lambda h, W: typed_messages(g, h, W, reduce),
                   [rng.standard_normal((N, F)), rng.standard_normal((R, F, O))],
                   transformer_factory)


def test_gradients_of_basis_coefficients_and_bases(transformer_factory):
    """W_r = sum_b a[r, b] V_b: gradients reach a and V through the relation-indexed product."""
    N, E, R, F, O, B = 6, 18, 4, 3, 2, 2
    g = typed_graph(N, E, R, seed=5)
    rng = np.random.default_rng(6)

    def build(h, a, V):
        W = ng.reshape(ng.dot(a, ng.reshape(V, (B, F * O))), (R, F, O))
        return typed_messages(g, h, W, "sum")
    check_gradient(build, [rng.standard_normal((N, F)), rng.standard_normal((R, B)),
                           rng.standard_normal((B, F, O))], transformer_factory)


def test_a_relation_indexed_bias_is_gathered_onto_the_edges(transformer_factory):
    g = typed_graph(5, 12, 3, seed=7)
    rng = np.random.default_rng(8)
    bv = rng.standard_normal((3, 2))
    b = ng.placeholder((3, 2), dtype=np.float64, name="b")
    with ng.zoomIn(g) as v:
        out = sum(b[e.type] for e in v.inedges)
    comp = transformer_factory().computation(ng.zoomOut(out), b)
    expected = np.zeros((5, 2))
    np.add.at(expected, g.dst, bv[g.edge_type])
    np.testing.assert_allclose(comp(bv), expected, rtol=1e-12, atol=1e-12)

    def squares(b):
        with ng.zoomIn(g) as v:
            out = sum(b[e.type] * b[e.type] for e in v.inedges)
        return ng.zoomOut(out)
    check_gradient(squares, [bv], transformer_factory)


def test_an_rgcn_training_step_allocates_nothing_edge_by_weight_sized(transformer_factory):
    """Neither E x F x O nor E x O x F, anywhere in the planned computation."""
    N, E, R, F, O, C = 30, 400, 5, 7, 6, 3
    g = typed_graph(N, E, R, seed=9)
    model = nn.RGCN(F, O, C, num_relations=R, num_bases=2)
    x = ng.placeholder((N, F), name="x")
    labels = ng.placeholder((N,), dtype=np.int64, name="y")
    loss = ng.cross_entropy(model(g, x, training=True), labels)
    grads = ng.grad(loss, model.parameters())
    comp = transformer_factory().computation([loss] + grads, x, labels)
    comp(np.random.default_rng(0).standard_normal((N, F)).astype(np.float32),
         np.arange(N) % C)
    too_big = [op for op in comp.ordered_ops if op.size >= E * min(F, O) * min(F, O)]
    assert too_big == []
    assert max(comp.memory_plan.buffer_bytes) < E * F * O * 4


@pytest.mark.parametrize("reduce", ["sum", "max"])
def test_products_over_out_edges(transformer_factory, reduce):
    """v.outnbs: the neighbour is each edge's destination, the result lands at its source."""
    N, E, R, F, O = 6, 25, 3, 2, 3
    g = typed_graph(N, E, R, seed=10)
    rng = np.random.default_rng(12)
    x, Wv = rng.standard_normal((N, F)), rng.standard_normal((R, F, O))
    h = ng.placeholder((N, F), dtype=np.float64, name="h")
    W = ng.placeholder((R, F, O), dtype=np.float64, name="W")
    with ng.zoomIn(g, node_feat={"h": h}) as v:
        messages = [ng.dot(n.h, W[e.type]) for n, e in zip(v.outnbs, v.outedges)]
        out = ng.zoomOut(sum(messages) if reduce == "sum" else ng.max(messages))
    messages = np.einsum("ef,efo->eo", x[g.dst], Wv[g.edge_type])
    expected = np.zeros((N, O))
    if reduce == "sum":
        np.add.at(expected, g.src, messages)
    else:
        expected[:] = -np.inf
        np.maximum.at(expected, g.src, messages)
        expected[np.isinf(expected)] = 0
    comp = transformer_factory().computation(out, h, W)
    np.testing.assert_allclose(comp(x, Wv), expected, rtol=1e-12, atol=1e-12)


# ---- v.innbs.of_type(r) / v.inedges.of_type(r) ---------------------------------------------

def per_relation_reference(g, x, w, Wv, at, reduce):
    """sum over r of reduce_{edges of relation r at the vertex} (x[other end] @ W[r]) * w."""
    ends, others = (g.dst, g.src) if at == "dst" else (g.src, g.dst)
    messages = np.einsum("ef,efo->eo", x[others], Wv[g.edge_type]) * w
    out = np.zeros((g.num_nodes, Wv.shape[2]))
    for r in range(g.num_relations):
        mine = g.edge_type == r
        total = np.zeros_like(out)
        np.add.at(total, ends[mine], messages[mine])
        if reduce == "mean":
            total /= np.maximum(np.bincount(ends[mine], minlength=g.num_nodes), 1)[:, None]
        out += total
    return out


def per_relation_means(g, h, w, W, edges):
    """R-GCN's sum_r (1 / c_{i,r}) sum_{j in N_i^r} W_r h_j, written per vertex: a mean
    over each relation's neighbours (W[e.type] there is W[r]), scaled by an edge feature."""
    with ng.zoomIn(g, node_feat={"h": h}, edge_feat={"w": w}) as v:
        if edges == "in":
            out = sum(ng.mean([ng.dot(n.h, W[e.type]) * e.w for n, e in
                               zip(v.innbs.of_type(r), v.inedges.of_type(r))])
                      for r in range(g.num_relations))
        else:
            out = sum(ng.mean([ng.dot(n.h, W[r]) * e.w for n, e in
                               zip(v.outnbs.of_type(r), v.outedges.of_type(r))])
                      for r in range(g.num_relations))
    return ng.zoomOut(out)


@pytest.mark.parametrize("edges", ["in", "out"])
def test_of_type_aggregates_over_one_relation(transformer_factory, edges):
    N, E, R, F, O = 9, 40, 4, 3, 2
    g = typed_graph(N, E, R, seed=13)
    rng = np.random.default_rng(14)
    x, Wv, wv = (rng.standard_normal((N, F)), rng.standard_normal((R, F, O)),
                 rng.standard_normal((E, 1)))
    h = ng.placeholder((N, F), dtype=np.float64, name="h")
    W = ng.placeholder((R, F, O), dtype=np.float64, name="W")
    w = ng.placeholder((E, 1), dtype=np.float64, name="w")
    comp = transformer_factory().computation(per_relation_means(g, h, w, W, edges), h, w, W)
    expected = per_relation_reference(g, x, wv, Wv, "dst" if edges == "in" else "src", "mean")
    np.testing.assert_allclose(comp(x, wv, Wv), expected, rtol=1e-12, atol=1e-12)
    # Nothing computed over all E edges: every term runs over its relation's edges.
    assert not [op for op in comp.ordered_ops if op.shape[:1] == (E,) and op is not w]


def test_of_type_mean_equals_the_relation_norm_form(transformer_factory):
    """The per-vertex mean and the per-edge 1 / c_{i,r} of relation_norm agree, and a
    relation without edges at a vertex (or anywhere) contributes 0."""
    N, E, R, F, O = 8, 14, 5, 3, 2
    g = typed_graph(N, E, R - 1, seed=15)       # relation R - 1 has no edges at all
    g = ng.Graph.from_edges(g.src, g.dst, num_nodes=N, edge_type=g.edge_type, num_relations=R)
    rng = np.random.default_rng(16)
    x, Wv = rng.standard_normal((N, F)), rng.standard_normal((R, F, O))
    h = ng.placeholder((N, F), dtype=np.float64, name="h")
    W = ng.placeholder((R, F, O), dtype=np.float64, name="W")
    with ng.zoomIn(g, node_feat={"h": h}) as v:
        out = sum(ng.mean([ng.dot(n.h, W[r]) for n in v.innbs.of_type(r)]) for r in range(R))
    comp = transformer_factory().computation(ng.zoomOut(out), h, W)
    expected = reference(g, x, Wv, relation_norm(g)[:, None], "sum")
    np.testing.assert_allclose(comp(x, Wv), expected, rtol=1e-12, atol=1e-12)


def test_of_type_max_and_gradients(transformer_factory):
    N, E, R, F, O = 6, 24, 3, 2, 3
    g = typed_graph(N, E, R, seed=17)
    rng = np.random.default_rng(18)

    def build(h, W, w):
        return per_relation_means(g, h, w, W, "in")
    check_gradient(build, [rng.standard_normal((N, F)), rng.standard_normal((R, F, O)),
                           rng.standard_normal((E, 1))], transformer_factory)
    x, Wv = rng.standard_normal((N, F)), rng.standard_normal((R, F, O))
    h = ng.placeholder((N, F), dtype=np.float64, name="h")
    W = ng.placeholder((R, F, O), dtype=np.float64, name="W")
    with ng.zoomIn(g, node_feat={"h": h}) as v:
        out = ng.zoomOut(sum(ng.max([ng.dot(n.h, W[r]) for n in v.innbs.of_type(r)])
                             for r in range(R)))
    comp = transformer_factory().computation(out, h, W)
    expected = np.zeros((N, O))
    for r in range(R):
        mine = g.edge_type == r
        best = np.full((N, O), -np.inf)
        np.maximum.at(best, g.dst[mine], x[g.src[mine]] @ Wv[r])
        expected += np.where(np.isinf(best), 0, best)
    np.testing.assert_allclose(comp(x, Wv), expected, rtol=1e-12, atol=1e-12)


def test_values_read_through_of_type_without_features_keep_the_relation(transformer_factory):
    """e.type and a neighbour's degree read through .of_type(r) are aggregated over
    relation r's edges too: b[e.type] there is b's row r."""
    g = typed_graph(6, 30, 3, seed=22)
    rng = np.random.default_rng(23)
    bv = rng.standard_normal((3, 2))
    b = ng.placeholder((3, 2), dtype=np.float64, name="b")
    with ng.zoomIn(g) as v:
        out = ng.zoomOut(sum(sum(b[e.type] for e in v.inedges.of_type(r)) * (r + 1.0)
                             for r in range(3)))
        degrees = ng.zoomOut(sum(sum(n.outdegree for n in v.innbs.of_type(r)) * (r + 1.0)
                                 for r in range(3)))
    comp = transformer_factory().computation([out, degrees], b)
    got, got_degrees = comp(bv)
    expected = np.zeros((6, 2))
    np.add.at(expected, g.dst, bv[g.edge_type] * (g.edge_type[:, None] + 1.0))
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)
    expected_degrees = np.zeros(6)
    np.add.at(expected_degrees, g.dst, g.out_degrees[g.src] * (g.edge_type + 1.0))
    np.testing.assert_allclose(got_degrees, expected_degrees, rtol=1e-12, atol=1e-12)


def test_of_type_errors_are_named():
    g = typed_graph(4, 6, 3)
    h = ng.placeholder((4, 2), name="h")
    plain = ng.Graph.from_edges([0, 1], [1, 0])
    with pytest.raises(TracingError, match=r"of_type\(0\): .* has no edge types"):
        with ng.zoomIn(plain) as v:
            v.innbs.of_type(0)
    for bad in (3, -1, 1.0, True):
        with pytest.raises(TracingError, match=r"must be a Python int in \[0, 3\)"):
            with ng.zoomIn(g, node_feat=[h]) as v:
                v.inedges.of_type(bad)
    with pytest.raises(TracingError, match=r"reads the edges of relations \[0, 1\] at once"):
        with ng.zoomIn(g, node_feat=[h]) as v:
            ng.mean([n.h + m.h for n, m in zip(v.innbs.of_type(0), v.innbs.of_type(1))])
    with pytest.raises(TracingError, match=r"zoomOut of a value read through .of_type\(2\)"):
        with ng.zoomIn(g, node_feat=[h]) as v:
            ng.zoomOut([n.h for n in v.innbs.of_type(2)])


@pytest.mark.parametrize("num_dst", [None, 5])
def test_relation_subgraphs_are_views_equal_to_graphs_of_their_edges(num_dst):
    """Each relation's subgraph equals ng.Graph built from that relation's edges (ordered
    by destination), while its arrays are slices of arrays all subgraphs share."""
    rng = np.random.default_rng(19)
    N, E, R = 9, 60, 4
    src, types = rng.integers(0, N, E), rng.integers(0, R - 1, E)   # relation 3: no edges
    dst = rng.integers(0, num_dst or N, E)
    g = ng.Graph.from_edges(src, dst, num_nodes=N, num_dst=num_dst, edge_type=types,
                            num_relations=R)
    subgraphs = [relation_subgraph(g, r) for r in range(R)]
    for r, (sub, eids) in enumerate(zip(subgraphs, relation_edges(g))):
        assert np.array_equal(np.sort(eids), np.flatnonzero(types == r))
        expected = ng.Graph.from_edges(src[eids], dst[eids], num_nodes=N, num_dst=num_dst)
        assert np.all(np.diff(dst[eids] * E + eids) > 0)
        for name in ("src", "dst", "in_indptr", "in_eids", "in_src", "in_degrees",
                     "out_indptr", "out_eids", "out_dst", "out_degrees"):
            assert np.array_equal(getattr(sub, name), getattr(expected, name)), (r, name)
        assert (sub.num_nodes, sub.num_dst) == (expected.num_nodes, expected.num_dst)
    for name in ("src", "in_indptr", "out_eids", "out_dst", "in_degrees"):
        first, second = getattr(subgraphs[0], name), getattr(subgraphs[1], name)
        assert first.base is not None and first.base is second.base, name


# ---- typed graphs through sampled minibatches ----------------------------------------------

def rgcn_outputs_and_gradients(make, model, graphs, x, rows, weights):
    """The model's output at `rows` and the gradients of sum(output * weights) for every
    parameter."""
    h = ng.placeholder(x.shape, dtype=np.float64, name="x")
    out = model(graphs, h)
    picked = ng.dot(ng.constant(np.eye(out.shape[0])[rows]), out)
    loss = ng.sum(picked * ng.constant(weights))
    comp = make().computation([picked] + ng.grad(loss, model.parameters()), h)
    return comp(x)


@pytest.mark.parametrize("fanouts", [[None, None], [3, 2]])
def test_a_sampled_rgcn_step_equals_the_whole_graph_step_on_its_blocks(transformer_factory,
                                                                        fanouts):
    """The sampler's blocks keep the relation of each sampled edge; R-GCN over them gives the
    output and parameter gradients of R-GCN over graphs made of the blocks' edges (with
    every in-edge sampled: of the whole graph, at the seeds)."""
    from ngnn.sampling import NeighborSampler
    N, E, R, F, H, C = 40, 300, 4, 5, 6, 3
    g = typed_graph(N, E, R, seed=20)
    rng = np.random.default_rng(21)
    x = rng.standard_normal((N, F))
    seeds = np.array([3, 17, 25, 8])
    weights = rng.standard_normal((seeds.size, C))
    batch = NeighborSampler(g, fanouts, seed=4).sample(seeds)
    for block, eids in zip(batch.graphs, batch.edge_ids):
        assert block.num_relations == R and block.is_block
        assert np.array_equal(block.edge_type, g.edge_type[eids])
    model = nn.RGCN(F, H, C, num_relations=R, num_bases=2, dtype=np.float64)
    got = rgcn_outputs_and_gradients(transformer_factory, model, batch.graphs,
                                     x[batch.nodes], np.arange(seeds.size), weights)
    if fanouts == [None, None]:
        expected = rgcn_outputs_and_gradients(transformer_factory, model, g, x, seeds, weights)
    else:   # whole graphs of each block's edges over all the batch's vertices
        whole = [ng.Graph.from_edges(b.src, b.dst, num_nodes=batch.nodes.size,
                                     edge_type=b.edge_type, num_relations=R)
                 for b in batch.graphs]
        expected = rgcn_outputs_and_gradients(transformer_factory, model, whole,
                                              x[batch.nodes], np.arange(seeds.size), weights)
    assert len(got) == len(expected) == 1 + len(model.parameters())
    for a, b in zip(got, expected):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)
