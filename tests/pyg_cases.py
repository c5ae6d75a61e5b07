"""Each ngnn layer next to its PyTorch Geometric counterpart (the cases of tests/test_vs_pyg.py).

A case builds the ngnn layer, builds the PyG module, and names, for every ngnn parameter in
`layer.parameters()` order, the PyG tensor that holds the same numbers (`pairs`): its
attribute path and whether it is stored transposed (torch.nn.Linear keeps (out, in); ngnn
keeps (in, out)). Other layouts differ only by a reshape (GAT's bias is (heads, out) here and
heads * out there). Weights are copied from ngnn to PyG through the pairs and gradients come
back through them, so a layout mistake is a test failure, not a silent transpose.

Where the definitions differ (docs/layers.md), the case states what it does to compare the
same function: e.g. PyG's GCN normalisation uses in-degrees at both ends of an edge, so
GCN-normalised layers are compared on symmetric graphs (`symmetric = True`).
"""
import numpy as np
import torch
import torch_geometric.nn as pyg

import ngnn as ng
from ngnn import nn

HIDDEN = 6        # output width of every case; small, so the suite stays quick
HEADS = 2


def attribute(module, path):
    for name in path.split("."):
        module = module[int(name)] if name.isdigit() else getattr(module, name)
    return module


class Case:
    """One layer: override `ngnn`, `pyg` and `pairs`; `run_ngnn` / `run_pyg` when the call
    differs from `layer(g, h)` / `module(x, edge_index)`."""
    symmetric = False    # compare on the graph with every edge also reversed
    loop_free = False    # compare on the graph without its self loops
    edge_dim = None      # width of random edge features fed to both sides
    attention = False    # run_ngnn(..., return_attention=True) gives (out, alpha (E, heads))
    cora_dtype = np.float32

    @property
    def name(self):
        return type(self).__name__

    def run_ngnn(self, layer, g, h, e=None, **options):
        return layer(g, h, **options)

    def run_pyg(self, module, x, edge_index, e=None):
        return module(x, edge_index)

    def after_cast(self, module):
        """Called once the PyG module has the test's dtype."""

    def pyg_attention(self, module, x, edge_index, e=None):
        """PyG's (output, alpha (E, heads)) where its layer returns attention weights."""
        out, (_, alpha) = self.run_pyg(module, x, edge_index, e, return_attention=True)
        return out, alpha


def linear(prefix, bias=True):
    """The pairs of a torch Linear: (weight, transposed) and (bias, as is)."""
    return [(f"{prefix}.weight", True)] + ([(f"{prefix}.bias", False)] if bias else [])


def mlp(first, second):
    """Linear - ReLU - Linear, as GINConv's and GINEConv's ngnn definition fixes it."""
    return torch.nn.Sequential(torch.nn.Linear(*first), torch.nn.ReLU(),
                               torch.nn.Linear(*second))


# ---- the layers ngnn had before the suite ----------------------------------------------------

class GCNConv(Case):
    """PyG weights both ends of an edge by in-degree^-1/2, ngnn the source by its out-degree:
    the same on a symmetric graph. Self loops are the model's business in ngnn
    (add_self_loops=False on PyG's side)."""
    symmetric = True

    def ngnn(self, in_feats, dtype):
        return nn.GCNConv(in_feats, HIDDEN, dtype=dtype)

    def pyg(self, in_feats):
        return pyg.GCNConv(in_feats, HIDDEN, add_self_loops=False)

    pairs = linear("lin", bias=False) + [("bias", False)]


class GATConv(Case):
    attention = True

    def ngnn(self, in_feats, dtype):
        return nn.GATConv(in_feats, HIDDEN, HEADS, dtype=dtype)

    def pyg(self, in_feats):
        return pyg.GATConv(in_feats, HIDDEN, HEADS, add_self_loops=False)

    pairs = linear("lin", bias=False) + [("att_src", False), ("att_dst", False),
                                         ("bias", False)]

    def run_pyg(self, module, x, edge_index, e=None, return_attention=False):
        return module(x, edge_index, return_attention_weights=return_attention or None)


class SAGEConv(Case):
    def ngnn(self, in_feats, dtype):
        return nn.SAGEConv(in_feats, HIDDEN, dtype=dtype)

    def pyg(self, in_feats):
        return pyg.SAGEConv(in_feats, HIDDEN, aggr="mean")

    pairs = linear("lin_r", bias=False) + linear("lin_l")


class GINConv(Case):
    def ngnn(self, in_feats, dtype):
        return nn.GINConv(in_feats, HIDDEN, eps=0.25, hidden=5, dtype=dtype)

    def pyg(self, in_feats):
        return pyg.GINConv(mlp((in_feats, 5), (5, HIDDEN)), eps=0.25)

    pairs = linear("nn.0") + linear("nn.2")


