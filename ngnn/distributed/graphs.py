"""Graph classification over ranks: one batch of graphs (a BatchedGraph) partitioned by
vertex like any graph, with readouts combined over the ranks (docs/distributed.md).

Each rank builds the model over its share, a `RankBatch`: message passing runs over the
MasterView of its LocalGraph, as for node classification, and `ng.readout(h, rank_batch)`
aggregates its masters' rows into per-graph partials over a RankReadoutGraph, which
ngnn.distributed.lowering combines over the ranks in rank order (ReadoutAllReduce). A graph
whose vertices span ranks is read out whole on every rank; what follows the readout (the
classifier head, its dropout) is the same on every rank. The loss of graph k is counted on
rank k mod K alone, over the whole batch's count, so the ranks' losses add up to one
process's loss and their weight gradients, all-reduced, to its gradients.

    batch, x = data.batch(ids)
    part = dist.partition(batch, comm.Get_size(), "cvc").part(comm.Get_rank())
    trainer = dist.DistributedGraphTrainer(model, batch, x, data.labels[ids], part, optimizer)
    trainer.step()                  # the loss of the whole batch, on every rank
"""
import numpy as np
import scipy.sparse

import ngnn as ng
from ngnn import transformers as ngt
from ngnn.op_graph import AllReduce, seed_dropout

from .exchange import Exchange, world
from .local_graph import LocalGraph, RankReadoutGraph
from .lowering import insert_communication


class RankBatch:
    """Rank `part.rank`'s share of `batch` (a BatchedGraph; `part` a LocalPart of a
    partition of it), what a graph model takes as its `batch`: `graph` is the MasterView
    its layers pass messages over, `num_nodes` its masters (a node tensor's rows),
    `masters` their ids in the batch, `readout_graph` the RankReadoutGraph ng.readout
    aggregates over, `num_graphs` the batch's graphs."""

    def __init__(self, batch, part, exchange):
        graph_ids = getattr(batch, "graph_ids", None)
        if graph_ids is None:
            raise TypeError(f"RankBatch: expected a batch of graphs (ng.Graph.batch([...]) or "
                            f"GraphDataset.batch), got {batch!r}")
        part.check_graph(batch)
        self.local = LocalGraph.from_part(part, exchange)
        self.graph = self.local.masters
        self.masters = part.nodes[:part.num_masters]
        self.num_nodes = part.num_masters
        self.num_graphs = batch.num_graphs
        self.readout_graph = RankReadoutGraph(graph_ids[self.masters], batch.num_graphs,
                                              exchange)

    @property
    def own_graphs(self):
        """(num_graphs,) bool: the graphs whose loss this rank counts (k mod ranks)."""
        exchange = self.readout_graph.exchange
        return np.arange(self.num_graphs) % exchange.size == exchange.rank

    def __repr__(self):
        return f"RankBatch({self.readout_graph!r})"


def input_problem(batch, features, labels, part):
    """What is wrong with a rank's input to DistributedGraphTrainer, or None."""
    if getattr(batch, "graph_ids", None) is None:
        return (f"expected a batch of graphs (ng.Graph.batch([...]) or GraphDataset.batch), "
                f"got {batch!r}")
    try:
        part.check_graph(batch)
    except ValueError as err:
        return str(err)
    if labels.shape != (batch.num_graphs,):
        return (f"expected {batch.num_graphs} labels (one per graph of the batch), got shape "
                f"{labels.shape}")
    if getattr(features, "ndim", 0) != 2 or features.shape[0] != batch.num_nodes:
        return (f"expected features of {batch.num_nodes} rows (one per vertex of the batch), "
                f"got shape {getattr(features, 'shape', None)}")
    return None


class DistributedGraphTrainer:
    """Trains a graph model (nn.GINGraph, nn.GCNGraph) on one batch of graphs over the ranks
    of `part`'s partition: `features` and `labels` are the whole batch's (each rank feeds
    its masters' rows), `optimizer` as for one process (its gradients all-reduced), dropout
    seeded by `seed` as one process seeds it. `step()` runs one training step and returns
    the batch's loss; `logits()` the evaluation logits (num_graphs, C), on every rank."""

    def __init__(self, model, batch, features, labels, part, optimizer, backend="numpy",
                 transformer=None, seed=0, comm=None):
        self.exchange = Exchange(comm if comm is not None else world(), part)
        labels = np.asarray(labels)
        # Every rank checks its input before the first exchange, and all raise if one
        # finds a problem.
        self.exchange.agree("DistributedGraphTrainer",
                            input_problem(batch, features, labels, part))
        self.batch = rank_batch = RankBatch(batch, part, self.exchange)
        self.model, self.optimizer = model, optimizer
        self.transformer = transformer or ngt.make_transformer(backend)
        rows = features[rank_batch.masters]
        self.features = rows.toarray() if scipy.sparse.issparse(rows) else np.asarray(rows)
        self.labels = labels.astype(np.int64)
        dtype = model.parameters()[0].dtype
        self.x = ng.placeholder(self.features.shape, dtype=dtype, name="batch_features")
        self.y = ng.placeholder(self.labels.shape, dtype=np.int64, name="graph_labels")
        graph = rank_batch.graph.with_self_loops() if model.self_loops else rank_batch.graph
        logits = model(graph, self.x, rank_batch, training=True)
        self.loss = ng.cross_entropy(logits, self.y, ng.constant(rank_batch.own_graphs),
                                     count=max(batch.num_graphs, 1))
        state = model.state_updates()
        seed_dropout([self.loss] + state, seed)
        insert_communication([self.loss] + state, rank_batch.graph)
        updates = optimizer.updates(
            self.loss, reduce=lambda gradient: AllReduce(gradient, self.exchange)) + state
        # The ranks' shares of the loss summed in float64 in the step, sent with the
        # weight gradients when they are float64 too (PackCollectives): no exchange of its
        # own.
        self.train_step = self.transformer.computation(
            [AllReduce(ng.cast(self.loss, np.float64), self.exchange)], self.x, self.y,
            updates=updates, name="distributed_graph_step")
        evaluation = model(graph, self.x, rank_batch, training=False)
        insert_communication([evaluation], rank_batch.graph)
        self.evaluation = self.transformer.computation(evaluation, self.x,
                                                       name="distributed_graph_logits")

    def step(self):
        """One training step; the whole batch's loss (the sum of the ranks' shares)."""
        return float(self.train_step(self.features, self.labels)[0])

    def logits(self):
        return self.evaluation(self.features)
