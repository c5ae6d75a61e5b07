"""Minibatches of graphs over ranks, compiled once per rank (docs/distributed.md,
"Minibatches of graphs over ranks").

Every rank draws the batches of one GraphLoader (the same seed, hence the same batches in
the same order as one process), partitions each batch by vertex over the ranks and loads
its share into a `RankBatchSlot`: slots of fixed sizes for its local graph
(`LocalGraphSlot`: masters, mirrors, local edges), its readout graph (`RankReadoutSlot`)
and its exchange lists, refilled every batch. So, as in one process, a computation built
over the slot serves every batch and nothing is generated after the first; the
communication ops read the lists of the loaded batch when they run.

A slot must hold the share of any batch the loader can make, so the partition is the one
whose shares have bounds known before any batch is drawn: the batch's vertices cut into K
contiguous ranges of equal count (a rank's masters: at most ceil(N/K) of the loader's
largest batch of N vertices), each edge with its destination's master (a rank's edges: at
most the in-degrees of its masters, bounded by the sum of the dataset's ceil(N/K) largest
in-degrees) and mirrors only of the graphs cut by a range's two ends (at most twice the
largest graph). Graphs are numbered consecutively in a batch, so most graphs lie whole on
one rank and only those at the cuts exchange rows. A rank's slot lays out its masters
first (padding masters after the real ones, reading out into the slot's padding graph),
then its mirrors, then padding rows that the padding edges join.

    trainer = dist.DistributedGraphLoaderTrainer(model, data, batch_size=32, seed=0)
    curve = trainer.fit(train_idx, test_idx, epochs=2)     # as GraphTrainer.fit, every rank
"""
import numpy as np

import ngnn as ng
from ngnn.graph_train import GraphTrainer
from ngnn.op_graph import AllReduce, OneHot
from ngnn.sampling.graph_loader import fill_rows
from ngnn.sampling.slot import GraphSlot

from .exchange import Exchange, world
from .local_graph import LocalGraph, MasterView, RankReadoutGraph
from .lowering import insert_communication
from .partition import Partition, equal_ranges


class MasterSlotView(MasterView):
    """The MasterView of a LocalGraphSlot: its edges change between calls (`varies`), so
    vertex-centric degrees are counted by synced aggregations when run, and a keyed
    dropout reads the loaded batch's global ids."""
    varies = True

    def __init__(self, local):       # no MasterView.__init__: the global ids change per load
        self.local = local
        self.num_nodes = self.num_dst = local.num_masters
        self.num_edges = local.num_edges
        self.exchange = local.exchange

    @property
    def global_node_ids(self):
        return self.local.global_node_ids[:self.num_nodes]

    def with_self_loops(self):
        raise ValueError("a rank's slot of batches of graphs cannot add self loops: load "
                         "them with the batches (GraphLoader(self_loops=True))")


