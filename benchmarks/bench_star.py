"""Work linear in degree on a hub: seed 000's GAT written per vertex (the softmax's sum
`s = sum(c)`, then `c / s` per edge) on a star whose centre has N in-edges, one call of
the forward alone (as evaluation and inference run it), GPU transformer against NumPy.

    python benchmarks/bench_star.py --centres 2000 20000 300000

Prints seconds per call (best of --repeat) for both backends and, for the GPU, the time
against the smallest centre's scaled linearly (1.0 = exactly linear; the generated code
was quadratic in the centre's degree before a gathered value of the loop's own vertex
was hoisted: 1.31 s and 193.5 s for 2,000 and 20,000 in-edges on PoCL).
"""
import argparse
import time

import numpy as np

import ngnn as ng
from ngnn import transformers as ngt

HEADS, WIDTH, FEATURES = 8, 8, 16


def star(leaves):
    return ng.Graph.from_edges(np.arange(1, leaves + 1), np.zeros(leaves, np.int64),
                               num_nodes=leaves + 1)


def seed_gat(g, h):
    rng = np.random.default_rng(0)
    weights = ng.constant(rng.standard_normal((FEATURES, HEADS * WIDTH)) * 0.1)
    attn_l, attn_r = (ng.constant(rng.standard_normal((HEADS, WIDTH)) * 0.1) for _ in range(2))
    feat = ng.reshape(ng.dot(h, weights), (g.num_nodes, HEADS, WIDTH))
    el, er = ng.sum(feat * attn_l, axis=-1), ng.sum(feat * attn_r, axis=-1)
    with ng.zoomIn(g, node_feat={"f": feat, "el": el, "er": er}) as v:
        coeff = [ng.exp(ng.leaky_relu(n.el + v.er, 0.2)) for n in v.innbs]
        s = sum(coeff)
        rst = sum(ng.reshape(c / s, (HEADS, 1)) * n.f for c, n in zip(coeff, v.innbs))
    return ng.zoomOut(rst)


def seconds_per_call(backend, g, repeat):
    h = ng.placeholder((g.num_nodes, FEATURES), name="h")
    x = np.random.default_rng(1).standard_normal((g.num_nodes, FEATURES)).astype(np.float32)
    with ngt.make_transformer(backend) as t:
        comp = t.computation(seed_gat(g, h), h)
        comp(x)                                 # compile, upload
        best = float("inf")
        for _ in range(repeat):
            start = time.perf_counter()
            comp(x)
            best = min(best, time.perf_counter() - start)
    return best


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--centres", type=int, nargs="+", default=[2000, 20000, 300000])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print("| centre in-edges | numpy s | gpu s | gpu / linear from the first |")
    print("|---|---|---|---|")
    first = None
    for centre in args.centres:
        g = star(centre)
        numpy_s, gpu_s = (seconds_per_call(b, g, args.repeat) for b in ("numpy", "gpu"))
        first = first or (centre, gpu_s)
        linear = first[1] * centre / first[0]
        print(f"| {centre} | {numpy_s:.4f} | {gpu_s:.4f} | {gpu_s / linear:.2f} |", flush=True)


if __name__ == "__main__":
    main()
