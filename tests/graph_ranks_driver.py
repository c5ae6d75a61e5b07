"""Run under mpiexec by tests/test_readout_ranks.py; rank 0 prints one JSON line.

    mpiexec -n K python tests/graph_ranks_driver.py ops BACKEND
        readouts (sum, mean, max) of a batch of graphs partitioned over the K ranks, with
        the gradients of a loss through them, against one process on rank 0; reports the
        largest absolute differences.
    mpiexec -n K python tests/graph_ranks_driver.py train BACKEND [DTYPE]
        two training steps of GIN-0 (with and without batch norm) and the mean-readout
        GCN on a batch of 40 MUTAG graphs over the K ranks, against one process; reports
        the largest relative differences of the trained variables, losses and logits.
        DTYPE float32 (default float64) trains in float32 with every order-dependent sum
        accumulated in float64 (wide_accumulation), on both sides.
    mpiexec -n K python tests/graph_ranks_driver.py loader BACKEND [MODELS]
        two epochs of GIN-0 (with and without batch norm) and the mean-readout GCN (Adam;
        SGD with batch norm, as above) over
        the minibatches of a GraphLoader (40 MUTAG graphs, batches of 8), each batch
        partitioned over the K ranks (DistributedGraphLoaderTrainer), against GraphTrainer
        in one process; reports the largest relative differences of the epochs' losses,
        the trained variables and the test logits, how many graphs spanned ranks, and the
        programs generated after the first batch (on every rank). MODELS: a comma-separated
        subset of gin, gin_bn, gcn_mean (default all).
    mpiexec -n 2 python tests/graph_ranks_driver.py bad-labels
        rank 1 gives DistributedGraphTrainer one label too few; each rank prints the error
        it raised.
    mpiexec -n 2 python tests/graph_ranks_driver.py small-batch
        each rank's RankGraphLoader is given a batch of one graph; each prints the error.
    mpiexec -n 2 python tests/graph_ranks_driver.py fail
        DistributedGraphTrainer steps under run_on_ranks, rank 1 raising in its third.
"""
import json
import sys

import numpy as np

import ngnn as ng
from ngnn import datasets, distributed as dist, nn, optim
from ngnn import transformers as ngt
from ngnn.op_graph import AllReduce, seed_dropout

FEATURES = 3


def batch_of_graphs():
    """Nine graphs of 1 to 12 vertices; a cvc partition spreads each over the ranks."""
    rng = np.random.default_rng(0)
    graphs = [ng.Graph.from_edges(rng.integers(0, n, 2 * n), rng.integers(0, n, 2 * n),
                                  num_nodes=n) for n in (5, 3, 12, 1, 4, 8, 2, 9, 6)]
    return ng.Graph.batch(graphs)


def readout_and_gradients(rows, batch, reduce, share):
    """pooled, dL/dh, dL/dw for L = sum(pooled^2 * c) over the graphs `share` marks (all
    in one process; on a rank, the graphs whose loss it counts, dL/dw all-reduced)."""
    rng = np.random.default_rng(1)
    h = ng.placeholder((rows, FEATURES), dtype=np.float64, name="h")
    w = ng.variable((FEATURES, 2), initial_value=rng.standard_normal((FEATURES, 2)),
                    dtype=np.float64)
    # ReLU, shifted below 0, before max: ties (at -0.5) within graphs and across ranks,
    # and graphs whose maximum is negative, so a rank without vertices of a graph (whose
    # partial is 0) must not take part.
    z = ng.relu(ng.dot(h, w)) - 0.5 if reduce == "max" else ng.tanh(ng.dot(h, w))
    pooled = ng.readout(z, batch, reduce)
    weights = share[:, None] * np.arange(1.0, 3.0)
    return h, w, pooled, ng.sum(pooled * pooled * ng.constant(weights, dtype=np.float64))


def ops(backend):
    comm = dist.world()
    gb = batch_of_graphs()
    x = np.random.default_rng(2).standard_normal((gb.num_nodes, FEATURES))
    # Every vertex of graph 2 the same: ties at the maximum whatever it is, across ranks.
    first, last = gb.node_offsets[2:4]
    x[first:last] = x[first]
    part = dist.partition(gb, comm.Get_size(), "cvc").part(comm.Get_rank())
    exchange = dist.Exchange(comm, part)
    rank_batch = dist.RankBatch(gb, part, exchange)
    spanning = int(sum(rank_batch.readout_graph.holds.sum(axis=0) > 1))
    report = {"graphs spanning ranks": spanning}
    for reduce in ("sum", "mean", "max"):
        h, w, pooled, loss = readout_and_gradients(rank_batch.num_nodes, rank_batch, reduce,
                                                   rank_batch.own_graphs.astype(float))
        dist.insert_communication([pooled, loss], rank_batch.graph)
        dh, dw = ng.grad(loss, [h, w])
        with ngt.make_transformer(backend) as t:
            got = t.computation([pooled, dh, AllReduce(dw, exchange)], h)(x[part.nodes[
                :part.num_masters]])
        every = comm.gather(got, root=0)
        if comm.Get_rank() == 0:
            h, w, pooled, loss = readout_and_gradients(gb.num_nodes, gb, reduce,
                                                       np.ones(gb.num_graphs))
            with ngt.make_transformer(backend) as t:
                want = t.computation([pooled] + ng.grad(loss, [h, w]), h)(x)
            parts = dist.partition(gb, comm.Get_size(), "cvc")
            report[reduce] = max(
                max(float(np.abs(g[0] - want[0]).max()),
                    float(np.abs(g[1] - want[1][parts.masters(r)]).max()),
                    float(np.abs(g[2] - want[2]).max()))
                for r, g in enumerate(every))
    return report