class LocalGraphSlot(LocalGraph):
    """A rank's local graph of fixed sizes, `num_masters` master rows, `num_nodes` local
    rows and `num_edges` edges, loaded with each batch's part (see the module docstring
    for the layout). `version` counts the loads, as a GraphSlot's."""
    varies = True

    def __init__(self, num_masters, num_nodes, num_edges, exchange):
        self.capacity = (num_masters, num_nodes, num_edges)
        self.version = -1
        self.exchange = exchange
        self.masters = None
        none = np.zeros(0, np.int64)
        self._fill(none, 0, none, none, none, 0, 0, (none, none))       # padding only

    def load(self, part, orders):
        """Loads `part` (a LocalPart of a partition of the batch over the ranks) and gives
        the exchange its lists, renumbered to this layout. `orders`, the whole batch's
        (in_eids, out_eids), are what the part's CSR orders are cut from, not sorted
        again."""
        masters, rows, edges = self.capacity
        m, r, e = part.num_masters, part.num_mirrors, part.edges.shape[0]
        if m > masters or masters + r >= rows or e > edges:
            raise ValueError(f"LocalGraphSlot.load: rank {part.rank}'s share ({m} masters, "
                             f"{r} mirrors, {e} edges) does not fit its slot ({masters} "
                             f"masters, {rows - masters - 1} mirrors, {edges} edges)")
        self._fill(part.nodes, m, part.src, part.dst, part.edges,
                   part.manifest["num_nodes"], part.manifest["num_edges"],
                   _part_orders(part, *orders))
        mirrors_from = {q: laid_out(ids, m, masters) for q, ids in part.mirrors_from.items()}
        # Every edge of a batch lives with its destination's master, so a rank's mirrors
        # are the sources of its edges that other ranks own: on every rank, each mirror has
        # local edges at its source and none at its destination. An exchange restricted
        # to the mirrors with edges at one end (Exchange.restricted) is then known without
        # exchanging flags: every mirror at the source, none at the destination.
        self.exchange.load(mirrors_from, part.masters_to,
                           {(id(self), "src"): (mirrors_from, part.masters_to),
                            (id(self), "dst"): ({}, {})})

    def _fill(self, nodes, m, src, dst, edges, num_nodes, num_edges, orders):
        """Lays out a part (its global vertex ids `nodes`, the first `m` masters; local
        edges src -> dst with global ids `edges`, `orders` its (in_eids, out_eids)) of a
        batch of `num_nodes` vertices and `num_edges` edges, with padding to the slot's
        sizes."""
        masters, rows, capacity = self.capacity
        used, spare = masters + nodes.shape[0] - m, capacity - edges.shape[0]
        pad_src, pad_dst = GraphSlot._padding(used, used, rows, rows, spare)
        global_ids = np.concatenate([nodes[:m], num_nodes + np.arange(masters - m),
                                     nodes[m:], num_nodes + masters + np.arange(rows - used)])
        src = np.concatenate([laid_out(src, m, masters), pad_src])
        dst = np.concatenate([laid_out(dst, m, masters), pad_dst])
        # Padding edges join rows past every real one, ordered by destination; by source
        # too when each padding row has one at most.
        e, padding = edges.shape[0], np.arange(edges.shape[0], capacity)
        by_source = padding if spare <= rows - used else e + pad_src.argsort(kind="stable")
        groups = [_groups(ends, np.concatenate([order, pad]), rows) for ends, order, pad
                  in ((dst, orders[0], padding), (src, orders[1], by_source))]
        # As GraphSlot._fill: no cache of the old edges (CSR orders, degrees) survives a
        # load; the view the model was built over does.
        version, exchange, view = self.version + 1, self.exchange, self.masters
        self.__dict__.clear()
        LocalGraph.__init__(self, src, dst, rows, global_ids,
                            np.concatenate([edges, num_edges + np.arange(spare)]), masters,
                            num_nodes, num_edges, exchange, groups)
        self.capacity, self.version = (masters, rows, capacity), version
        self.masters = view if view is not None else MasterSlotView(self)
        self.loaded = (m, nodes.shape[0] - m, edges.shape[0])

    def with_self_loops(self):
        return self.masters.with_self_loops()

    def __repr__(self):
        masters, rows, edges = self.capacity
        return (f"LocalGraphSlot(rank={self.exchange.rank}, {masters} masters, {rows} rows, "
                f"{edges} edges)")


def _part_orders(part, in_eids, out_eids):
    """A part's (in_eids, out_eids) in local edge ids, cut from the whole batch's: its
    edges are those ending at its masters, a run of the batch's in-CSR order, and keep
    their order (local ids follow global ones); by source, its masters come before its
    mirrors (local rows), each in global order, where the batch has the mirrors below
    the masters' range first: a stable sort of three sorted runs."""
    local = np.full(part.manifest["num_edges"], -1, np.int64)
    local[part.edges] = np.arange(part.edges.shape[0])
    in_local, out_local = local[in_eids], local[out_eids]
    in_local, out_local = in_local[in_local >= 0], out_local[out_local >= 0]
    return in_local, out_local[part.src[out_local].argsort(kind="stable")]


def _groups(keys, eids, num_nodes):
    """(indptr, eids, counts) of edges grouped by `keys` in the order `eids`."""
    counts = np.bincount(keys, minlength=num_nodes)
    indptr = np.zeros(num_nodes + 1, dtype=np.int64)
    counts.cumsum(out=indptr[1:])
    return indptr, eids, counts


def laid_out(ids, m, masters):
    """Local ids of a part with `m` masters -> rows of a slot with `masters` master rows:
    the mirrors move up past the padding masters."""
    return np.where(ids < m, ids, ids + (masters - m))


