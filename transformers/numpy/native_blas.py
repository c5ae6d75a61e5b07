"""NumPy's own BLAS, found at run time so native C code can make np.matmul's products itself.

The native step's Python body pays the interpreter for every statement, its `np.matmul`
calls included (docs/native.md). NumPy 2.x wheels bundle scipy-openblas64, whose
`scipy_cblas_{d,s}gemm64_` and `_gemv64_` (ILP64 integers) are the kernels `np.matmul`
itself calls for a product of matrices and for a row times a matrix. A segment of the step
in C (native_segments.py) calls them through the addresses `address` gives, with the
arguments `matmul_call` works out: those np.matmul's loop
(numpy/_core/src/umath/matmul.c.src) passes for the same arrays, so the product is the
same to the bit. Where that loop takes another path (a column or an inner axis of 1: gemv
of another kind, dot or its own loop; an axis of 0; a layout it copies first; a matrix
times its own transpose: syrk), `matmul_call` says None and the product stays a NumPy
call.

The symbol is looked up with ctypes (no link-time dependency). Another NumPy build
(system OpenBLAS, MKL, Accelerate) has no such library: `cblas` returns None and every
product stays a NumPy call.
"""
import ctypes
import functools
import glob
import os

import numpy as np

CBLAS_ROW_MAJOR, CBLAS_COL_MAJOR = 101, 102
CBLAS_NO_TRANS, CBLAS_TRANS = 111, 112
GEMM, GEMV = 0, 1           # the routine of a product's call
PREFIX = {np.dtype(np.float64): "d", np.dtype(np.float32): "s"}


def bundled_openblas():
    """Paths of the scipy-openblas64 libraries bundled with this NumPy (may be empty)."""
    libs = os.path.join(os.path.dirname(os.path.dirname(np.__file__)), "numpy.libs")
    return sorted(glob.glob(os.path.join(libs, "libscipy_openblas64_*")))


@functools.lru_cache(maxsize=None)
def cblas(routine, dtype):
    """The ctypes function of NumPy's bundled cblas `routine` (GEMM or GEMV) for `dtype`,
    or None."""
    dtype = np.dtype(dtype)
    if dtype not in PREFIX:
        return None
    name = f"scipy_cblas_{PREFIX[dtype]}{('gemm', 'gemv')[routine]}64_"
    for path in bundled_openblas():
        try:
            return getattr(ctypes.CDLL(path), name)
        except (OSError, AttributeError):
            continue
    return None


def address(routine, dtype):
    """The address of NumPy's bundled `routine` for `dtype` (callers check `cblas`)."""
    return ctypes.cast(cblas(routine, dtype), ctypes.c_void_p).value


def _blasable(stride1, stride2, d2, itemsize):
    """matmul.c.src's is_blasable2d: the fast axis contiguous, the slow one a whole row."""
    return stride2 == itemsize and stride1 % itemsize == 0 and stride1 // itemsize >= d2


def _layout(x, rows, cols):
    """(transposed, leading dimension) of a (rows, cols) operand as NumPy passes it to
    gemm, or None where NumPy copies it first."""
    s1, s2 = x.strides
    if _blasable(s1, s2, cols, x.itemsize):
        return CBLAS_NO_TRANS, s1 // x.itemsize
    if _blasable(s2, s1, rows, x.itemsize):
        return CBLAS_TRANS, s2 // x.itemsize
    return None


def matmul_call(a, b, out):
    """The BLAS call `np.matmul(a, b, out=out)` makes, as (routine, flag a, flag b, m, n,
    k, lda, ldb, ldc), or None where it makes none of these (see the module), where
    `out` overlaps an operand (NumPy would copy the operand first), or where this NumPy
    has no bundled BLAS:
      - matrix @ matrix (m, n, k at least 2): (GEMM, trans a, trans b, m, n, k, lda, ldb,
        ldc) of a row-major gemm;
      - row @ matrix (m 1; n, k at least 2): NumPy's gemv of the transposed matrix,
        (GEMV, its order, CblasTrans, 1, n, k, a's step, the matrix's leading dimension,
        out's step)."""
    if not (a.ndim == b.ndim == out.ndim == 2 and a.dtype == b.dtype == out.dtype and
            a.dtype in PREFIX):
        return None
    (m, k), n = a.shape, b.shape[1]
    if b.shape[0] != k or out.shape != (m, n) or min(n, k) < 2 or m < 1 or \
            not all(x.flags.aligned for x in (a, b, out)) or not out.flags.writeable or \
            np.may_share_memory(out, a) or np.may_share_memory(out, b) or \
            a.ctypes.data == b.ctypes.data:         # a matrix times its transpose: syrk
        return None
    size = a.itemsize
    second = _layout(b, k, n)
    if m == 1:
        # matmul.c.src's vector_matrix: a's row of any positive step, then its gemv.
        step = a.strides[1]
        if second is None or not _blasable(step, size, 1, size) or \
                not _blasable(out.strides[1], size, 1, size) or \
                cblas(GEMV, a.dtype) is None:
            return None
        order, lda = (CBLAS_COL_MAJOR, b.strides[1] // size) \
            if _blasable(b.strides[1], b.strides[0], k, size) else \
            (CBLAS_ROW_MAJOR, b.strides[0] // size)
        return GEMV, order, CBLAS_TRANS, 1, n, k, step // size, lda, out.strides[1] // size
    first = _layout(a, m, k)
    # An output NumPy writes as is: rows of n contiguous values (else it transposes the
    # whole product or copies it).
    if first is None or second is None or not _blasable(*out.strides, n, size) or \
            cblas(GEMM, a.dtype) is None:
        return None
    return GEMM, first[0], second[0], m, n, k, first[1], second[1], out.strides[0] // size
