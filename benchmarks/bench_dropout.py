"""Dropout costs no memory and little time: the R-MAT GAT training step with and without
dropout (NumPy transformer), in one run, and the speed of a dropout mask.

    python benchmarks/bench_dropout.py --nodes 100000

The model is ngnn.nn's two-layer GAT (64 input features, 8 heads x 8, 8 classes, loss over
all nodes, Adam) on a synthetic R-MAT graph of average degree 16. For dropout 0.6 and 0.0 it
reports the planned intermediate bytes (comp.memory_plan.peak_bytes), the tracemalloc peak
of the first call (compiling, allocating the planned buffers and running the step) and the
median step time. Masks are regenerated where they are used (the backward pass draws them
again), so the planned and measured peaks should stay within 10% of the step without
dropout. It also times ngnn.philox.dropout over 4 million elements (the Cora input is 3.9
million) against drawing the same number of floats with NumPy's default generator.
"""
import argparse
import time
import tracemalloc

import numpy as np

import ngnn as ng
from ngnn import datasets, nn, optim, philox
from ngnn import transformers as ngt

FEATURES, HIDDEN, HEADS, CLASSES, DEGREE = 64, 8, 8, 8, 16


def build_step(graph, x, labels, dropout):
    model = nn.GAT(FEATURES, hidden=HIDDEN, heads=HEADS, num_classes=CLASSES, dropout=dropout)
    loss = ng.cross_entropy(model(graph, x, training=True), labels)
    return [loss] + optim.Adam(model.parameters(), lr=0.005).updates(loss)


def measure(data, dropout, repeats):
    x = ng.placeholder((data.num_nodes, FEATURES), name="x")
    labels = ng.placeholder((data.num_nodes,), dtype=np.int64, name="labels")
    features = data.dense_features()
    with ngt.make_transformer("numpy") as t:
        step = t.computation(build_step(data.graph, x, labels, dropout), x, labels)
        tracemalloc.start()
        step(features, data.labels)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            step(features, data.labels)
            times.append(time.perf_counter() - start)
        return step.memory_plan.peak_bytes, peak, float(np.median(times))


def best_of(fn, repeats=20):
    best = np.inf
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=100000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    n = 4_000_000
    x = np.random.default_rng(0).random(n, dtype=np.float32)
    out = np.empty_like(x)
    mask = best_of(lambda: philox.dropout(x, 1, 0, 0.6, out))
    generator = np.random.default_rng(1)
    floats = best_of(lambda: generator.random(n, dtype=np.float32))
    print(f"dropout over {n} elements: {1000 * mask:.1f} ms (numpy's default generator "
          f"drawing {n} float32: {1000 * floats:.1f} ms)")

    data = datasets.synthetic("rmat", args.nodes, DEGREE, FEATURES, CLASSES, seed=0)
    print(f"R-MAT: {data.num_nodes} nodes, {data.num_edges} edges; 2-layer GAT "
          f"{FEATURES} -> {HEADS}x{HIDDEN} -> {CLASSES}, Adam")
    rows = {rate: measure(data, rate, args.repeats) for rate in (0.6, 0.0)}
    print(f"{'dropout':>8} {'plan MiB':>10} {'peak MiB':>10} {'step ms':>9}")
    for rate, (plan, peak, step) in rows.items():
        print(f"{rate:>8} {plan / 2**20:>10.1f} {peak / 2**20:>10.1f} {1000 * step:>9.0f}")
    (plan1, peak1, step1), (plan0, peak0, step0) = rows[0.6], rows[0.0]
    print(f"with / without dropout: plan {plan1 / plan0:.3f}, peak {peak1 / peak0:.3f}, "
          f"step time {step1 / step0:.2f}")


if __name__ == "__main__":
    main()
