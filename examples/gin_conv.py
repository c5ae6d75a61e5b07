"""GINConv on Cora: MLP((1 + eps) h + sum of in-neighbours).

Run: python examples/gin_conv.py
"""
import ngnn as ng
from ngnn import datasets, nn
from ngnn import transformers as ngt

data = datasets.load("cora")
g = data.graph
h = ng.placeholder(data.features.shape, name="h")   # GIN adds features: fed dense
layer = nn.GINConv(data.num_features, 16, eps=0.1)
out = layer(g, h)

with ngt.make_transformer("numpy") as t:
    comp = t.computation(out, h)
    print(data.summary())
    print("output shape:", comp(data.dense_features()).shape)
    print(comp.ir)
