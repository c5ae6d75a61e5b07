"""Node-classification training, full-batch or from sampled minibatches: the Trainer,
accuracy, checkpoints.

    trainer = Trainer(model, data, optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4))
    trainer.fit(epochs=200, patience=100)
    print(trainer.evaluate())          # {"train": ..., "val": ..., "test": ...}

The trainer compiles two computations once: the training step (loss plus the optimizer's
assignments, with dropout) and the evaluation pass (logits, no dropout), both over the same
variables, on the transformer named by `backend`. With `batch_size` / `fanouts` the training
step is ngnn.sampling's minibatch step, compiled once for every batch.
"""
import os
import tempfile
import time
import zipfile
import zlib

import numpy as np
import scipy.sparse
from tqdm import tqdm

import ngnn as ng
from ngnn import optim
from ngnn import transformers as ngt
from ngnn.frontend import lower_zoom_outs
from ngnn.op_graph import SparseInputError, seed_dropout


STEPS = "trainer/steps"      # checkpoint entry: training steps taken
# Below this share of non-zero features the trainer feeds them as a sparse matrix: the
# product with the first weight matrix and the dropout before it then cost per stored value.
SPARSE_DENSITY = 0.1


def accuracy(logits, labels, mask=None, mask_name="mask"):
    """Share of the (masked) rows whose arg-max logit is the label; `mask_name` names the
    mask in the error raised when it selects no rows."""
    correct = np.asarray(logits).argmax(axis=-1) == np.asarray(labels)
    if mask is not None:
        correct = correct[np.asarray(mask, dtype=bool)]
    if correct.size == 0:
        raise ValueError(f"accuracy: the {mask_name} selects no rows")
    return float(correct.mean())


def row_cross_entropy(logits, labels):
    """-log softmax(logits)[row, label] of each row, in float64 NumPy: validation losses
    from evaluation logits (ng.cross_entropy is the same in the op-graph)."""
    logits = np.asarray(logits, dtype=np.float64)
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    return -log_probs[np.arange(len(logits)), np.asarray(labels)]


def normalize_features(x):
    """Rows scaled to sum 1 (all-zero rows stay zero), the preprocessing of the GCN and GAT
    papers' code for the Planetoid datasets. A CSR matrix stays CSR, with the same values
    as the dense result."""
    if scipy.sparse.issparse(x):
        x = scipy.sparse.csr_matrix(x, dtype=np.float32, copy=True)
        total = np.asarray(x.sum(axis=1), dtype=np.float32).reshape(-1)
        divisor = np.where(total == 0, 1, total).astype(np.float32)
        x.data /= np.repeat(divisor, np.diff(x.indptr))
        return x
    x = np.asarray(x, dtype=np.float32)
    total = x.sum(axis=1, keepdims=True)
    return x / np.where(total == 0, 1, total).astype(np.float32)


def is_float32_memmap(features):
    """Features on disk (numpy.memmap, float32) are fed as they are: a chunked
    computation (memory_budget) reads them block by block, never whole."""
    return isinstance(features, np.memmap) and features.dtype == np.float32


def use_sparse(features, sparse=None):
    """Whether the trainer feeds `features` sparse: `sparse` True or False forces it, None
    (auto) picks sparse below SPARSE_DENSITY non-zeros."""
    if sparse is not None:
        return bool(sparse)
    if is_float32_memmap(features):
        return False
    n, f = features.shape
    stored = features.nnz if scipy.sparse.issparse(features) else np.count_nonzero(features)
    return stored < SPARSE_DENSITY * n * f


def check_finite_loss(loss, epoch):
    """Stops a run whose loss went NaN or Inf, saying how to find the op that made it."""
    if not np.isfinite(loss):
        raise FloatingPointError(
            f"training diverged: loss is {loss} at epoch {epoch}. To find the first op "
            "that produced a NaN or Inf, rerun with the transformer option "
            "debug_nans=True (ngnn train --debug-nans)")


def mean_epoch_time(history):
    """Mean "epoch_time" of a history, leaving out the first epoch (it includes compiling)."""
    times = [record["epoch_time"] for record in history[1:]]
    if not times:
        raise ValueError("time_per_epoch: train for at least two epochs first")
    return float(np.mean(times))


