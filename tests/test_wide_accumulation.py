"""WideAccumulation (`wide_accumulation=True`): float32 sums are accumulated in float64 and
rounded once, so they do not depend on the order or grouping of their terms, and the
results stay those of the op-graph (closer to float64 than float32 accumulation gets)."""
import numpy as np
import ngnn as ng
rng = np.random.default_rng(11)


def test_rows_of_a_product_do_not_depend_on_how_many_rows(transformer_factory):
    """A float32 BLAS product rounds a row differently with another number of rows (its
    blocking); the widened product gives every row the same bits, as a rank computing only
    its masters' rows needs."""
    w_value = rng.standard_normal((300, 16)).astype(np.float32)
    x_value = rng.standard_normal((500, 300)).astype(np.float32)
    rows = np.sort(rng.choice(500, 137, replace=False))
    t = transformer_factory(wide_accumulation=True)
    results = []
    for value in (x_value, x_value[rows]):
        x = ng.placeholder(value.shape, name="x")
        results.append(t.computation(ng.dot(x, ng.constant(w_value)), x)(value))
    np.testing.assert_array_equal(results[0][rows], results[1])
    exact = (x_value.astype(np.float64) @ w_value.astype(np.float64)).astype(np.float32)
    np.testing.assert_array_equal(results[0], exact)


def test_sums_do_not_depend_on_edge_order(transformer_factory):
    """An aggregation, its gradient (an aggregation at the other end) and a weight
    gradient X^T G give the same bits whatever the order of the edge list."""
    n, e, f = 40, 400, 5
    src, dst = rng.integers(0, n, e), rng.integers(0, n, e)
    x_value = (rng.standard_normal((n, f)) * 10.0 ** rng.integers(-3, 3, (n, 1))).astype(
        np.float32)
    w_value = rng.standard_normal((f, 3)).astype(np.float32)
    outputs = []
    for order in (np.arange(e), rng.permutation(e)):
        g = ng.Graph.from_edges(src[order], dst[order], num_nodes=n)
        x = ng.placeholder((n, f), name="x")
        w = ng.placeholder((f, 3), name="w")
        h = ng.dot(ng.aggregate(ng.gather(x, g, by="src"), g, at="dst", reduce="mean"), w)
        loss = ng.sum(ng.aggregate(ng.gather(h * h, g, by="dst"), g, at="src"))
        comp = transformer_factory(wide_accumulation=True).computation(
            [h, ng.grad(loss, x), ng.grad(loss, w)],
                                                 x, w)
        outputs.append(comp(x_value, w_value))
    for a, b in zip(*outputs):
        np.testing.assert_array_equal(a, b)


def test_ir_shows_float64_accumulation_and_one_rounding(transformer_factory):
    x = ng.placeholder((30, 4), name="x")
    w = ng.placeholder((4, 2), name="w")
    loss = ng.sum(ng.dot(x, w))
    comp = transformer_factory(wide_accumulation=True).computation(
        [loss, ng.grad(loss, w)], x, w)
    value = rng.standard_normal((30, 4)).astype(np.float32)
    got_loss, got_grad = comp(value, np.ones((4, 2), np.float32))
    np.testing.assert_allclose(got_loss, value.astype(np.float64).sum() * 2, rtol=1e-6)
    column = value.astype(np.float64).sum(axis=0).astype(np.float32)
    np.testing.assert_array_equal(got_grad, np.stack([column, column], axis=1))
    assert "Float64[30,2] = dot(" in comp.ir and "dtype=float32)" in comp.ir


def test_off_by_default_leaves_float32_sums(transformer_factory):
    x = ng.placeholder((30, 4), name="x")
    comp = transformer_factory().computation(ng.sum(x, axis=0), x)
    value = rng.standard_normal((30, 4)).astype(np.float32)
    np.testing.assert_allclose(comp(value), value.astype(np.float64).sum(axis=0), rtol=1e-4)
    assert "Float64" not in comp.ir
