"""GCN and GAT forward passes and training steps: the GPU transformer (OpenCL, PoCL on a CPU
when there is no GPU) against the NumPy transformer, on synthetic graphs.

    python benchmarks/bench_gpu.py --nodes 10000 100000 --repeat 3

Reports per model, size and backend: compile time, seconds per call (best of --repeat),
host peak memory during the calls (tracemalloc: the GPU transformer's device memory is not
host memory; its intermediate buffers are `memory_plan.peak_bytes`), and for the GPU the
global-memory bytes its kernels read and write per call, against the same computation with
every op in a kernel of its own (no fusion), the traffic the fusion removes.
"""
import argparse
import time
import tracemalloc

import numpy as np

import ngnn as ng
from ngnn import datasets
from ngnn import transformers as ngt
from ngnn.transformers.gpu import planning

HIDDEN, HEADS, CLASSES, FEATURES = 16, 4, 8, 32


def dense(rng, fan_in, fan_out, name):
    return ng.variable((fan_in, fan_out), name=name,
                       initial_value=rng.standard_normal((fan_in, fan_out)) / np.sqrt(fan_in))


def gcn(g, h, rng):
    norm = ng.constant((1.0 / np.sqrt(np.maximum(g.in_degrees, 1))).astype(np.float32)
                       .reshape(-1, 1))
    params = [dense(rng, FEATURES, HIDDEN, "w1"), dense(rng, HIDDEN, CLASSES, "w2")]
    x = h
    for i, w in enumerate(params):
        x = ng.dot(x, w) * norm
        x = ng.aggregate(ng.gather(x, g, by="src"), g, at="dst") * norm
        if i == 0:
            x = ng.relu(x)
    return x, params


def gat(g, h, rng):
    w = dense(rng, FEATURES, HEADS * HIDDEN, "w")
    attn_l = ng.variable((HEADS, HIDDEN), initial_value=rng.standard_normal((HEADS, HIDDEN)))
    attn_r = ng.variable((HEADS, HIDDEN), initial_value=rng.standard_normal((HEADS, HIDDEN)))
    out_w = dense(rng, HEADS * HIDDEN, CLASSES, "out_w")
    feat = ng.reshape(ng.dot(h, w), (g.num_nodes, HEADS, HIDDEN))
    el = ng.sum(feat * attn_l, axis=-1, keepdims=True)
    er = ng.sum(feat * attn_r, axis=-1, keepdims=True)
    e = ng.leaky_relu(ng.gather(el, g, by="src") + ng.gather(er, g, by="dst"), 0.2)
    alpha = ng.edge_softmax(g, e)
    rst = ng.elu(ng.aggregate(ng.gather(feat, g, by="src") * alpha, g, at="dst"))
    return ng.dot(ng.reshape(rst, (g.num_nodes, HEADS * HIDDEN)), out_w), \
        [w, attn_l, attn_r, out_w]


def build(model, data, train):
    rng = np.random.default_rng(0)
    h = ng.placeholder((data.num_nodes, FEATURES), name="h")
    labels = ng.placeholder((data.num_nodes,), dtype=np.int64, name="labels")
    logits, params = model(data.graph, h, rng)
    if not train:
        return [logits], [h, labels]
    loss = ng.cross_entropy(logits, labels)
    grads = ng.grad(loss, params)
    return [loss] + [ng.assign(p, p - 0.01 * g) for p, g in zip(params, grads)], [h, labels]


def measure(transformer, results, params, values, repeat):
    comp = transformer.computation(results, *params)
    start = time.perf_counter()
    comp.transform()
    transformer.initialize()
    compile_seconds = time.perf_counter() - start
    comp(*values)                                    # first call: uploads, warm caches
    tracemalloc.start()
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        comp(*values)
        best = min(best, time.perf_counter() - start)
    _, host_peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return comp, compile_seconds, best, host_peak


def unfused_bytes(comp):
    """Global traffic if every op were a kernel of its own: each reads its arguments once
    and writes its result (views and leaves cost nothing)."""
    total = 0
    for op in comp.ordered_ops:
        if isinstance(op, planning.LEAVES + (ng.op_graph.Reshape, ng.op_graph.Assign)):
            continue
        total += op.nbytes + sum(a.nbytes for a in op.args)
    return total


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--degree", type=float, default=10.0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--kind", default="rmat", choices=["rmat", "sbm"])
    args = parser.parse_args()
    print(f"{'model':<10}{'nodes':>8}{'edges':>9} {'backend':<7}{'compile s':>10}"
          f"{'s/call':>9}{'host peak MB':>13}{'device MB':>10}{'kernels':>8}"
          f"{'fused MB':>10}{'unfused MB':>11}{'ratio':>7}")
    for nodes in args.nodes:
        data = datasets.synthetic(args.kind, nodes, args.degree, FEATURES, CLASSES, seed=0)
        values = [data.features.astype(np.float32), data.labels.astype(np.int64)]
        for name, model in (("gcn", gcn), ("gat", gat)):
            for train in (False, True):
                label = f"{name}-{'train' if train else 'fwd'}"
                for backend in ("numpy", "gpu"):
                    results, params = build(model, data, train)
                    with ngt.make_transformer(backend) as t:
                        comp, compile_s, seconds, host_peak = measure(
                            t, results, params, values, args.repeat)
                        row = (f"{label:<10}{nodes:>8}{data.num_edges:>9} {backend:<7}"
                               f"{compile_s:>10.2f}{seconds:>9.4f}{host_peak / 2**20:>13.1f}"
                               f"{comp.memory_plan.peak_bytes / 2**20:>10.1f}")
                        if backend == "gpu":
                            fused = sum(k.global_bytes() for k in comp.executor.kernels)
                            unfused = unfused_bytes(comp)
                            row += (f"{len(comp.executor.kernels):>8}{fused / 2**20:>10.1f}"
                                    f"{unfused / 2**20:>11.1f}{unfused / fused:>7.2f}")
                        print(row, flush=True)


if __name__ == "__main__":
    main()