class GatedGCNConv(Case):
    """NeuGraph's G-GCN is PyG's ResGatedGraphConv without its root weight and bias, with the
    value transform the identity (ngnn gates h_u itself) and the product with W and the ReLU
    after the aggregation: relu(ResGatedGraphConv(h) W)."""

    def ngnn(self, in_feats, dtype):
        return nn.GatedGCNConv(in_feats, HIDDEN, dtype=dtype)

    def pyg(self, in_feats):
        conv = pyg.ResGatedGraphConv(in_feats, in_feats, root_weight=False, bias=False)
        with torch.no_grad():
            conv.lin_value.weight.copy_(torch.eye(in_feats))
            for lin in (conv.lin_key, conv.lin_query, conv.lin_value):
                lin.bias.zero_()
        for p in conv.parameters():
            p.requires_grad_(False)
        module = torch.nn.Module()
        module.conv, module.lin = conv, torch.nn.Linear(in_feats, HIDDEN, bias=False)
        conv.lin_key.weight.requires_grad_(True)
        conv.lin_query.weight.requires_grad_(True)
        return module

    pairs = linear("conv.lin_key", bias=False) + linear("conv.lin_query", bias=False) + \
        linear("lin", bias=False)

    def run_pyg(self, module, x, edge_index, e=None):
        return torch.relu(module.lin(module.conv(x, edge_index)))


# ---- attention ------------------------------------------------------------------------------

class GATv2Conv(Case):
    attention = True

    def ngnn(self, in_feats, dtype):
        return nn.GATv2Conv(in_feats, HIDDEN, HEADS, dtype=dtype)

    def pyg(self, in_feats):
        return pyg.GATv2Conv(in_feats, HIDDEN, HEADS, add_self_loops=False)

    pairs = linear("lin_l") + linear("lin_r") + [("att", False), ("bias", False)]

    def run_pyg(self, module, x, edge_index, e=None, return_attention=False):
        return module(x, edge_index, return_attention_weights=return_attention or None)


class TransformerConv(Case):
    attention = True

    def __init__(self, edge_dim=3):
        self.edge_dim = edge_dim

    @property
    def name(self):
        return "TransformerConv" + ("" if self.edge_dim else "NoEdgeFeatures")

    def ngnn(self, in_feats, dtype):
        return nn.TransformerConv(in_feats, HIDDEN, HEADS, edge_dim=self.edge_dim, dtype=dtype)

    def pyg(self, in_feats):
        return pyg.TransformerConv(in_feats, HIDDEN, HEADS, edge_dim=self.edge_dim)

    @property
    def pairs(self):
        return linear("lin_query") + linear("lin_key") + linear("lin_value") + \
            (linear("lin_edge", bias=False) if self.edge_dim else []) + linear("lin_skip")

    def run_ngnn(self, layer, g, h, e=None, **options):
        return layer(g, h, e, **options)

    def run_pyg(self, module, x, edge_index, e=None, return_attention=False):
        return module(x, edge_index, e, return_attention_weights=return_attention or None)


class AGNNConv(Case):
    """PyG's AGNNConv does not return its attention: the reference alpha is PyG's softmax of
    beta * cos(x_u, x_v) over each vertex's in-edges."""
    attention = True

    def ngnn(self, in_feats, dtype):
        return nn.AGNNConv(dtype=dtype)

    def pyg(self, in_feats):
        return pyg.AGNNConv(requires_grad=True, add_self_loops=False)

    pairs = [("beta", False)]

    def after_cast(self, module):
        """Called once the PyG module has the test's dtype."""

    def pyg_attention(self, module, x, edge_index, e=None):
        from torch_geometric.utils import softmax
        unit = torch.nn.functional.normalize(x, p=2.0, dim=-1)
        src, dst = edge_index
        logits = module.beta * (unit[src] * unit[dst]).sum(-1)
        return module(x, edge_index), softmax(logits, dst, num_nodes=x.shape[0])[:, None]


# ---- propagation ----------------------------------------------------------------------------

class APPNPConv(Case):
    symmetric = True

    def ngnn(self, in_feats, dtype):
        return nn.APPNPConv(k=3, alpha=0.1, dtype=dtype)

    def pyg(self, in_feats):
        return pyg.APPNP(K=3, alpha=0.1, add_self_loops=False)

    pairs = []


class SGConv(Case):
    symmetric = True

    def ngnn(self, in_feats, dtype):
        return nn.SGConv(in_feats, HIDDEN, k=2, dtype=dtype)

    def pyg(self, in_feats):
        return pyg.SGConv(in_feats, HIDDEN, K=2, add_self_loops=False)

    pairs = linear("lin")


