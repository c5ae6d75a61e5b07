"""How much one fused C loop per GIN layer would save: one MLP half's non-product work
(bias add, batch norm over the live rows, ReLU, and the backward of all three) as two
hand-written C functions, against the NumPy kernels the NumPy transformer runs for it
(`K.batch_norm_*` and the element-wise calls of the generated step, in its order) and
against `native=True`'s C kernels one per op, in one process, same arrays.

    python benchmarks/fused_layer_c_vs_numpy.py            # NCI1-sized batches: 32 and 128

This is the measurement behind docs/native.md's "What it does not do": the fused loop is a
prototype (fixed to float32 and 64 features), not a code path of ngnn. Needs a C compiler.
"""
import ctypes
import os
import sys
import time

for variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(variable, "1")

import numpy as np  # noqa: E402

from ngnn.transformers.numpy import kernels as K  # noqa: E402
from ngnn.transformers.numpy import native  # noqa: E402

F = 64
FUSED = r"""
#include <math.h>
#include <string.h>
enum { F = 64 };
/* Forward: z = y + b; mean and biased variance over the n live rows; a = (z - mean) *
   gamma / sqrt(var + eps) + beta; r = max(a, 0); rows past n zero. */
void forward(long n, long rows, const float *restrict y, const float *restrict b,
             const float *restrict gamma, const float *restrict beta, float eps,
             float *restrict z, float *restrict stats, float *restrict a, float *restrict r) {
    float sum[F] = {0}, sq[F] = {0}, scale[F];
    for (long i = 0; i < n; i++)
        for (int f = 0; f < F; f++) { float v = y[i * F + f] + b[f]; z[i * F + f] = v; sum[f] += v; }
    for (int f = 0; f < F; f++) stats[f] = sum[f] / (float)(n > 1 ? n : 1);
    for (long i = 0; i < n; i++)
        for (int f = 0; f < F; f++) { float c = z[i * F + f] - stats[f]; sq[f] += c * c; }
    for (int f = 0; f < F; f++) {
        stats[F + f] = sq[f] / (float)(n > 1 ? n : 1);
        scale[f] = gamma[f] / sqrtf(stats[F + f] + eps);
    }
    for (long i = 0; i < n; i++)
        for (int f = 0; f < F; f++) {
            float v = (z[i * F + f] - stats[f]) * scale[f] + beta[f];
            a[i * F + f] = v; r[i * F + f] = v > 0 ? v : 0;
        }
    memset(z + n * F, 0, (rows - n) * F * 4); memset(a + n * F, 0, (rows - n) * F * 4);
    memset(r + n * F, 0, (rows - n) * F * 4);
}
/* Backward from dr: dz, and the gradients of gamma, beta and b. */
void backward(long n, long rows, const float *restrict dr, const float *restrict z,
              const float *restrict a, const float *restrict stats,
              const float *restrict gamma, float eps, float *restrict dz,
              float *restrict dgamma, float *restrict dbeta, float *restrict db) {
    float sd[F] = {0}, sdc[F] = {0}, sz[F] = {0}, inv[F], dmean[F], dvar2[F], scale[F];
    float inverse = 1.0f / (float)(n > 1 ? n : 1);
    for (long i = 0; i < n; i++)
        for (int f = 0; f < F; f++) {
            float d = a[i * F + f] > 0 ? dr[i * F + f] : 0;
            sd[f] += d; sdc[f] += d * (z[i * F + f] - stats[f]);
        }
    for (int f = 0; f < F; f++) {
        inv[f] = 1.0f / sqrtf(stats[F + f] + eps); scale[f] = gamma[f] * inv[f];
        dmean[f] = -scale[f] * sd[f] * inverse;
        dvar2[f] = 2.0f * (scale[f] * inv[f] * inv[f] * sdc[f] * -0.5f) * inverse;
        dgamma[f] = sdc[f] * inv[f]; dbeta[f] = sd[f];
    }
    for (long i = 0; i < n; i++)
        for (int f = 0; f < F; f++) {
            float d = a[i * F + f] > 0 ? dr[i * F + f] : 0;
            float v = d * scale[f] + dmean[f] + dvar2[f] * (z[i * F + f] - stats[f]);
            dz[i * F + f] = v; sz[f] += v;
        }
    for (int f = 0; f < F; f++) db[f] = sz[f];
    memset(dz + n * F, 0, (rows - n) * F * 4);
}
"""


def best_of(function, reps):
    times = []
    for _ in range(7):
        start = time.perf_counter()
        for _ in range(reps):
            function()
        times.append((time.perf_counter() - start) / reps)
    return min(times)


