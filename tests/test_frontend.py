"""The vertex-centric front end: tracing in ng.zoomIn, lowering at zoomOut, and its errors."""
import builtins
import inspect
import os

import numpy as np
import pytest

import ngnn as ng
from ngnn import transformers as ngt
from ngnn.frontend import TracingError, lower_zoom_outs
from ngnn.op_graph import Dot, Dropout, ordered_ops

# src -> dst; vertex 0 has no in-edges, vertex 5 no edges at all, 2 -> 3 is doubled.
SRC = np.array([0, 1, 2, 2, 3, 4, 2, 1])
DST = np.array([1, 2, 3, 3, 4, 4, 1, 3])
N, E, F = 6, len(SRC), 4
THIS_FILE = os.path.basename(__file__)


def graph():
    return ng.Graph.from_edges(SRC, DST, num_nodes=N)


def inputs(rng=np.random.default_rng(0)):
    h = ng.placeholder((N, F), dtype=np.float64, name="h")
    w = ng.placeholder((E, 1), dtype=np.float64, name="w")
    return h, w, rng.standard_normal((N, F)), rng.standard_normal((E, 1))


def run(results, *feeds):
    with ngt.make_transformer("numpy") as t:
        return t.computation(results, *[p for p, _ in feeds])(*[v for _, v in feeds])


def add_at(rows, index, values):
    out = np.zeros((rows,) + values.shape[1:])
    np.add.at(out, index, values)
    return out


def next_line():
    return inspect.currentframe().f_back.f_lineno + 1


# ---- tracing -------------------------------------------------------------------------------

def test_local_values_have_per_vertex_shapes_and_scopes():
    h, w, _, _ = inputs()
    with ng.zoomIn(graph(), node_feat=[h], edge_feat=[w]) as v:
        assert (v.h.shape, v.h.scope) == ((F,), "v")
        assert [(n.h.shape, n.h.scope) for n in v.innbs] == [((F,), "innbs")]
        assert [n.h.scope for n in v.outnbs] == ["outnbs"]
        assert [(e.w.shape, e.w.scope) for e in v.inedges] == [((1,), "inedge")]
        assert [e.w.scope for e in v.outedges] == ["outedge"]
        assert (v.indegree.shape, v.outdegree.scope) == ((), "v")
        assert v.h is v.h


def test_features_by_dict_and_the_api_example():
    g, (h, w, hv, wv) = graph(), inputs()
    with ng.zoomIn(g, node_feat={"x": h}, edge_feat={"weight": w}) as v:
        msgs = [n.x * e.weight for n, e in zip(v.innbs, v.inedges)]
        rst = sum(msgs) / ng.maximum(v.indegree, 1.0)
    out = run(ng.zoomOut(rst), (h, hv), (w, wv))
    indegree = np.bincount(DST, minlength=N)
    np.testing.assert_allclose(out, add_at(N, DST, hv[SRC] * wv) /
                               np.maximum(indegree, 1)[:, None])


def test_out_neighbours_and_out_edges_aggregate_at_the_source():
    g, (h, w, hv, wv) = graph(), inputs()
    with ng.zoomIn(g, node_feat=[h], edge_feat=[w]) as v:
        rst = sum(n.h * e.w - v.h for n, e in zip(v.outnbs, v.outedges))
        top = ng.max([n.h for n in v.outnbs])
    out, peak = run([ng.zoomOut(rst), ng.zoomOut(top)], (h, hv), (w, wv))
    np.testing.assert_allclose(out, add_at(N, SRC, hv[DST] * wv - hv[SRC]))
    ref = np.full((N, F), -np.inf)
    np.maximum.at(ref, SRC, hv[DST])
    np.testing.assert_allclose(peak, np.where(np.isinf(ref), 0, ref))