class GCN2Conv(Case):
    """h0 is tanh(h), so that mixing up h and h0 shows."""
    symmetric = True

    def __init__(self, shared_weights=True):
        self.shared_weights = shared_weights

    @property
    def name(self):
        return "GCN2Conv" + ("" if self.shared_weights else "TwoWeights")

    def ngnn(self, in_feats, dtype):
        return nn.GCN2Conv(in_feats, alpha=0.2, theta=0.5, layer=2,
                           shared_weights=self.shared_weights, dtype=dtype)

    def pyg(self, in_feats):
        return pyg.GCN2Conv(in_feats, alpha=0.2, theta=0.5, layer=2,
                            shared_weights=self.shared_weights, add_self_loops=False)

    @property
    def pairs(self):
        return [("weight1", False)] + ([] if self.shared_weights else [("weight2", False)])

    def run_ngnn(self, layer, g, h, e=None):
        return layer(g, h, ng.tanh(h))

    def run_pyg(self, module, x, edge_index, e=None):
        return module(x, torch.tanh(x), edge_index)


class ChebConv(Case):
    """PyG builds the Laplacian without self loops: compared on graphs without them."""
    symmetric = True
    loop_free = True

    def ngnn(self, in_feats, dtype):
        return nn.ChebConv(in_feats, HIDDEN, k=3, dtype=dtype)

    def pyg(self, in_feats):
        return pyg.ChebConv(in_feats, HIDDEN, K=3)

    pairs = linear("lins.0", bias=False) + linear("lins.1", bias=False) + \
        linear("lins.2", bias=False) + [("bias", False)]


# ---- edge features, both ends --------------------------------------------------------------

class GINEConv(Case):
    edge_dim = 3

    def ngnn(self, in_feats, dtype):
        return nn.GINEConv(in_feats, HIDDEN, edge_dim=self.edge_dim, eps=0.25, hidden=5,
                           dtype=dtype)

    def pyg(self, in_feats):
        return pyg.GINEConv(mlp((in_feats, 5), (5, HIDDEN)), eps=0.25, edge_dim=self.edge_dim)

    pairs = linear("lin") + linear("nn.0") + linear("nn.2")

    def run_ngnn(self, layer, g, h, e=None):
        return layer(g, h, e)

    def run_pyg(self, module, x, edge_index, e=None):
        return module(x, edge_index, e)


class EdgeConv(Case):
    """max aggregation: the multigraph's duplicate edges tie, and both share the gradient."""

    def ngnn(self, in_feats, dtype):
        return nn.EdgeConv(in_feats, HIDDEN, hidden=5, dtype=dtype)

    def pyg(self, in_feats):
        return pyg.EdgeConv(mlp((2 * in_feats, 5), (5, HIDDEN)), aggr="max")

    pairs = linear("nn.0") + linear("nn.2")


class PNAConv(Case):
    """Every aggregator and scaler, with edge features; the degree histogram is fixed. The
    std aggregator is E[m^2] - E[m]^2 on both sides, which loses all accuracy in float32
    when a vertex's messages are close: Cora is compared in float64 too."""
    edge_dim = 3
    cora_dtype = np.float64
    histogram = [2, 3, 4, 1, 1]
    scalers = ("identity", "amplification", "attenuation", "linear", "inverse_linear")

    def ngnn(self, in_feats, dtype):
        return nn.PNAConv(in_feats, HIDDEN, self.histogram, scalers=self.scalers,
                          edge_dim=self.edge_dim, dtype=dtype)

    def pyg(self, in_feats):
        return pyg.PNAConv(in_feats, HIDDEN, ["mean", "min", "max", "std"], list(self.scalers),
                           torch.tensor(self.histogram), edge_dim=self.edge_dim)

    def after_cast(self, module):
        # PyG computes the mean degrees in float32; the float64 comparison needs them exact
        counts = np.asarray(self.histogram, dtype=np.float64)
        bins = np.arange(len(counts))
        with torch.no_grad():
            module.aggr_module.avg_deg_lin.fill_(float((bins * counts).sum() / counts.sum()))
            module.aggr_module.avg_deg_log.fill_(
                float((np.log(bins + 1.0) * counts).sum() / counts.sum()))

    pairs = linear("edge_encoder") + linear("pre_nns.0.0") + linear("post_nns.0.0") + \
        linear("lin")

    def run_ngnn(self, layer, g, h, e=None):
        return layer(g, h, e)

    def run_pyg(self, module, x, edge_index, e=None):
        return module(x, edge_index, e)


CASES = [GCNConv(), GATConv(), SAGEConv(), GINConv(), GatedGCNConv(), GATv2Conv(),
         TransformerConv(), TransformerConv(edge_dim=None), AGNNConv(), APPNPConv(), SGConv(), GCN2Conv(),
         GCN2Conv(shared_weights=False), ChebConv(), GINEConv(), EdgeConv(), PNAConv()]
