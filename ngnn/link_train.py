"""Link-prediction training: an encoder-decoder trained with binary cross-entropy on the
training links and freshly sampled negatives, evaluated by AUC and AP.

    split = datasets.link_split(data, val=0.05, test=0.1, seed=0)
    model = nn.LinkPredictor(nn.GCN(data.num_features, 32, 16, dropout=0.0))
    trainer = LinkTrainer(model, split, optim.Adam(model.parameters(), lr=0.01))
    trainer.fit(epochs=200)
    trainer.evaluate()           # {"val": {"auc": ..., "ap": ..., ...}, "test": {...}}

Each epoch's query pairs are the training links followed by as many negatives as
`neg_ratio` asks for, drawn anew (sampling.NegativeSampler, stream = the step number). The
pairs change, their number does not: they are loaded into a GraphSlot of exactly that many
edges, so the training step is compiled once and serves every epoch. The evaluation runs the
encoder without dropout over the message-passing graph and decodes the fixed validation and
test pairs in the same computation.
"""
import time

import numpy as np
import scipy.sparse
from tqdm import tqdm

import ngnn as ng
from ngnn import link_metrics, optim
from ngnn import transformers as ngt
from ngnn.frontend import lower_zoom_outs
from ngnn.graph import Graph
from ngnn.op_graph import SparseInputError, seed_dropout
from ngnn.sampling import GraphSlot, NegativeSampler
from ngnn.train import (check_finite_loss, is_float32_memmap, mean_epoch_time,
                        normalize_features, use_sparse)


def pairs_graph(pos, neg, num_nodes):
    """The query pairs, positives first, as the edges of a graph (edge i: u[i] -> v[i])."""
    pairs = np.concatenate([pos, neg], axis=1)
    return Graph(pairs[0], pairs[1], num_nodes)


