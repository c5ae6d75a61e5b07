"""The pass framework (custom peephole passes, dispatch along the op class hierarchy) and
the built-in SimplePrune, CSE and BufferSharing, checked on the IR they leave, plus random
expression graphs that must give the same values with and without optimization."""
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ngnn as ng
from ngnn import transformers as ngt
from ngnn.op_graph import Add, ElementWise, Exp, Multiply
from ngnn.passes import PeepholeGraphPass, visit


def ir_ops(ir):
    """Operator names in the IR text, one per line that defines a value."""
    return re.findall(r"= (?:\w+::)?(\w+)\(", ir)


# ---- custom passes ---------------------------------------------------------------------------

class AddToMultiply(PeepholeGraphPass):
    @visit.on_type(Add)
    def visit(self, op):
        self.replace_op(op, Multiply(*op.args))


def test_custom_pass_changes_the_computation(transformer_factory):
    x, y = ng.placeholder((3,), name="x"), ng.placeholder((3,), name="y")
    comp = transformer_factory(passes=[AddToMultiply()]).computation(x + y, x, y)
    a, b = np.array([1.0, 2.0, 3.0], np.float32), np.array([4.0, 5.0, 6.0], np.float32)
    np.testing.assert_array_equal(comp(a, b), a * b)
    assert "add" not in ir_ops(comp.ir) and "multiply" in ir_ops(comp.ir)
    assert "add" in ir_ops(comp.ir_after("CSE"))      # user passes run after the built-ins


class RecordElementWise(PeepholeGraphPass):
    """Records the element-wise ops it sees (a visit method for a base class)."""

    def __init__(self):
        self.seen = []

    @visit.on_type(ElementWise)
    def visit(self, op):
        self.seen.append(type(op))


class RecordAndDropAdds(RecordElementWise):
    """A subclass adds a method for Add; it keeps its parent's method for the rest."""

    @visit.on_type(Add)
    def visit(self, op):
        self.seen.append("add")
        self.replace_op(op, op.args[0])


def test_visit_on_a_base_class_sees_subclasses(transformer_factory):
    record = RecordElementWise()
    x = ng.placeholder((2,), name="x")
    transformer_factory(passes=[record]).computation(ng.exp(x) * 2.0, x).transform()
    assert Exp in record.seen and Multiply in record.seen


def test_subclass_pass_keeps_the_parents_visit_methods(transformer_factory):
    record = RecordAndDropAdds()
    x = ng.placeholder((2,), name="x")
    comp = transformer_factory(passes=[record]).computation(ng.exp(x) + 1.0, x)
    np.testing.assert_allclose(comp(np.array([0.0, 1.0], np.float32)), np.exp([0.0, 1.0]),
                               rtol=1e-6)
    assert "add" in record.seen and Exp in record.seen and Add not in record.seen
    # The parent class is unchanged by its subclass's registration.
    parent = RecordElementWise()
    y = ng.placeholder((2,), name="y")
    transformer_factory(passes=[parent]).computation(y + 1.0, y).transform()
    assert parent.seen == [Add]


def test_a_pass_that_never_settles_is_an_error(transformer_factory):
    class Flip(PeepholeGraphPass):
        @visit.on_type(Exp)
        def visit(self, op):
            self.replace_op(op, Exp(op.args[0]))

    x = ng.placeholder((2,), name="x")
    comp = transformer_factory(passes=[Flip()]).computation(ng.exp(x), x)
    with pytest.raises(RuntimeError, match="Flip did not reach a fixpoint"):
        comp.transform()


# ---- SimplePrune -----------------------------------------------------------------------------

@pytest.mark.parametrize("build, gone, expected", [
    (lambda x: x + 0.0, "add", lambda a: a),
    (lambda x: 0.0 + x, "add", lambda a: a),
    (lambda x: x * 1.0, "multiply", lambda a: a),
    (lambda x: 1.0 * x, "multiply", lambda a: a),
    (lambda x: x * 0.0, "multiply", lambda a: 0 * a),
    (lambda x: x - 0.0, "subtract", lambda a: a),
    (lambda x: 0.0 - x, "subtract", lambda a: -a),
    (lambda x: x / 1.0, "divide", lambda a: a),
    (lambda x: -(-x), "negative", lambda a: a),
    (lambda x: (x * 1.0 + 0.0) / 1.0 - 0.0, "add", lambda a: a),
], ids=["x+0", "0+x", "x*1", "1*x", "x*0", "x-0", "0-x", "x/1", "--x", "chain"])
def test_simple_prune_identities(transformer_factory, build, gone, expected):
    x = ng.placeholder((2, 3), name="x")
    comp = transformer_factory().computation(build(x), x)
    assert gone in ir_ops(comp.ir_after("Trace"))
    assert gone not in ir_ops(comp.ir_after("SimplePrune"))
    a = np.arange(6, dtype=np.float32).reshape(2, 3) - 2
    np.testing.assert_array_equal(comp(a), expected(a))


def test_simple_prune_sees_broadcast_constants(transformer_factory):
    x = ng.placeholder((2, 3), name="x")
    ones = ng.constant(np.ones((2, 3)))
    comp = transformer_factory().computation(x * ones, x)
    assert ir_ops(comp.ir) == []


