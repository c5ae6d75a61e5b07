"""Graph classification, ngnn against PyTorch Geometric in the same run: accuracy under the
GIN paper's 10-fold cross-validation, and the time of a training epoch.

    python benchmarks/graph_classification_vs_pyg.py accuracy                # 4 datasets
    python benchmarks/graph_classification_vs_pyg.py accuracy --datasets mutag --epochs 100
    python benchmarks/graph_classification_vs_pyg.py speed --dataset nci1 --epochs 3
    python benchmarks/graph_classification_vs_pyg.py speed --native    # also native=True

Both sides train the same model on the same data, folds and settings:
  - GIN-0 (Xu et al. 2019): 5 layers counting the input, so 4 GINConv layers with eps = 0
    and the paper's MLP Linear-BatchNorm-ReLU-Linear each, then BatchNorm and ReLU
    (`--no-batch-norm`: Linear-ReLU-Linear, then ReLU); a sum readout (PyG: global_add_pool) of every layer, the input included; per layer
    a linear map to the classes and dropout 0.5 on its scores, summed.
  - Adam, lr 0.01 halved every 50 epochs (the paper's; ngnn: optim.StepLR, PyG: torch's
    StepLR, both from GRAPH_DEFAULTS' lr_step and lr_gamma), no weight decay; batches of 32
    graphs, reshuffled every epoch; mean cross-entropy over the batch.
  - The graphs, node features (one-hot node labels; IMDB-BINARY: one-hot degree) and labels
    are ngnn's GraphDataset, handed to PyG as a list of Data objects.
  - Folds: DGCNN's published 10 folds (PROTEINS, NCI1, IMDB-BINARY), MUTAG's stratified
    folds drawn with seed 0 (GraphDataset.cross_validation).
Accuracy is reported as the paper does: the test accuracy after each epoch, averaged over
folds; the epoch with the best mean; mean ± std over folds there. `--folds K` runs the first
K of the 10 folds (both sides the same).

Speed: one epoch of training steps over every graph of the dataset (NCI1, the largest TU
dataset here: 4110 graphs, 122,747 nodes), after a warm-up epoch (ngnn compiles there);
median of `--epochs` epochs, both sides single-threaded on the CPU (torch.set_num_threads(1),
OMP/OpenBLAS threads 1 for NumPy), alternating ngnn and PyG epochs so machine load hits
both alike; the wall clock and the process's CPU time of each, and both ratios (on a
shared machine others' load stretches the wall clock). ngnn's part includes cutting and
loading each batch (GraphLoader), PyG's its DataLoader's collation. `--native` times a
third side in the same run: ngnn with the NumPy transformer's native (C) kernels and
fused groups (make_transformer("numpy", native=True), docs/native.md). `--device gpu` times
ngnn's GPU transformer against PyG on the same CUDA device (PyG synchronized at each
epoch's end; ngnn's step returns its loss, so it waits for its kernels every step).
"""
import argparse
import os
import sys
import time

for variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(variable, "1")

import numpy as np  # noqa: E402

from ngnn.recipes import GRAPH_DEFAULTS  # noqa: E402

LR, LR_STEP, LR_GAMMA = (GRAPH_DEFAULTS[key] for key in ("lr", "lr_step", "lr_gamma"))

PAPER = {"mutag": (89.4, 5.6), "proteins": (76.2, 2.8), "nci1": (82.7, 1.7),
         "imdb_binary": (75.1, 5.1)}


# ---- PyTorch Geometric's side ---------------------------------------------------------

def pyg_graphs(data):
    import torch
    from torch_geometric.data import Data
    out = []
    for k, g in enumerate(data.graphs):
        rows = slice(data.node_offsets[k], data.node_offsets[k + 1])
        out.append(Data(x=torch.from_numpy(data.features[rows].copy()),
                        edge_index=torch.from_numpy(np.stack([g.src, g.dst])),
                        y=torch.tensor([data.labels[k]]), num_nodes=g.num_nodes))
    return out


def pyg_gin(in_feats, hidden, num_classes, num_layers=5, dropout=0.5, batch_norm=True):
    import torch
    from torch_geometric.nn import GINConv, global_add_pool

    def norm():
        return torch.nn.BatchNorm1d(hidden) if batch_norm else torch.nn.Identity()

    class GIN(torch.nn.Module):
        def __init__(self):
            super().__init__()
            widths = [in_feats] + [hidden] * (num_layers - 1)
            self.convs = torch.nn.ModuleList(
                GINConv(torch.nn.Sequential(torch.nn.Linear(widths[i], hidden), norm(),
                                            torch.nn.ReLU(), torch.nn.Linear(hidden, hidden)),
                        eps=0.0)
                for i in range(num_layers - 1))
            self.norms = torch.nn.ModuleList(norm() for _ in range(num_layers - 1))
            self.heads = torch.nn.ModuleList(torch.nn.Linear(w, num_classes) for w in widths)

        def forward(self, x, edge_index, batch):
            states = [x]
            for conv, norm_ in zip(self.convs, self.norms):
                states.append(torch.relu(norm_(conv(states[-1], edge_index))))
            return sum(torch.nn.functional.dropout(head(global_add_pool(h, batch)), dropout,
                                                   self.training)
                       for head, h in zip(self.heads, states))
    return GIN()