def test_reductions_and_degrees_per_vertex():
    g, (h, _, hv, _) = graph(), inputs()
    with ng.zoomIn(g, node_feat=[h]) as v:
        results = [ng.sum([n.h for n in v.innbs]), ng.mean([n.h for n in v.innbs]),
                   min(n.h for n in v.innbs), v.indegree, v.outdegree,
                   sum(n.outdegree for n in v.innbs)]
    total, mean, low, indeg, outdeg, nbr_out = run([ng.zoomOut(r) for r in results], (h, hv))
    counts = np.bincount(DST, minlength=N)
    np.testing.assert_allclose(total, add_at(N, DST, hv[SRC]))
    np.testing.assert_allclose(mean, total / np.maximum(counts, 1)[:, None])
    assert np.all(mean[counts == 0] == 0) and np.all(np.isfinite(mean))
    ref = np.full((N, F), np.inf)
    np.minimum.at(ref, DST, hv[SRC])
    np.testing.assert_allclose(low, np.where(np.isinf(ref), 0, ref))
    np.testing.assert_array_equal(indeg, counts)
    np.testing.assert_array_equal(outdeg, np.bincount(SRC, minlength=N))
    np.testing.assert_array_equal(nbr_out, add_at(N, DST, np.bincount(SRC, minlength=N)[SRC]))


def test_broadcasting_and_products_stay_per_vertex():
    """A lower-rank local value broadcasts within its vertex, never across vertices."""
    g, (h, _, hv, _) = graph(), inputs()
    rng = np.random.default_rng(1)
    mat, vec, stack = (rng.standard_normal(s) for s in ((3, F), (F,), (2, F, 3)))
    cmat, cvec, cstack = (ng.constant(a, dtype=np.float64) for a in (mat, vec, stack))
    with ng.zoomIn(g, node_feat=[h]) as v:
        results = [
            ng.reshape(v.h, (2, 2)) * v.indegree,           # () against (2, 2)
            ng.reshape(v.h, (1, F)) * cmat,                 # (1, F) against (3, F)
            v.h * ng.reshape(v.h, (F, 1)),                  # outer product per vertex
            ng.dot(cmat, v.h),                              # matrix @ local vector
            ng.dot(v.h, cvec),                              # local vector @ vector
            ng.dot(v.h, cstack),                            # local vector @ batch
            ng.dot(ng.reshape(v.h, (2, 2)), ng.reshape(v.h, (2, 2))),
            sum(ng.dot(v.h, n.h) for n in v.innbs),         # per-edge inner products
        ]
    outs = run([ng.zoomOut(r) for r in results], (h, hv))
    indeg = np.bincount(DST, minlength=N)
    sq = hv.reshape(N, 2, 2)
    refs = [sq * indeg[:, None, None], hv[:, None, :] * mat, hv[:, None, :] * hv[:, :, None],
            hv @ mat.T, hv @ vec, np.einsum("nf,bfk->nbk", hv, stack), sq @ sq,
            add_at(N, DST, np.sum(hv[DST] * hv[SRC], axis=1))]
    for out, ref in zip(outs, refs):
        np.testing.assert_allclose(out, ref, rtol=1e-12)


def test_patched_builtins_behave_normally_on_ordinary_values():
    h, _, _, _ = inputs()
    with ng.zoomIn(graph(), node_feat=[h]):
        assert sum([1, 2, 3]) == 6 and sum((x for x in [1.5, 2.5]), 10) == 14
        assert max(3, 7, 5) == 7 and max([4, 9]) == 9 and min("bca") == "a"
        assert max([], default=-1) == -1 and min([3, 1], key=lambda x: -x) == 3
        assert list(zip([1, 2], "ab")) == [(1, "a"), (2, "b")]
        with pytest.raises(TypeError):
            sum(5)


def test_builtins_are_patched_only_inside_and_restored_after_an_error():
    h, _, _, _ = inputs()
    originals = builtins.sum, builtins.max, builtins.min, builtins.zip
    with pytest.raises(RuntimeError, match="boom"):
        with ng.zoomIn(graph(), node_feat=[h]):
            assert builtins.sum is not originals[0]
            raise RuntimeError("boom")
    assert (builtins.sum, builtins.max, builtins.min, builtins.zip) == originals


