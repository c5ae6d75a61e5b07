"""Graph convolution layers, written per vertex with ng.zoomIn / ng.zoomOut (or, for G-GCN,
in SAGA-NN with ng.saga).

Each layer holds its parameters as ng.variable ops (Glorot-uniform weights drawn from a
NumPy Generator seeded by `seed`, zero biases) and is called as `layer(g, h, training)` on
a node tensor h of shape (N, in_feats); it returns the output node tensor.
"""
import numpy as np

import ngnn as ng


class Layer:
    def __init__(self, seed, dtype):
        self.rng = np.random.default_rng(seed)
        self.dtype = np.dtype(dtype)
        self.params = []

    updates = ()          # assignments a training call records (nn.BatchNorm's statistics)

    def parameters(self):
        return list(self.params)

    def buffers(self):
        """Variables the layer keeps that no optimizer trains."""
        return []

    def glorot(self, name, shape):
        fan_in, fan_out = int(np.prod(shape[:-1])), shape[-1]
        limit = np.sqrt(6.0 / (fan_in + fan_out))
        return self.variable(name, shape, self.rng.uniform(-limit, limit, shape))

    def fan_in_uniform(self, name, shape, fan_in):
        """U(-1/sqrt(fan_in), 1/sqrt(fan_in)): PyTorch's default for nn.Linear's weight and
        bias (what the GIN paper's code trains from)."""
        limit = 1.0 / np.sqrt(fan_in)
        return self.variable(name, shape, self.rng.uniform(-limit, limit, shape))

    def zeros(self, name, shape):
        return self.variable(name, shape, np.zeros(shape))

    def variable(self, name, shape, value):
        var = ng.variable(shape, dtype=self.dtype, initial_value=value,
                          name=f"{type(self).__name__.lower()}.{name}")
        self.params.append(var)
        return var


class Linear(Layer):
    """x W + b, for the dense parts of a model (APPNP's and GCNII's MLPs, GIN-0's heads). x
    may be a sparse placeholder: the product is then a sparse-dense product. `init`
    "glorot" (Glorot-uniform W, zero b) or "fan_in" (PyTorch's nn.Linear default: W and b
    uniform in +-1/sqrt(in_feats))."""

    def __init__(self, in_feats, out_feats, bias=True, seed=0, dtype=np.float32,
                 init="glorot"):
        super().__init__(seed, dtype)
        if init not in ("glorot", "fan_in"):
            raise ValueError(f"Linear: init must be 'glorot' or 'fan_in', got {init!r}")
        if init == "glorot":
            self.weight = self.glorot("weight", (in_feats, out_feats))
            self.bias = self.zeros("bias", (out_feats,)) if bias else None
        else:
            self.weight = self.fan_in_uniform("weight", (in_feats, out_feats), in_feats)
            self.bias = self.fan_in_uniform("bias", (out_feats,), in_feats) if bias else None

    def __call__(self, x):
        out = ng.dot(x, self.weight)
        return out if self.bias is None else out + self.bias


def inv_sqrt_degree(degree):
    """degree ** -1/2, and 0 for degree 0 (such a vertex has no edges to weight anyway, so
    0 keeps inf out of the products)."""
    return ng.minimum(degree, 1.0) / ng.sqrt(ng.maximum(degree, 1.0))


def edge_heads(alpha):
    """An attention's (E, heads, 1) coefficients as (E, heads), PyG's layout."""
    return ng.reshape(alpha, alpha.shape[:2])


