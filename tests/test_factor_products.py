"""FactorProducts turns sums of products that share an operand into one product. It is not
in the default pipeline (it lengthens the lives of the summed gradients, see
docs/performance.md): users add it with `passes=[FactorProducts()]`."""
import numpy as np
import pytest

import ngnn as ng
from ngnn import nn
from ngnn.passes import FactorProducts

from test_fusion import random_graph


def dots_after(comp, pass_name):
    return comp.ir_after(pass_name).count("dot(")


@pytest.mark.parametrize("seed", range(4))
def test_results_are_preserved(transformer_factory, seed):
    rng = np.random.default_rng(seed)
    n, k, m = (int(v) for v in rng.integers(1, 9, 3))
    a = ng.placeholder((n, k), name="a")
    b, c = (ng.constant(rng.normal(size=(k, m)).astype(np.float32)) for _ in range(2))
    d = ng.constant(rng.normal(size=(m, n)).astype(np.float32))
    left = ng.dot(a, b) + ng.dot(a, c) + ng.dot(a, b * 2.0)     # shared on the left, 3 terms
    right = ng.dot(d, a) + ng.dot(ng.transpose(left), a)        # shared on the right
    av = rng.normal(size=(n, k)).astype(np.float32)
    outputs = []
    for optimize in (True, False):
        t = transformer_factory(optimize=optimize, passes=[FactorProducts()] if optimize else [])
        comp = t.computation([left, right], a)
        outputs.append(comp(av))
        if optimize:
            assert dots_after(comp, "CSE") == 5 and dots_after(comp, "FactorProducts") == 2
    for x, y in zip(*outputs):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-5)


def test_a_product_read_elsewhere_is_left_alone():
    a = ng.placeholder((3, 4), name="a")
    b, c = ng.constant(np.ones((4, 2), np.float32)), ng.constant(np.eye(4, 2, dtype=np.float32))
    p = ng.dot(a, b)
    with ng.transformers.make_transformer("numpy", passes=[FactorProducts()]) as t:
        comp = t.computation([p + ng.dot(a, c), p], a)
        comp(np.ones((3, 4), np.float32))
        assert dots_after(comp, "FactorProducts") == 2


def test_gat_weight_gradient_is_one_product():
    """GATConv applies fc to the vertex and to its neighbours (one forward product after
    CSE): its gradient is one product too, not two."""
    g = random_graph(np.random.default_rng(0))
    layer = nn.GATConv(6, 3, 2, seed=0)
    x = ng.placeholder((g.num_nodes, 6), name="x")
    loss = ng.sum(layer(g, x))
    (grad_fc,) = ng.grad(loss, [layer.fc])
    with ng.transformers.make_transformer("numpy", passes=[FactorProducts()]) as t:
        comp = t.computation(grad_fc, x)
        comp(np.ones(x.shape, np.float32))
        assert dots_after(comp, "CSE") == 3 and dots_after(comp, "FactorProducts") == 2
