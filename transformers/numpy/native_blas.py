"""NumPy's own BLAS, found at run time so native C code can call matrix products itself.

The native step's Python body pays the interpreter for every statement, its `np.matmul`
calls included (docs/native.md). NumPy 2.x wheels bundle scipy-openblas64, whose
`scipy_cblas_{d,s}gemm64_` (ILP64 integers) are the kernels `np.matmul` itself calls for
C-contiguous 2-D operands of at least two rows and two columns: a product through the
pointer this module returns is bit-equal to `np.matmul` on those shapes. With one row or
one column NumPy takes a matrix-vector path instead (not bit-equal), so `gemm_applies`
refuses those shapes and the product stays a NumPy call.

The symbol is looked up with ctypes (no link-time dependency). Another NumPy build
(system OpenBLAS, MKL, Accelerate) has no such library: `cblas_gemm` returns None and every
product stays a NumPy call.
"""
import ctypes
import functools
import glob
import os

import numpy as np

CBLAS_ROW_MAJOR, CBLAS_NO_TRANS, CBLAS_TRANS = 101, 111, 112
SYMBOLS = {np.dtype(np.float64): ("scipy_cblas_dgemm64_", ctypes.c_double),
           np.dtype(np.float32): ("scipy_cblas_sgemm64_", ctypes.c_float)}


def bundled_openblas():
    """Paths of the scipy-openblas64 libraries bundled with this NumPy (may be empty)."""
    libs = os.path.join(os.path.dirname(os.path.dirname(np.__file__)), "numpy.libs")
    return sorted(glob.glob(os.path.join(libs, "libscipy_openblas64_*")))


@functools.lru_cache(maxsize=None)
def cblas_gemm(dtype):
    """The ctypes function of NumPy's bundled cblas gemm for `dtype`, or None."""
    dtype = np.dtype(dtype)
    if dtype not in SYMBOLS:
        return None
    name, scalar = SYMBOLS[dtype]
    for path in bundled_openblas():
        try:
            function = getattr(ctypes.CDLL(path), name)
        except (OSError, AttributeError):
            continue
        i64 = ctypes.c_int64
        function.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, i64, i64, i64, scalar,
                             ctypes.c_void_p, i64, ctypes.c_void_p, i64, scalar,
                             ctypes.c_void_p, i64]
        function.restype = None
        return function
    return None


def gemm_applies(a, b, out):
    """Whether `out = a @ b` through `cblas_gemm` is bit-equal to np.matmul: 2-D
    C-contiguous operands of one dtype, at least two rows and two columns in the result."""
    return (a.ndim == b.ndim == out.ndim == 2 and a.dtype == b.dtype == out.dtype
            and all(x.flags.c_contiguous for x in (a, b, out))
            and out.shape == (a.shape[0], b.shape[1]) and a.shape[1] == b.shape[0]
            and out.shape[0] > 1 and out.shape[1] > 1
            and cblas_gemm(a.dtype) is not None)


def gemm(a, b, out):
    """out[:] = a @ b through NumPy's bundled BLAS (callers check `gemm_applies`)."""
    (m, k), n = a.shape, b.shape[1]
    cblas_gemm(a.dtype)(CBLAS_ROW_MAJOR, CBLAS_NO_TRANS, CBLAS_NO_TRANS, m, n, k, 1.0,
                        a.ctypes.data, k, b.ctypes.data, n, 0.0, out.ctypes.data, n)
    return out
