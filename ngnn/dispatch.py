"""Methods dispatched on the type of their op argument, declared with `@x.on_type(T)`.

    class MyPass(PeepholeGraphPass):
        @visit.on_type(Add)
        def visit(self, op): ...
        @visit.on_type(Multiply)
        def visit(self, op): ...

Each `@visit.on_type` adds to one TypeDispatch, which multipledispatch resolves along
the op's class hierarchy; a subclass's TypeDispatch starts from its parent's entries, so
it keeps the parent's methods and may override them.
"""
import functools

from multipledispatch import Dispatcher


class TypeDispatch:
    def __init__(self):
        self.entries = []
        self._dispatcher = None

    def on_type(self, op_type):
        def register(method):
            self.entries.append((op_type, method))
            self._dispatcher = None
            return self
        return register

    def lookup(self, op_type):
        """The method for `op_type` (or its nearest registered base class), or None."""
        if self._dispatcher is None:
            self._dispatcher = Dispatcher("on_type")
            for registered_type, method in self.entries:
                self._dispatcher.add((registered_type,), method)
        return self._dispatcher.dispatch(op_type)

    def __get__(self, instance, owner):
        return self if instance is None else functools.partial(self._call, instance)

    def _call(self, instance, op, *args, **kwargs):
        method = self.lookup(type(op))
        if method is None:
            raise TypeError(f"{type(instance).__name__} has no method for "
                            f"{type(op).__name__}")
        return method(instance, op, *args, **kwargs)


class _OnType:
    def on_type(self, op_type):
        return TypeDispatch().on_type(op_type)


on_type = _OnType()


class TypeDispatched:
    """Base class whose TypeDispatch attributes inherit their parents' entries."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        for name, table in list(vars(cls).items()):
            if not isinstance(table, TypeDispatch):
                continue
            parent = next((vars(base)[name] for base in cls.__mro__[1:]
                           if isinstance(vars(base).get(name), TypeDispatch)), None)
            if parent is not None:
                table.entries = parent.entries + table.entries
                table._dispatcher = None
