"""Neural network layers and models."""
from .layers import GATConv, GatedGCNConv, GCNConv, GINConv, Layer, Linear, SAGEConv  # noqa: F401
from .attention import AGNNConv, GATv2Conv, TransformerConv  # noqa: F401
from .edge_features import EdgeConv, GINEConv, PNAConv, degree_histogram  # noqa: F401
from .propagation import APPNPConv, ChebConv, GCN2Conv, SGConv  # noqa: F401
from .rgcn import RGCN, RGCNConv  # noqa: F401
from .models import APPNP, GAT, GCN, GCNII, GIN, GraphSAGE, Model  # noqa: F401
from .graph_models import GCNGraph, GINGraph  # noqa: F401
from .normalization import BatchNorm  # noqa: F401
from .link import DotDecoder, LinkPredictor, MLPDecoder  # noqa: F401
