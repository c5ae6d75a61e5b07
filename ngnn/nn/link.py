"""Link prediction: edge-level decoders over a graph of query pairs, and the encoder-decoder
model.

A decoder scores vertex pairs (u, v) from the node embeddings z an encoder computed. The
pairs are the edges of a graph of their own (edge i: u[i] -> v[i]), and the score is the
per-vertex code of an edge seen from its destination: `n` is u (the in-neighbour), `v` is
v, and `ng.zoomOut` of the per-edge value gives one logit per pair, in pair order. Written
so, the decoder is an edge computation like a GAT's attention logits: it fuses with the
gathers of both ends, and its gradient is the aggregation back onto u and v.
"""
import numpy as np

import ngnn as ng

from .layers import Layer


class DotDecoder(Layer):
    """logit(u, v) = z[u] . z[v] (the GAE paper's inner-product decoder)."""

    def __init__(self, dtype=np.float32):
        super().__init__(seed=0, dtype=dtype)

    def __call__(self, pairs, z, training=False):
        with ng.zoomIn(pairs, node_feat={"z": z}) as v:
            scores = [ng.sum(n.z * v.z, axis=-1) for n in v.innbs]
        return ng.zoomOut(scores)


class MLPDecoder(Layer):
    """logit(u, v) = w2 . relu((z[u] * z[v]) W1 + b1) + b2: an MLP over the element-wise
    product of the two embeddings (OGB's link predictor; symmetric in u and v, as an
    undirected link is)."""

    def __init__(self, in_feats, hidden, dropout=0.0, seed=0, dtype=np.float32):
        super().__init__(seed, dtype)
        self.dropout = dropout
        self.w1 = self.glorot("w1", (in_feats, hidden))
        self.b1 = self.zeros("b1", (hidden,))
        self.w2 = self.glorot("w2", (hidden, 1))
        self.b2 = self.zeros("b2", (1,))

    def __call__(self, pairs, z, training=False):
        with ng.zoomIn(pairs, node_feat={"z": z}) as v:
            hidden = [ng.relu((n.z * v.z) @ self.w1 + self.b1) for n in v.innbs]
            if training and self.dropout:
                hidden = [ng.dropout(h, self.dropout) for h in hidden]
            scores = [ng.sum(h @ self.w2 + self.b2, axis=-1) for h in hidden]
        return ng.zoomOut(scores)


class LinkPredictor:
    """`encoder` (a node model: `encoder(g, x, training)` gives embeddings (N, F)) followed
    by `decoder` (default: DotDecoder). `model(g, x, pairs, training)` gives the logits of
    the pairs graph's edges; `embed` and `decode` are the two halves."""

    def __init__(self, encoder, decoder=None):
        self.encoder = encoder
        self.decoder = DotDecoder() if decoder is None else decoder

    def embed(self, g, x, training=False):
        return self.encoder(g, x, training=training)

    def decode(self, pairs, z, training=False):
        return self.decoder(pairs, z, training=training)

    def __call__(self, g, x, pairs, training=False):
        return self.decode(pairs, self.embed(g, x, training), training)

    def parameters(self):
        return self.encoder.parameters() + self.decoder.parameters()

    def named_parameters(self):
        """[(name, variable)]: "encoder.<name>" and "decoder.<param>"."""
        return ([("encoder." + name, p) for name, p in self.encoder.named_parameters()] +
                [("decoder." + p.name.rsplit(".", 1)[-1], p)
                 for p in self.decoder.parameters()])
