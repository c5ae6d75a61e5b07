"""An R-GCN training step on a typed R-MAT graph: ngnn (NumPy transformer) against PyTorch
Geometric's RGCNConv and FastRGCNConv, on the CPU, in one run.

    python benchmarks/bench_rgcn.py                    # 100,000 vertices, 1.6M edges, R = 16
    python benchmarks/bench_rgcn.py --num-nodes 20000 --steps 5

The model on every side: RGCNConv (64 -> 64, per-relation mean, root weight, bias; ngnn's
written per vertex with `v.innbs.of_type(r)`, so "lowering of_type"), ReLU,
RGCNConv (64 -> classes), cross-entropy over all vertices, one Adam step. The graph is
datasets.synthetic("rmat", ..., num_relations=R): a directed R-MAT graph with relation ids
drawn uniformly, 64 Gaussian features.

Each side runs in its own process (one at a time): it builds the data, records its
resident memory, runs one warm-up step (ngnn compiles there), then times `--steps` steps
and reports the median time and its peak resident memory above the memory held before
the model was built (VmHWM after malloc_trim and a reset of the peak, see settled_rss;
the method is the same for all three). ngnn also reports `comp.memory_plan.peak_bytes`, the intermediate buffers of its plan; PyG its
peak of live tensor bytes during one step, from torch.profiler's memory events
(profile_memory=True: every allocation and free, summed in time order).

FastRGCNConv gathers one F x O weight matrix per edge (E x F x O floats, 26 GB at the full
size per layer), so it runs only where that fits in `--fast-limit` bytes; it is skipped,
with the size it would need, otherwise. The script asserts on ngnn's plan that no tensor of
E x F x O or E x O x F elements is computed, and prints the ratios against the faster PyG
layer that ran.
"""
import argparse
import ctypes
import json
import os
import resource
import subprocess
import sys
import time

import numpy as np

THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
SIDES = ("ngnn", "pyg", "pyg_fast")


def peak_rss():
    """The peak resident memory since `settled_rss` (Linux's VmHWM, which it resets), else
    since the process started (getrusage)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def settled_rss():
    """Resident memory once the C allocator has returned its free pages (malloc_trim), with
    the peak reset to it (writing 5 to /proc/self/clear_refs resets VmHWM). The data's
    construction frees ~120 MB that later allocations would otherwise reuse unseen, and
    its own peak would hide any lower one after it: without both, either side's growth
    would be understated."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):     # not glibc: the baseline is as it stands
        pass
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass
    return rss()


def make_data(args):
    from ngnn import datasets
    return datasets.synthetic("rmat", args.num_nodes, args.num_edges / args.num_nodes,
                              args.features, args.classes, seed=0,
                              num_relations=args.relations)


# ---- the sides -----------------------------------------------------------------------------

def run_ngnn(args, data):
    import ngnn as ng
    from ngnn import nn, optim
    from ngnn import transformers as ngt
    g = data.graph
    before = settled_rss()
    model = nn.RGCN(args.features, args.hidden, args.classes, num_relations=args.relations)
    x = ng.placeholder(data.features.shape, name="x")
    labels = ng.placeholder((g.num_nodes,), dtype=np.int64, name="y")
    loss = ng.cross_entropy(model(g, x, training=True), labels)
    updates = optim.Adam(model.parameters(), lr=0.01).updates(loss)
    t = ngt.make_transformer("numpy")
    step = t.computation([loss] + updates, x, labels)
    times = timed(lambda: step(data.features, data.labels), args.steps)
    E, F, O = g.num_edges, args.features, args.hidden
    per_edge_weights = [op for op in step.ordered_ops if op.size >= E * F * O]
    assert not per_edge_weights, f"an E x F x O tensor is computed: {per_edge_weights}"
    choices = sorted({name for name in ("per_relation", "segments", "transform_first",
                                        "of_type") if f"%relation_{name}" in step.ir})
    return dict(times=times, rss=peak_rss() - before, plan=step.memory_plan.peak_bytes,
                loss=float(step(data.features, data.labels)[0]), lowering=choices)


