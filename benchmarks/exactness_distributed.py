"""The must-show check of issue 11, from outside: `ngnn train --save` in one process
against `mpiexec -n K ngnn train --partition P --save` for every model, policy and K,
with the largest differences by two measures and whether np.allclose(rtol=1e-5) holds.

    python benchmarks/exactness_distributed.py --models gcn,gat,sage,gin --ranks 2,3
"""
import argparse
import itertools
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

from ngnn.distributed.launch import find_mpiexec


def ngnn_command():
    return [sys.executable, "-m", "ngnn.cli"]




def train(args, folder, out, ranks=None, policy=None, model="gcn"):
    command = ngnn_command() + ["train", "--model", model, "--dataset", args.dataset,
                                "--epochs", str(args.epochs), "--save", out, "--no-progress"]
    if ranks:
        command = [find_mpiexec(), "-n", str(ranks)] + command + ["--partition", policy]
    done = subprocess.run(command, cwd=folder, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-2000:]}")
    test = [line for line in done.stdout.splitlines() if line.startswith("test accuracy")]
    return test[0].split(":")[1].split("±")[0].strip() if test else "?"


def compare(path1, path2):
    """(max |dw| / max |w| over arrays, max |dw| / (|w| + 1e-12) over elements, allclose
    rtol=1e-5 atol=0, differing elements, elements)."""
    with np.load(path1) as a, np.load(path2) as b:
        worst = elementwise = 0.0
        close, differ, total = True, 0, 0
        for name in a.files:
            x, y = a[name].astype(np.float64), b[name].astype(np.float64)
            worst = max(worst, np.abs(x - y).max() / max(np.abs(x).max(), 1e-30))
            elementwise = max(elementwise, (np.abs(x - y) / (np.abs(x) + 1e-12)).max())
            close = close and np.allclose(a[name], b[name], rtol=1e-5, atol=0)
            differ += int((a[name] != b[name]).sum())
            total += a[name].size
    return worst, elementwise, close, differ, total


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="gcn,gat,sage")
    parser.add_argument("--policies", default="oec,iec,cvc,metis")
    parser.add_argument("--ranks", default="2,3")
    parser.add_argument("--dataset", default="cora")
    parser.add_argument("--epochs", type=int, default=50)
    args = parser.parse_args()
    folder = tempfile.mkdtemp(prefix="ngnn-exactness-")
    print(f"{'model':6} {'ranks':>5} {'policy':6} {'max|dw|/max|w|':>15} {'elementwise':>12} "
          f"{'allclose':>8} {'differing':>15} {'test acc':>9}")
    summary = [0.0, 0.0, True]
    for model in args.models.split(","):
        single = os.path.join(folder, f"{model}-1.npz")
        accuracy = train(args, folder, single, model=model)
        print(f"{model:6} {1:>5} {'-':6} {'':>15} {'':>12} {'':>8} {'':>15} {accuracy:>9}")
        for ranks, policy in itertools.product(args.ranks.split(","), args.policies.split(",")):
            out = os.path.join(folder, f"{model}-{ranks}-{policy}.npz")
            accuracy = train(args, folder, out, int(ranks), policy, model)
            worst, elementwise, close, differ, total = compare(single, out)
            summary = [max(summary[0], worst), max(summary[1], elementwise),
                       summary[2] and close]
            print(f"{model:6} {ranks:>5} {policy:6} {worst:15.2e} {elementwise:12.2e} "
                  f"{str(close):>8} {f'{differ}/{total}':>15} {accuracy:>9}", flush=True)
    print(f"largest max|dw|/max|w| {summary[0]:.2e}, largest elementwise {summary[1]:.2e}, "
          f"np.allclose(rtol=1e-5, atol=0) everywhere: {summary[2]}")
    shutil.rmtree(folder)


if __name__ == "__main__":
    main()
