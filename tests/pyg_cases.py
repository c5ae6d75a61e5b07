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
    edge_dim = None      # width of random edge features fed to both sides
    attention = False    # run_ngnn(..., return_attention=True) gives (out, alpha (E, heads))

    @property
    def name(self):
        return type(self).__name__

    def run_ngnn(self, layer, g, h, e=None, **options):
        return layer(g, h, **options)

    def run_pyg(self, module, x, edge_index, e=None):
        return module(x, edge_index)


def linear(prefix, bias=True):
    """The pairs of a torch Linear: (weight, transposed) and (bias, as is)."""
    return [(f"{prefix}.weight", True)] + ([(f"{prefix}.bias", False)] if bias else [])


def mlp(first, second):
    """Linear - ReLU - Linear, as GINConv's and GINEConv's ngnn definition fixes it."""
    return torch.nn.Sequential(torch.nn.Linear(*first), torch.nn.ReLU(),
                               torch.nn.Linear(*second))


# ---- the layers ngnn had before the suite ------------------------------------------------------

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


CASES = [GCNConv(), GATConv(), SAGEConv(), GINConv(), GatedGCNConv()]
