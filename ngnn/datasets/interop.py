"""Datasets from PyTorch Geometric's ``Data`` and from DGL graphs.

Both read the attributes those objects expose (tensors become NumPy through
``ngnn.foreign``), so neither torch, PyG nor DGL is imported by ngnn. The result is an
ordinary ``Dataset``, checked like every other one (``make_dataset``).
"""
from ngnn.datasets.dataset import make_dataset
from ngnn.foreign import to_mask, to_numpy
from ngnn.graph import Graph

SPLITS = ("train_mask", "val_mask", "test_mask")


def from_pyg(data, name="pyg", num_classes=None):
    """A Dataset from a PyG ``Data`` with ``x``, ``edge_index``, ``y`` and boolean (or 0/1)
    ``train_mask``, ``val_mask``, ``test_mask`` over the nodes. Edge ``i`` of the graph is
    ``edge_index[:, i]``; ``edge_attr`` and other attributes are not used. ``y`` of shape
    (N, 1) is read as (N,). ``num_classes`` defaults to max label + 1."""
    where = f"from_pyg({name!r})"
    fields = {key: _attribute(data, key, where) for key in ("x", "edge_index", "y") + SPLITS}
    x = to_numpy(fields["x"], f"{where}: 'x'")
    y = _labels(to_numpy(fields["y"], f"{where}: 'y'"))
    masks = [_mask(fields[key], key, where) for key in SPLITS]
    try:
        graph = Graph.from_edge_index(fields["edge_index"], num_nodes=_rows(x))
    except ValueError as err:
        raise ValueError(f"{where}: invalid edges: {err}") from err
    return make_dataset(name, graph.src, graph.dst, x, y, *masks, where=where,
                        num_classes=num_classes)


def from_dgl(graph, name="dgl", feat="feat", label="label", num_classes=None):
    """A Dataset from a homogeneous DGL graph whose ``ndata`` holds the features
    (``feat``), labels (``label``) and the ``train_mask``, ``val_mask``, ``test_mask``
    splits, the convention of DGL's built-in datasets. DGL's edge ids are kept."""
    where = f"from_dgl({name!r})"
    ndata = getattr(graph, "ndata", None)
    if ndata is None:
        raise ValueError(f"{where}: expected a DGL graph with .ndata, got "
                         f"{type(graph).__name__}")
    keys = (feat, label) + SPLITS
    missing = [key for key in keys if key not in ndata]
    if missing:
        raise ValueError(f"{where}: graph.ndata has no {', '.join(map(repr, missing))} "
                         f"(it has {', '.join(map(repr, ndata.keys())) or 'nothing'})")
    try:
        structure = Graph.from_dgl(graph)
    except ValueError as err:
        raise ValueError(f"{where}: {err}") from err
    x = to_numpy(ndata[feat], f"{where}: ndata[{feat!r}]")
    if _rows(x) != structure.num_nodes:
        raise ValueError(f"{where}: ndata[{feat!r}] has {_rows(x)} rows but the graph has "
                         f"{structure.num_nodes} nodes")
    y = _labels(to_numpy(ndata[label], f"{where}: ndata[{label!r}]"))
    masks = [_mask(ndata[key], key, where) for key in SPLITS]
    return make_dataset(name, structure.src, structure.dst, x, y, *masks, where=where,
                        num_classes=num_classes)


def _attribute(data, key, where):
    value = getattr(data, key, None)
    if value is None:
        raise ValueError(f"{where}: the data has no {key!r} (PyG Data needs x, edge_index, "
                         f"y, train_mask, val_mask and test_mask)")
    return value


def _rows(x):
    return x.shape[0] if x.ndim else 0


def _labels(y):
    # Single-label tasks often carry y as a column (OGB's convention).
    return y.reshape(-1) if y.ndim == 2 and y.shape[1] == 1 else y


def _mask(value, key, where):
    mask = to_mask(value, f"{where}: {key!r}")
    if mask.ndim == 2:
        raise ValueError(f"{where}: {key!r} has shape {mask.shape}: several splits; pick "
                         f"one column (e.g. data.{key}[:, 0]) before converting")
    return mask