class RankReadoutSlot(RankReadoutGraph):
    """A rank's readout graph of fixed sizes: an edge from each of `num_masters` master
    rows to its graph among `num_graphs` (padding masters to the last, the padding graph),
    loaded per batch with its masters' graph ids."""
    varies = True

    def __init__(self, num_masters, num_graphs, exchange):
        self.version = -1
        self._place(np.full(num_masters, num_graphs - 1, np.int64), num_graphs, exchange)

    def load(self, graph_ids, every=None):
        """Every rank loads its share of the same batch; `every`, each rank's vertex count
        per graph (what `holds` and `graph_sizes` come from), is gathered from all (a
        collective) unless given."""
        self._place(graph_ids, self.num_dst, self.exchange, every)

    def _place(self, graph_ids, num_graphs, exchange, every=None):
        version = self.version + 1
        self.__dict__.clear()         # as GraphSlot's: nothing derived from old edges stays
        RankReadoutGraph.__init__(self, graph_ids, num_graphs, exchange, every)
        self.version = version


class RankBatchSlot:
    """What a graph model takes as its batch on a rank, for every batch of a
    RankGraphLoader: `graph` (the MasterSlotView its layers run over), `readout_graph`
    (the RankReadoutSlot ng.readout aggregates over), `num_nodes` (master rows),
    `num_graphs` (graph rows, the last the padding graph) and `graph_mask` (a placeholder
    fed the loader's mask of the loaded graphs, as a BatchSlot's)."""
    spans_ranks = True      # ng.batch_norm combines its statistics over the ranks

    def __init__(self, num_masters, num_nodes, num_edges, num_graphs, exchange):
        self.local = LocalGraphSlot(num_masters, num_nodes, num_edges, exchange)
        self.graph = self.local.masters
        self.num_nodes, self.num_graphs = num_masters, num_graphs
        self.readout_graph = RankReadoutSlot(num_masters, num_graphs, exchange)
        self.graph_mask = ng.placeholder((num_graphs,), dtype=np.bool_, name="graph_mask")
        self.exchange = exchange

    def load(self, part, orders, graph_ids, owner=None, batch_graph_ids=None):
        """Loads `part` of a batch, whose CSR orders are `orders` (LocalGraphSlot.load),
        and its masters' graphs (padding masters go to the padding graph). Given the
        whole batch's vertex owners `owner` and graphs `batch_graph_ids` (the same on
        every rank), each rank's vertex count per graph is counted here instead of
        gathered from the ranks."""
        ids = np.full(self.num_nodes, self.num_graphs - 1, np.int64)
        ids[:graph_ids.shape[0]] = graph_ids
        self.local.load(part, orders)
        every = None
        if owner is not None:
            ranks, graphs = self.exchange.size, self.num_graphs
            every = np.bincount(owner * graphs + batch_graph_ids,
                                minlength=ranks * graphs).reshape(ranks, graphs)
            every[:, -1] += self.num_nodes - np.bincount(owner, minlength=ranks)
        self.readout_graph.load(ids, every)

    @property
    def own_graphs(self):
        """(num_graphs,) bool: the graph rows whose loss this rank counts (k mod ranks)."""
        return np.arange(self.num_graphs) % self.exchange.size == self.exchange.rank

    def __repr__(self):
        return f"RankBatchSlot({self.local!r}, {self.num_graphs} graph rows)"


