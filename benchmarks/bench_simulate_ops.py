"""Each graph op's predicted time against many measurements of it, to tell the cost
model's errors from the machine's (NumPy transformer, one process, this machine).

    python benchmarks/bench_simulate_ops.py --rounds 5 --save ops.json
    python benchmarks/bench_simulate_ops.py --load ops.json      # predicted again, no runs
    python benchmarks/bench_simulate_ops.py --rounds 4 --calibrate-each   # see below

Each round calibrates (`ngnn calibrate --no-mpi`) and then, for every single-process
configuration of bench_simulate (GCN, GraphSAGE and GAT at R-MAT 100K and 500K), starts a
new process that times `--steps` training steps line by line and keeps each fused
group's fastest. On this machine the same group's fastest step moved by up to 1.3 times
between processes minutes apart, and a calibrated figure by up to 1.8 times between
calibrations, so one pass of bench_simulate cannot tell a model's 20% from the
machine's. Each group is shown three ways: the best calibration against the fastest
step of all; the median calibration (each figure the median of the rounds') against the
median of the processes' fastest steps; and each round's calibration against its own
round's process, the median over rounds. A miss in all three is the model's.

With `--calibrate-each`, every configuration's process runs right after a calibration of
its own, within a minute of it, and is paired with that one (the best and median
calibrations are then of all of them): whether a miss is the calibration's moment. The
machine's speed for cold reads held within 3% over a minute and moved by up to 1.9
times between calibrations minutes apart (a block's product on a flushed cache, R-MAT
500K, rows of 4 floats: 8.4 ns an edge against 4.5); yet GraphSAGE's second group,
paired this way, came out 27% low, against 14 to 21% paired by rounds (docs/simulator.md).
"""
import os

for variable in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(variable, "1")       # one core per process, as bench_simulate

import argparse  # noqa: E402
import json  # noqa: E402
import tempfile  # noqa: E402

import numpy as np  # noqa: E402

from bench_simulate import dataset_of, predict_single, single  # noqa: E402
from ngnn import simulate  # noqa: E402
from ngnn.files import write_atomically  # noqa: E402

CONFIGURATIONS = [(model, nodes) for nodes in (100000, 500000)
                  for model in ("gcn", "sage", "gat")]


def measure(rounds, steps, each):
    """([profile], {(model, nodes, group): [each round's process's fastest seconds]},
    {(model, nodes): [the index of the profile each round's process is paired with]}):
    a calibration a round, or (`each`) one before every configuration's process."""
    profiles, fastest, paired = [], {}, {}
    with tempfile.TemporaryDirectory() as scratch:
        for done in range(rounds):
            for i, (model, nodes) in enumerate(CONFIGURATIONS):
                if each or i == 0:
                    profiles.append(simulate.calibrate(os.path.join(scratch, "profile.json"),
                                                       mpi=False)[0])
                paired.setdefault((model, nodes), []).append(len(profiles) - 1)
                _, _, ops = single(model, nodes, steps)
                for name, seconds in ops:
                    fastest.setdefault((model, nodes, name), []).append(seconds)
            print(f"round {done + 1} of {rounds} measured", flush=True)
    return profiles, fastest, paired


def report(profiles, fastest, paired):
    merged = [simulate.calibration.best_of(*profiles), simulate.calibration.median_of(*profiles)]
    held, predicted = {}, {}
    for model, nodes in CONFIGURATIONS:
        own = [profiles[i] for i in paired[model, nodes]]
        for _, ops in predict_single(model, nodes, merged + own,
                                     dataset_of(model, nodes, held)):
            for name, seconds in ops.items():
                predicted.setdefault((model, nodes, name), []).append(seconds)
    print("\n| model | R-MAT nodes | graph op (fused group) | measured: fastest; median of the "
          "processes (ms) | predicted: best; median calibration (ms) | error: best against "
          "fastest; median against median; each round paired |")
    print("|---|---:|---|---:|---:|---:|")
    errors = []
    for key, measured in fastest.items():
        best, median, *by_round = predicted[key]
        row = (best / min(measured) - 1, median / float(np.median(measured)) - 1,
               float(np.median([p / m - 1 for p, m in zip(by_round, measured)])))
        errors.append(row)
        print(f"| {key[0]} | {key[1]} | {key[2]} | {1e3 * min(measured):.2f}; "
              f"{1e3 * np.median(measured):.2f} | {1e3 * best:.2f}; {1e3 * median:.2f} | "
              + "; ".join(f"{100 * e:+.1f}%" for e in row) + " |")
    for i, label in enumerate(("best against fastest", "median against median",
                               "each round paired")):
        column = np.abs([row[i] for row in errors])
        print(f"{label}: mean absolute error {100 * column.mean():.1f}%, largest "
              f"{100 * column.max():.1f}%, within 20%: {int(np.sum(column <= 0.2))} of "
              f"{len(column)}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="calibrations, each with a "
                        "new process per configuration")
    parser.add_argument("--steps", type=int, default=4, help="timed steps per process")
    parser.add_argument("--calibrate-each", action="store_true", help="calibrate before "
                        "every configuration's process, not once a round")
    parser.add_argument("--save", metavar="FILE", help="write the profiles and "
                        "measurements to FILE (JSON)")
    parser.add_argument("--load", metavar="FILE", help="predict against an earlier "
                        "--save, measuring nothing")
    args = parser.parse_args()
    if args.load:
        with open(args.load) as f:
            data = json.load(f)
        profiles = [simulate.Topology.from_dict(p) for p in data["profiles"]]
        fastest = {tuple(row[:3]): row[3] for row in data["fastest"]}
        # a study saved before --calibrate-each: a calibration a round
        paired = {tuple(row[:2]): row[2] for row in data.get("paired", [])} or \
            {configuration: list(range(len(profiles))) for configuration in CONFIGURATIONS}
    else:
        profiles, fastest, paired = measure(args.rounds, args.steps, args.calibrate_each)
        if args.save:
            write_atomically(args.save, json.dumps({
                "profiles": [p.to_dict() for p in profiles],
                "fastest": [list(key) + [value] for key, value in fastest.items()],
                "paired": [list(key) + [value] for key, value in paired.items()]}).encode())
    report(profiles, fastest, paired)


if __name__ == "__main__":
    main()
