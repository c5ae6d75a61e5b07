"""What float64 accumulation (ngnn.passes.WideAccumulation, on by default) costs: epoch
time with it on and off, same run, same model, same dropout and Adam, NumPy transformer.

    python benchmarks/bench_wide_accumulation.py --cases cora-gat,rmat-gcn,rmat-gat

cora-gat is the README's job (`ngnn train --model gat --dataset cora`: 8 heads of 8,
dropout 0.6); rmat-gcn and rmat-gat are one step on R-MAT (--nodes, default 100,000;
average degree 10, 64 features, 8 classes; GCN hidden 16, GAT 4 heads of 4), as
bench_distributed.py builds them. An epoch is a training step plus an evaluation pass;
the figure is the median over --epochs epochs after the first (which compiles), on and off
interleaved so both see the same machine load.
"""
import argparse
import time

import numpy as np


def case(name, nodes):
    from ngnn import datasets, nn, optim
    if name == "cora-gat":
        data = datasets.load("cora")
        model = nn.GAT(data.num_features, hidden=8, heads=8, num_classes=data.num_classes,
                       dropout=0.6, seed=0)
        return data, model, optim.Adam(model.parameters(), lr=0.005, weight_decay=5e-4)
    data = datasets.synthetic("rmat", nodes, 10, 64, 8, seed=0)
    model = nn.GCN(64, 16, 8, dropout=0.5, seed=0) if name == "rmat-gcn" else \
        nn.GAT(64, hidden=4, heads=4, num_classes=8, dropout=0.5, seed=0)
    return data, model, optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)


def main():
    from ngnn import transformers as ngt
    from ngnn.train import Trainer
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="cora-gat,rmat-gcn,rmat-gat")
    parser.add_argument("--nodes", type=int, default=100000)
    parser.add_argument("--epochs", type=int, default=10)
    args = parser.parse_args()
    for name in args.cases.split(","):
        trainers = {}
        for wide in (True, False):
            data, model, optimizer = case(name, args.nodes)
            trainers[wide] = Trainer(model, data, optimizer, seed=0, transformer=ngt.make_transformer(
                "numpy", wide_accumulation=wide))
            trainers[wide].step()
            trainers[wide].epoch_metrics()
        times = {True: [], False: []}
        for _ in range(args.epochs):
            for wide, trainer in trainers.items():
                start = time.perf_counter()
                trainer.step()
                trainer.epoch_metrics()
                times[wide].append(time.perf_counter() - start)
        on, off = (float(np.median(times[w])) for w in (True, False))
        peak = {w: t.train_step.memory_plan.peak_bytes / 2 ** 20 for w, t in trainers.items()}
        print(f"{name}: float64 accumulation {1000 * on:.1f} ms/epoch, float32 "
              f"{1000 * off:.1f} ms/epoch, ratio {on / off:.2f}; peak intermediate memory "
              f"{peak[True]:.1f} / {peak[False]:.1f} MiB", flush=True)


if __name__ == "__main__":
    main()
