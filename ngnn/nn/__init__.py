"""Neural network layers and models."""
from .layers import GATConv, GCNConv, GINConv, Layer, SAGEConv  # noqa: F401
