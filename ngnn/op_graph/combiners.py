"""The reduction table: how each kind of reduction starts, combines, finishes and
differentiates, in one place.

A reduction kind ("sum", "mean", "max", "min", "prod") is one `Combiner` row. Every
place that reduces reads its row instead of spelling the kind out again:

* the ops: `Aggregate(reduce=)` (over each vertex's edges), the axis reductions `Sum`,
  `Mean`, `Max`, `Min` (`combiner` on the class), and the communication ops that combine
  partial results across ranks (`MirrorReduce`, `ReadoutAllReduce`);
* the NumPy kernels (`ufunc.reduceat` over CSR segments, or a sparse product for a linear
  kind), chunked execution (partial results of row blocks and edge pieces folded on the
  host with `ufunc`, starting from `identity`), the ranks' exchanges (mirrors and
  per-graph partials folded with `ufunc`; a copy without edges holds `identity`);
* the gradient of an aggregation (`edge_adjoint`), and the GPU kernels: an edge
  reduction, a heavy row's chunk partials (folded in chunk order) and an axis reduction
  start from `identity_in(dtype)`, fold with the C statement `c_fold` and finish by
  `divides`.

Every kind gives 0 at a vertex (or graph) with no edges; `divides` kinds finish by
dividing by the count of edges. Partial results (of edge pieces, ranks or row blocks)
combine by `partial`: the row of the kind they are made with (a mean's partials are sums).

Adding a kind is one row here plus its tests: a `prod` row is the worked example in
docs/adding_an_op.md.
"""
from dataclasses import dataclass
from typing import Callable

import numpy as np


def _sum_adjoint(x, out, delta, graph, at):
    from .graph_ops import Gather
    return Gather(delta, graph, by=at)


def _mean_adjoint(x, out, delta, graph, at):
    from .graph_ops import Gather
    return Gather(delta * out.degree_scale(), graph, by=at)


def _extreme_adjoint(x, out, delta, graph, at):
    """The selected edge gets the gradient; ties share it equally."""
    from .elementwise import Equal, Maximum
    from .graph_ops import Aggregate, Gather
    hit = Equal(x, Gather(out, graph, by=at))
    ties = Aggregate(hit, graph, at=at, reduce="sum")
    return Gather(delta / Maximum(ties, 1.0), graph, by=at) * hit


def _prod_adjoint(x, out, delta, graph, at):
    """d out / d x_e is the product of the vertex's other edge values: that of its
    non-zero values divided by x_e where the vertex has no zero, that product at its one
    zero, and 0 elsewhere (two zeros or more). Exact where out / x_e would give 0 / 0."""
    from .elementwise import Equal
    from .graph_ops import Aggregate, Gather
    zero = Equal(x, 0.0)
    nonzero = x + zero                       # zeros replaced by ones
    zeros = Gather(Aggregate(zero, graph, at=at, reduce="sum"), graph, by=at)
    others = Gather(Aggregate(nonzero, graph, at=at, reduce="prod"), graph, by=at)
    share = (1.0 - zero) * Equal(zeros, 0.0) / nonzero + zero * Equal(zeros, 1.0)
    return Gather(delta, graph, by=at) * others * share


@dataclass(frozen=True)
class Combiner:
    """One kind of reduction.

    ufunc         the NumPy ufunc combining two partial results; `ufunc.reduceat`
                  reduces the CSR segments of the NumPy kernels
    identity      what an accumulator starts from (combining with it changes nothing)
    numpy_reduce  the NumPy function of an axis reduction (`np.sum(x, axis=...)`)
    c_fold        the C statement folding `{x}` into the accumulator `{acc}` (NaN wins a
                  max or min, as in NumPy)
    edge_adjoint  (x, out, delta, graph, at) -> the gradient of the edge values x of an
                  aggregation `out`, given the gradient `delta` of its result
    linear        a sum of the values: a sparse product computes it (and reorders with a
                  transform), its float32 sums may accumulate in float64
    divides       finishes by dividing by the count (of edges, or of reduced elements)
    partial       the kind partial results combine with (a mean's partials are sums)
    """
    name: str
    ufunc: np.ufunc
    identity: float
    numpy_reduce: str
    c_fold: str
    edge_adjoint: Callable
    linear: bool = False
    divides: bool = False
    partial: str = None

    def identity_in(self, dtype):
        """`identity` as a value of `dtype` (an integer's extremes for the infinities)."""
        dtype = np.dtype(dtype)
        if dtype.kind in "iub" and np.isinf(self.identity):
            info = np.iinfo(dtype) if dtype.kind in "iu" else np.iinfo(np.uint8)
            return dtype.type(info.max if self.identity > 0 else info.min)
        return dtype.type(self.identity)

    @property
    def partial_combiner(self):
        return COMBINERS[self.partial or self.name]

    def fold(self, acc, rows, values):
        """acc[rows] = combine(acc[rows], values) (rows unique)."""
        acc[rows] = self.ufunc(acc[rows], values)


_SUM_FOLD = "{acc} += {x};"
COMBINERS = {c.name: c for c in [
    Combiner("sum", np.add, 0.0, "sum", _SUM_FOLD, _sum_adjoint, linear=True),
    Combiner("mean", np.add, 0.0, "mean", _SUM_FOLD, _mean_adjoint, linear=True,
             divides=True, partial="sum"),
    Combiner("max", np.maximum, -np.inf, "max",
             "{acc} = ((({x} > {acc}) | ({x} != {x})) ? {x} : {acc});", _extreme_adjoint),
    Combiner("min", np.minimum, np.inf, "min",
             "{acc} = ((({x} < {acc}) | ({x} != {x})) ? {x} : {acc});", _extreme_adjoint),
    Combiner("prod", np.multiply, 1.0, "prod", "{acc} *= {x};", _prod_adjoint),
]}


def combiner_of(name, what="reduce"):
    """The row of `name`, or a ValueError naming the kinds there are."""
    try:
        return COMBINERS[name]
    except KeyError:
        raise ValueError(f"{what}: reduce must be one of {tuple(COMBINERS)}, got "
                         f"{name!r}") from None
