"""Full-graph training over MPI ranks, equal to one process (seed 004 with seed 001's
explicit communication).

Each rank builds the model over the MasterView of its LocalGraph, so node tensors have a
row per master: a vertex's features, logits and loss term live with its master alone. The
loss is the sum of the masters' cross-entropies over the whole graph's count of training
vertices, so the ranks' losses add up to one process's loss and their weight gradients,
all-reduced in the op-graph, to its gradients. Dropout masks are keyed by global ids and seeded as one
process seeds them, validation and test metrics are summed over ranks, so every rank
follows the single-process run, epoch by epoch.
"""
import numpy as np
import scipy.sparse

import ngnn as ng
from ngnn.op_graph import AllReduce
from ngnn.train import Trainer, row_cross_entropy

from .exchange import Exchange, world
from .local_graph import LocalGraph
from .lowering import insert_communication

SPLITS = ("train", "val", "test")


class DistributedTrainer(Trainer):
    """Trainer for rank `part.rank` of a partition (a LocalPart: `Partition.part(rank)` or
    `load_partition(folder, rank)`) of `data.graph`; `comm` defaults to MPI's world.
    `sparse` as the Trainer's. The methods are the Trainer's; metrics and losses are
    global."""

    def __init__(self, model, data, part, optimizer=None, backend="numpy", seed=0,
                 normalize=True, transformer=None, sparse=None, comm=None):
        part.check_graph(data.graph)
        self.part = part
        self.exchange = Exchange(comm if comm is not None else world(), part)
        self.local_graph = LocalGraph.from_part(part, self.exchange)
        self.masters = part.nodes[:part.num_masters]
        self.labels = self.own_rows(data.labels)
        self.masks = {s: self.own_rows(np.asarray(getattr(data, s + "_mask"), bool))
                      for s in SPLITS}
        self.counts = {s: int(np.asarray(getattr(data, s + "_mask"), bool).sum())
                       for s in SPLITS}
        super().__init__(model, data, optimizer=optimizer, backend=backend, seed=seed,
                         normalize=normalize, transformer=transformer, sparse=sparse)

    # ---- the Trainer's hooks: this rank's masters, their share of the loss, communication
    def model_graph(self):
        return self.local_graph.masters

    def own_rows(self, values):
        """The rows of this rank's masters (features fed sparse or dense as one process
        feeds them)."""
        return (values if scipy.sparse.issparse(values) else np.asarray(values))[self.masters]

    def training_loss(self, logits):
        """This rank's share of ng.cross_entropy(logits, labels, train_mask) of the whole
        graph: its masters' terms over the whole graph's count."""
        return ng.cross_entropy(logits, self.y, self.train_mask,
                                count=max(self.counts["train"], 1))

    def place(self, results):
        insert_communication(results, self.graph)

    def gradient_reduction(self):
        return lambda gradient: AllReduce(gradient, self.exchange)

    # ---- training and metrics, over all ranks ----------------------------------------------
    def step(self, progress=False):
        outputs = self.train_step(*self.inputs)
        return float(self.exchange.sum([outputs[0]])[0])

    def split_metrics(self, logits, split):
        """(accuracy, mean cross-entropy) of `split` over the whole graph."""
        mask = self.masks[split]
        logits = np.asarray(logits, dtype=np.float64)[mask]
        labels = self.labels[mask]
        correct = float((logits.argmax(axis=1) == labels).sum()) if len(labels) else 0.0
        loss = float(row_cross_entropy(logits, labels).sum())
        count = self.counts[split]
        if count == 0 and split == "val":
            return float("nan"), float("nan")       # as the Trainer's, without val rows
        if count == 0:
            raise ValueError(f"accuracy: the {split}_mask selects no rows")
        correct, loss = self.exchange.sum([correct, loss])
        return correct / count, loss / count

    def epoch_metrics(self):
        logits = self.predict()
        return (self.split_metrics(logits, "train")[0],) + self.split_metrics(logits, "val")

    def evaluate(self):
        logits = self.predict()
        return {split: self.split_metrics(logits, split)[0] for split in SPLITS}

    def communication(self):
        """({kind: bytes sent by all ranks}, {kind: seconds of the slowest rank}) so far,
        kinds "sync" (mirrors and masters) and "allreduce" (weight gradients)."""
        return self.exchange.totals()
