"""Readouts and graph classification over MPI ranks (docs/distributed.md, "Batches of
graphs over ranks" and "Minibatches of graphs over ranks"): a batch of graphs partitioned
by vertex, every graph spanning ranks, reads out and trains as one process does (float64,
1e-12), and so do a GraphLoader's minibatches, each partitioned over the ranks, compiled
once per rank; bad input or a failure on one rank stops every rank with its name."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import ngnn as ng
from ngnn import datasets, distributed as dist, nn, optim
from ngnn.distributed.launch import find_mpiexec

HERE = os.path.dirname(os.path.abspath(__file__))
DRIVER = os.path.join(HERE, "graph_ranks_driver.py")
TOLERANCE = 1e-12


def driver(ranks, *args):
    mpiexec = find_mpiexec()
    assert mpiexec, "mpiexec not found: install the mpi extra (pip install -e '.[mpi]')"
    done = subprocess.run([mpiexec, "-n", str(ranks), sys.executable, DRIVER, *args],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("ranks,backend", [(2, "numpy"), (3, "numpy"), (2, "gpu")])
def test_readouts_and_gradients_over_ranks_equal_one_process(ranks, backend):
    """Sum, mean and max readouts (ReLU before max: ties within and across ranks), the
    gradient of a loss through them to the vertices and the weights, on every rank."""
    report = driver(ranks, "ops", backend)
    assert report["graphs spanning ranks"] >= 5
    for reduce in ("sum", "mean", "max"):
        assert report[reduce] < TOLERANCE, (reduce, report)


@pytest.mark.parametrize("ranks", [2, 3])
def test_graph_classification_steps_over_ranks_equal_one_process(ranks):
    """GIN-0 with and without batch norm and the mean-readout GCN, dropout on: the
    weights and running statistics after two steps, the losses and the evaluation logits
    equal one process's."""
    report = driver(ranks, "train", "numpy")
    assert report.pop("graphs spanning ranks") == 40
    assert set(report) == {"gin", "gin_bn", "gcn_mean"}
    for name, result in report.items():
        for what, difference in result.items():
            assert difference < TOLERANCE, (name, what, difference)


def test_float32_steps_over_ranks_with_wide_accumulation():
    """In float32 with wide accumulation (as `ngnn train` runs), the readouts' partial
    sums are combined over the ranks in float64 and rounded once, so GIN-0 and the GCN
    train to the same weights and logits as one process, bit for bit; batch norm's
    statistics' gradients are combined as rounded per-rank partials (float32 rounding)."""
    report = driver(2, "train", "numpy", "float32")
    for name in ("gin", "gcn_mean"):
        assert report[name]["variables"] == 0 and report[name]["logits"] == 0, report
        assert report[name]["loss"] < 1e-6, report         # each rank's share rounded
    assert max(report["gin_bn"].values()) < 1e-5, report


@pytest.mark.parametrize("ranks,backend,models", [(2, "numpy", "gin,gin_bn,gcn_mean"),
                                                   (3, "numpy", "gin,gin_bn,gcn_mean"),
                                                   (2, "gpu", "gcn_mean")])
def test_graph_minibatches_over_ranks_equal_the_single_process_loader(ranks, backend, models):
    """DistributedGraphLoaderTrainer: the GraphLoader's batches of one process, each
    partitioned over the ranks into a slot per rank. Two epochs (after a first batch and
    an evaluation) give GraphTrainer's losses, weights, running statistics and test
    logits, graphs spanning ranks included, and no rank generates a program after the
    first batch."""
    report = driver(ranks, "loader", backend, models)
    assert report.pop("graphs spanning ranks") >= ranks + 1
    assert report.pop("known exchange plans differing") == 0
    assert report.pop("cut CSR arrays differing") == 0
    assert set(report) == set(models.split(","))
    for name, result in report.items():
        assert result.pop("generated after the first batch") == 0, name
        for what, difference in result.items():
            assert difference < TOLERANCE, (name, what, difference)


def run_driver(*args):
    return subprocess.run([find_mpiexec(), "-n", "2", sys.executable, DRIVER, *args],
                          capture_output=True, text=True, timeout=120)


def assert_raised_on_every_rank(command, message):
    """The driver's `command` over 2 ranks ends normally, each rank having raised
    `message` (before any exchange, so none is left waiting)."""
    done = run_driver(command)
    assert done.returncode == 0, done.stderr[-3000:]
    for rank in (0, 1):
        assert f"rank {rank} raised: {message}" in done.stdout


