"""Predicted against measured time per training step (NumPy transformer, this machine).

    python benchmarks/bench_simulate.py                  # every configuration, 2 passes
    python benchmarks/bench_simulate.py --nodes 100000 --models gcn gat --ranks 1 --passes 1

Each pass calibrates (`ngnn calibrate`, MPI included) and then measures every
configuration (model, R-MAT size, rank count, partition policy): real steps after a
warm-up, in a new process for 1 rank and under `mpiexec -n K` for K ranks (this script as
the worker), where a step is the slowest rank's, timed between barriers. Then every
configuration is predicted with `ngnn.simulate` on the best of the passes' calibrations
(ranks: each rank's computation built through the distributed lowering, no MPI started).

Every process (this one, the MPI ranks, the calibration's) uses one BLAS thread, one core
per process as the model assumes (OPENBLAS_NUM_THREADS etc. set to 1 unless set already).
The machine may be shared with other jobs, which only ever slow a step down: the fastest
measured step over all passes is this machine's figure (calibration keeps the best of its
rounds, and of the passes, too); the median is printed beside it to show the load. Prints a markdown table, the mean
absolute percentage error, the largest error, and Kendall's tau between the predicted and
the measured rankings; then, for single-process steps, each graph op's (fused group's)
predicted time against its fastest measured time (the generated code timed line by line),
and beside it the median over passes of each pass's prediction, on that pass's own
calibration, against that pass's measurement: the two sides of a pass are minutes apart,
while the fastest of each side may come from different moments of a machine whose speed
drifts.
"""
import os

# One core per process, as the cost model prices the NumPy transformer: BLAS's own threads
# are set before NumPy loads it (an explicit setting in the environment wins). With its
# default of a thread per core, a BLAS call on a shared 2-core machine waits for the core
# another job holds: one single-process GraphSAGE step took 5.5 s instead of 0.2 s.
for variable in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(variable, "1")

import argparse  # noqa: E402
import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
from scipy.stats import kendalltau  # noqa: E402

from ngnn import simulate  # noqa: E402
from ngnn import transformers as ngt  # noqa: E402
from ngnn.cli import make_parser  # noqa: E402
from ngnn.recipes import fill_defaults, load_dataset, make_trainer  # noqa: E402


def cli_args(model, nodes, policy=None):
    argv = ["bench", "--model", model, "--dataset", "rmat", "--num-nodes", str(nodes)]
    args = make_parser().parse_args(argv + (["--partition", policy] if policy else []))
    fill_defaults(args)
    args.backend = "numpy"
    return args


