"""Bad input gets a clear error naming the problem, never a wrong answer."""
import re

import numpy as np
import pytest

import ngnn as ng
from ngnn import ShapeError


@pytest.fixture
def affine(transformer_factory):
    x = ng.placeholder((4, 3), name="features")
    labels = ng.placeholder((4,), dtype=np.int64, name="labels")
    w = ng.variable((3, 2), initial_value=0.1, name="w")
    loss = ng.cross_entropy(ng.dot(x, w), labels)
    return transformer_factory().computation(loss, x, labels)


GOOD_X = np.zeros((4, 3), np.float32)
GOOD_LABELS = np.array([0, 1, 1, 0])


def test_good_arguments_run(affine):
    assert np.isfinite(affine(GOOD_X, GOOD_LABELS))


def test_wrong_shape_names_the_parameter_and_both_shapes(affine):
    with pytest.raises(ValueError, match=r"'features'.*\(4, 3\).*\(3, 4\)"):
        affine(np.zeros((3, 4), np.float32), GOOD_LABELS)
    with pytest.raises(ValueError, match=r"'labels'.*\(4,\).*\(4, 1\)"):
        affine(GOOD_X, GOOD_LABELS.reshape(4, 1))


def test_a_scalar_for_a_tensor_names_the_parameter(affine):
    with pytest.raises(ValueError, match="'features'"):
        affine(1.0, GOOD_LABELS)


def test_bool_array_for_a_float_placeholder(affine):
    with pytest.raises(TypeError, match=r"'features'.*float32.*bool"):
        affine(np.zeros((4, 3), bool), GOOD_LABELS)


def test_float_labels_for_an_int_placeholder(affine):
    with pytest.raises(TypeError, match=r"'labels'.*int64.*float64"):
        affine(GOOD_X, GOOD_LABELS.astype(np.float64))


def test_integer_values_for_a_float_placeholder_are_converted(affine):
    assert np.isfinite(affine(np.zeros((4, 3), np.int32), GOOD_LABELS))


def test_integers_that_do_not_fit(transformer_factory):
    ids = ng.placeholder((2,), dtype=np.int8, name="ids")
    comp = transformer_factory().computation(ids * 1, ids)
    with pytest.raises(ValueError, match=r"'ids'.*int8"):
        comp(np.array([1, 1000]))


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nan_and_inf_arguments_name_the_parameter(affine, bad):
    x = GOOD_X.copy()
    x[2, 1] = bad
    with pytest.raises(ValueError, match=r"'features'.*1 NaN or Inf"):
        affine(x, GOOD_LABELS)


def test_nan_check_can_be_turned_off(transformer_factory):
    x = ng.placeholder((2,), name="x")
    comp = transformer_factory(check_finite=False).computation(x * 2.0, x)
    out = comp(np.array([np.nan, 1.0], np.float32))
    assert np.isnan(out[0]) and out[1] == 2.0


def test_wrong_number_of_arguments(affine):
    with pytest.raises(TypeError, match=r"takes 2 argument\(s\) \(features, labels\), got 1"):
        affine(GOOD_X)
    with pytest.raises(TypeError, match="got 3"):
        affine(GOOD_X, GOOD_LABELS, GOOD_LABELS)


@pytest.mark.parametrize("build, message", [
    (lambda: ng.placeholder((3,)) + ng.placeholder((4,)), r"Add: shapes \(3,\) and \(4,\)"),
    (lambda: ng.placeholder((2, 3)) * ng.placeholder((3, 2)),
     r"Multiply: shapes \(2, 3\) and \(3, 2\)"),
    (lambda: ng.dot(ng.placeholder((2, 3)), ng.placeholder((4, 5))),
     r"dot: shapes \(2, 3\) and \(4, 5\)"),
    (lambda: ng.dot(ng.placeholder((2, 2, 3)), ng.placeholder((3, 3, 1))),
     r"dot: batch axes of \(2, 2, 3\) and \(3, 3, 1\)"),
    (lambda: ng.concat([ng.placeholder((2, 3)), ng.placeholder((2, 4))], axis=0),
     r"concat: shapes \(2, 3\) and \(2, 4\)"),
    (lambda: ng.concat([ng.placeholder((2, 3)), ng.placeholder((2, 3, 1))], axis=0),
     r"concat: shapes \(2, 3\) and \(2, 3, 1\)"),
    (lambda: ng.reshape(ng.placeholder((2, 3)), (4, 2)), r"reshape: cannot reshape \(2, 3\)"),
    (lambda: ng.reshape(ng.placeholder((2, 3)), (4, -1)), r"reshape: cannot reshape \(2, 3\)"),
    (lambda: ng.transpose(ng.placeholder((2, 3)), (0, 0)), r"transpose: axes"),
    (lambda: ng.sum(ng.placeholder((2, 3)), axis=2), r"sum: axis 2 is out of range"),
    (lambda: ng.placeholder((2, 3))[2], r"slice: index 2 is out of range"),
    (lambda: ng.placeholder((2, 3))[0, 0, 0], r"slice: too many indices"),
    (lambda: ng.cross_entropy(ng.placeholder((4, 3)), ng.placeholder((5,), dtype=np.int64)),
     r"cross_entropy: .*\(4, 3\) and \(5,\)"),
    (lambda: ng.cross_entropy(ng.placeholder((4, 3)), ng.placeholder((4,), dtype=np.int64),
                              mask=ng.placeholder((3,))), r"cross_entropy: mask shape \(3,\)"),
    (lambda: ng.assign(ng.variable((2, 2)), ng.placeholder((3,))),
     r"assign: value of shape \(3,\) does not fit"),
    (lambda: ng.variable((2, 2), initial_value=np.ones(3)), r"initial value of shape \(3,\)"),
], ids=["add", "multiply", "dot", "dot_batch", "concat", "concat_rank", "reshape",
        "reshape_-1", "transpose", "sum_axis", "index", "too_many_indices", "cross_entropy",
        "mask", "assign", "initial_value"])
