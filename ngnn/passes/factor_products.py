"""FactorProducts: dot(A, B) + dot(A, C) -> dot(A, B + C), one matrix product instead of two.

Reverse-mode gradients produce such sums wherever one weight is used twice: GATConv
applies `fc` to a vertex and to its neighbours, so the gradient of `fc` arrives as
X^T D_1 + X^T D_2, two products over every vertex, where one over D_1 + D_2 does. The
same holds with the shared operand on the right. A product is factored only where the
sum is its one reader, so nothing is computed twice.
"""
from ..op_graph import Add, Dot, ordered_ops
from .base import RewritePass


class FactorProducts(RewritePass):
    def rewrite_one(self, computation):
        ops = ordered_ops(computation.results)
        readers = {}
        for op in ops:
            for a in op.args:
                readers.setdefault(a, set()).add(op)
        results = set(computation.results)

        def only_for(product, add):
            return isinstance(product, Dot) and readers[product] == {add} and \
                product not in results and product.ndim == 2 and \
                all(a.ndim == 2 for a in product.args)

        for add in ops:
            if not isinstance(add, Add) or add.args[0] is add.args[1]:
                continue
            p, q = add.args
            if not (only_for(p, add) and only_for(q, add)) or p.shape != add.shape:
                continue
            (a, b), (c, d) = p.args, q.args
            if a is c and b.shape == d.shape:
                add.forward = Dot(a, Add(b, d))
                return True
            if b is d and a.shape == c.shape:
                add.forward = Dot(Add(a, c), b)
                return True
        return False
