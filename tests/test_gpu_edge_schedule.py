"""GPU graph kernels on skewed graphs: the edge-balanced schedule (a heavy row split into
chunks whose partials are folded in chunk order, light rows packed per work-group) and
work linear in degree (a value gathered from the loop's own vertex is computed once per
vertex). On a star whose centre has 100,000 in-edges and on R-MAT, forward values and
gradients equal the NumPy transformer's and repeat bitwise from call to call."""
import re

import numpy as np
import pytest

import ngnn as ng
from ngnn import datasets, nn
from ngnn.naming import value_identifier
from ngnn import transformers as ngt
from ngnn.transformers.gpu.kernels import loop_order
from ngnn.transformers.gpu.schedule import CHUNK, EdgeSchedule, edge_schedule

HUB = 100_000
rng = np.random.default_rng(5)


@pytest.fixture(scope="module")
def gpu():
    with ngt.make_transformer("gpu", runtime="opencl") as t:
        yield t


def star(leaves):
    """Vertex 0 receives an edge from each leaf; leaves form a path, so every vertex has
    edges in both directions and the centre's in-row is far heavier than any other."""
    leaf = np.arange(1, leaves + 1)
    src = np.concatenate([leaf, leaf[:-1]])
    dst = np.concatenate([np.zeros(leaves, np.int64), leaf[1:]])
    return ng.Graph.from_edges(src, dst, num_nodes=leaves + 1)


def rmat(nodes):
    return datasets.synthetic("rmat", nodes, 16.0, 8, 3, seed=0).graph


def nested_edge_walks(source):
    """(kernel, CSR array) for each loop over a vertex's edges nested inside a loop over
    the same CSR's edges: work quadratic in degree."""
    found = []
    for kernel in source.split("KERNEL void ")[1:]:
        name = kernel.split("(", 1)[0]
        starts = dict(re.findall(r"int (\w+) = (\w*indptr\w*)\[", kernel))
        open_loops, depth = [], 0
        for line in kernel.splitlines():
            loop = re.search(r"for \(int \w+ = (\w+);", line)
            if loop and loop.group(1) in starts:
                array = starts[loop.group(1)]
                found += [(name, array)] * any(a == array for a, _ in open_loops)
                open_loops.append((array, depth))
            depth += line.count("{") - line.count("}")
            while open_loops and depth <= open_loops[-1][1]:
                open_loops.pop()
    return found


def seed_gat(g, h, heads=8, width=2, dtype=np.float64):
    """seed 000's GAT written per vertex: the softmax's denominator `s = sum(c)`, then
    `c / s` per edge (the sum gathered back from the edge's own destination)."""
    weights = np.random.default_rng(1).standard_normal((h.shape[1], heads * width)) * 0.3
    attn = np.random.default_rng(2).standard_normal((2, heads, width)) * 0.3
    feat = ng.reshape(ng.dot(h, ng.constant(weights, dtype=dtype)),
                      (g.num_nodes, heads, width))
    el = ng.sum(feat * ng.constant(attn[0], dtype=dtype), axis=-1)
    er = ng.sum(feat * ng.constant(attn[1], dtype=dtype), axis=-1)
    with ng.zoomIn(g, node_feat={"f": feat, "el": el, "er": er}) as v:
        coeff = [ng.exp(ng.leaky_relu(n.el + v.er, 0.2)) for n in v.innbs]
        s = sum(coeff)
        rst = sum(ng.reshape(c / s, (heads, 1)) * n.f for c, n in zip(coeff, v.innbs))
    return ng.zoomOut(rst)


def graph_ops(g, h, w):
    messages = ng.gather(h, g, by="src") * w
    return [ng.aggregate(messages, g, reduce=r) for r in ("sum", "mean", "max")] + \
        [ng.edge_softmax(g, w * 0.5)]


MODELS = {
    "gcn": lambda d: nn.GCN(d, 6, 3, seed=0, dtype=np.float64),
    "gat": lambda d: nn.GAT(d, hidden=2, heads=8, num_classes=3, seed=0, dtype=np.float64),
    "sage": lambda d: nn.GraphSAGE(d, 6, 3, seed=0, dtype=np.float64),
    "gin": lambda d: nn.GIN(d, 6, 3, seed=0, dtype=np.float64),
}


def weighted_loss(values):
    """A sum of each value times fixed weights: every element's gradient is nonzero."""
    total = 0.0
    for i, value in enumerate(values):
        weights = np.random.default_rng(i).uniform(0.5, 1.5, value.shape)
        total = total + ng.sum(value * ng.constant(weights, dtype=value.dtype))
    return total


