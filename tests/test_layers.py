"""The vertex-centric layers (and seed 000's GATConv listing) against NumPy references, with
gradients checked by central finite differences in float64."""
import numpy as np
import pytest

import ngnn as ng
from ngnn import nn
from ngnn.op_graph import Dot, Dropout

N, E, IN = 12, 40, 5


def random_graph(seed=0):
    """Self-loops, parallel edges, vertices without in-edges (0, 1) and isolated ones (the
    last two)."""
    rng = np.random.default_rng(seed)
    src = rng.integers(0, N - 2, E)
    dst = rng.integers(2, N - 2, E)
    src[:3] = dst[:3]
    src[3:5], dst[3:5] = src[5], dst[5]
    return ng.Graph.from_edges(src, dst, num_nodes=N)


def features(dtype=np.float64, seed=1):
    return ng.placeholder((N, IN), dtype=dtype, name="h"), \
        np.random.default_rng(seed).standard_normal((N, IN)).astype(dtype)


def add_at(g, values, at="dst"):
    out = np.zeros((g.num_nodes,) + values.shape[1:])
    np.add.at(out, g.dst if at == "dst" else g.src, values)
    return out


def leaky_relu(x, slope=0.2):
    return np.where(x > 0, x, slope * x)


def attention_reference(g, feat, el, er, slope=0.2):
    """sum over in-edges of softmax(leaky_relu(el[src] + er[dst])) * feat[src]."""
    logits = leaky_relu(el[g.src] + er[g.dst], slope)
    peak = np.full((g.num_nodes,) + logits.shape[1:], -np.inf)
    np.maximum.at(peak, g.dst, logits)
    coeff = np.exp(logits - peak[g.dst])
    alpha = coeff / add_at(g, coeff)[g.dst]
    return add_at(g, alpha * feat[g.src])


def values_of(t, layer):
    return [t.variable_value(p) for p in layer.parameters()]


def check_gradients(t, loss, wrt, feeds, rng, coords=3, eps=1e-6):
    """ng.grad with respect to placeholders or variables against central differences."""
    placeholders, values = [p for p, _ in feeds], [v for _, v in feeds]
    grads = t.computation(ng.grad(loss, wrt), *placeholders)(*values)
    f = t.computation(loss, *placeholders)
    fed = dict(feeds)
    for x, grad in zip(wrt, grads):
        base = fed[x] if x in fed else t.variable_value(x)
        for _ in range(coords):
            idx = tuple(rng.integers(0, s) for s in base.shape)
            shifted = []
            for sign in (1, -1):
                moved = base.copy()
                moved[idx] += sign * eps
                if x in fed:
                    shifted.append(f(*[moved if p is x else v for p, v in feeds]))
                else:
                    t.set_variable(x, moved)
                    shifted.append(f(*values))
            if x not in fed:
                t.set_variable(x, base)
            numeric = (shifted[0] - shifted[1]) / (2 * eps)
            assert grad[idx] == pytest.approx(numeric, rel=1e-5, abs=1e-8), (x, idx)


def weighted_sum(out, seed=2):
    weights = np.random.default_rng(seed).standard_normal(out.shape)
    return ng.sum(out * ng.constant(weights, dtype=out.dtype))


# ---- seed 000's GATConv listing, written with ngnn ops -------------------------------------

def seed_listing(g, nfeat, fc, attn_l, attn_r, num_heads, out_feats):
    """The listing line by line: fc is a dot, view a reshape, attn_l.sum(dim=-1) ng.sum."""
    with ng.zoomIn(graph=g, node_feat=[nfeat]) as v:
        feat_src = [ng.reshape(ng.dot(ng.dropout(n.nfeat, 0.0), fc), (num_heads, out_feats))
                    for n in v.innbs]
        el = [f * ng.sum(attn_l, axis=-1) for f in feat_src]
        er = ng.reshape(ng.dot(ng.dropout(v.nfeat, 0.0), fc), (num_heads, out_feats)) * \
            ng.sum(attn_r, axis=-1)
        coeff = [ng.exp(ng.leaky_relu(l + er)) for l in el]
        s = sum(coeff)
        alpha = [c / s for c in coeff]
        rst = sum([ef[0] * ef[1] for ef in zip(alpha, feat_src)])
    return ng.zoomOut(rst)


