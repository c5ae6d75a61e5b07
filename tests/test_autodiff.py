"""ng.grad against central finite differences (float64) for every op, and the rules of
ng.grad itself."""
import operator

import numpy as np
import pytest

import ngnn as ng
from helpers import check_gradient

rng = np.random.default_rng(99)


def away_from_zero(*shape):
    """Values in ±[0.2, 1.5]: no finite-difference step crosses the kink of relu or abs."""
    return rng.uniform(0.2, 1.5, shape) * rng.choice([-1.0, 1.0], shape)


def positive(*shape):
    return rng.uniform(0.5, 2.0, shape)


BROADCAST_PAIRS = [((3, 4), (3, 4)), ((3, 4), (4,)), ((4,), (3, 4)), ((2, 1, 4), (3, 1)),
                   ((), (2, 3)), ((3, 1), ())]


@pytest.mark.parametrize("fn", [operator.add, operator.sub, operator.mul, operator.truediv,
                                operator.pow, ng.maximum, ng.minimum],
                         ids=["add", "sub", "mul", "div", "pow", "maximum", "minimum"])
@pytest.mark.parametrize("shapes", BROADCAST_PAIRS, ids=str)
def test_binary_with_broadcasting(transformer_factory, fn, shapes):
    # Broadcast arguments get their gradient summed back down to their own shape.
    check_gradient(fn, [positive(*shapes[0]), positive(*shapes[1])], transformer_factory)


@pytest.mark.parametrize("fn", [lambda x: 3.0 - x, lambda x: 3.0 / x, lambda x: 2.0 ** x,
                                lambda x: x ** 3.0, lambda x: x ** 0.5, lambda x: -x,
                                lambda x: x * x, lambda x: x / x + x],
                         ids=["rsub", "rdiv", "rpow", "cube", "root", "neg", "square",
                              "reused"])
def test_with_constants_and_reuse(transformer_factory, fn):
    check_gradient(fn, [positive(3, 2)], transformer_factory)


@pytest.mark.parametrize("shapes", [((3, 4), (4, 5)), ((4,), (4, 5)), ((3, 4), (4,)),
                                    ((4,), (4,)), ((2, 3, 4), (2, 4, 5)), ((2, 3, 4), (4, 5)),
                                    ((3, 4), (2, 4, 5)), ((2, 1, 3, 4), (5, 4, 2)),
                                    ((4,), (2, 4, 5)), ((2, 3, 4), (4,))], ids=str)
def test_dot(transformer_factory, shapes):
    check_gradient(ng.dot, [away_from_zero(*shapes[0]), away_from_zero(*shapes[1])],
                   transformer_factory)


@pytest.mark.parametrize("fn", [ng.exp, ng.tanh, ng.sigmoid, ng.relu, ng.elu, ng.abs,
                                ng.leaky_relu, lambda x: ng.leaky_relu(x, alpha=0.01),
                                lambda x: ng.leaky_relu(x, alpha=2.5)],
                         ids=["exp", "tanh", "sigmoid", "relu", "elu", "abs", "leaky_relu",
                              "leaky_relu_0.01", "leaky_relu_2.5"])
def test_unary(transformer_factory, fn):
    check_gradient(fn, [away_from_zero(4, 3)], transformer_factory)


def test_softplus_also_at_zero(transformer_factory):
    # Smooth everywhere, so the check may straddle 0 (where sigmoid gives 1/2).
    check_gradient(ng.softplus, [np.array([[-30.0, -1.5, -1e-3], [0.0, 0.7, 25.0]])],
                   transformer_factory)


@pytest.mark.parametrize("fn", [ng.log, ng.sqrt], ids=["log", "sqrt"])
def test_unary_on_positive_values(transformer_factory, fn):
    check_gradient(fn, [positive(4, 3)], transformer_factory)


@pytest.mark.parametrize("name", ["sum", "mean", "max", "min"])
@pytest.mark.parametrize("axis", [None, 0, -1, (0, 2)], ids=str)
@pytest.mark.parametrize("keepdims", [False, True])
def test_reductions(transformer_factory, name, axis, keepdims):
    reduce = getattr(ng, name)
    check_gradient(lambda x: reduce(x, axis=axis, keepdims=keepdims),
                   [away_from_zero(2, 3, 4)], transformer_factory)


