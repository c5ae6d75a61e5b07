"""ngnn.distributed: partitions, and training over 1, 2, 3 and 4 MPI ranks (mpiexec from the
`mpi` extra) equal to one process."""
import dataclasses
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import ngnn as ng
from ngnn import datasets, distributed as dist, nn
from ngnn.distributed.launch import find_mpiexec
from ngnn.distributed.partition import POLICIES

HERE = os.path.dirname(os.path.abspath(__file__))
DRIVER = os.path.join(HERE, "distributed_driver.py")


def mpiexec():
    path = find_mpiexec()
    assert path, "mpiexec not found: install the mpi extra (pip install -e '.[mpi]')"
    return path


def run_ranks(ranks, *args, timeout=180, cwd=None):
    return subprocess.run([mpiexec(), "-n", str(ranks), sys.executable, *args],
                          capture_output=True, text=True, timeout=timeout, cwd=cwd)


def driver(ranks, *args):
    done = run_ranks(ranks, DRIVER, *args)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def rmat(num_nodes=3000, seed=2):
    return datasets.synthetic("rmat", num_nodes, 8, 4, 2, seed=seed).graph


# ---- partitions --------------------------------------------------------------------------

@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("num_parts", [1, 3, 4])
def test_partition_masters_mirrors_and_edges(policy, num_parts):
    g = rmat()
    parts = dist.partition(g, num_parts, policy)
    assert parts.owner.shape == (g.num_nodes,) and parts.edge_part.shape == (g.num_edges,)
    assert set(np.unique(parts.owner)) == set(range(num_parts))
    copies = 0
    for p in range(num_parts):
        masters, mirrors = parts.masters(p), parts.mirrors(p)
        eids = parts.edges(p)
        touched = np.union1d(g.src[eids], g.dst[eids])
        np.testing.assert_array_equal(mirrors, np.setdiff1d(touched, masters))
        assert np.all(parts.owner[mirrors] != p)
        copies += len(masters) + len(mirrors)
        local = parts.part(p)
        np.testing.assert_array_equal(local.nodes[local.src], g.src[eids])
        np.testing.assert_array_equal(local.nodes[local.dst], g.dst[eids])
    assert parts.replication_factor == pytest.approx(copies / g.num_nodes)
    if policy == "oec":
        np.testing.assert_array_equal(parts.edge_part, parts.owner[g.src])
    if policy in ("iec", "metis"):
        np.testing.assert_array_equal(parts.edge_part, parts.owner[g.dst])


def test_exchange_lists_line_up():
    g = rmat()
    parts = dist.partition(g, 4, "cvc")
    locals_ = [parts.part(p) for p in range(4)]
    for p, part in enumerate(locals_):
        for q, rows in part.mirrors_from.items():
            other = locals_[q]
            np.testing.assert_array_equal(part.nodes[rows], other.nodes[other.masters_to[p]])
            assert np.all(rows >= part.num_masters)
            assert np.all(other.masters_to[p] < other.num_masters)


def python_lines(func):
    """func(), and how many lines of ngnn's Python it ran: a count that a Python loop over
    vertices or edges makes grow with the graph, where vectorized code runs the same
    lines at any size (a count, not a time, so a loaded machine cannot fail it)."""
    package = os.path.dirname(os.path.abspath(ng.__file__)) + os.sep
    lines = 0

    def trace(frame, event, arg):
        nonlocal lines
        if not frame.f_code.co_filename.startswith(package):
            return None
        lines += event == "line"
        return trace

    sys.settrace(trace)
    try:
        result = func()
    finally:
        sys.settrace(None)
    return result, lines


@pytest.mark.parametrize("policy", ["cvc", "oec", "iec"])
def test_partitions_are_vectorized(policy):
    """The same lines of Python partition R-MAT 10K and 100K (R-MAT 500K takes ~0.3 s)."""
    def lines(num_nodes):
        g = datasets.synthetic("rmat", num_nodes, 10, 1, 2, seed=0).graph

        def partition():
            parts = dist.partition(g, 4, policy)
            return parts.edge_imbalance, parts.vertex_imbalance, parts.replication_factor
        return python_lines(partition)[1]
    assert lines(100000) == lines(10000) > 0


def test_cvc_balances_edges_of_rmat():
    g = datasets.synthetic("rmat", 100000, 10, 1, 2, seed=0).graph
    parts = dist.partition(g, 4, "cvc")
    assert parts.edge_imbalance <= 1.05
    assert parts.vertex_imbalance <= 1.05
    # A vertex has copies only in its master's grid row and column.
    assert parts.replication_factor <= 3


