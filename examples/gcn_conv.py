"""GCNConv on Cora: per vertex, sum(n.h * n.norm for n in v.innbs) * v.norm, then W.

Run: python examples/gcn_conv.py
"""
import ngnn as ng
from ngnn import datasets, nn
from ngnn import transformers as ngt

data = datasets.load("cora")
g = data.graph.add_self_loops()    # D^-1/2 (A+I) D^-1/2: the caller adds the loops
# Bag-of-words features stay sparse: the first product runs over the stored values only.
h = ng.placeholder(data.features.shape, sparse=True, name="h")
layer = nn.GCNConv(data.num_features, 16)
out = layer(g, h)

with ngt.make_transformer("numpy") as t:
    comp = t.computation(out, h)
    print(data.summary())
    print("output shape:", comp(data.features).shape)
    print(comp.ir)
