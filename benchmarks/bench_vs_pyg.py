"""ngnn (NumPy transformer) against PyTorch Geometric on the CPU: the same models, graphs and
optimizer, each side in its own process, in one run.

    python benchmarks/bench_vs_pyg.py                        # everything, 3 rounds
    python benchmarks/bench_vs_pyg.py --datasets cora --models gat --rounds 5

Models, as their papers train them:
  - GAT: dropout 0.6 on the input, GATConv 8 heads x 8 features (attention dropout 0.6),
    ELU, dropout 0.6, GATConv with one head to the classes; Adam lr 0.005, weight decay 5e-4.
  - GCN: dropout 0.5, GCNConv to 16 hidden features, ReLU, dropout 0.5, GCNConv to the
    classes; Adam lr 0.01, weight decay 5e-4.
Datasets: Cora, CiteSeer and Coauthor CS (row-normalized features, loss over the training
split), and a directed R-MAT graph of 100,000 vertices and average degree 16 with 64
Gaussian features and 8 classes (GCN hidden width 64 there, so both models run
64 -> 64 -> 8; loss over all nodes). Both sides train over the same edges: the graph with
exactly one self loop per vertex, which ngnn's models build and PyG's layers are given
(`add_self_loops=False`).

Per (dataset, model) each round starts one process for ngnn and one for PyG (their order
alternates between rounds, so a load on the shared machine hits both alike). A process
loads the data, records its resident memory, runs `--warmup` epochs (the first compiles
ngnn's computations), then times `--epochs` epochs: the training step alone, and the
epoch (training step plus an evaluation forward pass without dropout). It reports median
times and its peak resident memory (getrusage), both in total and above the memory it held
before building the model. PyG's GCN runs twice, on `edge_index` and on a cached CSR
adjacency (`cached=True`, a `torch.sparse_csr` adjacency), and the faster counts.

ngnn uses sparse input features when its API offers them (a placeholder declared
`sparse=True`, fed a SciPy CSR matrix, chosen by the Trainer); the `features` column says
which path ran. PyG gets dense features, as its Planetoid and Coauthor loaders give them.
Without torch and torch_geometric the PyG columns say so and ngnn runs alone.

`--device gpu` runs both sides on the GPU: ngnn's GPU transformer (CUDA through PyCUDA on an
NVIDIA GPU) against PyG on `cuda`, each timed call ending with the device synchronized (ngnn's
calls return host arrays; PyG's are followed by `torch.cuda.synchronize()`). Memory is then
the device's peak: the bytes ngnn's transformer allocated (`device_peak`) against
`torch.cuda.max_memory_allocated()`. ngnn's Trainer keeps its features, labels and mask on
the device (`Transformer.resident`), as PyG's stay there.
"""
import argparse
import inspect
import json
import os
import resource
import subprocess
import sys
import time

import numpy as np

DATASETS = ("cora", "citeseer", "coauthor_cs", "rmat100k")
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
RMAT = dict(num_nodes=100_000, avg_degree=16, num_features=64, num_classes=8)


# ---- shared: data and measurement ---------------------------------------------------------

def rss_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / (1 << 20)


def peak_rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024     # KiB on Linux


def load_data(name):
    """(Dataset with train_mask = loss rows, graph with one self loop per vertex, normalize?)"""
    import dataclasses

    from ngnn import datasets
    from ngnn.nn.models import with_self_loops
    if name == "rmat100k":
        data = datasets.synthetic("rmat", RMAT["num_nodes"], RMAT["avg_degree"],
                                  RMAT["num_features"], RMAT["num_classes"], seed=0)
        everything = np.ones(data.num_nodes, dtype=bool)
        data = dataclasses.replace(data, train_mask=everything)
        return data, with_self_loops(data.graph), False
    data = datasets.load(name)
    return data, with_self_loops(data.graph), True


def hidden_width(name, model):
    return 64 if name == "rmat100k" and model == "gcn" else 16


