"""Datasets for node classification: embedded real graphs, user files and synthetic graphs.

See docs/datasets.md for what is embedded, where it came from and how to cite it.
"""

from ngnn.datasets.dataset import Dataset
from ngnn.datasets.edge_list import load_edge_list
from ngnn.datasets.embedded import info, load, names
from ngnn.datasets.interop import from_dgl, from_pyg
from ngnn.datasets.link_split import LinkSplit, link_split
from ngnn.datasets.synthetic import synthetic
from ngnn.datasets.graph_dataset import GraphDataset
from ngnn.datasets.tu import graph_names, load_tu, synthetic_graphs

__all__ = ["Dataset", "load", "names", "info", "load_edge_list", "synthetic", "from_pyg",
           "from_dgl", "LinkSplit", "link_split",
           "GraphDataset", "graph_names", "load_tu", "synthetic_graphs"]