def compare(live, rows, reps):
    rng = np.random.default_rng(0)
    f32 = np.float32
    y = rng.standard_normal((rows, F)).astype(f32)
    y[live:] = 0
    bias, gamma, beta = (rng.standard_normal(F).astype(f32) for _ in range(3))
    dr = rng.standard_normal((rows, F)).astype(f32)
    count = np.array([live], f32)
    ones = np.ones((1, rows), f32)

    def arrays(*shapes):
        return [np.empty(s, f32) for s in shapes]

    z, a, r, stats = arrays((rows, F), (rows, F), (rows, F), (2, F))
    mask, da, direct, spread, dz = arrays(*[(rows, F)] * 5)
    v = arrays(*[(F,)] * 10)
    sums, both, db = arrays((2, F), (2, F), (1, F))

    def step(bn):
        """The generated step's statements for this half layer, with `bn` the module of
        batch-norm kernels (K or native)."""
        np.add(y, bias, out=z)
        bn.batch_norm_stats(z, count, out=stats)
        bn.batch_norm_apply(z, stats, gamma, beta, count, eps=1e-05, out=a)
        K.relu(a, out=r)
        np.greater(a, f32(0), out=mask)
        np.multiply(dr, mask, out=da)
        bn.batch_norm_apply_grad(da, stats, gamma, count, eps=1e-05, out=direct)
        np.add(stats[1], f32(1e-5), out=v[0])
        np.sqrt(v[0], out=v[1])
        np.divide(f32(1), v[1], out=v[2])
        np.multiply(gamma, v[2], out=v[3])
        np.negative(v[3], out=v[4])
        bn.batch_norm_apply_sums(da, z, stats, count, out=sums)
        np.multiply(v[4], sums[1], out=v[5])
        np.multiply(v[3], v[2], out=v[6])
        np.multiply(v[6], v[2], out=v[7])
        np.multiply(v[7], sums[0], out=v[8])
        np.multiply(v[8], f32(-0.5), out=v[9])
        np.concatenate([v[5].reshape(1, F), v[9].reshape(1, F)], axis=0, out=both)
        bn.batch_norm_stats_grad(both, z, stats, count, out=spread)
        np.add(direct, spread, out=dz)
        K.zero_row_matmul(ones, dz, count, contract=True, out=db)
        np.multiply(sums[0], v[2], out=v[0])

    lib = ctypes.CDLL(native.build(FUSED, "fused_layer_prototype"))
    lib.forward.argtypes = [ctypes.c_long] * 2 + [ctypes.c_void_p] * 4 + [ctypes.c_float] + \
        [ctypes.c_void_p] * 4
    lib.backward.argtypes = [ctypes.c_long] * 2 + [ctypes.c_void_p] * 5 + [ctypes.c_float] + \
        [ctypes.c_void_p] * 4
    fz, fa, fr, fstats, fdz = arrays((rows, F), (rows, F), (rows, F), (2, F), (rows, F))
    fdg, fdbeta, fdb = arrays((F,), (F,), (F,))
    forward_args = (live, rows, y.ctypes.data, bias.ctypes.data, gamma.ctypes.data,
                    beta.ctypes.data, 1e-5, fz.ctypes.data, fstats.ctypes.data,
                    fa.ctypes.data, fr.ctypes.data)
    backward_args = (live, rows, dr.ctypes.data, fz.ctypes.data, fa.ctypes.data,
                     fstats.ctypes.data, gamma.ctypes.data, 1e-5, fdz.ctypes.data,
                     fdg.ctypes.data, fdbeta.ctypes.data, fdb.ctypes.data)

    def fused():
        lib.forward(*forward_args)
        lib.backward(*backward_args)

    step(K)
    fused()
    for got, expected in ((fr, r), (fstats, stats), (fdz, dz), (fdg, v[0]), (fdbeta, sums[1])):
        scale = max(float(np.abs(expected).max()), 1.0)
        assert np.abs(got - expected).max() <= 1e-4 * scale, "the prototype's results differ"
    seconds = {name: best_of(run, reps) for name, run in
               (("numpy", lambda: step(K)), ("native", lambda: step(native)),
                ("fused", fused))}
    print(f"{rows} rows ({live} live) x {F}: NumPy kernels {seconds['numpy'] * 1e6:.0f} us, "
          f"native=True's kernels {seconds['native'] * 1e6:.0f} us, one fused loop each way "
          f"{seconds['fused'] * 1e6:.0f} us ({seconds['numpy'] / seconds['fused']:.1f}x NumPy)")


def main():
    print("one GIN MLP half (bias, batch norm, ReLU; forward and backward), float32, best "
          "of 7 timings")
    compare(956, 1196, 300)       # NCI1, batches of 32: the slot's rows and the mean live
    compare(3826, 4780, 100)      # batches of 128
    return 0


if __name__ == "__main__":
    sys.exit(main())
