"""Minibatch training with neighbour sampling (ngnn.sampling), NumPy transformer, in one run.

    python benchmarks/bench_minibatch.py --sizes 100000,500000 --fanouts 25,10 15,10,5

For each R-MAT graph (average degree 16, 64 input features, 8 classes) and each fanout list
it trains a GraphSAGE of len(fanouts) layers (64 hidden features, dropout 0.5, Adam) on
--batches batches of --batch-size seeds and reports:
  - sampling: sampled edges per second and ms per batch (NeighborSampler.sample, one core:
    NumPy sampling is single-threaded whatever BLAS does), also per second of the process's
    CPU time, which a machine shared with other jobs distorts less than wall time,
  - per batch: loading the blocks into the slots and the seeds' features into the input
    buffer, and the training step (forward, backward, Adam), both medians after the first
    batch (which compiles the step; its time is reported apart),
  - sampling's share of the epoch: sampling / (sampling + load + step),
  - the row prefix's gain: the same batches through a step without the row prefix (every
    layer computes every row of the batch), step time without / with, in wall time and in
    the process's CPU time,
  - how full the slots are: rows and edges of the batches against the worst-case slots.
"""
import argparse
import time

import numpy as np

from ngnn import datasets, nn, optim
from ngnn import transformers as ngt
from ngnn.sampling import NeighborSampler
from ngnn.sampling.program import MinibatchProgram

FEATURES, HIDDEN, CLASSES, DEGREE = 64, 64, 8, 16


def fanout_list(text):
    return [int(f) for f in text.split(",")]


def run_program(data, fanouts, batches, batch_size, row_prefix, backend):
    model = nn.GraphSAGE(FEATURES, HIDDEN, CLASSES, num_layers=len(fanouts), seed=0)
    t = ngt.make_transformer(backend)
    program = MinibatchProgram(model, data.graph, FEATURES, fanouts, batch_size, t,
                               optimizer=optim.Adam(model.parameters(), lr=0.01),
                               row_prefix=row_prefix)
    loads, steps, cpu_steps, losses = [], [], [], []
    for batch in batches:
        start = time.perf_counter()
        program.load(batch, data.features, data.labels)
        loaded, cpu = time.perf_counter(), time.process_time()
        losses.append(float(program.train_step(program.features, program.labels,
                                               program.seed_mask)[0]))
        cpu_steps.append(time.process_time() - cpu)
        loads.append(loaded - start)
        steps.append(time.perf_counter() - loaded)
    compilations = t.compilations
    t.close()
    return program, loads, (steps, cpu_steps), losses, compilations


def bench(data, fanouts, args):
    sampler = NeighborSampler(data.graph, fanouts, seed=0)
    order = sampler.order(data.num_nodes, 0)
    batches, sample_times, cpu_times = [], [], []
    for index in range(args.batches):
        seeds = order[index * args.batch_size:(index + 1) * args.batch_size]
        start, cpu = time.perf_counter(), time.process_time()
        batches.append(sampler.sample(seeds, epoch=0, index=index))
        sample_times.append(time.perf_counter() - start)
        cpu_times.append(time.process_time() - cpu)
    edges = sum(b.num_sampled_edges for b in batches)
    rate, cpu_rate = edges / sum(sample_times), edges / sum(cpu_times)
    prefix, loads, (steps, cpu_steps), losses, compiled = run_program(
        data, fanouts, batches, args.batch_size, True, args.backend)
    _, _, (every_steps, every_cpu), every_losses, _ = run_program(
        data, fanouts, batches, args.batch_size, False, args.backend)
    # Dropout draws element i of a mask at Philox position step * mask size + i, and the
    # masks of the two programs differ in size, so only the first step sees the same masks.
    if not np.isclose(losses[0], every_losses[0], rtol=1e-4):
        raise AssertionError(f"row prefix and every row disagree: loss {losses[0]} vs "
                             f"{every_losses[0]}")
    sample, load = np.median(sample_times[1:]), np.median(loads[1:])
    step, every = np.median(steps[1:]), np.median(every_steps[1:])
    cpu_step, cpu_every = np.median(cpu_steps[1:]), np.median(every_cpu[1:])
    rows = np.mean([len(b.nodes) for b in batches])
    layer_rows = np.mean([b.layer_rows for b in batches], axis=0)
    slot_rows = [prefix.slots[0].num_nodes] + [s.num_dst for s in prefix.slots]
    fill = np.mean([b.num_sampled_edges for b in batches]) / sum(s.num_edges
                                                                  for s in prefix.slots)
    print(f"R-MAT {data.num_nodes:,} fanouts {fanouts}: {edges / len(batches):,.0f} sampled "
          f"edges/batch, {rate / 1e6:.2f} M sampled edges/s ({cpu_rate / 1e6:.2f} M per "
          "CPU second)")
    print(f"  per batch: sampling {1e3 * sample:.1f} ms, load {1e3 * load:.1f} ms, "
          f"step {1e3 * step:.1f} ms; sampling is {100 * sample / (sample + load + step):.1f}% "
          f"of the epoch; first batch (compiles the step) {steps[0]:.1f} s, "
          f"{compiled} programs generated over {len(batches)} batches")
    print(f"  row prefix: step {1e3 * step:.1f} ms, every row {1e3 * every:.1f} ms: "
          f"{every / step:.2f}x (CPU time {1e3 * cpu_step:.1f} ms and {1e3 * cpu_every:.1f} "
          f"ms: {cpu_every / cpu_step:.2f}x)")
    print(f"  rows: batch {rows:,.0f} -> layers {', '.join(f'{r:,.0f}' for r in layer_rows)}; "
          f"slots {', '.join(f'{r:,}' for r in slot_rows)}; edges fill {100 * fill:.0f}% "
          f"of the slots", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100000,500000")
    parser.add_argument("--fanouts", nargs="+", type=fanout_list,
                        default=[[25, 10], [15, 10, 5]])
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--batches", type=int, default=6)
    parser.add_argument("--backend", default="numpy")
    args = parser.parse_args()
    for size in (int(s) for s in args.sizes.split(",")):
        data = datasets.synthetic("rmat", size, DEGREE, FEATURES, CLASSES, seed=0)
        for fanouts in args.fanouts:
            bench(data, fanouts, args)


if __name__ == "__main__":
    main()
