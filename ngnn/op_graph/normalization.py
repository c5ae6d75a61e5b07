"""Batch normalization as ops of its own: the statistics, the normalization, and their
closed-form gradients.

Composed of element-wise ops, a batch norm takes some fifteen passes over the rows
forward and twenty backward, plus a readout per statistic to leave a slot's padding out.
These ops take two to four passes each way:

    stats = BatchNormStats(x, live)                      # (2, F): mean, biased variance
    y = BatchNormApply(x, stats, weight, bias, live, eps=1e-5)

`live`, optional, is a (1,) tensor holding at run time how many leading rows of `x` are
real (a GraphLoader slot's batch: its padding rows come last). Statistics are taken over
those rows only; the other rows of every (rows, F) result are 0, and no gradient reaches
them. Without `live` every row is real. Ops whose rows past `live` are 0 say so
(`zero_past_live`): ngnn.passes.ZeroRowProducts then leaves those rows out of the matrix
products that read them.

The gradient is the textbook one split at the statistics, so each op stays correct
wherever its arguments come from: BatchNormApply's adjoints are the direct term
(BatchNormApplyGrad: dy * weight / std on the live rows), the two column sums that the
weight, the bias and the statistics' gradients are made of (BatchNormApplySums:
sum dy * (x - mean), sum dy), and small (F,) ops; BatchNormStats's adjoint spreads the
gradients of the mean and variance back over the live rows (BatchNormStatsGrad). The sum
of the two terms is dx = (weight / std / n) (n dy - sum dy - xhat sum dy xhat).

The NumPy transformer runs each op as one kernel over the live rows
(transformers/numpy/kernels.py, `K.batch_norm_*`); a transformer without kernels for
them (the GPU's) runs `decomposition()`, the same formulas as element-wise ops and
column sums under a 0/1 mask of the live rows (ngnn.passes.Decompose).
"""
import numpy as np

from .op import Attr, Constant, Op, ShapeError, as_ops


def _live_arg(name, x, live):
    """`[live]` checked, or [] without it."""
    if live is None:
        return []
    (live,) = as_ops(live)
    if live.shape != (1,):
        raise ShapeError(f"{name}: live must be a (1,) tensor holding the number of real "
                         f"rows of x, got shape {live.shape}")
    return [live]


def _check_rows(name, x):
    if x.ndim != 2 or x.dtype.kind != "f":
        raise ShapeError(f"{name}: expected x of shape (rows, F) and a float dtype, got "
                         f"{x.shape} {x.dtype}")


def _check_features(name, x, **vectors):
    for label, v in vectors.items():
        if v.shape != x.shape[1:]:
            raise ShapeError(f"{name}: {label} must have shape {x.shape[1:]} (one value per "
                             f"feature of x {x.shape}), got {v.shape}")


def _check_stats(name, x, stats):
    if stats.shape != (2,) + x.shape[1:]:
        raise ShapeError(f"{name}: stats must have shape {(2,) + x.shape[1:]} (mean and "
                         f"variance per feature), got {stats.shape}")


class LiveMask:
    """What the decompositions share: the 0/1 mask of the live rows (index < live), their
    number and their column sums. `row_sum`, when given, takes the column sums (a (rows, F)
    tensor to (F,)) in place of a Sum over the rows: ng.batch_norm passes the sum of a
    batch's readouts, which chunked and distributed runs reduce over row blocks and ranks."""

    def __init__(self, x, live, row_sum=None):
        self.rows = x.shape[0]
        self.live = live[0] if live else None
        self.dtype = x.dtype
        self.row_sum = row_sum
        if self.live is not None:
            from .elementwise import Cast, Greater
            from .layout import Reshape
            index = Constant(np.arange(self.rows, dtype=self.dtype).reshape(self.rows, 1))
            self.mask = Greater(Reshape(Cast(self.live, self.dtype), (1, 1)), index)

    def count(self):
        """The live rows as a divisor: at least 1."""
        from .elementwise import Maximum
        if self.row_sum is not None:
            return Maximum(self.sum(Constant(np.ones((self.rows, 1), self.dtype))), 1.0)
        if self.live is None:
            return float(max(self.rows, 1))
        return Maximum(self.sum(self.mask), 1.0)

    def sum(self, t):
        """The column sums of `t` (rows, F)."""
        from .reductions import Sum
        return Sum(t, axis=0) if self.row_sum is None else self.row_sum(t)

    def masked(self, t):
        """`t` (rows, F) with the rows past the live ones 0."""
        return t if self.live is None else t * self.mask