def run_pyg(args, data, fast):
    import torch
    from torch_geometric.nn import FastRGCNConv, RGCNConv
    torch.manual_seed(0)
    g = data.graph
    x = torch.from_numpy(data.features)
    y = torch.from_numpy(data.labels)
    edge_index = torch.from_numpy(np.stack([g.src, g.dst]))
    edge_type = torch.from_numpy(g.edge_type)
    before = settled_rss()
    layer = FastRGCNConv if fast else RGCNConv
    conv1 = layer(args.features, args.hidden, args.relations)
    conv2 = layer(args.hidden, args.classes, args.relations)
    params = list(conv1.parameters()) + list(conv2.parameters())
    optimizer = torch.optim.Adam(params, lr=0.01)

    def step():
        optimizer.zero_grad()
        h = torch.relu(conv1(x, edge_index, edge_type))
        loss = torch.nn.functional.cross_entropy(conv2(h, edge_index, edge_type), y)
        loss.backward()
        optimizer.step()
        return loss
    times = timed(step, args.steps)
    rss_peak = peak_rss() - before
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        loss = step()
    return dict(times=times, rss=rss_peak, profiled=profiled_peak(prof), loss=float(loss))


def profiled_peak(prof):
    """Peak of live bytes over one step: each op's own net allocation (its children's
    excluded) and the frees between ops ("[memory]" events), in time order. Transient
    peaks inside one op are not seen, so this is a lower bound of PyG's peak."""
    events = sorted((e.time_range.start, e.self_cpu_memory_usage) for e in prof.events())
    live = peak = 0
    for _, change in events:
        live += change
        peak = max(peak, live)
    return peak


def timed(step, steps):
    step()                                # warm-up (ngnn compiles here)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return times


def worker(args):
    data = make_data(args)
    if args.worker == "ngnn":
        result = run_ngnn(args, data)
    else:
        result = run_pyg(args, data, fast=args.worker == "pyg_fast")
    print("RESULT " + json.dumps(result))


# ---- the parent ---------------------------------------------------------------------------

def run_side(side, args):
    command = [sys.executable, __file__, "--worker", side] + [
        f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items()
        if k not in ("worker", "fast_limit")]
    env = dict(os.environ, **{v: str(args.threads) for v in THREAD_VARIABLES})
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode or not lines:
        return {"error": (done.stderr.strip().splitlines() or ["no output"])[-1]}
    return json.loads(lines[-1][len("RESULT "):])


def mib(nbytes):
    return f"{nbytes / (1 << 20):8.1f} MiB"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-nodes", type=int, default=100_000)
    parser.add_argument("--num-edges", type=int, default=1_600_000)
    parser.add_argument("--relations", type=int, default=16)
    parser.add_argument("--features", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--classes", type=int, default=8)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--fast-limit", type=float, default=4e9,
                        help="largest E x F x O bytes FastRGCNConv may allocate")
    parser.add_argument("--worker", choices=SIDES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    per_edge = 4 * args.num_edges * args.features * args.hidden
    print(f"R-GCN step, typed R-MAT: {args.num_nodes} vertices, {args.num_edges} edges, "
          f"{args.relations} relations, {args.features} -> {args.hidden} -> {args.classes}, "
          f"CPU, {args.threads} thread(s), median of {args.steps} steps")
    results = {}
    for side in SIDES:
        if side == "pyg_fast" and per_edge > args.fast_limit:
            results[side] = {"error": f"skipped: its per-edge weights alone take "
                                      f"{per_edge / 1e9:.1f} GB (> --fast-limit)"}
        else:
            results[side] = run_side(side, args)
        r = results[side]
        if "error" in r:
            print(f"{side:9s} {r['error']}")
            continue
        extra = f"plan peak {mib(r['plan'])}, lowering {', '.join(r['lowering'])}" \
            if side == "ngnn" else f"profiler peak {mib(r['profiled'])}"
        print(f"{side:9s} {1000 * np.median(r['times']):9.1f} ms/step   peak RSS above "
              f"baseline {mib(r['rss'])}   {extra}   loss {r['loss']:.4f}", flush=True)
    ours = results["ngnn"]
    ran = {s: r for s, r in results.items() if s != "ngnn" and "error" not in r}
    if "error" in ours or not ran:
        return 1
    fastest = min(ran, key=lambda s: np.median(ran[s]["times"]))
    theirs = ran[fastest]
    print(f"against {fastest} (the faster PyG layer that ran): "
          f"{np.median(theirs['times']) / np.median(ours['times']):.2f}x the speed, "
          f"{theirs['rss'] / max(ours['rss'], 1):.2f}x less peak RSS, "
          f"{theirs['profiled'] / max(ours['plan'], 1):.2f}x less (profiled PyG tensors "
          f"/ ngnn's planned buffers)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
