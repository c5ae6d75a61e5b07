"""Train a two-layer MLP on a synthetic task with ngnn's tensor ops.

    python examples/mlp.py [--backend numpy|gpu] [--steps 300]

The task is four Gaussian blobs labelled like XOR. No straight line separates the classes,
so the loss only falls this far because of the hidden layer. A training step is one
computation: the loss, plus an ng.assign per parameter. Every read in a call sees the old
values, and the updates land at the end of the call.
"""
import argparse

import numpy as np

import ngnn as ng
from ngnn import transformers as ngt


def xor_blobs(n, rng):
    corners = rng.integers(0, 2, (n, 2))
    x = corners * 2.0 - 1.0 + rng.normal(0, 0.45, (n, 2))
    return x.astype(np.float32), corners[:, 0] ^ corners[:, 1]


def main():
    parser = argparse.ArgumentParser(description="Train an MLP on XOR blobs.")
    parser.add_argument("--backend", default="numpy", choices=ngt.transformer_choices())
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.1)
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    n = 512
    x_train, y_train = xor_blobs(n, rng)
    x_test, y_test = xor_blobs(n, rng)

    x = ng.placeholder((n, 2), name="x")
    labels = ng.placeholder((n,), dtype=np.int64, name="labels")
    w1 = ng.variable((2, args.hidden), initial_value=rng.normal(0, 1, (2, args.hidden)),
                     name="w1")
    b1 = ng.variable((args.hidden,), initial_value=0.0, name="b1")
    w2 = ng.variable((args.hidden, 2), initial_value=rng.normal(0, 0.3, (args.hidden, 2)),
                     name="w2")
    b2 = ng.variable((2,), initial_value=0.0, name="b2")
    params = [w1, b1, w2, b2]

    logits = ng.dot(ng.relu(ng.dot(x, w1) + b1), w2) + b2
    loss = ng.cross_entropy(logits, labels)
    grads = ng.grad(loss, params)

    with ngt.make_transformer(args.backend) as t:
        step = t.computation([loss] + [ng.assign(p, p - args.lr * g)
                                       for p, g in zip(params, grads)], x, labels,
                             name="train_step")
        predict = t.computation(logits, x, name="predict")
        for i in range(args.steps):
            loss_value = step(x_train, y_train)[0]
            if i % 20 == 0 or i == args.steps - 1:
                print(f"step {i:4d}  loss {loss_value:.4f}")
        accuracy = (predict(x_test).argmax(axis=1) == y_test).mean()
        print(f"test accuracy {accuracy:.3f}")


if __name__ == "__main__":
    main()
