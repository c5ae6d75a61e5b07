"""Attention layers beyond GAT, written per vertex: GATv2, the graph transformer's
multi-head attention (TransformerConv) and AGNN.

Each computes one logit per in-edge (and head), normalises the logits by a softmax over the
vertex's in-edges and sums the in-neighbours' messages weighted by the result. With
`return_attention=True` a layer returns (output, alpha), alpha (E, heads) the softmax
weights in edge id order; without it no E-sized value outlives the fused aggregation.
"""
import numpy as np

import ngnn as ng

from .layers import Layer, edge_heads


def softmax_over_in_edges(logits):
    """Per-edge logits (a list over v.inedges) -> their softmax over the vertex's in-edges.
    The per-vertex max is subtracted first (a shift the softmax cancels, so a constant to
    ng.grad), which keeps exp finite for large logits."""
    peak = ng.stop_gradient(max(logits))
    coeff = [ng.exp(x - peak) for x in logits]
    total = sum(coeff)
    return [c / total for c in coeff]


class GATv2Conv(Layer):
    """Brody et al. (2022), "How attentive are graph attention networks?": the attention of
    edge u -> v is a . leaky_relu(W_src h_u + W_dst h_v) per head, so the ranking of
    neighbours may depend on v (GAT's a . [W h_u || W h_v] cannot). Messages are W_src h_u;
    the output is (N, num_heads, out_feats). Both transforms have a bias, as in PyG."""

    def __init__(self, in_feats, out_feats, num_heads, negative_slope=0.2, attn_drop=0.0,
                 bias=True, seed=0, dtype=np.float32):
        super().__init__(seed, dtype)
        self.out_feats, self.num_heads = out_feats, num_heads
        self.negative_slope, self.attn_drop = negative_slope, attn_drop
        width = num_heads * out_feats
        self.w_src = self.glorot("w_src", (in_feats, width))
        self.b_src = self.zeros("b_src", (width,))
        self.w_dst = self.glorot("w_dst", (in_feats, width))
        self.b_dst = self.zeros("b_dst", (width,))
        self.attn = self.glorot("attn", (num_heads, out_feats))
        self.bias = self.zeros("bias", (num_heads, out_feats)) if bias else None

    def __call__(self, g, h, training=False, return_attention=False):
        heads = (self.num_heads, self.out_feats)
        with ng.zoomIn(g, node_feat={"h": h}) as v:
            src = [ng.reshape(n.h @ self.w_src + self.b_src, heads) for n in v.innbs]
            dst = ng.reshape(v.h @ self.w_dst + self.b_dst, heads)
            logits = [ng.sum(ng.leaky_relu(s + dst, self.negative_slope) * self.attn,
                             axis=-1, keepdims=True) for s in src]
            attention = softmax_over_in_edges(logits)
            alpha = attention
            if training and self.attn_drop:
                alpha = [ng.dropout(a, self.attn_drop) for a in alpha]
            rst = sum(a * s for a, s in zip(alpha, src))
            if self.bias is not None:
                rst = rst + self.bias
        if return_attention:
            return ng.zoomOut(rst), edge_heads(ng.zoomOut(*attention))
        return ng.zoomOut(rst)


