"""Test accuracy of `ngnn train` against PyTorch Geometric with the same recipe, in one run.

    python benchmarks/accuracy_vs_pyg.py                          # GCN and GAT on the three
    python benchmarks/accuracy_vs_pyg.py --only gcn-amazon_photo --runs 5
    python benchmarks/accuracy_vs_pyg.py --from-logs              # tabulate earlier logs

For each (model, dataset) the ngnn side is exactly `python -m ngnn.cli train --model M
--dataset D --runs R --no-progress` (the recipe of ngnn/recipes.py, which it prints), and
the PyG side trains GCNConv / GATConv models with the same recipe on the same data and
split (the dataset's masks), with the same number of seeds and the same training loop as
ngnn.train.Trainer.fit: Adam with coupled L2 weight decay on every parameter, one full-graph
step per epoch, the weights with the best validation accuracy (ties: lower validation
loss) kept, and a stop once neither the validation accuracy nor the loss has improved for
`patience` epochs. PyG's layers add the self loops themselves (the files have none), as
ngnn's GCN and GAT do. Both sides run one thread each (OMP_NUM_THREADS=1), one process
after the other; each writes its log to --log-dir, and the table compares mean ± std
(population std, in percent) of the test accuracy.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import time
import warnings

CASES = [f"{model}-{dataset}" for model in ("gcn", "gat")
         for dataset in ("amazon_photo", "amazon_computers", "coauthor_cs")]
RUN = re.compile(r"^run \d+/\d+ \(seed (\d+)\): val ([\d.]+), test ([\d.]+), (\d+) epochs",
                 re.M)
RECIPE = re.compile(r"^recipe: .*$", re.M)


def one_thread_env():
    env = dict(os.environ)
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[name] = "1"
    return env


# ---- the ngnn side: the command line itself --------------------------------------------------

def run_ngnn(model, dataset, runs):
    command = [sys.executable, "-m", "ngnn.cli", "train", "--model", model, "--dataset",
               dataset, "--runs", str(runs), "--no-progress"]
    print(f"{model}-{dataset} ngnn: {' '.join(['ngnn'] + command[3:])}", file=sys.stderr,
          flush=True)
    start = time.perf_counter()
    out = subprocess.run(command, capture_output=True, text=True, env=one_thread_env())
    if out.returncode:
        raise RuntimeError(f"ngnn train failed:\n{out.stdout}\n{out.stderr}")
    runs = [{"seed": int(s), "val": float(v), "test": float(t), "epochs": int(e)}
            for s, v, t, e in RUN.findall(out.stdout)]
    return {"recipe": RECIPE.search(out.stdout)[0], "runs": runs,
            "seconds": time.perf_counter() - start, "output": out.stdout}


# ---- the PyG side ------------------------------------------------------------------------------

def run_pyg(model, dataset, runs):
    """Trains PyG's model `runs` times (seeds 0..runs-1) with the recipe ngnn would use."""
    import numpy as np
    import scipy.sparse
    import torch
    import torch.nn.functional as F
    import torch_geometric.nn as pyg

    from ngnn import datasets
    from ngnn.recipes import recipe
    from ngnn.train import normalize_features

    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", "Sparse (invariant checks|CSR tensor support)")
    chosen = recipe(model, dataset)
    data = datasets.load(dataset)
    x = normalize_features(data.features) if chosen.normalize_features else data.features
    x = scipy.sparse.csr_matrix(x, dtype=np.float32)
    # Sparse input (most features are zero): dropout of the stored values is the dense
    # dropout, and the first product costs per stored value, as ngnn's sparse path does.
    values, shape = torch.as_tensor(x.data), x.shape
    rows, cols = (torch.as_tensor(a.astype(np.int64)) for a in (x.indptr, x.indices))
    # x^T in CSR too, its values a permutation of x's: the gradient of the first weights.
    position = scipy.sparse.csr_matrix((np.arange(x.nnz, dtype=np.float64), x.indices,
                                        x.indptr), shape=shape).T.tocsr()
    t_rows, t_cols = (torch.as_tensor(a.astype(np.int64))
                      for a in (position.indptr, position.indices))
    t_order = torch.as_tensor(position.data.astype(np.int64))
    edge_index = torch.as_tensor(np.stack([data.graph.src, data.graph.dst]))
    y = torch.as_tensor(data.labels)
    masks = {split: torch.as_tensor(getattr(data, split + "_mask"))
             for split in ("train", "val", "test")}

    def sparse_input(training):
        kept = F.dropout(values, chosen.dropout, training)
        return torch.sparse_csr_tensor(rows, cols, kept, shape)

    class SparseProduct(torch.autograd.Function):
        """x @ weight.T for the CSR input x, the gradient of weight as (x^T @ grad).T with
        x^T in CSR: PyTorch's own backward of a sparse product is several times slower on
        one thread (same values, same gradient)."""
        @staticmethod
        def forward(ctx, kept, weight):
            ctx.save_for_backward(kept)
            return torch.sparse_csr_tensor(rows, cols, kept, shape) @ weight.t()

        @staticmethod
        def backward(ctx, grad):
            kept, = ctx.saved_tensors
            x_t = torch.sparse_csr_tensor(t_rows, t_cols, kept[t_order], shape[::-1])
            return None, (x_t @ grad).t()

    class SparseInputLinear(torch.nn.Module):
        """The first layer's own (bias-free) linear map, applied to the CSR input."""
        def __init__(self, lin):
            super().__init__()
            self.lin = lin

        def forward(self, x):
            return SparseProduct.apply(x.values(), self.lin.weight)

    class GCN(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = pyg.GCNConv(shape[1], chosen.hidden, cached=True)
            self.conv2 = pyg.GCNConv(chosen.hidden, data.num_classes, cached=True)

        def forward(self):
            h = F.relu(self.conv1(sparse_input(self.training), edge_index))
            h = F.dropout(h, chosen.dropout, self.training)
            return self.conv2(h, edge_index)

    class GAT(torch.nn.Module):
        def __init__(self):
            super().__init__()
            attn = chosen.attention_dropout()
            self.conv1 = pyg.GATConv(shape[1], chosen.hidden, heads=chosen.heads, dropout=attn)
            self.conv2 = pyg.GATConv(chosen.hidden * chosen.heads, data.num_classes, heads=1,
                                     dropout=attn)

        def forward(self):
            h = F.elu(self.conv1(sparse_input(self.training), edge_index))
            h = F.dropout(h, chosen.dropout, self.training)
            return self.conv2(h, edge_index)

    results = []
    for seed in range(runs):
        start = time.perf_counter()
        torch.manual_seed(seed)
        net = {"gcn": GCN, "gat": GAT}[model]()
        net.conv1.lin = SparseInputLinear(net.conv1.lin)     # its weights as PyG drew them
        opt = torch.optim.Adam(net.parameters(), lr=chosen.lr, weight_decay=chosen.weight_decay)
        best_key, best_state, best_acc, best_loss, waited = None, None, -1.0, np.inf, 0
        epochs = 0
        for _ in range(chosen.epochs):
            epochs += 1
            net.train()
            opt.zero_grad()
            F.cross_entropy(net()[masks["train"]], y[masks["train"]]).backward()
            opt.step()
            net.eval()
            with torch.no_grad():
                logits = net()
            val_loss = float(F.cross_entropy(logits[masks["val"]], y[masks["val"]]))
            val_acc = float((logits[masks["val"]].argmax(1) == y[masks["val"]]).float().mean())
            if best_key is None or (val_acc, -val_loss) > best_key:
                best_key = (val_acc, -val_loss)
                best_state = {k: v.clone() for k, v in net.state_dict().items()}
            if val_acc > best_acc or val_loss < best_loss:
                best_acc, best_loss, waited = max(best_acc, val_acc), min(best_loss, val_loss), 0
            else:
                waited += 1
                if chosen.patience is not None and waited >= chosen.patience:
                    break
        net.load_state_dict(best_state)
        net.eval()
        with torch.no_grad():
            logits = net()
        accuracy = {split: 100 * float((logits[m].argmax(1) == y[m]).float().mean())
                    for split, m in masks.items()}
        results.append({"seed": seed, "val": accuracy["val"], "test": accuracy["test"],
                        "epochs": epochs, "seconds": time.perf_counter() - start})
        print(f"run {seed + 1}/{runs} (seed {seed}): val {accuracy['val']:.1f}, test "
              f"{accuracy['test']:.1f}, {epochs} epochs", file=sys.stderr, flush=True)
    return {"recipe": chosen.describe(model, dataset), "runs": results}


# ---- the driver ----------------------------------------------------------------------------------

def summary(runs):
    import numpy as np
    tests = [r["test"] for r in runs]
    epochs = [r["epochs"] for r in runs]
    return (f"{np.mean(tests):.1f} ± {np.std(tests):.1f}", len(tests),
            f"{min(epochs)}-{max(epochs)}", float(np.mean(tests)))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=CASES, help="cases (default: all)")
    parser.add_argument("--runs", type=int, default=5, help="seeds per side (default 5)")
    parser.add_argument("--log-dir", default="accuracy-vs-pyg-logs")
    parser.add_argument("--side", choices=("both", "ngnn", "pyg"), default="both")
    parser.add_argument("--from-logs", action="store_true",
                        help="tabulate the logs in --log-dir that exist, run nothing")
    parser.add_argument("--pyg-worker", nargs=2, metavar=("MODEL", "DATASET"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.pyg_worker:
        print(json.dumps(run_pyg(*args.pyg_worker, args.runs)))
        return
    cases = args.only or CASES
    os.makedirs(args.log_dir, exist_ok=True)
    if not args.from_logs:
        for case in cases:
            model, dataset = case.split("-", 1)
            if args.side in ("both", "ngnn"):
                result = run_ngnn(model, dataset, args.runs)
                with open(os.path.join(args.log_dir, f"{case}.ngnn.json"), "w") as f:
                    json.dump(result, f, indent=1)
            if args.side in ("both", "pyg"):
                print(f"{case} pyg: {args.runs} runs", file=sys.stderr, flush=True)
                start = time.perf_counter()
                out = subprocess.run([sys.executable, __file__, "--runs", str(args.runs),
                                      "--pyg-worker", model, dataset], env=one_thread_env(),
                                     stdout=subprocess.PIPE, text=True)  # runs shown live
                if out.returncode:
                    raise RuntimeError(f"PyG side failed (its error is above), exit status "
                                       f"{out.returncode}")
                result = json.loads(out.stdout)
                result["seconds"] = time.perf_counter() - start
                with open(os.path.join(args.log_dir, f"{case}.pyg.json"), "w") as f:
                    json.dump(result, f, indent=1)
    print("| model | dataset | ngnn test (%) | runs | epochs | PyG test (%) | runs | epochs "
          "| ngnn - PyG |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for case in cases:
        model, dataset = case.split("-", 1)
        sides = []
        for side in ("ngnn", "pyg"):
            path = os.path.join(args.log_dir, f"{case}.{side}.json")
            if os.path.exists(path):
                with open(path) as f:
                    sides.append(summary(json.load(f)["runs"]))
            else:
                sides.append(("-", 0, "-", None))
        (a, n_a, e_a, m_a), (b, n_b, e_b, m_b) = sides
        gap = f"{m_a - m_b:+.1f}" if m_a is not None and m_b is not None else "-"
        print(f"| {model.upper()} | {dataset} | {a} | {n_a} | {e_a} | {b} | {n_b} | {e_b} "
              f"| {gap} |")


if __name__ == "__main__":
    main()