def seed_listing_standard(g, nfeat, fc, attn_l, attn_r, num_heads, out_feats):
    """The same with the usual per-head attention: el = sum(f * attn_l, axis=-1)."""
    with ng.zoomIn(graph=g, node_feat=[nfeat]) as v:
        feat_src = [ng.reshape(ng.dot(n.nfeat, fc), (num_heads, out_feats)) for n in v.innbs]
        el = [ng.sum(f * attn_l, axis=-1, keepdims=True) for f in feat_src]
        er = ng.sum(ng.reshape(ng.dot(v.nfeat, fc), (num_heads, out_feats)) * attn_r, axis=-1,
                    keepdims=True)
        coeff = [ng.exp(ng.leaky_relu(l + er)) for l in el]
        s = sum(coeff)
        alpha = [c / s for c in coeff]
        rst = sum([ef[0] * ef[1] for ef in zip(alpha, feat_src)])
    return ng.zoomOut(rst)


@pytest.mark.parametrize("listing, attn_shape", [(seed_listing, (2, 3, 2)),
                                                 (seed_listing_standard, (2, 3))])
def test_seed_gat_listing(transformer_factory, listing, attn_shape):
    g, rng = random_graph(3), np.random.default_rng(4)
    heads, out_feats = 2, 3
    nfeat = ng.placeholder((N, IN), dtype=np.float64, name="nfeat")
    fc = ng.placeholder((IN, heads * out_feats), dtype=np.float64, name="fc")
    attn_l = ng.placeholder(attn_shape, dtype=np.float64, name="attn_l")
    attn_r = ng.placeholder(attn_shape, dtype=np.float64, name="attn_r")
    values = [rng.standard_normal(p.shape) * 0.5 for p in (nfeat, fc, attn_l, attn_r)]
    feeds = list(zip((nfeat, fc, attn_l, attn_r), values))
    out = listing(g, nfeat, fc, attn_l, attn_r, heads, out_feats)

    x, w, al, ar = values
    feat = (x @ w).reshape(N, heads, out_feats)
    if listing is seed_listing:
        el, er = feat * al.sum(-1), feat * ar.sum(-1)
    else:
        el, er = (feat * al).sum(-1, keepdims=True), (feat * ar).sum(-1, keepdims=True)
    with transformer_factory() as t:
        result = t.computation(out, *[p for p, _ in feeds])(*values)
        np.testing.assert_allclose(result, attention_reference(g, feat, el, er), rtol=1e-5,
                                   atol=1e-12)
        check_gradients(t, weighted_sum(out), [fc, attn_l, attn_r], feeds, rng)


# ---- layers ------------------------------------------------------------------------------------

def gcn_reference(g, x, w, b):
    def inv_sqrt(degree):
        return np.where(degree > 0, 1 / np.sqrt(np.maximum(degree, 1)), 0.0)
    src_norm = inv_sqrt(np.bincount(g.src, minlength=N))
    dst_norm = inv_sqrt(np.bincount(g.dst, minlength=N))
    return add_at(g, (x * src_norm[:, None])[g.src]) * dst_norm[:, None] @ w + b


@pytest.mark.parametrize("out_feats", [3, 7])     # transform first, aggregate first
def test_gcn(transformer_factory, out_feats):
    g, (h, x) = random_graph(5).add_self_loops(), features()
    layer = nn.GCNConv(IN, out_feats, seed=1, dtype=np.float64)
    with transformer_factory() as t:
        out = t.computation(layer(g, h), h)(x)
        w, b = values_of(t, layer)
    np.testing.assert_allclose(out, gcn_reference(g, x, w, b), rtol=1e-10)


