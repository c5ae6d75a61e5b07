"""Vertex orders for chunked streaming (seed 003's selective scheduling), in one run:

    python benchmarks/bench_reorder.py                 # R-MAT 500K, average degree 16, P = 8
    python benchmarks/bench_reorder.py --nodes 100000 --policies degree,rcm

The vertices are cut into P equal blocks and the edges into the P x P edge chunks (i, j):
the edges from block i to block j. Streaming the forward pass, chunk (i, j) needs the rows
of block i that its edges leave from; the backward pass, the rows of block j they arrive
at. The table gives the used-row ratio

    sum over the P * P chunks of the distinct source (destination) rows a chunk uses
    ---------------------------------------------------------------------------------
                     P * P * block size  (the rows whole-chunk streaming loads)

for the generator's order, a random relabelling (no locality at all), each policy of
Graph.reorder, and, to show why "degree" sorts by total degree, sorts by in- and by
out-degree alone. It is measured on the R-MAT graph and on the same graph with one self
loop per vertex (what GCN and GAT train on: every vertex is then used by at least its
diagonal chunk). The time of Graph.reorder("degree") is compared with building the
renumbered graph from its edge list, the baseline it avoids, the two run in turn.
"""
import argparse
import time

import numpy as np

import ngnn as ng
from ngnn import datasets
from ngnn.vertex_order import POLICIES, inverse


def used_row_ratio(graph, order, parts):
    """(forward, backward) used-row ratios of `graph` renumbered by `order`."""
    n = graph.num_nodes
    block = -(-n // parts)
    rank = inverse(order)
    src, dst = rank[graph.src], rank[graph.dst]
    ratios = []
    for rows, other in ((src, dst), (dst, src)):
        # One mark per (block of the other end, row): a row counts once per chunk it is in.
        used = np.zeros(parts * n, dtype=bool)
        used[(other // block) * n + rows] = True
        ratios.append(int(np.count_nonzero(used)) / (parts * parts * block))
    return tuple(ratios)


def timed(fns, repeat):
    """(fastest, median) seconds of each of `fns`, run in turn so they share the machine's
    load alike."""
    times = [[] for _ in fns]
    for _ in range(repeat):
        for fn, spent in zip(fns, times):
            start = time.perf_counter()
            fn()
            spent.append(time.perf_counter() - start)
    return [(min(t), float(np.median(t))) for t in times]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=500_000)
    parser.add_argument("--degree", type=float, default=16)
    parser.add_argument("--parts", type=int, default=8, help="P: vertex blocks per axis")
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--repeat", type=int, default=5, help="timed runs of each reorder")
    args = parser.parse_args()
    policies = [p for p in args.policies.split(",") if p]

    data = datasets.synthetic("rmat", args.nodes, args.degree, 1, 2, seed=0)
    graphs = {"R-MAT": data.graph, "+ self loops": data.graph.with_self_loops()}
    g = data.graph
    print(f"R-MAT {g.num_nodes} vertices, {g.num_edges} edges; P = {args.parts}, "
          f"block size {-(-g.num_nodes // args.parts)}; "
          f"{np.mean(g.in_degrees + g.out_degrees == 0):.1%} of the vertices have no edge")

    def baseline():
        order = np.argsort(-(g.in_degrees + g.out_degrees), kind="stable")
        rank = inverse(order)
        ng.Graph.from_edges(rank[g.src], rank[g.dst], num_nodes=g.num_nodes)

    print(f"\nseconds, fastest and median of {args.repeat} (METIS: of 1)")
    (fast, median), (base_fast, base_median) = timed(
        [lambda: g.reorder("degree"), baseline], args.repeat)
    print(f"{'Graph.reorder(degree)':<34}{fast:>8.3f}{median:>8.3f}")
    print(f"{'baseline, run in turn with it':<34}{base_fast:>8.3f}{base_median:>8.3f}"
          "   (degree order, then Graph.from_edges of the renumbered edges)")
    orders = {"original": np.arange(g.num_nodes),
              "random": np.random.default_rng(0).permutation(g.num_nodes)}
    for policy in policies:
        repeat = args.repeat if policy != "metis" else 1      # METIS takes tens of seconds
        orders[policy] = g.reorder(policy, num_parts=args.parts)[1]
        if policy != "degree":
            ((fast, median),) = timed([lambda: g.reorder(policy, num_parts=args.parts)],
                                      repeat)
            print(f"{f'Graph.reorder({policy})':<34}{fast:>8.3f}{median:>8.3f}")
    orders["in-degree only"] = np.argsort(-g.in_degrees, kind="stable")
    orders["out-degree only"] = np.argsort(-g.out_degrees, kind="stable")

    print("\nused-row ratio (forward: source rows, backward: destination rows)")
    print(f"{'':<18}" + "".join(f"{name:>16}" for name in graphs))
    print(f"{'order':<18}" + f"{'fwd':>8}{'bwd':>8}" * len(graphs))
    for name, order in orders.items():
        cells = []
        for graph in graphs.values():
            forward, backward = used_row_ratio(graph, order, args.parts)
            cells.append(f"{forward:>8.3f}{backward:>8.3f}")
        print(f"{name:<18}" + "".join(cells))


if __name__ == "__main__":
    main()
