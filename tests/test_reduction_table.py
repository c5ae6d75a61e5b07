"""The reduction table (ngnn/op_graph/combiners.py), through the row added to it last:
"prod", the product of the values over each vertex's edges (0 at a vertex without edges).
One row makes it run on NumPy fused and unfused, on the GPU (its edge reductions, a heavy
row's chunk partials and axis reductions read the table), chunk by chunk, over 2 ranks
and in the simulator, with an exact gradient (also at zero factors)."""
import numpy as np
import pytest

import ngnn as ng
from ngnn import simulate
from ngnn import transformers as ngt
from ngnn.op_graph.combiners import COMBINERS
from ngnn.transformers.gpu.schedule import CHUNK

from test_distributed import driver
from test_graph_ops import E, F, N, check_gradients, random_graph, weighted_sum


def reference_prod(g, x, at):
    ends = g.dst if at == "dst" else g.src
    out = np.ones((g.num_nodes,) + x.shape[1:])
    np.multiply.at(out, ends, x)
    out[np.bincount(ends, minlength=g.num_nodes) == 0] = 0
    return out


def factors(rng, zeros=True):
    """Edge values near 1 (products of many stay in range); with `zeros`, some exactly 0,
    so some vertices have one zero factor and some two."""
    x = rng.uniform(0.5, 1.5, (E, F)) * rng.choice([-1.0, 1.0], (E, F))
    if zeros:
        x[[0, 9, 10, 20], 0] = 0.0
        x[[9, 30], 1] = 0.0
    return x


@pytest.mark.parametrize("at", ["dst", "src"])
def test_product_aggregation_and_its_gradient(transformer_factory, at):
    g, rng = random_graph(2), np.random.default_rng(3)
    e = ng.placeholder((E, F), dtype=np.float64, name="e")
    x = factors(rng)
    prod = ng.aggregate(e, g, at=at, reduce="prod")
    with transformer_factory() as t:
        np.testing.assert_allclose(t.computation(prod, e)(x), reference_prod(g, x, at),
                                   rtol=1e-12)
        # A product is linear in each factor: central differences are exact, at 0 too.
        check_gradients(t, weighted_sum(prod, rng), [e], [x], rng, coords=12)
        zero_rows = [0, 9, 10, 20, 30]
        grad = t.computation(ng.grad(ng.sum(prod), e), e)(x)
        ends = getattr(g, at)
        for k in zero_rows:
            others = np.delete(np.arange(E), k)
            expected = np.prod(x[others][ends[others] == ends[k]], axis=0)
            np.testing.assert_allclose(grad[k], expected, rtol=1e-12)


def test_product_of_gathered_values_in_a_fused_group(transformer_factory):
    """prod(x[src] * w) at each destination: a gather, an edge op and the product in one
    fused group (K.segment_reduce reads the table)."""
    g, rng = random_graph(6), np.random.default_rng(7)
    h = ng.placeholder((N, F), dtype=np.float64, name="h")
    w = ng.placeholder((E, 1), dtype=np.float64, name="w")
    x, wv = rng.uniform(0.5, 1.5, (N, F)), rng.uniform(0.5, 1.5, (E, 1))
    out = ng.aggregate(ng.gather(h, g, by="src") * w, g, reduce="prod")
    with transformer_factory() as t:
        comp = t.computation(out, h, w)
        np.testing.assert_allclose(comp(x, wv), reference_prod(g, x[g.src] * wv, "dst"),
                                   rtol=1e-12)
        if t.name == "numpy":
            assert ("K.segment_reduce(" in comp.source) == t.fusion
        check_gradients(t, weighted_sum(out, rng), [h, w], [x, wv], rng, coords=6)