def test_partition_rejects_bad_arguments():
    g = rmat(50)
    with pytest.raises(ValueError, match="policy must be one of"):
        dist.partition(g, 2, "random")
    with pytest.raises(ValueError, match="num_parts must be a positive int"):
        dist.partition(g, 0, "oec")
    with pytest.raises(ValueError, match="leaves a part without masters"):
        dist.partition(g, 51, "oec")


def test_save_and_load(tmp_path):
    g = rmat()
    parts = dist.partition(g, 3, "iec")
    parts.save(tmp_path / "parts")
    assert sorted(os.listdir(tmp_path / "parts")) == ["manifest.json", "part0.npz",
                                                      "part1.npz", "part2.npz"]
    manifest = json.loads((tmp_path / "parts" / "manifest.json").read_text())
    assert manifest["graph_fingerprint"] == g.fingerprint and manifest["num_parts"] == 3
    for p in range(3):
        loaded, direct = dist.load_partition(tmp_path / "parts", p), parts.part(p)
        for name in ("nodes", "edges", "src", "dst"):
            np.testing.assert_array_equal(getattr(loaded, name), getattr(direct, name))
        assert loaded.num_masters == direct.num_masters
        assert loaded.mirrors_from.keys() == direct.mirrors_from.keys()
        loaded.check_graph(g)
    with pytest.raises(ValueError, match="made from another graph"):
        dist.load_partition(tmp_path / "parts", 0).check_graph(rmat(seed=3))
    with pytest.raises(ValueError, match="needs 3 ranks; this is rank 3"):
        dist.load_partition(tmp_path / "parts", 3)
    (tmp_path / "parts" / "part1.npz").write_bytes(b"not an archive")
    with pytest.raises(ValueError, match="part1.npz is corrupt: not an .npz archive"):
        dist.load_partition(tmp_path / "parts", 1)
    os.unlink(tmp_path / "parts" / "part2.npz")
    with pytest.raises(ValueError, match="part2.npz is missing or corrupt"):
        dist.load_partition(tmp_path / "parts", 2)
    with pytest.raises(ValueError, match="holds no partition"):
        dist.load_partition(tmp_path, 0)


def test_one_rank_ops_and_keyed_dropout(transformer_factory):
    """On one rank there are no mirrors: the communication ops are identities (their
    gradients too), the IR names the rank, and a dropout keyed by global ids over the
    local graph draws what the whole graph's dropout draws (rows permuted back)."""
    data = datasets.synthetic("sbm", 60, 4, 3, 2, seed=0)
    part = dist.partition(data.graph, 1, "cvc").part(0)
    g = dist.LocalGraph.from_part(part, dist.Exchange(dist.world(), part))
    x = ng.placeholder((g.num_nodes, 3), name="x")
    y = ng.op_graph.MasterBroadcast(ng.op_graph.MirrorReduce(x, g, "sum"), g)
    dx = ng.grad(ng.sum(y * y), x)
    dropped = ng.op_graph.Dropout(x, 0.5, seed=9, rows=g.global_rows("n"))
    whole = ng.placeholder((g.num_nodes, 3), name="whole")
    t = transformer_factory()
    comp = t.computation([y, dx, dropped, ng.dropout(whole, 0.5, seed=9)], x, whole)
    value = np.random.default_rng(0).standard_normal((g.num_nodes, 3)).astype(np.float32)
    ordered = np.empty_like(value)
    ordered[part.nodes] = value            # the whole graph's rows in global id order
    out, grad, keyed, reference = comp(value, ordered)
    np.testing.assert_allclose(out, value)
    np.testing.assert_allclose(grad, 2 * value, rtol=1e-6)
    np.testing.assert_array_equal(keyed, reference[part.nodes])
    assert "mirror_reduce(%x, reduce=sum, rank=0" in comp.ir
    assert "master_broadcast(" in comp.ir and "global_node_ids" in comp.ir