def test_max_of_two_traced_values_is_elementwise():
    g, (h, _, hv, _) = graph(), inputs()
    with ng.zoomIn(g, node_feat=[h]) as v:
        rst = max(v.h, -v.h, 0.5)
    np.testing.assert_allclose(run(ng.zoomOut(rst), (h, hv)), np.maximum(np.abs(hv), 0.5))


def test_zoom_out_of_a_previous_layer_is_a_node_feature():
    g, (h, _, hv, _) = graph(), inputs()
    with ng.zoomIn(g, node_feat=[h]) as v:
        first = ng.zoomOut(sum(n.h for n in v.innbs))
    with ng.zoomIn(g, node_feat={"h": ng.relu(first)}) as v:
        second = ng.zoomOut(sum(n.h for n in v.innbs))
    once = add_at(N, DST, hv[SRC])
    np.testing.assert_allclose(run(second, (h, hv)), add_at(N, DST, np.maximum(once, 0)[SRC]))


def test_dropout_inside_draws_one_mask_per_edge():
    g, (_, w, _, _) = graph(), inputs()
    with ng.zoomIn(g, edge_feat=[w]) as v:
        rst = sum(ng.dropout(e.w, 0.5) for e in v.inedges)
    out = ng.zoomOut(rst)
    lower_zoom_outs([out])
    masks = [op for op in ordered_ops([out]) if isinstance(op, Dropout)]
    assert [m.shape for m in masks] == [(E, 1)]
    kept = run(out, (w, np.ones((E, 1))))
    assert set(np.unique(kept)) <= {0.0, 2.0, 4.0, 6.0}


# ---- lowering ------------------------------------------------------------------------------

def test_zoom_outs_of_one_context_share_their_lowering():
    g, (h, _, _, _) = graph(), inputs()
    W = ng.variable((F, 3), dtype=np.float64, initial_value=1.0, name="W")
    with ng.zoomIn(g, node_feat=[h]) as v:
        a = sum(n.h @ W for n in v.innbs)
        b = a * 2.0
    out_a, out_b = ng.zoomOut(a, b)
    lower_zoom_outs([out_a])
    lower_zoom_outs([out_b])
    assert out_b.forwarded.args[0] is out_a.forwarded
    assert sum(isinstance(op, Dot) for op in ordered_ops([out_a, out_b])) == 1


def test_ir_shows_local_scopes_before_and_whole_graph_scopes_after_batching():
    g, (h, w, hv, wv) = graph(), inputs()
    with ng.zoomIn(g, node_feat=[h], edge_feat=[w]) as v:
        rst = sum(n.h * e.w + v.h for n, e in zip(v.innbs, v.inedges))
    with ngt.make_transformer("numpy") as t:
        comp = t.computation(ng.zoomOut(rst), h, w)
        comp(hv, wv)
        trace, batched = comp.ir_after("Trace"), comp.ir_after("OperationBatching")
    for text in ("innbs::Float64[4] = prim::feature(%h)", "v::Float64[4]",
                 "e::Float64[1] = prim::feature(%w)", "e::Float64[4] = edge::", "agg::sum",
                 "zoom_out"):
        assert text in trace
    for text in ("e::Float64[E,4] = edge::gather_src(%h)", "edge::gather_dst(%h)",
                 "n::Float64[N,4] = agg::sum(", "e::Float64[E,4] = edge::add("):
        assert text in batched
    assert "innbs::" not in batched and "zoom_out" not in batched


def test_gradients_flow_through_zoom_out():
    g, (h, w, hv, wv) = graph(), inputs()
    with ng.zoomIn(g, node_feat=[h], edge_feat=[w]) as v:
        rst = sum(n.h * e.w for n, e in zip(v.innbs, v.inedges))
    dh, dw = run(ng.grad(ng.sum(ng.zoomOut(rst)), [h, w]), (h, hv), (w, wv))
    np.testing.assert_allclose(dh, add_at(N, SRC, np.broadcast_to(wv, (E, F))))
    np.testing.assert_allclose(dw[:, 0], hv[SRC].sum(axis=1))


