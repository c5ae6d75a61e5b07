"""Transformers and computations: state, assignment order, training in one computation,
late computations, generated source, initialization, device tensors, closing."""
import numpy as np
import pytest

import ngnn as ng
from ngnn import transformers as ngt


def test_single_result_is_an_array_and_a_list_a_tuple(transformer_factory):
    x = ng.placeholder((2,), name="x")
    t = transformer_factory()
    a = np.array([1.0, 2.0], np.float32)
    single = t.computation(x * 2.0, x)(a)
    assert isinstance(single, np.ndarray)
    pair = t.computation([x * 2.0], x)(a)
    assert isinstance(pair, tuple) and len(pair) == 1


def test_variables_persist_between_calls(transformer_factory):
    t = transformer_factory()
    counter = ng.variable((), initial_value=0.0, name="counter")
    bump = t.computation(ng.assign(counter, counter + 1.0))
    assert [float(bump()) for _ in range(3)] == [1.0, 2.0, 3.0]
    assert t.computation(counter * 1.0)() == 3.0


def test_results_are_copies(transformer_factory):
    t = transformer_factory()
    v = ng.variable((2,), initial_value=1.0, name="v")
    step = t.computation([v * 1.0, ng.assign(v, v + 1.0)])
    before, after = step()
    step()
    np.testing.assert_array_equal(before, [1.0, 1.0])
    np.testing.assert_array_equal(after, [2.0, 2.0])


def test_assignments_land_after_every_other_result(transformer_factory):
    t = transformer_factory()
    v = ng.variable((3,), initial_value=[1.0, 2.0, 3.0], name="v")
    w = ng.variable((3,), initial_value=[10.0, 20.0, 30.0], name="w")
    # Reads of v and w (direct, pruned to v, views, reductions) all see the old values,
    # including the swap: each assignment reads the other variable's old value.
    step = t.computation([v, v * 1.0, v[1:], ng.reshape(v, (3, 1)), ng.sum(v),
                          ng.assign(v, w), ng.assign(w, v), v + w])
    old_v, pruned, view, reshaped, total, new_v, new_w, both = step()
    np.testing.assert_array_equal(old_v, [1.0, 2.0, 3.0])
    np.testing.assert_array_equal(pruned, [1.0, 2.0, 3.0])
    np.testing.assert_array_equal(view, [2.0, 3.0])
    np.testing.assert_array_equal(reshaped, [[1.0], [2.0], [3.0]])
    assert total == 6.0
    np.testing.assert_array_equal(new_v, [10.0, 20.0, 30.0])
    np.testing.assert_array_equal(new_w, [1.0, 2.0, 3.0])
    np.testing.assert_array_equal(both, [11.0, 22.0, 33.0])
    np.testing.assert_array_equal(t.variable_value(v), [10.0, 20.0, 30.0])
    np.testing.assert_array_equal(t.variable_value(w), [1.0, 2.0, 3.0])


def xor_blobs(n, rng):
    """Four Gaussian blobs at the corners of a square, labelled like XOR: no linear model
    separates them, a hidden layer does."""
    corners = rng.integers(0, 2, (n, 2))
    x = corners * 2.0 - 1.0 + rng.normal(0, 0.25, (n, 2))
    return x.astype(np.float32), (corners[:, 0] ^ corners[:, 1]).astype(np.int64)


def test_mlp_trains_with_one_computation_per_step(transformer_factory):
    rng = np.random.default_rng(0)
    n, hidden, lr = 256, 16, 0.5
    x_data, y_data = xor_blobs(n, rng)
    x = ng.placeholder((n, 2), name="x")
    labels = ng.placeholder((n,), dtype=np.int64, name="labels")
    w1 = ng.variable((2, hidden), initial_value=rng.normal(0, 1.0, (2, hidden)), name="w1")
    b1 = ng.variable((hidden,), initial_value=0.0, name="b1")
    w2 = ng.variable((hidden, 2), initial_value=rng.normal(0, 0.5, (hidden, 2)), name="w2")
    b2 = ng.variable((2,), initial_value=0.0, name="b2")
    logits = ng.dot(ng.tanh(ng.dot(x, w1) + b1), w2) + b2
    loss = ng.cross_entropy(logits, labels)
    params = [w1, b1, w2, b2]
    grads = ng.grad(loss, params)
    t = transformer_factory()
    step = t.computation([loss] + [ng.assign(p, p - lr * g) for p, g in zip(params, grads)],
                         x, labels)
    predict = t.computation(logits, x)
    losses = [float(step(x_data, y_data)[0]) for _ in range(150)]
    assert losses[-1] < 0.25 * losses[0]
    assert all(np.isfinite(losses))
    accuracy = (predict(x_data).argmax(axis=1) == y_data).mean()
    assert accuracy > 0.95


def test_computations_created_after_the_first_call(transformer_factory):
    t = transformer_factory()
    v = ng.variable((2,), initial_value=1.0, name="v")
    t.computation(ng.assign(v, v * 3.0))()
    # A new computation sees v's current value; its new variable gets its initial value.
    u = ng.variable((2,), initial_value=[5.0, 6.0], name="u")
    later = t.computation(v + u)
    np.testing.assert_array_equal(later(), [8.0, 9.0])
    x = ng.placeholder((2,), name="x")
    np.testing.assert_array_equal(t.computation(x * v, x)(np.array([1.0, 2.0], np.float32)),
                                  [3.0, 6.0])