def test_bad_input_on_one_rank_is_an_error_on_every_rank():
    """Rank 1 gives DistributedGraphTrainer one label too few: both ranks raise, naming
    rank 1 and the problem, before any exchange (none is left waiting)."""
    assert_raised_on_every_rank("bad-labels", "DistributedGraphTrainer: on rank 1 of 2: "
                                "expected 12 labels (one per graph of the batch), got "
                                "shape (11,)")


def test_a_batch_with_fewer_graphs_than_ranks_is_refused_on_every_rank():
    """A batch of one graph over 2 ranks (a rank would hold part of a graph, or nothing;
    it hung over 3 ranks): both ranks raise the same error before any exchange."""
    assert_raised_on_every_rank("small-batch", "RankGraphLoader: a batch of 1 graph(s) over "
                                "2 ranks; every batch needs a graph per rank")


def test_failing_rank_stops_every_rank_in_graph_training():
    """Rank 1 raises in its third training step; run_on_ranks names it and aborts every
    rank, so rank 0, which would wait for it in the next exchange, ends too (the timeout
    would fail the test) without training its 200 steps."""
    done = run_driver("fail")
    assert done.returncode != 0
    assert "error on rank 1 of 2: injected failure in the third training step" in done.stderr
    assert "step 1:" in done.stdout and "step 199:" not in done.stdout


def mutag_batch(count=12):
    data = datasets.load("mutag")
    gb, x = data.batch(np.arange(count))
    return data, gb, x.astype(np.float64), data.labels[:count]


def test_bad_input_over_ranks_is_named():
    data, gb, x, labels = mutag_batch()
    part = dist.partition(gb, 1, "cvc").part(0)
    exchange = dist.Exchange(dist.world(), part)
    with pytest.raises(TypeError, match="RankBatch: expected a batch of graphs"):
        dist.RankBatch(ng.Graph(gb.src, gb.dst, gb.num_nodes), part, exchange)
    other, _ = data.batch(np.arange(1, 13))
    with pytest.raises(ValueError, match="partition was made from another graph"):
        dist.RankBatch(other, part, exchange)
    model = nn.GINGraph(data.num_features, 4, data.num_classes, num_layers=2,
                        dtype=np.float64, batch_norm=False)
    with pytest.raises(ValueError, match="on rank 0 of 1: expected 12 labels .* got shape "
                                         "\\(11,\\)"):
        dist.DistributedGraphTrainer(model, gb, x, labels[:11], part,
                                     optim.Adam(model.parameters()))
    with pytest.raises(ValueError, match="expected features of 203 rows .* got shape "
                                         "\\(202, 7\\)"):
        dist.DistributedGraphTrainer(model, gb, x[:-1], labels, part,
                                     optim.Adam(model.parameters()))
    rank_batch = dist.RankBatch(gb, part, exchange)
    r = rank_batch.readout_graph
    h = ng.placeholder((rank_batch.num_nodes, 2), dtype=np.float64)
    attention = ng.op_graph.EdgeSoftmax(ng.gather(h, r, by="src"), r)
    with pytest.raises(ValueError, match="edge softmax over a readout graph .* not built"):
        dist.insert_communication([attention], rank_batch.graph)
    # Chunked execution does not split distributed computations.
    from ngnn import transformers as ngt
    from ngnn.out_of_core import ChunkingError
    pooled = ng.readout(h, rank_batch, "sum")
    dist.insert_communication([pooled], rank_batch.graph)
    with pytest.raises(ChunkingError, match="communication between ranks"):
        ngt.make_transformer("numpy", chunks=2).computation(pooled, h).transform()


def collectives(computation):
    """[(kind, members)] of the collectives a transformed computation runs, in order."""
    from ngnn.op_graph import AllReduce, PackedCollective, ReadoutAllReduce
    return [(type(op).__name__, len(op.packing.parts) if isinstance(op, PackedCollective) else 1)
            for op in computation.ordered_ops
            if isinstance(op, (AllReduce, PackedCollective, ReadoutAllReduce))]


def test_a_step_over_ranks_packs_its_collectives():
    """PackCollectives (on the one rank of this process): the step's loss and its 14
    weight gradients go in one message, the 3 readouts before the heads in one and the
    gradients of the 2 that have one (the input's has none) in another; evaluation sends
    its readouts as one."""
    data, gb, x, labels = mutag_batch()
    part = dist.partition(gb, 1, "cvc").part(0)
    model = nn.GINGraph(data.num_features, 4, data.num_classes, num_layers=3,
                        dtype=np.float64, batch_norm=False)
    trainer = dist.DistributedGraphTrainer(model, gb, x, labels, part,
                                           optim.Adam(model.parameters()))
    trainer.step()
    assert len(model.parameters()) == 14
    assert collectives(trainer.train_step) == [("PackedCollective", 3),
                                               ("PackedCollective", 2),
                                               ("PackedCollective", 15)]
    assert collectives(trainer.evaluation) == [("PackedCollective", 3)]


