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
adjoint). Over a rank's local graph (ngnn.distributed) the per-vertex sums are synced
(a mirror reduction, then a broadcast back to the mirrors), and so is the log-sum-exp, so
K ranks compute the bits one process computes.
"""
import numpy as np

from ..op_graph import (Add, Aggregate, Broadcast, Constant, Divide, Dropout, Exp, Gather,
                        Log, MasterBroadcast, Maximum, MirrorReduce, Multiply, Negative,
                        Reshape, StopGradient, Subtract, Transpose, ordered_ops)
from .base import GraphPass


class Ends:
    """How a softmax moves values between edges and vertices: `graph`'s edges at `at`;
    `synced` over a rank's local graph, where a per-vertex sum is reduced onto the masters
    and spread back to the mirrors."""

    def __init__(self, graph, at, synced):
        self.graph, self.at, self.synced = graph, at, synced

    def vertex_sum(self, e):
        total = Aggregate(e, self.graph, at=self.at, reduce="sum")
        return MirrorReduce(total, self.graph, "sum", self.at) if self.synced else total

    def spread(self, n):
        if self.synced:
            n = MasterBroadcast(n, self.graph, at=self.at)
        return Gather(n, self.graph, by=self.at)

    def log_sum_exp(self, x, peak=None):
        """Per-vertex log of the sum of exp(x) over each vertex's edges, shifted by their
        max `peak` when the softmax as written subtracts it (then no exp overflows, and a
        vertex with an edge sums at least exp(0) = 1); an unshifted softmax stays
        unshifted, so the rewrite walks the edges as often as the program did. A vertex
        without edges sums 0 and gets a finite lse that no weight reads."""
        shifted = x if peak is None else Subtract(x, self.spread(peak))
        total = self.vertex_sum(Exp(shifted))
        if peak is None:
            tiny = Constant(np.finfo(total.dtype).tiny, dtype=total.dtype)
            return Log(Maximum(total, tiny))
        return peak + Log(Maximum(total, Constant(1.0, dtype=total.dtype)))

    def weights(self, x, lse):
        return Exp(Subtract(x, self.spread(lse)))

    def peak_of(self, y):
        """(x, its per-vertex max) when y = x - spread(max of x) (the shift written by
        the user), else (y, None)."""
        if not isinstance(y, Subtract):
            return y, None
        x, shift = y.args
        if not (isinstance(shift, Gather) and shift.graph is self.graph and
                shift.by == self.at):
            return y, None
        peak = shift.args[0]
        if self.synced:
            if not isinstance(peak, MasterBroadcast):
                return y, None
            peak = peak.args[0]
        inner = peak.args[0] if isinstance(peak, StopGradient) else peak
        if self.synced:
            inner = inner.args[0] if isinstance(inner, MirrorReduce) and \
                inner.reduce == "max" else None
        if isinstance(inner, Aggregate) and inner.reduce == "max" and \
                inner.graph is self.graph and inner.at == self.at and inner.args[0] is x:
            return x, peak
        return y, None


class SoftmaxByLogSumExp(GraphPass):
    def do_pass(self, computation):
        ops = ordered_ops(computation.results)
        readers = {}
        for op in ops:
            for a in dict.fromkeys(op.args):
                readers.setdefault(a, []).append(op)
        results = set(computation.results)
        for op in ops:
            if op.forward is None and isinstance(op, Aggregate) and op.reduce == "sum":
                self.rewrite_sum(op, readers, results)

    def rewrite_sum(self, total, readers, results):
        """`total` = sum of c, c = exp(y): rewritten when it is a softmax's denominator."""
        coeff = total.args[0]
        if not isinstance(coeff, Exp):
            return
        ends = Ends(total.graph, total.at, synced=False)
        chain = [total]
        synced = self.only_reader(total, readers, MirrorReduce)
        if synced and synced[0].reduce == "sum" and synced[0].at == total.at:
            ends.synced = True
            chain += synced
            broadcast = self.only_reader(synced[0], readers, MasterBroadcast)
            if not broadcast:
                return
            chain += broadcast
        chain += self.only_reader(chain[-1], readers, Gather)
        spread = chain[-1]
        if not isinstance(spread, Gather) or spread.graph is not ends.graph or \
                spread.by != ends.at or any(op in results for op in chain + [coeff]):
            return
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
        x, peak = ends.peak_of(coeff.args[0])
        coeff.forward = ends.weights(x, ends.log_sum_exp(x, peak))
        spread.forward = Broadcast(Constant(1.0, dtype=spread.dtype), spread.shape)

    @staticmethod
    def only_reader(op, readers, kind):
        """[the one reader of `op`] when it is a `kind`, else []."""
        users = readers.get(op, [])
        return users if len(users) == 1 and isinstance(users[0], kind) else []


