"""Plots for `ngnn train --plot` and `ngnn bench --plot`, drawn with matplotlib.

matplotlib is optional (the `viz` extra) and imported only when a plot is asked for. The
figures are built on `matplotlib.figure.Figure` rather than pyplot, so plotting touches no
global state (no backend switch, no open windows) in the caller's process.
"""
import io
import os

from ngnn.files import write_atomically

FORMATS = ("png", "svg", "pdf")


def training_curves(histories, path, title=""):
    """Loss and train/validation accuracy per epoch, one line per run.

    `histories` is a list of `Trainer.history` lists (one per run); each record holds
    "epoch", "loss", "val_loss", "val_acc" and, when the trainer recorded it, "train_acc"."""
    if not histories or not any(histories):
        raise ValueError("plot: there is no training history to draw")
    figure = _figure(2)
    loss_axes, acc_axes = figure.axes
    many = len(histories) > 1
    for run, history in enumerate(histories):
        epochs = [record["epoch"] + 1 for record in history]
        suffix = f" (run {run + 1})" if many else ""
        loss_axes.plot(epochs, [r["loss"] for r in history], label="train loss" + suffix)
        loss_axes.plot(epochs, [r["val_loss"] for r in history], "--",
                       label="val loss" + suffix)
        if all("train_acc" in r for r in history):
            acc_axes.plot(epochs, [100 * r["train_acc"] for r in history],
                          label="train accuracy" + suffix)
        acc_axes.plot(epochs, [100 * r["val_acc"] for r in history], "--",
                      label="val accuracy" + suffix)
    loss_axes.set(xlabel="epoch", ylabel="cross-entropy", title="loss")
    acc_axes.set(xlabel="epoch", ylabel="accuracy (%)", title="accuracy")
    for axes in figure.axes:
        axes.grid(alpha=0.3)
        axes.legend(fontsize="small")
    return _save(figure, path, title)


def bench_bars(rows, path, title=""):
    """Time per epoch and peak memory per backend or configuration, as bars.

    `rows` is a list of dicts with "label", "ms_per_epoch", "step_ms" and "peak_bytes"."""
    if not rows:
        raise ValueError("plot: there are no benchmark results to draw")
    figure = _figure(2)
    time_axes, memory_axes = figure.axes
    labels = [row["label"] for row in rows]
    positions = range(len(rows))
    epoch_bars = time_axes.bar(positions, [row["ms_per_epoch"] for row in rows],
                               color="#4c72b0")
    time_axes.bar_label(epoch_bars, fmt="%.1f", fontsize="small")
    time_axes.set(ylabel="ms per epoch (step + evaluation)", title="time per epoch")
    memory = [row["peak_bytes"] / 2 ** 20 for row in rows]
    memory_bars = memory_axes.bar(positions, memory, color="#dd8452")
    memory_axes.bar_label(memory_bars, fmt="%.1f", fontsize="small")
    memory_axes.set(ylabel="MiB", title="peak intermediate memory (training step)")
    for axes in figure.axes:
        axes.set_xticks(list(positions), labels, rotation=20 if len(rows) > 3 else 0)
        axes.grid(axis="y", alpha=0.3)
    return _save(figure, path, title)


def _figure(panels):
    try:
        from matplotlib.figure import Figure
    except ImportError as err:
        raise ImportError("plotting needs matplotlib: pip install 'ngnn[viz]'") from err
    figure = Figure(figsize=(5.5 * panels, 4.2), layout="constrained")
    figure.subplots(1, panels)
    return figure


def format_of(path):
    """The picture format named by `path`'s extension; a clear error for any other."""
    extension = os.path.splitext(os.fspath(path))[1].lstrip(".").lower()
    if extension not in FORMATS:
        raise ValueError(f"plot: cannot write {os.fspath(path)!r}; the file name must end "
                         f"in {', '.join('.' + f for f in FORMATS)}")
    return extension


def _save(figure, path, title):
    extension = format_of(path)
    if title:
        figure.suptitle(title)
    buffer = io.BytesIO()
    figure.savefig(buffer, format=extension, dpi=120)
    return write_atomically(path, buffer.getvalue())
