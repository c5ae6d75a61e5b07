"""Every op of the API against NumPy, with NumPy's broadcasting, on every transformer."""
import operator

import numpy as np
import pytest
import scipy.special

import ngnn as ng
from ngnn import transformers as ngt
from helpers import run

rng = np.random.default_rng(1234)


def rand(*shape, low=-2.0, high=2.0, dtype=np.float32):
    return rng.uniform(low, high, shape).astype(dtype)


def assert_close(actual, expected, rtol=2e-5, atol=1e-6):
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol)


BROADCAST_PAIRS = [((3, 4), (3, 4)), ((3, 4), (4,)), ((4,), (3, 4)), ((2, 1, 4), (3, 1)),
                   ((), (2, 3)), ((3, 1), ())]


# ---- arithmetic ------------------------------------------------------------------------------

@pytest.mark.parametrize("fn", [operator.add, operator.sub, operator.mul, operator.truediv],
                         ids=["add", "sub", "mul", "div"])
@pytest.mark.parametrize("shapes", BROADCAST_PAIRS, ids=str)
def test_arithmetic_broadcasts_like_numpy(transformer_factory, fn, shapes):
    a, b = rand(*shapes[0]), rand(*shapes[1], low=0.5, high=2.0)
    assert_close(run(transformer_factory, fn, a, b), fn(a, b))


@pytest.mark.parametrize("shapes", BROADCAST_PAIRS, ids=str)
def test_power_broadcasts_like_numpy(transformer_factory, shapes):
    a, b = rand(*shapes[0], low=0.5, high=2.0), rand(*shapes[1])
    assert_close(run(transformer_factory, operator.pow, a, b), a ** b)


@pytest.mark.parametrize("fn", [lambda x: 3.0 - x, lambda x: 3.0 / x, lambda x: 2.0 ** x,
                                lambda x: x ** 2, lambda x: -x, lambda x: 1.5 + x * 0.5],
                         ids=["rsub", "rdiv", "rpow", "square", "neg", "scalars"])
def test_python_scalars_on_either_side(transformer_factory, fn):
    a = rand(5, 3, low=0.5, high=2.0)
    assert_close(run(transformer_factory, fn, a), fn(a))


def test_unary_minus_of_integers(transformer_factory):
    a = np.arange(-3, 3, dtype=np.int32)
    out = run(transformer_factory, operator.neg, a)
    np.testing.assert_array_equal(out, -a)


# ---- matrix products -------------------------------------------------------------------------

@pytest.mark.parametrize("shapes", [((3, 4), (4, 5)), ((4,), (4, 5)), ((3, 4), (4,)),
                                    ((4,), (4,)), ((2, 3, 4), (2, 4, 5)), ((2, 3, 4), (4, 5)),
                                    ((3, 4), (2, 4, 5)), ((2, 1, 3, 4), (5, 4, 2)),
                                    ((4,), (2, 4, 5)), ((2, 3, 4), (4,))], ids=str)
def test_dot_is_matmul(transformer_factory, shapes):
    a, b = rand(*shapes[0]), rand(*shapes[1])
    assert_close(run(transformer_factory, ng.dot, a, b), np.matmul(a, b), rtol=1e-4)


def test_matmul_operator(transformer_factory):
    a, b = rand(3, 4), rand(4, 2)
    assert_close(run(transformer_factory, operator.matmul, a, b), a @ b, rtol=1e-4)


# ---- element-wise functions ------------------------------------------------------------------