class PygRun:
    def __init__(self, data, hidden, seed, batch_size=32, batch_norm=True, device="cpu"):
        import torch
        from torch_geometric.loader import DataLoader
        torch.manual_seed(seed)
        self.torch, self.DataLoader = torch, DataLoader
        self.device = torch.device(device)
        self.graphs = pyg_graphs(data)
        self.data, self.hidden, self.seed, self.batch_size = data, hidden, seed, batch_size
        self.batch_norm = batch_norm

    def reset(self):
        torch = self.torch
        torch.manual_seed(self.seed)
        self.model = pyg_gin(self.data.num_features, self.hidden, self.data.num_classes,
                             batch_norm=self.batch_norm).to(self.device)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=LR)
        self.scheduler = torch.optim.lr_scheduler.StepLR(self.optimizer, step_size=LR_STEP,
                                                         gamma=LR_GAMMA)

    def train_epoch(self, indices):
        torch = self.torch
        self.model.train()
        loader = self.DataLoader([self.graphs[i] for i in indices],
                                 batch_size=self.batch_size, shuffle=True)
        for batch in loader:
            batch = batch.to(self.device)
            self.optimizer.zero_grad()
            out = self.model(batch.x, batch.edge_index, batch.batch)
            torch.nn.functional.cross_entropy(out, batch.y).backward()
            self.optimizer.step()
        if self.device.type == "cuda":
            torch.cuda.synchronize()

    def accuracy(self, indices):
        torch = self.torch
        self.model.eval()
        correct = 0
        with torch.no_grad():
            for batch in self.DataLoader([self.graphs[i] for i in indices],
                                         batch_size=self.batch_size):
                out = self.model(batch.x, batch.edge_index, batch.batch)
                correct += int((out.argmax(dim=1) == batch.y).sum())
        return correct / len(indices)

    def fit(self, train, test, epochs):
        self.reset()
        curve = []
        for _ in range(epochs):
            self.train_epoch(train)
            self.scheduler.step()
            curve.append(self.accuracy(test))
        return np.array(curve)


# ---- ngnn's side ------------------------------------------------------------------------

def ngnn_trainer(data, hidden, seed, batch_size=32, batch_norm=True, native=False,
                 backend="numpy"):
    from ngnn import nn, optim
    from ngnn import transformers as ngt
    from ngnn.graph_train import GraphTrainer
    model = nn.GINGraph(data.num_features, hidden, data.num_classes, seed=seed,
                        batch_norm=batch_norm)
    return GraphTrainer(model, data, batch_size=batch_size, lr=LR, seed=seed,
                        schedule=optim.StepLR(LR_STEP, LR_GAMMA),
                        transformer=ngt.make_transformer(backend, native=True) if native
                        else ngt.make_transformer(backend))


# ---- the two measurements ---------------------------------------------------------------

def accuracy(args):
    from ngnn import datasets
    from ngnn.graph_train import summarize
    rows = []
    for name in args.datasets:
        data = datasets.load(name)
        folds = data.cross_validation(10)[:args.folds]
        trainer = ngnn_trainer(data, args.hidden, args.seed, batch_norm=args.batch_norm)
        pyg = PygRun(data, args.hidden, args.seed, batch_norm=args.batch_norm)
        curves = {"ngnn": [], "pyg": []}
        seconds = {"ngnn": 0.0, "pyg": 0.0}
        for k, (train, test) in enumerate(folds):
            for side, fit in (("ngnn", trainer.fit), ("pyg", pyg.fit)):
                start = time.perf_counter()
                curves[side].append(fit(train, test, args.epochs))
                seconds[side] += time.perf_counter() - start
            best = {side: 100 * c[-1].max() for side, c in curves.items()}
            print(f"{name} fold {k + 1}/{len(folds)}: ngnn best {best['ngnn']:.1f}, "
                  f"pyg best {best['pyg']:.1f}", flush=True)
        result = {side: summarize(np.stack(c)) for side, c in curves.items()}
        rows.append((name, result, seconds))
        trainer.transformer.close()
    norm = "batch norm" if args.batch_norm else "no batch norm"
    print(f"\nGIN-0 ({norm}), {args.epochs} epochs, hidden {args.hidden}, batch 32, "
          f"Adam lr {LR} times {LR_GAMMA} every {LR_STEP} epochs, first {args.folds} of 10 "
          "folds; accuracy at the epoch of best mean "
          "test accuracy, mean ± std over folds (percent)")
    print(f"{'dataset':12s} {'ngnn':>16s} {'PyG':>16s} {'ngnn - PyG':>11s} {'paper':>12s} "
          f"{'ngnn - paper':>13s} {'time ngnn / PyG':>16s}")
    for name, result, seconds in rows:
        (eb, em, es), (pb, pm, ps) = result["ngnn"], result["pyg"]
        paper = PAPER.get(name)
        print(f"{name:12s} {em:7.1f} ± {es:4.1f} @{eb + 1:<3d} {pm:7.1f} ± {ps:4.1f} "
              f"@{pb + 1:<3d}{em - pm:+10.1f} " +
              (f"{paper[0]:6.1f} ± {paper[1]:3.1f} {em - paper[0]:+12.1f}" if paper else
               f"{'':12s} {'':13s}") +
              f" {seconds['ngnn']:6.0f}s / {seconds['pyg']:.0f}s")