def test_constant_subgraphs_are_folded(transformer_factory):
    x = ng.placeholder((3,), name="x")
    c = ng.constant(2.0) * ng.constant(3.0) + ng.exp(ng.constant(0.0))
    table = ng.sum(ng.constant(np.arange(12.0).reshape(3, 4)), axis=1)
    comp = transformer_factory().computation(x * c + table, x)
    ops = ir_ops(comp.ir)
    assert sorted(ops) == ["add", "constant", "constant", "multiply"]
    assert "value=7.0" in comp.ir
    np.testing.assert_allclose(comp(np.ones(3, np.float32)), 7 + np.arange(12.0).reshape(3, 4)
                               .sum(axis=1))


def test_stateful_ops_are_not_folded(transformer_factory):
    v = ng.variable((2,), initial_value=1.0, name="v")
    comp = transformer_factory().computation(ng.dropout(ng.constant(np.ones(2)), 0.5) + v)
    assert "dropout" in ir_ops(comp.ir)


# ---- CSE -------------------------------------------------------------------------------------

def test_cse_merges_equal_subexpressions(transformer_factory):
    x = ng.placeholder((4,), name="x")
    comp = transformer_factory().computation(ng.exp(x) + ng.exp(x), x)
    assert ir_ops(comp.ir_after("Trace")).count("exp") == 2
    assert ir_ops(comp.ir).count("exp") == 1
    a = np.linspace(-1, 1, 4).astype(np.float32)
    np.testing.assert_allclose(comp(a), 2 * np.exp(a), rtol=1e-6)


def test_cse_merges_whole_chains_but_respects_attributes(transformer_factory):
    x = ng.placeholder((3, 4), name="x")
    y = ng.sum(ng.tanh(x * 2.0), axis=0) + ng.sum(ng.tanh(x * 2.0), axis=0) + \
        ng.sum(ng.tanh(x * 2.0), axis=1, keepdims=True)
    # After CSE: the GPU's kernel plan then computes the one tanh in each sum's kernel.
    ops = ir_ops(transformer_factory().computation(y, x).ir_after("CSE"))
    assert ops.count("tanh") == 1 and ops.count("multiply") == 1 and ops.count("sum") == 2


def test_cse_keeps_random_masks_apart(transformer_factory):
    x = ng.placeholder((4,), name="x")
    comp = transformer_factory().computation(ng.dropout(x, 0.5) + ng.dropout(x, 0.5), x)
    assert ir_ops(comp.ir).count("dropout") == 2


# ---- BufferSharing ---------------------------------------------------------------------------

def test_buffer_sharing_on_a_long_element_wise_chain(transformer_factory):
    n = 1_000_000
    x = ng.placeholder((n,), name="x")
    steps = [ng.tanh, lambda v: v * 1.5, lambda v: v + 0.25, ng.sigmoid, ng.exp]
    y = x
    for i in range(20):
        y = steps[i % len(steps)](y)
    comp = transformer_factory().computation(y, x)
    assert comp.memory_plan.peak_bytes <= 4 * n * 4
    a = np.linspace(-2, 2, n, dtype=np.float32)
    expected = a.astype(np.float64)
    for i in range(20):
        expected = [np.tanh, lambda v: v * 1.5, lambda v: v + 0.25,
                    lambda v: 1 / (1 + np.exp(-v)), np.exp][i % 5](expected)
    np.testing.assert_allclose(comp(a), expected, rtol=1e-5)


def test_buffers_are_not_shared_while_values_are_live(transformer_factory):
    # Every intermediate stays live until the final sum: nothing may be overwritten early.
    x = ng.placeholder((1000,), name="x")
    parts = [ng.exp(x * float(i)) for i in range(1, 6)]
    total = parts[0]
    for p in parts[1:]:
        total = total + p * p
    comp = transformer_factory().computation([total, parts[0]], x)
    a = np.linspace(-0.5, 0.5, 1000).astype(np.float32)
    ex = [np.exp(a * i) for i in range(1, 6)]
    got_total, got_first = comp(a)
    np.testing.assert_allclose(got_total, ex[0] + sum(e * e for e in ex[1:]), rtol=1e-5)
    np.testing.assert_allclose(got_first, ex[0], rtol=1e-6)


def test_memory_plan_prints(transformer_factory):
    x = ng.placeholder((10,), name="x")
    comp = transformer_factory().computation(ng.exp(x) * 2.0, x)
    assert "bytes" in str(comp.memory_plan)


# ---- random expression graphs: optimized == unoptimized == NumPy ------------------------------

A_SHAPE, B_SHAPE = (3, 4), (4,)