def test_one_rank_trains_without_validation_rows():
    """As the Trainer: an empty val_mask trains every epoch, val accuracy NaN."""
    data = datasets.synthetic("sbm", 300, 4, 6, 3, seed=0)
    data = dataclasses.replace(data, val_mask=np.zeros(data.num_nodes, bool))
    part = dist.partition(data.graph, 1, "cvc").part(0)
    trainer = dist.DistributedTrainer(nn.GCN(6, 8, 3, seed=0), data, part)
    history = trainer.fit(6, patience=1, progress=False)
    assert len(history) == 6 and all(np.isnan(r["val_acc"]) for r in history)
    result = trainer.evaluate()
    assert np.isnan(result["val"]) and 0 <= result["test"] <= 1
    trainer.transformer.close()


# ---- over MPI ranks ------------------------------------------------------------------------

@pytest.mark.parametrize("ranks,backend", [(1, "numpy"), (2, "numpy"), (3, "numpy"),
                                           (2, "gpu")])
def test_communication_ops_over_ranks(ranks, backend):
    """Mirror reduction and broadcast, a synced mean aggregation and its gradient, and a
    dropout mask keyed by global ids equal the whole graph's values; the broadcast and the
    reduction are each other's adjoints summed over ranks."""
    errors = driver(ranks, "ops", backend)
    assert errors["reduce"] < 1e-5 and errors["broadcast"] == 0 and errors["mask"] == 0
    assert errors["mean"] < 1e-6 and errors["grad"] < 1e-5 and errors["adjoint"] < 1e-6


@pytest.mark.parametrize("ranks", [1, 2, 3])
def test_ranks_train_what_one_process_trains(ranks):
    """Every model, every policy, dropout on: the trained weights and Adam's moments equal
    the single-process run bit for bit, and so do the accuracies. Every order-dependent
    sum is accumulated in float64 and rounded once (WideAccumulation), so splitting it
    over ranks changes nothing. The loss is rounded per rank before the ranks' sum."""
    report = driver(ranks, "equal", "gcn,sage,gat,gin", ",".join(POLICIES), "3")
    assert len(report) == 16
    for key, result in report.items():
        assert result["weights"] == 0 and result["state"] == 0, (key, result)
        assert result["loss"] < 1e-5, key
        assert result["accuracy"] == 0, key


def test_bytes_per_epoch_follow_from_mirrors_and_weights():
    """GCN (hidden 8, 4 classes, both layers transform first) on a 4-way cvc partition of
    R-MAT: each layer's gather reads a broadcast (float32) to the mirrors that are sources
    of local edges (S), its aggregation is a reduction (float64 partial sums) from the
    mirrors that are destinations of local edges (R); the training step runs both and
    their adjoints (a reduction from S, a broadcast to R), the evaluation pass both; each
    rank all-reduces the 172 parameters' float64 gradients once (docs/distributed.md)."""
    report = driver(4, "bytes")
    data = datasets.synthetic("rmat", 2000, 8, 16, 4, seed=2)
    g = data.graph
    parts = dist.partition(g, 4, "cvc")
    sources = received = 0        # self loops (GCN's) live with their masters
    for p in range(4):
        eids = parts.edges(p)
        src, dst = g.src[eids], g.dst[eids]
        src, dst = src[src != dst], dst[src != dst]
        sources += len(np.unique(src[parts.owner[src] != p]))
        received += len(np.unique(dst[parts.owner[dst] != p]))
    widths = 8 + 4
    assert report["params"] == 16 * 8 + 8 + 8 * 4 + 4
    assert report["sync"] == widths * ((4 + 8 + 4) * sources + (8 + 4 + 8) * received)
    assert report["allreduce"] == 8 * 4 * report["params"]
    # Under cvc a mirror is a source or a destination of local edges, never both.
    assert sources + received == sum(len(parts.mirrors(p)) for p in range(4))


def test_failing_rank_stops_every_rank_with_its_message():
    """Rank 1 fails in its third step; rank 0, which would otherwise wait for it forever
    (run_ranks' timeout then fails the test), is stopped before it ends its 200 epochs."""
    done = run_ranks(2, DRIVER, "fail")
    assert done.returncode != 0
    assert "error on rank 1 of 2: injected failure in the third training step" in done.stderr
    assert "cora: 2708 nodes" in done.stdout and "test accuracy" not in done.stdout