class GCNConv(Layer):
    """Kipf & Welling's graph convolution, D_in^-1/2 A D_out^-1/2 h W (+ b): each message
    is scaled by its source's out-degree^-1/2 and the sum by the destination's
    in-degree^-1/2. For the usual D^-1/2 (A+I) D^-1/2, pass g.add_self_loops() of an
    undirected graph: the layer adds no self loops of its own."""

    def __init__(self, in_feats, out_feats, bias=True, seed=0, dtype=np.float32):
        super().__init__(seed, dtype)
        self.in_feats, self.out_feats = in_feats, out_feats
        self.weight = self.glorot("weight", (in_feats, out_feats))
        self.bias = self.zeros("bias", (out_feats,)) if bias else None

    def __call__(self, g, h, training=False):
        W = self.weight
        # Aggregation is linear, so W may come first: then edges carry the narrower vectors
        # (seed 004's aggregate-or-transform-first choice).
        transform_first = self.out_feats < self.in_feats
        with ng.zoomIn(g, node_feat={"h": h}) as v:
            rst = sum((n.h @ W if transform_first else n.h) * inv_sqrt_degree(n.outdegree)
                      for n in v.innbs) * inv_sqrt_degree(v.indegree)
            if not transform_first:
                rst = rst @ W
            if self.bias is not None:
                rst = rst + self.bias
        return ng.zoomOut(rst)


class GATConv(Layer):
    """Graph attention (seed 000's listing): per in-edge, a = softmax over the in-edges of
    leaky_relu(el[src] + er[dst]) per head; the output is sum(a * Wh[src]), of shape
    (N, num_heads, out_feats). The softmax subtracts the per-vertex max first (a shift
    the softmax cancels, so it is a constant to ng.grad). A vertex without in-edges outputs 0 (plus the
    bias, one per head and feature, as in the paper's layers)."""

    def __init__(self, in_feats, out_feats, num_heads, feat_drop=0.0, attn_drop=0.0,
                 negative_slope=0.2, bias=True, seed=0, dtype=np.float32):
        super().__init__(seed, dtype)
        self.out_feats, self.num_heads = out_feats, num_heads
        self.feat_drop, self.attn_drop = feat_drop, attn_drop
        self.negative_slope = negative_slope
        self.fc = self.glorot("fc", (in_feats, num_heads * out_feats))
        self.attn_l = self.glorot("attn_l", (num_heads, out_feats))
        self.attn_r = self.glorot("attn_r", (num_heads, out_feats))
        self.bias = self.zeros("bias", (num_heads, out_feats)) if bias else None

    def __call__(self, g, h, training=False, return_attention=False):
        """The output node tensor; with return_attention=True, (output, alpha) where alpha
        (E, num_heads) holds each in-edge's softmax weight (before attention dropout)."""
        heads = (self.num_heads, self.out_feats)
        if training and self.feat_drop:
            # Before zoomIn, so the vertex and its neighbours see one dropped feature
            # matrix and share one transform.
            h = ng.dropout(h, self.feat_drop)
        with ng.zoomIn(g, node_feat={"h": h}) as v:
            feat_src = [ng.reshape(n.h @ self.fc, heads) for n in v.innbs]
            el = [ng.sum(f * self.attn_l, axis=-1, keepdims=True) for f in feat_src]
            er = ng.sum(ng.reshape(v.h @ self.fc, heads) * self.attn_r, axis=-1,
                        keepdims=True)
            logits = [ng.leaky_relu(l + er, self.negative_slope) for l in el]
            peak = ng.stop_gradient(max(logits))
            coeff = [ng.exp(x - peak) for x in logits]
            s = sum(coeff)
            attention = [c / s for c in coeff]
            alpha = attention
            if training and self.attn_drop:
                alpha = [ng.dropout(a, self.attn_drop) for a in alpha]
            rst = sum(a * f for a, f in zip(alpha, feat_src))
            if self.bias is not None:
                rst = rst + self.bias
        if return_attention:
            return ng.zoomOut(rst), edge_heads(ng.zoomOut(*attention))
        return ng.zoomOut(rst)


