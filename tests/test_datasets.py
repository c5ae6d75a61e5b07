import hashlib
import os

import numpy as np
import pytest

from ngnn import datasets
from ngnn.datasets import embedded
from ngnn.graph import Graph

# Sizes from /work/shared/data/README.md: nodes, edges, features, classes, train, val, test.
EXPECTED = {
    "cora": (2708, 10556, 1433, 7, 140, 500, 1000),
    "citeseer": (3327, 9104, 3703, 6, 120, 500, 1000),
    "amazon_photo": (7650, 238162, 745, 8, 160, 240, 7250),
    "amazon_computers": (13752, 491722, 767, 10, 200, 300, 13252),
    "coauthor_cs": (18333, 163788, 6805, 15, 300, 450, 17583),
}
SHA256 = {
    "cora": "4d33d7f94792559187ac0da85087b3b114b8f1c2c9164763632cc5cd32658646",
    "citeseer": "18df0166e0fda4afb73af9529475051537b15b24701ec80e1813041deb9b2540",
    "amazon_photo": "e0088401d4262058f45e505d42148da247418d61dd49dfc8fe229fd49b33a3cc",
    "amazon_computers": "2d05b2c4fb043286bd61e58bb2f4123a1825e6534c2f7eeb031ebb538a6ff4d2",
    "coauthor_cs": "e358c9f3b79e7bf92e0bc950565576b4e1ba5229f70d9838d152288df97a8be7",
}
# The R-GCN paper's RDF graphs (tests/test_rgcn_training.py checks their contents).
RDF_SHA256 = {
    "aifb": "1cd05f49c370ebd87e996b75ac104e89f88a47a030d34b91c33ef4f1ba49da79",
    "mutag_rdf": "0678c211d86ebbb94746e41fbc8f44f437b4eafc340d2f874c8452c0ef2af456",
}
CORA = os.path.join(embedded.DATA_DIR, "cora.npz")


def cora_arrays():
    with np.load(CORA, allow_pickle=False) as archive:
        return {key: archive[key] for key in archive.files}


def test_names_and_embedded_files_are_pristine():
    assert datasets.names() == sorted([*EXPECTED, *RDF_SHA256])
    for name, digest in {**SHA256, **RDF_SHA256}.items():
        with open(os.path.join(embedded.DATA_DIR, name + ".npz"), "rb") as handle:
            assert hashlib.sha256(handle.read()).hexdigest() == digest, name


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_embedded_dataset_loads_with_documented_sizes(name):
    data = datasets.load(name.upper())
    nodes, edges, features, classes, train, val, test = EXPECTED[name]
    assert data.name == name
    assert isinstance(data.graph, Graph)
    assert (data.num_nodes, data.num_edges, data.num_features, data.num_classes) == (
        nodes, edges, features, classes)
    assert data.features.dtype == np.float32 and data.features.shape == (nodes, features)
    assert data.labels.dtype == np.int64 and data.labels.shape == (nodes,)
    assert (data.train_mask.sum(), data.val_mask.sum(), data.test_mask.sum()) == (train, val, test)
    assert not np.any(data.train_mask & data.val_mask)
    summary = data.summary()
    assert name in summary and f"{nodes} nodes" in summary and f"{train}/{val}/{test}" in summary


def test_info_matches_files():
    sizes = datasets.info()
    assert sorted(sizes) == sorted([*EXPECTED, *RDF_SHA256])
    for name, (nodes, edges, features, classes, *_) in EXPECTED.items():
        assert sizes[name] == {"nodes": nodes, "edges": edges, "features": features,
                               "classes": classes}


def test_masks_come_from_the_file():
    data = datasets.load("cora")
    np.testing.assert_array_equal(data.train_mask, np.arange(2708) < 140)


def test_unknown_name_lists_valid_names():
    with pytest.raises(ValueError, match="unknown dataset 'pubmed'.*citeseer.*cora"):
        datasets.load("pubmed")


def test_missing_path_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.npz"):
        datasets.load(str(tmp_path / "nope.npz"))


