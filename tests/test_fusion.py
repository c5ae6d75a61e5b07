"""Fusion, recompute-or-materialize and whole-step buffer sharing preserve results."""
import re

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import ngnn as ng
from ngnn import nn
from ngnn import transformers as ngt
from ngnn.op_graph import Aggregate, Dropout, EdgeSoftmax, Exp, Gather


def random_graph(rng, n=40, e=200, isolated=5):
    src = rng.integers(0, n, e)
    dst = rng.integers(0, n - isolated, e)       # the last vertices have no in-edges
    src[:3] = dst[:3]                            # self-loops
    src[3:6], dst[3:6] = src[6], dst[6]          # multi-edges
    return ng.Graph.from_edges(src, dst, n)


def gat_ops(g, x, heads=2, feats=3, seed=0):
    """The seed's GAT written with whole-graph ops."""
    rng = np.random.default_rng(seed)
    n, e = g.num_nodes, g.num_edges
    w = ng.variable((x.shape[1], heads * feats), dtype=x.dtype, name="W",
                    initial_value=rng.normal(size=(x.shape[1], heads * feats)))
    attn_l = ng.variable((heads, feats), dtype=x.dtype, name="attn_l",
                         initial_value=rng.normal(size=(heads, feats)))
    attn_r = ng.variable((heads, feats), dtype=x.dtype, name="attn_r",
                         initial_value=rng.normal(size=(heads, feats)))
    feat = ng.reshape(ng.dot(x, w), (n, heads, feats))
    el, er = ng.sum(feat * attn_l, axis=-1), ng.sum(feat * attn_r, axis=-1)
    coeff = ng.exp(ng.leaky_relu(Gather(el, g, "src") + Gather(er, g, "dst")))
    alpha = coeff / Gather(Aggregate(coeff, g, "dst", "sum"), g, "dst")
    rst = Aggregate(ng.reshape(alpha, (e, heads, 1)) * Gather(feat, g, "src"), g, "dst", "sum")
    return rst, [w, attn_l, attn_r]


def run(results, params, values, **options):
    with ngt.make_transformer("numpy", **options) as t:
        comp = t.computation(results, *params)
        return comp(*values), comp


@pytest.mark.parametrize("options", [dict(), dict(recompute=False),
                                     dict(fusion_block_bytes=512)])
def test_gat_step_fused_equals_unfused(options):
    rng = np.random.default_rng(1)
    g = random_graph(rng)
    x = ng.placeholder((g.num_nodes, 4), dtype=np.float64, name="x")
    rst, params = gat_ops(g, x)
    loss = ng.sum(rst * rst)
    results = [rst, loss] + ng.grad(loss, params)
    xv = rng.normal(size=x.shape)
    fused, comp = run(results, [x], [xv], **options)
    plain, _ = run(results, [x], [xv], fusion=False)
    assert comp.fusion_groups
    for a, b in zip(fused, plain):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)
    assert np.all(fused[0][-5:] == 0)                  # no in-edges: exactly zero


def gat_layer_step_fused_equals_unfused(g, rng, block_bytes, **options):
    """A training step of nn.GATConv with attention dropout on `g`, fused in blocks of
    `block_bytes` (and transformer `options`), checked against the unfused step; returns
    the fused computation."""
    layer = nn.GATConv(4, 3, 2, attn_drop=0.5, seed=0, dtype=np.float64)
    x = ng.placeholder((g.num_nodes, 4), dtype=np.float64, name="x")
    rst = layer(g, x, training=True)
    loss = ng.sum(rst * rst)
    results = [rst, loss] + ng.grad(loss, layer.parameters())
    xv = rng.normal(size=x.shape)
    fused, comp = run(results, [x], [xv], fusion_block_bytes=block_bytes, **options)
    plain, _ = run(results, [x], [xv], fusion=False)
    for a, b in zip(fused, plain):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)
    return comp


