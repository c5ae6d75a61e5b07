"""What a graph-classification step costs over MPI ranks, and where the time goes.

    python benchmarks/bench_graph_ranks.py --ranks 2 --steps 30

GIN-0 (hidden 64, 5 layers, batch norm, float32, numpy) on MUTAG in batches of 32: the
median training step of `GraphTrainer` in one process, of `DistributedGraphLoaderTrainer`
(the loader's batches over the ranks) and of `DistributedGraphTrainer` (one batch of 32
graphs over the ranks), and of a node-classification `DistributedTrainer` step (GCN,
hidden 64) on an R-MAT graph of about a batch's size. For each run over ranks: the step's
collectives (all-gathers, all-reduces), point-to-point sends and waits, the bytes the
collectives send, the milliseconds a rank spends waiting, and the step's ratio to one
process. Last, a bare 8-byte all-reduce over the ranks, MPICH's blocking call and a
nonblocking one completed by ngnn's wait: the latency floor under every exchange.
Steps run back to back (the loader's load of the next batch is timed apart).
"""
import argparse
import collections
import json
import os
import subprocess
import sys
import time

# ngnn before NumPy: each rank gets its share of the cores' BLAS threads (ngnn/local_ranks.py).
from ngnn.distributed.launch import find_mpiexec  # noqa: I001
import numpy as np

COLLECTIVES = ("Iallgather", "Iallreduce", "Allgather", "Allreduce")


class CountingComm:
    """An MPI communicator that counts the calls made through it and the bytes of each
    call's first array."""

    def __init__(self, comm, calls, sent):
        self._comm, self._calls, self._sent = comm, calls, sent

    def __getattr__(self, name):
        attribute = getattr(self._comm, name)
        if not callable(attribute) or name.startswith("Get_"):
            return attribute

        def counted(*args, **kwargs):
            self._calls[name] += 1
            if args and isinstance(args[0], np.ndarray):
                self._sent[name] += args[0].nbytes
            return attribute(*args, **kwargs)
        return counted


def worker(kind, steps):
    from mpi4py import MPI
    from ngnn import datasets, distributed as dist, nn, optim
    from ngnn.distributed import exchange as exchange_module
    world = MPI.COMM_WORLD
    calls, sent, waited = collections.Counter(), collections.Counter(), [0.0]
    plain_wait = exchange_module.wait

    def timed_wait(requests):
        start = time.perf_counter()
        plain_wait(requests)
        waited[0] += time.perf_counter() - start
        calls["wait"] += 1
    exchange_module.wait = timed_wait
    comm = CountingComm(world, calls, sent)
    data = datasets.load("mutag")
    model = nn.GINGraph(data.num_features, 64, data.num_classes, seed=0)
    if kind in ("single", "loader"):
        from ngnn.graph_train import GraphTrainer
        trainer = GraphTrainer(model, data, batch_size=32, seed=0) if kind == "single" else \
            dist.DistributedGraphLoaderTrainer(model, data, batch_size=32, seed=0, comm=comm)
        everything = np.arange(data.labels.shape[0])

        def batches():
            epoch = 0
            while True:
                yield from trainer.loader.batches(epoch, everything)
                epoch += 1
        loads = batches()
        next(loads)
    elif kind == "batch":
        gb, x = data.batch(np.arange(32))
        part = dist.partition(gb, world.Get_size(), "cvc").part(world.Get_rank())
        trainer = dist.DistributedGraphTrainer(model, gb, x.astype(np.float32),
                                               data.labels[:32], part,
                                               optim.Adam(model.parameters()), comm=comm)
    elif kind == "node":
        graph = datasets.synthetic("rmat", 600, 4, data.num_features, 2, seed=0)
        model = nn.GCN(data.num_features, 64, 2, dropout=0.5, seed=0)
        part = dist.partition(graph.graph, world.Get_size(), "cvc").part(world.Get_rank())
        trainer = dist.DistributedTrainer(model, graph, part, optim.Adam(model.parameters()),
                                          comm=comm)
    else:                                  # the bare all-reduce
        one, total = np.ones(1), np.empty(1)
        report = {}
        for name, call in (("blocking", lambda: world.Allreduce(one, total)),
                           ("ngnn wait", lambda: plain_wait([world.Iallreduce(one, total)]))):
            times = []
            for _ in range(steps + 20):
                start = time.perf_counter()
                call()
                times.append(time.perf_counter() - start)
            report[name] = float(np.median(times[20:]))
        if world.Get_rank() == 0:
            print(json.dumps(report))
        return
    trainer.step()                         # compiles
    calls.clear()
    sent.clear()
    waited[0] = 0.0
    times, loading = [], []
    for _ in range(steps):
        if kind in ("single", "loader"):
            start = time.perf_counter()
            next(loads)
            loading.append(time.perf_counter() - start)
        start = time.perf_counter()
        trainer.step()
        times.append(time.perf_counter() - start)
    report = {"step": float(np.median(times)), "wait": waited[0] / steps,
              "load": float(np.median(loading)) if loading else 0.0,
              "collectives": sum(calls[c] for c in COLLECTIVES) / steps,
              "sends": calls["Isend"] / steps, "waits": calls["wait"] / steps,
              "bytes": sum(sent[c] for c in COLLECTIVES) / steps}
    slowest = world.gather(report, root=0)
    if world.Get_rank() == 0:
        print(json.dumps(max(slowest, key=lambda r: r["step"])))


def run(ranks, kind, steps):
    command = [sys.executable, os.path.abspath(__file__), "--worker", kind,
               "--steps", str(steps)]
    if ranks > 1:
        command = [find_mpiexec(), "-n", str(ranks)] + command
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    if done.returncode:
        sys.exit(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--steps", type=int, default=30, help="timed steps per run")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.worker, args.steps)
    print(f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}; median of "
          f"{args.steps} steps, the slowest rank's")
    single = run(1, "single", args.steps)
    print(f"{'run':40} {'step ms':>8} {'vs 1 process':>12} {'load ms':>8} {'collectives':>11} "
          f"{'sends':>6} {'waits':>6} {'KB':>7} {'wait ms':>8}")
    print(f"{'GIN-0 loader, 1 process':40} {1000 * single['step']:8.2f} {'':12} "
          f"{1000 * single['load']:8.2f}")
    for kind, label in (("loader", "GIN-0 loader"), ("batch", "GIN-0 one batch of 32"),
                        ("node", "GCN node classification, 600 nodes")):
        r = run(args.ranks, kind, args.steps)
        ratio = f"{r['step'] / single['step']:12.2f}" if kind != "node" else f"{'':12}"
        print(f"{label + f', {args.ranks} ranks':40} {1000 * r['step']:8.2f} {ratio} "
              f"{1000 * r['load']:8.2f} {r['collectives']:11.1f} {r['sends']:6.1f} "
              f"{r['waits']:6.1f} {r['bytes'] / 1e3:7.1f} {1000 * r['wait']:8.2f}", flush=True)
    bare = run(args.ranks, "allreduce", 200)
    print(f"bare 8-byte all-reduce over {args.ranks} ranks: MPICH blocking "
          f"{1e6 * bare['blocking']:.1f} us, nonblocking with ngnn's wait "
          f"{1e6 * bare['ngnn wait']:.1f} us")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