class OnlineSoftmax:
    """A weighted sum over each vertex's edges of the weights this pass makes, which a
    backend may compute in one walk of the edges (an online softmax, as FlashAttention
    runs one over a sequence): a running max `m` of the logits `x`, the sum `s` of
    exp(x - m) and the weighted sum `acc` with the weights exp(x - m), both rescaled by
    exp(m_old - m_new) when the max grows; the weighted sum is then acc / max(s, 1), since
    exp(x - lse) = exp(x - m) / max(s, 1). Chunks of an edge list fold their (m, s, acc)
    the same way, in a fixed order.

    `OnlineSoftmax.of(total)` matches `total` = sum over edges of `value`, where `value` is
    linear in the weight `exp(x - lse[end])` (products with values free of it, divisions
    of it, broadcasts, reshapes, dropouts, negations), the gather of lse is read by the
    weight alone, and lse = max + log(max(sum(exp(x - max)), 1)) over the same edges, as
    Ends.log_sum_exp writes it (the shifted softmax, over one process's graph). `spread`
    is the gather of lse the weight reads, which a one-pass walk replaces by the running
    max: value(lse := m) = exp(x - m) * (the rest) is the term `acc` sums."""

    def __init__(self, total, x, lse, spread, aligned):
        self.total, self.x, self.lse, self.spread = total, x, lse, spread
        peak = lse.args[0]
        self.peak = peak.args[0] if isinstance(peak, StopGradient) else peak
        self.sums = lse.args[1].args[0].args[0]
        # Whether the weight reaches the sum by broadcasting alone (no reshape), so the
        # walk at one of the sum's elements holds the max and the sum of exponentials of
        # the weight's element it broadcasts from (`coords_of_statistics`).
        self.aligned = aligned

    def coords_of_statistics(self, coords):
        """Coordinates of the sum whose walk finds the max and the sum of exponentials at
        `coords` (coordinates of the logits), or None where the weight is reshaped."""
        if not self.aligned:
            return None
        return list(coords[:1]) + [c if size == whole else "0" for c, size, whole in
                                   zip(coords[1:], self.x.shape[1:], self.total.shape[1:])]

    @classmethod
    def of(cls, total):
        if not (isinstance(total, Aggregate) and total.reduce == "sum" and
                total.dtype.kind == "f"):
            return None
        value = total.args[0]
        weight = cls.linear_weight(value, total)
        if weight is None:
            return None
        x, spread = weight.args[0].args
        lse = spread.args[0]
        if x.shape != spread.shape or not cls.is_log_sum_exp(lse, x, total):
            return None
        # The gather of lse and the subtraction are read by the weight alone.
        ancestry = ordered_ops([value])
        if any((spread in op.args and op is not weight.args[0]) or
               (weight.args[0] in op.args and op is not weight) for op in ancestry):
            return None
        aligned = x.ndim == total.ndim and all(
            w in (1, t) for w, t in zip(x.shape[1:], total.shape[1:])) and not any(
            isinstance(op, (Reshape, Transpose)) for op in cls.path(value, weight))
        return cls(total, x, lse, spread, aligned)

    @staticmethod
    def path(value, weight):
        """The ops from `value` down to `weight` (linear_weight's path)."""
        ops, op = [], value
        while op is not weight:
            ops.append(op)
            op = next(a for a in op.args if weight in ordered_ops([a]))
        return ops

    @classmethod
    def linear_weight(cls, op, total):
        """The weight exp(x - gather(lse)) `op` is linear in, or None."""
        if isinstance(op, Exp) and isinstance(op.args[0], Subtract):
            spread = op.args[0].args[1]
            if isinstance(spread, Gather) and spread.graph is total.graph and \
                    spread.by == total.at:
                return op
            return None
        if isinstance(op, (Broadcast, Reshape, Dropout, Negative)):
            return cls.linear_weight(op.args[0], total)
        if isinstance(op, Divide):
            weight = cls.linear_weight(op.args[0], total)
            return weight if weight is not None and \
                weight not in ordered_ops([op.args[1]]) else None
        if isinstance(op, Multiply):
            a, b = op.args
            for linear, other in ((a, b), (b, a)):
                weight = cls.linear_weight(linear, total)
                if weight is not None and weight not in ordered_ops([other]):
                    return weight
        return None

    @staticmethod
    def is_log_sum_exp(lse, x, total):
        """Whether lse = peak + log(max(sum(exp(x - gather(peak))), 1)), peak = max(x),
        over `total`'s graph and end."""
        def over_edges(op, reduce):
            return isinstance(op, Aggregate) and op.reduce == reduce and \
                op.graph is total.graph and op.at == total.at
        if not (isinstance(lse, Add) and isinstance(lse.args[1], Log) and
                isinstance(lse.args[1].args[0], Maximum)):
            return False
        peak = lse.args[0]
        inner = peak.args[0] if isinstance(peak, StopGradient) else peak
        sums, floor = lse.args[1].args[0].args
        if not (over_edges(inner, "max") and inner.args[0] is x and over_edges(sums, "sum")
                and isinstance(floor, Constant) and floor.is_scalar and floor.value == 1):
            return False
        exp = sums.args[0]
        if not (isinstance(exp, Exp) and isinstance(exp.args[0], Subtract)):
            return False
        shifted, spread = exp.args[0].args
        return shifted is x and isinstance(spread, Gather) and spread.args[0] is peak and \
            spread.graph is total.graph and spread.by == total.at