def test_gcn_without_self_loops_keeps_isolated_vertices_finite(transformer_factory):
    g, (h, x) = random_graph(6), features(np.float32)
    layer = nn.GCNConv(IN, 4, bias=False)
    assert len(layer.parameters()) == 1
    with transformer_factory() as t:
        out = t.computation(layer(g, h), h)(x)
        (w,) = values_of(t, layer)
    assert np.all(np.isfinite(out)) and np.all(out[-2:] == 0)
    np.testing.assert_allclose(out, gcn_reference(g, x, w, 0), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("out_feats", [3, 7])
def test_sage(transformer_factory, out_feats):
    g, (h, x) = random_graph(7), features()
    layer = nn.SAGEConv(IN, out_feats, seed=2, dtype=np.float64)
    out = layer(g, h)
    with transformer_factory() as t:
        result = t.computation(out, h)(x)
        w_self, w_neigh, b = values_of(t, layer)
        mean = add_at(g, x[g.src]) / np.maximum(np.bincount(g.dst, minlength=N), 1)[:, None]
        np.testing.assert_allclose(result, x @ w_self + mean @ w_neigh + b, rtol=1e-10)
        check_gradients(t, weighted_sum(out), layer.parameters() + [h], [(h, x)],
                        np.random.default_rng(8))


def test_gin(transformer_factory):
    g, (h, x) = random_graph(9), features()
    layer = nn.GINConv(IN, 3, eps=0.25, hidden=6, seed=3, dtype=np.float64)
    with transformer_factory() as t:
        result = t.computation(layer(g, h), h)(x)
        w1, b1, w2, b2 = values_of(t, layer)
    total = 1.25 * x + add_at(g, x[g.src])
    np.testing.assert_allclose(result, np.maximum(total @ w1 + b1, 0) @ w2 + b2, rtol=1e-10)


def test_gat(transformer_factory):
    g, (h, x) = random_graph(10), features()
    layer = nn.GATConv(IN, 3, num_heads=2, feat_drop=0.5, attn_drop=0.5, seed=4,
                       dtype=np.float64)
    out = layer(g, h)           # not training: no dropout
    assert out.shape == (N, 2, 3)
    with transformer_factory() as t:
        result = t.computation(out, h)(x)
        fc, attn_l, attn_r, bias = values_of(t, layer)
        feat = (x @ fc).reshape(N, 2, 3)
        el, er = (feat * attn_l).sum(-1, keepdims=True), (feat * attn_r).sum(-1, keepdims=True)
        np.testing.assert_allclose(result, attention_reference(g, feat, el, er) + bias,
                                   rtol=1e-10)
        assert np.all(result[[0, 1, N - 2, N - 1]] == bias)
        check_gradients(t, weighted_sum(out), layer.parameters() + [h], [(h, x)],
                        np.random.default_rng(11))


def test_gat_has_no_nan_for_large_logits_and_vertices_without_in_edges(transformer_factory):
    g, (h, x) = random_graph(12), features(np.float32)
    layer = nn.GATConv(IN, 4, num_heads=2)
    out = layer(g, h * 1000.0)
    grads = ng.grad(ng.sum(out), layer.parameters())
    with transformer_factory() as t:
        results = t.computation([out] + grads, h)(x)
    for value in results:
        assert np.all(np.isfinite(value))
    assert np.all(results[0][[0, 1, N - 2, N - 1]] == 0)


def test_gat_dropout_only_when_training():
    g, (h, _) = random_graph(13), features()
    layer = nn.GATConv(IN, 3, num_heads=2, feat_drop=0.5, attn_drop=0.5)

    def mask_shapes(out):
        with ng.transformers.make_transformer("numpy") as t:
            comp = t.computation(out, h)
            comp.transform()
            return {op.shape for op in comp.ordered_ops if isinstance(op, Dropout)}

    assert mask_shapes(layer(g, h, training=True)) == {(N, IN), (E, 2, 1)}
    assert mask_shapes(layer(g, h)) == set()


def test_cse_after_batching_leaves_one_linear_transform_in_gat():
    g, (h, x) = random_graph(14), features(np.float32)
    layer = nn.GATConv(IN, 4, num_heads=2)
    with ng.transformers.make_transformer("numpy") as t:
        comp = t.computation(layer(g, h), h)
        comp(x)
        assert comp.ir_after("Trace").count("node::dot") == 2      # n.h @ fc and v.h @ fc
        assert comp.ir_after("OperationBatching").count("node::dot") == 2
        assert sum(isinstance(op, Dot) for op in comp.ordered_ops) == 1
        assert comp.ir.count("node::dot") == 1