def assert_equal_to_numpy_and_repeatable(gpu, results, params, values, rtol, calls=3,
                                         **numpy_options):
    """Each of `calls` calls equals NumPy's call of the same number (dropout masks follow
    the call number), and a second computation of the same results repeats every call
    bit for bit."""
    reference = ngt.make_transformer("numpy", **numpy_options).computation(results, *params)
    comp, again = (gpu.computation(results, *params) for _ in range(2))
    for call in range(calls):
        expected, first, second = reference(*values), comp(*values), again(*values)
        for i, (e, a, b) in enumerate(zip(expected, first, second)):
            scale = np.max(np.abs(e)) if e.size else 0.0
            np.testing.assert_allclose(a, e, rtol=rtol, atol=rtol * scale,
                                       err_msg=f"call {call}, result {i}")
            assert np.array_equal(a, b, equal_nan=True), f"call {call}, result {i} changed"
    assert nested_edge_walks(comp.source) == []
    return comp


# ---- the schedule --------------------------------------------------------------------------

@pytest.mark.parametrize("at", ["dst", "src"])
def test_schedule_covers_every_edge_once_in_balanced_work_groups(at):
    g = rmat(3000)
    s = EdgeSchedule(g, at)
    indptr = s.indptr()
    degrees = np.diff(indptr)
    heavy = degrees > CHUNK
    assert heavy.any() and not heavy.all()
    # Chunks: a heavy row's edges exactly, in order, at most CHUNK each; light rows none.
    assert np.array_equal(np.diff(s.row_chunks) > 0, heavy)
    assert np.all(s.chunk_end - s.chunk_start <= np.maximum(CHUNK, np.sqrt(degrees[s.chunk_row]) + 1))
    assert np.all(s.chunk_end > s.chunk_start)
    rows = np.flatnonzero(heavy)
    assert np.array_equal(s.chunk_start[s.row_chunks[rows]], indptr[rows])
    assert np.array_equal(s.chunk_end[s.row_chunks[rows + 1] - 1], indptr[rows + 1])
    inside = np.diff(s.row_chunks)[s.chunk_row] > 0
    assert inside.all() and np.all(s.chunk_end[:-1][s.chunk_row[:-1] == s.chunk_row[1:]] ==
                                   s.chunk_start[1:][s.chunk_row[:-1] == s.chunk_row[1:]])
    # Pieces cover the heavy rows' edges too; groups cover every row once, in order.
    assert (s.piece_end - s.piece_start).sum() == degrees[heavy].sum()
    assert s.group_rows[0] == 0 and s.group_rows[-1] == g.num_nodes
    assert np.all(np.diff(s.group_rows) > 0)
    walked = s.light_edges_per_group()
    assert walked.sum() == degrees[~heavy].sum()
    assert walked.max() <= 2 * walked.mean()