UNARY = {
    "exp": (ng.exp, np.exp),
    "log": (ng.log, np.log),
    "sqrt": (ng.sqrt, np.sqrt),
    "tanh": (ng.tanh, np.tanh),
    "sigmoid": (ng.sigmoid, scipy.special.expit),
    "relu": (ng.relu, lambda x: np.maximum(x, 0)),
    "elu": (ng.elu, lambda x: np.where(x > 0, x, np.expm1(x))),
    "abs": (ng.abs, np.abs),
    "softplus": (ng.softplus, lambda x: np.logaddexp(x, 0.0)),
}


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary(transformer_factory, name):
    ours, reference = UNARY[name]
    a = rand(4, 5, low=0.1, high=3.0) if name in ("log", "sqrt") else rand(4, 5, low=-3, high=3)
    assert_close(run(transformer_factory, ours, a), reference(a.astype(np.float64)))


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_templates_may_write_over_their_input(name):
    """Buffer sharing may give an element-wise op its input's buffer as `out`: each NumPy
    template (ELU's is two statements) gives the same values written in place as into a
    new array, NaN and infinities included."""
    from ngnn.transformers.numpy import kernels
    from ngnn.transformers.numpy.codegen import NumPyCodeGenerator
    ours, _ = UNARY[name]
    a = np.concatenate([rand(30, low=0.1, high=3.0) if name in ("log", "sqrt") else rand(30),
                        np.float32([np.nan, np.inf, -np.inf, 0.0, -0.0])])
    op = ours(ng.placeholder(a.shape, np.float32))
    results = []
    for out in ("out", "x"):
        lines = NumPyCodeGenerator(None).generate_op(op, out, ["x"])
        scope = {"np": np, "scipy": scipy, "K": kernels, "x": a.copy(),
                 "out": np.empty_like(a)}
        with np.errstate(all="ignore"):
            exec("\n".join(lines), scope)
        results.append(scope[out])
    np.testing.assert_array_equal(results[0], results[1])


@pytest.mark.parametrize("alpha", [0.0, 0.01, 0.2, 1.0, 3.0])
def test_leaky_relu(transformer_factory, alpha):
    a = rand(6, 7)
    out = run(transformer_factory, lambda x: ng.leaky_relu(x, alpha=alpha), a)
    assert_close(out, np.where(a > 0, a, alpha * a))


def test_leaky_relu_default_alpha_is_0_2(transformer_factory):
    a = np.array([-1.0, 2.0], dtype=np.float32)
    assert_close(run(transformer_factory, ng.leaky_relu, a), [-0.2, 2.0])


def test_softplus_is_stable_at_extremes(transformer_factory):
    a = np.array([-1000.0, -40.0, 0.0, 40.0, 1000.0], dtype=np.float32)
    out = run(transformer_factory, ng.softplus, a)
    assert_close(out, np.logaddexp(a.astype(np.float64), 0.0))
    assert out[0] == 0.0 and out[1] > 0.0      # no overflow, no digits lost below zero


def test_sigmoid_and_softmax_are_stable_at_extremes(transformer_factory):
    a = np.array([[-1000.0, 0.0, 1000.0]], dtype=np.float32)
    out = run(transformer_factory, lambda x: ng.concat([ng.sigmoid(x), ng.softmax(x),
                                                          ng.log_softmax(x)], axis=0), a)
    assert np.isfinite(out).all()
    assert_close(out, [[0, 0.5, 1], [0, 0, 1], [-2000, -1000, 0]])


@pytest.mark.parametrize("fn", [ng.maximum, ng.minimum])
@pytest.mark.parametrize("shapes", BROADCAST_PAIRS[:4], ids=str)
def test_maximum_minimum(transformer_factory, fn, shapes):
    a, b = rand(*shapes[0]), rand(*shapes[1])
    reference = np.maximum if fn is ng.maximum else np.minimum
    assert_close(run(transformer_factory, fn, a, b), reference(a, b))


def test_maximum_with_a_scalar(transformer_factory):
    a = rand(3, 3)
    assert_close(run(transformer_factory, lambda x: ng.maximum(x, 0.5), a), np.maximum(a, 0.5))


# ---- reductions ------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["sum", "mean", "max"])
@pytest.mark.parametrize("axis", [None, 0, 1, -1, (0, 2), (2, 0, 1)], ids=str)
@pytest.mark.parametrize("keepdims", [False, True])
def test_reductions(transformer_factory, name, axis, keepdims):
    a = rand(3, 4, 5)
    ours = getattr(ng, name)
    out = run(transformer_factory, lambda x: ours(x, axis=axis, keepdims=keepdims), a)
    assert_close(out, getattr(np, name)(a.astype(np.float64), axis=axis, keepdims=keepdims))


