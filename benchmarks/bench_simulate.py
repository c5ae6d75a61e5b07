"""Predicted against measured time per training step (NumPy transformer, this machine).

    python benchmarks/bench_simulate.py                    # calibrate, then every config
    python benchmarks/bench_simulate.py --nodes 20000 100000 --models gcn gat --steps 10

Calibrates first (the same run, so the same machine load), then for each model and R-MAT
size predicts a training step with `ngnn.simulate` and times `--steps` real steps after a
warm-up. The machine may be shared: other processes only ever slow a step down, so the
fastest step is this machine's figure (calibration takes the best of its repetitions too);
the median is printed beside it to show the load. Prints a markdown table, the mean
absolute percentage error, the largest error, and Kendall's tau between the predicted and
measured rankings.
"""
import argparse
import time

import numpy as np
from scipy.stats import kendalltau

from ngnn import simulate
from ngnn import transformers as ngt
from ngnn.cli import _fill_defaults, load_dataset, make_parser, make_trainer


def measure(model, nodes, steps, topology):
    args = make_parser().parse_args(["bench", "--model", model, "--dataset", "rmat",
                                     "--num-nodes", str(nodes)])
    _fill_defaults(args)
    args.backend = "numpy"
    trainer = make_trainer(args, load_dataset(args), 0,
                           transformer=ngt.make_transformer("numpy"))
    predicted = simulate.predict(trainer.train_step, topology).step_time
    trainer.step()                                   # compiles
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        trainer.step(False)
        times.append(time.perf_counter() - start)
    trainer.transformer.close()
    return predicted, min(times), float(np.median(times))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["gcn", "sage", "gat"])
    parser.add_argument("--nodes", nargs="+", type=int, default=[20000, 100000])
    parser.add_argument("--steps", type=int, default=7)
    parser.add_argument("--profile", help="a profile to use instead of calibrating now")
    args = parser.parse_args()
    if args.profile:
        topology = simulate.Topology.load(args.profile)
    else:
        topology, path = simulate.calibrate()
        print(f"calibrated: {path}")
    rows = []
    for nodes in args.nodes:
        for model in args.models:
            predicted, fastest, median = measure(model, nodes, args.steps, topology)
            rows.append((model, nodes, predicted, fastest, median))
            print(f"{model} R-MAT {nodes}: predicted {1e3 * predicted:.1f} ms, measured "
                  f"{1e3 * fastest:.1f} ms (median {1e3 * median:.1f} ms)", flush=True)
    errors = [abs(p - m) / m for _, _, p, m, _ in rows]
    print("\n| model | R-MAT nodes | predicted step (ms) | measured, fastest (ms) | "
          "measured, median (ms) | error |")
    print("|---|---:|---:|---:|---:|---:|")
    for model, nodes, p, m, median in rows:
        print(f"| {model} | {nodes} | {1e3 * p:.1f} | {1e3 * m:.1f} | {1e3 * median:.1f} | "
              f"{100 * (p - m) / m:+.0f}% |")
    tau = kendalltau([r[2] for r in rows], [r[3] for r in rows])[0] if len(rows) > 1 \
        else float("nan")
    print(f"\nMAPE {100 * np.mean(errors):.1f}%, largest error {100 * max(errors):.1f}%, "
          f"Kendall tau {tau:.2f} over {len(rows)} configurations")


if __name__ == "__main__":
    main()
