"""Node-classification models built from the layers: GCN, GAT, GraphSAGE, GIN, APPNP and
GCNII.

A model is called as `model(g, x, training)` and returns the logits node tensor (N, classes).
`g` is the full graph, or a minibatch's blocks (one graph per layer, ngnn.sampling): then x
has the first block's num_nodes rows and the logits the last block's num_dst rows.
Dropout exists only in the graph built with training=True, so a trainer builds the training
graph and the evaluation graph from two calls on the same variables.
"""
import numpy as np

import ngnn as ng

from .layers import GATConv, GCNConv, GINConv, Linear, SAGEConv
from .propagation import APPNPConv, GCN2Conv

_self_looped = {}


def with_self_loops(g):
    """g with exactly one self loop per vertex (existing loops are dropped first, so a graph
    that already has some is not double counted). Cached per graph: graphs compare by
    identity, and the training and evaluation graphs should share one."""
    if g not in _self_looped:
        _self_looped.clear()    # one entry: models are trained on one graph at a time
        _self_looped[g] = g.with_self_loops()
    return _self_looped[g]


def _layer_seeds(seed, count):
    # Independent streams for the layers, so changing one layer's size leaves the others'
    # initial weights alone.
    return [int(s) for s in np.random.SeedSequence(seed).generate_state(count)]


class Model:
    """Base class: `layers` is a list of (name, layer); parameters are named "<layer>.<param>"."""

    self_loops = False     # whether every layer's graph gets one self loop per vertex

    def __init__(self):
        self.layers = []

    def graphs(self, g):
        """The graph of each layer: the full graph (self-looped if the model wants that) or
        the list of blocks, which carry their self loops already when the model wants them
        (ngnn.sampling adds them when it loads a batch)."""
        if isinstance(g, (list, tuple)):
            if len(g) != len(self.layers):
                raise ValueError(f"{type(self).__name__} has {len(self.layers)} layers but "
                                 f"got {len(g)} graphs")
            return list(g)
        return [with_self_loops(g) if self.self_loops else g] * len(self.layers)

    def parameters(self):
        return [p for _, layer in self.layers for p in layer.parameters()]

    def buffers(self):
        """Variables the model keeps that no optimizer trains (batch norm's running
        statistics): a trainer resets them with the parameters."""
        return [b for _, layer in self.layers for b in layer.buffers()]

    def state_updates(self):
        """The assignments of those variables that the latest training call recorded: a
        training step runs them with the optimizer's."""
        return [u for _, layer in self.layers for u in layer.updates]

    def named_parameters(self):
        """[(name, variable)], names unique within the model (for checkpoints)."""
        return [(f"{name}.{p.name.rsplit('.', 1)[-1]}", p)
                for name, layer in self.layers for p in layer.parameters()]

    def _dropout(self, h, training):
        return ng.dropout(h, self.dropout) if training and self.dropout else h


class GCN(Model):
    """Kipf & Welling (2017): dropout, GCNConv, ReLU, dropout, GCNConv over A + I."""
    self_loops = True

    def __init__(self, in_feats, hidden, num_classes, dropout=0.5, seed=0, dtype=np.float32):
        super().__init__()
        s1, s2 = _layer_seeds(seed, 2)
        self.dropout = dropout
        self.layers = [("conv1", GCNConv(in_feats, hidden, seed=s1, dtype=dtype)),
                       ("conv2", GCNConv(hidden, num_classes, seed=s2, dtype=dtype))]

    def __call__(self, g, x, training=False):
        g1, g2 = self.graphs(g)
        (_, conv1), (_, conv2) = self.layers
        h = ng.relu(conv1(g1, self._dropout(x, training), training))
        return conv2(g2, self._dropout(h, training), training)


class GAT(Model):
    """Veličković et al. (2018): `heads` attention heads of `hidden` features, concatenated,
    ELU, then one head giving the logits; dropout on each layer's input and, at
    `attn_dropout` (default: `dropout`, as in the paper), on the attention coefficients.
    Self loops let a vertex attend to itself, as in the paper."""
    self_loops = True

    def __init__(self, in_feats, hidden=8, heads=8, num_classes=None, dropout=0.6,
                 negative_slope=0.2, seed=0, dtype=np.float32, attn_dropout=None):
        super().__init__()
        if num_classes is None:
            raise TypeError("GAT: num_classes is required")
        s1, s2 = _layer_seeds(seed, 2)
        self.dropout = dropout
        attn = dropout if attn_dropout is None else attn_dropout
        self.layers = [
            ("conv1", GATConv(in_feats, hidden, heads, feat_drop=dropout, attn_drop=attn,
                              negative_slope=negative_slope, seed=s1, dtype=dtype)),
            ("conv2", GATConv(heads * hidden, num_classes, 1, feat_drop=dropout,
                              attn_drop=attn, negative_slope=negative_slope, seed=s2,
                              dtype=dtype))]

    def __call__(self, g, x, training=False):
        g1, g2 = self.graphs(g)
        (_, conv1), (_, conv2) = self.layers
        h = conv1(g1, x, training)
        h = ng.elu(ng.reshape(h, (h.shape[0], h.shape[1] * h.shape[2])))
        out = conv2(g2, h, training)
        return ng.reshape(out, (out.shape[0], out.shape[2]))