def test_user_file_in_same_layout(tmp_path):
    path = tmp_path / "tiny.npz"
    np.savez(path, src=np.array([0, 1]), dst=np.array([1, 2]), x=np.ones((3, 2), np.float32),
             y=np.array([0, 1, 1]), train_mask=np.array([True, False, False]),
             val_mask=np.array([False, True, False]), test_mask=np.array([False, False, True]))
    data = datasets.load(path)
    assert data.name == "tiny"
    assert (data.num_nodes, data.num_edges, data.num_classes) == (3, 2, 2)


def test_truncated_file_is_reported_as_corrupt(tmp_path):
    with open(CORA, "rb") as handle:
        content = handle.read()
    path = tmp_path / "half.npz"
    path.write_bytes(content[:len(content) // 2])
    with pytest.raises(ValueError, match=r"half\.npz is corrupt, truncated or not a valid \.npz"):
        datasets.load(str(path))


def test_random_bytes_are_reported_as_corrupt(tmp_path):
    path = tmp_path / "noise.npz"
    path.write_bytes(np.random.default_rng(0).bytes(4096))
    with pytest.raises(ValueError, match=r"noise\.npz is corrupt, truncated or not a valid \.npz"):
        datasets.load(str(path))


def test_damaged_member_is_reported_as_corrupt(tmp_path):
    # Flipping bytes inside a compressed member keeps the zip directory intact, so only reading
    # the arrays (decompression or CRC) can notice.
    content = bytearray(open(CORA, "rb").read())
    for offset in range(20000, 20100):
        content[offset] ^= 0xFF
    path = tmp_path / "flipped.npz"
    path.write_bytes(bytes(content))
    with pytest.raises(ValueError, match=r"flipped\.npz is corrupt"):
        datasets.load(str(path))


def test_single_npy_is_not_an_archive(tmp_path):
    path = tmp_path / "single.npy"
    np.save(path, np.zeros(3))
    with pytest.raises(ValueError, match="not a valid .npz.*single array"):
        datasets.load(str(path))


def test_missing_key_names_key_and_file(tmp_path):
    arrays = cora_arrays()
    del arrays["val_mask"]
    path = tmp_path / "nomask.npz"
    np.savez(path, **arrays)
    with pytest.raises(ValueError, match=r"nomask\.npz is missing required array\(s\) val_mask"):
        datasets.load(str(path))


@pytest.mark.parametrize("change, message", [
    (lambda a: a.update(y=a["y"][:-1]), r"labels 'y' have shape \(2707,\) but 'x' has 2708 rows"),
    (lambda a: a.update(test_mask=a["test_mask"][:5]), r"'test_mask' has shape \(5,\)"),
    (lambda a: a.update(train_mask=a["train_mask"].astype(np.int8)), "'train_mask' must be boolean"),
    (lambda a: a["y"].__setitem__(3, -1), r"label y\[3\] = -1 is out of range"),
    (lambda a: a["dst"].__setitem__(7, 5000), r"invalid edges: dst\[7\] = 5000 is out of range \[0, 2708\)"),
    (lambda a: a.update(src=a["src"][:-1]), "same length, got 10555 and 10556"),
    (lambda a: a["x"].__setitem__((slice(0, 3), 0), np.nan), "contain 3 NaN or Inf"),
    (lambda a: a["x"].__setitem__((0, 1), np.inf), "contain 1 NaN or Inf"),
])
def test_inconsistent_contents_are_rejected(tmp_path, change, message):
    arrays = cora_arrays()
    change(arrays)
    path = tmp_path / "bad.npz"
    np.savez(path, **arrays)
    with pytest.raises(ValueError, match=message) as caught:
        datasets.load(str(path))
    assert "bad.npz" in str(caught.value)


def test_edge_list_parsing(tmp_path):
    path = tmp_path / "edges.txt"
    path.write_text("# a comment\n0 1\n1,2\n\n2\t0  # trailing comment\n")
    g = datasets.load_edge_list(path, num_nodes=4)
    np.testing.assert_array_equal(g.src, [0, 1, 2])
    np.testing.assert_array_equal(g.dst, [1, 2, 0])
    assert g.num_nodes == 4
    path.write_text("5 3\n")
    assert datasets.load_edge_list(path).num_nodes == 6


def test_empty_edge_list(tmp_path):
    path = tmp_path / "empty.txt"
    path.write_text("# nothing\n")
    g = datasets.load_edge_list(path, num_nodes=3)
    assert (g.num_nodes, g.num_edges) == (3, 0)


@pytest.mark.parametrize("text, message", [
    ("0 1\n1 x\n", r"edges\.txt, line 2: 'x' is not an integer node id"),
    ("0 1\n# c\n1 2.5\n", r"line 3: '2\.5' is not an integer"),
    ("0 1\n1 2 3\n", r"line 2: expected 2 columns 'src dst', got 3"),
    ("0 1 7\n1 2 3\n", r"line 1: expected 2 columns 'src dst', got 3"),
    ("0 1\n\n4\n", r"line 3: expected 2 columns 'src dst', got 1"),
])
def test_edge_list_bad_line_names_line_number(tmp_path, text, message):
    path = tmp_path / "edges.txt"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        datasets.load_edge_list(path)


def test_edge_list_out_of_range_names_file(tmp_path):
    path = tmp_path / "edges.txt"
    path.write_text("0 1\n1 5\n")
    with pytest.raises(ValueError, match=r"edges\.txt: dst\[1\] = 5 is out of range \[0, 3\)"):
        datasets.load_edge_list(path, num_nodes=3)


@pytest.mark.parametrize("kind", ["sbm", "rmat"])
def test_synthetic_sizes_and_determinism(kind):
    first = datasets.synthetic(kind, 1000, 8, 12, 5, seed=3)
    again = datasets.synthetic(kind, 1000, 8, 12, 5, seed=3)
    other = datasets.synthetic(kind, 1000, 8, 12, 5, seed=4)
    assert (first.num_nodes, first.num_features, first.num_classes) == (1000, 12, 5)
    assert first.features.dtype == np.float32 and first.labels.dtype == np.int64
    assert abs(first.num_edges - 8000) < 400
    np.testing.assert_array_equal(first.graph.src, again.graph.src)
    np.testing.assert_array_equal(first.features, again.features)
    assert first.graph.fingerprint != other.graph.fingerprint
    assert (first.train_mask.sum(), first.val_mask.sum()) == (100, 150)
    masks = first.train_mask.astype(int) + first.val_mask + first.test_mask
    np.testing.assert_array_equal(masks, 1)
    np.testing.assert_array_equal(np.bincount(first.labels[first.train_mask], minlength=5), 20)


def test_sbm_is_homophilous_undirected_without_self_loops():
    data = datasets.synthetic("sbm", 2000, 10, 8, 4, seed=0)
    g = data.graph
    assert np.mean(data.labels[g.src] == data.labels[g.dst]) > 0.75
    assert not np.any(g.src == g.dst)
    forward = set(zip(g.src.tolist(), g.dst.tolist()))
    assert forward == set(zip(g.dst.tolist(), g.src.tolist()))


def test_sbm_features_reward_neighbour_averaging():
    data = datasets.synthetic("sbm", 3000, 10, 64, 5, seed=1)

    def nearest_mean_accuracy(features):
        means = np.stack([features[data.train_mask & (data.labels == c)].mean(0)
                          for c in range(data.num_classes)])
        predicted = ((features[:, None] - means[None]) ** 2).sum(-1).argmin(1)
        return np.mean(predicted[data.test_mask] == data.labels[data.test_mask])

    degrees = np.maximum(data.graph.in_degrees, 1)[:, None]
    averaged = data.graph.adjacency() @ data.features / degrees
    assert nearest_mean_accuracy(averaged) > nearest_mean_accuracy(data.features) + 0.2


def test_rmat_is_skewed_and_keeps_exact_node_count():
    data = datasets.synthetic("rmat", 1000, 16, 4, 3, seed=0)
    assert data.num_nodes == 1000 and data.num_edges == 16000
    assert data.graph.src.max() < 1000 and data.graph.dst.max() < 1000
    degrees = np.sort(data.graph.out_degrees)[::-1]
    assert degrees[:10].sum() > 10 * degrees[500:510].sum()


def test_synthetic_argument_errors():
    with pytest.raises(ValueError, match="unknown synthetic kind 'grid'; kinds are sbm, rmat"):
        datasets.synthetic("grid", 10, 2, 2, 2)
    with pytest.raises(ValueError, match="num_nodes must be an int >= 1"):
        datasets.synthetic("sbm", 0, 2, 2, 2)
    with pytest.raises(ValueError, match="avg_degree must be a number >= 0"):
        datasets.synthetic("rmat", 10, -1, 2, 2)
