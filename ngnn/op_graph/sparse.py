"""Sparse tensors: a placeholder declared `sparse=True` is fed a scipy.sparse CSR matrix.

Sparse tensors take part in few ops, the ones bag-of-words node features need: the
product with a dense matrix (`ng.dot(x, W)`, whose gradient with respect to W is X^T @ delta,
computed from the CSR arrays without densifying X) and dropout of the stored values. Any
other op given a sparse tensor is an error that says so.
"""
import numpy as np

from .op import Attr, Op, ShapeError, as_ops
from .training_ops import dropout_seed
from .work import Work, elements, nbytes


def _sparse_matrix(op_name, x):
    if not x.is_sparse or x.ndim != 2:
        raise ShapeError(f"{op_name}: expects a 2-D sparse tensor, got {x}")


class SparseDot(Op):
    """x @ w with x a sparse (N, F) tensor and w a dense (F, H) matrix: a CSR product."""
    takes_sparse = True

    def __init__(self, x, w, name=None):
        x, w = as_ops(x, w)
        _sparse_matrix("dot", x)
        if w.is_sparse or w.ndim != 2:
            raise ShapeError(f"dot: a sparse tensor multiplies a dense 2-D matrix, got "
                             f"{w}")
        if x.shape[1] != w.shape[0]:
            raise ShapeError(f"dot: shapes {x.shape} and {w.shape} are not aligned "
                             f"({x.shape[1]} != {w.shape[0]})")
        from .elementwise import result_dtype
        super().__init__([x, w], shape=(x.shape[0], w.shape[1]),
                         dtype=result_dtype("dot", x, w), name=name)

    @property
    def work(self):
        return csr_product(self)

    def adjoints(self, delta):
        x, _ = self.args
        return [None, SparseTransposedDot(x, delta)]


def csr_product(op):
    """A CSR product's work at full density: the plan does not know how many of the
    sparse operand's entries are non-zero, so this bounds it from above (multiply-adds;
    the dense operand, the result and a column index and a value an entry)."""
    x, d = op.args
    stored = elements(x)
    macs = stored * op.shape[-1]
    return (Work("csr_product", macs, moved=nbytes(d) + nbytes(op) + stored * 8,
                 flops=2 * macs),)


class SparseTransposedDot(Op):
    """x^T @ d with x a sparse (N, F) tensor and d a dense (N, H) matrix: the gradient of a
    sparse product with respect to its dense operand, read from x's CSR arrays."""
    takes_sparse = True

    def __init__(self, x, d, name=None):
        x, d = as_ops(x, d)
        _sparse_matrix("dot", x)
        if d.is_sparse or d.shape[:1] != x.shape[:1] or d.ndim != 2:
            raise ShapeError(f"sparse x^T @ d: d must be dense ({x.shape[0]}, H), got {d}")
        super().__init__([x, d], shape=(x.shape[1], d.shape[1]), dtype=d.dtype, name=name)

    @property
    def work(self):
        return csr_product(self)

    def adjoints(self, delta):
        x, _ = self.args
        return [None, SparseDot(x, delta)]


class SparseDropout(Op):
    """Dropout of the stored values of a sparse tensor: the value at (i, j) is kept, and
    scaled, exactly when a dense dropout with the same seed keeps position i * F + j."""
    takes_sparse = True
    is_stateful = True
    is_sparse = True
    attributes = (Attr("rate"), Attr("seed"), Attr("rows"))

    def __init__(self, x, rate, seed=None, name=None, rows=None):
        (x,) = as_ops(x)
        _sparse_matrix("dropout", x)
        self.rows = rows          # as Dropout's: row i at the positions of an id
        if not 0.0 <= rate < 1.0:
            raise ValueError(f"dropout: rate must be in [0, 1), got {rate}")
        self.rate = float(rate)
        self.seed = dropout_seed(seed)
        super().__init__([x], shape=x.shape, dtype=x.dtype, name=name)

    @property
    def work(self):
        """A draw and a scale per stored value, bounded by the dense size."""
        return (Work("dropout", elements(self), moved=2 * nbytes(self)),)

    def adjoints(self, delta):
        return [None]


def sparse_source(op):
    """The sparse placeholder under a chain of sparse dropouts, and the dropouts from the
    outermost in."""
    dropouts = []
    while isinstance(op, SparseDropout):
        dropouts.append(op)
        op = op.args[0]
    return op, dropouts


def check_sparse_value(name, shape, dtype, value):
    """A scipy.sparse CSR matrix fed to a sparse placeholder, checked and in canonical form
    (float data of the placeholder's dtype, int32 indices, sorted, no duplicates)."""
    import scipy.sparse
    if not scipy.sparse.issparse(value):
        raise TypeError(f"parameter {name!r} is sparse and expects a scipy.sparse CSR matrix, "
                        f"got {type(value).__name__}")
    if value.format != "csr":
        raise TypeError(f"parameter {name!r} expects a CSR matrix, got the {value.format!r} "
                        "format; convert it with .tocsr()")
    if value.shape != shape:
        raise ValueError(f"parameter {name!r} expects shape {shape}, got a sparse matrix of "
                         f"shape {value.shape}")
    if value.dtype.kind not in "fiub":
        raise TypeError(f"parameter {name!r} expects {dtype} values, got a sparse matrix of "
                        f"dtype {value.dtype}")
    matrix = scipy.sparse.csr_matrix(value, dtype=dtype, copy=False)
    if not matrix.has_canonical_format:
        matrix = matrix.copy()
        matrix.sum_duplicates()
    if matrix.indices.dtype != np.int32 and matrix.nnz < 2 ** 31:
        matrix = scipy.sparse.csr_matrix(
            (matrix.data, matrix.indices.astype(np.int32), matrix.indptr.astype(np.int32)),
            shape=matrix.shape)
    return matrix