def test_sum_of_a_vector_is_a_scalar(transformer_factory):
    a = rand(10)
    out = run(transformer_factory, ng.sum, a)
    assert out.shape == ()
    assert_close(out, a.sum())


# ---- softmax ---------------------------------------------------------------------------------

def reference_log_softmax(a, axis):
    return scipy.special.log_softmax(a.astype(np.float64), axis=axis)


@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_softmax(transformer_factory, axis):
    a = rand(3, 4, 5, low=-5, high=5)
    out = run(transformer_factory, lambda x: ng.softmax(x, axis=axis), a)
    assert_close(out, np.exp(reference_log_softmax(a, axis)))


@pytest.mark.parametrize("axis", [-1, 0])
def test_log_softmax(transformer_factory, axis):
    a = rand(4, 6, low=-5, high=5)
    out = run(transformer_factory, lambda x: ng.log_softmax(x, axis=axis), a)
    assert_close(out, reference_log_softmax(a, axis))


# ---- layout ----------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(6, 4), (4, -1), (-1,), (2, 3, 2, 2), 24], ids=str)
def test_reshape(transformer_factory, shape):
    a = rand(2, 3, 4)
    assert_close(run(transformer_factory, lambda x: ng.reshape(x, shape), a), a.reshape(shape))


def test_reshape_method_and_computed_input(transformer_factory):
    a = rand(2, 6)
    out = run(transformer_factory, lambda x: (x * 2.0).reshape(3, 4) + 1.0, a)
    assert_close(out, (a * 2).reshape(3, 4) + 1)


@pytest.mark.parametrize("axes", [None, (0, 2, 1), (2, 0, 1), (-1, 0, 1)], ids=str)
def test_transpose(transformer_factory, axes):
    a = rand(2, 3, 4)
    out = run(transformer_factory, lambda x: ng.transpose(x, axes) * 1.5, a)
    assert_close(out, np.transpose(a, axes) * 1.5)


def test_transpose_property(transformer_factory):
    a = rand(3, 5)
    assert_close(run(transformer_factory, lambda x: x.T, a), a.T)


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_concat(transformer_factory, axis):
    shapes = [(2, 3), (2, 3), (2, 3)]
    arrays = [rand(*s) for s in shapes]
    out = run(transformer_factory, lambda *xs: ng.concat(list(xs), axis=axis), *arrays)
    assert_close(out, np.concatenate(arrays, axis=axis))


def test_concat_of_different_lengths_and_computed_parts(transformer_factory):
    a, b = rand(2, 3), rand(5, 3)
    out = run(transformer_factory, lambda x, y: ng.concat([x * 2.0, ng.exp(y)], axis=0), a, b)
    assert_close(out, np.concatenate([a * 2, np.exp(b)]))


SLICES = [np.s_[1], np.s_[-1], np.s_[:, 1:3], np.s_[1:5:2, -1], np.s_[::-1], np.s_[..., 0],
          np.s_[2:0:-1, ::2], np.s_[0, 1], np.s_[:, :, 1:]]


@pytest.mark.parametrize("key", SLICES, ids=str)
def test_getitem(transformer_factory, key):
    a = rand(6, 4, 3)
    assert_close(run(transformer_factory, lambda x: x[key], a), a[key])


def test_slice_function_then_compute(transformer_factory):
    a = rand(6, 4)
    out = run(transformer_factory, lambda x: ng.exp(ng.slice(x, np.s_[1:4, ::-1])), a)
    assert_close(out, np.exp(a[1:4, ::-1]))


# ---- dropout ---------------------------------------------------------------------------------

def test_dropout_rate_zero_is_identity(transformer_factory):
    x = ng.placeholder((3, 4))
    assert ng.dropout(x, 0.0) is x
    a = rand(3, 4)
    assert_close(run(transformer_factory, lambda x: ng.dropout(x, 0.0) * 2.0, a), a * 2)


@pytest.mark.parametrize("rate", [0.1, 0.5, 0.8])
def test_dropout_mask_fraction_and_scaling(transformer_factory, rate):
    a = rand(200, 500, low=1.0, high=2.0)
    out = run(transformer_factory, lambda x: ng.dropout(x, rate), a)
    dropped = out == 0
    assert abs(dropped.mean() - rate) < 0.01
    assert_close(out[~dropped], a[~dropped] / (1 - rate))


