"""Fused against unfused training steps of GCN and GAT layers (NumPy transformer), in one run.

    python benchmarks/bench_fusion.py --sizes 10000,100000,500000 --models gcn,gat

For each model and graph size (synthetic R-MAT graph, average degree 16, 64 input
features; GAT with 8 heads x 8 features) it builds one training step (loss, gradients and
SGD updates in one computation) and reports, fused and unfused:
  - time per step (median of --repeats calls after a warm-up call),
  - peak memory: the tracemalloc high-water mark of the first call, which compiles the step,
    allocates its planned buffers and runs it (NumPy reports its allocations to tracemalloc),
  - the planned intermediate bytes (comp.memory_plan.peak_bytes),
and checks that both give the same loss and updated weights. When torch and torch_geometric
are installed, PyG's GCNConv / GATConv on the CPU join the table as the peer baseline.
"""
import argparse
import time
import tracemalloc

import numpy as np

import ngnn as ng
from ngnn import datasets, nn
from ngnn import transformers as ngt

IN_FEATS, HEADS, HEAD_FEATS, GCN_OUT, DEGREE = 64, 8, 8, 64, 16


def build_step(model, graph, x, labels, seed=0):
    if model == "gcn":
        layer = nn.GCNConv(IN_FEATS, GCN_OUT, seed=seed)
        out = layer(graph, x)
    else:
        layer = nn.GATConv(IN_FEATS, HEAD_FEATS, HEADS, seed=seed)
        out = ng.reshape(layer(graph, x), (graph.num_nodes, HEADS * HEAD_FEATS))
    loss = ng.cross_entropy(out, labels)
    params = layer.parameters()
    grads = ng.grad(loss, params)
    return [loss] + [ng.assign(p, p - 0.1 * g) for p, g in zip(params, grads)]


def measure(model, graph, features, label_values, fusion, repeats):
    x = ng.placeholder(features.shape, name="x")
    labels = ng.placeholder(label_values.shape, dtype=np.int64, name="labels")
    with ngt.make_transformer("numpy", fusion=fusion) as t:
        step = t.computation(build_step(model, graph, x, labels), x, labels, name="step")
        tracemalloc.start()          # from before compilation: planned buffers included
        first = step(features, label_values)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            step(features, label_values)
            times.append(time.perf_counter() - start)
        return first, float(np.median(times)), peak, step.memory_plan.peak_bytes


def measure_pyg(model, graph, features, label_values, repeats):
    try:
        import torch
        import torch_geometric.nn as pyg
    except ImportError:
        return None
    edge_index = torch.as_tensor(np.stack([graph.src, graph.dst]))
    x = torch.as_tensor(features)
    y = torch.as_tensor(label_values)
    layer = pyg.GCNConv(IN_FEATS, GCN_OUT, add_self_loops=False) if model == "gcn" else \
        pyg.GATConv(IN_FEATS, HEAD_FEATS, heads=HEADS, add_self_loops=False)
    opt = torch.optim.SGD(layer.parameters(), lr=0.1)

    def step():
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(layer(x, edge_index), y)
        loss.backward()
        opt.step()

    tracemalloc.start()     # torch's CPU allocator is not traced: peak is host-side only
    step()
    tracemalloc.stop()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="10000,100000,500000")
    parser.add_argument("--models", default="gcn,gat")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print("| model | vertices | edges | fused ms | unfused ms | time ratio | fused peak MiB | "
          "unfused peak MiB | memory ratio | planned fused / unfused MiB | PyG ms |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for size in (int(s) for s in args.sizes.split(",")):
        data = datasets.synthetic("rmat", size, DEGREE, IN_FEATS, GCN_OUT, seed=0)
        graph = data.graph.add_self_loops()
        features = data.dense_features()
        label_values = data.labels
        for model in args.models.split(","):
            fused = measure(model, graph, features, label_values, True, args.repeats)
            unfused = measure(model, graph, features, label_values, False, args.repeats)
            for a, b in zip(fused[0], unfused[0]):       # loss and updated weights
                np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
            pyg = measure_pyg(model, graph, features, label_values, args.repeats)
            mib = 1 << 20
            print(f"| {model} | {size} | {graph.num_edges} | {fused[1] * 1e3:.0f} | "
                  f"{unfused[1] * 1e3:.0f} | {fused[1] / unfused[1]:.2f} | {fused[2] / mib:.0f} | "
                  f"{unfused[2] / mib:.0f} | {fused[2] / unfused[2]:.2f} | "
                  f"{fused[3] / mib:.0f} / {unfused[3] / mib:.0f} | "
                  f"{'-' if pyg is None else f'{pyg * 1e3:.0f}'} |", flush=True)


if __name__ == "__main__":
    main()
