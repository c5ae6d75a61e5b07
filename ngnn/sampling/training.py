"""The minibatch side of ngnn.train.Trainer (Trainer(..., batch_size=..., fanouts=[...])).

An epoch shuffles the training vertices (Philox, from the trainer's seed and the epoch),
cuts them into batches, samples each one and runs the training step compiled once over the
program's slots. Evaluation runs over the full graph by default (the Trainer's evaluation
computation: each layer over every vertex once); with `eval_fanouts` it runs sampled
batches over every vertex instead.
"""
import numbers

import numpy as np
from tqdm import tqdm

from .program import MinibatchProgram
from .sampler import NeighborSampler


class Minibatches:
    def __init__(self, trainer, batch_size, fanouts, eval_fanouts=None):
        data, model = trainer.data, trainer.model
        if fanouts is None:         # every in-edge: exact minibatches of the full model
            fanouts = [None] * len(model.layers)
        if len(fanouts) != len(model.layers):
            raise ValueError(f"fanouts {list(fanouts)} name {len(fanouts)} layers; the model "
                             f"has {len(model.layers)}")
        self.trainer = trainer
        self.batch_size = 512 if batch_size is None else batch_size
        if isinstance(self.batch_size, bool) or not isinstance(self.batch_size, numbers.Integral) \
                or self.batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        self.sampler = NeighborSampler(data.graph, fanouts, seed=trainer.seed)
        self.train_nodes = np.flatnonzero(data.train_mask)
        if not self.train_nodes.size:
            raise ValueError(f"{data.name}: the training mask selects no vertex to draw "
                             "minibatches from")
        self.program = MinibatchProgram(
            model, data.graph, data.num_features, self.sampler.fanouts, self.batch_size,
            trainer.transformer, optimizer=trainer.optimizer, seed=trainer.seed,
            sparse=trainer.sparse)
        self.eval_sampler = self.eval_program = None
        if eval_fanouts is not None:
            self.eval_sampler = NeighborSampler(data.graph, eval_fanouts, seed=trainer.seed)
            self.eval_program = MinibatchProgram(
                model, data.graph, data.num_features, self.eval_sampler.fanouts,
                self.batch_size, trainer.transformer, sparse=trainer.sparse)
        self.batches_per_epoch = -(-self.train_nodes.size // self.batch_size)

    @property
    def epoch(self):
        """The epoch the next batch belongs to, from the steps taken (a checkpoint restores
        them, so resumed training continues with the next epoch's batches)."""
        return self.program.train_step.calls // self.batches_per_epoch

    def train_epoch(self, progress=False):
        """One pass over the training vertices; returns the seed-weighted mean loss."""
        trainer, epoch = self.trainer, self.epoch
        batches = self.sampler.batches(self.train_nodes, self.batch_size, epoch=epoch)
        total, seeds = 0.0, 0
        for batch in tqdm(batches, total=self.batches_per_epoch, disable=not progress,
                          leave=False, desc=f"epoch {epoch}", unit="batch"):
            loss = self.program.step(batch, trainer.features, trainer.data.labels)
            total += loss * batch.num_seeds
            seeds += batch.num_seeds
        return total / seeds

    def predict(self):
        """Logits of every vertex from sampled batches (no dropout)."""
        n = self.trainer.data.num_nodes
        out = None
        for start in range(0, n, self.batch_size):
            seeds = np.arange(start, min(start + self.batch_size, n))
            batch = self.eval_sampler.sample(seeds, epoch=0, index=start // self.batch_size)
            logits = self.eval_program.logits(batch, self.trainer.features)
            if out is None:
                out = np.empty((n,) + logits.shape[1:], dtype=logits.dtype)
            out[start:start + seeds.size] = logits
        return out
