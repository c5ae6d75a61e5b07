"""`ngnn profile`: the kernel report of a Trainer's computation as a table.

    ngnn profile --model gat --dataset cora --backend gpu

Runs the training step (or the evaluation pass) a few times, then prints one row per
kernel of the last call (`GPUComputation.kernel_report`), the totals per step, the step's
wall time, and the bytes each call copied between host and device (`transfer_bytes`):
the first call's (compilation, initial values, the graph and the resident inputs' first
use) and the later calls'.
"""
import time

MIB = 2 ** 20


def profile_computation(trainer, computation="train", steps=5):
    """Runs `computation` ("train": the training step, "eval": the evaluation pass) of
    `trainer` 1 + `steps` times; returns (report rows, best wall seconds of a later call,
    transfer bytes of the first call, transfer bytes of the last)."""
    if computation == "train":
        comp, run = trainer.train_step, trainer.step
    else:
        comp, run = trainer.evaluate_logits, trainer.predict
    run()
    first = dict(comp.transfer_bytes)
    best = float("inf")
    for _ in range(steps):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return comp.kernel_report(), best, first, dict(comp.transfer_bytes)


def _number(value, digits=1):
    return "-" if value is None else f"{value:.{digits}f}" if isinstance(value, float) \
        else str(value)


def format_report(rows):
    """The report rows as a Markdown table, with a row of totals per call."""
    lines = ["| kernel | template | group | launches | work-groups | max edges | mean edges "
             "| MiB | ms | GB/s |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        seconds = r["seconds"]
        rate = r["global_bytes"] / seconds / 1e9 if seconds else None
        lines.append(f"| {r['name']} | {r['template']} | {r['group'] or '-'} | "
                     f"{r['launches']} | {r['work_groups']} | {_number(r['max_edges'])} | "
                     f"{_number(r['mean_edges'])} | {r['global_bytes'] / MIB:.2f} | "
                     f"{_number(None if seconds is None else seconds * 1e3, 3)} | "
                     f"{_number(rate)} |")
    timed = [r["seconds"] for r in rows if r["launches"]]
    seconds = None if None in timed else sum(timed)
    total = sum(r["global_bytes"] for r in rows)
    rate = total / seconds / 1e9 if seconds else None
    lines.append(f"| **total per step** | | | {sum(r['launches'] for r in rows)} | "
                 f"{sum(r['work_groups'] for r in rows)} | | | {total / MIB:.2f} | "
                 f"{_number(None if seconds is None else seconds * 1e3, 3)} | "
                 f"{_number(rate)} |")
    return "\n".join(lines)


def format_transfers(first, later):
    return (f"host to device: {first['to_device']} bytes in the first call, "
            f"{later['to_device']} in each later one; device to host: "
            f"{first['from_device']} and {later['from_device']}")
