"""Bytes a Trainer's training step copies between host and device on the GPU transformer,
fed the host arrays every step (as the Trainer did before `Transformer.resident`) against
the Trainer's own step, which feeds its resident values; and the time per step of each.

    python benchmarks/bench_resident_inputs.py --dataset cora --models gcn,gat

The settings are `ngnn train`'s (the papers' models and Adam, float64 sums). Each way gets a
fresh Trainer; "made" is what the Trainer uploaded when it was made (its resident values),
"first" and "later" what the first and the last of the timed calls copied (`transfer_bytes`).
"""
import argparse
import time

import numpy as np

from ngnn import datasets, optim
from ngnn import transformers as ngt
from ngnn.recipes import build_model
from ngnn.recipes import recipe
from ngnn.train import Trainer


def run(data, model, way, steps):
    r = recipe(model, data.name)
    net = build_model(model, data, r.hidden, r.heads, r.dropout, 0, r.attention_dropout())
    with ngt.make_transformer("gpu", wide_accumulation=True) as t:
        before = t.transferred()
        trainer = Trainer(net, data, optim.Adam(net.parameters(), lr=r.lr,
                                                weight_decay=r.weight_decay), transformer=t)
        made = t.transferred()["to_device"] - before["to_device"]
        host = (trainer.features, np.asarray(data.labels, np.int64), data.train_mask)
        step = (lambda: trainer.train_step(*host)) if way == "host arrays" else trainer.step
        step()
        first = trainer.train_step.transfer_bytes
        best = float("inf")
        for _ in range(steps):
            start = time.perf_counter()
            step()
            best = min(best, time.perf_counter() - start)
        return made, first, trainer.train_step.transfer_bytes, best, trainer.sparse


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="cora")
    parser.add_argument("--models", default="gcn,gat")
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    data = datasets.load(args.dataset)
    print("| model | features | step fed | made: to device | first call: to / from device | "
          "later calls: to / from device | ms per step (best) |")
    print("|---|---|---|---|---|---|---|")
    for model in args.models.split(","):
        for way in ("host arrays", "resident values"):
            made, first, later, seconds, sparse = run(data, model, way, args.steps)
            print(f"| {model} | {'sparse' if sparse else 'dense'} | {way} | {made} | "
                  f"{first['to_device']} / {first['from_device']} | {later['to_device']} / "
                  f"{later['from_device']} | {seconds * 1e3:.1f} |", flush=True)


if __name__ == "__main__":
    main()