def models(data, dtype):
    f, c = data.num_features, data.num_classes
    return {"gin": lambda: nn.GINGraph(f, 8, c, num_layers=3, seed=1, dtype=dtype,
                                       batch_norm=False),
            "gin_bn": lambda: nn.GINGraph(f, 8, c, num_layers=3, seed=1, dtype=dtype),
            "gcn_mean": lambda: nn.GCNGraph(f, 8, c, num_layers=2, seed=1, dtype=dtype)}


def transformer(backend, dtype):
    return ngt.make_transformer(backend, wide_accumulation=dtype == np.float32)


def optimizer_for(model):
    """Adam, except with batch norm: the biases before a batch norm have a gradient of 0 up
    to rounding, which Adam's division by its square root turns into a step of lr."""
    if model.buffers():
        return optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    return optim.Adam(model.parameters(), lr=0.01)


def single_process(make, gb, x, labels, backend, seed):
    """What DistributedGraphTrainer computes, in one process: two steps, then logits."""
    model = make()
    h = ng.placeholder(x.shape, dtype=x.dtype, name="x")
    y = ng.placeholder(labels.shape, dtype=np.int64, name="y")
    graph = gb.with_self_loops() if model.self_loops else gb
    loss = ng.cross_entropy(model(graph, h, gb, training=True), y)
    state = model.state_updates()
    seed_dropout([loss] + state, seed)
    updates = optimizer_for(model).updates(loss) + state
    with transformer(backend, x.dtype) as t:
        step = t.computation([loss] + updates, h, y)
        losses = [float(step(x, labels)[0]) for _ in range(2)]
        variables = [t.variable_value(v) for v in model.parameters() + model.buffers()]
        logits = t.computation(model(graph, h, gb, training=False), h)(x)
    return losses, variables, logits


def relative(a, b):
    return float(np.abs(np.asarray(a) - np.asarray(b)).max() /
                 max(float(np.abs(np.asarray(b)).max()), 1e-30))


def train(backend, dtype="float64"):
    comm = dist.world()
    dtype = np.dtype(dtype)
    data = datasets.load("mutag")
    ids = np.arange(40)
    gb, x = data.batch(ids)
    x = x.astype(dtype)
    labels = data.labels[ids]
    part = dist.partition(gb, comm.Get_size(), "cvc").part(comm.Get_rank())
    report = {}
    for name, make in models(data, dtype).items():
        model = make()
        trainer = dist.DistributedGraphTrainer(model, gb, x, labels, part,
                                               optimizer_for(model), seed=7,
                                               transformer=transformer(backend, dtype))
        losses = [trainer.step() for _ in range(2)]
        variables = [trainer.transformer.variable_value(v)
                     for v in model.parameters() + model.buffers()]
        logits = trainer.logits()
        trainer.transformer.close()
        if comm.Get_rank() == 0:
            want = single_process(make, gb, x, labels, backend, seed=7)
            report[name] = {"loss": relative(losses, want[0]),
                            "variables": max(relative(a, b) for a, b in zip(variables, want[1])),
                            "logits": relative(logits, want[2])}
        spanning = int(sum(trainer.batch.readout_graph.holds.sum(axis=0) > 1))
        report["graphs spanning ranks"] = spanning
    return report


def epochs_of(trainer, train_ids, test_ids):
    """Two epochs: the losses, the variables, the test logits, and the programs generated
    after the first batch (its step and an evaluation compiled)."""
    loader = trainer.loader
    next(loader.batches(0, train_ids))
    trainer.step()
    trainer.predict(test_ids)
    compiled = trainer.transformer.compilations
    losses = [trainer.train_epoch(train_ids, epoch) for epoch in range(2)]
    trainer.reset()
    losses = [trainer.train_epoch(train_ids, epoch) for epoch in range(2)]
    variables = [trainer.transformer.variable_value(v)
                 for v in trainer.model.parameters() + trainer.model.buffers()]
    return (losses, variables, trainer.predict(test_ids),
            trainer.transformer.compilations - compiled)


def cut_csr_differs(local):
    """How many CSR arrays of a rank's slot, cut from the batch's CSR orders, differ from
    those of the same edges sorted again (a LocalGraph built from them)."""
    from ngnn.distributed.local_graph import LocalGraph
    again = LocalGraph(local.src, local.dst, local.num_nodes, local.global_node_ids,
                       local.global_edge_ids, local.num_masters, local.global_num_nodes,
                       local.global_num_edges, local.exchange)
    return sum(not np.array_equal(getattr(local, name), getattr(again, name))
               for name in ("in_indptr", "in_eids", "in_src", "in_degrees", "out_indptr",
                            "out_eids", "out_dst", "out_degrees"))