def test_gat_layer_step_keeps_group_only_edge_values_in_csr_order():
    """nn.GATConv with attention dropout, with a recompute bound too short for its
    attention (so edge values are stored): the edge values only groups read are stored in
    in-CSR order (slices in destination-parallel groups, one permutation in
    source-parallel ones), the weighted sums run as per-head products, and the step
    equals the unfused one."""
    rng = np.random.default_rng(2)
    comp = gat_layer_step_fused_equals_unfused(random_graph(rng), rng, 512, max_recompute=6)
    source = comp.source
    assert "[p0:p1] = " in source and "in_pos" in source and "K.by_head(" in source


def test_block_values_are_written_into_one_workspace_made_at_bind():
    """No statement inside a group's block loop makes a new array for a block value, and
    the workspace holds the longest block: here a hub with more in-edges than a block's
    budget allows, so its block is longer than the others."""
    rng = np.random.default_rng(4)
    n = 60
    src = np.concatenate([rng.integers(0, n, 300), np.arange(n), np.arange(n)])
    dst = np.concatenate([rng.integers(0, n, 300), np.zeros(2 * n, np.int64)])
    comp = gat_layer_step_fused_equals_unfused(ng.Graph.from_edges(src, dst, n), rng, 2048)
    source = comp.source
    assert source.count("workspace = np.empty(") == 1
    loops = []
    for line in source.splitlines():
        if line.lstrip().startswith("for v0, v1, p0, p1"):
            loops.append([])
        elif loops and line.startswith(" " * 12):
            loops[-1].append(line)
    assert len(loops) == len(comp.fusion_groups)
    assert not any("np.empty(" in line for loop in loops for line in loop)
    assert any("out=w_" in line for loop in loops for line in loop)
    # The per-head copies of the products' sources, made once a call, are in it too.
    copies = re.findall(r"(h_\w+) = K\.by_head\(\w+, \d+, (\w+)\)", source)
    assert copies and all(f"    {buffer} = K.view(workspace[" in source
                          for _, buffer in copies)


BLOCK_BOUNDS = {"eids", "src", "dst", "seg", "in_pos", "n_e", "n_v"}


def block_loops(source):
    """[(the names a block loop assigns before its statements, its statements' text)] of
    a generated module."""
    loops = []
    for line in source.splitlines():
        if line.lstrip().startswith("for v0, v1, p0, p1"):
            loops.append(([], []))
        elif loops and line.startswith(" " * 12):
            header, body = loops[-1]
            targets = set(re.findall(r"\w+", line.split(" = ")[0]))
            if not body and targets <= BLOCK_BOUNDS:
                header += targets
            else:
                body.append(line)
    return [(header, "\n".join(body)) for header, body in loops]


def test_a_block_names_only_what_its_statements_read():
    """A block loop's bounds are the names its statements use: a GCN step's sparse
    products read no edge ids and make no vertex id per edge (K.segment_ids), a GAT
    step's attention groups make them for their gathers by destination; both steps equal
    their unfused ones."""
    rng = np.random.default_rng(5)
    g = random_graph(rng)
    x = ng.placeholder((g.num_nodes, 6), dtype=np.float64, name="x")
    layer = nn.GCNConv(6, 3, seed=0, dtype=np.float64)
    loss = ng.sum(layer(g, x) ** 2)
    results = [loss] + ng.grad(loss, layer.parameters())
    xv = rng.normal(size=x.shape)
    fused, gcn = run(results, [x], [xv])
    for a, b in zip(fused, run(results, [x], [xv], fusion=False)[0]):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)
    gat = gat_layer_step_fused_equals_unfused(g, rng, 2048)
    for comp in (gcn, gat):
        loops = block_loops(comp.source)
        assert len(loops) == len(comp.fusion_groups)
        for header, body in loops:
            assert header and all(re.search(rf"\b{name}\b", body) for name in header)
    assert "K.segment_ids" not in gcn.source and "eids" not in gcn.source
    assert "dst = K.segment_ids(seg, v0)" in gat.source

