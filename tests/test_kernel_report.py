"""`comp.kernel_report()` and `ngnn profile`: one row per kernel in launch order, with the
launch geometry, the edges each work-group walks, global bytes and device time."""
import numpy as np
import pytest

import ngnn as ng
from ngnn import cli
from ngnn import transformers as ngt
from ngnn.transformers.gpu.report import edges_per_work_group

GPU = "gpu" in ngt.transformer_choices()
needs_gpu = pytest.mark.skipif(not GPU, reason="no GPU runtime (OpenCL or CUDA) here")
KEYS = ["name", "values", "template", "group", "launches", "work_groups", "max_edges",
        "mean_edges", "global_bytes", "seconds"]


def star(leaves):
    """Every leaf 1..leaves sends an edge to the centre 0, which sends one back to leaf 1."""
    src = np.concatenate([np.arange(1, leaves + 1), [0]])
    dst = np.concatenate([np.zeros(leaves, np.int64), [1]])
    return ng.Graph.from_edges(src, dst, num_nodes=leaves + 1)


@needs_gpu
def test_rows_follow_the_launches_and_the_graph():
    g = star(600)
    h = ng.placeholder((601, 4), name="h")
    w = ng.variable((4, 4), initial_value=np.eye(4) / 2, name="w")
    messages = ng.gather(ng.dot(h, w), g, by="src")
    out = ng.relu(ng.aggregate(messages, g, at="dst", reduce="sum")) + \
        ng.aggregate(messages, g, at="src", reduce="max")
    with ngt.make_transformer("gpu", time_kernels=True) as t:     # timed on CUDA too
        comp = t.computation([ng.sum(out)], h)
        before = comp.kernel_report()
        assert [row["seconds"] for row in before] == [None] * len(before)
        comp(np.ones((601, 4), np.float32))
        rows = comp.kernel_report()
        kernels = comp.executor.kernels
        assert [row["name"] for row in rows] == [k.name for k in kernels]
        assert all(list(row) == KEYS for row in rows)
        for row, kernel in zip(rows, kernels):
            groups = np.prod([a // b for a, b in zip(kernel.global_size, kernel.local_size)])
            assert (row["launches"], row["work_groups"]) == (1, groups)
            assert row["global_bytes"] == kernel.global_bytes()
            assert row["template"] == kernel.template and row["seconds"] >= 0
        walks = [(row, kernel) for row, kernel in zip(rows, kernels)
                 if row["max_edges"] is not None]
        assert walks and all(row["group"] is not None for row, _ in walks)
        for row, kernel in walks:
            edges = edges_per_work_group(kernel)
            assert row["max_edges"] == edges.max() and row["mean_edges"] == edges.mean()
        # The edge schedule cuts the centre's 600 in-edges into chunks: no work-group walks
        # them all (docs/gpu_transformer.md, "The edge schedule: ...").
        assert 0 < max(row["max_edges"] for row, _ in walks) < 600
        dense = [row for row in rows if row["max_edges"] is None]
        assert dense and all(row["mean_edges"] is None for row in dense)


def test_numpy_has_no_kernel_report():
    x = ng.placeholder((3,), name="x")
    comp = ngt.make_transformer("numpy").computation(x + 1.0, x)
    with pytest.raises(ValueError, match="the numpy transformer runs no device kernels"):
        comp.kernel_report()


@needs_gpu
def test_profile_command_prints_the_table_and_the_transfers(capsys):
    assert cli.main(["profile", "--model", "gcn", "--dataset", "sbm", "--num-nodes", "150",
                     "--steps", "2"]) == 0
    out = capsys.readouterr().out
    assert "| kernel | template | group | launches | work-groups | max edges |" in out
    assert "| **total per step** |" in out
    assert "host to device:" in out and " 0 in each later one" in out


def test_profile_command_refuses_numpy(capsys):
    assert cli.main(["profile", "--model", "gcn", "--dataset", "cora",
                     "--backend", "numpy"]) == 2
    assert "the numpy backend runs no device kernels" in capsys.readouterr().err


@needs_gpu
def test_global_bytes_count_what_a_kernel_walking_part_of_the_edges_touches():
    """A partial kernel walks the heavy rows' edges only, a per-vertex kernel the light
    rows' edges: each counts those edges' share of an edge-sized input and of the graph's
    edge-indexed arrays; together they count each edge once."""
    g = star(600)           # the centre's 600 in-edges are its one heavy row; 1 edge more
    h = ng.placeholder((601, 4), name="h")
    w = ng.placeholder((601, 1), name="w")
    out = ng.aggregate(ng.gather(h, g, by="src") * w, g, at="dst", reduce="sum")
    with ngt.make_transformer("gpu") as t:
        comp = t.computation([out], h, w)
        comp.transform()
        (partial,) = [k for k in comp.executor.kernels if k.template == "partial.j2"]
        (rows,) = [k for k in comp.executor.kernels if k.template == "vertex_rows.j2"]
        w_bytes = {kernel: dict((str(what), n) for what, n in kernel.traffic())[str(w)]
                   for kernel in (partial, rows)}
        assert w_bytes == {partial: round(w.nbytes * 600 / 601),
                           rows: round(w.nbytes * 1 / 601)}
        for kernel in (partial, rows):
            assert kernel.global_bytes() == sum(n for _, n in kernel.traffic())
            assert kernel.global_bytes() < sum(t.nbytes for t in kernel.inputs) + \
                sum(o.nbytes for o in kernel.outputs) + \
                sum(b[1].nbytes for b in kernel.bindings if b[0] == "scratch") + \
                sum(4 * np.asarray(getattr(b[1], b[2])).size
                    for b in kernel.bindings if b[0] == "graph")