class SAGEConv(Layer):
    """GraphSAGE with the mean aggregator: h W_self + mean(h of in-neighbours) W_neigh + b,
    separate weights in place of a concatenation (seed 004). A vertex without in-neighbours
    aggregates 0."""

    def __init__(self, in_feats, out_feats, seed=0, dtype=np.float32):
        super().__init__(seed, dtype)
        self.in_feats, self.out_feats = in_feats, out_feats
        self.w_self = self.glorot("w_self", (in_feats, out_feats))
        self.w_neigh = self.glorot("w_neigh", (in_feats, out_feats))
        self.bias = self.zeros("bias", (out_feats,))

    def __call__(self, g, h, training=False):
        with ng.zoomIn(g, node_feat={"h": h}) as v:
            if self.out_feats < self.in_feats:     # the mean is linear: transform first
                neigh = ng.mean([n.h @ self.w_neigh for n in v.innbs])
            else:
                neigh = ng.mean([n.h for n in v.innbs]) @ self.w_neigh
            rst = v.h @ self.w_self + neigh + self.bias
        return ng.zoomOut(rst)


class GINConv(Layer):
    """Graph isomorphism network layer: MLP((1 + eps) h + sum of in-neighbours' h), with
    MLP = Linear(in, hidden) - ReLU - Linear(hidden, out); hidden defaults to out_feats.
    `init` "glorot" (Glorot-uniform weights, zero biases) or "fan_in" (PyTorch's
    nn.Linear default, weights and biases alike)."""

    def __init__(self, in_feats, out_feats, eps=0.0, hidden=None, seed=0, dtype=np.float32,
                 init="glorot"):
        super().__init__(seed, dtype)
        hidden = out_feats if hidden is None else hidden
        self.eps = float(eps)
        if init == "glorot":
            self.w1 = self.glorot("w1", (in_feats, hidden))
            self.b1 = self.zeros("b1", (hidden,))
            self.w2 = self.glorot("w2", (hidden, out_feats))
            self.b2 = self.zeros("b2", (out_feats,))
        elif init == "fan_in":
            self.w1 = self.fan_in_uniform("w1", (in_feats, hidden), in_feats)
            self.b1 = self.fan_in_uniform("b1", (hidden,), in_feats)
            self.w2 = self.fan_in_uniform("w2", (hidden, out_feats), hidden)
            self.b2 = self.fan_in_uniform("b2", (out_feats,), hidden)
        else:
            raise ValueError(f"GINConv: init must be 'glorot' or 'fan_in', got {init!r}")

    def __call__(self, g, h, training=False):
        with ng.zoomIn(g, node_feat={"h": h}) as v:
            total = (1.0 + self.eps) * v.h + sum(n.h for n in v.innbs)
            rst = ng.relu(total @ self.w1 + self.b1) @ self.w2 + self.b2
        return ng.zoomOut(rst)


class GatedGCNConv(Layer):
    """Gated GCN (G-GCN), NeuGraph's running example (seed 003), written in SAGA-NN:
    for each edge u -> v a gate eta = sigmoid(h_v A + h_u B) (one value per input feature),
    then h_v' = activation((sum over in-edges of eta * h_u) W). ApplyEdge computes the gated
    message, Gather sums it, ApplyVertex applies W and the activation (ReLU, as in the seed;
    activation=None leaves it out). h_u B and h_v A are computed once per vertex, not once
    per edge: operation batching computes node values as node tensors and gathers them."""

    def __init__(self, in_feats, out_feats, activation=ng.relu, seed=0, dtype=np.float32):
        super().__init__(seed, dtype)
        self.in_feats, self.out_feats = in_feats, out_feats
        self.activation = activation
        self.gate_dst = self.glorot("gate_dst", (in_feats, in_feats))     # A
        self.gate_src = self.glorot("gate_src", (in_feats, in_feats))     # B
        self.weight = self.glorot("weight", (in_feats, out_feats))       # W

    def apply_edge(self, src, dst, edge):
        gate = ng.sigmoid(dst.h @ self.gate_dst + src.h @ self.gate_src)
        return gate * src.h

    def apply_vertex(self, vertex, accum):
        out = accum @ self.weight
        return out if self.activation is None else self.activation(out)

    def __call__(self, g, h, training=False):
        return ng.saga(g, node_feat={"h": h}, apply_edge=self.apply_edge, accumulator="sum",
                       apply_vertex=self.apply_vertex)