class RowPhase:
    """One pass over the live rows of a LiveRowsOp, as C templates over one column `j`.
    Fields: an argument by its `row_args` name, `{x}` its element (i, j) for a (rows, F)
    tensor, `{stats0}`/`{stats1}` row 0/1 at column j for a (2, F) one, `{weight}` [j] for
    an (F,) one; `{T}` the C type, `{eps}`, `{count}` (live rows, at least 1, as T),
    `{inverse}` (1.0 / count in double); `{out0}`/`{out1}` the op's own (2, F) rows made by
    an earlier phase; `{<name>}` a column value of `columns`.
      - columns: ((name, expr), ...), computed per column before the rows;
      - element: the result's element on a live row (rows past them are 0), or None;
      - sums: ((result row, expr), ...), summed over the live rows in row order in T;
        `mean`: each sum divided by the count at the end."""

    def __init__(self, columns=(), element=None, sums=(), mean=False):
        self.columns, self.element, self.sums, self.mean = columns, element, sums, mean


class LiveRowsOp(Op):
    """An op over the live rows of its tensors: `fixed_args` tensor arguments, then, when
    given, the live-row count (`live`, None without it). `zero_past_live`: the result's
    rows past the live ones are 0 (ngnn.passes.ZeroRowProducts relies on it)."""
    fixed_args = None
    zero_past_live = False
    kernel = None       # the NumPy transformer's kernel (transformers/numpy/kernels.py)
    # How the op runs inside a native row loop (transformers/numpy/native_sweeps.py): its
    # arguments' field names, then one RowPhase per pass over the rows it needs.
    row_args = ()
    row_phases = ()

    @property
    def live(self):
        args = self.args
        return args[self.fixed_args] if len(args) > self.fixed_args else None

    @property
    def numpy(self):
        """`K.<kernel>(tensors, live or None[, eps=...], out=...)`."""
        absent = "" if self.live is not None else ", None"
        eps = ", eps={eps!r}" if any(a.field == "eps" for a in self.attributes) else ""
        return f"K.{self.kernel}({{xs}}{absent}{eps}, out={{out}})"


class BatchNormStats(LiveRowsOp):
    """(2, F): row 0 the mean, row 1 the biased variance of each feature of `x` (rows, F)
    over its live rows (0 where there are none)."""
    fixed_args = 1
    kernel = "batch_norm_stats"
    # Two passes, as the kernels make them: the mean, then the spread around it.
    row_args = ("x",)
    row_phases = (RowPhase(sums=((0, "{x}"),), mean=True),
                  RowPhase(sums=((1, "({x} - {out0}) * ({x} - {out0})"),), mean=True))

    def __init__(self, x, live=None, name=None):
        (x,) = as_ops(x)
        _check_rows("batch_norm_stats", x)
        args = [x] + _live_arg("batch_norm_stats", x, live)
        super().__init__(args, shape=(2,) + x.shape[1:], dtype=x.dtype, name=name)

    def adjoints(self, delta):
        x, *live = self.args
        return [BatchNormStatsGrad(delta, x, self, *live)] + [None] * len(live)

    def decomposition(self, row_sum=None):
        from .layout import Concat, Reshape
        x, *live = self.args
        rows = LiveMask(x, live, row_sum)
        count = rows.count()
        mean = rows.sum(rows.masked(x)) / count
        centred = rows.masked(x - mean)
        var = rows.sum(centred * centred) / count
        return Concat(Reshape(mean, (1,) + mean.shape), Reshape(var, (1,) + var.shape))


class BatchNormStatsGrad(LiveRowsOp):
    """The gradient of BatchNormStats(x, live) given `delta` (2, F), the gradients of its
    mean and variance: (delta[0] + 2 delta[1] (x - mean)) / n on the n live rows, 0 on the
    others."""
    fixed_args = 3
    kernel = "batch_norm_stats_grad"
    zero_past_live = True
    row_args = ("delta", "x", "stats")
    row_phases = (RowPhase(columns=(("spread", "{delta1} * ({T})(2.0 * {inverse})"),
                                    ("shift", "{delta0} * ({T}){inverse}")),
                           element="({x} - {stats0}) * {spread} + {shift}"),)

    def __init__(self, delta, x, stats, live=None, name=None):
        delta, x, stats = as_ops(delta, x, stats)
        _check_rows("batch_norm_stats_grad", x)
        _check_stats("batch_norm_stats_grad", x, stats)
        _check_stats("batch_norm_stats_grad", x, delta)
        args = [delta, x, stats] + _live_arg("batch_norm_stats_grad", x, live)
        super().__init__(args, shape=x.shape, dtype=x.dtype, name=name)

    def decomposition(self):
        delta, x, stats, *live = self.args
        rows = LiveMask(x, live)
        n = rows.count()
        return rows.masked((x - stats[0]) * (delta[1] * 2.0 / n) + delta[0] / n)


