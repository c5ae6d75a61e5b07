"""How much this machine's speed moves from second to second: a fused block's sparse
product (calibration's R-MAT sample, rows of 4 floats) on a table just written and on a
flushed cache, and an array add streaming 48 MB, each the fastest of 5 calls, every
`--every` seconds for `--seconds`. The simulator's calibration and the benchmark's
measurements are each such samples taken minutes apart (docs/simulator.md, Limits).

    python benchmarks/machine_noise.py --seconds 60
"""
import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

from ngnn.simulate.calibration import _fastest, alone_blocks, flush_cache, rmat_block  # noqa: E402
from ngnn.transformers.numpy import kernels as K  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--every", type=float, default=2.0, help="seconds between samples")
    args = parser.parse_args()
    indptr, cols = rmat_block(500_000, 500_000, seed=1)
    blocks = alone_blocks(indptr, 4, quick=False)
    rng = np.random.default_rng(0)
    table = rng.random((500_000, 4), dtype=np.float32)
    out = np.empty((len(indptr) - 1, 4), np.float32)
    a = rng.random(4 << 20, dtype=np.float32)
    b = np.empty_like(a)

    def product():
        for v0, v1, p0, p1 in blocks:
            K.gather_sum(table, None, cols[p0:p1], indptr[v0:v1 + 1] - p0, "sum", out[v0:v1])

    timings = {"warm": product, "cold": product, "stream": lambda: np.add(a, a, out=b)}
    before = {"warm": lambda: np.multiply(table, 1, out=table), "cold": flush_cache}
    samples = []
    start = time.perf_counter()
    print("seconds  warm product (ns an edge)  cold product (ns an edge)  add (GB/s)")
    while time.perf_counter() - start < args.seconds:
        best = _fastest(timings, 5, before)
        sample = (1e9 * best["warm"] / len(cols), 1e9 * best["cold"] / len(cols),
                  3 * a.nbytes / best["stream"] / 1e9)
        samples.append(sample)
        print(f"{time.perf_counter() - start:7.1f}  {sample[0]:25.2f}  {sample[1]:25.2f}  "
              f"{sample[2]:10.1f}", flush=True)
        time.sleep(args.every)
    low, high = np.min(samples, axis=0), np.max(samples, axis=0)
    print("range (slowest over fastest): " + ", ".join(
        f"{name} {ratio:.2f}" for name, ratio in
        zip(("warm product", "cold product", "add"), (high[0] / low[0], high[1] / low[1],
                                                      high[2] / low[2]))))


if __name__ == "__main__":
    main()