def timed(fn, epochs):
    times = []
    for _ in range(epochs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def dense_features(data, normalize):
    import scipy.sparse
    x = data.features
    x = x.toarray() if scipy.sparse.issparse(x) else np.asarray(x)
    x = x.astype(np.float32)
    if normalize:
        total = x.sum(axis=1, keepdims=True)
        x = x / np.where(total == 0, 1, total).astype(np.float32)
    return x


# ---- the ngnn side ------------------------------------------------------------------------

def run_ngnn(name, model_name, warmup, epochs, device="cpu"):
    import scipy.sparse

    import ngnn as ng
    from ngnn import nn, optim
    from ngnn.train import Trainer
    data, graph, normalize = load_data(name)
    baseline = rss_mib()
    if model_name == "gat":
        model = nn.GAT(data.num_features, hidden=8, heads=8, num_classes=data.num_classes,
                       dropout=0.6, seed=0)
        optimizer = optim.Adam(model.parameters(), lr=0.005, weight_decay=5e-4)
    else:
        model = nn.GCN(data.num_features, hidden_width(name, model_name), data.num_classes,
                       dropout=0.5, seed=0)
        optimizer = optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)
    trainer = Trainer(model, data, optimizer, normalize=normalize,
                      backend="gpu" if device == "gpu" else "numpy")
    sparse_api = "sparse" in inspect.signature(ng.placeholder).parameters
    sparse = scipy.sparse.issparse(trainer.features)      # what the step is fed
    for _ in range(warmup):
        trainer.step()
        trainer.predict()
    step = timed(trainer.step, epochs)
    epoch = timed(lambda: (trainer.step(), trainer.predict()), epochs)
    if device == "gpu":
        peak, baseline = trainer.transformer.device_peak / (1 << 20), 0.0
    else:
        peak = peak_rss_mib()
    return {"step": step, "epoch": epoch, "peak": peak, "baseline": baseline,
            "features": "sparse" if sparse else
            ("dense" if sparse_api else "dense (no sparse API)"),
            "loss": float(trainer.step())}


# ---- the PyG side -------------------------------------------------------------------------

def run_pyg(name, model_name, warmup, epochs, csr=False, device="cpu"):
    import torch
    import torch.nn.functional as F
    import torch_geometric.nn as pyg
    from torch_geometric.utils import to_torch_csr_tensor
    data, graph, normalize = load_data(name)
    x = torch.as_tensor(dense_features(data, normalize))
    y = torch.as_tensor(data.labels)
    train = torch.as_tensor(data.train_mask)
    edge_index = torch.as_tensor(np.stack([graph.src, graph.dst]))
    if csr:       # the transposed adjacency PyG's sparse path expects: row = destination
        edges = to_torch_csr_tensor(edge_index.flip(0), size=(graph.num_nodes,) * 2)
    else:
        edges = edge_index
    on = "cuda" if device == "gpu" else "cpu"
    x, y, train, edges = (t.to(on) for t in (x, y, train, edges))
    sync = torch.cuda.synchronize if on == "cuda" else (lambda: None)
    baseline = rss_mib()
    torch.manual_seed(0)
    classes, features = data.num_classes, data.num_features

    if model_name == "gat":
        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.conv1 = pyg.GATConv(features, 8, heads=8, dropout=0.6,
                                         add_self_loops=False)
                self.conv2 = pyg.GATConv(64, classes, heads=1, dropout=0.6,
                                         add_self_loops=False)

            def forward(self, x, edges):
                x = F.dropout(x, 0.6, self.training)
                x = F.elu(self.conv1(x, edges))
                x = F.dropout(x, 0.6, self.training)
                return self.conv2(x, edges)
        lr = 0.005
    else:
        hidden = hidden_width(name, model_name)

        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.conv1 = pyg.GCNConv(features, hidden, cached=csr, add_self_loops=False)
                self.conv2 = pyg.GCNConv(hidden, classes, cached=csr, add_self_loops=False)

            def forward(self, x, edges):
                x = F.dropout(x, 0.5, self.training)
                x = F.relu(self.conv1(x, edges))
                x = F.dropout(x, 0.5, self.training)
                return self.conv2(x, edges)
        lr = 0.01
    net = Net().to(on)
    opt = torch.optim.Adam(net.parameters(), lr=lr, weight_decay=5e-4)

    def step():
        net.train()
        opt.zero_grad()
        loss = F.cross_entropy(net(x, edges)[train], y[train])
        loss.backward()
        opt.step()
        return float(loss)      # a host copy: the device is synchronized

    def evaluate():
        net.eval()
        with torch.no_grad():
            logits = net(x, edges)
        sync()
        return logits

    for _ in range(warmup):
        step()
        evaluate()
    step_time = timed(step, epochs)
    epoch = timed(lambda: (step(), evaluate()), epochs)
    if on == "cuda":
        peak, baseline = torch.cuda.max_memory_allocated() / (1 << 20), 0.0
    else:
        peak = peak_rss_mib()
    return {"step": step_time, "epoch": epoch, "peak": peak, "baseline": baseline,
            "features": "dense", "threads": torch.get_num_threads(), "loss": step()}