def test_schedule_is_kept_with_the_graph_and_a_slot_keeps_its_sizes():
    from ngnn.sampling.slot import GraphSlot
    g = star(1000)
    assert edge_schedule(g, "dst") is edge_schedule(g, "dst")
    assert edge_schedule(g, "dst") is not edge_schedule(g, "src")
    slot = GraphSlot(200, 900)
    schedule = edge_schedule(slot, "dst")
    sizes = {name: getattr(schedule, name).shape for name in EdgeSchedule.ARRAYS}
    for leaves in (150, 40):
        block = star(leaves)
        slot.load(block)
        assert {n: getattr(schedule, n).shape for n in EdgeSchedule.ARRAYS} == sizes
        assert schedule.row_chunks[1] - schedule.row_chunks[0] == \
            -(-leaves // CHUNK) * (leaves > CHUNK)
    # A hub gets at most sqrt(degree) chunks: folding them costs what walking one does.
    hub = edge_schedule(star(HUB), "dst")
    assert hub.row_chunks[1] == -(-HUB // int(np.ceil(np.sqrt(HUB))))


# ---- linear work ---------------------------------------------------------------------------

def test_no_graph_kernel_walks_an_edge_list_inside_a_walk_of_the_same_list(gpu):
    """seed 000's GAT per vertex (its softmax sum gathered back by the edge's own end) in
    the forward alone and with its gradient; every computation of the tests below is
    checked the same way."""
    g = star(40)
    h = ng.placeholder((g.num_nodes, 3), dtype=np.float64, name="h")
    out = seed_gat(g, h)
    loss = weighted_loss([out])
    for results in ([out], [loss] + ng.grad(loss, [h])):
        comp = gpu.computation(results, h)
        comp.transform()
        assert "graph_in_indptr" in comp.source
        assert nested_edge_walks(comp.source) == []
    # The check finds a nested walk where there is one.
    nested = "int s1 = graph_in_indptr[v];\nfor (int k = s1; k < e; ++k) {\n" \
             "int s2 = graph_in_indptr[n];\nfor (int j = s2; j < e2; ++j) {\n}\n}\n"
    assert nested_edge_walks("KERNEL void f(int x) {\n" + nested + "}") == \
        [("f", "graph_in_indptr")]


def test_seed_gat_on_a_star_hub_equals_numpy_forward_and_backward(gpu):
    g = star(HUB)
    h = ng.placeholder((g.num_nodes, 3), dtype=np.float64, name="h")
    out = seed_gat(g, h)
    loss = weighted_loss([out])
    x = rng.standard_normal((g.num_nodes, 3))
    assert_equal_to_numpy_and_repeatable(gpu, [out, loss] + ng.grad(loss, [h]), [h], [x],
                                         rtol=1e-12)


def test_a_per_head_vertex_value_summed_over_heads_per_edge_is_computed_once_per_vertex(gpu):
    """An edge loop whose per-edge value sums over the heads a per-head value of the
    loop's own vertex that the kernel makes by walking the same edges (an aggregation,
    as an attention's log-sum-exp or softmax-gradient sum): the vertex's row is computed
    for every head once, before the loop, not again for each edge (which would walk the
    hub's 100,000 edges 100,000 times). Equal to NumPy and repeatable."""
    g = star(HUB)
    x = ng.placeholder((g.num_nodes, 4), dtype=np.float64, name="x")
    w = ng.placeholder((g.num_edges, 4), dtype=np.float64, name="w")
    per_head = ng.aggregate(ng.gather(x, g, by="src") * w, g, at="dst", reduce="sum")
    summed = ng.sum(ng.gather(per_head, g, by="dst") * w, axis=-1, keepdims=True)
    out = ng.aggregate(summed * ng.gather(x, g, by="src"), g, at="dst", reduce="sum")
    comp = assert_equal_to_numpy_and_repeatable(
        gpu, [out], [x, w], [rng.standard_normal((g.num_nodes, 4)),
                             rng.standard_normal((g.num_edges, 4))], 1e-12)
    assert "the row of" in comp.source


# ---- a hub of 100,000 in-edges -------------------------------------------------------------

@pytest.mark.parametrize("dtype, rtol", [(np.float32, 1e-5), (np.float64, 1e-12)])
def test_graph_ops_on_a_star_hub_equal_numpy_and_repeat(gpu, dtype, rtol):
    g = star(HUB)
    h = ng.placeholder((g.num_nodes, 4), dtype=dtype, name="h")
    w = ng.placeholder((g.num_edges, 1), dtype=dtype, name="w")
    outs = graph_ops(g, h, w)
    loss = weighted_loss(outs)
    # Small integers: sums are exact in float32, whatever order the chunks fold in.
    x = rng.integers(-3, 4, (g.num_nodes, 4)).astype(dtype)
    weights = rng.integers(1, 4, (g.num_edges, 1)).astype(dtype)
    comp = assert_equal_to_numpy_and_repeatable(
        gpu, outs + ng.grad(loss, [h, w]), [h, w], [x, weights], rtol)
    templates = {k.template for k in comp.executor.kernels}
    assert {"partial.j2", "vertex_rows.j2"} <= templates


@pytest.mark.parametrize("model", sorted(MODELS))
def test_models_on_a_star_hub_equal_numpy_and_repeat(gpu, model):
    g = star(HUB)
    h = ng.placeholder((g.num_nodes, 3), dtype=np.float64, name="h")
    layers = MODELS[model](3)
    logits = layers(g, h)
    loss = weighted_loss([logits])
    x = rng.standard_normal((g.num_nodes, 3))
    assert_equal_to_numpy_and_repeatable(
        gpu, [logits, loss] + ng.grad(loss, layers.parameters() + [h]), [h], [x], 1e-12)


# ---- R-MAT ---------------------------------------------------------------------------------

def test_graph_ops_on_rmat_equal_numpy_and_repeat(gpu):
    g = rmat(3000)
    h = ng.placeholder((g.num_nodes, 4), dtype=np.float64, name="h")
    w = ng.placeholder((g.num_edges, 1), dtype=np.float64, name="w")
    outs = graph_ops(g, h, w)
    loss = weighted_loss(outs)
    assert_equal_to_numpy_and_repeatable(
        gpu, outs + ng.grad(loss, [h, w]), [h, w],
        [rng.standard_normal((g.num_nodes, 4)), rng.standard_normal((g.num_edges, 1))], 1e-12)


@pytest.mark.parametrize("model", ["gcn", "gat"])
def test_rmat_training_step_is_balanced_equal_to_numpy_and_repeatable(gpu, model):
    g = rmat(3000)
    h = ng.placeholder((g.num_nodes, 3), dtype=np.float64, name="h")
    layers = MODELS[model](3)
    loss = weighted_loss([layers(g, h, training=True)])
    x = rng.standard_normal((g.num_nodes, 3))
    comp = assert_equal_to_numpy_and_repeatable(
        gpu, [loss] + ng.grad(loss, layers.parameters()), [h], [x], 1e-12)
    walks = [k.edges_per_work_group() for k in comp.executor.kernels]
    walks = [w for w in walks if w.sum()]
    assert len(walks) >= 4
    for walked in walks:
        assert walked.max() <= 2 * walked.mean()
    assert max(w.max() for w in walks) < g.in_degrees.max()


def kernel_sources(source):
    """{kernel name: its C text} of a program."""
    return {k.split("(", 1)[0]: k for k in source.split("KERNEL void ")[1:]}


def test_one_walk_writes_edge_and_vertex_outputs_and_edge_values_are_read_in_loop_order(gpu):
    """An edge value too long to recompute (a chain of 60 ops, over max_recompute) that a
    destination walk makes and sums and a source walk reads: the destination group writes
    it together with its sum from one walk of the in-CSR, at the loop's slot
    (`out[k * F + f]`), and every read of it indexes a loop slot or, in the source walk,
    that slot's place in the in-CSR; never an edge id. Values equal NumPy's, and repeat."""
    g = rmat(3000)
    x = ng.placeholder((g.num_nodes, 4), dtype=np.float64, name="x")
    e = ng.gather(x, g, by="src") * ng.gather(x, g, by="dst")
    for _ in range(20):
        e = ng.tanh(e) * 0.9 + 0.1
    into = ng.aggregate(e, g, at="dst", reduce="sum")
    out_of = ng.aggregate(e * ng.gather(x, g, by="dst"), g, at="src", reduce="max")
    comp = assert_equal_to_numpy_and_repeatable(
        gpu, [into, out_of], [x], [rng.standard_normal((g.num_nodes, 4))], 1e-12)
    ordered = loop_order(comp.kernel_plan, comp.results)
    assert list(ordered.values()) == [(g, "dst")]
    (op,) = ordered
    sources = kernel_sources(comp.source)
    kernels = comp.executor.kernels
    (writer,) = [k for k in kernels if op in k.outputs]
    assert {o.scope for o in writer.outputs} == {"e", "n"}     # the edge value and its sum
    name = value_identifier(comp.value_names[op])
    assert re.search(rf"\b{name}\[k \* 4 \+ f\]", sources[writer.name])
    readers = [k for k in kernels if op in k.inputs]
    assert readers and all(k.walk[0].at == "src" for k in readers)
    for kernel in readers:
        text, c_name = sources[kernel.name], kernel.input_names[op]
        rows = re.findall(rf"\b{c_name}\[\(([^)]*\]?)\)", text)
        assert rows, text
        for row in rows:
            assert re.fullmatch(r"graph_out_to_in\[k\d*\]", row), row

# ---- attention layers: weights recomputed from a per-vertex log-sum-exp ---------------------

ATTENTION = {
    "gatv2": lambda d: nn.GATv2Conv(d, 2, 8, seed=0, dtype=np.float64),
    "transformer": lambda d: nn.TransformerConv(d, 2, 8, edge_dim=2, seed=0,
                                                dtype=np.float64),
}


@pytest.mark.parametrize("graph", ["star", "rmat"])
@pytest.mark.parametrize("layer", sorted(ATTENTION))
def test_attention_layers_equal_numpy_and_repeat(gpu, layer, graph):
    """GATv2 and TransformerConv (8 heads, edge features) on the 100,000-edge star's hub
    and on R-MAT: output and every gradient equal NumPy's and repeat bitwise."""
    g = star(HUB) if graph == "star" else rmat(3000)
    h = ng.placeholder((g.num_nodes, 3), dtype=np.float64, name="h")
    conv = ATTENTION[layer](3)
    params, values = [h], [rng.standard_normal((g.num_nodes, 3))]
    if layer == "transformer":
        e = ng.placeholder((g.num_edges, 2), dtype=np.float64, name="e")
        out = conv(g, h, e)
        params, values = params + [e], values + [rng.standard_normal((g.num_edges, 2))]
    else:
        out = conv(g, h)
    loss = weighted_loss([out])
    # The key's bias shifts all of a vertex's logits alike: the softmax cancels it, so its
    # gradient is 0 up to rounding, which no relative tolerance compares.
    wrt = [p for p in conv.parameters() if not p.name.endswith("b_key")] + params
    assert_equal_to_numpy_and_repeatable(
        gpu, [out, loss] + ng.grad(loss, wrt), params, values, 1e-12)