def test_gat_forward_prints_one_fused_group_after_the_dense_transform():
    """The seed's GAT listing: its two groups (the sum of the coefficients, then the
    division and weighted sum) are one walk, since a block gathers the sum of its own
    vertices once it has made it (vertex_gathers); nothing edge-sized is stored."""
    g = random_graph(np.random.default_rng(2))
    x = ng.placeholder((g.num_nodes, 4), name="x")
    rst, _ = gat_ops(g, x)
    _, comp = run([rst], [x], [np.ones(x.shape, np.float32)])
    ir = comp.ir
    assert len(comp.fusion_groups) == 1
    assert "fusedGraph1(" in ir and "fusedGraph2" not in ir
    main, body = ir.split("\n\n")
    assert "dot(" in main and "gather" not in main and "agg::" not in main
    (total,) = re.findall(r"(%\d+) : n::\S+ = agg::sum", body)[:1]
    assert re.search(r"edge::gather_dst\(%\d+\)", body.split(total + " : ")[1])
    assert "# materialized" not in ir and "# recomputed" not in ir
    assert comp.ir_after("Fusion") == ir


@pytest.mark.parametrize("attn_drop", [0.0, 0.5])
def test_gat_backward_recomputes_the_attention_when_it_can(attn_drop):
    """The backward's alpha * gathered gradient recomputes the whole chain of the forward's
    attention (exp over a gathered sum) when it can, so the attention is not stored for it;
    only with a bound too short for that chain does it read the stored attention, E x H,
    still never storing the E x H x F product. (Reading it whenever it was narrower kept
    every GAT layer's attention stored: docs/fusion.md, memory of the fused GAT step.)"""
    g = random_graph(np.random.default_rng(5), n=40, e=300)
    x = ng.placeholder((g.num_nodes, 6), name="x")
    layer = nn.GATConv(6, 3, 4, attn_drop=attn_drop, seed=0)
    loss = ng.sum(layer(g, x, training=True) ** 2)
    results = [loss] + ng.grad(loss, layer.parameters())

    def stored(**options):
        with ngt.make_transformer("numpy", **options) as t:
            comp = t.computation(results, x)
            comp.transform()
            return [op for op in comp.memory_plan.slots
                    if op.shape and op.shape[0] == g.num_edges]

    def attention(ops):         # alpha = exp(logit - gathered log-sum-exp), or its dropout
        return [op for op in ops if isinstance(op, Exp) or isinstance(op, Dropout)
                and isinstance(op.args[0], Exp)]
    whole, bounded = stored(), stored(max_recompute=6)
    assert not attention(whole) and attention(bounded)
    assert len(whole) < len(bounded)
    assert all(op.shape == (g.num_edges, 4, 1) for op in whole + bounded)


def test_recompute_policy_stores_fewer_edge_values_than_materialize():
    g = random_graph(np.random.default_rng(3), n=200, e=3000)
    x = ng.placeholder((g.num_nodes, 4), name="x")
    rst, params = gat_ops(g, x)
    loss = ng.sum(rst * rst)
    results = [loss] + ng.grad(loss, params)
    xv = np.random.default_rng(3).normal(size=x.shape).astype(np.float32)
    _, recompute = run(results, [x], [xv])
    _, materialize = run(results, [x], [xv], recompute=False)
    _, unfused = run(results, [x], [xv], fusion=False)
    assert recompute.memory_plan.peak_bytes < materialize.memory_plan.peak_bytes
    assert materialize.memory_plan.peak_bytes < unfused.memory_plan.peak_bytes
    assert "# materialized" in materialize.ir
    _, bounded = run(results, [x], [xv], max_recompute=0)     # a zero bound stores all
    assert bounded.ir == materialize.ir


def test_edge_softmax_and_max_aggregation_fuse_and_agree():
    rng = np.random.default_rng(4)
    g = random_graph(rng)
    h = ng.placeholder((g.num_nodes, 3), dtype=np.float64, name="h")
    score = EdgeSoftmax(ng.tanh(Gather(h, g, "src") * Gather(h, g, "dst")), g)
    out = Aggregate(score * Gather(h, g, "src"), g, "dst", "max") + 1.0
    back = Aggregate(score, g, "src", "mean")
    loss = ng.sum(out * out) + ng.sum(back)
    results = [out, back, ng.grad(loss, h)]
    hv = rng.normal(size=h.shape)
    fused, comp = run(results, [h], [hv], fusion_block_bytes=256)
    plain, _ = run(results, [h], [hv], fusion=False)
    assert any(isinstance(op, EdgeSoftmax) for grp in comp.fusion_groups for op in grp.ops)
    for a, b in zip(fused, plain):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


