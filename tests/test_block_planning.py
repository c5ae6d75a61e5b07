"""The NumPy transformer's block plan (ngnn/passes/block_planning.py): made once by a pass,
before any code is written; the group writer renders it and the simulator prices it."""
import re

import numpy as np
import pytest

from ngnn import simulate
from ngnn.cli import make_parser
from ngnn.naming import value_identifier
from ngnn.passes import BlockPlan, FusedGroup
from ngnn.recipes import fill_defaults, load_dataset, make_trainer

SBM = ["--dataset", "sbm", "--num-nodes", "300", "--avg-degree", "6", "--num-features", "8",
       "--num-classes", "3"]


def gat_trainer(**options):
    from ngnn import transformers as ngt
    args = make_parser().parse_args(["bench", "--model", "gat", *SBM])
    fill_defaults(args)
    return make_trainer(args, load_dataset(args), 0,
                        transformer=ngt.make_transformer("numpy", **options))


def test_the_plan_is_made_before_the_code_and_the_module_runs_it():
    """After the passes alone (no code yet) every fused group has its block plan; a plan
    changed then is the one the module runs: its block loops hold the plan's edges, its
    sparse products are the plan's (one K.gather_sum each), and the step computes what
    the default plan's does (a vertex's edges never straddle two blocks)."""
    default, changed = gat_trainer(), gat_trainer()
    comp = changed.train_step
    comp.plan()
    assert not comp.transformed         # no code written yet
    plan = comp.block_plan
    assert isinstance(plan, BlockPlan)
    groups = [s for s in comp.steps if isinstance(s, FusedGroup)]
    assert groups and set(plan.groups) == set(groups)
    assert any(blocks.products for blocks in plan.groups.values())
    for blocks in plan.groups.values():
        assert blocks.block_edges > 7
        blocks.block_edges = 7
    source = comp.source
    loops = re.findall(r"K\.blocks\(\w+, '(?:dst|src)', (\d+)\)", source)
    assert loops == ["7"] * len(groups)
    products = sum(len(blocks.products) for blocks in plan.groups.values())
    assert source.count("K.gather_sum(") == products
    for _ in range(2):
        assert np.isclose(changed.step(), default.step(), rtol=1e-5)
    for trainer in (default, changed):
        trainer.transformer.close()


def test_stored_edge_values_in_csr_order_are_read_as_slices():
    """An edge value the plan stores in in-CSR order is read by a destination-parallel
    block as a slice of its CSR, never through edge ids. (GAT's step recomputes every edge
    value by default; with little recomputation allowed it stores some.)"""
    trainer = gat_trainer(max_recompute=1)
    comp = trainer.train_step
    comp.transform()
    plan = comp.block_plan
    assert plan.csr_ordered
    for blocks in plan.groups.values():
        for op in plan.csr_ordered:
            assert blocks.in_csr_slices(op) == (blocks.group.at == "dst")
    for op in plan.csr_ordered:
        identifier = value_identifier(comp.value_names[op])
        assert f"{identifier}[p0:p1]" in comp.source
        assert f"np.take({identifier}, eids" not in comp.source
    trainer.transformer.close()


def test_the_simulator_prices_the_plan_the_module_runs():
    """The simulator reads the computation's own block plan: smaller blocks in the plan,
    more statements priced (each paying the call overhead)."""
    from ngnn.simulate.numpy_plan import NumPyPlan
    topology = simulate.Topology([simulate.Device(
        kind="cpu", flops=1e10, memory_bandwidth=1e10, memory_bytes=2 ** 33,
        call_overhead=1e-6)])
    trainer = gat_trainer()
    comp = trainer.train_step
    comp.transform()
    assert NumPyPlan(comp).groups is comp.block_plan.groups
    before = simulate.predict(comp, topology).by_kind()["fused"]
    for blocks in comp.block_plan.groups.values():
        blocks.block_edges = 7
    after = simulate.predict(comp, topology).by_kind()["fused"]
    assert after > before
    trainer.transformer.close()


def transformer_conv_step(edge_gradient):
    """A float64 TransformerConv training step with edge features on a random multigraph
    (self loops, duplicates, vertices without in-edges), with the gradient with respect
    to the edge features or without: results, placeholders, feeds."""
    import ngnn as ng
    from ngnn import nn
    rng = np.random.default_rng(0)
    n, e = 40, 300
    g = ng.Graph.from_edges(rng.integers(0, n - 5, e), rng.integers(0, n - 5, e),
                            num_nodes=n)
    x, ef = rng.standard_normal((n, 6)), rng.standard_normal((e, 3))
    h = ng.placeholder(x.shape, dtype=np.float64, name="h")
    edges = ng.placeholder(ef.shape, dtype=np.float64, name="e")
    conv = nn.TransformerConv(6, 4, 3, edge_dim=3, seed=0, dtype=np.float64)
    out = conv(g, h, edges, training=True)
    loss = ng.sum(out * out)
    wrt = [h, edges] if edge_gradient else [h]
    return [loss] + ng.grad(loss, wrt + conv.parameters()), (h, edges), (x, ef)


