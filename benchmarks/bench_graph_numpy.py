"""GCN and GAT layers, forward + backward: the ngnn NumPy transformer against the same
layers written by hand with NumPy and SciPy, in one run.

    python benchmarks/bench_graph_numpy.py --vertices 100000

The graph is a synthetic R-MAT graph with average degree 16 plus self-loops; there are 64
input features, and GAT has 8 heads of 8 features. Both sides compute the layer output and
the gradients of sum(out * R) (R a fixed random tensor) with respect to every parameter,
and the results are checked against each other. The table gives the median time per call
and the tracemalloc high-water mark of one call (buffers ngnn allocates once included).
"""
import argparse
import time
import tracemalloc

import numpy as np
import scipy.sparse

import ngnn as ng
from ngnn import datasets, nn
from ngnn import transformers as ngt

IN_FEATS, HEADS, HEAD_FEATS, GCN_OUT, DEGREE = 64, 8, 8, 64, 16


def ngnn_layer(model, graph, features, probe, fusion):
    x = ng.placeholder(features.shape, name="x")
    layer = nn.GCNConv(IN_FEATS, GCN_OUT, seed=0) if model == "gcn" else \
        nn.GATConv(IN_FEATS, HEAD_FEATS, HEADS, seed=0)
    out = layer(graph, x)
    params = layer.parameters()
    grads = ng.grad(ng.sum(out * ng.constant(probe)), params)
    t = ngt.make_transformer("numpy", fusion=fusion)
    return t.computation([out] + grads, x), t, params


def hand_gcn(graph, x, w, bias, probe):
    """out = D^-1/2 A D^-1/2 (x w) + b, with A[dst, src] counting edges."""
    a = graph.adjacency()
    d_in = np.asarray(graph.in_degrees, np.float32)
    d_out = np.asarray(graph.out_degrees, np.float32)
    norm_dst = np.where(d_in > 0, d_in, 1) ** -0.5
    norm_src = np.where(d_out > 0, d_out, 1) ** -0.5
    a_hat = scipy.sparse.diags(norm_dst) @ a @ scipy.sparse.diags(norm_src)
    a_hat = a_hat.astype(np.float32).tocsr()
    xw = x @ w
    out = a_hat @ xw + bias
    d_xw = a_hat.T @ probe
    return out, x.T @ d_xw, probe.sum(0)


def hand_gat(graph, x, w, attn_l, attn_r, probe, slope=0.2):
    n, e = graph.num_nodes, graph.num_edges
    src, dst = graph.src, graph.dst
    feat = (x @ w).reshape(n, HEADS, HEAD_FEATS)
    el, er = (feat * attn_l).sum(-1), (feat * attn_r).sum(-1)
    pre = el[src] + er[dst]
    act = np.where(pre > 0, pre, slope * pre)
    order, indptr = graph.in_eids, graph.in_indptr
    nonempty = np.diff(indptr) > 0
    peak = np.zeros((n, HEADS), np.float32)
    peak[nonempty] = np.maximum.reduceat(act[order], indptr[:-1][nonempty])
    coeff = np.exp(act - peak[dst])
    into_dst = graph.incidence("dst")
    alpha = coeff / (into_dst @ coeff)[dst]
    out = np.empty((n, HEADS, HEAD_FEATS), np.float32)
    d_feat = np.empty_like(out)
    for h in range(HEADS):
        a_h = scipy.sparse.csr_matrix((alpha[:, h], (dst, src)), shape=(n, n))
        out[:, h] = a_h @ feat[:, h]
        d_feat[:, h] = a_h.T @ probe[:, h]
    d_alpha = np.einsum("ehf,ehf->eh", probe[dst], feat[src])
    d_act = alpha * (d_alpha - (into_dst @ (alpha * d_alpha))[dst])
    d_pre = d_act * np.where(pre > 0, 1.0, slope).astype(np.float32)
    d_el = graph.incidence("src") @ d_pre
    d_er = into_dst @ d_pre
    d_feat += d_el[:, :, None] * attn_l + d_er[:, :, None] * attn_r
    d_w = x.T @ d_feat.reshape(n, HEADS * HEAD_FEATS)
    return (out, d_w, (d_el[:, :, None] * feat).sum(0), (d_er[:, :, None] * feat).sum(0))


def timed(fn, repeats):
    tracemalloc.start()
    result = fn()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return result, float(np.median(times)), peak


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--vertices", type=int, default=100000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    data = datasets.synthetic("rmat", args.vertices, DEGREE, IN_FEATS, 2, seed=0)
    graph = data.graph.add_self_loops()
    features = data.dense_features()
    rng = np.random.default_rng(0)
    print(f"{graph}: forward + backward, median of {args.repeats} calls")
    print("| model | ngnn fused ms | ngnn unfused ms | hand-written ms | fused / hand | "
          "ngnn fused peak MiB | hand-written peak MiB |")
    print("|---|---|---|---|---|---|---|")
    for model in ("gcn", "gat"):
        shape = (graph.num_nodes, GCN_OUT) if model == "gcn" else \
            (graph.num_nodes, HEADS, HEAD_FEATS)
        probe = rng.normal(size=shape).astype(np.float32)
        runs = {}
        for fusion in (True, False):
            comp, t, params = ngnn_layer(model, graph, features, probe, fusion)
            runs[fusion] = timed(lambda: comp(features), args.repeats)
            weights = [t.variable_value(p) for p in params]
        hand = hand_gcn if model == "gcn" else hand_gat
        expected = timed(lambda: hand(graph, features, *weights, probe), args.repeats)
        for got, want in zip(runs[True][0], expected[0]):
            np.testing.assert_allclose(got, want, rtol=2e-3, atol=2e-3 * np.abs(want).max())
        mib = 1 << 20
        print(f"| {model} | {runs[True][1] * 1e3:.0f} | {runs[False][1] * 1e3:.0f} | "
              f"{expected[1] * 1e3:.0f} | {runs[True][1] / expected[1]:.2f} | "
              f"{runs[True][2] / mib:.0f} | {expected[2] / mib:.0f} |", flush=True)


if __name__ == "__main__":
    main()
