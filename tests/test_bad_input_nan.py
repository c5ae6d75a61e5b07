"""Wrong answers, class 2 (NaN dropped by max/min on the GPU), and the NaN finder
(`debug_nans=True`): the same NaN results and the same first failing op on every backend."""
import numpy as np
import pytest

import ngnn as ng
from ngnn.transformers.debug_nans import NonFiniteError

NAN_ROW = np.array([[np.nan, 1.0], [2.0, -1.0], [0.5, np.nan], [-3.0, 4.0]], np.float32)
SRC, DST = [0, 1, 2, 3, 1], [1, 2, 3, 1, 3]

ELEMENTWISE = {
    "maximum": lambda x: ng.maximum(x, 0.0),
    "maximum_first_const": lambda x: ng.maximum(0.0, x),
    "minimum": lambda x: ng.minimum(x, 0.0),
    "minimum_first_const": lambda x: ng.minimum(0.0, x),
    "relu": ng.relu,
    "max_of_two": lambda x: ng.maximum(x, x * 2.0),
    "abs": ng.abs,
    "leaky_relu": ng.leaky_relu,
    "elu": ng.elu,
}


def unchecked(transformer_factory, **options):
    return transformer_factory(check_finite=False, **options)


@pytest.mark.parametrize("name", ELEMENTWISE)
def test_elementwise_ops_propagate_nan(transformer_factory, name):
    x = ng.placeholder((4, 2), name="x")
    out = unchecked(transformer_factory).computation(ELEMENTWISE[name](x), x)(NAN_ROW)
    np.testing.assert_array_equal(np.isnan(out), np.isnan(NAN_ROW))


@pytest.mark.parametrize("reduce", [ng.max, ng.min])
@pytest.mark.parametrize("axis", [None, 0, 1])
def test_reductions_propagate_nan(transformer_factory, reduce, axis):
    x = ng.placeholder((4, 2), name="x")
    out = unchecked(transformer_factory).computation(reduce(x, axis=axis), x)(NAN_ROW)
    expected = (np.max if reduce is ng.max else np.min)(NAN_ROW, axis=axis)
    np.testing.assert_array_equal(np.isnan(out), np.isnan(expected))
    np.testing.assert_allclose(np.nan_to_num(out), np.nan_to_num(expected))


@pytest.mark.parametrize("reduce", ["max", "min"])
@pytest.mark.parametrize("at", ["dst", "src"])
def test_graph_aggregations_propagate_nan(transformer_factory, reduce, at):
    g = ng.Graph.from_edges(SRC, DST, num_nodes=4)
    x = ng.placeholder((4, 2), name="x")
    out_op = ng.aggregate(ng.gather(x, g, by="src" if at == "dst" else "dst"), g, at=at,
                          reduce=reduce)
    out = unchecked(transformer_factory).computation(out_op, x)(NAN_ROW)
    numpy_out = unchecked(lambda **o: __import__("ngnn.transformers", fromlist=["x"])
                          .make_transformer("numpy", **o)).computation(out_op, x)(NAN_ROW)
    np.testing.assert_array_equal(np.isnan(out), np.isnan(numpy_out))
    assert np.isnan(out).any()
    np.testing.assert_allclose(np.nan_to_num(out), np.nan_to_num(numpy_out))


# Looked up when called, inside the context: ng.zoomIn patches the builtins max and min.
REDUCE = {"max": lambda values: max(values), "min": lambda values: min(values)}


@pytest.mark.parametrize("name", REDUCE)
def test_vertex_centric_max_min_propagate_nan(transformer_factory, name):
    reduce = REDUCE[name]
    g = ng.Graph.from_edges(SRC, DST, num_nodes=4)
    h = ng.placeholder((4, 2), name="h")
    with ng.zoomIn(g, node_feat={"h": h}) as v:
        r = reduce([n.h * 2.0 for n in v.innbs])
    out = unchecked(transformer_factory).computation(ng.zoomOut(r), h)(NAN_ROW)
    # Vertex 1 has in-neighbours 0 (NaN in column 0) and 3; vertex 3 has 2 (NaN in column 1).
    assert np.isnan(out[1, 0]) and np.isnan(out[3, 1])
    assert not np.isnan(out[1, 1]) and not np.isnan(out[2]).any()


def test_softmax_of_a_row_with_nan_is_nan(transformer_factory):
    x = ng.placeholder((4, 2), name="x")
    out = unchecked(transformer_factory).computation(ng.softmax(x), x)(NAN_ROW)
    np.testing.assert_array_equal(np.isnan(out).any(axis=1), np.isnan(NAN_ROW).any(axis=1))


