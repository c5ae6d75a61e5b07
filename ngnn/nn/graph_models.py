"""Graph-classification models: GIN-0 (Xu et al. 2019) and a mean-readout GCN baseline.

A graph model is called as `model(g, x, batch, training)`: `g` the graph messages pass over
(a BatchedGraph, or a loader slot's `graph`), `x` its node features, `batch` what
ng.readout pools over (the BatchedGraph itself, or the BatchSlot); it returns the logits,
one row per graph of the batch.

GINGraph's MLPs are Linear-ReLU-Linear followed by ReLU by default, or, with
`batch_norm=True`, the paper's, with batch norm (nn.BatchNorm) after both Linear maps;
benchmarks/graph_classification_vs_pyg.py compares either with PyTorch Geometric's GIN of
exactly that architecture on the same folds. Without batch norm a graph's logits do not
depend on the other graphs of its batch, so a batched step is the sum of per-graph steps
(tests/test_graph_classification.py); with it they do, through the batch's statistics.
"""
import numpy as np

import ngnn as ng

from .layers import GCNConv, GINConv, Linear
from .models import Model, _layer_seeds
from .normalization import BatchNorm


class GINGraph(Model):
    """GIN-0 for graphs: `num_layers` layers counting the input (the paper's 5), so
    num_layers - 1 GINConv layers (eps = 0, each MLP Linear-ReLU-Linear, then ReLU; with
    `batch_norm`, the paper's Linear-BatchNorm-ReLU-Linear, then BatchNorm and ReLU), a sum
    readout of every layer's node rows, the input included, and per layer a linear map of
    its readout to class scores, dropped out and summed (the paper's official code). Weights
    and biases start as the paper's code starts them (`init="fan_in"`, PyTorch's nn.Linear
    default); "glorot" gives Glorot-uniform weights and zero biases."""

    def __init__(self, in_feats, hidden, num_classes, num_layers=5, dropout=0.5, eps=0.0,
                 readout="sum", seed=0, dtype=np.float32, init="fan_in", batch_norm=True):
        super().__init__()
        if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < 2:
            raise ValueError(f"GINGraph: num_layers must be an int >= 2 (the input counts "
                             f"as one), got {num_layers!r}")
        self.dropout, self.readout, self.eps = dropout, readout, float(eps)
        self.batch_norm = batch_norm
        seeds = _layer_seeds(seed, 3 * num_layers - 2)
        widths = [in_feats] + [hidden] * (num_layers - 1)
        if batch_norm:
            # The paper's layer: Linear, BatchNorm, ReLU, Linear inside the MLP, then
            # BatchNorm and ReLU after it; the statistics need every node of the batch, so
            # the MLP runs on the aggregated node tensor, outside the vertex program.
            self.convs = [[(f"conv{i + 1}.{part}", layer) for part, layer in (
                ("lin1", Linear(widths[i], hidden, seed=seeds[i], dtype=dtype, init=init)),
                ("norm1", BatchNorm(hidden, dtype=dtype)),
                ("lin2", Linear(hidden, hidden, seed=seeds[2 * num_layers - 1 + i],
                                dtype=dtype, init=init)),
                ("norm2", BatchNorm(hidden, dtype=dtype)))]
                for i in range(num_layers - 1)]
        else:
            self.convs = [[(f"conv{i + 1}", GINConv(widths[i], hidden, eps=eps, hidden=hidden,
                                                    seed=seeds[i], dtype=dtype, init=init))]
                          for i in range(num_layers - 1)]
        self.heads = [(f"head{i}", Linear(width, num_classes, seed=seeds[num_layers - 1 + i],
                                          dtype=dtype, init=init))
                      for i, width in enumerate(widths)]
        self.layers = [named for conv in self.convs for named in conv] + self.heads

    def __call__(self, g, x, batch, training=False):
        h, states = x, [x]
        for conv in self.convs:
            h = self._bn_layer(g, h, batch, training, *(layer for _, layer in conv)) \
                if self.batch_norm else ng.relu(conv[0][1](g, h, training))
            states.append(h)
        # Dropout after each head's dense layer, on its class scores: the paper's "dropout
        # after the dense layer", as its official code applies it.
        scores = [self._dropout(head(ng.readout(s, batch, self.readout)), training)
                  for (_, head), s in zip(self.heads, states)]
        return sum(scores[1:], scores[0])

    def _bn_layer(self, g, h, batch, training, lin1, norm1, lin2, norm2):
        with ng.zoomIn(g, node_feat={"h": h}) as v:
            total = (1.0 + self.eps) * v.h + sum(n.h for n in v.innbs)
        z = ng.relu(norm1(lin1(ng.zoomOut(total)), training, batch))
        return ng.relu(norm2(lin2(z), training, batch))


class GCNGraph(Model):
    """The baseline: `num_layers` GCNConv layers over A + I with ReLU, a mean readout of the
    last, dropout, and a linear map to class scores."""
    self_loops = True

    def __init__(self, in_feats, hidden, num_classes, num_layers=3, dropout=0.5, seed=0,
                 dtype=np.float32):
        super().__init__()
        seeds = _layer_seeds(seed, num_layers + 1)
        widths = [in_feats] + [hidden] * num_layers
        self.dropout = dropout
        self.layers = [(f"conv{i + 1}", GCNConv(widths[i], hidden, seed=seeds[i], dtype=dtype))
                       for i in range(num_layers)]
        self.layers.append(("head", Linear(hidden, num_classes, seed=seeds[-1], dtype=dtype)))

    def __call__(self, g, x, batch, training=False):
        """`g` must carry one self loop per vertex already (GraphLoader(self_loops=True), or
        g.with_self_loops() of a BatchedGraph)."""
        h = x
        for _, conv in self.layers[:-1]:
            h = ng.relu(conv(g, h, training))
        pooled = self._dropout(ng.readout(h, batch, "mean"), training)
        return self.layers[-1][1](pooled)