def test_generated_numpy_source_is_python():
    x = ng.placeholder((4, 3), name="x")
    w = ng.variable((3, 2), initial_value=0.5, name="w")
    with ngt.make_transformer("numpy") as t:
        comp = t.computation(ng.relu(ng.dot(x, w)), x)
        source = comp.source
    compile(source, "<generated>", "exec")
    assert "np.matmul" in source and "K.relu" in source


def test_source_is_text(transformer_factory):
    x = ng.placeholder((4,), name="x")
    source = transformer_factory().computation(ng.exp(x), x).source
    assert isinstance(source, str) and source.strip()


def test_initial_values(transformer_factory):
    t = transformer_factory()
    arr = ng.variable((2, 2), initial_value=np.array([[1, 2], [3, 4]]), name="arr")
    row = ng.variable((2, 2), initial_value=np.array([7, 8]), name="row")
    scalar = ng.variable((3,), initial_value=2.5, name="scalar")
    made = ng.variable((2, 3), initial_value=lambda shape: np.arange(6).reshape(shape),
                       name="made")
    t.computation([arr + 0.0, row + 0.0, scalar + 0.0, made + 0.0])
    np.testing.assert_array_equal(t.variable_value(arr), [[1, 2], [3, 4]])
    np.testing.assert_array_equal(t.variable_value(row), [[7, 8], [7, 8]])
    np.testing.assert_array_equal(t.variable_value(scalar), [2.5, 2.5, 2.5])
    np.testing.assert_array_equal(t.variable_value(made), np.arange(6).reshape(2, 3))
    assert t.variable_value(arr).dtype == np.float32


def test_float64_initial_values_keep_every_digit(transformer_factory):
    value = np.array([0.1, 1 / 3, np.pi])       # none of them is a float32
    var = ng.variable((3,), dtype=np.float64, initial_value=value, name="exact")
    t = transformer_factory()
    t.computation(var + 0.0)
    np.testing.assert_array_equal(t.variable_value(var), value)


def test_init_runs_once_per_variable(transformer_factory):
    t = transformer_factory()
    v = ng.variable((), initial_value=1.0, name="v")
    t.computation(ng.assign(v, v + 1.0))()
    t.initialize()
    t.computation(v * 2.0)
    t.initialize()
    assert t.variable_value(v) == 2.0


def test_two_transformers_have_separate_state(transformer_factory):
    v = ng.variable((), initial_value=1.0, name="v")
    t1, t2 = transformer_factory(), transformer_factory()
    t1.computation(ng.assign(v, v + 1.0))()
    assert t2.computation(v + 0.0)() == 1.0
    assert t1.variable_value(v) == 2.0


def test_device_tensor_get_and_set(transformer_factory):
    t = transformer_factory()
    v = ng.variable((2, 2), initial_value=0.0, name="v")
    read = t.computation(v * 2.0)
    read()
    tensor = t.variable_tensor(v)
    assert tensor.shape == (2, 2) and tensor.dtype == np.float32 and tensor.nbytes == 16
    tensor.set(np.array([[1.0, 2.0], [3.0, 4.0]]))
    np.testing.assert_array_equal(tensor.get(), [[1, 2], [3, 4]])
    np.testing.assert_array_equal(read(), [[2, 4], [6, 8]])
    got = tensor.get()
    got[0, 0] = 100.0                      # get() is a copy
    assert read()[0, 0] == 2.0
    t.set_variable(v, 5.0)                 # broadcast
    np.testing.assert_array_equal(read(), np.full((2, 2), 10.0))


def test_variable_value_of_an_unknown_variable_is_an_error(transformer_factory):
    t = transformer_factory()
    stranger = ng.variable((2,), name="stranger")
    with pytest.raises(KeyError, match="stranger"):
        t.variable_value(stranger)


def test_context_manager_closes(transformer_factory):
    x = ng.placeholder((2,), name="x")
    with transformer_factory() as t:
        comp = t.computation(x + 1.0, x)
        np.testing.assert_array_equal(comp(np.zeros(2, np.float32)), [1.0, 1.0])
    assert t.closed
    with pytest.raises(RuntimeError, match="closed"):
        comp(np.zeros(2, np.float32))
    with pytest.raises(RuntimeError, match="closed"):
        t.computation(x * 2.0, x)


def test_ir_after_each_pass(transformer_factory):
    x = ng.placeholder((3,), name="x")
    comp = transformer_factory().computation(x * 1.0 + ng.exp(x), x)
    assert "multiply" in comp.ir_after("Trace")
    after = comp.ir_after("SimplePrune")
    assert after.startswith("graph ") and "multiply" not in after and "exp(%x)" in after
    with pytest.raises(KeyError, match="NoSuchPass"):
        comp.ir_after("NoSuchPass")


def test_ir_is_ssa_text(transformer_factory):
    x = ng.placeholder((4, 3), name="x")
    comp = transformer_factory().computation(ng.sum(ng.exp(x), axis=1), x)
    ir = comp.ir
    assert ir.splitlines()[0] == "graph computation(%x : Float32[4,3]):"
    assert "= exp(%x)" in ir and "sum(" in ir and ir.splitlines()[-1].startswith("    return %")


def test_computation_name_appears(transformer_factory):
    x = ng.placeholder((2,), name="x")
    comp = transformer_factory().computation(x + 1.0, x, name="train_step")
    assert comp.ir.startswith("graph train_step(")
