"""R-GCN (Schlichtkrull et al., "Modeling Relational Data with Graph Convolutional Networks",
ESWC 2018) over a relation-typed graph (ng.Graph.from_edges(..., edge_type=t)):

    h_i' = sum_r sum_{j in N_i^r} (1 / c_{i,r}) W_r h_j  +  W_0 h_i  (+ b)

with c_{i,r} the number of in-edges of relation r at i (a mean per relation, as PyG's
RGCNConv with aggr="mean"). Written per vertex as the formula reads: for each relation, the
mean over the in-neighbours of that relation (`v.innbs.of_type(r)`), so no per-edge
normalisation array is made and each term runs over its relation's edges only
(docs/rgcn.md). W_r is a free
matrix, a combination of `num_bases` shared bases (W_r = sum_b a_{r,b} V_b), or
block-diagonal with `num_blocks` blocks.

Featureless entities (the paper's one-hot input) are fed as a sparse identity matrix: the
product with it is a row lookup, and no N x N dense matrix is made.
"""
import numpy as np

import ngnn as ng
from .layers import Layer
from .models import Model, _layer_seeds


class RGCNConv(Layer):
    """One R-GCN layer; parameters and their layout follow PyG's RGCNConv: `weight` (R, F, O),
    or (num_bases, F, O) with `comp` (R, num_bases), or (R, num_blocks, F / num_blocks,
    O / num_blocks); `root` (F, O) when root=True; `bias` (O,)."""

    def __init__(self, in_feats, out_feats, num_relations, num_bases=None, num_blocks=None,
                 root=True, bias=True, seed=0, dtype=np.float32):
        super().__init__(seed, dtype)
        if num_bases is not None and num_blocks is not None:
            raise ValueError("RGCNConv: num_bases and num_blocks are two decompositions of "
                             "the relation weights; give at most one")
        if num_blocks is not None and (in_feats % num_blocks or out_feats % num_blocks):
            raise ValueError(f"RGCNConv: num_blocks={num_blocks} must divide in_feats="
                             f"{in_feats} and out_feats={out_feats}")
        self.in_feats, self.out_feats = in_feats, out_feats
        self.num_relations, self.num_bases, self.num_blocks = \
            num_relations, num_bases, num_blocks
        if num_bases is not None:
            self.weight = self.glorot("weight", (num_bases, in_feats, out_feats))
            self.comp = self.glorot("comp", (num_relations, num_bases))
        elif num_blocks is not None:
            self.weight = self.glorot("weight", (num_relations, num_blocks,
                                                 in_feats // num_blocks,
                                                 out_feats // num_blocks))
        else:
            self.weight = self.glorot("weight", (num_relations, in_feats, out_feats))
        self.root = self.glorot("root", (in_feats, out_feats)) if root else None
        self.bias = self.zeros("bias", (out_feats,)) if bias else None

    def relation_weights(self):
        """W_r for every relation, an (R, F, O) tensor (a few R x F x O values: the basis
        and block forms are expanded here, never per edge)."""
        F, O, R = self.in_feats, self.out_feats, self.num_relations
        if self.num_bases is not None:
            bases = ng.reshape(self.weight, (self.num_bases, F * O))
            return ng.reshape(ng.dot(self.comp, bases), (R, F, O))
        if self.num_blocks is not None:
            B = self.num_blocks
            zero = ng.constant(np.zeros((R, F // B, O // B)), dtype=self.dtype)
            rows = [ng.concat([self.weight[:, b] if c == b else zero for c in range(B)],
                              axis=2) for b in range(B)]
            return ng.concat(rows, axis=1)
        return self.weight

    def __call__(self, g, h, training=False):
        if g.edge_type is None:
            raise ValueError(f"RGCNConv needs a relation-typed graph, got {g!r}; build it "
                             "with ng.Graph.from_edges(..., edge_type=t, num_relations=R)")
        if g.num_relations != self.num_relations:
            raise ValueError(f"RGCNConv was built for {self.num_relations} relations, but "
                             f"the graph has {g.num_relations}")
        W = self.relation_weights()
        with ng.zoomIn(g, node_feat={"h": h}) as v:
            rst = sum(ng.mean([ng.dot(n.h, W[r]) for n in v.innbs.of_type(r)])
                      for r in range(self.num_relations))
            if self.root is not None:
                rst = rst + ng.dot(v.h, self.root)
            if self.bias is not None:
                rst = rst + self.bias
        return ng.zoomOut(rst)


class RGCN(Model):
    """The paper's entity classifier: RGCNConv, ReLU, RGCNConv (both with self-connections),
    on a graph that holds every relation and its inverse (ngnn.datasets' RDF graphs do)."""

    def __init__(self, in_feats, hidden, num_classes, num_relations, num_bases=None,
                 num_blocks=None, dropout=0.0, seed=0, dtype=np.float32):
        super().__init__()
        s1, s2 = _layer_seeds(seed, 2)
        self.dropout = dropout
        options = dict(num_relations=num_relations, num_bases=num_bases,
                       num_blocks=num_blocks, dtype=dtype)
        self.layers = [("conv1", RGCNConv(in_feats, hidden, seed=s1, **options)),
                       ("conv2", RGCNConv(hidden, num_classes, seed=s2, **options))]

    def __call__(self, g, x, training=False):
        g1, g2 = self.graphs(g)
        (_, conv1), (_, conv2) = self.layers
        h = ng.relu(conv1(g1, x, training))
        return conv2(g2, self._dropout(h, training), training)
