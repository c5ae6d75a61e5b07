"""Time of every kernel of bench_gpu.py's training steps on the GPU transformer.

    python benchmarks/profile_gpu_kernels.py --nodes 100000

Kernel times are the device's own (`comp.kernel_report()`: OpenCL profiling events, CUDA
events with `time_kernels=True`), of the last of the timed steps; the step's wall time
comes first, its inputs kept on the device as the Trainer keeps them. The table lists the
slowest kernels with their template, launch geometry, the global memory they move
(`GPUKernel.global_bytes`) and the bandwidth that implies.
"""
import argparse
import time

import numpy as np

from bench_gpu import CLASSES, FEATURES, build

from ngnn import datasets
from ngnn import transformers as ngt


def best_step(comp, values, runtime, repeat):
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        comp(*values)
        runtime.synchronize()
        best = min(best, time.perf_counter() - start)
    return best


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=100_000)
    parser.add_argument("--degree", type=float, default=16.0)
    parser.add_argument("--models", default="gat,gcn")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    data = datasets.synthetic("rmat", args.nodes, args.degree, FEATURES, CLASSES, seed=0)
    values = [data.dense_features(), data.labels.astype(np.int64)]
    for name in args.models.split(","):
        results, params = build(name, data, True)
        with ngt.make_transformer("gpu", time_kernels=True) as t:
            comp = t.computation(results, *params)
            fed = [t.resident(v) for v in values]
            comp(*fed)                                        # compiles, uploads
            step = best_step(comp, fed, t.runtime, repeat=5)
            times = {row["name"]: row["seconds"] for row in comp.kernel_report()
                     if row["launches"]}
            kernels = {k.name: k for k in comp.executor.kernels}
            print(f"\n## {name} training step, {args.nodes} nodes, {data.num_edges} edges, "
                  f"{t.runtime.device_name}: {step * 1e3:.2f} ms (best of 5); its "
                  f"{len(times)} kernels {sum(times.values()) * 1e3:.2f} ms")
            print("| kernel | template | global size | local size | ms | MiB | GB/s |")
            print("|---|---|---|---|---|---|---|")
            for kernel, seconds in sorted(times.items(), key=lambda kv: -kv[1])[:args.top]:
                k = kernels[kernel]
                nbytes = k.global_bytes()
                print(f"| {kernel} | {k.template} | {k.global_size} | {k.local_size} | "
                      f"{seconds * 1e3:.3f} | {nbytes / 2**20:.1f} | {nbytes / seconds / 1e9:.0f} |")


if __name__ == "__main__":
    main()
