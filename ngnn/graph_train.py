"""Graph-classification training and the GIN paper's 10-fold cross-validation.

    trainer = GraphTrainer(nn.GINGraph(data.num_features, 64, data.num_classes), data)
    curve = trainer.fit(train_idx, test_idx, epochs=350)    # test accuracy per epoch

The trainer compiles two computations once, over one GraphLoader slot for batches of any
graphs of the dataset: the training step (loss plus the optimizer's
assignments, with dropout) and the evaluation logits. Every batch of every epoch and every
fold reuses them; a fold starts from the variables' initial values again.

Cross-validation follows Xu et al. (2019): for each fold, train on the other folds and
record the test fold's accuracy after every epoch; the reported accuracy is the mean over
folds at the single epoch where that mean is best, with its standard deviation over folds.
"""
import numpy as np
from tqdm import tqdm

import ngnn as ng
from ngnn import optim
from ngnn import transformers as ngt
from ngnn.sampling.graph_loader import GraphLoader
from ngnn.train import check_finite_loss


class GraphTrainer:
    """Trains a graph model (ngnn.nn.GINGraph, GCNGraph) on a GraphDataset in batches of
    up to `batch_size` graphs (a GraphLoader's) with Adam (`lr`, `weight_decay`), its rate
    decayed by `schedule` (an optim.StepLR; the GIN paper's halves it every 50 epochs) or
    constant (None); `seed` fixes the batch order and the dropout masks. Pass
    `transformer=` to share one, else `backend` names a new one; `optimizer=` (an
    ngnn.optim optimizer of model.parameters()) replaces Adam and its three arguments."""

    def __init__(self, model, data, batch_size=32, lr=0.01, weight_decay=0.0,
                 backend="numpy", transformer=None, seed=0, schedule=None, optimizer=None):
        from ngnn.op_graph import seed_dropout
        self.model, self.data, self.seed = model, data, seed
        self.transformer = transformer or ngt.make_transformer(backend)
        self.loader = self.make_loader(GraphLoader(data, batch_size=batch_size, seed=seed,
                                                   self_loops=model.self_loops))
        slot = self.loader.slot
        dtype = model.parameters()[0].dtype
        # A slot that declares its live rows (a BatchSlot) is fed their count with each
        # batch, and its feature rows are declared 0 past it (ngnn.passes.ZeroRowProducts).
        self.live = [slot.live] if getattr(slot, "live", None) is not None else []
        self.x = slot.node_features(self.loader.features.shape[1], dtype) if self.live else \
            ng.placeholder(self.loader.features.shape, dtype=dtype, name="batch_features")
        self.y = ng.placeholder((slot.num_graphs,), dtype=np.int64, name="graph_labels")
        self.mask = slot.graph_mask
        self.optimizer = optimizer or optim.Adam(model.parameters(), lr=lr,
                                                 weight_decay=weight_decay, schedule=schedule)
        self.loss = self.training_loss(model(slot.graph, self.x, slot, training=True))
        state = model.state_updates()
        self.place([self.loss] + state)
        updates = self.optimizer.updates(self.loss, reduce=self.gradient_reduction()) + state
        seed_dropout([self.loss] + updates, seed)
        # The step returns its loss alone: the updates land, no copy of them comes back.
        self.train_step = self.transformer.computation(
            [self.step_loss(self.loss)], self.x, self.y, self.mask, *self.live,
            updates=updates, name="graph_train_step")
        evaluation = model(slot.graph, self.x, slot, training=False)
        self.place([evaluation])
        self.logits = self.transformer.computation(evaluation, self.x, *self.live,
                                                   name="graph_logits")
        self.variables = model.parameters() + model.buffers() + \
            [v for _, v in self.optimizer.named_state()]

    # ---- hooks of training over ranks (ngnn.distributed.DistributedGraphLoaderTrainer) ----
    def make_loader(self, loader):
        """What batches feed the computations: here the GraphLoader itself."""
        return loader

    def training_loss(self, logits):
        return ng.cross_entropy(logits, self.y, self.mask)

    def place(self, results):
        """Rewrites the graph of `results` for where it runs: here, nowhere else."""

    def gradient_reduction(self):
        """What maps each raw weight gradient (optimizer `reduce=`): nothing here."""
        return None

    def step_loss(self, loss):
        """What a step returns of the training loss: here the loss itself."""
        return loss

    def step(self):
        """One training step on the loaded batch; its loss."""
        loader = self.loader
        return float(self.train_step(self.features(), loader.labels, loader.mask,
                                     *self.live_rows())[0])

    def reset(self):
        """Every parameter, buffer and optimizer state back to its initial value."""
        for v in self.variables:
            self.transformer.set_variable(v, v.initial_value)

    def train_epoch(self, indices, epoch):
        """One pass over the graphs `indices` in batches at epoch `epoch`'s learning rate;
        returns the mean loss per graph."""
        loader, total = self.loader, 0.0
        self.optimizer.start_epoch(self.transformer, epoch)
        for ids in loader.batches(epoch, indices):
            total += self.step() * ids.size
        return total / len(indices)

    def predict(self, indices):
        """Logits of the graphs `indices` (no dropout), (len(indices), num_classes)."""
        loader, out = self.loader, []
        for ids in loader.split(np.asarray(indices, dtype=np.int64)):
            loader.load(ids)
            out.append(self.logits(self.features(), *self.live_rows())[:ids.size])
        return np.concatenate(out)

    def features(self):
        """The loaded batch's feature rows, in the model's dtype."""
        return self.loader.features.astype(self.x.dtype, copy=False)

    def live_rows(self):
        """What the computations are fed for the slot's live count: the loaded batch's
        (GraphLoader.live), where the slot declares one."""
        return [self.loader.live] if self.live else []

    def accuracy(self, indices):
        predicted = self.predict(indices).argmax(axis=1)
        return float(np.mean(predicted == self.data.labels[indices]))

    def fit(self, train_idx, test_idx, epochs, progress=False, desc=None):
        """Trains from the initial values on `train_idx` for `epochs` epochs; returns the
        test accuracy after each epoch."""
        self.reset()
        curve = []
        for epoch in tqdm(range(epochs), disable=not progress, leave=False, desc=desc):
            loss = self.train_epoch(train_idx, epoch)
            check_finite_loss(loss, epoch)
            curve.append(self.accuracy(test_idx))
        return np.array(curve)


def cross_validate(trainer, folds, epochs, progress=False):
    """(folds x epochs) test accuracies of `trainer` over `folds` [(train, test)]."""
    return np.stack([trainer.fit(train, test, epochs, progress, desc=f"fold {k + 1}")
                     for k, (train, test) in enumerate(folds)])


def summarize(curves):
    """(best epoch, mean, std): the epoch whose mean test accuracy over folds is highest
    (the GIN paper's protocol), and the mean and standard deviation over folds there, in
    percent."""
    means = curves.mean(axis=0)
    best = int(np.argmax(means))
    return best, 100 * float(means[best]), 100 * float(curves[:, best].std())