def test_dropout_inside_a_fused_group_draws_the_same_mask():
    rng = np.random.default_rng(5)
    g = random_graph(rng)
    h = ng.placeholder((g.num_nodes, 3), name="h")
    out = Aggregate(ng.dropout(Gather(h, g, "src"), 0.5, seed=7) * 2.0, g, "dst", "sum")
    hv = rng.normal(size=h.shape).astype(np.float32)
    with ngt.make_transformer("numpy", fusion_block_bytes=128) as t1, \
            ngt.make_transformer("numpy", fusion=False) as t2:
        fused, plain = t1.computation(out, h), t2.computation(out, h)
        for _ in range(2):                                   # a new mask every call
            np.testing.assert_allclose(fused(hv), plain(hv), rtol=1e-5, atol=1e-5)
        assert fused.fusion_groups


def test_sgd_update_is_written_into_the_variable_and_reads_see_old_values():
    x = ng.placeholder((8, 3), name="x")
    w = ng.variable((3, 2), initial_value=np.ones((3, 2)), name="w")
    loss = ng.sum(ng.dot(x, w) ** 2)
    before = ng.sum(w)                          # read in the same call: the old value
    step = [loss, before, ng.assign(w, w - 0.01 * ng.grad(loss, w))]
    xv = np.random.default_rng(6).random((8, 3)).astype(np.float32)
    with ngt.make_transformer("numpy") as t:
        comp = t.computation(step, x)
        loss0, before0, w1 = comp(xv)
        assert before0 == 6.0
        assert "out=t_w)" in comp.source and "np.copyto(t_w" not in comp.source
        expected = np.ones((3, 2)) - 0.01 * 2 * xv.T @ (xv @ np.ones((3, 2)))
        np.testing.assert_allclose(w1, expected, rtol=1e-5)
        np.testing.assert_allclose(t.variable_value(w), expected, rtol=1e-5)
        assert comp(xv)[1] == pytest.approx(expected.sum(), rel=1e-5)


@st.composite
def edge_programs(draw):
    """A random graph (isolated vertices, self-loops and multi-edges allowed) and a random
    program: gathers, element-wise edge ops, an aggregation, node ops after it."""
    n = draw(st.integers(1, 12))
    e = draw(st.integers(0, 40))
    src = draw(st.lists(st.integers(0, n - 1), min_size=e, max_size=e))
    dst = draw(st.lists(st.integers(0, n - 1), min_size=e, max_size=e))
    ops = draw(st.lists(st.sampled_from(["add", "mul", "tanh", "exp", "relu", "softmax"]),
                        min_size=1, max_size=5))
    return (n, src, dst, ops, draw(st.sampled_from(["sum", "mean", "max", "min"])),
            draw(st.sampled_from(["src", "dst"])), draw(st.sampled_from([64, 1 << 20])))


@settings(max_examples=40, deadline=None)
@given(edge_programs())
def test_random_edge_programs_fused_equal_unfused(program):
    n, src, dst, ops, reduce, at, block = program
    g = ng.Graph.from_edges(np.array(src, dtype=np.int64), np.array(dst, dtype=np.int64), n)
    h = ng.placeholder((n, 2), dtype=np.float64, name="h")
    value = Gather(h, g, "src")
    for name in ops:
        other = Gather(ng.tanh(h), g, "dst")
        value = {"add": lambda v: v + other, "mul": lambda v: v * other,
                 "tanh": ng.tanh, "exp": lambda v: ng.exp(ng.tanh(v)), "relu": ng.relu,
                 "softmax": lambda v: EdgeSoftmax(v, g, at)}[name](value)
    out = ng.sigmoid(Aggregate(value, g, at, reduce)) * 2.0
    results = [out, ng.grad(ng.sum(out * out), h)]
    hv = np.random.default_rng(len(src)).normal(size=(n, 2))
    fused, _ = run(results, [h], [hv], fusion_block_bytes=block)
    plain, _ = run(results, [h], [hv], fusion=False)
    for a, b in zip(fused, plain):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)