def test_max_ties_share_the_gradient(transformer_factory):
    x = ng.placeholder((2, 3), dtype=np.float64)
    g = transformer_factory().computation(ng.grad(ng.sum(ng.max(x, axis=1)), x), x)
    out = g(np.array([[1.0, 5.0, 5.0], [2.0, 0.0, 1.0]]))
    np.testing.assert_allclose(out, [[0, 0.5, 0.5], [1, 0, 0]])


@pytest.mark.parametrize("fn", [ng.softmax, ng.log_softmax])
@pytest.mark.parametrize("axis", [-1, 0])
def test_softmax(transformer_factory, fn, axis):
    check_gradient(lambda x: fn(x, axis=axis), [away_from_zero(3, 4)], transformer_factory)


@pytest.mark.parametrize("fn", [lambda x: ng.reshape(x, (6, 2)), lambda x: ng.reshape(x, -1),
                                lambda x: ng.transpose(x), lambda x: ng.transpose(x, (1, 0, 2)),
                                lambda x: x[1], lambda x: x[:, ::-1, 1],
                                lambda x: ng.slice(x, np.s_[..., 0:2]),
                                lambda x: x[1:, 0:3:2] * x[:1, 1:]],
                         ids=["reshape", "flatten", "transpose", "transpose_axes", "index",
                              "reversed", "ellipsis", "overlapping_slices"])
def test_layout(transformer_factory, fn):
    check_gradient(fn, [away_from_zero(2, 3, 2)], transformer_factory)


@pytest.mark.parametrize("axis", [0, 1])
def test_concat(transformer_factory, axis):
    check_gradient(lambda a, b: ng.concat([a, b * 2.0, a], axis=axis),
                   [away_from_zero(2, 3), away_from_zero(2, 3)], transformer_factory)


def test_rows_read_one_by_one_get_one_concatenated_gradient(transformer_factory):
    """x[0], x[2], x[3] and x[0] again (a per-relation weight read relation by relation):
    the gradient is right, row 1 (never read) zero, and it is one concatenation of rows,
    not a sum of whole-tensor Unslices."""
    build = lambda x: ng.sum(x[0] * 2.0) + ng.sum(x[2] * x[3]) + ng.sum(ng.exp(x[0]))
    check_gradient(build, [away_from_zero(5, 2, 3)], transformer_factory, coords=30)
    x = ng.placeholder((5, 2, 3), dtype=np.float64, name="x")
    gradient = ng.grad(build(x), x)
    assert any(isinstance(op, ng.op_graph.Concat) for op in ng.op_graph.ordered_ops([gradient]))
    assert not any(isinstance(op, ng.op_graph.Unslice)
                   for op in ng.op_graph.ordered_ops([gradient]))


LABELS = np.array([0, 2, 1, 2, 3])


def test_cross_entropy(transformer_factory):
    check_gradient(lambda x: ng.cross_entropy(x, ng.constant(LABELS)),
                   [away_from_zero(5, 4)], transformer_factory, coords=20)


def test_cross_entropy_with_mask(transformer_factory):
    mask = ng.constant(np.array([True, False, True, True, False]))
    check_gradient(lambda x: ng.cross_entropy(x, ng.constant(LABELS), mask=mask),
                   [away_from_zero(5, 4)], transformer_factory, coords=20)


def test_mlp_loss(transformer_factory):
    def loss(x, w1, w2):
        return ng.cross_entropy(ng.dot(ng.tanh(ng.dot(x, w1) + 0.1), w2), ng.constant(LABELS))
    check_gradient(loss, [away_from_zero(5, 3), away_from_zero(3, 6), away_from_zero(6, 4)],
                   transformer_factory)


def test_dropout_gradient_uses_the_same_mask(transformer_factory):
    # Finite differences cannot see the mask (it changes every call), so compare with
    # the mask of the same call: d(sum(w * dropout(x)))/dx = w * mask.
    x = ng.placeholder((40, 30), dtype=np.float64)
    w = rng.uniform(0.5, 1.5, (40, 30))
    y = ng.dropout(x, 0.4)
    weights = ng.constant(w, dtype=np.float64)
    comp = transformer_factory().computation([y, ng.grad(ng.sum(y * weights), x)], x)
    a = rng.uniform(1.0, 2.0, (40, 30))
    for _ in range(2):
        out, g = comp(a)
        mask = out / a
        assert set(np.round(np.unique(mask), 6)) == {0.0, round(1 / 0.6, 6)}
        np.testing.assert_allclose(g, w * mask, rtol=1e-12)


