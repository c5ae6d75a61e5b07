"""An op with an attribute, defined the way docs/adding_an_op.md says: its attribute is
declared once, and identity (CSE), rebuilding (operation batching) and printing follow."""
import numpy as np
import pytest

import ngnn as ng
from ngnn.op_graph import Attr, UnaryOp, UndeclaredAttributeError
from ngnn.passes.cse import structural_key


class Scale(UnaryOp):
    """x * factor, with factor a compile-time number."""
    attributes = (Attr("factor"),)
    numpy = "np.multiply({x}, {factor!r}, out={out})"
    c = "({x} * {factor})"

    def __init__(self, x, factor, name=None):
        self.factor = float(factor)
        super().__init__(x, name=name)

    def adjoints(self, delta):
        return [delta * self.factor]


def test_cse_keeps_instances_with_different_attributes_apart(transformer_factory):
    x = ng.placeholder((3, 2), name="x")
    twice, thrice, twice_again = Scale(x, 2.0), Scale(x, 3.0), Scale(x, 2.0)
    assert structural_key(twice) != structural_key(thrice)
    assert structural_key(twice) == structural_key(twice_again)
    comp = transformer_factory().computation([twice, thrice, twice_again], x)
    value = np.arange(6, dtype=np.float32).reshape(3, 2)
    a, b, c = comp(value)
    np.testing.assert_allclose(a, 2 * value)
    np.testing.assert_allclose(b, 3 * value)
    np.testing.assert_allclose(c, 2 * value)
    assert "factor=2.0" in comp.ir and "factor=3.0" in comp.ir


def test_operation_batching_keeps_the_attribute(transformer_factory):
    g = ng.Graph.from_edges([0, 1, 2, 2], [1, 2, 0, 1], num_nodes=3)
    h = ng.placeholder((3, 2), name="h")
    with ng.zoomIn(g, node_feat={"h": h}) as v:
        rst = sum(Scale(n.h, 3.0) for n in v.innbs) + Scale(v.h, 0.5)
    out = ng.zoomOut(rst)
    comp = transformer_factory().computation(out, h)
    value = np.arange(6, dtype=np.float32).reshape(3, 2)
    expected = 0.5 * value
    np.add.at(expected, [1, 2, 0, 1], 3.0 * value[[0, 1, 2, 2]])
    np.testing.assert_allclose(comp(value), expected, rtol=1e-6)


@pytest.mark.parametrize("lead_shape", [(), (5,)])
def test_with_args_rebuilds_every_declared_attribute(lead_shape):
    x = ng.placeholder(lead_shape + (4, 6), name="x")
    local = ng.placeholder((4, 6), name="local")
    for op in [ng.sum(local, axis=1, keepdims=True), ng.transpose(local), local[1:3, ::-2],
               ng.reshape(local, (6, 4)), ng.leaky_relu(local, alpha=0.3),
               ng.concat([local, local], axis=1), ng.softmax(local, axis=0)]:
        rebuilt = op.with_args([x] * len(op.args), lead=len(lead_shape))
        assert type(rebuilt) is type(op)
        assert rebuilt.shape == lead_shape + op.shape
        assert structural_key(op.with_args(op.args)) == structural_key(op)


def test_an_unknown_batching_rule_is_refused():
    with pytest.raises(ValueError, match="batching must be one of"):
        Attr("factor", batching="sideways")


def test_an_undeclared_constructor_value_is_refused_when_the_class_is_defined():
    with pytest.raises(UndeclaredAttributeError, match=r"self\.factor .*Attr\('factor'\)"):
        class UndeclaredScale(UnaryOp):
            numpy = "np.multiply({x}, {factor!r}, out={out})"

            def __init__(self, x, factor=2.0, name=None):
                self.factor = float(factor)
                super().__init__(x, name=name)


def test_a_declared_attribute_the_constructor_cannot_take_back_is_refused():
    with pytest.raises(UndeclaredAttributeError, match="no parameter 'scale'"):
        class Misnamed(UnaryOp):
            attributes = (Attr("factor", param="scale"),)

            def __init__(self, x, factor=2.0, name=None):
                self.factor = float(factor)
                super().__init__(x, name=name)


def test_a_value_computed_from_declared_attributes_may_be_named_derived():
    class Halved(UnaryOp):
        attributes = (Attr("factor"),)
        derived = ("half",)
        numpy = "np.multiply({x}, {factor!r} / 2, out={out})"

        def __init__(self, x, factor, name=None):
            self.factor = float(factor)
            self.half = self.factor / 2
            super().__init__(x, name=name)

    x = ng.placeholder((2,), name="x")
    assert Halved(x, 3.0).with_args([x]).half == 1.5
