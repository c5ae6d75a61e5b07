"""AggregateTransformOrder (seed 004, Galois libgnn): transform first or aggregate first,
whichever moves fewer bytes over the edges.

A sum or mean aggregation is linear in the features, and so is everything between it and
a matrix product that only scales whole rows (GCN's degree norms, an edge weight per
edge), so

    dot(scale(aggregate(weight * gather(h))), W) == scale(aggregate(weight * gather(dot(h, W))))

Both sides do the same dense product (N rows times W), but the edge work, a gathered row
and a message per edge, is as wide as the features on the edges: F_in before W, F_out
after. The pass rewrites each such chain into the order with the narrower edges: transform
first when W shrinks the columns (GCN on bag-of-words features), aggregate first when it
grows them (the backward pass of the same layer, whose product with W^T widens). Equal
widths are left as written. Gradients built before the pass are rewritten like any other
chain: they are graph ops too.

The chain is matched only where each of its values has no other reader, so the rewrite
never computes a value twice.
"""
from ..op_graph import Aggregate, Divide, Dot, Gather, Multiply, Transpose, ordered_ops
from .base import RewritePass
from .cse import CSE

SCALES = (Multiply, Divide)


class AggregateTransformOrder(RewritePass):
    def do_pass(self, computation):
        super().do_pass(computation)
        CSE().do_pass(computation)      # a transposed chain may repeat one that exists

    def rewrite_one(self, computation):
        ops = ordered_ops(computation.results)
        users = {}
        for op in ops:
            for a in op.args:
                users.setdefault(a, []).append(op)
        results = set(computation.results)
        readers = {op: list(dict.fromkeys(us)) for op, us in users.items() if op not in results}
        for agg in ops:
            if isinstance(agg, Aggregate) and agg.combiner.linear and agg.ndim == 2:
                chain = Chain.match(agg, readers)
                if chain is not None and chain.rewrite():
                    return True
        return False


def row_scale(op, value):
    """s, if `op` is value * s or value / s with s the same for every feature of a row."""
    if not isinstance(op, SCALES) or op.shape != value.shape:
        return None
    x, s = op.args
    if x is not value:
        if isinstance(op, Divide) or s is not value:
            return None
        x, s = s, x
    if s.ndim > value.ndim or (s.ndim and s.shape[-1] != 1) or s is value:
        return None
    return s


def only_reader(op, readers):
    """The one op reading `op`, if it has exactly one and is not a result."""
    found = readers.get(op, [])
    return found[0] if len(found) == 1 else None


def scales_upward(value, readers):
    """Row scales applied to `value` one after the other: ([(op, scale)], last value)."""
    scales = []
    while only_reader(value, readers) is not None and \
            row_scale(only_reader(value, readers), value) is not None:
        op = only_reader(value, readers)
        scales.append((op, row_scale(op, value)))
        value = op
    return scales, value


def scales_downward(value, readers, stop):
    """Row scales that make `value`, followed down to the first op `stop` accepts:
    ([(op, scale)] in the order they apply, base value)."""
    scales = []
    while not stop(value):
        below = next((a for a in value.args if row_scale(value, a) is not None), None)
        if below is None or only_reader(below, readers) is not value:
            return None, value
        scales.append((value, row_scale(value, below)))
        value = below
    return scales[::-1], value


def is_transpose(op):
    return isinstance(op, Transpose) and op.axes == (1, 0)


def apply(scales, value):
    for op, scale in scales:
        value = type(op)(value, scale)
    return value