@pytest.mark.parametrize("dtype,rtol", [(np.float64, 1e-12), (np.float32, 1e-5)])
def test_product_over_a_heavy_row_equals_numpy(transformer_factory, dtype, rtol):
    """A star whose hub has more in-edges than a chunk of the GPU's edge schedule: there
    partial kernels multiply each chunk's edges and fold the chunks' partials by the
    table's c_fold in chunk order. Forward and gradient (one zero factor at the hub, so
    its other factors' gradient is 0 and the zero's is the product of the rest) equal the
    NumPy transformer's."""
    leaves = 2 * CHUNK + 7
    leaf = np.arange(1, leaves + 1)
    g = ng.Graph.from_edges(np.concatenate([leaf, leaf[:-1]]),
                            np.concatenate([np.zeros(leaves, np.int64), leaf[1:]]),
                            num_nodes=leaves + 1)
    rng = np.random.default_rng(11)
    h = ng.placeholder((g.num_nodes, 3), dtype=dtype, name="h")
    x = (rng.uniform(0.95, 1.05, (g.num_nodes, 3)) *
         rng.choice([-1.0, 1.0], (g.num_nodes, 3))).astype(dtype)
    x[5, 1] = 0.0
    prod = ng.aggregate(ng.gather(h, g, by="src"), g, reduce="prod")
    loss = ng.sum(prod * ng.constant(rng.standard_normal(prod.shape).astype(dtype)))
    with ngt.make_transformer("numpy") as t:
        expected = t.computation([prod, ng.grad(loss, h)], h)(x)
    with transformer_factory() as t:
        comp = t.computation([prod, ng.grad(loss, h)], h)
        got = comp(x)
        if t.name == "gpu":
            assert "partial.j2" in {k.template for k in comp.executor.kernels}
    for a, b in zip(got, expected):
        np.testing.assert_allclose(a, b, rtol=rtol, atol=rtol * np.abs(b).max())


@pytest.mark.parametrize("chunks", [2, 3])
def test_product_chunk_by_chunk_equals_one_run(chunks):
    """Partial products of edge pieces fold on the host by the table's ufunc, from its
    identity; a vertex whose edges all lie in other pieces keeps no partial 0."""
    g, rng = random_graph(8), np.random.default_rng(9)
    h = ng.placeholder((N, F), dtype=np.float64, name="h")
    x = rng.uniform(0.5, 1.5, (N, F))
    x[3, 0] = 0.0
    out = ng.relu(ng.aggregate(ng.gather(h, g, by="src"), g, reduce="prod")) + 1.0
    loss = ng.sum(out * out)
    with ngt.make_transformer("numpy") as t:
        whole = t.computation([out, ng.grad(loss, h)], h)(x)
    with ngt.make_transformer("numpy", chunks=chunks) as t:
        comp = t.computation([out, ng.grad(loss, h)], h)
        pieces = comp(x)
        assert comp.stats["chunks"] == chunks
    for a, b in zip(pieces, whole):
        np.testing.assert_allclose(a, b, rtol=1e-12)


def test_product_over_two_ranks_equals_the_whole_graph():
    """Mirror copies without local edges hold the identity, ranks fold by the ufunc."""
    assert driver(2, "prod")["prod"] < 1e-12


def test_simulator_prices_a_product_as_a_segment_reduction():
    g = random_graph(2)
    e = ng.placeholder((E, F), name="e")
    with ngt.make_transformer("numpy") as t:
        comp = t.computation(ng.aggregate(e, g, reduce="prod"), e)
        topology = simulate.Topology([simulate.Device(
            kind="cpu", flops=1e10, memory_bandwidth=1e10, memory_bytes=2 ** 33,
            call_overhead=1e-6)])
        report = simulate.predict(comp, topology)
    assert report.step_time > 0 and report.ops


def test_every_kind_of_the_table_aggregates_on_numpy():
    """What one row declares is all an aggregation needs: each kind against NumPy's own
    reduction of the same values."""
    g, rng = random_graph(2), np.random.default_rng(3)
    e = ng.placeholder((E, F), dtype=np.float64, name="e")
    x = factors(rng, zeros=False)
    order = np.argsort(g.dst, kind="stable")
    with ngt.make_transformer("numpy") as t:
        for name, row in COMBINERS.items():
            got = t.computation(ng.aggregate(e, g, reduce=name), e)(x)
            for v in range(N):
                edges = x[order][g.dst[order] == v]
                expected = getattr(np, row.numpy_reduce)(edges, axis=0) if len(edges) else 0
                np.testing.assert_allclose(got[v], expected, rtol=1e-12, err_msg=name)


def test_an_unknown_kind_names_the_table():
    g = random_graph(2)
    with pytest.raises(ValueError, match="reduce must be one of .*'prod'"):
        ng.aggregate(ng.placeholder((E, F)), g, reduce="median")