class RankGraphLoader:
    """Rank `comm`'s share of the batches of `loader` (a GraphLoader, drawn as one process
    draws it): the same `batches`, `split` and `load` and, for the loaded batch, `slot`
    (a RankBatchSlot), `features` (its masters' rows), `labels` and `mask` (the whole
    batch's, as the loader's)."""

    def __init__(self, loader, comm=None):
        comm = comm if comm is not None else world()
        self.loader, self.dataset = loader, loader.dataset
        self.ranks, self.rank = comm.Get_size(), comm.Get_rank()
        masters, rows, edges = self.slot_sizes()
        self.exchange = Exchange.for_slot(comm, masters)
        self.slot = RankBatchSlot(masters, rows, edges, loader.slot.num_graphs,
                                  self.exchange)
        self.features = np.zeros((masters, self.dataset.num_features), dtype=np.float32)
        self.labels = np.zeros_like(loader.labels)
        self.mask = np.zeros_like(loader.mask)
        self.filled = 0

    def slot_sizes(self):
        """(masters, local rows, edges) of a slot that holds a rank's share of any batch
        of the loader (the bounds of the module docstring), plus one padding row."""
        data, loader = self.dataset, self.loader
        masters = max(-(-loader.max_nodes // self.ranks), 1)
        largest = int(data.graph_sizes.max(initial=1))
        mirrors = min(2 * (largest - 1), loader.max_nodes)
        shift = np.repeat(data.node_offsets[:-1], data.edge_counts)
        in_degrees = np.bincount(data.dst + shift, minlength=int(data.node_offsets[-1])) + \
            (1 if loader.self_loops else 0)
        edges = min(loader.max_edges, int(np.sort(in_degrees)[::-1][:masters].sum()))
        return masters, masters + mirrors + 1, edges

    def split(self, order):
        return self.loader.split(order)

    def batches(self, epoch=0, indices=None):
        """As GraphLoader.batches: yields each batch's graph ids, its share loaded."""
        for ids in self.split(self.loader.order(epoch, indices)):
            self.load(ids)
            yield ids

    def __len__(self):
        return len(self.loader)

    def load(self, ids):
        """Collective: every rank loads the same batch `ids`, so a batch refused here is
        refused on every rank alike, before any exchange."""
        ids = np.asarray(ids, dtype=np.int64)
        if ids.size < self.ranks:
            # A rank would hold a part of a graph only, or nothing: batch norm's statistics
            # then differed from one process's and a step could wait forever.
            raise ValueError(f"RankGraphLoader: a batch of {ids.size} graph(s) over "
                             f"{self.ranks} ranks; every batch needs a graph per rank at "
                             "least (a batch size of at least the number of ranks, and "
                             "training sets whose last batch has as many)")
        cut = self.loader._cut
        if cut is None:
            batch, features = self.dataset.batch(ids)
            graph = batch.with_self_loops() if self.loader.self_loops else batch
            n, src, dst, graph_ids = graph.num_nodes, graph.src, graph.dst, batch.graph_ids
            orders = graph.in_eids, graph.out_eids
        else:
            # The same edges in the same order as dataset.batch's, cut out of the
            # dataset's table instead of built and checked again per batch.
            n, (src, dst, *orders), graph_ids, nodes = cut.batch(ids)
        owner = equal_ranges(n, self.ranks)
        part = Partition(src, dst, owner, owner[dst], self.ranks, "ranges", None) \
            .part(self.rank)
        masters = part.nodes[:part.num_masters]
        self.slot.load(part, orders, graph_ids[masters], owner, graph_ids)
        self.features[:masters.shape[0]] = features[masters] if cut is None else \
            np.take(self.dataset.features, nodes[masters], axis=0)
        fill_rows(self, masters.shape[0], ids)


class DistributedGraphLoaderTrainer(GraphTrainer):
    """GraphTrainer over MPI ranks (`comm`, default MPI's world): the same arguments, the
    same batches, each partitioned over the ranks and loaded into a slot per rank, so its
    two computations are compiled once per rank and serve every batch. `fit`,
    `train_epoch`, `predict` and `accuracy` are GraphTrainer's and give every rank the
    single-process values: the loss of graph k is counted on rank k mod K over the batch's
    count of graphs, weight gradients are all-reduced, logits are whole on every rank."""

    def __init__(self, model, data, batch_size=32, lr=0.01, weight_decay=0.0,
                 backend="numpy", transformer=None, seed=0, schedule=None, optimizer=None,
                 comm=None):
        self.comm = comm
        super().__init__(model, data, batch_size=batch_size, lr=lr, weight_decay=weight_decay,
                         backend=backend, transformer=transformer, seed=seed,
                         schedule=schedule, optimizer=optimizer)

    def make_loader(self, loader):
        ranks = RankGraphLoader(loader, self.comm)
        self.exchange = ranks.exchange
        return ranks

    def training_loss(self, logits):
        """This rank's share of ng.cross_entropy(logits, labels, mask): its own graphs'
        terms over the count of the batch's graphs."""
        picked = ng.sum(ng.log_softmax(logits, axis=-1) *
                        OneHot(self.y, logits.shape[1], dtype=logits.dtype),
                        axis=-1)
        weight = ng.cast(self.mask, logits.dtype)
        own = ng.constant(self.loader.slot.own_graphs.astype(logits.dtype), dtype=logits.dtype)
        return -ng.sum(picked * weight * own) / ng.maximum(ng.sum(weight), 1.0)

    def place(self, results):
        insert_communication(results, self.loader.slot.graph)

    def gradient_reduction(self):
        return lambda gradient: AllReduce(gradient, self.exchange)

    def step_loss(self, loss):
        """The ranks' shares summed in float64, in the step: PackCollectives sends them
        with the weight gradients (when those are float64 too: float64 weights, or float32
        ones with wide accumulation), so the step's loss costs no exchange of its own."""
        return AllReduce(ng.cast(loss, np.float64), self.exchange)
