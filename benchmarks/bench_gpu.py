"""GCN and GAT forward passes and training steps: the GPU transformer (OpenCL, PoCL on a CPU
when there is no GPU) against the NumPy transformer, on synthetic graphs.

    python benchmarks/bench_gpu.py --nodes 10000 100000 --repeat 3

The models are ngnn.nn's two-layer GCN and GAT (8 heads x 8 features), dropout on in the
training steps. Reports per model, size and backend: compile time, seconds per call (best
of --repeat), host peak memory during the calls (tracemalloc: the GPU transformer's device
memory is not host memory; its intermediate buffers are `memory_plan.peak_bytes`), and for
the GPU the global-memory bytes its kernels read and write per call, from the kernel plan,
against the same computation planned with fusion=False (one kernel per op): the traffic
fusion removes, which is what a GPU's speed follows, split into the forward (kernels
computing what the loss depends on) and the backward. Both backends also report how many
edge tensors their memory plan stores. --kernels lists the bytes of every graph kernel (a
kernel with an edge loop) of the fused plans.
"""
import argparse
import time
import tracemalloc

import numpy as np

import ngnn as ng
from ngnn import datasets, nn
from ngnn import transformers as ngt
from ngnn.op_graph import ordered_ops

FEATURES, CLASSES = 64, 8
MODELS = {
    "gcn": lambda: nn.GCN(FEATURES, 16, CLASSES, seed=0),
    "gat": lambda: nn.GAT(FEATURES, hidden=8, heads=8, num_classes=CLASSES, seed=0),
}


def build(name, data, train):
    model = MODELS[name]()
    h = ng.placeholder((data.num_nodes, FEATURES), name="h")
    labels = ng.placeholder((data.num_nodes,), dtype=np.int64, name="labels")
    logits = model(data.graph, h, training=train)
    if not train:
        return [logits], [h, labels]
    loss = ng.cross_entropy(logits, labels)
    grads = ng.grad(loss, model.parameters())
    return [loss] + [ng.assign(p, p - 0.01 * g) for p, g in zip(model.parameters(), grads)], \
        [h, labels]


def measure(transformer, results, params, values, repeat):
    comp = transformer.computation(results, *params)
    start = time.perf_counter()
    comp.transform()
    transformer.initialize()
    compile_seconds = time.perf_counter() - start
    # Inputs kept on the device, as a Trainer keeps them; the first call uploads the rest.
    values = [transformer.resident(v) for v in values]
    comp(*values)
    tracemalloc.start()
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        comp(*values)
        best = min(best, time.perf_counter() - start)
    _, host_peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return comp, compile_seconds, best, host_peak


def traffic(comp):
    """Bytes the kernels move per call: (forward, backward)."""
    forward = set(ordered_ops(comp.results[:1]))
    split = [0, 0]
    for k in comp.executor.kernels:
        split[k.op not in forward] += k.global_bytes()
    return tuple(split)


def stored_edge_tensors(comp):
    return sum(op.scope == "e" for op in comp.memory_plan.slots)


def unfused_traffic(name, data, train):
    results, params = build(name, data, train)
    with ngt.make_transformer("gpu", fusion=False) as t:
        comp = t.computation(results, *params)
        comp.transform()
        return len(comp.executor.kernels), traffic(comp)


def graph_kernels(comp):
    return [k for k in comp.executor.kernels
            if any(binding[0] == "graph" for binding in k.bindings)]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--degree", type=float, default=16.0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--kind", default="rmat", choices=["rmat", "sbm"])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--kernels", action="store_true",
                        help="list the traffic of every graph kernel of the fused plans")
    args = parser.parse_args()
    mib = 2 ** 20
    print("| model | nodes | edges | backend | compile s | s/call | host peak MiB | "
          "planned MiB | edge tensors stored | kernels | traffic MiB fwd / bwd | "
          "unfused kernels | unfused traffic MiB fwd / bwd | traffic ratio fwd / bwd / all |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    listings = []
    for nodes in args.nodes:
        data = datasets.synthetic(args.kind, nodes, args.degree, FEATURES, CLASSES, seed=0)
        values = [data.dense_features(), data.labels.astype(np.int64)]
        for name in args.models:
            for train in (False, True):
                label = f"{name}-{'train' if train else 'fwd'}"
                for backend in ("numpy", "gpu"):
                    results, params = build(name, data, train)
                    with ngt.make_transformer(backend) as t:
                        comp, compile_s, seconds, host_peak = measure(
                            t, results, params, values, args.repeat)
                        row = (f"| {label} | {nodes} | {data.num_edges} | {backend} | "
                               f"{compile_s:.2f} | {seconds:.4f} | {host_peak / mib:.1f} | "
                               f"{comp.memory_plan.peak_bytes / mib:.1f} | "
                               f"{stored_edge_tensors(comp)} |")
                        if backend == "gpu":
                            fused = traffic(comp)
                            count, unfused = unfused_traffic(name, data, train)
                            ratios = [u / f if f else float("nan") for u, f in
                                      zip(unfused + (sum(unfused),), fused + (sum(fused),))]
                            row += (f" {len(comp.executor.kernels)} | "
                                    f"{fused[0] / mib:.1f} / {fused[1] / mib:.1f} | {count} | "
                                    f"{unfused[0] / mib:.1f} / {unfused[1] / mib:.1f} | "
                                    + " / ".join(f"{r:.2f}" for r in ratios) + " |")
                            listings += [(label, nodes, k.name, k.template,
                                          k.global_bytes()) for k in graph_kernels(comp)]
                        else:
                            row += " - | - | - | - | - |"
                        print(row, flush=True)
    if args.kernels:
        print("\n| model | nodes | graph kernel | template | traffic MiB |")
        print("|---|---|---|---|---|")
        for label, nodes, kernel, template, nbytes in listings:
            print(f"| {label} | {nodes} | {kernel} | {template} | {nbytes / mib:.2f} |")


if __name__ == "__main__":
    main()
