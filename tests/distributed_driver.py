"""Run under mpiexec by tests/test_distributed.py; rank 0 prints one JSON line.

    mpiexec -n K python tests/distributed_driver.py equal MODELS POLICIES EPOCHS [BACKEND]
        trains each model on each policy's partition over the K ranks and, on rank 0, in
        one process, on BACKEND (default numpy); reports the largest relative difference
        of any trained array.
    mpiexec -n K python tests/distributed_driver.py ops BACKEND
        the communication ops, a synced aggregation, its gradient and a keyed dropout
        on BACKEND, against the whole graph's values; the adjoint identities
        sum_r <B x, y> = sum_r <x, R y> over ranks.
    mpiexec -n K python tests/distributed_driver.py prod
        a product aggregation (a kind of the reduction table) over the ranks against the
        whole graph's, on NumPy.
    mpiexec -n 4 python tests/distributed_driver.py bytes
        trains GCN on an R-MAT graph for 2 epochs; reports the bytes sent per epoch.
    mpiexec -n 2 python tests/distributed_driver.py fail
        runs `ngnn train --partition cvc` with rank 1 raising in its third training step.
"""
import json
import sys

import numpy as np

from ngnn import datasets, distributed as dist, nn, optim
from ngnn import transformers as ngt
from ngnn.train import Trainer

GRAPH = dict(kind="sbm", num_nodes=300, avg_degree=6, num_features=24, num_classes=4, seed=1)


def build(name, data):
    f, c = data.num_features, data.num_classes
    model = {"gcn": lambda: nn.GCN(f, 8, c, dropout=0.5, seed=3),
             "sage": lambda: nn.GraphSAGE(f, 8, c, dropout=0.5, seed=3),
             "gin": lambda: nn.GIN(f, 8, c, dropout=0.5, seed=3),
             "gat": lambda: nn.GAT(f, hidden=4, heads=2, num_classes=c, dropout=0.5,
                                   seed=3)}[name]()
    return model, optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)


def relative_difference(a, b, prefix=""):
    """The largest difference of an array over its largest magnitude, among the arrays
    whose names start with `prefix`."""
    return max(float(np.abs(a[k] - b[k]).max() / max(np.abs(a[k]).max(), 1e-30))
               for k in a if k.startswith(prefix))


def exact(backend):
    """A transformer whose sums do not depend on their order (what `ngnn train` uses)."""
    return ngt.make_transformer(backend, wide_accumulation=True)


def equal(models, policies, epochs, backend="numpy"):
    comm = dist.world()
    data = datasets.synthetic(**GRAPH)
    report = {}
    for name in models.split(","):
        reference = None
        if comm.Get_rank() == 0:
            model, optimizer = build(name, data)
            single = Trainer(model, data, optimizer, seed=5, transformer=exact(backend))
            single.fit(epochs, progress=False)
            reference = (single.state(), single.history[-1]["loss"], single.evaluate())
            single.transformer.close()
        for policy in policies.split(","):
            part = dist.launch.local_part(data, policy)
            model, optimizer = build(name, data)
            trainer = dist.DistributedTrainer(model, data, part, optimizer, seed=5,
                                              transformer=exact(backend))
            trainer.fit(epochs, progress=False)
            state, accuracy = trainer.state(), trainer.evaluate()
            trainer.transformer.close()
            if reference is not None:
                report[f"{name}/{policy}"] = {
                    "weights": relative_difference(reference[0], state, "model/"),
                    "state": relative_difference(reference[0], state),
                    "loss": abs(trainer.history[-1]["loss"] - reference[1]),
                    "accuracy": max(abs(accuracy[s] - reference[2][s]) for s in accuracy)}
    return report