class Chain:
    """top = node scales (aggregate (edge scales (gather (source scales (base)))))."""

    def __init__(self, **parts):
        self.__dict__.update(parts)

    @classmethod
    def match(cls, agg, readers):
        if only_reader(agg.args[0], readers) is not agg:
            return None
        edge_scales, gather = scales_downward(agg.args[0], readers,
                                              lambda op: isinstance(op, Gather))
        if edge_scales is None:
            return None
        source_scales, above, base = [], gather, gather.args[0]
        while only_reader(base, readers) is above and isinstance(base, SCALES):
            below = next((a for a in base.args if row_scale(base, a) is not None), None)
            if below is None:
                break
            source_scales.append((base, row_scale(base, below)))
            above, base = base, below
        node_scales, top = scales_upward(agg, readers)
        return cls(agg=agg, gather=gather, edge_scales=edge_scales,
                   source_scales=source_scales[::-1], base=base, base_reader=above,
                   node_scales=node_scales, top=top, readers=readers)

    def rewrite(self):
        """Moves the product to the other end of the chain if that narrows the edges."""
        return self.transform_first() or self.aggregate_first()

    def transform_first(self):
        """dot(top, W) -> chain(dot(base, W)) when W narrows the rows. Gradients that read
        top follow, so that top is no longer needed: dot(top^T, D) -> dot(base^T,
        chain^T(D)) (the gradient of W) and dot(B^T, top) -> dot(chain^T(B)^T, base) (the
        gradient of a product that was transformed first; chain^T(B) is then often the
        forward's own chain, which CSE merges)."""
        forward, rewrites = None, []
        for reader in self.readers.get(self.top, []):
            if isinstance(reader, Dot) and reader.args[0] is self.top and forward is None:
                forward = reader
            elif is_transpose(reader) and \
                    isinstance(only_reader(reader, self.readers), Dot) and \
                    only_reader(reader, self.readers).args[0] is reader:
                gradient = only_reader(reader, self.readers)
                rewrites.append((gradient, lambda g=gradient: Dot(
                    Transpose(self.base, (1, 0)), self.transposed(g.args[1]))))
            elif isinstance(reader, Dot) and reader.args[1] is self.top and \
                    is_transpose(reader.args[0]):
                rewrites.append((reader, lambda r=reader: Dot(
                    Transpose(self.transposed(r.args[0].args[0]), (1, 0)), self.base)))
            else:
                return False
        if forward is None or not self.narrows(forward.args[1]):
            return False
        weight = forward.args[1]
        if any(r.args[0].shape[0] >= weight.shape[0] for r, _ in rewrites
               if r.args[1] is self.top):
            return False        # the transposed chain would be no narrower
        forward.forward = self.rebuild(Dot(self.base, weight))
        for op, replacement in rewrites:
            op.forward = replacement()
        return True

    def aggregate_first(self):
        """chain(dot(x, W)) -> dot(chain(x), W)."""
        base = self.base
        if not (isinstance(base, Dot) and base.args[0].ndim == 2 and
                only_reader(base, self.readers) is self.base_reader and
                self.is_matrix(base.args[1]) and
                base.args[1].shape[1] > base.args[1].shape[0]):
            return False
        x, weight = base.args
        self.top.forward = Dot(self.rebuild(x), weight)
        return True

    def narrows(self, weight):
        return self.is_matrix(weight) and weight.shape[1] < weight.shape[0]

    @staticmethod
    def is_matrix(weight):
        return weight.ndim == 2 and weight.scope is None

    def rebuild(self, base):
        value = Gather(apply(self.source_scales, base), self.gather.graph, by=self.gather.by)
        value = Aggregate(apply(self.edge_scales, value), self.agg.graph, at=self.agg.at,
                          reduce=self.agg.reduce)
        return apply(self.node_scales, value)

    def transposed(self, delta):
        """chain^T applied to delta: every scale is diagonal, the aggregation's transpose
        is a gather at the same end and the gather's an aggregation (a mean divides by the
        degree before its transpose gathers)."""
        value = apply(self.node_scales, delta)
        if self.agg.reduce == "mean":
            value = value * self.agg.degree_scale()
        value = Gather(value, self.agg.graph, by=self.agg.at)
        value = Aggregate(apply(self.edge_scales, value), self.gather.graph,
                          at=self.gather.by, reduce="sum")
        return apply(self.source_scales, value)