@pytest.mark.parametrize("edge_gradient", [False, True])
def test_transformer_convs_edge_feature_products_are_never_made_per_edge(edge_gradient):
    """TransformerConv with edge features: (W_e q) . e is one sparse product per block
    over (W_e q) laid out (N, F, H) (no gathered copy, no product), its two sums of a
    per-head weight times the edge features (sum a e forward, its gradient backward) are
    sparse products over the block's rows (K.weighted_row_sum), and q . k is a row sum of
    a written product (K.row_sums). Asked for the edge features' gradient, the
    source-side walk gathers the per-vertex (W_e q) rows themselves: from a contiguous
    copy, never from the transposed product. The step equals the unfused NumPy one."""
    from ngnn import transformers as ngt
    from ngnn.op_graph import Gather, Transpose
    results, placeholders, feeds = transformer_conv_step(edge_gradient)
    with ngt.make_transformer("numpy") as t, \
            ngt.make_transformer("numpy", fusion=False) as unfused:
        comp = t.computation(results, *placeholders)
        comp.transform()
        plans = list(comp.block_plan.groups.values())
        dots = sum(len(blocks.gathered_dots) for blocks in plans)
        assert dots == (3 if edge_gradient else 5)   # logits' and their gradient's terms
        assert sum(len(blocks.row_products) for blocks in plans) == 2
        assert all(a.shape == product.shape for blocks in plans
                   for product in blocks.row_sums.values() for a in product.args)
        tables = {x for blocks in plans for x in blocks.contiguous_tables}
        assert bool(tables) == edge_gradient
        source = comp.source
        assert source.count("K.gathered_row_dot(") == dots
        assert source.count("K.weighted_row_sum(") == 2
        assert source.count("K.row_sums(") == sum(len(blocks.row_sums) for blocks in plans) > 0
        transposed = {op.args[0] for blocks in plans for op in blocks.group.ops
                      if isinstance(op, Gather) and isinstance(op.args[0], Transpose)}
        for x in transposed:
            identifier = value_identifier(comp.value_names[x])
            assert f"np.take({identifier}," not in source
            assert (f"np.take(wc{identifier[1:]}," in source) == (x in tables)
        got = comp(*feeds)
        want = unfused.computation(results, *placeholders)(*feeds)
        for a, b in zip(got, want):
            np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-10)


def test_weighted_row_sum_is_the_segment_sum_of_each_weight_times_its_row():
    """K.weighted_row_sum: out[v, h] = sum over v's edges of weight[e, h] * rows[e] (mean:
    divided by the degree), empty segments 0, float32 rows summed into float64."""
    from ngnn.transformers.numpy import kernels as K
    rng = np.random.default_rng(1)
    seg = np.array([0, 2, 2, 5, 6, 6])
    rows = rng.standard_normal((6, 1, 3)).astype(np.float32)
    weight = rng.standard_normal((6, 4, 1))
    for reduce in ("sum", "mean"):
        want = np.zeros((5, 4, 3))
        for v in range(5):
            for e in range(seg[v], seg[v + 1]):
                want[v] += weight[e] * rows[e].astype(np.float64)
            if reduce == "mean":
                want[v] /= max(seg[v + 1] - seg[v], 1)
        got = K.weighted_row_sum(rows, weight, seg, reduce, np.full((5, 4, 3), 7.0))
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_gathered_row_dot_is_each_edges_row_against_its_vertexs_matrix():
    """K.gathered_row_dot: out[e, h] = sum over f of table[ids[e], f, h] * rows[e, f], for
    ids of either integer width, float32 rows summed into float64, no edges at all."""
    from ngnn.transformers.numpy import kernels as K
    rng = np.random.default_rng(2)
    table = rng.standard_normal((5, 3, 4))          # (N, F, H)
    rows = rng.standard_normal((7, 1, 3)).astype(np.float32)
    for ids in (np.array([0, 4, 4, 2, 0, 1, 3]), np.array([3, 3, 0, 1, 2, 4, 4], np.int32)):
        want = np.einsum("efh,ef->eh", table[ids], rows[:, 0].astype(np.float64))
        got = K.gathered_row_dot(table, ids, rows, np.full((7, 4, 1), 7.0))
        np.testing.assert_allclose(got[:, :, 0], want, rtol=1e-12, atol=1e-12)
    empty = K.gathered_row_dot(table, np.zeros(0, np.int64), rows[:0], np.empty((0, 4)))
    assert empty.shape == (0, 4)
