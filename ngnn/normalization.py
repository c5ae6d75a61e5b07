"""Batch normalization of node rows (Ioffe & Szegedy 2015), as the GIN paper's MLPs use it.

    y, mean, var, count = ng.batch_norm(h, weight, bias, batch=slot)

normalizes each feature by the mean and the biased variance of the rows of `h`, then scales
by `weight` and shifts by `bias`, as torch.nn.BatchNorm1d does in training mode. In a batch
of graphs that a GraphLoader slot holds, the rows past the batch's nodes are padding: they
must not count. So over a batch the statistics are sums of `ng.readout` over the graphs that
`batch.graph_mask` marks real (every graph of a BatchedGraph), divided by their node count;
padding rows are normalized with the same statistics and read by nothing real. Composed of
existing ops (readout, sums, sqrt), so its gradient, both transformers and fusion come with
them; nn.BatchNorm keeps the running statistics that evaluation uses.
"""
import numpy as np

import ngnn as ng


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
    total = _row_sum(batch)
    # At least 1: a batch of graphs without nodes normalizes nothing, and gets no NaN.
    count = ng.maximum(total(ng.constant(np.ones((x.shape[0], 1)), dtype=x.dtype)), 1.0)
    mean = total(x) / count
    centred = x - mean
    var = total(centred * centred) / count
    y = centred / ng.sqrt(var + eps) * weight + bias
    return y, mean, var, count


def _row_sum(batch):
    """The function summing a node tensor's rows over the real nodes of `batch` into (F,):
    every row without a batch; with one, the readouts of the graphs it marks real."""
    if batch is None:
        return lambda h: ng.sum(h, axis=0)
    mask = getattr(batch, "graph_mask", None)
    if mask is None:            # a BatchedGraph: every graph is real
        return lambda h: ng.sum(ng.readout(h, batch, "sum"), axis=0)
    return lambda h: ng.sum(ng.readout(h, batch, "sum") *
                            ng.reshape(ng.cast(mask, h.dtype), (mask.shape[0], 1)), axis=0)
