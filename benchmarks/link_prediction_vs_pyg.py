"""Link prediction on Cora, ngnn against PyTorch Geometric's link-prediction example, on
the same split in the same run: test AUC and AP, and the time of an epoch.

    python benchmarks/link_prediction_vs_pyg.py                 # 5 runs, 200 epochs
    python benchmarks/link_prediction_vs_pyg.py --runs 2 --epochs 50 --dataset citeseer

The GAE setting (Kipf & Welling, "Variational Graph Auto-Encoders", 2016) on both sides: a
GCN encoder (32 hidden features, ReLU, 16 latent), an inner-product decoder, binary
cross-entropy over the training links and as many negatives drawn anew each epoch, Adam
with lr 0.01, 200 epochs; the test figures are those of the epoch with the best
validation AUC (PyG's example: examples/link_pred.py). Both sides train on the pairs of
one `datasets.link_split(data, val=0.05, test=0.1, seed)` (the sizes RandomLinkSplit
gives) and message-pass over its graph; PyG draws its training negatives with its own
`negative_sampling`, ngnn with its NegativeSampler. Features are as `--features` says
(default raw, as GAE's code feeds them).

Each run builds the models from the same initial weights (ngnn's Glorot draw, copied into
PyG's layers), alternating which side trains first. ngnn feeds Cora's features as a sparse
matrix (its Trainer's choice below 10% non-zeros); PyG runs twice, on the dense features
its Planetoid loader gives ("pyg") and on a torch CSR copy ("pyg-sparse", which GCNConv
also takes). All run on the CPU with one thread (set before NumPy and torch load). An
epoch is the training step plus the validation forward pass and its AUC, timed after the
first (which includes ngnn's compilation); a ratio is PyG's median epoch over ngnn's
(above 1: ngnn is faster).
"""
import argparse
import os
import sys
import time
import warnings

for variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[variable] = "1"

import numpy as np  # noqa: E402


def encoder(data, seed):
    from ngnn import nn
    return nn.GCN(data.num_features, 32, 16, dropout=0.0, seed=seed)


def initial_weights(data, seed):
    """ngnn's initial weights of `seed`: conv1 W, b, conv2 W, b."""
    return [np.asarray(p.initial_value) for _, p in encoder(data, seed).named_parameters()]


def ngnn_run(data, split, epochs, seed, normalize):
    from ngnn import nn, optim
    from ngnn.link_train import LinkTrainer
    model = nn.LinkPredictor(encoder(data, seed))
    trainer = LinkTrainer(model, split, optim.Adam(model.parameters(), lr=0.01), seed=seed,
                          normalize=normalize)
    try:
        trainer.fit(epochs, progress=False)
        result = trainer.evaluate()["test"]
        times = [record["epoch_time"] for record in trainer.history[1:]]
    finally:
        trainer.transformer.close()
    return result["auc"], result["ap"], float(np.median(times))