def test_shape_errors_at_construction_name_the_op_and_shapes(build, message):
    with pytest.raises(ShapeError, match=message):
        build()


def test_assign_to_a_non_variable():
    with pytest.raises(TypeError, match="assign: the target must be an ng.variable"):
        ng.assign(ng.placeholder((2,)), 1.0)


def test_non_ops_as_results_or_parameters(transformer_factory):
    t = transformer_factory()
    x = ng.placeholder((2,), name="x")
    with pytest.raises(TypeError, match="results must be ngnn ops"):
        t.computation([x, np.ones(2)], x)
    with pytest.raises(TypeError, match="parameters must be placeholders"):
        t.computation(x * 2.0, x * 1.0)
    with pytest.raises(ValueError, match="listed twice"):
        t.computation(x * 2.0, x, x)


def test_placeholder_missing_from_parameters(transformer_factory):
    x, y = ng.placeholder((2,), name="x"), ng.placeholder((2,), name="forgotten")
    comp = transformer_factory().computation(x + y, x)
    with pytest.raises(ValueError, match="'forgotten'.*not among the parameters"):
        comp(np.ones(2, np.float32))


@pytest.mark.parametrize("bad_label", [3, -1])
def test_labels_out_of_range_in_cross_entropy(transformer_factory, bad_label):
    logits = ng.placeholder((4, 3), name="logits")
    labels = ng.placeholder((4,), dtype=np.int64, name="labels")
    comp = transformer_factory().computation(ng.cross_entropy(logits, labels), logits, labels)
    with pytest.raises(ValueError, match=rf"class id {bad_label} is outside \[0, 3\)"):
        comp(np.zeros((4, 3), np.float32), np.array([0, bad_label, 1, 2]))


def test_dropout_rate_out_of_range():
    with pytest.raises(ValueError, match=r"rate must be in \[0, 1\)"):
        ng.dropout(ng.placeholder((2,)), 1.0)


def test_truth_value_of_a_tensor_is_an_error():
    x = ng.placeholder((2,))
    with pytest.raises(Exception, match="control flow"):
        if x:
            pass


# ---- user names reach generated code only sanitized ------------------------------------------

HOSTILE_NAMES = ["my input", "it's \"quoted\"", "class", "lambda", "naïve λ", '"""',
                 "__import__('os')", "np", "1st", "x; import os", "\\n\\t", ""]


@pytest.mark.parametrize("name", HOSTILE_NAMES)
def test_hostile_names_are_sanitized(transformer_factory, name):
    x = ng.placeholder((2,), name=name)
    v = ng.variable((2,), initial_value=1.0, name=name)
    comp = transformer_factory().computation([ng.exp(x) * v, ng.assign(v, v + x)], x,
                                             name=name)
    out, new_v = comp(np.array([0.0, 1.0], np.float32))
    np.testing.assert_allclose(out, np.exp([0.0, 1.0]), rtol=1e-6)
    np.testing.assert_array_equal(new_v, [1.0, 2.0])
    source, ir = comp.source, comp.ir
    # Every identifier the IR prints is a plain identifier, and no name with characters
    # outside identifiers survives in the program text (the docstring quotes make '"""'
    # a case for compile() below).
    for ident in re.findall(r"%(\S+?)[\s,):]", ir):
        assert re.fullmatch(r"\w+", ident, flags=re.ASCII), ident
    if re.search(r"\W", name, flags=re.ASCII) and name != '"""':
        assert name not in source
    if comp.transformer.name == "numpy":
        compile(source, "<generated>", "exec")
        assert "import os" not in source


def test_hostile_name_error_messages_still_show_the_name(transformer_factory):
    x = ng.placeholder((2,), name="my input")
    comp = transformer_factory().computation(x * 2.0, x)
    with pytest.raises(ValueError, match="'my input'"):
        comp(np.ones(3, np.float32))
