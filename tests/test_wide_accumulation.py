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


def test_rows_gathered_in_float32_and_widened_are_loaded_once(transformer_factory):
    """A sum over edges of per-head weights times a gathered y (the widened message) next
    to a float32 use of the same gathered rows (a max here; the logits' gradient in GAT's
    backward): the widened message casts the float32 gather's rows instead of gathering a
    widened y, so a walk loads each row once; fused NumPy still runs it as per-head sparse
    products, from a widened copy of y. Exact: the float64 sums rounded once."""
    n, e, heads, f = 30, 300, 3, 4
    src, dst = rng.integers(0, n, e), rng.integers(0, n, e)
    g = ng.Graph.from_edges(src, dst, num_nodes=n)
    y_value = rng.standard_normal((n, heads, f)).astype(np.float32)
    a_value = rng.standard_normal((n, heads, 1)).astype(np.float32)
    y = ng.placeholder((n, heads, f), name="y")
    a = ng.placeholder((n, heads, 1), name="a")
    rows = ng.gather(y, g, by="dst")
    total = ng.aggregate(ng.gather(a, g, by="src") * rows, g, at="src", reduce="sum")
    peak = ng.aggregate(rows, g, at="src", reduce="max")
    mean = ng.aggregate(rows, g, at="src", reduce="mean")
    t = transformer_factory(wide_accumulation=True)
    comp = t.computation([total, peak, mean], y, a)
    got_total, got_peak, got_mean = comp(y_value, a_value)
    exact, count = np.zeros((n, heads, f)), np.bincount(src, minlength=n)
    np.add.at(exact, src, a_value[src].astype(np.float64) * y_value[dst])
    np.testing.assert_array_equal(got_total, exact.astype(np.float32))
    exact = np.zeros((n, heads, f))
    np.add.at(exact, src, y_value[dst].astype(np.float64))
    has_edges = count > 0
    np.testing.assert_array_equal(
        got_mean[has_edges], (exact[has_edges] / count[has_edges, None, None]).astype(np.float32))
    highest = np.full((n, heads, f), -np.inf, np.float32)
    np.maximum.at(highest, src, y_value[dst])
    np.testing.assert_array_equal(got_peak[has_edges], highest[has_edges])
    ir = comp.ir_after("WideAccumulation")
    assert ir.count("gather_dst(") == 1 and "edge::cast(" in ir, ir     # y's rows, once
    if "K.blocks(" in getattr(comp, "source", ""):        # fused NumPy
        source = comp.source
        assert "K.by_head(t_y, 3, whc_y)" in source and "K.gather_sum(hc_y," in source
        assert "np.ascontiguousarray(t_y, dtype=np.float64)" in source and \
            "K.gather_sum(c_y," in source