# ---- the rules of ng.grad ------------------------------------------------------------------

def test_grad_of_a_list_returns_a_list(transformer_factory):
    x = ng.placeholder((3,), dtype=np.float64)
    w = ng.variable((3,), dtype=np.float64, initial_value=[1.0, 2.0, 3.0])
    b = ng.variable((), dtype=np.float64, initial_value=0.5)
    grads = ng.grad(ng.sum(x * w) + b, [w, b])
    assert isinstance(grads, list) and len(grads) == 2
    gw, gb = transformer_factory().computation(grads, x)(np.array([4.0, 5.0, 6.0]))
    np.testing.assert_allclose(gw, [4.0, 5.0, 6.0])
    assert gb == 1.0


def test_non_scalar_y_without_delta_is_an_error():
    x = ng.placeholder((2, 3))
    with pytest.raises(ValueError, match=r"scalar.*delta"):
        ng.grad(x * 2.0, x)


def test_explicit_delta(transformer_factory):
    x = ng.placeholder((2, 3), dtype=np.float64)
    delta = np.arange(6.0).reshape(2, 3)
    g = transformer_factory().computation(ng.grad(x * x, x, delta=delta), x)
    a = rng.uniform(-1, 1, (2, 3))
    np.testing.assert_allclose(g(a), 2 * a * delta)


def test_delta_of_the_wrong_shape_is_an_error():
    x = ng.placeholder((2, 3))
    with pytest.raises(ValueError, match=r"delta has shape \(3,\).*\(2, 3\)"):
        ng.grad(x * 2.0, x, delta=np.ones(3))


def test_gradient_of_an_unused_variable_is_zeros(transformer_factory):
    x = ng.placeholder((3,))
    unused = ng.variable((2, 2), initial_value=5.0)
    g = ng.grad(ng.sum(x), unused)
    assert g.shape == (2, 2)
    out = transformer_factory().computation(g, x)(np.ones(3, dtype=np.float32))
    np.testing.assert_array_equal(out, np.zeros((2, 2)))


def test_gradient_of_y_with_respect_to_itself_is_one(transformer_factory):
    x = ng.placeholder((), dtype=np.float64)
    y = x * 3.0
    out = transformer_factory().computation(ng.grad(y, [y, x]), x)(np.float64(2.0))
    assert out == (1.0, 3.0)


def test_grad_through_an_assignment_is_an_error():
    v = ng.variable((2,))
    with pytest.raises(ValueError, match="assign"):
        ng.grad(ng.sum(ng.assign(v, v + 1.0)), v)


def test_grad_with_respect_to_a_non_op_is_an_error():
    x = ng.placeholder((2,))
    with pytest.raises(TypeError, match="ops"):
        ng.grad(ng.sum(x), np.ones(2))


def test_cast_between_float_widths(transformer_factory):
    # float32 in the middle rounds, so the step and the tolerance are float32-sized.
    check_gradient(lambda x: ng.exp(ng.cast(ng.cast(x, np.float32), np.float64)),
                   [away_from_zero(3, 2)], transformer_factory, eps=1e-3, rtol=1e-3)


def test_broadcast_and_unslice(transformer_factory):
    from ngnn.op_graph import Broadcast, Unslice
    check_gradient(lambda x: Broadcast(x, (2, 3, 4)) * Broadcast(x, (2, 3, 4)),
                   [away_from_zero(3, 1)], transformer_factory)
    check_gradient(lambda x: ng.exp(Unslice(x, (5, 4), (slice(1, 4, 1), slice(0, 4, 2)))),
                   [away_from_zero(3, 2)], transformer_factory)


@pytest.mark.parametrize("optimize", [True, False])   # pruned, or run as a copy
def test_stop_gradient_passes_the_value_and_blocks_the_gradient(transformer_factory, optimize):
    x = ng.placeholder((3, 2), dtype=np.float64)
    value = away_from_zero(3, 2)
    y = ng.sum(ng.stop_gradient(x) * x)          # d/dx = stop_gradient(x) = x
    comp = transformer_factory(optimize=optimize).computation([y, ng.grad(y, x)], x)
    total, dx = comp(value)
    np.testing.assert_allclose(total, np.sum(value * value))
    np.testing.assert_allclose(dx, value)