def speed(args):
    import torch
    from ngnn import datasets
    torch.set_num_threads(1)
    if args.device == "gpu" and args.native:
        raise SystemExit("--native times the NumPy transformer: not with --device gpu")
    data = datasets.load(args.dataset)
    everything = np.arange(data.num_graphs)
    backend = "gpu" if args.device == "gpu" else "numpy"
    trainers = {"ngnn": ngnn_trainer(data, args.hidden, args.seed, args.batch_size,
                                     args.batch_norm, backend=backend)}
    if args.native:
        trainers["ngnn native"] = ngnn_trainer(data, args.hidden, args.seed, args.batch_size,
                                               args.batch_norm, native=True)
    pyg = PygRun(data, args.hidden, args.seed, args.batch_size, args.batch_norm,
                 device="cuda" if args.device == "gpu" else "cpu")
    pyg.reset()
    runs = {side: (lambda epoch, t=t: t.train_epoch(everything, epoch))
            for side, t in trainers.items()}
    runs["pyg"] = lambda epoch: pyg.train_epoch(everything)
    times = {side: [] for side in runs}
    cpu = {side: [] for side in runs}
    order = list(runs)
    for epoch in range(args.epochs + 1):
        for side in (order if epoch % 2 == 0 else order[::-1]):
            start, start_cpu = time.perf_counter(), time.process_time()
            runs[side](epoch)
            if epoch:           # epoch 0 warms up (ngnn compiles its step there)
                times[side].append(time.perf_counter() - start)
                cpu[side].append(time.process_time() - start_cpu)
    print(f"{data.summary()}; GIN-0 hidden {args.hidden}, batches of {args.batch_size}, one "
          f"thread each; median of {args.epochs} epochs after a warm-up epoch")
    labels = {"ngnn": f"ngnn ({backend} transformer)",
              "ngnn native": "ngnn (numpy transformer, native=True)",
              "pyg": "PyG (DataLoader + GINConv + global_add_pool)"}
    for side in runs:
        print(f"{labels[side]}: {np.median(times[side]):.2f} s/epoch, CPU "
              f"{np.median(cpu[side]):.2f} s/epoch   (epochs: "
              f"{', '.join(f'{t:.2f}' for t in times[side])})")
    # The process's CPU seconds as well as the wall clock's: on a shared machine a
    # neighbour's load stretches wall time, not the CPU time each side uses.
    for side in trainers:
        print(f"speed-up {side} / PyG: {np.median(times['pyg']) / np.median(times[side]):.2f}x "
              f"wall clock, {np.median(cpu['pyg']) / np.median(cpu[side]):.2f}x CPU time")
    for trainer in trainers.values():
        trainer.transformer.close()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    acc = sub.add_parser("accuracy")
    acc.add_argument("--datasets", nargs="+", default=list(PAPER))
    acc.add_argument("--epochs", type=int, default=350)
    acc.add_argument("--folds", type=int, default=10, help="run the first K of the 10 folds")
    acc.add_argument("--hidden", type=int, default=64)
    acc.add_argument("--seed", type=int, default=0)
    fast = sub.add_parser("speed")
    fast.add_argument("--dataset", default="nci1")
    fast.add_argument("--epochs", type=int, default=3)
    fast.add_argument("--batch-size", type=int, default=32)
    fast.add_argument("--hidden", type=int, default=64)
    fast.add_argument("--seed", type=int, default=0)
    fast.add_argument("--device", choices=("cpu", "gpu"), default="cpu",
                      help="gpu: ngnn's GPU transformer and PyG on CUDA")
    fast.add_argument("--native", action="store_true",
                      help="also time ngnn with native=True (C kernels and fused groups)")
    for command in (acc, fast):
        command.add_argument("--no-batch-norm", dest="batch_norm", action="store_false",
                             help="GIN's MLPs without the paper's batch norm, both sides")
    args = parser.parse_args(argv)
    accuracy(args) if args.what == "accuracy" else speed(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
