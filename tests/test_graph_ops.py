"""Graph ops (Gather, Aggregate, EdgeSoftmax) against NumPy references, and their gradients
against central finite differences in float64."""
import numpy as np
import pytest

import ngnn as ng

N, E, F = 14, 45, 3


def random_graph(seed):
    """A multigraph with self-loops, parallel edges, vertices without in-edges or
    out-edges, and isolated vertices (the last three)."""
    rng = np.random.default_rng(seed)
    src = rng.integers(0, N - 3, E)
    dst = rng.integers(2, N - 3, E)      # vertices 0 and 1 have no in-edges
    src[:4] = dst[:4]                    # self-loops
    src[4:7], dst[4:7] = src[7], dst[7]  # parallel edges
    return ng.Graph.from_edges(src, dst, num_nodes=N)


def reference_aggregate(g, x, at, reduce):
    ends = g.dst if at == "dst" else g.src
    counts = np.bincount(ends, minlength=g.num_nodes)
    if reduce in ("sum", "mean"):
        out = np.zeros((g.num_nodes,) + x.shape[1:])
        np.add.at(out, ends, x)
        return out / np.maximum(counts, 1).reshape(-1, 1) if reduce == "mean" else out
    ufunc = np.maximum if reduce == "max" else np.minimum
    out = np.full((g.num_nodes,) + x.shape[1:], -np.inf if reduce == "max" else np.inf)
    ufunc.at(out, ends, x)
    out[counts == 0] = 0
    return out


def reference_edge_softmax(g, x, at):
    ends = g.dst if at == "dst" else g.src
    peak = reference_aggregate(g, x, at, "max")
    ex = np.exp(x - peak[ends])
    return ex / reference_aggregate(g, ex, at, "sum")[ends]


def check_gradients(t, loss, placeholders, values, rng, coords=4, eps=1e-6):
    """ng.grad against central differences at a few random coordinates of each input."""
    grads = t.computation(ng.grad(loss, placeholders), *placeholders)(*values)
    f = t.computation(loss, *placeholders)
    for i, (value, grad) in enumerate(zip(values, grads)):
        for _ in range(coords):
            idx = tuple(rng.integers(0, s) for s in value.shape)
            shifted = []
            for sign in (1, -1):
                moved = [v.copy() for v in values]
                moved[i][idx] += sign * eps
                shifted.append(f(*moved))
            numeric = (shifted[0] - shifted[1]) / (2 * eps)
            assert grad[idx] == pytest.approx(numeric, rel=1e-5, abs=1e-7), (i, idx)


def weighted_sum(out, rng):
    """A scalar that weighs every output element differently."""
    return ng.sum(out * ng.constant(rng.standard_normal(out.shape)))


@pytest.mark.parametrize("by", ["src", "dst"])
def test_gather(transformer_factory, by):
    g, rng = random_graph(0), np.random.default_rng(1)
    h = ng.placeholder((N, F), dtype=np.float64, name="h")
    x = rng.standard_normal((N, F))
    with transformer_factory() as t:
        out = t.computation(ng.gather(h, g, by=by), h)(x)
        np.testing.assert_allclose(out, x[getattr(g, by)])
        check_gradients(t, weighted_sum(ng.gather(h, g, by=by), rng), [h], [x], rng)


@pytest.mark.parametrize("at", ["dst", "src"])
@pytest.mark.parametrize("reduce", ["sum", "mean", "max", "min"])
def test_aggregate(transformer_factory, at, reduce):
    g, rng = random_graph(2), np.random.default_rng(3)
    e = ng.placeholder((E, F), dtype=np.float64, name="e")
    x = rng.standard_normal((E, F))
    with transformer_factory() as t:
        out = t.computation(ng.aggregate(e, g, at=at, reduce=reduce), e)(x)
        np.testing.assert_allclose(out, reference_aggregate(g, x, at, reduce), rtol=1e-12)
        check_gradients(t, weighted_sum(ng.aggregate(e, g, at=at, reduce=reduce), rng), [e],
                        [x], rng, coords=6)


@pytest.mark.parametrize("reduce", ["sum", "mean"])
def test_vertices_without_in_edges_get_exactly_zero(transformer_factory, reduce):
    g = random_graph(4)
    e = ng.placeholder((E, F), name="e")
    with transformer_factory() as t:
        out = t.computation(ng.aggregate(e, g, reduce=reduce), e)(
            np.random.default_rng(5).standard_normal((E, F)))
    assert np.all(np.isfinite(out))
    no_in_edges = np.bincount(g.dst, minlength=N) == 0
    assert no_in_edges.sum() >= 5
    assert np.all(out[no_in_edges] == 0)


@pytest.mark.parametrize("reduce", ["max", "min"])
def test_extreme_ties_share_the_gradient(transformer_factory, reduce):
    g = ng.Graph.from_edges([0, 1, 3], [2, 2, 2], num_nodes=4)
    e = ng.placeholder((3, 1), dtype=np.float64, name="e")
    tied = 5.0 if reduce == "max" else -5.0
    x = np.array([[tied], [tied], [0.0]])
    loss = ng.sum(ng.aggregate(e, g, reduce=reduce))
    with transformer_factory() as t:
        grad = t.computation(ng.grad(loss, e), e)(x)
        np.testing.assert_allclose(grad, [[0.5], [0.5], [0.0]])
        # A central difference on one of two tied values also sees half a step.
        check_gradients(t, loss, [e], [x], np.random.default_rng(0), coords=3)


def test_max_of_gathered_parallel_edges(transformer_factory):
    """Parallel edges carry equal gathered values: ties whose gradients add up again."""
    g, rng = random_graph(6), np.random.default_rng(7)
    h = ng.placeholder((N, F), dtype=np.float64, name="h")
    x = rng.standard_normal((N, F))
    out = ng.aggregate(ng.gather(h, g, by="src"), g, reduce="max")
    with transformer_factory() as t:
        check_gradients(t, weighted_sum(out, rng), [h], [x], rng, coords=8)


@pytest.mark.parametrize("at", ["dst", "src"])
def test_edge_softmax(transformer_factory, at):
    g, rng = random_graph(8), np.random.default_rng(9)
    e = ng.placeholder((E, 2), dtype=np.float64, name="e")
    x = 3 * rng.standard_normal((E, 2))
    with transformer_factory() as t:
        out = t.computation(ng.edge_softmax(g, e, at=at), e)(x)
        np.testing.assert_allclose(out, reference_edge_softmax(g, x, at), rtol=1e-12)
        check_gradients(t, weighted_sum(ng.edge_softmax(g, e, at=at), rng), [e], [x], rng,
                        coords=6)


def test_edge_softmax_is_stable_for_large_logits(transformer_factory):
    g = random_graph(10)
    e = ng.placeholder((E, 1), name="e")
    x = np.full((E, 1), 1000.0, dtype=np.float32)
    with transformer_factory() as t:
        out = t.computation(ng.edge_softmax(g, e), e)(x)
    np.testing.assert_allclose(out[:, 0], 1.0 / np.bincount(g.dst, minlength=N)[g.dst],
                               rtol=1e-6)
