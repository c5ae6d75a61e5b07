"""Distributed full-graph training: epoch time with 1 and 2 MPI ranks per partition policy,
with the communication time and bytes apart, and the single-process NumPy transformer (and
PyG, when installed) in the same run.

    python benchmarks/bench_distributed.py --nodes 500000 --models gcn,sage,gat

Every configuration runs in its own `mpiexec -n K` (pip's mpich) on an R-MAT graph
(average degree 10, 64 features, 8 classes; GCN and GraphSAGE hidden 16, GAT 4 heads of 4,
dropout on, Adam). An epoch is one training step plus one evaluation pass, as `ngnn
train` reports it; the table gives the median over the timed epochs of the slowest rank,
in wall-clock time and in CPU time (what the rank computed, whatever else ran on the
machine), the communication seconds of the slowest rank, and the bytes all ranks sent per
epoch. `--float32-sums` turns float64 accumulation off (ngnn.passes.WideAccumulation), to
see what exactness costs. The row "2 x 1 process" runs two single processes at once: how much two processes
slow each other down on this machine at that moment (shared cores, one memory bus), the
floor under any 2-rank figure.
"""
import argparse
import json
import os
import subprocess
import sys
import time

# ngnn before NumPy: under mpiexec, importing it gives each rank its share of the cores'
# BLAS threads, which OpenBLAS reads once, when NumPy loads it (ngnn/local_ranks.py).
from ngnn.distributed.launch import find_mpiexec  # noqa: I001
import numpy as np

FEATURES, CLASSES, DEGREE = 64, 8, 10


def dataset(nodes):
    from ngnn import datasets
    return datasets.synthetic("rmat", nodes, DEGREE, FEATURES, CLASSES, seed=0)


def model_for(name, data):
    from ngnn import nn, optim
    model = {"gcn": lambda: nn.GCN(FEATURES, 16, CLASSES, dropout=0.5, seed=0),
             "sage": lambda: nn.GraphSAGE(FEATURES, 16, CLASSES, dropout=0.5, seed=0),
             "gat": lambda: nn.GAT(FEATURES, hidden=4, heads=4, num_classes=CLASSES,
                                   dropout=0.5, seed=0)}[name]()
    return model, optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)


def epochs_timed(trainer, epochs):
    """(wall seconds, CPU seconds) of each epoch after the first (which compiles)."""
    times, cpu = [], []
    for _ in range(epochs + 1):
        start, start_cpu = time.perf_counter(), time.process_time()
        trainer.step()
        trainer.epoch_metrics()
        times.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return times[1:], cpu[1:]


def worker(args):
    """One configuration; prints a JSON line (rank 0)."""
    from ngnn import distributed as dist
    from ngnn.train import Trainer
    from ngnn import transformers as ngt
    data = dataset(args.nodes)
    model, optimizer = model_for(args.model, data)
    transformer = ngt.make_transformer("numpy", wide_accumulation=not args.float32_sums)
    if args.policy == "single":
        trainer = Trainer(model, data, optimizer, seed=0, transformer=transformer)
        times, cpu = epochs_timed(trainer, args.epochs)
        print(json.dumps({"epoch": float(np.median(times)), "cpu": float(np.median(cpu))}),
              flush=True)
        return
    comm = dist.world()
    start = time.perf_counter()
    parts = dist.partition(data.graph, comm.Get_size(), args.policy)
    partition_seconds = time.perf_counter() - start
    trainer = dist.DistributedTrainer(model, data, parts.part(comm.Get_rank()), optimizer,
                                      seed=0, transformer=transformer)
    trainer.step()
    trainer.epoch_metrics()
    before = trainer.communication()
    times, cpu = epochs_timed(trainer, args.epochs - 1)
    after = trainer.communication()
    from mpi4py import MPI
    slowest = comm.allreduce(float(np.median(times)), op=MPI.MAX)
    busiest = comm.allreduce(float(np.median(cpu)), op=MPI.MAX)
    epochs = len(times) + 1           # communication counts every epoch run since `before`
    if comm.Get_rank() == 0:
        print(json.dumps({
            "epoch": slowest, "cpu": busiest, "partition": partition_seconds,
            "replication": parts.replication_factor,
            "sync_bytes": (after[0]["sync"] - before[0]["sync"]) / epochs,
            "allreduce_bytes": (after[0]["allreduce"] - before[0]["allreduce"]) / epochs,
            "sync_seconds": (after[1]["sync"] - before[1]["sync"]) / epochs,
            "allreduce_seconds": (after[1]["allreduce"] - before[1]["allreduce"]) / epochs}),
            flush=True)