def test_packed_collectives_never_feed_each_other():
    """An all-reduce that feeds another is sent before it, not with it; what is packed
    reads back its own part."""
    from ngnn import transformers as ngt
    from ngnn.op_graph import AllReduce
    exchange = dist.Exchange.for_slot(dist.world(), 1)
    x = ng.placeholder((2, 3), dtype=np.float64)
    y = ng.placeholder((4,), dtype=np.float64)
    first = AllReduce(x, exchange)
    fed = AllReduce(first * 2.0, exchange)
    alone = AllReduce(y, exchange)
    with ngt.make_transformer("numpy") as t:
        computation = t.computation([fed, alone], x, y)
        xv, yv = np.arange(6.0).reshape(2, 3), np.arange(4.0) + 10
        got = computation(xv, yv)
        assert collectives(computation) == [("AllReduce", 1), ("PackedCollective", 2)]
    assert np.array_equal(got[0], 2 * xv) and np.array_equal(got[1], yv)


def cli(*args, ranks=1):
    """`python -m ngnn.cli train --task graph ... --no-progress`, under mpiexec -n ranks
    when ranks > 1."""
    command = [sys.executable, "-m", "ngnn.cli", "train", "--task", "graph", "--dataset",
               "mutag", "--folds", "2", "--no-progress", *args]
    if ranks > 1:
        command = [find_mpiexec(), "-n", str(ranks)] + command
    return subprocess.run(command, capture_output=True, text=True, timeout=300)


def test_cli_graph_classification_over_ranks_prints_one_process_accuracy():
    """`mpiexec -n 2 ngnn train --task graph` trains every batch over the 2 ranks and
    prints, once (rank 0), every line one process prints, the fold accuracies and the
    mean ± std the same, plus the ranks' slot and the bytes they exchanged."""
    one = cli("--model", "gcn", "--epochs", "3")
    two = cli("--model", "gcn", "--epochs", "3", ranks=2)
    assert one.returncode == 0 and two.returncode == 0, one.stderr[-2000:] + two.stderr[-2000:]
    lines = two.stdout.splitlines()
    ranks_lines = [line for line in lines if line.startswith(("over 2 ranks:",
                                                              "communication per epoch:"))]
    assert len(ranks_lines) == 2 and ranks_lines[0].startswith("over 2 ranks: each batch "
                                                               "partitioned by vertex ranges")
    assert [line for line in lines if line not in ranks_lines] == one.stdout.splitlines()
    assert sum(line.startswith("fold ") for line in lines) == 2
    assert lines[-1].startswith("test accuracy: ") and lines[-1].endswith("(2 folds)")


@pytest.mark.parametrize("options,message", [
    (("--memory-budget", "64K"), "--memory-budget does not combine with training over 2 "
                                 "ranks"),
    (("--batch-size", "1"), "batches of 1 graphs over 2 ranks: every batch needs at least "
                            "as many graphs as ranks"),
    (("--batch-size", "31"), "fold 1's 94 training graphs in batches of 31 leave a last "
                             "batch of 1, fewer graphs than the 2 ranks"),
    (("--partition", "cvc"), "graph classification partitions each batch itself")])
def test_cli_graph_classification_over_ranks_refuses_what_does_not_combine(options, message):
    """Each is an error on every rank before training, not a hang or a traceback."""
    done = cli("--model", "gin", "--epochs", "1", *options, ranks=2)
    assert done.returncode != 0
    assert "ngnn train: error on rank" in done.stderr and message in done.stderr, \
        done.stderr[-2000:]
    assert "Traceback" not in done.stderr


def test_launched_ranks_reads_what_mpiexec_sets():
    from ngnn.distributed.launch import launched_ranks
    assert launched_ranks({}) == 1
    assert launched_ranks({"PMI_SIZE": "3"}) == 3                 # MPICH's hydra
    assert launched_ranks({"OMPI_COMM_WORLD_SIZE": "4"}) == 4     # Open MPI
    assert launched_ranks({"PMI_SIZE": "x", "OMPI_COMM_WORLD_SIZE": "2"}) == 2