class BatchNormApply(LiveRowsOp):
    """(x - mean) / sqrt(var + eps) * weight + bias on the live rows of `x`, with mean and
    var the rows of `stats` (BatchNormStats); 0 on the other rows."""
    fixed_args = 4
    kernel = "batch_norm_apply"
    zero_past_live = True
    attributes = (Attr("eps"),)
    row_args = ("x", "stats", "weight", "bias")
    row_phases = (RowPhase(columns=(("scale", "{weight} / ({T})sqrt({stats1} + ({T}){eps})"),),
                           element="({x} - {stats0}) * {scale} + {bias}"),)

    def __init__(self, x, stats, weight, bias, live=None, eps=1e-5, name=None):
        x, stats, weight, bias = as_ops(x, stats, weight, bias)
        _check_rows("batch_norm", x)
        _check_stats("batch_norm", x, stats)
        _check_features("batch_norm", x, weight=weight, bias=bias)
        if not eps > 0:
            raise ValueError(f"batch_norm: eps must be positive, got {eps}")
        self.eps = float(eps)
        args = [x, stats, weight, bias] + _live_arg("batch_norm", x, live)
        super().__init__(args, shape=x.shape, dtype=x.dtype, name=name)

    def inverse_std(self):
        from .elementwise import Sqrt
        return 1.0 / Sqrt(self.args[1][1] + self.eps)

    def adjoints(self, delta):
        from .layout import Concat, Reshape
        x, stats, weight, bias, *live = self.args
        sums = BatchNormApplySums(delta, x, stats, *live)
        inv_std = self.inverse_std()
        scaled = weight * inv_std
        d_mean = -scaled * sums[1]
        d_var = scaled * inv_std * inv_std * sums[0] * -0.5
        d_stats = Concat(Reshape(d_mean, (1,) + d_mean.shape),
                         Reshape(d_var, (1,) + d_var.shape))
        return [BatchNormApplyGrad(delta, stats, weight, *live, eps=self.eps), d_stats,
                sums[0] * inv_std, sums[1]] + [None] * len(live)

    def decomposition(self):
        x, stats, weight, bias, *live = self.args
        return LiveMask(x, live).masked((x - stats[0]) * (weight * self.inverse_std()) + bias)


class BatchNormApplyGrad(LiveRowsOp):
    """The direct term of BatchNormApply's gradient in x: `delta` * weight /
    sqrt(var + eps) on the live rows, 0 on the others."""
    fixed_args = 3
    kernel = "batch_norm_apply_grad"
    zero_past_live = True
    attributes = (Attr("eps"),)
    row_args = ("delta", "stats", "weight")
    row_phases = (RowPhase(columns=(("scale", "{weight} / ({T})sqrt({stats1} + ({T}){eps})"),),
                           element="{delta} * {scale}"),)

    def __init__(self, delta, stats, weight, live=None, eps=1e-5, name=None):
        delta, stats, weight = as_ops(delta, stats, weight)
        _check_rows("batch_norm_apply_grad", delta)
        _check_stats("batch_norm_apply_grad", delta, stats)
        _check_features("batch_norm_apply_grad", delta, weight=weight)
        self.eps = float(eps)
        args = [delta, stats, weight] + _live_arg("batch_norm_apply_grad", delta, live)
        super().__init__(args, shape=delta.shape, dtype=delta.dtype, name=name)

    def decomposition(self):
        from .elementwise import Sqrt
        delta, stats, weight, *live = self.args
        return LiveMask(delta, live).masked(delta * (weight / Sqrt(stats[1] + self.eps)))


class BatchNormApplySums(LiveRowsOp):
    """(2, F): the column sums over the live rows of `delta` * (x - mean) and of
    `delta`, what BatchNormApply's gradients in its weight, bias and statistics are made
    of."""
    fixed_args = 3
    kernel = "batch_norm_apply_sums"
    row_args = ("delta", "x", "stats")
    row_phases = (RowPhase(sums=((1, "{delta}"), (0, "{delta} * ({x} - {stats0})"))),)

    def __init__(self, delta, x, stats, live=None, name=None):
        delta, x, stats = as_ops(delta, x, stats)
        _check_rows("batch_norm_apply_sums", x)
        _check_stats("batch_norm_apply_sums", x, stats)
        if delta.shape != x.shape:
            raise ShapeError(f"batch_norm_apply_sums: delta {delta.shape} and x {x.shape} "
                             "differ in shape")
        args = [delta, x, stats] + _live_arg("batch_norm_apply_sums", x, live)
        super().__init__(args, shape=(2,) + x.shape[1:], dtype=x.dtype, name=name)

    def decomposition(self):
        from .layout import Concat, Reshape
        from .reductions import Sum
        delta, x, stats, *live = self.args
        rows = LiveMask(x, live)
        live_delta = rows.masked(delta)
        sums = [Sum(live_delta * (x - stats[0]), axis=0), Sum(live_delta, axis=0)]
        return Concat(*(Reshape(s, (1,) + s.shape) for s in sums))
