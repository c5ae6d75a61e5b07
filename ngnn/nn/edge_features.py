"""Layers whose message is computed per edge from more than the source's features: the
edge's own features (GINE, PNA) or both of its ends (EdgeConv, PNA).

A product with a concatenation, [a, b] @ W, is written as a @ W_a + b @ W_b with W's row
blocks: a node's part is then computed once per node (and gathered onto its edges), not
once per edge. The parameters keep the concatenated layout, as PyG's Linear has it.
"""
import numpy as np

import ngnn as ng

from .layers import Layer

AGGREGATORS = ("mean", "min", "max", "std")
SCALERS = ("identity", "amplification", "attenuation", "linear", "inverse_linear")
STD_FLOOR = 1e-5     # PyG's: a variance at or below it gives a standard deviation of 0


class GINEConv(Layer):
    """Hu et al. (2020), GIN with edge features: MLP((1 + eps) h_v + sum over in-edges
    u -> v of relu(h_u + e_uv)), the MLP Linear - ReLU - Linear as in GINConv. With
    edge_dim, edge features go through a linear map to in_feats first (PyG's edge_dim);
    without it they must be in_feats wide. Called as `layer(g, h, e)`."""

    def __init__(self, in_feats, out_feats, edge_dim=None, eps=0.0, hidden=None, seed=0,
                 dtype=np.float32):
        super().__init__(seed, dtype)
        hidden = out_feats if hidden is None else hidden
        self.in_feats, self.edge_dim, self.eps = in_feats, edge_dim, float(eps)
        if edge_dim is not None:
            self.w_edge = self.glorot("w_edge", (edge_dim, in_feats))
            self.b_edge = self.zeros("b_edge", (in_feats,))
        self.w1 = self.glorot("w1", (in_feats, hidden))
        self.b1 = self.zeros("b1", (hidden,))
        self.w2 = self.glorot("w2", (hidden, out_feats))
        self.b2 = self.zeros("b2", (out_feats,))

    def __call__(self, g, h, e, training=False):
        width = self.in_feats if self.edge_dim is None else self.edge_dim
        if e.shape[1:] != (width,):
            raise ng.ShapeError(f"GINEConv: edge features must have shape (E, {width}), got "
                                f"{e.shape}")
        with ng.zoomIn(g, node_feat={"h": h}, edge_feat={"e": e}) as v:
            if self.edge_dim is None:
                edges = [edge.e for edge in v.inedges]
            else:
                edges = [edge.e @ self.w_edge + self.b_edge for edge in v.inedges]
            messages = [ng.relu(n.h + x) for n, x in zip(v.innbs, edges)]
            total = (1.0 + self.eps) * v.h + sum(messages)
            rst = ng.relu(total @ self.w1 + self.b1) @ self.w2 + self.b2
        return ng.zoomOut(rst)


class EdgeConv(Layer):
    """Wang et al. (2019), DGCNN's edge convolution: for each in-edge u -> v an MLP of
    [h_v, h_u - h_v] (Linear(2 in, hidden) - ReLU - Linear(hidden, out)), reduced over the
    in-edges by `aggr` ("max" as in the paper; "sum", "mean", "min")."""

    REDUCE = {"max": ng.max, "sum": ng.sum, "mean": ng.mean, "min": ng.min}

    def __init__(self, in_feats, out_feats, hidden=None, aggr="max", seed=0,
                 dtype=np.float32):
        super().__init__(seed, dtype)
        if aggr not in self.REDUCE:
            raise ValueError(f"EdgeConv: aggr must be one of {tuple(self.REDUCE)}, got "
                             f"{aggr!r}")
        hidden = out_feats if hidden is None else hidden
        self.in_feats, self.aggr = in_feats, aggr
        self.w1 = self.glorot("w1", (2 * in_feats, hidden))
        self.b1 = self.zeros("b1", (hidden,))
        self.w2 = self.glorot("w2", (hidden, out_feats))
        self.b2 = self.zeros("b2", (out_feats,))

    def __call__(self, g, h, training=False):
        f = self.in_feats
        w_vertex, w_diff = self.w1[:f], self.w1[f:]
        # [h_v, h_u - h_v] @ w1 = h_v @ (w_vertex - w_diff) + h_u @ w_diff: two node-sized
        # products in place of one edge-sized product
        with ng.zoomIn(g, node_feat={"h": h}) as v:
            own = v.h @ (w_vertex - w_diff) + self.b1
            messages = [ng.relu(own + n.h @ w_diff) @ self.w2 + self.b2 for n in v.innbs]
            rst = self.REDUCE[self.aggr](messages)
        return ng.zoomOut(rst)


def degree_histogram(g):
    """counts[d] = number of vertices with in-degree d: PNAConv's `deg` (PyG's
    PNAConv.get_degree_histogram)."""
    return np.bincount(g.in_degrees[:g.num_dst], minlength=1)


