"""Run under mpiexec by tests/test_distributed.py; rank 0 prints one JSON line.

    mpiexec -n K python tests/distributed_driver.py equal MODELS POLICIES EPOCHS [BACKEND]
        trains each model on each policy's partition over the K ranks and, on rank 0, in
        one process, on BACKEND (default numpy); reports the largest relative difference
        of any trained array.
    mpiexec -n 4 python tests/distributed_driver.py bytes
        trains GCN on an R-MAT graph for 2 epochs; reports the bytes sent per epoch.
    mpiexec -n 2 python tests/distributed_driver.py fail
        runs `ngnn train --partition cvc` with rank 1 raising in its third training step.
"""
import json
import sys

import numpy as np

from ngnn import datasets, distributed as dist, nn, optim
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


def relative_difference(a, b):
    return max(float(np.abs(a[k] - b[k]).max() / max(np.abs(a[k]).max(), 1e-30)) for k in a)


def equal(models, policies, epochs, backend="numpy"):
    comm = dist.world()
    data = datasets.synthetic(**GRAPH)
    report = {}
    for name in models.split(","):
        reference = None
        if comm.Get_rank() == 0:
            model, optimizer = build(name, data)
            single = Trainer(model, data, optimizer, seed=5, backend=backend)
            single.fit(epochs, progress=False)
            reference = (single.state(), single.history[-1]["loss"], single.evaluate())
            single.transformer.close()
        for policy in policies.split(","):
            part = dist.launch.local_part(data, policy)
            model, optimizer = build(name, data)
            trainer = dist.DistributedTrainer(model, data, part, optimizer, seed=5,
                                              backend=backend)
            trainer.fit(epochs, progress=False)
            state, accuracy = trainer.state(), trainer.evaluate()
            trainer.transformer.close()
            if reference is not None:
                report[f"{name}/{policy}"] = {
                    "weights": relative_difference(reference[0], state),
                    "loss": abs(trainer.history[-1]["loss"] - reference[1]),
                    "accuracy": max(abs(accuracy[s] - reference[2][s]) for s in accuracy)}
    return report


def bytes_per_epoch():
    data = datasets.synthetic("rmat", 2000, 8, 16, 4, seed=2)
    parts = dist.partition(data.graph, dist.world().Get_size(), "cvc")
    model, optimizer = build("gcn", data)
    trainer = dist.DistributedTrainer(model, data, parts.part(dist.world().Get_rank()),
                                      optimizer, seed=0)
    trainer.fit(2, progress=False)
    sent, _ = trainer.communication()
    return {"sync": sent["sync"] / 2, "allreduce": sent["allreduce"] / 2,
            "params": int(sum(p.size for p in model.parameters()))}


def fail():
    from ngnn import cli
    rank = dist.world().Get_rank()
    original = dist.DistributedTrainer.step

    def step(self):
        if rank == 1 and self.train_step.calls == 2:
            raise RuntimeError("injected failure in the third training step")
        return original(self)

    dist.DistributedTrainer.step = step
    return cli.main(["train", "--dataset", "cora", "--partition", "cvc", "--epochs", "200",
                     "--no-progress"])


if __name__ == "__main__":
    what = sys.argv[1]
    if what == "fail":
        sys.exit(fail())
    result = equal(*sys.argv[2:4], int(sys.argv[4]), *sys.argv[5:]) if what == "equal" \
        else bytes_per_epoch()
    if dist.world().Get_rank() == 0:
        print(json.dumps(result), flush=True)