def test_dropout_mask_depends_on_seed_and_call(transformer_factory):
    a = np.ones((50, 40), dtype=np.float32)
    x = ng.placeholder(a.shape)
    t1, t2 = transformer_factory(), transformer_factory()
    first = t1.computation(ng.dropout(x, 0.5, seed=7), x)
    same_seed = t2.computation(ng.dropout(x, 0.5, seed=7), x)
    other_seed = t2.computation(ng.dropout(x, 0.5, seed=8), x)
    call0 = first(a)
    np.testing.assert_array_equal(call0, same_seed(a))
    assert (call0 != other_seed(a)).mean() > 0.3
    call1 = first(a)
    assert (call0 != call1).mean() > 0.3
    np.testing.assert_array_equal(call1, same_seed(a))


def test_dropout_masks_of_one_call_are_independent(transformer_factory):
    a = np.ones((50, 40), dtype=np.float32)
    out = run(transformer_factory, lambda x: ng.concat([ng.dropout(x, 0.5),
                                                        ng.dropout(x, 0.5)], axis=0), a)
    assert (out[:50] != out[50:]).mean() > 0.3


# ---- cross entropy ---------------------------------------------------------------------------

def reference_cross_entropy(logits, labels, mask=None):
    picked = -reference_log_softmax(logits, -1)[np.arange(len(labels)), labels]
    if mask is None:
        return picked.mean()
    return picked[mask].sum() / max(mask.sum(), 1)


def test_cross_entropy(transformer_factory):
    logits, labels = rand(8, 5, low=-4, high=4), rng.integers(0, 5, 8)
    out = run(transformer_factory, ng.cross_entropy, logits, labels)
    assert out.shape == () and out.dtype == np.float32
    assert_close(out, reference_cross_entropy(logits, labels))


def test_cross_entropy_with_int32_labels(transformer_factory):
    logits, labels = rand(6, 3), rng.integers(0, 3, 6).astype(np.int32)
    assert_close(run(transformer_factory, ng.cross_entropy, logits, labels),
                 reference_cross_entropy(logits, labels))


@pytest.mark.parametrize("mask_dtype", [np.bool_, np.float32])
def test_cross_entropy_with_mask(transformer_factory, mask_dtype):
    logits, labels = rand(10, 4, low=-4, high=4), rng.integers(0, 4, 10)
    mask = np.zeros(10, dtype=bool)
    mask[[1, 4, 5, 9]] = True
    out = run(transformer_factory, ng.cross_entropy, logits, labels, mask.astype(mask_dtype))
    assert_close(out, reference_cross_entropy(logits, labels, mask))


def test_cross_entropy_with_a_count_divides_the_masked_sum_by_it(transformer_factory):
    # A partition's share of the whole graph's mean (ngnn.distributed): its rows' terms
    # over the count of every partition's masked rows.
    logits, labels = rand(6, 3, low=-4, high=4), rng.integers(0, 3, 6)
    mask = np.array([True, False, True, True, False, True])
    out = run(transformer_factory, lambda x, y, m: ng.cross_entropy(x, y, m, count=10),
              logits, labels, mask)
    assert_close(out, reference_cross_entropy(logits, labels, mask) * mask.sum() / 10)


def test_cross_entropy_with_empty_mask_is_zero(transformer_factory):
    logits, labels = rand(4, 3), rng.integers(0, 3, 4)
    out = run(transformer_factory, ng.cross_entropy, logits, labels, np.zeros(4, dtype=bool))
    assert out == 0


# ---- assignment ------------------------------------------------------------------------------

def test_assign_returns_and_stores_the_new_value(transformer_factory):
    t = transformer_factory()
    v = ng.variable((2, 3), initial_value=np.arange(6).reshape(2, 3), name="v")
    x = ng.placeholder((2, 3), name="x")
    step = t.computation(ng.assign(v, v * 2.0 + x), x)
    a = rand(2, 3)
    first = step(a)
    assert_close(first, np.arange(6).reshape(2, 3) * 2 + a)
    assert_close(t.computation(v)(), first)
    assert_close(step(a), first * 2 + a)


