"""Neural network layers and models."""
from .layers import GATConv, GatedGCNConv, GCNConv, GINConv, Layer, SAGEConv  # noqa: F401
from .models import GAT, GCN, GIN, GraphSAGE, Model  # noqa: F401
from .rgcn import RGCN, RGCNConv  # noqa: F401
