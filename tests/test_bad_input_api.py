"""Bad input at the API surface: transformer options, custom passes, set_variable, computed
class ids, compiler-made constants, Trainer masks. Each gives a clear error naming the problem
(or the right answer) on every backend."""
import dataclasses
import re

import numpy as np
import pytest

import ngnn as ng
from ngnn import ShapeError, datasets, nn
from ngnn import transformers as ngt
from ngnn.op_graph import Add, Multiply
from ngnn.passes import GraphPass, PeepholeGraphPass
from ngnn.train import Trainer, accuracy


# ---- wrong answers, class 4: misspelled options -----------------------------------------------

@pytest.mark.parametrize("typo, suggestion", [
    ("fusoin", "fusion"), ("optimise", "optimize"), ("debug_nan", "debug_nans"),
    ("check_finit", "check_finite"), ("recomputed", "recompute"),
    ("max_recomputes", "max_recompute"), ("pass", "passes"), ("debugnans", "debug_nans"),
])
def test_misspelled_options_raise_and_suggest(transformer_factory, typo, suggestion):
    with pytest.raises(TypeError, match=rf"unknown option {typo!r} \(did you mean "
                                        rf"{suggestion!r}\?\); valid options: .*fusion"):
        transformer_factory(**{typo: False})


def test_an_unrelated_option_lists_the_valid_ones(transformer_factory):
    with pytest.raises(TypeError, match=r"unknown option 'colour'; valid options: "
                                        r"aggregate_transform_order, check_finite, chunks, debug_nans"):
        transformer_factory(colour="red")


def test_backend_specific_options_are_known_to_their_backend():
    ngt.make_transformer("numpy", fusion_block_bytes=1 << 16).close()
    with pytest.raises(TypeError, match="did you mean 'fusion_block_bytes'"):
        ngt.make_transformer("numpy", fusion_block_byte=1 << 16)


@pytest.mark.parametrize("name, suggestion", [("nmupy", "numpy"), ("GPU", "gpu"), ("gpus", "gpu")])
def test_a_misspelled_transformer_name_suggests_the_closest(name, suggestion):
    with pytest.raises(ValueError, match=rf"unknown transformer {name!r} \(did you mean "
                                         rf"{suggestion!r}\?\)"):
        ngt.make_transformer(name)


@pytest.mark.parametrize("bad", [-1, 1.5, "4"])
def test_max_recompute_must_be_a_non_negative_int(transformer_factory, bad):
    with pytest.raises(ValueError, match=r"max_recompute must be a non-negative int"):
        transformer_factory(max_recompute=bad)


# ---- custom passes --------------------------------------------------------------------------

class DropAddZero(PeepholeGraphPass):
    @visit.on_type(Add)          # noqa: F821 - `visit` is put in the class body by PassType
    def visit(self, op):
        x, y = op.args
        if y.is_scalar and y.is_constant and y.const == 0:
            self.replace_op(op, x)


def not_a_pass(computation):
    return computation


@pytest.mark.parametrize("bad, message", [
    (DropAddZero, r"got the class DropAddZero; give an instance, DropAddZero\(\)"),
    (not_a_pass, r"<function not_a_pass.*is not a pass"),
    ("CSE", r"'CSE' is not a pass"),
    (42, r"42 is not a pass"),
    (None, r"None is not a pass"),
])
def test_passes_that_are_not_pass_objects(transformer_factory, bad, message):
    with pytest.raises(TypeError, match=message):
        transformer_factory(passes=[bad])


def test_a_single_pass_instead_of_a_list_is_accepted(transformer_factory):
    x = ng.placeholder((3,), name="x")
    comp = transformer_factory(passes=DropAddZero()).computation(x + 0.0, x)
    assert "Add" not in comp.ir
    np.testing.assert_array_equal(comp(np.ones(3, np.float32)), np.ones(3))


def test_visit_works_in_a_pass_defined_inside_a_function(transformer_factory):
    class DropMultiplyOne(PeepholeGraphPass):     # `visit` not imported here
        @visit.on_type(Multiply)     # noqa: F821
        def visit(self, op):
            x, y = op.args
            if y.is_scalar and y.is_constant and y.const == 1:
                self.replace_op(op, x)

    class Subclass(DropMultiplyOne):
        """Keeps its parent's visit methods."""

    x = ng.placeholder((3,), name="x")
    for pass_class in (DropMultiplyOne, Subclass):
        comp = transformer_factory(passes=[pass_class()]).computation(x * 1.0, x)
        assert "Multiply" not in comp.ir
        np.testing.assert_array_equal(comp(np.arange(3, dtype=np.float32)), [0, 1, 2])