def pyg_epoch(name, nodes, epochs):
    """Epoch time of the same model in PyTorch Geometric, or None when it is not installed."""
    try:
        import torch
        import torch_geometric.nn as gnn
    except ImportError:
        return None
    data = dataset(nodes)
    g = data.graph
    edge_index = torch.as_tensor(np.stack([g.src, g.dst]))
    x = torch.as_tensor(data.features)
    y = torch.as_tensor(data.labels)
    train = torch.as_tensor(data.train_mask)
    conv = {"gcn": lambda i, o: gnn.GCNConv(i, o), "sage": lambda i, o: gnn.SAGEConv(i, o),
            "gat": lambda i, o: gnn.GATConv(i, o // 4 if o == 16 else o,
                                            heads=4 if o == 16 else 1)}[name]
    layers = torch.nn.ModuleList([conv(FEATURES, 16), conv(16, CLASSES)])
    optimizer = torch.optim.Adam(layers.parameters(), lr=0.01, weight_decay=5e-4)
    times = []
    for _ in range(epochs + 1):
        start = time.perf_counter()
        layers.train()
        h = torch.relu(layers[0](torch.nn.functional.dropout(x, 0.5), edge_index))
        out = layers[1](torch.nn.functional.dropout(h, 0.5), edge_index)
        loss = torch.nn.functional.cross_entropy(out[train], y[train])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        with torch.no_grad():
            layers.eval()
            layers[1](torch.relu(layers[0](x, edge_index)), edge_index)
        times.append(time.perf_counter() - start)
    return float(np.median(times[1:]))




def run(ranks, model, policy, args, copies=1):
    """The worker's report; with `copies`, that many single processes at once (the
    slowest one's report)."""
    command = [sys.executable, os.path.abspath(__file__), "--worker", "--model", model,
               "--policy", policy, "--nodes", str(args.nodes), "--epochs", str(args.epochs)] + \
        (["--float32-sums"] if args.float32_sums else [])
    if policy != "single":
        command = [find_mpiexec(), "-n", str(ranks)] + command
    running = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True) for _ in range(copies)]
    reports = []
    for process in running:
        out, err = process.communicate(timeout=3600)
        if process.returncode != 0:
            raise SystemExit(f"{' '.join(command)} failed:\n{err[-3000:]}")
        reports.append(json.loads(out.strip().splitlines()[-1]))
    return max(reports, key=lambda r: r["epoch"])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=500000)
    parser.add_argument("--models", default="gcn,sage,gat")
    parser.add_argument("--policies", default="oec,iec,cvc,metis")
    parser.add_argument("--ranks", default="1,2")
    parser.add_argument("--epochs", type=int, default=4, help="timed epochs per run")
    parser.add_argument("--float32-sums", action="store_true",
                        help="sums in float32 (wide_accumulation=False): faster, but K ranks "
                             "then differ from one process in the last bits")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--policy", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    print(f"R-MAT {args.nodes} vertices, average degree {DEGREE}, {FEATURES} features, "
          f"{os.cpu_count()} cores; median of {args.epochs} epochs (step + evaluation)")
    print(f"{'model':6} {'run':16} {'epoch ms':>9} {'vs 1 rank':>9} {'cpu ms':>7} "
          f"{'vs 1 rank':>9} {'repl.':>6} {'sync MB':>8} {'sync ms':>8} {'allred. KB':>10} "
          f"{'allred. ms':>10} {'part. s':>7}")
    for model in args.models.split(","):
        single = run(1, model, "single", args)
        print(f"{model:6} {'1 process numpy':16} {1000 * single['epoch']:9.1f} {'':9} "
              f"{1000 * single['cpu']:7.1f}")
        both = run(1, model, "single", args, copies=2)
        print(f"{model:6} {'2 x 1 process':16} {1000 * both['epoch']:9.1f} "
              f"{both['epoch'] / single['epoch']:9.2f} {1000 * both['cpu']:7.1f} "
              f"{both['cpu'] / single['cpu']:9.2f}", flush=True)
        pyg = pyg_epoch(model, args.nodes, args.epochs)
        if pyg is not None:
            print(f"{model:6} {'PyG, 1 process':16} {1000 * pyg:9.1f}")
        for policy in args.policies.split(","):
            one = None
            for ranks in (int(k) for k in args.ranks.split(",")):
                r = run(ranks, model, policy, args)
                one = r if ranks == 1 else one
                ratios = [f"{r[k] / one[k]:9.2f}" if one else f"{'':9}"
                          for k in ("epoch", "cpu")]
                print(f"{model:6} {f'{policy}, {ranks} rank' + 's' * (ranks > 1):16} "
                      f"{1000 * r['epoch']:9.1f} {ratios[0]} {1000 * r['cpu']:7.1f} "
                      f"{ratios[1]} {r['replication']:6.3f} "
                      f"{r['sync_bytes'] / 1e6:8.2f} {1000 * r['sync_seconds']:8.1f} "
                      f"{r['allreduce_bytes'] / 1e3:10.1f} "
                      f"{1000 * r['allreduce_seconds']:10.1f} {r['partition']:7.2f}",
                      flush=True)


if __name__ == "__main__":
    main()
