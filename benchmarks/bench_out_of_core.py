"""Chunked, streamed execution (memory_budget) against the in-memory run, in one run.

    python benchmarks/bench_out_of_core.py steps --num-nodes 500000 --backends numpy,gpu
    python benchmarks/bench_out_of_core.py schedule --num-nodes 500000 --parts 8
    python benchmarks/bench_out_of_core.py memmap --num-nodes 2000000 --features 256

steps: a GCN and a GAT training step (the paper's sizes: GCN 16 hidden, GAT 8 hidden x 8
  heads, dropout, Adam) on R-MAT (average degree 10, 64 features), in memory and under
  budgets of 1/2, 1/4 and 1/8 of the unchunked plan, on each backend: median seconds per
  step over --repeat steps after a warm-up step (wall and CPU), the ratio to in memory,
  chunks, the device's peak allocated bytes against the budget, the host memory a step
  allocates at its peak (tracemalloc; for the NumPy transformer in memory plus its
  planned buffers, which it allocates before the first step), bytes to and from the device
  and the share of the reader thread's transfer time hidden behind computation.
schedule: selective scheduling against whole-chunk streaming at P = --parts, in the
  R-MAT order and after Graph.reorder("degree"): rows the edge pieces load, bytes to the
  device, and whether the two give the same loss and weights; also the rows the seed's
  per-chunk rule would load on the whole-chunk pieces (counted, not run).
memmap: a GCN training step on R-MAT with features in a file on disk (float32 rows,
  numpy.memmap), chunked (memory_budget), and the same step with the features in memory,
  each in a fresh process running two steps: peak resident set (VmHWM) of each, the
  second step's seconds and the first step's loss.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import tracemalloc

# One BLAS thread per process, for every run alike (as bench_simulate.py): with other jobs
# on the two cores, OpenBLAS's spinning threads stalled a 32 x 22,000 x 32 product for
# seconds in some runs and not in others.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

import ngnn as ng  # noqa: E402
from ngnn import datasets, nn, optim  # noqa: E402
from ngnn import transformers as ngt  # noqa: E402
from ngnn.out_of_core import plan_bytes  # noqa: E402
from ngnn.op_graph import seed_dropout  # noqa: E402

CLASSES, DEGREE = 8, 10


def models(features):
    return {"gcn": lambda: nn.GCN(features, 16, CLASSES),
            "gat": lambda: nn.GAT(features, 8, 8, CLASSES)}


def training_step(model, data, transformer, features=None):
    """The trainer's step, built directly (no evaluation computation): loss and updates."""
    g = data.graph
    x = ng.placeholder((g.num_nodes, model.layers[0][1].parameters()[0].shape[0]),
                       name="features")
    y = ng.placeholder((g.num_nodes,), dtype=np.int64, name="labels")
    mask = ng.placeholder((g.num_nodes,), dtype=np.bool_, name="train_mask")
    loss = ng.cross_entropy(model(g, x, training=True), y, mask)
    updates = optim.Adam(model.parameters(), lr=0.01).updates(loss)
    seed_dropout([loss] + updates, 0)
    comp = transformer.computation([loss] + updates, x, y, mask, name="train_step")
    values = (data.features if features is None else features, data.labels, data.train_mask)
    return comp, values


def timed_steps(comp, values, repeat):
    """Median wall and CPU (this process, all threads) seconds per step (on a machine
    shared with other jobs the CPU time is the steadier figure), and the host memory a
    step allocates at its peak (tracemalloc, which sees NumPy's buffers; an extra step)."""
    comp(*values)                       # compiles
    tracemalloc.start()
    comp(*values)
    host_peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    wall, cpu = [], []
    for _ in range(repeat):
        start, start_cpu = time.perf_counter(), time.process_time()
        comp(*values)
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return float(np.median(wall)), float(np.median(cpu)), host_peak