# ---- the driver ---------------------------------------------------------------------------

def worker(args):
    if args.worker == "ngnn":
        result = run_ngnn(args.datasets, args.models, args.warmup, args.epochs, args.device)
    else:
        result = run_pyg(args.datasets, args.models, args.warmup, args.epochs,
                         csr=args.worker == "pyg-csr", device=args.device)
    print("RESULT " + json.dumps(result), flush=True)


def spawn(side, dataset, model, args):
    command = [sys.executable, os.path.abspath(__file__), "--worker", side, "--datasets",
               dataset, "--models", model, "--warmup", str(args.warmup), "--epochs",
               str(args.epochs), "--device", args.device]
    env = dict(os.environ)
    if args.threads:
        env.update({name: str(args.threads) for name in THREAD_VARIABLES})
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    sys.stderr.write(done.stderr[-3000:])
    raise RuntimeError(f"{side} {dataset} {model} failed (exit {done.returncode})")


def pyg_available():
    check = "import torch, torch_geometric"
    return subprocess.run([sys.executable, "-c", check], capture_output=True).returncode == 0


def best(results, key):
    return min(r[key] for r in results)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--datasets", default=",".join(DATASETS))
    parser.add_argument("--models", default="gat,gcn")
    parser.add_argument("--rounds", type=int, default=3, help="processes per side and case")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=10, help="timed epochs per process")
    parser.add_argument("--threads", type=int, default=0,
                        help="threads for BLAS and torch on both sides (default: their own)")
    parser.add_argument("--device", choices=("cpu", "gpu"), default="cpu",
                        help="gpu: ngnn's GPU transformer against PyG on cuda")
    parser.add_argument("--worker", choices=("ngnn", "pyg", "pyg-csr"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args)

    has_pyg = pyg_available()
    print(f"PyG: {'torch and torch_geometric found' if has_pyg else 'not installed (pip install torch torch_geometric): ngnn alone'}")
    print(f"threads: {args.threads or 'library defaults'}; "
          f"{args.rounds} round(s) of one process per side, {args.warmup} warm-up and "
          f"{args.epochs} timed epochs each; times are the best round's median, memory the "
          + ("largest device peak (MiB)" if args.device == "gpu" else
             "largest peak RSS (MiB; in brackets above the process's memory before the model)"))
    print("| dataset | model | ngnn features | ngnn step ms | ngnn epoch ms | ngnn peak MiB | "
          "PyG path | PyG step ms | PyG epoch ms | PyG peak MiB | step ratio | epoch ratio | "
          "memory ratio |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for dataset in args.datasets.split(","):
        for model in args.models.split(","):
            sides = ["ngnn"]
            if has_pyg:
                sides += ["pyg", "pyg-csr"] if model == "gcn" else ["pyg"]
            runs = {side: [] for side in sides}
            for round_ in range(args.rounds):
                for side in (sides if round_ % 2 == 0 else sides[::-1]):
                    runs[side].append(spawn(side, dataset, model, args))
            ours = runs["ngnn"]
            row = [dataset, model, ours[0]["features"], f"{best(ours, 'step') * 1e3:.1f}",
                   f"{best(ours, 'epoch') * 1e3:.1f}", memory(ours)]
            if has_pyg:
                path = min(sides[1:], key=lambda side: best(runs[side], "step"))
                theirs = runs[path]
                row += [("edge_index" if path == "pyg" else "cached CSR") +
                        f", {theirs[0]['threads']} threads",
                        f"{best(theirs, 'step') * 1e3:.1f}", f"{best(theirs, 'epoch') * 1e3:.1f}",
                        memory(theirs),
                        f"{best(theirs, 'step') / best(ours, 'step'):.2f}x faster",
                        f"{best(theirs, 'epoch') / best(ours, 'epoch'):.2f}x faster",
                        f"{max(r['peak'] for r in ours) / max(r['peak'] for r in theirs):.2f} "
                        f"({growth(ours) / max(growth(theirs), 1e-9):.2f})"]
            else:
                row += ["PyG not installed"] + ["-"] * 6
            print("| " + " | ".join(row) + " |", flush=True)


def growth(results):
    return max(r["peak"] - r["baseline"] for r in results)


def memory(results):
    return f"{max(r['peak'] for r in results):.0f} ({growth(results):.0f})"


if __name__ == "__main__":
    main()
