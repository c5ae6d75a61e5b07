import networkx as nx
import numpy as np
import pytest
import scipy.sparse as sp

from ngnn.graph import Graph


def random_graph(seed, num_nodes=30, num_edges=120):
    """Random multigraph with self-loops, parallel edges and (usually) isolated vertices."""
    rng = np.random.default_rng(seed)
    # Only the first two thirds of the vertices get edges, so the rest are isolated.
    src = rng.integers(0, num_nodes * 2 // 3, num_edges)
    dst = rng.integers(0, num_nodes * 2 // 3, num_edges)
    src[:5] = dst[:5]                   # self-loops
    src[5:8], dst[5:8] = src[8], dst[8]  # parallel edges
    return Graph.from_edges(src, dst, num_nodes=num_nodes)


def reference_csr(keys, other, num_nodes):
    """Brute force: for every vertex, its edge ids in increasing order."""
    indptr, eids = [0], []
    for v in range(num_nodes):
        mine = [e for e in range(len(keys)) if keys[e] == v]
        eids += mine
        indptr.append(len(eids))
    return np.array(indptr), np.array(eids, dtype=np.int64), other[np.array(eids, dtype=np.int64)]


@pytest.mark.parametrize("seed", range(5))
def test_csr_matches_brute_force(seed):
    g = random_graph(seed)
    indptr, eids, in_src = reference_csr(g.dst, g.src, g.num_nodes)
    np.testing.assert_array_equal(g.in_indptr, indptr)
    np.testing.assert_array_equal(g.in_eids, eids)
    np.testing.assert_array_equal(g.in_src, in_src)
    indptr, eids, out_dst = reference_csr(g.src, g.dst, g.num_nodes)
    np.testing.assert_array_equal(g.out_indptr, indptr)
    np.testing.assert_array_equal(g.out_eids, eids)
    np.testing.assert_array_equal(g.out_dst, out_dst)
    np.testing.assert_array_equal(g.in_degrees, [np.sum(g.dst == v) for v in range(g.num_nodes)])
    np.testing.assert_array_equal(g.out_degrees, [np.sum(g.src == v) for v in range(g.num_nodes)])
    assert np.any(g.in_degrees + g.out_degrees == 0)


@pytest.mark.parametrize("seed", range(3))
def test_permutations_between_orders(seed):
    g = random_graph(seed)
    np.testing.assert_array_equal(g.out_eids[g.in_to_out], g.in_eids)
    np.testing.assert_array_equal(g.in_eids[g.out_to_in], g.out_eids)
    np.testing.assert_array_equal(g.in_to_out[g.out_to_in], np.arange(g.num_edges))


def test_arrays_are_int64_and_read_only():
    g = random_graph(0)
    for name in ("src", "dst", "in_degrees", "out_degrees", "in_indptr", "in_eids", "in_src",
                 "out_indptr", "out_eids", "out_dst", "in_to_out", "out_to_in"):
        array = getattr(g, name)
        assert array.dtype == np.int64, name
        assert not array.flags.writeable, name


def test_input_arrays_are_copied():
    src = np.array([0, 1])
    g = Graph.from_edges(src, np.array([1, 0]))
    src[0] = 1
    assert g.src[0] == 0


def test_zero_edge_graphs():
    g = Graph.from_edges([], [], num_nodes=4)
    assert (g.num_nodes, g.num_edges) == (4, 0)
    np.testing.assert_array_equal(g.in_indptr, np.zeros(5))
    np.testing.assert_array_equal(g.in_degrees, np.zeros(4))
    assert g.incidence("dst").shape == (4, 0)
    assert g.adjacency().shape == (4, 4)
    assert g.in_to_out.shape == (0,)
    empty = Graph.from_edges([], [])
    assert (empty.num_nodes, empty.num_edges) == (0, 0)
    np.testing.assert_array_equal(empty.in_indptr, [0])
    assert empty.add_self_loops().num_edges == 0
    assert empty.to_undirected().num_edges == 0


def test_num_nodes_inferred_from_max_id():
    assert Graph.from_edges([0, 5], [2, 1]).num_nodes == 6


def test_whole_floats_and_unsigned_ids_accepted():
    g = Graph.from_edges(np.array([0.0, 2.0]), np.array([1, 2], dtype=np.uint32))
    np.testing.assert_array_equal(g.src, [0, 2])
    assert g.src.dtype == np.int64


@pytest.mark.parametrize("src, dst, num_nodes, message", [
    ([0.5, 1], [0, 1], None, r"src\[0\] = 0\.5 is not a whole number"),
    ([0, 1], [np.nan, 1], None, "dst must hold integer node ids, got non-finite"),
    (["a", "b"], [0, 1], None, "src must hold integer node ids, got strings"),
    ([True, False], [0, 1], None, "src must hold integer node ids, got booleans"),
    ([[0, 1]], [0, 1], None, r"src must be a 1-D array .* shape \(1, 2\)"),
    ([0, 1, 2], [0, 1], None, "same length, got 3 and 2"),
    ([0, -1], [0, 1], 3, r"src\[1\] = -1 is out of range \[0, 3\)"),
    ([0, 1], [0, 3], 3, r"dst\[1\] = 3 is out of range \[0, 3\)"),
    ([0, 1], [0, 1], -1, "num_nodes must be non-negative, got -1"),
    ([0, 1], [0, 1], 2.5, "num_nodes must be an int, got 2.5"),
    ([0, 1], [0, 1], True, "num_nodes must be an int"),
    ([0], [0], 0, r"src\[0\] = 0 is out of range \[0, 0\)"),
])
def test_validation_errors(src, dst, num_nodes, message):
    with pytest.raises(ValueError, match=message):
        Graph.from_edges(src, dst, num_nodes=num_nodes)


def test_negative_id_without_num_nodes():
    with pytest.raises(ValueError, match=r"dst\[0\] = -2 is out of range"):
        Graph.from_edges([1], [-2])
    with pytest.raises(ValueError, match=r"src\[0\] = -3 is out of range \[0, 0\)"):
        Graph.from_edges([-3], [-2])


@pytest.mark.parametrize("seed", range(3))
def test_incidence_sums_edge_values(seed):
    g = random_graph(seed)
    values = np.random.default_rng(seed).standard_normal((g.num_edges, 3)).astype(np.float32)
    for at, index in (("dst", g.dst), ("src", g.src)):
        expected = np.zeros((g.num_nodes, 3), dtype=np.float32)
        np.add.at(expected, index, values)
        matrix = g.incidence(at)
        assert matrix.shape == (g.num_nodes, g.num_edges)
        np.testing.assert_allclose(matrix @ values, expected, rtol=1e-5, atol=1e-5)
        assert g.incidence(at) is matrix


def test_incidence_rejects_unknown_side():
    with pytest.raises(ValueError, match="'dst' or 'src'"):
        random_graph(0).incidence("both")


def test_adjacency_sums_in_neighbours_with_multiplicity():
    g = random_graph(1)
    features = np.random.default_rng(1).standard_normal((g.num_nodes, 4))
    expected = np.zeros_like(features)
    np.add.at(expected, g.dst, features[g.src])
    np.testing.assert_allclose(g.adjacency() @ features, expected, rtol=1e-5, atol=1e-5)
    assert g.adjacency() is g.adjacency()
    with pytest.raises(ValueError):
        g.adjacency().data[0] = 5


def test_add_self_loops_appends_one_per_vertex():
    g = Graph.from_edges([0, 1], [1, 1], num_nodes=3)
    looped = g.add_self_loops()
    np.testing.assert_array_equal(looped.src, [0, 1, 0, 1, 2])
    np.testing.assert_array_equal(looped.dst, [1, 1, 0, 1, 2])
    assert g.num_edges == 2


def test_to_undirected_dedups_and_keeps_self_loops_once():
    g = Graph.from_edges([0, 0, 1, 2, 2], [1, 1, 0, 2, 3], num_nodes=5)
    u = g.to_undirected()
    pairs = set(zip(u.src.tolist(), u.dst.tolist()))
    assert pairs == {(0, 1), (1, 0), (2, 2), (2, 3), (3, 2)}
    assert u.num_edges == len(pairs)
    assert u.num_nodes == 5


def test_from_scipy_round_trip():
    g = random_graph(2)
    matrix = sp.csr_matrix((np.ones(g.num_edges), (g.src, g.dst)), shape=(g.num_nodes,) * 2)
    back = Graph.from_scipy(matrix)
    assert back.num_nodes == g.num_nodes
    # Parallel edges merge into one stored entry, so compare the sets of edges.
    assert set(zip(back.src.tolist(), back.dst.tolist())) == set(zip(g.src.tolist(), g.dst.tolist()))
    np.testing.assert_array_equal(back.adjacency().toarray(), (matrix.T != 0).toarray())


def test_from_scipy_direction_and_validation():
    g = Graph.from_scipy(sp.coo_matrix(([1.0], ([0], [2])), shape=(3, 3)))
    np.testing.assert_array_equal(g.src, [0])
    np.testing.assert_array_equal(g.dst, [2])
    with pytest.raises(ValueError, match="square"):
        Graph.from_scipy(sp.csr_matrix((2, 3)))
    with pytest.raises(ValueError, match="scipy sparse matrix"):
        Graph.from_scipy(np.eye(2))


def test_from_networkx_directed_relabels_in_node_order():
    G = nx.DiGraph()
    G.add_nodes_from(["c", "a", "b", "lonely"])
    G.add_edges_from([("a", "b"), ("c", "a"), ("b", "b")])
    g = Graph.from_networkx(G)
    assert g.num_nodes == 4
    assert sorted(zip(g.src.tolist(), g.dst.tolist())) == [(0, 1), (1, 2), (2, 2)]


def test_from_networkx_undirected_and_multigraph():
    g = Graph.from_networkx(nx.Graph([(0, 1), (1, 2), (2, 2)]))
    assert sorted(zip(g.src.tolist(), g.dst.tolist())) == [(0, 1), (1, 0), (1, 2), (2, 1), (2, 2)]
    multi = Graph.from_networkx(nx.MultiDiGraph([(0, 1), (0, 1), (1, 0)]))
    assert sorted(zip(multi.src.tolist(), multi.dst.tolist())) == [(0, 1), (0, 1), (1, 0)]


def test_networkx_round_trip():
    g = random_graph(3)
    G = nx.MultiDiGraph()
    G.add_nodes_from(range(g.num_nodes))
    G.add_edges_from(zip(g.src.tolist(), g.dst.tolist()))
    back = Graph.from_networkx(G)
    assert back.num_nodes == g.num_nodes
    assert sorted(zip(back.src.tolist(), back.dst.tolist())) == sorted(zip(g.src.tolist(), g.dst.tolist()))


def test_repr_and_fingerprint():
    g = Graph.from_edges([0, 1], [1, 0], num_nodes=3)
    assert repr(g) == "Graph(num_nodes=3, num_edges=2)"
    same = Graph.from_edges([0, 1], [1, 0], num_nodes=3)
    assert g.fingerprint == same.fingerprint and len(g.fingerprint) == 64
    assert g != same  # graphs compare by identity
    assert Graph.from_edges([0, 1], [1, 0], num_nodes=4).fingerprint != g.fingerprint
    assert Graph.from_edges([1, 0], [0, 1], num_nodes=3).fingerprint != g.fingerprint


def test_from_networkx_empty_graph():
    g = Graph.from_networkx(nx.Graph())
    assert (g.num_nodes, g.num_edges) == (0, 0)