# ---- errors ----------------------------------------------------------------------------------

def test_python_if_on_a_traced_value_points_at_the_users_line():
    h, _, _, _ = inputs()
    with ng.zoomIn(graph(), node_feat=[h]) as v:
        with pytest.raises(TracingError) as info:
            line = next_line()
            if v.h:
                pass
    message = str(info.value)
    assert "data-dependent control flow is not supported" in message
    assert THIS_FILE in message and f"line {line}" in message


def test_comparisons_in_a_python_if_are_traced_values_too():
    h, _, _, _ = inputs()
    with ng.zoomIn(graph(), node_feat=[h]) as v:
        total = sum(n.h for n in v.innbs)
        with pytest.raises(TracingError) as info:
            line = next_line()
            if total > 0:
                pass
        assert f"line {line}" in str(info.value)
        with pytest.raises(TypeError, match="ng.equal"):
            v.h == 0      # noqa: B015 (the comparison itself must raise)


def test_zip_of_in_edges_and_out_edges_is_an_error():
    h, w, _, _ = inputs()
    with ng.zoomIn(graph(), node_feat=[h], edge_feat=[w]) as v:
        ins = [n.h for n in v.innbs]
        with pytest.raises(TracingError, match="in-edges .* out-edges"):
            zip(ins, [e.w for e in v.outedges])
        with pytest.raises(TracingError, match="different edge sets|in-edges"):
            zip(v.inedges, v.outnbs)


def test_traced_value_used_after_the_context_closed():
    h, _, _, _ = inputs()
    with ng.zoomIn(graph(), node_feat=[h]) as v:
        x = v.h
        msgs = [n.h for n in v.innbs]
    with pytest.raises(TracingError, match="after its context closed") as info:
        line = next_line()
        x + 1.0
    assert f"line {line}" in str(info.value)
    with pytest.raises(TracingError, match="after its context closed"):
        ng.sum(msgs)
    with pytest.raises(TracingError, match="after its context closed"):
        v.h


def test_unknown_feature_lists_the_available_ones():
    h, w, _, _ = inputs()
    with ng.zoomIn(graph(), node_feat=[h], edge_feat=[w]) as v:
        with pytest.raises(AttributeError, match="'feat'.*available node features: h") as info:
            line = next_line()
            v.feat
        assert THIS_FILE in str(info.value) and f"line {line}" in str(info.value)
        with pytest.raises(AttributeError, match="available edge features: w"):
            [e.h for e in v.inedges]


def test_feature_lists_need_distinct_names_and_the_right_rows():
    g, (h, w, _, _) = graph(), inputs()
    with pytest.raises(ValueError, match="needs a name"):
        ng.zoomIn(g, node_feat=[ng.placeholder((N, 2))])
    with pytest.raises(ValueError, match="two node_feat entries are named 'h'"):
        ng.zoomIn(g, node_feat=[h, ng.placeholder((N, 2), name="h")])
    with pytest.raises(ng.ShapeError, match=r"node_feat 'w' has shape \(8, 1\).*6 nodes"):
        ng.zoomIn(g, node_feat=[w])
    with pytest.raises(ng.ShapeError, match=r"edge_feat 'h' has shape \(6, 4\).*8 edges"):
        ng.zoomIn(g, edge_feat=[h])


