"""Batch normalization of node rows (Ioffe & Szegedy 2015), as the GIN paper's MLPs use it.

    y, mean, var, count = ng.batch_norm(h, weight, bias, batch=slot)

normalizes each feature by the mean and the biased variance of the rows of `h`, then scales
by `weight` and shifts by `bias`, as torch.nn.BatchNorm1d does in training mode. In a batch
of graphs that a GraphLoader slot holds, the rows past the batch's nodes are padding: they
must not count. They come last: a slot declares its live rows (BatchSlot.live, fed the
loaded batch's vertex count with every batch), so the statistics are taken over the
leading rows that many, and the padding rows of y are 0. The count is the slot's declared
one, not one derived from its graph mask: ngnn.passes.ZeroRowProducts reads the same
value as the rows past which the slot's features and aggregations are 0.

The work is two ops of ngnn/op_graph/normalization.py (BatchNormStats and BatchNormApply)
with closed-form gradients: a few passes over the real rows each way, not the fifteen of an
element-wise composition; nn.BatchNorm keeps the running statistics that evaluation uses. A
whole batch (ng.Graph.batch, or a rank's part of one or of a loader's slot over
ngnn.distributed) runs the ops' decompositions with its readouts as the column sums (of the
loaded graphs only, by the slot's graph_mask), so that chunked and distributed runs reduce
them over row blocks and ranks.
"""
import numpy as np

import ngnn as ng
from ngnn.op_graph.normalization import BatchNormApply, BatchNormStats


def batch_norm(x, weight, bias, eps=1e-5, batch=None):
    """(y, mean, var, count): `x` (rows, F) normalized by its rows' mean and biased variance
    (over the real nodes of `batch` when given), times `weight` plus `bias` (both (F,));
    mean and var are (F,), count (1,) the number of rows they were taken over, at least 1
    (for the unbiased variance of running statistics)."""
    from ngnn.op_graph.op import as_ops
    from ngnn.op_graph import ShapeError
    x, weight, bias = as_ops(x, weight, bias)
    if x.ndim != 2 or weight.shape != x.shape[1:] or bias.shape != x.shape[1:]:
        raise ShapeError(f"batch_norm: expected x (rows, F) and weight, bias (F,), got "
                         f"{x.shape}, {weight.shape}, {bias.shape}")
    if eps <= 0:
        raise ValueError(f"batch_norm: eps must be positive, got {eps}")
    live = None if getattr(batch, "spans_ranks", False) else _live_rows(x, batch)
    if batch is not None and live is None:
        # A whole batch (ng.Graph.batch, or a rank's part of one or of a loader's slot):
        # the statistics' column sums are sums of its readouts, which chunked runs combine
        # over row blocks and distributed ones over ranks (a rank holds only its own rows).
        # The ops' decompositions with those sums, differentiated as the ops they are made
        # of. A slot's graph_mask leaves its padding graph out.
        mask = getattr(batch, "graph_mask", None)

        def row_sum(t):
            pooled = ng.readout(t, batch, "sum")
            if mask is not None:
                pooled = pooled * ng.reshape(ng.cast(mask, pooled.dtype), (mask.shape[0], 1))
            return ng.sum(pooled, axis=0)
        stats = BatchNormStats(x).decomposition(row_sum)
        y = BatchNormApply(x, stats, weight, bias, eps=eps).decomposition()
        count = ng.maximum(row_sum(ng.constant(np.ones((x.shape[0], 1)), dtype=x.dtype)), 1.0)
        return y, stats[0], stats[1], count
    stats = BatchNormStats(x, live)
    y = BatchNormApply(x, stats, weight, bias, live, eps=eps)
    # At least 1: a batch of graphs without nodes normalizes nothing, and gets no NaN.
    count = ng.constant(np.array([max(x.shape[0], 1)]), dtype=x.dtype) if live is None \
        else ng.maximum(live, 1.0)
    return y, stats[0], stats[1], count


def _live_rows(x, batch):
    """None where every row of `x` is real (no batch, or a BatchedGraph); for a slot that
    declares its live rows (BatchSlot.live), that count in x's dtype: the number of
    leading rows the loaded graphs fill (the padding rows come after them)."""
    live = getattr(batch, "live", None)
    return None if live is None else ng.cast(live, x.dtype)