def steps(args):
    data = datasets.synthetic("rmat", args.num_nodes, DEGREE, args.features, CLASSES)
    print(f"R-MAT {data.graph.num_nodes} nodes, {data.graph.num_edges} edges, "
          f"{args.features} features; median of {args.repeat} steps")
    print("| model | backend | budget | chunks | s/step | x in memory | CPU s/step | x in memory "
          "| device peak MiB | budget MiB | host peak MiB | to device MiB | from device MiB | "
          "hidden transfer |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    mib = 2 ** 20
    for name, make in models(args.features).items():
        if name not in args.models:
            continue
        for backend in args.backends:
            t = ngt.make_transformer(backend)
            comp, values = training_step(make(), data, t)
            need = plan_bytes(comp)
            base, base_cpu, host = timed_steps(comp, values, args.repeat)
            if backend == "numpy":       # its buffers, allocated before the step, are host memory
                host += comp.memory_plan.peak_bytes
            t.close()
            print(f"| {name} | {backend} | in memory | 1 | {base:.3f} | 1.00 | {base_cpu:.3f} | "
                  f"1.00 | {need / mib:.1f} (plan) | | {host / mib:.0f} | | | |", flush=True)
            for fraction in args.fractions:
                budget = int(need * fraction)
                t = ngt.make_transformer(backend, memory_budget=budget)
                comp, values = training_step(make(), data, t)
                seconds, cpu, host = timed_steps(comp, values, args.repeat)
                s = comp.stats
                print(f"| {name} | {backend} | 1/{round(1 / fraction)} | {s['chunks']} | "
                      f"{seconds:.3f} | {seconds / base:.2f} | {cpu:.3f} | {cpu / base_cpu:.2f} | "
                      f"{s['device_peak_bytes'] / mib:.1f} | {budget / mib:.1f} | "
                      f"{host / mib:.0f} | "
                      f"{s['bytes_to_device'] / mib:.0f} | {s['bytes_from_device'] / mib:.0f} | "
                      f"{s['hidden_transfer_share']:.0%} |", flush=True)
                t.close()


def schedule(args):
    data = datasets.synthetic("rmat", args.num_nodes, DEGREE, args.features, CLASSES)
    g2, order = data.graph.reorder("degree")
    orders = {"R-MAT order": data, "degree order": reordered(data, g2, order)}
    print(f"R-MAT {data.graph.num_nodes} nodes, {data.graph.num_edges} edges, P = {args.parts}, "
          "GCN training step (self loops added)")
    print("| order | schedule | pieces | rows loaded | x whole | edge stages to device MiB | "
          "x whole | all to device MiB | x whole | same step |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for label, d in orders.items():
        runs = {}
        for selective in (False, True):
            t = ngt.make_transformer("numpy", chunks=args.parts, selective_scheduling=selective)
            model = models(args.features)["gcn"]()
            comp, values = training_step(model, d, t)
            outputs = comp(*values)
            runs[selective] = (outputs, comp.stats, comp.executor.grid)
        same = all(np.allclose(a, b, rtol=1e-5, atol=1e-7)
                   for a, b in zip(runs[True][0], runs[False][0]))
        whole, grid = runs[False][1], runs[False][2]
        per_chunk = per_chunk_selective_rows(grid)
        print(f"| {label} | whole chunks | {len(grid.pieces)} | {whole['loaded_rows']} | 1.00 | "
              f"{whole['edge_stage_bytes_to_device'] / 2**20:.0f} | 1.00 | "
              f"{whole['bytes_to_device'] / 2**20:.0f} | 1.00 | |")
        print(f"| {label} | selective, per chunk (not run) | {len(grid.pieces)} | {per_chunk} | "
              f"{per_chunk / whole['loaded_rows']:.2f} | | | | | |")
        s = runs[True][1]
        print(f"| {label} | selective, equal pieces | {s['pieces']} | {s['loaded_rows']} | "
              f"{s['loaded_rows'] / whole['loaded_rows']:.2f} | "
              f"{s['edge_stage_bytes_to_device'] / 2**20:.0f} | "
              f"{s['edge_stage_bytes_to_device'] / whole['edge_stage_bytes_to_device']:.2f} | "
              f"{s['bytes_to_device'] / 2**20:.0f} | "
              f"{s['bytes_to_device'] / whole['bytes_to_device']:.2f} | "
              f"{'yes' if same else 'NO'} |", flush=True)


def per_chunk_selective_rows(grid):
    """Rows the whole-chunk pieces would load under the seed's per-chunk rule: the used
    destinations plus the used sources that are not destinations."""
    g, rows = grid.graph, 0
    for piece in grid.pieces:
        used_dst = np.unique(g.dst[piece.eids])
        rows += used_dst.shape[0] + np.setdiff1d(np.unique(g.src[piece.eids]), used_dst,
                                                 assume_unique=True).shape[0]
    return rows


def reordered(data, graph, order):
    from dataclasses import replace
    return replace(data, graph=graph, features=data.features[order], labels=data.labels[order],
                   train_mask=data.train_mask[order], val_mask=data.val_mask[order],
                   test_mask=data.test_mask[order])


def memmap(args):
    with tempfile.TemporaryDirectory(dir=args.dir) as folder:
        prepare(folder, args)
        size = os.path.getsize(os.path.join(folder, "features.f32"))
        print(f"R-MAT {args.num_nodes} nodes, features {args.features} wide on disk: "
              f"{size / 2**30:.2f} GiB")
        print("| run | peak resident GiB | s/step | loss |")
        print("|---|---|---|---|")
        results = {}
        for mode in ("memmap", "in-memory"):
            out = subprocess.run([sys.executable, __file__, "memmap-child", folder, mode,
                                  str(args.budget_mib)], capture_output=True, text=True)
            if out.returncode:
                raise SystemExit(f"{mode} run failed:\n{out.stderr}")
            results[mode] = json.loads(out.stdout.strip().splitlines()[-1])
            r = results[mode]
            print(f"| {mode} | {r['peak_gib']:.2f} | {r['seconds']:.1f} | {r['loss']:.6f} |",
                  flush=True)
        ratio = results["in-memory"]["peak_gib"] / results["memmap"]["peak_gib"]
        print(f"in-memory / memmap peak resident: {ratio:.2f}x")


def prepare(folder, args):
    data = datasets.synthetic("rmat", args.num_nodes, DEGREE, 1, CLASSES)
    g = data.graph
    np.savez(os.path.join(folder, "graph.npz"), src=g.src, dst=g.dst, labels=data.labels,
             train_mask=data.train_mask)
    features = np.memmap(os.path.join(folder, "features.f32"), dtype=np.float32, mode="w+",
                         shape=(g.num_nodes, args.features))
    rng = np.random.default_rng(0)
    for start in range(0, g.num_nodes, 1 << 16):
        stop = min(start + (1 << 16), g.num_nodes)
        features[start:stop] = rng.standard_normal((stop - start, args.features),
                                                   dtype=np.float32)
    features.flush()
    del features


def memmap_child(folder, mode, budget_mib):
    arrays = np.load(os.path.join(folder, "graph.npz"))
    g = ng.Graph(arrays["src"], arrays["dst"], arrays["labels"].shape[0])
    n = g.num_nodes
    path = os.path.join(folder, "features.f32")
    width = os.path.getsize(path) // (4 * n)
    if mode == "memmap":
        features = np.memmap(path, dtype=np.float32, mode="r", shape=(n, width))
        t = ngt.make_transformer("numpy", memory_budget=int(budget_mib) << 20)
    else:
        features = np.fromfile(path, dtype=np.float32).reshape(n, width)
        t = ngt.make_transformer("numpy")
    data = datasets.Dataset("rmat", g, features, arrays["labels"], arrays["train_mask"],
                            arrays["train_mask"], arrays["train_mask"], CLASSES)
    comp, values = training_step(models(width)["gcn"](), data, t)
    loss = float(comp(*values)[0])      # compiles
    start = time.perf_counter()
    comp(*values)
    seconds = time.perf_counter() - start
    with open("/proc/self/status") as f:
        peak_kib = next(int(line.split()[1]) for line in f if line.startswith("VmHWM"))
    print(json.dumps({"peak_gib": peak_kib / 2**20, "seconds": seconds, "loss": loss}))


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "memmap-child":
        return memmap_child(*sys.argv[2:])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    for name in ("steps", "schedule", "memmap"):
        p = sub.add_parser(name)
        p.add_argument("--num-nodes", type=int, default=500_000 if name != "memmap"
                       else 2_000_000)
        p.add_argument("--features", type=int, default=64 if name != "memmap" else 256)
    sub.choices["steps"].add_argument("--backends", type=lambda s: s.split(","),
                                      default=["numpy", "gpu"])
    sub.choices["steps"].add_argument("--models", type=lambda s: s.split(","),
                                      default=["gcn", "gat"])
    sub.choices["steps"].add_argument("--fractions", type=lambda s: [float(f) for f in
                                                                     s.split(",")],
                                      default=[1 / 2, 1 / 4, 1 / 8])
    sub.choices["steps"].add_argument("--repeat", type=int, default=3)
    sub.choices["schedule"].add_argument("--parts", type=int, default=8)
    sub.choices["memmap"].add_argument("--budget-mib", type=int, default=512)
    sub.choices["memmap"].add_argument("--dir", default=None,
                                       help="where the features file goes (default: /tmp)")
    args = parser.parse_args()
    {"steps": steps, "schedule": schedule, "memmap": memmap}[args.what](args)


if __name__ == "__main__":
    main()