class GraphSAGE(Model):
    """Hamilton et al. (2017), mean aggregator: SAGEConv, then (ReLU, dropout, SAGEConv) for
    each further layer; `num_layers` SAGEConvs in all (2 by default)."""

    def __init__(self, in_feats, hidden, num_classes, dropout=0.5, seed=0, dtype=np.float32,
                 num_layers=2):
        super().__init__()
        if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < 1:
            raise ValueError(f"GraphSAGE: num_layers must be a positive int, got {num_layers!r}")
        self.dropout = dropout
        widths = [in_feats] + [hidden] * (num_layers - 1) + [num_classes]
        self.layers = [(f"conv{i + 1}", SAGEConv(widths[i], widths[i + 1], seed=s, dtype=dtype))
                       for i, s in enumerate(_layer_seeds(seed, num_layers))]

    def __call__(self, g, x, training=False):
        h = x
        for i, ((_, conv), graph) in enumerate(zip(self.layers, self.graphs(g))):
            if i:
                h = self._dropout(ng.relu(h), training)
            h = conv(graph, h if i else self._dropout(h, training), training)
        return h


class GIN(Model):
    """Xu et al. (2019) for node classification: two GINConv layers (each a 2-layer MLP over
    (1 + eps) h + the sum of the neighbours' h), ReLU and dropout between them."""

    def __init__(self, in_feats, hidden, num_classes, dropout=0.5, eps=0.0, seed=0,
                 dtype=np.float32):
        super().__init__()
        s1, s2 = _layer_seeds(seed, 2)
        self.dropout = dropout
        self.layers = [("conv1", GINConv(in_feats, hidden, eps=eps, seed=s1, dtype=dtype)),
                       ("conv2", GINConv(hidden, num_classes, eps=eps, hidden=hidden, seed=s2,
                                         dtype=dtype))]

    def __call__(self, g, x, training=False):
        g1, g2 = self.graphs(g)
        (_, conv1), (_, conv2) = self.layers
        h = ng.relu(conv1(g1, self._dropout(x, training), training))
        return conv2(g2, self._dropout(h, training), training)


def _full_graph_only(model, g):
    if isinstance(g, (list, tuple)):
        raise ValueError(f"{type(model).__name__} propagates over the full graph; it does not "
                         "train from sampled minibatches")
    return with_self_loops(g)


class APPNP(Model):
    """Klicpera et al. (2019): predict with an MLP (dropout, Linear, ReLU, dropout, Linear),
    then propagate the predictions by K steps of personalised PageRank over A + I
    (APPNPConv, teleport probability alpha). The paper regularises only the first layer's
    weights: pass model.weight_decays(first) to the optimizer."""
    self_loops = True

    def __init__(self, in_feats, hidden, num_classes, k=10, alpha=0.1, dropout=0.5, seed=0,
                 dtype=np.float32):
        super().__init__()
        s1, s2 = _layer_seeds(seed, 2)
        self.dropout = dropout
        self.layers = [("lin1", Linear(in_feats, hidden, seed=s1, dtype=dtype)),
                       ("lin2", Linear(hidden, num_classes, seed=s2, dtype=dtype)),
                       ("propagate", APPNPConv(k, alpha, dtype=dtype))]

    def weight_decays(self, first):
        """One weight decay per parameter, in parameters() order: `first` for the first
        layer's weights, none for the rest."""
        lin1 = self.layers[0][1]
        return [first if p is lin1.weight else 0.0 for p in self.parameters()]

    def __call__(self, g, x, training=False):
        g = _full_graph_only(self, g)
        (_, lin1), (_, lin2), (_, propagate) = self.layers
        h = ng.relu(lin1(self._dropout(x, training)))
        return propagate(g, lin2(self._dropout(h, training)), training)


class GCNII(Model):
    """Chen et al. (2020), "Simple and deep graph convolutional networks": a Linear layer
    and ReLU make h0, then `num_layers` GCN2Conv layers (layer l with beta = log(lambda / l
    + 1), each preceded by dropout and followed by ReLU) over A + I, then dropout and a
    Linear layer to the classes. The paper decays the convolutions' weights more than the
    dense layers': pass model.weight_decays(conv, dense) to the optimizer."""
    self_loops = True

    def __init__(self, in_feats, hidden, num_classes, num_layers=64, alpha=0.1, lamda=0.5,
                 dropout=0.6, seed=0, dtype=np.float32):
        super().__init__()
        if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < 1:
            raise ValueError(f"GCNII: num_layers must be a positive int, got {num_layers!r}")
        seeds = _layer_seeds(seed, num_layers + 2)
        self.dropout = dropout
        self.layers = [("lin_in", Linear(in_feats, hidden, seed=seeds[0], dtype=dtype))]
        self.layers += [(f"conv{i}", GCN2Conv(hidden, alpha, theta=lamda, layer=i,
                                              seed=seeds[i], dtype=dtype))
                        for i in range(1, num_layers + 1)]
        self.layers.append(("lin_out", Linear(hidden, num_classes, seed=seeds[-1],
                                              dtype=dtype)))

    def weight_decays(self, conv, dense):
        """One weight decay per parameter, in parameters() order: `conv` for the GCN2Conv
        weights, `dense` for the Linear layers'."""
        return [conv if isinstance(layer, GCN2Conv) else dense
                for _, layer in self.layers for _ in layer.parameters()]

    def __call__(self, g, x, training=False):
        g = _full_graph_only(self, g)
        (_, lin_in), *convs, (_, lin_out) = self.layers
        h0 = h = ng.relu(lin_in(self._dropout(x, training)))
        for _, conv in convs:
            h = ng.relu(conv(g, self._dropout(h, training), h0, training))
        return lin_out(self._dropout(h, training))