def test_command_line_train_save_and_partition_dir(tmp_path):
    """`mpiexec -n 2 ngnn train --partition cvc --save` and `--partition-dir` with a
    saved partition give the single-process weights, `ngnn bench` runs on ranks too;
    mismatches are errors before training."""
    common = ["-m", "ngnn.cli", "train", "--model", "sage", "--dataset", "sbm",
              "--num-nodes", "300", "--num-features", "16", "--hidden", "8", "--epochs", "4",
              "--no-progress"]
    single = subprocess.run([sys.executable] + common[:] + ["--save", "w1.npz"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=120)
    assert single.returncode == 0, single.stderr
    done = run_ranks(2, *common, "--partition", "cvc", "--save", "w2.npz", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "replication factor" in done.stdout and "mirror sync" in done.stdout
    assert done.stdout.count("test accuracy") == 1          # rank 0 speaks
    partition = subprocess.run([sys.executable, "-m", "ngnn.cli", "partition", "--dataset",
                                "sbm", "--num-nodes", "300", "--num-features", "16",
                                "--parts", "2", "--policy", "metis", "--out", "parts"],
                               cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert partition.returncode == 0, partition.stderr
    saved = run_ranks(2, *common, "--partition-dir", "parts", "--save", "w3.npz",
                      cwd=tmp_path)
    assert saved.returncode == 0, saved.stderr
    with np.load(tmp_path / "w1.npz") as w1, np.load(tmp_path / "w2.npz") as w2, \
            np.load(tmp_path / "w3.npz") as w3:
        assert sorted(w1.files) == sorted(w2.files) == sorted(w3.files)
        for name in w1.files:
            np.testing.assert_array_equal(w1[name], w2[name], err_msg=name)
            np.testing.assert_array_equal(w1[name], w3[name], err_msg=name)

    bench = run_ranks(2, "-m", "ngnn.cli", "bench", "--model", "gcn", "--dataset", "sbm",
                      "--num-nodes", "300", "--epochs", "3", "--partition-dir", "parts",
                      cwd=tmp_path)
    assert bench.returncode == 0, bench.stderr
    assert "numpy, 2 ranks:" in bench.stdout and "gradient all-reduce" in bench.stdout

    wrong_count = run_ranks(3, *common, "--partition-dir", "parts", cwd=tmp_path)
    assert wrong_count.returncode != 0
    # Whichever rank aborts first speaks: ranks 0 and 1 see the count, rank 2 its number.
    assert "the partition in parts has 2 parts" in wrong_count.stderr
    other_graph = run_ranks(2, *common, "--data-seed", "7", "--partition-dir", "parts",
                            cwd=tmp_path)
    assert other_graph.returncode != 0
    assert "made from another graph" in other_graph.stderr


def test_cora_sage_three_ranks_fifty_epochs_equal_one_process(tmp_path):
    """The issue's check, as a user runs it: `ngnn train --save` in one process and on 3
    ranks (cvc) give the same weights after 50 epochs of GraphSAGE on Cora, dropout on,
    bit for bit (this case was 1.2e-5 apart when ranks added float32 partial sums)."""
    common = ["-m", "ngnn.cli", "train", "--model", "sage", "--dataset", "cora",
              "--epochs", "50", "--no-progress"]
    single = subprocess.run([sys.executable, *common, "--save", "w1.npz"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=300)
    assert single.returncode == 0, single.stderr
    ranks = run_ranks(3, *common, "--partition", "cvc", "--save", "w2.npz", cwd=tmp_path,
                      timeout=300)
    assert ranks.returncode == 0, ranks.stderr
    with np.load(tmp_path / "w1.npz") as w1, np.load(tmp_path / "w2.npz") as w2:
        assert sorted(w1.files) == sorted(w2.files)
        for name in w1.files:
            np.testing.assert_array_equal(w1[name], w2[name], err_msg=name)


def test_ranks_on_one_host_share_its_cores():
    """Under mpiexec each rank's BLAS gets its share of the cores (ngnn/local_ranks.py);
    a variable the user set stays, and one rank per host changes nothing."""
    from ngnn.local_ranks import share_cores
    cores = len(os.sched_getaffinity(0))
    environ = {"MPI_LOCALNRANKS": "2", "OMP_NUM_THREADS": "3"}
    assert share_cores(environ) == max(1, cores // 2)
    assert environ["OPENBLAS_NUM_THREADS"] == str(max(1, cores // 2))
    assert environ["OMP_NUM_THREADS"] == "3"
    environ = {"OMPI_COMM_WORLD_LOCAL_SIZE": str(4 * cores)}
    assert share_cores(environ) == 1 and environ["MKL_NUM_THREADS"] == "1"
    assert share_cores({}) is None and share_cores({"MPI_LOCALNRANKS": "1"}) is None