def test_edge_softmax_with_a_nan_edge(transformer_factory):
    g = ng.Graph.from_edges(SRC, DST, num_nodes=4)
    e = ng.placeholder((5, 1), name="e")
    comp = unchecked(transformer_factory).computation(ng.edge_softmax(g, e), e)
    out = comp(np.array([[0.0], [1.0], [np.nan], [2.0], [3.0]], np.float32))
    # Edge 2 (2 -> 3) is NaN: every in-edge of vertex 3 (edges 2 and 4) is NaN, others are not.
    np.testing.assert_array_equal(np.isnan(out[:, 0]), [False, False, True, False, True])
    np.testing.assert_allclose([out[1, 0], out[0, 0] + out[3, 0]], [1.0, 1.0], rtol=1e-6)


# ---- the NaN finder ---------------------------------------------------------------------------

def test_debug_nans_names_the_first_op_its_line_and_input_ranges(transformer_factory):
    x = ng.placeholder((3,), name="x")
    shifted = x - 1.0
    logged = ng.log(shifted)    # the line the error points at
    out = ng.exp(logged) * 2.0
    comp = transformer_factory(debug_nans=True).computation(out, x)
    np.testing.assert_allclose(comp(np.array([2, 3, 4], np.float32)), [2, 4, 6], rtol=1e-6)
    with pytest.raises(NonFiniteError) as info:
        comp(np.array([2, 0.5, 4], np.float32))
    message = str(info.value)
    assert "log <Log [3] float32> is the first op" in message
    assert "1 NaN and 0 Inf" in message and "index (1,)" in message
    assert "logged = ng.log(shifted)" in message and "test_bad_input_nan.py" in message
    assert "range [-0.5, 3]" in message


def test_debug_nans_reports_inf(transformer_factory):
    x = ng.placeholder((2,), name="x")
    comp = transformer_factory(debug_nans=True).computation(ng.sum(1.0 / x), x)
    with pytest.raises(NonFiniteError, match=r"divide <Divide .*0 NaN and 1 Inf"):
        comp(np.array([0.0, 1.0], np.float32))


def test_debug_nans_stops_before_assignments_land(transformer_factory):
    x = ng.placeholder((2,), name="x")
    w = ng.variable((2,), initial_value=1.0, name="w")
    t = transformer_factory(debug_nans=True)
    step = t.computation([ng.assign(w, w * ng.sqrt(x))], x)
    with pytest.raises(NonFiniteError, match="sqrt"):
        step(np.array([-1.0, 4.0], np.float32))
    np.testing.assert_array_equal(t.variable_value(w), [1.0, 1.0])


def test_debug_nans_points_at_vertex_centric_lines(transformer_factory):
    g = ng.Graph.from_edges(SRC, DST, num_nodes=4)
    h = ng.placeholder((4, 2), name="h")
    with ng.zoomIn(g, node_feat={"h": h}) as v:
        r = sum(ng.sqrt(n.h) for n in v.innbs)    # sqrt of a negative feature
    comp = transformer_factory(debug_nans=True).computation(ng.zoomOut(r), h)
    with pytest.raises(NonFiniteError) as info:
        comp(-np.ones((4, 2), np.float32))
    assert "sqrt" in str(info.value)
    assert "r = sum(ng.sqrt(n.h) for n in v.innbs)" in str(info.value)


def test_without_debug_nans_the_same_computation_returns_nan(transformer_factory):
    x = ng.placeholder((3,), name="x")
    comp = transformer_factory().computation(ng.log(x - 1.0), x)
    with np.errstate(invalid="ignore"):
        assert np.isnan(comp(np.array([2, 0.5, 4], np.float32))[1])


def test_debug_nans_passes_finite_training_steps(transformer_factory):
    x = ng.placeholder((4, 3), name="x")
    labels = ng.placeholder((4,), dtype=np.int64, name="labels")
    w = ng.variable((3, 2), initial_value=0.1, name="w")
    loss = ng.cross_entropy(ng.relu(ng.dot(x, w)), labels)
    t = transformer_factory(debug_nans=True)
    step = t.computation([loss, ng.assign(w, w - 0.1 * ng.grad(loss, w))], x, labels)
    value, _ = step(np.ones((4, 3), np.float32), np.array([0, 1, 1, 0]))
    assert np.isfinite(value)