class TransformerConv(Layer):
    """Shi et al. (2021), the graph transformer's multi-head attention: per head, the query
    of v (W_q h_v) against the key of each in-edge u -> v (W_k h_u, plus W_e e_uv when the
    layer has edge features), scaled by out_feats^-1/2 and normalised over the in-edges,
    weights the values (W_v h_u, plus the same W_e e_uv). A skip connection W_skip h_v is
    added: output (N, num_heads, out_feats). Call as `layer(g, h, e)` with edge features
    of width edge_dim."""

    def __init__(self, in_feats, out_feats, num_heads=1, edge_dim=None, attn_drop=0.0,
                 root_weight=True, seed=0, dtype=np.float32):
        super().__init__(seed, dtype)
        self.out_feats, self.num_heads = out_feats, num_heads
        self.edge_dim, self.attn_drop = edge_dim, attn_drop
        width = num_heads * out_feats
        self.w_query = self.glorot("w_query", (in_feats, width))
        self.b_query = self.zeros("b_query", (width,))
        self.w_key = self.glorot("w_key", (in_feats, width))
        self.b_key = self.zeros("b_key", (width,))
        self.w_value = self.glorot("w_value", (in_feats, width))
        self.b_value = self.zeros("b_value", (width,))
        self.w_edge = self.glorot("w_edge", (edge_dim, width)) if edge_dim else None
        if root_weight:
            self.w_skip = self.glorot("w_skip", (in_feats, width))
            self.b_skip = self.zeros("b_skip", (width,))
        self.root_weight = root_weight

    def __call__(self, g, h, e=None, training=False, return_attention=False):
        if (e is None) != (self.edge_dim is None):
            raise ValueError(f"TransformerConv: built with edge_dim={self.edge_dim}, so it "
                             f"needs edge features {'' if self.edge_dim else 'none '}"
                             f"(got {'none' if e is None else e.shape})")
        num_heads, out_feats = self.num_heads, self.out_feats
        heads = (num_heads, out_feats)
        scale = 1.0 / np.sqrt(out_feats)
        query = ng.reshape(ng.dot(h, self.w_query) + self.b_query, (h.shape[0],) + heads)
        node_feat, edge_feat = {"h": h, "query": query}, {}
        if e is not None:
            # The encoded edge feature e W_e is never made per edge: the query against it,
            # q . (e W_e) per head, is (W_e q) . e, a per-vertex product against the edge's
            # own features, and the weighted sum of encoded features, sum a (e W_e), is
            # (sum a e) W_e. So the edges carry edge_dim values per head, not out_feats.
            w_edge = ng.reshape(self.w_edge, (self.edge_dim,) + heads)    # (D, H, F)
            node_feat["query_edge"] = per_head(query, ng.transpose(w_edge, (1, 2, 0)))
            edge_feat["e"] = e
        with ng.zoomIn(g, node_feat=node_feat, edge_feat=edge_feat) as v:
            keys = [ng.reshape(n.h @ self.w_key + self.b_key, heads) for n in v.innbs]
            values = [ng.reshape(n.h @ self.w_value + self.b_value, heads) for n in v.innbs]
            logits = [ng.sum(v.query * k, axis=-1, keepdims=True) for k in keys]
            if e is not None:
                feats = [ng.reshape(edge.e, (1, self.edge_dim)) for edge in v.inedges]
                logits = [x + ng.sum(v.query_edge * f, axis=-1, keepdims=True)
                          for x, f in zip(logits, feats)]
            attention = softmax_over_in_edges([x * scale for x in logits])
            alpha = attention
            if training and self.attn_drop:
                alpha = [ng.dropout(a, self.attn_drop) for a in alpha]
            rst = sum(a * x for a, x in zip(alpha, values))
            if e is not None:
                weighted_feats = sum(a * f for a, f in zip(alpha, feats))   # (H, D)
            if self.root_weight:
                rst = rst + ng.reshape(v.h @ self.w_skip + self.b_skip, heads)
        out = ng.zoomOut(rst)
        if e is not None:
            out = out + per_head(ng.zoomOut(weighted_feats), ng.transpose(w_edge, (1, 0, 2)))
        if return_attention:
            return out, edge_heads(ng.zoomOut(*attention))
        return out


def per_head(x, weights):
    """x (N, H, A) times one matrix per head, weights (H, A, B): (N, H, B)."""
    return ng.transpose(ng.dot(ng.transpose(x, (1, 0, 2)), weights), (1, 0, 2))


class AGNNConv(Layer):
    """Thekumparampil et al. (2018), attention-based propagation: the attention of u -> v is
    beta * cos(h_u, h_v), normalised over v's in-edges; the output is the weighted sum of
    the in-neighbours' h (no transform, so out width = in width). beta is learned unless
    learn_beta=False (then it is 1)."""

    def __init__(self, learn_beta=True, seed=0, dtype=np.float32):
        super().__init__(seed, dtype)
        self.beta = self.variable("beta", (1,), np.ones(1)) if learn_beta else 1.0

    def __call__(self, g, h, training=False, return_attention=False):
        # cos(h_u, h_v) = (h_u . h_v) / (|h_u| |h_v|), each norm at least 1e-12 as in
        # torch.nn.functional.normalize (a zero row has cosine 0). Written with the rows
        # of h themselves, not unit rows: the weighted sum reads each neighbour's h row
        # anyway, so a backward walk recomputes the logits from rows it reads plus one
        # float per edge instead of keeping them (E floats) from the forward pass.
        inverse_norm = 1.0 / ng.maximum(ng.sqrt(ng.sum(h * h, axis=-1, keepdims=True)), 1e-12)
        with ng.zoomIn(g, node_feat={"h": h, "inverse_norm": inverse_norm}) as v:
            logits = [self.beta * (ng.sum(n.h * v.h, axis=-1, keepdims=True) *
                                   n.inverse_norm * v.inverse_norm)
                      for n in v.innbs]
            attention = softmax_over_in_edges(logits)
            rst = sum(a * n.h for a, n in zip(attention, v.innbs))
        if return_attention:
            return ng.zoomOut(rst), ng.zoomOut(*attention)
        return ng.zoomOut(rst)