class LinkTrainer:
    """Trains `model` (an nn.LinkPredictor) on `split` (a datasets.LinkSplit of a Dataset:
    its features feed the encoder) with `optimizer` (default Adam(lr=0.01); with a
    `schedule`, `fit` sets each epoch's rate). `neg_ratio` training negatives per training
    link are drawn each epoch; `seed` fixes them and the dropout masks. `normalize`,
    `sparse`, `backend` and `transformer` are as for Trainer."""

    def __init__(self, model, split, optimizer=None, backend="numpy", seed=0, normalize=True,
                 transformer=None, sparse=None, neg_ratio=1.0):
        data = split.data
        if data is None or not hasattr(data, "features"):
            raise ValueError("LinkTrainer: the split has no node features; split a "
                             "datasets.Dataset (link_split(data, ...)), not a bare graph")
        if isinstance(neg_ratio, bool) or not isinstance(neg_ratio, (int, float)) or \
                not np.isfinite(neg_ratio) or neg_ratio < 0:
            raise ValueError(f"LinkTrainer: neg_ratio (negatives per training link) must be "
                             f"a finite number >= 0, got {neg_ratio!r}")
        for name in ("val", "test"):
            if getattr(split, name + "_pos").shape[1] == 0 or \
                    getattr(split, name + "_neg").shape[1] == 0:
                raise ValueError(f"LinkTrainer: the split has no {name} positives or no {name} "
                                 f"negatives to measure AUC on; split with {name} > 0 and "
                                 "neg_ratio > 0")
        self.model, self.split, self.data = model, split, data
        self.optimizer = optimizer or optim.Adam(model.parameters(), lr=0.01)
        self.transformer = transformer or ngt.make_transformer(backend)
        n = split.num_nodes
        # The negatives' Philox key, apart from the dropout keys seed_dropout derives.
        key = int(np.random.SeedSequence([seed, 1]).generate_state(1, np.uint64)[0])
        self.sampler = NegativeSampler(split.graph, seed=key, undirected=split.undirected)
        self.num_pos = split.train_pos.shape[1]
        self.num_neg = int(round(neg_ratio * self.num_pos))
        self.pairs = GraphSlot(n, self.num_pos + self.num_neg)
        labels = np.concatenate([np.ones(self.num_pos), np.zeros(self.num_neg)])

        features = normalize_features(data.features) if normalize else data.features
        logits = self._feed(features, use_sparse(features, sparse))
        if logits is None:          # the encoder's first op takes no sparse input
            if sparse:
                raise ValueError(f"LinkTrainer: {type(model.encoder).__name__} cannot take "
                                 "sparse features; pass sparse=False")
            logits = self._feed(features, False)
        self.loss = ng.binary_cross_entropy_with_logits(
            logits, ng.constant(labels, dtype=logits.dtype))
        updates = self.optimizer.updates(self.loss)
        seed_dropout([self.loss] + updates, seed)
        self.train_step = self.transformer.computation([self.loss], self.x, updates=updates,
                                                       name="link_train_step")
        z = model.embed(split.graph, self.x, training=False)
        self.eval_pairs = {name: pairs_graph(getattr(split, name + "_pos"),
                                             getattr(split, name + "_neg"), n)
                           for name in ("val", "test")}
        self.evaluate_scores = self.transformer.computation(
            [model.decode(self.eval_pairs[name], z) for name in ("val", "test")], self.x,
            name="link_evaluate")
        self.history = []

    def _feed(self, features, sparse):
        """Sets the features placeholder and value, sparse or dense; returns the training
        logits of the pairs, or None when the encoder refuses a sparse input."""
        self.sparse = sparse
        self.x = ng.placeholder(features.shape, name="features", sparse=sparse)
        if sparse:
            self.features = scipy.sparse.csr_matrix(features, dtype=np.float32)
        else:
            self.features = features.toarray() if scipy.sparse.issparse(features) else \
                features if is_float32_memmap(features) else \
                np.asarray(features, dtype=np.float32)
        try:
            logits = self.model(self.split.graph, self.x, self.pairs, training=True)
            lower_zoom_outs([logits])       # vertex-centric code meets the input here
            return logits
        except SparseInputError:
            if not sparse:
                raise
            return None

    # ---- training ------------------------------------------------------------------------
    def sample_pairs(self):
        """Loads the next step's pairs (training links, then new negatives) into the slot."""
        neg = self.sampler.sample(self.num_neg, epoch=self.train_step.calls)
        self.pairs.load(pairs_graph(self.split.train_pos, neg, self.split.num_nodes))

    def step(self):
        """One optimizer step over the training links and a new draw of negatives; returns
        the loss."""
        self.sample_pairs()
        return float(self.train_step(self.features)[0])

    def scores(self):
        """{"val": (positive scores, negative scores), "test": ...} of the current model."""
        out = {}
        for name, logits in zip(("val", "test"), self.evaluate_scores(self.features)):
            k = getattr(self.split, name + "_pos").shape[1]
            out[name] = (logits[:k], logits[k:])
        return out

    def evaluate(self):
        """{"val": metrics, "test": metrics}, each AUC, AP, MRR and Hits@K
        (link_metrics.all_metrics)."""
        return {name: link_metrics.all_metrics(pos, neg)
                for name, (pos, neg) in self.scores().items()}

    def fit(self, epochs, progress=True):
        """Trains `epochs` epochs, measuring validation AUC and AP after each; the weights of
        the best validation AUC are restored at the end. Returns the per-epoch records."""
        best, best_weights = -1.0, None
        bar = tqdm(range(epochs), disable=not progress, desc=self.data.name, leave=False)
        for epoch in bar:
            start = time.perf_counter()
            self.optimizer.start_epoch(self.transformer, epoch)
            loss = self.step()
            step_time = time.perf_counter() - start
            pos, neg = self.scores()["val"]
            val_auc = link_metrics.auc(pos, neg)
            val_ap = link_metrics.average_precision(pos, neg)
            self.history.append({"epoch": epoch, "loss": loss, "val_auc": val_auc,
                                 "val_ap": val_ap, "step_time": step_time,
                                 "epoch_time": time.perf_counter() - start})
            bar.set_postfix(loss=f"{loss:.4f}", val_auc=f"{val_auc:.3f}")
            check_finite_loss(loss, epoch)
            if val_auc > best:
                best, best_weights = val_auc, self.weights()
        bar.close()
        if best_weights is not None:
            self.load_weights(best_weights)
        return self.history

    def time_per_epoch(self):
        """Mean seconds of a training step plus its validation, leaving out the first epoch
        (it includes compiling both computations)."""
        return mean_epoch_time(self.history)

    def variables(self):
        return [var for _, var in self.model.named_parameters()] + \
            [var for _, var in self.optimizer.named_state()]

    def weights(self):
        """Every parameter and optimizer variable, copied from the device."""
        return [self.transformer.variable_value(var) for var in self.variables()]

    def load_weights(self, values):
        for var, value in zip(self.variables(), values):
            self.transformer.set_variable(var, value)
