"""TU Dortmund datasets: the text format (MUTAG raw files), the embedded copies and their
published statistics, cross-validation folds, and clear errors for malformed files."""
import os
import shutil

import numpy as np
import pytest

from ngnn import datasets

MUTAG_DIR = os.path.join(os.path.dirname(__file__), "data", "MUTAG")

# graphs, nodes, directed edges after dropping duplicates, classes, node features: the
# published TU statistics (IMDB-BINARY's file lists each directed edge twice).
STATISTICS = {"mutag": (188, 3371, 7442, 2, 7), "proteins": (1113, 43471, 162088, 2, 3),
              "enzymes": (600, 19580, 74564, 6, 3), "nci1": (4110, 122747, 265506, 2, 37),
              "imdb_binary": (1000, 19773, 193062, 2, 136), "ptc_mr": (344, 4915, 10108, 2, 18)}


@pytest.mark.parametrize("name", sorted(STATISTICS))
def test_embedded_datasets_have_the_published_sizes(name):
    data = datasets.load(name)
    graphs, nodes, edges, classes, features = STATISTICS[name]
    assert (data.num_graphs, int(data.graph_sizes.sum()), int(data.edge_counts.sum()),
            data.num_classes, data.num_features) == (graphs, nodes, edges, classes, features)
    assert len(data.graphs) == len(data.labels) == graphs
    assert set(np.unique(data.labels)) == set(range(classes))


def test_load_tu_reads_the_text_format_as_the_embedded_copy():
    text, embedded = datasets.load_tu(MUTAG_DIR), datasets.load("mutag")
    np.testing.assert_array_equal(text.labels, embedded.labels)
    np.testing.assert_array_equal(text.features, embedded.features)
    np.testing.assert_array_equal(text.src, embedded.src)
    np.testing.assert_array_equal(text.dst, embedded.dst)
    # MUTAG's -1/1 labels become 0/1 in sorted order: 63 of class 0, 125 of class 1.
    assert np.bincount(text.labels).tolist() == [63, 125]


def test_published_folds_and_stratified_folds():
    proteins = datasets.load("proteins")
    folds = proteins.cross_validation(10)
    assert len(folds) == 10
    tested = np.concatenate([test for _, test in folds])
    assert tested.size == np.unique(tested).size == 1110     # 3 graphs are in no test fold
    for train, test in folds:
        assert not np.intersect1d(train, test).size
    mutag = datasets.load("mutag")
    assert mutag.folds is None
    folds = mutag.cross_validation(10, seed=0)
    again = mutag.cross_validation(10, seed=0)
    tested = np.concatenate([test for _, test in folds])
    np.testing.assert_array_equal(np.sort(tested), np.arange(188))
    for (train, test), (train2, test2) in zip(folds, again):
        np.testing.assert_array_equal(test, test2)
        assert train.size + test.size == 188
        # Stratified: each fold holds 6 or 7 of the 63 graphs of class 0.
        assert np.count_nonzero(mutag.labels[test] == 0) in (6, 7)


def test_batch_cuts_graphs_and_their_feature_rows():
    data = datasets.load("mutag")
    gb, x = data.batch([5, 0, 7])
    sizes = data.graph_sizes[[5, 0, 7]]
    assert gb.num_graphs == 3 and gb.num_nodes == sizes.sum() == x.shape[0]
    np.testing.assert_array_equal(x[:sizes[0]], data.features[data.node_offsets[5]:
                                                                data.node_offsets[6]])
    first = gb.unbatch()[0]
    np.testing.assert_array_equal(first.src, data.graphs[5].src)


def test_synthetic_graphs_are_deterministic():
    a, b = datasets.synthetic_graphs(10, seed=4), datasets.synthetic_graphs(10, seed=4)
    np.testing.assert_array_equal(a.labels, b.labels)
    np.testing.assert_array_equal(a.features, b.features)
    np.testing.assert_array_equal(a.src, b.src)


def broken_copy(tmp_path, file_suffix, edit):
    """A copy of the MUTAG folder with `edit(lines)` applied to MUTAG_<file_suffix>.txt;
    returns (folder, the edited file's path)."""
    folder = tmp_path / "MUTAG"
    shutil.copytree(MUTAG_DIR, folder)
    path = folder / f"MUTAG_{file_suffix}.txt"
    lines = path.read_text().splitlines()
    path.write_text("\n".join(edit(lines)) + "\n")
    return str(folder), str(path)


def replace_line(index, text):
    def edit(lines):
        lines[index] = text
        return lines
    return edit


@pytest.mark.parametrize("suffix, edit, message", [
    ("A", replace_line(10, "3372, 1"), r"line 11: node id 3372 is out of range \[1, 3371\]"),
    ("A", replace_line(0, "0, 1"), r"line 1: node id 0 is out of range"),
    ("A", replace_line(2, "3, two"), r"line 3: expected integers, got '3, two'"),
    ("A", replace_line(0, "1, 3371"), r"line 1: edge 1, 3371 joins graphs 1 and 188"),
    ("graph_indicator", lambda lines: [str(int(v) + (int(v) >= 5)) for v in lines],
     r"graph id jumps from 4 to 6: graph\(s\) 5...5 have no nodes \(a graph id gap\)"),
    ("graph_indicator", replace_line(0, "2"), r"line 1: graph ids must start at 1, got 2"),
    ("graph_indicator", replace_line(20, "1"), r"line 21: graph id 1 after 2"),
    ("graph_labels", lambda lines: lines[:-1], r"187 labels for 188 graphs"),
    ("node_labels", lambda lines: lines[:-2], r"3369 lines for 3371 nodes"),
])
def test_malformed_tu_files_raise_errors_naming_the_file(tmp_path, suffix, edit, message):
    folder, path = broken_copy(tmp_path, suffix, edit)
    with pytest.raises(ValueError, match=message) as error:
        datasets.load_tu(folder)
    assert path in str(error.value)


def test_missing_tu_file_is_named(tmp_path):
    folder = tmp_path / "MUTAG"
    shutil.copytree(MUTAG_DIR, folder)
    os.remove(folder / "MUTAG_graph_labels.txt")
    with pytest.raises(FileNotFoundError, match="MUTAG_graph_labels.txt is missing"):
        datasets.load_tu(str(folder))
    with pytest.raises(FileNotFoundError, match="no folder"):
        datasets.load_tu(str(tmp_path / "NOPE"))


def test_labels_out_of_range_are_rejected():
    graphs = datasets.load("mutag").graphs[:3]
    features = [np.ones((g.num_nodes, 2)) for g in graphs]
    with pytest.raises(ValueError, match=r"label 2 of graph 1 is out of range \[0, 2\)"):
        datasets.GraphDataset("toy", graphs, [0, 2, 1], features, num_classes=2)
    with pytest.raises(ValueError, match=r"label -1 of graph 0 is out of range"):
        datasets.GraphDataset("toy", graphs, [-1, 0, 1], features)
    with pytest.raises(ValueError, match=r"2 labels for 3 graphs"):
        datasets.GraphDataset("toy", graphs, [0, 1], features)