class PNAConv(Layer):
    """Corso et al. (2020), principal neighbourhood aggregation: messages
    M([h_v, h_u, E e_uv]) (one linear layer; E encodes edge features when edge_dim is
    given) are reduced by several aggregators (mean, min, max, std) and each result is
    scaled by functions of the in-degree d (identity; amplification log(d + 1) / delta;
    attenuation delta / log(max(d, 1) + 1); linear d / mean degree; inverse_linear), delta
    the mean of log(d + 1) over `deg`, the training graph's in-degree histogram
    (degree_histogram(g)). Then out = lin(U([h_v, scaled...])). One tower, one pre- and one
    post-layer (PyG's defaults). Called as `layer(g, h)` or `layer(g, h, e)`."""

    def __init__(self, in_feats, out_feats, deg, aggregators=AGGREGATORS,
                 scalers=("identity", "amplification", "attenuation"), edge_dim=None, seed=0,
                 dtype=np.float32):
        super().__init__(seed, dtype)
        unknown = [a for a in aggregators if a not in AGGREGATORS] + \
            [s for s in scalers if s not in SCALERS]
        if unknown or not aggregators or not scalers:
            raise ValueError(f"PNAConv: aggregators come from {AGGREGATORS} and scalers "
                             f"from {SCALERS}, at least one of each; got {list(aggregators)} "
                             f"and {list(scalers)}")
        counts = np.asarray(deg, dtype=np.float64)
        if counts.ndim != 1 or counts.sum() <= 0 or np.any(counts < 0):
            raise ValueError("PNAConv: deg must be a histogram of in-degrees (counts[d] = "
                             f"vertices of in-degree d), got {deg!r}")
        bins = np.arange(len(counts))
        self.mean_degree = float((bins * counts).sum() / counts.sum())
        self.mean_log_degree = float((np.log(bins + 1.0) * counts).sum() / counts.sum())
        self.aggregators, self.scalers = tuple(aggregators), tuple(scalers)
        self.in_feats, self.edge_dim = in_feats, edge_dim
        if edge_dim is not None:
            self.w_edge = self.glorot("w_edge", (edge_dim, in_feats))
            self.b_edge = self.zeros("b_edge", (in_feats,))
        parts = 3 if edge_dim is not None else 2
        self.w_pre = self.glorot("w_pre", (parts * in_feats, in_feats))
        self.b_pre = self.zeros("b_pre", (in_feats,))
        blocks = len(self.aggregators) * len(self.scalers) + 1
        self.w_post = self.glorot("w_post", (blocks * in_feats, out_feats))
        self.b_post = self.zeros("b_post", (out_feats,))
        self.w_out = self.glorot("w_out", (out_feats, out_feats))
        self.b_out = self.zeros("b_out", (out_feats,))

    def aggregate(self, name, messages):
        if name != "std":
            return {"mean": ng.mean, "min": ng.min, "max": ng.max}[name](messages)
        # sqrt(E[m^2] - E[m]^2), composed as PyG does; a variance at or below STD_FLOOR
        # (a single message, or equal ones, up to rounding) gives 0 and no gradient
        mean = ng.mean(messages)
        variance = ng.mean([m * m for m in messages]) - mean * mean
        return (variance > STD_FLOOR) * ng.sqrt(ng.maximum(variance, STD_FLOOR))

    def scale(self, name, x, degree):
        log_degree = ng.log(ng.maximum(degree, 1.0) + 1.0)
        return {"identity": lambda: x,
                "amplification": lambda: x * (log_degree / self.mean_log_degree),
                "attenuation": lambda: x * (self.mean_log_degree / log_degree),
                "linear": lambda: x * (degree / self.mean_degree),
                "inverse_linear": lambda: x * (self.mean_degree / ng.maximum(degree, 1.0)),
                }[name]()

    def __call__(self, g, h, e=None, training=False):
        if (e is None) != (self.edge_dim is None):
            raise ValueError(f"PNAConv: built with edge_dim={self.edge_dim}, so it needs "
                             f"edge features {'' if self.edge_dim else 'none '}(got "
                             f"{'none' if e is None else e.shape})")
        f = self.in_feats
        w_dst, w_src, w_edge = self.w_pre[:f], self.w_pre[f:2 * f], self.w_pre[2 * f:]
        edge_feat = {} if e is None else {"e": e}
        with ng.zoomIn(g, node_feat={"h": h}, edge_feat=edge_feat) as v:
            # [h_v, h_u, E e_uv] @ w_pre, by row blocks
            own = v.h @ w_dst + self.b_pre
            if e is None:
                messages = [own + n.h @ w_src for n in v.innbs]
            else:
                messages = [own + n.h @ w_src + (edge.e @ self.w_edge + self.b_edge) @ w_edge
                            for n, edge in zip(v.innbs, v.inedges)]
            aggregated = [self.aggregate(a, messages) for a in self.aggregators]
            scaled = [self.scale(s, x, v.indegree) for s in self.scalers for x in aggregated]
            rst = ng.concat([v.h] + scaled, axis=-1) @ self.w_post + self.b_post
            rst = rst @ self.w_out + self.b_out
        return ng.zoomOut(rst)