def test_updates_land_and_return_nothing(transformer_factory):
    t = transformer_factory()
    v = ng.variable((2, 3), initial_value=np.arange(6).reshape(2, 3), name="v")
    x = ng.placeholder((2, 3), name="x")
    total = ng.sum(v * x)
    step = t.computation(total, x, updates=[ng.assign(v, v * 2.0 + x)])
    a = rand(2, 3)
    assert_close(step(a), np.sum(np.arange(6).reshape(2, 3) * a))    # the old v
    assert_close(t.computation(v)(), np.arange(6).reshape(2, 3) * 2 + a)
    listed = t.computation([total], x, updates=[ng.assign(v, v + 1.0)])(a)
    assert isinstance(listed, tuple) and len(listed) == 1


def test_updates_must_be_assignments():
    x = ng.placeholder((2,), name="x")
    with pytest.raises(TypeError, match="updates must be ng.assign ops"):
        ngt.make_transformer("numpy").computation(x, x, updates=[x * 2.0])


def test_assign_broadcasts_and_casts(transformer_factory):
    t = transformer_factory()
    v = ng.variable((2, 3), dtype=np.float32, name="v")
    x = ng.placeholder((3,), dtype=np.float64, name="x")
    out = t.computation(ng.assign(v, x), x)(np.array([1.0, 2.0, 3.0]))
    assert out.dtype == np.float32
    assert_close(out, np.tile([1.0, 2.0, 3.0], (2, 1)))


# ---- dtype rules -----------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_python_scalars_keep_the_float_dtype(transformer_factory, dtype):
    a = rand(3, dtype=dtype)
    out = run(transformer_factory, lambda x: (x * 2.0 + 1) / 3.0 - 0.5 ** x, a)
    assert out.dtype == dtype
    assert_close(out, (a * 2 + 1) / 3 - 0.5 ** a)


@pytest.mark.parametrize("fn", [ng.exp, ng.relu, ng.sigmoid, lambda x: ng.sum(x, axis=0),
                                lambda x: ng.softmax(x), lambda x: ng.max(x),
                                lambda x: ng.dot(x, x.T), lambda x: ng.mean(x)],
                         ids=["exp", "relu", "sigmoid", "sum", "softmax", "max", "dot", "mean"])
def test_float32_stays_float32(transformer_factory, fn):
    out = run(transformer_factory, fn, rand(3, 4))
    assert out.dtype == np.float32


def test_mixed_float_widths_promote_like_numpy(transformer_factory):
    a, b = rand(3), rand(3, dtype=np.float64)
    out = run(transformer_factory, operator.add, a, b)
    assert out.dtype == np.result_type(a, b) == np.float64
    assert_close(out, a + b)


def test_integer_arithmetic_stays_integer(transformer_factory):
    a = np.arange(6, dtype=np.int32).reshape(2, 3)
    out = run(transformer_factory, lambda x: x * 3 + 1 - x, a)
    assert out.dtype == np.int32
    np.testing.assert_array_equal(out, a * 3 + 1 - a)


def test_integers_with_a_float_scalar_become_float(transformer_factory):
    a = np.arange(4, dtype=np.int64)
    out = run(transformer_factory, lambda x: x * 0.5, a)
    assert out.dtype.kind == "f"
    assert_close(out, a * 0.5)


def test_constant_defaults_to_float32():
    assert ng.constant(2.0).dtype == np.float32
    assert ng.constant(np.ones(3)).dtype == np.float32
    assert ng.constant(np.ones(3), dtype=np.float64).dtype == np.float64
    assert ng.constant(3).dtype.kind == "i"


def test_comparison_operators_give_masks(transformer_factory):
    a, b = rand(3, 4), rand(3, 4)
    b[0] = a[0]                                  # equal elements for >=, <= and ng.equal
    fns = [lambda x, y: x > y, lambda x, y: x >= y, lambda x, y: x < y, lambda x, y: x <= y]
    for fn in fns + [ng.equal]:
        expected = (np.equal(a, b) if fn is ng.equal else fn(a, b)).astype(np.float32)
        assert_close(run(transformer_factory, fn, a, b), expected)
