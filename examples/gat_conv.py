"""GATConv on Cora: seed 000's listing, one linear transform after CSE.

Run: python examples/gat_conv.py
"""
import ngnn as ng
from ngnn import datasets, nn
from ngnn import transformers as ngt

data = datasets.load("cora")
g = data.graph.add_self_loops()
# Bag-of-words features stay sparse: the first product runs over the stored values only.
h = ng.placeholder(data.features.shape, sparse=True, name="h")
layer = nn.GATConv(data.num_features, 8, num_heads=8)
out = layer(g, h)

with ngt.make_transformer("numpy") as t:
    comp = t.computation(out, h)
    print(data.summary())
    print("output shape:", comp(data.features).shape)
    print(comp.ir)
