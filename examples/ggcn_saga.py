"""G-GCN (NeuGraph's gated GCN, seed 003) on Cora in SAGA-NN, next to its zoomIn twin.

    h_v' = relu((sum over edges u -> v of sigmoid(h_v A + h_u B) * h_u) W)

ng.saga traces ApplyEdge and ApplyVertex as one vertex-centric program, so both versions
lower to the same IR and compute the same values and gradients.

Run: python examples/ggcn_saga.py
"""
import numpy as np

import ngnn as ng
from ngnn import datasets, nn
from ngnn import transformers as ngt

data = datasets.load("cora")
g = data.graph.add_self_loops()
x = ng.placeholder(data.features.shape, sparse=True, name="x")
project = ng.variable((data.num_features, 16), name="project",
                      initial_value=np.random.default_rng(0).uniform(-0.05, 0.05,
                                                                     (data.num_features, 16)))
h = ng.dot(x, project)                  # 16 features per vertex go into the gated layer
layer = nn.GatedGCNConv(16, data.num_classes)

# SAGA-NN: Scatter and Gather are the framework's; the user writes ApplyEdge and ApplyVertex.
saga_out = ng.saga(g, node_feat={"h": h},
                   apply_edge=lambda src, dst, edge: ng.sigmoid(
                       dst.h @ layer.gate_dst + src.h @ layer.gate_src) * src.h,
                   accumulator="sum",
                   apply_vertex=lambda vertex, accum: ng.relu(accum @ layer.weight))

# The same layer in the vertex-centric front end.
with ng.zoomIn(g, node_feat={"h": h}) as v:
    messages = [ng.sigmoid(v.h @ layer.gate_dst + n.h @ layer.gate_src) * n.h
                for n in v.innbs]
    rst = ng.relu(sum(messages) @ layer.weight)
zoomin_out = ng.zoomOut(rst)

params = layer.parameters() + [project]
with ngt.make_transformer("numpy") as t:
    results = []
    for out in (saga_out, zoomin_out):
        comp = t.computation([out] + ng.grad(ng.sum(out), params), x)
        results.append((comp.ir, comp(data.features)))
    (saga_ir, saga_values), (zoomin_ir, zoomin_values) = results
    print(data.summary())
    print(t.computation(saga_out, x).ir)      # the forward pass alone
    print("same IR as the zoomIn twin:", saga_ir == zoomin_ir)
    print("same output and gradients:",
          all(np.array_equal(a, b) for a, b in zip(saga_values, zoomin_values)))
    print("output shape:", saga_values[0].shape)