class ForwardToOtherShape(GraphPass):
    def do_pass(self, computation):
        for op in ng.op_graph.ordered_ops(computation.results):
            if isinstance(op, Add):
                op.forward = ng.placeholder((7,), name="other")


class ForwardToOtherDtype(GraphPass):
    def do_pass(self, computation):
        for op in ng.op_graph.ordered_ops(computation.results):
            if isinstance(op, Add):
                op.forward = ng.placeholder(op.shape, dtype=np.int32, name="other")


class ForwardToNumber(GraphPass):
    def do_pass(self, computation):
        for op in ng.op_graph.ordered_ops(computation.results):
            if isinstance(op, Add):
                op.forward = 3.0


@pytest.mark.parametrize("bad_pass, error, message", [
    (ForwardToOtherShape, ShapeError, r"cannot replace <Add \[3\] float32> by "
                                      r"<Placeholder 'other' \[7\] float32>.*same shape"),
    (ForwardToOtherDtype, ShapeError, r"<Placeholder 'other' \[3\] int32>.*same shape and dtype"),
    (ForwardToNumber, TypeError, r"forward must be an ngnn op, got 3.0"),
])
def test_a_pass_forwarding_to_a_wrong_op(transformer_factory, bad_pass, error, message):
    x = ng.placeholder((3,), name="x")
    comp = transformer_factory(passes=[bad_pass()]).computation(ng.exp(x + 1.0), x)
    with pytest.raises(error, match=message):
        comp(np.ones(3, np.float32))


# ---- set_variable -----------------------------------------------------------------------------

@pytest.fixture
def weights(transformer_factory):
    x = ng.placeholder((2, 3), name="x")
    w = ng.variable((3, 4), initial_value=0.5, name="weights")
    t = transformer_factory()
    comp = t.computation(ng.dot(x, w), x)
    return t, w, comp


@pytest.mark.parametrize("shape", [(4, 3), (3,), (3, 4, 1), (12,), (1, 4)])
def test_set_variable_with_the_wrong_shape_names_the_variable(weights, shape):
    t, w, _ = weights
    with pytest.raises(ValueError, match=rf"variable 'weights' has shape \(3, 4\), got a value "
                                         rf"of shape {re.escape(str(shape))}"):
        t.set_variable(w, np.zeros(shape))


def test_set_variable_with_strings(weights):
    t, w, _ = weights
    with pytest.raises(TypeError, match=r"variable 'weights' holds float32 numbers, got a value "
                                        r"of dtype <U1"):
        t.set_variable(w, np.full((3, 4), "a"))


def test_set_variable_of_a_placeholder(weights):
    t, _, _ = weights
    with pytest.raises(TypeError, match="expected an ngnn variable, got <Placeholder"):
        t.set_variable(ng.placeholder((3, 4), name="p"), np.zeros((3, 4)))


def test_set_variable_of_an_unused_variable(weights):
    t, _, _ = weights
    other = ng.variable((3, 4), name="unused")
    with pytest.raises(KeyError, match="variable 'unused' is not used by any computation"):
        t.set_variable(other, np.zeros((3, 4)))


def test_set_variable_with_a_scalar_or_the_right_shape(weights):
    t, w, comp = weights
    t.set_variable(w, 2.0)
    np.testing.assert_array_equal(comp(np.ones((2, 3), np.float32)), np.full((2, 4), 6.0))
    t.set_variable(w, np.ones((3, 4)))
    np.testing.assert_array_equal(comp(np.ones((2, 3), np.float32)), np.full((2, 4), 3.0))


# ---- wrong answers, class 3: class ids computed in the graph ------------------------------------

LOGITS = np.zeros((3, 4), np.float32)


@pytest.mark.parametrize("make_labels, labels, bad", [
    (lambda y: y - 1, [1, 2, 0], -1),
    (lambda y: y + 1, [0, 3, 1], 4),
    (lambda y: y * 2, [0, 1, 2], 4),
    (lambda y: ng.cast(ng.cast(y, np.float32) * 3.0, np.int64), [0, 1, 2], 6),
])
def test_computed_labels_out_of_range(transformer_factory, make_labels, labels, bad):
    logits = ng.placeholder((3, 4), name="logits")
    y = ng.placeholder((3,), dtype=np.int64, name="labels")
    comp = transformer_factory().computation(ng.cross_entropy(logits, make_labels(y)), logits, y)
    with pytest.raises(ValueError, match=rf"class id {bad} is outside \[0, 4\)"):
        comp(LOGITS, np.array(labels))