def single(model, nodes, steps):
    """(fastest, median, [(graph op, measured)]) of one process's step, measured in a new
    process, as a user's training runs: this one has calibrated, and what that left of
    its memory (the heap's layout, its huge pages) made the same steps up to 1.5 times
    slower in some passes."""
    command = [sys.executable, os.path.abspath(__file__), "--single", model, str(nodes),
               str(steps)]
    done = subprocess.run(command, capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{' '.join(command)} failed: {done.stderr[-2000:]}")
    result = json.loads(lines[-1])
    return result["fastest"], result["median"], [tuple(op) for op in result["ops"]]


def single_worker(model, nodes, steps):
    """Run by `single`: whole steps, then the generated code timed line by line; prints
    the figures as JSON."""
    from ngnn.simulate.measure import measure_steps
    from ngnn.simulate.simulator import step_name
    args = cli_args(model, nodes)
    trainer = make_trainer(args, load_dataset(args), 0, transformer=ngt.make_transformer("numpy"))
    trainer.step()                                   # compiles
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        trainer.step(False)
        times.append(time.perf_counter() - start)
    measured = measure_steps(trainer.train_step, lambda: trainer.step(False),
                             repeats=max(2, steps))
    names = trainer.train_step.value_names
    graph_ops = [(step_name(s, names), t) for s, t in measured.items()
                 if not hasattr(s, "args")]
    trainer.transformer.close()
    print(json.dumps({"fastest": min(times), "median": float(np.median(times)),
                      "ops": graph_ops}), flush=True)


def ranked(model, nodes, parts, policy, topology, data):
    """The predicted step of `parts` ranks, built here through the distributed lowering."""
    def build(part, comm):
        args = cli_args(model, nodes)
        args.part = part
        return make_trainer(args, data, 0, comm=comm, transformer=ngt.make_transformer("numpy"))
    trainers = simulate.build_trainers(build, data, parts, policy)
    prediction = simulate.predict_training(build, data, topology, parts, policy, trainers)
    for trainer in trainers[0]:
        trainer.transformer.close()
    return prediction.step_time


def measure_ranks(model, nodes, parts, policy, steps):
    """(fastest, median) step of `parts` MPI ranks: this script as the worker."""
    command = ["mpiexec", "-n", str(parts), sys.executable, os.path.abspath(__file__),
               "--worker", model, str(nodes), policy, str(steps)]
    done = subprocess.run(command, capture_output=True, text=True, cwd=os.path.dirname(
        os.path.abspath(__file__)))
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{' '.join(command)} failed: {done.stderr[-2000:]}")
    result = json.loads(lines[-1])
    return result["fastest"], result["median"]


def worker(model, nodes, policy, steps):
    """Run by mpiexec: each rank builds its part's trainer as `ngnn bench` does and times
    steps between barriers; rank 0 prints the slowest rank's times."""
    from mpi4py import MPI
    from ngnn.distributed import launch
    comm = MPI.COMM_WORLD
    args = cli_args(model, nodes, policy)
    data = load_dataset(args)
    args.part = launch.local_part(data, policy)
    trainer = make_trainer(args, data, 0, transformer=ngt.make_transformer("numpy"))
    trainer.step()
    times = []
    for _ in range(steps):
        comm.Barrier()
        start = time.perf_counter()
        trainer.step(False)
        times.append(comm.allreduce(time.perf_counter() - start, op=MPI.MAX))
    if comm.Get_rank() == 0:
        print(json.dumps({"fastest": min(times), "median": float(np.median(times))}),
              flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["gcn", "sage", "gat"])
    parser.add_argument("--nodes", nargs="+", type=int, default=[100000, 500000])
    parser.add_argument("--ranks", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--policies", nargs="+", default=["cvc", "metis"])
    parser.add_argument("--steps", type=int, default=3, help="timed steps per pass")
    parser.add_argument("--runs", type=int, default=1, help="mpiexec runs per multi-rank "
                        "configuration and pass: another job on the machine slows a short "
                        "run of ranks as a whole (both cores are the ranks'), so the "
                        "fastest run is kept")
    parser.add_argument("--passes", type=int, default=2, help="passes over every "
                        "configuration, each after its own calibration: the best of each "
                        "figure is kept, so a busy moment of a shared machine costs one pass")
    parser.add_argument("--profile", nargs="+", help="profiles to use instead of calibrating "
                        "now (with --load: instead of the runs' own; several: the best of "
                        "each figure)")
    parser.add_argument("--merge", choices=("best", "median"), default="best",
                        help="how the calibrations make one profile: each figure the best "
                        "of them (few calibrations) or their median (many: the best of many "
                        "is the luckiest moment's)")
    parser.add_argument("--save", metavar="FILE", help="write the measurements and the "
                        "passes' profiles to FILE (JSON)")
    parser.add_argument("--load", metavar="FILE", nargs="+", help="predict against the "
                        "measurements and profiles of earlier runs' --save (several: merged, "
                        "the fastest of each figure), measuring nothing")
    args = parser.parse_args()
    configurations = [(model, nodes, parts, policy) for nodes in args.nodes
                      for model in args.models for parts in args.ranks
                      for policy in (args.policies if parts > 1 else ["-"])]
    print(f"BLAS threads per process: {simulate.calibration.blas_threads()}; load average "
          f"{os.getloadavg()[0]:.2f}", flush=True)
    if args.load:
        measured, per_op, profiles, paired = load_runs(args.load)
        configurations = [c for c in configurations if c in measured]
        if args.profile:
            profiles = [simulate.Topology.load(path) for path in args.profile]
            paired = []
    else:
        measured, per_op, profiles, paired = measure_all(args, configurations)
        if args.save:
            save_run(args.save, measured, per_op, profiles, paired)
    merge = simulate.calibration.median_of if args.merge == "median" else \
        simulate.calibration.best_of
    predict_all(configurations, measured, per_op, merge(*profiles), paired)
    print(f"load average at the end {os.getloadavg()[0]:.2f}")


def save_run(path, measured, per_op, profiles, paired):
    from ngnn.files import write_atomically
    text = json.dumps({"measured": [list(k) + [m, medians] for k, (m, medians) in
                                    measured.items()],
                       "per_op": [list(k) + [v] for k, v in per_op.items()],
                       "profiles": [p.to_dict() for p in profiles],
                       "paired": [[p.to_dict(), [list(k) + [v] for k, v in ops.items()]]
                                  for p, ops in paired]})
    write_atomically(path, text.encode())


def load_runs(paths):
    """The measurements and profiles of several --save files merged: the fastest of each
    figure, every median, every profile."""
    measured, per_op, profiles, paired = {}, {}, [], []
    for path in paths:
        with open(path) as f:
            data = json.load(f)
        for row in data["measured"]:
            key, (best, medians) = tuple(row[:4]), measured.get(tuple(row[:4]),
                                                                (float("inf"), []))
            measured[key] = (min(best, row[4]), medians + row[5])
        for row in data["per_op"]:
            key = tuple(row[:3])
            per_op[key] = min(per_op.get(key, float("inf")), row[3])
        profiles += [simulate.Topology.from_dict(p) for p in data["profiles"]]
        paired += [(simulate.Topology.from_dict(p), {tuple(row[:3]): row[3] for row in ops})
                   for p, ops in data.get("paired", [])]
    return measured, per_op, profiles, paired


def measure_all(args, configurations):
    measured, profiles, per_op, per_pass = {}, [], {}, []
    for done in range(args.passes):
        per_pass.append({})
        if args.profile:
            profiles = [simulate.Topology.load(path) for path in args.profile]
        else:
            start = time.perf_counter()
            topology, path, notes = simulate.calibrate()
            profiles.append(topology)
            print(f"pass {done + 1}: calibrated in {time.perf_counter() - start:.1f} s "
                  f"(load average {os.getloadavg()[0]:.1f})", *(f"({n})" for n in notes),
                  flush=True)
        for model, nodes, parts, policy in configurations:
            if parts == 1:
                m, median, ops = single(model, nodes, args.steps)
                for name, seconds in ops:
                    key = (model, nodes, name)
                    per_op[key] = min(per_op.get(key, float("inf")), seconds)
                    per_pass[-1][key] = seconds
            else:
                runs = [measure_ranks(model, nodes, parts, policy, args.steps)
                        for _ in range(args.runs)]
                m, median = min(runs)
            key = (model, nodes, parts, policy)
            best, medians = measured.get(key, (float("inf"), []))
            measured[key] = (min(best, m), medians + [median])
            print(f"  {model} R-MAT {nodes}, {parts} rank(s) {policy}: fastest {1e3 * m:.1f} "
                  f"ms, median {1e3 * median:.1f} ms, load average "
                  f"{os.getloadavg()[0]:.1f}", flush=True)
    # Each pass's own calibration beside its own measurements (when it calibrated).
    paired = [] if args.profile else list(zip(profiles, per_pass))
    return measured, per_op, profiles, paired


def dataset_of(model, nodes, held):
    """The dataset of a configuration; `held` keeps the last one (configurations come
    grouped by model and size, and two R-MAT 500K datasets do not fit side by side)."""
    if (model, nodes) not in held:
        held.clear()
        held[model, nodes] = load_dataset(cli_args(model, nodes))
    return held[model, nodes]


def predict_all(configurations, measured, per_op, topology, paired=()):
    rows, op_rows = [], []
    data = {}
    for model, nodes, parts, policy in configurations:
        graph = dataset_of(model, nodes, data)
        if parts == 1:
            (p, ops), *by_pass = predict_single(model, nodes,
                                                [topology] + [t for t, _ in paired], graph)
            op_rows += [(model, nodes, name, ops[name], seconds,
                         paired_error(name, (model, nodes, name), by_pass, paired))
                        for (m_, n_, name), seconds in per_op.items()
                        if (m_, n_) == (model, nodes)]
        else:
            p = ranked(model, nodes, parts, policy, topology, graph)
        m, medians = measured[model, nodes, parts, policy]
        rows.append((model, nodes, parts, policy, p, m, float(np.median(medians))))
    report(rows, op_rows)


def predict_single(model, nodes, topologies, data):
    """[(step seconds, {step name: seconds})] predicted for one process on each of
    `topologies`."""
    args = cli_args(model, nodes)
    trainer = make_trainer(args, data, 0, transformer=ngt.make_transformer("numpy"))
    predictions = [simulate.predict(trainer.train_step, t) for t in topologies]
    trainer.transformer.close()
    return [(p.step_time, {step.name: step.seconds for step in p.ops}) for p in predictions]


def paired_error(name, key, by_pass, paired):
    """The median over passes of a graph op's error predicted on the pass's own
    calibration against the pass's own measurement, minutes apart: the machine's speed
    drifts over a run, and each pass's two sides share its moment (None without passes)."""
    errors = [ops[name] / measured[key] - 1 for (_, ops), (_, measured) in zip(by_pass, paired)
              if key in measured]
    return float(np.median(errors)) if errors else None


def report(rows, op_rows):
    errors = [abs(r[4] - r[5]) / r[5] for r in rows]
    print("\n| model | R-MAT nodes | ranks | policy | predicted step (ms) | measured, fastest "
          "(ms) | measured, median (ms) | error |")
    print("|---|---:|---:|---|---:|---:|---:|---:|")
    for model, nodes, parts, policy, p, m, median in rows:
        print(f"| {model} | {nodes} | {parts} | {policy} | {1e3 * p:.1f} | {1e3 * m:.1f} | "
              f"{1e3 * median:.1f} | {100 * (p - m) / m:+.1f}% |")
    tau = kendalltau([r[4] for r in rows], [r[5] for r in rows])[0] if len(rows) > 1 \
        else float("nan")
    print(f"\nMAPE {100 * np.mean(errors):.1f}%, largest error {100 * max(errors):.1f}%, "
          f"Kendall tau {tau:.2f} over {len(rows)} configurations")
    if op_rows:
        print("\n| model | R-MAT nodes | graph op (fused group) | predicted (ms) | measured, "
              "fastest (ms) | error | each pass on its own calibration, median error |")
        print("|---|---:|---|---:|---:|---:|---:|")
        for model, nodes, name, p, m, paired in op_rows:
            print(f"| {model} | {nodes} | {name} | {1e3 * p:.2f} | {1e3 * m:.2f} | "
                  f"{100 * (p - m) / m:+.1f}% | "
                  f"{'-' if paired is None else f'{100 * paired:+.1f}%'} |")
        op_errors = [abs(p - m) / m for *_, p, m, _ in op_rows]
        print(f"\ngraph ops: mean absolute error {100 * np.mean(op_errors):.1f}%, largest "
              f"{100 * max(op_errors):.1f}%, within 20%: "
              f"{sum(e <= 0.2 for e in op_errors)} of {len(op_errors)}")
        paired = [abs(e) for *_, e in op_rows if e is not None]
        if paired:
            print(f"each pass on its own calibration (median over passes): mean absolute "
                  f"error {100 * np.mean(paired):.1f}%, largest {100 * max(paired):.1f}%, "
                  f"within 20%: {sum(e <= 0.2 for e in paired)} of {len(paired)}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        model, nodes, policy, steps = sys.argv[2:6]
        worker(model, int(nodes), policy, int(steps))
    elif sys.argv[1:2] == ["--single"]:
        model, nodes, steps = sys.argv[2:5]
        single_worker(model, int(nodes), int(steps))
    else:
        main()