def pyg_run(data, split, epochs, seed, normalize, sparse=False):
    import torch
    import torch.nn.functional as F
    from torch_geometric.nn import GCNConv
    from torch_geometric.utils import negative_sampling

    from ngnn import link_metrics
    from ngnn.train import normalize_features
    torch.manual_seed(seed)
    features = normalize_features(data.features) if normalize else data.features
    x = torch.from_numpy(np.asarray(features.todense() if hasattr(features, "todense")
                                    else features, dtype=np.float32))
    if sparse:
        with warnings.catch_warnings():      # torch calls its CSR support a beta
            warnings.simplefilter("ignore", UserWarning)
            x = x.to_sparse_csr()
    graph = split.graph
    edge_index = torch.from_numpy(np.stack([graph.src, graph.dst]))
    train_pos = torch.from_numpy(split.train_pos)
    val = torch.from_numpy(np.concatenate([split.val_pos, split.val_neg], axis=1))
    test = torch.from_numpy(np.concatenate([split.test_pos, split.test_neg], axis=1))
    num_val_pos, num_test_pos = split.val_pos.shape[1], split.test_pos.shape[1]

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = GCNConv(data.num_features, 32)
            self.conv2 = GCNConv(32, 16)

        def encode(self, x, edge_index):
            return self.conv2(F.relu(self.conv1(x, edge_index)), edge_index)

        def decode(self, z, pairs):
            return (z[pairs[0]] * z[pairs[1]]).sum(dim=-1)

    model = Net()
    with torch.no_grad():
        w1, b1, w2, b2 = (torch.from_numpy(v.astype(np.float32))
                          for v in initial_weights(data, seed))
        model.conv1.lin.weight.copy_(w1.T)
        model.conv1.bias.copy_(b1)
        model.conv2.lin.weight.copy_(w2.T)
        model.conv2.bias.copy_(b2)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    criterion = torch.nn.BCEWithLogitsLoss()

    def scores(pairs, k):
        model.eval()
        with torch.no_grad():
            out = model.decode(model.encode(x, edge_index), pairs).numpy()
        return out[:k], out[k:]

    best, best_state, times = -1.0, None, []
    for _ in range(epochs):
        start = time.perf_counter()
        model.train()
        optimizer.zero_grad()
        z = model.encode(x, edge_index)
        neg = negative_sampling(edge_index=edge_index, num_nodes=data.num_nodes,
                                num_neg_samples=train_pos.size(1), method="sparse")
        pairs = torch.cat([train_pos, neg], dim=-1)
        labels = torch.cat([torch.ones(train_pos.size(1)), torch.zeros(neg.size(1))])
        loss = criterion(model.decode(z, pairs), labels)
        loss.backward()
        optimizer.step()
        val_auc = link_metrics.auc(*scores(val, num_val_pos))
        times.append(time.perf_counter() - start)
        if val_auc > best:
            best = val_auc
            best_state = {k: v.clone() for k, v in model.state_dict().items()}
    model.load_state_dict(best_state)
    pos, neg = scores(test, num_test_pos)
    return (link_metrics.auc(pos, neg), link_metrics.average_precision(pos, neg),
            float(np.median(times[1:])))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", default="cora")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=200)
    parser.add_argument("--split-seed", type=int, default=0)
    parser.add_argument("--features", choices=("raw", "normalized"), default="raw")
    args = parser.parse_args(argv)
    import torch
    torch.set_num_threads(1)
    from ngnn import datasets
    data = datasets.load(args.dataset)
    split = datasets.link_split(data, val=0.05, test=0.1, seed=args.split_seed)
    normalize = args.features == "normalized"
    print(data.summary())
    print(split.summary())
    print(f"GAE setting: GCN 32 -> 16, dot decoder, Adam lr 0.01, {args.epochs} epochs, "
          f"{args.features} features, 1 thread each, torch {torch.__version__}")
    sides = {"ngnn": ngnn_run, "pyg": pyg_run,
             "pyg-sparse": lambda *a: pyg_run(*a, sparse=True)}
    rows = {side: [] for side in sides}
    for run in range(args.runs):
        order = list(sides) if run % 2 == 0 else list(sides)[::-1]
        for side in order:
            rows[side].append(sides[side](data, split, args.epochs, run, normalize))
        print(f"run {run + 1}/{args.runs} (seed {run}): " + " | ".join(
            f"{side} AUC {100 * rows[side][-1][0]:.1f} AP {100 * rows[side][-1][1]:.1f} "
            f"{1000 * rows[side][-1][2]:.1f} ms/epoch" for side in sides), flush=True)
    summary = {}
    for side, values in rows.items():
        values = np.array(values)
        summary[side] = values
        print(f"{side:>10}: test AUC: {100 * values[:, 0].mean():.1f} ± "
              f"{100 * values[:, 0].std():.1f}, AP: {100 * values[:, 1].mean():.1f} ± "
              f"{100 * values[:, 1].std():.1f} ({args.runs} runs), "
              f"{1000 * np.median(values[:, 2]):.1f} ms/epoch")
    ours = np.median(summary["ngnn"][:, 2])
    for side in ("pyg", "pyg-sparse"):
        ratio = np.median(summary[side][:, 2]) / ours
        print(f"epoch time ratio {side} / ngnn: {ratio:.2f}x "
              f"({'ngnn faster' if ratio > 1 else 'PyG faster'})")
    gap = 100 * (summary["ngnn"][:, :2].mean(axis=0) - summary["pyg"][:, :2].mean(axis=0))
    print(f"ngnn - PyG: AUC {gap[0]:+.1f}, AP {gap[1]:+.1f} points; GAE paper: AUC 91.0, "
          f"AP 92.0")
    return 0


if __name__ == "__main__":
    sys.exit(main())
