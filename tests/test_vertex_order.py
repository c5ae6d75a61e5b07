"""Graph.reorder / Graph.permute and the vertex orders: the renumbered graph is the same
graph under `order`, models on it compute the same values permuted, and bad input errors."""
import sys
from types import SimpleNamespace

import numpy as np
import pytest

import ngnn as ng
from ngnn import nn
from ngnn.vertex_order import POLICIES, inverse


def random_graph(n=40, e=160, seed=0):
    """Skewed degrees, self loops, parallel edges and a few isolated vertices."""
    rng = np.random.default_rng(seed)
    src = (rng.random(e) ** 2 * (n - 3)).astype(np.int64)
    dst = rng.integers(0, n - 3, e)
    src[:4] = dst[:4]
    src[4:6], dst[4:6] = src[6], dst[6]
    return ng.Graph.from_edges(src, dst, num_nodes=n)


@pytest.mark.parametrize("policy", POLICIES)
def test_reordered_graph_is_the_same_graph_under_order(policy):
    g = random_graph()
    g2, order = g.reorder(policy, num_parts=3)
    assert order.dtype == np.int64 and np.array_equal(np.sort(order), np.arange(g.num_nodes))
    # Vertex k of g2 is vertex order[k] of g, edge i of g2 is edge i of g.
    np.testing.assert_array_equal(order[g2.src], g.src)
    np.testing.assert_array_equal(order[g2.dst], g.dst)
    np.testing.assert_array_equal(g2.in_degrees, g.in_degrees[order])
    np.testing.assert_array_equal(inverse(order)[order], np.arange(g.num_nodes))
    # The moved CSR groups are exactly what building the graph from its edges gives.
    built = ng.Graph.from_edges(g2.src, g2.dst, num_nodes=g.num_nodes)
    for name in ("in_indptr", "in_eids", "in_src", "out_indptr", "out_eids", "out_dst",
                 "out_degrees"):
        np.testing.assert_array_equal(getattr(g2, name), getattr(built, name), err_msg=name)
    assert g2.fingerprint == built.fingerprint


@pytest.mark.parametrize("seed", range(5))
def test_permute_by_any_order_equals_building_from_the_renumbered_edges(seed):
    g = random_graph(n=30, e=90, seed=seed)
    order = np.random.default_rng(seed).permutation(g.num_nodes)
    rank = inverse(order)
    g2 = g.permute(order)
    built = ng.Graph.from_edges(rank[g.src], rank[g.dst], num_nodes=g.num_nodes)
    for name in ("src", "dst", "in_indptr", "in_eids", "in_src", "in_degrees", "out_indptr",
                 "out_eids", "out_dst", "out_degrees"):
        np.testing.assert_array_equal(getattr(g2, name), getattr(built, name), err_msg=name)
    np.testing.assert_array_equal(g2.adjacency().toarray(),
                                  g.adjacency().toarray()[np.ix_(order, order)])


def test_degree_order_is_descending_total_degree_with_ties_in_id_order():
    g = random_graph(seed=1)
    g2, order = g.reorder("degree")
    total = g.in_degrees + g.out_degrees
    assert np.all(np.diff(total[order]) <= 0)
    ties = total[order][1:] == total[order][:-1]
    assert np.all(order[1:][ties] > order[:-1][ties])
    assert np.array_equal(g2.in_degrees + g2.out_degrees, total[order])


def grid(side, seed):
    """A side x side grid graph (both directions) with shuffled vertex ids."""
    ids = np.arange(side * side).reshape(side, side)
    pairs = np.concatenate([np.stack([ids[:, :-1].ravel(), ids[:, 1:].ravel()], 1),
                            np.stack([ids[:-1].ravel(), ids[1:].ravel()], 1)])
    shuffle = np.random.default_rng(seed).permutation(side * side)
    src, dst = shuffle[pairs[:, 0]], shuffle[pairs[:, 1]]
    return ng.Graph.from_edges(np.concatenate([src, dst]), np.concatenate([dst, src]),
                               num_nodes=side * side)


def bandwidth(g):
    return int(np.abs(g.src - g.dst).max())


def test_rcm_gives_a_small_bandwidth():
    g = grid(12, seed=2)
    g2, _ = g.reorder("rcm")
    assert bandwidth(g) > 60 and bandwidth(g2) <= 2 * 12


def test_metis_numbers_vertices_part_by_part():
    # Two 10-cliques joined by one edge: METIS cuts that edge, so each clique is contiguous.
    a, b = np.meshgrid(np.arange(10), np.arange(10))
    keep = a != b
    clique_src, clique_dst = a[keep], b[keep]
    shuffle = np.random.default_rng(3).permutation(20)
    src = shuffle[np.concatenate([clique_src, clique_src + 10, [9]])]
    dst = shuffle[np.concatenate([clique_dst, clique_dst + 10, [10]])]
    g = ng.Graph.from_edges(src, dst, num_nodes=20)
    _, order = g.reorder("metis", num_parts=2)
    clique = (np.argsort(shuffle) >= 10).astype(int)    # which clique each vertex is in
    assert sorted(clique[order[:10]]) == [clique[order[0]]] * 10