def test_zoom_out_of_edge_values_gives_edge_tensors_in_edge_id_order(transformer_factory):
    # The form of a link predictor's decoder: one score per edge (query pair) from both ends.
    h, w, hv, wv = inputs()
    with ng.zoomIn(graph(), node_feat=[h], edge_feat=[w]) as v:
        scores = [ng.sum(n.h * v.h, axis=-1) for n in v.innbs]
        weighted = [e.w * v.h for e in v.inedges]
        sources = [n.h for n in v.innbs]
        outgoing = [n.h - e.w for n, e in zip(v.outnbs, v.outedges)]
    outs = ng.zoomOut(scores, weighted[0], sources, outgoing)
    assert [o.shape for o in outs] == [(E,), (E, F), (E, F), (E, F)]
    t = transformer_factory()
    got = t.computation(list(outs) + ng.grad(ng.sum(outs[0] * outs[0]), [h]), h, w)(hv, wv)
    np.testing.assert_allclose(got[0], np.sum(hv[SRC] * hv[DST], axis=-1), rtol=1e-12)
    np.testing.assert_allclose(got[1], wv * hv[DST], rtol=1e-12)
    np.testing.assert_allclose(got[2], hv[SRC], rtol=1e-12)
    np.testing.assert_allclose(got[3], hv[DST] - wv, rtol=1e-12)
    score = np.sum(hv[SRC] * hv[DST], axis=-1, keepdims=True)
    expected = add_at(N, SRC, 2 * score * hv[DST]) + add_at(N, DST, 2 * score * hv[SRC])
    np.testing.assert_allclose(got[4], expected, rtol=1e-12)


def test_zoom_out_needs_a_value_traced_in_zoom_in():
    h, _, _, _ = inputs()
    with ng.zoomIn(graph(), node_feat=[h]) as v:
        both, single = [v.h, v.h], [v.h]
    with pytest.raises(TracingError, match="traced inside ng.zoomIn"):
        ng.zoomOut(h)
    with pytest.raises(TracingError, match="traced inside ng.zoomIn"):
        ng.zoomOut(both)
    with pytest.raises(TracingError, match="one per-vertex value"):
        ng.zoomOut(single)


def test_zoom_out_of_an_edge_value_is_an_edge_tensor_in_edge_id_order(transformer_factory):
    h, w, hv, wv = inputs()
    g = graph()
    with ng.zoomIn(g, node_feat=[h], edge_feat=[w]) as v:
        incoming = [n.h * e.w + v.h for n, e in zip(v.innbs, v.inedges)]
        outgoing = [n.h - v.h for n in v.outnbs]
        total = sum(incoming)
    on_in_edges, on_out_edges, node = ng.zoomOut(*incoming, *outgoing, total)
    assert on_in_edges.shape == on_out_edges.shape == (E, F) and node.shape == (N, F)
    with transformer_factory() as t:
        a, b, c = t.computation([on_in_edges, on_out_edges, node], h, w)(hv, wv)
    np.testing.assert_allclose(a, hv[g.src] * wv + hv[g.dst], rtol=1e-12)
    np.testing.assert_allclose(b, hv[g.dst] - hv[g.src], rtol=1e-12)
    np.testing.assert_allclose(c, add_at(N, g.dst, a), rtol=1e-12)


def test_zoom_out_of_an_edge_value_on_a_graph_without_edges(transformer_factory):
    """Every block value of the fused group is edge-sized, and there are no edges: the
    group's workspace is empty but still exists."""
    g = ng.Graph.from_edges([], [], num_nodes=3)
    h = ng.placeholder((3, 2), dtype=np.float64, name="h")
    with ng.zoomIn(g, node_feat=[h]) as v:
        products = [n.h * v.h for n in v.innbs]
        total = sum(products)
    on_edges, node = ng.zoomOut(*products, total)
    with transformer_factory() as t:
        a, b = t.computation([on_edges, node], h)(np.ones((3, 2)))
    assert a.shape == (0, 2) and np.all(b == 0)


def test_reductions_need_a_neighbour_list():
    h, _, _, _ = inputs()
    with ng.zoomIn(graph(), node_feat=[h]) as v:
        with pytest.raises(TracingError, match="neighbour list"):
            ng.mean([v.h, v.h])
        with pytest.raises(TracingError, match="one per-vertex value"):
            sum(v.h for n in v.innbs)
    with pytest.raises(TracingError, match="neighbour list inside ng.zoomIn"):
        ng.sum([h])
