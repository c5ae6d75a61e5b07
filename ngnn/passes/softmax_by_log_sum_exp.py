"""SoftmaxByLogSumExp: an edge softmax keeps one value per vertex, its log-sum-exp, and every
reader of its weights, the backward pass included, recomputes them from it.

A softmax over each vertex's in-edges written per vertex (GAT's `c = exp(x - max)`,
`s = sum(c)`, `c / s`; seed 000's `exp(x)` without the shift; the attention layers of
ngnn.nn) makes its weights from per-edge values and per-vertex sums. Gradients built by
ng.grad read those edge values (`c`, `c / s`) in the backward pass, so a plan either keeps
an (E, heads) tensor from the forward pass to the backward one or recomputes `c` and
divides by the gathered sum wherever a weight is needed. With the per-vertex log-sum-exp

    lse[v] = m[v] + log(sum over v's in-edges e of exp(x_e - m[v])),   m[v] = max_e x_e

(m = 0 for a softmax written without the shift) each weight is `exp(x_e - lse[dst e])`:
one gather, a subtraction and an exp, which Fusion recomputes wherever it is read, like
any cheap edge value. The forward keeps (max, log-sum) per vertex and head, never an
E x heads tensor. (`ng.edge_softmax`, an op with kernels of its own, is left as it is.)

The rewrite: `c` becomes the weight itself and the sum `s` becomes 1. Every expression
ng.grad builds from a softmax (`c / s`, the divide's adjoints `d / s` and `-d * c / s^2`
summed per vertex, the exp's adjoint `dc * c`) is unchanged when `c` and `s` are scaled by
the same per-vertex factor, and `exp(x - lse) = c / s` is that scaling; SimplePrune then
drops the divisions by 1. The pattern is matched only where that holds: `s` is read only
through its gather by the softmax's own end, that gather only by divisions, and `c` only by
the sum, divisions by that gather and products with a value that depends on it (the exp's
adjoint).
"""
import numpy as np

from ..op_graph import (Aggregate, Broadcast, Constant, Divide, Exp, Gather, Log, Maximum,
                        Multiply, StopGradient, Subtract, ordered_ops)
from .base import GraphPass


def log_sum_exp(x, graph, at, peak=None):
    """Per-vertex log of the sum of exp(x) over each vertex's edges at `at`, shifted by
    their max `peak` when the softmax as written subtracts it (then no exp overflows, and
    a vertex with an edge sums at least exp(0) = 1); an unshifted softmax stays unshifted,
    so the rewrite walks the edges as often as the program did. A vertex without edges
    sums 0 and gets a finite lse that no weight reads."""
    shifted = x if peak is None else Subtract(x, Gather(peak, graph, by=at))
    total = Aggregate(Exp(shifted), graph, at=at, reduce="sum")
    if peak is None:
        tiny = Constant(np.finfo(total.dtype).tiny, dtype=total.dtype)
        return Log(Maximum(total, tiny))
    return peak + Log(Maximum(total, Constant(1.0, dtype=total.dtype)))


def softmax_weights(x, graph, at, lse):
    return Exp(Subtract(x, Gather(lse, graph, by=at)))


class SoftmaxByLogSumExp(GraphPass):
    def do_pass(self, computation):
        ops = ordered_ops(computation.results)
        readers = {}
        for op in ops:
            for a in dict.fromkeys(op.args):
                readers.setdefault(a, []).append(op)
        results = set(computation.results)
        for op in ops:
            if op.forward is not None:
                continue
            if isinstance(op, Aggregate) and op.reduce == "sum" and op not in results:
                self.rewrite_sum(op, readers, results)

    def rewrite_sum(self, total, readers, results):
        """`total` = sum of c, c = exp(y): rewritten when it is a softmax's denominator."""
        coeff = total.args[0]
        if not isinstance(coeff, Exp) or coeff in results:
            return
        graph, at = total.graph, total.at
        spread = readers.get(total, [])
        if len(spread) != 1 or not isinstance(spread[0], Gather) or \
                spread[0].graph is not graph or spread[0].by != at or spread[0] in results:
            return
        (spread,) = spread
        divisions = readers.get(spread, [])
        if not divisions or any(not (isinstance(d, Divide) and d.args[1] is spread)
                                for d in divisions):
            return
        if not any(d.args[0] is coeff for d in divisions):
            return          # not the weights c / s themselves
        for user in readers.get(coeff, []):
            if user is total or user in divisions:
                continue
            if not (isinstance(user, Multiply) and
                    any(a is not coeff and spread in ordered_ops([a]) for a in user.args)):
                return
        x, peak = self.logits(coeff.args[0], graph, at)
        lse = log_sum_exp(x, graph, at, peak)
        coeff.forward = softmax_weights(x, graph, at, lse)
        for op in (total, spread):
            op.forward = Broadcast(Constant(1.0, dtype=op.dtype), op.shape)

    @staticmethod
    def logits(y, graph, at):
        """(x, its per-vertex max) when y = x - gather(max of x) (the shift written by the
        user), else (y, None)."""
        if isinstance(y, Subtract):
            x, shift = y.args
            if isinstance(shift, Gather) and shift.graph is graph and shift.by == at:
                peak = shift.args[0]
                inner = peak.args[0] if isinstance(peak, StopGradient) else peak
                if isinstance(inner, Aggregate) and inner.reduce == "max" and \
                        inner.graph is graph and inner.at == at and inner.args[0] is x:
                    return x, peak
        return y, None
