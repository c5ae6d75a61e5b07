"""Pass framework: GraphPass, and PeepholeGraphPass with per-op-type visit methods.

A peephole pass is written as methods decorated with `@visit.on_type(OpClass)`
(ngnn.dispatch): a visit method for a base op class also sees its subclasses, and a
subclass pass keeps its parent's visit methods. Replacements go through the ops'
forwarding pointers.
"""
from ..dispatch import TypeDispatch, TypeDispatched, on_type
from ..op_graph import Broadcast, Cast, ShapeError, ordered_ops


class GraphPass:
    """Transforms the graph reachable from a computation's results."""

    name = None

    def do_pass(self, computation):
        raise TypeError(f"{type(self).__name__} must implement do_pass(computation)")

    def __repr__(self):
        return type(self).__name__


class RewritePass(GraphPass):
    """Applies `rewrite_one(computation)`, one rewrite of the graph or False when there is
    none left, at most `max_rounds` times."""

    max_rounds = 20

    def do_pass(self, computation):
        for _ in range(self.max_rounds):
            if not self.rewrite_one(computation):
                return

    def rewrite_one(self, computation):
        raise TypeError(f"{type(self).__name__} must implement rewrite_one(computation)")


visit = on_type


class PassType(type):
    """Puts `visit` in every peephole pass's class body. A class body resolves a name it
    also assigns (`visit`, rebound by each decorated method) in its own namespace and then
    in the module's globals, never in an enclosing function's locals, so
    `from ngnn.passes import visit` inside a function would not reach `@visit.on_type`.
    Preparing the namespace makes API.md's example work wherever it is written."""

    @classmethod
    def __prepare__(mcs, name, bases, **kwargs):
        return {"visit": visit}

    def __new__(mcs, name, bases, namespace, **kwargs):
        if namespace.get("visit") is visit:
            del namespace["visit"]        # no visit methods here: keep the parent's
        return super().__new__(mcs, name, bases, dict(namespace), **kwargs)


class PeepholeGraphPass(GraphPass, TypeDispatched, metaclass=PassType):
    """Visits every op (arguments first) and replaces ops, until nothing changes."""

    max_rounds = 50

    def do_pass(self, computation):
        for _ in range(self.max_rounds):
            self.replaced = False
            for op in ordered_ops(computation.results):
                if op.forward is not None:
                    continue        # replaced earlier in this round
                table = getattr(type(self), "visit", None)
                method = table.lookup(type(op)) if isinstance(table, TypeDispatch) else None
                if method is not None:
                    method(self, op)
            if not self.replaced:
                return
        raise RuntimeError(f"{type(self).__name__} did not reach a fixpoint in "
                           f"{self.max_rounds} rounds")

    def replace_op(self, op, replacement):
        """Forward `op` to `replacement`, broadcast and cast to keep op's shape and dtype."""
        replacement = replacement.forwarded
        if replacement is op:
            return
        if replacement.shape != op.shape:
            try:
                replacement = Broadcast(replacement, op.shape)
            except ShapeError:
                raise ShapeError(f"{type(self).__name__}: cannot replace {op} by "
                                 f"{replacement}: shapes differ") from None
        if replacement.dtype != op.dtype:
            replacement = Cast(replacement, op.dtype)
        op.forward = replacement
        self.replaced = True