def test_gcn_on_the_reordered_graph_gives_the_outputs_permuted(transformer_factory):
    g = random_graph(seed=4).add_self_loops()
    g2, order = g.reorder("degree")
    x = np.random.default_rng(5).standard_normal((g.num_nodes, 6))
    h = ng.placeholder(x.shape, dtype=np.float64, name="h")
    layer = nn.GCNConv(6, 4, seed=0, dtype=np.float64)
    probe = np.random.default_rng(6).standard_normal((g.num_nodes, 4))
    t = transformer_factory()
    results = []
    for graph, feed, weights in ((g, x, probe), (g2, x[order], probe[order])):
        out = layer(graph, h)
        grads = ng.grad(ng.sum(out * ng.constant(weights, dtype=np.float64)),
                        layer.parameters())
        results.append(t.computation([out] + grads, h)(feed))
    (out, *grads), (out2, *grads2) = results
    np.testing.assert_allclose(out2, out[order], rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(out2[inverse(order)], out, rtol=1e-12, atol=1e-14)
    for a, b in zip(grads, grads2):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-13)


def test_edge_features_keep_their_order():
    g = random_graph(seed=7)
    g2, order = g.reorder("rcm")
    x = np.random.default_rng(8).standard_normal((g.num_nodes, 3))
    w = np.random.default_rng(9).standard_normal((g.num_edges, 1))
    outs = []
    for graph, feed in ((g, x), (g2, x[order])):
        h = ng.placeholder(x.shape, dtype=np.float64, name="h")
        ew = ng.placeholder(w.shape, dtype=np.float64, name="w")
        out = ng.saga(graph, node_feat={"h": h}, edge_feat={"w": ew},
                      apply_edge=lambda src, dst, edge: src.h * edge.w - dst.h)
        with ng.transformers.make_transformer("numpy") as t:
            outs.append(t.computation(out, h, ew)(feed, w))
    np.testing.assert_allclose(outs[1], outs[0][order], rtol=1e-12)


def test_empty_and_single_vertex_graphs():
    for n in (0, 1):
        g = ng.Graph.from_edges([], [], num_nodes=n)
        for policy in POLICIES:
            g2, order = g.reorder(policy, num_parts=1)
            assert g2.num_nodes == n and order.shape == (n,)


# ---- bad input ---------------------------------------------------------------------------------

def test_unknown_policy_names_the_closest():
    g = random_graph()
    with pytest.raises(ValueError, match=r"unknown policy 'degrees' \(did you mean 'degree'\?\); "
                                         r"policies: degree, rcm, metis"):
        g.reorder("degrees")
    with pytest.raises(ValueError, match="unknown policy None"):
        g.reorder(None)
    for bad in (0, -2, 2.5, True):
        with pytest.raises(ValueError, match="num_parts must be a positive int"):
            g.reorder("metis", num_parts=bad)
    with pytest.raises(ValueError, match="41 METIS parts for 40 vertices"):
        g.reorder("metis", num_parts=41)


def test_metis_without_pymetis_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "pymetis", None)      # import pymetis raises ImportError
    with pytest.raises(ValueError, match="needs the pymetis package: pip install pymetis"):
        random_graph().reorder("metis")


def test_blocks_slots_and_local_graphs_are_not_renumbered():
    block = ng.Graph.from_edges([2, 3], [0, 1], num_nodes=4, num_dst=2)
    with pytest.raises(ValueError, match="reorder: .* is a Graph \\(a block"):
        block.reorder("degree")
    from ngnn.sampling.slot import GraphSlot
    with pytest.raises(ValueError, match="permute: .* is a GraphSlot"):
        GraphSlot(4, 3).permute(np.arange(4))
    from ngnn.distributed.local_graph import LocalGraph
    local = LocalGraph([0], [1], 2, [5, 7], [3], 2, 8, 4, exchange=SimpleNamespace(rank=1))
    with pytest.raises(ValueError, match="reorder: .* is a LocalGraph"):
        local.reorder("rcm")


@pytest.mark.parametrize("order, message", [
    (np.arange(5), r"order must have shape \(40,\)"),
    (np.arange(40.0), "order must hold integer vertex ids"),
    (np.arange(1, 41), r"order\[39\] = 40 is not a vertex id in \[0, 40\)"),
    (np.r_[0, np.arange(39)], "not a permutation: vertex 0 appears 2 times"),
])
def test_permute_checks_the_order(order, message):
    with pytest.raises(ValueError, match=message):
        random_graph().permute(order)