class Builder:
    """Interprets a program (a list of instructions over earlier values) either as ngnn ops
    or as NumPy float64 arrays. Every op maps values of magnitude about 1 to values of
    magnitude about 1, so no random program overflows."""

    def __init__(self, lib):
        self.lib = lib          # ng or np

    def full(self, v):
        """v broadcast to (3, 4)."""
        return v * self.const(np.ones(A_SHAPE))

    def const(self, value):
        value = np.asarray(value, dtype=np.float64)
        return ng.constant(value, dtype=np.float64) if self.lib is ng else value

    def apply(self, name, args):
        L, ng_ = self.lib, self.lib is ng
        a = args[0]
        b = args[1] if len(args) > 1 else None
        unary = {
            "tanh": lambda: L.tanh(a),
            "sigmoid": lambda: ng.sigmoid(a) if ng_ else 1 / (1 + np.exp(-a)),
            "relu": lambda: ng.relu(a) if ng_ else np.maximum(a, 0),
            "abs": lambda: L.abs(a),
            "neg": lambda: -a,
            "exp": lambda: L.exp(a) * 0.5,
            "plus_zero": lambda: a + 0.0,
            "times_one": lambda: 1.0 * a,
            "minus_zero": lambda: a - 0.0,
            "div_one": lambda: a / 1.0,
            "negneg": lambda: -(-a),
            "sum0": lambda: L.sum(self.full(a), axis=0, keepdims=True) * 0.25,
            "mean1": lambda: L.mean(self.full(a), axis=1, keepdims=True),
            "max0": lambda: L.max(self.full(a), axis=0, keepdims=True),
            "sum_all": lambda: L.sum(a) * (1.0 / 12),
            "softmax": lambda: (ng.softmax(self.full(a)) if ng_ else
                                np.exp(self.full(a)) / np.exp(self.full(a)).sum(-1, keepdims=True)),
            "transpose2": lambda: L.transpose(L.transpose(self.full(a))),
        }
        binary = {
            "add": lambda: (a + b) * 0.5,
            "sub": lambda: (a - b) * 0.5,
            "mul": lambda: a * b,
            "maximum": lambda: L.maximum(a, b),
            "minimum": lambda: L.minimum(a, b),
            "times_zero_plus": lambda: a * 0.0 + b,
            "gram": lambda: L.dot(self.full(a), L.transpose(self.full(b))) * (1.0 / 4),
        }
        if name in unary:
            return unary[name]()
        if name == "gram":     # (3, 3) would leave the closed set of shapes: fold back
            return L.sum(binary[name](), axis=1, keepdims=True) * (1.0 / 3)
        return binary[name]()

    def run(self, program, inputs):
        values = list(inputs)
        for name, picks in program:
            values.append(self.apply(name, [values[i % len(values)] for i in picks]))
        return values


UNARY_OPS = ["tanh", "sigmoid", "relu", "abs", "neg", "exp", "plus_zero", "times_one",
             "minus_zero", "div_one", "negneg", "sum0", "mean1", "max0", "sum_all", "softmax",
             "transpose2"]
BINARY_OPS = ["add", "sub", "mul", "maximum", "minimum", "times_zero_plus", "gram"]

instruction = st.one_of(
    st.tuples(st.sampled_from(UNARY_OPS), st.tuples(st.integers(0, 30))),
    st.tuples(st.sampled_from(BINARY_OPS), st.tuples(st.integers(0, 30), st.integers(0, 30))))
programs = st.lists(instruction, min_size=1, max_size=12)


def build_graph(program):
    """Fresh ops every time: passes rewrite the graph they run on, so the optimized and the
    unoptimized computation must not share ops."""
    a = ng.placeholder(A_SHAPE, dtype=np.float64, name="a")
    b = ng.placeholder(B_SHAPE, dtype=np.float64, name="b")
    values = Builder(ng).run(program, [a, b])
    # The last value, a duplicate of it (for CSE), and every value's sum.
    result = values[-1] + Builder(ng).run(program, [a, b])[-1]
    total = ng.sum(ng.concat([ng.reshape(Builder(ng).full(v), (12,)) for v in values], axis=0))
    return [a, b], [result, total] + ng.grad(total, [a, b])


# NumPy only: the passes do not depend on the backend, and every random graph would cost
# the GPU transformer a fresh kernel compilation (minutes for 30 examples on PoCL).
@settings(max_examples=30, deadline=None)
@given(program=programs, seed=st.integers(0, 2 ** 16))
def test_random_graphs_agree_with_and_without_optimization(program, seed):
    rng = np.random.default_rng(seed)
    inputs = [rng.uniform(-1, 1, A_SHAPE), rng.uniform(-1, 1, B_SHAPE)]
    outs = []
    for options in ({}, {"optimize": False, "fusion": False}):
        params, results = build_graph(program)
        with ngt.make_transformer("numpy", **options) as t:
            outs.append(t.computation(results, *params)(*inputs))
    reference = Builder(np).run(program, inputs)
    expected_total = sum(np.broadcast_to(v, A_SHAPE).sum() for v in reference)
    np.testing.assert_allclose(outs[0][0], 2 * reference[-1], rtol=1e-9, atol=1e-12)
    # the values' sum may cancel to zero, where summing in another order leaves 1e-16s
    np.testing.assert_allclose(outs[0][1], expected_total, rtol=1e-9, atol=1e-12)
    for optimized, plain in zip(outs[0], outs[1]):
        np.testing.assert_allclose(optimized, plain, rtol=1e-9, atol=1e-12)
