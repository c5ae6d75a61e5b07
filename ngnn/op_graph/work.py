"""What an op's NumPy statement does, declared on the op (`Op.work`) for the simulator to
price (ngnn/simulate/cost.py): the calibrated kernels it runs, each over so many items,
rows of so many float32s, reading a table of so many rows, moving so many bytes.

An op that declares no work is element-wise: it is priced by the NumPy functions it
declares (`Op.numpy_calls`), each a pass over its operands. The other ops declare a tuple of
`Work`, one per kernel their statement runs, in the order it runs them. A kernel is a curve
of a calibrated profile (a graph primitive: "take", "spmm", "edge_take", "segment",
"log_softmax", "row_sum", "column_sum", ...) or one of the simulator's rules for work that
is not one curve ("pass": element-wise traffic at the memory bandwidth; "matmul" and
"matmul_t": a BLAS product; "csr_product"; "dropout" and "keyed_dropout"; the exchanges
"mirror_reduce", "master_broadcast", "all_reduce"), named in `ngnn.simulate.cost.RULES`.
"""
from typing import NamedTuple, Optional

import numpy as np


class Work(NamedTuple):
    kernel: str
    items: float = 0                  # edges, rows or elements it runs over
    width: float = 1                  # float32s a row (a product: its outer size)
    table: Optional[int] = None       # rows of the table it reads (a product: inner size)
    moved: float = 0                  # bytes it moves (0: a row's bytes an item)
    flops: float = 0
    calls: int = 1                    # statements it runs
    transcendental: float = 0         # exp-like evaluations (a pass)


def elements(op):
    return int(np.prod(op.shape, dtype=np.int64))


def nbytes(op):
    return elements(op) * np.dtype(op.dtype).itemsize


def row_elements(op):
    """Elements per row of a node or edge tensor (features times heads)."""
    return int(np.prod(op.shape[1:], dtype=np.int64))


def row_width(op):
    """A row's width in float32s, the unit the calibrated curves were measured in."""
    return row_elements(op) * np.dtype(op.dtype).itemsize / 4
