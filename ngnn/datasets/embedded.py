"""Loading the embedded datasets and users' .npz files of the same layout."""

import os
import zipfile
import zlib

import numpy as np

from ngnn.datasets.dataset import make_dataset
from ngnn.datasets.relational import is_relational, relational_dataset

DATA_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
REQUIRED_KEYS = ("src", "dst", "x", "y", "train_mask", "val_mask", "test_mask")


def names():
    """Names of the embedded datasets, sorted."""
    return sorted(entry[:-len(".npz")] for entry in os.listdir(DATA_DIR) if entry.endswith(".npz"))


def _resolve(name):
    """Maps a dataset name or a path to (display name, file path)."""
    if not isinstance(name, (str, os.PathLike)):
        raise ValueError(f"dataset name must be a string or path, got {type(name).__name__}")
    text = os.fspath(name)
    if text.lower() in names():
        return text.lower(), os.path.join(DATA_DIR, text.lower() + ".npz")
    if os.path.isfile(text):
        return os.path.splitext(os.path.basename(text))[0], text
    if text.endswith(".npz") or os.sep in text:
        raise FileNotFoundError(f"dataset file not found: {text}")
    raise ValueError(
        f"unknown dataset {text!r}; embedded datasets are {', '.join(names())} "
        f"(or pass the path of an .npz file in the same layout)")


def _read_arrays(path):
    """Reads every array of an .npz, turning any sign of a damaged file into a clear ValueError."""
    try:
        archive = np.load(path, allow_pickle=False)
        if not isinstance(archive, np.lib.npyio.NpzFile):
            raise ValueError("it holds a single array, not an archive of named arrays")
        with archive:
            # Reading every member in full makes zipfile check each CRC, so damage shows up here.
            return {key: archive[key] for key in archive.files}
    except (ValueError, OSError, EOFError, zipfile.BadZipFile, zlib.error) as err:
        raise ValueError(
            f"{path} is corrupt, truncated or not a valid .npz archive ({err})") from err


def load(name):
    """Loads an embedded dataset by name (case-insensitive) or an .npz file by path.
    The TU graph-classification names ("mutag", "proteins", ...) give a GraphDataset.

    The file must hold the arrays src, dst (int64 (E,)), x (float (N, F)), y (int (N,)) and
    boolean train_mask, val_mask, test_mask (N,); see docs/datasets.md.
    """
    from ngnn.datasets.tu import EMBEDDED, load_graphs
    if isinstance(name, str) and name.lower().replace("-", "_") in EMBEDDED:
        return load_graphs(name)        # a graph-classification dataset (ngnn/datasets/tu.py)
    display, path = _resolve(name)
    arrays = _read_arrays(path)
    if is_relational(arrays):        # an RDF graph with typed edges (R-GCN)
        return relational_dataset(display, arrays, path)
    missing = [key for key in REQUIRED_KEYS if key not in arrays]
    if missing:
        raise ValueError(
            f"{path} is missing required array(s) {', '.join(missing)}; "
            f"found {', '.join(sorted(arrays)) or 'none'}")
    return make_dataset(display, *(arrays[key] for key in REQUIRED_KEYS), where=path)


def _member_shape(archive, key):
    # Only the .npy header is decompressed, so sizes of large feature matrices come cheap.
    with archive.open(key + ".npy") as member:
        major, _ = np.lib.format.read_magic(member)
        if major == 1:
            shape, _, _ = np.lib.format.read_array_header_1_0(member)
        else:
            shape, _, _ = np.lib.format.read_array_header_2_0(member)
    return shape


def info():
    """Sizes of each embedded dataset: {name: {nodes, edges, features, classes}}."""
    sizes = {}
    for name in names():
        path = os.path.join(DATA_DIR, name + ".npz")
        with np.load(path, allow_pickle=False) as npz:
            if is_relational(npz.files):
                n = int(npz["num_nodes"])
                sizes[name] = {"nodes": n, "edges": 2 * int(npz["src"].size), "features": n,
                               "classes": int(npz["class_names"].size)}
                continue
        with zipfile.ZipFile(path) as archive:
            num_nodes, num_features = _member_shape(archive, "x")
            num_edges, = _member_shape(archive, "src")
        with np.load(path, allow_pickle=False) as npz:
            labels = npz["y"]
        sizes[name] = {"nodes": int(num_nodes), "edges": int(num_edges),
                       "features": int(num_features), "classes": int(labels.max()) + 1}
    return sizes