def communication_ops(backend):
    import ngnn as ng
    from ngnn.op_graph import MasterBroadcast, MirrorReduce
    from ngnn.transformers.numpy import kernels
    comm = dist.world()
    rank = comm.Get_rank()
    g = datasets.synthetic("rmat", 200, 5, 1, 2, seed=4).graph
    part = dist.partition(g, comm.Get_size(), "cvc").part(rank)
    local = dist.LocalGraph.from_part(part, dist.Exchange(comm, part))
    view = local.masters
    rng = np.random.default_rng(0)
    whole_x, whole_y = (rng.standard_normal((g.num_nodes, 3)).astype(np.float32)
                        for _ in range(2))
    masters = part.nodes[:part.num_masters]
    x, y = whole_x[part.nodes], whole_y[part.nodes]       # a row per local vertex
    n, m = local.num_nodes, local.num_masters
    px, pm = ng.placeholder((n, 3), name="x"), ng.placeholder((m, 3), name="xm")
    py = ng.placeholder((m, 3), name="y")
    reduced = MirrorReduce(px, local, "sum")
    broadcast = MasterBroadcast(pm, local)
    aggregated = ng.aggregate(ng.gather(pm, view, by="src"), view, at="dst", reduce="mean")
    mask = ng.dropout(pm, 0.5, seed=11)
    dist.insert_communication([aggregated, mask], view)
    aggregated, mask = aggregated.forwarded, mask.forwarded
    grad = ng.grad(ng.sum(aggregated * py), pm)
    with ngt.make_transformer(backend) as t:
        comp = t.computation([reduced, broadcast, aggregated, mask, grad], px, pm, py)
        r, bx, a, keep, dx = comp(x, x[:m], y[:m])    # the first call: the mask of step 0
        ry = comp(y, x[:m], y[:m])[0]

    copies = np.bincount(np.concatenate(comm.allgather(part.nodes)), minlength=g.num_nodes)
    errors = {}
    errors["reduce"] = np.abs(r - (whole_x * copies[:, None])[masters]).max(initial=0)
    errors["broadcast"] = np.abs(bx - x).max(initial=0)
    scale = 1 / np.maximum(g.in_degrees, 1)[:, None]
    whole_mean = (g.incidence("dst") @ whole_x[g.src]) * scale
    errors["mean"] = np.abs(a - whole_mean[masters]).max(initial=0)
    whole_mask = kernels.dropout(whole_x, 11, 0, 0.5, np.empty_like(whole_x))
    errors["mask"] = np.abs(keep - whole_mask[masters]).max(initial=0)
    # The whole graph's gradient of sum(mean * y) is A^T (y / deg), each row at its master.
    whole_grad = g.incidence("src") @ (whole_y * scale)[g.dst]
    errors["grad"] = np.abs(dx - whole_grad[masters]).max(initial=0)
    # Adjoints over ranks: sum_r <B(x), y> = sum_r <x, R(y)>.
    left, right = comm.allreduce(np.array([np.vdot(bx, y), np.vdot(x[:m], ry)], np.float64))
    errors["adjoint"] = abs(left - right) / max(abs(left), 1e-30)
    return {k: comm.allreduce(float(v), op=__import__("mpi4py").MPI.MAX)
            for k, v in errors.items()}


def product_aggregation():
    import ngnn as ng
    comm = dist.world()
    rank = comm.Get_rank()
    g = datasets.synthetic("rmat", 200, 5, 1, 2, seed=4).graph
    part = dist.partition(g, comm.Get_size(), "cvc").part(rank)
    view = dist.LocalGraph.from_part(part, dist.Exchange(comm, part)).masters
    # Factors near 1, a few exactly 0: products of hundreds of edges stay in range.
    whole_x = np.random.default_rng(1).uniform(0.9, 1.1, (g.num_nodes, 3))
    whole_x[::17, 0] = 0
    masters = part.nodes[:part.num_masters]
    pm = ng.placeholder((len(masters), 3), dtype=np.float64, name="xm")
    prod = ng.aggregate(ng.gather(pm, view, by="src"), view, at="dst", reduce="prod")
    dist.insert_communication([prod], view)
    with ngt.make_transformer("numpy") as t:
        got = t.computation(prod.forwarded, pm)(whole_x[masters])
    whole = np.ones((g.num_nodes, 3))
    np.multiply.at(whole, g.dst, whole_x[g.src])
    whole[g.in_degrees == 0] = 0
    error = np.abs(got - whole[masters]).max(initial=0) / np.abs(whole).max()
    return {"prod": comm.allreduce(float(error), op=__import__("mpi4py").MPI.MAX)}


def bytes_per_epoch():
    data = datasets.synthetic("rmat", 2000, 8, 16, 4, seed=2)
    parts = dist.partition(data.graph, dist.world().Get_size(), "cvc")
    model, optimizer = build("gcn", data)
    trainer = dist.DistributedTrainer(model, data, parts.part(dist.world().Get_rank()),
                                      optimizer, seed=0, transformer=exact("numpy"))
    trainer.fit(2, progress=False)
    sent, _ = trainer.communication()
    return {"sync": sent["sync"] / 2, "allreduce": sent["allreduce"] / 2,
            "params": int(sum(p.size for p in model.parameters()))}


def fail():
    from ngnn import cli
    rank = dist.world().Get_rank()
    original = dist.DistributedTrainer.step

    def step(self, progress=False):
        if rank == 1 and self.train_step.calls == 2:
            raise RuntimeError("injected failure in the third training step")
        return original(self, progress)

    dist.DistributedTrainer.step = step
    return cli.main(["train", "--dataset", "cora", "--partition", "cvc", "--epochs", "200",
                     "--no-progress"])


if __name__ == "__main__":
    what = sys.argv[1]
    if what == "fail":
        sys.exit(fail())
    if what == "equal":
        result = equal(*sys.argv[2:4], int(sys.argv[4]), *sys.argv[5:])
    elif what == "ops":
        result = communication_ops(sys.argv[2])
    elif what == "prod":
        result = product_aggregation()
    else:
        result = bytes_per_epoch()
    if dist.world().Get_rank() == 0:
        print(json.dumps(result), flush=True)