def known_plans_differ(local):
    """How many of the restricted exchange plans a rank's slot knows at load (at the
    edges' sources and destinations) differ from those found by exchanging flags."""
    exchange, differ = local.exchange, 0
    for at in ("src", "dst"):
        known = exchange._restricted.pop((id(local), at))
        found = exchange.restricted((id(local), at), local.active(at))
        for a, b in zip(known, found):
            differ += sorted(a) != sorted(b) or \
                any(not np.array_equal(a[q], b[q]) for q in a)
    return int(differ)


def loader(backend, names="gin,gin_bn,gcn_mean"):
    from ngnn.graph_train import GraphTrainer
    comm = dist.world()
    data = datasets.load("mutag")
    train_ids, test_ids = np.arange(40), np.arange(40, 52)
    report = {"graphs spanning ranks": 0, "known exchange plans differing": 0,
              "cut CSR arrays differing": 0}
    for name in names.split(","):
        make = models(data, np.float64)[name]
        with transformer(backend, np.float64) as t:
            model = make()
            trainer = dist.DistributedGraphLoaderTrainer(model, data, batch_size=8, seed=5,
                                                         transformer=t,
                                                         optimizer=optimizer_for(model))
            got = epochs_of(trainer, train_ids, test_ids)
            spanning = 0
            for ids in trainer.loader.batches(0, train_ids):
                holds = trainer.loader.slot.readout_graph.holds[:, :ids.size]
                spanning += int(np.sum(holds.sum(axis=0) > 1))
                report["known exchange plans differing"] += \
                    known_plans_differ(trainer.loader.slot.local)
                report["cut CSR arrays differing"] += cut_csr_differs(trainer.loader.slot.local)
        report["graphs spanning ranks"] = spanning
        generated = comm.allgather(got[3])
        if comm.Get_rank() == 0:
            with transformer(backend, np.float64) as t:
                model = make()
                want = epochs_of(GraphTrainer(model, data, batch_size=8, seed=5, transformer=t,
                                              optimizer=optimizer_for(model)),
                                 train_ids, test_ids)
            report[name] = {"loss": relative(got[0], want[0]),
                            "variables": max(relative(a, b) for a, b in zip(got[1], want[1])),
                            "logits": relative(got[2], want[2]),
                            "generated after the first batch": max(generated)}
    return report


def bad_labels():
    """Rank 1 passes one label too few: every rank raises, naming rank 1, and says so."""
    comm = dist.world()
    data = datasets.load("mutag")
    gb, x = data.batch(np.arange(12))
    labels = data.labels[:12 if comm.Get_rank() != 1 else 11]
    part = dist.partition(gb, comm.Get_size(), "cvc").part(comm.Get_rank())
    model = models(data, np.float64)["gin"]()
    try:
        dist.DistributedGraphTrainer(model, gb, x.astype(np.float64), labels, part,
                                     optimizer_for(model))
    except ValueError as err:
        print(f"rank {comm.Get_rank()} raised: {err}", flush=True)
    comm.Barrier()


def small_batch():
    """A batch of one graph over the ranks: every rank refuses it, none waits."""
    comm = dist.world()
    data = datasets.load("mutag")
    model = models(data, np.float64)["gin"]()
    trainer = dist.DistributedGraphLoaderTrainer(model, data, batch_size=4, seed=0,
                                                 optimizer=optimizer_for(model))
    try:
        trainer.loader.load(np.arange(1))
    except ValueError as err:
        print(f"rank {comm.Get_rank()} raised: {err}", flush=True)
    comm.Barrier()


def fail():
    """Rank 1 raises in its third training step, under run_on_ranks (as `ngnn` runs)."""
    from ngnn.distributed.launch import run_on_ranks
    comm = dist.world()
    rank = comm.Get_rank()
    original = dist.DistributedGraphTrainer.step

    def step(self):
        if rank == 1 and self.train_step.calls == 2:
            raise RuntimeError("injected failure in the third training step")
        return original(self)

    dist.DistributedGraphTrainer.step = step

    def train_steps():
        data = datasets.load("mutag")
        gb, x = data.batch(np.arange(40))
        part = dist.partition(gb, comm.Get_size(), "cvc").part(rank)
        model = models(data, np.float64)["gin"]()
        trainer = dist.DistributedGraphTrainer(model, gb, x.astype(np.float64),
                                               data.labels[:40], part, optimizer_for(model))
        for k in range(200):
            print(f"step {k}: loss {trainer.step():.6f}", flush=True)
        return 0

    return run_on_ranks("graph training", train_steps)


if __name__ == "__main__":
    command, *args = sys.argv[1:]
    if command in ("fail", "bad-labels", "small-batch"):
        sys.exit({"fail": fail, "bad-labels": bad_labels, "small-batch": small_batch}[command]())
    result = {"ops": ops, "train": train, "loader": loader}[command](*args)
    if dist.world().Get_rank() == 0:
        print(json.dumps(result))
