"""ZeroRowProducts: products and column sums over rows that batch norm zeroed (past a live
count fed at run time) skip those rows, with the values of the whole products; products
whose rows are not known to be 0 stay whole."""
import numpy as np

import ngnn as ng
from ngnn.op_graph import BatchNormApply, BatchNormStats

ROWS, FEATURES, OUT = 12, 5, 3


def step():
    results, params = mlp_step(ng.placeholder((1,), dtype=np.float64, name="live"))
    return (results,) + tuple(params)


def mlp_step(live):
    """relu(batch_norm(x @ W1 + b1)) @ W2 + b2 over the live rows of x, its loss against
    fixed weights, and the gradients of every parameter and of x."""
    rng = np.random.default_rng(0)
    x = ng.placeholder((ROWS, 4), dtype=np.float64, name="x")
    w1 = ng.placeholder((4, FEATURES), dtype=np.float64, name="w1")
    b1 = ng.placeholder((FEATURES,), dtype=np.float64, name="b1")
    w2 = ng.placeholder((FEATURES, OUT), dtype=np.float64, name="w2")
    b2 = ng.constant(rng.normal(size=OUT), dtype=np.float64)
    gamma = ng.constant(rng.uniform(0.5, 1.5, FEATURES), dtype=np.float64)
    beta = ng.constant(rng.normal(size=FEATURES), dtype=np.float64)
    h = ng.dot(x, w1) + b1
    z = ng.relu(BatchNormApply(h, BatchNormStats(h, live), gamma, beta, live))
    out = ng.dot(z, w2) + b2
    up = ng.constant(rng.normal(size=(ROWS, OUT)), dtype=np.float64)
    loss = ng.sum(ng.tanh(out) * up)
    return [loss, z] + ng.grad(loss, [x, w1, b1, w2]), [x, w1, b1, w2, live]


def inputs(n):
    rng = np.random.default_rng(1)
    x = rng.normal(size=(ROWS, 4))
    x[n:] = 1e6            # padding rows: finite, and nothing real may depend on them
    return [x, rng.normal(size=(4, FEATURES)), rng.normal(size=FEATURES),
            rng.normal(size=(FEATURES, OUT)), np.array([float(n)])]


def test_products_over_zero_rows_equal_the_whole_products(transformer_factory):
    """The step with the pass (numpy) or without it (optimize=False, and the GPU, which
    decomposes) gives the same loss, activations and gradients for every live count."""
    # Two graphs: passes rewrite the ops they are given, for every computation over them.
    comp = transformer_factory().computation(*step())
    plain = transformer_factory(optimize=False).computation(*step())
    for n in (ROWS, 7, 1, 0):
        got, expected = comp(*inputs(n)), plain(*inputs(n))
        for g, e in zip(got, expected):
            np.testing.assert_allclose(g, e, rtol=1e-11, atol=1e-11)
        assert not got[1][n:].any()                  # batch norm zeroed the padding


def test_the_numpy_step_computes_the_live_rows_only():
    """Which products skip rows: z @ W2 and W2's gradient z.T @ d (z is zeroed past the
    live rows), and those reading batch norm's input gradient dh: x's gradient dh @ W1.T,
    W1's x.T @ dh and b1's column sum of dh. x @ W1 (x is not known to be 0 anywhere) and
    d @ W2.T (the gradient of tanh reaches every row) stay whole."""
    from ngnn import transformers as ngt
    with ngt.make_transformer("numpy") as t:
        source = t.computation(*step()).source
    products = [line.split("#")[1] for line in source.splitlines()
                if "np.matmul(" in line or "K.zero_row_matmul(" in line]
    skipping = [p for p in products if "zero_row_dot" in p]
    assert len(skipping) == 5 and len(products) == 7, products
    assert sum("contract=True" in p for p in skipping) == 3, skipping
