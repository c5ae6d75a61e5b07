"""Layers built on repeated GCN propagation, h -> D^-1/2 A D^-1/2 h: APPNP's personalised
PageRank, SGC, GCNII and Chebyshev filters.

Like GCNConv they run on the graph as given: a model that wants A + I passes
g.with_self_loops(), and the normalisation weighs each message by its source's
out-degree^-1/2 and the sum by the destination's in-degree^-1/2. The hops are a Python for
loop over a constant K: each iteration traces one more vertex program, so K hops become K
graph aggregations in the op-graph (seed 000's example of control flow that traces).
"""
import numpy as np

import ngnn as ng

from .layers import Layer, inv_sqrt_degree


def propagate(g, h):
    """One hop of symmetric-normalised propagation, D_in^-1/2 A D_out^-1/2 h."""
    with ng.zoomIn(g, node_feat={"h": h}) as v:
        rst = sum(n.h * inv_sqrt_degree(n.outdegree) for n in v.innbs) * \
            inv_sqrt_degree(v.indegree)
    return ng.zoomOut(rst)


def _check_hops(layer, k, least):
    if isinstance(k, bool) or not isinstance(k, int) or k < least:
        raise ValueError(f"{layer}: K must be an int >= {least}, got {k!r}")


class APPNPConv(Layer):
    """Klicpera et al. (2019), "Predict then propagate": K steps of personalised PageRank,
    h <- (1 - alpha) A_hat h + alpha h0 with h0 the input. No parameters; the model's MLP
    makes the predictions it propagates (nn.APPNP)."""

    def __init__(self, k=10, alpha=0.1, seed=0, dtype=np.float32):
        super().__init__(seed, dtype)
        _check_hops("APPNPConv", k, 0)
        self.k, self.alpha = k, float(alpha)

    def __call__(self, g, h, training=False):
        h0 = h
        for _ in range(self.k):
            h = (1.0 - self.alpha) * propagate(g, h) + self.alpha * h0
        return h


class SGConv(Layer):
    """Wu et al. (2019), simplified graph convolution: A_hat^K h W + b, K hops without
    nonlinearities between them, then one linear map."""

    def __init__(self, in_feats, out_feats, k=1, bias=True, seed=0, dtype=np.float32):
        super().__init__(seed, dtype)
        _check_hops("SGConv", k, 0)
        self.k = k
        self.weight = self.glorot("weight", (in_feats, out_feats))
        self.bias = self.zeros("bias", (out_feats,)) if bias else None

    def __call__(self, g, h, training=False):
        for _ in range(self.k):
            h = propagate(g, h)
        h = h @ self.weight
        return h if self.bias is None else h + self.bias


class GCN2Conv(Layer):
    """Chen et al. (2020), GCNII's layer: an initial residual and an identity mapping,
        x = (1 - alpha) A_hat h + alpha h0
        out = (1 - beta) x + beta x W,      beta = log(theta / layer + 1)
    (beta = 1 without theta and layer). With shared_weights=False the two terms get their
    own weights: (1 - beta) x1 + beta x1 W1 + (1 - beta) x0 + beta x0 W2, with
    x1 = (1 - alpha) A_hat h and x0 = alpha h0. Called as `layer(g, h, h0)`."""

    def __init__(self, channels, alpha, theta=None, layer=None, shared_weights=True, seed=0,
                 dtype=np.float32):
        super().__init__(seed, dtype)
        if (theta is None) != (layer is None):
            raise ValueError("GCN2Conv: give theta and layer together (or neither)")
        self.alpha = float(alpha)
        self.beta = 1.0 if theta is None else float(np.log(theta / layer + 1.0))
        self.weight1 = self.glorot("weight1", (channels, channels))
        self.weight2 = None if shared_weights else self.glorot("weight2", (channels, channels))

    def identity_mapping(self, x, weight):
        return (1.0 - self.beta) * x + self.beta * (x @ weight)

    def __call__(self, g, h, h0, training=False):
        x = (1.0 - self.alpha) * propagate(g, h)
        x0 = self.alpha * h0
        if self.weight2 is None:
            return self.identity_mapping(x + x0, self.weight1)
        return self.identity_mapping(x, self.weight1) + self.identity_mapping(x0, self.weight2)


class ChebConv(Layer):
    """Defferrard et al. (2016), Chebyshev spectral filter of order K:
    sum_k T_k(L_hat) h W_k + b, with T_0 = h, T_1 = L_hat h, T_k = 2 L_hat T_{k-1} - T_{k-2}
    and L_hat = 2 L / lambda_max - I for the normalised Laplacian L = I - A_hat. With
    lambda_max = 2 (the default, as in PyG), L_hat = -A_hat. Pass a graph without self loops
    (PyG drops them before building L)."""

    def __init__(self, in_feats, out_feats, k, lambda_max=2.0, bias=True, seed=0,
                 dtype=np.float32):
        super().__init__(seed, dtype)
        _check_hops("ChebConv", k, 1)
        self.lambda_max = float(lambda_max)
        self.weights = [self.glorot(f"weight{i}", (in_feats, out_feats)) for i in range(k)]
        self.bias = self.zeros("bias", (out_feats,)) if bias else None

    def laplacian(self, g, h):
        """L_hat h = (2 / lambda_max) (h - A_hat h) - h."""
        return (2.0 / self.lambda_max) * (h - propagate(g, h)) - h

    def __call__(self, g, h, training=False):
        terms = [h]
        if len(self.weights) > 1:
            terms.append(self.laplacian(g, h))
        while len(terms) < len(self.weights):
            terms.append(2.0 * self.laplacian(g, terms[-1]) - terms[-2])
        out = sum(t @ w for t, w in zip(terms, self.weights))
        return out if self.bias is None else out + self.bias
