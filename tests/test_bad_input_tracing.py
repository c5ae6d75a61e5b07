"""Python constructs that need a traced value inside ng.zoomIn: each raises a TracingError
that names the construct, points at the user's line and says what to write instead."""
import math
import re

import numpy as np
import pytest

import ngnn as ng
from ngnn import TracingError

GRAPH = ng.Graph.from_edges([0, 1, 2], [1, 2, 0], num_nodes=3)
H = ng.placeholder((3, 2), name="h")

# construct -> (code run inside the context, words the message must contain, advice)
CONSTRUCTS = {
    "int": (lambda v: int(v.indegree), r"int\(\.\.\.\)", "ng.cast"),
    "int_of_feature": (lambda v: int(v.h[0]), r"int\(\.\.\.\)", "ng.cast"),
    "float": (lambda v: float(v.h[0]), r"float\(\.\.\.\)", "keep it a tensor"),
    "complex": (lambda v: complex(v.h[1]), r"complex\(\.\.\.\)", "real tensors"),
    "math_exp": (lambda v: math.exp(v.h[0]), r"float\(\.\.\.\)", "keep it a tensor"),
    "len_innbs": (lambda v: len(v.innbs), r"len\(\) of a neighbour list", "v.indegree"),
    "len_outedges": (lambda v: len(v.outedges), r"len\(\) of a neighbour list", "v.outdegree"),
    "index_innbs": (lambda v: v.innbs[0], r"indexing a neighbour list", "aggregate"),
    "list_index": (lambda v: [1.0, 2.0, 3.0][v.indegree], r"Python integer index", "one_hot"),
    "tuple_index": (lambda v: (1, 2)[v.outdegree], r"Python integer index", "one_hot"),
    "range": (lambda v: range(v.indegree), r"range\(\.\.\.\)", "v.innbs"),
    "np_exp": (lambda v: np.exp(v.h), r"np\.exp\(\.\.\.\)", "ng.exp"),
    "np_log": (lambda v: np.log(v.h), r"np\.log\(\.\.\.\)", "ng.log"),
    "np_maximum": (lambda v: np.maximum(v.h, 0.0), r"np\.maximum\(\.\.\.\)", "ng.maximum"),
    "np_tanh": (lambda v: np.tanh(v.h), r"np\.tanh\(\.\.\.\)", "ng.tanh"),
    "np_asarray": (lambda v: np.asarray(v.h), r"a NumPy array", "ngnn ops"),
    "np_sum": (lambda v: np.sum(v.h), r"np\.add\.reduce\(\.\.\.\)", "ng.sum"),
    "np_max": (lambda v: np.max(v.h), r"np\.maximum\.reduce\(\.\.\.\)", "ng.max"),
    "grad": (lambda v: ng.grad(ng.sum(v.h), H), r"ng\.grad of the per-vertex value",
             "after the context"),
    "grad_of_neighbours": (lambda v: ng.grad(sum(n.h for n in v.innbs)[0], H),
                           r"ng\.grad of the per-vertex value", "ng.zoomOut"),
    "if": (lambda v: 1 if v.indegree else 0, r"data-dependent control flow", "ng.maximum"),
    "while": (lambda v: [None for _ in iter(lambda: bool(v.h[0]), True)],
              r"data-dependent control flow", "masks"),
    "and": (lambda v: v.h[0] and v.h[1], r"data-dependent control flow", "masks"),
    "iterate_feature": (lambda v: list(v.h), r"cannot iterate over the tensor", "v.innbs"),
}


@pytest.mark.parametrize("construct", CONSTRUCTS)
def test_constructs_that_need_a_value_name_themselves_and_the_line(construct):
    code, words, advice = CONSTRUCTS[construct]
    with ng.zoomIn(GRAPH, node_feat={"h": H}) as v:
        with pytest.raises((TracingError, TypeError)) as info:
            code(v)
    message = str(info.value)
    assert re.search(words, message), message
    assert advice in message, message
    if isinstance(info.value, TracingError):
        assert "test_bad_input_tracing.py" in message and "code(v)" not in message.split(
            "at File")[0]


def test_the_message_shows_the_users_source_line():
    with ng.zoomIn(GRAPH, node_feat={"h": H}) as v:
        with pytest.raises(TracingError) as info:
            steps = range(v.indegree)   # the line the error points at
    assert "steps = range(v.indegree)" in str(info.value)


@pytest.mark.parametrize("construct", ["int", "float", "np_exp", "list_index"])
def test_outside_zoom_in_the_same_constructs_raise_type_errors(construct):
    x = ng.placeholder((), name="x")
    code = {"int": lambda: int(x), "float": lambda: float(x), "np_exp": lambda: np.exp(x),
            "list_index": lambda: [1, 2][x]}[construct]
    with pytest.raises(TypeError, match="symbolic tensor <Placeholder 'x'"):
        code()


@pytest.mark.parametrize("left", [np.float32(2.0), np.float64(2.0), np.ones(3, np.float32),
                                  np.int64(3)])
def test_numpy_values_on_the_left_of_an_operator_build_ops(transformer_factory, left):
    x = ng.placeholder((3,), name="x")
    product, total, ratio = left * x, left + x, left / (x + 1.0)
    comp = transformer_factory().computation([product, total, ratio], x)
    values = np.array([1.0, 2.0, 3.0], np.float32)
    got = comp(values)
    np.testing.assert_allclose(got[0], left * values, rtol=1e-6)
    np.testing.assert_allclose(got[1], left + values, rtol=1e-6)
    np.testing.assert_allclose(got[2], left / (values + 1.0), rtol=1e-6)


def test_numpy_comparison_on_the_left_builds_a_mask(transformer_factory):
    x = ng.placeholder((3,), name="x")
    comp = transformer_factory().computation([np.ones(3) < x, np.ones(3) >= x], x)
    less, greater_equal = comp(np.array([0.0, 1.0, 2.0], np.float32))
    np.testing.assert_array_equal(less, [0, 0, 1])
    np.testing.assert_array_equal(greater_equal, [1, 1, 0])