def test_computed_labels_in_range_give_the_loss(transformer_factory):
    logits = ng.placeholder((3, 4), name="logits")
    y = ng.placeholder((3,), dtype=np.int64, name="labels")
    comp = transformer_factory().computation(ng.cross_entropy(logits, y - 1), logits, y)
    np.testing.assert_allclose(comp(LOGITS, np.array([1, 2, 4])), np.log(4), rtol=1e-6)


def test_out_of_range_labels_leave_variables_unchanged(transformer_factory):
    logits = ng.placeholder((3, 4), name="logits")
    y = ng.placeholder((3,), dtype=np.int64, name="labels")
    w = ng.variable((4,), initial_value=1.0, name="w")
    loss = ng.cross_entropy(logits * w, y - 1)
    t = transformer_factory()
    step = t.computation([loss, ng.assign(w, w - ng.grad(loss, w))], logits, y)
    with pytest.raises(ValueError, match="class id 4 is outside"):
        step(LOGITS + 1.0, np.array([1, 2, 5]))
    np.testing.assert_array_equal(t.variable_value(w), np.ones(4))


@pytest.mark.parametrize("labels, bad", [([0, 5, 1], 5), ([-2, 0, 1], -2)])
def test_one_hot_of_computed_ids(transformer_factory, labels, bad):
    y = ng.placeholder((3,), dtype=np.int64, name="labels")
    comp = transformer_factory().computation(ng.one_hot(y * 1, 4), y)
    with pytest.raises(ValueError, match=rf"class id {bad} is outside \[0, 4\)"):
        comp(np.array(labels))


# ---- wrong answers, class 5: compiler-made constants keep the dtype they meet ------------------

def test_mean_aggregation_gradient_in_float64_is_exact(transformer_factory):
    g = ng.Graph.from_edges([0, 1, 2, 2, 0, 1], [1, 2, 0, 1, 2, 2], num_nodes=3)
    h = ng.placeholder((3, 2), dtype=np.float64, name="h")
    with ng.zoomIn(g, node_feat={"h": h}) as v:
        r = ng.mean([n.h for n in v.innbs])
    loss = ng.sum(ng.zoomOut(r) * np.arange(6, dtype=np.float64).reshape(3, 2))
    dh = ng.grad(loss, h)
    assert dh.dtype == np.float64
    got = transformer_factory().computation(dh, h)(np.ones((3, 2)))
    weight = np.arange(6, dtype=np.float64).reshape(3, 2)
    indegree = np.array([1, 2, 3], np.float64)
    expected = np.zeros((3, 2))
    for s, d in zip([0, 1, 2, 2, 0, 1], [1, 2, 0, 1, 2, 2]):
        expected[s] += weight[d] / indegree[d]
    np.testing.assert_allclose(got, expected, rtol=1e-15, atol=0)


def test_degree_scale_carries_the_aggregation_dtype():
    g = ng.Graph.from_edges([0, 1, 2], [1, 2, 1], num_nodes=3)
    for dtype in (np.float32, np.float64):
        agg = ng.aggregate(ng.placeholder((3, 2), dtype=dtype), g, reduce="mean")
        assert agg.degree_scale().dtype == dtype


# ---- Trainer masks ------------------------------------------------------------------------------

@pytest.fixture
def tiny():
    return datasets.synthetic("sbm", 300, 4.0, 8, 3, seed=0)


def test_trainer_with_an_empty_train_mask_names_it(tiny):
    # An empty val_mask trains without early stopping (tests/test_training.py).
    tiny = dataclasses.replace(tiny, train_mask=np.zeros(tiny.num_nodes, bool))
    model = nn.GCN(tiny.num_features, 4, tiny.num_classes, seed=0)
    with pytest.raises(ValueError, match=r"the dataset's train_mask selects no rows"):
        Trainer(model, tiny)


def test_trainer_with_a_mask_of_the_wrong_length(tiny):
    tiny = dataclasses.replace(tiny, val_mask=np.ones(tiny.num_nodes - 1, bool))
    model = nn.GCN(tiny.num_features, 4, tiny.num_classes, seed=0)
    with pytest.raises(ValueError, match=r"val_mask has shape \(299,\), expected \(300,\)"):
        Trainer(model, tiny)


def test_evaluate_with_an_empty_test_mask_names_it(tiny):
    tiny = dataclasses.replace(tiny, test_mask=np.zeros(tiny.num_nodes, bool))
    trainer = Trainer(nn.GCN(tiny.num_features, 4, tiny.num_classes, seed=0), tiny)
    with pytest.raises(ValueError, match="accuracy: the test_mask selects no rows"):
        trainer.evaluate()
    trainer.transformer.close()


def test_accuracy_names_the_mask():
    with pytest.raises(ValueError, match="the val_mask selects no rows"):
        accuracy(np.zeros((2, 2)), np.zeros(2), np.zeros(2, bool), "val_mask")