class Trainer:
    """Trains `model` on `data` (a datasets.Dataset) with `optimizer` (an ngnn.optim
    optimizer over model.parameters(); default Adam(lr=0.01); with a `schedule`, `fit` sets
    each epoch's rate). `seed` fixes the dropout masks (the model's own seed fixes its
    initial weights). `normalize` row-normalizes the features first. `sparse` feeds them as a CSR matrix (True), dense (False), or picks by
    density (None: sparse under 10% non-zeros); both give the same results. Pass
    `transformer=` to share one, else `backend` names a new one. `batch_size` and `fanouts`
    (one per layer, None or -1 for every in-edge) train from sampled minibatches instead of
    the full graph (ngnn.sampling); evaluation then still runs over the full graph unless
    `eval_fanouts` asks for sampled batches."""

    def __init__(self, model, data, optimizer=None, backend="numpy", seed=0, normalize=True,
                 transformer=None, sparse=None, batch_size=None, fanouts=None,
                 eval_fanouts=None):
        self.model = model
        self.data = data
        self.graph = self.model_graph()          # the graph the model runs over
        self.optimizer = optimizer or optim.Adam(model.parameters(), lr=0.01)
        self.seed = seed
        features = normalize_features(data.features) if normalize else data.features
        for split in ("train", "val"):
            mask = np.asarray(getattr(data, split + "_mask"))
            if mask.shape != (data.num_nodes,):
                raise ValueError(f"Trainer: the dataset's {split}_mask has shape {mask.shape}, "
                                 f"expected ({data.num_nodes},)")
        # An empty val_mask is allowed (fit then trains every epoch and keeps the last
        # weights, as PyG's and DGL's examples do); an empty train_mask leaves nothing to fit.
        if not np.asarray(data.train_mask).astype(bool).any():
            raise ValueError("Trainer: the dataset's train_mask selects no rows; training "
                             "needs train rows")
        self.transformer = transformer or ngt.make_transformer(backend)

        labels, train_mask = self.own_rows(data.labels), self.own_rows(data.train_mask)
        n = self.graph.num_nodes
        self.y = ng.placeholder((n,), dtype=np.int64, name="labels")
        self.train_mask = ng.placeholder((n,), dtype=np.bool_, name="train_mask")
        own_features = self.own_rows(features)
        logits = self._feed(own_features, use_sparse(features, sparse))
        if logits is None:          # the model's first op takes no sparse input (GIN adds)
            if sparse:
                raise ValueError(f"{type(self).__name__}: {type(model).__name__} cannot take "
                                 "sparse features; pass sparse=False")
            logits = self._feed(own_features, False)
        self.minibatches = None
        if batch_size is not None or fanouts is not None or eval_fanouts is not None:
            from ngnn.sampling.training import Minibatches
            self.minibatches = Minibatches(self, batch_size, fanouts, eval_fanouts)
            self.train_step = self.minibatches.program.train_step
        else:
            self.loss = self.training_loss(logits)
            # Seeded before any rewriting (communication), in one process's order; the
            # gradient's dropouts then take their forward dropouts' seeds.
            seed_dropout([self.loss], seed)
            self.place([self.loss])
            updates = self.optimizer.updates(self.loss, reduce=self.gradient_reduction())
            self.train_step = self.transformer.computation(
                [self.loss], self.x, self.y, self.train_mask, updates=updates,
                name="train_step")
        if eval_fanouts is None:
            self.logits = model(self.graph, self.x, training=False)
            self.place([self.logits])
            self.evaluate_logits = self.transformer.computation(self.logits, self.x,
                                                                name="evaluate")
        self.inputs = self.device_inputs(labels, train_mask)
        self.history = []

    # ---- what a trainer of one partition changes (ngnn.distributed.DistributedTrainer) ---
    def model_graph(self):
        """The graph the model is built over."""
        return self.data.graph

    def own_rows(self, values):
        """The rows of a per-vertex array (features, labels, masks) that this trainer's
        model computes: all of them."""
        return values

    def training_loss(self, logits):
        return ng.cross_entropy(logits, self.y, self.train_mask)

    def place(self, results):
        """Rewrites the graph of `results` for where it runs: here, nowhere else."""

    def gradient_reduction(self):
        """What maps each raw weight gradient (optimizer `reduce=`): nothing here."""
        return None

    def device_inputs(self, labels, train_mask):
        """What every full-graph step is fed, (features, labels, train mask): values kept
        on the transformer's device (`Transformer.resident`), uploaded once here, so a step
        sends none of them again and checks none of them again; the host arrays themselves
        where a computation streams its inputs from the host (a memory budget or chunk
        count, or features on disk) or minibatches train (their programs feed batches)."""
        values = (self.features, np.asarray(labels, dtype=np.int64),
                  np.asarray(train_mask, dtype=np.bool_))
        t = self.transformer
        if t.chunking or is_float32_memmap(self.features) or self.minibatches is not None:
            return values
        return tuple(t.resident(value) for value in values)

    def _feed(self, features, sparse):
        """Sets the features placeholder and value, sparse or dense; returns the training
        logits, or None when the model refuses a sparse input."""
        self.sparse = sparse
        self.x = ng.placeholder(features.shape, name="features", sparse=sparse)
        if sparse:
            self.features = scipy.sparse.csr_matrix(features, dtype=np.float32)
        else:
            self.features = features.toarray() if scipy.sparse.issparse(features) else \
                features if is_float32_memmap(features) else \
                np.asarray(features, dtype=np.float32)
        try:
            logits = self.model(self.graph, self.x, training=True)
            lower_zoom_outs([logits])       # vertex-centric code meets the input here
            return logits
        except SparseInputError:
            if not sparse:
                raise
            return None

    # ---- training ------------------------------------------------------------------------
    def step(self, progress=False):
        """One optimizer step (with minibatches: one epoch of them, with a progress bar
        over the batches if `progress`); returns the training loss."""
        if self.minibatches is not None:
            return self.minibatches.train_epoch(progress)
        outputs = self.train_step(*self.inputs)
        return float(outputs[0])

    def predict(self):
        """Logits of every node in evaluation mode (no dropout)."""
        if self.minibatches is not None and self.minibatches.eval_program is not None:
            return self.minibatches.predict()
        return self.evaluate_logits(self.inputs[0])

    @property
    def has_validation(self):
        """Whether the dataset's val_mask selects any row. Without validation rows the val
        accuracy and loss are NaN and `fit` neither selects weights nor stops early."""
        return bool(np.asarray(self.data.val_mask).astype(bool).any())

    def evaluate(self):
        """Accuracy on the train, val and test splits (val: NaN without validation rows)."""
        logits = self.predict()
        return {split: accuracy(logits, self.data.labels, getattr(self.data, split + "_mask"),
                                split + "_mask")
                if split != "val" or self.has_validation else float("nan")
                for split in ("train", "val", "test")}

    def epoch_metrics(self):
        """Training accuracy, validation accuracy and validation loss, recorded by `fit`
        each epoch (it selects weights by the last two; NaN without validation rows)."""
        logits, labels = self.predict(), self.data.labels
        train_acc = accuracy(logits, labels, self.data.train_mask, "train_mask")
        if not self.has_validation:
            return train_acc, float("nan"), float("nan")
        return (train_acc, accuracy(logits, labels, self.data.val_mask, "val_mask"),
                float(row_cross_entropy(np.asarray(logits)[self.data.val_mask],
                                        np.asarray(labels)[self.data.val_mask]).mean()))

    def fit(self, epochs, patience=None, progress=True):
        """Trains for up to `epochs` epochs. Each epoch the model is evaluated on the
        validation split; the weights with the best validation accuracy (ties: lower
        validation loss) are restored at the end. With `patience`, training stops once
        neither the validation accuracy nor the validation loss has improved for that many
        epochs (the GAT paper's criterion). A dataset without validation rows trains every
        epoch and keeps the last weights, `patience` unused, its records' val_acc and
        val_loss NaN. Returns the list of per-epoch records."""
        validated = self.has_validation
        best_acc, best_loss, best_key = -1.0, np.inf, None
        best_weights, waited = None, 0
        bar = tqdm(range(epochs), disable=not progress, desc=self.data.name, leave=False)
        for epoch in bar:
            start = time.perf_counter()
            self.optimizer.start_epoch(self.transformer, epoch)
            loss = self.step(progress)
            step_time = time.perf_counter() - start
            train_acc, val_acc, val_loss = self.epoch_metrics()
            self.history.append({"epoch": epoch, "loss": loss, "train_acc": train_acc,
                                 "val_acc": val_acc, "val_loss": val_loss,
                                 "step_time": step_time,
                                 "epoch_time": time.perf_counter() - start})
            bar.set_postfix(loss=f"{loss:.4f}", val_acc=f"{val_acc:.3f}")
            check_finite_loss(loss, epoch)
            if not validated:
                continue            # nothing to select weights by or to stop on
            if best_key is None or (val_acc, -val_loss) > best_key:
                best_key = (val_acc, -val_loss)
                best_weights = self.state()
            if val_acc > best_acc or val_loss < best_loss:
                best_acc, best_loss = max(best_acc, val_acc), min(best_loss, val_loss)
                waited = 0
            else:
                waited += 1
                if patience is not None and waited >= patience:
                    break
        bar.close()
        if best_weights is not None:
            self.load_state(best_weights)
        return self.history

    def time_per_epoch(self):
        """Mean seconds of a training step plus its evaluation, leaving out the first epoch
        (it includes compiling both computations)."""
        return mean_epoch_time(self.history)

    # ---- state and checkpoints -----------------------------------------------------------
    def named_variables(self):
        """{checkpoint name: variable}: the model's parameters and the optimizer's state."""
        named = [("model/" + name, var) for name, var in self.model.named_parameters()]
        named += [("optimizer/" + name, var) for name, var in self.optimizer.named_state()]
        return dict(named)

    def state(self):
        """{name: array} of every variable, copied from the device."""
        return {name: self.transformer.variable_value(var)
                for name, var in self.named_variables().items()}

    def load_state(self, arrays, where="state"):
        """Writes {name: array} to the variables after checking that the names and shapes
        match exactly; `where` names the source in errors."""
        variables = self.named_variables()
        missing = sorted(set(variables) - set(arrays))
        unexpected = sorted(set(arrays) - set(variables))
        if missing or unexpected:
            raise ValueError(f"{where} does not match this model and optimizer: "
                             f"missing {missing or 'nothing'}, unexpected "
                             f"{unexpected or 'nothing'}")
        for name, var in variables.items():
            value = np.asarray(arrays[name])
            if value.shape != var.shape:
                raise ValueError(f"{where}: {name!r} has shape {value.shape}, the model "
                                 f"expects {var.shape}")
            if value.dtype.kind not in "fiu":
                raise ValueError(f"{where}: {name!r} has non-numeric dtype {value.dtype}")
            if not np.all(np.isfinite(value)):
                raise ValueError(f"{where}: {name!r} contains NaN or Inf")
        for name, var in variables.items():
            self.transformer.set_variable(var, arrays[name])

    def save(self, path):
        """Writes the state and the number of steps taken to an .npz file (the step number
        picks the dropout masks, so training resumed from a checkpoint continues exactly as
        it would have); a crash mid-write leaves any old file intact."""
        path = os.fspath(path)
        directory = os.path.dirname(os.path.abspath(path))
        handle, temporary = tempfile.mkstemp(dir=directory, suffix=".npz.tmp")
        try:
            with os.fdopen(handle, "wb") as f:
                np.savez(f, **self.state(), **{STEPS: np.int64(self.train_step.calls)})
            os.replace(temporary, path)
        except BaseException:
            os.unlink(temporary)
            raise

    def load(self, path):
        """Restores the state saved by `save`."""
        path = os.fspath(path)
        try:
            archive = np.load(path, allow_pickle=False)
            if not isinstance(archive, np.lib.npyio.NpzFile):
                raise ValueError("it holds a single array, not named arrays")
            with archive:
                # Reading every member makes zipfile check its CRC, so damage shows here.
                arrays = {name: archive[name] for name in archive.files}
        except FileNotFoundError:
            raise
        except (ValueError, OSError, EOFError, zipfile.BadZipFile, zlib.error) as err:
            raise ValueError(f"checkpoint {path} is corrupt or not an .npz archive ({err})"
                             ) from err
        steps = arrays.pop(STEPS, None)
        if steps is None or steps.shape != () or steps.dtype.kind not in "iu" or steps < 0:
            raise ValueError(f"checkpoint {path}: {STEPS!r} is missing or not a step count; "
                             "was it written by Trainer.save?")
        self.load_state(arrays, where=f"checkpoint {path}")
        self.train_step.calls = int(steps)
